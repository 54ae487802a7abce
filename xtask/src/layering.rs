//! The layering check: which crate of the workspace may depend on which.
//!
//! It reads the declared dependencies of every workspace member from `cargo metadata` and fails
//! with one line per broken rule. The rules, and why each exists, are in
//! `docs/architecture.md#layering-rules`; in short:
//!
//! - the leaves (`bounded-process`, `confined-fs`, `token-server`, `host-state`) and the
//!   contract (`sandbox-core`) depend on nothing of ours, so each can be read and tested alone;
//!   `exec-wrapper` (the guest protocol) depends on the `bounded-process` leaf only, whose
//!   outcome it reads;
//! - `wrapper-stream` joins `exec-wrapper` (and the runner's sink shape) and `sandbox-core` and
//!   nothing else;
//! - `sbx-cli` depends on `bounded-process` only, `sbx-sim` on it and the `host-state` leaf;
//! - `conformance` depends on `sandbox-core` (and the `token-server` leaf) only, so the suites
//!   attack the contract and never a backend's internals;
//! - `vm-agent` (the guest agent and its protocol) depends on nothing of ours, and `qemu-vm`
//!   on `vm-agent` and `bounded-process` only;
//! - no backend (`backend-*`) depends on another backend;
//! - `host-files` (the guarded opener of host files) depends on the core only;
//! - `sandbox-backends` (the one place hosts name concrete backends) depends on the core, the
//!   backends, `bounded-process`, `qemu-vm` (the microVM image) and `host-files`; `sandbox-mcp`
//!   reaches backends (and the host-file guard) only through it (and takes its handles from the
//!   `host-state` leaf);
//! - `sandbox-core`'s in-process fake backend (its `testing` feature) is enabled only from
//!   dev-dependencies, so no binary of ours links it;
//! - `sandbox-core` does no I/O: its normal dependencies are a short allow-list, and a new one
//!   fails the check until someone decides it belongs there;
//! - `paired-bench` (the benches' measurement) depends on nothing of ours and is any crate's
//!   dev-dependency, never a normal or build one, so no library or binary of ours links it.
//!
//! The same command runs two checks inside each crate: no three modules import each other in a
//! circle ([`crate::module_circles`]), and a type's inherent impls live in the module defining it
//! ([`crate::split_impls`], with its allow-list of splits that remain).
//!
//! Rules name crates; a crate that does not exist yet has no edges and breaks nothing. The rules
//! apply to every dependency kind (normal, build and dev): a leaf whose tests import a higher
//! layer is no longer testable alone. A crate's dev-dependency on itself (to turn on its own
//! test features) is not an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::error::XtaskError;
use crate::process::{capture_in, cargo, Workspace};

/// The deadline of `cargo metadata --no-deps` (it resolves nothing, so it takes well under a
/// second; the margin is for a loaded machine).
const METADATA_TIMEOUT: Duration = Duration::from_secs(120);

/// The crate whose test feature and dependencies are policed.
const CORE: &str = "sandbox-core";

/// The feature of [`CORE`] that compiles its in-process fake backend.
const TESTING_FEATURE: &str = "testing";

/// The normal dependencies [`CORE`] may have. None of them does I/O on the core's behalf:
/// tokio is there for its sync primitives and timers; `host-tools` without its `relay`
/// feature is frames, schemas and a dispatcher over the reader and writer the core hands it. Adding a crate here is a design decision
/// (see `docs/architecture.md#layering-rules`), not a formality.
const CORE_ALLOWED_DEPENDENCIES: &[&str] = &[
    "async-trait",
    "base64",
    "host-tools",
    "sha2",
    "thiserror",
    "tokio",
    "tracing",
];

