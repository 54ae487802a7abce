//! The egress proxy's request head parser reads bytes a guest controls. It must never panic,
//! and whatever it accepts must rewrite to exactly one origin-form head for the one authority
//! it named: no `Proxy-*` field, one `Host` field, `Connection: close` last, nothing after the
//! blank line.
#![no_main]

use egress_proxy::head::{head_len, parse_head, Host, Target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(head) = parse_head(data) else {
        return;
    };
    let authority = head.target.authority();
    assert_ne!(authority.port, 0);
    if let Host::Name(name) = &authority.host {
        assert_eq!(name, &name.to_ascii_lowercase());
        assert!(!name.is_empty() && name.len() <= 253);
        assert!(name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'));
    }
    let _ = head.plain_body();
    match &head.target {
        Target::Connect(_) => assert!(head.rewrite_origin_form().is_none()),
        Target::Absolute { path, .. } => {
            assert!(path.starts_with('/'));
            let rewritten = head.rewrite_origin_form().expect("absolute form rewrites");
            assert_eq!(head_len(&rewritten), Some(rewritten.len()));
            let text = std::str::from_utf8(&rewritten).expect("the rewrite is ASCII");
            let lines: Vec<&str> = text.trim_end_matches("\r\n").split("\r\n").collect();
            assert!(lines[0].starts_with(&format!("{} /", head.method)));
            assert_eq!(lines.last(), Some(&"Connection: close"));
            let hosts = lines
                .iter()
                .filter(|l| l.to_ascii_lowercase().starts_with("host:"))
                .count();
            assert_eq!(hosts, 1);
            assert!(lines[1].starts_with(&format!("Host: {}", authority.host)));
            assert!(!lines
                .iter()
                .any(|l| l.to_ascii_lowercase().starts_with("proxy-")));
            // The rewrite parses as an origin-form head, which a proxy refuses: it can never be
            // mistaken for a second proxy request.
            assert!(parse_head(&rewritten).is_err());
        }
    }
});
