//! The server's configuration: the command line, and what the tools read of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sandbox_backends::{BackendArgs, PoolArgs};

/// Serve sandboxes as MCP tools to one agent host (stdio, the default) or to several principals
/// over Streamable HTTP (`--http`).
#[derive(Debug, Clone, Parser)]
#[command(name = "sandbox-mcp", version, about, long_about = None)]
pub struct Cli {
    /// The backend and its configuration (shared with sandboxctl).
    #[command(flatten)]
    pub backends: BackendArgs,
    /// The warm pool.
    #[command(flatten)]
    pub pool: PoolArgs,
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
    /// (repeatable; `host:port`, a bare host matches any port).
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
    /// A method and path rule for sandboxes' egress: 'HOST METHODS PATHS', comma-separated
    /// lists, `*` for all (repeatable; e.g. 'api.example.com GET,HEAD /v1/*'), as `sandboxctl run
    /// --rule`. Its host is allowed, narrowed to these; every sandbox that can reach the host gets
    /// the rule, and the model cannot lift it.
    #[arg(long = "rule", value_name = "RULE")]
    pub rules: Vec<String>,
    /// A credential grant, as a JSON file (as `sandboxctl run --credential-file`: {"host", "port"
    /// (443), "methods" ("*"), "paths", "token", "expires_in_secs" (from the server's start) or
    /// "expires_unix"}; repeatable), read once at start. Every sandbox that can reach the host gets
    /// it; the proxy adds the token to matching HTTPS requests. Neither the model nor the sandbox
    /// ever sees it.
    #[arg(long = "credential-file", value_name = "PATH")]
    pub credential_files: Vec<PathBuf>,
    /// The longest `timeout_s` a call may ask for, and the default.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub max_timeout: u64,
    /// The most output bytes kept per stream a call may ask for.
    #[arg(long, value_name = "N", default_value_t = 4 * 1024 * 1024)]
    pub max_output_bytes: u64,
    /// The largest file `sandbox_read_file` returns and `sandbox_write_file` accepts.
    #[arg(long, value_name = "N", default_value_t = 8 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// The most sandboxes one principal (over stdio, the client) may hold at once; a create
    /// past it is refused with a retryable `sandbox_limit` error.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_sandboxes_per_principal: usize,
    /// The most sandboxes the server holds at once, every principal's together.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_sandboxes: usize,
    /// `--http`: seconds a client has to send a request's headers once the connection is open or
    /// the request has begun; a connection slower than that is closed.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub http_header_timeout: u64,
    /// `--http`: seconds a connection may stay open with no request in progress before it is
    /// closed.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub http_idle_timeout: u64,
    /// `--http`: the most connections open at once that have not yet sent a request with a valid
    /// token; a connection past it is closed at once.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_unauthenticated_connections: usize,
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

    /// The HTTP connection limits.
    pub fn http_limits(&self) -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(self.http_header_timeout.max(1)),
            idle_timeout: Duration::from_secs(self.http_idle_timeout.max(1)),
            max_unauthenticated: self.max_unauthenticated_connections.max(1),
            max_request_bytes: request_bytes_for(self.max_file_bytes.max(1)),
        }
    }

    /// The state directory: `--state-dir`, else the per-user default
    /// ([`sandbox_backends::default_mcp_state_dir`]).
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(sandbox_backends::default_mcp_state_dir)
    }
}
/// What `--http` allows a connection: how long it may take and stay idle, how many may be open
/// unauthenticated, and the largest request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// The longest a request's headers may take to arrive.
    pub header_timeout: Duration,
    /// The longest a connection may stay open with no request in progress.
    pub idle_timeout: Duration,
    /// The most connections open at once that have not authenticated.
    pub max_unauthenticated: usize,
    /// The largest request body (and, over stdio, the longest request line).
    pub max_request_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_unauthenticated: 64,
            max_request_bytes: request_bytes_for(8 * 1024 * 1024),
        }
    }
}

/// Room for a request's JSON-RPC envelope and its other arguments beside the file content.
pub const REQUEST_ENVELOPE_BYTES: u64 = 64 * 1024;

/// The largest request that must be accepted for a `sandbox_write_file` of `max_file_bytes`
/// bytes to reach the tool: the content in base64 (4 characters for every 3 bytes) and the
/// envelope. The same bytes as UTF-8 text fit whenever JSON escapes them no longer than base64
/// would (plain text does; text dense in escaped characters should be sent as base64). Never
/// below the SDK's own default of 4 MiB.
pub fn request_bytes_for(max_file_bytes: u64) -> usize {
    let base64 = max_file_bytes.div_ceil(3).saturating_mul(4);
    let bytes = base64
        .saturating_add(REQUEST_ENVELOPE_BYTES)
        .max(4 * 1024 * 1024);
    usize::try_from(bytes).unwrap_or(usize::MAX)
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
        assert_eq!(plain.pool.pool, 0);
        assert_eq!(Cli::parse_from(["sandbox-mcp", "--pool", "4"]).pool.pool, 4);
        assert_eq!(
            sandbox_backends::docker_config(&plain.backends, &[]).runtime,
            None
        );
    }
}
