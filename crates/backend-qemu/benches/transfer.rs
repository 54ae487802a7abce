//! `qemu 1 KiB write/read` and `qemu 64 MiB write/read` (docs/qemu-backend.md), run by
//! `cargo xtask bench`. The raw reference is the same bytes through the `qemu-vm` driver's agent
//! calls directly (`AgentClient::write_file`, `read_file`) on the backend's own VM, over another
//! of its agent ports (`Vm::attach` of the VM's directory, then `Vm::agent`), to the same file:
//! one guest, one disk and one file on both sides, so what is left is the backend's own work
//! (the guest-path rules' stats of the path, the parent and leaf checks, the health watch).
//!
//! - 1 KiB write and read three components below the storage base (`d1/d2/small.bin`), reported
//!   only (as the docker backend's 1 KiB rows).
//! - 64 MiB write and read of the storage base's `big.bin`, pass/fail ≤ 1.1×: the backend's
//!   checks are a constant few round trips on a transfer of a second. A write above the
//!   backend's declared per-file ceiling is refused (`TransferCapExceeded`); while that ceiling
//!   is below 64 MiB the bench checks the refusal and measures the write at the ceiling, and
//!   the row's name says the size it measured.
//!
//! The report also times the backend's checks alone (`stat_file` of the read's path).

mod support;

use std::time::Duration;

