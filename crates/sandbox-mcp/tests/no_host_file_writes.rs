//! The server writes no sandbox byte to a host file: none of its sources calls the host-file
//! transfers or opens a destination, so the `cp-out` rules have nothing to guard here. A tool that
//! starts to must go through `host_files::copy_out` with an output root, and `docs/mcp.md` must
//! say so; this test then fails as a reminder.

use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

#[test]
fn no_source_moves_sandbox_bytes_to_a_host_file() {
    let all = sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(all.len() >= 5, "the server's sources: {all:?}");
    for path in all {
        let source = std::fs::read_to_string(&path).unwrap();
        for transfer in [
            "copy_out",
            "copy_in",
            "Destination",
            "host_guard",
            "OutDirArg",
        ] {
            assert!(
                !source.contains(transfer),
                "{} uses {transfer}: a tool now moves bytes between a sandbox and a host file; \
                 give it an output root and document the rule in docs/mcp.md",
                path.display()
            );
        }
    }
}
