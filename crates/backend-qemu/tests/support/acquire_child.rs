//! A helper process for the live suite's `concurrent-acquires-yield-one` probe: it builds its own
//! backend over the same image and state directory and runs N concurrent acquires of one
//! (key, spec), so the cross-process path (the name's file lock, a VM another process booted)
//! runs, not only the in-process lock. Each acquire retries `Busy` as the probe's own do.
//!
//! Usage: `qemu-acquire-child <image-dir> <state-dir> <scope> <thread> <agent> <call> <kind> <work-dir|-> <n>`.
//! Prints one line per acquire in the conformance crate's protocol (`conformance::child_process::child_acquire_line`).

use std::path::PathBuf;

use backend_qemu::QemuBackend;
use sandbox_core::{SandboxKey, SandboxSpec};

// Only the configuration is used here.
#[allow(dead_code)]
#[path = "setup.rs"]
mod setup;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, state, scope, thread, agent, call, kind, work_dir, n] = args.as_slice() else {
        eprintln!(
            "usage: qemu-acquire-child <image-dir> <state-dir> <scope> <thread> <agent> <call> <kind> <work-dir|-> <n>"
        );
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("n is a number");
    // The live tests' own configuration, over the image the test names.
    let mut config = setup::config(std::path::Path::new(state));
    config.image_dir = PathBuf::from(image);
    let backend = QemuBackend::connect(config).await.expect("connect");
    let key = SandboxKey::conversation(scope.as_str(), thread.as_str(), agent.as_str())
        .with_call(call.as_str());
    let work_dir = (work_dir != "-").then(|| work_dir.clone());
    let spec = SandboxSpec::builder(kind.as_str())
        .work_dir(work_dir)
        .build()
        .expect("spec");
    conformance::child_process::print_concurrent_acquires(&backend, &key, &spec, n).await;
}
