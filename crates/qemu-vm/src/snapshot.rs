//! Saved VMs: a running VM saved to a directory of files, and a new VM restored from them
//! instead of booted.
//!
//! A snapshot directory holds `memory` (QEMU's migration stream: every device's state and the
//! guest's RAM), `disk.qcow2` (a copy of the VM's root overlay at that moment, still backed by
//! the image's raw root) and `snapshot.json` (the machine it was saved from and the SHA-256 of
//! both files), written last. A restore refuses, before QEMU reads a byte, a snapshot of another
//! machine or one whose files do not match their digests: a corrupted or foreign file is never
//! loaded. The disk is copied into the new VM's directory and checked in the same pass, and the
//! memory is read through the very descriptor QEMU gets, so what was checked is what loads.
//!
//! A restored guest is the saved one to the byte, so before the restore returns the driver
//! renews it (`HostMsg::Renew`): fresh entropy from this host and a reseeded generator, the
//! clock set, a host name of its own. No command can run in it before that.
//!
//! QEMU runs under `-sandbox spawn=deny`, so it cannot start `exec:` helpers: it saves into a
//! descriptor handed over QMP (`getfd`, `migrate fd:`) and restores from one it inherits
//! (`-incoming fd:`).
//!
//! Not here: which snapshots exist and when they go (the caller owns the directories).

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::client::AgentClient;
use crate::disk::ROOT_OVERLAY;
use crate::error::VmError;
use crate::image::hex;
use crate::machine::{host_tsc_khz, Vm, VmConfig};
use crate::qmp::QmpSession;
use crate::run_as::{RunAs, Spelling};

/// The migration stream's file in a snapshot directory.
pub const SNAPSHOT_MEMORY: &str = "memory";

/// The disk layer's file in a snapshot directory.
pub const SNAPSHOT_DISK: &str = "disk.qcow2";

/// The manifest's file in a snapshot directory, written last.
pub const SNAPSHOT_MANIFEST: &str = "snapshot.json";

/// The manifest's format.
const FORMAT: u64 = 1;

/// The most a manifest may hold (it is a few hundred bytes).
const MANIFEST_CAP: u64 = 64 * 1024;

/// How long a save may take: the guest's RAM is written once (about 0.7 s for a booted 2 GiB
/// guest under TCG, most pages empty; longer for a guest holding much).
const SAVE_DEADLINE: Duration = Duration::from_secs(120);

/// How often a save's progress is polled.
const SAVE_POLL: Duration = Duration::from_millis(20);

/// The descriptor number a restoring QEMU reads its migration stream from: above the QMP
/// listener (3) and every agent port (4 up to 4 + the most ports).
pub(crate) const INCOMING_FD: i32 = 4 + vm_agent::proto::MAX_PORTS as i32;

/// A saved VM: its directory and what its manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// The machine it was saved from ([`Snapshot::machine_of`]).
    pub machine: String,
    /// The SHA-256 of `memory`, hex.
    pub memory_sha256: String,
    /// The SHA-256 of `disk.qcow2`, hex.
    pub disk_sha256: String,
}

