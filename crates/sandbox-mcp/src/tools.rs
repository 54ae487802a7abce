//! The tools: `sandbox_create`, `sandbox_exec`, the file tools, `sandbox_list` and
//! `sandbox_dispose`, over one [`Router`].
//!
//! Who chooses what (the trust model is in `docs/mcp.md`): the server chooses the backend, the
//! image, the egress allowlist, the key's scope and agent, and every bound (timeout, output,
//! file size); the model chooses a kind, commands, guest paths and file contents, and can only
//! narrow egress. File tools carry content in the protocol and name guest paths only: no tool
//! reads or writes a host path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    Implementation, ProgressNotificationParam, ServerCapabilities, ServerConfig, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use sandbox_core::{
    Command, Egress, EntryKind, ExecChunk, ExecEnv, ExecEvent, ExecRequest, ExecStdin, Isolation,
    Router, Sandbox, SandboxError, SandboxKey, SandboxSpec,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::config::{Cli, DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT};
use crate::errors::ToolFailure;
use crate::handles::{Entry, HandleTable, Lookup, Principal};
use crate::liveness::Liveness;
use crate::output::{HeadTail, LastLine};

/// The principal an HTTP request authenticated as, put in the request's extensions by the
/// bearer check; tools read it from there and nowhere else.
#[derive(Debug, Clone)]
pub struct HttpPrincipal(pub Principal);

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

/// The state every connection of one server shares.
#[derive(Debug)]
pub struct Shared {
    router: Router,
    settings: Settings,
    liveness: Liveness,
    seq: AtomicU64,
    table: Mutex<HandleTable>,
}

impl Shared {
    /// Shared state over `router`, handles expiring after `ttl`.
    pub fn new(router: Router, settings: Settings, liveness: Liveness, ttl: Duration) -> Arc<Self> {
        Arc::new(Shared {
            router,
            settings,
            liveness,
            seq: AtomicU64::new(0),
            table: Mutex::new(HandleTable::new(ttl)),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HandleTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The liveness lock.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    fn isolation(&self) -> Isolation {
        self.router
            .backends()
            .first()
            .map(|b| b.isolation())
            .unwrap_or(Isolation::None)
    }

    /// Disposes of the sandboxes idle past the TTL. Returns when the next one may expire.
    ///
    /// # Cancel safety and drop
    /// Expired handles are out of the table before any disposal starts; a dropped future leaves
    /// the rest of them on the engine for the next start's sweep or `sandboxctl purge`.
    pub async fn expire(&self) -> Option<Instant> {
        let gone = self.table().take_expired();
        self.dispose_entries(gone).await;
        self.table().next_expiry()
    }

    /// Disposes of every sandbox this server still holds, all at once: an agent host gives a
    /// stdio server a couple of seconds after closing its input before it kills it.
    ///
    /// # Cancel safety and drop
    /// As [`expire`](Self::expire).
    pub async fn dispose_all(&self) -> usize {
        let all = self.table().take_all();
        let n = all.len();
        self.dispose_entries(all).await;
        n
    }

    async fn dispose_entries(&self, entries: Vec<Entry>) {
        futures_util::future::join_all(entries.iter().map(|entry| self.router.dispose(&entry.key)))
            .await;
    }

    /// Disposes of the sandboxes in this server's scope whose owning server is gone (it
    /// crashed: its liveness lock is free). Returns how many conversations were purged.
    ///
    /// # Errors
    /// The backend's listing failure.
    pub async fn sweep_orphans(&self) -> Result<usize, SandboxError> {
        let mut purged = 0;
        for backend in self.router.backends() {
            let mut threads: Vec<String> = backend
                .list(&self.settings.scope, None)
                .await?
                .into_iter()
                .filter_map(|s| s.key.map(|k| k.thread_id))
                .collect();
            threads.sort();
            threads.dedup();
            for thread in threads {
                if self.liveness.owner_is_gone(&thread) {
                    let purge = self
                        .router
                        .dispose_scope(&self.settings.scope, &thread)
                        .await;
                    if purge.undisposed.is_none() {
                        self.liveness.forget(&thread);
                    }
                    purged += 1;
                }
            }
        }
        Ok(purged)
    }
}

/// The MCP service: one per connection, all sharing one [`Shared`].
#[derive(Debug, Clone)]
pub struct SandboxServer {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Self>,
}

/// The model's view of a sandbox's egress.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressView {
    /// `closed` or `allowlist`.
    pub mode: String,
    /// The hosts it may reach (empty when closed).
    pub allow_hosts: Vec<String>,
}

/// `sandbox_create`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// A label for the kind of sandbox (letters, digits, `-`, `_`; default `default`).
    pub kind: Option<String>,
    /// Narrow the server's egress allowlist to these hosts (each must be allowed by the server).
    pub allow_hosts: Option<Vec<String>>,
}

/// `sandbox_create`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CreateResult {
    /// The handle to pass to the other tools.
    pub sandbox: String,
    /// The isolation rung of the backend (`container`, `microvm`, ...).
    pub isolation: String,
    /// What the sandbox can reach.
    pub egress: EgressView,
    /// Seconds of idleness before it is disposed of.
    pub expires_in_s: u64,
}

