//! Derived names, labels and digests, byte-identical to the Python backends.
//!
//! Sandboxes are found again by recomputing their names from the key, never by remembering them, so a Rust
//! host and a Python host find and dispose of each other's sandboxes. Every function here must reproduce
//! the reference vectors exactly; the encodings (length-prefixed parts for docker names, Python's
//! `json.dumps` for key labels and sbx digests) are fixed by that compatibility, not by taste.

use std::fmt;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::error::SandboxError;
use crate::key::SandboxKey;

/// Prefix of every docker container name.
pub const DOCKER_NAME_PREFIX: &str = "maf-sandbox-docker-";
/// Docker label: [`label_value`] of the key's scope.
pub const LABEL_SCOPE: &str = "maf-sandbox.scope";
/// Docker label: [`label_value`] of the key's thread id.
pub const LABEL_THREAD: &str = "maf-sandbox.thread";
/// Docker label: [`label_value`] of the key's agent id.
pub const LABEL_AGENT: &str = "maf-sandbox.agent";
/// Docker label: [`label_value`] of the sandbox kind.
pub const LABEL_KIND: &str = "maf-sandbox.kind";
/// Docker label: [`label_value`] of the call id, present only for a call-scoped key.
pub const LABEL_CALL: &str = "maf-sandbox.call";
/// Docker label prefix: `maf-sandbox.label.<k>` carries [`label_value`] of each spec label `k`.
pub const LABEL_USER_PREFIX: &str = "maf-sandbox.label.";
/// Docker label: the key label ([`docker_key_label`]).
pub const LABEL_KEY_V1: &str = "maf-sandbox.key.v1";
/// Docker label: the raw normalised storage base, never digested.
pub const LABEL_WORK_DIR_V1: &str = "maf-sandbox.work-dir.v1";
/// Docker label on an egress proxy container: its role (`proxy`).
pub const LABEL_ROLE: &str = "maf-sandbox.role";
/// Docker label on an egress proxy container: the SHA-256 of its policy.
pub const LABEL_EGRESS_V1: &str = "maf-sandbox.egress.v1";

/// Longest docker label value kept raw.
const LABEL_RAW_MAX: usize = 63;
/// Cap on the key label: summed field characters, and the encoded length.
const KEY_LABEL_CAP: usize = 4096;

fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

/// Python's `json.dumps` (default arguments) of a list of strings, so digests match the Python backend's.
///
/// Items are joined by `", "`; `"` and `\` are escaped, `\b \f \n \r \t` use their short escapes, every
/// other code point outside U+0020..U+007E becomes `\uXXXX` in lowercase hex (astral code points as a
/// UTF-16 surrogate pair). The output is pure ASCII.
///
/// ```
/// use sandbox_core::naming::python_json_list;
/// assert_eq!(python_json_list(&["a\"b", "é😀", "/"]), r#"["a\"b", "\u00e9\ud83d\ude00", "/"]"#);
/// ```
pub fn python_json_list<S: AsRef<str>>(items: &[S]) -> String {
    let mut out = String::from("[");
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        push_python_json_string(&mut out, item.as_ref());
    }
    out.push(']');
    out
}

fn push_python_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Parses a JSON array of strings (any JSON whitespace, any valid escapes). `None` for anything else,
/// including a lone surrogate escape, which no Rust string can hold.
fn parse_json_string_list(text: &str) -> Option<Vec<String>> {
    let mut chars = text.chars().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while matches!(chars.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            chars.next();
        }
    };
    let hex4 = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| -> Option<u32> {
        let mut value = 0;
        for _ in 0..4 {
            value = value * 16 + chars.next()?.to_digit(16)?;
        }
        Some(value)
    };
    let mut items = Vec::new();
    skip_ws(&mut chars);
    if chars.next()? != '[' {
        return None;
    }
    skip_ws(&mut chars);
    if chars.peek() == Some(&']') {
        chars.next();
    } else {
        loop {
            skip_ws(&mut chars);
            if chars.next()? != '"' {
                return None;
            }
            let mut item = String::new();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        '"' => item.push('"'),
                        '\\' => item.push('\\'),
                        '/' => item.push('/'),
                        'b' => item.push('\u{8}'),
                        'f' => item.push('\u{c}'),
                        'n' => item.push('\n'),
                        'r' => item.push('\r'),
                        't' => item.push('\t'),
                        'u' => {
                            let first = hex4(&mut chars)?;
                            let code = if (0xd800..0xdc00).contains(&first) {
                                if chars.next()? != '\\' || chars.next()? != 'u' {
                                    return None;
                                }
                                let second = hex4(&mut chars)?;
                                if !(0xdc00..0xe000).contains(&second) {
                                    return None;
                                }
                                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
                            } else {
                                first
                            };
                            item.push(char::from_u32(code)?);
                        }
                        _ => return None,
                    },
                    c if u32::from(c) < 0x20 => return None,
                    c => item.push(c),
                }
            }
            items.push(item);
            skip_ws(&mut chars);
            match chars.next()? {
                ',' => {}
                ']' => break,
                _ => return None,
            }
        }
    }
    skip_ws(&mut chars);
    chars.next().is_none().then_some(items)
}

