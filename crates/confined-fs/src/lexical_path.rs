//! Lexical confinement: turning a caller's path into checked components, before any system call.

use std::ffi::OsString;
use std::path::Path;

use crate::error::{confinement, ConfinementReason, Error};
use crate::windows_rules::{windows_name_problem, WindowsNameProblem};

/// Which naming rules every component must meet, on top of the POSIX ones (no NUL, no `\`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameRules {
    /// Only what POSIX forbids, plus the backslash (a separator for a Windows reader).
    #[default]
    Posix,
    /// Also the Windows rules: reserved and control characters, a trailing dot or space, and
    /// device names (see [`windows_name_problem`]). A Windows host applies them whatever the
    /// root was opened with.
    Windows,
}

impl NameRules {
    /// The rules in force on this host: a Windows host always adds the Windows ones.
    fn on_this_host(self) -> Self {
        if cfg!(windows) {
            Self::Windows
        } else {
            self
        }
    }
}

/// A path relative to the root, normalised and checked: no component is empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuestPath {
    parts: Vec<OsString>,
}

impl GuestPath {
    /// Normalises `path` lexically and checks every component against `rules`.
    ///
    /// `..` pops the previous component; one with nothing to pop climbs above the root and is
    /// refused. Links are never consulted here: `a/../b` is `b` even when `a` is a link, and the
    /// walk later refuses any link it meets.
    pub(crate) fn parse(path: &Path, rules: NameRules) -> Result<Self, Error> {
        let rules = rules.on_this_host();
        // Bytes on Unix; WTF-8 on Windows, where `/`, `\`, `.` and NUL are the ASCII bytes
        // they are on Unix and an unpaired surrogate never validates as UTF-8.
        let bytes = path.as_os_str().as_encoded_bytes();
        let shown = || String::from_utf8_lossy(bytes).into_owned();
        if bytes.contains(&b'\\') {
            return Err(confinement(shown(), ConfinementReason::Backslash));
        }
        if bytes.contains(&0) {
            return Err(confinement(shown(), ConfinementReason::Nul));
        }
        if bytes.first() == Some(&b'/') {
            return Err(confinement(shown(), ConfinementReason::Absolute));
        }
        let mut parts: Vec<OsString> = Vec::new();
        for segment in bytes.split(|b| *b == b'/') {
            match segment {
                b"" | b"." => {}
                b".." => {
                    if parts.pop().is_none() {
                        return Err(confinement(shown(), ConfinementReason::Escape));
                    }
                }
                name => {
                    let refuse = |problem| {
                        Err(confinement(
                            shown(),
                            ConfinementReason::ReservedName(problem),
                        ))
                    };
                    if rules == NameRules::Windows {
                        if let Some(problem) = windows_name_problem(&String::from_utf8_lossy(name))
                        {
                            return refuse(problem);
                        }
                    }
                    match component(name) {
                        Some(part) => parts.push(part),
                        None => return refuse(WindowsNameProblem::NotUnicode),
                    }
                }
            }
        }
        Ok(Self { parts })
    }

    /// The components, outermost first; empty for the root itself.
    pub(crate) fn parts(&self) -> &[OsString] {
        &self.parts
    }

    /// The path of the first `count` components, for messages (`.` for none).
    pub(crate) fn shown_prefix(&self, count: usize) -> String {
        let prefix = &self.parts[..count.min(self.parts.len())];
        if prefix.is_empty() {
            return ".".to_owned();
        }
        let mut shown = String::new();
        for (index, part) in prefix.iter().enumerate() {
            if index > 0 {
                shown.push('/');
            }
            shown.push_str(&part.to_string_lossy());
        }
        shown
    }

    /// The whole path, for messages.
    pub(crate) fn shown(&self) -> String {
        self.shown_prefix(self.parts.len())
    }
}

/// One component from its bytes, as this host spells names.
#[cfg(unix)]
fn component(bytes: &[u8]) -> Option<OsString> {
    use std::os::unix::ffi::OsStrExt;
    Some(std::ffi::OsStr::from_bytes(bytes).to_owned())
}

