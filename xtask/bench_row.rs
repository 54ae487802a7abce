//! One row of the `cargo xtask bench` report, appended by a bench binary (this file is compiled
//! into each bench with `#[path]`: the benches live in crates the layering keeps apart, and a row
//! is too small to be a crate of its own). `cargo xtask bench` clears `target/bench/rows.jsonl`
//! before the run and turns its lines into `target/bench/report.json`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where the rows of one `cargo xtask bench` run collect, one JSON object per line.
pub fn rows_file() -> PathBuf {
    // Every bench's crate sits at `crates/<name>`, so the workspace target is two levels up.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench/rows.jsonl")
}

/// Appends one report row `{"name", "ours_ms", "raw_ms", "ratio", "target", "pass"}`; a row that
/// cannot be written is said on stderr and costs the run nothing else.
pub fn record_row(name: &str, ours_ms: f64, raw_ms: f64, ratio: f64, target: &str, pass: bool) {
    let row = serde_json::json!({
        "name": name,
        "ours_ms": (ours_ms * 10.0).round() / 10.0,
        "raw_ms": (raw_ms * 10.0).round() / 10.0,
        "ratio": (ratio * 100.0).round() / 100.0,
        "target": target,
        "pass": pass,
    });
    let path = rows_file();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{row}"));
    if let Err(error) = appended {
        eprintln!("could not record the row {name}: {error}");
    }
}

/// The median of `values` (the mean of the middle two when their number is even).
pub fn median(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "no rounds measured");
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
