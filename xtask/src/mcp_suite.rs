//! `cargo xtask e2e mcp`: the MCP server end to end, through a client no one here wrote.
//!
//! The suite (`tests/mcp-python`) drives the real `sandbox-mcp` binary with the
//! official `mcp` Python package over stdio and Streamable HTTP. This module:
//!
//! 1. builds the images the backends need (a no-op when present: the two engine images, and the
//!    VM image unless `QEMU_VM_IMAGE` names one) and the three binaries (`sandbox-mcp`,
//!    `sandboxctl` for the suite's engine listings, `sbx-sim`);
//! 2. installs the pinned client (`requirements.txt`, every package at an exact version, wheels
//!    only) into a virtual environment under `target/mcp-e2e/venv`, reused while the
//!    requirements are unchanged;
//! 3. runs the suite on Docker, on `sbx-sim` and on qemu at once, each as one pytest run bounded
//!    by [`SUITE_TIMEOUT`] and killed with its process tree past it: Docker and `sbx-sim` the
//!    whole suite on [`WORKERS`] pytest-xdist workers (each worker has its own scope, HTTP
//!    server and state directory), qemu its one end-to-end case (`test_qemu.py`: a VM booted
//!    under emulation where KVM cannot, a command, a file, disposal) in one process;
//! 4. fails unless each run passed with no test failed, errored or skipped, and unless the engine
//!    holds nothing of the runs afterwards: Docker workloads whose scope label carries the run's
//!    prefix, simulator containers whose workspace lies under the run's directory, QEMU
//!    processes, VM directories and records under the qemu run's directory.
//!
//! The leftovers are judged by the run's own prefix and directory, not by difference, so the
//! suite can share the engine with another suite's run; the Docker suite judges by difference and
//! leaves out every object whose scope starts with [`MCP_SCOPE_PREFIX`], so `ci` runs the two at once.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, ExitKind, Stream};
use sandbox_core::naming::docker::LABEL_SCOPE;

use crate::error::XtaskError;
use crate::live::{
    build_images, list_objects, sim_containers_under, EngineObject, RunDir, MCP_SCOPE_PREFIX,
};
use crate::process::{bounded_runtime, seconds, stream_bounded, Workspace};

/// The suite's directory, from the workspace root.
const SUITE_DIR: &str = "tests/mcp-python";

/// The pinned client and test runner, from the workspace root.
const REQUIREMENTS: &str = "tests/mcp-python/requirements.txt";

/// pytest-xdist workers of the Docker and `sbx-sim` runs. The cases mostly wait on the engine, so
/// a few workers cut the wall time; more only queue on the engine and the two shared cores. The
/// qemu run's one case runs in pytest's own process (`-n 0`).
const WORKERS: &str = "4";

/// The deadline of one backend's pytest run.
const SUITE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The deadline of `python3 -m venv` and of the Python checks.
const VENV_TIMEOUT: Duration = Duration::from_secs(120);

/// The deadline of the pip install (a cold download of every pinned wheel).
const PIP_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The output budget of each child (pytest prints a line per case; pip a few per package).
const OUTPUT_BUDGET: usize = 32 * 1024 * 1024;

/// The oldest Python the pinned `mcp` supports.
const MIN_PYTHON: (u32, u32) = (3, 10);

/// One backend's run of the suite.
#[derive(Debug)]
struct Run {
    /// `docker`, `sbx` or `qemu` (the suite's `SANDBOX_MCP_BACKEND`).
    backend: &'static str,
    /// The run's temporary directory: the suite's state, homes and simulator workspaces.
    dir: PathBuf,
    /// The prefix of every scope the run's workers use.
    scope_prefix: String,
}

/// How one run ended.
#[derive(Debug)]
struct Outcome {
    status: Result<ExitKind, XtaskError>,
    counts: Option<BTreeMap<String, u64>>,
    took: Duration,
}

