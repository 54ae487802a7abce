//! The exec init: the Docker init shape's wrapper as one static program instead of the engine's
//! init starting a `sh`.
//!
//! `sandbox-exec-init <nonce> <mask> <cwd> <argv>…` is the call's first process (the exec's, so
//! its parent is outside the container) and does what `/sbin/docker-init -s -- sh -c
//! DOCKER_INIT_WRAPPER …` does, in the same order and with the same exit statuses and lines
//! (docs/wrapper-protocol.md#docker-the-exec-init): it becomes the subreaper of everything the command
//! starts; refuses a malformed call or a cancel file with 125 and no nonce; decodes only the `x`
//! values (in process: no `base64`); enters the working directory (failure: the `-nocwd` line, a
//! reason, 125); prints the nonce line; starts exactly the argv (a `PATH` search as `execvp` does,
//! in a process group of its own); reaps every orphan it adopts while it waits; records a
//! signal-shaped status ([`crate::wrapper::SIGNAL_STATUSES`]) for
//! [`crate::wrapper::init_status_argv`] and exits [`crate::wrapper::RECORDED_STATUS`] then, else
//! exits with the command's status.
//!
//! What it saves is two program starts per call, the init's and a dynamically linked shell's.
//! The parsing ([`parse_init_args`]) is portable and pure, so it is tested on every host; the
//! process part exists on Linux only, where the binary runs.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

use crate::argv_encoding::decode_arg;
use crate::call_identity::Nonce;

/// The exit status of a call the init refused before the command could start (the wrapper's).
pub const INIT_REFUSED: u8 = 125;

/// A call the init accepted: what to run, and where.
#[derive(Debug, PartialEq, Eq)]
pub struct InitCall {
    /// The call's nonce.
    pub nonce: Nonce,
    /// The working directory, decoded.
    pub cwd: OsString,
    /// The command, decoded; never empty.
    pub argv: Vec<OsString>,
}

/// Reads the init's arguments (after its own name): the nonce, the mask (one `r` or `x` per
/// value), the working directory and the argv. `None` for anything malformed: a nonce that is
/// not 24 lowercase hex digits, a mask of another length or with another letter, an empty argv,
/// an `x` value that does not decode, or a decoded value with a NUL byte. The init exits
/// [`INIT_REFUSED`] then, with no nonce line.
pub fn parse_init_args(args: &[OsString]) -> Option<InitCall> {
    let (nonce, rest) = args.split_first()?;
    let nonce = Nonce::parse(nonce.to_str()?)?;
    let (mask, values) = rest.split_first()?;
    let mask = mask.as_bytes();
    if mask.len() != values.len() || values.len() < 2 {
        return None;
    }
    let mut decoded = mask
        .iter()
        .zip(values)
        .map(|(letter, value)| match letter {
            b'r' => Some(value.clone()),
            b'x' => decode_arg(value.to_str()?)
                .filter(|bytes| !bytes.contains(&0))
                .map(OsString::from_vec),
            _ => None,
        })
        .collect::<Option<Vec<OsString>>>()?;
    let argv = decoded.split_off(1);
    let cwd = decoded.pop()?;
    Some(InitCall { nonce, cwd, argv })
}

/// The record of a signal-shaped status, read by [`crate::wrapper::init_status_argv`]'s script.
pub fn status_file(nonce: &Nonce) -> String {
    format!("/tmp/maf-sbx-{nonce}.status")
}

/// The lines the init prints when it cannot enter the working directory: the `-nocwd` marker,
/// then a reason in the shell's words (`cd: <dir>: <why>`).
pub fn no_cwd_lines(nonce: &Nonce, cwd: &OsStr, why: &std::io::Error) -> Vec<u8> {
    let mut lines = nonce.no_cwd_line();
    lines.extend_from_slice(b"cd: ");
    lines.extend_from_slice(cwd.as_bytes());
    lines.extend_from_slice(format!(": {}\n", plain_reason(why)).as_bytes());
    lines
}

/// The status and message of a command that could not start, in the shell's terms: 127 when
/// nothing by that name exists, 126 when it exists but cannot be run.
pub fn spawn_failure(program: &OsStr, why: &std::io::Error) -> (u8, Vec<u8>) {
    let status = if why.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    let mut message = b"sandbox-exec-init: ".to_vec();
    message.extend_from_slice(program.as_bytes());
    let reason = if status == 127 {
        "not found".to_owned()
    } else {
        plain_reason(why)
    };
    message.extend_from_slice(format!(": {reason}\n").as_bytes());
    (status, message)
}

