//! `cargo xtask mutants [CRATE…]`: mutation testing of the security crates with cargo-mutants.
//!
//! For each crate, `cargo mutants --package CRATE` builds every mutant of the crate's code in a
//! scratch copy of the workspace and runs the crate's tests (nextest) against it. A mutant no
//! test fails is a survivor: a line whose behaviour nothing pins. The command prints every
//! survivor and fails unless each is on the allow-list, [`ALLOW_LIST`], which may hold only
//! mutants of `Debug`/`Display` text and of constants (whose exact value cannot matter), each
//! under a comment saying why; entries of any other kind, or without a comment, are refused.
//! A mutant whose tests hang until cargo-mutants' timeout counts as detected and is listed.
//!
//! `--changed` (CI's `mutants` step) mutates only the lines of the security leaves
//! ([`CHANGED_CRATES`]) that changed since a base (cargo-mutants' `--in-diff`, one diff per
//! crate): the newest tag reachable from HEAD, else the merge base with `main`, else, on `main`
//! itself, the last commit's parent. A crate whose sources did not change is not built at all,
//! so the step costs nothing when no security leaf changed and a few mutants when one did. A
//! base that cannot be found is an error, never "nothing changed". Its mutants run every test
//! but the live ones, which belong to the suites CI runs beside it.
//!
//! A mutant run kills tests midway, and a killed test leaves what it made in the temporary
//! directory, so each run gets one of its own: as root, a private tmpfs on `/tmp` (a mount
//! namespace of its own, gone with the run); otherwise `TMPDIR` under `target/mutants/`.
//!
//! Every build shares one target directory, `target/mutants/cargo-target`, so dependencies are
//! compiled once across runs; each crate's report is kept in `target/mutants/<crate>/mutants.out`.
//! cargo-mutants is installed with `cargo install` into the tools cache
//! ([`crate::tools::tools_root`]) when `cargo mutants --version` does not answer the major
//! version this module reads the output of ([`TOOL_MAJOR`]), and only when there is a crate to
//! mutate. Every command has
//! a deadline, past which its process group is killed.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, ExitKind};
use clap::Args;
use serde::Deserialize;

use crate::error::XtaskError;
use crate::process::{bounded_runtime, capture_in, cargo, seconds, stream_bounded, Workspace};
use crate::tools::{is_supported_version, Tool, TOOL_MAJOR};

/// The crates mutated when none is named: the ones a security reviewer reads alone.
pub const DEFAULT_CRATES: &[&str] = &["confined-fs", "bounded-process", "exec-wrapper", "sbx-cli"];

/// The security leaves whose changed lines `--changed` mutates (CI's step): the default crates,
/// the one guarded opener of host files, the filtering proxy, and the core's host-path guard.
pub const CHANGED_CRATES: &[&str] = &[
    "confined-fs",
    "bounded-process",
    "exec-wrapper",
    "sbx-cli",
    "host-files",
    "egress-proxy",
    "sandbox-core",
    "host-tools",
];

/// The branch whose merge base `--changed` diffs from when no tag is reachable.
const MAIN_BRANCH: &str = "main";

const GIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The allow-list, from the workspace root.
pub const ALLOW_LIST: &str = "xtask/mutants-allow.txt";

const VERSION_TIMEOUT: Duration = Duration::from_secs(60);
/// A cold `cargo install` on a busy two-core machine has taken over 25 minutes.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(90 * 60);
/// cargo-mutants prints a line or two per mutant; far less than this.
const OUTPUT_BUDGET: usize = 64 * 1024 * 1024;

/// cargo-mutants' exit codes that still mean a complete run: every mutant caught, some missed,
/// some timed out. Anything else (usage error, failing unmutated tests) is a failure.
const COMPLETE_RUN_EXITS: &[i32] = &[0, 2, 3];

/// Arguments of `cargo xtask mutants`.
#[derive(Debug, Args)]
pub struct MutantsArgs {
    /// Crates to mutate; none means confined-fs, bounded-process, exec-wrapper and sbx-cli.
    crates: Vec<String>,
    /// Mutate only this file (a path from the workspace root; repeatable).
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<String>,
    /// Seconds the tests of one mutant may run; by default cargo-mutants derives it from the
    /// unmutated run.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Mutants built and tested at once.
    #[arg(long, default_value_t = 1, value_name = "N")]
    jobs: u32,
    /// Minutes the run of one crate may take before it is killed.
    #[arg(long, default_value_t = 360, value_name = "MINUTES")]
    deadline: u64,
    /// Mutate only the lines of the security leaves changed since a base (cargo-mutants'
    /// `--in-diff`): the newest tag reachable from HEAD, else the merge base with `main`, else
    /// (on `main` itself) HEAD's parent. A crate with no changed source is skipped.
    #[arg(long, conflicts_with_all = ["crates", "files"])]
    changed: bool,
    /// The base `--changed` diffs from, instead of the one it finds.
    #[arg(long, value_name = "REV", requires = "changed")]
    since: Option<String>,
}

