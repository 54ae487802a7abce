//! Get-or-create per (key, kind), `find`, image presence (docs/docker-backend.md#local-images) and the
//! storage base.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::naming::docker::docker_container_name;
use sandbox_core::storage_base::{plan_storage_base, storage_base_directories, validate_base};
use sandbox_core::{
    Capability, EntryKind, SandboxError, SandboxKey, SandboxSpec, TransferLimits, DEFAULT_WORK_DIR,
};
use tokio::time::Instant;

use crate::config::{check_image_reference, Resources};
use crate::containers::{ContainerShape, Created, Lifecycle, PauseWait};
use crate::egress::EgressPlan;
use crate::egress_names::{keep_alive_with_forwarder, volume_name, LABEL_EGRESS_V1};
use crate::exec::{GuestCall, GuestEnd, SMALL_BUDGET};
use crate::handle::DockerSandbox;
use crate::ownership_labels::{workload_labels, ContainerRecord, Verdict};
use crate::state::{bounded_join, BackendState, Remembered, WarmEntry};
use crate::tar_header::directory_entry;
use sandbox_core::backend_kit::{run_detached, CleanupOnDrop};

/// The body every workload runs, so any image stays alive whatever its entrypoint.
const KEEP_ALIVE: &str = "while :; do sleep 3600; done";

/// How often the name-conflict adopt loop re-inspects.
const ADOPT_POLL: Duration = Duration::from_millis(250);

/// How many times one acquire may replace a container before giving up.
const MAX_REPLACEMENTS: usize = 4;

/// Everything an acquire decided before touching the engine.
struct Plan<'a> {
    key: &'a SandboxKey,
    kind: &'a str,
    name: String,
    image: String,
    base: String,
    needs_base: bool,
    labels: Vec<(String, String)>,
    policy: String,
    resources: Resources,
    files_in: TransferLimits,
    files_out: TransferLimits,
    /// The allowlist sandbox's proxy policy; `None` for egress closed.
    egress: Option<EgressPlan>,
    /// Its egress volume's name.
    egress_volume: Option<String>,
}

/// How an existing container came to be served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// This call created it.
    Created,
    /// It was there, running, and needed nothing.
    Found,
    /// It needed a start or an unpause, or another process created it under our feet.
    Revived,
    /// Another process won the name: its preparation may still be running.
    Adopted,
}

/// What [`Step::Existing`] decided.
enum Served {
    /// The container is running and verified for this plan already: hand it out as it is.
    Warm(String),
    /// The next step.
    Next(Step),
}

impl Progress {
    /// Fails once another process has held the name past the adopt deadline; `had_container`
    /// says whether a container stood behind the name (it could not serve) or nothing did.
    fn past_adopt_deadline(
        &self,
        name: &str,
        had_container: bool,
        state: &BackendState,
    ) -> Result<(), SandboxError> {
        if !self.adopted || Instant::now() < self.adopt_deadline {
            return Ok(());
        }
        let last_conflict = &self.last_conflict;
        Err(SandboxError::engine(if had_container {
            format!(
                "could not adopt {name} within {} s: {last_conflict}",
                state.config.command_timeout.as_secs()
            )
        } else {
            format!("the name {name} stayed in use without a container behind it: {last_conflict}")
        }))
    }
}

/// One step of an acquire. Each turn of [`BackendState::acquire_sandbox`]'s loop runs one step
/// and names the next; a step that goes back to the top (a new look at the name, a create) passes
/// the adopt deadline first.
enum Step {
    /// Nothing holds the name: check the egress companions, make the proxy, create the workload.
    Create,
    /// The create lost the name to another process: find what holds it now.
    AfterConflict,
    /// A container holds the name: verify it, then serve, revive or replace it.
    Existing(Box<ContainerRecord>),
    /// The container cannot serve (retired, failed to start, in a state that cannot serve):
    /// remove it, then create.
    Replace(String),
    /// Serve this container, prepared as its arrival needs; one this call created comes with its
    /// inspect, still to be verified.
    Finish(String, Arrival, Option<Box<ContainerRecord>>),
}

