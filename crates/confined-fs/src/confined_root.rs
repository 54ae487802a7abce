//! The root handle and its operations.

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt};
use cap_std::fs::{Dir, File, Metadata, OpenOptions};

use crate::alias_listing::{handle_of, names_of, DirectoryListing, KernelListing};
use crate::entries::{DirEntry, EntryKind, Stat};
use crate::error::{
    confinement, io_error, is_a_directory, not_a_directory, not_found, not_regular, too_large,
    ConfinementReason, Error, Irregular, Operation,
};
use crate::held_children::DirectoryFacts;
#[cfg(any(target_os = "linux", target_os = "android"))]
use crate::held_children::HeldChildren;
use crate::host_metadata::{entry_kind, file_size, irregularity, open_stopped_at_link};
use crate::lexical_path::{GuestPath, NameRules};
use crate::no_follow_walk::{open_dir_no_follow, HeldDir, OpenedDir, Reached, Walk};

/// Largest chunk a read asks the kernel for.
const READ_CHUNK: u64 = 1 << 20;

/// Temporary files are named `<prefix><16 hex><suffix>`, the names the Python host plane uses, so
/// either host recognises the other's leftovers.
const TEMP_PREFIX: &str = ".maf-sbx-";
const TEMP_SUFFIX: &str = ".part";

/// Attempts at a fresh temporary name before giving up (a collision means a planted name).
const TEMP_ATTEMPTS: u32 = 16;

/// Deepest tree a recursive remove descends (one descriptor is held per level).
pub const MAX_REMOVE_DEPTH: usize = 512;

/// How many times a recursive remove re-examines entries the guest changed under it.
const REMOVE_RACE_BUDGET: u32 = 10_000;

/// Temporary files are private to the host user (Windows has no modes).
#[cfg(unix)]
const PRIVATE_FILE: u32 = 0o600;

/// How a [`ConfinedRoot`] is opened.
#[derive(Debug, Clone)]
pub struct RootOptions {
    name_rules: NameRules,
    listing: Arc<dyn DirectoryListing>,
}

impl Default for RootOptions {
    fn default() -> Self {
        Self {
            name_rules: NameRules::Posix,
            listing: Arc::new(KernelListing),
        }
    }
}

impl RootOptions {
    /// The naming rules every component must meet (default [`NameRules::Posix`]).
    pub fn name_rules(mut self, rules: NameRules) -> Self {
        self.name_rules = rules;
        self
    }

    /// The listing the alias check consults (default [`KernelListing`]).
    pub fn listing(mut self, listing: Arc<dyn DirectoryListing>) -> Self {
        self.listing = listing;
        self
    }
}

/// A directory on the host, held open, through which every operation stays confined.
///
/// Every path is relative to the root and `/`-separated. Each component is opened relative to
/// its parent's handle with cap-std's no-follow opens, so a link anywhere on the way is refused
/// rather than followed, even when the guest swaps one in between two system calls.
///
/// All methods are blocking system calls; run them on a blocking pool from async code. The
/// handle is `Send + Sync` and holds the root between calls; on Linux also the root opened for
/// reading (the alias check reads its flags there) and up to four directories of the root that
/// operations entered, each entered again only when the operation's own no-follow lstat finds
/// that very directory under its name (see the crate's documentation).
#[derive(Debug)]
pub struct ConfinedRoot {
    root: Dir,
    pub(crate) root_facts: DirectoryFacts,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) children: HeldChildren,
    host_path: PathBuf,
    name_rules: NameRules,
    listing: Arc<dyn DirectoryListing>,
}

impl ConfinedRoot {
    /// Opens `host_path` as the root, with the default options.
    ///
    /// The last component of `host_path` must be a real directory, not a link (nor, on Windows,
    /// any reparse point); the ones above it are the host's own and are resolved by the host.
    pub fn open(host_path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(host_path, RootOptions::default())
    }

    /// Opens `host_path` as the root, with `options`.
    pub fn open_with(host_path: impl AsRef<Path>, options: RootOptions) -> Result<Self, Error> {
        let host_path = host_path.as_ref().to_path_buf();
        let shown = host_path.display().to_string();
        let root =
            open_root(&host_path, options.listing.as_ref()).map_err(|failure| match failure {
                RootFailure::Link => confinement(&shown, ConfinementReason::Link),
                RootFailure::NotADirectory => not_a_directory(&shown),
                RootFailure::Missing => not_found(&shown),
                RootFailure::Io(source) => io_error(Operation::OpenRoot, &shown, source),
            })?;
        Ok(Self {
            root_facts: DirectoryFacts::of(&root),
            #[cfg(any(target_os = "linux", target_os = "android"))]
            children: HeldChildren::default(),
            root,
            host_path,
            name_rules: options.name_rules,
            listing: options.listing,
        })
    }

