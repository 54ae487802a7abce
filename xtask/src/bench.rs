//! `cargo xtask bench`: the benchmarks, each run to the end even when an earlier one misses a
//! target, then a summary of every report line.
//!
//! The confined-fs write-and-read benchmark needs nothing but a file system. The Docker backend's
//! benchmarks (`crates/backend-docker/benches`) need the engine and `sandbox-base:local`, which
//! is built first when missing; each measures the backend against the raw `docker` CLI in the
//! same run (the sbx backend's, `crates/backend-sbx/benches`, against the bare `sbx-sim` CLI and
//! `confined-fs` alone, on the simulator built first; the egress proxy's,
//! `crates/egress-proxy/benches`, a download through the proxy image against the same download
//! made directly, on `sandbox-egress-proxy:local`, built or refreshed first), prints one line per
//! metric (`name: backend X ms, raw Y ms, ratio Z (target ≤ T) PASS|FAIL`; a cost added on top
//! of the same call as an absolute `ours X ms, raw Y ms, added Z ms at p50`) and exits non-zero
//! when a pass/fail target is missed.

use crate::error::XtaskError;
use crate::live::build_images;
use crate::process::{cargo, tee_in, Workspace};

/// One benchmark: a name for the summary and the `cargo` arguments that run it.
struct Bench {
    name: &'static str,
    args: &'static [&'static str],
}

const BENCHES: &[Bench] = &[
    Bench {
        name: "confined-fs writes",
        args: &["bench", "-p", "confined-fs", "--bench", "writes"],
    },
    Bench {
        name: "backend-docker exec",
        args: &[
            "bench",
            "-p",
            "backend-docker",
            "--features",
            "live",
            "--bench",
            "exec",
        ],
    },
    Bench {
        name: "backend-docker acquire",
        args: &[
            "bench",
            "-p",
            "backend-docker",
            "--features",
            "live",
            "--bench",
            "acquire",
        ],
    },
    Bench {
        name: "backend-docker transfer",
        args: &[
            "bench",
            "-p",
            "backend-docker",
            "--features",
            "live",
            "--bench",
            "transfer",
        ],
    },
    Bench {
        name: "sandboxctl per call",
        args: &[
            "bench",
            "-p",
            "sandboxctl",
            "--features",
            "live",
            "--bench",
            "cli",
        ],
    },
    Bench {
        name: "backend-docker stream",
        args: &[
            "bench",
            "-p",
            "backend-docker",
            "--features",
            "live",
            "--bench",
            "stream",
        ],
    },
    Bench {
        name: "backend-sbx on sbx-sim",
        args: &[
            "bench",
            "-p",
            "backend-sbx",
            "--features",
            "live",
            "--bench",
            "sbx",
        ],
    },
    Bench {
        name: "egress proxy download",
        args: &[
            "bench",
            "-p",
            "egress-proxy",
            "--features",
            "live",
            "--bench",
            "proxy",
        ],
    },
];

/// The lines a benchmark prints as its report.
fn is_report_line(line: &str) -> bool {
    line.starts_with("confined-fs writes:")
        || line.starts_with("confined-fs reads:")
        || line.starts_with("flood:")
        || line.starts_with("exec wrapper cost:")
        || (line.contains(": ours ") && line.contains(" ms at p50 "))
        || (line.contains(": backend ") && line.contains(" ms, raw "))
}

