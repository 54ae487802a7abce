//! The host plane: file operations answered on the host side of the one workspace mount.
//!
//! Guest paths under `guest_root` (the storage base's parent, where every command binds the
//! workspace) map onto the host directory `<root>/<name>/ws-…`, held open by `confined-fs`, which
//! walks every component without following links and checks that each name is listed verbatim.
//! A guest path above `guest_root` (such as `/`) is a directory the plane does not reach; any
//! other path outside it is a confinement refusal.
//!
//! `confined-fs` holds the storage base between calls on Linux and enters it again only when the
//! call's own no-follow lstat of `work` finds that very directory, so a guest that replaces
//! `work` between calls is met as before; each call then walks only what is below `work` (the
//! alias check's flags read from descriptors the root holds).
//!
//! That walk is the core's link and kind check for the file methods: every operation refuses a
//! link on the way (`Confinement`) and a non-directory on the way (`NotADirectory`), finds a
//! missing parent missing, and a write refuses a link at its target. So the handle applies only
//! the core's name checks (`Access::resolve`) before it: the core's stat of each component
//! (`Access::check`), each a walk from the root of its own, would repeat the walk the operation
//! makes anyway, holding each directory open as it goes.
//!
//! Every method is blocking: call it on the blocking pool.

use sandbox_core::guest_path;
use sandbox_core::{EntryKind, SandboxError};

/// What the plane says about one guest path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlaneStat {
    pub(crate) kind: EntryKind,
    pub(crate) size: Option<u64>,
}

/// Where a guest path lands relative to the plane's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// A strict ancestor of the root (e.g. `/`): a directory, outside the plane's reach.
    Above,
    /// The root itself (`""`) or a `/`-joined path inside it.
    Inside(String),
}

/// Maps a guest path onto the plane: normalised first; the root → `Inside("")`; a strict
/// ancestor → `Above`; anything else outside → Confinement; NUL → Confinement. `guest_root` is
/// in normal form (a validated storage base's parent is).
pub(crate) fn placement(guest_root: &str, guest: &str) -> Result<Placement, SandboxError> {
    if guest.as_bytes().contains(&0) {
        return Err(SandboxError::confinement(guest, "contains a NUL byte"));
    }
    let normal = guest_path::norm(guest);
    if let Some(relative) = guest_path::relative_to_normal(&normal, guest_root) {
        return Ok(Placement::Inside(relative.to_owned()));
    }
    if guest_path::relative_to_normal(guest_root, &normal).is_some() {
        return Ok(Placement::Above);
    }
    Err(SandboxError::confinement(
        guest,
        "outside the only guest directory this file plane reaches",
    ))
}

mod confined {
    use std::path::Path;

    use confined_fs::{ConfinedRoot, EntryKind as PlaneKind, Error as PlaneError};
    use sandbox_core::{EntryKind, SandboxError};

    use super::{placement, Placement, PlaneStat};

    /// The plane over one workspace generation.
    #[derive(Debug)]
    pub(crate) struct HostPlane {
        guest_root: String,
        root: ConfinedRoot,
    }

