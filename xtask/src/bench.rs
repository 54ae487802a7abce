//! `cargo xtask bench`: the benchmarks, each run to the end even when an earlier one misses a
//! target, then a summary of every report line.
//!
//! The confined-fs write-and-read benchmark needs nothing but a file system. The Docker backend's
//! benchmarks (`crates/backend-docker/benches`) need the engine and `sandbox-base:local`, which
//! is built first when missing; each measures the backend against the raw `docker` CLI in the
//! same run (the sbx backend's, `crates/backend-sbx/benches`, against the bare `sbx-sim` CLI and
//! `confined-fs` alone, on the simulator built first; the egress proxy's,
//! `crates/egress-proxy/benches`, a download through the proxy image against the same download
//! made directly, on `sandbox-egress-proxy:local`, built or refreshed first; the microVM's,
//! `crates/qemu-vm/benches`, boot and exec against bare QEMU on the VM image, built first, with
//! the accelerator in each row; the qemu backend's, `crates/backend-qemu/benches`, cold and warm
//! acquire against the driver's bare boot and attach, exec against `docker exec` on this machine,
//! and 1 KiB and 64 MiB transfers against the driver's own agent calls, on the same image; the
//! MCP server's, `crates/sandbox-mcp/benches`, an exec through
//! the server over stdio against the same exec through the library; the Docker backend under
//! gVisor's, `crates/backend-docker/benches/gvisor.rs`, exec and cold acquire against the raw
//! CLI under `runsc`, and what gVisor costs over runc, reported only), prints one line per
//! metric (`name: backend X ms, raw Y ms, ratio Z (target ≤ T) PASS|FAIL`; a cost added on top
//! of the same call as an absolute `ours X ms, raw Y ms, added Z ms at p50`) and exits non-zero
//! when a pass/fail target is missed.
//!
//! `--runs N` runs every bench N times. The rows each run records (`target/bench/rows.jsonl`)
//! are gathered by name: a row's times and ratio are the medians over the runs, its spread the
//! lowest and highest ratio, and it passes when the median ratio meets a `≤ X` target, or when
//! its median added time meets an `added <= N ms` one (whose rows record the time added as a
//! share of N, and whose report shows the time itself); any other target: when most runs
//! passed. `target/bench/report.json` holds those rows with the
//! machine, the load average before and after, the date and the number of runs; the section of
//! `BENCHMARKS.md` between its generated-section markers is rewritten from it, and everything
//! outside the markers (the hand-written account of what moved each row) is kept as it is.
//! `--report-only` rewrites that section from the last report without running anything. A run
//! of some benches (`--only`) writes its report but leaves `BENCHMARKS.md` alone: the section is
//! one run of every bench.
//!
//! The command fails when a row's median misses its target, or when a bench failed in any run
//! other than by missing a target in that run (it panicked, or exited non-zero with every row
//! it recorded met, or recorded none): a single run's miss is the noise the medians are for.

use std::path::Path;
use std::time::Duration;

use clap::Args;

use crate::error::XtaskError;
use crate::live::build_images;
use crate::process::{capture_in, cargo, tee_in, Workspace};

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Runs of every bench; each row is the median of its runs, with the spread of its ratio.
    #[arg(long, default_value_t = 1, value_name = "N")]
    runs: usize,
    /// Only the benches whose name contains one of these (e.g. `confined-fs`, `egress`).
    #[arg(long, value_name = "NAME")]
    only: Vec<String>,
    /// Rewrites the generated section of BENCHMARKS.md from target/bench/report.json and exits.
    #[arg(long)]
    report_only: bool,
}

/// One benchmark: a name for the summary, its package and bench target, and whether it needs
/// the package's `live` feature (a real engine or QEMU).
struct Bench {
    name: &'static str,
    package: &'static str,
    target: &'static str,
    live: bool,
}

impl Bench {
    const fn new(name: &'static str, package: &'static str, target: &'static str) -> Bench {
        Bench {
            name,
            package,
            target,
            live: true,
        }
    }

