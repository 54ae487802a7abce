//! The backend's configuration, its checks, and the rung the accelerator earns.

use std::path::PathBuf;
use std::time::Duration;

use qemu_vm::Accel;
use sandbox_core::naming::sbx::NamePrefix;
use sandbox_core::{Isolation, SandboxError};

/// CPUs per VM unless configured (as the other backends).
pub const DEFAULT_CPUS: u32 = 2;

/// Memory per VM in MiB unless configured (as the other backends).
pub const DEFAULT_MEMORY_MIB: u32 = 2048;

/// VMs that may boot at once unless configured: a burst of acquires cannot take the host's
/// memory or its CPUs all at the same moment.
pub const DEFAULT_MAX_BOOTING: usize = 2;

/// The most ready VMs the warm pool may keep: each is a running VM holding its memory.
pub const MAX_POOL: usize = 16;

/// The name prefix of every VM of this backend.
pub const DEFAULT_NAME_PREFIX: &str = "qemu";

/// How the backend runs VMs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct QemuConfig {
    /// The VM image (`cargo xtask images vm`, `sandboxctl images build vm`).
    pub image_dir: PathBuf,
    /// Where each VM's directory and record live; found again from any process.
    pub state_dir: PathBuf,
    /// Accept QEMU's emulator (TCG) when KVM cannot boot here. Emulation is not a security
    /// boundary QEMU stands behind, so the backend then declares rung `container`.
    pub allow_emulation: bool,
    /// CPUs per VM, clamped to the host's.
    pub cpus: u32,
    /// Memory per VM in MiB, clamped to the host's.
    pub memory_mib: u32,
    /// VMs booting at once, at least 1.
    pub max_booting: usize,
    /// From QEMU's start to the agent's answer. A new VM's first exec (its storage base made)
    /// then has a quarter of this bound, at most 30 s, to start; a VM that misses it is
    /// replaced once.
    pub boot_timeout: Duration,
    /// The deadline of one file call (stat, read, write, list, remove) and of an agent connect.
    pub call_timeout: Duration,
    /// The first part of every VM's name (`[a-z0-9]{1,16}`).
    pub name_prefix: String,
    /// Each VM's agent ports, 1 to [`qemu_vm::MAX_AGENT_PORTS`]: how many host processes can
    /// use one VM at once (a process holds one port while it has handles to the VM; the next
    /// process waits for a port up to 15 s, then its acquire is `Busy`). Fixed when the VM
    /// boots.
    pub agent_ports: u32,
    /// Extra words for every VM's kernel command line (debugging, the agent's test modes);
    /// each one word of printable ASCII.
    pub kernel_args: Vec<String>,
    /// The warm pool: how many VMs restored from the baseline wait, ready, for fresh acquires
    /// and resets, which take one instead of restoring their own; refilled in the background
    /// after each. 0 (the default) = no pool. At most [`MAX_POOL`]. Shared by every process
    /// on the state directory with the same image and limits.
    pub pool: usize,
    /// Allowlist egress (offered always: its proxy runs in the serving process).
    pub egress: QemuEgress,
}

/// How allowlist egress reaches the network from the host (docs/qemu-backend.md#allowlist-egress).
/// Every address of the host's own interfaces, loopback and the special-purpose ranges are
/// never dialled, whatever a sandbox's allowlist says.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct QemuEgress {
    /// Also dial private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7).
    pub allow_private: bool,
    /// The destination ports allowed; empty: 80 and 443.
    pub ports: Vec<u16>,
    /// A PEM bundle of further roots to verify upstreams against, for hosts whose TLS the proxy
    /// terminates (beside the public roots).
    pub upstream_ca_pem: Option<String>,
    /// Names resolved to these addresses instead of by the host's resolver (as a hosts file;
    /// the addresses are still checked as any resolved address).
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Told of every egress decision of this backend's sandboxes.
    pub observer: Option<sandbox_core::credential::EgressObserver>,
}

impl Default for QemuConfig {
    fn default() -> Self {
        QemuConfig {
            image_dir: PathBuf::new(),
            state_dir: default_state_dir(),
            allow_emulation: false,
            cpus: DEFAULT_CPUS,
            memory_mib: DEFAULT_MEMORY_MIB,
            max_booting: DEFAULT_MAX_BOOTING,
            boot_timeout: Duration::from_secs(120),
            call_timeout: Duration::from_secs(300),
            name_prefix: DEFAULT_NAME_PREFIX.to_owned(),
            agent_ports: qemu_vm::DEFAULT_AGENT_PORTS,
            kernel_args: Vec::new(),
            pool: 0,
            egress: QemuEgress::default(),
        }
    }
}

