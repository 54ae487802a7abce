//! A newcomer's first run on QEMU, by the commands `docs/qemu-backend.md` gives and nothing else:
//! with an empty user cache and state directory, `run` fails naming the command that builds the
//! image; `sandboxctl images build vm` builds it (the static agent too, from this checkout);
//! then `run` prints the command's output and exits with its code, and nothing of the sandbox is
//! left in the state directory.
//!
//! The user's directories are a fresh one under `/tmp` (`XDG_CACHE_HOME` and `XDG_STATE_HOME`
//! point into it; `HOME` stays, so cargo finds its toolchain), removed at the end. Its root
//! archive cache is seeded from the one `cargo xtask images vm` keeps in the target directory,
//! so the Debian root is not bootstrapped again (the build says it used the cached root).
#![cfg(target_os = "linux")]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind, RunOutput};

/// The `sandboxctl` of this build: beside the `deps` directory this test runs from (cargo
/// gives a binary's path only to its own package's tests; `cargo xtask e2e vms` builds it in the
/// same run).
fn sandboxctl_binary() -> PathBuf {
    let profile = std::env::current_exe()
        .ok()
        .and_then(|test| Some(test.parent()?.parent()?.to_path_buf()))
        .expect("the test runs from <target>/<profile>/deps");
    let binary = profile.join("sandboxctl");
    assert!(
        binary.is_file(),
        "{} is missing: build it first (`cargo build -p sandboxctl`), or run `cargo xtask e2e vms`",
        binary.display()
    );
    binary
}

/// The image build: a cargo build of the agent (a no-op after `cargo xtask images vm`), the
/// kernel, the initramfs and `mkfs.ext4` of the root.
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// A run under emulation on a loaded host: the accelerator probe's boots, then the VM's.
const RUN_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The backend flags of a host where only QEMU's emulator runs, as the docs give them.
const QEMU: [&str; 5] = [
    "--backend",
    "qemu",
    "--allow-emulation",
    "--min-isolation",
    "container",
];

/// What the newcomer runs.
const COMMAND: [&str; 4] = ["--", "sh", "-c", "echo hello; exit 3"];

/// The variables passed on from this process: what finds cargo and its toolchain.
const PASSED: [&str; 6] = [
    "PATH",
    "HOME",
    "CARGO",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

/// The user's fresh directories.
struct User {
    home: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        let home = tempfile::Builder::new()
            .prefix("sandboxctl-first-run-")
            .tempdir_in("/tmp")
            .unwrap();
        User { home }
    }

    fn cache(&self) -> PathBuf {
        self.home.path().join("cache")
    }

    fn state(&self) -> PathBuf {
        self.home.path().join("state")
    }

    /// The backend's state directory under the user's.
    fn qemu_state(&self) -> PathBuf {
        self.state().join("sandboxes").join("qemu")
    }

    fn env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = PASSED
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|value| ((*name).into(), value)))
            .collect();
        env.push(("XDG_CACHE_HOME".into(), self.cache().into()));
        env.push(("XDG_STATE_HOME".into(), self.state().into()));
        env
    }

    /// `sandboxctl ARGS`, its stderr relayed as it comes.
    async fn sandboxctl(&self, args: &[&str], within: Duration) -> RunOutput {
        eprintln!("$ sandboxctl {}", args.join(" "));
        BoundedCommand::new(sandboxctl_binary(), within)
            .args(args)
            .envs(self.env())
            .current_dir(self.home.path())
            .output_budget(4 * 1024 * 1024)
            .on_line(|_, line| {
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line);
            })
            .run()
            .await
            .expect("sandboxctl runs within its bound")
    }
}

