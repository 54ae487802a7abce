//! What the qemu backend's benchmarks share: the live tests' VM set-up
//! (`tests/support/setup.rs`: the image, the backend's configuration, the accelerator answer
//! seeded from the image directory), a backend over a state directory of the run's own, a bare
//! VM of the `qemu-vm` driver with the same accelerator, CPUs and memory, and the guard that
//! leaves no QEMU behind even when a bench panics. The paired rounds, the report rows and the
//! raw `docker` reference are `paired-bench`'s.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use backend_qemu::QemuBackend;
use qemu_vm::{AgentClient, Vm, VmConfig, VmImage};
use sandbox_core::SandboxBackend;

#[path = "../../tests/support/setup.rs"]
mod setup;

pub use setup::{image_dir, qemus_under, BOOT_TIMEOUT, CPUS, MEMORY_MIB};

/// The deadline of each raw call, so a wedged guest or engine fails the run instead of hanging it.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(120);

/// The scope of every key a bench makes.
pub const SCOPE: &str = "bench-qemu";

/// A bench's own state directory (short: the VMs' socket paths must fit a Unix address), with
/// a guard that kills every QEMU still running under it and removes it when dropped.
pub struct Run {
    pub dir: PathBuf,
}

impl Run {
    pub fn new(tag: &str) -> Run {
        let dir = std::env::temp_dir().join(format!("bq-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the bench's state directory");
        Run { dir }
    }

    /// The backend's state directory.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Where the raw VMs' directories are made.
    pub fn raw(&self) -> PathBuf {
        self.dir.join("raw")
    }

    /// Fails unless no QEMU runs under the run's directory, the backend's state holds no VM,
    /// record or socket (the accelerator cache and the probe's empty parent may remain), and no
    /// raw VM's directory remains.
    pub fn assert_nothing_left(&self) {
        let running = qemus_under(&self.dir);
        assert!(running.is_empty(), "QEMU left running: {running:?}");
        setup::assert_nothing_left(&self.state());
        let raw: Vec<PathBuf> = std::fs::read_dir(self.raw())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| {
                !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        assert!(raw.is_empty(), "raw VMs left behind: {raw:?}");
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for pid in qemus_under(&self.dir) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The backend over `run`'s state directory as the live tests configure it (emulation allowed:
/// the rows name the accelerator), each raw call's deadline its calls' bound, the probe's cached
/// answer copied from the image directory when it has one, so the backend does not spend the
/// probe's KVM boot again.
pub async fn backend(run: &Run) -> QemuBackend {
    let mut config = setup::config(&run.state());
    config.call_timeout = RAW_TIMEOUT;
    let backend = setup::connect_with(config).await;
    eprintln!(
        "accelerator: {} ({}); rung {}",
        accel_name(&backend),
        backend.accelerator().reason,
        backend.isolation()
    );
    backend
}

/// A second backend on `run`'s state directory, with a warm pool of `size`.
pub async fn pooled_backend(run: &Run, size: usize) -> QemuBackend {
    let mut config = setup::config(&run.state());
    config.call_timeout = RAW_TIMEOUT;
    config.pool = size;
    setup::connect_with(config).await
}

/// The accelerator's name, for the rows.
pub fn accel_name(backend: &QemuBackend) -> &'static str {
    backend.accelerator().accel.name()
}

/// The driver's configuration of a bare VM named `name` under `run`: the backend's image,
/// accelerator, CPUs and memory.
pub fn raw_config(run: &Run, backend: &QemuBackend, name: &str) -> VmConfig {
    let image = VmImage::load(&image_dir()).expect("the VM image");
    let mut config = VmConfig::new(image, run.raw(), name);
    config.accel = backend.accelerator().accel;
    config.cpus = CPUS;
    config.memory_mib = MEMORY_MIB;
    config
}

/// The bare boot through the driver: QEMU started, then the agent's handshake.
pub async fn raw_boot(config: &VmConfig) -> (Vm, AgentClient) {
    let vm = Vm::start(config).await.expect("the bare VM starts");
    let agent = vm.agent(BOOT_TIMEOUT).await.expect("the bare VM's agent");
    (vm, agent)
}

/// Runs `argv` through `agent` to a zero exit.
pub async fn raw_run(agent: &AgentClient, argv: &[&str]) {
    let request = qemu_vm::ExecRequest {
        argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
        workdir: b"/".to_vec(),
        stdin: false,
        timeout_ms: RAW_TIMEOUT.as_millis() as u64,
        user: None,
    };
    let limits = qemu_vm::RunLimits {
        output_cap: 64 * 1024,
        deadline: RAW_TIMEOUT,
    };
    let out = agent
        .run(request, None, limits)
        .await
        .expect("a raw agent command");
    assert_eq!(
        out.status.code,
        Some(0),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Disposes of every sandbox of `thread` in [`SCOPE`] through the backend.
pub async fn dispose_thread(backend: &QemuBackend, thread: &str) {
    let purge = backend.dispose_scope(SCOPE, thread).await;
    assert!(
        purge.undisposed.is_none(),
        "disposal of {SCOPE}/{thread}: {purge:?}"
    );
}
