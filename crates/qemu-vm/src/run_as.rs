//! The user QEMU runs as once its set-up is done.
//!
//! A driver running as root would otherwise leave every VM's device model running as root: a
//! guest that subverts QEMU would own the host. So under root each VM's QEMU drops to an id
//! pair of its own ([`RunAs::OwnIdsUnderRoot`], the default), drawn at random from a range no distribution
//! allocates: no file on the host belongs to it, and no other VM runs as it, so a subverted
//! QEMU can neither read another VM's files nor signal or trace its process. QEMU opens
//! everything it needs (kernel, initramfs, root image, its temporary overlay, the sockets it is
//! handed) before it drops, so nothing of the VM's directory has to change owner.
//!
//! Every method here takes a resolved value ([`RunAs::resolve`]): [`RunAs::OwnIdsUnderRoot`]
//! reads as the invoker until then.
//!
//! The drop is a `setuid` after QEMU's seccomp filter is in place, so the filter must allow
//! `set*id` calls then (`elevateprivileges=allow`): once every id is unprivileged they cannot
//! raise anything, and starting a set-id program stays denied (`spawn=deny`). A driver that is
//! not root runs QEMU as itself, with `elevateprivileges=deny`.
//!
//! Not here: a user with a name (none is needed) or a drop for hosts where QEMU is started
//! through a helper that is itself set-id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};

use crate::error::VmError;

/// The first id of the range unprivileged VMs are drawn from: above the ranges distributions
/// and container runtimes allocate (system and login users, subordinate id ranges, systemd's
/// container ranges end at 1879048191) and below 2^31, which some tools read as signed.
pub const FIRST_VM_ID: u32 = 2_000_000_000;

/// How many ids the range holds.
pub const VM_IDS: u32 = 100_000_000;

/// How long `qemu -help` may take, and how much it may print (QEMU 7 to 10 print about 10 KiB).
const HELP_DEADLINE: Duration = Duration::from_secs(10);
const HELP_OUTPUT_CAP: usize = 256 * 1024;

/// Which user a VM's QEMU runs as once its set-up is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RunAs {
    /// Ids of the VM's own, drawn when it starts, when the driver runs as root; the driver's own
    /// user otherwise (an unprivileged driver has nothing to drop).
    #[default]
    OwnIdsUnderRoot,
    /// The driver's own user, unchanged.
    Invoker,
    /// These ids (user and group; no supplementary groups).
    Ids {
        /// The user id.
        uid: u32,
        /// The group id.
        gid: u32,
    },
}

impl RunAs {
    /// What `self` means for a VM starting now: [`RunAs::OwnIdsUnderRoot`] becomes a fresh id
    /// pair from [`FIRST_VM_ID`]`..+`[`VM_IDS`] under root, else [`RunAs::Invoker`].
    ///
    /// # Errors
    /// [`VmError::Invalid`] when the host gives no randomness for the ids.
    pub fn resolve(self) -> Result<RunAs, VmError> {
        if self != RunAs::OwnIdsUnderRoot {
            return Ok(self);
        }
        if !rustix::process::geteuid().is_root() {
            return Ok(RunAs::Invoker);
        }
        let mut bytes = [0u8; 4];
        getrandom::fill(&mut bytes)
            .map_err(|e| VmError::Invalid(format!("no entropy for the VM's user id: {e}")))?;
        let id = FIRST_VM_ID + u32::from_le_bytes(bytes) % VM_IDS;
        Ok(RunAs::Ids { uid: id, gid: id })
    }

    /// QEMU's `-sandbox` value for this user: every deny, but `set*id` calls allowed when QEMU
    /// has to make them itself to drop.
    pub(crate) fn sandbox_option(self) -> &'static str {
        match self {
            RunAs::Invoker | RunAs::OwnIdsUnderRoot => {
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
            }
            RunAs::Ids { .. } => {
                "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"
            }
        }
    }

    /// QEMU's arguments that drop to this user, in the spelling `qemu` knows.
    pub(crate) fn qemu_args(self, spelling: Spelling) -> Vec<String> {
        match self {
            RunAs::Invoker | RunAs::OwnIdsUnderRoot => Vec::new(),
            RunAs::Ids { uid, gid } => match spelling {
                Spelling::RunWith => vec!["-run-with".into(), format!("user={uid}:{gid}")],
                Spelling::Runas => vec!["-runas".into(), format!("{uid}:{gid}")],
            },
        }
    }
}

/// How a QEMU program is told the user to drop to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Spelling {
    /// `-run-with user=<uid>:<gid>` (QEMU 9.1 and later).
    RunWith,
    /// `-runas <uid>:<gid>` (before 9.1; deprecated since).
    Runas,
}

