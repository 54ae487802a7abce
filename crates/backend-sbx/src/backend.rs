//! The backend: construction, declarations, the host checks, retirement, and the trait.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sandbox_core::backend_kit::LockTable;
use sandbox_core::naming::sbx::NamePrefix;
use sandbox_core::{
    BackendDeclarations, Capability, DisposalFailure, DisposeSelector, Egress, ErrorKind,
    HealthCheck, Isolation, IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError,
    SandboxKey, SandboxLimits, SandboxSpec, SandboxSummary, ScopePurge,
};
use sbx_cli::SbxCli;

use crate::config::{CheckedConfig, SbxConfig};
use crate::engine::to_sandbox_error;
use crate::layout;
use crate::BACKEND_NAME;

/// The setting that must read `false`.
const AGENT_FORWARDING_SETTING: &str = "ssh.agentForwardingEnabled";

/// What `sbx version` prints for the stand-in.
const SIMULATOR_MARK: &str = "sbx-sim";

/// The Docker Sandboxes backend: one `sbx` microVM per (key, kind).
///
/// Cheap to clone: clones share the driver, the per-name locks and the retired set.
#[derive(Debug, Clone)]
pub struct SbxBackend {
    pub(crate) host: Arc<SbxHost>,
}

/// Everything the backend's calls share: the checked configuration, the driver, the per-name
/// locks and the instances retired by this process.
#[derive(Debug)]
pub(crate) struct SbxHost {
    pub(crate) config: CheckedConfig,
    pub(crate) cli: SbxCli,
    pub(crate) locks: LockTable<String>,
    isolation: Isolation,
    declarations: BackendDeclarations,
    /// Instance id → why it was retired.
    retired: Mutex<HashMap<String, String>>,
    /// Instance id → whether its guest can give each call its own PID namespace (asked once per
    /// instance, before its first wrapper call).
    pid_namespaces: Mutex<HashMap<String, bool>>,
}

