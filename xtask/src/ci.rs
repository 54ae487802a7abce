//! `cargo xtask ci`: every check CI runs, as one table of steps ([`STEPS`]) run on lanes.
//!
//! A step names its lane and the steps it waits for. Steps of one lane run one at a time in
//! table order; lanes run beside each other. The `workspace` lane holds every step that builds
//! in the workspace's own target directory (cargo would serialise them on its lock anyway) and
//! streams its output; every other lane writes each step's output to `target/ci/<step>.log`
//! (its tail is printed when the step fails). So the image build (mostly debootstrap, waiting
//! on the disk and the mirror), the target checks (their own toolchain root and target
//! directory) and, on a fresh machine, the install of cargo-nextest run while clippy compiles;
//! every step that compiles in the workspace's target directory asks for the one shared build
//! (`live::SHARED_BUILD`), so only clippy and the unit tests compile, and the suites reuse it; the doctests and the docs (the `docs`
//! lane, after the unit tests) build while the Docker suite runs, and the sbx suite runs
//! beside the Docker suite once they are built. Steps of different lanes that build in the
//! workspace's target directory still take turns on cargo's lock while they compile.
//!
//! Adding a suite is one entry: its name, its lane, the xtask or cargo command, and what it
//! waits for (a live suite waits for `images`). A suite that judges the engine's leftovers by
//! difference must not share the engine with another suite that makes the same kind of
//! objects: give it the lane of that suite.
//!
//! The first failure stops the run: no further step starts, and the steps still running are
//! sent SIGTERM and reaped (a grandchild that made a process group of its own, as a bounded
//! command does, ends at its own deadline). The end prints one table: each step's lane, when it
//! started, how long it took and how it ended. Last, whether the run passed or not, the host's
//! temporary directory is compared with what it held before the first step: a new entry with
//! one of the project's prefixes fails the run (`host_temp.rs`).

use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::XtaskError;
use crate::host_temp::TempSnapshot;
use crate::process::{capture_in, cargo, describe, seconds, Workspace};

/// How a step runs.
#[derive(Debug, Clone, Copy)]
pub enum Run {
    /// `cargo` with these arguments.
    Cargo(&'static [&'static str]),
    /// This xtask with these arguments (one of its own commands).
    Xtask(&'static [&'static str]),
    /// A script of the repository (a path from its root), run with `bash`.
    Script(&'static str),
}

/// One entry of the step table.
#[derive(Debug, Clone, Copy)]
pub struct CiStep {
    /// The name in banners, logs and the summary; unique.
    pub name: &'static str,
    /// Steps of one lane run one at a time, in table order.
    pub lane: &'static str,
    /// The command.
    pub run: Run,
    /// Environment variables set for the command.
    pub env: &'static [(&'static str, &'static str)],
    /// Steps (of any lane) that must have passed before this one starts.
    pub after: &'static [&'static str],
    /// Run at the lowest CPU priority (`nice -n 19`): work with time to spare (nothing waits
    /// on it until much later) that would otherwise take the cores from the compiles every
    /// later step waits for.
    pub background: bool,
}

/// The lane whose steps build in the workspace's target directory and stream their output.
pub const WORKSPACE_LANE: &str = "workspace";

const fn step(name: &'static str, lane: &'static str, run: Run) -> CiStep {
    CiStep {
        name,
        lane,
        run,
        env: &[],
        after: &[],
        background: false,
    }
}

impl CiStep {
    const fn env(mut self, env: &'static [(&'static str, &'static str)]) -> CiStep {
        self.env = env;
        self
    }

    const fn after(mut self, after: &'static [&'static str]) -> CiStep {
        self.after = after;
        self
    }

    const fn background(mut self) -> CiStep {
        self.background = true;
        self
    }
}

