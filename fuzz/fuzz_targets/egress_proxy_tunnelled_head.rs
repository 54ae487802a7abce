//! The head of a request read inside a terminated tunnel is the guest's. Its parser must never
//! panic; whatever it accepts names the tunnel's own host, and what it becomes upstream for a
//! granted host is exactly one head with one `Host` field and exactly one `Authorization` field,
//! the grant's, however the guest spelled or folded its own.
#![no_main]

use egress_proxy::head::{head_len, parse_tunnelled_head, Authority, Host, Target};
use egress_proxy::rules::Token;
use libfuzzer_sys::fuzz_target;

const TOKEN: &str = "fuzz-grant-token";

fuzz_target!(|data: &[u8]| {
    let authority = Authority {
        host: Host::Name("api.test".to_owned()),
        port: 443,
    };
    let Ok(head) = parse_tunnelled_head(data, &authority) else {
        return;
    };
    assert_eq!(head.target.authority(), &authority);
    let Target::Absolute { path, .. } = &head.target else {
        panic!("a tunnelled head is origin-form");
    };
    assert!(path.starts_with('/'));
    let _ = head.plain_body();
    let token = Token::new(TOKEN.to_owned()).expect("a valid token");
    let value = token.authorization_value();
    let rewritten = head.rewrite_to(path, 443, true, Some(&value));
    assert_eq!(head_len(&rewritten), Some(rewritten.len()));
    let text = std::str::from_utf8(&rewritten).expect("the rewrite is ASCII");
    let fields: Vec<&str> = text.trim_end().split("\r\n").skip(1).collect();
    let named = |name: &str| {
        fields
            .iter()
            .filter(|f| {
                f.split_once(':')
                    .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
            })
            .count()
    };
    assert_eq!(named("host"), 1, "{text:?}");
    assert_eq!(named("authorization"), 1, "{text:?}");
    assert_eq!(text.matches(TOKEN).count(), 1, "{text:?}");
    assert!(text.contains(&format!("\r\nAuthorization: Bearer {TOKEN}\r\n")));
    assert!(text.ends_with("Connection: close\r\n\r\n"));
});
