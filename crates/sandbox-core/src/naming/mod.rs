//! Derived names, labels and digests, byte-identical to the Python backends.
//!
//! Sandboxes are found again by recomputing their names from the key, never by remembering them, so a Rust
//! host and a Python host find and dispose of each other's sandboxes. Every function here must reproduce
//! the reference vectors exactly; the encodings (length-prefixed parts for docker names, Python's
//! `json.dumps` for key labels and sbx digests) are fixed by that compatibility, not by taste.
//!
//! The two halves are named for whose they are: [`docker`] holds the Docker backend's container
//! names and labels, [`sbx`] the sbx backend's sandbox names and name prefix. This module holds
//! what both derive from: [`json_dumps_list`], the byte-exact `json.dumps` both digest.

pub mod docker;
pub mod sbx;

use sha2::{Digest, Sha256};

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
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
/// use sandbox_core::naming::json_dumps_list;
/// assert_eq!(json_dumps_list(&["a\"b", "é😀", "/"]), r#"["a\"b", "\u00e9\ud83d\ude00", "/"]"#);
/// ```
pub fn json_dumps_list<S: AsRef<str>>(items: &[S]) -> String {
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
pub(crate) fn parse_json_string_list(text: &str) -> Option<Vec<String>> {
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

#[cfg(test)]
mod tests {
    use super::docker::*;
    use super::sbx::*;
    use super::*;
    use crate::error::ErrorKind;
    use crate::key::SandboxKey;
    use base64::Engine as _;

    #[test]
    fn python_json_escapes() {
        assert_eq!(json_dumps_list::<&str>(&[]), "[]");
        assert_eq!(json_dumps_list(&[""]), r#"[""]"#);
        assert_eq!(
            json_dumps_list(&["\u{7f}\u{8}\u{c}\n\r\t\u{0}\u{1f}"]),
            r#"["\u007f\b\f\n\r\t\u0000\u001f"]"#
        );
        assert_eq!(
            json_dumps_list(&["\u{80}\u{9f}\u{2028}"]),
            r#"["\u0080\u009f\u2028"]"#
        );
        assert_eq!(json_dumps_list(&["😀"]), r#"["\ud83d\ude00"]"#);
        assert_eq!(
            json_dumps_list(&["\u{FFFF}\u{10FFFF}"]),
            r#"["\uffff\udbff\udfff"]"#
        );
        assert_eq!(
            json_dumps_list(&["a/b", "q\"", "\\"]),
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