/// Every step of `ci`.
pub const STEPS: &[CiStep] = &[
    step(
        "fmt",
        WORKSPACE_LANE,
        Run::Cargo(&["fmt", "--all", "--check"]),
    ),
    step("layering", WORKSPACE_LANE, Run::Xtask(&["layering"])),
    // Every publishable crate packaged as `cargo publish` would (versions on internal
    // dependencies, readme, the files each package holds, a lock file per package resolved
    // against the crates.io index and the workspace's own packages): no upload, no credentials,
    // but the index over the network. `--no-verify`: building every crate again from its package
    // would cost minutes of CI's two cores for what clippy and the tests build anyway. A tracked
    // file changed or an untracked one inside a package fails it (no `--allow-dirty`), so it runs
    // at the start, beside the first steps: no step writes into the tree (their output goes under
    // `target/`), and running first keeps it that way even if one ever did. The index is read
    // again for each package: more retries than cargo's default ride out a passing network fault.
    step(
        "package",
        "package",
        Run::Cargo(&["publish", "--workspace", "--dry-run", "--no-verify"]),
    )
    .env(&[("CARGO_NET_RETRY", "10")]),
    // The Debian packages the images, the target checks and the suites use (installed when
    // missing, under CI): first on the images lane, beside the compiles instead of before them.
    step("host tools", "images", Run::Script(".ci/host-tools")).background(),
    // Debootstrap and the static builds of the proxy and the exec init (their own target
    // layout): beside the compiles. Not in the background: a clean clone builds them (release)
    // every time, and the Docker suite needs the images as soon as the unit tests end.
    step("images", "images", Run::Xtask(&["images"])),
    // The static guest agent, the kernel and the ext4 root made from the Debian root `images`
    // just cached: after it on its lane, so debootstrap runs once.
    step("vm image", "images", Run::Xtask(&["images", "vm"])),
    // Its own toolchain root (debootstrap, cached per machine), at the normal priority: it
    // mostly waits on the mirror and the disk, and at the lowest one four compiles on two cores
    // starved it past its deadline on a fresh machine.
    step(
        "toolchain root",
        "targets",
        Run::Xtask(&["check-targets", "--root-only"]),
    )
    .after(&["host tools"]),
    // Its own target directory, cached per machine; nothing waits for it, so on a fresh machine
    // its standard-library builds yield the cores.
    step("check targets", "targets", Run::Xtask(&["check-targets"]))
        .after(&["host tools"])
        .background(),
    // Once per machine, into the tools cache: on a fresh machine it compiles beside clippy
    // instead of before everything.
    step(
        "nextest install",
        "tools",
        Run::Xtask(&["tools", "nextest"]),
    ),
    step(
        "clippy",
        WORKSPACE_LANE,
        Run::Cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    ),
    // The shared build (`live::SHARED_BUILD`, every feature: the live suites, binaries, examples
    // and doc tests below reuse it), without the live test binaries. clippy checks the fuzz
    // targets, a workspace member; `cargo xtask fuzz` builds and runs them.
    step(
        "nextest",
        WORKSPACE_LANE,
        Run::Cargo(&[
            "nextest",
            "run",
            "--workspace",
            "--all-features",
            "-E",
            "not binary(/^live/)",
        ]),
    )
    .after(&["nextest install"]),
    step("e2e docker", WORKSPACE_LANE, Run::Xtask(&["e2e", "docker"])).after(&["images"]),
    // The Docker backend again, every sandbox under gVisor (`runsc`, which `.ci/run` installs
    // and registers): after the Docker suite on its lane, since both judge the engine's
    // workloads by difference and those carry the same labels; the MCP suite beside it judges
    // its own scopes, which both Docker suites leave out.
    step("e2e gvisor", WORKSPACE_LANE, Run::Xtask(&["e2e", "gvisor"])).after(&["images"]),
    // Mutation testing of the lines of the security leaves changed since the last tag (else
    // main's merge base, else the last commit): a survivor not explained on the allow-list
    // fails the run (`mutants.rs`). Nothing to do, no build and no install when none changed
    // (cargo-mutants, a 20-minute compile on a fresh two-core machine, is installed only then);
    // else only the changed lines' mutants, in a target directory of its own, at the lowest
    // priority beside the suites.
    step("mutants", "mutants", Run::Xtask(&["mutants", "--changed"]))
        .after(&["nextest"])
        .background(),
    // Off the workspace lane, so the Docker suite (the longest step) starts right after the
    // unit tests: the doc builds wait for its compile on cargo's lock at most, then build
    // while its tests wait on the engine.
    step(
        "doctests",
        "docs",
        Run::Cargo(&["test", "--doc", "--workspace", "--all-features"]),
    )
    .after(&["nextest"]),
    // Every public item documented, every intra-doc link resolving.
    step(
        "docs",
        "docs",
        Run::Cargo(&["doc", "--workspace", "--no-deps", "--all-features"]),
    )
    .env(&[("RUSTDOCFLAGS", "-D warnings")]),
    // Its leftovers (simulator containers under its own run directory) are disjoint from the
    // Docker suite's, so it runs beside it; it starts once the doc builds are done, so its
    // tests do not run under those compiles.
    step("e2e sbx", "sbx", Run::Xtask(&["e2e", "sbx"])).after(&["images", "docs"]),
    // QEMU guests, not engine objects: its leftovers (QEMU processes and VM directories under
    // its own run directory) are disjoint from both Docker suites'.
    // The driver's and the qemu backend's suites in one nextest run: two tests at once between
    // them (the `vm` test group's two slots), which the run packs, the longest first. The
    // critical path: it starts as soon as the unit tests end, its guests booting beside the
    // doc builds rather than after them.
    step("e2e vms", "vm", Run::Xtask(&["e2e", "vms"])).after(&["vm image", "nextest"]),
    // Judges its leftovers by its own scope prefix and run directory, and the Docker suite
    // leaves its scopes out of its own count, so it runs beside that suite: after the sbx suite
    // on its lane, so the engine serves at most two suites' workloads at once. Its qemu case
    // boots the VM image.
    step("e2e mcp", "sbx", Run::Xtask(&["e2e", "mcp"])).after(&["images", "vm image", "docs"]),
];

