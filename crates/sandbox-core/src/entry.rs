//! What a stat or a listing reports.

use crate::wire::{wire_enum, wire_from_str};

wire_enum! {
    /// The kind of a file-system entry as the contract sees it.
    pub enum EntryKind ("entry kind") {
        /// A regular file: the only kind ever read.
        File => "file",
        /// A directory.
        Directory => "directory",
        /// A symbolic link, a Windows junction or any reparse point. Never followed.
        Symlink => "symlink",
        /// A fifo, socket, device, hard-link tar entry or anything unrecognised.
        Other => "other",
    }
}
wire_from_str!(EntryKind, "entry kind");

/// One entry of a stat or a listing.
///
/// `size_bytes` is the exact size of a `file` and `None` for every other kind: a link's stat size is the
/// length of its target and is never reported. A `None` size fails closed: never read, never counted as 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxEntry {
    path: String,
    kind: EntryKind,
    size_bytes: Option<u64>,
    escaped: bool,
}

impl SandboxEntry {
    /// A regular file of `size` bytes.
    pub fn file(path: impl Into<String>, size: u64) -> Self {
        SandboxEntry {
            path: path.into(),
            kind: EntryKind::File,
            size_bytes: Some(size),
            escaped: false,
        }
    }

    /// An entry of any kind. The size is kept only for files; for every other kind it is dropped.
    pub fn new(path: impl Into<String>, kind: EntryKind, size: Option<u64>) -> Self {
        SandboxEntry {
            path: path.into(),
            kind,
            size_bytes: if kind == EntryKind::File { size } else { None },
            escaped: false,
        }
    }

    /// A listing entry whose last component is the guest's raw name `name` (bytes, as the directory
    /// lists it) under `directory` (a path in the form [`SandboxEntry::path`] takes). A name that is
    /// not UTF-8 or holds a backslash, which no guest path can address, is shown escaped
    /// ([`crate::guest_path::escape_name`]) and marked so ([`SandboxEntry::name_escaped`]) rather than
    /// left out.
    pub fn listed(directory: &str, name: &[u8], kind: EntryKind, size: Option<u64>) -> Self {
        let (shown, escaped) = crate::guest_path::escape_name(name);
        let path = match directory {
            "." | "" => shown,
            dir if dir.ends_with('/') => format!("{dir}{shown}"),
            dir => format!("{dir}/{shown}"),
        };
        let mut entry = SandboxEntry::new(path, kind, size);
        entry.escaped = escaped;
        entry
    }

    /// The path, relative to the call's working directory (`.` for the directory itself).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the last component of [`SandboxEntry::path`] is an escaped name (not UTF-8, or holding
    /// a backslash): shown so that nothing is hidden, decoded by
    /// [`crate::guest_path::unescape_name`], and never addressable by a file method (its backslash
    /// is refused as a guest path, so it cannot name another file either).
    pub fn name_escaped(&self) -> bool {
        self.escaped
    }

    /// The kind.
    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// The exact size of a file; `None` for every other kind (and for a file whose size is unknown).
    pub fn size_bytes(&self) -> Option<u64> {
        self.size_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_size_is_always_none() {
        assert_eq!(
            SandboxEntry::new("l", EntryKind::Symlink, Some(11)).size_bytes(),
            None
        );
        assert_eq!(
            SandboxEntry::new("d", EntryKind::Directory, Some(4096)).size_bytes(),
            None
        );
        assert_eq!(
            SandboxEntry::new("o", EntryKind::Other, Some(0)).size_bytes(),
            None
        );
        assert_eq!(
            SandboxEntry::new("f", EntryKind::File, Some(3)).size_bytes(),
            Some(3)
        );
        assert_eq!(SandboxEntry::file("f", 0).size_bytes(), Some(0));
        assert_eq!("symlink".parse::<EntryKind>().unwrap(), EntryKind::Symlink);
    }
}
