//! The workspace programs the Debian images carry beside their root: the static
//! `sandbox-exec-init` at [`exec_wrapper::wrapper::EXEC_INIT_PATH`] (the base images) and the static
//! `host-tool` at [`HOST_TOOL_PROGRAM`] (the base images and the sbx simulator's), added at
//! import as tar entries after the root archive's own, so the debootstrapped root and its cached
//! archive stay the same whatever the binaries.

use sandbox_core::host_tool_run::HOST_TOOL_PROGRAM;

use super::busybox::tar_header;
use super::guest_binary::{binary_digest, GuestBinary};
use super::{HostTools, ImageRecipe};
use crate::error::DockerError;

/// The carried programs' entries and their digests (each with its image label).
#[derive(Debug)]
pub(super) struct ExecInitEntries {
    /// The tar entries, the end-of-archive marker included.
    pub(super) tar: Vec<u8>,
    /// Each carried binary's [`GuestBinary::digest_label`] and lower-case hex sha256.
    pub(super) digests: Vec<(&'static str, String)>,
}

impl ImageRecipe {
    /// Reads those of `wanted` that preflight found and writes their entries.
    pub(super) fn exec_init_entries(
        &self,
        tools: &HostTools,
        wanted: &[GuestBinary],
    ) -> Result<ExecInitEntries, DockerError> {
        let mut carried = Vec::new();
        for (binary, tool, guest_path) in [
            (
                GuestBinary::ExecInit,
                &tools.exec_init,
                exec_wrapper::wrapper::EXEC_INIT_PATH,
            ),
            (GuestBinary::HostTool, &tools.host_tool, HOST_TOOL_PROGRAM),
        ] {
            let Some(tool) = tool.as_ref().filter(|_| wanted.contains(&binary)) else {
                continue;
            };
            let bytes = binary.read(&tool.program)?;
            self.say(&format!(
                "  {} {} ({} bytes) at {guest_path}",
                binary.file_name(),
                tool.program.display(),
                bytes.len(),
            ));
            carried.push((binary, guest_path, bytes));
        }
        if carried.is_empty() {
            let first = wanted.first().copied().unwrap_or(GuestBinary::ExecInit);
            return Err(first.refused("preflight found none".to_owned()));
        }
        let entries: Vec<(&str, &[u8])> = carried
            .iter()
            .map(|(_, path, bytes)| (*path, &bytes[..]))
            .collect();
        let tar = carried_tar(&entries).map_err(|source| DockerError::Io {
            action: "assembling the carried programs' entries for",
            path: std::path::PathBuf::from("the Debian images"),
            source,
        })?;
        Ok(ExecInitEntries {
            tar,
            digests: carried
                .iter()
                .map(|(binary, _, bytes)| (binary.digest_label(), binary_digest(bytes)))
                .collect(),
        })
    }
}

/// Each binary at its guest path (0755, owned by root), the init after its directory (0755),
/// then the end-of-archive marker. The directory entry comes first because minbase has no
/// `/usr/local/libexec`; where a root has it, the entry only restates it. `/usr/local/bin` is in
/// every Debian root and gets no entry (which would restate its mode).
fn carried_tar(binaries: &[(&str, &[u8])]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    if binaries
        .iter()
        .any(|(path, _)| *path == exec_wrapper::wrapper::EXEC_INIT_PATH)
    {
        let init = exec_wrapper::wrapper::EXEC_INIT_PATH.trim_start_matches('/');
        let (dir, _) = init
            .rsplit_once('/')
            .ok_or_else(|| std::io::Error::other("the init's guest path has no directory"))?;
        let mut header = tar_header(tar::EntryType::Directory, 0o755, 0);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }
    for (path, binary) in binaries {
        let mut header = tar_header(tar::EntryType::Regular, 0o755, 0);
        header.set_size(binary.len() as u64);
        builder.append_data(&mut header, path.trim_start_matches('/'), *binary)?;
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    #[test]
    fn the_init_is_at_its_guest_path_root_owned_and_executable() {
        let bytes = carried_tar(&[
            (exec_wrapper::wrapper::EXEC_INIT_PATH, b"\x7fELF-not-really"),
            (HOST_TOOL_PROGRAM, b"\x7fELF-host-tool"),
        ])
        .unwrap();
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
                (
                    "usr/local/bin/host-tool".to_owned(),
                    tar::EntryType::Regular,
                    0o755,
                    0,
                    0,
                    b"\x7fELF-host-tool".to_vec()
                ),
            ]
        );
        assert_eq!(
            format!("/{}", seen[1].0),
            exec_wrapper::wrapper::EXEC_INIT_PATH,
            "the entry is the guest path"
        );
        // The entries end with the end-of-archive marker, which the import relies on.
        assert!(bytes.ends_with(&[0u8; 1024]));
    }

    #[test]
    fn host_tool_alone_gets_no_init_directory() {
        let bytes = carried_tar(&[(HOST_TOOL_PROGRAM, b"\x7fELF-host-tool")]).unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let paths: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|entry| entry.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(paths, ["usr/local/bin/host-tool"]);
    }

    #[test]
    fn without_a_preflight_binary_the_entries_are_refused_as_the_first_wanted() {
        let recipe = ImageRecipe::new();
        let error = recipe
            .exec_init_entries(
                &HostTools::default(),
                &[GuestBinary::ExecInit, GuestBinary::HostTool],
            )
            .unwrap_err();
        assert!(
            matches!(error, DockerError::ExecInitBinary { .. }),
            "{error}"
        );
        let error = recipe
            .exec_init_entries(&HostTools::default(), &[GuestBinary::HostTool])
            .unwrap_err();
        assert!(
            matches!(error, DockerError::HostToolBinary { .. }),
            "{error}"
        );
    }
}
