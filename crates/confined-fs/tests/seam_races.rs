#![cfg(unix)]
//! Deterministic races: the alias check's listing is consulted right after each successful
//! no-follow lstat, which is exactly the window a racing guest aims for. A listing that swaps
//! the entry it is asked about (for a link, a pipe, a directory, a hard link, a file) makes
//! every defence after the lstat observable without any timing luck.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use confined_fs::{
    ConfinedRoot, ConfinementReason, DirectoryListing, EntryKind, Error, Irregular, KernelListing,
    RootOptions, Stat,
};

const CANARY: &[u8] = b"outside the root: never read, never written";

type Swap = Box<dyn FnOnce() + Send>;

/// The kernel's listing, which performs `swap` the first time it is asked about `trigger`.
struct SwapWhenAsked {
    trigger: OsString,
    swap: Mutex<Option<Swap>>,
    asked: Mutex<u32>,
}

impl fmt::Debug for SwapWhenAsked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwapWhenAsked")
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

impl DirectoryListing for SwapWhenAsked {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        let listed = KernelListing.lists_verbatim(dir, name)?;
        if name == self.trigger {
            *self.asked.lock().unwrap() += 1;
            if let Some(swap) = self.swap.lock().unwrap().take() {
                swap();
            }
        }
        Ok(listed)
    }
}

/// A root whose listing swaps `trigger` once, beside an `outside/` tree with a canary.
struct Race {
    _dir: tempfile::TempDir,
    root_path: PathBuf,
    outside: PathBuf,
    listing: Arc<SwapWhenAsked>,
    root: ConfinedRoot,
}

impl Race {
    /// `prepare` builds the tree under the root; `swap` gets the root's and the outside's paths.
    fn new(
        trigger: &str,
        prepare: impl FnOnce(&Path),
        swap: impl FnOnce(&Path, &Path) + Send + 'static,
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root_path = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir(&root_path).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("canary"), CANARY).unwrap();
        prepare(&root_path);
        let (in_root, out) = (root_path.clone(), outside.clone());
        let listing = Arc::new(SwapWhenAsked {
            trigger: trigger.into(),
            swap: Mutex::new(Some(Box::new(move || swap(&in_root, &out)))),
            asked: Mutex::new(0),
        });
        let root =
            ConfinedRoot::open_with(&root_path, RootOptions::default().listing(listing.clone()))
                .expect("the root opens");
        Self {
            _dir: dir,
            root_path,
            outside,
            listing,
            root,
        }
    }

    fn host(&self, path: &str) -> PathBuf {
        self.root_path.join(path)
    }

    /// The swap ran: the defence under test really met the swapped entry.
    fn assert_swapped(&self) {
        assert!(
            self.listing.swap.lock().unwrap().is_none(),
            "the listing was never asked about {:?}",
            self.listing.trigger
        );
    }

    fn assert_outside_untouched(&self) {
        let mut names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [OsString::from("canary")]);
        assert_eq!(fs::read(self.outside.join("canary")).unwrap(), CANARY);
    }

    fn leftover_temporary_files(&self, dir: &str) -> Vec<String> {
        fs::read_dir(self.host(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".part"))
            .collect()
    }
}

fn file_named(name: &'static str, contents: &'static [u8]) -> impl FnOnce(&Path) {
    move |root| fs::write(root.join(name), contents).unwrap()
}

fn replace_with_link_to_canary(name: &'static str) -> impl FnOnce(&Path, &Path) + Send {
    move |root, outside| {
        let path = root.join(name);
        fs::remove_file(&path).unwrap();
        symlink(outside.join("canary"), &path).unwrap();
    }
}

fn make_fifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

fn reason(result: Result<impl fmt::Debug, Error>) -> ConfinementReason {
    match result {
        Err(Error::Confinement { reason, .. }) => reason,
        other => panic!("expected a confinement refusal, got {other:?}"),
    }
}

#[test]
fn a_file_swapped_for_a_link_after_its_lstat_is_refused_by_the_open_not_followed() {
    let race = Race::new(
        "f",
        file_named("f", b"inside"),
        replace_with_link_to_canary("f"),
    );
    let outcome = race.root.read("f", 1 << 20);
    race.assert_swapped();
    assert!(
        matches!(
            outcome,
            Err(Error::NotRegularFile {
                found: Irregular::Symlink,
                ..
            })
        ),
        "{outcome:?}"
    );
    race.assert_outside_untouched();
}

