//! An in-process fake backend for tests of hosts and of the router (feature `testing`).
//!
//! [`FakeBackend`] keeps its sandboxes in memory and isolates **nothing**: it declares whatever rung it is
//! told to, so tests can exercise the router's floor. Each [`FakeSandbox`] holds a map of paths to bytes
//! and applies the contract's guest-path rules (the core's [`Access`](crate::guest_path::Access) checks) to it; it has no links, so
//! link refusals never arise. `exec` runs no process: it understands a handful of words (`true`, `false`,
//! `echo`, `pwd`, `cat FILE`, and `exit N` in a shell line) or returns an output set through [`Faults`].
//! Timeouts are not simulated. Faults are injected with [`FakeBackend::update_faults`]. Where it
//! declares them ([`FakeBackend::declaring`]), `reclaim` removes a directory, `reset` replaces the
//! instance with a new one (a new id) holding only its storage base, and `fork` copies the files
//! into a new instance under the target key.
//!
//! ```
//! use std::sync::Arc;
//! use sandbox_core::testing::FakeBackend;
//! use sandbox_core::{Command, DisposalCode, ExecRequest, Isolation, SandboxBackend, SandboxKey, SandboxSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), sandbox_core::SandboxError> {
//! let fake = Arc::new(FakeBackend::new("fake", Isolation::Microvm));
//! let key = SandboxKey::conversation("s", "t", "a");
//! let sandbox = fake.acquire(&key, &SandboxSpec::builder("py").build()?).await?;
//! sandbox.write_file("greeting", b"hi", ".").await?;
//! assert_eq!(sandbox.read_file("greeting", ".", 10).await?, b"hi");
//! let out = sandbox.exec(ExecRequest::new(Command::argv(["echo", "hello"]))).await?;
//! assert_eq!(out.stdout, b"hello\n");
//!
//! fake.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
//! assert!(fake.dispose(&key, Default::default()).await.is_some());
//! # Ok(())
//! # }
//! ```
//!
//! The fake is in four parts, each importing only those after it: the backend (instances per key
//! and kind, disposal), the sandbox handle (an in-memory file tree under the contract's path
//! rules), the little shell `exec` understands (it reads files through a lookup it is handed), and
//! the injected faults both the backend and every instance read.

use std::sync::{Mutex, MutexGuard};

mod backend;
mod faults;
mod sandbox;
mod shell;
#[cfg(test)]
mod tests;

pub use backend::FakeBackend;
pub use faults::Faults;
pub use sandbox::FakeSandbox;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding a lock left consistent data behind: every update is one step.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
