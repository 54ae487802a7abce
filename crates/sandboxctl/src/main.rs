//! `sandboxctl`: the operator CLI over the sandbox router and its backends.
//!
//! Exit codes are chosen here and nowhere else (see `exit_codes`): `run` and `exec` exit with the
//! command's own status, 124 when the caller's timeout expired, 125 for anything else; other commands
//! exit 0, 2 (usage) or 64–71 by error kind.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backends;
mod cli;
mod commands;
mod doctor;
mod egress_args;
mod exit_codes;
mod guest_env;
mod host_tool_commands;
mod keys;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match cli::Cli::try_parse_from(&raw) {
        Ok(cli) => cli,
        Err(err) => return usage_error(&raw, err),
    };
    // Logs go to stderr only when asked for (SANDBOXCTL_LOG=debug); stdout stays the command's.
    sandbox_backends::log_to_stderr_from_env("SANDBOXCTL_LOG");
    // One call per process, I/O-bound: a current-thread runtime starts no worker threads and
    // hands no wake-up between threads, which on a loaded host is measurable per call
    // (BENCHMARKS.md, `sandboxctl` per call). Blocking work (stdin, stdout) is on tokio's blocking
    // pool either way.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit_codes::ENGINE);
        }
    };
    let code = runtime.block_on(commands::dispatch(cli));
    // Cleanups the backend runs in tasks of their own (the remote kill of an interrupted command,
    // the removal of a half-made sandbox) finish before the process ends, within a bound.
    runtime.block_on(background_tasks_done(std::time::Duration::from_secs(30)));
    // A read of this process's stdin (`-i`) that the command never wanted cannot be cancelled:
    // the runtime is not waited for once its tasks are done.
    runtime.shutdown_background();
    ExitCode::from(code)
}

/// Waits until no task is left, within `bound`. Most calls leave only the engine client's
/// connection tasks, which end a moment after the client is dropped: the poll is fine-grained so
/// that moment is not rounded up to a coarse tick on every call.
async fn background_tasks_done(bound: std::time::Duration) {
    let handle = tokio::runtime::Handle::current();
    let deadline = tokio::time::Instant::now() + bound;
    while handle.metrics().num_alive_tasks() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Help and version exit 0; other parse failures are usage errors: 125 with a one-line reason for
/// `run`/`exec` (every other integer may be the command's own), 2 for the rest. With `--json` the error
/// is also the one JSON object on stdout, so a script never has to parse clap's text.
fn usage_error(raw: &[std::ffi::OsString], err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    let words = UsageWords::read(raw);
    let reason = one_line_reason(&err.render().to_string());
    let runs = matches!(words.subcommand.as_deref(), Some("run" | "exec"));
    if runs {
        eprintln!(
            "sandboxctl: {reason} (see sandboxctl {} --help)",
            words.subcommand.as_deref().unwrap_or_default()
        );
    } else {
        let _ = err.print();
    }
    if words.json {
        let error = serde_json::json!({ "kind": "Usage", "message": reason });
        report::print_json(&if runs {
            serde_json::json!({ "outcome": "error", "error": error })
        } else {
            serde_json::json!({ "error": error })
        });
    }
    ExitCode::from(if runs {
        exit_codes::RUN_FAILURE
    } else {
        exit_codes::USAGE
    })
}

/// What a command line that failed to parse still tells: its subcommand and whether `--json` was asked.
#[derive(Debug, Default, PartialEq, Eq)]
struct UsageWords {
    subcommand: Option<String>,
    json: bool,
}

impl UsageWords {
    /// Reads the words before `--` (after it is the command's argv). The subcommand is the first word that
    /// is neither a flag nor the value of a global flag, so `list --scope run` stays a `list`.
    fn read(raw: &[std::ffi::OsString]) -> Self {
        let mut words = UsageWords::default();
        let mut args = raw.iter().skip(1).map(|a| a.to_string_lossy());
        while let Some(arg) = args.next() {
            match arg.as_ref() {
                "--" => break,
                "--json" => words.json = true,
                "--backend" | "--min-isolation" if words.subcommand.is_none() => {
                    args.next();
                }
                flag if flag.starts_with('-') => {}
                word if words.subcommand.is_none() => words.subcommand = Some(word.to_owned()),
                _ => {}
            }
        }
        words
    }
}

/// Clap's message without its usage block and tips, on one line.
fn one_line_reason(rendered: &str) -> String {
    let text: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let joined = text.join(" ");
    joined.strip_prefix("error: ").unwrap_or(&joined).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(args: &[&str]) -> UsageWords {
        let raw: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        UsageWords::read(&raw)
    }

    #[test]
    fn the_subcommand_is_not_a_flag_value() {
        let w = words(&[
            "sandboxctl",
            "--backend",
            "docker",
            "list",
            "--scope",
            "run",
        ]);
        assert_eq!(w.subcommand.as_deref(), Some("list"));
        assert!(!w.json);
        let w = words(&[
            "sandboxctl",
            "--min-isolation",
            "container",
            "run",
            "--json",
            "--",
            "--json",
        ]);
        assert_eq!(w.subcommand.as_deref(), Some("run"));
        assert!(w.json);
        let w = words(&["sandboxctl", "exec", "--", "--json"]);
        assert_eq!(w.subcommand.as_deref(), Some("exec"));
        assert!(!w.json, "--json after -- belongs to the command");
    }

    #[test]
    fn reasons_fit_on_one_line() {
        let rendered = "error: the following required arguments were not provided:\n  <CMD>...\n\nUsage: sandboxctl run -- <CMD>...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_reason(rendered),
            "the following required arguments were not provided: <CMD>..."
        );
        let rendered = "error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\nUsage: x\n";
        assert_eq!(
            one_line_reason(rendered),
            "unexpected argument '--bogus' found"
        );
    }
}
