//! The warm pool's entries on the host (docs/qemu-backend.md#warm-pool): VMs restored from the
//! baseline and waiting, so a fresh acquire takes one instead of restoring its own.
//!
//! Every entry is a file in `<state>/.pool/`, named by the member's instance id (its VM lives in
//! `vms/<id>` as every VM does) and holding the member's machine (`qemu_vm::Snapshot::machine_of`):
//!
//! - `<id>.filling` while a process restores the member. That process holds the file's lock
//!   until the member is ready or gone, so a filler that died is told from one at work by a lock
//!   that can be taken; how many are filling is counted under the pool's lock (`.pool/lock`), so
//!   processes that refill at once never make more than the pool's size.
//! - `<id>` once the member's agent answered and the default storage base was made in it: ready,
//!   the only entries a claim takes, and only when it holds the claimer's machine. Its second
//!   line is that storage base, which a claim for the same base need not make again.
//!
//! **The claim** is the rename of a ready entry into the claiming key's directory, as
//! `claim-<id>`, under that key's lock. Of all the callers renaming one entry exactly one
//! succeeds (the others find no source), so a member is handed out once; the key's record
//! then names the member and the claim file goes. A claimer that dies between the two leaves the
//! claim where the key's next acquire or its disposal finds it and discards that VM.
//!
//! Not here: restoring, attaching and discarding VMs (the backend's), the baselines.

use std::fs::File;
use std::path::{Path, PathBuf};

use sandbox_core::SandboxError;

use crate::layout::{self, Slot};

/// The state directory's directory of pool entries (not a name any key's directory has: those
/// start with the backend's prefix).
pub(crate) const POOL_DIR: &str = ".pool";

/// The suffix of an entry whose member is being restored.
const FILLING: &str = ".filling";

/// The suffix of a ready member's entry taken out of the pool to be discarded.
const WITHDRAWN: &str = ".withdrawn";

/// The prefix of a claim in a key's directory.
const CLAIM: &str = "claim-";

/// The largest entry read back (a machine digest is 64 bytes).
const ENTRY_CAP: u64 = 4096;

/// The pool's entries under one state directory, and its size per machine.
#[derive(Debug, Clone)]
pub(crate) struct PoolEntries {
    dir: PathBuf,
    size: usize,
}

/// A member being restored: its `.filling` entry, locked until this is dropped or made ready.
#[derive(Debug)]
pub(crate) struct Filling {
    pub(crate) instance: String,
    machine: String,
    entry: PathBuf,
    _lock: File,
}

/// An entry this process took to discard its member: one whose filler died, or a ready member
/// withdrawn. Its lock is held until [`PoolEntries::forget`], so no other process discards it
/// too; a process that dies first leaves it to the next refill's sweep.
#[derive(Debug)]
pub(crate) struct Abandoned {
    pub(crate) instance: String,
    entry: PathBuf,
    _lock: File,
}

impl PoolEntries {
    pub(crate) fn new(state_dir: &Path, size: usize) -> PoolEntries {
        PoolEntries {
            dir: state_dir.join(POOL_DIR),
            size,
        }
    }

    /// Ready members per machine the pool keeps; 0 is no pool.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The ready members holding `machine`, from a random place in the listing so that
    /// claimers at once start on different members.
    pub(crate) fn ready(&self, machine: &str) -> Vec<String> {
        let mut ready: Vec<String> = self
            .entries()
            .into_iter()
            .filter(|name| is_member_id(name))
            .filter(|name| self.machine_of(name).as_deref() == Some(machine))
            .collect();
        ready.sort();
        if !ready.is_empty() {
            let start = random_index(ready.len());
            ready.rotate_left(start);
        }
        ready
    }

    /// Every ready member, whatever its machine.
    pub(crate) fn members(&self) -> Vec<String> {
        let mut members: Vec<String> = self
            .entries()
            .into_iter()
            .filter(|name| is_member_id(name))
            .collect();
        members.sort();
        members
    }

