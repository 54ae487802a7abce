//! The driver's one error type.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use vm_agent::proto::{ErrorCode, ProtoError};

/// Everything the driver can fail with. Guest bytes never panic the host: a malformed frame is
/// [`VmError::Protocol`], an oversized answer [`VmError::OutputLimit`] or
/// [`VmError::WindowOverrun`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VmError {
    /// A host program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A host tool ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    ToolFailed {
        /// The command line.
        command: String,
        /// How it ended.
        status: String,
        /// The end of its stderr.
        stderr: String,
    },
    /// A file-system step on the host failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kernel image could not be used (no payload found, not an ELF).
    #[error("kernel {}: {message}", path.display())]
    Kernel {
        /// The image.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// QEMU exited (or was killed) while the driver needed it.
    #[error("QEMU exited: {detail}")]
    QemuExited {
        /// What is known of its end (its log's tail, when there is one).
        detail: String,
    },
    /// The VM did not reach its agent in time.
    #[error("the guest agent did not answer within {after:?}")]
    BootTimeout {
        /// The bound.
        after: Duration,
    },
    /// Every agent port of the VM stayed held by other connections (other host processes)
    /// for the whole wait.
    #[error("all {ports} agent ports of the VM stayed in use by other connections for {after:?}")]
    PortsBusy {
        /// The VM's port count.
        ports: u32,
        /// The wait.
        after: Duration,
    },
    /// A call did not finish before its deadline.
    #[error("{what} did not finish within {after:?}")]
    Deadline {
        /// The call.
        what: &'static str,
        /// The bound.
        after: Duration,
    },
    /// No VM runs in the state directory (or another process took its place).
    #[error("no VM of ours runs in {}: {reason}", dir.display())]
    NotRunning {
        /// The VM's directory.
        dir: PathBuf,
        /// Why it is not ours or not running.
        reason: String,
    },
    /// QMP answered with an error or something that is not QMP.
    #[error("QMP: {message}")]
    Qmp {
        /// What went wrong.
        message: String,
    },
    /// The guest sent a malformed frame; the channel is closed.
    #[error("the guest broke the protocol: {0}")]
    Protocol(#[from] ProtoError),
    /// The guest sent a frame the protocol does not allow here (wrong message for the
    /// request, more data than its window).
    #[error("the guest broke the protocol: {0}")]
    Unexpected(String),
    /// The guest sent more than its credit allowed.
    #[error("the guest sent {buffered} bytes on one request, over the {window}-byte window")]
    WindowOverrun {
        /// What it had buffered.
        buffered: u64,
        /// The bound.
        window: u64,
    },
    /// An exec's output or a read passed the caller's cap; the exec was killed.
    #[error("output passed the {limit}-byte cap")]
    OutputLimit {
        /// The cap.
        limit: u64,
    },
    /// The handshake's answer was not found in the bytes the guest sent first.
    #[error("no handshake answer in the first {scanned} bytes from the guest")]
    Handshake {
        /// How many bytes were scanned.
        scanned: usize,
    },
    /// The agent channel closed (the guest or QEMU went away, or an earlier protocol error
    /// closed it).
    #[error("the agent channel is closed: {reason}")]
    ChannelClosed {
        /// Why, when known.
        reason: String,
    },
    /// The agent refused or failed the request.
    #[error("the guest agent failed the request ({code:?}): {message}")]
    Agent {
        /// Its code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// A snapshot may not be restored: its manifest is missing or malformed, it was saved from
    /// another machine, or a file does not match its digest. Nothing of it was loaded.
    #[error("the snapshot in {} is refused: {reason}", dir.display())]
    SnapshotRefused {
        /// The snapshot's directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The request was invalid before anything was sent.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// No user cache directory can be named for the VM image.
    #[error("no cache directory for the VM image: set SANDBOX_VM_CACHE, XDG_CACHE_HOME or HOME")]
    NoCacheDir,
}

impl VmError {
    #[cold]
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        VmError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    #[cold]
    pub(crate) fn snapshot_refused(dir: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        VmError::SnapshotRefused {
            dir: dir.into(),
            reason: reason.into(),
        }
    }

    #[cold]
    pub(crate) fn no_cache_dir() -> Self {
        VmError::NoCacheDir
    }

    #[cold]
    pub(crate) fn closed(reason: impl Into<String>) -> Self {
        VmError::ChannelClosed {
            reason: reason.into(),
        }
    }

    #[cold]
    pub(crate) fn unexpected(what: impl Into<String>) -> Self {
        VmError::Unexpected(what.into())
    }

    #[cold]
    pub(crate) fn not_running(dir: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        VmError::NotRunning {
            dir: dir.into(),
            reason: reason.into(),
        }
    }
}
