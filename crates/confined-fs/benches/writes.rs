//! Writing 1,000 files of 4 KiB through `ConfinedRoot::write`, against plain `std::fs` writes
//! with the same temporary-file-and-rename pattern, then reading them back through
//! `ConfinedRoot::read` against `std::fs::read`. Each round times both back to back; each line
//! printed gives the best time of each and the median of the per-round ratios, which resists the
//! noise of a shared machine better than a ratio of two independent minima.
//!
//! Then the cost of one read against the size of its directory: reads of 4 KiB files from a
//! directory of 10 entries and from one of 10,000, interleaved per round; the line gives the best
//! per-read time of each and the median ratio of large to small (a lookup that lists the whole
//! directory would make it grow with the entries). Both read the same number of distinct files
//! (10, spread across the large directory), so the ratio is the directory's size and not how many
//! files' pages and inodes the reads touch; the same reads through `std::fs` are the file
//! system's own ratio, printed beside it.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use confined_fs::ConfinedRoot;

use paired_bench::{median, record_row};

const FILES: usize = 1000;
const FILE_SIZE: usize = 4096;
const ROUNDS: usize = 11;

fn confined_round(root: &ConfinedRoot, round: usize, contents: &[u8]) -> Duration {
    let start = Instant::now();
    for index in 0..FILES {
        root.write(format!("confined-{round}/file-{index}"), contents)
            .expect("a confined write succeeds");
    }
    start.elapsed()
}

fn std_round(base: &Path, round: usize, contents: &[u8]) -> Duration {
    let start = Instant::now();
    let dir = base.join(format!("std-{round}"));
    fs::create_dir_all(&dir).expect("the directory is created");
    for index in 0..FILES {
        let temp = dir.join(format!(".file-{index}.part"));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .expect("the temporary file is created");
        file.write_all(contents).expect("the contents are written");
        drop(file);
        fs::rename(&temp, dir.join(format!("file-{index}"))).expect("the rename succeeds");
    }
    start.elapsed()
}

fn confined_read_round(root: &ConfinedRoot, round: usize) -> Duration {
    let start = Instant::now();
    for index in 0..FILES {
        let contents = root
            .read(format!("confined-{round}/file-{index}"), FILE_SIZE as u64)
            .expect("a confined read succeeds");
        assert_eq!(contents.len(), FILE_SIZE);
    }
    start.elapsed()
}

fn std_read_round(base: &Path, round: usize) -> Duration {
    let start = Instant::now();
    let dir = base.join(format!("std-{round}"));
    for index in 0..FILES {
        let contents = fs::read(dir.join(format!("file-{index}"))).expect("a plain read succeeds");
        assert_eq!(contents.len(), FILE_SIZE);
    }
    start.elapsed()
}

/// The best of each side and the median ratio, over rounds of (confined, plain) times.
struct Summary {
    confined: Duration,
    plain: Duration,
    ratios: Vec<f64>,
}

impl Summary {
    fn new() -> Self {
        Self {
            confined: Duration::MAX,
            plain: Duration::MAX,
            ratios: Vec::with_capacity(ROUNDS),
        }
    }

    fn add(&mut self, confined: Duration, plain: Duration) {
        self.confined = self.confined.min(confined);
        self.plain = self.plain.min(plain);
        self.ratios
            .push(confined.as_secs_f64() / plain.as_secs_f64());
    }

    /// Prints the line and records the row against `target` (a ratio bound).
    fn print(self, what: &str, target: f64) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let ratio = median(self.ratios);
        println!(
            "confined-fs {what}: {FILES} files x {} KiB: confined {:.1} ms, std {:.1} ms, ratio {:.2}",
            FILE_SIZE / 1024,
            ms(self.confined),
            ms(self.plain),
            ratio
        );
        record_row(
            &format!("confined-fs {what}, {FILES} x 4 KiB, vs std::fs"),
            ms(self.confined),
            ms(self.plain),
            ratio,
            &format!("≤ {target}"),
            ratio <= target,
        );
    }
}

/// Entries of the small and the large directory of the per-read row.
const SMALL_DIR: usize = 10;
const LARGE_DIR: usize = 10_000;
/// Reads timed per directory per round.
const DIR_READS: usize = 2_000;

/// The file the `index`th read takes: one of [`SMALL_DIR`] files spread evenly through a
/// directory of `entries`, the same count whatever the directory's size.
fn spread_file(index: usize, entries: usize) -> usize {
    (index % SMALL_DIR) * (entries / SMALL_DIR)
}

