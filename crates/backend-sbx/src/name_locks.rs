//! One async lock per sandbox name, process-wide, kept only while someone holds or waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The lock table: name → a weak reference to its lock. The last holder's drop frees the lock,
/// and the table forgets dead entries whenever it is consulted, so it never grows with names
/// that are no longer in use.
#[derive(Debug, Default)]
pub(crate) struct NameLocks {
    table: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

/// A held name lock; dropping it releases the name.
pub(crate) type NameGuard = OwnedMutexGuard<()>;

impl NameLocks {
    /// Waits for the lock of `name`.
    ///
    /// Cancel safety: dropping the future gives up the wait and holds nothing.
    pub(crate) async fn lock(&self, name: &str) -> NameGuard {
        let lock = {
            let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            table.retain(|_, weak| weak.strong_count() > 0);
            match table.get(name).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(AsyncMutex::new(()));
                    table.insert(name.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    #[cfg(test)]
    fn live_entries(&self) -> usize {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.values().filter(|w| w.strong_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_name_and_nothing_kept_after() {
        let locks = Arc::new(NameLocks::default());
        let first = locks.lock("a").await;
        // Another name is independent.
        let other = locks.lock("b").await;
        let waiting = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _guard = locks.lock("a").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a second holder of one name");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("released")
            .unwrap();
        drop(other);
        assert_eq!(locks.live_entries(), 0);
    }

    #[tokio::test]
    async fn a_dropped_wait_holds_nothing() {
        let locks = NameLocks::default();
        let held = locks.lock("a").await;
        let gave_up = tokio::time::timeout(Duration::from_millis(20), locks.lock("a")).await;
        assert!(gave_up.is_err());
        drop(held);
        let _again = tokio::time::timeout(Duration::from_secs(1), locks.lock("a"))
            .await
            .expect("free");
    }
}
