//! The fake backend: instances per (key, kind), disposal and fault injection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::faults::Faults;
use super::lock;
use super::sandbox::{FakeSandbox, Instance, Replace, SpecPins};
use crate::{
    BackendDeclarations, Capability, DisposalFailure, DisposeSelector, Egress, Isolation,
    IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError, SandboxKey, SandboxSpec,
    SandboxState, SandboxSummary, ScopePurge, DEFAULT_WORK_DIR,
};

/// An in-memory backend with fault injection. See the [module documentation](super).
#[derive(Debug)]
pub struct FakeBackend {
    name: String,
    isolation: Isolation,
    declarations: BackendDeclarations,
    shared: Arc<Shared>,
    /// What every handle this fake makes resets itself through.
    owner: Arc<Owner>,
}

/// The backend's side of a reset: it replaces an instance in the map under the lock that guards
/// the map, so that a reset and a disposal never both win.
#[derive(Debug)]
struct Owner {
    name: String,
    declarations: BackendDeclarations,
    shared: Arc<Shared>,
}

impl Replace for Owner {
    fn replace(&self, old: &Arc<Instance>) -> Result<Arc<Instance>, SandboxError> {
        let mut state = lock(&self.shared.state);
        let slot = state
            .instances
            .iter()
            .find(|(_, i)| Arc::ptr_eq(i, old))
            .map(|(slot, _)| slot.clone())
            .ok_or_else(|| SandboxError::SandboxGone {
                instance: old.id.clone(),
            })?;
        state.next_id += 1;
        let id = format!("{}-{}", self.name, state.next_id);
        let new = Arc::new(old.fresh_copy(id, &self.declarations, Arc::clone(&self.shared.faults)));
        old.alive.store(false, Ordering::SeqCst);
        state.instances.insert(slot, Arc::clone(&new));
        Ok(new)
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<BackendState>,
    /// Shared with every instance, whose `exec` reads the canned output.
    faults: Arc<Mutex<Faults>>,
    acquire_calls: AtomicUsize,
    dispose_calls: AtomicUsize,
    dispose_scope_calls: AtomicUsize,
    acquires_in_flight: AtomicUsize,
    max_acquires_in_flight: AtomicUsize,
}

#[derive(Debug, Default)]
struct BackendState {
    instances: BTreeMap<(SandboxKey, String), Arc<Instance>>,
    next_id: u64,
    disposals: Vec<(SandboxKey, DisposeSelector)>,
}

impl FakeBackend {
    /// A fake named `name` that claims the `isolation` rung, with [`default_declarations`](Self::default_declarations).
    pub fn new(name: impl Into<String>, isolation: Isolation) -> Self {
        let name = name.into();
        let shared: Arc<Shared> = Arc::default();
        let declarations = Self::default_declarations();
        FakeBackend {
            owner: Arc::new(Owner {
                name: name.clone(),
                declarations: declarations.clone(),
                shared: Arc::clone(&shared),
            }),
            name,
            isolation,
            declarations,
            shared,
        }
    }

    /// What a fake declares unless told otherwise: exec and every file capability except `reclaim`,
    /// egress `{closed}`, OS family `{posix}`, scopes `{conversation, call}`, the default limits.
    /// Declared `reclaim` removes a directory; declared `snapshot` resets a handle to a new
    /// instance (a new id) holding only its storage base, and forks a copy of the files.
    pub fn default_declarations() -> BackendDeclarations {
        BackendDeclarations {
            capabilities: BTreeSet::from([
                Capability::Exec,
                Capability::FilesIn,
                Capability::FilesOut,
                Capability::FilesList,
                Capability::FilesDelete,
            ]),
            egress_modes: BTreeSet::from([Egress::Closed]),
            os_families: BTreeSet::from([OsFamily::Posix]),
            isolation_scopes: BTreeSet::from([IsolationScope::Conversation, IsolationScope::Call]),
            ..BackendDeclarations::default()
        }
    }

    /// Replaces the declarations.
    #[must_use]
    pub fn with_declarations(mut self, declarations: BackendDeclarations) -> Self {
        self.owner = Arc::new(Owner {
            name: self.name.clone(),
            declarations: declarations.clone(),
            shared: Arc::clone(&self.shared),
        });
        self.declarations = declarations;
        self
    }

