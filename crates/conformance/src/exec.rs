//! EXEC (docs/conformance.md#the-suites): argv fidelity, exit codes, working directory, separate byte-exact streams, timeouts,
//! and the streamed form: chunks before the end, stdin, a dropped stream, a stream's cap.
//!
//! Runs last among the reference suites on a shared sandbox: its timeout probe may cost the sandbox on a
//! backend that discards one whose kill did not land.

use std::time::{Duration, Instant};

use sandbox_core::{
    Capability, Command, ErrorKind, ExecChunk, ExecEvent, ExecExit, ExecOutput, ExecRequest,
    ExecStdin, ExecStream, SandboxError, WORKDIR_UNUSABLE_EXIT,
};

use crate::error::ConformanceError;
use crate::fixtures::every_byte_and_utf8_edges;
use crate::hardening::{expect_handle_works, expect_none_left};
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
pub const EXEC_PROBES: usize = EXEC_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const EXEC_PROBE_TABLE: &[&str] = &[
    "an-argv-sequence-runs",
    "exit-code-fidelity",
    "argv-is-quoted",
    "working-directory-is-honoured",
    "an-unusable-working-directory-is-not-started",
    "streams-stay-separate",
    "exec-byte-fidelity",
    "a-timeout-raises-timeout-error",
    "a-stream-delivers-chunks-before-the-end",
    "stdin-round-trips-through-cat",
    "unread-stdin-does-not-hang",
    "a-dropped-stream-leaves-no-process",
    "a-stream-over-its-cap-is-refused",
];

/// How many bytes of stdin the round-trip probe sends through `cat`: 8 MiB.
pub(crate) const STREAM_STDIN_BYTES: usize = 8 * 1024 * 1024;

/// The cap of the capped-stream probe: 64 KiB.
const STREAM_CAP: u64 = 64 * 1024;

/// The longest exec cleanup allowance a subject may claim.
pub(crate) const MAX_EXEC_CLEANUP_ALLOWANCE: Duration = Duration::from_secs(30);

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

/// Everything a stream delivered: its stdout, its stderr, and how it ended.
struct Drained {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    end: Result<ExecExit, SandboxError>,
}

/// Reads a stream to its end.
async fn drain(mut stream: ExecStream) -> Drained {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while let Some(event) = stream.next().await {
        match event {
            Ok(ExecEvent::Output(ExecChunk::Stdout(bytes))) => stdout.extend_from_slice(&bytes),
            Ok(ExecEvent::Output(ExecChunk::Stderr(bytes))) => stderr.extend_from_slice(&bytes),
            Ok(ExecEvent::Exit(exit)) => {
                return Drained {
                    stdout,
                    stderr,
                    end: Ok(exit),
                }
            }
            Err(error) => {
                return Drained {
                    stdout,
                    stderr,
                    end: Err(error),
                }
            }
        }
    }
    Drained {
        stdout,
        stderr,
        end: Err(SandboxError::engine("the stream ended without its exit")),
    }
}

