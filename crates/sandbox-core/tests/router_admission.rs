//! Admission: every refusal, their order, and per-spec selection.

use std::collections::BTreeSet;
use std::sync::Arc;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    BackendDeclarations, BackendSelection, Capability, CleanupRung, Egress, EgressEntry,
    EgressRule, ErrorKind, Isolation, IsolationScope, OsFamily, Router, RouterConfig,
    SandboxBackend, SandboxError, SandboxKey, SandboxLimits, SandboxSpec, SandboxSpecBuilder,
    TransferLimits,
};

fn backend(name: &str, isolation: Isolation, decl: BackendDeclarations) -> Arc<dyn SandboxBackend> {
    Arc::new(FakeBackend::new(name, isolation).with_declarations(decl))
}

fn full() -> BackendDeclarations {
    FakeBackend::default_declarations()
}

fn router(b: Arc<dyn SandboxBackend>, config: RouterConfig) -> Router {
    Router::new(vec![b], config).expect("router")
}

fn refusal(router: &Router, spec: &SandboxSpec) -> SandboxError {
    let err = router.ensure_can_serve(spec).expect_err("refused");
    assert!(router.backend_for(spec).is_none());
    err
}

fn kind_of(router: &Router, spec: &SandboxSpec) -> ErrorKind {
    refusal(router, spec).kind()
}

fn get_rule(host: &str) -> EgressEntry {
    EgressEntry::Rule(EgressRule::new(host, Some(vec!["GET".into()]), None).unwrap())
}

fn big() -> TransferLimits {
    TransferLimits {
        max_bytes_per_file: u64::MAX,
        max_total_bytes: u64::MAX,
        max_files: u64::MAX,
    }
}

fn spec(b: SandboxSpecBuilder) -> SandboxSpec {
    b.build().expect("valid spec")
}

#[test]
fn a2_a_denied_capability_is_refused_including_derived_ones() {
    let r = router(
        backend("vm", Isolation::Microvm, full()),
        RouterConfig::default().deny(Capability::FilesDelete),
    );
    let s = spec(SandboxSpec::builder("k").require(Capability::FilesDelete));
    let err = refusal(&r, &s);
    assert_eq!(err.kind(), ErrorKind::CapabilityDenied);
    assert!(err.is_admission_refusal());
    assert!(err.to_string().contains("files_delete"), "{err}");
    r.ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();

    // egress_paths is derived from an allowlist rule with paths, not asked for directly.
    let mut decl = full();
    decl.capabilities.insert(Capability::EgressPaths);
    decl.egress_modes.insert(Egress::Allowlist);
    let r = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default().deny(Capability::EgressPaths),
    );
    let rule = EgressRule::new("api.example.com", None, Some(vec!["/v1/*".into()])).unwrap();
    let s = spec(
        SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow(EgressEntry::Rule(rule)),
    );
    assert_eq!(kind_of(&r, &s), ErrorKind::CapabilityDenied);
}

#[test]
fn b1_the_effective_floor_is_the_higher_of_host_and_spec() {
    let r = router(
        backend("docker", Isolation::Container, full()),
        RouterConfig::default().min_isolation(Isolation::Container),
    );
    r.ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();
    // A spec may raise the floor...
    let raised = spec(SandboxSpec::builder("k").min_isolation(Isolation::Microvm));
    let err = refusal(&r, &raised);
    assert_eq!(err.kind(), ErrorKind::NotPermitted);
    assert!(err.to_string().contains("below the floor microvm"), "{err}");
    // ...but never lower it.
    let lowered = spec(SandboxSpec::builder("k").min_isolation(Isolation::None));
    r.ensure_can_serve(&lowered).unwrap();
    let vm = router(
        backend("vm", Isolation::Vm, full()),
        RouterConfig::default(),
    );
    vm.ensure_can_serve(&spec(
        SandboxSpec::builder("k").min_isolation(Isolation::Vm),
    ))
    .unwrap();
}

#[test]
fn b2_every_required_capability_must_be_declared() {
    let r = router(
        backend(
            "silent",
            Isolation::Microvm,
            BackendDeclarations {
                egress_modes: BTreeSet::from([Egress::Closed]),
                ..BackendDeclarations::default()
            },
        ),
        RouterConfig::default(),
    );
    // Silence declares {exec, files_in}: enough for a default spec.
    r.ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();
    let s = spec(
        SandboxSpec::builder("k")
            .require(Capability::FilesOut)
            .require(Capability::FilesList),
    );
    let err = refusal(&r, &s);
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported);
    assert!(err.to_string().contains("files_out, files_list"), "{err}");
}

