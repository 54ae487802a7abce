//! Reset, fork and the cleanup between uses through the router: each goes through the backend that
//! served the sandbox, the router's record follows, and every refusal has its kind.

use std::sync::Arc;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    Capability, Cleaned, CleanupRung, DisposalCode, ErrorKind, Isolation, Router, RouterConfig,
    SandboxBackend, SandboxKey, SandboxSpec,
};

fn fake(extra: &[Capability]) -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new("fake", Isolation::Microvm).declaring(extra))
}

fn router_with(fake: &Arc<FakeBackend>, config: RouterConfig) -> Router {
    Router::new(vec![Arc::clone(fake) as Arc<dyn SandboxBackend>], config).unwrap()
}

fn router(fake: &Arc<FakeBackend>) -> Router {
    router_with(fake, RouterConfig::default())
}

fn key(thread: &str) -> SandboxKey {
    SandboxKey::conversation("prod", thread, "agent")
}

fn spec(min_cleanup: CleanupRung) -> SandboxSpec {
    SandboxSpec::builder("py")
        .min_cleanup(min_cleanup)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_reset_replaces_the_remembered_instance_and_the_next_acquire_serves_it() {
    let fake = fake(&[Capability::Snapshot]);
    let r = router(&fake);
    let spec = spec(CleanupRung::Reclaim);
    let before = r.acquire(&key("t"), &spec).await.unwrap();
    before.write_file("made", b"x", ".").await.unwrap();

    let after = r.reset(&key("t"), &*before).await.unwrap();
    assert_ne!(after.instance_id(), before.instance_id());
    assert!(after.stat_file("made", ".").await.unwrap().is_none());
    assert!(
        after.stat_file(".", ".").await.unwrap().is_some(),
        "the storage base is kept"
    );
    let stale = before.stat_file(".", ".").await.unwrap_err();
    assert_eq!(stale.kind(), ErrorKind::SandboxGone, "{stale}");

    // The record names the reset instance: served again without adoption's disposal.
    let again = r.acquire(&key("t"), &spec).await.unwrap();
    assert_eq!(again.instance_id(), after.instance_id());
    assert_eq!(fake.dispose_calls(), 0);

    // The old handle is no longer one the router served.
    let err = r.reset(&key("t"), &*before).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[tokio::test]
async fn reset_is_refused_with_its_kind() {
    // Not declared.
    let plain = fake(&[]);
    let r = router(&plain);
    let sandbox = r
        .acquire(&key("t"), &spec(CleanupRung::Reclaim))
        .await
        .unwrap();
    let err = r.reset(&key("t"), &*sandbox).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported, "{err}");
    assert!(err.to_string().contains("\"fake\""), "{err}");

    // Denied by the host, though declared.
    let snapshots = fake(&[Capability::Snapshot]);
    let r = router_with(
        &snapshots,
        RouterConfig::default().deny(Capability::Snapshot),
    );
    let sandbox = r
        .acquire(&key("t"), &spec(CleanupRung::Reclaim))
        .await
        .unwrap();
    let err = r.reset(&key("t"), &*sandbox).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityDenied, "{err}");

    // Another key than the one it was served for.
    let r = router(&snapshots);
    let sandbox = r
        .acquire(&key("u"), &spec(CleanupRung::Reclaim))
        .await
        .unwrap();
    let err = r.reset(&key("other"), &*sandbox).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    // An unclean key.
    snapshots.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    assert!(r.dispose(&key("u")).await.is_some());
    let err = r.reset(&key("u"), &*sandbox).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unclean, "{err}");
    snapshots.update_faults(|f| f.dispose_failure = None);

    // The backend's own failure changes nothing.
    let r = router(&snapshots);
    let sandbox = r
        .acquire(&key("v"), &spec(CleanupRung::Reclaim))
        .await
        .unwrap();
    snapshots.update_faults(|f| f.snapshot_failure = Some("engine down".into()));
    let err = r.reset(&key("v"), &*sandbox).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Engine, "{err}");
    snapshots.update_faults(|f| f.snapshot_failure = None);
    let same = r
        .acquire(&key("v"), &spec(CleanupRung::Reclaim))
        .await
        .unwrap();
    assert_eq!(same.instance_id(), sandbox.instance_id());
}

