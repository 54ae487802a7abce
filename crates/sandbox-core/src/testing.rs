//! An in-process fake backend for tests of hosts and of the router (feature `testing`).
//!
//! [`FakeBackend`] keeps its sandboxes in memory and isolates **nothing**: it declares whatever rung it is
//! told to, so tests can exercise the router's floor. Each [`FakeSandbox`] holds a map of paths to bytes
//! and applies the contract's guest-path rules (the core's `check_*` bundles) to it; it has no links, so
//! link refusals never arise. `exec` runs no process: it understands a handful of words (`true`, `false`,
//! `echo`, `pwd`, `cat FILE`, and `exit N` in a shell line) or returns an output set through [`Faults`].
//! Timeouts are not simulated. Faults are injected with [`FakeBackend::update_faults`].
//!
//! ```
//! use std::sync::Arc;
//! use sandbox_core::testing::FakeBackend;
//! use sandbox_core::{Command, DisposalCode, ExecRequest, Isolation, SandboxBackend, SandboxKey, SandboxSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), sandbox_core::SandboxError> {
//! let fake = Arc::new(FakeBackend::new("fake", Isolation::Microvm));
//! let key = SandboxKey::conversation("s", "t", "a");
//! let sandbox = fake.acquire(&key, &SandboxSpec::builder("py").build()?).await?;
//! sandbox.write_file("greeting", b"hi", ".").await?;
//! assert_eq!(sandbox.read_file("greeting", ".", 10).await?, b"hi");
//! let out = sandbox.exec(ExecRequest::new(Command::argv(["echo", "hello"]))).await?;
//! assert_eq!(out.stdout, b"hello\n");
//!
//! fake.update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
//! assert!(fake.dispose(&key, Default::default()).await.is_some());
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{
    check_delete, check_list, check_read, check_write, guest_path_norm, guest_path_relative_to,
    resolve_wd, BackendDeclarations, Capability, DisposalCode, DisposalFailure, DisposeSelector,
    Egress, EntryKind, ExecOutput, ExecRequest, Isolation, IsolationScope, OsFamily, Sandbox,
    SandboxBackend, SandboxEntry, SandboxError, SandboxKey, SandboxSpec, SandboxState,
    SandboxSummary, ScopePurge, DEFAULT_WORK_DIR,
};

/// Faults and canned behaviour a test can inject into a [`FakeBackend`]. The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Faults {
    /// Every acquire fails with [`SandboxError::BackendUnavailable`] carrying this detail.
    pub acquire_failure: Option<String>,
    /// Every acquire waits this long before doing anything (tokio time, so paused clocks apply).
    pub acquire_delay: Option<Duration>,
    /// Newly created instances get an empty instance id (a contract violation).
    pub empty_instance_ids: bool,
    /// Newly created instances report `freshly_created() == false`, as a backend that cannot tell would.
    pub never_fresh: bool,
    /// Every `dispose` and `dispose_scope` fails with this code and removes nothing.
    pub dispose_failure: Option<DisposalCode>,
    /// Every `dispose` and `dispose_scope` waits this long first.
    pub dispose_delay: Option<Duration>,
    /// Every `dispose` and `dispose_scope` never returns.
    pub dispose_hang: bool,
    /// Every `exec` returns this output instead of interpreting the command.
    pub exec_output: Option<ExecOutput>,
}

/// An in-memory backend with fault injection. See the [module documentation](self).
#[derive(Debug)]
pub struct FakeBackend {
    name: String,
    isolation: Isolation,
    declarations: BackendDeclarations,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<BackendState>,
    faults: Mutex<Faults>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding a lock left consistent data behind: every update is one step.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeBackend {
    /// A fake named `name` that claims the `isolation` rung, with [`default_declarations`](Self::default_declarations).
    pub fn new(name: impl Into<String>, isolation: Isolation) -> Self {
        FakeBackend {
            name: name.into(),
            isolation,
            declarations: Self::default_declarations(),
            shared: Arc::default(),
        }
    }

    /// What a fake declares unless told otherwise: exec and every file capability except `reclaim`,
    /// egress `{closed}`, OS family `{posix}`, scopes `{conversation, call}`, the default limits.
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
        self.declarations = declarations;
        self
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
            Arc::clone(&self.shared),
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
            return Ok(Arc::new(FakeSandbox {
                instance: Arc::clone(existing),
                fresh: false,
            }));
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
            Arc::clone(&self.shared),
        ));
        state.instances.insert(slot, Arc::clone(&instance));
        Ok(Arc::new(FakeSandbox {
            instance,
            fresh: !faults.never_fresh,
        }))
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
            .map(|i| {
                Arc::new(FakeSandbox {
                    instance: Arc::clone(i),
                    fresh: false,
                }) as Arc<dyn Sandbox>
            }))
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
}

