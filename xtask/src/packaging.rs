//! The manifest fields a published crate needs that `cargo publish --dry-run` does not check:
//! a readme that exists, keywords, and categories crates.io knows (the registry ignores an
//! unknown category with a warning only at upload). It rides along with `cargo xtask layering`,
//! which reads the same `cargo metadata`; `ci`'s `package` step packages the crates themselves.
//!
//! A member with `publish = false` is not checked.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::XtaskError;

/// crates.io's category slugs; the registry drops any other category at upload.
const CATEGORY_SLUGS: &[&str] = &[
    "algorithms",
    "api-bindings",
    "asynchronous",
    "authentication",
    "caching",
    "command-line-interface",
    "command-line-utilities",
    "compression",
    "computer-vision",
    "concurrency",
    "config",
    "cryptography",
    "cryptography::cryptocurrencies",
    "data-structures",
    "database",
    "database-implementations",
    "date-and-time",
    "development-tools",
    "development-tools::build-utils",
    "development-tools::cargo-plugins",
    "development-tools::debugging",
    "development-tools::ffi",
    "development-tools::procedural-macro-helpers",
    "development-tools::profiling",
    "development-tools::testing",
    "email",
    "embedded",
    "emulators",
    "encoding",
    "external-ffi-bindings",
    "filesystem",
    "game-development",
    "game-engines",
    "games",
    "graphics",
    "gui",
    "hardware-support",
    "internationalization",
    "localization",
    "mathematics",
    "memory-management",
    "multimedia",
    "multimedia::audio",
    "multimedia::encoding",
    "multimedia::images",
    "multimedia::video",
    "network-programming",
    "no-std",
    "os",
    "os::linux-apis",
    "os::macos-apis",
    "os::unix-apis",
    "os::windows-apis",
    "parser-implementations",
    "parsing",
    "rendering",
    "rendering::data-formats",
    "rendering::engine",
    "rendering::graphics-api",
    "rust-patterns",
    "science",
    "science::robotics",
    "simulation",
    "template-engine",
    "text-editors",
    "text-processing",
    "value-formatting",
    "visualization",
    "wasm",
    "web-programming",
    "web-programming::http-client",
    "web-programming::http-server",
    "web-programming::websocket",
];

/// crates.io takes at most this many keywords and this many categories.
const MAX_KEYWORDS: usize = 5;
const MAX_CATEGORIES: usize = 5;

/// The longest keyword crates.io takes.
const MAX_KEYWORD_LEN: usize = 20;

/// The domains reserved for examples (RFC 2606, RFC 6761): a repository there is a placeholder.
const PLACEHOLDER_DOMAINS: &[&str] = &[
    "example.invalid",
    "example.com",
    "example.org",
    "example.net",
];

/// The part of one member's `cargo metadata` entry this check reads.
#[derive(Debug, Default, Deserialize)]
pub struct Manifest {
    /// `None` when publishable anywhere; an empty list for `publish = false`.
    #[serde(default)]
    publish: Option<Vec<String>>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    license: Option<String>,
    /// As the manifest gives it, relative to the manifest's directory.
    #[serde(default)]
    readme: Option<String>,
    #[serde(default)]
    repository: Option<String>,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    categories: Vec<String>,
    #[serde(default)]
    manifest_path: PathBuf,
}

/// Checks every publishable member; the error lists every problem, one per line.
///
/// # Errors
/// [`XtaskError::Packaging`] when any member falls short.
pub fn check<'a>(
    members: impl IntoIterator<Item = (&'a str, &'a Manifest)>,
) -> Result<(), XtaskError> {
    let problems: Vec<String> = members
        .into_iter()
        .flat_map(|(name, manifest)| problems(name, manifest))
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Packaging {
            count: problems.len(),
            listing: problems.join("\n"),
        })
    }
}

