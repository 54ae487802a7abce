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
    let thread = std::thread::spawn(move || {
        let _ = done.send(reader.root.read("f", 10));
    });
    let outcome = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("opening a pipe with no writer must not block");
    // The thread's share of the race holds the temporary directory: joined, so the directory
    // goes with the test, never left behind by a process that ended first.
    thread.join().unwrap();
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

/// Called in every race window with the entry's name.
type EveryWindow = Box<dyn Fn(&OsStr) + Send + Sync>;

/// The kernel's listing, acting as a racing guest in the windows the listing seam is called
/// in: right after the lookup of an entry named in `lookups` (the alias check), or in a race
/// window on an entry named in `windows` (after a recursive remove's lstat of it, or after a
/// failed directory open of it), that entry's swap runs, once. `every` is called in every race
/// window, with the entry's name.
struct RacingGuest {
    lookups: Mutex<Vec<PendingSwap>>,
    windows: Mutex<Vec<PendingSwap>>,
    every: Option<EveryWindow>,
}

impl fmt::Debug for RacingGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RacingGuest").finish_non_exhaustive()
    }
}

/// Runs and forgets the first swap in `swaps` set on `name` that has no more windows to let
/// pass; counts one down for those that have.
fn run_swap(swaps: &Mutex<Vec<PendingSwap>>, name: &OsStr) {
    let mut swaps = swaps.lock().unwrap();
    let Some(at) = swaps.iter().position(|swap| swap.trigger == name) else {
        return;
    };
    if swaps[at].let_pass > 0 {
        swaps[at].let_pass -= 1;
        return;
    }
    let swap = swaps.remove(at);
    drop(swaps);
    (swap.swap)();
}

/// A swap waiting for its window: the `let_pass`+1-th one on the entry `trigger`.
struct PendingSwap {
    trigger: OsString,
    let_pass: u32,
    swap: Swap,
}

impl DirectoryListing for RacingGuest {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        let listed = KernelListing.lists_verbatim(dir, name)?;
        run_swap(&self.lookups, name);
        Ok(listed)
    }

    fn race_window(&self, _dir: BorrowedFd<'_>, name: &OsStr) {
        if let Some(every) = &self.every {
            every(name);
        }
        run_swap(&self.windows, name);
    }
}

/// One swap: the entry it is set on, how many of its windows pass first, and what it does
/// given the root's and the outside's paths.
type GuestSwap = (&'static str, u32, Box<dyn FnOnce(&Path, &Path) + Send>);

/// A swap in the first window on `at`.
fn swap(at: &'static str, swap: impl FnOnce(&Path, &Path) + Send + 'static) -> GuestSwap {
    (at, 0, Box::new(swap))
}

/// A swap in a recursive remove's window on `at` right after its lstat (the one before it
/// passes).
fn after_lstat(at: &'static str, swap: impl FnOnce(&Path, &Path) + Send + 'static) -> GuestSwap {
    (at, 1, Box::new(swap))
}

fn swaps(root: &Path, outside: &Path, swaps: Vec<GuestSwap>) -> Mutex<Vec<PendingSwap>> {
    Mutex::new(
        swaps
            .into_iter()
            .map(|(trigger, let_pass, swap)| {
                let (in_root, out) = (root.to_owned(), outside.to_owned());
                PendingSwap {
                    trigger: trigger.into(),
                    let_pass,
                    swap: Box::new(move || swap(&in_root, &out)),
                }
            })
            .collect(),
    )
}

/// A root (built by `prepare`) beside an `outside/` canary, raced by a [`RacingGuest`].
struct GuestRace {
    _dir: tempfile::TempDir,
    root_path: PathBuf,
    outside: PathBuf,
    guest: Arc<RacingGuest>,
    root: ConfinedRoot,
}

impl GuestRace {
    fn new(prepare: impl FnOnce(&Path), lookups: Vec<GuestSwap>, windows: Vec<GuestSwap>) -> Self {
        Self::with_guest(prepare, |root, outside| RacingGuest {
            lookups: swaps(root, outside, lookups),
            windows: swaps(root, outside, windows),
            every: None,
        })
    }

    /// A guest that swaps entries of `tree/` in the race windows of a recursive remove.
    fn in_tree(prepare: impl FnOnce(&Path), windows: Vec<GuestSwap>) -> Self {
        Self::new(
            |root| {
                fs::create_dir(root.join("tree")).unwrap();
                prepare(&root.join("tree"));
            },
            Vec::new(),
            windows,
        )
    }

    fn with_guest(
        prepare: impl FnOnce(&Path),
        guest: impl FnOnce(&Path, &Path) -> RacingGuest,
    ) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root_path = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir(&root_path).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("canary"), CANARY).unwrap();
        prepare(&root_path);
        let guest = Arc::new(guest(&root_path, &outside));
        let root =
            ConfinedRoot::open_with(&root_path, RootOptions::default().listing(guest.clone()))
                .expect("the root opens");
        Self {
            _dir: dir,
            root_path,
            outside,
            guest,
            root,
        }
    }

    fn assert_every_swap_ran(&self) {
        assert!(
            self.guest.lookups.lock().unwrap().is_empty()
                && self.guest.windows.lock().unwrap().is_empty(),
            "a swap never met the operation"
        );
    }

    fn assert_outside_untouched(&self) {
        let names: Vec<_> = fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [OsString::from("canary")]);
        assert_eq!(fs::read(self.outside.join("canary")).unwrap(), CANARY);
    }

    /// The names left at the top of the root, sorted.
    fn root_names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.root_path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Removes `tree` recursively, checks that it is gone and that `left` is what remains.
    fn remove_tree_leaving(&self, left: &[&str]) {
        let outcome = self.root.remove("tree", true);
        assert!(outcome.is_ok(), "{outcome:?}");
        self.assert_every_swap_ran();
        assert_eq!(self.root_names(), left);
        self.assert_outside_untouched();
    }
}

