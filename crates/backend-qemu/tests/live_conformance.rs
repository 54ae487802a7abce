//! Every conformance suite the backend declares that needs no engine-side hooks (EXEC,
//! FILES_IN, FILES_OUT, FILES_DELETE, RECLAIM, the storage-base and lifecycle suites, REACH),
//! against real QEMU on the image of `cargo xtask images vm`, with a state directory of the
//! test's own: every probe passes, none is skipped, and no VM is left.

use std::path::PathBuf;
use std::time::Duration;

use backend_qemu::{QemuBackend, QemuConfig};
use conformance::{run_backend_suites, RunOptions};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};

fn image_dir() -> PathBuf {
    std::env::var_os("QEMU_VM_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/vm-image"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_declared_suite_passes_under_qemu() {
    let parent = std::env::var_os("QEMU_VM_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let state = tempfile::tempdir_in(parent).unwrap();
    let mut config = QemuConfig::default();
    config.image_dir = image_dir();
    config.state_dir = state.path().join("state");
    config.allow_emulation = true;
    config.cpus = 1;
    config.memory_mib = 384;
    let backend = QemuBackend::connect(config).await.expect("connect");
    let scope = format!("conformance-{}", std::process::id());
    let options = RunOptions {
        exec_cleanup_allowance: Duration::from_secs(10),
        ..RunOptions::default()
    };
    let expected = options.expected_probes(backend.declarations());
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let report = run_backend_suites(
        &backend,
        &mut keys,
        SandboxSpec::builder("conformance"),
        options,
    )
    .await
    .expect("the conformance run starts");
    println!(
        "qemu [{}]: {report}\nwall time {:.1} s",
        backend.accelerator().accel.name(),
        started.elapsed().as_secs_f64()
    );
    for thread in backend
        .list(&scope, None)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|summary| summary.key.map(|key| key.thread_id))
    {
        let _ = backend.dispose_scope(&scope, &thread).await;
    }
    assert!(backend.list(&scope, None).await.unwrap().is_empty());
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
}
