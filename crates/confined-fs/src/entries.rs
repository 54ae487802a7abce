//! What `lstat` and `list` report.

use std::ffi::OsString;

/// The kind of an entry, as a no-follow lstat sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (described, never followed).
    Symlink,
    /// Anything else: a named pipe, a socket, a device.
    Other,
}

/// An entry's kind and, for a regular file, its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stat {
    /// The kind of the entry.
    pub kind: EntryKind,
    /// The size in bytes of a regular file; `None` for every other kind (a link's size is
    /// `None`, never its target's).
    pub size: Option<u64>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirEntry {
    /// The name exactly as the directory lists it (not necessarily UTF-8).
    pub name: OsString,
    /// The entry's kind and size.
    pub stat: Stat,
}
