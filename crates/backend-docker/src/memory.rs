//! What this process remembers about the containers it made, verified, probed or retired: one
//! small memory per concern, each behind its own lock. Nothing here is the engine's truth
//! (ownership is always read back from the labels); it spares requests and carries what only
//! this process saw (a kill that did not land, a proxy's ready line).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use sandbox_core::{SandboxError, SandboxKey};

/// Locks one memory; a panic while holding it leaves plain maps behind, still usable.
fn held<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

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
    /// The image's exec init (`exec_wrapper::wrapper::EXEC_INIT_PATH`), the wrapper itself.
    ExecInit,
}

#[derive(Debug, Default)]
struct RetiredIds {
    /// Retired ids, with the name they had when known.
    retired: HashMap<String, Option<String>>,
    /// Retired ids whose removal failed: the next acquire removes them first.
    unremovable: HashSet<String>,
}

/// Instances retired after a kill that did not land, and those whose removal failed too.
#[derive(Debug, Default)]
pub(crate) struct Retired(Mutex<RetiredIds>);

impl Retired {
    pub(crate) fn contains(&self, id: &str) -> bool {
        held(&self.0).retired.contains_key(id)
    }

    /// Refuses any call on a retired instance.
    pub(crate) fn refuse(&self, id: &str) -> Result<(), SandboxError> {
        if self.contains(id) {
            return Err(SandboxError::Retired {
                instance: id.to_owned(),
                reason: "a timed-out command's kill did not land; acquire again".to_owned(),
            });
        }
        Ok(())
    }

    fn insert(&self, id: &str, name: Option<String>) {
        held(&self.0).retired.insert(id.to_owned(), name);
    }

    pub(crate) fn mark_unremovable(&self, id: &str) {
        held(&self.0).unremovable.insert(id.to_owned());
    }

    pub(crate) fn clear_unremovable(&self, id: &str) {
        held(&self.0).unremovable.remove(id);
    }

    /// Retired ids whose removal failed earlier.
    pub(crate) fn unremovable(&self) -> Vec<String> {
        held(&self.0).unremovable.iter().cloned().collect()
    }

    /// Forgets a retired id that is gone, unless its removal failed.
    fn forget(&self, id: &str) {
        let mut ids = held(&self.0);
        if !ids.unremovable.contains(id) {
            ids.retired.remove(id);
        }
    }
}

#[derive(Debug, Default)]
struct ProbeResults {
    /// Ids whose tool probe passed.
    probed: HashSet<String>,
    /// Ids whose calls run under an init that is their subreaper, and which init: the engine's
    /// (`docker-init -s` starting the wrapper's `sh`) or the image's exec init. A timeout kills
    /// the call's whole tree; the others get the group shape.
    subreaper: HashMap<String, CallInit>,
    /// The configured runtime's kernel cannot make a process a subreaper (gVisor's release
    /// 2022-12-19 lacks `PR_SET_CHILD_SUBREAPER`): every call gets the group shape.
    no_subreaper: bool,
}

/// What the tool probe found per container: that it passed, and the init calls run under.
#[derive(Debug, Default)]
pub(crate) struct Probes(Mutex<ProbeResults>);

impl Probes {
    pub(crate) fn is_probed(&self, id: &str) -> bool {
        held(&self.0).probed.contains(id)
    }

    pub(crate) fn mark_probed(&self, id: &str) {
        held(&self.0).probed.insert(id.to_owned());
    }

    /// The init `id`'s calls run under, if any (one lookup for the exec's shape).
    pub(crate) fn call_init(&self, id: &str) -> Option<CallInit> {
        held(&self.0).subreaper.get(id).copied()
    }

    /// Records that the runtime's kernel makes no subreaper, so no init is ever recorded and
    /// every call gets the group shape (set once, at connect).
    pub(crate) fn runtime_lacks_subreaper(&self) {
        held(&self.0).no_subreaper = true;
    }

    /// Records the engine's init for `id`, keeping an exec init a probe found; nothing when the
    /// runtime makes no subreaper.
    pub(crate) fn mark_subreaper(&self, id: &str) {
        let mut results = held(&self.0);
        if !results.no_subreaper {
            results
                .subreaper
                .entry(id.to_owned())
                .or_insert(CallInit::EngineInit);
        }
    }

