//! Properties of the name encodings: the length-prefixed preimage is injective, the Python JSON is pure
//! ASCII and parses back to the same strings, digests are what they claim, and names keep their shapes.

use proptest::prelude::*;
use sandbox_core::naming::docker::{
    decode_docker_key_label, docker_container_name, docker_key_label, docker_name_preimage,
    is_digest_label, label_value, DOCKER_NAME_PREFIX,
};
use sandbox_core::naming::json_dumps_list;
use sandbox_core::naming::sbx::{
    sbx_conversation_prefix, sbx_digest, sbx_key_prefix, sbx_sandbox_name, NamePrefix,
};
use sandbox_core::SandboxKey;
use sha2::{Digest, Sha256};

/// Decodes a length-prefixed preimage back into its parts; `None` if it is malformed.
fn decode_preimage(mut bytes: &[u8]) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    while !bytes.is_empty() {
        let colon = bytes.iter().position(|b| *b == b':')?;
        let len: usize = std::str::from_utf8(&bytes[..colon]).ok()?.parse().ok()?;
        let rest = &bytes[colon + 1..];
        if rest.len() < len {
            return None;
        }
        parts.push(String::from_utf8(rest[..len].to_vec()).ok()?);
        bytes = &rest[len..];
    }
    Some(parts)
}

/// Strings mixing separators, digits, colons, escapes, controls and non-ASCII.
fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c|:0-9]{0,6}",
        "[\"\\\\/\u{0}-\u{1f}\u{7f}-\u{9f}]{0,4}",
        any::<String>(),
        "[é😀\u{2028}\u{ffff}a]{0,4}",
    ]
}

fn key() -> impl Strategy<Value = SandboxKey> {
    (tricky(), tricky(), tricky(), tricky())
        .prop_map(|(s, t, a, c)| SandboxKey::conversation(s, t, a).with_call(c))
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn separator_shift_never_collides() {
    assert_ne!(
        docker_name_preimage(&["a|b", "c"]),
        docker_name_preimage(&["a", "b|c"])
    );
    assert_ne!(
        docker_name_preimage(&["1:a", ""]),
        docker_name_preimage(&["", "1:a"])
    );
    let left = SandboxKey::conversation("a|b", "c", "x");
    let right = SandboxKey::conversation("a", "b|c", "x");
    assert_ne!(
        docker_container_name(&left, "k", ""),
        docker_container_name(&right, "k", "")
    );
    assert_ne!(
        json_dumps_list(&["a|b", "c"]),
        json_dumps_list(&["a", "b|c"])
    );
    assert_ne!(json_dumps_list(&["a\", \"b"]), json_dumps_list(&["a", "b"]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn preimage_decodes_to_its_parts(parts in prop::collection::vec(tricky(), 0..6)) {
        // Decodable back to the same list means no other list shares the preimage.
        prop_assert_eq!(decode_preimage(&docker_name_preimage(&parts)), Some(parts));
    }

    #[test]
    fn distinct_part_lists_have_distinct_preimages(
        a in prop::collection::vec("[ab|:1]{0,3}", 0..4),
        b in prop::collection::vec("[ab|:1]{0,3}", 0..4),
    ) {
        prop_assert_eq!(a == b, docker_name_preimage(&a) == docker_name_preimage(&b));
        prop_assert_eq!(a == b, json_dumps_list(&a) == json_dumps_list(&b));
    }

    #[test]
    fn python_json_is_ascii_and_round_trips(items in prop::collection::vec(tricky(), 0..5)) {
        let json = json_dumps_list(&items);
        prop_assert!(json.is_ascii());
        prop_assert!(json.bytes().all(|b| (0x20..0x7f).contains(&b)), "no raw controls: {:?}", json);
        let back: Vec<String> = serde_json::from_str(&json).expect("valid JSON");
        prop_assert_eq!(back, items);
    }

    #[test]
    fn printable_ascii_is_kept_verbatim(s in "[ !#-\\[\\]-~]{0,20}") {
        prop_assert_eq!(json_dumps_list(&[&s]), format!("[\"{s}\"]"));
    }

    #[test]
    fn sbx_digest_is_a_prefix_of_the_json_sha256(
        parts in prop::collection::vec(tricky(), 0..4),
        n in 0usize..=64,
    ) {
        let full = hex_sha256(json_dumps_list(&parts).as_bytes());
        prop_assert_eq!(sbx_digest(n, &parts), full[..n].to_owned());
    }

    #[test]
    fn docker_name_shape(key in key(), kind in tricky(), egress in tricky()) {
        let name = docker_container_name(&key, &kind, &egress);
        let hex = name.strip_prefix(DOCKER_NAME_PREFIX).expect("the prefix");
        prop_assert_eq!(hex.len(), 12);
        prop_assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn key_label_round_trips(key in key()) {
        let label = docker_key_label(&key);
        prop_assert!(label.len() <= 4096);
        prop_assert!(!label.is_empty(), "short keys always get a label: {:?}", key);
        prop_assert_eq!(label.len() % 4, 0, "padded");
        prop_assert!(label.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'=')));
        prop_assert_eq!(decode_docker_key_label(&label), Some(key));
    }

    #[test]
    fn label_values_are_safe_and_only_digest_when_needed(raw in tricky()) {
        let value = label_value(&raw);
        prop_assert!(!value.is_empty() && value.len() <= 63);
        prop_assert!(value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')));
        if value != raw {
            prop_assert!(is_digest_label(&value));
            prop_assert_eq!(value, format!("sha256-{}", &hex_sha256(raw.as_bytes())[..48]));
        } else {
            prop_assert!(!is_digest_label(&raw));
        }
    }

    #[test]
    fn sbx_names_nest_and_fit(key in key(), kind in tricky(), prefix in "[a-z0-9]{1,16}") {
        let prefix = NamePrefix::new(prefix).expect("a valid prefix");
        let name = sbx_sandbox_name(&prefix, &key, &kind);
        let key_prefix = sbx_key_prefix(&prefix, &key);
        let conversation = sbx_conversation_prefix(&prefix, &key);
        prop_assert!(name.len() <= 49);
        prop_assert!(name.starts_with(&key_prefix));
        prop_assert!(key_prefix.starts_with(&conversation));
        prop_assert_eq!(&conversation, &sbx_conversation_prefix(&prefix, &key.conversation_key()));
        prop_assert_eq!(name.len(), prefix.as_str().len() + 1 + 12 + 1 + 10 + 1 + 8);
    }

    #[test]
    fn invalid_prefixes_are_refused(prefix in "[a-zA-Z0-9_ -]{0,20}") {
        let valid = (1..=16).contains(&prefix.len())
            && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        prop_assert_eq!(NamePrefix::new(prefix).is_ok(), valid);
    }
}
