//! The SNAPSHOT suite (docs/conformance.md#the-suites) against real QEMU on the image of
//! `cargo xtask images vm`: `reset` restores the baseline under the same key, `fork` saves the
//! running source and restores a copy (memory and files; no command of the source runs on in
//! it), a crash mid-fork is a `qemu-fork-child` killed while its save is under way, after which
//! the source, left paused by the save, runs on at its next acquire. No probe skipped, nothing
//! left behind (no QEMU, VM or fork directory, or record).

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use conformance::sandboxes::{assert_snapshot, SnapshotHooks};
use conformance::suites::SNAPSHOT_PROBES;
use conformance::ConformanceError;
use sandbox_core::{Capability, Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, connect, image_dir, run_parent};

/// The QEMU side of the suite: a fork copies memory and files, but the agent ends every exec's
/// processes with its session, and the copy's sessions are its source's; the crash is a
/// `qemu-fork-child` killed while the source is being saved into the fork's directory.
struct QemuSnapshotHooks {
    state_dir: PathBuf,
    backend: backend_qemu::QemuBackend,
}

/// The fork directories under `state_dir` (`vms/<instance>.fork`): a fork under way.
fn forks_under_way(state_dir: &Path) -> Vec<String> {
    std::fs::read_dir(state_dir.join("vms"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".fork"))
        .collect()
}

#[async_trait]
impl SnapshotHooks for QemuSnapshotHooks {
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
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_qemu-fork-child"))
            .arg(image_dir())
            .arg(&self.state_dir)
            .args([
                source.scope.as_str(),
                &source.thread_id,
                &target.thread_id,
                &source.agent_id,
                spec.kind(),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| harness(format!("the fork child: {e}")))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            if !forks_under_way(&self.state_dir).is_empty() {
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
                return Err(harness("no fork was seen under way within 180 s".into()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Into the save, then SIGKILL: no cleanup of the child runs.
        tokio::time::sleep(Duration::from_millis(300)).await;
        child
            .start_kill()
            .map_err(|e| harness(format!("killing the fork child: {e}")))?;
        let status = child
            .wait()
            .await
            .map_err(|e| harness(format!("the fork child: {e}")))?;
        let left = forks_under_way(&self.state_dir);
        if status.success() || left.is_empty() {
            return Err(harness(format!(
                "the kill came after the fork finished ({status}); nothing was left mid-way"
            )));
        }
        // The save left the source paused; its next acquire runs it on, and it serves.
        let source_box = self
            .backend
            .acquire(source, spec)
            .await
            .map_err(|e| harness(format!("the source's acquire after the crash: {e}")))?;
        let answer = source_box
            .exec(
                ExecRequest::new(Command::argv(["echo", "served"]))
                    .working_directory("/")
                    .timeout(Duration::from_secs(60)),
            )
            .await
            .map_err(|e| harness(format!("the source after the crash: {e}")))?;
        if answer.stdout_text() != "served\n" {
            return Err(harness(format!(
                "the source after the crash answered {answer:?}"
            )));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vm_image_passes_the_snapshot_suite() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    assert!(backend.declarations().serves(Capability::Snapshot));
    let scope = format!("snapshot-{}", std::process::id());
    let hooks = QemuSnapshotHooks {
        state_dir: state_dir.clone(),
        backend: backend.clone(),
    };
    let spec = SandboxSpec::builder("snapshot").build().unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let result = assert_snapshot(&backend, &mut keys, &spec, &hooks).await;
    let wall = started.elapsed();
    // The suite disposes of what it made; what a failed run left goes here, before the check.
    for thread in [
        "snapshot-reset",
        "snapshot-reset-processes",
        "snapshot-exact-source",
        "snapshot-exact-fork",
        "snapshot-split-source",
        "snapshot-split-fork",
        "snapshot-live-source",
        "snapshot-live-fork",
        "snapshot-twins-source",
        "snapshot-twin-a",
        "snapshot-twin-b",
        "snapshot-crash-source",
        "snapshot-crash-fork",
    ] {
        let purge = backend.dispose_scope(&scope, thread).await;
        assert!(
            purge.undisposed.is_none(),
            "disposal of {thread}: {purge:?}"
        );
    }
    drop(backend);
    assert_nothing_left(&state_dir);
    let report = result.unwrap_or_else(|e| panic!("{e}"));
    println!("qemu: {report}\nwall time {:.1} s", wall.as_secs_f64());
    assert_eq!(report.skipped(), 0, "{report}");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!(report.passed(), SNAPSHOT_PROBES, "{report}");
}

/// A VM of the backend's default size (two CPUs, 2 GiB), as the hosts make them, is saved too:
/// its baseline is made (a new sandbox restores it instead of booting), and a fork and a reset
/// of it serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_of_the_default_size_makes_its_baseline_and_forks() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let defaults = backend_qemu::QemuConfig::default();
    let mut config = support::config(&state_dir);
    config.cpus = defaults.cpus;
    config.memory_mib = defaults.memory_mib;
    let backend = support::connect_with(config).await;
    let scope = format!("snapshot-size-{}", std::process::id());
    let spec = SandboxSpec::builder("snapshot").build().unwrap();
    let source = SandboxKey::conversation(scope.as_str(), "source", "agent");
    let target = SandboxKey::conversation(scope.as_str(), "target", "agent");
    let run = |line: &str| {
        ExecRequest::new(Command::argv(["sh", "-c", line]))
            .working_directory("/")
            .timeout(Duration::from_secs(60))
    };
    let outcome = async {
        let sandbox = backend.acquire(&source, &spec).await.expect("acquire");
        let baselines: Vec<_> = std::fs::read_dir(state_dir.join(".snapshots"))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|image| {
                std::fs::read_dir(image.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .filter(|entry| entry.path().join("snapshot.json").is_file())
            .collect();
        assert_eq!(baselines.len(), 1, "the machine's baseline was made");
        let made = sandbox
            .exec(run("echo made > /var/tmp/made"))
            .await
            .unwrap();
        assert_eq!(made.exit_code, 0, "{made:?}");
        let fork = backend.fork(&source, &spec, &target).await.expect("fork");
        let seen = fork.exec(run("cat /var/tmp/made")).await.unwrap();
        assert_eq!(seen.stdout_text(), "made\n", "{seen:?}");
        let reset = sandbox.reset().await.expect("reset");
        let gone = reset
            .exec(run("test -e /var/tmp/made; echo $?"))
            .await
            .unwrap();
        assert_eq!(gone.stdout_text(), "1\n", "{gone:?}");
    }
    .await;
    for thread in ["source", "target"] {
        let purge = backend.dispose_scope(&scope, thread).await;
        assert!(
            purge.undisposed.is_none(),
            "disposal of {thread}: {purge:?}"
        );
    }
    drop(backend);
    assert_nothing_left(&state_dir);
    outcome
}
