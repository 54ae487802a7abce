//! The cargo subcommands the checks run (cargo-nextest, cargo-fuzz), installed from crates.io
//! once per machine into a cache outside the workspace ([`tools_root`], one install root per
//! tool), so a fresh clone on the same machine finds them. Every `cargo` this xtask starts looks there first
//! ([`crate::process::cargo`]).

use std::path::PathBuf;
use std::process::Stdio;

use clap::ValueEnum;

use crate::error::XtaskError;
use crate::process::{cargo, Workspace};

/// Where tools installed once per machine live (`$XTASK_TOOLS_CACHE`, else
/// `/var/cache/sandboxes-tools`).
const TOOLS_CACHE_ENV: &str = "XTASK_TOOLS_CACHE";
const DEFAULT_TOOLS_CACHE: &str = "/var/cache/sandboxes-tools";

/// The tools cache.
pub fn tools_root() -> PathBuf {
    std::env::var_os(TOOLS_CACHE_ENV)
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TOOLS_CACHE), PathBuf::from)
}

/// The directories that go first on the `PATH` of every cargo this xtask starts: each tool's
/// `bin`, then the cache's own `bin` (where earlier runs installed cargo-fuzz).
pub fn bin_dirs() -> Vec<PathBuf> {
    let root = tools_root();
    [Tool::Nextest, Tool::Fuzz]
        .iter()
        .map(|tool| tool.install_root().join("bin"))
        .chain(std::iter::once(root.join("bin")))
        .collect()
}

/// A cargo subcommand a check needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tool {
    /// `cargo nextest` (crate cargo-nextest): the unit and live suites.
    Nextest,
    /// `cargo fuzz` (crate cargo-fuzz): the fuzz targets.
    Fuzz,
}

impl Tool {
    fn subcommand(self) -> &'static str {
        match self {
            Tool::Nextest => "nextest",
            Tool::Fuzz => "fuzz",
        }
    }

    fn krate(self) -> &'static str {
        match self {
            Tool::Nextest => "cargo-nextest",
            Tool::Fuzz => "cargo-fuzz",
        }
    }

    /// A root of its own per tool: the `ci` lanes install two tools at once on a fresh machine,
    /// and two `cargo install`s never share one root's metadata.
    fn install_root(self) -> PathBuf {
        tools_root().join(self.krate())
    }
}

/// Installs each of `tools` (every one when empty) into the tools cache unless `cargo <tool>
/// --version` already answers (from `PATH` or the cache).
pub fn ensure(workspace: &Workspace, tools: &[Tool]) -> Result<(), XtaskError> {
    let all = [Tool::Nextest, Tool::Fuzz];
    let tools = if tools.is_empty() { &all[..] } else { tools };
    for tool in tools {
        let present = cargo()
            .args([tool.subcommand(), "--version"])
            .current_dir(workspace.root())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if present {
            eprintln!("==> tools: cargo {} is installed", tool.subcommand());
            continue;
        }
        let root = tool.install_root();
        eprintln!(
            "==> tools: cargo {} is not installed; installing {} into {}",
            tool.subcommand(),
            tool.krate(),
            root.display()
        );
        workspace.run(
            cargo()
                .args(["install", tool.krate(), "--locked", "--root"])
                .arg(&root),
        )?;
    }
    Ok(())
}