/// Runs every benchmark, prints the summary, and fails when any of them failed.
pub fn run(workspace: &Workspace) -> Result<(), XtaskError> {
    build_images(
        workspace,
        &[
            "sandbox-base:local".to_owned(),
            "sbx-sim-shell:local".to_owned(),
            "sandbox-egress-proxy:local".to_owned(),
        ],
    )?;
    // The sbx benchmark drives the simulator's debug build.
    workspace.run(cargo().args(["build", "-p", "sbx-sim"]))?;
    // The Docker benches append one JSON row per line; the run's rows become report.json.
    let bench_dir = workspace.root().join("target/bench");
    let rows = bench_dir.join("rows.jsonl");
    let _ = std::fs::remove_file(&rows);
    let mut outcomes = Vec::with_capacity(BENCHES.len());
    for bench in BENCHES {
        eprintln!();
        eprintln!("==> bench: {}", bench.name);
        let teed = tee_in(workspace.root(), cargo().args(bench.args), is_report_line)?;
        outcomes.push((bench.name, teed));
    }
    eprintln!();
    eprintln!("{}", "=".repeat(72));
    eprintln!("bench summary");
    let mut first_failure = None;
    for (name, teed) in &outcomes {
        let label = if teed.success { "ok" } else { "FAILED" };
        eprintln!("  {label:<8} {name}");
        for line in &teed.kept {
            eprintln!("             {line}");
        }
        if !teed.success {
            eprintln!("             `{}` ended with {}", teed.command, teed.status);
            first_failure.get_or_insert(*name);
        }
    }
    eprintln!("{}", "=".repeat(72));
    let lines = std::fs::read_to_string(&rows).unwrap_or_default();
    let report = report_json(&lines);
    match std::fs::write(bench_dir.join("report.json"), report) {
        Ok(()) => eprintln!(
            "rows written to {}",
            bench_dir.join("report.json").display()
        ),
        Err(error) => eprintln!("could not write target/bench/report.json: {error}"),
    }
    match first_failure {
        None => Ok(()),
        Some(step) => Err(XtaskError::StepFailed {
            suite: "bench",
            step,
        }),
    }
}

/// The rows (one JSON object per line) as one JSON list.
fn report_json(lines: &str) -> String {
    let rows: Vec<&str> = lines
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("[\n  {}\n]\n", rows.join(",\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_one_list() {
        assert_eq!(
            report_json("{\"name\":\"a\"}\n\n{\"name\":\"b\"}\n"),
            "[\n  {\"name\":\"a\"},\n  {\"name\":\"b\"}\n]\n"
        );
    }

    #[test]
    fn report_lines_are_recognised() {
        assert!(is_report_line(
            "exec p50: backend 64.7 ms, raw 52.1 ms, ratio 1.27 (target ≤ 1.10) FAIL [45 rounds]"
        ));
        assert!(is_report_line(
            "confined-fs writes: 1000 files x 4 KiB: confined 80.1 ms, std 60.2 ms, ratio 1.30"
        ));
        assert!(is_report_line(
            "confined-fs reads: 1000 files x 4 KiB: confined 40.1 ms, std 9.2 ms, ratio 4.36"
        ));
        assert!(is_report_line(
            "exec wrapper cost: ours 21.0 ms, raw 17.2 ms, added 3.8 ms at p50 (target ≤ +6 ms) PASS [45 rounds]"
        ));
        assert!(is_report_line(
            "proxy connection setup: ours 2.6 ms, raw 1.9 ms, added 0.7 ms at p50 (target ≤ +5 ms) PASS [30 rounds]"
        ));
        assert!(is_report_line(
            "proxy GET 1 MiB wall: backend 4.2 ms, raw 3.2 ms, ratio 1.31 (target ≤ 1.30) FAIL [30 rounds]"
        ));
        assert!(!is_report_line(
            "     Running benches/exec.rs (target/release/deps/exec)"
        ));
        assert!(!is_report_line("   Compiling backend-docker v0.1.0"));
    }

    #[test]
    fn every_docker_bench_needs_the_live_feature() {
        for bench in BENCHES.iter().filter(|b| {
            ["backend-docker", "sandboxctl", "egress-proxy"]
                .iter()
                .any(|krate| b.args.contains(krate))
        }) {
            assert!(
                bench.args.windows(2).any(|w| w == ["--features", "live"]),
                "{}",
                bench.name
            );
        }
    }
}
