//! The HARDENING and CONFINEMENT hooks of the qemu backend (docs/conformance.md): what the
//! suites need from beside the backend, taken from the host's QEMU processes, the VM
//! directories and records under the state directory, a child process, and an agent connection
//! of the hooks' own (`observer`).

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bounded_process::{BoundedCommand, ExitKind};
use conformance::isolation::{AcquireOutcome, Fingerprint, HardeningHooks};
use conformance::ConformanceError;
use sandbox_core::{ErrorKind, Sandbox, SandboxKey, SandboxSpec};

use super::observer;

/// How long the child process's acquires may take (a TCG boot under load, and a wait for a
/// port of a VM the parent holds).
const CHILD_TIMEOUT: Duration = Duration::from_secs(600);

/// How long the hooks wait for an agent port of their own.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The hooks of a backend over `state_dir`.
pub struct QemuHooks {
    /// The backend's state directory.
    pub state_dir: PathBuf,
    /// The host's static BusyBox, the observer the fingerprint runs in the guest.
    pub busybox: Vec<u8>,
    /// Each VM's image paths as its first fingerprint saw them.
    images: Mutex<HashMap<String, observer::ImageView>>,
}

impl QemuHooks {
    /// Hooks for a backend over `state_dir`.
    pub fn new(state_dir: PathBuf) -> QemuHooks {
        QemuHooks {
            state_dir,
            busybox: observer::host_busybox().expect("a static busybox for the observer"),
            images: Mutex::new(HashMap::new()),
        }
    }

    fn vm_dir(&self, instance: &str) -> PathBuf {
        super::vm_dir(&self.state_dir, instance)
    }
}

fn harness(message: impl Into<String>) -> ConformanceError {
    ConformanceError::harness("HARDENING", message.into())
}

/// The (scope, thread, agent, call, kind, instance) of every record under `state_dir`.
fn records(state_dir: &std::path::Path) -> Vec<(SandboxKey, String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(state_dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path().join("record.json")) else {
            continue;
        };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let field = |name: &str| value[name].as_str().unwrap_or_default().to_owned();
        let key = SandboxKey {
            scope: field("scope"),
            thread_id: field("thread_id"),
            agent_id: field("agent_id"),
            call_id: field("call_id"),
        };
        found.push((key, field("kind"), field("instance")));
    }
    found
}

#[async_trait]
impl HardeningHooks for QemuHooks {
    /// Kills the VM's QEMU and removes its directory, as another process would, leaving the
    /// backend's record.
    async fn remove_behind_the_handle(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<(), ConformanceError> {
        let vm = qemu_vm::Vm::attach(&self.vm_dir(sandbox.instance_id()))
            .map_err(|e| harness(format!("finding the VM: {e}")))?;
        vm.kill()
            .await
            .map_err(|e| harness(format!("killing the VM: {e}")))
    }

    /// The QEMUs running under the state directory that no record of another (key, kind)
    /// names: the key's own VM, and any VM no record owns (one a losing racer started).
    async fn engine_instances_for(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<usize, ConformanceError> {
        let others: BTreeSet<String> = records(&self.state_dir)
            .into_iter()
            .filter(|(k, kind, _)| k != key || kind != spec.kind())
            .map(|(_, _, instance)| instance)
            .collect();
        let vms = self.state_dir.join("vms");
        let running = qemu_vm::qemus_under(&vms)
            .into_iter()
            .filter_map(|qemu| Some(qemu.vm_dir.file_name()?.to_str()?.to_owned()))
            .filter(|instance| !others.contains(instance))
            .count();
        Ok(running)
    }

    async fn acquire_in_child_process(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
        n: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        let image = super::image_dir();
        let output = BoundedCommand::new(env!("CARGO_BIN_EXE_qemu-acquire-child"), CHILD_TIMEOUT)
            .args([
                image.as_os_str(),
                self.state_dir.as_os_str(),
                key.scope.as_ref(),
                key.thread_id.as_ref(),
                key.agent_id.as_ref(),
                key.call_id.as_ref(),
                spec.kind().as_ref(),
                spec.work_dir().unwrap_or("-").as_ref(),
                n.to_string().as_ref(),
            ])
            .envs(std::env::vars_os())
            .run()
            .await
            .map_err(|e| harness(format!("the child process: {e}")))?;
        if output.status != ExitKind::Exited(0) {
            return Err(harness(format!(
                "the child process ended {:?}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        conformance::child_process::parse_child_acquires(&output.stdout)
    }

    /// A VM has no network device, so no address of this host is reachable from it; the probe
    /// serves its token on an address a user-mode network would reach: that of the interface
    /// carrying this host's default route, else the first that is neither loopback nor
    /// link-local, else loopback. The default route's first: a bridge a suite running beside
    /// this one made for its own test may be gone by the time the token server binds.
    async fn routable_host_address(&self) -> Result<IpAddr, ConformanceError> {
        let interfaces =
            if_addrs::get_if_addrs().map_err(|e| harness(format!("the host's interfaces: {e}")))?;
        let routed = std::fs::read_to_string("/proc/net/route")
            .ok()
            .and_then(|table| default_route_interface(&table));
        let mut found: Vec<(bool, Ipv4Addr)> = interfaces
            .iter()
            .filter_map(|interface| match interface.ip() {
                IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() => {
                    Some((routed.as_deref() != Some(interface.name.as_str()), v4))
                }
                _ => None,
            })
            .collect();
        found.sort();
        Ok(IpAddr::V4(
            found
                .first()
                .map_or(Ipv4Addr::LOCALHOST, |(_, address)| *address),
        ))
    }

    /// A VM's faults are `SandboxGone` when its QEMU is gone (docs/qemu-backend.md).
    fn gone_kinds(&self) -> Vec<ErrorKind> {
        vec![ErrorKind::SandboxGone]
    }

    async fn fingerprint(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<Option<Fingerprint>, ConformanceError> {
        let vm_dir = self.vm_dir(sandbox.instance_id());
        let vm =
            qemu_vm::Vm::attach(&vm_dir).map_err(|e| harness(format!("finding the VM: {e}")))?;
        let agent = vm
            .agent(CONNECT_TIMEOUT)
            .await
            .map_err(|e| harness(format!("an agent connection of the observer's own: {e}")))?;
        let host = observer::HostSide { vm_dir };
        let instance = sandbox.instance_id().to_owned();
        let mut image = self.images.lock().unwrap().get(&instance).cloned();
        let view = observer::fingerprint(&agent, &self.busybox, &host, &mut image).await?;
        if let Some(image) = image {
            self.images.lock().unwrap().insert(instance, image);
        }
        Ok(Some(view))
    }
}

/// The interface of the default route in `/proc/net/route`'s text (destination and mask 0).
pub fn default_route_interface(table: &str) -> Option<String> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (name, destination, mask) = (fields.first()?, fields.get(1)?, fields.get(7)?);
        (*destination == "00000000" && *mask == "00000000").then(|| (*name).to_owned())
    })
}
