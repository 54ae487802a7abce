//! The one error type of the contract, its kinds and their families.

use std::fmt;
use std::time::Duration;

use crate::disposal::DisposalCode;

/// A boxed error kept as the `source` of an engine-side failure.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of every fallible contract call.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// How the guest side of an expired `exec` ended (exec-wrapper's kill outcome, in core terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuestCleanup {
    /// The command was killed by a second call (its process tree, PID namespace or process group,
    /// whichever the guest offers; see docs/wrapper-protocol.md); the sandbox was kept.
    Killed,
    /// The command had not started and never will (the cancel file won the start race); the sandbox was kept.
    NeverStarted,
    /// The kill did not land; the sandbox was retired so no later call reuses it.
    Retired,
}

impl GuestCleanup {
    /// The wire string of this outcome.
    pub fn as_str(self) -> &'static str {
        match self {
            GuestCleanup::Killed => "killed",
            GuestCleanup::NeverStarted => "never_started",
            GuestCleanup::Retired => "retired",
        }
    }
}

impl fmt::Display for GuestCleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The observable kind of a [`SandboxError`]. Conformance suites and hosts branch on this, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A path escapes its working directory, goes through a link, or names something never reachable.
    Confinement,
    /// A malformed argument: spec, config, argv, timeout, key/scope mismatch.
    InvalidArgument,
    /// A warm acquire asked for a different image, storage base or egress than the live instance has.
    SpecMismatch,
    /// A non-directory stands where a directory is needed.
    NotADirectory,
    /// A directory stands where a file is needed.
    IsADirectory,
    /// The path does not exist.
    NotFound,
    /// A read of something that is not a regular file (link, fifo, device).
    NotRegularFile,
    /// The guest could not do what was asked (for example, remove a file it does not own).
    GuestRefused,
    /// A host-side I/O failure of a file plane.
    Io,
    /// A transfer exceeded its cap; nothing was truncated.
    TransferCapExceeded,
    /// An exec produced more output than its budget.
    OutputLimitExceeded,
    /// The caller's own bound expired.
    Timeout,
    /// A backend's own deadline on an engine call expired.
    EngineTimeout,
    /// The backend could not be reached or could not create anything; nothing was left behind.
    BackendUnavailable,
    /// An engine call failed.
    Engine,
    /// The engine CLI's login lapsed.
    LoginRequired,
    /// The engine's daemon faulted.
    DaemonFault,
    /// The host is not confined as the backend requires.
    HostNotConfined,
    /// The handle names an instance that was retired.
    Retired,
    /// Another workspace is bound in the instance.
    WorkspaceMismatch,
    /// A concurrent create of the same instance is still in progress.
    Busy,
    /// The instance was removed behind the handle's back.
    SandboxGone,
    /// The image is not present locally.
    ImageMissing,
    /// No backend is registered, or the selected one does not exist.
    NoBackend,
    /// The host's policy forbids it: a backend whose isolation rung is below the floor, or a host
    /// path that is, contains or lies under a credential path.
    NotPermitted,
    /// The backend does not declare a capability the spec requires.
    CapabilityNotSupported,
    /// The backend does not declare the OS family the spec requires.
    OsFamilyNotSupported,
    /// The host denies a capability the spec requires.
    CapabilityDenied,
    /// The backend does not enforce the spec's egress mode.
    EgressNotEnforced,
    /// The backend does not serve the effective isolation scope.
    ScopeNotEnforced,
    /// The spec's transfer limits exceed the backend's ceiling.
    TransferLimitsNotPermitted,
    /// The key is marked unclean: an earlier disposal did not land.
    Unclean,
    /// The backend does not implement this operation.
    Unsupported,
    /// A backend broke the contract (for example, an empty instance id).
    ContractViolation,
}

impl ErrorKind {
    /// File-plane failures a probe may tolerate as I/O. Timeouts, confinement and caps are deliberately outside.
    pub fn is_io(self) -> bool {
        matches!(
            self,
            ErrorKind::NotFound
                | ErrorKind::NotADirectory
                | ErrorKind::IsADirectory
                | ErrorKind::NotRegularFile
                | ErrorKind::GuestRefused
                | ErrorKind::Io
        )
    }

