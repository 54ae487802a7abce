//! What a [`ConfinedRoot`](crate::ConfinedRoot) keeps between operations, so that an operation
//! repeats no system call whose answer cannot have changed: facts about a directory it holds,
//! and (Linux) the directories of the root it entered last.
//!
//! A directory of the root is the one step every operation below it repeats: the sbx host
//! plane's root is the workspace generation, which holds the storage base (`work`) and every file operation walks it. Holding it
//! saves its open and close per operation, and its facts save the alias check's file system
//! query and the reopening of the directory to read its flags. What is held is never trusted by
//! name: every operation still makes the no-follow lstat of the name and the alias check, and
//! enters the held directory only when that lstat found exactly it (the same device and inode;
//! an inode number cannot be reused while a descriptor holds it). A guest that replaces the
//! directory between two operations (renames it away, puts another directory, a link or a file
//! in its place) is met as without the cache: the other directory is opened (and held instead),
//! the link refused, the file not a directory. One that replaces it during an operation, after
//! its lstat, leaves the operation in the directory that lstat found, wherever inside the root
//! the guest moved it: the race every walk has once it holds a directory.

#[cfg(any(target_os = "linux", target_os = "android"))]
use std::ffi::{OsStr, OsString};
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::os::fd::{AsFd, OwnedFd};
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::sync::{Arc, Mutex, PoisonError};

use cap_std::fs::Dir;
#[cfg(any(target_os = "linux", target_os = "android"))]
use cap_std::fs::Metadata;

#[cfg(any(target_os = "linux", target_os = "android"))]
use crate::alias_listing::exact_lookup;
use crate::alias_listing::HeldDirectory;
#[cfg(any(target_os = "linux", target_os = "android"))]
use crate::no_follow_walk::HeldDir;

/// Facts about a held directory that cannot change while it is held (Linux; none elsewhere):
/// the same directory opened for reading, whose flags each alias check reads afresh, and
/// whether its file system compares names byte for byte.
#[derive(Debug, Default)]
pub(crate) struct DirectoryFacts {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    readable: Option<OwnedFd>,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    byte_exact_file_system: Option<bool>,
}

impl DirectoryFacts {
    /// Reads the facts of `dir`, which the caller holds for as long as it keeps them.
    pub(crate) fn of(dir: &Dir) -> DirectoryFacts {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let handle = dir.as_fd();
            DirectoryFacts {
                readable: exact_lookup::open_readable(handle),
                byte_exact_file_system: Some(exact_lookup::byte_exact_file_system(handle)),
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = dir;
            DirectoryFacts::default()
        }
    }

    /// The facts as the alias check takes them.
    pub(crate) fn held(&self) -> HeldDirectory<'_> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            HeldDirectory {
                readable: self.readable.as_ref().map(AsFd::as_fd),
                byte_exact_file_system: self.byte_exact_file_system,
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            HeldDirectory::default()
        }
    }
}

/// How many directories of the root are held at most.
#[cfg(any(target_os = "linux", target_os = "android"))]
const HELD_CHILDREN: usize = 4;

/// A directory of the root, held between operations with its identity and facts.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[derive(Debug)]
pub(crate) struct HeldChild {
    name: OsString,
    dir: Dir,
    device: u64,
    inode: u64,
    facts: DirectoryFacts,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl HeldChild {
    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    pub(crate) fn facts(&self) -> &DirectoryFacts {
        &self.facts
    }
}

/// The directories of the root held between operations, the most recently entered last.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[derive(Debug, Default)]
pub(crate) struct HeldChildren(Mutex<Vec<Arc<HeldChild>>>);

#[cfg(any(target_os = "linux", target_os = "android"))]
impl HeldChildren {
    /// The directory held as `name` when `found`, the no-follow lstat of `name` in the root just
    /// made, describes exactly it.
    pub(crate) fn find(&self, name: &OsStr, found: &Metadata) -> Option<Arc<HeldChild>> {
        let (device, inode) = identity(found);
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter()
            .find(|child| child.name == name && child.device == device && child.inode == inode)
            .cloned()
    }