/// What a warm acquire must not change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SpecPins {
    base: String,
    image: Option<String>,
    image_id: Option<String>,
    egress: Egress,
}

impl SpecPins {
    fn of(spec: &SandboxSpec, base: &str) -> Self {
        SpecPins {
            base: base.to_owned(),
            image: spec.image().map(str::to_owned),
            image_id: spec.image_id().map(str::to_owned),
            egress: spec.egress(),
        }
    }

    fn default_for(base: &str) -> Self {
        SpecPins {
            base: base.to_owned(),
            image: None,
            image_id: None,
            egress: Egress::Closed,
        }
    }

    fn changed(&self, other: &SpecPins) -> Option<&'static str> {
        if self.base != other.base {
            Some("work_dir")
        } else if self.image != other.image {
            Some("image")
        } else if self.image_id != other.image_id {
            Some("image_id")
        } else if self.egress != other.egress {
            Some("egress")
        } else {
            None
        }
    }
}

#[derive(Debug, Clone)]
enum Node {
    File(Vec<u8>),
    Dir,
}

impl Node {
    fn kind(&self) -> EntryKind {
        match self {
            Node::File(_) => EntryKind::File,
            Node::Dir => EntryKind::Directory,
        }
    }
}

/// One physical fake instance, shared by every handle to it.
#[derive(Debug)]
struct Instance {
    id: String,
    base: String,
    pins: SpecPins,
    created: SystemTime,
    alive: AtomicBool,
    files: Mutex<BTreeMap<String, Node>>,
    lists: bool,
    deletes: bool,
    backend: Arc<Shared>,
}

impl Instance {
    fn new(
        id: String,
        base: String,
        pins: SpecPins,
        declarations: &BackendDeclarations,
        backend: Arc<Shared>,
    ) -> Self {
        let mut files = BTreeMap::new();
        let mut prefix = String::new();
        for part in base.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            files.insert(prefix.clone(), Node::Dir);
        }
        Instance {
            id,
            base,
            pins,
            created: SystemTime::now(),
            alive: AtomicBool::new(true),
            files: Mutex::new(files),
            lists: declarations.serves(Capability::FilesList),
            deletes: declarations.serves(Capability::FilesDelete),
            backend,
        }
    }
}

/// A handle to a [`FakeBackend`] instance. Handles outlive their instance: once it is disposed of, every
/// method is [`SandboxError::SandboxGone`].
#[derive(Debug)]
pub struct FakeSandbox {
    instance: Arc<Instance>,
    fresh: bool,
}

fn stat_in(
    files: &BTreeMap<String, Node>,
) -> impl FnMut(&str) -> crate::Result<Option<EntryKind>> + '_ {
    |path| Ok(files.get(path).map(Node::kind))
}

/// A resolved path as an entry path: relative to the working directory, `.` for the directory itself.
fn entry_path(resolved: &str, wd: &str) -> String {
    match guest_path_relative_to(resolved, wd) {
        Some(rel) if !rel.is_empty() => rel,
        _ => ".".to_owned(),
    }
}

fn entry_of(resolved: &str, wd: &str, node: &Node) -> SandboxEntry {
    let path = entry_path(resolved, wd);
    match node {
        Node::File(bytes) => SandboxEntry::file(path, bytes.len() as u64),
        Node::Dir => SandboxEntry::new(path, EntryKind::Directory, None),
    }
}

