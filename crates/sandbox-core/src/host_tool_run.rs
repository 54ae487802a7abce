//! A command run with host tools: the relay and the command as two execs of one sandbox.
//!
//! The run starts `host-tool relay` in the guest over a streamed exec whose stdin and stdout
//! carry the channel's frames, waits for the relay's `Ready` (the socket of a fresh per-run
//! directory), runs the command with [`SOCKET_ENV`] naming that socket, and serves the calls
//! until the command ends. Then the server is dropped (every pending handler with it), the relay
//! is told to drain and exits, removing its directory; a relay that does not is killed and its
//! directory removed by the host. Any backend with a streamed exec that feeds stdin serves it.

use std::time::Duration;

use host_tools::{
    await_ready, serve_run, write_frame, ChannelError, Frame, RunBounds, RunReport, RunTools,
};

use crate::{
    Command, ExecChunk, ExecEvent, ExecExit, ExecOutput, ExecRequest, ExecStdin, Sandbox,
    SandboxError,
};

/// Where the images that carry it hold the guest's `host-tool` program.
pub const HOST_TOOL_PROGRAM: &str = "/usr/local/bin/host-tool";
pub use host_tools::run_directory::SOCKET_ENV;
/// How long the relay may take to report ready.
const READY_DEADLINE: Duration = Duration::from_secs(15);
/// How long the relay may take to exit once drained.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);
/// The relay's stderr kept for a diagnosis.
const STDERR_TAIL: usize = 4096;
/// The relay's deadline beyond the command's: room for the start and the drain.
const RELAY_GRACE: Duration = Duration::from_secs(30);
/// How long a cancelled run's relay stays up before it is drained: the cancelled command is
/// being killed meanwhile, and a relay drained at once would answer its pending call, letting
/// the command end by itself under the kill (which a backend may take for a command that hid
/// from it).
const CANCELLED_DRAIN_DELAY: Duration = Duration::from_secs(3);

/// The relay's stdin. Dropped with a run that did not finish, it drains the relay after
/// [`CANCELLED_DRAIN_DELAY`], in a task of its own.
struct RelayStdin(Option<tokio::io::DuplexStream>);

impl RelayStdin {
    fn writer(&mut self) -> &mut tokio::io::DuplexStream {
        // Present until `drain` takes it, and nothing writes after a drain.
        self.0.get_or_insert_with(|| tokio::io::duplex(1).0)
    }

    /// Tells the relay the run is over, once: a second drain finds no writer.
    async fn drain(&mut self) {
        if let Some(mut writer) = self.0.take() {
            let _ = write_frame(&mut writer, &Frame::Drain).await;
        }
    }
}

impl Drop for RelayStdin {
    fn drop(&mut self) {
        let Some(mut writer) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(CANCELLED_DRAIN_DELAY).await;
                let _ = write_frame(&mut writer, &Frame::Drain).await;
            });
        }
    }
}

/// What a run with host tools produced.
#[derive(Debug)]
pub struct HostToolRun {
    /// The command's output, exactly as a plain exec would give it.
    pub output: ExecOutput,
    /// The calls the run served.
    pub report: RunReport,
    /// Why the channel ended before the command did (the guest broke the protocol or killed
    /// the relay), if it did; the command still ran to its end, its calls failing.
    pub channel_error: Option<String>,
}

/// How the relay's exec ended.
#[derive(Debug)]
struct RelayEnd {
    exit: Option<Result<ExecExit, SandboxError>>,
    stderr: Vec<u8>,
}

/// Runs `request` in `sandbox` while serving its calls to `tools`.
///
/// # Errors
/// [`SandboxError::CapabilityNotSupported`] when the guest has no `host-tool` program;
/// [`SandboxError::GuestRefused`] when the relay does not start; the command's own errors
/// (a timeout, an engine failure) as [`Sandbox::exec`] returns them.
///
/// # Cancel safety and drop
/// Dropping the future drops every pending host-tool handler at once (no tool runs after it)
/// and the command's exec (which the backend kills); a task drains the relay a few seconds
/// later, so it removes its directory and exits; a relay that does not is killed by its exec's
/// own deadline.
pub async fn run_with_host_tools<S: Sandbox + ?Sized>(
    sandbox: &S,
    request: ExecRequest,
    tools: &RunTools,
    bounds: &RunBounds,
) -> Result<HostToolRun, SandboxError> {
    request.validate()?;
    let working_dir = request.working_dir().to_owned();
    let timeout = request.timeout_bound();
    let staging = Staging {
        command: |_: &str| (request, ExecStdin::Closed),
        after: None::<fn(&str) -> ExecRequest>,
    };
    let staged = run_staged(sandbox, (&working_dir, timeout), tools, bounds, staging).await?;
    Ok(staged.run)
}

