//! The egress allowlist host grammar: `validate_host` never panics, and every accepted host holds the
//! grammar's invariants (ASCII labels of 1..=63, at most one leading `*.`, at most 253 characters, no
//! numeric last label).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_core::egress::{validate_host, MAX_HOST_LEN};

fuzz_target!(|host: &str| {
    if validate_host(host).is_err() {
        return;
    }
    assert!(host.len() <= MAX_HOST_LEN, "too long: {host:?}");
    assert_ne!(host, "*");
    let bare = host.strip_prefix("*.").unwrap_or(host);
    for label in bare.split('.') {
        let bytes = label.as_bytes();
        assert!((1..=63).contains(&bytes.len()), "label length in {host:?}");
        assert!(bytes[0].is_ascii_alphanumeric() && bytes[bytes.len() - 1].is_ascii_alphanumeric());
        assert!(
            bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-'),
            "{host:?}"
        );
    }
    let last = bare.rsplit('.').next().unwrap_or(bare);
    assert!(
        !last.bytes().all(|b| b.is_ascii_digit()),
        "numeric last label: {host:?}"
    );
    let hex_literal = (last.starts_with("0x") || last.starts_with("0X"))
        && last[2..].bytes().all(|b| b.is_ascii_hexdigit());
    assert!(!hex_literal, "hex last label: {host:?}");
});