    /// The host path the root was opened from (for messages; never used to reach files).
    pub fn host_path(&self) -> &Path {
        &self.host_path
    }

    /// Describes `path` without following a link at any component.
    ///
    /// `Ok(None)` when it, or one of its parents, does not exist. The root is a directory. A link
    /// among the parents is [`Error::Confinement`]; a link as the last component is described
    /// as [`EntryKind::Symlink`] with no size.
    pub fn lstat(&self, path: impl AsRef<Path>) -> Result<Option<Stat>, Error> {
        let path = self.parse(path.as_ref())?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Ok(Some(Stat {
                kind: EntryKind::Directory,
                size: None,
            }));
        };
        let walk = self.walk(&path, Operation::Lstat);
        let Reached::Dir(parent) = walk.open_dirs(leaf, false)? else {
            return Ok(None);
        };
        Ok(walk
            .lstat_entry(&parent, leaf)?
            .map(|metadata| stat_of(&metadata)))
    }

    /// Reads the regular file at `path`, refusing it whole when it holds more than `max` bytes.
    ///
    /// A link, named pipe, socket, device or multiply linked file is
    /// [`Error::NotRegularFile`]; the open never follows a link and never blocks on a pipe.
    /// Over `max` is [`Error::TooLarge`] with no prefix returned; reading stops as soon as the
    /// cap is passed.
    pub fn read(&self, path: impl AsRef<Path>, max: u64) -> Result<Vec<u8>, Error> {
        self.read_leaf(path.as_ref(), max, Over::Refuse)
    }

    /// Reads at most the first `max` bytes of the regular file at `path`: the whole file when
    /// it is no larger, never an error for its size. Refuses what [`ConfinedRoot::read`] refuses
    /// but the size, and never reads past `max`.
    pub fn read_head(&self, path: impl AsRef<Path>, max: u64) -> Result<Vec<u8>, Error> {
        self.read_leaf(path.as_ref(), max, Over::Cut)
    }

    fn read_leaf(&self, path: &Path, max: u64, over: Over) -> Result<Vec<u8>, Error> {
        let path = self.parse(path)?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Err(is_a_directory(path.shown()));
        };
        let walk = self.walk(&path, Operation::Read);
        let parent = walk.open_existing_dirs(leaf, false)?;
        let Some(metadata) = walk.lstat_entry(&parent, leaf)? else {
            return Err(not_found(path.shown()));
        };
        // Judge by the lstat first, so a device or pipe is never even opened unless it was
        // swapped in since; the check of the open file below catches that.
        refuse_unreadable(&path, &metadata)?;
        let file = match parent.open_with(walk.name(leaf), &read_options()) {
            Ok(file) => file,
            // A link swapped in since the lstat: the no-follow open refused it. (A file removed
            // since is not found: `walk.io` says so for any `NotFound`.)
            Err(error) if open_stopped_at_link(&error) => {
                return Err(not_regular(path.shown(), Irregular::Symlink))
            }
            Err(error) => return Err(walk.io(leaf, error)),
        };
        let metadata = file.metadata().map_err(|error| walk.io(leaf, error))?;
        refuse_unreadable(&path, &metadata)?;
        if over == Over::Cut {
            let mut head = Vec::with_capacity(
                usize::try_from(file_size(&metadata).min(max).min(READ_CHUNK)).unwrap_or(0),
            );
            file.take(max)
                .read_to_end(&mut head)
                .map_err(|source| io_error(Operation::Read, path.shown(), source))?;
            return Ok(head);
        }
        if file_size(&metadata) > max {
            return Err(too_large(path.shown(), max));
        }
        read_capped(file, file_size(&metadata), max).map_err(|failure| match failure {
            ReadFailure::OverCap => too_large(path.shown(), max),
            ReadFailure::Io(source) => io_error(Operation::Read, path.shown(), source),
        })
    }

    /// Writes `contents` to `path`, creating missing directories (0700).
    ///
    /// The bytes go to a fresh temporary file (0600) in the same directory, which is then renamed
    /// over `path`: whatever stood there (a file, a link) is replaced, never written through. A
    /// directory at `path` is [`Error::IsADirectory`]. On failure the temporary file is removed.
    pub fn write(&self, path: impl AsRef<Path>, contents: &[u8]) -> Result<(), Error> {
        self.write_leaf(path.as_ref(), contents, AtLink::Replace)
    }

    /// As [`ConfinedRoot::write`], except that a link standing at `path` is refused
    /// ([`Error::Confinement`], [`ConfinementReason::Link`]) and left as it is, for a caller whose
    /// rule is that a write never goes through a link, not even to replace it. The check is the
    /// lstat the write makes anyway, so it costs no system call; a link swapped in after it is
    /// still replaced by the rename, never written through.
    pub fn write_unless_link(&self, path: impl AsRef<Path>, contents: &[u8]) -> Result<(), Error> {
        self.write_leaf(path.as_ref(), contents, AtLink::Refuse)
    }

    fn write_leaf(&self, path: &Path, contents: &[u8], at_link: AtLink) -> Result<(), Error> {
        let path = self.parse(path)?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Err(is_a_directory(path.shown()));
        };
        let walk = self.walk(&path, Operation::Write);
        let parent = walk.open_existing_dirs(leaf, true)?;
        if let Some(metadata) = walk.lstat_entry(&parent, leaf)? {
            match entry_kind(&metadata) {
                EntryKind::Directory => return Err(is_a_directory(path.shown())),
                EntryKind::Symlink if at_link == AtLink::Refuse => {
                    return Err(confinement(path.shown(), ConfinementReason::Link))
                }
                _ => {}
            }
        }
        let (temp_name, mut temp) = create_temp(&parent).map_err(|error| walk.io(leaf, error))?;
        let written = temp.write_all(contents);
        // Closed before the rename: Windows refuses to rename a file that is open.
        drop(temp);
        let outcome = match written {
            Ok(()) => parent
                .rename(&temp_name, &parent, walk.name(leaf))
                .map_err(|error| match error.kind() {
                    // A directory appeared at the destination since the lstat.
                    io::ErrorKind::IsADirectory
                    | io::ErrorKind::DirectoryNotEmpty
                    | io::ErrorKind::AlreadyExists => is_a_directory(path.shown()),
                    _ => walk.io(leaf, error),
                }),
            Err(source) => Err(io_error(Operation::Write, path.shown(), source)),
        };
        if outcome.is_err() {
            // Best effort: the error already says what went wrong.
            let _ = parent.remove_file(&temp_name);
        }
        outcome
    }

    /// Creates the directory `path` and every missing parent (0700); existing ones are kept.
    pub fn make_dirs(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = self.parse(path.as_ref())?;
        let walk = self.walk(&path, Operation::MakeDirs);
        walk.open_existing_dirs(path.parts().len(), true).map(drop)
    }

    /// Lists the directory `path`, one level, sorted by name; links are listed as links.
    ///
    /// An entry that vanishes while being listed is left out. A name containing a backslash is
    /// left out (and logged): no path this crate accepts could address it.
    pub fn list(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>, Error> {
        let path = self.parse(path.as_ref())?;
        let walk = self.walk(&path, Operation::List);
        let dir = walk.open_existing_dirs(path.parts().len(), false)?;
        let mut names =
            names_of(&dir).map_err(|source| io_error(Operation::List, path.shown(), source))?;
        names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            if name.as_encoded_bytes().contains(&b'\\') {
                tracing::warn!(directory = %path.shown(), name = ?name, "skipping a name with a backslash");
                continue;
            }
            self.listing.race_window(handle_of(&dir), &name);
            let metadata = match dir.symlink_metadata(&name) {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(io_error(Operation::List, path.shown(), error)),
            };
            entries.push(DirEntry {
                name,
                stat: stat_of(&metadata),
            });
        }
        Ok(entries)
    }

    /// Removes `path`: a file, link or other non-directory is unlinked (a link is never
    /// followed); a directory only when `recursive`, its contents unlinked from the inside with
    /// no link inside ever followed.
    ///
    /// The root itself is [`Error::Confinement`]; a missing `path` is [`Error::NotFound`]. A
    /// tree deeper than [`MAX_REMOVE_DEPTH`] fails with [`Error::Io`] after removing what it
    /// reached.
    pub fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<(), Error> {
        let path = self.parse(path.as_ref())?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Err(confinement(path.shown(), ConfinementReason::Root));
        };
        let walk = self.walk(&path, Operation::Remove);
        let parent = walk.open_existing_dirs(leaf, false)?;
        let Some(metadata) = walk.lstat_entry(&parent, leaf)? else {
            return Err(not_found(path.shown()));
        };
        if entry_kind(&metadata) != EntryKind::Directory {
            match parent.remove_file_or_symlink(walk.name(leaf)) {
                Ok(()) => return Ok(()),
                // Swapped for a directory since the lstat: handled as one below. (Removed since
                // is not found: `walk.io` says so for any `NotFound`.)
                Err(error) if error.kind() == io::ErrorKind::IsADirectory => {}
                Err(error) => return Err(walk.io(leaf, error)),
            }
        }
        if !recursive {
            return Err(is_a_directory(path.shown()));
        }
        remove_tree(&parent, walk.name(leaf), &path.shown(), walk.listing)
    }

    fn parse(&self, path: &Path) -> Result<GuestPath, Error> {
        GuestPath::parse(path, self.name_rules)
    }

    fn walk<'a>(&'a self, path: &'a GuestPath, operation: Operation) -> Walk<'a> {
        Walk {
            root: &self.root,
            root_facts: &self.root_facts,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            children: &self.children,
            listing: self.listing.as_ref(),
            path,
            operation,
        }
    }
}

