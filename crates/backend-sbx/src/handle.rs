//! The handle to one sbx sandbox: commands through the exec wrapper's sbx shape, files through
//! the host plane.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bounded_process::ExitKind;
use exec_wrapper::call::sbx_env_file_name;
use exec_wrapper::encoding::{encode_env_file, plain_invocation};
use exec_wrapper::kill::{
    namespace_kill_argv, pid_namespace_probe_argv, read_kill_mode_probe, KillFailure, KillOutcome,
    KillReport, KILL_OUTPUT_BUDGET,
};
use exec_wrapper::wrapper::{sbx_pid_namespace_wrapper_argv, sbx_wrapper_argv, SbxMount};
use exec_wrapper::{new_nonce, Nonce, WrapperOutcome};
use sandbox_core::backend_kit::{CleanupOnDrop, ExecStreamSender};
use sandbox_core::guest_path::{self, Access};
use sandbox_core::{
    EntryKind, ExecEnv, ExecExit, ExecOutput, ExecRequest, ExecStdin, ExecStream, GuestCleanup,
    Sandbox, SandboxEntry, SandboxError, TransferLimits,
};
use sbx_cli::{Error as CliError, ExecRequest as CliExec, Instant, SbxName};
use wrapper_stream::{guest_cleanup, GuestEnd, WrapperStreamSink};

use crate::engine::to_sandbox_error;
use crate::host::SbxHost;
use crate::host_plane::{placement, HostPlane, Placement};

/// Why an instance is retired after a kill that did not land.
pub(crate) const KILL_NOT_LANDED: &str =
    "the kill after a deadline did not land; the command may still be running";

/// Room a guest call's budget keeps beyond the caller's own for the nonce line.
const NONCE_SLACK: u64 = 4096;

/// Output budget of the backend's own guest commands (rm).
const SMALL_GUEST_BUDGET: u64 = 64 * 1024;

/// A handle to one instance, by name and id: a replacement under the same name is never reached
/// (every call checks the retired set by id; an sbx call reaching a replacement finds its
/// workspace without this generation's marker and reports WorkspaceMismatch).
#[derive(Debug)]
pub(crate) struct SbxSandbox {
    pub(crate) host: Arc<SbxHost>,
    pub(crate) name: SbxName,
    pub(crate) instance_id: String,
    pub(crate) base: String,
    /// The working directory `.` resolves to (the storage base), resolved once: nearly every
    /// call names it. `None` leaves each call to resolve `.` and meet the error itself.
    pub(crate) base_wd: Option<String>,
    pub(crate) mount: SbxMount,
    pub(crate) plane: Arc<HostPlane>,
    pub(crate) fresh: bool,
    pub(crate) files_in: TransferLimits,
    pub(crate) files_out: TransferLimits,
}

/// The kill of an expired or abandoned call: armed before the call starts, run at once after a
/// deadline or an over-budget end, spawned if the call's task is dropped armed (a task the caller
/// cannot cancel either way).
type PendingKill = CleanupOnDrop<GuestCleanup>;

/// Runs an armed kill now; a kill task that did not reach its end leaves the instance retired.
async fn kill_now(pending: PendingKill) -> GuestCleanup {
    match pending.run_now().await {
        Ok(Some(cleanup)) => cleanup,
        Ok(None) | Err(_) => GuestCleanup::Retired,
    }
}