/// What an acquire carries from one step to the next.
struct Progress {
    adopt_deadline: Instant,
    /// The engine's last answer to a create that lost the name.
    last_conflict: String,
    /// Creates attempted.
    replacements: usize,
    /// Whether another process won the name during this acquire.
    adopted: bool,
    egress_checked: bool,
    proxy_ready: bool,
}

impl BackendState {
    /// Get-or-create: find, verify, revive or replace, else create; then prepare. An explicit
    /// state machine over [`Step`].
    pub(crate) async fn acquire_sandbox(
        self: &Arc<Self>,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let resources = self.resources().await;
        let plan = self.plan(key, spec, resources)?;
        let _serialised = self.lock_name(&plan.name).await;
        self.sweep_unremovable().await;

        let mut progress = Progress {
            adopt_deadline: Instant::now() + self.config.command_timeout,
            last_conflict: String::new(),
            replacements: 0,
            adopted: false,
            egress_checked: false,
            proxy_ready: plan.egress.is_none(),
        };
        let mut step = match self.inspect(&plan.name).await? {
            Some(existing) => Step::Existing(Box::new(existing)),
            None => Step::Create,
        };
        loop {
            step = match step {
                Step::Create => self.create_step(&plan, &mut progress).await?,
                Step::AfterConflict => match self.inspect(&plan.name).await? {
                    Some(existing) => Step::Existing(Box::new(existing)),
                    None => {
                        // The engine holds the name from the start of a create, before an
                        // inspect finds it: wait a poll, then create again.
                        progress.past_adopt_deadline(&plan.name, false, self)?;
                        tokio::time::sleep(ADOPT_POLL).await;
                        Step::Create
                    }
                },
                Step::Existing(existing) => {
                    match self.existing_step(&plan, existing, &mut progress).await? {
                        Served::Warm(id) => return Ok(self.handle(&plan, &id, false)),
                        Served::Next(next) => next,
                    }
                }
                Step::Replace(id) => {
                    self.replace(&id).await?;
                    progress.past_adopt_deadline(&plan.name, true, self)?;
                    Step::Create
                }
                Step::Finish(id, arrival, created) => {
                    return self.finish(&plan, &id, arrival, created).await
                }
            };
        }
    }

    /// [`Step::Create`]: the egress check once, the OS re-check and the image presence check, all
    /// three at once (none changes anything); the proxy once; then one create.
    async fn create_step(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        progress: &mut Progress,
    ) -> Result<Step, SandboxError> {
        if progress.replacements > MAX_REPLACEMENTS {
            return Err(SandboxError::engine(format!(
                "container {} kept disappearing while it was being acquired",
                plan.name
            )));
        }
        let egress = async {
            if progress.egress_checked {
                Ok(())
            } else {
                self.refuse_other_egress(plan).await
            }
        };
        let (egress, os, image) =
            tokio::join!(egress, self.recheck_os(), self.ensure_image(&plan.image));
        egress?;
        progress.egress_checked = true;
        os?;
        image?;
        if !progress.proxy_ready {
            if let Err(error) = self.ensure_plan_proxy(plan).await {
                // No workload: nothing is served by what the attempt made.
                self.remove_companions_shielded(&plan.name).await;
                return Err(error);
            }
            progress.proxy_ready = true;
        }
        progress.replacements += 1;
        let created = match self.create(plan).await {
            Ok(created) => created,
            Err(error) => {
                // Nothing serves the companions of a workload that was not made.
                if plan.egress.is_some() {
                    self.remove_companions_shielded(&plan.name).await;
                }
                return Err(error);
            }
        };
        Ok(match created {
            Created::Id(id, record) => Step::Finish(id, Arrival::Created, Some(record)),
            Created::Conflict(text) => {
                progress.last_conflict = text;
                progress.adopted = true;
                Step::AfterConflict
            }
        })
    }

