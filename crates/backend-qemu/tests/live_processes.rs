//! Several host processes on one VM (real QEMU, the image of `cargo xtask images vm`; under TCG on
//! a host without hardware KVM): two processes acquiring one key at once get one VM, and both run
//! commands in it, one while the other's still runs; nothing is left once the key is disposed of.
//!
//! The overlap is proven by construction, not by timing: the sleeper's command cannot end until
//! the echoer's echoes are done (it waits for their mark), so the echoes ran while it ran, however
//! slow the guest is. A backend that serialised the two processes' commands would never finish.
//!
//! The processes are this test binary run again with a role in their environment: each builds
//! its own backend over the same state directory, as two hosts on one machine would.
#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use backend_qemu::QemuBackend;
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};

/// Set in a child run: its role (`sleeper` or `echoer`).
const ROLE: &str = "QEMU_PROCESSES_ROLE";
/// Set in a child run: the state directory both children share.
const STATE: &str = "QEMU_PROCESSES_STATE";
/// The most a child run may take: the accelerator probe's KVM boot (15 s here), a TCG boot
/// under load, the other's commands, the exits.
const CHILD_DEADLINE: Duration = Duration::from_secs(240);
/// What precedes a child's acquire line (`conformance::child_process::child_acquire_line`) on its stdout.
const ACQUIRED: &str = "acquired: ";
/// The most the sleeper's command waits for the echoer's mark, in tenths of a second (it exits
/// 3 past it, so a lost mark fails the run instead of hanging it).
const WAIT_TENTHS: u32 = 1800;
/// The sleeper's mark: its command has started.
const SLEEPING: &str = "/tmp/sleeping";
/// The echoer's mark: its echoes are done.
const ECHOED: &str = "/tmp/echoed";
/// The sleeper's last mark: its command is over.
const SLEPT: &str = "/tmp/slept";

fn key() -> SandboxKey {
    SandboxKey::conversation("live-processes", "thread", "agent")
}

fn spec() -> SandboxSpec {
    SandboxSpec::builder("shell").build().unwrap()
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Command::argv(["/bin/sh", "-c", script])).timeout(Duration::from_secs(60))
}