    /// Records that `id`'s image carries the exec init (the tool probe found it); nothing when
    /// the runtime makes no subreaper.
    pub(crate) fn mark_exec_init(&self, id: &str) {
        let mut results = held(&self.0);
        if !results.no_subreaper {
            results.subreaper.insert(id.to_owned(), CallInit::ExecInit);
        }
    }

    fn forget(&self, id: &str) {
        let mut results = held(&self.0);
        results.probed.remove(id);
        results.subreaper.remove(id);
    }
}

/// Containers verified for a warm acquire, with what they were verified for.
#[derive(Debug, Default)]
pub(crate) struct WarmCache(Mutex<HashMap<String, WarmEntry>>);

impl WarmCache {
    pub(crate) fn get(&self, id: &str) -> Option<WarmEntry> {
        held(&self.0).get(id).cloned()
    }

    pub(crate) fn insert(&self, id: &str, entry: WarmEntry) {
        held(&self.0).insert(id.to_owned(), entry);
    }

    pub(crate) fn forget(&self, id: &str) {
        held(&self.0).remove(id);
    }
}

/// Name → what this process made or adopted under it.
#[derive(Debug, Default)]
pub(crate) struct Adoptions(Mutex<HashMap<String, Remembered>>);

impl Adoptions {
    pub(crate) fn remember(&self, name: &str, entry: Remembered) {
        held(&self.0).insert(name.to_owned(), entry);
    }

    /// What this process remembers under names matching `select`.
    pub(crate) fn matching(
        &self,
        select: impl Fn(&Remembered) -> bool,
    ) -> Vec<(String, Remembered)> {
        held(&self.0)
            .iter()
            .filter(|(_, r)| select(r))
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect()
    }

    fn name_of(&self, id: &str) -> Option<String> {
        held(&self.0)
            .iter()
            .find(|(_, r)| r.id == id)
            .map(|(n, _)| n.clone())
    }

    fn forget(&self, id: &str) {
        held(&self.0).retain(|_, r| r.id != id);
    }
}

/// The guest user's uid and gid per container, for files the engine writes on its behalf.
#[derive(Debug, Default)]
pub(crate) struct GuestIds(Mutex<HashMap<String, (u64, u64)>>);

impl GuestIds {
    pub(crate) fn get(&self, id: &str) -> Option<(u64, u64)> {
        held(&self.0).get(id).copied()
    }

    pub(crate) fn remember(&self, id: &str, ids: (u64, u64)) {
        held(&self.0).insert(id.to_owned(), ids);
    }

    fn forget(&self, id: &str) {
        held(&self.0).remove(id);
    }
}

/// Egress proxy ids this process saw print their ready line.
#[derive(Debug, Default)]
pub(crate) struct ReadyProxies(Mutex<HashSet<String>>);

impl ReadyProxies {
    pub(crate) fn contains(&self, id: &str) -> bool {
        held(&self.0).contains(id)
    }

    pub(crate) fn mark(&self, id: &str) {
        held(&self.0).insert(id.to_owned());
    }

    fn forget(&self, id: &str) {
        held(&self.0).remove(id);
    }
}

/// (image id, configured user) → the uid and gid a guest of that image and user reported: the
/// owner a new container's storage base is written with before its guest says so. An image id
/// names its content, so the answer cannot change under it; the guest is still asked every time,
/// and its word wins.
#[derive(Debug, Default)]
pub(crate) struct ImageOwners(Mutex<HashMap<(String, String), (u64, u64)>>);

impl ImageOwners {
    /// The guest ids last reported for `image_id` running as `user`.
    pub(crate) fn get(&self, image_id: &str, user: &str) -> Option<(u64, u64)> {
        held(&self.0)
            .get(&(image_id.to_owned(), user.to_owned()))
            .copied()
    }

    /// Remembers the guest ids a guest of `image_id` running as `user` reported.
    pub(crate) fn remember(&self, image_id: &str, user: &str, ids: (u64, u64)) {
        held(&self.0).insert((image_id.to_owned(), user.to_owned()), ids);
    }
}

/// The memories one backend's components share; each keeps its own lock.
/// The ownership labels of claimed pool members, read from their claim records: a record is
/// bound to one container id and never changes, so it is read once per process.
#[derive(Debug, Default)]
pub(crate) struct ClaimLabels(Mutex<HashMap<String, std::collections::BTreeMap<String, String>>>);

