//! The backend under gVisor (docs/docker-backend.md#gvisor), against the real engine with
//! `runsc` registered: the rung is verified by a probe, never read off a runtime's name; the
//! guest sees gVisor's kernel; a runc container is never served in a gVisor sandbox's place;
//! a timed-out command's group is killed under it; and the memory and pids ceilings hold, by
//! ending the whole sandbox.
//!
//! Run by `cargo xtask e2e gvisor`, which sets `SANDBOX_E2E_DOCKER_RUNTIME=runsc` and needs the
//! engine to list `runsc` (gVisor) and `runsc-fake` (runc under a gVisor-like name), as `.ci/register-gvisor`
//! registers them. Without them every test here fails, naming what is missing.

mod support;

use std::time::{Duration, Instant};

use backend_docker::{DockerBackend, DockerConfig};
use sandbox_core::{
    Capability, Command, Egress, ErrorKind, ExecRequest, GuestCleanup, Isolation, Router,
    RouterConfig, Sandbox, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{assert_nothing_left, docker, unique_scope, BASE, BUSYBOX};

/// The runc runtime registered under a gVisor-like name.
const FAKE_RUNTIME: &str = "runsc-fake";

/// The gVisor runtime under test: the suite's variable, which must be set.
fn gvisor_runtime() -> String {
    support::runtime_under_test().unwrap_or_else(|| {
        panic!(
            "{} names no runtime: run this suite with `cargo xtask e2e gvisor`",
            support::RUNTIME_VARIABLE
        )
    })
}

async fn connect_under(runtime: &str, change: impl FnOnce(&mut DockerConfig)) -> DockerBackend {
    let mut config = support::config(false).await;
    config.runtime = Some(runtime.to_owned());
    change(&mut config);
    DockerBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("the backend connects under {runtime}: {e}"))
}

fn spec(image: &str) -> SandboxSpec {
    SandboxSpec::builder("gvisor").image(image).build().unwrap()
}

async fn run(sandbox: &dyn Sandbox, script: &str) -> sandbox_core::ExecOutput {
    sandbox
        .exec(
            ExecRequest::new(Command::argv(["sh", "-c", script])).timeout(Duration::from_secs(60)),
        )
        .await
        .expect("exec runs")
}

