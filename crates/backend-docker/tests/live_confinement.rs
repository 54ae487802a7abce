//! CONFINEMENT against the real engine on its own (docs/conformance.md#confinement): a clean call
//! passes and each kind of residue is caught. A test binary of its own, so a suite that cannot
//! observe a sandbox's root (the gVisor suite) leaves it out whole.

mod support;

use conformance::ConformanceReport;
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, backend, threads_of, unique_scope, DockerHooks, BASE};

/// No probe failed or was skipped, and exactly `expected` ran.
fn assert_passed(report: &ConformanceReport, expected: usize) {
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
}

/// CONFINEMENT can fail on the real engine: on sandboxes of one scope, the standard call passes,
/// and a call that leaves a file on the `/dev/shm` tmpfs, a file in the image's file system outside
/// its paths, a changed content of a file that existed before it (same size), or a running program
/// is judged to leave exactly that behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confinement_passes_a_clean_call_and_fails_each_residue() {
    use conformance::isolation::assert_confinement;
    use conformance::PosixGuestSubject;
    use sandbox_core::{Command, ExecRequest};
    let backend = backend(false).await;
    let scope = unique_scope("confine");
    let hooks = DockerHooks {
        context: backend.context().to_owned(),
    };
    let spec = SandboxSpec::builder("confinement")
        .image(BASE)
        .build()
        .unwrap();
    let subject = |name: &'static str| {
        let (backend, scope, spec) = (&backend, &scope, &spec);
        async move {
            let key = SandboxKey::conversation(scope.clone(), name, "agent");
            let sandbox = backend.acquire(&key, spec).await.expect("acquire");
            PosixGuestSubject::in_storage_base(sandbox, backend.declarations().capabilities.clone())
                .expect("subject")
                .with_exec_cleanup_allowance(backend.config().exec_cleanup_timeout)
        }
    };

    let clean = subject("clean").await;
    let report = assert_confinement(&clean, &hooks)
        .await
        .unwrap_or_else(|e| panic!("the standard call leaves nothing behind: {e}"));
    assert_passed(&report, conformance::suites::CONFINEMENT_PROBES);

    let cases: [(&str, &str, &str); 4] = [
        (
            "shm",
            "printf leak >/dev/shm/confinement-leak",
            "new path /dev/shm/confinement-leak",
        ),
        (
            "tmp",
            "printf leak >/tmp/confinement-leak",
            "new path /tmp/confinement-leak",
        ),
        (
            "content",
            "printf b >/tmp/confinement-same",
            "changed path /tmp/confinement-same",
        ),
        (
            "process",
            "setsid sleep 3191 </dev/null >/dev/null 2>&1 &",
            "sleep 3191",
        ),
    ];
    for (name, script, residue) in cases {
        let leaky = subject(name).await;
        let before = ExecRequest::new(Command::argv([
            "sh",
            "-c",
            "printf a >/tmp/confinement-same",
        ]));
        assert_eq!(leaky.sandbox.exec(before).await.unwrap().exit_code, 0);
        conformance::isolation::expect_residue_caught(&leaky, &hooks, script, residue)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}
