//! Which host paths a host may read for a sandbox (`cp-in`, an env file) or write with a sandbox's
//! bytes (`cp-out`): the pure rules, as one [`HostPathGuard`] every host file operation asks.
//!
//! Threat model: the guest is hostile, and the caller choosing host paths (a model picking arguments)
//! can be talked into anything by guest output; the host's operator is trusted and configures the
//! guard. A read is refused when its path is, contains or lies under a credential path
//! ([`crate::credential_paths`]) or a backend's host state (another sandbox's workspace and record).
//!
//! A write is admitted, not screened: only below the output root (a guard without one admits no
//! write), never with a hidden name (one starting with `.`) anywhere on the path, and never below
//! an output root that is, contains or lies under a system-wide path a host executes or loads.
//! Programs read start-up code from more hidden files than any list can name (`~/.tmux.conf`,
//! `~/.gdbinit`, `~/.ipython/…/startup`, an editor's plugin directory), so the hidden-name rule is
//! what keeps them out. Behind it, as a second line, the lists still refuse a path that is,
//! contains or lies under a credential path, a backend's host state or a path a host executes or
//! loads on its own (shell start-up files, autostart entries and units, cron, sudoers, the
//! loader's preload, repository hooks, `~/bin`; the list is [`executed_paths`], from
//! `executed_paths.txt`).
//!
//! Matching is lexical and case-insensitive (a case-folding file system has no alias that slips
//! through; on a case-sensitive one the cost is refusing an odd spelling). It does no I/O: the
//! opener that uses it resolves links and `..` by opening, then asks here with the path where the
//! opened file really is, and again for each listed path resolved where it really lives
//! ([`HostPathGuard::listed`]).
//!
//! Not decided here: links, existing files, pseudo file systems and file kinds (the opener judges
//! what it opens, walking from the output root without following a link), and files a host runs
//! from plain names below the output root (a project's own build scripts, a `Makefile`): choose an
//! output root that holds none.

use std::fmt;
use std::sync::OnceLock;

use crate::credential_paths::CredentialGuard;
use crate::guest_path::{norm, relative_to};

const DATA: &str = include_str!("executed_paths.txt");

/// Where an entry of [`executed_paths`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutedScope {
    /// Below every guarded home directory (`.bashrc`).
    Home,
    /// An absolute path, possibly ending in a `*` that matches any rest of its last component
    /// (`/etc/cron*`).
    System,
    /// Any path with a component of this name, wherever it lies (`.git`).
    Component,
}

/// One path a host executes or loads on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExecutedPath {
    scope: ExecutedScope,
    path: &'static str,
}

impl ExecutedPath {
    /// Where the entry applies.
    pub fn scope(&self) -> ExecutedScope {
        self.scope
    }

    /// The path as listed: relative to a home, absolute (a `*` kept), or one component's name.
    pub fn path(&self) -> &'static str {
        self.path
    }
}

impl fmt::Display for ExecutedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            ExecutedScope::Home => write!(f, "~/{}", self.path),
            ExecutedScope::System => f.write_str(self.path),
            ExecutedScope::Component => write!(f, "any {} directory", self.path),
        }
    }
}

/// Parses the data file. A malformed line is a build defect, caught by this module's tests.
fn parse(data: &'static str) -> Result<Vec<ExecutedPath>, String> {
    let mut out: Vec<ExecutedPath> = Vec::new();
    for (number, line) in data.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(kind), Some(path), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(format!("line {}: expected `<kind> <path>`", number + 1));
        };
        let bad = |why: &str| Err(format!("line {}: {path:?} {why}", number + 1));
        let scope = match kind {
            "home" => {
                let normal = !path.starts_with('/')
                    && norm(path) == path
                    && path != "."
                    && !path.split('/').any(|c| c == "..")
                    && !path.contains('*');
                if !normal {
                    return bad("is not a normalised path below the home directory");
                }
                ExecutedScope::Home
            }
            "system" => {
                let bare = path.strip_suffix('*').unwrap_or(path);
                let normal = path.starts_with('/')
                    && (norm(bare) == bare || bare.ends_with('/'))
                    && bare != "/"
                    && !bare.contains('*');
                if !normal {
                    return bad("is not a normalised absolute path");
                }
                ExecutedScope::System
            }
            "component" => {
                if path.contains('/') || path == "." || path == ".." || path.contains('*') {
                    return bad("is not one path component");
                }
                ExecutedScope::Component
            }
            other => return Err(format!("line {}: unknown kind {other:?}", number + 1)),
        };
        if out.iter().any(|e| e.path == path && e.scope == scope) {
            return bad("is listed twice");
        }
        out.push(ExecutedPath { scope, path });
    }
    Ok(out)
}

/// Every path a host executes or loads on its own, in file order.
pub fn executed_paths() -> &'static [ExecutedPath] {
    static PARSED: OnceLock<Vec<ExecutedPath>> = OnceLock::new();
    PARSED.get_or_init(|| {
        parse(DATA).unwrap_or_else(|e| panic!("executed_paths.txt is malformed: {e}"))
    })
}

