//! The backend's side of the `sbx-cli` driver: how its typed failures become the contract's
//! errors, and the few call shapes the backend repeats (probes run with the command timeout).

use std::time::Duration;

use bounded_process::{ExitKind, RunOutput};
use sandbox_core::SandboxError;
use sbx_cli::{Call, Error as CliError, ExecRequest as CliExec, Instant, SbxCli, SbxName};

use crate::BACKEND_NAME;

/// Output budget of the backend's own short guest calls (probes, scripts, kills): 64 KiB.
pub(crate) const SMALL_BUDGET: usize = 64 * 1024;

/// Maps a driver failure onto the contract. `NotFound` and `AlreadyExists` are usually handled
/// by the caller first; reaching here they are engine failures with sbx's own words.
#[cold]
pub(crate) fn to_sandbox_error(error: CliError) -> SandboxError {
    let message = error.to_string();
    match error {
        CliError::InvalidArgument { .. } => SandboxError::InvalidArgument(message),
        CliError::LoginRequired { .. } => SandboxError::LoginRequired(message),
        CliError::DaemonFault { .. } => SandboxError::DaemonFault(message),
        CliError::Timeout { call, bound } => SandboxError::EngineTimeout {
            operation: format!("sbx {}", call.as_str()),
            bound,
        },
        CliError::SpawnFailed { source, .. } => SandboxError::BackendUnavailable {
            backend: BACKEND_NAME.to_owned(),
            detail: message,
            source: Some(Box::new(source)),
        },
        other => SandboxError::Engine {
            detail: message,
            source: Some(Box::new(other)),
        },
    }
}

/// A name the driver accepts. Names built by this backend always are; one read from disk may not
/// be, and is then nothing of this backend's.
pub(crate) fn sbx_name(name: &str) -> Result<SbxName, SandboxError> {
    SbxName::new(name).map_err(to_sandbox_error)
}

/// The status of a finished client as an exit code; a signal reads as `None`.
pub(crate) fn exit_code(output: &RunOutput) -> Option<i32> {
    match output.status {
        ExitKind::Exited(code) => Some(code),
        ExitKind::Signaled(_) => None,
    }
}

/// A failed guest call classified from its stderr (login, daemon, `not found`, …).
#[cold]
pub(crate) fn classified(name: &SbxName, output: &RunOutput) -> SandboxError {
    to_sandbox_error(sbx_cli::classify_output(
        Call::Exec,
        Some(name.as_str()),
        output.status,
        &output.stderr,
    ))
}

/// One short guest call (`sh -c <script> …`) bounded by `timeout`, with the small budget; the
/// raw output whatever the exit status.
pub(crate) async fn short_exec<I, A>(
    cli: &SbxCli,
    name: &SbxName,
    argv: I,
    as_root: bool,
    timeout: Duration,
) -> Result<RunOutput, CliError>
where
    I: IntoIterator<Item = A>,
    A: Into<std::ffi::OsString>,
{
    let mut request =
        CliExec::new(name.clone(), argv, Instant::now() + timeout).output_budget(SMALL_BUDGET);
    if as_root {
        request = request.as_root();
    }
    cli.exec(&request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn driver_failures_map_onto_the_contract() {
        let cases = [
            (
                sbx_cli::classify(
                    Call::Ls,
                    None,
                    "ERROR: You are not logged in. Run 'sbx login'".into(),
                ),
                ErrorKind::LoginRequired,
            ),
            (
                sbx_cli::classify(Call::Ls, None, "ERROR: backend unavailable: x".into()),
                ErrorKind::DaemonFault,
            ),
            (
                sbx_cli::classify(
                    Call::Create,
                    Some("n"),
                    "kit startup exited with code 127".into(),
                ),
                ErrorKind::Engine,
            ),
            (
                sbx_cli::classify(Call::Ls, None, "exit 1".into()),
                ErrorKind::Engine,
            ),
            (
                CliError::Timeout {
                    call: Call::Ls,
                    bound: Duration::from_secs(60),
                },
                ErrorKind::EngineTimeout,
            ),
            (
                CliError::SpawnFailed {
                    sbx_path: "/nope/sbx".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                },
                ErrorKind::BackendUnavailable,
            ),
        ];
        for (error, kind) in cases {
            let text = error.to_string();
            assert_eq!(to_sandbox_error(error).kind(), kind, "{text}");
        }
    }
}
