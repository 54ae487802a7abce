//! Writing 1,000 files of 4 KiB through `ConfinedRoot::write`, against plain `std::fs` writes
//! with the same temporary-file-and-rename pattern. Each round times both back to back; the line
//! printed gives the best time of each and the median of the per-round ratios, which resists the
//! noise of a shared machine better than a ratio of two independent minima.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use confined_fs::ConfinedRoot;

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

fn main() {
    let workspace = tempfile::tempdir().expect("a temporary directory");
    let root = ConfinedRoot::open(workspace.path()).expect("the root opens");
    let contents = vec![0x5a_u8; FILE_SIZE];
    let mut confined = Duration::MAX;
    let mut plain = Duration::MAX;
    let mut ratios = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        // Alternate the order so neither side always runs on a warmer cache.
        let (confined_time, plain_time) = if round % 2 == 0 {
            let c = confined_round(&root, round, &contents);
            (c, std_round(workspace.path(), round, &contents))
        } else {
            let p = std_round(workspace.path(), round, &contents);
            (confined_round(&root, round, &contents), p)
        };
        confined = confined.min(confined_time);
        plain = plain.min(plain_time);
        ratios.push(confined_time.as_secs_f64() / plain_time.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "confined-fs writes: {FILES} files x {} KiB: confined {:.1} ms, std {:.1} ms, ratio {:.2}",
        FILE_SIZE / 1024,
        ms(confined),
        ms(plain),
        ratios[ROUNDS / 2]
    );
}
