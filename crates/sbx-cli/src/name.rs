//! Validated argument types: a sandbox name, a memory size, a CPU count.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Longest sandbox name `sbx` accepts.
pub const MAX_NAME_LEN: usize = 63;

/// A sandbox name `sbx` accepts: `[a-z0-9][a-z0-9-]{0,62}`.
///
/// Only a valid name can be built, so every method that takes one can put it on the command line
/// without further checks (it never starts with `-`, so it is never read as an option).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SbxName(String);

impl SbxName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `name` is empty, longer than [`MAX_NAME_LEN`], starts with
    /// `-`, or holds anything but lower-case ASCII letters, digits and `-`.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        match name_problem(&name) {
            None => Ok(SbxName(name)),
            Some(reason) => Err(Error::invalid_argument(
                "sandbox name",
                format!("{name:?} {reason}; a name is [a-z0-9][a-z0-9-]{{0,62}}"),
            )),
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// Why `name` is not a valid sandbox name, or `None` when it is.
fn name_problem(name: &str) -> Option<&'static str> {
    let bytes = name.as_bytes();
    let first = match bytes.first() {
        None => return Some("is empty"),
        Some(first) => *first,
    };
    if bytes.len() > MAX_NAME_LEN {
        return Some("is longer than 63 characters");
    }
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Some("does not start with a lower-case letter or digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return Some("holds a character other than a-z, 0-9 and -");
    }
    None
}

impl fmt::Display for SbxName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SbxName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for SbxName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        SbxName::new(s)
    }
}

impl TryFrom<String> for SbxName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        SbxName::new(s)
    }
}

impl TryFrom<&str> for SbxName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self, Error> {
        SbxName::new(s)
    }
}

impl From<SbxName> for String {
    fn from(name: SbxName) -> String {
        name.0
    }
}

/// A VM memory size as `sbx create --memory` takes it: `[1-9][0-9]*` followed by `m`, `M`, `g` or
/// `G` (for example `2g`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemorySize(String);

impl MemorySize {
    /// Checks `size` and wraps it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `size` is not `[1-9][0-9]*[mMgG]`.
    pub fn new(size: impl Into<String>) -> Result<Self, Error> {
        let size = size.into();
        let valid = match size.as_bytes() {
            [first, digits @ .., unit] => {
                (b'1'..=b'9').contains(first)
                    && digits.iter().all(u8::is_ascii_digit)
                    && matches!(unit, b'm' | b'M' | b'g' | b'G')
            }
            _ => false,
        };
        if valid {
            Ok(MemorySize(size))
        } else {
            Err(Error::invalid_argument(
                "memory size",
                format!("{size:?} is not a size like 2g or 512m ([1-9][0-9]*[mMgG])"),
            ))
        }
    }

    /// The size as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemorySize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for MemorySize {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        MemorySize::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_of_a_name_is_its_text() {
        let name = SbxName::new("maf-1").unwrap();
        assert_eq!(name.as_str(), "maf-1");
        assert_eq!(AsRef::<str>::as_ref(&name), "maf-1");
        assert_eq!(name.to_string(), "maf-1");
        assert_eq!(String::from(name.clone()), "maf-1");
        assert_eq!(name.into_string(), "maf-1");
        let size = MemorySize::new("512m").unwrap();
        assert_eq!((size.as_str(), size.to_string().as_str()), ("512m", "512m"));
    }

    #[test]
    fn names_follow_the_sbx_rule() {
        let long_ok = format!("a{}", "-".repeat(62));
        let too_long = format!("a{}", "b".repeat(63));
        for good in [
            "a",
            "0",
            "maf-0123456789ab-0123456789-01234567",
            "a-",
            &long_ok,
        ] {
            assert!(SbxName::new(good).is_ok(), "{good:?} should be valid");
        }
        for bad in [
            "",
            "-a",
            "A",
            "a_b",
            "a.b",
            "a b",
            "é",
            "a\0",
            "--force",
            too_long.as_str(),
        ] {
            let err = SbxName::new(bad).expect_err(bad);
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        }
        assert_eq!(long_ok.len(), MAX_NAME_LEN);
    }

    #[test]
    fn memory_sizes_follow_the_sbx_rule() {
        for good in ["2g", "1G", "512m", "4096M", "10g"] {
            assert_eq!(MemorySize::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "g", "0g", "02g", "2", "2k", "2gb", "-2g", " 2g"] {
            assert!(MemorySize::new(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
