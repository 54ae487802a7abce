//! Disposal, listing and the second record.
//!
//! sbx has no labels: ownership lives in the name (digests of the key and kind) and in the
//! directory of that name under the workspace root. A sweep reads both, so it works from another
//! process and when the daemon has lost its engine and lists nothing. `sbx rm` takes only a
//! name, so one instance is disposed of by checking its id in `ls` first (a process that
//! replaces it in between loses the replacement: a documented residual). Afterwards only host
//! entries captured before the removal are deleted, never a workspace a new create made.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use sandbox_core::naming::sbx::{sbx_conversation_prefix, sbx_key_prefix, sbx_sandbox_name};
use sandbox_core::{
    DisposalCode, DisposalFailure, DisposeSelector, SandboxError, SandboxKey, SandboxState,
    SandboxSummary, ScopePurge,
};
use sbx_cli::{Error as CliError, LsRow, Removal};

use crate::engine::{sbx_name, short_exec, to_sandbox_error};
use crate::guest_scripts::presence_argv;
use crate::host::SbxHost;
use crate::layout::{self, Record};

/// The workspace generation a row mounts, when it is exactly one directory directly under
/// `<root>/<name>/` named `ws-…`.
pub(crate) fn row_generation(root: &Path, name: &str, row: &LsRow) -> Option<String> {
    let [only] = row.workspaces.as_slice() else {
        return None;
    };
    let dir = layout::name_dir(root, name);
    let generation = only.strip_prefix(&dir).ok()?.to_str()?;
    layout::is_generation_name(generation).then(|| generation.to_owned())
}

#[cold]
fn failure(code: DisposalCode, name: &str, detail: impl std::fmt::Display) -> DisposalFailure {
    DisposalFailure::new(code, format!("{name}: {detail}"))
}

/// Runs blocking layout work on the blocking pool; any failure is `unknown`.
async fn on_disk<T, F>(name: &str, work: F) -> Result<T, DisposalFailure>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(failure(DisposalCode::Unknown, name, error)),
        Err(error) => Err(failure(DisposalCode::Unknown, name, error)),
    }
}

impl SbxHost {
    /// Removes the sandbox `name` (only the instance `instance_id` when given) and clears what
    /// it left on the host. `Ok(true)` when a sandbox was removed or leftovers were cleared.
    /// The caller holds the name's lock.
    pub(crate) async fn remove_one(
        &self,
        name: &str,
        instance_id: Option<&str>,
        generation: Option<String>,
    ) -> Result<bool, DisposalFailure> {
        let root = self.config.root.clone();
        let dir = layout::name_dir(&root, name);
        let sbx = sbx_name(name).map_err(|e| failure(DisposalCode::Unknown, name, e))?;
        let mut generation = generation;
        if let Some(instance) = instance_id {
            let rows = self
                .cli
                .ls()
                .await
                .map_err(|e| failure(DisposalCode::Unlisted, name, e))?;
            let Some(row) = rows.iter().find(|row| row.name == name) else {
                return if dir.exists() {
                    self.remove_unlisted(name, instance).await
                } else {
                    Ok(false)
                };
            };
            if row.id.as_deref() != Some(instance) {
                // A replacement (or nothing of this instance) is never touched.
                return Ok(false);
            }
            generation = generation.or_else(|| row_generation(&root, name, row));
        }
        let name_only = instance_id.is_none() && generation.is_none();
        let held = {
            let (dir, generation) = (dir.clone(), generation.clone());
            on_disk(name, move || {
                layout::held_entries(&dir, generation.as_deref(), name_only)
            })
            .await?
        };
        let removed = match self.cli.rm(&sbx).await {
            Ok(Removal::Removed) => true,
            Ok(_) => false,
            Err(CliError::Timeout { bound, .. }) => {
                return Err(failure(
                    DisposalCode::Timeout,
                    name,
                    format!("sbx rm did not finish within {bound:?}"),
                ))
            }
            Err(error @ (CliError::DaemonFault { .. } | CliError::SpawnFailed { .. })) => {
                return Err(failure(DisposalCode::Unreachable, name, error))
            }
            Err(error) => return Err(failure(DisposalCode::Refused, name, error)),
        };
        let cleared = !held.is_empty();
        on_disk(name, move || layout::clear(&dir, &held)).await?;
        Ok(removed || cleared)
    }

