//! Live behaviour of the docker backend beyond the shared suites: a sandbox removed behind a
//! handle, a timed-out command's group, the tool refusal, warm acquire and spec mismatch, listing,
//! `find` and disposal from the engine's labels, the env file, and a missing image. Every test
//! disposes what it made (its own scope) and checks nothing is left behind.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_docker::DockerBackend;

use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecEnv, ExecRequest, GuestCleanup, Sandbox,
    SandboxBackend, SandboxKey, SandboxSpec, SandboxState,
};
use support::{
    assert_nothing_left, backend, docker, unique_scope, BASE, BASE_ROOT, BUSYBOX, NOTOOLS,
};

fn spec(image: &str) -> SandboxSpec {
    SandboxSpec::builder("live").image(image).build().unwrap()
}

async fn run(sandbox: &dyn Sandbox, argv: &[&str]) -> sandbox_core::ExecOutput {
    sandbox
        .exec(ExecRequest::new(Command::argv(argv)).timeout(Duration::from_secs(30)))
        .await
        .expect("exec runs")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_removed_behind_the_handle_is_gone_never_an_exit_code() {
    let backend = backend(false).await;
    let scope = unique_scope("gone");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let old = sandbox.instance_id().to_owned();
    let removed = docker(["rm", "-f", &old]).await;
    assert_eq!(removed.status, bounded_process::ExitKind::Exited(0));
    for argv in [&["true"][..], &["sh", "-c", "exit 1"]] {
        let error = sandbox
            .exec(ExecRequest::new(Command::argv(argv)))
            .await
            .expect_err("an exec on a removed container is an error");
        assert_eq!(error.kind(), ErrorKind::SandboxGone, "{error}");
    }
    let error = sandbox.stat_file("x", ".").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::SandboxGone, "{error}");
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_ne!(again.instance_id(), old);
    assert!(again.freshly_created());
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_removed_while_a_command_runs_is_an_error_never_an_exit_code() {
    let backend = backend(false).await;
    let scope = unique_scope("gone-mid");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let id = sandbox.instance_id().to_owned();
    let running = {
        let sandbox = Arc::clone(&sandbox);
        tokio::spawn(async move {
            sandbox
                .exec(
                    ExecRequest::new(Command::argv(["sleep", "30"]))
                        .timeout(Duration::from_secs(60)),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let removed = docker(["rm", "-f", &id]).await;
    assert_eq!(removed.status, bounded_process::ExitKind::Exited(0));
    let error = running
        .await
        .unwrap()
        .expect_err("the container's death is not the command's exit code");
    assert!(
        matches!(error.kind(), ErrorKind::SandboxGone | ErrorKind::Engine),
        "{error}"
    );
    // A command that kills itself with a signal still reports its own status.
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let own = run(again.as_ref(), &["sh", "-c", "kill -9 $$"]).await;
    assert_eq!(own.exit_code, 137);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_that_gives_up_leaves_no_container_behind() {
    // An engine whose create answers only after the backend's deadline: the engine has made the
    // container, but the backend never hears its id.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("slow-engine.sock");
    let _proxy =
        support::DelayingProxy::start(&socket, "POST /containers/create", Duration::from_secs(8));
    let mut config = support::config(false).await;
    config.management_env = Some(vec![(
        "DOCKER_HOST".into(),
        format!("unix://{}", socket.display()).into(),
    )]);
    config.command_timeout = Duration::from_secs(4);
    let impatient = backend_docker::DockerBackend::connect(config)
        .await
        .unwrap();
    assert_eq!(
        impatient.endpoint(),
        format!("unix://{}", socket.display()),
        "the endpoint is pinned from DOCKER_HOST"
    );
    let scope = unique_scope("abandoned");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let error = impatient
        .acquire(&key, &spec(BUSYBOX))
        .await
        .expect_err("the create outlives its deadline");
    assert_eq!(error.kind(), ErrorKind::EngineTimeout, "{error}");
    // What the engine made under this create's mark is removed by a task of its own.
    let backend = backend(false).await;
    let until = Instant::now() + Duration::from_secs(30);
    while !backend.list(&scope, None).await.unwrap().is_empty() {
        assert!(
            Instant::now() < until,
            "the abandoned container was left behind"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

/// A command that kills the process running it (the call's init, or the wrapper waiting for it)
/// ends its call early with a signal status that is not its own: a `Retired` error (the
/// command's doing, not the engine's), never an exit code, and the sandbox is retired, so
/// nothing the command started keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_that_kills_its_init_is_an_error_and_leaves_nothing_running() {
    let backend = backend(false).await;
    let scope = unique_scope("init-kill");
    // The base image's calls run as the exec init, the command's parent; BusyBox's under the
    // engine's init (the grandparent) starting the wrapper's `sh` (the parent).
    let kill_parent = "sleep 902 & kill -9 $PPID; sleep 30";
    let kill_grandparent = "sleep 903 & read -r s </proc/$PPID/stat; s=${s##*) }; s=${s#* }; kill -KILL ${s%% *}; sleep 30";
    for (thread, image, line) in [
        ("t", BASE, kill_parent),
        ("u", BUSYBOX, kill_parent),
        ("u", BUSYBOX, kill_grandparent),
    ] {
        let key = SandboxKey::conversation(scope.as_str(), thread, "agent");
        let sandbox = backend.acquire(&key, &spec(image)).await.unwrap();
        let id = sandbox.instance_id().to_owned();
        let started = Instant::now();
        let result = sandbox
            .exec(
                ExecRequest::new(Command::argv(["sh", "-c", line])).timeout(Duration::from_secs(5)),
            )
            .await;
        let error = match result {
            Ok(output) => panic!(
                "{line}: read as the command's exit {} after {:?}",
                output.exit_code,
                started.elapsed()
            ),
            Err(error) => error,
        };
        assert_eq!(error.kind(), ErrorKind::Retired, "{line}: {error}");
        assert!(error.to_string().contains("retired"), "{error}");
        // The retired container is gone, and every process in it.
        let inspect = docker(["inspect", "--format", "{{.State.Status}}", &id]).await;
        assert_ne!(
            inspect.status,
            bounded_process::ExitKind::Exited(0),
            "{line}: the container remains: {}",
            String::from_utf8_lossy(&inspect.stdout)
        );
        let fresh = backend.acquire(&key, &spec(image)).await.unwrap();
        assert_ne!(fresh.instance_id(), id);
        assert_eq!(run(fresh.as_ref(), &["true"]).await.exit_code, 0);
    }
    assert_nothing_left(&backend, &scope, &["t".to_owned(), "u".to_owned()]).await;
}

/// A command that reads its call's nonce (every argv in the container is readable), writes the
/// status record its wrapper would have written, and then kills its init cannot make that death
/// pass for its own signal: the exit is still the wrapper's failure and the sandbox is retired,
/// ending what the command left running.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_status_record_does_not_hide_a_killed_init() {
    let backend = backend(false).await;
    let scope = unique_scope("init-forge");
    let forge = r#"n=$(tr '\0' '\n' </proc/$PPID/cmdline | grep -m1 -xE '[0-9a-f]{24}')
printf 137 >"/tmp/maf-sbx-$n.status""#;
    let kill_parent = format!("{forge}\nsleep 905 & kill -9 $PPID; sleep 30");
    let kill_grandparent = format!(
        "{forge}\nsleep 906 & read -r s </proc/$PPID/stat; s=${{s##*) }}; s=${{s#* }}; kill -KILL ${{s%% *}}; sleep 30"
    );
    for (thread, image, line) in [("t", BASE, &kill_parent), ("u", BUSYBOX, &kill_grandparent)] {
        let key = SandboxKey::conversation(scope.as_str(), thread, "agent");
        let sandbox = backend.acquire(&key, &spec(image)).await.unwrap();
        let id = sandbox.instance_id().to_owned();
        let result = sandbox
            .exec(
                ExecRequest::new(Command::argv(["sh", "-c", line])).timeout(Duration::from_secs(5)),
            )
            .await;
        let error = match result {
            Ok(output) => panic!(
                "{image}: the forged record passed: read as the command's exit {} ({})",
                output.exit_code,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(error) => error,
        };
        assert_eq!(error.kind(), ErrorKind::Retired, "{image}: {error}");
        assert!(error.to_string().contains("retired"), "{error}");
        let inspect = docker(["inspect", "--format", "{{.State.Status}}", &id]).await;
        assert_ne!(
            inspect.status,
            bounded_process::ExitKind::Exited(0),
            "{image}: the container remains: {}",
            String::from_utf8_lossy(&inspect.stdout)
        );
    }
    assert_nothing_left(&backend, &scope, &["t".to_owned(), "u".to_owned()]).await;
}

/// A command's own exit statuses, 255 and every signal-shaped one among them, read as its
/// exits in both init shapes, and the record is gone after each.
#[tokio::test(flavor = "multi_thread")]
async fn every_status_a_command_ends_with_reads_as_its_own() {
    let backend = backend(false).await;
    let scope = unique_scope("init-status");
    for (thread, image) in [("t", BASE), ("u", BUSYBOX)] {
        let key = SandboxKey::conversation(scope.as_str(), thread, "agent");
        let sandbox = backend.acquire(&key, &spec(image)).await.unwrap();
        for (line, status) in [
            ("exit 255", 255),
            ("exit 254", 254),
            ("exit 130", 130),
            ("exit 128", 128),
            ("exit 137", 137),
            ("exit 192", 192),
            ("exit 193", 193),
            ("kill -TERM $$", 143),
            ("kill -KILL $$", 137),
        ] {
            let output = run(sandbox.as_ref(), &["sh", "-c", line]).await;
            assert_eq!(output.exit_code, status, "{image}: {line}");
        }
        let left = run(
            sandbox.as_ref(),
            &["sh", "-c", "ls /tmp | grep -c status$ || true"],
        )
        .await;
        assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0", "{image}");
    }
    assert_nothing_left(&backend, &scope, &["t".to_owned(), "u".to_owned()]).await;
}

/// A call in an image that carries the exec init runs as it (the command's parent), and the
/// command starts with no signal ignored or blocked (a glibc `posix_spawn` would leave two
/// ignored); an image without it runs the wrapper's `sh` under the engine's init.
#[tokio::test(flavor = "multi_thread")]
async fn calls_run_as_the_exec_init_where_the_image_carries_it() {
    let backend = backend(false).await;
    let scope = unique_scope("exec-init");
    let report =
        "tr '\\0' ' ' </proc/$PPID/cmdline; echo; grep -E '^Sig(Ign|Blk):' /proc/self/status";
    for (thread, image, parent) in [
        (
            "t",
            BASE,
            format!("{} ", exec_wrapper::wrapper::EXEC_INIT_PATH),
        ),
        ("u", BUSYBOX, "sh -c ".to_owned()),
    ] {
        let key = SandboxKey::conversation(scope.as_str(), thread, "agent");
        let sandbox = backend.acquire(&key, &spec(image)).await.unwrap();
        let output = run(sandbox.as_ref(), &["sh", "-c", report]).await;
        assert_eq!(output.exit_code, 0, "{image}: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(text.starts_with(&parent), "{image}: {text}");
        // (BusyBox's `sh` leaves SIGQUIT ignored in what it runs; the init leaves nothing.)
        if image == BASE {
            for line in ["SigIgn:\t0000000000000000", "SigBlk:\t0000000000000000"] {
                assert!(text.contains(line), "{image}: {text}");
            }
        }
    }
    assert_nothing_left(&backend, &scope, &["t".to_owned(), "u".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_group_is_killed_and_the_container_kept() {
    let backend = backend(false).await;
    let scope = unique_scope("timeout");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let started = Instant::now();
    let error = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "echo $$ > group.pgid; sleep 3131 & sleep 3132 & sleep 3133; wait",
            ]))
            .timeout(Duration::from_secs(1)),
        )
        .await
        .expect_err("the command outlives its bound");
    assert_eq!(error.kind(), ErrorKind::Timeout);
    assert_eq!(error.guest_cleanup(), Some(GuestCleanup::Killed), "{error}");
    assert!(started.elapsed() < Duration::from_secs(16));
    // No member of the group survives, and the container is the same one.
    let survivors = run(
        sandbox.as_ref(),
        &[
            "sh",
            "-c",
            "p=$(cat group.pgid); kill -0 -\"$p\" 2>/dev/null; echo $?",
        ],
    )
    .await;
    assert_eq!(survivors.stdout_text().trim(), "1", "{survivors:?}");
    let sleeps = run(
        sandbox.as_ref(),
        &[
            "sh",
            "-c",
            "ps -o args 2>/dev/null | grep -c '[s]leep 313' || true",
        ],
    )
    .await;
    assert_eq!(sleeps.stdout_text().trim(), "0");
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(again.instance_id(), sandbox.instance_id());
    assert!(!again.freshly_created());
    assert_eq!(run(again.as_ref(), &["true"]).await.exit_code, 0);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_without_the_wrapper_tools_is_refused_naming_them() {
    let backend = backend(false).await;
    let scope = unique_scope("notools");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let error = backend.acquire(&key, &spec(NOTOOLS)).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("base64") && message.contains("setsid"),
        "{message}"
    );
    assert!(message.contains(NOTOOLS), "{message}");
    // The container this acquire created was removed with the refusal.
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_acquire_list_find_and_dispose_read_the_engine() {
    let backend = backend(false).await;
    let scope = unique_scope("lifecycle");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let call_key = key.clone().with_call("call-1");
    let first = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let call = backend.acquire(&call_key, &spec(BUSYBOX)).await.unwrap();
    assert_ne!(first.instance_id(), call.instance_id());

    // A warm acquire is the same instance; changing the image or the base is refused.
    let warm_started = Instant::now();
    let warm = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    println!("warm acquire took {:?}", warm_started.elapsed());
    assert_eq!(warm.instance_id(), first.instance_id());
    assert!(first.freshly_created() && !warm.freshly_created());
    let other_image = backend.acquire(&key, &spec(BASE)).await.unwrap_err();
    assert_eq!(other_image.kind(), ErrorKind::SpecMismatch, "{other_image}");
    let other_base = SandboxSpec::builder("live")
        .image(BUSYBOX)
        .work_dir(Some("/srv/elsewhere"))
        .build()
        .unwrap();
    let error = backend.acquire(&key, &other_base).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::SpecMismatch, "{error}");

    // Another process's backend (a second connect) sees the same sandboxes through the labels.
    let other = support::backend(false).await;
    let listed = other.list(&scope, None).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed
        .windows(2)
        .all(|w| w[0].instance_id < w[1].instance_id));
    for summary in &listed {
        assert_eq!(summary.state, SandboxState::Running);
        assert_eq!(summary.kind.as_deref(), Some("live"));
        assert!(summary.created.is_some());
    }
    let keys: Vec<SandboxKey> = listed.iter().filter_map(|s| s.key.clone()).collect();
    assert!(keys.contains(&key) && keys.contains(&call_key), "{keys:?}");
    let found = other.find(&key, "live").await.unwrap().expect("found");
    assert_eq!(found.instance_id(), first.instance_id());
    assert!(!found.freshly_created());
    assert_eq!(found.storage_base(), "/maf-sandbox/work");
    assert!(other.find(&key, "another-kind").await.unwrap().is_none());

    // A stale or foreign instance id selects nothing; the right one goes, the sibling stays.
    assert!(other
        .dispose(
            &call_key,
            DisposeSelector::instance("live", first.instance_id())
        )
        .await
        .is_none());
    assert_eq!(other.list(&scope, None).await.unwrap().len(), 2);
    // An id that is not the engine's hex is nobody's instance, never a docker option.
    for bogus in ["--help", "-f", "", "zz", "../x"] {
        assert!(other
            .dispose(&key, DisposeSelector::instance("live", bogus))
            .await
            .is_none());
    }
    assert_eq!(other.list(&scope, None).await.unwrap().len(), 2);
    assert!(other
        .dispose(&call_key, DisposeSelector::all())
        .await
        .is_none());
    let left = other.list(&scope, Some("t")).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].instance_id, first.instance_id());
    assert!(other.find(&call_key, "live").await.unwrap().is_none());
    let error = call
        .exec(ExecRequest::new(Command::argv(["true"])))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::SandboxGone);

    let purge = backend.dispose_scope(&scope, "t").await;
    assert_eq!(purge.disposed, 1);
    assert!(purge.undisposed.is_none());
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

/// Every host process's command line, and the environment of this process and of every docker
/// client (there should be none), as bytes.
fn host_exposures() -> Vec<(u32, &'static str, Vec<u8>)> {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue; // the process ended meanwhile
        };
        let is_docker_client = cmdline
            .split(|b| *b == 0)
            .next()
            .is_some_and(|argv0| argv0 == b"docker" || argv0.ends_with(b"/docker"));
        if is_docker_client || pid == std::process::id() {
            if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
                seen.push((pid, "environ", environ));
            }
        }
        seen.push((pid, "cmdline", cmdline));
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_env_value_never_appears_in_any_argv_nor_the_client_environment() {
    use base64::Engine as _;
    let backend = backend(false).await;
    let scope = unique_scope("argv-hygiene");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let value = format!("value-{}-{}", std::process::id(), unique_scope("v"));
    let encodings = [
        value.clone().into_bytes(),
        base64::engine::general_purpose::STANDARD
            .encode(&value)
            .into_bytes(),
        base64::engine::general_purpose::URL_SAFE
            .encode(&value)
            .into_bytes(),
    ];
    let running = {
        let sandbox = Arc::clone(&sandbox);
        let env = ExecEnv::default().set("PAYLOAD", value.as_str());
        tokio::spawn(async move {
            sandbox
                .exec(
                    ExecRequest::new(Command::argv(["sh", "-c", "sleep 4; test -n \"$PAYLOAD\""]))
                        .env(env)
                        .timeout(Duration::from_secs(30)),
                )
                .await
        })
    };
    let mut scans = 0;
    let mut saw_the_client = false;
    while !running.is_finished() {
        for (pid, what, bytes) in host_exposures() {
            saw_the_client |= what == "environ";
            for needle in &encodings {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle.as_slice()),
                    "the guest value is visible in /proc/{pid}/{what}"
                );
            }
        }
        scans += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let output = running.await.unwrap().unwrap();
    assert_eq!(output.exit_code, 0, "the guest got the value");
    assert!(
        scans >= 10,
        "the scan ran while the command did ({scans} scans)"
    );
    assert!(saw_the_client, "this process's environment was scanned");
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guest_env_travels_in_the_exec_request_verbatim() {
    let backend = backend(false).await;
    let scope = unique_scope("env");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let env = ExecEnv::default()
        .set("GREETING", "hello  world =x")
        .set("EMPTY", "")
        .set("MULTI", "a\nb")
        .set("DOCKER_HOST", "tcp://192.0.2.1:2375");
    let output = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "printf '%s|%s|%s|%s|%s' \"$GREETING\" \"${EMPTY-unset}\" \"${HOSTNAME_UNSET-none}\" \"$MULTI\" \"$DOCKER_HOST\"",
            ]))
            .env(env),
        )
        .await
        .unwrap();
    // No client reads the environment any more: every value reaches the guest as given.
    assert_eq!(
        output.stdout_text(),
        "hello  world =x||none|a\nb|tcp://192.0.2.1:2375"
    );
    let env = ExecEnv::default().set("BINARY", b"\xff\xfe".as_slice());
    let error = sandbox
        .exec(ExecRequest::new(Command::argv(["true"])).env(env))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("BINARY"), "{error}");
    // A relative working directory that escapes the base is refused; a missing one is exit 125.
    let escape = sandbox
        .exec(ExecRequest::new(Command::argv(["pwd"])).working_directory("../elsewhere"))
        .await
        .unwrap_err();
    assert_eq!(escape.kind(), ErrorKind::Confinement);
    let missing = sandbox
        .exec(ExecRequest::new(Command::argv(["pwd"])).working_directory("no/such/dir"))
        .await
        .unwrap();
    assert_eq!(missing.exit_code, 125);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_absent_image_is_image_missing_naming_the_build() {
    let backend = backend(false).await;
    let scope = unique_scope("noimage");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let error = backend
        // A registry on a local address where nothing listens: the pull fails without leaving the host.
        .acquire(
            &key,
            &spec("127.0.0.1:9/maf-sandbox-absent-image:never-built"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ImageMissing, "{error}");
    let message = error.to_string();
    assert!(message.contains("cargo xtask images"), "{message}");
    assert!(
        message.contains("127.0.0.1:9/maf-sandbox-absent-image:never-built"),
        "{message}"
    );
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_that_does_not_land_retires_the_sandbox() {
    let backend = backend(false).await;
    let scope = unique_scope("retire");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BASE_ROOT)).await.unwrap();
    let old = sandbox.instance_id().to_owned();
    // The command (root in its container) removes every shell, so the kill call cannot start:
    // a kill that cannot prove it landed.
    let error = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "sleep 0.2; rm -f /bin/sh /usr/bin/sh /bin/dash /usr/bin/dash /bin/bash /usr/bin/bash; sleep 30",
            ]))
            .timeout(Duration::from_secs(1)),
        )
        .await
        .expect_err("the command outlives its bound");
    assert_eq!(error.kind(), ErrorKind::Timeout);
    assert_eq!(
        error.guest_cleanup(),
        Some(GuestCleanup::Retired),
        "{error}"
    );
    // Every handle to the retired instance refuses; the engine no longer has it.
    let refused = sandbox
        .exec(ExecRequest::new(Command::argv(["true"])))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Retired, "{refused}");
    let inspect = docker(["container", "inspect", &old]).await;
    assert_ne!(inspect.status, bounded_process::ExitKind::Exited(0));
    let replacement = backend.acquire(&key, &spec(BASE_ROOT)).await.unwrap();
    assert_ne!(replacement.instance_id(), old);
    assert!(replacement.freshly_created());
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_paths_with_spaces_are_absent_never_engine_failures() {
    let backend = backend(false).await;
    let scope = unique_scope("spaced");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    // The engine quotes a missing path verbatim, spaces included: still absence.
    assert!(sandbox
        .stat_file("no such dir/file.txt", ".")
        .await
        .unwrap()
        .is_none());
    let missing = sandbox
        .read_file("no such dir/file.txt", ".", 1024)
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    sandbox
        .write_file("new dir/with space.txt", b"spaced\n", ".")
        .await
        .unwrap();
    assert_eq!(
        sandbox
            .read_file("new dir/with space.txt", ".", 1024)
            .await
            .unwrap(),
        b"spaced\n"
    );
    sandbox.remove("gone dir/x", ".", false).await.unwrap();
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

/// A write larger than one body slice is streamed: every byte lands (a size that is no whole
/// number of slices or tar blocks), under missing parents whose names, like the file's, need GNU
/// long names, all owned by the guest with the archive's modes; a second write replaces it; the
/// refusals still come before any data moves.
#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_write_lands_every_byte_owned_by_the_guest() {
    use sha2::Digest as _;
    let backend = backend(false).await;
    let scope = unique_scope("streamed-write");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BASE)).await.unwrap();
    let ids = run(sandbox.as_ref(), &["sh", "-c", "echo $(id -u):$(id -g)"]).await;
    let owner = ids.stdout_text().trim().to_owned();
    let work = sandbox.storage_base().to_owned();
    let outer = "o".repeat(120);
    let inner = format!("{outer}/{}", "i".repeat(110));
    let file = format!("{inner}/{}.bin", "f".repeat(150));
    let first = conformance::fixtures::incompressible_bytes(5 * 1024 * 1024 + 333, 7);
    sandbox.write_file(&file, &first, ".").await.unwrap();
    let hash = |bytes: &[u8]| format!("{:x}", sha2::Sha256::digest(bytes));
    let described = run(
        sandbox.as_ref(),
        &[
            "sh",
            "-c",
            r#"cd "$1" && stat -c '%u:%g %a %F' "$2" "$3" && stat -c '%u:%g %a %s' "$4" && sha256sum <"$4""#,
            "sh",
            &work,
            &outer,
            &inner,
            &file,
        ],
    )
    .await;
    assert_eq!(
        described.stdout_text(),
        format!(
            "{owner} 755 directory\n{owner} 755 directory\n{owner} 644 {}\n{}  -\n",
            first.len(),
            hash(&first)
        ),
        "{described:?}"
    );
    let second = conformance::fixtures::incompressible_bytes(3 * 1024 * 1024 + 1, 11);
    sandbox.write_file(&file, &second, ".").await.unwrap();
    assert!(sandbox.read_file(&file, ".", 1 << 26).await.unwrap() == second);

    // Refused before any data moves, whatever the size.
    let onto_directory = sandbox.write_file(&inner, &first, ".").await.unwrap_err();
    assert_eq!(
        onto_directory.kind(),
        ErrorKind::IsADirectory,
        "{onto_directory}"
    );
    run(
        sandbox.as_ref(),
        &["ln", "-s", "/tmp/elsewhere", &format!("{work}/link")],
    )
    .await;
    let onto_link = sandbox.write_file("link", &first, ".").await.unwrap_err();
    assert_eq!(onto_link.kind(), ErrorKind::Confinement, "{onto_link}");
    let through_link = sandbox
        .write_file("link/f.bin", &first, ".")
        .await
        .unwrap_err();
    assert_eq!(
        through_link.kind(),
        ErrorKind::Confinement,
        "{through_link}"
    );
    let outside = sandbox
        .write_file("../outside.bin", &first, ".")
        .await
        .unwrap_err();
    assert_eq!(outside.kind(), ErrorKind::Confinement, "{outside}");
    let over = sandbox
        .write_file("over.bin", &vec![0; 64 * 1024 * 1024 + 1], ".")
        .await
        .unwrap_err();
    assert_eq!(over.kind(), ErrorKind::TransferCapExceeded, "{over}");
    // Nothing landed: the base holds the first write's tree and the link, the link's target and
    // the path outside were never made.
    let left = run(
        sandbox.as_ref(),
        &[
            "sh",
            "-c",
            r#"ls -A "$1"; test -e /tmp/elsewhere || echo no-target; test -e "$1/../outside.bin" || echo no-outside"#,
            "sh",
            &work,
        ],
    )
    .await;
    assert_eq!(
        left.stdout_text(),
        format!("link\n{outer}\nno-target\nno-outside\n"),
        "{left:?}"
    );
    drop(sandbox);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_reads_leave_no_wrapper_files_in_the_guest() {
    let backend = backend(false).await;
    let scope = unique_scope("read-residue");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    sandbox
        .write_file("dir/inside.txt", b"x", ".")
        .await
        .unwrap();
    for _ in 0..8 {
        let missing = sandbox
            .read_file("absent.txt", ".", 1024)
            .await
            .unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
        let directory = sandbox.read_file("dir", ".", 1024).await.unwrap_err();
        assert_eq!(directory.kind(), ErrorKind::IsADirectory, "{directory}");
    }
    // Give any straggling guest command time to end, then look for pid or cancel files other
    // than this command's own pid file (which records its group, `$$`).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let residue = run(
        sandbox.as_ref(),
        &[
            "sh",
            "-c",
            "n=0; for f in /tmp/maf-sbx-*; do [ -e \"$f\" ] || continue; \
             [ \"$(cat \"$f\")\" = \"$$\" ] || { echo \"$f\" >&2; n=$((n + 1)); }; done; echo $n",
        ],
    )
    .await;
    assert_eq!(residue.stdout_text().trim(), "0", "{residue:?}");
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_get_two_cpus_and_two_gib_and_an_oom_kill_says_so() {
    let backend = backend(false).await;
    let scope = unique_scope("resources");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let inspect = docker([
        "container",
        "inspect",
        "--format",
        "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.PidsLimit}}",
        sandbox.instance_id(),
    ])
    .await;
    let (cpus, memory) = backend.sandbox_resources().await;
    let expected = format!("{} {memory} {memory} 512", (cpus * 1e9).round() as i64);
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), expected);
    // This machine's engine host has at least 2 CPUs and 2 GiB, so nothing is clamped here.
    assert_eq!((cpus, memory), (2.0, 2 << 30));
    drop(sandbox);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;

    // A guest over a small limit is killed by the kernel, and the error names the limit.
    let mut config = support::config(false).await;
    config.memory_bytes = 32 << 20;
    let small = backend_docker::DockerBackend::connect(config)
        .await
        .unwrap();
    let key = SandboxKey::conversation(scope.as_str(), "small", "agent");
    let sandbox = small.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let error = sandbox
        .exec(
            // One process allocates: with a pipeline, a second allocator can call the OOM
            // killer again before the first victim's memory is freed, and the kernel then
            // picks the container's init, which stops the container (seen under load).
            ExecRequest::new(Command::argv([
                "dd",
                "if=/dev/zero",
                "of=/dev/null",
                "bs=200M",
                "count=1",
            ]))
            .timeout(Duration::from_secs(60)),
        )
        .await
        .expect_err("the allocation outgrows the limit");
    assert_eq!(error.kind(), ErrorKind::Engine, "{error}");
    assert!(
        error.to_string().contains("memory limit of 32 MiB"),
        "{error}"
    );
    // The sandbox stays usable, and a later kill of the command's own is its exit code again.
    let own = run(sandbox.as_ref(), &["sh", "-c", "kill -9 $$"]).await;
    assert_eq!(own.exit_code, 137);
    drop(sandbox);
    assert_nothing_left(&small, &scope, &["small".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unusable_working_directory_is_125_not_started_with_the_reason() {
    let backend = backend(false).await;
    let scope = unique_scope("nocwd");
    for (thread, image) in [("base", BASE), ("busybox", BUSYBOX)] {
        let key = SandboxKey::conversation(scope.as_str(), thread, "agent");
        let sandbox = backend.acquire(&key, &spec(image)).await.unwrap();
        let made = run(&*sandbox, &["sh", "-c", "printf x > plain"]).await;
        assert_eq!(made.exit_code, 0, "{image}: {}", made.stderr_text());
        for workdir in ["/no/such/dir", "gone", "plain"] {
            let output = sandbox
                .exec(
                    ExecRequest::new(Command::argv(["touch", "/tmp/ran"]))
                        .working_directory(workdir)
                        .timeout(Duration::from_secs(30)),
                )
                .await
                .expect("a missing working directory is a result, not an error");
            assert_eq!(output.exit_code, 125, "{image} {workdir}");
            let reason = output.not_started.as_deref().unwrap_or_else(|| {
                panic!("{image} {workdir}: not reported as not started: {output:?}")
            });
            assert!(reason.contains(workdir), "{image} {workdir}: {reason:?}");
            assert!(output.stdout.is_empty() && output.stderr.is_empty());
        }
        assert_eq!(
            run(&*sandbox, &["test", "-e", "/tmp/ran"]).await.exit_code,
            1
        );
        // The command's own 125, with a `cd` message, is the command's.
        let own = run(&*sandbox, &["sh", "-c", "echo 'cd: /x' >&2; exit 125"]).await;
        assert_eq!((own.exit_code, own.not_started), (125, None), "{image}");
    }
    assert_nothing_left(&backend, &scope, &["base".to_owned(), "busybox".to_owned()]).await;
}

/// `find` trusts the tool probe its container passed when it was created; a tool lost since
/// then is still refused by name, once a wrapper call fails for want of it.
#[tokio::test(flavor = "multi_thread")]
async fn a_found_container_that_lost_a_tool_is_refused_naming_it() {
    let scope = unique_scope("lost-tool");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let creator = backend(false).await;
    let sandbox = creator.acquire(&key, &spec(BASE_ROOT)).await.unwrap();
    let removed = run(&*sandbox, &["rm", "/usr/bin/base64"]).await;
    assert_eq!(removed.exit_code, 0, "{}", removed.stderr_text());
    // Another process: nothing of the creator's memory.
    let other = backend(false).await;
    let found = other.find(&key, "live").await.unwrap().expect("found");
    // A UTF-8 argv travels raw and needs no base64.
    assert_eq!(run(&*found, &["true"]).await.exit_code, 0);
    let error = found
        .exec(ExecRequest::new(Command::argv([
            b"echo".as_slice(),
            b"\xff",
        ])))
        .await
        .expect_err("the wrapper cannot decode without base64");
    assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
    assert!(error.to_string().contains("base64"), "{error}");
    assert_nothing_left(&creator, &scope, &["t".to_owned()]).await;
}

/// A docker call from the test that must succeed; its stdout.
async fn docker_ok(args: &[&str]) -> String {
    let output = docker(args).await;
    assert_eq!(
        output.status,
        bounded_process::ExitKind::Exited(0),
        "docker {args:?}: {output:?}"
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A sandbox of a fresh scope whose container the test paused behind the backend, as an operator
/// does, or a process on an earlier version of this backend while it wrote the storage base.
struct PausedSandbox {
    backend: DockerBackend,
    scope: String,
    key: SandboxKey,
    sandbox: Arc<dyn Sandbox>,
    id: String,
}

impl PausedSandbox {
    async fn new(tag: &str) -> PausedSandbox {
        let backend = backend(false).await;
        let scope = unique_scope(tag);
        let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
        let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
        let id = sandbox.instance_id().to_owned();
        docker_ok(&["pause", &id]).await;
        PausedSandbox {
            backend,
            scope,
            key,
            sandbox,
            id,
        }
    }

    async fn assert_nothing_left(&self) {
        assert_nothing_left(&self.backend, &self.scope, &["t".to_owned()]).await;
    }
}

/// Someone else holds the container paused (an operator, or an earlier version's acquire writing
/// the storage base): a command that meets that pause starts once it is lifted, never failing
/// with "paused".
#[tokio::test(flavor = "multi_thread")]
async fn a_command_meeting_another_callers_pause_starts_after_it() {
    let paused = PausedSandbox::new("paused-exec").await;
    let holder = {
        let id = paused.id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            docker_ok(&["unpause", &id]).await
        })
    };
    let output = paused
        .sandbox
        .exec(ExecRequest::new(Command::argv(["echo", "after"])).timeout(Duration::from_secs(30)))
        .await
        .expect("the command waits out the pause");
    assert_eq!(
        (output.exit_code, output.stdout_text()),
        (0, "after\n".into())
    );
    // The holder's own unpause succeeded: nobody lifted the pause for it.
    holder.await.unwrap();
    paused.assert_nothing_left().await;
}

/// An acquire that finds its container paused leaves the pause to its holder (another process
/// writing the storage base, which unpauses it itself) and serves the same container after it.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_finding_its_container_paused_leaves_the_pause_to_its_holder() {
    let paused = PausedSandbox::new("paused-acquire").await;
    // A second backend stands for a second process: it shares nothing but the engine.
    let other = Arc::new(support::backend(false).await);
    let acquire = {
        let (other, key) = (Arc::clone(&other), paused.key.clone());
        tokio::spawn(async move { other.acquire(&key, &spec(BUSYBOX)).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = docker_ok(&["inspect", "-f", "{{.State.Status}}", &paused.id]).await;
    assert_eq!(
        status, "paused",
        "the acquire lifted another caller's pause"
    );
    docker_ok(&["unpause", &paused.id]).await;
    let again = acquire
        .await
        .unwrap()
        .expect("the acquire serves after the pause");
    assert_eq!(again.instance_id(), paused.id);
    assert_eq!(run(again.as_ref(), &["true"]).await.exit_code, 0);
    paused.assert_nothing_left().await;
}

/// A refusal for a pause that ends before the backend looks: the exec's create meets the pause,
/// the pause is lifted while the engine's 409 is on its way, and the wait then finds the
/// container running. The command starts then, as after any lifted pause (CI once failed
/// `concurrent-acquires-yield-one` with "the container stayed paused" in exactly this order;
/// a proxy holding back the create's answer makes it happen every time).
#[tokio::test(flavor = "multi_thread")]
async fn a_pause_lifted_before_its_refusal_arrives_still_lets_the_command_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("late-refusal.sock");
    let _proxy =
        support::DelayingProxy::start(&socket, "/exec HTTP/1.1", Duration::from_millis(1500));
    let mut config = support::config(false).await;
    config.management_env = Some(vec![(
        "DOCKER_HOST".into(),
        format!("unix://{}", socket.display()).into(),
    )]);
    let late = DockerBackend::connect(config).await.unwrap();
    let scope = unique_scope("late-refusal");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = late.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let id = sandbox.instance_id().to_owned();
    docker_ok(&["pause", &id]).await;
    let holder = {
        let id = id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            docker_ok(&["unpause", &id]).await
        })
    };
    let output = sandbox
        .exec(ExecRequest::new(Command::argv(["echo", "after"])).timeout(Duration::from_secs(30)))
        .await
        .expect("the command starts once the container runs");
    assert_eq!(
        (output.exit_code, output.stdout_text()),
        (0, "after\n".into())
    );
    holder.await.unwrap();
    assert_nothing_left(&late, &scope, &["t".to_owned()]).await;
}

/// A command whose deadline passes while it waits out a pause never started: its timeout says
/// so, nothing is killed, and the sandbox is kept, not retired.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_passed_waiting_out_a_pause_never_started_and_keeps_the_sandbox() {
    let paused = PausedSandbox::new("paused-deadline").await;
    let error = paused
        .sandbox
        .exec(ExecRequest::new(Command::argv(["true"])).timeout(Duration::from_secs(1)))
        .await
        .expect_err("the pause outlasts the deadline");
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert_eq!(
        error.guest_cleanup(),
        Some(GuestCleanup::NeverStarted),
        "{error}"
    );
    docker_ok(&["unpause", &paused.id]).await;
    assert_eq!(run(paused.sandbox.as_ref(), &["true"]).await.exit_code, 0);
    paused.assert_nothing_left().await;
}

