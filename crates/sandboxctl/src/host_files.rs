//! Host files that `cp-in`, `cp-out` and `--env-file` touch, judged by what was actually opened.
//!
//! Every check runs on an open descriptor, never on a path string checked earlier and opened again later:
//! a source is opened first (the kernel never follows a link in its last component; links there are
//! followed one hop at a time, each hop opened without following), then judged by the real path of the
//! open descriptor, its kind and its file system; a destination's parent directory is opened first and
//! judged the same way, and the file is then created and renamed relative to that descriptor. Swapping a
//! directory for a link between the check and the read therefore changes nothing: the check is about the
//! file that is read.
//!
//! What is refused: a source or destination that is, contains or lies under a credential path
//! ([`CredentialGuard`]; `--allow-credential-path` lifts it), a source that is not a regular
//! file, a source on a pseudo file system (procfs, sysfs, devtmpfs, debugfs, securityfs, cgroup, ... on
//! Linux), and more bytes than the caller's cap (at most cap + 1 bytes are ever read).
//!
//! Not defended: a hard link to a credential file made elsewhere by the caller (it has no credential
//! path), and credentials kept outside the listed paths.

use std::ffi::OsString;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, CWD};
use rustix::io::Errno;
use sandbox_core::credential_paths::CredentialGuard;
use sandbox_core::SandboxError;

/// The largest `--env-file` read.
pub const MAX_ENV_FILE_BYTES: u64 = 1024 * 1024;

/// The largest password database read to find the home directories a root caller guards.
const MAX_PASSWD_BYTES: u64 = 4 * 1024 * 1024;

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

/// A host file opened to copy into a sandbox, already judged.
#[derive(Debug)]
pub struct Source {
    file: File,
    shown: String,
}

