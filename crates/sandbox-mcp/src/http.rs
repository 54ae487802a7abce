//! Streamable HTTP: rmcp's service behind a bearer check.
//!
//! Every request must carry `Authorization: Bearer TOKEN` with a token of the token file; one
//! without gets 401 before anything else runs (no session, no tool, no engine call). The token's
//! principal travels in the request's extensions to the tools, which bind handles to it. The
//! `Host` and `Origin` checks (against DNS rebinding and browser pages) are rmcp's own, given
//! the bound address and the configured origins.
//!
//! Connections are bounded before any request runs ([`HttpLimits`]): a connection that has not
//! yet sent a request with a valid token counts against a cap on unauthenticated connections,
//! and one past the cap is closed as soon as it is accepted; a request's headers must arrive
//! within the header timeout; a connection with no request in progress for the idle timeout is
//! closed (a response still streaming, such as a long call's event stream, is a request in
//! progress). So a peer without a token holds at most the cap's descriptors, for a bounded time,
//! and the authenticated principals are still served. Request bodies are capped at the size a
//! file of `--max-file-bytes` needs as base64 ([`crate::config::request_bytes_for`]).
//!
//! A session (`Mcp-Session-Id`) belongs to the principal whose `initialize` opened it. A request
//! that names a session its principal did not open, another's or one never made, is answered 404
//! as an unknown session before rmcp sees it: it cannot post into the session (a call, a
//! cancellation), open its stream or end it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use crate::config::HttpLimits;
use crate::handles::Principal;
use crate::tools::{HttpPrincipal, SandboxServer, Shared};

/// Why the token file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// It could not be read.
    #[error("the token file cannot be read: {0}")]
    Read(std::io::Error),
    /// A line is not `TOKEN PRINCIPAL`, or a token is too short, or a principal malformed.
    #[error("token file line {line}: {reason}")]
    Line {
        /// 1-based.
        line: usize,
        /// What is wrong (never the token itself).
        reason: &'static str,
    },
    /// No token at all.
    #[error("the token file holds no token")]
    Empty,
}

/// The shortest token accepted: 128 bits written as hex.
const MIN_TOKEN_LEN: usize = 32;

/// Token to principal.
#[derive(Debug, Clone, Default)]
pub struct Tokens(HashMap<String, Principal>);

impl Tokens {
    /// Reads `TOKEN PRINCIPAL` lines; blank lines and lines starting with `#` are skipped.
    ///
    /// # Errors
    /// As [`TokenFileError`].
    pub fn read(path: &Path) -> Result<Self, TokenFileError> {
        Self::parse(&std::fs::read_to_string(path).map_err(TokenFileError::Read)?)
    }

