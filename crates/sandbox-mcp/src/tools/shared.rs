//! The state every connection of one server shares: the router, the settings, the liveness lock
//! and the handle table, and what the server does with them outside any one call (idle expiry,
//! disposal at the end, the sweep of crashed servers' sandboxes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use sandbox_core::{Capability, Isolation, Router, Sandbox, SandboxError, SandboxKey, SandboxSpec};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::settings::Settings;
use crate::errors::ToolFailure;
use crate::handles::{new_handle, CreateRefusal, Entry, HandleTable, Lookup, Principal};
use crate::liveness::Liveness;

/// A sandbox being made under a key: an acquire or a fork through the router.
type Made = Pin<Box<dyn Future<Output = Result<Arc<dyn Sandbox>, SandboxError>> + Send>>;

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
    /// The sandboxes' egress refusals, for exec results.
    egress: Arc<crate::egress_log::EgressLog>,
}

impl Shared {
    /// Shared state over `router`, handles expiring after `ttl`.
    pub fn new(router: Router, settings: Settings, liveness: Liveness, ttl: Duration) -> Arc<Self> {
        Shared::with_egress_log(router, settings, liveness, ttl, Arc::default())
    }

    /// [`Shared::new`], with `egress` the log the backend's egress observer records into
    /// ([`EgressLog::observer`](crate::egress_log::EgressLog::observer)).
    pub fn with_egress_log(
        router: Router,
        settings: Settings,
        liveness: Liveness,
        ttl: Duration,
        egress: Arc<crate::egress_log::EgressLog>,
    ) -> Arc<Self> {
        Arc::new(Shared {
            router,
            settings,
            liveness,
            seq: AtomicU64::new(0),
            table: Mutex::new(HandleTable::new(ttl)),
            create_ended: Notify::new(),
            egress,
        })
    }

    /// The sandboxes' egress refusals.
    pub(super) fn egress_log(&self) -> &crate::egress_log::EgressLog {
        &self.egress
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

    /// Whether the backend resets and forks sandboxes: it declares `snapshot` and the host
    /// does not deny it. The reset and fork tools are listed only then.
    pub(super) fn snapshots(&self) -> bool {
        !self
            .router
            .config()
            .denied_capabilities
            .contains(&Capability::Snapshot)
            && self
                .router
                .backends()
                .first()
                .is_some_and(|b| b.declarations().serves(Capability::Snapshot))
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
        spec: SandboxSpec,
        egress: Vec<String>,
    ) -> Result<(String, Duration), ToolFailure> {
        let made = spec.clone();
        self.bind_new(principal, spec, egress, move |shared, key| {
            Box::pin(async move { shared.router.acquire(&key, &made).await })
        })
        .await
    }

    /// Forks the caller's sandbox behind `handle` into a new sandbox (its files as they are
    /// now) bound to a new handle of the same principal, with the same kind, spec and egress;
    /// returns the new handle and its idle time to live. The fork counts against the limits on
    /// sandboxes held exactly as a create does.
    ///
    /// # Errors
    /// As [`open`](Self::open) for the handle; as [`create`](Self::create) for the limits and the
    /// server's end; the router's refusal (a backend without `snapshot`) or the backend's
    /// failure.
    ///
    /// # Cancel safety and drop
    /// As [`create`](Self::create): the fork runs in a task of its own, counted until its
    /// sandbox is in the table. The source stays in use (it never expires) until the fork ends.
    pub(super) async fn fork(
        self: &Arc<Self>,
        principal: Principal,
        handle: &str,
    ) -> Result<(String, Duration), ToolFailure> {
        let (source, _in_use) = self.open(&principal, handle)?;
        let spec = SandboxSpec::clone(&source.spec);
        let from = source.key.clone();
        self.bind_new(
            principal,
            spec.clone(),
            source.egress.clone(),
            move |shared, key| {
                Box::pin(async move { shared.router.fork(&from, &spec, &key).await })
            },
        )
        .await
    }

    /// Returns the caller's sandbox behind `handle` to its state when it was made; the handle
    /// names the reset sandbox afterwards.
    ///
    /// # Errors
    /// As [`open`](Self::open) for the handle; the router's refusal (a backend without
    /// `snapshot`, an unclean key) or the backend's failure.
    ///
    /// # Cancel safety and drop
    /// The reset runs in a task of its own, so a dropped call never leaves the handle naming an
    /// instance the reset replaced; the handle stays in use (it never expires) while the call
    /// waits.
    pub(super) async fn reset(
        self: &Arc<Self>,
        principal: &str,
        handle: &str,
    ) -> Result<(), ToolFailure> {
        let (entry, in_use) = self.open(principal, handle)?;
        let shared = Arc::clone(self);
        let handle = handle.to_owned();
        let done = tokio::spawn(async move {
            let reset = shared
                .router
                .reset(&entry.key, &*entry.sandbox)
                .await
                .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
            shared.table().replace(&handle, reset);
            Ok(())
        });
        let outcome = done.await.unwrap_or_else(|_| {
            Err(ToolFailure::from_sandbox(
                &SandboxError::engine("the reset ended abnormally"),
                None,
            ))
        });
        drop(in_use);
        outcome
    }

    /// Makes a sandbox with `make` under a fresh key for `principal` and binds a new handle to
    /// it: the handle drawn first, the limits checked and the make counted in the table before
    /// it starts, the make in a task of its own (see [`create`](Self::create)).
    async fn bind_new(
        self: &Arc<Self>,
        principal: Principal,
        spec: SandboxSpec,
        egress: Vec<String>,
        make: impl FnOnce(Arc<Self>, SandboxKey) -> Made + Send + 'static,
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
            let sandbox = make(Arc::clone(&creating.shared), key.clone())
                .await
                .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
            let mut table = creating.shared.table();
            let ttl = table.ttl();
            table.insert(handle.clone(), principal, key, spec, sandbox, egress);
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
