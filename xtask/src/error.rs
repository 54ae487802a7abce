//! The one error type of xtask.

use std::time::Duration;

/// Why an xtask command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XtaskError {
    /// The workspace root could not be found from this binary's manifest directory.
    #[error("cannot find the workspace root above {manifest_dir}")]
    NoWorkspace {
        /// Where the search started.
        manifest_dir: String,
    },

    /// A child process could not be started.
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    /// A child process exited unsuccessfully.
    #[error("`{command}` failed ({status})")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
    },

    /// A bounded child process ran past its deadline and was killed.
    #[error("`{command}` did not finish within {timeout:?}; it was killed")]
    TimedOut {
        /// The command line.
        command: String,
        /// Its deadline.
        timeout: Duration,
    },

    /// Building the local images failed.
    #[error("building the local images: {0}")]
    Images(#[from] backend_docker::DockerError),
    /// Building the VM image failed.
    #[error("VM image: {0}")]
    VmImage(#[from] qemu_vm::VmError),

    /// A `ci` step failed; the summary above says which.
    #[error("{suite} failed at step `{step}`")]
    StepFailed {
        /// The step sequence (`ci`).
        suite: &'static str,
        /// The failed step.
        step: &'static str,
    },

    /// The `ci` step table is inconsistent.
    #[error("{count} bench row(s) missed their target over the runs' medians: {names}")]
    TargetsMissed {
        /// How many rows.
        count: usize,
        /// Their names, comma-separated.
        names: String,
    },
    #[error("the ci step `{step}` is malformed: {reason}")]
    StepTable {
        /// The step.
        step: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// nextest's closing summary line never appeared, so skips cannot be counted.
    #[error("`{command}` printed no nextest summary line; cannot tell whether tests were skipped")]
    NoTestSummary {
        /// The command line.
        command: String,
    },

    /// A live suite skipped tests: a skip in CI attacked nothing.
    #[error("the live suite skipped {count} test(s): {names}")]
    SkippedTests {
        /// How many nextest counted.
        count: u64,
        /// The skipped tests nextest named.
        names: String,
    },

    /// The engine does not list the runtimes the gVisor suite runs under.
    #[error(
        "the engine lists no runtime {missing}: install gVisor (apt-get install runsc) and \
         register runsc (path /usr/bin/runsc, runtimeArgs [\"--platform=ptrace\", \"--network=none\", \"--file-access=shared\", \
         \"--overlay2=none\"]) and runsc-fake \
         (path runc) in /etc/docker/daemon.json, then send dockerd SIGHUP (.ci/run does this)"
    )]
    MissingRuntimes {
        /// The runtimes missing, comma-separated.
        missing: String,
    },

    /// A live suite left engine objects behind.
    #[error("the live suite left {count} object(s) on the engine:\n{listing}")]
    Leftovers {
        /// How many.
        count: usize,
        /// One line per object: kind, id, name.
        listing: String,
    },

    /// `ci` left entries with one of the project's prefixes in the host's temporary directory.
    #[error("the run left {count} entr(ies) in {dir}:\n{listing}")]
    TempLeftovers {
        /// The temporary directory.
        dir: String,
        /// How many.
        count: usize,
        /// One line per entry: its path.
        listing: String,
    },

    /// `cargo metadata` printed something the layering check cannot read.
    #[error("cannot read `cargo metadata`: {reason}")]
    Metadata {
        /// What did not parse.
        reason: String,
    },

    /// A crate depends on one it may not (`docs/architecture.md#layering-rules`).
    #[error("{count} layering violation(s):\n{listing}")]
    Layering {
        /// How many.
        count: usize,
        /// One line per violation.
        listing: String,
    },

    /// A publishable crate lacks what crates.io needs (`crate::packaging`).
    #[error("{count} packaging problem(s):\n{listing}")]
    Packaging {
        /// How many.
        count: usize,
        /// One line per problem.
        listing: String,
    },

    /// Three or more modules of one crate import each other in a circle (`crate::module_circles`).
    #[error(
        "{count} module circle(s) of three or more; give each module what it owns so the \
         modules form a stack:\n{listing}"
    )]
    ModuleCircles {
        /// How many.
        count: usize,
        /// One line per circle: the crate and the modules in it.
        listing: String,
    },

    /// One type's inherent impls are split across modules of one crate (`crate::split_impls`).
    #[error(
        "{count} type(s) with inherent impls outside the module that defines them; make each \
         part a type of its own that holds what it uses (or, where the split is right, add it to \
         `split_impls::ALLOWED_SPLITS` with the reason):\n{listing}"
    )]
    SplitImpls {
        /// How many.
        count: usize,
        /// One line per split type: the crate, the type and the modules.
        listing: String,
    },

    /// Code comments cite documents outside the repository (`crate::citations`).
    #[error(
        "{} comment line(s) cite a document or a rule number outside the repository; cite \
         docs/<file>.md#<section> or say the rule in place:\n{}",
        .0.len(),
        .0.join("\n")
    )]
    StaleCitations(Vec<String>),

    /// Citations of the repository's documents, or links between them, that do not resolve.
    #[error("citations or links that do not resolve (fix the target or the heading):\n{}", .0.join("\n"))]
    BrokenDocLinks(Vec<String>),

    /// A bounded child process could not run to its end (spawn failure, deadline, output budget).
    #[error("`{command}`: {source}")]
    Bounded {
        /// The command line.
        command: String,
        /// What the runner reported.
        #[source]
        source: bounded_process::Error,
    },

    /// A Python suite failed, skipped a case, printed no result, or left objects on the engine.
    #[error("the {suite} suite: {reason}")]
    PythonSuite {
        /// The suite and backend (`mcp docker`).
        suite: String,
        /// What went wrong.
        reason: String,
    },

    /// A file-system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },

    /// A program xtask needs is not installed.
    #[error("`{program}` is not installed (Debian package `{package}`)")]
    MissingTool {
        /// The program.
        program: String,
        /// The Debian package that provides it.
        package: String,
    },

    /// No Debian mirror was found to bootstrap the target-check toolchain from.
    #[error("the target-check toolchain root: {0}")]
    NoMirror(#[source] backend_docker::DockerError),

    /// A tool printed something xtask cannot read.
    #[error("cannot read {what}")]
    Malformed {
        /// What was read.
        what: &'static str,
    },

    /// Crates listed for the target checks are not in the workspace.
    #[error(
        "the target checks list crates the workspace does not have: {missing} (workspace: {known})"
    )]
    UnknownHostCrates {
        /// The listed crates that are missing.
        missing: String,
        /// The workspace's packages.
        known: String,
    },

    /// Type-checking for other targets failed; the output above names the target and says why.
    #[error("the crates do not type-check (or warn) for one of: {targets}")]
    TargetsFailed {
        /// The targets checked in the failed run.
        targets: String,
    },

    /// Mutants of the security crates survived their tests and are not on the allow-list.
    #[error(
        "{count} mutant(s) survived the tests and are not on xtask/mutants-allow.txt:\n{listing}"
    )]
    Survivors {
        /// How many.
        count: usize,
        /// One line per survivor: file, line, column, what was mutated.
        listing: String,
    },

    /// The mutation-testing allow-list holds an entry it may not.
    #[error("xtask/mutants-allow.txt line {line}: {reason}")]
    AllowList {
        /// The 1-based line.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },

    /// `cargo fuzz list` named no target.
    #[error("`cargo fuzz list` in {dir} named no fuzz target")]
    NoFuzzTargets {
        /// The fuzz directory.
        dir: String,
    },

    /// A requested fuzz target does not exist.
    #[error("no fuzz target named `{name}`; known: {known}")]
    UnknownFuzzTarget {
        /// The requested name.
        name: String,
        /// The known targets.
        known: String,
    },
}
