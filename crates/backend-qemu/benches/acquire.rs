//! `qemu cold acquire`, `qemu snapshot acquire`, `qemu pool acquire`, `qemu warm acquire` and
//! `qemu fork` (docs/qemu-backend.md), run by `cargo xtask bench`.
//!
//! - Cold, pass/fail (≤ 1.3×): `acquire` of a key never seen (the record, the name's locks, the
//!   restore of the machine's baseline snapshot and the guest's renewal, the storage base made
//!   in the guest) against the bare boot of the `qemu-vm` driver (`Vm::start` to the agent's
//!   handshake) with the same image, accelerator, CPUs and memory. Disposal and the raw VM's
//!   kill are not timed. The warm-up round makes the baseline (a boot and a save).
//! - Snapshot, pass/fail (≤ 0.25×): the same rounds, judged as what the baseline is for: a
//!   fresh sandbox for a quarter of a boot or less.
//! - Pool, pass/fail (≤ 0.1×): `acquire` of a key never seen from a backend with a warm pool of
//!   one on the same state directory (the claim: a rename, the record, the agent's connection,
//!   the storage base made in the guest), against the same bare boot. The pool is full before
//!   each round (not timed); the refill the claim starts runs beside the next round's bare boot.
//! - Warm, pass/fail (≤ 5 ms at p50, absolute): a second `acquire` of the running VM (each
//!   round's handle dropped, as a host that acquires per call does), with the driver's
//!   `Vm::attach` of the same VM's directory (its `vm.json`, QEMU's process) beside it as the
//!   reference of finding a running VM at all.
//!
//! - Fork, pass/fail (≤ 1.5 s at p50, absolute): `fork` of a VM holding 64 MiB of written files
//!   (the save of the running source, its resume, the restore of the copy and its renewal) into
//!   a new key, beside a bare boot of the driver as the reference of making a VM at all. The
//!   fork's disposal and the raw VM's kill are not timed.
//!
//! The accelerator is in each row's name. One VM boots at a time.

mod support;

use paired_bench::{exit_with, measured, paired, timed, Metric, Target};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use support::{accel_name, backend, dispose_thread, raw_boot, raw_config, Run, SCOPE};