    /// Refusals decided by admission, before any engine call.
    pub fn is_admission_refusal(self) -> bool {
        matches!(
            self,
            ErrorKind::NotPermitted
                | ErrorKind::CapabilityNotSupported
                | ErrorKind::OsFamilyNotSupported
                | ErrorKind::CapabilityDenied
                | ErrorKind::EgressNotEnforced
                | ErrorKind::ScopeNotEnforced
                | ErrorKind::TransferLimitsNotPermitted
        )
    }

    /// Failures of the engine or of the instance, never of the command.
    pub fn is_engine(self) -> bool {
        matches!(
            self,
            ErrorKind::Engine
                | ErrorKind::EngineTimeout
                | ErrorKind::BackendUnavailable
                | ErrorKind::LoginRequired
                | ErrorKind::DaemonFault
                | ErrorKind::SandboxGone
                | ErrorKind::WorkspaceMismatch
                | ErrorKind::Retired
                | ErrorKind::Busy
                | ErrorKind::ImageMissing
        )
    }
}

/// Every failure of the contract. Disposal never uses this type; it reports a
/// [`DisposalFailure`](crate::DisposalFailure) instead.
///
/// A refusal is never a truncation, and an engine failure is never an exit code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// See [`ErrorKind::Confinement`].
    #[error("confinement refused {path:?}: {reason}")]
    Confinement {
        /// The path as the caller gave it.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// See [`ErrorKind::InvalidArgument`].
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// See [`ErrorKind::SpecMismatch`].
    #[error("spec mismatch: {0}")]
    SpecMismatch(String),
    /// See [`ErrorKind::NotADirectory`].
    #[error("not a directory: {path:?}")]
    NotADirectory {
        /// The component that is not a directory.
        path: String,
    },
    /// See [`ErrorKind::IsADirectory`].
    #[error("is a directory: {path:?}")]
    IsADirectory {
        /// The directory.
        path: String,
    },
    /// See [`ErrorKind::NotFound`].
    #[error("not found: {path:?}")]
    NotFound {
        /// The missing path.
        path: String,
    },
    /// See [`ErrorKind::NotRegularFile`].
    #[error("not a regular file: {path:?}")]
    NotRegularFile {
        /// The path that is a link, fifo, device or other non-file.
        path: String,
    },
    /// See [`ErrorKind::GuestRefused`].
    #[error("the guest refused {path:?}: {detail}")]
    GuestRefused {
        /// The path.
        path: String,
        /// What the guest said.
        detail: String,
    },
    /// See [`ErrorKind::Io`].
    #[error("host I/O failed during {operation} of {path:?}")]
    Io {
        /// The operation (`read`, `write`, ...).
        operation: &'static str,
        /// The path.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// See [`ErrorKind::TransferCapExceeded`].
    #[error("transfer of {path:?} exceeds its cap of {limit} bytes")]
    TransferCapExceeded {
        /// The file (or `""` for a total).
        path: String,
        /// The cap that was passed.
        limit: u64,
    },
    /// See [`ErrorKind::OutputLimitExceeded`].
    #[error("command output exceeds its budget of {limit} bytes")]
    OutputLimitExceeded {
        /// The combined stdout+stderr budget.
        limit: u64,
    },
    /// See [`ErrorKind::Timeout`].
    #[error("{operation} exceeded its {} s bound{}", bound_secs(*.bound), cleanup_suffix(*.cleanup))]
    Timeout {
        /// What timed out (`command`, `reclaim`, `disposal`).
        operation: String,
        /// The caller's bound.
        bound: Duration,
        /// For `exec`, how the guest side ended.
        cleanup: Option<GuestCleanup>,
    },
    /// See [`ErrorKind::EngineTimeout`].
    #[error("engine call {operation} exceeded its {} s deadline", bound_secs(*.bound))]
    EngineTimeout {
        /// The engine call.
        operation: String,
        /// The backend's own deadline.
        bound: Duration,
    },
    /// See [`ErrorKind::BackendUnavailable`].
    #[error("backend {backend} unavailable: {detail}")]
    BackendUnavailable {
        /// The backend's name.
        backend: String,
        /// Why.
        detail: String,
        /// The underlying failure, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// See [`ErrorKind::Engine`].
    #[error("engine failure: {detail}")]
    Engine {
        /// What failed, with the engine's own words.
        detail: String,
        /// The underlying failure, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// See [`ErrorKind::LoginRequired`].
    #[error("login required: {0}")]
    LoginRequired(String),
    /// See [`ErrorKind::DaemonFault`].
    #[error("daemon fault: {0}")]
    DaemonFault(String),
    /// See [`ErrorKind::HostNotConfined`].
    #[error("host not confined: {0}")]
    HostNotConfined(String),
    /// See [`ErrorKind::Retired`].
    #[error("sandbox {instance} was retired: {reason}")]
    Retired {
        /// The retired instance.
        instance: String,
        /// Why it was retired.
        reason: String,
    },
    /// See [`ErrorKind::WorkspaceMismatch`].
    #[error("workspace mismatch: {0}")]
    WorkspaceMismatch(String),
    /// See [`ErrorKind::Busy`].
    #[error("busy: {0}")]
    Busy(String),
    /// See [`ErrorKind::SandboxGone`].
    #[error("sandbox {instance} is gone: it was removed behind this handle")]
    SandboxGone {
        /// The instance the handle named.
        instance: String,
    },
    /// See [`ErrorKind::ImageMissing`].
    #[error("image {image:?} is not present locally: {hint}")]
    ImageMissing {
        /// The image reference.
        image: String,
        /// How to get it.
        hint: String,
    },
    /// See [`ErrorKind::NoBackend`].
    #[error("no backend: {0}")]
    NoBackend(String),
    /// See [`ErrorKind::NotPermitted`].
    #[error("not permitted: {0}")]
    NotPermitted(String),
    /// See [`ErrorKind::CapabilityNotSupported`].
    #[error("capability not supported: {0}")]
    CapabilityNotSupported(String),
    /// See [`ErrorKind::OsFamilyNotSupported`].
    #[error("OS family not supported: {0}")]
    OsFamilyNotSupported(String),
    /// See [`ErrorKind::CapabilityDenied`].
    #[error("capability denied by the host: {0}")]
    CapabilityDenied(String),
    /// See [`ErrorKind::EgressNotEnforced`].
    #[error("egress not enforced: {0}")]
    EgressNotEnforced(String),
    /// See [`ErrorKind::ScopeNotEnforced`].
    #[error("isolation scope not enforced: {0}")]
    ScopeNotEnforced(String),
    /// See [`ErrorKind::TransferLimitsNotPermitted`].
    #[error("transfer limits not permitted: {0}")]
    TransferLimitsNotPermitted(String),
    /// See [`ErrorKind::Unclean`]. The message carries only the code.
    #[error("sandbox key is unclean ({})", code.map(|c| c.as_str()).unwrap_or("no code"))]
    Unclean {
        /// The folded code of the failed disposal, when one is known.
        code: Option<DisposalCode>,
    },
    /// See [`ErrorKind::Unsupported`].
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// See [`ErrorKind::ContractViolation`].
    #[error("backend contract violation: {0}")]
    ContractViolation(String),
}

fn bound_secs(bound: Duration) -> String {
    let secs = bound.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{}", bound.as_secs())
    } else {
        format!("{secs}")
    }
}

fn cleanup_suffix(cleanup: Option<GuestCleanup>) -> String {
    match cleanup {
        None => String::new(),
        Some(GuestCleanup::Killed) => "; it was killed".to_owned(),
        Some(GuestCleanup::NeverStarted) => "; it never started".to_owned(),
        Some(GuestCleanup::Retired) => {
            "; the kill did not land and the sandbox was retired".to_owned()
        }
    }
}

impl SandboxError {
    /// The observable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        use SandboxError as E;
        match self {
            E::Confinement { .. } => ErrorKind::Confinement,
            E::InvalidArgument(_) => ErrorKind::InvalidArgument,
            E::SpecMismatch(_) => ErrorKind::SpecMismatch,
            E::NotADirectory { .. } => ErrorKind::NotADirectory,
            E::IsADirectory { .. } => ErrorKind::IsADirectory,
            E::NotFound { .. } => ErrorKind::NotFound,
            E::NotRegularFile { .. } => ErrorKind::NotRegularFile,
            E::GuestRefused { .. } => ErrorKind::GuestRefused,
            E::Io { .. } => ErrorKind::Io,
            E::TransferCapExceeded { .. } => ErrorKind::TransferCapExceeded,
            E::OutputLimitExceeded { .. } => ErrorKind::OutputLimitExceeded,
            E::Timeout { .. } => ErrorKind::Timeout,
            E::EngineTimeout { .. } => ErrorKind::EngineTimeout,
            E::BackendUnavailable { .. } => ErrorKind::BackendUnavailable,
            E::Engine { .. } => ErrorKind::Engine,
            E::LoginRequired(_) => ErrorKind::LoginRequired,
            E::DaemonFault(_) => ErrorKind::DaemonFault,
            E::HostNotConfined(_) => ErrorKind::HostNotConfined,
            E::Retired { .. } => ErrorKind::Retired,
            E::WorkspaceMismatch(_) => ErrorKind::WorkspaceMismatch,
            E::Busy(_) => ErrorKind::Busy,
            E::SandboxGone { .. } => ErrorKind::SandboxGone,
            E::ImageMissing { .. } => ErrorKind::ImageMissing,
            E::NoBackend(_) => ErrorKind::NoBackend,
            E::NotPermitted(_) => ErrorKind::NotPermitted,
            E::CapabilityNotSupported(_) => ErrorKind::CapabilityNotSupported,
            E::OsFamilyNotSupported(_) => ErrorKind::OsFamilyNotSupported,
            E::CapabilityDenied(_) => ErrorKind::CapabilityDenied,
            E::EgressNotEnforced(_) => ErrorKind::EgressNotEnforced,
            E::ScopeNotEnforced(_) => ErrorKind::ScopeNotEnforced,
            E::TransferLimitsNotPermitted(_) => ErrorKind::TransferLimitsNotPermitted,
            E::Unclean { .. } => ErrorKind::Unclean,
            E::Unsupported(_) => ErrorKind::Unsupported,
            E::ContractViolation(_) => ErrorKind::ContractViolation,
        }
    }

    /// Shorthand for `self.kind().is_io()`.
    pub fn is_io(&self) -> bool {
        self.kind().is_io()
    }

    /// Shorthand for `self.kind().is_admission_refusal()`.
    pub fn is_admission_refusal(&self) -> bool {
        self.kind().is_admission_refusal()
    }

    /// Shorthand for `self.kind().is_engine()`.
    pub fn is_engine(&self) -> bool {
        self.kind().is_engine()
    }

    /// The one constructor of confinement refusals. Cold: a refusal is the unusual path.
    #[cold]
    #[inline(never)]
    pub fn confinement(path: impl Into<String>, reason: impl Into<String>) -> Self {
        SandboxError::Confinement {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// An invalid-argument error.
    #[cold]
    pub fn invalid(message: impl Into<String>) -> Self {
        SandboxError::InvalidArgument(message.into())
    }

    /// An engine failure without a source.
    #[cold]
    pub fn engine(detail: impl Into<String>) -> Self {
        SandboxError::Engine {
            detail: detail.into(),
            source: None,
        }
    }

    /// The guest-side cleanup of a timed-out exec, when this is one.
    pub fn guest_cleanup(&self) -> Option<GuestCleanup> {
        match self {
            SandboxError::Timeout { cleanup, .. } => *cleanup,
            _ => None,
        }
    }
}

/// Failure to parse one of the contract's wire strings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The string names nothing this vocabulary knows.
    #[error("unknown {what} {value:?}")]
    Unknown {
        /// The vocabulary (`isolation`, `capability`, ...).
        what: &'static str,
        /// The rejected string.
        value: String,
    },
    /// The string names something the contract knows but this version does not support.
    #[error("{what} {value:?} is not supported in this version")]
    NotSupportedInThisVersion {
        /// The vocabulary.
        what: &'static str,
        /// The rejected string.
        value: String,
    },
}

impl From<ParseError> for SandboxError {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::Unknown { .. } => SandboxError::InvalidArgument(e.to_string()),
            ParseError::NotSupportedInThisVersion { .. } => {
                SandboxError::Unsupported(e.to_string())
            }
        }
    }
}