    /// [`Step::Existing`]: verify the container, then serve it warm, revive it, or replace it.
    async fn existing_step(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        existing: Box<ContainerRecord>,
        progress: &mut Progress,
    ) -> Result<Served, SandboxError> {
        self.verify_for(plan, &existing)?;

        if self.is_retired(&existing.id) {
            return Ok(Served::Next(Step::Replace(existing.id)));
        }
        // A workload is never served, nor started, without a ready proxy.
        if !progress.proxy_ready {
            self.ensure_plan_proxy(plan).await?;
            progress.proxy_ready = true;
        }
        // A container made moments ago by another process is adopted as from a lost create
        // race, whether or not this call saw the conflict: its creator may still be preparing
        // the storage base, which must not be frozen under it.
        let arrival = if progress.adopted || self.is_young(&existing) {
            Arrival::Adopted
        } else {
            Arrival::Found
        };
        let next = match existing.status() {
            "running" => {
                if let Some(entry) = self.warm_entry(&existing.id) {
                    let warm = entry.base == plan.base
                        && entry.policy == plan.policy
                        && (entry.base_ready || !plan.needs_base);
                    if warm {
                        return Ok(Served::Warm(existing.id));
                    }
                }
                Step::Finish(existing.id, arrival, None)
            }
            "paused" => {
                self.forget_warm(&existing.id);
                // An operator's pause, or that of a process on an earlier version of this crate
                // (which wrote the storage base under one and lifts it itself); one that outlasts
                // the wait has no one left to lift it.
                if self.wait_out_pause(&existing.id).await? == PauseWait::Held {
                    self.lifecycle(Lifecycle::Unpause, &existing.id).await?;
                }
                Step::Finish(existing.id, Arrival::Revived, None)
            }
            "created" | "exited" => {
                self.forget_warm(&existing.id);
                self.recheck_os().await?;
                if let Err(error) = self.lifecycle(Lifecycle::Start, &existing.id).await {
                    tracing::warn!(container = %existing.id, %error, "start failed; replacing");
                    return Ok(Served::Next(Step::Replace(existing.id)));
                }
                let arrival = if progress.adopted {
                    Arrival::Adopted
                } else {
                    Arrival::Revived
                };
                Step::Finish(existing.id, arrival, None)
            }
            other => {
                tracing::info!(container = %existing.id, state = other, "replacing a container that cannot serve");
                Step::Replace(existing.id)
            }
        };
        Ok(Served::Next(next))
    }

    /// Refuses a container that is not the one `plan` would make (owner, kind, base, image,
    /// network, egress volume, hardening).
    fn verify_for(&self, plan: &Plan<'_>, record: &ContainerRecord) -> Result<(), SandboxError> {
        record
            .verify(
                plan.key,
                plan.kind,
                Some(&plan.base),
                Some(&plan.image),
                self.config.workload_network(),
                plan.egress_volume.as_deref(),
            )
            .map_err(|verdict| refusal(&plan.name, verdict))
    }