/// Runs cargo-mutants on each requested crate, prints the counts and survivors, and fails when a
/// survivor is not on the allow-list.
pub fn run(workspace: &Workspace, args: &MutantsArgs) -> Result<(), XtaskError> {
    let allow_path = workspace.root().join(ALLOW_LIST);
    let allow_text = std::fs::read_to_string(&allow_path).map_err(|source| XtaskError::Io {
        action: "reading",
        path: allow_path.display().to_string(),
        source,
    })?;
    let allow = AllowList::parse(&allow_text)?;
    // Each crate to mutate, with the diff that restricts it (under `--changed`).
    let crates: Vec<(String, Option<PathBuf>)> = if args.changed {
        changed_crates(workspace, args.since.as_deref())?
    } else if args.crates.is_empty() {
        DEFAULT_CRATES
            .iter()
            .map(|name| ((*name).to_owned(), None))
            .collect()
    } else {
        args.crates
            .iter()
            .map(|name| (name.clone(), None))
            .collect()
    };
    if crates.is_empty() {
        eprintln!("==> mutants: no security leaf changed; nothing to mutate");
        return Ok(());
    }
    let runtime = bounded_runtime("cargo-mutants")?;
    ensure_cargo_mutants(workspace, &runtime)?;

    let mut reports = Vec::new();
    for (name, diff) in &crates {
        eprintln!("==> mutants: {name}");
        let started = Instant::now();
        let out_dir = workspace.target_dir().join("mutants").join(name);
        let report_dir = out_dir.join("mutants.out");
        // A run that finds no mutant writes no report: an earlier run's must not stand for it.
        match std::fs::remove_dir_all(&report_dir) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                return Err(XtaskError::Io {
                    action: "removing",
                    path: report_dir.display().to_string(),
                    source,
                })
            }
            _ => {}
        }
        run_crate(workspace, &runtime, args, name, diff.as_deref(), &out_dir)?;
        let report = if diff.is_some() && !report_dir.exists() {
            // Only comments, tests or other lines with no mutant changed.
            eprintln!("==> mutants: {name}: no mutant on the changed lines");
            CrateReport {
                name: name.clone(),
                elapsed: started.elapsed(),
                counts: Counts::default(),
                survivors: Vec::new(),
                timeouts: Vec::new(),
            }
        } else {
            CrateReport::read(workspace, name, &report_dir, started.elapsed())?
        };
        eprint!("{}", report.survivor_listing(&allow));
        reports.push(report);
    }
    eprint!("{}", summary(&reports));
    let whole_crates = args.files.is_empty() && !args.changed;
    for entry in allow.stale(&reports, whole_crates) {
        eprintln!("==> mutants: allow-list entry matched no survivor: {entry}");
    }
    let unexplained: Vec<&Survivor> = reports
        .iter()
        .flat_map(|report| &report.survivors)
        .filter(|survivor| allow.reason(survivor).is_none())
        .collect();
    if unexplained.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Survivors {
            count: unexplained.len(),
            listing: unexplained
                .iter()
                .map(|survivor| format!("  {survivor}"))
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }
}

/// The crates of [`CHANGED_CRATES`] whose sources changed since the base, each with its diff
/// written under `target/mutants/`.
fn changed_crates(
    workspace: &Workspace,
    since: Option<&str>,
) -> Result<Vec<(String, Option<PathBuf>)>, XtaskError> {
    let root = workspace.root();
    let base = match since {
        Some(rev) => git(
            root,
            &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
        )?,
        None => diff_base(root)?,
    };
    let base = base.trim().to_owned();
    eprintln!("==> mutants: the lines changed since {base}");
    let dir = workspace.target_dir().join("mutants");
    std::fs::create_dir_all(&dir).map_err(|source| XtaskError::Io {
        action: "creating",
        path: dir.display().to_string(),
        source,
    })?;
    let mut changed = Vec::new();
    for name in CHANGED_CRATES {
        let sources = format!("crates/{name}/src");
        let diff = git(
            root,
            &["diff", "--no-ext-diff", "--no-color", &base, "--", &sources],
        )?;
        if diff.trim().is_empty() {
            eprintln!("==> mutants: {name}: no change to its sources");
            continue;
        }
        let path = dir.join(format!("{name}.diff"));
        std::fs::write(&path, diff).map_err(|source| XtaskError::Io {
            action: "writing",
            path: path.display().to_string(),
            source,
        })?;
        changed.push(((*name).to_owned(), Some(path)));
    }
    Ok(changed)
}

/// The newest tag reachable from HEAD; else the merge base with [`MAIN_BRANCH`] when HEAD is
/// past it; else (a checkout of main itself) HEAD's parent, the last commit's changes.
fn diff_base(root: &Path) -> Result<String, XtaskError> {
    if let Ok(tag) = git(root, &["describe", "--tags", "--abbrev=0", "HEAD"]) {
        return git(root, &["rev-parse", &format!("{}^{{commit}}", tag.trim())]);
    }
    let head = git(root, &["rev-parse", "HEAD"])?;
    if let Ok(base) = git(root, &["merge-base", "HEAD", MAIN_BRANCH]) {
        if base.trim() != head.trim() {
            return Ok(base);
        }
    }
    git(root, &["rev-parse", "--verify", "HEAD^"])
}