impl ClaimLabels {
    pub(crate) fn get(&self, id: &str) -> Option<std::collections::BTreeMap<String, String>> {
        held(&self.0).get(id).cloned()
    }

    pub(crate) fn remember(&self, id: &str, labels: std::collections::BTreeMap<String, String>) {
        held(&self.0).insert(id.to_owned(), labels);
    }

    fn forget(&self, id: &str) {
        held(&self.0).remove(id);
    }
}

#[derive(Debug, Default)]
pub(crate) struct Memories {
    pub(crate) retired: Retired,
    pub(crate) probes: Probes,
    pub(crate) warm: WarmCache,
    pub(crate) adoptions: Adoptions,
    pub(crate) guest_ids: GuestIds,
    pub(crate) ready_proxies: ReadyProxies,
    pub(crate) image_owners: ImageOwners,
    pub(crate) claims: ClaimLabels,
}

impl Memories {
    /// Retires `id`: every handle refuses it from now on, and it is no longer warm.
    pub(crate) fn retire(&self, id: &str) {
        self.retired.insert(id, self.adoptions.name_of(id));
        self.warm.forget(id);
    }

    /// Forgets everything about a container that is gone (a retired one whose removal failed
    /// stays retired).
    pub(crate) fn forget_instance(&self, id: &str) {
        self.warm.forget(id);
        self.probes.forget(id);
        self.guest_ids.forget(id);
        self.ready_proxies.forget(id);
        self.adoptions.forget(id);
        self.retired.forget(id);
        self.claims.forget(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remembered(id: &str) -> Remembered {
        Remembered {
            key: SandboxKey::conversation("s", "t", "a"),
            kind: "python".to_owned(),
            id: id.to_owned(),
        }
    }

    #[test]
    fn a_retired_instance_is_refused_and_no_longer_warm() {
        let memories = Memories::default();
        memories.adoptions.remember("name", remembered("abc"));
        memories.warm.insert(
            "abc",
            WarmEntry {
                base: "/w".to_owned(),
                policy: "p".to_owned(),
                base_ready: true,
            },
        );
        assert!(memories.retired.refuse("abc").is_ok());
        memories.retire("abc");
        assert!(matches!(
            memories.retired.refuse("abc"),
            Err(SandboxError::Retired { .. })
        ));
        assert_eq!(memories.warm.get("abc"), None);
    }

    #[test]
    fn forgetting_an_instance_keeps_an_unremovable_one_retired() {
        let memories = Memories::default();
        memories.probes.mark_probed("gone");
        memories.probes.mark_subreaper("gone");
        memories.guest_ids.remember("gone", (1, 2));
        memories.ready_proxies.mark("gone");
        memories.adoptions.remember("name", remembered("gone"));
        memories.retire("gone");
        memories.retire("stuck");
        memories.retired.mark_unremovable("stuck");

        memories.forget_instance("gone");
        memories.forget_instance("stuck");

        assert!(!memories.probes.is_probed("gone"));
        assert_eq!(memories.probes.call_init("gone"), None);
        assert_eq!(memories.guest_ids.get("gone"), None);
        assert!(!memories.ready_proxies.contains("gone"));
        assert!(memories.adoptions.matching(|_| true).is_empty());
        assert!(!memories.retired.contains("gone"));
        assert!(memories.retired.contains("stuck"));
        assert_eq!(memories.retired.unremovable(), ["stuck"]);
    }

    #[test]
    fn a_probed_exec_init_is_kept_over_the_engine_init() {
        let probes = Probes::default();
        probes.mark_exec_init("id");
        probes.mark_subreaper("id");
        assert_eq!(probes.call_init("id"), Some(CallInit::ExecInit));
        probes.mark_subreaper("other");
        assert_eq!(probes.call_init("other"), Some(CallInit::EngineInit));
    }

    #[test]
    fn a_runtime_without_a_subreaper_gives_every_call_the_group_shape() {
        let probes = Probes::default();
        probes.runtime_lacks_subreaper();
        probes.mark_exec_init("id");
        probes.mark_subreaper("id");
        probes.mark_subreaper("other");
        assert_eq!(probes.call_init("id"), None);
        assert_eq!(probes.call_init("other"), None);
    }
}
