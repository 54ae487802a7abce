//! Disposal: the host's disposals fanned out to every backend, the ledger markers settled exactly once,
//! and the cleanups the router runs itself; all of them in tasks the caller cannot cancel.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tracing::{debug, warn};

use super::ledger::Target;
use super::{quoted_names, secs, FailedCleanup, Gate, Inner, Router};
use crate::backend_kit::run_detached;
use crate::{
    DisposalCode, DisposalFailure, IsolationScope, SandboxBackend, SandboxError, SandboxKey,
    ScopePurge,
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

impl Router {
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
        run_detached(operation).await.unwrap_or_else(|_| ScopePurge {
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
        run_detached(operation).await.unwrap_or_else(|_| {
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
    pub(super) async fn cleanup(
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
        match run_detached(operation).await {
            Ok((failure, held)) => {
                *gate = held;
                failure
            }
            Err(_) => Some(DisposalFailure::new(
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
        run_detached(
            async move { tokio::time::timeout(bound, backend.dispose(&key, selector)).await },
        )
        .await;
    let failure = match outcome {
        Ok(Ok(report)) => report,
        Ok(Err(_elapsed)) => Some(DisposalFailure::new(
            DisposalCode::Timeout,
            format!("disposal exceeded its {} s bound", secs(bound)),
        )),
        Err(_) => Some(DisposalFailure::new(
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
    let outcome = run_detached(async move {
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
        Err(_) => ScopePurge {
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
}
