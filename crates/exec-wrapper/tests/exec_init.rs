//! The exec init (`sandbox-exec-init`) against the init wrapper it replaces: the same calls
//! through both, with dash running the wrapper as the model, must end alike (status, stdout, the
//! outcome the host reads, the command's stderr); then what only a program can be asked: that it
//! adopts and reaps what the command orphans, keeps itself out of the command's process group,
//! records a signal-shaped status, and hands the command default signal dispositions.
#![cfg(target_os = "linux")]

mod common;

use std::path::Path;
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind, RunOutput};
use common::{shells, Shell};
use exec_wrapper::call::cancel_file;
use exec_wrapper::encoding::{raw_invocation, RawInvocation};
use exec_wrapper::outcome::{nonce_line_seen, parse_run_output};
use exec_wrapper::wrapper::{
    docker_init_wrapper_argv, exec_init_argv, init_status_argv, EXEC_INIT_PATH,
};
use exec_wrapper::{Nonce, WrapperOutcome, WrapperOutput};
use proptest::prelude::*;

const BOUND: Duration = Duration::from_secs(20);
const INIT: &str = env!("CARGO_BIN_EXE_sandbox-exec-init");
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Runs the call through the built init, as the engine would start it at [`EXEC_INIT_PATH`].
async fn through_init(nonce: &Nonce, invocation: &RawInvocation) -> RunOutput {
    let argv = exec_init_argv(nonce, invocation);
    assert_eq!(argv[0], EXEC_INIT_PATH);
    BoundedCommand::new(INIT, BOUND)
        .args(argv[1..].iter().cloned())
        .env("PATH", PATH)
        .env("LANG", "C.UTF-8")
        .run()
        .await
        .expect("the init runs")
}

/// Runs the same call through the init wrapper under `shell`, from its `sh` on.
async fn through_wrapper(shell: &Shell, nonce: &Nonce, invocation: &RawInvocation) -> RunOutput {
    let argv = docker_init_wrapper_argv(nonce, invocation);
    shell
        .run(&argv[3..], BOUND)
        .await
        .expect("the wrapper runs")
}

async fn init_outcome(cwd: &[u8], argv: &[Vec<u8>]) -> (common::HostCall, WrapperOutcome) {
    let nonce = common::host_call();
    let output = through_init(&nonce, &raw_invocation(cwd, argv).unwrap()).await;
    let outcome = parse_run_output(output, &nonce);
    (nonce, outcome)
}

fn ran(outcome: WrapperOutcome) -> WrapperOutput {
    match outcome {
        WrapperOutcome::Ran(output) => output,
        other => panic!("expected a command result, got {other:?}"),
    }
}

