//! The warm pool against real QEMU on the image of `cargo xtask images vm`
//! (docs/qemu-backend.md#warm-pool): the conformance POOL suite (16 acquires from 4 processes,
//! a member a command ran in never handed out, scope disposal and the purge), a claim whose
//! claimer died before recording it, a refill whose process died, and nothing left behind (no
//! QEMU, VM directory, record or pool entry).

mod support;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use conformance::isolation::AcquireOutcome;
use conformance::sandboxes::{assert_pool, PoolHooks};
use conformance::suites::POOL_PROBES;
use conformance::ConformanceError;
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{assert_nothing_left, config, connect_with, image_dir, run_parent};

/// The pool size the suite runs with: one more than the scope-disposal probe takes.
const POOL_SIZE: usize = 3;

/// The QEMU side of the suite.
struct QemuPoolHooks {
    state_dir: PathBuf,
    backend: backend_qemu::QemuBackend,
}

fn harness(detail: String) -> ConformanceError {
    ConformanceError::harness("POOL", detail)
}

#[async_trait]
impl PoolHooks for QemuPoolHooks {
    fn size(&self) -> usize {
        POOL_SIZE
    }

    async fn fill(&self, _spec: &SandboxSpec) -> Result<(), ConformanceError> {
        self.backend
            .fill_pool(Duration::from_secs(300))
            .await
            .map_err(|e| harness(format!("filling the pool: {e}")))
    }

    async fn members(&self) -> Result<BTreeSet<String>, ConformanceError> {
        self.backend
            .pool_members()
            .await
            .map(|ids| ids.into_iter().collect())
            .map_err(|e| harness(format!("listing the pool: {e}")))
    }

    async fn exists(&self, instance: &str) -> Result<bool, ConformanceError> {
        Ok(self.state_dir.join("vms").join(instance).exists())
    }

