//! The citation check: code comments cite the repository's own `docs/<file>.md#<section>`, never a
//! document that lives outside the repository.
//!
//! The design was once kept in documents outside the repository (a `docker`, `sbx`, `core`,
//! `exec-wrapper`, `host-hygiene` and `conformance` page each, plus two designs called A and B).
//! A comment citing them points a reader at text they cannot open, and drifts from the code
//! without anyone noticing. This check walks every `.rs` file of the workspace and fails, one line
//! per hit, on those citation forms. A citation of `docs/<file>.md` is what replaces them and is
//! never flagged.
//!
//! The outside pages also numbered their rules, so a comment can cite one without naming the page:
//! the word "rule" or "rules" followed by a number, or one of the admission checks' outside labels
//! (a capital A or B followed by one digit). In a comment, a rule number is flagged unless the same
//! comment line cites `docs/` (the repo's own documents number some of their rules too), and an
//! admission label always is.

use std::path::{Path, PathBuf};

use crate::error::XtaskError;

/// The names of the outside pages; a citation is the name followed by `.md`.
const OUTSIDE_PAGES: &[&str] = &[
    "docker",
    "sbx",
    "core",
    "exec-wrapper",
    "host-hygiene",
    "conformance",
];

/// The names of the outside designs; a citation is `design ` followed by one of them as a word.
const OUTSIDE_DESIGNS: &[char] = &['A', 'B'];

/// Paths (relative to the workspace root, `/`-separated; a directory covers everything under it)
/// left unchecked: none. Kept so a large rewrite can land in steps, each step emptying it again.
pub const TEMPORARILY_UNCHECKED: &[&str] = &[];

/// Directories never walked: build output, version control, and the docs themselves.
const SKIPPED_DIRECTORIES: &[&str] = &["target", ".git", "docs"];

/// Checks every `.rs` file under `root`.
///
/// # Errors
///
/// [`XtaskError::StaleCitations`] listing every hit as `path:line: text`;
/// [`XtaskError::Io`] when a directory or file cannot be read.
pub fn check(root: &Path) -> Result<(), XtaskError> {
    let hits = stale_citations(root, TEMPORARILY_UNCHECKED)?;
    if hits.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::StaleCitations(hits))
    }
}

/// Every hit under `root` outside `unchecked`, as `path:line: text`, in path order.
fn stale_citations(root: &Path, unchecked: &[&str]) -> Result<Vec<String>, XtaskError> {
    let mut files = Vec::new();
    collect_files(root, root, unchecked, ".rs", &mut files)?;
    files.sort();
    let mut hits = Vec::new();
    for (relative, path) in files {
        let text = std::fs::read_to_string(&path).map_err(|source| XtaskError::Io {
            action: "read",
            path: path.display().to_string(),
            source,
        })?;
        for (index, line) in text.lines().enumerate() {
            if cites_outside_document(line) {
                hits.push(format!("{relative}:{}: {}", index + 1, line.trim()));
            }
        }
    }
    Ok(hits)
}