/// `bytes` of a pattern no prefix of which repeats at a short period, so a reordered or
/// dropped chunk shows.
fn stdin_pattern(bytes: usize) -> Vec<u8> {
    (0..bytes as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

/// Attacks `exec`. Gate `exec`; plants `.probe-cwd`; every command runs in the working directory.
pub async fn assert_exec(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    let mut suite = SuiteRun::start(
        EXEC,
        EXEC_PROBE_TABLE,
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
        .probe("an-unusable-working-directory-is-not-started", &[], async {
            // A missing directory and a file where the directory should be: the command never
            // starts (the contract's own exit and a reason, never a shell's 127 or 2), and what
            // it would have done does not happen. On every backend the guest judges the
            // directory as it starts the command: there is no earlier check to race.
            let plain = format!("{work}/.probe-nocwd-file");
            let ran = format!("{work}/.probe-nocwd-ran");
            let made = run_argv(
                subject,
                &["sh", "-c", "printf x > \"$1\"", "probe", &plain],
                work,
            )
            .await?;
            ensure!(
                made.exit_code == 0,
                "planting a file exited {}",
                made.exit_code
            );
            for wd in [format!("{work}/.probe-nocwd-missing"), plain.clone()] {
                let out = run_argv(subject, &["touch", &ran], &wd).await?;
                ensure!(
                    out.exit_code == WORKDIR_UNUSABLE_EXIT,
                    "in {wd:?} the command ended {} ({:?})",
                    out.exit_code,
                    out.stderr_text()
                );
                let reason = out.not_started.as_deref().unwrap_or_default();
                ensure!(
                    !reason.is_empty(),
                    "in {wd:?} the result does not say the command never started"
                );
            }
            let left = run_argv(
                subject,
                &[
                    "sh",
                    "-c",
                    "test ! -e \"$1\" && rm -f \"$2\"",
                    "probe",
                    &ran,
                    &plain,
                ],
                work,
            )
            .await?;
            ensure!(
                left.exit_code == 0,
                "the command ran although its working directory was unusable"
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
            let fixture = every_byte_and_utf8_edges();
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

    suite
        .probe("a-stream-delivers-chunks-before-the-end", &[], async {
            let request = ExecRequest::new(Command::shell(
                "printf stream-first; sleep 2; printf stream-second",
            ))
            .working_directory(work)
            .timeout(subject.exec_timeout());
            let started = Instant::now();
            let mut stream = subject
                .sandbox()
                .exec_stream(request, ExecStdin::Closed)
                .await?;
            let first = loop {
                match stream.next().await {
                    Some(Ok(ExecEvent::Output(ExecChunk::Stdout(bytes)))) => break bytes,
                    Some(Ok(ExecEvent::Output(ExecChunk::Stderr(_)))) => continue,
                    Some(Ok(ExecEvent::Exit(exit))) => {
                        return Err(ProbeError::Assertion(format!(
                            "the command exited {} before any stdout",
                            exit.exit_code
                        )))
                    }
                    Some(Err(error)) => return Err(error.into()),
                    None => return Err(ProbeError::Assertion("the stream ended".into())),
                }
            };
            let first_at = started.elapsed();
            ensure!(
                first_at < Duration::from_secs(1),
                "the first chunk came {first_at:?} after the call, not while the command slept"
            );
            let rest = drain(stream).await;
            let exit = rest.end?;
            ensure!(exit.exit_code == 0, "the command exited {}", exit.exit_code);
            let all = [first, rest.stdout].concat();
            ensure!(
                all == b"stream-firststream-second",
                "the stream delivered {:?}",
                String::from_utf8_lossy(&all)
            );
            ensure!(
                started.elapsed() >= Duration::from_secs(2),
                "the command ended after only {:?}",
                started.elapsed()
            );
            Ok(())
        })
        .await;

    suite
        .probe("stdin-round-trips-through-cat", &[], async {
            let sent = stdin_pattern(STREAM_STDIN_BYTES);
            let request = ExecRequest::new(Command::argv(["cat"]))
                .working_directory(work)
                .timeout(subject.exec_timeout());
            let reader = ExecStdin::reader(std::io::Cursor::new(sent.clone()));
            let stream = subject.sandbox().exec_stream(request, reader).await?;
            let drained = drain(stream).await;
            let exit = drained.end?;
            ensure!(exit.exit_code == 0, "cat exited {}", exit.exit_code);
            ensure!(
                drained.stdout.len() == sent.len(),
                "cat echoed {} of {} bytes",
                drained.stdout.len(),
                sent.len()
            );
            ensure!(
                drained.stdout == sent,
                "cat echoed other bytes than it was sent"
            );
            ensure!(
                drained.stderr.is_empty(),
                "cat wrote {:?} on stderr",
                String::from_utf8_lossy(&drained.stderr)
            );
            Ok(())
        })
        .await;

    suite
        .probe("unread-stdin-does-not-hang", &[], async {
            let request = ExecRequest::new(Command::shell("exit 5"))
                .working_directory(work)
                .timeout(subject.exec_timeout());
            // Endless: only the command's exit can end the call.
            let endless = ExecStdin::reader(tokio::io::repeat(b'y'));
            let started = Instant::now();
            let stream = subject.sandbox().exec_stream(request, endless).await?;
            let drained = tokio::time::timeout(Duration::from_secs(20), drain(stream))
                .await
                .map_err(|_| {
                    ProbeError::Assertion(
                        "the call outlived a command that never read its stdin".into(),
                    )
                })?;
            let exit = drained.end?;
            ensure!(exit.exit_code == 5, "the command exited {}", exit.exit_code);
            ensure!(
                started.elapsed() < Duration::from_secs(20),
                "the call took {:?}",
                started.elapsed()
            );
            Ok(())
        })
        .await;

    suite
        .probe("a-dropped-stream-leaves-no-process", &[], async {
            let instance_id = subject.sandbox().instance_id().to_owned();
            let (head, tail) = ("dropped-stream-", "31421");
            let marker = format!("{head}{tail}");
            let request = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "while :; do printf dropped-stream-output; done",
                &marker,
            ]))
            .working_directory(work)
            .timeout(subject.exec_timeout());
            let mut stream = subject
                .sandbox()
                .exec_stream(request, ExecStdin::Closed)
                .await?;
            let mut seen = 0usize;
            while seen < 256 * 1024 {
                match stream.next().await {
                    Some(Ok(ExecEvent::Output(chunk))) => seen += chunk.bytes().len(),
                    other => {
                        return Err(ProbeError::Assertion(format!(
                            "the endless command's stream ended after {seen} bytes: {other:?}"
                        )))
                    }
                }
            }
            drop(stream);
            expect_none_left(subject, head, tail, work).await?;
            expect_handle_works(subject, work, &instance_id).await
        })
        .await;

    suite
        .probe("a-stream-over-its-cap-is-refused", &[], async {
            let instance_id = subject.sandbox().instance_id().to_owned();
            let (head, tail) = ("capped-stream-", "31422");
            let marker = format!("{head}{tail}");
            let request = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "while :; do printf capped-stream-output; done",
                &marker,
            ]))
            .working_directory(work)
            .timeout(subject.exec_timeout())
            .max_output_bytes(STREAM_CAP);
            let stream = subject
                .sandbox()
                .exec_stream(request, ExecStdin::Closed)
                .await?;
            let drained = drain(stream).await;
            match drained.end {
                Err(error) if error.kind() == ErrorKind::OutputLimitExceeded => {}
                Err(error) => {
                    return Err(ProbeError::Assertion(format!(
                        "the capped stream ended with {:?}: {error}",
                        error.kind()
                    )))
                }
                Ok(exit) => {
                    return Err(ProbeError::Assertion(format!(
                        "the endless command exited {} under a cap",
                        exit.exit_code
                    )))
                }
            }
            let delivered = (drained.stdout.len() + drained.stderr.len()) as u64;
            ensure!(
                delivered <= STREAM_CAP,
                "the stream delivered {delivered} bytes past its cap of {STREAM_CAP}"
            );
            expect_none_left(subject, head, tail, work).await?;
            expect_handle_works(subject, work, &instance_id).await
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
