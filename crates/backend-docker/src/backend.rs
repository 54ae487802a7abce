//! [`DockerBackend`]: construction, declarations (docker.md §1) and the trait surface.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use exec_wrapper::ExitKind;
use sandbox_core::{
    BackendDeclarations, Capability, DisposalFailure, DisposeSelector, Egress, Isolation,
    IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError, SandboxKey, SandboxLimits,
    SandboxSpec, SandboxSummary, ScopePurge, TransferLimits,
};

use crate::cli_seam::{CallShape, DockerCli, SMALL_BUDGET};
use crate::config::DockerConfig;
use crate::engine_calls::Shared;
use crate::BACKEND_NAME;

const MIB: u64 = 1024 * 1024;

/// The transfer ceiling of each direction: 64 MiB per file, 256 MiB in all, 256 files.
pub const TRANSFER_CEILING: TransferLimits = TransferLimits {
    max_bytes_per_file: 64 * MIB,
    max_total_bytes: 256 * MIB,
    max_files: 256,
};

/// The container backend: one hardened container per (key, kind), driven through the `docker`
/// CLI pinned to one context.
///
/// Cheap to clone: clones share the pinned CLI, the per-name locks, the warm cache and the set of
/// retired instances.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    shared: Arc<Shared>,
}

impl DockerBackend {
    /// Validates `config`, snapshots the management environment, resolves and pins the context,
    /// and asks the engine's OS (`linux` declares os_families {posix}; anything else, or no
    /// answer, declares none and logs a warning).
    ///
    /// # Errors
    /// InvalidArgument for a bad configuration; BackendUnavailable when the CLI cannot be started
    /// or the context cannot be resolved (not cached: a later `connect` tries again).
    ///
    /// # Cancel safety
    /// Dropping the future kills any docker call in flight; nothing is created by `connect`.
    pub async fn connect(config: DockerConfig) -> Result<DockerBackend, SandboxError> {
        config.validate()?;
        let env = config
            .management_env
            .clone()
            .unwrap_or_else(|| std::env::vars_os().collect());
        let cli = DockerCli::resolve(
            &config.docker_path,
            config.context.as_deref(),
            env,
            config.command_timeout,
        )
        .await?;
        let os = engine_os(&cli, config.command_timeout).await;
        let os_families = match os.as_deref() {
            Some("linux") => BTreeSet::from([OsFamily::Posix]),
            other => {
                tracing::warn!(
                    context = cli.context(),
                    os = ?other,
                    "the engine does not report linux; declaring no OS family"
                );
                BTreeSet::new()
            }
        };
        let declarations = BackendDeclarations {
            capabilities: BTreeSet::from([
                Capability::Exec,
                Capability::FilesIn,
                Capability::FilesOut,
                Capability::FilesList,
                Capability::FilesDelete,
                Capability::Reclaim,
            ]),
            limits: SandboxLimits {
                files_in: TRANSFER_CEILING,
                files_out: TRANSFER_CEILING,
            },
            egress_modes: BTreeSet::from([Egress::Closed]),
            os_families,
            isolation_scopes: BTreeSet::from([IsolationScope::Conversation, IsolationScope::Call]),
            ..BackendDeclarations::default()
        };
        tracing::debug!(
            context = cli.context(),
            endpoint = cli.endpoint(),
            "docker context pinned"
        );
        Ok(DockerBackend {
            shared: Arc::new(Shared::new(config, cli, declarations)),
        })
    }

    /// The pinned context's name.
    pub fn context(&self) -> &str {
        self.shared.cli.context()
    }

    /// The pinned context's docker endpoint.
    pub fn endpoint(&self) -> &str {
        self.shared.cli.endpoint()
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &DockerConfig {
        &self.shared.config
    }

    /// The container name of (key, kind) (core.md rule 57; egress closed).
    pub fn container_name(key: &SandboxKey, kind: &str) -> String {
        sandbox_core::docker_container_name(key, kind, "")
    }
}

/// `docker version --format '{{.Server.Os}}'`; `None` when unreadable.
pub(crate) async fn engine_os(cli: &DockerCli, deadline: Duration) -> Option<String> {
    let output = cli
        .run(
            ["version", "--format", "{{.Server.Os}}"],
            CallShape::management(deadline).budget(SMALL_BUDGET),
        )
        .await
        .ok()?;
    if output.status != ExitKind::Exited(0) {
        return None;
    }
    let os = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (!os.is_empty()).then_some(os)
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    /// Always `container`: a Docker Desktop or Colima VM does not lift the rung, since one VM
    /// kernel serves every container.
    fn isolation(&self) -> Isolation {
        Isolation::Container
    }

    fn declarations(&self) -> &BackendDeclarations {
        &self.shared.declarations
    }

    async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let handle = self.shared.acquire_sandbox(key, spec).await?;
        Ok(handle)
    }

    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        Ok(self
            .shared
            .find_sandbox(key, kind)
            .await?
            .map(|handle| handle as Arc<dyn Sandbox>))
    }

    async fn dispose(
        &self,
        key: &SandboxKey,
        selector: DisposeSelector,
    ) -> Option<DisposalFailure> {
        self.shared.dispose_key(key, &selector).await
    }

    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        self.shared.dispose_conversation(scope, thread_id).await
    }

    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        self.shared.list_sandboxes(scope, thread_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[tokio::test]
    async fn a_missing_cli_is_backend_unavailable_naming_it() {
        let config = DockerConfig {
            docker_path: "/nonexistent/docker-cli".into(),
            ..DockerConfig::default()
        };
        let error = DockerBackend::connect(config).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BackendUnavailable);
        assert!(
            error.to_string().contains("/nonexistent/docker-cli"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_bad_config_is_refused_before_any_call() {
        let config = DockerConfig {
            docker_path: "/nonexistent/docker-cli".into(),
            pids_limit: 0,
            ..DockerConfig::default()
        };
        let error = DockerBackend::connect(config).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn ceilings_are_the_declared_numbers() {
        assert_eq!(TRANSFER_CEILING.max_bytes_per_file, 67_108_864);
        assert_eq!(TRANSFER_CEILING.max_total_bytes, 268_435_456);
        assert_eq!(TRANSFER_CEILING.max_files, 256);
    }
}