    fn kind(kind: PlaneKind) -> EntryKind {
        match kind {
            PlaneKind::File => EntryKind::File,
            PlaneKind::Directory => EntryKind::Directory,
            PlaneKind::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }

    /// Maps a plane error onto the contract's kinds, naming the guest path the caller gave.
    #[cold]
    fn mapped(guest: &str, operation: &'static str, error: PlaneError) -> SandboxError {
        match error {
            PlaneError::Confinement { reason, path } => {
                SandboxError::confinement(guest, format!("{path}: {reason}"))
            }
            PlaneError::NotADirectory { .. } => SandboxError::NotADirectory {
                path: guest.to_owned(),
            },
            PlaneError::IsADirectory { .. } => SandboxError::IsADirectory {
                path: guest.to_owned(),
            },
            PlaneError::NotFound { .. } => SandboxError::NotFound {
                path: guest.to_owned(),
            },
            PlaneError::NotRegularFile { .. } => SandboxError::NotRegularFile {
                path: guest.to_owned(),
            },
            PlaneError::TooLarge { cap, .. } => SandboxError::TransferCapExceeded {
                path: guest.to_owned(),
                limit: cap,
            },
            PlaneError::Io { source, .. } => SandboxError::Io {
                operation,
                path: guest.to_owned(),
                source,
            },
            other => SandboxError::Io {
                operation,
                path: guest.to_owned(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }

    impl HostPlane {
        /// Opens the workspace generation `host_root`, seen by the guest at `guest_root`.
        pub(crate) fn open(host_root: &Path, guest_root: &str) -> Result<Self, SandboxError> {
            let root = ConfinedRoot::open(host_root)
                .map_err(|e| mapped(&host_root.display().to_string(), "open", e))?;
            Ok(HostPlane {
                guest_root: sandbox_core::guest_path::norm(guest_root),
                root,
            })
        }

        fn inside(&self, guest: &str) -> Result<Placement, SandboxError> {
            placement(&self.guest_root, guest)
        }

        /// No-follow stat of a guest path; the root and anything above it are directories.
        pub(crate) fn lstat(&self, guest: &str) -> Result<Option<PlaneStat>, SandboxError> {
            let relative = match self.inside(guest)? {
                Placement::Above => {
                    return Ok(Some(PlaneStat {
                        kind: EntryKind::Directory,
                        size: None,
                    }))
                }
                Placement::Inside(relative) => relative,
            };
            let stat = self
                .root
                .lstat(&relative)
                .map_err(|e| mapped(guest, "lstat", e))?;
            Ok(stat.map(|s| PlaneStat {
                kind: kind(s.kind),
                size: s.size,
            }))
        }

        /// The kind alone, for the storage base's planner.
        pub(crate) fn lstat_kind(&self, guest: &str) -> Result<Option<EntryKind>, SandboxError> {
            Ok(self.lstat(guest)?.map(|s| s.kind))
        }

        fn target(&self, guest: &str, what: &str) -> Result<String, SandboxError> {
            match self.inside(guest)? {
                Placement::Inside(relative) if !relative.is_empty() => Ok(relative),
                Placement::Inside(_) | Placement::Above => Err(SandboxError::confinement(
                    guest,
                    format!("the plane never {what} the workspace's parent or anything above it"),
                )),
            }
        }

        /// Reads a regular file of at most `max` bytes.
        pub(crate) fn read(&self, guest: &str, max: u64) -> Result<Vec<u8>, SandboxError> {
            match self.inside(guest)? {
                Placement::Inside(relative) if !relative.is_empty() => self
                    .root
                    .read(&relative, max)
                    .map_err(|e| mapped(guest, "read", e)),
                Placement::Inside(_) | Placement::Above => Err(SandboxError::IsADirectory {
                    path: guest.to_owned(),
                }),
            }
        }

        /// Reads at most the first `max` bytes of a regular file.
        pub(crate) fn read_head(&self, guest: &str, max: u64) -> Result<Vec<u8>, SandboxError> {
            match self.inside(guest)? {
                Placement::Inside(relative) if !relative.is_empty() => self
                    .root
                    .read_head(&relative, max)
                    .map_err(|e| mapped(guest, "read", e)),
                Placement::Inside(_) | Placement::Above => Err(SandboxError::IsADirectory {
                    path: guest.to_owned(),
                }),
            }
        }

        /// Writes exact bytes (temp file + rename), creating missing parents 0700. A link at the
        /// target is refused (`Confinement`), never written through or replaced.
        pub(crate) fn write(&self, guest: &str, bytes: &[u8]) -> Result<(), SandboxError> {
            let relative = self.target(guest, "writes")?;
            self.root
                .write_unless_link(&relative, bytes)
                .map_err(|e| mapped(guest, "write", e))
        }

        /// Creates a directory and its missing parents (0700).
        pub(crate) fn make_dirs(&self, guest: &str) -> Result<(), SandboxError> {
            match self.inside(guest)? {
                Placement::Above => Ok(()),
                Placement::Inside(relative) => self
                    .root
                    .make_dirs(&relative)
                    .map_err(|e| mapped(guest, "make_dirs", e)),
            }
        }

        /// One level of a directory, sorted by name: (raw name, stat). Every name is kept, including
        /// those no guest path can address (not UTF-8, holding a backslash): the listing shows
        /// them escaped.
        pub(crate) fn list(&self, guest: &str) -> Result<Vec<(Vec<u8>, PlaneStat)>, SandboxError> {
            let relative = match self.inside(guest)? {
                Placement::Above => {
                    return Err(SandboxError::confinement(
                        guest,
                        "outside the only guest directory this file plane reaches",
                    ))
                }
                Placement::Inside(relative) => relative,
            };
            let entries = self
                .root
                .list(&relative)
                .map_err(|e| mapped(guest, "list", e))?;
            let mut out = Vec::with_capacity(entries.len());
            for entry in entries {
                out.push((
                    entry.name.into_encoded_bytes(),
                    PlaneStat {
                        kind: kind(entry.stat.kind),
                        size: entry.stat.size,
                    },
                ));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        }

        /// Writes a file directly in the workspace root (marker, probe, env file).
        pub(crate) fn write_own(&self, name: &str, bytes: &[u8]) -> Result<(), SandboxError> {
            self.root
                .write(name, bytes)
                .map_err(|e| mapped(name, "write", e))
        }

        /// Removes a file directly in the workspace root; missing is fine.
        pub(crate) fn remove_own(&self, name: &str) -> Result<(), SandboxError> {
            match self.root.remove(name, false) {
                Ok(()) | Err(PlaneError::NotFound { .. }) => Ok(()),
                Err(e) => Err(mapped(name, "remove", e)),
            }
        }
    }
}

pub(crate) use confined::HostPlane;

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn placements() {
        let root = "/maf-sandbox";
        assert_eq!(
            placement(root, "/maf-sandbox").unwrap(),
            Placement::Inside(String::new())
        );
        assert_eq!(
            placement(root, "/maf-sandbox/work/a").unwrap(),
            Placement::Inside("work/a".into())
        );
        assert_eq!(
            placement(root, "//maf-sandbox/./work/../x").unwrap(),
            Placement::Inside("x".into())
        );
        assert_eq!(placement(root, "/").unwrap(), Placement::Above);
        for outside in ["/etc", "/maf-sandbox-other", "/maf-sandbox/../etc", "/maf"] {
            assert_eq!(
                placement(root, outside).unwrap_err().kind(),
                ErrorKind::Confinement,
                "{outside}"
            );
        }
        assert_eq!(
            placement(root, "/maf-sandbox/a\0b").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        let deep = "/srv/a/b";
        assert_eq!(placement(deep, "/srv").unwrap(), Placement::Above);
        assert_eq!(placement(deep, "/srv/a").unwrap(), Placement::Above);
    }

    #[cfg(unix)]
    #[test]
    fn the_plane_answers_through_confined_fs_and_never_follows_a_link() {
        let temp = tempfile::tempdir().unwrap();
        let ws = temp.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let plane = HostPlane::open(&ws, "/maf-sandbox").unwrap();
        plane.write("/maf-sandbox/work/a.txt", b"hello").unwrap();
        assert_eq!(plane.read("/maf-sandbox/work/a.txt", 5).unwrap(), b"hello");
        assert_eq!(
            plane.read("/maf-sandbox/work/a.txt", 4).unwrap_err().kind(),
            ErrorKind::TransferCapExceeded
        );
        assert_eq!(
            plane.lstat("/maf-sandbox/work").unwrap().unwrap().kind,
            EntryKind::Directory
        );
        assert_eq!(
            plane.lstat("/").unwrap().unwrap().kind,
            EntryKind::Directory
        );
        assert_eq!(plane.lstat("/maf-sandbox/nope").unwrap(), None);
        assert_eq!(
            plane.read("/maf-sandbox/work", 10).unwrap_err().kind(),
            ErrorKind::IsADirectory
        );
        assert_eq!(
            plane.read("/", 10).unwrap_err().kind(),
            ErrorKind::IsADirectory
        );
        assert_eq!(
            plane.write("/", b"x").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            plane.write("/maf-sandbox", b"x").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        std::os::unix::fs::symlink("/etc", ws.join("work/etc")).unwrap();
        assert_eq!(
            plane
                .read("/maf-sandbox/work/etc/passwd", 1 << 20)
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            plane.lstat("/maf-sandbox/work/etc").unwrap().unwrap().kind,
            EntryKind::Symlink
        );
        // A write never goes through a link, nor replaces one; a link on the way is refused too.
        assert_eq!(
            plane
                .write("/maf-sandbox/work/etc", b"x")
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            plane
                .write("/maf-sandbox/work/etc/new", b"x")
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
        assert!(std::fs::symlink_metadata(ws.join("work/etc"))
            .unwrap()
            .file_type()
            .is_symlink());
        // A file where a directory must be, on the way of a write, a read and a stat.
        assert_eq!(
            plane
                .write("/maf-sandbox/work/a.txt/x", b"x")
                .unwrap_err()
                .kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            plane
                .read("/maf-sandbox/work/a.txt/x", 10)
                .unwrap_err()
                .kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            plane.lstat("/maf-sandbox/work/a.txt/x").unwrap_err().kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(plane.lstat("/maf-sandbox/work/no/x").unwrap(), None);
        let listing = plane.list("/maf-sandbox/work").unwrap();
        let names: Vec<&[u8]> = listing.iter().map(|(n, _)| n.as_slice()).collect();
        assert_eq!(names, [&b"a.txt"[..], b"etc"]);
        assert_eq!(listing[0].1.size, Some(5));
        plane.write_own(".marker", b"").unwrap();
        plane.remove_own(".marker").unwrap();
        plane.remove_own(".marker").unwrap();
        assert!(!ws.join(".marker").exists());
    }

    /// The plane's root holds the storage base it entered between calls (`confined-fs` on
    /// Linux); the guest may replace `work` between two calls. Each call meets what stands there
    /// then: another directory is used, a link to the outside refused, a file not a directory.
    #[cfg(unix)]
    #[test]
    fn a_storage_base_the_guest_replaces_between_calls_is_met_afresh() {
        let temp = tempfile::tempdir().unwrap();
        let ws = temp.path().join("ws");
        let outside = temp.path().join("outside");
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("canary"), b"outside").unwrap();
        let plane = HostPlane::open(&ws, "/maf-sandbox").unwrap();
        plane.write("/maf-sandbox/work/a", b"first").unwrap();
        assert_eq!(plane.read("/maf-sandbox/work/a", 10).unwrap(), b"first");

        std::fs::rename(ws.join("work"), ws.join("old")).unwrap();
        std::fs::create_dir(ws.join("work")).unwrap();
        plane.write("/maf-sandbox/work/b", b"second").unwrap();
        assert_eq!(std::fs::read(ws.join("work/b")).unwrap(), b"second");
        assert!(!ws.join("old/b").exists());
        assert_eq!(
            plane.read("/maf-sandbox/work/a", 10).unwrap_err().kind(),
            ErrorKind::NotFound
        );

        std::fs::remove_dir_all(ws.join("work")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("work")).unwrap();
        for outcome in [
            plane.write("/maf-sandbox/work/canary", b"x").map(drop),
            plane.read("/maf-sandbox/work/canary", 10).map(drop),
            plane.list("/maf-sandbox/work").map(drop),
        ] {
            assert_eq!(outcome.unwrap_err().kind(), ErrorKind::Confinement);
        }
        assert_eq!(
            plane.lstat("/maf-sandbox/work/canary").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        assert_eq!(std::fs::read(outside.join("canary")).unwrap(), b"outside");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);

        std::fs::remove_file(ws.join("work")).unwrap();
        std::fs::write(ws.join("work"), b"a file").unwrap();
        assert_eq!(
            plane.write("/maf-sandbox/work/a", b"x").unwrap_err().kind(),
            ErrorKind::NotADirectory
        );
    }
}
