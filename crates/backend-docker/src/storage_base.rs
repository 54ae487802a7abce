//! The storage base: the directories of a sandbox's working directory, made before anything
//! else runs in it, engine-side where the guest cannot race the host (a new container's, or a
//! guest that cannot make them itself), and walked engine-side afterwards: the guest's word is
//! never taken for what the base's components are (docs/docker-backend.md#storage-base).

use std::sync::Arc;

use sandbox_core::storage_base::{plan_storage_base, storage_base_directories};
use sandbox_core::{EntryKind, SandboxError};
use tokio::time::Instant;

use crate::archive::{Archive, STAT_CONCURRENCY};
use crate::bounded::bounded_join;
use crate::config::DockerConfig;
use crate::tar_header::directory_entry;

/// How often an adopted container is looked at again: its name re-inspected by an acquire, its
/// base re-walked while its creator may be making it.
pub(crate) const ADOPT_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Walks and writes storage bases through the archive endpoints.
#[derive(Debug)]
pub(crate) struct StorageBase {
    archive: Arc<Archive>,
    /// The adopt budget: one command timeout.
    config: Arc<DockerConfig>,
}

impl StorageBase {
    pub(crate) fn new(archive: Arc<Archive>, config: Arc<DockerConfig>) -> Self {
        StorageBase { archive, config }
    }

    /// Another process created this container a moment ago and may be preparing the same base:
    /// while the engine-side walk finds it missing, give that process the adopt budget before
    /// doing it a second time.
    pub(crate) async fn await_adopted(&self, id: &str, base: &str) -> Result<(), SandboxError> {
        let until = Instant::now() + self.config.command_timeout;
        let mut missing = self.plan(id, base).await?;
        while !missing.is_empty() && Instant::now() < until {
            tokio::time::sleep(ADOPT_POLL).await;
            missing = self.plan(id, base).await?;
        }
        Ok(())
    }

