//! The two traits every backend implements.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{
    BackendDeclarations, DisposalFailure, DisposeSelector, ExecOutput, ExecRequest, ExecStdin,
    ExecStream, Isolation, SandboxEntry, SandboxError, SandboxKey, SandboxSpec, ScopePurge,
};

/// A handle to one physical sandbox instance.
///
/// Every file method takes a working directory `wd`: relative paths resolve against it, and it resolves
/// against the storage base when relative itself. Path rules are those of the core's guest-path
/// confinement: [`Access`](crate::guest_path::Access) `Write`, `Read`, `List` and `Delete`.
///
/// # Cancel safety
/// Dropping a future returned by these methods stops waiting; it never skips a cleanup that protects a
/// guarantee (the remote kill after an expired exec, the discard of a half-created sandbox): backends run
/// those in tasks the caller cannot cancel.
#[async_trait]
pub trait Sandbox: Send + Sync + std::fmt::Debug {
    /// The engine's identifier: non-empty, stable across warm acquires, new after any replacement.
    fn instance_id(&self) -> &str;

    /// True only when the acquire that returned this handle created the instance from its image.
    fn freshly_created(&self) -> bool;

    /// The storage base bound to this instance.
    fn storage_base(&self) -> &str;

    /// Runs a command. A working directory that cannot be entered yields a non-zero [`ExecOutput`]
    /// (125) whose `not_started` says why, not an error.
    /// An expired timeout is [`SandboxError::Timeout`] carrying how the guest side ended.
    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError>;

    /// Runs a command with `stdin` fed to it, its output delivered as it arrives.
    ///
    /// The request's deadline covers the whole command, as in [`exec`](Self::exec); its
    /// [`output_cap`](ExecRequest::output_cap), when set, is the stream's total: output over it
    /// is [`SandboxError::OutputLimitExceeded`] with the kill, exactly as a collected exec over
    /// its budget. Without a cap the stream has no total; the host still holds at most a few
    /// chunks (see [`ExecStream`]).
    ///
    /// The default runs the collected [`exec`](Self::exec) and streams its result once it has
    /// ended (with the collected default budget when the request sets no cap); it takes no stdin.
    ///
    /// # Errors
    /// As [`exec`](Self::exec) for what happens before the command starts; what ends it later
    /// arrives through [`ExecStream::next`]. The default refuses non-empty stdin as
    /// [`SandboxError::Unsupported`].
    ///
    /// # Cancel safety and drop
    /// Dropping the returned future, or the stream, kills the command's processes as an expired
    /// deadline does, in a task the caller cannot cancel.
    async fn exec_stream(
        &self,
        request: ExecRequest,
        stdin: ExecStdin,
    ) -> Result<ExecStream, SandboxError> {
        if !stdin.is_empty() {
            return Err(SandboxError::Unsupported(
                "this backend streams no stdin".into(),
            ));
        }
        Ok(ExecStream::from_output(self.exec(request).await?))
    }

    /// Writes exact bytes, creating missing parents; replaces, never appends; never follows a link leaf.
    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError>;

    /// Describes a path without following a link leaf; `None` when it does not exist.
    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError>;

    /// Reads a regular file of at most `max_bytes`; larger is [`SandboxError::TransferCapExceeded`], never
    /// a truncation.
    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError>;

    /// Reads at most the first `max_bytes` bytes of a regular file (`files_out`): the whole
    /// file when it is no larger, its first `max_bytes` otherwise, never an error for its size
    /// and never more than `max_bytes` moved. Every other refusal is [`read_file`](Self::read_file)'s.
    ///
    /// # Errors
    /// As [`read_file`](Self::read_file), less the size. The default refuses with
    /// [`SandboxError::Unsupported`]: a backend reads a head natively or not at all.
    async fn read_head(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        let _ = (path, wd, max_bytes);
        Err(SandboxError::Unsupported(
            "this backend does not read a file's head".into(),
        ))
    }

    /// Lists one directory level, sorted by path; links are listed as links (`files_list`).
    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        let _ = (path, wd);
        Err(SandboxError::Unsupported(
            "this backend does not declare files_list".into(),
        ))
    }

    /// Removes a path; missing is Ok; a directory needs `recursive` (`files_delete`).
    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        let _ = (path, wd, recursive);
        Err(SandboxError::Unsupported(
            "this backend does not declare files_delete".into(),
        ))
    }

    /// Removes a call's directory and everything under it within `timeout` (`reclaim`).
    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        let _ = (directory, wd, timeout);
        Err(SandboxError::Unsupported(
            "this backend does not declare reclaim".into(),
        ))
    }

    /// Returns the sandbox to its state when it was acquired, under the same key (`snapshot`):
    /// every file made or changed since, and every process started since, is gone; the image's
    /// files and the storage base are as the acquire left them.
    ///
    /// The returned handle serves the reset sandbox. A backend may reset in place (the same
    /// instance id) or replace the instance (a new id, as after any replacement); after a
    /// replacement this handle names an instance that no longer exists.
    ///
    /// # Errors
    /// The default refuses with [`SandboxError::CapabilityNotSupported`]: a backend declares
    /// `snapshot` only where it implements this. An engine failure mid-reset leaves the key with
    /// no sandbox or a reset one, never a half-reset one served as reset.
    ///
    /// # Cancel safety and drop
    /// Dropping the future never leaves a half-made instance behind: its removal runs in a task
    /// the caller cannot cancel.
    async fn reset(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Err(SandboxError::CapabilityNotSupported(
            "this backend does not declare snapshot: it cannot reset a sandbox".into(),
        ))
    }
}