    /// A record's instance that `ls` does not list: the sandbox itself is asked. It answering
    /// is an engine fault (`unreachable`), never a gone sandbox; confirmed absent, the recorded
    /// generation is cleared if the record still names that instance.
    async fn remove_unlisted(
        &self,
        name: &str,
        instance_id: &str,
    ) -> Result<bool, DisposalFailure> {
        let sbx = sbx_name(name).map_err(|e| failure(DisposalCode::Unknown, name, e))?;
        let probe = short_exec(
            &self.cli,
            &sbx,
            presence_argv(),
            false,
            self.config.command_timeout,
        )
        .await;
        match probe {
            Err(CliError::Timeout { .. }) => {
                return Err(failure(
                    DisposalCode::Timeout,
                    name,
                    "the presence probe did not finish",
                ))
            }
            Err(error) => return Err(failure(DisposalCode::Unknown, name, error)),
            Ok(output) if output.status == bounded_process::ExitKind::Exited(0) => {
                return Err(failure(
                    DisposalCode::Unreachable,
                    name,
                    "the sandbox answers but is missing from `sbx ls`; the daemon lost track of \
                     its VMs; fix with `sbx daemon restart`",
                ))
            }
            Ok(output) => match sbx_cli::classify_output(
                sbx_cli::Call::Exec,
                Some(name),
                output.status,
                &output.stderr,
            ) {
                CliError::NotFound { .. } => {}
                CliError::DaemonFault { .. } => {
                    return Err(failure(
                        DisposalCode::Unreachable,
                        name,
                        "the sbx daemon faulted",
                    ))
                }
                other => return Err(failure(DisposalCode::Unknown, name, other)),
            },
        }
        let dir = layout::name_dir(&self.config.root, name);
        let instance = instance_id.to_owned();
        on_disk(name, move || {
            let Some(record) = layout::read_record(&dir)? else {
                return Ok(false);
            };
            if record.instance_id.as_deref() != Some(instance.as_str()) {
                return Ok(false);
            }
            layout::clear(&dir, std::slice::from_ref(&record.workspace))?;
            Ok(true)
        })
        .await
    }

    /// Every name with `prefix`, from `ls` and from the directories under the root, each removed
    /// in sorted order under its lock.
    pub(crate) async fn sweep(&self, prefix: &str, instance_id: Option<&str>) -> ScopePurge {
        let mut failures = Vec::new();
        let mut names = BTreeSet::new();
        match self.cli.ls().await {
            Ok(rows) => names.extend(
                rows.into_iter()
                    .map(|row| row.name)
                    .filter(|name| name.starts_with(prefix)),
            ),
            Err(error) => failures.push(failure(DisposalCode::Unlisted, prefix, error)),
        }
        let root = self.config.root.clone();
        let owned_prefix = prefix.to_owned();
        match on_disk(prefix, move || {
            layout::names_under_root(&root, &owned_prefix)
        })
        .await
        {
            Ok(dirs) => names.extend(dirs),
            Err(error) => failures.push(DisposalFailure::new(DisposalCode::Unlisted, error.detail)),
        }
        let mut disposed = 0;
        for name in names {
            let _guard = self.locks.lock(name.clone()).await;
            match self.remove_one(&name, instance_id, None).await {
                Ok(true) => disposed += 1,
                Ok(false) => {}
                Err(failure) => failures.push(failure),
            }
        }
        ScopePurge {
            disposed,
            undisposed: DisposalFailure::fold(failures),
        }
    }
}

/// Disposes of a key's sandboxes (one kind, or every kind; one instance when named). Never raises.
pub(crate) async fn dispose(
    host: &Arc<SbxHost>,
    key: &SandboxKey,
    selector: DisposeSelector,
) -> Option<DisposalFailure> {
    let prefix = match &selector.kind {
        Some(kind) => sbx_sandbox_name(&host.config.prefix, key, kind),
        None => sbx_key_prefix(&host.config.prefix, key),
    };
    host.sweep(&prefix, selector.instance_id.as_deref())
        .await
        .undisposed
}

/// Disposes of every sandbox of a conversation, whoever created it. Never raises.
pub(crate) async fn dispose_scope(host: &Arc<SbxHost>, scope: &str, thread_id: &str) -> ScopePurge {
    let key = SandboxKey::conversation(scope, thread_id, "");
    let prefix = sbx_conversation_prefix(&host.config.prefix, &key);
    host.sweep(&prefix, None).await
}

/// The key a record names.
pub(crate) fn record_key(record: &Record) -> SandboxKey {
    let [scope, thread, agent, call] = record.key.clone();
    SandboxKey::conversation(scope, thread, agent).with_call(call)
}

