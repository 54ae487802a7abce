//! What the live tests share: the image, a configuration of the test's own state directory,
//! the accelerator probe's cached answer, the QEMU processes of a state directory, and the
//! check that a test left nothing behind.
#![allow(dead_code)]

pub mod hooks;
pub mod observer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use backend_qemu::{QemuBackend, QemuConfig};

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

/// A small VM per sandbox (1 CPU, 384 MiB), emulation allowed, calls bounded well below the
/// defaults so a wedged guest fails a test in its time.
pub fn config(state_dir: &Path) -> QemuConfig {
    let mut config = QemuConfig::default();
    config.image_dir = image_dir();
    config.state_dir = state_dir.to_owned();
    config.allow_emulation = true;
    config.cpus = 1;
    config.memory_mib = 384;
    config.boot_timeout = Duration::from_secs(180);
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
    let backend = QemuBackend::connect(config).await.expect("connect");
    share_accel(&state_dir);
    backend
}

/// The directory of the VM `instance` of a backend over `state_dir`.
pub fn vm_dir(state_dir: &Path, instance: &str) -> PathBuf {
    state_dir.join("vms").join(instance)
}

/// The pid of the QEMU of `instance`, from its `vm.json`.
pub fn qemu_pid(state_dir: &Path, instance: &str) -> i32 {
    let text = std::fs::read_to_string(vm_dir(state_dir, instance).join("vm.json"))
        .expect("the VM's vm.json");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["pid"].as_i64().expect("a pid") as i32
}

/// The pids of every live QEMU whose VM directory lies under `dir`.
pub fn qemus_under(dir: &Path) -> Vec<i32> {
    qemu_vm::qemus_under(dir)
        .into_iter()
        .map(|q| q.pid)
        .collect()
}

/// Whether the process `pid` runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Waits up to `within` for `pid` to end.
pub async fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while alive(pid) {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Kills `pid` with SIGKILL.
pub fn kill(pid: i32) {
    let pid = rustix::process::Pid::from_raw(pid).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill");
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

/// Bounds one step of a test, naming it when it hangs.
pub async fn step<T>(
    name: &str,
    within: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    eprintln!("step: {name}");
    match tokio::time::timeout(within, work).await {
        Ok(value) => value,
        Err(_) => panic!("step `{name}` did not finish within {within:?}"),
    }
}
