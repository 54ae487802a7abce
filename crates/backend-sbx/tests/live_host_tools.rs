//! The HOST_TOOLS suite (docs/conformance.md#the-suites) against `sbx-sim`, whose default
//! template's image carries `host-tool`: the relay and the command are two streamed execs
//! through the `sbx` CLI. No probe skipped, nothing left behind.

mod support;

use conformance::commands::assert_host_tools_complete;
use sandbox_core::{SandboxKey, SandboxSpec};
use support::{dispose_all, unique_scope, SimHost};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_simulator_passes_the_host_tools_suite() {
    let host = SimHost::new();
    let backend = host.backend().await;
    let scope = unique_scope("host-tools");
    let spec = SandboxSpec::builder("host-tools").build().unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let result = assert_host_tools_complete(&backend, &mut keys, &spec).await;
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
    let (report, wall) = result.unwrap_or_else(|e| panic!("{e}"));
    println!("sbx-sim: {report}\nwall time {:.1} s", wall.as_secs_f64());
}
