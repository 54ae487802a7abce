//! Get-or-create per (key, kind) and `find`: the [`Acquirer`], whose explicit [`Step`] machine
//! finds, verifies, revives or replaces a container, else creates one (with the image present:
//! docs/docker-backend.md#local-images), then prepares it and its storage base.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;

use sandbox_core::naming::docker::{docker_container_name, LABEL_CREATE_MARK, POOL_SCOPE};
use sandbox_core::storage_base::validate_base;
use sandbox_core::{
    BackendDeclarations, Capability, Sandbox, SandboxError, SandboxKey, SandboxSpec,
    TransferLimits, DEFAULT_WORK_DIR,
};
use tokio::time::Instant;

use crate::config::DockerConfig;
use crate::config::{check_image_reference, Resources};
use crate::connection::EngineConnection;
use crate::containers::{ContainerShape, Containers, Created, Lifecycle, PauseWait};
use crate::egress::EgressCompanions;
use crate::egress::EgressPlan;
use crate::egress_names::{keep_alive_with_forwarder, volume_name, LABEL_EGRESS_V1};
use crate::fork_copy::ForkCopy;
use crate::guest_calls::GuestCalls;
use crate::handle::{DockerSandbox, HandleParts, Origin, Remake};
use crate::memory::{Memories, Remembered, WarmEntry};
use crate::ownership_labels::{workload_labels, ContainerRecord, Verdict};
use crate::pool::{Claim, MakeMember, Pool, Shape};
use crate::pool_names::{pool_key, POOL_KIND};
use crate::retirement::Retirement;
use crate::sizing::Sizing;
use crate::storage_base::{numeric_owner, still_missing, StorageBase, ADOPT_POLL};
use sandbox_core::backend_kit::{CleanupOnDrop, LockTable};

/// The body every workload runs, so any image stays alive whatever its entrypoint.
const KEEP_ALIVE: &str = "while :; do sleep 3600; done";

/// How many times one acquire may replace a container before giving up.
const MAX_REPLACEMENTS: usize = 4;

/// Everything an acquire decided before touching the engine.
struct Plan<'a> {
    key: &'a SandboxKey,
    spec: &'a SandboxSpec,
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
    /// A warm pool member being filled: never claimed from the pool, and the pool's other
    /// members are no other egress of its key.
    member: bool,
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

/// What [`Step::Existing`] or [`Step::Claim`] decided.
enum Served {
    /// The container is running and verified for this plan already: hand it out as it is.
    Warm(String),
    /// A pool member this call claimed and verified: hand it out, fresh for the key.
    Claimed(String),
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
        adopt_budget: Duration,
    ) -> Result<(), SandboxError> {
        if !self.adopted || Instant::now() < self.adopt_deadline {
            return Ok(());
        }
        let last_conflict = &self.last_conflict;
        Err(SandboxError::engine(if had_container {
            format!(
                "could not adopt {name} within {} s: {last_conflict}",
                adopt_budget.as_secs()
            )
        } else {
            format!("the name {name} stayed in use without a container behind it: {last_conflict}")
        }))
    }
}

/// One step of an acquire. Each turn of [`Acquirer::acquire_sandbox`]'s loop runs one step
/// and names the next; a step that goes back to the top (a new look at the name, a create) passes
/// the adopt deadline first.
enum Step {
    /// Nothing holds the name and the plan has a pool shape: claim a ready member, else create.
    Claim(Box<Shape>),
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
    /// The ready proxy's container id, once this acquire has seen it ready.
    proxy_id: Option<String>,
}

/// Get-or-create per (key, kind) and `find`: the explicit [`Step`] machine over the
/// components below it, under the process-wide lock of each container name.
#[derive(Debug)]
pub(crate) struct Acquirer {
    pub(crate) engine: EngineConnection,
    pub(crate) config: Arc<DockerConfig>,
    pub(crate) declarations: BackendDeclarations,
    pub(crate) name_locks: Arc<LockTable<String>>,
    pub(crate) sizing: Arc<Sizing>,
    pub(crate) containers: Arc<Containers>,
    pub(crate) guest: Arc<GuestCalls>,
    pub(crate) storage_base: StorageBase,
    pub(crate) egress: Arc<EgressCompanions>,
    pub(crate) retirement: Arc<Retirement>,
    pub(crate) memory: Arc<Memories>,
    /// What each handed-out handle reaches.
    pub(crate) handle_parts: HandleParts,
    /// This acquirer, for the handles it hands out to reset through.
    pub(crate) me: Weak<Acquirer>,
    /// The file copy of a fork.
    pub(crate) fork_copy: ForkCopy,
    /// The warm pool fresh acquires claim from, and which this acquirer fills.
    pub(crate) pool: Arc<Pool>,
}

