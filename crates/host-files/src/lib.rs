//! The one guarded opener for host files that a host reads for a sandbox (`cp-in`, an env file, and
//! anything later) or writes with a sandbox's bytes (`cp-out`), judged by what was actually opened.
//!
//! Threat model: the guest is hostile and the caller choosing host paths (a model picking tool
//! arguments) can be talked into anything by guest output; the operator who configures the
//! [`HostPathGuard`] is trusted. Every read goes through [`Source::open`] and every write through
//! [`Destination::open`]; both ask one [`HostPathGuard`] (the pure rules of
//! [`sandbox_core::host_paths`]) built by [`host_guard`] from this process's homes and the configured
//! backends' own host state roots ([`sandbox_core::SandboxBackend::host_state_roots`]), so the guarded
//! set cannot drift from where the backends really keep their state.
//!
//! Every check runs on an open descriptor, never on a path string checked earlier and opened again later:
//! a source is opened first (the kernel never follows a link in its last component; links there are
//! followed one hop at a time, each hop opened without following), then judged by the real path of the
//! open descriptor, its kind and its file system; a destination's directory is reached by opening the
//! output root and then each directory below it relative to the last, never following a link, and the
//! file is created and renamed relative to that descriptor. Swapping a directory for a link between the
//! check and the read therefore changes nothing: the check is about the file that is read, and a write
//! never passes a link at all. Each listed path is also resolved where it really lives, so a `~/.bashrc` linked
//! into a dotfiles directory guards its target.
//!
//! What is written: a plain new file below the output root (a guard without one writes nothing), with no
//! hidden name (one starting with `.`) anywhere on its path and no link on the way or at it; an existing
//! file only when the caller says [`ExistingFile::Replace`]. Behind that the lists still refuse a
//! destination that is, contains or lies under a path a host executes or loads on its own.
//!
//! What is refused: a source or destination that is, contains or lies under a credential path
//! (`allow_credential_path` lifts this one refusal, which for a destination the hidden-name rule
//! covers too) or a backend's host state (another sandbox's workspace and record); a destination
//! the rules above do not admit; a source that is not a regular file, a source on a pseudo file system (procfs,
//! sysfs, devtmpfs, debugfs, securityfs, cgroup, ... on Linux), and more bytes than the caller's cap (at
//! most cap + 1 bytes are ever read). Errors name the path and the rule, never a byte of content.
//!
//! Not defended: a hard link to a guarded file made elsewhere by the caller (it has no guarded path),
//! credentials kept outside the listed paths, and files a host runs from plain names below the output
//! root (a project's own build scripts, a `Makefile`): choose an output root that holds none. Unix
//! hosts only.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;
use sandbox_core::credential_paths::CredentialGuard;
use sandbox_core::host_paths::{touches, ListedKind};
pub use sandbox_core::host_paths::{HostPathGuard, HostRefusal};
use sandbox_core::{Sandbox, SandboxError};

/// The largest `--env-file` read.
pub const MAX_ENV_FILE_BYTES: u64 = 1024 * 1024;

/// The largest password database read to find the home directories a root caller guards.
const MAX_PASSWD_BYTES: u64 = 4 * 1024 * 1024;

// The open flags of each kind of open, named so each is read (and mutation-tested) in one
// place (`|` on the bits: the flags' own `|` is not `const`). The flags are distinct bits, so `|`
// and `^` build the same set (`O_RDONLY` is zero).

/// A destination's root directory, opened to write below it.
const ROOT_DIRECTORY_FLAGS: OFlags = OFlags::from_bits_retain(
    OFlags::RDONLY.bits() | OFlags::DIRECTORY.bits() | OFlags::CLOEXEC.bits(),
);
/// The temporary file a copy is written to: new, never through a link.
const TEMPORARY_FILE_FLAGS: OFlags = OFlags::from_bits_retain(
    OFlags::WRONLY.bits()
        | OFlags::CREATE.bits()
        | OFlags::EXCL.bits()
        | OFlags::NOFOLLOW.bits()
        | OFlags::CLOEXEC.bits(),
);
/// A directory below a destination's root, never through a link.
const DIRECTORY_BELOW_FLAGS: OFlags = OFlags::from_bits_retain(
    OFlags::RDONLY.bits()
        | OFlags::DIRECTORY.bits()
        | OFlags::NOFOLLOW.bits()
        | OFlags::CLOEXEC.bits(),
);
/// A file [`read_regular_capped`] reads: a fifo cannot block the open, a terminal never
/// becomes ours.
const CAPPED_READ_FLAGS: OFlags = OFlags::from_bits_retain(
    OFlags::RDONLY.bits()
        | OFlags::NONBLOCK.bits()
        | OFlags::NOCTTY.bits()
        | OFlags::CLOEXEC.bits(),
);
/// A file opened one link hop at a time (`open_without_following`).
const UNFOLLOWED_READ_FLAGS: OFlags = OFlags::from_bits_retain(
    OFlags::RDONLY.bits()
        | OFlags::NOFOLLOW.bits()
        | OFlags::NONBLOCK.bits()
        | OFlags::NOCTTY.bits()
        | OFlags::CLOEXEC.bits(),
);

/// How many links in the last component of a source are followed, one hop at a time.
const MAX_LINK_HOPS: usize = 40;

/// The credential paths guarded for this process: those under `$HOME` (and its resolved spelling), and
/// for root also every home of `/etc/passwd` and the system ones.
pub fn credential_guard() -> CredentialGuard {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut guard = if rustix::process::geteuid().is_root() {
        let text = read_regular_capped(Path::new("/etc/passwd"), MAX_PASSWD_BYTES)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .unwrap_or_default();
        CredentialGuard::for_root(home, sandbox_core::credential_paths::passwd_homes(&text))
    } else {
        CredentialGuard::for_user(home)
    };
    // A home that is itself a link is guarded where it really is too.
    let resolved: Vec<String> = guard
        .homes()
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .map(|p| p.display().to_string())
        .collect();
    guard.add_homes(resolved);
    guard
}

/// The one guard for this process's host file operations: its credential paths ([`credential_guard`]),
/// the paths a host executes below its homes and system-wide, the backends' host state roots
/// `state_roots` (each also where it really lives), and the output root, without which it admits no
/// write.
///
/// # Errors
///
/// [`SandboxError::InvalidArgument`] when `output_root` is not an existing directory (it is resolved,
/// links and `..` included, before it is compared with resolved destinations);
/// [`SandboxError::NotPermitted`] when it is unfit ([`HostPathGuard::output_root_refusal`]: a hidden
/// name on it, or it holds system-wide start-up paths).
pub fn host_guard(
    state_roots: impl IntoIterator<Item = PathBuf>,
    output_root: Option<&Path>,
) -> Result<HostPathGuard, SandboxError> {
    let mut guard = HostPathGuard::new(credential_guard());
    for root in state_roots {
        let Ok(absolute) = std::path::absolute(&root) else {
            continue;
        };
        let resolved = std::fs::canonicalize(&absolute).ok();
        guard.add_state_roots(
            std::iter::once(absolute)
                .chain(resolved)
                .map(|p| p.display().to_string()),
        );
    }
    if let Some(root) = output_root {
        let refuse =
            |why: String| SandboxError::invalid(format!("output root {}: {why}", root.display()));
        let resolved = std::fs::canonicalize(root).map_err(|e| refuse(e.to_string()))?;
        if !resolved.is_dir() {
            return Err(refuse("not a directory".into()));
        }
        let resolved = resolved.display().to_string();
        if let Some(refusal) = guard.output_root_refusal(&resolved) {
            return Err(SandboxError::NotPermitted(format!(
                "{}: {refusal}",
                root.display()
            )));
        }
        guard = guard.with_output_root(resolved);
    }
    Ok(guard)
}

