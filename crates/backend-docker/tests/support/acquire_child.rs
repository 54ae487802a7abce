//! A helper process for the live suite's `concurrent-acquires-yield-one` probe: it builds its own
//! backend from the same configuration and runs N concurrent acquires of one (key, spec), so the
//! engine-level name conflict (and the adopt loop) runs, not only the in-process lock. Each
//! acquire retries `Busy` as the probe's own do.
//!
//! Usage: `docker-acquire-child <context> <scope> <thread> <agent> <call> <kind> <image> <work-dir|-> <n>`.
//! Prints one line per acquire in the conformance crate's protocol (`conformance::child_process::child_acquire_line`).

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{SandboxKey, SandboxSpec};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [context, scope, thread, agent, call, kind, image, work_dir, n] = args.as_slice() else {
        eprintln!("usage: docker-acquire-child <context> <scope> <thread> <agent> <call> <kind> <image> <work-dir|-> <n>");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("n is a number");
    let mut config = DockerConfig::default();
    config.context = Some(context.clone());
    // The parent's runtime, so both make and serve the same containers.
    config.runtime = std::env::var("SANDBOX_E2E_DOCKER_RUNTIME")
        .ok()
        .filter(|runtime| !runtime.is_empty());
    let backend = DockerBackend::connect(config).await.expect("connect");
    let key = SandboxKey::conversation(scope.as_str(), thread.as_str(), agent.as_str())
        .with_call(call.as_str());
    let work_dir = (work_dir != "-").then(|| work_dir.clone());
    let spec = SandboxSpec::builder(kind.as_str())
        .image(image.as_str())
        .work_dir(work_dir)
        .build()
        .expect("spec");
    conformance::child_process::print_concurrent_acquires(&backend, &key, &spec, n).await;
}
