//! Snapshots of what people read: the Display of every error variant, and the router's refusals.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    BackendDeclarations, BackendSelection, Capability, DisposalCode, DisposalFailure, Egress,
    ErrorKind, GuestCleanup, Isolation, IsolationScope, OsFamily, Router, RouterConfig,
    SandboxBackend, SandboxError, SandboxKey, SandboxSpec, TransferLimits,
};

fn every_variant() -> Vec<SandboxError> {
    let timeout = |cleanup| SandboxError::Timeout {
        operation: "command".into(),
        bound: Duration::from_millis(2500),
        cleanup,
    };
    vec![
        SandboxError::confinement("../etc/passwd", "resolves outside the working directory"),
        SandboxError::invalid("exec timeout must be greater than zero"),
        SandboxError::SpecMismatch("dispose it before changing the image".into()),
        SandboxError::NotADirectory {
            path: "notes.txt/x".into(),
        },
        SandboxError::IsADirectory { path: "src".into() },
        SandboxError::NotFound {
            path: "missing.txt".into(),
        },
        SandboxError::NotRegularFile {
            path: "link".into(),
        },
        SandboxError::GuestRefused {
            path: "owned-by-root".into(),
            detail: "the guest could not remove it".into(),
        },
        SandboxError::Io {
            operation: "write",
            path: "out.bin".into(),
            source: std::io::Error::other("no space left on device"),
        },
        SandboxError::TransferCapExceeded {
            path: "big.bin".into(),
            limit: 8_388_608,
        },
        SandboxError::OutputLimitExceeded { limit: 8_388_608 },
        timeout(None),
        timeout(Some(GuestCleanup::Killed)),
        timeout(Some(GuestCleanup::NeverStarted)),
        timeout(Some(GuestCleanup::Retired)),
        SandboxError::Timeout {
            operation: "reclaim".into(),
            bound: Duration::from_secs(30),
            cleanup: None,
        },
        SandboxError::EngineTimeout {
            operation: "sbx ls".into(),
            bound: Duration::from_secs(60),
        },
        SandboxError::BackendUnavailable {
            backend: "docker".into(),
            detail: "the daemon did not answer".into(),
            source: None,
        },
        SandboxError::engine("docker create exited 125"),
        SandboxError::LoginRequired("run `sbx login`".into()),
        SandboxError::DaemonFault("the sbx daemon restarted".into()),
        SandboxError::HostNotConfined("agent forwarding is on".into()),
        SandboxError::Retired {
            instance: "maf-sandbox-docker-aef172d1c789".into(),
            reason: "a timed-out command could not be killed".into(),
        },
        SandboxError::WorkspaceMismatch("another workspace is bound".into()),
        SandboxError::Busy("another process is creating this sandbox".into()),
        SandboxError::SandboxGone {
            instance: "maf-f8fb3a606cf7-ee5188b3f1-80db6ea4".into(),
        },
        SandboxError::ImageMissing {
            image: "maf-sandbox/base:1".into(),
            hint: "run `sandboxctl images build`".into(),
        },
        SandboxError::NoBackend("no backend is registered".into()),
        SandboxError::NotPermitted("backend \"docker\" provides container isolation".into()),
        SandboxError::CapabilityNotSupported("backend \"x\" does not declare files_list".into()),
        SandboxError::OsFamilyNotSupported("backend \"x\" does not serve windows".into()),
        SandboxError::CapabilityDenied("the host denies files_delete".into()),
        SandboxError::EgressNotEnforced("backend \"x\" does not enforce egress allowlist".into()),
        SandboxError::ScopeNotEnforced("backend \"x\" does not serve call-scoped sandboxes".into()),
        SandboxError::TransferLimitsNotPermitted("files_in exceeds the ceiling".into()),
        SandboxError::Unclean {
            code: Some(DisposalCode::Timeout),
        },
        SandboxError::Unclean { code: None },
        SandboxError::Unsupported("this backend does not declare files_list".into()),
        SandboxError::ContractViolation("backend \"x\" returned an empty instance id".into()),
    ]
}

#[test]
fn every_error_variant_displays_for_people() {
    let errors = every_variant();
    let kinds: BTreeSet<String> = errors.iter().map(|e| format!("{:?}", e.kind())).collect();
    assert_eq!(kinds.len(), 34, "one of each kind: {kinds:?}");
    let lines: Vec<String> = errors
        .iter()
        .map(|e| format!("{:?}: {e}", e.kind()))
        .collect();
    insta::assert_snapshot!("every_error_variant", lines.join("\n"));
}

