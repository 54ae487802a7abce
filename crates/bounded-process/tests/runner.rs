//! The bounded runner against real processes: deadlines, budgets, stdin, the line callback,
//! cancellation by drop, exit statuses and the explicit environment.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, Error, ExitKind, Stream, READ_CHUNK};
use common::{alive, read_pids, wait_dead};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

fn sh(script: &str, timeout: Duration) -> BoundedCommand {
    BoundedCommand::new("/bin/sh", timeout)
        .arg("-c")
        .arg(script)
        .env("PATH", PATH)
}

#[tokio::test]
async fn stdout_and_stderr_are_byte_exact_and_separate() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = dir.path().join("data");
    std::fs::write(&file, &data).unwrap();
    let script = format!(
        "cat '{0}' & cat '{0}' >&2; wait; printf end",
        file.display()
    );
    let output = sh(&script, Duration::from_secs(20)).run().await.unwrap();
    assert_eq!(output.status, ExitKind::Exited(0));
    assert_eq!(output.stdout.len(), data.len() + 3);
    assert!(output.stdout[..data.len()] == data[..] && output.stdout.ends_with(b"end"));
    assert!(output.stderr == data);
    assert!(!output.truncated);
}

#[tokio::test]
async fn exit_statuses_and_signals_are_reported_as_such() {
    for code in [0, 1, 2, 125, 126, 127, 128, 200, 255] {
        let output = sh(&format!("exit {code}"), Duration::from_secs(10))
            .run()
            .await
            .unwrap();
        assert_eq!(output.status, ExitKind::Exited(code));
    }
    let output = sh("kill -TERM $$", Duration::from_secs(10))
        .run()
        .await
        .unwrap();
    assert_eq!(output.status, ExitKind::Signaled(15));
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error_naming_it() {
    let result = BoundedCommand::new("/nonexistent/docker", Duration::from_secs(5))
        .run()
        .await;
    match result {
        Err(Error::Spawn { program, .. }) => assert_eq!(program, "/nonexistent/docker"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_inherited_environment_is_cleared() {
    let output = BoundedCommand::new("/usr/bin/env", Duration::from_secs(5))
        .env("ONLY", "this")
        .run()
        .await
        .unwrap();
    assert_eq!(output.stdout, b"ONLY=this\n");
}

#[tokio::test]
async fn stdin_is_closed_unless_it_carries_bytes() {
    let output = BoundedCommand::new("/bin/cat", Duration::from_secs(5))
        .run()
        .await
        .unwrap();
    assert_eq!(output.status, ExitKind::Exited(0));
    assert!(output.stdout.is_empty());
}

#[tokio::test]
async fn stdin_is_written_while_output_is_read() {
    // Far more than a pipe buffer each way: writing before reading would deadlock.
    let input: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    let output = BoundedCommand::new("/bin/cat", Duration::from_secs(20))
        .stdin(input.clone())
        .run()
        .await
        .unwrap();
    assert!(output.stdout == input);
}

#[tokio::test]
async fn stdin_larger_than_the_pipe_with_a_child_that_exits_early() {
    let input = vec![b'z'; 4 << 20];
    let output = BoundedCommand::new("/usr/bin/head", Duration::from_secs(20))
        .args(["-c", "10"])
        .stdin(input)
        .run()
        .await
        .unwrap();
    assert_eq!(output.status, ExitKind::Exited(0));
    assert_eq!(output.stdout, b"zzzzzzzzzz");
}

#[tokio::test]
async fn the_budget_counts_both_streams_together() {
    let exact = sh("printf %060d 0; printf %040d 0 >&2", Duration::from_secs(5))
        .output_budget(100)
        .run()
        .await
        .unwrap();
    assert_eq!(exact.stdout.len() + exact.stderr.len(), 100);
    let over = sh("printf %060d 0; printf %041d 0 >&2", Duration::from_secs(5))
        .output_budget(100)
        .run()
        .await;
    match over {
        Err(Error::OutputLimit { budget, program }) => {
            assert_eq!(budget, 100);
            assert_eq!(program, "/bin/sh");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_deadline_with_a_grandchild_holding_the_pipe_kills_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!("sleep 300 & echo $! > '{}'; exit 0", pids.display());
    let started = Instant::now();
    let result = sh(&script, Duration::from_millis(700)).run().await;
    assert!(
        matches!(result, Err(Error::Deadline { bound, .. }) if bound == Duration::from_millis(700))
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let grandchild = read_pids(&pids, 1).await[0];
    assert!(
        wait_dead(grandchild, Duration::from_secs(5)).await,
        "the grandchild survived"
    );
}

#[tokio::test]
async fn dropping_the_future_kills_and_reaps() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "echo $$ > '{0}.tmp'; sleep 300 & echo $! >> '{0}.tmp'; mv '{0}.tmp' '{0}'; wait",
        pids.display()
    );
    let run = sh(&script, Duration::from_secs(60)).run();
    let dropped = tokio::time::timeout(Duration::from_millis(500), run).await;
    assert!(
        dropped.is_err(),
        "the command should still have been running"
    );
    let pids = read_pids(&pids, 2).await;
    let (child, grandchild) = (pids[0], pids[1]);
    // The direct child is reaped, not merely dead: its /proc entry goes away.
    let end = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{child}")).exists() {
        assert!(Instant::now() < end, "the dropped child was not reaped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(wait_dead(grandchild, Duration::from_secs(5)).await);
    assert!(!alive(child));
}

type Piece = (Stream, Vec<u8>);

#[tokio::test]
async fn the_line_callback_sees_every_line_in_order() {
    let seen: Arc<Mutex<Vec<Piece>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let script = "printf 'one\\ntwo\\n'; printf 'e1\\n' >&2; head -c 200000 /dev/zero | tr '\\0' x; printf '\\nthree\\nlast'; printf 'e2' >&2";
    let output = sh(script, Duration::from_secs(10))
        .on_line(move |stream, line| sink.lock().unwrap().push((stream, line.to_vec())))
        .run()
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    for (stream, bytes) in [
        (Stream::Stdout, &output.stdout),
        (Stream::Stderr, &output.stderr),
    ] {
        let pieces: Vec<&Vec<u8>> = seen
            .iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, l)| l)
            .collect();
        // The pieces concatenate to exactly the stream.
        assert!(pieces
            .iter()
            .flat_map(|p| p.iter().copied())
            .eq(bytes.iter().copied()));
        // A long line is handed over as it arrives, never held whole: no piece reaches two
        // chunks.
        for piece in &pieces {
            assert!(piece.len() < 2 * READ_CHUNK, "{}", piece.len());
        }
        // Every piece but the last is a complete line or a piece of at least one chunk.
        for piece in &pieces[..pieces.len() - 1] {
            assert!(
                piece.ends_with(b"\n") || piece.len() >= READ_CHUNK,
                "{:?}",
                piece.len()
            );
        }
    }
    let stdout: Vec<&[u8]> = seen
        .iter()
        .filter(|(s, _)| *s == Stream::Stdout)
        .map(|(_, l)| l.as_slice())
        .collect();
    assert_eq!(stdout[0], b"one\n");
    assert_eq!(stdout[1], b"two\n");
    // The 200,000-byte line arrives in pieces.
    assert!(stdout.len() >= 5, "{}", stdout.len());
    assert_eq!(stdout[stdout.len() - 2], b"three\n");
    assert_eq!(stdout[stdout.len() - 1], b"last");
    let stderr: Vec<&[u8]> = seen
        .iter()
        .filter(|(s, _)| *s == Stream::Stderr)
        .map(|(_, l)| l.as_slice())
        .collect();
    assert_eq!(stderr, [b"e1\n".as_slice(), b"e2"]);
}

#[tokio::test]
async fn prefix_mode_stops_on_purpose() {
    let output = BoundedCommand::new("/usr/bin/yes", Duration::from_secs(10))
        .stop_after(5)
        .run()
        .await
        .unwrap();
    assert!(output.truncated);
    assert_eq!(output.stdout, b"y\ny\ny");
    assert_eq!(output.status, ExitKind::Signaled(9));
}

/// The prefix is exactly `stop_after` stdout bytes however the child's writes split it, and only
/// stdout counts towards it. The child writes its second part only once the host has read the
/// first, so the cut falls inside a later read.
#[tokio::test]
async fn prefix_mode_cuts_inside_a_later_read_and_counts_stdout_only() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "printf 'err\\n' >&2; printf 'ab\\n'; \
         until [ -e '{}' ]; do sleep 0.01; done; printf 'cdefgh\\n'; sleep 30",
        go.display()
    );
    let output = sh(&script, Duration::from_secs(10))
        .stop_after(6)
        .on_line(move |stream, line| {
            if stream == Stream::Stdout && line == b"ab\n" {
                std::fs::write(&go, b"").unwrap();
            }
        })
        .run()
        .await
        .unwrap();
    assert!(output.truncated);
    assert_eq!(output.stdout, b"ab\ncde");
    assert_eq!(output.status, ExitKind::Signaled(9));
}

#[tokio::test]
async fn a_timeout_too_large_for_the_clock_is_no_deadline_never_a_panic() {
    for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let output = sh("printf done", timeout).run().await.expect("runs");
        assert_eq!(output.status, ExitKind::Exited(0));
        assert_eq!(output.stdout, b"done");
    }
}

#[tokio::test]
async fn a_stream_ending_in_a_newline_gives_no_empty_last_piece() {
    let seen: Arc<Mutex<Vec<Piece>>> = Arc::default();
    let sink = Arc::clone(&seen);
    sh(
        "printf 'a\\nb\\n'; printf 'e\\n' >&2",
        Duration::from_secs(10),
    )
    .on_line(move |stream, line| sink.lock().unwrap().push((stream, line.to_vec())))
    .run()
    .await
    .unwrap();
    let seen = seen.lock().unwrap();
    let pieces = |stream: Stream| -> Vec<Vec<u8>> {
        seen.iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, piece)| piece.clone())
            .collect()
    };
    assert_eq!(pieces(Stream::Stdout), [b"a\n".to_vec(), b"b\n".to_vec()]);
    assert_eq!(pieces(Stream::Stderr), [b"e\n".to_vec()]);
}

