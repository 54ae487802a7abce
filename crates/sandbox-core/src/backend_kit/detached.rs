//! Cleanups that finish even when the caller's future is dropped.
//!
//! A cleanup that protects a guarantee (the kill of an expired command, the removal of a half-made
//! sandbox, the unpause of a paused one, a disposal's ledger settlement) must not stop because the
//! caller stopped waiting. Each helper here runs its work in a task of its own on the current tokio
//! runtime, where no caller's drop reaches it:
//!
//! - [`run_detached`]: run now and wait for the result; dropping the wait does not stop the work;
//! - [`spawn_detached`]: run now, nobody waits;
//! - [`CleanupOnDrop`]: armed before a risky step, disarmed after it succeeded; dropped armed, the
//!   cleanup is spawned.
//!
//! Not here: bounding the work's time (the caller wraps it in its own deadline) and retrying it.
//! Outside a tokio runtime nothing can run detached: the work is skipped and logged, and
//! [`run_detached`] reports it, rather than running in place where a drop could cancel it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::SandboxError;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs `work` to its end in a task of its own and returns its output.
///
/// # Errors
///
/// [`SandboxError::Engine`] when the task did not reach its end: it panicked, the runtime was
/// shutting down, or there was no tokio runtime to run it on (then it never ran).
///
/// # Cancel safety and drop
///
/// Dropping the returned future stops the wait, never the work.
pub async fn run_detached<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, SandboxError> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime
            .spawn(work)
            .await
            .map_err(|e| not_finished(&e.to_string())),
        Err(_) => {
            tracing::error!("no tokio runtime to run a cleanup on; it was skipped");
            Err(not_finished("no tokio runtime"))
        }
    }
}

#[cold]
fn not_finished(why: &str) -> SandboxError {
    SandboxError::engine(format!("a cleanup task did not run to its end ({why})"))
}

/// Runs `work` in a task of its own that nobody waits for. `what` names it in the log when there
/// is no tokio runtime to run it on.
pub fn spawn_detached(what: &'static str, work: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(work);
        }
        Err(_) => tracing::error!(
            cleanup = what,
            "no tokio runtime to run a cleanup on; it was skipped"
        ),
    }
}

/// A cleanup armed before a step that may leave something behind: unless disarmed or run, it is
/// spawned with [`spawn_detached`] when the guard drops, so dropping the future that armed it
/// still runs it.
///
/// ```
/// use sandbox_core::backend_kit::CleanupOnDrop;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (tx, rx) = tokio::sync::oneshot::channel();
/// let mut guard = CleanupOnDrop::armed("the removal of a half-made sandbox", async move {
///     let _ = tx.send("removed");
/// });
/// // ... a step fails, or the caller's future is dropped here ...
/// drop(guard);
/// assert_eq!(rx.await.unwrap(), "removed");
/// # }
/// ```
pub struct CleanupOnDrop<T: Send + 'static = ()> {
    what: &'static str,
    pending: Option<BoxFuture<T>>,
}

impl<T: Send + 'static> fmt::Debug for CleanupOnDrop<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupOnDrop")
            .field("what", &self.what)
            .field("armed", &self.pending.is_some())
            .finish()
    }
}

impl<T: Send + 'static> CleanupOnDrop<T> {
    /// Arms `cleanup`; `what` names it in the log if it cannot run.
    pub fn armed(what: &'static str, cleanup: impl Future<Output = T> + Send + 'static) -> Self {
        CleanupOnDrop {
            what,
            pending: Some(Box::pin(cleanup)),
        }
    }

    /// The step succeeded: the cleanup will not run.
    pub fn disarm(&mut self) {
        self.pending = None;
    }

    /// Whether the cleanup is still armed.
    pub fn is_armed(&self) -> bool {
        self.pending.is_some()
    }

    /// Runs the cleanup now with [`run_detached`] and returns its output (`None` when it was
    /// disarmed).
    ///
    /// # Errors
    ///
    /// As [`run_detached`].
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the returned future stops the wait, never the cleanup.
    pub async fn run_now(mut self) -> Result<Option<T>, SandboxError> {
        match self.pending.take() {
            Some(cleanup) => run_detached(cleanup).await.map(Some),
            None => Ok(None),
        }
    }
}

impl<T: Send + 'static> Drop for CleanupOnDrop<T> {
    fn drop(&mut self) {
        if let Some(cleanup) = self.pending.take() {
            spawn_detached(self.what, async move {
                let _ = cleanup.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_panicking_detached_task_is_an_error_not_a_crash() {
        let outcome = run_detached(async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            1u8
        })
        .await;
        assert_eq!(outcome.unwrap_err().kind(), crate::ErrorKind::Engine);
        assert_eq!(run_detached(async { 7u8 }).await.ok(), Some(7));
    }

    #[tokio::test]
    async fn a_dropped_wait_does_not_stop_the_work() {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (done, finished) = tokio::sync::oneshot::channel();
        let wait = run_detached(async move {
            let _ = released.await;
            let _ = done.send(());
        });
        // Start the work, then drop the wait before it ends.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(5), wait).await;
        release.send(()).unwrap();
        finished.await.expect("the work ran to its end");
    }

    #[test]
    fn outside_a_runtime_nothing_runs_and_the_wait_says_so() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let outcome = futures_block_on(run_detached(async move {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        assert!(outcome.is_err());
        let counter = Arc::clone(&ran);
        spawn_detached("test", async move {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    /// Polls a future that never waits (no runtime is current).
    fn futures_block_on<F: Future>(future: F) -> F::Output {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the future waited"),
        }
    }

    #[tokio::test]
    async fn a_cleanup_runs_when_dropped_armed_and_not_when_disarmed() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let counter = Arc::clone(&ran);
        drop(CleanupOnDrop::armed("test", async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(());
        }));
        rx.await.unwrap();
        let counter = Arc::clone(&ran);
        let mut disarmed = CleanupOnDrop::armed("test", async move {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert!(disarmed.is_armed());
        disarmed.disarm();
        assert!(!disarmed.is_armed());
        drop(disarmed);
        tokio::task::yield_now().await;
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn run_now_returns_the_output_once() {
        let armed = CleanupOnDrop::armed("test", async { 5u8 });
        assert_eq!(armed.run_now().await.unwrap(), Some(5));
        let mut disarmed = CleanupOnDrop::armed("test", async { 5u8 });
        disarmed.disarm();
        assert_eq!(disarmed.run_now().await.unwrap(), None);
    }
}
