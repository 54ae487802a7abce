//! The live suites and the local images they run on.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use backend_docker::{ImageRecipe, LocalImage};
use clap::Subcommand;
use sandbox_core::naming::docker::LABEL_SCOPE;

use crate::error::XtaskError;
use crate::process::{capture_in, cargo, tee_in, Workspace};

/// The start of every scope the MCP suite's runs use; no other suite's scope starts with it, and
/// the Docker suite leaves objects of these scopes out of its count.
pub(crate) const MCP_SCOPE_PREFIX: &str = "mcp-e2e-";

/// The deadline of each engine listing.
const LISTING_TIMEOUT: Duration = Duration::from_secs(60);

/// The label `sbx-sim` puts on every container it makes (its state home's digest).
const SIM_HOME_LABEL: &str = "sbx-sim.home";

/// A live suite.
#[derive(Debug, Clone, Subcommand)]
pub enum Suite {
    /// The Docker backend against this machine's engine.
    Docker,
    /// The Docker backend under gVisor (`runsc`, registered with the engine): every conformance
    /// suite with the HARDENING probes, the gVisor checks of the backend and of `sandboxctl`.
    Gvisor,
    /// The sbx backend against `sbx-sim` (built first), or against the `sbx` at `--sbx-path`.
    Sbx {
        /// The `sbx` program to test against. Without it, `sbx-sim` is built and used. A real
        /// `sbx` runs the conformance suites only (fault switches exist only in the simulator).
        #[arg(long)]
        sbx_path: Option<PathBuf>,
    },
    /// The microVM driver and guest agent against real QEMU (the VM image is built first).
    Vm,
    /// The qemu backend against real QEMU: its own checks, every conformance suite it declares
    /// (HARDENING and CONFINEMENT included) and its fault tests (the VM image is built first).
    Qemu,
    /// Both VM suites, `vm` and `qemu`, in one nextest run: their VMs share the two slots of
    /// the `vm` test group, so a suite's short tests fill the slot the other's long ones leave
    /// (CI's step; the same tests and checks as the two suites one after the other).
    Vms,
    /// The MCP server (`sandbox-mcp`) through the official Python client, over stdio and
    /// Streamable HTTP, on Docker and on `sbx-sim` (see `mcp_suite.rs`).
    Mcp,
}

/// The one build every test step shares: the whole workspace with every feature. The unit tests,
/// the live suites, the binaries they drive, the examples and the doc tests then compile once: a
/// narrower `-p`/`--features` selection unifies the dependencies' features differently and
/// compiles much of the workspace again (on a fresh machine, minutes per suite).
pub(crate) const SHARED_BUILD: [&str; 2] = ["--workspace", "--all-features"];

/// `cargo nextest run` of the shared build on the tests `filter` selects (a nextest filterset),
/// running to the end and naming every skipped test, so a skip can be reported by name.
pub(crate) fn shared_nextest(filter: &str) -> Command {
    let mut command = cargo();
    command
        .args(["nextest", "run"])
        .args(SHARED_BUILD)
        .args(["-E", filter])
        .args([
            "--no-fail-fast",
            "--status-level",
            "skip",
            "--final-status-level",
            "skip",
        ]);
    command
}

/// Builds the shared build's binaries (but the fuzz targets) and examples into `target/debug`,
/// in the test profile nextest builds them in, so after the unit tests it builds little more
/// than the examples; returns that directory. The binaries are named one by one rather than
/// the fuzz package left out: leaving it out would change the features its dependencies
/// unify to (`cc`'s, and so everything above `ring`) and build much of the workspace again.
pub(crate) fn shared_binaries(workspace: &Workspace) -> Result<PathBuf, XtaskError> {
    let mut command = cargo();
    command.args(["build"]).args(SHARED_BUILD);
    for binary in crate::layering::binaries_but_fuzz_targets(workspace)? {
        command.args(["--bin", &binary]);
    }
    workspace.run(command.args(["--examples", "--profile", "test"]))?;
    Ok(workspace.target_dir().join("debug"))
}

