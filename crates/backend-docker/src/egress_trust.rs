//! The workload's trust in its egress proxy's CA (docs/docker-backend.md#allowlist-egress): a
//! proxy that terminates TLS writes its CA certificate to the egress volume; the backend then
//! writes, through the engine's archive endpoint (as root, whatever user the workload runs as),
//! the bundle the workload's trust variables name ([`WORKLOAD_CA_BUNDLE`]: the image's own
//! bundle and the CA) and the CA into the image's own bundle, for clients that read only that.
//!
//! The CA's block in a bundle sits between two marker lines, replaced whole on every acquire: a
//! proxy made again makes a new CA, and the old one stops being trusted. The files are root's,
//! mode 0644: a guest that is not root cannot make its clients trust anything else.

use sandbox_core::{ErrorKind, SandboxError};

use crate::archive::Archive;
use crate::egress_names::{PROXY_CA_CERT, WORKLOAD_CA_BUNDLE};

/// Where images keep their system bundle, most common first; the first regular file found is
/// the image's.
pub(crate) const IMAGE_BUNDLES: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];
/// The most of the CA certificate read.
const CA_CAP: u64 = 64 * 1024;
/// The most of an image's bundle read (Debian's is about 220 KiB).
const BUNDLE_CAP: u64 = 8 * 1024 * 1024;
/// The lines around the CA's block in a bundle.
const BEGIN: &str = "# maf-egress-proxy CA: begin";
const END: &str = "# maf-egress-proxy CA: end";

/// `bundle` without any CA block of ours (an unterminated block is cut to the end).
pub(crate) fn without_block(bundle: &str) -> String {
    let mut kept = String::with_capacity(bundle.len());
    let mut inside = false;
    for line in bundle.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if !inside && bare == BEGIN {
            inside = true;
        } else if inside && bare == END {
            inside = false;
        } else if !inside {
            kept.push_str(line);
        }
    }
    kept
}

/// `bundle` (ours removed) followed by `ca` in a marked block.
pub(crate) fn with_block(bundle: &str, ca: &str) -> String {
    let mut text = without_block(bundle);
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(BEGIN);
    text.push('\n');
    text.push_str(ca.trim_end_matches('\n'));
    text.push('\n');
    text.push_str(END);
    text.push('\n');
    text
}

/// The tar that puts `files` (absolute paths, content) in place from `/`, owned by root, mode
/// 0644, with their directories 0755.
pub(crate) fn trust_archive(files: &[(&str, &str)]) -> Result<Vec<u8>, SandboxError> {
    let mut builder = tar::Builder::new(Vec::new());
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(size);
        header.set_mtime(mtime);
        header
    };
    let refuse = |e: std::io::Error| SandboxError::engine(format!("archiving the CA bundle: {e}"));
    for (path, content) in files {
        let relative = path.trim_start_matches('/');
        let mut header = header(tar::EntryType::Regular, 0o644, content.len() as u64);
        builder
            .append_data(&mut header, relative, content.as_bytes())
            .map_err(refuse)?;
    }
    builder.into_inner().map_err(refuse)
}

/// Makes the workload `id` trust its proxy's CA, as the module says.
///
/// # Errors
/// The CA certificate missing or unreadable (the proxy did not write it), or an engine failure.
pub(crate) async fn install(archive: &Archive, id: &str) -> Result<(), SandboxError> {
    let ca = archive
        .read_archive_file(id, PROXY_CA_CERT, CA_CAP, false)
        .await
        .map_err(|e| {
            SandboxError::engine(format!(
                "the egress proxy's CA certificate {PROXY_CA_CERT} could not be read: {e}"
            ))
        })?;
    let ca = String::from_utf8(ca)
        .map_err(|_| SandboxError::engine("the egress proxy's CA certificate is not text"))?;
    if !ca.starts_with("-----BEGIN CERTIFICATE-----") {
        return Err(SandboxError::engine(
            "the egress proxy's CA certificate is not a PEM certificate",
        ));
    }
    let mut image = None;
    for path in IMAGE_BUNDLES {
        match archive.read_archive_file(id, path, BUNDLE_CAP, false).await {
            Ok(bytes) => {
                image = Some((path, String::from_utf8_lossy(&bytes).into_owned()));
                break;
            }
            // Absent, a link (Alpine's cert.pem) or a directory: not the image's bundle.
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::NotFound | ErrorKind::NotRegularFile | ErrorKind::IsADirectory
                ) => {}
            Err(error) => return Err(error),
        }
    }
    let own = with_block(image.as_ref().map_or("", |(_, text)| text), &ca);
    let mut files = vec![(WORKLOAD_CA_BUNDLE, own.as_str())];
    let rewritten = image.as_ref().map(|(_, text)| with_block(text, &ca));
    if let (Some((path, _)), Some(text)) = (&image, &rewritten) {
        files.push((path, text.as_str()));
    }
    archive.put_archive(id, "/", trust_archive(&files)?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_block_is_added_once_and_replaced_whole() {
        let image = "-----BEGIN CERTIFICATE-----\nPUBLIC\n-----END CERTIFICATE-----\n";
        let once = with_block(image, CA);
        assert_eq!(
            once,
            format!("{image}{BEGIN}\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n{END}\n")
        );
        // A new CA replaces the old block; the image's part is kept exactly.
        let other = CA.replace("MIIB", "NEW");
        let twice = with_block(&once, &other);
        assert!(twice.starts_with(image), "{twice}");
        assert!(!twice.contains("MIIB"), "{twice}");
        assert_eq!(twice.matches(BEGIN).count(), 1);
        assert_eq!(without_block(&twice), image);
        assert_eq!(without_block(image), image);
        // No image bundle, or one without a final newline.
        assert!(with_block("", CA).starts_with(BEGIN));
        assert_eq!(
            with_block("X", CA).lines().take(2).collect::<Vec<_>>(),
            ["X", BEGIN]
        );
        // A block cut short (no end line) is dropped to the end; CRLF markers are ours too.
        assert_eq!(without_block(&format!("A\n{BEGIN}\nB\n")), "A\n");
        assert_eq!(
            without_block(&format!("A\r\n{BEGIN}\r\nB\r\n{END}\r\nC\n")),
            "A\r\nC\n"
        );
        // A marker inside a line is not a marker.
        let quoted = format!("x {BEGIN}\n");
        assert_eq!(without_block(&quoted), quoted);
    }

    #[test]
    fn the_archive_puts_root_owned_readable_files_in_place() {
        let bytes =
            trust_archive(&[(WORKLOAD_CA_BUNDLE, "one"), (IMAGE_BUNDLES[0], "two")]).unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let header = entry.header().clone();
            assert_eq!(header.uid().unwrap(), 0);
            assert_eq!(header.gid().unwrap(), 0);
            assert_eq!(header.mode().unwrap(), 0o644);
            assert_eq!(header.entry_type(), tar::EntryType::Regular);
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
            seen.push((entry.path().unwrap().display().to_string(), text));
        }
        assert_eq!(
            seen,
            [
                ("etc/maf-egress/ca-bundle.pem".to_owned(), "one".to_owned()),
                (
                    "etc/ssl/certs/ca-certificates.crt".to_owned(),
                    "two".to_owned()
                ),
            ]
        );
    }
}