/// What a write does with a link standing at its target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AtLink {
    /// Replaces it (the rename), never writing through it.
    Replace,
    /// Refuses the write and leaves it.
    Refuse,
}

/// Why the root could not be opened.
enum RootFailure {
    Link,
    NotADirectory,
    Missing,
    Io(io::Error),
}

/// Opens the root: the directory above it through the host's own resolution (the host's
/// ancestors are trusted), the root itself with a no-follow open.
fn open_root(host_path: &Path, listing: &dyn DirectoryListing) -> Result<Dir, RootFailure> {
    let ambient = |path: &Path| {
        Dir::open_ambient_dir(path, cap_std::ambient_authority()).map_err(|error| {
            // A missing directory becomes `Error::NotFound` through `io_error`.
            match error.kind() {
                io::ErrorKind::NotADirectory => RootFailure::NotADirectory,
                _ => RootFailure::Io(error),
            }
        })
    };
    // `/`, `..` and the like name no entry of a parent: nothing of the guest's to refuse there.
    let Some(name) = host_path.file_name() else {
        return ambient(host_path);
    };
    let parent = match host_path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    match open_dir_no_follow(&ambient(parent)?, name, listing) {
        Ok(OpenedDir::Dir(root)) => Ok(root),
        Ok(OpenedDir::NotADirectory(EntryKind::Symlink)) => Err(RootFailure::Link),
        Ok(OpenedDir::NotADirectory(_)) => Err(RootFailure::NotADirectory),
        Ok(OpenedDir::Missing) => Err(RootFailure::Missing),
        Err(error) => Err(RootFailure::Io(error)),
    }
}