use sandbox_core::{Command, ErrorKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::{
    accel_name, backend, dispose_thread, exit_with, paired, raw_run, Metric, Run, Target,
    RAW_TIMEOUT, SCOPE,
};

const MIB: usize = 1024 * 1024;
const BIG: usize = 64 * MIB;
const SMALL: usize = 1024;
const BIG_WARMUP: usize = 1;
const BIG_ROUNDS: usize = 7;
const SMALL_WARMUP: usize = 3;
const SMALL_ROUNDS: usize = 30;

/// The storage base both sides write under.
const BASE: &str = "/maf-sandbox/work";

fn size_name(bytes: usize) -> String {
    if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / 1024)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let run = Run::new("transfer");
    let backend = backend(&run).await;
    let accel = accel_name(&backend);
    let spec = SandboxSpec::builder("bench")
        .files_in(backend_qemu::TRANSFER_CEILING)
        .files_out(backend_qemu::TRANSFER_CEILING)
        .build()
        .expect("a valid spec");
    let key = SandboxKey::conversation(SCOPE, "transfer", "bench");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    // The driver's own connection to the same VM, on another agent port.
    let vm = qemu_vm::Vm::attach(&run.state().join("vms").join(sandbox.instance_id()))
        .expect("the backend's VM is found");
    let agent = vm
        .agent(RAW_TIMEOUT)
        .await
        .expect("a second agent port of the backend's VM");
    raw_run(&agent, &["/bin/mkdir", "-p", &format!("{BASE}/d1/d2")]).await;
    let mut passed = true;

    // 1 KiB at depth 3.
    let small = conformance::fixtures::incompressible_bytes(SMALL, 0x5eed);
    let raw_small = format!("{BASE}/d1/d2/small.bin");
    let mut write = Metric::new(
        format!("qemu 1 KiB write [{accel}]"),
        "the agent's write_file of the same bytes to the same file, through the qemu-vm driver",
        Target::ReportedOnly("against the bare agent call"),
    );
    let mut read = Metric::new(
        format!("qemu 1 KiB read [{accel}]"),
        "the agent's read_file of the same file, through the qemu-vm driver",
        Target::ReportedOnly("against the bare agent call"),
    );
    for round in 0..SMALL_WARMUP + SMALL_ROUNDS {
        let w = paired(
            round,
            async {
                sandbox
                    .write_file("d1/d2/small.bin", &small, ".")
                    .await
                    .expect("write_file");
            },
            async {
                agent
                    .write_file(raw_small.as_bytes(), 0o644, &small[..], RAW_TIMEOUT)
                    .await
                    .expect("the agent's write_file");
            },
        )
        .await;
        let r = paired(
            round,
            async {
                let bytes = sandbox
                    .read_file("d1/d2/small.bin", ".", SMALL as u64)
                    .await
                    .expect("read_file");
                assert_eq!(bytes, small);
            },
            async {
                let bytes = agent
                    .read_file(raw_small.as_bytes(), SMALL as u64, RAW_TIMEOUT)
                    .await
                    .expect("the agent's read_file");
                assert_eq!(bytes, small);
            },
        )
        .await;
        if round >= SMALL_WARMUP {
            write.push(w);
            read.push(r);
        }
    }
    passed &= write.report();
    passed &= read.report();

    // 64 MiB: the write at the declared ceiling while it is below 64 MiB.
    let ceiling = backend
        .declarations()
        .limits
        .files_in
        .max_bytes_per_file
        .min(usize::MAX as u64) as usize;
    let write_size = if ceiling < BIG {
        let refused = sandbox
            .write_file(
                "refused.bin",
                &conformance::fixtures::incompressible_bytes(BIG, 1),
                ".",
            )
            .await
            .expect_err("a write above the declared ceiling is refused");
        assert_eq!(refused.kind(), ErrorKind::TransferCapExceeded, "{refused}");
        println!(
            "qemu 64 MiB write [{accel}]: refused (TransferCapExceeded): the backend declares \
             {ceiling} bytes per file; the write row measures that size"
        );
        ceiling
    } else {
        BIG
    };
    let big = conformance::fixtures::incompressible_bytes(write_size, 0xb16);
    let raw_big = format!("{BASE}/big.bin");
    let mut write = Metric::new(
        format!("qemu {} write [{accel}]", size_name(write_size)),
        "the agent's write_file of the same bytes to the same file, through the qemu-vm driver",
        Target::AtMost(1.1),
    );
    for round in 0..BIG_WARMUP + BIG_ROUNDS {
        let pair = paired(
            round,
            async {
                sandbox
                    .write_file("big.bin", &big, ".")
                    .await
                    .expect("write_file");
            },
            async {
                agent
                    .write_file(raw_big.as_bytes(), 0o644, &big[..], RAW_TIMEOUT)
                    .await
                    .expect("the agent's write_file");
            },
        )
        .await;
        if round >= BIG_WARMUP {
            write.push(pair);
        }
    }
    passed &= write.report();

    // The 64 MiB file is made in the guest (the write above may have been smaller).
    let make = format!("head -c {BIG} /dev/zero > {BASE}/big.bin");
    let made = sandbox
        .exec(
            ExecRequest::new(Command::argv(["/bin/sh", "-c", &make]))
                .timeout(Duration::from_secs(120)),
        )
        .await
        .expect("the 64 MiB file is made");
    assert_eq!(
        made.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mut read = Metric::new(
        format!("qemu 64 MiB read [{accel}]"),
        "the agent's read_file of the same file, through the qemu-vm driver",
        Target::AtMost(1.1),
    );
    for round in 0..BIG_WARMUP + BIG_ROUNDS {
        let pair = paired(
            round,
            async {
                let bytes = sandbox
                    .read_file("big.bin", ".", BIG as u64)
                    .await
                    .expect("read_file");
                assert_eq!(bytes.len(), BIG);
            },
            async {
                let bytes = agent
                    .read_file(raw_big.as_bytes(), BIG as u64, RAW_TIMEOUT)
                    .await
                    .expect("the agent's read_file");
                assert_eq!(bytes.len(), BIG);
            },
        )
        .await;
        if round >= BIG_WARMUP {
            read.push(pair);
        }
    }
    passed &= read.report();
    // What the backend does before a read's agent call, alone: the same path walk and leaf
    // stat, so the report shows how much of the difference the backend's checks are.
    let mut checks = Vec::new();
    for _ in 0..SMALL_ROUNDS {
        let (entry, took) = support::timed(sandbox.stat_file("big.bin", ".")).await;
        assert!(entry.expect("stat_file").is_some());
        checks.push(took.as_secs_f64() * 1000.0);
    }
    println!(
        "qemu 64 MiB read [{accel}]: the backend's checks alone (stat_file of the same path) take {:.1} ms at p50",
        support::median(checks)
    );

    drop(agent);
    drop(vm);
    drop(sandbox);
    dispose_thread(&backend, "transfer").await;
    run.assert_nothing_left();
    drop(run);
    exit_with(passed);
}
