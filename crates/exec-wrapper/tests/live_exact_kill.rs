//! The exact kills against the real engine: hostile commands that leave their process group,
//! start daemons, delete the records, fork in a loop or empty `/tmp` are started with a short
//! timeout, killed by a second exec, and checked from a third: no process they started remains,
//! a sibling call started before them completes, and the container keeps serving.
//!
//! Docker shape: `sandbox-base:local` (dash, perl) and `sandbox-busybox:local` (BusyBox), run
//! under the engine's init and, on `sandbox-base:local`, which carries it, under the exec init,
//! like the Docker backend runs its containers (`--init`, no capabilities, no new privileges, a
//! pids limit, no network). sbx shape: `sbx-sim-shell:local` run as `sbx-sim` runs its
//! sandboxes (uid 1000, no capabilities but SETFCAP, seccomp and AppArmor unconfined), through
//! the wrapper's PID-namespace shape (the call's first process is its `unshare`). Every
//! container is named `kill-<unique>` and removed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bounded_process::{BoundedCommand, Error, RunOutput};
use exec_wrapper::encoding::{plain_invocation, raw_invocation};
use exec_wrapper::kill::{
    docker_init_probe_argv, namespace_kill_argv, pid_namespace_probe_argv, read_kill_mode_probe,
    tree_kill_argv, KillMode, KillOutcome, KillReport,
};
use exec_wrapper::outcome::{nonce_line_seen, parse_run_output};
use exec_wrapper::wrapper::{
    docker_init_wrapper_argv, exec_init_argv, sbx_pid_namespace_wrapper_argv, SbxMount,
};
use exec_wrapper::{new_nonce, Nonce, WrapperOutcome};

/// How long a hostile command runs before its deadline: its nonce line must arrive first, and a
/// `docker exec` started beside CI's other suites (VMs under emulation among them) took more
/// than 1.5 s to print it.
const HOSTILE_TIMEOUT: Duration = Duration::from_secs(3);
const BOUND: Duration = Duration::from_secs(60);

fn docker(args: Vec<String>, bound: Duration) -> BoundedCommand {
    BoundedCommand::new("docker", bound)
        .args(args)
        .envs(std::env::vars_os())
}

