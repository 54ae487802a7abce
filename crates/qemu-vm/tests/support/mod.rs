//! What the driver's live tests share: the image, the run directory (`QEMU_VM_RUN_DIR`, which
//! `cargo xtask e2e vm` sets), a small VM's configuration under the probed accelerator, a
//! `sh -c` request and its limits, and the kill of a VM a failed assertion would leave running.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use qemu_vm::{probe_accel, ExecRequest, RunLimits, Vm, VmConfig, VmImage};

/// A TCG boot takes about 4 s alone; two at once on two shared cores take longer.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// A shell function counting the guest's processes named `$1` with builtins only (the image
/// has no procps, and a helper process could count itself).
pub const COUNT: &str =
    "count() { n=0; for c in /proc/[0-9]*/comm; do read -r x < \"$c\" 2>/dev/null && [ \"$x\" = \"$1\" ] && n=$((n+1)); done; echo $n; }; ";

/// The VM image of `cargo xtask images vm` (`QEMU_VM_IMAGE`, else the default one).
pub fn image() -> VmImage {
    let dir = qemu_vm::given_image_dir().expect("a VM image directory");
    VmImage::load(&dir).expect("the VM image `cargo xtask images vm` builds")
}

/// Where the tests' VM directories are made: `QEMU_VM_RUN_DIR`, else one under the temporary
/// directory.
pub fn run_dir() -> PathBuf {
    let dir = std::env::var_os("QEMU_VM_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("qemu-vm-live"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `name` made this process's own, so concurrent runs do not share a VM directory.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// A VM named [`unique`]`(name)` in [`run_dir`]: 384 MiB, the console logged when
/// `QEMU_VM_CONSOLE` is set, and the accelerator the probe answers (its answer cached beside
/// the image's kernel), which it prints.
pub async fn config(name: &str) -> VmConfig {
    let image = image();
    let cache = image.kernel.parent().unwrap().to_owned();
    let mut config = VmConfig::new(image, run_dir(), unique(name));
    config.memory_mib = 384;
    config.console_log = std::env::var_os("QEMU_VM_CONSOLE").is_some();
    let report = probe_accel(&config, &cache).await.unwrap();
    eprintln!("accelerator: {} ({})", report.accel.name(), report.reason);
    config.accel = report.accel;
    config
}

/// `/bin/sh -c script` with a plain `PATH`, no stdin and no deadline of its own.
pub fn sh(script: &str) -> ExecRequest {
    ExecRequest {
        argv: vec![
            b"/bin/sh".to_vec(),
            b"-c".to_vec(),
            script.as_bytes().to_vec(),
        ],
        env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
        workdir: Vec::new(),
        stdin: false,
        timeout_ms: 0,
        user: None,
    }
}

/// The limits of one call: 1 MiB of output within a minute.
pub fn limits() -> RunLimits {
    RunLimits {
        output_cap: 1024 * 1024,
        deadline: Duration::from_secs(60),
    }
}

/// Kills `vm`'s QEMU with SIGKILL and removes its directory, without waiting: what a guard does
/// when a failed assertion unwinds past a VM.
pub fn kill_now(vm: Vm) {
    if let Some(pid) = rustix::process::Pid::from_raw(vm.pid()) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    let _ = std::fs::remove_dir_all(vm.dir());
}

/// Kills whatever VM it still holds when dropped ([`kill_now`]).
pub struct KillOnDrop(pub Option<Vm>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(vm) = self.0.take() {
            kill_now(vm);
        }
    }
}
