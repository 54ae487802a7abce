//! The Docker init wrapper and the exact kills under dash, BusyBox `sh` and bash, with the host's
//! own tools. The wrapper runs from its `sh` onward (the engine's init is the live tests'
//! business); the kills run where no call's init or namespace exists, so they must read as the
//! group kill of the same nonce: refusals, "never started" with the cancel file left behind, and
//! a real group killed through the fallback.

mod common;

use std::path::Path;
use std::time::Duration;

use bounded_process::ExitKind;
use common::{read_pids, shells, wait_dead, Shell};
use exec_wrapper::call::{cancel_file, pid_file};
use exec_wrapper::encoding::{encode_invocation, raw_invocation, RawInvocation};
use exec_wrapper::kill::{namespace_kill_argv, tree_kill_argv, KillMode, KillOutcome, KillReport};
use exec_wrapper::outcome::{nonce_line_seen, parse_run_output};
use exec_wrapper::wrapper::{docker_init_wrapper_argv, docker_wrapper_argv, DOCKER_INIT_PATH};
use exec_wrapper::{Nonce, WrapperOutcome, WrapperOutput};
use proptest::prelude::*;

const BOUND: Duration = Duration::from_secs(20);

/// The init wrapper's argv from its `sh` on, as the engine's init would start it.
fn from_sh(nonce: &Nonce, invocation: &RawInvocation) -> Vec<String> {
    let argv = docker_init_wrapper_argv(nonce, invocation);
    assert_eq!(argv[..4], [DOCKER_INIT_PATH, "-s", "--", "sh"]);
    argv[3..].to_vec()
}

async fn run_init_shape(
    shell: &Shell,
    cwd: &[u8],
    argv: &[Vec<u8>],
) -> (common::HostCall, WrapperOutcome) {
    let nonce = common::host_call();
    let invocation = raw_invocation(cwd, argv).unwrap();
    let output = shell
        .run(&from_sh(&nonce, &invocation), BOUND)
        .await
        .unwrap_or_else(|e| panic!("{}: runner failed: {e}", shell.name));
    let outcome = parse_run_output(output, &nonce);
    (nonce, outcome)
}

fn ran(shell: &Shell, outcome: WrapperOutcome) -> WrapperOutput {
    match outcome {
        WrapperOutcome::Ran(output) => output,
        other => panic!("{}: expected a command result, got {other:?}", shell.name),
    }
}

