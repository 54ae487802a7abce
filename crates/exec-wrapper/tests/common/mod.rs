//! Helpers shared by the integration tests: the three shells, each with a bin directory whose
//! `sh` (and, for BusyBox, `setsid`, `base64` and the other tools the scripts use) is that shell,
//! so the wrapper's inner shell and tools are the ones under test too.
#![allow(dead_code)]

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bounded_process::{BoundedCommand, Error, RunOutput};
use exec_wrapper::call::{cancel_file, pid_file};
use exec_wrapper::{new_nonce, Nonce};

/// A call's nonce, owning the files named after it that the scripts write under `/tmp` (the
/// group record, the cancel file, the status record). In a guest they live and die with the
/// sandbox; run on this host they would stay in its `/tmp`, so they are removed when the call
/// drops, whether the test passed or not. The scripts name them under `/tmp` whatever the
/// host's temporary directory is (a guest has no other), so a test cannot move them elsewhere.
pub struct HostCall(Nonce);

/// A fresh nonce whose `/tmp` files are removed when it drops.
pub fn host_call() -> HostCall {
    HostCall(new_nonce().expect("a nonce from the OS's random source"))
}

impl Deref for HostCall {
    type Target = Nonce;

    fn deref(&self) -> &Nonce {
        &self.0
    }
}

impl fmt::Display for HostCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Drop for HostCall {
    fn drop(&mut self) {
        let files = [
            pid_file(&self.0),
            cancel_file(&self.0),
            exec_wrapper::init::status_file(&self.0),
        ];
        for file in files {
            // Most calls leave nothing: a missing file is the usual case, not a failure.
            let _ = std::fs::remove_file(file);
        }
    }
}

/// One shell under test.
pub struct Shell {
    /// `dash`, `busybox` or `bash`.
    pub name: &'static str,
    /// The shell binary.
    pub program: PathBuf,
    /// Extra arguments before `-c` (`sh` for BusyBox).
    pub prefix: Vec<String>,
    /// Holds the bin directory.
    _bin: tempfile::TempDir,
    /// `PATH` for the child: the bin directory first.
    pub path: String,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn busybox() -> PathBuf {
    find_on_path("busybox")
        .or_else(|| Some(PathBuf::from("/bin/busybox")).filter(|p| p.is_file()))
        .unwrap_or_else(|| {
            panic!(
                "BusyBox is required: the wrapper and kill scripts must be checked under BusyBox sh. \
                 Install it with `apt-get install -y busybox-static` (found neither `busybox` on PATH \
                 nor /bin/busybox)"
            )
        })
}

fn required(name: &str) -> PathBuf {
    find_on_path(name).unwrap_or_else(|| panic!("`{name}` is required on PATH for these tests"))
}

fn link_all(bin: &Path, target: &Path, names: &[&str]) {
    for name in names {
        std::os::unix::fs::symlink(target, bin.join(name)).expect("symlink into the bin dir");
    }
}

/// dash, BusyBox `sh` and bash, each with its bin directory.
pub fn shells() -> Vec<Shell> {
    let mut shells = Vec::new();
    for name in ["dash", "busybox", "bash"] {
        let bin = tempfile::tempdir().expect("temp bin dir");
        let (program, prefix) = match name {
            "busybox" => {
                let busybox = busybox();
                link_all(
                    bin.path(),
                    &busybox,
                    &[
                        "sh", "setsid", "base64", "rm", "sleep", "cat", "printf", "mkdir",
                    ],
                );
                (busybox, vec!["sh".to_owned()])
            }
            other => {
                let program = required(other);
                link_all(bin.path(), &program, &["sh"]);
                (program, Vec::new())
            }
        };
        let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.path().display());
        shells.push(Shell {
            name,
            program,
            prefix,
            _bin: bin,
            path,
        });
    }
    shells
}

impl Shell {
    /// A bounded command running `argv` (which starts with `sh`) under this shell.
    pub fn command(&self, argv: &[String], timeout: Duration) -> BoundedCommand {
        assert_eq!(argv[0], "sh", "guest argv starts with sh");
        BoundedCommand::new(&self.program, timeout)
            .args(self.prefix.iter().cloned())
            .args(argv[1..].iter().cloned())
            .env("PATH", &self.path)
            .env("LANG", "C.UTF-8")
    }

    /// Runs `argv` (which starts with `sh`) under this shell.
    pub async fn run(&self, argv: &[String], timeout: Duration) -> Result<RunOutput, Error> {
        self.command(argv, timeout).run().await
    }
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Waits until `pid` is gone or a zombie, up to `within`.
pub async fn wait_dead(pid: i32, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    while alive(pid) {
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Reads a file of whitespace-separated pids, waiting up to 5 s until it holds `count` of them.
pub async fn read_pids(file: &Path, count: usize) -> Vec<i32> {
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() >= count && text.ends_with('\n') {
            return pids;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{} never held {count} pids: {text:?}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Makes the test process a child subreaper, so the orphans of a killed group are re-parented
/// here at once (this machine's PID 1 reaps them only after about 2 s).
pub fn become_subreaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .expect("PR_SET_CHILD_SUBREAPER");
    });
}

/// Reaps these pids once they are re-parented here, until each is gone (reaped here or by its
/// own parent) or 20 s pass.
pub fn reap_adopted(pids: Vec<i32>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        let mut pending = pids;
        while !pending.is_empty() && std::time::Instant::now() < end {
            pending.retain(|&pid| {
                let Some(target) = rustix::process::Pid::from_raw(pid) else {
                    return false;
                };
                match rustix::process::waitpid(Some(target), rustix::process::WaitOptions::NOHANG) {
                    Ok(Some(_)) => false,
                    Ok(None) => true,
                    // Not (yet) our child: wait while it exists under its own parent.
                    Err(_) => Path::new(&format!("/proc/{pid}")).exists(),
                }
            });
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// Asserts the wrapper reported that it could not enter `cwd`: the command never started, and the
/// reason is the shell's own message, which names the directory.
pub fn assert_not_started(shell: &str, outcome: &exec_wrapper::WrapperOutcome, cwd: &str) {
    match outcome {
        exec_wrapper::WrapperOutcome::NoWorkingDirectory { reason } => {
            assert!(reason.contains(cwd), "{shell}: {reason:?} names {cwd}");
            assert!(!reason.contains('\n'), "{shell}: one message: {reason:?}");
        }
        other => panic!("{shell}: a missing working directory read as {other:?}"),
    }
}
