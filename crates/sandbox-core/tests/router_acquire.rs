//! Acquire: gates, key/scope consistency, contract violations, adoption and the unclean ledger.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    DisposalCode, DisposalFailure, DisposeSelector, ErrorKind, FailedCleanup, Isolation,
    IsolationScope, Router, RouterConfig, SandboxBackend, SandboxError, SandboxKey, SandboxSpec,
};
use tokio::time::Instant;

fn setup(config: RouterConfig) -> (Arc<FakeBackend>, Router) {
    let fake = Arc::new(FakeBackend::new("fake", Isolation::Microvm));
    let router = Router::new(vec![Arc::clone(&fake) as Arc<dyn SandboxBackend>], config).unwrap();
    (fake, router)
}

fn key() -> SandboxKey {
    SandboxKey::conversation("prod", "thread-1", "agent")
}

fn spec(kind: &str) -> SandboxSpec {
    SandboxSpec::builder(kind).build().unwrap()
}

fn call_spec(kind: &str) -> SandboxSpec {
    SandboxSpec::builder(kind)
        .isolation_scope(IsolationScope::Call)
        .build()
        .unwrap()
}

fn unclean_code(err: &SandboxError) -> Option<DisposalCode> {
    match err {
        SandboxError::Unclean { code } => *code,
        other => panic!("expected Unclean, got {other:?}"),
    }
}

#[tokio::test]
async fn key_and_scope_must_agree() {
    let (fake, router) = setup(RouterConfig::default());
    let err = router.acquire(&key(), &call_spec("k")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("no call_id"), "{err}");
    let err = router
        .acquire(&key().with_call("c1"), &spec("k"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("\"c1\""), "{err}");
    assert_eq!(
        fake.acquire_calls(),
        0,
        "refused before the backend is asked"
    );

    // The host's scope floor makes every spec call-scoped.
    let (_, router) = setup(RouterConfig::default().min_isolation_scope(IsolationScope::Call));
    assert_eq!(
        router.acquire(&key(), &spec("k")).await.unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    router
        .acquire(&key().with_call("c1"), &spec("k"))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn acquires_of_one_identity_run_one_at_a_time() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.acquire_delay = Some(Duration::from_secs(1)));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let r = router.clone();
        tasks.push(tokio::spawn(async move {
            r.acquire(&key(), &spec("k"))
                .await
                .map(|s| s.instance_id().to_owned())
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    assert_eq!(fake.max_concurrent_acquires(), 1);
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(fake.dispose_calls(), 0, "warm reuse of a served instance");

    // Different kinds have different gates.
    let a = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("a")).await.is_ok() })
    };
    let b = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("b")).await.is_ok() })
    };
    assert!(a.await.unwrap() && b.await.unwrap());
    assert_eq!(fake.max_concurrent_acquires(), 2);
}

#[tokio::test]
async fn an_empty_instance_id_is_disposed_of_and_reported() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.empty_instance_ids = true);
    let err = router.acquire(&key(), &spec("k")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ContractViolation);
    assert!(err.to_string().contains("empty instance id"), "{err}");
    assert_eq!(fake.disposals(), vec![(key(), DisposeSelector::kind("k"))]);
    assert!(fake.instances().is_empty());
    assert!(!router.is_unclean(&key()), "best effort: no ledger write");
}

#[tokio::test]
async fn a_fresh_instance_is_remembered_and_served_warm() {
    let (fake, router) = setup(RouterConfig::default());
    let first = router.acquire(&key(), &spec("k")).await.unwrap();
    assert!(first.freshly_created());
    let again = router.acquire(&key(), &spec("k")).await.unwrap();
    assert!(!again.freshly_created());
    assert_eq!(again.instance_id(), first.instance_id());
    assert_eq!(fake.dispose_calls(), 0);
}

#[tokio::test]
async fn an_unfamiliar_instance_is_disposed_of_then_acquired_again() {
    let (fake, router) = setup(RouterConfig::default());
    let residue = fake.seed_instance(&key(), "k");
    let sandbox = router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(
        fake.disposals(),
        vec![(key(), DisposeSelector::instance("k", residue.clone()))]
    );
    assert_ne!(sandbox.instance_id(), residue);
    assert!(sandbox.freshly_created());
    assert_eq!(fake.acquire_calls(), 2);
    assert!(!router.is_unclean(&key()));
    // Now it is remembered.
    router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(fake.dispose_calls(), 1);
}

#[tokio::test]
async fn a_backend_that_never_reports_fresh_is_adopted_once() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.never_fresh = true);
    let first = router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(fake.dispose_calls(), 1, "the first one is unfamiliar");
    assert_eq!(fake.acquire_calls(), 2);
    let second = router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(second.instance_id(), first.instance_id());
    assert_eq!(
        fake.dispose_calls(),
        1,
        "the re-acquired one was remembered"
    );
}

