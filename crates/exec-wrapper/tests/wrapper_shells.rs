//! The wrapper scripts under dash, BusyBox `sh` and bash, with the host's own tools: argv round
//! trips, stdout/stderr separation, exit codes, wrapper failures, env export (sbx shape), the
//! start race's cancel path, the kill script's refusals, and the tool probe.

mod common;

use std::time::Duration;

use bounded_process::ExitKind;
use common::{shells, Shell};
use exec_wrapper::call::{cancel_file, pid_file, sbx_env_file_name};
use exec_wrapper::encoding::{
    encode_arg, encode_env_file, encode_invocation, plain_invocation, EncodedInvocation,
};
use exec_wrapper::kill::{kill_argv, KillFailure, KillOutcome, KILL_OUTPUT_BUDGET};
use exec_wrapper::outcome::parse_run_output;
use exec_wrapper::tool_probe::{
    read_tool_probe, tool_probe_argv, ToolProbeOutcome, DOCKER_TOOLS, PROBE_OUTPUT_BUDGET,
};
use exec_wrapper::wrapper::{
    docker_wrapper_argv, sbx_pid_namespace_wrapper_argv, sbx_wrapper_argv, SbxMount,
};
use exec_wrapper::{Nonce, WrapperOutcome, WrapperOutput};
use proptest::prelude::*;

const BOUND: Duration = Duration::from_secs(20);

async fn run_docker_shape(
    shell: &Shell,
    cwd: &[u8],
    argv: &[Vec<u8>],
) -> (common::HostCall, WrapperOutcome) {
    let nonce = common::host_call();
    let invocation = encode_invocation(cwd, argv).unwrap();
    let output = shell
        .run(&docker_wrapper_argv(&nonce, &invocation), BOUND)
        .await
        .unwrap_or_else(|e| panic!("{}: runner failed: {e}", shell.name));
    let outcome = parse_run_output(output, &nonce);
    (nonce, outcome)
}

/// The sbx argv from its `sh` on, entered at the `run` stage: the `unshare` the call starts with
/// and the `bind` stage need namespaces; the run stage is what both shapes share.
fn sbx_run_stage(
    nonce: &Nonce,
    parent: &str,
    with_env_file: bool,
    invocation: &EncodedInvocation,
) -> Vec<String> {
    let mount = SbxMount {
        parent: parent.to_owned(),
        guest_mount: "-".into(),
    };
    let argv = sbx_wrapper_argv(nonce, &mount, with_env_file, invocation).unwrap();
    assert_eq!(argv[0], "unshare");
    let sh = argv.iter().position(|arg| arg == "sh").unwrap();
    let mut argv = argv[sh..].to_vec();
    assert_eq!(argv[5], "bind");
    argv[5] = "run".into();
    argv
}

/// As [`sbx_run_stage`], for the call in a PID namespace of its own (pid file positional `-`),
/// entered at `run` outside any namespace: the stage's own logic under each shell.
fn sbx_pid_namespace_run_stage(nonce: &Nonce, invocation: &EncodedInvocation) -> Vec<String> {
    let mount = SbxMount {
        parent: "/nonexistent-parent".to_owned(),
        guest_mount: "-".into(),
    };
    let argv = sbx_pid_namespace_wrapper_argv(nonce, &mount, false, invocation).unwrap();
    let sh = argv.iter().position(|arg| arg == "sh").unwrap();
    let mut argv = argv[sh..].to_vec();
    assert_eq!((argv[5].as_str(), argv[7].as_str()), ("bind", "-"));
    argv[5] = "run".into();
    argv
}