/// Runs the suite on both backends and judges it.
pub fn run(workspace: &Workspace) -> Result<(), XtaskError> {
    build_images(
        workspace,
        &[
            "sandbox-base:local".to_owned(),
            "sbx-sim-shell:local".to_owned(),
        ],
    )?;
    let vm_image = crate::vm::given_or_built_image(workspace)?;
    let bin = crate::live::shared_binaries(workspace)?;
    let runtime = bounded_runtime("the mcp suite")?;
    let python = ensure_venv(workspace, &runtime)?;
    let base = workspace.target_dir().join("mcp-e2e");
    let mut dirs = Vec::new();
    let runs: Vec<Run> = ["docker", "sbx", "qemu"]
        .into_iter()
        .map(|backend| {
            let dir = RunDir::make(run_dir(&base, backend))?;
            let run = Run {
                backend,
                dir: dir.path().to_owned(),
                scope_prefix: format!("{MCP_SCOPE_PREFIX}{}-{backend}", std::process::id()),
            };
            dirs.push(dir);
            Ok(run)
        })
        .collect::<Result<_, XtaskError>>()?;
    let suite_dir = workspace.root().join(SUITE_DIR);
    let commands: Vec<(String, BoundedCommand)> = runs
        .iter()
        .map(|run| pytest(&python, &suite_dir, &bin, &vm_image, run))
        .collect();
    let outcomes = runtime.block_on(async {
        let mut commands = commands.into_iter();
        let (Some(first), Some(second), Some(third)) =
            (commands.next(), commands.next(), commands.next())
        else {
            unreachable!("three runs were built above");
        };
        let (a, b, c) = tokio::join!(run_pytest(first), run_pytest(second), run_pytest(third));
        vec![a, b, c]
    });
    let mut failure = None;
    for ((run, outcome), dir) in runs.iter().zip(outcomes).zip(dirs) {
        let left = leftovers(workspace, run)?;
        let verdict = judge(run, &outcome, &left);
        match &verdict {
            Ok(passed) => eprintln!(
                "==> e2e mcp {}: {passed} passed, none failed or skipped, nothing left on the \
                 {} ({})",
                run.backend,
                if run.backend == "qemu" {
                    "host"
                } else {
                    "engine"
                },
                seconds(outcome.took)
            ),
            Err(error) => eprintln!("==> e2e mcp {}: {error}", run.backend),
        }
        if left.is_empty() {
            // The run's state (locks, tokens, homes) is judged; nothing in it is kept.
            dir.remove();
        }
        if let Err(error) = verdict {
            failure.get_or_insert(error);
        }
    }
    match failure {
        None => Ok(()),
        Some(error) => Err(error),
    }
}

/// The start of the name of a qemu run's directory under the temporary directory (where `ci`
/// looks for the guests of a stopped run).
pub(crate) const TEMP_RUN_PREFIX: &str = "mcp-e2e-";

/// The directory of one backend's run: under `base` (the workspace's target directory), but for
/// qemu under the temporary directory, whose path is short enough for the VMs' Unix sockets
/// (`<run>/<case dir>/state/sandboxes/qemu/vms/<vm>/agent.sock` must fit 108 bytes).
fn run_dir(base: &Path, backend: &str) -> PathBuf {
    let name = format!("run-{}-{backend}", std::process::id());
    if backend == "qemu" {
        std::env::temp_dir().join(format!("{TEMP_RUN_PREFIX}{name}"))
    } else {
        base.join(name)
    }
}

/// The pytest command of one run and its banner line.
fn pytest(
    python: &Path,
    suite_dir: &Path,
    bin: &Path,
    vm_image: &Path,
    run: &Run,
) -> (String, BoundedCommand) {
    let workers = if run.backend == "qemu" { "0" } else { WORKERS };
    let args: Vec<OsString> = [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-n",
        workers,
        "--dist",
        "worksteal",
        "-v",
        "-rfEs",
        "--color=no",
        "--rootdir",
    ]
    .into_iter()
    .map(OsString::from)
    .chain([suite_dir.as_os_str().to_owned()])
    .collect();
    let mut shown = Command::new(python);
    shown.args(&args);
    let line = format!(
        "SANDBOX_MCP_BACKEND={} {}",
        run.backend,
        crate::process::describe(&shown)
    );
    let command = BoundedCommand::new(python, SUITE_TIMEOUT)
        .args(args)
        // The inherited environment (the engine's address, PATH, proxies), then the suite's.
        .envs(std::env::vars_os())
        .env("SANDBOX_MCP_BACKEND", run.backend)
        .env("SANDBOX_MCP_SCOPE_PREFIX", &run.scope_prefix)
        .env("SANDBOX_MCP_BIN", bin.join("sandbox-mcp"))
        .env("SANDBOXCTL_BIN", bin.join("sandboxctl"))
        .env("SBX_PATH", bin.join("sbx-sim"))
        .env("QEMU_VM_IMAGE", vm_image)
        .env("TMPDIR", &run.dir)
        // No bytecode next to the sources.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(suite_dir)
        .output_budget(OUTPUT_BUDGET);
    (format!("{}\t{line}", run.backend), command)
}