    /// Parses the token file's text.
    ///
    /// # Errors
    /// As [`TokenFileError`].
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut map = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason| TokenFileError::Line {
                line: i + 1,
                reason,
            };
            let mut words = line.split_whitespace();
            let (Some(token), Some(principal), None) = (words.next(), words.next(), words.next())
            else {
                return Err(bad("expected TOKEN PRINCIPAL"));
            };
            if token.len() < MIN_TOKEN_LEN {
                return Err(bad("a token must be at least 32 characters"));
            }
            let ok = principal.len() <= 64
                && principal
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(bad(
                    "a principal is 1 to 64 letters, digits, '-', '_' or '.'",
                ));
            }
            map.insert(token.to_owned(), Principal::from(principal));
        }
        if map.is_empty() {
            return Err(TokenFileError::Empty);
        }
        Ok(Tokens(map))
    }

    /// The principal of a request's `Authorization` header value.
    pub fn principal(&self, authorization: Option<&str>) -> Option<Principal> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        // Compare every token in full so the time taken does not say how much of one matched.
        let mut found = None;
        for (known, principal) in &self.0 {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(principal.clone());
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn bearer(State(tokens): State<Arc<Tokens>>, mut request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match tokens.principal(header) {
        Some(principal) => {
            if let Some(ConnectionRef(connection)) = request.extensions().get::<ConnectionRef>() {
                connection.authenticated();
            }
            request.extensions_mut().insert(HttpPrincipal(principal));
            next.run(request).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "a valid bearer token is required\n",
        )
            .into_response(),
    }
}

/// Which principal opened each live session.
struct SessionOwners {
    owners: Mutex<HashMap<String, Principal>>,
    /// rmcp's sessions, asked which of the remembered ones still exist.
    sessions: Arc<LocalSessionManager>,
}

impl SessionOwners {
    fn new(sessions: Arc<LocalSessionManager>) -> Self {
        SessionOwners {
            owners: Mutex::new(HashMap::new()),
            sessions,
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Principal>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_owner(&self, session: &str, principal: &str) -> bool {
        self.owners()
            .get(session)
            .is_some_and(|owner| **owner == *principal)
    }

    /// Binds a session rmcp has just opened to `principal`, and forgets the sessions rmcp has
    /// ended on its own since (idle ones), so the map holds only live sessions.
    async fn bind(&self, session: String, principal: Principal) {
        let known: Vec<String> = self.owners().keys().cloned().collect();
        let mut ended = Vec::new();
        for id in known {
            if let Ok(false) = self.sessions.has_session(&Arc::from(id.as_str())).await {
                ended.push(id);
            }
        }
        let mut owners = self.owners();
        for id in ended {
            owners.remove(&id);
        }
        owners.insert(session, principal);
    }

    fn forget(&self, session: &str) {
        self.owners().remove(session);
    }
}

/// rmcp's answer to a request that names a session it does not have.
fn unknown_session() -> Response {
    let mut response = Response::new(Body::from("Not Found: Session not found"));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Lets a request into a session only when its principal opened that session, and binds a new
/// session to the principal whose `initialize` opened it.
async fn owned_session(
    State(owners): State<Arc<SessionOwners>>,
    request: Request,
    next: Next,
) -> Response {
    // The bearer check ran first; without a principal nothing is anyone's.
    let Some(HttpPrincipal(principal)) = request.extensions().get::<HttpPrincipal>().cloned()
    else {
        return unknown_session();
    };
    let Some(session) = request.headers().get(HEADER_SESSION_ID) else {
        let response = next.run(request).await;
        if let Some(opened) = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            owners.bind(opened.to_owned(), principal).await;
        }
        return response;
    };
    let Some(session) = session
        .to_str()
        .ok()
        .filter(|id| owners.is_owner(id, &principal))
        .map(str::to_owned)
    else {
        return unknown_session();
    };
    let ends = request.method() == Method::DELETE;
    let response = next.run(request).await;
    if response.status() == StatusCode::NOT_FOUND || (ends && response.status().is_success()) {
        owners.forget(&session);
    }
    response
}

/// One accepted connection's standing.
#[derive(Debug)]
struct Connection {
    /// Its place among the unauthenticated connections, held until a request on it carries a
    /// valid token.
    unauthenticated: Mutex<Option<OwnedSemaphorePermit>>,
    /// Requests in progress, their responses' bodies included.
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection opened).
    idle_since: Mutex<Instant>,
}

impl Connection {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        Connection {
            unauthenticated: Mutex::new(Some(permit)),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    /// A request on it carried a valid token: it no longer counts against the cap.
    fn authenticated(&self) {
        self.unauthenticated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// How long it has had no request in progress; zero while one is.
    fn idle_for(&self) -> std::time::Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return std::time::Duration::ZERO;
        }
        self.idle_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

/// The connection a request arrived on, in the request's extensions for the bearer check.
#[derive(Debug, Clone)]
struct ConnectionRef(Arc<Connection>);

/// One request in progress on a connection, until its response body is done or dropped.
#[derive(Debug)]
struct InFlight(Arc<Connection>);

impl InFlight {
    fn begin(connection: &Arc<Connection>) -> Self {
        connection.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(connection.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request in progress until it ends.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The `Host` headers a server bound to `addr` accepts: its address and `localhost`, each on
/// the bound port only, and the operator's own.
fn allowed_hosts(addr: SocketAddr, extra: Vec<String>) -> Vec<String> {
    let mut hosts = vec![addr.to_string(), format!("localhost:{}", addr.port())];
    if addr.ip().is_unspecified() {
        // Bound to every interface: the loopback addresses name it too.
        hosts.push(format!("127.0.0.1:{}", addr.port()));
        hosts.push(format!("[::1]:{}", addr.port()));
    }
    hosts.extend(extra);
    hosts
}

/// Serves `/mcp` on `listener` until `stop` is cancelled, within `limits`.
///
/// # Errors
/// The listener's I/O failure.
///
/// # Cancel safety and drop
/// Dropping the future stops accepting; the connections already open end with `stop` (their
/// tool calls are dropped, which kills their commands).
pub async fn serve(
    shared: Arc<Shared>,
    tokens: Tokens,
    listener: tokio::net::TcpListener,
    allowed_origins: Vec<String>,
    extra_hosts: Vec<String>,
    limits: HttpLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts(addr, extra_hosts))
        .with_max_request_body_bytes(limits.max_request_bytes)
        .with_cancellation_token(stop.child_token());
    config = if allowed_origins.is_empty() {
        config.enforce_origin_validation()
    } else {
        config.with_allowed_origins(allowed_origins)
    };
    let sessions = Arc::new(LocalSessionManager::default());
    let owners = Arc::new(SessionOwners::new(sessions.clone()));
    let service = StreamableHttpService::new(
        move || Ok(SandboxServer::new(shared.clone())),
        sessions,
        config,
    );
    // The last layer runs first: the bearer check, then the session's owner.
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(owners, owned_session))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(tokens),
            bearer,
        ));
    let unauthenticated = Arc::new(Semaphore::new(limits.max_unauthenticated));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return Ok(()),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener itself is fine; pause so a full table is not spun on.
                tracing::debug!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Past the cap, the connection is closed before anything of it is read.
        let Ok(permit) = unauthenticated.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let connection = Arc::new(Connection::new(permit));
        tokio::spawn(serve_connection(
            stream,
            app.clone(),
            connection,
            limits,
            stop.clone(),
        ));
    }
}

/// Serves one connection until its client closes it, it stays idle past the limit, or `stop`.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    app: axum::Router,
    connection: Arc<Connection>,
    limits: HttpLimits,
    stop: CancellationToken,
) {
    let service = {
        let connection = connection.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            let in_flight = InFlight::begin(&connection);
            request
                .extensions_mut()
                .insert(ConnectionRef(connection.clone()));
            let mut app = app.clone();
            async move {
                let response =
                    tower_service::Service::call(&mut app, request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                    body,
                    _in_flight: in_flight,
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let served = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(served);
    let tick = (limits.idle_timeout / 4).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    );
    loop {
        tokio::select! {
            _ = served.as_mut() => return,
            () = tokio::time::sleep(tick) => {
                // Idle past the limit: dropping the connection closes it (nothing is in
                // progress on it).
                if connection.idle_for() >= limits.idle_timeout {
                    return;
                }
            }
            () = stop.cancelled() => {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), served.as_mut()).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn tokens_name_their_principal_and_nothing_else_does() {
        let tokens = Tokens::parse(&format!("# comment\n{A} alice\n\n{B} bob\n")).unwrap();
        assert_eq!(
            tokens.principal(Some(&format!("Bearer {A}"))).as_deref(),
            Some("alice")
        );
        assert_eq!(
            tokens.principal(Some(&format!("Bearer {B}"))).as_deref(),
            Some("bob")
        );
        assert!(tokens.principal(None).is_none());
        assert!(tokens.principal(Some(A)).is_none(), "no Bearer scheme");
        assert!(tokens
            .principal(Some(&format!("Bearer {}", &A[1..])))
            .is_none());
        assert!(tokens.principal(Some("Bearer ")).is_none());
    }

    #[test]
    fn malformed_token_files_are_refused_without_echoing_tokens() {
        for text in [
            "",
            "# only\n",
            "short alice\n",
            &format!("{A}\n"),
            &format!("{A} al ice\n"),
            &format!("{A} a/b\n"),
        ] {
            let err = Tokens::parse(text).unwrap_err();
            assert!(!err.to_string().contains(A), "{err}");
        }
    }
}
