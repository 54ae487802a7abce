//! What a backend or host keeps on this machine's disk about its sandboxes, written and named
//! one way everywhere: small records placed durably, read with a cap, and random identifiers.
//!
//! - [`place_record`]: a record written to a fresh, randomly named temporary file beside it,
//!   synced, then renamed over the record (or hard-linked only where none exists,
//!   [`Placing::IfAbsent`]), and the directory synced so the rename itself survives a crash. A
//!   reader sees the old record or the new one, never half of one, and two writers never share a
//!   temporary file.
//! - [`read_record`]: at most a given number of bytes; a missing record is `None`.
//! - [`random_hex`]: lowercase hex from the operating system's random source. It fails loudly:
//!   an identifier that two processes could draw alike (a clock, a pid) is never made up.
//!
//! Not here: what a record holds (each backend's own serde type) or where its directory is.
//!
//! It is a leaf (it depends on nothing of ours) because the core does no I/O
//! (docs/architecture.md#layering-rules) and every backend and host with local state needs it.
#![deny(missing_docs)]
#![deny(unsafe_code)]

use std::fs;
use std::io::{self, Read as _, Write as _};
use std::path::Path;

/// How [`place_record`] puts the new record in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placing {
    /// Over any record there (a rename).
    Replace,
    /// Only where there is none (a hard link, which never replaces); another record already
    /// there is left as it is.
    IfAbsent,
}

/// Places `bytes` as `dir/name` (mode 0600 on POSIX), durably, as the module says. `Ok(false)`
/// only for [`Placing::IfAbsent`] when a record was already there.
///
/// # Errors
/// Any I/O failure, the random source's included; the temporary file is removed then.
pub fn place_record(dir: &Path, name: &str, bytes: &[u8], placing: Placing) -> io::Result<bool> {
    let temp = dir.join(format!(".{name}.{}.part", random_hex(16)?));
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let written = (|| {
        let mut file = options.open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        match placing {
            Placing::Replace => fs::rename(&temp, dir.join(name)).map(|()| true),
            Placing::IfAbsent => {
                let linked = match fs::hard_link(&temp, dir.join(name)) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(e),
                };
                fs::remove_file(&temp)?;
                linked
            }
        }
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    let placed = written?;
    // Makes the rename or link durable. Windows cannot open a directory as a `File` through
    // std; NTFS journals the metadata change itself.
    #[cfg(unix)]
    {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(placed)
}

/// The first `cap` bytes of the record at `path`; `None` when there is none.
///
/// # Errors
/// Any I/O failure other than a missing file.
pub fn read_record(path: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// `len` lowercase hex digits from the operating system's random source.
///
/// # Errors
/// The source fails (an [`io::Error`] saying so); nothing is made up instead.
pub fn random_hex(len: usize) -> io::Result<String> {
    let mut bytes = vec![0u8; len.div_ceil(2)];
    getrandom::fill(&mut bytes)
        .map_err(|e| io::Error::other(format!("the random source failed: {e}")))?;
    let mut hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.truncate(len);
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_has_the_length_asked_and_differs_per_draw() {
        for len in [0, 1, 12, 16, 31, 64] {
            let hex = random_hex(len).unwrap();
            assert_eq!(hex.len(), len);
            assert!(hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
        assert_ne!(random_hex(32).unwrap(), random_hex(32).unwrap());
    }

    #[test]
    fn a_record_is_replaced_whole_claimed_once_and_read_with_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.json");
        assert_eq!(read_record(&path, 1024).unwrap(), None);
        assert!(place_record(dir.path(), "meta.json", b"first", Placing::IfAbsent).unwrap());
        assert!(!place_record(dir.path(), "meta.json", b"second", Placing::IfAbsent).unwrap());
        assert_eq!(read_record(&path, 1024).unwrap().unwrap(), b"first");
        assert!(place_record(dir.path(), "meta.json", b"third!", Placing::Replace).unwrap());
        assert_eq!(read_record(&path, 1024).unwrap().unwrap(), b"third!");
        assert_eq!(read_record(&path, 3).unwrap().unwrap(), b"thi");
        // No temporary file is left beside the record.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["meta.json"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the record should go: the rename fails.
        std::fs::create_dir(dir.path().join("meta.json")).unwrap();
        std::fs::write(dir.path().join("meta.json/x"), b"x").unwrap();
        assert!(place_record(dir.path(), "meta.json", b"r", Placing::Replace).is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["meta.json"]);
    }
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