impl FakeSandbox {
    fn live(&self) -> Result<(), SandboxError> {
        if self.instance.alive.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(SandboxError::SandboxGone {
                instance: self.instance.id.clone(),
            })
        }
    }

    fn files(&self) -> MutexGuard<'_, BTreeMap<String, Node>> {
        lock(&self.instance.files)
    }

    /// The working directory, resolved against the storage base and normalised.
    fn wd(&self, wd: &str) -> Result<String, SandboxError> {
        Ok(guest_path_norm(&resolve_wd(wd, &self.instance.base)?))
    }

    fn run(&self, words: &[String], wd: &str) -> (i32, Vec<u8>, Vec<u8>) {
        let Some((program, args)) = words.split_first() else {
            return (0, Vec::new(), Vec::new());
        };
        match program.as_str() {
            "true" => (0, Vec::new(), Vec::new()),
            "false" => (1, Vec::new(), Vec::new()),
            "echo" => (0, format!("{}\n", args.join(" ")).into_bytes(), Vec::new()),
            "pwd" => (0, format!("{wd}\n").into_bytes(), Vec::new()),
            "cat" => {
                let files = self.files();
                let mut out = Vec::new();
                for arg in args {
                    let resolved = guest_path_norm(&crate::guest_path_join(wd, arg));
                    match files.get(&resolved) {
                        Some(Node::File(bytes)) => out.extend_from_slice(bytes),
                        _ => {
                            return (
                                1,
                                out,
                                format!("cat: {arg}: No such file or directory\n").into_bytes(),
                            )
                        }
                    }
                }
                (0, out, Vec::new())
            }
            other => (
                127,
                Vec::new(),
                format!("fake: {other}: command not found\n").into_bytes(),
            ),
        }
    }
}

#[async_trait]
impl Sandbox for FakeSandbox {
    fn instance_id(&self) -> &str {
        &self.instance.id
    }

    fn freshly_created(&self) -> bool {
        self.fresh
    }