    async fn acquire_in_processes(
        &self,
        keys: &[SandboxKey],
        spec: &SandboxSpec,
        processes: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        let mut children = Vec::new();
        for slot in 0..processes {
            let mine: Vec<&SandboxKey> = keys.iter().skip(slot).step_by(processes).collect();
            let Some(first) = mine.first() else { continue };
            let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_qemu-pool-child"))
                .arg(image_dir())
                .arg(&self.state_dir)
                .args([
                    POOL_SIZE.to_string(),
                    first.scope.clone(),
                    first.agent_id.clone(),
                    spec.kind().to_owned(),
                ])
                .args(mine.iter().map(|k| k.thread_id.clone()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| harness(format!("the pool child: {e}")))?;
            children.push((mine, child));
        }
        let mut outcomes: HashMap<SandboxKey, Result<AcquireOutcome, ErrorKind>> = HashMap::new();
        for (mine, child) in children {
            let output = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
                .await
                .map_err(|_| harness("a pool child ran past 600 s".into()))?
                .map_err(|e| harness(format!("the pool child: {e}")))?;
            if !output.status.success() {
                return Err(harness(format!(
                    "a pool child ended {}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
            let lines = conformance::child_process::parse_child_acquires(&output.stdout)?;
            if lines.len() != mine.len() {
                return Err(harness(format!(
                    "a pool child printed {} outcomes for {} keys",
                    lines.len(),
                    mine.len()
                )));
            }
            for (key, line) in mine.into_iter().zip(lines) {
                outcomes.insert(key.clone(), line);
            }
        }
        keys.iter()
            .map(|key| {
                outcomes
                    .remove(key)
                    .ok_or_else(|| harness(format!("no outcome for {:?}", key.thread_id)))
            })
            .collect()
    }

    async fn purge(&self) -> Result<(), ConformanceError> {
        let purge = self.backend.purge_pool().await;
        match purge.undisposed {
            Some(failure) => Err(harness(format!("the pool's purge left {failure}"))),
            None => Ok(()),
        }
    }
}

/// The pool's entries other than its lock file.
fn pool_entries(state_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state_dir.join(".pool"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "lock")
        .collect();
    names.sort();
    names
}

async fn echo(sandbox: &dyn sandbox_core::Sandbox, text: &str) -> String {
    let output = sandbox
        .exec(
            ExecRequest::new(Command::argv(["echo", text]))
                .working_directory("/")
                .timeout(Duration::from_secs(60)),
        )
        .await
        .expect("the command runs");
    output.stdout_text()
}

/// A claimer that died after taking a member and before recording it left the claim in the
/// key's directory: the key's next acquire discards that VM and serves another. A refill whose
/// process died left a `.filling` entry no one holds: the next refill discards its VM.
async fn dead_claimers_and_fillers_leave_nothing(
    state_dir: &Path,
    backend: &backend_qemu::QemuBackend,
) {
    let spec = SandboxSpec::builder("pool").build().unwrap();
    let key = SandboxKey::conversation("pool-crash", "claimer", "agent");
    // The key's directory name: made by a first acquire (a claim), emptied by its disposal.
    let first = backend.acquire(&key, &spec).await.unwrap();
    drop(first);
    let slot_name = only_key_directory(state_dir);
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    // The dead claimer: a ready member's entry renamed into the key's directory as its claim,
    // and nothing recorded.
    backend.fill_pool(Duration::from_secs(300)).await.unwrap();
    let taken = backend.pool_members().await.unwrap()[0].clone();
    let slot_dir = state_dir.join(&slot_name);
    std::fs::create_dir_all(&slot_dir).unwrap();
    std::fs::rename(
        state_dir.join(".pool").join(&taken),
        slot_dir.join(format!("claim-{taken}")),
    )
    .unwrap();
    assert!(state_dir.join("vms").join(&taken).exists());
    let served = backend.acquire(&key, &spec).await.unwrap();
    assert_ne!(
        served.instance_id(),
        taken,
        "the dead claim's member is never served"
    );
    assert_eq!(echo(served.as_ref(), "served").await, "served\n");
    assert!(
        !state_dir.join("vms").join(&taken).exists(),
        "the dead claim's VM was discarded"
    );
    assert!(!slot_dir.join(format!("claim-{taken}")).exists());
    drop(served);
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());

    // The dead filler: a `.filling` entry whose lock no process holds, over a running VM.
    backend.fill_pool(Duration::from_secs(300)).await.unwrap();
    let ready = backend.pool_members().await.unwrap();
    let orphan = ready[0].clone();
    std::fs::rename(
        state_dir.join(".pool").join(&orphan),
        state_dir.join(".pool").join(format!("{orphan}.filling")),
    )
    .unwrap();
    assert!(!backend.pool_members().await.unwrap().contains(&orphan));
    backend.fill_pool(Duration::from_secs(300)).await.unwrap();
    assert!(
        !state_dir.join("vms").join(&orphan).exists(),
        "the dead filler's VM was discarded"
    );
    assert!(!pool_entries(state_dir)
        .iter()
        .any(|n| n.starts_with(&orphan)));
    assert_eq!(backend.pool_members().await.unwrap().len(), POOL_SIZE);
}

/// A member is made with the default storage base; a claim for another base makes that one
/// in it, and the sandbox's commands start there.
async fn a_member_serves_another_storage_base(backend: &backend_qemu::QemuBackend) {
    backend.fill_pool(Duration::from_secs(300)).await.unwrap();
    let members = backend.pool_members().await.unwrap();
    let spec = SandboxSpec::builder("pool")
        .work_dir(Some("/srv/elsewhere".to_owned()))
        .build()
        .unwrap();
    let key = SandboxKey::conversation("pool-base", "t", "agent");
    let sandbox = backend.acquire(&key, &spec).await.unwrap();
    assert!(
        members.iter().any(|m| m == sandbox.instance_id()),
        "{} was not claimed from {members:?}",
        sandbox.instance_id()
    );
    let cwd = sandbox
        .exec(ExecRequest::new(Command::argv(["pwd"])).timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(cwd.stdout_text(), "/srv/elsewhere\n", "{cwd:?}");
    drop(sandbox);
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
}

/// The one key directory under `state_dir` (the backend's prefix is `qemu`).
fn only_key_directory(state_dir: &Path) -> String {
    let names: Vec<String> = std::fs::read_dir(state_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("qemu-"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

/// One test: every check here fills, claims from and purges one pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_vm_image_passes_the_pool_suite() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().to_owned();
    let mut pooled = config(&state_dir);
    pooled.pool = POOL_SIZE;
    // One restore at a time, as in each child process: the suite runs about twenty VMs.
    pooled.max_booting = 1;
    let backend = connect_with(pooled).await;
    let started = std::time::Instant::now();

    dead_claimers_and_fillers_leave_nothing(&state_dir, &backend).await;
    a_member_serves_another_storage_base(&backend).await;

    let hooks = QemuPoolHooks {
        state_dir: state_dir.clone(),
        backend: backend.clone(),
    };
    let spec = SandboxSpec::builder("pool").build().unwrap();
    let scope = "pool-suite";
    let mut keys = |purpose: &str| SandboxKey::conversation(scope, purpose, "agent");
    let result = assert_pool(&backend, &mut keys, &spec, &hooks).await;
    // Every sandbox of the scope, and the pool, go whatever the verdict.
    for listed in backend.list(scope, None).await.unwrap_or_default() {
        if let Some(key) = listed.key {
            backend.dispose(&key, DisposeSelector::all()).await;
        }
    }
    let purge = backend.purge_pool().await;
    assert!(purge.undisposed.is_none(), "{:?}", purge.undisposed);
    let report = result.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{report}\nwall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    assert_eq!(report.passed(), POOL_PROBES, "{report}");
    report.assert_all_passed().expect("every probe passes");
    assert_eq!(pool_entries(&state_dir), Vec::<String>::new());
    assert_nothing_left(&state_dir);
}
