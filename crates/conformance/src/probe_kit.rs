//! Small steps the probes share: guest commands with the subject's timeout, exit-status checks, the
//! empty `.probe-cwd` planting.

use sandbox_core::{Command, ExecOutput, ExecRequest};

use crate::error::ConformanceError;
use crate::paths::ConformancePaths;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, ProbeError, ProbeResult};

/// Runs `command` in `wd` with the subject's exec timeout.
pub(crate) async fn run(
    subject: &dyn ConformanceSubject,
    command: Command,
    wd: &str,
) -> Result<ExecOutput, ProbeError> {
    let request = ExecRequest::new(command)
        .working_directory(wd)
        .timeout(subject.exec_timeout());
    Ok(subject.sandbox().exec(request).await?)
}

/// Runs an argv of text elements in `wd`.
pub(crate) async fn run_argv(
    subject: &dyn ConformanceSubject,
    argv: &[&str],
    wd: &str,
) -> Result<ExecOutput, ProbeError> {
    run(subject, Command::argv(argv), wd).await
}

/// The exit status of an argv in `wd`.
pub(crate) async fn status(
    subject: &dyn ConformanceSubject,
    argv: &[&str],
    wd: &str,
) -> Result<i32, ProbeError> {
    Ok(run_argv(subject, argv, wd).await?.exit_code)
}

/// Fails unless `argv` in `wd` exits 0 with exactly `stdout`.
pub(crate) async fn expect_stdout(
    subject: &dyn ConformanceSubject,
    argv: &[&str],
    wd: &str,
    stdout: &[u8],
) -> ProbeResult {
    let output = run_argv(subject, argv, wd).await?;
    ensure!(
        output.exit_code == 0,
        "{argv:?} in {wd:?} exited {} (stderr {:?})",
        output.exit_code,
        output.stderr_text()
    );
    ensure!(
        output.stdout == stdout,
        "{argv:?} in {wd:?} printed {:?}, expected {:?}",
        output.stdout_text(),
        String::from_utf8_lossy(stdout)
    );
    Ok(())
}

/// Fails unless `test -e name` in `wd` is non-zero (the working directory may be absent: the exec must
/// then return non-zero, never fail).
pub(crate) async fn expect_absent_by_test(
    subject: &dyn ConformanceSubject,
    name: &str,
    wd: &str,
) -> ProbeResult {
    let code = status(subject, &["test", "-e", name], wd).await?;
    ensure!(
        code != 0,
        "{name:?} exists in {wd:?}: the refused call landed anyway"
    );
    Ok(())
}

/// Fails unless the subject sees something at `absolute`.
pub(crate) async fn expect_present(
    subject: &dyn ConformanceSubject,
    absolute: &str,
    what: &str,
) -> ProbeResult {
    ensure!(
        subject.exists(absolute).await?,
        "{what} {absolute:?} is gone"
    );
    Ok(())
}

/// Fails unless the subject sees nothing at `absolute`.
pub(crate) async fn expect_gone(
    subject: &dyn ConformanceSubject,
    absolute: &str,
    what: &str,
) -> ProbeResult {
    ensure!(
        !subject.exists(absolute).await?,
        "{what} {absolute:?} is still there"
    );
    Ok(())
}

/// Plants the empty `work/.probe-cwd`, which creates the working directory: a probe
/// then runs in a directory that exists without planting anything else.
pub(crate) async fn plant_nothing(
    subject: &dyn ConformanceSubject,
    paths: &ConformancePaths,
) -> Result<(), ConformanceError> {
    subject.plant_file(&paths.in_work(".probe-cwd"), b"").await
}