/// The operating system's message without Rust's ` (os error N)` suffix.
fn plain_reason(why: &std::io::Error) -> String {
    let text = why.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[cfg(target_os = "linux")]
pub use linux::run;

#[cfg(target_os = "linux")]
mod linux {
    use std::ffi::{OsStr, OsString};
    use std::io::Write as _;
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use rustix::process::{wait, Pid, WaitOptions};

    use super::{
        no_cwd_lines, parse_init_args, spawn_failure, status_file, InitCall, INIT_REFUSED,
    };
    use crate::call_identity::cancel_file;

    /// Runs one call as described in the module docs; returns the init's exit status.
    pub fn run(args: &[OsString]) -> u8 {
        // First, so nothing the command starts can be orphaned out of the call's tree.
        if rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_err() {
            return INIT_REFUSED;
        }
        let Some(InitCall { nonce, cwd, argv }) = parse_init_args(args) else {
            return INIT_REFUSED;
        };
        // The kill came first: it made this file before it looked for the call's init.
        if std::fs::symlink_metadata(cancel_file(&nonce)).is_ok() {
            return INIT_REFUSED;
        }
        let mut stderr = std::io::stderr().lock();
        if let Err(why) = std::env::set_current_dir(&cwd) {
            let _ = stderr.write_all(&no_cwd_lines(&nonce, &cwd, &why));
            return INIT_REFUSED;
        }
        if stderr.write_all(&nonce.line()).is_err() {
            return INIT_REFUSED;
        }
        let status = match start(&argv) {
            Ok(child) => reap_until(child),
            Err(why) => {
                let (status, message) = spawn_failure(&argv[0], &why);
                let _ = stderr.write_all(&message);
                i32::from(status)
            }
        };
        // No exit of the init's own is ever signal-shaped: such an exec status can only be the
        // init's death.
        if crate::wrapper_scripts::SIGNAL_STATUSES.contains(&status) {
            record_status(&status_file(&nonce), status);
            return crate::wrapper_scripts::RECORDED_STATUS as u8;
        }
        u8::try_from(status).unwrap_or(u8::MAX)
    }

    /// Starts exactly the argv in a process group of its own (a `kill 0` of the command's
    /// cannot reach the init). A file the kernel will not run as a program (`ENOEXEC`) is run
    /// by `/bin/sh` as a script, as `execvp` and the shell do.
    fn start(argv: &[OsString]) -> std::io::Result<Pid> {
        let spawn = |program: &OsStr, args: &[OsString], arg0: &OsStr| {
            let mut command = Command::new(program);
            command.arg0(arg0).args(args).process_group(0);
            // A hook, even one that does nothing, makes std fork and exec instead of using
            // `posix_spawn`: glibc's leaves its two internal signals ignored in the child, and
            // an ignored signal stays ignored across exec, so the command would not start with
            // the dispositions the shell's fork gives it.
            #[allow(unsafe_code)]
            // SAFETY: the hook calls nothing at all, so nothing that is unsafe after a fork.
            unsafe {
                command.pre_exec(|| Ok(()));
            }
            command.spawn()
        };
        let child = match spawn(&argv[0], &argv[1..], &argv[0]) {
            Err(why) if why.raw_os_error() == Some(rustix::io::Errno::NOEXEC.raw_os_error()) => {
                let script = resolve(&argv[0]).ok_or(why)?;
                let mut args = vec![script.into_os_string()];
                args.extend_from_slice(&argv[1..]);
                spawn(OsStr::new("/bin/sh"), &args, OsStr::new("sh"))?
            }
            other => other?,
        };
        // Reaped below by pid, never through the handle.
        Pid::from_raw(child.id() as i32)
            .ok_or_else(|| std::io::Error::other("the command has no pid"))
    }

    /// The path `execvp` would run for `program`: itself when it names a path, else the first
    /// regular file by that name in `PATH` that is executable.
    fn resolve(program: &OsStr) -> Option<PathBuf> {
        if program.as_bytes().contains(&b'/') {
            return Some(PathBuf::from(program));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| is_executable_file(candidate))
    }

    fn is_executable_file(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path)
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    }

    /// Waits for the command, reaping every adopted orphan that ends first; the command's status
    /// in the shell's terms (a signal as 128 plus its number).
    fn reap_until(child: Pid) -> i32 {
        loop {
            match wait(WaitOptions::empty()) {
                Ok(Some((pid, status))) if pid == child => {
                    let status = std::process::ExitStatus::from_raw(status.as_raw());
                    return match (status.code(), status.signal()) {
                        (Some(code), _) => code,
                        (None, Some(signal)) => 128 + signal,
                        (None, None) => i32::from(INIT_REFUSED),
                    };
                }
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return i32::from(INIT_REFUSED),
            }
        }
    }

    /// Writes the status record, never through a link a command may have planted.
    fn record_status(path: &str, status: i32) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path);
        if let Ok(mut file) = file {
            let _ = write!(file, "{status}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv_encoding::encode_arg;

    const NONCE: &str = "0123456789abcdef01234567";

    fn args(values: &[&[u8]]) -> Vec<OsString> {
        values
            .iter()
            .map(|value| OsString::from_vec(value.to_vec()))
            .collect()
    }

    #[test]
    fn raw_and_encoded_values_decode_in_place() {
        let encoded = encode_arg(&[0xff, b'\n'], "argv[1]").unwrap();
        let call = parse_init_args(&args(&[
            NONCE.as_bytes(),
            b"rrx",
            b"/w d",
            b"printf",
            encoded.as_bytes(),
        ]))
        .unwrap();
        assert_eq!(call.nonce.as_str(), NONCE);
        assert_eq!(call.cwd, OsString::from("/w d"));
        assert_eq!(call.argv, args(&[b"printf", &[0xff, b'\n']]));
    }

    #[test]
    fn every_malformed_call_is_refused() {
        let refused = |values: &[&[u8]]| parse_init_args(&args(values)).is_none();
        assert!(refused(&[]));
        assert!(refused(&[NONCE.as_bytes()]));
        assert!(refused(&[
            b"0123456789ABCDEF01234567",
            b"rr",
            b"/",
            b"true"
        ]));
        assert!(refused(&[b"0123", b"rr", b"/", b"true"]));
        // The mask must count the cwd and the argv exactly, and the argv must not be empty.
        assert!(refused(&[NONCE.as_bytes(), b"r", b"/"]));
        assert!(refused(&[NONCE.as_bytes(), b"rrr", b"/", b"true"]));
        assert!(refused(&[NONCE.as_bytes(), b"r", b"/", b"true"]));
        assert!(refused(&[NONCE.as_bytes(), b"rq", b"/", b"true"]));
        // An x value must carry the letter, decode, and hold no NUL.
        assert!(refused(&[NONCE.as_bytes(), b"rx", b"/", b"dHJ1ZQ=="]));
        assert!(refused(&[NONCE.as_bytes(), b"rx", b"/", b"x!!"]));
        assert!(refused(&[NONCE.as_bytes(), b"rx", b"/", b"xYQBi"]));
        assert!(!refused(&[NONCE.as_bytes(), b"rx", b"/", b"xdHJ1ZQ=="]));
    }

    proptest::proptest! {
        /// Whatever the host's encoder sends (any bytes but NUL), the init reads back exactly.
        #[test]
        fn the_init_reads_back_what_the_host_encodes(
            cwd in proptest::collection::vec(1u8..=255, 0..20),
            argv in proptest::collection::vec(proptest::collection::vec(1u8..=255, 0..20), 1..6),
        ) {
            let nonce = crate::new_nonce().unwrap();
            let invocation = crate::argv_encoding::raw_invocation(&cwd, &argv).unwrap();
            let sent: Vec<OsString> = crate::wrapper_scripts::exec_init_argv(&nonce, &invocation)[1..]
                .iter()
                .map(OsString::from)
                .collect();
            let call = parse_init_args(&sent).unwrap();
            proptest::prop_assert_eq!(call.nonce, nonce);
            proptest::prop_assert_eq!(call.cwd.into_vec(), cwd);
            let read: Vec<Vec<u8>> = call.argv.into_iter().map(OsString::into_vec).collect();
            proptest::prop_assert_eq!(read, argv);
        }
    }

    #[test]
    fn failures_read_as_the_shell_words_them() {
        let nonce = Nonce::parse(NONCE).unwrap();
        let missing = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            no_cwd_lines(&nonce, OsStr::new("/nope"), &missing),
            format!("{NONCE}-nocwd\ncd: /nope: No such file or directory\n").into_bytes()
        );
        assert_eq!(
            spawn_failure(OsStr::new("nosuch"), &missing),
            (127, b"sandbox-exec-init: nosuch: not found\n".to_vec())
        );
        let denied = std::io::Error::from_raw_os_error(13);
        assert_eq!(
            spawn_failure(OsStr::new("./x"), &denied),
            (126, b"sandbox-exec-init: ./x: Permission denied\n".to_vec())
        );
        assert_eq!(status_file(&nonce), format!("/tmp/maf-sbx-{NONCE}.status"));
    }
}
