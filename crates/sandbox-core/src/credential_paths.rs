//! Credential paths a host never exposes (host-hygiene §3), from one data file, and pure matchers over them.
//!
//! The list lives in `credential_paths.txt` beside this file so that every consumer (both backends and the
//! operator CLI) shares it and it cannot drift. The matchers are lexical: callers resolve links first (a
//! source is judged by where it really is), then ask here.

use std::fmt;
use std::sync::OnceLock;

use crate::error::SandboxError;
use crate::guest_path::{norm, relative_to};

const DATA: &str = include_str!("credential_paths.txt");

/// One credential path, relative to the home directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CredentialPath {
    relative: &'static str,
    whole_tree: bool,
}

impl CredentialPath {
    /// The path relative to the home directory, normalised, without a leading `/` (`.ssh/id_rsa`).
    pub fn relative(&self) -> &'static str {
        self.relative
    }

    /// Whether the whole tree under the path is credential material (`.config/gh`), rather than one file
    /// (`.aws/credentials`). Matching treats both alike: a source is refused if it is, contains or lies under
    /// the path.
    pub fn whole_tree(&self) -> bool {
        self.whole_tree
    }

    /// The absolute path under `home`.
    pub fn under(&self, home: &str) -> String {
        norm(&format!("{}/{}", norm(home), self.relative))
    }
}

impl fmt::Display for CredentialPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "~/{}", self.relative)
    }
}

/// Parses the data file. A malformed line is a build defect, caught by this module's tests.
fn parse(data: &'static str) -> Result<Vec<CredentialPath>, String> {
    let mut out: Vec<CredentialPath> = Vec::new();
    for (number, line) in data.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(kind), Some(relative), None) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("line {}: expected `<kind> <path>`", number + 1));
        };
        let whole_tree = match kind {
            "tree" => true,
            "file" => false,
            other => return Err(format!("line {}: unknown kind {other:?}", number + 1)),
        };
        let normal = relative_to(relative, ".").is_some()
            && norm(relative) == relative
            && relative != "."
            && !relative.split('/').any(|c| c == "..");
        if !normal {
            return Err(format!(
                "line {}: {relative:?} is not a normalised path below the home directory",
                number + 1
            ));
        }
        if out.iter().any(|p| p.relative == relative) {
            return Err(format!("line {}: {relative:?} listed twice", number + 1));
        }
        out.push(CredentialPath {
            relative,
            whole_tree,
        });
    }
    Ok(out)
}

/// Every credential path of host-hygiene rules 11 and 12, in file order (home directories first).
pub fn credential_paths() -> &'static [CredentialPath] {
    static PARSED: OnceLock<Vec<CredentialPath>> = OnceLock::new();
    PARSED.get_or_init(|| {
        parse(DATA).unwrap_or_else(|e| panic!("credential_paths.txt is malformed: {e}"))
    })
}

/// Whether `inner` is `outer` or lies under it (both absolute and normalised).
fn is_within(inner: &str, outer: &str) -> bool {
    relative_to(inner, outer).is_some()
}

/// The first credential path that the already-resolved absolute `path` is, contains, or lies under, for a
/// host whose home directory is `home`; `None` when it touches none.
///
/// Purely lexical: resolve links before asking. A relative `path` or `home` matches nothing here; use
/// [`check_source`] to refuse those.
///
/// ```
/// use sandbox_core::refuses_source;
/// assert_eq!(refuses_source("/home/u", "/home/u/.ssh/id_rsa").unwrap().relative(), ".ssh");
/// assert!(refuses_source("/home/u", "/home").is_some()); // contains them all
/// assert!(refuses_source("/home/u", "/home/u/project").is_none());
/// ```
pub fn refuses_source(home: &str, path: &str) -> Option<&'static CredentialPath> {
    if !home.starts_with('/') || !path.starts_with('/') {
        return None;
    }
    let path = norm(path);
    credential_paths().iter().find(|credential| {
        let listed = credential.under(home);
        is_within(&path, &listed) || is_within(&listed, &path)
    })
}

/// Refuses a host source to copy into a sandbox (rule 10): a relative path or home →
/// [`SandboxError::InvalidArgument`]; a source that is, contains or lies under a credential path →
/// [`SandboxError::Confinement`] naming it. Resolve links before asking.
pub fn check_source(home: &str, path: &str) -> Result<(), SandboxError> {
    require_absolute("home directory", home)?;
    require_absolute("source", path)?;
    match refuses_source(home, path) {
        None => Ok(()),
        Some(credential) => Err(SandboxError::confinement(
            path,
            format!("it is, contains or lies under the credential path {credential}"),
        )),
    }
}