#[test]
fn two_processes_acquiring_one_key_share_one_vm_and_run_commands_at_once() {
    if let Some(role) = std::env::var_os(ROLE) {
        // A child run: one process's part, then exit.
        let state = PathBuf::from(std::env::var_os(STATE).expect("the state directory"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(child(role.to_str().unwrap(), &state));
        return;
    }
    // The VMs the children start outlive them (QEMU runs in its own session): this process
    // adopts them, so the disposal below reaps them.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    // A fresh state directory, its accelerator probe not seeded: both processes start the
    // backend at once, as two hosts would (their probes used to race for one VM directory).
    let dir = tempfile::tempdir_in(support::run_parent()).unwrap();
    let state = dir.path().join("state");
    let started = Instant::now();
    let sleeper = spawn_child("sleeper", &state);
    let echoer = spawn_child("echoer", &state);
    let (sleeper_ok, sleeper) = finish_child(sleeper);
    let (echoer_ok, echoer) = finish_child(echoer);
    eprintln!("both children done after {:?}", started.elapsed());
    eprintln!("sleeper:\n{sleeper}\nechoer:\n{echoer}");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let left = runtime.block_on(async {
        let backend = support::connect(&state).await;
        let listed = backend.list("live-processes", None).await.unwrap();
        // A third process, once the two are gone: the VM is found warm.
        let started = Instant::now();
        let warm = backend
            .acquire(&key(), &spec())
            .await
            .map(|sandbox| (sandbox.instance_id().to_owned(), sandbox.freshly_created()));
        eprintln!(
            "a third process's warm acquire took {:?}",
            started.elapsed()
        );
        let disposed = backend.dispose(&key(), DisposeSelector::all()).await;
        assert!(disposed.is_none(), "{disposed:?}");
        (listed, warm)
    });
    let (listed, warm) = left;
    let acquired = |out: &str| -> (String, bool) {
        let line = out
            .lines()
            .find_map(|line| line.split_once(ACQUIRED).map(|(_, line)| line))
            .unwrap_or_else(|| panic!("no acquire line in {out}"));
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words[0], "ok", "the acquire failed: {line}");
        (words[1].to_owned(), words[2] == "true")
    };
    let (a, a_fresh) = acquired(&sleeper);
    let (b, b_fresh) = acquired(&echoer);
    assert!(sleeper_ok && echoer_ok, "a child run failed");
    assert_eq!(a, b, "both processes got the same VM");
    assert!(a_fresh ^ b_fresh, "exactly one of them made it");
    assert_eq!(listed.len(), 1, "one VM for the key: {listed:?}");
    assert_eq!(listed[0].instance_id, a);
    assert_eq!(warm.expect("the warm acquire"), (a.clone(), false));
    assert!(sleeper.contains("slept ok"), "{sleeper}");
    assert!(echoer.contains("echo ok"), "{echoer}");
    assert!(echoer.contains("overlapped ok"), "{echoer}");
    support::assert_nothing_left(&state);
}

fn spawn_child(role: &str, state: &Path) -> std::process::Child {
    Process::new(std::env::current_exe().unwrap())
        .args([
            "two_processes_acquiring_one_key_share_one_vm_and_run_commands_at_once",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(STATE, state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the test binary runs again")
}

/// Waits for a child run within [`CHILD_DEADLINE`] (killed past it) and returns whether it
/// passed, and its stdout.
fn finish_child(mut child: std::process::Child) -> (bool, String) {
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CHILD_DEADLINE {
            let _ = child.kill();
            eprintln!("a child run took over {CHILD_DEADLINE:?}");
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap();
    (status.success() && text.contains("1 passed"), text)
}

/// One process's part: acquire, then (sleeper) run a command that leaves a mark and waits for
/// the echoer's, or (echoer) wait for the sleeper's mark, run `echo`s while that command still
/// runs, then leave its own mark.
async fn child(role: &str, state: &Path) {
    let backend = QemuBackend::connect(support::config(state))
        .await
        .expect("connect");
    let started = Instant::now();
    let acquired = backend.acquire(&key(), &spec()).await;
    let took = started.elapsed();
    println!(
        "{ACQUIRED}{}",
        conformance::child_process::child_acquire_line(&acquired)
    );
    println!("acquire took {} ms", took.as_millis());
    let sandbox = acquired.expect("acquire");
    match role {
        "sleeper" => {
            let started = Instant::now();
            let waiting = sh(&format!(
                "touch {SLEEPING}; t=0; until [ -e {ECHOED} ]; do \
                 t=$((t + 1)); [ $t -le {WAIT_TENTHS} ] || exit 3; sleep 0.1; done; \
                 touch {SLEPT}"
            ))
            .timeout(Duration::from_secs(u64::from(WAIT_TENTHS) / 10 + 60));
            let out = sandbox.exec(waiting).await.expect("exec");
            assert_eq!(out.exit_code, 0, "the echoer's mark never came: {out:?}");
            println!(
                "the command waiting for the echoes took {} ms",
                started.elapsed().as_millis()
            );
            println!("slept ok");
        }
        "echoer" => {
            // The sleeper's command has started once its mark is there.
            let deadline = Instant::now() + Duration::from_secs(180);
            wait_for(&*sandbox, SLEEPING, deadline, "the sleeper never started").await;
            let during = echoes(&*sandbox).await;
            println!("echo ok; during the other's command {during:?}");
            // The sleeper's command is still running: it waits for the mark made below.
            let out = sandbox
                .exec(sh(&format!(
                    "test -e {SLEPT} && echo done || echo running; touch {ECHOED}"
                )))
                .await
                .expect("exec");
            assert_eq!(
                out.stdout, b"running\n",
                "the echoes ran during the other's command"
            );
            println!("overlapped ok");
            // For comparison: the same echoes once the other's command is over.
            wait_for(&*sandbox, SLEPT, deadline, "the sleeper never finished").await;
            let alone = echoes(&*sandbox).await;
            println!("echoes alone {alone:?}");
        }
        other => panic!("unknown role {other}"),
    }
}

/// Polls until `path` exists in the guest, failing with `what` past `deadline`.
async fn wait_for(sandbox: &dyn sandbox_core::Sandbox, path: &str, deadline: Instant, what: &str) {
    loop {
        let out = sandbox
            .exec(sh(&format!("test -e {path}")))
            .await
            .expect("exec");
        if out.exit_code == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Five `echo`s one after another; their latencies.
async fn echoes(sandbox: &dyn sandbox_core::Sandbox) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["/bin/echo", "hello"])))
            .await
            .expect("exec");
        latencies.push(started.elapsed());
        assert_eq!(out.stdout, b"hello\n");
        assert_eq!(out.exit_code, 0);
    }
    latencies
}
