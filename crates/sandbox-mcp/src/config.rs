//! The server's configuration: the command line, and what the tools read of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sandbox_backends::BackendArgs;

/// Serve sandboxes as MCP tools to one agent host (stdio, the default) or to several principals
/// over Streamable HTTP (`--http`).
#[derive(Debug, Clone, Parser)]
#[command(name = "sandbox-mcp", version, about, long_about = None)]
pub struct Cli {
    /// The backend and its configuration (shared with sandboxctl).
    #[command(flatten)]
    pub backends: BackendArgs,
    /// Serve Streamable HTTP on this address instead of stdio (`127.0.0.1:PORT`; another
    /// interface only when named).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// The bearer tokens of `--http`: one `TOKEN PRINCIPAL` a line (`#` starts a comment).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// A browser origin `--http` accepts (repeatable; `scheme://host:port`). Without one, any
    /// request that carries an `Origin` header is refused.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// A `Host` header `--http` accepts besides the bound address and `localhost` on its port
    /// (repeatable).
    #[arg(long = "allow-host-header", value_name = "HOST")]
    pub allow_host_headers: Vec<String>,
    /// The scope of every sandbox key this server makes.
    #[arg(long, default_value = "mcp")]
    pub scope: String,
    /// The agent of every sandbox key over stdio (over HTTP, the principal).
    #[arg(long, default_value = "agent")]
    pub agent: String,
    /// Seconds a sandbox may stay idle before it is disposed of.
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    pub ttl: u64,
    /// Leave the sandboxes in place when the server ends (`sandboxctl purge` clears them).
    #[arg(long)]
    pub keep: bool,
    /// The image of every sandbox (docker; default: the local default image, built when
    /// missing). Never chosen by the model.
    #[arg(long)]
    pub image: Option<String>,
    /// A host sandboxes may reach over HTTP(S) (repeatable). Without one, egress is closed. The
    /// model can narrow this list per sandbox, never widen it.
    #[arg(long = "allow", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// The longest `timeout_s` a call may ask for, and the default.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub max_timeout: u64,
    /// The most output bytes kept per stream a call may ask for.
    #[arg(long, value_name = "N", default_value_t = 4 * 1024 * 1024)]
    pub max_output_bytes: u64,
    /// The largest file `sandbox_read_file` returns and `sandbox_write_file` accepts.
    #[arg(long, value_name = "N", default_value_t = 8 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// The server's private state directory, where it keeps its lock (default:
    /// `$XDG_RUNTIME_DIR/sandbox-mcp`, else `sandbox-mcp-<uid>` under the temporary directory).
    /// It must be owned by this user with no access for others; a missing one is made so.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// The default output kept per stream when a call names none.
pub const DEFAULT_OUTPUT_BYTES: u64 = 256 * 1024;

/// The default timeout when a call names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

impl Cli {
    /// The idle time to live.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl.max(1))
    }

    /// The state directory: `--state-dir`, else the per-user default
    /// ([`sandbox_backends::default_mcp_state_dir`]).
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(sandbox_backends::default_mcp_state_dir)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docker_runtime_and_a_hardened_container_floor_reach_the_backend() {
        let cli = Cli::parse_from([
            "sandbox-mcp",
            "--docker-runtime",
            "runsc",
            "--min-isolation",
            "hardened_container",
        ]);
        let config = sandbox_backends::docker_config(&cli.backends, &[]);
        assert_eq!(config.runtime.as_deref(), Some("runsc"));
        assert_eq!(
            cli.backends.min_isolation,
            sandbox_core::Isolation::HardenedContainer
        );
        let plain = Cli::parse_from(["sandbox-mcp"]);
        assert_eq!(
            sandbox_backends::docker_config(&plain.backends, &[]).runtime,
            None
        );
    }
}
