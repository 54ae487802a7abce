//! The backend: construction, declarations, the rung a `sbx version` earns, the doctor's
//! checks, and the trait (the shared state and the host checks are in `host`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::naming::sbx::NamePrefix;
use sandbox_core::{
    BackendDeclarations, Capability, DisposalFailure, DisposeSelector, Egress, ErrorKind,
    HealthCheck, Isolation, IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError,
    SandboxKey, SandboxLimits, SandboxSpec, SandboxSummary, ScopePurge,
};
use sbx_cli::SbxCli;

use crate::config::SbxConfig;
use crate::engine::to_sandbox_error;
use crate::host::SbxHost;
use crate::BACKEND_NAME;

/// What `sbx version` prints for the stand-in.
const SIMULATOR_MARK: &str = "sbx-sim";

/// The Docker Sandboxes backend: one `sbx` microVM per (key, kind).
///
/// Cheap to clone: clones share the driver, the per-name locks and the retired set.
#[derive(Debug, Clone)]
pub struct SbxBackend {
    pub(crate) host: Arc<SbxHost>,
}

/// The declarations: every file capability, exact kills, host tools, closed egress, POSIX
/// guests, conversation scope, the default transfer ceilings.
fn declarations() -> BackendDeclarations {
    BackendDeclarations {
        // A streamed exec with stdin is all a run with host tools needs of the backend; the
        // program is the template's (the simulator's image carries it, a run in a template
        // without it is refused as unsupported when it starts).
        capabilities: Capability::exec_and_files()
            .into_iter()
            .chain([Capability::ExactKill, Capability::HostTools])
            .collect(),
        limits: SandboxLimits::default(),
        egress_modes: BTreeSet::from([Egress::Closed]),
        os_families: BTreeSet::from([OsFamily::Posix]),
        isolation_scopes: BTreeSet::from([IsolationScope::Conversation]),
        ..BackendDeclarations::default()
    }
}

/// The rung a `sbx version` answer earns: the stand-in is refused unless allowed, and then is
/// a container, never a microVM. A failed `version` is read as real sbx (the first real call
/// classifies any fault).
pub(crate) fn isolation_for(
    version: Result<&str, &SandboxError>,
    simulator_ok: bool,
) -> Result<Isolation, SandboxError> {
    match version {
        Ok(text) if text.contains(SIMULATOR_MARK) => {
            if simulator_ok {
                Ok(Isolation::Container)
            } else {
                Err(SandboxError::invalid(format!(
                    "the sbx program is the simulator ({text}), which is not isolation; set \
                     simulator_ok to accept it at the container rung"
                )))
            }
        }
        Ok(_) => Ok(Isolation::Microvm),
        Err(error) => {
            tracing::warn!(%error, "sbx version failed; assuming real sbx");
            Ok(Isolation::Microvm)
        }
    }
}

