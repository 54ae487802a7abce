//! A helper process for the live suite's `concurrent-acquires-yield-one` probe: it builds its own
//! backend from the same configuration and runs N concurrent acquires of one (key, spec), each
//! retrying `Busy`, so the simulator-level create race (and the adopt path) runs, not only the
//! in-process lock.
//!
//! Usage: `sbx-acquire-child <sbx path> <workspace root> <scope> <thread> <agent> <call> <kind>
//! <image|-> <work-dir|-> <n>`; `SBX_SIM_HOME` comes from the environment. Prints one line per
//! acquire in the conformance crate's protocol (`conformance::child_process::child_acquire_line`).
#![forbid(unsafe_code)]

use backend_sbx::{SbxBackend, SbxConfig};
use sandbox_core::{SandboxKey, SandboxSpec};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [sbx, root, scope, thread, agent, call, kind, image, work_dir, n] = args.as_slice() else {
        eprintln!("usage: sbx-acquire-child <sbx> <root> <scope> <thread> <agent> <call> <kind> <image|-> <work-dir|-> <n>");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("n is a number");
    let mut config = SbxConfig::default();
    config.sbx_path = sbx.into();
    config.workspace_root = Some(root.into());
    config.simulator_ok = true;
    let backend = SbxBackend::connect(config).await.expect("connect");
    let key = SandboxKey::conversation(scope.as_str(), thread.as_str(), agent.as_str())
        .with_call(call.as_str());
    let mut builder =
        SandboxSpec::builder(kind.as_str()).work_dir((work_dir != "-").then(|| work_dir.clone()));
    if image != "-" {
        builder = builder.image(image.as_str());
    }
    let spec = builder.build().expect("spec");
    conformance::child_process::print_concurrent_acquires(&backend, &key, &spec, n).await;
}
