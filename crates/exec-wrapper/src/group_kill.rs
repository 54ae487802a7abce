//! How the host reads the kill script: did the kill land (keep the sandbox) or not (retire it)?

use crate::bounded_runner::{ExitKind, RunOutput};
use crate::error::Result;

/// Kill script exit: the recorded group was killed and no member is left.
pub const KILL_EXIT_KILLED: i32 = 0;
/// Kill script exit: the record is malformed (empty, incomplete, not digits, 0, 1, too large).
pub const KILL_EXIT_BAD_RECORD: i32 = 3;
/// Kill script exit: no pid file, so the command never started (and now never will) or already
/// finished.
pub const KILL_EXIT_NEVER_STARTED: i32 = 4;
/// Kill script exit: the cancel file could not be written.
pub const KILL_EXIT_NO_CANCEL_FILE: i32 = 5;
/// Kill script exit: a group member survived 30 polls, or the shell's `kill` did not understand
/// the call.
pub const KILL_EXIT_SURVIVOR: i32 = 6;

/// Bound on the kill call's output (64 KiB).
pub const KILL_OUTPUT_BUDGET: usize = 64 * 1024;

/// What the kill call achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillOutcome {
    /// The command's group was killed: keep the sandbox.
    Killed,
    /// The command never started and never will (or had already finished): keep the sandbox.
    NeverStarted,
    /// The kill did not land: retire the sandbox (persisted, so other processes replace it).
    NotLanded(KillFailure),
}

/// Why a kill did not land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KillFailure {
    /// Exit 3: the pid record was empty, incomplete or not a group id above 1.
    BadRecord,
    /// Exit 5: the cancel file could not be written.
    CancelFileUnwritable,
    /// Exit 6: a member of the group survived, or `kill` was not understood.
    GroupSurvived,
    /// Any other exit status.
    UnexpectedExit(i32),
    /// The kill call itself failed: timeout, overflow, engine failure, killed by a signal.
    CallFailed,
}

impl KillOutcome {
    /// Maps the kill script's exit status: 0 → `Killed`, 4 → `NeverStarted`, anything else →
    /// `NotLanded`.
    pub fn from_exit(code: i32) -> KillOutcome {
        match code {
            KILL_EXIT_KILLED => KillOutcome::Killed,
            KILL_EXIT_NEVER_STARTED => KillOutcome::NeverStarted,
            KILL_EXIT_BAD_RECORD => KillOutcome::NotLanded(KillFailure::BadRecord),
            KILL_EXIT_NO_CANCEL_FILE => KillOutcome::NotLanded(KillFailure::CancelFileUnwritable),
            KILL_EXIT_SURVIVOR => KillOutcome::NotLanded(KillFailure::GroupSurvived),
            other => KillOutcome::NotLanded(KillFailure::UnexpectedExit(other)),
        }
    }

    /// Reads a kill call made through [`crate::run_bounded`]: an exit status maps through
    /// [`KillOutcome::from_exit`]; a signalled client or any runner error is
    /// [`KillFailure::CallFailed`].
    pub fn from_run(result: &Result<RunOutput>) -> KillOutcome {
        match result {
            Ok(RunOutput {
                status: ExitKind::Exited(code),
                ..
            }) => KillOutcome::from_exit(*code),
            Ok(_) | Err(_) => KillOutcome::NotLanded(KillFailure::CallFailed),
        }
    }

    /// True only for `Killed` and `NeverStarted`: the sandbox may be kept.
    pub fn landed(self) -> bool {
        matches!(self, KillOutcome::Killed | KillOutcome::NeverStarted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn exit_mapping() {
        assert_eq!(KillOutcome::from_exit(0), KillOutcome::Killed);
        assert_eq!(KillOutcome::from_exit(4), KillOutcome::NeverStarted);
        assert_eq!(
            KillOutcome::from_exit(3),
            KillOutcome::NotLanded(KillFailure::BadRecord)
        );
        assert_eq!(
            KillOutcome::from_exit(5),
            KillOutcome::NotLanded(KillFailure::CancelFileUnwritable)
        );
        assert_eq!(
            KillOutcome::from_exit(6),
            KillOutcome::NotLanded(KillFailure::GroupSurvived)
        );
        for other in [1, 2, 125, 126, 127, 137, 255, -1] {
            assert_eq!(
                KillOutcome::from_exit(other),
                KillOutcome::NotLanded(KillFailure::UnexpectedExit(other))
            );
        }
    }

    #[test]
    fn only_killed_and_never_started_land() {
        assert!(KillOutcome::Killed.landed());
        assert!(KillOutcome::NeverStarted.landed());
        for code in [1, 3, 5, 6, 125] {
            assert!(!KillOutcome::from_exit(code).landed());
        }
    }

    #[test]
    fn a_failed_kill_call_does_not_land() {
        let timed_out = Err(Error::Deadline {
            program: "docker".into(),
            bound: std::time::Duration::from_secs(15),
        });
        assert_eq!(
            KillOutcome::from_run(&timed_out),
            KillOutcome::NotLanded(KillFailure::CallFailed)
        );
        let signalled = Ok(RunOutput {
            status: ExitKind::Signaled(9),
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
        });
        assert_eq!(
            KillOutcome::from_run(&signalled),
            KillOutcome::NotLanded(KillFailure::CallFailed)
        );
        let exited = Ok(RunOutput {
            status: ExitKind::Exited(4),
            stdout: Vec::new(),
            stderr: Vec::new(),
            truncated: false,
        });
        assert_eq!(KillOutcome::from_run(&exited), KillOutcome::NeverStarted);
    }
}
