//! The exec path: a `sandbox_exec` call's arguments checked against the server's bounds, and the
//! command run to its end with its output bounded.

use std::time::Duration;

use rmcp::model::ProgressNotificationParam;
use rmcp::service::RoleServer;
use sandbox_core::{
    Command, ExecChunk, ExecEnv, ExecEvent, ExecRequest, ExecStdin, Sandbox, SandboxError,
};
use tokio::time::Instant;

use super::messages::{ExecArgs, ExecResult};
use super::settings::Settings;
use crate::config::{DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT};
use crate::errors::ToolFailure;
use crate::output::{HeadTail, LastLine};

/// One `sandbox_exec` call: the handle it names and what to run there, within the server's
/// bounds.
#[derive(Debug)]
pub(super) struct ExecCall {
    /// The handle the call names (not yet looked up).
    pub(super) sandbox: String,
    /// The command, its working directory, timeout and environment, validated.
    pub(super) request: ExecRequest,
    /// Its standard input.
    pub(super) stdin: ExecStdin,
    /// Bytes kept of each output stream.
    pub(super) keep: usize,
}

impl ExecCall {
    /// The call `args` asks for, each bound cut to the server's.
    ///
    /// # Errors
    /// `invalid_argument` for neither or both of `command` and `argv`, a timeout or output bound
    /// that is not positive, or a request the core refuses (a secret-looking variable name).
    pub(super) fn new(args: ExecArgs, settings: &Settings) -> Result<Self, ToolFailure> {
        let command = match (args.command, args.argv) {
            (Some(line), None) => Command::shell(line),
            (None, Some(argv)) => Command::argv(argv),
            _ => return Err(ToolFailure::invalid(
                "give exactly one of command (a shell line) or argv (a program and its arguments)",
            )),
        };
        let timeout = match args.timeout_s {
            None => DEFAULT_TIMEOUT.min(settings.max_timeout),
            Some(s) if s.is_finite() && s > 0.0 => {
                Duration::try_from_secs_f64(s.min(settings.max_timeout.as_secs_f64()))
                    .unwrap_or(settings.max_timeout)
            }
            Some(_) => return Err(ToolFailure::invalid("timeout_s must be a positive number")),
        };
        if timeout.is_zero() {
            return Err(ToolFailure::invalid("timeout_s must be a positive number"));
        }
        let keep = match args.max_output_bytes {
            None => DEFAULT_OUTPUT_BYTES.min(settings.max_output_bytes),
            Some(0) => return Err(ToolFailure::invalid("max_output_bytes must be positive")),
            Some(n) => n.min(settings.max_output_bytes),
        };
        let mut env = ExecEnv::default();
        for (name, value) in args.env.unwrap_or_default() {
            env = env.set(name, value);
        }
        let request = ExecRequest::new(command)
            .working_directory(args.workdir.unwrap_or_else(|| ".".to_owned()))
            .timeout(timeout)
            .env(env);
        request
            .validate()
            .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
        let stdin = match args.stdin {
            Some(text) if !text.is_empty() => ExecStdin::Bytes(text.into_bytes()),
            _ => ExecStdin::Closed,
        };
        Ok(ExecCall {
            sandbox: args.sandbox,
            request,
            stdin,
            keep: usize::try_from(keep).unwrap_or(usize::MAX),
        })
    }
}

/// Runs one exec to its end, a timeout, or cancellation, keeping a bounded head and tail of each
/// stream and sending progress when the client asked for it.
///
/// # Cancel safety and drop
/// Dropping the future (an HTTP request that went away) drops the stream: the backend kills
/// every process of the command as on its deadline, and the sandbox keeps serving.
pub async fn run_exec(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    stdin: ExecStdin,
    keep: usize,
    progress: Option<(rmcp::model::ProgressToken, rmcp::Peer<RoleServer>)>,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<ExecResult, ToolFailure> {
    let started = Instant::now();
    let mut stdout = HeadTail::new(keep);
    let mut stderr = HeadTail::new(keep);
    let mut last = LastLine::default();
    let mut stream = tokio::select! {
        s = sandbox.exec_stream(request, stdin) => s.map_err(|e| ToolFailure::from_sandbox(&e, None))?,
        () = cancel.cancelled() => return Err(ToolFailure::cancelled()),
    };
    let period = Duration::from_secs(1);
    let mut ticker = tokio::time::interval_at(started + period, period);
    let mut sent = 0u32;
    let (exit_code, timed_out) = loop {
        tokio::select! {
            () = cancel.cancelled() => {
                drop(stream);
                return Err(ToolFailure::cancelled());
            }
            event = stream.next() => match event {
                Some(Ok(ExecEvent::Output(ExecChunk::Stdout(bytes)))) => {
                    stdout.push(&bytes);
                    last.push(&bytes);
                }
                Some(Ok(ExecEvent::Output(ExecChunk::Stderr(bytes)))) => {
                    stderr.push(&bytes);
                    last.push(&bytes);
                }
                Some(Ok(ExecEvent::Exit(exit))) => {
                    if exit.not_started.is_some() {
                        // The guest's reason may name its own paths; the model gets the kind.
                        return Err(ToolFailure::new(
                            "workdir_unusable",
                            "the working directory is missing or cannot be entered",
                            false,
                        ));
                    }
                    break (Some(exit.exit_code), false);
                }
                Some(Err(e)) if e.kind() == sandbox_core::ErrorKind::Timeout => break (None, true),
                Some(Err(e)) => return Err(ToolFailure::from_sandbox(&e, None)),
                None => return Err(ToolFailure::from_sandbox(&SandboxError::engine("stream ended"), None)),
            },
            _ = ticker.tick(), if progress.is_some() => {
                if let Some((token, peer)) = &progress {
                    sent += 1;
                    let mut note = ProgressNotificationParam::new(token.clone(), f64::from(sent));
                    if let Some(line) = last.latest() {
                        note = note.with_message(line);
                    }
                    // A client that cannot take a notification still gets its result.
                    let _ = peer.notify_progress(note).await;
                }
            }
        }
    };
    let (stdout_text, stdout_escaped) = stdout.escaped_text();
    let (stderr_text, stderr_escaped) = stderr.escaped_text();
    Ok(ExecResult {
        exit_code,
        timed_out,
        stdout: stdout_text,
        stderr: stderr_text,
        control_escaped: stdout_escaped || stderr_escaped,
        stdout_truncated: stdout.truncated(),
        stderr_truncated: stderr.truncated(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        egress_denied: Vec::new(),
    })
}
