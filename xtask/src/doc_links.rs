//! The doc-link check: every citation of the repository's own documents resolves, to the file
//! and to the heading its anchor names.
//!
//! Code comments cite `docs/<file>.md#<section>` ([`crate::citations`] keeps them from citing
//! anything else), and the documents link to each other the same way. A heading renamed without
//! its citations leaves a reader at the top of a long page, or at no page at all, with nothing
//! failing. This check reads every `.rs` file of the workspace for `docs/<file>.md[#anchor]` and
//! every Markdown file under `docs/`, the workspace root and each crate root for relative links
//! (`](file.md#anchor)`, `](#anchor)`), and resolves each: the file must exist and, when an
//! anchor is given, one of its headings must have that anchor as the usual renderers compute it
//! ([`anchor_of`]). Links with a scheme (`https:`) or to non-Markdown files are not its business.
//!
//! It does not read headings written as HTML, explicit `<a name>` anchors, or links inside code
//! spans; the repository's documents use none of them as link targets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::citations::collect_files;
use crate::error::XtaskError;

/// Checks every citation and link under `root`.
///
/// # Errors
///
/// [`XtaskError::BrokenDocLinks`] listing every unresolved one as `path:line: target (why)`;
/// [`XtaskError::Io`] when a directory or file cannot be read.
pub fn check(root: &Path) -> Result<(), XtaskError> {
    let broken = broken_links(root)?;
    if broken.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::BrokenDocLinks(broken))
    }
}

/// One citation or link: where it is written and what it names, relative to the workspace root.
struct Link {
    at: String,
    line: usize,
    file: String,
    anchor: Option<String>,
}

fn broken_links(root: &Path) -> Result<Vec<String>, XtaskError> {
    let mut links = Vec::new();
    let mut rust_files = Vec::new();
    collect_files(root, root, &[], ".rs", &mut rust_files)?;
    rust_files.sort();
    for (relative, path) in rust_files {
        for (index, line) in read(&path)?.lines().enumerate() {
            for (file, anchor) in cited_docs(line) {
                links.push(Link {
                    at: relative.clone(),
                    line: index + 1,
                    file,
                    anchor,
                });
            }
        }
    }
    for (relative, path) in markdown_files(root)? {
        let directory = Path::new(&relative)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for (index, line) in outside_code_blocks(&read(&path)?) {
            for (target, anchor) in relative_links(line) {
                let file = if target.is_empty() {
                    relative.clone()
                } else {
                    normalise(&directory.join(target))
                };
                links.push(Link {
                    at: relative.clone(),
                    line: index + 1,
                    file,
                    anchor,
                });
            }
        }
    }

    let mut anchors: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
    let mut broken = Vec::new();
    for link in links {
        let known = match anchors.get(&link.file) {
            Some(known) => known,
            None => {
                let path = root.join(&link.file);
                let headings = if path.is_file() {
                    Some(heading_anchors(&read(&path)?))
                } else {
                    None
                };
                anchors.entry(link.file.clone()).or_insert(headings)
            }
        };
        let target = match &link.anchor {
            Some(anchor) => format!("{}#{anchor}", link.file),
            None => link.file.clone(),
        };
        let why = match (known, &link.anchor) {
            (None, _) => Some("no such file"),
            (Some(headings), Some(anchor)) if !headings.contains(anchor) => {
                Some("no heading has this anchor")
            }
            _ => None,
        };
        if let Some(why) = why {
            broken.push(format!("{}:{}: {target} ({why})", link.at, link.line));
        }
    }
    Ok(broken)
}

fn read(path: &Path) -> Result<String, XtaskError> {
    std::fs::read_to_string(path).map_err(|source| XtaskError::Io {
        action: "read",
        path: path.display().to_string(),
        source,
    })
}

