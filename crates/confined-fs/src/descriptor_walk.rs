//! The no-follow descriptor walk: each component is looked up relative to the held descriptor
//! of its parent, never by a path the kernel resolves from the root.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{mkdirat, openat, statat, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::alias_listing::DirectoryListing;
use crate::entries::EntryKind;
use crate::error::{
    confinement, io_error, not_a_directory, not_found, ConfinementReason, Error, Irregular,
    Operation,
};
use crate::lexical_path::GuestPath;

/// How every directory is opened: read-only, must be a directory, a link is never followed.
pub(crate) const DIRECTORY_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Directories the walk creates are private to the host user.
pub(crate) const PRIVATE_DIRECTORY: u32 = 0o700;

/// A held directory: the root (borrowed from the [`ConfinedRoot`](crate::ConfinedRoot)) or one
/// the walk opened.
#[derive(Debug)]
pub(crate) enum HeldDir<'a> {
    Root(BorrowedFd<'a>),
    Opened(OwnedFd),
}

impl AsFd for HeldDir<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Root(fd) => *fd,
            Self::Opened(fd) => fd.as_fd(),
        }
    }
}

/// What kind of entry a no-follow stat describes.
pub(crate) fn entry_kind(stat: &Stat) -> EntryKind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// What a non-regular (or multiply linked) file is, for a read refusal.
pub(crate) fn irregularity(stat: &Stat) -> Option<Irregular> {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {
            let links = link_count(stat);
            (links > 1).then_some(Irregular::HardLinked { links })
        }
        FileType::Symlink => Some(Irregular::Symlink),
        FileType::Fifo => Some(Irregular::Fifo),
        FileType::Socket => Some(Irregular::Socket),
        FileType::CharacterDevice => Some(Irregular::CharDevice),
        FileType::BlockDevice => Some(Irregular::BlockDevice),
        FileType::Directory | FileType::Unknown => Some(Irregular::Unknown),
    }
}

// The field's width differs by architecture (u32 on some, u64 on others).
#[allow(clippy::unnecessary_cast)]
fn link_count(stat: &Stat) -> u64 {
    stat.st_nlink as u64
}

/// The size of a regular file from its stat (negative sizes do not occur; read as 0).
pub(crate) fn file_size(stat: &Stat) -> u64 {
    u64::try_from(stat.st_size).unwrap_or(0)
}

/// Where a walk through directories ended.
pub(crate) enum Reached<'a> {
    /// Every component was a directory; the last one is held.
    Dir(HeldDir<'a>),
    /// Component `index` does not exist.
    Missing(usize),
}

/// One walk of one path for one operation.
pub(crate) struct Walk<'a> {
    pub(crate) root: BorrowedFd<'a>,
    pub(crate) listing: &'a dyn DirectoryListing,
    pub(crate) path: &'a GuestPath,
    pub(crate) operation: Operation,
}

