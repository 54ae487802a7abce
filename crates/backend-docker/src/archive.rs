//! The container archive endpoints: the engine-side stat (`HEAD`, the path-stat header:
//! unconfined, no-follow, never answered by the guest) and the upload of a tar built in memory.
//! Guest paths are bounded here before any engine call (the core's `guest_path::check_bounds`).

use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt as _;
use sandbox_core::guest_path::check_bounds;
use sandbox_core::{EntryKind, SandboxError};

use crate::state::BackendState;
use crate::tar_header::{first_entry_at, FirstEntry, TarStat, MAX_PREFIX};

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
        check_bounds(path)?;
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
                self.engine
                    .api()
                    .get_container_archive_info(id, Some(options)),
            )
            .await;
        match answer {
            Ok(stat) => Ok(Some(stat_from_mode(stat.file_mode, stat.size))),
            Err(failure) if failure.is_not_found() => {
                // The engine answers 404 for a missing container and a missing path alike; its
                // message tells them apart, and an inspect settles a message that does not.
                if failure
                    .message()
                    .to_lowercase()
                    .contains("no such container")
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

    /// Reads one regular file through the archive `GET`, streamed through the strict tar parser:
    /// the first entry must be a regular file of at most `cap` bytes (judged from its header,
    /// before any of its data is kept), and the host never holds more than the header prefix and
    /// `cap` bytes. Dropping the future closes the stream.
    pub(crate) async fn read_archive_file(
        &self,
        id: &str,
        path: &str,
        cap: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        check_bounds(path)?;
        let options = DownloadFromContainerOptionsBuilder::new()
            .path(path)
            .build();
        let read = async {
            let mut stream = self.engine.api().download_from_container(id, Some(options));
            let mut prefix: Vec<u8> = Vec::new();
            let (stat, offset) = loop {
                match first_entry_at(&prefix).map_err(malformed)? {
                    (FirstEntry::Found(stat), offset) => break (stat, offset),
                    (FirstEntry::NeedMore, _) if prefix.len() > MAX_PREFIX => {
                        return Err(malformed(format!("no entry within {MAX_PREFIX} bytes")))
                    }
                    (FirstEntry::NeedMore, _) => {}
                }
                match stream.next().await {
                    Some(chunk) => prefix.extend_from_slice(&chunk?),
                    None => return Err(malformed("the archive ended before its first entry")),
                }
            };
            let size = match stat {
                TarStat {
                    kind: EntryKind::File,
                    size: Some(size),
                } => size,
                TarStat {
                    kind: EntryKind::Directory,
                    ..
                } => return Ok(ArchiveRead::Directory),
                _ => return Ok(ArchiveRead::NotRegular),
            };
            if size > cap {
                return Ok(ArchiveRead::OverCap);
            }
            let wanted = usize::try_from(size).map_err(|_| malformed("an entry too large"))?;
            let mut data = prefix.split_off(offset.min(prefix.len()));
            drop(prefix);
            data.truncate(wanted);
            while data.len() < wanted {
                match stream.next().await {
                    Some(chunk) => {
                        let chunk = chunk?;
                        let take = (wanted - data.len()).min(chunk.len());
                        data.extend_from_slice(&chunk[..take]);
                    }
                    None => return Err(malformed("the archive ended inside the file's data")),
                }
            }
            Ok(ArchiveRead::File(data))
        };
        let answer = self.engine.call(self.config.command_timeout, read).await;
        match answer {
            Ok(ArchiveRead::File(data)) => Ok(data),
            Ok(ArchiveRead::Directory) => Err(SandboxError::IsADirectory {
                path: path.to_owned(),
            }),
            Ok(ArchiveRead::NotRegular) => Err(SandboxError::NotRegularFile {
                path: path.to_owned(),
            }),
            Ok(ArchiveRead::OverCap) => Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit: cap,
            }),
            Err(failure) if failure.is_not_found() => {
                if failure
                    .message()
                    .to_lowercase()
                    .contains("no such container")
                {
                    Err(SandboxError::SandboxGone {
                        instance: id.to_owned(),
                    })
                } else {
                    Err(SandboxError::NotFound {
                        path: path.to_owned(),
                    })
                }
            }
            Err(failure) => Err(self
                .engine
                .failure(&format!("archive read of {path:?}"), failure)),
        }
    }

    /// Extracts one in-memory tar into directory `at` of the container, as one `PUT`. The engine
    /// refuses to replace a directory with a non-directory or the reverse.
    pub(crate) async fn put_archive(
        &self,
        id: &str,
        at: &str,
        archive: Vec<u8>,
    ) -> Result<(), SandboxError> {
        let options = UploadToContainerOptionsBuilder::new()
            .path(at)
            .no_overwrite_dir_non_dir("true")
            .build();
        let body = bollard::body_full(archive.into());
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine
                    .api()
                    .upload_to_container(id, Some(options), body),
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

/// The tar one write uploads: `missing` directories (relative to the upload point, outermost
/// first) and then the file, all owned by `uid:gid`, directories 0755, the file 0644. GNU long
/// names carry paths longer than a ustar header holds.
pub(crate) fn write_archive(
    missing: &[String],
    file: &str,
    content: &[u8],
    uid: u64,
    gid: u64,
) -> Result<Vec<u8>, SandboxError> {
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_size(size);
        header.set_mtime(mtime);
        header
    };
    let mut builder = tar::Builder::new(Vec::with_capacity(content.len() + 4096));
    let refuse =
        |e: std::io::Error| SandboxError::invalid(format!("a guest path cannot be archived: {e}"));
    for directory in missing {
        let mut entry = header(tar::EntryType::Directory, 0o755, 0);
        builder
            .append_data(&mut entry, directory, std::io::empty())
            .map_err(refuse)?;
    }
    let mut entry = header(tar::EntryType::Regular, 0o644, content.len() as u64);
    builder
        .append_data(&mut entry, file, content)
        .map_err(refuse)?;
    builder.into_inner().map_err(refuse)
}