/// A host file opened to copy into a sandbox, already judged.
#[derive(Debug)]
pub struct Source {
    file: File,
    shown: String,
}

impl Source {
    /// Opens `local` and judges what was opened: a credential path (unless `allow_credential_path`) or
    /// a backend's host state → NotPermitted; a directory → IsADirectory; anything else but a regular
    /// file → NotRegularFile; a file on a pseudo file system → NotPermitted, whatever
    /// `allow_credential_path` says.
    ///
    /// # Errors
    ///
    /// As above, and NotFound or Io when it cannot be opened; a message names the path and the rule,
    /// never the file's content.
    pub fn open(
        local: &Path,
        guard: &HostPathGuard,
        allow_credential_path: bool,
    ) -> Result<Self, SandboxError> {
        let shown = local.display().to_string();
        let file = open_without_following(local)?;
        let real = real_path(&file, local)?;
        let named = std::path::absolute(local).unwrap_or_else(|_| local.to_path_buf());
        if let Some(refusal) = judge(guard, &[&real, &named], Judged::Read, allow_credential_path) {
            return Err(refused(&shown, &refusal, "read it"));
        }
        let meta = file.metadata().map_err(|e| io_error("stat", &shown, e))?;
        if meta.is_dir() {
            return Err(SandboxError::IsADirectory { path: shown });
        }
        if !meta.is_file() {
            return Err(SandboxError::NotRegularFile { path: shown });
        }
        if let Some(file_system) = pseudo_file_system(&file, &meta) {
            return Err(SandboxError::NotPermitted(format!(
                "{shown} lies on {file_system}, a pseudo file system whose files describe this host (its \
                 processes, their environments, devices); it is never copied into a sandbox"
            )));
        }
        Ok(Source { file, shown })
    }

    /// Reads the whole file when it holds at most `cap` bytes; TransferCapExceeded otherwise, after
    /// reading at most `cap + 1` bytes (none when its size already says so).
    pub fn read_capped(mut self, cap: u64) -> Result<Vec<u8>, SandboxError> {
        let over = || SandboxError::TransferCapExceeded {
            path: self.shown.clone(),
            limit: cap,
        };
        let size = self
            .file
            .metadata()
            .map_err(|e| io_error("stat", &self.shown, e))?
            .len();
        if size > cap {
            return Err(over());
        }
        let content =
            read_at_most(&mut self.file, cap).map_err(|e| io_error("read", &self.shown, e))?;
        if content.len() as u64 > cap {
            return Err(over());
        }
        Ok(content)
    }
}

/// Whether `cp-out` may replace a file that already stands at its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingFile {
    /// Refuse the copy (NotPermitted): checked when the destination is opened, and again when the
    /// copy is published, by a rename that never replaces.
    Keep,
    /// Replace a regular file (never a link, a directory or anything else).
    Replace,
}

/// The directory a `cp-out` writes into, opened and judged before anything is read from the guest.
#[derive(Debug)]
pub struct Destination {
    directory: OwnedFd,
    leaf: OsString,
    shown: String,
    existing: ExistingFile,
}

impl Destination {
    /// Opens the directory `local` is to be written in by walking from the guard's output root one
    /// directory at a time, never following a link, and judges the destination against the guard
    /// ([`HostPathGuard::write_refusal`]).
    ///
    /// `local` (relative to the current directory, or absolute) must lie below the output root:
    /// its first ancestor that resolves to the root is where the walk starts, so a root named
    /// through a link (`/tmp` on macOS) still admits its files, while below it every name is
    /// opened as it is.
    ///
    /// # Errors
    ///
    /// NotPermitted: no output root, an unfit one, a destination outside it, a hidden name on its
    /// path, one the lists refuse (a credential path unless `allow_credential_path`), or an
    /// existing file under [`ExistingFile::Keep`]. Confinement: a link on the way or at the
    /// destination. InvalidArgument: `local` names no file (`dir/`, `..`). NotFound, NotADirectory,
    /// IsADirectory, NotRegularFile or Io from the walk.
    pub fn open(
        local: &Path,
        guard: &HostPathGuard,
        allow_credential_path: bool,
        existing: ExistingFile,
    ) -> Result<Self, SandboxError> {
        let shown = local.display().to_string();
        if local.file_name().is_none() || local.as_os_str().as_bytes().ends_with(b"/") {
            return Err(SandboxError::invalid(format!(
                "{shown} does not name a file to write"
            )));
        }
        let refuse = |refusal: HostRefusal| refused(&shown, &refusal, "write it");
        let root = guard
            .output_root()
            .ok_or_else(|| refuse(HostRefusal::NoOutputRoot))?;
        if let Some(refusal) = guard.output_root_refusal(root) {
            return Err(refuse(refusal));
        }
        let named = std::path::absolute(local).map_err(|e| io_error("resolve", &shown, e))?;
        // As named first (`..` taken lexically), so `x/../.profile` is refused for its hidden name.
        if let Some(refusal) =
            guard.destination_refusal(&named.display().to_string(), allow_credential_path)
        {
            return Err(refuse(refusal));
        }
        let below = below_output_root(&named, Path::new(root))
            .ok_or_else(|| refuse(HostRefusal::OutsideOutputRoot(root.to_owned())))?;
        let lexical = below.iter().fold(PathBuf::from(root), |p, c| p.join(c));
        let Some((leaf, directories)) = below.split_last() else {
            return Err(refuse(HostRefusal::OutsideOutputRoot(root.to_owned())));
        };
        let refusal = guard
            .write_refusal(&lexical.display().to_string(), allow_credential_path)
            .or_else(|| {
                judge(
                    guard,
                    &[&lexical, &named],
                    Judged::Write,
                    allow_credential_path,
                )
            });
        if let Some(refusal) = refusal {
            return Err(refuse(refusal));
        }
        let mut directory = rustix::fs::open(root, ROOT_DIRECTORY_FLAGS, Mode::empty())
            .map_err(|e| io_error("open", root, e.into()))?;
        if real_path(&directory, Path::new(root))? != Path::new(root) {
            return Err(SandboxError::NotPermitted(format!(
                "the output root {root} was moved while {shown} was opened below it"
            )));
        }
        let mut walked = PathBuf::from(root);
        for name in directories {
            walked.push(name);
            directory = open_directory_below(&directory, name, &walked, &shown)?;
        }
        walked.push(leaf);
        check_leaf(&directory, leaf, &walked, &shown, existing)?;
        // Second line: the kernel's own name of what the walk opened, judged again.
        let real = real_path(&directory, &walked)?.join(leaf);
        let refusal = guard
            .write_refusal(&real.display().to_string(), allow_credential_path)
            .or_else(|| judge(guard, &[&real], Judged::Write, allow_credential_path));
        if let Some(refusal) = refusal {
            return Err(refuse(refusal));
        }
        Ok(Destination {
            directory,
            leaf: leaf.clone(),
            shown,
            existing,
        })
    }

