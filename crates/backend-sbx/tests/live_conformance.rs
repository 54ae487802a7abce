//! Every conformance suite this backend declares, against `sbx-sim` (HARDENING included, with
//! local targets only), with a workspace root and a simulator state home of the test's own.
//! The run must pass every probe with zero skips, and leave nothing behind: no container of the
//! simulator's home, no simulator record, no workspace directory.

mod support;

use conformance::{run_backend_suites, ConformanceReport, RunOptions};
use sandbox_core::{Isolation, SandboxBackend, SandboxKey, SandboxSpec};
use support::{dispose_all, unique_scope, SimHooks, SimHost};

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
        hardening: Some(&hooks as &dyn conformance::isolation::HardeningHooks),
        ..RunOptions::default()
    };
    // Every suite but CALL_SCOPE (the backend serves the conversation scope only), counted from
    // the conformance crate's own constants.
    let expected = options.expected_probes(backend.declarations());
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
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
}

/// CONFINEMENT can fail through the simulator's container too: the standard call passes, and a
/// call that leaves a file on `/dev/shm`, or one in the workspace (a bind mount the engine's change
/// list cannot see) outside its own directory, is judged to leave exactly that. (A program a call
/// leaves running ends with the call's PID namespace here, so it is no residue to show.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confinement_passes_a_clean_call_and_fails_a_residue_on_the_simulator() {
    use conformance::isolation::assert_confinement;
    use conformance::PosixGuestSubject;
    let host = SimHost::new();
    let backend = host.backend().await;
    let scope = unique_scope("confine");
    let hooks = SimHooks {
        host: &host,
        backend: backend.clone(),
    };
    let spec = SandboxSpec::builder("confinement").build().unwrap();
    let subject = |name: &'static str| {
        let (backend, scope, spec) = (&backend, &scope, &spec);
        async move {
            let key = SandboxKey::conversation(scope.clone(), name, "agent");
            let sandbox = backend.acquire(&key, spec).await.expect("acquire");
            PosixGuestSubject::in_storage_base(sandbox, backend.declarations().capabilities.clone())
                .expect("subject")
                .with_exec_cleanup_allowance(backend.exec_cleanup_timeout())
        }
    };

    let clean = subject("clean").await;
    let report = assert_confinement(&clean, &hooks).await;
    let report = report.unwrap_or_else(|e| panic!("the standard call leaves nothing behind: {e}"));
    assert_eq!(
        report.passed(),
        conformance::suites::CONFINEMENT_PROBES,
        "{report}"
    );

    let cases: [(&str, &str, &str); 2] = [
        (
            "shm",
            "printf leak >/dev/shm/confinement-leak",
            "new path /dev/shm/confinement-leak",
        ),
        (
            "workspace",
            "printf leak >confinement-leak",
            "/confinement-leak (",
        ),
    ];
    for (name, script, residue) in cases {
        let leaky = subject(name).await;
        conformance::isolation::expect_residue_caught(&leaky, &hooks, script, residue)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
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
    let result = conformance::commands::assert_exec(&subject).await;
    drop(subject);
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
    let report = result.unwrap_or_else(|error| panic!("{error}"));
    println!("sbx-sim: {report}");
    assert_eq!(
        report.passed(),
        conformance::suites::EXEC_PROBES,
        "{report}"
    );
}
