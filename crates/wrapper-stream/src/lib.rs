//! A wrapper call's output fed into a [`sandbox_core`] exec stream: stdout as it comes, stderr
//! through the call's [`NonceSplitter`], so the consumer never sees transport noise however the
//! chunks cut the nonce line (docs/wrapper-protocol.md#reading-the-result).
//!
//! Every backend that runs commands through the exec wrapper and streams their output needs
//! exactly this sink, so it exists once, here. It joins two crates that must not know each other:
//! `exec-wrapper` (the splitter) depends on nothing of ours but `bounded-process` (the
//! [`OutputSink`] shape its runner drives), and `sandbox-core` (the [`ExecStreamSender`]) depends on nothing of ours and does no
//! I/O. Neither can hold a type that names the other's, and no backend may import another, so the
//! sink sits in this small crate above both and below every backend
//! (docs/architecture.md#layering-rules).
//!
//! Scope: routing bytes and mapping the stream's refusals to the runner's errors, and the one
//! reading of a kill's outcome in the contract's terms ([`guest_cleanup`]). Not here: running the
//! command, its deadline, the kill after an early end and what a kill that did not land costs
//! (the backend's), and reading the call's end ([`NonceSplitter::finish`]).
//!
//! ```
//! use bounded_process::{ExitKind, OutputSink, Stream};
//! use exec_wrapper::{Nonce, WrapperOutcome};
//! use sandbox_core::{ExecEvent, ExecStream};
//! use wrapper_stream::WrapperStreamSink;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let nonce = Nonce::parse("0123456789abcdef01234567").unwrap();
//! let (sender, mut stream) = ExecStream::channel(None);
//! let mut sink = WrapperStreamSink::new(sender, &nonce, "docker");
//! let producer = async move {
//!     sink.accept(Stream::Stderr, b"engine noise\n0123456789abcdef01234567\noops").await.unwrap();
//!     let (sender, splitter) = sink.into_parts();
//!     assert!(matches!(splitter.finish(ExitKind::Exited(1)), WrapperOutcome::Ran(ran) if ran.status == 1));
//!     drop(sender);
//! };
//! let (_, event) = tokio::join!(producer, stream.next());
//! assert_eq!(event.unwrap().unwrap(), ExecEvent::Output(sandbox_core::ExecChunk::Stderr(b"oops".to_vec())));
//! # }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bounded_process::{Error, OutputSink, Stream};
use exec_wrapper::kill::KillOutcome;
use exec_wrapper::outcome::NonceSplitter;
use exec_wrapper::Nonce;
use sandbox_core::backend_kit::{ExecStreamSender, SendRefused};
use sandbox_core::{ExecChunk, ExecOutput, ExecStream, GuestCleanup, SandboxError};

/// Feeds one wrapper call's output to its stream; see the crate docs.
#[derive(Debug)]
pub struct WrapperStreamSink {
    sender: ExecStreamSender,
    splitter: NonceSplitter,
    started: Arc<AtomicBool>,
    program: String,
}

impl WrapperStreamSink {
    /// A sink for the call of `nonce` feeding `sender`. `program` names the engine client in the
    /// errors [`accept`](OutputSink::accept) returns (`docker`, `sbx`).
    pub fn new(sender: ExecStreamSender, nonce: &Nonce, program: impl Into<String>) -> Self {
        WrapperStreamSink {
            sender,
            splitter: NonceSplitter::new(nonce),
            started: Arc::new(AtomicBool::new(false)),
            program: program.into(),
        }
    }

    /// A flag raised once the nonce line has come (the command was about to start). It outlives
    /// the sink, so the kill of an abandoned call can still tell "never started" from "gone"
    /// ([`exec_wrapper::kill::KillReport::after_start`]).
    pub fn started_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.started)
    }

    /// The sender (to end the stream) and the splitter (to read the call's end with
    /// [`NonceSplitter::finish`]).
    pub fn into_parts(self) -> (ExecStreamSender, NonceSplitter) {
        (self.sender, self.splitter)
    }
}

