//! No input makes a parser panic: arbitrary bytes, and arbitrary JSON near the real shapes.

use proptest::prelude::*;
use sbx_cli::{parse_ls, parse_mcp_ls, parse_policy_check, parse_policy_ls, parse_secret_ls};
use serde_json::{json, Value};

fn run_all(bytes: &[u8]) {
    let _ = parse_ls(bytes);
    let _ = parse_mcp_ls(bytes);
    let _ = parse_policy_ls(bytes);
    let _ = parse_policy_check(bytes);
    let _ = parse_secret_ls(bytes);
}

/// Any JSON value, biased towards the keys the parsers look at.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("name".to_owned()),
        Just("id".to_owned()),
        Just("workspaces".to_owned()),
        Just("sandboxes".to_owned()),
        Just("servers".to_owned()),
        Just("rules".to_owned()),
        Just("resources".to_owned()),
        Just("http_targets".to_owned()),
        Just("host".to_owned()),
        Just("allowed".to_owned()),
        Just("governance".to_owned()),
        Just("active".to_owned()),
        Just("secrets".to_owned()),
        Just("env_only_count".to_owned()),
        Just("custom_secrets".to_owned()),
        Just("targets".to_owned()),
        Just("cpus".to_owned()),
        "[a-z_]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|n| json!(n)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        run_all(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(value in json_value()) {
        let text = serde_json::to_vec(&value).unwrap();
        run_all(&text);
        // A parse that succeeds on a keyed document succeeds on its array too, and agrees.
        if let Value::Object(object) = &value {
            if let Some(rows @ Value::Array(_)) = object.get("sandboxes") {
                let keyed = parse_ls(&text);
                let array = parse_ls(&serde_json::to_vec(rows).unwrap());
                prop_assert_eq!(keyed.ok(), array.ok());
            }
        }
    }
}
