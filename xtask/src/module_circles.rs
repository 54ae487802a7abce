//! The module-circle check: no three or more modules of one crate import each other in a circle.
//!
//! A crate a newcomer can read bottom-up has modules that form a stack: each names only modules
//! below it. When three or more modules reach each other through their imports, none of them can
//! be read, tested or moved alone (`docs/architecture.md#layering-rules`). Two modules that name
//! each other (a type and its builder, a handle and its stream) are tolerated; a third one joining
//! them is not.
//!
//! How it reads a crate: from each library or binary root file it follows the `mod name;`
//! declarations to the module files (`name.rs` or `name/mod.rs`), skipping a `#[cfg(test)]`
//! module. In each file it finds every path that starts with `crate::` or `super::` outside
//! comments and outside the file's `#[cfg(test)] mod … { … }` blocks (test code is not part of the
//! module's structure), expands `use` groups (`crate::{a::X, b}`), and resolves each path to the
//! longest module that exists. A path from a module to one of its ancestors or descendants is
//! containment (a parent re-exports its children; a child uses its parent's items), not an
//! import between peers, and is no edge. Bare relative paths (`child::X`) name a child and are
//! not read. Every strongly connected set of three or more modules is one circle, reported with
//! its members.
//!
//! What it does not do: it does not expand macros, follow `#[path]` attributes or read inline
//! modules other than test modules as modules of their own (their paths count as their file's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::XtaskError;

/// A module path inside its crate, as segments; the crate root is empty.
type ModulePath = Vec<String>;

/// The smallest circle the check rejects.
const SMALLEST_CIRCLE: usize = 3;

/// One crate's module circles, each as its members' paths (`crate`, `a::b`), sorted.
///
/// # Errors
///
/// [`XtaskError::Io`] when a module file that a `mod` declaration names cannot be read.
pub fn circles_of_crate(root_files: &[PathBuf]) -> Result<Vec<Vec<String>>, XtaskError> {
    let mut found = BTreeSet::new();
    // Each root (library, binary) is its own crate: its modules never see another root's.
    for root in root_files {
        let modules = read_modules(root)?;
        for circle in circles(&modules) {
            found.insert(circle);
        }
    }
    Ok(found.into_iter().collect())
}

/// Every module file reachable from `root` (one library or binary), as its path (`crate`,
/// `a::b`) and its code without comments and `#[cfg(test)]` modules, in the order read.
///
/// # Errors
///
/// [`XtaskError::Io`] when a module file that a `mod` declaration names cannot be read.
pub fn module_code(root: &Path) -> Result<Vec<(String, String)>, XtaskError> {
    Ok(read_modules(root)?
        .into_iter()
        .map(|module| (display(&module.path), module.code))
        .collect())
}

/// One module file as the check sees it: its path and the module paths its code names.
#[derive(Debug)]
struct Module {
    path: ModulePath,
    names: Vec<ModulePath>,
    /// Its code without comments and test modules.
    code: String,
}

/// Every module reachable from `root` through `mod name;` declarations.
fn read_modules(root: &Path) -> Result<Vec<Module>, XtaskError> {
    let mut modules = Vec::new();
    // (file, module path, directory its children live in)
    let root_dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut pending = vec![(root.to_path_buf(), Vec::new(), root_dir)];
    while let Some((file, path, child_dir)) = pending.pop() {
        let text = std::fs::read_to_string(&file).map_err(|source| XtaskError::Io {
            action: "read",
            path: file.display().to_string(),
            source,
        })?;
        let code = without_test_modules(&without_comments(&text));
        for child in declared_children(&code) {
            let flat = child_dir.join(format!("{child}.rs"));
            let nested = child_dir.join(&child).join("mod.rs");
            let (child_file, grandchild_dir) = if flat.is_file() {
                (flat, child_dir.join(&child))
            } else if nested.is_file() {
                (nested, child_dir.join(&child))
            } else {
                // An inline module (`mod x { … }` is not a declaration) or one behind `#[path]`.
                continue;
            };
            let mut child_path = path.clone();
            child_path.push(child);
            pending.push((child_file, child_path, grandchild_dir));
        }
        let names = named_paths(&code, &path);
        modules.push(Module { path, names, code });
    }
    Ok(modules)
}

/// The text with `//` and `/* */` comments blanked out (string literals are left alone: a `//`
/// inside one only hides the rest of its line, which can cost an edge, never invent one).
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").map_or(after.len(), |end| end + 2);
            // Keep the line count: a block comment's newlines stay.
            out.extend(after[..end].chars().filter(|c| *c == '\n'));
            rest = &after[end..];
        } else if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The code without `#[cfg(test)]` modules: an inline one loses its body, a declared one its
/// declaration (so its file is never read).
fn without_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        let is_module = item.starts_with("mod ") || item.starts_with("pub mod ");
        if !is_module {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let semicolon = item.find(';');
        let brace = item.find('{');
        rest = match (brace, semicolon) {
            (Some(open), semicolon) if semicolon.is_none_or(|s| open < s) => {
                &item[matching_brace(item, open)..]
            }
            (_, Some(semicolon)) => &item[semicolon + 1..],
            _ => "",
        };
    }
    out.push_str(rest);
    out
}

