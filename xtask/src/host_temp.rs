//! What `ci` leaves in the host's temporary directory: every entry there whose name starts with
//! one of the project's prefixes ([`PREFIXES`]) is listed before the first step and again after
//! the last, and a new one fails the run. Tests work in directories they make and remove; the
//! guest scripts' per-call files (`/tmp/maf-sbx-<nonce>.…`), which tests that run the scripts on
//! this host cannot move elsewhere, are removed by those tests.
//!
//! The check judges by difference, so entries that were there before the run never count; an
//! entry made meanwhile by anything else on the machine with one of these prefixes counts too
//! (on CI's own machine nothing else runs).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::XtaskError;

/// The starts of the names the workspace's code and tests give to what they make in the host's
/// temporary directory: the guest scripts' per-call files and the images' scratch trees
/// (`maf-`), the default state directories of the qemu backend and the MCP server, the
/// prefixes tests pass to `tempfile`, the MCP suite's qemu runs, and `tempfile`'s own default.
pub const PREFIXES: &[&str] = &[
    "maf-",
    "sandboxes-",
    "sandbox-mcp-",
    "sandboxctl-",
    "mcp-e2e-",
    "exec-wrapper-",
    "exec-init-",
    "host-files-",
    "sbx-sim-",
    "live-cli-",
    "hardening-",
    "xtask-",
    "bq-",
    ".tmp",
];

/// The project's entries of one directory at one moment.
#[derive(Debug)]
pub struct TempSnapshot {
    dir: PathBuf,
    names: BTreeSet<OsString>,
}

impl TempSnapshot {
    /// The project's entries of `dir` now.
    pub fn take(dir: &Path) -> Result<TempSnapshot, XtaskError> {
        Ok(TempSnapshot {
            dir: dir.to_path_buf(),
            names: project_entries(dir)?,
        })
    }

    /// Fails with every project entry of the directory that was not there when the snapshot was
    /// taken.
    pub fn check_nothing_new(&self) -> Result<(), XtaskError> {
        let now = project_entries(&self.dir)?;
        let new: Vec<String> = now
            .difference(&self.names)
            .map(|name| format!("  {}", self.dir.join(name).display()))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        Err(XtaskError::TempLeftovers {
            dir: self.dir.display().to_string(),
            count: new.len(),
            listing: new.join("\n"),
        })
    }
}

/// Whether `name` is one the project's code or tests give.
fn is_project_name(name: &str) -> bool {
    PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// The names in `dir` that start with one of [`PREFIXES`].
fn project_entries(dir: &Path) -> Result<BTreeSet<OsString>, XtaskError> {
    let read = std::fs::read_dir(dir).map_err(|source| XtaskError::Io {
        action: "listing",
        path: dir.display().to_string(),
        source,
    })?;
    let mut names = BTreeSet::new();
    for entry in read {
        let entry = entry.map_err(|source| XtaskError::Io {
            action: "listing",
            path: dir.display().to_string(),
            source,
        })?;
        let name = entry.file_name();
        if is_project_name(&name.to_string_lossy()) {
            names.insert(name);
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_entries_with_a_project_prefix_fail_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::write(at("maf-sbx-old.pgid.cancel"), b"").unwrap();
        std::fs::write(at("unrelated"), b"").unwrap();
        let snapshot = TempSnapshot::take(dir.path()).unwrap();
        snapshot.check_nothing_new().unwrap();

        // What others make, and what was there before, never counts.
        std::fs::write(at("systemd-private-x"), b"").unwrap();
        std::fs::write(at("tmpabc"), b"").unwrap();
        snapshot.check_nothing_new().unwrap();

        std::fs::write(at("maf-sbx-0011.pgid.cancel"), b"").unwrap();
        std::fs::create_dir(at(".tmpXyZ12")).unwrap();
        let error = snapshot.check_nothing_new().unwrap_err();
        let XtaskError::TempLeftovers { count, listing, .. } = &error else {
            panic!("{error}");
        };
        assert_eq!(*count, 2, "{listing}");
        assert_eq!(
            listing.lines().map(str::trim).collect::<Vec<_>>(),
            [
                at(".tmpXyZ12").display().to_string(),
                at("maf-sbx-0011.pgid.cancel").display().to_string()
            ]
        );

        // Removed again: the run is clean.
        std::fs::remove_file(at("maf-sbx-0011.pgid.cancel")).unwrap();
        std::fs::remove_dir(at(".tmpXyZ12")).unwrap();
        snapshot.check_nothing_new().unwrap();
    }

    #[test]
    fn every_prefix_the_workspace_gives_is_covered() {
        for name in [
            "maf-sbx-00112233445566778899aabb.pgid.cancel",
            "maf-sbx-00112233445566778899aabb.status",
            "maf-images-1",
            "maf-probe-12",
            "sandboxes-qemu",
            "sandbox-mcp-root",
            "mcp-e2e-run-1-qemu",
            "exec-wrapper-sbx-x",
            "host-files-x",
            "sbx-sim-live-x",
            "live-cli-x",
            "hardening-x",
            "sandboxctl-first-run-x",
            "xtask-guests-1",
            ".tmpAbC123",
        ] {
            assert!(is_project_name(name), "{name}");
        }
        for name in [
            "tmp8cm0ux85",
            "python-build.1.log",
            "hsperfdata_root",
            "x-maf-",
        ] {
            assert!(!is_project_name(name), "{name}");
        }
    }

    #[test]
    fn an_unreadable_directory_is_an_error_not_a_clean_run() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(matches!(
            TempSnapshot::take(&gone),
            Err(XtaskError::Io { .. })
        ));
    }
}
