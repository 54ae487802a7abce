//! The strict tar header parser behind reads from the container archive endpoint.
//!
//! The archive `GET` answers with a tar stream whose first real entry describes the path itself,
//! without following a link leaf. Only that entry's header is parsed: at most [`MAX_HEADERS`]
//! headers and [`MAX_METADATA`] bytes of extended metadata, every checksum verified, every PAX
//! record exact. Anything unexpected is an engine failure, never a guess. The entry's data starts
//! at the offset [`first_entry_at`] reports.

use sandbox_core::EntryKind;

/// Most 512-byte headers read before the first real entry must have appeared.
pub(crate) const MAX_HEADERS: usize = 32;

/// Most bytes of extended metadata (PAX records, GNU long names) read before it.
pub(crate) const MAX_METADATA: usize = 65_536;

const BLOCK: usize = 512;

/// The prefix of the stream that always holds the first entry's header when the parser accepts it.
pub(crate) const MAX_PREFIX: usize = MAX_HEADERS * BLOCK + MAX_METADATA + BLOCK;

/// The first real entry of a tar stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TarStat {
    /// Its kind.
    pub(crate) kind: EntryKind,
    /// Its size, for a regular file only.
    pub(crate) size: Option<u64>,
}

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FirstEntry {
    /// The first real entry was read.
    Found(TarStat),
    /// The bytes end before the first real entry's header does.
    NeedMore,
}

/// Reads the first real entry of a tar stream prefix. `Err` carries why the stream is refused.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn first_entry(bytes: &[u8]) -> Result<FirstEntry, String> {
    first_entry_at(bytes).map(|(entry, _)| entry)
}

/// [`first_entry`], with the offset where the entry's data starts (meaningful for `Found`).
pub(crate) fn first_entry_at(bytes: &[u8]) -> Result<(FirstEntry, usize), String> {
    let mut offset = 0usize;
    let mut metadata = 0usize;
    let mut pax_size: Option<u64> = None;
    for _ in 0..MAX_HEADERS {
        let Some(header) = bytes.get(offset..offset + BLOCK) else {
            return Ok((FirstEntry::NeedMore, offset));
        };
        if header.iter().all(|b| *b == 0) {
            return Err("the archive ends before any entry".to_owned());
        }
        verify_checksum(header)?;
        let size = octal(&header[124..136]).ok_or("a header size is not octal")?;
        let typeflag = header[156];
        offset += BLOCK;
        match typeflag {
            b'x' | b'g' | b'L' | b'K' => {
                let size = usize::try_from(size).map_err(|_| "extended header too large")?;
                metadata = metadata
                    .checked_add(size)
                    .filter(|total| *total <= MAX_METADATA)
                    .ok_or("more extended metadata than allowed")?;
                let padded = size.div_ceil(BLOCK) * BLOCK;
                let Some(payload) = bytes.get(offset..offset + size) else {
                    return Ok((FirstEntry::NeedMore, offset));
                };
                if typeflag == b'x' || typeflag == b'g' {
                    let records = pax_records(payload)?;
                    if typeflag == b'x' {
                        if let Some(size) = records {
                            pax_size = Some(size);
                        }
                    }
                }
                offset += padded;
            }
            b'S' => return Err("a GNU sparse entry".to_owned()),
            b'0' | 0 => {
                let stat = TarStat {
                    kind: EntryKind::File,
                    size: Some(pax_size.unwrap_or(size)),
                };
                return Ok((FirstEntry::Found(stat), offset));
            }
            b'5' => return Ok((found(EntryKind::Directory), offset)),
            b'2' => return Ok((found(EntryKind::Symlink), offset)),
            _ => return Ok((found(EntryKind::Other), offset)),
        }
    }
    Err(format!("no entry within {MAX_HEADERS} headers"))
}

fn found(kind: EntryKind) -> FirstEntry {
    FirstEntry::Found(TarStat { kind, size: None })
}

/// The header checksum: the sum of all bytes with the checksum field read as spaces, unsigned or
/// (for old writers) signed.
fn verify_checksum(header: &[u8]) -> Result<(), String> {
    let recorded = octal(&header[148..156]).ok_or("a header checksum is not octal")?;
    let mut unsigned: i64 = 0;
    let mut signed: i64 = 0;
    for (index, byte) in header.iter().enumerate() {
        let byte = if (148..156).contains(&index) {
            b' '
        } else {
            *byte
        };
        unsigned += i64::from(byte);
        signed += i64::from(byte as i8);
    }
    let recorded = i64::try_from(recorded).map_err(|_| "a header checksum is out of range")?;
    if recorded == unsigned || recorded == signed {
        Ok(())
    } else {
        Err("a header checksum does not match".to_owned())
    }
}

