//! How the host reads a kill script: did the kill land (keep the sandbox) or not (retire it),
//! and which kill was it?

use bounded_process::{ExitKind, Result, RunOutput};

/// Kill script exit: the recorded group was killed and no member is left.
pub(crate) const KILL_EXIT_KILLED: i32 = 0;
/// Kill script exit: the record is malformed (empty, incomplete, not digits, 0, 1, too large).
pub(crate) const KILL_EXIT_BAD_RECORD: i32 = 3;
/// Kill script exit: no pid file, so the command never started (and now never will) or already
/// finished.
pub(crate) const KILL_EXIT_NEVER_STARTED: i32 = 4;
/// Kill script exit: the cancel file could not be written.
pub(crate) const KILL_EXIT_NO_CANCEL_FILE: i32 = 5;
/// Kill script exit: a group member survived 30 polls, or the shell's `kill` did not understand
/// the call.
pub(crate) const KILL_EXIT_SURVIVOR: i32 = 6;

/// Exact kill exit: every process in the call's subreaper tree was killed (Docker shape under the
/// engine's init).
pub(crate) const KILL_EXIT_KILLED_TREE: i32 = 10;
/// Exact kill exit: the call's PID namespace was killed, and with it every process in it (sbx
/// shape in a PID namespace).
pub(crate) const KILL_EXIT_KILLED_NAMESPACE: i32 = 11;

/// Bound on the kill call's output (64 KiB).
pub const KILL_OUTPUT_BUDGET: usize = 64 * 1024;

/// What the kill call achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillOutcome {
    /// The command was killed (its group, tree or namespace: see [`KillMode`]): keep the sandbox.
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
    /// The kill found no record and no process of a call whose nonce line the host had already
    /// seen: the command started, then removed, altered or escaped what names it (or finished as
    /// the deadline struck). Never read as "never started".
    StartedButUnrecorded,
}

impl KillOutcome {
    /// Maps a kill script's exit status: 0, 10 and 11 → `Killed`, 4 → `NeverStarted`, anything
    /// else → `NotLanded`.
    pub fn from_exit(code: i32) -> KillOutcome {
        match code {
            KILL_EXIT_KILLED | KILL_EXIT_KILLED_TREE | KILL_EXIT_KILLED_NAMESPACE => {
                KillOutcome::Killed
            }
            KILL_EXIT_NEVER_STARTED => KillOutcome::NeverStarted,
            KILL_EXIT_BAD_RECORD => KillOutcome::NotLanded(KillFailure::BadRecord),
            KILL_EXIT_NO_CANCEL_FILE => KillOutcome::NotLanded(KillFailure::CancelFileUnwritable),
            KILL_EXIT_SURVIVOR => KillOutcome::NotLanded(KillFailure::GroupSurvived),
            other => KillOutcome::NotLanded(KillFailure::UnexpectedExit(other)),
        }
    }

    /// Reads a kill call made through [`bounded_process::run_bounded`]: an exit status maps through
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

/// Which kill reached the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KillMode {
    /// The command's own process group only: a process that moved to another group or session
    /// (`setsid`, `setpgrp`, a daemon's double fork) is not reached.
    ProcessGroup,
    /// Every process in the tree of the call's subreaper (the engine's init run as `docker-init
    /// -s`): whatever group or session a descendant moved to, it stays in that tree.
    SubreaperTree,
    /// Every process in the call's own PID namespace.
    PidNamespace,
}

impl KillMode {
    /// The kill a script's exit status reports: 0 → group, 10 → tree, 11 → namespace; `None` for
    /// every status that is not a kill.
    pub fn from_exit(code: i32) -> Option<KillMode> {
        match code {
            KILL_EXIT_KILLED => Some(KillMode::ProcessGroup),
            KILL_EXIT_KILLED_TREE => Some(KillMode::SubreaperTree),
            KILL_EXIT_KILLED_NAMESPACE => Some(KillMode::PidNamespace),
            _ => None,
        }
    }
}

/// A kill's outcome together with the kill that landed (`mode` is `Some` only for `Killed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillReport {
    /// Keep or retire the sandbox.
    pub outcome: KillOutcome,
    /// Which kill reached the command, when one did.
    pub mode: Option<KillMode>,
}

impl KillReport {
    /// Reads a kill script's exit status.
    pub fn from_exit(code: i32) -> KillReport {
        KillReport {
            outcome: KillOutcome::from_exit(code),
            mode: KillMode::from_exit(code),
        }
    }

    /// Reads a kill call made through [`bounded_process::run_bounded`], as [`KillOutcome::from_run`].
    pub fn from_run(result: &Result<RunOutput>) -> KillReport {
        match result {
            Ok(RunOutput {
                status: ExitKind::Exited(code),
                ..
            }) => KillReport::from_exit(*code),
            Ok(_) | Err(_) => KillReport {
                outcome: KillOutcome::NotLanded(KillFailure::CallFailed),
                mode: None,
            },
        }
    }

    /// Applies what the host saw of the call itself. A wrapper prints its nonce line only once
    /// what names the call exists (the engine's init, the outer `unshare`) or is about to be
    /// written (the group record), so once the host has seen that line, "nothing to kill" means
    /// the command removed or escaped it (or finished just as the deadline struck):
    /// [`KillFailure::StartedButUnrecorded`], retire. Without the line the outcome stands.
    pub fn after_start(self, nonce_line_seen: bool) -> KillReport {
        match self.outcome {
            KillOutcome::NeverStarted if nonce_line_seen => KillReport {
                outcome: KillOutcome::NotLanded(KillFailure::StartedButUnrecorded),
                mode: None,
            },
            _ => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bounded_process::Error;

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
    fn exact_kills_are_kills_and_say_which() {
        for (code, mode) in [
            (0, KillMode::ProcessGroup),
            (10, KillMode::SubreaperTree),
            (11, KillMode::PidNamespace),
        ] {
            let report = KillReport::from_exit(code);
            assert_eq!(report.outcome, KillOutcome::Killed);
            assert_eq!(report.mode, Some(mode));
            assert!(report.outcome.landed());
        }
        for code in [3, 4, 5, 6, 12, 125] {
            assert_eq!(KillReport::from_exit(code).mode, None);
        }
    }

    #[test]
    fn nothing_to_kill_after_the_nonce_line_is_not_landed() {
        let never = KillReport::from_exit(4);
        assert_eq!(never.after_start(false).outcome, KillOutcome::NeverStarted);
        assert_eq!(
            never.after_start(true).outcome,
            KillOutcome::NotLanded(KillFailure::StartedButUnrecorded)
        );
        assert!(!never.after_start(true).outcome.landed());
        let killed = KillReport::from_exit(10);
        assert_eq!(killed.after_start(true), killed);
        let failed = KillReport::from_run(&Err(Error::Deadline {
            program: "docker".into(),
            bound: std::time::Duration::from_secs(15),
        }));
        assert_eq!(
            failed.after_start(false).outcome,
            KillOutcome::NotLanded(KillFailure::CallFailed)
        );
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