/// Which crates of ours a crate may depend on, for the crates whose position in the stack is
/// fixed. A crate not named here is constrained only by the backend rule.
const MAY_DEPEND_ON: &[(&str, &[&str])] = &[
    ("bounded-process", &[]),
    ("exec-wrapper", &["bounded-process"]),
    ("confined-fs", &[]),
    ("sandbox-core", &["host-tools"]),
    ("host-tools", &[]),
    ("sbx-cli", &["bounded-process"]),
    ("sbx-sim", &["bounded-process", "host-state"]),
    ("token-server", &[]),
    ("host-state", &[]),
    (
        "wrapper-stream",
        &["sandbox-core", "exec-wrapper", "bounded-process"],
    ),
    (
        "conformance",
        &["sandbox-core", "token-server", "host-tools"],
    ),
    ("egress-proxy", &["sandbox-core"]),
    (
        "sandbox-backends",
        &[
            "sandbox-core",
            "backend-docker",
            "backend-sbx",
            "bounded-process",
            "qemu-vm",
            "backend-qemu",
            "host-files",
        ],
    ),
    ("host-files", &["sandbox-core"]),
    (
        "sandbox-mcp",
        &["sandbox-core", "sandbox-backends", "host-state"],
    ),
    ("vm-agent", &[]),
    ("qemu-vm", &["vm-agent", "bounded-process"]),
    (BENCH_MEASUREMENT, &[]),
];

/// The benches' measurement: any crate may take it as a dev-dependency (its benches are dev
/// targets), none as a normal or build dependency.
const BENCH_MEASUREMENT: &str = "paired-bench";

/// Crates whose name starts with this are backends; no backend depends on another.
const BACKEND_PREFIX: &str = "backend-";

/// Reads the workspace's metadata and checks it against the rules and the fields publishing
/// needs ([`crate::packaging`]), then checks that no code comment cites a document outside the
/// repository ([`crate::citations`]).
pub fn run(workspace: &Workspace) -> Result<(), XtaskError> {
    let packages = read_packages(workspace)?;
    check(&packages)?;
    eprintln!(
        "layering: {} crates, {} internal edges, every rule holds",
        packages.len(),
        internal_edge_count(&packages)
    );
    crate::packaging::check(
        packages
            .iter()
            .map(|package| (package.name.as_str(), &package.manifest)),
    )?;
    eprintln!("layering: every publishable crate has its readme, keywords and categories");
    crate::msrv::run(workspace)?;
    let circles = module_circles(&packages)?;
    report_module_circles(&circles)?;
    report_split_impls(&split_impls(&packages)?)?;
    // Not a dependency rule, but the same kind of structural check, cheap enough to ride along.
    crate::citations::check(workspace.root())?;
    eprintln!("layering: no comment cites a document outside the repository");
    crate::doc_links::check(workspace.root())?;
    eprintln!("layering: every citation of docs/ and every link between documents resolves");
    Ok(())
}

/// The workspace members and their declared dependencies. `--no-deps` because the rules are
/// about what the manifests declare, not what the resolver picked.
fn read_packages(workspace: &Workspace) -> Result<Vec<Package>, XtaskError> {
    let mut command: Command = cargo();
    command.args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]);
    parse(&capture_in(
        workspace.root(),
        &mut command,
        METADATA_TIMEOUT,
    )?)
}

/// The names of the workspace's binaries, but for the fuzz targets (which only `cargo fuzz`
/// builds usefully: in a test build they only cost libFuzzer's C++ compile).
///
/// # Errors
/// When `cargo metadata` fails or its output does not parse.
pub(crate) fn binaries_but_fuzz_targets(workspace: &Workspace) -> Result<Vec<String>, XtaskError> {
    Ok(binaries_but_fuzz(&read_packages(workspace)?))
}

fn binaries_but_fuzz(packages: &[Package]) -> Vec<String> {
    packages
        .iter()
        .filter(|package| {
            let fuzz = package
                .metadata
                .as_ref()
                .and_then(|metadata| metadata.get("cargo-fuzz"))
                .and_then(serde_json::Value::as_bool);
            fuzz != Some(true)
        })
        .flat_map(|package| &package.targets)
        .filter(|target| target.kind.iter().any(|kind| kind == "bin"))
        .map(|target| target.name.clone())
        .collect()
}

/// The part of `cargo metadata` the rules read.
#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