async fn engine_runtime(sandbox: &dyn Sandbox) -> String {
    let output = docker([
        "container",
        "inspect",
        "--format",
        "{{.HostConfig.Runtime}}",
        sandbox.instance_id(),
    ])
    .await;
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn runsc_is_verified_and_the_guest_runs_on_gvisors_kernel() {
    let runtime = gvisor_runtime();
    let backend = connect_under(&runtime, |_| {}).await;
    assert_eq!(backend.isolation(), Isolation::HardenedContainer);
    let verified = backend.runtime_verification().expect("a runtime verified");
    assert!(verified.gvisor, "{verified:?}");
    assert_eq!(verified.runtime, runtime);
    assert_eq!(verified.platform.as_deref(), Some("ptrace"), "{verified:?}");
    // Allowlist egress is not offered under gVisor.
    assert_eq!(
        backend.declarations().egress_modes,
        [Egress::Closed].into_iter().collect()
    );
    // A router serves a hardened_container floor with it, and refuses it a microvm floor.
    let floor = |rung| RouterConfig::default().min_isolation(rung);
    let shared: std::sync::Arc<dyn SandboxBackend> = std::sync::Arc::new(backend.clone());
    assert!(Router::new(vec![shared.clone()], floor(Isolation::HardenedContainer)).is_ok());
    assert!(Router::new(vec![shared.clone()], floor(Isolation::Microvm)).is_err());
    // gVisor's kernel makes no subreaper: exact kills are not declared, and a spec that
    // requires them is refused, never served with the group kill.
    assert!(!verified.subreaper, "{verified:?}");
    assert!(!backend.declarations().serves(Capability::ExactKill));
    let router = Router::new(vec![shared], floor(Isolation::HardenedContainer)).unwrap();
    let exact = SandboxSpec::builder("gvisor")
        .image(BASE)
        .require(Capability::ExactKill)
        .build()
        .unwrap();
    let scope = unique_scope("gvisor-exact");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let refused = router.acquire(&key, &exact).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        ErrorKind::CapabilityNotSupported,
        "{refused}"
    );

    let scope = unique_scope("gvisor-kernel");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BASE)).await.unwrap();
    assert_eq!(engine_runtime(sandbox.as_ref()).await, runtime);
    let seen = run(sandbox.as_ref(), "uname -r; dmesg | head -n 1").await;
    assert_eq!(seen.exit_code, 0, "{seen:?}");
    let text = seen.stdout_text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), verified.kernel_release.as_deref(), "{text}");
    assert!(
        lines.next().is_some_and(|l| l.contains("Starting gVisor")),
        "{text}"
    );
    drop(sandbox);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_named_like_gvisor_that_is_runc_stays_rung_container() {
    let backend = connect_under(FAKE_RUNTIME, |_| {}).await;
    assert_eq!(backend.isolation(), Isolation::Container);
    let verified = backend.runtime_verification().expect("a runtime probed");
    assert!(!verified.gvisor, "{verified:?}");
    assert_eq!(verified.path, "runc");
    // runc makes a subreaper: exact kills are declared, as without a runtime.
    assert!(verified.subreaper, "{verified:?}");
    assert!(backend.declarations().serves(Capability::ExactKill));
    let shared: std::sync::Arc<dyn SandboxBackend> = std::sync::Arc::new(backend.clone());
    let refused = Router::new(
        vec![shared],
        RouterConfig::default().min_isolation(Isolation::HardenedContainer),
    )
    .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotPermitted, "{refused}");
    // It still runs sandboxes, at its own rung, under the runtime it names.
    let scope = unique_scope("gvisor-fake");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(engine_runtime(sandbox.as_ref()).await, FAKE_RUNTIME);
    drop(sandbox);
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_the_engine_does_not_list_is_refused_naming_it() {
    let mut config = support::config(false).await;
    config.runtime = Some("runsc-never-registered".to_owned());
    let error = DockerBackend::connect(config).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    assert!(
        error.to_string().contains("runsc-never-registered"),
        "{error}"
    );
    assert!(error.to_string().contains("runc"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runc_container_under_the_name_is_never_served_as_gvisor() {
    let scope = unique_scope("gvisor-swap");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let mut runc_config = support::config(false).await;
    runc_config.runtime = None;
    let runc = DockerBackend::connect(runc_config).await.unwrap();
    let made = runc.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(engine_runtime(made.as_ref()).await, "runc");
    drop(made);
    let gvisor = connect_under(&gvisor_runtime(), |_| {}).await;
    let refused = gvisor.acquire(&key, &spec(BUSYBOX)).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::SpecMismatch, "{refused}");
    assert!(refused.to_string().contains("runtime"), "{refused}");
    let found = gvisor.find(&key, "gvisor").await.unwrap_err();
    assert_eq!(found.kind(), ErrorKind::SpecMismatch, "{found}");
    assert_nothing_left(&gvisor, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_group_is_killed_under_gvisor_and_the_sandbox_kept() {
    let backend = connect_under(&gvisor_runtime(), |_| {}).await;
    let subreaper = backend.runtime_verification().unwrap().subreaper;
    let scope = unique_scope("gvisor-kill");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    let started = Instant::now();
    let error = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "sh",
                "-c",
                // One member leaves the group for a session of its own: only a subreaper's kill
                // of the call's whole tree reaches it.
                "echo $$ > group.pgid; setsid sleep 3134 & sleep 3131 & sleep 3132 & sleep 3133; wait",
            ]))
            .timeout(Duration::from_secs(2)),
        )
        .await
        .expect_err("the command outlives its bound");
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert_eq!(error.guest_cleanup(), Some(GuestCleanup::Killed), "{error}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let survivors = run(
        sandbox.as_ref(),
        "p=$(cat group.pgid); kill -0 -\"$p\" 2>/dev/null; echo $?; \
         ps -eo args | grep -c '[s]leep 313[123]' || true; \
         ps -eo args | grep -c '[s]leep 3134' || true",
    )
    .await;
    // The group is gone; the member in a session of its own is gone too only where the
    // runtime's kernel makes a subreaper, and the backend declares exact kills only there
    // (docs/docker-backend.md#gvisor).
    assert_eq!(
        backend.declarations().serves(Capability::ExactKill),
        subreaper
    );
    let expected = if subreaper { "1\n0\n0\n" } else { "1\n0\n1\n" };
    assert_eq!(survivors.stdout_text(), expected, "{survivors:?}");
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(again.instance_id(), sandbox.instance_id());
    drop((sandbox, again));
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

/// Under gVisor a ceiling bounds the whole sandbox, gVisor's kernel included: reaching it ends
/// the sandbox (the host kernel's OOM killer or the pids limit stops gVisor's kernel), never the
/// one guest process. The call ends in an error, never an exit code (whatever status `runsc`
/// ended the exec with), and the next acquire serves the key again: the stopped container
/// started anew with its files, or a new one where the call retired it.
async fn a_ceiling_ends_the_sandbox(
    tag: &str,
    change: impl FnOnce(&mut DockerConfig),
    script: &str,
) {
    let backend = connect_under(&gvisor_runtime(), change).await;
    let scope = unique_scope(tag);
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(run(sandbox.as_ref(), "true").await.exit_code, 0);
    let started = Instant::now();
    let outcome = sandbox
        .exec(
            ExecRequest::new(Command::argv(["sh", "-c", script])).timeout(Duration::from_secs(30)),
        )
        .await;
    println!("{tag}: {outcome:?} after {:?}", started.elapsed());
    let error = outcome.expect_err("the ceiling ends the call in an error, never an exit code");
    println!("{tag}: {error}");
    let state = docker([
        "container",
        "inspect",
        "--format",
        "{{.State.Status}}",
        sandbox.instance_id(),
    ])
    .await;
    let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
    assert_ne!(state, "running", "{tag}: the sandbox outlived its ceiling");
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    if error.kind() == ErrorKind::Timeout {
        // The exec outlived gVisor's kernel and its kill could not land: retired, replaced.
        assert_ne!(again.instance_id(), sandbox.instance_id(), "{tag}");
    }
    assert_eq!(run(again.as_ref(), "true").await.exit_code, 0);
    drop((sandbox, again));
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

/// The statuses a dying gVisor sandbox ends an exec with (128 when `runsc` can no longer wait on
/// the process, 137 for a kill) are a command's own while the sandbox lives: they read as exit
/// codes, and the sandbox is kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_commands_own_death_shaped_status_is_its_exit_code_under_gvisor() {
    let backend = connect_under(&gvisor_runtime(), |_| {}).await;
    let scope = unique_scope("gvisor-statuses");
    let key = SandboxKey::conversation(scope.as_str(), "t", "agent");
    let sandbox = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    for (script, status) in [("exit 128", 128), ("kill -KILL $$", 137), ("exit 137", 137)] {
        assert_eq!(
            run(sandbox.as_ref(), script).await.exit_code,
            status,
            "{script}"
        );
    }
    let again = backend.acquire(&key, &spec(BUSYBOX)).await.unwrap();
    assert_eq!(again.instance_id(), sandbox.instance_id());
    drop((sandbox, again));
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_memory_ceiling_ends_the_sandbox_under_gvisor() {
    a_ceiling_ends_the_sandbox(
        "gvisor-memory",
        |config| config.memory_bytes = 128 << 20,
        "dd if=/dev/zero of=/dev/null bs=400M count=1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pids_ceiling_ends_the_sandbox_under_gvisor() {
    a_ceiling_ends_the_sandbox(
        "gvisor-pids",
        // gVisor's kernel holds about 60 host tasks of the limit itself.
        |config| config.pids_limit = 160,
        "n=0; while [ $n -lt 400 ]; do sleep 30 & n=$((n+1)); done; wait",
    )
    .await;
}
