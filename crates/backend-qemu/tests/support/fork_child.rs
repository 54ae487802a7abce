//! A helper process for the live SNAPSHOT suite's crash probe: it builds its own backend over
//! the same image and state directory and forks one sandbox into another, so the test can kill
//! it (`SIGKILL`, no cleanup of its own runs) while the fork is under way.
//!
//! Usage: `qemu-fork-child <image-dir> <state-dir> <scope> <source-thread> <target-thread> <agent> <kind>`.
//! Prints `forked <instance>` when the fork finished.

use std::path::PathBuf;
use std::time::Duration;

use backend_qemu::{QemuBackend, QemuConfig};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, state, scope, source, target, agent, kind] = args.as_slice() else {
        eprintln!(
            "usage: qemu-fork-child <image-dir> <state-dir> <scope> <source-thread> <target-thread> <agent> <kind>"
        );
        std::process::exit(2);
    };
    // As the live tests' own configuration (tests/support/setup.rs).
    let mut config = QemuConfig::default();
    config.image_dir = PathBuf::from(image);
    config.state_dir = PathBuf::from(state);
    config.allow_emulation = true;
    config.cpus = 1;
    config.memory_mib = 384;
    config.boot_timeout = Duration::from_secs(180);
    config.call_timeout = Duration::from_secs(60);
    let backend = QemuBackend::connect(config).await.expect("connect");
    let spec = SandboxSpec::builder(kind.as_str()).build().expect("spec");
    let source = SandboxKey::conversation(scope.as_str(), source.as_str(), agent.as_str());
    let target = SandboxKey::conversation(scope.as_str(), target.as_str(), agent.as_str());
    let fork = backend.fork(&source, &spec, &target).await.expect("fork");
    println!("forked {}", fork.instance_id());
}
