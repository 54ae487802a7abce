//! The backend's calls into the guest through the exec wrapper: the tool probe, the one
//! preparing call of an acquire, and every command, streamed or collected. A task owns each call
//! and kills what an expired, over-budget or dropped command leaves; a kill that does not land
//! retires the container.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bounded_process::{ExitKind, OutputSink, Stream};
use exec_wrapper::encoding::{encode_invocation, raw_invocation};
use exec_wrapper::kill::{
    tree_kill_argv, KillFailure, KillOutcome, KillReport, KILL_OUTPUT_BUDGET,
};
use exec_wrapper::tool_probe::{
    read_tool_probe, tool_probe_argv, ToolProbeOutcome, DOCKER_TOOLS, PROBE_OUTPUT_BUDGET,
};
use exec_wrapper::wrapper::{
    docker_init_wrapper_argv, docker_wrapper_argv, exec_init_argv, init_status_argv,
    recorded_status, DOCKER_INIT_PATH, EXEC_INIT_PATH, RECORDED_STATUS, SIGNAL_STATUSES,
};
use exec_wrapper::{new_nonce, Nonce, WrapperOutcome};
use futures_util::StreamExt as _;
use sandbox_core::backend_kit::ExecStreamSender;
use sandbox_core::{ExecEnv, ExecExit, ExecStdin, ExecStream, GuestCleanup, SandboxError};
use tokio::io::AsyncWriteExt as _;
use wrapper_stream::{guest_cleanup, GuestEnd, WrapperStreamSink};

use crate::config::DockerConfig;
use crate::connection::{quote, EngineConnection};
use crate::containers::Containers;
use crate::exec::{CollectSink, Collected, ExecFailure, Execs};
use crate::guest_scripts::{
    parse_prepare, PREPARE_EXIT_FALLBACK, PREPARE_EXIT_NO_IDS, PREPARE_EXIT_UNWRITABLE,
    PREPARE_SCRIPT,
};
use crate::memory::{CallInit, Memories};
use crate::ownership_labels::ContainerRecord;
use crate::retirement::Retirement;
use crate::sizing::Sizing;

/// One command through the exec wrapper.
pub(crate) struct GuestCall<'a> {
    pub(crate) cwd: &'a str,
    pub(crate) argv: Vec<Vec<u8>>,
    pub(crate) env: Option<&'a ExecEnv>,
    pub(crate) stdin: ExecStdin,
    /// The total of the command's stdout and stderr (`None`: a stream without a total).
    pub(crate) budget: Option<u64>,
    pub(crate) timeout: Duration,
}

impl<'a> GuestCall<'a> {
    /// A backend-internal command: cwd as given, no env, no stdin.
    pub(crate) fn internal<A: AsRef<[u8]>>(
        cwd: &'a str,
        argv: &[A],
        budget: u64,
        timeout: Duration,
    ) -> Self {
        GuestCall {
            cwd,
            argv: argv.iter().map(|a| a.as_ref().to_vec()).collect(),
            env: None,
            stdin: ExecStdin::Closed,
            budget: Some(budget),
            timeout,
        }
    }
}

/// [`GuestCalls::prepare_guest`]'s sink: collects like [`CollectSink`], and hands the stdout
/// so far to the host once the script asks for the engine-side fallback.
struct PrepareSink {
    collected: CollectSink,
    asked: Option<tokio::sync::oneshot::Sender<Vec<u8>>>,
}

impl OutputSink for PrepareSink {
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> Result<(), bounded_process::Error> {
        self.collected.accept(stream, bytes).await?;
        let stdout = &self.collected.stdout;
        if stream == Stream::Stdout
            && self.asked.is_some()
            && stdout
                .split(|b| *b == b'\n')
                .rev()
                .skip(1)
                .any(|line| line == b"fallback")
        {
            if let Some(asked) = self.asked.take() {
                let _ = asked.send(stdout.clone());
            }
        }
        Ok(())
    }
}

/// Whether a tool the wrapper needs is among the missing (neither init is: they choose the shape).
fn needs_missing_tool(missing: &[String]) -> bool {
    missing.iter().any(|tool| !is_optional_init(tool))
}

/// What a tool probe asks for: the wrapper's tools, then the two inits a call may run under.
fn probed_tools() -> impl Iterator<Item = &'static str> {
    DOCKER_TOOLS
        .iter()
        .copied()
        .chain([DOCKER_INIT_PATH, EXEC_INIT_PATH])
}

