//! One row of the `cargo xtask bench` report, and the statistics every row is made of.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where the rows of one `cargo xtask bench` run collect, one JSON object per line.
pub fn rows_file() -> PathBuf {
    // This crate sits at `crates/paired-bench`, so the workspace target is two levels up.
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
///
/// # Panics
/// When `values` is empty: a row of no rounds is a broken bench, not a number.
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

/// The value at the `p` quantile of `values` (`0.95` for the 95th percentile), the nearest rank.
///
/// # Panics
/// When `values` is empty.
pub fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    assert!(!values.is_empty(), "no rounds measured");
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index.min(values.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
    }

    #[test]
    fn the_percentile_takes_the_nearest_rank() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(values.clone(), 0.95), 19.0);
        assert_eq!(percentile(values, 0.0), 1.0);
    }

    #[test]
    #[should_panic(expected = "no rounds measured")]
    fn no_rounds_is_no_median() {
        median(Vec::new());
    }
}