    /// The `cargo` arguments that run it.
    fn args(&self) -> Vec<&'static str> {
        let mut args = vec!["bench", "-p", self.package];
        if self.live {
            args.extend(["--features", "live"]);
        }
        args.extend(["--bench", self.target]);
        args
    }
}

const BENCHES: &[Bench] = &[
    Bench {
        live: false,
        ..Bench::new("confined-fs writes and reads", "confined-fs", "writes")
    },
    Bench::new("backend-docker exec", "backend-docker", "exec"),
    Bench::new("backend-docker acquire", "backend-docker", "acquire"),
    Bench::new("backend-docker pool", "backend-docker", "pool"),
    Bench::new("backend-docker host tools", "backend-docker", "host_tools"),
    Bench::new("backend-docker transfer", "backend-docker", "transfer"),
    Bench::new("sandboxctl per call", "sandboxctl", "cli"),
    Bench::new("backend-docker stream", "backend-docker", "stream"),
    Bench::new("backend-docker under gVisor", "backend-docker", "gvisor"),
    Bench::new("backend-sbx on sbx-sim", "backend-sbx", "sbx"),
    Bench::new("vm boot and exec", "qemu-vm", "vm"),
    Bench::new("qemu acquire", "backend-qemu", "acquire"),
    Bench::new("qemu exec", "backend-qemu", "exec"),
    Bench::new("qemu transfer", "backend-qemu", "transfer"),
    Bench::new("mcp exec", "sandbox-mcp", "exec"),
    Bench::new("egress proxy download", "egress-proxy", "proxy"),
];

/// The lines a benchmark prints as its report.
fn is_report_line(line: &str) -> bool {
    line.starts_with("confined-fs writes:")
        || line.starts_with("confined-fs reads:")
        || line.starts_with("confined-fs read by directory size:")
        || line.starts_with("flood:")
        || line.starts_with("exec wrapper cost:")
        || (line.contains(": ours ") && line.contains(" ms at p50 "))
        || (line.contains(": backend ") && line.contains(" ms, raw "))
        || is_panic_line(line)
}

/// A panic's first line: a bench that panicked failed for a reason no median can excuse.
fn is_panic_line(line: &str) -> bool {
    line.contains("panicked at")
}

/// One bench in one run: whether it exited 0, what it printed of note, and the rows it recorded.
struct Step {
    name: &'static str,
    run: usize,
    teed: crate::process::Teed,
    rows: Vec<Row>,
}

impl Step {
    /// Whether a failed exit is explained by a target this run missed (and so judged by the
    /// medians over every run): the bench recorded a missed row and did not panic. A bench that
    /// panicked, or failed with every recorded row met, failed for another reason.
    fn failed_only_by_a_missed_row(&self) -> bool {
        self.rows.iter().any(|row| !row.pass) && !self.teed.kept.iter().any(|l| is_panic_line(l))
    }
}

/// The verdict of a whole `--runs N` bench: the first step that failed other than by a missed
/// row fails it; otherwise every row's median over the runs must meet its target.
fn verdict(steps: &[Step], aggregated: &[Aggregate]) -> Result<(), XtaskError> {
    if let Some(step) = steps
        .iter()
        .find(|step| !step.teed.success && !step.failed_only_by_a_missed_row())
    {
        return Err(XtaskError::StepFailed {
            suite: "bench",
            step: step.name,
        });
    }
    let missed: Vec<&str> = aggregated
        .iter()
        .filter(|row| !row.pass)
        .map(|row| row.name.as_str())
        .collect();
    if missed.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::TargetsMissed {
            count: missed.len(),
            names: missed.join(", "),
        })
    }
}