/// The run stage of a PID-namespace call under dash, BusyBox and bash: no group record, the
/// command started by `setsid` directly in a group and session of its own, its status or signal
/// passed through, a program named like an option run as named, and a cancel file found before
/// the nonce line stops everything.
#[tokio::test]
async fn the_pid_namespace_run_stage_starts_the_command_under_setsid_alone() {
    let dir = tempfile::tempdir().unwrap();
    let own_group = br#"read -r l </proc/self/stat; p=${l%% *}; set -- ${l##*) }
[ "$3" = "$p" ] && [ "$4" = "$p" ] && echo own-group"#;
    for shell in shells() {
        let run = |argv: &[&[u8]]| {
            let nonce = common::host_call();
            let invocation = plain_invocation(b"/", argv).unwrap();
            let argv = sbx_pid_namespace_run_stage(&nonce, &invocation);
            let shell = &shell;
            async move {
                let output = shell.run(&argv, BOUND).await.unwrap();
                assert!(
                    !std::path::Path::new(&pid_file(&nonce)).exists(),
                    "{}: a group record was written",
                    shell.name
                );
                parse_run_output(output, &nonce)
            }
        };
        let output = ran(&shell, run(&[b"sh", b"-c", own_group]).await);
        assert_eq!(
            (output.status, output.stdout.as_slice()),
            (0, &b"own-group\n"[..]),
            "{}: {}",
            shell.name,
            String::from_utf8_lossy(&output.stderr)
        );
        for (script, status) in [
            (&b"exit 7"[..], 7),
            (b"kill -KILL $$", 137),
            (b"kill -TERM $$", 143),
        ] {
            let output = ran(&shell, run(&[b"sh", b"-c", script]).await);
            assert_eq!(
                output.status,
                status,
                "{}: {}",
                shell.name,
                String::from_utf8_lossy(script)
            );
        }
        for program in [&b"no-such-program"[..], b"-no-such-program"] {
            let output = ran(&shell, run(&[program]).await);
            assert_eq!(
                output.status,
                127,
                "{}: {}",
                shell.name,
                String::from_utf8_lossy(program)
            );
        }

        // The kill came first: nothing runs, and no nonce line says otherwise.
        let nonce = common::host_call();
        std::fs::write(cancel_file(&nonce), b"").unwrap();
        let side_effect = dir.path().join(format!("ran-{}", shell.name));
        let invocation = plain_invocation(
            b"/",
            &[
                b"touch".as_slice(),
                side_effect.to_str().unwrap().as_bytes(),
            ],
        )
        .unwrap();
        let output = shell
            .run(&sbx_pid_namespace_run_stage(&nonce, &invocation), BOUND)
            .await
            .unwrap();
        assert!(
            matches!(
                parse_run_output(output, &nonce),
                WrapperOutcome::NoNonce { status: 125, .. }
            ),
            "{}",
            shell.name
        );
        assert!(
            !side_effect.exists(),
            "{}: a cancelled command ran",
            shell.name
        );
        std::fs::remove_file(cancel_file(&nonce)).unwrap();
    }
}

async fn run_sbx_run_stage(shell: &Shell, cwd: &[u8], argv: &[Vec<u8>]) -> WrapperOutcome {
    let nonce = common::host_call();
    let invocation = plain_invocation(cwd, argv).unwrap();
    let output = shell
        .run(
            &sbx_run_stage(&nonce, "/nonexistent-parent", false, &invocation),
            BOUND,
        )
        .await
        .unwrap_or_else(|e| panic!("{}: runner failed: {e}", shell.name));
    parse_run_output(output, &nonce)
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
        b" ".to_vec(),
        b"  two  spaces ".to_vec(),
        b"'".to_vec(),
        b"\"".to_vec(),
        b"$(touch /tmp/exec-wrapper-pwned)".to_vec(),
        b"`id`".to_vec(),
        b"$HOME ${1} $@".to_vec(),
        b"-".to_vec(),
        b"--".to_vec(),
        b"*".to_vec(),
        b"x".to_vec(),
        b"\\n\\0".to_vec(),
        vec![0xff, 0xfe, 0x80, b'\n'],
        b"\r\n".to_vec(),
        b"%s%d".to_vec(),
    ]);
    let non_nul_byte = 1u8..=255u8;
    prop_oneof![
        4 => tricky,
        4 => prop::collection::vec(non_nul_byte.clone(), 0..40),
        1 => prop::collection::vec(non_nul_byte, 20_000..60_000),
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

    /// Every argv element reaches the command byte for byte, under every shell.
    #[test]
    fn arbitrary_argv_round_trips(args in prop::collection::vec(argv_element(), 0..8)) {
        let rt = runtime();
        let shells = shells();
        // A fixed first argument, since printf prints its format once even with no arguments.
        let mut argv = vec![b"printf".to_vec(), b"%s\\0".to_vec(), b"start".to_vec()];
        argv.extend(args.iter().cloned());
        let mut expected = b"start\0".to_vec();
        for arg in &args {
            expected.extend_from_slice(arg);
            expected.push(0);
        }
        for shell in &shells {
            let (_, outcome) = rt.block_on(run_docker_shape(shell, b"/", &argv));
            let output = ran(shell, outcome);
            prop_assert_eq!(output.status, 0, "{}: {:?}", shell.name, String::from_utf8_lossy(&output.stderr));
            prop_assert!(output.stderr.is_empty(), "{}: stderr {:?}", shell.name, String::from_utf8_lossy(&output.stderr));
            prop_assert!(output.stdout == expected, "{}: argv changed on the way", shell.name);
        }
        prop_assert!(!std::path::Path::new("/tmp/exec-wrapper-pwned").exists());
    }

    /// The same through the sbx run stage, each value carried plain (`r`) or encoded (`x`) as
    /// the sbx backend carries it, and the working directory too.
    #[test]
    fn arbitrary_argv_round_trips_plain_or_encoded(
        args in prop::collection::vec(argv_element(), 0..8),
        cwd in prop::sample::select(vec!["/", "/tmp", "/tmp/", "//tmp/."]),
    ) {
        let rt = runtime();
        let shells = shells();
        let mut argv = vec![b"printf".to_vec(), b"%s\\0".to_vec(), b"start".to_vec()];
        argv.extend(args.iter().cloned());
        let mut expected = b"start\0".to_vec();
        for arg in &args {
            expected.extend_from_slice(arg);
            expected.push(0);
        }
        for shell in &shells {
            let outcome = rt.block_on(run_sbx_run_stage(shell, cwd.as_bytes(), &argv));
            let output = ran(shell, outcome);
            prop_assert_eq!(output.status, 0, "{}: {:?}", shell.name, String::from_utf8_lossy(&output.stderr));
            prop_assert!(output.stderr.is_empty(), "{}: stderr {:?}", shell.name, String::from_utf8_lossy(&output.stderr));
            prop_assert!(output.stdout == expected, "{}: argv changed on the way", shell.name);
        }
        prop_assert!(!std::path::Path::new("/tmp/exec-wrapper-pwned").exists());
    }
}