    /// Writes `content` to a fresh file (mode 0666 before the umask) in the opened directory and renames it
    /// to the destination: a failed write leaves no partial file, a link standing at the destination is
    /// replaced, never written through, and under [`ExistingFile::Keep`] a file that appeared since the
    /// open is kept (NotPermitted).
    pub fn write_atomically(&self, content: &[u8]) -> Result<(), SandboxError> {
        let (temp_name, temp) = self.create_temp()?;
        let written = write_and_sync(File::from(temp), content);
        let published = written.and_then(|()| match self.existing {
            ExistingFile::Replace => {
                rustix::fs::renameat(&self.directory, &temp_name, &self.directory, &self.leaf)
                    .map_err(std::io::Error::from)
            }
            ExistingFile::Keep => {
                publish_without_replacing(&self.directory, &temp_name, &self.leaf)
            }
        });
        published.map_err(|e| {
            let _ = rustix::fs::unlinkat(&self.directory, &temp_name, AtFlags::empty());
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                exists(&self.shown)
            } else {
                io_error("write", &self.shown, e)
            }
        })
    }

    /// A new temporary file beside the destination, under a name of 128 random bits: nobody can
    /// plant a file or a link there ahead of it, so a name that exists is an error, not a retry.
    fn create_temp(&self) -> Result<(OsString, OwnedFd), SandboxError> {
        let mut random = [0u8; 16];
        getrandom::fill(&mut random).map_err(|e| {
            io_error(
                "create",
                &self.shown,
                std::io::Error::other(format!("the random source failed: {e}")),
            )
        })?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let name = OsString::from(format!(".sandboxctl-cp-out.{hex}"));
        let fd = self.create_temp_named(&name)?;
        Ok((name, fd))
    }

    /// Creates `name` in the opened directory: new (never an existing file, never through a link).
    fn create_temp_named(&self, name: &OsString) -> Result<OwnedFd, SandboxError> {
        rustix::fs::openat(
            &self.directory,
            name,
            TEMPORARY_FILE_FLAGS,
            Mode::from_raw_mode(0o666),
        )
        .map_err(|e| io_error("create", &self.shown, e.into()))
    }
}

/// The components of `named` below `root`, the leaf last: `named` is split at its first ancestor
/// (from `/` down, its parent at most) that resolves to `root`, and below it only plain names may
/// follow. None when no ancestor is the root or a `..` follows it.
fn below_output_root(named: &Path, root: &Path) -> Option<Vec<OsString>> {
    use std::path::Component;
    let components: Vec<Component<'_>> = named.components().collect();
    let mut ancestor = PathBuf::new();
    for (at, component) in components
        .iter()
        .enumerate()
        .take(components.len().saturating_sub(1))
    {
        ancestor.push(component);
        if std::fs::canonicalize(&ancestor).is_ok_and(|real| real == root) {
            return components[at + 1..]
                .iter()
                .map(|c| match c {
                    Component::Normal(name) => Some(name.to_os_string()),
                    _ => None,
                })
                .collect();
        }
    }
    None
}

/// Opens the directory `name` in `parent` without following a link. A link is a confinement
/// refusal, whatever it points at.
fn open_directory_below(
    parent: &OwnedFd,
    name: &OsString,
    walked: &Path,
    shown: &str,
) -> Result<OwnedFd, SandboxError> {
    match rustix::fs::openat(parent, name, DIRECTORY_BELOW_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP | Errno::NOTDIR) => {
            let is_link = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
            if is_link {
                Err(through_link(shown, walked))
            } else {
                Err(SandboxError::NotADirectory {
                    path: walked.display().to_string(),
                })
            }
        }
        Err(e) => Err(io_error("open", &walked.display().to_string(), e.into())),
    }
}

/// What stands at the destination, if anything: nothing, or a regular file under
/// [`ExistingFile::Replace`], is accepted.
fn check_leaf(
    directory: &OwnedFd,
    leaf: &OsString,
    walked: &Path,
    shown: &str,
    existing: ExistingFile,
) -> Result<(), SandboxError> {
    let stat = match rustix::fs::statat(directory, leaf, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(io_error("stat", shown, e.into())),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Symlink => Err(through_link(shown, walked)),
        FileType::Directory => Err(SandboxError::IsADirectory {
            path: shown.to_owned(),
        }),
        FileType::RegularFile if existing == ExistingFile::Replace => Ok(()),
        FileType::RegularFile => Err(exists(shown)),
        _ => Err(SandboxError::NotRegularFile {
            path: shown.to_owned(),
        }),
    }
}

/// Renames `temp` to `leaf` unless `leaf` exists (AlreadyExists then), atomically: `renameat2`'s
/// no-replace flag, or a hard link where the file system lacks it.
fn publish_without_replacing(
    directory: &OwnedFd,
    temp: &OsString,
    leaf: &OsString,
) -> std::io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
    match rustix::fs::renameat_with(
        directory,
        temp,
        directory,
        leaf,
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Err(Errno::INVAL | Errno::NOSYS | Errno::NOTSUP) => {}
        other => return other.map_err(std::io::Error::from),
    }
    rustix::fs::linkat(directory, temp, directory, leaf, AtFlags::empty())?;
    rustix::fs::unlinkat(directory, temp, AtFlags::empty())?;
    Ok(())
}

#[cold]
fn through_link(shown: &str, link: &Path) -> SandboxError {
    SandboxError::confinement(
        shown,
        format!(
            "{} is a link, and a sandbox's bytes are never written through one",
            link.display()
        ),
    )
}

#[cold]
fn exists(shown: &str) -> SandboxError {
    SandboxError::NotPermitted(format!(
        "{shown} exists and is kept; pass --overwrite to replace it"
    ))
}

/// `cp-in` for every host: opens and judges `local` ([`Source::open`]) before anything reaches the
/// sandbox, reads at most `cap` bytes of it (a host passes its backend's per-file limit), and writes
/// them to `guest` (relative to `workdir`). Returns the number of bytes copied.
///
/// # Errors
///
/// What [`Source::open`] and [`Source::read_capped`] refuse; then the sandbox is not touched. The
/// sandbox's own write failure otherwise.
///
/// # Cancel safety and drop
///
/// Dropping the future before the write starts leaves the sandbox untouched; during the write, as the
/// backend's `write_file` says.
pub async fn copy_in(
    sandbox: &dyn Sandbox,
    local: &Path,
    guest: &str,
    workdir: &str,
    guard: &HostPathGuard,
    allow_credential_path: bool,
    cap: u64,
) -> Result<u64, SandboxError> {
    let content = Source::open(local, guard, allow_credential_path)?.read_capped(cap)?;
    sandbox.write_file(guest, &content, workdir).await?;
    Ok(content.len() as u64)
}

