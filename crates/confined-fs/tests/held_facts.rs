#![cfg(target_os = "linux")]
//! What the walk holds and hands on: the facts of the directories it holds reach the listing,
//! the descriptors a root holds never reach a program the host starts, the alias check of a
//! directory a racing guest made first, and a write refused before it leaves any trace.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use confined_fs::{
    ConfinedRoot, ConfinementReason, DirectoryListing, Error, HeldDirectory, KernelListing,
    RootOptions,
};

/// A device and inode: which directory a handle is.
type Identity = (u64, u64);

fn identity_of_path(path: &Path) -> Identity {
    let metadata = fs::metadata(path).unwrap();
    (metadata.dev(), metadata.ino())
}

fn identity_of_handle(handle: BorrowedFd<'_>) -> Identity {
    let metadata = fs::File::from(handle.try_clone_to_owned().unwrap())
        .metadata()
        .unwrap();
    (metadata.dev(), metadata.ino())
}

/// One alias check of a name the walk's lstat found: the name, which directory the readable
/// handle it was given is, and the file system fact it was given.
type Seen = (OsString, Option<Identity>, Option<bool>);

/// The kernel's listing, recording what the walk hands it with each found name.
#[derive(Debug, Default)]
struct Recording(Mutex<Vec<Seen>>);

impl DirectoryListing for Recording {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        KernelListing.lists_verbatim(dir, name)
    }

    fn lists_found_verbatim(
        &self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        held: HeldDirectory<'_>,
    ) -> io::Result<bool> {
        self.0.lock().unwrap().push((
            name.to_owned(),
            held.readable.map(identity_of_handle),
            held.byte_exact_file_system,
        ));
        KernelListing.lists_found_verbatim(dir, name, held)
    }
}

/// The root and every directory of it the root holds come with their facts: the same directory
/// opened readable, and their file system's kind; a directory the walk opened only for this
/// operation has none (the listing finds them itself).
#[test]
fn the_walk_hands_the_listing_what_it_holds_of_each_directory() {
    let temp = tempfile::tempdir().unwrap();
    let root_path = temp.path().join("root");
    fs::create_dir_all(root_path.join("work/sub")).unwrap();
    fs::write(root_path.join("work/sub/f"), b"f").unwrap();
    let recording = Arc::new(Recording::default());
    let root = ConfinedRoot::open_with(
        &root_path,
        RootOptions::default().listing(Arc::clone(&recording) as Arc<dyn DirectoryListing>),
    )
    .unwrap();
    let (root_id, work_id) = (
        identity_of_path(&root_path),
        identity_of_path(&root_path.join("work")),
    );
    // Twice: the second walk enters the directory the first one left held.
    for round in 0..2 {
        assert_eq!(root.read("work/sub/f", 10).unwrap(), b"f");
        let seen = std::mem::take(&mut *recording.0.lock().unwrap());
        let names: Vec<&OsStr> = seen.iter().map(|(name, ..)| name.as_os_str()).collect();
        assert_eq!(names, ["work", "sub", "f"], "round {round}");
        assert_eq!(seen[0].1, Some(root_id), "round {round}: the root's own");
        assert_eq!(
            seen[1].1,
            Some(work_id),
            "round {round}: the held child's own"
        );
        assert!(seen[0].2.is_some() && seen[1].2.is_some(), "{seen:?}");
        assert_eq!((seen[2].1, seen[2].2), (None, None), "round {round}");
    }
}

