//! POOL (docs/conformance.md#the-suites): a backend's warm pool hands each ready sandbox out once,
//! across processes, never one a command ran in; its purge removes the members; the disposal of a
//! scope never touches them.
//!
//! The pool is a backend's own machinery (no trait names it), so the suite reaches it through
//! [`PoolHooks`]; what it judges is what the traits show: instance ids, fresh acquires, `find`,
//! `dispose_scope`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, Sandbox, SandboxBackend, SandboxKey,
    SandboxSpec,
};

use crate::error::ConformanceError;
use crate::hardening::AcquireOutcome;
use crate::report::ConformanceReport;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The suite label.
pub const POOL: &str = "POOL";

/// How many probes [`assert_pool`] runs.
pub const POOL_PROBES: usize = POOL_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const POOL_PROBE_TABLE: &[&str] = &[
    "concurrent-acquires-from-processes-take-each-member-once",
    "a-member-a-command-ran-in-is-never-handed-out",
    "scope-disposal-leaves-the-members",
    "purge-removes-the-members",
];

/// How many acquires the cross-process probe makes, and from how many processes.
pub const POOL_CONCURRENT_ACQUIRES: usize = 16;
/// See [`POOL_CONCURRENT_ACQUIRES`].
pub const POOL_PROCESSES: usize = 4;

/// The bound of every guest command of this suite.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a command leaves its mark, outside the storage base.
const MARKER: &str = "/var/tmp/pool-used-marker";

/// What the suite needs from the backend's test module: the pool's own operations.
#[async_trait]
pub trait PoolHooks: Send + Sync {
    /// The pool's size per shape.
    fn size(&self) -> usize;

    /// Keeps `spec`'s shape filled and waits until its pool is full.
    async fn fill(&self, spec: &SandboxSpec) -> Result<(), ConformanceError>;

    /// The ready members now, of every shape, by instance id.
    async fn members(&self) -> Result<BTreeSet<String>, ConformanceError>;

    /// Whether an instance still exists on the engine (a member or a sandbox).
    async fn exists(&self, instance: &str) -> Result<bool, ConformanceError>;

    /// Acquires each of `keys` with `spec` from `processes` other processes of this host at
    /// once (the keys dealt out among them, each process acquiring its keys concurrently), with
    /// the pool configured as in [`size`](Self::size): one outcome per key, in order.
    async fn acquire_in_processes(
        &self,
        keys: &[SandboxKey],
        spec: &SandboxSpec,
        processes: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError>;

    /// Removes every member of the pool, of every shape.
    async fn purge(&self) -> Result<(), ConformanceError>;
}

/// Attacks a warm pool. `backend` has the pool configured as `hooks` says; each probe uses its own
/// keys from `keys` (conversation keys, one thread per purpose); every sandbox it made is disposed
/// of and the pool purged before it returns.
///
/// # Errors
/// [`ConformanceError::ConformanceFailure`] naming each failed probe; a harness error when the
/// disposal of what the suite made fails.
pub async fn assert_pool(
    backend: &dyn SandboxBackend,
    keys: &mut dyn FnMut(&str) -> SandboxKey,
    spec: &SandboxSpec,
    hooks: &dyn PoolHooks,
) -> Result<ConformanceReport, ConformanceError> {
    let capabilities = backend.declarations().capabilities.clone();
    let mut run = SuiteRun::start(
        POOL,
        POOL_PROBE_TABLE,
        None,
        &capabilities,
        Verdict::Aggregate,
    )?;
    let mut used: Vec<SandboxKey> = Vec::new();
    let mut key = |purpose: &str| {
        let key = keys(purpose);
        used.push(key.clone());
        key
    };
    let suite = Suite {
        backend,
        spec,
        hooks,
    };

    let racing: Vec<SandboxKey> = (0..POOL_CONCURRENT_ACQUIRES)
        .map(|n| key(&format!("pool-race-{n}")))
        .collect();
    run.probe(
        "concurrent-acquires-from-processes-take-each-member-once",
        &[],
        suite.concurrent_acquires(&racing),
    )
    .await;

    let used_key = key("pool-used");
    let drain: Vec<SandboxKey> = (0..hooks.size() + 2)
        .map(|n| key(&format!("pool-drain-{n}")))
        .collect();
    run.probe(
        "a-member-a-command-ran-in-is-never-handed-out",
        &[],
        suite.never_after_a_command(&used_key, &drain),
    )
    .await;

    let disposed = [key("pool-disposed-a"), key("pool-disposed-b")];
    run.probe(
        "scope-disposal-leaves-the-members",
        &[],
        suite.scope_disposal_leaves_members(&disposed),
    )
    .await;

    let kept = key("pool-kept");
    run.probe(
        "purge-removes-the-members",
        &[],
        suite.purge_removes_members(&kept),
    )
    .await;

    let mut failures = Vec::new();
    for key in &used {
        if let Some(failure) = backend.dispose(key, DisposeSelector::all()).await {
            failures.push(format!("{}: {failure}", key.thread_id));
        }
    }
    if let Err(error) = hooks.purge().await {
        failures.push(format!("the pool's purge: {error}"));
    }
    if !failures.is_empty() {
        return Err(ConformanceError::harness(
            POOL,
            format!(
                "the suite's sandboxes were not all disposed of: {}",
                failures.join("; ")
            ),
        ));
    }
    run.finish()
}

/// The backend, the spec every probe acquires with, the hooks.
struct Suite<'a> {
    backend: &'a dyn SandboxBackend,
    spec: &'a SandboxSpec,
    hooks: &'a dyn PoolHooks,
}

