//! Windows naming rules and the reparse-point decisions, as pure functions.
//!
//! They are compiled and tested on every platform. On a Windows host the walk applies them to
//! every component and judges every entry by its attribute word; on any other host a root
//! opened with [`NameRules::Windows`](crate::NameRules::Windows) applies the naming rules too,
//! which keeps a tree written on Linux addressable from a Windows host.

use std::fmt;

use crate::entries::EntryKind;
use crate::error::Irregular;

/// `FILE_ATTRIBUTE_REPARSE_POINT`: the attribute bit Windows sets on links, junctions and
/// every other reparse point.
pub const FILE_ATTRIBUTE_REPARSE_POINT: u32 = 0x400;

/// `FILE_ATTRIBUTE_DIRECTORY`.
// Called by the walk on Windows only; unit-tested everywhere.
#[cfg_attr(not(windows), allow(dead_code))]
const FILE_ATTRIBUTE_DIRECTORY: u32 = 0x10;

/// `FILE_ATTRIBUTE_DEVICE`: reserved for the system; never a file a guest should be read.
// Called by the walk on Windows only; unit-tested everywhere.
#[cfg_attr(not(windows), allow(dead_code))]
const FILE_ATTRIBUTE_DEVICE: u32 = 0x40;

/// Characters Windows refuses in a file name (`/` and `\` are separators there).
const RESERVED_CHARACTERS: &[char] = &['<', '>', ':', '"', '|', '?', '*', '/', '\\'];

/// Device names that Windows resolves in every directory, whatever the extension.
const DEVICE_NAMES: &[&str] = &[
    "CON",
    "PRN",
    "AUX",
    "NUL",
    "CONIN$",
    "CONOUT$",
    "COM0",
    "COM1",
    "COM2",
    "COM3",
    "COM4",
    "COM5",
    "COM6",
    "COM7",
    "COM8",
    "COM9",
    "COM\u{b9}",
    "COM\u{b2}",
    "COM\u{b3}",
    "LPT0",
    "LPT1",
    "LPT2",
    "LPT3",
    "LPT4",
    "LPT5",
    "LPT6",
    "LPT7",
    "LPT8",
    "LPT9",
    "LPT\u{b9}",
    "LPT\u{b2}",
    "LPT\u{b3}",
];

/// Why a name is not usable on Windows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowsNameProblem {
    /// One of `<>:"|?*`, or a separator.
    ReservedCharacter(char),
    /// A code point from 0 to 31.
    ControlCharacter(char),
    /// The name ends in `.` or a space, which Windows strips silently.
    TrailingDotOrSpace,
    /// The name designates a device (`NUL`, `com1.txt`, `CONOUT$`, …); holds the device.
    DeviceName(String),
    /// The name holds an unpaired UTF-16 surrogate, which no Unicode name can spell.
    NotUnicode,
}

impl fmt::Display for WindowsNameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReservedCharacter(c) => write!(f, "the character {c:?} is reserved on Windows"),
            Self::ControlCharacter(c) => {
                write!(
                    f,
                    "the control character U+{:04X} is refused on Windows",
                    u32::from(*c)
                )
            }
            Self::TrailingDotOrSpace => {
                f.write_str("a trailing dot or space is stripped on Windows")
            }
            Self::DeviceName(device) => write!(f, "{device} is a Windows device name"),
            Self::NotUnicode => f.write_str("an unpaired surrogate is not a Unicode name"),
        }
    }
}

/// The first Windows rule `name` (one path component) breaks, if any.
///
/// Rules, in order: reserved characters, control characters, a trailing dot or space, device
/// names (the part before the first `.`, right-trimmed of spaces, compared case-insensitively).
pub fn windows_name_problem(name: &str) -> Option<WindowsNameProblem> {
    for c in name.chars() {
        if RESERVED_CHARACTERS.contains(&c) {
            return Some(WindowsNameProblem::ReservedCharacter(c));
        }
        if u32::from(c) < 32 {
            return Some(WindowsNameProblem::ControlCharacter(c));
        }
    }
    if name.ends_with('.') || name.ends_with(' ') {
        return Some(WindowsNameProblem::TrailingDotOrSpace);
    }
    windows_device_name(name).map(|device| WindowsNameProblem::DeviceName(device.to_owned()))
}

