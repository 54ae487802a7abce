//! Project automation, run as `cargo xtask <command>` from anywhere in the workspace.
//!
//! - `ci`: the one test command (formatting, the layering rules, the packaging of every
//!   publishable crate (`cargo publish --workspace --dry-run --no-verify`), clippy, every test through
//!   nextest, doctests, rustdoc with `-D warnings`, the local images (clippy checks the fuzz
//!   targets), the Windows and macOS type checks, the microVM image, the live Docker suite, the live sbx
//!   suite on `sbx-sim`, the live microVM suite under QEMU): one table of steps on lanes that
//!   run beside each other (see `ci.rs`), failing fast, with a table of each step's time at the
//!   end;
//! - `fuzz`: builds the fuzz targets on the stable toolchain and runs each for a while;
//! - `images`: builds the local Docker images (the recipe in `backend_docker`); `images vm`
//!   builds the microVM image (`qemu_vm::ImageRecipe` over the same Debian root, see `vm.rs`);
//! - `e2e docker`: builds the images, runs the live Docker suite, then checks the suite
//!   skipped nothing and left nothing behind on the engine;
//! - `e2e gvisor`: the same Docker suites' conformance and HARDENING runs, and the gVisor tests,
//!   with every sandbox under gVisor (`runsc`, which `.ci/register-gvisor` installs and registers with the
//!   engine); the same checks (not yet a `ci` step: docs/docker-backend.md#gvisor says what
//!   still fails);
//! - `e2e sbx [--sbx-path PATH]`: builds `sbx-sim` (unless a path is given), runs the live sbx
//!   suite against it, then checks the same;
//! - `e2e vm`: builds the microVM image, runs `qemu-vm`'s live tests against real QEMU, then
//!   checks nothing skipped and no QEMU or VM directory of the run is left;
//! - `e2e qemu`: the same for `backend-qemu`'s live tests (its own checks, every conformance
//!   suite it declares with HARDENING and CONFINEMENT, its fault tests);
//! - `e2e vms`: both, in one nextest run that packs their VMs into the two slots (CI's step);
//! - `e2e mcp`: the MCP server through the official Python client (pinned, installed into a
//!   virtual environment under `target/`), over stdio and HTTP, on Docker and `sbx-sim` at
//!   once, and one case end to end on qemu (a VM under emulation where KVM cannot boot); fails
//!   on any failed or skipped case and on anything of its runs left on the engine or the host;
//! - `check-targets`: type-checks the crates a Windows or macOS host builds, for those targets,
//!   with a Debian toolchain in a cached chroot (see `targets.rs`);
//! - `bench`: runs the benchmarks;
//! - `tools [nextest|fuzz|mutants]`: installs cargo-nextest, cargo-fuzz and cargo-mutants into
//!   the tools cache when missing (once per machine; also a `ci` step);
//! - `layering`: checks which crate depends on which, that every publishable crate has the
//!   readme, keywords and categories crates.io takes (`packaging.rs`), and that no code comment
//!   cites a document outside the repository (also a `ci` step);
//! - `mutants [CRATE…]`: mutation-tests the security crates with cargo-mutants and fails on a
//!   survivor that is not on the allow-list (whole crates take hours, see `mutants.rs`);
//!   `mutants --changed` mutates only the security leaves' lines changed since the last tag (else
//!   main's merge base, else the last commit), which is a `ci` step.
//!
//! Every child process's output streams to this process's as it comes; xtask exits non-zero
//! when any step fails. It does not install system packages on the host itself (only into its
//! own toolchain root) or start a Docker engine: `ci`'s `host tools` step runs `.ci/host-tools`,
//! which installs the missing packages under CI only, and `.ci/run` starts the engine before
//! calling `cargo xtask ci`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod bench;
mod ci;
mod citations;
mod doc_links;
mod error;
mod fuzz;
mod host_temp;
mod layering;
mod live;
mod mcp_suite;
mod module_circles;
mod msrv;
mod mutants;
mod packaging;
mod process;
mod split_impls;
mod targets;
mod tools;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::process::Workspace;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Project automation for this workspace")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs every check CI runs (the table in `ci.rs`), independent steps beside each other,
    /// stopping at the first failure, then prints each step's time.
    Ci,
    /// Builds the fuzz targets (stable toolchain, no sanitizer) and runs each for a while.
    Fuzz(fuzz::FuzzArgs),
    /// Builds the local Docker images that are missing (all of them unless tags are given), and
    /// the microVM image when `vm` is named.
    Images {
        /// Tags to build, e.g. `sandbox-base:local`, or `vm` for the microVM image; none means
        /// every Docker image.
        tags: Vec<String>,
    },
    /// Runs a live suite against a real engine.
    E2e {
        #[command(subcommand)]
        suite: live::Suite,
    },
    /// Runs the benchmarks (`--runs N`: each row the median of N runs), prints their reports,
    /// and regenerates the generated section of BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Fails when a crate depends on one it may not (docs/architecture.md#layering-rules), or when
    /// a code comment cites a document outside the repository.
    Layering,
    /// Type-checks the crates a Windows or macOS host builds, for those targets.
    CheckTargets {
        /// Only build the cached toolchain root when it is missing, and check nothing.
        #[arg(long)]
        root_only: bool,
    },
    /// Mutation-tests the security crates; fails on a survivor not on xtask/mutants-allow.txt.
    Mutants(mutants::MutantsArgs),
    /// Installs the cargo subcommands the checks run into the tools cache when missing.
    Tools {
        /// The tools; none means every one.
        #[arg(value_enum)]
        tools: Vec<tools::Tool>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = Workspace::locate().and_then(|workspace| match cli.command {
        Command::Ci => ci::run(&workspace),
        Command::Fuzz(args) => fuzz::run(&workspace, &args),
        Command::Images { tags } => live::build_images(&workspace, &tags),
        // Dispatched here, not in `live`, so the suites' modules import `live` and not the
        // other way round.
        Command::E2e { suite } => match suite {
            live::Suite::Docker => live::docker(&workspace),
            live::Suite::Gvisor => live::gvisor(&workspace),
            live::Suite::Sbx { sbx_path } => live::sbx(&workspace, sbx_path.as_deref()),
            live::Suite::Vm => vm::e2e(&workspace),
            live::Suite::Qemu => vm::e2e_backend(&workspace),
            live::Suite::Vms => vm::e2e_both(&workspace),
            live::Suite::Mcp => mcp_suite::run(&workspace),
        },
        Command::Bench(args) => bench::run(&workspace, &args),
        Command::Layering => layering::run(&workspace),
        Command::CheckTargets { root_only } => targets::run(&workspace, root_only),
        Command::Mutants(args) => mutants::run(&workspace, &args),
        Command::Tools { tools } => tools::ensure(&workspace, &tools),
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            ExitCode::FAILURE
        }
    }
}
