//! One test per simulator fault switch: each proves the typed error, and that nothing another
//! process owns was deleted (a bystander sandbox, made by a backend of its own before the fault,
//! still answers with its file intact afterwards). Every test ends by disposing of what it made
//! and checking that nothing is left: no container, no simulator record, no workspace directory.
//! Also here: idle stop and rebind, retirement seen by another process, disposal from another
//! process, and a working directory the wrapper cannot enter.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_sbx::SbxBackend;
use sandbox_core::{
    Command, DisposalCode, DisposeSelector, ErrorKind, ExecRequest, GuestCleanup, Sandbox,
    SandboxBackend, SandboxError, SandboxKey, SandboxSpec, SandboxState,
};
use support::{dispose_all, text, unique_scope, SimHost};

const BYSTANDER_FILE: &str = "bystander.txt";
const BYSTANDER_BYTES: &[u8] = b"owned by another process\n";

fn spec() -> SandboxSpec {
    SandboxSpec::builder("faults").build().unwrap()
}

fn key(scope: &str, thread: &str) -> SandboxKey {
    SandboxKey::conversation(scope, thread, "agent")
}

/// A sandbox made by a backend of its own (standing in for another process), with a file.
struct Bystander {
    backend: SbxBackend,
    key: SandboxKey,
    sandbox: Arc<dyn Sandbox>,
}

impl Bystander {
    async fn new(host: &SimHost, scope: &str) -> Bystander {
        let backend = host.backend().await;
        let key = key(scope, "bystander");
        let sandbox = backend.acquire(&key, &spec()).await.expect("the bystander");
        sandbox
            .write_file(BYSTANDER_FILE, BYSTANDER_BYTES, ".")
            .await
            .unwrap();
        Bystander {
            backend,
            key,
            sandbox,
        }
    }

    /// Still there: it answers a command that reads its file through the guest.
    async fn assert_intact(&self) {
        let out = self
            .sandbox
            .exec(ExecRequest::new(Command::argv(["cat", BYSTANDER_FILE])))
            .await
            .expect("the bystander answers");
        assert_eq!(out.exit_code, 0, "{}", out.stderr_text());
        assert_eq!(out.stdout, BYSTANDER_BYTES);
        let again = self.backend.acquire(&self.key, &spec()).await.unwrap();
        assert_eq!(again.instance_id(), self.sandbox.instance_id());
        assert!(!again.freshly_created());
    }
}

fn assert_kind(
    result: Result<impl std::fmt::Debug, SandboxError>,
    kind: ErrorKind,
) -> SandboxError {
    match result {
        Ok(value) => panic!("expected {kind:?}, got {value:?}"),
        Err(error) => {
            assert_eq!(error.kind(), kind, "{error}");
            error
        }
    }
}

async fn finish(host: &SimHost, backend: &SbxBackend, scope: &str) {
    host.fault_clear().await;
    dispose_all(backend, scope).await;
    host.assert_nothing_left().await;
}