/// The two inits a call may run under; an image may lack either (see `judge_tools`).
fn is_optional_init(tool: &str) -> bool {
    tool == DOCKER_INIT_PATH || tool == EXEC_INIT_PATH
}

/// Output budget of backend-internal commands whose answer is a line or two.
pub(crate) const SMALL_BUDGET: usize = 64 * 1024;

/// Statuses above this are "killed by signal N" (128 + N), and are also what a command reads as
/// when its container is removed or stopped under it.
const SIGNAL_STATUS_FLOOR: i32 = 128;

/// 128 + SIGKILL: what a command killed by the kernel's OOM killer, or by its container's
/// removal, reports.
const SIGKILL_STATUS: i32 = 137;

/// Statuses an exec ends with when its container died under it rather than the command ending:
/// 137 when the container was killed, 128 when gVisor's kernel died (the host's OOM killer or the
/// pids limit) and `runsc` could no longer wait on the process. A command may exit with either
/// itself, so neither is judged from the status alone.
const CONTAINER_DEATH_STATUSES: [i32; 2] = [128, SIGKILL_STATUS];

/// How long the engine may take to record a container as stopped once it no longer answers an
/// exec, and how often it is read in that time.
const CONTAINER_DEATH_DEADLINE: Duration = Duration::from_secs(10);
const CONTAINER_DEATH_POLL: Duration = Duration::from_millis(100);

/// How often a running command's container is read, to end the call when the container ended
/// under it (the exec itself may not end then).
const DEATH_WATCH: Duration = Duration::from_secs(2);

/// The container states in which a command may still be running.
const ALIVE_STATES: [&str; 3] = ["running", "paused", "restarting"];

/// How a watched exec ended.
enum Watched<T> {
    /// On its own.
    Ended(T),
    /// Its container ended first: gone (`None`) or in this state.
    ContainerEnded(Option<String>),
}

/// Commands in the backend's containers through the exec wrapper.
#[derive(Debug)]
pub(crate) struct GuestCalls {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    execs: Arc<Execs>,
    containers: Arc<Containers>,
    retirement: Arc<Retirement>,
    /// The memory limit a command killed for it is told.
    sizing: Arc<Sizing>,
    memory: Arc<Memories>,
}

