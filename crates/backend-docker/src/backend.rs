//! [`DockerBackend`]: construction, declarations and the trait surface.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{
    BackendDeclarations, Capability, DisposalFailure, DisposeSelector, Egress, HealthCheck,
    Isolation, IsolationScope, OsFamily, Sandbox, SandboxBackend, SandboxError, SandboxKey,
    SandboxLimits, SandboxSpec, SandboxSummary, ScopePurge, TransferLimits,
};

use crate::acquire::Acquirer;
use crate::archive::Archive;
use crate::claims::ClaimRecords;
use crate::config::DockerConfig;
use crate::connection::EngineConnection;
use crate::containers::Containers;
use crate::disposal::Disposal;
use crate::egress::EgressCompanions;
use crate::endpoint::Endpoint;
use crate::exec::Execs;
use crate::fork_copy::ForkCopy;
use crate::guest_calls::GuestCalls;
use crate::handle::HandleParts;
use crate::memory::Memories;
use crate::pool::{MakeMember, Pool};
use crate::retirement::Retirement;
use crate::runtime_probe::RuntimeVerification;
use crate::sizing::Sizing;
use crate::storage_base::StorageBase;
use crate::BACKEND_NAME;

const MIB: u64 = 1024 * 1024;

/// The transfer ceiling of each direction: 64 MiB per file, 256 MiB in all, 256 files.
pub const TRANSFER_CEILING: TransferLimits = TransferLimits {
    max_bytes_per_file: 64 * MIB,
    max_total_bytes: 256 * MIB,
    max_files: 256,
};

/// The container backend: one hardened container per (key, kind), driven through the Docker
/// Engine API on one endpoint pinned at connect.
///
/// Cheap to clone: clones share the connection, the per-name locks, the warm cache and the set
/// of retired instances.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    declarations: Arc<BackendDeclarations>,
    sizing: Arc<Sizing>,
    acquirer: Arc<Acquirer>,
    disposal: Arc<Disposal>,
    /// The warm pool (empty and idle unless [`DockerConfig::pool`] is set).
    pool: Arc<Pool>,
    /// `hardened_container` only when a probe showed the configured runtime to be gVisor.
    isolation: Isolation,
    /// What connect found out about the configured runtime; `None` without one.
    runtime: Option<Arc<RuntimeVerification>>,
}