/// Why a host path is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostRefusal {
    /// The path is not absolute, so it cannot be judged.
    NotAbsolute,
    /// It is, contains or lies under this credential path (the only refusal an operator may lift).
    Credential(String),
    /// It is, contains or lies under this path a host executes or loads.
    Executed(String),
    /// It is, contains or lies under this backend's host state (sandboxes' workspaces and records).
    SandboxState(String),
    /// It lies outside this output root.
    OutsideOutputRoot(String),
    /// The guard has no output root, so it admits no write.
    NoOutputRoot,
    /// This hidden name (the path up to it) lies on the path.
    Hidden(String),
    /// The output root itself is unfit to write below, for the reason given.
    UnfitOutputRoot {
        /// The output root.
        root: String,
        /// What is wrong with it.
        why: Box<HostRefusal>,
    },
}

impl HostRefusal {
    /// Whether `--allow-credential-path` (or its library equivalent) may lift it.
    pub fn is_credential(&self) -> bool {
        matches!(self, HostRefusal::Credential(_))
    }
}

impl fmt::Display for HostRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRefusal::NotAbsolute => f.write_str("is not an absolute path"),
            HostRefusal::Credential(p) => {
                write!(f, "is, contains or lies under the credential path {p}")
            }
            HostRefusal::Executed(p) => write!(
                f,
                "is, contains or lies under {p}, which a host executes or loads on its own"
            ),
            HostRefusal::SandboxState(p) => write!(
                f,
                "is, contains or lies under {p}, where a backend keeps sandboxes' workspaces and records"
            ),
            HostRefusal::OutsideOutputRoot(p) => write!(f, "lies outside the output root {p}"),
            HostRefusal::NoOutputRoot => {
                f.write_str("has no output root to lie below, and nothing is written without one")
            }
            HostRefusal::Hidden(p) => write!(
                f,
                "has the hidden name {p} on its path; a hidden file or directory is never written \
                 or written through (programs load start-up code from many)"
            ),
            HostRefusal::UnfitOutputRoot { root, why } => write!(
                f,
                "lies below the output root {root}, which {why}; choose a directory of its own"
            ),
        }
    }
}

/// What a listed path guards, for [`HostPathGuard::listed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedKind {
    /// A credential path.
    Credential,
    /// A path a host executes or loads.
    Executed,
    /// A backend's host state.
    SandboxState,
}

/// One absolute path a guard protects, without a `*`: the opener resolves it where it really lives
/// (a `~/.bashrc` linked into a dotfiles directory guards its target) and asks [`touches`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The path as the guard lists it.
    pub path: String,
    /// What it guards.
    pub kind: ListedKind,
}

impl Listed {
    /// The refusal of a path that touches this entry.
    pub fn refusal(&self) -> HostRefusal {
        match self.kind {
            ListedKind::Credential => HostRefusal::Credential(self.path.clone()),
            ListedKind::Executed => HostRefusal::Executed(self.path.clone()),
            ListedKind::SandboxState => HostRefusal::SandboxState(self.path.clone()),
        }
    }
}

/// The one policy over host paths: credential paths, executed paths, backends' host state and an
/// optional output root. Build it from configuration (the backends report their state roots) and
/// ask it with resolved absolute paths.
///
/// ```
/// use sandbox_core::credential_paths::CredentialGuard;
/// use sandbox_core::host_paths::{HostPathGuard, HostRefusal};
/// let guard = HostPathGuard::new(CredentialGuard::for_user("/home/u"))
///     .with_state_roots(["/home/u/.local/state/ws"])
///     .with_output_root("/home/u/out");
/// assert!(matches!(guard.write_refusal("/home/u/.bashrc", false), Some(HostRefusal::OutsideOutputRoot(_))));
/// assert_eq!(guard.write_refusal("/home/u/out/report.txt", false), None);
/// assert!(matches!(guard.write_refusal("/home/u/out/.git/hooks/pre-commit", false), Some(HostRefusal::Hidden(_))));
/// assert_eq!(HostPathGuard::new(CredentialGuard::for_user("/home/u")).write_refusal("/home/u/out/report.txt", false), Some(HostRefusal::NoOutputRoot));
/// assert!(matches!(guard.read_refusal("/home/u/.local/state/ws/a/meta.json", true), Some(HostRefusal::SandboxState(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathGuard {
    credentials: CredentialGuard,
    state_roots: Vec<String>,
    output_root: Option<String>,
}

impl HostPathGuard {
    /// A guard over `credentials` and the executed paths below its homes, with no state root and no
    /// output root.
    pub fn new(credentials: CredentialGuard) -> Self {
        HostPathGuard {
            credentials,
            state_roots: Vec::new(),
            output_root: None,
        }
    }

    /// Guards backends' host state roots too (relative ones are ignored: a backend's roots are
    /// absolute).
    pub fn with_state_roots(mut self, roots: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.add_state_roots(roots);
        self
    }

    /// Adds host state roots (another spelling of one already guarded, such as its resolved path).
    pub fn add_state_roots(&mut self, roots: impl IntoIterator<Item = impl Into<String>>) {
        for root in roots {
            let root = norm(&root.into());
            if root.starts_with('/') && !self.state_roots.contains(&root) {
                self.state_roots.push(root);
            }
        }
    }