/// Refuses an sbx workspace root (rule 13): relative, `/`, the home directory or an ancestor of it, or a path
/// inside any credential path → [`SandboxError::InvalidArgument`].
pub fn check_workspace_root(home: &str, root: &str) -> Result<(), SandboxError> {
    require_absolute("home directory", home)?;
    require_absolute("workspace root", root)?;
    let root = norm(root);
    let refuse = |why: String| {
        Err(SandboxError::invalid(format!(
            "workspace root {root:?} {why}"
        )))
    };
    if root == "/" {
        return refuse("is the file-system root".to_owned());
    }
    if is_within(&norm(home), &root) {
        return refuse(format!(
            "is the home directory {home:?} or an ancestor of it"
        ));
    }
    if let Some(credential) = credential_paths()
        .iter()
        .find(|credential| is_within(&root, &credential.under(home)))
    {
        return refuse(format!("lies inside the credential path {credential}"));
    }
    Ok(())
}

fn require_absolute(what: &str, path: &str) -> Result<(), SandboxError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(SandboxError::invalid(format!(
            "{what} {path:?} must be an absolute path"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const HOME: &str = "/home/u";

    #[test]
    fn data_file_parses_with_both_lists() {
        let all = credential_paths();
        assert_eq!(
            all.len(),
            40,
            "8 home entries (rule 11) and 32 credential entries (rule 12)"
        );
        let find = |r: &str| all.iter().find(|p| p.relative() == r).copied();
        for home_entry in [
            ".aws",
            ".ssh",
            ".docker",
            ".kube",
            ".gnupg",
            ".netrc",
            ".gitconfig",
            ".git-credentials",
        ] {
            assert!(find(home_entry).unwrap().whole_tree(), "{home_entry}");
        }
        assert!(!find(".cargo/credentials.toml").unwrap().whole_tree());
        assert!(find(".config/containers").unwrap().whole_tree());
        assert!(find(".local/state/sandboxes").unwrap().whole_tree());
        assert_eq!(find(".ssh").unwrap().to_string(), "~/.ssh");
    }

    #[test]
    fn parse_refuses_malformed_lines() {
        for bad in [
            "tree",
            "dir .aws",
            "tree /abs",
            "tree ../up",
            "tree a/../b",
            "tree a//b",
            "tree .",
            "tree a b",
            "tree .aws\nfile .aws",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("# c\n\n  file  .npmrc  \n").unwrap().len(), 1);
    }

    #[test]
    fn source_table() {
        let cases: &[(&str, Option<&str>)] = &[
            ("/home/u/.ssh", Some(".ssh")),
            ("/home/u/.ssh/", Some(".ssh")),
            ("/home/u/.ssh/id_ed25519", Some(".ssh")),
            ("/home/u/.docker/config.json", Some(".docker")),
            ("/home/u/.config/gh/hosts.yml", Some(".config/gh")),
            ("/home/u/.config", Some(".config/gh")),
            ("/home/u/.cargo", Some(".cargo/credentials")),
            (
                "/home/u/.cargo/credentials.toml",
                Some(".cargo/credentials.toml"),
            ),
            ("/home/u/.local/state", Some(".local/state/sandboxes")),
            (
                "/home/u/.local/state/sandboxes/vm/disk",
                Some(".local/state/sandboxes"),
            ),
            ("/home/u", Some(".aws")),
            ("/home", Some(".aws")),
            ("/", Some(".aws")),
            ("/home/u/x/../.aws", Some(".aws")),
            ("/home/u/project", None),
            ("/home/u/.sshx", None),
            ("/home/u/.cargo/registry", None),
            ("/home/u/.config/ghx", None),
            ("/home/u/.local/state/other", None),
            ("/home/uu/.ssh", None),
            ("/tmp/data", None),
        ];
        for (path, want) in cases {
            assert_eq!(
                refuses_source(HOME, path).map(|c| c.relative()),
                *want,
                "{path:?}"
            );
            assert_eq!(check_source(HOME, path).is_ok(), want.is_none(), "{path:?}");
        }
        let e = check_source(HOME, "/home/u/.aws/config").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        assert!(e.to_string().contains("~/.aws"), "{e}");
    }

    #[test]
    fn source_refuses_relative_input() {
        assert_eq!(refuses_source("home/u", "/home/u/.ssh"), None);
        assert_eq!(refuses_source(HOME, ".ssh"), None);
        for (home, path) in [("home/u", "/x"), (HOME, ".ssh"), (HOME, "")] {
            assert_eq!(
                check_source(home, path).unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
        }
    }

    #[test]
    fn workspace_root_table() {
        let cases: &[(&str, bool)] = &[
            ("/", false),
            ("//", false),
            ("/home", false),
            ("/home/u", false),
            ("/home/u/", false),
            ("/home/u/.ssh/work", false),
            ("/home/u/.config/gcloud/ws", false),
            ("/home/u/.local/state/sandboxes", false),
            ("/home/u/.local/state/sandboxes/ws", false),
            ("/home/u/.local/state/maf-sandbox-sbx/workspaces", true),
            ("/home/u/.local/state", true),
            ("/home/u/work", true),
            ("/home/uu", true),
            ("/srv/ws", true),
        ];
        for (root, ok) in cases {
            let got = check_workspace_root(HOME, root);
            assert_eq!(got.is_ok(), *ok, "{root:?}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            }
        }
        assert!(check_workspace_root(HOME, "rel/ws").is_err());
        assert!(check_workspace_root("rel", "/srv/ws").is_err());
    }
}