    /// Claims ready member `instance` for `slot` (whose lock the caller holds): true when this
    /// call took it, false when another caller had (or it was never ready).
    pub(crate) fn claim(&self, instance: &str, slot: &Slot) -> Result<bool, SandboxError> {
        let from = self.dir.join(instance);
        let to = claim_path(slot, instance);
        match std::fs::rename(&from, &to) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(layout::io_error("claim", &from, source)),
        }
    }

    /// Takes ready member `instance` out of the pool to discard it, under the pool's lock:
    /// `None` when a claim or another withdrawal took it first.
    pub(crate) async fn withdraw(&self, instance: &str) -> Result<Option<Abandoned>, SandboxError> {
        let _lock = self.lock().await?;
        let from = self.dir.join(instance);
        let to = self.dir.join(format!("{instance}{WITHDRAWN}"));
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(layout::io_error("withdraw", &from, source)),
        }
        Ok(try_lock(&to)?.map(|lock| Abandoned {
            instance: instance.to_owned(),
            entry: to,
            _lock: lock,
        }))
    }

    /// Under the pool's lock: the entries whose filler died (or that were withdrawn by a
    /// process that died before discarding them), and, when fewer than the pool's size of
    /// `machine` are ready or filling, one new member to restore, named by `instance`.
    pub(crate) async fn next_to_fill(
        &self,
        machine: &str,
        instance: String,
    ) -> Result<(Vec<Abandoned>, Option<Filling>), SandboxError> {
        let _lock = self.lock().await?;
        let (abandoned, counted) = self.sweep(machine)?;
        if counted >= self.size {
            return Ok((abandoned, None));
        }
        let entry = self.dir.join(format!("{instance}{FILLING}"));
        std::fs::write(&entry, machine).map_err(|e| layout::io_error("write", &entry, e))?;
        let lock = try_lock(&entry)?
            .ok_or_else(|| SandboxError::engine(format!("{} is locked", entry.display())))?;
        Ok((
            abandoned,
            Some(Filling {
                instance,
                machine: machine.to_owned(),
                entry,
                _lock: lock,
            }),
        ))
    }

    /// Under the pool's lock: the entries whose filler or withdrawer died, taken to be
    /// discarded.
    pub(crate) async fn abandoned(&self) -> Result<Vec<Abandoned>, SandboxError> {
        let _lock = self.lock().await?;
        Ok(self.sweep("")?.0)
    }

    /// The entries whose holder died (their locks taken), and how many members of `machine`
    /// are ready or being restored by a live process. The caller holds the pool's lock.
    fn sweep(&self, machine: &str) -> Result<(Vec<Abandoned>, usize), SandboxError> {
        let mut abandoned = Vec::new();
        let mut counted = 0;
        for name in self.entries() {
            let path = self.dir.join(&name);
            let taken = name.strip_suffix(FILLING).or(name.strip_suffix(WITHDRAWN));
            if let Some(id) = taken {
                if let Some(lock) = try_lock(&path)? {
                    abandoned.push(Abandoned {
                        instance: id.to_owned(),
                        entry: path,
                        _lock: lock,
                    });
                } else if name.ends_with(FILLING)
                    && self.machine_of(&name).as_deref() == Some(machine)
                {
                    counted += 1;
                }
            } else if is_member_id(&name) && self.machine_of(&name).as_deref() == Some(machine) {
                counted += 1;
            }
        }
        Ok((abandoned, counted))
    }

    /// Marks a restored member, in which `storage_base` was made, ready: from now on a claim
    /// may take it.
    pub(crate) fn ready_now(
        &self,
        filling: Filling,
        storage_base: &str,
    ) -> Result<(), SandboxError> {
        let text = format!("{}\n{storage_base}", filling.machine);
        std::fs::write(&filling.entry, text)
            .map_err(|e| layout::io_error("write", &filling.entry, e))?;
        let to = self.dir.join(&filling.instance);
        std::fs::rename(&filling.entry, &to).map_err(|e| layout::io_error("rename", &to, e))
    }

    /// Removes the entry of a member that was not made, or was discarded.
    pub(crate) fn forget_filling(&self, filling: Filling) -> Result<(), SandboxError> {
        layout::remove_if_present(&filling.entry)
    }

    /// Removes the entry of an abandoned or withdrawn member, once its VM is gone.
    pub(crate) fn forget(&self, abandoned: Abandoned) -> Result<(), SandboxError> {
        layout::remove_if_present(&abandoned.entry)
    }

    async fn lock(&self) -> Result<File, SandboxError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| layout::io_error("create", &self.dir, e))?;
        layout::lock_file(self.dir.join("lock")).await
    }

    fn entries(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .collect()
    }

    fn machine_of(&self, name: &str) -> Option<String> {
        entry_line(&self.dir.join(name), 0)
    }
}

/// Line `n` of the entry at `path`: the machine (0), the storage base made in the member (1).
fn entry_line(path: &Path, n: usize) -> Option<String> {
    let bytes = host_state::read_record(path, ENTRY_CAP).ok()??;
    let text = String::from_utf8(bytes).ok()?;
    text.lines().nth(n).map(str::to_owned)
}

/// The storage base made in the member `slot` claimed, as its entry says.
pub(crate) fn claimed_base(slot: &Slot, instance: &str) -> Option<String> {
    entry_line(&claim_path(slot, instance), 1)
}

/// The claims in `slot`'s directory: members taken for it whose claimer may have died before
/// its record named them.
pub(crate) fn claims_in(slot: &Slot) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(&slot.dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter_map(|name| name.strip_prefix(CLAIM).map(str::to_owned))
        .filter(|id| is_member_id(id))
        .collect()
}

/// Removes `slot`'s claim of `instance` (its record names the member now, or it is gone).
pub(crate) fn remove_claim(slot: &Slot, instance: &str) -> Result<(), SandboxError> {
    layout::remove_if_present(&claim_path(slot, instance))
}

fn claim_path(slot: &Slot, instance: &str) -> PathBuf {
    slot.dir.join(format!("{CLAIM}{instance}"))
}