#[test]
fn b2_snapshot_is_required_like_any_capability_and_min_cleanup_never_refuses() {
    let plain = BackendDeclarations {
        egress_modes: BTreeSet::from([Egress::Closed]),
        ..BackendDeclarations::default()
    };
    let r = router(
        backend("plain", Isolation::Microvm, plain.clone()),
        RouterConfig::default(),
    );
    let needs_snapshot = spec(SandboxSpec::builder("k").require(Capability::Snapshot));
    let err = refusal(&r, &needs_snapshot);
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported);
    assert!(err.to_string().contains("snapshot"), "{err}");
    // A cleanup floor is met by disposal where no cheaper rung is declared: never a refusal.
    let wants_reset = spec(SandboxSpec::builder("k").min_cleanup(CleanupRung::Reset));
    r.ensure_can_serve(&wants_reset).unwrap();
    assert_eq!(
        CleanupRung::at_least(wants_reset.min_cleanup(), &plain),
        CleanupRung::Dispose
    );
    let mut snapshots = plain;
    snapshots.capabilities.insert(Capability::Snapshot);
    let r = router(
        backend("snapshots", Isolation::Microvm, snapshots.clone()),
        RouterConfig::default(),
    );
    r.ensure_can_serve(&needs_snapshot).unwrap();
    assert_eq!(
        CleanupRung::at_least(wants_reset.min_cleanup(), &snapshots),
        CleanupRung::Reset
    );
}

#[test]
fn b3_egress_method_tokens_are_consulted_when_listed() {
    let mut decl = full();
    decl.capabilities.insert(Capability::EgressMethods);
    decl.egress_modes.insert(Egress::Allowlist);
    let s = spec(
        SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow(get_rule("api.example.com")),
    );
    // Some(∅): no method permitted.
    let r = router(
        backend("vm", Isolation::Microvm, decl.clone()),
        RouterConfig::default(),
    );
    let err = refusal(&r, &s);
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported);
    assert!(err.to_string().contains("egress methods GET"), "{err}");
    // Listed: fine.
    decl.egress_method_tokens = Some(BTreeSet::from(["GET".to_owned()]));
    let r = router(
        backend("vm", Isolation::Microvm, decl.clone()),
        RouterConfig::default(),
    );
    r.ensure_can_serve(&s).unwrap();
    // None: any token.
    decl.egress_method_tokens = None;
    let r = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default(),
    );
    r.ensure_can_serve(&s).unwrap();
}

#[test]
fn b4_a_named_os_family_must_be_declared() {
    let mut decl = full();
    decl.os_families.clear();
    let r = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default(),
    );
    // No family asked: silence refuses nothing.
    r.ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();
    let s = spec(SandboxSpec::builder("k").requires_os_family(OsFamily::Posix));
    assert_eq!(kind_of(&r, &s), ErrorKind::OsFamilyNotSupported);
    let r = router(
        backend("vm", Isolation::Microvm, full()),
        RouterConfig::default(),
    );
    r.ensure_can_serve(&s).unwrap();
    let windows = spec(SandboxSpec::builder("k").requires_os_family(OsFamily::Windows));
    assert_eq!(kind_of(&r, &windows), ErrorKind::OsFamilyNotSupported);
}

#[test]
fn b5_transfer_limits_are_compared_never_clamped() {
    let r = router(
        backend("vm", Isolation::Microvm, full()),
        RouterConfig::default(),
    );
    let at_ceiling = spec(SandboxSpec::builder("k").files_in(TransferLimits::default()));
    r.ensure_can_serve(&at_ceiling).unwrap();
    let one_more_file = TransferLimits {
        max_files: 65,
        ..TransferLimits::default()
    };
    let s = spec(SandboxSpec::builder("k").files_out(one_more_file));
    let err = refusal(&r, &s);
    assert_eq!(err.kind(), ErrorKind::TransferLimitsNotPermitted);
    assert!(err.to_string().contains("files_out"), "{err}");
    let smaller = TransferLimits {
        max_files: 1,
        ..TransferLimits::default()
    };
    r.ensure_can_serve(&spec(SandboxSpec::builder("k").files_in(smaller)))
        .unwrap();
}

