//! The declared MSRV is true: no workspace crate declares a `rust-version` below one its
//! dependencies (normal and build, as resolved for Linux, transitively) declare. A crate that
//! builds only on a newer compiler than it says fails a user's build with an error about a
//! dependency instead of cargo's clear "requires rustc X" refusal.
//!
//! What it does not check: that the crate itself builds on its declared version (no older
//! toolchain can be fetched here); dev-dependencies (a user building the crate never builds
//! them); dependencies of other targets than Linux.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use crate::error::XtaskError;
use crate::process::{capture_in, cargo, Workspace};

/// The deadline of the resolved `cargo metadata`. It needs every dependency's manifest, so on a
/// machine that has not built the workspace yet it downloads them first (`--locked`: the lock
/// file as committed, never updated).
const METADATA_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    resolve: Resolve,
}

#[derive(Debug, Deserialize)]
struct Package {
    id: String,
    name: String,
    rust_version: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    id: String,
    #[serde(default)]
    deps: Vec<NodeDep>,
}

#[derive(Debug, Deserialize)]
struct NodeDep {
    pkg: String,
    #[serde(default)]
    dep_kinds: Vec<DepKind>,
}

#[derive(Debug, Deserialize)]
struct DepKind {
    kind: Option<String>,
    target: Option<String>,
}

/// A `major.minor[.patch]` version, compared numerically.
fn version(text: &str) -> Vec<u64> {
    text.split('.')
        .map(|part| part.parse().unwrap_or(0))
        .chain(std::iter::repeat(0))
        .take(3)
        .collect()
}

/// Whether a dependency edge is built for a user of the crate on Linux.
fn built_on_linux(kinds: &[DepKind]) -> bool {
    kinds.iter().any(|kind| {
        kind.kind.as_deref() != Some("dev")
            && kind.target.as_deref().is_none_or(|target| {
                target.contains("unix")
                    || target.contains("linux")
                    || (target.starts_with("cfg(not(") && !target.contains("unix"))
            })
    })
}

/// One workspace crate whose dependencies need a newer compiler than it declares.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Understated {
    pub(crate) member: String,
    pub(crate) declared: String,
    pub(crate) needed: String,
    pub(crate) by: String,
}

fn check(metadata: &Metadata) -> Vec<Understated> {
    let packages: BTreeMap<&str, &Package> = metadata
        .packages
        .iter()
        .map(|package| (package.id.as_str(), package))
        .collect();
    let edges: BTreeMap<&str, Vec<&str>> = metadata
        .resolve
        .nodes
        .iter()
        .map(|node| {
            let deps = node
                .deps
                .iter()
                .filter(|dep| built_on_linux(&dep.dep_kinds))
                .map(|dep| dep.pkg.as_str())
                .collect();
            (node.id.as_str(), deps)
        })
        .collect();
    let mut found = Vec::new();
    for member in &metadata.workspace_members {
        let Some(package) = packages.get(member.as_str()) else {
            continue;
        };
        let declared = package.rust_version.clone().unwrap_or_else(|| "0".into());
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<&str> = edges
            .get(member.as_str())
            .cloned()
            .unwrap_or_default()
            .into();
        let mut highest: Option<(&str, &str)> = None;
        while let Some(id) = queue.pop_front() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(dependency) = packages.get(id) {
                if let Some(needed) = dependency.rust_version.as_deref() {
                    if highest.is_none_or(|(_, best)| version(needed) > version(best)) {
                        highest = Some((dependency.name.as_str(), needed));
                    }
                }
            }
            queue.extend(edges.get(id).into_iter().flatten());
        }
        if let Some((by, needed)) = highest {
            if version(needed) > version(&declared) {
                found.push(Understated {
                    member: package.name.clone(),
                    declared,
                    needed: needed.to_owned(),
                    by: by.to_owned(),
                });
            }
        }
    }
    found
}

/// Checks every workspace crate's `rust-version` against its dependencies'.
///
/// # Errors
/// [`XtaskError::Layering`] naming each understated crate; the metadata call's failure.
pub fn run(workspace: &Workspace) -> Result<(), XtaskError> {
    let mut command: Command = cargo();
    command.args([
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--filter-platform",
        "x86_64-unknown-linux-gnu",
    ]);
    let text = capture_in(workspace.root(), &mut command, METADATA_TIMEOUT)?;
    let metadata: Metadata = serde_json::from_str(&text).map_err(|error| XtaskError::Layering {
        count: 1,
        listing: format!("cargo metadata's output does not parse: {error}"),
    })?;
    let understated = check(&metadata);
    if understated.is_empty() {
        eprintln!(
            "layering: every crate's rust-version is at least its dependencies' ({} crates)",
            metadata.workspace_members.len()
        );
        return Ok(());
    }
    Err(XtaskError::Layering {
        count: understated.len(),
        listing: understated
            .iter()
            .map(|u| {
                format!(
                    "`{}` declares rust-version {} but its dependency `{}` needs {}",
                    u.member, u.declared, u.by, u.needed
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(json: serde_json::Value) -> Metadata {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_transitive_dependency_above_the_declared_version_is_named() {
        let found = check(&metadata(serde_json::json!({
            "workspace_members": ["m", "ok"],
            "packages": [
                {"id": "m", "name": "m", "rust_version": "1.85"},
                {"id": "ok", "name": "ok", "rust_version": "1.90"},
                {"id": "a", "name": "a", "rust_version": "1.70"},
                {"id": "b", "name": "b", "rust_version": "1.88.0"},
                {"id": "dev", "name": "dev", "rust_version": "1.95"},
                {"id": "win", "name": "win", "rust_version": "1.95"}
            ],
            "resolve": {"nodes": [
                {"id": "m", "deps": [
                    {"pkg": "a", "dep_kinds": [{"kind": null, "target": null}]},
                    {"pkg": "dev", "dep_kinds": [{"kind": "dev", "target": null}]},
                    {"pkg": "win", "dep_kinds": [{"kind": null, "target": "cfg(windows)"}]}
                ]},
                {"id": "ok", "deps": [{"pkg": "a", "dep_kinds": [{"kind": null, "target": null}]}]},
                {"id": "a", "deps": [{"pkg": "b", "dep_kinds": [{"kind": "build", "target": null}]}]},
                {"id": "b", "deps": []},
                {"id": "dev", "deps": []},
                {"id": "win", "deps": []}
            ]}
        })));
        assert_eq!(
            found,
            vec![Understated {
                member: "m".into(),
                declared: "1.85".into(),
                needed: "1.88.0".into(),
                by: "b".into(),
            }]
        );
    }

    #[test]
    fn versions_compare_by_number() {
        assert!(version("1.100") > version("1.99.9"));
        assert_eq!(version("1.88"), version("1.88.0"));
    }
}
