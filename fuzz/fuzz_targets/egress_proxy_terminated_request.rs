//! The one request read inside a terminated tunnel, judged as the proxy judges it
//! (`HttpRules::judge_terminated`: parse, body framing, method and path rules, grants, rewrite),
//! against plain models of the request line (`METHOD TARGET HTTP/1.x`), the path rules
//! (`pathrule_model.rs`) and a grant (its port, method, paths, expiry). Whatever the guest sends,
//! the judgement never panics and its upstream head is bounded by what was sent; a request it
//! passes is one the models pass, with the model's method and normalised target, one `Host`, and
//! an `Authorization` field only when the grant applies, carrying the grant's token, never the
//! guest's; a request the parser reads but the models refuse is refused.
#![no_main]

use std::time::{Duration, SystemTime};

use arbitrary::Arbitrary;
use egress_proxy::head::{head_len, Authority, Host, MAX_HEADERS};
use egress_proxy::rules::{Grant, HttpRule, HttpRules};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/egress-proxy/src/pathrule_model.rs"]
mod pathrule_model;
use pathrule_model::{model_matches, model_normalize};

const TOKEN: &str = "fuzz-grant-token";
const GUEST_TOKEN: &str = "guest-own-token";

#[derive(Arbitrary, Debug)]
enum Head {
    /// Any bytes at all.
    Raw(Vec<u8>),
    /// A head assembled from parts, so that the judgement past the parser is reached often.
    Parts {
        method: String,
        target: String,
        /// The `Host` field's value: the tunnel's own, or another.
        host: Option<String>,
        guest_authorization: bool,
        fields: Vec<(String, String)>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    rule_methods: String,
    rule_paths: String,
    grant_methods: Vec<String>,
    grant_paths: Vec<String>,
    /// The tunnel's port: 443, the grant's, or 8443.
    other_port: bool,
    /// The judgement at the grant's expiry instead of before it.
    at_expiry: bool,
    head: Head,
}

fn assemble(head: &Head) -> Vec<u8> {
    match head {
        Head::Raw(bytes) => bytes.clone(),
        Head::Parts {
            method,
            target,
            host,
            guest_authorization,
            fields,
        } => {
            let mut text = format!("{method} {target} HTTP/1.1\r\n");
            text.push_str(&format!(
                "Host: {}\r\n",
                host.as_deref().unwrap_or("api.test")
            ));
            if *guest_authorization {
                text.push_str(&format!("Authorization: Bearer {GUEST_TOKEN}\r\n"));
            }
            for (name, value) in fields {
                text.push_str(&format!("{name}: {value}\r\n"));
            }
            text.push_str("\r\n");
            text.into_bytes()
        }
    }
}

/// The request line as the model reads it: three parts split at single spaces, a token method,
/// a visible-ASCII target, HTTP/1.0 or 1.1.
fn model_request_line(head: &[u8]) -> Option<(String, String, u8)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.split("\r\n").next()?;
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return None;
    };
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if method.is_empty() || !method.bytes().all(tchar) {
        return None;
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return None,
    };
    Some((method.to_owned(), target.to_owned(), minor))
}

/// Whether a methods list (`*` or comma-separated, as a rule writes it) names `method`.
fn model_methods(methods: &[&str], method: &str) -> bool {
    methods.iter().any(|m| *m == "*" || *m == method)
}

fn count_fields(text: &str, name: &str) -> usize {
    text.split("\r\n")
        .skip(1)
        .filter(|f| {
            f.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .count()
}

fuzz_target!(|input: Input| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    let expires = if input.at_expiry {
        2_000_000_000
    } else {
        2_000_000_600
    };
    let rule_text = format!("api.test {} {}", input.rule_methods, input.rule_paths);
    let rule = HttpRule::parse(&rule_text).ok();
    let grant_line = serde_json::json!({
        "host": "api.test",
        "port": 443,
        "methods": input.grant_methods,
        "paths": input.grant_paths,
        "token": TOKEN,
        "expires_unix": expires,
    })
    .to_string();
    let grant = Grant::parse(&grant_line, 1).ok();
    let granted = grant.is_some();
    let rules = HttpRules::new(rule.iter().cloned().collect(), grant.into_iter().collect());
    if !rules.terminates("api.test") {
        return;
    }
    let port = if input.other_port { 8443 } else { 443 };
    let authority = Authority {
        host: Host::Name("api.test".to_owned()),
        port,
    };
    let head = assemble(&input.head);
    let judged = rules.judge_terminated(&head, &authority, now);

    let line = model_request_line(&head);
    let Ok(judged) = judged else {
        let refusal = judged.unwrap_err();
        assert!(matches!(refusal.status, 400 | 403), "{refusal:?}");
        assert!(!refusal.reason.contains(TOKEN), "{refusal:?}");
        return;
    };
    let (method, target, minor) = line.expect("a head the proxy passes has a model request line");
    assert_eq!(judged.head.method, method);
    assert_eq!(judged.head.minor_version, minor);

    // The path rules, as the model reads them.
    let normalized = model_normalize(&target).expect("a passed target normalises");
    if rule.is_some() {
        let methods: Vec<&str> = input.rule_methods.split(',').collect();
        let paths: Vec<&str> = input.rule_paths.split(',').collect();
        assert!(model_methods(&methods, &method), "{rule_text:?} {method:?}");
        assert!(
            paths.iter().any(|p| model_matches(p, &target)),
            "{rule_text:?} {target:?}"
        );
        assert_eq!(judged.verdict.rule, Some(rule_text.as_str()));
    }
    let applies = granted
        && port == 443
        && !input.at_expiry
        && input.grant_methods.contains(&method)
        && input.grant_paths.iter().any(|p| model_matches(p, &target));
    assert_eq!(judged.verdict.credential.is_some(), applies, "{grant_line}");
    assert_eq!(judged.verdict.drop_authorization, granted);

    // What goes upstream: bounded by what was sent (one added space a field at most, the
    // tunnel's `Host`, the grant's `Authorization`, `Content-Length` and `Connection: close`).
    let upstream = &judged.upstream;
    assert_eq!(head_len(upstream), Some(upstream.len()));
    assert!(
        upstream.len() <= head.len() + MAX_HEADERS + 128 + TOKEN.len(),
        "{} from {}",
        upstream.len(),
        head.len()
    );
    let text = std::str::from_utf8(upstream).expect("the upstream head is ASCII");
    let first = text.split("\r\n").next().unwrap_or_default();
    assert_eq!(first, format!("{method} {normalized} HTTP/1.{minor}"));
    assert_eq!(count_fields(text, "host"), 1, "{text:?}");
    assert!(text.ends_with("Connection: close\r\n\r\n"));
    if granted {
        assert!(!text.contains(GUEST_TOKEN), "{text:?}");
        assert_eq!(count_fields(text, "authorization"), usize::from(applies));
    }
    assert_eq!(
        text.matches(TOKEN).count(),
        usize::from(applies),
        "{text:?}"
    );
    if applies {
        assert!(text.contains(&format!("\r\nAuthorization: Bearer {TOKEN}\r\n")));
    }
});