/// Runs one pytest command with each line of its output on stderr, prefixed with its backend.
async fn run_pytest((tagged, command): (String, BoundedCommand)) -> Outcome {
    let (backend, line) = tagged.split_once('\t').unwrap_or(("?", &tagged));
    let backend = backend.to_owned();
    eprintln!("$ {line}");
    let prefix = format!("[mcp {backend}] ");
    let command = command.on_line(move |_: Stream, text: &[u8]| {
        eprint!("{prefix}{}", String::from_utf8_lossy(text));
    });
    let started = Instant::now();
    match command.run().await {
        Ok(output) => {
            let text = String::from_utf8_lossy(&output.stdout);
            Outcome {
                status: Ok(output.status),
                counts: pytest_counts(&text),
                took: started.elapsed(),
            }
        }
        Err(source) => Outcome {
            status: Err(XtaskError::Bounded {
                command: line.to_owned(),
                source,
            }),
            counts: None,
            took: started.elapsed(),
        },
    }
}

/// The verdict of one run: the number of cases passed, or why it failed.
fn judge(run: &Run, outcome: &Outcome, left: &[EngineObject]) -> Result<u64, XtaskError> {
    let suite = format!("mcp {}", run.backend);
    let fail = |reason: String| XtaskError::PythonSuite {
        suite: suite.clone(),
        reason,
    };
    let left_note = if left.is_empty() {
        String::new()
    } else {
        format!(
            "; it also left {} object(s) on the engine:\n{}",
            left.len(),
            left.iter()
                .map(|o| format!("  {} {} {}", o.kind, o.id, o.name))
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    let status = match &outcome.status {
        Ok(status) => *status,
        Err(error) => return Err(fail(format!("{error}{left_note}"))),
    };
    let Some(counts) = &outcome.counts else {
        return Err(fail(format!(
            "pytest printed no summary line ({status:?}){left_note}"
        )));
    };
    let count = |word: &str| counts.get(word).copied().unwrap_or(0);
    let bad: Vec<String> = ["failed", "error", "errors", "skipped", "xfailed", "xpassed"]
        .into_iter()
        .filter(|word| count(word) > 0)
        .map(|word| format!("{} {word}", count(word)))
        .collect();
    if !bad.is_empty() {
        return Err(fail(format!("{}{left_note}", bad.join(", "))));
    }
    if status != ExitKind::Exited(0) || count("passed") == 0 {
        return Err(fail(format!(
            "pytest ended with {status:?} after {} passed{left_note}",
            count("passed")
        )));
    }
    if !left.is_empty() {
        return Err(fail(format!("every case passed{left_note}")));
    }
    Ok(count("passed"))
}

/// The counts of pytest's closing line (`== 31 passed, 1 skipped in 40.40s ==`), by word.
fn pytest_counts(text: &str) -> Option<BTreeMap<String, u64>> {
    text.lines().rev().find_map(|line| {
        let line = line.trim().trim_matches('=').trim();
        let (counts, _) = line.rsplit_once(" in ")?;
        let mut found = BTreeMap::new();
        for piece in counts.split(", ") {
            let (number, word) = piece.trim().split_once(' ')?;
            found.insert(word.to_owned(), number.parse::<u64>().ok()?);
        }
        (!found.is_empty()).then_some(found)
    })
}

/// What a run left on the engine: Docker workloads, networks and volumes whose scope label
/// starts with the run's prefix, and simulator containers whose workspace is under its
/// directory.
fn leftovers(workspace: &Workspace, run: &Run) -> Result<Vec<EngineObject>, XtaskError> {
    if run.backend == "sbx" {
        return sim_containers_under(workspace, &run.dir);
    }
    if run.backend == "qemu" {
        // Give a killed QEMU a moment to be reaped before judging.
        std::thread::sleep(Duration::from_millis(500));
        let mut left = crate::vm::qemus_under(&run.dir);
        left.extend(vm_state_under(&run.dir));
        return Ok(left);
    }
    let label = format!("label={LABEL_SCOPE}");
    let mut left = Vec::new();
    for kind in ["container", "network", "volume"] {
        let text = list_objects(workspace, kind, &label)?;
        left.extend(text.lines().filter_map(|line| {
            let mut columns = line.split('\t');
            let id = columns.next()?.trim();
            let scope = columns.nth(1)?.trim();
            scope.starts_with(&run.scope_prefix).then(|| EngineObject {
                kind,
                id: id.to_owned(),
                name: scope.to_owned(),
            })
        }));
    }
    Ok(left)
}

/// The records and VM directories of every qemu state directory (`…/sandboxes/qemu`) under `dir`;
/// the probe's cache and other dot-names are not state a sandbox left.
fn vm_state_under(dir: &Path) -> Vec<EngineObject> {
    let mut left = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&next) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            if path.ends_with("sandboxes/qemu") {
                left.extend(state_entries(&path));
            } else {
                pending.push(path);
            }
        }
    }
    left
}

