//! The state every connection of one server shares: the router, the settings, the liveness lock
//! and the handle table, and what the server does with them outside any one call (idle expiry,
//! disposal at the end, the sweep of crashed servers' sandboxes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_core::{Isolation, Router, SandboxError, SandboxKey};
use tokio::time::Instant;

use super::settings::Settings;
use crate::errors::ToolFailure;
use crate::handles::{Entry, HandleTable, Lookup};
use crate::liveness::Liveness;

/// The state every connection of one server shares.
#[derive(Debug)]
pub struct Shared {
    router: Router,
    settings: Settings,
    liveness: Liveness,
    seq: AtomicU64,
    table: Mutex<HandleTable>,
}

impl Shared {
    /// Shared state over `router`, handles expiring after `ttl`.
    pub fn new(router: Router, settings: Settings, liveness: Liveness, ttl: Duration) -> Arc<Self> {
        Arc::new(Shared {
            router,
            settings,
            liveness,
            seq: AtomicU64::new(0),
            table: Mutex::new(HandleTable::new(ttl)),
        })
    }

    /// The handle table, locked.
    pub(super) fn table(&self) -> std::sync::MutexGuard<'_, HandleTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The liveness lock.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The server's settings.
    pub(super) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The isolation rung of the backend.
    pub(super) fn isolation(&self) -> Isolation {
        self.router
            .backends()
            .first()
            .map(|b| b.isolation())
            .unwrap_or(Isolation::None)
    }

    /// A fresh key for a sandbox of `principal`: the server's scope, a thread unique to this
    /// server, and the principal as agent over HTTP (over stdio, the configured agent).
    pub(super) fn new_key(&self, principal: &str) -> SandboxKey {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let agent: &str = if self.settings.http {
            principal
        } else {
            &self.settings.agent
        };
        SandboxKey::conversation(
            self.settings.scope.clone(),
            self.liveness.thread(n),
            agent.to_owned(),
        )
    }

    /// The caller's sandbox behind `handle`, held in use (so it never expires) until the
    /// returned guard is dropped.
    ///
    /// # Errors
    /// `unknown_sandbox` (never made, another principal's, disposed of) or `expired_sandbox`.
    pub(super) fn open(
        &self,
        principal: &str,
        handle: &str,
    ) -> Result<(Entry, InUse<'_>), ToolFailure> {
        match self.table().acquire(principal, handle) {
            Lookup::Found(entry) => Ok((
                entry,
                InUse {
                    shared: self,
                    handle: handle.to_owned(),
                },
            )),
            Lookup::Expired => Err(ToolFailure::expired_sandbox()),
            Lookup::Unknown => Err(ToolFailure::unknown_sandbox()),
        }
    }

    /// Disposes of the caller's sandbox behind `handle`: `Ok(false)` when there is none (never
    /// made, another principal's, already disposed of or expired).
    ///
    /// # Errors
    /// A retryable `engine` failure when the backend could not dispose of it all; the sandbox
    /// is then kept, out of use, and disposed of again by the caller's next dispose of the
    /// handle or at the server's end.
    ///
    /// # Cancel safety and drop
    /// The sandbox stays among those being disposed of until its disposal succeeds, so a dropped
    /// future leaves it to the server's end.
    pub async fn dispose(&self, principal: &str, handle: &str) -> Result<bool, ToolFailure> {
        let Some(entry) = self.table().begin_disposal(principal, handle) else {
            return Ok(false);
        };
        if self.router.dispose(&entry.key).await.is_some() {
            return Err(ToolFailure::new(
                "engine",
                "the sandbox could not be fully disposed of; the server will retry at its end",
                true,
            ));
        }
        self.table().disposed(handle);
        Ok(true)
    }

    /// Disposes of the sandboxes idle past the TTL. Returns when the next one may expire.
    ///
    /// # Cancel safety and drop
    /// Expired handles are out of use before any disposal starts; one whose disposal fails, or
    /// is dropped, is kept for the server's end.
    pub async fn expire(&self) -> Option<Instant> {
        let gone = self.table().take_expired();
        let outcomes = futures_util::future::join_all(
            gone.iter()
                .map(|(_, entry)| self.router.dispose(&entry.key)),
        )
        .await;
        {
            let mut table = self.table();
            for ((handle, _), failure) in gone.iter().zip(outcomes) {
                if failure.is_none() {
                    table.disposed(handle);
                }
            }
        }
        self.table().next_expiry()
    }

    /// Disposes of every sandbox this server still holds, those whose disposal failed before
    /// included, all at once: an agent host gives a stdio server a couple of seconds after
    /// closing its input before it kills it. Returns how many it tried.
    ///
    /// # Cancel safety and drop
    /// Every sandbox is out of the table before any disposal starts; a dropped future leaves the
    /// rest of them on the engine for the next start's sweep or `sandboxctl purge`.
    pub async fn dispose_all(&self) -> usize {
        let all = self.table().take_all();
        futures_util::future::join_all(all.iter().map(|entry| self.router.dispose(&entry.key)))
            .await;
        all.len()
    }

    /// Disposes of the sandboxes in this server's scope whose owning server is gone (it
    /// crashed: its liveness lock is free). Returns how many conversations were purged.
    ///
    /// # Errors
    /// The backend's listing failure.
    pub async fn sweep_orphans(&self) -> Result<usize, SandboxError> {
        let mut purged = 0;
        for backend in self.router.backends() {
            let mut threads: Vec<String> = backend
                .list(&self.settings.scope, None)
                .await?
                .into_iter()
                .filter_map(|s| s.key.map(|k| k.thread_id))
                .collect();
            threads.sort();
            threads.dedup();
            for thread in threads {
                if self.liveness.owner_is_gone(&thread) {
                    let purge = self
                        .router
                        .dispose_scope(&self.settings.scope, &thread)
                        .await;
                    if purge.undisposed.is_none() {
                        self.liveness.forget(&thread);
                    }
                    purged += 1;
                }
            }
        }
        Ok(purged)
    }
}

/// Releases a handle's in-use mark when a call ends, however it ends.
pub(super) struct InUse<'a> {
    shared: &'a Shared,
    handle: String,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.shared.table().release(&self.handle);
    }
}