#[test]
fn a_file_swapped_for_a_pipe_after_its_lstat_is_refused_without_blocking() {
    let race = Race::new("f", file_named("f", b"inside"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
        make_fifo(&root.join("f"));
    });
    let race = Arc::new(race);
    let (done, finished) = mpsc::channel();
    let reader = race.clone();
    std::thread::spawn(move || {
        let _ = done.send(reader.root.read("f", 10));
    });
    let outcome = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("opening a pipe with no writer must not block");
    race.assert_swapped();
    assert!(
        matches!(
            outcome,
            Err(Error::NotRegularFile {
                found: Irregular::Fifo,
                ..
            })
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_file_swapped_for_a_hard_link_after_its_lstat_is_refused_by_the_open_file() {
    let race = Race::new(
        "f",
        |root| {
            fs::write(root.join("f"), b"inside").unwrap();
            fs::write(root.join("other"), b"another name for me").unwrap();
        },
        |root, _| {
            fs::remove_file(root.join("f")).unwrap();
            fs::hard_link(root.join("other"), root.join("f")).unwrap();
        },
    );
    let outcome = race.root.read("f", 1 << 20);
    race.assert_swapped();
    assert!(
        matches!(
            outcome,
            Err(Error::NotRegularFile {
                found: Irregular::HardLinked { links: 2 },
                ..
            })
        ),
        "{outcome:?}"
    );
}

#[test]
fn a_file_swapped_for_a_directory_after_its_lstat_is_not_read() {
    let race = Race::new("f", file_named("f", b"inside"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
        fs::create_dir(root.join("f")).unwrap();
    });
    let outcome = race.root.read("f", 1 << 20);
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::IsADirectory { ref path }) if path == "f"),
        "{outcome:?}"
    );
}

#[test]
fn a_file_growing_past_the_cap_after_its_lstat_is_refused_whole() {
    let race = Race::new("f", file_named("f", b"small"), |root, _| {
        fs::write(root.join("f"), vec![b'x'; 4096]).unwrap();
    });
    let outcome = race.root.read("f", 100);
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::TooLarge { cap: 100, .. })),
        "{outcome:?}"
    );
}

/// Every operation that walks through `d`, with `d` swapped after its lstat.
fn through_d(root: &ConfinedRoot, operation: usize) -> Result<(), Error> {
    match operation {
        0 => root.read("d/canary", 1 << 20).map(drop),
        1 => root.write("d/canary", b"overwritten through a link"),
        2 => root.list("d").map(drop),
        3 => root.make_dirs("d/sub"),
        4 => root.remove("d/canary", false),
        5 => root.lstat("d/canary").map(drop),
        _ => root.remove("d/canary", true),
    }
}

#[test]
fn a_directory_swapped_for_a_link_after_its_lstat_is_never_entered() {
    for operation in 0..7 {
        // The link points at the outside directory itself, so following it would reach the
        // canary by the same name.
        let race = Race::new(
            "d",
            |root| {
                fs::create_dir(root.join("d")).unwrap();
                fs::write(root.join("d/canary"), b"inside").unwrap();
            },
            |root, outside| {
                fs::rename(root.join("d"), root.join("d.moved")).unwrap();
                symlink(outside, root.join("d")).unwrap();
            },
        );
        let outcome = through_d(&race.root, operation);
        race.assert_swapped();
        assert_eq!(
            reason(outcome),
            ConfinementReason::Link,
            "operation {operation}"
        );
        race.assert_outside_untouched();
        assert_eq!(fs::read(race.host("d.moved/canary")).unwrap(), b"inside");
    }
}

#[test]
fn a_directory_swapped_for_a_file_after_its_lstat_is_not_a_directory() {
    for operation in 0..7 {
        let race = Race::new(
            "d",
            |root| fs::create_dir(root.join("d")).unwrap(),
            |root, _| {
                fs::remove_dir(root.join("d")).unwrap();
                fs::write(root.join("d"), b"a file now").unwrap();
            },
        );
        let outcome = through_d(&race.root, operation);
        race.assert_swapped();
        assert!(
            matches!(outcome, Err(Error::NotADirectory { ref path }) if path == "d"),
            "operation {operation}: {outcome:?}"
        );
        assert_eq!(fs::read(race.host("d")).unwrap(), b"a file now");
    }
}

#[test]
fn a_target_swapped_for_a_link_after_its_lstat_is_replaced_not_written_through() {
    let race = Race::new(
        "f",
        file_named("f", b"old"),
        replace_with_link_to_canary("f"),
    );
    race.root.write("f", b"new").unwrap();
    race.assert_swapped();
    assert!(fs::symlink_metadata(race.host("f")).unwrap().is_file());
    assert_eq!(fs::read(race.host("f")).unwrap(), b"new");
    race.assert_outside_untouched();
}

