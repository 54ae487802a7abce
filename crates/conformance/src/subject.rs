//! The subject a suite attacks, and its planting seams.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{Capability, Command, ExecOutput, ExecRequest, Sandbox};

use crate::error::ConformanceError;
use crate::fixtures::PROBE_EXEC_TIMEOUT;
use crate::paths::parent;

const SEAMS: &str = "SUBJECT";

/// What a suite attacks: one sandbox, its working directory, the backend's declarations, and the seams
/// that plant fixtures and observe the guest's view.
///
/// The seams may use any authority the backend's test module has; [`PosixGuestSubject`] fills them
/// through the sandbox's own surface. A seam that cannot tell (an unreadable exit status) returns an
/// error: it never reads as absence or as "false".
#[async_trait]
pub trait ConformanceSubject: Send + Sync {
    /// The sandbox under attack.
    fn sandbox(&self) -> &dyn Sandbox;

    /// The absolute working directory the probes use.
    fn working_directory(&self) -> &str;

    /// The backend's **full** declared capability set, exactly what the router reads.
    fn capabilities(&self) -> &BTreeSet<Capability>;

    /// The timeout of every probe exec (60 s by default).
    fn exec_timeout(&self) -> Duration {
        PROBE_EXEC_TIMEOUT
    }

    /// How long an expired exec may spend killing its guest group beyond its bound (0..=30 s; the
    /// backend's exec cleanup timeout).
    fn exec_cleanup_allowance(&self) -> Duration {
        Duration::ZERO
    }

    /// Creates a regular file at an absolute path with exact bytes, creating its parents.
    async fn plant_file(&self, absolute: &str, bytes: &[u8]) -> Result<(), ConformanceError>;

    /// Creates (or replaces) a symbolic link at an absolute path.
    async fn plant_symlink(&self, absolute: &str, target: &str) -> Result<(), ConformanceError>;

    /// Whether anything is at the path; a dangling link counts as present.
    async fn exists(&self, absolute: &str) -> Result<bool, ConformanceError>;

    /// Creates a directory as the guest program; false when the guest cannot.
    async fn plant_directory_the_guest_owns(
        &self,
        absolute: &str,
    ) -> Result<bool, ConformanceError>;

    /// Creates a file as the guest program; false when the guest cannot.
    async fn plant_file_the_guest_owns(&self, absolute: &str) -> Result<bool, ConformanceError>;

    /// Whether the guest program may write the path.
    async fn the_guest_can_write(&self, absolute: &str) -> Result<bool, ConformanceError>;

    /// Whether the guest program can delete the path (it is deleted when it can).
    async fn the_guest_can_delete(&self, absolute: &str) -> Result<bool, ConformanceError>;
}

/// A subject whose seams use only the sandbox's own surface, for POSIX guests.
///
/// `plant_file` is `write_file(abs, bytes, wd = parent of abs)`, so the backend's `write_file` must
/// accept an absolute working directory outside the storage base and create it. Every other seam runs a
/// guest utility (`ln -sfn`, `test`, `mkdir`, `sh`, `rm -f`) and reads its exit status strictly: 0 and 1
/// are answers, anything else is a harness error.
#[derive(Debug, Clone)]
pub struct PosixGuestSubject {
    /// The sandbox under attack.
    pub sandbox: Arc<dyn Sandbox>,
    /// The absolute working directory.
    pub working_directory: String,
    /// The backend's full declared capability set.
    pub capabilities: BTreeSet<Capability>,
    /// The timeout of every probe exec.
    pub exec_timeout: Duration,
    /// The backend's exec cleanup allowance (0..=30 s).
    pub exec_cleanup_allowance: Duration,
}

