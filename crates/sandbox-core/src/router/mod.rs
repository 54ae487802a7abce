//! The router: refuses any backend below the host's isolation floor, admits specs against the backends'
//! declarations, serialises acquires per identity, adopts or disposes of instances it does not know, keeps
//! the unclean ledger, and fans disposals out to every registered backend.
//!
//! # Runtime
//! The async methods run on tokio and need its time driver (as `#[tokio::main]` and `#[tokio::test]`
//! provide). Cleanups that protect a guarantee are spawned on the current runtime, so dropping a caller's
//! future stops the wait but never the cleanup. Polled outside a tokio runtime, a disposal runs nothing
//! and reports an `unknown` failure (the key is marked unclean); it never panics.

mod admission;
mod config;
mod ledger;
mod locks;

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use tracing::{debug, info, warn};

pub use config::{FailedCleanup, RouterConfig, Selection, DEFAULT_CLEANUP_TIMEOUT};

use admission::{backend_refusal, compose, spec_level, HostPolicy, Offer};
use ledger::{State, Target};
use locks::{LockGuard, LockTable};

/// The acquire gate of one (key, kind).
type Gate = LockGuard<(SandboxKey, String)>;

use crate::{
    DisposalCode, DisposalFailure, IsolationScope, Sandbox, SandboxBackend, SandboxError,
    SandboxKey, SandboxSpec, ScopePurge,
};

/// Names what a host's [`Router::mark_unclean`] says is left behind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UncleanTarget {
    /// The backend's name. A name no registered backend has reads as "every backend".
    pub backend: String,
    /// Only this kind; `None` means every kind of the key.
    pub kind: Option<String>,
    /// Only this physical instance.
    pub instance_id: Option<String>,
}

impl UncleanTarget {
    /// Every sandbox of the key on one backend.
    pub fn backend(name: impl Into<String>) -> Self {
        UncleanTarget {
            backend: name.into(),
            kind: None,
            instance_id: None,
        }
    }

    /// Narrows the target to one kind.
    #[must_use]
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Narrows the target to one instance.
    #[must_use]
    pub fn instance(mut self, instance_id: impl Into<String>) -> Self {
        self.instance_id = Some(instance_id.into());
        self
    }
}

/// One seam to many backends, under the host's policy.
///
/// Cloning a router is cheap and shares everything: the remembered instances, the unclean ledger and the
/// locks.
///
/// ```
/// use std::sync::Arc;
/// use sandbox_core::{Isolation, Router, RouterConfig, SandboxBackend, SandboxKey, SandboxSpec};
/// use sandbox_core::testing::FakeBackend;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), sandbox_core::SandboxError> {
/// let backend: Arc<dyn SandboxBackend> = Arc::new(FakeBackend::new("fake", Isolation::Microvm));
/// let router = Router::new(vec![backend], RouterConfig::default())?;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// let spec = SandboxSpec::builder("python").build()?;
/// let sandbox = router.acquire(&key, &spec).await?;
/// assert!(sandbox.freshly_created());
/// assert_eq!(router.dispose(&key).await, None);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

struct Inner {
    backends: Vec<Arc<dyn SandboxBackend>>,
    /// Indices of the backends admission may route to, in registration order.
    candidates: Vec<usize>,
    config: RouterConfig,
    state: Mutex<State>,
    gates: Arc<LockTable<(SandboxKey, String)>>,
    disposal_locks: Arc<LockTable<SandboxKey>>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.inner.backends.iter().map(|b| b.name()).collect();
        let candidates: Vec<&str> = self
            .inner
            .candidates
            .iter()
            .map(|&i| self.inner.backends[i].name())
            .collect();
        f.debug_struct("Router")
            .field("backends", &names)
            .field("candidates", &candidates)
            .field("config", &self.inner.config)
            .finish()
    }
}

#[cold]
#[inline(never)]
fn no_backend(message: String) -> SandboxError {
    SandboxError::NoBackend(message)
}

#[cold]
#[inline(never)]
fn not_permitted(message: String) -> SandboxError {
    SandboxError::NotPermitted(message)
}

fn quoted_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.map(|n| format!("{n:?}")).collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// A bound in seconds, as people write it: `30`, `0.5`.
fn secs(bound: Duration) -> String {
    if bound.subsec_nanos() == 0 {
        bound.as_secs().to_string()
    } else {
        bound.as_secs_f64().to_string()
    }
}