/// The kill script for the call `nonce`, bounded by the cleanup timeout; a kill that does not
/// land retires the instance (persisted).
async fn kill(
    host: Arc<SbxHost>,
    name: SbxName,
    instance_id: String,
    nonce: Nonce,
    started: Arc<AtomicBool>,
) -> GuestCleanup {
    // One kill script serves both wrapper shapes: it kills the call's PID namespace when the
    // call entered one, and the recorded process group otherwise.
    let request = CliExec::new(
        name.clone(),
        namespace_kill_argv(&nonce),
        Instant::now() + host.config.exec_cleanup_timeout,
    )
    .output_budget(KILL_OUTPUT_BUDGET);
    let report = match host.cli.exec(&request).await {
        Ok(output) => match output.status {
            ExitKind::Exited(code) => KillReport::from_exit(code),
            ExitKind::Signaled(_) => KillReport {
                outcome: KillOutcome::NotLanded(KillFailure::CallFailed),
                mode: None,
            },
        },
        Err(error) => {
            tracing::warn!(sandbox = %name, %error, "the kill call failed");
            KillReport {
                outcome: KillOutcome::NotLanded(KillFailure::CallFailed),
                mode: None,
            }
        }
    };
    // Nothing to kill after the nonce line arrived: the command removed or escaped what names
    // it. Retired, never "never started".
    let report = report.after_start(started.load(Ordering::Relaxed));
    let cleanup = guest_cleanup(report.outcome);
    if cleanup == GuestCleanup::Retired {
        tracing::warn!(sandbox = %name, outcome = ?report.outcome, "the kill did not land");
        host.retire(name.as_str(), &instance_id, KILL_NOT_LANDED)
            .await;
    } else {
        tracing::debug!(sandbox = %name, mode = ?report.mode, %cleanup, "the kill ended the call");
    }
    cleanup
}

/// What the task behind one streamed call owns.
struct WrappedCall {
    host: Arc<SbxHost>,
    name: SbxName,
    instance_id: String,
    mount_parent: String,
    plane: Arc<HostPlane>,
    env_file: Option<String>,
}

impl WrappedCall {
    /// Runs the call, kills what must be killed, removes an unread env file, and ends the
    /// stream with the exit or the error.
    async fn produce(
        self,
        request: CliExec,
        reader: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
        nonce: Nonce,
        timeout: Duration,
        sender: ExecStreamSender,
    ) {
        let cap = sender.cap();
        let mut sink = WrapperStreamSink::new(sender, &nonce, "sbx");
        let mut pending = PendingKill::armed(
            "the kill of an abandoned command",
            kill(
                self.host.clone(),
                self.name.clone(),
                self.instance_id.clone(),
                nonce,
                sink.started_flag(),
            ),
        );
        let result = self
            .host
            .cli
            .exec_streaming(&request, reader, &mut sink)
            .await;
        let (sender, splitter) = sink.into_parts();
        let outcome = match result {
            Ok(status) => {
                pending.disarm();
                self.exit_of(splitter.finish(status))
            }
            Err(CliError::Timeout { .. }) => Err(SandboxError::Timeout {
                operation: "command".to_owned(),
                bound: timeout,
                cleanup: Some(kill_now(pending).await),
            }),
            Err(CliError::OutputLimit { budget, .. }) => {
                let cleanup = kill_now(pending).await;
                let limit = cap.unwrap_or(budget as u64);
                tracing::info!(sandbox = %self.name, %cleanup, limit, "command output exceeded its budget");
                Err(SandboxError::OutputLimitExceeded { limit })
            }
            Err(_) if sender.is_dropped() => {
                let cleanup = kill_now(pending).await;
                tracing::debug!(sandbox = %self.name, %cleanup, "the stream was dropped; its command was killed");
                self.remove_env_file().await;
                return;
            }
            Err(error) => {
                pending.disarm();
                Err(gone_or(&self.name, &self.instance_id, error))
            }
        };
        self.remove_env_file().await;
        sender.finish(outcome).await;
    }

