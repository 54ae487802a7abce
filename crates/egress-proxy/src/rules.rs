//! Method and path rules, credential grants, and the judgement of one HTTP request by both.
//!
//! A host with at least one rule or one grant is *terminated*: its CONNECT tunnels are opened by
//! the proxy ([`crate::tls`]) so each request inside can be judged; every other allowed host stays
//! an opaque tunnel.
//!
//! - A **rule** (`--rule 'HOST METHODS PATHS'`, e.g. `api.example.com GET,HEAD /v1/*,/health`;
//!   `*` for any method; `HOST` as an allowlist entry, `*.d` included) narrows what an allowed
//!   host accepts: once a host has rules, a request to it passes only when one of them names its
//!   method (exactly, case-sensitively) and one of its path patterns ([`PathPattern`]) matches
//!   its normalised path ([`crate::pathrule`]). A rule allows nothing by itself: its host must
//!   also be on the allowlist.
//! - A **grant** (host, port, methods, path patterns, bearer token, expiry; read as JSON lines
//!   from the proxy's standard input, never from its arguments or environment) puts
//!   `Authorization: Bearer <token>` on the requests to its exact host and port whose method and
//!   path it names, until its expiry. Every `Authorization` the client sends to a granted host is
//!   dropped, whether a grant applies or not, and a plain-HTTP request to a granted host is
//!   refused: a credential only ever travels inside TLS to the origin it was granted for.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, SystemTime};

use crate::error::{invalid_grant, invalid_rule, ProxyError};
use crate::head::{parse_tunnelled_head, Authority, Body, Host, RequestHead, Target};
use crate::hostmatch::Allowlist;
use crate::pathrule::{normalize, PathPattern};

/// The methods of a rule or grant.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Methods {
    Any,
    Only(BTreeSet<String>),
}

impl Methods {
    fn allows(&self, method: &str) -> bool {
        match self {
            Methods::Any => true,
            Methods::Only(methods) => methods.contains(method),
        }
    }
}

fn parse_method(method: &str) -> Result<String, &'static str> {
    if !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(method.to_owned())
    } else {
        Err("a method is upper-case letters (GET, POST, ...)")
    }
}

/// One method and path rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRule {
    host: Allowlist,
    methods: Methods,
    paths: Vec<PathPattern>,
    /// The rule as written, for refusal reasons and decision events.
    text: String,
}

impl HttpRule {
    /// Parses `HOST METHODS PATHS` (single spaces; `METHODS` and `PATHS` comma-separated;
    /// `METHODS` may be `*`).
    ///
    /// # Errors
    /// [`ProxyError::InvalidRule`] naming what is wrong.
    pub fn parse(text: &str) -> Result<HttpRule, ProxyError> {
        let fields: Vec<&str> = text.split(' ').collect();
        let [host, methods, paths] = fields[..] else {
            return Err(invalid_rule(text, "expected `HOST METHODS PATHS`"));
        };
        let host = Allowlist::new([host]).map_err(|e| invalid_rule(text, e.to_string()))?;
        let methods = if methods == "*" {
            Methods::Any
        } else {
            Methods::Only(
                methods
                    .split(',')
                    .map(parse_method)
                    .collect::<Result<_, _>>()
                    .map_err(|why| invalid_rule(text, why))?,
            )
        };
        let paths = paths
            .split(',')
            .map(PathPattern::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid_rule(text, e.0))?;
        Ok(HttpRule {
            host,
            methods,
            paths,
            text: text.to_owned(),
        })
    }

    fn allows(&self, method: &str, path: &str) -> bool {
        self.methods.allows(method) && self.paths.iter().any(|p| p.matches(path))
    }
}

