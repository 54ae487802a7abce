//! The crate's one error type.

use std::time::Duration;

/// Everything a bounded run can fail with.
///
/// None of them is the child's result: no variant carries partial output, and on every one the
/// child's process tree was killed (see [`run_bounded`](crate::run_bounded)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
