//! The egress proxy's path normaliser and path patterns against a plain model of the rules
//! (`pathrule_model.rs`): the same targets refused, the same normalised form otherwise, a
//! normalised target normalising to itself, and a pattern matching exactly where the model's
//! does.
#![no_main]

use egress_proxy::pathrule::{normalize, PathPattern};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/egress-proxy/src/pathrule_model.rs"]
mod pathrule_model;
use pathrule_model::{model_matches, model_normalize};

fuzz_target!(|input: (String, String)| {
    let (pattern, target) = input;
    let normalized = normalize(&target).ok();
    assert_eq!(
        normalized.as_ref().map(|n| n.target()),
        model_normalize(&target),
        "{target:?}"
    );
    if let Some(normal) = &normalized {
        assert_eq!(normalize(&normal.target()).as_ref(), Ok(normal));
        assert!(!normal.path.contains("//") && !normal.path.contains("/../"));
    }
    if let (Ok(parsed), Some(normal)) = (PathPattern::parse(&pattern), &normalized) {
        assert_eq!(
            parsed.matches(&normal.path),
            model_matches(&pattern, &target),
            "{pattern:?} {target:?}"
        );
    }
});
