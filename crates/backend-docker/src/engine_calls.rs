//! The engine calls every method shares: inspect, remove, the engine-side stat, the tool probe,
//! and commands through the exec wrapper with the kill that follows an expired one.

use std::collections::{HashMap, HashSet};
use std::future::{poll_fn, Future};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use exec_wrapper::{
    docker_wrapper_argv, encode_invocation, kill_argv, new_nonce, parse_run_output, pid_file,
    read_tool_probe, tool_probe_argv, ExitKind, KillOutcome, ToolProbeOutcome, WrapperOutcome,
    DOCKER_TOOLS, KILL_OUTPUT_BUDGET, PROBE_OUTPUT_BUDGET,
};
use sandbox_core::{
    BackendDeclarations, DisposalCode, DisposalFailure, EntryKind, ExecEnv, ExecOutput,
    GuestCleanup, SandboxError, SandboxKey,
};

use crate::cli_seam::{
    daemon_unreachable, object_absent, path_absent, status_text, tail, CallShape, DockerCli,
    SMALL_BUDGET,
};
use crate::config::DockerConfig;
use crate::ownership_labels::ContainerRecord;
use crate::tar_header::{first_entry, FirstEntry, TarStat, MAX_PREFIX};

/// The stdout prefix the engine-side stat asks for first: one header plus room for a short PAX
/// header. Longer metadata triggers one more call with [`MAX_PREFIX`].
const FIRST_STAT_PREFIX: usize = 2048;

/// The longest `NAME=VALUE` line the docker client's env-file reader carries verbatim.
const MAX_ENV_LINE: usize = 65_535;

/// What the process remembers about a container it verified (docker.md rule 20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmEntry {
    pub(crate) base: String,
    pub(crate) policy: String,
    pub(crate) base_ready: bool,
}

/// A container this process made or adopted, for disposal when a listing fails (rule 37).
#[derive(Debug, Clone)]
pub(crate) struct Remembered {
    pub(crate) key: SandboxKey,
    pub(crate) kind: String,
    pub(crate) id: String,
}

#[derive(Debug, Default)]
struct ProcessMemory {
    /// Retired ids (rule 24), with the name they had when known.
    retired: HashMap<String, Option<String>>,
    /// Retired ids whose removal failed: the next acquire removes them first.
    unremovable: HashSet<String>,
    /// Ids whose tool probe passed.
    probed: HashSet<String>,
    /// Ids verified for a warm acquire.
    warm: HashMap<String, WarmEntry>,
    /// Name → what this process made or adopted under it.
    remembered: HashMap<String, Remembered>,
}

/// State shared by the backend and every handle it gave out.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: DockerConfig,
    pub(crate) cli: DockerCli,
    pub(crate) declarations: BackendDeclarations,
    name_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    memory: Mutex<ProcessMemory>,
}

/// How a `docker rm -f` ended (docker.md rule 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The engine echoed the id: it was removed by this call.
    Removed,
    /// It was not there.
    Absent,
}

/// One command through the exec wrapper.
pub(crate) struct GuestCall<'a> {
    pub(crate) cwd: &'a str,
    pub(crate) argv: Vec<Vec<u8>>,
    pub(crate) env: Option<&'a ExecEnv>,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) budget: u64,
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
            stdin: None,
            budget,
            timeout,
        }
    }
}

/// How a wrapper call ended.
#[derive(Debug)]
pub(crate) enum GuestEnd {
    /// The command ran to completion (any exit status).
    Ran(ExecOutput),
    /// The deadline passed; the guest side ended as the cleanup says.
    Expired(GuestCleanup),
    /// The output budget was exceeded; the guest side ended as the cleanup says.
    Overflowed(GuestCleanup),
}

