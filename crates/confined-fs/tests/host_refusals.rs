#![cfg(target_os = "linux")]
//! What a host refusal looks like when the host user lacks a permission (a directory it may
//! read but not search, or not write) or runs out of descriptors: a host error naming the
//! path, never a refusal nor a missing entry. Each test runs in a child process of its own:
//! as `nobody` (uid and gid 65534) when this is root, which bypasses permissions, and so that
//! a lowered descriptor limit touches nothing else.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use confined_fs::{ConfinedRoot, DirectoryListing, Error, KernelListing, RootOptions};

const NOBODY: u32 = 65_534;
const RUN_DEADLINE: Duration = Duration::from_secs(120);
/// Set in the child process a test runs its body in.
const IN_CHILD: &str = "CONFINED_FS_TEST_IN_CHILD";

/// Runs `body` in a child process running only the test named `name`, as `nobody` when this
/// is root; passes when that run passes.
fn in_child(name: &str, body: impl FnOnce()) {
    if std::env::var_os(IN_CHILD).is_some() {
        body();
        return;
    }
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_CHILD, "1")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if rustix::process::geteuid().is_root() {
        command.uid(NOBODY).gid(NOBODY);
    }
    let mut child = command.spawn().expect("the test binary runs again");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child run took over {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "the child run failed: {stdout}");
    assert!(
        stdout.contains("1 passed"),
        "the child run ran no test: {stdout}"
    );
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Asserts `outcome` is the host's EACCES about `path`.
fn assert_permission_denied<T: std::fmt::Debug>(outcome: Result<T, Error>, path: &str) {
    assert_host_error(outcome, path, rustix::io::Errno::ACCESS);
}

fn assert_host_error<T: std::fmt::Debug>(
    outcome: Result<T, Error>,
    path: &str,
    errno: rustix::io::Errno,
) {
    match outcome {
        Err(Error::Io {
            path: ref said,
            ref source,
            ..
        }) => {
            assert_eq!(said, path);
            assert_eq!(
                source.raw_os_error(),
                Some(errno.raw_os_error()),
                "{source}"
            );
        }
        other => panic!("expected the host's error, got {other:?}"),
    }
}

/// The kernel's listing, which makes the directory `d` unsearchable in the first race window.
#[derive(Debug)]
struct ShutsSearchOnFirstWindow(std::path::PathBuf, std::sync::Once);

impl DirectoryListing for ShutsSearchOnFirstWindow {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        KernelListing.lists_verbatim(dir, name)
    }

    fn race_window(&self, _: BorrowedFd<'_>, _: &OsStr) {
        self.1.call_once(|| set_mode(&self.0, 0o600));
    }
}

#[test]
fn a_listing_whose_directory_stops_being_searchable_is_a_host_error() {
    in_child(
        "a_listing_whose_directory_stops_being_searchable_is_a_host_error",
        || {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().join("d");
            fs::create_dir(&d).unwrap();
            fs::write(d.join("f"), b"x").unwrap();
            let listing = Arc::new(ShutsSearchOnFirstWindow(d.clone(), std::sync::Once::new()));
            let root = ConfinedRoot::open_with(dir.path(), RootOptions::default().listing(listing))
                .unwrap();
            let outcome = root.list("d");
            set_mode(&d, 0o700);
            // Never an empty listing: the entries are there, the host would not say what.
            assert_permission_denied(outcome, "d");
        },
    );
}

/// The kernel's listing, which makes the directory `tree/d` unsearchable in the first race
/// window on `f`, and searchable again in every window on `d`.
#[derive(Debug)]
struct ShutsSearchOnceAtF(std::path::PathBuf, std::sync::Once);

impl DirectoryListing for ShutsSearchOnceAtF {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        KernelListing.lists_verbatim(dir, name)
    }

    fn race_window(&self, _: BorrowedFd<'_>, name: &OsStr) {
        if name == "f" {
            self.1.call_once(|| set_mode(&self.0, 0o600));
        } else if name == "d" {
            set_mode(&self.0, 0o700);
        }
    }
}

