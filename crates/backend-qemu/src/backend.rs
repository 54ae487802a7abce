//! The backend: construction (image, accelerator, rung), acquire, find, disposal and listing.

use std::collections::BTreeSet;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use qemu_vm::{
    probe_accel, AccelReport, AgentClient, Vm, VmConfig, VmError, VmImage, WeakAgentClient,
};
use sandbox_core::backend_kit::{refuse_fork_onto_source, run_detached, CleanupOnDrop, LockTable};
use sandbox_core::storage_base::validate_base;
use sandbox_core::{
    BackendDeclarations, Capability, DisposalCode, DisposalFailure, DisposeSelector, Egress,
    Isolation, IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError, SandboxKey,
    SandboxLimits, SandboxSpec, SandboxState, SandboxSummary, ScopePurge, TransferLimits,
    DEFAULT_WORK_DIR,
};
use tokio::sync::Semaphore;

use crate::baseline::Baselines;
use crate::config::{host_cpus, host_memory_mib, isolation_for, CheckedConfig, QemuConfig};
use crate::egress::{self, EgressPlan, GuestEgress};
use crate::handle::{agent_error, shared, QemuSandbox, Resets};
use crate::layout::{self, Record, Slot};
use crate::pool::{self, PoolEntries};
use crate::BACKEND_NAME;

/// One QEMU microVM per (key, kind).
///
/// Cheap to clone: clones share the image, the per-name locks and the boot gate.
#[derive(Debug, Clone)]
pub struct QemuBackend {
    host: Arc<QemuHost>,
}

#[derive(Debug)]
struct QemuHost {
    config: CheckedConfig,
    image: VmImage,
    accel: AccelReport,
    isolation: Isolation,
    declarations: BackendDeclarations,
    locks: LockTable<String>,
    /// At most `max_booting` VMs boot at once.
    booting: Semaphore,
    /// The agent connection of each VM this process talks to, kept while some handle of the
    /// VM in this process is: every handle of an instance shares one connection (its calls
    /// run at once over it) and so one of the VM's agent ports; the port goes back to other
    /// processes with the last handle.
    agents: Mutex<HashMap<String, WeakAgentClient>>,
    /// The egress of each allowlist VM this process serves, kept while some handle is: one
    /// policy (and CA) per process and VM, on the port of its agent connection.
    egress: Mutex<HashMap<String, std::sync::Weak<GuestEgress>>>,
    /// The saved VMs new sandboxes restore instead of booting.
    baselines: Baselines,
    /// The machine every VM of this backend is (`qemu_vm::Snapshot::machine_of`): what a pool
    /// member must be to be claimed.
    machine: String,
    /// The warm pool's entries.
    pool: PoolEntries,
    /// The storage base every pool member is made with (the default one, normal form).
    member_base: String,
    /// This process's refill: one at a time.
    refilling: tokio::sync::Mutex<()>,
    /// Bumped by each purge of the pool: a refill that began before it stops, and discards the
    /// member it was restoring.
    pool_epoch: AtomicU64,
}

/// How long an attach waits for a free agent port of a running VM (every port may be held by
/// other processes) and for the agent's answer, before the acquire is `Busy`.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

const MIB: u64 = 1024 * 1024;

/// The transfer ceilings the backend declares (a sandbox's spec chooses its own limits within
/// them): the agent streams a file in frames, so a 64 MiB file costs the host one copy of it.
pub const TRANSFER_CEILING: TransferLimits = TransferLimits {
    max_bytes_per_file: 64 * MIB,
    max_total_bytes: 256 * MIB,
    max_files: 256,
};

/// Every file capability, exact kills, host tools, snapshots (reset and fork), closed and
/// allowlist egress (method and path rules too), POSIX guests, conversation scope, the transfer
/// ceilings above.
fn declarations() -> BackendDeclarations {
    BackendDeclarations {
        // A streamed exec with stdin is all a run with host tools needs of the backend; the
        // program is the image's (the VM image carries it; a run in an image without it is
        // refused as unsupported when it starts). The relay is an exec of its own, so the
        // agent's end of the command's exec leaves it to the run's drain.
        capabilities: Capability::exec_and_files()
            .into_iter()
            .chain([
                Capability::ExactKill,
                Capability::HostTools,
                Capability::Snapshot,
                Capability::EgressMethods,
                Capability::EgressPaths,
            ])
            .collect(),
        limits: SandboxLimits {
            files_in: TRANSFER_CEILING,
            files_out: TRANSFER_CEILING,
        },
        egress_modes: BTreeSet::from([Egress::Closed, Egress::Allowlist]),
        os_families: BTreeSet::from([OsFamily::Posix]),
        isolation_scopes: BTreeSet::from([IsolationScope::Conversation]),
        ..BackendDeclarations::default()
    }
}

