//! The alias check's seam: does a directory list a name verbatim?
//!
//! On a case-insensitive or normalising file system, `README` may resolve to a file stored as
//! `readme`, and an 8.3 short name resolves to a long one. A name that resolves but is not
//! listed byte for byte is such an alias and is refused. Linux offers no such file system to
//! test on here, so the listing is a trait a test can replace with a case-folding fake.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::Dir;

/// Answers whether a directory lists a name verbatim.
///
/// Called after every successful no-follow lstat of a component, with the directory the
/// component was looked up in. An error fails the operation with [`Error::Io`](crate::Error::Io).
pub trait DirectoryListing: Send + Sync + fmt::Debug {
    /// Whether `name` appears byte for byte among the entries of `dir`.
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool>;
}

/// The listing the kernel gives (`getdents`), stopping at the first match.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelListing;

impl KernelListing {
    /// Every name in `dir` except `.` and `..`, in the order the kernel gives them.
    pub fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for entry in Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(names)
    }
}

impl DirectoryListing for KernelListing {
    fn lists_verbatim(&self, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<bool> {
        let wanted = name.as_bytes();
        for entry in Dir::read_from(dir)? {
            if entry?.file_name().to_bytes() == wanted {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
