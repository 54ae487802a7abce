//! Egress modes and the allowlist grammar.
//!
//! [`Egress`], [`EgressRule`] and [`EgressEntry`] are also exported at the crate root; this module adds
//! the validators a spec's allowlist passes through (host, method, path), public so that fuzz targets and
//! hosts that build allowlists from user input can apply the same grammar.
//!
//! ```
//! use sandbox_core::egress::{validate_host, validate_method};
//! assert!(validate_host("*.example.com").is_ok());
//! assert!(validate_host("exa mple.com").is_err());
//! assert!(validate_method("GET").is_ok());
//! ```

use std::fmt;

use crate::wire::{wire_enum, wire_from_str};
use crate::{Capability, SandboxError};

wire_enum! {
    /// The one egress mode a spec runs in, least to most isolated. A backend declares the set it enforces;
    /// the router never substitutes another mode, more open or more closed.
    pub enum Egress ("egress") {
        /// Anything is reachable.
        Unrestricted => "unrestricted",
        /// Only the hosts of `egress_allow`.
        Allowlist => "allowlist",
        /// Nothing is reachable.
        Closed => "closed",
    }
}
wire_from_str!(Egress, "egress");

#[allow(clippy::derivable_impls)] // the wire_enum macro owns the derive list
impl Default for Egress {
    fn default() -> Self {
        Egress::Closed
    }
}

/// Longest host, `*.` included.
pub const MAX_HOST_LEN: usize = 253;

/// Checks one allowlist host: an optional leading `*.`, then DNS labels of 1..63 ASCII letters, digits and
/// inner hyphens, at most 253 characters in all, and never numeric in its last label (no IP literals).
pub fn validate_host(host: &str) -> Result<(), SandboxError> {
    let refuse = |why: &str| {
        Err(SandboxError::invalid(format!(
            "egress host {host:?}: {why}"
        )))
    };
    if host == "*" {
        return refuse("a bare `*` would mean unrestricted egress");
    }
    if host.len() > MAX_HOST_LEN {
        return refuse("longer than 253 characters");
    }
    let bare = host.strip_prefix("*.").unwrap_or(host);
    if bare.is_empty() {
        return refuse("empty host");
    }
    for label in bare.split('.') {
        if !is_dns_label(label) {
            return refuse(
                "not a host name (letters, digits and inner hyphens in labels of 1 to 63)",
            );
        }
    }
    let last = bare.rsplit('.').next().unwrap_or(bare);
    if is_numeric_label(last) {
        return refuse("numeric hosts and IP literals are never allowed");
    }
    Ok(())
}

fn is_dns_label(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

fn is_numeric_label(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|c| c.is_ascii_digit()) {
        return true;
    }
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.bytes().all(|c| c.is_ascii_hexdigit()),
        None => false,
    }
}

/// An HTTP method token of an egress rule: upper case, RFC 9110 tchar only.
pub fn validate_method(method: &str) -> Result<(), SandboxError> {
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if method.is_empty() || !method.chars().all(tchar) {
        return Err(SandboxError::invalid(format!(
            "egress method {method:?} is not an HTTP token"
        )));
    }
    if method.to_ascii_uppercase() != method {
        return Err(SandboxError::invalid(format!(
            "egress method {method:?} must be spelled in upper case"
        )));
    }
    Ok(())
}

/// A URL path prefix of an egress rule: starts with `/`, no `? # [ ] \`, `*` only as one trailing `/*`,
/// no `.` or `..` segment, no whitespace or control characters.
pub fn validate_path(path: &str) -> Result<(), SandboxError> {
    let refuse = |why: &str| {
        Err(SandboxError::invalid(format!(
            "egress path {path:?}: {why}"
        )))
    };
    if !path.starts_with('/') {
        return refuse("must start with `/`");
    }
    if path.contains(['?', '#', '[', ']', '\\']) {
        return refuse("contains one of ? # [ ] \\");
    }
    let body = path.strip_suffix("/*").unwrap_or(path);
    if body.contains('*') {
        return refuse("`*` is allowed only as one trailing `/*`");
    }
    if path
        .chars()
        .any(|c| (c as u32) < 32 || (0x7f..=0x9f).contains(&(c as u32)) || c.is_whitespace())
    {
        return refuse("contains whitespace or control characters");
    }
    if body.split('/').any(|seg| seg == "." || seg == "..") {
        return refuse("contains a `.` or `..` segment");
    }
    Ok(())
}