impl Drop for User {
    /// A test that failed midway leaves no QEMU of its own running (QEMU outlives sandboxctl
    /// in a session of its own); the directories go with the `TempDir`.
    fn drop(&mut self) {
        for qemu in qemu_vm::qemus_under(self.home.path()) {
            if let Some(pid) = rustix::process::Pid::from_raw(qemu.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// The Debian root archive `cargo xtask images vm` cached in this build's target directory (the
/// Python root, which the VM image is made from).
fn cached_root_archive() -> PathBuf {
    let binary = sandboxctl_binary();
    let target = binary
        .parent()
        .and_then(Path::parent)
        .expect("sandboxctl lives in <target>/<profile>");
    let cache = target.join("images-cache");
    std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("debian-") && name.contains("-python-"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no Python root archive in {} (run `cargo xtask images vm` first)",
                cache.display()
            )
        })
}

/// The state directory holds no VM, record, socket or overlay, and no QEMU under the user's
/// directories runs: only the accelerator's cache and the probe's parent (dot-names) and the
/// empty `vms` may remain.
fn assert_nothing_left(user: &User) {
    let running = qemu_vm::qemus_under(user.home.path());
    assert!(running.is_empty(), "QEMU left running: {running:?}");
    let state = user.qemu_state();
    let mut left = Vec::new();
    for dir in [state.clone(), state.join("vms")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || (dir == state && name == "vms") {
                continue;
            }
            left.push(entry.path().display().to_string());
        }
    }
    assert!(left.is_empty(), "left in the state directory: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_nothing_to_a_command_by_the_documented_commands() {
    let user = User::new();
    let roots = user.cache().join("sandboxes").join("roots");
    std::fs::create_dir_all(&roots).unwrap();
    let archive = cached_root_archive();
    let seeded = roots.join(archive.file_name().unwrap());
    if std::fs::hard_link(&archive, &seeded).is_err() {
        std::fs::copy(&archive, &seeded).unwrap();
    }

    // No image: the run fails before anything boots, naming the command that fixes it.
    let run: Vec<&str> = QEMU
        .iter()
        .chain(["run"].iter())
        .chain(COMMAND.iter())
        .copied()
        .collect();
    let missing = user.sandboxctl(&run, RUN_TIMEOUT).await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_ne!(missing.status, ExitKind::Exited(0), "{stderr}");
    assert_ne!(missing.status, ExitKind::Exited(3), "{stderr}");
    assert!(missing.stdout.is_empty(), "{:?}", missing.stdout);
    assert!(
        stderr.contains("`sandboxctl images build vm`"),
        "the error names the fix: {stderr}"
    );
    assert!(
        stderr.contains(
            &user
                .cache()
                .join("sandboxes")
                .join("vm-image")
                .display()
                .to_string()
        ),
        "the error names where the image was looked for: {stderr}"
    );

    // The fix, as named.
    let built = user
        .sandboxctl(&["images", "build", "vm"], BUILD_TIMEOUT)
        .await;
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert_eq!(built.status, ExitKind::Exited(0), "{stderr}");
    assert!(
        stderr.contains("using cached root"),
        "the Debian root came from the seeded cache: {stderr}"
    );
    let image_dir = user.cache().join("sandboxes").join("vm-image");
    assert!(
        image_dir.join(qemu_vm::MANIFEST).is_file(),
        "the image is where the hosts look: {}",
        image_dir.display()
    );

    // The run now prints the command's output and passes its exit code through.
    let ran = user.sandboxctl(&run, RUN_TIMEOUT).await;
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status, ExitKind::Exited(3), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout),
        "hello\n",
        "stderr: {stderr}"
    );

    // A kept sandbox, forked and reset by the documented commands: the fork holds the file,
    // the reset one does not, and no acquire fell back to a boot (the machine's baseline, which
    // a fork's save also needs, was made).
    let with_key = |rest: &[&'static str]| -> Vec<&'static str> {
        QEMU.iter().chain(rest.iter()).copied().collect()
    };
    let kept = user
        .sandboxctl(
            &with_key(&[
                "run",
                "--key",
                "first/a/x",
                "--",
                "sh",
                "-c",
                "echo kept > f",
            ]),
            RUN_TIMEOUT,
        )
        .await;
    let stderr = String::from_utf8_lossy(&kept.stderr);
    assert_eq!(kept.status, ExitKind::Exited(0), "{stderr}");
    let forked = user
        .sandboxctl(
            &with_key(&["fork", "--key", "first/a/x", "--to", "first/b/x"]),
            RUN_TIMEOUT,
        )
        .await;
    let stderr = String::from_utf8_lossy(&forked.stderr);
    assert_eq!(forked.status, ExitKind::Exited(0), "{stderr}");
    let seen = user
        .sandboxctl(
            &with_key(&["exec", "--key", "first/b/x", "--", "cat", "f"]),
            RUN_TIMEOUT,
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "kept\n", "{seen:?}");
    let reset = user
        .sandboxctl(&with_key(&["reset", "--key", "first/a/x"]), RUN_TIMEOUT)
        .await;
    assert_eq!(reset.status, ExitKind::Exited(0), "{reset:?}");
    let gone = user
        .sandboxctl(
            &with_key(&[
                "exec",
                "--key",
                "first/a/x",
                "--",
                "sh",
                "-c",
                "test -e f; echo $?",
            ]),
            RUN_TIMEOUT,
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&gone.stdout), "1\n", "{gone:?}");
    for thread in ["a", "b"] {
        let purged = user
            .sandboxctl(
                &with_key(&["purge", "--scope", "first", "--thread", thread]),
                RUN_TIMEOUT,
            )
            .await;
        assert_eq!(purged.status, ExitKind::Exited(0), "{purged:?}");
    }
    let baselines = std::fs::read_dir(user.qemu_state().join(".snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|image| {
            std::fs::read_dir(image.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|entry| entry.path().join("snapshot.json").is_file())
        .count();
    assert_eq!(baselines, 1, "the machine's baseline was made");

    assert_nothing_left(&user);
    let home = user.home.path().to_owned();
    drop(user);
    assert!(!home.exists(), "{} removed", home.display());
}