#[test]
fn a_file_in_a_tree_swapped_for_a_directory_after_its_lstat_is_removed_as_one() {
    let race = GuestRace::in_tree(
        |tree| fs::write(tree.join("f"), b"x").unwrap(),
        vec![after_lstat("f", |root, _| {
            fs::remove_file(root.join("tree/f")).unwrap();
            fs::create_dir_all(root.join("tree/f/deeper")).unwrap();
            fs::write(root.join("tree/f/deeper/file"), b"x").unwrap();
        })],
    );
    race.remove_tree_leaving(&[]);
}

#[test]
fn a_directory_in_a_tree_swapped_for_a_link_after_its_lstat_loses_only_the_link() {
    let race = GuestRace::in_tree(
        |tree| {
            fs::create_dir(tree.join("sub")).unwrap();
            fs::write(tree.join("sub/canary"), b"inside").unwrap();
        },
        vec![after_lstat("sub", |root, outside| {
            fs::rename(root.join("tree/sub"), root.join("sub.moved")).unwrap();
            symlink(outside, root.join("tree/sub")).unwrap();
        })],
    );
    race.remove_tree_leaving(&["sub.moved"]);
    assert_eq!(
        fs::read(race.root_path.join("sub.moved/canary")).unwrap(),
        b"inside"
    );
}

#[test]
fn a_directory_in_a_tree_swapped_for_a_file_after_its_lstat_is_unlinked() {
    let race = GuestRace::in_tree(
        |tree| fs::create_dir(tree.join("sub")).unwrap(),
        vec![after_lstat("sub", |root, _| {
            fs::remove_dir(root.join("tree/sub")).unwrap();
            fs::write(root.join("tree/sub"), b"a file now").unwrap();
        })],
    );
    race.remove_tree_leaving(&[]);
}

#[test]
fn entries_removed_by_someone_else_after_their_lstat_are_skipped() {
    let race = GuestRace::in_tree(
        |tree| {
            fs::write(tree.join("f"), b"x").unwrap();
            fs::create_dir_all(tree.join("sub/inner")).unwrap();
        },
        vec![
            after_lstat("f", |root, _| fs::remove_file(root.join("tree/f")).unwrap()),
            after_lstat("sub", |root, _| {
                fs::remove_dir_all(root.join("tree/sub")).unwrap()
            }),
        ],
    );
    race.remove_tree_leaving(&[]);
}

#[test]
fn entries_listed_but_gone_before_their_lstat_are_skipped() {
    // The first entry examined makes every other one vanish before the remove looks at it
    // (the listing has no fixed order, so which one comes first is known only then).
    let race = GuestRace::with_guest(
        |root| {
            fs::create_dir(root.join("tree")).unwrap();
            for name in ["a", "b", "c"] {
                fs::write(root.join("tree").join(name), b"x").unwrap();
            }
        },
        |root, _| {
            let tree = root.join("tree");
            let fired = Mutex::new(false);
            RacingGuest {
                lookups: Mutex::new(Vec::new()),
                windows: Mutex::new(Vec::new()),
                every: Some(Box::new(move |first| {
                    if !std::mem::replace(&mut *fired.lock().unwrap(), true) {
                        for name in ["a", "b", "c"] {
                            if first != name {
                                fs::remove_file(tree.join(name)).unwrap();
                            }
                        }
                    }
                })),
            }
        },
    );
    race.remove_tree_leaving(&[]);
}

