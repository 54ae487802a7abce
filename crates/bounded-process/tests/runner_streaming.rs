//! The streaming runner against real processes: chunks before the exit, stdin from a reader,
//! the budget over streamed bytes, and an abandoned or failing sink killing the process tree.

mod common;

use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, Error, ExitKind, OutputSink, Stream};
use common::{read_pids, wait_dead};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

fn sh(script: &str, timeout: Duration) -> BoundedCommand {
    BoundedCommand::new("/bin/sh", timeout)
        .arg("-c")
        .arg(script)
        .env("PATH", PATH)
}

/// Keeps what it is handed, with when the first chunk came; abandons after `abandon_after` bytes.
struct Recorder {
    started: Instant,
    first_chunk: Option<Duration>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    abandon_after: Option<usize>,
    closed: Vec<Stream>,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            started: Instant::now(),
            first_chunk: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            abandon_after: None,
            closed: Vec::new(),
        }
    }
}

impl OutputSink for Recorder {
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> Result<(), Error> {
        self.first_chunk.get_or_insert(self.started.elapsed());
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(bytes),
            Stream::Stderr => self.stderr.extend_from_slice(bytes),
        }
        Ok(())
    }

    async fn abandoned(&mut self) {
        match self.abandon_after {
            Some(limit) if self.stdout.len() >= limit => {}
            _ => std::future::pending().await,
        }
    }

    fn closed(&mut self, stream: Stream) {
        self.closed.push(stream);
    }
}

#[tokio::test]
async fn chunks_arrive_while_the_command_runs() {
    let mut sink = Recorder::new();
    let status = sh(
        "printf first; printf e >&2; sleep 2; printf second",
        Duration::from_secs(20),
    )
    .run_streaming(&mut sink)
    .await
    .unwrap();
    assert_eq!(status, ExitKind::Exited(0));
    assert_eq!(sink.stdout, b"firstsecond");
    assert_eq!(sink.stderr, b"e");
    let first = sink.first_chunk.unwrap();
    assert!(
        first < Duration::from_secs(1),
        "the first chunk came after {first:?}"
    );
    assert!(sink.started.elapsed() >= Duration::from_secs(2));
    assert_eq!(sink.closed.len(), 2);
}

#[tokio::test]
async fn stdin_from_a_reader_round_trips() {
    let data: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut sink = Recorder::new();
    let status = sh("cat", Duration::from_secs(30))
        .output_budget(usize::MAX)
        .stdin_reader(Box::new(std::io::Cursor::new(data.clone())))
        .run_streaming(&mut sink)
        .await
        .unwrap();
    assert_eq!(status, ExitKind::Exited(0));
    assert!(sink.stdout == data, "stdin did not round-trip");
}

#[tokio::test]
async fn a_command_that_ignores_an_endless_stdin_ends_the_call() {
    let mut sink = Recorder::new();
    let endless = tokio::io::repeat(b'x');
    let status = sh("exit 3", Duration::from_secs(20))
        .stdin_reader(Box::new(endless))
        .run_streaming(&mut sink)
        .await
        .unwrap();
    assert_eq!(status, ExitKind::Exited(3));
}

#[tokio::test]
async fn the_budget_covers_streamed_bytes_and_kills_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "sleep 300 & echo $! > '{0}.tmp'; mv '{0}.tmp' '{0}'; yes",
        pids.display()
    );
    let mut sink = Recorder::new();
    let error = sh(&script, Duration::from_secs(30))
        .output_budget(100_000)
        .run_streaming(&mut sink)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::OutputLimit {
                budget: 100_000,
                ..
            }
        ),
        "{error}"
    );
    assert!(sink.stdout.len() <= 100_000);
    let grandchild = read_pids(&pids, 1).await[0];
    assert!(
        wait_dead(grandchild, Duration::from_secs(5)).await,
        "the tree survived"
    );
}

#[tokio::test]
async fn an_abandoned_sink_kills_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "sleep 300 & echo $! > '{0}.tmp'; mv '{0}.tmp' '{0}'; printf go; sleep 300",
        pids.display()
    );
    let mut sink = Recorder::new();
    sink.abandon_after = Some(2);
    let started = Instant::now();
    let error = sh(&script, Duration::from_secs(60))
        .run_streaming(&mut sink)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Abandoned { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let grandchild = read_pids(&pids, 1).await[0];
    assert!(
        wait_dead(grandchild, Duration::from_secs(5)).await,
        "the tree survived"
    );
}
