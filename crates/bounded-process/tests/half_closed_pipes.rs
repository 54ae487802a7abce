//! The runner against children that close one of their pipes early: the output still owed on
//! the other pipe is read to its end, a helper left holding only one pipe is still killed on
//! the deadline, and a child that closes its stdin unread is not a failure.

mod common;

use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, Error, ExitKind};
use common::{read_pids, wait_dead};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

fn sh(script: &str, timeout: Duration) -> BoundedCommand {
    BoundedCommand::new("/bin/sh", timeout)
        .arg("-c")
        .arg(script)
        .env("PATH", PATH)
}

/// Which pipe the child closes before it exits.
#[derive(Debug, Clone, Copy)]
enum Closed {
    Stdout,
    Stderr,
}

impl Closed {
    /// The shell redirection that closes it, and the one that writes to the other.
    fn redirections(self) -> (&'static str, &'static str) {
        match self {
            Closed::Stdout => ("exec 1>&-", ">&2"),
            Closed::Stderr => ("exec 2>&-", ""),
        }
    }
}

#[tokio::test]
async fn output_a_helper_writes_after_the_child_exits_is_read_when_one_pipe_is_closed() {
    for closed in [Closed::Stdout, Closed::Stderr] {
        let (close, to_open) = closed.redirections();
        // The child closes one pipe and exits at once; the helper it leaves behind writes to
        // the other pipe only later. The call is complete only at EOF on that pipe.
        let script = format!(
            "printf early {to_open}; {close}; \
             (sleep 0.5; printf late {to_open}; head -c 200000 /dev/zero {to_open}) & exit 3"
        );
        let output = sh(&script, Duration::from_secs(20))
            .run()
            .await
            .unwrap_or_else(|error| panic!("{closed:?}: {error}"));
        assert_eq!(output.status, ExitKind::Exited(3), "{closed:?}");
        let (open, shut) = match closed {
            Closed::Stdout => (&output.stderr, &output.stdout),
            Closed::Stderr => (&output.stdout, &output.stderr),
        };
        assert!(shut.is_empty(), "{closed:?}: {shut:?}");
        assert_eq!(open.len(), "earlylate".len() + 200_000, "{closed:?}");
        assert!(open.starts_with(b"earlylate"), "{closed:?}");
        assert!(open[9..].iter().all(|b| *b == 0), "{closed:?}");
    }
}

#[tokio::test]
async fn a_helper_holding_only_one_pipe_is_killed_on_the_deadline() {
    for closed in [Closed::Stdout, Closed::Stderr] {
        let (close, _) = closed.redirections();
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let script = format!(
            "{close}; sleep 300 & echo $! > '{}'; exit 0",
            pids.display()
        );
        let started = Instant::now();
        let result = sh(&script, Duration::from_millis(700)).run().await;
        assert!(
            matches!(result, Err(Error::Deadline { .. })),
            "{closed:?}: {result:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{closed:?}: {:?}",
            started.elapsed()
        );
        let helper = read_pids(&pids, 1).await[0];
        assert!(
            wait_dead(helper, Duration::from_secs(5)).await,
            "{closed:?}: the helper survived the deadline"
        );
    }
}

#[tokio::test]
async fn a_child_that_closes_its_stdin_unread_and_keeps_running_succeeds() {
    // Far more than a pipe buffer: the write is still under way when the read end closes.
    let input = vec![b'x'; 4 << 20];
    let output = sh(
        "exec 0<&-; sleep 0.3; printf finished",
        Duration::from_secs(20),
    )
    .stdin(input)
    .run()
    .await
    .expect("a broken stdin pipe is not the caller's failure");
    assert_eq!(output.status, ExitKind::Exited(0));
    assert_eq!(output.stdout, b"finished");
}
