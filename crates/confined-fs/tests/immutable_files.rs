#![cfg(target_os = "linux")]
//! A file the host will not unlink (immutable, as `chattr +i` makes it) is reported as the
//! host's refusal: never mistaken for a directory swapped in, never removed.

use std::fs;

use confined_fs::{ConfinedRoot, Error};
use rustix::fs::IFlags;

/// Clears the immutable flag again however the test ends, so the directory can be removed.
struct Immutable(fs::File);

impl Immutable {
    fn set(path: &std::path::Path) -> Immutable {
        let file = fs::File::open(path).unwrap();
        let flags = rustix::fs::ioctl_getflags(&file).unwrap();
        rustix::fs::ioctl_setflags(&file, flags | IFlags::IMMUTABLE).expect(
            "setting the immutable flag needs root (CAP_LINUX_IMMUTABLE) and a file system \
             that keeps inode flags (ext4, xfs, btrfs, tmpfs)",
        );
        Immutable(file)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Ok(flags) = rustix::fs::ioctl_getflags(&self.0) {
            let _ = rustix::fs::ioctl_setflags(&self.0, flags - IFlags::IMMUTABLE);
        }
    }
}

#[test]
fn a_file_the_host_will_not_unlink_is_a_host_error_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kept");
    fs::write(&file, b"immutable").unwrap();
    let _immutable = Immutable::set(&file);
    let root = ConfinedRoot::open(dir.path()).unwrap();
    for recursive in [false, true] {
        match root.remove("kept", recursive) {
            Err(Error::Io {
                ref path,
                ref source,
                ..
            }) => {
                assert_eq!(path, "kept");
                let shown = root.remove("kept", recursive).unwrap_err().to_string();
                assert!(shown.starts_with("remove kept: "), "{shown}");
                assert_eq!(
                    source.raw_os_error(),
                    Some(rustix::io::Errno::PERM.raw_os_error())
                );
            }
            other => panic!("recursive {recursive}: expected the host's refusal, got {other:?}"),
        }
    }
    assert_eq!(fs::read(&file).unwrap(), b"immutable");
}

/// Asserts `outcome` is the host's EPERM about `path`.
fn assert_host_refused(outcome: Result<(), Error>, path: &str) {
    match outcome {
        Err(Error::Io {
            path: ref said,
            ref source,
            ..
        }) => {
            assert_eq!(said, path);
            assert_eq!(
                source.raw_os_error(),
                Some(rustix::io::Errno::PERM.raw_os_error()),
                "{source}"
            );
        }
        other => panic!("expected the host's refusal, got {other:?}"),
    }
}

#[test]
fn a_recursive_remove_meeting_a_file_it_cannot_unlink_fails_with_the_hosts_refusal() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("tree/sub")).unwrap();
    let file = dir.path().join("tree/sub/kept");
    fs::write(&file, b"immutable").unwrap();
    fs::write(dir.path().join("tree/other"), b"x").unwrap();
    let _immutable = Immutable::set(&file);
    let root = ConfinedRoot::open(dir.path()).unwrap();
    assert_host_refused(root.remove("tree", true), "tree");
    assert_eq!(fs::read(&file).unwrap(), b"immutable");
}

#[test]
fn a_recursive_remove_meeting_a_directory_it_cannot_remove_fails_with_the_hosts_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("tree/kept");
    fs::create_dir_all(&kept).unwrap();
    let _immutable = Immutable::set(&kept);
    let root = ConfinedRoot::open(dir.path()).unwrap();
    assert_host_refused(root.remove("tree", true), "tree");
    assert!(kept.is_dir());
}
