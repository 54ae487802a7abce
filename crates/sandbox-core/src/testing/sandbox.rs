//! The fake sandbox: one in-memory file tree per instance, under the contract's guest-path rules.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::faults::Faults;
use super::{lock, shell};
use crate::guest_path::{self, resolve_wd, Access};
use crate::{
    BackendDeclarations, Capability, Egress, EntryKind, ExecOutput, ExecRequest, Sandbox,
    SandboxEntry, SandboxError, SandboxSpec,
};

/// What a warm acquire must not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SpecPins {
    base: String,
    image: Option<String>,
    image_id: Option<String>,
    egress: Egress,
}

impl SpecPins {
    pub(super) fn of(spec: &SandboxSpec, base: &str) -> Self {
        SpecPins {
            base: base.to_owned(),
            image: spec.image().map(str::to_owned),
            image_id: spec.image_id().map(str::to_owned),
            egress: spec.egress(),
        }
    }

    pub(super) fn default_for(base: &str) -> Self {
        SpecPins {
            base: base.to_owned(),
            image: None,
            image_id: None,
            egress: Egress::Closed,
        }
    }

    pub(super) fn changed(&self, other: &SpecPins) -> Option<&'static str> {
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
pub(super) enum Node {
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
pub(super) struct Instance {
    pub(super) id: String,
    base: String,
    pub(super) pins: SpecPins,
    pub(super) created: SystemTime,
    pub(super) alive: AtomicBool,
    files: Mutex<BTreeMap<String, Node>>,
    lists: bool,
    deletes: bool,
    reclaims: bool,
    snapshots: bool,
    faults: Arc<Mutex<Faults>>,
}

/// What an instance asks of the backend that owns it to be reset: the backend keeps the map of
/// instances, so a handle replaces its instance through this, never by reaching into the map.
pub(super) trait Replace: Send + Sync + std::fmt::Debug {
    /// A new instance in `old`'s place, as `old` was when acquired; `old` is dead afterwards.
    fn replace(&self, old: &Arc<Instance>) -> Result<Arc<Instance>, SandboxError>;
}

impl Instance {
    pub(super) fn new(
        id: String,
        base: String,
        pins: SpecPins,
        declarations: &BackendDeclarations,
        faults: Arc<Mutex<Faults>>,
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
            reclaims: declarations.serves(Capability::Reclaim),
            snapshots: declarations.serves(Capability::Snapshot),
            faults,
        }
    }

    /// A new instance `id` whose files are a copy of this one's now (a fork).
    pub(super) fn copy(
        &self,
        id: String,
        declarations: &BackendDeclarations,
        faults: Arc<Mutex<Faults>>,
    ) -> Self {
        let copy = Instance::new(
            id,
            self.base.clone(),
            self.pins.clone(),
            declarations,
            faults,
        );
        *lock(&copy.files) = lock(&self.files).clone();
        copy
    }

    /// A new instance `id` as this one was when acquired: its storage base and nothing else.
    pub(super) fn fresh_copy(
        &self,
        id: String,
        declarations: &BackendDeclarations,
        faults: Arc<Mutex<Faults>>,
    ) -> Self {
        Instance::new(
            id,
            self.base.clone(),
            self.pins.clone(),
            declarations,
            faults,
        )
    }
}

/// A handle to a [`FakeBackend`](super::FakeBackend) instance. Handles outlive their instance: once it is disposed of, every
/// method is [`SandboxError::SandboxGone`].
#[derive(Debug)]
pub struct FakeSandbox {
    instance: Arc<Instance>,
    fresh: bool,
    owner: Arc<dyn Replace>,
}

fn stat_in(
    files: &BTreeMap<String, Node>,
) -> impl FnMut(&str) -> crate::Result<Option<EntryKind>> + '_ {
    |path| Ok(files.get(path).map(Node::kind))
}

/// A resolved path as an entry path: relative to the working directory, `.` for the directory itself.
fn entry_path(resolved: &str, wd: &str) -> String {
    match guest_path::relative_to(resolved, wd) {
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
    pub(super) fn new(instance: Arc<Instance>, fresh: bool, owner: Arc<dyn Replace>) -> Self {
        FakeSandbox {
            instance,
            fresh,
            owner,
        }
    }

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
        resolve_wd(wd, &self.instance.base)
    }

    /// A regular file's bytes, under the read rules; the caller applies its size rule.
    fn read_whole(&self, path: &str, wd: &str) -> Result<Vec<u8>, SandboxError> {
        self.live()?;
        let wd = self.wd(wd)?;
        let files = self.files();
        let resolved = Access::Read.check(stat_in(&files), path, &wd)?;
        match files.get(&resolved) {
            None => Err(SandboxError::NotFound { path: path.into() }),
            Some(Node::Dir) => Err(SandboxError::IsADirectory { path: path.into() }),
            Some(Node::File(bytes)) => Ok(bytes.clone()),
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
        let output = if let Some(canned) = lock(&self.instance.faults).exec_output.clone() {
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
            let (exit_code, stdout, stderr) = {
                let files = self.files();
                shell::run_line(argv, &wd, |path| match files.get(path) {
                    Some(Node::File(bytes)) => Some(bytes.as_slice()),
                    _ => None,
                })
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
        let resolved = Access::Write.check(stat_in(&files), path, &wd)?;
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
        let resolved = Access::Read.check(stat_in(&files), path, &wd)?;
        Ok(files.get(&resolved).map(|n| entry_of(&resolved, &wd, n)))
    }

    async fn read_file(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        let bytes = self.read_whole(path, wd)?;
        if bytes.len() as u64 > max_bytes {
            return Err(SandboxError::TransferCapExceeded {
                path: path.into(),
                limit: max_bytes,
            });
        }
        Ok(bytes)
    }

    async fn read_head(
        &self,
        path: &str,
        wd: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, SandboxError> {
        let mut bytes = self.read_whole(path, wd)?;
        bytes.truncate(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        Ok(bytes)
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
        let resolved = Access::List.check(stat_in(&files), path, &wd)?;
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
        let resolved = Access::Delete.check(stat_in(&files), path, &wd)?;
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

    async fn reclaim(
        &self,
        directory: &str,
        wd: &str,
        _timeout: Duration,
    ) -> Result<(), SandboxError> {
        if !self.instance.reclaims {
            return Err(SandboxError::Unsupported(
                "this fake does not declare reclaim".into(),
            ));
        }
        self.live()?;
        let wd = self.wd(wd)?;
        let mut files = self.files();
        let resolved = Access::Delete.check(stat_in(&files), directory, &wd)?;
        if let Some(Node::File(_)) = files.get(&resolved) {
            return Err(SandboxError::NotADirectory {
                path: directory.into(),
            });
        }
        let prefix = format!("{resolved}/");
        files.retain(|p, _| *p != resolved && !p.starts_with(&prefix));
        Ok(())
    }

    async fn reset(&self) -> Result<Arc<dyn Sandbox>, SandboxError> {
        if !self.instance.snapshots {
            return Err(SandboxError::CapabilityNotSupported(
                "this fake does not declare snapshot: it cannot reset a sandbox".into(),
            ));
        }
        self.live()?;
        if let Some(detail) = lock(&self.instance.faults).snapshot_failure.clone() {
            return Err(SandboxError::engine(detail));
        }
        let instance = self.owner.replace(&self.instance)?;
        Ok(Arc::new(FakeSandbox::new(
            instance,
            false,
            Arc::clone(&self.owner),
        )))
    }
}
