//! The handle to one container: exec and the file methods (docker.md §6, §8, §9), design B.
//!
//! Every file method checks its path with the core's bundle, walking the ancestors with the
//! engine-side stat (`docker cp` in prefix mode: unconfined, no-follow, never answered by the
//! guest), then moves data or deletes with the **guest's own authority** through the wrapper.
//! A guest that swaps a checked component for a link between check and act can only redirect the
//! action to what it could reach itself (core.md rule 51).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    check_delete_async, check_list_async, check_read_async, check_write_async, confine,
    guest_path_join, guest_path_norm, guest_path_relative_to, resolve_wd, EntryKind, ExecOutput,
    ExecRequest, Sandbox, SandboxEntry, SandboxError, TransferLimits,
};

use crate::connection::quote as tail;
use crate::exec::{GuestCall, GuestEnd, SMALL_BUDGET};
use crate::state::BackendState;
use crate::guest_scripts::{
    parse_list_records, LIST_EXIT_CANNOT_ENTER, LIST_SCRIPT, WRITE_EXIT_IS_DIRECTORY,
    WRITE_EXIT_IS_LINK, WRITE_SCRIPT,
};
use crate::tar_header::TarStat;

/// Output budget of a listing.
const LIST_BUDGET: u64 = 8 * 1024 * 1024;

/// How long a refused read may take to end on its own before it is dropped (and killed).
const REFUSED_READ_GRACE: Duration = Duration::from_secs(2);

/// Room a guest read's budget keeps beyond the file's own bytes (nonce line, stderr).
const READ_SLACK: u64 = 64 * 1024;

/// A handle to one container, by id: a replacement under the same name is never reached.
#[derive(Debug)]
pub(crate) struct DockerSandbox {
    shared: Arc<BackendState>,
    id: String,
    base: String,
    fresh: bool,
    files_in: TransferLimits,
    files_out: TransferLimits,
}

impl DockerSandbox {
    pub(crate) fn new(
        shared: Arc<BackendState>,
        id: String,
        base: String,
        fresh: bool,
        files_in: TransferLimits,
        files_out: TransferLimits,
    ) -> Self {
        DockerSandbox {
            shared,
            id,
            base,
            fresh,
            files_in,
            files_out,
        }
    }

    /// The call's working directory: relative ones are confined to the storage base.
    fn wd(&self, wd: &str) -> Result<String, SandboxError> {
        Ok(guest_path_norm(&resolve_wd(wd, &self.base)?))
    }

    async fn stat_kind(&self, path: String) -> Result<Option<EntryKind>, SandboxError> {
        self.shared.stat_kind(&self.id, path).await
    }

    async fn stat(&self, path: &str) -> Result<Option<TarStat>, SandboxError> {
        self.shared.engine_stat(&self.id, path).await
    }

    /// The resolved leaf of a read-bundle check and its engine stat, run concurrently.
    async fn checked_leaf(
        &self,
        path: &str,
        wd: &str,
    ) -> Result<(String, Option<TarStat>), SandboxError> {
        let leaf = confine(path, wd)?;
        let (checked, stat) = tokio::join!(
            check_read_async(|p| self.stat_kind(p), path, wd),
            self.stat(&leaf)
        );
        let resolved = checked?;
        Ok((resolved, stat?))
    }

    /// A file method's command through the wrapper, cwd `/`, under the command timeout: an
    /// expired deadline is the backend's own (EngineTimeout), never the caller's.
    async fn guest(
        &self,
        argv: Vec<Vec<u8>>,
        stdin: Option<Vec<u8>>,
        budget: u64,
    ) -> Result<GuestEnd, SandboxError> {
        let call = GuestCall {
            cwd: "/",
            argv,
            env: None,
            stdin,
            budget,
            timeout: self.shared.config.command_timeout,
        };
        self.shared.run_guest(&self.id, call).await
    }

    fn engine_timeout(&self, operation: &str) -> SandboxError {
        SandboxError::EngineTimeout {
            operation: operation.to_owned(),
            bound: self.shared.config.command_timeout,
        }
    }
}

