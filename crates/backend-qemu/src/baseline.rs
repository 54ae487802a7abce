//! Baseline snapshots: one saved VM per machine (the image and the limits), made by booting once
//! and saving the booted guest, restored by every new sandbox instead of a boot.
//!
//! They live under the state directory, in `.snapshots/<image digest>/<machine>/` (the files of
//! `qemu_vm::Snapshot`), owned by the backend: made under a lock file beside them (one process
//! boots, the others wait and load what it saved), replaced when a restore refuses them, and
//! removed at connect once their image is no longer the configured one (nothing restores them
//! then). A restored VM copies the disk layer into its own directory, so no VM depends on a
//! baseline once it runs.
//!
//! Not here: the restore itself and the guest's renewal (`qemu_vm::Snapshot::restore`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use qemu_vm::{Snapshot, Vm, VmConfig};
use sandbox_core::backend_kit::CleanupOnDrop;
use sandbox_core::SandboxError;

use crate::layout;

/// The state directory's directory of baselines.
pub(crate) const SNAPSHOTS: &str = ".snapshots";

/// How many hex digits of a digest name a directory.
const NAME_DIGITS: usize = 16;

/// The baselines of one image under one state directory.
#[derive(Debug, Clone)]
pub(crate) struct Baselines {
    /// `<state>/.snapshots/<image digest>`.
    dir: PathBuf,
}

impl Baselines {
    /// The baselines of the image whose digest is `image_digest`.
    pub(crate) fn new(state_dir: &Path, image_digest: &str) -> Baselines {
        let name: String = image_digest.chars().take(NAME_DIGITS).collect();
        Baselines {
            dir: state_dir.join(SNAPSHOTS).join(name),
        }
    }

    /// Removes every other image's baselines under `state_dir`: no VM restores them any more.
    pub(crate) fn remove_others(&self) {
        let Some(root) = self.dir.parent() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(root) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.path() != self.dir {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Where the baseline of `machine` lives.
    fn dir_of(&self, machine: &str) -> PathBuf {
        self.dir
            .join(machine.chars().take(NAME_DIGITS).collect::<String>())
    }

    /// The baseline of `config`'s machine: loaded when saved, else made by booting a VM like
    /// `config` (named `name`, in `config.parent_dir`), waiting up to `boot_timeout` for its
    /// agent, and saving it. One process makes it; the others wait on its lock.
    ///
    /// # Errors
    /// An engine error when the boot or the save fails; the half-made baseline and its VM are
    /// gone then (also when the future is dropped).
    pub(crate) async fn get(
        &self,
        config: &VmConfig,
        name: String,
        boot_timeout: Duration,
    ) -> Result<Snapshot, SandboxError> {
        let machine = Snapshot::machine_of(config);
        let dir = self.dir_of(&machine);
        if let Ok(snapshot) = Snapshot::load(&dir) {
            return Ok(snapshot);
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|source| layout::io_error("create", &self.dir, source))?;
        let _lock = self.lock(&dir).await?;
        if let Ok(snapshot) = Snapshot::load(&dir) {
            return Ok(snapshot);
        }
        // A baseline that does not load is replaced.
        let _ = std::fs::remove_dir_all(&dir);
        let boot = VmConfig {
            name,
            ..config.clone()
        };
        let vm_dir = boot.dir();
        let partial = self.dir.join(format!(".partial-{}", boot.name));
        let (undo_vm, undo_partial) = (vm_dir.clone(), partial.clone());
        let mut cleanup = CleanupOnDrop::armed("discard a half-made baseline", async move {
            if let Ok(vm) = Vm::attach(&undo_vm) {
                let _ = vm.kill().await;
            }
            let _ = std::fs::remove_dir_all(&undo_vm);
            let _ = std::fs::remove_dir_all(&undo_partial);
        });
        let engine = |what: &str, error: qemu_vm::VmError| {
            SandboxError::engine(format!("the baseline snapshot: {what}: {error}"))
        };
        let vm = Vm::start(&boot)
            .await
            .map_err(|error| engine("boot", error))?;
        // Saved with no host connection open, as every restored copy starts.
        drop(
            vm.agent(boot_timeout)
                .await
                .map_err(|error| engine("boot", error))?,
        );
        let saved = Snapshot::save(&vm, &machine, &partial)
            .await
            .map_err(|error| engine("save", error));
        let _ = vm.kill().await;
        saved?;
        std::fs::rename(&partial, &dir)
            .map_err(|source| layout::io_error("rename", &partial, source))?;
        cleanup.disarm();
        let _ = std::fs::remove_dir_all(&vm_dir);
        Snapshot::load(&dir).map_err(|error| engine("load", error))
    }

    /// Removes a baseline a restore refused (under its lock), so the next acquire makes it anew.
    pub(crate) async fn discard(&self, snapshot: &Snapshot) {
        if let Ok(_lock) = self.lock(&snapshot.dir).await {
            if Snapshot::load(&snapshot.dir).ok().as_ref() == Some(snapshot) {
                let _ = std::fs::remove_dir_all(&snapshot.dir);
            }
        }
    }

    /// The lock of the baseline in `dir`, held until the file is dropped.
    async fn lock(&self, dir: &Path) -> Result<std::fs::File, SandboxError> {
        layout::lock_file(dir.with_extension("lock")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_has_its_own_directory_and_the_others_go() {
        let state = tempfile::tempdir().unwrap();
        let current = Baselines::new(state.path(), &"a".repeat(64));
        let old = Baselines::new(state.path(), &"b".repeat(64));
        assert_eq!(
            current.dir,
            state.path().join(SNAPSHOTS).join("a".repeat(16))
        );
        assert_eq!(
            current.dir_of(&"c".repeat(64)),
            current.dir.join("c".repeat(16))
        );
        std::fs::create_dir_all(current.dir.join("m")).unwrap();
        std::fs::create_dir_all(old.dir.join("m")).unwrap();
        current.remove_others();
        assert!(current.dir.join("m").exists());
        assert!(!old.dir.exists());
    }
}