#[test]
fn b6_the_egress_mode_must_be_enforced_exactly() {
    // Confining more than asked is refused too.
    let closed_only = router(
        backend("vm", Isolation::Microvm, full()),
        RouterConfig::default(),
    );
    let open = spec(SandboxSpec::builder("k").egress(Egress::Unrestricted));
    let err = refusal(&closed_only, &open);
    assert_eq!(err.kind(), ErrorKind::EgressNotEnforced);
    assert!(err.to_string().contains("it enforces: closed"), "{err}");

    let mut decl = full();
    decl.egress_modes = BTreeSet::from([Egress::Unrestricted]);
    let open_only = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default(),
    );
    open_only.ensure_can_serve(&open).unwrap();
    assert_eq!(
        kind_of(&open_only, &spec(SandboxSpec::builder("k"))),
        ErrorKind::EgressNotEnforced
    );

    // Silence enforces nothing: every spec is refused.
    let mut decl = full();
    decl.egress_modes.clear();
    let silent = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default(),
    );
    let err = refusal(&silent, &spec(SandboxSpec::builder("k")));
    assert!(err.to_string().contains("it enforces: none"), "{err}");
}

#[test]
fn b7_the_effective_scope_must_be_served() {
    let mut decl = full();
    decl.isolation_scopes = BTreeSet::from([IsolationScope::Conversation]);
    let conv_only = router(
        backend("vm", Isolation::Microvm, decl.clone()),
        RouterConfig::default(),
    );
    let call = spec(SandboxSpec::builder("k").isolation_scope(IsolationScope::Call));
    assert_eq!(kind_of(&conv_only, &call), ErrorKind::ScopeNotEnforced);
    conv_only
        .ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();

    // The host's scope floor raises a conversation spec to call.
    let host_call = router(
        backend("vm", Isolation::Microvm, decl.clone()),
        RouterConfig::default().min_isolation_scope(IsolationScope::Call),
    );
    assert_eq!(
        kind_of(&host_call, &spec(SandboxSpec::builder("k"))),
        ErrorKind::ScopeNotEnforced
    );

    // An empty set reads as {conversation}.
    decl.isolation_scopes.clear();
    let empty = router(
        backend("vm", Isolation::Microvm, decl),
        RouterConfig::default(),
    );
    empty
        .ensure_can_serve(&spec(SandboxSpec::builder("k")))
        .unwrap();
    assert_eq!(kind_of(&empty, &call), ErrorKind::ScopeNotEnforced);
}

/// A spec that every check refuses on a backend that fails every check; the backend is then fixed one check
/// at a time, and each step must report the next check's kind.
#[test]
fn the_first_refusal_wins_in_the_contract_order() {
    let mut isolation = Isolation::Container;
    let mut decl = BackendDeclarations {
        capabilities: BTreeSet::from([Capability::Exec]),
        limits: SandboxLimits::default(),
        egress_modes: BTreeSet::from([Egress::Closed]),
        os_families: BTreeSet::new(),
        isolation_scopes: BTreeSet::from([IsolationScope::Conversation]),
        egress_method_tokens: Some(BTreeSet::new()),
    };

    // The floor check through the spec floor: the host floor is container (so a container backend can be registered),
    // the spec asks for microvm.
    let floor_spec = spec(
        SandboxSpec::builder("k")
            .require(Capability::FilesOut)
            .egress(Egress::Allowlist)
            .allow(get_rule("api.example.com"))
            .requires_os_family(OsFamily::Posix)
            .files_in(big())
            .isolation_scope(IsolationScope::Call)
            .min_isolation(Isolation::Microvm),
    );
    let host = || RouterConfig::default().min_isolation(Isolation::Container);
    let kind_for = |isolation: Isolation, decl: &BackendDeclarations, config: RouterConfig| {
        let r = Router::new(vec![backend("b", isolation, decl.clone())], config).unwrap();
        r.ensure_can_serve(&floor_spec).err().map(|e| e.kind())
    };

    // A spec-level refusal beats every per-backend one.
    assert_eq!(
        kind_for(isolation, &decl, host().deny(Capability::FilesOut)),
        Some(ErrorKind::CapabilityDenied)
    );
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::NotPermitted)
    );
    isolation = Isolation::Microvm;
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::CapabilityNotSupported),
        "B2"
    );
    decl.capabilities = BTreeSet::from([
        Capability::Exec,
        Capability::FilesIn,
        Capability::FilesOut,
        Capability::EgressMethods,
    ]);
    let b3 = Router::new(vec![backend("b", isolation, decl.clone())], host())
        .unwrap()
        .ensure_can_serve(&floor_spec)
        .unwrap_err();
    assert_eq!(b3.kind(), ErrorKind::CapabilityNotSupported, "B3");
    assert!(b3.to_string().contains("egress methods"), "{b3}");
    decl.egress_method_tokens = None;
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::OsFamilyNotSupported),
        "B4"
    );
    decl.os_families.insert(OsFamily::Posix);
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::TransferLimitsNotPermitted),
        "B5"
    );
    decl.limits.files_in = big();
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::EgressNotEnforced),
        "B6"
    );
    decl.egress_modes.insert(Egress::Allowlist);
    assert_eq!(
        kind_for(isolation, &decl, host()),
        Some(ErrorKind::ScopeNotEnforced),
        "B7"
    );
    decl.isolation_scopes.insert(IsolationScope::Call);
    assert_eq!(kind_for(isolation, &decl, host()), None, "all checks pass");
}