/// `sandbox_exec`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The handle from `sandbox_create`.
    pub sandbox: String,
    /// A shell command line, run under `sh -c`.
    pub command: Option<String>,
    /// A program and its arguments, run as given (instead of `command`).
    pub argv: Option<Vec<String>>,
    /// The working directory in the sandbox (relative to its work directory, or absolute).
    pub workdir: Option<String>,
    /// Environment variables for the command (secret-looking names are refused).
    pub env: Option<BTreeMap<String, String>>,
    /// Text fed to the command's standard input.
    pub stdin: Option<String>,
    /// Seconds before the command's processes are killed (capped by the server).
    pub timeout_s: Option<f64>,
    /// Bytes of each of stdout and stderr kept; more is truncated, head and tail kept (capped by
    /// the server).
    pub max_output_bytes: Option<u64>,
}

/// `sandbox_exec`'s result. A non-zero exit is a result, not an error.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecResult {
    /// The command's exit status; null when it timed out.
    pub exit_code: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Its standard output (head and tail when truncated).
    pub stdout: String,
    /// Its standard error (head and tail when truncated).
    pub stderr: String,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Wall time of the call.
    pub duration_ms: u64,
}

/// `sandbox_read_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path (relative to the work directory, or absolute under it).
    pub path: String,
    /// Return at most this many bytes (capped by the server).
    pub max_bytes: Option<u64>,
}

/// How file content is written in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The bytes are UTF-8 text.
    Utf8,
    /// The bytes in standard base64.
    Base64,
}

/// `sandbox_read_file`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadResult {
    /// The bytes, as text or base64.
    pub content: String,
    /// `utf8`, or `base64` when the bytes are not UTF-8.
    pub encoding: Encoding,
    /// The file's size in bytes.
    pub size: u64,
    /// Whether only the first `max_bytes` were returned.
    pub truncated: bool,
}

/// `sandbox_write_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path (parent directories are made).
    pub path: String,
    /// The content.
    pub content: String,
    /// How `content` is written (default `utf8`).
    pub encoding: Option<Encoding>,
}

/// `sandbox_write_file`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteResult {
    /// The path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// `sandbox_list_files`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest directory (default: the work directory).
    pub path: Option<String>,
}

/// One directory entry.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FileEntry {
    /// Its path.
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    /// Its size, for files.
    pub size: Option<u64>,
}

/// `sandbox_list_files`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListFilesResult {
    /// The entries.
    pub entries: Vec<FileEntry>,
}

/// `sandbox_delete`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path.
    pub path: String,
    /// Remove a directory and everything under it.
    pub recursive: Option<bool>,
}

/// `sandbox_delete`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeleteResult {
    /// The path removed.
    pub deleted: String,
}

/// `sandbox_list`'s arguments (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {}

/// One of the caller's sandboxes.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SandboxView {
    /// Its handle.
    pub sandbox: String,
    /// Its kind.
    pub kind: String,
    /// Its egress.
    pub egress: EgressView,
    /// Seconds of idleness left before it is disposed of.
    pub expires_in_s: u64,
}

/// `sandbox_list`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListResult {
    /// The caller's live sandboxes.
    pub sandboxes: Vec<SandboxView>,
}

