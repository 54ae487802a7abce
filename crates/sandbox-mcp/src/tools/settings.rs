//! What the server is configured with, as the tools read it.

use std::time::Duration;

use super::OperatorEgress;
use crate::config::Cli;
use crate::handles::SandboxLimits;

/// What the server is configured with, as the tools need it.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The key scope.
    pub scope: String,
    /// The stdio client's agent id (over HTTP the principal is the agent).
    pub agent: String,
    /// The pinned image, if any.
    pub image: Option<String>,
    /// The server's egress allowlist; empty: closed.
    pub allow_hosts: Vec<String>,
    /// The operator's egress rules and credential grants, applied to every sandbox.
    pub egress: OperatorEgress,
    /// Bounds.
    pub max_timeout: Duration,
    /// Bounds.
    pub max_output_bytes: u64,
    /// Bounds.
    pub max_file_bytes: u64,
    /// How many sandboxes a principal, and the server, may hold at once.
    pub limits: SandboxLimits,
    /// The largest request the transport accepts (derived from `max_file_bytes`).
    pub max_request_bytes: usize,
    /// Whether the server serves HTTP (principal from the request) or stdio.
    pub http: bool,
}

impl Settings {
    /// The settings a command line gives, with the resolved default image and the operator's
    /// egress rules and grants (read by [`OperatorEgress::from_flags`]): the allowlist is the
    /// `--allow` hosts and the hosts of the rules.
    pub fn from_cli(cli: &Cli, image: Option<String>, egress: OperatorEgress) -> Self {
        Settings {
            scope: cli.scope.clone(),
            agent: cli.agent.clone(),
            image,
            allow_hosts: egress.server_hosts(&cli.allow_hosts),
            egress,
            max_timeout: Duration::from_secs(cli.max_timeout.max(1)),
            max_output_bytes: cli.max_output_bytes.max(1),
            max_file_bytes: cli.max_file_bytes.max(1),
            limits: SandboxLimits {
                per_principal: cli.max_sandboxes_per_principal.max(1),
                total: cli.max_sandboxes.max(1),
            },
            max_request_bytes: cli.http_limits().max_request_bytes,
            http: cli.http.is_some(),
        }
    }
}
