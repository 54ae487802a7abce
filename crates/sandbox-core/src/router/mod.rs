//! The router: refuses any backend below the host's isolation floor, admits specs against the backends'
//! declarations, serialises acquires per identity, adopts or disposes of instances it does not know, keeps
//! the unclean ledger, and fans disposals out to every registered backend.
//!
//! # Runtime
//! The async methods run on tokio and need its time driver (as `#[tokio::main]` and `#[tokio::test]`
//! provide). Cleanups that protect a guarantee are spawned on the current runtime, so dropping a caller's
//! future stops the wait but never the cleanup. Polled outside a tokio runtime, a disposal runs nothing
//! and reports an `unknown` failure (the key is marked unclean); it never panics.
//!
//! # Layout
//! This module holds the router, its construction and the admission entry points; `acquire` the acquire
//! path (gates, adoption); `disposal` every disposal and the cleanups the router runs itself;
//! `snapshot` reset, fork and the cleanup between two uses, through the backend that served the
//! sandbox.
//! `admission` (the refusal rules), `config` and `ledger` (remembered instances and the unclean ledger)
//! are their building blocks; the per-key locks and the detached tasks are the ones every backend uses
//! ([`crate::backend_kit`]).

mod acquire;
mod admission;
mod config;
mod disposal;
mod ledger;
mod snapshot;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tracing::warn;

pub use config::{BackendSelection, FailedCleanup, RouterConfig, DEFAULT_CLEANUP_TIMEOUT};
pub use disposal::UncleanTarget;
pub use snapshot::Cleaned;

use crate::backend_kit::{LockGuard, LockTable};
use admission::{backend_refusal, compose, spec_level, HostPolicy, Offer};
use ledger::State;

/// The acquire gate of one (key, kind).
type Gate = LockGuard<(SandboxKey, String)>;

use crate::{
    DisposalFailure, IsolationScope, SandboxBackend, SandboxError, SandboxKey, SandboxSpec,
};

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
    /// 1. [`BackendSelection::Fixed`] with no backends gives a router with no candidate
    ///    ([`enabled`](Self::enabled) is false; every acquire is [`SandboxError::NoBackend`]);
    /// 2. [`BackendSelection::PerSpec`] together with `selected` → [`SandboxError::InvalidArgument`]; so is a zero
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
        if let (BackendSelection::PerSpec, Some(selected)) = (config.selection, &config.selected) {
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
            BackendSelection::Fixed if backends.is_empty() => Vec::new(),
            BackendSelection::Fixed => {
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
            BackendSelection::PerSpec => {
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

    /// Runs the admission checks without acquiring anything, in the order of
    /// `docs/architecture.md#the-contract-in-one-page`: [`SandboxError::NoBackend`] with no
    /// candidate, then for the spec an allowlist with nothing allowed → InvalidArgument and a denied
    /// capability → CapabilityDenied, then per backend the floor → NotPermitted, capabilities and
    /// egress method tokens → CapabilityNotSupported, the OS family → OsFamilyNotSupported, transfer
    /// limits → TransferLimitsNotPermitted, the egress mode → EgressNotEnforced, the isolation scope
    /// → ScopeNotEnforced. The first refusal wins.
    ///
    /// With [`BackendSelection::PerSpec`] and no candidate serving, the first candidate's refusal is returned
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
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // No update leaves the state half-written across a panic point, so a poisoned lock is still sound.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The effective isolation scope of `spec`, which `key` must match: `call` needs a call id,
    /// `conversation` must not have one.
    fn scope_for(
        &self,
        spec: &SandboxSpec,
        key: &SandboxKey,
    ) -> Result<IsolationScope, SandboxError> {
        let scope =
            IsolationScope::effective(self.config.min_isolation_scope, spec.isolation_scope());
        match (scope, key.is_call()) {
            (IsolationScope::Call, false) => Err(SandboxError::invalid(
                "the effective isolation scope is call, but the key has no call_id",
            )),
            (IsolationScope::Conversation, true) => Err(SandboxError::invalid(format!(
                "the effective isolation scope is conversation, but the key names call {:?}",
                key.call_id
            ))),
            _ => Ok(scope),
        }
    }

    /// Admission of `spec` by one backend, as [`route`](Self::route) would judge it.
    fn admits(&self, index: usize, spec: &SandboxSpec) -> Result<(), SandboxError> {
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
        let backend = &self.backends[index];
        let offer = Offer {
            name: backend.name(),
            isolation: backend.isolation(),
            declarations: backend.declarations(),
        };
        match backend_refusal(&offer, &host, spec) {
            None => Ok(()),
            Some(refusal) => Err(refusal.into_error()),
        }
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
}
