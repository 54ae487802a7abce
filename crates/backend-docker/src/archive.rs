//! The container archive endpoints: the engine-side stat (`HEAD`, the path-stat header:
//! unconfined, no-follow, never answered by the guest) and the upload of a tar, a write's streamed
//! from its header, the caller's bytes and its end.
//! Guest paths are bounded here before any engine call (the core's `guest_path::check_bounds`).

use bollard::query_parameters::{
    ContainerArchiveInfoOptionsBuilder, DownloadFromContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bytes::Bytes;
use futures_util::StreamExt as _;
use sandbox_core::guest_path::check_bounds;
use sandbox_core::{EntryKind, SandboxError};

use crate::connection::ApiFailure;
use std::sync::Arc;

use crate::config::DockerConfig;
use crate::connection::EngineConnection;
use crate::containers::Containers;
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

/// How many engine stats run at once for one backend: an ancestor walk of a deep path waits for
/// a slot rather than opening one request per component.
pub(crate) const STAT_CONCURRENCY: usize = 8;

/// The archive endpoints of the backend's containers, with the bound on stats in flight.
#[derive(Debug)]
pub(crate) struct Archive {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    /// Tells a missing container from a missing path.
    containers: Arc<Containers>,
    /// Bounds the engine stats in flight (at most [`STAT_CONCURRENCY`]).
    stat_slots: tokio::sync::Semaphore,
}

impl Archive {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        containers: Arc<Containers>,
    ) -> Self {
        Archive {
            engine,
            config,
            containers,
            stat_slots: tokio::sync::Semaphore::new(STAT_CONCURRENCY),
        }
    }

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
                    || self.containers.inspect(id).await?.is_none()
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
    /// `cap` bytes. With `head`, a larger file is not refused: its first `cap` bytes are kept
    /// and the stream is closed there, so no more of it crosses the engine connection than the
    /// chunk in flight. Dropping the future closes the stream.
    pub(crate) async fn read_archive_file(
        &self,
        id: &str,
        path: &str,
        cap: u64,
        head: bool,
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
            if size > cap && !head {
                return Ok(ArchiveRead::OverCap);
            }
            let wanted =
                usize::try_from(size.min(cap)).map_err(|_| malformed("an entry too large"))?;
            // One allocation of the header's size (at most `cap`): growing by doubling would
            // copy and fault the data in again at every step.
            let mut data = Vec::with_capacity(wanted);
            let first = prefix.get(offset..).unwrap_or_default();
            data.extend_from_slice(&first[..first.len().min(wanted)]);
            drop(prefix);
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
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().upload_to_container(
                    id,
                    Some(upload_options(at)),
                    bollard::body_full(archive.into()),
                ),
            )
            .await;
        self.upload_answer(id, answer)
    }

    /// Uploads one write's tar into directory `at` as one `PUT` whose body is streamed: the
    /// archive's head, `content` in slices of [`BODY_CHUNK`] bytes, then its tail. The request
    /// body must be `'static` and `content` is borrowed, so each slice is copied as the body is
    /// pulled (at most [`BODY_CHUNKS_AHEAD`] ahead of the socket), never the whole payload into a
    /// second buffer; a payload of one slice or less goes as one buffer.
    pub(crate) async fn put_write_archive(
        &self,
        id: &str,
        at: &str,
        archive: WriteArchive,
        content: &[u8],
    ) -> Result<(), SandboxError> {
        let put = |body| {
            self.engine.call(
                self.config.command_timeout,
                self.engine
                    .api()
                    .upload_to_container(id, Some(upload_options(at)), body),
            )
        };
        if content.len() <= BODY_CHUNK {
            let mut whole =
                Vec::with_capacity(archive.head.len() + content.len() + archive.tail.len());
            whole.extend_from_slice(&archive.head);
            whole.extend_from_slice(content);
            whole.extend_from_slice(&archive.tail);
            let answer = put(bollard::body_full(whole.into())).await;
            return self.upload_answer(id, answer);
        }
        let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(BODY_CHUNKS_AHEAD);
        let body = bollard::body_try_stream(archive.body(receiver, content.len() as u64));
        let feed = async move {
            for slice in content.chunks(BODY_CHUNK) {
                if sender.send(Bytes::copy_from_slice(slice)).await.is_err() {
                    // The request is over (answered or failed): nothing more is read.
                    return;
                }
            }
        };
        let upload = std::pin::pin!(put(body));
        let feed = std::pin::pin!(feed);
        // The feeder lives only as long as the upload: an upload that ends first (an early
        // answer, the deadline) drops it, and a feeder that ends first has queued every slice.
        let answer = match futures_util::future::select(upload, feed).await {
            futures_util::future::Either::Left((answer, _)) => answer,
            futures_util::future::Either::Right(((), upload)) => upload.await,
        };
        self.upload_answer(id, answer)
    }

    fn upload_answer(&self, id: &str, answer: Result<(), ApiFailure>) -> Result<(), SandboxError> {
        match answer {
            Ok(()) => Ok(()),
            Err(failure) if failure.is_not_found() => Err(SandboxError::SandboxGone {
                instance: id.to_owned(),
            }),
            Err(failure) => Err(self.engine.failure("archive upload", failure)),
        }
    }
}

