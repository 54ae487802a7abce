//! A helper process for the live SNAPSHOT suite's crash probe: it builds its own backend over
//! the same image and state directory and forks one sandbox into another, so the test can kill
//! it (`SIGKILL`, no cleanup of its own runs) while the fork is under way.
//!
//! Usage: `qemu-fork-child <image-dir> <state-dir> <scope> <source-thread> <target-thread> <agent> <kind>`.
//! Prints `forked <instance>` when the fork finished.

use std::path::PathBuf;

use backend_qemu::QemuBackend;
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};

// Only the configuration is used here.
#[allow(dead_code)]
#[path = "setup.rs"]
mod setup;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, state, scope, source, target, agent, kind] = args.as_slice() else {
        eprintln!(
            "usage: qemu-fork-child <image-dir> <state-dir> <scope> <source-thread> <target-thread> <agent> <kind>"
        );
        std::process::exit(2);
    };
    // The live tests' own configuration, over the image the test names.
    let mut config = setup::config(std::path::Path::new(state));
    config.image_dir = PathBuf::from(image);
    let backend = QemuBackend::connect(config).await.expect("connect");
    let spec = SandboxSpec::builder(kind.as_str()).build().expect("spec");
    let source = SandboxKey::conversation(scope.as_str(), source.as_str(), agent.as_str());
    let target = SandboxKey::conversation(scope.as_str(), target.as_str(), agent.as_str());
    let fork = backend.fork(&source, &spec, &target).await.expect("fork");
    println!("forked {}", fork.instance_id());
}