/// The index just past the brace that closes the one at `open` (or the end of `text`).
fn matching_brace(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (at, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + at + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The names of `mod name;` declarations (with any visibility), in order.
fn declared_children(code: &str) -> Vec<String> {
    let mut children = Vec::new();
    for statement in code.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        // `mod x` must be the statement's last two words: `mod x { … }` contains a brace, and
        // anything before (`pub`, `pub(crate)`, attributes) is allowed.
        if let [.., "mod", name] = words.as_slice() {
            if is_identifier(name) {
                children.push((*name).to_owned());
            }
        }
    }
    children
}

fn is_identifier(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

/// Every module path `code` names through `crate::` or `super::` (groups expanded; the last
/// segment may be an item: resolution later picks the longest module prefix).
fn named_paths(code: &str, here: &[String]) -> Vec<ModulePath> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for anchor in ["crate::", "super::"] {
        for (at, _) in code.match_indices(anchor) {
            // A word that merely ends in `crate` or `super` (`my_crate::`) is not an anchor.
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            // `super::super::x` is read once, from its first `super`.
            if anchor == "super::" && code[..at].ends_with("super::") {
                continue;
            }
            let mut base: ModulePath = if anchor == "crate::" {
                Vec::new()
            } else {
                here[..here.len().saturating_sub(1)].to_vec()
            };
            let mut rest = &code[at + anchor.len()..];
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            for tail in expand(rest) {
                let mut path = base.clone();
                path.extend(tail);
                paths.push(path);
            }
        }
    }
    paths
}

/// The paths a `use` tree (or a plain path) at the start of `text` spells, as segment lists.
fn expand(text: &str) -> Vec<Vec<String>> {
    let (trees, _) = parse_tree(text);
    trees
}

/// Parses `seg::seg::{tree, tree}` or `seg::seg` at the start of `text`; returns the expanded
/// paths and the rest of the text.
fn parse_tree(text: &str) -> (Vec<Vec<String>>, &str) {
    let mut prefix = Vec::new();
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut paths = Vec::new();
            let mut inner = group;
            loop {
                inner = inner.trim_start();
                if let Some(after) = inner.strip_prefix('}') {
                    return (
                        paths
                            .into_iter()
                            .map(|tail: Vec<String>| [prefix.clone(), tail].concat())
                            .collect(),
                        after,
                    );
                }
                if let Some(after) = inner.strip_prefix(',') {
                    inner = after;
                    continue;
                }
                let (subtrees, after) = parse_tree(inner);
                if after.len() == inner.len() {
                    // Not a path (a glob, `self`, or text the parser does not know): skip one char.
                    inner = &inner[inner.chars().next().map_or(0, char::len_utf8)..];
                } else {
                    inner = after;
                }
                paths.extend(subtrees);
                if inner.is_empty() {
                    return (vec![prefix], inner);
                }
            }
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let segment = &rest[..end];
        if segment.is_empty() || segment == "self" {
            return (vec![prefix], &rest[end..]);
        }
        prefix.push(segment.to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return (vec![prefix], rest),
        }
    }
}

