//! Race stress: threads swap directories for links to the outside thousands of times while
//! other threads read, write, list and remove through the crate. Nothing outside may change,
//! and every failure must be a typed refusal.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use confined_fs::{ConfinedRoot, Error};
use rustix::fs::{openat, renameat_with, Mode, OFlags, RenameFlags, CWD};

const CANARY: &[u8] = b"canary: must never change";
const RUN_FOR: Duration = Duration::from_millis(2000);
const MIN_SWAPS: u64 = 2000;

/// Everything observable about the outside tree: names, contents, and every timestamp that a
/// write, a create or a remove would move.
#[derive(Debug, PartialEq, Eq)]
struct OutsideState {
    names: Vec<String>,
    canary: Vec<u8>,
    canary_times: (i64, i64, i64, i64),
    dir_times: (i64, i64, i64, i64),
    inner_names: Vec<String>,
}

fn times(path: &Path) -> (i64, i64, i64, i64) {
    let meta = fs::symlink_metadata(path).unwrap();
    (
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec(),
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn outside_state(outside: &Path) -> OutsideState {
    OutsideState {
        names: names(outside),
        canary: fs::read(outside.join("canary")).unwrap(),
        canary_times: times(&outside.join("canary")),
        dir_times: times(outside),
        inner_names: names(&outside.join("inner")),
    }
}

/// Exchanges two names in `dir` atomically, `rounds` times or until `stop`.
fn swapper(
    dir: OwnedFd,
    a: &'static str,
    b: &'static str,
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
) {
    while !stop.load(Ordering::Relaxed) {
        renameat_with(&dir, a, &dir, b, RenameFlags::EXCHANGE).expect("the exchange succeeds");
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Tally {
    ok: u64,
    refused: u64,
}

fn worker(root: Arc<ConfinedRoot>, seed: usize, stop: Arc<AtomicBool>) -> Result<Tally, String> {
    let mut tally = Tally::default();
    let mut step = seed;
    while !stop.load(Ordering::Relaxed) {
        step += 1;
        let outcome = match step % 12 {
            0 => root
                .write("d/canary", b"overwritten through a link")
                .map(drop),
            1 => root.read("d/canary", 1 << 20).map(drop),
            2 => root.list("d").map(drop),
            3 => root.lstat("d/canary").map(drop),
            4 => root.make_dirs("d/made/deeper").map(drop),
            5 => root.remove("d/canary", false),
            6 => root
                .write("d/sub/canary", b"overwritten through a nested link")
                .map(drop),
            7 => root.read("d/sub/canary", 1 << 20).map(drop),
            8 => root.write("d/tree/x/y", b"tree").map(drop),
            9 => root.remove("d/tree", true),
            10 => root.list("d/sub").map(drop),
            _ => root.remove("d/sub/inner", true),
        };
        match outcome {
            Ok(()) => tally.ok += 1,
            Err(error) if error.is_refusal() => tally.refused += 1,
            Err(error @ Error::Io { .. }) => return Err(format!("untyped failure: {error}")),
            Err(error) => return Err(format!("unexpected error: {error}")),
        }
    }
    Ok(tally)
}

#[test]
fn swapping_directories_for_links_never_reaches_outside() {
    let dir = tempfile::tempdir().unwrap();
    let root_path: PathBuf = dir.path().join("root");
    let outside = dir.path().join("outside");
    fs::create_dir_all(outside.join("inner")).unwrap();
    fs::write(outside.join("canary"), CANARY).unwrap();
    fs::write(outside.join("inner/keep"), b"keep").unwrap();
    // `d` (a real directory) and `alt` (a link to the outside) trade places; inside the real
    // directory, `sub` and `sublink` do the same one level down.
    fs::create_dir_all(root_path.join("d/sub")).unwrap();
    symlink(&outside, root_path.join("alt")).unwrap();
    symlink(&outside, root_path.join("d/sublink")).unwrap();
    let before = outside_state(&outside);

    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root_fd = openat(CWD, &root_path, dir_flags, Mode::empty()).unwrap();
    let inner_fd = openat(CWD, root_path.join("d"), dir_flags, Mode::empty()).unwrap();
    let root = Arc::new(ConfinedRoot::open(&root_path).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));

    let swappers: Vec<_> = [(root_fd, "d", "alt"), (inner_fd, "sub", "sublink")]
        .into_iter()
        .map(|(fd, a, b)| {
            let (stop, swaps) = (stop.clone(), swaps.clone());
            thread::spawn(move || swapper(fd, a, b, stop, swaps))
        })
        .collect();
    let workers: Vec<_> = (0..2)
        .map(|seed| {
            let (root, stop) = (root.clone(), stop.clone());
            thread::spawn(move || worker(root, seed * 5, stop))
        })
        .collect();

    let start = Instant::now();
    while start.elapsed() < RUN_FOR
        || (swaps.load(Ordering::Relaxed) < MIN_SWAPS && start.elapsed() < RUN_FOR * 5)
    {
        thread::sleep(Duration::from_millis(20));
        assert_eq!(
            outside_state(&outside),
            before,
            "the outside changed during the race"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for swapper in swappers {
        swapper.join().unwrap();
    }
    let mut total = Tally::default();
    for worker in workers {
        let tally = worker
            .join()
            .unwrap()
            .unwrap_or_else(|failure| panic!("{failure}"));
        total.ok += tally.ok;
        total.refused += tally.refused;
    }

    assert_eq!(outside_state(&outside), before, "the outside changed");
    assert_eq!(fs::read(outside.join("canary")).unwrap(), CANARY);
    let swaps = swaps.load(Ordering::Relaxed);
    assert!(swaps >= MIN_SWAPS, "only {swaps} swaps happened");
    // Both branches of the race were exercised: operations went through and were refused.
    assert!(
        total.ok > 0 && total.refused > 0,
        "ok {} refused {}",
        total.ok,
        total.refused
    );
    // No temporary file was left in the real directories, wherever they ended up.
    for real in ["d", "alt", "d/sub", "d/sublink", "alt/sub", "alt/sublink"] {
        let path = root_path.join(real);
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            assert!(
                names(&path).iter().all(|name| !name.ends_with(".part")),
                "temporary file left in {real}: {:?}",
                names(&path)
            );
        }
    }
}