/// One workspace member.
#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    /// Its build targets; the library and binaries are read for module circles.
    #[serde(default)]
    targets: Vec<Target>,
    #[serde(default)]
    dependencies: Vec<Dependency>,
    /// The `[features]` table: feature name to what it enables.
    #[serde(default)]
    features: BTreeMap<String, Vec<String>>,
    /// `[package.metadata]`: `cargo-fuzz = true` marks the fuzz targets' package.
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    /// The fields publishing needs ([`crate::packaging`]).
    #[serde(flatten)]
    manifest: crate::packaging::Manifest,
}

/// One build target of a member.
#[derive(Debug, Deserialize)]
struct Target {
    /// Its name (a binary's is the file cargo builds).
    #[serde(default)]
    name: String,
    /// `lib`, `bin`, `test`, `bench`, `example`, `custom-build`, ...
    kind: Vec<String>,
    /// Its root source file.
    src_path: std::path::PathBuf,
}

impl Target {
    /// Whether the target is the crate's own code (its library or a binary), not a test, bench,
    /// example or build script.
    fn is_crate_code(&self) -> bool {
        self.kind
            .iter()
            .any(|kind| matches!(kind.as_str(), "lib" | "rlib" | "bin" | "proc-macro"))
    }
}

/// Every member's module circles of three or more, as `(crate, members)`.
fn module_circles(packages: &[Package]) -> Result<Vec<(String, Vec<String>)>, XtaskError> {
    let mut found = Vec::new();
    for package in packages {
        let roots: Vec<std::path::PathBuf> = package
            .targets
            .iter()
            .filter(|target| target.is_crate_code())
            .map(|target| target.src_path.clone())
            .collect();
        for circle in crate::module_circles::circles_of_crate(&roots)? {
            found.push((package.name.clone(), circle));
        }
    }
    Ok(found)
}

/// Fails on any circle, listing each with its crate and members; says so when there is none.
fn report_module_circles(circles: &[(String, Vec<String>)]) -> Result<(), XtaskError> {
    let line = |(name, members): &(String, Vec<String>)| {
        format!(
            "`{name}`: modules {} import each other in a circle",
            members.join(", ")
        )
    };
    if circles.is_empty() {
        eprintln!("layering: 0 module circles of three or more");
        Ok(())
    } else {
        Err(XtaskError::ModuleCircles {
            count: circles.len(),
            listing: circles.iter().map(line).collect::<Vec<_>>().join("\n"),
        })
    }
}

/// Every member's types whose inherent impls are split across modules, but the allowed ones.
fn split_impls(packages: &[Package]) -> Result<Vec<crate::split_impls::Split>, XtaskError> {
    let mut found = Vec::new();
    for package in packages {
        for target in package.targets.iter().filter(|t| t.is_crate_code()) {
            for split in crate::split_impls::splits_of_root(&package.name, &target.src_path)? {
                if !found.contains(&split) {
                    found.push(split);
                }
            }
        }
    }
    Ok(found)
}

/// Fails on any split, one line each; says so when there is none.
fn report_split_impls(splits: &[crate::split_impls::Split]) -> Result<(), XtaskError> {
    if splits.is_empty() {
        eprintln!(
            "layering: no type's inherent impls split across modules ({} allowed)",
            crate::split_impls::ALLOWED_SPLITS.len()
        );
        Ok(())
    } else {
        Err(XtaskError::SplitImpls {
            count: splits.len(),
            listing: splits
                .iter()
                .map(crate::split_impls::Split::line)
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }
}

/// One declared dependency.
#[derive(Debug, Deserialize)]
struct Dependency {
    /// The package's own name (also when it is renamed in the manifest).
    name: String,
    /// The name the manifest gives it, when renamed; feature strings use this one.
    rename: Option<String>,
    /// `None` for a normal dependency, else `dev` or `build`.
    kind: Option<String>,
    #[serde(default)]
    features: Vec<String>,
}

impl Dependency {
    fn is_dev(&self) -> bool {
        self.kind.as_deref() == Some("dev")
    }

    fn kind_label(&self) -> &str {
        self.kind.as_deref().unwrap_or("normal")
    }

    /// The name feature strings (`dep/feature`) use for it.
    fn local_name(&self) -> &str {
        self.rename.as_deref().unwrap_or(&self.name)
    }
}

fn parse(json: &str) -> Result<Vec<Package>, XtaskError> {
    serde_json::from_str::<Metadata>(json)
        .map(|metadata| metadata.packages)
        .map_err(|source| XtaskError::Metadata {
            reason: source.to_string(),
        })
}

/// Checks every rule; the error lists every violation, one per line.
fn check(packages: &[Package]) -> Result<(), XtaskError> {
    let violations = violations(packages);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Layering {
            count: violations.len(),
            listing: violations.join("\n"),
        })
    }
}