#[test]
fn entries_added_while_a_tree_is_removed_are_removed_too() {
    let race = GuestRace::in_tree(
        |tree| {
            fs::create_dir(tree.join("sub")).unwrap();
            fs::write(tree.join("sub/f"), b"x").unwrap();
        },
        vec![swap("f", |root, _| {
            fs::write(root.join("tree/sub/late"), b"x").unwrap();
            fs::create_dir_all(root.join("tree/late-dir/deeper")).unwrap();
        })],
    );
    race.remove_tree_leaving(&[]);
}

#[test]
fn an_emptied_directory_swapped_for_a_link_before_its_rmdir_loses_only_the_link() {
    let race = GuestRace::in_tree(
        |tree| {
            fs::create_dir(tree.join("sub")).unwrap();
            fs::write(tree.join("sub/f"), b"x").unwrap();
        },
        vec![swap("f", |root, outside| {
            fs::rename(root.join("tree/sub"), root.join("sub.moved")).unwrap();
            symlink(outside, root.join("tree/sub")).unwrap();
        })],
    );
    // The held directory was emptied where it went; the link left in its place goes as a link.
    race.remove_tree_leaving(&["sub.moved"]);
    assert!(fs::read_dir(race.root_path.join("sub.moved"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn a_tree_removed_by_someone_else_after_its_lstat_is_not_found() {
    let race = Race::new(
        "d",
        |root| fs::create_dir_all(root.join("d/sub")).unwrap(),
        |root, _| fs::remove_dir_all(root.join("d")).unwrap(),
    );
    let outcome = race.root.remove("d", true);
    race.assert_swapped();
    assert!(
        matches!(outcome, Err(Error::NotFound { ref path }) if path == "d"),
        "{outcome:?}"
    );
}

#[test]
fn an_emptied_directory_moved_away_before_its_rmdir_is_left_where_it_went() {
    let race = GuestRace::in_tree(
        |tree| {
            fs::create_dir(tree.join("sub")).unwrap();
            fs::write(tree.join("sub/f"), b"x").unwrap();
        },
        vec![swap("f", |root, _| {
            fs::rename(root.join("tree/sub"), root.join("sub.moved")).unwrap();
        })],
    );
    race.remove_tree_leaving(&["sub.moved"]);
}

/// A root holding `d/canary`, whose lookup of `d` swaps it for `stand_in` (given the root and
/// the outside) and whose failed open of `d` then runs `after_the_open`.
fn swapped_around_the_open(
    stand_in: impl FnOnce(&Path, &Path) + Send + 'static,
    after_the_open: impl FnOnce(&Path, &Path) + Send + 'static,
) -> GuestRace {
    GuestRace::new(
        |root| {
            fs::create_dir(root.join("d")).unwrap();
            fs::write(root.join("d/canary"), b"inside").unwrap();
        },
        vec![swap("d", move |root, outside| {
            fs::rename(root.join("d"), root.join("d.real")).unwrap();
            stand_in(root, outside);
        })],
        vec![swap("d", after_the_open)],
    )
}

fn swap_back(root: &Path, _: &Path) {
    let _ = fs::remove_file(root.join("d"));
    fs::rename(root.join("d.real"), root.join("d")).unwrap();
}

#[test]
fn a_directory_swapped_for_a_link_or_a_file_and_back_around_its_open_is_not_entered() {
    type StandIn = fn(&Path, &Path);
    let stand_ins: [StandIn; 2] = [
        |root, outside| symlink(outside, root.join("d")).unwrap(),
        |root, _| fs::write(root.join("d"), b"a file").unwrap(),
    ];
    for stand_in in stand_ins {
        let race = swapped_around_the_open(stand_in, swap_back);
        let outcome = race.root.read("d/canary", 1 << 20);
        race.assert_every_swap_ran();
        // The open met something other than a directory: a refusal, whatever it was.
        assert!(
            matches!(outcome, Err(Error::NotADirectory { ref path }) if path == "d"),
            "{outcome:?}"
        );
        race.assert_outside_untouched();
    }
}

#[test]
fn a_directory_swapped_for_a_link_that_then_vanishes_is_not_found() {
    let race = swapped_around_the_open(
        |root, outside| symlink(outside, root.join("d")).unwrap(),
        |root, _| fs::remove_file(root.join("d")).unwrap(),
    );
    let outcome = race.root.read("d/canary", 1 << 20);
    race.assert_every_swap_ran();
    assert!(
        matches!(outcome, Err(Error::NotFound { ref path }) if path == "d"),
        "{outcome:?}"
    );
    race.assert_outside_untouched();
}

#[test]
fn a_directory_made_by_someone_else_before_its_creation_is_used() {
    let race = GuestRace::new(
        |_| {},
        Vec::new(),
        vec![swap("new", |root, _| {
            fs::create_dir(root.join("new")).unwrap()
        })],
    );
    race.root.write("new/f", b"written").unwrap();
    race.assert_every_swap_ran();
    assert_eq!(fs::read(race.root_path.join("new/f")).unwrap(), b"written");
}

#[test]
fn a_link_planted_before_a_directory_creation_is_refused() {
    let race = GuestRace::new(
        |_| {},
        Vec::new(),
        vec![swap("new", |root, outside| {
            symlink(outside, root.join("new")).unwrap()
        })],
    );
    assert_eq!(
        reason(race.root.write("new/canary", b"written through")),
        ConfinementReason::Link
    );
    race.assert_every_swap_ran();
    race.assert_outside_untouched();
}

#[test]
fn a_directory_removed_after_its_lstat_holds_nothing() {
    for operation in 0..4 {
        let race = Race::new(
            "d",
            |root| {
                fs::create_dir(root.join("d")).unwrap();
                fs::write(root.join("d/f"), b"x").unwrap();
            },
            |root, _| fs::remove_dir_all(root.join("d")).unwrap(),
        );
        let outcome = match operation {
            0 => race.root.lstat("d/f").map(|stat| assert_eq!(stat, None)),
            1 => race.root.read("d/f", 1 << 20).map(drop),
            2 => race.root.write("d/f", b"y"),
            _ => race.root.make_dirs("d/sub"),
        };
        race.assert_swapped();
        if operation == 0 {
            assert!(outcome.is_ok(), "{outcome:?}");
        } else {
            assert!(
                matches!(outcome, Err(Error::NotFound { ref path }) if path == "d"),
                "operation {operation}: {outcome:?}"
            );
        }
        assert!(fs::symlink_metadata(race.host("d")).is_err());
    }
}

/// The kernel's listing, which performs `swap` the first time it is asked about `trigger` once
/// armed: a guest that waits until the root holds a directory before it races.
#[derive(Default)]
struct SwapWhenArmed {
    trigger: OsString,
    armed: std::sync::atomic::AtomicBool,
    swap: Mutex<Option<Swap>>,
}

impl fmt::Debug for SwapWhenArmed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwapWhenArmed")
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

impl DirectoryListing for SwapWhenArmed {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        let listed = KernelListing.lists_verbatim(dir, name)?;
        if name == self.trigger && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(swap) = self.swap.lock().unwrap().take() {
                swap();
            }
        }
        Ok(listed)
    }
}

/// The root holds a directory it entered (Linux) between operations. A guest that swaps that
/// directory for a link to the outside right after the next operation's lstat of it (moving the
/// directory elsewhere in the root) meets the directory that lstat found: the operation acts
/// inside the root, in the moved directory, and the link is neither followed nor touched. A swap
/// before the lstat is met by the lstat itself (`a_held_directory_is_entered_again_only_while_
/// its_name_finds_it` in the crate's unit tests).
#[test]
fn a_held_directory_swapped_for_a_link_after_its_lstat_is_never_left_for_the_link() {
    for operation in 0..7 {
        let dir = tempfile::tempdir().unwrap();
        let root_path = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root_path.join("d")).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("canary"), CANARY).unwrap();
        fs::write(root_path.join("d/canary"), b"inside").unwrap();
        let (in_root, out) = (root_path.clone(), outside.clone());
        let listing = Arc::new(SwapWhenArmed {
            trigger: "d".into(),
            swap: Mutex::new(Some(Box::new(move || {
                fs::rename(in_root.join("d"), in_root.join("d.moved")).unwrap();
                symlink(&out, in_root.join("d")).unwrap();
            }))),
            ..SwapWhenArmed::default()
        });
        let root =
            ConfinedRoot::open_with(&root_path, RootOptions::default().listing(listing.clone()))
                .unwrap();
        // The root enters `d` once and holds it; then the guest arms its swap.
        root.lstat("d/canary").unwrap();
        listing
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let outcome = through_d(&root, operation);
        assert!(listing.swap.lock().unwrap().is_none(), "the swap never ran");
        #[cfg(any(target_os = "linux", target_os = "android"))]
        assert!(outcome.is_ok(), "operation {operation}: {outcome:?}");
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        assert_eq!(reason(outcome), ConfinementReason::Link);
        // Nothing outside changed, and the link is still the guest's link.
        let mut names: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, [OsString::from("canary")], "operation {operation}");
        assert_eq!(fs::read(outside.join("canary")).unwrap(), CANARY);
        assert_eq!(fs::read_link(root_path.join("d")).unwrap(), outside);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if operation == 1 {
            assert_eq!(
                fs::read(root_path.join("d.moved/canary")).unwrap(),
                b"overwritten through a link"
            );
        }
        // The next operation's lstat finds the link: refused.
        assert_eq!(
            reason(root.read("d/canary", 1 << 20)),
            ConfinementReason::Link,
            "operation {operation}"
        );
    }
}