/// Runs [`STEPS`].
pub fn run(workspace: &Workspace) -> Result<(), XtaskError> {
    check_table(STEPS)?;
    let log_dir = workspace.target_dir().join("ci");
    std::fs::create_dir_all(&log_dir).map_err(|source| XtaskError::Io {
        action: "creating",
        path: log_dir.display().to_string(),
        source,
    })?;
    let exe = std::env::current_exe().map_err(|source| XtaskError::Spawn {
        command: "the xtask binary's own path".to_owned(),
        source,
    })?;
    crate::live::forget_docker_snapshot(workspace);
    let temp_before = TempSnapshot::take(&std::env::temp_dir())?;
    let ran = schedule(STEPS, |step, children, index| {
        let mut command = match step.run {
            Run::Cargo(args) => {
                let mut command = cargo();
                command.args(args);
                command
            }
            Run::Xtask(args) => {
                let mut command = Command::new(&exe);
                command.args(args);
                command
            }
            Run::Script(path) => {
                let mut command = Command::new("bash");
                command.arg(workspace.root().join(path));
                command
            }
        };
        if step.background {
            command = at_lowest_priority(&command);
        }
        command.envs(step.env.iter().copied());
        let log = (step.lane != WORKSPACE_LANE).then(|| log_dir.join(log_name(step.name)));
        run_child(workspace, step, &mut command, log, (children, index))
    });
    if ran.is_err() {
        stop_left_guests(workspace);
        remove_left_simulator_containers(workspace);
        remove_docker_suite_leftovers(workspace);
    }
    // Judged after every step, passed or not: a failing run must not also leave the host's
    // temporary directory dirty unnoticed.
    let temp_left = temp_before.check_nothing_new();
    match (ran, temp_left) {
        (Err(failed), Err(left)) => {
            eprintln!("==> ci: {left}");
            Err(failed)
        }
        (Err(failed), Ok(())) => Err(failed),
        (Ok(()), left) => {
            if left.is_ok() {
                eprintln!(
                    "==> ci: nothing of the project's left in the host's temporary directory"
                );
            }
            left
        }
    }
}

/// The containers, networks and volumes a failed or stopped Docker suite made: a suite killed
/// mid-run judges nothing, and its idle workloads would stay on the engine (each later run
/// judges by difference, so they would never be named again).
fn remove_docker_suite_leftovers(workspace: &Workspace) {
    remove_engine_objects(
        workspace,
        "what the stopped Docker suite left",
        crate::live::docker_suite_leftovers(workspace),
    );
}

/// The `sbx-sim` containers a failed or stopped sbx or MCP suite left: a suite killed mid-run
/// judges nothing, and the next run's suites would start beside them. Every simulator
/// container whose workspace lies in this checkout's target directory (where both suites put
/// their runs) is removed.
fn remove_left_simulator_containers(workspace: &Workspace) {
    remove_engine_objects(
        workspace,
        "the simulator containers a stopped suite left",
        crate::live::sim_containers_under(workspace, &workspace.target_dir()),
    );
}

/// Removes `listed` (`what` names them in the report): containers first, with their anonymous
/// volumes, then the networks and volumes they held. Every call is bounded; a failure is
/// reported, never fatal (the run has failed already).
fn remove_engine_objects(
    workspace: &Workspace,
    what: &str,
    listed: Result<Vec<crate::live::EngineObject>, XtaskError>,
) {
    let left = match listed {
        Ok(left) => left,
        Err(error) => {
            eprintln!("==> ci: could not list {what}: {error}");
            return;
        }
    };
    if left.is_empty() {
        return;
    }
    let names: Vec<String> = left
        .iter()
        .map(|object| format!("{} {}", object.kind, object.name))
        .collect();
    eprintln!("==> ci: removing {what}: {}", names.join(", "));
    for (kind, remove) in [
        ("container", &["rm", "-f", "-v"][..]),
        ("network", &["network", "rm"][..]),
        ("volume", &["volume", "rm", "-f"][..]),
    ] {
        let ids: Vec<&str> = left
            .iter()
            .filter(|object| object.kind == kind)
            .map(|object| object.id.as_str())
            .collect();
        if ids.is_empty() {
            continue;
        }
        let removed = capture_in(
            workspace.root(),
            Command::new("docker").args(remove).args(&ids),
            Duration::from_secs(60),
        );
        if let Err(error) = removed {
            eprintln!("==> ci: {error}");
        }
    }
}

