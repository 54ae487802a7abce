//! Reading a wrapper call's result on the host: the nonce line separates transport noise from
//! the command's own stderr.

use crate::call_identity::Nonce;
use crate::nonce_splitter::{CallEnd, NonceSplitter};
use crate::wrapper_scripts::WRAPPER_FAILURE_EXIT;
use bounded_process::{ExitKind, RunOutput};

/// The word of the sbx `bind` stage's marker line `<nonce>-unmounted`.
pub(crate) const UNMOUNTED_WORD: &str = "unmounted";

/// The word of the marker line `<nonce>-nocwd` the wrapper prints when it cannot enter the
/// working directory, followed by the shell's own message.
pub(crate) const NO_CWD_WORD: &str = "nocwd";

/// How many trailing stderr bytes a failure outcome keeps for the backend's classification.
pub const STDERR_TAIL_BYTES: usize = 4096;

/// How many bytes of the shell's message a [`WrapperOutcome::NoWorkingDirectory`] keeps.
pub const NO_CWD_REASON_BYTES: usize = 1024;

/// A command's result, as the wrapper reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrapperOutput {
    /// The client's stdout: every byte is the command's.
    pub stdout: Vec<u8>,
    /// The client's stderr after the nonce line: every byte is the command's.
    pub stderr: Vec<u8>,
    /// The command's exit status, verbatim (a 125 or 127 after the nonce is the command's).
    pub status: i32,
}

/// What a wrapper call's client output means.
///
/// Only [`WrapperOutcome::Ran`] is a command result. A backend never turns any other variant into
/// an exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WrapperOutcome {
    /// The nonce line was found and the client exited: the command ran.
    Ran(WrapperOutput),
    /// No nonce line, but the `<nonce>-nocwd` line and exit 125: the wrapper could not enter the
    /// working directory (missing, not a directory, not searchable), so the command never
    /// started. Never the command's own 125: the marker can only come before the nonce line.
    NoWorkingDirectory {
        /// The shell's message about the failed `cd` (at most [`NO_CWD_REASON_BYTES`] of it,
        /// invalid UTF-8 replaced, surrounding whitespace trimmed); a fixed text when the shell
        /// said nothing.
        reason: String,
    },
    /// The sbx `bind` stage found no marker: the directory bound at the parent is another
    /// sandbox's workspace.
    Unmounted,
    /// No nonce line: the engine, the transport or the wrapper failed before the command could
    /// start. Never a command's exit code.
    NoNonce {
        /// The client's exit status.
        status: i32,
        /// The last [`STDERR_TAIL_BYTES`] bytes of the client's stderr, for classification.
        stderr_tail: Vec<u8>,
    },
    /// The client was killed by a signal this crate did not send: an engine failure whatever it
    /// printed, never "exit 1".
    ClientKilled {
        /// The signal number.
        signal: i32,
        /// The last [`STDERR_TAIL_BYTES`] bytes of the client's stderr.
        stderr_tail: Vec<u8>,
    },
}

/// Reads a wrapper call's result (docs/wrapper-protocol.md#reading-the-result).
///
/// The [`NonceSplitter`] over the whole stderr: the first nonce line `<nonce>\n` splits it, bytes
/// before are transport noise (logged at debug level, never returned), bytes after are the
/// command's. A marker line first: `<nonce>-nocwd\n` with exit 125 means
/// [`WrapperOutcome::NoWorkingDirectory`] (the message after the marker is the reason),
/// `<nonce>-unmounted\n` means [`WrapperOutcome::Unmounted`]; anything else is
/// [`WrapperOutcome::NoNonce`]. A guest can print the nonce again or forge text after it, but that
/// only changes its own result: it cannot write before the real nonce line.
pub fn parse_result(
    stdout: Vec<u8>,
    stderr: &[u8],
    status: ExitKind,
    nonce: &Nonce,
) -> WrapperOutcome {
    let mut splitter = NonceSplitter::new(nonce);
    let command_stderr = splitter.push(stderr);
    outcome_of(splitter.read_end(status), stdout, command_stderr)
}

