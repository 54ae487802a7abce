//! The lifecycle suites and the whole-run entry point against the core's in-process fake backend.
//!
//! The fake isolates nothing and has no links or real processes, so the attack suites fail on it; what
//! these tests check is the harness: every suite is reached and reported, and every sandbox is disposed.

use std::collections::BTreeSet;
use std::sync::Arc;

use conformance::run::ProbeOutcome;
use conformance::sandboxes::{assert_fresh_acquire, assert_instance_disposal, instance_is_listed};
use conformance::suites::CLEANUP_SUITE;
use conformance::{run_backend_suites, ConformanceError, RunOptions};
use sandbox_core::testing::FakeBackend;
use sandbox_core::{Isolation, SandboxBackend, SandboxKey, SandboxSpec};

fn key(thread: &str) -> SandboxKey {
    SandboxKey::conversation("conformance-test", thread, "agent")
}

fn spec() -> SandboxSpec {
    SandboxSpec::builder("probe").build().unwrap()
}

#[tokio::test]
async fn a_fresh_acquire_and_its_warm_reacquire_pass() {
    let fake = FakeBackend::new("fake", Isolation::Container);
    let (k, s) = (key("fresh"), spec());
    let first = fake.acquire(&k, &s).await.unwrap();
    let report = assert_fresh_acquire(first.as_ref(), || fake.acquire(&k, &s))
        .await
        .expect("the fake creates once and reuses");
    assert_eq!(report.passed(), 1);
}

#[tokio::test]
async fn a_sandbox_that_never_reports_fresh_fails() {
    let fake = FakeBackend::new("fake", Isolation::Container);
    fake.update_faults(|f| f.never_fresh = true);
    let (k, s) = (key("stale"), spec());
    let first = fake.acquire(&k, &s).await.unwrap();
    let error = assert_fresh_acquire(first.as_ref(), || fake.acquire(&k, &s))
        .await
        .expect_err("never fresh");
    assert!(
        error.to_string().contains("freshly_created() = false"),
        "{error}"
    );
}

#[tokio::test]
async fn disposing_one_instance_leaves_its_sibling() {
    let fake = FakeBackend::new("fake", Isolation::Container);
    let s = spec();
    let target = fake.acquire(&key("target"), &s).await.unwrap();
    let sibling = fake.acquire(&key("sibling"), &s).await.unwrap();
    let exists = |id: String| {
        let fake = &fake;
        async move { instance_is_listed(fake, "conformance-test", &id).await }
    };
    let report = assert_instance_disposal(
        &fake,
        &key("target"),
        "probe",
        target.instance_id(),
        &[sibling.instance_id().to_owned()],
        exists,
    )
    .await
    .expect("the fake disposes by instance id");
    assert_eq!(report.passed(), 1);
    assert_eq!(fake.instances().len(), 1);
}

#[tokio::test]
async fn disposal_preconditions_are_harness_errors() {
    let fake = FakeBackend::new("fake", Isolation::Container);
    let target = fake.acquire(&key("target"), &spec()).await.unwrap();
    let id = target.instance_id().to_owned();
    let exists = |_: String| async { Ok(true) };
    for siblings in [vec![], vec![id.clone()]] {
        let result =
            assert_instance_disposal(&fake, &key("target"), "probe", &id, &siblings, exists).await;
        assert!(matches!(result, Err(ConformanceError::Harness { .. })));
    }
    let missing = |_: String| async { Ok(false) };
    let result = assert_instance_disposal(
        &fake,
        &key("target"),
        "probe",
        &id,
        &["other".to_owned()],
        missing,
    )
    .await;
    assert!(matches!(result, Err(ConformanceError::Harness { .. })));
    assert_eq!(fake.dispose_calls(), 0, "nothing was disposed");
}

