//! Where a VM lives on the host and how another process finds it: one directory per name under
//! the state directory, holding the record `record.json` and the lock file `lock`; the VM's own
//! directory (`qemu_vm::Vm`'s: sockets, QEMU's log and overlay) is `vms/<instance id>`.
//!
//! The name is the sbx name of (key, kind) with this backend's prefix
//! (`sandbox_core::naming::sbx_sandbox_name`), so a key's and a conversation's VMs share a
//! name prefix and disposal by key or by scope is a directory listing.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use host_state::{self, Placing};
use sandbox_core::naming::sbx::{
    sbx_conversation_prefix, sbx_key_prefix, sbx_sandbox_name, NamePrefix,
};
use sandbox_core::{SandboxError, SandboxKey};

/// The directory under the state directory that holds every VM's own directory, named by its
/// instance id (kept short: QEMU's socket paths live there).
pub(crate) const VMS: &str = "vms";

/// The record's file name inside a name's directory.
const RECORD: &str = "record.json";

/// The mark of a fork's save under way, inside a name's directory ([`Slot::mark_saving`]).
const SAVING: &str = "saving";

/// The largest record read back (a record is a few hundred bytes; anything larger is not ours).
const RECORD_CAP: u64 = 64 * 1024;

/// What a VM is, as another process needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) scope: String,
    pub(crate) thread_id: String,
    pub(crate) agent_id: String,
    pub(crate) call_id: String,
    pub(crate) kind: String,
    /// The VM's directory name under the name's directory; the sandbox's instance id.
    pub(crate) instance: String,
    /// The storage base, normal form.
    pub(crate) storage_base: String,
    /// Seconds since the epoch.
    pub(crate) created: u64,
    /// Why the VM must not be reused, once retired.
    #[serde(default)]
    pub(crate) retired: Option<String>,
    /// The digest of its allowlist egress (`egress::EgressPlan`); none for closed egress.
    #[serde(default)]
    pub(crate) egress: Option<String>,
}

impl Record {
    pub(crate) fn key(&self) -> SandboxKey {
        SandboxKey {
            scope: self.scope.clone(),
            thread_id: self.thread_id.clone(),
            agent_id: self.agent_id.clone(),
            call_id: self.call_id.clone(),
        }
    }
}

/// The paths of one (key, kind).
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
}

impl Slot {
    pub(crate) fn new(state_dir: &Path, prefix: &NamePrefix, key: &SandboxKey, kind: &str) -> Slot {
        let name = sbx_sandbox_name(prefix, key, kind);
        Slot {
            dir: state_dir.join(&name),
            name,
        }
    }

    pub(crate) fn at(dir: PathBuf) -> Option<Slot> {
        let name = dir.file_name()?.to_str()?.to_owned();
        Some(Slot { name, dir })
    }

