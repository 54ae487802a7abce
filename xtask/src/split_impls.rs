//! The split-impl check: a type's inherent `impl` blocks live in the module that defines it.
//!
//! When one type's methods are spread over several modules, each module can reach everything the
//! type holds, and no import says which part uses which: the dependencies are hidden from the
//! reader and from the layering and module-circle checks (`docs/architecture.md#layering-rules`).
//! A type that needs several files of behaviour is several types, each holding what it uses.
//! Trait impls are not counted: implementing a trait for a type elsewhere is how traits work.
//!
//! How it reads a crate: the module files of each library or binary root (as the module-circle
//! check finds them, comments and `#[cfg(test)]` modules removed), and in each the items that
//! start a line with `impl` (or `unsafe impl`). An impl whose header names a trait (`… for …`) is
//! skipped; an inherent one counts for its type's last path segment, without generics. A type
//! defined in the module holding the impl is that module's; one defined in exactly one other
//! module of the crate is that module's. A type whose inherent impls are not all in its defining
//! module is reported, unless [`ALLOWED_SPLITS`] names it with a reason.
//!
//! What it does not do: expand macros, read inline modules as modules of their own, or tell
//! apart two types of one name defined in two modules (an impl of such a name outside both is
//! reported against every module that holds one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::error::XtaskError;

/// Splits that are right today, as (crate, type, why). Each entry is a decision: a new split
/// fails the check until someone adds it here with its reason.
pub const ALLOWED_SPLITS: &[(&str, &str, &str)] = &[
    (
        "backend-docker",
        "ImageRecipe",
        "pending: each image's build steps are recipe methods in that image's module; they become \
         functions of the module taking the recipe's settings",
    ),
    (
        "backend-qemu",
        "QemuSandbox",
        "pending: the fault reading (`fault`) becomes a type the handle holds, given the VM directory",
    ),
    (
        "backend-sbx",
        "SbxHost",
        "pending: disposal (`disposal`) becomes a component holding the CLI and the host layout it \
         uses, as the Docker backend's did",
    ),
    (
        "sandbox-core",
        "Router",
        "pending: the public router's acquire and disposal paths sit in child modules of `router`; \
         they become components the router holds",
    ),
    (
        "sandbox-core",
        "Inner",
        "pending: the router's shared state, whose disposal half sits in `router::disposal`; it goes \
         with the router's split into components",
    ),
];

/// One inherent impl block: the type it is for and the module holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InherentImpl {
    type_name: String,
    module: String,
}

/// One split found: a type, the module defining it (when known), and the modules with its
/// inherent impls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The crate.
    pub krate: String,
    /// The type's name.
    pub type_name: String,
    /// The module defining it, when one module of the crate does.
    pub defined_in: Option<String>,
    /// Every module holding an inherent impl of it.
    pub impl_modules: Vec<String>,
}

impl Split {
    /// One line for the report.
    pub fn line(&self) -> String {
        let defined = self.defined_in.as_deref().map_or_else(
            || "defined in no one module".to_owned(),
            |m| format!("defined in `{m}`"),
        );
        format!(
            "`{}`: `{}` ({defined}) has inherent impls in modules {}",
            self.krate,
            self.type_name,
            self.impl_modules.join(", ")
        )
    }
}

/// The splits of one crate root that [`ALLOWED_SPLITS`] does not name.
///
/// # Errors
///
/// [`XtaskError::Io`] when a module file cannot be read.
pub fn splits_of_root(krate: &str, root: &Path) -> Result<Vec<Split>, XtaskError> {
    let modules = crate::module_circles::module_code(root)?;
    Ok(unallowed(splits(krate, &modules), ALLOWED_SPLITS))
}

/// The splits `allowed` does not name.
fn unallowed(found: Vec<Split>, allowed: &[(&str, &str, &str)]) -> Vec<Split> {
    found
        .into_iter()
        .filter(|split| {
            !allowed
                .iter()
                .any(|(krate, name, _)| *krate == split.krate && *name == split.type_name)
        })
        .collect()
}

/// Every split among `modules` (path, code) of one crate root.
fn splits(krate: &str, modules: &[(String, String)]) -> Vec<Split> {
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut impls = Vec::new();
    for (module, code) in modules {
        for name in defined_types(code) {
            defined.entry(name).or_default().insert(module.clone());
        }
        for type_name in inherent_impls(code) {
            impls.push(InherentImpl {
                type_name,
                module: module.clone(),
            });
        }
    }
    // (type, home) → modules holding its inherent impls.
    let mut by_home: BTreeMap<(String, Option<String>), BTreeSet<String>> = BTreeMap::new();
    for found in impls {
        let homes = defined.get(&found.type_name);
        let home = match homes {
            Some(homes) if homes.contains(&found.module) => Some(found.module.clone()),
            Some(homes) if homes.len() == 1 => homes.iter().next().cloned(),
            _ => None,
        };
        by_home
            .entry((found.type_name, home))
            .or_default()
            .insert(found.module);
    }
    by_home
        .into_iter()
        .filter(|((_, home), modules)| match home {
            Some(home) => modules.iter().any(|m| m != home),
            None => modules.len() > 1,
        })
        .map(|((type_name, defined_in), modules)| Split {
            krate: krate.to_owned(),
            type_name,
            defined_in,
            impl_modules: modules.into_iter().collect(),
        })
        .collect()
}