impl DockerBackend {
    /// Validates `config`, resolves the endpoint once from the management environment and pins
    /// it, and negotiates the API version with one request, whose answer also gives the engine's
    /// OS (`linux` declares os_families {posix}; anything else declares none and logs a
    /// warning). The engine host's size, to which the per-sandbox CPU and memory limits are
    /// clamped, is asked when a sandbox is first acquired.
    ///
    /// With [`DockerConfig::runtime`], the engine must list that runtime, and one probe container
    /// under it (the default image, which must then be present) tells what it is: rung
    /// `hardened_container` when it shows gVisor's kernel, else `container`. Under gVisor,
    /// allowlist egress is not offered (docs/docker-backend.md#gvisor).
    ///
    /// # Errors
    /// InvalidArgument for a bad configuration or a runtime the engine does not list;
    /// BackendUnavailable naming the endpoint when it cannot be resolved or does not answer (not
    /// cached: a later `connect` tries again); what the engine answers when the runtime's probe
    /// cannot run.
    ///
    /// # Cancel safety
    /// Dropping the future drops the request in flight; a runtime probe already made is removed
    /// in a task the drop cannot cancel.
    pub async fn connect(config: DockerConfig) -> Result<DockerBackend, SandboxError> {
        config.validate()?;
        let env = config
            .management_env
            .clone()
            .unwrap_or_else(|| std::env::vars_os().collect());
        let endpoint = Endpoint::resolve(&env, config.context.as_deref())?;
        let (engine, os) = EngineConnection::open(endpoint, config.command_timeout).await?;
        let os_families = match os.as_deref() {
            Some("linux") => BTreeSet::from([OsFamily::Posix]),
            other => {
                tracing::warn!(
                    endpoint = %engine.endpoint(),
                    os = ?other,
                    "the engine does not report linux; declaring no OS family"
                );
                BTreeSet::new()
            }
        };
        let config = Arc::new(config);
        let runtime = match config.runtime.as_deref() {
            Some(runtime) => Some(Arc::new(
                crate::runtime_probe::verify(&engine, &config, runtime).await?,
            )),
            None => None,
        };
        let gvisor = runtime.as_ref().is_some_and(|r| r.gvisor);
        if let Some(runtime) = runtime.as_ref().filter(|r| !r.gvisor) {
            tracing::warn!(
                runtime = %runtime.runtime,
                kernel = ?runtime.kernel_release,
                "the configured runtime did not show gVisor's kernel; the backend stays rung container"
            );
        }
        if let Some(runtime) = runtime.as_ref().filter(|r| !r.subreaper) {
            tracing::warn!(
                runtime = %runtime.runtime,
                "the runtime's kernel makes no subreaper: a timeout kills the command's process group only"
            );
        }
        let subreaper = runtime.as_ref().is_none_or(|r| r.subreaper);
        let mut capabilities = Capability::exec_and_files();
        capabilities.insert(Capability::Snapshot);
        // A streamed exec with stdin is all a run with host tools needs of the backend; the
        // program is the image's (the Debian images carry it, a run in another image is
        // refused as unsupported when it starts).
        capabilities.insert(Capability::HostTools);
        // Exact kills need the call's init to be its subreaper; without one (gVisor) a timeout
        // kills the command's process group only, and the backend says so.
        if subreaper {
            capabilities.insert(Capability::ExactKill);
        }
        // Where allowlist egress is offered its proxy terminates TLS for hosts with rules or
        // grants and judges each request's method and normalised path.
        let allowlist = config.proxy_image().is_some() && !gvisor;
        if allowlist {
            capabilities.insert(Capability::EgressMethods);
            capabilities.insert(Capability::EgressPaths);
        }
        let declarations = BackendDeclarations {
            capabilities,
            limits: SandboxLimits {
                files_in: TRANSFER_CEILING,
                files_out: TRANSFER_CEILING,
            },
            // Under gVisor the workload could not connect to the proxy's socket on the shared
            // volume without runsc's host-socket flag: allowlist egress is not offered there.
            egress_modes: if allowlist {
                BTreeSet::from([Egress::Closed, Egress::Allowlist])
            } else {
                BTreeSet::from([Egress::Closed])
            },
            os_families,
            isolation_scopes: BTreeSet::from([IsolationScope::Conversation, IsolationScope::Call]),
            // No finite list: the proxy enforces any method spelled in upper-case letters, and
            // the egress plan (`letters_only`) refuses the contract's other tokens before any
            // engine call, with the router's kind (`CapabilityNotSupported`). The default, the
            // empty list, refused every rule that named a method.
            egress_method_tokens: None,
        };
        tracing::debug!(
            endpoint = %engine.endpoint(),
            api_version = %engine.api_version(),
            "engine endpoint pinned"
        );
        let isolation = if gvisor {
            Isolation::HardenedContainer
        } else {
            Isolation::Container
        };
        let mut backend = DockerBackend::assemble(config, engine, declarations, subreaper);
        backend.isolation = isolation;
        backend.runtime = runtime;
        Ok(backend)
    }

    /// Builds the components over one pinned connection, each holding what it uses; rung
    /// `container`, no runtime verified. Without a `subreaper` (the runtime's kernel cannot make
    /// one), every call gets the group shape.
    fn assemble(
        config: Arc<DockerConfig>,
        engine: EngineConnection,
        declarations: BackendDeclarations,
        subreaper: bool,
    ) -> DockerBackend {
        let memory = Arc::new(Memories::default());
        if !subreaper {
            memory.probes.runtime_lacks_subreaper();
        }
        let sizing = Arc::new(Sizing::new(engine.clone(), Arc::clone(&config)));
        let claims = Arc::new(ClaimRecords::new(
            engine.clone(),
            Arc::clone(&config),
            Arc::clone(&memory),
        ));
        let containers = Arc::new(Containers::new(
            engine.clone(),
            Arc::clone(&config),
            Arc::clone(&memory),
            Arc::clone(&claims),
        ));
        let pool = Pool::new(
            engine.clone(),
            Arc::clone(&config),
            Arc::clone(&containers),
            Arc::clone(&claims),
        );
        let archive = Arc::new(Archive::new(
            engine.clone(),
            Arc::clone(&config),
            Arc::clone(&containers),
        ));
        let execs = Arc::new(Execs::new(engine.clone(), Arc::clone(&containers)));
        let retirement = Arc::new(Retirement::new(
            Arc::clone(&containers),
            Arc::clone(&memory),
        ));
        let fork_copy = ForkCopy::new(engine.clone(), Arc::clone(&config), Arc::clone(&execs));
        let guest = Arc::new(GuestCalls::new(
            engine.clone(),
            Arc::clone(&config),
            execs,
            Arc::clone(&containers),
            Arc::clone(&retirement),
            Arc::clone(&sizing),
            Arc::clone(&memory),
        ));
        let egress = Arc::new(EgressCompanions::new(
            engine.clone(),
            Arc::clone(&config),
            Arc::clone(&containers),
            Arc::clone(&sizing),
            Arc::clone(&memory),
        ));
        let disposal = Arc::new(Disposal::new(
            Arc::clone(&containers),
            claims,
            Arc::clone(&egress),
            Arc::clone(&memory),
        ));
        let handle_parts = HandleParts {
            archive: Arc::clone(&archive),
            guest: Arc::clone(&guest),
            memory: Arc::clone(&memory),
            command_timeout: config.command_timeout,
        };
        let acquirer = Arc::new_cyclic(|me| Acquirer {
            engine: engine.clone(),
            config: Arc::clone(&config),
            declarations: declarations.clone(),
            name_locks: Arc::default(),
            sizing: Arc::clone(&sizing),
            containers,
            guest,
            storage_base: StorageBase::new(archive, Arc::clone(&config)),
            egress,
            retirement,
            memory,
            handle_parts,
            me: me.clone(),
            fork_copy,
            pool: Arc::clone(&pool),
        });
        let maker: std::sync::Weak<dyn MakeMember> = Arc::downgrade(&acquirer) as _;
        pool.set_maker(maker);
        DockerBackend {
            engine,
            config,
            declarations: Arc::new(declarations),
            sizing,
            acquirer,
            disposal,
            pool,
            isolation: Isolation::Container,
            runtime: None,
        }
    }