    /// What a wrapper call that ended reports: the command's exit, or the failure.
    fn exit_of(&self, outcome: WrapperOutcome) -> Result<ExecExit, SandboxError> {
        match outcome {
            WrapperOutcome::Ran(output) => Ok(ExecExit::exited(output.status)),
            WrapperOutcome::NoWorkingDirectory { reason } => Ok(ExecExit::workdir_unusable(reason)),
            WrapperOutcome::Unmounted => Err(SandboxError::WorkspaceMismatch(format!(
                "the directory bound at {} in sandbox {} is not this sandbox's workspace",
                self.mount_parent, self.name
            ))),
            // A call that never reached its nonce line: the sandbox's absence is SandboxGone,
            // anything else classified from sbx's stderr.
            WrapperOutcome::NoNonce {
                status,
                stderr_tail,
            } => Err(gone_or(
                &self.name,
                &self.instance_id,
                sbx_cli::classify_output(
                    sbx_cli::Call::Exec,
                    Some(self.name.as_str()),
                    ExitKind::Exited(status),
                    &stderr_tail,
                ),
            )),
            WrapperOutcome::ClientKilled {
                signal,
                stderr_tail: tail,
            } => Err(SandboxError::engine(format!(
                "the sbx client was killed by signal {signal}: {}",
                stderr_tail(&tail)
            ))),
        }
    }

    /// The wrapper deletes the env file once read; one that was never read is removed here.
    async fn remove_env_file(&self) {
        if let Some(file) = self.env_file.clone() {
            let plane = self.plane.clone();
            if let Err(error) = blocking(move || plane.remove_own(&file)).await {
                tracing::warn!(sandbox = %self.name, %error, "could not remove an unread env file");
            }
        }
    }
}

fn gone_or(name: &SbxName, instance_id: &str, error: CliError) -> SandboxError {
    match error {
        CliError::NotFound { .. } => gone(name, instance_id),
        other => to_sandbox_error(other),
    }
}

#[cold]
fn gone(name: &SbxName, instance_id: &str) -> SandboxError {
    tracing::warn!(sandbox = %name, "sandbox {name} is gone; acquire again");
    SandboxError::SandboxGone {
        instance: instance_id.to_owned(),
    }
}

/// Runs a blocking plane operation on the blocking pool.
async fn blocking<T, F>(work: F) -> Result<T, SandboxError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, SandboxError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SandboxError::engine(format!("a host file operation did not finish: {e}")))?
}

#[cold]
fn guest_refused(path: &str, detail: impl Into<String>) -> SandboxError {
    SandboxError::GuestRefused {
        path: path.to_owned(),
        detail: detail.into(),
    }
}

fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let trimmed = text.trim();
    let start = trimmed
        .char_indices()
        .rev()
        .nth(1999)
        .map_or(0, |(index, _)| index);
    trimmed[start..].to_owned()
}

impl SbxSandbox {
    /// Refuses a retired instance (this process's set, or its record).
    pub(crate) fn refuse_retired(&self) -> Result<(), SandboxError> {
        if let Some(reason) = self.host.retired_reason(&self.instance_id) {
            return Err(SandboxError::Retired {
                instance: self.instance_id.clone(),
                reason: format!("instance retired ({reason}); acquire again to get a replacement"),
            });
        }
        Ok(())
    }

    /// The call's working directory: relative ones are confined to the storage base.
    fn wd(&self, wd: &str) -> Result<String, SandboxError> {
        match &self.base_wd {
            Some(base_wd) if wd == "." => Ok(base_wd.clone()),
            _ => guest_path::resolve_wd(wd, &self.base),
        }
    }

    /// A whole file (`head` false: larger than the cap is refused) or its first bytes (`head`
    /// true), through the host plane's confined read, capped by the sandbox's per-file ceiling.
    async fn read_checked(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
        head: bool,
    ) -> Result<Vec<u8>, SandboxError> {
        self.refuse_retired()?;
        let wd = self.wd(wd)?;
        let cap = max_bytes.min(self.files_out.max_bytes_per_file);
        let plane = self.plane.clone();
        let path = path.to_owned();
        blocking(move || {
            let resolved = Access::Read.resolve(&path, &wd)?;
            if head {
                plane.read_head(&resolved, cap)
            } else {
                plane.read(&resolved, cap)
            }
        })
        .await
    }

