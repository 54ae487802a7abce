//! The HOST_TOOLS suite (docs/conformance.md#the-suites) against the real engine on the base
//! image, which carries `host-tool`; no probe skipped, nothing left behind. And a run in an
//! image without the program is refused as unsupported, not mistaken for the command's exit.

mod support;

use conformance::commands::assert_host_tools_complete;
use host_tools::{Registry, RunBounds};
use sandbox_core::host_tool_run::run_with_host_tools;
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{assert_nothing_left, backend, threads_of, unique_scope, BASE, BUSYBOX};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_base_image_passes_the_host_tools_suite() {
    let backend = backend(false).await;
    let scope = unique_scope("host-tools");
    let spec = SandboxSpec::builder("host-tools")
        .image(BASE)
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