/// `sandbox_dispose`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DisposeArgs {
    /// The handle.
    pub sandbox: String,
}

/// `sandbox_dispose`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DisposeResult {
    /// Whether a live sandbox of the caller's was disposed of now (false: there was none, it
    /// is already gone).
    pub disposed: bool,
}

fn egress_view(hosts: &[String]) -> EgressView {
    EgressView {
        mode: if hosts.is_empty() {
            "closed"
        } else {
            "allowlist"
        }
        .to_owned(),
        allow_hosts: hosts.to_vec(),
    }
}

/// Whether `host` is within the server's allowlist `server`: named there, or a strict
/// subdomain of a `*.d` entry.
fn within(server: &[String], host: &str) -> bool {
    server.iter().any(|allowed| {
        allowed == host
            || allowed.strip_prefix("*.").is_some_and(|d| {
                !host.starts_with("*.")
                    && host.len() > d.len() + 1
                    && host.ends_with(&format!(".{d}"))
            })
    })
}

fn check_kind(kind: &str) -> Result<(), ToolFailure> {
    let ok = !kind.is_empty()
        && kind.len() <= 32
        && kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ToolFailure::invalid(
            "kind must be 1 to 32 letters, digits, '-' or '_'",
        ))
    }
}

/// Releases a handle's in-use mark when a call ends, however it ends.
struct InUse<'a> {
    shared: &'a Shared,
    handle: String,
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.shared.table().release(&self.handle);
    }
}

