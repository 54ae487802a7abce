//! The container archive endpoints: the engine-side stat (`HEAD`, the path-stat header:
//! unconfined, no-follow, never answered by the guest) and the upload of a tar built in memory.
//! Guest paths are bounded here before any engine call.

use bollard::query_parameters::{ContainerArchiveInfoOptionsBuilder, UploadToContainerOptionsBuilder};
use sandbox_core::{EntryKind, SandboxError};

use crate::state::BackendState;
use crate::tar_header::TarStat;

/// The longest guest path the backend passes to the engine, in bytes.
///
/// The same bound as the core's confinement (4096 bytes, 255 components); kept here too so the
/// backend never starts engine calls for a path the core would refuse.
pub(crate) const MAX_GUEST_PATH_BYTES: usize = 4096;

/// The most components a guest path may have.
pub(crate) const MAX_GUEST_PATH_COMPONENTS: usize = 255;

/// How many engine stats run at once for one backend: an ancestor walk of a deep path waits for
/// a slot rather than opening one request per component.
pub(crate) const STAT_CONCURRENCY: usize = 8;

// Go's `os.FileMode` type bits, as the path-stat header carries them.
const MODE_DIR: u32 = 1 << 31;
const MODE_SYMLINK: u32 = 1 << 27;
const MODE_TYPE: u32 = MODE_DIR
    | MODE_SYMLINK
    | (1 << 26) // device
    | (1 << 25) // named pipe
    | (1 << 24) // socket
    | (1 << 21) // char device
    | (1 << 19); // irregular

/// Refuses a guest path the backend will not pass on: too long, too deep, or holding a NUL.
pub(crate) fn check_guest_path(path: &str) -> Result<(), SandboxError> {
    if path.contains('\0') {
        return Err(SandboxError::invalid(
            "a guest path contains a NUL byte, which no guest path can hold",
        ));
    }
    if path.len() > MAX_GUEST_PATH_BYTES {
        return Err(SandboxError::invalid(format!(
            "a guest path of {} bytes is longer than {MAX_GUEST_PATH_BYTES}",
            path.len()
        )));
    }
    let components = path.split('/').filter(|c| !c.is_empty()).count();
    if components > MAX_GUEST_PATH_COMPONENTS {
        return Err(SandboxError::invalid(format!(
            "a guest path of {components} components is deeper than {MAX_GUEST_PATH_COMPONENTS}"
        )));
    }
    Ok(())
}

/// The entry kind and size a path-stat header's mode and size say.
pub(crate) fn stat_from_mode(mode: u32, size: i64) -> TarStat {
    let kind = match mode & MODE_TYPE {
        0 => EntryKind::File,
        MODE_DIR => EntryKind::Directory,
        MODE_SYMLINK => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    TarStat {
        kind,
        size: (kind == EntryKind::File).then(|| u64::try_from(size).unwrap_or(0)),
    }
}

impl BackendState {
    /// The engine-side stat; `None` when the path does not exist.
    pub(crate) async fn engine_stat(
        &self,
        id: &str,
        path: &str,
    ) -> Result<Option<TarStat>, SandboxError> {
        check_guest_path(path)?;
        let _slot = self
            .stat_slots
            .acquire()
            .await
            .map_err(|_| SandboxError::engine("the stat slots were closed"))?;
        let options = ContainerArchiveInfoOptionsBuilder::new().path(path).build();
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().get_container_archive_info(id, Some(options)),
            )
            .await;
        match answer {
            Ok(stat) => Ok(Some(stat_from_mode(stat.file_mode, stat.size))),
            Err(failure) if failure.is_not_found() => {
                // The engine answers 404 for a missing container and a missing path alike; its
                // message tells them apart, and an inspect settles a message that does not.
                if failure.message().to_lowercase().contains("no such container")
                    || self.inspect(id).await?.is_none()
                {
                    Err(SandboxError::SandboxGone {
                        instance: id.to_owned(),
                    })
                } else {
                    Ok(None)
                }
            }
            Err(failure) => Err(self
                .engine
                .failure(&format!("archive stat of {path:?}"), failure)),
        }
    }

    /// The engine-side stat's kind only, as the guest-path walks want it.
    pub(crate) async fn stat_kind(
        &self,
        id: &str,
        path: String,
    ) -> Result<Option<EntryKind>, SandboxError> {
        Ok(self.engine_stat(id, &path).await?.map(|s| s.kind))
    }

    /// Extracts one in-memory tar at `/` of the container, as one `PUT`.
    pub(crate) async fn put_archive(&self, id: &str, archive: Vec<u8>) -> Result<(), SandboxError> {
        let options = UploadToContainerOptionsBuilder::new().path("/").build();
        let body = bollard::body_full(archive.into());
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().upload_to_container(id, Some(options), body),
            )
            .await;
        match answer {
            Ok(()) => Ok(()),
            Err(failure) if failure.is_not_found() => Err(SandboxError::SandboxGone {
                instance: id.to_owned(),
            }),
            Err(failure) => Err(self.engine.failure("archive upload", failure)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn modes_map_to_kinds() {
        assert_eq!(stat_from_mode(0o644, 12).kind, EntryKind::File);
        assert_eq!(stat_from_mode(0o644, 12).size, Some(12));
        assert_eq!(stat_from_mode(MODE_DIR | 0o755, 4096).kind, EntryKind::Directory);
        assert_eq!(stat_from_mode(MODE_DIR | 0o755, 4096).size, None);
        assert_eq!(stat_from_mode(MODE_SYMLINK | 0o777, 9).kind, EntryKind::Symlink);
        assert_eq!(stat_from_mode(MODE_SYMLINK | 0o777, 9).size, None);
        for other in [1 << 25, 1 << 24, (1 << 26) | (1 << 21), 1 << 26, 1 << 19] {
            assert_eq!(stat_from_mode(other | 0o600, 0).kind, EntryKind::Other);
        }
        // A directory bit with another type bit is not a directory.
        assert_eq!(stat_from_mode(MODE_DIR | MODE_SYMLINK, 0).kind, EntryKind::Other);
    }

    #[test]
    fn guest_paths_are_bounded() {
        check_guest_path(&"a/".repeat(255)).unwrap();
        let deep = "d/".repeat(256);
        assert_eq!(check_guest_path(&deep).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let long = format!("/{}", "x".repeat(MAX_GUEST_PATH_BYTES));
        assert_eq!(check_guest_path(&long).unwrap_err().kind(), ErrorKind::InvalidArgument);
        check_guest_path(&"x".repeat(MAX_GUEST_PATH_BYTES)).unwrap();
        assert_eq!(check_guest_path("a\0b").unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
}