/// What keeps `name` from being published as this project means it to be.
fn problems(name: &str, manifest: &Manifest) -> Vec<String> {
    if manifest.publish.as_ref().is_some_and(Vec::is_empty) {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut missing = |field: &str| {
        found.push(format!(
            "`{name}` has no `{field}` (or set `publish = false` if it is not meant for crates.io)"
        ));
    };
    if manifest.description.is_none() {
        missing("description");
    }
    if manifest.license.is_none() {
        missing("license");
    }
    if manifest.keywords.is_empty() {
        missing("keywords");
    }
    if manifest.categories.is_empty() {
        missing("categories");
    }
    match &manifest.readme {
        None => missing("readme"),
        Some(readme) => {
            let dir = manifest.manifest_path.parent().unwrap_or(Path::new("."));
            if !dir.join(readme).is_file() {
                found.push(format!("`{name}`'s readme `{readme}` does not exist"));
            }
        }
    }
    if manifest.keywords.len() > MAX_KEYWORDS {
        found.push(format!("`{name}` has more than {MAX_KEYWORDS} keywords"));
    }
    for keyword in &manifest.keywords {
        if !is_keyword(keyword) {
            found.push(format!(
                "`{name}`'s keyword `{keyword}` is not one crates.io takes (a letter, then at most \
                 {MAX_KEYWORD_LEN} letters, digits, `-` or `_` in all)"
            ));
        }
    }
    if manifest.categories.len() > MAX_CATEGORIES {
        found.push(format!(
            "`{name}` has more than {MAX_CATEGORIES} categories"
        ));
    }
    for category in &manifest.categories {
        if !CATEGORY_SLUGS.contains(&category.as_str()) {
            found.push(format!(
                "`{name}`'s category `{category}` is not a crates.io category slug"
            ));
        }
    }
    if let Some(repository) = &manifest.repository {
        if is_placeholder(repository) {
            found.push(format!(
                "`{name}`'s repository `{repository}` is a placeholder: name the real one or none"
            ));
        }
    }
    found
}

fn is_keyword(keyword: &str) -> bool {
    keyword.len() <= MAX_KEYWORD_LEN
        && keyword.starts_with(|c: char| c.is_ascii_alphabetic())
        && keyword
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn is_placeholder(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    PLACEHOLDER_DOMAINS
        .iter()
        .any(|domain| host == *domain || host.ends_with(&format!(".{domain}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publishable manifest whose readme is this crate's own `Cargo.toml` (a file that exists).
    fn complete() -> Manifest {
        Manifest {
            publish: None,
            description: Some("d".into()),
            license: Some("MIT".into()),
            readme: Some("Cargo.toml".into()),
            repository: None,
            keywords: vec!["sandbox".into()],
            categories: vec!["development-tools::testing".into()],
            manifest_path: Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"),
        }
    }

    #[test]
    fn a_complete_manifest_passes_and_an_unpublished_one_is_not_checked() {
        assert_eq!(problems("a", &complete()), Vec::<String>::new());
        let unpublished = Manifest {
            publish: Some(Vec::new()),
            ..Manifest::default()
        };
        assert_eq!(problems("a", &unpublished), Vec::<String>::new());
        assert!(check([("a", &complete())]).is_ok());
    }

    #[test]
    fn each_shortfall_is_named() {
        let bare = Manifest::default();
        let found = problems("a", &bare).join("\n");
        for field in ["description", "license", "keywords", "categories", "readme"] {
            assert!(found.contains(&format!("no `{field}`")), "{field}: {found}");
        }

        let wrong = Manifest {
            readme: Some("NOT-THERE.md".into()),
            repository: Some("https://example.invalid/sandboxes".into()),
            keywords: vec!["1st".into(), "a".repeat(21), "ok".into()],
            categories: vec!["virtualization".into(), "development-tools::testing".into()],
            ..complete()
        };
        let found = problems("a", &wrong);
        assert_eq!(found.len(), 5, "{found:#?}");
        let found = found.join("\n");
        for needle in ["NOT-THERE.md", "placeholder", "`1st`", "`virtualization`"] {
            assert!(found.contains(needle), "{needle}: {found}");
        }
        assert!(matches!(
            check([("a", &wrong)]),
            Err(XtaskError::Packaging { count: 5, .. })
        ));
    }

    #[test]
    fn only_reserved_example_domains_are_placeholders() {
        assert!(is_placeholder("https://example.invalid/x"));
        assert!(is_placeholder("https://git.EXAMPLE.com/x"));
        assert!(!is_placeholder("https://github.com/example/x"));
        assert!(!is_placeholder("https://notexample.com/x"));
    }
}
