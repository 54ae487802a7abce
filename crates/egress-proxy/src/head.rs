//! The request head parser: the request line (absolute-form or CONNECT authority-form), the
//! header fields, and the rewrite of a plain-HTTP head to origin-form.
//!
//! The parser is strict on purpose: lines end in CRLF, header fields are `name: value` with a
//! token name, no line folding, visible ASCII (plus space and tab) only, at most
//! [`MAX_HEAD_LEN`] bytes and [`MAX_HEADERS`] fields. What it cannot read is
//! [`HeadError::Malformed`] (answered 400); what it reads but the proxy does not serve
//! (origin-form, asterisk-form, schemes other than `http`, userinfo, fragments) is
//! [`HeadError::Refused`] (answered 403).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest request head read, terminating blank line included.
pub const MAX_HEAD_LEN: usize = 16 * 1024;

/// The most header fields a head may carry.
pub const MAX_HEADERS: usize = 100;

/// The longest host name accepted in a request.
pub const MAX_HOST_LEN: usize = 253;

/// Why a head was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadError {
    /// Not a well-formed HTTP/1.x request head: answered 400.
    Malformed(&'static str),
    /// Well-formed, but not something this proxy serves: answered 403.
    Refused(&'static str),
}

impl HeadError {
    /// The HTTP status the proxy answers with.
    pub fn status(self) -> u16 {
        match self {
            HeadError::Malformed(_) => 400,
            HeadError::Refused(_) => 403,
        }
    }

    /// The reason, for the response body and the log.
    pub fn reason(self) -> &'static str {
        match self {
            HeadError::Malformed(why) | HeadError::Refused(why) => why,
        }
    }
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.reason(), self.status())
    }
}

/// The host part of an authority: a lower-cased name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, ASCII lower case, labels of letters, digits, `-` and `_`.
    Name(String),
    /// An IPv4 dotted quad or a bracketed IPv6 literal.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// A host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// The host.
    pub host: Host,
    /// The port (never 0).
    pub port: u16,
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// What the request line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `CONNECT host:port`: a tunnel.
    Connect(Authority),
    /// `METHOD http://host[:port]/path`: a plain-HTTP request; `path` is the origin-form
    /// target (always starting with `/`).
    Absolute {
        /// Where to send it.
        authority: Authority,
        /// The origin-form request target.
        path: String,
    },
}

impl Target {
    /// The authority the request would reach.
    pub fn authority(&self) -> &Authority {
        match self {
            Target::Connect(authority) | Target::Absolute { authority, .. } => authority,
        }
    }
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method token, as sent.
    pub method: String,
    /// The request target.
    pub target: Target,
    /// The minor version of HTTP/1.x (0 or 1).
    pub minor_version: u8,
    /// The header fields in order, names as sent.
    pub headers: Vec<(String, String)>,
}

/// The length of the head at the start of `buffer` (through its blank line), if complete.
pub fn head_len(buffer: &[u8]) -> Option<usize> {
    buffer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

#[cold]
fn malformed(why: &'static str) -> HeadError {
    HeadError::Malformed(why)
}

#[cold]
fn refused(why: &'static str) -> HeadError {
    HeadError::Refused(why)
}

fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// Parses a complete head (as delimited by [`head_len`]; the final blank line is optional).
///
/// # Errors
/// [`HeadError::Malformed`] for anything that is not a well-formed HTTP/1.0 or 1.1 head;
/// [`HeadError::Refused`] for request forms the proxy does not serve.
pub fn parse_head(head: &[u8]) -> Result<RequestHead, HeadError> {
    if head.len() > MAX_HEAD_LEN {
        return Err(refused("request head larger than 16 KiB"));
    }
    let text = std::str::from_utf8(head).map_err(|_| malformed("head is not ASCII"))?;
    let text = text.strip_suffix("\r\n\r\n").unwrap_or(text);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let (method, target, minor_version) = parse_request_line(request_line)?;
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(refused("more than 100 header fields"));
        }
        headers.push(parse_field(line)?);
    }
    let target = if method == "CONNECT" {
        Target::Connect(parse_authority(target, None)?)
    } else {
        parse_absolute(target)?
    };
    Ok(RequestHead {
        method: method.to_owned(),
        target,
        minor_version,
        headers,
    })
}

