//! Credential paths a host never exposes, from one data file, and pure matchers over them: entries below
//! every home directory guarded, and for a root caller system entries (`/etc/shadow`, SSH host keys) and
//! every home of the password database ([`CredentialGuard`]).
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

/// One absolute credential path guarded for a root caller (`/etc/shadow`), possibly ending in a `*` that
/// matches any rest of its last component (`/etc/ssh/ssh_host_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SystemCredentialPath {
    pattern: &'static str,
}

impl SystemCredentialPath {
    /// The path as listed, `*` included.
    pub fn pattern(&self) -> &'static str {
        self.pattern
    }

    /// The directory holding the entry and the entry's last component without its `*`, and whether it had
    /// one.
    fn parts(&self) -> (&'static str, &'static str, bool) {
        let (dir, last) = self.pattern.rsplit_once('/').unwrap_or(("", self.pattern));
        let dir = if dir.is_empty() { "/" } else { dir };
        match last.strip_suffix('*') {
            Some(prefix) => (dir, prefix, true),
            None => (dir, last, false),
        }
    }

    /// Whether the absolute, normalised `path` is this entry, contains it, or lies under it.
    fn touches(&self, path: &str) -> bool {
        let (dir, last, glob) = self.parts();
        // `path` contains the entry when it is the entry's directory or an ancestor of it.
        if is_within(dir, path) {
            return true;
        }
        let Some(rest) = relative_to(path, dir) else {
            return false;
        };
        let first = rest.split('/').next().unwrap_or_default();
        if glob {
            first.starts_with(last)
        } else {
            first == last
        }
    }
}

impl fmt::Display for SystemCredentialPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.pattern)
    }
}

/// The data file's two lists.
struct Parsed {
    home: Vec<CredentialPath>,
    system: Vec<SystemCredentialPath>,
}

/// Parses the data file. A malformed line is a build defect, caught by this module's tests.
fn parse(data: &'static str) -> Result<Parsed, String> {
    let mut out: Vec<CredentialPath> = Vec::new();
    let mut system: Vec<SystemCredentialPath> = Vec::new();
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
            "system" => {
                let bare = relative.strip_suffix('*').unwrap_or(relative);
                let normal = relative.starts_with('/')
                    && norm(bare) == bare
                    && bare != "/"
                    && !bare.contains('*')
                    && system.iter().all(|p| p.pattern != relative);
                if !normal {
                    return Err(format!(
                        "line {}: {relative:?} is not a normalised absolute path listed once",
                        number + 1
                    ));
                }
                system.push(SystemCredentialPath { pattern: relative });
                continue;
            }
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
    Ok(Parsed { home: out, system })
}

fn parsed() -> &'static Parsed {
    static PARSED: OnceLock<Parsed> = OnceLock::new();
    PARSED.get_or_init(|| {
        parse(DATA).unwrap_or_else(|e| panic!("credential_paths.txt is malformed: {e}"))
    })
}

/// Every credential path below a home directory, in file order (the home directories never exposed first,
/// then the credential entries).
pub fn credential_paths() -> &'static [CredentialPath] {
    &parsed().home
}

/// The absolute credential paths guarded for a root caller: `/etc/shadow`, `/etc/gshadow` and the SSH host
/// keys `/etc/ssh/ssh_host_*`.
pub fn system_credential_paths() -> &'static [SystemCredentialPath] {
    &parsed().system
}

/// The home directories of a password database (`/etc/passwd` text): the sixth field of every well-formed
/// line, absolute ones only, in order, each once. Comments, blank and malformed lines are skipped.
///
/// ```
/// use sandbox_core::credential_paths::passwd_homes;
/// let text = "root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\n# c\nbad\n";
/// assert_eq!(passwd_homes(text), ["/root", "/home/bob"]);
/// ```
pub fn passwd_homes(text: &str) -> Vec<String> {
    let mut homes: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(':').collect();
        let [_, _, _, _, _, home, _] = fields[..] else {
            continue;
        };
        if home.starts_with('/') && !homes.iter().any(|h| h == home) {
            homes.push(home.to_owned());
        }
    }
    homes
}

/// The credential paths guarded for one caller: those below each of its home directories, and for a root
/// caller the system ones ([`system_credential_paths`]) and every home of the password database.
///
/// ```
/// use sandbox_core::credential_paths::CredentialGuard;
/// let user = CredentialGuard::for_user("/home/u");
/// assert_eq!(user.refusal("/home/u/.ssh/id_rsa").as_deref(), Some("~/.ssh"));
/// assert_eq!(user.refusal("/etc/shadow"), None);
/// let root = CredentialGuard::for_root("/root", ["/home/bob"]);
/// assert_eq!(root.refusal("/etc/shadow").as_deref(), Some("/etc/shadow"));
/// assert_eq!(root.refusal("/home/bob/.aws/credentials").as_deref(), Some("/home/bob/.aws"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialGuard {
    /// The caller's own home first (named `~` in refusals), then the others.
    homes: Vec<String>,
    system: bool,
}

impl CredentialGuard {
    /// The guard of a caller that is not root: its own home directory.
    pub fn for_user(home: impl Into<String>) -> Self {
        CredentialGuard {
            homes: vec![norm(&home.into())],
            system: false,
        }
    }

    /// The guard of a root caller: its own home, every other home given (the password database's, see
    /// [`passwd_homes`]), and the system credential paths.
    pub fn for_root(
        home: impl Into<String>,
        other_homes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let mut guard = CredentialGuard::for_user(home);
        guard.add_homes(other_homes);
        guard.system = true;
        guard
    }

