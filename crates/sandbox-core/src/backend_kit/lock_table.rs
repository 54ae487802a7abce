//! A table of async locks keyed by identity, whose entries disappear when nobody holds or awaits them.
//!
//! Scope: mutual exclusion between the tasks of one process (the router's acquire gates and disposal
//! locks, a backend's per-name locks). It does not lock across processes; names derived from keys and
//! ownership on the engine do that ([`crate::naming`]).

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

type Slot = Arc<tokio::sync::Mutex<()>>;
type Slots<K> = Arc<Mutex<HashMap<K, Slot>>>;

/// Per-identity async mutexes: at most one [`LockGuard`] per key at a time, the others wait in
/// order. A key's slot exists only while someone holds or awaits it, so a long-lived process
/// serving many keys keeps no lock per key it ever saw; each lock and release costs one hash
/// lookup, whatever the table's size.
///
/// ```
/// use sandbox_core::backend_kit::LockTable;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let locks: LockTable<String> = LockTable::default();
/// let held = locks.lock("sandbox-a".to_owned()).await;
/// assert_eq!(locks.len(), 1);
/// drop(held);
/// assert!(locks.is_empty());
/// # }
/// ```
pub struct LockTable<K: Eq + Hash + Clone> {
    slots: Slots<K>,
}

impl<K: Eq + Hash + Clone> Default for LockTable<K> {
    fn default() -> Self {
        LockTable {
            slots: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<K: Eq + Hash + Clone> fmt::Debug for LockTable<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockTable")
            .field("slots", &self.len())
            .finish()
    }
}

fn slots<K>(slots: &Mutex<HashMap<K, Slot>>) -> MutexGuard<'_, HashMap<K, Slot>> {
    // A poisoned table still holds valid slots: nothing is left half-written under this lock.
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

impl<K: Eq + Hash + Clone> LockTable<K> {
    /// Waits for the lock of `key` and holds it until the guard drops.
    ///
    /// # Cancel safety and drop
    ///
    /// Cancel safe: dropping the future while it waits gives up the place in the queue and removes
    /// the slot if nobody else uses it.
    pub async fn lock(&self, key: K) -> LockGuard<K> {
        let slot = slots(&self.slots).entry(key.clone()).or_default().clone();
        let mut guard = LockGuard {
            slots: Arc::clone(&self.slots),
            key,
            held: None,
            slot: Some(Arc::clone(&slot)),
        };
        guard.held = Some(slot.lock_owned().await);
        guard
    }

    /// How many keys have a slot (held or awaited).
    pub fn len(&self) -> usize {
        slots(&self.slots).len()
    }

    /// Whether no key is held or awaited.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Holds one key's lock; releasing it drops the slot when nobody else holds or awaits it.
pub struct LockGuard<K: Eq + Hash + Clone> {
    slots: Slots<K>,
    key: K,
    held: Option<OwnedMutexGuard<()>>,
    slot: Option<Slot>,
}

impl<K: Eq + Hash + Clone> fmt::Debug for LockGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("held", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone> Drop for LockGuard<K> {
    fn drop(&mut self) {
        self.held.take();
        self.slot.take();
        let mut slots = slots(&self.slots);
        // Every holder or waiter clones the slot out of the table under this same lock, so a count
        // of one (the table's own) means nobody else can be using it.
        if slots
            .get(&self.key)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn one_holder_per_key_and_slots_are_dropped() {
        let table: Arc<LockTable<u8>> = Arc::default();
        let first = table.lock(1).await;
        let other_key = table.lock(2).await;
        assert_eq!(table.len(), 2);
        drop(other_key);
        assert_eq!(table.len(), 1);

        let t = Arc::clone(&table);
        let waiter = tokio::spawn(async move {
            let _g = t.lock(1).await;
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "the second holder must wait");
        assert_eq!(table.len(), 1, "a waiter shares the holder's slot");
        drop(first);
        waiter.await.unwrap();
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_nothing_behind() {
        let table: LockTable<String> = LockTable::default();
        let held = table.lock("a".to_owned()).await;
        let waited =
            tokio::time::timeout(Duration::from_millis(5), table.lock("a".to_owned())).await;
        assert!(waited.is_err());
        drop(held);
        assert!(table.is_empty());
        // The key is free again at once.
        let again =
            tokio::time::timeout(Duration::from_millis(5), table.lock("a".to_owned())).await;
        assert!(again.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn many_keys_each_pruned_on_release() {
        let table: LockTable<u32> = LockTable::default();
        let mut guards = Vec::new();
        for key in 0..100u32 {
            guards.push(table.lock(key).await);
        }
        assert_eq!(table.len(), 100);
        guards.truncate(40);
        assert_eq!(table.len(), 40);
        drop(guards);
        assert!(table.is_empty());
    }
}
