//! `sandboxctl`: the operator CLI over the sandbox router and its backends.
//!
//! Exit codes are chosen here and nowhere else (see `exit_codes`): `run` and `exec` exit with the
//! command's own status, 124 when the caller's timeout expired, 125 for anything else; other commands
//! exit 0, 2 (usage) or 64–71 by error kind.

mod backends;
mod cli;
mod commands;
mod exit_codes;
mod guest_env;
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
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandboxctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit_codes::ENGINE);
        }
    };
    ExitCode::from(runtime.block_on(commands::dispatch(cli)))
}

/// Help and version exit 0; other parse failures are usage errors: 125 for `run`/`exec` (every other
/// integer may be the command's own), 2 for the rest.
fn usage_error(raw: &[std::ffi::OsString], err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = err.print();
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        _ => {
            let before_argv = raw.iter().skip(1).take_while(|a| *a != "--");
            let runs = before_argv
                .filter(|a| !a.to_string_lossy().starts_with('-'))
                .any(|a| a == "run" || a == "exec");
            ExitCode::from(if runs {
                exit_codes::RUN_FAILURE
            } else {
                exit_codes::USAGE
            })
        }
    }
}

fn init_tracing() {
    // Logs go to stderr only when asked for (SANDBOXCTL_LOG=debug); stdout stays the command's.
    if let Ok(level) = std::env::var("SANDBOXCTL_LOG") {
        if let Ok(level) = level.parse::<tracing::Level>() {
            let _ = tracing::subscriber::set_global_default(
                tracing_subscriber::fmt()
                    .with_max_level(level)
                    .with_writer(std::io::stderr)
                    .finish(),
            );
        }
    }
}
