//! The contract between AI agent hosts and sandbox backends.
//!
//! `sandbox-core` owns the vocabulary every backend and host shares (isolation rungs, egress modes,
//! capabilities, keys, specs, exec requests, outputs and streams, disposal reports), the [`Sandbox`] and
//! [`SandboxBackend`] traits, the [`Router`] that refuses any backend below the host's isolation floor,
//! and the pure helpers both backends share: guest-path confinement, storage-base planning, name and label
//! digests, and the host-hygiene lists (secret-looking environment names, credential paths).
//!
//! It does **no I/O**: it never starts a process, opens a file or talks to an engine. Backends do that.
//!
//! # Layout
//!
//! The crate root holds the vocabulary most callers need: the traits, the [`Router`], specs, keys, exec
//! requests and outputs, disposal reports and the error type. The shared pure helpers live in public
//! modules, reached by path:
//!
//! - [`guest_path`]: guest-path normal form and confinement; a [`guest_path::Access`] applies the rules
//!   of one file method (`Access::Write.check(stat, path, wd)`).
//! - [`naming`]: names and digests, byte-identical across hosts: [`naming::docker`] (container names and
//!   labels) and [`naming::sbx`] (sandbox names).
//! - [`storage_base`]: which directories of a storage base to create.
//! - [`credential_paths`]: the credential paths a host never exposes, and the matchers over them.
//! - [`host_paths`]: the one policy over host paths a host reads for a sandbox or writes with its bytes
//!   (credentials, paths a host executes, backends' host state, an output root).
//! - [`host_tool_run`]: a command run with host tools over any backend's streamed exec (the
//!   relay in the guest, the calls served by `host-tools`).
//! - [`program_run`]: the program channel: a Python program (`python-portable-v1`) run with host
//!   tools, the interpreter checked first and its declared output files collected.
//! - [`hygiene`]: the secret-looking environment-name denylist.
//! - [`egress`]: the egress modes (also at the root) and the allowlist grammar's validators.
//! - [`credential`]: credential grants a host attaches at acquire (their tokens never printed), and
//!   the egress decisions a backend reports to an observer.
//! - [`backend_kit`]: what only a backend author needs: the producer end of an exec stream, the
//!   per-name lock table, and cleanups that finish when the caller's future is dropped.
//! - `testing` (feature `testing`): an in-memory fake backend for tests of hosts and of the router.
//!
//! # Example
//!
//! ```
//! use sandbox_core::{Capability, Egress, Isolation, SandboxSpec};
//!
//! let spec = SandboxSpec::builder("python")
//!     .image("debian:bookworm")
//!     .require(Capability::FilesOut)
//!     .build()
//!     .expect("a valid spec");
//! assert_eq!(spec.egress(), Egress::Closed);
//! assert!(spec.required_capabilities().contains(&Capability::Exec));
//! assert!(Isolation::Microvm.meets_floor(Some(Isolation::Container)));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
pub mod backend_kit;
mod capability;
mod cleanup;
pub mod credential;
pub mod credential_paths;
mod declarations;
mod disposal;
pub mod egress;
mod entry;
mod error;
mod exec;
mod exec_stream;
pub mod guest_path;
mod health;
pub mod host_paths;
pub mod host_tool_run;
pub mod hygiene;
mod isolation;
mod key;
mod limits;
pub mod naming;
pub mod program_run;
mod router;
mod spec;
pub mod storage_base;
#[cfg(feature = "testing")]
pub mod testing;
mod wire;

pub use backend::{Sandbox, SandboxBackend, SandboxState, SandboxSummary};
pub use capability::Capability;
pub use cleanup::CleanupRung;
pub use declarations::BackendDeclarations;
pub use disposal::{DisposalCode, DisposalFailure, DisposeSelector, ScopePurge};
pub use egress::{Egress, EgressEntry, EgressRule};
pub use entry::{EntryKind, SandboxEntry};
pub use error::{BoxError, ErrorKind, GuestCleanup, ParseError, Result, SandboxError};
pub use exec::{
    Command, ExecEnv, ExecOutput, ExecRequest, DEFAULT_MAX_OUTPUT_BYTES, WORKDIR_UNUSABLE_EXIT,
};
pub use exec_stream::{
    ExecChunk, ExecEvent, ExecExit, ExecStdin, ExecStream, MAX_CHUNK_BYTES, STREAM_BUFFER_CHUNKS,
};
pub use health::{CheckStatus, HealthCheck};
pub use isolation::{Isolation, IsolationScope, OsFamily};
pub use key::SandboxKey;
pub use limits::{SandboxLimits, TransferLimits, DEFAULT_TRANSFER_LIMITS};
pub use router::{
    BackendSelection, Cleaned, FailedCleanup, Router, RouterConfig, UncleanTarget,
    DEFAULT_CLEANUP_TIMEOUT,
};
pub use spec::{SandboxSpec, SandboxSpecBuilder, DEFAULT_WORK_DIR, MAX_CREDENTIALS};

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
