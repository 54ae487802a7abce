//! The backend under gVisor (docs/docker-backend.md#gvisor), with `runsc` registered with the
//! engine (as `.ci/run` does):
//!
//! - `gvisor exec p50`, pass/fail: `sandbox.exec(["echo", "hi"])` under runsc against a raw
//!   `docker exec <id> echo hi` on a runsc container with the same hardening; at most 0.95×.
//! - `gvisor cold acquire`, pass/fail: a fresh key each round against a raw `docker run -d
//!   --runtime runsc` with the same hardening plus the same `mkdir -p` of the base; at most 1.0×.
//! - `gvisor cost over runc`, reported only: the same backend exec under runsc against under
//!   runc, so users see what the rung costs.

mod support;

use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use paired_bench::raw_docker::docker;
use paired_bench::{exit_with, paired, Metric, Target};
use sandbox_core::{Command, DisposeSelector, ExecRequest, Isolation, SandboxBackend, SandboxKey};
use support::{bench_spec, remove_raw, run_raw_container_under, unique_scope, Sweep, BASE};

/// The engine's name for gVisor.
const RUNSC: &str = "runsc";

const WARMUP: usize = 3;
const EXEC_ROUNDS: usize = 41;
const COLD_WARMUP: usize = 1;
const COLD_ROUNDS: usize = 9;

#[tokio::main]
async fn main() {
    let mut config = DockerConfig::default();
    config.runtime = Some(RUNSC.to_owned());
    let gvisor = DockerBackend::connect(config)
        .await
        .expect("the backend connects under runsc (register it with the engine)");
    assert_eq!(
        gvisor.isolation(),
        Isolation::HardenedContainer,
        "runsc is not verified as gVisor: {:?}",
        gvisor.runtime_verification()
    );
    let runc = support::backend().await;
    let scope = unique_scope("gvisor");
    let sweep = Sweep::new(&scope);
    let spec = bench_spec();
    let key = SandboxKey::conversation(scope.as_str(), "t", "bench");
    let sandbox = gvisor.acquire(&key, &spec).await.expect("acquire");
    let runc_key = SandboxKey::conversation(scope.as_str(), "runc", "bench");
    let runc_sandbox = runc.acquire(&runc_key, &spec).await.expect("acquire");
    let raw = run_raw_container_under(&scope, RUNSC).await;
    let request =
        || ExecRequest::new(Command::argv(["echo", "hi"])).timeout(Duration::from_secs(60));

    let mut exec = Metric::new("gvisor exec p50", Target::AtMost(0.95));
    let mut cost = Metric::new("gvisor cost over runc", Target::ReportedOnly);
    for round in 0..WARMUP + EXEC_ROUNDS {
        let pair = paired(
            round,
            async {
                let out = sandbox.exec(request()).await.expect("exec");
                assert_eq!(out.stdout, b"hi\n");
            },
            async {
                docker(&["exec", &raw, "echo", "hi"]).await;
            },
        )
        .await;
        let over_runc = paired(
            round,
            async {
                sandbox.exec(request()).await.expect("exec");
            },
            async {
                runc_sandbox.exec(request()).await.expect("exec");
            },
        )
        .await;
        if round >= WARMUP {
            exec.push(pair);
            cost.push(over_runc);
        }
    }
    remove_raw(&raw).await;
    drop((sandbox, runc_sandbox));

    let mut cold = Metric::new("gvisor cold acquire", Target::AtMost(1.0));
    for round in 0..COLD_WARMUP + COLD_ROUNDS {
        let key = SandboxKey::conversation(scope.as_str(), "cold", format!("bench-{round}"));
        let mut raw_id = String::new();
        let pair = paired(
            round,
            async {
                let sandbox = gvisor.acquire(&key, &spec).await.expect("acquire");
                assert!(sandbox.freshly_created(), "a new key makes a new container");
            },
            async {
                raw_id = run_raw_container_under(&scope, RUNSC).await;
                docker(&["exec", "-u", "0", &raw_id, "mkdir", "-p", BASE]).await;
            },
        )
        .await;
        let failure = gvisor.dispose(&key, DisposeSelector::all()).await;
        assert!(failure.is_none(), "disposal of the cold key: {failure:?}");
        remove_raw(&raw_id).await;
        if round >= COLD_WARMUP {
            cold.push(pair);
        }
    }

    let passed = exec.report() & cold.report() & cost.report();
    sweep.finish(&gvisor, &["t", "runc", "cold"]).await;
    exit_with(passed);
}
