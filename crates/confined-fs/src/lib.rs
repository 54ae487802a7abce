//! Host-side file operations confined to a directory that a guest can also write.
//!
//! A sandbox's workspace is a directory on the host that the guest program writes too: it can
//! plant links, swap a directory for a link between two system calls, plant named pipes, and
//! create names that alias others on a case-folding file system. [`ConfinedRoot`] holds that
//! directory open and performs `lstat`, `read`, `write`, `make_dirs`, `list` and `remove` on
//! paths relative to it, such that no operation reads, writes, lists or removes anything
//! outside it, whatever the guest does meanwhile.
//!
//! ```
//! use confined_fs::{ConfinedRoot, ConfinementReason, EntryKind, Error};
//!
//! let workspace = tempfile::tempdir()?;
//! let root = ConfinedRoot::open(workspace.path())?;
//!
//! root.write("notes/today.txt", b"hello")?; // `notes` is created, private (0700)
//! assert_eq!(root.read("notes/today.txt", 1024)?, b"hello");
//! assert_eq!(root.lstat("notes")?.map(|s| s.kind), Some(EntryKind::Directory));
//!
//! // Too large for the caller's cap: refused whole, never truncated.
//! assert!(matches!(root.read("notes/today.txt", 4), Err(Error::TooLarge { cap: 4, .. })));
//!
//! // A link planted by the guest is never followed.
//! std::os::unix::fs::symlink("/etc", workspace.path().join("etc"))?;
//! assert!(matches!(
//!     root.read("etc/passwd", 1 << 20),
//!     Err(Error::Confinement { reason: ConfinementReason::Link, .. })
//! ));
//! // Nor can a path climb out.
//! assert!(matches!(root.list("notes/../.."), Err(Error::Confinement { reason: ConfinementReason::Escape, .. })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How
//!
//! - A path is normalised lexically first: `.` and empty segments dropped, `..` popping the
//!   previous component; a `..` with nothing to pop, an absolute path, a backslash or a NUL is
//!   [`Error::Confinement`] before any system call. With [`NameRules::Windows`], every
//!   component must also meet the Windows naming rules ([`windows_name_problem`]).
//! - The root is opened once with `O_DIRECTORY | O_NOFOLLOW`. Each component is then
//!   `lstat`ed (`AT_SYMLINK_NOFOLLOW`) and opened (`O_DIRECTORY | O_NOFOLLOW`) relative to the
//!   descriptor of its parent, so the kernel never resolves more than one name and never
//!   follows a link. A link among the components is [`Error::Confinement`] (even one that
//!   points inside the root); a file where a directory must be is [`Error::NotADirectory`].
//!   Missing directories are created with `mkdirat`, mode 0700, when writing.
//! - **Alias check**: a name that `lstat` resolves must appear verbatim in its directory's
//!   listing, else [`ConfinementReason::Alias`]. The listing is the [`DirectoryListing`] seam,
//!   [`KernelListing`] by default.
//! - `read` opens the leaf `O_NOFOLLOW | O_NONBLOCK` (a pipe cannot block the open), refuses
//!   anything but a regular file with one link after `fstat`, and refuses a file over the cap
//!   whole, reading at most one byte past it.
//! - `write` writes a fresh `O_EXCL | O_NOFOLLOW` temporary file (0600) beside the target and
//!   `renameat`s it over the target: what stood there (a file, a link) is replaced, never
//!   written through.
//! - `remove` unlinks relative to the held parent; a recursive remove descends through
//!   no-follow descriptors and unlinks links as links.
//!
//! Cap-std is deliberately not used for resolution: it resolves a multi-component path by
//! following links that stay inside the root, and a link anywhere in a path must be a refusal
//! here (a test pins this down).
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
//! - **Mounts**: a mount point inside the root (which a guest cannot create on the host) would
//!   be crossed like a directory.
//! - **Devices**: `read` refuses a device seen by `lstat` without opening it, but one swapped in
//!   between the `lstat` and the `open` is opened (without blocking) before `fstat` refuses it.
//! - **Windows hosts**: no Windows walk ships. The Windows naming rules and the reparse-point
//!   test ([`is_reparse_point`]) are pure functions for when one does.
//!
//! # Blocking and drop
//!
//! Every method is a short sequence of blocking system calls; there is no async API, so nothing
//! here can be cancelled half-way by dropping a future. Run the methods on a blocking pool from
//! async code. A [`ConfinedRoot`] holds one descriptor (the root) and closes it on drop; every
//! other descriptor lives only within one call. A write interrupted by a panic or a killed
//! process can leave a `.maf-sbx-<16 hex>.part` file beside its target, never a partial target.
//!
//! # Platforms
//!
//! Built for Unix (descriptor-relative calls through `rustix`); the walk, the property, race and
//! fuzz tests were run on Linux 6.18, x86-64, on ext4, and the benchmark also on tmpfs. The
//! alias check was exercised with a case-folding fake listing, since no case-folding file
//! system was available to test on. The Windows rules build and are unit-tested everywhere.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(not(any(unix, windows)))]
compile_error!("confined-fs confines paths on Unix and Windows hosts only");

mod alias_listing;
mod confined_root;
mod entries;
mod error;
mod host_metadata;
mod lexical_path;
mod no_follow_walk;
mod windows_rules;

pub use crate::alias_listing::{DirectoryHandle, DirectoryListing, KernelListing};
pub use crate::confined_root::{ConfinedRoot, RootOptions, MAX_REMOVE_DEPTH};
pub use crate::entries::{DirEntry, EntryKind, Stat};
pub use crate::error::{ConfinementReason, Error, Irregular, Operation};
pub use crate::lexical_path::NameRules;
pub use crate::windows_rules::{
    is_reparse_point, windows_device_name, windows_name_problem, WindowsNameProblem,
    FILE_ATTRIBUTE_REPARSE_POINT,
};