/// `$XDG_STATE_HOME/sandboxes/qemu`, else `~/.local/state/sandboxes/qemu`, else the temporary
/// directory's `sandboxes-qemu`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(dir).join("sandboxes/qemu");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/sandboxes/qemu"),
        None => std::env::temp_dir().join("sandboxes-qemu"),
    }
}

/// A configuration that passed its checks, with the limits clamped to the host.
#[derive(Debug, Clone)]
pub(crate) struct CheckedConfig {
    pub(crate) image_dir: PathBuf,
    pub(crate) state_dir: PathBuf,
    pub(crate) allow_emulation: bool,
    pub(crate) cpus: u32,
    pub(crate) memory_mib: u32,
    pub(crate) max_booting: usize,
    pub(crate) boot_timeout: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) prefix: NamePrefix,
    pub(crate) agent_ports: u32,
    pub(crate) kernel_args: Vec<String>,
    pub(crate) pool: usize,
    pub(crate) egress: QemuEgress,
}

impl QemuConfig {
    /// The host directories a backend built from this configuration keeps state in or loads from
    /// (each VM's directory and record under the state directory; the kernel, initramfs and root
    /// image QEMU loads from the image directory), without connecting: what
    /// [`SandboxBackend::host_state_roots`](sandbox_core::SandboxBackend::host_state_roots) of that
    /// backend reports, for a host that guards them while it runs another backend. A host that
    /// wrote a sandbox's bytes there would hand one key another key's VM, or the next VM's boot.
    pub fn host_state_roots(&self) -> Vec<PathBuf> {
        [&self.state_dir, &self.image_dir]
            .into_iter()
            .filter(|dir| !dir.as_os_str().is_empty())
            .cloned()
            .collect()
    }

    /// Checks the configuration against a host of `host_cpus` CPUs and `host_memory_mib` MiB.
    pub(crate) fn check_for(
        self,
        host_cpus: u32,
        host_memory_mib: u32,
    ) -> Result<CheckedConfig, SandboxError> {
        if self.image_dir.as_os_str().is_empty() {
            return Err(SandboxError::invalid(
                "no VM image directory: build one with `cargo xtask images vm` or \
                 `sandboxctl images build vm` and set image_dir",
            ));
        }
        if !self.state_dir.is_absolute() {
            return Err(SandboxError::invalid(format!(
                "the state directory {} must be absolute",
                self.state_dir.display()
            )));
        }
        if self.cpus == 0 || self.memory_mib < 128 {
            return Err(SandboxError::invalid(format!(
                "a VM needs at least 1 CPU and 128 MiB (got {} and {} MiB)",
                self.cpus, self.memory_mib
            )));
        }
        if self.boot_timeout.is_zero() || self.call_timeout.is_zero() {
            return Err(SandboxError::invalid("timeouts must be above zero"));
        }
        if self.egress.ports.contains(&0) {
            return Err(SandboxError::invalid(
                "egress.ports names port 0, which is no destination port",
            ));
        }
        if !(1..=qemu_vm::MAX_AGENT_PORTS).contains(&self.agent_ports) {
            return Err(SandboxError::invalid(format!(
                "agent_ports is {}: a VM has 1 to {} agent ports",
                self.agent_ports,
                qemu_vm::MAX_AGENT_PORTS
            )));
        }
        if let Some(word) = self
            .kernel_args
            .iter()
            .find(|word| word.is_empty() || !word.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(SandboxError::invalid(format!(
                "kernel argument {word:?}: each must be one word of printable ASCII"
            )));
        }
        if self.pool > MAX_POOL {
            return Err(SandboxError::invalid(format!(
                "pool must be at most {MAX_POOL}, not {}",
                self.pool
            )));
        }
        Ok(CheckedConfig {
            image_dir: self.image_dir,
            state_dir: self.state_dir,
            allow_emulation: self.allow_emulation,
            cpus: self.cpus.min(host_cpus.max(1)),
            memory_mib: self.memory_mib.min(host_memory_mib.max(128)),
            max_booting: self.max_booting.max(1),
            boot_timeout: self.boot_timeout,
            call_timeout: self.call_timeout,
            prefix: NamePrefix::new(self.name_prefix)?,
            agent_ports: self.agent_ports,
            kernel_args: self.kernel_args,
            pool: self.pool,
            egress: self.egress,
        })
    }
}

/// The host's CPUs.
pub(crate) fn host_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// The host's memory in MiB (`MemTotal`), or a large number when it cannot be read (the
/// configured value then stands).
pub(crate) fn host_memory_mib() -> u32 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total_mib(&text))
        .unwrap_or(u32::MAX)
}

fn parse_mem_total_mib(meminfo: &str) -> Option<u32> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    u32::try_from(kib / 1024).ok()
}

