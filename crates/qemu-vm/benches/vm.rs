//! `vm boot` and `vm exec`: the driver and agent against bare QEMU (run by `cargo xtask bench`,
//! which builds the VM image first).
//!
//! - boot: `Vm::start` to a finished agent handshake, against the same kernel, modules and
//!   root disk booted with a BusyBox `/init` that loads the same modules, mounts the same root
//!   and writes one line on the same port (target ≤ 1.2×);
//! - exec: `true` run over the agent against a one-byte echo round trip through a BusyBox `cat`
//!   on the same port (target ≤ +2 ms at p50).
//!
//! One VM runs at a time. The accelerator (chosen by the driver's probe) is printed in each
//! row. Appends the rows to `target/bench/rows.jsonl` and exits non-zero when a target is missed.
#![cfg(target_os = "linux")]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use qemu_vm::{probe_accel, ExecRequest, RunLimits, Vm, VmConfig, VmImage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BOOT_ROUNDS: usize = 3;
const EXEC_ROUNDS: usize = 30;
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

fn image_dir() -> PathBuf {
    qemu_vm::given_image_dir().expect("a VM image directory")
}

/// The baseline initramfs: BusyBox, the same modules, and a script for `/init`.
fn bare_initramfs(image: &VmImage, dir: &Path) -> PathBuf {
    let tree = dir.join("bare-tree");
    let _ = std::fs::remove_dir_all(&tree);
    for sub in ["bin", "dev", "proc", "sys", "modules", "newroot"] {
        std::fs::create_dir_all(tree.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", tree.join("bin/busybox")).expect("busybox-static");
    let modules = qemu_vm::module_load_order(
        &Path::new("/lib/modules").join(&image.kernel_release),
        &qemu_vm::MODULES,
    )
    .unwrap();
    let mut order = String::new();
    for (name, path) in &modules {
        std::fs::copy(path, tree.join("modules").join(format!("{name}.ko"))).unwrap();
        order.push_str(name);
        order.push('\n');
    }
    std::fs::write(tree.join("modules/order"), order).unwrap();
    let script = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in $($B cat /modules/order); do
  $B insmod /modules/$m.ko $($B tr ' ' '\n' < /proc/cmdline | $B sed -n "s/^$m\.//p")
done
while [ ! -b /dev/vda ]; do $B usleep 5000; done
$B mount -t ext4 /dev/vda /newroot
for p in /sys/class/virtio-ports/*; do
  [ "$($B cat $p/name)" = sbx.agent ] && port=/dev/${p##*/}
done
while [ ! -c "$port" ]; do $B usleep 5000; done
# A port opens once: one read-write descriptor serves the line and the echo.
exec 3<>$port
echo ready >&3
exec $B cat <&3 >&3
"#;
    let init = tree.join("init");
    std::fs::write(&init, script).unwrap();
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        tree.join("bin/busybox"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let status = std::process::Command::new("mknod")
        .args(["-m", "600"])
        .arg(tree.join("dev/console"))
        .args(["c", "5", "1"])
        .status()
        .unwrap();
    assert!(status.success());
    let out = dir.join("bare.cpio");
    let listing = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
            tree.display(),
            out.display()
        ))
        .status()
        .unwrap();
    assert!(listing.success());
    std::fs::remove_dir_all(&tree).unwrap();
    out
}

