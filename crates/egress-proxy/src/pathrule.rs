//! Request paths as rules judge them: the normaliser and the path patterns.
//!
//! A request target (origin-form, `path[?query]`) is normalised before any rule looks at it, and
//! the normalised form is what the upstream receives, so what was judged is what is served:
//!
//! - a percent escape of an unreserved character (letters, digits, `-`, `.`, `_`, `~`) is
//!   decoded; any other escape is kept, its hex digits upper-cased;
//! - an escape of `/`, `\`, `%` (double encoding), a control character or DEL is refused, and so
//!   is a malformed escape, a raw character outside RFC 3986's `pchar` set (a backslash, a
//!   quote, `<`, `{` ...) and a fragment;
//! - each segment loses its `;` parameters (`/v1;x/` is `/v1/`, `..;/` is `../`);
//! - empty segments (`//`) and `.` segments are dropped, a `..` segment removes the one before
//!   it, and a `..` with nothing before it is refused;
//! - a trailing `/` (or a final `.` or `..` segment) is kept as a trailing `/`.
//!
//! The query is not judged and passes unchanged.
//!
//! Path patterns are `/exact/path` (that normalised path only) or `/prefix/*` (every normalised
//! path that starts with `/prefix/`; `/*` is every path). A pattern must itself be normalised.
//! The plain specification of both is in `pathrule_model.rs`, shared by the property tests and
//! the fuzz target.

use std::fmt;

/// Why a request target cannot be normalised (the request is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathError(pub &'static str);

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A normalised request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The normalised path (always starts with `/`).
    pub path: String,
    /// The query, unchanged, without its `?`.
    pub query: Option<String>,
}

impl Normalized {
    /// The origin-form target to send upstream: the normalised path and the query.
    pub fn target(&self) -> String {
        match &self.query {
            Some(query) => format!("{}?{query}", self.path),
            None => self.path.clone(),
        }
    }
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)
}

/// RFC 3986 `pchar` without the escapes, plus the segment separator.
fn is_path_char(byte: u8) -> bool {
    is_unreserved(byte) || b"!$&'()*+,;=:@/".contains(&byte)
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Decodes the escapes of unreserved characters and upper-cases the others.
fn decode_unreserved(path: &str) -> Result<String, PathError> {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if byte == b'%' {
            let (Some(high), Some(low)) = (
                bytes.get(at + 1).copied().and_then(hex_value),
                bytes.get(at + 2).copied().and_then(hex_value),
            ) else {
                return Err(PathError("malformed percent escape in the path"));
            };
            let value = high * 16 + low;
            if is_unreserved(value) {
                out.push(char::from(value));
            } else if matches!(value, b'/' | b'\\' | b'%') || value < 0x20 || value == 0x7f {
                return Err(PathError(
                    "escaped slash, backslash, percent or control character in the path",
                ));
            } else {
                out.push_str(&format!("%{value:02X}"));
            }
            at += 3;
        } else if is_path_char(byte) {
            out.push(char::from(byte));
            at += 1;
        } else {
            return Err(PathError("character not allowed in a path"));
        }
    }
    Ok(out)
}

/// Normalises an origin-form request target (the module's documentation gives the rules).
///
/// # Errors
/// A target that does not start with `/`, carries a fragment, a forbidden or malformed escape or
/// character, or climbs above the root.
pub fn normalize(target: &str) -> Result<Normalized, PathError> {
    if target.contains('#') {
        return Err(PathError("fragment in the request target"));
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (target, None),
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError("the path does not start with `/`"));
    };
    let decoded = decode_unreserved(rest)?;
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for raw in decoded.split('/') {
        let segment = raw.split(';').next().unwrap_or("");
        trailing_slash = matches!(segment, "" | "." | "..");
        match segment {
            "" | "." => {}
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError("the path climbs above the root"));
                }
            }
            named => segments.push(named),
        }
    }
    let mut path = String::with_capacity(decoded.len() + 1);
    for segment in &segments {
        path.push('/');
        path.push_str(segment);
    }
    if path.is_empty() || trailing_slash {
        path.push('/');
    }
    Ok(Normalized { path, query })
}

/// A path pattern of a rule or grant: an exact normalised path or a `/prefix/*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    /// Exactly this normalised path.
    Exact(String),
    /// Every normalised path starting with this prefix (which ends in `/`).
    Prefix(String),
}

impl PathPattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// A pattern that is not a normalised path, optionally ending in `/*`, or that has a query.
    pub fn parse(text: &str) -> Result<PathPattern, PathError> {
        let (body, prefix) = match text.strip_suffix('*') {
            Some(body) if body.ends_with('/') => (body, true),
            Some(_) => return Err(PathError("`*` stands only as the last segment (`/x/*`)")),
            None => (text, false),
        };
        if body.contains(['?', '*']) {
            return Err(PathError("a pattern has no query and at most one `*`"));
        }
        let normalized = normalize(body)?;
        if normalized.path != body {
            return Err(PathError(
                "a pattern must be normalised (no `.`/`..`/empty segments, unreserved characters unescaped, upper-case escapes)",
            ));
        }
        Ok(if prefix {
            PathPattern::Prefix(normalized.path)
        } else {
            PathPattern::Exact(normalized.path)
        })
    }

    /// Whether the normalised `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(exact) => path == exact,
            PathPattern::Prefix(prefix) => path.starts_with(prefix.as_str()),
        }
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathPattern::Exact(path) => f.write_str(path),
            PathPattern::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