/// The entries of one qemu state directory and of its `vms/` that are a sandbox's.
fn state_entries(state: &Path) -> Vec<EngineObject> {
    let mut left = Vec::new();
    for dir in [state.to_owned(), state.join("vms")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || (dir == state && name == "vms") {
                continue;
            }
            left.push(EngineObject {
                kind: "vm state",
                id: entry.path().display().to_string(),
                name,
            });
        }
    }
    left
}

/// The virtual environment's Python, the environment made (or remade) first when the pinned
/// requirements changed since it was made.
fn ensure_venv(
    workspace: &Workspace,
    runtime: &tokio::runtime::Runtime,
) -> Result<PathBuf, XtaskError> {
    let requirements = workspace.root().join(REQUIREMENTS);
    let wanted = std::fs::read_to_string(&requirements).map_err(|source| XtaskError::Io {
        action: "reading",
        path: requirements.display().to_string(),
        source,
    })?;
    let venv = workspace.target_dir().join("mcp-e2e").join("venv");
    let python = venv.join("bin").join("python");
    let stamp = venv.join("requirements.installed");
    if python.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&wanted) {
        eprintln!(
            "==> e2e mcp: the pinned client is installed in {}",
            venv.display()
        );
        return Ok(python);
    }
    check_python(runtime)?;
    match std::fs::remove_dir_all(&venv) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(XtaskError::Io {
                action: "removing",
                path: venv.display().to_string(),
                source: error,
            })
        }
        _ => {}
    }
    run_checked(
        runtime,
        Path::new("python3"),
        vec!["-m".into(), "venv".into(), venv.clone().into()],
        VENV_TIMEOUT,
    )?;
    run_checked(
        runtime,
        &python,
        vec![
            "-m".into(),
            "pip".into(),
            "install".into(),
            "--no-input".into(),
            "--disable-pip-version-check".into(),
            // Wheels only: nothing is compiled on the host, and a missing wheel fails here.
            "--only-binary=:all:".into(),
            "--requirement".into(),
            requirements.into(),
        ],
        PIP_TIMEOUT,
    )?;
    std::fs::write(&stamp, wanted).map_err(|source| XtaskError::Io {
        action: "writing",
        path: stamp.display().to_string(),
        source,
    })?;
    Ok(python)
}

/// Fails with the package to install when `python3` is missing, too old, or lacks `venv`.
fn check_python(runtime: &tokio::runtime::Runtime) -> Result<(), XtaskError> {
    let (major, minor) = MIN_PYTHON;
    let script = format!(
        "import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= ({major}, {minor}) else 3)"
    );
    let checked = runtime.block_on(
        BoundedCommand::new("python3", VENV_TIMEOUT)
            .args(["-c", &script])
            .envs(std::env::vars_os())
            .run(),
    );
    match checked {
        Ok(output) if output.status == ExitKind::Exited(0) => Ok(()),
        Ok(output) if output.status == ExitKind::Exited(3) => Err(XtaskError::MissingTool {
            program: format!("python3 >= {major}.{minor}"),
            package: "python3".to_owned(),
        }),
        _ => Err(XtaskError::MissingTool {
            program: "python3 with the venv module".to_owned(),
            package: "python3-venv".to_owned(),
        }),
    }
}

