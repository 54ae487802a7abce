//! Streaming exec: a command's stdin fed from the caller, its stdout and stderr delivered as
//! ordered, tagged chunks while it runs, its exit last.
//!
//! Streaming is the primitive; the collected [`crate::Sandbox::exec`] is [`ExecStream::collect`]
//! over it ([`collect_exec`](crate::backend_kit::collect_exec) for a backend with a native stream). The stream is a bounded channel: a backend's producer waits for the consumer, so a
//! slow consumer makes the host hold at most [`STREAM_BUFFER_CHUNKS`] chunks of at most
//! [`MAX_CHUNK_BYTES`] each, never the whole output.

use std::fmt;

use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use crate::{ExecOutput, ExecRequest, Sandbox, SandboxError};

/// The largest chunk a stream carries; a backend's larger reads are split.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// How many chunks a stream holds between its producer and its consumer.
pub const STREAM_BUFFER_CHUNKS: usize = 4;

/// The collected exec of a backend whose [`Sandbox::exec_stream`] is native: the request capped
/// at its output budget, stdin closed, the stream read to its end. Implementing
/// [`Sandbox::exec`] with it keeps one code path for collected and streamed exec.
///
/// Only for a backend that implements `exec_stream` itself: the trait's default `exec_stream`
/// calls `exec`, and the two would call each other forever.
///
/// # Errors
/// As [`Sandbox::exec_stream`] before the command starts, then as [`ExecStream::collect`].
///
/// # Cancel safety and drop
/// Dropping the future drops the stream: the command is killed as on its deadline.
pub async fn collect_exec<S: Sandbox + ?Sized>(
    sandbox: &S,
    request: ExecRequest,
) -> Result<ExecOutput, SandboxError> {
    let budget = request.output_budget();
    sandbox
        .exec_stream(request.max_output_bytes(budget), ExecStdin::Closed)
        .await?
        .collect()
        .await
}

/// What a streamed command reads on its stdin.
#[derive(Default)]
pub enum ExecStdin {
    /// Nothing: stdin is not attached (the command reads end of file at once).
    #[default]
    Closed,
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// Everything this reader yields, then end of file. The backend reads it only as fast as the
    /// command consumes it; a command that exits without reading it ends the feed, not the call.
    Reader(Box<dyn AsyncRead + Send + Unpin>),
}

impl ExecStdin {
    /// Stdin from any reader.
    pub fn reader(reader: impl AsyncRead + Send + Unpin + 'static) -> Self {
        ExecStdin::Reader(Box::new(reader))
    }

    /// Whether the command gets no bytes at all (closed, or empty bytes).
    pub fn is_empty(&self) -> bool {
        match self {
            ExecStdin::Closed => true,
            ExecStdin::Bytes(bytes) => bytes.is_empty(),
            ExecStdin::Reader(_) => false,
        }
    }
}

impl fmt::Debug for ExecStdin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecStdin::Closed => f.write_str("Closed"),
            ExecStdin::Bytes(bytes) => write!(f, "Bytes({} bytes)", bytes.len()),
            ExecStdin::Reader(_) => f.write_str("Reader"),
        }
    }
}

impl From<Vec<u8>> for ExecStdin {
    fn from(bytes: Vec<u8>) -> Self {
        ExecStdin::Bytes(bytes)
    }
}

/// One piece of a streamed command's output, in the order the backend received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecChunk {
    /// Bytes the command wrote on stdout.
    Stdout(Vec<u8>),
    /// Bytes the command wrote on stderr (wrapper transport text removed).
    Stderr(Vec<u8>),
}

impl ExecChunk {
    /// The bytes, whichever stream they came from.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ExecChunk::Stdout(bytes) | ExecChunk::Stderr(bytes) => bytes,
        }
    }
}

/// How a streamed command that ran to completion ended, or why it never started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecExit {
    /// The command's exit status, verbatim.
    pub exit_code: i32,
    /// As [`ExecOutput::producer_owns_stderr`].
    pub producer_owns_stderr: bool,
    /// As [`ExecOutput::not_started`]: `Some(reason)` (with exit 125 and no output) when the
    /// working directory could not be entered.
    pub not_started: Option<String>,
}

