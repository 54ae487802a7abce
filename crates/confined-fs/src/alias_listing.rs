//! The alias check's seam: does a directory list a name verbatim?
//!
//! On a case-insensitive or normalising file system, `README` may resolve to a file stored as
//! `readme`, `é` spelled decomposed may resolve to one stored composed, and an 8.3 short name
//! resolves to a long one. A name that resolves but is not listed verbatim is such an alias and
//! is refused. Linux offers no such file system to test on here, so the listing is a trait a
//! test can replace with a case-folding fake.
//!
//! Reading the whole directory per lookup would make every operation cost as much as the
//! directory is large. On Linux, [`KernelListing`] first asks whether the directory's lookups
//! are byte-exact (see [`exact_lookup`]); there a name is listed verbatim exactly when a
//! no-follow `fstatat` of it finds an entry, which is one system call whatever the directory
//! holds. Anywhere else (another file system, a case-folding directory, an answer it cannot get)
//! it reads the listing. The race is the one the listing has: a guest may rename between the
//! check and the operation that follows it, whichever way the check was answered.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;

use cap_std::fs::Dir;
use cap_std::io_lifetimes::AsFilelike;

/// A borrowed handle of an open directory: a descriptor on Unix, a handle on Windows.
#[cfg(unix)]
pub type DirectoryHandle<'a> = std::os::fd::BorrowedFd<'a>;

/// A borrowed handle of an open directory: a descriptor on Unix, a handle on Windows.
#[cfg(windows)]
pub type DirectoryHandle<'a> = std::os::windows::io::BorrowedHandle<'a>;

/// The handle of `dir`, for the listing seam.
pub(crate) fn handle_of(dir: &Dir) -> DirectoryHandle<'_> {
    #[cfg(unix)]
    return std::os::fd::AsFd::as_fd(dir);
    #[cfg(windows)]
    return std::os::windows::io::AsHandle::as_handle(dir);
}

/// What the walk already knows of a directory it holds, beyond its handle, for
/// [`DirectoryListing::lists_found_verbatim`]. Each fact is about the held directory itself and
/// cannot go stale while it is held; a listing may ignore them.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeldDirectory<'a> {
    /// The same directory opened for reading. The walk holds directories as path-only
    /// descriptors on Linux, which cannot be asked for flags; this one can, without opening `.`
    /// again.
    pub readable: Option<DirectoryHandle<'a>>,
    /// Whether the directory's file system compares names byte for byte, read once for the
    /// held handle: the file system an open directory is on never changes.
    pub byte_exact_file_system: Option<bool>,
}

/// Answers whether a directory lists a name verbatim.
///
/// Called after every successful no-follow lstat of a component, with the directory the
/// component was looked up in. An error fails the operation with [`Error::Io`](crate::Error::Io).
pub trait DirectoryListing: Send + Sync + fmt::Debug {
    /// Whether `name` appears verbatim (byte for byte on Unix, code unit for code unit on
    /// Windows) among the entries of `dir`.
    fn lists_verbatim(&self, dir: DirectoryHandle<'_>, name: &OsStr) -> io::Result<bool>;

    /// As [`DirectoryListing::lists_verbatim`], for a name that a no-follow lstat in `dir` has
    /// just found, with what the walk knows of `dir` (`held`). The default asks
    /// [`DirectoryListing::lists_verbatim`]; [`KernelListing`] uses both facts to skip a second
    /// lookup, the reopening of the directory and the file system query.
    fn lists_found_verbatim(
        &self,
        dir: DirectoryHandle<'_>,
        name: &OsStr,
        held: HeldDirectory<'_>,
    ) -> io::Result<bool> {
        let _ = held;
        self.lists_verbatim(dir, name)
    }

    /// Called in each window between two system calls on the entry `name` of `dir` that no
    /// alias check already separates: in a listing or a recursive remove, after the names
    /// were read, before each one's lstat; in a recursive remove, also after that lstat,
    /// before the entry is removed or entered; after a no-follow directory open failed,
    /// before the look at what stood there; and after a lookup found nothing, before the
    /// directory is created. Those are the windows a racing guest aims for. There is
    /// nothing to check in them and the default does nothing; a test's listing can act as
    /// that racing guest here.
    fn race_window(&self, _dir: DirectoryHandle<'_>, _name: &OsStr) {}
}

/// The listing the host gives (cap-std's directory entries), stopping at the first match.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelListing;

impl KernelListing {
    /// Every name in `dir` except `.` and `..`, in the order the host gives them.
    pub fn names(dir: DirectoryHandle<'_>) -> io::Result<Vec<OsString>> {
        names_of(&dir.as_filelike_view::<Dir>())
    }
}

impl DirectoryListing for KernelListing {
    fn lists_verbatim(&self, dir: DirectoryHandle<'_>, name: &OsStr) -> io::Result<bool> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(listed) = exact_lookup::lists_verbatim(dir, name) {
            return Ok(listed);
        }
        listing_holds(dir, name)
    }

    fn lists_found_verbatim(
        &self,
        dir: DirectoryHandle<'_>,
        name: &OsStr,
        held: HeldDirectory<'_>,
    ) -> io::Result<bool> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(listed) = exact_lookup::lists_found_verbatim(dir, name, held) {
            return Ok(listed);
        }
        let _ = held;
        listing_holds(dir, name)
    }
}

