//! Guest path confinement: lexical name checks plus an ancestor walk generic over a stat function.
//!
//! Every file method of a backend first confines the caller's path to the call's working directory by name
//! ([`confine`]), then walks the resolved path's ancestors with a no-follow stat the backend supplies
//! ([`refuse_linked_ancestors`]), so a link anywhere on the way (including above the working directory) is
//! refused before anything is read or written. An [`Access`] (`Read`, `Write`, `List`, `Delete`) applies the
//! rules of one file method in order. Paths are guest (POSIX) paths: `/` is the only separator and a
//! backslash is refused outright, because a Windows guest or a careless backend would read it as one. Every
//! path is bounded first ([`check_bounds`]).
//!
//! ```
//! use sandbox_core::guest_path;
//! assert_eq!(guest_path::norm("/w/./a/../b"), "/w/b");
//! assert_eq!(guest_path::confine("a/../b", "/w").unwrap(), "/w/b");
//! assert!(guest_path::confine("../etc/passwd", "/w").is_err());
//! ```
//!
//! Nothing here performs I/O: the stat is the caller's closure. These checks run before the method acts, so
//! a guest may swap a checked component for a link in between; the backend's act must still reach nothing
//! the guest program itself could not (held handles, acting with the guest's own authority, or a frozen
//! guest).

use std::borrow::Cow;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use crate::entry::EntryKind;
use crate::error::SandboxError;

/// Lexical normal form of a guest path.
///
/// Splits on `/`, drops empty and `.` segments, lets `..` pop the previous segment (dropped at the root of an
/// absolute path, kept in a relative path with nothing left to pop), and rejoins. Any run of leading slashes
/// becomes one. The empty result is `.`.
///
/// ```
/// use sandbox_core::guest_path::norm;
/// assert_eq!(norm("//w/./a/../b/"), "/w/b");
/// assert_eq!(norm("/.."), "/");
/// assert_eq!(norm("../a/.."), "..");
/// assert_eq!(norm(""), ".");
/// ```
pub fn norm(p: &str) -> String {
    // Every file method normalises the same few paths several times over (the working directory,
    // the resolved path, its place under the root): a path already in normal form, as nearly all
    // are, is copied as it is instead of being split and rejoined.
    normal_form(p).into_owned()
}

/// [`norm`], borrowing `p` when it is already in normal form.
fn normal_form(p: &str) -> Cow<'_, str> {
    if is_normal(p) {
        Cow::Borrowed(p)
    } else {
        Cow::Owned(normalised(p))
    }
}

/// Whether `p` is its own normal form: `/`, or segments that are neither empty, `.` nor `..`
/// (after the one leading `/` of an absolute path).
fn is_normal(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    let relative = p.strip_prefix('/').unwrap_or(p);
    !relative.is_empty() && segments(relative).all(|segment| !matches!(segment, b"" | b"." | b".."))
}

/// The `/`-separated segments of `p`, as bytes. Every file call scans its few paths several
/// times; a byte split costs a fraction of a `str` split by `char`, whose searcher is set up
/// afresh for each segment.
fn segments(p: &str) -> impl Iterator<Item = &[u8]> {
    p.as_bytes().split(|&byte| byte == b'/')
}

/// [`norm`] of any path, segment by segment.
fn normalised(p: &str) -> String {
    let absolute = p.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => match segments.last() {
                Some(&last) if last != ".." => {
                    segments.pop();
                }
                // At the root of an absolute path there is nothing above to reach.
                _ if absolute => {}
                _ => segments.push(".."),
            },
            other => segments.push(other),
        }
    }
    if segments.is_empty() {
        return if absolute { "/" } else { "." }.to_owned();
    }
    let mut out = String::with_capacity(p.len() + 1);
    for (index, segment) in segments.iter().enumerate() {
        if absolute || index > 0 {
            out.push('/');
        }
        out.push_str(segment);
    }
    out
}

/// `p` when it is absolute, else `base + "/" + p`. Purely textual; normalise the result.
pub fn join(base: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_owned()
    } else {
        let mut joined = String::with_capacity(base.len() + 1 + p.len());
        joined.push_str(base);
        joined.push('/');
        joined.push_str(p);
        joined
    }
}

/// The part of `path` below `base`, or `None` when `path` is not `base` or inside it.
///
/// Both are normalised first. Equal paths give `""`. A string prefix is not containment: `/w-outside` is not
/// inside `/w`, nor `/w/sub2` inside `/w/sub`. With base `.`, any relative path that does not climb out is
/// inside, and no absolute path is.
///
/// ```
/// use sandbox_core::guest_path::relative_to;
/// assert_eq!(relative_to("/w/a/b", "/w").as_deref(), Some("a/b"));
/// assert_eq!(relative_to("/w", "/w/").as_deref(), Some(""));
/// assert_eq!(relative_to("/w-outside", "/w"), None);
/// ```
pub fn relative_to(path: &str, base: &str) -> Option<String> {
    relative_to_normal(&normal_form(path), &normal_form(base)).map(str::to_owned)
}

/// [`relative_to`] of two paths already in normal form (as [`norm`] gives them), borrowed from
/// `path`: no normalisation, no allocation, for a caller that normalised both once and asks
/// again. Given a path not in normal form it answers for the text as it stands, which may differ
/// from [`relative_to`].
///
/// ```
/// use sandbox_core::guest_path::relative_to_normal;
/// assert_eq!(relative_to_normal("/w/a/b", "/w"), Some("a/b"));
/// assert_eq!(relative_to_normal("/w", "/w"), Some(""));
/// assert_eq!(relative_to_normal("/w-outside", "/w"), None);
/// ```
pub fn relative_to_normal<'p>(path: &'p str, base: &str) -> Option<&'p str> {
    if path == base {
        return Some("");
    }
    if base == "." {
        let climbs = path == ".." || path.starts_with("../");
        return (!path.starts_with('/') && !climbs).then_some(path);
    }
    if base == "/" {
        path.strip_prefix('/')
    } else {
        path.strip_prefix(base).and_then(|r| r.strip_prefix('/'))
    }
}

