//! Acquire latency (docs/docker-backend.md#acquire-and-ownership-checks).
//!
//! - Warm acquire, pass/fail: a second `acquire` of a running, verified container is one
//!   `docker container inspect` (the verified-container cache), so it must stay within 1.2× one raw
//!   `docker container inspect --format '{{json .}}'` of a container.
//! - Cold acquire: a fresh key each round (inspect; the other-egress look, OS re-check and image
//!   presence at once; create; start with an inspect; one guest call for the tool probe, with the
//!   host writing the storage base engine-side alongside it; a walk of the base) against a raw
//!   `docker run -d` with the same hardening plus one `docker exec -u 0 mkdir -p` of the base (as
//!   root: the image user cannot create it; the backend's base is the image user's). The warm
//!   key's acquire made a container of the same image first, so the base's owner is known before
//!   each cold round's guest says it (docs/docker-backend.md#storage-base). Disposal is not timed.
//! - Reset (`docker reset`, reported against 0.5×): the reset of a sandbox holding a file made
//!   after its acquire against the disposal of a key's sandbox plus a cold acquire of it, each
//!   round's key acquired first untimed (docs/docker-backend.md#reset-and-fork).

mod support;

use paired_bench::raw_docker::docker;
use paired_bench::{exit_with, paired, Metric, Target};
use sandbox_core::{DisposeSelector, SandboxBackend, SandboxKey, SandboxSpec};
use support::{
    backend, remove_raw, reset_against_cold, run_raw_container, unique_scope, Sweep, BASE,
};

const WARM_WARMUP: usize = 3;
const WARM_ROUNDS: usize = 41;
const COLD_WARMUP: usize = 1;
const COLD_ROUNDS: usize = 11;

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let scope = unique_scope("acquire");
    let sweep = Sweep::new(&scope);
    let spec = SandboxSpec::builder("bench")
        .image(support::IMAGE)
        .build()
        .expect("a valid spec");

    // Warm: the key's container exists, running and verified by the first acquire.
    let warm_key = SandboxKey::conversation(scope.as_str(), "warm", "bench");
    let first = backend.acquire(&warm_key, &spec).await.expect("acquire");
    let warm_id = first.instance_id().to_owned();
    drop(first);
    let raw = run_raw_container(&scope).await;
    let mut warm = Metric::new("warm acquire", Target::AtMost(1.2));
    for round in 0..WARM_WARMUP + WARM_ROUNDS {
        let pair = paired(
            round,
            async {
                let again = backend.acquire(&warm_key, &spec).await.expect("acquire");
                assert_eq!(again.instance_id(), warm_id, "the same container is reused");
                assert!(!again.freshly_created());
            },
            async {
                docker(&["container", "inspect", "--format", "{{json .}}", &raw]).await;
            },
        )
        .await;
        if round >= WARM_WARMUP {
            warm.push(pair);
        }
    }
    remove_raw(&raw).await;

    // Cold: a key never seen before against a fresh raw container, each removed untimed.
    let mut cold = Metric::new("cold acquire", Target::AtMost(1.0));
    for round in 0..COLD_WARMUP + COLD_ROUNDS {
        let key = SandboxKey::conversation(scope.as_str(), "cold", format!("bench-{round}"));
        let mut raw_id = String::new();
        let pair = paired(
            round,
            async {
                let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
                assert!(sandbox.freshly_created(), "a new key makes a new container");
            },
            async {
                raw_id = run_raw_container(&scope).await;
                // As root: the image user cannot create `/maf-sandbox`, where the backend falls
                // back to an engine-side tar (docs/docker-backend.md#storage-base).
                docker(&["exec", "-u", "0", &raw_id, "mkdir", "-p", BASE]).await;
            },
        )
        .await;
        let failure = backend.dispose(&key, DisposeSelector::all()).await;
        assert!(failure.is_none(), "disposal of the cold key: {failure:?}");
        remove_raw(&raw_id).await;
        if round >= COLD_WARMUP {
            cold.push(pair);
        }
    }

    // Reset: a sandbox holding a file made after its acquire, returned to its acquire state,
    // against disposing of it and acquiring a new key cold. Reported against the 0.5x the design
    // asks for; reset makes the container again, so it costs about what a cold acquire costs.
    let reset_key = SandboxKey::conversation(scope.as_str(), "reset", "bench");
    let current = backend.acquire(&reset_key, &spec).await.expect("acquire");
    let mut reset = Metric::new("docker reset", Target::Reference(0.5));
    reset_against_cold(
        &mut reset,
        current,
        &backend,
        &spec,
        |round| SandboxKey::conversation(scope.as_str(), "reset", format!("cold-{round}")),
        (COLD_WARMUP, COLD_ROUNDS),
        || async {},
    )
    .await;

    let passed = warm.report() & cold.report() & reset.report();
    sweep.finish(&backend, &["warm", "cold", "reset"]).await;
    exit_with(passed);
}
