//! What a backend author builds with, and a host never calls: the producer side of an exec stream,
//! the per-name lock table, and the cleanups that finish when the caller's future is dropped.
//!
//! Every backend of the workspace, and the [`Router`](crate::Router) itself, uses these, so each
//! exists once, here, below every backend (docs/architecture.md#shared-machinery). They do no I/O:
//! a lock table, a channel end and spawned tasks are tokio's sync primitives and runtime.
//!
//! - [`ExecStreamSender`] and [`SendRefused`]: the producer end of [`ExecStream::channel`], and
//!   [`collect_exec`], the collected exec of a backend whose stream is native;
//! - [`LockTable`]: per-key async locks that prune themselves (a backend's per-name locks, the
//!   router's acquire gates);
//! - [`run_detached`], [`spawn_detached`] and [`CleanupOnDrop`]: work that finishes even when
//!   the caller's future is dropped;
//! - [`refuse_fork_onto_source`]: the check of a fork's keys every `fork` makes first.
//!
//! Not here: the sink that feeds a wrapper call's output through the nonce splitter into an
//! [`ExecStreamSender`]. It needs `exec-wrapper`'s splitter, and the core depends on nothing of
//! ours, so it lives in the `wrapper-stream` crate, which sits on both.
//!
//! [`ExecStream::channel`]: crate::ExecStream::channel

mod detached;
mod fork_keys;
mod lock_table;

pub use crate::exec_stream::{collect_exec, ExecStreamSender, SendRefused};
pub use detached::{run_detached, spawn_detached, CleanupOnDrop};
pub use fork_keys::refuse_fork_onto_source;
pub use lock_table::{LockGuard, LockTable};
