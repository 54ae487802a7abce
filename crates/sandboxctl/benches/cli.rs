//! The per-call cost of `sandboxctl`: one process per call on a warm key, as a script or an
//! agent host that shells out would run it, against one `docker exec <id> true` on a raw
//! container with the backend's hardening, in the same rounds.
//!
//! - `sandboxctl exec`: `sandboxctl exec --key K -- true`. Pass/fail: p50 at most 1.0× the CLI's.
//! - `sandboxctl stat`: `sandboxctl stat --key K .`. Pass/fail: p50 at most 0.5× the CLI's.
//!
//! Both are the release build of the binary (the one `cargo bench` builds), talking to the
//! engine the way the CLI does: a new process, a new connection, nothing cached between calls.

#[path = "../../backend-docker/benches/support/mod.rs"]
mod support;

use std::process::Stdio;
use std::time::Duration;

use paired_bench::raw_docker::docker;
use paired_bench::{exit_with, round_robin, Metric, Target};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use support::{backend, run_raw_container, unique_scope, Sweep};

const WARMUP: usize = 3;
const ROUNDS: usize = 45;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");

/// One `sandboxctl` call, required to exit 0 within two minutes.
async fn sandboxctl(args: &[&str]) {
    let run = tokio::process::Command::new(BIN)
        .args(["--min-isolation", "container"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("sandboxctl answers within two minutes")
        .expect("sandboxctl runs");
    assert!(
        output.status.success(),
        "sandboxctl {args:?}: {:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let scope = unique_scope("cli");
    let sweep = Sweep::new(&scope);
    // The key and kind sandboxctl names: `--key scope/t/bench`, kind `default`, default image.
    let key = SandboxKey::conversation(scope.as_str(), "t", "bench");
    let spec = SandboxSpec::builder("default")
        .image(support::IMAGE)
        .build()
        .expect("a valid spec");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    drop(sandbox);
    let raw = run_raw_container(&scope).await;
    let key_flag = format!("{scope}/t/bench");

    let mut exec = Metric::new("sandboxctl exec", Target::AtMost(1.0));
    let mut stat = Metric::new("sandboxctl stat", Target::AtMost(0.5));
    for round in 0..WARMUP + ROUNDS {
        let times = round_robin(
            round,
            vec![
                Box::pin(sandboxctl(&["exec", "--key", &key_flag, "--", "true"])),
                Box::pin(sandboxctl(&["stat", "--key", &key_flag, "."])),
                Box::pin(async {
                    docker(&["exec", &raw, "true"]).await;
                }),
            ],
        )
        .await;
        if round >= WARMUP {
            exec.push((times[0], times[2]));
            stat.push((times[1], times[2]));
        }
    }
    let passed = exec.report() & stat.report();
    sweep.finish(&backend, &["t"]).await;
    exit_with(passed);
}
