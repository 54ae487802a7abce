//! Acquire: the gate per identity, the unclean check, admission, adoption of unfamiliar instances and
//! the cleanup of instances that must not be served.

use std::sync::Arc;

use tracing::{debug, info, warn};

use super::ledger::Target;
use super::{no_backend, FailedCleanup, Gate, Inner, Router};
use crate::{IsolationScope, Sandbox, SandboxError, SandboxKey, SandboxSpec};

impl Router {
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
        let watch = Watch::start(inner, key)?;
        let index = inner.route(spec)?;
        let scope = inner.scope_for(spec, key)?;
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

    /// An instance acquired while the key turned unclean is disposed of, and so is one with an empty
    /// id. "Turned unclean" includes a disposal that started and landed while the backend
    /// was still acquiring: it may have missed an instance being created, which must not outlive it.
    pub(super) async fn settle_acquired(
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
}

/// Watches a key for the length of one acquire, and stops however the acquire ends (a dropped future
/// included).
pub(super) struct Watch {
    inner: Arc<Inner>,
    token: u64,
}

impl Watch {
    /// Refuses an unclean key, else starts watching it. Checked and watched under one lock, so
    /// nothing that makes the key unclean can slip in between.
    pub(super) fn start(inner: &Arc<Inner>, key: &SandboxKey) -> Result<Watch, SandboxError> {
        let mut state = inner.state();
        if let Some(code) = state.unclean(key) {
            return Err(SandboxError::Unclean { code });
        }
        Ok(Watch {
            token: state.watch(key),
            inner: Arc::clone(inner),
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.inner.state().unwatch(self.token);
    }
}