/// The target the static guest binaries are built for, statically linked (no musl target is
/// installed here; the static C library resolves names with its built-in `files` and `dns`
/// lookups): the VM agent's, so `sandboxctl images build vm` finds the agent built here.
pub(crate) const STATIC_TARGET: &str = qemu_vm::AGENT_TARGET;

/// The binaries (package, binary) the images are built around: the egress proxy, the exec
/// init and the guest's `host-tool` (the VM image's too). They are always built together, whichever images are wanted: features unify per cargo
/// invocation and symbol names carry their hash, so another selection would make another,
/// equally good binary, and rebuild the images around it for nothing.
pub(crate) const IMAGE_BINARIES: [(&str, &str); 3] = [
    ("egress-proxy", "egress-proxy"),
    ("exec-wrapper", "sandbox-exec-init"),
    ("host-tools", "host-tool"),
];

/// Builds the images (every engine image, or the given tags) with progress on stderr, caching
/// debootstrap's output under `target/images-cache`. When an image built around a workspace
/// binary is wanted (the egress proxy image; `sandbox-base:local` and `sandbox-base-root:local`,
/// which carry the exec init and `host-tool`; `sbx-sim-shell:local`, which carries `host-tool`),
/// the static binaries are built (release, `+crt-static`, one cargo invocation) while the
/// Debian roots of every missing image are bootstrapped into the cache in one debootstrap and
/// the images around no binary are built (a compile beside a debootstrap that mostly waits on
/// the mirror and the disk); then the images around the binaries are built from
/// the cached roots, and one built around another binary is rebuilt. The tag `vm` names the
/// microVM image, which is not an engine image: it is built only when named, after the engine
/// images (from the same cached Debian root).
pub fn build_images(workspace: &Workspace, tags: &[String]) -> Result<(), XtaskError> {
    if tags.iter().any(|tag| tag == crate::vm::VM_IMAGE) {
        let engine_tags: Vec<String> = tags
            .iter()
            .filter(|tag| *tag != crate::vm::VM_IMAGE)
            .cloned()
            .collect();
        if !engine_tags.is_empty() {
            build_images(workspace, &engine_tags)?;
        }
        return crate::vm::build_image(workspace).map(drop);
    }
    let images = tags
        .iter()
        .map(|tag| LocalImage::from_tag(tag))
        .collect::<Result<Vec<_>, _>>()?;
    let wanted = if images.is_empty() {
        LocalImage::ALL.to_vec()
    } else {
        images
    };
    // Built (a no-op when nothing changed) even when the images exist: the recipe rebuilds an
    // image whose binary digest differs, so a changed binary is never tested in a stale image.
    let (around_binaries, others): (Vec<LocalImage>, Vec<LocalImage>) = wanted
        .iter()
        .partition(|image| image.carries_workspace_binaries());
    let recipe = ImageRecipe::new()
        .cache_dir(workspace.target_dir().join("images-cache"))
        .progress(|line| eprintln!("images: {line}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| XtaskError::Spawn {
            command: "a tokio runtime for the image recipe".to_owned(),
            source,
        })?;
    let mut reports = if around_binaries.is_empty() {
        runtime.block_on(recipe.build(&wanted))?
    } else {
        let (binaries, others_built) = std::thread::scope(|scope| {
            let binaries = scope.spawn(|| build_static(workspace, &IMAGE_BINARIES));
            // The roots of every wanted image the engine lacks, so the images around the
            // binaries find theirs cached (one built around a changed binary while present
            // takes its root from the cache, or bootstraps it after the compile).
            let others_built = runtime.block_on(async {
                recipe.cache_roots(&wanted).await?;
                // An empty list would mean every image to the recipe.
                if others.is_empty() {
                    Ok(Vec::new())
                } else {
                    recipe.build(&others).await
                }
            });
            let binaries = binaries.join().unwrap_or_else(|_| {
                Err(XtaskError::Spawn {
                    command: "the static image binaries' build".to_owned(),
                    source: std::io::Error::other("its thread panicked"),
                })
            });
            (binaries, others_built)
        });
        let dir = binaries?;
        let mut reports = others_built?;
        let recipe = recipe
            .egress_proxy_binary(dir.join("egress-proxy"))
            .exec_init_binary(dir.join("sandbox-exec-init"))
            .host_tool_binary(dir.join("host-tool"));
        reports.extend(runtime.block_on(recipe.build(&around_binaries))?);
        reports
    };
    reports.sort_by_key(|report| wanted.iter().position(|image| *image == report.image));
    for report in reports {
        eprintln!(
            "images: {:<26} {:?} ({:.1} s)",
            report.image.tag(),
            report.outcome,
            report.elapsed.as_secs_f64()
        );
    }
    Ok(())
}

