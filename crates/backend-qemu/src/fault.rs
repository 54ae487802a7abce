//! What a handle does when its VM cannot serve: it finds out why (QEMU gone, the guest
//! stopped, the agent silent), answers with the contract's kind, and retires a VM that still
//! runs but cannot be trusted to serve, so no later call or acquire reuses it.
//!
//! A call that waits on the guest checks the VM every [`HEALTH_EVERY`] of silence, so a VM whose
//! QEMU died or whose guest QEMU stopped (a full host disk under its overlay stops it) fails the
//! call at once instead of at its deadline. Retiring marks the record (when it still names the
//! instance) and kills QEMU: the next acquire replaces the VM, and nothing of it runs on. A
//! guest paused by a save (a fork of it under way) is no fault: the call waits on.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use qemu_vm::{Vm, VmError};
use sandbox_core::backend_kit::run_detached;
use sandbox_core::SandboxError;

use crate::handle::{agent_error, QemuSandbox};

/// How long a call waits on a silent guest before it checks that the VM still serves.
pub(crate) const HEALTH_EVERY: Duration = Duration::from_secs(2);

/// How long a retirement waits for the name's lock to mark the record (another call may hold
/// it); QEMU is killed either way.
const RETIRE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// How long a QEMU whose monitor no longer answers is given to finish exiting before it
/// counts as running.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Whether QEMU's run state is one a save leaves (a fork pauses its source, saves it, then
/// runs it on): no fault. A save whose process died leaves it so; the next acquire, which
/// takes the name's lock the save held, runs the VM on.
pub(crate) fn paused_by_a_save(status: &str) -> bool {
    matches!(status, "paused" | "finish-migrate" | "postmigrate")
}

/// Whether `vm`'s QEMU ends within `grace`.
async fn exits_within(vm: &Vm, grace: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + grace;
    while vm.is_alive() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Why a VM cannot serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// QEMU is not running: killed, or exited with the guest (a kernel panic reboots, which
    /// `-no-reboot` turns into QEMU's exit).
    Gone(String),
    /// QEMU runs but the guest is stopped (QEMU stops it on a write error of its disk, as when
    /// the host file system under its overlay is full).
    Stopped(String),
}

impl QemuSandbox {
    /// The VM's fault, if it has one. A monitor that does not answer is no verdict.
    pub(crate) async fn fault(&self) -> Option<Fault> {
        let vm = match Vm::attach(&self.vm_dir) {
            Ok(vm) => vm,
            Err(error) => return Some(Fault::Gone(error.to_string())),
        };
        match vm.status().await {
            Ok(status) if status.running || paused_by_a_save(&status.status) => None,
            Ok(status) => Some(Fault::Stopped(stopped_reason(
                &status.status,
                free_bytes(&self.vm_dir),
                &self.vm_dir,
            ))),
            Err(_) if !vm.is_alive() => Some(Fault::Gone("QEMU exited".to_owned())),
            // QEMU runs but its monitor is closed: it may be on its way out (a guest reset under
            // `-no-reboot` closes its sockets before the process ends, which on a loaded host
            // takes long enough to be seen in between).
            Err(_) => exits_within(&vm, EXIT_GRACE)
                .await
                .then(|| Fault::Gone("QEMU exited".to_owned())),
        }
    }

    /// Runs an agent call, checking the VM after every [`HEALTH_EVERY`] without an answer; a
    /// VM found faulty ends the call with [`VmError::NotRunning`], which [`failed`](Self::failed)
    /// turns into the contract's kind.
    pub(crate) async fn watch<T>(
        &self,
        call: impl Future<Output = Result<T, VmError>>,
    ) -> Result<T, VmError> {
        tokio::pin!(call);
        loop {
            tokio::select! {
                result = &mut call => return result,
                () = tokio::time::sleep(HEALTH_EVERY) => {
                    if let Some(fault) = self.fault().await {
                        return Err(VmError::NotRunning {
                            dir: self.vm_dir.clone(),
                            reason: fault.describe().to_owned(),
                        });
                    }
                }
            }
        }
    }