impl Acquirer {
    /// Get-or-create: find, verify, revive or replace, else create; then prepare. An explicit
    /// state machine over [`Step`].
    pub(crate) async fn acquire_sandbox(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        refuse_pool_scope(key)?;
        let resources = self.sizing.resources().await;
        let plan = self.plan(key, spec, resources)?;
        self.acquire_planned(&plan).await
    }

    /// The get-or-create of one plan, under the lock of its name.
    async fn acquire_planned(&self, plan: &Plan<'_>) -> Result<Arc<DockerSandbox>, SandboxError> {
        let _serialised = self.name_locks.lock(plan.name.clone()).await;
        self.retirement.sweep_unremovable().await;

        let mut progress = Progress {
            adopt_deadline: Instant::now() + self.config.command_timeout,
            last_conflict: String::new(),
            replacements: 0,
            adopted: false,
            egress_checked: plan.member,
            proxy_ready: plan.egress.is_none(),
            proxy_id: None,
        };
        let served = self.acquire_steps(plan, &mut progress).await?;
        // With an observer configured, the proxy's decisions are this sandbox's events.
        if let Some(proxy) = &progress.proxy_id {
            self.egress.follow(proxy, served.instance_id());
        }
        Ok(served)
    }

    /// The steps of [`acquire_planned`](Self::acquire_planned), from the first inspect.
    async fn acquire_steps(
        &self,
        plan: &Plan<'_>,
        progress: &mut Progress,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let mut step = match self.containers.inspect(&plan.name).await? {
            Some(existing) => Step::Existing(Box::new(existing)),
            None => match self.pool_shape(plan) {
                Some(shape) => Step::Claim(Box::new(shape)),
                None => Step::Create,
            },
        };
        loop {
            step = match step {
                Step::Claim(shape) => match self.claim_step(plan, &shape, progress).await? {
                    Served::Claimed(id) => return Ok(self.claimed(plan, &id)),
                    Served::Warm(id) => return Ok(self.handle(plan, &id, false)),
                    Served::Next(next) => next,
                },
                Step::Create => self.create_step(plan, progress).await?,
                Step::AfterConflict => match self.containers.inspect(&plan.name).await? {
                    Some(existing) => Step::Existing(Box::new(existing)),
                    None => {
                        // The engine holds the name from the start of a create, before an
                        // inspect finds it: wait a poll, then create again.
                        progress.past_adopt_deadline(
                            &plan.name,
                            false,
                            self.config.command_timeout,
                        )?;
                        tokio::time::sleep(ADOPT_POLL).await;
                        Step::Create
                    }
                },
                Step::Existing(existing) => {
                    match self.existing_step(plan, existing, progress).await? {
                        Served::Warm(id) => return Ok(self.handle(plan, &id, false)),
                        Served::Claimed(id) => return Ok(self.claimed(plan, &id)),
                        Served::Next(next) => next,
                    }
                }
                Step::Replace(id) => {
                    self.replace(&id).await?;
                    progress.past_adopt_deadline(&plan.name, true, self.config.command_timeout)?;
                    Step::Create
                }
                Step::Finish(id, arrival, created) => {
                    return self.finish(plan, &id, arrival, created).await
                }
            };
        }
    }

    /// The pool shape of a plan, when fresh acquires of it claim from the pool: a pool is
    /// configured, egress is closed (an allowlist sandbox's companions are named after its
    /// container), and the plan does not fill the pool itself.
    fn pool_shape(&self, plan: &Plan<'_>) -> Option<Shape> {
        if !self.pool.enabled() || plan.member || plan.egress.is_some() {
            return None;
        }
        Some(Shape::new(
            &plan.image,
            &plan.base,
            plan.needs_base,
            &plan.policy,
            self.config.workload_network(),
        ))
    }