/// A bearer token. It is never printed: `Debug` hides it and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Takes a token of RFC 6750's `b64token` characters (so it cannot break a header line).
    ///
    /// # Errors
    /// A message that never quotes the token.
    pub fn new(token: String) -> Result<Token, &'static str> {
        let body = token.trim_end_matches('=');
        let valid = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
        if valid {
            Ok(Token(token))
        } else {
            Err("the token is empty or has characters outside RFC 6750's b64token")
        }
    }

    /// The `Authorization` value that carries the token (no line break: the token's
    /// characters are checked).
    pub fn authorization_value(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// The token's bytes, for the scan of responses that would echo it.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// One credential grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    host: String,
    port: u16,
    methods: Methods,
    paths: Vec<PathPattern>,
    token: Token,
    expires: SystemTime,
}

/// The grant line ([`Grant::parse`]'s input, one line of `--stdin-config`) of a contract's
/// credential grant, its token in clear: for the proxy's standard input only, never a log, an
/// argument or a file.
pub fn grant_line(grant: &sandbox_core::credential::CredentialGrant) -> String {
    let methods = match grant.methods() {
        Some(methods) => serde_json::json!(methods),
        None => serde_json::json!("*"),
    };
    serde_json::json!({
        "host": grant.host(),
        "port": grant.port(),
        "methods": methods,
        "paths": grant.paths(),
        "token": grant.token().reveal(),
        "expires_unix": grant.expires_unix(),
    })
    .to_string()
}

impl Grant {
    /// The proxy's grant for a contract's credential grant, validated as a grant line is
    /// ([`Grant::parse`], whose wire form it goes through).
    ///
    /// # Errors
    /// As [`Grant::parse`], line 1.
    pub fn from_credential(
        grant: &sandbox_core::credential::CredentialGrant,
    ) -> Result<Grant, ProxyError> {
        Grant::parse(&grant_line(grant), 1)
    }

    /// Parses one grant line: a JSON object `{"host", "port", "methods", "paths", "token",
    /// "expires_unix"}` (`methods` a list of methods or `"*"`, `paths` a list of patterns,
    /// `expires_unix` seconds since the epoch).
    ///
    /// # Errors
    /// [`ProxyError::InvalidGrant`] naming the field at fault, never quoting a value (the line
    /// carries a secret).
    pub fn parse(line: &str, line_number: usize) -> Result<Grant, ProxyError> {
        let bad = |why: &str| invalid_grant(line_number, why);
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|_| bad("not a JSON object"))?;
        let object = value.as_object().ok_or_else(|| bad("not a JSON object"))?;
        for key in object.keys() {
            if !["host", "port", "methods", "paths", "token", "expires_unix"]
                .contains(&key.as_str())
            {
                return Err(bad("unknown field"));
            }
        }
        let host = object
            .get("host")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("`host` must be a string"))?;
        if host.starts_with("*.") {
            return Err(bad("a grant names one exact host"));
        }
        Allowlist::new([host]).map_err(|_| bad("`host` is not a host name"))?;
        let port = object
            .get("port")
            .and_then(|v| v.as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("`port` must be 1..=65535"))?;
        let methods = match object.get("methods") {
            Some(serde_json::Value::String(star)) if star == "*" => Methods::Any,
            Some(serde_json::Value::Array(list)) if !list.is_empty() => Methods::Only(
                list.iter()
                    .map(|m| {
                        m.as_str()
                            .ok_or("a method is a string")
                            .and_then(parse_method)
                    })
                    .collect::<Result<_, _>>()
                    .map_err(bad)?,
            ),
            _ => return Err(bad("`methods` must be \"*\" or a non-empty list")),
        };
        let paths = match object.get("paths") {
            Some(serde_json::Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|p| {
                    p.as_str()
                        .ok_or(crate::pathrule::PathError("a path pattern is a string"))
                        .and_then(PathPattern::parse)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(e.0))?,
            _ => return Err(bad("`paths` must be a non-empty list")),
        };
        let token = object
            .get("token")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("`token` must be a string"))?;
        let token = Token::new(token.to_owned()).map_err(bad)?;
        let expires = object
            .get("expires_unix")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("`expires_unix` must be seconds since the epoch"))?;
        Ok(Grant {
            host: host.to_ascii_lowercase(),
            port,
            methods,
            paths,
            token,
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(expires),
        })
    }

    fn applies(&self, port: u16, method: &str, path: &str, now: SystemTime) -> bool {
        self.port == port
            && now < self.expires
            && self.methods.allows(method)
            && self.paths.iter().any(|p| p.matches(path))
    }
}

