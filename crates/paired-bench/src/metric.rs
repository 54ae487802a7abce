//! The samples of one report row and how the row is judged, printed and recorded.

use std::time::Duration;

use crate::row::{median, percentile, record_row};

/// How a row is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// The ratio must be at most this.
    AtMost(f64),
    /// The ratio must be at most `ratio` and our side's median at most `ms`.
    AtMostWithin {
        /// The largest ratio that passes.
        ratio: f64,
        /// The largest median of our side, in milliseconds, that passes.
        ms: f64,
    },
    /// Measured and reported, never failed.
    ReportedOnly,
    /// Measured and reported, never failed, with why (said in the line and the row).
    ReportedOnlyBecause(&'static str),
    /// Reported, never failed, against a reference ratio the spec gives; the line says by how
    /// much a miss exceeds it.
    Reference(f64),
    /// Our side's median must be at most this many milliseconds, whatever the raw side's.
    AbsoluteMs(f64),
}

/// How our side's samples relate to the raw side's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pairing {
    /// Sample `i` of each side comes from the same round: the ratio is the median of the
    /// per-round ratios, the time added the median of the per-round differences.
    Rounds,
    /// Each side was timed in batches of its own, so sample `i` of one side is no partner of
    /// sample `i` of the other: the ratio is that of the two medians, the time added their
    /// difference.
    Batches,
}

/// The samples of one metric, in milliseconds.
#[derive(Debug, Clone)]
pub struct Metric {
    name: String,
    against: Option<String>,
    target: Target,
    pairing: Pairing,
    ours: Vec<f64>,
    raw: Vec<f64>,
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

impl Metric {
    /// A metric named `name` (the row's name), judged by `target`, of paired rounds.
    pub fn new(name: impl Into<String>, target: Target) -> Metric {
        Metric {
            name: name.into(),
            against: None,
            target,
            pairing: Pairing::Rounds,
            ours: Vec::new(),
            raw: Vec::new(),
        }
    }

    /// Names the raw side in the report line (`[N rounds; raw: …]`).
    #[must_use]
    pub fn against(mut self, raw: impl Into<String>) -> Metric {
        self.against = Some(raw.into());
        self
    }

    /// Judges the samples as batches each side ran on its own rather than as pairs of one
    /// round: the ratio of the medians and the difference of the medians.
    #[must_use]
    pub fn of_batches(mut self) -> Metric {
        self.pairing = Pairing::Batches;
        self
    }

    /// Records one round's pair `(ours, raw)`.
    pub fn push(&mut self, (ours, raw): (Duration, Duration)) {
        self.push_ms(ms(ours), ms(raw));
    }

    /// Records the pairs of several rounds.
    pub fn extend(&mut self, pairs: impl IntoIterator<Item = (Duration, Duration)>) {
        for pair in pairs {
            self.push(pair);
        }
    }

    /// Records one sample of each side, in milliseconds.
    pub fn push_ms(&mut self, ours: f64, raw: f64) {
        self.ours.push(ours);
        self.raw.push(raw);
    }

    /// How many rounds (or samples of each side) were recorded.
    pub fn rounds(&self) -> usize {
        self.ours.len()
    }

    fn ratio(&self) -> f64 {
        match self.pairing {
            Pairing::Rounds => median(
                self.ours
                    .iter()
                    .zip(&self.raw)
                    .map(|(ours, raw)| ours / raw)
                    .collect(),
            ),
            Pairing::Batches => median(self.ours.clone()) / median(self.raw.clone()),
        }
    }

    fn added(&self) -> f64 {
        match self.pairing {
            Pairing::Rounds => median(
                self.ours
                    .iter()
                    .zip(&self.raw)
                    .map(|(ours, raw)| ours - raw)
                    .collect(),
            ),
            Pairing::Batches => median(self.ours.clone()) - median(self.raw.clone()),
        }
    }

    /// The line's closing `[N rounds]`, or `[N rounds; raw: …]` when the raw side is named.
    fn rounds_note(&self) -> String {
        match &self.against {
            Some(against) => format!("[{} rounds; raw: {against}]", self.rounds()),
            None => format!("[{} rounds]", self.rounds()),
        }
    }