impl Shared {
    pub(crate) fn new(
        config: DockerConfig,
        cli: DockerCli,
        declarations: BackendDeclarations,
    ) -> Self {
        Shared {
            config,
            cli,
            declarations,
            name_locks: Mutex::new(HashMap::new()),
            memory: Mutex::new(ProcessMemory::default()),
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, ProcessMemory> {
        // A panic while holding this lock leaves plain sets behind; they stay usable.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The process-wide async lock of one container name.
    pub(crate) fn name_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.name_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(name.to_owned()).or_default().clone()
    }

    pub(crate) fn is_retired(&self, id: &str) -> bool {
        self.memory().retired.contains_key(id)
    }

    /// Refuses any call on a retired instance.
    pub(crate) fn refuse_retired(&self, id: &str) -> Result<(), SandboxError> {
        if self.is_retired(id) {
            return Err(SandboxError::Retired {
                instance: id.to_owned(),
                reason: "a timed-out command's kill did not land; acquire again".to_owned(),
            });
        }
        Ok(())
    }

    pub(crate) fn warm_entry(&self, id: &str) -> Option<WarmEntry> {
        self.memory().warm.get(id).cloned()
    }

    pub(crate) fn remember_warm(&self, id: &str, entry: WarmEntry) {
        self.memory().warm.insert(id.to_owned(), entry);
    }

    pub(crate) fn forget_warm(&self, id: &str) {
        self.memory().warm.remove(id);
    }

    pub(crate) fn remember(&self, name: &str, entry: Remembered) {
        self.memory().remembered.insert(name.to_owned(), entry);
    }

    /// What this process remembers under names matching `select`.
    pub(crate) fn remembered_matching(
        &self,
        select: impl Fn(&Remembered) -> bool,
    ) -> Vec<(String, Remembered)> {
        self.memory()
            .remembered
            .iter()
            .filter(|(_, r)| select(r))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect()
    }

    /// Forgets everything about a container that is gone.
    pub(crate) fn forget_instance(&self, id: &str) {
        let mut memory = self.memory();
        memory.warm.remove(id);
        memory.probed.remove(id);
        memory.remembered.retain(|_, r| r.id != id);
        if !memory.unremovable.contains(id) {
            memory.retired.remove(id);
        }
    }

    /// Retired ids whose removal failed earlier (rule 24).
    pub(crate) fn unremovable(&self) -> Vec<String> {
        self.memory().unremovable.iter().cloned().collect()
    }

    // ---- engine calls ------------------------------------------------------------------------

    /// `docker container inspect` of one name or id; `None` when the engine says it is absent.
    pub(crate) async fn inspect(
        &self,
        target: &str,
    ) -> Result<Option<ContainerRecord>, SandboxError> {
        let output = self
            .cli
            .run_management(
                "docker container inspect",
                ["container", "inspect", "--format", "{{json .}}", target],
                CallShape::management(self.config.command_timeout),
            )
            .await?;
        if output.status == ExitKind::Exited(0) {
            let mut records =
                ContainerRecord::parse_lines(&output.stdout).map_err(SandboxError::engine)?;
            return match records.len() {
                1 => Ok(records.pop()),
                n => Err(SandboxError::engine(format!(
                    "docker container inspect {target} answered with {n} records"
                ))),
            };
        }
        if object_absent(&output.stderr, target) {
            return Ok(None);
        }
        Err(self.engine_failure("docker container inspect", &output.stderr))
    }

    /// One `docker container inspect` of several ids; ids gone in between are skipped.
    pub(crate) async fn inspect_many(
        &self,
        ids: &[String],
    ) -> Result<Vec<ContainerRecord>, SandboxError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut args: Vec<String> = ["container", "inspect", "--format", "{{json .}}"]
            .map(str::to_owned)
            .to_vec();
        args.extend(ids.iter().cloned());
        let output = self
            .cli
            .run_management(
                "docker container inspect",
                args,
                CallShape::management(self.config.command_timeout),
            )
            .await?;
        if output.status != ExitKind::Exited(0) {
            // Only absence of listed ids is tolerated; any other complaint fails the listing.
            let stderr = String::from_utf8_lossy(&output.stderr);
            let only_absence = stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .all(|line| ids.iter().any(|id| object_absent(line.as_bytes(), id)));
            if !only_absence {
                return Err(self.engine_failure("docker container inspect", &output.stderr));
            }
        }
        ContainerRecord::parse_lines(&output.stdout).map_err(SandboxError::engine)
    }

    /// An engine failure read from a CLI's stderr: BackendUnavailable when the daemon is
    /// unreachable, else Engine quoting the tail.
    pub(crate) fn engine_failure(&self, operation: &str, stderr: &[u8]) -> SandboxError {
        if daemon_unreachable(stderr) {
            return SandboxError::BackendUnavailable {
                backend: crate::BACKEND_NAME.to_owned(),
                detail: format!(
                    "{operation}: the daemon of context {} ({}) is unreachable: {}",
                    self.cli.context(),
                    self.cli.endpoint(),
                    tail(stderr)
                ),
                source: None,
            };
        }
        SandboxError::engine(format!("{operation} failed: {}", tail(stderr)))
    }

    /// `docker rm -f <id>`, read per docker.md rule 7. Never raises: a failure is a disposal code.
    pub(crate) async fn remove(&self, id: &str) -> Result<Removal, DisposalFailure> {
        let result = self
            .cli
            .run(
                ["rm", "-f", id],
                CallShape::management(self.config.command_timeout).budget(SMALL_BUDGET),
            )
            .await;
        let output = match result {
            Ok(output) => output,
            Err(exec_wrapper::Error::Spawn { .. }) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Unreachable,
                    format!("{id}: the docker CLI could not be started"),
                ))
            }
            Err(exec_wrapper::Error::Deadline { bound, .. }) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Timeout,
                    format!(
                        "{id}: docker rm -f did not finish within {} s",
                        bound.as_secs()
                    ),
                ))
            }
            Err(other) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Unknown,
                    format!("{id}: docker rm -f: {other}"),
                ))
            }
        };
        let removal = if output.status == ExitKind::Exited(0) {
            let echoed = String::from_utf8_lossy(&output.stdout)
                .lines()
                .any(|line| line.trim() == id);
            if echoed {
                Removal::Removed
            } else {
                Removal::Absent
            }
        } else if object_absent(&output.stderr, id) {
            Removal::Absent
        } else if daemon_unreachable(&output.stderr) {
            return Err(DisposalFailure::new(
                DisposalCode::Unreachable,
                format!("{id}: {}", tail(&output.stderr)),
            ));
        } else {
            return Err(DisposalFailure::new(
                DisposalCode::Refused,
                format!("{id}: {}", tail(&output.stderr)),
            ));
        };
        self.forget_instance(id);
        Ok(removal)
    }

    /// Removes a container this call created and must not leave behind, in a task the caller's
    /// drop cannot cancel.
    pub(crate) async fn remove_shielded(self: &Arc<Self>, id: &str) {
        let shared = Arc::clone(self);
        let id = id.to_owned();
        let task = tokio::spawn(async move {
            if let Err(failure) = shared.remove(&id).await {
                tracing::warn!(container = %id, %failure, "could not remove a half-made sandbox");
            }
        });
        let _ = task.await;
    }

    /// The engine-side stat (docker.md rule 28): unconfined, no-follow, never answered by the guest.
    /// `None` when the path does not exist.
    pub(crate) async fn engine_stat(
        &self,
        id: &str,
        path: &str,
    ) -> Result<Option<TarStat>, SandboxError> {
        let source = format!("{id}:{path}");
        for prefix in [FIRST_STAT_PREFIX, MAX_PREFIX] {
            let shape = CallShape {
                deadline: self.config.command_timeout,
                budget: prefix + SMALL_BUDGET,
                stdin: None,
                stop_after: Some(prefix),
                on_line: None,
            };
            let output = self
                .cli
                .run_management("docker cp (stat)", ["cp", source.as_str(), "-"], shape)
                .await?;
            if output.stdout.is_empty() {
                if path_absent(&output.stderr, path) {
                    return Ok(None);
                }
                if object_absent(&output.stderr, id) {
                    return Err(SandboxError::SandboxGone {
                        instance: id.to_owned(),
                    });
                }
                return Err(
                    self.engine_failure(&format!("docker cp (stat of {path:?})"), &output.stderr)
                );
            }
            match first_entry(&output.stdout) {
                Ok(FirstEntry::Found(stat)) => return Ok(Some(stat)),
                Ok(FirstEntry::NeedMore) if output.truncated => continue,
                Ok(FirstEntry::NeedMore) => {
                    return Err(SandboxError::engine(format!(
                        "docker cp (stat of {path:?}) ended before its first header"
                    )))
                }
                Err(why) => {
                    return Err(SandboxError::engine(format!(
                        "docker cp (stat of {path:?}) answered a malformed archive: {why}"
                    )))
                }
            }
        }
        Err(SandboxError::engine(format!(
            "docker cp (stat of {path:?}): no header within {MAX_PREFIX} bytes"
        )))
    }

    /// The engine-side stat's kind only, as the guest-path walks want it.
    pub(crate) async fn stat_kind(
        &self,
        id: &str,
        path: String,
    ) -> Result<Option<EntryKind>, SandboxError> {
        Ok(self.engine_stat(id, &path).await?.map(|s| s.kind))
    }

    /// The tool probe (docker.md rule 19), once per id; a pass is cached, a refusal is not.
    pub(crate) async fn probe_tools(&self, id: &str, image: &str) -> Result<(), SandboxError> {
        if self.memory().probed.contains(id) {
            return Ok(());
        }
        let argv =
            tool_probe_argv(DOCKER_TOOLS).map_err(|e| SandboxError::invalid(e.to_string()))?;
        let mut args = vec!["exec".to_owned(), id.to_owned()];
        args.extend(argv);
        let output = self
            .cli
            .run_management(
                "docker exec (tool probe)",
                args,
                CallShape::management(self.config.command_timeout).budget(PROBE_OUTPUT_BUDGET),
            )
            .await?;
        match read_tool_probe(output.status, &output.stdout) {
            ToolProbeOutcome::AllPresent => {
                self.memory().probed.insert(id.to_owned());
                Ok(())
            }
            ToolProbeOutcome::Missing(tools) => Err(missing_tools(image, &tools.join(", "))),
            ToolProbeOutcome::NoShell => Err(missing_tools(image, "sh")),
            ToolProbeOutcome::Failed { status } => {
                Err(classify_no_nonce(id, status, &output.stderr, &self.cli))
            }
        }
    }

    /// Runs one command through the exec wrapper (docker.md rules 22–24).
    ///
    /// On an expired deadline or an exceeded budget, the command's process group is killed by a
    /// second exec in a task the caller cannot cancel; the container is kept when the kill lands
    /// and retired when it does not.
    ///
    /// # Cancel safety
    /// Dropping the future kills the local client at once and starts the same remote kill in a
    /// background task; the per-call env file is deleted with its directory either way.
    pub(crate) async fn run_guest(
        self: &Arc<Self>,
        id: &str,
        call: GuestCall<'_>,
    ) -> Result<GuestEnd, SandboxError> {
        self.refuse_retired(id)?;
        let invocation = encode_invocation(call.cwd.as_bytes(), &call.argv)
            .map_err(|e| SandboxError::invalid(e.to_string()))?;
        let env_file = match call.env {
            Some(env) if !env.is_empty() => Some(PrivateEnvFile::write(env)?),
            _ => None,
        };
        let nonce = new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
        let pid_file = pid_file(&nonce);
        let mut args: Vec<std::ffi::OsString> = vec!["exec".into()];
        if call.stdin.is_some() {
            args.push("-i".into());
        }
        if let Some(file) = &env_file {
            args.push("--env-file".into());
            args.push(file.path().into());
        }
        args.extend(["-w", "/", id].map(Into::into));
        args.extend(
            docker_wrapper_argv(&nonce, &invocation)
                .into_iter()
                .map(Into::into),
        );
        let shape = CallShape {
            deadline: call.timeout,
            budget: usize::try_from(call.budget).unwrap_or(usize::MAX),
            stdin: call.stdin,
            stop_after: None,
            on_line: None,
        };
        let mut guard = KillOnDrop::armed(self, id, &pid_file);
        let result = self.cli.run(args, shape).await;
        guard.disarm();
        drop(env_file);
        match result {
            Ok(output) => match parse_run_output(output, &nonce) {
                WrapperOutcome::Ran(ran) => {
                    if ran.status > SIGNAL_STATUS_FLOOR {
                        self.refuse_if_container_died(id, ran.status).await?;
                    }
                    Ok(GuestEnd::Ran(ExecOutput {
                        stdout: ran.stdout,
                        stderr: ran.stderr,
                        exit_code: ran.status,
                        producer_owns_stderr: false,
                    }))
                }
                WrapperOutcome::NoNonce {
                    status,
                    stderr_tail,
                } => Err(classify_no_nonce(
                    id,
                    ExitKind::Exited(status),
                    &stderr_tail,
                    &self.cli,
                )),
                WrapperOutcome::ClientKilled {
                    signal,
                    stderr_tail,
                } => Err(SandboxError::engine(format!(
                    "the docker client was killed by signal {signal}: {}",
                    tail(&stderr_tail)
                ))),
                WrapperOutcome::Unmounted => Err(SandboxError::engine(
                    "the wrapper reported an unmounted workspace, which docker never has",
                )),
            },
            Err(exec_wrapper::Error::Deadline { .. }) => Ok(GuestEnd::Expired(
                self.kill_in_background(id, &pid_file).await,
            )),
            Err(exec_wrapper::Error::OutputLimit { .. }) => Ok(GuestEnd::Overflowed(
                self.kill_in_background(id, &pid_file).await,
            )),
            Err(error @ exec_wrapper::Error::Io { .. }) => {
                // The client is gone but the command may not be: kill its group all the same.
                let _ = self.kill_in_background(id, &pid_file).await;
                Err(self.cli.runner_error("docker exec", error))
            }
            Err(error) => Err(self.cli.runner_error("docker exec", error)),
        }
    }

    /// Runs the kill in a spawned task and waits for it; the caller's drop cannot cancel it.
    async fn kill_in_background(self: &Arc<Self>, id: &str, pid_file: &str) -> GuestCleanup {
        let task = tokio::spawn(Arc::clone(self).kill_group(id.to_owned(), pid_file.to_owned()));
        task.await.unwrap_or(GuestCleanup::Retired)
    }

    /// The kill call (exec-wrapper.md §7) and what follows it: keep, or retire.
    async fn kill_group(self: Arc<Self>, id: String, pid_file: String) -> GuestCleanup {
        let mut args = vec!["exec".to_owned(), id.clone()];
        args.extend(kill_argv(&pid_file));
        let result = self
            .cli
            .run(
                args,
                CallShape::management(self.config.exec_cleanup_timeout).budget(KILL_OUTPUT_BUDGET),
            )
            .await;
        match KillOutcome::from_run(&result) {
            KillOutcome::Killed => GuestCleanup::Killed,
            KillOutcome::NeverStarted => GuestCleanup::NeverStarted,
            KillOutcome::NotLanded(why) => {
                tracing::warn!(container = %id, ?why, "the kill did not land; retiring the sandbox");
                self.retire(&id).await;
                GuestCleanup::Retired
            }
        }
    }

    /// Retires an instance (rule 24): removed by id, so every process creates a replacement; when
    /// the removal fails too, every handle refuses and the next acquire removes it first.
    pub(crate) async fn retire(&self, id: &str) {
        let name = self
            .memory()
            .remembered
            .iter()
            .find(|(_, r)| r.id == id)
            .map(|(n, _)| n.clone());
        {
            let mut memory = self.memory();
            memory.retired.insert(id.to_owned(), name);
            memory.warm.remove(id);
        }
        match self.remove(id).await {
            Ok(_) => {
                // `remove` forgot the instance; keep it retired so old handles say so.
                self.memory().retired.insert(id.to_owned(), None);
            }
            Err(failure) => {
                tracing::warn!(container = %id, %failure, "a retired sandbox could not be removed");
                self.memory().unremovable.insert(id.to_owned());
            }
        }
    }

    /// Removes retired instances whose removal failed before (rule 24), before anything else.
    pub(crate) async fn sweep_unremovable(&self) {
        for id in self.unremovable() {
            if self.remove(&id).await.is_ok() {
                self.memory().unremovable.remove(&id);
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

/// A call through the wrapper that printed no nonce (docker.md rule 23): never an exit code.
pub(crate) fn classify_no_nonce(
    id: &str,
    status: ExitKind,
    stderr: &[u8],
    cli: &DockerCli,
) -> SandboxError {
    let lower = String::from_utf8_lossy(stderr).to_lowercase();
    if object_absent(stderr, id) && lower.contains("no such container") {
        return SandboxError::SandboxGone {
            instance: id.to_owned(),
        };
    }
    let detail = if lower.contains("is not running") {
        "the container was stopped; acquire again".to_owned()
    } else if lower.contains("is paused") {
        "the container is paused; acquire again".to_owned()
    } else if daemon_unreachable(stderr) {
        format!(
            "the daemon of context {} ({}) is unreachable",
            cli.context(),
            cli.endpoint()
        )
    } else {
        format!(
            "docker exec failed before the command started ({})",
            status_text(status)
        )
    };
    SandboxError::engine(format!("{detail}: {}", tail(stderr)))
}

/// Statuses above this are "killed by signal N" (128 + N) as `docker exec` reports them, and are
/// also what a command reads as when its container is removed or stopped under it.
const SIGNAL_STATUS_FLOOR: i32 = 128;

impl Shared {
    /// A signal-shaped status may be the container's death rather than the command's: one inspect
    /// tells them apart, so a removed or stopped container never reads as an exit code.
    async fn refuse_if_container_died(&self, id: &str, status: i32) -> Result<(), SandboxError> {
        match self.inspect(id).await? {
            None => Err(SandboxError::SandboxGone {
                instance: id.to_owned(),
            }),
            Some(record) if record.status() != "running" => Err(SandboxError::engine(format!(
                "container {id} stopped ({}) while the command ran; its status {status} is not the command's",
                record.status()
            ))),
            Some(_) => Ok(()),
        }
    }
}

/// Starts the remote kill if a wrapper call's future is dropped before it ended.
struct KillOnDrop {
    pending: Option<(Arc<Shared>, String, String)>,
}

impl KillOnDrop {
    fn armed(shared: &Arc<Shared>, id: &str, pid_file: &str) -> Self {
        KillOnDrop {
            pending: Some((Arc::clone(shared), id.to_owned(), pid_file.to_owned())),
        }
    }

    fn disarm(&mut self) {
        self.pending = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some((shared, id, pid_file)) = self.pending.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(shared.kill_group(id, pid_file));
                }
                Err(_) => tracing::warn!(
                    container = %id,
                    "an exec was dropped outside a tokio runtime; its process group could not be killed"
                ),
            }
        }
    }
}

