//! A helper process for the POOL suite's cross-process probe: it builds its own backend with a
//! warm pool of the given size and acquires each of its keys at once, so claims from several
//! processes race on the engine, not only in one process. Before it exits it waits until its own
//! refill is idle, so it leaves no member half made.
//!
//! Usage: `docker-pool-child <context> <pool size> <scope> <agent> <kind> <image> <thread>...`.
//! Prints one line per key, in order, in the conformance crate's protocol
//! (`conformance::child_process::child_acquire_line`).

use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{SandboxKey, SandboxSpec};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [context, size, scope, agent, kind, image, threads @ ..] = args.as_slice() else {
        eprintln!("usage: docker-pool-child <context> <pool size> <scope> <agent> <kind> <image> <thread>...");
        std::process::exit(2);
    };
    let mut config = DockerConfig::default();
    config.context = Some(context.clone());
    config.pool = size.parse().expect("the pool size is a number");
    // The parent's runtime, so both fill and claim the same shape.
    config.runtime = std::env::var("SANDBOX_E2E_DOCKER_RUNTIME")
        .ok()
        .filter(|runtime| !runtime.is_empty());
    let backend = DockerBackend::connect(config).await.expect("connect");
    let spec = SandboxSpec::builder(kind.as_str())
        .image(image.as_str())
        .build()
        .expect("spec");
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
    if let Err(error) = backend.fill_pool(&spec, Duration::from_secs(180)).await {
        eprintln!("the pool did not settle: {error}");
    }
}
