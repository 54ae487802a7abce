//! The sbx backend against the bare CLI and against `confined-fs` alone, on `sbx-sim`, in the
//! same run and on the same sandbox:
//!
//! - `exec echo hi`: `sandbox.exec(["echo", "hi"])` through the wrapper (`unshare`, `bind`,
//!   `run`) against a bare `sbx-sim exec <name> echo hi`. Target: the median of paired per-round ratios
//!   at most 1.10. `sbx-sim` runs commands as the workspace's owner, root where the bench runs
//!   as root: then the wrapper's `run` stage goes on in the `bind` stage's shell (no nested user
//!   namespace); a non-root caller's chain has a second `unshare` and `sh` more.
//! - host-plane file operations: a 4 KiB `write_file` then `read_file` through the backend
//!   against the same write and read on a `confined-fs` root opened on the same workspace
//!   directory. Target: at most 1.05 (the backend adds no round trip to the guest). A third side,
//!   reported only, makes the same write and read on a `confined-fs` root opened on the workspace
//!   generation, as the backend's plane is (`work/…`: the walk through the storage base the guest
//!   may replace between calls), and splits the row into that walk and the backend's own layer.
//!
//! Each line reads `name: backend X ms, raw Y ms, ratio Z (target ≤ T) PASS|FAIL`, and each row
//! goes to the `cargo xtask bench` report; the process exits non-zero when a target is missed.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, ExitKind};
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{unique_scope, SimHost};

const WARMUP: usize = 3;
// Enough rounds that a run's median moves less than the targets' margins: an exec round takes
// about 0.2 s, a file round under 1 ms.
const EXEC_ROUNDS: usize = 61;
const FILE_ROUNDS: usize = 2001;
const FILE_BYTES: usize = 4096;

use paired_bench::{median, record_row};

/// Prints the report line and records the row; returns whether the target was met (always, for a
/// row reported only, which has no `target`).
fn report(name: &str, backend: &[Duration], raw: &[Duration], target: Option<f64>) -> bool {
    let ms = |d: &[Duration]| median(d.iter().map(|d| d.as_secs_f64() * 1e3).collect());
    let ratio = median(
        backend
            .iter()
            .zip(raw)
            .map(|(b, r)| b.as_secs_f64() / r.as_secs_f64())
            .collect(),
    );
    let (pass, target) = match target {
        Some(target) => (ratio <= target, format!("≤ {target:.2}")),
        None => (true, "reported only".to_owned()),
    };
    println!(
        "{name}: backend {:.3} ms, raw {:.3} ms, ratio {ratio:.2} (target {target}) {}",
        ms(backend),
        ms(raw),
        if pass { "PASS" } else { "FAIL" }
    );
    record_row(name, ms(backend), ms(raw), ratio, &target, pass);
    pass
}

#[tokio::main]
async fn main() {
    let host = SimHost::new();
    let backend = host.backend().await;
    let scope = unique_scope("bench");
    let key = SandboxKey::conversation(scope.as_str(), "t", "bench");
    let spec = SandboxSpec::builder("bench").build().expect("a valid spec");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let name = backend.sandbox_name(&key, "bench");

    // Exec, alternating which goes first each round.
    let bare = || {
        BoundedCommand::new(host.sim.clone(), Duration::from_secs(60))
            .args(["exec", name.as_str(), "echo", "hi"])
            .envs(host.env())
            .run()
    };
    let through = || {
        sandbox
            .exec(ExecRequest::new(Command::argv(["echo", "hi"])).timeout(Duration::from_secs(60)))
    };
    let (mut exec_backend, mut exec_raw) = (Vec::new(), Vec::new());
    for round in 0..WARMUP + EXEC_ROUNDS {
        let mut timed = [Duration::ZERO; 2];
        for which in [round % 2, 1 - round % 2] {
            let started = Instant::now();
            if which == 0 {
                let out = through().await.expect("exec");
                assert_eq!(out.stdout, b"hi\n");
            } else {
                let out = bare().await.expect("bare exec");
                assert_eq!(
                    (out.status, out.stdout.as_slice()),
                    (ExitKind::Exited(0), &b"hi\n"[..])
                );
            }
            timed[which] = started.elapsed();
        }
        if round >= WARMUP {
            exec_backend.push(timed[0]);
            exec_raw.push(timed[1]);
        }
    }

    // Host-plane file operations against confined-fs on the same workspace directory.
    let dir = backend.workspace_root().join(&name);
    let generation = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().into_string().unwrap())
        .find(|n| n.starts_with("ws-"))
        .expect("the workspace generation");
    let root = std::sync::Arc::new(
        confined_fs::ConfinedRoot::open(dir.join(&generation).join("work")).unwrap(),
    );
    let generation_root =
        std::sync::Arc::new(confined_fs::ConfinedRoot::open(dir.join(&generation)).unwrap());
    let bytes = vec![7u8; FILE_BYTES];
    let (mut files_backend, mut files_raw, mut files_generation) =
        (Vec::new(), Vec::new(), Vec::new());
    for round in 0..WARMUP + FILE_ROUNDS {
        let mut timed = [Duration::ZERO; 3];
        // Each side takes each place in the round in turn.
        for which in [round % 3, (round + 1) % 3, (round + 2) % 3] {
            let started = Instant::now();
            if which == 2 {
                let read = plain_write_read(&generation_root, "work/bench-c.bin", &bytes).await;
                assert_eq!(read.len(), FILE_BYTES);
            } else if which == 0 {
                sandbox
                    .write_file("bench-a.bin", &bytes, ".")
                    .await
                    .unwrap();
                let read = sandbox
                    .read_file("bench-a.bin", ".", 1 << 20)
                    .await
                    .unwrap();
                assert_eq!(read.len(), FILE_BYTES);
            } else {
                let read = plain_write_read(&root, "bench-b.bin", &bytes).await;
                assert_eq!(read.len(), FILE_BYTES);
            }
            timed[which] = started.elapsed();
        }
        if round >= WARMUP {
            files_backend.push(timed[0]);
            files_raw.push(timed[1]);
            files_generation.push(timed[2]);
        }
    }

    let exec_ok = report("sbx exec echo hi", &exec_backend, &exec_raw, Some(1.10));
    let files_ok = report(
        "sbx host-plane write+read 4 KiB",
        &files_backend,
        &files_raw,
        Some(1.05),
    );
    report(
        "sbx host-plane write+read 4 KiB vs confined-fs on the generation",
        &files_backend,
        &files_generation,
        None,
    );
    report(
        "confined-fs write+read 4 KiB, generation root vs the storage base's",
        &files_generation,
        &files_raw,
        None,
    );
    let disposal = backend.dispose(&key, DisposeSelector::all()).await;
    assert!(disposal.is_none(), "{disposal:?}");
    host.assert_nothing_left().await;
    // Exiting skips destructors: the temporary directories go first.
    drop(host);
    if !(exec_ok && files_ok) {
        std::process::exit(1);
    }
}

/// A `write` then a `read` of `path` on `root`, each on the blocking pool as the backend runs
/// them; the bytes read back.
async fn plain_write_read(
    root: &std::sync::Arc<confined_fs::ConfinedRoot>,
    path: &'static str,
    bytes: &[u8],
) -> Vec<u8> {
    let (write_root, data) = (root.clone(), bytes.to_vec());
    tokio::task::spawn_blocking(move || write_root.write(path, &data).unwrap())
        .await
        .unwrap();
    let read_root = root.clone();
    tokio::task::spawn_blocking(move || read_root.read(path, 1 << 20).unwrap())
        .await
        .unwrap()
}