impl Router {
    /// Builds a router, validating the configuration in the contract's order:
    ///
    /// 1. [`Selection::Fixed`] with no backends gives a router with no candidate
    ///    ([`enabled`](Self::enabled) is false; every acquire is [`SandboxError::NoBackend`]);
    /// 2. [`Selection::PerSpec`] together with `selected` → [`SandboxError::InvalidArgument`]; so is a zero
    ///    `cleanup_timeout` (refused whatever the backends, even when none is registered);
    /// 3. `Fixed`: a `selected` name no backend has → [`SandboxError::NoBackend`] (the message lists the
    ///    registered names); the named (or first) backend below `min_isolation` →
    ///    [`SandboxError::NotPermitted`];
    /// 4. `PerSpec`: no backend clears the floor → [`SandboxError::NotPermitted`]. Backends below the floor
    ///    are logged, stay registered for the disposal fan-out, and are never routed to.
    ///
    /// Two backends may share a name; the router tells them apart by position.
    pub fn new(
        backends: Vec<Arc<dyn SandboxBackend>>,
        config: RouterConfig,
    ) -> Result<Router, SandboxError> {
        let floor = config.min_isolation;
        if let (Selection::PerSpec, Some(selected)) = (config.selection, &config.selected) {
            return Err(SandboxError::invalid(format!(
                "selection per_spec cannot be combined with a selected backend ({selected:?})"
            )));
        }
        if config.cleanup_timeout.is_zero() {
            return Err(SandboxError::invalid(
                "cleanup_timeout must be greater than zero",
            ));
        }
        let candidates = match config.selection {
            Selection::Fixed if backends.is_empty() => Vec::new(),
            Selection::Fixed => {
                let index = match &config.selected {
                    None => 0,
                    Some(name) => {
                        backends
                            .iter()
                            .position(|b| b.name() == name)
                            .ok_or_else(|| {
                                no_backend(format!(
                                    "no registered backend is named {name:?} (registered: {})",
                                    quoted_names(backends.iter().map(|b| b.name()))
                                ))
                            })?
                    }
                };
                let chosen = &backends[index];
                if !chosen.isolation().meets_floor(Some(floor)) {
                    return Err(not_permitted(format!(
                        "backend {:?} provides {} isolation, below the host floor {floor}",
                        chosen.name(),
                        chosen.isolation()
                    )));
                }
                vec![index]
            }
            Selection::PerSpec => {
                let mut candidates = Vec::new();
                for (index, backend) in backends.iter().enumerate() {
                    if backend.isolation().meets_floor(Some(floor)) {
                        candidates.push(index);
                    } else {
                        warn!(
                            backend = backend.name(),
                            isolation = %backend.isolation(),
                            floor = %floor,
                            "backend is below the isolation floor: kept for disposal, never routed to"
                        );
                    }
                }
                if candidates.is_empty() {
                    let below: Vec<String> = backends
                        .iter()
                        .map(|b| format!("{:?} ({})", b.name(), b.isolation()))
                        .collect();
                    return Err(not_permitted(format!(
                        "no registered backend clears the host floor {floor} (registered: {})",
                        if below.is_empty() {
                            "none".to_owned()
                        } else {
                            below.join(", ")
                        }
                    )));
                }
                candidates
            }
        };
        Ok(Router {
            inner: Arc::new(Inner {
                backends,
                candidates,
                config,
                state: Mutex::new(State::default()),
                gates: Arc::default(),
                disposal_locks: Arc::default(),
            }),
        })
    }

    /// Whether any backend can be routed to.
    pub fn enabled(&self) -> bool {
        !self.inner.candidates.is_empty()
    }

    /// The configuration the router was built with.
    pub fn config(&self) -> &RouterConfig {
        &self.inner.config
    }

    /// Every registered backend, in registration order (including those below the floor).
    pub fn backends(&self) -> &[Arc<dyn SandboxBackend>] {
        &self.inner.backends
    }

    /// Runs the admission checks without acquiring anything: [`SandboxError::NoBackend`] with no
    /// candidate, then (A1) an allowlist with nothing allowed → InvalidArgument, (A2) a denied capability →
    /// CapabilityDenied, then per backend (B1) floor → NotPermitted, (B2) capabilities and (B3) egress
    /// method tokens → CapabilityNotSupported, (B4) OS family → OsFamilyNotSupported, (B5) transfer limits
    /// → TransferLimitsNotPermitted, (B6) egress mode → EgressNotEnforced, (B7) isolation scope →
    /// ScopeNotEnforced. The first refusal wins.
    ///
    /// With [`Selection::PerSpec`] and no candidate serving, the first candidate's refusal is returned
    /// with its kind; its message names the other candidates and their refusal kinds.
    pub fn ensure_can_serve(&self, spec: &SandboxSpec) -> Result<(), SandboxError> {
        self.inner.route(spec).map(|_| ())
    }