/// The outcome of a call whose end the [`NonceSplitter`] read, with the bytes the caller kept:
/// `stdout` and the command's stderr (what the splitter returned), used only when it ran. The
/// one place a marker line's word and status become an outcome.
pub(crate) fn outcome_of(end: CallEnd, stdout: Vec<u8>, command_stderr: Vec<u8>) -> WrapperOutcome {
    match end {
        CallEnd::Ran { status } => WrapperOutcome::Ran(WrapperOutput {
            stdout,
            stderr: command_stderr,
            status,
        }),
        CallEnd::Marker { word, .. } if word == UNMOUNTED_WORD => WrapperOutcome::Unmounted,
        CallEnd::Marker {
            word,
            status: WRAPPER_FAILURE_EXIT,
            message,
            ..
        } if word == NO_CWD_WORD => {
            let message = &message[..message.len().min(NO_CWD_REASON_BYTES)];
            let reason = String::from_utf8_lossy(message).trim().to_owned();
            WrapperOutcome::NoWorkingDirectory {
                reason: if reason.is_empty() {
                    "the working directory cannot be entered".to_owned()
                } else {
                    reason
                },
            }
        }
        // A marker with another status, or one this crate's wrappers never print: the call
        // failed before the command.
        CallEnd::Marker {
            status,
            stderr_tail,
            ..
        }
        | CallEnd::NoNonce {
            status,
            stderr_tail,
        } => WrapperOutcome::NoNonce {
            status,
            stderr_tail,
        },
        CallEnd::ClientKilled {
            signal,
            stderr_tail,
        } => WrapperOutcome::ClientKilled {
            signal,
            stderr_tail,
        },
    }
}

/// [`parse_result`] over a runner's output.
pub fn parse_run_output(output: RunOutput, nonce: &Nonce) -> WrapperOutcome {
    parse_result(output.stdout, &output.stderr, output.status, nonce)
}