fn parse_request_line(line: &str) -> Result<(&str, &str, u8), HeadError> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("request line is not `METHOD TARGET VERSION`"));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(malformed("method is not a token"));
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(malformed("request target is empty or not visible ASCII"));
    }
    let minor_version = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(malformed("version is not HTTP/1.0 or HTTP/1.1")),
    };
    Ok((method, target, minor_version))
}

fn parse_field(line: &str) -> Result<(String, String), HeadError> {
    if line.starts_with([' ', '\t']) {
        return Err(malformed("folded header line"));
    }
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| malformed("header line without a colon"))?;
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(malformed("header name is not a token"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_graphic() || b == b' ' || b == b'\t')
    {
        return Err(malformed("header value has control characters"));
    }
    Ok((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
}

/// Parses an absolute-form `http://authority[/path][?query]` target.
///
/// # Errors
/// Refused for origin-form, asterisk-form, another scheme, userinfo or a fragment; Malformed
/// for a bad authority.
pub fn parse_absolute(target: &str) -> Result<Target, HeadError> {
    let (scheme, rest) = target
        .split_once("://")
        .ok_or_else(|| refused("not an absolute-form proxy request"))?;
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(refused("only http:// is proxied; use CONNECT for TLS"));
    }
    if rest.contains('#') {
        return Err(malformed("fragment in the request target"));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let authority = parse_authority(authority, Some(80))?;
    let path = if path.is_empty() {
        "/".to_owned()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    Ok(Target::Absolute { authority, path })
}

/// Parses an authority `host[:port]` (`[v6]` for IPv6 literals). `default_port` is used when
/// the port is absent; `None` makes the port mandatory (CONNECT).
///
/// # Errors
/// Refused for userinfo (`user@host`); Malformed for anything else that is not a host and an
/// optional port in `1..=65535`.
pub fn parse_authority(text: &str, default_port: Option<u16>) -> Result<Authority, HeadError> {
    if text.contains('@') {
        return Err(refused("userinfo in the authority"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (literal, after) = rest
            .split_once(']')
            .ok_or_else(|| malformed("unclosed IPv6 literal"))?;
        let ip: Ipv6Addr = literal.parse().map_err(|_| malformed("bad IPv6 literal"))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| malformed("junk after the IPv6 literal"))?,
            ),
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (name, port) = match text.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text, None),
        };
        (parse_host_name(name)?, port)
    };
    let port = match port {
        Some(digits) => parse_port(digits)?,
        None => default_port.ok_or_else(|| malformed("CONNECT target without a port"))?,
    };
    Ok(Authority { host, port })
}

fn parse_port(digits: &str) -> Result<u16, HeadError> {
    if digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed("port is not 1 to 5 digits"));
    }
    match digits.parse::<u16>() {
        // Empty, 0, or above 65535.
        Ok(0) | Err(_) => Err(malformed("port is not in 1..=65535")),
        Ok(port) => Ok(port),
    }
}

fn parse_host_name(name: &str) -> Result<Host, HeadError> {
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    if name.len() > MAX_HOST_LEN {
        return Err(malformed("host longer than 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(malformed("host has an empty or over-long label"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(malformed(
                "host has characters outside letters, digits, `-`, `_`",
            ));
        }
    }
    Ok(Host::Name(name.to_ascii_lowercase()))
}

/// What a plain-HTTP request carries after its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body (no `Content-Length`, or 0).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
}

impl Body {
    /// How many bytes the body has.
    pub fn len(self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Length(n) => n,
        }
    }

    /// Whether the body has no byte.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The part of this body that arrived in `rest`, the bytes read after the head: at most
    /// the body's length, so bytes of a next request are never taken as this one's.
    pub fn arrived(self, rest: &[u8]) -> &[u8] {
        &rest[..rest
            .len()
            .min(usize::try_from(self.len()).unwrap_or(usize::MAX))]
    }
}

/// Header fields never forwarded as the client wrote them: hop-by-hop fields (RFC 9110 §7.6.1),
/// the host, which the rewrite sets from the request target, and `Content-Length`, which it
/// writes once, canonical, from the framing the proxy itself uses.
const DROPPED: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
];