#[tokio::test]
async fn a_fork_copies_files_is_remembered_and_diverges() {
    let fake = fake(&[Capability::Snapshot]);
    let r = router(&fake);
    let spec = spec(CleanupRung::Reclaim);
    let source = r.acquire(&key("src"), &spec).await.unwrap();
    source
        .write_file("data/a", b"\x00\xffbytes", ".")
        .await
        .unwrap();

    let fork = r.fork(&key("src"), &spec, &key("dst")).await.unwrap();
    assert_ne!(fork.instance_id(), source.instance_id());
    assert_eq!(
        fork.read_file("data/a", ".", 64).await.unwrap(),
        b"\x00\xffbytes"
    );

    // Remembered like an acquired sandbox: served without adoption's disposal.
    let again = r.acquire(&key("dst"), &spec).await.unwrap();
    assert_eq!(again.instance_id(), fork.instance_id());
    assert_eq!(fake.dispose_calls(), 0);

    // Independent afterwards.
    fork.write_file("only-in-fork", b"f", ".").await.unwrap();
    source.write_file("data/a", b"changed", ".").await.unwrap();
    assert!(source
        .stat_file("only-in-fork", ".")
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        fork.read_file("data/a", ".", 64).await.unwrap(),
        b"\x00\xffbytes"
    );

    // A reset of the fork goes through the router too, and the source is untouched.
    let reset = r.reset(&key("dst"), &*fork).await.unwrap();
    assert!(reset.stat_file("data/a", ".").await.unwrap().is_none());
    assert_eq!(
        source.read_file("data/a", ".", 64).await.unwrap(),
        b"changed"
    );

    // Disposing of the fork's key removes the fork, not the source.
    assert_eq!(r.dispose(&key("dst")).await, None);
    let left: Vec<String> = fake.instances().into_iter().map(|(_, _, id)| id).collect();
    assert_eq!(left, vec![source.instance_id().to_owned()]);
}

#[tokio::test]
async fn a_fork_is_refused_with_its_kind_and_leaves_nothing_under_the_target() {
    let spec = spec(CleanupRung::Reclaim);

    let plain = fake(&[]);
    let r = router(&plain);
    r.acquire(&key("src"), &spec).await.unwrap();
    let err = r.fork(&key("src"), &spec, &key("dst")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported, "{err}");
    assert_eq!(plain.instances().len(), 1);

    let snapshots = fake(&[Capability::Snapshot]);
    let r = router(&snapshots);
    r.acquire(&key("src"), &spec).await.unwrap();
    let cases = [
        (key("src"), key("src"), ErrorKind::InvalidArgument),
        (key("never"), key("dst"), ErrorKind::InvalidArgument),
        (
            key("src"),
            key("src").with_call("c1"),
            ErrorKind::InvalidArgument,
        ),
    ];
    for (source, target, kind) in cases {
        let err = r.fork(&source, &spec, &target).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{source} -> {target}: {err}");
    }
    // A spec of another kind names no served sandbox.
    let other = SandboxSpec::builder("node").build().unwrap();
    let err = r.fork(&key("src"), &other, &key("dst")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");

    // The backend's failure.
    snapshots.update_faults(|f| f.snapshot_failure = Some("engine down".into()));
    let err = r.fork(&key("src"), &spec, &key("dst")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Engine, "{err}");
    snapshots.update_faults(|f| f.snapshot_failure = None);
    assert_eq!(snapshots.instances().len(), 1, "nothing under the target");

    // An unclean target.
    snapshots.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    assert!(r.dispose(&key("dst")).await.is_some());
    snapshots.update_faults(|f| f.dispose_failure = None);
    let err = r.fork(&key("src"), &spec, &key("dst")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unclean, "{err}");
    assert_eq!(snapshots.instances().len(), 1);

    // Denied by the host.
    let r = router_with(
        &snapshots,
        RouterConfig::default().deny(Capability::Snapshot),
    );
    r.acquire(&key("src2"), &spec).await.unwrap();
    let err = r.fork(&key("src2"), &spec, &key("dst2")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityDenied, "{err}");
}

#[tokio::test]
async fn two_forks_the_other_way_round_both_end() {
    let fake = fake(&[Capability::Snapshot]);
    let r = router(&fake);
    let spec = spec(CleanupRung::Reclaim);
    let (a, b) = (key("a"), key("b"));
    r.acquire(&a, &spec).await.unwrap();
    r.acquire(&b, &spec).await.unwrap();
    // Each holds the other's gate in the other role; both reach the backend, which refuses an
    // occupied target.
    let (ab, ba) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(r.fork(&a, &spec, &b), r.fork(&b, &spec, &a))
    })
    .await
    .expect("no fork waits forever");
    for err in [ab.unwrap_err(), ba.unwrap_err()] {
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("already has"), "{err}");
    }
    assert_eq!(fake.instances().len(), 2);
}