/// A plain working directory is entered without decoding, and one that cannot be entered is
/// still "not started", whichever way it travels.
#[tokio::test]
async fn the_sbx_run_stage_enters_a_plain_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("a dir");
    std::fs::create_dir(&plain).unwrap();
    for shell in shells() {
        let outcome = run_sbx_run_stage(
            &shell,
            plain.to_str().unwrap().as_bytes(),
            &[b"pwd".to_vec()],
        )
        .await;
        let output = ran(&shell, outcome);
        assert_eq!(
            output.stdout,
            format!("{}\n", plain.display()).into_bytes(),
            "{}",
            shell.name
        );
        for cwd in ["/no/such/dir", "/no/such dir"] {
            let outcome = run_sbx_run_stage(&shell, cwd.as_bytes(), &[b"true".to_vec()]).await;
            common::assert_not_started(shell.name, &outcome, cwd);
        }
        // Neither an `r` nor an `x` value: a wrapper failure before the nonce.
        let nonce = common::host_call();
        let invocation = plain_invocation(b"/", &[b"true"]).unwrap();
        let mut argv = sbx_run_stage(&nonce, "/nonexistent-parent", false, &invocation);
        argv.push("unprefixed".into());
        let output = shell.run(&argv, BOUND).await.unwrap();
        assert!(
            matches!(
                parse_run_output(output, &nonce),
                WrapperOutcome::NoNonce { status: 125, .. }
            ),
            "{}",
            shell.name
        );
    }
}

#[tokio::test]
async fn stdout_and_stderr_stay_separate_and_exact() {
    let script = b"printf 'out\\0\\377\\n' ; printf 'err \\001\\n\\n' >&2; printf tail; printf etail >&2; exit 3";
    for shell in shells() {
        let (_, outcome) = run_docker_shape(
            &shell,
            b"/",
            &[b"sh".to_vec(), b"-c".to_vec(), script.to_vec()],
        )
        .await;
        let output = ran(&shell, outcome);
        assert_eq!(output.stdout, b"out\0\xff\ntail", "{}", shell.name);
        assert_eq!(output.stderr, b"err \x01\n\netail", "{}", shell.name);
        assert_eq!(output.status, 3, "{}", shell.name);
    }
}

#[tokio::test]
async fn exit_codes_0_to_255_pass_through() {
    for shell in shells() {
        let runs = (0..=255).map(|code| {
            let shell = &shell;
            async move {
                let argv = [
                    b"sh".to_vec(),
                    b"-c".to_vec(),
                    format!("exit {code}").into_bytes(),
                ];
                let (_, outcome) = run_docker_shape(shell, b"/", &argv).await;
                (code, ran(shell, outcome).status)
            }
        });
        let mut statuses = Vec::new();
        // Eight at a time: the machine is shared.
        let runs: Vec<_> = runs.collect();
        let mut runs = runs.into_iter();
        loop {
            let batch: Vec<_> = runs.by_ref().take(8).collect();
            if batch.is_empty() {
                break;
            }
            statuses.extend(tokio_join_all(batch).await);
        }
        for (code, status) in statuses {
            assert_eq!(status, code, "{}", shell.name);
        }
    }
}