/// The device `name` designates on Windows (`"nul.txt"` → `"NUL"`), if any.
pub fn windows_device_name(name: &str) -> Option<&'static str> {
    let stem = name.split('.').next().unwrap_or(name).trim_end_matches(' ');
    let upper = stem.to_uppercase();
    DEVICE_NAMES.iter().copied().find(|device| *device == upper)
}

/// Whether a Windows attribute word marks a reparse point (a link, a junction, a mount point):
/// such an entry is treated as a link and never traversed.
pub fn is_reparse_point(attributes: u32) -> bool {
    attributes & FILE_ATTRIBUTE_REPARSE_POINT != 0
}

/// The kind a Windows entry is given from its attribute word alone.
///
/// A reparse point of any kind (symbolic link, junction, mount point, cloud placeholder, or
/// a tag no one has met yet) is a [`EntryKind::Symlink`], whatever else the word says: it is
/// described, removed as a name, and never traversed, opened for reading or written through.
// Called by the walk on Windows only; unit-tested everywhere.
#[cfg_attr(not(windows), allow(dead_code))]
pub(crate) fn windows_entry_kind(attributes: u32) -> EntryKind {
    if is_reparse_point(attributes) {
        EntryKind::Symlink
    } else if attributes & FILE_ATTRIBUTE_DIRECTORY != 0 {
        EntryKind::Directory
    } else if attributes & FILE_ATTRIBUTE_DEVICE != 0 {
        EntryKind::Other
    } else {
        EntryKind::File
    }
}

