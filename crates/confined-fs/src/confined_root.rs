//! The root handle and its operations.

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{fstat, openat, renameat, statat, unlinkat, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::alias_listing::{DirectoryListing, KernelListing};
use crate::descriptor_walk::{entry_kind, file_size, irregularity, Reached, Walk, DIRECTORY_FLAGS};
use crate::entries::{DirEntry, EntryKind, Stat};
use crate::error::{
    confinement, io_error, is_a_directory, not_a_directory, not_found, not_regular, too_large,
    ConfinementReason, Error, Irregular, Operation,
};
use crate::lexical_path::{GuestPath, NameRules};

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
/// its parent's descriptor with `O_NOFOLLOW`, so a link anywhere on the way is refused rather
/// than followed, even when the guest swaps one in between two system calls.
///
/// All methods are blocking system calls; run them on a blocking pool from async code. The
/// handle is `Send + Sync` and holds one descriptor (the root) between calls.
#[derive(Debug)]
pub struct ConfinedRoot {
    root: OwnedFd,
    host_path: PathBuf,
    name_rules: NameRules,
    listing: Arc<dyn DirectoryListing>,
}

impl ConfinedRoot {
    /// Opens `host_path` as the root, with the default options.
    ///
    /// The last component of `host_path` must be a real directory, not a link; the ones above it
    /// are the host's own and are resolved by the kernel.
    pub fn open(host_path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(host_path, RootOptions::default())
    }

    /// Opens `host_path` as the root, with `options`.
    pub fn open_with(host_path: impl AsRef<Path>, options: RootOptions) -> Result<Self, Error> {
        let host_path = host_path.as_ref().to_path_buf();
        let shown = host_path.display().to_string();
        let root = match rustix::fs::open(&host_path, DIRECTORY_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::MLINK) => {
                return Err(confinement(shown, ConfinementReason::Link))
            }
            // Linux answers ENOTDIR for a link opened with O_DIRECTORY | O_NOFOLLOW.
            Err(Errno::NOTDIR) => {
                let is_link = rustix::fs::lstat(&host_path)
                    .is_ok_and(|stat| entry_kind(&stat) == EntryKind::Symlink);
                return Err(if is_link {
                    confinement(shown, ConfinementReason::Link)
                } else {
                    not_a_directory(shown)
                });
            }
            Err(Errno::NOENT) => return Err(not_found(shown)),
            Err(errno) => return Err(io_error(Operation::OpenRoot, shown, errno)),
        };
        Ok(Self {
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
        Ok(walk.lstat_entry(parent.as_fd(), leaf)?.map(|stat| {
            let kind = entry_kind(&stat);
            Stat {
                kind,
                size: (kind == EntryKind::File).then(|| file_size(&stat)),
            }
        }))
    }

    /// Reads the regular file at `path`, refusing it whole when it holds more than `max` bytes.
    ///
    /// A link, named pipe, socket, device or multiply linked file is
    /// [`Error::NotRegularFile`]; the open never follows a link and never blocks on a pipe.
    /// Over `max` is [`Error::TooLarge`] with no prefix returned; reading stops as soon as the
    /// cap is passed.
    pub fn read(&self, path: impl AsRef<Path>, max: u64) -> Result<Vec<u8>, Error> {
        let path = self.parse(path.as_ref())?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Err(is_a_directory(path.shown()));
        };
        let walk = self.walk(&path, Operation::Read);
        let parent = walk.open_existing_dirs(leaf, false)?;
        let parent = parent.as_fd();
        let Some(stat) = walk.lstat_entry(parent, leaf)? else {
            return Err(not_found(path.shown()));
        };
        // Judge by the lstat first, so a device or pipe is never even opened unless it was
        // swapped in since; the fstat below catches that.
        refuse_unreadable(&path, &stat)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match openat(parent, walk.name(leaf), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::MLINK) => {
                return Err(not_regular(path.shown(), Irregular::Symlink))
            }
            Err(Errno::NOENT) => return Err(not_found(path.shown())),
            Err(errno) => return Err(walk.io(leaf, errno)),
        };
        let stat = fstat(&fd).map_err(|errno| walk.io(leaf, errno))?;
        refuse_unreadable(&path, &stat)?;
        if file_size(&stat) > max {
            return Err(too_large(path.shown(), max));
        }
        read_capped(File::from(fd), file_size(&stat), max).map_err(|failure| match failure {
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
        let path = self.parse(path.as_ref())?;
        let Some(leaf) = path.parts().len().checked_sub(1) else {
            return Err(is_a_directory(path.shown()));
        };
        let walk = self.walk(&path, Operation::Write);
        let parent = walk.open_existing_dirs(leaf, true)?;
        let parent = parent.as_fd();
        if let Some(stat) = walk.lstat_entry(parent, leaf)? {
            if entry_kind(&stat) == EntryKind::Directory {
                return Err(is_a_directory(path.shown()));
            }
        }
        let (temp_name, temp) = create_temp(parent).map_err(|errno| walk.io(leaf, errno))?;
        let written = File::from(temp).write_all(contents);
        let outcome = match written {
            Ok(()) => {
                renameat(parent, &temp_name, parent, walk.name(leaf)).map_err(|errno| match errno {
                    // A directory appeared at the destination since the lstat.
                    Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => is_a_directory(path.shown()),
                    errno => walk.io(leaf, errno),
                })
            }
            Err(source) => Err(io_error(Operation::Write, path.shown(), source)),
        };
        if outcome.is_err() {
            // Best effort: the error already says what went wrong.
            let _ = unlinkat(parent, &temp_name, AtFlags::empty());
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
        let dir = dir.as_fd();
        let mut names = KernelListing::names(dir)
            .map_err(|source| io_error(Operation::List, path.shown(), source))?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            if name.as_bytes().contains(&b'\\') {
                tracing::warn!(directory = %path.shown(), name = ?name, "skipping a name with a backslash");
                continue;
            }
            let stat = match statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(errno) => return Err(io_error(Operation::List, path.shown(), errno)),
            };
            let kind = entry_kind(&stat);
            entries.push(DirEntry {
                name,
                stat: Stat {
                    kind,
                    size: (kind == EntryKind::File).then(|| file_size(&stat)),
                },
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
        let parent = parent.as_fd();
        let Some(stat) = walk.lstat_entry(parent, leaf)? else {
            return Err(not_found(path.shown()));
        };
        if entry_kind(&stat) != EntryKind::Directory {
            match unlinkat(parent, walk.name(leaf), AtFlags::empty()) {
                Ok(()) => return Ok(()),
                Err(Errno::NOENT) => return Err(not_found(path.shown())),
                // Swapped for a directory since the lstat: handled as one below.
                Err(Errno::ISDIR) => {}
                Err(errno) => return Err(walk.io(leaf, errno)),
            }
        }
        if !recursive {
            return Err(is_a_directory(path.shown()));
        }
        remove_tree(parent, walk.name(leaf), &path.shown())
    }

    fn parse(&self, path: &Path) -> Result<GuestPath, Error> {
        GuestPath::parse(path, self.name_rules)
    }

    fn walk<'a>(&'a self, path: &'a GuestPath, operation: Operation) -> Walk<'a> {
        Walk {
            root: self.root.as_fd(),
            listing: self.listing.as_ref(),
            path,
            operation,
        }
    }
}

/// Refuses a directory and anything but a singly linked regular file.
fn refuse_unreadable(path: &GuestPath, stat: &rustix::fs::Stat) -> Result<(), Error> {
    if entry_kind(stat) == EntryKind::Directory {
        return Err(is_a_directory(path.shown()));
    }
    match irregularity(stat) {
        Some(found) => Err(not_regular(path.shown(), found)),
        None => Ok(()),
    }
}

enum ReadFailure {
    OverCap,
    Io(io::Error),
}

/// Reads `file` to its end, failing as soon as more than `max` bytes arrive.
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

/// Creates a fresh temporary file in `dir`: exclusive, never through a link, 0600.
fn create_temp(dir: BorrowedFd<'_>) -> Result<(OsString, OwnedFd), Errno> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut last = Errno::EXIST;
    for _ in 0..TEMP_ATTEMPTS {
        let name = temp_name();
        match openat(dir, &name, flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => return Ok((name, fd)),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(errno) => return Err(errno),
        }
    }
    Err(last)
}

/// A temporary name no other writer is likely to pick (`O_EXCL` settles a collision).
fn temp_name() -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = RandomState::new().hash_one((count, nanos, std::process::id()));
    OsString::from(format!("{TEMP_PREFIX}{digest:016x}{TEMP_SUFFIX}"))
}

/// One directory being emptied by [`remove_tree`].
struct Frame {
    dir: OwnedFd,
    name: OsString,
    pending: Vec<OsString>,
}

/// Removes the directory `name` inside `parent` and everything under it, depth first, each
/// entry unlinked relative to its own directory's descriptor.
fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr, shown: &str) -> Result<(), Error> {
    let io = |source: io::Error| io_error(Operation::Remove, shown, source);
    let io_errno = |errno: Errno| io_error(Operation::Remove, shown, errno);
    let top = match openat(parent, name, DIRECTORY_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(not_found(shown)),
        // Swapped for a link or a file since the lstat: the name goes, nothing is followed.
        Err(Errno::LOOP | Errno::MLINK | Errno::NOTDIR) => {
            return match unlinkat(parent, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(errno) => Err(io_errno(errno)),
            };
        }
        Err(errno) => return Err(io_errno(errno)),
    };
    let pending = KernelListing::names(top.as_fd()).map_err(io)?;
    let mut stack = vec![Frame {
        dir: top,
        name: name.to_owned(),
        pending,
    }];
    let mut budget = REMOVE_RACE_BUDGET;
    let mut spend = || {
        budget = budget.checked_sub(1).ok_or_else(|| {
            io(io::Error::other(
                "the tree kept changing while it was being removed",
            ))
        })?;
        Ok::<(), Error>(())
    };
    while let Some(top_index) = stack.len().checked_sub(1) {
        let Some(entry) = stack[top_index].pending.pop() else {
            let Some(done) = stack.pop() else { break };
            let holder = stack.last().map_or(parent, |frame| frame.dir.as_fd());
            match unlinkat(holder, &done.name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => {}
                // The guest added entries meanwhile: empty it again.
                Err(Errno::NOTEMPTY | Errno::EXIST) => {
                    spend()?;
                    let pending = KernelListing::names(done.dir.as_fd()).map_err(io)?;
                    stack.push(Frame { pending, ..done });
                }
                Err(errno) => return Err(io_errno(errno)),
            }
            continue;
        };
        let dir = stack[top_index].dir.as_fd();
        let stat = match statat(dir, &entry, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => continue,
            Err(errno) => return Err(io_errno(errno)),
        };
        if entry_kind(&stat) == EntryKind::Directory {
            match openat(dir, &entry, DIRECTORY_FLAGS, Mode::empty()) {
                Ok(child) => {
                    if stack.len() >= MAX_REMOVE_DEPTH {
                        return Err(io(io::Error::other(format!(
                            "the tree is deeper than {MAX_REMOVE_DEPTH} levels"
                        ))));
                    }
                    let pending = KernelListing::names(child.as_fd()).map_err(io)?;
                    stack.push(Frame {
                        dir: child,
                        name: entry,
                        pending,
                    });
                }
                Err(Errno::NOENT) => {}
                // Swapped since the stat: look again.
                Err(Errno::LOOP | Errno::MLINK | Errno::NOTDIR) => {
                    spend()?;
                    stack[top_index].pending.push(entry);
                }
                Err(errno) => return Err(io_errno(errno)),
            }
        } else {
            match unlinkat(dir, &entry, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                // Swapped for a directory since the stat: look again.
                Err(Errno::ISDIR) => {
                    spend()?;
                    stack[top_index].pending.push(entry);
                }
                Err(errno) => return Err(io_errno(errno)),
            }
        }
    }
    Ok(())
}
