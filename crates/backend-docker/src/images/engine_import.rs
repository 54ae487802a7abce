//! The engine import: a finished root file system streamed to the engine and tagged.

use std::path::Path;

use tokio::io::AsyncReadExt as _;

use super::{unreachable_engine, ImageRecipe, LocalImage};
use crate::error::DockerError;

impl ImageRecipe {
    /// The engine's image import of a root-file-system tar (what `docker import` does), the
    /// archive streamed from disk. Non-empty `appended` (tar entries with their end-of-archive
    /// marker) follows the archive's last entry in place of the archive's own end, so a file is
    /// added to a cached root without rewriting the archive.
    pub(super) async fn import(
        &self,
        image: LocalImage,
        archive: &Path,
        appended: &[u8],
        labels: &[(&str, String)],
    ) -> Result<(), DockerError> {
        let mut changes = image.import_changes();
        changes.extend(
            labels
                .iter()
                .map(|(key, value)| format!("LABEL {key}={value}")),
        );
        self.say(&format!(
            "  image import as {image} ({})",
            changes.join("; ")
        ));
        let engine = self.engine().await?;
        let length = if appended.is_empty() {
            u64::MAX
        } else {
            entries_end(archive)?
        };
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(|source| DockerError::Io {
                action: "opening",
                path: archive.to_owned(),
                source,
            })?;
        let body = file
            .take(length)
            .chain(std::io::Cursor::new(appended.to_vec()));
        let chunks = futures_util::stream::unfold(body, |mut body| async move {
            let mut buffer = vec![0u8; 1 << 20];
            match body.read(&mut buffer).await {
                Ok(0) => None,
                Ok(n) => {
                    buffer.truncate(n);
                    Some((Ok(bytes::Bytes::from(buffer)), body))
                }
                Err(error) => Some((Err(error), body)),
            }
        });
        let (repo, tag) = image
            .tag()
            .rsplit_once(':')
            .unwrap_or((image.tag(), "latest"));
        let mut options = bollard::query_parameters::CreateImageOptionsBuilder::new()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .build();
        options.changes = changes;
        let import = async {
            let body = bollard::body_try_stream(chunks);
            let mut progress = engine.api().create_image(Some(options), Some(body), None);
            while let Some(step) = futures_util::StreamExt::next(&mut progress).await {
                let step = step?;
                if let Some(error) = step.error_detail.and_then(|d| d.message) {
                    return Err(bollard::errors::Error::DockerStreamError { error });
                }
            }
            Ok(())
        };
        engine
            .call(self.import_timeout, import)
            .await
            .map_err(|failure| match failure {
                crate::connection::ApiFailure::Deadline(timeout) => DockerError::CommandTimedOut {
                    command: format!("image import of {}", image.tag()),
                    timeout,
                },
                other => unreachable_engine("image import", engine.failure("image import", other)),
            })
    }
}

/// Where the entries of the tar archive at `path` end: the offset of its end-of-archive marker,
/// where more entries may follow (a reader stops at the marker). The archive's data is seeked
/// over, not read. GNU sparse entries are refused: their extension blocks are not counted here
/// (GNU tar writes none without `--sparse`, and the recipe never passes it).
pub(super) fn entries_end(path: &Path) -> Result<u64, DockerError> {
    let io_error = |source| DockerError::Io {
        action: "finding the end of the tar entries of",
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let mut archive = tar::Archive::new(file);
    let mut end = 0;
    for entry in archive.entries_with_seek().map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        if entry.header().entry_type().is_gnu_sparse() {
            return Err(io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a GNU sparse entry",
            )));
        }
        // The data is padded to whole 512-byte blocks.
        end = entry.raw_file_position() + entry.size().div_ceil(512) * 512;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// A GNU tar of `files` (path, body), with the end marker and padding GNU tar writes.
    fn archive_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, body) in files {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            header.set_size(body.len() as u64);
            builder.append_data(&mut header, path, *body).unwrap();
        }
        let mut bytes = builder.into_inner().unwrap();
        bytes.resize(bytes.len().div_ceil(10240) * 10240, 0);
        bytes
    }

    #[test]
    fn appended_entries_follow_the_last_entry_and_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root.tar");
        // A body that ends in a whole block of zeros must not be taken for the end.
        let mut zeros_at_end = b"data".to_vec();
        zeros_at_end.resize(2000, 0);
        // Over 100 bytes: written through a GNU long-name entry.
        let long_name = format!("./{}/file", "d".repeat(150));
        let files: [(&str, &[u8]); 3] = [
            ("./a", b"first"),
            (&long_name, &zeros_at_end),
            ("./empty", b""),
        ];
        std::fs::write(&path, archive_of(&files)).unwrap();
        let end = entries_end(&path).unwrap();
        assert_eq!(end % 512, 0);

        let mut appended = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(3);
        appended
            .append_data(&mut header, "added", &b"new"[..])
            .unwrap();
        let appended = appended.into_inner().unwrap();

        let mut joined = std::fs::read(&path).unwrap();
        joined.truncate(usize::try_from(end).unwrap());
        joined.extend_from_slice(&appended);
        let mut names = Vec::new();
        for entry in tar::Archive::new(&joined[..]).entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            names.push((entry.path().unwrap().display().to_string(), body.len()));
        }
        assert_eq!(
            names,
            vec![
                ("a".to_owned(), 5),
                (long_name.clone(), 2000),
                ("empty".to_owned(), 0),
                ("added".to_owned(), 3),
            ]
        );
    }

    #[test]
    fn an_empty_or_unreadable_archive_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.tar");
        std::fs::write(&empty, archive_of(&[])).unwrap();
        assert_eq!(entries_end(&empty).unwrap(), 0);
        let missing = dir.path().join("missing.tar");
        let error = entries_end(&missing).unwrap_err();
        assert!(error.to_string().contains("missing.tar"), "{error}");
    }
}