/// `cp-out` for every host: given a destination already opened and judged ([`Destination::open`]:
/// below the output root only, no hidden name, no link, an existing file kept unless asked, and the
/// lists behind), so a refused one never costs a read from the guest, reads `guest` whole when it
/// holds at most `max_bytes` (a file the guest grows past the bound is refused, never truncated),
/// and publishes it with one rename, so a failed copy leaves no partial or temporary file. Returns
/// the number of bytes copied.
///
/// # Errors
///
/// The sandbox's read failure (TransferCapExceeded over `max_bytes`), or the local write's (an
/// existing file that appeared since the open, under [`ExistingFile::Keep`], is NotPermitted).
///
/// # Cancel safety and drop
///
/// Dropping the future leaves no local file: the write and the rename run after the guest's read
/// without an await point between them, so a drop lands before both or after both.
pub async fn copy_out(
    sandbox: &dyn Sandbox,
    guest: &str,
    workdir: &str,
    destination: Destination,
    max_bytes: u64,
) -> Result<u64, SandboxError> {
    let content = sandbox.read_file(guest, workdir, max_bytes).await?;
    destination.write_atomically(&content)?;
    Ok(content.len() as u64)
}

/// Writes all of `content` and waits for it to reach the disk, so the rename never publishes a short file.
fn write_and_sync(mut file: File, content: &[u8]) -> std::io::Result<()> {
    std::io::Write::write_all(&mut file, content)?;
    file.sync_all()
}

/// Reads a regular file of at most `cap` bytes, reading at most `cap + 1`. A fifo cannot block the open,
/// a device or a file over the cap is refused. The error is a sentence for people.
pub fn read_regular_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    let mut file = open_capped_read(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > cap {
        return Err(format!("{} bytes, over the limit of {cap}", meta.len()));
    }
    let content = read_at_most(&mut file, cap).map_err(|e| e.to_string())?;
    if content.len() as u64 > cap {
        return Err(format!("over the limit of {cap} bytes"));
    }
    Ok(content)
}

/// Opens the file [`read_regular_capped`] reads, as its flags say.
fn open_capped_read(path: &Path) -> std::io::Result<File> {
    Ok(File::from(rustix::fs::open(
        path,
        CAPPED_READ_FLAGS,
        Mode::empty(),
    )?))
}

/// At most `cap + 1` bytes of `file`: one more than allowed tells "over" from "exactly at the cap".
fn read_at_most(file: &mut File, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut content = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut content)?;
    Ok(content)
}

/// Opens `path` read-only without the kernel following a link in its last component. A link there is
/// followed by hand, one hop at a time, each hop opened the same way; what is finally opened is judged
/// afterwards by its real path, so a hop swapped meanwhile changes nothing. `O_NONBLOCK` keeps a fifo
/// from blocking the open; `O_NOCTTY` keeps a terminal from becoming ours.
fn open_without_following(path: &Path) -> Result<File, SandboxError> {
    let shown = path.display().to_string();
    let mut current = path.to_path_buf();
    for _ in 0..=MAX_LINK_HOPS {
        match rustix::fs::open(&current, UNFOLLOWED_READ_FLAGS, Mode::empty()) {
            Ok(fd) => return Ok(File::from(fd)),
            Err(Errno::LOOP) => {
                let target = rustix::fs::readlinkat(CWD, &current, Vec::new())
                    .map_err(|e| io_error("open", &shown, e.into()))?;
                let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
                // A relative target is read from the link's directory; `join` keeps an
                // absolute one as it is.
                current = match current.parent() {
                    Some(parent) => parent.join(target),
                    None => target,
                };
            }
            Err(e) => return Err(io_error("open", &shown, e.into())),
        }
    }
    Err(io_error(
        "open",
        &shown,
        std::io::Error::other(format!("more than {MAX_LINK_HOPS} links")),
    ))
}

/// Where the open descriptor really is: the kernel's own answer, checked to name the same file.
fn real_path(fd: &impl AsFd, shown: &Path) -> Result<PathBuf, SandboxError> {
    let unknown = |why: String| {
        SandboxError::NotPermitted(format!(
            "cannot tell where {} really is ({why}), so it cannot be checked against the credential paths",
            shown.display()
        ))
    };
    let real = descriptor_path(fd).map_err(|e| unknown(e.to_string()))?;
    let opened = rustix::fs::fstat(fd).map_err(|e| unknown(e.to_string()))?;
    let named =
        std::fs::metadata(&real).map_err(|e| unknown(format!("{}: {e}", real.display())))?;
    if named.dev() != opened.st_dev as u64 || named.ino() != opened.st_ino as u64 {
        return Err(unknown(format!(
            "{} is another file now, or the file was removed",
            real.display()
        )));
    }
    Ok(real)
}

/// The kernel's name of the file `fd` is open on. One function with a body per system, so what
/// runs on Linux is the whole function (and every mutant of it is one a Linux test can catch).
fn descriptor_path(fd: &impl AsFd) -> std::io::Result<PathBuf> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
    }
    #[cfg(target_vendor = "apple")]
    {
        let path = rustix::fs::getpath(fd)?;
        Ok(PathBuf::from(OsString::from_vec(path.into_bytes())))
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
    {
        let _ = fd;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this system cannot name an open file",
        ))
    }
}

/// Whether a path is judged as a source or a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    Read,
    Write,
}

/// The refusal any of `paths` earns, judged lexically (the output root aside: [`Destination::open`]
/// judges it on the real path alone) and against where each listed path really is (a `~/.ssh` that
/// links to a dotfiles directory still guards what is in it).
fn judge(
    guard: &HostPathGuard,
    paths: &[&Path],
    judged: Judged,
    allow_credential_path: bool,
) -> Option<HostRefusal> {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    for path in &shown {
        let refusal = match judged {
            Judged::Read => guard.read_refusal(path, allow_credential_path),
            Judged::Write => guard.destination_refusal(path, allow_credential_path),
        };
        if refusal.is_some() {
            return refusal;
        }
    }
    for listed in guard.listed(judged == Judged::Write) {
        if listed.kind == ListedKind::Credential && allow_credential_path {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&listed.path) else {
            continue;
        };
        let real = real.display().to_string();
        if real != listed.path && shown.iter().any(|p| touches(p, &real)) {
            return Some(listed.refusal());
        }
    }
    None
}

fn refused(shown: &str, refusal: &HostRefusal, act: &str) -> SandboxError {
    let lift = if refusal.is_credential() {
        format!("; pass --allow-credential-path to {act} anyway")
    } else {
        String::new()
    };
    SandboxError::NotPermitted(format!("{shown} {refusal}{lift}"))
}