/// Cleans a used sandbox of `spec` on a fake declaring `extra` under `config`: what was done,
/// and the fake.
async fn cleaned(
    extra: &[Capability],
    config: RouterConfig,
    min: CleanupRung,
) -> (Cleaned, Arc<FakeBackend>) {
    let fake = fake(extra);
    let r = router_with(&fake, config);
    let spec = spec(min);
    let sandbox = r.acquire(&key("t"), &spec).await.unwrap();
    sandbox.write_file("call-1/out", b"o", ".").await.unwrap();
    sandbox.write_file("kept", b"k", ".").await.unwrap();
    let done = r
        .clean_between_uses(&key("t"), &*sandbox, &spec, "call-1")
        .await
        .unwrap();
    match &done {
        Cleaned::Reclaimed => {
            assert!(sandbox.stat_file("call-1", ".").await.unwrap().is_none());
            assert!(sandbox.stat_file("kept", ".").await.unwrap().is_some());
        }
        Cleaned::Reset(reset) => {
            assert!(reset.stat_file("kept", ".").await.unwrap().is_none());
            let again = r.acquire(&key("t"), &spec).await.unwrap();
            assert_eq!(again.instance_id(), reset.instance_id());
        }
        Cleaned::Disposed => assert!(fake.instances().is_empty()),
        other => panic!("unexpected {other:?}"),
    }
    (done, fake)
}

#[tokio::test]
async fn the_weakest_declared_rung_that_meets_min_cleanup_is_applied() {
    use Capability::{Reclaim, Snapshot};
    use CleanupRung::{Dispose, Reset};
    let default = RouterConfig::default;
    let cases: [(&[Capability], RouterConfig, CleanupRung, CleanupRung); 7] = [
        (
            &[Reclaim, Snapshot],
            default(),
            CleanupRung::Reclaim,
            CleanupRung::Reclaim,
        ),
        (&[Snapshot], default(), CleanupRung::Reclaim, Reset),
        (&[], default(), CleanupRung::Reclaim, Dispose),
        (&[Reclaim, Snapshot], default(), Reset, Reset),
        (&[Reclaim], default(), Reset, Dispose),
        (&[Reclaim, Snapshot], default(), Dispose, Dispose),
        // A rung the host denies is not used: the next one up is.
        (
            &[Reclaim, Snapshot],
            default().deny(Reclaim),
            CleanupRung::Reclaim,
            Reset,
        ),
    ];
    for (extra, config, min, want) in cases {
        let (done, _) = cleaned(extra, config, min).await;
        assert_eq!(done.rung(), want, "{extra:?} at least {min}");
    }
}

#[tokio::test]
async fn a_cleanup_that_fails_is_an_error_never_a_weaker_rung() {
    let fake = fake(&[]);
    let r = router(&fake);
    let spec = spec(CleanupRung::Reclaim);
    let sandbox = r.acquire(&key("t"), &spec).await.unwrap();
    fake.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    let err = r
        .clean_between_uses(&key("t"), &*sandbox, &spec, "call-1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unclean, "{err}");
    assert!(r.is_unclean(&key("t")));

    // Another kind's spec, and a key the router did not serve it for.
    let other = SandboxSpec::builder("node").build().unwrap();
    let err = r
        .clean_between_uses(&key("t"), &*sandbox, &other, "call-1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = r
        .clean_between_uses(&key("x"), &*sandbox, &spec, "call-1")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}