    /// Prints `name: backend X ms, raw Y ms, ratio Z (target …) PASS|FAIL [N rounds]`, where X
    /// and Y are the medians (p50) of each side and Z the ratio, and records the row for
    /// `target/bench/report.json`; with [`Target::AbsoluteMs`], `name: ours X ms at p50 (target
    /// ≤ L ms) PASS|FAIL, raw Y ms [N rounds]` and the ratio X / L. Returns whether the target
    /// (if any) is met.
    ///
    /// # Panics
    /// When no round was recorded.
    pub fn report(&self) -> bool {
        assert!(!self.ours.is_empty(), "{}: no rounds measured", self.name);
        let ours = median(self.ours.clone());
        let raw = median(self.raw.clone());
        if let Target::AbsoluteMs(limit_ms) = self.target {
            return self.report_absolute(ours, raw, limit_ms);
        }
        self.print(&self.name, ours, raw, self.ratio())
    }

    /// The time added on top of the same call against an absolute bound, under `name`: for a
    /// cost where a ratio would hide it behind the transport's own time. Prints `name: ours X
    /// ms, raw Y ms, added Z ms at p50 (target ≤ +L ms) PASS|FAIL [N rounds]` and records the
    /// row with the time added as a share of the bound. Returns whether it is met.
    ///
    /// # Panics
    /// When no round was recorded.
    pub fn report_added(&self, name: &str, limit_ms: f64) -> bool {
        assert!(!self.ours.is_empty(), "{name}: no rounds measured");
        let ours = median(self.ours.clone());
        let raw = median(self.raw.clone());
        let added = self.added();
        let pass = added <= limit_ms;
        println!(
            "{name}: ours {ours:.1} ms, raw {raw:.1} ms, added {added:.1} ms at p50 (target ≤ +{limit_ms:.0} ms) {} {}",
            verdict(pass),
            self.rounds_note()
        );
        record_row(
            name,
            ours,
            raw,
            added / limit_ms,
            &format!("added <= {limit_ms:.0} ms at p50"),
            pass,
        );
        pass
    }

    /// Like [`Metric::report`] for the 95th percentiles: each side's p95 and their ratio, under
    /// `name`.
    ///
    /// # Panics
    /// When no round was recorded.
    pub fn report_p95(&self, name: &str) -> bool {
        assert!(!self.ours.is_empty(), "{name}: no rounds measured");
        let ours = percentile(self.ours.clone(), 0.95);
        let raw = percentile(self.raw.clone(), 0.95);
        self.print(name, ours, raw, ours / raw)
    }

    fn report_absolute(&self, ours: f64, raw: f64, limit_ms: f64) -> bool {
        let pass = ours <= limit_ms;
        println!(
            "{}: ours {ours:.2} ms at p50 (target ≤ {limit_ms:.0} ms) {}, raw {raw:.2} ms {}",
            self.name,
            verdict(pass),
            self.rounds_note()
        );
        record_row(
            &self.name,
            ours,
            raw,
            ours / limit_ms,
            &format!("ours <= {limit_ms:.0} ms at p50"),
            pass,
        );
        pass
    }

