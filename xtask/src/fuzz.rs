//! `cargo xtask fuzz`: the fuzz targets in `fuzz/`, on the stable toolchain.
//!
//! `--sanitizer none` because the address sanitizer needs a nightly compiler. The build-only
//! mode builds the `dev` profile, the fastest to compile; runs use cargo-fuzz's default
//! optimised profile, where the fuzzer gets far more executions per second. `fuzz/` is a
//! workspace member (so `ci`'s clippy checks the targets); its instrumented builds go to
//! `target/fuzz`, apart from the workspace's release builds, which use other flags. cargo-fuzz
//! is installed once per machine, into a cache outside the workspace (see [`crate::tools`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::error::XtaskError;
use crate::process::{capture_in, cargo, run_in, Workspace};
use crate::tools::{self, Tool};

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
    tools::ensure(workspace, &[Tool::Fuzz])?;
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
        return build(&dir, &fuzz_target_dir(workspace), selection, Profile::Dev);
    }
    build(
        &dir,
        &fuzz_target_dir(workspace),
        selection,
        Profile::Release,
    )?;
    for target in &targets {
        eprintln!("==> fuzz: {target} for {} s", args.seconds);
        run_in(
            &dir,
            cargo()
                .args(["fuzz", "run", "--sanitizer", "none", "--target-dir"])
                .arg(fuzz_target_dir(workspace))
                .args([target, "--"])
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

/// Where the instrumented builds go.
fn fuzz_target_dir(workspace: &Workspace) -> PathBuf {
    workspace.target_dir().join("fuzz")
}

/// The targets `cargo fuzz list` names (one per line).
fn list_targets(dir: &Path) -> Result<Vec<String>, XtaskError> {
    let listing = capture_in(
        dir,
        cargo().args(["fuzz", "list"]),
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
fn build(
    dir: &Path,
    target_dir: &Path,
    selection: Selection<'_>,
    profile: Profile,
) -> Result<(), XtaskError> {
    let command = |target: Option<&str>| {
        let mut command = cargo();
        command
            .args(["fuzz", "build", "--sanitizer", "none", "--target-dir"])
            .arg(target_dir);
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