/// An octal numeric field: leading spaces, octal digits, then NUL or space padding. At least one
/// digit; anything else (base-256, a sign, stray characters) is refused.
fn octal(field: &[u8]) -> Option<u64> {
    let start = field.iter().position(|b| *b != b' ')?;
    let field = &field[start..];
    let end = field
        .iter()
        .position(|b| *b == 0 || *b == b' ')
        .unwrap_or(field.len());
    let (digits, padding) = field.split_at(end);
    if digits.is_empty() || !padding.iter().all(|b| *b == 0 || *b == b' ') {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, d| match d {
        b'0'..=b'7' => acc.checked_mul(8)?.checked_add(u64::from(d - b'0')),
        _ => None,
    })
}

/// Reads PAX records, each exactly `<decimal length> <key>=<value>\n` with the length counting the
/// whole record. Returns the `size` override, if any. `GNU.sparse.*` keys and non-decimal `size`,
/// `uid` or `gid` values are refused.
fn pax_records(mut payload: &[u8]) -> Result<Option<u64>, String> {
    let mut size = None;
    while !payload.is_empty() {
        let space = payload
            .iter()
            .position(|b| *b == b' ')
            .ok_or("a PAX record has no length")?;
        let length: usize = decimal(&payload[..space])
            .and_then(|n| usize::try_from(n).ok())
            .ok_or("a PAX record length is not decimal")?;
        if length <= space + 1 || length > payload.len() {
            return Err("a PAX record length does not match".to_owned());
        }
        let record = &payload[space + 1..length];
        let Some((b'\n', body)) = record.split_last() else {
            return Err("a PAX record does not end with a newline".to_owned());
        };
        let equals = body
            .iter()
            .position(|b| *b == b'=')
            .ok_or("a PAX record has no '='")?;
        let (key, value) = (&body[..equals], &body[equals + 1..]);
        if key.starts_with(b"GNU.sparse.") {
            return Err("a GNU sparse PAX record".to_owned());
        }
        if matches!(key, b"size" | b"uid" | b"gid") {
            let number = decimal(value).ok_or("a PAX numeric value is not decimal")?;
            if key == b"size" {
                size = Some(number);
            }
        }
        payload = &payload[length..];
    }
    Ok(size)
}

fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, d| match d {
        b'0'..=b'9' => acc.checked_mul(10)?.checked_add(u64::from(d - b'0')),
        _ => None,
    })
}

