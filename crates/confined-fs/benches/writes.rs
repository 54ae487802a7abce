//! Writing 1,000 files of 4 KiB through `ConfinedRoot::write`, against plain `std::fs` writes
//! with the same temporary-file-and-rename pattern. Prints the best of several rounds of each.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use confined_fs::ConfinedRoot;

const FILES: usize = 1000;
const FILE_SIZE: usize = 4096;
const ROUNDS: usize = 7;

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
    for round in 0..ROUNDS {
        // Alternate the order so neither side always runs on a warmer cache.
        if round % 2 == 0 {
            confined = confined.min(confined_round(&root, round, &contents));
            plain = plain.min(std_round(workspace.path(), round, &contents));
        } else {
            plain = plain.min(std_round(workspace.path(), round, &contents));
            confined = confined.min(confined_round(&root, round, &contents));
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "confined-fs writes: {FILES} files x {} KiB: confined {:.1} ms, std {:.1} ms, ratio {:.2}",
        FILE_SIZE / 1024,
        ms(confined),
        ms(plain),
        confined.as_secs_f64() / plain.as_secs_f64()
    );
}