#[tokio::test]
async fn working_directory_is_entered_and_an_unusable_one_is_not_started() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("a dir\nwith newline");
    std::fs::create_dir(&odd).unwrap();
    for shell in shells() {
        use std::os::unix::ffi::OsStrExt as _;
        let (_, outcome) =
            run_docker_shape(&shell, odd.as_os_str().as_bytes(), &[b"pwd".to_vec()]).await;
        let output = ran(&shell, outcome);
        assert_eq!(
            output.stdout,
            [odd.as_os_str().as_bytes(), b"\n"].concat(),
            "{}",
            shell.name
        );

        // Missing, a regular file, and a directory that exists but cannot be entered (skipped
        // as root, who enters it anyway): the command never runs, whatever the shell.
        let plain = dir.path().join("plain");
        let locked = dir.path().join("locked");
        if !locked.exists() {
            std::fs::write(&plain, b"x").unwrap();
            std::fs::create_dir(&locked).unwrap();
            std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o000))
                .unwrap();
        }
        let as_root = std::fs::read_dir(&locked).is_ok();
        let side_effect = dir.path().join(format!("ran-{}", shell.name));
        let touch = [
            b"touch".to_vec(),
            side_effect.as_os_str().as_bytes().to_vec(),
        ];
        let mut unusable = vec!["/no/such/dir".to_owned(), plain.display().to_string()];
        if !as_root {
            unusable.push(locked.display().to_string());
        }
        for cwd in &unusable {
            let (_, outcome) = run_docker_shape(&shell, cwd.as_bytes(), &touch).await;
            common::assert_not_started(shell.name, &outcome, cwd);
            assert!(
                !side_effect.exists(),
                "{}: {cwd}: the command ran",
                shell.name
            );
        }
    }
}

/// A command that prints the `-nocwd` marker of its own call's nonce and exits 125 is still the
/// command's result: the marker only counts before the nonce line, which the command comes after.
#[tokio::test]
async fn a_command_cannot_forge_the_not_started_marker() {
    for shell in shells() {
        let nonce = common::host_call();
        let forged = format!("{nonce}-nocwd\nsh: cd: can't cd to /forged\n");
        let argv = [
            b"sh".to_vec(),
            b"-c".to_vec(),
            b"printf \"$1\" >&2; exit 125".to_vec(),
            b"sh".to_vec(),
            forged.into_bytes(),
        ];
        let invocation = encode_invocation(b"/", &argv).unwrap();
        let output = shell
            .run(&docker_wrapper_argv(&nonce, &invocation), BOUND)
            .await
            .unwrap();
        let output = ran(&shell, parse_run_output(output, &nonce));
        assert_eq!(output.status, 125, "{}", shell.name);
        assert_eq!(
            output.stderr,
            format!("{nonce}-nocwd\nsh: cd: can't cd to /forged\n").into_bytes(),
            "{}",
            shell.name
        );
    }
}

#[tokio::test]
async fn a_missing_program_is_127_after_the_nonce() {
    for shell in shells() {
        let (_, outcome) = run_docker_shape(&shell, b"/", &[b"no-such-program-xyz".to_vec()]).await;
        assert_eq!(ran(&shell, outcome).status, 127, "{}", shell.name);
    }
}

#[tokio::test]
async fn wrapper_failures_exit_125_without_the_nonce() {
    for shell in shells() {
        let nonce = common::host_call();
        let invocation = encode_invocation(b"/", &[b"true"]).unwrap();
        let good = docker_wrapper_argv(&nonce, &invocation);

        // An argument that is not `x` + base64.
        let mut bad_encoding = good.clone();
        bad_encoding.push("not-encoded".into());
        // An unknown stage.
        let mut bad_stage = good.clone();
        bad_stage[5] = "bind".into();
        // No argv at all.
        let mut no_argv = good.clone();
        no_argv.pop();

        for argv in [bad_encoding, bad_stage, no_argv] {
            let output = shell.run(&argv, BOUND).await.unwrap();
            match parse_run_output(output, &nonce) {
                WrapperOutcome::NoNonce { status, .. } => assert_eq!(status, 125, "{}", shell.name),
                other => panic!("{}: a wrapper failure read as {other:?}", shell.name),
            }
        }
    }
}