impl Spelling {
    /// The spelling a QEMU program's `-help` offers: `-run-with` when it lists `user=` there,
    /// else `-runas`; `None` when it offers neither.
    pub fn from_help(help: &str) -> Option<Spelling> {
        let run_with_user = help
            .lines()
            .any(|line| line.trim_start().starts_with("-run-with") && line.contains("user="));
        if run_with_user {
            return Some(Spelling::RunWith);
        }
        help.lines()
            .any(|line| line.trim_start().starts_with("-runas "))
            .then_some(Spelling::Runas)
    }

    /// The spelling `qemu` offers, asked once per program for this process's lifetime.
    ///
    /// # Errors
    /// [`VmError::Spawn`] when the program does not run; [`VmError::Invalid`] when it offers
    /// no way to drop.
    pub(crate) async fn of(qemu: &Path) -> Result<Spelling, VmError> {
        static KNOWN: OnceLock<Mutex<HashMap<PathBuf, Spelling>>> = OnceLock::new();
        let known = KNOWN.get_or_init(Default::default);
        if let Some(spelling) = known.lock().ok().and_then(|map| map.get(qemu).copied()) {
            return Ok(spelling);
        }
        let spawn_error = |source| VmError::Spawn {
            program: qemu.display().to_string(),
            source,
        };
        let ran = BoundedCommand::new(qemu, HELP_DEADLINE)
            .arg("-help")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output_budget(HELP_OUTPUT_CAP)
            .run()
            .await
            .map_err(|e| spawn_error(std::io::Error::other(e.to_string())))?;
        if ran.status != ExitKind::Exited(0) {
            return Err(spawn_error(std::io::Error::other(format!(
                "-help ended {:?}",
                ran.status
            ))));
        }
        let spelling =
            Spelling::from_help(&String::from_utf8_lossy(&ran.stdout)).ok_or_else(|| {
                VmError::Invalid(format!(
                    "{} offers no way to drop root (neither -run-with user= nor -runas)",
                    qemu.display()
                ))
            })?;
        if let Ok(mut map) = known.lock() {
            map.insert(qemu.to_owned(), spelling);
        }
        Ok(spelling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spelling_follows_the_help() {
        let old = "-runas user     change to user id user just before starting the VM\n\
                   user can be numeric uid:gid instead\n";
        let new = "-run-with [async-teardown=on|off][,chroot=dir][user=username|uid:gid]\n\
                   -runas user     deprecated\n";
        let chroot_only = "-run-with [async-teardown=on|off][,chroot=dir]\n";
        assert_eq!(Spelling::from_help(old), Some(Spelling::Runas));
        assert_eq!(Spelling::from_help(new), Some(Spelling::RunWith));
        assert_eq!(Spelling::from_help(chroot_only), None);
        assert_eq!(Spelling::from_help(""), None);
    }

    #[test]
    fn the_drop_is_spelled_with_both_ids_and_allows_only_the_set_id_calls() {
        let ids = RunAs::Ids {
            uid: 2_000_000_007,
            gid: 2_000_000_007,
        };
        assert_eq!(
            ids.qemu_args(Spelling::RunWith),
            ["-run-with", "user=2000000007:2000000007"]
        );
        assert_eq!(
            ids.qemu_args(Spelling::Runas),
            ["-runas", "2000000007:2000000007"]
        );
        assert!(RunAs::Invoker.qemu_args(Spelling::RunWith).is_empty());
        let strip = |option: &str| option.replace("elevateprivileges=allow", "");
        assert_eq!(
            strip(ids.sandbox_option()),
            strip(
                &RunAs::Invoker
                    .sandbox_option()
                    .replace("elevateprivileges=deny", "")
            )
        );
        assert!(RunAs::Invoker
            .sandbox_option()
            .contains("elevateprivileges=deny"));
    }

    #[test]
    fn root_draws_ids_in_the_range_and_others_keep_their_own() {
        let first = RunAs::OwnIdsUnderRoot.resolve().unwrap();
        match first {
            RunAs::Ids { uid, gid } => {
                assert!(rustix::process::geteuid().is_root());
                assert_eq!(uid, gid);
                assert!((FIRST_VM_ID..FIRST_VM_ID + VM_IDS).contains(&uid), "{uid}");
                assert!(FIRST_VM_ID
                    .checked_add(VM_IDS)
                    .is_some_and(|end| end < 1 << 31));
                // Drawn afresh for each VM (two equal draws out of 10^8: once in 10^8 runs).
                assert_ne!(RunAs::OwnIdsUnderRoot.resolve().unwrap(), first);
            }
            other => {
                assert_eq!(other, RunAs::Invoker);
                assert!(!rustix::process::geteuid().is_root());
            }
        }
        let fixed = RunAs::Ids { uid: 7, gid: 8 };
        assert_eq!(fixed.resolve().unwrap(), fixed);
        assert_eq!(RunAs::Invoker.resolve().unwrap(), RunAs::Invoker);
    }
}
