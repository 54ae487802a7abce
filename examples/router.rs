//! A router choosing between backends per spec, refusing any backend below the host's floor.
//!
//! The candidates are the in-process fake backend (rung `none`, for tests) and Docker containers
//! (rung `container`). Needs a Docker engine and the default image.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::testing::FakeBackend;
use sandbox_core::{
    BackendSelection, Command, Egress, ErrorKind, ExecRequest, Isolation, Router, RouterConfig,
    SandboxBackend, SandboxKey, SandboxSpec, TransferLimits,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fake: Arc<dyn SandboxBackend> = Arc::new(FakeBackend::new("fake", Isolation::None));
    let docker: Arc<dyn SandboxBackend> =
        Arc::new(DockerBackend::connect(DockerConfig::default()).await?);
    let backends = vec![fake, docker];

    // A test host with no floor: per-spec selection takes the first backend that serves the spec.
    let relaxed = Router::new(
        backends.clone(),
        RouterConfig::default()
            .min_isolation(Isolation::None)
            .selection(BackendSelection::PerSpec),
    )?;
    let small = SandboxSpec::builder("tool").build()?;
    let big_files = SandboxSpec::builder("tool")
        .files_in(TransferLimits {
            max_bytes_per_file: 32 * 1024 * 1024,
            ..TransferLimits::default()
        })
        .build()?;
    println!(
        "small spec  -> {}",
        relaxed
            .backend_for(&small)
            .map(|b| b.name().to_owned())
            .unwrap_or_default()
    );
    println!(
        "32 MiB files -> {}",
        relaxed
            .backend_for(&big_files)
            .map(|b| b.name().to_owned())
            .unwrap_or_default()
    );

    // A production host: the floor is `container`, so the fake is never routed to.
    let host = Router::new(
        backends,
        RouterConfig::default()
            .min_isolation(Isolation::Container)
            .selection(BackendSelection::PerSpec),
    )?;
    let open = SandboxSpec::builder("tool")
        .egress(Egress::Unrestricted)
        .build()?;
    let refusal = host
        .ensure_can_serve(&open)
        .expect_err("no backend enforces unrestricted egress");
    assert_eq!(refusal.kind(), ErrorKind::EgressNotEnforced);
    println!("unrestricted egress refused: {refusal}");

    let key = SandboxKey::conversation(
        "examples",
        format!("router-{}", std::process::id()),
        "agent",
    );
    let sandbox = host.acquire(&key, &small).await?;
    let out = sandbox
        .exec(ExecRequest::new(Command::argv(["uname", "-s"])).timeout(Duration::from_secs(30)))
        .await?;
    println!("served by rung container: {}", out.stdout_text().trim());
    if let Some(failure) = host.dispose(&key).await {
        return Err(format!("disposal did not land: {failure}").into());
    }
    Ok(())
}
