//! The SNAPSHOT suite (docs/conformance.md#the-suites) against the real engine: `reset` and `fork`
//! on the base image, a crash mid-fork made by killing a helper process that forks, no probe
//! skipped, nothing left behind; and the refusals of what a fork does not make.

mod support;

use std::time::Duration;

use async_trait::async_trait;
use conformance::sandboxes::{assert_snapshot, SnapshotHooks};
use conformance::suites::SNAPSHOT_PROBES;
use conformance::ConformanceError;
use sandbox_core::{Capability, ErrorKind, SandboxBackend, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, backend, docker, threads_of, unique_scope, BASE};

/// The Docker side of the suite: a fork copies files, never processes; the crash is a
/// `docker-fork-child` killed while its fork's container is still under its marked name.
struct DockerSnapshotHooks {
    context: String,
}

/// The names of the containers a fork into `target` is still filling.
async fn forming(target: &SandboxKey, spec: &SandboxSpec) -> Vec<String> {
    let name = backend_docker::DockerBackend::container_name(target, spec.kind());
    let listed = docker([
        "ps",
        "-a",
        "--format",
        "{{.Names}}",
        "--filter",
        &format!("name=^/{name}-forming-"),
    ])
    .await;
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

#[async_trait]
impl SnapshotHooks for DockerSnapshotHooks {
    fn fork_copies_processes(&self) -> bool {
        false
    }

    async fn crash_mid_fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<(), ConformanceError> {
        let harness = |detail: String| ConformanceError::harness("SNAPSHOT", detail);
        let image = spec.image().unwrap_or(BASE);
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_docker-fork-child"))
            .args([
                self.context.as_str(),
                &source.scope,
                &source.thread_id,
                &target.thread_id,
                &source.agent_id,
                spec.kind(),
                image,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| harness(format!("the fork child: {e}")))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            if !forming(target, spec).await.is_empty() {
                break;
            }
            if let Some(status) = child
                .try_wait()
                .map_err(|e| harness(format!("the fork child: {e}")))?
            {
                return Err(harness(format!(
                    "the fork child ended ({status}) before its fork was seen under way"
                )));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(harness("no fork was seen under way within 120 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Into the copy, then SIGKILL: no cleanup of the child runs.
        tokio::time::sleep(Duration::from_millis(300)).await;
        child
            .start_kill()
            .map_err(|e| harness(format!("killing the fork child: {e}")))?;
        let status = child
            .wait()
            .await
            .map_err(|e| harness(format!("the fork child: {e}")))?;
        let left = forming(target, spec).await;
        if status.success() || left.is_empty() {
            return Err(harness(format!(
                "the kill came after the fork finished ({status}); nothing was left mid-way"
            )));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_base_image_passes_the_snapshot_suite() {
    let backend = backend(false).await;
    assert!(backend.declarations().serves(Capability::Snapshot));
    let scope = unique_scope("snapshot");
    let hooks = DockerSnapshotHooks {
        context: backend.context().to_owned(),
    };
    let spec = SandboxSpec::builder("snapshot")
        .image(BASE)
        .build()
        .unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let result = assert_snapshot(&backend, &mut keys, &spec, &hooks).await;
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
    let report = result.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{report}\nwall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    report.assert_all_passed().expect("every probe passes");
    assert_eq!(report.passed(), SNAPSHOT_PROBES, "probe count:\n{report}");
}

/// What a fork refuses, each before anything is made under the target: the source itself as
/// the target, a target that already has a sandbox, a source without one, an allowlist spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_refuses_what_it_cannot_make_and_makes_nothing() {
    let backend = backend(false).await;
    let scope = unique_scope("fork-refusals");
    let key = |thread: &str| SandboxKey::conversation(scope.clone(), thread, "agent");
    let spec = SandboxSpec::builder("snapshot")
        .image(BASE)
        .build()
        .unwrap();
    let (source, taken, absent) = (key("source"), key("taken"), key("absent"));
    backend.acquire(&source, &spec).await.expect("acquire");
    let taken_sandbox = backend.acquire(&taken, &spec).await.expect("acquire");

    let same = backend.fork(&source, &spec, &source).await.unwrap_err();
    assert_eq!(same.kind(), ErrorKind::InvalidArgument, "{same}");
    let occupied = backend.fork(&source, &spec, &taken).await.unwrap_err();
    assert_eq!(occupied.kind(), ErrorKind::InvalidArgument, "{occupied}");
    let missing = backend
        .fork(&absent, &spec, &key("nowhere"))
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::InvalidArgument, "{missing}");
    let allowlist = SandboxSpec::builder("snapshot")
        .image(BASE)
        .egress(sandbox_core::Egress::Allowlist)
        .allow("example.test")
        .build()
        .unwrap();
    let open = backend
        .fork(&source, &allowlist, &key("open"))
        .await
        .unwrap_err();
    assert_eq!(open.kind(), ErrorKind::Unsupported, "{open}");

    // The occupied target still serves its own sandbox; no other key got one.
    let again = backend.acquire(&taken, &spec).await.expect("acquire");
    assert_eq!(again.instance_id(), taken_sandbox.instance_id());
    for thread in ["nowhere", "open", "absent"] {
        assert!(
            backend.list(&scope, Some(thread)).await.unwrap().is_empty(),
            "a refused fork made something under {thread}"
        );
    }
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}

/// A handle found (not acquired) resets too: the spec is read back from its container.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_found_handle_resets_from_its_containers_record() {
    use sandbox_core::{Command, ExecRequest};
    let backend = backend(false).await;
    let scope = unique_scope("found-reset");
    let key = SandboxKey::conversation(scope.clone(), "found", "agent");
    let spec = SandboxSpec::builder("snapshot")
        .image(BASE)
        .label("purpose", "found-reset")
        .build()
        .unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let base = sandbox.storage_base().to_owned();
    sandbox
        .write_file("made.txt", b"after acquire\n", &base)
        .await
        .unwrap();
    let found = backend
        .find(&key, "snapshot")
        .await
        .unwrap()
        .expect("found");
    let reset = found.reset().await.expect("reset");
    assert_ne!(reset.instance_id(), sandbox.instance_id());
    assert!(reset.stat_file("made.txt", &base).await.unwrap().is_none());
    // The old handle names a removed instance.
    let gone = sandbox
        .exec(ExecRequest::new(Command::argv(["true"])))
        .await
        .unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::SandboxGone, "{gone}");
    // The same spec (labels included) acquires the reset sandbox warm.
    let again = backend.acquire(&key, &spec).await.expect("acquire");
    assert_eq!(again.instance_id(), reset.instance_id());
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}

/// A fork serves another process as it serves this one: a new backend (no memory of this
/// process) finds it and runs a command in it, under the engine's init like every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_serves_a_command_from_another_process() {
    use sandbox_core::{Command, ExecRequest};
    let backend = backend(false).await;
    let scope = unique_scope("fork-found");
    let key = |thread: &str| SandboxKey::conversation(scope.clone(), thread, "agent");
    let spec = SandboxSpec::builder("snapshot")
        .image(BASE)
        .build()
        .unwrap();
    let source = backend
        .acquire(&key("source"), &spec)
        .await
        .expect("acquire");
    let ran = source
        .exec(ExecRequest::new(Command::argv([
            "sh",
            "-c",
            "echo made >made.txt",
        ])))
        .await
        .unwrap();
    assert_eq!(ran.exit_code, 0, "{}", ran.stderr_text());
    let fork = backend
        .fork(&key("source"), &spec, &key("fork"))
        .await
        .expect("fork");
    let other = support::backend(false).await;
    let found = other
        .find(&key("fork"), "snapshot")
        .await
        .unwrap()
        .expect("the fork is found under its key");
    assert_eq!(found.instance_id(), fork.instance_id());
    let out = found
        .exec(ExecRequest::new(Command::argv(["cat", "made.txt"])))
        .await
        .expect("a command runs in the found fork");
    assert_eq!(out.exit_code, 0, "{}", out.stderr_text());
    assert_eq!(out.stdout, b"made\n");
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
}