/// `git ARGS` in `root`, its standard output.
fn git(root: &Path, args: &[&str]) -> Result<String, XtaskError> {
    let mut command = std::process::Command::new("git");
    command.args(args).stderr(std::process::Stdio::null());
    capture_in(root, &mut command, GIT_TIMEOUT)
}

/// Installs cargo-mutants unless `cargo mutants --version` answers [`TOOL_MAJOR`].
fn ensure_cargo_mutants(
    workspace: &Workspace,
    runtime: &tokio::runtime::Runtime,
) -> Result<(), XtaskError> {
    let answer = capture_in(
        workspace.root(),
        cargo().args(["mutants", "--version"]),
        VERSION_TIMEOUT,
    );
    if let Ok(version) = &answer {
        if is_supported_version(version) {
            return Ok(());
        }
        eprintln!(
            "==> mutants: `cargo mutants --version` says {:?}; installing version {TOOL_MAJOR}",
            version.trim()
        );
    } else {
        eprintln!("==> mutants: cargo-mutants is not installed; installing it");
    }
    // Into the tools cache, where every later run (and `cargo xtask tools`) finds it.
    let args = [
        "install".to_owned(),
        "cargo-mutants".to_owned(),
        "--locked".to_owned(),
        "--version".to_owned(),
        format!("^{TOOL_MAJOR}"),
        "--root".to_owned(),
        Tool::Mutants.install_root().display().to_string(),
    ];
    let command = cargo_command(workspace, INSTALL_TIMEOUT).args(&args);
    expect_success(
        stream_bounded(runtime, &format!("cargo {}", args.join(" ")), command)?,
        "cargo install cargo-mutants",
        &[0],
    )
    .map(drop)
}

/// `cargo` under a deadline, with this process's environment (cargo needs `PATH`, `HOME`,
/// `RUSTUP_HOME`...), from the workspace root.
fn cargo_command(workspace: &Workspace, timeout: Duration) -> BoundedCommand {
    with_cargo_environment(
        BoundedCommand::new(cargo().get_program(), timeout),
        workspace,
    )
}

/// This process's environment with the `PATH` [`cargo`] gives (the tools cache first, where
/// `cargo xtask tools mutants` installs cargo-mutants), from the workspace root.
fn with_cargo_environment(command: BoundedCommand, workspace: &Workspace) -> BoundedCommand {
    let command = command
        .envs(std::env::vars_os())
        .current_dir(workspace.root())
        .output_budget(OUTPUT_BUDGET);
    let path = cargo()
        .get_envs()
        .find(|(name, _)| *name == "PATH")
        .and_then(|(_, value)| value.map(ToOwned::to_owned));
    match path {
        Some(path) => command.env("PATH", path),
        None => command,
    }
}

/// One `cargo mutants` run over one crate, its report written under `out_dir`.
fn run_crate(
    workspace: &Workspace,
    runtime: &tokio::runtime::Runtime,
    args: &MutantsArgs,
    name: &str,
    diff: Option<&Path>,
    out_dir: &Path,
) -> Result<(), XtaskError> {
    std::fs::create_dir_all(out_dir).map_err(|source| XtaskError::Io {
        action: "creating",
        path: out_dir.display().to_string(),
        source,
    })?;
    let argv = mutants_argv(args, name, diff, out_dir);
    let line = format!(
        "cargo {}",
        argv.iter()
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let deadline = Duration::from_secs(args.deadline.saturating_mul(60));
    // Mutant runs kill tests midway (nextest stops the others once one fails; cargo-mutants
    // kills a run at its timeout), and a killed test leaves what it made in the temporary
    // directory. They get one of their own: as root (CI), a private tmpfs on `/tmp` in a mount
    // namespace of their own, which also holds the files the guest scripts name under `/tmp`
    // and vanishes with the run; else `TMPDIR` under `target/mutants/`.
    let scratch = workspace.target_dir().join("mutants").join("tmp");
    let command = if is_root() {
        with_cargo_environment(BoundedCommand::new("unshare", deadline), workspace)
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                PRIVATE_TMP,
                "sh",
            ])
            .arg(cargo().get_program())
            .args(argv)
            .env("TMPDIR", "/tmp")
    } else {
        std::fs::create_dir_all(&scratch).map_err(|source| XtaskError::Io {
            action: "creating",
            path: scratch.display().to_string(),
            source,
        })?;
        cargo_command(workspace, deadline)
            .args(argv)
            .env("TMPDIR", &scratch)
    };
    let command = command.env(
        "CARGO_TARGET_DIR",
        workspace.target_dir().join("mutants").join("cargo-target"),
    );
    expect_success(
        stream_bounded(runtime, &line, command)?,
        &line,
        COMPLETE_RUN_EXITS,
    )
    .map(drop)
}

/// Mounts a fresh tmpfs on `/tmp` (in the mount namespace `unshare` made) and runs the rest of
/// the arguments.
const PRIVATE_TMP: &str = r#"mount -t tmpfs -o mode=1777 tmpfs /tmp && exec "$@""#;

/// Whether this process runs as root (who may make a mount namespace and mount in it).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

