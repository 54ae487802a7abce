//! The no-follow walk: each component is looked up relative to the held directory of its
//! parent with cap-std's no-follow calls, never by a path resolved from the root.

use std::ffi::OsStr;
use std::io;
use std::ops::Deref;
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::sync::Arc;

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, DirBuilder, Metadata};

use crate::alias_listing::{handle_of, DirectoryListing, HeldDirectory};
use crate::entries::EntryKind;
use crate::error::{
    confinement, io_error, not_a_directory, not_found, ConfinementReason, Error, Operation,
};
use crate::held_children::DirectoryFacts;
#[cfg(any(target_os = "linux", target_os = "android"))]
use crate::held_children::{HeldChild, HeldChildren};
use crate::host_metadata::{entry_kind, open_stopped_at_link};
use crate::lexical_path::GuestPath;

/// Directories the walk creates are private to the host user (Windows has no modes).
#[cfg(unix)]
const PRIVATE_DIRECTORY: u32 = 0o700;

/// How a missing directory is created: one level, private.
fn private_directory() -> DirBuilder {
    #[allow(unused_mut)]
    let mut builder = DirBuilder::new();
    #[cfg(unix)]
    cap_std::fs::DirBuilderExt::mode(&mut builder, PRIVATE_DIRECTORY);
    builder
}

/// A held directory: the root (borrowed from the [`ConfinedRoot`](crate::ConfinedRoot)), one
/// the walk opened, or (Linux) a directory of the root the root holds between operations.
#[derive(Debug)]
pub(crate) enum HeldDir<'a> {
    Root(&'a Dir),
    Opened(Dir),
    #[cfg(any(target_os = "linux", target_os = "android"))]
    Child(Arc<HeldChild>),
}

impl Deref for HeldDir<'_> {
    type Target = Dir;

    fn deref(&self) -> &Dir {
        match self {
            Self::Root(dir) => dir,
            Self::Opened(dir) => dir,
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Self::Child(child) => child.dir(),
        }
    }
}

/// What a no-follow directory open found.
pub(crate) enum OpenedDir {
    /// A real directory, now held.
    Dir(Dir),
    /// Something else stands there: a link (or any reparse point), a file, a pipe.
    NotADirectory(EntryKind),
    /// Nothing stands there.
    Missing,
}