impl Suite<'_> {
    /// A fresh acquire of `key` (it must be fresh: the suite's keys are its own).
    async fn acquire(&self, key: &SandboxKey) -> Result<Arc<dyn Sandbox>, ProbeError> {
        let sandbox = self.backend.acquire(key, self.spec).await?;
        ensure!(
            sandbox.freshly_created(),
            "the acquire of {:?} found an existing sandbox; the suite needs a fresh one",
            key.thread_id
        );
        Ok(sandbox)
    }

    /// 16 fresh acquires from 4 processes against a full pool: 16 distinct instances, each served
    /// again by `find` to its own key only, at least one of them a member that was ready before,
    /// and no member handed out still listed as ready.
    async fn concurrent_acquires(&self, keys: &[SandboxKey]) -> Result<(), ProbeError> {
        self.hooks.fill(self.spec).await?;
        let before = self.hooks.members().await?;
        ensure!(
            before.len() >= self.hooks.size(),
            "the full pool lists {} ready members, not {}",
            before.len(),
            self.hooks.size()
        );
        let outcomes = self
            .hooks
            .acquire_in_processes(keys, self.spec, POOL_PROCESSES)
            .await?;
        ensure!(
            outcomes.len() == keys.len(),
            "{} outcomes for {} acquires",
            outcomes.len(),
            keys.len()
        );
        let mut owners: BTreeMap<String, &SandboxKey> = BTreeMap::new();
        for (key, outcome) in keys.iter().zip(outcomes) {
            let outcome = outcome.map_err(|kind| {
                ProbeError::Assertion(format!(
                    "the acquire of {:?} failed: {kind:?}",
                    key.thread_id
                ))
            })?;
            ensure!(
                outcome.freshly_created,
                "the acquire of {:?} was not fresh",
                key.thread_id
            );
            if let Some(other) = owners.insert(outcome.instance_id.clone(), key) {
                return Err(ProbeError::Assertion(format!(
                    "instance {} was handed to both {:?} and {:?}",
                    outcome.instance_id, other.thread_id, key.thread_id
                )));
            }
        }
        let from_pool = owners.keys().filter(|id| before.contains(*id)).count();
        ensure!(
            from_pool > 0,
            "none of the {} acquires was served from the {} ready members",
            keys.len(),
            before.len()
        );
        let after = self.hooks.members().await?;
        for (id, key) in &owners {
            ensure!(
                !after.contains(id),
                "instance {id}, handed to {:?}, is still listed as a ready member",
                key.thread_id
            );
            let found = self.backend.find(key, self.spec.kind()).await?;
            let found = found.map(|s| s.instance_id().to_owned());
            ensure!(
                found.as_deref() == Some(id.as_str()),
                "find of {:?} serves {found:?}, not the instance its acquire got ({id})",
                key.thread_id
            );
        }
        Ok(())
    }

    /// A sandbox served from the pool, a command run in it, then reset: neither the reset nor
    /// any later fresh acquire (more than the pool holds, so it refills meanwhile) is that
    /// instance or sees the command's mark, and it is never listed as ready.
    async fn never_after_a_command(
        &self,
        key: &SandboxKey,
        drain: &[SandboxKey],
    ) -> Result<(), ProbeError> {
        self.hooks.fill(self.spec).await?;
        let before = self.hooks.members().await?;
        let used = self.acquire(key).await?;
        let used_id = used.instance_id().to_owned();
        ensure!(
            before.contains(&used_id),
            "the acquire of a full pool's shape made {used_id} instead of taking a member"
        );
        sh(&used, &format!("echo used > {MARKER}")).await?;
        ensure!(
            !self.hooks.members().await?.contains(&used_id),
            "{used_id}, which ran a command, is listed as a ready member"
        );
        let reset = used.reset().await?;
        ensure!(
            reset.instance_id() != used_id,
            "the reset served the instance it reset ({used_id})"
        );
        ensure!(
            !marked(&reset).await?,
            "the reset sandbox holds the mark of a command run before it"
        );
        for next in drain {
            let fresh = self.acquire(next).await?;
            ensure!(
                fresh.instance_id() != used_id && fresh.instance_id() != reset.instance_id(),
                "the fresh acquire of {:?} was handed {}, which ran a command",
                next.thread_id,
                fresh.instance_id()
            );
            ensure!(
                !marked(&fresh).await?,
                "the fresh acquire of {:?} holds another sandbox's mark",
                next.thread_id
            );
            ensure!(
                !self.hooks.members().await?.contains(&used_id),
                "{used_id}, which ran a command, came back as a ready member"
            );
        }
        Ok(())
    }

    /// Two sandboxes of one conversation served from the pool, then the conversation disposed
    /// of: both go, every other member stays.
    async fn scope_disposal_leaves_members(&self, keys: &[SandboxKey]) -> Result<(), ProbeError> {
        self.hooks.fill(self.spec).await?;
        let mut taken = BTreeSet::new();
        for key in keys {
            taken.insert(self.acquire(key).await?.instance_id().to_owned());
        }
        let before = self.hooks.members().await?;
        ensure!(
            !before.is_empty(),
            "the pool lists no member to leave alone"
        );
        let (scope, thread) = (&keys[0].scope, &keys[0].thread_id);
        ensure!(
            keys.iter().all(|k| k.scope == *scope),
            "the probe's keys share no scope"
        );
        let mut disposed = 0;
        for key in keys {
            let purge = self.backend.dispose_scope(&key.scope, &key.thread_id).await;
            ensure!(
                purge.undisposed.is_none(),
                "the disposal of {:?} left {:?}",
                key.thread_id,
                purge.undisposed
            );
            disposed += purge.disposed;
        }
        ensure!(
            disposed as usize == taken.len(),
            "the disposal of {scope:?}/{thread:?} and its sibling removed {disposed}, not {}",
            taken.len()
        );
        for id in &taken {
            ensure!(
                !self.hooks.exists(id).await?,
                "the disposed sandbox {id} still exists"
            );
        }
        for id in &before {
            ensure!(
                self.hooks.exists(id).await?,
                "the ready member {id} went with the disposal of a scope"
            );
        }
        Ok(())
    }

    /// The pool purged: every member that was ready before it is gone, and a sandbox served from
    /// the pool earlier is still its key's.
    async fn purge_removes_members(&self, key: &SandboxKey) -> Result<(), ProbeError> {
        self.hooks.fill(self.spec).await?;
        let kept = self.acquire(key).await?;
        let before = self.hooks.members().await?;
        ensure!(!before.is_empty(), "the pool lists no member to purge");
        self.hooks.purge().await?;
        for id in &before {
            ensure!(
                !self.hooks.exists(id).await?,
                "the member {id} survived the purge"
            );
        }
        let found = self.backend.find(key, self.spec.kind()).await?;
        ensure!(
            found.as_ref().map(|s| s.instance_id()) == Some(kept.instance_id()),
            "the purge took the sandbox served to {:?}",
            key.thread_id
        );
        sh(&kept, "true").await?;
        Ok(())
    }
}

/// Runs `sh -c script` as the guest, requiring exit 0; its stdout.
async fn sh(sandbox: &Arc<dyn Sandbox>, script: &str) -> Result<Vec<u8>, ProbeError> {
    let request = ExecRequest::new(Command::argv(["sh", "-c", script]))
        .working_directory("/")
        .timeout(COMMAND_TIMEOUT);
    let output = sandbox.exec(request).await?;
    ensure!(
        output.exit_code == 0,
        "the guest command {script:?} exited {} (stderr {:?})",
        output.exit_code,
        output.stderr_text()
    );
    Ok(output.stdout)
}

/// Whether the guest sees the used sandbox's mark.
async fn marked(sandbox: &Arc<dyn Sandbox>) -> Result<bool, ProbeError> {
    let answer = sh(
        sandbox,
        &format!("if test -e {MARKER}; then echo yes; else echo no; fi"),
    )
    .await?;
    match answer.as_slice() {
        b"yes\n" => Ok(true),
        b"no\n" => Ok(false),
        other => Err(ProbeError::Harness(format!(
            "the mark test printed {:?}",
            String::from_utf8_lossy(other)
        ))),
    }
}
