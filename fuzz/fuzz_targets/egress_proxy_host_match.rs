//! The egress proxy's host matcher against a plain model of the rule: an entry matches its own
//! name, ASCII case-insensitively; `*.d` matches strict subdomains of `d`, never `d`; a host
//! with an empty label or a character outside letters, digits, `-` and `_` never matches. Entries
//! the allowlist grammar refuses make the allowlist refuse.
#![no_main]

use egress_proxy::hostmatch::Allowlist;
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/egress-proxy/src/hostmatch_model.rs"]
mod hostmatch_model;
use hostmatch_model::model;

fuzz_target!(|input: (Vec<String>, String)| {
    let (entries, host) = input;
    let grammar_ok = !entries.is_empty()
        && entries
            .iter()
            .all(|e| sandbox_core::egress::validate_host(e).is_ok());
    match Allowlist::new(&entries) {
        Err(_) => assert!(!grammar_ok),
        Ok(list) => {
            assert!(grammar_ok);
            assert_eq!(
                list.allows_name(&host),
                model(&entries, &host),
                "{entries:?} {host:?}"
            );
        }
    }
});