fn dash() -> Shell {
    shells()
        .into_iter()
        .find(|shell| shell.name == "dash")
        .expect("dash")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One call of the differential test: a command line and a working directory.
fn call() -> impl Strategy<Value = (Vec<u8>, Vec<Vec<u8>>)> {
    let value = prop_oneof![
        2 => prop::sample::select(vec![
            b"".to_vec(),
            b"\n".to_vec(),
            b"a\n\n".to_vec(),
            b"x".to_vec(),
            b"xaGk=".to_vec(),
            b"-".to_vec(),
            b"$(touch /tmp/exec-init-pwned)".to_vec(),
            vec![0xff, 0xfe, 0x80, b'\n'],
        ]),
        3 => prop::collection::vec(1u8..=255u8, 0..24),
    ];
    let command = prop_oneof![
        // printf of arbitrary values: argv byte fidelity.
        prop::collection::vec(value, 0..6).prop_map(|values| {
            let mut argv = vec![b"printf".to_vec(), b"%s\\0".to_vec()];
            argv.extend(values);
            argv
        }),
        // A status and both streams, including statuses the wrapper itself uses.
        (
            prop::sample::select(vec![0u8, 1, 7, 125, 126, 127, 128, 130, 255]),
            any::<bool>()
        )
            .prop_map(|(status, both)| {
                let script = if both {
                    format!("printf o; printf 'e\\n' >&2; exit {status}")
                } else {
                    format!("exit {status}")
                };
                vec![b"sh".to_vec(), b"-c".to_vec(), script.into_bytes()]
            }),
        // Killed by a signal of its own.
        prop::sample::select(vec!["TERM", "KILL", "INT", "USR1"]).prop_map(|signal| {
            vec![
                b"sh".to_vec(),
                b"-c".to_vec(),
                format!("kill -{signal} $$").into_bytes(),
            ]
        }),
    ];
    let cwd = prop::sample::select(vec![
        b"/".to_vec(),
        b"/tmp".to_vec(),
        b"/no/such/dir".to_vec(),
        b"/etc/hostname".to_vec(),
        vec![b'/', 0xff],
    ]);
    (cwd, command)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The init and the wrapper under dash end every call alike.
    #[test]
    fn the_init_ends_every_call_as_the_wrapper_does((cwd, argv) in call()) {
        let rt = runtime();
        let dash = dash();
        let invocation = raw_invocation(&cwd, &argv).unwrap();
        let (model_nonce, nonce) = (common::host_call(), common::host_call());
        let model = rt.block_on(through_wrapper(&dash, &model_nonce, &invocation));
        let ours = rt.block_on(through_init(&nonce, &invocation));
        prop_assert_eq!(model.status, ours.status);
        prop_assert_eq!(&model.stdout, &ours.stdout);
        match (parse_run_output(model, &model_nonce), parse_run_output(ours, &nonce)) {
            (WrapperOutcome::Ran(model), WrapperOutcome::Ran(ours)) if model.status > 128 => {
                // dash adds its own report of the signal ("Terminated") after the command's.
                prop_assert!(model.stderr.starts_with(&ours.stderr));
            }
            (WrapperOutcome::Ran(model), WrapperOutcome::Ran(ours)) => {
                prop_assert_eq!(model.stderr, ours.stderr);
            }
            (WrapperOutcome::NoWorkingDirectory { .. }, WrapperOutcome::NoWorkingDirectory { reason }) => {
                prop_assert!(!reason.is_empty());
            }
            (model, ours) => prop_assert!(false, "the wrapper: {model:?}, the init: {ours:?}"),
        }
        for nonce in [model_nonce, nonce] {
            let record = exec_wrapper::init::status_file(&nonce);
            let _ = std::fs::remove_file(record);
        }
        prop_assert!(!Path::new("/tmp/exec-init-pwned").exists());
    }
}

#[tokio::test]
async fn a_missing_program_an_unrunnable_file_and_a_script_without_an_interpreter_line() {
    let (_, outcome) = init_outcome(b"/", &[b"no-such-program-xyz".to_vec()]).await;
    let output = ran(outcome);
    assert_eq!(output.status, 127);
    assert_eq!(
        output.stderr,
        b"sandbox-exec-init: no-such-program-xyz: not found\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let unrunnable = dir.path().join("data");
    std::fs::write(&unrunnable, b"echo never\n").unwrap();
    let path = unrunnable.as_os_str().as_encoded_bytes().to_vec();
    let (_, outcome) = init_outcome(b"/", std::slice::from_ref(&path)).await;
    let output = ran(outcome);
    assert_eq!(output.status, 126, "{output:?}");
    assert!(output.stdout.is_empty());
    // Executable but neither ELF nor `#!`: the shell runs it, as `exec` in the wrapper does,
    // found by name through PATH too.
    let script = dir.path().join("greet");
    std::fs::write(&script, b"printf '%s|' \"$0\" \"$@\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (_, outcome) = init_outcome(
        b"/",
        &[
            script.as_os_str().as_encoded_bytes().to_vec(),
            b"a b".to_vec(),
        ],
    )
    .await;
    let output = ran(outcome);
    assert_eq!(output.status, 0, "{output:?}");
    assert_eq!(
        output.stdout,
        [script.as_os_str().as_encoded_bytes(), b"|a b|"].concat()
    );
    let nonce = common::host_call();
    let output = BoundedCommand::new(INIT, BOUND)
        .args(
            exec_init_argv(&nonce, &raw_invocation(b"/", &[b"greet"]).unwrap())[1..]
                .iter()
                .cloned(),
        )
        .env("PATH", format!("{}:{PATH}", dir.path().display()))
        .run()
        .await
        .unwrap();
    let output = ran(parse_run_output(output, &nonce));
    assert_eq!(
        (output.status, output.stdout),
        (0, [script.as_os_str().as_encoded_bytes(), b"|"].concat())
    );
}

#[tokio::test]
async fn a_malformed_call_or_a_cancel_exits_125_without_the_nonce_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let side_effect = dir.path().join("ran");
    let touch = [
        b"touch".to_vec(),
        side_effect.as_os_str().as_encoded_bytes().to_vec(),
    ];
    let nonce = common::host_call();
    let good = exec_init_argv(&nonce, &raw_invocation(b"/", &touch).unwrap());
    // positionals after the path: nonce mask cwd argv…
    let mut short_mask = good.clone();
    short_mask[2] = "rr".into();
    let mut bad_letter = good.clone();
    bad_letter[2] = "rqr".into();
    let mut bad_encoding = good.clone();
    bad_encoding[2] = "rxr".into();
    let mut bad_nonce = good.clone();
    bad_nonce[1] = "not-a-nonce".into();
    let mut no_argv = good.clone();
    no_argv.truncate(4);
    no_argv[2] = "r".into();
    for argv in [short_mask, bad_letter, bad_encoding, bad_nonce, no_argv] {
        let output = BoundedCommand::new(INIT, BOUND)
            .args(argv[1..].iter().cloned())
            .env("PATH", PATH)
            .run()
            .await
            .unwrap();
        assert_eq!(output.status, ExitKind::Exited(125), "{argv:?}");
        assert!(
            output.stderr.is_empty() && output.stdout.is_empty(),
            "{argv:?}"
        );
    }
    std::fs::write(cancel_file(&nonce), b"").unwrap();
    let output = through_init(&nonce, &raw_invocation(b"/", &touch).unwrap()).await;
    assert!(!nonce_line_seen(&output.stderr, &nonce));
    assert_eq!(output.status, ExitKind::Exited(125));
    std::fs::remove_file(cancel_file(&nonce)).unwrap();
    // A dangling link counts as the cancel too (the kill's file, or a command's plant: either
    // way nothing may start).
    std::os::unix::fs::symlink("/no/such/target", cancel_file(&nonce)).unwrap();
    let output = through_init(&nonce, &raw_invocation(b"/", &touch).unwrap()).await;
    assert_eq!(output.status, ExitKind::Exited(125));
    std::fs::remove_file(cancel_file(&nonce)).unwrap();
    assert!(!side_effect.exists(), "a refused call ran its command");
    let (_, outcome) = init_outcome(b"/no/such/dir", &touch).await;
    common::assert_not_started("init", &outcome, "/no/such/dir");
    assert!(!side_effect.exists(), "a call without its directory ran");
}

#[tokio::test]
async fn orphans_are_adopted_and_reaped_and_the_init_is_outside_the_commands_group() {
    // The command orphans a sleeper and a short-lived child, then reports, from inside the
    // call: the sleeper's parent (must be the init, its subreaper), how many zombies the init
    // holds once the short one has ended (none: it reaps while it waits), and its own process
    // group against the init's.
    let script = br#"(sleep 5 &) ; (true &) ; sleep 0.3
init=$PPID
for d in /proc/[0-9]*; do
  read -r s < "$d/stat" 2>/dev/null || continue
  rest=${s##*) }
  state=${rest%% *}; rest=${rest#* }
  ppid=${rest%% *}; rest=${rest#* }
  pgid=${rest%% *}
  [ "$ppid" = "$init" ] || continue
  c=$(tr '\0' ' ' < "$d/cmdline")
  case $state in Z) echo zombie ;; esac
  case $c in "sleep 5 ") echo "adopted $(basename $d)" ;; esac
done
read -r s < /proc/$init/stat
rest=${s##*) }; rest=${rest#* }; rest=${rest#* }
echo "init-group ${rest%% *}"
echo "init $init self $$"
kill -KILL 0
"#;
    let nonce = common::host_call();
    let output = through_init(
        &nonce,
        &raw_invocation(b"/", &[b"sh".to_vec(), b"-c".to_vec(), script.to_vec()]).unwrap(),
    )
    .await;
    let output = ran(parse_run_output(output, &nonce));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(!text.contains("zombie"), "{text}");
    let adopted: i32 = text
        .lines()
        .find_map(|line| line.strip_prefix("adopted "))
        .unwrap_or_else(|| panic!("the sleeper was not adopted by the init: {text}"))
        .parse()
        .unwrap();
    // `kill 0` ended the command's group (the sleeper's too), never the init: it recorded the
    // signal's status and answered that it did.
    assert_eq!(
        output.status,
        exec_wrapper::wrapper::RECORDED_STATUS,
        "{text}"
    );
    let init_group = word_after(&text, "init-group ", 0);
    let init_pid = word_after(&text, "init ", 0);
    let self_pid = word_after(&text, "init ", 2);
    assert_ne!(init_group, self_pid, "the init is in the command's group");
    assert_ne!(init_pid, self_pid);
    assert!(common::wait_dead(adopted, Duration::from_secs(5)).await);
    let check = init_status_check(&nonce).await;
    assert_eq!(check.trim(), "137");
}

/// The `index`th word after `prefix` on the first line of `text` that starts with it.
fn word_after<'a>(text: &'a str, prefix: &str, index: usize) -> &'a str {
    text.lines()
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().nth(index))
        .unwrap_or_else(|| panic!("no {prefix:?} line with word {index}: {text}"))
}