/// The state of a recorded instance given its `ls` row.
pub(crate) fn summary_state(retired: bool, row: Option<&LsRow>) -> SandboxState {
    if retired {
        return SandboxState::Retired;
    }
    match row.and_then(|row| row.status.as_deref()) {
        None if row.is_none() => SandboxState::Unlisted,
        Some("running") => SandboxState::Running,
        Some("stopped") => SandboxState::Stopped,
        Some(other) => SandboxState::Other(other.to_owned()),
        None => SandboxState::Other("unknown".to_owned()),
    }
}

/// Every finished sandbox of a scope (or one conversation of it), from `ls` and the records.
pub(crate) async fn list(
    host: &Arc<SbxHost>,
    scope: &str,
    thread_id: Option<&str>,
) -> Result<Vec<SandboxSummary>, SandboxError> {
    let rows = host.cli.ls().await.map_err(to_sandbox_error)?;
    let prefix = match thread_id {
        Some(thread) => sbx_conversation_prefix(
            &host.config.prefix,
            &SandboxKey::conversation(scope, thread, ""),
        ),
        // Names do not reveal the scope: every record of this backend is read.
        None => format!("{}-", host.config.prefix),
    };
    let root = host.config.root.clone();
    let mut names: BTreeSet<String> = rows
        .iter()
        .map(|row| row.name.clone())
        .filter(|name| name.starts_with(&prefix))
        .collect();
    let records = {
        let prefix = prefix.clone();
        let under = root.clone();
        tokio::task::spawn_blocking(
            move || -> std::io::Result<Vec<(String, Record, Option<std::time::SystemTime>)>> {
                let root = under;
                let mut names = names_with(&root, &prefix)?;
                names.sort();
                let mut out = Vec::new();
                for name in names {
                    let dir = layout::name_dir(&root, &name);
                    match layout::read_record(&dir) {
                        Ok(Some(record)) => out.push((name, record, layout::record_mtime(&dir))),
                        Ok(None) => {}
                        Err(error) => {
                            tracing::warn!(sandbox = %name, %error, "skipped an unreadable record")
                        }
                    }
                }
                Ok(out)
            },
        )
        .await
        .map_err(|e| SandboxError::engine(format!("reading the records did not finish: {e}")))?
        .map_err(|source| SandboxError::Io {
            operation: "list",
            path: root.display().to_string(),
            source,
        })?
    };
    let mut summaries = Vec::new();
    for (name, record, modified) in records {
        names.remove(&name);
        let key = record_key(&record);
        if key.scope != scope || thread_id.is_some_and(|t| key.thread_id != t) {
            continue;
        }
        let Some(instance) = record.instance_id.clone() else {
            continue;
        };
        let row = rows
            .iter()
            .find(|row| row.name == name && row.id.as_deref() == Some(instance.as_str()));
        let retired = record.retires(&instance) || host.retired_reason(&instance).is_some();
        summaries.push(SandboxSummary {
            key: Some(key),
            kind: Some(record.kind.clone()),
            instance_id: instance,
            created: modified,
            state: summary_state(retired, row),
        });
    }
    summaries.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    Ok(summaries)
}

fn names_with(root: &Path, prefix: &str) -> std::io::Result<Vec<String>> {
    layout::names_under_root(root, prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, workspaces: &[&str], status: Option<&str>) -> LsRow {
        let json = serde_json::json!([{
            "name": name,
            "id": "abc",
            "status": status,
            "workspaces": workspaces,
        }]);
        sbx_cli::parse_ls(json.to_string().as_bytes())
            .unwrap()
            .remove(0)
    }

    #[test]
    fn the_generation_of_a_row() {
        let root = Path::new("/r");
        assert_eq!(
            row_generation(root, "n", &row("n", &["/r/n/ws-0123456789ab"], None)).as_deref(),
            Some("ws-0123456789ab")
        );
        for workspaces in [
            &[][..],
            &["/r/other/ws-0123456789ab"],
            &["/r/n/sub/ws-0123456789ab"],
            &["/r/n/ws-0123456789ab", "/r/n/ws-ba9876543210"],
            &["/r/n/work"],
        ] {
            assert_eq!(
                row_generation(root, "n", &row("n", workspaces, None)),
                None,
                "{workspaces:?}"
            );
        }
    }

    #[test]
    fn states() {
        assert_eq!(summary_state(true, None), SandboxState::Retired);
        assert_eq!(summary_state(false, None), SandboxState::Unlisted);
        let running = row("n", &[], Some("running"));
        assert_eq!(summary_state(false, Some(&running)), SandboxState::Running);
        let stopped = row("n", &[], Some("stopped"));
        assert_eq!(summary_state(false, Some(&stopped)), SandboxState::Stopped);
        let odd = row("n", &[], Some("paused"));
        assert_eq!(
            summary_state(false, Some(&odd)),
            SandboxState::Other("paused".into())
        );
    }
}