    /// The backend [`acquire`](Self::acquire) would route `spec` to, or `None` where
    /// [`ensure_can_serve`](Self::ensure_can_serve) refuses.
    pub fn backend_for(&self, spec: &SandboxSpec) -> Option<Arc<dyn SandboxBackend>> {
        self.inner
            .route(spec)
            .ok()
            .map(|i| Arc::clone(&self.inner.backends[i]))
    }

    /// Whether the key is unclean: a disposal of it failed, or one is running.
    pub fn is_unclean(&self, key: &SandboxKey) -> bool {
        self.inner.state().unclean(key).is_some()
    }

    /// The failure that made the key unclean, when one is recorded.
    pub fn unclean_failure(&self, key: &SandboxKey) -> Option<DisposalFailure> {
        self.inner.state().failure(key)
    }

    /// Gets a sandbox of `spec.kind()` for `key`.
    ///
    /// In order: waits for the gate of (key, kind), so concurrent acquires of one identity run one at a
    /// time; no candidate → [`SandboxError::NoBackend`]; an unclean key → [`SandboxError::Unclean`]
    /// carrying only the code; admission (see [`ensure_can_serve`](Self::ensure_can_serve)); the effective
    /// isolation scope must match the key (`call` needs a call id, `conversation` must not have one) else
    /// [`SandboxError::InvalidArgument`]; then the backend's acquire. If the key turned unclean while that
    /// ran (even if the disposal that made it so has landed since: it may have missed the instance being
    /// created), exactly that instance is disposed of and the result is `Unclean`. An empty instance id is
    /// disposed of (best effort) and reported as [`SandboxError::ContractViolation`].
    ///
    /// A conversation-scoped instance the router has not served before and that the backend did not
    /// freshly create may hold an earlier process's residue: it is disposed of (bounded by
    /// `cleanup_timeout`) and acquired again. If that disposal fails, [`FailedCleanup::Dispose`] marks the
    /// key unclean and returns `Unclean`; [`FailedCleanup::Keep`] serves the instance anyway. A backend's
    /// runtime failure never falls back to another backend.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits for the gate or for the backend gives up without side effects
    /// beyond the backend's own (backends clean up half-created sandboxes themselves). Once the router
    /// starts a cleanup (the disposal of an instance found while the key turned unclean, an empty-id
    /// instance, or an unfamiliar one), that cleanup runs in a spawned task and completes, ledger write
    /// included, even if the future is dropped; the task keeps the (key, kind) gate until it is over, so
    /// the next acquire of that identity cannot overlap it.
    pub async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let inner = &self.inner;
        let kind = spec.kind();
        // The gate travels into any cleanup this acquire starts, so that a dropped acquire still keeps
        // the next one of this identity waiting until the cleanup is over.
        let mut gate = Some(inner.gates.lock((key.clone(), kind.to_owned())).await);
        if inner.candidates.is_empty() {
            return Err(no_backend("no backend is registered".to_owned()));
        }
        // Checked and watched under one lock, so nothing that makes the key unclean can slip in between.
        let watch = {
            let mut state = inner.state();
            if let Some(code) = state.unclean(key) {
                return Err(SandboxError::Unclean { code });
            }
            Watch {
                token: state.watch(key),
                inner: Arc::clone(inner),
            }
        };
        let index = inner.route(spec)?;
        let scope =
            IsolationScope::effective(inner.config.min_isolation_scope, spec.isolation_scope());
        match (scope, key.is_call()) {
            (IsolationScope::Call, false) => {
                return Err(SandboxError::invalid(
                    "the effective isolation scope is call, but the key has no call_id",
                ));
            }
            (IsolationScope::Conversation, true) => {
                return Err(SandboxError::invalid(format!(
                    "the effective isolation scope is conversation, but the key names call {:?}",
                    key.call_id
                )));
            }
            _ => {}
        }
        let backend = Arc::clone(&inner.backends[index]);
        let sandbox = backend.acquire(key, spec).await?;
        let sandbox = self
            .settle_acquired(key, kind, index, sandbox, &watch, &mut gate)
            .await?;

        if scope == IsolationScope::Call {
            inner
                .state()
                .remember(key, kind, index, sandbox.instance_id());
            return Ok(sandbox);
        }