/// Reads the listing of `dir` until `name` turns up.
fn listing_holds(dir: DirectoryHandle<'_>, name: &OsStr) -> io::Result<bool> {
    for entry in dir.as_filelike_view::<Dir>().entries()? {
        if entry?.file_name() == name {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every name in `dir` (cap-std never yields `.` or `..`).
pub(crate) fn names_of(dir: &Dir) -> io::Result<Vec<OsString>> {
    dir.entries()?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect()
}

/// The byte-exact lookup: on a file system whose lookups compare names byte for byte, in a
/// directory without the case-folding flag, a name is listed verbatim exactly when it is found.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) mod exact_lookup {
    use std::ffi::OsStr;
    use std::os::fd::{BorrowedFd, OwnedFd};

    use rustix::fs::{fstatfs, ioctl_getflags, openat, statat, AtFlags, Mode, OFlags};
    use rustix::io::Errno;

    use super::HeldDirectory;

    /// ext2/3/4 (case-folding per directory, with the flag), tmpfs (likewise since Linux 6.13),
    /// btrfs (never case-folding) and overlayfs (passes its layers' flags through). Not XFS (its
    /// ASCII case-insensitive format leaves no per-directory flag), nor any other: FAT, exFAT,
    /// NTFS, SMB, HFS+ and FUSE file systems may fold case or normalise.
    const BYTE_EXACT_FILE_SYSTEMS: [i64; 4] = [0xEF53, 0x0102_1994, 0x9123_683E, 0x794C_7630];

    /// `FS_CASEFOLD_FL`: the directory's lookups fold case.
    const CASEFOLD_FLAG: u32 = 0x4000_0000;

    /// Whether `dir` lists `name` verbatim, or `None` when only its listing can tell.
    ///
    /// The flag is read before the lookup: a directory's case folding can only be switched while
    /// it is empty, so a name found after the flag read "byte-exact" was stored as spelled
    /// unless the guest emptied, flagged and refilled the directory in between, which is the
    /// race any check before an operation has (a rename after it).
    pub(crate) fn lists_verbatim(dir: BorrowedFd<'_>, name: &OsStr) -> Option<bool> {
        if never_listed(name) {
            return Some(false);
        }
        if !is_byte_exact(dir, HeldDirectory::default()) {
            return None;
        }
        match statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Some(true),
            Err(Errno::NOENT) => Some(false),
            // Anything else (a name too long, no permission): the listing answers.
            Err(_) => None,
        }
    }

    /// As [`lists_verbatim`], for a name a no-follow lstat in `dir` has just found: on a
    /// byte-exact directory that lookup already answered, so none is made again. The flags are
    /// read now, from `held.readable` when the walk holds one; the file system's kind is taken
    /// from `held` when known.
    pub(crate) fn lists_found_verbatim(
        dir: BorrowedFd<'_>,
        name: &OsStr,
        held: HeldDirectory<'_>,
    ) -> Option<bool> {
        if never_listed(name) {
            return Some(false);
        }
        is_byte_exact(dir, held).then_some(true)
    }

    /// No listing holds these; a lookup would resolve them (or a path), so they are answered
    /// without one.
    fn never_listed(name: &OsStr) -> bool {
        let bytes = name.as_encoded_bytes();
        bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/')
    }

    /// Whether the file system `dir` is on compares names byte for byte.
    pub(crate) fn byte_exact_file_system(dir: BorrowedFd<'_>) -> bool {
        let Ok(statfs) = fstatfs(dir) else {
            return false;
        };
        // `f_type` is a C long on most targets, an unsigned word on a few.
        #[allow(clippy::unnecessary_cast)]
        let kind = statfs.f_type as i64;
        BYTE_EXACT_FILE_SYSTEMS.contains(&kind)
    }

    /// `dir` itself opened for reading, so its flags can be read. `.` is the directory itself:
    /// the kernel follows no link to reach it, and fails a handle that is not a directory
    /// (`ENOTDIR`), so `O_NOFOLLOW` and `O_DIRECTORY` could change nothing here. Close-on-exec
    /// matters: a root holds the descriptor for as long as it lives, and a host that starts a
    /// program must not hand it a handle inside the workspace.
    pub(crate) fn open_readable(dir: BorrowedFd<'_>) -> Option<OwnedFd> {
        // Read-only is the access mode without a flag (`O_RDONLY` is 0).
        openat(dir, ".", OFlags::CLOEXEC, Mode::empty()).ok()
    }

    /// The directory's file system compares names byte for byte and the directory does not
    /// fold case.
    fn is_byte_exact(dir: BorrowedFd<'_>, held: HeldDirectory<'_>) -> bool {
        let file_system = held
            .byte_exact_file_system
            .unwrap_or_else(|| byte_exact_file_system(dir));
        if !file_system {
            return false;
        }
        // The walk holds its directories as path-only descriptors, which cannot be asked for
        // flags: the directory itself is opened for that, unless the walk holds it readable
        // already. A file system that cannot report the flags (a kernel from before its case
        // folding) is left to the listing too: slower, never wrong.
        let flags = match held.readable {
            Some(readable) => ioctl_getflags(readable),
            None => match open_readable(dir) {
                Some(readable) => ioctl_getflags(&readable),
                None => return false,
            },
        };
        flags.is_ok_and(|flags| flags.bits() & CASEFOLD_FLAG == 0)
    }

    #[cfg(test)]
    mod tests {
        use std::os::fd::AsFd;

        use super::*;

        #[test]
        fn names_no_listing_holds_are_never_listed() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("sub")).unwrap();
            std::fs::write(dir.path().join("sub/f"), b"").unwrap();
            let handle = std::fs::File::open(dir.path()).unwrap();
            for name in ["", ".", "..", "sub/f", "sub/", "/"] {
                assert_eq!(
                    lists_verbatim(handle.as_fd(), name.as_ref()),
                    Some(false),
                    "{name:?}"
                );
            }
        }

        /// A file system off the list (proc here; FAT, SMB or a FUSE mount on another host) is
        /// never taken as byte-exact: its lookups might fold case or normalise, so only the
        /// listing answers there, whatever a lookup would find.
        #[test]
        fn a_file_system_off_the_list_is_left_to_the_listing() {
            let proc = rustix::fs::open(
                "/proc",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            assert!(!byte_exact_file_system(proc.as_fd()));
            assert!(!is_byte_exact(proc.as_fd(), HeldDirectory::default()));
            assert_eq!(lists_verbatim(proc.as_fd(), "self".as_ref()), None);
            assert_eq!(
                lists_found_verbatim(proc.as_fd(), "self".as_ref(), HeldDirectory::default()),
                None
            );
            // tmpfs, on the list, for contrast: the same question is answered by the lookup.
            let shm = rustix::fs::open(
                "/dev/shm",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            assert!(byte_exact_file_system(shm.as_fd()));
        }

        /// `.` of a handle that is not a directory opens nothing, whatever the flags: the
        /// kernel refuses to start a lookup there.
        #[test]
        fn only_a_directory_opens_readable() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), b"").unwrap();
            let file = std::fs::File::open(dir.path().join("f")).unwrap();
            assert!(open_readable(file.as_fd()).is_none());
            let path_only = rustix::fs::open(
                dir.path().join("f"),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            assert!(open_readable(path_only.as_fd()).is_none());
            let directory = std::fs::File::open(dir.path()).unwrap();
            let readable = open_readable(directory.as_fd()).unwrap();
            let (opened, held) = (
                rustix::fs::fstat(&readable).unwrap(),
                rustix::fs::fstat(&directory).unwrap(),
            );
            assert_eq!((opened.st_dev, opened.st_ino), (held.st_dev, held.st_ino));
        }

        #[test]
        fn a_byte_exact_directory_answers_by_lookup() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("Readme"), b"").unwrap();
            std::os::unix::fs::symlink("nowhere", dir.path().join("dangling")).unwrap();
            // Opened as the walk holds its directories: path-only.
            let handle = rustix::fs::open(
                dir.path(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            #[allow(clippy::unnecessary_cast)]
            let kind = fstatfs(handle.as_fd()).unwrap().f_type as i64;
            if !BYTE_EXACT_FILE_SYSTEMS.contains(&kind) {
                // A temporary directory on a file system the lookup does not trust: the listing
                // answers there, which the other tests cover.
                assert!(!is_byte_exact(handle.as_fd(), HeldDirectory::default()));
                assert_eq!(lists_verbatim(handle.as_fd(), "Readme".as_ref()), None);
                return;
            }
            // A fresh temporary directory does not fold case.
            assert!(is_byte_exact(handle.as_fd(), HeldDirectory::default()));
            assert_eq!(
                lists_verbatim(handle.as_fd(), "Readme".as_ref()),
                Some(true)
            );
            // A link is found without being followed, even one that leads nowhere.
            assert_eq!(
                lists_verbatim(handle.as_fd(), "dangling".as_ref()),
                Some(true)
            );
            assert_eq!(
                lists_verbatim(handle.as_fd(), "readme".as_ref()),
                Some(false)
            );
            assert_eq!(
                lists_verbatim(handle.as_fd(), "absent".as_ref()),
                Some(false)
            );

            // A name the walk's own lstat found: answered from the flags alone, read from the
            // readable handle when the walk holds one, and the file system's kind as held.
            let readable = open_readable(handle.as_fd()).unwrap();
            let held = HeldDirectory {
                readable: Some(readable.as_fd()),
                byte_exact_file_system: Some(true),
            };
            for held in [HeldDirectory::default(), held] {
                assert_eq!(
                    lists_found_verbatim(handle.as_fd(), "Readme".as_ref(), held),
                    Some(true)
                );
                for name in ["", ".", "..", "sub/f"] {
                    assert_eq!(
                        lists_found_verbatim(handle.as_fd(), name.as_ref(), held),
                        Some(false),
                        "{name:?}"
                    );
                }
            }
            // A file system held as not byte-exact: only the listing can answer.
            let elsewhere = HeldDirectory {
                readable: Some(readable.as_fd()),
                byte_exact_file_system: Some(false),
            };
            assert_eq!(
                lists_found_verbatim(handle.as_fd(), "Readme".as_ref(), elsewhere),
                None
            );
            // A readable handle whose flags cannot be read (a device, not a directory of a file
            // system with flags): the listing answers too.
            let null = std::fs::File::open("/dev/null").unwrap();
            let unreadable = HeldDirectory {
                readable: Some(null.as_fd()),
                byte_exact_file_system: Some(true),
            };
            assert_eq!(
                lists_found_verbatim(handle.as_fd(), "Readme".as_ref(), unreadable),
                None
            );
        }
    }
}