/// Whether a wrapper call's stderr, complete or as far as it has arrived, holds the nonce line:
/// the command was about to start. Feed it to [`crate::kill::KillReport::after_start`] after a
/// kill, so a call whose record is gone is never read as "never started". With
/// [`bounded_process::BoundedCommand::on_line`], compare each stderr line with [`Nonce::line`]
/// instead.
pub fn nonce_line_seen(stderr: &[u8], nonce: &Nonce) -> bool {
    find(stderr, &nonce.line()).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonce() -> Nonce {
        Nonce::parse("0123456789abcdef01234567").unwrap()
    }

    fn ran(stderr: &[u8], code: i32) -> WrapperOutcome {
        parse_result(b"out".to_vec(), stderr, ExitKind::Exited(code), &nonce())
    }

    #[test]
    fn nonce_first_gives_the_command_stderr() {
        let outcome = ran(b"0123456789abcdef01234567\nerr\n", 3);
        assert_eq!(
            outcome,
            WrapperOutcome::Ran(WrapperOutput {
                stdout: b"out".to_vec(),
                stderr: b"err\n".to_vec(),
                status: 3
            })
        );
    }

    #[test]
    fn noise_before_the_nonce_is_dropped() {
        let outcome = ran(b"warning: slow\n0123456789abcdef01234567\nerr", 0);
        assert!(matches!(outcome, WrapperOutcome::Ran(o) if o.stderr == b"err"));
    }

    #[test]
    fn a_repeated_nonce_belongs_to_the_command() {
        let outcome = ran(
            b"0123456789abcdef01234567\n0123456789abcdef01234567-unmounted\n",
            125,
        );
        let WrapperOutcome::Ran(output) = outcome else {
            panic!("a nonce line was present: {outcome:?}");
        };
        assert_eq!(output.stderr, b"0123456789abcdef01234567-unmounted\n");
        assert_eq!(output.status, 125);
    }

    #[test]
    fn no_cwd_marker_without_the_nonce_line_is_not_started() {
        assert_eq!(
            ran(
                b"noise\n0123456789abcdef01234567-nocwd\nsh: 1: cd: can't cd to /gone\n",
                125
            ),
            WrapperOutcome::NoWorkingDirectory {
                reason: "sh: 1: cd: can't cd to /gone".into()
            }
        );
        // The shell said nothing (the directory appeared between the two `cd`s).
        assert!(matches!(
            ran(b"0123456789abcdef01234567-nocwd\n", 125),
            WrapperOutcome::NoWorkingDirectory { reason } if !reason.is_empty()
        ));
        // The reason is bounded.
        let mut long = b"0123456789abcdef01234567-nocwd\n".to_vec();
        long.extend(std::iter::repeat_n(b'm', NO_CWD_REASON_BYTES * 4));
        let WrapperOutcome::NoWorkingDirectory { reason } = ran(&long, 125) else {
            panic!("the marker was present");
        };
        assert_eq!(reason.len(), NO_CWD_REASON_BYTES);
        // The wrapper exits 125 after the marker; any other status is not its report.
        assert!(matches!(
            ran(b"0123456789abcdef01234567-nocwd\n", 1),
            WrapperOutcome::NoNonce { status: 1, .. }
        ));
        // Another call's marker is noise.
        assert!(matches!(
            ran(b"ffffffffffffffffffffffff-nocwd\n", 125),
            WrapperOutcome::NoNonce { .. }
        ));
        // A marker word no wrapper prints, even with the wrapper's 125, is a failure before
        // the command, never a working-directory report.
        assert!(matches!(
            ran(b"0123456789abcdef01234567-other\n", 125),
            WrapperOutcome::NoNonce { status: 125, .. }
        ));
    }

    #[test]
    fn the_nonce_line_is_seen_only_where_it_is() {
        let line = nonce().line();
        // Noise longer than the line, and another call's nonce line of the same length: neither
        // is this call's line.
        let other = Nonce::parse("fedcba9876543210fedcba98").unwrap().line();
        assert!(!nonce_line_seen(&other, &nonce()));
        let mut stderr =
            b"transport noise before the command starts, longer than a nonce line\n".to_vec();
        assert!(stderr.len() > line.len());
        assert!(!nonce_line_seen(&stderr, &nonce()));
        stderr.extend_from_slice(&line);
        stderr.extend_from_slice(b"the command's own stderr\n");
        assert!(nonce_line_seen(&stderr, &nonce()));
        // Half a line is not the line.
        assert!(!nonce_line_seen(&line[..line.len() / 2], &nonce()));
    }

    #[test]
    fn a_marker_after_the_nonce_line_is_the_commands_own_output() {
        let outcome = ran(
            b"0123456789abcdef01234567\n0123456789abcdef01234567-nocwd\ncd: forged\n",
            125,
        );
        let WrapperOutcome::Ran(output) = outcome else {
            panic!("a nonce line was present: {outcome:?}");
        };
        assert_eq!(output.status, 125);
        assert_eq!(
            output.stderr,
            b"0123456789abcdef01234567-nocwd\ncd: forged\n"
        );
    }

    #[test]
    fn unmounted_without_the_nonce_line() {
        assert_eq!(
            ran(b"0123456789abcdef01234567-unmounted\n", 1),
            WrapperOutcome::Unmounted
        );
    }

    #[test]
    fn no_nonce_is_never_a_result() {
        let outcome = ran(b"Error: No such container: abc\n", 1);
        assert_eq!(
            outcome,
            WrapperOutcome::NoNonce {
                status: 1,
                stderr_tail: b"Error: No such container: abc\n".to_vec()
            }
        );
        // A nonce without its newline is not the nonce line.
        assert!(matches!(
            ran(b"0123456789abcdef01234567", 125),
            WrapperOutcome::NoNonce { status: 125, .. }
        ));
        // Another call's nonce is noise.
        assert!(matches!(
            ran(b"ffffffffffffffffffffffff\n", 0),
            WrapperOutcome::NoNonce { .. }
        ));
    }

    #[test]
    fn a_signalled_client_is_never_a_result() {
        let outcome = parse_result(
            Vec::new(),
            b"0123456789abcdef01234567\n",
            ExitKind::Signaled(9),
            &nonce(),
        );
        assert!(matches!(
            outcome,
            WrapperOutcome::ClientKilled { signal: 9, .. }
        ));
    }

    #[test]
    fn the_tail_is_bounded() {
        let long = vec![b'e'; STDERR_TAIL_BYTES * 3];
        let WrapperOutcome::NoNonce { stderr_tail, .. } = ran(&long, 1) else {
            panic!("no nonce expected");
        };
        assert_eq!(stderr_tail.len(), STDERR_TAIL_BYTES);
    }
}