#[tool_router]
impl SandboxServer {
    /// A service over `shared`; the exec tool's open-world hint follows the server's egress.
    pub fn new(shared: Arc<Shared>) -> Self {
        let mut tool_router = Self::tool_router();
        let open = !shared.settings.allow_hosts.is_empty();
        if let Some(route) = tool_router.map.get_mut("sandbox_exec") {
            route.attr.annotations = Some(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(true)
                    .idempotent(false)
                    .open_world(open),
            );
        }
        SandboxServer {
            shared,
            tool_router,
        }
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, ToolFailure> {
        if !self.shared.settings.http {
            return Ok(Principal::from(self.shared.settings.agent.as_str()));
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<HttpPrincipal>())
            .map(|p| p.0.clone())
            // The bearer check runs before every request; a request without a principal never
            // reaches a tool, and if one did it would own nothing.
            .ok_or_else(ToolFailure::unknown_sandbox)
    }

    fn open(&self, principal: &str, handle: &str) -> Result<(Entry, InUse<'_>), ToolFailure> {
        match self.shared.table().acquire(principal, handle) {
            Lookup::Found(entry) => Ok((
                entry,
                InUse {
                    shared: &self.shared,
                    handle: handle.to_owned(),
                },
            )),
            Lookup::Expired => Err(ToolFailure::expired_sandbox()),
            Lookup::Unknown => Err(ToolFailure::unknown_sandbox()),
        }
    }

    /// Create a sandbox and return its handle. The server chooses the image and egress; allow_hosts can only narrow the server's allowlist.
    #[tool(
        name = "sandbox_create",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandbox_create(
        &self,
        Parameters(args): Parameters<CreateArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<CreateResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let kind = args.kind.unwrap_or_else(|| "default".to_owned());
        check_kind(&kind)?;
        let server_hosts = &self.shared.settings.allow_hosts;
        let hosts = match args.allow_hosts {
            None => server_hosts.clone(),
            Some(asked) => {
                if let Some(refused) = asked.iter().find(|h| !within(server_hosts, h)) {
                    return Err(ToolFailure::new(
                        "not_permitted",
                        format!(
                            "egress to {} is not allowed by this server; allow_hosts can only narrow the server's allowlist",
                            crate::errors::sanitize(refused)
                        ),
                        false,
                    ));
                }
                asked
            }
        };
        let mut spec = SandboxSpec::builder(kind.clone());
        if let Some(image) = &self.shared.settings.image {
            spec = spec.image(image.clone());
        }
        if !hosts.is_empty() {
            spec = spec.egress(Egress::Allowlist);
            for h in &hosts {
                spec = spec.allow(h.as_str());
            }
        }
        let spec = spec
            .build()
            .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
        let n = self.shared.seq.fetch_add(1, Ordering::Relaxed);
        let agent: &str = if self.shared.settings.http {
            &principal
        } else {
            &self.shared.settings.agent
        };
        let key = SandboxKey::conversation(
            self.shared.settings.scope.clone(),
            self.shared.liveness.thread(n),
            agent.to_owned(),
        );
        let sandbox = self
            .shared
            .router
            .acquire(&key, &spec)
            .await
            .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
        let mut table = self.shared.table();
        let ttl = table.ttl();
        let handle = table.insert(principal, key, kind, sandbox, hosts.clone());
        Ok(Json(CreateResult {
            sandbox: handle,
            isolation: self.shared.isolation().to_string(),
            egress: egress_view(&hosts),
            expires_in_s: ttl.as_secs(),
        }))
    }

    /// Run a command in a sandbox: `command` under `sh -c`, or `argv` as given. A non-zero exit is a normal result. Output over the cap is truncated (head and tail kept). Sends progress (the latest output line) about once a second when asked; a cancelled call kills the command's processes.
    #[tool(name = "sandbox_exec")]
    async fn sandbox_exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ExecResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let settings = &self.shared.settings;
        let command = match (args.command, args.argv) {
            (Some(line), None) => Command::shell(line),
            (None, Some(argv)) => Command::argv(argv),
            _ => return Err(ToolFailure::invalid(
                "give exactly one of command (a shell line) or argv (a program and its arguments)",
            )),
        };
        let timeout = match args.timeout_s {
            None => DEFAULT_TIMEOUT.min(settings.max_timeout),
            Some(s) if s.is_finite() && s > 0.0 => {
                Duration::try_from_secs_f64(s.min(settings.max_timeout.as_secs_f64()))
                    .unwrap_or(settings.max_timeout)
            }
            Some(_) => return Err(ToolFailure::invalid("timeout_s must be a positive number")),
        };
        if timeout.is_zero() {
            return Err(ToolFailure::invalid("timeout_s must be a positive number"));
        }
        let keep = match args.max_output_bytes {
            None => DEFAULT_OUTPUT_BYTES.min(settings.max_output_bytes),
            Some(0) => return Err(ToolFailure::invalid("max_output_bytes must be positive")),
            Some(n) => n.min(settings.max_output_bytes),
        };
        let mut env = ExecEnv::default();
        for (name, value) in args.env.unwrap_or_default() {
            env = env.set(name, value);
        }
        let request = ExecRequest::new(command)
            .working_directory(args.workdir.unwrap_or_else(|| ".".to_owned()))
            .timeout(timeout)
            .env(env);
        request
            .validate()
            .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
        let stdin = match args.stdin {
            Some(text) if !text.is_empty() => ExecStdin::Bytes(text.into_bytes()),
            _ => ExecStdin::Closed,
        };
        let (entry, _in_use) = self.open(&principal, &args.sandbox)?;
        let progress = ctx.meta.get_progress_token();
        run_exec(
            &*entry.sandbox,
            request,
            stdin,
            usize::try_from(keep).unwrap_or(usize::MAX),
            progress.map(|token| (token, ctx.peer.clone())),
            ctx.ct.clone(),
        )
        .await
        .map(Json)
    }

