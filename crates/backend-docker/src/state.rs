//! The state every sandbox of one backend shares: the pinned engine connection, the
//! configuration, the per-name locks, and what this process remembers about the containers it
//! made, verified or retired.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use sandbox_core::backend_kit::{LockGuard, LockTable};
use sandbox_core::{BackendDeclarations, SandboxError, SandboxKey};

use crate::config::DockerConfig;
use crate::connection::EngineConnection;

/// How many engine stats run at once for one backend: an ancestor walk of a deep path waits for
/// a slot rather than opening one request per component.
pub(crate) const STAT_CONCURRENCY: usize = 8;

/// The engine host's addresses as last read, and when: kept here, filled and renewed by
/// [`crate::egress_host`].
pub(crate) type HostAddressCache =
    tokio::sync::Mutex<Option<(std::time::Instant, Vec<std::net::IpAddr>)>>;

/// What the process remembers about a container it verified (the warm cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmEntry {
    pub(crate) base: String,
    pub(crate) policy: String,
    pub(crate) base_ready: bool,
}

/// A container this process made or adopted, for disposal when a listing fails.
#[derive(Debug, Clone)]
pub(crate) struct Remembered {
    pub(crate) key: SandboxKey,
    pub(crate) kind: String,
    pub(crate) id: String,
}

/// The init a call runs under, its subreaper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallInit {
    /// The engine's init starting the wrapper's `sh`.
    EngineInit,
    /// The image's exec init (`exec_wrapper::EXEC_INIT_PATH`), the wrapper itself.
    ExecInit,
}

#[derive(Debug, Default)]
struct ProcessMemory {
    /// Retired ids, with the name they had when known.
    retired: HashMap<String, Option<String>>,
    /// Retired ids whose removal failed: the next acquire removes them first.
    unremovable: HashSet<String>,
    /// Ids whose tool probe passed.
    probed: HashSet<String>,
    /// Ids whose calls run under an init that is their subreaper, and which init: the engine's
    /// (`docker-init -s` starting the wrapper's `sh`) or the image's exec init. A timeout kills
    /// the call's whole tree; the others get the group shape.
    subreaper: HashMap<String, CallInit>,
    /// Ids verified for a warm acquire.
    warm: HashMap<String, WarmEntry>,
    /// Name → what this process made or adopted under it.
    remembered: HashMap<String, Remembered>,
    /// The guest user's uid and gid per id, for files the engine writes on its behalf.
    guest_ids: HashMap<String, (u64, u64)>,
    /// Egress proxy ids this process saw print their ready line.
    ready_proxies: HashSet<String>,
    /// (image id, configured user) → the uid and gid a guest of that image and user reported:
    /// the owner a new container's storage base is written with before its guest says so. An
    /// image id names its content, so the answer cannot change under it; the guest is still
    /// asked every time, and its word wins.
    image_owners: HashMap<(String, String), (u64, u64)>,
}

/// Everything one [`DockerBackend`](crate::DockerBackend) and its handles share.
#[derive(Debug)]
pub(crate) struct BackendState {
    pub(crate) config: DockerConfig,
    pub(crate) engine: EngineConnection,
    pub(crate) declarations: BackendDeclarations,
    /// Resolved per-sandbox limits (CPUs in nano-CPUs, memory in bytes), clamped to the host:
    /// asked of the engine the first time a sandbox is acquired, never by a `find`.
    resources: tokio::sync::OnceCell<crate::config::Resources>,
    /// Bounds the engine stats in flight (at most [`STAT_CONCURRENCY`]).
    pub(crate) stat_slots: tokio::sync::Semaphore,
    name_locks: LockTable<String>,
    memory: Mutex<ProcessMemory>,
    /// The engine host's addresses the egress proxy denies, as last read.
    pub(crate) host_addresses: HostAddressCache,
}

impl BackendState {
    pub(crate) fn new(
        config: DockerConfig,
        engine: EngineConnection,
        declarations: BackendDeclarations,
    ) -> Self {
        BackendState {
            config,
            engine,
            declarations,
            resources: tokio::sync::OnceCell::new(),
            stat_slots: tokio::sync::Semaphore::new(STAT_CONCURRENCY),
            name_locks: LockTable::default(),
            memory: Mutex::new(ProcessMemory::default()),
            host_addresses: HostAddressCache::default(),
        }
    }

    /// The per-sandbox limits, clamped to the engine host's size (one `info` call, the first
    /// time; an unreadable answer leaves the configured limits).
    pub(crate) async fn resources(&self) -> crate::config::Resources {
        *self
            .resources
            .get_or_init(|| async {
                let facts = self.engine.facts(self.config.command_timeout).await.ok();
                crate::config::Resources::clamped(
                    &self.config,
                    facts.as_ref().map_or(0, |f| f.cpus),
                    facts.as_ref().map_or(0, |f| f.memory),
                )
            })
            .await
    }

    fn memory(&self) -> MutexGuard<'_, ProcessMemory> {
        // A panic while holding this lock leaves plain sets behind; they stay usable.
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the process-wide lock of one container name.
    pub(crate) async fn lock_name(&self, name: &str) -> LockGuard<String> {
        self.name_locks.lock(name.to_owned()).await
    }

    pub(crate) fn is_retired(&self, id: &str) -> bool {
        self.memory().retired.contains_key(id)
    }

