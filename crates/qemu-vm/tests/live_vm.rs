//! Live tests against real QEMU (run by `cargo xtask e2e vm`, which builds the image and sets
//! `QEMU_VM_IMAGE` and `QEMU_VM_RUN_DIR`). Each test boots its own small VM and kills it; the
//! accelerator each boot used is printed (TCG where `/dev/kvm` does not boot the kernel).
#![cfg(target_os = "linux")]

mod support;

use std::time::{Duration, Instant};

use qemu_vm::{
    AgentClient, ErrorCode, ExecEvent, ExecRequest, FileKind, RunLimits, Snapshot, Vm, VmConfig,
    VmError, FIRST_VM_ID, VM_IDS,
};
use support::{
    config, image, kill_now, limits, run_dir, sh, unique, KillOnDrop, BOOT_TIMEOUT, COUNT,
};
/// The deadline of one file call.
const CALL: Duration = Duration::from_secs(30);

/// A booted VM and its agent, killed when the test is done with it.
struct Booted {
    vm: Option<Vm>,
    agent: AgentClient,
}

impl Booted {
    async fn kill(mut self) {
        let vm = self.vm.take().unwrap();
        let dir = vm.dir().to_owned();
        vm.kill().await.unwrap();
        assert!(!dir.exists(), "the VM's directory is removed");
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        // A failed assertion must not leave QEMU behind.
        if let Some(vm) = self.vm.take() {
            kill_now(vm);
        }
    }
}

async fn boot(config: &VmConfig) -> Booted {
    let started = Instant::now();
    let vm = Vm::start(config).await.unwrap();
    let agent = match vm.agent(BOOT_TIMEOUT).await {
        Ok(agent) => agent,
        Err(error) => {
            let console = std::fs::read_to_string(vm.dir().join("console.log")).unwrap_or_default();
            let _ = vm.kill().await;
            panic!("boot failed: {error}\n{console}");
        }
    };
    eprintln!(
        "booted {} under {} to the agent in {:.2} s",
        config.name,
        vm.accel().name(),
        started.elapsed().as_secs_f64()
    );
    Booted {
        vm: Some(vm),
        agent,
    }
}

/// Bounds one step of a test, naming it when it hangs.
async fn step<T>(name: &str, work: impl std::future::Future<Output = T>) -> T {
    eprintln!("step: {name}");
    match tokio::time::timeout(Duration::from_secs(120), work).await {
        Ok(value) => value,
        Err(_) => panic!("step `{name}` did not finish within 120 s"),
    }
}

