//! The handle to one container: exec and the file methods.
//!
//! Every file method checks its path with the core's bundle first, walking the ancestors with the
//! engine-side stat (the archive `HEAD`: unconfined, no-follow, never answered by the guest), so
//! a refused path moves no data. Reads and writes then go through the archive endpoints (one
//! `GET` streamed through the strict tar parser, one `PUT` of a tar streamed from its header, the
//! caller's bytes and its end, owned by the guest user); listing and removal act with the guest's
//! own authority through the wrapper.
//!
//! What the archive endpoints do not give: the engine acts inside the container's root with more
//! authority than a non-root guest, so a guest that swaps a checked component for a link between
//! the check and the transfer can redirect that one transfer to another path inside its own
//! container (never outside it: the engine resolves links within the container root).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::guest_path::{self, Access};
use sandbox_core::{
    EntryKind, ExecOutput, ExecRequest, ExecStdin, ExecStream, Sandbox, SandboxEntry, SandboxError,
    SandboxKey, SandboxSpec, TransferLimits,
};

use crate::archive::Archive;
use crate::connection::quote as tail;
use crate::guest_calls::GuestCalls;
use crate::guest_calls::{GuestCall, SMALL_BUDGET};
use crate::guest_scripts::{parse_list_records, LIST_EXIT_CANNOT_ENTER, LIST_SCRIPT};
use crate::memory::Memories;
use crate::tar_header::TarStat;
use wrapper_stream::GuestEnd;

/// Output budget of a listing.
const LIST_BUDGET: u64 = 8 * 1024 * 1024;

/// What every handle of one backend reaches: the archive endpoints, the guest calls, the guest
/// ids and retirements this process knows, and the command timeout.
#[derive(Debug, Clone)]
pub(crate) struct HandleParts {
    pub(crate) archive: Arc<Archive>,
    pub(crate) guest: Arc<GuestCalls>,
    pub(crate) memory: Arc<Memories>,
    pub(crate) command_timeout: Duration,
}

/// What a handle was acquired as, for a reset that makes its container again: the key, the
/// kind, and the spec when the handle came from an acquire (a found one has none; its container's
/// own record then says what to make).
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub(crate) key: SandboxKey,
    pub(crate) kind: String,
    pub(crate) spec: Option<SandboxSpec>,
}

/// Makes a handle's container again as its acquire made it: what `reset` runs through (the
/// acquirer), named here so this module imports nothing above it.
#[async_trait]
pub(crate) trait Remake: Send + Sync + std::fmt::Debug {
    /// Removes container `id` of `origin` and acquires the key again, fresh.
    async fn remake(&self, origin: &Origin, id: &str) -> Result<Arc<dyn Sandbox>, SandboxError>;
}

/// A handle to one container, by id: a replacement under the same name is never reached.
#[derive(Debug)]
pub(crate) struct DockerSandbox {
    archive: Arc<Archive>,
    guest: Arc<GuestCalls>,
    memory: Arc<Memories>,
    command_timeout: Duration,
    id: String,
    base: String,
    fresh: bool,
    files_in: TransferLimits,
    files_out: TransferLimits,
    origin: Origin,
    remake: Arc<dyn Remake>,
}

