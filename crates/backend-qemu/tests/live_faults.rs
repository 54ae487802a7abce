//! Faults under the backend, against real QEMU (under TCG here): QEMU killed behind it, a guest
//! agent that stops answering, a guest kernel panic, a full host disk under the VM's overlay,
//! and new guests that never start their first command. Each is a typed error within a bound,
//! never a hang or an exit code; the VM is retired or replaced by the next acquire; and nothing
//! is left (no QEMU, socket, overlay or record).

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend_qemu::QemuBackend;
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, GuestCleanup, Sandbox, SandboxBackend,
    SandboxError, SandboxKey, SandboxSpec,
};
use support::{
    alive, assert_nothing_left, connect, connect_with, qemu_pid, qemus_under, run_parent, step,
    vm_dir, wait_gone,
};

/// One step's bound: a TCG boot under load takes tens of seconds.
const STEP: Duration = Duration::from_secs(240);

/// The call timeout of the wedged-agent test's backend.
const FILE_CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn key(thread: &str) -> SandboxKey {
    SandboxKey::conversation(format!("faults-{}", std::process::id()), thread, "agent")
}

fn spec() -> SandboxSpec {
    SandboxSpec::builder("shell").build().unwrap()
}

fn sh(script: &str) -> ExecRequest {
    ExecRequest::new(Command::argv(["/bin/sh", "-c", script]))
}

async fn acquire(backend: &QemuBackend, key: &SandboxKey) -> Arc<dyn Sandbox> {
    let sandbox = step("acquire", STEP, backend.acquire(key, &spec()))
        .await
        .expect("acquire");
    let out = step("a first exec", STEP, sandbox.exec(sh("echo ready")))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"ready\n");
    sandbox
}

/// Runs `checks` in a task of its own (so a failed one still lets the cleanup run), then
/// disposes of the key and asserts the state directory holds nothing and no QEMU of it runs.
async fn with_cleanup<F>(backend: &QemuBackend, key: &SandboxKey, state_dir: &Path, checks: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(checks).await;
    let disposed = step(
        "dispose",
        STEP,
        backend.dispose(key, DisposeSelector::all()),
    )
    .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert!(disposed.is_none(), "disposal: {disposed:?}");
    assert_nothing_left(state_dir);
}

/// The acquire after a fault replaces the VM: a fresh instance that serves, the old one's
/// directory gone, one QEMU left under the state directory, and it is the new VM's.
async fn replaced(backend: &QemuBackend, key: &SandboxKey, state_dir: &Path, old: &str) {
    let again = acquire(backend, key).await;
    assert!(again.freshly_created(), "the next acquire creates a VM");
    assert_ne!(again.instance_id(), old, "a new instance");
    assert!(
        !vm_dir(state_dir, old).exists(),
        "the old VM's directory is gone"
    );
    let running = qemus_under(state_dir);
    assert_eq!(
        running,
        vec![qemu_pid(state_dir, again.instance_id())],
        "one QEMU runs, the new VM's"
    );
}

