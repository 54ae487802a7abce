//! The raw `docker` CLI as a bench's reference side: one bounded call, and a keep-alive
//! container hardened as the Docker backend's workloads are (docs/docker-backend.md#hardening),
//! labelled so a sweep finds it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;

/// The label every raw container carries, valued with the run's scope.
pub const LABEL: &str = "maf-sandbox-bench";

/// The deadline of each raw call, so a wedged engine fails the run instead of hanging it.
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// What one raw docker call printed.
#[derive(Debug)]
pub struct RawOutput {
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// One raw `docker <args…>` (optionally with bytes on stdin), within [`TIMEOUT`].
///
/// # Panics
/// When the CLI does not start, does not finish in time, or exits other than 0: the reference
/// side of a bench has no failure to report, only a broken run.
pub async fn docker_with_stdin(args: &[&str], stdin: Option<&[u8]>) -> RawOutput {
    let mut command = tokio::process::Command::new("docker");
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the docker CLI starts");
    let pipe = child.stdin.take();
    // Fed while the output is read, so neither side waits on a full pipe.
    let feed = async move {
        if let (Some(bytes), Some(mut pipe)) = (stdin, pipe) {
            pipe.write_all(bytes).await.expect("stdin is written");
        }
    };
    let run = async {
        let ((), output) = tokio::join!(feed, child.wait_with_output());
        output
    };
    let output = tokio::time::timeout(TIMEOUT, run)
        .await
        .unwrap_or_else(|_| panic!("docker {args:?} did not finish within {TIMEOUT:?}"))
        .expect("the docker CLI runs");
    assert!(
        output.status.success(),
        "docker {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    RawOutput {
        stdout: output.stdout,
        stderr: output.stderr,
    }
}

/// One raw `docker <args…>`, as [`docker_with_stdin`] without stdin.
///
/// # Panics
/// As [`docker_with_stdin`].
pub async fn docker(args: &[&str]) -> RawOutput {
    docker_with_stdin(args, None).await
}

/// `docker run -d` of a keep-alive `sh` on `image` under the engine's runtime `runtime`, with
/// the Docker backend's hardening (the engine's init, no new privileges, every capability
/// dropped, a pids limit, no network) and the label [`LABEL`]`=scope`; its id.
///
/// # Panics
/// As [`docker_with_stdin`], and when the engine prints no container id.
pub async fn run_hardened(image: &str, scope: &str, runtime: &str) -> String {
    let label = format!("{LABEL}={scope}");
    let output = docker(&[
        "run",
        "-d",
        "--runtime",
        runtime,
        "--pull=never",
        "--init",
        "--security-opt",
        "no-new-privileges",
        "--cap-drop",
        "ALL",
        "--pids-limit",
        "512",
        "--network",
        "none",
        "--label",
        &label,
        "--entrypoint",
        "sh",
        image,
        "-c",
        "while :; do sleep 3600; done",
    ])
    .await;
    let id = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert_eq!(id.len(), 64, "docker run -d printed {id:?}");
    id
}

/// A container of [`run_hardened`] under runc, removed with a blocking `docker rm -f` when
/// dropped, so even a bench that panics leaves it on no engine.
#[derive(Debug)]
pub struct RawContainer {
    /// The container's id.
    pub id: String,
}

impl RawContainer {
    /// Runs it on `image`, labelled with `scope`.
    ///
    /// # Panics
    /// As [`run_hardened`].
    pub async fn start(image: &str, scope: &str) -> RawContainer {
        RawContainer {
            id: run_hardened(image, scope, "runc").await,
        }
    }
}

impl Drop for RawContainer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("timeout")
            .args(["120", "docker", "rm", "-f", &self.id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
