//! One VM as a [`Sandbox`]: commands and files through the guest agent, with the core's
//! guest-path rules applied on the host before any request.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use qemu_vm::{AgentClient, ErrorCode, ExitStatus, FileKind, RunLimits, VmError};
use sandbox_core::backend_kit::{collect_exec, ExecStreamSender, SendRefused};
use sandbox_core::guest_path::{self, resolve_wd, Access};
use sandbox_core::{
    EntryKind, ExecChunk, ExecExit, ExecOutput, ExecRequest, ExecStdin, ExecStream, GuestCleanup,
    Sandbox, SandboxEntry, SandboxError, TransferLimits,
};
use tokio::io::AsyncReadExt as _;

use crate::egress::{EgressPlan, GuestEgress};
use crate::fault::HEALTH_EVERY;
use crate::layout::Slot;

/// How much longer than the command's own bound the host waits for the guest to report the
/// kill of an expired command before it gives up on the call.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// How long the host waits to queue a kill to a guest that may no longer read.
const KILL_SEND: Duration = Duration::from_secs(2);

/// The exit status a shell reports for a program it cannot find; the agent spawns argv
/// directly, so the backend says the same.
const NOT_FOUND_EXIT: i32 = 127;

/// A VM of this backend.
#[derive(Debug, Clone)]
pub struct QemuSandbox {
    pub(crate) instance: String,
    pub(crate) storage_base: String,
    pub(crate) fresh: bool,
    pub(crate) agent: AgentClient,
    pub(crate) call_timeout: Duration,
    pub(crate) files_in: u64,
    /// The VM's own directory (QEMU's sockets and `vm.json`): where its health is read.
    pub(crate) vm_dir: PathBuf,
    /// The name's record, which a retirement marks.
    pub(crate) slot: Slot,
    /// Whether this is the handle its VM's creation holds, the name's lock held: a retirement
    /// then only kills QEMU (the creation removes the record itself).
    pub(crate) creating: bool,
    /// The backend that made the handle, for `reset`.
    pub(crate) resets: Arc<dyn Resets>,
    /// The allowlist egress the handle was acquired with, for `reset`.
    pub(crate) egress_plan: Option<Arc<EgressPlan>>,
    /// Its connections judged while the handle lives; its variables go to every command.
    pub(crate) egress: Option<Arc<GuestEgress>>,
}

/// What a handle's `reset` asks of the backend that made it (a trait, so this module does not
/// name the backend's type, which names this module's).
#[async_trait]
pub(crate) trait Resets: Send + Sync + std::fmt::Debug {
    /// The VM of `slot` replaced by a new one restored from the baseline, under the same key,
    /// kind and storage base.
    async fn reset(
        &self,
        slot: &Slot,
        egress: Option<Arc<EgressPlan>>,
    ) -> Result<QemuSandbox, SandboxError>;
}