async fn exec_echo(sandbox: &Arc<dyn Sandbox>) -> Result<sandbox_core::ExecOutput, SandboxError> {
    sandbox
        .exec(ExecRequest::new(Command::argv(["echo", "hi"])).timeout(Duration::from_secs(20)))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_login_is_login_required_from_every_entry_point() {
    let host = SimHost::new();
    let scope = unique_scope("login");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    host.fault_set("login-lapsed").await;
    let error = assert_kind(
        backend.acquire(&key(&scope, "new"), &spec()).await,
        ErrorKind::LoginRequired,
    );
    assert!(error.to_string().contains("sbx login"), "{error}");
    assert_kind(
        exec_echo(&bystander.sandbox).await,
        ErrorKind::LoginRequired,
    );
    assert_kind(backend.list(&scope, None).await, ErrorKind::LoginRequired);
    let failure = backend
        .dispose(&bystander.key, DisposeSelector::all())
        .await
        .expect("a disposal under a lapsed login does not land");
    assert_ne!(failure.code, DisposalCode::Unknown, "{failure}");
    host.fault_clear().await;
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_fault_is_typed_and_disposal_reports_unreachable_or_unlisted() {
    let host = SimHost::new();
    let scope = unique_scope("daemon");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    host.fault_set("daemon-fault").await;
    let error = assert_kind(
        backend.acquire(&key(&scope, "new"), &spec()).await,
        ErrorKind::DaemonFault,
    );
    assert!(error.to_string().contains("sbx daemon restart"), "{error}");
    assert_kind(exec_echo(&bystander.sandbox).await, ErrorKind::DaemonFault);
    // A record on disk: the sandbox may exist, so its disposal is unreachable, never success.
    let failure = backend
        .dispose(&bystander.key, DisposeSelector::all())
        .await
        .expect("no disposal lands while the daemon faults");
    assert_eq!(failure.code, DisposalCode::Unreachable, "{failure}");
    // No record: the listing failed, so the sweep may be partial.
    let failure = backend
        .dispose(&key(&scope, "never-made"), DisposeSelector::all())
        .await
        .expect("an unlisted sweep is not success");
    assert_eq!(failure.code, DisposalCode::Unlisted, "{failure}");
    host.fault_clear().await;
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_engine_is_a_daemon_fault_and_never_a_gone_sandbox() {
    let host = SimHost::new();
    let scope = unique_scope("lost");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    host.fault_set("lost-engine").await;
    // `ls` lists nothing, but the record says it exists and it answers.
    let error = assert_kind(
        backend.acquire(&bystander.key, &spec()).await,
        ErrorKind::DaemonFault,
    );
    assert!(error.to_string().contains("sbx daemon restart"), "{error}");
    assert_kind(
        backend.find(&bystander.key, "faults").await,
        ErrorKind::DaemonFault,
    );
    let failure = backend
        .dispose(&bystander.key, DisposeSelector::all())
        .await
        .expect("a lost engine is not a disposed sandbox");
    assert_eq!(failure.code, DisposalCode::Unreachable, "{failure}");
    let by_instance = backend
        .dispose(
            &bystander.key,
            DisposeSelector::instance("faults", bystander.sandbox.instance_id()),
        )
        .await
        .expect("nor is it for one instance");
    assert_eq!(by_instance.code, DisposalCode::Unreachable, "{by_instance}");
    // A new sandbox cannot be created either.
    assert_kind(
        backend.acquire(&key(&scope, "new"), &spec()).await,
        ErrorKind::DaemonFault,
    );
    host.fault_clear().await;
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

async fn refused_by_the_host_check(fault: &str, fix: &str) {
    let host = SimHost::new();
    let scope = unique_scope("hostcheck");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    let before = host.containers().await.len();
    host.fault_set(fault).await;
    let error = assert_kind(
        backend.acquire(&key(&scope, "new"), &spec()).await,
        ErrorKind::HostNotConfined,
    );
    assert!(error.to_string().contains(fix), "{error}");
    // Refused before anything was made; the warm sandbox is refused too (every acquire checks).
    assert_eq!(host.containers().await.len(), before);
    assert_kind(
        backend.acquire(&bystander.key, &spec()).await,
        ErrorKind::HostNotConfined,
    );
    // The settings were read, never written.
    host.fault_clear().await;
    let forwarding = host
        .sim(["settings", "get", "ssh.agentForwardingEnabled"])
        .await;
    assert_eq!(text(&forwarding.stdout).trim(), "false");
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_forwarding_on_is_refused_naming_its_fix() {
    refused_by_the_host_check(
        "agent-forwarding",
        "sbx settings set ssh.agentForwardingEnabled false",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_mcp_server_is_refused_naming_its_fix() {
    refused_by_the_host_check("mcp-server", "sbx mcp rm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_socket_in_a_new_sandbox_is_refused_and_the_sandbox_discarded() {
    let host = SimHost::new();
    let scope = unique_scope("socket");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    for (thread, fault) in [("file", "agent-socket=file"), ("link", "agent-socket=link")] {
        host.fault_set(fault).await;
        let error = assert_kind(
            backend.acquire(&key(&scope, thread), &spec()).await,
            ErrorKind::HostNotConfined,
        );
        assert!(error.to_string().contains("sbx daemon restart"), "{error}");
        host.fault_clear().await;
        // The discard runs in a task of its own: give it a moment, then nothing of it is left.
        let name = backend.sandbox_name(&key(&scope, thread), "faults");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed = host.rows().await.iter().any(|r| r["name"] == name.as_str());
            let dir = host.root.path().join(&name).exists();
            if !listed && !dir {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the refused sandbox {name} was not discarded"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_exec_times_out_and_a_kill_that_cannot_land_retires_the_instance_everywhere() {
    let host = SimHost::new();
    let scope = unique_scope("hung");
    let bystander = Bystander::new(&host, &scope).await;
    let mut config = host.config();
    config.exec_cleanup_timeout = Duration::from_secs(3);
    let backend = SbxBackend::connect(config).await.unwrap();
    let target_key = key(&scope, "target");
    let sandbox = backend.acquire(&target_key, &spec()).await.unwrap();

    // Only this command hangs (matched by its argument as the wrapper carries it): the kill
    // finds no pid file, so the command never started and the sandbox is kept.
    let marker = exec_wrapper::encoding::encode_arg_plain(b"hung-marker", "marker").unwrap();
    host.fault_set(&format!("hung-exec={marker}")).await;
    let started = Instant::now();
    let error = assert_kind(
        sandbox
            .exec(
                ExecRequest::new(Command::argv(["echo", "hung-marker"]))
                    .timeout(Duration::from_secs(2)),
            )
            .await,
        ErrorKind::Timeout,
    );
    assert_eq!(
        error.guest_cleanup(),
        Some(GuestCleanup::NeverStarted),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(2 + 3 + 5));
    assert_eq!(exec_echo(&sandbox).await.unwrap().stdout, b"hi\n");

    // Every exec hangs, the kill too: the instance is retired, in this process and on disk.
    host.fault_set("hung-exec").await;
    let started = Instant::now();
    let error = assert_kind(
        sandbox
            .exec(ExecRequest::new(Command::argv(["sleep", "30"])).timeout(Duration::from_secs(2)))
            .await,
        ErrorKind::Timeout,
    );
    assert_eq!(
        error.guest_cleanup(),
        Some(GuestCleanup::Retired),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2 + 3 + 5),
        "{:?}",
        started.elapsed()
    );
    host.fault_clear().await;
    assert_kind(exec_echo(&sandbox).await, ErrorKind::Retired);
    assert_kind(sandbox.read_file("x", ".", 10).await, ErrorKind::Retired);
    let listed = backend.list(&scope, Some("target")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, SandboxState::Retired);

    // Another process (a backend of its own) reads the retirement from the record and replaces it.
    let other = host.backend().await;
    assert_kind(other.find(&target_key, "faults").await, ErrorKind::Retired);
    let replacement = other.acquire(&target_key, &spec()).await.unwrap();
    assert_ne!(replacement.instance_id(), sandbox.instance_id());
    assert!(replacement.freshly_created());
    assert_eq!(exec_echo(&replacement).await.unwrap().stdout, b"hi\n");

    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_create_past_its_deadline_is_discarded_by_the_watch() {
    let host = SimHost::new();
    let scope = unique_scope("slow");
    let bystander = Bystander::new(&host, &scope).await;
    let mut config = host.config();
    config.create_timeout = Duration::from_secs(1);
    let backend = SbxBackend::connect(config).await.unwrap();
    host.fault_set("slow-create=4").await;
    let started = Instant::now();
    assert_kind(
        backend.acquire(&key(&scope, "slow"), &spec()).await,
        ErrorKind::EngineTimeout,
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    host.fault_clear().await;
    // The daemon finishes the create after all; the watch (10 s) finds it and discards it.
    let name = backend.sandbox_name(&key(&scope, "slow"), "faults");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut appeared = false;
    loop {
        let listed = host.rows().await.iter().any(|r| r["name"] == name.as_str());
        appeared |= listed;
        if appeared && !listed && !host.root.path().join(&name).exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the late sandbox {name} was not discarded (appeared: {appeared})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_create_is_an_engine_timeout_and_its_workspace_is_kept_until_disposal() {
    let host = SimHost::new();
    let scope = unique_scope("hungcreate");
    let bystander = Bystander::new(&host, &scope).await;
    let mut config = host.config();
    config.create_timeout = Duration::from_secs(2);
    let backend = SbxBackend::connect(config).await.unwrap();
    host.fault_set("hung-create").await;
    let hung_key = key(&scope, "hung");
    let started = Instant::now();
    assert_kind(
        backend.acquire(&hung_key, &spec()).await,
        ErrorKind::EngineTimeout,
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // Nothing appears within the watch; the workspace stays for a create the daemon might finish.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let name = backend.sandbox_name(&hung_key, "faults");
    assert!(
        host.root.path().join(&name).is_dir(),
        "the workspace was kept"
    );
    host.fault_clear().await;
    // A disposal clears the leftovers (no sandbox was ever listed).
    assert!(backend
        .dispose(&hung_key, DisposeSelector::all())
        .await
        .is_none());
    assert!(!host.root.path().join(&name).exists());
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_listing_is_an_engine_failure_never_an_empty_one() {
    let host = SimHost::new();
    let scope = unique_scope("malformed");
    let bystander = Bystander::new(&host, &scope).await;
    let backend = host.backend().await;
    // The legacy keyed shape is understood.
    host.fault_set("ls-shape=keyed").await;
    bystander.assert_intact().await;
    host.fault_clear().await;
    host.fault_set("ls-malformed").await;
    assert_kind(
        backend.acquire(&bystander.key, &spec()).await,
        ErrorKind::Engine,
    );
    assert_kind(
        backend.acquire(&key(&scope, "new"), &spec()).await,
        ErrorKind::Engine,
    );
    assert_kind(backend.list(&scope, None).await, ErrorKind::Engine);
    assert_kind(
        backend.find(&bystander.key, "faults").await,
        ErrorKind::Engine,
    );
    // Nothing was created in its absence.
    assert!(!host
        .root
        .path()
        .join(backend.sandbox_name(&key(&scope, "new"), "faults"))
        .exists());
    host.fault_clear().await;
    bystander.assert_intact().await;
    finish(&host, &backend, &scope).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_stopped_sandbox_restarts_and_still_sees_its_workspace() {
    let host = SimHost::new();
    let scope = unique_scope("idle");
    let set = host
        .sim(["settings", "set", "sim.idleStopSeconds", "1"])
        .await;
    assert_eq!(
        set.status,
        bounded_process::ExitKind::Exited(0),
        "{}",
        text(&set.stderr)
    );
    let backend = host.backend().await;
    let idle_key = key(&scope, "idle");
    let sandbox = backend.acquire(&idle_key, &spec()).await.unwrap();
    sandbox.write_file("kept.txt", b"kept", ".").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = backend.list(&scope, Some("idle")).await.unwrap();
        if listed.first().map(|s| &s.state) == Some(&SandboxState::Stopped) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sandbox never stopped: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = sandbox
        .exec(ExecRequest::new(Command::argv(["cat", "kept.txt"])))
        .await
        .unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_slice()),
        (0, &b"kept"[..]),
        "{}",
        out.stderr_text()
    );
    // The handle from another process's acquire is the same instance.
    let other = host.backend().await;
    let again = other.acquire(&idle_key, &spec()).await.unwrap();
    assert_eq!(again.instance_id(), sandbox.instance_id());
    dispose_all(&backend, &scope).await;
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disposal_from_another_process_removes_everything() {
    let host = SimHost::new();
    let scope = unique_scope("elsewhere");
    let backend = host.backend().await;
    let one = backend.acquire(&key(&scope, "one"), &spec()).await.unwrap();
    let kept = backend.acquire(&key(&scope, "two"), &spec()).await.unwrap();
    let other = host.backend().await;
    // A stale instance id selects nothing; the right one disposes of that instance only.
    assert!(other
        .dispose(
            &key(&scope, "one"),
            DisposeSelector::instance("faults", "0123456789abcdef")
        )
        .await
        .is_none());
    assert_eq!(exec_echo(&one).await.unwrap().exit_code, 0);
    assert!(other
        .dispose(
            &key(&scope, "one"),
            DisposeSelector::instance("faults", one.instance_id())
        )
        .await
        .is_none());
    assert_kind(exec_echo(&one).await, ErrorKind::SandboxGone);
    assert_eq!(exec_echo(&kept).await.unwrap().exit_code, 0);
    let purge = other.dispose_scope(&scope, "two").await;
    assert_eq!(purge.disposed, 1, "{purge:?}");
    assert!(purge.undisposed.is_none());
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unusable_working_directory_is_125_not_started_with_the_reason() {
    let host = SimHost::new();
    let scope = unique_scope("nocwd");
    let backend = host.backend().await;
    let sandbox = backend.acquire(&key(&scope, "t"), &spec()).await.unwrap();
    sandbox.write_file("plain", b"x", ".").await.unwrap();
    let exec = |workdir: &str, argv: &[&str]| {
        sandbox.exec(
            ExecRequest::new(Command::argv(argv))
                .working_directory(workdir)
                .timeout(Duration::from_secs(20)),
        )
    };
    for workdir in ["/no/such/dir", "gone", "plain"] {
        let output = exec(workdir, &["touch", "/tmp/ran"])
            .await
            .expect("a missing working directory is a result, not an error");
        assert_eq!(output.exit_code, 125, "{workdir}");
        let reason = output
            .not_started
            .as_deref()
            .unwrap_or_else(|| panic!("{workdir}: not reported as not started: {output:?}"));
        assert!(reason.contains(workdir), "{workdir}: {reason:?}");
        assert!(output.stdout.is_empty() && output.stderr.is_empty());
    }
    let ran = exec(".", &["test", "-e", "/tmp/ran"]).await.unwrap();
    assert_eq!(
        ran.exit_code, 1,
        "a command in an unusable working directory ran"
    );
    // The command's own 125, with a `cd` message, is the command's.
    let own = exec(".", &["sh", "-c", "echo 'cd: /x' >&2; exit 125"])
        .await
        .unwrap();
    assert_eq!((own.exit_code, own.not_started), (125, None));
    finish(&host, &backend, &scope).await;
}

/// A command that kills its parent (`kill -9 $PPID`, the reviewed Docker hole) or its parent's
/// parent under the sbx wrapper's PID namespace: its call never reports the kill's status as the
/// command's own (the namespace's first process ignores a kill from inside, so the call runs to
/// its deadline and is killed there, or ends as an error), and nothing it started survives, seen
/// from the container's own PID namespace (a later call's namespace would not see them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_that_kills_its_parent_leaves_nothing_running() {
    let host = SimHost::new();
    let scope = unique_scope("parent-kill");
    let backend = host.backend().await;
    let sandbox = backend
        .acquire(&key(&scope, "t"), &spec())
        .await
        .expect("acquire");
    for line in [
        "sleep 904 & kill -9 $PPID; sleep 31",
        "sleep 904 & read -r s </proc/$PPID/stat; s=${s##*) }; s=${s#* }; g=${s%% *}; [ \"$g\" -gt 0 ] && kill -KILL $g; sleep 31",
    ] {
        let started = Instant::now();
        let result = sandbox
            .exec(ExecRequest::new(Command::argv(["sh", "-c", line])).timeout(Duration::from_secs(5)))
            .await;
        let ended = started.elapsed();
        println!("{line}: the call ended after {ended:?}: {result:?}");
        if let Ok(output) = &result {
            panic!(
                "{line}: read as the command's exit {} after {ended:?}",
                output.exit_code
            );
        }
        let found = support::docker([
            "ps",
            "-q",
            "--filter",
            &format!("label=sbx-sim.home={}", host.home_label()),
            "--filter",
            &format!("label=sbx-sim.id={}", sandbox.instance_id()),
        ])
        .await;
        let container = text(&found.stdout).trim().to_owned();
        if !container.is_empty() {
            let left = support::docker([
                "exec",
                &container,
                "sh",
                "-c",
                "for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline 2>/dev/null; echo; done | grep -c '^sleep \\(904\\|31\\) ' || true",
            ])
            .await;
            assert_eq!(
                text(&left.stdout).trim(),
                "0",
                "{line}: processes of the call survive ({result:?} after {ended:?})"
            );
        }
    }
    finish(&host, &backend, &scope).await;
}