    /// These declarations with `extra` capabilities added ([`default_declarations`](Self::default_declarations) when
    /// `with_declarations` was not called).
    #[must_use]
    pub fn declaring(self, extra: &[Capability]) -> Self {
        let mut declarations = self.declarations.clone();
        declarations.capabilities.extend(extra.iter().copied());
        self.with_declarations(declarations)
    }

    fn handle(&self, instance: Arc<Instance>, fresh: bool) -> FakeSandbox {
        FakeSandbox::new(instance, fresh, Arc::clone(&self.owner) as Arc<dyn Replace>)
    }

    /// Changes the injected faults; they apply to every later call.
    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut lock(&self.shared.faults));
    }

    fn faults(&self) -> Faults {
        lock(&self.shared.faults).clone()
    }

    /// Plants an instance of (key, kind) as if an earlier process had created it: the next acquire returns
    /// it with `freshly_created() == false`. Returns its id.
    pub fn seed_instance(&self, key: &SandboxKey, kind: &str) -> String {
        let mut state = lock(&self.shared.state);
        state.next_id += 1;
        let id = format!("{}-seeded-{}", self.name, state.next_id);
        let instance = Instance::new(
            id.clone(),
            DEFAULT_WORK_DIR.to_owned(),
            SpecPins::default_for(DEFAULT_WORK_DIR),
            &self.declarations,
            Arc::clone(&self.shared.faults),
        );
        state
            .instances
            .insert((key.clone(), kind.to_owned()), Arc::new(instance));
        id
    }

    /// How many times `acquire` was called.
    pub fn acquire_calls(&self) -> usize {
        self.shared.acquire_calls.load(Ordering::SeqCst)
    }

    /// How many times `dispose` was called.
    pub fn dispose_calls(&self) -> usize {
        self.shared.dispose_calls.load(Ordering::SeqCst)
    }

    /// How many times `dispose_scope` was called.
    pub fn dispose_scope_calls(&self) -> usize {
        self.shared.dispose_scope_calls.load(Ordering::SeqCst)
    }

    /// The most acquires that were ever running at once.
    pub fn max_concurrent_acquires(&self) -> usize {
        self.shared.max_acquires_in_flight.load(Ordering::SeqCst)
    }

    /// Every `dispose` call's key and selector, in order.
    pub fn disposals(&self) -> Vec<(SandboxKey, DisposeSelector)> {
        lock(&self.shared.state).disposals.clone()
    }

    /// The live instances as (key, kind, instance id), sorted by key and kind.
    pub fn instances(&self) -> Vec<(SandboxKey, String, String)> {
        lock(&self.shared.state)
            .instances
            .iter()
            .map(|((k, kind), i)| (k.clone(), kind.clone(), i.id.clone()))
            .collect()
    }

    async fn disposal_faults(&self, what: &str) -> Option<DisposalFailure> {
        let faults = self.faults();
        if faults.dispose_hang {
            std::future::pending::<()>().await;
        }
        if let Some(delay) = faults.dispose_delay {
            tokio::time::sleep(delay).await;
        }
        faults.dispose_failure.map(|code| {
            DisposalFailure::new(code, format!("injected {what} failure ({})", self.name))
        })
    }
}