/// The user and group QEMU runs as, read from `/proc`. Under root (the default
/// `RunAs::OwnIdsUnderRoot`): ids from the VMs' range in every slot (real, effective, saved,
/// file system), no supplementary group but its own and no capability left; otherwise the
/// invoker's own ids.
fn qemu_ids(vm: &Vm) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", vm.pid())).unwrap();
    let field = |name: &str| -> Vec<String> {
        let line = status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"));
        line.split_whitespace().map(str::to_owned).collect()
    };
    let (uids, gids) = (field("Uid:"), field("Gid:"));
    let (uid, gid): (u32, u32) = (uids[0].parse().unwrap(), gids[0].parse().unwrap());
    if rustix::process::geteuid().is_root() {
        assert!(
            (FIRST_VM_ID..FIRST_VM_ID + VM_IDS).contains(&uid),
            "{status}"
        );
        assert_eq!(uids, vec![uid.to_string(); 4], "{status}");
        assert_eq!(gids, vec![gid.to_string(); 4], "{status}");
        let groups = field("Groups:");
        assert!(groups.iter().all(|g| *g == gid.to_string()), "{status}");
        for caps in ["CapPrm:", "CapEff:", "CapAmb:"] {
            assert_eq!(field(caps), ["0000000000000000"], "{caps} {status}");
        }
    } else {
        assert_eq!(uid, rustix::process::getuid().as_raw(), "{status}");
    }
    (uid, gid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_to_the_agent_and_runs_exact_bytes_and_exit_codes() {
    let config = config("exec").await;
    let booted = boot(&config).await;
    let agent = &booted.agent;
    let status = booted.vm.as_ref().unwrap().status().await.unwrap();
    assert!(status.running, "QMP says {status:?}");

    // QEMU runs under its own seccomp filter (mode 2, every thread): a subverted device model
    // cannot start programs, raise its privileges or use obsolete system calls.
    for task in std::fs::read_dir(format!("/proc/{}/task", booted.vm.as_ref().unwrap().pid()))
        .unwrap()
        .flatten()
    {
        // A thread that ended since the listing has nothing to judge.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        assert!(
            status
                .lines()
                .any(|line| line.split_whitespace().eq(["Seccomp:", "2"])),
            "thread {:?} of QEMU has no seccomp filter: {status}",
            task.file_name()
        );
    }

    // Raw argv bytes (not UTF-8, with spaces and quotes) arrive exactly.
    let arg = b"a b'\"\xff\xfe\n".to_vec();
    let request = ExecRequest {
        argv: vec![b"/usr/bin/printf".to_vec(), b"%s".to_vec(), arg.clone()],
        ..sh("")
    };
    let out = agent.run(request, None, limits()).await.unwrap();
    assert_eq!(out.stdout, arg);
    assert_eq!(out.status.code, Some(0));

    let out = agent
        .run(sh("printf out; printf err >&2; exit 7"), None, limits())
        .await
        .unwrap();
    assert_eq!(
        (
            out.stdout.as_slice(),
            out.stderr.as_slice(),
            out.status.code
        ),
        (&b"out"[..], &b"err"[..], Some(7))
    );
    let out = agent.run(sh("kill -9 $$"), None, limits()).await.unwrap();
    assert_eq!((out.status.code, out.status.signal), (None, Some(9)));

    // Environment and working directory are exactly what was asked.
    let mut request = sh("pwd; echo \"$ONLY\"; env | wc -l");
    request.env.push((b"ONLY".to_vec(), b"x y".to_vec()));
    request.workdir = b"/tmp".to_vec();
    let out = agent.run(request, None, limits()).await.unwrap();
    assert_eq!(out.stdout, b"/tmp\nx y\n3\n");

    // A missing program is the agent's typed refusal, not an exit code.
    let missing = ExecRequest {
        argv: vec![b"/no/such/program".to_vec()],
        ..sh("")
    };
    match agent.run(missing, None, limits()).await {
        Err(VmError::Agent { code, .. }) => assert_eq!(code, ErrorCode::NotFound),
        other => panic!("expected a NotFound refusal, got {other:?}"),
    }
    // Each exec ran in its own cgroup, and none is left.
    let out = agent
        .run(
            sh("cat /proc/self/cgroup; ls /sys/fs/cgroup | grep -c '^sbx-'"),
            None,
            limits(),
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("0::/sbx-"), "{text}");
    assert_eq!(
        text.lines().last(),
        Some("1"),
        "only this exec's group: {text}"
    );

    // The guest keeps host time: its clock is the TSC (under TCG the kernel would otherwise
    // fall back to jiffies, whose emulated tick drifts), and a guest `sleep 2` lasts 2 s here.
    let out = agent
        .run(
            sh("cat /sys/devices/system/clocksource/clocksource0/current_clocksource; sleep 2"),
            None,
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "tsc");
    let started = std::time::Instant::now();
    let out = agent.run(sh("sleep 2"), None, limits()).await.unwrap();
    assert_eq!(out.status.code, Some(0));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2),
        "a guest `sleep 2` took {elapsed:?} on the host"
    );
    booted.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_output_feeds_stdin_and_kills_whole_groups() {
    let config = config("stream").await;
    let booted = boot(&config).await;
    let agent = &booted.agent;

    // Output arrives while the process still runs.
    let mut exec = agent.exec(sh("echo one; sleep 1; echo two")).await.unwrap();
    let started = Instant::now();
    assert_eq!(
        step("first line", exec.next_event()).await.unwrap(),
        ExecEvent::Stdout(b"one\n".to_vec())
    );
    let first = started.elapsed();
    let mut rest = Vec::new();
    loop {
        match step("streaming", exec.next_event()).await.unwrap() {
            ExecEvent::Stdout(bytes) => rest.extend(bytes),
            ExecEvent::Exited(status) => {
                assert_eq!(status.code, Some(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(rest, b"two\n");
    assert!(
        started.elapsed() > first + Duration::from_millis(500),
        "the first line came before the sleep"
    );

    // Stdin larger than the window streams through with backpressure, byte for byte.
    let input: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let out = step(
        "stdin",
        agent.run(
            sh("cat"),
            Some(&input),
            RunLimits {
                output_cap: 8 * 1024 * 1024,
                deadline: Duration::from_secs(120),
            },
        ),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input, "stdin came back changed");
    // A process that stops reading early does not wedge the call.
    let out = step("head", agent.run(sh("head -c 3"), Some(&input), limits()))
        .await
        .unwrap();
    assert_eq!(out.stdout, &input[..3]);

    // A guest-side timeout kills a double-forked daemon in its own session too.
    let mut daemon = sh("setsid sh -c 'sleep 300 & echo $! > /tmp/daemon.pid' & sleep 300");
    daemon.timeout_ms = 1500;
    let started = Instant::now();
    let out = step("daemon", agent.run(daemon, None, limits()))
        .await
        .unwrap();
    assert!(out.status.timed_out, "{:?}", out.status);
    assert!(started.elapsed() < Duration::from_secs(30));
    let out = agent
        .run(
            sh(&format!("{COUNT} pid=$(cat /tmp/daemon.pid); test -n \"$pid\" && ! kill -0 \"$pid\" 2>/dev/null && echo gone; count sleep")),
            None,
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout,
        b"gone\n0\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Kill ends a running exec and everything it started.
    let mut exec = agent.exec(sh("sleep 300 & sleep 300")).await.unwrap();
    exec.kill().await.unwrap();
    match step("kill", exec.next_event()).await.unwrap() {
        ExecEvent::Exited(status) => assert!(status.killed && status.signal == Some(9)),
        other => panic!("unexpected {other:?}"),
    }

    // A flood passes the host's cap: a typed error, the exec killed, the agent still serves.
    let flood = step(
        "flood",
        agent.run(
            sh("cat /dev/zero"),
            None,
            RunLimits {
                output_cap: 4 * 1024 * 1024,
                deadline: Duration::from_secs(60),
            },
        ),
    )
    .await;
    assert!(
        matches!(flood, Err(VmError::OutputLimit { limit }) if limit == 4 * 1024 * 1024),
        "{flood:?}"
    );
    let out = agent
        .run(sh(&format!("{COUNT} sleep 0.5; count cat")), None, limits())
        .await
        .unwrap();
    assert_eq!(out.stdout, b"0\n", "the flooding cat was killed");
    booted.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_binary_and_large() {
    let config = config("files").await;
    let booted = boot(&config).await;
    let agent = &booted.agent;

    let small: Vec<u8> = (0..=255u8).chain([0, 0, 0xff]).collect();
    agent
        .write_file(
            b"/tmp/small.bin",
            0o640,
            &small[..],
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let stat = agent.stat(b"/tmp/small.bin", CALL).await.unwrap();
    assert_eq!(
        (stat.kind, stat.size, stat.mode),
        (FileKind::File, 259, 0o640)
    );
    assert_eq!(
        agent
            .read_file(b"/tmp/small.bin", 1024, Duration::from_secs(30))
            .await
            .unwrap(),
        small
    );

    // 64 MiB, both ways, timed.
    let big: Vec<u8> = (0..64 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let started = Instant::now();
    let written = agent
        .write_file(b"/tmp/big.bin", 0o600, &big[..], Duration::from_secs(240))
        .await
        .unwrap();
    let up = started.elapsed();
    assert_eq!(written, big.len() as u64);
    let started = Instant::now();
    let back = agent
        .read_file(b"/tmp/big.bin", 65 * 1024 * 1024, Duration::from_secs(240))
        .await
        .unwrap();
    eprintln!(
        "64 MiB: write {:.2} s, read {:.2} s",
        up.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(back == big, "the 64 MiB file came back changed");
    // A read past the caller's cap is refused, not truncated.
    assert!(matches!(
        agent
            .read_file(b"/tmp/big.bin", 1024 * 1024, Duration::from_secs(60))
            .await,
        Err(VmError::OutputLimit { .. })
    ));
    // A head read is the file's first bytes, and the agent stops there: from an endless file
    // it still ends, with exactly the bytes asked for.
    let head = agent
        .read_head(b"/tmp/big.bin", 1024 * 1024, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        head == big[..1024 * 1024],
        "the head read is not the file's first MiB"
    );
    let zeros = agent
        .read_head(b"/dev/zero", 4096, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(zeros, vec![0u8; 4096]);
    assert!(matches!(
        agent
            .read_file(b"/dev/zero", 4096, Duration::from_secs(20))
            .await,
        Err(VmError::OutputLimit { limit: 4096 })
    ));

    let names: Vec<Vec<u8>> = agent
        .list(b"/tmp", CALL)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    assert!(names.contains(&b"big.bin".to_vec()) && names.contains(&b"small.bin".to_vec()));
    agent.remove(b"/tmp/big.bin", false, CALL).await.unwrap();
    match agent.stat(b"/tmp/big.bin", CALL).await {
        Err(VmError::Agent { code, .. }) => assert_eq!(code, ErrorCode::NotFound),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match agent.read_file(b"/nope", 10, Duration::from_secs(10)).await {
        Err(VmError::Agent { code, .. }) => assert_eq!(code, ErrorCode::NotFound),
        other => panic!("expected NotFound, got {other:?}"),
    }
    let (before, after) = agent.reclaim().await.unwrap();
    assert!(before > 0 && after > 0, "{before} {after}");
    booted.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_sending_garbage_gets_a_typed_error_and_a_closed_channel() {
    let mut config = config("garbage").await;
    config.kernel_args.push("vm_agent.mode=garbage".to_owned());
    let booted = boot(&config).await;
    let result = booted.agent.stat(b"/", CALL).await;
    assert!(
        matches!(result, Err(VmError::Protocol(_))),
        "expected a protocol error, got {result:?}"
    );
    assert!(booted.agent.is_closed());
    // Every later call fails the same typed way; the host stays up and QEMU still runs.
    assert!(matches!(
        booted.agent.run(sh("true"), None, limits()).await,
        Err(VmError::Protocol(_))
    ));
    assert!(booted.vm.as_ref().unwrap().status().await.unwrap().running);
    booted.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_killed_behind_the_driver_is_a_typed_error() {
    let config = config("killed").await;
    let mut booted = boot(&config).await;
    let vm = booted.vm.take().unwrap();
    let mut exec = booted.agent.exec(sh("sleep 300")).await.unwrap();
    let pid = rustix::process::Pid::from_raw(vm.pid()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    match exec.next_event().await {
        Err(VmError::ChannelClosed { .. }) => {}
        other => panic!("expected ChannelClosed, got {other:?}"),
    }
    assert!(matches!(
        booted.agent.stat(b"/", CALL).await,
        Err(VmError::ChannelClosed { .. })
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        Vm::attach(vm.dir()),
        Err(VmError::NotRunning { .. })
    ));
    assert!(vm.status().await.is_err());
    let dir = vm.dir().to_owned();
    vm.kill().await.unwrap();
    assert!(!dir.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_outlives_its_creator_and_other_processes_reattach() {
    // QEMU's creator exits at once; this process adopts (and so reaps) the orphan.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    let tool = env!("CARGO_BIN_EXE_qemu-vm");
    let image_dir = qemu_vm::given_image_dir().unwrap();
    let name = unique("reattach");
    let created = std::process::Command::new(tool)
        .arg("start")
        .arg(&image_dir)
        .arg(run_dir())
        .arg(&name)
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let dir = run_dir().join(&name);
    let vm = Vm::attach(&dir).unwrap();
    assert!(vm.is_alive(), "the VM outlived the process that made it");
    // Another process attaches and runs a command in it.
    let exec = std::process::Command::new(tool)
        .arg("exec")
        .arg(&dir)
        .args([
            "/bin/sh",
            "-c",
            "echo from-another-process > /tmp/mark; cat /tmp/mark",
        ])
        .output()
        .unwrap();
    assert!(
        exec.status.success(),
        "{}",
        String::from_utf8_lossy(&exec.stderr)
    );
    assert_eq!(exec.stdout, b"from-another-process\n");
    // And this one sees what it left.
    let agent = vm.agent(BOOT_TIMEOUT).await.unwrap();
    let mark = agent
        .read_file(b"/tmp/mark", 100, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(mark, b"from-another-process\n");
    drop(agent);
    // A third process kills it.
    let killed = std::process::Command::new(tool)
        .arg("kill")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    assert!(!dir.exists());
    assert!(!vm.is_alive());
    vm.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_vms_run_at_once_and_share_nothing() {
    let (first, second) = tokio::join!(config("pair-a"), config("pair-b"));
    let (a, b) = tokio::join!(boot(&first), boot(&second));
    // Under root each QEMU dropped to ids of its own, with no capability and no other group:
    // a subverted device model can neither read the other's files nor signal it.
    let ids_a = qemu_ids(a.vm.as_ref().unwrap());
    let ids_b = qemu_ids(b.vm.as_ref().unwrap());
    if rustix::process::geteuid().is_root() {
        assert_ne!(ids_a, ids_b, "two VMs share a user");
    }
    a.agent
        .write_file(b"/tmp/only-a", 0o644, &b"a"[..], Duration::from_secs(10))
        .await
        .unwrap();
    let (in_a, in_b) = tokio::join!(
        a.agent.run(sh("cat /tmp/only-a"), None, limits()),
        b.agent.run(sh("cat /tmp/only-a"), None, limits())
    );
    assert_eq!(in_a.unwrap().stdout, b"a");
    assert_eq!(
        in_b.unwrap().status.code,
        Some(1),
        "the second VM has no such file"
    );
    // The base image was not written by either guest.
    let base = image().rootfs;
    let before = std::fs::metadata(&base).unwrap().modified().unwrap();
    a.kill().await;
    b.kill().await;
    assert_eq!(
        std::fs::metadata(&base).unwrap().modified().unwrap(),
        before
    );
}

/// A saved VM restores as the saved guest (its disk and its memory: a tmpfs file) and as a machine of its
/// own each time: two restores read different random bytes, carry their own host names and the
/// host's time; the saved VM runs on after its save; a snapshot whose memory is corrupted, or
/// that was saved from another machine, is refused and no QEMU is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_vm_restores_as_a_new_machine_and_a_corrupted_one_is_refused() {
    let config = config("saved").await;
    let machine = Snapshot::machine_of(&config);
    let source = KillOnDrop(Some(Vm::start(&config).await.unwrap()));
    let vm = source.0.as_ref().unwrap();
    let agent = step("boot", vm.agent(BOOT_TIMEOUT)).await.unwrap();
    let out = step(
        "plant",
        agent.run(
            sh("echo kept >/var/tmp/saved.txt; echo in-memory >/tmp/saved.txt"),
            None,
            limits(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code, Some(0));
    // Saved with no host connection open, as every restored copy starts.
    drop(agent);
    let snapshot_dir = run_dir().join(unique("snapshot"));
    let started = Instant::now();
    let snapshot = step("save", Snapshot::save(vm, &machine, &snapshot_dir))
        .await
        .unwrap();
    eprintln!("saved in {:.2} s", started.elapsed().as_secs_f64());
    for file in [
        qemu_vm::SNAPSHOT_MEMORY,
        qemu_vm::SNAPSHOT_DISK,
        qemu_vm::SNAPSHOT_MANIFEST,
    ] {
        assert!(snapshot_dir.join(file).exists(), "{file}");
    }
    step("resume", vm.resume()).await.unwrap();
    let again = step("the source runs on", vm.agent(BOOT_TIMEOUT))
        .await
        .unwrap();
    let out = again
        .run(sh("cat /var/tmp/saved.txt"), None, limits())
        .await
        .unwrap();
    assert_eq!(out.stdout, b"kept\n");
    drop(again);
    let vm = { source }.0.take().unwrap();
    vm.kill().await.unwrap();

    let random = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname; date +%s; \
                  cat /tmp/saved.txt";
    let mut seen = Vec::new();
    for name in ["restored-a", "restored-b"] {
        let mut restored = VmConfig {
            name: unique(name),
            ..config.clone()
        };
        restored.console_log = config.console_log;
        let started = Instant::now();
        let (vm, agent) = step("restore", snapshot.restore(&restored, BOOT_TIMEOUT))
            .await
            .unwrap();
        let guard = KillOnDrop(Some(vm));
        eprintln!(
            "restored {} to a renewed agent in {:.2} s",
            restored.name,
            started.elapsed().as_secs_f64()
        );
        let out = agent
            .run(
                sh(&format!("cat /var/tmp/saved.txt; {random}")),
                None,
                limits(),
            )
            .await
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "kept", "{text}");
        assert_eq!(lines[1].len(), 64, "{text}");
        assert_eq!(lines[2], restored.name, "its own host name: {text}");
        let guest_now: u64 = lines[3].parse().unwrap();
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            guest_now.abs_diff(host_now) <= 5,
            "the guest's clock {guest_now} is the host's {host_now}"
        );
        assert_eq!(lines[4], "in-memory", "the saved tmpfs, in memory: {text}");
        seen.push(lines[1].to_owned());
        drop(agent);
        let vm = { guard }.0.take().unwrap();
        vm.kill().await.unwrap();
    }
    assert_ne!(seen[0], seen[1], "two restores drew the same random bytes");

    // Another machine's config is refused.
    let mut other = VmConfig {
        name: unique("restored-other"),
        ..config.clone()
    };
    other.memory_mib += 64;
    let refused = snapshot.restore(&other, BOOT_TIMEOUT).await.unwrap_err();
    assert!(
        matches!(refused, VmError::SnapshotRefused { .. }),
        "{refused}"
    );
    // One flipped byte of memory is refused before QEMU starts.
    let memory = snapshot_dir.join(qemu_vm::SNAPSHOT_MEMORY);
    let mut bytes = std::fs::read(&memory).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&memory, &bytes).unwrap();
    let corrupted = VmConfig {
        name: unique("restored-corrupted"),
        ..config.clone()
    };
    let refused = Snapshot::load(&snapshot_dir)
        .unwrap()
        .restore(&corrupted, BOOT_TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, VmError::SnapshotRefused { .. }),
        "{refused}"
    );
    assert!(!corrupted.dir().exists());
    assert!(qemu_vm::qemus_under(&corrupted.dir()).is_empty());
    std::fs::remove_dir_all(&snapshot_dir).unwrap();
}

/// One QMP command on a session of its own (QEMU's monitor serves one client at a time), its
/// answer's `return`; events before the answer are skipped.
async fn raw_qmp(vm: &Vm, command: serde_json::Value) -> serde_json::Value {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let stream = tokio::net::UnixStream::connect(vm.dir().join("qmp.sock"))
        .await
        .unwrap();
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    async fn answer(
        lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    ) -> serde_json::Value {
        loop {
            let line = lines.next_line().await.unwrap().expect("QMP closed");
            let value: serde_json::Value = serde_json::from_str(&line).unwrap();
            if value.get("QMP").is_none() && value.get("event").is_none() {
                return value;
            }
        }
    }
    // The greeting.
    lines.next_line().await.unwrap().expect("QMP greeting");
    let mut ret = serde_json::Value::Null;
    for command in [serde_json::json!({"execute": "qmp_capabilities"}), command] {
        write
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        let value = answer(&mut lines).await;
        ret = value
            .get("return")
            .unwrap_or_else(|| panic!("{command}: {value}"))
            .clone();
    }
    ret
}

/// The state of QEMU's migration (`active`, `completed`, ...; `none` before any).
async fn migration_status(vm: &Vm) -> String {
    let ret = raw_qmp(vm, serde_json::json!({"execute": "query-migrate"})).await;
    ret.get("status")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("none")
        .to_owned()
}

/// Stops the guest and starts its migration into a Unix socket that takes the first bytes
/// and then nothing, as a save whose process died leaves it: under way, its guest stopped.
/// Returns the listener's side, which lets the migration end when it is read to its end.
async fn start_held_save(vm: &Vm, name: &str) -> tokio::net::UnixStream {
    use std::os::unix::fs::PermissionsExt;
    let path = vm.dir().join(name);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    // QEMU runs as an id of its own, which must be let in.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    raw_qmp(vm, serde_json::json!({"execute": "stop"})).await;
    let uri = format!("unix:{}", path.display());
    raw_qmp(
        vm,
        serde_json::json!({"execute": "migrate", "arguments": {"uri": uri}}),
    )
    .await;
    let (held, _) = listener.accept().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while migration_status(vm).await != "active" {
        assert!(
            Instant::now() < deadline,
            "the migration never became active"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held
}

/// Reads the migration stream to its end, so QEMU finishes the migration.
async fn drain(mut held: tokio::net::UnixStream) {
    let mut sink = tokio::io::sink();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::copy(&mut held, &mut sink),
    )
    .await
    .expect("the migration stream ends")
    .unwrap();
}

/// A save whose process died mid-way leaves a migration under way with the guest stopped.
/// Running the guest on with a plain `cont` loses it later: QEMU stops the guest again when the
/// migration ends, and nothing runs it on (the hole, shown first). `run_on_after_save`
/// cancels the migration first, and the guest stays running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_left_under_way_is_cancelled_and_its_guest_runs_on() {
    let booted = boot(&config("held-save").await).await;
    let vm = booted.vm.as_ref().unwrap();

    // The hole: `cont` under the migration, which then ends with the guest stopped.
    let held = step("a held save", start_held_save(vm, "held-1.sock")).await;
    step("cont", vm.resume()).await.unwrap();
    assert!(vm.status().await.unwrap().running);
    step("the stream read to its end", drain(held)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while migration_status(vm).await != "completed" {
        assert!(Instant::now() < deadline, "the migration never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = vm.status().await.unwrap();
    assert!(
        !status.running,
        "stopped again by the migration's end: {status:?}"
    );
    assert_eq!(status.status, "postmigrate");
    // After a save that finished, it runs the guest on.
    step("run on after a finished save", vm.run_on_after_save())
        .await
        .unwrap();
    assert!(vm.status().await.unwrap().running);

    // The fix: the migration is cancelled before the guest runs on.
    let held = step("a second held save", start_held_save(vm, "held-2.sock")).await;
    step("run on after a held save", vm.run_on_after_save())
        .await
        .unwrap();
    assert_eq!(migration_status(vm).await, "cancelled");
    // The stream is closed by the cancel; reading it ends at once.
    step("the cancelled stream", drain(held)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = vm.status().await.unwrap();
    assert!(status.running, "{status:?}");
    let out = step(
        "a command after the cancelled save",
        booted.agent.run(sh("echo served"), None, limits()),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, b"served\n");

    // On a guest no save touched it does nothing.
    step("run on a running guest", vm.run_on_after_save())
        .await
        .unwrap();
    assert!(vm.status().await.unwrap().running);
    booted.kill().await;
}

/// `script` run by bash, whose `/dev/tcp` makes the guest's connections.
fn bash(script: &str) -> qemu_vm::ExecRequest {
    let mut request = sh(script);
    request.argv[0] = b"/bin/bash".to_vec();
    request
}

/// The SHA-256 of `bytes`, in hex.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Guest processes connect to a loopback port and the host takes each connection as a stream:
/// three at once, each its own (an answer per line); bulk bytes both ways, whole; the guest's
/// end of writing reaches the host as the end of its stream and the host's reaches the guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_connections_to_a_loopback_port_reach_the_host_each_apart() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    const PORT: u16 = 3128;
    let booted = boot(&config("accept").await).await;
    let agent = booted.agent.clone();
    assert!(matches!(agent.accept(0).await, Err(VmError::Invalid(_))));

    // Three connections at once, each answered with what it sent.
    let echo = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..3 {
                let stream = agent.accept(PORT).await.unwrap();
                served.push(tokio::spawn(async move {
                    let (read, mut write) = tokio::io::split(stream);
                    let mut line = String::new();
                    BufReader::new(read).read_line(&mut line).await.unwrap();
                    write
                        .write_all(format!("echo:{line}").as_bytes())
                        .await
                        .unwrap();
                    write.shutdown().await.unwrap();
                }));
            }
            for one in served {
                one.await.unwrap();
            }
        })
    };
    let out = step(
        "three guest connections at once",
        agent.run(
            bash(
                "for i in 1 2 3; do \
                  (exec 3<>/dev/tcp/127.0.0.1/3128; echo \"hello $i\" >&3; cat <&3) & \
                done; wait",
            ),
            None,
            limits(),
        ),
    )
    .await
    .unwrap();
    step("the echo server", echo).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for i in 1..=3 {
        assert!(
            text.contains(&format!("echo:hello {i}\n")),
            "{text:?} {out:?}"
        );
    }

    // Host to guest: 4 MiB, then the host's end of writing ends the guest's read.
    let payload: Vec<u8> = (0..4 * 1024 * 1024u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let expected = sha256_hex(&payload);
    let sender = {
        let agent = agent.clone();
        let payload = payload.clone();
        tokio::spawn(async move {
            let mut stream = agent.accept(PORT).await.unwrap();
            stream.write_all(&payload).await.unwrap();
            stream.shutdown().await.unwrap();
            // Held until the guest closed its side.
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.unwrap();
            rest
        })
    };
    let out = step(
        "4 MiB to the guest",
        agent.run(
            bash("exec 3<>/dev/tcp/127.0.0.1/3128; sha256sum <&3"),
            None,
            limits(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next(),
        Some(expected.as_str()),
        "{out:?}"
    );
    assert!(step("the sender", sender).await.unwrap().is_empty());

    // Guest to host: 4 MiB of the guest's random bytes, whole.
    let receiver = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut stream = agent.accept(PORT).await.unwrap();
            let mut received = Vec::new();
            stream.read_to_end(&mut received).await.unwrap();
            received
        })
    };
    let out = step(
        "4 MiB from the guest",
        agent.run(
            bash(
                "head -c 4194304 /dev/urandom >/tmp/sent; \
                cat /tmp/sent >/dev/tcp/127.0.0.1/3128; sha256sum /tmp/sent",
            ),
            None,
            limits(),
        ),
    )
    .await
    .unwrap();
    let received = step("the receiver", receiver).await.unwrap();
    assert_eq!(received.len(), 4 * 1024 * 1024);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next(),
        Some(sha256_hex(&received).as_str()),
        "{out:?}"
    );

    // A wait dropped before any connection leaves the port to the next one.
    let waiting = tokio::time::timeout(Duration::from_millis(500), agent.accept(PORT)).await;
    assert!(waiting.is_err(), "no guest process connected");
    let reader = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut stream = agent.accept(PORT).await.unwrap();
            let mut received = String::new();
            stream.read_to_string(&mut received).await.unwrap();
            received
        })
    };
    let out = step(
        "a connection after a dropped wait",
        agent.run(bash("echo after >/dev/tcp/127.0.0.1/3128"), None, limits()),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code, Some(0), "{out:?}");
    assert_eq!(step("the reader", reader).await.unwrap(), "after\n");
    booted.kill().await;
}