    fn storage_base(&self) -> &str {
        &self.instance.base
    }

    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        request.validate()?;
        self.live()?;
        let wd = self.wd(request.working_dir())?;
        let output = if let Some(canned) = lock(&self.instance.backend.faults).exec_output.clone() {
            canned
        } else if !matches!(self.files().get(&wd), Some(Node::Dir)) {
            ExecOutput::workdir_unusable(format!("fake: working directory {wd} does not exist"))
        } else {
            let argv: Vec<String> = request
                .command()
                .to_argv()
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let words: Vec<String> = match argv.as_slice() {
                [sh, c, line] if sh == "sh" && c == "-c" => {
                    line.split_whitespace().map(str::to_owned).collect()
                }
                _ => argv,
            };
            let (exit_code, stdout, stderr) = match words.as_slice() {
                [exit] if exit == "exit" => (0, Vec::new(), Vec::new()),
                [exit, n] if exit == "exit" => match n.parse::<i32>() {
                    Ok(code) => (code, Vec::new(), Vec::new()),
                    Err(_) => (2, Vec::new(), b"fake: exit: bad number\n".to_vec()),
                },
                _ => self.run(&words, &wd),
            };
            ExecOutput::exited(stdout, stderr, exit_code)
        };
        let budget = request.output_budget();
        if (output.stdout.len() + output.stderr.len()) as u64 > budget {
            return Err(SandboxError::OutputLimitExceeded { limit: budget });
        }
        Ok(output)
    }

    async fn write_file(&self, path: &str, content: &[u8], wd: &str) -> Result<(), SandboxError> {
        self.live()?;
        let wd = self.wd(wd)?;
        let mut files = self.files();
        let resolved = check_write(stat_in(&files), path, &wd)?;
        if matches!(files.get(&resolved), Some(Node::Dir)) {
            return Err(SandboxError::IsADirectory { path: path.into() });
        }
        // Create the missing parents, the working directory included.
        let mut prefix = String::new();
        let parent = resolved.rsplit_once('/').map_or("", |(p, _)| p);
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            match files.get(&prefix) {
                Some(Node::Dir) => {}
                Some(Node::File(_)) => return Err(SandboxError::NotADirectory { path: prefix }),
                None => {
                    files.insert(prefix.clone(), Node::Dir);
                }
            }
        }
        files.insert(resolved, Node::File(content.to_vec()));
        Ok(())
    }

    async fn stat_file(&self, path: &str, wd: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        self.live()?;
        let wd = self.wd(wd)?;
        let files = self.files();
        let resolved = check_read(stat_in(&files), path, &wd)?;
        Ok(files.get(&resolved).map(|n| entry_of(&resolved, &wd, n)))
    }

    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        self.live()?;
        let wd = self.wd(wd)?;
        let files = self.files();
        let resolved = check_read(stat_in(&files), path, &wd)?;
        match files.get(&resolved) {
            None => Err(SandboxError::NotFound { path: path.into() }),
            Some(Node::Dir) => Err(SandboxError::IsADirectory { path: path.into() }),
            Some(Node::File(bytes)) if bytes.len() as u64 > max_bytes => {
                Err(SandboxError::TransferCapExceeded {
                    path: path.into(),
                    limit: max_bytes,
                })
            }
            Some(Node::File(bytes)) => Ok(bytes.clone()),
        }
    }

    async fn list_dir(&self, path: &str, wd: &str) -> Result<Vec<SandboxEntry>, SandboxError> {
        if !self.instance.lists {
            return Err(SandboxError::Unsupported(
                "this fake does not declare files_list".into(),
            ));
        }
        self.live()?;
        let wd = self.wd(wd)?;
        let files = self.files();
        let resolved = check_list(stat_in(&files), path, &wd)?;
        match files.get(&resolved) {
            None => return Err(SandboxError::NotFound { path: path.into() }),
            Some(Node::File(_)) => return Err(SandboxError::NotADirectory { path: path.into() }),
            Some(Node::Dir) => {}
        }
        let prefix = if resolved == "/" {
            "/".to_owned()
        } else {
            format!("{resolved}/")
        };
        let mut entries: Vec<SandboxEntry> = files
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter(|(p, _)| !p[prefix.len()..].contains('/'))
            .map(|(p, n)| entry_of(p, &wd, n))
            .collect();
        entries.sort();
        Ok(entries)
    }

    async fn remove(&self, path: &str, wd: &str, recursive: bool) -> Result<(), SandboxError> {
        if !self.instance.deletes {
            return Err(SandboxError::Unsupported(
                "this fake does not declare files_delete".into(),
            ));
        }
        self.live()?;
        let wd = self.wd(wd)?;
        let mut files = self.files();
        let resolved = check_delete(stat_in(&files), path, &wd)?;
        match files.get(&resolved) {
            None => Ok(()),
            Some(Node::File(_)) => {
                files.remove(&resolved);
                Ok(())
            }
            Some(Node::Dir) if !recursive => Err(SandboxError::IsADirectory { path: path.into() }),
            Some(Node::Dir) => {
                let prefix = format!("{resolved}/");
                files.retain(|p, _| *p != resolved && !p.starts_with(&prefix));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, ErrorKind};

    fn key() -> SandboxKey {
        SandboxKey::conversation("s", "t", "a")
    }

    async fn sandbox(fake: &FakeBackend) -> Arc<dyn Sandbox> {
        fake.acquire(&key(), &SandboxSpec::builder("k").build().unwrap())
            .await
            .unwrap()
    }

    async fn exec(sb: &Arc<dyn Sandbox>, command: Command) -> ExecOutput {
        sb.exec(ExecRequest::new(command)).await.unwrap()
    }

    #[tokio::test]
    async fn acquire_is_get_or_create_and_warm_handles_are_not_fresh() {
        let fake = FakeBackend::new("f", Isolation::None);
        let first = sandbox(&fake).await;
        let second = sandbox(&fake).await;
        assert!(first.freshly_created());
        assert!(!second.freshly_created());
        assert_eq!(first.instance_id(), second.instance_id());
        assert_eq!(first.storage_base(), DEFAULT_WORK_DIR);
        assert_eq!(fake.acquire_calls(), 2);
        let changed = SandboxSpec::builder("k").image("other").build().unwrap();
        let err = fake.acquire(&key(), &changed).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::SpecMismatch);
        assert!(err.to_string().contains("image"), "{err}");
    }

    #[tokio::test]
    async fn files_follow_the_contract_rules() {
        let fake = FakeBackend::new("f", Isolation::None);
        let sb = sandbox(&fake).await;
        sb.write_file("d/a.txt", b"abc", ".").await.unwrap();
        sb.write_file("d/a.txt", b"xy", ".").await.unwrap();
        assert_eq!(sb.read_file("d/a.txt", ".", 2).await.unwrap(), b"xy");
        let cap = sb.read_file("d/a.txt", ".", 1).await.unwrap_err();
        assert_eq!(cap.kind(), ErrorKind::TransferCapExceeded);
        assert_eq!(
            sb.read_file("missing", ".", 9).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            sb.read_file("d", ".", 9).await.unwrap_err().kind(),
            ErrorKind::IsADirectory
        );
        assert_eq!(
            sb.read_file("d/a.txt/x", ".", 9).await.unwrap_err().kind(),
            ErrorKind::NotADirectory
        );
        for escape in ["../x", "/etc/passwd", "a\\b"] {
            assert_eq!(
                sb.write_file(escape, b"", ".").await.unwrap_err().kind(),
                ErrorKind::Confinement,
                "{escape}"
            );
        }
        assert_eq!(
            sb.write_file(".", b"", ".").await.unwrap_err().kind(),
            ErrorKind::Confinement
        );
        assert_eq!(
            sb.stat_file("d/a.txt", ".").await.unwrap(),
            Some(SandboxEntry::file("d/a.txt", 2))
        );
        assert_eq!(sb.stat_file(".", "d").await.unwrap().unwrap().path(), ".");
        assert_eq!(sb.stat_file("nope", ".").await.unwrap(), None);

        sb.write_file("b", b"1", "d").await.unwrap();
        let listed = sb.list_dir("d", ".").await.unwrap();
        let paths: Vec<&str> = listed.iter().map(|e| e.path()).collect();
        assert_eq!(paths, ["d/a.txt", "d/b"]);

        assert_eq!(
            sb.remove("d", ".", false).await.unwrap_err().kind(),
            ErrorKind::IsADirectory
        );
        sb.remove("missing", ".", false).await.unwrap();
        sb.remove("d", ".", true).await.unwrap();
        assert_eq!(sb.stat_file("d/b", ".").await.unwrap(), None);
        assert!(sb.list_dir(".", ".").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn exec_understands_a_few_words_and_nothing_more() {
        let fake = FakeBackend::new("f", Isolation::None);
        let sb = sandbox(&fake).await;
        let out = exec(&sb, Command::argv(["echo", "a", "b"])).await;
        assert_eq!((out.exit_code, out.stdout_text()), (0, "a b\n".to_owned()));
        assert_eq!(exec(&sb, Command::argv(["false"])).await.exit_code, 1);
        assert_eq!(exec(&sb, Command::shell("exit 7")).await.exit_code, 7);
        let out = exec(&sb, Command::argv(["pwd"])).await;
        assert_eq!(out.stdout_text(), format!("{DEFAULT_WORK_DIR}\n"));
        sb.write_file("f", b"bytes", ".").await.unwrap();
        assert_eq!(exec(&sb, Command::shell("cat f")).await.stdout, b"bytes");
        let out = exec(&sb, Command::argv(["python3"])).await;
        assert_eq!(out.exit_code, 127);
        assert!(out.stderr_text().contains("command not found"));
        let missing_wd = sb
            .exec(ExecRequest::new(Command::argv(["true"])).working_directory("nowhere"))
            .await
            .unwrap();
        assert_eq!(missing_wd.exit_code, 125);
        assert!(missing_wd.not_started.unwrap().contains("nowhere"));
        let escape = sb
            .exec(ExecRequest::new(Command::argv(["true"])).working_directory("../.."))
            .await
            .unwrap_err();
        assert_eq!(escape.kind(), ErrorKind::Confinement);
        let over = sb
            .exec(ExecRequest::new(Command::argv(["echo", "long"])).max_output_bytes(2))
            .await
            .unwrap_err();
        assert_eq!(over.kind(), ErrorKind::OutputLimitExceeded);

        let canned = ExecOutput::exited(b"canned".to_vec(), Vec::new(), 3);
        fake.update_faults(|f| f.exec_output = Some(canned.clone()));
        assert_eq!(exec(&sb, Command::argv(["true"])).await, canned);
    }

    #[tokio::test]
    async fn disposal_removes_selected_instances_and_old_handles_are_gone() {
        let fake = FakeBackend::new("f", Isolation::None);
        let sb = sandbox(&fake).await;
        let id = sb.instance_id().to_owned();
        assert_eq!(
            fake.dispose(&key(), DisposeSelector::instance("k", "stale"))
                .await,
            None
        );
        assert_eq!(fake.instances().len(), 1, "a stale id is a no-op");
        assert_eq!(
            fake.dispose(&key(), DisposeSelector::instance("k", id.clone()))
                .await,
            None
        );
        assert!(fake.instances().is_empty());
        assert_eq!(
            sb.exec(ExecRequest::new(Command::argv(["true"])))
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::SandboxGone
        );
        assert_eq!(fake.dispose_calls(), 2);
        assert_eq!(
            fake.disposals()[1],
            (key(), DisposeSelector::instance("k", id))
        );
    }

    #[tokio::test]
    async fn scope_purge_counts_and_list_sorts() {
        let fake = FakeBackend::new("f", Isolation::None);
        let spec = SandboxSpec::builder("k").build().unwrap();
        for agent in ["b", "a"] {
            fake.acquire(&SandboxKey::conversation("s", "t", agent), &spec)
                .await
                .unwrap();
        }
        fake.acquire(&SandboxKey::conversation("s", "other", "a"), &spec)
            .await
            .unwrap();
        let listed = fake.list("s", Some("t")).await.unwrap();
        let ids: Vec<&str> = listed.iter().map(|s| s.instance_id.as_str()).collect();
        assert_eq!(ids, ["f-1", "f-2"]);
        assert_eq!(fake.list("s", None).await.unwrap().len(), 3);
        let purge = fake.dispose_scope("s", "t").await;
        assert_eq!(
            purge,
            ScopePurge {
                disposed: 2,
                undisposed: None
            }
        );
        assert_eq!(fake.instances().len(), 1);
        assert!(fake
            .find(&SandboxKey::conversation("s", "other", "a"), "k")
            .await
            .unwrap()
            .is_some_and(|s| !s.freshly_created()));
    }

    #[tokio::test]
    async fn injected_faults() {
        let fake = FakeBackend::new("f", Isolation::None);
        fake.update_faults(|f| f.acquire_failure = Some("down".into()));
        let spec = SandboxSpec::builder("k").build().unwrap();
        let err = fake.acquire(&key(), &spec).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BackendUnavailable);
        fake.update_faults(|f| {
            f.acquire_failure = None;
            f.empty_instance_ids = true;
            f.dispose_failure = Some(DisposalCode::Unreachable);
        });
        assert_eq!(fake.acquire(&key(), &spec).await.unwrap().instance_id(), "");
        let failure = fake.dispose(&key(), DisposeSelector::all()).await.unwrap();
        assert_eq!(failure.code, DisposalCode::Unreachable);
        assert_eq!(
            fake.instances().len(),
            1,
            "a failed disposal removes nothing"
        );
        let purge = fake.dispose_scope("s", "t").await;
        assert_eq!(purge.disposed, 0);
        assert!(purge.undisposed.is_some());

        let seeded = FakeBackend::new("g", Isolation::None);
        let id = seeded.seed_instance(&key(), "k");
        let sb = seeded.acquire(&key(), &spec).await.unwrap();
        assert_eq!(sb.instance_id(), id);
        assert!(!sb.freshly_created());
    }
}