/// The pseudo file system the open file lies on, if any. Other systems than Linux know none by
/// number (their devices are refused as not regular files). One function with a body per system,
/// as [`descriptor_path`].
fn pseudo_file_system(file: &File, meta: &std::fs::Metadata) -> Option<&'static str> {
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (file, meta);
        None
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        /// `f_type` of file systems whose files describe the running host rather than hold data.
        const PSEUDO: &[(u32, &str)] = &[
            (0x0000_9fa0, "procfs"),
            (0x6265_6572, "sysfs"),
            (0x6462_6720, "debugfs"),
            (0x7472_6163, "tracefs"),
            (0x7363_6673, "securityfs"),
            (0x0027_e0eb, "cgroup"),
            (0x6367_7270, "cgroup2"),
            (0xcafe_4a11, "bpf"),
            (0x6165_676c, "pstore"),
            (0xde5e_81e4, "efivarfs"),
            (0x6265_6570, "configfs"),
            (0x6573_5543, "fusectl"),
            (0x4249_4e4d, "binfmt_misc"),
            (0xf97c_ff8c, "selinuxfs"),
            (0x4341_5d53, "smackfs"),
            (0x1980_0202, "mqueue"),
            (0x0000_1cd1, "devpts"),
            (0x6e73_6673, "nsfs"),
        ];
        // Fail closed: a file system that cannot be asked is treated as one of them.
        let Ok(stats) = rustix::fs::fstatfs(file) else {
            return Some("a file system that could not be identified");
        };
        // Magic numbers are 32-bit; the field is wider on some targets.
        let magic = stats.f_type as u32;
        if let Some((_, name)) = PSEUDO.iter().find(|(m, _)| *m == magic) {
            return Some(name);
        }
        // devtmpfs reports tmpfs's number; it is told apart as the file system mounted at /dev.
        let dev = std::fs::metadata("/dev").ok()?;
        let root = std::fs::metadata("/").ok()?;
        (dev.dev() != root.dev() && meta.dev() == dev.dev()).then_some("devtmpfs (/dev)")
    }
}