/// An instance id as [`layout::new_instance_id`] makes them: `vm-` and 12 hex digits.
fn is_member_id(name: &str) -> bool {
    name.strip_prefix("vm-")
        .is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The lock of `path` when no other holder has it; `None` when one has.
fn try_lock(path: &Path) -> Result<Option<File>, SandboxError> {
    let file = match File::options().write(true).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(layout::io_error("open", path, source)),
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(errno) => Err(layout::io_error("lock", path, errno.into())),
    }
}

fn random_index(len: usize) -> usize {
    host_state::random_hex(8)
        .ok()
        .and_then(|hex| usize::from_str_radix(&hex, 16).ok())
        .map_or(0, |n| n % len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_in(dir: &Path, name: &str) -> Slot {
        let slot = Slot::at(dir.join(name)).unwrap();
        std::fs::create_dir_all(&slot.dir).unwrap();
        slot
    }

    #[tokio::test]
    async fn a_member_is_counted_while_filling_made_ready_and_claimed_once() {
        let state = tempfile::tempdir().unwrap();
        let pool = PoolEntries::new(state.path(), 1);
        let (abandoned, filling) = pool
            .next_to_fill("m1", "vm-00000000000a".to_owned())
            .await
            .unwrap();
        assert!(abandoned.is_empty());
        let filling = filling.expect("an empty pool fills");
        // One filling counts against the size: no second member is started.
        let (_, none) = pool
            .next_to_fill("m1", "vm-00000000000b".to_owned())
            .await
            .unwrap();
        assert!(none.is_none());
        assert!(pool.ready("m1").is_empty(), "a filling member is not ready");
        pool.ready_now(filling, "/work").unwrap();
        assert_eq!(pool.ready("m1"), ["vm-00000000000a"]);
        assert!(pool.ready("m2").is_empty(), "another machine's member");
        let (one, two) = (
            slot_in(state.path(), "qemu-a"),
            slot_in(state.path(), "qemu-b"),
        );
        assert!(pool.claim("vm-00000000000a", &one).unwrap());
        assert!(!pool.claim("vm-00000000000a", &two).unwrap());
        assert_eq!(claims_in(&one), ["vm-00000000000a"]);
        assert_eq!(
            claimed_base(&one, "vm-00000000000a").as_deref(),
            Some("/work")
        );
        assert!(claims_in(&two).is_empty());
        assert!(pool.members().is_empty());
        remove_claim(&one, "vm-00000000000a").unwrap();
        assert!(claims_in(&one).is_empty());
    }

    #[tokio::test]
    async fn a_dead_fillers_entry_is_abandoned_and_a_live_ones_is_not() {
        let state = tempfile::tempdir().unwrap();
        let pool = PoolEntries::new(state.path(), 2);
        let (_, live) = pool
            .next_to_fill("m", "vm-00000000000a".to_owned())
            .await
            .unwrap();
        let live = live.unwrap();
        // A filler that died: its entry is there and no one holds its lock.
        std::fs::write(pool.dir.join("vm-00000000000b.filling"), "m").unwrap();
        let (abandoned, next) = pool
            .next_to_fill("m", "vm-00000000000c".to_owned())
            .await
            .unwrap();
        assert_eq!(
            abandoned
                .iter()
                .map(|a| a.instance.as_str())
                .collect::<Vec<_>>(),
            ["vm-00000000000b"]
        );
        assert!(next.is_some(), "the dead filler's member does not count");
        for gone in abandoned {
            pool.forget(gone).unwrap();
        }
        assert!(!pool.dir.join("vm-00000000000b.filling").exists());
        drop(live);
    }

    #[tokio::test]
    async fn a_withdrawn_member_cannot_be_claimed_nor_swept_while_held() {
        let state = tempfile::tempdir().unwrap();
        let pool = PoolEntries::new(state.path(), 1);
        std::fs::create_dir_all(&pool.dir).unwrap();
        std::fs::write(pool.dir.join("vm-00000000000a"), "m").unwrap();
        let withdrawn = pool.withdraw("vm-00000000000a").await.unwrap().unwrap();
        assert!(pool.withdraw("vm-00000000000a").await.unwrap().is_none());
        let slot = slot_in(state.path(), "qemu-a");
        assert!(!pool.claim("vm-00000000000a", &slot).unwrap());
        let (abandoned, filling) = pool
            .next_to_fill("m", "vm-00000000000b".to_owned())
            .await
            .unwrap();
        assert!(abandoned.is_empty(), "a withdrawal under way is not swept");
        drop(filling);
        // Its withdrawer died: the next sweep takes it.
        drop(withdrawn);
        let (abandoned, _) = pool
            .next_to_fill("m", "vm-00000000000c".to_owned())
            .await
            .unwrap();
        let ids: Vec<_> = abandoned.iter().map(|a| a.instance.clone()).collect();
        assert!(ids.contains(&"vm-00000000000a".to_owned()), "{ids:?}");
        for gone in abandoned {
            pool.forget(gone).unwrap();
        }
    }

    #[test]
    fn only_instance_ids_are_members_or_claims() {
        assert!(is_member_id("vm-0123456789ab"));
        assert!(!is_member_id("vm-0123456789ab.filling"));
        assert!(!is_member_id("lock"));
        assert!(!is_member_id("vm-0123"));
        assert!(!is_member_id("vm-0123456789ag"));
    }
}