/// The QEMU guests a failed or stopped suite left running. They are detached by design (another
/// process attaches to them), so a suite killed mid-run cannot stop its own, and each would go
/// on burning a core under the emulator: every QEMU whose VM directory lies in this checkout's
/// target directory, or in an MCP suite's temporary directory, is killed.
fn stop_left_guests(workspace: &Workspace) {
    let mut roots = vec![workspace.target_dir()];
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        roots.extend(
            entries
                .flatten()
                .filter(|entry| {
                    entry
                        .file_name()
                        .to_string_lossy()
                        .starts_with(crate::mcp_suite::TEMP_RUN_PREFIX)
                })
                .map(|entry| entry.path()),
        );
    }
    stop_guests_under(&roots);
}

/// Kills every QEMU (by its process name) whose VM directory lies under one of `roots`.
fn stop_guests_under(roots: &[std::path::PathBuf]) {
    for root in roots {
        for guest in qemu_vm::qemus_under(root) {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", guest.pid));
            if !comm.is_ok_and(|name| name.starts_with("qemu-system")) {
                continue;
            }
            eprintln!(
                "==> ci: stopping the guest {} a stopped suite left ({})",
                guest.pid,
                guest.vm_dir.display()
            );
            let _ = Command::new("kill")
                .args(["-KILL", &guest.pid.to_string()])
                .status();
        }
    }
}

/// `command` run by `nice -n 19`, with its environment.
fn at_lowest_priority(command: &Command) -> Command {
    let mut niced = Command::new("nice");
    niced
        .args(["-n", "19"])
        .arg(command.get_program())
        .args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => niced.env(name, value),
            None => niced.env_remove(name),
        };
    }
    niced
}

/// A step's log file name: its name with spaces as dashes.
fn log_name(name: &str) -> String {
    format!("{}.log", name.replace(' ', "-"))
}

