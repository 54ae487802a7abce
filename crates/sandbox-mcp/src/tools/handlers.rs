//! The tool handlers: one method per tool on [`SandboxServer`], the MCP service of one
//! connection, and what it tells the client about itself.

use std::sync::Arc;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CustomRequest, CustomResult, Implementation, ServerCapabilities, ServerConfig, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use sandbox_core::{Egress, EntryKind, SandboxError, SandboxSpec};

use super::exec::{run_exec, ExecCall};
use super::messages::{
    CreateArgs, CreateResult, DeleteArgs, DeleteResult, DisposeArgs, DisposeResult, EgressView,
    Encoding, ExecArgs, ExecResult, FileEntry, ForkArgs, ForkResult, ListArgs, ListFilesArgs,
    ListFilesResult, ListResult, ReadArgs, ReadResult, ResetArgs, ResetResult, SandboxView,
    WriteArgs, WriteResult,
};
use super::shared::Shared;
use crate::errors::ToolFailure;
use crate::handles::Principal;

/// The principal an HTTP request authenticated as, put in the request's extensions by the
/// bearer check; tools read it from there and nowhere else.
#[derive(Debug, Clone)]
pub struct HttpPrincipal(pub Principal);

/// The MCP service: one per connection, all sharing one [`Shared`].
#[derive(Debug, Clone)]
pub struct SandboxServer {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Self>,
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

/// `sandbox_write_file`'s description, with the server's own limits: the file size, and the
/// request size the transport accepts (derived from it, so a file within the limit always fits
/// as base64).
fn write_description(settings: &super::Settings) -> String {
    format!(
        "Write a file in a sandbox (content as utf8 text, or base64 for any bytes); parent directories are made. The file may be at most {} bytes. The whole request may be at most {} bytes, which any file within the limit fits as base64; text that JSON must escape heavily (control characters) is safer sent as base64.",
        settings.max_file_bytes, settings.max_request_bytes
    )
}

/// A file tool's working directory: the one given, or the sandbox's work directory. The
/// backend resolves and confines it exactly as it does `sandbox_exec`'s.
fn workdir(given: Option<&str>) -> &str {
    given.unwrap_or(".")
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

#[tool_router]
impl SandboxServer {
    /// A service over `shared`; the exec tool's open-world hint follows the server's egress.
    pub fn new(shared: Arc<Shared>) -> Self {
        let mut tool_router = Self::tool_router();
        let open = !shared.settings().allow_hosts.is_empty();
        if let Some(route) = tool_router.map.get_mut("sandbox_exec") {
            route.attr.annotations = Some(
                ToolAnnotations::new()
                    .read_only(false)
                    .destructive(true)
                    .idempotent(false)
                    .open_world(open),
            );
        }
        let settings = shared.settings();
        if let Some(route) = tool_router.map.get_mut("sandbox_write_file") {
            route.attr.description = Some(write_description(settings).into());
        }
        if let Some(route) = tool_router.map.get_mut("sandbox_read_file") {
            route.attr.description = Some(
                format!(
                    "Read a file from a sandbox. Text comes back as utf8, other bytes as base64. At most {} bytes are returned (the server's limit); a larger file is cut and flagged truncated.",
                    settings.max_file_bytes
                )
                .into(),
            );
        }
        // Listed only where they work: a backend without snapshots offers neither.
        if !shared.snapshots() {
            tool_router.remove_route("sandbox_reset");
            tool_router.remove_route("sandbox_fork");
        }
        SandboxServer {
            shared,
            tool_router,
        }
    }

    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, ToolFailure> {
        if !self.shared.settings().http {
            return Ok(Principal::from(self.shared.settings().agent.as_str()));
        }
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<HttpPrincipal>())
            .map(|p| p.0.clone())
            // The bearer check runs before every request; a request without a principal never
            // reaches a tool, and if one did it would own nothing.
            .ok_or_else(ToolFailure::unknown_sandbox)
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
        let server_hosts = &self.shared.settings().allow_hosts;
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
        if let Some(image) = &self.shared.settings().image {
            spec = spec.image(image.clone());
        }
        if !hosts.is_empty() {
            // The operator's rules narrow the hosts kept, its grants go with them; the model
            // chose neither.
            let (entries, grants) = self
                .shared
                .settings()
                .egress
                .for_hosts(&hosts)
                .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
            spec = spec.egress(Egress::Allowlist);
            for entry in entries {
                spec = spec.allow(entry);
            }
            for grant in grants {
                spec = spec.credential(grant);
            }
        }
        let spec = spec
            .build()
            .map_err(|e| ToolFailure::from_sandbox(&e, None))?;
        let (handle, ttl) = self.shared.create(principal, spec, hosts.clone()).await?;
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
        let call = ExecCall::new(args, self.shared.settings())?;
        let (entry, _in_use) = self.shared.open(&principal, &call.sandbox)?;
        let progress = ctx.meta.get_progress_token();
        let started = tokio::time::Instant::now();
        let mut result = run_exec(
            &*entry.sandbox,
            call.request,
            call.stdin,
            call.keep,
            progress.map(|token| (token, ctx.peer.clone())),
            ctx.ct.clone(),
        )
        .await?;
        // An allowlist sandbox's refusals arrive from its proxy's log moments after the command.
        if !entry.egress.is_empty() {
            tokio::time::sleep(crate::egress_log::SETTLE).await;
            result.egress_denied = self
                .shared
                .egress_log()
                .denied_since(entry.sandbox.instance_id(), started);
        }
        Ok(Json(result))
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
            Some(n) => n.min(self.shared.settings().max_file_bytes),
            None => self.shared.settings().max_file_bytes,
        };
        let wd = workdir(args.workdir.as_deref());
        let (entry, _in_use) = self.shared.open(&principal, &args.sandbox)?;
        let fail = |e: SandboxError| ToolFailure::from_sandbox(&e, Some(&args.path));
        let stat = entry
            .sandbox
            .stat_file(&args.path, wd)
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
                    .read_file(&args.path, wd, max)
                    .await
                    .map_err(fail)?,
                false,
            )
        } else {
            (
                entry
                    .sandbox
                    .read_head(&args.path, wd, max)
                    .await
                    .map_err(fail)?,
                true,
            )
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
        if bytes.len() as u64 > self.shared.settings().max_file_bytes {
            return Err(ToolFailure::new(
                "over_cap",
                format!(
                    "the content is larger than the server allows ({} bytes)",
                    self.shared.settings().max_file_bytes
                ),
                false,
            ));
        }
        let wd = workdir(args.workdir.as_deref());
        let (entry, _in_use) = self.shared.open(&principal, &args.sandbox)?;
        entry
            .sandbox
            .write_file(&args.path, &bytes, wd)
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
        let wd = workdir(args.workdir.as_deref());
        let (entry, _in_use) = self.shared.open(&principal, &args.sandbox)?;
        let entries = entry
            .sandbox
            .list_dir(&path, wd)
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
        let wd = workdir(args.workdir.as_deref());
        let (entry, _in_use) = self.shared.open(&principal, &args.sandbox)?;
        entry
            .sandbox
            .remove(&args.path, wd, args.recursive.unwrap_or(false))
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
                    kind: entry.spec.kind().to_owned(),
                    egress: egress_view(&entry.egress),
                    expires_in_s: left.as_secs(),
                })
                .collect(),
        }))
    }

    /// Dispose of a sandbox and everything in it. Disposing of one already gone succeeds; after a failed disposal, calling again retries it.
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
        let disposed = self.shared.dispose(&principal, &args.sandbox).await?;
        Ok(Json(DisposeResult { disposed }))
    }

    /// Return a sandbox to its state when it was created: every file and process made since is gone. The handle stays the same.
    #[tool(
        name = "sandbox_reset",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_reset(
        &self,
        Parameters(args): Parameters<ResetArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ResetResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        self.shared.reset(&principal, &args.sandbox).await?;
        Ok(Json(ResetResult {
            sandbox: args.sandbox,
            reset: true,
        }))
    }

    /// Copy a sandbox's files into a new sandbox and return the new handle (running processes are not copied). The two change independently afterwards; the new one counts against your limit on sandboxes.
    #[tool(
        name = "sandbox_fork",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandbox_fork(
        &self,
        Parameters(args): Parameters<ForkArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ForkResult>, ToolFailure> {
        let principal = self.principal(&ctx)?;
        let egress = {
            let (entry, _in_use) = self.shared.open(&principal, &args.sandbox)?;
            entry.egress
        };
        let (handle, ttl) = self.shared.fork(principal, &args.sandbox).await?;
        Ok(Json(ForkResult {
            sandbox: handle,
            forked_from: args.sandbox,
            isolation: self.shared.isolation().to_string(),
            egress: egress_view(&egress),
            expires_in_s: ttl.as_secs(),
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    /// The stand-in for a stdio request over the line limit ([`crate::stdio`]) is answered with
    /// the error that names the limit; any other method is unknown.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, rmcp::ErrorData> {
        if request.method == crate::stdio::TOO_LARGE_METHOD {
            let limit = request
                .params
                .as_ref()
                .and_then(|p| p.get("limit"))
                .and_then(serde_json::Value::as_u64);
            return Err(crate::stdio::too_large(limit));
        }
        Err(rmcp::ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            request.method,
            None,
        ))
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Create a sandbox with sandbox_create, run commands with sandbox_exec, move file contents with the file tools, dispose of it with sandbox_dispose.",
            )
    }
}