impl SbxBackend {
    /// Checks the configuration, snapshots the management environment and runs `sbx version`
    /// once to tell real sbx from the simulator.
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidArgument`] for a configuration that fails its checks (prefix,
    /// memory, timeouts, a workspace root that is `/`, the home directory or above it, inside a
    /// credential directory or inside sbx's own store), or for the simulator when
    /// `simulator_ok` is false.
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the `sbx version` child; nothing else has happened yet.
    pub async fn connect(config: SbxConfig) -> Result<SbxBackend, SandboxError> {
        let config = config.check()?;
        let cli = SbxCli::builder(config.sbx_path.clone(), |name| {
            name.to_str()
                .is_some_and(|name| !sandbox_core::hygiene::is_secret_name(name))
        })
        .management_env(config.management_env.clone())
        .command_timeout(config.command_timeout)
        .create_timeout(config.create_timeout)
        .no_telemetry(config.no_telemetry)
        .build()
        .map_err(to_sandbox_error)?;
        let version = cli.version().await.map_err(to_sandbox_error);
        let isolation = isolation_for(version.as_deref(), config.simulator_ok)?;
        Ok(SbxBackend {
            host: Arc::new(SbxHost::new(config, cli, isolation, declarations())),
        })
    }

    /// The workspace root in use (absolute).
    pub fn workspace_root(&self) -> &std::path::Path {
        &self.host.config.root
    }

    /// The name of the sandbox of (key, kind), which is also its directory under the root.
    pub fn sandbox_name(&self, key: &SandboxKey, kind: &str) -> String {
        sandbox_core::naming::sbx::sbx_sandbox_name(&self.host.config.prefix, key, kind)
    }

    /// The name prefix every sandbox of this backend starts with.
    pub fn name_prefix(&self) -> &NamePrefix {
        &self.host.config.prefix
    }

    /// The bound on the kill call after an expired exec.
    pub fn exec_cleanup_timeout(&self) -> std::time::Duration {
        self.host.config.exec_cleanup_timeout
    }

    /// The `sbx` program in use.
    pub fn sbx_path(&self) -> &PathBuf {
        &self.host.config.sbx_path
    }

    /// The host checks every acquire runs, alone (for a doctor): SSH agent forwarding off and no
    /// MCP server registered, read and never written; then `sbx ls`, whose failure tells a lapsed
    /// login or a faulted daemon.
    ///
    /// # Errors
    ///
    /// [`SandboxError::HostNotConfined`] naming the fix, [`SandboxError::LoginRequired`],
    /// [`SandboxError::DaemonFault`], or the classified failure of a call.
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the running `sbx` calls; nothing is changed on the host.
    pub async fn check_host(&self) -> Result<(), SandboxError> {
        self.host.check_host().await?;
        self.host.cli.ls().await.map(drop).map_err(to_sandbox_error)
    }
    /// What this host needs for the backend, as [`HealthCheck`]s: `sbx.client` (the program
    /// connects, and whether it is the simulator, by its rung) and `sbx.host` ([`check_host`]: logged
    /// in, daemon answering, agent forwarding off, no MCP server). The host check is not run when
    /// the client fails. Reads only; changes nothing. `simulator_ok` says what a refused simulator's
    /// fix should offer.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills the running `sbx` calls.
    ///
    /// [`check_host`]: Self::check_host
    pub async fn health_checks(config: SbxConfig) -> Vec<HealthCheck> {
        let simulator_ok = config.simulator_ok;
        let backend = match SbxBackend::connect(config).await {
            Ok(backend) => backend,
            Err(e) => {
                let fix = if simulator_ok {
                    "install sbx, or point --sbx-path at it"
                } else {
                    "install sbx, or pass --allow-simulator to accept sbx-sim"
                };
                return vec![HealthCheck::fail("sbx.client", e.to_string(), fix)];
            }
        };
        let mut checks = vec![HealthCheck::pass(
            "sbx.client",
            format!(
                "{} (rung {})",
                backend.sbx_path().display(),
                backend.isolation()
            ),
        )];
        checks.push(match backend.check_host().await {
            Ok(()) => HealthCheck::pass(
                "sbx.host",
                "logged in, daemon answering, agent forwarding off, no MCP server",
            ),
            Err(e) => {
                let fix = match e.kind() {
                    ErrorKind::LoginRequired => "sbx login",
                    ErrorKind::DaemonFault => "sbx daemon restart",
                    _ => "see the message",
                };
                HealthCheck::fail("sbx.host", e.to_string(), fix)
            }
        });
        checks
    }
}

#[async_trait]
impl SandboxBackend for SbxBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    fn isolation(&self) -> Isolation {
        self.host.isolation
    }

    fn declarations(&self) -> &BackendDeclarations {
        &self.host.declarations
    }

    async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let sandbox = crate::acquire::acquire(&self.host, key, spec).await?;
        Ok(sandbox)
    }

    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let found = crate::acquire::find(&self.host, key, kind).await?;
        Ok(found.map(|sandbox| sandbox as Arc<dyn Sandbox>))
    }

    async fn dispose(
        &self,
        key: &SandboxKey,
        selector: DisposeSelector,
    ) -> Option<DisposalFailure> {
        crate::disposal::dispose(&self.host, key, selector).await
    }

    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        crate::disposal::dispose_scope(&self.host, scope, thread_id).await
    }

    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        crate::disposal::list(&self.host, scope, thread_id).await
    }

    /// The workspace root: every sandbox's workspace and `meta.json` record lie below it.
    async fn host_state_roots(&self) -> Result<Vec<String>, SandboxError> {
        Ok(vec![self.workspace_root().display().to_string()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn the_simulator_is_refused_unless_allowed_and_never_a_microvm() {
        let sim = "sbx-sim 0.1.0 (stand-in for sbx; emulates v0.45.1; isolation: container)";
        assert_eq!(
            isolation_for(Ok(sim), false).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(isolation_for(Ok(sim), true).unwrap(), Isolation::Container);
        assert_eq!(
            isolation_for(Ok("sbx version v0.45.1"), false).unwrap(),
            Isolation::Microvm
        );
        let failed = SandboxError::engine("exit 1");
        assert_eq!(
            isolation_for(Err(&failed), false).unwrap(),
            Isolation::Microvm
        );
    }

    #[test]
    fn declarations_are_the_documented_ones() {
        let d = declarations();
        assert_eq!(d.capabilities.len(), 8);
        assert!(d.serves(Capability::ExactKill));
        assert!(d.serves(Capability::HostTools));
        assert_eq!(d.egress_modes, BTreeSet::from([Egress::Closed]));
        assert_eq!(d.os_families, BTreeSet::from([OsFamily::Posix]));
        assert!(d.serves_scope(IsolationScope::Conversation));
        assert!(!d.serves_scope(IsolationScope::Call));
        assert_eq!(d.limits, SandboxLimits::default());
    }
}