impl OutputSink for WrapperStreamSink {
    /// Sends stdout as it is and stderr's command bytes (none before the nonce line).
    ///
    /// # Errors
    ///
    /// [`Error::Abandoned`] when the stream was dropped, [`Error::OutputLimit`] when the chunk
    /// would pass the stream's cap.
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> Result<(), Error> {
        let chunk = match stream {
            Stream::Stdout => ExecChunk::Stdout(bytes.to_vec()),
            Stream::Stderr => {
                let command = self.splitter.push(bytes);
                if self.splitter.started() {
                    self.started.store(true, Ordering::Relaxed);
                }
                ExecChunk::Stderr(command)
            }
        };
        self.sender
            .send(chunk)
            .await
            .map_err(|refused| match refused {
                SendRefused::Dropped => Error::Abandoned {
                    program: self.program.clone(),
                },
                SendRefused::OverCap { limit } => Error::OutputLimit {
                    program: self.program.clone(),
                    budget: usize::try_from(limit).unwrap_or(usize::MAX),
                },
            })
    }

    async fn abandoned(&mut self) {
        self.sender.dropped().await;
    }
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// How a wrapped call a backend runs for itself ended, read from its collected stream: the two
/// ends the contract reports as errors to a caller (the deadline, the output budget) are values
/// here, because the backend decides what each costs (a retry, a retirement, a typed refusal).
#[derive(Debug)]
pub enum GuestEnd {
    /// The command ran to its end (any exit status).
    Ran(ExecOutput),
    /// The deadline passed; the guest side ended as the cleanup says.
    Expired(GuestCleanup),
    /// The output passed its budget; the command was killed (how it ended is logged).
    Overflowed,
}

impl GuestEnd {
    /// Collects `stream` and reads its end.
    ///
    /// # Errors
    /// Every error of [`ExecStream::collect`] but an expired deadline with a known cleanup and an
    /// exceeded output budget.
    ///
    /// # Cancel safety and drop
    /// As [`ExecStream::collect`]: dropping the future drops the stream, and the command is killed
    /// as on its deadline.
    pub async fn collect(stream: ExecStream) -> Result<GuestEnd, SandboxError> {
        match stream.collect().await {
            Ok(output) => Ok(GuestEnd::Ran(output)),
            Err(SandboxError::Timeout {
                cleanup: Some(cleanup),
                ..
            }) => Ok(GuestEnd::Expired(cleanup)),
            Err(SandboxError::OutputLimitExceeded { .. }) => Ok(GuestEnd::Overflowed),
            Err(error) => Err(error),
        }
    }
}

/// How the guest side of a call ended, in the contract's terms, after the kill that followed an
/// expired, over-budget or dropped call: killed, never started, or, when the kill did not land,
/// retired (the backend retires the sandbox).
pub fn guest_cleanup(outcome: KillOutcome) -> GuestCleanup {
    match outcome {
        KillOutcome::Killed => GuestCleanup::Killed,
        KillOutcome::NeverStarted => GuestCleanup::NeverStarted,
        KillOutcome::NotLanded(_) => GuestCleanup::Retired,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bounded_process::ExitKind;
    use exec_wrapper::WrapperOutcome;
    use sandbox_core::{ExecEvent, ExecStream};

    const NONCE: &str = "0123456789abcdef01234567";

    #[test]
    fn a_kill_outcome_reads_as_the_guest_cleanup() {
        use exec_wrapper::kill::{KillFailure, KillReport};
        assert_eq!(guest_cleanup(KillOutcome::Killed), GuestCleanup::Killed);
        assert_eq!(
            guest_cleanup(KillOutcome::NeverStarted),
            GuestCleanup::NeverStarted
        );
        for failure in [
            KillFailure::CallFailed,
            KillFailure::GroupSurvived,
            KillFailure::StartedButUnrecorded,
        ] {
            assert_eq!(
                guest_cleanup(KillOutcome::NotLanded(failure)),
                GuestCleanup::Retired
            );
        }
        // A "never started" after the command's nonce line was seen is a kill that did not land.
        let report = KillReport {
            outcome: KillOutcome::NeverStarted,
            mode: None,
        };
        assert_eq!(
            guest_cleanup(report.after_start(true).outcome),
            GuestCleanup::Retired
        );
    }

    fn nonce() -> Nonce {
        Nonce::parse(NONCE).unwrap()
    }

    async fn drain(mut stream: ExecStream) -> Vec<ExecChunk> {
        let mut chunks = Vec::new();
        while let Some(Ok(ExecEvent::Output(chunk))) = stream.next().await {
            chunks.push(chunk);
        }
        chunks
    }

    #[tokio::test]
    async fn noise_never_reaches_the_stream_however_the_nonce_line_is_cut() {
        let stderr = format!("warning: noise\n{NONCE}\nerr-1\nerr-2");
        for cut in 0..=stderr.len() {
            let (sender, stream) = ExecStream::channel(None);
            let consumer = tokio::spawn(drain(stream));
            let mut sink = WrapperStreamSink::new(sender, &nonce(), "sbx");
            let started = sink.started_flag();
            sink.accept(Stream::Stdout, b"out").await.unwrap();
            sink.accept(Stream::Stderr, &stderr.as_bytes()[..cut])
                .await
                .unwrap();
            sink.accept(Stream::Stderr, &stderr.as_bytes()[cut..])
                .await
                .unwrap();
            assert!(started.load(Ordering::Relaxed), "cut at {cut}");
            let (sender, splitter) = sink.into_parts();
            assert!(matches!(
                splitter.finish(ExitKind::Exited(0)),
                WrapperOutcome::Ran(_)
            ));
            drop(sender);
            let chunks = consumer.await.unwrap();
            let stdout: Vec<u8> = chunks
                .iter()
                .filter(|c| matches!(c, ExecChunk::Stdout(_)))
                .flat_map(|c| c.bytes().to_vec())
                .collect();
            let command_stderr: Vec<u8> = chunks
                .iter()
                .filter(|c| matches!(c, ExecChunk::Stderr(_)))
                .flat_map(|c| c.bytes().to_vec())
                .collect();
            assert_eq!(stdout, b"out");
            assert_eq!(command_stderr, b"err-1\nerr-2", "cut at {cut}");
        }
    }

    #[tokio::test]
    async fn the_flag_stays_down_without_the_nonce_line() {
        let (sender, stream) = ExecStream::channel(None);
        let consumer = tokio::spawn(drain(stream));
        let mut sink = WrapperStreamSink::new(sender, &nonce(), "sbx");
        sink.accept(Stream::Stderr, b"Error: no such sandbox\n")
            .await
            .unwrap();
        assert!(!sink.started_flag().load(Ordering::Relaxed));
        drop(sink);
        assert_eq!(
            consumer.await.unwrap(),
            Vec::new(),
            "noise only: nothing sent"
        );
    }

    #[tokio::test]
    async fn refusals_become_the_runner_errors_naming_the_client() {
        let (sender, stream) = ExecStream::channel(Some(4));
        let consumer = tokio::spawn(drain(stream));
        let mut sink = WrapperStreamSink::new(sender, &nonce(), "docker");
        let over = sink.accept(Stream::Stdout, b"12345").await.unwrap_err();
        assert!(
            matches!(&over, Error::OutputLimit { program, budget: 4 } if program == "docker"),
            "{over:?}"
        );
        drop(sink);
        consumer.await.unwrap();

        let (sender, stream) = ExecStream::channel(None);
        let mut sink = WrapperStreamSink::new(sender, &nonce(), "sbx");
        drop(stream);
        tokio::time::timeout(std::time::Duration::from_secs(5), sink.abandoned())
            .await
            .expect("a dropped stream is seen as abandoned");
        let gone = sink.accept(Stream::Stdout, b"x").await.unwrap_err();
        assert!(
            matches!(&gone, Error::Abandoned { program } if program == "sbx"),
            "{gone:?}"
        );
    }
}