/// The rules and grants of one proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRules {
    rules: Vec<HttpRule>,
    grants: Vec<Grant>,
}

/// How a request that passed is forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'a> {
    /// The origin-form target sent upstream.
    pub target: String,
    /// The normalised path, when the request was judged by path.
    pub path: Option<String>,
    /// The rule that allowed it, as written.
    pub rule: Option<&'a str>,
    /// Whether every client `Authorization` field is dropped.
    pub drop_authorization: bool,
    /// The token to send, when a grant applies.
    pub credential: Option<&'a Token>,
}

/// Why a request was refused by its host's rules or grants (answered 403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRefusal(pub String);

/// A request read inside a terminated tunnel that passed its host's rules and grants, and the
/// head it becomes upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminated<'a> {
    /// The head as the client sent it.
    pub head: RequestHead,
    /// Its body framing.
    pub body: Body,
    /// The judgement of its method and path.
    pub verdict: Verdict<'a>,
    /// The head sent upstream: origin-form with the normalised target, `Host` from the tunnel,
    /// the client's `Authorization` dropped for a granted host and the grant's added where one
    /// applies, `Connection: close`.
    pub upstream: Vec<u8>,
}

/// Why a request inside a terminated tunnel was refused, answered inside the client's TLS
/// session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminatedRefusal {
    /// 400 for a head that cannot be read, 403 otherwise.
    pub status: u16,
    /// The one-line reason; it never carries a token.
    pub reason: String,
    /// The request's method, when its head was read.
    pub method: Option<String>,
    /// Its normalised path, when it was judged and could be normalised.
    pub path: Option<String>,
}

impl TerminatedRefusal {
    #[cold]
    fn new(status: u16, reason: impl Into<String>, method: Option<String>) -> TerminatedRefusal {
        TerminatedRefusal {
            status,
            reason: reason.into(),
            method,
            path: None,
        }
    }
}

impl HttpRules {
    /// Rules and grants together.
    pub fn new(rules: Vec<HttpRule>, grants: Vec<Grant>) -> HttpRules {
        HttpRules { rules, grants }
    }

