//! Acquire and find: the per-name lock, create, adopt, the create race, an interrupted create,
//! and the steps that make a new sandbox ready (guest mount, tool probe, mount point, mount
//! proof, agent-socket check, the record).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bounded_process::ExitKind;
use exec_wrapper::tool_probe::{read_tool_probe, tool_probe_argv, ToolProbeOutcome, SBX_TOOLS};
use exec_wrapper::wrapper::{SbxMount, WORKSPACE_MARKER};
use sandbox_core::naming::sbx::sbx_sandbox_name;
use sandbox_core::storage_base::{plan_storage_base, storage_base_directories, validate_base};
use sandbox_core::{
    Egress, IsolationScope, SandboxError, SandboxKey, SandboxSpec, TransferLimits, DEFAULT_WORK_DIR,
};
use sbx_cli::{CreateRequest, Error as CliError, Instant, LsRow, MemorySize, SbxName};

use crate::disposal::record_key;
use crate::engine::{classified, exit_code, sbx_name, short_exec, to_sandbox_error};
use crate::guest_scripts::{
    guest_mount_argv, parse_guest_mount, presence_argv, script_argv, AGENT_SOCKET,
    AGENT_SOCKET_EXIT, MOUNT_POINT_CLASH_EXIT, MOUNT_POINT_SCRIPT, NO_AGENT_SCRIPT,
};
use crate::handle::SbxSandbox;
use crate::host::SbxHost;
use crate::host_plane::HostPlane;
use crate::layout::{self, Record, RECORD_VERSION};
use sandbox_core::backend_kit::spawn_detached;
use wrapper_stream::GuestEnd;

/// How long an abandoned create is watched for, and how often `ls` is asked.
const WATCH_FOR: Duration = Duration::from_secs(10);
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// What an acquire or find is about: the name, the storage base and its parent.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) key: SandboxKey,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) sbx: SbxName,
    pub(crate) base: String,
    pub(crate) parent: String,
}

/// The storage base's parent: where every command binds the workspace. A base directly under
/// `/` has no parent of its own and is refused.
pub(crate) fn base_parent(base: &str) -> Result<String, SandboxError> {
    match base.rsplit_once('/') {
        Some((parent, _)) if !parent.is_empty() => Ok(parent.to_owned()),
        _ => Err(SandboxError::invalid(format!(
            "storage base {base:?} lies directly under /; it needs a parent directory of its own \
             where the workspace is bound (for example /maf-sandbox/work)"
        ))),
    }
}

impl Target {
    fn new(
        host: &SbxHost,
        key: &SandboxKey,
        kind: &str,
        work_dir: &str,
    ) -> Result<Self, SandboxError> {
        let base = validate_base(work_dir)?;
        let parent = base_parent(&base)?;
        let name = sbx_sandbox_name(&host.config.prefix, key, kind);
        Ok(Target {
            key: key.clone(),
            kind: kind.to_owned(),
            sbx: sbx_name(&name)?,
            name,
            base,
            parent,
        })
    }

    fn dir(&self, host: &SbxHost) -> PathBuf {
        layout::name_dir(&host.config.root, &self.name)
    }
}

async fn read_record(host: &SbxHost, target: &Target) -> Result<Option<Record>, SandboxError> {
    let dir = target.dir(host);
    let shown = dir.display().to_string();
    tokio::task::spawn_blocking(move || layout::read_record(&dir))
        .await
        .map_err(|e| SandboxError::engine(format!("reading the record did not finish: {e}")))?
        .map_err(|source| SandboxError::Io {
            operation: "read record",
            path: shown,
            source,
        })
}

/// Whether a recorded sandbox that `ls` does not list answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Absent,
    Answers,
}

/// Asks a recorded sandbox that `ls` does not list whether it exists (`sh -c :`).
async fn presence(host: &SbxHost, target: &Target) -> Result<Presence, SandboxError> {
    let output = short_exec(
        &host.cli,
        &target.sbx,
        presence_argv(),
        false,
        host.config.command_timeout,
    )
    .await
    .map_err(to_sandbox_error)?;
    if output.status == ExitKind::Exited(0) {
        return Ok(Presence::Answers);
    }
    match sbx_cli::classify_output(
        sbx_cli::Call::Exec,
        Some(&target.name),
        output.status,
        &output.stderr,
    ) {
        CliError::NotFound { .. } => Ok(Presence::Absent),
        other => Err(to_sandbox_error(other)),
    }
}

#[cold]
fn lost_track(target: &Target) -> SandboxError {
    SandboxError::DaemonFault(format!(
        "the sandbox {} answers but is missing from `sbx ls`; the daemon lost track of its VMs; \
         fix with `sbx daemon restart`",
        target.name
    ))
}