impl Source {
    /// Opens `local` and judges what was opened: a credential path (unless `allow_credential_path`) →
    /// NotPermitted; a directory → IsADirectory; anything else but a regular file → NotRegularFile; a file
    /// on a pseudo file system → NotPermitted, whatever `allow_credential_path` says.
    pub fn open(
        local: &Path,
        guard: &CredentialGuard,
        allow_credential_path: bool,
    ) -> Result<Self, SandboxError> {
        let shown = local.display().to_string();
        let file = open_without_following(local)?;
        if !allow_credential_path {
            let real = real_path(&file, local)?;
            let named = std::path::absolute(local).unwrap_or_else(|_| local.to_path_buf());
            if let Some(credential) = credential_touched(guard, &[&real, &named]) {
                return Err(credential_refusal(&shown, &credential, "copy it in"));
            }
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

/// The directory a `cp-out` writes into, opened and judged before anything is read from the guest.
#[derive(Debug)]
pub struct Destination {
    directory: OwnedFd,
    leaf: OsString,
    shown: String,
}

impl Destination {
    /// Opens the parent directory of `local` and judges `<its real path>/<file name>` (and `local` as
    /// named) against the credential paths, unless `allow_credential_path`. A `local` without a file name
    /// (`dir/`, `..`) is an invalid argument.
    pub fn open(
        local: &Path,
        guard: &CredentialGuard,
        allow_credential_path: bool,
    ) -> Result<Self, SandboxError> {
        let shown = local.display().to_string();
        let leaf = match local.file_name() {
            Some(leaf) if !local.as_os_str().as_bytes().ends_with(b"/") => leaf.to_os_string(),
            _ => {
                return Err(SandboxError::invalid(format!(
                    "{shown} does not name a file to write"
                )))
            }
        };
        let parent = match local.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let directory = rustix::fs::open(
            &parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("open", &parent.display().to_string(), e.into()))?;
        if !allow_credential_path {
            let real = real_path(&directory, &parent)?.join(&leaf);
            let named = std::path::absolute(local).unwrap_or_else(|_| local.to_path_buf());
            if let Some(credential) = credential_touched(guard, &[&real, &named]) {
                return Err(credential_refusal(&shown, &credential, "write it"));
            }
        }
        Ok(Destination {
            directory,
            leaf,
            shown,
        })
    }

    /// Writes `content` to a fresh file (mode 0666 before the umask) in the opened directory and renames it
    /// over the destination: a failed write leaves no partial file, and a link standing at the destination
    /// is replaced, never written through.
    pub fn write_atomically(&self, content: &[u8]) -> Result<(), SandboxError> {
        let (temp_name, temp) = self.create_temp()?;
        let written = write_and_sync(File::from(temp), content);
        let renamed = written.and_then(|()| {
            rustix::fs::renameat(&self.directory, &temp_name, &self.directory, &self.leaf)
                .map_err(std::io::Error::from)
        });
        renamed.map_err(|e| {
            let _ = rustix::fs::unlinkat(&self.directory, &temp_name, AtFlags::empty());
            io_error("write", &self.shown, e)
        })
    }

    fn create_temp(&self) -> Result<(OsString, OwnedFd), SandboxError> {
        let mut attempt = 0u32;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or_default();
            let name = OsString::from(format!(
                ".sandboxctl-cp-out.{}.{nanos:08x}.{attempt}",
                std::process::id()
            ));
            match rustix::fs::openat(
                &self.directory,
                &name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o666),
            ) {
                Ok(fd) => return Ok((name, fd)),
                Err(Errno::EXIST) if attempt < 16 => attempt += 1,
                Err(e) => return Err(io_error("create", &self.shown, e.into())),
            }
        }
    }
}

/// Writes all of `content` and waits for it to reach the disk, so the rename never publishes a short file.
fn write_and_sync(mut file: File, content: &[u8]) -> std::io::Result<()> {
    std::io::Write::write_all(&mut file, content)?;
    file.sync_all()
}

/// Reads a regular file of at most `cap` bytes, reading at most `cap + 1`. A fifo cannot block the open,
/// a device or a file over the cap is refused. The error is a sentence for people.
pub fn read_regular_capped(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| std::io::Error::from(e).to_string())?;
    let mut file = File::from(fd);
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
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let mut current = path.to_path_buf();
    for _ in 0..=MAX_LINK_HOPS {
        match rustix::fs::open(&current, flags, Mode::empty()) {
            Ok(fd) => return Ok(File::from(fd)),
            Err(Errno::LOOP) => {
                let target = rustix::fs::readlinkat(CWD, &current, Vec::new())
                    .map_err(|e| io_error("open", &shown, e.into()))?;
                let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
                current = match current.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
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

#[cfg(any(target_os = "linux", target_os = "android"))]
fn descriptor_path(fd: &impl AsFd) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

#[cfg(target_vendor = "apple")]
fn descriptor_path(fd: &impl AsFd) -> std::io::Result<PathBuf> {
    let path = rustix::fs::getpath(fd)?;
    Ok(PathBuf::from(OsString::from_vec(path.into_bytes())))
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
fn descriptor_path(_fd: &impl AsFd) -> std::io::Result<PathBuf> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "this system cannot name an open file",
    ))
}

/// The credential path any of `paths` touches, judged lexically and against where each listed credential
/// path really is (a `~/.ssh` that links to a dotfiles directory still guards what is in it).
fn credential_touched(guard: &CredentialGuard, paths: &[&Path]) -> Option<String> {
    for path in paths {
        if let Some(credential) = guard.refusal(&path.display().to_string()) {
            return Some(credential);
        }
    }
    for listed in guard.listed_paths() {
        if listed.contains('*') {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&listed) else {
            continue;
        };
        if paths
            .iter()
            .any(|p| p.starts_with(&real) || real.starts_with(p))
        {
            return Some(listed);
        }
    }
    None
}

fn credential_refusal(shown: &str, credential: &str, act: &str) -> SandboxError {
    SandboxError::NotPermitted(format!(
        "{shown} is, contains or lies under the credential path {credential}; pass \
         --allow-credential-path to {act} anyway"
    ))
}

/// The pseudo file system the open file lies on, if any.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn pseudo_file_system(file: &File, meta: &std::fs::Metadata) -> Option<&'static str> {
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

/// Other systems: devices are refused as not regular files; no pseudo file system is known by number.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn pseudo_file_system(_file: &File, _meta: &std::fs::Metadata) -> Option<&'static str> {
    None
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

    #[test]
    fn a_source_at_the_cap_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        let guard = CredentialGuard::for_user("/nonexistent-home");
        let open = || Source::open(&path, &guard, false).unwrap();
        assert_eq!(open().read_capped(5).unwrap(), b"12345");
        let e = open().read_capped(4).unwrap_err();
        assert_eq!(e.kind(), sandbox_core::ErrorKind::TransferCapExceeded);
    }

    #[test]
    fn a_destination_must_name_a_file() {
        let guard = CredentialGuard::for_user("/nonexistent-home");
        for local in ["/tmp/", "..", "/"] {
            let e = Destination::open(Path::new(local), &guard, false).unwrap_err();
            assert_eq!(
                e.kind(),
                sandbox_core::ErrorKind::InvalidArgument,
                "{local}"
            );
        }
    }
}