impl QemuBackend {
    /// Checks the configuration, loads the VM image, and chooses the accelerator by a test boot
    /// (cached per image and host kernel in the state directory).
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] for a configuration that fails its checks or an image
    /// that cannot be loaded; [`SandboxError::NotPermitted`] when only emulation can run here
    /// and `allow_emulation` is off.
    ///
    /// # Cancel safety and drop
    /// Dropping the future during the test boot leaves the probe VM to its own deadline.
    pub async fn connect(config: QemuConfig) -> Result<QemuBackend, SandboxError> {
        let config = config.check_for(host_cpus(), host_memory_mib())?;
        let image = VmImage::load(&config.image_dir)
            .map_err(|error| unusable_image(&config.image_dir, error))?;
        // `<state>/vms/vm-<12 hex>/agent-<n>.sock` must fit a Unix socket address (108 bytes).
        let longest = config.state_dir.join(layout::VMS).join(format!(
            "vm-000000000000/agent-{}.sock",
            qemu_vm::MAX_AGENT_PORTS
        ));
        if longest.as_os_str().len() >= 108 {
            return Err(SandboxError::invalid(format!(
                "the state directory {} is too long for the VMs' Unix sockets; choose a shorter one",
                config.state_dir.display()
            )));
        }
        std::fs::create_dir_all(&config.state_dir)
            .map_err(|source| layout::io_error("create", &config.state_dir, source))?;
        let probe_dir = config.state_dir.join(".probe");
        let probe = VmConfig::new(image.clone(), &probe_dir, "probe");
        let accel = probe_accel(&probe, &config.state_dir.join(".accel"))
            .await
            .map_err(|error| SandboxError::engine(format!("accelerator probe: {error}")))?;
        let isolation = isolation_for(accel.accel, &accel.reason, config.allow_emulation)?;
        let baselines = Baselines::new(&config.state_dir, &image.digest);
        baselines.remove_others();
        let pool = PoolEntries::new(&config.state_dir, config.pool);
        let mut backend = QemuBackend {
            host: Arc::new(QemuHost {
                booting: Semaphore::new(config.max_booting),
                config,
                image,
                accel,
                isolation,
                declarations: declarations(),
                locks: LockTable::default(),
                agents: Mutex::new(HashMap::new()),
                egress: Mutex::new(HashMap::new()),
                baselines,
                machine: String::new(),
                pool,
                member_base: validate_base(DEFAULT_WORK_DIR)?,
                refilling: tokio::sync::Mutex::new(()),
                pool_epoch: AtomicU64::new(0),
            }),
        };
        let machine = qemu_vm::Snapshot::machine_of(&backend.vm_config("machine"));
        if let Some(host) = Arc::get_mut(&mut backend.host) {
            host.machine = machine;
        }
        Ok(backend)
    }

    /// The warm pool's ready members (`QemuConfig::pool`), of every machine, by instance id.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a listing that can fail.
    pub async fn pool_members(&self) -> Result<Vec<String>, SandboxError> {
        Ok(self.host.pool.members())
    }

    /// Restores members until the warm pool holds its size of this backend's machine, then
    /// waits, up to `within`, until that many are ready (another process may be restoring some).
    /// Does nothing without a pool.
    ///
    /// # Errors
    /// The first failed restore; [`SandboxError::EngineTimeout`] when the pool is not full
    /// within `within`.
    ///
    /// # Cancel safety and drop
    /// A member half restored when the future is dropped is left to the next refill, which
    /// discards it (its entry's lock is gone with this process's hold of it).
    pub async fn fill_pool(&self, within: Duration) -> Result<(), SandboxError> {
        let size = self.host.pool.size();
        if size == 0 {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            tokio::time::timeout_at(deadline, self.refill(self.pool_epoch()))
                .await
                .map_err(|_| pool_timeout(within))??;
            if self.host.pool.ready(&self.host.machine).len() >= size {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(pool_timeout(within));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Removes every ready member of the warm pool (whatever its machine) and what dead
    /// refills left; this process's refill under way stops first. A member another process is
    /// restoring is left to it. Sandboxes served from the pool are their keys' and stay.
    pub async fn purge_pool(&self) -> ScopePurge {
        self.host.pool_epoch.fetch_add(1, Ordering::SeqCst);
        let _refill = self.host.refilling.lock().await;
        let mut disposed = 0;
        let mut failures = Vec::new();
        let mut taken = Vec::new();
        for instance in self.host.pool.members() {
            match self.host.pool.withdraw(&instance).await {
                Ok(Some(member)) => taken.push(member),
                Ok(None) => {}
                Err(error) => failures.push(unknown(error).prefixed(&instance)),
            }
        }
        match self.host.pool.abandoned().await {
            Ok(abandoned) => taken.extend(abandoned),
            Err(error) => failures.push(unknown(error)),
        }
        for member in taken {
            let instance = member.instance.clone();
            let discarded = discard(self.vms_dir().join(&instance)).await;
            match discarded.and_then(|()| self.host.pool.forget(member)) {
                Ok(()) => disposed += 1,
                Err(error) => failures.push(refused(error).prefixed(&instance)),
            }
        }
        ScopePurge {
            disposed,
            undisposed: DisposalFailure::fold(failures),
        }
    }

    /// The count of purges so far: a refill asked for before a purge does nothing after it.
    fn pool_epoch(&self) -> u64 {
        self.host.pool_epoch.load(Ordering::SeqCst)
    }

    /// Restores members until the pool holds its size of this machine, ready or being restored
    /// by some process, first discarding what dead refills left. One refill at a time in this
    /// process; one asked for at `epoch` stops once a purge came after it.
    async fn refill(&self, epoch: u64) -> Result<(), SandboxError> {
        let _one = self.host.refilling.lock().await;
        loop {
            if self.pool_epoch() != epoch {
                return Ok(());
            }
            let (abandoned, filling) = self
                .host
                .pool
                .next_to_fill(&self.host.machine, layout::new_instance_id()?)
                .await?;
            for member in abandoned {
                tracing::info!(instance = %member.instance, "discarding a pool member a dead refill left");
                discard(self.vms_dir().join(&member.instance)).await?;
                self.host.pool.forget(member)?;
            }
            let Some(filling) = filling else {
                return Ok(());
            };
            let config = self.vm_config(&filling.instance);
            let restored = self.start_vm(&config).await;
            // The agent's connection goes: its port is the claimer's.
            let overtaken = self.pool_epoch() != epoch;
            let prepared = match restored {
                Ok(agent) if !overtaken => self.prepare_member(&agent).await,
                Ok(_) => Ok(()),
                Err(error) => Err(error),
            };
            match prepared {
                Ok(()) if !overtaken => {
                    self.host.pool.ready_now(filling, &self.host.member_base)?;
                }
                outcome => {
                    discard(config.dir()).await?;
                    self.host.pool.forget_filling(filling)?;
                    outcome?;
                }
            }
        }
    }

    /// A restored member's first command, so a claim for the default storage base runs none:
    /// that base made, under a new VM's patience. Its connection then closes (its agent port
    /// is the claimer's).
    async fn prepare_member(&self, agent: &AgentClient) -> Result<(), SandboxError> {
        let patience = first_exec_patience(self.host.config.boot_timeout);
        let request = qemu_vm::ExecRequest {
            argv: ["/bin/mkdir", "-p", "--", self.host.member_base.as_str()]
                .iter()
                .map(|a| a.as_bytes().to_vec())
                .collect(),
            env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
            workdir: b"/".to_vec(),
            stdin: false,
            timeout_ms: u64::try_from(patience.as_millis()).unwrap_or(u64::MAX),
            user: None,
        };
        let limits = qemu_vm::RunLimits {
            output_cap: 64 * 1024,
            deadline: patience,
        };
        let made = agent.run(request, None, limits).await.map_err(|error| {
            SandboxError::engine(format!("a pool member's first command: {error}"))
        })?;
        if made.status.code != Some(0) {
            return Err(SandboxError::GuestRefused {
                path: self.host.member_base.clone(),
                detail: String::from_utf8_lossy(&made.stderr).trim().to_owned(),
            });
        }
        Ok(())
    }

    /// Starts a refill of the pool in the background, when there is a pool.
    fn refill_later(&self) {
        if self.host.pool.size() == 0 {
            return;
        }
        let (backend, epoch) = (self.clone(), self.pool_epoch());
        tokio::spawn(async move {
            if let Err(error) = backend.refill(epoch).await {
                tracing::warn!(%error, "refilling the warm pool failed; the next claim tries again");
            }
        });
    }

    /// A ready member of the pool for `slot` (whose locks the caller holds, with no record),
    /// its storage base made: claimed, recorded as the key's, then served; `None` when no member
    /// serves (each one claimed that does not is discarded). A refill follows either way.
    async fn claim_member(
        &self,
        slot: &Slot,
        key: &SandboxKey,
        kind: &str,
        storage_base: &str,
        egress: Option<String>,
    ) -> Result<Option<QemuSandbox>, SandboxError> {
        if self.host.pool.size() == 0 {
            return Ok(None);
        }
        let mut served = None;
        for instance in self.host.pool.ready(&self.host.machine) {
            if !self.host.pool.claim(&instance, slot)? {
                continue;
            }
            let prepared = pool::claimed_base(slot, &instance).as_deref() == Some(storage_base);
            let record = Record {
                scope: key.scope.clone(),
                thread_id: key.thread_id.clone(),
                agent_id: key.agent_id.clone(),
                call_id: key.call_id.clone(),
                kind: kind.to_owned(),
                instance: instance.clone(),
                storage_base: storage_base.to_owned(),
                created: layout::now_secs(),
                retired: None,
                egress: egress.clone(),
            };
            slot.write_record(&record)?;
            pool::remove_claim(slot, &instance)?;
            let cleanup = CleanupOnDrop::armed("discard a claimed member", {
                let (vm_dir, undo_slot) = (self.vms_dir().join(&instance), slot.clone());
                async move {
                    let discarded = discard(vm_dir).await;
                    let _ = undo_slot.remove_record();
                    discarded
                }
            });
            match self.serve_member(slot, &record, prepared).await {
                Ok(sandbox) => {
                    let mut cleanup = cleanup;
                    cleanup.disarm();
                    served = Some(sandbox);
                    break;
                }
                Err(error) => {
                    tracing::warn!(%instance, %error, "a claimed pool member did not serve; it is discarded");
                    self.forget_agent(&instance);
                    if let Some(discarded) = cleanup.run_now().await? {
                        discarded?;
                    }
                }
            }
        }
        self.refill_later();
        Ok(served)
    }

    /// A claimed member's agent, and, unless it was `prepared` with the record's storage base,
    /// its first command: the storage base made.
    async fn serve_member(
        &self,
        slot: &Slot,
        record: &Record,
        prepared: bool,
    ) -> Result<QemuSandbox, SandboxError> {
        let vm = Vm::attach(&self.vms_dir().join(&record.instance))
            .map_err(|error| agent_error(&record.instance, error))?;
        let agent = vm
            .agent(ATTACH_TIMEOUT)
            .await
            .map_err(|error| attach_error(&record.instance, error, vm.is_alive()))?;
        if !prepared {
            self.make_storage_base(slot, record, &agent).await?;
        }
        self.cache_agent(&record.instance, &agent);
        Ok(self.handle(slot, record, agent, true))
    }

    /// A new VM's first command, its storage base's `mkdir`, under a bound of its own rather
    /// than one call's: a call timeout is sized for the user's slowest file call, and a guest
    /// that does not start its first command at all is better replaced than waited on.
    async fn make_storage_base(
        &self,
        slot: &Slot,
        record: &Record,
        agent: &AgentClient,
    ) -> Result<(), SandboxError> {
        let mut creating = self.handle(slot, record, agent.clone(), true);
        creating.call_timeout = first_exec_patience(self.host.config.boot_timeout);
        creating.creating = true;
        let base = record.storage_base.as_str();
        let made = sandbox_core::Sandbox::exec(
            &creating,
            sandbox_core::ExecRequest::new(sandbox_core::Command::argv([
                "/bin/mkdir",
                "-p",
                "--",
                base,
            ]))
            .working_directory("/"),
        )
        .await?;
        if made.exit_code != 0 {
            return Err(SandboxError::GuestRefused {
                path: base.to_owned(),
                detail: String::from_utf8_lossy(&made.stderr).trim().to_owned(),
            });
        }
        Ok(())
    }

    /// Settles the claims in `slot`'s directory (whose locks the caller holds): a claim of the
    /// member its record names is done and goes; any other was left by a claimer that died
    /// before recording it, and its VM is discarded.
    async fn settle_claims(
        &self,
        slot: &Slot,
        record: Option<&Record>,
    ) -> Result<(), SandboxError> {
        for instance in pool::claims_in(slot) {
            if record.is_none_or(|record| record.instance != instance) {
                tracing::info!(%instance, slot = %slot.name, "discarding a pool member a dead claim left");
                discard(self.vms_dir().join(&instance)).await?;
            }
            pool::remove_claim(slot, &instance)?;
        }
        Ok(())
    }

    /// The accelerator the probe chose, and why.
    pub fn accelerator(&self) -> &AccelReport {
        &self.host.accel
    }

    fn slot(&self, key: &SandboxKey, kind: &str) -> Slot {
        Slot::new(
            &self.host.config.state_dir,
            &self.host.config.prefix,
            key,
            kind,
        )
    }

    /// A handle to the running VM of `slot`'s record, or why there is none. With the name's
    /// lock held (`locked`), a VM a dead fork left paused runs on first.
    async fn attach(
        &self,
        slot: &Slot,
        record: &Record,
        locked: bool,
    ) -> Result<QemuSandbox, SandboxError> {
        if let Some(reason) = &record.retired {
            return Err(SandboxError::Retired {
                instance: record.instance.clone(),
                reason: reason.clone(),
            });
        }
        let vm = Vm::attach(&self.vms_dir().join(&record.instance))
            .map_err(|error| agent_error(&record.instance, error))?;
        // A fork's save pauses its source under the name's lock, marked in the name's
        // directory: with the lock held here, a mark still standing was left by a fork whose
        // process died, and a source it left paused runs on.
        if locked && slot.is_saving() {
            tracing::info!(instance = %record.instance, "running on a VM whose fork died mid-save");
            vm.run_on_after_save()
                .await
                .map_err(|error| agent_error(&record.instance, error))?;
            slot.clear_saving()?;
        }
        let cached = self.cached_agent(&record.instance);
        let agent = match cached {
            Some(agent) => agent,
            None => {
                let agent = vm
                    .agent(ATTACH_TIMEOUT)
                    .await
                    .map_err(|error| attach_error(&record.instance, error, vm.is_alive()))?;
                self.cache_agent(&record.instance, &agent);
                agent
            }
        };
        Ok(self.handle(slot, record, agent, false))
    }

    fn cached_agent(&self, instance: &str) -> Option<AgentClient> {
        let agents = self.host.agents.lock().ok()?;
        agents
            .get(instance)
            .and_then(WeakAgentClient::upgrade)
            .filter(|agent| !agent.is_closed())
    }

    fn cache_agent(&self, instance: &str, agent: &AgentClient) {
        if let Ok(mut agents) = self.host.agents.lock() {
            agents.retain(|_, agent| agent.upgrade().is_some_and(|agent| !agent.is_closed()));
            agents.insert(instance.to_owned(), agent.downgrade());
        }
    }

    fn forget_agent(&self, instance: &str) {
        if let Ok(mut agents) = self.host.agents.lock() {
            agents.remove(instance);
        }
    }

    /// `sandbox` with the allowlist egress of `plan`: this process's egress for the VM when
    /// one serves the handle's port under the same plan, else a new one (a fresh CA, put in
    /// the guest).
    async fn with_egress(
        &self,
        mut sandbox: QemuSandbox,
        plan: Option<Arc<EgressPlan>>,
    ) -> Result<QemuSandbox, SandboxError> {
        let Some(plan) = plan else {
            return Ok(sandbox);
        };
        let port = egress::port_of(&sandbox.agent);
        let serving = self.host.egress.lock().ok().and_then(|egress| {
            egress
                .get(&sandbox.instance)
                .and_then(std::sync::Weak::upgrade)
                .filter(|egress| egress.serves(port, &plan.digest))
        });
        let guest = match serving {
            Some(guest) => guest,
            None => {
                let guest = Arc::new(
                    egress::start(
                        &sandbox.agent,
                        &plan,
                        &sandbox.instance,
                        self.host.config.egress.observer.clone(),
                        self.host.config.call_timeout,
                    )
                    .await?,
                );
                if let Ok(mut egress) = self.host.egress.lock() {
                    egress.retain(|_, egress| egress.strong_count() > 0);
                    egress.insert(sandbox.instance.clone(), Arc::downgrade(&guest));
                }
                guest
            }
        };
        sandbox.egress_plan = Some(plan);
        sandbox.egress = Some(guest);
        Ok(sandbox)
    }

    fn handle(
        &self,
        slot: &Slot,
        record: &Record,
        agent: qemu_vm::AgentClient,
        fresh: bool,
    ) -> QemuSandbox {
        QemuSandbox {
            vm_dir: self.vms_dir().join(&record.instance),
            slot: slot.clone(),
            instance: record.instance.clone(),
            storage_base: record.storage_base.clone(),
            fresh,
            agent,
            call_timeout: self.host.config.call_timeout,
            files_in: self.host.declarations.limits.files_in.max_bytes_per_file,
            creating: false,
            resets: Arc::new(self.clone()),
            egress_plan: None,
            egress: None,
        }
    }

    /// The configuration of the VM named `instance`: every VM of the backend is the same machine.
    fn vm_config(&self, instance: &str) -> VmConfig {
        let mut config = VmConfig::new(self.host.image.clone(), self.vms_dir(), instance);
        config.accel = self.host.accel.accel;
        config.agent_ports = self.host.config.agent_ports;
        config.cpus = self.host.config.cpus;
        config.memory_mib = self.host.config.memory_mib;
        config.kernel_args = self.host.config.kernel_args.clone();
        config
    }

    /// Forks the running VM of `source` into a new VM under `target`'s slot (whose locks the
    /// caller holds, with the source's): the target's record first, then the source saved into
    /// the target's fork directory (paused for the save, resumed after it), then the copy
    /// restored from it and renewed (fresh entropy, the clock, its own name), and the fork
    /// directory removed. A fork that fails or is dropped part-way leaves a record, retired
    /// until the fork is whole, whose VM and fork directory the target's next acquire (which
    /// replaces a retired VM) or disposal discards.
    async fn fork_into(
        &self,
        source_slot: &Slot,
        source: &Record,
        target_slot: &Slot,
        target: &SandboxKey,
        kind: &str,
    ) -> Result<QemuSandbox, SandboxError> {
        let source_vm = Vm::attach(&self.vms_dir().join(&source.instance))
            .map_err(|error| agent_error(&source.instance, error))?;
        // Recorded as retired until the copy is whole: a VM a killed fork left running is
        // never attached, only replaced or disposed of.
        let mut record = Record {
            scope: target.scope.clone(),
            thread_id: target.thread_id.clone(),
            agent_id: target.agent_id.clone(),
            call_id: target.call_id.clone(),
            kind: kind.to_owned(),
            instance: layout::new_instance_id()?,
            storage_base: source.storage_base.clone(),
            created: layout::now_secs(),
            retired: Some(FORMING.to_owned()),
            egress: source.egress.clone(),
        };
        let config = self.vm_config(&record.instance);
        let vm_dir = config.dir();
        let fork_dir = fork_dir_of(&vm_dir);
        target_slot.write_record(&record)?;
        let undo_slot = target_slot.clone();
        let mut cleanup = CleanupOnDrop::armed("discard a half-made fork", {
            let vm_dir = vm_dir.clone();
            async move {
                let discarded = discard(vm_dir).await;
                let _ = undo_slot.remove_record();
                discarded
            }
        });
        let machine = qemu_vm::Snapshot::machine_of(&config);
        source_slot.mark_saving()?;
        let saved = qemu_vm::Snapshot::save(&source_vm, &machine, &fork_dir).await;
        // The source runs on whatever the save did; a source that cannot is reported (and
        // its mark stays, for the next acquire to try again).
        let resumed = source_vm.run_on_after_save().await;
        if resumed.is_ok() {
            source_slot.clear_saving()?;
        }
        let snapshot = saved.map_err(|error| agent_error(&source.instance, error))?;
        resumed.map_err(|error| agent_error(&source.instance, error))?;
        let (_vm, agent) = snapshot
            .restore_once(&config, self.host.config.boot_timeout)
            .await
            .map_err(|error| agent_error(&record.instance, error))?;
        remove_dir(&fork_dir)?;
        record.retired = None;
        target_slot.write_record(&record)?;
        cleanup.disarm();
        self.cache_agent(&record.instance, &agent);
        Ok(self.handle(target_slot, &record, agent, true))
    }

    /// Where every VM's own directory lives: short, so its socket paths fit a Unix address.
    fn vms_dir(&self) -> std::path::PathBuf {
        self.host.config.state_dir.join(layout::VMS)
    }

    /// Records, boots a new VM for `slot` and makes its storage base. A VM that does not start
    /// that first command within [`first_exec_patience`] is discarded and one more is booted in
    /// its place (a new VM holds nothing yet); a second such VM fails the acquire with
    /// [`SandboxError::EngineTimeout`].
    async fn create(
        &self,
        slot: &Slot,
        key: &SandboxKey,
        kind: &str,
        storage_base: String,
        egress: Option<String>,
    ) -> Result<QemuSandbox, SandboxError> {
        if let Some(member) = self
            .claim_member(slot, key, kind, &storage_base, egress.clone())
            .await?
        {
            return Ok(member);
        }
        let first = self
            .create_once(slot, key, kind, storage_base.clone(), egress.clone())
            .await?;
        let stalled = match first {
            FirstExec::Served(sandbox) => return Ok(sandbox),
            FirstExec::Stalled(stalled) => stalled,
        };
        tracing::warn!(
            instance = %stalled.instance,
            error = %stalled.error,
            "a new VM did not start its first command; it was discarded and another boots"
        );
        match self
            .create_once(slot, key, kind, storage_base, egress)
            .await?
        {
            FirstExec::Served(sandbox) => Ok(sandbox),
            FirstExec::Stalled(again) => Err(SandboxError::EngineTimeout {
                operation: format!(
                    "the first command of a new VM, in two VMs in turn ({} and {})",
                    stalled.instance, again.instance
                ),
                bound: first_exec_patience(self.host.config.boot_timeout),
            }),
        }
    }

    /// One new VM for `slot`: the record comes first, so a process that dies while booting
    /// leaves a record that the next acquire or disposal finds and discards; a VM half made
    /// when the future is dropped, or that did not start its first command in time, is killed
    /// and its directory and record removed before this returns.
    async fn create_once(
        &self,
        slot: &Slot,
        key: &SandboxKey,
        kind: &str,
        storage_base: String,
        egress: Option<String>,
    ) -> Result<FirstExec, SandboxError> {
        let record = Record {
            scope: key.scope.clone(),
            thread_id: key.thread_id.clone(),
            agent_id: key.agent_id.clone(),
            call_id: key.call_id.clone(),
            kind: kind.to_owned(),
            instance: layout::new_instance_id()?,
            storage_base,
            created: layout::now_secs(),
            retired: None,
            egress,
        };
        let config = self.vm_config(&record.instance);
        let vm_dir = config.dir();
        slot.write_record(&record)?;
        let undo_slot = slot.clone();
        let mut cleanup = CleanupOnDrop::armed("discard a half-made VM", async move {
            let discarded = discard(vm_dir).await;
            let _ = undo_slot.remove_record();
            discarded
        });
        let agent = self.start_vm(&config).await?;
        match self.make_storage_base(slot, &record, &agent).await {
            Ok(()) => {}
            Err(error @ SandboxError::EngineTimeout { .. }) => {
                // Already retired (its QEMU killed); its directory and record go before the
                // caller boots another, whose record this one's removal must not take.
                if let Some(discarded) = cleanup.run_now().await? {
                    discarded?;
                }
                return Ok(FirstExec::Stalled(Stalled {
                    instance: record.instance,
                    error,
                }));
            }
            Err(error) => return Err(error),
        }
        cleanup.disarm();
        self.cache_agent(&record.instance, &agent);
        Ok(FirstExec::Served(self.handle(slot, &record, agent, true)))
    }

    /// A new VM for `config`, restored from its machine's baseline snapshot (made first when
    /// there is none); booted when the baseline cannot be made or restored, which is logged
    /// and the baseline removed (the next acquire makes it anew). Either way its agent answers.
    async fn start_vm(&self, config: &VmConfig) -> Result<AgentClient, SandboxError> {
        // At most `max_booting` restores or boots at once, the pool's refills among them.
        let _permit = self
            .host
            .booting
            .acquire()
            .await
            .map_err(|_| SandboxError::engine("the boot gate is closed"))?;
        let boot_timeout = self.host.config.boot_timeout;
        let name = format!("bl{}", &layout::new_instance_id()?[2..]);
        match self.host.baselines.get(config, name, boot_timeout).await {
            Ok(snapshot) => match snapshot.restore(config, boot_timeout).await {
                Ok((_vm, agent)) => return Ok(agent),
                Err(error) => {
                    tracing::warn!(
                        instance = %config.name,
                        snapshot = %snapshot.dir.display(),
                        %error,
                        "a restore from the baseline snapshot failed; the baseline is removed and this VM boots"
                    );
                    self.host.baselines.discard(&snapshot).await;
                }
            },
            Err(error) => tracing::warn!(
                instance = %config.name,
                %error,
                "no baseline snapshot could be made; this VM boots"
            ),
        }
        let vm = Vm::start(config)
            .await
            .map_err(|error| agent_error(&config.name, error))?;
        vm.agent(boot_timeout)
            .await
            .map_err(|error| agent_error(&config.name, error))
    }

    /// Kills the VM of `slot` (whatever its state) and removes its record and directory.
    async fn remove_slot(&self, slot: &Slot) -> Result<(), DisposalFailure> {
        let _guard = self.host.locks.lock(slot.name.clone()).await;
        let _lock = slot.lock().await.map_err(unknown)?;
        let record = slot.read_record().map_err(unknown)?;
        self.settle_claims(slot, record.as_ref())
            .await
            .map_err(refused)?;
        if let Some(record) = record {
            self.forget_agent(&record.instance);
            let work = discard(self.vms_dir().join(&record.instance));
            run_detached(work)
                .await
                .map_err(unknown)?
                .map_err(refused)?;
        }
        slot.remove_record().map_err(unknown)?;
        slot.remove_if_empty();
        Ok(())
    }
}

/// Why an attach to a running VM found no agent, in the contract's terms: every port held by
/// other processes, or a port's connection not answered while QEMU runs, is `Busy` (the VM is
/// in use, not broken, and must not be replaced); anything else says the VM cannot serve.
/// The one command that makes the VM image where the hosts look for it.
pub(crate) const BUILD_IMAGE_COMMAND: &str = "sandboxctl images build vm";

/// Why the image in `dir` cannot be used, naming the command that builds it: `ImageMissing`
/// when its manifest is not there, `InvalidArgument` when it is there but unusable.
#[cold]
fn unusable_image(dir: &Path, error: VmError) -> SandboxError {
    match &error {
        VmError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            SandboxError::ImageMissing {
                image: dir.display().to_string(),
                hint: format!("build it with `{BUILD_IMAGE_COMMAND}`"),
            }
        }
        _ => SandboxError::invalid(format!(
            "VM image {}: {error}; rebuild it with `{BUILD_IMAGE_COMMAND}`",
            dir.display()
        )),
    }
}

fn attach_error(instance: &str, error: VmError, alive: bool) -> SandboxError {
    match error {
        VmError::PortsBusy { ports, after } => SandboxError::Busy(format!(
            "VM {instance} is in use: all {ports} of its agent ports stayed held by other \
             processes for {after:?} (one port per process; raise agent_ports for more)"
        )),
        VmError::BootTimeout { after } if alive => SandboxError::Busy(format!(
            "VM {instance} runs but its agent did not answer within {after:?}"
        )),
        other => agent_error(instance, other),
    }
}

/// The most a new VM's first command (its storage base's `mkdir`) may take to start: a quarter
/// of the boot bound, at most 30 s. It starts in well under a second even under emulation on a
/// loaded host (0.1 to 0.7 s measured with three VMs booting beside a disk-bound writer).
fn first_exec_patience(boot_timeout: Duration) -> Duration {
    (boot_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// How a new VM's first command went.
enum FirstExec {
    /// It ran: the VM serves.
    Served(QemuSandbox),
    /// It did not start in time; the VM is gone.
    Stalled(Stalled),
}

/// A new VM discarded because its first command did not start.
struct Stalled {
    instance: String,
    error: SandboxError,
}

#[cold]
fn pool_timeout(within: Duration) -> SandboxError {
    SandboxError::EngineTimeout {
        operation: "filling the warm pool".to_owned(),
        bound: within,
    }
}

/// Why a fork's record is retired until the fork is whole.
const FORMING: &str = "a fork into it did not finish";

/// The directory a fork into the VM of `vm_dir` saves its source into: beside the VM's own,
/// which the restore makes, and discarded with it.
fn fork_dir_of(vm_dir: &Path) -> std::path::PathBuf {
    let mut name = vm_dir.as_os_str().to_owned();
    name.push(".fork");
    std::path::PathBuf::from(name)
}

/// Kills the VM in `dir` if one runs there and removes the directory, and a fork directory
/// left beside it.
async fn discard(dir: std::path::PathBuf) -> Result<(), SandboxError> {
    remove_dir(&fork_dir_of(&dir))?;
    match Vm::attach(&dir) {
        Ok(vm) => vm
            .kill()
            .await
            .map_err(|error| SandboxError::engine(format!("killing {}: {error}", dir.display()))),
        Err(_) => remove_dir(&dir),
    }
}

fn remove_dir(dir: &Path) -> Result<(), SandboxError> {
    match std::fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(layout::io_error("remove", dir, error))
        }
        _ => Ok(()),
    }
}

fn unknown(error: SandboxError) -> DisposalFailure {
    DisposalFailure::new(DisposalCode::Unknown, error.to_string())
}

fn refused(error: SandboxError) -> DisposalFailure {
    DisposalFailure::new(DisposalCode::Refused, error.to_string())
}

#[async_trait]
impl Resets for QemuBackend {
    async fn reset(
        &self,
        slot: &Slot,
        egress: Option<Arc<EgressPlan>>,
    ) -> Result<QemuSandbox, SandboxError> {
        let _guard = self.host.locks.lock(slot.name.clone()).await;
        let _lock = slot.lock().await?;
        let record = slot
            .read_record()?
            .ok_or_else(|| SandboxError::SandboxGone {
                instance: slot.name.clone(),
            })?;
        self.settle_claims(slot, Some(&record)).await?;
        self.forget_agent(&record.instance);
        run_detached(discard(self.vms_dir().join(&record.instance))).await??;
        slot.remove_record()?;
        let sandbox = self
            .create(
                slot,
                &record.key(),
                &record.kind,
                record.storage_base,
                record.egress,
            )
            .await?;
        self.with_egress(sandbox, egress).await
    }
}

#[async_trait]
impl SandboxBackend for QemuBackend {
    async fn host_state_roots(&self) -> Result<Vec<String>, SandboxError> {
        let config = &self.host.config;
        Ok([&config.state_dir, &config.image_dir]
            .into_iter()
            .map(|dir| dir.display().to_string())
            .collect())
    }

    fn name(&self) -> &str {
        BACKEND_NAME
    }

    fn isolation(&self) -> Isolation {
        self.host.isolation
    }

    fn declarations(&self) -> &BackendDeclarations {
        &self.host.declarations
    }

    async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let egress = egress::plan(spec, &self.host.config.egress)?.map(Arc::new);
        let digest = egress.as_ref().map(|plan| plan.digest.clone());
        if key.is_call() || spec.isolation_scope() != IsolationScope::Conversation {
            return Err(SandboxError::ScopeNotEnforced(
                "the qemu backend serves the conversation scope only".into(),
            ));
        }
        let storage_base = validate_base(spec.work_dir().unwrap_or(DEFAULT_WORK_DIR))?;
        let slot = self.slot(key, spec.kind());
        let _guard = self.host.locks.lock(slot.name.clone()).await;
        let _lock = slot.lock().await?;
        let record = slot.read_record()?;
        self.settle_claims(&slot, record.as_ref()).await?;
        if let Some(record) = record {
            match self.attach(&slot, &record, true).await {
                Ok(sandbox) => {
                    if record.storage_base != storage_base {
                        return Err(SandboxError::SpecMismatch(format!(
                            "the sandbox's storage base is {:?}, the spec asks for {storage_base:?}",
                            record.storage_base
                        )));
                    }
                    if record.egress != digest {
                        return Err(SandboxError::SpecMismatch(
                            "the sandbox was made with another egress policy (its guest would \
                             reach what either allows)"
                                .into(),
                        ));
                    }
                    let sandbox = self.with_egress(sandbox, egress).await?;
                    return Ok(shared(sandbox.with_files_in(spec.files_in())));
                }
                Err(error) if error.kind() == sandbox_core::ErrorKind::Busy => return Err(error),
                // Its QEMU died, it was retired, or its agent no longer answers: replaced.
                Err(error) => {
                    tracing::info!(instance = %record.instance, %error, "replacing a VM that cannot serve");
                    self.forget_agent(&record.instance);
                    discard(self.vms_dir().join(&record.instance)).await?;
                    slot.remove_record()?;
                }
            }
        }
        let sandbox = self
            .create(&slot, key, spec.kind(), storage_base, digest)
            .await?;
        let sandbox = self.with_egress(sandbox, egress).await?;
        Ok(shared(sandbox.with_files_in(spec.files_in())))
    }

    /// Saves the running VM of `source` and restores a copy under `target`: its memory and
    /// files as they were at that moment, renewed as every restored VM is. No command of the
    /// source runs on in the copy: the agent ends every exec with its session, and the copy's
    /// sessions are the source's.
    async fn fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        refuse_fork_onto_source(source, target)?;
        if target.is_call() {
            return Err(SandboxError::ScopeNotEnforced(
                "the qemu backend serves the conversation scope only".into(),
            ));
        }
        let (source_slot, target_slot) = (
            self.slot(source, spec.kind()),
            self.slot(target, spec.kind()),
        );
        // Both names' locks, always in the one order, so two forks the other way round wait.
        let (first, second) = if source_slot.name < target_slot.name {
            (&source_slot, &target_slot)
        } else {
            (&target_slot, &source_slot)
        };
        let _first_guard = self.host.locks.lock(first.name.clone()).await;
        let _second_guard = self.host.locks.lock(second.name.clone()).await;
        let _first_lock = first.lock().await?;
        let _second_lock = second.lock().await?;
        let Some(record) = source_slot.read_record()? else {
            return Err(SandboxError::invalid(format!(
                "the source key has no sandbox of kind {:?} to fork",
                spec.kind()
            )));
        };
        if let Some(existing) = target_slot.read_record()? {
            return Err(SandboxError::invalid(format!(
                "the target key already has a sandbox of kind {:?} ({}); dispose it first",
                spec.kind(),
                existing.instance
            )));
        }
        // The copy's egress is the source's: the spec must ask for it.
        let egress = egress::plan(spec, &self.host.config.egress)?.map(Arc::new);
        if record.egress != egress.as_ref().map(|plan| plan.digest.clone()) {
            return Err(SandboxError::SpecMismatch(
                "the source sandbox was made with another egress policy".into(),
            ));
        }
        // The source must serve: a dead or retired VM is not copied.
        let source_handle = self.attach(&source_slot, &record, true).await?;
        drop(source_handle);
        let sandbox = self
            .fork_into(&source_slot, &record, &target_slot, target, spec.kind())
            .await?;
        let sandbox = self.with_egress(sandbox, egress).await?;
        Ok(shared(sandbox.with_files_in(spec.files_in())))
    }

    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let slot = self.slot(key, kind);
        let Some(record) = slot.read_record()? else {
            return Ok(None);
        };
        match self.attach(&slot, &record, false).await {
            Ok(sandbox) => Ok(Some(shared(sandbox))),
            Err(_) => Ok(None),
        }
    }

    async fn dispose(
        &self,
        key: &SandboxKey,
        selector: DisposeSelector,
    ) -> Option<DisposalFailure> {
        let prefix = layout::key_prefix(&self.host.config.prefix, key);
        let slots = match layout::slots_with_prefix(&self.host.config.state_dir, &prefix) {
            Ok(slots) => slots,
            Err(error) => {
                return Some(DisposalFailure::new(
                    DisposalCode::Unlisted,
                    error.to_string(),
                ))
            }
        };
        let mut failures = Vec::new();
        for slot in slots {
            let record = match slot.read_record() {
                Ok(record) => record,
                Err(error) => {
                    failures.push(unknown(error));
                    continue;
                }
            };
            if let Some(record) = &record {
                if record.key() != *key
                    || selector
                        .kind
                        .as_ref()
                        .is_some_and(|kind| *kind != record.kind)
                    || selector
                        .instance_id
                        .as_ref()
                        .is_some_and(|id| *id != record.instance)
                {
                    continue;
                }
            } else if selector.instance_id.is_some() || selector.kind.is_some() {
                // A slot with no record: only a sweep of the whole key takes it.
                continue;
            }
            if let Err(failure) = self.remove_slot(&slot).await {
                failures.push(failure.prefixed(&slot.name));
            }
        }
        DisposalFailure::fold(failures)
    }

    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        let prefix = layout::conversation_prefix(&self.host.config.prefix, scope, thread_id);
        let slots = match layout::slots_with_prefix(&self.host.config.state_dir, &prefix) {
            Ok(slots) => slots,
            Err(error) => {
                return ScopePurge {
                    disposed: 0,
                    undisposed: Some(DisposalFailure::new(
                        DisposalCode::Unlisted,
                        error.to_string(),
                    )),
                }
            }
        };
        let mut disposed = 0;
        let mut failures = Vec::new();
        for slot in slots {
            match self.remove_slot(&slot).await {
                Ok(()) => disposed += 1,
                Err(failure) => failures.push(failure.prefixed(&slot.name)),
            }
        }
        ScopePurge {
            disposed,
            undisposed: DisposalFailure::fold(failures),
        }
    }

    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        let prefix = format!("{}-", self.host.config.prefix);
        let mut listed = Vec::new();
        for slot in layout::slots_with_prefix(&self.host.config.state_dir, &prefix)? {
            let Some(record) = slot.read_record()? else {
                continue;
            };
            if record.scope != scope || thread_id.is_some_and(|t| t != record.thread_id) {
                continue;
            }
            let state = if record.retired.is_some() {
                SandboxState::Retired
            } else if Vm::attach(&self.vms_dir().join(&record.instance)).is_ok() {
                SandboxState::Running
            } else {
                SandboxState::Unlisted
            };
            listed.push(SandboxSummary {
                key: Some(record.key()),
                kind: Some(record.kind.clone()),
                instance_id: record.instance.clone(),
                created: Some(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(record.created),
                ),
                state,
            });
        }
        listed.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_commands_bound_is_a_quarter_of_the_boots_within_1_to_30_s() {
        let secs = Duration::from_secs;
        assert_eq!(first_exec_patience(secs(60)), secs(15));
        assert_eq!(first_exec_patience(secs(180)), secs(30));
        assert_eq!(first_exec_patience(secs(121)), secs(30));
        assert_eq!(first_exec_patience(secs(2)), secs(1));
        assert_eq!(first_exec_patience(secs(8)), secs(2));
    }

    #[test]
    fn declarations_are_closed_and_allowlist_egress_posix_conversation_scope() {
        let declared = declarations();
        assert!(declared.serves(Capability::Exec));
        assert!(declared.serves(Capability::FilesDelete));
        assert!(declared.serves(Capability::HostTools));
        assert!(declared.serves(Capability::Snapshot));
        assert!(declared.serves(Capability::EgressMethods));
        assert!(declared.serves(Capability::EgressPaths));
        assert_eq!(declared.capabilities.len(), 11);
        assert_eq!(
            declared.egress_modes,
            BTreeSet::from([Egress::Closed, Egress::Allowlist])
        );
        assert!(!declared.serves_scope(IsolationScope::Call));
    }

    #[test]
    fn a_vm_whose_ports_are_all_held_is_busy_and_one_that_is_gone_is_not() {
        let busy = attach_error(
            "vm-1",
            VmError::PortsBusy {
                ports: 8,
                after: ATTACH_TIMEOUT,
            },
            true,
        );
        assert_eq!(busy.kind(), sandbox_core::ErrorKind::Busy);
        assert!(busy.to_string().contains("all 8"), "{busy}");
        let slow = attach_error(
            "vm-1",
            VmError::BootTimeout {
                after: ATTACH_TIMEOUT,
            },
            true,
        );
        assert_eq!(slow.kind(), sandbox_core::ErrorKind::Busy);
        let dead = attach_error(
            "vm-1",
            VmError::BootTimeout {
                after: ATTACH_TIMEOUT,
            },
            false,
        );
        assert_ne!(
            dead.kind(),
            sandbox_core::ErrorKind::Busy,
            "replaced, not waited on"
        );
        let gone = attach_error(
            "vm-1",
            VmError::QemuExited {
                detail: "killed".into(),
            },
            false,
        );
        assert_eq!(gone.kind(), sandbox_core::ErrorKind::Engine);
    }

    #[tokio::test]
    async fn connect_refuses_a_missing_image_with_its_fix() {
        let state = tempfile::tempdir().unwrap();
        let config = QemuConfig {
            image_dir: state.path().join("no-image"),
            state_dir: state.path().join("state"),
            ..QemuConfig::default()
        };
        let refused = QemuBackend::connect(config.clone()).await.unwrap_err();
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::ImageMissing);
        let message = refused.to_string();
        assert!(
            message.contains("`sandboxctl images build vm`"),
            "{message}"
        );
        assert!(message.contains("no-image"), "{message}");

        // An image whose manifest is there but unusable names the same fix.
        std::fs::create_dir_all(&config.image_dir).unwrap();
        std::fs::write(config.image_dir.join(qemu_vm::MANIFEST), b"{}").unwrap();
        let refused = QemuBackend::connect(config).await.unwrap_err();
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidArgument);
        assert!(
            refused.to_string().contains("`sandboxctl images build vm`"),
            "{refused}"
        );
    }
}