/// Runs `program` with `args` (and the inherited environment) under `timeout` to a zero exit,
/// its output streamed.
fn run_checked(
    runtime: &tokio::runtime::Runtime,
    program: &Path,
    args: Vec<OsString>,
    timeout: Duration,
) -> Result<(), XtaskError> {
    let line = crate::process::describe(Command::new(program).args(&args));
    let command = BoundedCommand::new(program, timeout)
        .args(args)
        .envs(std::env::vars_os())
        .output_budget(OUTPUT_BUDGET);
    match stream_bounded(runtime, &line, command)? {
        ExitKind::Exited(0) => Ok(()),
        status => Err(XtaskError::CommandFailed {
            command: line,
            status: format!("{status:?}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_lines_give_their_counts() {
        let counts = pytest_counts(
            "[gw0] PASSED test_x.py::a\n\
             ========== 29 passed, 1 skipped, 2 warnings in 40.40s (0:00:40) ==========\n",
        )
        .unwrap();
        assert_eq!(counts["passed"], 29);
        assert_eq!(counts["skipped"], 1);
        assert_eq!(counts["warnings"], 2);
        let plain = pytest_counts("31 passed in 40.40s\n").unwrap();
        assert_eq!(plain.len(), 1);
        assert_eq!(plain["passed"], 31);
        assert!(pytest_counts("collected 31 items\nno summary here\n").is_none());
    }

    #[test]
    fn a_qemu_runs_vm_state_is_found_below_its_directory() {
        let run = tempfile::tempdir().unwrap();
        let state = run.path().join("mcp-e2e-abc/state/sandboxes/qemu");
        std::fs::create_dir_all(state.join(".accel")).unwrap();
        std::fs::create_dir_all(state.join(".probe")).unwrap();
        std::fs::create_dir_all(state.join("vms")).unwrap();
        assert!(
            vm_state_under(run.path()).is_empty(),
            "the probe's cache is no leftover"
        );
        std::fs::create_dir_all(state.join("vms/vm-0123456789ab")).unwrap();
        std::fs::create_dir_all(state.join("qemu-key")).unwrap();
        let mut left: Vec<String> = vm_state_under(run.path())
            .into_iter()
            .map(|object| object.name)
            .collect();
        left.sort();
        assert_eq!(left, ["qemu-key", "vm-0123456789ab"]);
    }

    #[test]
    fn the_qemu_run_lies_where_its_sockets_fit() {
        let base = Path::new("/a/long/workspace/path/of/some/length/target/mcp-e2e");
        assert!(run_dir(base, "docker").starts_with(base));
        let qemu = run_dir(base, "qemu");
        assert!(qemu.starts_with(std::env::temp_dir()));
        // The suite's case directory, the state below it and the longest socket path.
        let socket =
            qemu.join("mcp-e2e-abcdefgh/state/sandboxes/qemu/vms/vm-000000000000/agent.sock");
        assert!(socket.as_os_str().len() < 108, "{}", socket.display());
    }

    fn outcome(line: &str, status: ExitKind) -> Outcome {
        Outcome {
            status: Ok(status),
            counts: pytest_counts(line),
            took: Duration::ZERO,
        }
    }

    #[test]
    fn a_run_passes_only_with_no_failure_skip_or_leftover() {
        let run = Run {
            backend: "docker",
            dir: PathBuf::from("/nonexistent"),
            scope_prefix: "p".to_owned(),
        };
        let clean = outcome("== 31 passed in 1.0s ==", ExitKind::Exited(0));
        assert_eq!(judge(&run, &clean, &[]).unwrap(), 31);
        let skipped = outcome("== 30 passed, 1 skipped in 1.0s ==", ExitKind::Exited(0));
        let error = judge(&run, &skipped, &[]).unwrap_err().to_string();
        assert!(error.contains("1 skipped"), "{error}");
        let failed = outcome("== 1 failed, 30 passed in 1.0s ==", ExitKind::Exited(1));
        assert!(judge(&run, &failed, &[]).is_err());
        let errored = outcome("== 30 passed, 1 error in 1.0s ==", ExitKind::Exited(1));
        assert!(judge(&run, &errored, &[]).is_err());
        let none = outcome("== no tests ran in 1.0s ==", ExitKind::Exited(5));
        assert!(judge(&run, &none, &[]).is_err());
        let left = [EngineObject {
            kind: "container",
            id: "abc".to_owned(),
            name: "p-gw0".to_owned(),
        }];
        let error = judge(&run, &clean, &left).unwrap_err().to_string();
        assert!(error.contains("container abc p-gw0"), "{error}");
    }
}