impl ExecExit {
    /// The exit of a command that started and exited with `exit_code`.
    pub fn exited(exit_code: i32) -> Self {
        ExecExit {
            exit_code,
            producer_owns_stderr: false,
            not_started: None,
        }
    }

    /// The exit of a command that never started because its working directory could not be
    /// entered; `reason` is the guest's own message.
    pub fn workdir_unusable(reason: impl Into<String>) -> Self {
        ExecExit {
            exit_code: crate::WORKDIR_UNUSABLE_EXIT,
            producer_owns_stderr: false,
            not_started: Some(reason.into()),
        }
    }
}

/// What [`ExecStream::next`] yields: chunks, then the exit once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// Output.
    Output(ExecChunk),
    /// The command ran to completion; nothing follows.
    Exit(ExecExit),
}

type Item = Result<ExecEvent, SandboxError>;

/// A running command's output, read with [`next`](Self::next) or gathered with
/// [`collect`](Self::collect).
///
/// # Cancel safety and drop
/// [`next`](Self::next) is cancel safe: a chunk is either returned or still queued. Dropping the
/// stream before its exit ends the command as its deadline would: the backend kills the command's
/// processes in a task the caller cannot cancel, and the sandbox keeps serving when the kill lands.
pub struct ExecStream {
    events: mpsc::Receiver<Item>,
    ended: bool,
}

impl fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecStream")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ExecStream {
    /// A stream and the sender a backend's producer feeds it through. `cap` is the total of stdout
    /// and stderr bytes the stream accepts (`None`: no total).
    pub fn channel(cap: Option<u64>) -> (ExecStreamSender, ExecStream) {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER_CHUNKS);
        (
            ExecStreamSender { tx, cap, sent: 0 },
            ExecStream {
                events: rx,
                ended: false,
            },
        )
    }

    /// A stream over a finished command's collected output: its stdout, its stderr, its exit.
    pub fn from_output(output: ExecOutput) -> ExecStream {
        let mut items: Vec<Item> = Vec::new();
        for chunk in output.stdout.chunks(MAX_CHUNK_BYTES) {
            items.push(Ok(ExecEvent::Output(ExecChunk::Stdout(chunk.to_vec()))));
        }
        for chunk in output.stderr.chunks(MAX_CHUNK_BYTES) {
            items.push(Ok(ExecEvent::Output(ExecChunk::Stderr(chunk.to_vec()))));
        }
        items.push(Ok(ExecEvent::Exit(ExecExit {
            exit_code: output.exit_code,
            producer_owns_stderr: output.producer_owns_stderr,
            not_started: output.not_started,
        })));
        let (tx, rx) = mpsc::channel(items.len());
        for item in items {
            // The channel was sized for every item.
            let _ = tx.try_send(item);
        }
        ExecStream {
            events: rx,
            ended: false,
        }
    }

    /// The next chunk, or the exit; `None` once the exit or an error has been returned.
    ///
    /// # Errors
    /// Whatever ended the command other than its own exit, as the collected exec reports it:
    /// [`SandboxError::Timeout`] (with the kill's cleanup), [`SandboxError::OutputLimitExceeded`]
    /// when the output passed the stream's cap, an engine failure. A producer that vanished
    /// without an exit is an engine failure, never an exit code.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub async fn next(&mut self) -> Option<Result<ExecEvent, SandboxError>> {
        if self.ended {
            return None;
        }
        let item = match self.events.recv().await {
            Some(item) => item,
            None => Err(SandboxError::engine(
                "the exec stream ended without the command's exit",
            )),
        };
        if !matches!(item, Ok(ExecEvent::Output(_))) {
            self.ended = true;
            self.events.close();
        }
        Some(item)
    }

    /// Reads the stream to its end into one [`ExecOutput`].
    ///
    /// Memory is bounded by the stream's cap, which the collected exec always sets (its output
    /// budget).
    ///
    /// # Errors
    /// As [`next`](Self::next).
    ///
    /// # Cancel safety and drop
    /// Dropping the future drops the stream: the command is killed as on its deadline.
    pub async fn collect(mut self) -> Result<ExecOutput, SandboxError> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Output(ExecChunk::Stdout(bytes)) => stdout.extend_from_slice(&bytes),
                ExecEvent::Output(ExecChunk::Stderr(bytes)) => stderr.extend_from_slice(&bytes),
                ExecEvent::Exit(exit) => {
                    return Ok(ExecOutput {
                        stdout,
                        stderr,
                        exit_code: exit.exit_code,
                        producer_owns_stderr: exit.producer_owns_stderr,
                        not_started: exit.not_started,
                    })
                }
            }
        }
        Err(SandboxError::engine(
            "the exec stream was read after its end",
        ))
    }
}

