//! The VM set-up the live tests, the benches and the helper processes share (the benches and
//! the helpers include this file by `#[path]`): the image, where state directories are made, a
//! small VM per sandbox, the accelerator probe's cached answer, the QEMU processes under a
//! directory, and the check that nothing was left behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backend_qemu::{QemuBackend, QemuConfig};

/// CPUs of every VM the tests and benches boot; the benches' raw VMs get the same, so their
/// rows compare with `qemu-vm`'s own `vm boot` and `vm exec`.
pub const CPUS: u32 = 1;
/// Memory of every VM, in MiB; see [`CPUS`].
pub const MEMORY_MIB: u32 = 384;
/// From QEMU's start to the agent's answer.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The VM image (`cargo xtask images vm`): `QEMU_VM_IMAGE`, else the default one.
pub fn image_dir() -> PathBuf {
    qemu_vm::given_image_dir().expect("a VM image directory")
}

/// Where the test's state directories are made (the xtask's run directory, which must be
/// empty afterwards).
pub fn run_parent() -> PathBuf {
    let dir = std::env::var_os("QEMU_VM_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small VM per sandbox ([`CPUS`], [`MEMORY_MIB`]), emulation allowed (the reports name the
/// accelerator), calls bounded well below the defaults so a wedged guest fails a test in its
/// time.
pub fn config(state_dir: &Path) -> QemuConfig {
    let mut config = QemuConfig::default();
    config.image_dir = image_dir();
    config.state_dir = state_dir.to_owned();
    config.allow_emulation = true;
    config.cpus = CPUS;
    config.memory_mib = MEMORY_MIB;
    config.boot_timeout = BOOT_TIMEOUT;
    config.call_timeout = Duration::from_secs(60);
    config
}

/// Copies the accelerator probe's cached answers from the image directory (where `qemu-vm`'s
/// live tests and [`share_accel`] keep them) into `state_dir`, so each test's backend does not
/// spend the probe's 15 s KVM boot again. The probe itself is exercised by `live_qemu`.
pub fn seed_accel(state_dir: &Path) {
    let cache = state_dir.join(".accel");
    std::fs::create_dir_all(&cache).unwrap();
    for entry in std::fs::read_dir(image_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("accel-") {
            let _ = std::fs::copy(entry.path(), cache.join(&name));
        }
    }
}

/// Copies `state_dir`'s cached probe answers back to the image directory.
pub fn share_accel(state_dir: &Path) {
    for entry in std::fs::read_dir(state_dir.join(".accel"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = image_dir().join(entry.file_name());
        if !target.exists() {
            let _ = std::fs::copy(entry.path(), target);
        }
    }
}

/// A backend over `state_dir`, its probe answer seeded.
pub async fn connect(state_dir: &Path) -> QemuBackend {
    connect_with(config(state_dir)).await
}

/// A backend from `config`, its probe answer seeded.
pub async fn connect_with(config: QemuConfig) -> QemuBackend {
    seed_accel(&config.state_dir);
    let state_dir = config.state_dir.clone();
    let backend = QemuBackend::connect(config)
        .await
        .expect("the qemu backend connects (the image: `cargo xtask images vm`)");
    share_accel(&state_dir);
    backend
}

/// The pids of every live QEMU whose VM directory lies under `dir`.
pub fn qemus_under(dir: &Path) -> Vec<i32> {
    qemu_vm::qemus_under(dir)
        .into_iter()
        .map(|q| q.pid)
        .collect()
}

/// The state directory holds no VM, record, socket or overlay, and no QEMU of it runs: only
/// the accelerator cache and the probe's empty parent (dot-names) may remain.
pub fn assert_nothing_left(state_dir: &Path) {
    let running = qemus_under(state_dir);
    assert!(
        running.is_empty(),
        "QEMU processes left running: {running:?}"
    );
    let mut left: Vec<String> = Vec::new();
    for dir in [state_dir.to_owned(), state_dir.join("vms")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || (dir == state_dir && name == "vms") {
                continue;
            }
            left.push(entry.path().display().to_string());
        }
    }
    assert!(left.is_empty(), "left in the state directory: {left:?}");
}
