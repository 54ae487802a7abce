//! What the walk reads from a no-follow metadata: the only place where a Unix and a Windows
//! host judge an entry differently.

#[cfg(unix)]
use std::io;

use cap_std::fs::Metadata;

#[cfg(unix)]
use crate::entries::EntryKind;
#[cfg(unix)]
use crate::error::Irregular;

#[cfg(windows)]
pub(crate) use self::windows::{attributes, entry_kind, irregularity, open_stopped_at_link};

/// What kind of entry a no-follow metadata describes.
#[cfg(unix)]
pub(crate) fn entry_kind(metadata: &Metadata) -> EntryKind {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        EntryKind::Symlink
    } else if file_type.is_dir() {
        EntryKind::Directory
    } else if file_type.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

/// What a non-regular (or multiply linked) file is, for a read refusal.
#[cfg(unix)]
pub(crate) fn irregularity(metadata: &Metadata) -> Option<Irregular> {
    use cap_std::fs::FileTypeExt;
    let file_type = metadata.file_type();
    if file_type.is_file() {
        let links = link_count(metadata);
        (links > 1).then_some(Irregular::HardLinked { links })
    } else if file_type.is_symlink() {
        Some(Irregular::Symlink)
    } else if file_type.is_fifo() {
        Some(Irregular::Fifo)
    } else if file_type.is_socket() {
        Some(Irregular::Socket)
    } else if file_type.is_char_device() {
        Some(Irregular::CharDevice)
    } else if file_type.is_block_device() {
        Some(Irregular::BlockDevice)
    } else {
        Some(Irregular::Unknown)
    }
}

/// The size of a regular file.
pub(crate) fn file_size(metadata: &Metadata) -> u64 {
    metadata.len()
}

/// The number of names of a file. On Windows the metadata must come from an open handle, as
/// every metadata this crate reads does (cap-std's no-follow stat opens the entry).
fn link_count(metadata: &Metadata) -> u64 {
    cap_fs_ext::MetadataExt::nlink(metadata)
}

/// Whether a no-follow open failed because a link stood at the name.
///
/// Std cannot name `ELOOP` on stable, so rustix reads the errno: `ELOOP` on Linux and macOS,
/// `EMLINK` on the BSDs.
#[cfg(unix)]
pub(crate) fn open_stopped_at_link(error: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(error),
        Some(Errno::LOOP | Errno::MLINK)
    )
}
/// The Windows readings, each a pure decision of `windows_rules` applied to the attribute word.
#[cfg(windows)]
mod windows {
    use std::io;

    use cap_std::fs::Metadata;

    use super::link_count;
    use crate::entries::EntryKind;
    use crate::error::Irregular;

    /// What kind of entry a no-follow metadata describes: any reparse point is a link.
    pub(crate) fn entry_kind(metadata: &Metadata) -> EntryKind {
        crate::windows_rules::windows_entry_kind(attributes(metadata))
    }

    /// What a non-regular (or multiply linked) file is, for a read refusal.
    pub(crate) fn irregularity(metadata: &Metadata) -> Option<Irregular> {
        crate::windows_rules::windows_irregularity(attributes(metadata), link_count(metadata))
    }

    /// The attribute word, the same `dwFileAttributes` that
    /// `std::os::windows::fs::MetadataExt::file_attributes` gives for a std metadata.
    pub(crate) fn attributes(metadata: &Metadata) -> u32 {
        cap_std::fs::MetadataExt::file_attributes(metadata)
    }

    /// Whether a no-follow open failed because a link stood at the name (cap-std reports
    /// `ERROR_STOPPED_ON_SYMLINK`).
    pub(crate) fn open_stopped_at_link(error: &io::Error) -> bool {
        const ERROR_STOPPED_ON_SYMLINK: i32 = 1281;
        error.raw_os_error() == Some(ERROR_STOPPED_ON_SYMLINK)
    }
}
