//! The HOST_TOOLS suite (docs/conformance.md#the-suites) against real QEMU on the image of
//! `cargo xtask images vm`, whose root carries `host-tool`: the relay and the command are two
//! execs of the guest agent, each in a cgroup of its own, so the end of the command's exec
//! leaves the relay to the run's drain, and a relay killed from the guest ends its own exec. No
//! probe skipped, nothing left behind (no QEMU, VM directory or record).

mod support;

use conformance::commands::assert_host_tools_complete;
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, connect, run_parent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vm_image_passes_the_host_tools_suite() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    let scope = format!("host-tools-{}", std::process::id());
    let spec = SandboxSpec::builder("host-tools").build().unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let result = assert_host_tools_complete(&backend, &mut keys, &spec).await;
    // The suite disposes of its sandbox; one a failed run left goes here, before the check.
    let purge = backend.dispose_scope(&scope, "agent").await;
    assert!(purge.undisposed.is_none(), "disposal: {purge:?}");
    drop(backend);
    assert_nothing_left(&state_dir);
    let (report, wall) = result.unwrap_or_else(|e| panic!("{e}"));
    println!("qemu: {report}\nwall time {:.1} s", wall.as_secs_f64());
}
