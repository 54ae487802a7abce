//! A helper process for the live SNAPSHOT suite's `a-crash-mid-fork-leaves-nothing-missed`: it
//! builds its own backend and forks one sandbox into another key, so the test can kill it with
//! `SIGKILL` while the fork is under way (no cleanup of this process can run then).
//!
//! Usage: `docker-fork-child <context> <scope> <source thread> <target thread> <agent> <kind> <image>`.
//! Prints `forked <instance id>` when the fork finished.

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [context, scope, source, target, agent, kind, image] = args.as_slice() else {
        eprintln!("usage: docker-fork-child <context> <scope> <source thread> <target thread> <agent> <kind> <image>");
        std::process::exit(2);
    };
    let mut config = DockerConfig::default();
    config.context = Some(context.clone());
    let backend = DockerBackend::connect(config).await.expect("connect");
    let source = SandboxKey::conversation(scope.as_str(), source.as_str(), agent.as_str());
    let target = SandboxKey::conversation(scope.as_str(), target.as_str(), agent.as_str());
    let spec = SandboxSpec::builder(kind.as_str())
        .image(image.as_str())
        .build()
        .expect("spec");
    match backend.fork(&source, &spec, &target).await {
        Ok(fork) => println!("forked {}", fork.instance_id()),
        Err(error) => {
            eprintln!("fork failed: {error}");
            std::process::exit(1);
        }
    }
}