fn argv_element() -> impl Strategy<Value = Vec<u8>> {
    let tricky = prop::sample::select(vec![
        b"".to_vec(),
        b"\n".to_vec(),
        b"a\n\n".to_vec(),
        b"x".to_vec(),
        b"xaGk=".to_vec(),
        b"r".to_vec(),
        b"$(touch /tmp/exec-wrapper-init-pwned)".to_vec(),
        b"-".to_vec(),
        b"--".to_vec(),
        b"*".to_vec(),
        vec![0xff, 0xfe, 0x80, b'\n'],
        vec![b'x', 0xc3],
        b"\r\n".to_vec(),
    ]);
    prop_oneof![
        3 => tricky,
        3 => prop::collection::vec(1u8..=255u8, 0..40),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Raw and encoded values alike reach the command byte for byte, under every shell.
    #[test]
    fn arbitrary_argv_round_trips(args in prop::collection::vec(argv_element(), 0..8)) {
        let rt = runtime();
        let mut argv = vec![b"printf".to_vec(), b"%s\\0".to_vec(), b"start".to_vec()];
        argv.extend(args.iter().cloned());
        let mut expected = b"start\0".to_vec();
        for arg in &args {
            expected.extend_from_slice(arg);
            expected.push(0);
        }
        for shell in &shells() {
            let (_, outcome) = rt.block_on(run_init_shape(shell, b"/", &argv));
            let output = ran(shell, outcome);
            prop_assert_eq!(output.status, 0, "{}: {:?}", shell.name, String::from_utf8_lossy(&output.stderr));
            prop_assert!(output.stderr.is_empty(), "{}", shell.name);
            prop_assert!(output.stdout == expected, "{}: argv changed on the way", shell.name);
        }
        prop_assert!(!Path::new("/tmp/exec-wrapper-init-pwned").exists());
    }
}

#[tokio::test]
async fn status_streams_and_working_directory_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("d\nwith \u{e9}");
    std::fs::create_dir(&odd).unwrap();
    let mut not_utf8 = dir.path().join("x").into_os_string().into_encoded_bytes();
    not_utf8.push(0xff);
    std::fs::create_dir(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&not_utf8))
        .unwrap();
    for shell in shells() {
        let script = b"printf 'o\\377'; printf 'e\\n' >&2; exit 7".to_vec();
        let (_, outcome) =
            run_init_shape(&shell, b"/", &[b"sh".to_vec(), b"-c".to_vec(), script]).await;
        let output = ran(&shell, outcome);
        assert_eq!(
            (
                output.status,
                output.stdout.as_slice(),
                output.stderr.as_slice()
            ),
            (7, b"o\xff".as_slice(), b"e\n".as_slice()),
            "{}",
            shell.name
        );
        for cwd in [odd.as_os_str().as_encoded_bytes(), not_utf8.as_slice()] {
            let (_, outcome) = run_init_shape(&shell, cwd, &[b"pwd".to_vec()]).await;
            assert_eq!(
                ran(&shell, outcome).stdout,
                [cwd, b"\n"].concat(),
                "{}",
                shell.name
            );
        }
        // A working directory that cannot be entered: no nonce line, the marker and the shell's
        // message, and the command never runs.
        let side_effect = dir.path().join(format!("ran-{}", shell.name));
        let touch = [
            b"touch".to_vec(),
            side_effect.as_os_str().as_encoded_bytes().to_vec(),
        ];
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"x").unwrap();
        for cwd in ["/no/such/dir".to_owned(), plain.display().to_string()] {
            let (_, outcome) = run_init_shape(&shell, cwd.as_bytes(), &touch).await;
            common::assert_not_started(shell.name, &outcome, &cwd);
            assert!(
                !side_effect.exists(),
                "{}: {cwd}: the command ran",
                shell.name
            );
        }
        // A command's own marker and 125, after the nonce line, stay its result.
        let nonce = common::host_call();
        let forged = format!("{nonce}-nocwd\ncd: forged\n");
        let invocation = raw_invocation(
            b"/",
            &[
                b"sh".as_slice(),
                b"-c",
                b"printf \"$1\" >&2; exit 125",
                b"sh",
                forged.as_bytes(),
            ],
        )
        .unwrap();
        let output = shell
            .run(&from_sh(&nonce, &invocation), BOUND)
            .await
            .unwrap();
        let output = ran(&shell, parse_run_output(output, &nonce));
        assert_eq!(
            (output.status, output.stderr),
            (125, forged.into_bytes()),
            "{}",
            shell.name
        );
        let (_, outcome) = run_init_shape(&shell, b"/", &[b"no-such-program-xyz".to_vec()]).await;
        assert_eq!(ran(&shell, outcome).status, 127, "{}", shell.name);
    }
}

#[tokio::test]
async fn wrapper_failures_and_a_cancel_exit_125_without_the_nonce() {
    for shell in shells() {
        let nonce = common::host_call();
        let good = from_sh(&nonce, &raw_invocation(b"/", &[b"true"]).unwrap());
        // positionals in `good`: sh -c W maf-sbx nonce mask cwd argv…
        let mut short_mask = good.clone();
        short_mask[5] = "r".into();
        let mut bad_letter = good.clone();
        bad_letter[5] = "rq".into();
        let mut bad_encoding = good.clone();
        bad_encoding[5] = "rx".into();
        bad_encoding[7] = "not-encoded".into();
        // (Malformed base64 after the `x` is not among them: BusyBox's decoder skips what it
        // cannot read. The host never sends any.)
        for argv in [short_mask, bad_letter, bad_encoding] {
            let output = shell.run(&argv, BOUND).await.unwrap();
            match parse_run_output(output, &nonce) {
                WrapperOutcome::NoNonce { status, .. } => assert_eq!(status, 125, "{}", shell.name),
                other => panic!("{}: a wrapper failure read as {other:?}", shell.name),
            }
        }

        // The kill came first: the cancel file stops the command before the nonce line.
        let dir = tempfile::tempdir().unwrap();
        let side_effect = dir.path().join("ran");
        let nonce = common::host_call();
        let kill = shell.run(&tree_kill_argv(&nonce), BOUND).await.unwrap();
        assert_eq!(kill.status, ExitKind::Exited(4), "{}", shell.name);
        assert!(Path::new(&cancel_file(&nonce)).exists(), "{}", shell.name);
        let argv = from_sh(
            &nonce,
            &raw_invocation(
                b"/",
                &[
                    b"touch".as_slice(),
                    side_effect.to_str().unwrap().as_bytes(),
                ],
            )
            .unwrap(),
        );
        let output = shell.run(&argv, BOUND).await.unwrap();
        assert!(!nonce_line_seen(&output.stderr, &nonce), "{}", shell.name);
        assert_eq!(output.status, ExitKind::Exited(125), "{}", shell.name);
        assert!(
            !side_effect.exists(),
            "{}: a cancelled command ran",
            shell.name
        );
        std::fs::remove_file(cancel_file(&nonce)).unwrap();
    }
}

