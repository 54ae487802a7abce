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

use paired_bench::{exit_with, measured, median, paired, timed, Metric, Target};
use qemu_vm::AgentClient;
use sandbox_core::{
    Command, ErrorKind, ExecRequest, Sandbox, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{accel_name, backend, dispose_thread, raw_run, Run, RAW_TIMEOUT, SCOPE};

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
    let mut write = Metric::new(
        format!("qemu 1 KiB write [{accel}]"),
        Target::ReportedOnlyBecause("against the bare agent call"),
    )
    .against(
        "the agent's write_file of the same bytes to the same file, through the qemu-vm driver",
    );
    let mut read = Metric::new(
        format!("qemu 1 KiB read [{accel}]"),
        Target::ReportedOnlyBecause("against the bare agent call"),
    )
    .against("the agent's read_file of the same file, through the qemu-vm driver");
    let (handle, driver, small) = (&*sandbox, &agent, &small[..]);
    let rounds = measured(SMALL_WARMUP, SMALL_ROUNDS, move |round| async move {
        let w = write_round(round, handle, driver, "d1/d2/small.bin", small).await;
        let r = read_round(round, handle, driver, "d1/d2/small.bin", SMALL, Some(small)).await;
        (w, r)
    })
    .await;
    for (w, r) in rounds {
        write.push(w);
        read.push(r);
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
    let mut write = Metric::new(
        format!("qemu {} write [{accel}]", size_name(write_size)),
        Target::AtMost(1.1),
    )
    .against(
        "the agent's write_file of the same bytes to the same file, through the qemu-vm driver",
    );
    let big = &big[..];
    write.extend(
        measured(BIG_WARMUP, BIG_ROUNDS, move |round| {
            write_round(round, handle, driver, "big.bin", big)
        })
        .await,
    );
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
    let mut read = Metric::new(format!("qemu 64 MiB read [{accel}]"), Target::AtMost(1.1))
        .against("the agent's read_file of the same file, through the qemu-vm driver");
    read.extend(
        measured(BIG_WARMUP, BIG_ROUNDS, move |round| {
            read_round(round, handle, driver, "big.bin", BIG, None)
        })
        .await,
    );
    passed &= read.report();
    // What the backend does before a read's agent call, alone: the same path walk and leaf
    // stat, so the report shows how much of the difference the backend's checks are.
    let mut checks = Vec::new();
    for _ in 0..SMALL_ROUNDS {
        let (entry, took) = timed(sandbox.stat_file("big.bin", ".")).await;
        assert!(entry.expect("stat_file").is_some());
        checks.push(took.as_secs_f64() * 1000.0);
    }
    println!(
        "qemu 64 MiB read [{accel}]: the backend's checks alone (stat_file of the same path) take {:.1} ms at p50",
        median(checks)
    );

    drop(agent);
    drop(vm);
    drop(sandbox);
    dispose_thread(&backend, "transfer").await;
    run.assert_nothing_left();
    drop(run);
    exit_with(passed);
}

/// One round of the backend's `write_file` of `bytes` to `path` (below the storage base)
/// against the agent's `write_file` of the same bytes to the same file.
async fn write_round(
    round: usize,
    sandbox: &dyn Sandbox,
    agent: &AgentClient,
    path: &str,
    bytes: &[u8],
) -> (Duration, Duration) {
    let raw_path = format!("{BASE}/{path}");
    paired(
        round,
        async {
            sandbox
                .write_file(path, bytes, ".")
                .await
                .expect("write_file");
        },
        async {
            agent
                .write_file(raw_path.as_bytes(), 0o644, bytes, RAW_TIMEOUT)
                .await
                .expect("the agent's write_file");
        },
    )
    .await
}

/// One round of the backend's `read_file` of the `len` bytes at `path` against the agent's
/// `read_file` of the same file; each side reads all `len` bytes, and `want` when given.
async fn read_round(
    round: usize,
    sandbox: &dyn Sandbox,
    agent: &AgentClient,
    path: &str,
    len: usize,
    want: Option<&[u8]>,
) -> (Duration, Duration) {
    let raw_path = format!("{BASE}/{path}");
    let check = |bytes: &[u8]| {
        assert_eq!(bytes.len(), len);
        if let Some(want) = want {
            assert_eq!(bytes, want);
        }
    };
    paired(
        round,
        async {
            let bytes = sandbox
                .read_file(path, ".", len as u64)
                .await
                .expect("read_file");
            check(&bytes);
        },
        async {
            let bytes = agent
                .read_file(raw_path.as_bytes(), len as u64, RAW_TIMEOUT)
                .await
                .expect("the agent's read_file");
            check(&bytes);
        },
    )
    .await
}
