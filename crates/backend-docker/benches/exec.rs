//! Exec latency (docker.md rule 31): `sandbox.exec(["true"])` through the exec wrapper against a
//! raw `docker exec <id> true` on a container started with the same hardening. Pass/fail: the
//! backend's p50 at most 1.10× the raw p50, judged on the median of paired per-round ratios.
//!
//! Two more lines split the difference, reported only: the same wrapper invocation sent through
//! the raw CLI (what the guest-side wrapper costs over a bare `true`), and the backend against
//! that (what the host side adds: nonce, encoding, the bounded runner, the pinned context).

mod support;

use std::time::Duration;

use exec_wrapper::{docker_wrapper_argv, encode_invocation, new_nonce};
use sandbox_core::{Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::{
    backend, docker, round_robin, run_raw_container, unique_scope, Metric, Sweep, Target,
};

const WARMUP: usize = 3;
const ROUNDS: usize = 45;

/// `docker exec -w / <id> sh -c <wrapper> … true`, as the backend sends it, through the raw CLI.
async fn raw_wrapper_true(id: &str) {
    let nonce = new_nonce().expect("a nonce");
    let invocation = encode_invocation(b"/", &[b"true"]).expect("an encodable argv");
    let mut args = vec![
        "exec".to_owned(),
        "-w".to_owned(),
        "/".to_owned(),
        id.to_owned(),
    ];
    args.extend(docker_wrapper_argv(&nonce, &invocation));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = docker(&args).await;
    assert!(
        String::from_utf8_lossy(&output.stderr).starts_with(nonce.as_str()),
        "the wrapper printed its nonce first"
    );
}

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let scope = unique_scope("exec");
    let sweep = Sweep::new(&scope);
    let key = SandboxKey::conversation(scope.as_str(), "t", "bench");
    let spec = SandboxSpec::builder("bench")
        .image(support::IMAGE)
        .build()
        .expect("a valid spec");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let raw = run_raw_container(&scope).await;

    let request = || ExecRequest::new(Command::argv(["true"])).timeout(Duration::from_secs(60));
    let mut exec = Metric::new("exec p50", Target::AtMost(1.10));
    let mut wrapper = Metric::new("exec wrapper via raw CLI vs raw true", Target::ReportedOnly);
    let mut host = Metric::new("exec backend vs wrapper via raw CLI", Target::ReportedOnly);
    for round in 0..WARMUP + ROUNDS {
        let times = round_robin(
            round,
            vec![
                Box::pin(async {
                    let output = sandbox.exec(request()).await.expect("exec runs");
                    assert_eq!(output.exit_code, 0);
                }),
                Box::pin(async {
                    docker(&["exec", &raw, "true"]).await;
                }),
                Box::pin(raw_wrapper_true(&raw)),
            ],
        )
        .await;
        if round >= WARMUP {
            exec.push((times[0], times[1]));
            wrapper.push((times[2], times[1]));
            host.push((times[0], times[2]));
        }
    }
    let passed = exec.report();
    wrapper.report();
    host.report();

    drop(sandbox);
    sweep.finish(&backend, &["t"]).await;
    support::exit_with(passed);
}
