//! The suite engine: the gate checked before planting, per-probe capability skips, every probe run,
//! failures aggregated; and the refusal matcher every probe uses.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::time::Instant;

use sandbox_core::{Capability, ErrorKind, SandboxError};

use crate::error::ConformanceError;
use crate::report::{ConformanceReport, ProbeOutcome, ProbeReport};

/// Why one probe did not pass. Private: the report carries it as text.
#[derive(Debug)]
pub(crate) enum ProbeError {
    /// The backend answered, but not as the contract asks.
    Assertion(String),
    /// The harness could not judge (a guest utility answered with an unreadable status). Never a pass.
    Harness(String),
    /// A call returned an error where none was expected.
    Call(SandboxError),
    /// A harness seam failed.
    Setup(ConformanceError),
    /// The backend's test module does not provide what the probe needs (an engine-side view): the
    /// probe is reported as skipped, which a CI run refuses.
    Unsupported(String),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Assertion(why) => f.write_str(why),
            ProbeError::Harness(why) => write!(f, "harness error: {why}"),
            ProbeError::Call(e) => write!(f, "returned `{:?}`: {e}", e.kind()),
            ProbeError::Setup(e) => write!(f, "{e}"),
            ProbeError::Unsupported(why) => write!(f, "unsupported: {why}"),
        }
    }
}

impl From<SandboxError> for ProbeError {
    fn from(e: SandboxError) -> Self {
        ProbeError::Call(e)
    }
}

impl From<ConformanceError> for ProbeError {
    fn from(e: ConformanceError) -> Self {
        ProbeError::Setup(e)
    }
}

impl From<RefusalMismatch> for ProbeError {
    fn from(e: RefusalMismatch) -> Self {
        ProbeError::Assertion(e.to_string())
    }
}

/// What one probe returns.
pub(crate) type ProbeResult = Result<(), ProbeError>;

/// Fails the probe with a formatted reason when the condition does not hold.
macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err($crate::suite_runner::ProbeError::Assertion(format!($($why)+)));
        }
    };
}
pub(crate) use ensure;

/// How a suite turns probe outcomes into a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every probe runs; any failure makes the suite fail.
    Aggregate,
    /// Probes stop at the first failure (the storage-base assertions); the rest are reported as not run.
    StopAtFirstFailure,
    /// Every probe runs and nothing is judged (a measurement of a mechanism not yet declared).
    MeasureOnly,
}

/// One run of one suite.
///
/// A suite names its probes once, in a table in the order they run; the suite's exported count is
/// that table's length. The run holds the suite to its table: a probe that runs where the table
/// lists another name, or a table entry never reported, is a failure of the run, so the count and
/// the probes cannot drift apart.
pub(crate) struct SuiteRun<'c> {
    suite: &'static str,
    table: Vec<&'static str>,
    table_mismatches: Vec<String>,
    capabilities: &'c BTreeSet<Capability>,
    verdict: Verdict,
    halted: bool,
    report: ConformanceReport,
}