/// Opens `name` inside `parent` as a directory without following it, and says what stood there
/// when it is not one. On Windows the opened handle's own attributes are checked, so a reparse
/// point of a kind cap-std would open (a cloud placeholder, a mount point) is never held.
pub(crate) fn open_dir_no_follow(
    parent: &Dir,
    name: &OsStr,
    listing: &dyn DirectoryListing,
) -> io::Result<OpenedDir> {
    let error = match parent.open_dir_nofollow(name) {
        Ok(dir) => {
            #[cfg(windows)]
            if crate::windows_rules::is_reparse_point(crate::host_metadata::attributes(
                &dir.dir_metadata()?,
            )) {
                return Ok(OpenedDir::NotADirectory(EntryKind::Symlink));
            }
            return Ok(OpenedDir::Dir(dir));
        }
        Err(error) => error,
    };
    listing.race_window(handle_of(parent), name);
    // The error does not say portably what stood there (ELOOP or ENOTDIR for a link on Linux,
    // EMLINK on the BSDs, a symlink error on Windows): look again, without following. Nothing
    // there any more is missing, whatever the open met.
    match parent.symlink_metadata(name) {
        Ok(metadata) => match entry_kind(&metadata) {
            // A directory again, but the open met a link (ELOOP on macOS, EMLINK on the BSDs;
            // Linux says ENOTDIR for a link too) or a file: swapped back meanwhile, and what the
            // open met is gone, so which of the two it was does not matter.
            EntryKind::Directory
                if open_stopped_at_link(&error) || error.kind() == io::ErrorKind::NotADirectory =>
            {
                Ok(OpenedDir::NotADirectory(EntryKind::Other))
            }
            EntryKind::Directory => Err(error),
            kind => Ok(OpenedDir::NotADirectory(kind)),
        },
        Err(again) if again.kind() == io::ErrorKind::NotFound => Ok(OpenedDir::Missing),
        Err(_) => Err(error),
    }
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
    pub(crate) root: &'a Dir,
    /// What is known of the root for the alias check, read once when it was opened.
    pub(crate) root_facts: &'a DirectoryFacts,
    /// The root's directories held between operations (Linux).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) children: &'a HeldChildren,
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
            match self.enter(&held, index, create)? {
                // Dropping the parent here closes it (unless the root holds it): only one
                // directory of the walk's own is held at a time.
                Some(child) => held = child,
                None => return Ok(Reached::Missing(index)),
            }
        }
        Ok(Reached::Dir(held))
    }

    /// Steps into component `index` of the path, a directory inside `parent`.
    ///
    /// A directory of the root is held by the root between operations (Linux): when the lstat
    /// just made finds, under the same name, the very directory held (the same device and inode,
    /// which cannot be reused while it is held open), that one is entered, as an open of the
    /// name at the moment of the lstat would have; else it is opened as any other and held in
    /// its place.
    fn enter(
        &self,
        parent: &HeldDir<'a>,
        index: usize,
        create: bool,
    ) -> Result<Option<HeldDir<'a>>, Error> {
        match self.lstat_entry(parent, index)? {
            Some(metadata) => match entry_kind(&metadata) {
                EntryKind::Directory =>
                {
                    #[cfg(any(target_os = "linux", target_os = "android"))]
                    if let HeldDir::Root(_) = parent {
                        if let Some(child) = self.children.find(self.name(index), &metadata) {
                            return Ok(Some(HeldDir::Child(child)));
                        }
                    }
                }
                EntryKind::Symlink => {
                    return Err(confinement(self.shown(index), ConfinementReason::Link))
                }
                EntryKind::File | EntryKind::Other => {
                    return Err(not_a_directory(self.shown(index)))
                }
            },
            None if !create => return Ok(None),
            None => {
                self.listing
                    .race_window(handle_of(parent), self.name(index));
                match parent.create_dir_with(self.name(index), &private_directory()) {
                    Ok(()) => {}
                    // Someone made it meanwhile; whatever it is, the no-follow open below judges
                    // it, and it must not be an alias either.
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                        self.check_listed(parent, index)?
                    }
                    Err(error) => return Err(self.io(index, error)),
                }
            }
        }
        // Gone again since: missing, which `open_existing_dirs` reports as not found.
        let Some(dir) = self.open_child_dir(parent, index)? else {
            return Ok(None);
        };
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let HeldDir::Root(_) = parent {
            return Ok(Some(self.children.hold(self.name(index), dir)));
        }
        Ok(Some(HeldDir::Opened(dir)))
    }

    /// Opens component `index` as a directory without following it; `Ok(None)` when it vanished.
    pub(crate) fn open_child_dir(&self, parent: &Dir, index: usize) -> Result<Option<Dir>, Error> {
        match open_dir_no_follow(parent, self.name(index), self.listing) {
            Ok(OpenedDir::Dir(dir)) => Ok(Some(dir)),
            Ok(OpenedDir::Missing) => Ok(None),
            // Swapped since the lstat: tell a link apart from anything else.
            Ok(OpenedDir::NotADirectory(EntryKind::Symlink)) => {
                Err(confinement(self.shown(index), ConfinementReason::Link))
            }
            Ok(OpenedDir::NotADirectory(_)) => Err(not_a_directory(self.shown(index))),
            Err(error) => Err(self.io(index, error)),
        }
    }

    /// No-follow lstat of component `index` inside `parent`, with the alias check.
    /// `Ok(None)` when it does not exist.
    pub(crate) fn lstat_entry(
        &self,
        parent: &HeldDir<'_>,
        index: usize,
    ) -> Result<Option<Metadata>, Error> {
        match parent.symlink_metadata(self.name(index)) {
            Ok(metadata) => {
                let held = self.held(parent);
                match self
                    .listing
                    .lists_found_verbatim(handle_of(parent), self.name(index), held)
                {
                    Ok(true) => Ok(Some(metadata)),
                    Ok(false) => Err(confinement(self.shown(index), ConfinementReason::Alias)),
                    Err(source) => Err(io_error(self.operation, self.shown(index), source)),
                }
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.io(index, error)),
        }
    }

    /// What the walk knows of `dir` for the alias check.
    fn held<'h>(&'h self, dir: &'h HeldDir<'_>) -> HeldDirectory<'h> {
        match dir {
            HeldDir::Root(_) => self.root_facts.held(),
            HeldDir::Opened(_) => HeldDirectory::default(),
            #[cfg(any(target_os = "linux", target_os = "android"))]
            HeldDir::Child(child) => child.facts().held(),
        }
    }

    /// Refuses component `index` unless `parent` lists it verbatim.
    pub(crate) fn check_listed(&self, parent: &Dir, index: usize) -> Result<(), Error> {
        match self
            .listing
            .lists_verbatim(handle_of(parent), self.name(index))
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(confinement(self.shown(index), ConfinementReason::Alias)),
            Err(source) => Err(io_error(self.operation, self.shown(index), source)),
        }
    }

    /// Component `index`.
    pub(crate) fn name(&self, index: usize) -> &'a OsStr {
        &self.path.parts()[index]
    }

    /// The path up to and including component `index`, for messages.
    pub(crate) fn shown(&self, index: usize) -> String {
        self.path.shown_prefix(index + 1)
    }

    /// An I/O error about component `index`.
    pub(crate) fn io(&self, index: usize, error: io::Error) -> Error {
        io_error(self.operation, self.shown(index), error)
    }
}
