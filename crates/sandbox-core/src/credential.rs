//! Credential grants and egress decisions: the vocabulary of an egress proxy that knows HTTP.
//!
//! A [`CredentialGrant`] lets a sandbox's requests to one origin (exact host and port), for some
//! methods and paths, carry a bearer token the guest never sees: a backend that declares
//! `egress_methods` and `egress_paths` hands the grant to the component that enforces egress
//! outside the guest, which adds the token to matching requests only and stops at the grant's
//! expiry. A grant is attached at acquire ([`crate::SandboxSpecBuilder::credential`]), for that
//! key's sandbox only.
//!
//! Every decision of that component is an [`EgressEvent`], handed to an [`EgressObserver`] the
//! host registers with the backend. An event says whether a credential was applied, never which.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use sandbox_core::credential::{BearerToken, CredentialGrant};
//!
//! let token = BearerToken::new("s3cr3t-t0ken").unwrap();
//! assert_eq!(format!("{token:?}"), "BearerToken(<hidden>)");
//! let grant = CredentialGrant::new(
//!     "api.example.com",
//!     443,
//!     Some(vec!["GET".into()]),
//!     vec!["/v1/*".into()],
//!     token,
//!     SystemTime::now() + Duration::from_secs(600),
//! )
//! .unwrap();
//! assert!(!format!("{grant:?}").contains("s3cr3t"));
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::egress::{validate_host, validate_method, validate_path};
use crate::SandboxError;

/// The longest token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 8192;

/// A bearer token. Its value is never printed: `Debug` hides it and there is no `Display`; only
/// [`reveal`](Self::reveal) gives it, for the one component that sends it upstream.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BearerToken(String);

impl BearerToken {
    /// Takes a token of RFC 6750's `b64token` characters (letters, digits, `-._~+/`, then `=`
    /// padding), at most [`MAX_TOKEN_LEN`] bytes, so it can never break a header line.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] that never quotes the token.
    pub fn new(token: impl Into<String>) -> Result<BearerToken, SandboxError> {
        let token = token.into();
        if token.len() > MAX_TOKEN_LEN {
            return Err(refused_token("longer than 8192 bytes"));
        }
        let body = token.trim_end_matches('=');
        if body.is_empty() {
            return Err(refused_token("empty"));
        }
        if !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
        {
            return Err(refused_token(
                "has characters outside RFC 6750's b64token (letters, digits, -._~+/ and = padding)",
            ));
        }
        Ok(BearerToken(token))
    }

    /// The token's value. Callers send it to the enforcing component over a channel the guest
    /// cannot read, and print it nowhere.
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

#[cold]
fn refused_token(why: &str) -> SandboxError {
    SandboxError::invalid(format!("credential token: {why} (the value is not shown)"))
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<hidden>)")
    }
}

/// One credential grant: requests to `host:port` whose method and normalised path it names carry
/// `Authorization: Bearer <token>` until `expires`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CredentialGrant {
    host: String,
    port: u16,
    methods: Option<Vec<String>>,
    paths: Vec<String>,
    token: BearerToken,
    expires: SystemTime,
}

impl CredentialGrant {
    /// A validated grant. `host` is one exact host name (no `*.`), stored in lower case; `port`
    /// is 1..=65535; `methods` `None` for every method, else a non-empty list of upper-case
    /// tokens without repeats; `paths` a non-empty list of path prefixes in the allowlist's
    /// grammar (`/exact` or `/prefix/*`), without repeats; `expires` at or after the epoch.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] naming the field at fault, never quoting the token.
    pub fn new(
        host: impl Into<String>,
        port: u16,
        methods: Option<Vec<String>>,
        paths: Vec<String>,
        token: BearerToken,
        expires: SystemTime,
    ) -> Result<CredentialGrant, SandboxError> {
        let host = host.into();
        if host.starts_with("*.") {
            return Err(SandboxError::invalid(format!(
                "credential grant for {host:?}: a grant names one exact host, not a wildcard"
            )));
        }
        validate_host(&host)?;
        if port == 0 {
            return Err(SandboxError::invalid(format!(
                "credential grant for {host:?}: port 0 is not a destination port"
            )));
        }
        if let Some(methods) = &methods {
            no_repeats(&host, "methods", methods)?;
            methods.iter().try_for_each(|m| validate_method(m))?;
        }
        no_repeats(&host, "paths", &paths)?;
        paths.iter().try_for_each(|p| validate_path(p))?;
        if expires.duration_since(SystemTime::UNIX_EPOCH).is_err() {
            return Err(SandboxError::invalid(format!(
                "credential grant for {host:?}: expires before the epoch"
            )));
        }
        Ok(CredentialGrant {
            host: host.to_ascii_lowercase(),
            port,
            methods,
            paths,
            token,
            expires,
        })
    }