/// Builds the given binaries (package, binary) for [`STATIC_TARGET`], release and statically
/// linked, in one cargo invocation; returns the directory they are in.
pub(crate) fn build_static(
    workspace: &Workspace,
    binaries: &[(&str, &str)],
) -> Result<PathBuf, XtaskError> {
    let mut command = cargo();
    command.args(["build", "--release"]);
    for (package, binary) in binaries {
        command.args(["-p", package, "--bin", binary]);
    }
    workspace.run(
        command
            .args(["--target", STATIC_TARGET])
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("RUSTFLAGS", qemu_vm::AGENT_RUSTFLAGS),
    )?;
    Ok(workspace.target_dir().join(STATIC_TARGET).join("release"))
}

/// The sbx suite: every conformance suite the backend declares and (on the simulator) one test
/// per fault switch; no skip, and no simulator container left on the engine.
pub(crate) fn sbx(
    workspace: &Workspace,
    sbx_path: Option<&std::path::Path>,
) -> Result<(), XtaskError> {
    let path = match sbx_path {
        Some(path) => path.to_path_buf(),
        None => {
            build_images(workspace, &["sbx-sim-shell:local".to_owned()])?;
            shared_binaries(workspace)?.join("sbx-sim")
        }
    };
    let version = capture_in(
        workspace.root(),
        Command::new(&path).arg("version"),
        LISTING_TIMEOUT,
    )?;
    let simulator = version.contains("sbx-sim");
    eprintln!("==> e2e sbx: {} ({})", path.display(), version.trim());
    // Every test makes its simulator home and workspace root under the run's own temporary
    // directory, so leftovers are judged by that prefix: other users of the engine never count.
    let run = RunDir::for_suite(workspace, "sbx")?;
    // On the simulator, the driver's and the simulator's own live tests run against the same
    // build (their other tests ran in the unit-test step); a real `sbx` runs the conformance
    // suites only.
    let filter = if simulator {
        "(package(backend-sbx) | package(sbx-cli) | package(sbx-sim)) & binary(/^live/)"
    } else {
        "package(backend-sbx) & binary(live_conformance)"
    };
    let mut command = shared_nextest(filter);
    command.env("SBX_PATH", &path).env("TMPDIR", run.path());
    if simulator {
        command.env("SBX_SIM_BIN", &path);
    }
    run.judge_suite(workspace, "sbx", command, |dir| {
        sim_containers_under(workspace, dir)
    })
}