#[tokio::test]
async fn sbx_run_stage_exports_env_entries_verbatim_and_deletes_the_env_file() {
    let parent = tempfile::tempdir().unwrap();
    let parent_str = parent.path().to_str().unwrap().to_owned();
    for shell in shells() {
        let nonce = common::host_call();
        let env: Vec<(&[u8], &[u8])> = vec![
            (b"PLAIN", b"value with  spaces"),
            (
                b"TRICKY",
                b"$(touch /tmp/exec-wrapper-env-pwned) 'q' \"d\"\n\n",
            ),
            (b"EMPTY", b""),
            // Names the wrapper itself uses must not redirect it.
            (b"p", b"/nonexistent/elsewhere"),
            (b"e", b"-"),
            (b"k", b"0"),
            // Unquoted expansions would split on it; the wrapper has none.
            (b"IFS", b"/"),
        ];
        let env_file = parent.path().join(sbx_env_file_name(&nonce));
        std::fs::write(&env_file, encode_env_file(&env).unwrap()).unwrap();
        let script = format!(
            "printf '%s\\0' \"$PLAIN\" \"$TRICKY\" \"${{EMPTY-unset}}\" \"$p\"; cat {}",
            pid_file(&nonce)
        );
        let invocation =
            encode_invocation(b"/", &[b"sh".as_slice(), b"-c", script.as_bytes()]).unwrap();
        let argv = sbx_run_stage(&nonce, &parent_str, true, &invocation);
        let output = shell.run(&argv, BOUND).await.unwrap();
        let output = ran(&shell, parse_run_output(output, &nonce));
        assert_eq!(
            output.status,
            0,
            "{}: {}",
            shell.name,
            String::from_utf8_lossy(&output.stderr)
        );
        let mut parts = output.stdout.splitn(5, |b| *b == 0);
        assert_eq!(
            parts.next().unwrap(),
            b"value with  spaces",
            "{}",
            shell.name
        );
        assert_eq!(
            parts.next().unwrap(),
            b"$(touch /tmp/exec-wrapper-env-pwned) 'q' \"d\"\n\n",
            "{}",
            shell.name
        );
        assert_eq!(parts.next().unwrap(), b"", "{}", shell.name);
        assert_eq!(
            parts.next().unwrap(),
            b"/nonexistent/elsewhere",
            "{}",
            shell.name
        );
        // The pid record the command saw is its own pid: the wrapper kept its own pid file.
        let record = String::from_utf8(parts.next().unwrap().to_vec()).unwrap();
        assert!(
            record.trim_end().parse::<u32>().unwrap() > 1,
            "{}: {record:?}",
            shell.name
        );
        assert!(
            !env_file.exists(),
            "{}: the env file must be deleted",
            shell.name
        );
        assert!(
            !std::path::Path::new(&pid_file(&nonce)).exists(),
            "{}",
            shell.name
        );
    }
    assert!(!std::path::Path::new("/tmp/exec-wrapper-env-pwned").exists());
}

#[tokio::test]
async fn a_bad_env_file_is_a_wrapper_failure() {
    let parent = tempfile::tempdir().unwrap();
    for shell in shells() {
        let nonce = common::host_call();
        let env_file = parent.path().join(sbx_env_file_name(&nonce));
        // An entry without `=` and a line that is not encoded.
        for body in [
            format!("{}\n", encode_arg(b"NOEQUALS", "e").unwrap()),
            "plain\n".to_owned(),
        ] {
            std::fs::write(&env_file, &body).unwrap();
            let invocation = encode_invocation(b"/", &[b"true"]).unwrap();
            let argv = sbx_run_stage(&nonce, parent.path().to_str().unwrap(), true, &invocation);
            let output = shell.run(&argv, BOUND).await.unwrap();
            assert!(
                matches!(
                    parse_run_output(output, &nonce),
                    WrapperOutcome::NoNonce { status: 125, .. }
                ),
                "{}: {body:?}",
                shell.name
            );
        }
    }
}