/// Why a Windows entry with this attribute word and link count is not a readable file, if it
/// is not one (see [`windows_entry_kind`]; a directory is for the caller to refuse first).
// Called by the walk on Windows only; unit-tested everywhere.
#[cfg_attr(not(windows), allow(dead_code))]
pub(crate) fn windows_irregularity(attributes: u32, links: u64) -> Option<Irregular> {
    match windows_entry_kind(attributes) {
        EntryKind::Symlink => Some(Irregular::Symlink),
        EntryKind::File if links > 1 => Some(Irregular::HardLinked { links }),
        EntryKind::File => None,
        EntryKind::Directory | EntryKind::Other => Some(Irregular::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_match_case_insensitively_and_with_extensions() {
        for name in [
            "CON",
            "con",
            "Prn",
            "aux",
            "nul",
            "nul.txt",
            "NUL.tar.gz",
            "nul .txt",
            "com1",
            "COM9.log",
            "lpt0",
            "Lpt5.x",
            "conin$",
            "CONOUT$",
            "conout$.txt",
            "COM\u{b9}",
            "com\u{b2}.txt",
            "lpt\u{b3}",
            "LPT\u{b9}",
        ] {
            assert!(
                matches!(
                    windows_name_problem(name),
                    Some(WindowsNameProblem::DeviceName(_))
                ),
                "{name:?} must be refused as a device name"
            );
        }
        assert_eq!(windows_device_name("nul.txt"), Some("NUL"));
        assert_eq!(windows_device_name("com\u{b2}"), Some("COM\u{b2}"));
        assert_eq!(windows_device_name("conin$"), Some("CONIN$"));
    }

    #[test]
    fn near_device_names_are_allowed() {
        for name in [
            "console",
            "nul_",
            "com10",
            "lpt",
            "com",
            "xnul",
            "auxiliary.txt",
            "COM\u{b4}",
            "LPT\u{b9}0",
            "conin",
            "con$",
            ".nul",
            "a.nul",
        ] {
            assert_eq!(
                windows_name_problem(name),
                None,
                "{name:?} is an ordinary name"
            );
        }
    }

    #[test]
    fn reserved_and_control_characters_are_refused() {
        for c in ['<', '>', ':', '"', '|', '?', '*', '\\', '/'] {
            let name = format!("a{c}b");
            assert_eq!(
                windows_name_problem(&name),
                Some(WindowsNameProblem::ReservedCharacter(c))
            );
        }
        for code in 0u8..32 {
            let c = char::from(code);
            let name = format!("a{c}b");
            assert_eq!(
                windows_name_problem(&name),
                Some(WindowsNameProblem::ControlCharacter(c))
            );
        }
        assert_eq!(
            windows_name_problem("tab\u{7f}"),
            None,
            "DEL is allowed by Windows"
        );
    }

    #[test]
    fn trailing_dot_or_space_is_refused() {
        for name in ["a.", "a ", "file.txt.", "dir  ", "..."] {
            assert_eq!(
                windows_name_problem(name),
                Some(WindowsNameProblem::TrailingDotOrSpace),
                "{name:?}"
            );
        }
        for name in [".hidden", " lead", "a.b", "a b"] {
            assert_eq!(windows_name_problem(name), None, "{name:?}");
        }
    }

    #[test]
    fn reparse_point_bit_is_read_from_the_attribute_word() {
        assert!(is_reparse_point(FILE_ATTRIBUTE_REPARSE_POINT));
        assert!(is_reparse_point(0x10 | 0x400)); // a directory junction
        assert!(is_reparse_point(u32::MAX));
        assert!(!is_reparse_point(0x10)); // a plain directory
        assert!(!is_reparse_point(0x20 | 0x80)); // archive, normal
        assert!(!is_reparse_point(0));
        assert!(!is_reparse_point(!FILE_ATTRIBUTE_REPARSE_POINT));
    }

    /// Attribute words as Windows reports them for the entries a guest can plant.
    const SYMLINK_TO_FILE: u32 = 0x20 | 0x400;
    const SYMLINK_TO_DIRECTORY: u32 = 0x10 | 0x400;
    const JUNCTION: u32 = 0x10 | 0x400;
    /// A OneDrive placeholder: offline, recall on data access, sparse, a reparse point.
    const CLOUD_PLACEHOLDER_FILE: u32 = 0x0040_0000 | 0x1000 | 0x200 | 0x20 | 0x400;
    const CLOUD_PLACEHOLDER_DIRECTORY: u32 = 0x0040_0000 | 0x10 | 0x400;
    const PLAIN_FILE: u32 = 0x20;
    const READ_ONLY_HIDDEN_FILE: u32 = 0x1 | 0x2 | 0x20;
    const NORMAL_FILE: u32 = 0x80;
    const PLAIN_DIRECTORY: u32 = 0x10;

    #[test]
    fn every_reparse_point_is_a_link_whatever_else_it_is() {
        for attributes in [
            SYMLINK_TO_FILE,
            SYMLINK_TO_DIRECTORY,
            JUNCTION,
            CLOUD_PLACEHOLDER_FILE,
            CLOUD_PLACEHOLDER_DIRECTORY,
            FILE_ATTRIBUTE_REPARSE_POINT,
            FILE_ATTRIBUTE_REPARSE_POINT | FILE_ATTRIBUTE_DEVICE,
            u32::MAX,
        ] {
            assert_eq!(
                windows_entry_kind(attributes),
                EntryKind::Symlink,
                "{attributes:#x}"
            );
            assert_eq!(
                windows_irregularity(attributes, 1),
                Some(Irregular::Symlink),
                "{attributes:#x}"
            );
        }
    }

    #[test]
    fn plain_entries_are_judged_by_their_attributes() {
        for attributes in [PLAIN_FILE, READ_ONLY_HIDDEN_FILE, NORMAL_FILE, 0] {
            assert_eq!(windows_entry_kind(attributes), EntryKind::File);
            assert_eq!(windows_irregularity(attributes, 1), None);
        }
        assert_eq!(windows_entry_kind(PLAIN_DIRECTORY), EntryKind::Directory);
        assert_eq!(windows_entry_kind(0x10 | 0x2), EntryKind::Directory);
        assert_eq!(windows_entry_kind(FILE_ATTRIBUTE_DEVICE), EntryKind::Other);
        assert_eq!(
            windows_irregularity(FILE_ATTRIBUTE_DEVICE, 1),
            Some(Irregular::Unknown)
        );
        assert_eq!(
            windows_irregularity(PLAIN_DIRECTORY, 1),
            Some(Irregular::Unknown)
        );
    }

    #[test]
    fn a_file_with_another_name_is_refused_for_reading() {
        assert_eq!(
            windows_irregularity(PLAIN_FILE, 2),
            Some(Irregular::HardLinked { links: 2 })
        );
        assert_eq!(
            windows_irregularity(NORMAL_FILE, 1024),
            Some(Irregular::HardLinked { links: 1024 })
        );
        // A link is a link first, however many names its target has.
        assert_eq!(
            windows_irregularity(SYMLINK_TO_FILE, 3),
            Some(Irregular::Symlink)
        );
    }
}