/// A suite's own run directory, made fresh: what its tests make goes under it, so what a run
/// left is judged by that prefix alone (other users of the engine or the machine never count),
/// and the directory is removed once nothing was left in it; with something left it stays for a
/// look.
pub(crate) struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Makes `path` (and its parents).
    ///
    /// # Errors
    /// [`XtaskError::Io`] when it cannot be made.
    pub(crate) fn make(path: PathBuf) -> Result<RunDir, XtaskError> {
        std::fs::create_dir_all(&path).map_err(|source| XtaskError::Io {
            action: "creating",
            path: path.display().to_string(),
            source,
        })?;
        Ok(RunDir { path })
    }

    /// `<target>/<suite>-e2e-<pid>`: the run directory of the live suite `suite` of this
    /// process.
    ///
    /// # Errors
    /// [`XtaskError::Io`] when it cannot be made.
    pub(crate) fn for_suite(workspace: &Workspace, suite: &str) -> Result<RunDir, XtaskError> {
        RunDir::make(
            workspace
                .target_dir()
                .join(format!("{suite}-e2e-{}", std::process::id())),
        )
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Runs `command` (a nextest run of the suite) and judges it as [`judge_suite`] does, with
    /// what `left_of` finds of the run outside the directory and whatever is left in it; removes
    /// the directory when nothing was left.
    ///
    /// # Errors
    /// As [`judge_suite`]; also when `left_of` fails.
    pub(crate) fn judge_suite(
        self,
        workspace: &Workspace,
        suite: &str,
        mut command: Command,
        left_of: impl FnOnce(&std::path::Path) -> Result<Vec<EngineObject>, XtaskError>,
    ) -> Result<(), XtaskError> {
        let teed = tee_in(workspace.root(), &mut command, |line| {
            is_summary_line(line) || is_skip_line(line)
        })?;
        let mut left = left_of(&self.path)?;
        left.extend(files_under(&self.path));
        let left: Vec<&EngineObject> = left.iter().collect();
        let verdict = judge_suite(suite, teed, &left, Ok(()));
        if left.is_empty() {
            self.remove();
        }
        verdict
    }

    /// Removes the directory and whatever the run kept in it (state already judged).
    pub(crate) fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Containers of `sbx-sim` whose workspace lies under `dir`.
pub(crate) fn sim_containers_under(
    workspace: &Workspace,
    dir: &std::path::Path,
) -> Result<Vec<EngineObject>, XtaskError> {
    let label = format!("label={SIM_HOME_LABEL}");
    let text = capture_in(
        workspace.root(),
        Command::new("docker").args([
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &label,
            "--format",
            "{{.ID}}\t{{.Names}}\t{{.Label \"sbx-sim.workspace\"}}",
        ]),
        LISTING_TIMEOUT,
    )?;
    let prefix = dir.to_string_lossy().into_owned();
    Ok(text
        .lines()
        .filter(|line| {
            line.split('\t')
                .nth(2)
                .is_some_and(|ws| ws.starts_with(&prefix))
        })
        .flat_map(|line| {
            let id_and_name: Vec<&str> = line.splitn(3, '\t').take(2).collect();
            parse_listing("container", &id_and_name.join("\t"))
        })
        .collect())
}

/// Whatever a run left in its temporary directory (simulator homes, workspace roots).
pub(crate) fn files_under(dir: &std::path::Path) -> Vec<EngineObject> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| EngineObject {
                    kind: "directory",
                    id: entry.path().display().to_string(),
                    name: entry.file_name().to_string_lossy().into_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The Docker suite: every live test of the Docker crates and the examples; no skip, and
/// nothing of the run left on the engine (judged by difference).
pub(crate) fn docker(workspace: &Workspace) -> Result<(), XtaskError> {
    build_images(workspace, &[])?;
    // sandboxctl's host-file guards are also attacked on the sbx backend, through the simulator.
    let binaries = shared_binaries(workspace)?;
    let sim = binaries.join("sbx-sim");
    let before = engine_objects(workspace)?;
    let snapshot = docker_snapshot_path(workspace);
    write_snapshot(&snapshot, &before)?;
    // The live test binaries only: the same build's other tests ran in the unit-test step.
    let mut command = shared_nextest(
        "(package(backend-docker) | package(sandboxctl) | package(exec-wrapper) | package(egress-proxy)) & binary(/^live/) & not binary(live_gvisor)",
    );
    command.env("SBX_PATH", &sim);
    let teed = tee_in(workspace.root(), &mut command, |line| {
        is_summary_line(line) || is_skip_line(line)
    })?;
    // The runnable examples are part of the suite: a README that shows them must not rot.
    let examples = if teed.success {
        ["quickstart", "router", "host_tools"]
            .iter()
            .try_for_each(|example| {
                workspace.run(&mut Command::new(binaries.join("examples").join(example)))
            })
    } else {
        Ok(())
    };
    // Leftovers are checked whether or not the suite passed: a failing suite must not also
    // leave the engine dirty unnoticed.
    let after = engine_objects(workspace)?;
    let left: Vec<&EngineObject> = after.difference(&before).collect();
    let verdict = judge_suite("docker", teed, &left, examples);
    if verdict.is_ok() {
        // Nothing of this run is left for `cargo xtask ci` to remove.
        let _ = std::fs::remove_file(&snapshot);
    }
    verdict
}

/// The runtime the gVisor suite runs every sandbox under, and the runc runtime registered under
/// a gVisor-like name that it proves is refused the rung (`.ci/register-gvisor` registers both).
pub(crate) const GVISOR_RUNTIMES: [&str; 2] = ["runsc", "runsc-fake"];

/// The variable that tells the live tests which runtime to run under.
const RUNTIME_VARIABLE: &str = "SANDBOX_E2E_DOCKER_RUNTIME";

/// The gVisor suite: the Docker backend's conformance suites (HARDENING included; CONFINEMENT,
/// whose observer cannot see a gVisor sandbox's root, left out) with every sandbox under `runsc`, and the gVisor tests of the backend and of `sandboxctl`; no skip, and
/// nothing of the run left on the engine (judged by difference, so it never runs beside the
/// Docker suite).
pub(crate) fn gvisor(workspace: &Workspace) -> Result<(), XtaskError> {
    let listed = capture_in(
        workspace.root(),
        Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]),
        LISTING_TIMEOUT,
    )?;
    let runtimes: serde_json::Value =
        serde_json::from_str(listed.trim()).unwrap_or(serde_json::Value::Null);
    let missing: Vec<&str> = GVISOR_RUNTIMES
        .into_iter()
        .filter(|name| runtimes.get(name).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(XtaskError::MissingRuntimes {
            missing: missing.join(", "),
        });
    }
    build_images(workspace, &[])?;
    shared_binaries(workspace)?;
    let before = engine_objects(workspace)?;
    // The Docker suite's record, so a `ci` that stops or sees this suite fail removes what it
    // made (the two never run at once).
    let snapshot = docker_snapshot_path(workspace);
    write_snapshot(&snapshot, &before)?;
    let started = std::time::Instant::now();
    let mut command = shared_nextest(
        // Not live_confinement: its observer cannot see a gVisor sandbox's root
        // (docs/docker-backend.md#gvisor).
        "(package(backend-docker) & (binary(live_conformance) | binary(live_gvisor))) | (package(sandboxctl) & binary(live_gvisor))",
    );
    command.env(RUNTIME_VARIABLE, GVISOR_RUNTIMES[0]);
    let teed = tee_in(workspace.root(), &mut command, |line| {
        is_summary_line(line) || is_skip_line(line)
    })?;
    eprintln!(
        "==> e2e gvisor: tests ran in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let after = engine_objects(workspace)?;
    let left: Vec<&EngineObject> = after.difference(&before).collect();
    let verdict = judge_suite("gvisor", teed, &left, Ok(()));
    if verdict.is_ok() {
        let _ = std::fs::remove_file(&snapshot);
    }
    verdict
}

/// Where the Docker suite (and the gVisor suite, after it on its lane) records the engine's
/// objects as they were when it started: a run of `cargo xtask ci` that stops the suite (another
/// step failed) or sees it fail removes what the suite made since ([`docker_suite_leftovers`]). A
/// suite that passed removes the record.
fn docker_snapshot_path(workspace: &Workspace) -> PathBuf {
    workspace
        .target_dir()
        .join("ci")
        .join("e2e-docker-before.tsv")
}

/// Writes `objects` as `KIND<TAB>ID<TAB>NAME` lines.
fn write_snapshot(
    path: &std::path::Path,
    objects: &BTreeSet<EngineObject>,
) -> Result<(), XtaskError> {
    let text: String = objects
        .iter()
        .map(|object| format!("{}\t{}\t{}\n", object.kind, object.id, object.name))
        .collect();
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, text));
    written.map_err(|source| XtaskError::Io {
        action: "writing",
        path: path.display().to_string(),
        source,
    })
}