/// Every file under `dir` whose name ends with `extension`, as `(path relative to root, path)`,
/// skipping [`SKIPPED_DIRECTORIES`] and the `unchecked` prefixes; links are not followed.
pub(crate) fn collect_files(
    root: &Path,
    dir: &Path,
    unchecked: &[&str],
    extension: &str,
    files: &mut Vec<(String, PathBuf)>,
) -> Result<(), XtaskError> {
    let io_error = |source| XtaskError::Io {
        action: "list",
        path: dir.display().to_string(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        if is_unchecked(&relative, unchecked) {
            continue;
        }
        // `file_type` does not follow links: a linked directory is not walked twice.
        let kind = entry.file_type().map_err(io_error)?;
        if kind.is_dir() {
            if !SKIPPED_DIRECTORIES.contains(&name.as_str()) {
                collect_files(root, &path, unchecked, extension, files)?;
            }
        } else if kind.is_file() && name.ends_with(extension) {
            files.push((relative, path));
        }
    }
    Ok(())
}

fn is_unchecked(relative: &str, unchecked: &[&str]) -> bool {
    unchecked.iter().any(|prefix| {
        relative == *prefix
            || relative
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// Whether a line cites an outside page (`<page>.md` not preceded by `docs/`), an outside design
/// (the word `design`, one space, then one of [`OUTSIDE_DESIGNS`] as a word), or, in its comment,
/// an outside rule ([`cites_outside_rule`]).
fn cites_outside_document(line: &str) -> bool {
    cites_outside_page_or_design(line)
        || line
            .find("//")
            .is_some_and(|at| cites_outside_rule(&line[at..]))
}

/// Whether comment text cites a rule by number ("rule" or "rules", then a number) without citing
/// `docs/` on the same line, or names an admission check by its outside label (A or B, one digit).
fn cites_outside_rule(comment: &str) -> bool {
    let words = |text: &str| {
        text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .map(|word| word.trim_end_matches('.').to_owned())
            .collect::<Vec<_>>()
    };
    let words = words(comment);
    let numbered_rule = words.windows(2).any(|pair| {
        matches!(pair[0].to_ascii_lowercase().as_str(), "rule" | "rules")
            && pair[1].starts_with(|c: char| c.is_ascii_digit())
    });
    let admission_label = words.iter().any(|word| {
        let mut chars = word.chars();
        matches!(
            (chars.next(), chars.next(), chars.next()),
            (Some('A' | 'B'), Some('1'..='9'), None)
        )
    });
    (numbered_rule && !comment.contains("docs/")) || admission_label
}

fn cites_outside_page_or_design(line: &str) -> bool {
    let cites_page = OUTSIDE_PAGES.iter().any(|page| {
        let citation = format!("{page}.md");
        line.match_indices(&citation)
            .any(|(at, _)| !line[..at].ends_with("docs/"))
    });
    let cites_design = OUTSIDE_DESIGNS.iter().any(|design| {
        let citation = format!("design {design}");
        line.match_indices(&citation).any(|(at, _)| {
            !line[at + citation.len()..]
                .chars()
                .next()
                .is_some_and(|next| next.is_alphanumeric() || next == '_')
        })
    });
    cites_page || cites_design
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forms are assembled at run time so this file does not cite them itself.
    fn page(name: &str) -> String {
        format!("{name}.md")
    }

    #[test]
    fn outside_citations_are_found_and_repository_ones_are_not() {
        for page_name in OUTSIDE_PAGES {
            let line = format!("// see {} about {}", page(page_name), "egress");
            assert!(cites_outside_document(&line), "{line}");
        }
        assert!(cites_outside_document(&format!("/// as design {}", 'B')));
        assert!(cites_outside_document(&format!("(design {}).", 'A')));
        for fine in [
            format!("// docs/{}#the-suites", page("conformance")),
            "// docs/sbx-backend.md#naming".to_owned(),
            "// docs/docker-backend.md#names-and-labels".to_owned(),
            "// the design Approach is described in place".to_owned(),
            format!("// a design {}x is not a citation", 'B'),
            "let core = 1;".to_owned(),
        ] {
            assert!(!cites_outside_document(&fine), "{fine}");
        }
        // A repository citation on the line does not excuse an outside one beside it.
        let mixed = format!(
            "// docs/{} and {}",
            page("conformance"),
            page("conformance")
        );
        assert!(cites_outside_document(&mixed));
    }

    #[test]
    fn outside_rule_numbers_are_found_and_repository_ones_are_not() {
        // Assembled at run time, as above.
        let rule = |word: &str, number: &str| format!("{word} {number}");
        for stale in [
            format!(
                "    /// {}: an instance acquired while unclean",
                rule("Rules", "39.7")
            ),
            format!(
                "/// For an allowlist sandbox (host-hygiene {}), the URL",
                rule("rule", "19")
            ),
            format!("    // {} comes first", rule("Rule", "1")),
            format!(
                "/// {} for a container this call created",
                rule("Rules", "18–21")
            ),
            format!(
                "//! the spec-level checks ({}, {})",
                'A'.to_string() + "1",
                "A2"
            ),
            format!("    // {}: the floor", 'B'.to_string() + "7"),
            format!("let x = 1; // ({})", 'B'.to_string() + "1"),
        ] {
            assert!(cites_outside_document(&stale), "{stale}");
        }
        for fine in [
            format!(
                "// docs/architecture.md#layering-rules, {}",
                rule("rule", "6")
            ),
            "// the rules of the wire protocol".to_owned(),
            "// a rule named in place: never follow a link".to_owned(),
            "/// rules 'a' and 'b' differ".to_owned(),
            // Outside a comment, code and strings are not read for rule numbers.
            format!("assert_eq!(msg, \"{}\");", rule("rule", "2")),
            "// sha256 B64 and AB1 and A10 are no labels".to_owned(),
            "let b1 = 2; // x".to_owned(),
        ] {
            assert!(!cites_outside_document(&fine), "{fine}");
        }
    }

    #[test]
    fn the_walk_reports_path_and_line_and_honours_the_unchecked_list() {
        let temp = tempfile::tempdir().unwrap();
        let write = |relative: &str, text: &str| {
            let path = temp.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        let stale = format!("fn a() {{}}\n// per {} naming\n", page("sbx"));
        write("crates/a/src/lib.rs", &stale);
        write("crates/b/src/lib.rs", &stale);
        write("crates/b/src/main.rs", &stale);
        write("crates/a/notes.txt", &stale);
        write("target/debug/build/x.rs", &stale);
        write("docs/example.rs", &stale);
        write("crates/c/src/lib.rs", "// docs/sbx-backend.md#naming\n");
        let line = format!("// per {} naming", page("sbx"));

        let all = stale_citations(temp.path(), &[]).unwrap();
        assert_eq!(
            all,
            [
                format!("crates/a/src/lib.rs:2: {line}"),
                format!("crates/b/src/lib.rs:2: {line}"),
                format!("crates/b/src/main.rs:2: {line}"),
            ]
        );
        let unchecked = stale_citations(temp.path(), &["crates/b/src/lib.rs", "crates/a"]).unwrap();
        assert_eq!(unchecked, [format!("crates/b/src/main.rs:2: {line}")]);
        // A prefix covers a directory, never a sibling whose name merely starts the same way.
        let sibling = stale_citations(temp.path(), &["crates/b/src/lib"]).unwrap();
        assert_eq!(sibling.len(), 3);
    }

    /// The guard itself: the workspace cites no outside document outside the temporary list.
    #[test]
    fn the_workspace_cites_no_outside_document() {
        let workspace = crate::process::Workspace::locate().unwrap();
        match check(workspace.root()) {
            Ok(()) => {}
            Err(XtaskError::StaleCitations(hits)) => panic!(
                "cite docs/<file>.md#<section> or say it in place instead:\n{}",
                hits.join("\n")
            ),
            Err(other) => panic!("{other}"),
        }
    }
}