    /// One command through the wrapper, its output collected (the collector over
    /// [`Self::stream_wrapped`]).
    pub(crate) async fn run_wrapped(
        &self,
        cwd: &str,
        argv: Vec<Vec<u8>>,
        env: Option<&ExecEnv>,
        budget: u64,
        timeout: Duration,
    ) -> Result<GuestEnd, SandboxError> {
        let stream = self
            .stream_wrapped(cwd, argv, env, ExecStdin::Closed, Some(budget), timeout)
            .await?;
        GuestEnd::collect(stream).await
    }

    /// Starts one command through the wrapper (`unshare`, then `bind` / `run`; plain values carried
    /// as themselves), the guest environment in a per-call env file in the workspace, never in
    /// any argv; `stdin` goes to `sbx exec -i` and the output streams as it arrives. A task owns
    /// the call: a deadline, output over `cap` or a dropped stream runs the kill, which the caller
    /// cannot cancel.
    pub(crate) async fn stream_wrapped(
        &self,
        cwd: &str,
        argv: Vec<Vec<u8>>,
        env: Option<&ExecEnv>,
        stdin: ExecStdin,
        cap: Option<u64>,
        timeout: Duration,
    ) -> Result<ExecStream, SandboxError> {
        let nonce = new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
        let invocation = plain_invocation(cwd.as_bytes(), &argv)
            .map_err(|e| SandboxError::invalid(e.to_string()))?;
        let env_file = match env.filter(|env| !env.is_empty()) {
            Some(env) => {
                let entries: Vec<(&[u8], &[u8])> = env
                    .entries()
                    .iter()
                    .map(|(name, value)| (name.as_bytes(), value.as_slice()))
                    .collect();
                let bytes =
                    encode_env_file(&entries).map_err(|e| SandboxError::invalid(e.to_string()))?;
                let file = sbx_env_file_name(&nonce);
                let plane = self.plane.clone();
                let name = file.clone();
                blocking(move || plane.write_own(&name, &bytes)).await?;
                Some(file)
            }
            None => None,
        };
        let call = WrappedCall {
            host: self.host.clone(),
            name: self.name.clone(),
            instance_id: self.instance_id.clone(),
            mount_parent: self.mount.parent.clone(),
            plane: self.plane.clone(),
            env_file,
        };
        let namespace = match self.pid_namespace().await {
            Ok(namespace) => namespace,
            Err(error) => {
                call.remove_env_file().await;
                return Err(error);
            }
        };
        let argv = if namespace {
            sbx_pid_namespace_wrapper_argv(
                &nonce,
                &self.mount,
                call.env_file.is_some(),
                &invocation,
            )
        } else {
            sbx_wrapper_argv(&nonce, &self.mount, call.env_file.is_some(), &invocation)
        };
        let argv = match argv {
            Ok(argv) => argv,
            Err(error) => {
                call.remove_env_file().await;
                return Err(SandboxError::invalid(error.to_string()));
            }
        };
        // The runner's budget counts the nonce line and transport text too; the stream's cap
        // counts the command's bytes only.
        let budget_bytes = cap.map_or(usize::MAX, |cap| {
            usize::try_from(cap.saturating_add(NONCE_SLACK)).unwrap_or(usize::MAX)
        });
        let mut request = CliExec::new(self.name.clone(), argv, Instant::now() + timeout)
            .output_budget(budget_bytes);
        let reader = match stdin {
            ExecStdin::Closed => None,
            ExecStdin::Bytes(bytes) => {
                request = request.stdin(bytes);
                None
            }
            ExecStdin::Reader(reader) => Some(reader),
        };
        let (sender, stream) = ExecStream::channel(cap);
        tokio::spawn(call.produce(request, reader, nonce, timeout, sender));
        Ok(stream)
    }

