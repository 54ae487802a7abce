//! EXEC (docs/conformance.md#the-suites): argv fidelity, exit codes, working directory, separate byte-exact streams, timeouts.
//!
//! Runs last among the reference suites on a shared sandbox: its timeout probe may cost the sandbox on a
//! backend that discards one whose kill did not land.

use std::time::{Duration, Instant};

use sandbox_core::{Capability, Command, ExecOutput, ExecRequest};

use crate::error::ConformanceError;
use crate::fixtures::binary;
use crate::paths::{norm, ConformancePaths};
use crate::probe_kit::{plant_nothing, run, run_argv};
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{
    ensure, refused_with, ProbeError, ProbeResult, Refusal, SuiteRun, Verdict,
};

/// The suite label.
pub const EXEC: &str = "EXEC";

/// How many probes [`assert_exec`] runs.
pub const EXEC_PROBES: usize = 7;

/// The longest exec cleanup allowance a subject may claim.
pub const MAX_EXEC_CLEANUP_ALLOWANCE: Duration = Duration::from_secs(30);

const STDOUT_MARKER: &str = "conformance-wrote-this-to-stdout";
const STDERR_MARKER: &str = "conformance-wrote-this-to-stderr";

/// `bytes` as a `printf` format of `\ooo` octal escapes, so any byte survives the shell untouched.
pub(crate) fn octal_escaped(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:03o}")).collect()
}

/// Whether `merged` is an interleaving of `a` and `b` (each kept in order).
fn is_interleaving(merged: &[u8], a: &[u8], b: &[u8]) -> bool {
    if merged.len() != a.len() + b.len() {
        return false;
    }
    // reachable[j]: a prefix of `merged` splits into a[..i] and b[..j] for the current i.
    let mut reachable = vec![false; b.len() + 1];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            reachable[j] = if i == 0 && j == 0 {
                true
            } else {
                let from_a = i > 0 && reachable[j] && a[i - 1] == merged[i + j - 1];
                let from_b = j > 0 && reachable[j - 1] && b[j - 1] == merged[i + j - 1];
                from_a || from_b
            };
        }
    }
    reachable[b.len()]
}

fn check_fidelity(output: &ExecOutput, out: &[u8], err: &[u8], form: &str) -> ProbeResult {
    // The lossy views must never fail, whatever the bytes.
    let _ = (output.stdout_text(), output.stderr_text());
    ensure!(
        output.exit_code == 7,
        "the {form} form exited {}",
        output.exit_code
    );
    if output.producer_owns_stderr {
        ensure!(
            is_interleaving(&output.stdout, out, err),
            "the {form} form's stdout is not an interleaving of the two streams"
        );
    } else {
        ensure!(
            output.stdout == out,
            "the {form} form's stdout differs from the bytes printed"
        );
        ensure!(
            output.stderr == err,
            "the {form} form's stderr differs from the bytes printed"
        );
    }
    Ok(())
}