/// The dependencies of `package` on workspace members other than itself.
fn internal_dependencies<'a>(
    package: &'a Package,
    members: &'a BTreeSet<&'a str>,
) -> impl Iterator<Item = &'a Dependency> + 'a {
    package.dependencies.iter().filter(move |dependency| {
        dependency.name != package.name && members.contains(dependency.name.as_str())
    })
}

fn internal_edge_count(packages: &[Package]) -> usize {
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|package| package.name.as_str())
        .collect();
    packages
        .iter()
        .map(|package| internal_dependencies(package, &members).count())
        .sum()
}

fn violations(packages: &[Package]) -> Vec<String> {
    let members: BTreeSet<&str> = packages
        .iter()
        .map(|package| package.name.as_str())
        .collect();
    let mut found = Vec::new();
    for package in packages {
        let allowed = MAY_DEPEND_ON
            .iter()
            .find(|(name, _)| *name == package.name)
            .map(|(_, allowed)| *allowed);
        for dependency in internal_dependencies(package, &members) {
            if dependency.name == BENCH_MEASUREMENT {
                if !dependency.is_dev() {
                    found.push(format!(
                        "`{}` has a {} dependency on `{BENCH_MEASUREMENT}`, which is for \
                         benches only (a dev-dependency)",
                        package.name,
                        dependency.kind_label(),
                    ));
                }
                continue;
            }
            if let Some(allowed) = allowed {
                if !allowed.contains(&dependency.name.as_str()) {
                    found.push(format!(
                        "`{}` has a {} dependency on `{}`, but may depend {}",
                        package.name,
                        dependency.kind_label(),
                        dependency.name,
                        may_depend_on(allowed)
                    ));
                }
            }
            if package.name.starts_with(BACKEND_PREFIX)
                && dependency.name.starts_with(BACKEND_PREFIX)
            {
                found.push(format!(
                    "backend `{}` has a {} dependency on backend `{}`; backends never import \
                     each other (shared machinery belongs in a lower layer)",
                    package.name,
                    dependency.kind_label(),
                    dependency.name
                ));
            }
        }
        found.extend(testing_feature_violations(package));
        if package.name == CORE {
            found.extend(core_dependency_violations(package));
        }
    }
    found
}

/// How an allowed set reads after "may depend": on nothing of ours, or only on the named crates.
fn may_depend_on(allowed: &[&str]) -> String {
    if allowed.is_empty() {
        "on nothing of ours".to_owned()
    } else {
        format!("only on {}", describe_allowed(allowed))
    }
}