/// Runs the benchmarks `args` selects `args.runs` times, prints the summary, writes the report
/// and the generated section of `BENCHMARKS.md`, and fails when a bench failed other than by
/// missing a target in one run, or when a row's median over the runs misses its target.
pub fn run(workspace: &Workspace, args: &BenchArgs) -> Result<(), XtaskError> {
    let bench_dir = workspace.root().join("target/bench");
    let report_path = bench_dir.join("report.json");
    if args.report_only {
        let text = std::fs::read_to_string(&report_path).map_err(|source| XtaskError::Io {
            action: "reading",
            path: report_path.display().to_string(),
            source,
        })?;
        let report: serde_json::Value =
            serde_json::from_str(&text).map_err(|_| XtaskError::Malformed {
                what: "target/bench/report.json",
            })?;
        return write_benchmarks_md(workspace, &report);
    }
    let selected: Vec<&Bench> = BENCHES
        .iter()
        .filter(|bench| args.only.is_empty() || args.only.iter().any(|o| bench.name.contains(o)))
        .collect();
    let runs = args.runs.max(1);
    build_images(
        workspace,
        &[
            "sandbox-base:local".to_owned(),
            "sbx-sim-shell:local".to_owned(),
            "sandbox-egress-proxy:local".to_owned(),
        ],
    )?;
    // The VM benchmarks boot the image of QEMU_VM_IMAGE when it names one, else the default
    // one, built first.
    if selected
        .iter()
        .any(|bench| matches!(bench.package, "qemu-vm" | "backend-qemu"))
    {
        crate::vm::given_or_built_image(workspace)?;
    }
    // The sbx benchmark drives the simulator's debug build.
    workspace.run(cargo().args(["build", "-p", "sbx-sim"]))?;
    let load_before = load_average();
    // Each bench appends one JSON row per line; each run's rows are taken before the next.
    let rows = bench_dir.join("rows.jsonl");
    let mut steps: Vec<Step> = Vec::with_capacity(selected.len() * runs);
    for run in 1..=runs {
        let _ = std::fs::remove_file(&rows);
        let mut seen = 0;
        for bench in &selected {
            eprintln!();
            eprintln!("==> bench: {} (run {run} of {runs})", bench.name);
            let teed = tee_in(workspace.root(), cargo().args(bench.args()), is_report_line)?;
            // The rows file gathers the run's rows; this bench's are the ones after the last.
            let mut recorded = parse_rows(&std::fs::read_to_string(&rows).unwrap_or_default());
            let mine = recorded.split_off(seen.min(recorded.len()));
            seen += mine.len();
            steps.push(Step {
                name: bench.name,
                run,
                teed,
                rows: mine,
            });
        }
    }
    eprintln!();
    eprintln!("{}", "=".repeat(72));
    eprintln!("bench summary");
    for step in &steps {
        let label = match (step.teed.success, step.failed_only_by_a_missed_row()) {
            (true, _) => "ok",
            (false, true) => "missed",
            (false, false) => "FAILED",
        };
        eprintln!("  {label:<8} {} (run {})", step.name, step.run);
        for line in &step.teed.kept {
            eprintln!("             {line}");
        }
        if !step.teed.success {
            eprintln!(
                "             `{}` ended with {}",
                step.teed.command, step.teed.status
            );
        }
    }
    let all_rows: Vec<Row> = steps.iter().flat_map(|step| step.rows.clone()).collect();
    let aggregated = aggregate(&all_rows);
    if runs > 1 {
        eprintln!("medians over {runs} runs:");
        for row in &aggregated {
            let (measured, spread) = shown(&row.target, row.ratio, row.ratio_min, row.ratio_max);
            eprintln!(
                "  {:<8} {}: {measured} (spread {spread}, {} runs, target {})",
                if row.pass { "pass" } else { "MISSED" },
                row.name,
                row.runs,
                row.target
            );
        }
    }
    eprintln!("{}", "=".repeat(72));
    let report = serde_json::json!({
        "date": utc_now(workspace),
        "machine": machine(workspace),
        "load_average": { "before": load_before, "after": load_average() },
        "runs": runs,
        "benches": selected.iter().map(|bench| bench.name).collect::<Vec<_>>(),
        "rows": aggregated.iter().map(Aggregate::to_json).collect::<Vec<_>>(),
    });
    let _ = std::fs::create_dir_all(&bench_dir);
    match std::fs::write(&report_path, format!("{report:#}\n")) {
        Ok(()) => eprintln!("rows written to {}", report_path.display()),
        Err(error) => eprintln!("could not write {}: {error}", report_path.display()),
    }
    // The generated section is one run of every bench: a run of some of them (`--only`) would
    // replace every other row with nothing.
    if args.only.is_empty() {
        write_benchmarks_md(workspace, &report)?;
    } else {
        eprintln!(
            "BENCHMARKS.md left as it is: `--only` ran {} of the {} benches (their rows are in {})",
            selected.len(),
            BENCHES.len(),
            report_path.display()
        );
    }
    verdict(&steps, &aggregated)
}