    /// Whether there is nothing to judge (every host stays an opaque tunnel).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.grants.is_empty()
    }

    /// The grants' hosts, for checking them against the allowlist.
    pub fn granted_hosts(&self) -> impl Iterator<Item = &str> {
        self.grants.iter().map(|g| g.host.as_str())
    }

    fn rules_for(&self, host: &str) -> Vec<&HttpRule> {
        self.rules
            .iter()
            .filter(|r| r.host.allows_name(host))
            .collect()
    }

    fn is_granted(&self, host: &str) -> bool {
        self.grants.iter().any(|g| g.host == host)
    }

    /// Whether CONNECT tunnels to `host` are terminated so their requests can be judged.
    pub fn terminates(&self, host: &str) -> bool {
        self.is_granted(host) || self.rules.iter().any(|r| r.host.allows_name(host))
    }

    /// Judges one request to `host:port` (`tls`: inside a terminated tunnel) with origin-form
    /// `target` at `now`.
    ///
    /// # Errors
    /// The one-line reason of a refusal (an unnormalisable path, no rule allowing the method and
    /// path, plain HTTP to a granted host); it never carries a token.
    pub fn judge(
        &self,
        host: &str,
        port: u16,
        method: &str,
        target: &str,
        tls: bool,
        now: SystemTime,
    ) -> Result<Verdict<'_>, RuleRefusal> {
        let granted = self.is_granted(host);
        let rules = self.rules_for(host);
        if !granted && rules.is_empty() {
            return Ok(Verdict {
                target: target.to_owned(),
                path: None,
                rule: None,
                drop_authorization: false,
                credential: None,
            });
        }
        if granted && !tls {
            return Err(RuleRefusal(format!(
                "{host} has a credential grant: plain HTTP to it is refused, use https"
            )));
        }
        let normalized = normalize(target)
            .map_err(|e| RuleRefusal(format!("path refused before any rule: {e}")))?;
        let path = normalized.path.as_str();
        let rule = if rules.is_empty() {
            None
        } else {
            match rules.iter().find(|r| r.allows(method, path)) {
                Some(rule) => Some(rule.text.as_str()),
                None => {
                    let texts: Vec<&str> = rules.iter().map(|r| r.text.as_str()).collect();
                    return Err(RuleRefusal(format!(
                        "{method} {path} matches no rule for {host} (rules: {})",
                        texts.join("; ")
                    )));
                }
            }
        };
        let credential = self
            .grants
            .iter()
            .find(|g| g.host == host && g.applies(port, method, path, now))
            .map(|g| &g.token);
        Ok(Verdict {
            target: normalized.target(),
            path: Some(normalized.path.clone()),
            rule,
            drop_authorization: granted,
            credential,
        })
    }

    /// Reads, judges and rewrites `head`, the complete head of the one request read inside a
    /// terminated tunnel to `authority`, at `now`: everything the proxy decides about that
    /// request before it dials the upstream, in one pure step (so tests and fuzz targets judge
    /// exactly what the proxy sends).
    ///
    /// # Errors
    /// A [`TerminatedRefusal`]: 400 for a head that cannot be read, 403 for one the proxy does
    /// not serve or its host's rules refuse.
    pub fn judge_terminated(
        &self,
        head: &[u8],
        authority: &Authority,
        now: SystemTime,
    ) -> Result<Terminated<'_>, TerminatedRefusal> {
        let host = match &authority.host {
            Host::Name(name) => name.as_str(),
            Host::Ip(_) => {
                return Err(TerminatedRefusal::new(
                    403,
                    "a terminated tunnel names a host",
                    None,
                ))
            }
        };
        let head = parse_tunnelled_head(head, authority)
            .map_err(|e| TerminatedRefusal::new(e.status(), e.reason(), None))?;
        let method = Some(head.method.clone());
        let body = head
            .plain_body()
            .map_err(|e| TerminatedRefusal::new(e.status(), e.reason(), method.clone()))?;
        let Target::Absolute { path, .. } = &head.target else {
            return Err(TerminatedRefusal::new(
                400,
                "not an origin-form request",
                method,
            ));
        };
        let verdict = self
            .judge(host, authority.port, &head.method, path, true, now)
            .map_err(|refusal| TerminatedRefusal {
                path: normalize(path).ok().map(|n| n.path),
                ..TerminatedRefusal::new(403, refusal.0, method.clone())
            })?;
        let authorization = verdict.credential.map(Token::authorization_value);
        let upstream = head.rewrite_to(
            &verdict.target,
            443,
            verdict.drop_authorization,
            authorization.as_deref(),
        );
        Ok(Terminated {
            head,
            body,
            verdict,
            upstream,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-token_value";

    fn grant_line(extra: &str) -> String {
        format!(
            r#"{{"host":"api.test","port":443,"methods":["GET"],"paths":["/v1/*"],"token":"{SECRET}","expires_unix":4102444800{extra}}}"#
        )
    }

    fn rules() -> HttpRules {
        HttpRules::new(
            vec![
                HttpRule::parse("api.test GET,HEAD /v1/*,/health").unwrap(),
                HttpRule::parse("*.ruled.test * /*").unwrap(),
            ],
            vec![Grant::parse(&grant_line(""), 1).unwrap()],
        )
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000)
    }

    #[test]
    fn a_contract_grant_becomes_the_same_grant_as_its_line() {
        let credential = sandbox_core::credential::CredentialGrant::new(
            "api.test",
            443,
            Some(vec!["GET".into()]),
            vec!["/v1/*".into()],
            sandbox_core::credential::BearerToken::new(SECRET).unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800),
        )
        .unwrap();
        let converted = Grant::from_credential(&credential).unwrap();
        let parsed = Grant::parse(&grant_line(""), 1).unwrap();
        let judged = |grant: Grant, method: &str, path: &str| {
            HttpRules::new(Vec::new(), vec![grant])
                .judge("api.test", 443, method, path, true, now())
                .map(|verdict| verdict.credential.map(Token::authorization_value))
        };
        for (method, path) in [("GET", "/v1/a"), ("POST", "/v1/a"), ("GET", "/v2")] {
            assert_eq!(
                judged(converted.clone(), method, path),
                judged(parsed.clone(), method, path),
                "{method} {path}"
            );
        }
        assert_eq!(
            judged(converted, "GET", "/v1/a"),
            Ok(Some(format!("Bearer {SECRET}")))
        );
        // Any method: the line's `"*"`.
        let any = sandbox_core::credential::CredentialGrant::new(
            "api.test",
            443,
            None,
            vec!["/v1/*".into()],
            sandbox_core::credential::BearerToken::new(SECRET).unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800),
        )
        .unwrap();
        assert!(
            judged(Grant::from_credential(&any).unwrap(), "DELETE", "/v1/a")
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn rules_parse_strictly() {
        for bad in [
            "api.test GET",
            "api.test  GET /x",
            "api.test get /x",
            "api.test GET v1/*",
            "api.test GET /v1/../x",
            "1.2.3.4 GET /x",
            "api.test GET,, /x",
        ] {
            assert!(
                matches!(HttpRule::parse(bad), Err(ProxyError::InvalidRule { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn hosts_without_rules_or_grants_pass_untouched() {
        let rules = rules();
        assert!(!rules.terminates("other.test"));
        assert!(rules.terminates("api.test"));
        assert!(rules.terminates("a.ruled.test"));
        assert!(!rules.terminates("ruled.test"));
        let verdict = rules
            .judge("other.test", 80, "DELETE", "/x/../y", false, now())
            .unwrap();
        assert_eq!(verdict.target, "/x/../y");
        assert!(!verdict.drop_authorization && verdict.credential.is_none());
    }

    #[test]
    fn methods_and_paths_are_judged_after_normalisation() {
        let rules = rules();
        let judge =
            |method: &str, target: &str| rules.judge("api.test", 443, method, target, true, now());
        let passed = judge("GET", "/v1/./a//b?q=1").unwrap();
        assert_eq!(passed.target, "/v1/a/b?q=1");
        assert_eq!(passed.rule, Some("api.test GET,HEAD /v1/*,/health"));
        assert!(judge("HEAD", "/health").is_ok());
        let refused = judge("POST", "/v1/a").unwrap_err();
        assert_eq!(
            refused.0,
            "POST /v1/a matches no rule for api.test (rules: api.test GET,HEAD /v1/*,/health)"
        );
        assert!(judge("get", "/v1/a").is_err());
        assert!(judge("GET", "/v1/%2e%2e/admin").is_err());
        assert!(judge("GET", "/v1/..%2fadmin")
            .unwrap_err()
            .0
            .starts_with("path refused"));
    }

    #[test]
    fn a_grant_applies_to_its_origin_method_path_and_time_only() {
        let rules = rules();
        let credential = |port: u16, method: &str, target: &str, at: SystemTime| {
            rules
                .judge("api.test", port, method, target, true, at)
                .ok()
                .and_then(|v| v.credential.cloned())
        };
        let token = Token::new(SECRET.to_owned()).unwrap();
        assert_eq!(credential(443, "GET", "/v1/x", now()), Some(token));
        assert_eq!(credential(8443, "GET", "/v1/x", now()), None);
        assert_eq!(credential(443, "HEAD", "/v1/x", now()), None);
        assert_eq!(credential(443, "HEAD", "/health", now()), None);
        let expired = SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800);
        assert_eq!(credential(443, "GET", "/v1/x", expired), None);
        // Granted host: the client's Authorization always goes, plain HTTP never passes.
        let verdict = rules
            .judge("api.test", 443, "HEAD", "/health", true, now())
            .unwrap();
        assert!(verdict.drop_authorization);
        assert!(rules
            .judge("api.test", 80, "GET", "/v1/x", false, now())
            .is_err());
    }

    #[test]
    fn a_terminated_request_is_read_judged_and_rewritten_in_one_step() {
        let rules = rules();
        let authority = Authority {
            host: Host::Name("api.test".into()),
            port: 443,
        };
        let judged = rules
            .judge_terminated(
                b"GET /v1/./x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer guest\r\nContent-Length: 2\r\n\r\n",
                &authority,
                now(),
            )
            .unwrap();
        assert_eq!(judged.body, Body::Length(2));
        assert_eq!(judged.verdict.path.as_deref(), Some("/v1/x"));
        assert_eq!(
            String::from_utf8(judged.upstream).unwrap(),
            format!(
                "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n\
                 Authorization: Bearer {SECRET}\r\nConnection: close\r\n\r\n"
            )
        );
        // Refused by a rule: the method and the normalised path are kept for the decision.
        let refused = rules
            .judge_terminated(
                b"POST /v1/a/../b HTTP/1.1\r\nHost: api.test\r\n\r\n",
                &authority,
                now(),
            )
            .unwrap_err();
        assert_eq!(refused.status, 403);
        assert_eq!(refused.method.as_deref(), Some("POST"));
        assert_eq!(refused.path.as_deref(), Some("/v1/b"));
        assert!(refused.reason.contains("matches no rule"), "{refused:?}");
        // Unreadable: 400, nothing known.
        let malformed = rules
            .judge_terminated(b"GET /v1/x HTTP/2\r\n\r\n", &authority, now())
            .unwrap_err();
        assert_eq!((malformed.status, malformed.method), (400, None));
        // Unframeable body: the method is known.
        let framing = rules
            .judge_terminated(
                b"GET /v1/x HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1, 2\r\n\r\n",
                &authority,
                now(),
            )
            .unwrap_err();
        assert_eq!(framing.method.as_deref(), Some("GET"));
        let by_address = Authority {
            host: Host::Ip([127, 0, 0, 1].into()),
            port: 443,
        };
        assert_eq!(
            rules
                .judge_terminated(
                    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                    &by_address,
                    now()
                )
                .unwrap_err()
                .status,
            403
        );
    }

    #[test]
    fn grant_errors_and_debug_output_never_show_the_token() {
        let grant = Grant::parse(&grant_line(""), 1).unwrap();
        assert!(!format!("{grant:?}").contains(SECRET));
        for line in [
            grant_line(r#","extra":1"#),
            grant_line("").replace("443", "\"x\""),
            grant_line("").replace(r#""token":"#, r#""token":1,"t":"#),
            grant_line("").replace("api.test", "*.api.test"),
            grant_line("").replace(r#"["GET"]"#, &format!("[\"{SECRET}\"]")),
            grant_line("").replace(r#"["/v1/*"]"#, &format!("[\"{SECRET}\"]")),
            grant_line("").replace(SECRET, &format!("{SECRET}\\r\\nX: y")),
            grant_line("").replace(SECRET, ""),
            grant_line("").replace("4102444800", &format!("\"{SECRET}\"")),
            format!("{} trailing {SECRET}", grant_line("")),
        ] {
            let error = Grant::parse(&line, 7).unwrap_err();
            let text = format!("{error} {error:?}");
            assert!(text.contains("line 7"), "{text}");
            assert!(!text.contains(SECRET), "{text}");
        }
    }
}