/// The per-call env file (exec-wrapper.md rule 6): 0600, in a private 0700 directory, deleted
/// with it when dropped.
pub(crate) struct PrivateEnvFile {
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl PrivateEnvFile {
    /// Checks what the docker client's env-file reader can carry, then writes the file.
    pub(crate) fn write(env: &ExecEnv) -> Result<PrivateEnvFile, SandboxError> {
        let body = env_file_body(env)?;
        let dir = tempfile::Builder::new()
            .prefix("maf-docker-env-")
            .tempdir()
            .map_err(|e| host_io("create the env file directory", e))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .map_err(|e| host_io("restrict the env file directory", e))?;
        let path = dir.path().join("env");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| host_io("create the env file", e))?;
        file.write_all(&body)
            .and_then(|()| file.sync_all())
            .map_err(|e| host_io("write the env file", e))?;
        Ok(PrivateEnvFile { dir, path })
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        debug_assert!(self.path.starts_with(self.dir.path()));
        &self.path
    }
}

fn host_io(operation: &'static str, source: std::io::Error) -> SandboxError {
    SandboxError::Io {
        operation,
        path: "(private env file)".to_owned(),
        source,
    }
}

/// One `NAME=VALUE` line per entry, after docker's own refusals (docker.md rule 22). Every
/// refusal names the variable, never its value.
pub(crate) fn env_file_body(env: &ExecEnv) -> Result<Vec<u8>, SandboxError> {
    env.validate()?;
    let mut body = Vec::new();
    for (name, value) in env.entries() {
        if name.starts_with("DOCKER_") {
            return Err(refuse_env(
                name,
                "names beginning with DOCKER_ could steer the docker client",
            ));
        }
        let Ok(text) = std::str::from_utf8(value) else {
            return Err(refuse_env(
                name,
                "its value is not valid UTF-8, which the docker env file cannot carry",
            ));
        };
        if text.contains('\n') || text.contains('\r') {
            return Err(refuse_env(
                name,
                "its value contains a line break, which the docker env file cannot carry",
            ));
        }
        if name.len() + 1 + value.len() > MAX_ENV_LINE {
            return Err(refuse_env(
                name,
                "its NAME=VALUE line is longer than the docker env file reader's 65,535 bytes",
            ));
        }
        body.extend_from_slice(name.as_bytes());
        body.push(b'=');
        body.extend_from_slice(value);
        body.push(b'\n');
    }
    Ok(body)
}