/// What a staged run runs in its run directory, each made from the directory's path once the
/// relay is ready: the command with its stdin, and a command run after it (before the relay is
/// drained, which removes the directory), whose collected output is returned as it is.
pub(crate) struct Staging<C, A> {
    pub(crate) command: C,
    pub(crate) after: Option<A>,
}

/// A staged run's outcome.
#[derive(Debug)]
pub(crate) struct Staged {
    pub(crate) run: HostToolRun,
    /// The after-command's output, when there was one and the command itself ran.
    pub(crate) after: Option<Result<ExecOutput, SandboxError>>,
}

/// The run itself: the relay in `relay_at` (its working directory and the command's bound),
/// then `staging`'s command, then its after-command.
pub(crate) async fn run_staged<S, C, A>(
    sandbox: &S,
    relay_at: (&str, Duration),
    tools: &RunTools,
    bounds: &RunBounds,
    staging: Staging<C, A>,
) -> Result<Staged, SandboxError>
where
    S: Sandbox + ?Sized,
    C: FnOnce(&str) -> (ExecRequest, ExecStdin),
    A: FnOnce(&str) -> ExecRequest,
{
    let (working_dir, timeout) = relay_at;
    let max_frame = bounds.max_frame_payload().to_string();
    let relay_request = ExecRequest::new(Command::argv([
        HOST_TOOL_PROGRAM,
        "relay",
        "--max-frame",
        &max_frame,
    ]))
    .working_directory(working_dir)
    .timeout(timeout + RELAY_GRACE);
    let (stdin_reader, to_relay) = tokio::io::duplex(64 * 1024);
    let mut to_relay = RelayStdin(Some(to_relay));
    let stream = sandbox
        .exec_stream(relay_request, ExecStdin::reader(stdin_reader))
        .await?;
    let (mut from_relay, relay_stdout) = tokio::io::duplex(64 * 1024);
    // The relay's output is pumped by a task of its own: dropping this future closes the
    // relay's stdin, and the task sees the relay out instead of killing it mid-clean-up.
    let mut pump = tokio::spawn(pump(stream, relay_stdout));

    let (socket, decoder, pending) =
        match await_ready(&mut from_relay, bounds, READY_DEADLINE).await {
            Ok(ready) => ready,
            Err(error) => {
                to_relay.drain().await;
                let end = tokio::time::timeout(DRAIN_DEADLINE, &mut pump).await;
                pump.abort();
                return Err(not_started(error, end.ok().and_then(Result::ok)));
            }
        };
    let directory = match socket.strip_suffix("/socket") {
        Some(directory) if host_tools::run_directory::is_run_socket(&socket) => {
            directory.to_owned()
        }
        _ => {
            to_relay.drain().await;
            pump.abort();
            return Err(SandboxError::GuestRefused {
                path: socket,
                detail: "the relay reported a socket outside a run directory".to_owned(),
            });
        }
    };
    let (request, stdin) = (staging.command)(&directory);
    let env = request.guest_env().clone().set(SOCKET_ENV, &socket);
    let command = request.env(env);
    let mut channel_error = None;
    let mut report = RunReport::default();
    let output = {
        let exec = exec_with(sandbox, command, stdin);
        tokio::pin!(exec);
        let finished = {
            let served = serve_run(
                tools,
                bounds,
                decoder,
                pending,
                &mut from_relay,
                to_relay.writer(),
                &mut report,
            );
            tokio::pin!(served);
            tokio::select! {
                output = &mut exec => Some(output),
                ended = &mut served => {
                    if let Err(error) = ended {
                        channel_error = Some(error.to_string());
                    }
                    None
                }
            }
            // Leaving this block drops the server: every pending handler with it.
        };
        match finished {
            Some(output) => output,
            None => {
                // The channel ended first (the relay died, or the guest broke the protocol):
                // the relay is drained now, so the command's calls fail instead of waiting.
                to_relay.drain().await;
                exec.await
            }
        }
    };
    let after = match (&output, staging.after) {
        (Ok(_), Some(after)) => Some(sandbox.exec(after(&directory)).await),
        _ => None,
    };
    to_relay.drain().await;
    let end = match tokio::time::timeout(DRAIN_DEADLINE, &mut pump).await {
        Ok(Ok(end)) => Some(end),
        _ => {
            pump.abort();
            None
        }
    };
    let clean = end
        .as_ref()
        .is_some_and(|end| matches!(&end.exit, Some(Ok(exit)) if exit.exit_code == 0));
    if !clean {
        remove_run_directory(sandbox, &socket).await;
    }
    Ok(Staged {
        run: HostToolRun {
            output: output?,
            report,
            channel_error,
        },
        after,
    })
}