impl DockerSandbox {
    /// `read_file` (`head` false: a file over the cap is refused whole) and `read_head` (`head`
    /// true: its first `cap` bytes). Checked before reading: a refused path (absent, a
    /// directory, a link, a FIFO, over the cap when not `head`) moves no data. The archive read
    /// judges the entry's header again, so a file swapped or grown after the check is judged
    /// from its header, before its data is kept.
    async fn read_checked(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
        head: bool,
    ) -> Result<Vec<u8>, SandboxError> {
        self.memory.retired.refuse(&self.id)?;
        let wd = self.wd(wd)?;
        let cap = max_bytes.min(self.files_out.max_bytes_per_file);
        let (resolved, stat) = self.checked_leaf(path, &wd).await?;
        match stat {
            None => Err(SandboxError::NotFound { path: resolved }),
            Some(TarStat {
                kind: EntryKind::Directory,
                ..
            }) => Err(SandboxError::IsADirectory { path: resolved }),
            Some(TarStat {
                kind: EntryKind::File,
                size: Some(size),
            }) if size > cap && !head => Err(SandboxError::TransferCapExceeded {
                path: resolved,
                limit: cap,
            }),
            Some(TarStat {
                kind: EntryKind::File,
                ..
            }) => {
                self.archive
                    .read_archive_file(&self.id, &resolved, cap, head)
                    .await
            }
            Some(_) => Err(SandboxError::NotRegularFile { path: resolved }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        parts: HandleParts,
        id: String,
        base: String,
        fresh: bool,
        files_in: TransferLimits,
        files_out: TransferLimits,
        origin: Origin,
        remake: Arc<dyn Remake>,
    ) -> Self {
        DockerSandbox {
            origin,
            remake,
            archive: parts.archive,
            guest: parts.guest,
            memory: parts.memory,
            command_timeout: parts.command_timeout,
            id,
            base,
            fresh,
            files_in,
            files_out,
        }
    }

    /// The call's working directory: relative ones are confined to the storage base.
    fn wd(&self, wd: &str) -> Result<String, SandboxError> {
        guest_path::resolve_wd(wd, &self.base)
    }

    async fn stat_kind(&self, path: String) -> Result<Option<EntryKind>, SandboxError> {
        self.archive.stat_kind(&self.id, path).await
    }

    async fn stat(&self, path: &str) -> Result<Option<TarStat>, SandboxError> {
        self.archive.engine_stat(&self.id, path).await
    }

    /// The resolved leaf of a read-bundle check and its engine stat, run concurrently. Each path
    /// is stated once: when the leaf is also one of the checked directories (the working
    /// directory itself), the check reads the leaf's answer instead of asking again.
    async fn checked_leaf(
        &self,
        path: &str,
        wd: &str,
    ) -> Result<(String, Option<TarStat>), SandboxError> {
        let leaf = guest_path::confine(path, wd)?;
        let leaf_stat = tokio::sync::OnceCell::new();
        let stat_leaf = || leaf_stat.get_or_try_init(|| self.stat(&leaf));
        let (checked, stat) = tokio::join!(
            Access::Read.check_async(
                |p| async {
                    if p == leaf {
                        Ok(stat_leaf().await?.map(|s| s.kind))
                    } else {
                        self.stat_kind(p).await
                    }
                },
                path,
                wd
            ),
            stat_leaf()
        );
        let resolved = checked?;
        Ok((resolved, *stat?))
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
            stdin: stdin.map_or(ExecStdin::Closed, ExecStdin::Bytes),
            budget: Some(budget),
            timeout: self.command_timeout,
        };
        self.guest.run_guest(&self.id, call).await
    }

    /// The guest user's uid and gid, asked once per container.
    async fn guest_ids(&self) -> Result<(u64, u64), SandboxError> {
        if let Some(ids) = self.memory.guest_ids.get(&self.id) {
            return Ok(ids);
        }
        let output = self
            .guest
            .guest_internal(&self.id, &["sh", "-c", "id -u && id -g"])
            .await?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let mut numbers = text.split_whitespace().map(str::parse::<u64>);
        match (output.exit_code, numbers.next(), numbers.next()) {
            (0, Some(Ok(uid)), Some(Ok(gid))) => {
                self.memory.guest_ids.remember(&self.id, (uid, gid));
                Ok((uid, gid))
            }
            _ => Err(SandboxError::engine(format!(
                "the guest's `id -u`/`id -g` answered {:?}",
                tail(&output.stdout)
            ))),
        }
    }

    fn engine_timeout(&self, operation: &str) -> SandboxError {
        SandboxError::EngineTimeout {
            operation: operation.to_owned(),
            bound: self.command_timeout,
        }
    }
}

fn argv<const N: usize>(parts: [&str; N]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// The parent of an absolute normalised guest path (`/` for `/` and top-level entries).
fn guest_path_parent(path: &str) -> String {
    match path.trim_end_matches('/').rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
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

    /// Removes this container (every process in it ends with it) and acquires the key again,
    /// fresh from the image and the storage base: a new instance under the same name and key.
    async fn reset(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        self.remake.remake(&self.origin, &self.id).await
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        sandbox_core::backend_kit::collect_exec(self, request).await
    }

    async fn exec_stream(
        &self,
        request: ExecRequest,
        stdin: ExecStdin,
    ) -> Result<ExecStream, SandboxError> {
        request.validate()?;
        let wd = self.wd(request.working_dir())?;
        let call = GuestCall {
            cwd: &wd,
            argv: request.command().to_argv(),
            env: Some(request.guest_env()),
            stdin,
            budget: request.output_cap(),
            timeout: request.timeout_bound(),
        };
        self.guest.stream_guest(&self.id, call)
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.memory.retired.refuse(&self.id)?;
        let wd = self.wd(wd)?;
        let limit = self.files_in.max_bytes_per_file;
        if content.len() as u64 > limit {
            return Err(SandboxError::TransferCapExceeded {
                path: path.to_owned(),
                limit,
            });
        }
        // The walk (every ancestor and the target, a few at a time) and the target's full stat
        // run together, and the target is stated once: the walk reads the same answer. Each
        // answer is kept for the upload point's search below.
        let target = guest_path::confine(path, &wd)?;
        let target_stat = tokio::sync::OnceCell::new();
        let stat_target = || target_stat.get_or_try_init(|| self.stat(&target));
        let seen = std::sync::Mutex::new(std::collections::HashMap::new());
        let (checked, stat) = tokio::join!(
            Access::Write.check_async(
                |p| {
                    let (seen, target, stat_target) = (&seen, &target, &stat_target);
                    async move {
                        let kind = if p == *target {
                            stat_target().await?.map(|s| s.kind)
                        } else {
                            self.stat_kind(p.clone()).await?
                        };
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(p, kind);
                        Ok(kind)
                    }
                },
                path,
                &wd,
            ),
            stat_target()
        );
        let target = checked?;
        let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
        match stat? {
            Some(TarStat {
                kind: EntryKind::Directory,
                ..
            }) => return Err(SandboxError::IsADirectory { path: target }),
            Some(TarStat {
                kind: EntryKind::Symlink,
                ..
            }) => {
                return Err(SandboxError::confinement(
                    path,
                    "the target is a link; a write never goes through one",
                ))
            }
            _ => {}
        }
        // The deepest existing ancestor is the upload point; the ones below it are created by the
        // same upload, owned by the guest.
        let mut missing = Vec::new();
        let mut at = guest_path_parent(&target);
        loop {
            let kind = match seen.get(&at) {
                Some(kind) => *kind,
                None => self.stat_kind(at.clone()).await?,
            };
            match kind {
                Some(EntryKind::Directory) => break,
                Some(_) => return Err(SandboxError::NotADirectory { path: at }),
                None if at == "/" => return Err(SandboxError::NotFound { path: at }),
                None => {
                    missing.push(at.clone());
                    at = guest_path_parent(&at);
                }
            }
        }
        missing.reverse();
        let relative = |p: &str| guest_path::relative_to(p, &at).unwrap_or_else(|| p.to_owned());
        let missing: Vec<String> = missing.iter().map(|m| relative(m)).collect();
        let (uid, gid) = self.guest_ids().await?;
        let archive = crate::archive::write_archive(
            &missing,
            &relative(&target),
            content.len() as u64,
            uid,
            gid,
        )?;
        self.archive
            .put_write_archive(&self.id, &at, archive, content)
            .await
            .map_err(|error| match error {
                SandboxError::Engine { detail, .. }
                    if detail.to_lowercase().contains("cannot overwrite") =>
                {
                    SandboxError::IsADirectory {
                        path: target.clone(),
                    }
                }
                other => other,
            })
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        self.memory.retired.refuse(&self.id)?;
        let wd = self.wd(wd)?;
        let (resolved, stat) = self.checked_leaf(path, &wd).await?;
        Ok(stat.map(|s| SandboxEntry::new(guest_path::reported(&resolved, &wd), s.kind, s.size)))
    }

    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.read_checked(path, wd, max_bytes, false).await
    }

    async fn read_head(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.read_checked(path, wd, max_bytes, true).await
    }

    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        self.memory.retired.refuse(&self.id)?;
        let wd = self.wd(wd)?;
        let directory = Access::List
            .check_async(|p| self.stat_kind(p), path, &wd)
            .await?;
        let argv = argv(["sh", "-c", LIST_SCRIPT, "maf-list", &directory]);
        let output = match self.guest(argv, None, LIST_BUDGET).await? {
            GuestEnd::Ran(output) => output,
            GuestEnd::Overflowed => return Err(SandboxError::engine("listing larger than 8 MiB")),
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
        let shown_directory = guest_path::reported(&directory, &wd);
        for record in records {
            let kind = match record.kind {
                b'f' => EntryKind::File,
                b'd' => EntryKind::Directory,
                b'l' => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            // A name no guest path can address (not UTF-8, or holding a backslash) is shown
            // escaped, never left out.
            entries.push(SandboxEntry::listed(
                &shown_directory,
                record.name,
                kind,
                record.size,
            ));
        }
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        Ok(entries)
    }

    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        self.memory.retired.refuse(&self.id)?;
        let wd = self.wd(wd)?;
        let leaf = guest_path::confine(path, &wd)?;
        let (checked, stat) = tokio::join!(
            Access::Delete.check_async(|p| self.stat_kind(p), path, &wd),
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
            GuestEnd::Overflowed => {
                return Err(SandboxError::engine("the guest rm flooded its output"))
            }
            GuestEnd::Expired(_) => return Err(self.engine_timeout("remove")),
        }
        let (checked, stat) = tokio::join!(
            Access::Delete.check_async(|p| self.stat_kind(p), path, &wd),
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
        self.memory.retired.refuse(&self.id)?;
        if timeout.is_zero() {
            return Err(SandboxError::invalid(
                "reclaim timeout must be greater than zero",
            ));
        }
        let started = tokio::time::Instant::now();
        let target = if directory.starts_with('/') {
            let canonical = guest_path::norm(directory);
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
            let resolved = guest_path::confine(directory, &wd)?;
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
            stdin: ExecStdin::Closed,
            budget: Some(SMALL_BUDGET as u64),
            timeout,
        };
        let timed_out = |cleanup| SandboxError::Timeout {
            operation: "reclaim".to_owned(),
            bound: timeout,
            cleanup,
        };
        match self.guest.run_guest(&self.id, call).await? {
            GuestEnd::Ran(output) if output.exit_code == 0 => {}
            GuestEnd::Ran(output) => {
                return Err(guest_refused(
                    &target,
                    format!("the guest could not remove it: {}", tail(&output.stderr)),
                ))
            }
            GuestEnd::Expired(cleanup) => return Err(timed_out(Some(cleanup))),
            GuestEnd::Overflowed => {
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
