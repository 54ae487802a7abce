//! Every conformance suite this backend declares, against `sbx-sim` (HARDENING included, with
//! local targets only), with a workspace root and a simulator state home of the test's own.
//! The run must pass every probe with zero skips, and leave nothing behind: no container of the
//! simulator's home, no simulator record, no workspace directory.

mod support;

use conformance::{run_backend_suites, ConformanceReport, RunOptions};
use sandbox_core::{Isolation, SandboxBackend, SandboxKey, SandboxSpec};
use support::{dispose_all, unique_scope, SimHooks, SimHost};

/// The probes a full run on sbx-sim makes: every suite but CALL_SCOPE (the backend serves the
/// conversation scope only), the shared HARDENING probes counted from their own constant.
const EXPECTED_PROBES: usize = 90 + conformance::HARDENING_SHARED_PROBES;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_declared_suite_passes_on_the_simulator() {
    let host = SimHost::new();
    let backend = host.backend().await;
    assert_eq!(
        backend.isolation(),
        Isolation::Container,
        "the simulator is never a microVM"
    );
    let scope = unique_scope("conformance");
    let hooks = SimHooks {
        host: &host,
        backend: backend.clone(),
    };
    let options = RunOptions {
        exec_cleanup_allowance: backend.exec_cleanup_timeout(),
        hardening: Some(&hooks as &dyn conformance::HardeningHooks),
        ..RunOptions::default()
    };
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let report: ConformanceReport = run_backend_suites(
        &backend,
        &mut keys,
        SandboxSpec::builder("conformance"),
        options,
    )
    .await
    .expect("the conformance run starts");
    println!(
        "sbx-sim: {report}\nwall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), EXPECTED_PROBES, "probe count:\n{report}");
}

/// The EXEC suite alone (its streaming probes included) on one sandbox of the simulator: what a
/// change to exec is checked with before the whole run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_exec_suite_passes_on_the_simulator() {
    let host = SimHost::new();
    let backend = host.backend().await;
    let scope = unique_scope("exec-suite");
    let key = SandboxKey::conversation(scope.clone(), "exec", "agent");
    let spec = SandboxSpec::builder("conformance").build().unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let base = sandbox.storage_base().to_owned();
    let mut subject = conformance::PosixGuestSubject::new(
        sandbox,
        base,
        backend.declarations().capabilities.clone(),
    )
    .expect("an absolute base");
    subject.exec_cleanup_allowance = backend.exec_cleanup_timeout();
    let result = conformance::assert_exec(&subject).await;
    drop(subject);
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
    let report = result.unwrap_or_else(|error| panic!("{error}"));
    println!("sbx-sim: {report}");
    assert_eq!(report.passed(), conformance::EXEC_PROBES, "{report}");
}