    /// Holds `dir`, just opened as `name` in the root, in place of whatever was held under that
    /// name (and of the one held longest when full), and gives it to the walk. A directory
    /// whose own metadata cannot be read is not held.
    pub(crate) fn hold<'a>(&self, name: &OsStr, dir: Dir) -> HeldDir<'a> {
        let Ok(own) = dir.dir_metadata() else {
            return HeldDir::Opened(dir);
        };
        let (device, inode) = identity(&own);
        let facts = DirectoryFacts::of(&dir);
        let child = Arc::new(HeldChild {
            name: name.to_owned(),
            dir,
            device,
            inode,
            facts,
        });
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|other| other.name != name);
        if held.len() >= HELD_CHILDREN {
            held.remove(0);
        }
        held.push(Arc::clone(&child));
        HeldDir::Child(child)
    }

    /// The names held, oldest first (for tests).
    #[cfg(test)]
    pub(crate) fn names(&self) -> Vec<OsString> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter().map(|child| child.name.clone()).collect()
    }

    /// The child held as `name` (for tests).
    #[cfg(test)]
    pub(crate) fn get(&self, name: &str) -> Option<Arc<HeldChild>> {
        let held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        held.iter().find(|child| child.name == name).cloned()
    }
}

/// The device and inode a metadata describes.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn identity(metadata: &Metadata) -> (u64, u64) {
    (
        cap_fs_ext::MetadataExt::dev(metadata),
        cap_fs_ext::MetadataExt::ino(metadata),
    )
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use std::os::unix::fs::symlink;
    use std::sync::Arc;

    use crate::{ConfinedRoot, ConfinementReason, Error};

    fn reason<T: std::fmt::Debug>(outcome: Result<T, Error>) -> ConfinementReason {
        match outcome {
            Err(Error::Confinement { reason, .. }) => reason,
            other => panic!("expected a confinement refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_held_directory_is_entered_again_only_while_its_name_finds_it() {
        let temp = tempfile::tempdir().unwrap();
        let host = |name: &str| temp.path().join(name);
        let root = ConfinedRoot::open(temp.path()).unwrap();
        assert!(root.root_facts.held().readable.is_some());

        root.write("work/a", b"1").unwrap();
        let first = root
            .children
            .get("work")
            .expect("held after the first walk");
        assert!(first.facts().held().readable.is_some());
        root.write("work/b", b"2").unwrap();
        assert_eq!(root.read("work/a", 10).unwrap(), b"1");
        assert!(
            Arc::ptr_eq(&first, &root.children.get("work").unwrap()),
            "the same directory under the same name is entered again, not reopened"
        );

        // Another directory put in its place between two operations: that one is entered and
        // held instead.
        std::fs::rename(host("work"), host("old")).unwrap();
        std::fs::create_dir(host("work")).unwrap();
        root.write("work/c", b"3").unwrap();
        assert_eq!(std::fs::read(host("work/c")).unwrap(), b"3");
        assert!(!host("old/c").exists());
        assert!(matches!(
            root.read("work/a", 10),
            Err(Error::NotFound { .. })
        ));
        let second = root.children.get("work").unwrap();
        assert!(!Arc::ptr_eq(&first, &second));

        // A link in its place, even to the directory held before: refused, never entered.
        std::fs::remove_dir_all(host("work")).unwrap();
        symlink("old", host("work")).unwrap();
        assert_eq!(reason(root.read("work/a", 10)), ConfinementReason::Link);
        assert_eq!(
            reason(root.write("work/a", b"through the link")),
            ConfinementReason::Link
        );
        assert_eq!(reason(root.list("work")), ConfinementReason::Link);
        assert_eq!(std::fs::read(host("old/a")).unwrap(), b"1");

        // A file in its place: not a directory.
        std::fs::remove_file(host("work")).unwrap();
        std::fs::write(host("work"), b"a file").unwrap();
        assert!(matches!(
            root.read("work/a", 10),
            Err(Error::NotADirectory { .. })
        ));

        // The first directory back under its name: entered again (held anew).
        std::fs::remove_file(host("work")).unwrap();
        std::fs::rename(host("old"), host("work")).unwrap();
        assert_eq!(root.read("work/a", 10).unwrap(), b"1");

        // At most four are held, the one held longest dropped first.
        for name in ["a", "b", "c", "d"] {
            root.make_dirs(format!("{name}/x")).unwrap();
        }
        assert_eq!(root.children.names(), ["a", "b", "c", "d"]);
        root.read("work/a", 10).unwrap();
        assert_eq!(root.children.names(), ["b", "c", "d", "work"]);
    }
}
