//! The backend's configuration and its validation.

use std::ffi::OsString;
use std::net::IpAddr;
use std::time::Duration;

use sandbox_core::SandboxError;

/// The image used when a spec names neither `image_id` nor `image`.
pub const DEFAULT_IMAGE: &str = "sandbox-base:local";

/// Deadline of every engine call but `exec` (and the explicit pull).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Deadline of the kill call after an expired exec.
pub const DEFAULT_EXEC_CLEANUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Deadline of the explicit `docker pull` of an absent image.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// The egress proxy image the local image recipe builds (not configured by default).
pub const DEFAULT_EGRESS_PROXY_IMAGE: &str = crate::images::EGRESS_PROXY_IMAGE;

/// The network a proxy's outbound leg joins unless configured otherwise.
pub const DEFAULT_OUTBOUND_NETWORK: &str = "bridge";

/// The pids limit every container gets unless configured otherwise.
pub const DEFAULT_PIDS_LIMIT: u32 = 512;

/// CPUs per sandbox unless configured otherwise (clamped to the engine host's count).
pub const DEFAULT_CPUS: f64 = 2.0;

/// Memory per sandbox unless configured otherwise, 2 GiB (clamped to the engine host's memory).
pub const DEFAULT_MEMORY_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// The largest warm pool per shape.
pub const MAX_POOL: usize = 64;

/// The smallest memory limit the engine accepts (6 MiB).
const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;

/// The per-sandbox limits actually applied, after clamping to the engine host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resources {
    /// `HostConfig.NanoCpus`.
    pub(crate) nano_cpus: i64,
    /// `HostConfig.Memory` (and `MemorySwap`, so the guest cannot swap past it), in bytes.
    pub(crate) memory_bytes: i64,
}

impl Resources {
    /// The configured limits, clamped to what the engine host has (`NCPU`, `MemTotal`); an
    /// unknown host size (0) leaves the configured value.
    pub(crate) fn clamped(config: &DockerConfig, host_cpus: i64, host_memory: i64) -> Resources {
        let mut cpus = config.cpus;
        if host_cpus > 0 {
            cpus = cpus.min(host_cpus as f64);
        }
        let mut memory = config.memory_bytes;
        if let Ok(host) = u64::try_from(host_memory) {
            if host > 0 {
                memory = memory.min(host);
            }
        }
        Resources {
            nano_cpus: (cpus * 1e9).round() as i64,
            memory_bytes: i64::try_from(memory.max(MIN_MEMORY_BYTES)).unwrap_or(i64::MAX),
        }
    }
}

/// Where the egress preflight (docs/docker-backend.md#egress) knocks, from inside a closed sandbox.
///
/// The defaults are public addresses for operators; every test sets local ones.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EgressProbe {
    /// A URL naming its host by IP literal (default `https://1.1.1.1/`).
    pub by_address: String,
    /// A URL naming its host by DNS name (default `https://example.com/`).
    pub by_name: String,
    /// The address the host-side token server binds to; `None` = the default bridge's gateway
    /// (`docker network inspect bridge`). Never a wildcard address.
    pub token_server: Option<IpAddr>,
}

impl Default for EgressProbe {
    fn default() -> Self {
        EgressProbe {
            by_address: "https://1.1.1.1/".to_owned(),
            by_name: "https://example.com/".to_owned(),
            token_server: None,
        }
    }
}

impl EgressProbe {
    /// Probe targets chosen by the caller (tests pass local ones).
    pub fn new(
        by_address: impl Into<String>,
        by_name: impl Into<String>,
        token_server: Option<IpAddr>,
    ) -> Self {
        EgressProbe {
            by_address: by_address.into(),
            by_name: by_name.into(),
            token_server,
        }
    }
}