/// A guest's raw directory-entry name as a listing shows it, and whether it had to be escaped.
///
/// A name that is UTF-8 without a backslash (every name a guest path can address) is shown as it is.
/// Any other is escaped: each backslash as `\\`, each byte that is not part of valid UTF-8 as `\xHH`
/// (two lower-case hex digits). Every escaped form holds a backslash, which no addressable name does,
/// so the two never collide, and [`unescape_name`] gives the exact bytes back.
///
/// ```
/// use sandbox_core::guest_path::{escape_name, unescape_name};
/// assert_eq!(escape_name(b"plain"), ("plain".to_owned(), false));
/// assert_eq!(escape_name(b"a\\b"), ("a\\\\b".to_owned(), true));
/// assert_eq!(escape_name(b"caf\xe9"), ("caf\\xe9".to_owned(), true));
/// assert_eq!(unescape_name("caf\\xe9").unwrap(), b"caf\xe9");
/// ```
pub fn escape_name(name: &[u8]) -> (String, bool) {
    match std::str::from_utf8(name) {
        Ok(text) if !text.contains('\\') => return (text.to_owned(), false),
        _ => {}
    }
    let mut out = String::with_capacity(name.len() + 8);
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    (out, true)
}

/// The raw name an [`escape_name`] form stands for; `None` for a string no escaping produces (a lone
/// backslash, an unknown escape, a bad hex pair).
pub fn unescape_name(shown: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(shown.len());
    let mut rest = shown;
    while let Some(at) = rest.find('\\') {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let tail = &rest[at + 1..];
        if let Some(after) = tail.strip_prefix('\\') {
            out.push(b'\\');
            rest = after;
        } else if let Some(hex) = tail.strip_prefix('x') {
            let pair = hex.get(..2)?;
            if !pair
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return None;
            }
            out.push(u8::from_str_radix(pair, 16).ok()?);
            rest = &hex[2..];
        } else {
            return None;
        }
    }
    out.extend_from_slice(rest.as_bytes());
    Some(out)
}

/// The longest guest path accepted, in bytes (Linux's `PATH_MAX`), as given and once resolved.
pub const MAX_GUEST_PATH_BYTES: usize = 4096;

/// The most components a guest path may have, as given (`.` and `..` count) and once resolved.
///
/// Every component of a path is one stat of the ancestor walk, so this bounds the work one argument
/// can start.
pub const MAX_GUEST_PATH_COMPONENTS: usize = 255;

/// The most stats of one asynchronous ancestor walk in flight at once.
pub const MAX_CONCURRENT_STATS: usize = 16;

/// Refuses a path no guest file system accepts before anything acts on it: a NUL byte (it would end the
/// path early in every system call), more than [`MAX_GUEST_PATH_BYTES`] bytes, or more than
/// [`MAX_GUEST_PATH_COMPONENTS`] components. [`SandboxError::InvalidArgument`], naming `what`.
fn check_shape(what: &str, path: &str) -> Result<(), SandboxError> {
    let shown = || {
        let mut end = path.len().min(64);
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        let ellipsis = if end < path.len() { "..." } else { "" };
        format!("{:?}{ellipsis}", &path[..end])
    };
    if path.as_bytes().contains(&0) {
        return Err(SandboxError::invalid(format!(
            "{what} {} contains a NUL byte",
            shown()
        )));
    }
    if path.len() > MAX_GUEST_PATH_BYTES {
        return Err(SandboxError::invalid(format!(
            "{what} {} is {} bytes long, over the limit of {MAX_GUEST_PATH_BYTES}",
            shown(),
            path.len()
        )));
    }
    let components = segments(path).filter(|c| !c.is_empty()).count();
    if components > MAX_GUEST_PATH_COMPONENTS {
        return Err(SandboxError::invalid(format!(
            "{what} {} has {components} components, over the limit of {MAX_GUEST_PATH_COMPONENTS}",
            shown()
        )));
    }
    Ok(())
}

/// Refuses a guest path no guest file system accepts, before anything acts on it: a NUL byte, more than
/// [`MAX_GUEST_PATH_BYTES`] bytes, or more than [`MAX_GUEST_PATH_COMPONENTS`] components.
///
/// [`confine`] and every [`Access`] check apply it first; a backend that passes a path it did not confine
/// (an already resolved one, to an engine) applies it alone.
///
/// # Errors
///
/// [`SandboxError::InvalidArgument`] naming the bound that was crossed.
///
/// ```
/// use sandbox_core::guest_path::{check_bounds, MAX_GUEST_PATH_BYTES};
/// assert!(check_bounds(&"a/".repeat(255)).is_ok());
/// assert!(check_bounds(&"d/".repeat(256)).is_err());
/// assert!(check_bounds(&"x".repeat(MAX_GUEST_PATH_BYTES + 1)).is_err());
/// assert!(check_bounds("a\0b").is_err());
/// ```
pub fn check_bounds(path: &str) -> Result<(), SandboxError> {
    check_shape("guest path", path)
}

/// Confines `path` to `wd` by name and returns the resolved, normalised path.
///
/// Refused with [`SandboxError::InvalidArgument`] before anything else: a NUL byte in `path` or `wd`, or
/// either of them, or the resolved path, longer than [`MAX_GUEST_PATH_BYTES`] or with more than
/// [`MAX_GUEST_PATH_COMPONENTS`] components. Refused with [`SandboxError::Confinement`]: a backslash
/// anywhere in `path`, or a resolved path outside `wd`. `""` and `.` resolve to `wd` itself. This check is
/// lexical only; links are the ancestor walk's job.
///
/// ```
/// use sandbox_core::guest_path::confine;
/// use sandbox_core::ErrorKind;
/// assert_eq!(confine("a/../b", "/w").unwrap(), "/w/b");
/// assert_eq!(confine("a\0b", "/w").unwrap_err().kind(), ErrorKind::InvalidArgument);
/// assert_eq!(confine(&"d/".repeat(300), "/w").unwrap_err().kind(), ErrorKind::InvalidArgument);
/// ```
pub fn confine(path: &str, wd: &str) -> Result<String, SandboxError> {
    check_shape("guest path", path)?;
    check_shape("working directory", wd)?;
    if path.contains('\\') {
        return Err(SandboxError::confinement(
            path,
            "a backslash is never a guest path character",
        ));
    }
    let wd = normal_form(wd);
    let joined = join(&wd, path);
    // A joined path already normal, as nearly every one is, is kept rather than copied.
    let resolved = match normal_form(&joined) {
        Cow::Borrowed(_) => joined,
        Cow::Owned(normal) => normal,
    };
    check_shape("resolved guest path", &resolved)?;
    if relative_to_normal(&resolved, &wd).is_none() {
        return Err(SandboxError::confinement(
            path,
            format!("resolves to {resolved:?}, outside the working directory {wd:?}"),
        ));
    }
    Ok(resolved)
}