impl QemuSandbox {
    /// `read_file` (`head` false: a file over `max_bytes` is refused whole) and `read_head`
    /// (`head` true: its first `max_bytes`), after the same path checks.
    async fn read_checked(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
        head: bool,
    ) -> Result<Vec<u8>, SandboxError> {
        let wd = resolve_wd(wd, &self.storage_base)?;
        let resolved = Access::Read
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        match self.stat_kind(resolved.clone()).await? {
            None => {
                return Err(SandboxError::NotFound {
                    path: path.to_owned(),
                })
            }
            Some(EntryKind::Directory) => {
                return Err(SandboxError::IsADirectory {
                    path: path.to_owned(),
                })
            }
            Some(EntryKind::File) => {}
            Some(_) => {
                return Err(SandboxError::NotRegularFile {
                    path: path.to_owned(),
                })
            }
        }
        let read = async {
            if head {
                self.agent
                    .read_head(resolved.as_bytes(), max_bytes, self.call_timeout)
                    .await
            } else {
                self.agent
                    .read_file(resolved.as_bytes(), max_bytes, self.call_timeout)
                    .await
            }
        };
        match self.watch(read).await {
            Ok(bytes) => Ok(bytes),
            Err(VmError::OutputLimit { limit }) => Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit,
            }),
            Err(error) => Err(self.failed(path, error).await),
        }
    }

    /// The handle with a sandbox's own per-file write limit: its spec's, within the ceiling the
    /// backend declared (which the router already checked the spec against).
    pub(crate) fn with_files_in(mut self, limits: TransferLimits) -> Self {
        self.files_in = self.files_in.min(limits.max_bytes_per_file);
        self
    }

    async fn stat_kind(&self, path: String) -> Result<Option<EntryKind>, SandboxError> {
        match self
            .watch(self.agent.stat(path.as_bytes(), self.call_timeout))
            .await
        {
            Ok(stat) => Ok(Some(entry_kind(stat.kind))),
            Err(VmError::Agent {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(None),
            Err(error) => Err(self.failed(&path, error).await),
        }
    }

    /// Runs a short helper command (mkdir, rm) as root; a non-zero exit is the guest's refusal.
    async fn helper(&self, argv: &[&[u8]], path: &str) -> Result<(), SandboxError> {
        let request = qemu_vm::ExecRequest {
            argv: argv.iter().map(|a| a.to_vec()).collect(),
            env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
            workdir: b"/".to_vec(),
            stdin: false,
            timeout_ms: self.call_timeout.as_millis() as u64,
            user: None,
        };
        let limits = RunLimits {
            output_cap: 64 * 1024,
            deadline: self.call_timeout + KILL_GRACE,
        };
        let out = match self.watch(self.agent.run(request, None, limits)).await {
            Ok(out) => out,
            Err(error) => return Err(self.failed(path, error).await),
        };
        if out.status.code == Some(0) {
            Ok(())
        } else {
            Err(SandboxError::GuestRefused {
                path: path.to_owned(),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }
}

/// Moves one exec's events into its stream, feeds its stdin, and ends it: on its exit, on the
/// stream's cap (killed, `OutputLimitExceeded`), on the bound passing in the guest (`Timeout`),
/// when the stream is dropped (killed), or when the VM cannot serve (found after each
/// [`HEALTH_EVERY`] of silence, or when the guest never reports the kill past the bound: the
/// VM is then retired, `Timeout` with [`GuestCleanup::Retired`]).
async fn pump(
    sandbox: QemuSandbox,
    mut exec: qemu_vm::Exec,
    mut sender: ExecStreamSender,
    stdin: ExecStdin,
    bound: Duration,
) {
    // Stdin is fed beside the events; the call ends with the command, not with its stdin.
    let writer = exec.stdin_writer();
    let feed = tokio::spawn(async move {
        match stdin {
            ExecStdin::Closed => return,
            ExecStdin::Bytes(bytes) => {
                let _ = writer.write(&bytes).await;
            }
            ExecStdin::Reader(mut reader) => {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match reader.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if writer.write(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        }
        let _ = writer.close().await;
    });
    let _feed = AbortOnDrop(feed);
    // The guest ends the command at `bound`; the host gives up on the guest's word after a grace.
    let deadline = tokio::time::Instant::now() + bound + KILL_GRACE;
    let outcome: Result<ExecExit, SandboxError> = loop {
        let event = tokio::select! {
            event = exec.next_event() => event,
            () = sender.dropped() => {
                let _ = exec.kill().await;
                return;
            }
            () = tokio::time::sleep_until(deadline) => {
                // The guest never reported the kill: nothing says the command is gone.
                let _ = tokio::time::timeout(KILL_SEND, exec.kill()).await;
                sandbox
                    .retire(&format!(
                        "its agent did not report the end of a command {KILL_GRACE:?} past its \
                         {bound:?} bound"
                    ))
                    .await;
                break Err(SandboxError::Timeout {
                    operation: "command".to_owned(),
                    bound,
                    cleanup: Some(GuestCleanup::Retired),
                });
            }
            () = tokio::time::sleep(HEALTH_EVERY) => {
                match sandbox.fault().await {
                    None => continue,
                    Some(fault) => {
                        let _ = tokio::time::timeout(KILL_SEND, exec.kill()).await;
                        let lost = VmError::NotRunning {
                            dir: sandbox.vm_dir.clone(),
                            reason: fault.describe().to_owned(),
                        };
                        break Err(sandbox.failed("(command)", lost).await);
                    }
                }
            }
        };
        let chunk = match event {
            Ok(qemu_vm::ExecEvent::Stdout(bytes)) => ExecChunk::Stdout(bytes),
            Ok(qemu_vm::ExecEvent::Stderr(bytes)) => ExecChunk::Stderr(bytes),
            Ok(qemu_vm::ExecEvent::Exited(status)) if status.timed_out => {
                break Err(SandboxError::Timeout {
                    operation: "command".to_owned(),
                    bound,
                    cleanup: Some(GuestCleanup::Killed),
                })
            }
            Ok(qemu_vm::ExecEvent::Exited(status)) => {
                break Ok(ExecExit::exited(exit_code(&status)))
            }
            Ok(_) => continue,
            Err(error) => break Err(sandbox.failed("(command)", error).await),
        };
        match sender.send(chunk).await {
            Ok(()) => {}
            Err(SendRefused::OverCap { limit }) => {
                let _ = exec.kill().await;
                break Err(SandboxError::OutputLimitExceeded { limit });
            }
            Err(_) => {
                let _ = exec.kill().await;
                return;
            }
        }
    };
    sender.finish(outcome).await;
}

/// Ends the stdin feed with the pump (a command that exits unread leaves it waiting on credit).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn entry_kind(kind: FileKind) -> EntryKind {
    match kind {
        FileKind::File => EntryKind::File,
        FileKind::Dir => EntryKind::Directory,
        FileKind::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// The driver's error in the contract's terms, for a call about `path`.
pub(crate) fn agent_error(path: &str, error: VmError) -> SandboxError {
    match error {
        VmError::Agent { code, message } => match code {
            ErrorCode::NotFound => SandboxError::NotFound {
                path: path.to_owned(),
            },
            ErrorCode::WrongKind => SandboxError::GuestRefused {
                path: path.to_owned(),
                detail: message,
            },
            _ => SandboxError::GuestRefused {
                path: path.to_owned(),
                detail: message,
            },
        },
        VmError::Deadline { what, after } => SandboxError::EngineTimeout {
            operation: what.to_owned(),
            bound: after,
        },
        VmError::ChannelClosed { .. } | VmError::QemuExited { .. } | VmError::NotRunning { .. } => {
            SandboxError::Engine {
                detail: format!("the VM is gone: {error}"),
                source: Some(Box::new(error)),
            }
        }
        other => SandboxError::Engine {
            detail: other.to_string(),
            source: Some(Box::new(other)),
        },
    }
}

/// The exit code of an agent status: the code, or 128 + the signal as a shell reports it.
fn exit_code(status: &ExitStatus) -> i32 {
    match (status.code, status.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => -1,
    }
}

#[async_trait]
impl Sandbox for QemuSandbox {
    fn instance_id(&self) -> &str {
        &self.instance
    }

    fn freshly_created(&self) -> bool {
        self.fresh
    }

    fn storage_base(&self) -> &str {
        &self.storage_base
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        collect_exec(self, request).await
    }

    async fn exec_stream(
        &self,
        request: ExecRequest,
        stdin: ExecStdin,
    ) -> Result<ExecStream, SandboxError> {
        request.command().validate()?;
        request.guest_env().validate()?;
        // The agent enters the working directory itself and says when it cannot: one round
        // trip, and no window between a check and the start.
        let workdir = resolve_wd(request.working_dir(), &self.storage_base)?;
        let bound = request.timeout_bound();
        let mut env: Vec<(Vec<u8>, Vec<u8>)> = vec![(
            b"PATH".to_vec(),
            b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_vec(),
        )];
        // The way out, for a sandbox with allowlist egress; a command may set its own.
        for (name, value) in self.egress.iter().flat_map(|egress| &egress.env) {
            env.push((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
        for (name, value) in request.guest_env().entries() {
            env.retain(|(existing, _)| existing != name.as_bytes());
            env.push((name.as_bytes().to_vec(), value.clone()));
        }
        let agent_request = qemu_vm::ExecRequest {
            argv: request.command().to_argv(),
            env,
            workdir: workdir.into_bytes(),
            stdin: !matches!(stdin, ExecStdin::Closed),
            timeout_ms: bound.as_millis().max(1) as u64,
            user: None,
        };
        // A guest that never answers `Started` is bounded like a file call.
        let start = async {
            tokio::time::timeout(self.call_timeout, self.agent.exec(agent_request))
                .await
                .unwrap_or(Err(VmError::Deadline {
                    what: "an exec's start",
                    after: self.call_timeout,
                }))
        };
        let exec = match self.watch(start).await {
            Ok(exec) => exec,
            Err(VmError::Agent {
                code: ErrorCode::WorkdirUnusable,
                message,
            }) => {
                return Ok(ExecStream::from_output(ExecOutput::workdir_unusable(
                    message,
                )))
            }
            Err(VmError::Agent {
                code: ErrorCode::NotFound,
                message,
            }) => {
                return Ok(ExecStream::from_output(ExecOutput::exited(
                    Vec::new(),
                    format!("{message}\n").into_bytes(),
                    NOT_FOUND_EXIT,
                )))
            }
            Err(error) => return Err(self.failed("(command)", error).await),
        };
        let (sender, stream) = ExecStream::channel(request.output_cap());
        // The pump owns the exec: when the stream is dropped it kills the command's group, and
        // dropping the exec itself kills it too, so nothing outlives an abandoned call.
        tokio::spawn(pump(self.clone(), exec, sender, stdin, bound));
        Ok(stream)
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        if content.len() as u64 > self.files_in {
            return Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit: self.files_in,
            });
        }
        let wd = resolve_wd(wd, &self.storage_base)?;
        let resolved = Access::Write
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        if let Some((parent, _)) = resolved.rsplit_once('/') {
            if !parent.is_empty() && self.stat_kind(parent.to_owned()).await?.is_none() {
                self.helper(&[b"/bin/mkdir", b"-p", b"--", parent.as_bytes()], path)
                    .await?;
            }
        }
        if self.stat_kind(resolved.clone()).await? == Some(EntryKind::Directory) {
            return Err(SandboxError::IsADirectory {
                path: path.to_owned(),
            });
        }
        let write = self
            .agent
            .write_file(resolved.as_bytes(), 0o644, content, self.call_timeout);
        match self.watch(write).await {
            Ok(_) => Ok(()),
            Err(error) => Err(self.failed(path, error).await),
        }
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        let wd = resolve_wd(wd, &self.storage_base)?;
        let resolved = Access::Read
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        match self
            .watch(self.agent.stat(resolved.as_bytes(), self.call_timeout))
            .await
        {
            Ok(stat) => {
                let kind = entry_kind(stat.kind);
                let size = (kind == EntryKind::File).then_some(stat.size);
                Ok(Some(SandboxEntry::new(
                    guest_path::reported(&resolved, &wd),
                    kind,
                    size,
                )))
            }
            Err(VmError::Agent {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(None),
            Err(error) => Err(self.failed(path, error).await),
        }
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
        let wd = resolve_wd(wd, &self.storage_base)?;
        let resolved = Access::List
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        let entries = match self
            .watch(self.agent.list(resolved.as_bytes(), self.call_timeout))
            .await
        {
            Ok(entries) => entries,
            Err(error) => return Err(self.failed(path, error).await),
        };
        let mut listed: Vec<SandboxEntry> = entries
            .into_iter()
            .map(|entry| {
                let name = String::from_utf8_lossy(&entry.name).into_owned();
                let kind = entry_kind(entry.kind);
                let size = (kind == EntryKind::File).then_some(entry.size);
                SandboxEntry::new(
                    guest_path::reported(&guest_path::join(&resolved, &name), &wd),
                    kind,
                    size,
                )
            })
            .collect();
        listed.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(listed)
    }

    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        let wd = resolve_wd(wd, &self.storage_base)?;
        let resolved = Access::Delete
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        if !recursive && self.stat_kind(resolved.clone()).await? == Some(EntryKind::Directory) {
            return Err(SandboxError::IsADirectory {
                path: path.to_owned(),
            });
        }
        match self
            .watch(
                self.agent
                    .remove(resolved.as_bytes(), recursive, self.call_timeout),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(VmError::Agent {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(()),
            Err(VmError::Agent {
                code: ErrorCode::WrongKind,
                ..
            }) if !recursive => Err(SandboxError::IsADirectory {
                path: path.to_owned(),
            }),
            Err(error) => Err(self.failed(path, error).await),
        }
    }

    /// A new VM restored from the baseline takes this one's place: every file, process and
    /// mount made since the acquire goes with the old VM.
    async fn reset(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let mut reset = self
            .resets
            .reset(&self.slot, self.egress_plan.clone())
            .await?;
        reset.files_in = self.files_in;
        Ok(shared(reset))
    }

    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        let removal = self.remove(directory, wd, true);
        match tokio::time::timeout(timeout, removal).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SandboxError::Timeout {
                operation: "reclaim".to_owned(),
                bound: timeout,
                cleanup: None,
            }),
        }
    }
}

/// Shared handles, as the trait hands them out.
pub(crate) fn shared(sandbox: QemuSandbox) -> Arc<dyn Sandbox> {
    Arc::new(sandbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reads_as_a_shell_would_report_it() {
        let status = |code, signal| ExitStatus {
            code,
            signal,
            timed_out: false,
            killed: false,
        };
        assert_eq!(exit_code(&status(Some(3), None)), 3);
        assert_eq!(exit_code(&status(None, Some(9))), 137);
        assert_eq!(exit_code(&status(None, None)), -1);
    }

    #[test]
    fn driver_errors_map_to_the_contract() {
        let missing = agent_error(
            "a.txt",
            VmError::Agent {
                code: ErrorCode::NotFound,
                message: "gone".into(),
            },
        );
        assert_eq!(missing.kind(), sandbox_core::ErrorKind::NotFound);
        let slow = agent_error(
            "a.txt",
            VmError::Deadline {
                what: "read",
                after: Duration::from_secs(1),
            },
        );
        assert_eq!(slow.kind(), sandbox_core::ErrorKind::EngineTimeout);
        let gone = agent_error(
            "a.txt",
            VmError::ChannelClosed {
                reason: "eof".into(),
            },
        );
        assert_eq!(gone.kind(), sandbox_core::ErrorKind::Engine);
    }
}