/// The docker container name of a sandbox (docs/docker-backend.md#names-and-labels).
///
/// SHA-256 over each part as `<UTF-8 byte length in decimal>:<bytes>`, parts = scope, thread id, agent id,
/// kind, then `egress_id` if non-empty, then `call:<call_id>` if the key names a call; the name is
/// [`DOCKER_NAME_PREFIX`] + the first 12 hex digits. `egress_id` is `""` for closed egress.
///
/// ```
/// use sandbox_core::naming::docker_container_name;
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(docker_container_name(&key, "python", ""), "maf-sandbox-docker-aef172d1c789");
/// ```
pub fn docker_container_name(key: &SandboxKey, kind: &str, egress_id: &str) -> String {
    let call_part = format!("call:{}", key.call_id);
    let mut parts = vec![
        key.scope.as_str(),
        key.thread_id.as_str(),
        key.agent_id.as_str(),
        kind,
    ];
    if !egress_id.is_empty() {
        parts.push(egress_id);
    }
    if key.is_call() {
        parts.push(&call_part);
    }
    let preimage = docker_name_preimage(&parts);
    format!("{DOCKER_NAME_PREFIX}{}", &sha256_hex(&preimage)[..12])
}

/// The bytes a docker container name digests: each part as its UTF-8 byte length in ASCII decimal, `:`,
/// then its bytes, with nothing between parts. The length prefix makes the encoding injective: no two part
/// lists share a preimage (`["a|b", "c"]` and `["a", "b|c"]` differ), whatever characters the parts hold.
pub fn docker_name_preimage<S: AsRef<str>>(parts: &[S]) -> Vec<u8> {
    let mut preimage = Vec::new();
    for part in parts {
        let part = part.as_ref();
        preimage.extend_from_slice(part.len().to_string().as_bytes());
        preimage.push(b':');
        preimage.extend_from_slice(part.as_bytes());
    }
    preimage
}