/// How [`DockerBackend`](crate::DockerBackend) reaches and configures the engine.
///
/// Start from [`DockerConfig::default`] and set fields; [`DockerBackend::connect`](crate::DockerBackend::connect)
/// validates it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DockerConfig {
    /// The context to pin, as `docker --context` would; `None` = resolved once at connect from
    /// `DOCKER_HOST`, `DOCKER_CONTEXT`, the client configuration's current context, or the
    /// default socket (see [`Endpoint::resolve`](crate::Endpoint::resolve)).
    pub context: Option<String>,
    /// The image for specs that name none.
    pub default_image: String,
    /// Deadline of every engine call but `exec`.
    pub command_timeout: Duration,
    /// Deadline of the kill call after an expired exec.
    pub exec_cleanup_timeout: Duration,
    /// Deadline of the explicit pull of an absent image.
    pub pull_timeout: Duration,
    /// The pids limit of every container.
    pub pids_limit: u32,
    /// Memory limit of every container, in bytes (swap included: the guest cannot swap past
    /// it); clamped to the engine host's memory. A guest over it is killed by the kernel and the
    /// exec reports that kill as an error naming the limit.
    pub memory_bytes: u64,
    /// CPUs of every container (fractions allowed); clamped to the engine host's CPU count.
    pub cpus: f64,
    /// Run the egress preflight on every created sandbox (needs `curl` in the image).
    pub verify_egress: bool,
    /// The preflight's targets.
    pub egress_probe: EgressProbe,
    /// The environment the endpoint is resolved from (`DOCKER_HOST`, `DOCKER_CONTEXT`,
    /// `DOCKER_CONFIG`, `HOME`, the TLS variables); `None` = a snapshot of this process's
    /// environment taken at connect. Never read again afterwards.
    pub management_env: Option<Vec<(OsString, OsString)>>,
    /// The egress proxy's image (docs/docker-backend.md#allowlist-egress); `None` or `""` = egress
    /// `allowlist` is not offered, only `closed`.
    pub egress_proxy_image: Option<String>,
    /// The network each egress proxy's outbound leg joins (default `bridge`). Its gateways are
    /// refused as destinations.
    pub outbound_network: String,
    /// A PEM bundle of further roots every egress proxy verifies terminated upstreams against,
    /// beside the public roots (an operator's own CA); given to each proxy over its standard
    /// input. `None` or `""` = the public roots only.
    pub egress_upstream_ca_pem: Option<String>,
    /// Told of every egress decision of this backend's allowlist sandboxes (read from their
    /// proxies' logs after each command); `None` = nobody is told.
    pub egress_observer: Option<sandbox_core::credential::EgressObserver>,
    /// Let proxies dial private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7);
    /// for offline tests on a network of their own, never for operators.
    pub allow_private_destinations: bool,
    /// The OCI runtime every sandbox container runs under (`HostConfig.Runtime`, as
    /// `docker run --runtime`), by the name the engine registered it under; `None` = the
    /// engine's default (runc). Connect refuses a name the engine does not list, and runs one
    /// probe container under it: only a runtime the probe shows to be gVisor lifts the backend
    /// to rung `hardened_container` (docs/docker-backend.md#gvisor); any other stays `container`,
    /// whatever its name.
    pub runtime: Option<String>,
    /// The warm pool's size (docs/docker-backend.md#warm-pool): how many ready containers this
    /// backend keeps for each shape (image, storage base, hardening, runtime; egress closed) a
    /// fresh acquire asked for, so the next fresh acquire of that shape claims one instead of
    /// creating it. 0 (the default) = no pool. At most [`MAX_POOL`].
    pub pool: usize,
    /// **Unsafe; the live tests' seam only** (present with the `live` feature, hidden from the
    /// docs, and set by no `sandboxctl` flag): the engine network every workload is created on
    /// instead of `none`, and the one its ownership check then expects. It exists so the live
    /// tests can hand the egress preflight a sandbox that really is open and see it refused
    /// (docs/docker-backend.md#egress). `None` (the default) keeps network `none`. Only a
    /// bridge-like network name is accepted: never `host` or another container's namespace.
    #[cfg(feature = "live")]
    #[doc(hidden)]
    pub unsafe_open_network: Option<String>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            context: None,
            default_image: DEFAULT_IMAGE.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            exec_cleanup_timeout: DEFAULT_EXEC_CLEANUP_TIMEOUT,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            pids_limit: DEFAULT_PIDS_LIMIT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            cpus: DEFAULT_CPUS,
            verify_egress: false,
            egress_probe: EgressProbe::default(),
            management_env: None,
            egress_proxy_image: None,
            egress_upstream_ca_pem: None,
            egress_observer: None,
            outbound_network: DEFAULT_OUTBOUND_NETWORK.to_owned(),
            allow_private_destinations: false,
            runtime: None,
            pool: 0,
            #[cfg(feature = "live")]
            unsafe_open_network: None,
        }
    }
}