    /// The pool shape acquires of `spec` claim from; `None` when they do not.
    pub(crate) async fn pool_shape_of(
        &self,
        spec: &SandboxSpec,
    ) -> Result<Option<Shape>, SandboxError> {
        let key = SandboxKey::conversation("pool-shape", "pool-shape", "pool-shape");
        let resources = self.sizing.resources().await;
        let plan = self.plan(&key, spec, resources)?;
        Ok(self.pool_shape(&plan))
    }

    /// [`Step::Claim`]: the egress check and the claim at once; a member claimed for a key whose
    /// egress check fails is removed, never handed out. A claimed member was made and prepared
    /// for exactly this shape, so it is verified from its inspect and served as it is.
    async fn claim_step(
        &self,
        plan: &Plan<'_>,
        shape: &Shape,
        progress: &mut Progress,
    ) -> Result<Served, SandboxError> {
        let (egress, claim) = tokio::join!(
            self.refuse_other_egress(plan),
            self.pool.claim(shape, &plan.name, &plan.labels)
        );
        if let Err(error) = egress {
            if let Ok(Claim::Claimed(id, _)) = &claim {
                self.pool.discard(id).await;
            }
            return Err(error);
        }
        progress.egress_checked = true;
        Ok(match claim? {
            Claim::Claimed(id, record) => {
                if let Err(error) = self.verify_for(plan, &record) {
                    self.pool.discard(&id).await;
                    return Err(error);
                }
                Served::Claimed(id)
            }
            Claim::NameTaken(text) => {
                progress.last_conflict = text;
                progress.adopted = true;
                Served::Next(Step::AfterConflict)
            }
            Claim::Empty => Served::Next(Step::Create),
        })
    }

    /// A handle to a claimed member: its calls run under the engine's init (every member has
    /// `--init`) unless this process's own probe found the exec init; its base was made and
    /// walked when it was filled, and nothing has run in it since.
    fn claimed(&self, plan: &Plan<'_>, id: &str) -> Arc<DockerSandbox> {
        self.memory.probes.mark_subreaper(id);
        self.memory.warm.insert(
            id,
            WarmEntry {
                base: plan.base.clone(),
                policy: plan.policy.clone(),
                base_ready: plan.needs_base,
            },
        );
        self.handle(plan, id, true)
    }