fn argv<const N: usize>(parts: [&str; N]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// The path an entry reports: relative to the working directory, `.` for the directory itself.
fn reported(resolved: &str, wd: &str) -> String {
    match guest_path_relative_to(resolved, wd) {
        Some(relative) if relative.is_empty() => ".".to_owned(),
        Some(relative) => relative,
        None => resolved.to_owned(),
    }
}

#[cold]
fn guest_refused(path: &str, detail: impl Into<String>) -> SandboxError {
    SandboxError::GuestRefused {
        path: path.to_owned(),
        detail: detail.into(),
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn instance_id(&self) -> &str {
        &self.id
    }

    fn freshly_created(&self) -> bool {
        self.fresh
    }

    fn storage_base(&self) -> &str {
        &self.base
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        request.validate()?;
        let wd = self.wd(request.working_dir())?;
        let bound = request.timeout_bound();
        let budget = request.output_budget();
        let call = GuestCall {
            cwd: &wd,
            argv: request.command().to_argv(),
            env: Some(request.guest_env()),
            stdin: None,
            budget,
            timeout: bound,
        };
        match self.shared.run_guest(&self.id, call).await? {
            GuestEnd::Ran(output) => Ok(output),
            GuestEnd::Expired(cleanup) => Err(SandboxError::Timeout {
                operation: "command".to_owned(),
                bound,
                cleanup: Some(cleanup),
            }),
            GuestEnd::Overflowed(cleanup) => {
                tracing::info!(container = %self.id, %cleanup, limit = budget, "command output exceeded its budget");
                Err(SandboxError::OutputLimitExceeded { limit: budget })
            }
        }
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        let wd = self.wd(wd)?;
        let limit = self.files_in.max_bytes_per_file;
        if content.len() as u64 > limit {
            return Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit,
            });
        }
        let target = check_write_async(|p| self.stat_kind(p), path, &wd).await?;
        let argv = argv(["sh", "-c", WRITE_SCRIPT, "maf-write", &target]);
        match self
            .guest(argv, Some(content.to_vec()), SMALL_BUDGET as u64)
            .await?
        {
            GuestEnd::Ran(output) => match output.exit_code {
                0 => Ok(()),
                WRITE_EXIT_IS_DIRECTORY => Err(SandboxError::IsADirectory { path: target }),
                WRITE_EXIT_IS_LINK => Err(SandboxError::confinement(
                    path,
                    "the target became a link; a write never goes through one",
                )),
                code => Err(guest_refused(
                    &target,
                    format!(
                        "the guest could not write it (exit {code}): {}",
                        tail(&output.stderr)
                    ),
                )),
            },
            GuestEnd::Expired(_) => Err(self.engine_timeout("write_file")),
            GuestEnd::Overflowed(_) => {
                Err(SandboxError::engine("the guest writer flooded its output"))
            }
        }
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        let wd = self.wd(wd)?;
        let (resolved, stat) = self.checked_leaf(path, &wd).await?;
        Ok(stat.map(|s| SandboxEntry::new(reported(&resolved, &wd), s.kind, s.size)))
    }

    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        let wd = self.wd(wd)?;
        let cap = max_bytes.min(self.files_out.max_bytes_per_file);
        // The read runs with the guest's own authority, so it may start while the engine-side
        // checks run: whatever it reaches, the guest could read itself. Its bytes are used only
        // once the checks pass; on a refusal it gets a short grace to end on its own, then is
        // dropped, which kills its group (a FIFO never hangs the call, a link leaf's target is
        // discarded unread by the caller).
        let leaf = confine(path, &wd)?;
        let read = self.guest(argv(["cat", "--", &leaf]), None, cap + READ_SLACK);
        tokio::pin!(read);
        let checks = self.checked_leaf(path, &wd);
        tokio::pin!(checks);
        let (checked, finished_read) = tokio::select! {
            biased;
            checked = &mut checks => (checked, None),
            finished = &mut read => (checks.await, Some(finished)),
        };
        let verdict = checked.and_then(|(resolved, stat)| match stat {
            None => Err(SandboxError::NotFound { path: resolved }),
            Some(TarStat {
                kind: EntryKind::Directory,
                ..
            }) => Err(SandboxError::IsADirectory { path: resolved }),
            Some(TarStat {
                kind: EntryKind::File,
                size: Some(size),
            }) if size > cap => Err(SandboxError::TransferCapExceeded {
                path: resolved,
                limit: cap,
            }),
            Some(TarStat {
                kind: EntryKind::File,
                ..
            }) => Ok(resolved),
            Some(_) => Err(SandboxError::NotRegularFile { path: resolved }),
        });
        let resolved = match verdict {
            Ok(resolved) => resolved,
            Err(refusal) => {
                let oversized = matches!(refusal, SandboxError::TransferCapExceeded { .. });
                if finished_read.is_none() && !oversized {
                    // A read of something absent or refused usually ends on its own at once;
                    // dropping it after it ended would cost a kill exec and leave the kill's
                    // cancel file in the guest's /tmp. Only one that blocks (a FIFO) is dropped.
                    let _ = tokio::time::timeout(REFUSED_READ_GRACE, &mut read).await;
                }
                return Err(refusal);
            }
        };
        let finished = match finished_read {
            Some(finished) => finished,
            None => read.await,
        };
        match finished? {
            GuestEnd::Ran(output) if output.exit_code == 0 => {
                if output.stdout.len() as u64 > cap {
                    return Err(SandboxError::TransferCapExceeded {
                        path: resolved,
                        limit: cap,
                    });
                }
                Ok(output.stdout)
            }
            GuestEnd::Ran(output) => {
                let message = String::from_utf8_lossy(&output.stderr).to_lowercase();
                if message.contains("no such file") {
                    Err(SandboxError::NotFound { path: resolved })
                } else if message.contains("is a directory") {
                    Err(SandboxError::IsADirectory { path: resolved })
                } else if message.contains("permission denied") {
                    Err(guest_refused(&resolved, tail(&output.stderr)))
                } else {
                    Err(SandboxError::engine(format!(
                        "reading {resolved} failed (exit {}): {}",
                        output.exit_code,
                        tail(&output.stderr)
                    )))
                }
            }
            // The file grew past the cap after its header was judged.
            GuestEnd::Overflowed(_) => Err(SandboxError::TransferCapExceeded {
                path: resolved,
                limit: cap,
            }),
            GuestEnd::Expired(_) => Err(self.engine_timeout("read_file")),
        }
    }

    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        let wd = self.wd(wd)?;
        let directory = check_list_async(|p| self.stat_kind(p), path, &wd).await?;
        let argv = argv(["sh", "-c", LIST_SCRIPT, "maf-list", &directory]);
        let output = match self.guest(argv, None, LIST_BUDGET).await? {
            GuestEnd::Ran(output) => output,
            GuestEnd::Overflowed(_) => {
                return Err(SandboxError::engine("listing larger than 8 MiB"))
            }
            GuestEnd::Expired(_) => return Err(self.engine_timeout("list_dir")),
        };
        match output.exit_code {
            0 => {}
            LIST_EXIT_CANNOT_ENTER => {
                return Err(match self.stat(&directory).await? {
                    None => SandboxError::NotFound { path: directory },
                    Some(TarStat {
                        kind: EntryKind::Directory,
                        ..
                    }) => guest_refused(&directory, "the guest cannot enter it"),
                    Some(_) => SandboxError::NotADirectory { path: directory },
                })
            }
            code => {
                return Err(guest_refused(
                    &directory,
                    format!("the listing failed (exit {code}): {}", tail(&output.stderr)),
                ))
            }
        }
        let records = parse_list_records(&output.stdout).map_err(|why| {
            SandboxError::engine(format!("unreadable listing of {directory}: {why}"))
        })?;
        let mut entries = Vec::with_capacity(records.len());
        for record in records {
            let Ok(name) = std::str::from_utf8(record.name) else {
                tracing::warn!(directory = %directory, len = record.name.len(), "skipped an entry whose name is not UTF-8");
                continue;
            };
            if name.contains('\\') {
                tracing::warn!(directory = %directory, "skipped an entry whose name holds a backslash");
                continue;
            }
            let kind = match record.kind {
                b'f' => EntryKind::File,
                b'd' => EntryKind::Directory,
                b'l' => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            let full = guest_path_join(&directory, name);
            entries.push(SandboxEntry::new(reported(&full, &wd), kind, record.size));
        }
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(entries)
    }

    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        let wd = self.wd(wd)?;
        let leaf = confine(path, &wd)?;
        let (checked, stat) = tokio::join!(
            check_delete_async(|p| self.stat_kind(p), path, &wd),
            self.stat(&leaf)
        );
        let target = checked?;
        match stat? {
            None => return Ok(()),
            Some(TarStat {
                kind: EntryKind::Directory,
                ..
            }) if !recursive => return Err(SandboxError::IsADirectory { path: target }),
            Some(_) => {}
        }
        let flag = if recursive { "-rf" } else { "-f" };
        match self
            .guest(argv(["rm", flag, "--", &target]), None, SMALL_BUDGET as u64)
            .await?
        {
            GuestEnd::Ran(output) if output.exit_code == 0 => {}
            GuestEnd::Ran(output) => {
                return Err(guest_refused(
                    &target,
                    format!("the guest could not remove it: {}", tail(&output.stderr)),
                ))
            }
            GuestEnd::Overflowed(_) => {
                return Err(SandboxError::engine("the guest rm flooded its output"))
            }
            GuestEnd::Expired(_) => return Err(self.engine_timeout("remove")),
        }
        let (checked, stat) = tokio::join!(
            check_delete_async(|p| self.stat_kind(p), path, &wd),
            self.stat(&leaf)
        );
        checked?;
        if stat?.is_some() {
            return Err(guest_refused(&target, "the target survived removal"));
        }
        Ok(())
    }

    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        timeout: Duration,
    ) -> Result<(), SandboxError> {
        self.shared.refuse_retired(&self.id)?;
        if timeout.is_zero() {
            return Err(SandboxError::invalid(
                "reclaim timeout must be greater than zero",
            ));
        }
        let started = tokio::time::Instant::now();
        let target = if directory.starts_with('/') {
            let canonical = guest_path_norm(directory);
            if canonical != directory || canonical.split('/').filter(|c| !c.is_empty()).count() < 2
            {
                return Err(SandboxError::confinement(
                    directory,
                    "an absolute reclaim target must be canonical with at least two components",
                ));
            }
            canonical
        } else {
            let wd = self.wd(wd)?;
            let resolved = confine(directory, &wd)?;
            if resolved == wd {
                return Err(SandboxError::confinement(
                    directory,
                    "the working directory itself is never reclaimed",
                ));
            }
            resolved
        };
        let call = GuestCall {
            cwd: "/",
            argv: argv(["rm", "-rf", "--", &target]),
            env: None,
            stdin: None,
            budget: SMALL_BUDGET as u64,
            timeout,
        };
        let timed_out = |cleanup| SandboxError::Timeout {
            operation: "reclaim".to_owned(),
            bound: timeout,
            cleanup,
        };
        match self.shared.run_guest(&self.id, call).await? {
            GuestEnd::Ran(output) if output.exit_code == 0 => {}
            GuestEnd::Ran(output) => {
                return Err(guest_refused(
                    &target,
                    format!("the guest could not remove it: {}", tail(&output.stderr)),
                ))
            }
            GuestEnd::Expired(cleanup) => return Err(timed_out(Some(cleanup))),
            GuestEnd::Overflowed(_) => {
                return Err(SandboxError::engine("the guest rm flooded its output"))
            }
        }
        let remaining = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(remaining, self.stat(&target)).await {
            Err(_) => Err(timed_out(None)),
            Ok(stat) => match stat? {
                None => Ok(()),
                Some(_) => Err(guest_refused(&target, "the directory survived reclaim")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_paths_are_relative() {
        assert_eq!(reported("/w", "/w"), ".");
        assert_eq!(reported("/w/a/b", "/w"), "a/b");
        assert_eq!(reported("/elsewhere", "/w"), "/elsewhere");
    }
}
