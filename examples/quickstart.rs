//! Quickstart: acquire a Docker sandbox for a key, run a command, move a file in and out, dispose.
//!
//! Needs a Docker engine and the default image (`cargo xtask images sandbox-base:local`).
#![forbid(unsafe_code)]

use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{
    Command, DisposeSelector, ExecEnv, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = DockerBackend::connect(DockerConfig::default()).await?;
    let key = SandboxKey::conversation(
        "examples",
        format!("quickstart-{}", std::process::id()),
        "agent",
    );
    let spec = SandboxSpec::builder("python").build()?;

    let sandbox = backend.acquire(&key, &spec).await?;
    sandbox
        .write_file("notes/hello.txt", b"hello from the host\n", ".")
        .await?;

    let request = ExecRequest::new(Command::argv([
        "sh",
        "-c",
        "cat notes/hello.txt; echo \"$GREETING\"; exit 3",
    ]))
    .timeout(Duration::from_secs(30))
    .env(ExecEnv::default().set("GREETING", "and from the guest"));
    let output = sandbox.exec(request).await?;
    print!("{}", output.stdout_text());
    assert_eq!(output.exit_code, 3, "the command's own status, verbatim");

    let copied = sandbox.read_file("notes/hello.txt", ".", 1024).await?;
    assert_eq!(copied, b"hello from the host\n");

    let expired = sandbox
        .exec(ExecRequest::new(Command::argv(["sleep", "30"])).timeout(Duration::from_secs(1)))
        .await
        .expect_err("the bound expires");
    println!("timeout: {expired} (guest: {:?})", expired.guest_cleanup());

    if let Some(failure) = backend.dispose(&key, DisposeSelector::all()).await {
        return Err(format!("disposal did not land: {failure}").into());
    }
    println!("disposed of {}", sandbox.instance_id());
    Ok(())
}
