//! Router construction: defaults, validation order, fixed and per-spec candidates.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    BackendSelection, Capability, ErrorKind, FailedCleanup, Isolation, IsolationScope, Router,
    RouterConfig, SandboxBackend, SandboxKey, SandboxSpec, DEFAULT_CLEANUP_TIMEOUT,
};

fn fake(name: &str, isolation: Isolation) -> Arc<FakeBackend> {
    Arc::new(FakeBackend::new(name, isolation))
}

fn backends(list: &[&Arc<FakeBackend>]) -> Vec<Arc<dyn SandboxBackend>> {
    list.iter()
        .map(|b| Arc::clone(b) as Arc<dyn SandboxBackend>)
        .collect()
}

fn refused(result: Result<Router, sandbox_core::SandboxError>, kind: ErrorKind) -> String {
    let err = result.expect_err("construction should be refused");
    assert_eq!(err.kind(), kind, "{err}");
    err.to_string()
}

fn spec() -> SandboxSpec {
    SandboxSpec::builder("python").build().unwrap()
}

#[test]
fn defaults_follow_the_contract() {
    let c = RouterConfig::default();
    assert_eq!(c.min_isolation, Isolation::Microvm);
    assert_eq!(c.min_isolation_scope, IsolationScope::Conversation);
    assert_eq!(c.selection, BackendSelection::Fixed);
    assert_eq!(c.selected, None);
    assert!(c.denied_capabilities.is_empty());
    assert_eq!(c.cleanup_timeout, Duration::from_secs(30));
    assert_eq!(DEFAULT_CLEANUP_TIMEOUT, Duration::from_secs(30));
    assert_eq!(c.failed_cleanup, FailedCleanup::Dispose);

    let set = RouterConfig::default()
        .min_isolation(Isolation::Container)
        .min_isolation_scope(IsolationScope::Call)
        .selection(BackendSelection::PerSpec)
        .deny(Capability::FilesDelete)
        .cleanup_timeout(Duration::from_secs(5))
        .failed_cleanup(FailedCleanup::Keep);
    assert_eq!(set.min_isolation, Isolation::Container);
    assert_eq!(set.min_isolation_scope, IsolationScope::Call);
    assert_eq!(set.selection, BackendSelection::PerSpec);
    assert!(set.denied_capabilities.contains(&Capability::FilesDelete));
    assert_eq!(set.cleanup_timeout, Duration::from_secs(5));
    assert_eq!(set.failed_cleanup, FailedCleanup::Keep);
    assert_eq!(
        RouterConfig::default()
            .selected("docker")
            .selected
            .as_deref(),
        Some("docker")
    );
}

#[tokio::test]
async fn fixed_with_no_backends_is_a_router_with_no_candidate() {
    let router = Router::new(Vec::new(), RouterConfig::default()).unwrap();
    assert!(!router.enabled());
    assert_eq!(
        router.ensure_can_serve(&spec()).unwrap_err().kind(),
        ErrorKind::NoBackend
    );
    assert!(router.backend_for(&spec()).is_none());
    let err = router
        .acquire(&SandboxKey::conversation("s", "t", "a"), &spec())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoBackend);
    // No candidate is checked first: a selected name with nothing registered is still "no candidate".
    let router = Router::new(Vec::new(), RouterConfig::default().selected("docker")).unwrap();
    assert!(!router.enabled());
}

#[test]
fn per_spec_with_selected_is_an_invalid_argument_before_anything_else() {
    let low = fake("low", Isolation::None);
    let msg = refused(
        Router::new(
            backends(&[&low]),
            RouterConfig::default()
                .selection(BackendSelection::PerSpec)
                .selected("low"),
        ),
        ErrorKind::InvalidArgument,
    );
    assert!(msg.contains("per_spec"), "{msg}");
    // Even with no backend at all, and even when nothing would clear the floor.
    refused(
        Router::new(
            Vec::new(),
            RouterConfig::default()
                .selection(BackendSelection::PerSpec)
                .selected("x"),
        ),
        ErrorKind::InvalidArgument,
    );
}

#[test]
fn a_zero_cleanup_timeout_is_refused() {
    let vm = fake("vm", Isolation::Microvm);
    for selection in [BackendSelection::Fixed, BackendSelection::PerSpec] {
        refused(
            Router::new(
                backends(&[&vm]),
                RouterConfig::default()
                    .selection(selection)
                    .cleanup_timeout(Duration::ZERO),
            ),
            ErrorKind::InvalidArgument,
        );
    }
    // Even with no backend, and before the selected name and the floor.
    refused(
        Router::new(
            Vec::new(),
            RouterConfig::default().cleanup_timeout(Duration::ZERO),
        ),
        ErrorKind::InvalidArgument,
    );
    refused(
        Router::new(
            backends(&[&fake("c", Isolation::Container)]),
            RouterConfig::default()
                .selected("missing")
                .cleanup_timeout(Duration::ZERO),
        ),
        ErrorKind::InvalidArgument,
    );
}

