//! What a run reports: every probe, with its outcome and how long it took.

use std::fmt;
use std::time::Duration;

use crate::error::ConformanceError;

/// How one probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The backend did what the contract asks.
    Passed,
    /// The backend did not, or a call failed; `why` says which.
    Failed {
        /// The failure, with the error kind when a call returned one.
        why: String,
    },
    /// The probe did not run; `reason` says why (for example "backend does not declare files_list").
    Skipped {
        /// Why it did not run.
        reason: String,
    },
}

impl ProbeOutcome {
    /// The word a summary line starts with: `PASSED`, `FAILED` or `SKIPPED`.
    pub fn label(&self) -> &'static str {
        match self {
            ProbeOutcome::Passed => "PASSED",
            ProbeOutcome::Failed { .. } => "FAILED",
            ProbeOutcome::Skipped { .. } => "SKIPPED",
        }
    }
}

/// One probe's entry in a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    /// The suite label (`FILES_OUT`, `EXEC`, `HARDENING`, ...).
    pub suite: String,
    /// The probe's name, as the spec spells it.
    pub probe: String,
    /// How it ended.
    pub outcome: ProbeOutcome,
    /// How long it ran (zero when skipped).
    pub elapsed: Duration,
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} ({} ms)",
            self.outcome.label(),
            self.suite,
            self.probe,
            self.elapsed.as_millis()
        )?;
        match &self.outcome {
            ProbeOutcome::Passed => Ok(()),
            ProbeOutcome::Failed { why } => write!(f, ": {why}"),
            ProbeOutcome::Skipped { reason } => write!(f, ": {reason}"),
        }
    }
}

/// Every probe of one or more suites, in the order they ran.
///
/// `Display` prints one line per probe followed by the counts, so a live test can print it whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConformanceReport {
    probes: Vec<ProbeReport>,
}

impl ConformanceReport {
    /// An empty report.
    pub fn new() -> Self {
        ConformanceReport::default()
    }

    /// Appends one probe's entry.
    pub fn record(&mut self, probe: ProbeReport) {
        self.probes.push(probe);
    }

    /// Appends every entry of another report.
    pub fn merge(&mut self, other: ConformanceReport) {
        self.probes.extend(other.probes);
    }

    /// Every entry, in run order.
    pub fn probes(&self) -> &[ProbeReport] {
        &self.probes
    }

    /// The entry of `suite`/`probe`, if it is in the report.
    pub fn get(&self, suite: &str, probe: &str) -> Option<&ProbeReport> {
        self.probes
            .iter()
            .find(|p| p.suite == suite && p.probe == probe)
    }

    /// How many probes passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, ProbeOutcome::Passed))
    }

    /// How many probes failed.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, ProbeOutcome::Failed { .. }))
    }

    /// How many probes were skipped.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, ProbeOutcome::Skipped { .. }))
    }

    /// The total time spent in probes.
    pub fn elapsed(&self) -> Duration {
        self.probes.iter().map(|p| p.elapsed).sum()
    }

    /// The failed entries.
    pub fn failures(&self) -> impl Iterator<Item = &ProbeReport> {
        self.probes
            .iter()
            .filter(|p| matches!(p.outcome, ProbeOutcome::Failed { .. }))
    }

    /// Refuses a report with any skipped probe ([`ConformanceError::ProbesSkipped`]).
    pub fn assert_no_skips(&self) -> Result<(), ConformanceError> {
        let skipped: Vec<String> = self
            .probes
            .iter()
            .filter_map(|p| match &p.outcome {
                ProbeOutcome::Skipped { reason } => {
                    Some(format!("{}/{}: {reason}", p.suite, p.probe))
                }
                _ => None,
            })
            .collect();
        if skipped.is_empty() {
            Ok(())
        } else {
            Err(ConformanceError::ProbesSkipped { skipped })
        }
    }

    /// Refuses a report with any failure ([`ConformanceError::ConformanceFailure`], suite label `ALL`
    /// when more than one suite is in the report) or any skip.
    pub fn assert_all_passed(&self) -> Result<(), ConformanceError> {
        let failed_names: Vec<String> = self
            .failures()
            .map(|p| match &p.outcome {
                ProbeOutcome::Failed { why } => format!("{}/{}: {why}", p.suite, p.probe),
                _ => unreachable!("failures() yields failed probes only"),
            })
            .collect();
        if !failed_names.is_empty() {
            let mut suites: Vec<&str> = self.probes.iter().map(|p| p.suite.as_str()).collect();
            suites.dedup();
            let suite = if suites.len() == 1 {
                suites[0].to_owned()
            } else {
                "ALL".to_owned()
            };
            return Err(ConformanceError::ConformanceFailure {
                suite,
                total: self.probes.len(),
                failed_names,
                report: self.clone(),
            });
        }
        self.assert_no_skips()
    }

    fn count(&self, pick: impl Fn(&ProbeOutcome) -> bool) -> usize {
        self.probes.iter().filter(|p| pick(&p.outcome)).count()
    }
}

impl fmt::Display for ConformanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for probe in &self.probes {
            writeln!(f, "{probe}")?;
        }
        write!(
            f,
            "{} probes: {} passed, {} failed, {} skipped in {:.1} s",
            self.probes.len(),
            self.passed(),
            self.failed(),
            self.skipped(),
            self.elapsed().as_secs_f64()
        )
    }
}
