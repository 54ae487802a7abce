//! # bounded-process
//!
//! A host-side child process that cannot outlive its bounds: the project's short-lived child
//! processes (the `sbx` client, the image and VM-image tools, `xtask`'s steps) run through it.
//!
//! One run ([`BoundedCommand`], then [`run_bounded`] or [`run_streaming`]) is one child with:
//!
//! - **an explicit environment**: the inherited one is cleared, so nothing the host process
//!   carries (credentials, proxies, a stray `LD_PRELOAD`) reaches the child unless it is passed;
//! - **stdin closed** unless it carries bytes or a reader, written concurrently with reading;
//! - **both pipes read concurrently** against one combined output budget
//!   ([`DEFAULT_OUTPUT_BUDGET`] unless set), so a child that floods one pipe cannot block on the
//!   other or make the host buffer without end;
//! - **a deadline**, past which the child is killed;
//! - **its whole process tree killed and reaped on every early exit** (deadline, budget, a pipe
//!   error, a sink's error, a dropped future), not only the child itself;
//! - optionally **a line callback** ([`BoundedCommand::on_line`]) or **a prefix stop**
//!   ([`BoundedCommand::stop_after`]), or its output handed to an [`OutputSink`] as it arrives
//!   ([`run_streaming`]).
//!
//! ## Platforms
//!
//! It builds for Linux, macOS and Windows hosts. What differs is how it holds the child's
//! process tree:
//!
//! - **Unix** (Linux, macOS): the child starts in a process group of its own; an early exit sends
//!   SIGKILL to the group. [`ExitKind::Signaled`] reports a death by signal.
//! - **Windows**: right after the spawn the child is assigned to a new Job object, which its
//!   descendants join as they start; an early exit terminates the job. The job also kills its
//!   members when its last handle closes, so a host that dies mid-call takes the tree with it;
//!   once the child has exited normally that limit is lifted, so what it left running keeps
//!   running, as on Unix. Every end is an exit code ([`ExitKind::Exited`]). A process the child
//!   starts in the instant between its spawn and its assignment is outside the job. This is the
//!   crate's `unsafe` code, in one module.
//!
//! ## Limits
//!
//! - The tree is the child's process group (Unix): a descendant that leaves it with `setsid`,
//!   `setpgrp` or a double fork is not reached by the kill. The runner bounds a cooperating
//!   program and its helpers; it is no sandbox for a hostile one.
//! - The group is signalled only while the child is unreaped, so its id cannot have been reused
//!   by then; once the child has exited normally, what it left running is not killed.
//! - Completion needs EOF on both pipes as well as the exit: a grandchild that holds a pipe open
//!   keeps the run open until the deadline, which then kills it.
//!
//! ## What this crate does not do
//!
//! It knows no sandbox, guest, engine or wrapper protocol, and reads no output: what a program
//! printed means is the caller's business (`exec-wrapper` reads the guest wrapper's). It does not
//! retry, and it passes the child no environment the caller did not give (`PATH` included). It
//! has no dependency on any other crate of the project.
//!
//! ## Errors, cancel safety and drop
//!
//! No [`Error`] carries partial output, and on each one the child's process tree has been killed
//! and the child reaped (or handed to a background task that reaps it). Dropping a run's future
//! kills the tree at once and leaves the reaping to tokio's background orphan reaping: no call
//! ever blocks on it. See [`run_bounded`] for the details.
//!
//! ## Example
//!
//! It runs the host's `sh`, so it is Unix-only:
//!
//! ```
//! use std::time::Duration;
//! use bounded_process::{BoundedCommand, Error, ExitKind};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let output = BoundedCommand::new("sh", Duration::from_secs(10))
//!     .args(["-c", "printf '%s' \"$GREETING\"; echo oops >&2; exit 3"])
//!     .env("PATH", "/usr/local/bin:/usr/bin:/bin")
//!     .env("GREETING", "hello")
//!     .run()
//!     .await?;
//! assert_eq!(output.status, ExitKind::Exited(3));
//! assert_eq!(output.stdout, b"hello");
//! assert_eq!(output.stderr, b"oops\n");
//!
//! // A child that runs past its deadline is killed with everything it started.
//! let late = BoundedCommand::new("sh", Duration::from_millis(200))
//!     .args(["-c", "sleep 30 & wait"])
//!     .env("PATH", "/usr/local/bin:/usr/bin:/bin")
//!     .run()
//!     .await;
//! assert!(matches!(late, Err(Error::Deadline { .. })));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

#[cfg(not(any(unix, windows)))]
compile_error!("bounded-process supports Unix and Windows hosts: it ends process trees with process groups or Job objects");

mod error;
mod process_tree;
mod runner;

pub use error::{Error, Result};
pub use runner::{
    run_bounded, run_streaming, BoundedCommand, ExitKind, OutputSink, RunOutput, Stream,
    DEFAULT_OUTPUT_BUDGET, READ_CHUNK,
};

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