fn mutants_argv(
    args: &MutantsArgs,
    name: &str,
    diff: Option<&Path>,
    out_dir: &Path,
) -> Vec<OsString> {
    let mut argv: Vec<OsString> = ["mutants", "--package", name, "--test-tool", "nextest"]
        .into_iter()
        .map(OsString::from)
        .collect();
    argv.push("--jobs".into());
    argv.push(args.jobs.to_string().into());
    argv.push("--output".into());
    argv.push(out_dir.into());
    if let Some(timeout) = args.timeout {
        argv.push("--timeout".into());
        argv.push(timeout.to_string().into());
    }
    for file in &args.files {
        argv.push("--file".into());
        argv.push(file.into());
    }
    if let Some(diff) = diff {
        argv.push("--in-diff".into());
        argv.push(diff.into());
        // Beside CI's live suites, which judge the engine's objects by difference: the live
        // tests are theirs. A mutant only a live test would catch survives here, and wants a
        // unit test or an explanation.
        argv.extend(["--", "-E", UNIT_TESTS].map(OsString::from));
    }
    argv
}

/// The tests `--changed` runs against each mutant (a nextest filter): every test binary but the
/// live ones.
const UNIT_TESTS: &str = "not binary(/^live/)";

fn expect_success(status: ExitKind, line: &str, accepted: &[i32]) -> Result<i32, XtaskError> {
    match status {
        ExitKind::Exited(code) if accepted.contains(&code) => Ok(code),
        status => Err(XtaskError::CommandFailed {
            command: line.to_owned(),
            status: format!("{status:?}"),
        }),
    }
}

/// The totals cargo-mutants writes to `outcomes.json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
struct Counts {
    total_mutants: u64,
    caught: u64,
    missed: u64,
    unviable: u64,
    timeout: u64,
}

/// A mutant no test failed, as `missed.txt` lists it:
/// `crates/x/src/y.rs:12:5: replace == with != in f`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Survivor {
    /// The mutated file, from the workspace root.
    file: String,
    /// Where in it (informative only: the allow-list ignores it, since lines move).
    line: u32,
    column: u32,
    /// What was mutated, as cargo-mutants names it.
    description: String,
}

impl Survivor {
    fn parse(line: &str) -> Result<Survivor, XtaskError> {
        let malformed = || XtaskError::Malformed {
            what: "a line of cargo-mutants' missed.txt",
        };
        let (location, description) = line.split_once(": ").ok_or_else(malformed)?;
        let mut parts = location.rsplitn(3, ':');
        let column = parts.next().and_then(|n| n.parse().ok());
        let line_number = parts.next().and_then(|n| n.parse().ok());
        let file = parts.next().filter(|file| !file.is_empty());
        match (file, line_number, column) {
            (Some(file), Some(line), Some(column)) if !description.trim().is_empty() => {
                Ok(Survivor {
                    file: file.to_owned(),
                    line,
                    column,
                    description: description.trim().to_owned(),
                })
            }
            _ => Err(malformed()),
        }
    }
}

impl Survivor {
    /// cargo-mutants names no place for a mutant outside any function (`replace * with +`):
    /// when the mutated line lies in a `const` or `static` item of `source`, its name is added
    /// (`replace * with + in const LIMIT`), so an allow-list entry names one constant.
    fn name_its_constant(&mut self, source: &str) {
        if self.description.contains(" in ") || self.description.contains(" -> ") {
            return;
        }
        let lines: Vec<&str> = source.lines().collect();
        let Some(last) = (self.line as usize)
            .checked_sub(1)
            .filter(|i| *i < lines.len())
        else {
            return;
        };
        // The item starts on the mutated line or a few above it (a wrapped initialiser).
        let start = last.saturating_sub(8);
        for index in (start..=last).rev() {
            if let Some(name) = constant_name(lines[index]) {
                self.description = format!("{} in const {name}", self.description);
                return;
            }
            // An item that ends above the mutated line is not the one it lies in.
            if index < last && lines[index].trim_end().ends_with(';') {
                return;
            }
        }
    }
}

/// `pub(crate) const READ_CHUNK: usize = …` → `READ_CHUNK`.
fn constant_name(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    let mut word = words.next()?;
    if word.starts_with("pub") {
        word = words.next()?;
    }
    if word != "const" && word != "static" {
        return None;
    }
    let name = words.next()?.trim_end_matches(':');
    let name = if name == "mut" {
        words.next()?.trim_end_matches(':')
    } else {
        name
    };
    Some(name).filter(|name| !name.is_empty())
}

impl std::fmt::Display for Survivor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.description
        )
    }
}

/// One crate's run: its counts, its survivors and its mutants that timed out.
#[derive(Debug)]
struct CrateReport {
    name: String,
    elapsed: Duration,
    counts: Counts,
    survivors: Vec<Survivor>,
    timeouts: Vec<String>,
}

