//! Reset, fork and the cleanup between two uses. Each goes through the backend that served the
//! sandbox, never through admission's choice of the moment, and the router's record of instances
//! follows: a fork is remembered as an acquired sandbox is, and a reset's instance replaces the one
//! it reset, so that the next acquire of the key serves it without adoption.

use std::sync::Arc;

use tracing::debug;

use super::acquire::Watch;
use super::{Gate, Inner, Router};
use crate::{
    BackendDeclarations, Capability, CleanupRung, Sandbox, SandboxError, SandboxKey, SandboxSpec,
};

/// What [`Router::clean_between_uses`] did: the rung it applied, and what serves the next use.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Cleaned {
    /// The call's directory was removed; the same handle serves the next use.
    Reclaimed,
    /// The sandbox was returned to its state at acquire; this handle serves the next use (the
    /// one passed in may name an instance that no longer exists).
    Reset(Arc<dyn Sandbox>),
    /// The sandbox was disposed of; the next use acquires a new one.
    Disposed,
}

impl Cleaned {
    /// The rung that was applied.
    pub fn rung(&self) -> CleanupRung {
        match self {
            Cleaned::Reclaimed => CleanupRung::Reclaim,
            Cleaned::Reset(_) => CleanupRung::Reset,
            Cleaned::Disposed => CleanupRung::Dispose,
        }
    }
}

#[cold]
#[inline(never)]
fn not_served(key: &SandboxKey, what: &str) -> SandboxError {
    SandboxError::invalid(format!(
        "this router serves no {what} for {key} (never acquired through it, or disposed of or reset since)"
    ))
}

#[cold]
#[inline(never)]
fn no_snapshot(backend: &str, operation: &str) -> SandboxError {
    SandboxError::CapabilityNotSupported(format!(
        "backend {backend:?} does not declare snapshot: it cannot {operation} a sandbox"
    ))
}

#[cold]
#[inline(never)]
fn snapshot_denied(operation: &str) -> SandboxError {
    SandboxError::CapabilityDenied(format!(
        "the host denies snapshot: it cannot {operation} a sandbox"
    ))
}

impl Router {
    /// Returns `key`'s sandbox `sandbox` to its state when it was acquired, through the backend
    /// that served it ([`Sandbox::reset`]); the returned handle serves it from now on and the
    /// router remembers its instance in place of the old one.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] when this router did not serve `sandbox` for `key` (or
    /// has disposed of or reset it since); [`SandboxError::CapabilityDenied`] when the host
    /// denies `snapshot`; [`SandboxError::CapabilityNotSupported`] when the serving backend does
    /// not declare it; [`SandboxError::Unclean`] for an unclean key, or one that turned unclean
    /// while the reset ran (the reset instance is then disposed of); the backend's own failure.
    ///
    /// # Cancel safety
    /// Waits for the acquire gate of (key, kind), so a reset never overlaps an acquire, fork or
    /// another reset of that identity. Dropping the future is as dropping the backend's reset;
    /// a cleanup the router started runs to its end in a task of its own.
    pub async fn reset(
        &self,
        key: &SandboxKey,
        sandbox: &dyn Sandbox,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let inner = &self.inner;
        let id = sandbox.instance_id().to_owned();
        let (kind, index) = inner
            .state()
            .served_instance(key, &id)
            .ok_or_else(|| not_served(key, &format!("instance {id:?}")))?;
        inner.snapshot_allowed(index, "reset")?;
        let mut gate = Some(inner.gates.lock((key.clone(), kind.clone())).await);
        // Another reset or a disposal may have replaced or forgotten the instance meanwhile.
        if inner.state().served_instance(key, &id).is_none() {
            return Err(not_served(key, &format!("instance {id:?}")));
        }
        let watch = Watch::start(inner, key)?;
        let reset = sandbox.reset().await?;
        let reset = self
            .settle_acquired(key, &kind, index, reset, &watch, &mut gate)
            .await?;
        inner
            .state()
            .remember(key, &kind, index, reset.instance_id());
        debug!(key = %key, kind, from = %id, to = %reset.instance_id(), "reset");
        Ok(reset)
    }

