//! A table of async locks keyed by identity, whose entries disappear when nobody holds or awaits them.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

type Slot = Arc<tokio::sync::Mutex<()>>;

/// Per-identity async mutexes (the acquire gates, the per-key disposal locks).
#[derive(Debug)]
pub(crate) struct LockTable<K: Eq + Hash + Clone> {
    slots: Mutex<HashMap<K, Slot>>,
}

impl<K: Eq + Hash + Clone> Default for LockTable<K> {
    fn default() -> Self {
        LockTable {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> LockTable<K> {
    fn slots(&self) -> MutexGuard<'_, HashMap<K, Slot>> {
        // A poisoned table still holds valid slots: nothing is left half-written under this lock.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the lock of `key`.
    ///
    /// Cancel safe: dropping the future while it waits gives up the place in the queue and removes the
    /// slot if nobody else uses it.
    pub(crate) async fn lock(self: &Arc<Self>, key: K) -> LockGuard<K> {
        let slot = self.slots().entry(key.clone()).or_default().clone();
        let mut guard = LockGuard {
            table: Arc::clone(self),
            key,
            held: None,
            slot: Some(Arc::clone(&slot)),
        };
        guard.held = Some(slot.lock_owned().await);
        guard
    }

    /// How many identities have a slot (held or awaited).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }
}

/// Holds one identity's lock; releasing it drops the slot when nobody else holds or awaits it.
#[derive(Debug)]
pub(crate) struct LockGuard<K: Eq + Hash + Clone> {
    table: Arc<LockTable<K>>,
    key: K,
    held: Option<OwnedMutexGuard<()>>,
    slot: Option<Slot>,
}

impl<K: Eq + Hash + Clone> Drop for LockGuard<K> {
    fn drop(&mut self) {
        self.held.take();
        self.slot.take();
        let mut slots = self.table.slots();
        // Every holder or waiter clones the slot out of the table under this same lock, so a count of one
        // (the table's own) means nobody else can be using it.
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
        drop(first);
        waiter.await.unwrap();
        assert_eq!(table.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_leaves_nothing_behind() {
        let table: Arc<LockTable<u8>> = Arc::default();
        let held = table.lock(1).await;
        let waited = tokio::time::timeout(Duration::from_millis(5), table.lock(1)).await;
        assert!(waited.is_err());
        drop(held);
        assert_eq!(table.len(), 0);
    }
}