    /// Admits writes below `root` alone (give it resolved: it is compared with resolved paths); a
    /// root [`HostPathGuard::output_root_refusal`] refuses admits nothing.
    pub fn with_output_root(mut self, root: impl Into<String>) -> Self {
        self.output_root = Some(norm(&root.into()));
        self
    }

    /// The credential guard.
    pub fn credentials(&self) -> &CredentialGuard {
        &self.credentials
    }

    /// Mutable access to the credential guard (to add a home's resolved spelling).
    pub fn credentials_mut(&mut self) -> &mut CredentialGuard {
        &mut self.credentials
    }

    /// The backends' host state roots guarded.
    pub fn state_roots(&self) -> &[String] {
        &self.state_roots
    }

    /// The output root, when writes are pinned to one.
    pub fn output_root(&self) -> Option<&str> {
        self.output_root.as_deref()
    }

    /// Why reading the resolved absolute `path` into a sandbox is refused, if it is: a credential path
    /// (unless `allow_credential`) or a backend's host state.
    pub fn read_refusal(&self, path: &str, allow_credential: bool) -> Option<HostRefusal> {
        if !path.starts_with('/') {
            return Some(HostRefusal::NotAbsolute);
        }
        let path = norm(path);
        if !allow_credential {
            if let Some(refusal) = self.credential_refusal(&path) {
                return Some(refusal);
            }
        }
        self.state_refusal(&path)
    }

    /// Why writing a sandbox's bytes to the resolved absolute `path` is refused, if it is, in this
    /// order: no output root, an unfit one ([`HostPathGuard::output_root_refusal`]), outside it, a
    /// hidden name on the path, then the lists ([`HostPathGuard::listed_refusal`]).
    pub fn write_refusal(&self, path: &str, allow_credential: bool) -> Option<HostRefusal> {
        if !path.starts_with('/') {
            return Some(HostRefusal::NotAbsolute);
        }
        let path = norm(path);
        let Some(root) = &self.output_root else {
            return Some(HostRefusal::NoOutputRoot);
        };
        if let Some(refusal) = self.output_root_refusal(root) {
            return Some(refusal);
        }
        // Exact, not folded like the refusals: on a case-sensitive file system `/srv/Out` is
        // another directory, and an admission must never widen by case. The opener asks with
        // the kernel's own name of the opened directory, so a case-folding one costs nothing.
        if relative_to(&path, root).is_none() || path == *root {
            return Some(HostRefusal::OutsideOutputRoot(root.clone()));
        }
        self.destination_refusal(&path, allow_credential)
    }

    /// Why `root` is unfit as an output root, if it is: a hidden name on it, or it is, contains or
    /// lies under a system-wide path a host executes or loads (`/`, `/etc`, `/usr` hold programs'
    /// start-up files no list can name). A home directory is fit: below it the hidden-name rule
    /// and the lists hold.
    pub fn output_root_refusal(&self, root: &str) -> Option<HostRefusal> {
        if !root.starts_with('/') {
            return Some(HostRefusal::NotAbsolute);
        }
        let root = norm(root);
        let why = hidden_refusal(&root).or_else(|| {
            executed_paths()
                .iter()
                .find(|e| e.scope == ExecutedScope::System && touches_pattern(&root, e.path))
                .map(|e| HostRefusal::Executed(e.path.to_owned()))
        })?;
        Some(HostRefusal::UnfitOutputRoot {
            root,
            why: Box::new(why),
        })
    }

    /// [`HostPathGuard::write_refusal`] without the output root: a hidden name on the path, then
    /// the lists. For a destination as it was named, before links are resolved (the output root
    /// is judged on the resolved path alone, so that a root reached through a link, such as `/tmp`
    /// on macOS, still admits its files).
    pub fn destination_refusal(&self, path: &str, allow_credential: bool) -> Option<HostRefusal> {
        if !path.starts_with('/') {
            return Some(HostRefusal::NotAbsolute);
        }
        let path = norm(path);
        hidden_refusal(&path).or_else(|| self.listed_refusal(&path, allow_credential))
    }

    /// The second line of defence alone: why the absolute `path` is refused by the lists, if it
    /// is: it is, contains or lies under a path a host executes or loads, a credential path
    /// (unless `allow_credential`), or a backend's host state.
    pub fn listed_refusal(&self, path: &str, allow_credential: bool) -> Option<HostRefusal> {
        if !path.starts_with('/') {
            return Some(HostRefusal::NotAbsolute);
        }
        let path = norm(path);
        // Executed first: no credential override lifts it, so it is the reason to name.
        if let Some(refusal) = self.executed_refusal(&path) {
            return Some(refusal);
        }
        if !allow_credential {
            if let Some(refusal) = self.credential_refusal(&path) {
                return Some(refusal);
            }
        }
        self.state_refusal(&path)
    }