#[cfg(windows)]
use self::windows::component;

#[cfg(windows)]
mod windows {
    use std::ffi::OsString;

    /// One component from its WTF-8 bytes: only a Unicode name converts back without unsafe
    /// code, and Windows names that are not Unicode are refused anyway.
    pub(super) fn component(bytes: &[u8]) -> Option<OsString> {
        std::str::from_utf8(bytes).ok().map(OsString::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(path: &str) -> Result<Vec<String>, Error> {
        GuestPath::parse(Path::new(path), NameRules::Posix).map(|p| {
            p.parts()
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect()
        })
    }

    fn reason(path: &str, rules: NameRules) -> ConfinementReason {
        match GuestPath::parse(Path::new(path), rules) {
            Err(Error::Confinement { reason, .. }) => reason,
            other => panic!("{path:?}: expected a confinement refusal, got {other:?}"),
        }
    }

    #[test]
    fn normalises_dots_and_empty_segments() {
        assert_eq!(parts("").unwrap(), Vec::<String>::new());
        assert_eq!(parts(".").unwrap(), Vec::<String>::new());
        assert_eq!(parts("./a//b/./c/").unwrap(), ["a", "b", "c"]);
        assert_eq!(parts("a/../b").unwrap(), ["b"]);
        assert_eq!(parts("a/b/../../c/..").unwrap(), Vec::<String>::new());
        assert_eq!(parts("...").unwrap(), ["..."]);
        assert_eq!(parts("..a/b..").unwrap(), ["..a", "b.."]);
    }

    #[test]
    fn refuses_escapes_absolute_paths_backslashes_and_nul() {
        assert_eq!(reason("..", NameRules::Posix), ConfinementReason::Escape);
        assert_eq!(
            reason("a/../../b", NameRules::Posix),
            ConfinementReason::Escape
        );
        assert_eq!(reason("./..", NameRules::Posix), ConfinementReason::Escape);
        assert_eq!(
            reason("/etc/passwd", NameRules::Posix),
            ConfinementReason::Absolute
        );
        assert_eq!(reason("//a", NameRules::Posix), ConfinementReason::Absolute);
        assert_eq!(
            reason("a\\..\\..\\b", NameRules::Posix),
            ConfinementReason::Backslash
        );
        assert_eq!(
            reason("a\\b", NameRules::Posix),
            ConfinementReason::Backslash
        );
        assert_eq!(reason("a\0b", NameRules::Posix), ConfinementReason::Nul);
    }

    #[test]
    fn windows_rules_apply_when_asked_and_always_on_windows() {
        #[cfg(not(windows))]
        assert_eq!(parts("nul.txt/aux").unwrap(), ["nul.txt", "aux"]);
        #[cfg(windows)]
        assert!(matches!(
            reason("nul.txt/aux", NameRules::Posix),
            ConfinementReason::ReservedName(_)
        ));
        assert!(matches!(
            reason("dir/nul.txt", NameRules::Windows),
            ConfinementReason::ReservedName(crate::WindowsNameProblem::DeviceName(_))
        ));
        assert!(matches!(
            reason("a:b", NameRules::Windows),
            ConfinementReason::ReservedName(_)
        ));
        assert!(matches!(
            reason("trailing./x", NameRules::Windows),
            ConfinementReason::ReservedName(_)
        ));
        // Every component given is checked, even one a later `..` pops.
        assert!(matches!(
            reason("con/../x", NameRules::Windows),
            ConfinementReason::ReservedName(_)
        ));
        assert!(GuestPath::parse(Path::new("ok/../x"), NameRules::Windows).is_ok());
    }

    #[test]
    fn shows_prefixes_for_messages() {
        let path = GuestPath::parse(Path::new("a/b/c"), NameRules::Posix).unwrap();
        assert_eq!(path.shown_prefix(0), ".");
        assert_eq!(path.shown_prefix(2), "a/b");
        assert_eq!(path.shown(), "a/b/c");
    }
}