/// One directory entry for the storage-base fallback: a ustar header for
/// `name` (relative, ending in `/`), mode 0755, owned by `uid:gid`.
pub(crate) fn directory_entry(name: &str, uid: u64, gid: u64) -> Result<Vec<u8>, String> {
    let mut header = tar::Header::new_ustar();
    header
        .set_path(name)
        .map_err(|e| format!("directory name {name:?}: {e}"))?;
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_size(0);
    header.set_mtime(0);
    header.set_cksum();
    Ok(header.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: tar::EntryType, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (k, v) in records {
            let rest = format!(" {k}={v}\n");
            let mut len = rest.len() + 1;
            while format!("{len}{rest}").len() != len {
                len += 1;
            }
            body.extend_from_slice(format!("{len}{rest}").as_bytes());
        }
        let mut out = header("pax", tar::EntryType::XHeader, body.len() as u64);
        let padded = body.len().div_ceil(BLOCK) * BLOCK;
        body.resize(padded, 0);
        out.extend(body);
        out
    }

    fn stat(bytes: &[u8]) -> TarStat {
        match first_entry(bytes).unwrap() {
            FirstEntry::Found(stat) => stat,
            FirstEntry::NeedMore => panic!("needs more"),
        }
    }

    #[test]
    fn classifies_the_first_entry() {
        let file = header("f", tar::EntryType::Regular, 20);
        assert_eq!(
            stat(&file),
            TarStat {
                kind: EntryKind::File,
                size: Some(20)
            }
        );
        assert_eq!(
            stat(&header("d/", tar::EntryType::Directory, 0)).kind,
            EntryKind::Directory
        );
        let link = stat(&header("l", tar::EntryType::Symlink, 0));
        assert_eq!(
            link,
            TarStat {
                kind: EntryKind::Symlink,
                size: None
            }
        );
        for other in [
            tar::EntryType::Link,
            tar::EntryType::Char,
            tar::EntryType::Block,
            tar::EntryType::Fifo,
            tar::EntryType::Continuous,
        ] {
            assert_eq!(stat(&header("o", other, 0)).kind, EntryKind::Other);
        }
    }

    #[test]
    fn pax_size_overrides_and_is_skipped_with_padding() {
        let mut bytes = pax(&[("path", "a-long-name"), ("size", "123456789012")]);
        bytes.extend(header("f", tar::EntryType::Regular, 0));
        assert_eq!(stat(&bytes).size, Some(123_456_789_012));
        assert_eq!(
            first_entry(&bytes[..bytes.len() - 1]).unwrap(),
            FirstEntry::NeedMore
        );
        assert_eq!(first_entry(&bytes[..700]).unwrap(), FirstEntry::NeedMore);
    }

    #[test]
    fn gnu_long_names_are_skipped() {
        let name = "n".repeat(300);
        let mut bytes = header(
            "././@LongLink",
            tar::EntryType::GNULongName,
            name.len() as u64,
        );
        let mut payload = name.into_bytes();
        payload.resize(BLOCK, 0);
        bytes.extend(payload);
        bytes.extend(header("x", tar::EntryType::Directory, 0));
        assert_eq!(stat(&bytes).kind, EntryKind::Directory);
    }

    #[test]
    fn refusals() {
        let mut bad_sum = header("f", tar::EntryType::Regular, 1);
        bad_sum[0] ^= 1;
        assert!(first_entry(&bad_sum).is_err());
        assert!(first_entry(&[0u8; 1024]).is_err());
        assert!(first_entry(&header("s", tar::EntryType::GNUSparse, 0)).is_err());
        for records in [
            vec![("GNU.sparse.size", "1")],
            vec![("size", "-1")],
            vec![("uid", "1x")],
            vec![("size", "")],
        ] {
            let mut bytes = pax(&records);
            bytes.extend(header("f", tar::EntryType::Regular, 0));
            assert!(first_entry(&bytes).is_err(), "{records:?}");
        }
        // A record whose length lies.
        let mut bytes = header("pax", tar::EntryType::XHeader, 12);
        let mut body = b"99 size=1\n\0\0".to_vec();
        body.resize(BLOCK, 0);
        bytes.extend(body);
        bytes.extend(header("f", tar::EntryType::Regular, 0));
        assert!(first_entry(&bytes).is_err());
        // Too many extended headers.
        let mut bytes = Vec::new();
        for _ in 0..MAX_HEADERS {
            bytes.extend(pax(&[("path", "p")]));
        }
        bytes.extend(header("f", tar::EntryType::Regular, 0));
        assert!(first_entry(&bytes).is_err());
        // Too much metadata.
        let big = "v".repeat(MAX_METADATA);
        let mut bytes = pax(&[("comment", &big)]);
        bytes.extend(header("f", tar::EntryType::Regular, 0));
        assert!(first_entry(&bytes).is_err());
    }

    #[test]
    fn non_octal_size_is_refused() {
        let mut h = header("f", tar::EntryType::Regular, 0);
        h[124..136].copy_from_slice(b"0000000009a\0");
        // Recompute the checksum so only the size is wrong.
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        assert_eq!(first_entry(&h).unwrap_err(), "a header size is not octal");
    }

    #[test]
    fn the_data_offset_follows_the_entry_header() {
        let mut bytes = pax(&[("size", "3")]);
        bytes.extend(header("f", tar::EntryType::Regular, 3));
        let header_end = bytes.len();
        bytes.extend(b"abc");
        let (entry, offset) = first_entry_at(&bytes).unwrap();
        assert!(matches!(
            entry,
            FirstEntry::Found(TarStat { size: Some(3), .. })
        ));
        assert_eq!(offset, header_end);
        assert_eq!(&bytes[offset..offset + 3], b"abc");
    }

    #[test]
    fn short_input_needs_more() {
        assert_eq!(first_entry(&[]).unwrap(), FirstEntry::NeedMore);
        assert_eq!(first_entry(&[1u8; 100]).unwrap(), FirstEntry::NeedMore);
    }

    #[test]
    fn directory_entries_parse_back() {
        let entry = directory_entry("srv/maf-explicit/", 1000, 1000).unwrap();
        assert_eq!(entry.len(), BLOCK);
        assert_eq!(stat(&entry).kind, EntryKind::Directory);
    }
}