#[test]
fn fixed_with_an_unknown_selected_name_lists_the_registered_ones() {
    let a = fake("docker", Isolation::Container);
    let b = fake("docker-sbx", Isolation::Microvm);
    let msg = refused(
        Router::new(
            backends(&[&a, &b]),
            RouterConfig::default().selected("kata"),
        ),
        ErrorKind::NoBackend,
    );
    assert!(msg.contains("\"kata\""), "{msg}");
    assert!(msg.contains("\"docker\", \"docker-sbx\""), "{msg}");
}

#[test]
fn fixed_refuses_a_backend_below_the_floor_and_the_default_floor_is_microvm() {
    let container = fake("docker", Isolation::Container);
    let msg = refused(
        Router::new(backends(&[&container]), RouterConfig::default()),
        ErrorKind::NotPermitted,
    );
    assert!(
        msg.contains("container") && msg.contains("microvm"),
        "{msg}"
    );
    // The first backend is the one used when none is selected, even if a later one would clear.
    let vm = fake("vm", Isolation::Microvm);
    refused(
        Router::new(backends(&[&container, &vm]), RouterConfig::default()),
        ErrorKind::NotPermitted,
    );
    // Selecting the one that clears works; so does lowering the floor.
    let router = Router::new(
        backends(&[&container, &vm]),
        RouterConfig::default().selected("vm"),
    )
    .unwrap();
    assert!(router.enabled());
    assert_eq!(router.backend_for(&spec()).unwrap().name(), "vm");
    let router = Router::new(
        backends(&[&container]),
        RouterConfig::default().min_isolation(Isolation::Container),
    )
    .unwrap();
    assert_eq!(router.backend_for(&spec()).unwrap().name(), "docker");
    // Every rung at or above the floor clears it.
    for rung in [Isolation::Microvm, Isolation::Vm] {
        Router::new(backends(&[&fake("x", rung)]), RouterConfig::default()).unwrap();
    }
    for rung in [
        Isolation::None,
        Isolation::Runtime,
        Isolation::OsProcess,
        Isolation::HardenedContainer,
    ] {
        refused(
            Router::new(backends(&[&fake("x", rung)]), RouterConfig::default()),
            ErrorKind::NotPermitted,
        );
    }
}

#[test]
fn fixed_routes_only_to_its_one_backend() {
    let a = fake("a", Isolation::Microvm);
    let b = fake("b", Isolation::Microvm);
    let router = Router::new(backends(&[&a, &b]), RouterConfig::default().selected("b")).unwrap();
    assert_eq!(router.backend_for(&spec()).unwrap().name(), "b");
    assert_eq!(router.backends().len(), 2, "both stay registered");
}

#[test]
fn per_spec_needs_one_backend_above_the_floor() {
    let low = fake("low", Isolation::Container);
    let lower = fake("lower", Isolation::None);
    let msg = refused(
        Router::new(
            backends(&[&low, &lower]),
            RouterConfig::default().selection(BackendSelection::PerSpec),
        ),
        ErrorKind::NotPermitted,
    );
    assert!(msg.contains("\"low\" (container)"), "{msg}");
    refused(
        Router::new(
            Vec::new(),
            RouterConfig::default().selection(BackendSelection::PerSpec),
        ),
        ErrorKind::NotPermitted,
    );
}

#[tokio::test]
async fn per_spec_keeps_below_floor_backends_for_disposal_but_never_routes_to_them() {
    let low = fake("low", Isolation::Container);
    let vm = fake("vm", Isolation::Microvm);
    let router = Router::new(
        backends(&[&low, &vm]),
        RouterConfig::default().selection(BackendSelection::PerSpec),
    )
    .unwrap();
    assert!(router.enabled());
    assert_eq!(router.backend_for(&spec()).unwrap().name(), "vm");
    let key = SandboxKey::conversation("s", "t", "a");
    router.acquire(&key, &spec()).await.unwrap();
    assert_eq!(low.acquire_calls(), 0);
    assert_eq!(vm.acquire_calls(), 1);
    assert_eq!(router.dispose(&key).await, None);
    assert_eq!(
        low.dispose_calls(),
        1,
        "below-floor backends get the fan-out"
    );
    assert_eq!(vm.dispose_calls(), 1);
}

#[test]
fn debug_names_the_backends_and_candidates() {
    let low = fake("low", Isolation::Container);
    let vm = fake("vm", Isolation::Microvm);
    let router = Router::new(
        backends(&[&low, &vm]),
        RouterConfig::default().selection(BackendSelection::PerSpec),
    )
    .unwrap();
    let shown = format!("{router:?}");
    assert!(shown.contains("backends: [\"low\", \"vm\"]"), "{shown}");
    assert!(shown.contains("candidates: [\"vm\"]"), "{shown}");
}