    fn print(&self, name: &str, ours: f64, raw: f64, ratio: f64) -> bool {
        let (verdict, target, pass) = judge(self.target, ours, ratio);
        println!(
            "{name}: backend {ours:.1} ms, raw {raw:.1} ms, ratio {ratio:.2} {verdict} {}",
            self.rounds_note()
        );
        record_row(name, ours, raw, ratio, &target, pass);
        pass
    }
}

/// The verdict the line shows, the target the row records, and whether it passes, for a row
/// whose median of our side is `ours` ms and whose ratio is `ratio`.
fn judge(target: Target, ours: f64, ratio: f64) -> (String, String, bool) {
    match target {
        Target::AtMost(limit) => {
            let pass = ratio <= limit;
            (
                format!("(target ≤ {limit:.2}) {}", verdict(pass)),
                format!("<= {limit:.2}"),
                pass,
            )
        }
        Target::AtMostWithin { ratio: limit, ms } => {
            let pass = ratio <= limit && ours <= ms;
            (
                format!("(target ≤ {limit:.2} and ≤ {ms:.0} ms) {}", verdict(pass)),
                format!("<= {limit:.2} and <= {ms:.0} ms at p50"),
                pass,
            )
        }
        Target::ReportedOnly => (
            "(reported only)".to_owned(),
            "reported only".to_owned(),
            true,
        ),
        Target::ReportedOnlyBecause(why) => (
            format!("(reported only: {why})"),
            format!("reported only: {why}"),
            true,
        ),
        Target::Reference(reference) if ratio <= reference => (
            format!("(reported only; within the reference ≤ {reference:.2})"),
            format!("reference <= {reference:.2}"),
            true,
        ),
        Target::Reference(reference) => (
            format!(
                "(reported only; misses the reference ≤ {reference:.2} by {:.0}%)",
                (ratio / reference - 1.0) * 100.0
            ),
            format!("reference <= {reference:.2}"),
            true,
        ),
        // Our side's p95 against the bound, when a p95 row is asked of an absolute metric.
        Target::AbsoluteMs(limit) => {
            let pass = ours <= limit;
            (
                format!("(target ≤ {limit:.0} ms) {}", verdict(pass)),
                format!("ours <= {limit:.0} ms at p50"),
                pass,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(ours: &[u64], raw: &[u64]) -> Vec<(Duration, Duration)> {
        ours.iter()
            .zip(raw)
            .map(|(o, r)| (Duration::from_millis(*o), Duration::from_millis(*r)))
            .collect()
    }

    #[test]
    fn paired_rounds_take_the_median_of_the_per_round_ratios() {
        let mut metric = Metric::new("m", Target::AtMost(1.0));
        // Per-round ratios 1.0, 3.0, 1.0: median 1.0, where the medians' ratio would be 2.0.
        metric.extend(pairs(&[10, 30, 40], &[10, 10, 40]));
        assert_eq!(metric.ratio(), 1.0);
        assert_eq!(metric.added(), 0.0);
    }

    #[test]
    fn batches_take_the_ratio_and_difference_of_the_medians() {
        let mut metric = Metric::new("m", Target::AtMost(1.0)).of_batches();
        metric.extend(pairs(&[10, 30, 40], &[10, 10, 40]));
        assert_eq!(metric.ratio(), 3.0);
        assert_eq!(metric.added(), 20.0);
    }

    #[test]
    fn each_target_judges_and_names_itself_as_the_report_has_it() {
        assert_eq!(
            judge(Target::AtMost(1.1), 5.0, 1.2),
            ("(target ≤ 1.10) FAIL".into(), "<= 1.10".into(), false)
        );
        assert_eq!(
            judge(
                Target::AtMostWithin {
                    ratio: 1.5,
                    ms: 20.0
                },
                25.0,
                1.0
            ),
            (
                "(target ≤ 1.50 and ≤ 20 ms) FAIL".into(),
                "<= 1.50 and <= 20 ms at p50".into(),
                false
            )
        );
        assert_eq!(
            judge(Target::ReportedOnlyBecause("why"), 1.0, 9.0),
            (
                "(reported only: why)".into(),
                "reported only: why".into(),
                true
            )
        );
        assert_eq!(
            judge(Target::Reference(3.0), 1.0, 4.5),
            (
                "(reported only; misses the reference ≤ 3.00 by 50%)".into(),
                "reference <= 3.00".into(),
                true
            )
        );
    }

    #[test]
    fn the_raw_side_is_named_in_the_rounds_note_when_given() {
        let mut metric = Metric::new("m", Target::ReportedOnly);
        metric.extend(pairs(&[1, 1], &[1, 1]));
        assert_eq!(metric.rounds_note(), "[2 rounds]");
        let metric = metric.against("bare");
        assert_eq!(metric.rounds_note(), "[2 rounds; raw: bare]");
    }
}