    /// Makes a new sandbox under `target` whose files are those of `source`'s sandbox of
    /// `spec.kind()` now, through the backend that served the source
    /// ([`SandboxBackend::fork`](crate::SandboxBackend::fork)); `spec` is the one the source was
    /// acquired with. The router remembers the fork as it remembers an acquired sandbox: a later
    /// [`acquire`](Self::acquire) of `target` with `spec` serves it, and disposals of `target`
    /// reach it.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] for `target` equal to `source`, a source this router did
    /// not serve a sandbox of the kind for, or a `target` whose key does not match the spec's
    /// effective isolation scope; the serving backend's admission of `spec` (as
    /// [`ensure_can_serve`](Self::ensure_can_serve) words it); [`SandboxError::CapabilityDenied`]
    /// or [`SandboxError::CapabilityNotSupported`] for `snapshot`; [`SandboxError::Unclean`] when
    /// either key is unclean or `target` turned unclean while the fork ran (the fork is then
    /// disposed of); the backend's own refusal or failure.
    ///
    /// # Cancel safety
    /// Holds the acquire gates of both identities (taken in one order, so two forks the other way
    /// round never wait for each other forever). Dropping the future is as dropping the backend's
    /// fork; a cleanup the router started runs to its end in a task of its own.
    pub async fn fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let inner = &self.inner;
        let kind = spec.kind();
        crate::backend_kit::refuse_fork_onto_source(source, target)?;
        let index = inner
            .state()
            .served_by(source, Some(kind))
            .into_iter()
            .next()
            .ok_or_else(|| not_served(source, &format!("sandbox of kind {kind:?}")))?;
        inner.admits(index, spec)?;
        inner.snapshot_allowed(index, "fork")?;
        inner.scope_for(spec, target)?;
        let (mut gate, _source_gate) = self.gates_of(source, target, kind).await;
        if let Some(code) = inner.state().unclean(source) {
            return Err(SandboxError::Unclean { code });
        }
        let watch = Watch::start(inner, target)?;
        let backend = Arc::clone(&inner.backends[index]);
        let fork = backend.fork(source, spec, target).await?;
        let fork = self
            .settle_acquired(target, kind, index, fork, &watch, &mut gate)
            .await?;
        inner
            .state()
            .remember(target, kind, index, fork.instance_id());
        debug!(source = %source, target = %target, kind, instance = %fork.instance_id(), "forked");
        Ok(fork)
    }

    /// Applies `spec`'s [`min_cleanup`](SandboxSpec::min_cleanup) to `key`'s sandbox between two
    /// uses: the weakest rung at or above it that the serving backend declares and the host does
    /// not deny ([`CleanupRung::at_least`]). `reclaim` removes `call_dir` (relative to the
    /// storage base) within the router's `cleanup_timeout`; `reset` is [`reset`](Self::reset);
    /// `dispose` disposes of this instance of the kind, as
    /// [`dispose_kind`](Self::dispose_kind) does within `cleanup_timeout`.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] when this router did not serve `sandbox` for `key`, or
    /// served it for another kind than `spec`'s; the rung's own failure (a reclaim over its bound
    /// is [`SandboxError::Timeout`]); a disposal that did not land is [`SandboxError::Unclean`]
    /// (the key is then unclean, unless the host keeps failed cleanups). A failed rung is never
    /// replaced by a weaker one.
    ///
    /// # Cancel safety
    /// As the rung applied: a reset or a disposal the router started runs to its end.
    pub async fn clean_between_uses(
        &self,
        key: &SandboxKey,
        sandbox: &dyn Sandbox,
        spec: &SandboxSpec,
        call_dir: &str,
    ) -> Result<Cleaned, SandboxError> {
        let inner = &self.inner;
        let id = sandbox.instance_id().to_owned();
        let (kind, index) = inner
            .state()
            .served_instance(key, &id)
            .ok_or_else(|| not_served(key, &format!("instance {id:?}")))?;
        if kind != spec.kind() {
            return Err(SandboxError::invalid(format!(
                "instance {id:?} is of kind {kind:?}, the spec of kind {:?}",
                spec.kind()
            )));
        }
        let rung = CleanupRung::at_least(spec.min_cleanup(), &inner.offered(index));
        let bound = inner.config.cleanup_timeout;
        match rung {
            CleanupRung::Reclaim => {
                match tokio::time::timeout(bound, sandbox.reclaim(call_dir, ".", bound)).await {
                    Ok(done) => done.map(|()| Cleaned::Reclaimed),
                    Err(_elapsed) => Err(SandboxError::Timeout {
                        operation: "reclaim".to_owned(),
                        bound,
                        cleanup: None,
                    }),
                }
            }
            CleanupRung::Reset => self.reset(key, sandbox).await.map(Cleaned::Reset),
            CleanupRung::Dispose => {
                if self.dispose_kind(key, &kind, Some(&id), bound).await {
                    Ok(Cleaned::Disposed)
                } else {
                    Err(SandboxError::Unclean {
                        code: self.unclean_failure(key).map(|f| f.code),
                    })
                }
            }
        }
    }

    /// The acquire gates of (target, kind) and (source, kind), taken in key order; the target's
    /// first, as the one a cleanup may carry away.
    async fn gates_of(
        &self,
        source: &SandboxKey,
        target: &SandboxKey,
        kind: &str,
    ) -> (Option<Gate>, Gate) {
        let gates = &self.inner.gates;
        let (t, s) = (
            (target.clone(), kind.to_owned()),
            (source.clone(), kind.to_owned()),
        );
        if target < source {
            let t = gates.lock(t).await;
            (Some(t), gates.lock(s).await)
        } else {
            let s = gates.lock(s).await;
            (Some(gates.lock(t).await), s)
        }
    }
}

impl Inner {
    /// Refuses `operation` (reset, fork) where the host denies `snapshot` or the backend at
    /// `index` does not declare it.
    fn snapshot_allowed(&self, index: usize, operation: &str) -> Result<(), SandboxError> {
        if self
            .config
            .denied_capabilities
            .contains(&Capability::Snapshot)
        {
            return Err(snapshot_denied(operation));
        }
        let backend = &self.backends[index];
        if !backend.declarations().serves(Capability::Snapshot) {
            return Err(no_snapshot(backend.name(), operation));
        }
        Ok(())
    }

    /// The backend's declarations less the capabilities the host denies: the rungs it may use.
    fn offered(&self, index: usize) -> BackendDeclarations {
        let mut offered = self.backends[index].declarations().clone();
        offered
            .capabilities
            .retain(|c| !self.config.denied_capabilities.contains(c));
        offered
    }
}