/// What `lstat` and `list` report for an entry.
fn stat_of(metadata: &Metadata) -> Stat {
    let kind = entry_kind(metadata);
    Stat {
        kind,
        size: (kind == EntryKind::File).then(|| file_size(metadata)),
    }
}

/// Refuses a directory and anything but a singly linked regular file.
fn refuse_unreadable(path: &GuestPath, metadata: &Metadata) -> Result<(), Error> {
    if entry_kind(metadata) == EntryKind::Directory {
        return Err(is_a_directory(path.shown()));
    }
    match irregularity(metadata) {
        Some(found) => Err(not_regular(path.shown(), found)),
        None => Ok(()),
    }
}

/// How a file is opened for reading: never through a link, and without blocking, so a pipe
/// swapped in since the lstat cannot hang the open.
fn read_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).nonblock(true);
    options
}

enum ReadFailure {
    OverCap,
    Io(io::Error),
}

/// Reads `file` to its end, failing as soon as more than `max` bytes arrive.
/// What a read does with a file larger than its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Refuses it whole.
    Refuse,
    /// Returns its first `max` bytes.
    Cut,
}

fn read_capped(mut file: File, size_hint: u64, max: u64) -> Result<Vec<u8>, ReadFailure> {
    let capacity = usize::try_from(size_hint.min(max).min(READ_CHUNK)).unwrap_or(0);
    let mut contents = Vec::with_capacity(capacity);
    loop {
        let read_so_far = contents.len() as u64;
        // One byte past the cap is enough to know it was passed.
        let want = READ_CHUNK.min(max.saturating_add(1).saturating_sub(read_so_far));
        let got = (&mut file)
            .take(want)
            .read_to_end(&mut contents)
            .map_err(ReadFailure::Io)?;
        if contents.len() as u64 > max {
            return Err(ReadFailure::OverCap);
        }
        if got == 0 {
            return Ok(contents);
        }
    }
}