/// Gets or creates the sandbox of (key, spec kind).
pub(crate) async fn acquire(
    host: &Arc<SbxHost>,
    key: &SandboxKey,
    spec: &SandboxSpec,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    if spec.egress() != Egress::Closed {
        return Err(SandboxError::EgressNotEnforced(
            "the sbx backend enforces closed egress only; allowlists are not built yet".into(),
        ));
    }
    if spec.isolation_scope() != IsolationScope::Conversation {
        return Err(SandboxError::ScopeNotEnforced(
            "the sbx backend serves the conversation scope only".into(),
        ));
    }
    let target = Target::new(
        host,
        key,
        spec.kind(),
        spec.work_dir().unwrap_or(DEFAULT_WORK_DIR),
    )?;
    host.check_host().await?;
    let _guard = host.locks.lock(target.name.clone()).await;
    let mut row = listed(host, &target.name).await?;
    let mut record = read_record(host, &target).await?;
    if let Some(present) = &row {
        let retired = present.id.as_deref().is_some_and(|id| {
            host.retired_reason(id).is_some() || record.as_ref().is_some_and(|r| r.retires(id))
        });
        if retired {
            host.remove_one(&target.name, present.id.as_deref(), None)
                .await
                .map_err(|failure| {
                    SandboxError::engine(format!(
                        "could not replace retired sandbox {}: {failure}",
                        target.name
                    ))
                })?;
            row = None;
            record = read_record(host, &target).await?;
        }
    } else if let Some(stale) = record.clone() {
        match (presence(host, &target).await?, stale.instance_id.is_some()) {
            // A create in another process, in progress (wait for it) or finished between the
            // listing above and the record's read (a finished record alone proves nothing):
            // list again after the read; only a sandbox that answers and is still unlisted
            // then means the daemon lost track of it.
            (Presence::Answers, finished) => {
                if !finished {
                    record = wait_for_creator(host, &target).await?;
                }
                row = Some(listed_or_lost(host, &target).await?);
            }
            // Confirmed gone: a finished instance's generation is of no use to anyone. An
            // unfinished create's record stays (a create in another process may be just
            // starting, and a create of ours overwrites it once it owns the name), and so does
            // its workspace (its daemon may still finish it).
            (Presence::Absent, true) => {
                let dir = target.dir(host);
                let generation = stale.workspace.clone();
                let _ =
                    tokio::task::spawn_blocking(move || layout::clear(&dir, &[generation])).await;
                record = None;
            }
            (Presence::Absent, false) => {}
        }
    }
    if let (Some(_), Some(found)) = (&row, &record) {
        if found.instance_id.is_none() {
            record = wait_for_creator(host, &target).await?;
        }
    }
    match row {
        None => create(host, &target, spec).await,
        Some(row) => adopt(host, &target, &row, record, Some(spec), false).await,
    }
}

/// The row `sbx ls` lists for `name`, if any.
async fn listed(host: &SbxHost, name: &str) -> Result<Option<LsRow>, SandboxError> {
    let rows = host.cli.ls().await.map_err(to_sandbox_error)?;
    Ok(rows.into_iter().find(|row| row.name == name))
}

/// The row of a sandbox that answers though the first listing missed it: listed again, after
/// its record was read (a create that finished in between is listed now); still unlisted, the
/// daemon lost track of it.
async fn listed_or_lost(host: &SbxHost, target: &Target) -> Result<LsRow, SandboxError> {
    listed(host, &target.name)
        .await?
        .ok_or_else(|| lost_track(target))
}