#[tokio::test]
async fn the_default_budget_is_8_mib_of_both_streams() {
    const EIGHT_MIB: usize = 8 * 1024 * 1024;
    let half = EIGHT_MIB / 2;
    let exact = sh(
        &format!("head -c {half} /dev/zero; head -c {half} /dev/zero >&2"),
        Duration::from_secs(60),
    )
    .run()
    .await
    .unwrap();
    assert_eq!(exact.stdout.len() + exact.stderr.len(), EIGHT_MIB);
    let over = sh(
        &format!(
            "head -c {half} /dev/zero; head -c {} /dev/zero >&2",
            half + 1
        ),
        Duration::from_secs(60),
    )
    .run()
    .await;
    assert!(
        matches!(over, Err(Error::OutputLimit { budget, .. }) if budget == EIGHT_MIB),
        "{over:?}"
    );
}

#[tokio::test]
async fn a_short_line_after_much_output_still_comes_whole() {
    let seen: Arc<Mutex<Vec<Piece>>> = Arc::default();
    let sink = Arc::clone(&seen);
    // Over a chunk of complete lines first; then a line written in two parts.
    let script = "i=0; while [ $i -lt 800 ]; do printf '%099d\\n' $i; i=$((i+1)); done; \
                  printf par; sleep 0.2; printf 'tial\\n'";
    sh(script, Duration::from_secs(20))
        .on_line(move |stream, line| sink.lock().unwrap().push((stream, line.to_vec())))
        .run()
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 801, "every line is one piece");
    assert_eq!(seen[800], (Stream::Stdout, b"partial\n".to_vec()));
}