#[test]
fn a_recursive_remove_that_may_not_look_at_an_entry_fails_with_the_hosts_refusal() {
    in_child(
        "a_recursive_remove_that_may_not_look_at_an_entry_fails_with_the_hosts_refusal",
        || {
            let dir = tempfile::tempdir().unwrap();
            let d = dir.path().join("tree/d");
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("f"), b"x").unwrap();
            let listing = Arc::new(ShutsSearchOnceAtF(d.clone(), std::sync::Once::new()));
            let root = ConfinedRoot::open_with(dir.path(), RootOptions::default().listing(listing))
                .unwrap();
            let outcome = root.remove("tree", true);
            set_mode(&d, 0o700);
            // Refused where the host refused, not skipped over and retried.
            assert_permission_denied(outcome, "tree");
            assert_eq!(fs::read(d.join("f")).unwrap(), b"x");
        },
    );
}

/// A listing that answers without a descriptor, so a lookup needs none.
#[derive(Debug)]
struct EveryNameListed;

impl DirectoryListing for EveryNameListed {
    fn lists_verbatim(&self, _: BorrowedFd<'_>, _: &OsStr) -> io::Result<bool> {
        Ok(true)
    }
}

#[test]
fn a_directory_opened_with_no_descriptor_left_is_a_host_error_not_a_refusal() {
    in_child(
        "a_directory_opened_with_no_descriptor_left_is_a_host_error_not_a_refusal",
        || {
            use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("d")).unwrap();
            fs::write(dir.path().join("d/f"), b"x").unwrap();
            let root = ConfinedRoot::open_with(
                dir.path(),
                RootOptions::default().listing(Arc::new(EveryNameListed)),
            )
            .unwrap();
            // The lowest free descriptor becomes the limit: the next open fails.
            let next = rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY, 0.into()).unwrap();
            let limit = u64::try_from(std::os::fd::AsRawFd::as_raw_fd(&next)).unwrap();
            drop(next);
            let before = getrlimit(Resource::Nofile);
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(limit),
                    maximum: before.maximum,
                },
            )
            .unwrap();
            let outcome = root.read("d/f", 1 << 20);
            setrlimit(Resource::Nofile, before).unwrap();
            assert_host_error(outcome, "d", rustix::io::Errno::MFILE);
        },
    );
}

#[test]
fn a_root_the_host_may_not_reach_is_a_host_error_not_missing() {
    in_child(
        "a_root_the_host_may_not_reach_is_a_host_error_not_missing",
        || {
            let dir = tempfile::tempdir().unwrap();
            let parent = dir.path().join("parent");
            fs::create_dir_all(parent.join("root")).unwrap();
            set_mode(&parent, 0o600);
            let outcome = ConfinedRoot::open(parent.join("root"));
            set_mode(&parent, 0o700);
            assert_permission_denied(outcome, &parent.join("root").display().to_string());
        },
    );
}

#[test]
fn looking_inside_a_directory_the_host_may_not_search_is_a_host_error() {
    in_child(
        "looking_inside_a_directory_the_host_may_not_search_is_a_host_error",
        || {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("d")).unwrap();
            fs::write(dir.path().join("d/f"), b"x").unwrap();
            set_mode(&dir.path().join("d"), 0o600);
            let root = ConfinedRoot::open(dir.path()).unwrap();
            let outcomes = [
                root.read("d/f", 1 << 20).map(drop),
                root.lstat("d/f").map(drop),
            ];
            set_mode(&dir.path().join("d"), 0o700);
            for outcome in outcomes {
                assert_permission_denied(outcome, "d/f");
            }
        },
    );
}

#[test]
fn creating_in_a_directory_the_host_may_not_write_is_a_host_error() {
    in_child(
        "creating_in_a_directory_the_host_may_not_write_is_a_host_error",
        || {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("d")).unwrap();
            set_mode(&dir.path().join("d"), 0o500);
            let root = ConfinedRoot::open(dir.path()).unwrap();
            let outcomes = [root.write("d/new/f", b"x"), root.make_dirs("d/new")];
            set_mode(&dir.path().join("d"), 0o700);
            for outcome in outcomes {
                assert_permission_denied(outcome, "d/new");
            }
        },
    );
}