/// Runs the status check's script with the host's dash, as a second exec would.
async fn init_status_check(nonce: &Nonce) -> String {
    let output = dash().run(&init_status_argv(nonce), BOUND).await.unwrap();
    assert_eq!(output.status, ExitKind::Exited(0));
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn a_status_over_128_is_recorded_and_one_below_is_not_and_a_planted_link_is_not_followed() {
    let (nonce, outcome) = init_outcome(
        b"/",
        &[b"sh".to_vec(), b"-c".to_vec(), b"kill -TERM $$".to_vec()],
    )
    .await;
    assert_eq!(ran(outcome).status, exec_wrapper::wrapper::RECORDED_STATUS);
    assert_eq!(init_status_check(&nonce).await.trim(), "143");
    let (nonce, outcome) = init_outcome(b"/", &[b"true".to_vec()]).await;
    assert_eq!(ran(outcome).status, 0);
    assert_eq!(init_status_check(&nonce).await.trim(), "none");
    // A command that plants a link at its record and then dies by a signal: the init writes
    // nothing through the link, and the check reads no status (the host reads the 255).
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    let nonce = common::host_call();
    let record = exec_wrapper::init::status_file(&nonce);
    let script = format!("ln -s {} {record}; kill -KILL $$", target.display());
    let output = through_init(
        &nonce,
        &raw_invocation(b"/", &[b"sh".to_vec(), b"-c".to_vec(), script.into_bytes()]).unwrap(),
    )
    .await;
    assert_eq!(
        ran(parse_run_output(output, &nonce)).status,
        exec_wrapper::wrapper::RECORDED_STATUS
    );
    assert!(!target.exists(), "the record was written through a link");
    assert_eq!(init_status_check(&nonce).await.trim(), "none");
    std::fs::remove_file(record).unwrap();
}

#[tokio::test]
async fn the_command_starts_with_the_signals_the_wrapper_gives_it_and_exactly_its_argv() {
    // Compared with the wrapper under the same runner: the runner's own spawn decides what the
    // call inherits (an ignored signal stays ignored across exec), the init must add nothing.
    let script = b"grep -E '^Sig(Ign|Blk):' /proc/self/status; tr '\\0' '|' < /proc/$$/cmdline";
    let argv = [b"sh".to_vec(), b"-c".to_vec(), script.to_vec()];
    let invocation = raw_invocation(b"/", &argv).unwrap();
    let nonce = common::host_call();
    let model = through_wrapper(&dash(), &nonce, &invocation).await;
    let model = ran(parse_run_output(model, &nonce));
    let (_, outcome) = init_outcome(b"/", &argv).await;
    let output = ran(outcome);
    assert_eq!(output.status, 0);
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text, String::from_utf8(model.stdout).unwrap());
    assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
    assert!(
        text.ends_with(&format!("sh|-c|{}|", String::from_utf8_lossy(script))),
        "{text}"
    );
}