fn expect_kind<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, SandboxError>,
    kinds: &[ErrorKind],
) -> SandboxError {
    match result {
        Err(error) if kinds.contains(&error.kind()) => {
            eprintln!("{what}: {:?}: {error}", error.kind());
            error
        }
        Err(error) => panic!(
            "{what}: expected one of {kinds:?}, got {:?}: {error}",
            error.kind()
        ),
        Ok(value) => panic!("{what}: expected one of {kinds:?}, got {value:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_killed_behind_the_backend_is_gone_and_the_next_acquire_replaces_it() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    let key = key("killed");
    let (b, k, s) = (backend.clone(), key.clone(), state_dir.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let sandbox = acquire(&b, &k).await;
        let old = sandbox.instance_id().to_owned();
        let pid = qemu_pid(&s, &old);
        support::kill(pid);
        assert!(wait_gone(pid, Duration::from_secs(10)).await, "QEMU ends");

        let started = Instant::now();
        let exec = step("exec on the killed VM", STEP, sandbox.exec(sh("true"))).await;
        expect_kind("exec", exec, &[ErrorKind::SandboxGone]);
        let read = step(
            "a read on the killed VM",
            STEP,
            sandbox.read_file("x", ".", 1024),
        )
        .await;
        expect_kind("read_file", read, &[ErrorKind::SandboxGone]);
        assert!(started.elapsed() < Duration::from_secs(30), "failed fast");
        assert!(
            step("find", STEP, b.find(&k, "shell"))
                .await
                .unwrap()
                .is_none(),
            "find names no VM whose QEMU is gone"
        );
        replaced(&b, &k, &s, &old).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_agent_is_a_timeout_that_retires_the_vm() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    // A file call's deadline is the backend's call timeout, whatever the driver's own.
    let mut config = support::config(&state_dir);
    config.call_timeout = FILE_CALL_TIMEOUT;
    let backend = connect_with(config).await;
    let key = key("wedged");
    let (b, k, s) = (backend.clone(), key.clone(), state_dir.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let sandbox = acquire(&b, &k).await;
        let old = sandbox.instance_id().to_owned();
        let pid = qemu_pid(&s, &old);
        // The command's parent is the agent's server: stopped, it answers nothing more, while
        // the guest and QEMU run on.
        let bound = Duration::from_secs(5);
        let started = Instant::now();
        let wedged = step(
            "an exec that stops the agent",
            STEP,
            sandbox.exec(sh("kill -STOP $PPID; sleep 1").timeout(bound)),
        )
        .await;
        let error = expect_kind("exec", wedged, &[ErrorKind::Timeout]);
        let elapsed = started.elapsed();
        // The guest-side kill never reports: the host gives up after the bound and a grace.
        assert!(
            elapsed < bound + Duration::from_secs(30),
            "the typed error came after {elapsed:?}"
        );
        assert_eq!(
            error.guest_cleanup(),
            Some(GuestCleanup::Retired),
            "the kill was never confirmed, so the VM is retired: {error}"
        );
        assert!(
            wait_gone(pid, Duration::from_secs(20)).await,
            "the retired VM's QEMU is ended"
        );
        let later = step("a later exec", STEP, sandbox.exec(sh("true"))).await;
        expect_kind("a later exec", later, &[ErrorKind::Retired]);
        let listed = b.list(&k.scope, Some(&k.thread_id)).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].state, sandbox_core::SandboxState::Retired);
        replaced(&b, &k, &s, &old).await;

        // A file call to a silent agent: its own deadline (the backend's call timeout), then
        // the same retirement.
        let sandbox = step("acquire the replacement", STEP, b.acquire(&k, &spec()))
            .await
            .unwrap();
        let old = sandbox.instance_id().to_owned();
        let pid = qemu_pid(&s, &old);
        // Its stream is held (a dropped one would kill the command first), and its bound is
        // long, so the file call's deadline is what ends the VM.
        let stream = step(
            "a streamed exec that stops the agent",
            STEP,
            sandbox.exec_stream(
                sh("kill -STOP $PPID; sleep 1").timeout(Duration::from_secs(600)),
                sandbox_core::ExecStdin::Closed,
            ),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        let stat = step(
            "a stat on the silent agent",
            STEP,
            sandbox.stat_file("x", "."),
        )
        .await;
        expect_kind("stat_file", stat, &[ErrorKind::EngineTimeout]);
        let elapsed = started.elapsed();
        assert!(
            elapsed >= FILE_CALL_TIMEOUT && elapsed < FILE_CALL_TIMEOUT + Duration::from_secs(15),
            "the typed error came after {elapsed:?}, the call timeout being {FILE_CALL_TIMEOUT:?}"
        );
        assert!(
            wait_gone(pid, Duration::from_secs(20)).await,
            "the retired VM's QEMU is ended"
        );
        let later = step("a later read", STEP, sandbox.read_file("x", ".", 16)).await;
        expect_kind("a later read", later, &[ErrorKind::Retired]);
        drop(stream);
        replaced(&b, &k, &s, &old).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_kernel_panic_ends_qemu_and_is_a_typed_error() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    let key = key("panic");
    let (b, k, s) = (backend.clone(), key.clone(), state_dir.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let sandbox = acquire(&b, &k).await;
        let old = sandbox.instance_id().to_owned();
        let pid = qemu_pid(&s, &old);
        let started = Instant::now();
        // As root in the guest: the kernel panics; `panic=-1` reboots at once, which QEMU's
        // `-no-reboot` turns into its exit.
        let panicked = step(
            "an exec that panics the kernel",
            STEP,
            sandbox.exec(
                sh("echo c > /proc/sysrq-trigger; sleep 60").timeout(Duration::from_secs(90)),
            ),
        )
        .await;
        expect_kind("exec", panicked, &[ErrorKind::SandboxGone]);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the typed error came after {:?}",
            started.elapsed()
        );
        assert!(wait_gone(pid, Duration::from_secs(10)).await, "QEMU exited");
        assert!(!alive(pid));
        replaced(&b, &k, &s, &old).await;
    })
    .await;
}

/// A tmpfs of `size` mounted on `dir` for the test's life (the test runs as root, as CI does).
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a {size} tmpfs on {} needs root",
            dir.display()
        );
        SmallDisk {
            dir: dir.to_owned(),
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_host_disk_under_the_overlay_is_a_typed_error_and_leaves_nothing() {
    let parent = tempfile::tempdir_in(run_parent()).unwrap();
    let disk = SmallDisk::mount(&parent.path().join("disk"), "48m");
    let state_dir = disk.dir.join("state");
    let backend = connect_with(support::config(&state_dir)).await;
    let key = key("full-disk");
    let (b, k, s) = (backend.clone(), key.clone(), state_dir.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let sandbox = acquire(&b, &k).await;
        let old = sandbox.instance_id().to_owned();
        let started = Instant::now();
        // 128 MiB written through to the disk: QEMU's overlay outgrows the 48 MiB tmpfs.
        let filled = step(
            "an exec that fills the host disk",
            STEP,
            sandbox.exec(
                sh("dd if=/dev/zero of=/fill bs=1M count=128 conv=fsync 2>&1")
                    .timeout(Duration::from_secs(180)),
            ),
        )
        .await;
        let error = expect_kind("exec", filled, &[ErrorKind::Engine]);
        assert!(
            error.to_string().contains("disk"),
            "the error names the host disk: {error}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the typed error came after {:?}",
            started.elapsed()
        );
        replaced(&b, &k, &s, &old).await;
    })
    .await;
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_guests_first_exec_has_a_bound_of_its_own_not_one_calls() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    // No call could meet this deadline under emulation; the storage base's `mkdir`, the new
    // guest's first exec, has a bound of its own instead.
    let mut config = support::config(&state_dir);
    config.call_timeout = Duration::from_millis(1);
    let backend = connect_with(config).await;
    let key = key("first-exec");
    let (b, k) = (backend.clone(), key.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let sandbox = step("acquire", STEP, b.acquire(&k, &spec()))
            .await
            .expect("the acquire makes its storage base within its own bound");
        assert!(sandbox.freshly_created());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_vm_that_never_starts_its_first_command_is_replaced_once_then_a_typed_error() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    // Every guest's agent takes exec requests and never starts them; the first command's
    // bound is a quarter of the boot's.
    let mut config = support::config(&state_dir);
    config.boot_timeout = Duration::from_secs(60);
    config.kernel_args = vec!["vm_agent.mode=silent-exec".to_owned()];
    let patience = Duration::from_secs(15);
    let backend = connect_with(config).await;
    let key = key("silent-exec");
    let (b, k, s) = (backend.clone(), key.clone(), state_dir.clone());
    with_cleanup(&backend, &key, &state_dir, async move {
        let started = Instant::now();
        let acquired = step("acquire", STEP, b.acquire(&k, &spec())).await;
        let elapsed = started.elapsed();
        let error = expect_kind("acquire", acquired, &[ErrorKind::EngineTimeout]);
        let text = error.to_string();
        assert!(
            text.contains("two VMs in turn"),
            "the error says a second VM was tried: {text}"
        );
        // Two boots and two waits of the first command's bound, never a call timeout's.
        assert!(
            elapsed >= patience * 2,
            "each VM was given the first command's bound: {elapsed:?}"
        );
        assert!(
            elapsed < (Duration::from_secs(60) + patience) * 2,
            "the typed error came after {elapsed:?}"
        );
        assert!(qemus_under(&s).is_empty(), "no QEMU of either VM runs");
        assert!(
            b.list(&k.scope, Some(&k.thread_id))
                .await
                .unwrap()
                .is_empty(),
            "no record is left"
        );
    })
    .await;
}
