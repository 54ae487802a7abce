//! The allowlist host grammar against an independent model: a character-by-character scanner written from
//! the spec's regex `(\*\.)?L(\.L)*`, `L = [A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?`, plus the length
//! and numeric-last-label rules. Hosts are also generated from the regex itself.

use proptest::prelude::*;
use proptest::string::string_regex;
use sandbox_core::egress::{validate_host, MAX_HOST_LEN};
use sandbox_core::ErrorKind;

/// Scanner states for the host regex.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing read yet.
    Start,
    /// Read the `*`; a `.` must follow.
    Star,
    /// At the start of a label.
    LabelStart,
    /// Inside a label of `len` characters whose last character is (or is not) a hyphen.
    InLabel { len: usize, hyphen_last: bool },
}

fn model_matches_regex(host: &str) -> bool {
    let mut state = State::Start;
    for c in host.chars() {
        state = match (state, c) {
            (State::Start, '*') => State::Star,
            (State::Star, '.') => State::LabelStart,
            (State::Start | State::LabelStart, c) if c.is_ascii_alphanumeric() => State::InLabel {
                len: 1,
                hyphen_last: false,
            },
            (State::InLabel { len, .. }, c) if c.is_ascii_alphanumeric() && len < 63 => {
                State::InLabel {
                    len: len + 1,
                    hyphen_last: false,
                }
            }
            (State::InLabel { len, .. }, '-') if len < 63 => State::InLabel {
                len: len + 1,
                hyphen_last: true,
            },
            (
                State::InLabel {
                    hyphen_last: false, ..
                },
                '.',
            ) => State::LabelStart,
            _ => return false,
        };
    }
    matches!(
        state,
        State::InLabel {
            hyphen_last: false,
            ..
        }
    )
}

/// `[0-9]+` or `0[xX][0-9A-Fa-f]*`, fully.
fn model_numeric(label: &str) -> bool {
    let chars: Vec<char> = label.chars().collect();
    let all_digits = !chars.is_empty() && chars.iter().all(char::is_ascii_digit);
    let hex_literal = chars.len() >= 2
        && chars[0] == '0'
        && (chars[1] == 'x' || chars[1] == 'X')
        && chars[2..].iter().all(char::is_ascii_hexdigit);
    all_digits || hex_literal
}

fn model_accepts(host: &str) -> bool {
    if host == "*" || host.chars().count() > 253 {
        return false;
    }
    if !model_matches_regex(host) {
        return false;
    }
    let last = match host.rfind('.') {
        Some(dot) => &host[dot + 1..],
        None => host,
    };
    !model_numeric(last)
}

/// Strings over the characters that matter, plus a few that must never pass.
fn host_like() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(vec!['a', 'Z', 'x', 'X', 'f', '0', '1', '9']),
            3 => Just('.'),
            2 => Just('-'),
            1 => prop::sample::select(vec!['*', ' ', ':', '/', '_', 'é', '\0', ',', '\u{130}']),
        ],
        0..24,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

/// A label of the grammar, of a chosen length.
fn label(len: usize) -> String {
    "a".repeat(len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn arbitrary_strings_match_the_model(host in host_like()) {
        prop_assert_eq!(validate_host(&host).is_ok(), model_accepts(&host), "host {:?}", host);
    }

    #[test]
    fn refusals_are_invalid_argument(host in host_like()) {
        if let Err(e) = validate_host(&host) {
            prop_assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn hosts_drawn_from_the_regex(
        host in string_regex(
            r"(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,4}"
        ).expect("a valid regex")
    ) {
        // Every string of the regex is accepted unless it is too long or its last label is numeric.
        let last = host.rsplit('.').next().unwrap_or(&host);
        let want = host.len() <= MAX_HOST_LEN && !model_numeric(last);
        prop_assert_eq!(validate_host(&host).is_ok(), want, "host {:?}", host);
        prop_assert!(model_matches_regex(&host));
    }

    #[test]
    fn accepted_hosts_hold_the_invariants(host in host_like()) {
        if validate_host(&host).is_ok() {
            prop_assert!(host.is_ascii());
            prop_assert!(host.len() <= MAX_HOST_LEN);
            prop_assert!(!host.ends_with('.') && !host.contains(".."));
            prop_assert!(host.rfind('*').is_none_or(|i| i == 0 && host.starts_with("*.")));
            prop_assert!(!host.bytes().any(|b| matches!(b, b' ' | b':' | b'/' | b',' | b'_')));
        }
    }

    #[test]
    fn length_boundary(labels in 1usize..6, pad in 0usize..4, wildcard in any::<bool>()) {
        // Build a host of exactly 253 + pad - 2 characters from full-size labels.
        let mut host = if wildcard { "*.".to_owned() } else { String::new() };
        for i in 0..labels {
            if i > 0 {
                host.push('.');
            }
            host.push_str(&label(63));
        }
        while host.len() < MAX_HOST_LEN - 2 + pad {
            host.push_str(".b");
        }
        host.truncate(MAX_HOST_LEN - 2 + pad);
        if host.ends_with('.') {
            host.push('c');
        }
        prop_assert_eq!(validate_host(&host).is_ok(), model_accepts(&host), "len {}", host.len());
        prop_assert_eq!(validate_host(&host).is_ok(), host.len() <= MAX_HOST_LEN);
    }
}

#[test]
fn model_table() {
    for (host, ok) in [
        ("example.com", true),
        ("*.example.com", true),
        ("*", false),
        ("*.", false),
        ("**.a", false),
        ("a.*.b", false),
        ("a.b.", false),
        (".a", false),
        ("-a", false),
        ("a-", false),
        ("a--b", true),
        ("10.0.0.5", false),
        ("127.1", false),
        ("a.123", false),
        ("foo.0x", false),
        ("foo.0xfF", false),
        ("foo.0xg", true),
        ("123.a", true),
        ("x0", true),
        (&label(63), true),
        (&label(64), false),
    ] {
        assert_eq!(model_accepts(host), ok, "model {host:?}");
        assert_eq!(validate_host(host).is_ok(), ok, "validate_host {host:?}");
    }
}
