//! Every conformance suite this backend owes (docs/conformance.md#running-them-against-a-backend), against the real engine and the
//! local images: everything on the two Debian images (HARDENING and the egress preflight included,
//! with local targets only), the reduced file and exec set on the BusyBox image. Each test asserts
//! that no probe failed or was skipped, and that nothing is left behind.

mod support;

use conformance::{run_backend_suites, ConformanceReport, RunOptions};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use support::{
    assert_nothing_left, backend, threads_of, unique_scope, DockerHooks, BASE, BASE_ROOT, BUSYBOX,
};

/// Runs every suite the options select on `image` and returns the report with the probe count the
/// conformance crate's own constants give for these options.
async fn run_on(image: &str, tag: &str, full: bool) -> (ConformanceReport, usize) {
    let backend = backend(full).await;
    let scope = unique_scope(tag);
    let hooks = DockerHooks {
        context: backend.context().to_owned(),
    };
    let options = RunOptions {
        exec_cleanup_allowance: backend.config().exec_cleanup_timeout,
        hardening: full.then_some(&hooks as &dyn conformance::isolation::HardeningHooks),
        reduced: !full,
        // Under gVisor no container beside the sandbox sees its root
        // (docs/docker-backend.md#gvisor).
        without_confinement: support::runtime_under_test().is_some(),
        ..RunOptions::default()
    };
    let expected = options.expected_probes(backend.declarations());
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let report = run_backend_suites(
        &backend,
        &mut keys,
        SandboxSpec::builder("conformance").image(image),
        options,
    )
    .await
    .expect("the conformance run starts");
    println!(
        "{image}: {report}\nwall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
    // Exact kills everywhere but under gVisor, whose kernel makes no subreaper.
    let exact = support::runtime_under_test().is_none();
    assert_eq!(
        backend
            .declarations()
            .serves(sandbox_core::Capability::ExactKill),
        exact
    );
    // Exec, the four file capabilities, reclaim, snapshot and host tools; exact kills as above.
    assert_eq!(
        backend.declarations().capabilities.len(),
        8 + usize::from(exact)
    );
    (report, expected)
}

/// No probe failed or was skipped, and exactly `expected` ran: a probe that disappears fails too.
fn assert_passed(report: &ConformanceReport, expected: usize) {
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_base_image_passes_every_suite() {
    let (report, expected) = run_on(BASE, "base", true).await;
    assert_passed(&report, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_root_image_passes_every_suite() {
    let (report, expected) = run_on(BASE_ROOT, "root", true).await;
    assert_passed(&report, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_busybox_image_passes_the_file_and_exec_suites() {
    let (report, expected) = run_on(BUSYBOX, "busybox", false).await;
    assert_passed(&report, expected);
}

/// Race stress for the cross-process create race on an image whose storage base the guest cannot
/// make (so it is made engine-side): round after round, four acquires here and four in a child
/// process must yield one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquires_across_processes_stay_one_instance_round_after_round() {
    use sandbox_core::DisposeSelector;
    let backend = backend(false).await;
    let scope = unique_scope("race");
    let hooks = DockerHooks {
        context: backend.context().to_owned(),
    };
    let spec = SandboxSpec::builder("race").image(BASE).build().unwrap();
    for round in 0..8 {
        let key = SandboxKey::conversation(scope.clone(), format!("round-{round}"), "agent");
        let report = conformance::isolation::assert_concurrent_acquires_yield_one(
            &backend, &key, &spec, &hooks,
        )
        .await
        .expect("the probe runs");
        assert!(backend
            .dispose(&key, DisposeSelector::all())
            .await
            .is_none());
        // The probe alone: one entry.
        assert_passed(&report, 1);
    }
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}