/// Whether a label value has the shape of a digest (`sha256-` + 48 lowercase hex), so its raw field cannot
/// be read back from it.
pub fn is_digest_label(value: &str) -> bool {
    value.strip_prefix("sha256-").is_some_and(|hex| {
        hex.len() == 48 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The docker label value of a raw field (docs/docker-backend.md#names-and-labels): the raw string when it is 1..=63 characters of
/// `[A-Za-z0-9._-]` and not digest-shaped, else `sha256-` + the first 48 hex digits of its SHA-256.
///
/// Never truncated, so two values sharing a long prefix never share a label. Used identically on write and
/// on query.
///
/// ```
/// use sandbox_core::naming::label_value;
/// assert_eq!(label_value("ok.value_1-2"), "ok.value_1-2");
/// assert_eq!(label_value(""), "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934c");
/// ```
pub fn label_value(raw: &str) -> String {
    let raw_is_safe = !raw.is_empty()
        && raw.len() <= LABEL_RAW_MAX
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !is_digest_label(raw);
    if raw_is_safe {
        raw.to_owned()
    } else {
        format!("sha256-{}", &sha256_hex(raw.as_bytes())[..48])
    }
}

/// The docker key label `maf-sandbox.key.v1` (docs/docker-backend.md#names-and-labels): base64url, with `=` padding, of the Python JSON of
/// `[scope, thread_id, agent_id, call_id]`; `""` when the fields hold more than 4096 characters in all or
/// the encoding is longer than 4096.
///
/// ```
/// use sandbox_core::naming::docker_key_label;
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(docker_key_label(&key), "WyJwcm9kIiwgInRocmVhZC0xIiwgImFnZW50IiwgIiJd");
/// ```
pub fn docker_key_label(key: &SandboxKey) -> String {
    let fields = [&key.scope, &key.thread_id, &key.agent_id, &key.call_id];
    let characters: usize = fields.iter().map(|f| f.chars().count()).sum();
    if characters > KEY_LABEL_CAP {
        return String::new();
    }
    let encoded = base64::engine::general_purpose::URL_SAFE.encode(python_json_list(&fields));
    if encoded.len() > KEY_LABEL_CAP {
        return String::new();
    }
    encoded
}

/// Reads a key back from a docker key label: the inverse of [`docker_key_label`].
///
/// `None` when the label is empty (the key was too long to record), not padded base64url, not a JSON list
/// of exactly four strings, or too long to have been written by [`docker_key_label`].
pub fn decode_docker_key_label(label: &str) -> Option<SandboxKey> {
    if label.is_empty() || label.len() > KEY_LABEL_CAP {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE
        .decode(label)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let [scope, thread_id, agent_id, call_id]: [String; 4] =
        parse_json_string_list(&text)?.try_into().ok()?;
    Some(SandboxKey {
        scope,
        thread_id,
        agent_id,
        call_id,
    })
}

/// The sbx digest `d(n, parts)` (docs/sbx-backend.md#naming): the first `n` lowercase hex digits (at most 64) of SHA-256 over
/// the Python JSON of the parts.
///
/// ```
/// use sandbox_core::naming::sbx_digest;
/// assert_eq!(sbx_digest(8, &["python"]), "80db6ea4");
/// ```
pub fn sbx_digest<S: AsRef<str>>(n: usize, parts: &[S]) -> String {
    let mut hex = sha256_hex(python_json_list(parts).as_bytes());
    hex.truncate(n);
    hex
}

/// The leading part of every sbx sandbox name: `[a-z0-9]{1,16}`, default `maf`.
///
/// Validated once at construction so no name function can be handed an unchecked prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamePrefix(String);

impl NamePrefix {
    /// The default prefix, `maf`.
    pub const DEFAULT: &'static str = "maf";

    /// Checks a prefix: 1 to 16 characters of `[a-z0-9]`, else [`SandboxError::InvalidArgument`].
    pub fn new(prefix: impl Into<String>) -> Result<Self, SandboxError> {
        let prefix = prefix.into();
        let valid = (1..=16).contains(&prefix.len())
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if valid {
            Ok(NamePrefix(prefix))
        } else {
            Err(SandboxError::invalid(format!(
                "name prefix {prefix:?} must be 1 to 16 characters of a-z and 0-9"
            )))
        }
    }

    /// The prefix.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for NamePrefix {
    fn default() -> Self {
        NamePrefix(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for NamePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The prefix shared by every sbx sandbox of a conversation: `<prefix>-` + d(12, scope, thread_id) + `-`.
pub fn sbx_conversation_prefix(prefix: &NamePrefix, key: &SandboxKey) -> String {
    format!(
        "{prefix}-{}-",
        sbx_digest(12, &[&key.scope, &key.thread_id])
    )
}

/// The prefix shared by every sbx sandbox of a key: the conversation prefix + d(10, scope, thread_id,
/// agent_id, call_id) + `-`.
pub fn sbx_key_prefix(prefix: &NamePrefix, key: &SandboxKey) -> String {
    let fields = [&key.scope, &key.thread_id, &key.agent_id, &key.call_id];
    format!(
        "{}{}-",
        sbx_conversation_prefix(prefix, key),
        sbx_digest(10, &fields)
    )
}

/// The sbx sandbox name (docs/sbx-backend.md#naming): the key prefix + d(8, kind). At most 49 characters.
///
/// ```
/// use sandbox_core::naming::{sbx_sandbox_name, NamePrefix};
/// use sandbox_core::SandboxKey;
/// let key = SandboxKey::conversation("prod", "thread-1", "agent");
/// assert_eq!(
///     sbx_sandbox_name(&NamePrefix::default(), &key, "python"),
///     "maf-f8fb3a606cf7-ee5188b3f1-80db6ea4"
/// );
/// ```
pub fn sbx_sandbox_name(prefix: &NamePrefix, key: &SandboxKey, kind: &str) -> String {
    format!("{}{}", sbx_key_prefix(prefix, key), sbx_digest(8, &[kind]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn python_json_escapes() {
        assert_eq!(python_json_list::<&str>(&[]), "[]");
        assert_eq!(python_json_list(&[""]), r#"[""]"#);
        assert_eq!(
            python_json_list(&["\u{7f}\u{8}\u{c}\n\r\t\u{0}\u{1f}"]),
            r#"["\u007f\b\f\n\r\t\u0000\u001f"]"#
        );
        assert_eq!(
            python_json_list(&["\u{80}\u{9f}\u{2028}"]),
            r#"["\u0080\u009f\u2028"]"#
        );
        assert_eq!(python_json_list(&["😀"]), r#"["\ud83d\ude00"]"#);
        assert_eq!(
            python_json_list(&["\u{FFFF}\u{10FFFF}"]),
            r#"["\uffff\udbff\udfff"]"#
        );
        assert_eq!(
            python_json_list(&["a/b", "q\"", "\\"]),
            r#"["a/b", "q\"", "\\"]"#
        );
    }

    #[test]
    fn json_list_parser() {
        assert_eq!(parse_json_string_list("[]"), Some(vec![]));
        assert_eq!(
            parse_json_string_list(" [ \"a\" ,\n\"\\/\\u00e9\\ud83d\\ude00\" ] "),
            Some(vec!["a".to_owned(), "/é😀".to_owned()])
        );
        for bad in [
            "",
            "[",
            "[\"a\"",
            "[\"a\",]",
            "[1]",
            "[\"\\ud83d\"]",
            "[\"\\ude00\"]",
            "[\"\\x\"]",
            "[\"raw\ncontrol\"]",
            "[\"a\"] x",
            "{}",
        ] {
            assert_eq!(parse_json_string_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn docker_name_parts() {
        let key = SandboxKey::conversation("prod", "thread-1", "agent");
        let conversation = docker_container_name(&key, "python", "");
        let call = docker_container_name(&key.clone().with_call("c1"), "python", "");
        let egress = docker_container_name(&key, "python", "e1");
        assert_eq!(conversation, "maf-sandbox-docker-aef172d1c789");
        assert_ne!(conversation, call);
        assert_ne!(conversation, egress);
        assert_eq!(call.len(), DOCKER_NAME_PREFIX.len() + 12);
        // A call id equal to an egress id still names another container.
        let as_call = docker_container_name(&key.clone().with_call("e1"), "python", "");
        assert_ne!(as_call, egress);
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value("a"), "a");
        let long63 = "x".repeat(63);
        assert_eq!(label_value(&long63), long63);
        for digested in [
            "",
            &"x".repeat(64),
            "has space",
            "é",
            "a/b",
            "sha256-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            let v = label_value(digested);
            assert!(is_digest_label(&v), "{digested:?} -> {v:?}");
        }
        // One hex digit short is not digest-shaped, so it is kept.
        let short = "sha256-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(label_value(short), short);
        assert!(!is_digest_label(
            "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        ));
    }

    #[test]
    fn key_label_round_trips_and_caps() {
        let key = SandboxKey::conversation("prod", "thread-1", "agent").with_call("c\u{7f}😀\"");
        let label = docker_key_label(&key);
        assert!(label.ends_with('=') || label.len() % 4 == 0);
        assert_eq!(decode_docker_key_label(&label), Some(key));

        let at_cap = SandboxKey::conversation("s".repeat(4095), "", "a");
        assert_eq!(docker_key_label(&at_cap), "", "encoding longer than 4096");
        let over = SandboxKey::conversation("s".repeat(4096), "", "a");
        assert_eq!(docker_key_label(&over), "");
        let fits = SandboxKey::conversation("s".repeat(3000), "", "a");
        assert_eq!(
            decode_docker_key_label(&docker_key_label(&fits)),
            Some(fits)
        );
    }

    #[test]
    fn key_label_decode_refusals() {
        use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
        assert_eq!(decode_docker_key_label(""), None);
        assert_eq!(decode_docker_key_label("not base64!"), None);
        let three = URL_SAFE.encode(r#"["a", "b", "c"]"#);
        assert_eq!(decode_docker_key_label(&three), None);
        let five = URL_SAFE.encode(r#"["a", "b", "c", "d", "e"]"#);
        assert_eq!(decode_docker_key_label(&five), None);
        let unpadded = URL_SAFE_NO_PAD.encode(r#"["ab", "b", "c", ""]"#);
        assert!(!unpadded.ends_with('='));
        assert_eq!(decode_docker_key_label(&unpadded), None);
        assert_eq!(decode_docker_key_label(&"A".repeat(4100)), None);
    }

    #[test]
    fn sbx_names() {
        let key = SandboxKey::conversation("prod", "thread-1", "agent");
        let prefix = NamePrefix::default();
        let name = sbx_sandbox_name(&prefix, &key, "python");
        assert_eq!(name, "maf-f8fb3a606cf7-ee5188b3f1-80db6ea4");
        assert!(name.starts_with(&sbx_key_prefix(&prefix, &key)));
        assert!(name.starts_with(&sbx_conversation_prefix(&prefix, &key)));
        let longest = NamePrefix::new("a".repeat(16)).unwrap();
        assert_eq!(sbx_sandbox_name(&longest, &key, "python").len(), 49);
        assert_eq!(sbx_digest(100, &["x"]).len(), 64);
    }

    #[test]
    fn name_prefix_refusals() {
        assert_eq!(NamePrefix::default().as_str(), "maf");
        assert!(NamePrefix::new("abc123").is_ok());
        assert!(NamePrefix::new("a".repeat(16)).is_ok());
        for bad in [
            String::new(),
            "a".repeat(17),
            "Maf".to_owned(),
            "ma-f".to_owned(),
            "maf ".to_owned(),
            "é".to_owned(),
        ] {
            assert_eq!(
                NamePrefix::new(bad.clone()).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
    }
}