impl DockerConfig {
    /// Refuses what would make a docker argument ambiguous or a bound meaningless.
    pub(crate) fn validate(&self) -> Result<(), SandboxError> {
        for (name, value) in [
            ("command_timeout", self.command_timeout),
            ("exec_cleanup_timeout", self.exec_cleanup_timeout),
            ("pull_timeout", self.pull_timeout),
        ] {
            if value.is_zero() {
                return Err(SandboxError::invalid(format!(
                    "{name} must be greater than zero"
                )));
            }
        }
        if self.pids_limit == 0 {
            return Err(SandboxError::invalid("pids_limit must be at least 1"));
        }
        if self.pool > MAX_POOL {
            return Err(SandboxError::invalid(format!(
                "pool must be at most {MAX_POOL}, not {}",
                self.pool
            )));
        }
        if let Some(context) = &self.context {
            check_cli_word("context", context)?;
        }
        check_image_reference(&self.default_image)?;
        if let Some(image) = self.proxy_image() {
            check_image_reference(image)?;
        }
        check_cli_word("outbound_network", &self.outbound_network)?;
        if let Some(runtime) = &self.runtime {
            check_cli_word("runtime", runtime)?;
        }
        if !(self.cpus.is_finite() && self.cpus >= 0.01) {
            return Err(SandboxError::invalid(format!(
                "cpus must be at least 0.01, not {}",
                self.cpus
            )));
        }
        if self.memory_bytes < MIN_MEMORY_BYTES {
            return Err(SandboxError::invalid(format!(
                "memory_bytes must be at least {MIN_MEMORY_BYTES} (6 MiB), not {}",
                self.memory_bytes
            )));
        }
        #[cfg(feature = "live")]
        if let Some(network) = &self.unsafe_open_network {
            check_cli_word("unsafe_open_network", network)?;
            if matches!(network.as_str(), "none" | "host" | "default")
                || network.starts_with("container:")
            {
                return Err(SandboxError::invalid(format!(
                    "unsafe_open_network must name a bridge network, not {network:?}"
                )));
            }
        }
        Ok(())
    }

    /// The egress proxy's image when allowlist egress is offered (`""` counts as none).
    pub(crate) fn proxy_image(&self) -> Option<&str> {
        self.egress_proxy_image
            .as_deref()
            .filter(|image| !image.is_empty())
    }

    /// The network every workload is created on and its ownership check expects: `none`, unless
    /// the live tests' unsafe seam names another.
    pub(crate) fn workload_network(&self) -> &str {
        #[cfg(feature = "live")]
        if let Some(network) = &self.unsafe_open_network {
            return network;
        }
        "none"
    }

    /// A short fingerprint of the hardening this configuration applies, part of the warm cache's
    /// policy.
    pub(crate) fn hardening_fingerprint(&self, resources: Resources) -> String {
        format!(
            "pids={};memory={};nanocpus={};runtime={}",
            self.pids_limit,
            resources.memory_bytes,
            resources.nano_cpus,
            self.runtime.as_deref().unwrap_or("")
        )
    }
}