impl RequestHead {
    /// The values of every field named `name` (ASCII case-insensitive).
    pub fn field_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body framing of a plain-HTTP request.
    ///
    /// # Errors
    /// Refused for `Transfer-Encoding` (request bodies must carry `Content-Length`) and for
    /// `Upgrade`; Malformed for conflicting or non-numeric `Content-Length` values.
    pub fn plain_body(&self) -> Result<Body, HeadError> {
        if self.field_values("upgrade").next().is_some() {
            return Err(refused("Upgrade on plain HTTP is refused"));
        }
        if self.field_values("transfer-encoding").next().is_some() {
            return Err(refused(
                "request bodies must carry Content-Length, not Transfer-Encoding",
            ));
        }
        let mut length: Option<u64> = None;
        for value in self.field_values("content-length") {
            for item in value.split(',') {
                let item = item.trim_matches([' ', '\t']);
                if item.len() > 19 || !item.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(malformed("Content-Length is not a number"));
                }
                let parsed: u64 = item
                    .parse()
                    .map_err(|_| malformed("Content-Length is not a number"))?;
                if length.is_some_and(|seen| seen != parsed) {
                    return Err(malformed("conflicting Content-Length values"));
                }
                length = Some(parsed);
            }
        }
        Ok(match length {
            None | Some(0) => Body::Empty,
            Some(n) => Body::Length(n),
        })
    }

    /// The head to send upstream for a plain-HTTP request: origin-form request line, `Host`
    /// from the target, hop-by-hop and `Proxy-*` fields (and fields the client's `Connection`
    /// names) dropped, one canonical `Content-Length` (when the client sent any, from the length
    /// the proxy frames the body by: equal duplicates or a list like `5, 5` never reach an
    /// upstream that might read them otherwise), `Connection: close` appended.
    ///
    /// Returns `None` for a CONNECT head.
    pub fn rewrite_origin_form(&self) -> Option<Vec<u8>> {
        let Target::Absolute { path, .. } = &self.target else {
            return None;
        };
        Some(self.rewrite_to(path, 80, false, None))
    }

    /// The head to send upstream, as [`RequestHead::rewrite_origin_form`] makes it, with
    /// `target` as the origin-form target, the port left out of `Host` when it is
    /// `default_port`, every `Authorization` field dropped when `drop_authorization`, and one
    /// `Authorization: <authorization>` added when given (the caller's value, which must hold
    /// no line break). A CONNECT head keeps its own authority.
    pub fn rewrite_to(
        &self,
        target: &str,
        default_port: u16,
        drop_authorization: bool,
        authorization: Option<&str>,
    ) -> Vec<u8> {
        let authority = self.target.authority();
        let named: Vec<String> = self
            .field_values("connection")
            .flat_map(|v| v.split(','))
            .map(|t| t.trim_matches([' ', '\t']).to_ascii_lowercase())
            .filter(|t| !t.is_empty())
            .collect();
        let mut out = format!(
            "{} {} HTTP/1.{}\r\nHost: {}",
            self.method, target, self.minor_version, authority.host
        );
        if authority.port != default_port {
            out.push_str(&format!(":{}", authority.port));
        }
        out.push_str("\r\n");
        for (name, value) in &self.headers {
            let lower = name.to_ascii_lowercase();
            if DROPPED.contains(&lower.as_str())
                || lower.starts_with("proxy-")
                || named.contains(&lower)
                || (drop_authorization && lower == "authorization")
            {
                continue;
            }
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        if self.field_values("content-length").next().is_some() {
            match self.plain_body() {
                Ok(Body::Length(n)) => out.push_str(&format!("Content-Length: {n}\r\n")),
                Ok(Body::Empty) => out.push_str("Content-Length: 0\r\n"),
                // Never sent: the proxy refuses such a request before it rewrites it.
                Err(_) => {}
            }
        }
        if let Some(value) = authorization {
            out.push_str("Authorization: ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n\r\n");
        out.into_bytes()
    }
}

/// Parses the head of a request read inside a terminated tunnel to `authority`: origin-form
/// (`METHOD /path HTTP/1.x`), with exactly one `Host` field naming the tunnel's host (and its
/// port, when it gives one). The head's target is `authority` and the path as sent.
///
/// # Errors
/// As [`parse_head`] for the syntax; Refused for another request form, CONNECT, or a `Host`
/// missing, repeated or naming another host or port.
pub fn parse_tunnelled_head(head: &[u8], authority: &Authority) -> Result<RequestHead, HeadError> {
    if head.len() > MAX_HEAD_LEN {
        return Err(refused("request head larger than 16 KiB"));
    }
    let text = std::str::from_utf8(head).map_err(|_| malformed("head is not ASCII"))?;
    let text = text.strip_suffix("\r\n\r\n").unwrap_or(text);
    let mut lines = text.split("\r\n");
    let (method, target, minor_version) = parse_request_line(lines.next().unwrap_or(""))?;
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(refused("more than 100 header fields"));
        }
        headers.push(parse_field(line)?);
    }
    if method == "CONNECT" || !target.starts_with('/') {
        return Err(refused(
            "inside a terminated tunnel only origin-form requests are served",
        ));
    }
    let head = RequestHead {
        method: method.to_owned(),
        target: Target::Absolute {
            authority: authority.clone(),
            path: target.to_owned(),
        },
        minor_version,
        headers,
    };
    let hosts: Vec<&str> = head.field_values("host").collect();
    let [host] = hosts[..] else {
        return Err(refused("a tunnelled request needs exactly one Host field"));
    };
    if parse_authority(host, Some(authority.port)).as_ref() != Ok(authority) {
        return Err(refused("the Host field names another host than the tunnel"));
    }
    drop(hosts);
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn head(text: &str) -> Result<RequestHead, HeadError> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn a_body_takes_only_its_own_bytes_of_what_followed_the_head() {
        let rest = b"abcdef";
        assert_eq!(Body::Empty.arrived(rest), b"");
        assert_eq!(Body::Length(4).arrived(rest), b"abcd");
        assert_eq!(Body::Length(9).arrived(rest), b"abcdef");
        assert_eq!(Body::Length(u64::MAX).arrived(b""), b"");
        assert_eq!(Body::Length(9).len(), 9);
        assert!(Body::Empty.is_empty() && !Body::Length(1).is_empty());
    }

    fn name(n: &str) -> Host {
        Host::Name(n.to_owned())
    }

    #[test]
    fn absolute_form_requests_parse_with_default_ports_and_origin_paths() {
        let parsed = head("GET http://Example.COM/a/b?c=d HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(parsed.method, "GET");
        assert_eq!(
            parsed.target,
            Target::Absolute {
                authority: Authority {
                    host: name("example.com"),
                    port: 80
                },
                path: "/a/b?c=d".to_owned()
            }
        );
        let parsed = head("GET http://h.test:8080?q HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(parsed.minor_version, 0);
        assert_eq!(
            parsed.target,
            Target::Absolute {
                authority: Authority {
                    host: name("h.test"),
                    port: 8080
                },
                path: "/?q".to_owned()
            }
        );
        let parsed = head("HEAD http://[::1]:81 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            parsed.target.authority(),
            &Authority {
                host: Host::Ip("::1".parse().unwrap()),
                port: 81
            }
        );
    }

    #[test]
    fn connect_needs_an_authority_with_a_port() {
        let parsed = head("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap();
        assert_eq!(
            parsed.target,
            Target::Connect(Authority {
                host: name("pypi.org"),
                port: 443
            })
        );
        assert_eq!(
            head("CONNECT pypi.org HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            head("CONNECT pypi.org:0 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            head("CONNECT pypi.org:65536 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            head("CONNECT a@pypi.org:443 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            403
        );
        assert_eq!(
            head("CONNECT [::1:443 HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
    }

    #[test]
    fn forms_the_proxy_does_not_serve_are_refused_and_junk_is_malformed() {
        for refused in [
            "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\n\r\n",
            "GET https://a.test/ HTTP/1.1\r\n\r\n",
            "GET ftp://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://allowed.test@evil.test/ HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(head(refused).unwrap_err().status(), 403, "{refused:?}");
        }
        for malformed in [
            "",
            "GET http://a.test/ HTTP/2\r\n\r\n",
            "GET  http://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1 x\r\n\r\n",
            "G(T http://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\n folded\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nNo colon\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nBad name: x\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nX: a\u{1}b\r\n\r\n",
            "GET http://a..test/ HTTP/1.1\r\n\r\n",
            "GET http://a.test:/ HTTP/1.1\r\n\r\n",
            "GET http://a.test:+80/ HTTP/1.1\r\n\r\n",
            "GET http://a.test/#frag HTTP/1.1\r\n\r\n",
            "GET http://a%2etest/ HTTP/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\nX: y\n\n",
        ] {
            assert_eq!(head(malformed).unwrap_err().status(), 400, "{malformed:?}");
        }
    }

    #[test]
    fn bodies_need_one_content_length_and_upgrades_are_refused() {
        let body = |fields: &str| {
            head(&format!("POST http://a.test/ HTTP/1.1\r\n{fields}\r\n"))
                .and_then(|h| h.plain_body())
        };
        assert_eq!(body(""), Ok(Body::Empty));
        assert_eq!(body("Content-Length: 12\r\n"), Ok(Body::Length(12)));
        assert_eq!(
            body("Content-Length: 12, 12\r\nContent-Length: 12\r\n"),
            Ok(Body::Length(12))
        );
        assert_eq!(
            body("Content-Length: 12\r\nContent-Length: 13\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(body("Content-Length: -1\r\n").unwrap_err().status(), 400);
        assert_eq!(body("Content-Length: +5\r\n").unwrap_err().status(), 400);
        assert_eq!(body("Content-Length: \r\n").unwrap_err().status(), 400);
        assert_eq!(body("Content-Length: 5,\r\n").unwrap_err().status(), 400);
        assert_eq!(
            body("Content-Length: 9999999999999999999\r\n"),
            Ok(Body::Length(9_999_999_999_999_999_999))
        );
        assert_eq!(
            body("Content-Length: 00000000000000000012\r\n")
                .unwrap_err()
                .status(),
            400
        );
        assert_eq!(
            body("Transfer-Encoding: chunked\r\n").unwrap_err().status(),
            403
        );
        assert_eq!(
            body("Upgrade: websocket\r\nConnection: Upgrade\r\n")
                .unwrap_err()
                .status(),
            403
        );
        assert_eq!(body("upgrade: h2c\r\n").unwrap_err().status(), 403);
    }

    #[test]
    fn the_rewrite_is_origin_form_without_proxy_or_hop_fields() {
        let parsed = head(
            "GET http://a.test:8080/x?y HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: secret\r\n\
             Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        let rewritten = String::from_utf8(parsed.rewrite_origin_form().unwrap()).unwrap();
        assert_eq!(
            rewritten,
            "GET /x?y HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let connect = head("CONNECT a.test:443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(connect.rewrite_origin_form(), None);
        // One canonical Content-Length, whatever equal forms the client used.
        for fields in [
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5, 5\r\n",
            "content-length: 005\r\n",
        ] {
            let parsed = head(&format!(
                "POST http://a.test/ HTTP/1.1\r\n{fields}X: y\r\n\r\n"
            ))
            .unwrap();
            let rewritten = String::from_utf8(parsed.rewrite_origin_form().unwrap()).unwrap();
            assert_eq!(
                rewritten,
                "POST / HTTP/1.1\r\nHost: a.test\r\nX: y\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
                "{fields:?}"
            );
        }
        let zero = head("POST http://a.test/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert!(String::from_utf8(zero.rewrite_origin_form().unwrap())
            .unwrap()
            .ends_with("\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn limits_hold_exactly_at_their_bounds() {
        let padded = |total: usize| {
            let start = "GET http://a.test/ HTTP/1.1\r\nX: ";
            let filler = total - start.len() - 4;
            format!("{start}{}\r\n\r\n", "a".repeat(filler))
        };
        assert_eq!(padded(MAX_HEAD_LEN).len(), MAX_HEAD_LEN);
        // Large cookies and tokens fit: the documented bound is 16 KiB.
        assert!(head(&padded(16 * 1024)).is_ok());
        assert!(head(&padded(16 * 1024 + 1)).is_err());
        assert!(head(&padded(MAX_HEAD_LEN)).is_ok());
        assert_eq!(
            head(&padded(MAX_HEAD_LEN + 1)),
            Err(HeadError::Refused("request head larger than 16 KiB"))
        );
        let label63 = "a".repeat(63);
        assert!(parse_authority(&format!("{label63}.test"), Some(80)).is_ok());
        assert_eq!(
            parse_authority(&format!("{label63}a.test"), Some(80))
                .unwrap_err()
                .status(),
            400
        );
        let name253 = format!("{label63}.{label63}.{label63}.{}", "b".repeat(61));
        assert_eq!(name253.len(), 253);
        assert!(parse_authority(&name253, Some(80)).is_ok());
        assert_eq!(
            parse_authority(&format!("c{name253}"), Some(80)).unwrap_err(),
            HeadError::Malformed("host longer than 253 characters")
        );
        assert_eq!(
            parse_authority("a.test:00080", None).map(|a| a.port),
            Ok(80)
        );
        assert!(parse_authority("a.test:000080", None).is_err());
        for bad_port in ["a.test:", "a.test:+80", "a.test:-1", "a.test:8 0"] {
            assert_eq!(
                parse_authority(bad_port, None).unwrap_err().status(),
                400,
                "{bad_port}"
            );
        }
    }

    #[test]
    fn errors_print_their_reason_and_status() {
        assert_eq!(
            HeadError::Malformed("bad thing").to_string(),
            "bad thing (400)"
        );
        assert_eq!(HeadError::Refused("no").to_string(), "no (403)");
        assert_eq!(HeadError::Refused("no").reason(), "no");
        assert_eq!(
            head("GET  HTTP/1.1\r\n\r\n"),
            Err(HeadError::Malformed(
                "request target is empty or not visible ASCII"
            ))
        );
        assert_eq!(
            head("GET http://[::1]/ HTTP/1.1\r\n\r\n")
                .unwrap()
                .target
                .authority()
                .port,
            80
        );
        assert_eq!(
            head("GET /x://y HTTP/1.1\r\n\r\n").unwrap_err().status(),
            403
        );
    }

    #[test]
    fn heads_end_at_the_first_blank_line_and_are_bounded() {
        assert_eq!(head_len(b"GET x\r\n\r\nrest"), Some(9));
        assert_eq!(head_len(b"GET x\r\n"), None);
        let big = format!(
            "GET http://a.test/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD_LEN)
        );
        assert_eq!(head(&big).unwrap_err().status(), 403);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET http://a.test/ HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            HeadError::Refused("more than 100 header fields")
        );
    }

    proptest! {
        #[test]
        fn the_parser_never_panics_and_rewrites_stay_single_requests(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(parsed) = parse_head(&bytes) {
                if let Some(rewritten) = parsed.rewrite_origin_form() {
                    let len = head_len(&rewritten);
                    prop_assert_eq!(len, Some(rewritten.len()));
                    let again = std::str::from_utf8(&rewritten).unwrap();
                    prop_assert!(again.ends_with("Connection: close\r\n\r\n"));
                }
            }
        }

        #[test]
        fn authorities_round_trip(host in "[a-z0-9]{1,10}(\\.[a-z0-9_-]{1,10}){0,3}", port in 1u16..) {
            let text = format!("{host}:{port}");
            let parsed = parse_authority(&text, None);
            match host.parse::<Ipv4Addr>() {
                Ok(ip) => prop_assert_eq!(parsed, Ok(Authority { host: Host::Ip(IpAddr::V4(ip)), port })),
                Err(_) => {
                    let parsed = parsed.unwrap();
                    prop_assert_eq!(parsed.to_string(), text);
                }
            }
        }

        #[test]
        fn absolute_requests_with_valid_fields_round_trip(
            host in "[a-z][a-z0-9]{0,8}(\\.[a-z][a-z0-9-]{0,8}){0,3}",
            path in "(/[a-zA-Z0-9._~%-]{0,8}){1,4}",
            value in "[ -~]{0,20}",
        ) {
            let text = format!("PUT http://{host}{path} HTTP/1.1\r\nX-Test: {value}\r\n\r\n");
            let parsed = parse_head(text.as_bytes()).unwrap();
            prop_assert_eq!(parsed.target.authority().host.clone(), Host::Name(host.clone()));
            prop_assert_eq!(parsed.field_values("x-test").next(), Some(value.trim()));
            let rewritten = String::from_utf8(parsed.rewrite_origin_form().unwrap()).unwrap();
            let expected_start = format!("PUT {path} HTTP/1.1\r\nHost: {host}\r\n");
            prop_assert!(rewritten.starts_with(&expected_start));
        }
    }
}
