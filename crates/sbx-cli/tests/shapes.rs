//! Every JSON shape the parsers read, snapshotted, and every shape they refuse.

use sbx_cli::{
    parse_ls, parse_mcp_ls, parse_policy_check, parse_policy_ls, parse_secret_ls, Error, SbxName,
};

/// The row `sbx ls --json` prints (and the stand-in copies), plus a field nobody reads.
const LS_ROW: &str = r#"{"name":"maf-0123456789ab-0123456789-01234567","id":"9f86d081884c7d659a2feaa0c55ad015",
  "status":"running","agent":"shell","template":"sbx-sim-shell:local",
  "workspaces":["/home/u/.local/state/maf-sandbox-docker-sbx/workspaces/maf-0123456789ab-0123456789-01234567/ws-0123456789ab"],
  "cpus":2,"memory":"2g","created_at":"2026-11-30T16:00:00Z","future_field":{"x":[1,2]}}"#;

#[test]
fn ls_array() {
    let rows = parse_ls(format!("[{LS_ROW}]").as_bytes()).unwrap();
    insta::assert_debug_snapshot!(rows);
}

#[test]
fn ls_keyed_legacy() {
    let keyed = parse_ls(format!(r#"{{"sandboxes":[{LS_ROW}],"total":1}}"#).as_bytes()).unwrap();
    let array = parse_ls(format!("[{LS_ROW}]").as_bytes()).unwrap();
    assert_eq!(keyed, array);
}

#[test]
fn ls_sparse_rows() {
    // Only `name` is required; an empty id is no id; informative fields of another type are
    // dropped, not refused; cpus may be a numeric string.
    let rows = parse_ls(
        br#"[{"name":"a"},
             {"name":"b","id":"","workspaces":null,"status":7,"cpus":"4","memory":2048},
             {"name":"c","id":null,"workspaces":[],"cpus":-1,"created_at":1700000000}]"#,
    )
    .unwrap();
    insta::assert_debug_snapshot!(rows);
    assert_eq!(rows[0].sbx_name(), Some(SbxName::new("a").unwrap()));
}

#[test]
fn ls_row_name_outside_the_name_rule_is_listed_but_has_no_sbx_name() {
    let rows = parse_ls(br#"[{"name":"Someone_Else's"}]"#).unwrap();
    assert_eq!(rows[0].name, "Someone_Else's");
    assert_eq!(rows[0].sbx_name(), None);
}

#[test]
fn empty_listings_are_empty() {
    assert!(parse_ls(b"[]").unwrap().is_empty());
    assert!(parse_ls(b" {\"sandboxes\": []}\n").unwrap().is_empty());
    assert!(parse_mcp_ls(b"[]").unwrap().is_empty());
    assert!(parse_mcp_ls(b"{\"servers\":[]}").unwrap().is_empty());
    assert!(parse_policy_ls(b"{\"rules\":[]}").unwrap().rules.is_empty());
}

#[test]
fn mcp_ls_shapes() {
    let array = parse_mcp_ls(
        br#"[{"name":"sim-mcp","url":"http://127.0.0.1:9/mcp","extra":true},
             {"name":"no-url"}, 42, "bare", null]"#,
    )
    .unwrap();
    insta::assert_debug_snapshot!(array);
    let keyed = parse_mcp_ls(br#"{"servers":[{"name":"sim-mcp","url":"http://127.0.0.1:9/mcp"}]}"#)
        .unwrap();
    assert_eq!(keyed.len(), 1);
    assert_eq!(keyed[0], array[0]);
}

#[test]
fn policy_ls_shape() {
    let list = parse_policy_ls(
        br#"{"rules":[
          {"scope":"global","decision":"allow","status":"active","resource_type":"network",
           "resources":["*.example.com"],"http_targets":[{"host":"example.com","port":443}],"id":"r1"},
          {"scope":"sandbox:maf-1","decision":"deny","status":"active","resource_type":"network",
           "resources":["**"]},
          {"scope":"sandbox:maf-10","decision":"allow","status":"pending"}
        ],"version":3}"#,
    )
    .unwrap();
    insta::assert_debug_snapshot!(list);
    let name = SbxName::new("maf-1").unwrap();
    let mine: Vec<bool> = list
        .rules
        .iter()
        .map(|rule| rule.belongs_to(&name))
        .collect();
    assert_eq!(mine, [false, true, false]);
    let global: Vec<bool> = list
        .rules
        .iter()
        .map(|r| r.is_active_global_allow())
        .collect();
    assert_eq!(global, [true, false, false]);
}