#[cfg(test)]
#[path = "pathrule_model.rs"]
mod pathrule_model;

#[cfg(test)]
mod tests {
    use super::pathrule_model::{model_matches, model_normalize};
    use super::*;
    use proptest::prelude::*;

    fn path(target: &str) -> Result<String, PathError> {
        normalize(target).map(|n| n.path)
    }

    #[test]
    fn bypass_spellings_normalise_out_of_a_prefix() {
        let v1 = PathPattern::parse("/v1/*").unwrap();
        for sneaky in [
            "/v1/../admin",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2E/admin",
            "/v1/.%2e/admin",
            "/v1/..;/admin",
            "/v1/..;x=y/admin",
            "/v1//../admin",
            "/v1/./../admin",
            "/v1/%2e/../admin",
            "//v1/../admin",
        ] {
            let normalized = path(sneaky).unwrap();
            assert_eq!(normalized, "/admin", "{sneaky}");
            assert!(!v1.matches(&normalized), "{sneaky}");
        }
        for refused in [
            "/v1/..%2fadmin",
            "/v1/%2F../admin",
            "/v1/..%5cadmin",
            "/v1/..\\admin",
            "/v1/%252e%252e/admin",
            "/v1/%00",
            "/v1/%0d%0a",
            "/v1/%zz",
            "/v1/%2",
            "/../v1/x",
            "/v1/../../x",
            "v1/x",
            "*",
            "/v1/x#frag",
            "/v1/\"x\"",
            "/v1/<x>",
        ] {
            assert!(normalize(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn normal_paths_keep_their_shape_and_query() {
        assert_eq!(
            normalize("/v1/%7euser/a%2db?x=%2e%2e/../y").unwrap(),
            Normalized {
                path: "/v1/~user/a-b".into(),
                query: Some("x=%2e%2e/../y".into()),
            }
        );
        assert_eq!(path("/").unwrap(), "/");
        assert_eq!(path("/a/").unwrap(), "/a/");
        assert_eq!(path("/a/b/..").unwrap(), "/a/");
        assert_eq!(path("/a/.").unwrap(), "/a/");
        assert_eq!(path("//a///b").unwrap(), "/a/b");
        assert_eq!(path("/a%3bb/%c3%a9").unwrap(), "/a%3Bb/%C3%A9");
        assert_eq!(path("/a;p/b;q").unwrap(), "/a/b");
        assert_eq!(normalize("/x?").unwrap().target(), "/x?");
    }

    #[test]
    fn patterns_are_exact_or_prefix_and_must_be_normal() {
        let exact = PathPattern::parse("/health").unwrap();
        assert!(exact.matches("/health"));
        assert!(!exact.matches("/health/"));
        assert!(!exact.matches("/healthz"));
        let prefix = PathPattern::parse("/v1/*").unwrap();
        assert!(prefix.matches("/v1/"));
        assert!(prefix.matches("/v1/a/b"));
        assert!(!prefix.matches("/v1"));
        assert!(!prefix.matches("/v10/a"));
        assert!(PathPattern::parse("/*").unwrap().matches("/anything"));
        assert_eq!(prefix.to_string(), "/v1/*");
        for bad in [
            "v1/*", "/v1*", "/v1/*/x", "/v1/../x", "/v1//x", "/%7e", "/%3b", "/a?b", "/a;b",
        ] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
        assert!(PathPattern::parse("/%3B").is_ok());
    }

    fn target_strategy() -> impl Strategy<Value = String> {
        let pieces = prop::sample::select(vec![
            "/", "//", ".", "..", "%2e", "%2E", "%2f", "%5C", "%25", "%41", "%7e", "%3b", "%C3",
            "%0a", "%", "%g1", ";", ";x", "a", "v1", "admin", "\\", "?", "#", "~", "-", "=", "@",
            ":", "\"",
        ]);
        prop::collection::vec(pieces, 0..12).prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn the_normaliser_agrees_with_the_model(tail in target_strategy(), slash in any::<bool>()) {
            let target = if slash { format!("/{tail}") } else { tail };
            let got = normalize(&target).ok().map(|n| n.target());
            prop_assert_eq!(got.clone(), model_normalize(&target), "{:?}", target);
            if let Some(normal) = got {
                // A normalised target is a fixed point.
                prop_assert_eq!(normalize(&normal).map(|n| n.target()).ok(), Some(normal.clone()));
                let path = normal.split('?').next().unwrap_or("");
                prop_assert!(!path.contains("//") && !path.contains("/./") && !path.contains("/../"));
            }
        }

        #[test]
        fn the_matcher_agrees_with_the_model(
            pattern in target_strategy(),
            star in any::<bool>(),
            target in target_strategy(),
        ) {
            let pattern = if star { format!("/{pattern}/*") } else { format!("/{pattern}") };
            let target = format!("/{target}");
            if let (Ok(parsed), Ok(normal)) = (PathPattern::parse(&pattern), normalize(&target)) {
                prop_assert_eq!(
                    parsed.matches(&normal.path),
                    model_matches(&pattern, &target),
                    "{:?} {:?}", pattern, target
                );
            }
        }
    }
}