#[tokio::test]
async fn a_cancel_before_the_start_means_the_command_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    for shell in shells() {
        let nonce = common::host_call();
        let pid = pid_file(&nonce);
        // The kill comes first: no pid file yet, so "never started", and the cancel file stays.
        let kill = shell.run(&kill_argv(&pid), BOUND).await.unwrap();
        assert_eq!(
            KillOutcome::from_run(&Ok(kill)),
            KillOutcome::NeverStarted,
            "{}",
            shell.name
        );
        assert!(
            std::path::Path::new(&cancel_file(&nonce)).exists(),
            "{}",
            shell.name
        );

        let side_effect = dir.path().join(format!("ran-{}", shell.name));
        let invocation = encode_invocation(
            b"/",
            &[
                b"touch".as_slice(),
                side_effect.to_str().unwrap().as_bytes(),
            ],
        )
        .unwrap();
        let output = shell
            .run(&docker_wrapper_argv(&nonce, &invocation), BOUND)
            .await
            .unwrap();
        let output = ran(&shell, parse_run_output(output, &nonce));
        assert_ne!(output.status, 0, "{}", shell.name);
        assert!(
            !side_effect.exists(),
            "{}: a cancelled command ran",
            shell.name
        );
        assert!(!std::path::Path::new(&pid).exists(), "{}", shell.name);
    }
}

#[tokio::test]
async fn the_kill_script_refuses_bad_records() {
    let cases: [(&str, &[u8]); 6] = [
        ("zero", b"0\n"),
        ("one", b"1\n"),
        ("letters", b"12a\n"),
        ("leading zero", b"0123\n"),
        ("too large", b"99999999\n"),
        ("empty", b""),
    ];
    let shells = shells();
    let mut runs = Vec::new();
    for shell in &shells {
        for (label, record) in cases
            .iter()
            .copied()
            .chain([("unterminated", b"1234".as_slice())])
        {
            runs.push(async move {
                let nonce = common::host_call();
                let pid = pid_file(&nonce);
                std::fs::write(&pid, record).unwrap();
                let started = std::time::Instant::now();
                let result = shell.run(&kill_argv(&pid), BOUND).await;
                let elapsed = started.elapsed();
                let _ = std::fs::remove_file(&pid);
                let _ = std::fs::remove_file(cancel_file(&nonce));
                (shell.name, label, result.map(|o| o.status), elapsed)
            });
        }
    }
    let results = tokio_join_all(runs).await;
    for (shell, label, status, elapsed) in results {
        assert_eq!(status.unwrap(), ExitKind::Exited(3), "{shell}: {label}");
        if matches!(label, "empty" | "unterminated") {
            assert!(
                elapsed >= Duration::from_millis(900),
                "{shell}: {label} re-read for 1 s, took {elapsed:?}"
            );
        }
    }
}

async fn tokio_join_all<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future,
{
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, slot) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(output) => *slot = Some(output),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

#[tokio::test]
async fn the_kill_script_reports_an_unwritable_cancel_file() {
    for shell in shells() {
        // Run as the backends run it: the shell's complaint fits the kill call's budget.
        let kill = shell
            .command(&kill_argv("/nonexistent-dir/maf-sbx-x.pgid"), BOUND)
            .output_budget(KILL_OUTPUT_BUDGET)
            .run()
            .await;
        assert_eq!(
            KillOutcome::from_run(&kill),
            KillOutcome::NotLanded(KillFailure::CancelFileUnwritable),
            "{}: {kill:?}",
            shell.name
        );
        let kill = kill.unwrap();
        assert_eq!(kill.status, ExitKind::Exited(5), "{}", shell.name);
        assert!(
            !kill.stderr.is_empty(),
            "{}: the shell says why",
            shell.name
        );
        let kill = shell.run(&kill_argv(""), BOUND).await.unwrap();
        assert_eq!(
            kill.status,
            ExitKind::Exited(3),
            "{}: an empty path",
            shell.name
        );
    }
}

#[tokio::test]
async fn the_tool_probe_names_every_missing_tool() {
    for shell in shells() {
        let argv = tool_probe_argv(&["cat", "no-such-tool-1", "base64", "no-such-tool-2"]).unwrap();
        // Run as the backends run it, within the probe's budget.
        let output = shell
            .command(&argv, BOUND)
            .output_budget(PROBE_OUTPUT_BUDGET)
            .run()
            .await
            .unwrap();
        assert_eq!(
            read_tool_probe(output.status, &output.stdout),
            ToolProbeOutcome::Missing(vec!["no-such-tool-1".into(), "no-such-tool-2".into()]),
            "{}",
            shell.name
        );
        let output = shell
            .run(&tool_probe_argv(DOCKER_TOOLS).unwrap(), BOUND)
            .await
            .unwrap();
        assert_eq!(
            read_tool_probe(output.status, &output.stdout),
            ToolProbeOutcome::AllPresent,
            "{}",
            shell.name
        );
    }
}
