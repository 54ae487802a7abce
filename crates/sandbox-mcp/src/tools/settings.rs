//! What the server is configured with, as the tools read it.

use std::time::Duration;

use crate::config::Cli;

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
    /// Bounds.
    pub max_timeout: Duration,
    /// Bounds.
    pub max_output_bytes: u64,
    /// Bounds.
    pub max_file_bytes: u64,
    /// Whether the server serves HTTP (principal from the request) or stdio.
    pub http: bool,
}

impl Settings {
    /// The settings a command line gives, with the resolved default image.
    pub fn from_cli(cli: &Cli, image: Option<String>) -> Self {
        Settings {
            scope: cli.scope.clone(),
            agent: cli.agent.clone(),
            image,
            allow_hosts: cli.allow_hosts.clone(),
            max_timeout: Duration::from_secs(cli.max_timeout.max(1)),
            max_output_bytes: cli.max_output_bytes.max(1),
            max_file_bytes: cli.max_file_bytes.max(1),
            http: cli.http.is_some(),
        }
    }
}