    /// The host's part of a new container's storage base from the start of its guest call: the
    /// engine-side walk (its refusals: a link or a non-directory among the components), then,
    /// with an owner `predicted`, the missing suffix written with it once the engine answered the
    /// exec's start (the upload holds the container's lock in the engine, which the start's
    /// checks take too: after them, the two overlap).
    pub(crate) async fn early(
        &self,
        id: &str,
        base: &str,
        predicted: Option<(u64, u64)>,
        started: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<EarlyBase, SandboxError> {
        let missing = self.plan(id, base).await?;
        let written = match predicted {
            Some((uid, gid)) if !missing.is_empty() => {
                if started.await.is_err() {
                    return Err(SandboxError::engine(
                        "the guest call of the acquire did not start",
                    ));
                }
                self.put(id, &missing, uid, gid).await?;
                Some((uid, gid))
            }
            _ => None,
        };
        Ok(EarlyBase { missing, written })
    }

    /// Once the guest of a new container reported its ids: the missing suffix is the guest's, or
    /// is written (again) with its ids. The engine applies an archive entry's owner to a
    /// directory that exists, so a wrong prediction is corrected in place.
    pub(crate) async fn settle(
        &self,
        id: &str,
        early: EarlyBase,
        (uid, gid): (u64, u64),
    ) -> Result<(), SandboxError> {
        if early.missing.is_empty() || early.written == Some((uid, gid)) {
            return Ok(());
        }
        if let Some(predicted) = early.written {
            tracing::info!(container = %id, ?predicted, uid, gid, "the guest's ids differ from the predicted owner; writing the base again");
        }
        self.put(id, &early.missing, uid, gid).await
    }

    /// The guest of a container this call did not create could not make the storage base: the
    /// missing suffix the engine-side walk finds is created engine-side, owned by the guest's
    /// ids, in an order the guest (which may be running) cannot race ([`guarded_base_archive`]).
    pub(crate) async fn create_fallback(
        &self,
        id: &str,
        base: &str,
        (uid, gid): (u64, u64),
    ) -> Result<(), SandboxError> {
        let missing = self.plan(id, base).await?;
        if missing.is_empty() {
            return Ok(());
        }
        self.archive
            .put_archive(id, "/", guarded_base_archive(&missing, uid, gid)?)
            .await
    }

    /// The engine-side walk of the base's directories, decided by the core.
    pub(crate) async fn plan(&self, id: &str, base: &str) -> Result<Vec<String>, SandboxError> {
        let directories = storage_base_directories(base)?;
        let stats = bounded_join(
            directories
                .iter()
                .map(|d| self.archive.stat_kind(id, d.clone()))
                .collect(),
            STAT_CONCURRENCY,
        )
        .await;
        let mut kinds: Vec<Option<EntryKind>> = Vec::new();
        for stat in stats {
            let kind = stat?;
            kinds.push(kind);
            if kind.is_none() {
                break;
            }
        }
        plan_storage_base(base, &kinds)
    }

    /// One tar of the base's missing directories, extracted at `/` by the engine, each owned by
    /// `uid` and `gid` (nothing of the guest's but the keep-alive runs yet).
    async fn put(
        &self,
        id: &str,
        missing: &[String],
        uid: u64,
        gid: u64,
    ) -> Result<(), SandboxError> {
        self.archive
            .put_archive(id, "/", base_archive(missing, uid, gid)?)
            .await
    }
}

/// What [`StorageBase::early`] found and did.
pub(crate) struct EarlyBase {
    /// The base's missing suffix, outermost first.
    missing: Vec<String>,
    /// The owner it was written with, when it was.
    written: Option<(u64, u64)>,
}

/// The owner a `Config.User` of the numeric form `uid:gid` names, without any lookup.
pub(crate) fn numeric_owner(user: &str) -> Option<(u64, u64)> {
    let (uid, gid) = user.split_once(':')?;
    let number = |text: &str| {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    Some((number(uid)?, number(gid)?))
}

/// The tar of directory entries (0755, owned by `uid` and `gid`) making `missing` at `/`.
fn base_archive(missing: &[String], uid: u64, gid: u64) -> Result<Vec<u8>, SandboxError> {
    directory_archive(missing.iter().map(|directory| (directory, uid, gid)))
}

/// A tar of directory entries (0755), in the order given, each with its owner, then the end.
fn directory_archive<'a>(
    entries: impl Iterator<Item = (&'a String, u64, u64)>,
) -> Result<Vec<u8>, SandboxError> {
    let mut archive = Vec::new();
    for (directory, uid, gid) in entries {
        let name = format!("{}/", directory.trim_start_matches('/'));
        archive.extend(directory_entry(&name, uid, gid).map_err(SandboxError::invalid)?);
    }
    archive.extend([0u8; 1024]);
    Ok(archive)
}

/// The missing directories for a container the guest may be running in, in one tar the engine
/// extracts in order: first each directory, top down, owned by root (0755), then each again,
/// bottom up, owned by `uid` and `gid` (the engine applies an entry's owner and mode to a
/// directory that exists). Each directory becomes the guest's only after every directory below
/// it has, and while its own parent is still root's, so no path the extraction changes can be
/// moved by the guest while it does: the guest writes in none of them yet. No pause: an engine
/// freeze that catches another caller's exec half-started holds the container until its host
/// thaws it by hand (docs/docker-backend.md#storage-base).
fn guarded_base_archive(missing: &[String], uid: u64, gid: u64) -> Result<Vec<u8>, SandboxError> {
    let skeleton = missing.iter().map(|directory| (directory, 0, 0));
    let handed_over = missing.iter().rev().map(|directory| (directory, uid, gid));
    directory_archive(skeleton.chain(handed_over))
}

/// Any directory of the base the last walk did not find is an engine error.
pub(crate) fn still_missing(base: &str, missing: &[String]) -> Result<(), SandboxError> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(SandboxError::engine(format!(
        "the storage base {base} is still missing {} after it was created",
        missing.join(", ")
    )))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_numeric_uid_and_gid_name_an_owner_without_a_lookup() {
        assert_eq!(numeric_owner("1000:1000"), Some((1000, 1000)));
        assert_eq!(numeric_owner("0:5"), Some((0, 5)));
        for needs_a_lookup in [
            "",
            "agent",
            "1000",
            "agent:1000",
            "1000:agent",
            ":1000",
            "1000:",
            "-1:2",
            "+1:2",
            "1:2:3",
            " 1:2",
            "99999999999999999999999:1",
        ] {
            assert_eq!(numeric_owner(needs_a_lookup), None, "{needs_a_lookup:?}");
        }
    }

    fn entries_of(archive: &[u8]) -> Vec<(String, u64, u64, u32)> {
        tar::Archive::new(archive)
            .entries()
            .unwrap()
            .map(|entry| {
                let header = entry.unwrap().header().clone();
                (
                    header.path().unwrap().display().to_string(),
                    header.uid().unwrap(),
                    header.gid().unwrap(),
                    header.mode().unwrap(),
                )
            })
            .collect()
    }

    /// Root's skeleton top down, then the guest's ownership bottom up: when a directory becomes
    /// the guest's, everything below it already is and its parent is still root's.
    #[test]
    fn the_guarded_base_archive_gives_each_directory_away_deepest_first() {
        let missing = [
            "/srv/a".to_owned(),
            "/srv/a/b".to_owned(),
            "/srv/a/b/work".to_owned(),
        ];
        let archive = guarded_base_archive(&missing, 1000, 100).unwrap();
        assert_eq!(archive.len(), 512 * 6 + 1024);
        assert!(archive[archive.len() - 1024..].iter().all(|&b| b == 0));
        let entries = entries_of(&archive);
        assert_eq!(
            entries,
            [
                ("srv/a/".to_owned(), 0, 0, 0o755),
                ("srv/a/b/".to_owned(), 0, 0, 0o755),
                ("srv/a/b/work/".to_owned(), 0, 0, 0o755),
                ("srv/a/b/work/".to_owned(), 1000, 100, 0o755),
                ("srv/a/b/".to_owned(), 1000, 100, 0o755),
                ("srv/a/".to_owned(), 1000, 100, 0o755),
            ]
        );
        // The ordering property, for any depth: when entry i gives a directory to the guest,
        // every directory the archive holds below it is the guest's already, and every one above
        // it is still root's.
        for (i, (name, ..)) in entries.iter().enumerate().filter(|(_, e)| e.1 == 1000) {
            let owner_before = |other: &str| {
                entries[..i]
                    .iter()
                    .rev()
                    .find(|(n, ..)| n == other)
                    .map(|e| e.1)
            };
            for (other, ..) in &entries[..3] {
                if other.len() > name.len() && other.starts_with(name.as_str()) {
                    assert_eq!(owner_before(other), Some(1000), "{other} under {name}");
                }
                if other.len() < name.len() && name.starts_with(other.as_str()) {
                    assert_eq!(owner_before(other), Some(0), "{other} above {name}");
                }
            }
        }
        assert!(guarded_base_archive(&[], 1000, 100).unwrap() == vec![0u8; 1024]);
    }

    #[test]
    fn the_base_archive_holds_the_missing_directories_then_the_end() {
        let missing = ["/maf-sandbox".to_owned(), "/maf-sandbox/work".to_owned()];
        let archive = base_archive(&missing, 1000, 100).unwrap();
        assert_eq!(archive.len(), 512 * 2 + 1024);
        let seen = entries_of(&archive);
        assert_eq!(
            seen,
            [
                ("maf-sandbox/".to_owned(), 1000, 100, 0o755),
                ("maf-sandbox/work/".to_owned(), 1000, 100, 0o755)
            ]
        );
    }
}