/// The Markdown files whose links are checked: `docs/`, the root's and each crate's, as
/// `(relative, path)` in path order.
fn markdown_files(root: &Path) -> Result<Vec<(String, PathBuf)>, XtaskError> {
    let mut files = Vec::new();
    let docs = root.join("docs");
    if docs.is_dir() {
        collect_files(root, &docs, &[], ".md", &mut files)?;
    }
    let mut tops = vec![root.to_path_buf()];
    let crates = root.join("crates");
    if crates.is_dir() {
        let io_error = |source| XtaskError::Io {
            action: "list",
            path: crates.display().to_string(),
            source,
        };
        for entry in std::fs::read_dir(&crates).map_err(io_error)? {
            tops.push(entry.map_err(io_error)?.path());
        }
    }
    for top in tops {
        let readme = top.join("README.md");
        if readme.is_file() {
            let relative = normalise(readme.strip_prefix(root).unwrap_or(&readme));
            files.push((relative, readme));
        }
    }
    files.sort();
    Ok(files)
}

/// `/`-separated, with `.` and `..` resolved lexically (a `..` above the root stays, so the file
/// is then reported missing).
fn normalise(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for component in path.components() {
        let part = component.as_os_str().to_string_lossy().into_owned();
        match part.as_str() {
            "." => {}
            ".." if parts.last().is_some_and(|last| last != "..") => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

/// The `docs/<file>.md` citations of a line of code, each with its anchor if any.
fn cited_docs(line: &str) -> Vec<(String, Option<String>)> {
    let mut cited = Vec::new();
    for (at, _) in line.match_indices("docs/") {
        // `../docs/x.md` or `my_docs/`: only a citation that starts the path counts.
        if line[..at]
            .chars()
            .next_back()
            .is_some_and(|before| before.is_alphanumeric() || matches!(before, '_' | '/' | '.'))
        {
            continue;
        }
        let rest = &line[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')))
            .unwrap_or(rest.len());
        // A sentence's full stop is not part of the path.
        let path = rest[..end].trim_end_matches('.');
        if !path.ends_with(".md") {
            // `docs/` followed by a directory or another kind of file.
            continue;
        }
        let file = path.to_owned();
        let anchor = rest[end..].strip_prefix('#').map(|after| {
            after
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_'))
                .collect::<String>()
        });
        cited.push((file, anchor.filter(|anchor| !anchor.is_empty())));
    }
    cited
}

/// The relative Markdown links of a line (`](target.md#anchor)` and `](#anchor)`), each as the
/// target path (empty for the same file) and anchor. Links with a scheme, absolute paths and
/// targets other than `.md` files are left out.
fn relative_links(line: &str) -> Vec<(String, Option<String>)> {
    let mut links = Vec::new();
    for (at, _) in line.match_indices("](") {
        let rest = &line[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        if target.contains(':') || target.starts_with('/') || target.starts_with('<') {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor.to_owned())),
            None => (target, None),
        };
        if !(file.is_empty() || file.ends_with(".md")) || (file.is_empty() && anchor.is_none()) {
            continue;
        }
        links.push((file.to_owned(), anchor));
    }
    links
}

/// The lines of a Markdown text outside fenced code blocks, with their indexes.
fn outside_code_blocks(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"]
            .into_iter()
            .find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (None, None) => lines.push((index, line)),
            _ => {}
        }
    }
    lines
}

/// The anchors of every ATX heading (`#` to `######`) of a Markdown text, duplicates numbered as
/// renderers number them (`x`, `x-1`, `x-2`).
fn heading_anchors(text: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    for (_, line) in outside_code_blocks(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor_of(line[hashes..].trim().trim_end_matches('#').trim_end());
        let mut anchor = base.clone();
        let mut number = 0;
        while anchors.contains(&anchor) {
            number += 1;
            anchor = format!("{base}-{number}");
        }
        anchors.push(anchor);
    }
    anchors
}

/// A heading's anchor: link texts kept and their targets dropped, lower case, every character
/// other than a letter, digit, space, `-` or `_` dropped, each space a `-`.
fn anchor_of(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` reads as `text`.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|at| open + at) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|at| close + at) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples' citations are assembled at run time, so the workspace check below does not
    /// read them as citations of this file's own.
    fn cite(rest: &str) -> String {
        format!("{}{rest}", concat!("do", "cs/"))
    }

    #[test]
    fn anchors_follow_the_renderers_rules() {
        assert_eq!(
            anchor_of("The contract in one page"),
            "the-contract-in-one-page"
        );
        assert_eq!(
            anchor_of("Docker: the engine's init as the call's subreaper"),
            "docker-the-engines-init-as-the-calls-subreaper"
        );
        assert_eq!(
            anchor_of("`cp-out` and `--out-dir`"),
            "cp-out-and---out-dir"
        );
        assert_eq!(
            anchor_of("See [the suites](suites.md#x) here"),
            "see-the-suites-here"
        );
        assert_eq!(anchor_of("Layering_rules 2"), "layering_rules-2");
        let text = "# Top\n## Same\n```\n## Not a heading\n```\n## Same\n#NoSpace\n### Same ##\n";
        assert_eq!(heading_anchors(text), ["top", "same", "same-1", "same-2"]);
    }

    #[test]
    fn citations_and_links_are_read_from_their_forms() {
        let line = format!(
            "// {} and {}. Not my_{} nor ../{}",
            cite("vm.md#image"),
            cite("scale.md"),
            cite("x.md"),
            cite("y.md")
        );
        assert_eq!(
            cited_docs(&line),
            [
                (cite("vm.md"), Some("image".to_owned())),
                (cite("scale.md"), None),
            ]
        );
        let no_file = format!("// see {} for more, {}", cite(""), cite("images/a.png"));
        assert_eq!(cited_docs(&no_file), []);
        assert_eq!(
            relative_links(
                "[a](vm.md#image), [b](#local), [c](https://x.example/a.md#b), [d](../README.md), \
                 [e](pic.png)"
            ),
            [
                ("vm.md".to_owned(), Some("image".to_owned())),
                (String::new(), Some("local".to_owned())),
                ("../README.md".to_owned(), None),
            ]
        );
    }

    #[test]
    fn every_broken_form_is_reported_with_its_place() {
        let temp = tempfile::tempdir().unwrap();
        let write = |relative: &str, text: &str| {
            let path = temp.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            &cite("a.md"),
            "# A\n## Here\n[ok](b.md#there) [bad](b.md#gone) [self](#here) [selfbad](#nope)\n",
        );
        write(
            &cite("b.md"),
            "# B\n## There\n```\n[in code](missing.md)\n```\n",
        );
        write(
            "README.md",
            &format!("[ok]({}) [missing]({})\n", cite("a.md#here"), cite("c.md")),
        );
        write(
            "crates/x/README.md",
            &format!(
                "[up](../../{}) [bad](../../{})\n",
                cite("b.md#there"),
                cite("b.md#b-")
            ),
        );
        write(
            "crates/x/src/lib.rs",
            &format!(
                "// {}\n// {}\n// {}\n",
                cite("a.md#here"),
                cite("a.md#elsewhere"),
                cite("z.md")
            ),
        );
        write("target/debug/x.rs", &format!("// {}\n", cite("z.md")));
        let no_anchor = "(no heading has this anchor)";
        assert_eq!(
            broken_links(temp.path()).unwrap(),
            [
                format!(
                    "crates/x/src/lib.rs:2: {} {no_anchor}",
                    cite("a.md#elsewhere")
                ),
                format!("crates/x/src/lib.rs:3: {} (no such file)", cite("z.md")),
                format!("README.md:1: {} (no such file)", cite("c.md")),
                format!("crates/x/README.md:1: {} {no_anchor}", cite("b.md#b-")),
                format!("{}:3: {} {no_anchor}", cite("a.md"), cite("b.md#gone")),
                format!("{}:3: {} {no_anchor}", cite("a.md"), cite("a.md#nope")),
            ]
        );
    }

    /// The guard itself: every citation and link of the workspace resolves.
    #[test]
    fn the_workspace_has_no_broken_doc_link() {
        let workspace = crate::process::Workspace::locate().unwrap();
        match check(workspace.root()) {
            Ok(()) => {}
            Err(XtaskError::BrokenDocLinks(broken)) => {
                panic!("fix the citation or the heading:\n{}", broken.join("\n"))
            }
            Err(other) => panic!("{other}"),
        }
    }
}
