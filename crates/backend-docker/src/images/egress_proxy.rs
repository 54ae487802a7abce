//! The egress proxy's root: a tar written in memory around a static `egress-proxy` binary
//! (`docs/egress-proxy.md`). No shell, no C library, nothing else: the binary is the
//! entrypoint, and the proxy resolves names with the static C library's built-in `files` and
//! `dns` lookups (Docker's embedded DNS answers network aliases).

use std::path::PathBuf;

use super::busybox::tar_header;
use super::guest_binary::{binary_digest, GuestBinary};
use super::scratch::Scratch;
use super::{
    write_file, HostTools, ImageRecipe, EGRESS_PROXY_DIR, EGRESS_PROXY_ID, EGRESS_PROXY_PATH,
};
use crate::error::DockerError;

impl ImageRecipe {
    /// Writes the proxy's root as a tar archive in the scratch directory; returns it with the
    /// binary's digest (the image's [`GuestBinary::digest_label`]).
    pub(super) fn egress_proxy_archive(
        &self,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<(PathBuf, String), DockerError> {
        let tool = tools
            .egress_proxy
            .as_ref()
            .ok_or_else(|| GuestBinary::EgressProxy.refused("preflight found none".to_owned()))?;
        let binary = GuestBinary::EgressProxy.read(&tool.program)?;
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
}