/// The directories a walk must stat for `guest_path` under `wd`, outermost first.
///
/// Every prefix of `norm(wd)` from the first component below `/` down to `wd` itself, then each further
/// component of `guest_path` below `wd`. A relative `guest_path` is taken relative to `wd`, as [`confine`]
/// takes it: pass the caller's path, or an absolute one. `/` is never listed. Components of a `guest_path`
/// outside `wd` are never listed: confine it first.
///
/// ```
/// use sandbox_core::guest_path::ancestors;
/// assert_eq!(ancestors("/w/a/b", "/w"), ["/w", "/w/a", "/w/a/b"]);
/// assert_eq!(ancestors("a", "/srv/w"), ["/srv", "/srv/w", "/srv/w/a"]);
/// ```
pub fn ancestors(guest_path: &str, wd: &str) -> Vec<String> {
    let wd = norm(wd);
    let resolved = norm(&join(&wd, guest_path));
    let below = relative_to(&resolved, &wd).unwrap_or_default();
    component_chain(&wd, &below)
}

/// Every prefix of the normalised `wd` (below `/`), then of `wd` extended by each component of `below`.
fn component_chain(wd: &str, below: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = if wd.starts_with('/') {
        "/".to_owned()
    } else {
        String::new()
    };
    let wd_components = wd.split('/').filter(|c| !c.is_empty() && *c != ".");
    let below_components = below.split('/').filter(|c| !c.is_empty() && *c != ".");
    for component in wd_components.chain(below_components) {
        if !(current.is_empty() || current.ends_with('/')) {
            current.push('/');
        }
        current.push_str(component);
        out.push(current.clone());
    }
    out
}

/// What one stat in a walk is asked to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A directory on the way: must be a directory, or absent (then nothing below is reachable).
    Ancestor,
    /// The target of a write: must not be a link; anything else (or nothing) is the method's concern.
    WriteLeaf,
}

/// The outcome of one step of a walk.
enum Step {
    Continue,
    Accept,
    Refuse(SandboxError),
}

fn judge(
    role: Role,
    component: &str,
    caller_path: &str,
    stat: Result<Option<EntryKind>, SandboxError>,
) -> Step {
    let kind = match stat {
        Ok(kind) => kind,
        Err(e) => return Step::Refuse(e),
    };
    match (role, kind) {
        (Role::Ancestor, None) => Step::Accept,
        (Role::Ancestor, Some(EntryKind::Directory)) => Step::Continue,
        (Role::Ancestor, Some(EntryKind::Symlink)) => Step::Refuse(SandboxError::confinement(
            caller_path,
            format!("{component:?} is a link (links are never followed on the way to a path)"),
        )),
        (Role::Ancestor, Some(_)) => Step::Refuse(SandboxError::NotADirectory {
            path: component.to_owned(),
        }),
        (Role::WriteLeaf, Some(EntryKind::Symlink)) => Step::Refuse(SandboxError::confinement(
            caller_path,
            "the target is a link; a write never goes through one",
        )),
        (Role::WriteLeaf, _) => Step::Accept,
    }
}

/// The stats one policy needs, outermost first.
fn plan(resolved: &str, wd: &str, include_self: bool, write_leaf: bool) -> Vec<(String, Role)> {
    // Work from the remainder below wd rather than re-joining `resolved`: with a relative wd, the resolved
    // path is itself relative and would otherwise be taken relative to wd a second time.
    let wd_norm = norm(wd);
    let below = relative_to(resolved, &wd_norm).unwrap_or_default();
    let deepest_below = match (include_self, below.rsplit_once('/')) {
        (true, _) => below.as_str(),
        (false, Some((parent, _))) => parent,
        (false, None) => "",
    };
    let mut steps: Vec<(String, Role)> = component_chain(&wd_norm, deepest_below)
        .into_iter()
        .map(|p| (p, Role::Ancestor))
        .collect();
    if write_leaf {
        steps.push((resolved.to_owned(), Role::WriteLeaf));
    }
    steps
}

