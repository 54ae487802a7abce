//! The egress proxy's authority parser (CONNECT targets, the authority of absolute URIs): never
//! panics, never accepts port 0 or userinfo, and what it accepts prints back to text that parses
//! to the same authority.
#![no_main]

use egress_proxy::head::parse_authority;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, &str)| {
    let (connect, text) = input;
    let default_port = if connect { None } else { Some(80) };
    let Ok(authority) = parse_authority(text, default_port) else {
        return;
    };
    assert_ne!(authority.port, 0);
    assert!(!text.contains('@'));
    if connect {
        assert!(text.contains(':'), "CONNECT needs a port: {text:?}");
    }
    let printed = authority.to_string();
    assert_eq!(
        parse_authority(&printed, None),
        Ok(authority),
        "{text:?} -> {printed:?}"
    );
});