    /// A failed agent call about `path` in the contract's terms. The VM gone is
    /// [`SandboxError::SandboxGone`] (or [`SandboxError::Retired`] when this backend retired
    /// it); a VM whose guest is stopped, whose agent's channel closed while QEMU runs, or whose
    /// agent did not answer in time is retired first.
    pub(crate) async fn failed(&self, path: &str, error: VmError) -> SandboxError {
        match error {
            VmError::ChannelClosed { .. }
            | VmError::QemuExited { .. }
            | VmError::NotRunning { .. } => self.lost(error).await,
            VmError::Deadline { what, after } => {
                if self.fault().await.is_some() {
                    return self.lost(VmError::Deadline { what, after }).await;
                }
                self.retire(&format!("its agent did not answer {what} within {after:?}"))
                    .await;
                SandboxError::EngineTimeout {
                    operation: what.to_owned(),
                    bound: after,
                }
            }
            other => agent_error(path, other),
        }
    }

    /// The channel to the guest is gone or useless: say why, retiring a VM that still runs.
    async fn lost(&self, error: VmError) -> SandboxError {
        if let Some(reason) = self.retired_reason() {
            return SandboxError::Retired {
                instance: self.instance.clone(),
                reason,
            };
        }
        let reason = match self.fault().await {
            Some(Fault::Gone(_)) => {
                return SandboxError::SandboxGone {
                    instance: self.instance.clone(),
                }
            }
            Some(Fault::Stopped(reason)) => reason,
            None => format!("its agent's channel closed while QEMU ran ({error})"),
        };
        self.retire(&reason).await;
        SandboxError::Engine {
            detail: format!("VM {} was retired: {reason}", self.instance),
            source: Some(Box::new(error)),
        }
    }

    /// Why the record says this VM was retired, if it does.
    pub(crate) fn retired_reason(&self) -> Option<String> {
        self.slot
            .read_record()
            .ok()
            .flatten()
            .filter(|record| record.instance == self.instance)
            .and_then(|record| record.retired)
    }

    /// Retires the VM: its record says why (when it still names this instance) and its QEMU is
    /// killed, so no later call or acquire reuses it and nothing of it runs on. Runs to its end
    /// even when the caller's future is dropped.
    pub(crate) async fn retire(&self, reason: &str) {
        let slot = self.slot.clone();
        let instance = self.instance.clone();
        let dir = self.vm_dir.clone();
        let reason = reason.to_owned();
        let creating = self.creating;
        let work = async move {
            tracing::warn!(%instance, %reason, "retiring a VM");
            if creating {
                // The name's lock is the creation's, which removes the record: waiting on it
                // here would only add the wait.
            } else if let Err(error) = slot.retire(&instance, &reason, RETIRE_LOCK_WAIT).await {
                tracing::warn!(%instance, %error, "the retired VM's record was not marked");
            }
            if let Ok(vm) = Vm::attach(&dir) {
                if let Err(error) = vm.kill().await {
                    tracing::warn!(%instance, %error, "the retired VM's QEMU was not killed");
                }
            }
        };
        let _ = run_detached(work).await;
    }
}

impl Fault {
    pub(crate) fn describe(&self) -> &str {
        match self {
            Fault::Gone(why) | Fault::Stopped(why) => why,
        }
    }
}

/// Why QEMU stopped the guest, in words: with `io-error` (its disk's write failed on the host),
/// how much room the host file system under the VM's directory has left.
pub(crate) fn stopped_reason(status: &str, free: Option<u64>, dir: &Path) -> String {
    match (status, free) {
        ("io-error", Some(free)) if free < FULL_BELOW => format!(
            "QEMU stopped the guest on a failed write of its disk: the host disk holding {} is \
             full ({free} bytes free)",
            dir.display()
        ),
        ("io-error", _) => format!(
            "QEMU stopped the guest on a failed write of its disk overlay under {} (host disk \
             or I/O error)",
            dir.display()
        ),
        (status, _) => format!("QEMU stopped the guest (run state {status:?})"),
    }
}

/// Below this many free bytes a host file system counts as full: QEMU's overlay grows by
/// clusters of 64 KiB and more.
const FULL_BELOW: u64 = 1 << 20;

/// The bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_guest_names_a_full_host_disk() {
        let dir = Path::new("/state/vms/vm-1");
        let full = stopped_reason("io-error", Some(4096), dir);
        assert!(
            full.contains("host disk") && full.contains("full"),
            "{full}"
        );
        assert!(full.contains("/state/vms/vm-1"), "{full}");
        let roomy = stopped_reason("io-error", Some(10 << 30), dir);
        assert!(!roomy.contains("full"), "{roomy}");
        assert!(roomy.contains("disk"), "{roomy}");
        let other = stopped_reason("guest-panicked", None, dir);
        assert!(other.contains("guest-panicked"), "{other}");
    }
}