    /// [`Step::Create`]: the egress check once, the OS re-check and the image presence check, all
    /// three at once (none changes anything); the proxy once; then one create.
    async fn create_step(
        &self,
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
        let (egress, os, image) = tokio::join!(
            egress,
            self.recheck_os(),
            self.containers.ensure_image(&plan.image)
        );
        egress?;
        progress.egress_checked = true;
        os?;
        image?;
        if !progress.proxy_ready {
            match self.ensure_plan_proxy(plan).await {
                Ok(proxy) => progress.proxy_id = proxy,
                Err(error) => {
                    // No workload: nothing is served by what the attempt made.
                    self.egress.remove_companions_shielded(&plan.name).await;
                    return Err(error);
                }
            }
            progress.proxy_ready = true;
        }
        progress.replacements += 1;
        let created = match self.create(plan).await {
            Ok(created) => created,
            Err(error) => {
                // Nothing serves the companions of a workload that was not made.
                if plan.egress.is_some() {
                    self.egress.remove_companions_shielded(&plan.name).await;
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
        &self,
        plan: &Plan<'_>,
        existing: Box<ContainerRecord>,
        progress: &mut Progress,
    ) -> Result<Served, SandboxError> {
        self.verify_for(plan, &existing)?;

        if self.memory.retired.contains(&existing.id) {
            return Ok(Served::Next(Step::Replace(existing.id)));
        }
        // A workload is never served, nor started, without a ready proxy.
        if !progress.proxy_ready {
            progress.proxy_id = self.ensure_plan_proxy(plan).await?;
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
                // A terminating proxy may have been made again just now, with a new CA: the
                // workload's trust is written again, in `finish`, on every acquire.
                let terminated = plan.egress.as_ref().is_some_and(EgressPlan::terminates);
                if let Some(entry) = self.memory.warm.get(&existing.id).filter(|_| !terminated) {
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
                self.memory.warm.forget(&existing.id);
                // An operator's pause, or that of a process on an earlier version of this crate
                // (which wrote the storage base under one and lifts it itself); one that outlasts
                // the wait has no one left to lift it.
                if self.containers.wait_out_pause(&existing.id).await? == PauseWait::Held {
                    self.containers
                        .lifecycle(Lifecycle::Unpause, &existing.id)
                        .await?;
                }
                Step::Finish(existing.id, Arrival::Revived, None)
            }
            "created" | "exited" => {
                self.memory.warm.forget(&existing.id);
                self.recheck_os().await?;
                if let Err(error) = self
                    .containers
                    .lifecycle(Lifecycle::Start, &existing.id)
                    .await
                {
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
    /// network, egress volume, hardening, runtime).
    fn verify_for(&self, plan: &Plan<'_>, record: &ContainerRecord) -> Result<(), SandboxError> {
        record
            .verify(
                plan.key,
                plan.kind,
                Some(&plan.base),
                Some(&plan.image),
                self.config.workload_network(),
                plan.egress_volume.as_deref(),
                self.config.runtime.as_deref(),
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
            spec,
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
            member: false,
        })
    }

    fn handle(&self, plan: &Plan<'_>, id: &str, fresh: bool) -> Arc<DockerSandbox> {
        self.memory.adoptions.remember(
            &plan.name,
            Remembered {
                key: plan.key.clone(),
                kind: plan.kind.to_owned(),
                id: id.to_owned(),
            },
        );
        Arc::new(DockerSandbox::new(
            self.handle_parts.clone(),
            id.to_owned(),
            plan.base.clone(),
            fresh,
            plan.files_in,
            plan.files_out,
            Origin {
                key: plan.key.clone(),
                kind: plan.kind.to_owned(),
                spec: Some(plan.spec.clone()),
            },
            self.remake(),
        ))
    }

    /// This acquirer as what a handle resets through.
    fn remake(&self) -> Arc<dyn Remake> {
        match self.me.upgrade() {
            Some(me) => me as Arc<dyn Remake>,
            // Unreachable while `self` is borrowed from its `Arc`; a handle made without it
            // refuses to reset rather than reaching a gone acquirer.
            None => Arc::new(Gone),
        }
    }

    /// Verifies, prepares and remembers a container this call created or found not yet verified;
    /// one this call created is removed again (with its egress companions) on any failure.
    async fn finish(
        &self,
        plan: &Plan<'_>,
        id: &str,
        arrival: Arrival,
        created: Option<Box<ContainerRecord>>,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let fresh = arrival == Arrival::Created;
        // A container this call created is removed on any failure, even if the caller drops us.
        let mut discard = fresh.then(|| {
            let containers = Arc::clone(&self.containers);
            let egress = Arc::clone(&self.egress);
            let id = id.to_owned();
            let companions = plan.egress.is_some().then(|| plan.name.clone());
            CleanupOnDrop::armed("the removal of a half-made sandbox", async move {
                let _ = containers.remove(&id).await;
                if let Some(name) = companions {
                    let _ = egress.remove_companions(&name).await;
                }
            })
        });
        let mut result = self.prepare(plan, id, arrival, created.as_deref()).await;
        if result.is_ok() && plan.egress.as_ref().is_some_and(EgressPlan::terminates) {
            if let Err(error) = crate::egress_trust::install(&self.handle_parts.archive, id).await {
                result = Err(error);
            }
        }
        match result {
            Ok(base_ready) => {
                if let Some(guard) = discard.as_mut() {
                    guard.disarm();
                }
                self.memory.warm.insert(
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
                    self.containers.remove_shielded(id).await;
                    if plan.egress.is_some() {
                        self.egress.remove_companions_shielded(&plan.name).await;
                    }
                }
                Err(error)
            }
        }
    }

    /// Verifies what this call created (from the inspect made while it started), then the one
    /// guest call: the tool probe and the storage base. In a container this call created the host
    /// makes the base engine-side, from the start of the call ([`StorageBase::early`]); in any other
    /// the guest makes it, with the engine-side fallback in the call's middle where it cannot.
    /// Then the base's engine-side walk, alongside the egress preflight when configured.
    async fn prepare(
        &self,
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
            self.storage_base.await_adopted(id, base).await?;
        }
        match (base, created) {
            // Nothing runs in a container this call created but the image's keep-alive: the host
            // makes the base itself, walked while the guest call starts and, with an owner known
            // before the guest says it, written while the guest starts too.
            (Some(base), Some(record)) if arrival == Arrival::Created => {
                let user = record.user();
                let image_id = record.image_id.as_deref();
                let predicted = numeric_owner(user).or_else(|| {
                    image_id.and_then(|image| self.memory.image_owners.get(image, user))
                });
                self.guest
                    .prepare_guest(
                        id,
                        &plan.image,
                        Some(base),
                        true,
                        |started| self.storage_base.early(id, base, predicted, started),
                        |early, ids| async move {
                            if let Some(image) = image_id {
                                self.memory.image_owners.remember(image, user, ids);
                            }
                            self.storage_base.settle(id, early, ids).await
                        },
                    )
                    .await?;
            }
            _ => {
                let fallback_base = base.unwrap_or_default();
                self.guest
                    .prepare_guest(
                        id,
                        &plan.image,
                        base,
                        false,
                        |_| async { Ok(()) },
                        |(), ids| self.storage_base.create_fallback(id, fallback_base, ids),
                    )
                    .await?;
            }
        }
        // The base's walk and the egress preflight touch nothing of each other: both at once.
        let settled = async {
            match base {
                // The guest's word is never taken for what the base's components are.
                Some(base) => still_missing(base, &self.storage_base.plan(id, base).await?),
                None => Ok(()),
            }
        };
        let preflight = async {
            if self.config.verify_egress && arrival == Arrival::Created {
                crate::egress_preflight::verify(
                    &self.guest,
                    &self.engine,
                    &self.config,
                    id,
                    plan.egress.as_ref(),
                )
                .await
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
    async fn create(&self, plan: &Plan<'_>) -> Result<Created, SandboxError> {
        // This create's mark: a container the engine makes after our create gave up (its
        // deadline passed, or the acquire was dropped) is found by it and removed, and only then.
        let mark = exec_wrapper::new_nonce()
            .map_err(|e| SandboxError::engine(e.to_string()))?
            .as_str()
            .to_owned();
        let mut labels: std::collections::HashMap<String, String> =
            plan.labels.iter().cloned().collect();
        labels.insert(LABEL_CREATE_MARK.to_owned(), mark.clone());
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
            egress_terminated: plan.egress.as_ref().is_some_and(EgressPlan::terminates),
        };
        // Between the create request and its answer: when the call gives up, a task the caller
        // cannot cancel removes what the engine may still make under this name and this mark. It
        // takes the name's lock, so no acquire of the same key adopts the container meanwhile.
        let mut abandoned = {
            let name_locks = Arc::clone(&self.name_locks);
            let containers = Arc::clone(&self.containers);
            let patience = self.config.command_timeout;
            let name = plan.name.clone();
            let mark = mark.clone();
            CleanupOnDrop::armed("the removal of an abandoned create", async move {
                let _serialised = name_locks.lock(name.clone()).await;
                containers.remove_if_marked(&name, &mark, patience).await;
            })
        };
        let created = self.containers.create_container(&shape).await;
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
        match self.containers.engine_os().await {
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
        self.containers
            .remove(id)
            .await
            .map(|_| ())
            .map_err(|failure| {
                SandboxError::engine(format!(
                    "could not remove container {id} to replace it: {failure}"
                ))
            })
    }

    /// `find`: never creates, never removes. One engine request for a running container: its
    /// inspect.
    pub(crate) async fn find_sandbox(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<DockerSandbox>>, SandboxError> {
        let closed_name = docker_container_name(key, kind, "");
        let _serialised = self.name_locks.lock(closed_name.clone()).await;
        let record = match self.containers.inspect(&closed_name).await? {
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
                self.config.runtime.as_deref(),
            )
            .map_err(|verdict| refusal(&name, verdict))?;
        if self.memory.retired.contains(&record.id) {
            return Err(SandboxError::Retired {
                instance: record.id.clone(),
                reason: "a timed-out command's kill did not land".to_owned(),
            });
        }
        if egress_volume.is_some() {
            self.egress.require_ready_proxy(&record).await?;
        }
        match record.status() {
            "running" => {}
            "paused" => {
                self.memory.warm.forget(&record.id);
                if self.containers.wait_out_pause(&record.id).await? == PauseWait::Held {
                    self.containers
                        .lifecycle(Lifecycle::Unpause, &record.id)
                        .await?;
                }
            }
            "created" | "exited" => {
                self.memory.warm.forget(&record.id);
                self.recheck_os().await?;
                self.containers
                    .lifecycle(Lifecycle::Start, &record.id)
                    .await?;
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
        self.memory.probes.mark_subreaper(&record.id);
        let ceiling = self.declarations.limits;
        self.memory.adoptions.remember(
            &name,
            Remembered {
                key: key.clone(),
                kind: kind.to_owned(),
                id: record.id.clone(),
            },
        );
        Ok(Some(Arc::new(DockerSandbox::new(
            self.handle_parts.clone(),
            record.id,
            base,
            false,
            ceiling.files_in,
            ceiling.files_out,
            Origin {
                key: key.clone(),
                kind: kind.to_owned(),
                spec: None,
            },
            self.remake(),
        ))))
    }

    /// The proxy of an allowlist plan, ready.
    async fn ensure_plan_proxy(&self, plan: &Plan<'_>) -> Result<Option<String>, SandboxError> {
        match &plan.egress {
            Some(egress) => self
                .egress
                .ensure_proxy(&plan.name, egress, &plan.labels)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    /// The key's other workloads of this kind (another egress, so another name): one found means
    /// the egress changed on a warm key, refused like any other spec change (docs/docker-backend.md#allowlist-egress).
    async fn refuse_other_egress(&self, plan: &Plan<'_>) -> Result<(), SandboxError> {
        for record in self.key_workloads(plan.key, plan.kind).await? {
            if record.bare_name() == plan.name {
                continue;
            }
            if is_forming_name(record.bare_name()) {
                // What a fork that ended early (a crash, a kill) left under this key: never
                // served, removed before the key gets a sandbox of its own.
                self.replace(&record.id).await?;
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
            .containers
            .listing(&selection)
            .await?
            .into_iter()
            .filter(|(_, name)| !crate::egress_names::is_proxy_name(name))
            .map(|(id, _)| id)
            .collect();
        Ok(self
            .containers
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
}

#[async_trait]
impl MakeMember for Acquirer {
    /// A cold acquire of the pool's key for `shape` under `name`: created, verified, probed, its
    /// base made and walked, its egress checked when configured; removed on any failure.
    async fn make_member(&self, shape: &Shape, name: &str) -> Result<String, SandboxError> {
        let key = pool_key(&shape.digest);
        let spec = SandboxSpec::builder(POOL_KIND)
            .image(shape.image.clone())
            .work_dir(Some(shape.base.clone()))
            .build()?;
        let resources = self.sizing.resources().await;
        let mut plan = self.plan(&key, &spec, resources)?;
        plan.name = name.to_owned();
        plan.needs_base = shape.needs_base;
        plan.member = true;
        let made = self.acquire_planned(&plan).await?;
        Ok(made.instance_id().to_owned())
    }
}

/// Refuses a key in the pool's own scope: its sandboxes are the pool's members.
fn refuse_pool_scope(key: &SandboxKey) -> Result<(), SandboxError> {
    if key.scope == POOL_SCOPE {
        return Err(SandboxError::invalid(format!(
            "the scope {POOL_SCOPE} is the warm pool's own; choose another"
        )));
    }
    Ok(())
}

/// The mark in the name of a container a fork is still filling: `<target name>-forming-<8 hex>`.
const FORMING_MARK: &str = "-forming-";

/// Whether a workload's name is that of an unfinished fork.
fn is_forming_name(name: &str) -> bool {
    name.contains(FORMING_MARK)
}

/// A fresh name for a fork's container while it is filled: the target's name, marked.
fn forming_name(target_name: &str) -> Result<String, SandboxError> {
    let nonce = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    let nonce = nonce.as_str();
    Ok(format!(
        "{target_name}{FORMING_MARK}{}",
        &nonce[..nonce.len().min(8)]
    ))
}

/// What a handle resets through when its acquirer is gone: a refusal.
#[derive(Debug)]
struct Gone;

#[async_trait]
impl Remake for Gone {
    async fn remake(&self, _: &Origin, id: &str) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Err(SandboxError::SandboxGone {
            instance: id.to_owned(),
        })
    }
}

#[async_trait]
impl Remake for Acquirer {
    /// Removes the container by id, once it is found to be this key's (never a replacement
    /// another acquire made under the name), then acquires the key afresh: the image, the
    /// storage base, the spec's policy, and nothing a command made.
    async fn remake(&self, origin: &Origin, id: &str) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let record = self
            .containers
            .inspect(id)
            .await?
            .filter(|record| record.owned_by(&origin.key, Some(&origin.kind)))
            .ok_or_else(|| SandboxError::SandboxGone {
                instance: id.to_owned(),
            })?;
        let spec = match &origin.spec {
            Some(spec) => spec.clone(),
            None => spec_of_found(&origin.kind, &record)?,
        };
        let resources = self.sizing.resources().await;
        let plan = self.plan(&origin.key, &spec, resources)?;
        self.verify_for(&plan, &record)?;
        {
            let _serialised = self.name_locks.lock(plan.name.clone()).await;
            self.memory.warm.forget(id);
            self.containers.remove(id).await.map_err(|failure| {
                SandboxError::engine(format!(
                    "could not remove container {id} to reset it: {failure}"
                ))
            })?;
        }
        let handle: Arc<dyn Sandbox> = self.acquire_planned(&plan).await?;
        Ok(handle)
    }
}

impl Acquirer {
    /// `fork`: the target acquired under a marked name, the source's changed files copied in,
    /// then the container renamed to the target's name: an acquire of the target never finds a
    /// fork half made, and what one that ended early left is found by the target's disposal,
    /// its conversation's purge, and its next acquire (which removes it).
    pub(crate) async fn fork_sandbox(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        if spec.egress() != sandbox_core::Egress::Closed {
            return Err(SandboxError::Unsupported(
                "a fork of an allowlist sandbox is not made: its proxy and volume are named \
                 after its container"
                    .into(),
            ));
        }
        sandbox_core::backend_kit::refuse_fork_onto_source(source, target)?;
        refuse_pool_scope(target)?;
        let resources = self.sizing.resources().await;
        let source_plan = self.plan(source, spec, resources)?;
        let target_plan = self.plan(target, spec, resources)?;
        let source_record = self
            .containers
            .inspect(&source_plan.name)
            .await?
            .ok_or_else(|| {
                SandboxError::invalid(format!(
                    "the source key has no sandbox of kind {:?} to fork",
                    spec.kind()
                ))
            })?;
        self.verify_for(&source_plan, &source_record)?;
        if self.containers.inspect(&target_plan.name).await?.is_some() {
            return Err(SandboxError::invalid(format!(
                "the target key already has a sandbox of kind {:?} ({}); dispose it first",
                spec.kind(),
                target_plan.name
            )));
        }
        let mut forming = self.plan(target, spec, resources)?;
        forming.name = forming_name(&target_plan.name)?;
        let made = self.acquire_planned(&forming).await?;
        let id = made.instance_id().to_owned();
        // From here, a failure or a drop removes the unfinished fork.
        let mut unfinished = {
            let containers = Arc::clone(&self.containers);
            let id = id.clone();
            CleanupOnDrop::armed("the removal of an unfinished fork", async move {
                let _ = containers.remove(&id).await;
            })
        };
        let finished = async {
            self.fork_copy.copy(&source_record.id, &id).await?;
            self.containers.rename(&id, &target_plan.name).await
        }
        .await;
        unfinished.disarm();
        if let Err(error) = finished {
            self.containers.remove_shielded(&id).await;
            return Err(error);
        }
        Ok(self.handle(&target_plan, &id, true))
    }
}

/// The spec a found container was made with, read back from its record, for a reset: its kind,
/// image, storage base and labels. An allowlist sandbox's hosts live only in its proxy, and a
/// label too long to keep is kept only as a digest: those are refused (acquire the key with its
/// spec, then reset that handle).
fn spec_of_found(kind: &str, record: &ContainerRecord) -> Result<SandboxSpec, SandboxError> {
    use sandbox_core::naming::docker::{is_digest_label, LABEL_USER_PREFIX};
    let refuse = |why: &str| {
        SandboxError::Unsupported(format!(
            "a found sandbox {} cannot be reset: {why}; acquire it with its spec and reset that",
            record.bare_name()
        ))
    };
    if record.expected_egress_volume().is_some() {
        return Err(refuse("its egress allowlist is not recorded with it"));
    }
    let image = record
        .image()
        .ok_or_else(|| refuse("it records no image"))?;
    let mut builder = SandboxSpec::builder(kind)
        .image(image)
        .work_dir(record.work_dir());
    for (label, value) in record.labels() {
        if let Some(name) = label.strip_prefix(LABEL_USER_PREFIX) {
            if is_digest_label(&value) {
                return Err(refuse(&format!(
                    "its label {name:?} is kept only as a digest"
                )));
            }
            builder = builder.label(name, value);
        }
    }
    builder.build()
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