/// An allowlist rule: a host, optionally narrowed to methods and path prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    host: String,
    methods: Option<Vec<String>>,
    paths: Option<Vec<String>>,
}

impl EgressRule {
    /// A validated rule. `None` means "all" for methods and paths; `Some` lists must be non-empty and
    /// free of duplicates.
    pub fn new(
        host: impl Into<String>,
        methods: Option<Vec<String>>,
        paths: Option<Vec<String>>,
    ) -> Result<Self, SandboxError> {
        let host = host.into();
        validate_host(&host)?;
        if let Some(methods) = &methods {
            check_list(&host, "methods", methods)?;
            methods.iter().try_for_each(|m| validate_method(m))?;
        }
        if let Some(paths) = &paths {
            check_list(&host, "paths", paths)?;
            paths.iter().try_for_each(|p| validate_path(p))?;
        }
        Ok(EgressRule {
            host,
            methods,
            paths,
        })
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The methods, `None` for all.
    pub fn methods(&self) -> Option<&[String]> {
        self.methods.as_deref()
    }

    /// The path prefixes, `None` for all.
    pub fn paths(&self) -> Option<&[String]> {
        self.paths.as_deref()
    }
}

fn check_list(host: &str, what: &str, items: &[String]) -> Result<(), SandboxError> {
    if items.is_empty() {
        return Err(SandboxError::invalid(format!(
            "egress rule for {host:?}: empty {what} list (use None for all)"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for item in items {
        if !seen.insert(item) {
            return Err(SandboxError::invalid(format!(
                "egress rule for {host:?}: {what} list names {item:?} twice"
            )));
        }
    }
    Ok(())
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.host)?;
        if self.methods.is_none() && self.paths.is_none() {
            return Ok(());
        }
        let parts: Vec<String> = [&self.methods, &self.paths]
            .into_iter()
            .flatten()
            .map(|list| list.join(", "))
            .collect();
        write!(f, " ({})", parts.join("; "))
    }
}

/// One allowlist entry: a bare host or a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EgressEntry {
    /// Every method and path of one host.
    Host(String),
    /// A host narrowed by methods and/or paths.
    Rule(EgressRule),
}

impl EgressEntry {
    /// The host this entry allows.
    pub fn host(&self) -> &str {
        match self {
            EgressEntry::Host(h) => h,
            EgressEntry::Rule(r) => r.host(),
        }
    }

    /// Validates the entry; a rule with neither methods nor paths collapses to its host.
    pub(crate) fn normalise(self) -> Result<EgressEntry, SandboxError> {
        match self {
            EgressEntry::Host(h) => {
                validate_host(&h)?;
                Ok(EgressEntry::Host(h))
            }
            EgressEntry::Rule(r) => {
                let r = EgressRule::new(r.host, r.methods, r.paths)?;
                if r.methods.is_none() && r.paths.is_none() {
                    Ok(EgressEntry::Host(r.host))
                } else {
                    Ok(EgressEntry::Rule(r))
                }
            }
        }
    }

    /// Capabilities this entry adds to a spec's requirements.
    pub(crate) fn derived_requirements(&self) -> impl Iterator<Item = Capability> {
        let (m, p) = match self {
            EgressEntry::Host(_) => (false, false),
            EgressEntry::Rule(r) => (r.methods.is_some(), r.paths.is_some()),
        };
        [
            m.then_some(Capability::EgressMethods),
            p.then_some(Capability::EgressPaths),
        ]
        .into_iter()
        .flatten()
    }

    /// Same policy, ignoring the host's spelling.
    pub(crate) fn same_policy(&self, other: &EgressEntry) -> bool {
        // A policy is what it allows: the order its lists were written in does not matter.
        let as_set = |list: &Option<Vec<String>>| {
            list.as_ref()
                .map(|l| l.iter().cloned().collect::<std::collections::BTreeSet<_>>())
        };
        let policy = |e: &EgressEntry| match e {
            EgressEntry::Host(_) => (None, None),
            EgressEntry::Rule(r) => (as_set(&r.methods), as_set(&r.paths)),
        };
        policy(self) == policy(other)
    }
}

impl fmt::Display for EgressEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressEntry::Host(h) => f.write_str(h),
            EgressEntry::Rule(r) => r.fmt(f),
        }
    }
}