        // Adoption (conversation scope).
        let id = sandbox.instance_id().to_owned();
        if inner.state().remembered(key, kind, index) == Some(id.as_str()) {
            return Ok(sandbox);
        }
        if sandbox.freshly_created() {
            inner.state().remember(key, kind, index, &id);
            return Ok(sandbox);
        }
        info!(
            backend = backend.name(),
            key = %key,
            kind,
            instance = %id,
            "disposing of an unfamiliar instance before its first use"
        );
        let target = Target {
            backend: index,
            kind: Some(kind.to_owned()),
            instance_id: Some(id.clone()),
        };
        let record = inner.config.failed_cleanup == FailedCleanup::Dispose;
        if let Some(failure) = inner.cleanup(key, target, record, &mut gate).await {
            match inner.config.failed_cleanup {
                FailedCleanup::Dispose => {
                    warn!(
                        backend = backend.name(),
                        key = %key,
                        kind,
                        failure = %failure,
                        "an unfamiliar instance could not be cleaned before first use"
                    );
                    return Err(SandboxError::Unclean {
                        code: Some(failure.code),
                    });
                }
                FailedCleanup::Keep => {
                    warn!(
                        backend = backend.name(),
                        key = %key,
                        kind,
                        failure = %failure,
                        "an unfamiliar instance could not be cleaned; serving it anyway (failed_cleanup = keep)"
                    );
                    inner.state().remember(key, kind, index, &id);
                    return Ok(sandbox);
                }
            }
        }
        let sandbox = backend.acquire(key, spec).await?;
        let sandbox = self
            .settle_acquired(key, kind, index, sandbox, &watch, &mut gate)
            .await?;
        inner
            .state()
            .remember(key, kind, index, sandbox.instance_id());
        Ok(sandbox)
    }

    /// Rules 39.7 and 39.8: an instance acquired while the key turned unclean is disposed of; so is one
    /// with an empty id. "Turned unclean" includes a disposal that started and landed while the backend
    /// was still acquiring: it may have missed an instance being created, which must not outlive it.
    async fn settle_acquired(
        &self,
        key: &SandboxKey,
        kind: &str,
        index: usize,
        sandbox: Arc<dyn Sandbox>,
        watch: &Watch,
        gate: &mut Option<Gate>,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let inner = &self.inner;
        let record = inner.config.failed_cleanup == FailedCleanup::Dispose;
        let id = sandbox.instance_id();
        let target = Target {
            backend: index,
            kind: Some(kind.to_owned()),
            instance_id: (!id.is_empty()).then(|| id.to_owned()),
        };
        let unclean = {
            let state = inner.state();
            state
                .unclean(key)
                .or_else(|| state.turned_unclean(watch.token).then_some(None))
        };
        if let Some(code) = unclean {
            debug!(key = %key, kind, "the key turned unclean during acquire; disposing of that instance");
            inner.cleanup(key, target, record, gate).await;
            let now = inner.state().unclean(key);
            let code = now.flatten().or(code);
            return Err(SandboxError::Unclean { code });
        }
        if id.is_empty() {
            let name = inner.backends[index].name().to_owned();
            // Best effort: the outcome is logged, never written to the ledger.
            if let Some(failure) = inner.cleanup(key, target, false, gate).await {
                warn!(backend = %name, key = %key, kind, failure = %failure,
                    "could not dispose of an instance with an empty id");
            }
            return Err(SandboxError::ContractViolation(format!(
                "backend {name:?} returned an empty instance id for kind {kind:?}"
            )));
        }
        Ok(sandbox)
    }

    /// Disposes of every sandbox of `key` on every registered backend (those below the floor included),
    /// each bounded by `cleanup_timeout`. Failures are prefixed with `"<backend>: "` and folded; backends
    /// that succeeded forget their instances and clear their pending targets; the key is clean again when
    /// nothing remains pending. Never raises and never panics.
    ///
    /// # Cancel safety
    /// The key is marked unclean before the first await. The disposals and the ledger update run in a
    /// spawned task: dropping the future stops the wait, never the disposal.
    pub async fn dispose(&self, key: &SandboxKey) -> Option<DisposalFailure> {
        let targets: Vec<Target> = (0..self.inner.backends.len()).map(Target::sweep).collect();
        let results = self
            .inner
            .run_disposals(key, targets, self.inner.config.cleanup_timeout, true)
            .await;
        DisposalFailure::fold(results.into_iter().filter_map(|(_, f)| f))
    }

    /// Disposes of one kind of `key` (one instance of it with `instance_id`) on the backend(s) that served
    /// the kind, or on every backend when none is known, each bounded by `timeout`. Returns whether every
    /// disposal landed.
    ///
    /// An expired bound is `DisposalFailure(timeout, "disposal exceeded its <n> s bound")`. A failure marks
    /// a conversation key unclean (unless [`FailedCleanup::Keep`]).
    ///
    /// # Cancel safety
    /// As [`dispose`](Self::dispose): the disposals and the ledger update run in a spawned task.
    pub async fn dispose_kind(
        &self,
        key: &SandboxKey,
        kind: &str,
        instance_id: Option<&str>,
        timeout: Duration,
    ) -> bool {
        let targets = self.inner.targets_for_kind(key, Some(kind), instance_id);
        let results = self.inner.run_disposals(key, targets, timeout, true).await;
        results.iter().all(|(_, f)| f.is_none())
    }

    /// Disposes of a call-scoped key's sandboxes, each disposal bounded by `timeout`. Returns whether every
    /// disposal landed; writes nothing to the ledger.
    ///
    /// [`SandboxError::InvalidArgument`] when the key names no call, or when the backend that served it
    /// (or, for a key this router never served, every backend) does not declare the `call` scope.
    ///
    /// # Cancel safety
    /// As [`dispose`](Self::dispose): the disposals run in a spawned task.
    pub async fn dispose_call(
        &self,
        key: &SandboxKey,
        timeout: Duration,
    ) -> Result<bool, SandboxError> {
        if !key.is_call() {
            return Err(SandboxError::invalid(
                "dispose_call needs a key that names a call (a non-empty call_id)",
            ));
        }
        let inner = &self.inner;
        let serving = inner.state().served_by(key, None);
        let targets: Vec<usize> = if serving.is_empty() {
            (0..inner.backends.len())
                .filter(|&i| {
                    inner.backends[i]
                        .declarations()
                        .serves_scope(IsolationScope::Call)
                })
                .collect()
        } else {
            if let Some(&i) = serving.iter().find(|&&i| {
                !inner.backends[i]
                    .declarations()
                    .serves_scope(IsolationScope::Call)
            }) {
                return Err(SandboxError::invalid(format!(
                    "backend {:?} does not declare the call scope",
                    inner.backends[i].name()
                )));
            }
            serving.into_iter().collect()
        };
        if targets.is_empty() {
            return Err(SandboxError::invalid(format!(
                "no registered backend declares the call scope (registered: {})",
                quoted_names(inner.backends.iter().map(|b| b.name()))
            )));
        }
        let targets = targets.into_iter().map(Target::sweep).collect();
        let results = inner.run_disposals(key, targets, timeout, false).await;
        Ok(results.iter().all(|(_, f)| f.is_none()))
    }

    /// Retries what keeps a conversation key unclean, each disposal bounded by `timeout`: the given kind
    /// (and instance) on the backend(s) that served it, else the key's pending targets, else a sweep of
    /// every backend. Returns whether everything landed and the key is clean.
    ///
    /// [`SandboxError::InvalidArgument`] for a call key (call keys are never unclean).
    ///
    /// # Cancel safety
    /// As [`dispose`](Self::dispose): the disposals and the ledger update run in a spawned task.
    pub async fn dispose_unclean(
        &self,
        key: &SandboxKey,
        kind: Option<&str>,
        instance_id: Option<&str>,
        timeout: Duration,
    ) -> Result<bool, SandboxError> {
        if key.is_call() {
            return Err(SandboxError::invalid(
                "dispose_unclean takes a conversation key; call keys are never unclean",
            ));
        }
        let inner = &self.inner;
        let targets = if kind.is_some() || instance_id.is_some() {
            inner.targets_for_kind(key, kind, instance_id)
        } else {
            let pending = inner.state().failed_targets(key);
            if pending.is_empty() {
                (0..inner.backends.len()).map(Target::sweep).collect()
            } else {
                pending
            }
        };
        let results = inner.run_disposals(key, targets, timeout, true).await;
        Ok(results.iter().all(|(_, f)| f.is_none()) && inner.state().unclean(key).is_none())
    }

    /// Disposes of every sandbox of a conversation on every registered backend, whoever created them, each
    /// bounded by `cleanup_timeout`. Counts are summed; failures are prefixed with `"<backend>: "` and
    /// folded. Backends that succeeded forget the conversation's instances and clear their pending targets;
    /// a failure marks the conversation's known keys unclean (unless [`FailedCleanup::Keep`]). While it
    /// runs, acquires in the conversation are refused as unclean. Never raises and never panics.
    ///
    /// # Cancel safety
    /// The disposals and the ledger update run in a spawned task: dropping the future stops the wait, never
    /// the purge.
    pub async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        let inner = Arc::clone(&self.inner);
        inner.state().purge_begin(scope, thread_id);
        let marker = PurgeMarker {
            inner: Arc::clone(&inner),
            scope: scope.to_owned(),
            thread_id: thread_id.to_owned(),
        };
        let (scope, thread_id) = (scope.to_owned(), thread_id.to_owned());
        let bound = inner.config.cleanup_timeout;
        let record = inner.config.failed_cleanup == FailedCleanup::Dispose;
        let operation = async move {
            let _marker = marker;
            let futures: Vec<BoxFuture<ScopePurge>> = inner
                .backends
                .iter()
                .map(|b| {
                    Box::pin(purge_one(
                        Arc::clone(b),
                        scope.clone(),
                        thread_id.clone(),
                        bound,
                    )) as BoxFuture<ScopePurge>
                })
                .collect();
            let reports = join_all(futures).await;
            let mut state = inner.state();
            for (index, report) in reports.iter().enumerate() {
                state.purge_settle(
                    &scope,
                    &thread_id,
                    index,
                    report.undisposed.as_ref(),
                    record,
                );
            }
            drop(state);
            ScopePurge {
                disposed: reports
                    .iter()
                    .fold(0u32, |n, r| n.saturating_add(r.disposed)),
                undisposed: DisposalFailure::fold(reports.into_iter().filter_map(|r| r.undisposed)),
            }
        };
        detached(operation).await.unwrap_or_else(|_| ScopePurge {
            disposed: 0,
            undisposed: Some(DisposalFailure::new(
                DisposalCode::Unknown,
                "the scope purge did not run to its end (no tokio runtime, a panic, or a runtime shutting down)",
            )),
        })
    }

    /// Marks a conversation key unclean for reasons the host knows better than the router; `target` names
    /// what is left behind (`None`: everything of the key on every backend). A call key is a no-op.
    /// Written whatever the [`FailedCleanup`] policy.
    pub fn mark_unclean(
        &self,
        key: &SandboxKey,
        reason: DisposalFailure,
        target: Option<UncleanTarget>,
    ) {
        if key.is_call() {
            debug!(key = %key, "mark_unclean on a call key is a no-op");
            return;
        }
        let backends = &self.inner.backends;
        let targets: Vec<Target> = match target {
            None => (0..backends.len()).map(Target::sweep).collect(),
            Some(t) => {
                let mut named: Vec<usize> = (0..backends.len())
                    .filter(|&i| backends[i].name() == t.backend)
                    .collect();
                if named.is_empty() {
                    warn!(backend = %t.backend, "mark_unclean names no registered backend; targeting every backend");
                    named = (0..backends.len()).collect();
                }
                named
                    .into_iter()
                    .map(|backend| Target {
                        backend,
                        kind: t.kind.clone(),
                        instance_id: t.instance_id.clone(),
                    })
                    .collect()
            }
        };
        self.inner.state().record(key, &targets, reason);
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // No update leaves the state half-written across a panic point, so a poisoned lock is still sound.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admission and selection: the index of the backend that serves `spec`.
    fn route(&self, spec: &SandboxSpec) -> Result<usize, SandboxError> {
        if self.candidates.is_empty() {
            return Err(no_backend("no backend is registered".to_owned()));
        }
        if let Some(refusal) = spec_level(
            spec.egress(),
            spec.egress_allow().is_empty(),
            &spec.required_capabilities(),
            &self.config.denied_capabilities,
        ) {
            return Err(refusal.into_error());
        }
        let host = HostPolicy {
            min_isolation: self.config.min_isolation,
            min_isolation_scope: self.config.min_isolation_scope,
        };
        let mut refusals = Vec::new();
        for &index in &self.candidates {
            let backend = &self.backends[index];
            let offer = Offer {
                name: backend.name(),
                isolation: backend.isolation(),
                declarations: backend.declarations(),
            };
            match backend_refusal(&offer, &host, spec) {
                None => return Ok(index),
                Some(refusal) => refusals.push((backend.name(), refusal)),
            }
        }
        match compose(refusals) {
            Some(refusal) => Err(refusal.into_error()),
            None => Err(no_backend("no backend is registered".to_owned())),
        }
    }

    /// Targets of a kind: the backends that served it for `key`, else every backend.
    fn targets_for_kind(
        &self,
        key: &SandboxKey,
        kind: Option<&str>,
        instance_id: Option<&str>,
    ) -> Vec<Target> {
        let served = self.state().served_by(key, kind);
        let backends: BTreeSet<usize> = if served.is_empty() {
            (0..self.backends.len()).collect()
        } else {
            served
        };
        backends
            .into_iter()
            .map(|backend| Target {
                backend,
                kind: kind.map(str::to_owned),
                instance_id: instance_id.map(str::to_owned),
            })
            .collect()
    }

    /// A host-requested disposal: markers placed now, then the disposals (under the key's disposal lock)
    /// and the ledger update in a task the caller cannot cancel.
    async fn run_disposals(
        self: &Arc<Self>,
        key: &SandboxKey,
        targets: Vec<Target>,
        bound: Duration,
        write_ledger: bool,
    ) -> Vec<(Target, Option<DisposalFailure>)> {
        let record = write_ledger && self.config.failed_cleanup == FailedCleanup::Dispose;
        let token = if write_ledger {
            self.state().begin(key, &targets)
        } else {
            None
        };
        let mut guard = SettleGuard {
            inner: Arc::clone(self),
            key: key.clone(),
            token,
            targets: targets.clone(),
            record,
            settled: false,
        };
        let inner = Arc::clone(self);
        let key = key.clone();
        let fallback = targets.clone();
        let operation = async move {
            let _lock = inner.disposal_locks.lock(key.clone()).await;
            let futures: Vec<BoxFuture<Option<DisposalFailure>>> = targets
                .iter()
                .map(|t| {
                    Box::pin(dispose_one(
                        Arc::clone(&inner.backends[t.backend]),
                        key.clone(),
                        t.clone(),
                        bound,
                    )) as BoxFuture<Option<DisposalFailure>>
                })
                .collect();
            let reports = join_all(futures).await;
            let results: Vec<(Target, Option<DisposalFailure>)> =
                targets.into_iter().zip(reports).collect();
            guard.settle(&results);
            results
        };
        detached(operation).await.unwrap_or_else(|_| {
            let unknown = DisposalFailure::new(
                DisposalCode::Unknown,
                "the disposal did not run to its end (no tokio runtime, a panic, or a runtime shutting down)",
            );
            fallback
                .into_iter()
                .map(|t| (t, Some(unknown.clone())))
                .collect()
        })
    }

    /// A cleanup the router runs itself (adoption, an instance acquired while the key turned unclean, an
    /// empty-id instance): bounded by `cleanup_timeout`, in a task the caller cannot cancel, which holds
    /// the acquire gate until it is over and hands it back; a failure is recorded when `record`.
    async fn cleanup(
        self: &Arc<Self>,
        key: &SandboxKey,
        target: Target,
        record: bool,
        gate: &mut Option<Gate>,
    ) -> Option<DisposalFailure> {
        let held = gate.take();
        let mut guard = SettleGuard {
            inner: Arc::clone(self),
            key: key.clone(),
            token: None,
            targets: vec![target.clone()],
            record,
            settled: false,
        };
        let backend = Arc::clone(&self.backends[target.backend]);
        let bound = self.config.cleanup_timeout;
        let key = key.clone();
        let operation = async move {
            let failure = dispose_one(backend, key, target.clone(), bound).await;
            guard.settle(&[(target, failure.clone())]);
            (failure, held)
        };
        match detached(operation).await {
            Ok((failure, held)) => {
                *gate = held;
                failure
            }
            Err(Detached) => Some(DisposalFailure::new(
                DisposalCode::Unknown,
                "the cleanup did not run to its end (no tokio runtime, a panic, or a runtime shutting down)",
            )),
        }
    }
}