/// The objects [`write_snapshot`] wrote; a line of an unknown kind is dropped.
fn parse_snapshot(text: &str) -> BTreeSet<EngineObject> {
    text.lines()
        .filter_map(|line| {
            let mut columns = line.splitn(3, '\t');
            let kind = match columns.next()? {
                "container" => "container",
                "network" => "network",
                "volume" => "volume",
                _ => return None,
            };
            Some(EngineObject {
                kind,
                id: columns.next()?.to_owned(),
                name: columns.next().unwrap_or("").to_owned(),
            })
        })
        .collect()
}

/// Forgets a record an earlier run left (a suite run on its own that failed): only the record
/// of this run's suite may say what that suite made.
pub(crate) fn forget_docker_snapshot(workspace: &Workspace) {
    let _ = std::fs::remove_file(docker_snapshot_path(workspace));
}

/// What the Docker suite made since it started, by its record (none when it never started, or
/// passed), and forgets the record. An object made meanwhile by anything else on this engine
/// with the backend's label or names counts too: the suite cannot tell them apart either.
pub(crate) fn docker_suite_leftovers(
    workspace: &Workspace,
) -> Result<Vec<EngineObject>, XtaskError> {
    let path = docker_snapshot_path(workspace);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    let before = parse_snapshot(&text);
    let after = engine_objects(workspace)?;
    let _ = std::fs::remove_file(&path);
    Ok(after.difference(&before).cloned().collect())
}

