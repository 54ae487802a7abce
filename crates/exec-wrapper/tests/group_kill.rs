//! The kill script against real process groups, under dash, BusyBox `sh` and bash.
//!
//! This test process makes itself a child subreaper, so the orphans of a killed group are
//! re-parented here at once; it reaps exactly the pids the commands reported (never a child it
//! spawned itself, whose status the runner awaits). Without that, this machine's PID 1 reaps
//! orphans only after about 2 s, which the survivor poll would read as a surviving member.

mod common;

use std::path::Path;
use std::time::Duration;

use bounded_process::Error;
use common::{alive, become_subreaper, read_pids, reap_adopted, shells, wait_dead, Shell};
use exec_wrapper::call::pid_file;
use exec_wrapper::encoding::encode_invocation;
use exec_wrapper::kill::{kill_argv, KillFailure, KillOutcome};
use exec_wrapper::outcome::parse_run_output;
use exec_wrapper::wrapper::docker_wrapper_argv;
use exec_wrapper::{Nonce, WrapperOutcome};

fn wrapper_argv(nonce: &Nonce, argv: &[&[u8]]) -> Vec<String> {
    docker_wrapper_argv(nonce, &encode_invocation(b"/", argv).unwrap())
}

const FAMILY: &[u8] = br#"f=$1
sleep 300 & echo $! >>"$f"
sh -c 'sleep 300 & echo $! >>"$1"; echo $$ >>"$1"; wait' inner "$f" &
echo $$ >>"$f"
wait
"#;

async fn timed_out_family_dies_and_sibling_lives(shell: &Shell) {
    let dir = tempfile::tempdir().unwrap();
    let pids_file = dir.path().join("pids");
    let nonce = common::host_call();
    let argv = wrapper_argv(
        &nonce,
        &[
            b"sh",
            b"-c",
            FAMILY,
            b"family",
            pids_file.to_str().unwrap().as_bytes(),
        ],
    );
    let sibling_nonce = common::host_call();
    let sibling_argv = wrapper_argv(&sibling_nonce, &[b"sh", b"-c", b"sleep 2; echo done"]);

    let sibling = tokio::spawn(shell.command(&sibling_argv, Duration::from_secs(20)).run());
    let family = shell.run(&argv, Duration::from_millis(1500)).await;
    assert!(
        matches!(family, Err(Error::Deadline { .. })),
        "{}: {family:?}",
        shell.name
    );

    let pids = read_pids(&pids_file, 4).await;
    let reaper = reap_adopted(pids.clone());
    let record = std::fs::read_to_string(pid_file(&nonce)).unwrap();
    let group: i32 = record.trim_end().parse().unwrap();
    assert!(
        pids.contains(&group),
        "{}: the record names the command",
        shell.name
    );
    // Killing the local client did not reach the command: that is the kill script's job.
    for &pid in &pids {
        assert!(alive(pid), "{}: {pid} died with the client", shell.name);
    }

    let kill = shell
        .run(&kill_argv(&pid_file(&nonce)), Duration::from_secs(15))
        .await;
    assert_eq!(
        KillOutcome::from_run(&kill),
        KillOutcome::Killed,
        "{}: {kill:?}",
        shell.name
    );
    for &pid in &pids {
        assert!(
            wait_dead(pid, Duration::from_secs(5)).await,
            "{}: {pid} survived the kill",
            shell.name
        );
    }
    assert!(!Path::new(&pid_file(&nonce)).exists(), "{}", shell.name);

    let sibling = sibling.await.unwrap().unwrap();
    match parse_run_output(sibling, &sibling_nonce) {
        WrapperOutcome::Ran(output) => {
            assert_eq!(output.status, 0, "{}", shell.name);
            assert_eq!(
                output.stdout, b"done\n",
                "{}: the sibling was touched",
                shell.name
            );
        }
        other => panic!("{}: sibling {other:?}", shell.name),
    }
    tokio::task::spawn_blocking(move || reaper.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_command_and_all_its_descendants_die_and_a_sibling_does_not() {
    become_subreaper();
    for shell in shells() {
        timed_out_family_dies_and_sibling_lives(&shell).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_race_a_cancelled_command_never_runs() {
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    for shell in shells() {
        let (mut killed, mut never_started) = (0, 0);
        for round in 0..15u64 {
            let nonce = common::host_call();
            let side_effect = dir.path().join(format!("{}-{round}", shell.name));
            let argv = wrapper_argv(
                &nonce,
                &[
                    b"sh",
                    b"-c",
                    // Builtins only, so no process is orphaned unreaped if the kill lands mid-way.
                    b": >\"$1\" && exec sleep 30",
                    b"race",
                    side_effect.to_str().unwrap().as_bytes(),
                ],
            );
            let started = std::time::Instant::now();
            let command = tokio::spawn(shell.command(&argv, Duration::from_secs(20)).run());
            // Spread the kill over the start: before the wrapper decodes, around the record,
            // after the command started.
            tokio::time::sleep(Duration::from_millis(round * 3)).await;
            let kill = shell
                .run(&kill_argv(&pid_file(&nonce)), Duration::from_secs(15))
                .await;
            let outcome = KillOutcome::from_run(&kill);
            let finished = command.await.unwrap();
            let finished =
                finished.unwrap_or_else(|e| panic!("{}: round {round}: {e}", shell.name));
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{}: round {round}: the command kept running",
                shell.name
            );
            let WrapperOutcome::Ran(output) = parse_run_output(finished, &nonce) else {
                panic!("{}: round {round}: no nonce", shell.name);
            };
            assert_ne!(output.status, 0, "{}: round {round}", shell.name);
            match outcome {
                KillOutcome::Killed => killed += 1,
                KillOutcome::NeverStarted => {
                    never_started += 1;
                    assert!(
                        !side_effect.exists(),
                        "{}: round {round}: a cancelled command ran",
                        shell.name
                    );
                }
                other => panic!("{}: round {round}: {other:?}", shell.name),
            }
        }
        eprintln!(
            "{}: {killed} killed, {never_started} never started",
            shell.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_member_reads_as_a_survivor() {
    become_subreaper();
    let dir = tempfile::tempdir().unwrap();
    for shell in shells() {
        let pids_file = dir.path().join(shell.name);
        let nonce = common::host_call();
        let argv = wrapper_argv(
            &nonce,
            &[
                b"sh",
                b"-c",
                // The leader never waits: a shell in `wait` could reap the killed child itself.
                b"sleep 300 & echo $! >\"$1\"; exec sleep 300",
                b"z",
                pids_file.to_str().unwrap().as_bytes(),
            ],
        );
        let command = tokio::spawn(shell.command(&argv, Duration::from_secs(30)).run());
        let pids = read_pids(&pids_file, 1).await;
        // Give the record a moment: it is written before the command starts.
        while !Path::new(&pid_file(&nonce)).exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The orphaned `sleep` is re-parented here and, unreaped, stays a zombie in the group.
        let kill = shell
            .run(&kill_argv(&pid_file(&nonce)), Duration::from_secs(15))
            .await;
        assert_eq!(
            KillOutcome::from_run(&kill),
            KillOutcome::NotLanded(KillFailure::GroupSurvived),
            "{}: {kill:?}",
            shell.name
        );
        reap_adopted(pids).join().unwrap();
        command.await.unwrap().unwrap();
    }
}
