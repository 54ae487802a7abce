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
}

impl SandboxEntry {
    /// A regular file of `size` bytes.
    pub fn file(path: impl Into<String>, size: u64) -> Self {
        SandboxEntry {
            path: path.into(),
            kind: EntryKind::File,
            size_bytes: Some(size),
        }
    }

    /// An entry of any kind. The size is kept only for files; for every other kind it is dropped.
    pub fn new(path: impl Into<String>, kind: EntryKind, size: Option<u64>) -> Self {
        SandboxEntry {
            path: path.into(),
            kind,
            size_bytes: if kind == EntryKind::File { size } else { None },
        }
    }

    /// The path, relative to the call's working directory (`.` for the directory itself).
    pub fn path(&self) -> &str {
        &self.path
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