/// Why a chunk was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendRefused {
    /// The consumer dropped the stream: kill the command.
    Dropped,
    /// The chunk would pass the stream's cap: kill the command and
    /// [`finish`](ExecStreamSender::finish) with [`SandboxError::OutputLimitExceeded`].
    OverCap {
        /// The cap.
        limit: u64,
    },
}

/// A backend's end of an [`ExecStream`]: chunks in order, then one outcome.
#[derive(Debug)]
pub struct ExecStreamSender {
    tx: mpsc::Sender<Item>,
    cap: Option<u64>,
    sent: u64,
}

impl ExecStreamSender {
    /// Delivers a chunk, split into pieces of at most [`MAX_CHUNK_BYTES`], waiting while the
    /// consumer is behind. An empty chunk is not delivered. A chunk that would pass the cap is
    /// refused whole: nothing of it is delivered.
    ///
    /// # Errors
    /// [`SendRefused::Dropped`] when the stream is gone, [`SendRefused::OverCap`] when the total
    /// would pass the cap.
    ///
    /// # Cancel safety
    /// Not cancel safe: a piece may have been delivered when the future is dropped.
    pub async fn send(&mut self, chunk: ExecChunk) -> Result<(), SendRefused> {
        let (is_stdout, bytes) = match chunk {
            ExecChunk::Stdout(bytes) => (true, bytes),
            ExecChunk::Stderr(bytes) => (false, bytes),
        };
        if bytes.is_empty() {
            return Ok(());
        }
        let total = self.sent.saturating_add(bytes.len() as u64);
        if let Some(limit) = self.cap.filter(|limit| total > *limit) {
            return Err(SendRefused::OverCap { limit });
        }
        self.sent = total;
        let pieces: Vec<Vec<u8>> = if bytes.len() <= MAX_CHUNK_BYTES {
            vec![bytes]
        } else {
            bytes.chunks(MAX_CHUNK_BYTES).map(<[u8]>::to_vec).collect()
        };
        for piece in pieces {
            let chunk = if is_stdout {
                ExecChunk::Stdout(piece)
            } else {
                ExecChunk::Stderr(piece)
            };
            self.tx
                .send(Ok(ExecEvent::Output(chunk)))
                .await
                .map_err(|_| SendRefused::Dropped)?;
        }
        Ok(())
    }

    /// Ends the stream with the command's exit or the error that ended it.
    ///
    /// # Cancel safety
    /// Dropping the future before the consumer takes the outcome loses it: the consumer then reads
    /// an engine failure, never an exit code.
    pub async fn finish(self, outcome: Result<ExecExit, SandboxError>) {
        let _ = self.tx.send(outcome.map(ExecEvent::Exit)).await;
    }

