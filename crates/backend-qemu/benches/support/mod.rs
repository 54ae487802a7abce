//! What the qemu backend's benchmarks share: the image, a backend over a state directory of the
//! run's own (its accelerator answer seeded from the image directory), a bare VM of the
//! `qemu-vm` driver with the same accelerator, CPUs and memory, a raw container for the exec
//! row's `docker exec`, and the guard that leaves no QEMU behind even when a bench panics. The
//! paired rounds and the report rows are `paired-bench`'s.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use backend_qemu::{QemuBackend, QemuConfig};
use qemu_vm::{AgentClient, Vm, VmConfig, VmImage};
use sandbox_core::SandboxBackend;

/// CPUs and memory of every VM of the benches, both sides: what `qemu-vm`'s own bench boots,
/// so the rows compare with its `vm boot` and `vm exec`.
pub const CPUS: u32 = 1;
/// See [`CPUS`].
pub const MEMORY_MIB: u32 = 384;

/// From QEMU's start to the agent's answer, both sides.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The deadline of each raw call, so a wedged guest or engine fails the run instead of hanging it.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(120);

/// The scope of every key a bench makes.
pub const SCOPE: &str = "bench-qemu";

/// The VM image: `QEMU_VM_IMAGE`, else the default one (`cargo xtask images vm`).
pub fn image_dir() -> PathBuf {
    qemu_vm::given_image_dir().expect("a VM image directory")
}

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

    /// Fails unless no QEMU runs under the run's directory and the backend's state holds no
    /// VM, record or socket (the accelerator cache and the probe's empty parent may remain).
    pub fn assert_nothing_left(&self) {
        let running = qemus_under(&self.dir);
        assert!(running.is_empty(), "QEMU left running: {running:?}");
        let mut left = Vec::new();
        for dir in [self.state(), self.state().join("vms"), self.raw()] {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || (dir == self.state() && name == "vms") {
                    continue;
                }
                left.push(entry.path().display().to_string());
            }
        }
        assert!(left.is_empty(), "left behind: {left:?}");
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

/// The pids of every live QEMU whose VM directory lies under `dir`.
pub fn qemus_under(dir: &Path) -> Vec<i32> {
    qemu_vm::qemus_under(dir)
        .into_iter()
        .map(|q| q.pid)
        .collect()
}

/// The backend over `run`'s state directory: [`CPUS`], [`MEMORY_MIB`], emulation allowed (the
/// rows name the accelerator), the probe's cached answer copied from the image directory when
/// it has one, so the backend does not spend the probe's KVM boot again.
pub async fn backend(run: &Run) -> QemuBackend {
    let state = run.state();
    let cache = state.join(".accel");
    std::fs::create_dir_all(&cache).expect("the accelerator cache");
    for entry in std::fs::read_dir(image_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with("accel-") {
            let _ = std::fs::copy(entry.path(), cache.join(entry.file_name()));
        }
    }
    let mut config = QemuConfig::default();
    config.image_dir = image_dir();
    config.state_dir = state;
    config.allow_emulation = true;
    config.cpus = CPUS;
    config.memory_mib = MEMORY_MIB;
    config.boot_timeout = BOOT_TIMEOUT;
    config.call_timeout = RAW_TIMEOUT;
    let backend = QemuBackend::connect(config)
        .await
        .expect("the qemu backend connects (the image: `cargo xtask images vm`)");
    eprintln!(
        "accelerator: {} ({}); rung {}",
        accel_name(&backend),
        backend.accelerator().reason,
        backend.isolation()
    );
    backend
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

/// One `docker <args…>`, bounded by [`RAW_TIMEOUT`] and required to exit 0; its stdout.
pub async fn docker(args: &[&str]) -> String {
    let mut command = tokio::process::Command::new("docker");
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = tokio::time::timeout(RAW_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("docker {args:?} did not finish within {RAW_TIMEOUT:?}"))
        .expect("the docker CLI runs");
    assert!(
        output.status.success(),
        "docker {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A raw container (`docker run -d` of `sandbox-base:local`, hardened as the docker backend's
/// workloads are), removed with `docker rm -f` when dropped, even on a panic.
pub struct RawContainer {
    pub id: String,
}

impl RawContainer {
    pub async fn start() -> RawContainer {
        let label = format!("maf-sandbox-bench={SCOPE}-{}", std::process::id());
        let out = docker(&[
            "run",
            "-d",
            "--pull=never",
            "--init",
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "ALL",
            "--pids-limit",
            "512",
            "--network",
            "none",
            "--label",
            &label,
            "--entrypoint",
            "sh",
            "sandbox-base:local",
            "-c",
            "while :; do sleep 3600; done",
        ])
        .await;
        let id = out.trim().to_owned();
        assert_eq!(id.len(), 64, "docker run -d printed {id:?}");
        RawContainer { id }
    }
}

impl Drop for RawContainer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("timeout")
            .args(["120", "docker", "rm", "-f", &self.id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Disposes of every sandbox of `thread` in [`SCOPE`] through the backend.
pub async fn dispose_thread(backend: &QemuBackend, thread: &str) {
    let purge = backend.dispose_scope(SCOPE, thread).await;
    assert!(
        purge.undisposed.is_none(),
        "disposal of {SCOPE}/{thread}: {purge:?}"
    );
}