/// The rung the accelerator earns: `microvm` under KVM; under TCG, refused unless emulation is
/// allowed, and then `container`, never `microvm`.
pub(crate) fn isolation_for(
    accel: Accel,
    reason: &str,
    allow_emulation: bool,
) -> Result<Isolation, SandboxError> {
    match accel {
        Accel::Kvm => Ok(Isolation::Microvm),
        _ if allow_emulation => Ok(Isolation::Container),
        _ => Err(SandboxError::NotPermitted(format!(
            "QEMU can only emulate on this host ({reason}); emulation (TCG) is not a security \
             boundary: set allow_emulation (sandboxctl --allow-emulation) to accept it at the \
             container rung"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    fn config() -> QemuConfig {
        QemuConfig {
            image_dir: PathBuf::from("/images/vm"),
            state_dir: PathBuf::from("/state"),
            ..QemuConfig::default()
        }
    }

    #[test]
    fn the_host_state_roots_are_the_state_and_image_directories() {
        assert_eq!(
            config().host_state_roots(),
            [PathBuf::from("/state"), PathBuf::from("/images/vm")]
        );
        // No image configured yet: only the state directory is named (an empty path would
        // resolve to the working directory and guard it by accident).
        let unset = QemuConfig {
            state_dir: PathBuf::from("/state"),
            ..QemuConfig::default()
        };
        assert_eq!(unset.host_state_roots(), [PathBuf::from("/state")]);
    }

    #[test]
    fn limits_default_to_two_cpus_and_two_gib_clamped_to_the_host() {
        let checked = config().check_for(8, 32_768).unwrap();
        assert_eq!((checked.cpus, checked.memory_mib), (2, 2048));
        let small = config().check_for(1, 1024).unwrap();
        assert_eq!((small.cpus, small.memory_mib), (1, 1024));
        assert_eq!(small.max_booting, DEFAULT_MAX_BOOTING);
        assert_eq!(small.agent_ports, qemu_vm::DEFAULT_AGENT_PORTS);
    }

    #[test]
    fn bad_configurations_are_refused_with_their_fix() {
        let no_image = QemuConfig {
            image_dir: PathBuf::new(),
            ..config()
        };
        let refused = no_image.check_for(2, 4096).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
        assert!(refused.to_string().contains("images vm"), "{refused}");
        let relative = QemuConfig {
            state_dir: PathBuf::from("state"),
            ..config()
        };
        assert!(relative.check_for(2, 4096).is_err());
        let prefix = QemuConfig {
            name_prefix: "Not Valid".into(),
            ..config()
        };
        assert!(prefix.check_for(2, 4096).is_err());
        let tiny = QemuConfig {
            memory_mib: 64,
            ..config()
        };
        assert!(tiny.check_for(2, 4096).is_err());
        for ports in [0, qemu_vm::MAX_AGENT_PORTS + 1] {
            let refused = QemuConfig {
                agent_ports: ports,
                ..config()
            }
            .check_for(2, 4096)
            .unwrap_err();
            assert!(refused.to_string().contains("agent ports"), "{refused}");
        }
        let pool = QemuConfig {
            pool: MAX_POOL + 1,
            ..config()
        };
        let refused = pool.check_for(2, 4096).unwrap_err();
        assert!(
            refused.to_string().contains("pool must be at most"),
            "{refused}"
        );
        let pool = QemuConfig {
            pool: MAX_POOL,
            ..config()
        };
        assert_eq!(pool.check_for(2, 4096).unwrap().pool, MAX_POOL);
        let most = QemuConfig {
            agent_ports: qemu_vm::MAX_AGENT_PORTS,
            ..config()
        };
        assert_eq!(
            most.check_for(2, 4096).unwrap().agent_ports,
            qemu_vm::MAX_AGENT_PORTS
        );
    }

    #[test]
    fn mem_total_is_read_in_mib() {
        let meminfo = "MemTotal:       24582412 kB\nMemFree:         1234 kB\n";
        assert_eq!(parse_mem_total_mib(meminfo), Some(24006));
        assert_eq!(parse_mem_total_mib("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn kvm_is_a_microvm_and_emulation_a_container_only_when_allowed() {
        assert_eq!(
            isolation_for(Accel::Kvm, "kvm boots", false).unwrap(),
            Isolation::Microvm
        );
        assert_eq!(
            isolation_for(Accel::Tcg, "no vmx", true).unwrap(),
            Isolation::Container
        );
        let refused = isolation_for(Accel::Tcg, "no vmx", false).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::NotPermitted);
        assert!(
            refused.to_string().contains("--allow-emulation"),
            "{refused}"
        );
        assert!(refused.to_string().contains("no vmx"), "{refused}");
    }
}
