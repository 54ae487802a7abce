//! The one error type of the crate and its cold constructors.

use std::fmt;
use std::io;

use crate::windows_rules::WindowsNameProblem;

/// Why a path was refused as a confinement breach.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfinementReason {
    /// The path is absolute; paths are relative to the root.
    Absolute,
    /// A `..` climbs above the root.
    Escape,
    /// The path contains a backslash, which Windows reads as a separator.
    Backslash,
    /// The path contains a NUL byte.
    Nul,
    /// A component (a parent, or a directory to list or create) is a symbolic link.
    Link,
    /// The name resolved, but its directory does not list it verbatim (case folding,
    /// Unicode normalisation, 8.3 short names).
    Alias,
    /// A component breaks the Windows naming rules.
    ReservedName(WindowsNameProblem),
    /// The operation would act on the root itself (removing it).
    Root,
}

impl fmt::Display for ConfinementReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Absolute => {
                f.write_str("absolute paths are refused; paths are relative to the root")
            }
            Self::Escape => f.write_str("climbs above the root"),
            Self::Backslash => f.write_str("contains a backslash"),
            Self::Nul => f.write_str("contains a NUL byte"),
            Self::Link => f.write_str("is a link rather than a real directory"),
            Self::Alias => f.write_str("resolves to a name its directory does not list verbatim"),
            Self::ReservedName(problem) => write!(f, "reserved name: {problem}"),
            Self::Root => f.write_str("the root itself cannot be the target"),
        }
    }
}

/// What a read found instead of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Irregular {
    /// A symbolic link (never followed).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A regular file with more than one name, which a guest could have planted.
    HardLinked {
        /// The file's link count.
        links: u64,
    },
    /// A file type the kernel reported but this crate does not name.
    Unknown,
}

impl fmt::Display for Irregular {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Symlink => f.write_str("a symbolic link"),
            Self::Fifo => f.write_str("a named pipe"),
            Self::Socket => f.write_str("a socket"),
            Self::CharDevice => f.write_str("a character device"),
            Self::BlockDevice => f.write_str("a block device"),
            Self::HardLinked { links } => write!(f, "a regular file with {links} hard links"),
            Self::Unknown => f.write_str("an unknown file type"),
        }
    }
}

/// The operation during which an I/O error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// Opening the root directory.
    OpenRoot,
    /// [`ConfinedRoot::lstat`](crate::ConfinedRoot::lstat).
    Lstat,
    /// [`ConfinedRoot::read`](crate::ConfinedRoot::read).
    Read,
    /// [`ConfinedRoot::write`](crate::ConfinedRoot::write).
    Write,
    /// [`ConfinedRoot::make_dirs`](crate::ConfinedRoot::make_dirs).
    MakeDirs,
    /// [`ConfinedRoot::list`](crate::ConfinedRoot::list).
    List,
    /// [`ConfinedRoot::remove`](crate::ConfinedRoot::remove).
    Remove,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OpenRoot => "open root",
            Self::Lstat => "lstat",
            Self::Read => "read",
            Self::Write => "write",
            Self::MakeDirs => "make_dirs",
            Self::List => "list",
            Self::Remove => "remove",
        })
    }
}

/// Every failure of a [`ConfinedRoot`](crate::ConfinedRoot) operation.
///
/// Paths are shown relative to the root, `/`-separated (`.` for the root itself), up to the
/// component the failure concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The path would leave the root, goes through a link, is an alias, or breaks the naming
    /// rules. Nothing was touched past the refused component.
    #[error("{path}: refused: {reason}")]
    Confinement {
        /// The path, up to the refused component.
        path: String,
        /// Why it was refused.
        reason: ConfinementReason,
    },
    /// A component that must be a directory is something else (and not a link).
    #[error("{path}: not a directory")]
    NotADirectory {
        /// The path, up to the offending component.
        path: String,
    },
    /// The target is a directory where a file was expected.
    #[error("{path}: is a directory")]
    IsADirectory {
        /// The path of the directory.
        path: String,
    },
    /// The target, or one of its parents, does not exist.
    #[error("{path}: not found")]
    NotFound {
        /// The path, up to the missing component.
        path: String,
    },
    /// A read found something other than a regular file with one name.
    #[error("{path}: not a regular file: {found}")]
    NotRegularFile {
        /// The path of the target.
        path: String,
        /// What was found instead.
        found: Irregular,
    },
    /// A read passed the caller's cap; no prefix is returned.
    #[error("{path}: larger than the cap of {cap} bytes")]
    TooLarge {
        /// The path of the target.
        path: String,
        /// The cap, in bytes.
        cap: u64,
    },
    /// The host refused or failed a system call (permissions, space, descriptors).
    #[error("{operation} {path}: {source}")]
    Io {
        /// The operation that failed.
        operation: Operation,
        /// The path being worked on.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether this is a [`Error::Confinement`] refusal.
    pub fn is_confinement(&self) -> bool {
        matches!(self, Self::Confinement { .. })
    }

    /// Whether this is a typed refusal (anything but [`Error::Io`]): the crate decided, the
    /// host did not fail.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Io { .. })
    }
}

#[cold]
pub(crate) fn confinement(path: impl Into<String>, reason: ConfinementReason) -> Error {
    Error::Confinement {
        path: path.into(),
        reason,
    }
}

#[cold]
pub(crate) fn not_a_directory(path: impl Into<String>) -> Error {
    Error::NotADirectory { path: path.into() }
}

#[cold]
pub(crate) fn is_a_directory(path: impl Into<String>) -> Error {
    Error::IsADirectory { path: path.into() }
}

#[cold]
pub(crate) fn not_found(path: impl Into<String>) -> Error {
    Error::NotFound { path: path.into() }
}

#[cold]
pub(crate) fn not_regular(path: impl Into<String>, found: Irregular) -> Error {
    Error::NotRegularFile {
        path: path.into(),
        found,
    }
}

#[cold]
pub(crate) fn too_large(path: impl Into<String>, cap: u64) -> Error {
    Error::TooLarge {
        path: path.into(),
        cap,
    }
}

/// An error from a system call. ENOENT becomes [`Error::NotFound`]: on a held descriptor it
/// means the guest removed the entry or the directory meanwhile, which is not a host failure.
#[cold]
pub(crate) fn io_error(
    operation: Operation,
    path: impl Into<String>,
    source: impl Into<io::Error>,
) -> Error {
    let source = source.into();
    if source.kind() == io::ErrorKind::NotFound {
        return not_found(path);
    }
    Error::Io {
        operation,
        path: path.into(),
        source,
    }
}
