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

/// The cargo-mutants major version whose `mutants.out` layout `mutants.rs` reads.
pub const TOOL_MAJOR: &str = "27";

/// `cargo-mutants 27.1.0` → a version `mutants.rs` can read.
pub fn is_supported_version(answer: &str) -> bool {
    answer
        .trim()
        .strip_prefix("cargo-mutants ")
        .and_then(|version| version.split('.').next())
        == Some(TOOL_MAJOR)
}

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
    Tool::ALL
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
    /// `cargo mutants` (crate cargo-mutants, the major version `mutants.rs` reads): the
    /// mutation testing of the security leaves' changed lines.
    Mutants,
}

impl Tool {
    const ALL: [Tool; 3] = [Tool::Nextest, Tool::Fuzz, Tool::Mutants];

    fn subcommand(self) -> &'static str {
        match self {
            Tool::Nextest => "nextest",
            Tool::Fuzz => "fuzz",
            Tool::Mutants => "mutants",
        }
    }

    fn krate(self) -> &'static str {
        match self {
            Tool::Nextest => "cargo-nextest",
            Tool::Fuzz => "cargo-fuzz",
            Tool::Mutants => "cargo-mutants",
        }
    }

    /// The version `cargo install` is asked for, when one is pinned.
    fn version(self) -> Option<String> {
        match self {
            Tool::Mutants => Some(format!("^{TOOL_MAJOR}")),
            Tool::Nextest | Tool::Fuzz => None,
        }
    }

    /// Whether `cargo <tool> --version`'s answer is a version this xtask can use.
    fn accepts(self, answer: &str) -> bool {
        match self {
            Tool::Mutants => is_supported_version(answer),
            Tool::Nextest | Tool::Fuzz => true,
        }
    }

    /// A root of its own per tool: the `ci` lanes install two tools at once on a fresh machine,
    /// and two `cargo install`s never share one root's metadata.
    pub(crate) fn install_root(self) -> PathBuf {
        tools_root().join(self.krate())
    }
}

/// Installs each of `tools` (every one when empty) into the tools cache unless `cargo <tool>
/// --version` already answers (from `PATH` or the cache).
pub fn ensure(workspace: &Workspace, tools: &[Tool]) -> Result<(), XtaskError> {
    let tools = if tools.is_empty() {
        &Tool::ALL[..]
    } else {
        tools
    };
    for tool in tools {
        let present = cargo()
            .args([tool.subcommand(), "--version"])
            .current_dir(workspace.root())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|output| {
                output.status.success() && tool.accepts(&String::from_utf8_lossy(&output.stdout))
            });
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
        let mut install = cargo();
        install
            .args(["install", tool.krate(), "--locked", "--root"])
            .arg(&root);
        if let Some(version) = tool.version() {
            install.args(["--version", &version]);
        }
        workspace.run(&mut install)?;
    }
    Ok(())
}