/// The declarations: every file capability, closed egress, POSIX guests, conversation scope,
/// the default transfer ceilings.
fn declarations() -> BackendDeclarations {
    BackendDeclarations {
        capabilities: BTreeSet::from([
            Capability::Exec,
            Capability::FilesIn,
            Capability::FilesOut,
            Capability::FilesList,
            Capability::FilesDelete,
            Capability::Reclaim,
        ]),
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

/// Judges the two host settings, in this order: forwarding, then MCP servers.
pub(crate) fn judge_host(
    forwarding: Result<String, SandboxError>,
    mcp_servers: Result<usize, SandboxError>,
) -> Result<(), SandboxError> {
    let value = forwarding?;
    if value.trim().to_lowercase() != "false" {
        return Err(SandboxError::HostNotConfined(format!(
            "SSH agent forwarding is on ({AGENT_FORWARDING_SETTING} = {value:?}); run `sbx \
             settings set {AGENT_FORWARDING_SETTING} false`, then `sbx daemon restart`"
        )));
    }
    match mcp_servers? {
        0 => Ok(()),
        n => Err(SandboxError::HostNotConfined(format!(
            "{n} MCP server(s) registered; sbx's MCP gateway is reachable from sandboxes \
             regardless of network rules; remove with `sbx mcp rm`"
        ))),
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
            host: Arc::new(SbxHost {
                config,
                cli,
                locks: LockTable::default(),
                isolation,
                declarations: declarations(),
                retired: Mutex::new(HashMap::new()),
                pid_namespaces: Mutex::new(HashMap::new()),
            }),
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

impl SbxHost {
    /// The host checks run on every acquire: agent forwarding off and no MCP server, both read
    /// concurrently and never written.
    pub(crate) async fn check_host(&self) -> Result<(), SandboxError> {
        let (forwarding, servers) = tokio::join!(
            self.cli.settings_get(AGENT_FORWARDING_SETTING),
            self.cli.mcp_ls()
        );
        judge_host(
            forwarding.map_err(to_sandbox_error),
            servers.map(|s| s.len()).map_err(to_sandbox_error),
        )
    }

    /// Why this process retired `instance_id`, if it did.
    /// What the PID-namespace probe answered for this instance, when it was asked.
    pub(crate) fn pid_namespace_known(&self, instance_id: &str) -> Option<bool> {
        let known = self
            .pid_namespaces
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        known.get(instance_id).copied()
    }

    /// Remembers the PID-namespace probe's answer for this instance.
    pub(crate) fn remember_pid_namespace(&self, instance_id: &str, available: bool) {
        let mut known = self
            .pid_namespaces
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        known.insert(instance_id.to_owned(), available);
    }

    pub(crate) fn retired_reason(&self, instance_id: &str) -> Option<String> {
        let retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        retired.get(instance_id).cloned()
    }

    /// Retires an instance: in memory at once, then (best effort, never raising) in its record
    /// when the record still describes that instance, so every process replaces it.
    pub(crate) async fn retire(&self, name: &str, instance_id: &str, reason: &str) {
        {
            let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired.insert(instance_id.to_owned(), reason.to_owned());
        }
        let dir = layout::name_dir(&self.config.root, name);
        let instance = instance_id.to_owned();
        let reason = reason.to_owned();
        let persisted = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
            let Some(mut record) = layout::read_record(&dir)? else {
                return Ok(false);
            };
            if record.instance_id.as_deref() != Some(instance.as_str()) {
                return Ok(false);
            }
            record.retired = Some(true);
            record.retired_reason = Some(reason);
            layout::write_record(&dir, &record)?;
            Ok(true)
        })
        .await;
        match persisted {
            Ok(Ok(true)) => tracing::warn!(sandbox = %name, instance = %instance_id, "retired"),
            Ok(Ok(false)) => {
                tracing::warn!(sandbox = %name, instance = %instance_id, "retired in memory; the record names another instance")
            }
            Ok(Err(error)) => {
                tracing::warn!(sandbox = %name, instance = %instance_id, %error, "retired in memory; the record could not be updated")
            }
            Err(error) => {
                tracing::warn!(sandbox = %name, instance = %instance_id, %error, "retired in memory; the record update did not run")
            }
        }
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
        assert_eq!(d.capabilities.len(), 6);
        assert_eq!(d.egress_modes, BTreeSet::from([Egress::Closed]));
        assert_eq!(d.os_families, BTreeSet::from([OsFamily::Posix]));
        assert!(d.serves_scope(IsolationScope::Conversation));
        assert!(!d.serves_scope(IsolationScope::Call));
        assert_eq!(d.limits, SandboxLimits::default());
    }

    #[test]
    fn host_judgement_order_and_fixes() {
        assert!(judge_host(Ok("false".into()), Ok(0)).is_ok());
        assert!(judge_host(Ok(" FALSE\n".into()), Ok(0)).is_ok());
        let on = judge_host(Ok("true".into()), Ok(3)).unwrap_err();
        assert_eq!(on.kind(), ErrorKind::HostNotConfined);
        assert!(on
            .to_string()
            .contains("sbx settings set ssh.agentForwardingEnabled false"));
        assert!(on.to_string().contains("sbx daemon restart"));
        let mcp = judge_host(Ok("false".into()), Ok(2)).unwrap_err();
        assert_eq!(mcp.kind(), ErrorKind::HostNotConfined);
        assert!(mcp.to_string().contains("2 MCP server(s)"));
        assert!(mcp.to_string().contains("sbx mcp rm"));
        // The forwarding call's own failure comes first, then the MCP call's.
        let login = judge_host(
            Err(SandboxError::LoginRequired("run `sbx login`".into())),
            Err(SandboxError::engine("x")),
        );
        assert_eq!(login.unwrap_err().kind(), ErrorKind::LoginRequired);
        let malformed = judge_host(Ok("false".into()), Err(SandboxError::engine("malformed")));
        assert_eq!(malformed.unwrap_err().kind(), ErrorKind::Engine);
        assert_eq!(
            judge_host(Ok("".into()), Ok(0)).unwrap_err().kind(),
            ErrorKind::HostNotConfined
        );
    }
}