    /// Read a file from a sandbox. Text comes back as utf8, other bytes as base64.
    #[tool(
        name = "sandbox_read_file",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ReadResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let max = match args.max_bytes {
            Some(0) => return Err(ToolFailure::invalid("max_bytes must be positive")),
            Some(n) => n.min(self.shared.settings.max_file_bytes),
            None => self.shared.settings.max_file_bytes,
        };
        let (entry, _in_use) = self.open(&principal, &args.sandbox)?;
        let fail = |e: SandboxError| ToolFailure::from_sandbox(&e, Some(&args.path));
        let stat = entry
            .sandbox
            .stat_file(&args.path, ".")
            .await
            .map_err(fail)?
            .ok_or_else(|| {
                ToolFailure::new(
                    "not_found",
                    format!(
                        "no such file or directory: {}",
                        crate::errors::sanitize(&args.path)
                    ),
                    false,
                )
            })?;
        match stat.kind() {
            EntryKind::File => {}
            EntryKind::Directory => {
                return Err(ToolFailure::new("is_a_directory", "is a directory", false))
            }
            _ => {
                return Err(ToolFailure::new(
                    "not_regular_file",
                    "not a regular file",
                    false,
                ))
            }
        }
        let size = stat.size_bytes().unwrap_or(0);
        let (bytes, truncated) = if size <= max {
            (
                entry
                    .sandbox
                    .read_file(&args.path, ".", max)
                    .await
                    .map_err(fail)?,
                false,
            )
        } else {
            (read_head(&*entry.sandbox, &args.path, max).await?, true)
        };
        let (content, encoding) = match String::from_utf8(bytes) {
            Ok(text) => (text, Encoding::Utf8),
            Err(e) => (
                base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
                Encoding::Base64,
            ),
        };
        Ok(Json(ReadResult {
            content,
            encoding,
            size,
            truncated,
        }))
    }

    /// Write a file in a sandbox (content as utf8 text, or base64 for any bytes); parent directories are made.
    #[tool(
        name = "sandbox_write_file",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<WriteResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let bytes = match args.encoding.unwrap_or(Encoding::Utf8) {
            Encoding::Utf8 => args.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(args.content.as_bytes())
                .map_err(|_| ToolFailure::invalid("content is not valid base64"))?,
        };
        if bytes.len() as u64 > self.shared.settings.max_file_bytes {
            return Err(ToolFailure::new(
                "over_cap",
                format!(
                    "the content is larger than the server allows ({} bytes)",
                    self.shared.settings.max_file_bytes
                ),
                false,
            ));
        }
        let (entry, _in_use) = self.open(&principal, &args.sandbox)?;
        entry
            .sandbox
            .write_file(&args.path, &bytes, ".")
            .await
            .map_err(|e| ToolFailure::from_sandbox(&e, Some(&args.path)))?;
        Ok(Json(WriteResult {
            path: args.path,
            size: bytes.len() as u64,
        }))
    }

    /// List one directory of a sandbox.
    #[tool(
        name = "sandbox_list_files",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ListFilesResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let path = args.path.unwrap_or_else(|| ".".to_owned());
        let (entry, _in_use) = self.open(&principal, &args.sandbox)?;
        let entries = entry
            .sandbox
            .list_dir(&path, ".")
            .await
            .map_err(|e| ToolFailure::from_sandbox(&e, Some(&path)))?;
        Ok(Json(ListFilesResult {
            entries: entries
                .into_iter()
                .map(|e| FileEntry {
                    path: e.path().to_owned(),
                    kind: e.kind().to_string(),
                    size: e.size_bytes(),
                })
                .collect(),
        }))
    }

    /// Delete a file (or, with recursive, a directory) in a sandbox.
    #[tool(
        name = "sandbox_delete",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandbox_delete(
        &self,
        Parameters(args): Parameters<DeleteArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<DeleteResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let (entry, _in_use) = self.open(&principal, &args.sandbox)?;
        entry
            .sandbox
            .remove(&args.path, ".", args.recursive.unwrap_or(false))
            .await
            .map_err(|e| ToolFailure::from_sandbox(&e, Some(&args.path)))?;
        Ok(Json(DeleteResult { deleted: args.path }))
    }

    /// List this caller's sandboxes.
    #[tool(
        name = "sandbox_list",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_list(
        &self,
        Parameters(_args): Parameters<ListArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ListResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let listed = self.shared.table().list(&principal);
        Ok(Json(ListResult {
            sandboxes: listed
                .into_iter()
                .map(|(handle, entry, left)| SandboxView {
                    sandbox: handle,
                    kind: entry.kind,
                    egress: egress_view(&entry.egress),
                    expires_in_s: left.as_secs(),
                })
                .collect(),
        }))
    }

    /// Dispose of a sandbox and everything in it. Disposing of one already gone succeeds.
    #[tool(
        name = "sandbox_dispose",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_dispose(
        &self,
        Parameters(args): Parameters<DisposeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<DisposeResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let entry = self.shared.table().remove(&principal, &args.sandbox);
        let Some(entry) = entry else {
            return Ok(Json(DisposeResult { disposed: false }));
        };
        if self.shared.router.dispose(&entry.key).await.is_some() {
            return Err(ToolFailure::new(
                "engine",
                "the sandbox could not be fully disposed of; the server will retry at its end",
                true,
            ));
        }
        Ok(Json(DisposeResult { disposed: true }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Create a sandbox with sandbox_create, run commands with sandbox_exec, move file contents with the file tools, dispose of it with sandbox_dispose.",
            )
    }
}