impl PosixGuestSubject {
    /// A subject working in `working_directory`, which must be absolute.
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        working_directory: impl Into<String>,
        capabilities: BTreeSet<Capability>,
    ) -> Result<Self, ConformanceError> {
        let working_directory = working_directory.into();
        if !working_directory.starts_with('/') {
            return Err(ConformanceError::InvalidArgument(format!(
                "the subject's working directory {working_directory:?} must be absolute"
            )));
        }
        Ok(PosixGuestSubject {
            sandbox,
            working_directory,
            capabilities,
            exec_timeout: PROBE_EXEC_TIMEOUT,
            exec_cleanup_allowance: Duration::ZERO,
        })
    }

    /// A subject working in the sandbox's own storage base.
    pub fn in_storage_base(
        sandbox: Arc<dyn Sandbox>,
        capabilities: BTreeSet<Capability>,
    ) -> Result<Self, ConformanceError> {
        let base = sandbox.storage_base().to_owned();
        Self::new(sandbox, base, capabilities)
    }

    /// The same subject with the backend's exec cleanup allowance.
    #[must_use]
    pub fn with_exec_cleanup_allowance(mut self, allowance: Duration) -> Self {
        self.exec_cleanup_allowance = allowance;
        self
    }

    async fn guest(&self, argv: &[&str]) -> Result<ExecOutput, ConformanceError> {
        let request = ExecRequest::new(Command::argv(argv))
            .working_directory("/")
            .timeout(self.exec_timeout);
        self.sandbox
            .exec(request)
            .await
            .map_err(|e| ConformanceError::sandbox(format!("guest {argv:?}"), e))
    }

    /// Runs a guest test whose status 0 is true, 1 is false and anything else is a harness error.
    async fn guest_test(&self, argv: &[&str]) -> Result<bool, ConformanceError> {
        let output = self.guest(argv).await?;
        match output.exit_code {
            0 => Ok(true),
            1 => Ok(false),
            other => Err(unreadable(argv, other, &output)),
        }
    }
}

#[cold]
fn unreadable(argv: &[&str], code: i32, output: &ExecOutput) -> ConformanceError {
    ConformanceError::harness(
        SEAMS,
        format!(
            "guest {argv:?} exited {code}, which answers nothing (stderr: {:?})",
            output.stderr_text()
        ),
    )
}

#[async_trait]
impl ConformanceSubject for PosixGuestSubject {
    fn sandbox(&self) -> &dyn Sandbox {
        self.sandbox.as_ref()
    }

    fn working_directory(&self) -> &str {
        &self.working_directory
    }

    fn capabilities(&self) -> &BTreeSet<Capability> {
        &self.capabilities
    }

    fn exec_timeout(&self) -> Duration {
        self.exec_timeout
    }

    fn exec_cleanup_allowance(&self) -> Duration {
        self.exec_cleanup_allowance
    }

    async fn plant_file(&self, absolute: &str, bytes: &[u8]) -> Result<(), ConformanceError> {
        let wd = parent(absolute);
        self.sandbox
            .write_file(absolute, bytes, &wd)
            .await
            .map_err(|e| ConformanceError::sandbox(format!("planting {absolute:?}"), e))
    }

    async fn plant_symlink(&self, absolute: &str, target: &str) -> Result<(), ConformanceError> {
        let argv = ["ln", "-sfn", target, absolute];
        let output = self.guest(&argv).await?;
        if output.exit_code == 0 {
            Ok(())
        } else {
            Err(unreadable(&argv, output.exit_code, &output))
        }
    }

    async fn exists(&self, absolute: &str) -> Result<bool, ConformanceError> {
        // `test -e` follows links, so a dangling link needs the `-L` question too.
        if self.guest_test(&["test", "-e", absolute]).await? {
            return Ok(true);
        }
        self.guest_test(&["test", "-L", absolute]).await
    }

    async fn plant_directory_the_guest_owns(
        &self,
        absolute: &str,
    ) -> Result<bool, ConformanceError> {
        self.guest_test(&["mkdir", absolute]).await
    }

    async fn plant_file_the_guest_owns(&self, absolute: &str) -> Result<bool, ConformanceError> {
        let argv = [
            "sh",
            "-c",
            "printf %s \"$1\" > \"$2\"",
            "_",
            "planted by the guest",
            absolute,
        ];
        // The redirection's status is not a test status; only existence answers.
        self.guest(&argv).await?;
        self.exists(absolute).await
    }

    async fn the_guest_can_write(&self, absolute: &str) -> Result<bool, ConformanceError> {
        self.guest_test(&["test", "-w", absolute]).await
    }

    async fn the_guest_can_delete(&self, absolute: &str) -> Result<bool, ConformanceError> {
        let argv = ["rm", "-f", absolute];
        let output = self.guest(&argv).await?;
        match output.exit_code {
            0 => Ok(!self.exists(absolute).await?),
            1 => Ok(false),
            other => Err(unreadable(&argv, other, &output)),
        }
    }
}