/// A collected exec, fed `stdin` when it holds anything (through the streamed exec, capped at
/// the request's output budget as a collected exec is).
async fn exec_with<S: Sandbox + ?Sized>(
    sandbox: &S,
    request: ExecRequest,
    stdin: ExecStdin,
) -> Result<ExecOutput, SandboxError> {
    if stdin.is_empty() {
        return sandbox.exec(request).await;
    }
    let budget = request.output_budget();
    sandbox
        .exec_stream(request.max_output_bytes(budget), stdin)
        .await?
        .collect()
        .await
}

/// Removes a run directory a relay left (killed, or not drained in time).
async fn remove_run_directory<S: Sandbox + ?Sized>(sandbox: &S, socket: &str) {
    let Some(directory) = socket.strip_suffix("/socket") else {
        return;
    };
    let removal =
        ExecRequest::new(Command::argv(["rm", "-rf", "--", directory])).timeout(DRAIN_DEADLINE);
    if let Err(error) = sandbox.exec(removal).await {
        tracing::warn!(%error, directory, "a host-tool run directory was not removed");
    }
}

async fn pump(mut stream: crate::ExecStream, mut stdout: tokio::io::DuplexStream) -> RelayEnd {
    use tokio::io::AsyncWriteExt as _;
    let mut stderr = Vec::new();
    let mut forwarding = true;
    loop {
        match stream.next().await {
            Some(Ok(ExecEvent::Output(ExecChunk::Stdout(bytes)))) => {
                // Once the run stops reading, the rest is drained and dropped.
                if forwarding && stdout.write_all(&bytes).await.is_err() {
                    forwarding = false;
                }
            }
            Some(Ok(ExecEvent::Output(ExecChunk::Stderr(bytes)))) => {
                let room = STDERR_TAIL.saturating_sub(stderr.len());
                stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Some(Ok(ExecEvent::Exit(exit))) => {
                return RelayEnd {
                    exit: Some(Ok(exit)),
                    stderr,
                }
            }
            Some(Err(error)) => {
                return RelayEnd {
                    exit: Some(Err(error)),
                    stderr,
                }
            }
            None => return RelayEnd { exit: None, stderr },
        }
    }
}

#[cold]
fn not_started(error: ChannelError, end: Option<RelayEnd>) -> SandboxError {
    let stderr = end
        .as_ref()
        .map(|end| String::from_utf8_lossy(&end.stderr).trim().to_owned())
        .unwrap_or_default();
    match end.and_then(|end| end.exit) {
        Some(Ok(exit)) if exit.exit_code == 126 || exit.exit_code == 127 => {
            SandboxError::CapabilityNotSupported(format!(
                "this sandbox has no {HOST_TOOL_PROGRAM} (exit {}): its image does not carry \
                 host tools",
                exit.exit_code
            ))
        }
        Some(Err(error)) => error,
        _ => SandboxError::GuestRefused {
            path: HOST_TOOL_PROGRAM.to_owned(),
            detail: format!("the host-tool relay did not start: {error}; {stderr}"),
        },
    }
}
