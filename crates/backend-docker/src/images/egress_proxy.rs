//! The egress proxy's root: a tar written in memory around a static `egress-proxy` binary
//! (`docs/egress-proxy.md`). No shell, no C library, nothing else: the binary is the
//! entrypoint, and the proxy resolves names with the static C library's built-in `files` and
//! `dns` lookups (Docker's embedded DNS answers network aliases).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::busybox::{elf_static_check, tar_header};
use super::scratch::Scratch;
use super::{
    write_file, HostTools, ImageRecipe, EGRESS_PROXY_DIR, EGRESS_PROXY_ID, EGRESS_PROXY_PATH,
};
use crate::error::DockerError;

/// The binary's name beside the executable that runs the recipe.
const BINARY_NAME: &str = "egress-proxy";

/// The largest binary accepted (the release build is a few MiB).
const MAX_BINARY: u64 = 256 * 1024 * 1024;

impl ImageRecipe {
    /// Writes the proxy's root as a tar archive in the scratch directory; returns it with the
    /// binary's digest (the image's [`BINARY_DIGEST_LABEL`]).
    pub(super) fn egress_proxy_archive(
        &self,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<(PathBuf, String), DockerError> {
        let tool = tools
            .egress_proxy
            .as_ref()
            .ok_or_else(|| not_usable("preflight found none".to_owned()))?;
        let binary = read_binary(&tool.program)?;
        let bytes = egress_proxy_root_tar(&binary).map_err(|source| DockerError::Io {
            action: "assembling the egress proxy root for",
            path: tool.program.clone(),
            source,
        })?;
        let archive = scratch.path().join("egress-proxy.tar");
        write_file(&archive, &bytes, 0o600)?;
        self.say(&format!(
            "  egress proxy root around {} ({} bytes)",
            tool.program.display(),
            binary.len()
        ));
        Ok((archive, binary_digest(&binary)))
    }
}

/// The image label holding the sha256 of the binary it was built around, so a recipe run with
/// another binary (the proxy's code changed) rebuilds the image instead of keeping a stale one.
pub(super) const BINARY_DIGEST_LABEL: &str = "maf-sandbox.egress-proxy.sha256";

/// Reads the binary, refusing one over [`MAX_BINARY`].
pub(super) fn read_binary(path: &Path) -> Result<Vec<u8>, DockerError> {
    let mut binary = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_BINARY + 1).read_to_end(&mut binary))
        .map_err(|source| DockerError::Io {
            action: "reading",
            path: path.to_owned(),
            source,
        })?;
    if binary.len() as u64 > MAX_BINARY {
        return Err(not_usable(format!(
            "{} is larger than 256 MiB",
            path.display()
        )));
    }
    Ok(binary)
}

/// The lower-case hex sha256 of the binary.
pub(super) fn binary_digest(binary: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(binary)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cold]
fn not_usable(reason: String) -> DockerError {
    DockerError::EgressProxyBinary { reason }
}

/// The binary to build the image around: the configured one, else `egress-proxy` beside this
/// process's executable; either must be a static 64-bit ELF executable.
pub(super) fn find_egress_proxy(configured: Option<&Path>) -> Result<PathBuf, DockerError> {
    let path = match configured {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join(BINARY_NAME)))
            .ok_or_else(|| not_usable("this process's executable has no directory".to_owned()))?,
    };
    let mut head = Vec::new();
    std::fs::File::open(&path)
        .and_then(|file| file.take(64 * 1024).read_to_end(&mut head))
        .map_err(|error| not_usable(format!("{}: {error}", path.display())))?;
    elf_static_check(&head)
        .map_err(|reason| not_usable(format!("{}: {reason}", path.display())))?;
    Ok(path)
}

/// The proxy's root as a tar: the binary at [`EGRESS_PROXY_PATH`] (0755), the volume's mount
/// point [`EGRESS_PROXY_DIR`] owned by [`EGRESS_PROXY_ID`] (0755), and `/etc/passwd` and
/// `/etc/group` naming that user.
fn egress_proxy_root_tar(binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let owned_dir = EGRESS_PROXY_DIR.trim_start_matches('/');
    let binary_path = EGRESS_PROXY_PATH.trim_start_matches('/');
    let mut dirs: Vec<(String, u32)> = vec![("etc".into(), 0), ("run".into(), 0)];
    let mut parent = String::new();
    for part in binary_path
        .split('/')
        .take(binary_path.split('/').count() - 1)
    {
        if !parent.is_empty() {
            parent.push('/');
        }
        parent.push_str(part);
        dirs.push((parent.clone(), 0));
    }
    dirs.push((owned_dir.to_owned(), EGRESS_PROXY_ID));
    dirs.sort();
    dirs.dedup();
    for (dir, owner) in &dirs {
        let mut header = tar_header(tar::EntryType::Directory, 0o755, *owner);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }
    let mut header = tar_header(tar::EntryType::Regular, 0o755, 0);
    header.set_size(binary.len() as u64);
    builder.append_data(&mut header, binary_path, binary)?;
    let passwd = format!(
        "root:x:0:0:root:/:/nonexistent\nproxy:x:{EGRESS_PROXY_ID}:{EGRESS_PROXY_ID}:egress proxy:/nonexistent:/nonexistent\n"
    );
    let group = format!("root:x:0:\nproxy:x:{EGRESS_PROXY_ID}:\n");
    for (path, text) in [("etc/passwd", passwd), ("etc/group", group)] {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, 0);
        header.set_size(text.len() as u64);
        builder.append_data(&mut header, path, text.as_bytes())?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_digest_is_its_sha256_in_lower_hex() {
        assert_eq!(
            binary_digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_root_holds_the_binary_and_a_mount_point_the_proxy_user_owns() {
        let bytes = egress_proxy_root_tar(b"\x7fELF-not-really").unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let header = entry.header();
            seen.push((
                entry.path().unwrap().display().to_string(),
                header.mode().unwrap(),
                header.uid().unwrap(),
                header.entry_type(),
            ));
        }
        assert!(seen.contains(&(
            "run/maf-egress".to_owned(),
            0o755,
            u64::from(EGRESS_PROXY_ID),
            tar::EntryType::Directory
        )));
        assert!(seen.contains(&(
            "usr/local/bin/egress-proxy".to_owned(),
            0o755,
            0,
            tar::EntryType::Regular
        )));
        // Every parent comes before its children.
        let position = |p: &str| seen.iter().position(|s| s.0 == p).unwrap();
        assert!(position("usr") < position("usr/local/bin"));
        assert!(position("run") < position("run/maf-egress"));
        assert!(position("usr/local/bin") < position("usr/local/bin/egress-proxy"));
    }

    #[test]
    fn a_dynamic_or_missing_binary_is_refused_by_name() {
        let error = find_egress_proxy(Some(Path::new("/nonexistent/egress-proxy"))).unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/egress-proxy"),
            "{error}"
        );
        // This test binary is dynamically linked.
        let me = std::env::current_exe().unwrap();
        let error = find_egress_proxy(Some(&me)).unwrap_err();
        assert!(error.to_string().contains("dynamically linked"), "{error}");
    }
}