impl<'c> SuiteRun<'c> {
    /// Starts a suite, refusing it before anything is planted when its gate is not declared.
    pub(crate) fn start(
        suite: &'static str,
        table: &[&'static str],
        gate: Option<Capability>,
        capabilities: &'c BTreeSet<Capability>,
        verdict: Verdict,
    ) -> Result<Self, ConformanceError> {
        if let Some(gate) = gate {
            if !capabilities.contains(&gate) {
                return Err(ConformanceError::gate_not_declared(suite, gate));
            }
        }
        Ok(SuiteRun {
            suite,
            table: table.to_vec(),
            table_mismatches: Vec::new(),
            capabilities,
            verdict,
            halted: false,
            report: ConformanceReport::new(),
        })
    }

    /// The first capability in `requires` that the backend does not declare.
    pub(crate) fn missing(&self, requires: &[Capability]) -> Option<Capability> {
        requires
            .iter()
            .copied()
            .find(|c| !self.capabilities.contains(c))
    }

    /// Whether a probe requiring `requires` would run.
    pub(crate) fn will_run(&self, requires: &[Capability]) -> bool {
        self.missing(requires).is_none()
    }

    /// Runs one probe, or records why it is skipped. The future is only polled when the probe runs.
    pub(crate) async fn probe(
        &mut self,
        name: &'static str,
        requires: &[Capability],
        probe: impl Future<Output = ProbeResult>,
    ) {
        let listed = self.table.get(self.report.probes().len()).copied();
        if listed != Some(name) {
            self.table_mismatches.push(match listed {
                Some(listed) => format!("{name} ran where the probe table lists {listed}"),
                None => format!("{name} ran past the end of the probe table"),
            });
        }
        let skip_reason = if self.halted {
            Some("not run: an earlier step of this suite failed".to_owned())
        } else {
            self.missing(requires)
                .map(|missing| format!("backend does not declare {missing}"))
        };
        let outcome_and_time =
            skip_reason.map(|reason| (ProbeOutcome::Skipped { reason }, Default::default()));
        let (outcome, elapsed) = match outcome_and_time {
            Some(skip) => skip,
            None => {
                let started = Instant::now();
                tracing::debug!(suite = self.suite, probe = name, "probe starts");
                let result = probe.await;
                let elapsed = started.elapsed();
                match result {
                    Ok(()) => (ProbeOutcome::Passed, elapsed),
                    Err(ProbeError::Unsupported(reason)) => {
                        tracing::warn!(suite = self.suite, probe = name, %reason, "probe skipped");
                        (ProbeOutcome::Skipped { reason }, elapsed)
                    }
                    Err(e) => {
                        tracing::warn!(suite = self.suite, probe = name, failure = %e, "probe failed");
                        if self.verdict == Verdict::StopAtFirstFailure {
                            self.halted = true;
                        }
                        (ProbeOutcome::Failed { why: e.to_string() }, elapsed)
                    }
                }
            }
        };
        self.report.record(ProbeReport {
            suite: self.suite.to_owned(),
            probe: name.to_owned(),
            outcome,
            elapsed,
        });
    }

    /// The report, or a [`ConformanceError::ConformanceFailure`] naming every failed probe.
    pub(crate) fn finish(mut self) -> Result<ConformanceReport, ConformanceError> {
        let reported = self.report.probes().len();
        for unreported in self.table.iter().skip(reported) {
            self.table_mismatches.push(format!(
                "{unreported} is in the probe table but was never reported"
            ));
        }
        if !self.table_mismatches.is_empty() {
            return Err(ConformanceError::harness(
                self.suite,
                format!(
                    "the suite and its probe table disagree: {}",
                    self.table_mismatches.join("; ")
                ),
            ));
        }
        if self.verdict == Verdict::MeasureOnly {
            return Ok(self.report);
        }
        let failed_names: Vec<String> = self
            .report
            .probes()
            .iter()
            .filter_map(|p| match &p.outcome {
                ProbeOutcome::Failed { why } => Some(format!("{}: {why}", p.probe)),
                _ => None,
            })
            .collect();
        if failed_names.is_empty() {
            Ok(self.report)
        } else {
            Err(ConformanceError::ConformanceFailure {
                suite: self.suite.to_owned(),
                total: self.report.probes().len(),
                failed_names,
                report: self.report,
            })
        }
    }
}

/// The refusal a probe expects, named after the contract's kinds. The Python reference's exception
/// classes translate as documented on each variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Python `ValueError`: [`ErrorKind::Confinement`] only.
    Confinement,
    /// Python `OSError`: any kind of the I/O family ([`ErrorKind::is_io`]: NotFound, NotADirectory,
    /// IsADirectory, NotRegularFile, GuestRefused, Io). Never a timeout, confinement or a cap.
    AnyIo,
    /// Python `NotADirectoryError`: [`ErrorKind::NotADirectory`] only.
    NotADirectory,
    /// Python `TimeoutError`: [`ErrorKind::Timeout`] only (the caller's bound, not an engine deadline).
    Timeout,
    /// Exactly this kind (the project's own probes: InvalidArgument, OutputLimitExceeded, ...).
    Exactly(ErrorKind),
}