/// One row as a bench recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    name: String,
    ours_ms: f64,
    raw_ms: f64,
    ratio: f64,
    target: String,
    pass: bool,
}

/// The rows (one JSON object per line); a line that is not a row is skipped.
fn parse_rows(lines: &str) -> Vec<Row> {
    lines
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line.trim()).ok())
        .filter_map(|value| {
            Some(Row {
                name: value["name"].as_str()?.to_owned(),
                ours_ms: value["ours_ms"].as_f64()?,
                raw_ms: value["raw_ms"].as_f64()?,
                ratio: value["ratio"].as_f64()?,
                target: value["target"].as_str().unwrap_or("").to_owned(),
                pass: value["pass"].as_bool()?,
            })
        })
        .collect()
}

/// A row over every run that recorded it.
#[derive(Debug, Clone, PartialEq)]
struct Aggregate {
    name: String,
    target: String,
    runs: usize,
    ours_ms: f64,
    raw_ms: f64,
    ratio: f64,
    ratio_min: f64,
    ratio_max: f64,
    pass: bool,
}

impl Aggregate {
    fn to_json(&self) -> serde_json::Value {
        let round = |value: f64, scale: f64| (value * scale).round() / scale;
        serde_json::json!({
            "name": self.name,
            "ours_ms": round(self.ours_ms, 10.0),
            "raw_ms": round(self.raw_ms, 10.0),
            "ratio": round(self.ratio, 100.0),
            "ratio_min": round(self.ratio_min, 100.0),
            "ratio_max": round(self.ratio_max, 100.0),
            "runs": self.runs,
            "target": self.target,
            "pass": self.pass,
        })
    }
}

/// Groups the rows by name, in the order first seen: medians, the ratio's spread, and the verdict.
fn aggregate(rows: &[Row]) -> Vec<Aggregate> {
    let mut names: Vec<&str> = Vec::new();
    for row in rows {
        if !names.contains(&row.name.as_str()) {
            names.push(&row.name);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let runs: Vec<&Row> = rows.iter().filter(|row| row.name == name).collect();
            let values = |pick: fn(&Row) -> f64| runs.iter().map(|row| pick(row)).collect();
            let ratios: Vec<f64> = values(|row| row.ratio);
            let ratio = median(ratios.clone());
            let target = runs[0].target.clone();
            let pass = match (ratio_bound(&target), added_bound(&target)) {
                (Some(bound), _) => ratio <= bound,
                // An added-time row records its time as a share of the bound.
                (None, Some(_)) => ratio <= 1.0,
                (None, None) => runs.iter().filter(|row| row.pass).count() * 2 > runs.len(),
            };
            Aggregate {
                name: name.to_owned(),
                runs: runs.len(),
                ours_ms: median(values(|row| row.ours_ms)),
                raw_ms: median(values(|row| row.raw_ms)),
                ratio,
                ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratio_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                target,
                pass,
            }
        })
        .collect()
}

/// The bound of a plain ratio target (`≤ 1.10`, `<= 3`); `None` for any other kind.
fn ratio_bound(target: &str) -> Option<f64> {
    let rest = target
        .trim()
        .strip_prefix('≤')
        .or_else(|| target.trim().strip_prefix("<="))?;
    rest.trim()
        .parse::<f64>()
        .ok()
        .filter(|bound| bound.is_finite())
}