    /// Guards more home directories (another spelling of one already guarded, such as its resolved path).
    pub fn add_homes(&mut self, homes: impl IntoIterator<Item = impl Into<String>>) {
        for home in homes {
            let home = norm(&home.into());
            if home.starts_with('/') && !self.homes.contains(&home) {
                self.homes.push(home);
            }
        }
    }

    /// The home directories guarded, the caller's own first.
    pub fn homes(&self) -> &[String] {
        &self.homes
    }

    /// Whether the system credential paths are guarded (a root caller).
    pub fn guards_system_paths(&self) -> bool {
        self.system
    }

    /// Every absolute path this guard protects, as listed (a `*` kept): for reading where each really
    /// lives, since a listed path may itself be a link.
    pub fn listed_paths(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .homes
            .iter()
            .flat_map(|home| credential_paths().iter().map(move |c| c.under(home)))
            .collect();
        if self.system {
            out.extend(
                system_credential_paths()
                    .iter()
                    .map(|p| p.pattern.to_owned()),
            );
        }
        out
    }

    /// The credential path the already-resolved absolute `path` is, contains or lies under, described for
    /// people (`~/.ssh` below the caller's own home, the absolute path below another); `None` when it
    /// touches none or is relative. Purely lexical: resolve links before asking.
    pub fn refusal(&self, path: &str) -> Option<String> {
        if !path.starts_with('/') {
            return None;
        }
        let path = norm(path);
        for (index, home) in self.homes.iter().enumerate() {
            if let Some(credential) = refuses_source(home, &path) {
                return Some(if index == 0 {
                    credential.to_string()
                } else {
                    credential.under(home)
                });
            }
        }
        if self.system {
            if let Some(entry) = system_credential_paths().iter().find(|e| e.touches(&path)) {
                return Some(entry.to_string());
            }
        }
        None
    }
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
/// use sandbox_core::credential_paths::refuses_source;
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

/// Refuses a host source to copy into a sandbox: a relative path or home →
/// [`SandboxError::InvalidArgument`]; a source that is, contains or lies under a credential path →
/// [`SandboxError::NotPermitted`] naming it (the path is not escaping anything: the host's policy
/// forbids copying it, as `sandboxctl cp-in` reports). Resolve links before asking.
pub fn check_source(home: &str, path: &str) -> Result<(), SandboxError> {
    require_absolute("home directory", home)?;
    require_absolute("source", path)?;
    match refuses_source(home, path) {
        None => Ok(()),
        Some(credential) => Err(SandboxError::NotPermitted(format!(
            "{path} is, contains or lies under the credential path {credential}"
        ))),
    }
}

/// Refuses an sbx workspace root: relative, `/`, the home directory or an ancestor of it, or a path
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
        assert_eq!(all.len(), 40, "8 home entries and 32 credential entries");
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
            "system etc/shadow",
            "system /etc/../shadow",
            "system /",
            "system /etc/*/x",
            "system /etc/shadow\nsystem /etc/shadow",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("# c\n\n  file  .npmrc  \n").unwrap().home.len(), 1);
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
        assert_eq!(e.kind(), ErrorKind::NotPermitted);
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

    #[test]
    fn system_paths_are_listed() {
        let listed: Vec<&str> = system_credential_paths()
            .iter()
            .map(|p| p.pattern())
            .collect();
        assert_eq!(
            listed,
            ["/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_*"]
        );
    }

    #[test]
    fn root_guard_table() {
        let root = CredentialGuard::for_root("/root", ["/root", "/home/bob", "/srv/svc", "rel"]);
        assert_eq!(root.homes(), ["/root", "/home/bob", "/srv/svc"]);
        let user = CredentialGuard::for_user("/home/u");
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            // path, refusal for root, refusal for an ordinary user
            ("/etc/shadow", Some("/etc/shadow"), None),
            ("/etc/gshadow", Some("/etc/gshadow"), None),
            ("/etc/shadow-", None, None),
            (
                "/etc/ssh/ssh_host_ed25519_key",
                Some("/etc/ssh/ssh_host_*"),
                None,
            ),
            (
                "/etc/ssh/ssh_host_rsa_key.pub",
                Some("/etc/ssh/ssh_host_*"),
                None,
            ),
            ("/etc/ssh", Some("/etc/ssh/ssh_host_*"), None),
            ("/etc", Some("/etc/shadow"), None),
            ("/etc/ssh/sshd_config", None, None),
            ("/etc/passwd", None, None),
            ("/etc/hosts", None, None),
            ("/root/.ssh/id_rsa", Some("~/.ssh"), None),
            (
                "/home/bob/.ssh/authorized_keys",
                Some("/home/bob/.ssh"),
                None,
            ),
            (
                "/srv/svc/.config/gh/hosts.yml",
                Some("/srv/svc/.config/gh"),
                None,
            ),
            ("/home/bob/notes.txt", None, None),
            ("/home/u/.aws/config", None, Some("~/.aws")),
            ("/home/u/src/main.rs", None, None),
        ];
        for (path, as_root, as_user) in cases {
            assert_eq!(root.refusal(path).as_deref(), *as_root, "root: {path}");
            assert_eq!(user.refusal(path).as_deref(), *as_user, "user: {path}");
        }
        assert_eq!(root.refusal("etc/shadow"), None);
    }

    #[test]
    fn passwd_homes_table() {
        let text = "root:x:0:0:root:/root:/bin/bash\n\
                    daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
                    # a comment:x:2:2::/nope:/bin/sh\n\
                    \n\
                    short:x:3\n\
                    rel:x:4:4::relative/home:/bin/sh\n\
                    bob:x:1000:1000:Bob,,,:/home/bob:/bin/bash\n\
                    twin:x:1001:1001::/home/bob:/bin/bash\n";
        assert_eq!(passwd_homes(text), ["/root", "/usr/sbin", "/home/bob"]);
    }
}