/// Another process is making this sandbox ready (its record has no instance id yet): wait for
/// it, bounded by the command timeout, re-reading the record every 250 ms.
async fn wait_for_creator(host: &SbxHost, target: &Target) -> Result<Option<Record>, SandboxError> {
    let end = Instant::now() + host.config.command_timeout;
    loop {
        let record = read_record(host, target).await?;
        let unfinished = record.as_ref().is_some_and(|r| r.instance_id.is_none());
        if !unfinished || Instant::now() >= end {
            return Ok(record);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A handle to the existing sandbox of (key, kind), or `None`; never creates one.
pub(crate) async fn find(
    host: &Arc<SbxHost>,
    key: &SandboxKey,
    kind: &str,
) -> Result<Option<Arc<SbxSandbox>>, SandboxError> {
    // The record says which storage base; the name does not depend on it.
    let probe = Target::new(host, key, kind, DEFAULT_WORK_DIR)?;
    let _guard = host.locks.lock(probe.name.clone()).await;
    let row = listed(host, &probe.name).await?;
    let record = read_record(host, &probe).await?;
    let row = match row {
        Some(row) => row,
        None => match record {
            Some(ref finished) if finished.instance_id.is_some() => {
                match presence(host, &probe).await? {
                    Presence::Absent => return Ok(None),
                    // Finished between the listing and the record's read, or lost.
                    Presence::Answers => listed_or_lost(host, &probe).await?,
                }
            }
            _ => return Ok(None),
        },
    };
    let target = match &record {
        Some(record) => Target::new(host, key, kind, &record.work_dir)?,
        None => probe,
    };
    let sandbox = adopt(host, &target, &row, record, None, false).await?;
    sandbox.refuse_retired()?;
    if let Some(id) = row.id.as_deref() {
        if let Some(reason) = read_record(host, &target)
            .await?
            .filter(|r| r.retires(id))
            .and_then(|r| r.retired_reason)
        {
            return Err(SandboxError::Retired {
                instance: id.to_owned(),
                reason: format!("instance retired ({reason}); acquire again to get a replacement"),
            });
        }
    }
    Ok(Some(sandbox))
}

/// The record a spec would write for a new generation (without its instance id).
fn draft(target: &Target, spec: &SandboxSpec, generation: &str) -> Record {
    let key = &target.key;
    Record {
        version: RECORD_VERSION,
        key: [
            key.scope.clone(),
            key.thread_id.clone(),
            key.agent_id.clone(),
            key.call_id.clone(),
        ],
        kind: target.kind.clone(),
        work_dir: target.base.clone(),
        image: spec.image().map(str::to_owned),
        image_id: spec.image_id().map(str::to_owned),
        workspace: generation.to_owned(),
        guest_mount: None,
        egress_allow: None,
        egress_plan: None,
        instance_id: None,
        retired: None,
        retired_reason: None,
    }
}

/// Checks an existing sandbox against its record (and the spec, for an acquire), then hands
/// out a handle with its storage base prepared.
async fn adopt(
    host: &Arc<SbxHost>,
    target: &Target,
    row: &LsRow,
    record: Option<Record>,
    spec: Option<&SandboxSpec>,
    fresh: bool,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    let dir = target.dir(host);
    let record = judge_adoption(&host.config.root, target, row, record, spec)
        .map_err(|why| why.into_error(&target.name, &dir))?;
    let instance_id = row.id.clone().unwrap_or_default();
    let guest_mount = record.guest_mount.clone().unwrap_or_default();
    let sandbox = handle(
        host,
        target,
        &record.workspace,
        guest_mount,
        instance_id,
        fresh,
        spec,
    )
    .await?;
    prepare_base(&sandbox).await?;
    Ok(sandbox)
}

/// Why an existing sandbox cannot be adopted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Engine(String),
    SpecMismatch(String),
    Busy(String),
}

impl Refusal {
    fn into_error(self, name: &str, dir: &std::path::Path) -> SandboxError {
        match self {
            Refusal::Engine(why) => SandboxError::engine(format!(
                "sandbox {name} (record under {}): {why}",
                dir.display()
            )),
            Refusal::SpecMismatch(why) => {
                SandboxError::SpecMismatch(format!("sandbox {name}: {why}"))
            }
            Refusal::Busy(why) => SandboxError::Busy(format!("sandbox {name}: {why}")),
        }
    }
}

/// The adoption checks, in order; the first mismatch refuses.
pub(crate) fn judge_adoption(
    root: &std::path::Path,
    target: &Target,
    row: &LsRow,
    record: Option<Record>,
    spec: Option<&SandboxSpec>,
) -> Result<Record, Refusal> {
    let Some(record) = record else {
        return Err(Refusal::Engine(
            "exists without a record: not made by this backend, or its create never finished; \
             dispose it"
                .into(),
        ));
    };
    if record.instance_id.is_none() {
        return Err(Refusal::Busy(
            "another process is still creating it; retry the acquire (or dispose of it if no \
             create is running)"
                .into(),
        ));
    }
    if !layout::is_generation_name(&record.workspace) {
        return Err(Refusal::Engine(format!(
            "the record names workspace {:?}, which is not a bare ws-… name",
            record.workspace
        )));
    }
    let expected = layout::name_dir(root, &target.name).join(&record.workspace);
    if row.workspaces != [expected.clone()] {
        return Err(Refusal::Engine(format!(
            "it mounts {:?}, not {}: created with a different workspace_root",
            row.workspaces,
            expected.display()
        )));
    }
    let Some(id) = row.id.as_deref().filter(|id| !id.is_empty()) else {
        return Err(Refusal::Engine(
            "`sbx ls` gives it no id; fix with `sbx daemon restart`".into(),
        ));
    };
    if record.instance_id.as_deref() != Some(id) {
        return Err(Refusal::Engine(
            "the record describes another instance (or a create that never finished); dispose it"
                .into(),
        ));
    }
    if record_key(&record) != target.key || record.kind != target.kind {
        return Err(Refusal::Engine(
            "another key digests to the same name; refusing to share it".into(),
        ));
    }
    if let Some(spec) = spec {
        let image = spec.image().map(str::to_owned);
        let image_id = spec.image_id().map(str::to_owned);
        for (what, recorded, wanted) in [
            (
                "work_dir",
                Some(record.work_dir.clone()),
                Some(target.base.clone()),
            ),
            ("image", record.image.clone(), image),
            ("image_id", record.image_id.clone(), image_id),
        ] {
            if recorded != wanted {
                return Err(Refusal::SpecMismatch(format!(
                    "it was created with {what} {recorded:?}, the spec asks for {wanted:?}"
                )));
            }
        }
        if record.egress_allow.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(Refusal::SpecMismatch(
                "it was created with an egress allowlist; the spec asks for closed egress".into(),
            ));
        }
    }
    if record.guest_mount.as_deref().is_none_or(str::is_empty) {
        return Err(Refusal::Engine("the record has no guest mount".into()));
    }
    Ok(record)
}

/// Builds the handle over the generation's host plane.
async fn handle(
    host: &Arc<SbxHost>,
    target: &Target,
    generation: &str,
    guest_mount: String,
    instance_id: String,
    fresh: bool,
    spec: Option<&SandboxSpec>,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    let workspace = target.dir(host).join(generation);
    let parent = target.parent.clone();
    let plane = tokio::task::spawn_blocking(move || HostPlane::open(&workspace, &parent))
        .await
        .map_err(|e| {
            SandboxError::engine(format!("opening the workspace did not finish: {e}"))
        })??;
    let (files_in, files_out) = match spec {
        Some(spec) => (spec.files_in(), spec.files_out()),
        None => (TransferLimits::default(), TransferLimits::default()),
    };
    Ok(Arc::new(SbxSandbox {
        host: host.clone(),
        name: target.sbx.clone(),
        instance_id,
        base: target.base.clone(),
        base_wd: sandbox_core::guest_path::resolve_wd(".", &target.base).ok(),
        mount: SbxMount {
            parent: target.parent.clone(),
            guest_mount,
        },
        plane: Arc::new(plane),
        fresh,
        files_in,
        files_out,
    }))
}

/// Creates the storage base's missing directories through the plane (0700), after the core's
/// planner refused links and non-directories on the way.
async fn prepare_base(sandbox: &SbxSandbox) -> Result<(), SandboxError> {
    let plane = sandbox.plane.clone();
    let base = sandbox.base.clone();
    tokio::task::spawn_blocking(move || {
        let mut stats = Vec::new();
        for directory in storage_base_directories(&base)? {
            let stat = plane.lstat_kind(&directory)?;
            let missing = stat.is_none();
            stats.push(stat);
            if missing {
                break;
            }
        }
        for directory in plan_storage_base(&base, &stats)? {
            plane.make_dirs(&directory)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| SandboxError::engine(format!("preparing the storage base did not finish: {e}")))?
}

/// What must happen if a create is abandoned at this stage (by an error, a deadline or a
/// dropped future): one guard, run in a task the caller cannot cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `sbx create` is running: watch whether the daemon finishes it anyway.
    Creating,
    /// The sandbox exists but is not ready: discard it.
    Created,
    /// Nothing to do.
    Done,
}

struct CreateCleanup {
    stage: Stage,
    host: Arc<SbxHost>,
    name: SbxName,
    workspace: PathBuf,
    generation: String,
}

impl Drop for CreateCleanup {
    fn drop(&mut self) {
        let host = self.host.clone();
        let name = self.name.clone();
        let generation = self.generation.clone();
        match self.stage {
            Stage::Done => {}
            Stage::Creating => {
                let workspace = self.workspace.clone();
                spawn_detached("the watch of an abandoned create", async move {
                    watch_abandoned_create(host, name, workspace, generation).await;
                });
            }
            Stage::Created => {
                spawn_detached("the discard of a half-made sandbox", async move {
                    discard(&host, &name, generation).await;
                });
            }
        }
    }
}

/// Removes a sandbox this process created but could not make ready, with its generation.
async fn discard(host: &SbxHost, name: &SbxName, generation: String) {
    let _guard = host.locks.lock(name.as_str().to_owned()).await;
    if let Err(failure) = host.remove_one(name.as_str(), None, Some(generation)).await {
        tracing::warn!(sandbox = %name, %failure, "could not discard a sandbox whose acquire failed");
    }
}

/// After an interrupted create: the daemon may still finish it. For up to 10 s, `ls` every
/// 0.5 s: a row of this name mounting exactly this workspace is discarded; a row mounting
/// another workspace, or a failed listing, is left alone; nothing by the end keeps the
/// workspace (a create still running will need it).
async fn watch_abandoned_create(
    host: Arc<SbxHost>,
    name: SbxName,
    workspace: PathBuf,
    generation: String,
) {
    let end = Instant::now() + WATCH_FOR;
    loop {
        match host.cli.ls_within(end).await {
            Err(error) => {
                tracing::warn!(sandbox = %name, %error, "the watch of an abandoned create could not list; leaving it");
                return;
            }
            Ok(rows) => {
                if let Some(row) = rows.iter().find(|row| row.name == name.as_str()) {
                    if row.workspaces == [workspace.clone()] {
                        tracing::info!(sandbox = %name, "an abandoned create finished after all; discarding it");
                        discard(&host, &name, generation).await;
                    } else {
                        tracing::info!(sandbox = %name, "another workspace's sandbox holds the name; leaving it");
                    }
                    return;
                }
            }
        }
        if Instant::now() + WATCH_EVERY >= end {
            tracing::info!(sandbox = %name, "an abandoned create did not appear; its workspace is kept");
            return;
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

/// The create (rules of an interrupted create and of the create race included), then the steps
/// that make the new sandbox ready.
async fn create(
    host: &Arc<SbxHost>,
    target: &Target,
    spec: &SandboxSpec,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    let root = host.config.root.clone();
    let name = target.name.clone();
    let generation = tokio::task::spawn_blocking(move || layout::new_generation(&root, &name))
        .await
        .map_err(|e| SandboxError::engine(format!("making the workspace did not finish: {e}")))?
        .map_err(|source| SandboxError::Io {
            operation: "create workspace",
            path: target.dir(host).display().to_string(),
            source,
        })?;
    let workspace = target.dir(host).join(&generation);
    // The draft is on disk before the create, so another process that sees the new row also
    // sees a create in progress; it never replaces a record already there.
    let claimed = {
        let (dir, draft) = (target.dir(host), draft(target, spec, &generation));
        tokio::task::spawn_blocking(move || layout::claim_record(&dir, &draft)).await
    };
    if !matches!(claimed, Ok(Ok(_))) {
        tracing::warn!(sandbox = %target.name, "could not write the draft record before create");
    }
    let cpus = std::num::NonZeroU32::new(host.config.cpus)
        .ok_or_else(|| SandboxError::invalid("cpus must be at least 1"))?;
    let memory = MemorySize::new(host.config.memory.clone()).map_err(to_sandbox_error)?;
    let mut request = CreateRequest::new(target.sbx.clone(), workspace.clone(), cpus, memory);
    if let Some(template) = spec.image_id().or(spec.image()) {
        request = request.template(template);
    }
    let mut cleanup = CreateCleanup {
        stage: Stage::Creating,
        host: host.clone(),
        name: target.sbx.clone(),
        workspace: workspace.clone(),
        generation: generation.clone(),
    };
    match host.cli.create(&request).await {
        Ok(()) => cleanup.stage = Stage::Created,
        Err(CliError::Timeout { bound, .. }) => {
            // The guard starts the watch as it drops.
            return Err(SandboxError::EngineTimeout {
                operation: "sbx create".into(),
                bound,
            });
        }
        Err(CliError::AlreadyExists { .. }) => {
            cleanup.stage = Stage::Done;
            // The draft record stays: it may be the only sign of the winner's create until the
            // winner writes its own.
            drop_generation(host, target, &generation, KeepRecord::Yes).await;
            return adopt_race_winner(host, target, spec).await;
        }
        Err(error) => {
            cleanup.stage = Stage::Done;
            drop_generation(host, target, &generation, KeepRecord::No).await;
            return Err(to_sandbox_error(error));
        }
    }
    let sandbox = make_ready(host, target, spec, &generation).await?;
    cleanup.stage = Stage::Done;
    Ok(sandbox)
}

/// Whether dropping a generation that never became a sandbox also drops its draft record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepRecord {
    Yes,
    No,
}

async fn drop_generation(host: &SbxHost, target: &Target, generation: &str, keep: KeepRecord) {
    let root = host.config.root.clone();
    let (name, generation) = (target.name.clone(), generation.to_owned());
    let dropped = tokio::task::spawn_blocking(move || {
        layout::drop_generation(&root, &name, &generation, keep == KeepRecord::Yes)
    })
    .await;
    if !matches!(dropped, Ok(Ok(()))) {
        tracing::warn!(sandbox = %target.name, "could not remove the workspace of a create that did not happen");
    }
}

/// Another process created the name first: adopt it once its record says it is ready.
async fn adopt_race_winner(
    host: &Arc<SbxHost>,
    target: &Target,
    spec: &SandboxSpec,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    // The winner's name is taken before `sbx ls` shows its sandbox: its record, finished once
    // the sandbox is ready, is waited for before the listing is believed.
    let record = wait_for_creator(host, target).await?;
    let Some(row) = listed(host, &target.name).await? else {
        if record.as_ref().is_some_and(|r| r.instance_id.is_none()) {
            // Its creator is still at work, past the wait: not a fault of the daemon's.
            return Err(still_creating(target));
        }
        return Err(SandboxError::DaemonFault(format!(
            "sbx create said {} already exists but `sbx ls` does not list it; fix with `sbx \
             daemon restart`",
            target.name
        )));
    };
    let ready = record
        .as_ref()
        .is_some_and(|r| r.instance_id.is_some() && r.instance_id == row.id);
    if !ready {
        return Err(still_creating(target));
    }
    adopt(host, target, &row, record, Some(spec), false).await
}

#[cold]
fn still_creating(target: &Target) -> SandboxError {
    SandboxError::Busy(format!(
        "another process is still creating {}; retry the acquire",
        target.name
    ))
}

/// Guest mount, id, tool probe, mount point, marker, mount proof, agent-socket check, record,
/// storage base. Any failure is returned; the caller's guard discards the sandbox.
async fn make_ready(
    host: &Arc<SbxHost>,
    target: &Target,
    spec: &SandboxSpec,
    generation: &str,
) -> Result<Arc<SbxSandbox>, SandboxError> {
    let timeout = host.config.command_timeout;
    let dir = target.dir(host);
    let mut record = draft(target, spec, generation);
    write_record(&dir, &record).await?;

    let output = short_exec(&host.cli, &target.sbx, guest_mount_argv(), false, timeout)
        .await
        .map_err(to_sandbox_error)?;
    if exit_code(&output) != Some(0) {
        return Err(classified(&target.sbx, &output));
    }
    let guest_mount = parse_guest_mount(&output.stdout).ok_or_else(|| {
        SandboxError::engine(format!(
            "`pwd -P` in {} printed {:?}, not one absolute path",
            target.name,
            String::from_utf8_lossy(&output.stdout)
        ))
    })?;

    let rows = host.cli.ls().await.map_err(to_sandbox_error)?;
    let instance_id = rows
        .iter()
        .find(|row| row.name == target.name)
        .and_then(|row| row.id.clone())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            SandboxError::engine(format!(
                "`sbx ls` gives the new sandbox {} no id; fix with `sbx daemon restart`",
                target.name
            ))
        })?;

    tool_probe(host, target).await?;
    mount_point(host, target).await?;

    let sandbox = handle(
        host,
        target,
        generation,
        guest_mount.clone(),
        instance_id.clone(),
        true,
        Some(spec),
    )
    .await?;
    let plane = sandbox.plane.clone();
    tokio::task::spawn_blocking(move || plane.write_own(WORKSPACE_MARKER, b""))
        .await
        .map_err(|e| SandboxError::engine(format!("writing the marker did not finish: {e}")))??;
    mount_proof(&sandbox, timeout).await?;
    check_sandbox(host, target).await?;

    record.guest_mount = Some(guest_mount);
    record.instance_id = Some(instance_id);
    write_record(&dir, &record).await?;
    prepare_base(&sandbox).await?;
    Ok(sandbox)
}

async fn write_record(dir: &std::path::Path, record: &Record) -> Result<(), SandboxError> {
    let (dir, record) = (dir.to_path_buf(), record.clone());
    let shown = dir.display().to_string();
    tokio::task::spawn_blocking(move || layout::write_record(&dir, &record))
        .await
        .map_err(|e| SandboxError::engine(format!("writing the record did not finish: {e}")))?
        .map_err(|source| SandboxError::Io {
            operation: "write record",
            path: shown,
            source,
        })
}

/// Every tool the wrapper needs, asked once with a plain `sh -c` (not through the wrapper).
async fn tool_probe(host: &SbxHost, target: &Target) -> Result<(), SandboxError> {
    let argv = tool_probe_argv(SBX_TOOLS).map_err(|e| SandboxError::invalid(e.to_string()))?;
    let output = short_exec(
        &host.cli,
        &target.sbx,
        argv,
        false,
        host.config.command_timeout,
    )
    .await
    .map_err(to_sandbox_error)?;
    match read_tool_probe(output.status, &output.stdout) {
        ToolProbeOutcome::AllPresent => Ok(()),
        ToolProbeOutcome::Missing(tools) => Err(SandboxError::CapabilityNotSupported(format!(
            "the template lacks {} which commands in an sbx sandbox need",
            tools.join(", ")
        ))),
        ToolProbeOutcome::NoShell => Err(SandboxError::CapabilityNotSupported(
            "the template has no sh".into(),
        )),
        ToolProbeOutcome::Failed { .. } => Err(classified(&target.sbx, &output)),
    }
}

/// Makes the storage base's parent as root; the image must not have it.
async fn mount_point(host: &SbxHost, target: &Target) -> Result<(), SandboxError> {
    let argv = script_argv(MOUNT_POINT_SCRIPT, &[&target.parent]);
    let output = short_exec(
        &host.cli,
        &target.sbx,
        argv,
        true,
        host.config.command_timeout,
    )
    .await
    .map_err(to_sandbox_error)?;
    match exit_code(&output) {
        Some(0) => Ok(()),
        Some(MOUNT_POINT_CLASH_EXIT) => Err(SandboxError::invalid(format!(
            "the image already has {}, where the workspace would be bound; choose a work_dir \
             whose parent the image lacks",
            target.parent
        ))),
        _ => Err(classified(&target.sbx, &output)),
    }
}

/// The mount proof: a token written through the host plane must read back through the full
/// wrapper at `<parent>/<probe>`. The probe file is always removed.
async fn mount_proof(sandbox: &SbxSandbox, timeout: Duration) -> Result<(), SandboxError> {
    let token = host_state::random_hex(32).map_err(|e| SandboxError::engine(e.to_string()))?;
    let probe = format!(
        ".maf-sbx-probe-{}",
        host_state::random_hex(16).map_err(|e| SandboxError::engine(e.to_string()))?
    );
    let plane = sandbox.plane.clone();
    let (file, bytes) = (probe.clone(), token.clone().into_bytes());
    tokio::task::spawn_blocking(move || plane.write_own(&file, &bytes))
        .await
        .map_err(|e| SandboxError::engine(format!("writing the probe did not finish: {e}")))??;
    let path = format!("{}/{probe}", sandbox.mount.parent);
    let argv = vec![b"cat".to_vec(), path.into_bytes()];
    let ran = sandbox
        .run_wrapped("/", argv, None, 64 * 1024, timeout)
        .await;
    let plane = sandbox.plane.clone();
    let _ = tokio::task::spawn_blocking(move || plane.remove_own(&probe)).await;
    let needs = "the wrapper needs util-linux `unshare` with --map-user/--map-group (2.38 or \
                 later), user namespaces, and `mount --bind` inside them";
    match ran {
        Ok(GuestEnd::Ran(output)) if output.exit_code == 0 && output.stdout == token.as_bytes() => {
            Ok(())
        }
        Ok(GuestEnd::Ran(output)) => Err(SandboxError::CapabilityNotSupported(format!(
            "the mount proof failed (exit {}): {needs}: {}",
            output.exit_code,
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
        Ok(GuestEnd::Expired(_) | GuestEnd::Overflowed) => Err(SandboxError::EngineTimeout {
            operation: "the mount proof".into(),
            bound: timeout,
        }),
        Err(SandboxError::Engine { detail, .. }) => Err(SandboxError::CapabilityNotSupported(
            format!("the mount proof failed: {needs}: {detail}"),
        )),
        Err(other) => Err(other),
    }
}

/// A new sandbox must have no agent socket: one means the daemon kept forwarding after the
/// setting changed (it was not restarted).
async fn check_sandbox(host: &SbxHost, target: &Target) -> Result<(), SandboxError> {
    let argv = script_argv(NO_AGENT_SCRIPT, &[AGENT_SOCKET]);
    let output = short_exec(
        &host.cli,
        &target.sbx,
        argv,
        false,
        host.config.command_timeout,
    )
    .await
    .map_err(to_sandbox_error)?;
    match exit_code(&output) {
        Some(0) => Ok(()),
        Some(AGENT_SOCKET_EXIT) => Err(SandboxError::HostNotConfined(format!(
            "the new sandbox {} has an SSH agent socket at {AGENT_SOCKET}: the daemon still \
             forwards the agent; run `sbx settings set ssh.agentForwardingEnabled false`, then \
             `sbx daemon restart`",
            target.name
        ))),
        _ => Err(classified(&target.sbx, &output)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        let key = SandboxKey::conversation("s", "t", "a");
        let name = sbx_sandbox_name(&sandbox_core::naming::sbx::NamePrefix::default(), &key, "k");
        Target {
            key,
            kind: "k".into(),
            sbx: sbx_name(&name).unwrap(),
            name,
            base: "/maf-sandbox/work".into(),
            parent: "/maf-sandbox".into(),
        }
    }

    fn ready_record() -> Record {
        Record {
            version: RECORD_VERSION,
            key: ["s".into(), "t".into(), "a".into(), "".into()],
            kind: "k".into(),
            work_dir: "/maf-sandbox/work".into(),
            image: None,
            image_id: None,
            workspace: "ws-0123456789ab".into(),
            guest_mount: Some("/r/ws".into()),
            egress_allow: None,
            egress_plan: None,
            instance_id: Some("id-1".into()),
            retired: None,
            retired_reason: None,
        }
    }

    fn row(target: &Target, id: Option<&str>, workspace: &str) -> LsRow {
        let json = serde_json::json!([{
            "name": target.name,
            "id": id,
            "workspaces": [format!("/r/{}/{workspace}", target.name)],
        }]);
        sbx_cli::parse_ls(json.to_string().as_bytes())
            .unwrap()
            .remove(0)
    }

    #[test]
    fn adoption_refuses_on_the_first_mismatch() {
        let root = std::path::Path::new("/r");
        let t = target();
        let good_row = row(&t, Some("id-1"), "ws-0123456789ab");
        let spec = SandboxSpec::builder("k").build().unwrap();
        assert!(judge_adoption(root, &t, &good_row, Some(ready_record()), Some(&spec)).is_ok());
        let cases: Vec<(&str, LsRow, Option<Record>, &str)> = vec![
            ("no record", good_row.clone(), None, "engine"),
            (
                "unfinished",
                good_row.clone(),
                Some(Record {
                    instance_id: None,
                    ..ready_record()
                }),
                "busy",
            ),
            (
                "workspace name",
                good_row.clone(),
                Some(Record {
                    workspace: "../x".into(),
                    ..ready_record()
                }),
                "engine",
            ),
            (
                "other root",
                row(&t, Some("id-1"), "ws-ba9876543210"),
                Some(ready_record()),
                "engine",
            ),
            (
                "no id",
                row(&t, None, "ws-0123456789ab"),
                Some(ready_record()),
                "engine",
            ),
            (
                "other instance",
                row(&t, Some("id-2"), "ws-0123456789ab"),
                Some(ready_record()),
                "engine",
            ),
            (
                "other key",
                good_row.clone(),
                Some(Record {
                    key: ["s".into(), "t".into(), "b".into(), "".into()],
                    ..ready_record()
                }),
                "engine",
            ),
            (
                "other base",
                good_row.clone(),
                Some(Record {
                    work_dir: "/srv/work".into(),
                    ..ready_record()
                }),
                "spec",
            ),
            (
                "other image",
                good_row.clone(),
                Some(Record {
                    image: Some("x".into()),
                    ..ready_record()
                }),
                "spec",
            ),
            (
                "allowlist",
                good_row.clone(),
                Some(Record {
                    egress_allow: Some(serde_json::json!([["h", null, null]])),
                    ..ready_record()
                }),
                "spec",
            ),
            (
                "no guest mount",
                good_row.clone(),
                Some(Record {
                    guest_mount: None,
                    ..ready_record()
                }),
                "engine",
            ),
        ];
        for (what, row, record, expected) in cases {
            let refusal = judge_adoption(root, &t, &row, record, Some(&spec)).unwrap_err();
            let got = match refusal {
                Refusal::Engine(_) => "engine",
                Refusal::SpecMismatch(_) => "spec",
                Refusal::Busy(_) => "busy",
            };
            assert_eq!(got, expected, "{what}");
        }
        // Without a spec (find), only the record and the row are compared.
        let other_base = Record {
            work_dir: "/srv/work".into(),
            ..ready_record()
        };
        assert!(judge_adoption(root, &t, &good_row, Some(other_base), None).is_ok());
    }

    #[test]
    fn base_parents() {
        assert_eq!(base_parent("/maf-sandbox/work").unwrap(), "/maf-sandbox");
        assert_eq!(base_parent("/a/b/c").unwrap(), "/a/b");
        assert_eq!(
            base_parent("/work").unwrap_err().kind(),
            sandbox_core::ErrorKind::InvalidArgument
        );
    }
}