#[test]
fn only_a_global_active_allow_opens_every_sandbox() {
    let rule = |scope: &str, decision: &str, status: &str| {
        let list = parse_policy_ls(
            format!(
                r#"{{"rules":[{{"scope":"{scope}","decision":"{decision}","status":"{status}"}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        list.rules[0].is_active_global_allow()
    };
    assert!(rule("global", "allow", "active"));
    // Each part alone is not enough.
    assert!(!rule("sandbox:maf-1", "allow", "active"));
    assert!(!rule("global", "deny", "active"));
    assert!(!rule("global", "allow", "pending"));
}

#[test]
fn policy_check_shapes() {
    let denied =
        parse_policy_check(br#"{"allowed":false,"governance":{"active":false},"reason":"x"}"#)
            .unwrap();
    let allowed = parse_policy_check(br#"{"allowed":true,"governance":{"active":true}}"#).unwrap();
    insta::assert_debug_snapshot!((denied, allowed));
}

#[test]
fn secret_ls_shapes() {
    let full = parse_secret_ls(
        br#"{"secrets":[{"name":"anthropic","scope":"global"},{"name":"github","scope":"sandbox:maf-1"}],
             "env_only_count":2,
             "custom_secrets":[{"env":"MY_API","scope":"global","targets":["api.example.com"]}],
             "unknown":"ignored"}"#,
    )
    .unwrap();
    insta::assert_debug_snapshot!(full);
    let empty = parse_secret_ls(br#"{"secrets":[]}"#).unwrap();
    assert!(empty.secrets.is_empty() && empty.custom_secrets.is_empty());
    assert_eq!(empty.env_only_count, 0);
}

/// Every refused document and why, so a changed wording or a loosened parser shows up in review.
#[test]
fn wrong_shapes_are_malformed_never_empty() {
    type Parser = fn(&[u8]) -> Result<(), Error>;
    let ls: Parser = |b| parse_ls(b).map(drop);
    let mcp: Parser = |b| parse_mcp_ls(b).map(drop);
    let policy: Parser = |b| parse_policy_ls(b).map(drop);
    let check: Parser = |b| parse_policy_check(b).map(drop);
    let secret: Parser = |b| parse_secret_ls(b).map(drop);
    let cases: &[(&str, Parser, &str)] = &[
        ("ls", ls, ""),
        ("ls", ls, "not json"),
        ("ls", ls, "[] []"),
        ("ls", ls, "null"),
        ("ls", ls, "\"[]\""),
        ("ls", ls, "{}"),
        ("ls", ls, r#"{"sandboxes":null}"#),
        ("ls", ls, r#"{"items":[]}"#),
        ("ls", ls, "[1]"),
        ("ls", ls, r#"[{"id":"x"}]"#),
        ("ls", ls, r#"[{"name":""}]"#),
        ("ls", ls, r#"[{"name":5}]"#),
        ("ls", ls, r#"[{"name":"a","id":5}]"#),
        ("ls", ls, r#"[{"name":"a","workspaces":"/w"}]"#),
        ("ls", ls, r#"[{"name":"a","workspaces":[1]}]"#),
        ("mcp", mcp, ""),
        ("mcp", mcp, "{}"),
        ("mcp", mcp, r#"{"servers":{}}"#),
        ("mcp", mcp, "0"),
        ("policy", policy, "[]"),
        ("policy", policy, "{}"),
        ("policy", policy, r#"{"rules":{}}"#),
        ("policy", policy, r#"{"rules":[1]}"#),
        ("policy", policy, r#"{"rules":[{"scope":1}]}"#),
        ("policy", policy, r#"{"rules":[{"resources":"x"}]}"#),
        ("policy", policy, r#"{"rules":[{"http_targets":[{}]}]}"#),
        ("check", check, "{}"),
        (
            "check",
            check,
            r#"{"allowed":"yes","governance":{"active":false}}"#,
        ),
        ("check", check, r#"{"allowed":true}"#),
        ("check", check, r#"{"allowed":true,"governance":true}"#),
        ("check", check, r#"{"allowed":true,"governance":{}}"#),
        ("secret", secret, "[]"),
        ("secret", secret, "{}"),
        ("secret", secret, r#"{"secrets":{}}"#),
        ("secret", secret, r#"{"secrets":[1]}"#),
        ("secret", secret, r#"{"secrets":[],"env_only_count":-1}"#),
        ("secret", secret, r#"{"secrets":[],"env_only_count":"2"}"#),
        (
            "secret",
            secret,
            r#"{"secrets":[],"custom_secrets":[{"targets":"x"}]}"#,
        ),
    ];
    let mut report = String::new();
    for (what, parse, input) in cases {
        match parse(input.as_bytes()) {
            Err(err @ Error::Malformed { .. }) => {
                report.push_str(&format!("{what} {input:?}\n    {err}\n"));
            }
            other => panic!("{what} {input:?} should be malformed, got {other:?}"),
        }
    }
    insta::assert_snapshot!(report);
}
