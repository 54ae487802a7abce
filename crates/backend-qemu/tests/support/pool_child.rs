//! A helper process for the POOL suite's cross-process probe: it builds its own backend with a
//! warm pool of the given size over the same image and state directory, and acquires each of its
//! keys at once, so claims from several processes race on the pool's entries, not only in one
//! process. Before it exits it fills the pool (waiting for its own refill under way), so it
//! leaves no member half made.
//!
//! Usage: `qemu-pool-child <image-dir> <state-dir> <pool size> <scope> <agent> <kind> <thread>...`.
//! Prints one line per key, in order, in the conformance crate's protocol
//! (`conformance::child_process::child_acquire_line`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use backend_qemu::QemuBackend;
use sandbox_core::{SandboxKey, SandboxSpec};

// Only the configuration is used here.
#[allow(dead_code)]
#[path = "setup.rs"]
mod setup;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, state, size, scope, agent, kind, threads @ ..] = args.as_slice() else {
        eprintln!(
            "usage: qemu-pool-child <image-dir> <state-dir> <pool size> <scope> <agent> <kind> <thread>..."
        );
        std::process::exit(2);
    };
    let mut config = setup::config(Path::new(state));
    config.image_dir = PathBuf::from(image);
    config.pool = size.parse().expect("the pool size is a number");
    // One restore at a time per process: four processes already restore four VMs at once.
    config.max_booting = 1;
    let backend = QemuBackend::connect(config).await.expect("connect");
    let spec = SandboxSpec::builder(kind.as_str()).build().expect("spec");
    let acquires: Vec<_> = threads
        .iter()
        .map(|thread| {
            let key = SandboxKey::conversation(scope.as_str(), thread.as_str(), agent.as_str());
            let (backend, spec) = (backend.clone(), spec.clone());
            tokio::spawn(async move {
                conformance::isolation::acquire_retrying_busy(&backend, &key, &spec).await
            })
        })
        .collect();
    for acquire in acquires {
        let result = acquire.await.expect("acquire task");
        println!(
            "{}",
            conformance::child_process::child_acquire_line(&result)
        );
    }
    if let Err(error) = backend.fill_pool(Duration::from_secs(300)).await {
        eprintln!("the pool did not settle: {error}");
    }
}