impl Refusal {
    /// Whether an error of `kind` satisfies this expectation.
    pub fn accepts(self, kind: ErrorKind) -> bool {
        match self {
            Refusal::Confinement => kind == ErrorKind::Confinement,
            Refusal::AnyIo => kind.is_io(),
            Refusal::NotADirectory => kind == ErrorKind::NotADirectory,
            Refusal::Timeout => kind == ErrorKind::Timeout,
            Refusal::Exactly(expected) => kind == expected,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Confinement => f.write_str("Confinement"),
            Refusal::AnyIo => f.write_str("an I/O kind"),
            Refusal::NotADirectory => f.write_str("NotADirectory"),
            Refusal::Timeout => f.write_str("Timeout"),
            Refusal::Exactly(kind) => write!(f, "{kind:?}"),
        }
    }
}

/// A call that was expected to be refused and was not, or not in the expected way.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RefusalMismatch {
    /// The call returned normally.
    #[error("expected {expected}, but the call returned normally")]
    ReturnedNormally {
        /// What was expected.
        expected: Refusal,
    },
    /// The call failed with another kind.
    #[error("expected {expected}, but it returned `{:?}`: {error}", error.kind())]
    WrongKind {
        /// What was expected.
        expected: Refusal,
        /// What the call returned.
        error: SandboxError,
    },
}

/// Passes only when `call` fails with a kind `expected` accepts; returns that error.
///
/// Another kind, or a normal return, is a [`RefusalMismatch`]. Cancel safety: dropping the returned
/// future drops `call`.
pub async fn refused_with<T>(
    expected: Refusal,
    call: impl Future<Output = Result<T, SandboxError>>,
) -> Result<SandboxError, RefusalMismatch> {
    match call.await {
        Ok(_) => Err(RefusalMismatch::ReturnedNormally { expected }),
        Err(error) if expected.accepts(error.kind()) => Ok(error),
        Err(error) => Err(RefusalMismatch::WrongKind { expected, error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[&str] = &["first", "second"];

    async fn passes() -> ProbeResult {
        Ok(())
    }

    fn harness_detail(result: Result<ConformanceReport, ConformanceError>) -> String {
        match result {
            Err(ConformanceError::Harness { suite, detail }) => {
                assert_eq!(suite, "T");
                detail
            }
            other => panic!("expected a harness error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_suite_that_runs_its_table_passes() {
        let none = BTreeSet::new();
        let mut run = SuiteRun::start("T", TABLE, None, &none, Verdict::Aggregate).unwrap();
        run.probe("first", &[], passes()).await;
        run.probe("second", &[Capability::Exec], passes()).await;
        let report = run.finish().unwrap();
        // The skipped probe is still reported: the table counts what is reported.
        assert_eq!(report.probes().len(), TABLE.len());
    }

    #[tokio::test]
    async fn a_probe_off_the_table_or_one_never_reported_fails_the_run() {
        let none = BTreeSet::new();
        for verdict in [Verdict::Aggregate, Verdict::MeasureOnly] {
            let mut run = SuiteRun::start("T", TABLE, None, &none, verdict).unwrap();
            run.probe("first", &[], passes()).await;
            let detail = harness_detail(run.finish());
            assert!(
                detail.contains("second is in the probe table but was never reported"),
                "{detail}"
            );

            let mut run = SuiteRun::start("T", TABLE, None, &none, verdict).unwrap();
            run.probe("second", &[], passes()).await;
            run.probe("first", &[], passes()).await;
            run.probe("third", &[], passes()).await;
            let detail = harness_detail(run.finish());
            assert!(
                detail.contains("second ran where the probe table lists first")
                    && detail.contains("first ran where the probe table lists second")
                    && detail.contains("third ran past the end of the probe table"),
                "{detail}"
            );
        }
    }
}
