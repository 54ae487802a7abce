//! What a backend reports about its host when an operator asks whether it can work there (the
//! `doctor` of a CLI): one [`HealthCheck`] per item, each passed, failed with a fix, or not
//! applicable. Plain data: a backend gathers its checks with its own engine calls; this module does
//! no I/O.

use crate::wire::{wire_enum, wire_from_str};

wire_enum! {
    /// How one health check ended.
    pub enum CheckStatus ("check status") {
        /// The item is as the backend needs it.
        Pass => "pass",
        /// It is not; the check's `fix` says what to do.
        Fail => "fail",
        /// It does not apply to this host or configuration.
        NotApplicable => "not_applicable",
    }
}
wire_from_str!(CheckStatus, "check status");

/// One item of a backend's health report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// A stable dotted identifier (`docker.engine`, `sbx.host`, ...).
    pub id: String,
    /// How it ended.
    pub status: CheckStatus,
    /// What was found, in one line.
    pub detail: String,
    /// What to do about a failure; empty otherwise.
    pub fix: String,
}

impl HealthCheck {
    /// A passed check.
    pub fn pass(id: impl Into<String>, detail: impl Into<String>) -> Self {
        HealthCheck {
            id: id.into(),
            status: CheckStatus::Pass,
            detail: detail.into(),
            fix: String::new(),
        }
    }

    /// A failed check with its fix.
    pub fn fail(id: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        HealthCheck {
            id: id.into(),
            status: CheckStatus::Fail,
            detail: detail.into(),
            fix: fix.into(),
        }
    }

    /// A check that does not apply here.
    pub fn not_applicable(id: impl Into<String>, detail: impl Into<String>) -> Self {
        HealthCheck {
            id: id.into(),
            status: CheckStatus::NotApplicable,
            detail: detail.into(),
            fix: String::new(),
        }
    }

    /// Whether it failed.
    pub fn failed(&self) -> bool {
        self.status == CheckStatus::Fail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_wire_strings_and_checks_say_whether_they_failed() {
        let wires: Vec<&str> = CheckStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(wires, ["pass", "fail", "not_applicable"]);
        for status in CheckStatus::ALL {
            assert_eq!(status.as_str().parse::<CheckStatus>().unwrap(), *status);
        }
        assert!("passed".parse::<CheckStatus>().is_err());
        assert!(!HealthCheck::pass("a", "ok").failed());
        assert!(HealthCheck::fail("a", "no", "fix it").failed());
        assert!(!HealthCheck::not_applicable("a", "n/a").failed());
        assert_eq!(HealthCheck::fail("a", "no", "fix it").fix, "fix it");
    }
}