    /// Whether this instance's calls run in their own PID namespace (the wrapper's PID-namespace
    /// `unshare`), so a timeout kills every process a command started; asked once per instance with
    /// the same `unshare` the call starts with. Where the guest cannot make one, calls enter without it
    /// and a timeout kills the command's process group only. A failed probe call is an error,
    /// asked again next time, never a silent downgrade.
    async fn pid_namespace(&self) -> Result<bool, SandboxError> {
        if let Some(known) = self.host.pid_namespace_known(&self.instance_id) {
            return Ok(known);
        }
        let output = crate::engine::short_exec(
            &self.host.cli,
            &self.name,
            pid_namespace_probe_argv(),
            false,
            self.host.config.command_timeout,
        )
        .await
        .map_err(|error| self.gone_or(error))?;
        let available = read_kill_mode_probe(output.status);
        if !available {
            tracing::warn!(
                sandbox = %self.name,
                status = ?output.status,
                "no PID namespace for commands here; a timeout kills the command's process group only"
            );
        }
        self.host
            .remember_pid_namespace(&self.instance_id, available);
        Ok(available)
    }

    fn gone_or(&self, error: CliError) -> SandboxError {
        gone_or(&self.name, &self.instance_id, error)
    }

    /// A file method's guest command: cwd `/`, the command timeout, whose expiry is the
    /// backend's own (EngineTimeout), never the caller's.
    async fn guest_rm(
        &self,
        target: &str,
        recursive: bool,
        what: &str,
    ) -> Result<(), SandboxError> {
        let flag = if recursive { "-rf" } else { "-f" };
        let argv = ["rm", flag, "--", target]
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect();
        let timeout = self.host.config.command_timeout;
        match self
            .run_wrapped("/", argv, None, SMALL_GUEST_BUDGET, timeout)
            .await?
        {
            GuestEnd::Ran(output) if output.exit_code == 0 => Ok(()),
            GuestEnd::Ran(output) => Err(guest_refused(
                target,
                format!(
                    "the guest could not remove it (exit {}): {}",
                    output.exit_code,
                    stderr_tail(&output.stderr)
                ),
            )),
            GuestEnd::Expired(_) => Err(SandboxError::EngineTimeout {
                operation: what.to_owned(),
                bound: timeout,
            }),
            GuestEnd::Overflowed => Err(SandboxError::engine("the guest rm flooded its output")),
        }
    }
}

#[async_trait]
impl Sandbox for SbxSandbox {
    fn instance_id(&self) -> &str {
        &self.instance_id
    }

    fn freshly_created(&self) -> bool {
        self.fresh
    }

    fn storage_base(&self) -> &str {
        &self.base
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        sandbox_core::backend_kit::collect_exec(self, request).await
    }