/// Attacks `exec`. Gate `exec`; plants `.probe-cwd`; every command runs in the working directory.
pub async fn assert_exec(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    let mut suite = SuiteRun::start(
        EXEC,
        Some(Capability::Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    plant_nothing(subject, &paths).await?;
    let work = paths.work.as_str();

    suite
        .probe("an-argv-sequence-runs", &[], async {
            let out = run_argv(subject, &["printf", "ok-ran"], work).await?;
            ensure!(out.exit_code == 0, "printf exited {}", out.exit_code);
            ensure!(
                out.stdout == b"ok-ran",
                "printf printed {:?}",
                out.stdout_text()
            );
            Ok(())
        })
        .await;

    suite
        .probe("exit-code-fidelity", &[], async {
            let out = run(subject, Command::shell("exit 7"), work).await?;
            ensure!(out.exit_code == 7, "`exit 7` exited {}", out.exit_code);
            Ok(())
        })
        .await;

    suite
        .probe("argv-is-quoted", &[], async {
            let argument = "a b$(echo injected)c";
            let argv = ["sh", "-c", "printf '%s' \"$1\"", "probe", argument];
            let out = run_argv(subject, &argv, work).await?;
            ensure!(
                out.exit_code == 0,
                "the quoting probe exited {}",
                out.exit_code
            );
            ensure!(
                out.stdout == argument.as_bytes(),
                "the argument came back as {:?}",
                out.stdout_text()
            );
            Ok(())
        })
        .await;

    suite
        .probe("working-directory-is-honoured", &[], async {
            let out = run_argv(subject, &["pwd"], work).await?;
            ensure!(out.exit_code == 0, "pwd exited {}", out.exit_code);
            let printed = out.stdout_text();
            ensure!(
                printed.trim() == norm(work),
                "pwd printed {:?} in {work:?}",
                printed.trim()
            );
            Ok(())
        })
        .await;

    suite
        .probe("streams-stay-separate", &[], async {
            let script = format!("printf %s {STDOUT_MARKER}; printf %s {STDERR_MARKER} >&2");
            let out = run_argv(subject, &["sh", "-c", &script], work).await?;
            ensure!(
                out.exit_code == 0,
                "the stream probe exited {}",
                out.exit_code
            );
            let (stdout, stderr) = (out.stdout_text(), out.stderr_text());
            if out.producer_owns_stderr {
                ensure!(
                    stdout.contains(STDOUT_MARKER) && stdout.contains(STDERR_MARKER),
                    "stdout {stdout:?} lacks a marker although the producer owns stderr"
                );
                ensure!(
                    !stderr.contains(STDOUT_MARKER) && !stderr.contains(STDERR_MARKER),
                    "stderr {stderr:?} holds program output although the producer owns it"
                );
            } else {
                ensure!(
                    stdout.contains(STDOUT_MARKER) && !stdout.contains(STDERR_MARKER),
                    "stdout is {stdout:?}"
                );
                ensure!(
                    stderr.contains(STDERR_MARKER) && !stderr.contains(STDOUT_MARKER),
                    "stderr is {stderr:?}"
                );
            }
            Ok(())
        })
        .await;

    suite
        .probe("exec-byte-fidelity", &[], async {
            let fixture = binary();
            let out: Vec<u8> = b"OUT:".iter().chain(&fixture).copied().collect();
            let err: Vec<u8> = b"ERR:"
                .iter()
                .copied()
                .chain(fixture.iter().rev().copied())
                .collect();
            let script = format!(
                "printf '{}'; printf '{}' >&2; exit 7",
                octal_escaped(&out),
                octal_escaped(&err)
            );
            let shell = run(subject, Command::shell(&script), work).await?;
            check_fidelity(&shell, &out, &err, "shell")?;
            let argv = run_argv(subject, &["sh", "-c", &script], work).await?;
            check_fidelity(&argv, &out, &err, "argv")
        })
        .await;

    suite
        .probe("a-timeout-raises-timeout-error", &[], async {
            let allowance = subject.exec_cleanup_allowance();
            if allowance > MAX_EXEC_CLEANUP_ALLOWANCE {
                return Err(ProbeError::Harness(format!(
                    "the exec cleanup allowance {allowance:?} is above 30 s"
                )));
            }
            let request = ExecRequest::new(Command::argv(["sleep", "30"]))
                .working_directory(work)
                .timeout(Duration::from_secs(1));
            let started = Instant::now();
            refused_with(Refusal::Timeout, subject.sandbox().exec(request)).await?;
            let elapsed = started.elapsed();
            ensure!(
                elapsed >= Duration::from_millis(500),
                "the 1 s bound expired after only {elapsed:?}"
            );
            let ceiling = Duration::from_secs(4) + allowance;
            ensure!(
                elapsed <= ceiling,
                "the 1 s bound took {elapsed:?} to report (ceiling {ceiling:?})"
            );
            Ok(())
        })
        .await;

    suite.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes_every_byte() {
        assert_eq!(octal_escaped(&[0, b'A', 0xff]), "\\000\\101\\377");
    }

    #[test]
    fn interleavings() {
        assert!(is_interleaving(b"aXbY", b"ab", b"XY"));
        assert!(is_interleaving(b"abXY", b"ab", b"XY"));
        assert!(!is_interleaving(b"baXY", b"ab", b"XY"));
        assert!(!is_interleaving(b"abX", b"ab", b"XY"));
        assert!(is_interleaving(b"", b"", b""));
    }
}