fn per_spec(list: Vec<Arc<dyn SandboxBackend>>) -> Router {
    Router::new(
        list,
        RouterConfig::default().selection(BackendSelection::PerSpec),
    )
    .unwrap()
}

#[test]
fn per_spec_picks_the_first_backend_that_admits_the_spec() {
    let mut closed_only = full();
    closed_only.egress_modes = BTreeSet::from([Egress::Closed]);
    let mut open_only = full();
    open_only.egress_modes = BTreeSet::from([Egress::Unrestricted]);
    let mut both = full();
    both.egress_modes = BTreeSet::from([Egress::Closed, Egress::Unrestricted]);
    let r = per_spec(vec![
        backend("closed", Isolation::Microvm, closed_only),
        backend("open", Isolation::Microvm, open_only),
        backend("both", Isolation::Microvm, both),
    ]);
    let closed = spec(SandboxSpec::builder("k"));
    let open = spec(SandboxSpec::builder("k").egress(Egress::Unrestricted));
    assert_eq!(r.backend_for(&closed).unwrap().name(), "closed");
    assert_eq!(r.backend_for(&open).unwrap().name(), "open");
    // A pure function of spec and declarations: asking again gives the same answer.
    for _ in 0..3 {
        assert_eq!(r.backend_for(&open).unwrap().name(), "open");
    }
}

#[test]
fn per_spec_returns_the_first_candidates_refusal_and_names_the_others() {
    let mut no_list = full();
    no_list.capabilities.remove(&Capability::FilesList);
    let mut no_egress = full();
    no_egress.egress_modes.clear();
    let r = per_spec(vec![
        backend("low", Isolation::Container, full()),
        backend("first", Isolation::Microvm, no_list),
        backend("second", Isolation::Vm, no_egress),
    ]);
    let s = spec(SandboxSpec::builder("k").require(Capability::FilesList));
    let err = refusal(&r, &s);
    assert_eq!(err.kind(), ErrorKind::CapabilityNotSupported);
    let msg = err.to_string();
    assert!(
        msg.contains("\"first\" does not declare files_list"),
        "{msg}"
    );
    assert!(msg.contains("\"second\" (egress_not_enforced)"), "{msg}");
    assert!(
        !msg.contains("\"low\""),
        "below-floor backends are not candidates: {msg}"
    );

    // One candidate: its refusal alone.
    let r = per_spec(vec![backend("only", Isolation::Microvm, {
        let mut d = full();
        d.egress_modes.clear();
        d
    })]);
    let msg = refusal(&r, &spec(SandboxSpec::builder("k"))).to_string();
    assert!(!msg.contains("other candidates"), "{msg}");
}

#[tokio::test]
async fn a_runtime_failure_never_falls_back_to_another_backend() {
    let first = Arc::new(FakeBackend::new("first", Isolation::Microvm));
    let second = Arc::new(FakeBackend::new("second", Isolation::Microvm));
    first.update_faults(|f| f.acquire_failure = Some("engine down".into()));
    let r = per_spec(vec![
        Arc::clone(&first) as Arc<dyn SandboxBackend>,
        Arc::clone(&second) as Arc<dyn SandboxBackend>,
    ]);
    let err = r
        .acquire(
            &SandboxKey::conversation("s", "t", "a"),
            &spec(SandboxSpec::builder("k")),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BackendUnavailable);
    assert_eq!(first.acquire_calls(), 1);
    assert_eq!(second.acquire_calls(), 0);
}

#[tokio::test]
async fn acquire_runs_the_same_admission() {
    let r = router(
        backend("vm", Isolation::Microvm, full()),
        RouterConfig::default().deny(Capability::Exec),
    );
    let err = r
        .acquire(
            &SandboxKey::conversation("s", "t", "a"),
            &spec(SandboxSpec::builder("k")),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CapabilityDenied);
}
