//! The per-sandbox limits (CPUs in nano-CPUs, memory in bytes), clamped to the engine host's
//! size: asked of the engine the first time a sandbox is acquired, never by a `find`.

use std::sync::Arc;

use crate::config::{DockerConfig, Resources};
use crate::connection::EngineConnection;

/// The engine host's size, read once, applied to the configured limits.
#[derive(Debug)]
pub(crate) struct Sizing {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    resources: tokio::sync::OnceCell<Resources>,
}

impl Sizing {
    pub(crate) fn new(engine: EngineConnection, config: Arc<DockerConfig>) -> Self {
        Sizing {
            engine,
            config,
            resources: tokio::sync::OnceCell::new(),
        }
    }

    /// The per-sandbox limits, clamped to the engine host's size (one `info` call, the first
    /// time; an unreadable answer leaves the configured limits).
    pub(crate) async fn resources(&self) -> Resources {
        *self
            .resources
            .get_or_init(|| async {
                let facts = self.engine.facts(self.config.command_timeout).await.ok();
                Resources::clamped(
                    &self.config,
                    facts.as_ref().map_or(0, |f| f.cpus),
                    facts.as_ref().map_or(0, |f| f.memory),
                )
            })
            .await
    }
}