/// The verdict of a live suite: it passed, the extra step passed, nothing was skipped, and
/// nothing was left on the engine (reported in every case).
pub(crate) fn judge_suite(
    suite: &str,
    teed: crate::process::Teed,
    left: &[&EngineObject],
    extra: Result<(), XtaskError>,
) -> Result<(), XtaskError> {
    if !teed.success {
        report_leftovers(left);
        return Err(XtaskError::CommandFailed {
            command: teed.command,
            status: teed.status,
        });
    }
    if let Err(failed) = extra {
        report_leftovers(left);
        return Err(failed);
    }
    let summary = teed
        .kept
        .iter()
        .rev()
        .find(|line| is_summary_line(line))
        .ok_or_else(|| XtaskError::NoTestSummary {
            command: teed.command.clone(),
        })?;
    let skipped = skipped_count(summary);
    if skipped > 0 {
        report_leftovers(left);
        let names: BTreeSet<&str> = teed
            .kept
            .iter()
            .filter(|line| is_skip_line(line))
            .map(|line| skipped_test_name(line))
            .collect();
        return Err(XtaskError::SkippedTests {
            count: skipped,
            names: names.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    if !left.is_empty() {
        return Err(XtaskError::Leftovers {
            count: left.len(),
            listing: listing(left),
        });
    }
    eprintln!("==> e2e {suite}: no skipped test, nothing left on the engine");
    Ok(())
}

fn report_leftovers(left: &[&EngineObject]) {
    if !left.is_empty() {
        eprintln!(
            "==> e2e docker: the suite also left {} object(s):\n{}",
            left.len(),
            listing(left)
        );
    }
}

fn listing(objects: &[&EngineObject]) -> String {
    objects
        .iter()
        .map(|object| format!("  {} {} {}", object.kind, object.id, object.name))
        .collect::<Vec<_>>()
        .join("\n")
}

/// nextest's closing line: `Summary [   1.234s] 17 tests run: 17 passed, 0 skipped`.
pub(crate) fn is_summary_line(line: &str) -> bool {
    line.trim_start().starts_with("Summary [")
}

/// nextest's per-test skip line (`SKIP [ …] crate test`) at `--status-level skip`.
pub(crate) fn is_skip_line(line: &str) -> bool {
    line.trim_start().starts_with("SKIP ")
}

/// The test named by a skip line: what follows the `[…]` time slot and the `(…)` counter.
fn skipped_test_name(line: &str) -> &str {
    let after_time = line
        .split_once(']')
        .map_or(line, |(_, rest)| rest)
        .trim_start();
    match after_time.strip_prefix('(') {
        Some(counter) => counter
            .split_once(')')
            .map_or(after_time, |(_, rest)| rest)
            .trim(),
        None => after_time.trim(),
    }
}

/// The number before `skipped` in a summary line; none printed means none skipped.
fn skipped_count(summary: &str) -> u64 {
    let words: Vec<&str> = summary
        .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
        .filter(|word| !word.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|pair| pair[1] == "skipped")
        .filter_map(|pair| pair[0].parse::<u64>().ok())
        .sum()
}

/// Something on the engine a live suite may have made.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EngineObject {
    pub(crate) kind: &'static str,
    pub(crate) id: String,
    pub(crate) name: String,
}

/// The listings [`engine_objects`] takes: (kind, `--filter`), the ownership label's filter
/// spelled `LABEL`.
const ENGINE_QUERIES: [(&str, &str); 7] = [
    ("container", "LABEL"),
    ("container", "name=maf-sandbox-docker-"),
    ("container", "name=maf-egress-test-"),
    ("network", "LABEL"),
    ("network", "name=maf-egress-test-"),
    ("volume", "LABEL"),
    ("volume", "name=maf-sandbox-docker-"),
];

/// Containers, networks and volumes carrying the ownership label, and those named like the
/// backend's objects (workloads and their egress volumes, `maf-sandbox-docker-…`) or the egress
/// tests' (their networks and the origins on them, `maf-egress-test-…`), so an unlabelled
/// leftover is caught too, and a stopped suite's origins go before the networks they hold.
/// Objects of the MCP suite's scopes are left out: that suite runs beside this one and judges
/// its own.
fn engine_objects(workspace: &Workspace) -> Result<BTreeSet<EngineObject>, XtaskError> {
    let label = format!("label={LABEL_SCOPE}");
    let mut objects = BTreeSet::new();
    for (kind, filter) in ENGINE_QUERIES {
        let filter = if filter == "LABEL" {
            label.as_str()
        } else {
            filter
        };
        objects.extend(parse_listing(kind, &list_objects(workspace, kind, filter)?));
    }
    Ok(objects)
}

/// The engine's objects of `kind` (`container`, `network` or `volume`) that `filter` (a
/// `--filter` value) selects, as `ID<TAB>NAME<TAB>SCOPE` rows: a volume's id is its name, and
/// the scope is the scope label's value, empty where there is none.
///
/// # Errors
/// When the docker CLI fails or does not answer within [`LISTING_TIMEOUT`].
pub(crate) fn list_objects(
    workspace: &Workspace,
    kind: &str,
    filter: &str,
) -> Result<String, XtaskError> {
    let (listing, row): (&[&str], &str) = match kind {
        "container" => (&["ps", "-a", "--no-trunc"], "{{.ID}}\t{{.Names}}"),
        "network" => (&["network", "ls", "--no-trunc"], "{{.ID}}\t{{.Name}}"),
        _ => (&["volume", "ls"], "{{.Name}}\t{{.Name}}"),
    };
    let format = format!("{row}\t{{{{.Label \"{LABEL_SCOPE}\"}}}}");
    capture_in(
        workspace.root(),
        Command::new("docker")
            .args(listing)
            .args(["--filter", filter, "--format", &format]),
        LISTING_TIMEOUT,
    )
}

/// Rows of `ID<TAB>NAME<TAB>SCOPE`; a row whose scope is the MCP suite's is left out.
fn parse_listing(kind: &'static str, text: &str) -> Vec<EngineObject> {
    text.lines()
        .filter_map(|line| {
            let mut columns = line.split('\t');
            let (id, name) = (columns.next()?.trim(), columns.next()?.trim());
            let scope = columns.next().unwrap_or("").trim();
            (!id.is_empty() && !scope.starts_with(MCP_SCOPE_PREFIX)).then(|| EngineObject {
                kind,
                id: id.to_owned(),
                name: name.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_dir_is_made_with_its_parents_and_removed_with_what_it_kept() {
        let parent = tempfile::tempdir().unwrap();
        let run = RunDir::make(parent.path().join("suite/run-1")).unwrap();
        assert!(run.path().is_dir());
        assert!(files_under(run.path()).is_empty());
        std::fs::create_dir(run.path().join("home")).unwrap();
        std::fs::write(run.path().join("home/state"), b"kept").unwrap();
        let left = files_under(run.path());
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].name, "home");
        let path = run.path().to_owned();
        run.remove();
        assert!(!path.exists());
        assert!(parent.path().join("suite").is_dir());
    }

    #[test]
    fn every_kind_the_egress_tests_make_is_listed() {
        // A stopped Docker suite leaves the egress tests' origin containers on their networks:
        // both are listed, so both are removed (containers first, then the networks).
        for kind in ["container", "network"] {
            assert!(
                ENGINE_QUERIES.contains(&(kind, "name=maf-egress-test-")),
                "{kind}"
            );
        }
        for kind in ["container", "network", "volume"] {
            assert!(ENGINE_QUERIES.contains(&(kind, "LABEL")), "{kind}");
        }
    }

    #[test]
    fn a_snapshot_reads_back_what_was_written() {
        let objects: BTreeSet<EngineObject> = [
            ("container", "c0ffee", "maf-sandbox-docker-a"),
            ("network", "beef", "maf-egress-test-b"),
            (
                "volume",
                "maf-sandbox-docker-a-egress",
                "maf-sandbox-docker-a-egress",
            ),
        ]
        .into_iter()
        .map(|(kind, id, name)| EngineObject {
            kind,
            id: id.to_owned(),
            name: name.to_owned(),
        })
        .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ci").join("before.tsv");
        write_snapshot(&path, &objects).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(parse_snapshot(&text), objects);
        assert!(parse_snapshot("image\tx\ty\n\ncontainer\n").is_empty());
    }

    #[test]
    fn skipped_counts_come_from_the_summary_line() {
        assert_eq!(
            skipped_count("     Summary [   1.810s] 17 tests run: 17 passed, 0 skipped"),
            0
        );
        assert_eq!(
            skipped_count("Summary [ 2.0s] 9 tests run: 7 passed, 1 failed, 2 skipped"),
            2
        );
        assert_eq!(skipped_count("Summary [ 2.0s] 9 tests run: 9 passed"), 0);
        assert!(is_summary_line("     Summary [   1.810s] 17 tests run"));
        assert!(!is_summary_line("Summary of nothing"));
    }

    #[test]
    fn skip_lines_name_the_test() {
        let line = "        SKIP [         ] backend-docker::live docker_suite::hardening";
        assert!(is_skip_line(line));
        assert_eq!(
            skipped_test_name(line),
            "backend-docker::live docker_suite::hardening"
        );
        assert!(!is_skip_line("        PASS [   0.005s] backend-docker x"));
    }

    #[test]
    fn listings_parse_and_diff_by_identity() {
        let before: BTreeSet<EngineObject> =
            parse_listing("container", "aaa\tmaf-sandbox-docker-1\n")
                .into_iter()
                .collect();
        let after: BTreeSet<EngineObject> = parse_listing(
            "container",
            "aaa\tmaf-sandbox-docker-1\nbbb\tmaf-sandbox-docker-2\n\n",
        )
        .into_iter()
        .collect();
        let left: Vec<&EngineObject> = after.difference(&before).collect();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, "bbb");
        assert_eq!(listing(&left), "  container bbb maf-sandbox-docker-2");
    }

    #[test]
    fn the_mcp_suites_objects_are_left_out_and_no_other() {
        let rows = "aaa\tmaf-sandbox-docker-1\tmcp-e2e-41-docker-w0\n\
                    bbb\tmaf-sandbox-docker-2\tlive-race-7\n\
                    ccc\tmaf-sandbox-docker-3\t\n\
                    ddd\tmaf-sandbox-docker-4\tx-mcp-e2e-1\n";
        let ids: Vec<String> = parse_listing("container", rows)
            .into_iter()
            .map(|object| object.id)
            .collect();
        assert_eq!(ids, ["bbb", "ccc", "ddd"]);
    }
}