/// What an archive read found.
enum ArchiveRead {
    File(Vec<u8>),
    Directory,
    NotRegular,
    OverCap,
}

#[cold]
fn malformed(why: impl std::fmt::Display) -> bollard::errors::Error {
    bollard::errors::Error::DockerStreamError {
        error: format!("the archive stream was refused: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_map_to_kinds() {
        assert_eq!(stat_from_mode(0o644, 12).kind, EntryKind::File);
        assert_eq!(stat_from_mode(0o644, 12).size, Some(12));
        assert_eq!(
            stat_from_mode(MODE_DIR | 0o755, 4096).kind,
            EntryKind::Directory
        );
        assert_eq!(stat_from_mode(MODE_DIR | 0o755, 4096).size, None);
        assert_eq!(
            stat_from_mode(MODE_SYMLINK | 0o777, 9).kind,
            EntryKind::Symlink
        );
        assert_eq!(stat_from_mode(MODE_SYMLINK | 0o777, 9).size, None);
        for other in [1 << 25, 1 << 24, (1 << 26) | (1 << 21), 1 << 26, 1 << 19] {
            assert_eq!(stat_from_mode(other | 0o600, 0).kind, EntryKind::Other);
        }
        // A directory bit with another type bit is not a directory.
        assert_eq!(
            stat_from_mode(MODE_DIR | MODE_SYMLINK, 0).kind,
            EntryKind::Other
        );
    }

    #[test]
    fn write_archives_carry_owners_modes_and_long_names() {
        let long = format!("{}/f", "d".repeat(300));
        let bytes = write_archive(
            &["a".to_owned(), "a/b".to_owned()],
            &long,
            b"xyz",
            1000,
            1001,
        )
        .unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        let entries: Vec<(String, tar::EntryType, u32, u64, u64, Vec<u8>)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                let h = e.header();
                (
                    e.path()
                        .unwrap()
                        .to_string_lossy()
                        .trim_end_matches('/')
                        .to_owned(),
                    h.entry_type(),
                    h.mode().unwrap(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    data,
                )
            })
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].0, "a");
        assert_eq!(entries[0].1, tar::EntryType::Directory);
        assert_eq!(
            (entries[0].2, entries[0].3, entries[0].4),
            (0o755, 1000, 1001)
        );
        assert_eq!(entries[2].0, long);
        assert_eq!(entries[2].2, 0o644);
        assert_eq!(entries[2].5, b"xyz");
    }
}