    /// Every absolute path this guard lists without a `*`, for reads (`write` false: credentials and
    /// state) or writes (executed paths too). The opener resolves each where it really lives.
    pub fn listed(&self, write: bool) -> Vec<Listed> {
        let mut out: Vec<Listed> = self
            .credentials
            .listed_paths()
            .into_iter()
            .filter(|p| !p.contains('*'))
            .map(|path| Listed {
                path,
                kind: ListedKind::Credential,
            })
            .collect();
        if write {
            for entry in executed_paths() {
                match entry.scope {
                    ExecutedScope::Home => {
                        for home in self.credentials.homes() {
                            out.push(Listed {
                                path: norm(&format!("{home}/{}", entry.path)),
                                kind: ListedKind::Executed,
                            });
                        }
                    }
                    ExecutedScope::System if !entry.path.ends_with('*') => out.push(Listed {
                        path: entry.path.to_owned(),
                        kind: ListedKind::Executed,
                    }),
                    ExecutedScope::System | ExecutedScope::Component => {}
                }
            }
        }
        out.extend(self.state_roots.iter().map(|root| Listed {
            path: root.clone(),
            kind: ListedKind::SandboxState,
        }));
        out
    }

    fn credential_refusal(&self, path: &str) -> Option<HostRefusal> {
        if let Some(described) = self.credentials.refusal(path) {
            return Some(HostRefusal::Credential(described));
        }
        // The same list again without regard to case.
        self.credentials
            .listed_paths()
            .into_iter()
            .find(|listed| touches_pattern(path, listed))
            .map(HostRefusal::Credential)
    }

    fn executed_refusal(&self, path: &str) -> Option<HostRefusal> {
        let folded = fold(path);
        for entry in executed_paths() {
            let hit = match entry.scope {
                ExecutedScope::Home => self.credentials.homes().iter().find_map(|home| {
                    let listed = norm(&format!("{home}/{}", entry.path));
                    touches(path, &listed).then_some(listed)
                }),
                ExecutedScope::System => {
                    touches_pattern(path, entry.path).then(|| entry.path.to_owned())
                }
                ExecutedScope::Component => {
                    let name = fold(entry.path);
                    folded
                        .split('/')
                        .any(|c| c == name)
                        .then(|| entry.to_string())
                }
            };
            if let Some(listed) = hit {
                return Some(HostRefusal::Executed(listed));
            }
        }
        None
    }

    fn state_refusal(&self, path: &str) -> Option<HostRefusal> {
        self.state_roots
            .iter()
            .find(|root| touches(path, root))
            .map(|root| HostRefusal::SandboxState(root.clone()))
    }
}

/// The first hidden name on the normalised absolute `path`, as the path up to and including it.
fn hidden_refusal(path: &str) -> Option<HostRefusal> {
    let mut end = 0;
    for component in path.split('/') {
        end += component.len();
        if component.starts_with('.') {
            return Some(HostRefusal::Hidden(path[..end].to_owned()));
        }
        end += 1;
    }
    None
}

/// Case folded for comparison: a case-folding host file system sees `~/.BashRC` as `~/.bashrc`.
fn fold(path: &str) -> String {
    path.to_lowercase()
}

/// Whether `inner` is `outer` or lies under it, both absolute, compared without regard to case.
fn within(inner: &str, outer: &str) -> bool {
    relative_to(&fold(inner), &fold(outer)).is_some()
}

/// Whether the absolute `path` is `listed`, contains it or lies under it, compared without regard to
/// case after normalising both (`..` removed lexically: resolve links before asking).
///
/// ```
/// use sandbox_core::host_paths::touches;
/// assert!(touches("/home/u/.BASHRC", "/home/u/.bashrc"));
/// assert!(touches("/home/u", "/home/u/.bashrc"));
/// assert!(touches("/etc/cron.d/x", "/etc/cron.d"));
/// assert!(!touches("/etc/cron.dx", "/etc/cron.d"));
/// ```
pub fn touches(path: &str, listed: &str) -> bool {
    // A relative `path` touches nothing. A relative `listed` is touched by no absolute path
    // either way (neither can lie under the other), so it needs no check of its own.
    path.starts_with('/') && (within(path, listed) || within(listed, path))
}