/// Fails on a duplicate name or an `after` naming no step or a later step of its own lane
/// (which could never run).
fn check_table(steps: &[CiStep]) -> Result<(), XtaskError> {
    for (index, step) in steps.iter().enumerate() {
        if steps[..index].iter().any(|other| other.name == step.name) {
            return Err(XtaskError::StepTable {
                step: step.name,
                reason: "the name is used twice",
            });
        }
        for dependency in step.after {
            match steps.iter().position(|other| other.name == *dependency) {
                None => {
                    return Err(XtaskError::StepTable {
                        step: step.name,
                        reason: "it waits for a step that is not in the table",
                    })
                }
                Some(position) if position >= index && steps[position].lane == step.lane => {
                    return Err(XtaskError::StepTable {
                        step: step.name,
                        reason: "it waits for a later step of its own lane",
                    })
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The children of the steps now running, by step index, so a failure can stop them.
#[derive(Debug, Default)]
pub struct Children {
    running: Mutex<Vec<(usize, u32)>>,
    stopping: std::sync::atomic::AtomicBool,
}

impl Children {
    fn add(&self, index: usize, pid: u32) {
        if let Ok(mut running) = self.running.lock() {
            running.push((index, pid));
        }
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn remove(&self, index: usize) {
        if let Ok(mut running) = self.running.lock() {
            running.retain(|(other, _)| *other != index);
        }
    }

    /// Sends SIGTERM to every running step's child and to everything below it; each step's
    /// thread reaps its own child.
    fn stop_all(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let pids: Vec<u32> = self
            .running
            .lock()
            .map(|running| running.iter().map(|(_, pid)| *pid).collect())
            .unwrap_or_default();
        for pid in pids {
            terminate_tree(pid);
        }
    }
}

/// SIGTERM to `root` and every process below it. A step is mostly a shell or `cargo` whose work
/// runs in grandchildren (`apt-get` under `timeout` under the host-tools script): signalling the
/// child alone leaves them running on after the run has ended. The steps stay in xtask's own
/// process group, so a terminal's Ctrl-C still reaches all of them; the tree is read from
/// `/proc` instead, whole, before any member is signalled (a parent that dies first would
/// hand its children to init, out of sight).
fn terminate_tree(root: u32) {
    let tree = tree_below(root, &parent_links());
    let members: Vec<String> = std::iter::once(root)
        .chain(tree)
        .map(|pid| pid.to_string())
        .collect();
    let _ = Command::new("kill")
        .arg("-TERM")
        .args(&members)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Every live process's `(pid, parent pid)`, from `/proc/PID/stat` (empty where there is no
/// procfs: then only the child itself is signalled).
fn parent_links() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parent_in_stat(&stat)?))
        })
        .collect()
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command name, which
/// is in parentheses and may itself hold spaces and parentheses.
fn parent_in_stat(stat: &str) -> Option<u32> {
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The descendants of `root` in `links`, parents before their children.
fn tree_below(root: u32, links: &[(u32, u32)]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in links {
            if ppid == parent && pid != root && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Runs one step's command: streamed when `log` is `None`, else into the log file, whose tail
/// is printed when the step fails.
fn run_child(
    workspace: &Workspace,
    step: &CiStep,
    command: &mut Command,
    log: Option<PathBuf>,
    (children, index): (&Children, usize),
) -> Result<(), XtaskError> {
    let line = describe(command);
    command.current_dir(workspace.root()).stdin(Stdio::null());
    if let Some(path) = &log {
        let file = File::create(path).map_err(|source| XtaskError::Io {
            action: "creating",
            path: path.display().to_string(),
            source,
        })?;
        let copy = file.try_clone().map_err(|source| XtaskError::Io {
            action: "opening",
            path: path.display().to_string(),
            source,
        })?;
        command.stdout(file).stderr(copy);
        eprintln!("$ {line}  (log: {})", path.display());
    } else {
        eprintln!("$ {line}");
    }
    let spawned: std::io::Result<Child> = command.spawn();
    let mut child = spawned.map_err(|source| XtaskError::Spawn {
        command: line.clone(),
        source,
    })?;
    children.add(index, child.id());
    // A failure elsewhere may have been noted between the spawn and the registration.
    if children.stopping() {
        let _ = child.kill();
    }
    let status = child.wait();
    children.remove(index);
    let status = status.map_err(|source| XtaskError::Spawn {
        command: line.clone(),
        source,
    })?;
    if status.success() {
        return Ok(());
    }
    if let Some(path) = &log {
        print_tail(step.name, path);
    }
    Err(XtaskError::CommandFailed {
        command: line,
        status: status.to_string(),
    })
}

/// The panic messages and the last lines of a failed step's log: a failed test's backtrace
/// alone can fill the tail, and its message is what says what failed.
fn print_tail(name: &str, path: &std::path::Path) {
    const TAIL: usize = 60;
    let Ok(file) = File::open(path) else { return };
    let lines: Vec<String> = BufReader::new(file).lines().map_while(Result::ok).collect();
    let panics = panic_messages(&lines);
    if !panics.is_empty() {
        eprintln!("==> ci: {name}: panic messages in {}:", path.display());
        for line in panics {
            eprintln!("  | {line}");
        }
    }
    let start = lines.len().saturating_sub(TAIL);
    eprintln!(
        "==> ci: {name}: last {} line(s) of {}:",
        lines.len() - start,
        path.display()
    );
    for line in &lines[start..] {
        eprintln!("  | {line}");
    }
}

/// The lines from each `panicked at` to the backtrace that follows it (at most 20 lines of a
/// message, at most 8 panics).
fn panic_messages(lines: &[String]) -> Vec<&str> {
    const MESSAGE_LINES: usize = 20;
    const PANICS: usize = 8;
    let mut out = Vec::new();
    let starts = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.contains("panicked at"))
        .map(|(index, _)| index)
        .take(PANICS);
    for start in starts {
        let message = lines[start..]
            .iter()
            .take(MESSAGE_LINES)
            .enumerate()
            .take_while(|(offset, line)| {
                *offset == 0
                    || !(line.contains("stack backtrace:")
                        || line.contains("note: run with `RUST_BACKTRACE")
                        || line.contains("panicked at"))
            })
            .map(|(_, line)| line.as_str());
        out.extend(message);
    }
    out
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Running(Duration),
    Passed(Duration, Duration),
    Failed(Duration, Duration),
    /// Ended unsuccessfully after another step's failure stopped it.
    Stopped(Duration, Duration),
    NotRun,
}

/// Runs `steps` on their lanes with `run`, prints the summary table, and fails when a step
/// failed. `run` gets the step and the registry its child goes into (with the step's index).
fn schedule<F>(steps: &[CiStep], run: F) -> Result<(), XtaskError>
where
    F: Fn(&CiStep, &Children, usize) -> Result<(), XtaskError> + Sync,
{
    let started = Instant::now();
    let states = Mutex::new(vec![State::Waiting; steps.len()]);
    let changed = Condvar::new();
    let children = Children::default();
    let mut failed: Option<&'static str> = None;
    std::thread::scope(|scope| {
        let mut guard = states.lock().unwrap_or_else(|poison| poison.into_inner());
        loop {
            for index in 0..steps.len() {
                if guard[index] != State::Waiting {
                    continue;
                }
                if failed.is_some() || !can_ever_start(steps, &guard, index) {
                    guard[index] = State::NotRun;
                    continue;
                }
                if !ready(steps, &guard, index) {
                    continue;
                }
                let at = started.elapsed();
                guard[index] = State::Running(at);
                let step = &steps[index];
                eprintln!();
                eprintln!("{}", "=".repeat(72));
                eprintln!(
                    "==> ci [{}/{}] {} (lane {}, at {})",
                    index + 1,
                    steps.len(),
                    step.name,
                    step.lane,
                    seconds(at)
                );
                eprintln!("{}", "=".repeat(72));
                let (states, changed, children, run) = (&states, &changed, &children, &run);
                scope.spawn(move || {
                    let outcome = run(step, children, index);
                    let took = started.elapsed() - at;
                    let stopped = outcome.is_err() && children.stopping();
                    match &outcome {
                        Ok(()) => eprintln!("==> ci: {} passed in {}", step.name, seconds(took)),
                        Err(_) if stopped => {
                            eprintln!("==> ci: {} stopped after {}", step.name, seconds(took));
                        }
                        Err(error) => eprintln!(
                            "==> ci: {} FAILED after {}: {error}",
                            step.name,
                            seconds(took)
                        ),
                    }
                    let mut states = states.lock().unwrap_or_else(|poison| poison.into_inner());
                    states[index] = match outcome {
                        Ok(()) => State::Passed(at, took),
                        Err(_) if stopped => State::Stopped(at, took),
                        Err(_) => State::Failed(at, took),
                    };
                    changed.notify_all();
                });
            }
            if failed.is_none() {
                if let Some(index) = guard
                    .iter()
                    .position(|state| matches!(state, State::Failed(..)))
                {
                    failed = Some(steps[index].name);
                    children.stop_all();
                    continue;
                }
            }
            if !guard
                .iter()
                .any(|state| matches!(state, State::Waiting | State::Running(_)))
            {
                break;
            }
            guard = changed
                .wait(guard)
                .unwrap_or_else(|poison| poison.into_inner());
        }
    });
    let states = states
        .into_inner()
        .unwrap_or_else(|poison| poison.into_inner());
    print_summary(steps, &states, started.elapsed());
    match failed {
        None => Ok(()),
        Some(step) => Err(XtaskError::StepFailed { suite: "ci", step }),
    }
}

/// Every `after` step passed and every earlier step of the lane has ended.
fn ready(steps: &[CiStep], states: &[State], index: usize) -> bool {
    let step = &steps[index];
    let lane_free = steps[..index]
        .iter()
        .zip(states)
        .filter(|(other, _)| other.lane == step.lane)
        .all(|(_, state)| matches!(state, State::Passed(..)));
    let after_passed = step.after.iter().all(|name| {
        steps
            .iter()
            .zip(states)
            .any(|(other, state)| other.name == *name && matches!(state, State::Passed(..)))
    });
    lane_free && after_passed
}

/// False once a step this one waits for (or an earlier one of its lane) failed or will not run.
fn can_ever_start(steps: &[CiStep], states: &[State], index: usize) -> bool {
    let step = &steps[index];
    let dead = |state: &State| {
        matches!(
            state,
            State::Failed(..) | State::Stopped(..) | State::NotRun
        )
    };
    let lane_dead = steps[..index]
        .iter()
        .zip(states)
        .any(|(other, state)| other.lane == step.lane && dead(state));
    let after_dead = step.after.iter().any(|name| {
        steps
            .iter()
            .zip(states)
            .any(|(other, state)| other.name == *name && dead(state))
    });
    !lane_dead && !after_dead
}

fn print_summary(steps: &[CiStep], states: &[State], wall: Duration) {
    eprintln!();
    eprintln!("{}", "=".repeat(72));
    eprintln!("ci summary (wall {})", seconds(wall));
    eprintln!(
        "  {:<16} {:<10} {:>9} {:>9}  outcome",
        "step", "lane", "start", "took"
    );
    for (step, state) in steps.iter().zip(states) {
        let (start, took, outcome) = match state {
            State::Passed(at, took) => (seconds(*at), seconds(*took), "ok"),
            State::Failed(at, took) => (seconds(*at), seconds(*took), "FAILED"),
            State::Stopped(at, took) => (seconds(*at), seconds(*took), "stopped"),
            State::Running(at) => (seconds(*at), "-".to_owned(), "running"),
            State::Waiting | State::NotRun => ("-".to_owned(), "-".to_owned(), "not run"),
        };
        eprintln!(
            "  {:<16} {:<10} {start:>9} {took:>9}  {outcome}",
            step.name, step.lane
        );
    }
    eprintln!(
        "  {:<16} {:<10} {:>9} {:>9}",
        "total",
        "",
        "",
        seconds(wall)
    );
    eprintln!("{}", "=".repeat(72));
}

#[cfg(test)]
mod tests {
    /// A failed test's message is kept and its backtrace left out, for each panic in the log.
    #[test]
    fn panic_messages_are_the_lines_from_each_panic_to_its_backtrace() {
        let log: Vec<String> = [
            "    PASS [1s] a",
            "thread 'x' panicked at tests/a.rs:27:33:",
            "probe `p` failed: echo exceeded 60 s",
            "stack backtrace:",
            "   0: frame",
            "thread 'y' panicked at tests/b.rs:1:1:",
            "second",
            "note: run with `RUST_BACKTRACE=1`",
            "after",
        ]
        .iter()
        .map(|line| line.to_string())
        .collect();
        assert_eq!(
            panic_messages(&log),
            [
                "thread 'x' panicked at tests/a.rs:27:33:",
                "probe `p` failed: echo exceeded 60 s",
                "thread 'y' panicked at tests/b.rs:1:1:",
                "second",
            ]
        );
        assert!(panic_messages(&log[..1]).is_empty());
    }

    /// A stopped step's grandchildren end with it: the shell's background `sleep` is signalled
    /// too, not left running once the shell is gone.
    #[test]
    fn stopping_a_step_ends_its_grandchildren() {
        let mut step = Command::new("sh")
            .args(["-c", "sleep 300 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(step.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        let children = Children::default();
        children.add(0, step.id());
        children.stop_all();
        step.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The grandchild was reparented when the shell died; once TERM lands it is a zombie of
        // init or gone: either way its stat says so.
        while std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        }) {
            if Instant::now() >= deadline {
                let _ = Command::new("kill").arg(grandchild.to_string()).status();
                panic!("the grandchild sleep runs on");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn the_parent_is_read_past_a_name_with_spaces_and_parentheses() {
        assert_eq!(parent_in_stat("42 (a) b (c)) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (sh) S 1 42"), Some(1));
        assert_eq!(parent_in_stat("garbage"), None);
    }

    #[test]
    fn the_tree_below_a_pid_is_every_descendant_and_nothing_else() {
        let links = [(2, 1), (3, 2), (4, 3), (5, 1), (6, 5), (7, 3)];
        let mut below = tree_below(2, &links);
        below.sort_unstable();
        assert_eq!(below, [3, 4, 7]);
        assert!(tree_below(4, &links).is_empty());
    }

    /// A guest a stopped suite left is killed; a process of another name with the same
    /// directory in its environment is not.
    #[test]
    fn a_left_guest_is_stopped_and_nothing_else() {
        let root = std::env::temp_dir().join(format!("xtask-guests-{}", std::process::id()));
        let vm_dir = root.join("vms-e2e-1").join("vm-0");
        std::fs::create_dir_all(&vm_dir).unwrap();
        // A stand-in whose process name is QEMU's.
        let fake = root.join("qemu-system-x86_64");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let spawn = |program: &std::path::Path| {
            Command::new(program)
                .arg("60")
                .env("TMPDIR", &vm_dir)
                .spawn()
                .unwrap()
        };
        let mut guest = spawn(&fake);
        let mut bystander = spawn(std::path::Path::new("/bin/sleep"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        stop_guests_under(std::slice::from_ref(&root));
        let status = guest.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status:?}"
        );
        assert!(
            bystander.try_wait().unwrap().is_none(),
            "the bystander runs on"
        );
        bystander.kill().unwrap();
        bystander.wait().unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn noop() -> Run {
        Run::Cargo(&[])
    }

    #[test]
    fn the_table_is_consistent() {
        check_table(STEPS).unwrap();
        assert!(STEPS.iter().any(|step| step.lane == WORKSPACE_LANE));
        let bad = [step("a", "x", noop()).after(&["b"]), step("b", "x", noop())];
        assert!(matches!(
            check_table(&bad),
            Err(XtaskError::StepTable { step: "a", .. })
        ));
        let unknown = [step("a", "x", noop()).after(&["zzz"])];
        assert!(check_table(&unknown).is_err());
        let twice = [step("a", "x", noop()), step("a", "y", noop())];
        assert!(check_table(&twice).is_err());
    }

    #[test]
    fn every_step_that_uses_a_host_tool_comes_after_their_install() {
        let position = |name: &str| STEPS.iter().position(|step| step.name == name).unwrap();
        let tools = &STEPS[position("host tools")];
        // Debootstrap, BusyBox, the kernel, QEMU and Python: the images, the target checks'
        // root, and through the images every suite.
        for name in ["images", "vm image", "toolchain root", "check targets"] {
            let step = &STEPS[position(name)];
            let same_lane_later =
                step.lane == tools.lane && position(name) > position("host tools");
            assert!(
                same_lane_later || step.after.contains(&"host tools"),
                "{name}"
            );
        }
        for suite in STEPS.iter().filter(|step| step.name.starts_with("e2e ")) {
            assert!(
                suite.after.contains(&"images") || suite.after.contains(&"vm image"),
                "{}",
                suite.name
            );
        }
    }

    #[test]
    fn a_background_step_runs_its_command_under_nice_with_its_environment() {
        let mut command = Command::new("cargo");
        command
            .args(["build", "-p", "x"])
            .env("A", "1")
            .env_remove("B");
        let niced = at_lowest_priority(&command);
        assert_eq!(niced.get_program(), "nice");
        let args: Vec<&std::ffi::OsStr> = niced.get_args().collect();
        assert_eq!(args, ["-n", "19", "cargo", "build", "-p", "x"]);
        let envs: Vec<_> = niced.get_envs().collect();
        assert!(envs.contains(&(std::ffi::OsStr::new("A"), Some(std::ffi::OsStr::new("1")))));
        assert!(envs.contains(&(std::ffi::OsStr::new("B"), None)));
        // Only work with time to spare runs in the background: never a suite, nor what the
        // workspace lane builds.
        for step in STEPS.iter().filter(|step| step.background) {
            assert!(
                !step.name.starts_with("e2e ") && step.lane != WORKSPACE_LANE,
                "{}",
                step.name
            );
        }
    }

    #[test]
    fn the_packaging_check_starts_with_the_run_and_never_accepts_a_dirty_tree() {
        let position = STEPS
            .iter()
            .position(|step| step.name == "package")
            .unwrap();
        let package = &STEPS[position];
        // Nothing it waits for and nothing before it on its lane: it starts at once, before any
        // other step has had time to write into the tree.
        assert!(package.after.is_empty());
        assert!(STEPS[..position]
            .iter()
            .all(|step| step.lane != package.lane));
        let Run::Cargo(args) = package.run else {
            panic!("the packaging check is a cargo command");
        };
        assert_eq!(args[..2], ["publish", "--workspace"]);
        assert!(args.contains(&"--dry-run"), "{args:?}");
        assert!(!args.contains(&"--allow-dirty"), "{args:?}");
    }

    #[test]
    fn the_gvisor_suite_never_runs_beside_the_docker_suite() {
        // Both judge the engine's workloads by difference: one lane, the Docker suite first.
        let position = |name: &str| STEPS.iter().position(|step| step.name == name).unwrap();
        let (docker, gvisor) = (
            &STEPS[position("e2e docker")],
            &STEPS[position("e2e gvisor")],
        );
        assert_eq!(docker.lane, gvisor.lane);
        assert!(position("e2e docker") < position("e2e gvisor"));
    }

    #[test]
    fn every_suite_that_boots_vms_waits_for_the_vm_image() {
        for name in ["e2e vms", "e2e mcp"] {
            let suite = STEPS.iter().find(|step| step.name == name).unwrap();
            assert!(suite.after.contains(&"vm image"), "{name}");
        }
    }

    #[test]
    fn lanes_run_beside_each_other_and_in_order_within() {
        // "slow" (lane b) must run while "one" and "two" (lane a) run in order; "last" waits
        // for "slow".
        let steps = [
            step("one", "a", noop()),
            step("slow", "b", noop()),
            step("two", "a", noop()),
            step("last", "a", noop()).after(&["slow"]),
        ];
        let order = Mutex::new(Vec::new());
        // "slow" holds its lane until lane a's "two" has ended: that can only happen when the
        // lanes run beside each other (one lane at a time would never end "slow"), and no
        // sleep decides it, so a loaded machine cannot flip the outcome.
        let (two_ended, two_ended_seen) = std::sync::mpsc::channel::<()>();
        let two_ended = Mutex::new(two_ended);
        let two_ended_seen = Mutex::new(two_ended_seen);
        let overlapped = AtomicUsize::new(0);
        schedule(&steps, |step, _, _| {
            order.lock().unwrap().push(format!("start {}", step.name));
            match step.name {
                "slow" => {
                    let seen = two_ended_seen
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(30));
                    if seen.is_ok() {
                        overlapped.fetch_add(1, Ordering::SeqCst);
                    }
                }
                "two" => {
                    order.lock().unwrap().push("end two".to_owned());
                    let _ = two_ended.lock().unwrap().send(());
                    return Ok(());
                }
                _ => {}
            }
            order.lock().unwrap().push(format!("end {}", step.name));
            Ok(())
        })
        .unwrap();
        let order = order.into_inner().unwrap();
        let at = |entry: &str| order.iter().position(|e| e == entry).unwrap();
        assert!(at("end one") < at("start two"));
        assert!(at("end two") < at("start last"));
        assert!(at("end slow") < at("start last"));
        assert!(overlapped.load(Ordering::SeqCst) >= 1, "{order:?}");
    }

    #[test]
    fn a_failure_stops_every_step_not_yet_started() {
        let steps = [
            step("first", "a", noop()),
            step("second", "a", noop()),
            step("third", "a", noop()),
            step("beside", "b", noop()).after(&["second"]),
        ];
        let ran = Mutex::new(Vec::new());
        let error = schedule(&steps, |step, _, _| {
            ran.lock().unwrap().push(step.name);
            if step.name == "second" {
                Err(XtaskError::NoTestSummary {
                    command: "x".into(),
                })
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(
            matches!(error, XtaskError::StepFailed { step: "second", .. }),
            "{error}"
        );
        assert_eq!(ran.into_inner().unwrap(), vec!["first", "second"]);
    }
}