    async fn exec_stream(
        &self,
        request: ExecRequest,
        stdin: ExecStdin,
    ) -> Result<ExecStream, SandboxError> {
        self.refuse_retired()?;
        request.validate()?;
        let wd = self.wd(request.working_dir())?;
        self.stream_wrapped(
            &wd,
            request.command().to_argv(),
            Some(request.guest_env()),
            stdin,
            request.output_cap(),
            request.timeout_bound(),
        )
        .await
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.refuse_retired()?;
        let wd = self.wd(wd)?;
        let limit = self.files_in.max_bytes_per_file;
        if content.len() as u64 > limit {
            return Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit,
            });
        }
        let plane = self.plane.clone();
        let (path, content) = (path.to_owned(), content.to_vec());
        // The core's name checks only: the plane's own walk is the link and kind check (see
        // `HostPlane`), and its write refuses a link at the target.
        blocking(move || {
            let target = Access::Write.resolve(&path, &wd)?;
            plane.write(&target, &content)
        })
        .await
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        self.refuse_retired()?;
        let wd = self.wd(wd)?;
        let plane = self.plane.clone();
        let path = path.to_owned();
        blocking(move || {
            let resolved = Access::Read.resolve(&path, &wd)?;
            Ok(plane.lstat(&resolved)?.map(|stat| {
                SandboxEntry::new(guest_path::reported(&resolved, &wd), stat.kind, stat.size)
            }))
        })
        .await
    }

    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.read_checked(path, wd, max_bytes, false).await
    }

    async fn read_head(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.read_checked(path, wd, max_bytes, true).await
    }

    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        self.refuse_retired()?;
        let wd = self.wd(wd)?;
        let plane = self.plane.clone();
        let path = path.to_owned();
        blocking(move || {
            let directory = Access::List.resolve(&path, &wd)?;
            let shown_directory = guest_path::reported(&directory, &wd);
            // A name no guest path can address (not UTF-8, or holding a backslash) is shown
            // escaped, never left out.
            let mut entries: Vec<SandboxEntry> = plane
                .list(&directory)?
                .into_iter()
                .map(|(name, stat)| {
                    SandboxEntry::listed(&shown_directory, &name, stat.kind, stat.size)
                })
                .collect();
            entries.sort_by(|a, b| a.path().cmp(b.path()));
            Ok(entries)
        })
        .await
    }

    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        self.refuse_retired()?;
        let wd = self.wd(wd)?;
        let plane = self.plane.clone();
        let path = path.to_owned();
        let checked = blocking(move || {
            let target = Access::Delete.resolve(&path, &wd)?;
            let stat = plane.lstat(&target)?;
            Ok((target, stat))
        })
        .await?;
        let target = match checked {
            (_, None) => return Ok(()),
            (target, Some(stat)) if stat.kind == EntryKind::Directory && !recursive => {
                return Err(SandboxError::IsADirectory { path: target })
            }
            (target, Some(_)) => target,
        };
        // In the guest: a guest keeps seeing a host-deleted name for a while, and guest
        // authority reaches only what the guest itself could remove.
        self.guest_rm(&target, recursive, "remove").await
    }

    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        self.refuse_retired()?;
        if timeout.is_zero() {
            return Err(SandboxError::invalid(
                "reclaim timeout must be greater than zero",
            ));
        }
        let started = tokio::time::Instant::now();
        let target = if directory.starts_with('/') {
            guest_path::norm(directory)
        } else {
            let wd = self.wd(wd)?;
            let resolved = guest_path::confine(directory, &wd)?;
            if resolved == wd {
                return Err(SandboxError::confinement(
                    directory,
                    "the working directory itself is never reclaimed",
                ));
            }
            resolved
        };
        match placement(&self.mount.parent, &target)? {
            Placement::Inside(relative) if !relative.is_empty() => {}
            Placement::Inside(_) | Placement::Above => {
                return Err(SandboxError::confinement(
                    directory,
                    "reclaim reaches only what lies strictly inside the workspace",
                ))
            }
        }
        let plane = self.plane.clone();
        let checked = target.clone();
        let timed_out = |cleanup| SandboxError::Timeout {
            operation: "reclaim".to_owned(),
            bound: timeout,
            cleanup,
        };
        match tokio::time::timeout(timeout, blocking(move || plane.lstat(&checked))).await {
            Err(_) => return Err(timed_out(None)),
            Ok(stat) => {
                stat?;
            }
        }
        let remaining = timeout.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            return Err(timed_out(None));
        }
        let argv = ["rm", "-rf", "--", target.as_str()]
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect();
        match self
            .run_wrapped("/", argv, None, SMALL_GUEST_BUDGET, remaining)
            .await?
        {
            GuestEnd::Ran(output) if output.exit_code == 0 => Ok(()),
            GuestEnd::Ran(output) => Err(guest_refused(
                &target,
                format!(
                    "the guest could not remove it (exit {}): {}",
                    output.exit_code,
                    stderr_tail(&output.stderr)
                ),
            )),
            GuestEnd::Expired(cleanup) => Err(timed_out(Some(cleanup))),
            GuestEnd::Overflowed => Err(SandboxError::engine("the guest rm flooded its output")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_tails_keep_the_last_2000_characters() {
        assert_eq!(stderr_tail(b"  short \n"), "short");
        let long = "é".repeat(2500);
        let tail = stderr_tail(long.as_bytes());
        assert_eq!(tail.chars().count(), 2000);
    }
}