#[cold]
fn refuse_env(name: &str, why: &str) -> SandboxError {
    SandboxError::invalid(format!("environment variable {name} is refused: {why}"))
}

/// Polls every future together in the calling task and returns their outputs in order.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut all_done = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn env_file_lines_and_refusals() {
        let env = ExecEnv::default().set("A", "1 2 ").set("B", "");
        assert_eq!(env_file_body(&env).unwrap(), b"A=1 2 \nB=\n");
        let refused = [
            ExecEnv::default().set("DOCKER_HOST", "tcp://elsewhere"),
            ExecEnv::default().set("DOCKER_ANYTHING", "x"),
            ExecEnv::default().set("A", b"\xff".as_slice()),
            ExecEnv::default().set("A", "x\ny"),
            ExecEnv::default().set("A", "x\r"),
            ExecEnv::default().set("A", "v".repeat(MAX_ENV_LINE - 1)),
            ExecEnv::default().set("GITHUB_TOKEN", "hunter2"),
        ];
        for env in refused {
            let error = env_file_body(&env).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
            assert!(!error.to_string().contains("hunter2"));
            let name = &env.entries()[0].0;
            assert!(error.to_string().contains(name.as_str()), "{error}");
        }
        env_file_body(&ExecEnv::default().set("A", "v".repeat(MAX_ENV_LINE - 2))).unwrap();
    }

    #[test]
    fn env_file_is_private_and_goes_away() {
        let env = ExecEnv::default().set("GREETING", "hello");
        let file = PrivateEnvFile::write(&env).unwrap();
        let path = file.path().to_owned();
        let dir = path.parent().unwrap().to_owned();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(std::fs::read(&path).unwrap(), b"GREETING=hello\n");
        drop(file);
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn join_all_keeps_order() {
        let futures: Vec<_> = (0..5u64)
            .map(|i| async move {
                tokio::time::sleep(Duration::from_millis(10 * (5 - i))).await;
                i
            })
            .collect();
        assert_eq!(join_all(futures).await, [0, 1, 2, 3, 4]);
    }
}