impl CrateReport {
    /// Reads `outcomes.json`, `missed.txt` and `timeout.txt` from a `mutants.out` directory.
    fn read(
        workspace: &Workspace,
        name: &str,
        dir: &Path,
        elapsed: Duration,
    ) -> Result<CrateReport, XtaskError> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read_to_string(&path).map_err(|source| XtaskError::Io {
                action: "reading",
                path: path.display().to_string(),
                source,
            })
        };
        let counts: Counts =
            serde_json::from_str(&read("outcomes.json")?).map_err(|_| XtaskError::Malformed {
                what: "cargo-mutants' outcomes.json",
            })?;
        let mut survivors = parse_survivors(&read("missed.txt")?)?;
        for survivor in &mut survivors {
            // An unreadable source leaves the description as it is: such a survivor is simply
            // not one the allow-list can take.
            if let Ok(source) = std::fs::read_to_string(workspace.root().join(&survivor.file)) {
                survivor.name_its_constant(&source);
            }
        }
        let timeouts = read("timeout.txt")?
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(str::to_owned)
            .collect();
        if survivors.len() as u64 != counts.missed {
            return Err(XtaskError::Malformed {
                what: "cargo-mutants' output (missed.txt disagrees with outcomes.json)",
            });
        }
        Ok(CrateReport {
            name: name.to_owned(),
            elapsed,
            counts,
            survivors,
            timeouts,
        })
    }

    /// Every survivor with its verdict, then every timeout.
    fn survivor_listing(&self, allow: &AllowList) -> String {
        let mut text = String::new();
        for survivor in &self.survivors {
            let _ = match allow.reason(survivor) {
                Some(reason) => writeln!(text, "  allowed  {survivor}\n           ({reason})"),
                None => writeln!(text, "  SURVIVED {survivor}"),
            };
        }
        for timeout in &self.timeouts {
            let _ = writeln!(text, "  timeout  {timeout} (the tests hung: detected)");
        }
        text
    }
}

fn parse_survivors(missed: &str) -> Result<Vec<Survivor>, XtaskError> {
    missed
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(Survivor::parse)
        .collect()
}

/// The per-crate table: mutants, caught, missed, unviable, timeouts, time.
fn summary(reports: &[CrateReport]) -> String {
    let mut text = format!(
        "\nmutants summary\n  {:<14} {:>7} {:>7} {:>7} {:>9} {:>8} {:>9}\n",
        "crate", "mutants", "caught", "missed", "unviable", "timeout", "time"
    );
    for report in reports {
        let counts = report.counts;
        let _ = writeln!(
            text,
            "  {:<14} {:>7} {:>7} {:>7} {:>9} {:>8} {:>9}",
            report.name,
            counts.total_mutants,
            counts.caught,
            counts.missed,
            counts.unviable,
            counts.timeout,
            seconds(report.elapsed)
        );
    }
    text
}

/// The allow-list: `FILE: DESCRIPTION` lines (a survivor's `missed.txt` line without its line
/// and column), each under a `#` comment block saying why it cannot matter. A blank line ends a
/// comment block; entries right under one block share it.
#[derive(Debug, Default)]
struct AllowList {
    entries: Vec<AllowEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowEntry {
    file: String,
    description: String,
    reason: String,
}

impl std::fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.description)
    }
}

impl AllowList {
    fn parse(text: &str) -> Result<AllowList, XtaskError> {
        let mut entries = Vec::new();
        let mut comment: Vec<&str> = Vec::new();
        let mut after_entry = false;
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let refuse = |why: &str| XtaskError::AllowList {
                line: index + 1,
                reason: why.to_owned(),
            };
            if line.is_empty() {
                comment.clear();
                after_entry = false;
            } else if let Some(text) = line.strip_prefix('#') {
                if after_entry {
                    comment.clear();
                    after_entry = false;
                }
                comment.push(text.trim());
            } else {
                let (file, description) = line
                    .split_once(": ")
                    .filter(|(file, description)| {
                        file.ends_with(".rs") && !description.trim().is_empty()
                    })
                    .ok_or_else(|| refuse("expected `FILE.rs: DESCRIPTION`"))?;
                let reason = comment.join(" ");
                if reason.trim().is_empty() {
                    return Err(refuse("an entry needs a `#` comment above it saying why"));
                }
                let description = description.trim();
                if !is_text_or_constant(description) {
                    return Err(refuse(
                        "only mutants of Debug/Display text or of a constant may be allowed",
                    ));
                }
                entries.push(AllowEntry {
                    file: file.trim().to_owned(),
                    description: description.to_owned(),
                    reason,
                });
                after_entry = true;
            }
        }
        Ok(AllowList { entries })
    }

    /// Why `survivor` is allowed, or `None` when it is not on the list.
    fn reason(&self, survivor: &Survivor) -> Option<&str> {
        self.entries
            .iter()
            .find(|entry| entry.file == survivor.file && entry.description == survivor.description)
            .map(|entry| entry.reason.as_str())
    }

    /// Entries for the crates that were run that matched no survivor (only meaningful when the
    /// whole of each crate was mutated).
    fn stale<'a>(&'a self, reports: &[CrateReport], whole_crates: bool) -> Vec<&'a AllowEntry> {
        if !whole_crates {
            return Vec::new();
        }
        self.entries
            .iter()
            .filter(|entry| {
                reports
                    .iter()
                    .any(|report| entry.file.starts_with(&format!("crates/{}/", report.name)))
            })
            .filter(|entry| {
                !reports
                    .iter()
                    .flat_map(|report| &report.survivors)
                    .any(|survivor| {
                        entry.file == survivor.file && entry.description == survivor.description
                    })
            })
            .collect()
    }
}