#[tokio::test]
async fn the_whole_run_reaches_every_suite_and_disposes_every_sandbox() {
    let fake = Arc::new(FakeBackend::new("fake", Isolation::Container));
    let mut keys = |purpose: &str| key(purpose);
    let report = run_backend_suites(
        fake.as_ref(),
        &mut keys,
        SandboxSpec::builder("probe"),
        RunOptions::default(),
    )
    .await
    .expect("the spec builds");
    println!("{report}");
    let suites: BTreeSet<&str> = report.probes().iter().map(|p| p.suite.as_str()).collect();
    let expected: BTreeSet<&str> = [
        "STORAGE_BASE",
        "FRESH_ACQUIRE",
        "INSTANCE_DISPOSAL",
        "FILES_OUT",
        "FILES_IN",
        "FILES_DELETE",
        "RECLAIM",
        "REACH",
        "EXEC",
        "CALL_SCOPE",
    ]
    .into_iter()
    .collect();
    assert_eq!(suites, expected, "{report}");
    assert_eq!(
        report
            .get(
                "FRESH_ACQUIRE",
                "a-new-sandbox-is-fresh-and-its-reacquire-warm"
            )
            .map(|p| &p.outcome),
        Some(&ProbeOutcome::Passed),
        "{report}"
    );
    // The fake declares no reclaim: its gate is refused and reported as a failure, never a silent skip.
    match &report
        .get("RECLAIM", "(suite did not run)")
        .unwrap()
        .outcome
    {
        ProbeOutcome::Failed { why } => assert!(why.contains("`reclaim`"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        report.probes().iter().all(|p| p.suite != CLEANUP_SUITE),
        "{report}"
    );
    assert!(
        fake.instances().is_empty(),
        "every sandbox of the run is gone"
    );
    assert!(report.assert_all_passed().is_err());

    // Every suite that ran reported exactly its exported count; one the fake cannot serve (no
    // links, no reclaim) reports the one entry saying why it did not run.
    for (suite, expected) in [
        ("STORAGE_BASE", 2 * conformance::suites::STORAGE_BASE_STEPS),
        ("FILES_OUT", conformance::suites::FILES_OUT_PROBES),
        ("FILES_IN", conformance::suites::FILES_IN_PROBES),
        ("FILES_DELETE", conformance::suites::FILES_DELETE_PROBES),
        ("RECLAIM", conformance::suites::RECLAIM_PROBES),
        ("REACH", conformance::suites::REACH_PROBES),
        ("EXEC", conformance::suites::EXEC_PROBES),
        ("CALL_SCOPE", conformance::suites::CALL_SCOPE_PROBES),
    ] {
        let entries: Vec<&str> = report
            .probes()
            .iter()
            .filter(|p| p.suite == suite)
            .map(|p| p.probe.as_str())
            .collect();
        assert!(
            entries.len() == expected || entries == ["(suite did not run)"],
            "{suite}: {entries:?}"
        );
    }
}

#[test]
fn the_expected_count_follows_the_options_and_the_declared_scopes() {
    let fake = FakeBackend::new("fake", Isolation::Container);
    let declarations = fake.declarations();
    let full = RunOptions::default().expected_probes(declarations);
    let reduced = RunOptions {
        reduced: true,
        ..RunOptions::default()
    }
    .expected_probes(declarations);
    assert_eq!(
        reduced,
        conformance::suites::FILES_OUT_PROBES
            + conformance::suites::FILES_IN_PROBES
            + conformance::suites::FILES_DELETE_PROBES
            + conformance::suites::RECLAIM_PROBES
            + conformance::suites::EXEC_PROBES
    );
    assert_eq!(
        full - reduced,
        2 * conformance::suites::STORAGE_BASE_STEPS
            + 2
            + conformance::suites::REACH_PROBES
            + conformance::suites::CALL_SCOPE_PROBES
    );
    let mut conversation_only = declarations.clone();
    conversation_only
        .isolation_scopes
        .remove(&sandbox_core::IsolationScope::Call);
    assert_eq!(
        RunOptions::default().expected_probes(&conversation_only),
        full - conformance::suites::CALL_SCOPE_PROBES
    );
}
