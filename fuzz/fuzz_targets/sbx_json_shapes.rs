//! `sbx … --json` output reaches the host's parsers as untrusted bytes. Whatever they are, no
//! parser panics, and an accepted `ls` listing names every row with a non-empty name, so a
//! changed output shape can never read as "no sandboxes".
#![no_main]

use libfuzzer_sys::fuzz_target;
use sbx_cli::{parse_ls, parse_mcp_ls, parse_policy_check, parse_policy_ls, parse_secret_ls};

fuzz_target!(|data: &[u8]| {
    if let Ok(rows) = parse_ls(data) {
        for row in rows {
            assert!(!row.name.is_empty());
            assert!(row.id.as_deref() != Some(""));
        }
    }
    let _ = parse_mcp_ls(data);
    let _ = parse_policy_ls(data);
    let _ = parse_policy_check(data);
    let _ = parse_secret_ls(data);
});
