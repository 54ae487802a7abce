//! What every call of one backend shares (the checked configuration, the driver, the per-name
//! locks, the rung, and what this process retired), and the host checks every acquire runs.
//!
//! A module of its own so the modules that act on a sandbox (`acquire`, `handle`, `disposal`)
//! and the backend that calls them all depend on it, and it on none of them.

use std::collections::HashMap;
use std::sync::Mutex;

use sandbox_core::backend_kit::LockTable;
use sandbox_core::{BackendDeclarations, Isolation, SandboxError};
use sbx_cli::SbxCli;

use crate::config::CheckedConfig;
use crate::engine::to_sandbox_error;
use crate::layout;

/// The setting that must read `false`.
const AGENT_FORWARDING_SETTING: &str = "ssh.agentForwardingEnabled";

/// Everything the backend's calls share: the checked configuration, the driver, the per-name
/// locks and the instances retired by this process.
#[derive(Debug)]
pub(crate) struct SbxHost {
    pub(crate) config: CheckedConfig,
    pub(crate) cli: SbxCli,
    pub(crate) locks: LockTable<String>,
    pub(crate) isolation: Isolation,
    pub(crate) declarations: BackendDeclarations,
    /// Instance id → why it was retired.
    retired: Mutex<HashMap<String, String>>,
    /// Instance id → whether its guest can give each call its own PID namespace (asked once per
    /// instance, before its first wrapper call).
    pid_namespaces: Mutex<HashMap<String, bool>>,
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

impl SbxHost {
    /// The shared state of a backend that connected with `config` and `cli` at rung `isolation`.
    pub(crate) fn new(
        config: CheckedConfig,
        cli: SbxCli,
        isolation: Isolation,
        declarations: BackendDeclarations,
    ) -> Self {
        SbxHost {
            config,
            cli,
            locks: LockTable::default(),
            isolation,
            declarations,
            retired: Mutex::new(HashMap::new()),
            pid_namespaces: Mutex::new(HashMap::new()),
        }
    }

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

    /// Why this process retired `instance_id`, if it did.
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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

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
