//! Commands in a container through the Engine API: exec create, attached start with stdin fed
//! from the caller and stdout and stderr demultiplexed to a sink as they arrive, and the exit code
//! from the exec inspect. What runs (the wrapper, its kill) is [`crate::guest_calls`]'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bounded_process::{OutputSink, Stream};
use futures_util::StreamExt as _;
use sandbox_core::{ExecStdin, SandboxError};
use tokio::io::AsyncWriteExt as _;

use crate::connection::{quote, ApiFailure, EngineConnection};
use crate::containers::{Containers, PauseWait};

/// What one attached exec collected.
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) exit_code: i32,
}

/// How an attached exec failed.
pub(crate) enum ExecFailure {
    /// The engine refused the create or the start: the command never ran.
    NotStarted(ApiFailure),
    /// The stream broke after the start: the command may still run.
    Broken(ApiFailure),
    /// Stdout and stderr together passed the budget.
    OverBudget,
    /// The consumer dropped the stream: the command may still run.
    Dropped,
}

/// Collects a backend-internal call's output against its budget.
pub(crate) struct CollectSink {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) budget: u64,
}

impl OutputSink for CollectSink {
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> Result<(), bounded_process::Error> {
        if (self.stdout.len() + self.stderr.len() + bytes.len()) as u64 > self.budget {
            return Err(bounded_process::Error::OutputLimit {
                program: "docker".to_owned(),
                budget: usize::try_from(self.budget).unwrap_or(usize::MAX),
            });
        }
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(bytes),
            Stream::Stderr => self.stderr.extend_from_slice(bytes),
        }
        Ok(())
    }
}

/// How many pauses in a row an exec waits out before it starts (one per process of an earlier
/// version of this crate adopting the container at once).
const PAUSES_WAITED_OUT: u32 = 4;

/// Whether an exec the engine refused with a conflict starts again after `waited`: when a pause
/// was lifted while it waited, and when the container runs already (a pause of one archive upload
/// can end between the refusal and the look). A container still paused, or not running, keeps
/// the refusal.
fn starts_after_conflict(waited: PauseWait) -> bool {
    matches!(
        waited,
        PauseWait::Lifted | PauseWait::NotPaused { running: true }
    )
}

/// How far stdin is read ahead of the command: one buffer of this many bytes.
const STDIN_BUFFER: usize = 256 * 1024;

/// The engine's exec endpoints for the backend's containers.
#[derive(Debug)]
pub(crate) struct Execs {
    engine: EngineConnection,
    /// Waits out a pause someone else holds before an exec starts.
    containers: Arc<Containers>,
}

impl Execs {
    pub(crate) fn new(engine: EngineConnection, containers: Arc<Containers>) -> Self {
        Execs { engine, containers }
    }

    /// Runs `argv` attached in container `id`, the guest environment only in the exec request's
    /// own `Env`, collecting at most `budget` bytes of output. The caller bounds the time.
    pub(crate) async fn exec_collect(
        &self,
        id: &str,
        argv: Vec<String>,
        env: Vec<String>,
        budget: u64,
    ) -> Result<Collected, ExecFailure> {
        let mut sink = CollectSink {
            stdout: Vec::new(),
            stderr: Vec::new(),
            budget,
        };
        let exit_code = self
            .exec_attached(
                id,
                argv,
                env,
                ExecStdin::Closed,
                &mut sink,
                &AtomicBool::new(false),
                None,
            )
            .await?;
        Ok(Collected {
            stdout: sink.stdout,
            stderr: sink.stderr,
            exit_code,
        })
    }

    /// Creates and starts one attached exec; `start_requested` is set once the start may have
    /// run anything in the guest.
    async fn create_and_start(
        &self,
        id: &str,
        options: CreateExecOptions<String>,
        start_requested: &AtomicBool,
    ) -> Result<(String, StartExecResults), ApiFailure> {
        let api = self.engine.api();
        let created = api.create_exec(id, options).await?;
        start_requested.store(true, Ordering::Relaxed);
        let start = StartExecOptions {
            detach: false,
            tty: false,
            output_capacity: None,
        };
        let started = api.start_exec(&created.id, Some(start)).await?;
        Ok((created.id, started))
    }