/// The median of `samples`, in milliseconds.
fn p50(samples: &[Duration]) -> f64 {
    paired_bench::median(samples.iter().copied().map(ms).collect())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sh_true() -> ExecRequest {
    ExecRequest {
        argv: vec![b"/bin/true".to_vec()],
        env: Vec::new(),
        workdir: Vec::new(),
        stdin: false,
        timeout_ms: 0,
        user: None,
    }
}

/// Boots the bare image and returns (boot time, the connected port).
async fn bare_boot(config: &VmConfig) -> (Duration, Vm, tokio::net::UnixStream) {
    let started = Instant::now();
    let vm = Vm::start(config).await.unwrap();
    let mut port = tokio::net::UnixStream::connect(vm.dir().join("agent.sock"))
        .await
        .unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(BOOT_TIMEOUT, async {
        while !line.ends_with(b"ready\n") {
            port.read_exact(&mut byte).await.unwrap();
            line.push(byte[0]);
        }
    })
    .await
    .expect("the bare guest answered");
    (started.elapsed(), vm, port)
}

async fn run() -> bool {
    let image = VmImage::load(&image_dir()).expect("the VM image (`cargo xtask images vm`)");
    let dir = std::env::temp_dir().join(format!("qemu-vm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = VmConfig::new(image.clone(), &dir, "agent");
    config.memory_mib = 384;
    let report = probe_accel(&config, &image_dir()).await.unwrap();
    config.accel = report.accel;
    let accel = report.accel.name();
    eprintln!("accelerator: {accel} ({})", report.reason);
    let mut bare = config.clone();
    bare.name = "bare".to_owned();
    bare.image.initramfs = bare_initramfs(&image, &dir);

    let mut ours = Vec::new();
    let mut raw = Vec::new();
    let mut exec_ours = Vec::new();
    let mut exec_raw = Vec::new();
    for round in 0..BOOT_ROUNDS {
        let started = Instant::now();
        let vm = Vm::start(&config).await.unwrap();
        let agent = vm.agent(BOOT_TIMEOUT).await.unwrap();
        ours.push(started.elapsed());
        if round == 0 {
            let limits = RunLimits {
                output_cap: 1024,
                deadline: Duration::from_secs(30),
            };
            agent.run(sh_true(), None, limits).await.unwrap();
            // What one fork and exec of `true` costs inside this guest, agent aside.
            let spawn = ExecRequest {
                argv: vec![
                    b"/bin/sh".to_vec(),
                    b"-c".to_vec(),
                    b"a=$(date +%s%N); for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; echo $(( ($(date +%s%N) - a) / 10000 ))".to_vec(),
                ],
                ..sh_true()
            };
            let out = agent.run(spawn, None, limits).await.unwrap();
            let micros: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(0.0);
            eprintln!(
                "vm exec [{accel}]: inside the guest, sh spawns `true` in {:.1} ms",
                micros / 1000.0
            );
            for _ in 0..EXEC_ROUNDS {
                let started = Instant::now();
                let out = agent.run(sh_true(), None, limits).await.unwrap();
                exec_ours.push(started.elapsed());
                assert_eq!(out.status.code, Some(0));
            }
        }
        drop(agent);
        vm.kill().await.unwrap();

        let (took, vm, mut port) = bare_boot(&bare).await;
        raw.push(took);
        if round == 0 {
            let mut byte = [0u8; 1];
            for i in 0..=EXEC_ROUNDS {
                let started = Instant::now();
                port.write_all(b"x").await.unwrap();
                port.read_exact(&mut byte).await.unwrap();
                if i > 0 {
                    exec_raw.push(started.elapsed());
                }
            }
        }
        drop(port);
        vm.kill().await.unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (boot_ours, boot_raw) = (p50(&ours), p50(&raw));
    let ratio = boot_ours / boot_raw;
    let boot_ok = ratio <= 1.2;
    paired_bench::record_row(
        &format!("vm boot [{accel}]"),
        boot_ours,
        boot_raw,
        ratio,
        "<= 1.20",
        boot_ok,
    );
    println!(
        "vm boot [{accel}]: backend {:.1} ms, raw {:.1} ms, ratio {ratio:.2} (target ≤ 1.20) {} [{BOOT_ROUNDS} rounds]",
        boot_ours,
        boot_raw,
        if boot_ok { "PASS" } else { "FAIL" }
    );
    let (e_ours, e_raw) = (p50(&exec_ours), p50(&exec_raw));
    let added = e_ours - e_raw;
    let exec_ok = added <= 2.0;
    paired_bench::record_row(
        &format!("vm exec [{accel}]"),
        e_ours,
        e_raw,
        added / 2.0,
        "added <= 2 ms at p50",
        exec_ok,
    );
    println!(
        "vm exec [{accel}]: ours {:.1} ms, raw {:.1} ms, added {added:.1} ms at p50 (target ≤ +2 ms) {} [{EXEC_ROUNDS} rounds]",
        e_ours,
        e_raw,
        if exec_ok { "PASS" } else { "FAIL" }
    );
    let _ = std::io::stdout().flush();
    boot_ok && exec_ok
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if runtime.block_on(run()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
