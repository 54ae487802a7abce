//! Host-side file operations confined to a directory that a guest can also write.
//!
//! A sandbox's workspace is a directory on the host that the guest program writes too: it can
//! plant links, swap a directory for a link between two system calls, plant named pipes, and
//! create names that alias others on a case-folding file system. [`ConfinedRoot`] holds that
//! directory open and performs `lstat`, `read`, `write`, `make_dirs`, `list` and `remove` on
//! paths relative to it, such that no operation reads, writes, lists or removes anything
//! outside it, whatever the guest does meanwhile. It runs on Linux, macOS and Windows hosts.
//!
//! ```
//! use confined_fs::{ConfinedRoot, ConfinementReason, EntryKind, Error};
//!
//! let workspace = tempfile::tempdir()?;
//! let root = ConfinedRoot::open(workspace.path())?;
//!
//! root.write("notes/today.txt", b"hello")?; // `notes` is created, private (0700 on Unix)
//! assert_eq!(root.read("notes/today.txt", 1024)?, b"hello");
//! assert_eq!(root.lstat("notes")?.map(|s| s.kind), Some(EntryKind::Directory));
//!
//! // Too large for the caller's cap: refused whole, never truncated.
//! assert!(matches!(root.read("notes/today.txt", 4), Err(Error::TooLarge { cap: 4, .. })));
//!
//! // A link planted by the guest is never followed.
//! #[cfg(unix)]
//! {
//!     std::os::unix::fs::symlink("/etc", workspace.path().join("etc"))?;
//!     assert!(matches!(
//!         root.read("etc/passwd", 1 << 20),
//!         Err(Error::Confinement { reason: ConfinementReason::Link, .. })
//!     ));
//! }
//! // Nor can a path climb out.
//! assert!(matches!(root.list("notes/../.."), Err(Error::Confinement { reason: ConfinementReason::Escape, .. })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How
//!
//! - A path is normalised lexically first: `.` and empty segments dropped, `..` popping the
//!   previous component; a `..` with nothing to pop, an absolute path, a backslash or a NUL is
//!   [`Error::Confinement`] before any system call. With [`NameRules::Windows`], and always on
//!   a Windows host, every component must also meet the Windows naming rules
//!   ([`windows_name_problem`]: reserved characters, device names, a trailing dot or space).
//! - The root is a cap-std [`Dir`](cap_std::fs::Dir): the directory above it is opened with
//!   the host's own resolution (the host's ancestors are trusted), the root itself with cap-std's
//!   no-follow directory open, so a root that is a link is refused.
//! - **The walk** opens one component at a time, relative to the held `Dir` of its parent: a
//!   no-follow `symlink_metadata` of the single name, the alias check, then
//!   `cap_fs_ext::DirExt::open_dir_nofollow` of the single name. No call is ever given more
//!   than one component, so cap-std never resolves a link anywhere: its in-root link following
//!   happens only for multi-component paths, which this crate never passes. A link among the
//!   components is [`Error::Confinement`] (even one that points inside the root); a file where
//!   a directory must be is [`Error::NotADirectory`]. Missing directories are created one level
//!   at a time (`create_dir_with`, mode 0700 on Unix) when writing.
//! - **Alias check**: a name whose metadata resolves must appear verbatim in its directory's
//!   listing, else [`ConfinementReason::Alias`]. This is what refuses `README` asked as
//!   `readme` on a case-insensitive volume (APFS, NTFS), `é` asked decomposed when stored
//!   composed (APFS), and `PROGRA~1` (an NTFS 8.3 short name). The listing is the
//!   [`DirectoryListing`] seam, [`KernelListing`] (cap-std's directory entries) by default.
//!   On Linux, where ext4, tmpfs, btrfs and overlayfs compare names byte for byte in any
//!   directory without the case-folding flag, [`KernelListing`] answers there with one no-follow
//!   lookup of the name instead of reading the directory, so an operation costs the same in a
//!   directory of ten entries as in one of a hundred thousand. After the walk's own lstat found
//!   the name, that lookup is the lstat itself
//!   ([`DirectoryListing::lists_found_verbatim`]); the flag is read afresh at every check, from
//!   a descriptor the root holds open for reading when the directory is the root or one it
//!   holds ([`HeldDirectory`]), and the file system's kind is read once per held directory.
//! - **Held directories** (Linux): the root keeps up to four of its directories that operations
//!   entered (the sbx host plane's storage base, which every operation walks), and enters one
//!   again, instead of opening it, only when the operation's own no-follow lstat and alias check
//!   of its name found exactly that directory (device and inode; an inode number is not reused
//!   while a descriptor holds it). A directory replaced between operations is met as without
//!   it (another directory opened and held, a link refused, a file not a directory); one
//!   replaced after the lstat leaves the operation in the directory the lstat found, wherever in
//!   the root the guest moved it, the race any held directory has.
//! - `read` opens the leaf with cap-std's no-follow, nonblocking open (a pipe cannot block the
//!   open), refuses anything but a regular file with one link from the open file's metadata,
//!   and refuses a file over the cap whole, reading at most one byte past it.
//! - `write` writes a fresh exclusive, no-follow temporary file (0600 on Unix) beside the
//!   target and renames it over the target: what stood there (a file, a link) is replaced,
//!   never written through. `write_unless_link` refuses a link found there instead, from the
//!   same lstat.
//! - `remove` removes the name relative to the held parent (`remove_file_or_symlink`, which
//!   also removes a Windows directory link as a link); a recursive remove descends through
//!   no-follow opens and removes links as links.
//!
//! ## Platform differences
//!
//! - **Linux**: cap-std resolves each single name with `openat2(RESOLVE_BENEATH)` and
//!   `O_NOFOLLOW`, and stats it with `AT_SYMLINK_NOFOLLOW`; every call is relative to a held
//!   descriptor. No alias can arise on the usual file systems (case-folding ext4 directories
//!   would be caught by the alias check).
//! - **macOS**: the same descriptor-relative calls (`openat` with `O_NOFOLLOW`). APFS is
//!   normally case-insensitive and normalisation-insensitive but preserving: a name that
//!   resolves under another case or normalisation is an alias and refused. On HFS+, which
//!   stores names decomposed, a composed name this crate wrote is refused on the next lookup
//!   (it is listed decomposed): use decomposed names there.
//! - **Windows**: every entry is judged by its attribute word: a reparse point of any kind
//!   (symbolic link, junction, mount point, cloud placeholder) is a link (pure decision:
//!   [`is_reparse_point`]), never traversed or read, and every directory handle the walk opens
//!   is checked again for the attribute, so a reparse point swapped in after the metadata is
//!   still refused. Lookups and opens are relative to the held handle (`NtCreateFile`), and
//!   opens never follow a reparse point. The Windows naming rules always apply.
//! - **Where rustix is used** (Unix only): to read the errno of a failed no-follow open
//!   (`ELOOP`, `EMLINK`), which std cannot name on stable, and on Linux for the alias check's
//!   file system type, case-folding flag and single-name lookup. Everything else goes through
//!   cap-std and cap-fs-ext.
//!
//! # Threat model
//!
//! The guest is hostile and concurrent: it may create, remove, rename and swap any entry under
//! the root at any moment, including between two system calls of one operation. The host
//! process is trusted, as are the root's own ancestors (the guest cannot reach above the root).
//! The guarantee: an operation only ever touches entries that are, at the moment each system
//! call runs, inside the root; a race yields a typed refusal ([`Error::is_refusal`]) or an
//! operation on whatever the guest left inside the root, never an effect outside it.
//!
//! # What it does not defend against
//!
//! - **Hard links** planted by the guest: they can only name files the guest can already reach,
//!   so they do not widen its reach. `read` refuses a file with more than one link
//!   ([`Irregular::HardLinked`]) as the reference host plane does; `write` replaces the name, so
//!   a hard link elsewhere keeps the old content. A hard link to a host file cannot be made by
//!   a guest that cannot name the file, and one made by someone else is out of scope.
//! - **Content races**: once a file is open, the guest may change its content while it is read
//!   (the cap still holds), or change a file after it was written.
//! - **Which inode a name denotes**: the guest may move or swap entries inside the root, so an
//!   operation may act on another entry than the caller meant, always inside the root.
//! - **Resource exhaustion**: huge directories, deep trees (a recursive remove stops at
//!   [`MAX_REMOVE_DEPTH`]), a full disk, or exhausted descriptors give [`Error::Io`]; reads are
//!   bounded only by the caller's cap.
//! - **Mounts**: on Unix a mount point inside the root (which a guest cannot create on the
//!   host) would be crossed like a directory. On Windows it is a reparse point and refused.
//! - **Devices**: `read` refuses a device seen by the metadata without opening it, but one
//!   swapped in between the metadata and the open is opened (without blocking) before the open
//!   file's metadata refuses it.
//! - **No exact-case open (Windows, macOS)**: neither host can open a name case-sensitively
//!   (nor, on APFS, normalisation-sensitively). The alias check is a separate listing, so a
//!   guest that renames `readme` to `README` between the check and the open makes the
//!   operation act on `README`: the same entry under another spelling, inside the root.
//! - **Windows residual**: cap-std performs directory listings, creations, renames and
//!   removals on Windows through the held directory's final path (`GetFinalPathNameByHandle`
//!   joined with the name), not through the handle. It holds every directory it opens without
//!   `FILE_SHARE_DELETE`, so the held directory cannot be renamed or removed meanwhile, and
//!   NTFS refuses to rename a directory with open handles beneath it; on a file system that
//!   allowed that rename (some network redirectors), a guest racing an ancestor's rename could
//!   retarget one of these calls. A listing so retargeted only answers the alias check wrongly.
//!   The lookups and opens, which decide what is read or traversed, are handle-relative.
//!   Removing a cloud placeholder directory fails with [`Error::Io`] (it is a reparse point,
//!   removed as a name, which Windows refuses for a directory that is not a link).
//!
//! # Blocking and drop
//!
//! Every method is a short sequence of blocking system calls; there is no async API, so nothing
//! here can be cancelled half-way by dropping a future. Run the methods on a blocking pool from
//! async code. A [`ConfinedRoot`] holds the root (and, on Linux, the root opened for reading
//! and up to four held directories of the root, each with its own readable descriptor) and
//! closes them on drop; every other handle lives only within one call. A write interrupted by a panic or a killed
//! process can leave a `.maf-sbx-<16 hex>.part` file beside its target, never a partial target.
//!
//! # Platforms
//!
//! Built for Unix and Windows on cap-std. The walk, the property, race and fuzz tests were run
//! on Linux 6.18, x86-64, on ext4, and the benchmark also on tmpfs. The race tests need no
//! timing luck: a test's [`DirectoryListing`] acts as the guest right after each alias check
//! and in each other window between two system calls ([`DirectoryListing::race_window`]). The macOS and Windows paths
//! were not run here: the Windows naming and reparse decisions are pure functions unit-tested
//! on every platform, and the alias check was exercised with a case-folding fake listing,
//! since no case-folding file system was available to test on.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(not(any(unix, windows)))]
compile_error!("confined-fs confines paths on Unix and Windows hosts only");

mod alias_listing;
mod confined_root;
mod entries;
mod error;
mod held_children;
mod host_metadata;
mod lexical_path;
mod no_follow_walk;
mod windows_rules;

pub use crate::alias_listing::{DirectoryHandle, DirectoryListing, HeldDirectory, KernelListing};
pub use crate::confined_root::{ConfinedRoot, RootOptions, MAX_REMOVE_DEPTH};
pub use crate::entries::{DirEntry, EntryKind, Stat};
pub use crate::error::{ConfinementReason, Error, Irregular, Operation};
pub use crate::lexical_path::NameRules;
pub use crate::windows_rules::{
    is_reparse_point, windows_device_name, windows_name_problem, WindowsNameProblem,
    FILE_ATTRIBUTE_REPARSE_POINT,
};

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