    /// Resolves once the consumer has dropped the stream.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn dropped(&self) {
        self.tx.closed().await;
    }

    /// Whether the consumer has dropped the stream.
    pub fn is_dropped(&self) -> bool {
        self.tx.is_closed()
    }

    /// The cap this stream was made with.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[tokio::test]
    async fn chunks_arrive_in_order_then_the_exit() {
        let (mut tx, mut stream) = ExecStream::channel(None);
        let producer = tokio::spawn(async move {
            tx.send(ExecChunk::Stdout(b"a".to_vec())).await.unwrap();
            tx.send(ExecChunk::Stderr(b"b".to_vec())).await.unwrap();
            tx.send(ExecChunk::Stdout(Vec::new())).await.unwrap();
            tx.send(ExecChunk::Stdout(b"c".to_vec())).await.unwrap();
            tx.finish(Ok(ExecExit::exited(3))).await;
        });
        let mut seen = Vec::new();
        while let Some(event) = stream.next().await {
            seen.push(event.unwrap());
        }
        producer.await.unwrap();
        assert_eq!(
            seen,
            [
                ExecEvent::Output(ExecChunk::Stdout(b"a".to_vec())),
                ExecEvent::Output(ExecChunk::Stderr(b"b".to_vec())),
                ExecEvent::Output(ExecChunk::Stdout(b"c".to_vec())),
                ExecEvent::Exit(ExecExit::exited(3)),
            ]
        );
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_slow_consumer_holds_the_producer_at_the_buffer() {
        let (mut tx, mut stream) = ExecStream::channel(None);
        let producer = tokio::spawn(async move {
            let mut delivered = 0usize;
            for _ in 0..64 {
                tx.send(ExecChunk::Stdout(vec![b'x'; MAX_CHUNK_BYTES]))
                    .await
                    .unwrap();
                delivered += 1;
            }
            delivered
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!producer.is_finished());
        // Nothing was read yet: the channel holds its capacity and the producer waits.
        let mut read = 0;
        while let Some(Ok(ExecEvent::Output(chunk))) = stream.next().await {
            assert!(chunk.bytes().len() <= MAX_CHUNK_BYTES);
            read += 1;
            if read == 64 {
                break;
            }
        }
        assert_eq!(producer.await.unwrap(), 64);
    }

    #[tokio::test]
    async fn large_chunks_are_split_and_the_cap_refuses_whole_chunks() {
        let (mut tx, mut stream) = ExecStream::channel(Some(MAX_CHUNK_BYTES as u64 * 2 + 1));
        let producer = tokio::spawn(async move {
            tx.send(ExecChunk::Stderr(vec![1; MAX_CHUNK_BYTES * 2]))
                .await
                .unwrap();
            let refused = tx.send(ExecChunk::Stdout(vec![2; 2])).await;
            assert_eq!(
                refused,
                Err(SendRefused::OverCap {
                    limit: MAX_CHUNK_BYTES as u64 * 2 + 1
                })
            );
            tx.send(ExecChunk::Stdout(vec![3])).await.unwrap();
            let limit = tx.cap().unwrap();
            tx.finish(Err(SandboxError::OutputLimitExceeded { limit }))
                .await;
        });
        let mut sizes = Vec::new();
        let error = loop {
            match stream.next().await.unwrap() {
                Ok(ExecEvent::Output(chunk)) => sizes.push(chunk.bytes().len()),
                Ok(ExecEvent::Exit(_)) => panic!("an exit after a refusal"),
                Err(error) => break error,
            }
        };
        producer.await.unwrap();
        assert_eq!(sizes, [MAX_CHUNK_BYTES, MAX_CHUNK_BYTES, 1]);
        assert_eq!(error.kind(), ErrorKind::OutputLimitExceeded);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn dropping_the_stream_is_seen_by_the_producer() {
        let (mut tx, stream) = ExecStream::channel(None);
        assert!(!tx.is_dropped());
        drop(stream);
        tx.dropped().await;
        assert!(tx.is_dropped());
        assert_eq!(
            tx.send(ExecChunk::Stdout(b"x".to_vec())).await,
            Err(SendRefused::Dropped)
        );
    }

    #[tokio::test]
    async fn a_vanished_producer_is_an_engine_failure() {
        let (tx, stream) = ExecStream::channel(None);
        drop(tx);
        let error = stream.collect().await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Engine);
    }

    #[tokio::test]
    async fn collecting_round_trips_an_output() {
        let output = ExecOutput::exited(vec![7; MAX_CHUNK_BYTES + 3], b"err".to_vec(), 9);
        let collected = ExecStream::from_output(output.clone())
            .collect()
            .await
            .unwrap();
        assert_eq!(collected, output);
        let unusable = ExecOutput::workdir_unusable("sh: cd: can't cd to /gone");
        let collected = ExecStream::from_output(unusable.clone())
            .collect()
            .await
            .unwrap();
        assert_eq!(collected, unusable);
        assert!(ExecStdin::Closed.is_empty());
        assert!(ExecStdin::from(Vec::new()).is_empty());
        assert!(!ExecStdin::reader(&b"x"[..]).is_empty());
    }
}