/// The circles among `modules`: strongly connected sets of at least [`SMALLEST_CIRCLE`] modules
/// under the peer-import edges.
fn circles(modules: &[Module]) -> Vec<Vec<String>> {
    let known: BTreeSet<&ModulePath> = modules.iter().map(|m| &m.path).collect();
    let mut edges: BTreeMap<&ModulePath, BTreeSet<&ModulePath>> = BTreeMap::new();
    for module in modules {
        let targets = edges.entry(&module.path).or_default();
        for named in &module.names {
            let Some(target) = (0..=named.len())
                .rev()
                .map(|len| &named[..len])
                .find_map(|prefix| known.iter().copied().find(|k| k.as_slice() == prefix))
            else {
                continue;
            };
            if !is_containment(&module.path, target) {
                targets.insert(target);
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|set| set.len() >= SMALLEST_CIRCLE)
        .map(|set| set.into_iter().map(|path| display(path)).collect())
        .collect()
}

/// Whether one of the two paths is an ancestor of (or equal to) the other.
fn is_containment(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn display(path: &[String]) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        path.join("::")
    }
}

/// Tarjan's algorithm over `edges`; each set is sorted.
fn strongly_connected<'a>(
    edges: &BTreeMap<&'a ModulePath, BTreeSet<&'a ModulePath>>,
) -> Vec<BTreeSet<&'a ModulePath>> {
    struct Walk<'a, 'e> {
        edges: &'e BTreeMap<&'a ModulePath, BTreeSet<&'a ModulePath>>,
        index: BTreeMap<&'a ModulePath, usize>,
        low: BTreeMap<&'a ModulePath, usize>,
        stack: Vec<&'a ModulePath>,
        on_stack: BTreeSet<&'a ModulePath>,
        sets: Vec<BTreeSet<&'a ModulePath>>,
    }
    impl<'a> Walk<'a, '_> {
        fn visit(&mut self, node: &'a ModulePath) {
            let number = self.index.len();
            self.index.insert(node, number);
            self.low.insert(node, number);
            self.stack.push(node);
            self.on_stack.insert(node);
            let next: Vec<&'a ModulePath> = self
                .edges
                .get(node)
                .map(|t| t.iter().copied().collect())
                .unwrap_or_default();
            for target in next {
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[node].min(self.low[target]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[node].min(self.index[target]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut set = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    set.insert(top);
                    if top == node {
                        break;
                    }
                }
                self.sets.push(set);
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        sets: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.sets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` (relative path, text) under a fresh directory and returns it.
    fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let temp = tempfile::tempdir().unwrap();
        for (relative, text) in files {
            let path = temp.path().join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        temp
    }

    fn circles_in(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        let temp = fixture(files);
        circles_of_crate(&[temp.path().join("src/lib.rs")]).unwrap()
    }

    #[test]
    fn three_modules_in_a_circle_are_one_circle() {
        let found = circles_in(&[
            ("src/lib.rs", "mod a;\nmod b;\npub mod c;\nmod leaf;\n"),
            ("src/a.rs", "use crate::b::B;\nuse crate::leaf::L;\n"),
            ("src/b.rs", "pub struct B;\nfn f() { crate::c::run(); }\n"),
            ("src/c.rs", "use super::a;\npub fn run() {}\n"),
            ("src/leaf.rs", "pub struct L;\n"),
        ]);
        assert_eq!(found, [vec!["a", "b", "c"]]);
    }

    #[test]
    fn two_modules_naming_each_other_are_tolerated() {
        let found = circles_in(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "use crate::b::B;\n"),
            ("src/b.rs", "use crate::a::A;\nuse crate::c::C;\n"),
            ("src/c.rs", "pub struct C;\n"),
        ]);
        assert_eq!(found, Vec::<Vec<String>>::new());
    }

    #[test]
    fn each_circle_is_reported_with_nested_modules_and_groups() {
        let found = circles_in(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod r;\n"),
            // A group, spread over lines, naming two modules at once.
            ("src/a.rs", "use crate::{\n    b::B,\n    c::{C, D},\n};\n"),
            ("src/b.rs", "pub struct B;\n"),
            ("src/c.rs", "pub struct C;\nuse crate::a::A;\n"),
            ("src/r/mod.rs", "mod x;\nmod y;\nmod z;\npub use x::X;\n"),
            ("src/r/x.rs", "use super::y::Y;\n"),
            ("src/r/y.rs", "use super::super::r::z::Z;\n"),
            ("src/r/z.rs", "pub(crate) fn z() { crate::r::x::go() }\n"),
        ]);
        // a ↔ c only (b names nobody): no circle there; x → y → z → x is one.
        assert_eq!(found, [vec!["r::x", "r::y", "r::z"]]);
        let found = circles_in(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "use crate::{b::B, c::C};\n"),
            ("src/b.rs", "use crate::c::C;\n"),
            ("src/c.rs", "use crate::a::A;\n"),
        ]);
        assert_eq!(found, [vec!["a", "b", "c"]]);
    }

    #[test]
    fn parents_children_comments_and_tests_are_no_edges() {
        let found = circles_in(&[
            // The root names every module and every module names the root: containment.
            (
                "src/lib.rs",
                "mod a;\nmod b;\nmod c;\npub use a::A;\nfn f() { crate::b::g(); }\n",
            ),
            (
                "src/a.rs",
                "use crate::ROOT;\n// crate::b::B is only mentioned\n/* crate::c */\n",
            ),
            (
                "src/b.rs",
                "use crate::c::C;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
            ),
            (
                "src/c.rs",
                "#[cfg(test)]\nmod more;\nfn f() { my_crate::a::x(); }\n",
            ),
            ("src/more.rs", "use crate::b::B;\n"),
        ]);
        assert_eq!(found, Vec::<Vec<String>>::new());
        // The same crate with c really naming a: the circle a → … is still absent (a names
        // nobody), but b → c → a → b appears once a names b in code.
        let found = circles_in(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "fn f() -> crate::b::B { todo() }\n"),
            ("src/b.rs", "use crate::c::C;\n"),
            ("src/c.rs", "use crate::a::A;\n"),
        ]);
        assert_eq!(found, [vec!["a", "b", "c"]]);
    }

    #[test]
    fn a_missing_module_file_is_skipped_and_an_unreadable_root_is_an_error() {
        let found = circles_in(&[("src/lib.rs", "mod gone;\nmod inline { }\n")]);
        assert_eq!(found, Vec::<Vec<String>>::new());
        let temp = tempfile::tempdir().unwrap();
        assert!(matches!(
            circles_of_crate(&[temp.path().join("src/lib.rs")]),
            Err(XtaskError::Io { .. })
        ));
    }
}
