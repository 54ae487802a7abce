//! Disposal: fan-out and folding, dispose_kind bounds, dispose_call refusals, dispose_unclean, dispose_scope
//! and mark_unclean.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    BackendSelection, DisposalCode, DisposalFailure, DisposeSelector, ErrorKind, FailedCleanup,
    Isolation, IsolationScope, Router, RouterConfig, SandboxBackend, SandboxError, SandboxKey,
    SandboxSpec, ScopePurge, UncleanTarget,
};
use tokio::time::Instant;

fn fakes(names: &[&str]) -> Vec<Arc<FakeBackend>> {
    names
        .iter()
        .map(|n| Arc::new(FakeBackend::new(*n, Isolation::Microvm)))
        .collect()
}

fn router(fakes: &[Arc<FakeBackend>], config: RouterConfig) -> Router {
    let list = fakes
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn SandboxBackend>)
        .collect();
    Router::new(list, config).unwrap()
}

fn key() -> SandboxKey {
    SandboxKey::conversation("prod", "thread-1", "agent")
}

fn spec(kind: &str) -> SandboxSpec {
    SandboxSpec::builder(kind).build().unwrap()
}

fn fail(fake: &FakeBackend, code: Option<DisposalCode>) {
    fake.update_faults(|f| f.dispose_failure = code);
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn dispose_fans_out_folds_with_prefixes_and_never_raises() {
    let f = fakes(&["a", "b", "c"]);
    let r = router(&f, RouterConfig::default());
    fail(&f[1], Some(DisposalCode::Refused));
    fail(&f[2], Some(DisposalCode::Unreachable));
    let failure = r.dispose(&key()).await.expect("two backends failed");
    assert_eq!(failure.code, DisposalCode::Unreachable);
    assert_eq!(
        failure.detail,
        "b: injected dispose failure (b); c: injected dispose failure (c)"
    );
    for fake in &f {
        assert_eq!(fake.disposals(), vec![(key(), DisposeSelector::all())]);
    }
    assert!(r.is_unclean(&key()));
    assert_eq!(r.unclean_failure(&key()), Some(failure));

    // One failure alone is returned unchanged (apart from its prefix).
    fail(&f[2], None);
    let failure = r.dispose(&key()).await.unwrap();
    assert_eq!(failure.code, DisposalCode::Refused);
    assert_eq!(failure.detail, "b: injected dispose failure (b)");
    assert!(r.is_unclean(&key()), "b is still pending");
    fail(&f[1], None);
    assert_eq!(r.dispose(&key()).await, None);
    assert!(!r.is_unclean(&key()));
}

#[tokio::test]
async fn dispose_with_no_backend_or_with_keep() {
    let none = Router::new(Vec::new(), RouterConfig::default()).unwrap();
    assert_eq!(none.dispose(&key()).await, None);

    let f = fakes(&["a"]);
    let r = router(
        &f,
        RouterConfig::default().failed_cleanup(FailedCleanup::Keep),
    );
    fail(&f[0], Some(DisposalCode::Refused));
    assert!(
        r.dispose(&key()).await.is_some(),
        "the failure is still reported"
    );
    assert!(
        !r.is_unclean(&key()),
        "but Keep writes nothing to the ledger"
    );
}

#[tokio::test(start_paused = true)]
async fn dispose_is_bounded_by_the_cleanup_timeout() {
    let f = fakes(&["a", "b"]);
    let r = router(&f, RouterConfig::default());
    f[0].update_faults(|x| x.dispose_hang = true);
    let started = Instant::now();
    let failure = r.dispose(&key()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert_eq!(failure.code, DisposalCode::Timeout);
    assert_eq!(failure.detail, "a: disposal exceeded its 30 s bound");
    assert_eq!(
        f[1].dispose_calls(),
        1,
        "the other backend ran concurrently"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_dispose_never_cancels_it() {
    let f = fakes(&["a"]);
    let r = router(&f, RouterConfig::default());
    r.acquire(&key(), &spec("k")).await.unwrap();
    f[0].update_faults(|x| x.dispose_delay = Some(Duration::from_secs(5)));
    let gave_up = tokio::time::timeout(SECOND, r.dispose(&key())).await;
    assert!(gave_up.is_err());
    assert!(r.is_unclean(&key()), "in flight");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        f[0].instances().is_empty(),
        "the disposal finished on its own"
    );
    assert!(!r.is_unclean(&key()), "and cleared its marker");
}

fn per_spec(f: &[Arc<FakeBackend>]) -> Router {
    router(
        f,
        RouterConfig::default().selection(BackendSelection::PerSpec),
    )
}

#[tokio::test]
async fn dispose_kind_targets_the_serving_backend_else_every_backend() {
    let f = fakes(&["a", "b"]);
    let r = per_spec(&f);
    let sandbox = r.acquire(&key(), &spec("k")).await.unwrap();
    let id = sandbox.instance_id().to_owned();
    assert!(r.dispose_kind(&key(), "k", Some(&id), SECOND).await);
    assert_eq!(
        f[0].disposals(),
        vec![(key(), DisposeSelector::instance("k", id))]
    );
    assert_eq!(f[1].dispose_calls(), 0);
    assert!(f[0].instances().is_empty());

    // The landed disposal forgot the instance: the kind is now unknown, so every backend is asked.
    assert!(r.dispose_kind(&key(), "k", None, SECOND).await);
    assert_eq!(f[0].dispose_calls(), 2);
    assert_eq!(f[1].disposals(), vec![(key(), DisposeSelector::kind("k"))]);
}

#[tokio::test(start_paused = true)]
async fn dispose_kind_timeouts_mark_the_key_unclean_unless_keep() {
    let f = fakes(&["fake"]);
    let r = router(&f, RouterConfig::default());
    r.acquire(&key(), &spec("k")).await.unwrap();
    f[0].update_faults(|x| x.dispose_hang = true);
    let started = Instant::now();
    assert!(
        !r.dispose_kind(&key(), "k", None, Duration::from_secs(2))
            .await
    );
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    let failure = r.unclean_failure(&key()).unwrap();
    assert_eq!(
        failure,
        DisposalFailure::new(
            DisposalCode::Timeout,
            "fake: disposal exceeded its 2 s bound"
        )
    );
    let err = r.acquire(&key(), &spec("k")).await.unwrap_err();
    assert!(matches!(
        err,
        SandboxError::Unclean {
            code: Some(DisposalCode::Timeout)
        }
    ));

    let f = fakes(&["fake"]);
    let r = router(
        &f,
        RouterConfig::default().failed_cleanup(FailedCleanup::Keep),
    );
    f[0].update_faults(|x| x.dispose_hang = true);
    assert!(
        !r.dispose_kind(&key(), "k", None, Duration::from_millis(500))
            .await
    );
    assert!(!r.is_unclean(&key()));
}

#[tokio::test]
async fn dispose_call_refusals() {
    let f = fakes(&["a"]);
    let r = router(&f, RouterConfig::default());
    let err = r.dispose_call(&key(), SECOND).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);

    let mut conversation_only = FakeBackend::default_declarations();
    conversation_only.isolation_scopes = BTreeSet::from([IsolationScope::Conversation]);
    let conv =
        Arc::new(FakeBackend::new("conv", Isolation::Microvm).with_declarations(conversation_only));
    let r = Router::new(
        vec![conv.clone() as Arc<dyn SandboxBackend>],
        RouterConfig::default(),
    )
    .unwrap();
    let err = r
        .dispose_call(&key().with_call("c1"), SECOND)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("call scope"), "{err}");
    assert_eq!(conv.dispose_calls(), 0);
}

#[tokio::test]
async fn dispose_call_writes_nothing_to_the_ledger() {
    let f = fakes(&["a"]);
    let r = router(&f, RouterConfig::default());
    let call = key().with_call("c1");
    let call_spec = SandboxSpec::builder("k")
        .isolation_scope(IsolationScope::Call)
        .build()
        .unwrap();
    r.acquire(&call, &call_spec).await.unwrap();
    fail(&f[0], Some(DisposalCode::Refused));
    assert!(!r.dispose_call(&call, SECOND).await.unwrap());
    assert!(!r.is_unclean(&call));
    assert!(!r.is_unclean(&key()));
    fail(&f[0], None);
    assert!(r.dispose_call(&call, SECOND).await.unwrap());
    assert!(f[0].instances().is_empty());
}

#[tokio::test]
async fn the_ledger_clears_only_when_every_pending_target_landed() {
    let f = fakes(&["a", "b", "c"]);
    let r = router(&f, RouterConfig::default());
    fail(&f[0], Some(DisposalCode::Refused));
    fail(&f[1], Some(DisposalCode::Unknown));
    r.dispose(&key()).await.unwrap();
    assert!(r.is_unclean(&key()));

    // Only the pending targets are retried: c landed and is not asked again.
    fail(&f[0], None);
    assert!(!r.dispose_unclean(&key(), None, None, SECOND).await.unwrap());
    assert!(r.is_unclean(&key()), "b is still pending");
    assert_eq!(f[2].dispose_calls(), 1);
    fail(&f[1], None);
    assert!(r.dispose_unclean(&key(), None, None, SECOND).await.unwrap());
    assert!(!r.is_unclean(&key()));
    assert_eq!(f[0].dispose_calls(), 2, "a landed on the first retry");
    assert_eq!(f[1].dispose_calls(), 3);
    assert_eq!(f[2].dispose_calls(), 1);
}

#[tokio::test]
async fn dispose_unclean_refuses_call_keys_and_sweeps_a_clean_key() {
    let f = fakes(&["a", "b"]);
    let r = router(&f, RouterConfig::default());
    let err = r
        .dispose_unclean(&key().with_call("c"), None, None, SECOND)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(r.dispose_unclean(&key(), None, None, SECOND).await.unwrap());
    assert_eq!(f[0].disposals(), vec![(key(), DisposeSelector::all())]);
    assert_eq!(f[1].disposals(), vec![(key(), DisposeSelector::all())]);

    // With a kind and an instance, exactly that is targeted.
    assert!(r
        .dispose_unclean(&key(), Some("k"), Some("i-1"), SECOND)
        .await
        .unwrap());
    assert_eq!(
        f[0].disposals()[1],
        (key(), DisposeSelector::instance("k", "i-1"))
    );
}

#[tokio::test]
async fn mark_unclean_records_what_the_host_knows() {
    let f = fakes(&["a", "b"]);
    let r = router(&f, RouterConfig::default());
    let reason = DisposalFailure::new(DisposalCode::Refused, "host saw it survive");

    r.mark_unclean(&key().with_call("c"), reason.clone(), None);
    assert!(
        !r.is_unclean(&key().with_call("c")),
        "call keys are never recorded"
    );

    r.mark_unclean(
        &key(),
        reason.clone(),
        Some(UncleanTarget::backend("b").kind("k").instance("i-9")),
    );
    let err = r.acquire(&key(), &spec("k")).await.unwrap_err();
    assert_eq!(err.to_string(), "sandbox key is unclean (refused)");
    assert_eq!(r.unclean_failure(&key()), Some(reason.clone()));
    assert!(r.dispose_unclean(&key(), None, None, SECOND).await.unwrap());
    assert_eq!(f[0].dispose_calls(), 0, "only the named target is retried");
    assert_eq!(
        f[1].disposals(),
        vec![(key(), DisposeSelector::instance("k", "i-9"))]
    );

    // An unknown backend name targets every backend.
    r.mark_unclean(&key(), reason, Some(UncleanTarget::backend("nobody")));
    assert!(r.dispose_unclean(&key(), None, None, SECOND).await.unwrap());
    assert_eq!(f[0].dispose_calls(), 1);
    assert_eq!(f[1].dispose_calls(), 2);

    // Keep does not silence the host.
    let k = router(
        &fakes(&["x"]),
        RouterConfig::default().failed_cleanup(FailedCleanup::Keep),
    );
    k.mark_unclean(
        &key(),
        DisposalFailure::new(DisposalCode::Unknown, "x"),
        None,
    );
    assert!(k.is_unclean(&key()));
}

async fn plant(fake: &FakeBackend, agent: &str, thread: &str) {
    fake.acquire(&SandboxKey::conversation("prod", thread, agent), &spec("k"))
        .await
        .unwrap();
}

#[tokio::test]
async fn dispose_scope_sums_counts_and_folds_failures() {
    let f = fakes(&["a", "b", "c"]);
    let r = router(&f, RouterConfig::default());
    // Created by "other processes": straight through the backends.
    plant(&f[0], "x", "thread-1").await;
    plant(&f[0], "y", "thread-1").await;
    plant(&f[1], "x", "thread-1").await;
    plant(&f[1], "x", "thread-2").await;
    let purge = r.dispose_scope("prod", "thread-1").await;
    assert_eq!(
        purge,
        ScopePurge {
            disposed: 3,
            undisposed: None
        }
    );
    assert_eq!(
        f[1].instances().len(),
        1,
        "another conversation is untouched"
    );
    for fake in &f {
        assert_eq!(fake.dispose_scope_calls(), 1);
    }

    fail(&f[1], Some(DisposalCode::Refused));
    fail(&f[2], Some(DisposalCode::Unlisted));
    plant(&f[0], "x", "thread-2").await;
    let purge = r.dispose_scope("prod", "thread-2").await;
    assert_eq!(purge.disposed, 1);
    let failure = purge.undisposed.unwrap();
    assert_eq!(failure.code, DisposalCode::Refused);
    assert_eq!(
        failure.detail,
        "b: injected dispose_scope failure (b); c: injected dispose_scope failure (c)"
    );
}

#[tokio::test]
async fn dispose_scope_failures_mark_known_keys_and_a_landed_purge_clears_them() {
    let f = fakes(&["a"]);
    let r = router(&f, RouterConfig::default());
    r.acquire(&key(), &spec("k")).await.unwrap();
    fail(&f[0], Some(DisposalCode::Unreachable));
    let purge = r.dispose_scope("prod", "thread-1").await;
    assert_eq!(purge.undisposed.unwrap().code, DisposalCode::Unreachable);
    assert!(r.is_unclean(&key()));
    fail(&f[0], None);
    let purge = r.dispose_scope("prod", "thread-1").await;
    assert_eq!(
        purge,
        ScopePurge {
            disposed: 1,
            undisposed: None
        }
    );
    assert!(!r.is_unclean(&key()));
    assert!(
        r.acquire(&key(), &spec("k"))
            .await
            .unwrap()
            .freshly_created(),
        "the purged instance was forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scope_purge_in_flight_refuses_acquires_in_that_conversation() {
    let f = fakes(&["a"]);
    let r = router(
        &f,
        RouterConfig::default().cleanup_timeout(Duration::from_secs(3)),
    );
    f[0].update_faults(|x| x.dispose_hang = true);
    let purging = {
        let r = r.clone();
        tokio::spawn(async move { r.dispose_scope("prod", "thread-1").await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = r.acquire(&key(), &spec("k")).await.unwrap_err();
    assert!(matches!(err, SandboxError::Unclean { code: None }));
    let elsewhere = SandboxKey::conversation("prod", "thread-2", "agent");
    r.acquire(&elsewhere, &spec("k")).await.unwrap();

    let purge = purging.await.unwrap();
    let failure = purge.undisposed.unwrap();
    assert_eq!(failure.code, DisposalCode::Timeout);
    assert_eq!(failure.detail, "a: scope disposal exceeded its 3 s bound");
    assert!(
        !r.is_unclean(&key()),
        "no key of the conversation was known"
    );
}

/// Polls a future on the calling thread with no tokio runtime around it (as a host on another executor
/// would), giving up after a bounded number of polls.
fn poll_without_tokio<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..1000 {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::yield_now();
    }
    panic!("the future never finished");
}

#[test]
fn disposal_outside_a_tokio_runtime_reports_a_failure_and_never_panics() {
    let f = fakes(&["a"]);
    let r = router(&f, RouterConfig::default());
    let failure = poll_without_tokio(r.dispose(&key())).expect("nothing could run");
    assert_eq!(failure.code, DisposalCode::Unknown);
    assert!(
        r.is_unclean(&key()),
        "a disposal that could not run fails closed"
    );
    assert!(!poll_without_tokio(r.dispose_kind(
        &key(),
        "k",
        None,
        SECOND
    )));
    assert!(!poll_without_tokio(r.dispose_unclean(&key(), None, None, SECOND)).unwrap());
    let purge = poll_without_tokio(r.dispose_scope("prod", "thread-1"));
    assert_eq!(
        purge.undisposed.map(|u| u.code),
        Some(DisposalCode::Unknown)
    );
    assert_eq!(f[0].dispose_calls() + f[0].dispose_scope_calls(), 0);
}
