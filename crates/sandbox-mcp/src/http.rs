//! Streamable HTTP: rmcp's service behind a bearer check.
//!
//! Every request must carry `Authorization: Bearer TOKEN` with a token of the token file; one
//! without gets 401 before anything else runs (no session, no tool, no engine call). The token's
//! principal travels in the request's extensions to the tools, which bind handles to it. The
//! `Host` and `Origin` checks (against DNS rebinding and browser pages) are rmcp's own, given
//! the bound address and the configured origins.
//!
//! A session (`Mcp-Session-Id`) belongs to the principal whose `initialize` opened it. A request
//! that names a session its principal did not open, another's or one never made, is answered 404
//! as an unknown session before rmcp sees it: it cannot post into the session (a call, a
//! cancellation), open its stream or end it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

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

/// Serves `/mcp` on `listener` until `stop` is cancelled.
///
/// # Errors
/// The listener's I/O failure.
///
/// # Cancel safety and drop
/// Dropping the future stops serving; in-flight tool calls are dropped, which kills their
/// commands.
pub async fn serve(
    shared: Arc<Shared>,
    tokens: Tokens,
    listener: tokio::net::TcpListener,
    allowed_origins: Vec<String>,
    extra_hosts: Vec<String>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let mut hosts = vec![
        addr.to_string(),
        format!("localhost:{}", addr.port()),
        addr.ip().to_string(),
        "localhost".to_owned(),
    ];
    hosts.extend(extra_hosts);
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
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
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
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