/// Whether a mutant description is about a `Debug`/`Display` impl's `fmt` (the whole body
/// replaced, or an operator in it), or sits in a constant named in `SCREAMING_SNAKE_CASE` (see
/// [`Survivor::name_its_constant`]).
fn is_text_or_constant(description: &str) -> bool {
    const FORMAT_TRAITS: &[&str] = &[
        "Debug",
        "Display",
        "fmt::Debug",
        "fmt::Display",
        "std::fmt::Debug",
        "std::fmt::Display",
    ];
    let is_format_fn = |function: &str| {
        FORMAT_TRAITS.iter().any(|name| {
            function
                .strip_prefix("<impl ")
                .and_then(|rest| rest.strip_prefix(name))
                .is_some_and(|rest| rest.starts_with(" for ") && rest.ends_with(">::fmt"))
        })
    };
    let replaced_fn = description
        .strip_prefix("replace ")
        .and_then(|rest| rest.split_once(" -> "))
        .map(|(function, _)| function);
    if let Some(function) = replaced_fn {
        return is_format_fn(function);
    }
    let Some((_, place)) = description.rsplit_once(" in ") else {
        return false;
    };
    let constant = place.strip_prefix("const ").is_some_and(|name| {
        name.starts_with(|c: char| c.is_ascii_uppercase())
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    });
    is_format_fn(place) || constant
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBUG_MUTANT: &str = "replace <impl Debug for BoundedCommand>::fmt -> std::fmt::Result \
                                with Ok(Default::default())";

    fn survivor(file: &str, description: &str) -> Survivor {
        Survivor {
            file: file.to_owned(),
            line: 1,
            column: 1,
            description: description.to_owned(),
        }
    }

    fn report(name: &str, survivors: Vec<Survivor>) -> CrateReport {
        CrateReport {
            name: name.to_owned(),
            elapsed: Duration::from_secs(1),
            counts: Counts::default(),
            survivors,
            timeouts: Vec::new(),
        }
    }

    #[test]
    fn survivors_are_read_from_missed_txt_lines() {
        let missed = format!(
            "crates/exec-wrapper/src/bounded_runner.rs:88:9: {DEBUG_MUTANT}\n\
             crates/confined-fs/src/walk.rs:140:25: replace == with != in Walk::enter\n\n"
        );
        let survivors = parse_survivors(&missed).unwrap();
        assert_eq!(
            survivors,
            vec![
                Survivor {
                    file: "crates/exec-wrapper/src/bounded_runner.rs".into(),
                    line: 88,
                    column: 9,
                    description: DEBUG_MUTANT.into(),
                },
                Survivor {
                    file: "crates/confined-fs/src/walk.rs".into(),
                    line: 140,
                    column: 25,
                    description: "replace == with != in Walk::enter".into(),
                },
            ]
        );
        assert_eq!(
            survivors[1].to_string(),
            "crates/confined-fs/src/walk.rs:140:25: replace == with != in Walk::enter"
        );
    }

    #[test]
    fn a_missed_line_without_a_location_is_malformed_never_skipped() {
        for line in [
            "replace == with != in f",
            "src/lib.rs: replace == with != in f",
            "src/lib.rs:x:3: replace == with != in f",
            ":1:2: replace == with != in f",
            "src/lib.rs:1:2: ",
        ] {
            assert!(
                matches!(Survivor::parse(line), Err(XtaskError::Malformed { .. })),
                "{line}"
            );
        }
    }

    #[test]
    fn counts_come_from_outcomes_json_whatever_else_it_holds() {
        let json = r#"{"outcomes": [{"scenario": "Baseline", "summary": "Success"}],
            "total_mutants": 146, "missed": 25, "caught": 93, "timeout": 0,
            "unviable": 28, "success": 0, "failure": 0}"#;
        let counts: Counts = serde_json::from_str(json).unwrap();
        assert_eq!(
            counts,
            Counts {
                total_mutants: 146,
                caught: 93,
                missed: 25,
                unviable: 28,
                timeout: 0,
            }
        );
    }

    #[test]
    fn an_allowed_survivor_matches_by_file_and_description_not_line() {
        let allow = AllowList::parse(&format!(
            "# header\n\n# Logged for people only; no caller parses it.\n\
             crates/exec-wrapper/src/bounded_runner.rs: {DEBUG_MUTANT}\n"
        ))
        .unwrap();
        let mut moved = survivor("crates/exec-wrapper/src/bounded_runner.rs", DEBUG_MUTANT);
        moved.line = 400;
        assert_eq!(
            allow.reason(&moved),
            Some("Logged for people only; no caller parses it.")
        );
        assert_eq!(
            allow.reason(&survivor("crates/exec-wrapper/src/other.rs", DEBUG_MUTANT)),
            None
        );
        assert_eq!(
            allow.reason(&survivor(
                "crates/exec-wrapper/src/bounded_runner.rs",
                "replace == with != in run_bounded"
            )),
            None
        );
    }

    #[test]
    fn entries_under_one_comment_share_it_and_a_blank_line_ends_it() {
        let allow = AllowList::parse(
            "# Any positive value works.\n\
             crates/a/src/lib.rs: replace * with + in const LIMIT\n\
             crates/a/src/lib.rs: replace * with / in const LIMIT\n\
             # A second reason,\n\
             # over two lines.\n\
             crates/a/src/lib.rs: replace + with - in const GRACE\n",
        )
        .unwrap();
        let reasons: Vec<&str> = allow.entries.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "Any positive value works.",
                "Any positive value works.",
                "A second reason, over two lines."
            ]
        );
        let error = AllowList::parse(
            "# Why.\ncrates/a/src/lib.rs: replace * with + in const LIMIT\n\n\
             crates/a/src/lib.rs: replace * with / in const LIMIT\n",
        )
        .unwrap_err();
        assert!(
            matches!(error, XtaskError::AllowList { line: 4, .. }),
            "{error}"
        );
    }

    #[test]
    fn an_entry_without_a_reason_is_refused() {
        for text in [
            "crates/a/src/lib.rs: replace * with + in const LIMIT\n",
            "#\ncrates/a/src/lib.rs: replace * with + in const LIMIT\n",
        ] {
            let error = AllowList::parse(text).unwrap_err();
            assert!(matches!(error, XtaskError::AllowList { .. }), "{error}");
        }
    }

    #[test]
    fn only_text_and_constants_may_be_allowed() {
        for logic in [
            "replace == with != in run_bounded",
            "replace feed_stdin -> io::Result<()> with Ok(())",
            "replace Error::is_refusal -> bool with true",
            "replace && with || in Walk::enter",
            "delete ! in LIMIT_of_the_walk",
            "replace * with + in LIMIT",
            "replace * with + in const limit",
            "replace * with +",
            "replace <impl Hash for X>::hash with ()",
        ] {
            assert!(!is_text_or_constant(logic), "{logic}");
            let text = format!("# Surely harmless.\ncrates/a/src/lib.rs: {logic}\n");
            assert!(
                matches!(
                    AllowList::parse(&text),
                    Err(XtaskError::AllowList { line: 2, .. })
                ),
                "{logic}"
            );
        }
        for text in [
            DEBUG_MUTANT,
            "replace <impl std::fmt::Display for Stream>::fmt -> std::fmt::Result with Ok(Default::default())",
            "replace * with + in const FAR_FUTURE",
            "replace * with / in const READ_CHUNK_2",
            "replace == with != in <impl fmt::Display for Stream>::fmt",
        ] {
            assert!(is_text_or_constant(text), "{text}");
        }
    }

    #[test]
    fn a_malformed_entry_is_refused() {
        for entry in [
            "no separator here",
            "crates/a/src/lib.rs:",
            "README.md: x in const FOO",
        ] {
            let text = format!("# Why.\n{entry}\n");
            assert!(
                matches!(AllowList::parse(&text), Err(XtaskError::AllowList { .. })),
                "{entry}"
            );
        }
    }

    #[test]
    fn stale_entries_are_those_of_run_crates_that_matched_nothing() {
        let allow = AllowList::parse(
            "# Why.\n\
             crates/a/src/lib.rs: replace * with + in const USED\n\
             crates/a/src/lib.rs: replace * with + in const STALE\n\
             crates/b/src/lib.rs: replace * with + in const NOT_RUN\n",
        )
        .unwrap();
        let reports = [report(
            "a",
            vec![survivor(
                "crates/a/src/lib.rs",
                "replace * with + in const USED",
            )],
        )];
        let stale: Vec<String> = allow
            .stale(&reports, true)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            stale,
            ["crates/a/src/lib.rs: replace * with + in const STALE"]
        );
        assert!(allow.stale(&reports, false).is_empty());
    }

    #[test]
    fn the_listing_marks_each_survivor_allowed_or_not() {
        let allow = AllowList::parse(
            "# Any value works.\ncrates/a/src/lib.rs: replace * with + in const LIMIT\n",
        )
        .unwrap();
        let mut report = report(
            "a",
            vec![
                survivor("crates/a/src/lib.rs", "replace * with + in const LIMIT"),
                survivor("crates/a/src/lib.rs", "replace == with != in check"),
            ],
        );
        report.timeouts = vec!["crates/a/src/lib.rs:3:4: replace loop_forever".into()];
        let listing = report.survivor_listing(&allow);
        assert!(listing.contains("  allowed  crates/a/src/lib.rs:1:1: replace * with + in const LIMIT\n           (Any value works.)\n"), "{listing}");
        assert!(
            listing.contains("  SURVIVED crates/a/src/lib.rs:1:1: replace == with != in check\n"),
            "{listing}"
        );
        assert!(
            listing.contains("  timeout  crates/a/src/lib.rs:3:4: replace loop_forever"),
            "{listing}"
        );
    }

    #[test]
    fn the_summary_has_a_row_per_crate() {
        let mut first = report("confined-fs", Vec::new());
        first.counts = Counts {
            total_mutants: 146,
            caught: 118,
            missed: 0,
            unviable: 28,
            timeout: 0,
        };
        first.elapsed = Duration::from_millis(300_500);
        let table = summary(&[first]);
        let row = table.lines().last().unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["confined-fs", "146", "118", "0", "28", "0", "300.5s"]
        );
    }

    #[test]
    fn a_survivor_in_a_constant_is_named_by_it() {
        let source = "use x;\n\
                      /// Docs.\n\
                      pub const BUDGET: usize = 8 * 1024;\n\
                      pub(crate) static LONG: Duration =\n\
                      \x20   Duration::from_secs(100 * 365);\n\
                      fn f() {}\n";
        let mut first = survivor("crates/a/src/lib.rs", "replace * with +");
        first.line = 3;
        first.name_its_constant(source);
        assert_eq!(first.description, "replace * with + in const BUDGET");
        let mut wrapped = survivor("crates/a/src/lib.rs", "replace * with /");
        wrapped.line = 5;
        wrapped.name_its_constant(source);
        assert_eq!(wrapped.description, "replace * with / in const LONG");
        for (line, description) in [
            (6, "replace * with +"),
            (3, "replace == with != in f"),
            (3, "replace f -> usize with 0"),
            (99, "replace * with +"),
        ] {
            let mut other = survivor("crates/a/src/lib.rs", description);
            other.line = line;
            other.name_its_constant(source);
            assert_eq!(other.description, description, "line {line}");
        }
    }

    #[test]
    fn only_the_supported_major_version_is_used() {
        assert!(is_supported_version("cargo-mutants 27.1.0\n"));
        assert!(!is_supported_version("cargo-mutants 26.2.0"));
        assert!(!is_supported_version("cargo-mutants 270.0.0"));
        assert!(!is_supported_version("error: no such command: `mutants`"));
    }

    #[test]
    fn the_command_line_names_the_package_report_and_options() {
        let args = MutantsArgs {
            crates: Vec::new(),
            files: vec!["crates/e/src/a.rs".into(), "crates/e/src/b.rs".into()],
            timeout: Some(120),
            jobs: 1,
            deadline: 60,
            changed: false,
            since: None,
        };
        let argv: Vec<String> = mutants_argv(&args, "e", None, Path::new("/t/mutants/e"))
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            argv.join(" "),
            "mutants --package e --test-tool nextest --jobs 1 --output /t/mutants/e \
             --timeout 120 --file crates/e/src/a.rs --file crates/e/src/b.rs"
        );
        let diff = Path::new("/t/mutants/e.diff");
        let argv: Vec<String> = mutants_argv(&args, "e", Some(diff), Path::new("/t/mutants/e"))
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        assert!(
            argv.join(" ")
                .ends_with(" --in-diff /t/mutants/e.diff -- -E not binary(/^live/)"),
            "{argv:?}"
        );
    }

    #[test]
    fn only_complete_runs_are_accepted() {
        assert_eq!(
            expect_success(ExitKind::Exited(2), "x", COMPLETE_RUN_EXITS).unwrap(),
            2
        );
        for status in [
            ExitKind::Exited(4),
            ExitKind::Exited(1),
            ExitKind::Signaled(9),
        ] {
            assert!(expect_success(status, "x", COMPLETE_RUN_EXITS).is_err());
        }
    }

    /// A repository of its own: a tag wins; without one, the merge base with main; on main
    /// itself, the last commit's parent.
    #[test]
    fn the_diff_base_is_the_tag_else_the_merge_base_else_the_parent() {
        let repo = tempfile::tempdir().unwrap();
        let root = repo.path();
        let run = |args: &[&str]| {
            let mut command = std::process::Command::new("git");
            command
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args);
            capture_in(root, &mut command, GIT_TIMEOUT)
                .unwrap()
                .trim()
                .to_owned()
        };
        let commit = |message: &str| {
            run(&["commit", "--allow-empty", "-q", "-m", message]);
            run(&["rev-parse", "HEAD"])
        };
        run(&["init", "-q", "-b", MAIN_BRANCH]);
        let first = commit("first");
        let second = commit("second");
        // On main: the parent of HEAD.
        assert_eq!(diff_base(root).unwrap().trim(), first);
        // A branch off main: the merge base, however many commits it has.
        run(&["checkout", "-q", "-b", "topic"]);
        commit("third");
        commit("fourth");
        assert_eq!(diff_base(root).unwrap().trim(), second);
        // A tag reachable from HEAD wins.
        run(&["tag", "v0.1.0", &first]);
        assert_eq!(diff_base(root).unwrap().trim(), first);
        // A repository of one commit has no base at all: an error, never "nothing changed".
        let lone = tempfile::tempdir().unwrap();
        let mut init = std::process::Command::new("git");
        init.args(["init", "-q", "-b", MAIN_BRANCH]);
        capture_in(lone.path(), &mut init, GIT_TIMEOUT).unwrap();
        let mut only = std::process::Command::new("git");
        only.args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "--allow-empty",
            "-q",
            "-m",
            "only",
        ]);
        capture_in(lone.path(), &mut only, GIT_TIMEOUT).unwrap();
        assert!(diff_base(lone.path()).is_err());
    }

    #[test]
    fn the_committed_allow_list_is_well_formed() {
        let workspace = Workspace::locate().unwrap();
        let text = std::fs::read_to_string(workspace.root().join(ALLOW_LIST)).unwrap();
        AllowList::parse(&text).unwrap();
    }
}