impl GuestCalls {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        execs: Arc<Execs>,
        containers: Arc<Containers>,
        retirement: Arc<Retirement>,
        sizing: Arc<Sizing>,
        memory: Arc<Memories>,
    ) -> Self {
        GuestCalls {
            containers,
            engine,
            config,
            execs,
            retirement,
            sizing,
            memory,
        }
    }

    /// The tool probe, once per id; a pass is cached, a refusal is not. The same call asks for
    /// the image's exec init ([`EXEC_INIT_PATH`]) and the engine's init ([`DOCKER_INIT_PATH`]):
    /// where either is, every call runs under it as a subreaper (the exec init first: it is the
    /// wrapper itself, two program starts fewer) and a timeout kills the call's whole process
    /// tree; where neither is, the group shape, and a timeout kills the command's process group
    /// only.
    pub(crate) async fn probe_tools(&self, id: &str, image: &str) -> Result<(), SandboxError> {
        if self.memory.probes.is_probed(id) {
            return Ok(());
        }
        let tools: Vec<&str> = probed_tools().collect();
        let argv = tool_probe_argv(&tools).map_err(|e| SandboxError::invalid(e.to_string()))?;
        let deadline = self.config.command_timeout;
        let probe = self
            .execs
            .exec_collect(id, argv, Vec::new(), PROBE_OUTPUT_BUDGET as u64);
        let collected = match tokio::time::timeout(deadline, probe).await {
            Ok(Ok(collected)) => collected,
            Ok(Err(failure)) => return Err(self.execs.exec_failure(id, "tool probe", failure)),
            Err(_) => {
                return Err(SandboxError::EngineTimeout {
                    operation: "tool probe".to_owned(),
                    bound: deadline,
                })
            }
        };
        match read_tool_probe(ExitKind::Exited(collected.exit_code), &collected.stdout) {
            ToolProbeOutcome::AllPresent => self.judge_tools(id, image, Vec::new()),
            ToolProbeOutcome::Missing(missing) => self.judge_tools(id, image, missing),
            ToolProbeOutcome::NoShell => Err(missing_tools(image, "sh")),
            ToolProbeOutcome::Failed { status } => Err(SandboxError::engine(format!(
                "the tool probe failed before it could answer ({status:?}): {}",
                quote(&collected.stderr)
            ))),
        }
    }

    /// The tool probe's verdict on the tools `command -v` did not find: any the wrapper needs is
    /// CapabilityNotSupported naming them all; the inits only choose the shape (the exec init,
    /// else the engine's init, else the group shape). A pass is cached for `id`, with the
    /// init's subreaper when there is one.
    fn judge_tools(
        &self,
        id: &str,
        image: &str,
        mut missing: Vec<String>,
    ) -> Result<(), SandboxError> {
        let init_missing = missing.iter().any(|tool| tool == DOCKER_INIT_PATH);
        let exec_init_missing = missing.iter().any(|tool| tool == EXEC_INIT_PATH);
        if needs_missing_tool(&missing) {
            missing.retain(|tool| !is_optional_init(tool));
            return Err(missing_tools(image, &missing.join(", ")));
        }
        if !exec_init_missing {
            self.memory.probes.mark_exec_init(id);
        } else if init_missing {
            tracing::warn!(
                container = %id,
                "no engine init at {DOCKER_INIT_PATH}: a timeout kills the command's process group only"
            );
        } else {
            self.memory.probes.mark_subreaper(id);
        }
        self.memory.probes.mark_probed(id);
        Ok(())
    }

    /// The one guest call of an acquire ([`PREPARE_SCRIPT`]): the tool probe, unless this
    /// process probed `id` already, and with `base` its preparation. `host_first` chooses who
    /// makes the base: the guest (`mkdir -p`; when it cannot, it asks the host), or the host
    /// (the guest asks right after printing its ids, and never creates anything itself). `early`
    /// starts with the call, handed a signal that fires once the engine answered the exec's start
    /// (dropped unfired when it never starts); once the guest asks, `then` runs with what `early`
    /// gave and the guest's ids while the call waits, and the guest checks it can write what the
    /// host made. A missing tool is refused as the probe refuses it, before anything the base
    /// step said, and `then` never runs for it; the guest user's ids are remembered for `id`. The
    /// guest's part is bounded by the command timeout (its clock stopped while `then` runs), the
    /// host's by its own requests' deadlines.
    pub(crate) async fn prepare_guest<E, Early, Then, Fut>(
        &self,
        id: &str,
        image: &str,
        base: Option<&str>,
        host_first: bool,
        early: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> Early,
        then: Then,
    ) -> Result<(), SandboxError>
    where
        Early: std::future::Future<Output = Result<E, SandboxError>>,
        Then: FnOnce(E, (u64, u64)) -> Fut,
        Fut: std::future::Future<Output = Result<(), SandboxError>>,
    {
        let probe = !self.memory.probes.is_probed(id);
        if !probe && base.is_none() {
            return Ok(());
        }
        let mut argv: Vec<String> = [
            "sh",
            "-c",
            PREPARE_SCRIPT,
            "maf-prepare",
            base.unwrap_or(""),
            if host_first { "host" } else { "guest" },
        ]
        .map(str::to_owned)
        .to_vec();
        if probe {
            argv.extend(probed_tools().map(str::to_owned));
        }
        let (asked, asking) = tokio::sync::oneshot::channel();
        let (answered, started) = tokio::sync::oneshot::channel();
        let (mut answer, answer_reader) = tokio::io::duplex(64);
        let stdin = match base {
            Some(_) => ExecStdin::reader(answer_reader),
            None => ExecStdin::Closed,
        };
        let deadline = self.config.command_timeout;
        let (guest_deadline, mut guest_deadline_seen) =
            tokio::sync::watch::channel(Some(tokio::time::Instant::now() + deadline));
        let guest = async {
            let mut sink = PrepareSink {
                collected: CollectSink {
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    budget: PROBE_OUTPUT_BUDGET as u64,
                },
                asked: Some(asked),
            };
            let ran = self
                .execs
                .exec_attached(
                    id,
                    argv,
                    Vec::new(),
                    stdin,
                    &mut sink,
                    &AtomicBool::new(false),
                    Some(answered),
                )
                .await;
            // Nothing more will ask: the host's side stops waiting.
            drop(sink.asked.take());
            ran.map(|exit_code| Collected {
                stdout: sink.collected.stdout,
                stderr: sink.collected.stderr,
                exit_code,
            })
        };
        let host = async {
            let ids = async {
                let so_far = asking.await.ok()?;
                match parse_prepare(&so_far) {
                    Ok(so_far) if !needs_missing_tool(&so_far.missing) => so_far.ids,
                    // The guest's full answer names the refusal.
                    _ => None,
                }
            };
            let (early, ids) = tokio::join!(early(started), ids);
            let ids = ids?;
            // The guest waits while the host works: its clock stops meanwhile.
            let _ = guest_deadline.send(None);
            let made = match early {
                Ok(early) => then(early, ids).await,
                Err(error) => Err(error),
            };
            if made.is_ok() {
                let _ = answer.write_all(b"go\n").await;
            }
            drop(answer);
            let _ = guest_deadline.send(Some(tokio::time::Instant::now() + deadline));
            Some(made)
        };
        let joined = async { tokio::join!(guest, host) };
        tokio::pin!(joined);
        let (ran, made) = loop {
            let until = *guest_deadline_seen.borrow_and_update();
            let expired = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                both = &mut joined => break both,
                _ = guest_deadline_seen.changed() => {}
                () = expired => {
                    return Err(SandboxError::EngineTimeout {
                        operation: "tool probe".to_owned(),
                        bound: deadline,
                    })
                }
            }
        };
        let collected =
            ran.map_err(|failure| self.execs.exec_failure(id, "tool probe", failure))?;
        let code = collected.exit_code;
        // No `sh` at all: the engine's 126 or 127, and nothing printed.
        if matches!(code, 126 | 127) && collected.stdout.is_empty() {
            return Err(missing_tools(image, "sh"));
        }
        let failed = |what: &str| {
            SandboxError::engine(format!(
                "{what} (exit {code}): {}",
                quote(&collected.stderr)
            ))
        };
        let answer = parse_prepare(&collected.stdout).map_err(|reason| {
            failed(&format!(
                "the tool probe answered what it never prints: {reason}"
            ))
        })?;
        if probe {
            self.judge_tools(id, image, answer.missing)?;
        }
        if let Some(ids) = answer.ids {
            self.memory.guest_ids.remember(id, ids);
        }
        // The host's own failure in the fallback is the answer, not the guest's exit after it.
        made.transpose()?;
        let Some(base) = base else {
            return match code {
                0 => Ok(()),
                _ => Err(failed("the tool probe failed before it could answer")),
            };
        };
        match code {
            0 => Ok(()),
            PREPARE_EXIT_UNWRITABLE => Err(SandboxError::engine(format!(
                "the storage base {base} is not writable by the guest"
            ))),
            PREPARE_EXIT_FALLBACK | PREPARE_EXIT_NO_IDS => Err(failed(&format!(
                "the guest cannot create the storage base {base}, and the host could not either"
            ))),
            _ => Err(failed(&format!(
                "preparing the storage base {base} as the guest failed"
            ))),
        }
    }

    /// After a wrapper call failed before its nonce in a container this process has not probed
    /// (one `find` returned): probes its tools now, so a missing one is refused by name
    /// (CapabilityNotSupported) rather than read as an engine failure. Ok when none is missing.
    async fn name_missing_tools(&self, id: &str) -> Result<(), SandboxError> {
        if self.memory.probes.is_probed(id) {
            return Ok(());
        }
        let image = self
            .containers
            .inspect(id)
            .await?
            .and_then(|record| record.image().map(str::to_owned))
            .unwrap_or_else(|| "(unknown)".to_owned());
        self.probe_tools(id, &image).await
    }

    /// Runs one command through the exec wrapper and collects its output (the collector over
    /// [`Self::stream_guest`]).
    ///
    /// # Cancel safety
    /// Dropping the future drops the stream: the command is killed as on its deadline, in the
    /// producer's task.
    pub(crate) async fn run_guest(
        self: &Arc<Self>,
        id: &str,
        call: GuestCall<'_>,
    ) -> Result<GuestEnd, SandboxError> {
        GuestEnd::collect(self.stream_guest(id, call)?).await
    }

    /// A backend-internal command through the wrapper, cwd `/`, under the command timeout.
    pub(crate) async fn guest_internal(
        self: &Arc<Self>,
        id: &str,
        argv: &[&str],
    ) -> Result<sandbox_core::ExecOutput, SandboxError> {
        let call = GuestCall::internal("/", argv, SMALL_BUDGET as u64, self.config.command_timeout);
        match self.run_guest(id, call).await? {
            GuestEnd::Ran(output) => Ok(output),
            GuestEnd::Expired(_) => Err(SandboxError::EngineTimeout {
                operation: format!("guest {}", argv.first().copied().unwrap_or("command")),
                bound: self.config.command_timeout,
            }),
            GuestEnd::Overflowed => Err(SandboxError::engine(format!(
                "guest {} wrote more than {SMALL_BUDGET} bytes",
                argv.first().copied().unwrap_or("command")
            ))),
        }
    }

    /// Starts one command through the exec wrapper; its output streams as it arrives.
    ///
    /// A task owns the call: on an expired deadline, output over the call's budget, or a dropped
    /// stream it kills the command's processes by a second exec; the container is kept when the
    /// kill lands and retired when it does not. The stream's last item is the exit, or the error
    /// the collected exec would return.
    pub(crate) fn stream_guest(
        self: &Arc<Self>,
        id: &str,
        call: GuestCall<'_>,
    ) -> Result<ExecStream, SandboxError> {
        self.memory.retired.refuse(id)?;
        let nonce = new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
        // Under an init the argv travels raw (the API carries JSON strings exactly); only
        // values that are not UTF-8 are encoded.
        let argv = if let Some(init) = self.memory.probes.call_init(id) {
            let invocation = raw_invocation(call.cwd.as_bytes(), &call.argv)
                .map_err(|e| SandboxError::invalid(e.to_string()))?;
            match init {
                CallInit::ExecInit => exec_init_argv(&nonce, &invocation),
                CallInit::EngineInit => docker_init_wrapper_argv(&nonce, &invocation),
            }
        } else {
            let invocation = encode_invocation(call.cwd.as_bytes(), &call.argv)
                .map_err(|e| SandboxError::invalid(e.to_string()))?;
            docker_wrapper_argv(&nonce, &invocation)
        };
        let env = match call.env {
            Some(env) => guest_env(env)?,
            None => Vec::new(),
        };
        let (sender, stream) = ExecStream::channel(call.budget);
        let produce = Arc::clone(self).produce(
            id.to_owned(),
            argv,
            env,
            call.stdin,
            call.timeout,
            nonce,
            sender,
        );
        tokio::spawn(produce);
        Ok(stream)
    }

    /// The task behind a stream: runs the wrapper call under its deadline, kills what must be
    /// killed, and ends the stream with the exit or the error.
    #[allow(clippy::too_many_arguments)]
    async fn produce(
        self: Arc<Self>,
        id: String,
        argv: Vec<String>,
        env: Vec<String>,
        stdin: ExecStdin,
        timeout: Duration,
        nonce: Nonce,
        sender: ExecStreamSender,
    ) {
        let limit = sender.cap();
        let mut sink = WrapperStreamSink::new(sender, &nonce, "docker");
        let started_seen = sink.started_flag();
        let started = std::time::SystemTime::now();
        let start_requested = AtomicBool::new(false);
        let exec =
            self.execs
                .exec_attached(&id, argv, env, stdin, &mut sink, &start_requested, None);
        let watched = tokio::time::timeout(timeout, self.watching_container(&id, exec)).await;
        let (sender, splitter) = sink.into_parts();
        let ran = match watched {
            Ok(Watched::Ended(ran)) => Ok(ran),
            Ok(Watched::ContainerEnded(state)) => {
                tracing::warn!(container = %id, ?state, "the container ended while a command ran");
                let error = match state {
                    None => SandboxError::SandboxGone {
                        instance: id.clone(),
                    },
                    Some(state) => SandboxError::engine(format!(
                        "container {id} stopped ({state}) while the command ran; the command \
                         ended with it"
                    )),
                };
                sender.finish(Err(error)).await;
                return;
            }
            Err(elapsed) => Err(elapsed),
        };
        let outcome = match ran {
            // The deadline passed before the engine was asked to start anything (the exec
            // waited out a pause): there is nothing to kill.
            Err(_) if !start_requested.load(Ordering::Relaxed) => Err(SandboxError::Timeout {
                operation: "command".to_owned(),
                bound: timeout,
                cleanup: Some(GuestCleanup::NeverStarted),
            }),
            Err(_) => Err(SandboxError::Timeout {
                operation: "command".to_owned(),
                bound: timeout,
                cleanup: Some(self.clone().kill_call(id, nonce, started_seen).await),
            }),
            Ok(Err(ExecFailure::OverBudget)) => {
                let cleanup = self
                    .clone()
                    .kill_call(id.clone(), nonce, started_seen)
                    .await;
                let limit = limit.unwrap_or_default();
                tracing::info!(container = %id, %cleanup, limit, "command output exceeded its budget");
                Err(SandboxError::OutputLimitExceeded { limit })
            }
            Ok(Err(ExecFailure::Dropped)) => {
                let cleanup = self
                    .clone()
                    .kill_call(id.clone(), nonce, started_seen)
                    .await;
                tracing::debug!(container = %id, %cleanup, "the stream was dropped; its command was killed");
                return;
            }
            Ok(Err(failure @ ExecFailure::Broken(_))) => {
                // The stream is gone but the command may not be: kill it all the same.
                let _ = self
                    .clone()
                    .kill_call(id.clone(), nonce, started_seen)
                    .await;
                Err(self.execs.exec_failure(&id, "exec", failure))
            }
            Ok(Err(failure)) => Err(self.execs.exec_failure(&id, "exec", failure)),
            Ok(Ok(exit_code)) => {
                let end = splitter.finish(ExitKind::Exited(exit_code));
                self.exit_of(&id, &nonce, end, started).await
            }
        };
        sender.finish(outcome).await;
    }

    /// Runs `exec` while reading its container's state every [`DEATH_WATCH`]: an exec whose
    /// container ended may never end itself (under gVisor, `runsc` can go on waiting for a
    /// process of a kernel that is gone), so the container's end ends the wait. A failed read
    /// is not the command's end: the wait goes on.
    async fn watching_container<T>(
        &self,
        id: &str,
        exec: impl std::future::Future<Output = T>,
    ) -> Watched<T> {
        tokio::pin!(exec);
        let first = tokio::time::Instant::now() + DEATH_WATCH;
        let mut tick = tokio::time::interval_at(first, DEATH_WATCH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ended = &mut exec => return Watched::Ended(ended),
                _ = tick.tick() => match self.containers.inspect(id).await {
                    Ok(None) => return Watched::ContainerEnded(None),
                    Ok(Some(record)) if !ALIVE_STATES.contains(&record.status()) => {
                        return Watched::ContainerEnded(Some(record.status().to_owned()));
                    }
                    Ok(Some(_)) | Err(_) => {}
                },
            }
        }
    }

    /// What a wrapper call that ended reports: the command's exit, or the engine's failure.
    async fn exit_of(
        &self,
        id: &str,
        nonce: &Nonce,
        outcome: WrapperOutcome,
        started: std::time::SystemTime,
    ) -> Result<ExecExit, SandboxError> {
        match outcome {
            WrapperOutcome::Ran(ran) => {
                let init_shape = self.memory.probes.call_init(id).is_some();
                let status = if init_shape && ran.status == RECORDED_STATUS {
                    self.recorded_status(id, nonce).await?
                } else {
                    ran.status
                };
                if status >= SIGNAL_STATUS_FLOOR {
                    self.refuse_if_container_died(id, status, started).await?;
                    if init_shape && SIGNAL_STATUSES.contains(&ran.status) {
                        return Err(self.retire_for_killed_init(id, status).await);
                    }
                }
                Ok(ExecExit::exited(status))
            }
            WrapperOutcome::NoWorkingDirectory { reason } => Ok(ExecExit::workdir_unusable(reason)),
            WrapperOutcome::NoNonce {
                status,
                stderr_tail,
            } => {
                self.name_missing_tools(id).await?;
                Err(SandboxError::engine(format!(
                    "the exec wrapper failed before the command started (exit {status}): {}",
                    quote(&stderr_tail)
                )))
            }
            WrapperOutcome::ClientKilled { signal, .. } => Err(SandboxError::engine(format!(
                "the exec ended by signal {signal} before its result"
            ))),
            WrapperOutcome::Unmounted => Err(SandboxError::engine(
                "the wrapper reported an unmounted workspace, which docker never has",
            )),
        }
    }

    /// The kill call and what follows it: keep, or retire. One kill script serves both shapes:
    /// it kills the call's subreaper tree when the call runs under the engine's init, and the
    /// recorded process group otherwise. Finding nothing after the nonce line arrived means the
    /// command removed or escaped what names it: retired, never "never started".
    async fn kill_call(
        self: Arc<Self>,
        id: String,
        nonce: Nonce,
        started_seen: Arc<AtomicBool>,
    ) -> GuestCleanup {
        let kill = self.execs.exec_collect(
            &id,
            tree_kill_argv(&nonce),
            Vec::new(),
            KILL_OUTPUT_BUDGET as u64,
        );
        let report = match tokio::time::timeout(self.config.exec_cleanup_timeout, kill).await {
            Ok(Ok(collected)) => KillReport::from_exit(collected.exit_code),
            Ok(Err(_)) | Err(_) => KillReport {
                outcome: KillOutcome::NotLanded(KillFailure::CallFailed),
                mode: None,
            },
        }
        .after_start(started_seen.load(Ordering::Relaxed));
        let cleanup = guest_cleanup(report.outcome);
        if cleanup == GuestCleanup::Retired {
            tracing::warn!(container = %id, outcome = ?report.outcome, "the kill did not land; retiring the sandbox");
            self.retirement.retire(&id).await;
        } else {
            tracing::debug!(container = %id, mode = ?report.mode, %cleanup, "the kill ended the call");
        }
        cleanup
    }

    /// Under an init shape, the wrapper exits [`RECORDED_STATUS`] both for a command that
    /// exited 255 and for one whose status was signal-shaped (then recorded): the record, read
    /// and removed by a second exec, tells which
    /// (docs/wrapper-protocol.md#docker-the-engines-init-as-the-calls-subreaper). A check that
    /// fails is an engine error: the command ended, but its status is not known.
    async fn recorded_status(&self, id: &str, nonce: &Nonce) -> Result<i32, SandboxError> {
        let check = self.execs.exec_collect(
            id,
            init_status_argv(nonce),
            Vec::new(),
            KILL_OUTPUT_BUDGET as u64,
        );
        let read = match tokio::time::timeout(self.config.exec_cleanup_timeout, check).await {
            Ok(Ok(collected)) => {
                recorded_status(ExitKind::Exited(collected.exit_code), &collected.stdout)
            }
            Ok(Err(_)) | Err(_) => None,
        };
        read.ok_or_else(|| {
            SandboxError::engine(format!(
                "the command in {id} ended, but the record of its status could not be read"
            ))
        })
    }

    /// An init-shape exec that ends with a signal-shaped status ended because its init or
    /// wrapper was killed (no wrapper exits with one): the command and whatever it started may
    /// still run outside any call, whatever it wrote where the wrapper keeps its record. That
    /// is never an exit code: the sandbox is retired (its removal ends every process) and the
    /// call fails as retired, which trying again does not mend.
    async fn retire_for_killed_init(&self, id: &str, status: i32) -> SandboxError {
        tracing::warn!(container = %id, status, "a command killed its call's init or wrapper; retiring the sandbox");
        self.retirement.retire(id).await;
        // Retired, not an engine failure: the command did it, and running it again would only
        // do it again.
        SandboxError::Retired {
            instance: id.to_owned(),
            reason: format!(
                "the command killed the process that runs it (the call's init or wrapper): \
                 status {status} is not the command's, and the sandbox was retired to end what it \
                 left running"
            ),
        }
    }

    /// Whether the engine recorded an OOM kill in container `id` since `started` (its `oom`
    /// events; an engine's `State.OOMKilled` is only set when the container itself exits).
    async fn oom_since(
        &self,
        id: &str,
        started: std::time::SystemTime,
    ) -> Result<bool, SandboxError> {
        let since = started
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let until = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            + 1;
        let options = bollard::query_parameters::EventsOptions {
            since: Some(since.as_secs().to_string()),
            until: Some(until.to_string()),
            filters: Some(std::collections::HashMap::from([
                ("container".to_owned(), vec![id.to_owned()]),
                ("event".to_owned(), vec!["oom".to_owned()]),
            ])),
        };
        let events = async {
            let mut stream = self.engine.api().events(Some(options));
            let mut seen = false;
            while let Some(event) = stream.next().await {
                let event = event?;
                let at = event.time_nano.unwrap_or(i64::MAX);
                seen |= i128::from(at) >= since.as_nanos() as i128;
            }
            Ok(seen)
        };
        self.engine
            .call(self.config.command_timeout, events)
            .await
            .map_err(|f| self.engine.failure("engine events (oom)", f))
    }

    /// A signal-shaped status may be the container's death, or the kernel's OOM kill, rather than
    /// the command's own: the container's state tells them apart, so neither reads as a bare exit
    /// code. The exec sees a death before the engine records it, so a container the engine still
    /// calls running is asked to run a command: one that no longer answers is dead, and its
    /// record is read again until the engine says so.
    async fn refuse_if_container_died(
        &self,
        id: &str,
        status: i32,
        started: std::time::SystemTime,
    ) -> Result<(), SandboxError> {
        let mut record = self.containers.inspect(id).await?;
        if CONTAINER_DEATH_STATUSES.contains(&status)
            && record.as_ref().is_some_and(|r| r.status() == "running")
            && !self.answers(id).await
        {
            record = self.recorded_death(id, status).await?;
        }
        match record {
            None => Err(SandboxError::SandboxGone {
                instance: id.to_owned(),
            }),
            Some(record) if record.status() != "running" => Err(SandboxError::engine(format!(
                "container {id} stopped ({}) while the command ran; its status {status} is not the command's",
                record.status()
            ))),
            Some(_) if status == SIGKILL_STATUS && self.oom_since(id, started).await? => {
                Err(SandboxError::engine(format!(
                    "the command was killed for exceeding the sandbox's memory limit of {} MiB \
                     (the kernel's OOM killer; the engine reports OOMKilled)",
                    self.sizing.resources().await.memory_bytes / (1024 * 1024)
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Whether container `id` still runs a command: a bare exec of `sh -c 'exit 0'`, bounded by
    /// the cleanup deadline. Any failure is a no.
    async fn answers(&self, id: &str) -> bool {
        let probe = self.execs.exec_collect(
            id,
            vec!["sh".to_owned(), "-c".to_owned(), "exit 0".to_owned()],
            Vec::new(),
            KILL_OUTPUT_BUDGET as u64,
        );
        matches!(
            tokio::time::timeout(self.config.exec_cleanup_timeout, probe).await,
            Ok(Ok(collected)) if collected.exit_code == 0
        )
    }

    /// The record of a container that stopped answering, once the engine shows it stopped or
    /// gone. One the engine still calls running after [`CONTAINER_DEATH_DEADLINE`] is retired
    /// (removed): a sandbox that runs no command serves no call.
    async fn recorded_death(
        &self,
        id: &str,
        status: i32,
    ) -> Result<Option<ContainerRecord>, SandboxError> {
        let deadline = tokio::time::Instant::now() + CONTAINER_DEATH_DEADLINE;
        loop {
            tokio::time::sleep(CONTAINER_DEATH_POLL).await;
            let record = self.containers.inspect(id).await?;
            if record.as_ref().is_none_or(|r| r.status() != "running") {
                return Ok(record);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(container = %id, status, "a container that no longer answers execs is still recorded as running; retiring it");
                self.retirement.retire(id).await;
                return Err(SandboxError::Retired {
                    instance: id.to_owned(),
                    reason: format!(
                        "the container stopped running commands while the command ran: status \
                         {status} is not the command's, and the sandbox was retired"
                    ),
                });
            }
        }
    }
}

#[cold]
fn missing_tools(image: &str, tools: &str) -> SandboxError {
    SandboxError::CapabilityNotSupported(format!(
        "image {image} lacks {tools}; the exec wrapper needs them"
    ))
}

/// The exec request's `Env` entries, `NAME=VALUE`, after the core's checks. The request is JSON,
/// so a value must be UTF-8; every refusal names the variable, never its value.
pub(crate) fn guest_env(env: &ExecEnv) -> Result<Vec<String>, SandboxError> {
    env.validate()?;
    env.entries()
        .iter()
        .map(|(name, value)| match std::str::from_utf8(value) {
            Ok(text) => Ok(format!("{name}={text}")),
            Err(_) => Err(SandboxError::invalid(format!(
                "environment variable {name} is refused: its value is not valid UTF-8, which the \
                 engine's exec request cannot carry"
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn guest_env_entries_and_refusals() {
        let env = ExecEnv::default()
            .set("A", "1 2 ")
            .set("B", "")
            .set("C", "x\ny");
        assert_eq!(guest_env(&env).unwrap(), ["A=1 2 ", "B=", "C=x\ny"]);
        for env in [
            ExecEnv::default().set("A", b"\xffhunter2".as_slice()),
            ExecEnv::default().set("GITHUB_TOKEN", "hunter2"),
        ] {
            let error = guest_env(&env).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
            assert!(!error.to_string().contains("hunter2"), "{error}");
            let name = &env.entries()[0].0;
            assert!(error.to_string().contains(name.as_str()), "{error}");
        }
    }
}