impl Snapshot {
    /// The snapshot in `dir`, as its manifest says (its files are checked by a restore).
    ///
    /// # Errors
    /// SnapshotRefused when the manifest is missing, too large, or not one of this format.
    pub fn load(dir: &Path) -> Result<Snapshot, VmError> {
        let path = dir.join(SNAPSHOT_MANIFEST);
        let file = std::fs::File::open(&path)
            .map_err(|e| VmError::snapshot_refused(dir, format!("no manifest: {e}")))?;
        let mut text = String::new();
        file.take(MANIFEST_CAP + 1)
            .read_to_string(&mut text)
            .map_err(|e| VmError::snapshot_refused(dir, format!("the manifest: {e}")))?;
        if text.len() as u64 > MANIFEST_CAP {
            return Err(VmError::snapshot_refused(dir, "the manifest is too large"));
        }
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| VmError::snapshot_refused(dir, format!("the manifest: {e}")))?;
        let field = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_str)
                .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(str::to_owned)
                .ok_or_else(|| {
                    VmError::snapshot_refused(dir, format!("the manifest has no valid {name}"))
                })
        };
        if value.get("format").and_then(serde_json::Value::as_u64) != Some(FORMAT) {
            return Err(VmError::snapshot_refused(
                dir,
                "the manifest is not of this driver's format",
            ));
        }
        Ok(Snapshot {
            dir: dir.to_owned(),
            machine: field("machine")?,
            memory_sha256: field("memory_sha256")?,
            disk_sha256: field("disk_sha256")?,
        })
    }

    fn write_manifest(&self) -> Result<(), VmError> {
        let text = serde_json::json!({
            "format": FORMAT,
            "machine": self.machine,
            "memory_sha256": self.memory_sha256,
            "disk_sha256": self.disk_sha256,
        })
        .to_string();
        let path = self.dir.join(SNAPSHOT_MANIFEST);
        let partial = self.dir.join(format!("{SNAPSHOT_MANIFEST}.partial"));
        std::fs::write(&partial, text).map_err(|e| VmError::io("writing", &partial, e))?;
        std::fs::rename(&partial, &path).map_err(|e| VmError::io("renaming", &partial, e))
    }
}

impl Snapshot {
    /// What a VM of `config` is to a restore: the SHA-256 of the image's digest and of the
    /// command line every VM of it gets (devices, memory, CPUs, accelerator, kernel command
    /// line, the host's TSC rate), without what differs between two VMs of it (name, directory,
    /// QEMU's user). A snapshot restores only into a config of the same digest.
    pub fn machine_of(config: &VmConfig) -> String {
        let normalised = VmConfig {
            name: "machine".to_owned(),
            parent_dir: PathBuf::from("/"),
            run_as: RunAs::Invoker,
            ..config.clone()
        };
        let mut hasher = Sha256::new();
        hasher.update(config.image.digest.as_bytes());
        for arg in normalised.qemu_args(host_tsc_khz(), Spelling::RunWith) {
            hasher.update([0]);
            hasher.update(arg.as_bytes());
        }
        hex(&hasher.finalize())
    }
}

