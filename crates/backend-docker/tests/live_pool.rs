//! The warm pool against the real engine (docs/docker-backend.md#warm-pool): the conformance POOL
//! suite (16 acquires from 4 processes, a member a command ran in never handed out, scope
//! disposal and the purge), the claim record's first-creator rule the claim rests on, and
//! nothing left behind.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use bounded_process::ExitKind;
use conformance::isolation::AcquireOutcome;
use conformance::sandboxes::{assert_pool, PoolHooks};
use conformance::suites::POOL_PROBES;
use conformance::ConformanceError;
use sandbox_core::naming::docker::{LABEL_CLAIM_MARK, LABEL_ROLE, LABEL_SCOPE};
use sandbox_core::{ErrorKind, SandboxBackend, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, config, docker, threads_of, unique_scope, BASE};

/// The pool size the suite runs with: half the cross-process acquires find a member.
const POOL_SIZE: usize = 8;

/// The Docker side of the suite.
struct DockerPoolHooks {
    backend: backend_docker::DockerBackend,
}

#[async_trait]
impl PoolHooks for DockerPoolHooks {
    fn size(&self) -> usize {
        POOL_SIZE
    }

    async fn fill(&self, spec: &SandboxSpec) -> Result<(), ConformanceError> {
        self.backend
            .fill_pool(spec, Duration::from_secs(180))
            .await
            .map_err(|e| ConformanceError::harness("POOL", format!("filling the pool: {e}")))
    }

    async fn members(&self) -> Result<BTreeSet<String>, ConformanceError> {
        self.backend
            .pool_members()
            .await
            .map(|ids| ids.into_iter().collect())
            .map_err(|e| ConformanceError::harness("POOL", format!("listing the pool: {e}")))
    }

    async fn exists(&self, instance: &str) -> Result<bool, ConformanceError> {
        let output = docker(["container", "inspect", "--format", "{{.Id}}", instance]).await;
        Ok(output.status == ExitKind::Exited(0))
    }

