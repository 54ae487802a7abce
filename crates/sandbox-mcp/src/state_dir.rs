//! The server's state directory: private to the user who runs the server, checked before use.
//!
//! The directory is made (with its missing parents) mode 0700 when it does not exist, then
//! opened without following a link and judged on the open descriptor: it must be a directory
//! owned by this process's effective user with no permission for group or others. Anything else
//! is a typed error and the server does not start: a directory another user owns or can write
//! could hold files planted for this server, or lose this server's own.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// The server's private state directory, held open.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    fd: OwnedFd,
}

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateDirError {
    /// The directory could not be made, opened or read.
    #[error("the state directory {dir} cannot be used: {source}")]
    Io {
        /// The directory.
        dir: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The path is a link or not a directory.
    #[error("the state directory {dir} is a link or not a directory")]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// Another user owns the directory.
    #[error("the state directory {dir} belongs to user {owner}, not to this server's user {uid}")]
    NotOwned {
        /// The directory.
        dir: PathBuf,
        /// Its owner's user id.
        owner: u32,
        /// This process's effective user id.
        uid: u32,
    },
    /// Group or others have permissions on the directory.
    #[error(
        "the state directory {dir} has mode {mode:04o}; it must be private to its user (0700)"
    )]
    NotPrivate {
        /// The directory.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

impl StateDirError {
    #[cold]
    fn io(dir: &Path, source: impl Into<std::io::Error>) -> Self {
        StateDirError::Io {
            dir: dir.to_owned(),
            source: source.into(),
        }
    }
}

impl StateDir {
    /// Makes `path` (mode 0700, with its missing parents) when it does not exist, opens it
    /// without following a link and checks it is this user's and private.
    ///
    /// # Errors
    /// [`StateDirError::NotADirectory`] for a link or another kind of file,
    /// [`StateDirError::NotOwned`] or [`StateDirError::NotPrivate`] for a directory this server
    /// must not trust, [`StateDirError::Io`] when it cannot be made or opened.
    pub fn open(path: &Path) -> Result<Self, StateDirError> {
        {
            use std::os::unix::fs::DirBuilderExt as _;
            match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
            {
                Ok(()) => {}
                // An existing file or link is judged below, on what the open finds.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StateDirError::io(path, e)),
            }
        }
        let fd = match rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                return Err(StateDirError::NotADirectory {
                    dir: path.to_owned(),
                })
            }
            Err(e) => return Err(StateDirError::io(path, e)),
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| StateDirError::io(path, e))?;
        let uid = rustix::process::geteuid().as_raw();
        if let Some(refusal) = refusal(path, stat.st_uid, stat.st_mode, uid) {
            return Err(refusal);
        }
        Ok(StateDir {
            path: path.to_owned(),
            fd,
        })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the new file `name` in the directory, mode 0600, never through a link and never
    /// over an existing file.
    pub(crate) fn create_new(&self, name: &str) -> Result<File, StateDirError> {
        rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map(File::from)
        .map_err(|e| StateDirError::io(&self.path.join(name), e))
    }

    /// Removes `name` if it is still the very file `file` (a file put in its place is left).
    pub(crate) fn remove_if_same(&self, name: &str, file: &File) {
        let (Ok(held), Ok(named)) = (
            rustix::fs::fstat(file),
            rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW),
        ) else {
            return;
        };
        if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino) {
            let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
        }
    }

    /// Removes `name` (best effort).
    pub(crate) fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
    }

    /// The names of the directory's entries (those that are not UTF-8 are left out).
    pub(crate) fn names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect()
    }
}

/// Why a directory owned by `owner` with mode `mode` is not fit for user `uid`'s state, if it is
/// not.
fn refusal(dir: &Path, owner: u32, mode: u32, uid: u32) -> Option<StateDirError> {
    if owner != uid {
        return Some(StateDirError::NotOwned {
            dir: dir.to_owned(),
            owner,
            uid,
        });
    }
    if mode & 0o077 != 0 {
        return Some(StateDirError::NotPrivate {
            dir: dir.to_owned(),
            mode: mode & 0o7777,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_missing_directory_is_made_private() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("a/b");
        let dir = StateDir::open(&path).unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_shared_directory_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("shared");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let refused = StateDir::open(&path).unwrap_err();
        assert!(
            matches!(refused, StateDirError::NotPrivate { mode: 0o1777, .. }),
            "{refused}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(
            StateDir::open(&path).unwrap_err(),
            StateDirError::NotPrivate { .. }
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        StateDir::open(&path).unwrap();
    }

    #[test]
    fn a_link_or_a_file_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let real = base.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            StateDir::open(&link).unwrap_err(),
            StateDirError::NotADirectory { .. }
        ));
        let file = base.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            StateDir::open(&file).unwrap_err(),
            StateDirError::NotADirectory { .. }
        ));
    }

    #[test]
    fn another_users_directory_is_refused() {
        let dir = Path::new("/d");
        assert!(matches!(
            refusal(dir, 1001, 0o40700, 1000),
            Some(StateDirError::NotOwned {
                owner: 1001,
                uid: 1000,
                ..
            })
        ));
        assert!(refusal(dir, 1000, 0o40700, 1000).is_none());
        assert!(matches!(
            refusal(dir, 1000, 0o40701, 1000),
            Some(StateDirError::NotPrivate { mode: 0o701, .. })
        ));
    }

    #[test]
    fn another_users_directory_is_refused_on_disk() {
        // Only root can give a directory away; as any other user the pure rule above pins it.
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("theirs");
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        assert!(matches!(
            StateDir::open(&path).unwrap_err(),
            StateDirError::NotOwned { owner: 65534, .. }
        ));
    }
}