fn dir_read_round(root: &ConfinedRoot, dir: &str, entries: usize) -> Duration {
    let start = Instant::now();
    for index in 0..DIR_READS {
        let file = spread_file(index, entries);
        let contents = root
            .read(format!("{dir}/file-{file}"), FILE_SIZE as u64)
            .expect("a confined read succeeds");
        assert_eq!(contents.len(), FILE_SIZE);
    }
    start.elapsed()
}

/// The same reads through `std::fs::read`: what the directory's size costs the file system
/// itself (a stride through 10,000 files touches far more cache than 10 files do).
fn std_dir_read_round(base: &Path, dir: &str, entries: usize) -> Duration {
    let start = Instant::now();
    for index in 0..DIR_READS {
        let file = spread_file(index, entries);
        let contents =
            fs::read(base.join(dir).join(format!("file-{file}"))).expect("a plain read succeeds");
        assert_eq!(contents.len(), FILE_SIZE);
    }
    start.elapsed()
}

fn per_read_by_directory_size(contents: &[u8]) {
    let workspace = tempfile::tempdir().expect("a temporary directory");
    for (dir, entries) in [("small", SMALL_DIR), ("large", LARGE_DIR)] {
        let path = workspace.path().join(dir);
        fs::create_dir(&path).expect("the directory is created");
        for index in 0..entries {
            fs::write(path.join(format!("file-{index}")), contents).expect("a file is written");
        }
    }
    let root = ConfinedRoot::open(workspace.path()).expect("the root opens");
    let (mut small, mut large) = (Duration::MAX, Duration::MAX);
    let mut ratios = Vec::with_capacity(ROUNDS);
    let mut std_ratios = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let (s, l) = if round % 2 == 0 {
            let s = dir_read_round(&root, "small", SMALL_DIR);
            (s, dir_read_round(&root, "large", LARGE_DIR))
        } else {
            let l = dir_read_round(&root, "large", LARGE_DIR);
            (dir_read_round(&root, "small", SMALL_DIR), l)
        };
        let (std_s, std_l) = if round % 2 == 0 {
            let s = std_dir_read_round(workspace.path(), "small", SMALL_DIR);
            (s, std_dir_read_round(workspace.path(), "large", LARGE_DIR))
        } else {
            let l = std_dir_read_round(workspace.path(), "large", LARGE_DIR);
            (std_dir_read_round(workspace.path(), "small", SMALL_DIR), l)
        };
        small = small.min(s);
        large = large.min(l);
        ratios.push(l.as_secs_f64() / s.as_secs_f64());
        std_ratios.push(std_l.as_secs_f64() / std_s.as_secs_f64());
    }
    let ratio = median(ratios);
    let std_ratio = median(std_ratios);
    let per_read = |d: Duration| d.as_secs_f64() * 1e6 / DIR_READS as f64;
    println!(
        "confined-fs read by directory size: {SMALL_DIR} entries {:.1} us/read, {LARGE_DIR} entries {:.1} us/read, ratio {ratio:.2} (target <= 1.5; std::fs alone {std_ratio:.2})",
        per_read(small),
        per_read(large),
    );
    record_row(
        &format!(
            "confined-fs {DIR_READS} reads in a {LARGE_DIR}-entry vs a {SMALL_DIR}-entry directory"
        ),
        large.as_secs_f64() * 1000.0,
        small.as_secs_f64() * 1000.0,
        ratio,
        "≤ 1.5",
        ratio <= 1.5,
    );
}

fn main() {
    let workspace = tempfile::tempdir().expect("a temporary directory");
    let root = ConfinedRoot::open(workspace.path()).expect("the root opens");
    let contents = vec![0x5a_u8; FILE_SIZE];
    let mut writes = Summary::new();
    let mut reads = Summary::new();
    for round in 0..ROUNDS {
        // Alternate the order so neither side always runs on a warmer cache.
        if round % 2 == 0 {
            let c = confined_round(&root, round, &contents);
            writes.add(c, std_round(workspace.path(), round, &contents));
            let c = confined_read_round(&root, round);
            reads.add(c, std_read_round(workspace.path(), round));
        } else {
            let p = std_round(workspace.path(), round, &contents);
            writes.add(confined_round(&root, round, &contents), p);
            let p = std_read_round(workspace.path(), round);
            reads.add(confined_read_round(&root, round), p);
        }
    }
    writes.print("writes", 1.3);
    reads.print("reads", 3.0);
    per_read_by_directory_size(&contents);
}