/// The SHA-256 of `file` from its start, read with positioned reads so its offset stays at 0
/// for the process that reads it next.
fn digest_at_start(file: &std::fs::File, path: &Path) -> Result<String, VmError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1024 * 1024];
    let mut at = 0u64;
    loop {
        let n = file
            .read_at(&mut buf, at)
            .map_err(|e| VmError::io("reading", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex(&hasher.finalize()))
}

/// Copies `from` to a new file `to` (mode 0600) and returns the SHA-256 of what was copied.
fn copy_digest(from: &Path, to: &Path) -> Result<String, VmError> {
    let mut source = std::fs::File::open(from).map_err(|e| VmError::io("opening", from, e))?;
    let mut target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| VmError::io("creating", to, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1024 * 1024];
    loop {
        let n = source
            .read(&mut buf)
            .map_err(|e| VmError::io("reading", from, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        target
            .write_all(&buf[..n])
            .map_err(|e| VmError::io("writing", to, e))?;
    }
    Ok(hex(&hasher.finalize()))
}

/// Moves `from` to `to` (which must not exist) and returns the SHA-256 of the file there.
fn move_digest(from: &Path, to: &Path) -> Result<String, VmError> {
    if to.exists() {
        return Err(VmError::io(
            "creating",
            to,
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    std::fs::rename(from, to).map_err(|e| VmError::io("moving", from, e))?;
    let moved = std::fs::File::open(to).map_err(|e| VmError::io("opening", to, e))?;
    digest_at_start(&moved, to)
}

/// How a restore gets its disk layer.
#[derive(Debug, Clone, Copy)]
enum DiskLayer {
    /// Copied: the snapshot stays whole for the next restore.
    Copied,
    /// Moved: the snapshot is restored once.
    Moved,
}

use std::os::unix::fs::OpenOptionsExt;

/// The pace a save asks QEMU for, in bytes per second: far above what a file takes, so the
/// save runs as fast as QEMU writes.
const SAVE_BANDWIDTH: u64 = 64 * 1024 * 1024 * 1024;

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, VmError> + Send + 'static,
) -> Result<T, VmError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| VmError::Invalid(format!("a file task failed: {e}")))?
}

impl Snapshot {
    /// Saves `vm` into `dir` (made here; it must not exist): pauses it, streams its devices
    /// and memory into `memory`, copies its root overlay to `disk.qcow2`, and writes the
    /// manifest with `machine` (the [`Snapshot::machine_of`] its config) and both files'
    /// digests. The VM stays paused: [`Vm::resume`] runs it on, or it is killed.
    ///
    /// Save a VM while no host connection is open on its agent ports (each restored copy
    /// starts with none), or its agent ends those sessions when it is restored.
    ///
    /// # Errors
    /// Io for a file step; Qmp when QEMU refuses or fails the migration; Deadline past
    /// its deadline (two minutes). `dir` may then hold part of a snapshot, never a manifest:
    /// remove it.
    pub async fn save(vm: &Vm, machine: &str, dir: &Path) -> Result<Snapshot, VmError> {
        std::fs::create_dir(dir).map_err(|e| VmError::io("creating", dir, e))?;
        let memory_path = dir.join(SNAPSHOT_MEMORY);
        let memory = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&memory_path)
            .map_err(|e| VmError::io("creating", &memory_path, e))?;
        let qmp = vm.dir().join("qmp.sock");
        let migrate = async {
            let mut session = QmpSession::open(&qmp).await?;
            session
                .execute(serde_json::json!({"execute": "stop"}), None)
                .await?;
            // QEMU paces a migration at 128 MiB/s unless told otherwise, which made the save
            // of a guest holding 170 MB take a second; the guest is stopped, so nothing gains
            // from the pacing.
            session
                .execute(
                    serde_json::json!({
                        "execute": "migrate-set-parameters",
                        "arguments": {"max-bandwidth": SAVE_BANDWIDTH},
                    }),
                    None,
                )
                .await?;
            session
                .execute(
                    serde_json::json!({"execute": "getfd", "arguments": {"fdname": "snapshot"}}),
                    Some(memory.as_fd()),
                )
                .await?;
            session
                .execute(
                    serde_json::json!({"execute": "migrate", "arguments": {"uri": "fd:snapshot"}}),
                    None,
                )
                .await?;
            loop {
                let answer = session
                    .execute(serde_json::json!({"execute": "query-migrate"}), None)
                    .await?;
                let status = answer
                    .pointer("/return/status")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                match status.as_str() {
                    "completed" => return Ok(()),
                    "failed" | "cancelled" => {
                        return Err(VmError::Qmp {
                            message: format!("the save ended {status}: {answer}"),
                        })
                    }
                    _ => tokio::time::sleep(SAVE_POLL).await,
                }
            }
        };
        tokio::time::timeout(SAVE_DEADLINE, migrate)
            .await
            .map_err(|_| VmError::Deadline {
                what: "a VM's save",
                after: SAVE_DEADLINE,
            })??;
        let overlay = vm.dir().join(ROOT_OVERLAY);
        let disk = dir.join(SNAPSHOT_DISK);
        // The two digests at once, one on each core. Neither file is synced: a file a crash
        // tore fails its digest at the next restore, which refuses it.
        let (memory_sha256, disk_sha256) = tokio::try_join!(
            blocking(move || digest_at_start(&memory, &memory_path)),
            blocking(move || copy_digest(&overlay, &disk)),
        )?;
        let snapshot = Snapshot {
            dir: dir.to_owned(),
            machine: machine.to_owned(),
            memory_sha256,
            disk_sha256,
        };
        snapshot.write_manifest()?;
        Ok(snapshot)
    }

    /// Starts a VM for `config` from this snapshot instead of booting: refuses a snapshot of
    /// another machine or whose files do not match their digests (nothing is loaded then),
    /// copies its disk into the VM's directory, starts QEMU reading its memory, waits for the
    /// guest to run and its agent to answer, and renews the guest (fresh entropy, the clock,
    /// the VM's name as its host name) before returning the VM and the connection that renewed
    /// it. All within `timeout`.
    ///
    /// # Errors
    /// SnapshotRefused for a snapshot that may not be loaded; Io when the directory exists or a
    /// file step fails; QemuExited when QEMU fails to load it; BootTimeout or Deadline past
    /// `timeout`; Agent when the guest cannot renew itself. On any error after QEMU started, it
    /// is killed and the directory removed.
    ///
    /// # Cancel safety and drop
    /// A future dropped mid-restore may leave the VM's directory (and a QEMU in it): a caller
    /// discards the directory, as after a dropped [`Vm::start`].
    pub async fn restore(
        &self,
        config: &VmConfig,
        timeout: Duration,
    ) -> Result<(Vm, AgentClient), VmError> {
        self.restore_with(config, timeout, DiskLayer::Copied).await
    }

    /// [`restore`](Self::restore) of a snapshot restored once (a fork's): its disk layer is
    /// moved into the VM's directory, then checked there, instead of copied; the snapshot's
    /// directory no longer holds a whole snapshot afterwards, and is the caller's to remove.
    ///
    /// # Errors
    /// As [`restore`](Self::restore).
    ///
    /// # Cancel safety and drop
    /// As [`restore`](Self::restore).
    pub async fn restore_once(
        self,
        config: &VmConfig,
        timeout: Duration,
    ) -> Result<(Vm, AgentClient), VmError> {
        self.restore_with(config, timeout, DiskLayer::Moved).await
    }

    async fn restore_with(
        &self,
        config: &VmConfig,
        timeout: Duration,
        layer: DiskLayer,
    ) -> Result<(Vm, AgentClient), VmError> {
        let snapshot = self;
        let started = Instant::now();
        let expected = Snapshot::machine_of(config);
        if snapshot.machine != expected {
            return Err(VmError::snapshot_refused(
                &snapshot.dir,
                format!(
                    "it was saved from another machine ({}, not {expected})",
                    snapshot.machine
                ),
            ));
        }
        let dir = config.dir();
        let prepared = Vm::prepare(config).await?;
        let memory_path = snapshot.dir.join(SNAPSHOT_MEMORY);
        let disk_path = snapshot.dir.join(SNAPSHOT_DISK);
        let overlay = dir.join(ROOT_OVERLAY);
        let (want_memory, want_disk) =
            (snapshot.memory_sha256.clone(), snapshot.disk_sha256.clone());
        let (disk_dir, memory_dir) = (snapshot.dir.clone(), snapshot.dir.clone());
        // The disk's copy and the memory's digest at once, one on each core; QEMU starts only
        // when both match.
        let checked = tokio::try_join!(
            blocking(move || {
                let disk = match layer {
                    DiskLayer::Copied => copy_digest(&disk_path, &overlay)?,
                    DiskLayer::Moved => move_digest(&disk_path, &overlay)?,
                };
                if disk != want_disk {
                    return Err(VmError::snapshot_refused(
                        &disk_dir,
                        format!(
                            "{SNAPSHOT_DISK} has digest {disk}, not its manifest's {want_disk}"
                        ),
                    ));
                }
                Ok(())
            }),
            blocking(move || {
                let memory = std::fs::File::open(&memory_path)
                    .map_err(|e| VmError::io("opening", &memory_path, e))?;
                let digest = digest_at_start(&memory, &memory_path)?;
                if digest != want_memory {
                    return Err(VmError::snapshot_refused(
                        &memory_dir,
                        format!(
                            "{SNAPSHOT_MEMORY} has digest {digest}, not its manifest's \
                             {want_memory}"
                        ),
                    ));
                }
                Ok(memory)
            }),
        )
        .map(|((), memory)| memory);
        let memory = match checked {
            Ok(memory) => memory,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        let vm = Vm::launch(&prepared, Some(&memory)).await?;
        drop(memory);
        match finish_restore(&vm, config, started, timeout).await {
            Ok(agent) => Ok((vm, agent)),
            Err(error) => {
                let error = match error {
                    VmError::ChannelClosed { .. } | VmError::Qmp { .. } if !vm.is_alive() => {
                        VmError::QemuExited {
                            detail: vm.log_tail(),
                        }
                    }
                    other => other,
                };
                let _ = vm.kill().await;
                Err(error)
            }
        }
    }
}

/// Waits for a restored VM to run, connects to its agent and renews the guest.
async fn finish_restore(
    vm: &Vm,
    config: &VmConfig,
    started: Instant,
    timeout: Duration,
) -> Result<AgentClient, VmError> {
    let past = || VmError::BootTimeout { after: timeout };
    loop {
        if !vm.is_alive() {
            return Err(VmError::QemuExited {
                detail: vm.log_tail(),
            });
        }
        let status = vm.status().await?;
        if status.running {
            break;
        }
        if status.status == "paused" {
            // Loaded: the guest was paused for its save, and is paused again now.
            vm.resume().await?;
            continue;
        }
        if !matches!(status.status.as_str(), "inmigrate" | "prelaunch") {
            return Err(VmError::Qmp {
                message: format!("the restored VM is {}", status.status),
            });
        }
        if started.elapsed() > timeout {
            return Err(past());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = timeout.saturating_sub(started.elapsed());
    let agent = vm.agent(left).await?;
    let identity: String = config
        .name
        .chars()
        .map(|c| if c == '_' { '-' } else { c })
        .take(vm_agent::proto::MAX_IDENTITY)
        .collect();
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(2));
    agent.renew(&identity, left).await?;
    Ok(agent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::VmImage;

    fn config(name: &str) -> VmConfig {
        let image = VmImage {
            kernel: "/img/vmlinux".into(),
            initramfs: "/img/initramfs".into(),
            rootfs: "/img/rootfs.ext4".into(),
            kernel_release: "6.1.0-test".into(),
            digest: "0".repeat(64),
        };
        VmConfig::new(image, "/run/vms", name)
    }

    #[test]
    fn the_machine_ignores_the_vm_and_follows_its_config() {
        let a = config("a");
        let b = VmConfig {
            parent_dir: "/elsewhere".into(),
            run_as: RunAs::Ids {
                uid: 2_000_000_001,
                gid: 2_000_000_001,
            },
            ..config("b")
        };
        assert_eq!(Snapshot::machine_of(&a), Snapshot::machine_of(&b));
        assert_eq!(Snapshot::machine_of(&a).len(), 64);
        let mut bigger = config("a");
        bigger.memory_mib *= 2;
        let mut ports = config("a");
        ports.agent_ports += 1;
        let mut image = config("a");
        image.image.digest = "1".repeat(64);
        let mut args = config("a");
        args.kernel_args.push("debug".into());
        for other in [bigger, ports, image, args] {
            assert_ne!(Snapshot::machine_of(&a), Snapshot::machine_of(&other));
        }
    }

    fn saved(dir: &Path, memory: &[u8], disk: &[u8]) -> Snapshot {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(SNAPSHOT_MEMORY), memory).unwrap();
        std::fs::write(dir.join(SNAPSHOT_DISK), disk).unwrap();
        let snapshot = Snapshot {
            dir: dir.to_owned(),
            machine: Snapshot::machine_of(&config("x")),
            memory_sha256: hex(&Sha256::digest(memory)),
            disk_sha256: hex(&Sha256::digest(disk)),
        };
        snapshot.write_manifest().unwrap();
        snapshot
    }

    #[test]
    fn a_manifest_round_trips_and_a_bad_one_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("s");
        let snapshot = saved(&dir, b"mem", b"disk");
        assert_eq!(Snapshot::load(&dir).unwrap(), snapshot);
        for bad in [
            "not json",
            r#"{"format": 2, "machine": "00", "memory_sha256": "00", "disk_sha256": "00"}"#,
            &format!(
                r#"{{"format": 1, "machine": "{}", "memory_sha256": "short", "disk_sha256": "{}"}}"#,
                "a".repeat(64),
                "b".repeat(64)
            ),
        ] {
            std::fs::write(dir.join(SNAPSHOT_MANIFEST), bad).unwrap();
            let refused = Snapshot::load(&dir).unwrap_err();
            assert!(
                matches!(refused, VmError::SnapshotRefused { .. }),
                "{bad}: {refused}"
            );
        }
        std::fs::remove_file(dir.join(SNAPSHOT_MANIFEST)).unwrap();
        assert!(matches!(
            Snapshot::load(&dir),
            Err(VmError::SnapshotRefused { .. })
        ));
        std::fs::write(
            dir.join(SNAPSHOT_MANIFEST),
            vec![b' '; MANIFEST_CAP as usize + 10],
        )
        .unwrap();
        assert!(matches!(
            Snapshot::load(&dir),
            Err(VmError::SnapshotRefused { .. })
        ));
    }

    /// A snapshot of another machine, a corrupted disk layer and a corrupted memory file are
    /// each refused before any QEMU starts (the config's QEMU does not exist: a start would be
    /// Spawn), and the VM's directory does not stay.
    #[tokio::test]
    async fn a_foreign_or_corrupted_snapshot_is_refused_before_anything_runs() {
        let root = tempfile::tempdir().unwrap();
        let mut config = config("x");
        config.parent_dir = root.path().join("vms");
        config.qemu = root.path().join("no-such-qemu");
        config.run_as = RunAs::Invoker;
        let dir = root.path().join("snap");
        let good = saved(&dir, b"memory bytes", b"disk bytes");

        let mut foreign = good.clone();
        foreign.machine = "f".repeat(64);
        let refused = foreign
            .restore(&config, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, VmError::SnapshotRefused { reason, .. } if reason.contains("another machine")),
            "{refused}"
        );

        std::fs::write(dir.join(SNAPSHOT_DISK), b"disk bytez").unwrap();
        let refused = good
            .restore(&config, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, VmError::SnapshotRefused { reason, .. } if reason.contains(SNAPSHOT_DISK)),
            "{refused}"
        );
        assert!(!config.dir().exists(), "the VM's directory went");

        std::fs::write(dir.join(SNAPSHOT_DISK), b"disk bytes").unwrap();
        std::fs::write(dir.join(SNAPSHOT_MEMORY), b"memory bytes, and more").unwrap();
        let refused = good
            .restore(&config, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, VmError::SnapshotRefused { reason, .. } if reason.contains(SNAPSHOT_MEMORY)),
            "{refused}"
        );
        assert!(!config.dir().exists(), "the VM's directory went");

        // Intact, it passes the checks and reaches the QEMU start.
        std::fs::write(dir.join(SNAPSHOT_MEMORY), b"memory bytes").unwrap();
        let started = good
            .restore(&config, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(started, VmError::Spawn { .. }), "{started}");
        assert!(!config.dir().exists(), "the VM's directory went");
    }

    #[test]
    fn positioned_digests_leave_the_offset_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        assert_eq!(
            digest_at_start(&file, &path).unwrap(),
            hex(&Sha256::digest(b"abc"))
        );
        let mut read = String::new();
        file.read_to_string(&mut read).unwrap();
        assert_eq!(read, "abc");
        let copy = dir.path().join("g");
        assert_eq!(
            copy_digest(&path, &copy).unwrap(),
            hex(&Sha256::digest(b"abc"))
        );
        assert_eq!(std::fs::read(&copy).unwrap(), b"abc");
        assert!(copy_digest(&path, &copy).is_err(), "never over a file");
        let moved = dir.path().join("h");
        assert_eq!(
            move_digest(&copy, &moved).unwrap(),
            hex(&Sha256::digest(b"abc"))
        );
        assert!(!copy.exists(), "moved, not copied");
        assert_eq!(std::fs::read(&moved).unwrap(), b"abc");
        assert!(move_digest(&path, &moved).is_err(), "never over a file");
        assert!(path.exists(), "a refused move leaves its source");
    }
}
