//! `qemu exec p50` (docs/qemu-backend.md), run by `cargo xtask bench`: `exec` of `true` in a warm
//! VM of the backend against `docker exec <id> true` (the CLI) on a raw `sandbox-base:local`
//! container hardened as the docker backend's workloads are, on this machine, in the same
//! rounds. The accelerator is in the row's name; under KVM the target is ≤ 1.0×, under TCG
//! (every guest instruction emulated) the row is reported only.

mod support;

use paired_bench::raw_docker::{docker, RawContainer};
use paired_bench::{exit_with, measured, paired, Metric, Target};
use sandbox_core::{Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::{accel_name, backend, dispose_thread, Run, SCOPE};

const WARMUP: usize = 3;
const ROUNDS: usize = 30;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let run = Run::new("exec");
    let backend = backend(&run).await;
    let accel = accel_name(&backend);
    let target = match backend.accelerator().accel {
        qemu_vm::Accel::Kvm => Target::AtMost(1.0),
        _ => Target::ReportedOnlyBecause("TCG"),
    };
    let spec = SandboxSpec::builder("bench").build().expect("a valid spec");
    let key = SandboxKey::conversation(SCOPE, "exec", "bench");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let raw = RawContainer::start(
        "sandbox-base:local",
        &format!("{SCOPE}-{}", std::process::id()),
    )
    .await;

    let mut exec = Metric::new(format!("qemu exec p50 [{accel}]"), target)
        .against("`docker exec <id> true` (CLI) on a raw sandbox-base:local container");
    {
        let (sandbox, raw) = (&sandbox, &raw);
        exec.extend(
            measured(WARMUP, ROUNDS, move |round| {
                paired(
                    round,
                    async move {
                        let out = sandbox
                            .exec(ExecRequest::new(Command::argv(["true"])))
                            .await
                            .expect("exec");
                        assert_eq!(out.exit_code, 0);
                    },
                    async move {
                        docker(&["exec", &raw.id, "true"]).await;
                    },
                )
            })
            .await,
        );
    }

    let passed = exec.report();
    drop(raw);
    drop(sandbox);
    dispose_thread(&backend, "exec").await;
    run.assert_nothing_left();
    drop(run);
    exit_with(passed);
}