const COLD_WARMUP: usize = 1;
const COLD_ROUNDS: usize = 5;
const WARM_WARMUP: usize = 3;
const WARM_ROUNDS: usize = 41;
const POOL_WARMUP: usize = 1;
const POOL_ROUNDS: usize = 5;
const FORK_WARMUP: usize = 1;
const FORK_ROUNDS: usize = 5;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let run = Run::new("acquire");
    let backend = backend(&run).await;
    let accel = accel_name(&backend);
    let spec = SandboxSpec::builder("bench").build().expect("a valid spec");

    let mut cold = Metric::new(format!("qemu cold acquire [{accel}]"), Target::AtMost(1.3))
        .against("the bare boot of the qemu-vm driver (Vm::start to the agent's handshake)");
    let mut snapshot = Metric::new(
        format!("qemu snapshot acquire [{accel}]"),
        Target::AtMost(0.25),
    )
    .against("the bare boot of the qemu-vm driver (Vm::start to the agent's handshake)");
    for round in 0..COLD_WARMUP + COLD_ROUNDS {
        let key = SandboxKey::conversation(SCOPE, "cold", format!("bench-{round}"));
        let config = raw_config(&run, &backend, &format!("raw-{round}"));
        let mut raw_vm = None;
        let pair = paired(
            round,
            async {
                let sandbox = backend.acquire(&key, &spec).await.expect("cold acquire");
                assert!(sandbox.freshly_created(), "a new key boots a new VM");
            },
            async {
                raw_vm = Some(raw_boot(&config).await);
            },
        )
        .await;
        let failure = backend
            .dispose(&key, sandbox_core::DisposeSelector::all())
            .await;
        assert!(failure.is_none(), "disposal of the cold key: {failure:?}");
        if let Some((vm, agent)) = raw_vm {
            // Not timed: what the backend's one guest command of a cold acquire (making the
            // storage base) costs as the first command of a fresh guest.
            let (_, first) = timed(support::raw_run(
                &agent,
                &["/bin/mkdir", "-p", "--", "/maf-sandbox/work"],
            ))
            .await;
            eprintln!(
                "cold round {round}: the first command of the fresh bare guest (mkdir -p of the \
                 base) took {:.1} ms",
                first.as_secs_f64() * 1000.0
            );
            drop(agent);
            vm.kill().await.expect("the bare VM is killed");
        }
        eprintln!(
            "cold round {round}: acquire {:.1} ms, bare boot {:.1} ms",
            pair.0.as_secs_f64() * 1000.0,
            pair.1.as_secs_f64() * 1000.0
        );
        if round >= COLD_WARMUP {
            cold.push(pair);
            snapshot.push(pair);
        }
    }

    let pooled = support::pooled_backend(&run, 1).await;
    let mut pool = Metric::new(format!("qemu pool acquire [{accel}]"), Target::AtMost(0.1))
        .against("the bare boot of the qemu-vm driver (Vm::start to the agent's handshake)");
    for round in 0..POOL_WARMUP + POOL_ROUNDS {
        let key = SandboxKey::conversation(SCOPE, "pool", format!("bench-{round}"));
        let config = raw_config(&run, &backend, &format!("raw-pool-{round}"));
        pooled
            .fill_pool(std::time::Duration::from_secs(300))
            .await
            .expect("the pool fills");
        let members = pooled.pool_members().await.expect("the pool's members");
        let mut raw_vm = None;
        let mut served = None;
        let pair = paired(
            round,
            async {
                let sandbox = pooled.acquire(&key, &spec).await.expect("pool acquire");
                assert!(sandbox.freshly_created(), "a new key is a fresh sandbox");
                served = Some(sandbox.instance_id().to_owned());
            },
            async {
                raw_vm = Some(raw_boot(&config).await);
            },
        )
        .await;
        let served = served.expect("served");
        assert!(
            members.contains(&served),
            "{served} was claimed from {members:?}"
        );
        let failure = pooled
            .dispose(&key, sandbox_core::DisposeSelector::all())
            .await;
        assert!(failure.is_none(), "disposal of the pool key: {failure:?}");
        if let Some((vm, agent)) = raw_vm {
            drop(agent);
            vm.kill().await.expect("the bare VM is killed");
        }
        eprintln!(
            "pool round {round}: acquire {:.1} ms, bare boot {:.1} ms",
            pair.0.as_secs_f64() * 1000.0,
            pair.1.as_secs_f64() * 1000.0
        );
        if round >= POOL_WARMUP {
            pool.push(pair);
        }
    }
    let purged = pooled.purge_pool().await;
    assert!(purged.undisposed.is_none(), "{:?}", purged.undisposed);
    drop(pooled);

    let warm_key = SandboxKey::conversation(SCOPE, "warm", "bench");
    let first = backend.acquire(&warm_key, &spec).await.expect("acquire");
    let instance = first.instance_id().to_owned();
    drop(first);
    let vm_dir = run.state().join("vms").join(&instance);
    let mut warm = Metric::new(
        format!("qemu warm acquire [{accel}]"),
        Target::AbsoluteMs(5.0),
    )
    .against("Vm::attach of the same VM's directory through the driver");
    let (backend_ref, warm_key, spec, instance, vm_dir) =
        (&backend, &warm_key, &spec, &instance, &vm_dir);
    warm.extend(
        measured(WARM_WARMUP, WARM_ROUNDS, move |round| {
            paired(
                round,
                async move {
                    let again = backend_ref
                        .acquire(warm_key, spec)
                        .await
                        .expect("warm acquire");
                    assert_eq!(again.instance_id(), instance, "the same VM is reused");
                    assert!(!again.freshly_created());
                },
                async move {
                    let vm = qemu_vm::Vm::attach(vm_dir).expect("the running VM is found");
                    assert!(vm.is_alive());
                },
            )
        })
        .await,
    );

    // Fork: a source holding 64 MiB of written files, forked into a new key each round.
    let source_key = SandboxKey::conversation(SCOPE, "fork", "source");
    let source = backend.acquire(&source_key, spec).await.expect("acquire");
    let written = source
        .exec(
            sandbox_core::ExecRequest::new(sandbox_core::Command::argv([
                "sh",
                "-c",
                "head -c 67108864 /dev/urandom > held.bin && sync && stat -c %s held.bin",
            ]))
            .timeout(std::time::Duration::from_secs(300)),
        )
        .await
        .expect("the source's files are written");
    assert_eq!(written.stdout_text(), "67108864\n", "{written:?}");
    let mut fork = Metric::new(format!("qemu fork [{accel}]"), Target::AbsoluteMs(1500.0))
        .against("the bare boot of the qemu-vm driver (Vm::start to the agent's handshake)");
    for round in 0..FORK_WARMUP + FORK_ROUNDS {
        let target = SandboxKey::conversation(SCOPE, "fork", format!("copy-{round}"));
        let config = raw_config(&run, &backend, &format!("raw-fork-{round}"));
        let mut raw_vm = None;
        let pair = paired(
            round,
            async {
                backend
                    .fork(&source_key, spec, &target)
                    .await
                    .expect("fork");
            },
            async {
                raw_vm = Some(raw_boot(&config).await);
            },
        )
        .await;
        let failure = backend
            .dispose(&target, sandbox_core::DisposeSelector::all())
            .await;
        assert!(failure.is_none(), "disposal of the fork: {failure:?}");
        if let Some((vm, agent)) = raw_vm {
            drop(agent);
            vm.kill().await.expect("the bare VM is killed");
        }
        eprintln!(
            "fork round {round}: fork {:.1} ms, bare boot {:.1} ms",
            pair.0.as_secs_f64() * 1000.0,
            pair.1.as_secs_f64() * 1000.0
        );
        if round >= FORK_WARMUP {
            fork.push(pair);
        }
    }
    drop(source);

    let passed = cold.report() & snapshot.report() & pool.report() & warm.report() & fork.report();
    dispose_thread(&backend, "fork").await;
    dispose_thread(&backend, "warm").await;
    dispose_thread(&backend, "cold").await;
    run.assert_nothing_left();
    drop(run);
    exit_with(passed);
}