/// Settles a disposal's ledger markers exactly once; if the operation never reached its end (a panic, or
/// a runtime shutting down), the outcome is unknown and each target is settled as failed.
struct SettleGuard {
    inner: Arc<Inner>,
    key: SandboxKey,
    token: Option<u64>,
    targets: Vec<Target>,
    record: bool,
    settled: bool,
}

impl SettleGuard {
    fn settle(&mut self, results: &[(Target, Option<DisposalFailure>)]) {
        self.inner
            .state()
            .settle(&self.key, self.token, results, self.record);
        self.settled = true;
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        if !self.settled {
            let unknown =
                DisposalFailure::new(DisposalCode::Unknown, "the disposal did not complete");
            let results: Vec<(Target, Option<DisposalFailure>)> = self
                .targets
                .iter()
                .map(|t| (t.clone(), Some(unknown.clone())))
                .collect();
            self.inner
                .state()
                .settle(&self.key, self.token, &results, self.record);
        }
    }
}

/// Watches a key for the length of one acquire, and stops however the acquire ends (a dropped future
/// included).
struct Watch {
    inner: Arc<Inner>,
    token: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.inner.state().unwatch(self.token);
    }
}

/// Ends a conversation's in-flight purge mark however the purge ends.
struct PurgeMarker {
    inner: Arc<Inner>,
    scope: String,
    thread_id: String,
}