    async fn acquire_in_processes(
        &self,
        keys: &[SandboxKey],
        spec: &SandboxSpec,
        processes: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        let harness = |detail: String| ConformanceError::harness("POOL", detail);
        let image = spec.image().unwrap_or(BASE);
        let mut children = Vec::new();
        for slot in 0..processes {
            let mine: Vec<&SandboxKey> = keys.iter().skip(slot).step_by(processes).collect();
            let Some(first) = mine.first() else { continue };
            let mut args = vec![
                self.backend.context().to_owned(),
                POOL_SIZE.to_string(),
                first.scope.clone(),
                first.agent_id.clone(),
                spec.kind().to_owned(),
                image.to_owned(),
            ];
            args.extend(mine.iter().map(|k| k.thread_id.clone()));
            let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_docker-pool-child"))
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| harness(format!("the pool child: {e}")))?;
            children.push((mine, child));
        }
        let mut outcomes: HashMap<SandboxKey, Result<AcquireOutcome, ErrorKind>> = HashMap::new();
        for (mine, child) in children {
            let output = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
                .await
                .map_err(|_| harness("a pool child ran past 300 s".into()))?
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
        // Twice: a child process that exited mid-make may have had a create in flight.
        for _ in 0..2 {
            let purge = self.backend.purge_pool().await;
            if let Some(failure) = purge.undisposed {
                return Err(ConformanceError::harness(
                    "POOL",
                    format!("the pool's purge left {failure}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }
}

async fn pooled_backend() -> backend_docker::DockerBackend {
    let mut config = config(false).await;
    config.pool = POOL_SIZE;
    backend_docker::DockerBackend::connect(config)
        .await
        .expect("the docker backend connects to the local engine")
}

/// The containers of the pool's scope, ready, being filled or mid-claim.
async fn pool_containers() -> Vec<String> {
    let listed = docker([
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!(
            "label={LABEL_SCOPE}={}",
            sandbox_core::naming::docker::POOL_SCOPE
        ),
    ])
    .await;
    String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The claim records left on the engine.
async fn claim_records() -> Vec<String> {
    let listed = docker([
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label={LABEL_ROLE}=claim"),
    ])
    .await;
    String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// One test, not several: every check here fills, claims from and purges the one pool of the
/// engine, which tests running at once would share.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_base_image_passes_the_pool_suite() {
    a_claimed_member_is_its_keys_and_goes_with_it().await;
    let backend = pooled_backend().await;
    let scope = unique_scope("pool");
    let hooks = DockerPoolHooks {
        backend: backend.clone(),
    };
    let spec = SandboxSpec::builder("pool").image(BASE).build().unwrap();
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    let started = std::time::Instant::now();
    let result = assert_pool(&backend, &mut keys, &spec, &hooks).await;
    let threads = threads_of(&backend, &scope).await;
    assert_nothing_left(&backend, &scope, &threads).await;
    let report = result.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{report}\nwall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    report.assert_all_passed().expect("every probe passes");
    assert_eq!(report.passed(), POOL_PROBES, "probe count:\n{report}");
    // The backend still refills after the suite's purge: let it settle, drop it, then purge
    // what it made.
    backend
        .fill_pool(&spec, Duration::from_secs(180))
        .await
        .expect("the refill settles");
    drop(hooks);
    drop(backend);
    let sweeper = support::backend(false).await;
    for _ in 0..2 {
        let purge = sweeper.purge_pool().await;
        assert!(purge.undisposed.is_none(), "{purge:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        pool_containers().await.is_empty(),
        "pool members left behind"
    );
    let records = claim_records().await;
    assert!(records.is_empty(), "claim records left behind: {records:?}");
}

/// The claim's primitive, on this engine: of 16 creates of one volume name with 16 different
/// marks, at once, every answer carries the same mark, one of the 16; a later create does not
/// replace it. So exactly one claimer of a member sees its own mark and goes on to rename it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_record_keeps_its_first_creators_mark_only() {
    let engine = bollard::Docker::connect_with_local_defaults().expect("engine client");
    let name = format!("maf-sandbox-claim-live-test-{}", std::process::id());
    let creates = (0..16).map(|n| {
        let engine = engine.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let request = bollard::models::VolumeCreateRequest {
                name: Some(name),
                driver: Some("local".to_owned()),
                labels: Some(HashMap::from([(
                    LABEL_CLAIM_MARK.to_owned(),
                    format!("mark-{n}"),
                )])),
                ..Default::default()
            };
            engine
                .create_volume(request)
                .await
                .expect("volume create")
                .labels
                .get(LABEL_CLAIM_MARK)
                .cloned()
                .unwrap_or_default()
        })
    });
    let mut seen = Vec::new();
    for create in creates.collect::<Vec<_>>() {
        seen.push(create.await.expect("create task"));
    }
    let kept: BTreeSet<&String> = seen.iter().collect();
    let winners = (0..16).filter(|n| seen[*n] == format!("mark-{n}")).count();
    let _ = engine
        .remove_volume(
            &name,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await;
    assert_eq!(kept.len(), 1, "the creates saw several records: {kept:?}");
    assert_eq!(
        winners, 1,
        "{winners} creators saw their own mark: {seen:?}"
    );
}

/// A claimed member is its key's sandbox in every listing and disposal, and never the pool's:
/// `list` of its scope shows it with its key, `list` of the pool's scope does not, another
/// process finds it by its key, and its key's disposal removes it and its claim record.
async fn a_claimed_member_is_its_keys_and_goes_with_it() {
    let backend = pooled_backend().await;
    let scope = unique_scope("pool-owner");
    let key = SandboxKey::conversation(scope.clone(), "owner", "agent");
    let spec = SandboxSpec::builder("pool").image(BASE).build().unwrap();
    backend
        .fill_pool(&spec, Duration::from_secs(180))
        .await
        .expect("fill");
    let members = backend.pool_members().await.expect("members");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let id = sandbox.instance_id().to_owned();
    assert!(members.contains(&id), "the acquire did not take a member");
    let listed = backend.list(&scope, None).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].instance_id, id);
    assert_eq!(listed[0].key.as_ref(), Some(&key));
    assert_eq!(listed[0].kind.as_deref(), Some("pool"));
    let pool_listed = backend
        .list(sandbox_core::naming::docker::POOL_SCOPE, None)
        .await
        .expect("list the pool");
    assert!(
        pool_listed.iter().all(|s| s.instance_id != id),
        "the claimed member is listed as the pool's"
    );
    // Another process finds it by its key alone.
    let other = support::backend(false).await;
    let found = other
        .find(&key, "pool")
        .await
        .expect("find")
        .expect("found");
    assert_eq!(found.instance_id(), id);
    let record = format!("maf-sandbox-claim-{id}");
    assert!(claim_records().await.contains(&record));
    let purge = other.dispose_scope(&scope, "owner").await;
    assert_eq!(purge.disposed, 1, "{purge:?}");
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert!(
        !claim_records().await.contains(&record),
        "its record stayed"
    );
    backend
        .fill_pool(&spec, Duration::from_secs(180))
        .await
        .expect("the refill settles");
    drop((sandbox, found, backend));
    let purge = other.purge_pool().await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert_nothing_left(&other, &scope, &[]).await;
}
