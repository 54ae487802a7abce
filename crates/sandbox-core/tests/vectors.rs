//! Every reference vector of `tests/data/names.json` (a copy of the shared Python-generated vectors) is
//! reproduced byte for byte, including the hand-written cases, and none is skipped.

use sandbox_core::naming::docker::{docker_container_name, docker_key_label, label_value};
use sandbox_core::naming::sbx::{sbx_conversation_prefix, sbx_sandbox_name, NamePrefix};
use sandbox_core::SandboxKey;
use serde_json::{Map, Value};

const VECTORS: &str = include_str!("data/names.json");

fn field<'a>(entry: &'a Map<String, Value>, name: &str) -> &'a str {
    entry
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("vector entry without string field {name:?}: {entry:?}"))
}

fn key_of(entry: &Map<String, Value>) -> SandboxKey {
    SandboxKey::conversation(
        field(entry, "scope"),
        field(entry, "thread_id"),
        field(entry, "agent_id"),
    )
    .with_call(field(entry, "call_id"))
}

fn check_docker_name(entry: &Map<String, Value>) {
    let key = key_of(entry);
    let kind = field(entry, "kind");
    assert_eq!(
        docker_container_name(&key, kind, ""),
        field(entry, "container_name"),
        "container name of {entry:?}"
    );
    assert_eq!(
        docker_key_label(&key),
        field(entry, "key_label"),
        "key label of {entry:?}"
    );
}

fn check_sbx_name(entry: &Map<String, Value>) {
    let key = key_of(entry);
    let prefix =
        NamePrefix::new(field(entry, "name_prefix")).expect("a valid prefix in the vectors");
    assert_eq!(
        sbx_sandbox_name(&prefix, &key, field(entry, "kind")),
        field(entry, "sandbox_name"),
        "sandbox name of {entry:?}"
    );
    assert_eq!(
        sbx_conversation_prefix(&prefix, &key),
        field(entry, "conversation_prefix"),
        "conversation prefix of {entry:?}"
    );
}

fn check_label_value(entry: &Map<String, Value>) {
    assert_eq!(
        label_value(field(entry, "raw")),
        field(entry, "label_value"),
        "label value of {entry:?}"
    );
}

/// Checks every entry of one section (an object of named arrays, recursing into nested sections such as
/// `hand_cases`), returning how many entries were checked.
fn check_section(section: &Map<String, Value>) -> usize {
    let mut checked = 0;
    for (name, value) in section {
        match value {
            Value::Array(entries) => {
                let check: fn(&Map<String, Value>) = match name.as_str() {
                    "docker_names" => check_docker_name,
                    "sbx_names" => check_sbx_name,
                    "docker_label_values" => check_label_value,
                    other => panic!("unknown vector list {other:?}: add a check for it"),
                };
                for entry in entries {
                    check(entry.as_object().expect("each vector is an object"));
                    checked += 1;
                }
            }
            Value::Object(nested) => checked += check_section(nested),
            other => panic!("unexpected vector section {name:?}: {other:?}"),
        }
    }
    checked
}

/// Counts the entries of the file independently of the checks: every object held in an array.
fn count_entries(value: &Value) -> usize {
    match value {
        Value::Array(items) => items
            .iter()
            .map(|item| usize::from(item.is_object()) + count_entries(item))
            .sum(),
        Value::Object(map) => map.values().map(count_entries).sum(),
        _ => 0,
    }
}

#[test]
fn every_reference_vector_matches() {
    let root: Value = serde_json::from_str(VECTORS).expect("names.json parses");
    let sections = root.as_object().expect("the vectors are an object");
    for required in [
        "docker_names",
        "sbx_names",
        "docker_label_values",
        "hand_cases",
    ] {
        assert!(
            sections.contains_key(required),
            "missing section {required:?}"
        );
    }
    let hand_cases = sections["hand_cases"]
        .as_object()
        .expect("hand_cases is an object");
    assert!(
        count_entries(&sections["hand_cases"]) > 0 && !hand_cases.is_empty(),
        "hand_cases holds entries"
    );

    let checked = check_section(sections);
    let total = count_entries(&root);
    assert_eq!(checked, total, "every entry of names.json is checked");
    assert!(total > 0);
}