fn describe_allowed(allowed: &[&str]) -> String {
    if allowed.is_empty() {
        "nothing of ours".to_owned()
    } else {
        allowed
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Places where `package` turns on the core's `testing` feature outside a dev-dependency.
fn testing_feature_violations(package: &Package) -> Vec<String> {
    let mut found = Vec::new();
    if package.name == CORE {
        // Its own default set would switch the fake on for every dependent.
        if package
            .features
            .get("default")
            .is_some_and(|enabled| enabled.iter().any(|entry| entry == TESTING_FEATURE))
        {
            found.push(format!(
                "`{CORE}` enables `{TESTING_FEATURE}` by default; the fake backend must be \
                 opted into"
            ));
        }
        return found;
    }
    let core_dependencies = package
        .dependencies
        .iter()
        .filter(|dependency| dependency.name == CORE);
    for dependency in core_dependencies {
        if !dependency.is_dev()
            && dependency
                .features
                .iter()
                .any(|feature| feature == TESTING_FEATURE)
        {
            found.push(format!(
                "`{}` enables `{CORE}/{TESTING_FEATURE}` in a {} dependency; the fake backend \
                 may be enabled only from dev-dependencies",
                package.name,
                dependency.kind_label(),
            ));
        }
        // A feature of the package itself can switch it on too, as `dep/testing` or
        // `dep?/testing`, whatever the dependency's kind (features apply to normal builds).
        let plain = format!("{}/{TESTING_FEATURE}", dependency.local_name());
        let weak = format!("{}?/{TESTING_FEATURE}", dependency.local_name());
        for (feature, enabled) in &package.features {
            if enabled
                .iter()
                .any(|entry| *entry == plain || *entry == weak)
            {
                found.push(format!(
                    "`{}`'s feature `{feature}` enables `{CORE}/{TESTING_FEATURE}`; the fake \
                     backend may be enabled only from dev-dependencies",
                    package.name,
                ));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Normal or build dependencies of the core that are not on its allow-list.
fn core_dependency_violations(core: &Package) -> Vec<String> {
    core.dependencies
        .iter()
        .filter(|dependency| !dependency.is_dev())
        .filter(|dependency| !CORE_ALLOWED_DEPENDENCIES.contains(&dependency.name.as_str()))
        .filter(|dependency| dependency.name != CORE)
        .map(|dependency| {
            format!(
                "`{CORE}` gained a {} dependency on `{}`; the core does no I/O and may depend \
                 only on {} (extend the allow-list in xtask/src/layering.rs only if `{}` does \
                 no I/O for the core)",
                dependency.kind_label(),
                dependency.name,
                describe_allowed(CORE_ALLOWED_DEPENDENCIES),
                dependency.name
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A package for synthetic metadata: `dependencies` as `(name, kind, features)`.
    fn package(name: &str, dependencies: &[(&str, Option<&str>, &[&str])]) -> serde_json::Value {
        serde_json::json!({
            "name": name,
            "version": "0.1.0",
            "features": {},
            "dependencies": dependencies
                .iter()
                .map(|(name, kind, features)| serde_json::json!({
                    "name": name,
                    "rename": null,
                    "kind": kind,
                    "features": features,
                    "optional": false,
                    "target": null,
                }))
                .collect::<Vec<_>>(),
        })
    }

    /// The workspace as it stands, plus the crates being added, with their intended edges.
    fn sound_workspace() -> Vec<serde_json::Value> {
        vec![
            package(
                "bounded-process",
                &[("tokio", None, &[]), ("rustix", None, &[])],
            ),
            package(
                "exec-wrapper",
                &[("bounded-process", None, &[]), ("rustix", None, &[])],
            ),
            package("confined-fs", &[("rustix", None, &[])]),
            package(
                "sandbox-core",
                &[
                    ("tokio", None, &[]),
                    ("sha2", None, &[]),
                    ("serde_json", Some("dev"), &[]),
                    ("sandbox-core", Some("dev"), &["testing"]),
                ],
            ),
            package("sbx-cli", &[("bounded-process", None, &[])]),
            package("sbx-sim", &[("bounded-process", None, &[])]),
            package(
                "conformance",
                &[
                    ("sandbox-core", None, &[]),
                    ("sandbox-core", Some("dev"), &["testing"]),
                ],
            ),
            package(
                "backend-docker",
                &[
                    ("sandbox-core", None, &[]),
                    ("exec-wrapper", None, &[]),
                    ("bounded-process", None, &[]),
                    ("conformance", Some("dev"), &[]),
                ],
            ),
            package(
                "backend-sbx",
                &[
                    ("sandbox-core", None, &[]),
                    ("sbx-cli", None, &[]),
                    ("confined-fs", None, &[]),
                    ("sbx-sim", Some("dev"), &[]),
                ],
            ),
            package(
                "sandboxctl",
                &[
                    ("sandbox-core", None, &[]),
                    ("backend-docker", None, &[]),
                    ("backend-sbx", None, &[]),
                ],
            ),
            package(
                "examples",
                &[
                    ("sandbox-core", Some("dev"), &["testing"]),
                    ("backend-docker", Some("dev"), &[]),
                ],
            ),
            package("xtask", &[("backend-docker", None, &[])]),
        ]
    }

    fn metadata(packages: Vec<serde_json::Value>) -> String {
        serde_json::json!({ "packages": packages, "version": 1 }).to_string()
    }

    fn violations_of(packages: Vec<serde_json::Value>) -> Vec<String> {
        violations(&parse(&metadata(packages)).unwrap())
    }

    /// `sound_workspace` with `name`'s package replaced.
    fn with(name: &str, replacement: serde_json::Value) -> Vec<serde_json::Value> {
        let mut packages = sound_workspace();
        let slot = packages
            .iter_mut()
            .find(|package| package["name"] == name)
            .unwrap();
        *slot = replacement;
        packages
    }

    #[test]
    fn the_intended_stack_passes() {
        assert_eq!(violations_of(sound_workspace()), Vec::<String>::new());
    }

    #[test]
    fn crates_that_do_not_exist_yet_break_nothing() {
        let only_core = vec![
            package("sandbox-core", &[("tokio", None, &[])]),
            package("conformance", &[("sandbox-core", None, &[])]),
        ];
        assert_eq!(violations_of(only_core), Vec::<String>::new());
        // A dependency on a crate that is not a member (a crates.io crate) is not an edge.
        let external = vec![package("exec-wrapper", &[("backend-elsewhere", None, &[])])];
        assert_eq!(violations_of(external), Vec::<String>::new());
    }

    #[test]
    fn a_leaf_depending_on_the_core_fails_naming_both() {
        let found = violations_of(with(
            "bounded-process",
            package("bounded-process", &[("sandbox-core", None, &[])]),
        ));
        assert_eq!(
            found,
            vec![
                "`bounded-process` has a normal dependency on `sandbox-core`, but may depend on \
                 nothing of ours"
            ]
        );
    }

    #[test]
    fn any_crate_benches_with_the_measurement_but_never_links_it() {
        let mut packages = with(
            "confined-fs",
            package("confined-fs", &[("paired-bench", Some("dev"), &[])]),
        );
        packages.push(package("paired-bench", &[("serde_json", None, &[])]));
        assert_eq!(violations_of(packages.clone()), Vec::<String>::new());

        let slot = packages
            .iter_mut()
            .find(|package| package["name"] == "confined-fs")
            .unwrap();
        *slot = package("confined-fs", &[("paired-bench", None, &[])]);
        assert_eq!(
            violations_of(packages.clone()),
            vec![
                "`confined-fs` has a normal dependency on `paired-bench`, which is for benches \
                 only (a dev-dependency)"
            ]
        );

        // The measurement itself stays below every layer.
        packages.push(package("paired-bench", &[("sandbox-core", None, &[])]));
        let found = violations_of(packages);
        assert!(
            found.iter().any(|line| line
                .contains("`paired-bench` has a normal dependency on `sandbox-core`, but may depend on nothing of ours")),
            "{found:?}"
        );
    }

    #[test]
    fn a_leaf_test_importing_a_higher_layer_fails() {
        let found = violations_of(with(
            "confined-fs",
            package("confined-fs", &[("sandbox-core", Some("dev"), &[])]),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("`confined-fs` has a dev dependency on `sandbox-core`"));
    }

    #[test]
    fn the_cli_wrappers_may_use_only_the_runner_crate() {
        for (name, allowed) in [
            ("sbx-cli", "`bounded-process`"),
            ("sbx-sim", "`bounded-process`, `host-state`"),
        ] {
            let found = violations_of(with(
                name,
                package(
                    name,
                    &[("bounded-process", None, &[]), ("sandbox-core", None, &[])],
                ),
            ));
            assert_eq!(
                found,
                vec![format!(
                    "`{name}` has a normal dependency on `sandbox-core`, but may depend only on \
                     {allowed}"
                )]
            );
        }
        let found = violations_of(with(
            "sbx-cli",
            package("sbx-cli", &[("confined-fs", Some("build"), &[])]),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("build dependency on `confined-fs`"));
    }

    #[test]
    fn the_core_depending_on_a_crate_of_ours_fails() {
        let found = violations_of(with(
            "sandbox-core",
            package(
                "sandbox-core",
                &[("tokio", None, &[]), ("exec-wrapper", None, &[])],
            ),
        ));
        // Both the layering rule and the I/O allow-list name it.
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|line| line.contains("`exec-wrapper`")));
    }

    #[test]
    fn conformance_reaching_into_a_backend_fails() {
        let found = violations_of(with(
            "conformance",
            package(
                "conformance",
                &[
                    ("sandbox-core", None, &[]),
                    ("backend-docker", Some("dev"), &[]),
                ],
            ),
        ));
        assert_eq!(
            found,
            vec![
                "`conformance` has a dev dependency on `backend-docker`, but may depend only on \
                 `sandbox-core`, `token-server`, `host-tools`"
            ]
        );
    }

    #[test]
    fn a_backend_importing_another_backend_fails() {
        let found = violations_of(with(
            "backend-sbx",
            package(
                "backend-sbx",
                &[("sandbox-core", None, &[]), ("backend-docker", None, &[])],
            ),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "backend `backend-sbx` has a normal dependency on backend `backend-docker`"
            ),
            "{found:?}"
        );
        // Also from tests: a backend's tests run the suites, not another backend.
        let found = violations_of(with(
            "backend-docker",
            package("backend-docker", &[("backend-sbx", Some("dev"), &[])]),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn the_fake_backend_in_a_normal_dependency_fails() {
        let found = violations_of(with(
            "sandboxctl",
            package("sandboxctl", &[("sandbox-core", None, &["testing"])]),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .starts_with("`sandboxctl` enables `sandbox-core/testing` in a normal dependency"),
            "{found:?}"
        );
        // In a dev-dependency it is what the feature is for.
        let found = violations_of(with(
            "sandboxctl",
            package("sandboxctl", &[("sandbox-core", Some("dev"), &["testing"])]),
        ));
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn the_examples_get_the_fake_backend_only_as_a_dev_dependency() {
        let found = violations_of(with(
            "examples",
            package("examples", &[("sandbox-core", None, &["testing"])]),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0]
                .starts_with("`examples` enables `sandbox-core/testing` in a normal dependency"),
            "{found:?}"
        );
    }

    #[test]
    fn the_fake_backend_behind_a_feature_fails_even_under_a_rename() {
        let mut sneaky = package("backend-sbx", &[("sandbox-core", None, &[])]);
        sneaky["dependencies"][0]["rename"] = "core".into();
        sneaky["features"] = serde_json::json!({ "fake": ["core?/testing"] });
        let found = violations_of(with("backend-sbx", sneaky));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("`backend-sbx`'s feature `fake` enables `sandbox-core/testing`"),
            "{found:?}"
        );
    }

    #[test]
    fn the_fake_backend_on_by_default_fails() {
        let mut core = package("sandbox-core", &[("tokio", None, &[])]);
        core["features"] = serde_json::json!({ "default": ["testing"], "testing": [] });
        let found = violations_of(with("sandbox-core", core));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("enables `testing` by default"),
            "{found:?}"
        );
    }

    #[test]
    fn an_io_dependency_of_the_core_fails_naming_it() {
        let found = violations_of(with(
            "sandbox-core",
            package(
                "sandbox-core",
                &[
                    ("tokio", None, &[]),
                    ("reqwest", None, &[]),
                    // Test-only crates are free.
                    ("tempfile", Some("dev"), &[]),
                ],
            ),
        ));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("`sandbox-core` gained a normal dependency on `reqwest`"),
            "{found:?}"
        );
    }

    #[test]
    fn every_violation_is_reported_at_once() {
        let mut packages = with(
            "exec-wrapper",
            package("exec-wrapper", &[("confined-fs", None, &[])]),
        );
        packages.push(package("backend-k8s", &[("backend-docker", None, &[])]));
        let error = check(&parse(&metadata(packages)).unwrap()).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("2 layering violation"), "{text}");
        assert!(
            text.contains("`exec-wrapper`") && text.contains("`backend-k8s`"),
            "{text}"
        );
    }

    #[test]
    fn malformed_metadata_is_an_error_not_a_pass() {
        assert!(matches!(
            parse("{\"packages\": 3}"),
            Err(XtaskError::Metadata { .. })
        ));
        assert!(matches!(parse(""), Err(XtaskError::Metadata { .. })));
    }

    #[test]
    fn the_real_workspace_passes() {
        let packages = read_packages(&Workspace::locate().unwrap()).unwrap();
        // The check read the real graph, not an empty one.
        let names: BTreeSet<&str> = packages
            .iter()
            .map(|package| package.name.as_str())
            .collect();
        for name in [
            "bounded-process",
            "exec-wrapper",
            "confined-fs",
            "sandbox-core",
            "conformance",
        ] {
            assert!(names.contains(name), "{name} missing from {names:?}");
        }
        assert!(internal_edge_count(&packages) >= 5);
        assert_eq!(violations(&packages), Vec::<String>::new());
        // No crate is excused: every module circle of three or more fails the check.
        assert_eq!(
            module_circles(&packages).unwrap(),
            Vec::<(String, Vec<String>)>::new()
        );
    }

    #[test]
    fn every_circle_fails_and_is_listed_with_its_crate() {
        let circle = |name: &str| {
            (
                name.to_owned(),
                vec!["a".to_owned(), "b".into(), "c".into()],
            )
        };
        let error = report_module_circles(&[circle("conformance"), circle("backend-docker")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("2 module circle"), "{error}");
        for name in ["conformance", "backend-docker"] {
            assert!(
                error.contains(&format!("`{name}`: modules a, b, c import each other")),
                "{error}"
            );
        }
        let one = report_module_circles(&[circle("sandbox-core")])
            .unwrap_err()
            .to_string();
        assert!(one.contains("1 module circle"), "{one}");
        assert!(report_module_circles(&[]).is_ok());
    }

    #[test]
    fn only_the_library_and_binaries_are_read_for_circles() {
        let target = |kind: &str| Target {
            name: "x".to_owned(),
            kind: vec![kind.to_owned()],
            src_path: "src/x.rs".into(),
        };
        for code in ["lib", "bin", "proc-macro"] {
            assert!(target(code).is_crate_code(), "{code}");
        }
        for other in ["test", "bench", "example", "custom-build"] {
            assert!(!target(other).is_crate_code(), "{other}");
        }
    }

    #[test]
    fn the_shared_binaries_are_every_binary_but_the_fuzz_targets() {
        let targets = |names: &[(&str, &str)]| {
            names
                .iter()
                .map(|(name, kind)| serde_json::json!({"name": name, "kind": [kind], "src_path": "x.rs"}))
                .collect::<Vec<_>>()
        };
        let mut tool = package("sandboxctl", &[]);
        tool["targets"] = targets(&[
            ("sandboxctl", "bin"),
            ("sandboxctl", "lib"),
            ("cli", "bench"),
        ])
        .into();
        let mut sim = package("sbx-sim", &[]);
        sim["targets"] = targets(&[("sbx-sim", "bin"), ("sbx", "bin")]).into();
        sim["metadata"] = serde_json::json!({"cargo-fuzz": false});
        let mut fuzz = package("sandboxes-fuzz", &[]);
        fuzz["targets"] = targets(&[("exec_result_parse", "bin")]).into();
        fuzz["metadata"] = serde_json::json!({"cargo-fuzz": true});
        let packages = parse(&metadata(vec![tool, sim, fuzz])).unwrap();
        assert_eq!(
            binaries_but_fuzz(&packages),
            ["sandboxctl", "sbx-sim", "sbx"]
        );
    }
}