/// Commands of another caller keep starting in a container whose storage base an acquire writes
/// engine-side: round after round the guest (`agent`) removes the base's last directory and
/// makes its parent read-only, so its own `mkdir -p` fails; a backend without a warm entry
/// acquires the key again while the first keeps running `true` in a loop, and both must go on.
/// An engine freeze here (the pause the write once ran under) can catch an exec half-started,
/// which leaves the engine holding the container until the host thaws it by hand: every later
/// call on it, and its removal, hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_side_base_write_lets_other_callers_commands_start() {
    let first = backend(false).await;
    let scope = unique_scope("base-under-execs");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = first.acquire(&key, &spec(BASE)).await.unwrap();
    let id = sandbox.instance_id().to_owned();
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Four callers' commands in flight at once, so a start is under way most of the time.
    let commands: Vec<_> = (0..4)
        .map(|_| {
            let (sandbox, running) = (Arc::clone(&sandbox), Arc::clone(&running));
            tokio::spawn(async move {
                let mut ran = 0u32;
                while running.load(std::sync::atomic::Ordering::Relaxed) {
                    let output = sandbox
                        .exec(
                            // In `/`: the base comes and goes under these commands.
                            ExecRequest::new(Command::argv(["true"]))
                                .working_directory("/")
                                .timeout(Duration::from_secs(30)),
                        )
                        .await
                        .expect("another caller's command runs while the base is written");
                    assert_eq!(output.exit_code, 0);
                    ran += 1;
                }
                ran
            })
        })
        .collect();
    // Past the adopt budget below: the container is found, so its guest's call comes first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for round in 0..10 {
        docker_ok(&[
            "exec",
            &id,
            "sh",
            "-c",
            "rmdir /maf-sandbox/work && chmod 555 /maf-sandbox",
        ])
        .await;
        let mut config = support::config(false).await;
        config.command_timeout = Duration::from_secs(2);
        let second = DockerBackend::connect(config).await.unwrap();
        let again =
            tokio::time::timeout(Duration::from_secs(60), second.acquire(&key, &spec(BASE)))
                .await
                .unwrap_or_else(|_| panic!("round {round}: the acquire hung"))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(again.instance_id(), id);
        let made = docker_ok(&["exec", &id, "stat", "-c", "%U %a", "/maf-sandbox/work"]).await;
        assert_eq!(made, "agent 755", "round {round}");
        docker_ok(&["exec", &id, "chmod", "755", "/maf-sandbox"]).await;
    }
    running.store(false, std::sync::atomic::Ordering::Relaxed);
    for loop_of_commands in commands {
        let ran = tokio::time::timeout(Duration::from_secs(60), loop_of_commands)
            .await
            .expect("the commands end")
            .unwrap();
        assert!(ran > 0);
    }
    assert_nothing_left(&first, &scope, &["t".to_owned()]).await;
}