#[tokio::test]
async fn a_failed_adoption_marks_the_key_unclean_with_dispose() {
    let (fake, router) = setup(RouterConfig::default());
    fake.seed_instance(&key(), "k");
    fake.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    let err = router.acquire(&key(), &spec("k")).await.unwrap_err();
    assert_eq!(unclean_code(&err), Some(DisposalCode::Refused));
    assert_eq!(err.to_string(), "sandbox key is unclean (refused)");
    assert!(router.is_unclean(&key()));
    let recorded = router.unclean_failure(&key()).unwrap();
    assert!(recorded.detail.starts_with("fake: "), "{recorded}");

    // Refused from now on, before the backend is asked; other keys are unaffected.
    let calls = fake.acquire_calls();
    let err = router
        .acquire(&key(), &spec("other-kind"))
        .await
        .unwrap_err();
    assert_eq!(unclean_code(&err), Some(DisposalCode::Refused));
    assert_eq!(fake.acquire_calls(), calls);
    let other = SandboxKey::conversation("prod", "thread-1", "other-agent");
    router.acquire(&other, &spec("k")).await.unwrap();

    // Once a disposal lands, the key is served again.
    fake.update_faults(|f| f.dispose_failure = None);
    assert_eq!(router.dispose(&key()).await, None);
    assert!(!router.is_unclean(&key()));
    assert!(router
        .acquire(&key(), &spec("k"))
        .await
        .unwrap()
        .freshly_created());
}

#[tokio::test]
async fn a_failed_adoption_is_served_anyway_with_keep() {
    let (fake, router) = setup(RouterConfig::default().failed_cleanup(FailedCleanup::Keep));
    let residue = fake.seed_instance(&key(), "k");
    fake.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    let sandbox = router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(sandbox.instance_id(), residue);
    assert!(!sandbox.freshly_created());
    assert!(
        !router.is_unclean(&key()),
        "Keep writes nothing to the ledger"
    );
    router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(fake.dispose_calls(), 1, "kept instances are remembered");
}

#[tokio::test(start_paused = true)]
async fn a_hanging_adoption_is_bounded_by_the_cleanup_timeout() {
    let (fake, router) = setup(RouterConfig::default().cleanup_timeout(Duration::from_secs(5)));
    fake.seed_instance(&key(), "k");
    fake.update_faults(|f| f.dispose_hang = true);
    let started = Instant::now();
    let err = router.acquire(&key(), &spec("k")).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(unclean_code(&err), Some(DisposalCode::Timeout));
    let failure = router.unclean_failure(&key()).unwrap();
    assert_eq!(failure.detail, "fake: disposal exceeded its 5 s bound");
}