#[test]
fn a_target_swapped_for_a_directory_after_its_lstat_is_refused_and_cleaned_up() {
    let race = Race::new("f", file_named("f", b"old"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
        fs::create_dir(root.join("f")).unwrap();
        fs::write(root.join("f/kept"), b"kept").unwrap();
    });
    let outcome = race.root.write("f", b"new");
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::IsADirectory { ref path }) if path == "f"),
        "{outcome:?}"
    );
    assert_eq!(fs::read(race.host("f/kept")).unwrap(), b"kept");
    assert_eq!(race.leftover_temporary_files("."), Vec::<String>::new());
}

#[test]
fn a_file_swapped_for_a_directory_before_its_removal_is_removed_only_recursively() {
    for recursive in [false, true] {
        let race = Race::new("f", file_named("f", b"old"), |root, _| {
            fs::remove_file(root.join("f")).unwrap();
            fs::create_dir_all(root.join("f/deeper")).unwrap();
            fs::write(root.join("f/deeper/file"), b"x").unwrap();
        });
        let outcome = race.root.remove("f", recursive);
        race.assert_swapped();
        if recursive {
            assert!(outcome.is_ok(), "{outcome:?}");
            assert!(fs::symlink_metadata(race.host("f")).is_err());
        } else {
            assert!(
                matches!(outcome, Err(Error::IsADirectory { ref path }) if path == "f"),
                "{outcome:?}"
            );
            assert_eq!(fs::read(race.host("f/deeper/file")).unwrap(), b"x");
        }
    }
}

#[test]
fn a_directory_swapped_for_a_link_before_a_recursive_removal_loses_only_the_link() {
    let race = Race::new(
        "d",
        |root| {
            fs::create_dir(root.join("d")).unwrap();
            fs::write(root.join("d/file"), b"x").unwrap();
        },
        |root, outside| {
            fs::rename(root.join("d"), root.join("d.moved")).unwrap();
            symlink(outside, root.join("d")).unwrap();
        },
    );
    race.root.remove("d", true).unwrap();
    race.assert_swapped();
    assert!(fs::symlink_metadata(race.host("d")).is_err());
    assert_eq!(fs::read(race.host("d.moved/file")).unwrap(), b"x");
    race.assert_outside_untouched();
}

#[test]
fn a_leaf_swapped_for_a_link_is_described_as_the_link() {
    let race = Race::new("f", file_named("f", b"inside"), |root, outside| {
        fs::remove_file(root.join("f")).unwrap();
        symlink(outside.join("canary"), root.join("f")).unwrap();
    });
    // The lstat that triggered the swap saw the file; the next one sees the link, never its
    // target.
    assert_eq!(
        race.root.lstat("f").unwrap(),
        Some(Stat {
            kind: EntryKind::File,
            size: Some(6)
        })
    );
    race.assert_swapped();
    assert_eq!(
        race.root.lstat("f").unwrap(),
        Some(Stat {
            kind: EntryKind::Symlink,
            size: None
        })
    );
    assert_eq!(*race.listing.asked.lock().unwrap(), 2);
}

#[test]
fn a_file_removed_after_its_lstat_is_not_found() {
    let race = Race::new("f", file_named("f", b"inside"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
    });
    let outcome = race.root.read("f", 1 << 20);
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::NotFound { ref path }) if path == "f"),
        "{outcome:?}"
    );
}

#[test]
fn a_file_swapped_for_a_socket_after_its_lstat_is_a_host_error_not_a_link() {
    // Opening a socket fails (ENXIO) for a reason other than a link at the name: the caller
    // is told the host refused it, not that a link stood there.
    let race = Race::new("f", file_named("f", b"inside"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
        drop(std::os::unix::net::UnixListener::bind(root.join("f")).unwrap());
    });
    let outcome = race.root.read("f", 1 << 20);
    race.assert_swapped();
    match outcome {
        Err(Error::Io {
            ref path,
            ref source,
            ..
        }) => {
            assert_eq!(path, "f");
            assert_eq!(
                source.raw_os_error(),
                Some(rustix::io::Errno::NXIO.raw_os_error())
            );
        }
        other => panic!("expected the host's refusal, got {other:?}"),
    }
}

#[test]
fn a_file_removed_by_someone_else_after_its_lstat_is_not_found_on_removal() {
    let race = Race::new("f", file_named("f", b"inside"), |root, _| {
        fs::remove_file(root.join("f")).unwrap();
    });
    let outcome = race.root.remove("f", false);
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::NotFound { ref path }) if path == "f"),
        "{outcome:?}"
    );
}