#[tokio::test]
async fn the_exact_kills_refuse_a_malformed_nonce() {
    for shell in shells() {
        for kill in [tree_kill_argv, namespace_kill_argv] {
            let mut argv = kill(&common::host_call());
            for bad in [
                "",
                "../../etc/x0123456789abcd",
                "0123456789ABCDEF01234567",
                "0123",
            ] {
                argv[4] = bad.into();
                let output = shell.run(&argv, BOUND).await.unwrap();
                assert_eq!(
                    output.status,
                    ExitKind::Exited(3),
                    "{}: {bad:?}",
                    shell.name
                );
            }
        }
    }
}

/// Without an init or a namespace for the nonce, both exact kills fall back to the group kill:
/// a group-shape call is killed (mode: process group) and a sibling is untouched; once the call
/// is gone, the same kill reads "never started", which the host reads as not landed after the
/// nonce line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exact_kills_fall_back_to_the_group_kill() {
    common::become_subreaper();
    for shell in shells() {
        for kill in [tree_kill_argv, namespace_kill_argv] {
            let dir = tempfile::tempdir().unwrap();
            let pids_file = dir.path().join("pids");
            let nonce = common::host_call();
            let argv = docker_wrapper_argv(
                &nonce,
                &encode_invocation(
                    b"/",
                    &[
                        b"sh".as_slice(),
                        b"-c",
                        b"sleep 300 & echo $! $$ >\"$1\"; wait",
                        b"fam",
                        pids_file.to_str().unwrap().as_bytes(),
                    ],
                )
                .unwrap(),
            );
            let sibling_nonce = common::host_call();
            let sibling = tokio::spawn(
                shell
                    .command(
                        &docker_wrapper_argv(
                            &sibling_nonce,
                            &encode_invocation(
                                b"/",
                                &[b"sh".as_slice(), b"-c", b"sleep 1; echo ok"],
                            )
                            .unwrap(),
                        ),
                        BOUND,
                    )
                    .run(),
            );
            let call = tokio::spawn(shell.command(&argv, BOUND).run());
            let pids = read_pids(&pids_file, 2).await;
            let reaper = common::reap_adopted(pids.clone());
            let report = KillReport::from_run(&shell.run(&kill(&nonce), BOUND).await);
            assert_eq!(report.outcome, KillOutcome::Killed, "{}", shell.name);
            assert_eq!(report.mode, Some(KillMode::ProcessGroup), "{}", shell.name);
            for pid in pids {
                assert!(
                    wait_dead(pid, Duration::from_secs(5)).await,
                    "{}: {pid}",
                    shell.name
                );
            }
            let finished = call.await.unwrap().unwrap();
            assert!(nonce_line_seen(&finished.stderr, &nonce));
            let again = KillReport::from_run(&shell.run(&kill(&nonce), BOUND).await);
            assert_eq!(again.outcome, KillOutcome::NeverStarted, "{}", shell.name);
            assert!(!again.after_start(true).outcome.landed(), "{}", shell.name);
            let sibling = sibling.await.unwrap().unwrap();
            match parse_run_output(sibling, &sibling_nonce) {
                WrapperOutcome::Ran(out) => assert_eq!(out.stdout, b"ok\n", "{}", shell.name),
                other => panic!("{}: sibling {other:?}", shell.name),
            }
            let _ = std::fs::remove_file(cancel_file(&nonce));
            let _ = std::fs::remove_file(pid_file(&nonce));
            tokio::task::spawn_blocking(move || reaper.join().unwrap())
                .await
                .unwrap();
        }
    }
}