    /// The exact host, lower case.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The methods, `None` for every method.
    pub fn methods(&self) -> Option<&[String]> {
        self.methods.as_deref()
    }

    /// The path prefixes.
    pub fn paths(&self) -> &[String] {
        &self.paths
    }

    /// The token.
    pub fn token(&self) -> &BearerToken {
        &self.token
    }

    /// When the grant stops applying.
    pub fn expires(&self) -> SystemTime {
        self.expires
    }

    /// Seconds since the epoch of [`expires`](Self::expires), rounded down (a grant never
    /// outlives its deadline).
    pub fn expires_unix(&self) -> u64 {
        self.expires
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// Whether the grant no longer applies at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        now >= self.expires
    }
}

fn no_repeats(host: &str, what: &str, items: &[String]) -> Result<(), SandboxError> {
    if items.is_empty() {
        return Err(SandboxError::invalid(format!(
            "credential grant for {host:?}: empty {what} list"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = items.iter().find(|item| !seen.insert(*item)) {
        return Err(SandboxError::invalid(format!(
            "credential grant for {host:?}: {what} list names {twice:?} twice"
        )));
    }
    Ok(())
}

/// One egress decision, as the enforcing component made it. It says whether a credential was
/// applied, never the credential.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressEvent {
    /// The engine's identifier of the sandbox whose request it was.
    pub sandbox: String,
    /// Allowed (true) or refused.
    pub allowed: bool,
    /// The requested host, when the request was read that far.
    pub host: Option<String>,
    /// The requested port.
    pub port: Option<u16>,
    /// The request's method.
    pub method: Option<String>,
    /// The normalised path, for a request judged by method and path rules or grants.
    pub path: Option<String>,
    /// The rule that allowed it, as written.
    pub rule: Option<String>,
    /// Why: the refusal's one-line reason, or how it was allowed.
    pub reason: String,
    /// Request body bytes sent upstream, when known.
    pub bytes_up: Option<u64>,
    /// Response bytes sent back to the guest, when known.
    pub bytes_down: Option<u64>,
    /// How long the exchange took, when known.
    pub duration: Option<Duration>,
    /// Whether a credential grant's token was added to the request.
    pub credential_applied: bool,
}

impl EgressEvent {
    /// `host:port` (or the host alone, or `?`), for a one-line summary.
    pub fn destination(&self) -> String {
        match (&self.host, self.port) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.clone(),
            (None, _) => "?".to_owned(),
        }
    }
}

impl fmt::Display for EgressEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.allowed { "allow" } else { "deny" })?;
        if let Some(method) = &self.method {
            write!(f, " {method}")?;
        }
        write!(f, " {}", self.destination())?;
        if let Some(path) = &self.path {
            f.write_str(path)?;
        }
        if self.credential_applied {
            f.write_str(" (credential applied)")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// A callback a host registers with a backend to see every egress decision of its sandboxes.
/// It is called on the backend's tasks: it must return quickly and never block.
#[derive(Clone)]
pub struct EgressObserver(Arc<dyn Fn(&EgressEvent) + Send + Sync>);

impl EgressObserver {
    /// Wraps `callback`.
    pub fn new(callback: impl Fn(&EgressEvent) + Send + Sync + 'static) -> EgressObserver {
        EgressObserver(Arc::new(callback))
    }

    /// Tells the callback of `event`.
    pub fn notify(&self, event: &EgressEvent) {
        (self.0)(event);
    }
}

impl fmt::Debug for EgressObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EgressObserver")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn later() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000)
    }

    fn grant(
        host: &str,
        port: u16,
        methods: Option<Vec<&str>>,
        paths: Vec<&str>,
    ) -> Result<CredentialGrant, SandboxError> {
        CredentialGrant::new(
            host,
            port,
            methods.map(|m| m.into_iter().map(str::to_owned).collect()),
            paths.into_iter().map(str::to_owned).collect(),
            BearerToken::new("tok-SECRET").unwrap(),
            later(),
        )
    }

    #[test]
    fn tokens_are_b64token_and_never_printed() {
        for good in [
            "a",
            "abc.DEF-123_~+/",
            "dG9rZW4=",
            "x==",
            &"t".repeat(MAX_TOKEN_LEN),
        ] {
            let token = BearerToken::new(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
            assert_eq!(token.reveal(), good);
            assert_eq!(format!("{token:?}"), "BearerToken(<hidden>)");
            assert_eq!(format!("{token:#?}"), "BearerToken(<hidden>)");
        }
        for bad in [
            "",
            "=",
            "==",
            "a b",
            "a\r\nX-Evil: 1",
            "a\nb",
            "a=b",
            "tök",
            "a,b",
            "a\"b",
            &"t".repeat(MAX_TOKEN_LEN + 1),
        ] {
            let error = BearerToken::new(bad).expect_err(bad);
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
            let text = error.to_string();
            assert!(text.contains("not shown"), "{text}");
            if bad.len() > 2 {
                assert!(!text.contains(bad), "{text} quotes the token");
            }
        }
    }

    #[test]
    fn grants_are_validated_and_hide_their_token() {
        let g = grant(
            "API.Example.com",
            443,
            Some(vec!["GET", "POST"]),
            vec!["/v1/*"],
        )
        .unwrap();
        assert_eq!(g.host(), "api.example.com");
        assert_eq!(g.port(), 443);
        assert_eq!(
            g.methods(),
            Some(&["GET".to_owned(), "POST".to_owned()][..])
        );
        assert_eq!(g.paths(), &["/v1/*".to_owned()]);
        assert_eq!(g.token().reveal(), "tok-SECRET");
        assert_eq!(g.expires(), later());
        assert_eq!(g.expires_unix(), 2_000_000_000);
        let shown = format!("{g:?} {g:#?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("<hidden>"), "{shown}");
        assert_eq!(grant("a.com", 1, None, vec!["/"]).unwrap().methods(), None);

        for (bad, needle) in [
            (grant("*.example.com", 443, None, vec!["/"]), "exact host"),
            (grant("10.0.0.1", 443, None, vec!["/"]), "numeric"),
            (grant("a.com", 0, None, vec!["/"]), "port 0"),
            (
                grant("a.com", 443, Some(vec![]), vec!["/"]),
                "empty methods",
            ),
            (
                grant("a.com", 443, Some(vec!["GET", "GET"]), vec!["/"]),
                "twice",
            ),
            (
                grant("a.com", 443, Some(vec!["get"]), vec!["/"]),
                "upper case",
            ),
            (grant("a.com", 443, None, vec![]), "empty paths"),
            (grant("a.com", 443, None, vec!["/a", "/a"]), "twice"),
            (grant("a.com", 443, None, vec!["/a/../b"]), "`..`"),
            (grant("a.com", 443, None, vec!["v1"]), "start with"),
        ] {
            let text = bad.expect_err(needle).to_string();
            assert!(text.contains(needle), "{text} lacks {needle}");
        }
        let before_epoch = CredentialGrant::new(
            "a.com",
            443,
            None,
            vec!["/".into()],
            BearerToken::new("t").unwrap(),
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
        );
        assert!(before_epoch.unwrap_err().to_string().contains("epoch"));
    }

    #[test]
    fn a_grant_expires_at_its_deadline() {
        let g = grant("a.com", 443, None, vec!["/"]).unwrap();
        let deadline = g.expires();
        assert!(!g.is_expired(deadline - Duration::from_nanos(1)));
        assert!(g.is_expired(deadline));
        assert!(g.is_expired(deadline + Duration::from_secs(1)));
        let fractional = CredentialGrant::new(
            "a.com",
            443,
            None,
            vec!["/".into()],
            BearerToken::new("t").unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_millis(10_999),
        )
        .unwrap();
        assert_eq!(fractional.expires_unix(), 10, "rounded down, never later");
    }

    #[test]
    fn events_summarise_in_one_line_and_reach_the_observer() {
        let event = EgressEvent {
            sandbox: "c1".into(),
            allowed: false,
            host: Some("api.example.com".into()),
            port: Some(443),
            method: Some("GET".into()),
            path: Some("/admin".into()),
            reason: "GET /admin matches no rule".into(),
            ..EgressEvent::default()
        };
        assert_eq!(
            event.to_string(),
            "deny GET api.example.com:443/admin: GET /admin matches no rule"
        );
        let allowed = EgressEvent {
            allowed: true,
            host: Some("a.com".into()),
            credential_applied: true,
            reason: "terminated".into(),
            ..EgressEvent::default()
        };
        assert_eq!(
            allowed.to_string(),
            "allow a.com (credential applied): terminated"
        );
        assert_eq!(EgressEvent::default().destination(), "?");

        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let observer = EgressObserver::new(move |e: &EgressEvent| {
            sink.lock().unwrap().push(e.clone());
        });
        assert_eq!(format!("{observer:?}"), "EgressObserver");
        observer.clone().notify(&event);
        observer.notify(&allowed);
        assert_eq!(*seen.lock().unwrap(), vec![event, allowed]);
    }
}