fn walk_sync<F>(
    mut stat: F,
    steps: &[(String, Role)],
    caller_path: &str,
) -> Result<(), SandboxError>
where
    F: FnMut(&str) -> Result<Option<EntryKind>, SandboxError>,
{
    for (component, role) in steps {
        match judge(*role, component, caller_path, stat(component)) {
            Step::Continue => {}
            Step::Accept => return Ok(()),
            Step::Refuse(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs the stats concurrently, at most [`MAX_CONCURRENT_STATS`] in flight, issued outermost first (polled
/// together in the calling task; nothing is spawned) and decides as soon as the outermost-first prefix of
/// finished stats decides, exactly as [`walk_sync`] would.
async fn walk_async<F, Fut>(
    mut stat: F,
    steps: &[(String, Role)],
    caller_path: &str,
) -> Result<(), SandboxError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Option<EntryKind>, SandboxError>>,
{
    let mut pending: Vec<Option<Pin<Box<Fut>>>> = steps.iter().map(|_| None).collect();
    let mut done: Vec<Option<Result<Option<EntryKind>, SandboxError>>> =
        steps.iter().map(|_| None).collect();
    // Index of the next step whose stat has not been issued.
    let mut issued_up_to = 0;
    // Index of the first step whose verdict is not yet known; everything before it was a directory.
    let mut decided_up_to = 0;
    poll_fn(|cx| loop {
        let in_flight = pending.iter().filter(|slot| slot.is_some()).count();
        let room = MAX_CONCURRENT_STATS.saturating_sub(in_flight);
        for _ in 0..room {
            let Some((component, _)) = steps.get(issued_up_to) else {
                break;
            };
            pending[issued_up_to] = Some(Box::pin(stat(component.clone())));
            issued_up_to += 1;
        }
        let mut finished_any = false;
        for (slot, result) in pending.iter_mut().zip(done.iter_mut()).skip(decided_up_to) {
            if let Some(fut) = slot {
                if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                    *result = Some(r);
                    *slot = None;
                    finished_any = true;
                }
            }
        }
        while decided_up_to < steps.len() {
            let Some(result) = done[decided_up_to].take() else {
                break;
            };
            let (component, role) = &steps[decided_up_to];
            match judge(*role, component, caller_path, result) {
                Step::Continue => decided_up_to += 1,
                Step::Accept => return Poll::Ready(Ok(())),
                Step::Refuse(e) => return Poll::Ready(Err(e)),
            }
        }
        if decided_up_to == steps.len() {
            return Poll::Ready(Ok(()));
        }
        // A finished stat freed room: issue the next ones now rather than wait for another wake-up.
        if !(finished_any && issued_up_to < steps.len()) {
            return Poll::Pending;
        }
    })
    .await
}

/// Refuses a path reached through a link or a non-directory, with a synchronous stat.
///
/// `stat` must be an **unconfined, no-follow** stat that the guest does not answer: `Ok(None)` for a missing
/// path. The walk covers `ancestors(deepest, wd)` outermost first, where `deepest` is `guest_path` when
/// `include_self`, else its parent, so `wd` and all of its ancestors are always checked. At each component:
/// missing → success (nothing below is reachable); link → [`SandboxError::Confinement`]; another
/// non-directory → [`SandboxError::NotADirectory`]; a stat error is returned as is. `guest_path` is confined
/// to `wd` first (a `Confinement` error before any stat).
pub fn refuse_linked_ancestors<F>(
    stat: F,
    guest_path: &str,
    wd: &str,
    include_self: bool,
) -> Result<(), SandboxError>
where
    F: FnMut(&str) -> Result<Option<EntryKind>, SandboxError>,
{
    let resolved = confine(guest_path, wd)?;
    walk_sync(stat, &plan(&resolved, wd, include_self, false), guest_path)
}

/// [`refuse_linked_ancestors`] with an asynchronous stat, the components statted concurrently.
///
/// Stat futures are created outermost first, at most [`MAX_CONCURRENT_STATS`] pending at once, and polled
/// together in the calling task (nothing is spawned, so no runtime is required); the path bounds of
/// [`confine`] cap how many there are in all. The verdict is the sequential walk's: it is decided
/// outermost first, and a finding below a missing component, a link or a non-directory is ignored. Because
/// components below an undecided one are statted too, a stat of a component below a link may follow that
/// link on the host; it reads metadata only and never changes the verdict.
///
/// Cancel safety: dropping the returned future drops every stat future still pending; nothing is left
/// half-done by this function itself. It also returns (dropping the remaining stats) as soon as the verdict
/// is known.
pub async fn refuse_linked_ancestors_async<F, Fut>(
    stat: F,
    guest_path: &str,
    wd: &str,
    include_self: bool,
) -> Result<(), SandboxError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Option<EntryKind>, SandboxError>>,
{
    let resolved = confine(guest_path, wd)?;
    walk_async(stat, &plan(&resolved, wd, include_self, false), guest_path).await
}

/// The confinement rules of one file method, applied in order by [`Access::check`] (or
/// [`Access::check_async`]): the name check of [`confine`], then a no-follow stat of every component on the
/// way, which refuses a link with [`SandboxError::Confinement`] and another non-directory with
/// [`SandboxError::NotADirectory`]. Each check returns the resolved path.
///
/// ```
/// use sandbox_core::guest_path::Access;
/// use sandbox_core::{EntryKind, ErrorKind};
///
/// // A guest where `/w` and `/w/sub` are directories and `/w/link` is a link.
/// let stat = |p: &str| {
///     Ok(match p {
///         "/w" | "/w/sub" => Some(EntryKind::Directory),
///         "/w/link" => Some(EntryKind::Symlink),
///         _ => None,
///     })
/// };
/// assert_eq!(Access::Write.check(stat, "sub/new", "/w").unwrap(), "/w/sub/new");
/// assert_eq!(Access::Write.check(stat, "link", "/w").unwrap_err().kind(), ErrorKind::Confinement);
/// // A read leaves the leaf to the method: a link may be read as a link.
/// assert_eq!(Access::Read.check(stat, "link", "/w").unwrap(), "/w/link");
/// assert_eq!(Access::List.check(stat, "link", "/w").unwrap_err().kind(), ErrorKind::Confinement);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// `write_file`: the working directory itself is refused (Confinement); the ancestors are checked
    /// (excluding the target); the target itself being a link is refused (Confinement).
    Write,
    /// `stat_file` / `read_file`: the ancestors are checked (excluding the target). The target is the
    /// method's to judge.
    Read,
    /// `list_dir`: the ancestors are checked, including the listed directory itself.
    List,
    /// `remove`: the working directory itself is refused (Confinement); the ancestors are checked
    /// (excluding the target). The target is never resolved: removing a link removes the link.
    Delete,
}

impl Access {
    /// The name check, then the stats this access needs.
    fn prepare(self, path: &str, wd: &str) -> Result<(String, Vec<(String, Role)>), SandboxError> {
        let resolved = self.resolve(path, wd)?;
        let steps = match self {
            Access::Write => plan(&resolved, wd, false, true),
            Access::Read | Access::Delete => plan(&resolved, wd, false, false),
            Access::List => plan(&resolved, wd, true, false),
        };
        Ok((resolved, steps))
    }

    /// Applies this access's rules to `path` under `wd` with a synchronous stat and returns the resolved
    /// path.
    ///
    /// `stat` must be an **unconfined, no-follow** stat that the guest does not answer, `Ok(None)` for a
    /// missing path, as for [`refuse_linked_ancestors`]; a stat error is returned as is.
    ///
    /// # Errors
    ///
    /// [`SandboxError::InvalidArgument`] for a path out of bounds (before any stat),
    /// [`SandboxError::Confinement`] for a path outside `wd`, the working directory itself where the access
    /// refuses it, or a link on the way; [`SandboxError::NotADirectory`] for another non-directory on the
    /// way.
    pub fn check<F>(self, stat: F, path: &str, wd: &str) -> Result<String, SandboxError>
    where
        F: FnMut(&str) -> Result<Option<EntryKind>, SandboxError>,
    {
        let (resolved, steps) = self.prepare(path, wd)?;
        walk_sync(stat, &steps, path)?;
        Ok(resolved)
    }

    /// The name checks of [`Access::check`] alone, with no stat: [`confine`], then the working
    /// directory itself refused where this access refuses it. Returns the resolved path.
    ///
    /// Only for a backend whose file operation walks every component of the resolved path
    /// itself, one name at a time from a held directory, never following a link and refusing a
    /// link or a non-directory on the way (`confined-fs`, under the sbx host plane): the stats of
    /// [`Access::check`] would only repeat that walk. Such a backend still owns the one rule a
    /// walk of the parents does not give: a [`Access::Write`] never goes through a link standing
    /// at the target.
    ///
    /// # Errors
    ///
    /// As [`Access::check`] before its first stat: [`SandboxError::InvalidArgument`] for a path
    /// out of bounds, [`SandboxError::Confinement`] for a path outside `wd` or the working
    /// directory itself where this access refuses it.
    ///
    /// ```
    /// use sandbox_core::guest_path::Access;
    /// use sandbox_core::ErrorKind;
    /// assert_eq!(Access::Write.resolve("sub/new", "/w").unwrap(), "/w/sub/new");
    /// assert_eq!(Access::Write.resolve(".", "/w").unwrap_err().kind(), ErrorKind::Confinement);
    /// assert_eq!(Access::List.resolve(".", "/w").unwrap(), "/w");
    /// assert_eq!(Access::Read.resolve("../x", "/w").unwrap_err().kind(), ErrorKind::Confinement);
    /// ```
    pub fn resolve(self, path: &str, wd: &str) -> Result<String, SandboxError> {
        let resolved = confine(path, wd)?;
        if matches!(self, Access::Write | Access::Delete) && resolved == normal_form(wd) {
            return Err(SandboxError::confinement(
                path,
                "the working directory itself is never written or removed",
            ));
        }
        Ok(resolved)
    }

    /// [`Access::check`] with an asynchronous stat; the stats run concurrently as in
    /// [`refuse_linked_ancestors_async`], with the same verdict as the synchronous check.
    ///
    /// # Errors
    ///
    /// As [`Access::check`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops every stat future still pending; nothing is left half-done by
    /// this function itself.
    pub async fn check_async<F, Fut>(
        self,
        stat: F,
        path: &str,
        wd: &str,
    ) -> Result<String, SandboxError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<Option<EntryKind>, SandboxError>>,
    {
        let (resolved, steps) = self.prepare(path, wd)?;
        walk_async(stat, &steps, path).await?;
        Ok(resolved)
    }
}

/// Resolves a call's working directory against the storage base, in normal form ([`norm`]).
///
/// An absolute `wd` is taken as it is (guest-native addressing: it may lie outside the base and may not
/// exist yet), only normalised, as a shell's `cd` reads it. A relative `wd` is confined to `base` by
/// [`confine`]. Every backend resolves with this, so one `wd` names one directory everywhere.
///
/// ```
/// use sandbox_core::guest_path::resolve_wd;
/// assert_eq!(resolve_wd("/srv//x/./y/..", "/w").unwrap(), "/srv/x");
/// assert_eq!(resolve_wd("a/./b", "/w").unwrap(), "/w/a/b");
/// assert!(resolve_wd("../x", "/w").is_err());
/// ```
pub fn resolve_wd(wd: &str, base: &str) -> Result<String, SandboxError> {
    if wd.starts_with('/') {
        check_shape("working directory", wd)?;
        Ok(norm(wd))
    } else {
        confine(wd, base)
    }
}

/// The path a file method reports for `resolved` (absolute, normal form): relative to the
/// working directory `wd`, `.` for the directory itself, absolute only outside it.
///
/// ```
/// use sandbox_core::guest_path::reported;
/// assert_eq!(reported("/w/a/b", "/w"), "a/b");
/// assert_eq!(reported("/w", "/w"), ".");
/// assert_eq!(reported("/etc/x", "/w"), "/etc/x");
/// ```
pub fn reported(resolved: &str, wd: &str) -> String {
    match relative_to(resolved, wd) {
        Some(relative) if relative.is_empty() => ".".to_owned(),
        Some(relative) => relative,
        None => resolved.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::collections::HashMap;

    /// A guest tree: absolute path → kind. Anything absent is missing.
    fn tree(entries: &[(&str, EntryKind)]) -> HashMap<String, EntryKind> {
        entries.iter().map(|(p, k)| ((*p).to_owned(), *k)).collect()
    }

    fn stat_of(
        t: &HashMap<String, EntryKind>,
    ) -> impl FnMut(&str) -> Result<Option<EntryKind>, SandboxError> + '_ {
        move |p| Ok(t.get(p).copied())
    }

    use EntryKind::{Directory as D, File as F, Symlink as L};

    fn base_tree() -> HashMap<String, EntryKind> {
        tree(&[
            ("/srv", D),
            ("/srv/w", D),
            ("/srv/w/sub", D),
            ("/srv/w/sub/f", F),
            ("/srv/w/link", L),
            ("/srv/w/file", F),
        ])
    }

    /// `resolve` is `check` without its stats: the same resolved path, or the same refusal, for
    /// every access, wherever the stats would have accepted.
    #[test]
    fn resolve_is_check_without_the_stats() {
        let accesses = [Access::Write, Access::Read, Access::List, Access::Delete];
        let cases = [
            ("f", "/w"),
            ("sub/f", "/w"),
            ("./sub/../f", "/w/"),
            (".", "/w"),
            ("", "/w"),
            ("sub/..", "/w"),
            ("..", "/w"),
            ("../x", "/w"),
            ("/w/f", "/w"),
            ("/etc/passwd", "/w"),
            ("a\\b", "/w"),
            ("a\0b", "/w"),
            ("f", "w/rel"),
        ];
        for access in accesses {
            for (path, wd) in cases {
                // Every stat finds nothing: the first one accepts, as a fresh path would.
                let checked = access.check(|_| Ok(None), path, wd);
                let resolved = access.resolve(path, wd);
                match (&checked, &resolved) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{access:?} {path:?} {wd:?}"),
                    (Err(a), Err(b)) => {
                        assert_eq!(a.kind(), b.kind(), "{access:?} {path:?} {wd:?}");
                        assert_eq!(a.to_string(), b.to_string());
                    }
                    _ => panic!("{access:?} {path:?} {wd:?}: {checked:?} against {resolved:?}"),
                }
            }
        }
        assert_eq!(
            Access::Delete.resolve(".", "/w").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        assert_eq!(Access::Read.resolve(".", "/w").unwrap(), "/w");
        assert_eq!(
            Access::Read
                .resolve(&"d/".repeat(300), "/w")
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn normal_forms_are_taken_as_they_are() {
        for normal in ["/", "/w", "/w/a.b", "a", "a/b", "...", "/w/..a/.b"] {
            assert!(is_normal(normal), "{normal:?}");
            assert_eq!(norm(normal), normal);
        }
        for other in [
            "",
            ".",
            "..",
            "//",
            "/w/",
            "/w//a",
            "/./w",
            "a/..",
            "../a",
            "/w/.",
            "//w",
            "/w/../etc",
        ] {
            assert!(!is_normal(other), "{other:?}");
        }
    }

    proptest::proptest! {
        /// The shortcut for a path already normal gives what the segment-by-segment form gives
        /// (a path it takes is its own normal form), and `norm` is idempotent.
        #[test]
        fn norm_agrees_with_the_segment_by_segment_form(
            segments in proptest::collection::vec(
                proptest::prop_oneof!["", "\\.", "\\.\\.", "[a-c.]{1,3}"], 0..6),
            absolute in proptest::bool::ANY,
        ) {
            let path = format!("{}{}", if absolute { "/" } else { "" }, segments.join("/"));
            let normal = norm(&path);
            proptest::prop_assert_eq!(&normal, &normalised(&path));
            proptest::prop_assert_eq!(norm(&normal), normal.clone());
            if is_normal(&path) {
                proptest::prop_assert_eq!(normal, path);
            }
        }

        /// Asked of two normal forms, the borrowing form answers as `relative_to` does.
        #[test]
        fn relative_to_normal_agrees_with_relative_to_on_normal_forms(
            path in proptest::collection::vec(
                proptest::prop_oneof!["", "\\.", "\\.\\.", "[ab]{1,2}"], 0..5),
            base in proptest::collection::vec(
                proptest::prop_oneof!["", "\\.", "\\.\\.", "[ab]{1,2}"], 0..4),
            path_absolute in proptest::bool::ANY,
            base_absolute in proptest::bool::ANY,
        ) {
            let root = |absolute: bool| if absolute { "/" } else { "" };
            let path = format!("{}{}", root(path_absolute), path.join("/"));
            let base = format!("{}{}", root(base_absolute), base.join("/"));
            proptest::prop_assert_eq!(
                relative_to_normal(&norm(&path), &norm(&base)).map(str::to_owned),
                relative_to(&path, &base)
            );
        }
    }

    #[test]
    fn norm_cases() {
        for (input, want) in [
            ("", "."),
            (".", "."),
            ("/", "/"),
            ("//", "/"),
            ("///a//b/", "/a/b"),
            ("/a/./b/../c", "/a/c"),
            ("/../..", "/"),
            ("/a/../../b", "/b"),
            ("a/..", "."),
            ("../a", "../a"),
            ("../../a/../b", "../../b"),
            ("a/../../b", "../b"),
            ("a/./b/.", "a/b"),
        ] {
            assert_eq!(norm(input), want, "norm({input:?})");
        }
    }

    #[test]
    fn join_cases() {
        assert_eq!(join("/w", "a"), "/w/a");
        assert_eq!(join("/w", "/etc"), "/etc");
        assert_eq!(join("/w", ""), "/w/");
    }

    #[test]
    fn relative_to_cases() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("/w", "/w", Some("")),
            ("/w/a/b", "/w", Some("a/b")),
            ("/w-outside", "/w", None),
            ("/w/sub2", "/w/sub", None),
            ("/w/sub/x", "/w/sub", Some("x")),
            ("/w/../etc", "/w", None),
            ("/anything", "/", Some("anything")),
            ("/", "/", Some("")),
            ("a/b", ".", Some("a/b")),
            ("/a", ".", None),
            ("..", ".", None),
            ("../x", ".", None),
            ("..x", ".", Some("..x")),
            ("w", "/w", None),
        ];
        for (path, base, want) in cases {
            assert_eq!(
                relative_to(path, base).as_deref(),
                *want,
                "relative_to({path:?}, {base:?})"
            );
        }
    }

    #[test]
    fn confine_accepts_inside() {
        assert_eq!(confine("", "/w").unwrap(), "/w");
        assert_eq!(confine(".", "/w/").unwrap(), "/w");
        assert_eq!(confine("a/../b", "/w").unwrap(), "/w/b");
        assert_eq!(confine("/w/x", "/w").unwrap(), "/w/x");
        assert_eq!(confine("a//b/", "//w").unwrap(), "/w/a/b");
    }

    #[test]
    fn confine_refuses_backslash_and_escapes() {
        for (path, wd) in [
            ("a\\b", "/w"),
            ("\\", "/w"),
            ("..", "/w"),
            ("../w-outside", "/w"),
            ("/w-outside", "/w"),
            ("/etc/passwd", "/w"),
            ("../sub2/x", "/w/sub"),
            ("a/../../x", "/w"),
        ] {
            let err = confine(path, wd).unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::Confinement,
                "confine({path:?}, {wd:?})"
            );
            match err {
                SandboxError::Confinement { path: p, .. } => assert_eq!(p, path),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn ancestors_cases() {
        assert_eq!(ancestors("/w", "/w"), ["/w"]);
        assert_eq!(ancestors("", "/srv/w"), ["/srv", "/srv/w"]);
        assert_eq!(
            ancestors("a/b", "/srv/w"),
            ["/srv", "/srv/w", "/srv/w/a", "/srv/w/a/b"]
        );
        assert_eq!(ancestors("/x", "/"), ["/x"]);
        assert!(ancestors("/", "/").is_empty());
        // Outside wd: only wd and its ancestors.
        assert_eq!(ancestors("/srv", "/srv/w"), ["/srv", "/srv/w"]);
        assert_eq!(ancestors("x", "rel/w"), ["rel", "rel/w", "rel/w/x"]);
    }

    #[test]
    fn walk_stops_at_missing() {
        let t = base_tree();
        assert!(refuse_linked_ancestors(stat_of(&t), "nope/deeper/x", "/srv/w", true).is_ok());
        let mut seen = Vec::new();
        refuse_linked_ancestors(
            |p: &str| {
                seen.push(p.to_owned());
                Ok(t.get(p).copied())
            },
            "nope/deeper/x",
            "/srv/w",
            true,
        )
        .unwrap();
        assert_eq!(seen, ["/srv", "/srv/w", "/srv/w/nope"]);
    }

    #[test]
    fn walk_under_a_relative_wd_does_not_rejoin() {
        let mut seen = Vec::new();
        let resolved = Access::List
            .check(
                |p: &str| {
                    seen.push(p.to_owned());
                    Ok(Some(D))
                },
                "a/b",
                "w",
            )
            .unwrap();
        assert_eq!(resolved, "w/a/b");
        assert_eq!(seen, ["w", "w/a", "w/a/b"]);
        assert_eq!(ancestors("a", "."), ["a"]);
        assert!(ancestors("", ".").is_empty());
    }

    #[test]
    fn walk_refuses_link_and_file() {
        let t = base_tree();
        let e = refuse_linked_ancestors(stat_of(&t), "link/x", "/srv/w", false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        let e = refuse_linked_ancestors(stat_of(&t), "file/x", "/srv/w", false).unwrap_err();
        assert!(matches!(e, SandboxError::NotADirectory { ref path } if path == "/srv/w/file"));
        // Exclusive: the leaf itself is not judged.
        assert!(refuse_linked_ancestors(stat_of(&t), "link", "/srv/w", false).is_ok());
        // Inclusive: it is.
        let e = refuse_linked_ancestors(stat_of(&t), "link", "/srv/w", true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
    }

    #[test]
    fn walk_refuses_linked_wd_and_its_ancestors() {
        let t = tree(&[("/srv", L), ("/srv/w", D)]);
        let e = refuse_linked_ancestors(stat_of(&t), "x", "/srv/w", false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        let t = tree(&[("/srv", D), ("/srv/w", L)]);
        let e = refuse_linked_ancestors(stat_of(&t), "", "/srv/w", false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
    }

    #[test]
    fn walk_returns_stat_errors_and_confines_first() {
        let e =
            refuse_linked_ancestors(|_: &str| Err(SandboxError::engine("boom")), "a", "/w", true)
                .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Engine);
        let mut called = false;
        let e = refuse_linked_ancestors(
            |_: &str| {
                called = true;
                Ok(None)
            },
            "../x",
            "/w",
            true,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
        assert!(!called, "no stat runs before the name check");
    }

    #[test]
    fn write_bundle() {
        let t = base_tree();
        assert_eq!(
            Access::Write
                .check(stat_of(&t), "sub/new", "/srv/w")
                .unwrap(),
            "/srv/w/sub/new"
        );
        assert_eq!(
            Access::Write.check(stat_of(&t), "sub/f", "/srv/w").unwrap(),
            "/srv/w/sub/f"
        );
        for (path, kind) in [
            ("", ErrorKind::Confinement),
            (".", ErrorKind::Confinement),
            ("sub/..", ErrorKind::Confinement),
            ("../x", ErrorKind::Confinement),
            ("a\\b", ErrorKind::Confinement),
            ("link", ErrorKind::Confinement),
            ("link/x", ErrorKind::Confinement),
            ("file/x", ErrorKind::NotADirectory),
        ] {
            let e = Access::Write
                .check(stat_of(&t), path, "/srv/w")
                .unwrap_err();
            assert_eq!(e.kind(), kind, "write {path:?}");
        }
    }

    #[test]
    fn read_bundle() {
        let t = base_tree();
        assert_eq!(
            Access::Read.check(stat_of(&t), "link", "/srv/w").unwrap(),
            "/srv/w/link"
        );
        assert_eq!(
            Access::Read.check(stat_of(&t), "", "/srv/w").unwrap(),
            "/srv/w"
        );
        assert_eq!(
            Access::Read
                .check(stat_of(&t), "link/x", "/srv/w")
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            Access::Read
                .check(stat_of(&t), "file/x", "/srv/w")
                .unwrap_err()
                .kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            Access::Read
                .check(stat_of(&t), "/srv/other", "/srv/w")
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
    }

    #[test]
    fn list_bundle() {
        let t = base_tree();
        assert_eq!(
            Access::List.check(stat_of(&t), "sub", "/srv/w").unwrap(),
            "/srv/w/sub"
        );
        assert_eq!(
            Access::List.check(stat_of(&t), "", "/srv/w").unwrap(),
            "/srv/w"
        );
        assert_eq!(
            Access::List
                .check(stat_of(&t), "link", "/srv/w")
                .unwrap_err()
                .kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            Access::List
                .check(stat_of(&t), "file", "/srv/w")
                .unwrap_err()
                .kind(),
            ErrorKind::NotADirectory
        );
    }

    #[test]
    fn delete_bundle() {
        let t = base_tree();
        // The leaf is never resolved: removing a link is allowed.
        assert_eq!(
            Access::Delete.check(stat_of(&t), "link", "/srv/w").unwrap(),
            "/srv/w/link"
        );
        for (path, kind) in [
            ("", ErrorKind::Confinement),
            ("/srv/w/", ErrorKind::Confinement),
            ("link/x", ErrorKind::Confinement),
            ("file/x", ErrorKind::NotADirectory),
            ("..", ErrorKind::Confinement),
        ] {
            assert_eq!(
                Access::Delete
                    .check(stat_of(&t), path, "/srv/w")
                    .unwrap_err()
                    .kind(),
                kind,
                "delete {path:?}"
            );
        }
    }

    #[test]
    fn resolve_wd_cases() {
        assert_eq!(resolve_wd("/elsewhere/x", "/base").unwrap(), "/elsewhere/x");
        assert_eq!(resolve_wd("/a/../b", "/base").unwrap(), "/b");
        assert_eq!(resolve_wd("proj", "/base").unwrap(), "/base/proj");
        assert_eq!(resolve_wd("", "/base").unwrap(), "/base");
        assert_eq!(
            resolve_wd("../x", "/base").unwrap_err().kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            resolve_wd("a\\b", "/base").unwrap_err().kind(),
            ErrorKind::Confinement
        );
    }

    fn async_stat(
        t: &HashMap<String, EntryKind>,
    ) -> impl FnMut(String) -> std::future::Ready<Result<Option<EntryKind>, SandboxError>> + '_
    {
        move |p| std::future::ready(Ok(t.get(&p).copied()))
    }

    #[tokio::test]
    async fn async_bundles_match_sync() {
        let t = base_tree();
        for path in [
            "", "sub", "sub/f", "sub/new", "link", "link/x", "file", "file/x", "nope/x", "../x",
            "a\\b",
        ] {
            let pairs = [
                (
                    Access::Write
                        .check(stat_of(&t), path, "/srv/w")
                        .map_err(|e| e.kind()),
                    Access::Write
                        .check_async(async_stat(&t), path, "/srv/w")
                        .await
                        .map_err(|e| e.kind()),
                ),
                (
                    Access::Read
                        .check(stat_of(&t), path, "/srv/w")
                        .map_err(|e| e.kind()),
                    Access::Read
                        .check_async(async_stat(&t), path, "/srv/w")
                        .await
                        .map_err(|e| e.kind()),
                ),
                (
                    Access::List
                        .check(stat_of(&t), path, "/srv/w")
                        .map_err(|e| e.kind()),
                    Access::List
                        .check_async(async_stat(&t), path, "/srv/w")
                        .await
                        .map_err(|e| e.kind()),
                ),
                (
                    Access::Delete
                        .check(stat_of(&t), path, "/srv/w")
                        .map_err(|e| e.kind()),
                    Access::Delete
                        .check_async(async_stat(&t), path, "/srv/w")
                        .await
                        .map_err(|e| e.kind()),
                ),
            ];
            for (sync, asynchronous) in pairs {
                assert_eq!(sync, asynchronous, "path {path:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn async_walk_decides_outermost_first_whatever_finishes_first() {
        use std::time::Duration;
        // The deepest component fails fast; an outer one finishes later as a link. The link wins, as in the
        // sequential walk, and the inner failure never surfaces.
        let t = tree(&[("/srv", D), ("/srv/w", L)]);
        let stat = |p: String| {
            let kind = t.get(&p).copied();
            async move {
                if p == "/srv/w/a" {
                    return Err(SandboxError::engine("fails first"));
                }
                tokio::time::sleep(Duration::from_millis(if p == "/srv/w" { 50 } else { 1 })).await;
                Ok(kind)
            }
        };
        let e = refuse_linked_ancestors_async(stat, "a/b", "/srv/w", false)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Confinement);
    }

    #[tokio::test(start_paused = true)]
    async fn async_walk_runs_stats_concurrently() {
        use std::time::Duration;
        let t = tree(&[("/a", D), ("/a/b", D), ("/a/b/c", D), ("/a/b/c/d", D)]);
        let started = tokio::time::Instant::now();
        let stat = |p: String| {
            let kind = t.get(&p).copied();
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(kind)
            }
        };
        Access::List.check_async(stat, "c/d", "/a/b").await.unwrap();
        // Four stats of one second each, run together.
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::cell::Cell;

    /// A stat that records that it ran; every path it sees is a directory.
    fn counting(
        calls: &Cell<usize>,
    ) -> impl FnMut(&str) -> Result<Option<EntryKind>, SandboxError> + '_ {
        move |_| {
            calls.set(calls.get() + 1);
            Ok(Some(EntryKind::Directory))
        }
    }

    #[test]
    fn oversized_paths_are_invalid_before_any_stat() {
        let deep = "d/".repeat(400) + "x";
        let long = "a".repeat(4097);
        let exactly_255 = vec!["c"; 254].join("/");
        for path in [deep.as_str(), long.as_str(), "a\0b", "\0"] {
            let calls = Cell::new(0);
            for result in [
                Access::Read.check(counting(&calls), path, "/w"),
                Access::Write.check(counting(&calls), path, "/w"),
                Access::List.check(counting(&calls), path, "/w"),
                Access::Delete.check(counting(&calls), path, "/w"),
                confine(path, "/w"),
            ] {
                assert_eq!(
                    result.unwrap_err().kind(),
                    ErrorKind::InvalidArgument,
                    "{:?}",
                    &path[..path.len().min(20)]
                );
            }
            assert_eq!(calls.get(), 0, "no stat ran");
        }
        // The bounds count the resolved path too: /w plus 254 components is 255, one more is refused.
        assert!(confine(&exactly_255, "/w").is_ok());
        assert_eq!(
            confine(&format!("{exactly_255}/c"), "/w")
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidArgument
        );
        // `..` does not buy room: a path of 300 components is refused even if it normalises to few.
        let climbing = "a/../".repeat(150);
        assert_eq!(
            confine(&climbing, "/w").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        // A NUL in the working directory is refused the same way.
        assert_eq!(
            confine("x", "/w\0").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            resolve_wd("/abs\0", "/base").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn check_bounds_alone() {
        assert!(check_bounds(&"a/".repeat(255)).is_ok());
        assert!(check_bounds(&"x".repeat(MAX_GUEST_PATH_BYTES)).is_ok());
        for path in [
            "d/".repeat(256),
            format!("/{}", "x".repeat(MAX_GUEST_PATH_BYTES)),
            "a\0b".to_owned(),
        ] {
            assert_eq!(
                check_bounds(&path).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{:?}",
                &path[..path.len().min(20)]
            );
        }
    }

    #[test]
    fn a_path_at_the_bounds_is_accepted() {
        let at_bytes = format!("/w/{}", "a".repeat(4093));
        assert_eq!(at_bytes.len(), 4096);
        assert!(confine(&at_bytes, "/w").is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn async_walk_keeps_a_bounded_number_of_stats_in_flight() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::time::Duration;
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let stat = |_: String| {
            let in_flight = in_flight.clone();
            let peak = peak.clone();
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(Some(EntryKind::Directory))
            }
        };
        let deep = vec!["d"; 250].join("/");
        Access::List.check_async(stat, &deep, "/w").await.unwrap();
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= MAX_CONCURRENT_STATS, "{peak} stats ran at once");
        assert!(peak > 1, "stats still overlap ({peak})");
    }
}