/// Decrements the in-flight acquire count however an acquire ends.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.acquires_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared
            .max_acquires_in_flight
            .fetch_max(now, Ordering::SeqCst);
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.acquires_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl SandboxBackend for FakeBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn declarations(&self) -> &BackendDeclarations {
        &self.declarations
    }

    async fn acquire(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        self.shared.acquire_calls.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight::enter(&self.shared);
        let faults = self.faults();
        if let Some(delay) = faults.acquire_delay {
            tokio::time::sleep(delay).await;
        }
        if let Some(detail) = faults.acquire_failure {
            return Err(SandboxError::BackendUnavailable {
                backend: self.name.clone(),
                detail,
                source: None,
            });
        }
        let base = spec.work_dir().unwrap_or(DEFAULT_WORK_DIR).to_owned();
        let pins = SpecPins::of(spec, &base);
        let mut state = lock(&self.shared.state);
        let slot = (key.clone(), spec.kind().to_owned());
        if let Some(existing) = state.instances.get(&slot) {
            if let Some(what) = existing.pins.changed(&pins) {
                return Err(SandboxError::SpecMismatch(format!(
                    "the live instance has another {what}; dispose it before changing {what}"
                )));
            }
            return Ok(Arc::new(self.handle(Arc::clone(existing), false)));
        }
        state.next_id += 1;
        let id = if faults.empty_instance_ids {
            String::new()
        } else {
            format!("{}-{}", self.name, state.next_id)
        };
        let instance = Arc::new(Instance::new(
            id,
            base,
            pins,
            &self.declarations,
            Arc::clone(&self.shared.faults),
        ));
        state.instances.insert(slot, Arc::clone(&instance));
        Ok(Arc::new(self.handle(instance, !faults.never_fresh)))
    }

    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        let state = lock(&self.shared.state);
        Ok(state
            .instances
            .get(&(key.clone(), kind.to_owned()))
            .map(|i| Arc::new(self.handle(Arc::clone(i), false)) as Arc<dyn Sandbox>))
    }

    async fn dispose(
        &self,
        key: &SandboxKey,
        selector: DisposeSelector,
    ) -> Option<DisposalFailure> {
        self.shared.dispose_calls.fetch_add(1, Ordering::SeqCst);
        lock(&self.shared.state)
            .disposals
            .push((key.clone(), selector.clone()));
        if let Some(failure) = self.disposal_faults("dispose").await {
            return Some(failure);
        }
        let mut state = lock(&self.shared.state);
        state.instances.retain(|(k, kind), instance| {
            let selected = k == key
                && selector.kind.as_ref().is_none_or(|s| s == kind)
                && selector
                    .instance_id
                    .as_ref()
                    .is_none_or(|s| *s == instance.id);
            if selected {
                instance.alive.store(false, Ordering::SeqCst);
            }
            !selected
        });
        None
    }

    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        self.shared
            .dispose_scope_calls
            .fetch_add(1, Ordering::SeqCst);
        if let Some(failure) = self.disposal_faults("dispose_scope").await {
            return ScopePurge {
                disposed: 0,
                undisposed: Some(failure),
            };
        }
        let mut state = lock(&self.shared.state);
        let mut disposed = 0u32;
        state.instances.retain(|(k, _), instance| {
            let selected = k.scope == scope && k.thread_id == thread_id;
            if selected {
                instance.alive.store(false, Ordering::SeqCst);
                disposed += 1;
            }
            !selected
        });
        ScopePurge {
            disposed,
            undisposed: None,
        }
    }

    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        let state = lock(&self.shared.state);
        let mut out: Vec<SandboxSummary> = state
            .instances
            .iter()
            .filter(|((k, _), _)| k.scope == scope && thread_id.is_none_or(|t| k.thread_id == t))
            .map(|((k, kind), i)| SandboxSummary {
                key: Some(k.clone()),
                kind: Some(kind.clone()),
                instance_id: i.id.clone(),
                created: Some(i.created),
                state: SandboxState::Running,
            })
            .collect();
        out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(out)
    }

    async fn fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        if !self.declarations.serves(Capability::Snapshot) {
            return Err(SandboxError::CapabilityNotSupported(format!(
                "backend {:?} does not declare snapshot: it cannot fork a sandbox",
                self.name
            )));
        }
        if let Some(detail) = self.faults().snapshot_failure {
            return Err(SandboxError::engine(detail));
        }
        crate::backend_kit::refuse_fork_onto_source(source, target)?;
        let kind = spec.kind().to_owned();
        let mut state = lock(&self.shared.state);
        let Some(origin) = state
            .instances
            .get(&(source.clone(), kind.clone()))
            .cloned()
        else {
            return Err(SandboxError::invalid(format!(
                "{source} has no sandbox of kind {kind:?} to fork"
            )));
        };
        if state
            .instances
            .contains_key(&(target.clone(), kind.clone()))
        {
            return Err(SandboxError::invalid(format!(
                "{target} already has a sandbox of kind {kind:?}"
            )));
        }
        let base = spec.work_dir().unwrap_or(DEFAULT_WORK_DIR);
        if let Some(what) = origin.pins.changed(&SpecPins::of(spec, base)) {
            return Err(SandboxError::SpecMismatch(format!(
                "the source has another {what} than the spec"
            )));
        }
        state.next_id += 1;
        let id = format!("{}-{}", self.name, state.next_id);
        let copy = Arc::new(origin.copy(id, &self.declarations, Arc::clone(&self.shared.faults)));
        state
            .instances
            .insert((target.clone(), kind), Arc::clone(&copy));
        Ok(Arc::new(self.handle(copy, true)))
    }
}
