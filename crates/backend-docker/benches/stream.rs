//! Streaming exec against the raw `docker` CLI in the same run.
//!
//! `stream first byte`: the time from the call to the first stdout byte of `sh -c 'printf x;
//! sleep 1'` through `exec_stream`, against `docker exec <id> sh -c …` reading its stdout pipe.
//! Pass/fail: p50 at most 1.10× the CLI's.
//!
//! `stream stdin 1 GiB through cat`: 1 GiB fed to `cat` as stdin and read back whole, through
//! `exec_stream` with a reader against `docker exec -i <id> cat`, both fed from the same
//! in-memory source. The row's ratio is of wall times; pass/fail: at most 1.25× the CLI's, which
//! is a throughput of at least 0.8× the CLI's.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use paired_bench::{exit_with, round_robin, Metric, Target};
use sandbox_core::{Command, ExecChunk, ExecEvent, ExecRequest, ExecStdin};
use support::{backend, bench_spec, SideBySide};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const FIRST_BYTE_WARMUP: usize = 2;
const FIRST_BYTE_ROUNDS: usize = 15;
const THROUGHPUT_ROUNDS: usize = 3;
const GIB: u64 = 1024 * 1024 * 1024;

/// The command of the first-byte row: prints, then sleeps.
const PRINT_THEN_SLEEP: &str = "printf x; sleep 1";

/// 1 GiB of input, generated as it is read.
fn gibibyte() -> impl tokio::io::AsyncRead + Send + Unpin + 'static {
    tokio::io::repeat(b'z').take(GIB)
}

/// `docker <args>` with its stdout read: the time to its first byte, after it ends.
async fn raw_first_byte(args: &[&str]) -> Duration {
    let started = Instant::now();
    let mut child = tokio::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the docker CLI starts");
    let mut stdout = child.stdout.take().expect("a stdout pipe");
    let mut byte = [0u8; 1];
    let read = stdout.read(&mut byte).await.expect("stdout is read");
    let first = started.elapsed();
    assert_eq!(read, 1, "docker {args:?} printed nothing");
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await.expect("stdout is read");
    assert!(child.wait().await.expect("docker exits").success());
    first
}

/// `docker exec -i <id> cat` fed 1 GiB, its stdout counted.
async fn raw_cat(id: &str) {
    let mut child = tokio::process::Command::new("docker")
        .args(["exec", "-i", id, "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the docker CLI starts");
    let mut stdin = child.stdin.take().expect("a stdin pipe");
    let mut stdout = child.stdout.take().expect("a stdout pipe");
    let feed = async move {
        let mut source = gibibyte();
        tokio::io::copy(&mut source, &mut stdin)
            .await
            .expect("stdin is written");
        stdin.shutdown().await.expect("stdin closes");
    };
    let drain = async move {
        let mut buffer = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = stdout.read(&mut buffer).await.expect("stdout is read");
            if n == 0 {
                break total;
            }
            total += n as u64;
        }
    };
    let ((), total) = tokio::join!(feed, drain);
    assert_eq!(total, GIB);
    assert!(child.wait().await.expect("docker exits").success());
}

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let SideBySide {
        sweep,
        sandbox,
        raw,
        ..
    } = SideBySide::start(&backend, "stream", &bench_spec()).await;

    let mut first_byte = Metric::new("stream first byte p50", Target::AtMost(1.10));
    for round in 0..FIRST_BYTE_WARMUP + FIRST_BYTE_ROUNDS {
        let ours = async {
            let started = Instant::now();
            let request =
                ExecRequest::new(Command::shell(PRINT_THEN_SLEEP)).timeout(Duration::from_secs(60));
            let mut stream = sandbox
                .exec_stream(request, ExecStdin::Closed)
                .await
                .expect("the stream starts");
            let first = loop {
                match stream.next().await.expect("the stream ends with its exit") {
                    Ok(ExecEvent::Output(ExecChunk::Stdout(_))) => break started.elapsed(),
                    Ok(ExecEvent::Output(ExecChunk::Stderr(_))) => {}
                    other => panic!("no stdout before {other:?}"),
                }
            };
            let rest = stream.collect().await.expect("the command ends");
            assert_eq!(rest.exit_code, 0);
            first
        };
        let (ours, theirs) = if round % 2 == 0 {
            let ours = ours.await;
            (
                ours,
                raw_first_byte(&["exec", &raw, "sh", "-c", PRINT_THEN_SLEEP]).await,
            )
        } else {
            let theirs = raw_first_byte(&["exec", &raw, "sh", "-c", PRINT_THEN_SLEEP]).await;
            (ours.await, theirs)
        };
        if round >= FIRST_BYTE_WARMUP {
            first_byte.push((ours, theirs));
        }
    }
    let mut passed = first_byte.report();

    let mut throughput = Metric::new("stream stdin 1 GiB through cat", Target::AtMost(1.25));
    for round in 0..THROUGHPUT_ROUNDS {
        let times = round_robin(
            round,
            vec![
                Box::pin(async {
                    let request =
                        ExecRequest::new(Command::argv(["cat"])).timeout(Duration::from_secs(600));
                    let mut stream = sandbox
                        .exec_stream(request, ExecStdin::reader(gibibyte()))
                        .await
                        .expect("the stream starts");
                    let mut total = 0u64;
                    loop {
                        match stream.next().await.expect("the stream ends with its exit") {
                            Ok(ExecEvent::Output(chunk)) => total += chunk.bytes().len() as u64,
                            Ok(ExecEvent::Exit(exit)) => {
                                assert_eq!(exit.exit_code, 0);
                                break;
                            }
                            Err(error) => panic!("the stream failed: {error}"),
                        }
                    }
                    assert_eq!(total, GIB);
                }),
                Box::pin(raw_cat(&raw)),
            ],
        )
        .await;
        throughput.push((times[0], times[1]));
    }
    passed &= throughput.report();

    drop(sandbox);
    sweep.finish(&backend, &["t"]).await;
    exit_with(passed);
}
