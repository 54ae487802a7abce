//! The crate's one error type.

use std::time::Duration;

/// Everything this crate can refuse or fail with.
///
/// Encoding refusals (`Nul`, `EmptyArgv`) happen before any process is started; a backend reports
/// them as an invalid argument. The runner's errors (`Spawn`, `Deadline`, `OutputLimit`, `Io`)
/// are never a command's result: no variant carries partial output.
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
    /// The program could not be started (missing binary, permissions, resource limits).
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The configured program path, as given.
        program: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The deadline passed before the program exited and closed both pipes.
    #[error("{program} did not finish within {bound:?}; it was killed")]
    Deadline {
        /// The configured program path.
        program: String,
        /// The bound that expired.
        bound: Duration,
    },
    /// The program wrote more than the output budget to stdout and stderr together.
    #[error("{program} wrote more than its output budget of {budget} bytes; it was killed")]
    OutputLimit {
        /// The configured program path.
        program: String,
        /// The budget, in bytes, for stdout and stderr combined.
        budget: usize,
    },
    /// The sink of a streamed run stopped wanting its output; the program was killed.
    #[error("the output of {program} was abandoned; it was killed")]
    Abandoned {
        /// The configured program path.
        program: String,
    },
    /// Reading a pipe, writing stdin or waiting for the exit failed.
    #[error("talking to {program} failed while {during}: {source}")]
    Io {
        /// The configured program path.
        program: String,
        /// What the runner was doing.
        during: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
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

    /// The output budget was exceeded. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn output_limit(program: &str, budget: usize) -> Self {
        Error::OutputLimit {
            program: program.to_owned(),
            budget,
        }
    }

    /// The sink abandoned the output. Cold: never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn abandoned(program: &str) -> Self {
        Error::Abandoned {
            program: program.to_owned(),
        }
    }

    /// The deadline passed. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn deadline(program: &str, bound: Duration) -> Self {
        Error::Deadline {
            program: program.to_owned(),
            bound,
        }
    }
}

/// Shorthand for this crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
