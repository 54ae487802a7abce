//! The file copy of a fork: what a container changed against its image (the engine's change
//! list), made again in another container of the same image. Deleted paths are removed as the
//! guest; every added or changed path is streamed from one container's archive endpoint into the
//! other's, so bytes, modes, owners and links arrive as the engine's tar carries them. Processes
//! are not copied: a fork's container runs only what its own acquire started.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bollard::models::ChangeType;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures_util::StreamExt as _;
use sandbox_core::SandboxError;

use crate::config::DockerConfig;
use crate::connection::{quote, ApiFailure, EngineConnection};
use crate::exec::Execs;

/// Output budget of the removal of deleted paths (`rm` prints only its complaints).
const REMOVE_BUDGET: u64 = 64 * 1024;

/// How many paths one `rm` names, so no argv nears the kernel's limit.
const REMOVE_BATCH: usize = 256;

/// Where the engine's own files of a container live, and the files it mounts into each one
/// (its name, its hosts, its resolver, its init): never copied, the engine makes the fork's own.
/// The init's mount point is made in the container's own layer when it first starts, so the
/// change list names it; an archive write over it would replace the file the mount sits on,
/// and every later call (which runs under that init) would find an empty file there.
/// An image whose `/sbin` links to `usr/sbin` (merged `/usr`) has the mount point there.
const ENGINE_TREES: [&str; 8] = [
    "/proc",
    "/sys",
    "/dev",
    "/etc/hostname",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/sbin/docker-init",
    "/usr/sbin/docker-init",
];

/// One entry of the engine's change list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Changed in place (content, mode, owner, or a directory whose entries changed).
    Modified,
    /// Not in the image.
    Added,
    /// In the image, removed since.
    Deleted,
}

/// What to do to a fresh container of the same image so its files are the source's.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CopyPlan {
    /// Paths to remove first (deleted in the source), none under another.
    pub(crate) remove: Vec<String>,
    /// Paths to copy whole, none under another: each added path whose parent was not added,
    /// and each changed path under which nothing else changed (a file, or a directory changed
    /// only in itself).
    pub(crate) copy: Vec<String>,
}

/// Plans the copy from a change list. A directory listed as changed because something under it
/// changed is not copied whole: the entries under it that changed are. Its own mode, owner and
/// times are then the image's, not the source's.
pub(crate) fn copy_plan(changes: &[(String, Change)]) -> CopyPlan {
    let kinds: BTreeMap<&str, Change> = changes
        .iter()
        .filter(|(path, _)| path.starts_with('/') && !in_engine_tree(path))
        .map(|(path, kind)| (path.as_str(), *kind))
        .collect();
    let has_ancestor = |path: &str, wanted: Change| {
        ancestors(path).any(|ancestor| kinds.get(ancestor) == Some(&wanted))
    };
    // From every listed path, the engine's own included: a directory whose only changes are
    // the engine's mounts (`/etc`) is not a leaf to copy whole.
    let parents: BTreeSet<&str> = changes
        .iter()
        .flat_map(|(path, _)| ancestors(path))
        .collect();
    let mut plan = CopyPlan::default();
    for (&path, &kind) in &kinds {
        if has_ancestor(path, Change::Added) || has_ancestor(path, Change::Deleted) {
            continue;
        }
        match kind {
            Change::Deleted => plan.remove.push(path.to_owned()),
            Change::Added => plan.copy.push(path.to_owned()),
            Change::Modified if !parents.contains(path) => plan.copy.push(path.to_owned()),
            Change::Modified => {}
        }
    }
    plan
}

/// The strict ancestors of an absolute path, nearest first, `/` excluded.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = path;
    std::iter::from_fn(move || {
        let cut = rest.rfind('/')?;
        rest = &rest[..cut];
        (!rest.is_empty()).then_some(rest)
    })
}

fn in_engine_tree(path: &str) -> bool {
    ENGINE_TREES
        .iter()
        .any(|tree| path == *tree || path.starts_with(&format!("{tree}/")))
}

/// The directory a path's archive is extracted into.
fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(cut) => &path[..cut],
    }
}

/// Copies one container's changed files into another of the same image, every engine call
/// under the command timeout.
#[derive(Debug)]
pub(crate) struct ForkCopy {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    execs: Arc<Execs>,
}

