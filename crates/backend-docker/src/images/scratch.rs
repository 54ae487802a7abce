//! The scratch space: a private directory per build, removed (after unmounting) on every exit.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use super::ensure_dir;
use crate::error::DockerError;

/// A private (0700) directory for one build, removed on every exit. Removal first unmounts
/// whatever is mounted inside it and refuses to delete through a mount that stays.
#[derive(Debug)]
pub(super) struct Scratch {
    path: Option<PathBuf>,
}

static SCRATCH_SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl Scratch {
    pub(super) fn create(parent: &Path) -> Result<Scratch, DockerError> {
        let parent = ensure_dir(parent)?;
        let sequence = SCRATCH_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!(
            "maf-images-{}-{sequence}-{nanos:08x}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| DockerError::Io {
                action: "creating the scratch directory",
                path: path.clone(),
                source,
            })?;
        Ok(Scratch { path: Some(path) })
    }

    pub(super) fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    /// Removes the directory, reporting what went wrong (drop only logs it).
    pub(super) fn remove(mut self) -> Result<(), DockerError> {
        match self.path.take() {
            Some(path) => remove_tree(&path),
            None => Ok(()),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(error) = remove_tree(&path) {
                tracing::warn!(%error, "image scratch directory not removed");
            }
        }
    }
}

/// Removes `dir` and everything in it, after unmounting anything mounted inside it.
pub(super) fn remove_tree(dir: &Path) -> Result<(), DockerError> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    unmount_under(dir);
    let left = mounts_under(dir)?;
    if !left.is_empty() {
        return Err(DockerError::ScratchMounted {
            path: dir.to_owned(),
            mounts: left
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    std::fs::remove_dir_all(dir).map_err(|source| DockerError::Io {
        action: "removing",
        path: dir.to_owned(),
        source,
    })
}

/// Lazily unmounts every mount point inside `dir`, deepest first. Best effort: what stays is
/// caught by the check in [`remove_tree`].
pub(super) fn unmount_under(dir: &Path) {
    let Ok(mounts) = mounts_under(dir) else {
        return;
    };
    for mount in mounts {
        let status = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mount)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            tracing::warn!(mount = %mount.display(), "could not unmount");
        }
    }
}

fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, DockerError> {
    let path = Path::new("/proc/self/mountinfo");
    let table = std::fs::read_to_string(path).map_err(|source| DockerError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    Ok(mount_points_under(&table, &dir))
}

/// Mount points in a `/proc/self/mountinfo` table that lie inside `dir` (or are `dir`),
/// deepest first.
fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_field(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect();
    found.sort_by_key(|mount| std::cmp::Reverse(mount.components().count()));
    found.dedup();
    found
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mount_field(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt as _;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).filter(|digits| {
            bytes[index] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        });
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn mount_points_inside_the_scratch_dir_are_found_deepest_first() {
        let table = "\
22 1 0:21 / / rw - overlay overlay rw
30 22 0:5 / /tmp/maf-images-1/root-base/proc rw - proc proc rw
31 22 0:6 / /tmp/maf-images-1/root-base/sys rw - sysfs sysfs rw
32 30 0:7 / /tmp/maf-images-1/root-base/proc/sys/fs/binfmt_misc rw - binfmt_misc x rw
33 22 0:8 / /tmp/maf-images-10/root rw - tmpfs t rw
34 22 0:9 / /tmp/with\\040space/x rw - tmpfs t rw
";
        let found = mount_points_under(table, Path::new("/tmp/maf-images-1"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/tmp/maf-images-1/root-base/proc/sys/fs/binfmt_misc"),
                PathBuf::from("/tmp/maf-images-1/root-base/proc"),
                PathBuf::from("/tmp/maf-images-1/root-base/sys"),
            ]
        );
        assert_eq!(
            mount_points_under(table, Path::new("/tmp/with space")),
            vec![PathBuf::from("/tmp/with space/x")]
        );
    }

    #[test]
    fn scratch_is_private_and_removed_with_its_contents() {
        let parent = std::env::temp_dir();
        let scratch = Scratch::create(&parent).unwrap();
        let path = scratch.path().to_owned();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::write(path.join("a/b/file"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", path.join("a/link-to-etc")).unwrap();
        scratch.remove().unwrap();
        assert!(!path.exists());
        assert!(Path::new("/etc").exists());

        let dropped = Scratch::create(&parent).unwrap();
        let dropped_path = dropped.path().to_owned();
        drop(dropped);
        assert!(!dropped_path.exists());
    }
}
