//! The exec init in the Debian images that carry it: the static `sandbox-exec-init` at
//! [`exec_wrapper::EXEC_INIT_PATH`], added at import as tar entries after the root archive's
//! own, so the debootstrapped root and its cached archive stay the same whatever the binary.

use super::busybox::tar_header;
use super::guest_binary::{binary_digest, GuestBinary};
use super::{HostTools, ImageRecipe};
use crate::error::DockerError;

/// The init's entries and the binary's digest (the image's [`GuestBinary::digest_label`]).
#[derive(Debug)]
pub(super) struct ExecInitEntries {
    /// The tar entries, the end-of-archive marker included.
    pub(super) tar: Vec<u8>,
    /// The lower-case hex sha256 of the binary.
    pub(super) digest: String,
}

impl ImageRecipe {
    /// Reads the init preflight found and writes its entries.
    pub(super) fn exec_init_entries(
        &self,
        tools: &HostTools,
    ) -> Result<ExecInitEntries, DockerError> {
        let tool = tools
            .exec_init
            .as_ref()
            .ok_or_else(|| GuestBinary::ExecInit.refused("preflight found none".to_owned()))?;
        let binary = GuestBinary::ExecInit.read(&tool.program)?;
        let tar = exec_init_tar(&binary).map_err(|source| DockerError::Io {
            action: "assembling the exec init's entries for",
            path: tool.program.clone(),
            source,
        })?;
        self.say(&format!(
            "  exec init {} ({} bytes) at {}",
            tool.program.display(),
            binary.len(),
            exec_wrapper::EXEC_INIT_PATH
        ));
        Ok(ExecInitEntries {
            tar,
            digest: binary_digest(&binary),
        })
    }
}

/// The init's directory (0755) and the binary at [`exec_wrapper::EXEC_INIT_PATH`] (0755), both
/// owned by root, then the end-of-archive marker. The directory entry comes first because
/// minbase has no `/usr/local/libexec`; where a root has it, the entry only restates it.
fn exec_init_tar(binary: &[u8]) -> std::io::Result<Vec<u8>> {
    let path = exec_wrapper::EXEC_INIT_PATH.trim_start_matches('/');
    let (dir, _) = path
        .rsplit_once('/')
        .ok_or_else(|| std::io::Error::other("the init's guest path has no directory"))?;
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar_header(tar::EntryType::Directory, 0o755, 0);
    builder.append_data(&mut header, dir, std::io::empty())?;
    let mut header = tar_header(tar::EntryType::Regular, 0o755, 0);
    header.set_size(binary.len() as u64);
    builder.append_data(&mut header, path, binary)?;
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    #[test]
    fn the_init_is_at_its_guest_path_root_owned_and_executable() {
        let bytes = exec_init_tar(b"\x7fELF-not-really").unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let header = entry.header().clone();
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            seen.push((
                entry.path().unwrap().display().to_string(),
                header.entry_type(),
                header.mode().unwrap(),
                header.uid().unwrap(),
                header.gid().unwrap(),
                body,
            ));
        }
        assert_eq!(
            seen,
            vec![
                (
                    "usr/local/libexec".to_owned(),
                    tar::EntryType::Directory,
                    0o755,
                    0,
                    0,
                    Vec::new()
                ),
                (
                    "usr/local/libexec/sandbox-exec-init".to_owned(),
                    tar::EntryType::Regular,
                    0o755,
                    0,
                    0,
                    b"\x7fELF-not-really".to_vec()
                ),
            ]
        );
        assert_eq!(
            format!("/{}", seen[1].0),
            exec_wrapper::EXEC_INIT_PATH,
            "the entry is the guest path"
        );
        // The entries end with the end-of-archive marker, which the import relies on.
        assert!(bytes.ends_with(&[0u8; 1024]));
    }

    #[test]
    fn without_a_preflight_binary_the_entries_are_refused_as_the_init() {
        let error = ImageRecipe::new()
            .exec_init_entries(&HostTools::default())
            .unwrap_err();
        assert!(
            matches!(error, DockerError::ExecInitBinary { .. }),
            "{error}"
        );
    }
}