fn io_error(operation: &'static str, path: &str, source: std::io::Error) -> SandboxError {
    match source.kind() {
        std::io::ErrorKind::NotFound => SandboxError::NotFound {
            path: path.to_owned(),
        },
        _ => SandboxError::Io {
            operation,
            path: path.to_owned(),
            source,
        },
    }
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_covers_what_this_caller_can_read() {
        let guard = credential_guard();
        let is_root = rustix::process::geteuid().is_root();
        assert_eq!(guard.guards_system_paths(), is_root);
        if is_root {
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
            for home in sandbox_core::credential_paths::passwd_homes(&passwd) {
                assert!(
                    guard
                        .homes()
                        .contains(&sandbox_core::guest_path::norm(&home)),
                    "{home} is not guarded"
                );
                let key = format!("{home}/.ssh/id_ed25519");
                assert!(guard.refusal(&key).is_some(), "{key}");
            }
            assert!(guard.refusal("/etc/shadow").is_some());
        }
    }

    /// The documented list is the list in force: every entry of the data file is named on the
    /// project's host-files page.
    #[test]
    fn the_documented_list_is_the_list_in_force() {
        use sandbox_core::host_paths::{executed_paths, ExecutedScope};
        let page = include_str!("../../../docs/host-files.md");
        for entry in executed_paths() {
            let shown = match entry.scope() {
                ExecutedScope::Home => format!("`~/{}`", entry.path()),
                ExecutedScope::System => format!("`{}`", entry.path()),
                ExecutedScope::Component => format!("any `{}` directory", entry.path()),
            };
            assert!(page.contains(&shown), "docs/host-files.md lacks {shown}");
        }
    }

    fn guard_for(home: &Path) -> HostPathGuard {
        HostPathGuard::new(CredentialGuard::for_user(home.display().to_string()))
    }

    fn refusal_of(result: Result<Destination, SandboxError>) -> String {
        let e = result.expect_err("refused");
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotPermitted, "{e}");
        e.to_string()
    }

    /// Start-up files, by any alias: their hidden names refuse them, and behind that the list
    /// refuses a plain name a host runs (`~/bin`) and the file a start-up link points at.
    #[test]
    fn start_up_files_are_refused_by_any_alias() {
        let (_dir, home, guard) = home_as_output_root();
        let dotfiles = home.join("dotfiles");
        let units = home.join(".config/systemd/user");
        std::fs::create_dir_all(&dotfiles).unwrap();
        std::fs::create_dir_all(&units).unwrap();
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::write(dotfiles.join("bashrc"), b"# mine").unwrap();
        std::os::unix::fs::symlink(dotfiles.join("bashrc"), home.join(".bashrc")).unwrap();
        for (local, reason) in [
            (home.join(".bashrc"), "hidden"),
            (home.join(".Bashrc"), "hidden"),
            (home.join("dotfiles/../.profile"), "hidden"),
            (units.join("x.service"), "hidden"),
            (home.join("repo/../.config/autostart/x.desktop"), "hidden"),
            // The file the start-up link points at is as executed as the link.
            (dotfiles.join("bashrc"), "executes or loads"),
            (home.join("bin/git"), "executes or loads"),
        ] {
            if let Some(parent) = local.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            for existing in [ExistingFile::Keep, ExistingFile::Replace] {
                let text = refusal_of(Destination::open(&local, &guard, true, existing));
                assert!(text.contains(reason), "{}: {text}", local.display());
            }
        }
        assert_eq!(std::fs::read(dotfiles.join("bashrc")).unwrap(), b"# mine");
        assert!(!home.join("bin/git").exists());
        assert!(
            Destination::open(&home.join("notes.txt"), &guard, false, ExistingFile::Keep).is_ok()
        );
    }

    /// An output root replaced by a FIFO after the guard took it (another host process racing
    /// the copy): the root is opened as a directory or not at all, never waited on as a pipe
    /// (without `O_DIRECTORY` a read-only open of a FIFO blocks until a writer comes).
    #[test]
    fn an_output_root_swapped_for_a_fifo_is_refused_at_once() {
        let root = plain_tempdir();
        let home = root.path().join("home");
        let out = root.path().join("out");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let guard = HostPathGuard::new(CredentialGuard::for_user(home.display().to_string()))
            .with_output_root(std::fs::canonicalize(&out).unwrap().display().to_string());
        std::fs::remove_dir(&out).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &out,
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        let local = out.join("x");
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let opened = Destination::open(&local, &guard, false, ExistingFile::Keep).map(drop);
            let _ = sent.send(opened);
        });
        let opened = match received.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(opened) => opened,
            Err(_) => {
                // Release the open that waits for a writer, so the thread ends with the test.
                let _ = std::fs::OpenOptions::new().write(true).open(&out);
                panic!("opening the output root waited on a FIFO");
            }
        };
        assert!(opened.is_err(), "a FIFO was taken for the output root");
        let kind = std::fs::symlink_metadata(&out).unwrap().file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind));
    }

    #[test]
    fn an_output_root_holds_every_write_inside_it() {
        let root = plain_tempdir();
        let home = root.path().join("home");
        let out = root.path().join("out");
        let elsewhere = root.path().join("elsewhere");
        for dir in [&home, &out.join("sub"), &elsewhere] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::os::unix::fs::symlink(&elsewhere, out.join("escape")).unwrap();
        std::os::unix::fs::symlink(&out, root.path().join("out-link")).unwrap();
        let guard = HostPathGuard::new(CredentialGuard::for_user(home.display().to_string()))
            .with_output_root(std::fs::canonicalize(&out).unwrap().display().to_string());
        for local in [
            elsewhere.join("x"),
            out.join("sub/../../elsewhere/x"),
            out.join("sub/../a"),
            home.join("x"),
        ] {
            let text = refusal_of(Destination::open(&local, &guard, true, ExistingFile::Keep));
            assert!(text.contains("outside the output root"), "{text}");
        }
        // A link out of the root is not followed.
        let e = Destination::open(&out.join("escape/x"), &guard, true, ExistingFile::Keep)
            .expect_err("refused");
        assert_eq!(e.kind(), sandbox_core::ErrorKind::Confinement, "{e}");
        // Inside, and the root itself reached through a link, are written.
        for local in [
            out.join("a"),
            out.join("sub/b"),
            root.path().join("out-link/c"),
        ] {
            Destination::open(&local, &guard, false, ExistingFile::Keep)
                .unwrap()
                .write_atomically(b"x")
                .unwrap();
        }
        assert_eq!(std::fs::read(out.join("c")).unwrap(), b"x");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // The library's builder refuses a root that does not exist, or is a file; it takes a
        // directory, resolved.
        let e = host_guard([], Some(&root.path().join("missing"))).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::InvalidArgument);
        std::fs::write(root.path().join("a-file"), b"").unwrap();
        let e = host_guard([], Some(&root.path().join("a-file"))).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("not a directory"), "{e}");
        let built = host_guard([], Some(&root.path().join("out-link"))).unwrap();
        let resolved = std::fs::canonicalize(&out).unwrap();
        assert_eq!(
            built.output_root(),
            Some(resolved.display().to_string().as_str())
        );
    }

    /// A temporary directory whose own name is plain (tempfile's default `.tmp` prefix is hidden).
    fn plain_tempdir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("host-files-")
            .tempdir()
            .unwrap()
    }

    /// A fake home that is also the output root, as with `cp-out` run from the home directory.
    fn home_as_output_root() -> (tempfile::TempDir, PathBuf, HostPathGuard) {
        let dir = plain_tempdir();
        let home = std::fs::canonicalize(dir.path()).unwrap().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let guard = guard_for(&home).with_output_root(home.display().to_string());
        (dir, home, guard)
    }

    /// Start-up files no list names: the destination's hidden name (or hidden directory) refuses
    /// it, and nothing is created.
    #[test]
    fn start_up_files_no_list_names_are_refused_by_their_hidden_name() {
        let (_dir, home, guard) = home_as_output_root();
        for relative in [
            ".tmux.conf",
            ".gdbinit",
            ".exrc",
            ".psqlrc",
            ".Rprofile",
            ".bash_completion",
            ".config/tmux/tmux.conf",
            ".config/direnv/direnvrc",
            ".ipython/profile_default/startup/00.py",
            ".gradle/init.d/x.gradle",
            ".local/share/nvim/site/plugin/x.lua",
            ".vscode/extensions/x/extension.js",
            "src/.envrc",
        ] {
            let local = home.join(relative);
            std::fs::create_dir_all(local.parent().unwrap()).unwrap();
            let text = refusal_of(Destination::open(
                &local,
                &guard,
                true,
                ExistingFile::Replace,
            ));
            assert!(text.contains("hidden"), "{relative}: {text}");
            assert!(!local.exists(), "{relative}");
        }
        let plain = home.join("src/report.txt");
        Destination::open(&plain, &guard, false, ExistingFile::Keep)
            .unwrap()
            .write_atomically(b"x")
            .unwrap();
        assert_eq!(std::fs::read(&plain).unwrap(), b"x");
    }

    /// A guard without an output root writes nothing.
    #[test]
    fn no_output_root_admits_no_destination() {
        let dir = plain_tempdir();
        let guard = guard_for(Path::new("/nonexistent-home"));
        let text = refusal_of(Destination::open(
            &dir.path().join("out"),
            &guard,
            false,
            ExistingFile::Keep,
        ));
        assert!(text.contains("output root"), "{text}");
    }

    /// A link below the output root is never written through, even one that points inside it, and
    /// a link standing at the destination is not replaced.
    #[test]
    fn a_link_below_the_output_root_is_never_followed() {
        let (_dir, home, guard) = home_as_output_root();
        let sub = home.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("target"), b"mine").unwrap();
        std::os::unix::fs::symlink(&sub, home.join("link")).unwrap();
        std::os::unix::fs::symlink(sub.join("target"), home.join("file-link")).unwrap();
        for local in [home.join("link/x"), home.join("file-link")] {
            for existing in [ExistingFile::Keep, ExistingFile::Replace] {
                let e = Destination::open(&local, &guard, false, existing).expect_err("refused");
                assert_eq!(e.kind(), sandbox_core::ErrorKind::Confinement, "{e}");
                assert!(e.to_string().contains("link"), "{e}");
            }
        }
        assert!(!sub.join("x").exists());
        assert_eq!(std::fs::read(sub.join("target")).unwrap(), b"mine");
        assert!(std::fs::symlink_metadata(home.join("file-link"))
            .unwrap()
            .file_type()
            .is_symlink());
    }

    /// An existing file is kept: refused when the destination is opened, and when it appears
    /// between the open and the write.
    #[test]
    fn an_existing_file_is_kept() {
        let (_dir, home, guard) = home_as_output_root();
        let kept = home.join("kept.txt");
        std::fs::write(&kept, b"mine").unwrap();
        let text = refusal_of(Destination::open(&kept, &guard, false, ExistingFile::Keep));
        assert!(text.contains("exists"), "{text}");
        let late = home.join("late.txt");
        let destination = Destination::open(&late, &guard, false, ExistingFile::Keep).unwrap();
        std::fs::write(&late, b"mine").unwrap();
        let e = destination.write_atomically(b"theirs").unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotPermitted, "{e}");
        for path in [&kept, &late] {
            assert_eq!(std::fs::read(path).unwrap(), b"mine");
        }
        assert_only(&home, &["kept.txt", "late.txt"]);
        // Replacing is asked for: the file is replaced, never a directory or a fifo.
        Destination::open(&kept, &guard, false, ExistingFile::Replace)
            .unwrap()
            .write_atomically(b"theirs")
            .unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"theirs");
        std::fs::create_dir(home.join("dir")).unwrap();
        rustix::fs::mknodat(
            CWD,
            home.join("fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e =
            Destination::open(&home.join("dir"), &guard, false, ExistingFile::Replace).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::IsADirectory, "{e}");
        let e = Destination::open(&home.join("fifo"), &guard, false, ExistingFile::Replace)
            .unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotRegularFile, "{e}");
        assert_only(&home, &["dir", "fifo", "kept.txt", "late.txt"]);
    }

    /// Nothing but `keep` in `dir`: no temporary file left behind.
    fn assert_only(dir: &Path, keep: &[&str]) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, keep, "in {}", dir.display());
    }

    #[test]
    fn backend_state_is_refused_both_ways_whatever_the_override() {
        let root = plain_tempdir();
        let home = root.path().join("home");
        let state = root.path().join("state/workspaces");
        let other = state.join("sbx-other/ws-1");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(other.join("secret.txt"), b"theirs").unwrap();
        std::fs::write(state.join("sbx-other/meta.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(&other, root.path().join("alias")).unwrap();
        let canonical = std::fs::canonicalize(root.path()).unwrap();
        let guard = guard_for(&home)
            .with_state_roots([state.display().to_string()])
            .with_output_root(canonical.display().to_string());
        for source in [
            other.join("secret.txt"),
            root.path().join("alias/secret.txt"),
        ] {
            let e = Source::open(&source, &guard, true).unwrap_err();
            assert_eq!(e.kind(), sandbox_core::ErrorKind::NotPermitted, "{e}");
            assert!(e.to_string().contains("sandboxes' workspaces"), "{e}");
        }
        for local in [other.join("planted"), state.join("sbx-other/meta.json")] {
            for existing in [ExistingFile::Keep, ExistingFile::Replace] {
                let text = refusal_of(Destination::open(&local, &guard, true, existing));
                assert!(text.contains("sandboxes' workspaces"), "{text}");
            }
        }
        let e = Destination::open(
            &root.path().join("alias/planted"),
            &guard,
            true,
            ExistingFile::Keep,
        )
        .expect_err("refused");
        assert_eq!(e.kind(), sandbox_core::ErrorKind::Confinement, "{e}");
        assert!(!other.join("planted").exists());
        assert_eq!(
            std::fs::read(state.join("sbx-other/meta.json")).unwrap(),
            b"{}"
        );
    }

    #[test]
    fn cp_out_files_get_the_usual_mode() {
        let dir = plain_tempdir();
        let local = dir.path().join("out");
        let guard = guard_for(Path::new("/nonexistent-home")).with_output_root(
            std::fs::canonicalize(dir.path())
                .unwrap()
                .display()
                .to_string(),
        );
        Destination::open(&local, &guard, false, ExistingFile::Keep)
            .unwrap()
            .write_atomically(b"x")
            .unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&local).unwrap().permissions(),
        );
        // Whatever the umask, group or others get what it allows, never the temp file's 0600.
        let umask_probe = dir.path().join("probe");
        std::fs::write(&umask_probe, b"").unwrap();
        let usual = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&umask_probe).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, usual & 0o777);
        assert_eq!(std::fs::read(&local).unwrap(), b"x");
    }

    /// A source directory swapped for a link to `~/.ssh` while cp-in checks and reads it: the key must
    /// never be what is read.
    #[test]
    fn a_source_swapped_for_a_credential_link_is_never_read() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let root = tempfile::tempdir().unwrap();
        let home = root.path().join("home");
        let ssh = home.join(".ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        std::fs::write(ssh.join("id_ed25519"), b"PRIVATE KEY").unwrap();
        // `dir` is a real directory holding a harmless file, and in turns a link to ~/.ssh.
        let dir = root.path().join("dir");
        let real_spare = root.path().join("real-spare");
        let link_spare = root.path().join("link-spare");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("id_ed25519"), b"harmless").unwrap();
        std::os::unix::fs::symlink(&ssh, &link_spare).unwrap();
        let source = root.path().join("dir/id_ed25519");
        let guard = guard_for(&home);
        let copy_in = || Source::open(&source, &guard, false)?.read_capped(1 << 20);
        assert_eq!(copy_in().unwrap(), b"harmless");
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut flips = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (away, back) = if flips % 2 == 0 {
                        (&real_spare, &link_spare)
                    } else {
                        (&link_spare, &real_spare)
                    };
                    std::fs::rename(&dir, away).unwrap();
                    std::fs::rename(back, &dir).unwrap();
                    flips += 1;
                    // Hold each state a little, a different while each time, so checks and reads
                    // land on both sides of a swap.
                    std::thread::sleep(std::time::Duration::from_micros(flips % 7 * 20));
                }
                flips
            })
        };
        let mut leaked = 0;
        let mut copied = 0;
        for _ in 0..3000 {
            if let Ok(content) = copy_in() {
                copied += 1;
                if content == b"PRIVATE KEY" {
                    leaked += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let flips = flipper.join().unwrap();
        assert!(flips > 100, "the swap raced ({flips} flips)");
        assert!(copied > 0, "the harmless file was copied at times");
        assert_eq!(
            leaked, 0,
            "the private key was read {leaked} times of {copied} copies"
        );
    }

    #[test]
    fn a_source_at_the_cap_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        let guard = guard_for(Path::new("/nonexistent-home"));
        let open = || Source::open(&path, &guard, false).unwrap();
        assert_eq!(open().read_capped(5).unwrap(), b"12345");
        let e = open().read_capped(4).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::TransferCapExceeded);
    }

    /// The `--env-file` cap holds an env file of a mebibyte (a generated one with many long
    /// values), and refuses one byte more.
    #[test]
    fn an_env_file_of_a_mebibyte_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.env");
        let mut content = b"A=".to_vec();
        content.resize(1 << 20, b'x');
        std::fs::write(&path, &content).unwrap();
        let guard = guard_for(Path::new("/nonexistent-home"));
        let open = || Source::open(&path, &guard, false).unwrap();
        assert_eq!(open().read_capped(MAX_ENV_FILE_BYTES).unwrap(), content);
        content.push(b'x');
        std::fs::write(&path, &content).unwrap();
        let e = open().read_capped(MAX_ENV_FILE_BYTES).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::TransferCapExceeded);
    }

    #[test]
    fn a_destination_must_name_a_file() {
        let guard = guard_for(Path::new("/nonexistent-home"));
        for local in ["/tmp/", "..", "/"] {
            let e =
                Destination::open(Path::new(local), &guard, false, ExistingFile::Keep).unwrap_err();
            assert_eq!(
                e.kind(),
                sandbox_core::ErrorKind::InvalidArgument,
                "{local}"
            );
        }
    }

    /// Runs `open` on a thread and fails the test when it has not answered within ten seconds:
    /// an open that waits for a FIFO's writer. `release` then opens the FIFO for writing, so the
    /// thread ends with the test.
    fn answers_at_once<T: Send + 'static>(
        open: impl FnOnce() -> T + Send + 'static,
        release: &Path,
    ) -> T {
        let (sent, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(open());
        });
        match received.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(answer) => answer,
            Err(_) => {
                let _ = std::fs::OpenOptions::new().write(true).open(release);
                panic!("the open waited on a FIFO");
            }
        }
    }

    fn fifo_in(dir: &Path) -> PathBuf {
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        fifo
    }

    fn close_on_exec(fd: impl AsFd) -> bool {
        rustix::io::fcntl_getfd(fd)
            .unwrap()
            .contains(rustix::io::FdFlags::CLOEXEC)
    }

    fn non_blocking(fd: impl AsFd) -> bool {
        rustix::fs::fcntl_getfl(fd)
            .unwrap()
            .contains(OFlags::NONBLOCK)
    }

    /// A FIFO as a source (for `cp-in`, or a file the host reads itself) is refused at once,
    /// never waited on for a writer; the files opened to be read are closed on exec and opened
    /// without blocking.
    #[test]
    fn a_fifo_source_is_refused_at_once_and_reads_are_opened_close_on_exec() {
        let dir = plain_tempdir();
        let fifo = fifo_in(dir.path());
        let guard = guard_for(Path::new("/nonexistent-home"));
        let source = fifo.clone();
        let opened = answers_at_once(
            move || Source::open(&source, &guard, false).map(drop),
            &fifo,
        );
        assert_eq!(
            opened.unwrap_err().kind(),
            sandbox_core::ErrorKind::NotRegularFile
        );
        let source = fifo.clone();
        let read = answers_at_once(move || read_regular_capped(&source, 16), &fifo);
        assert_eq!(read.unwrap_err(), "not a regular file");

        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"x").unwrap();
        let guard = guard_for(Path::new("/nonexistent-home"));
        let source = Source::open(&plain, &guard, false).unwrap();
        assert!(close_on_exec(&source.file));
        assert!(non_blocking(&source.file));
        let capped = open_capped_read(&plain).unwrap();
        assert!(close_on_exec(&capped));
        assert!(non_blocking(&capped));
    }

    /// `read_regular_capped` reads a file of exactly the cap, refuses one byte more by its size,
    /// and refuses a file whose size says nothing (procfs reports 0) once it reads past the cap.
    #[test]
    fn a_capped_read_holds_the_cap_exactly_even_when_the_size_lies() {
        let dir = plain_tempdir();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read_regular_capped(&path, 5).unwrap(), b"12345");
        let over = read_regular_capped(&path, 4).unwrap_err();
        assert!(over.contains("5 bytes, over the limit of 4"), "{over}");
        let status = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(status).unwrap().len(), 0);
        let over = read_regular_capped(status, 10).unwrap_err();
        assert_eq!(over, "over the limit of 10 bytes");
    }

    /// A source named through links, relative and absolute, is the file they lead to; a chain
    /// longer than the hop limit is refused; a missing source is NotFound.
    #[test]
    fn a_source_through_links_is_read_and_a_missing_one_is_not_found() {
        let dir = plain_tempdir();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/data"), b"through links").unwrap();
        std::os::unix::fs::symlink("sub/data", root.join("relative")).unwrap();
        std::os::unix::fs::symlink(root.join("relative"), root.join("absolute")).unwrap();
        let guard = guard_for(Path::new("/nonexistent-home"));
        for name in ["relative", "absolute"] {
            let content = Source::open(&root.join(name), &guard, false)
                .unwrap()
                .read_capped(64)
                .unwrap();
            assert_eq!(content, b"through links", "{name}");
        }
        let mut previous = root.join("sub/data");
        for hop in 0..=MAX_LINK_HOPS {
            let link = root.join(format!("hop{hop}"));
            std::os::unix::fs::symlink(&previous, &link).unwrap();
            previous = link;
        }
        let e = Source::open(&previous, &guard, false).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::Io, "{e}");
        assert!(format!("{e:?}").contains("more than 40 links"), "{e:?}");
        let e = Source::open(&root.join("missing"), &guard, false).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotFound, "{e}");
    }

    /// A magic link of procfs (`/proc/self/fd/N`, which the kernel would open as the object
    /// itself, whatever its name says) is followed by its name only: a pipe's is NotFound,
    /// never opened.
    #[test]
    fn a_magic_link_is_followed_by_its_name_never_by_the_kernel() {
        let (reader, _writer) = std::io::pipe().unwrap();
        let magic = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&reader)
        ));
        let guard = guard_for(Path::new("/nonexistent-home"));
        let e = Source::open(&magic, &guard, false).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotFound, "{e}");
    }

    /// A descriptor whose file was removed, with another file now standing at the name the
    /// kernel gives it (`NAME (deleted)`), on the same device: not where it is said to be.
    #[test]
    fn a_descriptor_whose_name_now_holds_another_file_is_refused() {
        let dir = plain_tempdir();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let path = root.join("gone");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(real_path(&file, &path).unwrap(), path);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(root.join("gone (deleted)"), b"y").unwrap();
        let e = real_path(&file, &path).unwrap_err();
        assert!(e.to_string().contains("is another file now"), "{e}");
    }

    /// Files of procfs and of the device file system are recognised, a plain file is not.
    #[test]
    fn pseudo_file_systems_are_recognised_by_their_files() {
        let on = |path: &str| {
            let file = File::open(path).unwrap();
            let meta = file.metadata().unwrap();
            pseudo_file_system(&file, &meta)
        };
        assert_eq!(on("/proc/self/status"), Some("procfs"));
        let dev_is_its_own =
            std::fs::metadata("/dev").unwrap().dev() != std::fs::metadata("/").unwrap().dev();
        assert!(dev_is_its_own, "this test needs /dev mounted apart from /");
        assert_eq!(on("/dev/null"), Some("devtmpfs (/dev)"));
        let dir = plain_tempdir();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"x").unwrap();
        assert_eq!(on(&plain.display().to_string()), None);
        let guard = guard_for(Path::new("/nonexistent-home"));
        let e = Source::open(Path::new("/proc/self/status"), &guard, false).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotPermitted, "{e}");
    }

    /// The temporary file of a copy is new, never an existing name nor a link planted there,
    /// closed on exec; a copy leaves no temporary file.
    #[test]
    fn the_temporary_file_is_new_never_a_planted_link_and_closed_on_exec() {
        let (_dir, home, guard) = home_as_output_root();
        let victim = home.join("victim");
        std::fs::write(&victim, b"kept").unwrap();
        let destination =
            Destination::open(&home.join("out"), &guard, false, ExistingFile::Keep).unwrap();
        std::os::unix::fs::symlink(&victim, home.join("planted")).unwrap();
        let e = destination
            .create_temp_named(&OsString::from("planted"))
            .unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::Io, "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"kept");
        let (name, fd) = destination.create_temp().unwrap();
        assert!(close_on_exec(&fd));
        let (other, _) = destination.create_temp().unwrap();
        assert_ne!(name, other);
        for temp in [&name, &other] {
            std::fs::remove_file(home.join(temp)).unwrap();
        }
        destination.write_atomically(b"copied").unwrap();
        assert_eq!(std::fs::read(home.join("out")).unwrap(), b"copied");
        assert_only(&home, &["out", "planted", "victim"]);
    }

    /// Every directory below the root is opened as a directory and never through a link.
    #[test]
    fn a_directory_below_is_never_a_file_nor_a_link() {
        let dir = plain_tempdir();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::fs::write(root.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        let parent: OwnedFd = File::open(&root).unwrap().into();
        let below = |name: &str| {
            open_directory_below(&parent, &OsString::from(name), &root.join(name), name)
        };
        assert!(below("real").is_ok());
        let e = below("link").unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::Confinement, "{e}");
        let e = below("file").unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::NotADirectory, "{e}");
    }

    /// `copy_in` and `copy_out` move the bytes and say how many.
    #[test]
    fn copies_move_the_bytes_and_count_them() {
        use sandbox_core::testing::FakeBackend;
        use sandbox_core::{Isolation, SandboxBackend as _, SandboxKey, SandboxSpec};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let backend = FakeBackend::new("fake", Isolation::Container);
            let key = SandboxKey::conversation("s", "t", "a");
            let spec = SandboxSpec::builder("k").build().unwrap();
            let sandbox = backend.acquire(&key, &spec).await.unwrap();
            let (_dir, home, guard) = home_as_output_root();
            std::fs::write(home.join("in"), b"seven b").unwrap();
            let copied = copy_in(&*sandbox, &home.join("in"), "x", ".", &guard, false, 64)
                .await
                .unwrap();
            assert_eq!(copied, 7);
            assert_eq!(sandbox.read_file("x", ".", 64).await.unwrap(), b"seven b");
            let destination =
                Destination::open(&home.join("back"), &guard, false, ExistingFile::Keep).unwrap();
            assert_eq!(
                copy_out(&*sandbox, "x", ".", destination, 64)
                    .await
                    .unwrap(),
                7
            );
            assert_eq!(std::fs::read(home.join("back")).unwrap(), b"seven b");
        });
    }
}