/// The bytes of the payload copied per slice of a streamed upload.
pub(crate) const BODY_CHUNK: usize = 256 * 1024;

/// How many copied slices may wait for the socket: the host holds at most this many slices (plus
/// what the HTTP client buffers) of a write's copy at once.
const BODY_CHUNKS_AHEAD: usize = 4;

/// The upload options of every archive `PUT`: extract at `at`, never replacing a directory with a
/// non-directory or the reverse.
fn upload_options(at: &str) -> bollard::query_parameters::UploadToContainerOptions {
    UploadToContainerOptionsBuilder::new()
        .path(at)
        .no_overwrite_dir_non_dir("true")
        .build()
}

/// The tar of one write without the file's bytes: `head` is the missing directories' entries and
/// the file's header (GNU long names included), `tail` the padding of the file's data to a whole
/// block and the two end-of-archive blocks. `head`, the file's bytes and `tail` in that order are
/// the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteArchive {
    pub(crate) head: Bytes,
    pub(crate) tail: Bytes,
}

impl WriteArchive {
    /// The request body: `head`, the `size` bytes of slices `receiver` yields, then `tail`. A
    /// receiver that closes before `size` bytes came (its feeder dropped) or yields more is an
    /// error of the body, so the engine never sees a well-formed request holding a cut file.
    fn body(
        self,
        receiver: tokio::sync::mpsc::Receiver<Bytes>,
        size: u64,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        struct Body {
            head: Option<Bytes>,
            receiver: tokio::sync::mpsc::Receiver<Bytes>,
            left: u64,
            tail: Option<Bytes>,
        }
        let body = Body {
            head: Some(self.head),
            receiver,
            left: size,
            tail: Some(self.tail),
        };
        futures_util::stream::unfold(body, |mut body| async move {
            if let Some(head) = body.head.take() {
                return Some((Ok(head), body));
            }
            if body.left > 0 {
                let item = match body.receiver.recv().await {
                    Some(slice) if slice.len() as u64 <= body.left => {
                        body.left -= slice.len() as u64;
                        Ok(slice)
                    }
                    Some(_) => Err(cut("more bytes than the header says")),
                    None => Err(cut("the payload ended early")),
                };
                if item.is_err() {
                    // Nothing follows an error: the request fails instead of ending.
                    body.left = 0;
                    body.tail = None;
                }
                return Some((item, body));
            }
            body.tail.take().map(|tail| (Ok(tail), body))
        })
    }
}

#[cold]
fn cut(why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("the upload's body was cut: {why}"),
    )
}

/// The tar one write uploads, less the file's bytes: `missing` directories (relative to the
/// upload point, outermost first) and then the file of `size` bytes, all owned by `uid:gid`,
/// directories 0755, the file 0644. GNU long names carry paths longer than a ustar header holds.
pub(crate) fn write_archive(
    missing: &[String],
    file: &str,
    size: u64,
    uid: u64,
    gid: u64,
) -> Result<WriteArchive, SandboxError> {
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    write_archive_at(missing, file, size, uid, gid, mtime)
}