    /// The record, `None` when there is none.
    pub(crate) fn read_record(&self) -> Result<Option<Record>, SandboxError> {
        let path = self.dir.join(RECORD);
        let Some(bytes) =
            host_state::read_record(&path, RECORD_CAP).map_err(|e| io_error("read", &path, e))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|error| SandboxError::engine(format!("record {}: {error}", path.display())))
    }

    /// Writes the record durably ([`host_state::place_record`]): a reader sees the old or the
    /// new record, never half of one, and a crash after the write keeps the new one.
    pub(crate) fn write_record(&self, record: &Record) -> Result<(), SandboxError> {
        let path = self.dir.join(RECORD);
        let text = serde_json::to_vec_pretty(record)
            .map_err(|error| SandboxError::engine(format!("record: {error}")))?;
        host_state::place_record(&self.dir, RECORD, &text, Placing::Replace)
            .map(drop)
            .map_err(|source| io_error("write", &path, source))
    }

    pub(crate) fn remove_record(&self) -> Result<(), SandboxError> {
        remove_if_present(&self.dir.join(RECORD))
    }

    /// Takes the name's lock, shared by every process on the host: at most one of them
    /// creates, replaces or disposes of the name's VM at a time. Held until the file is dropped.
    pub(crate) async fn lock(&self) -> Result<File, SandboxError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|source| io_error("create", &self.dir, source))?;
        lock_file(self.dir.join("lock")).await
    }

    /// Marks the record retired with `reason` when it still names `instance` and is not retired
    /// yet, under the name's lock; true when it did. Gives up after `within` when another holder
    /// keeps the lock, and does nothing when the name's lock file is gone (its VM was disposed
    /// of: nothing is created again).
    pub(crate) async fn retire(
        &self,
        instance: &str,
        reason: &str,
        within: std::time::Duration,
    ) -> Result<bool, SandboxError> {
        let path = self.dir.join("lock");
        let file = match File::options().write(true).open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(io_error("open", &path, source)),
        };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(errno) => return Err(io_error("lock", &path, errno.into())),
            }
        }
        match self.read_record()? {
            Some(mut record) if record.instance == instance && record.retired.is_none() => {
                record.retired = Some(reason.to_owned());
                self.write_record(&record)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Marks the name's VM as being saved by a fork (which pauses it), before the save starts:
    /// while the mark stands, the VM may be paused by a save whose process died, and the next
    /// holder of the name's lock asks QEMU. Without it, no one does (an acquire stays one file
    /// look, not a QMP round trip).
    pub(crate) fn mark_saving(&self) -> Result<(), SandboxError> {
        let path = self.dir.join(SAVING);
        std::fs::write(&path, b"").map_err(|source| io_error("write", &path, source))
    }

    /// Whether a fork's save of the name's VM began and was not seen to end.
    pub(crate) fn is_saving(&self) -> bool {
        self.dir.join(SAVING).exists()
    }

    /// Removes the mark once the VM runs again.
    pub(crate) fn clear_saving(&self) -> Result<(), SandboxError> {
        remove_if_present(&self.dir.join(SAVING))
    }

    /// Removes the name's directory once nothing of a VM is left in it.
    pub(crate) fn remove_if_empty(&self) {
        let _ = std::fs::remove_file(self.dir.join(SAVING));
        let _ = std::fs::remove_file(self.dir.join("lock"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Takes the exclusive lock of the file at `path` (made if missing), shared by every process on
/// the host; held until the file is dropped. A dropped future drops the waiting thread's
/// result, and with it the lock.
pub(crate) async fn lock_file(path: PathBuf) -> Result<File, SandboxError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| io_error("open", &path, source))?;
    tokio::task::spawn_blocking(move || {
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map(|()| file)
    })
    .await
    .map_err(|error| SandboxError::engine(format!("lock {}: {error}", path.display())))?
    .map_err(|errno| io_error("lock", &path, errno.into()))
}

/// Removes the file at `path`; one already gone is no error.
pub(crate) fn remove_if_present(path: &Path) -> Result<(), SandboxError> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("remove", path, error))
        }
        _ => Ok(()),
    }
}

/// The directories under `state_dir` whose name starts with `prefix`.
pub(crate) fn slots_with_prefix(state_dir: &Path, prefix: &str) -> Result<Vec<Slot>, SandboxError> {
    let entries = match std::fs::read_dir(state_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(io_error("list", state_dir, source)),
    };
    let mut slots: Vec<Slot> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .filter_map(|entry| Slot::at(entry.path()))
        .filter(|slot| slot.name.starts_with(prefix))
        .collect();
    slots.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(slots)
}

/// The name prefix of a key's VMs.
pub(crate) fn key_prefix(prefix: &NamePrefix, key: &SandboxKey) -> String {
    sbx_key_prefix(prefix, key)
}

/// The name prefix of a conversation's VMs (`thread_id` given), or of a scope's (the digest
/// covers scope and thread together, so a scope alone is matched by its records).
pub(crate) fn conversation_prefix(prefix: &NamePrefix, scope: &str, thread_id: &str) -> String {
    sbx_conversation_prefix(prefix, &SandboxKey::conversation(scope, thread_id, ""))
}