    /// Refuses any call on a retired instance.
    pub(crate) fn refuse_retired(&self, id: &str) -> Result<(), SandboxError> {
        if self.is_retired(id) {
            return Err(SandboxError::Retired {
                instance: id.to_owned(),
                reason: "a timed-out command's kill did not land; acquire again".to_owned(),
            });
        }
        Ok(())
    }

    pub(crate) fn mark_retired(&self, id: &str) {
        let mut memory = self.memory();
        let name = memory
            .remembered
            .iter()
            .find(|(_, r)| r.id == id)
            .map(|(n, _)| n.clone());
        memory.retired.insert(id.to_owned(), name);
        memory.warm.remove(id);
    }

    pub(crate) fn mark_unremovable(&self, id: &str) {
        self.memory().unremovable.insert(id.to_owned());
    }

    pub(crate) fn clear_unremovable(&self, id: &str) {
        self.memory().unremovable.remove(id);
    }

    pub(crate) fn is_probed(&self, id: &str) -> bool {
        self.memory().probed.contains(id)
    }

    pub(crate) fn mark_probed(&self, id: &str) {
        self.memory().probed.insert(id.to_owned());
    }

    /// The init `id`'s calls run under, if any (one lookup for the exec's shape).
    pub(crate) fn call_init(&self, id: &str) -> Option<CallInit> {
        self.memory().subreaper.get(id).copied()
    }

    /// Records the engine's init for `id`, keeping an exec init a probe found.
    pub(crate) fn mark_subreaper(&self, id: &str) {
        self.memory()
            .subreaper
            .entry(id.to_owned())
            .or_insert(CallInit::EngineInit);
    }

    /// Records that `id`'s image carries the exec init (the tool probe found it).
    pub(crate) fn mark_exec_init(&self, id: &str) {
        self.memory()
            .subreaper
            .insert(id.to_owned(), CallInit::ExecInit);
    }

    pub(crate) fn known_guest_ids(&self, id: &str) -> Option<(u64, u64)> {
        self.memory().guest_ids.get(id).copied()
    }

    pub(crate) fn remember_guest_ids(&self, id: &str, ids: (u64, u64)) {
        self.memory().guest_ids.insert(id.to_owned(), ids);
    }

    /// The guest ids last reported for `image_id` running as `user`.
    pub(crate) fn known_image_owner(&self, image_id: &str, user: &str) -> Option<(u64, u64)> {
        self.memory()
            .image_owners
            .get(&(image_id.to_owned(), user.to_owned()))
            .copied()
    }

    /// Remembers the guest ids a guest of `image_id` running as `user` reported.
    pub(crate) fn remember_image_owner(&self, image_id: &str, user: &str, ids: (u64, u64)) {
        self.memory()
            .image_owners
            .insert((image_id.to_owned(), user.to_owned()), ids);
    }

    pub(crate) fn warm_entry(&self, id: &str) -> Option<WarmEntry> {
        self.memory().warm.get(id).cloned()
    }

    pub(crate) fn remember_warm(&self, id: &str, entry: WarmEntry) {
        self.memory().warm.insert(id.to_owned(), entry);
    }

    pub(crate) fn forget_warm(&self, id: &str) {
        self.memory().warm.remove(id);
    }

    pub(crate) fn remember(&self, name: &str, entry: Remembered) {
        self.memory().remembered.insert(name.to_owned(), entry);
    }

    /// What this process remembers under names matching `select`.
    pub(crate) fn remembered_matching(
        &self,
        select: impl Fn(&Remembered) -> bool,
    ) -> Vec<(String, Remembered)> {
        self.memory()
            .remembered
            .iter()
            .filter(|(_, r)| select(r))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect()
    }

    /// Whether this process saw the proxy `id` ready.
    pub(crate) fn is_ready_proxy(&self, id: &str) -> bool {
        self.memory().ready_proxies.contains(id)
    }

    /// Remembers that the proxy `id` printed its ready line.
    pub(crate) fn mark_ready_proxy(&self, id: &str) {
        self.memory().ready_proxies.insert(id.to_owned());
    }

    /// Forgets everything about a container that is gone.
    pub(crate) fn forget_instance(&self, id: &str) {
        let mut memory = self.memory();
        memory.warm.remove(id);
        memory.probed.remove(id);
        memory.subreaper.remove(id);
        memory.guest_ids.remove(id);
        memory.ready_proxies.remove(id);
        memory.remembered.retain(|_, r| r.id != id);
        if !memory.unremovable.contains(id) {
            memory.retired.remove(id);
        }
    }

    /// Retired ids whose removal failed earlier.
    pub(crate) fn unremovable(&self) -> Vec<String> {
        self.memory().unremovable.iter().cloned().collect()
    }
}

/// Runs the futures with at most `limit` in flight, outputs in input order.
pub(crate) async fn bounded_join<F: Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(futures)
        .buffered(limit.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn bounded_join_keeps_order_and_the_bound() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let futures: Vec<_> = (0..20u64)
            .map(|i| {
                let in_flight = Arc::clone(&in_flight);
                let peak = Arc::clone(&peak);
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5 * (20 - i))).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    i
                }
            })
            .collect();
        assert_eq!(bounded_join(futures, 4).await, (0..20).collect::<Vec<_>>());
        // Exactly the bound in flight at the peak: four ran at once, never a fifth (a sequential
        // join would peak at one).
        assert_eq!(peak.load(Ordering::SeqCst), 4);
    }
}