fn write_archive_at(
    missing: &[String],
    file: &str,
    size: u64,
    uid: u64,
    gid: u64,
    mtime: u64,
) -> Result<WriteArchive, SandboxError> {
    const BLOCK: u64 = 512;
    const END: usize = 2 * BLOCK as usize;
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
    let mut builder = tar::Builder::new(Vec::new());
    let refuse =
        |e: std::io::Error| SandboxError::invalid(format!("a guest path cannot be archived: {e}"));
    for directory in missing {
        let mut entry = header(tar::EntryType::Directory, 0o755, 0);
        builder
            .append_data(&mut entry, directory, std::io::empty())
            .map_err(refuse)?;
    }
    // The file's header says its size; its bytes go between `head` and `tail`, so the builder
    // appends none of them and its own end (two zero blocks) is cut off `head`.
    let mut entry = header(tar::EntryType::Regular, 0o644, size);
    builder
        .append_data(&mut entry, file, std::io::empty())
        .map_err(refuse)?;
    let mut head = builder.into_inner().map_err(refuse)?;
    head.truncate(head.len() - END);
    let padding = ((BLOCK - size % BLOCK) % BLOCK) as usize;
    Ok(WriteArchive {
        head: head.into(),
        tail: vec![0; padding + END].into(),
    })
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

    /// The archive as the in-memory builder made it before uploads were streamed: the reference
    /// every streamed body must equal byte for byte.
    fn built_archive(
        missing: &[String],
        file: &str,
        content: &[u8],
        (uid, gid, mtime): (u64, u64, u64),
    ) -> Vec<u8> {
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
        let mut builder = tar::Builder::new(Vec::new());
        for directory in missing {
            let mut entry = header(tar::EntryType::Directory, 0o755, 0);
            builder
                .append_data(&mut entry, directory, std::io::empty())
                .unwrap();
        }
        let mut entry = header(tar::EntryType::Regular, 0o644, content.len() as u64);
        builder.append_data(&mut entry, file, content).unwrap();
        builder.into_inner().unwrap()
    }

    /// The body a streamed upload sends: `content` fed in `slice`-byte slices through the same
    /// channel the upload uses, collected.
    async fn streamed(archive: WriteArchive, content: &[u8], slice: usize) -> Vec<u8> {
        let (sender, receiver) = tokio::sync::mpsc::channel(BODY_CHUNKS_AHEAD);
        let body = archive.body(receiver, content.len() as u64);
        let feed = async move {
            for part in content.chunks(slice) {
                sender.send(Bytes::copy_from_slice(part)).await.unwrap();
            }
        };
        let collect = body.map(|item| item.unwrap()).collect::<Vec<Bytes>>();
        let ((), parts) = tokio::join!(feed, collect);
        parts.concat()
    }

    #[tokio::test]
    async fn a_streamed_body_equals_the_built_archive() {
        let long_dir = "d".repeat(120);
        let long_file = format!("{long_dir}/{}", "f".repeat(150));
        let cases: Vec<(Vec<String>, String, usize)> = vec![
            (vec![], "f".to_owned(), 0),
            (vec![], "f".to_owned(), 1),
            (vec![], "f".to_owned(), 511),
            (vec![], "f".to_owned(), 512),
            (vec![], "f".to_owned(), 513),
            (
                vec!["a".to_owned(), "a/b".to_owned()],
                "a/b/f".to_owned(),
                1024,
            ),
            // Names past the ustar header: GNU long-name entries for a directory and the file.
            (
                vec![long_dir.clone()],
                long_file.clone(),
                3 * BODY_CHUNK + 17,
            ),
            (vec![], long_file, BODY_CHUNK),
        ];
        for (missing, file, len) in cases {
            let content: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let ids = (1000, 1001, 1_700_000_000);
            let want = built_archive(&missing, &file, &content, ids);
            let archive =
                write_archive_at(&missing, &file, len as u64, ids.0, ids.1, ids.2).unwrap();
            let joined = [&archive.head[..], &content, &archive.tail[..]].concat();
            assert!(joined == want, "{file:?} of {len} bytes: the pieces");
            for slice in [1000, BODY_CHUNK] {
                let body = streamed(archive.clone(), &content, slice).await;
                assert!(
                    body == want,
                    "{file:?} of {len} bytes in {slice}-byte slices"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_body_whose_feeder_stops_early_or_overruns_fails() {
        let archive = write_archive_at(&[], "f", 10, 1, 1, 0).unwrap();
        // The feeder is gone after 4 of 10 bytes: the body fails instead of ending.
        let (sender, receiver) = tokio::sync::mpsc::channel(BODY_CHUNKS_AHEAD);
        sender.send(Bytes::from_static(b"abcd")).await.unwrap();
        drop(sender);
        let items: Vec<_> = archive.clone().body(receiver, 10).collect().await;
        assert_eq!(items.len(), 3, "head, the slice, the error: {items:?}");
        assert_eq!(items[0].as_ref().unwrap(), &archive.head);
        assert_eq!(items[1].as_ref().unwrap(), &Bytes::from_static(b"abcd"));
        assert_eq!(
            items[2].as_ref().unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof
        );
        // A slice past the header's size fails too.
        let (sender, receiver) = tokio::sync::mpsc::channel(BODY_CHUNKS_AHEAD);
        sender.send(Bytes::from_static(&[0; 11])).await.unwrap();
        let items: Vec<_> = archive.body(receiver, 10).collect().await;
        assert!(items[1].is_err(), "{items:?}");
        assert_eq!(items.len(), 2, "nothing after the error: {items:?}");
    }

    #[test]
    fn write_archives_carry_owners_modes_and_long_names() {
        let long = format!("{}/f", "d".repeat(300));
        let archive =
            write_archive(&["a".to_owned(), "a/b".to_owned()], &long, 3, 1000, 1001).unwrap();
        let bytes = [&archive.head[..], b"xyz", &archive.tail[..]].concat();
        assert_eq!(bytes.len() % 512, 0);
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
