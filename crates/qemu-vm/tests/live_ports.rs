//! One VM, several agent ports, several connections at once (real QEMU; `QEMU_VM_IMAGE` names
//! the image of `cargo xtask images vm`): each connection takes a port of its own, past the
//! last port the wait is bounded and typed; calls on different ports run at once, each in its
//! own cgroup; a timeout, a malformed frame or a crashed host process on one port ends only that
//! port's calls; a crashed holder's port is free again.
#![cfg(target_os = "linux")]

mod support;

use std::time::{Duration, Instant};

use qemu_vm::{AgentClient, ExecEvent, Vm, VmError};
use support::{config, limits, sh, KillOnDrop, BOOT_TIMEOUT, COUNT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vm_agent::proto::{encode, hello_ack_bytes, FrameDecoder, GuestMsg, HostMsg};

/// Runs `script` and returns its stdout, asserting exit 0.
async fn out(agent: &AgentClient, script: &str) -> String {
    let done = agent.run(sh(script), None, limits()).await.unwrap();
    assert_eq!(done.status.code, Some(0), "{script}: {done:?}");
    String::from_utf8(done.stdout).unwrap()
}

/// How many guest processes are named `name`, asked over `agent`.
async fn count(agent: &AgentClient, name: &str) -> u32 {
    out(agent, &format!("{COUNT}count {name}"))
        .await
        .trim()
        .parse()
        .unwrap()
}

/// Waits until `count(name)` is `want`, within 20 s.
async fn until_count(agent: &AgentClient, name: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = count(agent, name).await;
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} processes named {name}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The median of some latencies.
fn median(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort();
    latencies[latencies.len() / 2]
}

/// `n` runs of `true`, one after another; their latencies.
async fn trues(agent: &AgentClient, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let mut request = sh("");
        request.argv = vec![b"/bin/true".to_vec()];
        let done = agent.run(request, None, limits()).await.unwrap();
        assert_eq!(done.status.code, Some(0));
        latencies.push(started.elapsed());
    }
    latencies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_share_a_vm_one_port_each_and_fail_apart() {
    // The helper process this test kills must be reaped here.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    let mut config = config("ports").await;
    config.agent_ports = 3;
    let started = Instant::now();
    let mut booted = KillOnDrop(Some(Vm::start(&config).await.unwrap()));
    let vm = booted.0.as_ref().unwrap();
    assert_eq!(vm.agent_ports(), 3);
    let a = vm.agent(BOOT_TIMEOUT).await.unwrap();
    eprintln!(
        "booted to the agent in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let b = vm.agent(BOOT_TIMEOUT).await.unwrap();
    let c = vm.agent(BOOT_TIMEOUT).await.unwrap();
    assert_eq!((a.port(), b.port(), c.port()), (Some(0), Some(1), Some(2)));

    // Every port held: a bounded wait, then a typed error.
    let waited = Instant::now();
    let busy = vm.agent(Duration::from_secs(1)).await.unwrap_err();
    assert!(
        matches!(busy, VmError::PortsBusy { ports: 3, .. }),
        "{busy:?}"
    );
    let waited = waited.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // Latency of `true` on one connection, alone and while the two others run theirs.
    let alone = median(trues(&a, 10).await);
    let (during, _, _) = tokio::join!(trues(&a, 10), trues(&b, 10), trues(&c, 10));
    let during = median(during);
    eprintln!("exec `true`: median {alone:?} alone, {during:?} with two other connections busy");

    // A long call on port 0 while the others work, each call in a cgroup of its own. It runs
    // until the test ends its `sleep` (a fixed sleep could end by itself on a loaded host before
    // the checks below that it runs on).
    let mut long = a
        .exec(sh(
            "cat /proc/self/cgroup; sleep 3600 & echo $! > /tmp/long.pid; wait; echo done",
        ))
        .await
        .unwrap();
    let long_cgroup = match long.next_event().await.unwrap() {
        ExecEvent::Stdout(bytes) => String::from_utf8(bytes).unwrap(),
        other => panic!("{other:?}"),
    };
    let other_cgroup = out(&b, "cat /proc/self/cgroup").await;
    assert!(long_cgroup.contains("/sbx-"), "{long_cgroup}");
    assert_ne!(long_cgroup, other_cgroup, "two ports, two groups");
    let echoed = Instant::now();
    assert_eq!(out(&c, "echo hello").await, "hello\n");
    eprintln!(
        "`echo` during the other port's sleep: {:?}",
        echoed.elapsed()
    );

    // A call that times out on port 1 ends its own processes, a setsid daemon included, and
    // nothing of port 0's.
    let mut expiring = sh("setsid tail -f /dev/null & tail -f /dev/null");
    expiring.timeout_ms = 1000;
    let expired = b.run(expiring, None, limits()).await.unwrap();
    assert!(expired.status.timed_out, "{expired:?}");
    assert_eq!(
        count(&c, "tail").await,
        0,
        "the timeout ended every process of its call"
    );
    assert_eq!(count(&c, "sleep").await, 1, "port 0's call runs on");

    // A malformed frame on port 1 ends that port's session (and its calls) only.
    drop(b);
    let lock = std::fs::File::options()
        .write(true)
        .open(vm.dir().join("agent-1.lock"))
        .unwrap();
    // The connection's tasks let the port go as they end, at once after the drop.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        assert!(
            Instant::now() < deadline,
            "port 1 stayed held after its client was dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut raw = tokio::net::UnixStream::connect(vm.dir().join("agent-1.sock"))
        .await
        .unwrap();
    let nonce = [7u8; 16];
    raw.write_all(&encode(0, &HostMsg::Hello { nonce }))
        .await
        .unwrap();
    raw.write_all(&encode(1, &HostMsg::Exec(sh("tail -f /dev/null"))))
        .await
        .unwrap();
    let mut decoder = FrameDecoder::<GuestMsg>::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut acked = false;
    let started = loop {
        let n = tokio::time::timeout(Duration::from_secs(30), raw.read(&mut buf))
            .await
            .expect("the agent answers")
            .unwrap();
        assert!(n > 0, "the port closed");
        decoder.push(&buf[..n]);
        if !acked {
            if !decoder.skip_to(&hello_ack_bytes(nonce)) {
                continue;
            }
            decoder.next_message().unwrap();
            acked = true;
        }
        if let Some((1, message)) = decoder.next_message().unwrap() {
            break message;
        }
    };
    assert!(matches!(started, GuestMsg::Started { .. }), "{started:?}");
    until_count(&c, "tail", 1).await;
    raw.write_all(&[
        0xff,
        0xff,
        0xff,
        0xff,
        vm_agent::proto::VERSION,
        2,
        0,
        0,
        0,
        9,
    ])
    .await
    .unwrap();
    until_count(&c, "tail", 0).await;
    assert_eq!(count(&c, "sleep").await, 1, "port 0's call runs on");
    drop((raw, lock));

    // The long call ends as it would have alone once its `sleep` ends.
    out(&c, "kill $(cat /tmp/long.pid)").await;
    let mut stdout = Vec::new();
    let status = loop {
        match long.next_event().await.unwrap() {
            ExecEvent::Stdout(bytes) => stdout.extend(bytes),
            ExecEvent::Exited(status) => break status,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(status.code, Some(0));
    assert_eq!(stdout, b"done\n");

    // A host process that dies holding a port: its calls end and the port is free again.
    let vm_dir = vm.dir().to_owned();
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_qemu-vm"))
        .arg("exec")
        .arg(&vm_dir)
        .args(["/bin/sh", "-c", "tail -f /dev/null"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until_count(&c, "tail", 1).await;
    assert!(matches!(
        vm.agent(Duration::from_millis(300)).await,
        Err(VmError::PortsBusy { .. })
    ));
    holder.kill().unwrap();
    holder.wait().unwrap();
    until_count(&c, "tail", 0).await;
    let again = vm.agent(Duration::from_secs(10)).await.unwrap();
    assert_eq!(again.port(), Some(1));
    assert_eq!(out(&again, "echo again").await, "again\n");
    assert_eq!(out(&a, "echo a").await, "a\n");

    drop((a, c, again, long));
    let vm = booted.0.take().unwrap();
    vm.kill().await.unwrap();
    assert!(!vm_dir.exists());
}

/// QEMU's CPU time so far (user and system).
fn cpu_time(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the command.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_no_host_holds_cost_an_idle_guest_nothing() {
    let config = config("idle").await;
    assert_eq!(config.agent_ports, qemu_vm::DEFAULT_AGENT_PORTS);
    let mut booted = KillOnDrop(Some(Vm::start(&config).await.unwrap()));
    let vm = booted.0.as_ref().unwrap();
    let agent = vm.agent(BOOT_TIMEOUT).await.unwrap();
    // One port connected, seven waiting for a host: QEMU idles (a waiting port that polled
    // in a loop kept it at 78% of a core under TCG).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_time(vm.pid());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let spent = cpu_time(vm.pid()) - before;
    let latency = median(trues(&agent, 9).await);
    eprintln!(
        "idle with {} ports waiting: QEMU used {spent:?} of CPU in 4 s; `true` median {latency:?}",
        config.agent_ports - 1
    );
    assert!(
        spent < Duration::from_millis(800),
        "QEMU used {spent:?} of CPU in 4 s idle"
    );
    // A port let go of waits again without spinning, and the next host gets it at once.
    drop(agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_time(vm.pid());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let spent = cpu_time(vm.pid()) - before;
    assert!(
        spent < Duration::from_millis(800),
        "QEMU used {spent:?} of CPU in 4 s with no host"
    );
    let reconnected = Instant::now();
    let agent = vm.agent(Duration::from_secs(10)).await.unwrap();
    assert_eq!(out(&agent, "echo back").await, "back\n");
    eprintln!("reconnect and echo: {:?}", reconnected.elapsed());
    drop(agent);
    let vm = booted.0.take().unwrap();
    vm.kill().await.unwrap();
}