impl ForkCopy {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        execs: Arc<Execs>,
    ) -> Self {
        ForkCopy {
            engine,
            config,
            execs,
        }
    }

    /// Makes `target`'s files those of `source` at this moment: removes what the source deleted,
    /// then streams each planned path. A path the source removed between its change list and
    /// its copy is skipped (the copy is of "this moment", and that moment has passed for it).
    ///
    /// # Errors
    /// The engine's failures, named with the path; a path whose kind differs between the two
    /// containers (a directory in one, a file in the other) is refused by the engine.
    pub(crate) async fn copy(&self, source: &str, target: &str) -> Result<(), SandboxError> {
        let plan = copy_plan(&self.changes(source).await?);
        for batch in plan.remove.chunks(REMOVE_BATCH) {
            self.remove(target, batch).await?;
        }
        for path in &plan.copy {
            self.copy_path(source, target, path).await?;
        }
        Ok(())
    }

    /// The engine's change list of `id` against its image.
    async fn changes(&self, id: &str) -> Result<Vec<(String, Change)>, SandboxError> {
        let engine = &self.engine;
        let listed = engine
            .call(
                self.config.command_timeout,
                engine.api().container_changes(id),
            )
            .await
            .map_err(|failure| gone_or(engine, id, "the change list", failure))?;
        Ok(listed
            .unwrap_or_default()
            .into_iter()
            .map(|change| {
                let kind = match change.kind {
                    ChangeType::_1 => Change::Added,
                    ChangeType::_2 => Change::Deleted,
                    ChangeType::_0 => Change::Modified,
                };
                (change.path, kind)
            })
            .collect())
    }

    /// Removes `paths` in `target` as its guest user, under the command timeout.
    async fn remove(&self, target: &str, paths: &[String]) -> Result<(), SandboxError> {
        let mut argv = vec!["rm".to_owned(), "-rf".to_owned(), "--".to_owned()];
        argv.extend(paths.iter().cloned());
        let run = self
            .execs
            .exec_collect(target, argv, Vec::new(), REMOVE_BUDGET);
        let collected = tokio::time::timeout(self.config.command_timeout, run)
            .await
            .map_err(|_| SandboxError::EngineTimeout {
                operation: "the removal of a fork's deleted paths".to_owned(),
                bound: self.config.command_timeout,
            })?
            .map_err(|failure| {
                self.execs
                    .exec_failure(target, "the removal of a fork's deleted paths", failure)
            })?;
        if collected.exit_code != 0 {
            return Err(SandboxError::engine(format!(
                "the fork could not remove the paths its source deleted (exit {}): {}",
                collected.exit_code,
                quote(&collected.stderr)
            )));
        }
        Ok(())
    }

    /// Streams the archive of `path` from `source` into its parent in `target`, the download
    /// pulled only as fast as the upload takes it.
    async fn copy_path(&self, source: &str, target: &str, path: &str) -> Result<(), SandboxError> {
        let api = self.engine.api();
        let options = DownloadFromContainerOptionsBuilder::new()
            .path(path)
            .build();
        let mut download = api.download_from_container(source, Some(options));
        let deadline = self.config.command_timeout;
        // The first chunk says whether the path is still there, before anything is uploaded.
        let first = match tokio::time::timeout(deadline, download.next()).await {
            Err(_) => {
                return Err(SandboxError::EngineTimeout {
                    operation: format!("the fork's read of {path:?}"),
                    bound: deadline,
                })
            }
            Ok(None) => return Ok(()),
            Ok(Some(Err(error))) => {
                let failure = ApiFailure::from(error);
                if failure.is_not_found() {
                    return Ok(());
                }
                return Err(self
                    .engine
                    .failure(&format!("the fork's read of {path:?}"), failure));
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        let body = futures_util::stream::once(async move { Ok(first) }).chain(
            download.map(|chunk| chunk.map_err(|error| std::io::Error::other(error.to_string()))),
        );
        let options = UploadToContainerOptionsBuilder::new()
            .path(parent_of(path))
            .no_overwrite_dir_non_dir("true")
            .build();
        self.engine
            .call(
                deadline,
                api.upload_to_container(target, Some(options), bollard::body_try_stream(body)),
            )
            .await
            .map_err(|failure| {
                self.engine
                    .failure(&format!("the fork's write of {path:?}"), failure)
            })
    }
}

/// An absent container is SandboxGone; anything else is the engine's failure.
fn gone_or(engine: &EngineConnection, id: &str, what: &str, failure: ApiFailure) -> SandboxError {
    if failure.is_not_found() {
        return SandboxError::SandboxGone {
            instance: id.to_owned(),
        };
    }
    engine.failure(what, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(changes: &[(&str, Change)]) -> CopyPlan {
        let owned: Vec<(String, Change)> = changes
            .iter()
            .map(|(path, kind)| ((*path).to_owned(), *kind))
            .collect();
        copy_plan(&owned)
    }

    #[test]
    fn added_trees_are_copied_once_from_their_top() {
        let p = plan(&[
            ("/maf-sandbox", Change::Added),
            ("/maf-sandbox/work", Change::Added),
            ("/maf-sandbox/work/a.txt", Change::Added),
            ("/var", Change::Modified),
            ("/var/tmp", Change::Modified),
            ("/var/tmp/fixture", Change::Added),
            ("/var/tmp/fixture/big.bin", Change::Added),
        ]);
        assert_eq!(p.copy, ["/maf-sandbox", "/var/tmp/fixture"]);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn changed_leaves_are_copied_and_their_parents_are_not() {
        let p = plan(&[
            ("/etc", Change::Modified),
            ("/etc/motd", Change::Modified),
            ("/usr", Change::Modified),
            ("/usr/share", Change::Modified),
            ("/usr/share/doc", Change::Deleted),
            ("/usr/share/doc/x", Change::Deleted),
            ("/opt", Change::Modified),
        ]);
        // /opt changed in itself only (a mode): copied whole; /usr's change is a deletion.
        assert_eq!(p.copy, ["/etc/motd", "/opt"]);
        assert_eq!(p.remove, ["/usr/share/doc"]);
    }

    #[test]
    fn the_engines_trees_and_relative_paths_are_never_planned() {
        let p = plan(&[
            ("/dev", Change::Modified),
            ("/dev/shm/x", Change::Added),
            ("/proc/1", Change::Modified),
            ("/sys", Change::Added),
            ("/etc", Change::Modified),
            ("/etc/hostname", Change::Added),
            ("/etc/hosts", Change::Modified),
            ("/sbin", Change::Modified),
            ("/sbin/docker-init", Change::Added),
            ("relative", Change::Added),
            ("/devices", Change::Added),
        ]);
        assert_eq!(p.copy, ["/devices"]);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn paths_and_parents() {
        assert_eq!(ancestors("/a/b/c").collect::<Vec<_>>(), ["/a/b", "/a"]);
        assert_eq!(ancestors("/a").count(), 0);
        assert_eq!(parent_of("/a"), "/");
        assert_eq!(parent_of("/a/b/c"), "/a/b");
    }
}
