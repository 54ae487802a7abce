//! The workspace's static binaries that images carry: where the recipe finds each, how it reads
//! and checks it, and the label that records which build an image was made around (so an image
//! around another build is rebuilt rather than tested stale).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::busybox::elf_static_check;
use crate::error::DockerError;

/// The largest binary accepted (the release builds are a few MiB).
const MAX_BINARY: u64 = 256 * 1024 * 1024;

/// A static binary of this workspace that an image is built around.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GuestBinary {
    /// `egress-proxy`, the proxy image's entrypoint.
    EgressProxy,
    /// `sandbox-exec-init`, at [`exec_wrapper::wrapper::EXEC_INIT_PATH`] in the Debian images that carry it.
    ExecInit,
    /// `host-tool`, at [`sandbox_core::host_tool_run::HOST_TOOL_PROGRAM`] in the Debian images
    /// that carry the exec init.
    HostTool,
}

impl GuestBinary {
    /// Its file name, as cargo builds it and as the recipe looks for it beside this process's
    /// executable.
    pub(super) fn file_name(self) -> &'static str {
        match self {
            GuestBinary::EgressProxy => "egress-proxy",
            GuestBinary::ExecInit => "sandbox-exec-init",
            GuestBinary::HostTool => "host-tool",
        }
    }

    /// The image label holding the sha256 of the binary the image was built around.
    pub(super) fn digest_label(self) -> &'static str {
        match self {
            GuestBinary::EgressProxy => sandbox_core::naming::docker::LABEL_EGRESS_PROXY_SHA256,
            GuestBinary::ExecInit => sandbox_core::naming::docker::LABEL_EXEC_INIT_SHA256,
            GuestBinary::HostTool => sandbox_core::naming::docker::LABEL_HOST_TOOL_SHA256,
        }
    }

    /// The typed refusal of a binary of this kind.
    #[cold]
    pub(super) fn refused(self, reason: String) -> DockerError {
        match self {
            GuestBinary::EgressProxy => DockerError::EgressProxyBinary { reason },
            GuestBinary::ExecInit => DockerError::ExecInitBinary { reason },
            GuestBinary::HostTool => DockerError::HostToolBinary { reason },
        }
    }

    /// The binary to build around: the configured one, else the one of [`Self::file_name`]
    /// beside this process's executable; either must be a static 64-bit ELF executable (it
    /// runs in images that may have no C library, or must not load one per call).
    pub(super) fn find(self, configured: Option<&Path>) -> Result<PathBuf, DockerError> {
        let path = match configured {
            Some(path) => path.to_owned(),
            None => std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|dir| dir.join(self.file_name())))
                .ok_or_else(|| {
                    self.refused("this process's executable has no directory".to_owned())
                })?,
        };
        let mut head = Vec::new();
        std::fs::File::open(&path)
            .and_then(|file| file.take(64 * 1024).read_to_end(&mut head))
            .map_err(|error| self.refused(format!("{}: {error}", path.display())))?;
        elf_static_check(&head)
            .map_err(|reason| self.refused(format!("{}: {reason}", path.display())))?;
        Ok(path)
    }

    /// Reads the binary, refusing one over [`MAX_BINARY`].
    pub(super) fn read(self, path: &Path) -> Result<Vec<u8>, DockerError> {
        let mut binary = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_BINARY + 1).read_to_end(&mut binary))
            .map_err(|source| DockerError::Io {
                action: "reading",
                path: path.to_owned(),
                source,
            })?;
        if binary.len() as u64 > MAX_BINARY {
            return Err(self.refused(format!("{} is larger than 256 MiB", path.display())));
        }
        Ok(binary)
    }
}

/// The lower-case hex sha256 of the binary.
pub(super) fn binary_digest(binary: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(binary)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
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
    fn a_dynamic_or_missing_binary_is_refused_by_name_with_its_kind() {
        let error = GuestBinary::EgressProxy
            .find(Some(Path::new("/nonexistent/egress-proxy")))
            .unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/egress-proxy"),
            "{error}"
        );
        // This test binary is dynamically linked.
        let me = std::env::current_exe().unwrap();
        let error = GuestBinary::EgressProxy.find(Some(&me)).unwrap_err();
        assert!(error.to_string().contains("dynamically linked"), "{error}");
        let error = GuestBinary::ExecInit.find(Some(&me)).unwrap_err();
        assert!(
            matches!(&error, DockerError::ExecInitBinary { reason } if reason.contains("dynamically linked")),
            "{error}"
        );
        assert!(error.to_string().contains("sandbox-exec-init"), "{error}");
    }

    #[test]
    fn the_init_is_looked_for_under_the_name_of_its_guest_path() {
        let guest_name = exec_wrapper::wrapper::EXEC_INIT_PATH.rsplit('/').next();
        assert_eq!(guest_name, Some(GuestBinary::ExecInit.file_name()));
        let host_tool_name = sandbox_core::host_tool_run::HOST_TOOL_PROGRAM
            .rsplit('/')
            .next();
        assert_eq!(host_tool_name, Some(GuestBinary::HostTool.file_name()));
        let labels: std::collections::BTreeSet<&str> = [
            GuestBinary::ExecInit,
            GuestBinary::EgressProxy,
            GuestBinary::HostTool,
        ]
        .into_iter()
        .map(GuestBinary::digest_label)
        .collect();
        assert_eq!(labels.len(), 3, "one label per binary");
    }
}