    fn plan<'a>(
        &self,
        key: &'a SandboxKey,
        spec: &'a SandboxSpec,
        resources: Resources,
    ) -> Result<Plan<'a>, SandboxError> {
        let egress = crate::egress::plan(spec, &self.config)?;
        let image = spec
            .image_id()
            .or(spec.image())
            .unwrap_or(&self.config.default_image)
            .to_owned();
        check_image_reference(&image)?;
        let base = validate_base(spec.work_dir().unwrap_or(DEFAULT_WORK_DIR))?;
        let ceiling = self.declarations.limits;
        let egress_id = egress.as_ref().map_or("", |e| e.egress_id.as_str());
        let name = docker_container_name(key, spec.kind(), egress_id);
        let mut labels = workload_labels(key, spec.kind(), spec.labels(), &base);
        if let Some(egress) = &egress {
            labels.push((LABEL_EGRESS_V1.to_owned(), egress.digest.clone()));
        }
        Ok(Plan {
            resources,
            key,
            kind: spec.kind(),
            policy: format!(
                "{image}|{}|{}",
                self.config.hardening_fingerprint(resources),
                egress.as_ref().map_or("closed", |e| e.digest.as_str())
            ),
            egress_volume: egress.as_ref().map(|_| volume_name(&name)),
            egress,
            name,
            labels,
            needs_base: Capability::needs_storage_base(&spec.required_capabilities()),
            image,
            base,
            files_in: min_limits(spec.files_in(), ceiling.files_in),
            files_out: min_limits(spec.files_out(), ceiling.files_out),
        })
    }

    fn handle(self: &Arc<Self>, plan: &Plan<'_>, id: &str, fresh: bool) -> Arc<DockerSandbox> {
        self.remember(
            &plan.name,
            Remembered {
                key: plan.key.clone(),
                kind: plan.kind.to_owned(),
                id: id.to_owned(),
            },
        );
        Arc::new(DockerSandbox::new(
            Arc::clone(self),
            id.to_owned(),
            plan.base.clone(),
            fresh,
            plan.files_in,
            plan.files_out,
        ))
    }

    /// Verifies, prepares and remembers a container this call created or found not yet verified;
    /// one this call created is removed again (with its egress companions) on any failure.
    async fn finish(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        id: &str,
        arrival: Arrival,
        created: Option<Box<ContainerRecord>>,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let fresh = arrival == Arrival::Created;
        // A container this call created is removed on any failure, even if the caller drops us.
        let mut discard = fresh.then(|| {
            let state = Arc::clone(self);
            let id = id.to_owned();
            let companions = plan.egress.is_some().then(|| plan.name.clone());
            CleanupOnDrop::armed("the removal of a half-made sandbox", async move {
                let _ = state.remove(&id).await;
                if let Some(name) = companions {
                    let _ = state.remove_companions(&name).await;
                }
            })
        });
        let result = self.prepare(plan, id, arrival, created.as_deref()).await;
        match result {
            Ok(base_ready) => {
                if let Some(guard) = discard.as_mut() {
                    guard.disarm();
                }
                self.remember_warm(
                    id,
                    WarmEntry {
                        base: plan.base.clone(),
                        policy: plan.policy.clone(),
                        base_ready,
                    },
                );
                Ok(self.handle(plan, id, fresh))
            }
            Err(error) => {
                if let Some(guard) = discard.as_mut() {
                    guard.disarm();
                    self.remove_shielded(id).await;
                    if plan.egress.is_some() {
                        self.remove_companions_shielded(&plan.name).await;
                    }
                }
                Err(error)
            }
        }
    }

    /// Verifies what this call created (from the inspect made while it started), then the one
    /// guest call: the tool probe and the storage base. In a container this call created the host
    /// makes the base engine-side, from the start of the call ([`Self::early_base`]); in any other
    /// the guest makes it, with the engine-side fallback in the call's middle where it cannot.
    /// Then the base's engine-side walk, alongside the egress preflight when configured.
    async fn prepare(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        id: &str,
        arrival: Arrival,
        created: Option<&ContainerRecord>,
    ) -> Result<bool, SandboxError> {
        if let Some(record) = created {
            self.verify_for(plan, record)?;
        }
        let base = plan.needs_base.then_some(plan.base.as_str());
        if let (Some(base), Arrival::Adopted) = (base, arrival) {
            self.await_adopted_base(id, base).await?;
        }
        match (base, created) {
            // Nothing runs in a container this call created but the image's keep-alive: the host
            // makes the base itself, walked while the guest call starts and, with an owner known
            // before the guest says it, written while the guest starts too.
            (Some(base), Some(record)) if arrival == Arrival::Created => {
                let user = record.user();
                let image_id = record.image_id.as_deref();
                let predicted = numeric_owner(user)
                    .or_else(|| image_id.and_then(|image| self.known_image_owner(image, user)));
                self.prepare_guest(
                    id,
                    &plan.image,
                    Some(base),
                    true,
                    |started| self.early_base(id, base, predicted, started),
                    |early, ids| async move {
                        if let Some(image) = image_id {
                            self.remember_image_owner(image, user, ids);
                        }
                        self.settle_base(id, early, ids).await
                    },
                )
                .await?;
            }
            _ => {
                let fallback_base = base.unwrap_or_default();
                self.prepare_guest(
                    id,
                    &plan.image,
                    base,
                    false,
                    |_| async { Ok(()) },
                    |(), ids| self.create_base_fallback(id, fallback_base, ids),
                )
                .await?;
            }
        }
        // The base's walk and the egress preflight touch nothing of each other: both at once.
        let settled = async {
            match base {
                // The guest's word is never taken for what the base's components are.
                Some(base) => still_missing(base, &self.plan_base(id, base).await?),
                None => Ok(()),
            }
        };
        let preflight = async {
            if self.config.verify_egress && arrival == Arrival::Created {
                crate::egress_preflight::verify(self, id, plan.egress.as_ref()).await
            } else {
                Ok(())
            }
        };
        let (settled, preflight) = tokio::join!(settled, preflight);
        settled?;
        preflight?;
        Ok(plan.needs_base)
    }

    /// Creates and starts the container (the OS re-check and the image presence check passed).
    async fn create(self: &Arc<Self>, plan: &Plan<'_>) -> Result<Created, SandboxError> {
        // This create's mark: a container the engine makes after our create gave up (its
        // deadline passed, or the acquire was dropped) is found by it and removed, and only then.
        let mark = exec_wrapper::new_nonce()
            .map_err(|e| SandboxError::engine(e.to_string()))?
            .as_str()
            .to_owned();
        let mut labels: std::collections::HashMap<String, String> =
            plan.labels.iter().cloned().collect();
        labels.insert(CREATE_MARK_LABEL.to_owned(), mark.clone());
        let keep_alive = match plan.egress {
            Some(_) => keep_alive_with_forwarder(KEEP_ALIVE),
            None => KEEP_ALIVE.to_owned(),
        };
        let shape = ContainerShape {
            name: &plan.name,
            image: &plan.image,
            labels,
            keep_alive: &keep_alive,
            resources: plan.resources,
            egress_volume: plan.egress_volume.as_deref(),
        };
        // Between the create request and its answer: when the call gives up, a task the caller
        // cannot cancel removes what the engine may still make under this name and this mark. It
        // takes the name's lock, so no acquire of the same key adopts the container meanwhile.
        let mut abandoned = {
            let state = Arc::clone(self);
            let name = plan.name.clone();
            let mark = mark.clone();
            CleanupOnDrop::armed("the removal of an abandoned create", async move {
                let _serialised = state.lock_name(&name).await;
                let patience = state.config.command_timeout;
                state.remove_if_marked(&name, &mark, patience).await;
            })
        };
        let created = self.create_container(&shape).await;
        if matches!(created, Err(SandboxError::EngineTimeout { .. })) {
            // Leave the guard armed: its task looks for what the engine may still make.
            return created;
        }
        abandoned.disarm();
        created
    }

    /// Before a cold create or start, when os_families was declared, a readable answer
    /// other than `linux` refuses; an unreadable one is let through.
    async fn recheck_os(&self) -> Result<(), SandboxError> {
        if self.declarations.os_families.is_empty() {
            return Ok(());
        }
        match self.engine_os().await {
            Some(os) if os != "linux" => Err(SandboxError::OsFamilyNotSupported(format!(
                "the engine at {} now reports OS {os:?}, not linux",
                self.engine.endpoint()
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the container was created within the adopt budget (one command timeout) of now.
    fn is_young(&self, record: &ContainerRecord) -> bool {
        record
            .created_at()
            .and_then(|created| std::time::SystemTime::now().duration_since(created).ok())
            .is_some_and(|age| age < self.config.command_timeout)
    }

    /// Removes a container that cannot serve, before a create takes its name.
    async fn replace(&self, id: &str) -> Result<(), SandboxError> {
        self.remove(id).await.map(|_| ()).map_err(|failure| {
            SandboxError::engine(format!(
                "could not remove container {id} to replace it: {failure}"
            ))
        })
    }

    /// Another process created this container a moment ago and may be preparing the same base:
    /// while the engine-side walk finds it missing, give that process the adopt budget before
    /// doing it a second time.
    async fn await_adopted_base(&self, id: &str, base: &str) -> Result<(), SandboxError> {
        let until = Instant::now() + self.config.command_timeout;
        let mut missing = self.plan_base(id, base).await?;
        while !missing.is_empty() && Instant::now() < until {
            tokio::time::sleep(ADOPT_POLL).await;
            missing = self.plan_base(id, base).await?;
        }
        Ok(())
    }

    /// The host's part of a new container's storage base from the start of its guest call: the
    /// engine-side walk (its refusals: a link or a non-directory among the components), then,
    /// with an owner `predicted`, the missing suffix written with it once the engine answered the
    /// exec's start (the upload holds the container's lock in the engine, which the start's
    /// checks take too: after them, the two overlap).
    async fn early_base(
        &self,
        id: &str,
        base: &str,
        predicted: Option<(u64, u64)>,
        started: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<EarlyBase, SandboxError> {
        let missing = self.plan_base(id, base).await?;
        let written = match predicted {
            Some((uid, gid)) if !missing.is_empty() => {
                if started.await.is_err() {
                    return Err(SandboxError::engine(
                        "the guest call of the acquire did not start",
                    ));
                }
                self.put_base(id, &missing, uid, gid).await?;
                Some((uid, gid))
            }
            _ => None,
        };
        Ok(EarlyBase { missing, written })
    }

    /// Once the guest of a new container reported its ids: the missing suffix is the guest's, or
    /// is written (again) with its ids. The engine applies an archive entry's owner to a
    /// directory that exists, so a wrong prediction is corrected in place.
    async fn settle_base(
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
        self.put_base(id, &early.missing, uid, gid).await
    }

    /// The guest of a container this call did not create could not make the storage base: the
    /// missing suffix the engine-side walk finds is created engine-side, owned by the guest's
    /// ids, in an order the guest (which may be running) cannot race ([`guarded_base_archive`]).
    async fn create_base_fallback(
        self: &Arc<Self>,
        id: &str,
        base: &str,
        (uid, gid): (u64, u64),
    ) -> Result<(), SandboxError> {
        let missing = self.plan_base(id, base).await?;
        if missing.is_empty() {
            return Ok(());
        }
        self.put_archive(id, "/", guarded_base_archive(&missing, uid, gid)?)
            .await
    }

    /// The engine-side walk of the base's directories, decided by the core.
    async fn plan_base(&self, id: &str, base: &str) -> Result<Vec<String>, SandboxError> {
        let directories = storage_base_directories(base)?;
        let stats = bounded_join(
            directories
                .iter()
                .map(|d| self.stat_kind(id, d.clone()))
                .collect(),
            crate::state::STAT_CONCURRENCY,
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
    async fn put_base(
        &self,
        id: &str,
        missing: &[String],
        uid: u64,
        gid: u64,
    ) -> Result<(), SandboxError> {
        self.put_archive(id, "/", base_archive(missing, uid, gid)?)
            .await
    }

    /// A backend-internal command through the wrapper, cwd `/`, under the command timeout.
    pub(crate) async fn guest_internal(
        self: &Arc<Self>,
        id: &str,
        argv: &[&str],
    ) -> Result<sandbox_core::ExecOutput, SandboxError> {
        let call = GuestCall::internal("/", argv, SMALL_BUDGET as u64, self.config.command_timeout);
        match self.run_guest(id, call).await? {
            GuestEnd::Ran(output) => Ok(output),
            GuestEnd::Expired(_) => Err(SandboxError::EngineTimeout {
                operation: format!("guest {}", argv.first().copied().unwrap_or("command")),
                bound: self.config.command_timeout,
            }),
            GuestEnd::Overflowed => Err(SandboxError::engine(format!(
                "guest {} wrote more than {SMALL_BUDGET} bytes",
                argv.first().copied().unwrap_or("command")
            ))),
        }
    }

    /// `find`: never creates, never removes. One engine request for a running container: its
    /// inspect.
    pub(crate) async fn find_sandbox(
        self: &Arc<Self>,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<DockerSandbox>>, SandboxError> {
        let closed_name = docker_container_name(key, kind, "");
        let _serialised = self.lock_name(&closed_name).await;
        let record = match self.inspect(&closed_name).await? {
            Some(record) => record,
            // Not closed: an allowlist sandbox of this key and kind, if any (its name carries
            // an egress id `find` cannot know).
            None => match self.allowlist_workload(key, kind).await? {
                Some(record) => record,
                None => return Ok(None),
            },
        };
        let name = record.bare_name().to_owned();
        let egress_volume = record.expected_egress_volume();
        record
            .verify(
                key,
                kind,
                None,
                None,
                self.config.workload_network(),
                egress_volume.as_deref(),
            )
            .map_err(|verdict| refusal(&name, verdict))?;
        if self.is_retired(&record.id) {
            return Err(SandboxError::Retired {
                instance: record.id.clone(),
                reason: "a timed-out command's kill did not land".to_owned(),
            });
        }
        if egress_volume.is_some() {
            self.require_ready_proxy(&record).await?;
        }
        match record.status() {
            "running" => {}
            "paused" => {
                self.forget_warm(&record.id);
                if self.wait_out_pause(&record.id).await? == PauseWait::Held {
                    self.lifecycle(Lifecycle::Unpause, &record.id).await?;
                }
            }
            "created" | "exited" => {
                self.forget_warm(&record.id);
                self.recheck_os().await?;
                self.lifecycle(Lifecycle::Start, &record.id).await?;
            }
            other => {
                return Err(SandboxError::engine(format!(
                    "container {name} is {other}; find never replaces it, acquire does"
                )))
            }
        }
        let base = record.work_dir().ok_or_else(|| {
            SandboxError::engine(format!(
                "container {name} records no storage base: it was not made by this backend's rules"
            ))
        })?;
        // The one inspect answered everything a found container needs: ownership, the hardening
        // (`--init` among it, so the engine's init is at /sbin/docker-init and every call runs
        // under it) and the state. The image's tools were probed when this backend created the
        // container (a creation whose probe fails removes it); a wrapper call that fails before
        // its nonce probes them again, to name a missing one.
        self.mark_subreaper(&record.id);
        let ceiling = self.declarations.limits;
        self.remember(
            &name,
            Remembered {
                key: key.clone(),
                kind: kind.to_owned(),
                id: record.id.clone(),
            },
        );
        Ok(Some(Arc::new(DockerSandbox::new(
            Arc::clone(self),
            record.id,
            base,
            false,
            ceiling.files_in,
            ceiling.files_out,
        ))))
    }
}

/// What [`BackendState::early_base`] found and did.
struct EarlyBase {
    /// The base's missing suffix, outermost first.
    missing: Vec<String>,
    /// The owner it was written with, when it was.
    written: Option<(u64, u64)>,
}

/// The owner a `Config.User` of the numeric form `uid:gid` names, without any lookup.
fn numeric_owner(user: &str) -> Option<(u64, u64)> {
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
fn still_missing(base: &str, missing: &[String]) -> Result<(), SandboxError> {
    if missing.is_empty() {
        return Ok(());
    }
    Err(SandboxError::engine(format!(
        "the storage base {base} is still missing {} after it was created",
        missing.join(", ")
    )))
}

fn min_limits(a: TransferLimits, b: TransferLimits) -> TransferLimits {
    TransferLimits {
        max_bytes_per_file: a.max_bytes_per_file.min(b.max_bytes_per_file),
        max_total_bytes: a.max_total_bytes.min(b.max_total_bytes),
        max_files: a.max_files.min(b.max_files),
    }
}

/// The ownership refusals in core terms.
#[cold]
fn refusal(name: &str, verdict: Verdict) -> SandboxError {
    match verdict {
        Verdict::NotOurs => SandboxError::engine(format!(
            "a container named {name} exists that this key did not create; dispose it"
        )),
        Verdict::OtherBase(recorded) => SandboxError::SpecMismatch(format!(
            "container {name} records storage base {}; dispose before changing the storage base",
            recorded.as_deref().unwrap_or("(none)")
        )),
        Verdict::OtherImage(image) => SandboxError::SpecMismatch(format!(
            "container {name} runs image {}; dispose it before changing the image",
            image.as_deref().unwrap_or("(none)")
        )),
        Verdict::OtherPolicy(difference) => SandboxError::SpecMismatch(format!(
            "container {name}: {difference}; its runtime policy differs from this configuration; dispose it first"
        )),
    }
}

impl BackendState {
    /// The proxy of an allowlist plan, ready.
    async fn ensure_plan_proxy(&self, plan: &Plan<'_>) -> Result<(), SandboxError> {
        match &plan.egress {
            Some(egress) => self.ensure_proxy(&plan.name, egress, &plan.labels).await,
            None => Ok(()),
        }
    }

    /// The key's other workloads of this kind (another egress, so another name): one found means
    /// the egress changed on a warm key, refused like any other spec change (docs/docker-backend.md#allowlist-egress).
    async fn refuse_other_egress(&self, plan: &Plan<'_>) -> Result<(), SandboxError> {
        for record in self.key_workloads(plan.key, plan.kind).await? {
            if record.bare_name() == plan.name {
                continue;
            }
            let theirs = if record.labels().contains_key(LABEL_EGRESS_V1) {
                "egress allowlist with another list"
            } else {
                "egress closed"
            };
            let ours = match &plan.egress {
                Some(egress) => format!("allowlist {}", egress.hosts.join(",")),
                None => "closed".to_owned(),
            };
            return Err(SandboxError::SpecMismatch(format!(
                "the sandbox {} of this key and kind runs with {theirs}; dispose it before \
                 changing the egress to {ours}",
                record.bare_name()
            )));
        }
        Ok(())
    }

    /// The workloads whose labels name exactly this key (call included) and kind.
    async fn key_workloads(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Vec<ContainerRecord>, SandboxError> {
        let selection = crate::ownership_labels::ContainerSelector::of_key(key, Some(kind));
        let ids: Vec<String> = self
            .listing(&selection)
            .await?
            .into_iter()
            .filter(|(_, name)| !crate::egress_names::is_proxy_name(name))
            .map(|(id, _)| id)
            .collect();
        Ok(self
            .inspect_many(&ids)
            .await?
            .into_iter()
            .filter(|record| record.owned_by(key, Some(kind)))
            .collect())
    }

    /// The allowlist workload of this key and kind, for `find`.
    async fn allowlist_workload(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<ContainerRecord>, SandboxError> {
        let mut found: Vec<ContainerRecord> = self
            .key_workloads(key, kind)
            .await?
            .into_iter()
            .filter(|record| record.expected_egress_volume().is_some())
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        if found.len() > 1 {
            return Err(SandboxError::engine(format!(
                "{} allowlist sandboxes of one key and kind exist ({}); dispose them",
                found.len(),
                found
                    .iter()
                    .map(ContainerRecord::bare_name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(found.pop())
    }

    /// Removes an allowlist sandbox's companions in a task the caller's drop cannot cancel.
    async fn remove_companions_shielded(self: &Arc<Self>, name: &str) {
        let state = Arc::clone(self);
        let name = name.to_owned();
        let _ = run_detached(async move {
            for failure in state.remove_companions(&name).await {
                tracing::warn!(sandbox = %name, %failure, "could not remove an egress companion");
            }
        })
        .await;
    }
}

/// The label carrying one create's mark (a per-call nonce). Other backends ignore it.
const CREATE_MARK_LABEL: &str = "maf-sandbox.create-mark";

impl BackendState {
    /// Removes the container named `name` if it carries `mark`, looking for up to `patience` for one
    /// the daemon is still making. A container without the mark is another create's and is kept.
    async fn remove_if_marked(&self, name: &str, mark: &str, patience: Duration) {
        let until = Instant::now() + patience;
        loop {
            match self.inspect(name).await {
                Ok(Some(record)) => {
                    if record.labels().get(CREATE_MARK_LABEL).map(String::as_str) == Some(mark) {
                        if let Err(failure) = self.remove(&record.id).await {
                            tracing::warn!(container = %name, %failure, "an abandoned create could not be removed");
                        }
                    }
                    return;
                }
                Ok(None) | Err(_) if Instant::now() < until => {
                    tokio::time::sleep(ABANDONED_CREATE_POLL).await;
                }
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// How often an abandoned create is looked for.
const ABANDONED_CREATE_POLL: Duration = Duration::from_millis(250);

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