impl Drop for PurgeMarker {
    fn drop(&mut self) {
        self.inner.state().purge_end(&self.scope, &self.thread_id);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A detached future did not complete: it panicked, its runtime cancelled it, or there was no tokio
/// runtime to run it on.
struct Detached;

/// Runs `future` to completion whether or not the caller keeps waiting, spawned on the current tokio
/// runtime (a panic inside becomes `Err`). With no runtime the future is not run at all and the result is
/// `Err`: run in place, a drop could cancel it, and its timers would panic.
async fn detached<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
) -> Result<T, Detached> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.spawn(future).await.map_err(|_| Detached),
        Err(_) => {
            warn!("no tokio runtime: a router cleanup could not run");
            Err(Detached)
        }
    }
}

/// Polls every future concurrently and returns their outputs in order.
async fn join_all<T>(futures: Vec<BoxFuture<T>>) -> Vec<T> {
    let mut slots: Vec<Option<BoxFuture<T>>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = slots.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut waiting = false;
        for (slot, output) in slots.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(outputs.iter_mut().filter_map(Option::take).collect())
        }
    })
    .await
}

/// One backend disposal, bounded, in its own task (so a panicking backend is a failure, not a crash), its
/// failure prefixed with the backend's name.
async fn dispose_one(
    backend: Arc<dyn SandboxBackend>,
    key: SandboxKey,
    target: Target,
    bound: Duration,
) -> Option<DisposalFailure> {
    let name = backend.name().to_owned();
    let selector = target.selector();
    let outcome =
        detached(async move { tokio::time::timeout(bound, backend.dispose(&key, selector)).await })
            .await;
    let failure = match outcome {
        Ok(Ok(report)) => report,
        Ok(Err(_elapsed)) => Some(DisposalFailure::new(
            DisposalCode::Timeout,
            format!("disposal exceeded its {} s bound", secs(bound)),
        )),
        Err(Detached) => Some(DisposalFailure::new(
            DisposalCode::Unknown,
            "the disposal panicked or was cancelled",
        )),
    };
    failure.map(|f| f.prefixed(&format!("{name}: ")))
}