/// A fresh instance id: `vm-` and 12 random hex digits (a VM directory name).
///
/// # Errors
/// The operating system's random source fails: no id is made up from a clock.
pub(crate) fn new_instance_id() -> Result<String, SandboxError> {
    host_state::random_hex(12)
        .map(|hex| format!("vm-{hex}"))
        .map_err(|source| {
            io_error(
                "draw an instance id",
                Path::new("the random source"),
                source,
            )
        })
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

pub(crate) fn io_error(
    operation: &'static str,
    path: &Path,
    source: std::io::Error,
) -> SandboxError {
    SandboxError::Io {
        operation,
        path: path.display().to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            scope: "tenant".into(),
            thread_id: "t1".into(),
            agent_id: "agent".into(),
            call_id: String::new(),
            kind: "shell".into(),
            instance: new_instance_id().unwrap(),
            storage_base: "/maf-sandbox/workspace".into(),
            created: now_secs(),
            retired: None,
            egress: None,
        }
    }

    #[test]
    fn a_record_round_trips_and_names_its_key() {
        let state = tempfile::tempdir().unwrap();
        let record = record();
        let slot = Slot::new(state.path(), &NamePrefix::default(), &record.key(), "shell");
        assert_eq!(slot.read_record().unwrap(), None);
        std::fs::create_dir_all(&slot.dir).unwrap();
        slot.write_record(&record).unwrap();
        assert_eq!(slot.read_record().unwrap(), Some(record.clone()));
        assert_eq!(
            record.key(),
            SandboxKey::conversation("tenant", "t1", "agent")
        );
        slot.remove_record().unwrap();
        slot.remove_record().unwrap();
        slot.remove_if_empty();
        assert!(!slot.dir.exists());
    }

    #[test]
    fn a_garbled_record_is_an_error_not_a_missing_one() {
        let state = tempfile::tempdir().unwrap();
        let slot = Slot::new(
            state.path(),
            &NamePrefix::default(),
            &SandboxKey::conversation("s", "t", "a"),
            "k",
        );
        std::fs::create_dir_all(&slot.dir).unwrap();
        std::fs::write(slot.dir.join(RECORD), b"{not json").unwrap();
        assert!(slot.read_record().is_err());
    }

    #[test]
    fn names_group_by_key_and_by_conversation() {
        let state = tempfile::tempdir().unwrap();
        let prefix = NamePrefix::new("qemu").unwrap();
        let a = SandboxKey::conversation("s", "t", "a");
        let b = SandboxKey::conversation("s", "t", "b");
        let other = SandboxKey::conversation("s", "u", "a");
        for (key, kind) in [(&a, "x"), (&a, "y"), (&b, "x"), (&other, "x")] {
            std::fs::create_dir_all(Slot::new(state.path(), &prefix, key, kind).dir).unwrap();
        }
        let of_a = slots_with_prefix(state.path(), &key_prefix(&prefix, &a)).unwrap();
        assert_eq!(of_a.len(), 2);
        let of_t =
            slots_with_prefix(state.path(), &conversation_prefix(&prefix, "s", "t")).unwrap();
        assert_eq!(of_t.len(), 3);
        assert!(of_t.iter().all(|slot| slot.name.starts_with("qemu-")));
    }

    #[tokio::test]
    async fn the_lock_is_exclusive_across_open_files() {
        let state = tempfile::tempdir().unwrap();
        let slot = Slot::new(
            state.path(),
            &NamePrefix::default(),
            &SandboxKey::conversation("s", "t", "a"),
            "k",
        );
        let held = slot.lock().await.unwrap();
        let second = tokio::time::timeout(std::time::Duration::from_millis(200), slot.lock()).await;
        assert!(
            second.is_err(),
            "a second lock waits while the first is held"
        );
        drop(held);
        let _again = tokio::time::timeout(std::time::Duration::from_secs(5), slot.lock())
            .await
            .expect("free once dropped")
            .unwrap();
    }

    #[tokio::test]
    async fn retiring_marks_only_the_named_instance_once_and_creates_nothing() {
        let state = tempfile::tempdir().unwrap();
        let record = record();
        let slot = Slot::new(state.path(), &NamePrefix::default(), &record.key(), "shell");
        let wait = std::time::Duration::from_millis(300);
        // No lock file: the name was disposed of, and nothing is made again.
        assert!(!slot.retire(&record.instance, "why", wait).await.unwrap());
        assert!(!slot.dir.exists());

        let held = slot.lock().await.unwrap();
        slot.write_record(&record).unwrap();
        // Another holder keeps the lock past the wait: the record is left alone.
        let refused = slot.retire(&record.instance, "why", wait).await;
        assert!(
            matches!(refused, Err(SandboxError::Io { .. })),
            "{refused:?}"
        );
        drop(held);
        assert!(!slot
            .retire("vm-000000000000", "not ours", wait)
            .await
            .unwrap());
        assert!(slot.retire(&record.instance, "wedged", wait).await.unwrap());
        assert!(!slot.retire(&record.instance, "again", wait).await.unwrap());
        let read = slot.read_record().unwrap().unwrap();
        assert_eq!(read.retired.as_deref(), Some("wedged"));
    }

    #[test]
    fn instance_ids_are_vm_directory_names_and_differ() {
        let a = new_instance_id().unwrap();
        assert!(a.starts_with("vm-") && a.len() == 15, "{a}");
        assert!(a[3..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_instance_id().unwrap());
    }
}
