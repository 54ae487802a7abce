//! `cargo xtask fuzz`: the fuzz targets in `fuzz/`, on the stable toolchain.
//!
//! `--sanitizer none` because the address sanitizer needs a nightly compiler. The build-only
//! mode (what `ci` runs) builds the `dev` profile, the fastest to compile; runs use cargo-fuzz's
//! default optimised profile, where the fuzzer gets far more executions per second. cargo-fuzz
//! is installed once per machine, into a cache outside the workspace (see [`tools_root`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;

use crate::error::XtaskError;
use crate::process::{capture_in, cargo, run_in, Workspace};

/// Arguments of `cargo xtask fuzz`.
#[derive(Debug, Args)]
pub struct FuzzArgs {
    /// Only build the targets (`dev` profile); do not run them.
    #[arg(long)]
    build_only: bool,
    /// How long to run each target.
    #[arg(long, default_value_t = 30, value_name = "N")]
    seconds: u64,
    /// Targets to build and run; none means every target `cargo fuzz list` names.
    targets: Vec<String>,
}

/// Builds (and unless `--build-only`, runs) the requested fuzz targets.
pub fn run(workspace: &Workspace, args: &FuzzArgs) -> Result<(), XtaskError> {
    let dir = fuzz_dir(workspace);
    ensure_cargo_fuzz(workspace)?;
    let known = list_targets(&dir)?;
    for name in &args.targets {
        if !known.contains(name) {
            return Err(XtaskError::UnknownFuzzTarget {
                name: name.clone(),
                known: known.join(", "),
            });
        }
    }
    let (targets, selection) = if args.targets.is_empty() {
        (known, Selection::All)
    } else {
        (args.targets.clone(), Selection::Only(&args.targets))
    };
    if args.build_only {
        return build(&dir, selection, Profile::Dev);
    }
    build(&dir, selection, Profile::Release)?;
    for target in &targets {
        eprintln!("==> fuzz: {target} for {} s", args.seconds);
        run_in(
            &dir,
            cargo_with_tools()
                .args(["fuzz", "run", "--sanitizer", "none", target, "--"])
                .arg(format!("-max_total_time={}", args.seconds)),
        )?;
    }
    Ok(())
}

/// Which targets a build covers.
#[derive(Debug, Clone, Copy)]
enum Selection<'a> {
    All,
    Only(&'a [String]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Dev,
    Release,
}

fn fuzz_dir(workspace: &Workspace) -> PathBuf {
    workspace.root().join("fuzz")
}

/// Where tools installed once per machine live (`$XTASK_TOOLS_CACHE`, else
/// `/var/cache/sandboxes-tools`): outside the workspace, so a fresh clone on the same machine
/// finds them.
const TOOLS_CACHE_ENV: &str = "XTASK_TOOLS_CACHE";
const DEFAULT_TOOLS_CACHE: &str = "/var/cache/sandboxes-tools";

fn tools_root() -> PathBuf {
    std::env::var_os(TOOLS_CACHE_ENV)
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TOOLS_CACHE), PathBuf::from)
}

/// A `cargo` whose `PATH` starts with the tools cache's `bin`, so `cargo fuzz` finds a
/// cargo-fuzz installed there.
fn cargo_with_tools() -> Command {
    let bin = tools_root().join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let joined = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))
        .unwrap_or(path);
    let mut command = cargo();
    command.env("PATH", joined);
    command
}

/// Installs cargo-fuzz from crates.io into the tools cache when `cargo fuzz --version` does not
/// answer (from `PATH` or the cache).
fn ensure_cargo_fuzz(workspace: &Workspace) -> Result<(), XtaskError> {
    let present = cargo_with_tools()
        .args(["fuzz", "--version"])
        .current_dir(workspace.root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if present {
        return Ok(());
    }
    let root = tools_root();
    eprintln!(
        "==> fuzz: cargo-fuzz is not installed; installing it into {}",
        root.display()
    );
    workspace.run(
        cargo()
            .args(["install", "cargo-fuzz", "--locked", "--root"])
            .arg(&root),
    )
}

/// The targets `cargo fuzz list` names (one per line).
fn list_targets(dir: &Path) -> Result<Vec<String>, XtaskError> {
    let listing = capture_in(
        dir,
        cargo_with_tools().args(["fuzz", "list"]),
        Duration::from_secs(120),
    )?;
    let targets = parse_target_list(&listing);
    if targets.is_empty() {
        return Err(XtaskError::NoFuzzTargets {
            dir: dir.display().to_string(),
        });
    }
    eprintln!("==> fuzz targets: {}", targets.join(", "));
    Ok(targets)
}

fn parse_target_list(listing: &str) -> Vec<String> {
    listing
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `cargo fuzz build` takes at most one target: every target in one call when all are wanted,
/// else one call per target.
fn build(dir: &Path, selection: Selection<'_>, profile: Profile) -> Result<(), XtaskError> {
    let command = |target: Option<&str>| {
        let mut command = cargo_with_tools();
        command.args(["fuzz", "build", "--sanitizer", "none"]);
        if profile == Profile::Dev {
            command.arg("--dev");
        }
        command.args(target);
        command
    };
    match selection {
        Selection::All => run_in(dir, &mut command(None)),
        Selection::Only(targets) => targets
            .iter()
            .try_for_each(|target| run_in(dir, &mut command(Some(target)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_list_is_one_name_per_line() {
        assert_eq!(
            parse_target_list("egress_host\n\n  exec_result_parse \n"),
            vec!["egress_host", "exec_result_parse"]
        );
        assert!(parse_target_list("\n").is_empty());
    }
}
