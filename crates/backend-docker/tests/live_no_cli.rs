//! The backend needs no `docker` program: with `PATH` emptied for this whole test process, a
//! full cycle (connect, acquire, exec, every file method, dispose) runs against the real engine.
//! Any attempt to spawn the CLI would fail to find it and surface as an error here.

use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{
    Command, DisposeSelector, EntryKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_full_cycle_spawns_no_docker_process() {
    // This binary holds only this test, so no other thread reads the environment meanwhile.
    std::env::set_var("PATH", "");
    assert!(
        std::process::Command::new("docker")
            .arg("--version")
            .output()
            .is_err(),
        "with PATH emptied the docker CLI cannot be found"
    );
    let backend = DockerBackend::connect(DockerConfig::default())
        .await
        .expect("connects without the CLI");
    let scope = format!("bd-live-nocli-{}", std::process::id());
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let spec = SandboxSpec::builder("live")
        .image("sandbox-busybox:local")
        .build()
        .unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquires");
    let output = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "echo out; echo err >&2; exit 7",
            ]))
            .timeout(Duration::from_secs(30)),
        )
        .await
        .expect("execs");
    assert_eq!(
        (
            output.stdout.as_slice(),
            output.stderr.as_slice(),
            output.exit_code
        ),
        (&b"out\n"[..], &b"err\n"[..], 7)
    );
    sandbox
        .write_file("a/b/c.txt", b"bytes", ".")
        .await
        .expect("writes");
    assert_eq!(
        sandbox
            .read_file("a/b/c.txt", ".", 1024)
            .await
            .expect("reads"),
        b"bytes"
    );
    let stat = sandbox.stat_file("a/b/c.txt", ".").await.unwrap().unwrap();
    assert_eq!((stat.kind(), stat.size_bytes()), (EntryKind::File, Some(5)));
    let listed = sandbox.list_dir("a/b", ".").await.expect("lists");
    assert_eq!(listed.len(), 1, "{listed:?}");
    sandbox.remove("a", ".", true).await.expect("removes");
    assert!(sandbox.stat_file("a", ".").await.unwrap().is_none());
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    assert!(backend.list(&scope, None).await.unwrap().is_empty());
}