/// The bound of an added-time target (`added <= 6 ms at p50`), in milliseconds; `None` for any
/// other kind. Such a row's ratio is the time it added divided by this bound.
fn added_bound(target: &str) -> Option<f64> {
    let rest = target.trim().strip_prefix("added")?.trim_start();
    let rest = rest
        .strip_prefix('≤')
        .or_else(|| rest.strip_prefix("<="))?
        .trim_start();
    let (bound, unit) = rest.split_once(' ')?;
    if !unit.starts_with("ms") {
        return None;
    }
    bound
        .trim_start_matches('+')
        .parse::<f64>()
        .ok()
        .filter(|bound| bound.is_finite() && *bound > 0.0)
}

/// A row's median and spread as the summary and the report show them: ratios (`1.13`,
/// `1.04–1.17`), or for an added-time target the time added (`+6.7 ms`, `+3.7 to +10.4 ms`).
fn shown(target: &str, ratio: f64, min: f64, max: f64) -> (String, String) {
    match added_bound(target) {
        Some(bound) => (
            format!("{:+.1} ms", ratio * bound),
            format!("{:+.1} to {:+.1} ms", min * bound, max * bound),
        ),
        None => (format!("{ratio:.2}"), format!("{min:.2}–{max:.2}")),
    }
}

/// The median (the mean of the middle two for an even count); 0 for none.
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `/proc/loadavg`'s three averages, or empty where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn utc_now(workspace: &Workspace) -> String {
    capture_in(
        workspace.root(),
        std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]),
        Duration::from_secs(10),
    )
    .map(|text| text.trim().to_owned())
    .unwrap_or_default()
}

/// Cores, memory, kernel and engine version of this machine.
fn machine(workspace: &Workspace) -> serde_json::Value {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("MemTotal:"))
                .and_then(|line| line.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_owned())
        .unwrap_or_default();
    let docker = capture_in(
        workspace.root(),
        std::process::Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]),
        Duration::from_secs(30),
    )
    .map(|text| text.trim().to_owned())
    .unwrap_or_default();
    serde_json::json!({ "cores": cores, "memory_gib": memory_gib, "kernel": kernel, "docker": docker })
}

/// The markers around the generated section of `BENCHMARKS.md`.
const GENERATED_START: &str =
    "<!-- generated by `cargo xtask bench` from target/bench/report.json; edits here are overwritten -->";
const GENERATED_END: &str = "<!-- end of the generated section -->";

/// Rewrites the generated section of `BENCHMARKS.md` from `report`, keeping the rest.
fn write_benchmarks_md(
    workspace: &Workspace,
    report: &serde_json::Value,
) -> Result<(), XtaskError> {
    let path = workspace.root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path).map_err(|source| XtaskError::Io {
        action: "reading",
        path: path.display().to_string(),
        source,
    })?;
    let updated =
        replace_generated(&text, &render_report(report)).ok_or(XtaskError::Malformed {
            what: "BENCHMARKS.md (no generated-section markers)",
        })?;
    std::fs::write(&path, updated).map_err(|source| XtaskError::Io {
        action: "writing",
        path: path.display().to_string(),
        source,
    })?;
    eprintln!("{} regenerated", display_relative(&path, workspace.root()));
    Ok(())
}

fn display_relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `text` with what lies between the markers replaced by `generated`; `None` without markers.
fn replace_generated(text: &str, generated: &str) -> Option<String> {
    let start = text.find(GENERATED_START)? + GENERATED_START.len();
    let end = start + text[start..].find(GENERATED_END)?;
    Some(format!(
        "{}\n{}\n{}",
        &text[..start],
        generated.trim_end(),
        &text[end..]
    ))
}