/// The state of a listed sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Running.
    Running,
    /// Stopped (or paused), still present.
    Stopped,
    /// Retired: it must not be reused.
    Retired,
    /// A record whose instance the engine does not list.
    Unlisted,
    /// The engine's own word.
    Other(String),
}

impl SandboxState {
    /// The wire string: `running`, `stopped`, `retired`, `unlisted`, or the engine's own word.
    ///
    /// ```
    /// use sandbox_core::SandboxState;
    /// assert_eq!(SandboxState::Unlisted.as_str(), "unlisted");
    /// assert_eq!(SandboxState::Other("paused".into()).to_string(), "paused");
    /// ```
    pub fn as_str(&self) -> &str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
            SandboxState::Retired => "retired",
            SandboxState::Unlisted => "unlisted",
            SandboxState::Other(word) => word,
        }
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sandbox found by [`SandboxBackend::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSummary {
    /// The key, when the engine keeps more than digests of it.
    pub key: Option<SandboxKey>,
    /// The kind, when the engine keeps more than a digest of it.
    pub kind: Option<String>,
    /// The engine's identifier.
    pub instance_id: String,
    /// When it was created, if known.
    pub created: Option<SystemTime>,
    /// Its state.
    pub state: SandboxState,
}

/// A kind of sandbox: containers, microVMs, fakes.
#[async_trait]
pub trait SandboxBackend: Send + Sync + std::fmt::Debug {
    /// The backend's name (`docker`, `docker-sbx`).
    fn name(&self) -> &str;

    /// The isolation rung it provides.
    fn isolation(&self) -> Isolation;

    /// What it serves.
    fn declarations(&self) -> &BackendDeclarations;

    /// Gets or creates the sandbox of (key, spec kind). Concurrent acquires of one identity yield one
    /// instance. A warm acquire whose spec changes the image, the storage base or egress is
    /// [`SandboxError::SpecMismatch`].
    async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError>;

    /// A handle to the existing sandbox of (key, kind), or `None`; never creates one.
    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError>;

    /// Disposes of the key's sandboxes that the selector names. Never raises.
    async fn dispose(&self, key: &SandboxKey, selector: DisposeSelector)
        -> Option<DisposalFailure>;

    /// Disposes of every sandbox of a conversation, whoever created it. Never raises.
    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge;

    /// Every sandbox of a scope (or one conversation of it), sorted by instance id. A listing that fails
    /// is an error, never an empty list.
    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError>;

    /// The directories of the host running this process where the backend keeps sandboxes' state
    /// (workspaces, records, an engine's data root), absolute. A host that moves files between the
    /// host and a sandbox guards them for reads and writes alike, so one key never reaches another
    /// key's sandbox through the host; taking them from the backend keeps that guard from drifting
    /// from where the state really is. The default is none: a backend that keeps no host state.
    ///
    /// # Errors
    ///
    /// An engine failure when the backend must ask its engine and cannot; a host then refuses to
    /// move files rather than guard too little.
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future drops any engine request in flight; nothing is changed.
    async fn host_state_roots(&self) -> Result<Vec<String>, SandboxError> {
        Ok(Vec::new())
    }

    /// Makes a new sandbox of `spec`'s kind under `target`, a key the caller names, whose files
    /// are those of `source`'s sandbox of that kind at this moment (`snapshot`). `spec` is the one
    /// the source was acquired with; the fork is acquired with it, so a later acquire of `target`
    /// with the same spec finds the fork. What else is copied (memory, processes) is the
    /// backend's declaration; the fork and the source change independently afterwards, and the
    /// fork is a new instance (its own instance id).
    ///
    /// # Errors
    /// The default refuses with [`SandboxError::CapabilityNotSupported`]. A backend refuses, as
    /// [`SandboxError::InvalidArgument`], a `target` that already has a sandbox of the kind, a
    /// `target` equal to `source`, and a `source` without one.
    ///
    /// # Cancel safety and drop
    /// A fork that fails or is dropped leaves no sandbox under `target` that a later acquire
    /// would serve as a fork; what it made is found by the next disposal of `target` or its
    /// conversation.
    async fn fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let _ = (source, spec, target);
        Err(SandboxError::CapabilityNotSupported(format!(
            "backend {:?} does not declare snapshot: it cannot fork a sandbox",
            self.name()
        )))
    }
}
