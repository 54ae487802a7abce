//! The microVM sandbox backend: one Docker Sandboxes (`sbx`) microVM per (key, kind).
//!
//! Scope: [`SbxBackend`] implements the core's [`SandboxBackend`](sandbox_core::SandboxBackend)
//! over the `sbx` CLI, driven by the typed, bounded `sbx-cli` driver. Commands run through the
//! exec wrapper's sbx shape (`unshare`, then `bind` / `run`): each command binds the sandbox's one
//! workspace mount again at the storage base's parent (`/maf-sandbox` by default) inside its own
//! user and mount namespace, checks the workspace marker, then runs. File operations are answered
//! on the **host** side of that mount by `confined-fs` (no round trip to the VM); `remove` and
//! `reclaim` run in the guest with the guest's own authority.
//!
//! Ownership lives in the name (digests of the key and kind; sbx has no labels) and in a
//! directory of that name under the workspace root holding the record `meta.json` and the
//! workspace generation `ws-…`. Disposal reads both, so it works from another process and when
//! the daemon has lost its engine and lists nothing.
//!
//! # Example
//!
//! ```no_run
//! use backend_sbx::{SbxBackend, SbxConfig};
//! use sandbox_core::{Command, DisposeSelector, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
//!
//! # async fn run() -> Result<(), sandbox_core::SandboxError> {
//! let backend = SbxBackend::connect(SbxConfig::default()).await?;
//! let key = SandboxKey::conversation("tenant", "thread-1", "agent");
//! let sandbox = backend.acquire(&key, &SandboxSpec::builder("shell").build()?).await?;
//! sandbox.write_file("notes.txt", b"hello", ".").await?;
//! let out = sandbox.exec(ExecRequest::new(Command::argv(["cat", "notes.txt"]))).await?;
//! assert_eq!(out.stdout, b"hello");
//! assert!(backend.dispose(&key, DisposeSelector::all()).await.is_none());
//! # Ok(()) }
//! ```
//!
//! The configuration is checked without any engine (this runs):
//!
//! ```
//! use backend_sbx::SbxConfig;
//! let mut config = SbxConfig::default();
//! config.name_prefix = "Not Valid".into();
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! let refused = rt.block_on(backend_sbx::SbxBackend::connect(config)).unwrap_err();
//! assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidArgument);
//! ```
//!
//! # Threat model
//!
//! The guest is hostile: it writes its workspace concurrently with the host (links, renames,
//! FIFOs, case aliases), so every host-side file operation walks without following links and
//! checks names verbatim (`confined-fs`). The host's own settings are checked on every acquire
//! (SSH agent forwarding off, no MCP server registered), read and never written, and every new
//! sandbox must lack an agent socket. Guest environment values travel in a per-call 0600 env
//! file in the workspace, never in any process's argv; `sbx exec` clients get the management
//! environment without secret-looking names. Every `sbx` call has a deadline and an output
//! budget; a command past its deadline is killed by a second call, and an instance whose kill
//! did not land is retired (persisted in its record) so no process reuses it. Each call runs in
//! its own PID namespace where the guest can make one, and the kill ends every process in it;
//! elsewhere it reaches the command's process group only (docs/wrapper-protocol.md).
//!
//! # What it does not do
//!
//! - Egress allowlists: only closed egress (`--deny-network "**"`); an allowlist spec is
//!   refused with EgressNotEnforced.
//! - The egress verification preflight and the call isolation scope.
//! - POSIX modes on Windows hosts: there the workspace root keeps the ACL it inherits (the user
//!   profile's, under the default `%LOCALAPPDATA%` root) instead of being set to 0700.
//! - `sbx-sim` is not isolation: it is accepted only with `simulator_ok`, and then declares
//!   the `container` rung.
//! - Background processes never survive between calls (sbx stops an idle VM after 30 s, and
//!   each command has its own mount namespace).
//! - `sbx rm` takes only a name: a disposal by instance checks the id in `ls` first, and a
//!   process that replaces the sandbox in between loses the replacement.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod acquire;
mod backend;
mod config;
mod disposal;
mod engine;
mod guest_scripts;
mod handle;
mod host;
mod host_plane;
mod layout;

pub use backend::SbxBackend;
pub use config::{
    default_workspace_root, Platform, SbxConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CPUS,
    DEFAULT_CREATE_TIMEOUT, DEFAULT_EXEC_CLEANUP_TIMEOUT, DEFAULT_MEMORY, WORKSPACE_DIR_NAME,
};

/// The backend's name.
pub const BACKEND_NAME: &str = "docker-sbx";

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