impl<'a> Walk<'a> {
    /// [`Walk::open_dirs`] for operations that need the directory: a missing component is
    /// `NotFound`, naming it.
    pub(crate) fn open_existing_dirs(
        &self,
        depth: usize,
        create: bool,
    ) -> Result<HeldDir<'a>, Error> {
        match self.open_dirs(depth, create)? {
            Reached::Dir(held) => Ok(held),
            Reached::Missing(index) => Err(not_found(self.shown(index))),
        }
    }

    /// Opens the directory named by the first `depth` components, each relative to the last.
    ///
    /// A missing component is created (0700) when `create`, else reported as
    /// [`Reached::Missing`]. A link is [`ConfinementReason::Link`]; any other non-directory is
    /// `NotADirectory`.
    pub(crate) fn open_dirs(&self, depth: usize, create: bool) -> Result<Reached<'a>, Error> {
        let mut held = HeldDir::Root(self.root);
        for index in 0..depth {
            match self.enter(held.as_fd(), index, create)? {
                // Dropping the parent here closes it: only one descriptor is held at a time.
                Some(child) => held = HeldDir::Opened(child),
                None => return Ok(Reached::Missing(index)),
            }
        }
        Ok(Reached::Dir(held))
    }

    /// Steps into component `index` of the path, a directory inside `parent`.
    fn enter(
        &self,
        parent: BorrowedFd<'_>,
        index: usize,
        create: bool,
    ) -> Result<Option<OwnedFd>, Error> {
        match self.lstat_entry(parent, index)? {
            Some(stat) => match entry_kind(&stat) {
                EntryKind::Directory => {}
                EntryKind::Symlink => {
                    return Err(confinement(self.shown(index), ConfinementReason::Link))
                }
                EntryKind::File | EntryKind::Other => {
                    return Err(not_a_directory(self.shown(index)))
                }
            },
            None if !create => return Ok(None),
            None => match mkdirat(
                parent,
                self.name(index),
                Mode::from_raw_mode(PRIVATE_DIRECTORY),
            ) {
                Ok(()) => {}
                // Someone made it meanwhile; whatever it is, the no-follow open below judges it,
                // and it must not be an alias either.
                Err(Errno::EXIST) => self.check_listed(parent, index)?,
                Err(errno) => return Err(self.io(index, errno)),
            },
        }
        match self.open_child_dir(parent, index)? {
            Some(child) => Ok(Some(child)),
            None if create => Err(not_found(self.shown(index))),
            None => Ok(None),
        }
    }

    /// Opens component `index` as a directory without following it; `Ok(None)` when it vanished.
    pub(crate) fn open_child_dir(
        &self,
        parent: BorrowedFd<'_>,
        index: usize,
    ) -> Result<Option<OwnedFd>, Error> {
        match openat(parent, self.name(index), DIRECTORY_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            // ELOOP on Linux, EMLINK on the BSDs: the last component is a link.
            Err(Errno::LOOP | Errno::MLINK) => {
                Err(confinement(self.shown(index), ConfinementReason::Link))
            }
            Err(Errno::NOTDIR) => {
                // Swapped since the lstat: tell a link apart from anything else.
                let now_link = statat(parent, self.name(index), AtFlags::SYMLINK_NOFOLLOW)
                    .map(|stat| entry_kind(&stat) == EntryKind::Symlink)
                    .unwrap_or(false);
                if now_link {
                    Err(confinement(self.shown(index), ConfinementReason::Link))
                } else {
                    Err(not_a_directory(self.shown(index)))
                }
            }
            Err(Errno::NOENT) => Ok(None),
            Err(errno) => Err(self.io(index, errno)),
        }
    }

    /// No-follow lstat of component `index` inside `parent`, with the alias check.
    /// `Ok(None)` when it does not exist.
    pub(crate) fn lstat_entry(
        &self,
        parent: BorrowedFd<'_>,
        index: usize,
    ) -> Result<Option<Stat>, Error> {
        match statat(parent, self.name(index), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => {
                self.check_listed(parent, index)?;
                Ok(Some(stat))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::NOTDIR) => Err(not_a_directory(self.shown(index))),
            Err(errno) => Err(self.io(index, errno)),
        }
    }

    /// Refuses component `index` unless `parent` lists it verbatim.
    pub(crate) fn check_listed(&self, parent: BorrowedFd<'_>, index: usize) -> Result<(), Error> {
        match self.listing.lists_verbatim(parent, self.name(index)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(confinement(self.shown(index), ConfinementReason::Alias)),
            Err(source) => Err(io_error(self.operation, self.shown(index), source)),
        }
    }

    /// Component `index`.
    pub(crate) fn name(&self, index: usize) -> &'a std::ffi::OsStr {
        &self.path.parts()[index]
    }

    /// The path up to and including component `index`, for messages.
    pub(crate) fn shown(&self, index: usize) -> String {
        self.path.shown_prefix(index + 1)
    }

    /// An I/O error about component `index`.
    pub(crate) fn io(&self, index: usize, errno: Errno) -> Error {
        io_error(self.operation, self.shown(index), errno)
    }
}