#[tokio::test(start_paused = true)]
async fn dropping_an_acquire_never_cancels_its_cleanup() {
    let (fake, router) = setup(RouterConfig::default());
    fake.seed_instance(&key(), "k");
    fake.update_faults(|f| {
        f.dispose_delay = Some(Duration::from_secs(5));
        f.dispose_failure = Some(DisposalCode::Unreachable);
    });
    let gave_up =
        tokio::time::timeout(Duration::from_secs(1), router.acquire(&key(), &spec("k"))).await;
    assert!(gave_up.is_err(), "the caller stopped waiting");
    assert!(!router.is_unclean(&key()), "the cleanup is still running");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        router.is_unclean(&key()),
        "the detached cleanup wrote its result"
    );
    assert_eq!(
        router.unclean_failure(&key()).unwrap().code,
        DisposalCode::Unreachable
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_acquired_while_the_key_turned_unclean_is_disposed_of() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.acquire_delay = Some(Duration::from_secs(10)));
    let pending = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("k")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    router.mark_unclean(
        &key(),
        DisposalFailure::new(DisposalCode::Unknown, "host knows better"),
        None,
    );
    let err = pending.await.unwrap().unwrap_err();
    assert_eq!(unclean_code(&err), Some(DisposalCode::Unknown));
    let disposals = fake.disposals();
    assert_eq!(disposals.len(), 1);
    let selector = &disposals[0].1;
    assert_eq!(selector.kind.as_deref(), Some("k"));
    assert!(selector.instance_id.is_some(), "exactly that instance");
    assert!(fake.instances().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_acquire_racing_a_disposal_is_refused_and_its_instance_disposed_of() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| {
        f.acquire_delay = Some(Duration::from_secs(2));
        f.dispose_delay = Some(Duration::from_secs(4));
    });
    let acquiring = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("k")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let disposing = {
        let r = router.clone();
        tokio::spawn(async move { r.dispose(&key()).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        router.is_unclean(&key()),
        "marked before the disposal's first await"
    );
    let err = acquiring.await.unwrap().unwrap_err();
    assert_eq!(
        unclean_code(&err),
        None,
        "a disposal in flight has no code yet"
    );
    assert_eq!(disposing.await.unwrap(), None);
    assert!(!router.is_unclean(&key()));
    assert!(fake.instances().is_empty());
}

#[tokio::test]
async fn call_scoped_instances_are_remembered_without_adoption() {
    let (fake, router) = setup(RouterConfig::default());
    let call_key = key().with_call("call-1");
    let residue = fake.seed_instance(&call_key, "k");
    let sandbox = router.acquire(&call_key, &call_spec("k")).await.unwrap();
    assert_eq!(sandbox.instance_id(), residue);
    assert_eq!(fake.dispose_calls(), 0);
    assert!(router
        .dispose_call(&call_key, Duration::from_secs(1))
        .await
        .unwrap());
    assert!(fake.instances().is_empty());
    assert_eq!(fake.disposals(), vec![(call_key, DisposeSelector::all())]);
}

#[tokio::test(start_paused = true)]
async fn a_backend_failure_after_a_landed_adoption_is_returned() {
    let (fake, router) = setup(RouterConfig::default());
    fake.seed_instance(&key(), "k");
    fake.update_faults(|f| f.dispose_delay = Some(Duration::from_secs(5)));
    let acquiring = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("k")).await })
    };
    // While the adoption disposal runs, the engine goes away.
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.update_faults(|f| f.acquire_failure = Some("engine gone".into()));
    let err = acquiring.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BackendUnavailable);
    assert_eq!(fake.acquire_calls(), 2);
    assert!(fake.instances().is_empty(), "the residue was disposed of");
    assert!(!router.is_unclean(&key()));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_holds_its_gate_until_its_cleanup_is_over() {
    let (fake, router) = setup(RouterConfig::default());
    fake.seed_instance(&key(), "k");
    fake.update_faults(|f| f.dispose_delay = Some(Duration::from_secs(5)));
    let gave_up =
        tokio::time::timeout(Duration::from_secs(1), router.acquire(&key(), &spec("k"))).await;
    assert!(gave_up.is_err());
    let started = Instant::now();
    let sandbox = router.acquire(&key(), &spec("k")).await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(4),
        "waited for the cleanup"
    );
    assert!(sandbox.freshly_created(), "the residue was gone by then");
    assert_eq!(
        fake.dispose_calls(),
        1,
        "no second cleanup of the same residue"
    );
}

#[tokio::test(start_paused = true)]
async fn an_acquire_outlived_by_a_whole_disposal_is_refused_and_its_instance_disposed_of() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.acquire_delay = Some(Duration::from_secs(2)));
    let acquiring = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("k")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The host's disposal starts and lands while the backend is still creating: it saw nothing to remove.
    assert_eq!(router.dispose(&key()).await, None);
    assert!(!router.is_unclean(&key()));
    let err = acquiring.await.unwrap().unwrap_err();
    assert_eq!(unclean_code(&err), None, "the disposal landed; no code");
    let disposals = fake.disposals();
    assert_eq!(disposals.len(), 2, "{disposals:?}");
    assert_eq!(disposals[1].1.kind.as_deref(), Some("k"));
    assert!(
        disposals[1].1.instance_id.is_some(),
        "exactly that instance"
    );
    assert!(
        fake.instances().is_empty(),
        "nothing outlives the host's disposal"
    );
    assert!(!router.is_unclean(&key()));
    assert!(router
        .acquire(&key(), &spec("k"))
        .await
        .unwrap()
        .freshly_created());
}

#[tokio::test(start_paused = true)]
async fn an_acquire_outlived_by_a_whole_scope_purge_is_refused_too() {
    let (fake, router) = setup(RouterConfig::default());
    fake.update_faults(|f| f.acquire_delay = Some(Duration::from_secs(2)));
    let acquiring = {
        let r = router.clone();
        tokio::spawn(async move { r.acquire(&key(), &spec("k")).await })
    };
    let elsewhere = {
        let r = router.clone();
        let other = SandboxKey::conversation("prod", "thread-2", "agent");
        tokio::spawn(async move { r.acquire(&other, &spec("k")).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        router.dispose_scope("prod", "thread-1").await.undisposed,
        None
    );
    let err = acquiring.await.unwrap().unwrap_err();
    assert_eq!(unclean_code(&err), None);
    elsewhere
        .await
        .unwrap()
        .expect("another conversation is not affected");
    assert_eq!(fake.instances().len(), 1, "only the other conversation's");
}
