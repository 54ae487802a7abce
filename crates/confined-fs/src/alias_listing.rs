//! The alias check's seam: does a directory list a name verbatim?
//!
//! On a case-insensitive or normalising file system, `README` may resolve to a file stored as
//! `readme`, `é` spelled decomposed may resolve to one stored composed, and an 8.3 short name
//! resolves to a long one. A name that resolves but is not listed verbatim is such an alias and
//! is refused. Linux offers no such file system to test on here, so the listing is a trait a
//! test can replace with a case-folding fake.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;

use cap_std::fs::Dir;
use cap_std::io_lifetimes::AsFilelike;

/// A borrowed handle of an open directory: a descriptor on Unix, a handle on Windows.
#[cfg(unix)]
pub type DirectoryHandle<'a> = std::os::fd::BorrowedFd<'a>;

/// A borrowed handle of an open directory: a descriptor on Unix, a handle on Windows.
#[cfg(windows)]
pub type DirectoryHandle<'a> = std::os::windows::io::BorrowedHandle<'a>;

/// The handle of `dir`, for the listing seam.
pub(crate) fn handle_of(dir: &Dir) -> DirectoryHandle<'_> {
    #[cfg(unix)]
    return std::os::fd::AsFd::as_fd(dir);
    #[cfg(windows)]
    return std::os::windows::io::AsHandle::as_handle(dir);
}

/// Answers whether a directory lists a name verbatim.
///
/// Called after every successful no-follow lstat of a component, with the directory the
/// component was looked up in. An error fails the operation with [`Error::Io`](crate::Error::Io).
pub trait DirectoryListing: Send + Sync + fmt::Debug {
    /// Whether `name` appears verbatim (byte for byte on Unix, code unit for code unit on
    /// Windows) among the entries of `dir`.
    fn lists_verbatim(&self, dir: DirectoryHandle<'_>, name: &OsStr) -> io::Result<bool>;

    /// Called in each window between two system calls on the entry `name` of `dir` that no
    /// alias check already separates: in a listing or a recursive remove, after the names
    /// were read, before each one's lstat; in a recursive remove, also after that lstat,
    /// before the entry is removed or entered; after a no-follow directory open failed,
    /// before the look at what stood there; and after a lookup found nothing, before the
    /// directory is created. Those are the windows a racing guest aims for. There is
    /// nothing to check in them and the default does nothing; a test's listing can act as
    /// that racing guest here.
    fn race_window(&self, _dir: DirectoryHandle<'_>, _name: &OsStr) {}
}

/// The listing the host gives (cap-std's directory entries), stopping at the first match.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelListing;

impl KernelListing {
    /// Every name in `dir` except `.` and `..`, in the order the host gives them.
    pub fn names(dir: DirectoryHandle<'_>) -> io::Result<Vec<OsString>> {
        names_of(&dir.as_filelike_view::<Dir>())
    }
}

impl DirectoryListing for KernelListing {
    fn lists_verbatim(&self, dir: DirectoryHandle<'_>, name: &OsStr) -> io::Result<bool> {
        for entry in dir.as_filelike_view::<Dir>().entries()? {
            if entry?.file_name() == name {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Every name in `dir` (cap-std never yields `.` or `..`).
pub(crate) fn names_of(dir: &Dir) -> io::Result<Vec<OsString>> {
    dir.entries()?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect()
}