    /// What this host needs for the backend, checked in order, each a [`HealthCheck`]:
    /// `docker.context` (the endpoint resolves as the CLI would), `docker.engine` (it answers the
    /// version negotiation), `docker.engine_os` (linux), `kernel.init` (the engine names an init
    /// binary, for `--init`), `kernel.pids_cgroup` (this host has the pids controller, for
    /// `--pids-limit`), `docker.image` (`config.default_image` is present), and, for `allowlist`
    /// egress, `docker.egress_proxy_image` and `docker.outbound_network` (one
    /// `docker.egress_proxy` not-applicable line when no proxy image is configured), and
    /// `docker.runtime` (the configured runtime, its platform, the kernel a probe container under
    /// it saw and the rung that gives; not applicable without one). Checks after a failed
    /// endpoint or engine are not run. Changes nothing but the runtime probe, a container made
    /// and removed.
    ///
    /// # Cancel safety
    /// Dropping the future drops the engine request in flight; nothing is created.
    pub async fn health_checks(config: &DockerConfig) -> Vec<HealthCheck> {
        crate::health::checks(config).await
    }

    /// The pinned endpoint's context name: the named context, or `default` when the endpoint
    /// came from `DOCKER_HOST` or the default socket.
    pub fn context(&self) -> &str {
        match &self.engine.endpoint().source {
            crate::EndpointSource::Context(name) => name,
            _ => "default",
        }
    }

    /// The pinned endpoint's address (`unix://…`, `tcp://…`, `ssh://…`).
    pub fn endpoint(&self) -> &str {
        &self.engine.endpoint().host
    }

    /// The pinned endpoint: address, what chose it, TLS material.
    pub fn pinned_endpoint(&self) -> &Endpoint {
        self.engine.endpoint()
    }

    /// The API version negotiated with the engine (`1.41` for an Engine 20.10).
    pub fn api_version(&self) -> String {
        self.engine.api_version()
    }

    /// The CPUs and memory (bytes) every new sandbox gets, after clamping to the engine host
    /// (asked of the engine once, the first time it is needed).
    ///
    /// # Cancel safety
    /// Dropping the future drops the engine request; a later call asks again.
    pub async fn sandbox_resources(&self) -> (f64, u64) {
        let r = self.sizing.resources().await;
        (r.nano_cpus as f64 / 1e9, r.memory_bytes as u64)
    }