/// How a temporary file is created: exclusive and private. An exclusive create never goes
/// through a link: it fails on any existing name, a dangling link included (`O_CREAT | O_EXCL`
/// on Unix; cap-std opens the reparse point itself on Windows), so no-follow would add nothing.
fn temp_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    cap_std::fs::OpenOptionsExt::mode(&mut options, PRIVATE_FILE);
    options
}

/// Creates a fresh temporary file in `dir`.
fn create_temp(dir: &Dir) -> io::Result<(OsString, File)> {
    create_temp_named(dir, temp_name)
}

/// Creates a fresh temporary file in `dir` under the first of `next_name`'s names that is not
/// taken; any other failure ends the attempts at once.
fn create_temp_named(
    dir: &Dir,
    mut next_name: impl FnMut() -> OsString,
) -> io::Result<(OsString, File)> {
    let options = temp_options();
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..TEMP_ATTEMPTS {
        let name = next_name();
        match dir.open_with(&name, &options) {
            Ok(file) => return Ok((name, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last = error,
            Err(error) => return Err(error),
        }
    }
    Err(last)
}

/// A temporary name no other writer is likely to pick (an exclusive create settles a collision).
fn temp_name() -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = RandomState::new().hash_one((count, nanos, std::process::id()));
    OsString::from(format!("{TEMP_PREFIX}{digest:016x}{TEMP_SUFFIX}"))
}

/// One directory being emptied by [`remove_tree`]: the directory holding the tree first (never
/// removed), then one frame per level being descended.
struct Frame<'a> {
    dir: HeldDir<'a>,
    name: OsString,
    pending: Vec<OsString>,
}