/// A root holds descriptors between operations (its own readable handle, and those of the
/// directories it holds). None of them may reach a program the host starts: a child would hold
/// a way into the workspace that no confinement check stands in front of.
#[test]
fn the_descriptors_a_root_holds_never_reach_a_started_program() {
    let temp = tempfile::tempdir().unwrap();
    let root_path = temp.path().join("root");
    fs::create_dir(&root_path).unwrap();
    let root = ConfinedRoot::open(&root_path).unwrap();
    root.write("work/a", b"1").unwrap();
    assert_eq!(root.read("work/a", 10).unwrap(), b"1");

    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let fds = fs::read_dir(format!("/proc/{}/fd", child.id()));
    let inherited: Vec<PathBuf> = fds
        .unwrap()
        .map(|entry| fs::read_link(entry.unwrap().path()).unwrap_or_default())
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !inherited.is_empty(),
        "the child's standard streams at least"
    );
    assert!(
        inherited
            .iter()
            .all(|target| !target.starts_with(&root_path)),
        "{inherited:?}"
    );
}

/// A stand-in for a case-insensitive file system, raced: in the window before the walk creates
/// `Docs`, the guest makes `docs`. On such a file system the walk's create then fails as taken
/// and `Docs` resolves to the guest's directory, which the parent lists as `docs`. The kernel
/// here cannot fold case, so the race makes the directory under the walk's spelling and the
/// listing reports it stored as the guest's.
#[derive(Debug)]
struct GuestMakesAliasFirst {
    root: PathBuf,
}

impl GuestMakesAliasFirst {
    const RESOLVED: &'static str = "Docs";
    const STORED: &'static str = "docs";
}

impl DirectoryListing for GuestMakesAliasFirst {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        Ok(KernelListing::names(dir)?.into_iter().any(|listed| {
            let stored = if listed == Self::RESOLVED {
                OsString::from(Self::STORED)
            } else {
                listed
            };
            stored == name
        }))
    }

    fn race_window(&self, _dir: BorrowedFd<'_>, name: &OsStr) {
        if name == Self::RESOLVED {
            let _ = fs::create_dir(self.root.join(Self::RESOLVED));
        }
    }
}

#[test]
fn a_directory_a_racing_guest_made_first_under_an_alias_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let root_path = temp.path().join("root");
    fs::create_dir(&root_path).unwrap();
    let listing = GuestMakesAliasFirst {
        root: root_path.clone(),
    };
    let root = ConfinedRoot::open_with(
        &root_path,
        RootOptions::default().listing(Arc::new(listing)),
    )
    .unwrap();
    let refused = |outcome: &Result<(), Error>| {
        matches!(
            outcome,
            Err(Error::Confinement {
                reason: ConfinementReason::Alias,
                ..
            })
        )
    };
    let guests = root_path.join(GuestMakesAliasFirst::RESOLVED);

    let written = root.write("Docs/new", b"into the guest's directory");
    assert!(refused(&written), "{written:?}");
    assert!(fs::read_dir(&guests).unwrap().next().is_none());

    fs::remove_dir(&guests).unwrap();
    let made = root.make_dirs("Docs/sub");
    assert!(refused(&made), "{made:?}");
    assert!(fs::read_dir(&guests).unwrap().next().is_none());
}

/// A write to a path where a directory stands is refused from the lstat alone: no temporary file
/// is made in the parent, so the parent is left exactly as it was (its modification time too,
/// which a file made and removed again would move).
#[test]
fn a_write_over_a_directory_is_refused_before_anything_is_written() {
    let temp = tempfile::tempdir().unwrap();
    let root_path = temp.path().join("root");
    fs::create_dir_all(root_path.join("d")).unwrap();
    fs::write(root_path.join("d/inside"), b"kept").unwrap();
    let root = ConfinedRoot::open(&root_path).unwrap();
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    fs::File::open(&root_path)
        .unwrap()
        .set_modified(past)
        .unwrap();
    for (how, outcome) in [
        ("write", root.write("d", b"x")),
        ("write_unless_link", root.write_unless_link("d", b"x")),
    ] {
        assert!(
            matches!(outcome, Err(Error::IsADirectory { .. })),
            "{how}: {outcome:?}"
        );
        assert_eq!(
            fs::metadata(&root_path).unwrap().modified().unwrap(),
            past,
            "{how}: the parent was written to"
        );
    }
    assert_eq!(fs::read(root_path.join("d/inside")).unwrap(), b"kept");
}
