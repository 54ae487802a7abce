//! A `newc` cpio writer, the format the kernel unpacks an initramfs from.

/// One initramfs member.
pub(crate) enum Member<'a> {
    /// A directory.
    Dir(&'a str),
    /// A regular file with its mode bits.
    File(&'a str, u32, &'a [u8]),
    /// A character device node (major, minor).
    CharDev(&'a str, u32, u32),
}

fn header(out: &mut Vec<u8>, ino: u32, mode: u32, size: usize, rdev: (u32, u32), name: &str) {
    let fields = [
        ino,
        mode,
        0,
        0,
        1,
        0,
        size as u32,
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(b"070701");
    for field in fields {
        out.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad(out);
}

fn pad(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

/// The archive of `members`, in order, with the trailer.
pub(crate) fn archive(members: &[Member<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, member) in members.iter().enumerate() {
        let ino = index as u32 + 1;
        match member {
            Member::Dir(name) => header(&mut out, ino, 0o040_755, 0, (0, 0), name),
            Member::File(name, mode, data) => {
                header(&mut out, ino, 0o100_000 | mode, data.len(), (0, 0), name);
                out.extend_from_slice(data);
                pad(&mut out);
            }
            Member::CharDev(name, major, minor) => {
                header(&mut out, ino, 0o020_600, 0, (*major, *minor), name)
            }
        }
    }
    header(&mut out, 0, 0, 0, (0, 0), "TRAILER!!!");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_aligned_and_the_trailer_ends_the_archive() {
        let bytes = archive(&[Member::Dir("dev"), Member::File("init", 0o755, b"abc")]);
        assert!(bytes.starts_with(b"070701"));
        assert_eq!(bytes.len() % 4, 0);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("init\0"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!\0"));
        // The file's data follows its 4-byte-aligned header.
        let at = bytes.windows(3).position(|w| w == b"abc").unwrap();
        assert_eq!(at % 4, 0);
    }
}