/// [`touches`] for a listed path that may end in a `*` matching any rest of its last component.
fn touches_pattern(path: &str, pattern: &str) -> bool {
    let Some(bare) = pattern.strip_suffix('*') else {
        return touches(path, pattern);
    };
    let (dir, prefix) = bare.rsplit_once('/').unwrap_or(("", bare));
    let dir = if dir.is_empty() { "/" } else { dir };
    // The path contains the entry when it is the entry's directory or an ancestor of it.
    if within(dir, path) {
        return true;
    }
    let Some(rest) = relative_to(&fold(path), &fold(dir)) else {
        return false;
    };
    rest.split('/')
        .next()
        .is_some_and(|first| first.starts_with(&fold(prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOME: &str = "/home/u";

    fn user() -> HostPathGuard {
        HostPathGuard::new(CredentialGuard::for_user(HOME))
    }

    /// Each refusal says why in its own words (the sentence a host prints after the path), and
    /// only a credential path's may be lifted.
    /// A path touches a listed one when it is it, lies under it or contains it, whatever the
    /// case; a sibling sharing a prefix does not, nor a relative path.
    #[test]
    fn touching_goes_both_ways_and_ignores_case() {
        assert!(touches("/home/u/.BASHRC", "/home/u/.bashrc"));
        assert!(touches("/etc/cron.d/x", "/etc/cron.d"));
        assert!(touches("/home/u", "/home/u/.bashrc"));
        assert!(!touches("/etc/cron.dx", "/etc/cron.d"));
        assert!(!touches("/etc/cron.d", "/etc/cron.dx"));
        assert!(!touches("home/u/.bashrc", "/home/u/.bashrc"));
        assert!(!touches("/home/u/.bashrc", "home/u/.bashrc"));
        assert!(!touches("home/u/.bashrc", "home/u/.bashrc"));
        assert!(!touches("/", "."));
    }

    #[test]
    fn each_refusal_says_why_and_only_a_credential_may_be_lifted() {
        let unfit = HostRefusal::UnfitOutputRoot {
            root: "/r".into(),
            why: Box::new(HostRefusal::Hidden("/r/.x".into())),
        };
        let cases: [(HostRefusal, &str, bool); 8] = [
            (HostRefusal::NotAbsolute, "is not an absolute path", false),
            (
                HostRefusal::Credential("/h/.ssh".into()),
                "is, contains or lies under the credential path /h/.ssh",
                true,
            ),
            (
                HostRefusal::Executed("/h/.bashrc".into()),
                "is, contains or lies under /h/.bashrc, which a host executes or loads on its own",
                false,
            ),
            (
                HostRefusal::SandboxState("/s".into()),
                "is, contains or lies under /s, where a backend keeps sandboxes' workspaces and \
                 records",
                false,
            ),
            (
                HostRefusal::OutsideOutputRoot("/o".into()),
                "lies outside the output root /o",
                false,
            ),
            (
                HostRefusal::NoOutputRoot,
                "has no output root to lie below, and nothing is written without one",
                false,
            ),
            (
                HostRefusal::Hidden("/o/.x".into()),
                "has the hidden name /o/.x on its path; a hidden file or directory is never \
                 written or written through (programs load start-up code from many)",
                false,
            ),
            (
                unfit,
                "lies below the output root /r, which has the hidden name /r/.x on its path; a \
                 hidden file or directory is never written or written through (programs load \
                 start-up code from many); choose a directory of its own",
                false,
            ),
        ];
        for (refusal, text, liftable) in cases {
            assert_eq!(refusal.to_string(), text);
            assert_eq!(refusal.is_credential(), liftable, "{refusal:?}");
        }
    }

    #[test]
    fn the_data_file_parses() {
        let all = executed_paths();
        assert!(all.len() > 100, "{}", all.len());
        for (scope, path) in [
            (ExecutedScope::Home, ".bashrc"),
            (ExecutedScope::Home, ".config/systemd"),
            (ExecutedScope::System, "/etc/cron*"),
            (ExecutedScope::System, "/etc/ld.so.preload"),
            (ExecutedScope::Component, ".git"),
        ] {
            // Through the accessors callers read the entries with.
            assert!(
                all.iter().any(|e| e.scope() == scope && e.path() == path),
                "{path}"
            );
        }
    }

    #[test]
    fn parse_refuses_malformed_lines() {
        for bad in [
            "home",
            "home /abs",
            "home ../up",
            "home a//b",
            "home .",
            "home a*",
            "system etc/x",
            "system /",
            "system /etc/*/x",
            "system /etc/../x",
            "component a/b",
            "component ..",
            "tree .x",
            "home a b",
            "home .x\nhome .x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    /// The documented list, pinned: every destination here is refused for an ordinary user, and
    /// the reason names the entry.
    #[test]
    fn executed_destination_table() {
        let guard = user();
        let refused: &[(&str, &str)] = &[
            ("/home/u/.bashrc", "/home/u/.bashrc"),
            ("/home/u/.profile", "/home/u/.profile"),
            ("/home/u/.bash_profile", "/home/u/.bash_profile"),
            ("/home/u/.bash_login", "/home/u/.bash_login"),
            ("/home/u/.zshrc", "/home/u/.zshrc"),
            ("/home/u/.zprofile", "/home/u/.zprofile"),
            ("/home/u/.zshenv", "/home/u/.zshenv"),
            ("/home/u/.config/fish/config.fish", "/home/u/.config/fish"),
            ("/home/u/.config/fish/conf.d/x.fish", "/home/u/.config/fish"),
            (
                "/home/u/.config/autostart/x.desktop",
                "/home/u/.config/autostart",
            ),
            (
                "/home/u/.config/systemd/user/x.service",
                "/home/u/.config/systemd",
            ),
            (
                "/home/u/.local/share/systemd/user/x.timer",
                "/home/u/.local/share/systemd",
            ),
            (
                "/home/u/.config/environment.d/x.conf",
                "/home/u/.config/environment.d",
            ),
            ("/home/u/.ssh/rc", "/home/u/.ssh/rc"),
            ("/home/u/.local/bin/ls", "/home/u/.local/bin"),
            ("/home/u/bin/git", "/home/u/bin"),
            ("/home/u/.config/git/config", "/home/u/.config/git"),
            (
                "/home/u/src/app/.git/hooks/pre-commit",
                "any .git directory",
            ),
            ("/home/u/src/app/.git/config", "any .git directory"),
            ("/srv/repo/.git", "any .git directory"),
            ("/etc/cron.d/job", "/etc/cron*"),
            ("/etc/cron.daily/job", "/etc/cron*"),
            ("/etc/crontab", "/etc/crontab"),
            ("/var/spool/cron/crontabs/root", "/var/spool/cron"),
            ("/etc/sudoers", "/etc/sudoers"),
            ("/etc/sudoers.d/x", "/etc/sudoers.d"),
            ("/etc/profile.d/x.sh", "/etc/profile.d"),
            ("/etc/ld.so.preload", "/etc/ld.so.preload"),
            ("/etc/ld.so.conf.d/x.conf", "/etc/ld.so.conf.d"),
            ("/etc/systemd/system/x.service", "/etc/systemd"),
            ("/etc/init.d/x", "/etc/init.d"),
            ("/etc/rc.local", "/etc/rc.local"),
            ("/etc/rc3.d/S99x", "/etc/rc*"),
            ("/etc/bash.bashrc", "/etc/bash.bashrc"),
            ("/etc/environment", "/etc/environment"),
            ("/etc/udev/rules.d/99-x.rules", "/etc/udev"),
            ("/usr/lib/udev/rules.d/99-x.rules", "/usr/lib"),
            ("/usr/local/bin/x", "/usr/local/bin"),
            ("/etc/xdg/autostart/x.desktop", "/etc/xdg"),
            ("/proc/sys/kernel/core_pattern", "/proc"),
        ];
        for (path, named) in refused {
            let got = guard.listed_refusal(path, false);
            assert_eq!(
                got,
                Some(HostRefusal::Executed((*named).to_owned())),
                "{path}"
            );
            // Credential overrides never lift it.
            assert!(guard.listed_refusal(path, true).is_some(), "{path}");
            // Reading such a file is another matter: only a credential one is refused.
            assert!(
                guard
                    .read_refusal(path, false)
                    .is_none_or(|r| r.is_credential()),
                "{path}"
            );
        }
        for allowed in [
            "/home/u/project/out.txt",
            "/home/u/.bashrc.d-notes",
            "/home/u/.config/fishing/x",
            "/home/u/src/app/git/hooks",
            "/home/u/src/app/.gitignore",
            "/etc2/cron.d",
            "/tmp/out",
            "/srv/data/x",
            "/var/spool/cronicle/x",
        ] {
            assert_eq!(guard.listed_refusal(allowed, false), None, "{allowed}");
        }
    }

    #[test]
    fn root_guards_every_users_start_up_files() {
        let guard = HostPathGuard::new(CredentialGuard::for_root("/root", ["/home/bob"]));
        assert_eq!(
            guard.listed_refusal("/home/bob/.profile", false),
            Some(HostRefusal::Executed("/home/bob/.profile".into()))
        );
        assert_eq!(
            guard.listed_refusal("/root/.bashrc", false),
            Some(HostRefusal::Executed("/root/.bashrc".into()))
        );
        assert_eq!(guard.listed_refusal("/home/bob/notes", false), None);
    }

    #[test]
    fn case_and_dots_are_no_alias() {
        let guard = user();
        for alias in [
            "/home/u/.BASHRC",
            "/HOME/U/.bashrc",
            "/home/u/x/../.bashrc",
            "/home/u/./.Config/Systemd/User/x.service",
            "//etc//CRON.D/x",
            "/home/u/.SSH/id_rsa",
            "/home/u/repo/.GIT/hooks/x",
        ] {
            assert!(guard.listed_refusal(alias, false).is_some(), "{alias}");
        }
        assert_eq!(
            guard.read_refusal("/home/u/.AWS/credentials", false),
            Some(HostRefusal::Credential("/home/u/.aws".into()))
        );
        assert_eq!(
            guard.read_refusal("relative/x", false),
            Some(HostRefusal::NotAbsolute)
        );
        assert_eq!(
            guard.write_refusal("relative/x", false),
            Some(HostRefusal::NotAbsolute)
        );
    }

    #[test]
    fn state_roots_refuse_reads_and_writes_whatever_the_override() {
        let root = "/home/u/.local/state/maf-sandbox-docker-sbx/workspaces";
        let guard = user().with_state_roots([root, "relative/ignored"]);
        assert_eq!(guard.state_roots(), [root]);
        for path in [
            format!("{root}/sbx-a/ws-0/secret.txt"),
            format!("{root}/sbx-a/meta.json"),
            format!("{root}/SBX-A/META.JSON"),
            root.to_owned(),
            "/home/u/.local/state".to_owned(),
        ] {
            let want = Some(HostRefusal::SandboxState(root.to_owned()));
            assert_eq!(guard.read_refusal(&path, true), want, "{path}");
            assert_eq!(guard.listed_refusal(&path, true), want, "{path}");
        }
        assert_eq!(
            guard.read_refusal("/home/u/.local/state/other/x", false),
            None
        );
    }

    #[test]
    fn the_output_root_holds_everything_else_out() {
        let guard = user().with_output_root("/srv/out/");
        assert_eq!(guard.output_root(), Some("/srv/out"));
        assert_eq!(guard.write_refusal("/srv/out/a/b.txt", false), None);
        for outside in [
            "/srv/out",
            "/srv/outside/x",
            "/srv/out/../x",
            "/tmp/x",
            "/SRV/Out/a.txt",
            "/srv/OUT/a.txt",
        ] {
            assert_eq!(
                guard.write_refusal(outside, false),
                Some(HostRefusal::OutsideOutputRoot("/srv/out".into())),
                "{outside}"
            );
        }
        // Inside the root, a hidden name and the lists still refuse.
        assert_eq!(
            guard.write_refusal("/srv/out/a/.git/config", false),
            Some(HostRefusal::Hidden("/srv/out/a/.git".into()))
        );
        let home_root = user().with_output_root(HOME);
        assert_eq!(
            home_root.write_refusal("/home/u/bin/git", false),
            Some(HostRefusal::Executed("/home/u/bin".into()))
        );
        // Reads are not pinned by it.
        assert_eq!(guard.read_refusal("/tmp/x", false), None);
    }

    /// Start-up files no list names (tmux, gdb, IPython, Gradle, direnv, editors' plugins, shell
    /// completions, PowerShell's profile): below the output root a hidden name anywhere on the path
    /// refuses the write, whatever the credential override says.
    #[test]
    fn hidden_names_below_the_output_root_are_never_written() {
        let guard = user().with_output_root(HOME);
        for path in [
            "/home/u/.tmux.conf",
            "/home/u/.gdbinit",
            "/home/u/.exrc",
            "/home/u/.psqlrc",
            "/home/u/.Rprofile",
            "/home/u/.bash_completion",
            "/home/u/.config/tmux/tmux.conf",
            "/home/u/.config/direnv/direnvrc",
            "/home/u/.config/powershell/Microsoft.PowerShell_profile.ps1",
            "/home/u/.ipython/profile_default/startup/00.py",
            "/home/u/.gradle/init.d/x.gradle",
            "/home/u/.local/share/bash-completion/completions/git",
            "/home/u/.local/share/nvim/site/plugin/x.lua",
            "/home/u/.vscode/extensions/x/extension.js",
            "/home/u/src/app/.envrc",
            "/home/u/src/app/.vscode/tasks.json",
        ] {
            assert!(
                matches!(
                    guard.write_refusal(path, true),
                    Some(HostRefusal::Hidden(_))
                ),
                "{path}"
            );
        }
        assert_eq!(
            guard.write_refusal("/home/u/.config/tmux/tmux.conf", false),
            Some(HostRefusal::Hidden("/home/u/.config".into()))
        );
        assert_eq!(
            guard.write_refusal("/home/u/src/app/report.txt", false),
            None
        );
    }

    /// Without an output root nothing is written: the allowlist is the default.
    #[test]
    fn no_output_root_admits_no_write() {
        for path in ["/home/u/src/report.txt", "/tmp/out", "/srv/data/x"] {
            assert_eq!(
                user().write_refusal(path, false),
                Some(HostRefusal::NoOutputRoot),
                "{path}"
            );
        }
    }

    /// An output root that holds system-wide start-up locations admits nothing, not even a file no
    /// list names.
    #[test]
    fn an_output_root_holding_system_start_up_paths_admits_nothing() {
        for (root, path) in [
            ("/", "/etc/tmux.conf"),
            ("/etc", "/etc/gdb/gdbinit"),
            ("/usr", "/usr/share/bash-completion/completions/git"),
            ("/var", "/var/report.txt"),
        ] {
            let guard = user().with_output_root(root);
            let refusal = guard.write_refusal(path, false);
            assert!(
                matches!(&refusal, Some(HostRefusal::UnfitOutputRoot { why, .. })
                    if matches!(**why, HostRefusal::Executed(_))),
                "{root}: {path}: {refusal:?}"
            );
            assert_eq!(guard.output_root_refusal(root), refusal);
        }
        // A root with a hidden name is unfit; a home, a project and a temporary directory are fit.
        assert!(matches!(
            user().output_root_refusal("/home/u/.ipython/profile_default/startup"),
            Some(HostRefusal::UnfitOutputRoot { .. })
        ));
        for fit in ["/home/u", "/home/u/src/app", "/tmp/run-1", "/home"] {
            assert_eq!(user().output_root_refusal(fit), None, "{fit}");
        }
    }

    #[test]
    fn listed_paths_cover_every_kind_without_globs() {
        let guard = user().with_state_roots(["/srv/ws"]);
        let reads = guard.listed(false);
        let writes = guard.listed(true);
        assert!(reads.iter().all(|l| l.kind != ListedKind::Executed));
        assert!(reads
            .iter()
            .any(|l| l.path == "/home/u/.ssh" && l.kind == ListedKind::Credential));
        assert!(writes
            .iter()
            .any(|l| l.path == "/home/u/.bashrc" && l.kind == ListedKind::Executed));
        assert!(writes
            .iter()
            .any(|l| l.path == "/srv/ws"
                && l.refusal() == HostRefusal::SandboxState("/srv/ws".into())));
        assert!(writes.iter().all(|l| !l.path.contains('*')));
    }

    /// A model of the matcher: a path is refused for writing exactly when, compared in lower case
    /// component by component, one listed entry is a prefix of it or it is a prefix of the entry.
    fn model_refuses(path: &[String], listed: &[Vec<String>], components: &[String]) -> bool {
        let lower: Vec<String> = path.iter().map(|c| c.to_lowercase()).collect();
        listed.iter().any(|entry| {
            let entry: Vec<String> = entry.iter().map(|c| c.to_lowercase()).collect();
            let n = entry.len().min(lower.len());
            entry[..n] == lower[..n]
        }) || lower.iter().any(|c| components.contains(c))
    }

    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("home".to_owned()),
            Just("u".to_owned()),
            Just(".bashrc".to_owned()),
            Just(".BashRC".to_owned()),
            Just(".config".to_owned()),
            Just("systemd".to_owned()),
            Just("etc".to_owned()),
            Just("cron.d".to_owned()),
            Just("CRON.D".to_owned()),
            Just(".git".to_owned()),
            Just("ws".to_owned()),
            Just("out".to_owned()),
            "[a-zA-Z_-][a-zA-Z._-]{0,5}",
        ]
    }

    proptest! {
        /// The matcher agrees with the model over paths built from listed names, their case variants
        /// and noise; `.` and `..` inserted anywhere change nothing once resolved.
        #[test]
        fn matcher_agrees_with_the_model(
            parts in proptest::collection::vec(component(), 0..7),
            noise in proptest::collection::vec((0usize..8, prop_oneof![Just("."), Just("x/..")]), 0..3),
        ) {
            let guard = user().with_state_roots(["/srv/ws"]);
            let path = format!("/{}", parts.join("/"));
            let listed: Vec<Vec<String>> = guard
                .listed(true)
                .iter()
                .map(|l| l.path.split('/').filter(|c| !c.is_empty()).map(str::to_owned).collect())
                .collect();
            let components: Vec<String> = executed_paths()
                .iter()
                .filter(|e| e.scope == ExecutedScope::Component)
                .map(|e| e.path.to_lowercase())
                .collect();
            // Globbed system entries are checked by prefix: the generated names never reach them
            // except through `etc`, whose `cron*` entry the model states directly.
            let lower: Vec<String> = parts.iter().map(|c| c.to_lowercase()).collect();
            let globbed = lower.first().map(String::as_str) == Some("etc")
                && (lower.len() == 1
                    || lower[1].starts_with("cron")
                    || lower[1].starts_with("rc"));
            let want = model_refuses(&parts, &listed, &components) || globbed || parts.is_empty();
            prop_assert_eq!(guard.listed_refusal(&path, false).is_some(), want, "{}", path);
            // The same path spelled with `.` and `x/..` components is judged alike.
            let mut spelled: Vec<String> = parts.clone();
            for (at, extra) in &noise {
                let at = (*at).min(spelled.len());
                spelled.insert(at, (*extra).to_owned());
            }
            let respelled = format!("/{}", spelled.join("/"));
            prop_assert_eq!(
                guard.listed_refusal(&respelled, false).is_some(),
                want,
                "{}", respelled
            );
        }

        /// Below the output root, one hidden component anywhere on the path refuses the write; a
        /// path of plain names only (none of them listed) is written.
        #[test]
        fn one_hidden_component_refuses_the_write(
            before in proptest::collection::vec("[a-z][a-z0-9_-]{0,6}", 0..3),
            hidden in "\\.[a-zA-Z0-9_-][a-zA-Z0-9_.-]{0,7}",
            after in proptest::collection::vec("[a-z][a-z0-9_.-]{0,6}", 0..3),
        ) {
            let guard = user().with_output_root("/srv/out");
            let plain = format!("/srv/out/{}", [before.clone(), after.clone()].concat().join("/"));
            if !before.is_empty() || !after.is_empty() {
                prop_assert_eq!(guard.write_refusal(&plain, false), None, "{}", plain);
            }
            let parts: Vec<String> = before.into_iter().chain([hidden]).chain(after).collect();
            let path = format!("/srv/out/{}", parts.join("/"));
            let refusal = guard.write_refusal(&path, true);
            prop_assert!(matches!(refusal, Some(HostRefusal::Hidden(_))), "{}: {:?}", path, refusal);
        }

        /// Everything below a listed entry, in any case, is refused, and nothing panics on any input.
        #[test]
        fn everything_below_an_entry_is_refused(
            pick in any::<proptest::sample::Index>(),
            below in "[a-zA-Z.]{1,4}",
            upper in any::<bool>(),
            noise in "(/[a-zA-Z.]{0,5}){0,5}",
        ) {
            let guard = user().with_state_roots(["/srv/ws"]);
            let listed = guard.listed(true);
            let entry = &listed[pick.index(listed.len())];
            let mut deeper = format!("{}/{below}", entry.path);
            if upper {
                deeper = deeper.to_uppercase();
            }
            prop_assert!(guard.listed_refusal(&deeper, false).is_some(), "{}", deeper);
            if entry.kind != ListedKind::Executed {
                prop_assert!(guard.read_refusal(&deeper, false).is_some(), "{}", deeper);
            }
            let _ = guard.read_refusal(&noise, false);
            let _ = guard.write_refusal(&noise, true);
            let _ = guard.with_output_root(noise.clone()).write_refusal(&noise, false);
        }
    }
}