/// The generated section: the run's header and one table of its rows.
fn render_report(report: &serde_json::Value) -> String {
    let text = |value: &serde_json::Value| value.as_str().unwrap_or("?").to_owned();
    let machine = &report["machine"];
    let runs = report["runs"].as_u64().unwrap_or(1);
    let mut out = String::new();
    out.push_str("## Latest run\n\n");
    out.push_str(&format!(
        "`cargo xtask bench --runs {runs}` on {}: {} cores, {} GiB, kernel {}, Docker Engine {}; \
         load average (1, 5, 15 min) {} before and {} after the run. Benches run: {}. Each row is the median of its runs; the spread is the \
         lowest and the highest ratio over them. A row whose target is a time added shows that \
         time (ours minus the raw reference, at p50) in place of a ratio.\n\n",
        text(&report["date"]),
        machine["cores"],
        machine["memory_gib"],
        text(&machine["kernel"]),
        text(&machine["docker"]),
        text(&report["load_average"]["before"]),
        text(&report["load_average"]["after"]),
        report["benches"]
            .as_array()
            .map(|names| names.iter().map(text).collect::<Vec<_>>().join(", "))
            .unwrap_or_default(),
    ));
    out.push_str("| row | ours | raw reference | ratio (median) | spread | runs | target | |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for row in report["rows"].as_array().into_iter().flatten() {
        let number = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
        let (ratio, spread) = shown(
            &text(&row["target"]),
            number("ratio"),
            number("ratio_min"),
            number("ratio_max"),
        );
        out.push_str(&format!(
            "| {} | {:.1} ms | {:.1} ms | {ratio} | {spread} | {} | {} | {} |\n",
            text(&row["name"]),
            number("ours_ms"),
            number("raw_ms"),
            row["runs"],
            text(&row["target"]),
            if row["pass"].as_bool() == Some(true) {
                "pass"
            } else {
                "missed"
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, ratio: f64, target: &str, pass: bool) -> String {
        format!(
            "{{\"name\":\"{name}\",\"ours_ms\":{},\"raw_ms\":10.0,\"ratio\":{ratio},\"target\":\"{target}\",\"pass\":{pass}}}\n",
            ratio * 10.0
        )
    }

    /// A step of bench `name` that exited `success`, printed `kept` and recorded `rows`.
    fn step(name: &'static str, success: bool, kept: &[&str], rows: &str) -> Step {
        Step {
            name,
            run: 1,
            teed: crate::process::Teed {
                command: format!("cargo bench {name}"),
                success,
                status: if success {
                    "exit status: 0"
                } else {
                    "exit status: 101"
                }
                .to_owned(),
                kept: kept.iter().map(|line| (*line).to_owned()).collect(),
            },
            rows: parse_rows(rows),
        }
    }

    #[test]
    fn a_run_that_missed_a_row_is_judged_by_the_median_and_anything_else_fails() {
        let missed_once = row("a", 1.4, "≤ 1.3", false);
        let met = [row("a", 1.2, "≤ 1.3", true), row("a", 1.25, "≤ 1.3", true)].concat();
        let rows = [missed_once.clone(), met.clone()].concat();
        let aggregated = aggregate(&parse_rows(&rows));
        // One run missed, the median met: the bench passes.
        let steps = [
            step("x", false, &[], &missed_once),
            step("x", true, &[], &row("a", 1.2, "≤ 1.3", true)),
            step("x", true, &[], &row("a", 1.25, "≤ 1.3", true)),
        ];
        assert!(verdict(&steps, &aggregated).is_ok());
        // A panic fails it even beside a missed row.
        let panicked = [step(
            "x",
            false,
            &["thread 'main' panicked at benches/x.rs:1:1:"],
            &missed_once,
        )];
        assert!(matches!(
            verdict(&panicked, &aggregated),
            Err(XtaskError::StepFailed { step: "x", .. })
        ));
        // So does a failure with every row met, or with no row at all.
        for rows in [met.as_str(), ""] {
            let failed = [step("y", false, &[], rows)];
            assert!(matches!(
                verdict(&failed, &aggregated),
                Err(XtaskError::StepFailed { step: "y", .. })
            ));
        }
        // Every step ran, a median missed: the row is named.
        let over = [row("a", 1.4, "≤ 1.3", false), row("b", 0.9, "≤ 1.0", true)].concat();
        let steps = [step("x", false, &[], &over)];
        let missed = verdict(&steps, &aggregate(&parse_rows(&over))).unwrap_err();
        assert!(
            matches!(&missed, XtaskError::TargetsMissed { count: 1, names } if names == "a"),
            "{missed:?}"
        );
    }

    #[test]
    fn rows_over_runs_become_medians_with_their_spread() {
        let lines = [
            row("a", 1.4, "≤ 1.3", false),
            row("b", 0.5, "≤ +5 ms", true),
            "not a row\n".to_owned(),
            row("a", 1.2, "≤ 1.3", true),
            row("b", 0.7, "≤ +5 ms", false),
            row("a", 1.25, "≤ 1.3", true),
            row("b", 0.6, "≤ +5 ms", true),
        ]
        .concat();
        let rows = parse_rows(&lines);
        assert_eq!(rows.len(), 6);
        let aggregated = aggregate(&rows);
        assert_eq!(aggregated.len(), 2);
        let a = &aggregated[0];
        assert_eq!((a.name.as_str(), a.runs), ("a", 3));
        assert!((a.ratio - 1.25).abs() < 1e-9 && (a.ours_ms - 12.5).abs() < 1e-9);
        assert!((a.ratio_min - 1.2).abs() < 1e-9 && (a.ratio_max - 1.4).abs() < 1e-9);
        // The median ratio meets the bound though one run missed it.
        assert!(a.pass);
        // Not a plain ratio target: most runs passed.
        assert!(aggregated[1].pass);
        let missed = aggregate(&parse_rows(
            &[row("c", 1.5, "≤ 1.3", true), row("c", 1.6, "≤ 1.3", true)].concat(),
        ));
        assert!(!missed[0].pass);
        assert!((missed[0].ratio - 1.55).abs() < 1e-9);
    }

    #[test]
    fn added_time_rows_pass_on_their_median_and_show_the_time() {
        // Ratios are shares of the 6 ms bound: 10.4, 6.1, 7.4, 3.7, 6.7 ms added.
        let lines: String = [1.73, 1.02, 1.23, 0.62, 1.12]
            .iter()
            .map(|ratio| row("wrapper", *ratio, "added <= 6 ms at p50", *ratio <= 1.0))
            .collect();
        let rows = aggregate(&parse_rows(&lines));
        assert!((rows[0].ratio - 1.12).abs() < 1e-9);
        assert!(!rows[0].pass, "6.7 ms at the median is over 6 ms");
        let under: String = [1.2, 0.9, 0.8]
            .iter()
            .map(|ratio| row("setup", *ratio, "added <= 5 ms at p50", false))
            .collect();
        assert!(
            aggregate(&parse_rows(&under))[0].pass,
            "the median, not the runs' verdicts"
        );

        let report = serde_json::json!({
            "rows": rows.iter().map(Aggregate::to_json).collect::<Vec<_>>(),
        });
        let table = render_report(&report);
        assert!(
            table.contains("| +6.7 ms | +3.7 to +10.4 ms | 5 | added <= 6 ms at p50 | missed |"),
            "{table}"
        );
    }

    #[test]
    fn added_bounds_are_read_from_added_time_targets_only() {
        assert_eq!(added_bound("added <= 6 ms at p50"), Some(6.0));
        assert_eq!(added_bound("added ≤ +2 ms at p50"), Some(2.0));
        assert_eq!(added_bound("<= 6"), None);
        assert_eq!(added_bound("added <= 6 MiB"), None);
        assert_eq!(added_bound("added <= 0 ms"), None);
        assert_eq!(added_bound("refused; RSS growth <= 24 MiB"), None);
    }

    #[test]
    fn ratio_bounds_are_read_from_plain_ratio_targets_only() {
        assert_eq!(ratio_bound("≤ 1.10"), Some(1.1));
        assert_eq!(ratio_bound("<= 3"), Some(3.0));
        assert_eq!(ratio_bound("≤ +5 ms"), None);
        assert_eq!(ratio_bound("0 failures, ≤ 1.0"), None);
        assert_eq!(ratio_bound(""), None);
    }

    #[test]
    fn only_the_generated_section_is_rewritten() {
        let text = format!(
            "# Benchmarks\nintro\n{GENERATED_START}\nold table\n{GENERATED_END}\n\n## Prose\nkept\n"
        );
        let updated = replace_generated(&text, "new table\n").unwrap();
        assert_eq!(
            updated,
            format!("# Benchmarks\nintro\n{GENERATED_START}\nnew table\n{GENERATED_END}\n\n## Prose\nkept\n")
        );
        assert_eq!(replace_generated("no markers", "x"), None);
        let report = serde_json::json!({
            "date": "2026-12-01 11:00 UTC",
            "machine": {"cores": 2, "memory_gib": 23.4, "kernel": "6.1", "docker": "20.10.24"},
            "load_average": {"before": "1.0 2.0 3.0", "after": "4.0 5.0 6.0"},
            "runs": 5,
            "benches": ["x"],
            "rows": [aggregate(&parse_rows(&row("a", 1.2, "≤ 1.3", true)))[0].to_json()],
        });
        let rendered = render_report(&report);
        assert!(
            rendered.contains("--runs 5` on 2026-12-01 11:00 UTC: 2 cores, 23.4 GiB"),
            "{rendered}"
        );
        assert!(
            rendered.contains("1.0 2.0 3.0 before and 4.0 5.0 6.0 after"),
            "{rendered}"
        );
        assert!(
            rendered.contains("| a | 12.0 ms | 10.0 ms | 1.20 | 1.20–1.20 | 1 | ≤ 1.3 | pass |"),
            "{rendered}"
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
        assert!(is_report_line(
            "vm boot [tcg]: backend 13506.9 ms, raw 15477.3 ms, ratio 0.87 (target ≤ 1.20) PASS [3 rounds]"
        ));
        assert!(is_report_line(
            "vm exec [tcg]: ours 204.7 ms, raw 3.3 ms, added 201.4 ms at p50 (target ≤ +2 ms) FAIL [30 rounds]"
        ));
        assert!(is_report_line(
            "qemu cold acquire [tcg]: backend 7012.3 ms, raw 6120.8 ms, ratio 1.15 (target ≤ 1.30) PASS [5 rounds; raw: the bare boot]"
        ));
        assert!(is_report_line(
            "qemu warm acquire [tcg]: ours 0.41 ms at p50 (target ≤ 5 ms) PASS, raw 0.09 ms [41 rounds; raw: Vm::attach]"
        ));
        assert!(is_report_line(
            "qemu exec p50 [tcg]: backend 120.4 ms, raw 80.2 ms, ratio 1.50 (reported only: TCG) [30 rounds; raw: docker exec]"
        ));
        assert!(!is_report_line(
            "     Running benches/exec.rs (target/release/deps/exec)"
        ));
        assert!(!is_report_line("   Compiling backend-docker v0.1.0"));
    }

    #[test]
    fn a_bench_runs_its_package_and_target_with_the_live_feature_when_it_needs_it() {
        let live = Bench::new("n", "backend-docker", "exec");
        assert_eq!(
            live.args(),
            [
                "bench",
                "-p",
                "backend-docker",
                "--features",
                "live",
                "--bench",
                "exec"
            ]
        );
        let plain = Bench {
            live: false,
            ..Bench::new("n", "confined-fs", "writes")
        };
        assert_eq!(
            plain.args(),
            ["bench", "-p", "confined-fs", "--bench", "writes"]
        );
    }

    #[test]
    fn every_docker_bench_needs_the_live_feature() {
        for bench in BENCHES.iter().filter(|b| {
            [
                "backend-docker",
                "sandboxctl",
                "egress-proxy",
                "qemu-vm",
                "backend-qemu",
                "sandbox-mcp",
            ]
            .contains(&b.package)
        }) {
            assert!(bench.live, "{}", bench.name);
            assert!(
                bench.args().windows(2).any(|w| w == ["--features", "live"]),
                "{}",
                bench.name
            );
        }
    }
}