/// The names of the structs, enums, unions and type aliases `code` defines.
fn defined_types(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in code.lines() {
        let mut words = line.split_whitespace().peekable();
        // Visibility first (`pub`, `pub(crate)`, `pub(super)`, `pub(in …)`).
        while words.peek().is_some_and(|w| w.starts_with("pub")) {
            words.next();
        }
        if let (Some("struct" | "enum" | "union" | "type"), Some(name)) =
            (words.next(), words.next())
        {
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

/// The type names of the inherent impls in `code`: items starting a line with `impl` or
/// `unsafe impl`, whose header (up to its `{`) names no trait.
fn inherent_impls(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        let item = trimmed.strip_prefix("unsafe ").unwrap_or(trimmed);
        let Some(after) = item.strip_prefix("impl") else {
            continue;
        };
        if !after.starts_with([' ', '<', '\n']) {
            continue;
        }
        let at = start + (line.len() - after.len());
        let header_end = code[at..].find('{').map_or(code.len(), |end| at + end);
        if let Some(name) = inherent_type(&code[at..header_end]) {
            names.push(name);
        }
    }
    names
}

/// The type an impl header (after `impl`, before `{`) is for, when it names no trait.
fn inherent_type(header: &str) -> Option<String> {
    // Generic parameters and arguments blanked, so `for` and paths are read at the top level.
    let mut top = String::with_capacity(header.len());
    let mut depth = 0usize;
    for c in header.chars() {
        match c {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => top.push(c),
            _ => {}
        }
    }
    let top = top.split(" where ").next().unwrap_or(&top);
    let words: Vec<&str> = top.split_whitespace().collect();
    if words.contains(&"for") {
        return None;
    }
    let path = words.first()?;
    let name: String = path
        .rsplit("::")
        .next()
        .unwrap_or(path)
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(path, code)| ((*path).to_owned(), (*code).to_owned()))
            .collect()
    }

    #[test]
    fn an_inherent_impl_in_another_module_is_a_split() {
        let found = splits(
            "demo",
            &modules(&[
                ("state", "pub(crate) struct State {\n    a: u8,\n}\n\nimpl State {\n    fn a(&self) {}\n}\n"),
                ("exec", "use crate::state::State;\n\nimpl State {\n    pub(crate) fn run(&self) {}\n}\n"),
                ("acquire", "impl<'a> crate::state::State {\n    fn acquire(&self) {}\n}\n"),
            ]),
        );
        assert_eq!(
            found,
            [Split {
                krate: "demo".to_owned(),
                type_name: "State".to_owned(),
                defined_in: Some("state".to_owned()),
                impl_modules: vec!["acquire".to_owned(), "exec".to_owned(), "state".to_owned()],
            }]
        );
        assert!(
            found[0].line().contains("`State` (defined in `state`)"),
            "{}",
            found[0].line()
        );
    }

    #[test]
    fn impls_beside_their_type_and_trait_impls_pass() {
        let found = splits(
            "demo",
            &modules(&[
                (
                    "crate",
                    "pub struct Handle;\nimpl Handle {\n    fn a(&self) {}\n}\nimpl Handle {\n    fn b(&self) {}\n}\n",
                ),
                (
                    "display",
                    "use crate::Handle;\nimpl std::fmt::Display for Handle {\n    fn fmt(&self) {}\n}\nimpl<T: Into<u8>> From<T> for crate::Handle {\n    fn from(t: T) -> Self { Handle }\n}\nunsafe impl Send for Handle {}\nfn f() -> impl Iterator<Item = u8> {\n    std::iter::empty()\n}\n",
                ),
                // Its own type of the same name: not a split of the other.
                ("other", "struct Handle;\nimpl Handle {\n    fn c(&self) {}\n}\n"),
            ]),
        );
        assert_eq!(found, []);
    }

    #[test]
    fn an_allowed_split_passes_and_only_that_one() {
        let files = modules(&[
            (
                "a",
                "pub struct Wide;\npub struct Narrow;\nimpl Wide {}\nimpl Narrow {}\n",
            ),
            (
                "b",
                "use crate::a::{Narrow, Wide};\nimpl Wide {}\nimpl Narrow {}\n",
            ),
        ]);
        let found = splits("demo", &files);
        assert_eq!(found.len(), 2);
        let left = unallowed(found, &[("demo", "Wide", "pending: split in two")]);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].type_name, "Narrow");
        // Another crate's entry allows nothing here.
        let left = unallowed(splits("demo", &files), &[("other", "Wide", "why")]);
        assert_eq!(left.len(), 2);
    }

    #[test]
    fn headers_read_as_inherent_or_trait() {
        assert_eq!(inherent_type(" Foo "), Some("Foo".to_owned()));
        assert_eq!(
            inherent_type("<T: Clone> Foo<T> where T: Send "),
            Some("Foo".to_owned())
        );
        assert_eq!(inherent_type("<'a> a::b::Bar<'a> "), Some("Bar".to_owned()));
        assert_eq!(inherent_type(" Trait for Foo "), None);
        assert_eq!(inherent_type("<T> Trait<T> for Vec<T> "), None);
    }

    #[test]
    fn the_allowed_splits_name_a_reason_each() {
        for (krate, name, why) in ALLOWED_SPLITS {
            assert!(!krate.is_empty() && !name.is_empty(), "{krate} {name}");
            assert!(why.len() > 10, "{krate}::{name} needs a reason");
        }
    }
}