/// A name the engine takes as one word: non-empty, no NUL, no whitespace, no leading `-`.
fn check_cli_word(name: &str, value: &str) -> Result<(), SandboxError> {
    if value.is_empty()
        || value.starts_with('-')
        || value.chars().any(|c| c == '\0' || c.is_whitespace())
    {
        return Err(SandboxError::invalid(format!(
            "{name} {value:?} must be one non-empty word not starting with '-'"
        )));
    }
    Ok(())
}

/// An image reference as docker takes it: one word, never an option.
pub(crate) fn check_image_reference(image: &str) -> Result<(), SandboxError> {
    check_cli_word("image reference", image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn defaults_are_the_spec_numbers_and_valid() {
        let config = DockerConfig::default();
        assert_eq!(config.command_timeout, Duration::from_secs(60));
        assert_eq!(config.exec_cleanup_timeout, Duration::from_secs(15));
        assert_eq!(config.pids_limit, 512);
        assert_eq!(config.default_image, "sandbox-base:local");
        assert!(!config.verify_egress);
        assert_eq!(config.outbound_network, "bridge");
        assert!(!config.allow_private_destinations);
        assert_eq!(config.proxy_image(), None);
        assert_eq!(config.workload_network(), "none");
        config.validate().unwrap();
        let empty = DockerConfig {
            egress_proxy_image: Some(String::new()),
            ..DockerConfig::default()
        };
        assert_eq!(empty.proxy_image(), None);
        empty.validate().unwrap();
    }

    #[test]
    fn refuses_meaningless_values() {
        type Change = Box<dyn Fn(&mut DockerConfig)>;
        let cases: Vec<Change> = vec![
            Box::new(|c| c.command_timeout = Duration::ZERO),
            Box::new(|c| c.exec_cleanup_timeout = Duration::ZERO),
            Box::new(|c| c.pids_limit = 0),
            Box::new(|c| c.default_image = "--privileged".into()),
            Box::new(|c| c.default_image = String::new()),
            Box::new(|c| c.memory_bytes = 1024),
            Box::new(|c| c.cpus = -1.0),
            Box::new(|c| c.cpus = f64::NAN),
            Box::new(|c| c.context = Some(String::new())),
            Box::new(|c| c.egress_proxy_image = Some("-x".into())),
            Box::new(|c| c.outbound_network = String::new()),
            Box::new(|c| c.outbound_network = "a b".into()),
            Box::new(|c| c.runtime = Some(String::new())),
            Box::new(|c| c.runtime = Some("--runtime".into())),
            #[cfg(feature = "live")]
            Box::new(|c| c.unsafe_open_network = Some("host".into())),
            #[cfg(feature = "live")]
            Box::new(|c| c.unsafe_open_network = Some("container:abc".into())),
            #[cfg(feature = "live")]
            Box::new(|c| c.unsafe_open_network = Some("--network".into())),
        ];
        for change in cases {
            let mut config = DockerConfig::default();
            change(&mut config);
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
        }
    }

    #[test]
    fn resources_default_to_two_cpus_and_two_gib_clamped_to_the_host() {
        let config = DockerConfig::default();
        let big_host = Resources::clamped(&config, 64, 256 << 30);
        assert_eq!(big_host.nano_cpus, 2_000_000_000);
        assert_eq!(big_host.memory_bytes, 2 << 30);
        let small_host = Resources::clamped(&config, 1, 1 << 30);
        assert_eq!(small_host.nano_cpus, 1_000_000_000);
        assert_eq!(small_host.memory_bytes, 1 << 30);
        let unknown_host = Resources::clamped(&config, 0, 0);
        assert_eq!(unknown_host, big_host);
        let fingerprint = config.hardening_fingerprint(big_host);
        assert_ne!(fingerprint, config.hardening_fingerprint(small_host));
        assert!(fingerprint.contains("memory=2147483648"), "{fingerprint}");
        let under_runsc = DockerConfig {
            runtime: Some("runsc".into()),
            ..DockerConfig::default()
        };
        under_runsc.validate().unwrap();
        assert_ne!(fingerprint, under_runsc.hardening_fingerprint(big_host));
    }
}
