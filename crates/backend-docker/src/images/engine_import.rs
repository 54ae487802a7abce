//! The engine import: a finished root file system streamed to the engine and tagged.

use std::path::Path;

use tokio::io::AsyncReadExt as _;

use super::{unreachable_engine, ImageRecipe, LocalImage};
use crate::error::DockerError;

impl ImageRecipe {
    /// The engine's image import of a root-file-system tar (what `docker import` does), the
    /// archive streamed from disk.
    pub(super) async fn import(
        &self,
        image: LocalImage,
        archive: &Path,
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
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(|source| DockerError::Io {
                action: "opening",
                path: archive.to_owned(),
                source,
            })?;
        let chunks = futures_util::stream::unfold(file, |mut file| async move {
            let mut buffer = vec![0u8; 1 << 20];
            match file.read(&mut buffer).await {
                Ok(0) => None,
                Ok(n) => {
                    buffer.truncate(n);
                    Some((Ok(bytes::Bytes::from(buffer)), file))
                }
                Err(error) => Some((Err(error), file)),
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