    /// What connect found out about [`DockerConfig::runtime`] (the engine's path for it, its
    /// platform, the kernel its probe saw, whether that was gVisor); `None` without a runtime.
    pub fn runtime_verification(&self) -> Option<&RuntimeVerification> {
        self.runtime.as_deref()
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The ready warm pool members on the engine, of every shape and any process, by container
    /// id (docs/docker-backend.md#warm-pool). Claimed members are their keys' sandboxes, not
    /// listed here.
    ///
    /// # Errors
    /// What the engine's listing answers.
    pub async fn pool_members(&self) -> Result<Vec<String>, SandboxError> {
        self.pool.ready_members().await
    }

    /// Keeps the warm pool of `spec`'s shape filled from now on, and waits until it holds
    /// [`DockerConfig::pool`] ready members (a host that wants its first acquire warm; the
    /// benches). Nothing when no pool is configured or `spec` is not pooled (allowlist egress).
    ///
    /// # Errors
    /// InvalidArgument for a spec acquire would refuse; an engine error when the pool is not
    /// full within `deadline` (the refill's own failures are logged).
    pub async fn fill_pool(
        &self,
        spec: &SandboxSpec,
        deadline: std::time::Duration,
    ) -> Result<(), SandboxError> {
        if let Some(shape) = self.acquirer.pool_shape_of(spec).await? {
            self.pool.want(&shape);
            self.pool.wait_full(deadline).await?;
        }
        Ok(())
    }

    /// Removes every warm pool member on the engine, ready, being filled or mid-claim, of every
    /// shape and any process (the pool's scope, [`POOL_SCOPE`](sandbox_core::naming::docker::POOL_SCOPE),
    /// as `dispose_scope` removes a conversation); a claimed member is its key's and is never
    /// touched. A backend with a pool fills it again on its next fresh acquire. Never raises.
    pub async fn purge_pool(&self) -> ScopePurge {
        self.disposal
            .dispose_selection(&crate::ownership_labels::ContainerSelector {
                scope: sandbox_core::naming::docker::POOL_SCOPE.to_owned(),
                ..Default::default()
            })
            .await
    }

    /// The container name of (key, kind) (egress closed).
    pub fn container_name(key: &SandboxKey, kind: &str) -> String {
        sandbox_core::naming::docker::docker_container_name(key, kind, "")
    }
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    /// `hardened_container` when connect's probe showed the configured runtime to be gVisor,
    /// else `container`: a Docker Desktop or Colima VM does not lift the rung, since one VM
    /// kernel serves every container, and a runtime's name proves nothing.
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
        let handle = self.acquirer.acquire_sandbox(key, spec).await?;
        Ok(handle)
    }

    async fn find(
        &self,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<dyn Sandbox>>, SandboxError> {
        Ok(self
            .acquirer
            .find_sandbox(key, kind)
            .await?
            .map(|handle| handle as Arc<dyn Sandbox>))
    }

    async fn dispose(
        &self,
        key: &SandboxKey,
        selector: DisposeSelector,
    ) -> Option<DisposalFailure> {
        self.disposal.dispose_key(key, &selector).await
    }

    async fn dispose_scope(&self, scope: &str, thread_id: &str) -> ScopePurge {
        self.disposal.dispose_conversation(scope, thread_id).await
    }

    async fn list(
        &self,
        scope: &str,
        thread_id: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        self.disposal.list_sandboxes(scope, thread_id).await
    }

    /// The engine's data root (containers' file systems and volumes) when the engine runs on this
    /// host (a Unix socket endpoint); none for a remote engine, whose state is not on this host.
    async fn host_state_roots(&self) -> Result<Vec<String>, SandboxError> {
        if !self.endpoint().starts_with("unix://") {
            return Ok(Vec::new());
        }
        let engine = &self.engine;
        let info = engine
            .call(self.config.command_timeout, engine.api().info())
            .await
            .map_err(|f| engine.failure("engine info", f))?;
        Ok(info
            .docker_root_dir
            .filter(|root| root.starts_with('/'))
            .into_iter()
            .collect())
    }

    /// Copies the source container's files (what it changed against its image: added, changed
    /// and deleted paths, with their modes, owners and links) into a new container of the same
    /// spec under `target`. Processes are not copied: the fork runs only what its own acquire
    /// started. Egress `closed` only; an allowlist sandbox is refused as Unsupported.
    async fn fork(
        &self,
        source: &SandboxKey,
        spec: &SandboxSpec,
        target: &SandboxKey,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let handle = self.acquirer.fork_sandbox(source, spec, target).await?;
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[tokio::test]
    async fn an_absent_socket_is_backend_unavailable_naming_it() {
        let config = DockerConfig {
            management_env: Some(vec![(
                "DOCKER_HOST".into(),
                "unix:///nonexistent/docker.sock".into(),
            )]),
            ..DockerConfig::default()
        };
        let error = DockerBackend::connect(config).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BackendUnavailable);
        assert!(
            error
                .to_string()
                .contains("unix:///nonexistent/docker.sock"),
            "{error}"
        );
        assert!(error.to_string().contains("DOCKER_HOST"), "{error}");
    }

    #[tokio::test]
    async fn a_bad_config_is_refused_before_any_call() {
        let config = DockerConfig {
            management_env: Some(vec![(
                "DOCKER_HOST".into(),
                "unix:///nonexistent/docker.sock".into(),
            )]),
            pids_limit: 0,
            ..DockerConfig::default()
        };
        let error = DockerBackend::connect(config).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn ceilings_are_the_declared_numbers() {
        assert_eq!(TRANSFER_CEILING.max_bytes_per_file, 67_108_864);
        assert_eq!(TRANSFER_CEILING.max_total_bytes, 268_435_456);
        assert_eq!(TRANSFER_CEILING.max_files, 256);
    }
}