/// The first `max` bytes of a file larger than that, read in the guest (`head -c`).
async fn read_head(sandbox: &dyn Sandbox, path: &str, max: u64) -> Result<Vec<u8>, ToolFailure> {
    let request = ExecRequest::new(Command::argv([
        "head".to_owned(),
        "-c".to_owned(),
        max.to_string(),
        "--".to_owned(),
        path.to_owned(),
    ]))
    .timeout(Duration::from_secs(60))
    .max_output_bytes(max + 64 * 1024);
    let out = sandbox
        .exec(request)
        .await
        .map_err(|e| ToolFailure::from_sandbox(&e, Some(path)))?;
    if out.exit_code != 0 {
        return Err(ToolFailure::new(
            "guest_refused",
            "the file could not be read",
            false,
        ));
    }
    let mut bytes = out.stdout;
    bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    Ok(bytes)
}

/// Runs one exec to its end, a timeout, or cancellation, keeping a bounded head and tail of each
/// stream and sending progress when the client asked for it.
///
/// # Cancel safety and drop
/// Dropping the future (an HTTP request that went away) drops the stream: the backend kills
/// every process of the command as on its deadline, and the sandbox keeps serving.
pub async fn run_exec(
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    stdin: ExecStdin,
    keep: usize,
    progress: Option<(rmcp::model::ProgressToken, rmcp::Peer<RoleServer>)>,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<ExecResult, ToolFailure> {
    let started = Instant::now();
    let mut stdout = HeadTail::new(keep);
    let mut stderr = HeadTail::new(keep);
    let mut last = LastLine::default();
    let mut stream = tokio::select! {
        s = sandbox.exec_stream(request, stdin) => s.map_err(|e| ToolFailure::from_sandbox(&e, None))?,
        () = cancel.cancelled() => return Err(ToolFailure::cancelled()),
    };
    let period = Duration::from_secs(1);
    let mut ticker = tokio::time::interval_at(started + period, period);
    let mut sent = 0u32;
    let (exit_code, timed_out) = loop {
        tokio::select! {
            () = cancel.cancelled() => {
                drop(stream);
                return Err(ToolFailure::cancelled());
            }
            event = stream.next() => match event {
                Some(Ok(ExecEvent::Output(ExecChunk::Stdout(bytes)))) => {
                    stdout.push(&bytes);
                    last.push(&bytes);
                }
                Some(Ok(ExecEvent::Output(ExecChunk::Stderr(bytes)))) => {
                    stderr.push(&bytes);
                    last.push(&bytes);
                }
                Some(Ok(ExecEvent::Exit(exit))) => {
                    if exit.not_started.is_some() {
                        // The guest's reason may name its own paths; the model gets the kind.
                        return Err(ToolFailure::new(
                            "workdir_unusable",
                            "the working directory is missing or cannot be entered",
                            false,
                        ));
                    }
                    break (Some(exit.exit_code), false);
                }
                Some(Err(e)) if e.kind() == sandbox_core::ErrorKind::Timeout => break (None, true),
                Some(Err(e)) => return Err(ToolFailure::from_sandbox(&e, None)),
                None => return Err(ToolFailure::from_sandbox(&SandboxError::engine("stream ended"), None)),
            },
            _ = ticker.tick(), if progress.is_some() => {
                if let Some((token, peer)) = &progress {
                    sent += 1;
                    let mut note = ProgressNotificationParam::new(token.clone(), f64::from(sent));
                    if let Some(line) = last.latest() {
                        note = note.with_message(line);
                    }
                    // A client that cannot take a notification still gets its result.
                    let _ = peer.notify_progress(note).await;
                }
            }
        }
    };
    Ok(ExecResult {
        exit_code,
        timed_out,
        stdout: stdout.text(),
        stderr: stderr.text(),
        stdout_truncated: stdout.truncated(),
        stderr_truncated: stderr.truncated(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}
