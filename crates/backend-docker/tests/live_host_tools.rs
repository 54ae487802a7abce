//! The HOST_TOOLS suite (docs/conformance.md#the-suites) against the real engine on the Python
//! image (the base image's root and `host-tool`, plus CPython for the program channel's probe);
//! no probe skipped, nothing left behind. A run in an image without the program is refused as
//! unsupported, not mistaken for the command's exit, and a program in an image without CPython
//! is refused before anything runs.

mod support;

use conformance::commands::assert_host_tools_complete;
use host_tools::{Registry, RunBounds};
use sandbox_core::host_tool_run::run_with_host_tools;
use sandbox_core::program_run::{run_program, ProgramRequest};
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{assert_nothing_left, backend, threads_of, unique_scope, BASE, BUSYBOX, PYTHON};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_image_passes_the_host_tools_suite() {
    let backend = backend(false).await;
    let scope = unique_scope("host-tools");
    let spec = SandboxSpec::builder("host-tools")
        .image(PYTHON)
        .build()
        .unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let result = assert_host_tools_complete(&backend, &mut keys, &spec).await;
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
    let (report, wall) = result.unwrap_or_else(|e| panic!("{e}"));
    println!("{report}\nwall time {:.1} s", wall.as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_image_without_the_program_is_refused_as_unsupported() {
    let backend = backend(false).await;
    let scope = unique_scope("host-tools-busybox");
    let key = SandboxKey::conversation(scope.clone(), "busybox", "agent");
    let spec = SandboxSpec::builder("host-tools")
        .image(BUSYBOX)
        .build()
        .unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let request = ExecRequest::new(Command::argv(["true"]));
    let error = run_with_host_tools(
        &*sandbox,
        request,
        &Registry::new().all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
    assert!(error.to_string().contains("host-tool"), "{error}");
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_program_in_an_image_without_cpython_is_refused_before_it_runs() {
    let backend = backend(false).await;
    let scope = unique_scope("program-no-python");
    let key = SandboxKey::conversation(scope.clone(), "base", "agent");
    let spec = SandboxSpec::builder("program").image(BASE).build().unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let error = run_program(
        &*sandbox,
        &ProgramRequest::python("open('/tmp/ran', 'w').write('ran')"),
        &Registry::new().all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
    assert!(error.to_string().contains("python-portable-v1"), "{error}");
    let ran = sandbox
        .exec(ExecRequest::new(Command::argv([
            "sh",
            "-c",
            "test -e /tmp/ran; echo $?",
        ])))
        .await
        .unwrap();
    assert_eq!(ran.stdout_text(), "1\n", "nothing of the program ran");
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}