impl From<&str> for EgressEntry {
    fn from(host: &str) -> Self {
        EgressEntry::Host(host.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_hosts() {
        for h in [
            "example.com",
            "*.example.com",
            "a",
            "a-b.c",
            "x1.y2",
            "localhost",
            "a.b0x",
            "0x1g.com",
            &format!("{}.com", "a".repeat(63)),
        ] {
            validate_host(h).unwrap_or_else(|e| panic!("{h:?}: {e}"));
        }
    }

    #[test]
    fn refused_hosts() {
        for h in [
            "*",
            "",
            "*.",
            "*.*.example.com",
            "**.example.com",
            "example.com.",
            ".example.com",
            "http://example.com",
            "example.com:443",
            "example.com/path",
            "exa mple.com",
            "a,b.com",
            "-a.com",
            "a-.com",
            "a..b",
            "ex*ample.com",
            "10.0.0.5",
            "127.1",
            "a.123",
            "foo.0x",
            "foo.0XaB",
            "123",
            "bücher.de",
            &format!("{}.com", "a".repeat(64)),
        ] {
            assert!(validate_host(h).is_err(), "{h:?} accepted");
        }
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long.len(), 253);
        validate_host(&long).unwrap();
        assert!(validate_host(&format!("{long}e")).is_err());
        assert!(validate_host(&format!("*.{}", &long[2..])).is_ok());
    }

    #[test]
    fn methods_and_paths() {
        validate_method("GET").unwrap();
        validate_method("M-SEARCH").unwrap();
        assert!(validate_method("get").is_err());
        assert!(validate_method("").is_err());
        assert!(validate_method("GE T").is_err());
        for p in ["/", "/api", "/api/*", "/a/b.c", "/a/..b"] {
            validate_path(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
        for p in [
            "",
            "api",
            "/a?b",
            "/a#",
            "/[x]",
            "/a\\b",
            "/a*",
            "/*/b",
            "/a/*/*",
            "/a/./b",
            "/a/..",
            "/a b",
            "/a\u{85}",
            "/a\u{7f}",
            "/a\u{3000}",
        ] {
            assert!(validate_path(p).is_err(), "{p:?} accepted");
        }
    }

    #[test]
    fn rules() {
        let r = EgressRule::new(
            "api.example.com",
            Some(vec!["GET".into(), "POST".into()]),
            Some(vec!["/v1/*".into()]),
        )
        .unwrap();
        assert_eq!(r.to_string(), "api.example.com (GET, POST; /v1/*)");
        let r = EgressRule::new("a.com", None, Some(vec!["/x".into()])).unwrap();
        assert_eq!(r.to_string(), "a.com (/x)");
        let r = EgressRule::new("a.com", Some(vec!["GET".into()]), None).unwrap();
        assert_eq!(r.to_string(), "a.com (GET)");
        assert_eq!(
            EgressRule::new("a.com", None, None).unwrap().to_string(),
            "a.com"
        );
        assert!(EgressRule::new("a.com", Some(vec![]), None).is_err());
        assert!(EgressRule::new("a.com", Some(vec!["GET".into(), "GET".into()]), None).is_err());
        assert!(EgressRule::new("a.com", None, Some(vec!["/x".into(), "/x".into()])).is_err());
        assert!(EgressRule::new("1.2.3.4", None, None).is_err());
        let collapsed = EgressEntry::Rule(EgressRule::new("a.com", None, None).unwrap())
            .normalise()
            .unwrap();
        assert_eq!(collapsed, EgressEntry::Host("a.com".into()));
    }
}