    /// Runs `argv` attached in container `id`: `stdin` written to the exec's input (its shutdown
    /// is the command's end of file), each output frame handed to `sink` as it arrives. The
    /// input is read only as fast as the command takes it, and the output only as fast as the
    /// sink takes it, so neither is held whole. A command that exits without reading its stdin
    /// ends the call; the rest of the input is never read. The caller bounds the time.
    /// `answered` fires once the engine answered the start (the guest process is being made); it
    /// is dropped unfired when the exec never starts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn exec_attached(
        &self,
        id: &str,
        argv: Vec<String>,
        env: Vec<String>,
        stdin: ExecStdin,
        sink: &mut impl OutputSink,
        start_requested: &AtomicBool,
        answered: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<i32, ExecFailure> {
        let api = self.engine.api();
        let attach_stdin = !matches!(stdin, ExecStdin::Closed);
        let options = CreateExecOptions::<String> {
            cmd: Some(argv),
            env: (!env.is_empty()).then_some(env),
            attach_stdin: Some(attach_stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            working_dir: Some("/".to_owned()),
            ..CreateExecOptions::default()
        };
        let mut pauses_waited_out = 0;
        let (exec_id, started) = loop {
            let failure = match self
                .create_and_start(id, options.clone(), start_requested)
                .await
            {
                Ok(started) => break started,
                Err(failure) => failure,
            };
            // A pause someone else holds is waited out (a few, one after
            // another, at most): the command has not started, so it starts after the pause as if
            // it came later.
            if failure.is_conflict()
                && pauses_waited_out < PAUSES_WAITED_OUT
                && self
                    .containers
                    .wait_out_pause(id)
                    .await
                    .is_ok_and(starts_after_conflict)
            {
                pauses_waited_out += 1;
                continue;
            }
            return Err(ExecFailure::NotStarted(failure));
        };
        if let Some(answered) = answered {
            let _ = answered.send(());
        }
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(ExecFailure::Broken(ApiFailure::Status {
                code: 500,
                message: "the engine detached an attached exec".to_owned(),
            }));
        };
        let feed = async move {
            // A command that exits without reading its stdin closes the stream under us: the
            // write fails, which is not the call's failure.
            match stdin {
                ExecStdin::Closed => return,
                ExecStdin::Bytes(bytes) => {
                    let _ = input.write_all(&bytes).await;
                }
                ExecStdin::Reader(reader) => {
                    let mut reader = tokio::io::BufReader::with_capacity(STDIN_BUFFER, reader);
                    let _ = tokio::io::copy_buf(&mut reader, &mut input).await;
                }
            }
            let _ = input.shutdown().await;
        };
        tokio::pin!(feed);
        let mut fed = !attach_stdin;
        loop {
            let chunk = tokio::select! {
                item = output.next() => match item {
                    None => break,
                    Some(Ok(chunk)) => chunk,
                    Some(Err(error)) => return Err(ExecFailure::Broken(error.into())),
                },
                () = &mut feed, if !fed => {
                    fed = true;
                    continue;
                }
                () = sink.abandoned() => return Err(ExecFailure::Dropped),
            };
            let (stream, message) = match chunk {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    (Stream::Stdout, message)
                }
                LogOutput::StdErr { message } => (Stream::Stderr, message),
                LogOutput::StdIn { .. } => continue,
            };
            sink.accept(stream, &message)
                .await
                .map_err(|refused| match refused {
                    bounded_process::Error::Abandoned { .. } => ExecFailure::Dropped,
                    // The output cap; no other refusal comes from a sink.
                    _ => ExecFailure::OverBudget,
                })?;
        }
        let inspected = api
            .inspect_exec(&exec_id)
            .await
            .map_err(|e| ExecFailure::Broken(e.into()))?;
        inspected
            .exit_code
            .and_then(|code| i32::try_from(code).ok())
            .ok_or_else(|| {
                ExecFailure::Broken(ApiFailure::Status {
                    code: 500,
                    message: "the exec inspect reported no exit code".to_owned(),
                })
            })
    }

    /// Names an exec failure: an absent container is SandboxGone, a stopped or paused one says
    /// so, anything else is the engine's.
    pub(crate) fn exec_failure(
        &self,
        id: &str,
        operation: &str,
        failure: ExecFailure,
    ) -> SandboxError {
        let failure = match failure {
            ExecFailure::NotStarted(failure) | ExecFailure::Broken(failure) => failure,
            ExecFailure::OverBudget => {
                return SandboxError::engine(format!("{operation} wrote more than its budget"))
            }
            ExecFailure::Dropped => {
                return SandboxError::engine(format!("{operation}: its output was dropped"))
            }
        };
        if failure.is_not_found() {
            return SandboxError::SandboxGone {
                instance: id.to_owned(),
            };
        }
        let lower = failure.message().to_lowercase();
        if failure.is_conflict() && lower.contains("is not running") {
            return SandboxError::engine(format!(
                "the container was stopped; acquire again: {}",
                quote(failure.message().as_bytes())
            ));
        }
        if failure.is_conflict() && lower.contains("is paused") {
            return SandboxError::engine(format!(
                "the container stayed paused; acquire again (it lifts a pause nobody else does): {}",
                quote(failure.message().as_bytes())
            ));
        }
        self.engine.failure(operation, failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::PauseWait;

    #[test]
    fn a_conflict_starts_again_once_the_container_runs() {
        // The race CI met: the 409 came from a pause that ended before the wait looked.
        assert!(starts_after_conflict(PauseWait::NotPaused {
            running: true
        }));
        assert!(starts_after_conflict(PauseWait::Lifted));
        // Stopped, removed or still paused: the refusal stands.
        assert!(!starts_after_conflict(PauseWait::NotPaused {
            running: false
        }));
        assert!(!starts_after_conflict(PauseWait::Held));
    }
}