/// One backend's `dispose_scope`, bounded and isolated like [`dispose_one`].
async fn purge_one(
    backend: Arc<dyn SandboxBackend>,
    scope: String,
    thread_id: String,
    bound: Duration,
) -> ScopePurge {
    let name = backend.name().to_owned();
    let outcome = detached(async move {
        tokio::time::timeout(bound, backend.dispose_scope(&scope, &thread_id)).await
    })
    .await;
    let mut purge = match outcome {
        Ok(Ok(purge)) => purge,
        Ok(Err(_elapsed)) => ScopePurge {
            disposed: 0,
            undisposed: Some(DisposalFailure::new(
                DisposalCode::Timeout,
                format!("scope disposal exceeded its {} s bound", secs(bound)),
            )),
        },
        Err(Detached) => ScopePurge {
            disposed: 0,
            undisposed: Some(DisposalFailure::new(
                DisposalCode::Unknown,
                "the scope disposal panicked or was cancelled",
            )),
        },
    };
    purge.undisposed = purge.undisposed.map(|f| f.prefixed(&format!("{name}: ")));
    purge
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_printed_as_people_write_them() {
        assert_eq!(secs(Duration::from_secs(30)), "30");
        assert_eq!(secs(Duration::from_millis(500)), "0.5");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5");
    }

    #[tokio::test]
    async fn join_all_keeps_order() {
        let futures: Vec<BoxFuture<u32>> = vec![
            Box::pin(async {
                tokio::task::yield_now().await;
                1
            }),
            Box::pin(async { 2 }),
        ];
        assert_eq!(join_all(futures).await, vec![1, 2]);
        assert!(join_all::<u8>(Vec::new()).await.is_empty());
    }

    #[tokio::test]
    async fn a_panicking_detached_task_is_an_error_not_a_crash() {
        let outcome = detached(async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            1u8
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(detached(async { 7u8 }).await.ok(), Some(7));
    }
}