async fn docker_ok(args: &[&str]) -> RunOutput {
    let output = docker(args.iter().map(|a| a.to_string()).collect(), BOUND)
        .run()
        .await
        .expect("the docker CLI runs");
    assert_eq!(
        output.status,
        bounded_process::ExitKind::Exited(0),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A container this test made, removed when dropped.
struct Container {
    name: String,
}

impl Container {
    async fn start(image: &str, extra: &[&str]) -> Container {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("kill-{}-{nanos:08x}", std::process::id());
        let mut args = vec![
            "run",
            "-d",
            "--pull=never",
            "--name",
            &name,
            "--label",
            "maf-branch=kill",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[image, "sleep", "infinity"]);
        docker_ok(&args).await;
        Container { name }
    }

    fn exec(&self, argv: &[String], bound: Duration) -> BoundedCommand {
        let mut args = vec!["exec".to_owned(), self.name.clone()];
        args.extend(argv.iter().cloned());
        docker(args, bound)
    }

    /// Every process in the container except PID 1, the container's own `sleep infinity` and
    /// the checking shell itself, as `pid ppid state cmdline` lines.
    async fn strangers(&self) -> Vec<String> {
        let script = r#"for d in /proc/[0-9]*; do
  q=${d#/proc/}
  [ "$q" = 1 ] || [ "$q" = "$$" ] && continue
  s=; read -r s 2>/dev/null <"$d/stat" || continue
  c=; IFS= read -r c 2>/dev/null <"$d/cmdline"
  s=${s##*) }; e=${s%% *}; s=${s#* }; pp=${s%% *}
  [ "$pp" = 1 ] && [ "$c" = sleepinfinity ] && continue
  printf '%s %s %s %s\n' "$q" "$pp" "$e" "$c"
done"#;
        let output = self
            .exec(&["sh".into(), "-c".into(), script.into()], BOUND)
            .run()
            .await
            .expect("the checker runs");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// One of the two shapes: how a call and its kill are written.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    DockerInit,
    ExecInit,
    SbxPidNamespace,
}

const SBX_PARENT: &str = "/home/agent/maf-parent";
const SBX_WORKSPACE: &str = "/home/agent/maf-ws";

impl Shape {
    fn call(self, nonce: &Nonce, argv: &[&[u8]]) -> Vec<String> {
        match self {
            Shape::DockerInit => {
                docker_init_wrapper_argv(nonce, &raw_invocation(b"/", argv).unwrap())
            }
            Shape::ExecInit => exec_init_argv(nonce, &raw_invocation(b"/", argv).unwrap()),
            Shape::SbxPidNamespace => sbx_pid_namespace_wrapper_argv(
                nonce,
                &SbxMount {
                    parent: SBX_PARENT.into(),
                    guest_mount: SBX_WORKSPACE.into(),
                },
                false,
                &plain_invocation(b"/", argv).unwrap(),
            )
            .unwrap(),
        }
    }

    fn kill(self, nonce: &Nonce) -> Vec<String> {
        match self {
            Shape::DockerInit | Shape::ExecInit => tree_kill_argv(nonce),
            Shape::SbxPidNamespace => namespace_kill_argv(nonce),
        }
    }

    fn mode(self) -> KillMode {
        match self {
            Shape::DockerInit | Shape::ExecInit => KillMode::SubreaperTree,
            Shape::SbxPidNamespace => KillMode::PidNamespace,
        }
    }
}

/// The hostile commands, each `sh -c <script>`.
fn hostile_cases(has_perl: bool) -> Vec<(&'static str, String)> {
    let leave_group = if has_perl {
        r#"perl -e 'if(fork){sleep 600}else{setpgrp(0,0);exec "sleep","601"}'"#
    } else {
        "(setsid sleep 601 &); sleep 600"
    };
    vec![
        ("a child in its own process group", leave_group.to_owned()),
        (
            "the records deleted",
            "rm -f /tmp/maf-sbx-*; exec sleep 602".to_owned(),
        ),
        (
            "a double-fork setsid daemon",
            "(setsid sh -c 'sleep 603 & exit 0' &); sleep 600".to_owned(),
        ),
        (
            "nohup in the background",
            "nohup sleep 604 >/dev/null 2>&1 & sleep 600".to_owned(),
        ),
        ("a tight fork loop", "while :; do (: &); done".to_owned()),
        (
            "every file in /tmp removed",
            "while :; do rm -rf /tmp/* /tmp/.[!.]* 2>/dev/null; sleep 0.05; done".to_owned(),
        ),
    ]
}

async fn the_hostile_cases_leave_nothing_behind(
    container: &Container,
    shape: Shape,
    has_perl: bool,
) {
    for (label, script) in hostile_cases(has_perl) {
        let sibling_nonce = new_nonce().unwrap();
        let sibling_argv = shape.call(
            &sibling_nonce,
            &[b"sh", b"-c", b"sleep 3; echo sibling-done"],
        );
        let sibling = tokio::spawn(container.exec(&sibling_argv, BOUND).run());
        tokio::time::sleep(Duration::from_millis(300)).await;

        let nonce = new_nonce().unwrap();
        let argv = shape.call(&nonce, &[b"sh", b"-c", script.as_bytes()]);
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let line = nonce.line();
        let flag = std::sync::Arc::clone(&seen);
        let hostile = container
            .exec(&argv, HOSTILE_TIMEOUT)
            .on_line(move |stream, bytes| {
                if stream == bounded_process::Stream::Stderr && bytes == line.as_slice() {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
            .run()
            .await;
        assert!(
            matches!(hostile, Err(Error::Deadline { .. })),
            "{label}: {hostile:?}"
        );
        let nonce_seen = seen.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            nonce_seen,
            "{label}: the nonce line arrived before the deadline"
        );

        let started = std::time::Instant::now();
        let kill = container
            .exec(&shape.kill(&nonce), Duration::from_secs(15))
            .run()
            .await;
        let kill_took = started.elapsed();
        let report = KillReport::from_run(&kill).after_start(nonce_seen);
        assert_eq!(report.outcome, KillOutcome::Killed, "{label}: {kill:?}");
        assert_eq!(report.mode, Some(shape.mode()), "{label}");
        eprintln!("{label}: killed in {kill_took:?} (kill exec included)");
        // The call's wrapper was killed before it could remove its records; a landed kill
        // removes them (the pid file of the namespace shape, and the cancel file it wrote
        // itself), so a kill leaves nothing behind in a reused sandbox.
        for record in [
            exec_wrapper::call::pid_file(&nonce),
            exec_wrapper::call::cancel_file(&nonce),
        ] {
            let argv = ["sh", "-c", r#"[ ! -e "$1" ]"#, "x", &record].map(str::to_owned);
            let gone = container.exec(&argv, BOUND).run().await.unwrap();
            assert_eq!(
                gone.status,
                bounded_process::ExitKind::Exited(0),
                "{label}: {record} left behind"
            );
        }

        let sibling = sibling.await.unwrap().expect("the sibling call completes");
        match parse_run_output(sibling, &sibling_nonce) {
            WrapperOutcome::Ran(out) => {
                assert_eq!(out.status, 0, "{label}: sibling");
                assert_eq!(
                    out.stdout, b"sibling-done\n",
                    "{label}: the sibling was touched"
                );
            }
            other => panic!("{label}: sibling {other:?}"),
        }
        let strangers = container.strangers().await;
        assert!(strangers.is_empty(), "{label}: survivors {strangers:#?}");

        // The container keeps serving.
        let again = new_nonce().unwrap();
        let output = container
            .exec(&shape.call(&again, &[b"echo", b"still serving"]), BOUND)
            .run()
            .await
            .unwrap();
        match parse_run_output(output, &again) {
            WrapperOutcome::Ran(out) => assert_eq!(out.stdout, b"still serving\n", "{label}"),
            other => panic!("{label}: {other:?}"),
        }
    }
}

const DOCKER_LIKE: &[&str] = &[
    "--init",
    "--security-opt",
    "no-new-privileges",
    "--cap-drop",
    "ALL",
    "--pids-limit",
    "1024",
    "--network",
    "none",
];

async fn probe(container: &Container, argv: Vec<String>) -> bool {
    let output = container.exec(&argv, BOUND).run().await.unwrap();
    read_kill_mode_probe(output.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_shape_tree_kill_on_debian_and_busybox() {
    for (image, has_perl) in [
        ("sandbox-base:local", true),
        ("sandbox-busybox:local", false),
    ] {
        let container = Container::start(image, DOCKER_LIKE).await;
        assert!(
            probe(&container, docker_init_probe_argv()).await,
            "{image}: docker-init -s works"
        );
        eprintln!("== {image}");
        the_hostile_cases_leave_nothing_behind(&container, Shape::DockerInit, has_perl).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_init_shape_tree_kill_on_debian() {
    let container = Container::start("sandbox-base:local", DOCKER_LIKE).await;
    the_hostile_cases_leave_nothing_behind(&container, Shape::ExecInit, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_init_the_probe_says_group_kill() {
    let container = Container::start(
        "sandbox-base:local",
        &["--cap-drop", "ALL", "--network", "none"],
    )
    .await;
    assert!(!probe(&container, docker_init_probe_argv()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_init_is_killed_by_its_command_is_not_landed() {
    let container = Container::start("sandbox-base:local", DOCKER_LIKE).await;
    // The command kills its own init (its grandparent under the engine's init, its parent
    // under the exec init) and keeps running, orphaned.
    for (shape, script) in [
        (
            Shape::DockerInit,
            b"read -r s </proc/$PPID/stat; s=${s##*) }; s=${s#* }; kill -KILL ${s%% *}; exec sleep 607".as_slice(),
        ),
        (Shape::ExecInit, b"kill -KILL $PPID; exec sleep 608".as_slice()),
    ] {
        init_killed_by_its_command(&container, shape, script).await;
    }
}

async fn init_killed_by_its_command(container: &Container, shape: Shape, script: &[u8]) {
    let nonce = new_nonce().unwrap();
    let argv = shape.call(&nonce, &[b"sh", b"-c", script]);
    let hostile = container.exec(&argv, HOSTILE_TIMEOUT).run().await;
    // The client may see the exec end (its process died) or hang on the orphan's pipes.
    let seen = match &hostile {
        Ok(output) => nonce_line_seen(&output.stderr, &nonce),
        Err(_) => true,
    };
    let kill = container
        .exec(&tree_kill_argv(&nonce), Duration::from_secs(15))
        .run()
        .await;
    let report = KillReport::from_run(&kill).after_start(seen);
    assert!(
        !report.outcome.landed(),
        "{report:?}: the sandbox must be retired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sbx_shape_namespace_kill_in_an_sbx_sim_like_container() {
    let container = Container::start(
        "sbx-sim-shell:local",
        &[
            "--init",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "SETFCAP",
            "--security-opt",
            "seccomp=unconfined",
            "--security-opt",
            "apparmor=unconfined",
            "--user",
            "1000",
        ],
    )
    .await;
    let setup = format!(
        "mkdir -p {SBX_PARENT} {SBX_WORKSPACE} && : >{SBX_WORKSPACE}/{}",
        exec_wrapper::wrapper::WORKSPACE_MARKER
    );
    let output = container
        .exec(&["sh".into(), "-c".into(), setup], BOUND)
        .run()
        .await
        .unwrap();
    assert_eq!(output.status, bounded_process::ExitKind::Exited(0));
    assert!(
        probe(&container, pid_namespace_probe_argv()).await,
        "PID namespaces work here"
    );
    the_hostile_cases_leave_nothing_behind(&container, Shape::SbxPidNamespace, true).await;
}
