//! The crate's one error type.

/// Everything this crate can refuse or fail with.
///
/// Encoding refusals (`Nul`, `EmptyArgv`) happen before any process is started; a backend reports
/// them as an invalid argument. Running the wrapper fails with the runner's own error
/// ([`bounded_process::Error`]), never with this one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A value that must cross a `sh` argument or an env file contains a NUL byte.
    #[error("{what} contains a NUL byte, which no process argument can carry")]
    Nul {
        /// Which value: `working directory`, `argv[3]`, `env entry 2`, …
        what: String,
    },
    /// The command line has no program to run.
    #[error("the command line is empty: there is no program to run")]
    EmptyArgv,
    /// The operating system's random source failed, so no nonce could be made.
    #[error("the operating system's random source failed: {reason}")]
    Entropy {
        /// The random source's own description of the failure.
        reason: String,
    },
}

impl Error {
    /// A value carries a NUL byte. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn nul(what: impl Into<String>) -> Self {
        Error::Nul { what: what.into() }
    }

    /// The argv is empty. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn empty_argv() -> Self {
        Error::EmptyArgv
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