#[test]
fn families_of_the_snapshotted_errors() {
    let errors = every_variant();
    let io: Vec<ErrorKind> = errors
        .iter()
        .filter(|e| e.is_io())
        .map(|e| e.kind())
        .collect();
    assert_eq!(io.len(), 6, "{io:?}");
    assert!(errors
        .iter()
        .filter(|e| e.kind() == ErrorKind::Timeout)
        .all(|e| !e.is_io() && !e.is_engine() && !e.is_admission_refusal()));
    assert_eq!(
        errors.iter().filter(|e| e.is_admission_refusal()).count(),
        7
    );
    assert_eq!(errors.iter().filter(|e| e.is_engine()).count(), 10);
}

fn fake(name: &str, isolation: Isolation, decl: BackendDeclarations) -> Arc<dyn SandboxBackend> {
    Arc::new(FakeBackend::new(name, isolation).with_declarations(decl))
}

fn default_fake(name: &str, isolation: Isolation) -> Arc<dyn SandboxBackend> {
    fake(name, isolation, FakeBackend::default_declarations())
}

fn message(result: Result<impl std::fmt::Debug, SandboxError>) -> String {
    let err = result.expect_err("refused");
    format!("{:?}: {err}", err.kind())
}

#[tokio::test]
async fn router_refusals_read_well() {
    let mut lines = Vec::new();
    let mut push = |label: &str, text: String| lines.push(format!("{label}\n  {text}"));

    // Construction.
    push(
        "per_spec with selected",
        message(Router::new(
            vec![default_fake("docker", Isolation::Container)],
            RouterConfig::default()
                .selection(BackendSelection::PerSpec)
                .selected("docker"),
        )),
    );
    push(
        "zero cleanup timeout",
        message(Router::new(
            vec![default_fake("docker-sbx", Isolation::Microvm)],
            RouterConfig::default().cleanup_timeout(Duration::ZERO),
        )),
    );
    push(
        "unknown selected backend",
        message(Router::new(
            vec![
                default_fake("docker", Isolation::Container),
                default_fake("docker-sbx", Isolation::Microvm),
            ],
            RouterConfig::default().selected("kata"),
        )),
    );
    push(
        "fixed backend below the floor",
        message(Router::new(
            vec![default_fake("docker", Isolation::Container)],
            RouterConfig::default(),
        )),
    );
    push(
        "per_spec with nothing above the floor",
        message(Router::new(
            vec![
                default_fake("docker", Isolation::Container),
                default_fake("local", Isolation::None),
            ],
            RouterConfig::default().selection(BackendSelection::PerSpec),
        )),
    );

    // Admission, one check at a time on one backend.
    let host = RouterConfig::default()
        .min_isolation(Isolation::Container)
        .deny(Capability::FilesDelete);
    let docker = Router::new(
        vec![default_fake("docker", Isolation::Container)],
        host.clone(),
    )
    .unwrap();
    let cases: Vec<(&str, SandboxSpec)> = vec![
        (
            "A2 denied capability",
            SandboxSpec::builder("k")
                .require(Capability::FilesDelete)
                .build()
                .unwrap(),
        ),
        (
            "B1 spec floor",
            SandboxSpec::builder("k")
                .min_isolation(Isolation::Microvm)
                .build()
                .unwrap(),
        ),
        (
            "B4 OS family",
            SandboxSpec::builder("k")
                .requires_os_family(OsFamily::Windows)
                .build()
                .unwrap(),
        ),
        (
            "B5 transfer limits",
            SandboxSpec::builder("k")
                .files_in(TransferLimits {
                    max_files: 1000,
                    ..TransferLimits::default()
                })
                .build()
                .unwrap(),
        ),
        (
            "B6 egress",
            SandboxSpec::builder("k")
                .egress(Egress::Allowlist)
                .allow("pypi.org")
                .build()
                .unwrap(),
        ),
    ];
    for (label, spec) in cases {
        push(label, message(docker.ensure_can_serve(&spec)));
    }
    let silent = Router::new(
        vec![fake(
            "silent",
            Isolation::Microvm,
            BackendDeclarations {
                egress_modes: BTreeSet::from([Egress::Closed]),
                ..BackendDeclarations::default()
            },
        )],
        RouterConfig::default(),
    )
    .unwrap();
    push(
        "B2 capabilities",
        message(
            silent.ensure_can_serve(
                &SandboxSpec::builder("k")
                    .require(Capability::FilesOut)
                    .build()
                    .unwrap(),
            ),
        ),
    );
    push(
        "B7 scope",
        message(
            silent.ensure_can_serve(
                &SandboxSpec::builder("k")
                    .isolation_scope(IsolationScope::Call)
                    .build()
                    .unwrap(),
            ),
        ),
    );

    // Per-spec composite.
    let mut no_list = FakeBackend::default_declarations();
    no_list.capabilities.remove(&Capability::FilesList);
    let mut open_only = FakeBackend::default_declarations();
    open_only.egress_modes = BTreeSet::from([Egress::Unrestricted]);
    let mut conversation_only = FakeBackend::default_declarations();
    conversation_only.isolation_scopes = BTreeSet::from([IsolationScope::Conversation]);
    let per_spec = Router::new(
        vec![
            default_fake("low", Isolation::Container),
            fake("docker-sbx", Isolation::Microvm, no_list),
            fake("open", Isolation::Microvm, open_only),
            fake("kata", Isolation::Vm, conversation_only),
        ],
        RouterConfig::default().selection(BackendSelection::PerSpec),
    )
    .unwrap();
    push(
        "per_spec composite",
        message(
            per_spec.ensure_can_serve(
                &SandboxSpec::builder("k")
                    .require(Capability::FilesList)
                    .isolation_scope(IsolationScope::Call)
                    .build()
                    .unwrap(),
            ),
        ),
    );

    // Acquire.
    let empty = Router::new(Vec::new(), RouterConfig::default()).unwrap();
    let key = SandboxKey::conversation("prod", "thread-1", "agent");
    let spec = SandboxSpec::builder("python").build().unwrap();
    push("no candidate", message(empty.acquire(&key, &spec).await));
    let vm = Arc::new(FakeBackend::new("docker-sbx", Isolation::Microvm));
    let router = Router::new(
        vec![Arc::clone(&vm) as Arc<dyn SandboxBackend>],
        RouterConfig::default(),
    )
    .unwrap();
    push(
        "conversation scope with a call key",
        message(
            router
                .acquire(&key.clone().with_call("call-7"), &spec)
                .await,
        ),
    );
    push(
        "call scope without a call id",
        message(
            router
                .acquire(
                    &key,
                    &SandboxSpec::builder("python")
                        .isolation_scope(IsolationScope::Call)
                        .build()
                        .unwrap(),
                )
                .await,
        ),
    );
    push(
        "dispose_call with a conversation key",
        message(router.dispose_call(&key, Duration::from_secs(1)).await),
    );
    push(
        "dispose_unclean with a call key",
        message(
            router
                .dispose_unclean(
                    &key.clone().with_call("c"),
                    None,
                    None,
                    Duration::from_secs(1),
                )
                .await,
        ),
    );
    vm.update_faults(|f| f.empty_instance_ids = true);
    push(
        "empty instance id",
        message(router.acquire(&key, &spec).await),
    );
    router.mark_unclean(
        &key,
        DisposalFailure::new(DisposalCode::Unreachable, "engine down"),
        None,
    );
    push("unclean key", message(router.acquire(&key, &spec).await));

    insta::assert_snapshot!("router_refusals", lines.join("\n"));
}

#[tokio::test(start_paused = true)]
async fn disposal_reports_read_well() {
    let a = Arc::new(FakeBackend::new("docker", Isolation::Microvm));
    let b = Arc::new(FakeBackend::new("docker-sbx", Isolation::Microvm));
    let router = Router::new(
        vec![
            Arc::clone(&a) as Arc<dyn SandboxBackend>,
            Arc::clone(&b) as Arc<dyn SandboxBackend>,
        ],
        RouterConfig::default(),
    )
    .unwrap();
    let key = SandboxKey::conversation("prod", "thread-1", "agent");
    a.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    b.update_faults(|f| f.dispose_hang = true);
    let folded = router.dispose(&key).await.expect("both failed");
    let purge = router.dispose_scope("prod", "thread-1").await;
    let lines = [
        format!("dispose: {folded}"),
        format!(
            "dispose_scope: disposed {}, {}",
            purge.disposed,
            purge.undisposed.expect("both failed")
        ),
    ];
    insta::assert_snapshot!("disposal_reports", lines.join("\n"));
}
