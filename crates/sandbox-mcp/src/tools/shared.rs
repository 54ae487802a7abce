//! The state every connection of one server shares: the router, the settings, the liveness lock
//! and the handle table, and what the server does with them outside any one call (idle expiry,
//! disposal at the end, the sweep of crashed servers' sandboxes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_core::{Isolation, Router, SandboxError, SandboxKey, SandboxSpec};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::settings::Settings;
use crate::errors::ToolFailure;
use crate::handles::{new_handle, CreateRefusal, Entry, HandleTable, Lookup, Principal};
use crate::liveness::Liveness;

/// The state every connection of one server shares.
#[derive(Debug)]
pub struct Shared {
    router: Router,
    settings: Settings,
    liveness: Liveness,
    seq: AtomicU64,
    table: Mutex<HandleTable>,
    /// Woken each time a create in flight ends.
    create_ended: Notify,
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
            create_ended: Notify::new(),
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

    /// This server's identity and lock.
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
    fn new_key(&self, principal: &str) -> SandboxKey {
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

    /// Creates a sandbox of `spec` for `principal` and binds a new handle to it; returns the
    /// handle and its idle time to live.
    ///
    /// # Errors
    /// The backend's refusal or failure, as the model may read it; `shutting_down` once the
    /// server is ending; a retryable `sandbox_limit` when the principal or the server holds as
    /// many sandboxes as it may.
    ///
    /// # Cancel safety and drop
    /// The sandbox is made in a task of its own, counted in the table from before it starts
    /// until its sandbox is in the table: a dropped future (the client went away, the server is
    /// ending) leaves the create running, and what it makes is there for the idle TTL and for the
    /// server's end, which waits for it ([`finish_creates`](Self::finish_creates)).
    pub(super) async fn create(
        self: &Arc<Self>,
        principal: Principal,
        kind: String,
        spec: SandboxSpec,
        egress: Vec<String>,
    ) -> Result<(String, Duration), ToolFailure> {
        // Drawn first: a random source that fails refuses the create before anything is made.
        let handle = new_handle().map_err(|e| {
            ToolFailure::from_sandbox(
                &SandboxError::engine(format!("no handle could be drawn: {e}")),
                None,
            )
        })?;
        let key = self.new_key(&principal);
        let began = self
            .table()
            .begin_create(key.clone(), principal.clone(), self.settings.limits);
        match began {
            Ok(()) => {}
            Err(CreateRefusal::Ending) => return Err(ToolFailure::shutting_down()),
            Err(CreateRefusal::PrincipalLimit(n)) => {
                return Err(ToolFailure::sandbox_limit(n, true))
            }
            Err(CreateRefusal::ServerLimit(n)) => return Err(ToolFailure::sandbox_limit(n, false)),
        }
        let creating = Creating {
            shared: Arc::clone(self),
            key: key.clone(),
        };
        let made = tokio::spawn(async move {
            let sandbox = creating
                .shared
                .router
                .acquire(&key, &spec)
                .await
                .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
            let mut table = creating.shared.table();
            let ttl = table.ttl();
            table.insert(handle.clone(), principal, key, kind, sandbox, egress);
            Ok((handle, ttl))
        });
        made.await.unwrap_or_else(|_| {
            Err(ToolFailure::from_sandbox(
                &SandboxError::engine("the create ended abnormally"),
                None,
            ))
        })
    }

    /// Refuses every later create and waits, at most `within`, for those in flight, so that what
    /// they make is in the table for [`dispose_all`](Self::dispose_all). Returns how many are
    /// still in flight (`dispose_all` disposes of their keys).
    pub async fn finish_creates(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let ended = self.create_ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so an end between the two is not missed.
            ended.as_mut().enable();
            let in_flight = self.table().close_creates();
            if in_flight == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.table().close_creates();
            }
        }
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
    /// and those of creates still in flight included, all at once: an agent host gives a stdio server a couple of seconds after
    /// closing its input before it kills it. Returns how many it tried.
    ///
    /// # Cancel safety and drop
    /// Every sandbox is out of the table before any disposal starts; a dropped future leaves the
    /// rest of them on the engine for the next start's sweep or `sandboxctl purge`.
    pub async fn dispose_all(&self) -> usize {
        let (all, creating) = {
            let mut table = self.table();
            (table.take_all(), table.take_creating())
        };
        // A create still in flight past its wait is disposed of by its key.
        let keys: Vec<&SandboxKey> = all
            .iter()
            .map(|entry| &entry.key)
            .chain(&creating)
            .collect();
        futures_util::future::join_all(keys.iter().map(|key| self.router.dispose(key))).await;
        keys.len()
    }

    /// Disposes of the sandboxes in this server's scope whose owning server the kernel proves
    /// gone (it crashed; [`Liveness::verdict`]), never those of a live server or of an owner it
    /// cannot judge. Returns how many conversations were purged.
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
                    self.router
                        .dispose_scope(&self.settings.scope, &thread)
                        .await;
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

/// Counts one create in flight until it ends, however it ends (made, failed, panicked, or
/// dropped with the runtime).
struct Creating {
    shared: Arc<Shared>,
    key: SandboxKey,
}

impl Drop for Creating {
    fn drop(&mut self) {
        self.shared.table().end_create(&self.key);
        self.shared.create_ended.notify_waiters();
    }
}
