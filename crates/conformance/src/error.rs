//! The one error type of the conformance crate.

use sandbox_core::{Capability, SandboxError};

use crate::report::ConformanceReport;

/// Why a conformance run did not succeed.
///
/// A run that attacked nothing is never a success: an undeclared suite gate is
/// [`GateNotDeclared`](Self::GateNotDeclared), refused before anything is planted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The backend does not declare the capability the suite is gated on. Nothing was planted or run.
    #[error(
        "the {suite} conformance suite needs `{capability}`, which the backend does not declare"
    )]
    GateNotDeclared {
        /// The suite label (`FILES_OUT`, `EXEC`, ...).
        suite: &'static str,
        /// The gate capability.
        capability: Capability,
    },
    /// At least one probe failed. The report holds every probe's outcome, not only the failures.
    #[error("{} of {total} {suite} conformance probes failed: {}", failed_names.len(), failed_names.join("; "))]
    ConformanceFailure {
        /// The suite label.
        suite: String,
        /// How many probes the suite has (run, failed or skipped).
        total: usize,
        /// Each failed probe as `name: why`.
        failed_names: Vec<String>,
        /// The whole suite's report.
        report: ConformanceReport,
    },
    /// Probes were skipped that the caller requires to run (a skip in CI is a bug).
    #[error("{} conformance probes were skipped: {}", skipped.len(), skipped.join("; "))]
    ProbesSkipped {
        /// Each skipped probe as `SUITE/name: reason`.
        skipped: Vec<String>,
    },
    /// The harness itself could not do its part (planting failed, a precondition does not hold, a guest
    /// utility answered with an exit status the harness cannot read). Never read as a pass or an absence.
    #[error("{suite} conformance harness error: {detail}")]
    Harness {
        /// The suite label.
        suite: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A call the harness needed (an acquire, a planting write, a guest utility) failed.
    #[error("{context} failed: {source}")]
    Sandbox {
        /// The call, in words.
        context: String,
        /// The backend's error.
        #[source]
        source: SandboxError,
    },
    /// A malformed argument to a suite (for example a zero EGRESS timeout).
    #[error("invalid conformance argument: {0}")]
    InvalidArgument(String),
}

impl ConformanceError {
    /// The refusal of a suite whose gate is not declared. Cold: it is a refusal path.
    #[cold]
    #[inline(never)]
    pub fn gate_not_declared(suite: &'static str, capability: Capability) -> Self {
        ConformanceError::GateNotDeclared { suite, capability }
    }

    /// A harness error. Cold: the harness failing is the unusual path.
    #[cold]
    pub fn harness(suite: &'static str, detail: impl Into<String>) -> Self {
        ConformanceError::Harness {
            suite,
            detail: detail.into(),
        }
    }

    /// A failed call the harness needed, with what it was doing.
    #[cold]
    pub fn sandbox(context: impl Into<String>, source: SandboxError) -> Self {
        ConformanceError::Sandbox {
            context: context.into(),
            source,
        }
    }

    /// The report carried by a [`ConformanceFailure`](Self::ConformanceFailure), if this is one.
    pub fn report(&self) -> Option<&ConformanceReport> {
        match self {
            ConformanceError::ConformanceFailure { report, .. } => Some(report),
            _ => None,
        }
    }
}