/// Removes the directory `name` inside `parent` and everything under it, depth first, each
/// entry removed relative to its own directory's handle.
fn remove_tree(
    parent: &Dir,
    name: &OsStr,
    shown: &str,
    listing: &dyn DirectoryListing,
) -> Result<(), Error> {
    let io = |source: io::Error| io_error(Operation::Remove, shown, source);
    let top = match open_dir_no_follow(parent, name, listing).map_err(io)? {
        OpenedDir::Dir(top) => top,
        OpenedDir::Missing => return Err(not_found(shown)),
        // Swapped for a link or a file since the lstat: the name goes, nothing is followed.
        // (Removed since as well: not found, as when it went before the open.)
        OpenedDir::NotADirectory(_) => return parent.remove_file_or_symlink(name).map_err(io),
    };
    let pending = names_of(&top).map_err(io)?;
    let mut stack = vec![
        Frame {
            dir: HeldDir::Root(parent),
            name: OsString::new(),
            pending: Vec::new(),
        },
        Frame {
            dir: HeldDir::Opened(top),
            name: name.to_owned(),
            pending,
        },
    ];
    let mut budget = REMOVE_RACE_BUDGET;
    let mut spend = || {
        budget = budget.checked_sub(1).ok_or_else(|| {
            io(io::Error::other(
                "the tree kept changing while it was being removed",
            ))
        })?;
        Ok::<(), Error>(())
    };
    loop {
        let top_index = stack.len() - 1;
        let Some(entry) = stack[top_index].pending.pop() else {
            // The holder frame (index 0) is never removed: once it is the only one left with
            // nothing pending, all is gone. (The tree's own name is pending there again when
            // its removal found entries added meanwhile.)
            if top_index == 0 {
                break;
            }
            let Some(done) = stack.pop() else { break };
            // Closed before its removal: Windows refuses to remove a directory that is open.
            let Frame { dir, name, .. } = done;
            drop(dir);
            let holder = &stack[top_index - 1];
            match holder.dir.remove_dir(&name) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                // The guest added entries meanwhile (or swapped something in): look again.
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::DirectoryNotEmpty
                            | io::ErrorKind::AlreadyExists
                            | io::ErrorKind::NotADirectory
                    ) =>
                {
                    spend()?;
                    stack[top_index - 1].pending.push(name);
                }
                Err(error) => return Err(io(error)),
            }
            continue;
        };
        let dir = &stack[top_index].dir;
        listing.race_window(handle_of(dir), &entry);
        let metadata = match dir.symlink_metadata(&entry) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io(error)),
        };
        listing.race_window(handle_of(dir), &entry);
        if entry_kind(&metadata) == EntryKind::Directory {
            match open_dir_no_follow(dir, &entry, listing).map_err(io)? {
                OpenedDir::Dir(child) => {
                    if stack.len() > MAX_REMOVE_DEPTH {
                        return Err(io(io::Error::other(format!(
                            "the tree is deeper than {MAX_REMOVE_DEPTH} levels"
                        ))));
                    }
                    let pending = names_of(&child).map_err(io)?;
                    stack.push(Frame {
                        dir: HeldDir::Opened(child),
                        name: entry,
                        pending,
                    });
                }
                OpenedDir::Missing => {}
                // Swapped since the stat: look again.
                OpenedDir::NotADirectory(_) => {
                    spend()?;
                    stack[top_index].pending.push(entry);
                }
            }
        } else {
            match dir.remove_file_or_symlink(&entry) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                // Swapped for a directory since the stat: look again.
                Err(error) if error.kind() == io::ErrorKind::IsADirectory => {
                    spend()?;
                    stack[top_index].pending.push(entry);
                }
                Err(error) => return Err(io(error)),
            }
        }
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_is_never_created_through_a_planted_name() {
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(base.path().join("taken"), b"planted").unwrap();
        std::os::unix::fs::symlink(
            outside.join("created-through-link"),
            base.path().join("dangling"),
        )
        .unwrap();
        std::os::unix::fs::symlink(base.path().join("taken"), base.path().join("to-file")).unwrap();
        let dir = Dir::open_ambient_dir(base.path(), cap_std::ambient_authority()).unwrap();
        for planted in ["taken", "dangling", "to-file"] {
            let error = dir.open_with(planted, &temp_options()).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::AlreadyExists, "{planted}");
        }
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        assert_eq!(
            std::fs::read(base.path().join("taken")).unwrap(),
            b"planted"
        );

        let (name, mut file) = create_temp(&dir).unwrap();
        file.write_all(b"fresh").unwrap();
        let name = name.into_string().unwrap();
        assert!(
            name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX),
            "{name}"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(base.path().join(&name))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, PRIVATE_FILE, "{mode:o}");
    }

    /// `names` in turn, counting how many were asked for.
    fn names_from<'a>(
        names: &'a [&str],
        asked: &'a std::cell::Cell<usize>,
    ) -> impl FnMut() -> OsString + 'a {
        move || {
            let name = names[asked.get().min(names.len() - 1)];
            asked.set(asked.get() + 1);
            OsString::from(name)
        }
    }

    #[test]
    fn a_planted_temporary_name_is_passed_over_for_a_fresh_one() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(base.path().join("taken"), b"planted").unwrap();
        std::os::unix::fs::symlink("nowhere", base.path().join("dangling")).unwrap();
        let dir = Dir::open_ambient_dir(base.path(), cap_std::ambient_authority()).unwrap();
        let asked = std::cell::Cell::new(0);
        let (name, _) =
            create_temp_named(&dir, names_from(&["taken", "dangling", "fresh"], &asked)).unwrap();
        assert_eq!((name.to_str(), asked.get()), (Some("fresh"), 3));
        assert_eq!(
            std::fs::read(base.path().join("taken")).unwrap(),
            b"planted"
        );

        // Every name taken: given up on after a bounded number of attempts.
        asked.set(0);
        let error = create_temp_named(&dir, names_from(&["taken"], &asked)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(asked.get(), TEMP_ATTEMPTS as usize);
    }

    #[test]
    fn a_temporary_file_the_host_cannot_create_fails_at_once() {
        let base = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(base.path(), cap_std::ambient_authority()).unwrap();
        let asked = std::cell::Cell::new(0);
        let error = create_temp_named(&dir, names_from(&["no-such-directory/x", "fresh"], &asked))
            .unwrap_err();
        assert_eq!((error.kind(), asked.get()), (io::ErrorKind::NotFound, 1));
        assert!(std::fs::symlink_metadata(base.path().join("fresh")).is_err());
    }
}
