//! Backend selection and construction, shared by every host binary of the workspace
//! (`sandboxctl`, `sandbox-mcp`): the flags that choose and configure a backend, the one place that
//! names concrete backends, the isolation gate a router applies to them, and the local images
//! (the default engine image, and the microVM image of `qemu-vm`). A host sees only
//! `Arc<dyn SandboxBackend>` and a [`Router`], so a new backend joins here without changing any
//! command or tool.
//!
//! What it does not do: run commands, pick keys or talk to a user. Those are each host's own.
//!
//! Threat model: the engine client inherits this process's environment minus the names a host
//! means for a guest ([`management_env`]), so a value given to a guest never also sits in an
//! engine client's environment.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

/// The guarded opener of host files, for hosts that reach it through this crate.
pub use host_files;

pub mod egress_flags;
mod health;
mod logging;
mod mcp_state;
#[cfg(target_os = "linux")]
pub mod vm_image;

pub use health::health;
pub use logging::log_to_stderr_from_env;
pub use mcp_state::default_mcp_state_dir;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backend_docker::{DockerBackend, DockerConfig, ImageOutcome, ImageRecipe, LocalImage};
use backend_sbx::{SbxBackend, SbxConfig};
use bounded_process::{BoundedCommand, ExitKind};
use clap::{Args, ValueEnum};
use sandbox_core::{Isolation, Router, RouterConfig, SandboxBackend, SandboxError};

/// The flags that choose and configure a backend. Every flag is `global`, so a host with
/// subcommands accepts them before or after the subcommand's name.
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// The backend.
    #[arg(long, global = true, value_enum, default_value_t = BackendChoice::Docker)]
    pub backend: BackendChoice,
    /// The lowest isolation rung accepted for commands that run code or move files. The docker backend
    /// is rung `container` (`hardened_container` under a verified gVisor `--docker-runtime`), so it
    /// needs `--min-isolation container` (or `hardened_container`).
    #[arg(long, global = true, value_name = "RUNG", default_value = "microvm", value_parser = parse_rung)]
    pub min_isolation: Isolation,
    /// The `sbx` program of `--backend sbx`.
    #[arg(long, global = true, value_name = "PATH", default_value = "sbx")]
    pub sbx_path: PathBuf,
    /// Accept `sbx-sim`, the Docker-backed stand-in for `sbx`, with `--backend sbx` (it is rung
    /// `container`, never `microvm`).
    #[arg(long, global = true)]
    pub allow_simulator: bool,
    /// The image of the docker backend's egress proxy, which allowlist egress needs (build it with
    /// `sandboxctl images build`).
    #[arg(long, global = true, value_name = "IMAGE", default_value = backend_docker::defaults::DEFAULT_EGRESS_PROXY_IMAGE)]
    pub egress_proxy_image: String,
    /// A PEM bundle of further roots the egress proxies (docker's containers, qemu's in-process
    /// policy) verify terminated upstreams against, beside the public roots (an operator's own
    /// CA; at most 1 MiB). Docker's proxies get it over their standard input.
    #[arg(long, global = true, value_name = "PEM")]
    pub egress_upstream_ca: Option<PathBuf>,
    /// The docker network the egress proxy's outbound leg joins.
    #[arg(long, global = true, value_name = "NETWORK", default_value = backend_docker::defaults::DEFAULT_OUTBOUND_NETWORK)]
    pub outbound_network: String,
    /// The OCI runtime the docker backend runs sandboxes under, by the engine's name for it (e.g.
    /// `runsc`, gVisor registered in the engine's daemon.json). Rung `hardened_container` only
    /// when a probe container under it shows gVisor's kernel; any other runtime stays
    /// `container`. Default: the engine's own (runc).
    #[arg(long, global = true, value_name = "RUNTIME")]
    pub docker_runtime: Option<String>,
    /// The VM image of `--backend qemu` (default: the one `images build vm` makes in the cache).
    #[arg(long, global = true, value_name = "DIR")]
    pub vm_image: Option<PathBuf>,
    /// Accept QEMU's emulator (TCG) with `--backend qemu` where KVM cannot boot (it is rung
    /// `container`, never `microvm`).
    #[arg(long, global = true)]
    pub allow_emulation: bool,
}

/// The warm pool flag of a server-like host (`sandbox-mcp`): a one-shot host such as `sandboxctl`
/// ends before a pool could refill, so it takes none.
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// Keep N ready sandboxes so a fresh one is claimed instead of made: docker, N containers per
    /// shape (image, storage base, limits; egress closed) this host has acquired
    /// (docs/docker-backend.md#warm-pool); qemu, N VMs restored from the baseline
    /// (docs/qemu-backend.md#warm-pool, at most 16). Members outlive the host;
    /// `sandboxctl pool-purge` removes them. 0 = no pool. Not sbx.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub pool: usize,
}

fn parse_rung(s: &str) -> Result<Isolation, String> {
    s.parse::<Isolation>().map_err(|e| e.to_string())
}

/// The backends a host can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// Docker containers (rung `container`; `hardened_container` under gVisor).
    Docker,
    /// Docker Sandboxes microVMs through `sbx` (rung `microvm`).
    Sbx,
    /// A QEMU microVM per sandbox from the local VM image (rung `microvm` under KVM; Linux).
    Qemu,
}

/// The docker backend's configuration from the flags. `guest_names` as for [`connect`].
pub fn docker_config(args: &BackendArgs, guest_names: &[String]) -> DockerConfig {
    let mut config = DockerConfig::default();
    config.management_env = Some(management_env(std::env::vars_os(), guest_names));
    config.egress_proxy_image = Some(args.egress_proxy_image.clone());
    config.outbound_network = args.outbound_network.clone();
    config.runtime = args.docker_runtime.clone();
    config
}

/// The most of an `--egress-upstream-ca` bundle read.
pub const MAX_UPSTREAM_CA_BYTES: u64 = 1024 * 1024;

/// The `--egress-upstream-ca` bundle's text, read once (a regular file of at most
/// [`MAX_UPSTREAM_CA_BYTES`]); `None` without the flag.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] naming the file when it cannot be read, is not UTF-8 or holds
/// no PEM certificate.
pub fn upstream_ca(args: &BackendArgs) -> Result<Option<String>, SandboxError> {
    let Some(path) = &args.egress_upstream_ca else {
        return Ok(None);
    };
    let refuse = |why: &str| {
        SandboxError::invalid(format!("--egress-upstream-ca {}: {why}", path.display()))
    };
    let bytes =
        host_files::read_regular_capped(path, MAX_UPSTREAM_CA_BYTES).map_err(|why| refuse(&why))?;
    let text = String::from_utf8(bytes).map_err(|_| refuse("not UTF-8 text"))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(refuse("holds no PEM certificate"));
    }
    Ok(Some(text))
}

/// The sbx backend's configuration from the flags. `guest_names` as for [`connect`].
pub fn sbx_config(args: &BackendArgs, guest_names: &[String]) -> SbxConfig {
    let mut config = SbxConfig::default();
    config.sbx_path = args.sbx_path.clone();
    config.simulator_ok = args.allow_simulator;
    config.management_env = Some(management_env(std::env::vars_os(), guest_names));
    config
}

/// A router over `backend` that refuses it below `--min-isolation`. The refusal names the flag
/// that would accept the backend, so an operator is told what to change.
///
/// # Errors
/// [`SandboxError::NotPermitted`] below the floor; what [`Router::new`] refuses otherwise.
pub fn gated_router(
    args: &BackendArgs,
    backend: Arc<dyn SandboxBackend>,
) -> Result<Router, SandboxError> {
    let config = RouterConfig::default().min_isolation(args.min_isolation);
    let isolation = backend.isolation();
    let name = backend.name().to_owned();
    Router::new(vec![backend], config).map_err(|e| match e {
        SandboxError::NotPermitted(msg) if args.min_isolation > isolation => {
            SandboxError::NotPermitted(format!(
                "{msg}; the {name} backend is rung {isolation}: pass --min-isolation {isolation} to accept it"
            ))
        }
        other => other,
    })
}

/// Connects the chosen backend. `guest_names` are the `--env` names whose values are meant for the guest.
///
/// # Errors
/// What the backend's own connect refuses (engine unreachable, `sbx` missing or a simulator not
/// accepted).
///
/// # Cancel safety and drop
/// Dropping the future abandons the connect; nothing is created before it returns.
pub async fn connect(
    args: &BackendArgs,
    guest_names: &[String],
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    connect_observed(args, guest_names, None).await
}

/// [`connect`], with `observer` told of every egress decision of the docker and qemu backends'
/// allowlist sandboxes (sbx reports none).
///
/// # Errors
/// As [`connect`]; an `--egress-upstream-ca` that cannot be read or holds no PEM certificate.
pub async fn connect_observed(
    args: &BackendArgs,
    guest_names: &[String],
    observer: Option<sandbox_core::credential::EgressObserver>,
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    match args.backend {
        BackendChoice::Docker => {
            let mut config = docker_config(args, guest_names);
            config.egress_upstream_ca_pem = upstream_ca(args)?;
            config.egress_observer = observer;
            Ok(Arc::new(DockerBackend::connect(config).await?))
        }
        BackendChoice::Sbx => Ok(Arc::new(connect_sbx(args, guest_names).await?)),
        BackendChoice::Qemu => connect_qemu(args, 0, observer).await,
    }
}

/// [`connect`] for a server-like host with a warm pool of `pool` members per shape (docker,
/// qemu), and `observer` told of every egress decision (docker, qemu).
///
/// # Errors
/// As [`connect`]; [`SandboxError::InvalidArgument`] for a pool with the sbx backend.
///
/// # Cancel safety and drop
/// As [`connect`]. The backend's refill runs in a task that ends with the backend.
pub async fn connect_serving(
    args: &BackendArgs,
    guest_names: &[String],
    pool: &PoolArgs,
    observer: Option<sandbox_core::credential::EgressObserver>,
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    match args.backend {
        BackendChoice::Docker => {
            let mut config = docker_config(args, guest_names);
            config.egress_upstream_ca_pem = upstream_ca(args)?;
            config.egress_observer = observer;
            config.pool = pool.pool;
            Ok(Arc::new(DockerBackend::connect(config).await?))
        }
        BackendChoice::Qemu => connect_qemu(args, pool.pool, observer).await,
        BackendChoice::Sbx if pool.pool > 0 => Err(SandboxError::invalid(
            "--pool keeps docker containers or qemu VMs: it needs --backend docker or qemu",
        )),
        BackendChoice::Sbx => connect_observed(args, guest_names, observer).await,
    }
}

/// Removes every warm pool member of the backend the flags name (`sandboxctl pool-purge`):
/// docker's of the engine, ready, being filled or mid-claim, of every shape; qemu's of the state
/// directory, ready or left by a refill that died. A sandbox claimed from the pool is its key's
/// and stays.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] for the sbx backend; what connect refuses.
pub async fn purge_pool(args: &BackendArgs) -> Result<sandbox_core::ScopePurge, SandboxError> {
    match args.backend {
        BackendChoice::Docker => {
            let backend = DockerBackend::connect(docker_config(args, &[])).await?;
            Ok(backend.purge_pool().await)
        }
        BackendChoice::Qemu => purge_qemu_pool(args).await,
        BackendChoice::Sbx => Err(SandboxError::invalid(
            "the sbx backend keeps no warm pool: use --backend docker or qemu",
        )),
    }
}

/// The qemu backend's configuration from the flags: the image, emulation, and for allowlist
/// egress the operator's upstream CA bundle.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] when no cache directory can be named for the default image,
/// or for an `--egress-upstream-ca` that cannot be read or holds no PEM certificate.
#[cfg(target_os = "linux")]
pub fn qemu_config(args: &BackendArgs) -> Result<backend_qemu::QemuConfig, SandboxError> {
    let mut config = backend_qemu::QemuConfig::default();
    config.image_dir = match &args.vm_image {
        Some(dir) => dir.clone(),
        None => vm_image::default_dir()?,
    };
    config.allow_emulation = args.allow_emulation;
    config.egress.upstream_ca_pem = upstream_ca(args)?;
    Ok(config)
}

#[cfg(target_os = "linux")]
async fn connect_qemu(
    args: &BackendArgs,
    pool: usize,
    observer: Option<sandbox_core::credential::EgressObserver>,
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    let mut config = qemu_config(args)?;
    config.pool = pool;
    config.egress.observer = observer;
    Ok(Arc::new(backend_qemu::QemuBackend::connect(config).await?))
}

#[cfg(not(target_os = "linux"))]
async fn connect_qemu(
    _args: &BackendArgs,
    _pool: usize,
    _observer: Option<sandbox_core::credential::EgressObserver>,
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    Err(qemu_is_linux_only())
}

#[cfg(target_os = "linux")]
async fn purge_qemu_pool(args: &BackendArgs) -> Result<sandbox_core::ScopePurge, SandboxError> {
    let backend = backend_qemu::QemuBackend::connect(qemu_config(args)?).await?;
    Ok(backend.purge_pool().await)
}

#[cfg(not(target_os = "linux"))]
async fn purge_qemu_pool(_args: &BackendArgs) -> Result<sandbox_core::ScopePurge, SandboxError> {
    Err(qemu_is_linux_only())
}

#[cfg(not(target_os = "linux"))]
#[cold]
fn qemu_is_linux_only() -> SandboxError {
    SandboxError::invalid("the qemu backend runs on Linux hosts only")
}

/// The sbx backend itself (not behind the trait), for a host that also asks for its health checks.
///
/// # Errors
/// As [`connect`].
///
/// # Cancel safety and drop
/// As [`connect`].
pub async fn connect_sbx(
    args: &BackendArgs,
    guest_names: &[String],
) -> Result<SbxBackend, SandboxError> {
    SbxBackend::connect(sbx_config(args, guest_names)).await
}

/// Where a host that writes sandboxes' bytes to host files (`sandboxctl cp-out`) may write: flatten
/// it into the host's flags, give [`OutDirArg::output_root`] to [`host_guard`] and
/// [`OutDirArg::existing`] to `host_files::copy_out`.
#[derive(Debug, Clone, Default, Args)]
pub struct OutDirArg {
    /// Write only below DIR (default: the current directory), an existing directory with no hidden
    /// name on its path that holds no system start-up directory (not `/`, `/etc`, `/usr`).
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Replace a regular file already at the destination (without it, an existing file is kept
    /// and the copy refused).
    #[arg(long)]
    pub overwrite: bool,
}

impl OutDirArg {
    /// The output root: `--out-dir`, else the current directory.
    ///
    /// # Errors
    /// Io when there is no `--out-dir` and the current directory cannot be named.
    pub fn output_root(&self) -> Result<PathBuf, SandboxError> {
        match &self.out_dir {
            Some(dir) => Ok(dir.clone()),
            None => std::env::current_dir().map_err(|source| SandboxError::Io {
                operation: "find the current directory",
                path: ".".into(),
                source,
            }),
        }
    }

    /// Whether an existing destination file is replaced or kept.
    pub fn existing(&self) -> host_files::ExistingFile {
        if self.overwrite {
            host_files::ExistingFile::Replace
        } else {
            host_files::ExistingFile::Keep
        }
    }
}

/// The one guard of every host file a host reads for a sandbox or writes with its bytes
/// ([`host_files`]: `cp-in`, `cp-out`, an env file, an MCP tool's transfer): the credential paths
/// and the paths a host executes, the host state roots the connected `backend` reports, those of
/// the sbx and qemu configurations these flags would give (whichever backend runs, one key never
/// reaches another key's sbx workspace or VM through the host), the MCP server's default state
/// directory ([`default_mcp_state_dir`]), and `output_root`, without which the guard admits no
/// write (`cp-in` and env files pass none).
///
/// # Errors
/// The backend's failure to report its roots (then nothing is moved), an `output_root` that is
/// not an existing directory (InvalidArgument), or one unfit to write below (NotPermitted).
///
/// # Cancel safety and drop
/// Dropping the future drops the backend's request in flight; nothing is changed.
pub async fn host_guard(
    args: &BackendArgs,
    backend: &dyn SandboxBackend,
    output_root: Option<&std::path::Path>,
) -> Result<host_files::HostPathGuard, SandboxError> {
    let mut roots: Vec<PathBuf> = backend
        .host_state_roots()
        .await?
        .into_iter()
        .map(PathBuf::from)
        .collect();
    // An sbx configuration this environment cannot form has no workspace root to guard.
    roots.extend(sbx_config(args, &[]).host_state_roots().unwrap_or_default());
    // Likewise the qemu backend's state and image directories: writing there would reach another
    // key's VM, or what the next VM boots.
    #[cfg(target_os = "linux")]
    roots.extend(
        qemu_config(args)
            .map(|config| config.host_state_roots())
            .unwrap_or_default(),
    );
    // And the MCP server's default state directory: its locks are its own, not a sandbox's to
    // write over.
    roots.push(default_mcp_state_dir());
    host_files::host_guard(roots, output_root)
}

/// The engine client's environment: this process's own, minus the variables a host gives a guest. Their values
/// go to the guest through the backend's env file; left here they would also sit in every docker client's
/// environment. Names the client itself needs to reach its daemon stay, or it could not connect: a
/// guest may be given `PATH` or `HOME` too.
pub fn management_env(
    own: impl IntoIterator<Item = (OsString, OsString)>,
    guest_names: &[String],
) -> Vec<(OsString, OsString)> {
    let client_needs = |name: &str| {
        matches!(name, "PATH" | "HOME" | "LOCALAPPDATA")
            || name.starts_with("XDG_")
            || name.starts_with("DOCKER_")
    };
    own.into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            client_needs(&name) || !guest_names.iter().any(|g| *g == name)
        })
        .collect()
}

fn sbx_has_no_images() -> SandboxError {
    SandboxError::invalid(
        "the local images are the docker backend's; sbx sandboxes start from sbx templates",
    )
}

fn recipe() -> ImageRecipe {
    ImageRecipe::new().progress(|line| eprintln!("images: {line}"))
}

/// The default image's reference, built locally first when it is missing (no registry needed);
/// `None` for sbx, whose default is its own `shell` template. `guest_names` as for [`connect`]:
/// the presence check runs with the same client environment, and when there are any the build runs
/// in a child of the current executable (`<exe> images build TAG`), whose environment lacks them.
///
/// # Errors
/// [`SandboxError::ImageMissing`] when the image is absent and building it failed.
///
/// # Cancel safety and drop
/// Dropping the future abandons the build; a child build is killed with its runner.
pub async fn ensure_default_image(
    choice: BackendChoice,
    guest_names: &[String],
) -> Result<Option<String>, SandboxError> {
    match choice {
        BackendChoice::Docker => {
            let image = LocalImage::DEFAULT;
            // The command's stderr is relayed byte for byte: say nothing unless a build is needed.
            if image_present(image.tag(), guest_names).await {
                return Ok(Some(image.tag().to_owned()));
            }
            if guest_names.is_empty() {
                recipe()
                    .build(&[image])
                    .await
                    .map_err(|e| SandboxError::ImageMissing {
                        image: image.tag().into(),
                        hint: format!("building it locally failed: {e}"),
                    })?;
            } else {
                build_in_a_child(image, guest_names).await?;
            }
            Ok(Some(image.tag().to_owned()))
        }
        BackendChoice::Sbx | BackendChoice::Qemu => Ok(None),
    }
}

/// Builds `image` in a child `sandboxctl images build` whose environment lacks the `--env` values:
/// the recipe's own tools inherit their process's environment, and a guest value must never sit in
/// a host process's environment other than the guest's own.
async fn build_in_a_child(image: LocalImage, guest_names: &[String]) -> Result<(), SandboxError> {
    let failed = |why: String| SandboxError::ImageMissing {
        image: image.tag().into(),
        hint: format!("building it locally failed: {why}"),
    };
    let me = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
    let build = BoundedCommand::new(me, Duration::from_secs(30 * 60))
        .args(["images", "build", image.tag()])
        .envs(management_env(std::env::vars_os(), guest_names))
        .output_budget(1 << 20)
        .on_line(|_, line| {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line);
        })
        .run()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if build.status == ExitKind::Exited(0) {
        Ok(())
    } else {
        Err(failed(format!(
            "`sandboxctl images build` ended with {:?}",
            build.status
        )))
    }
}

/// Whether `tag` is in the engine's image store, asked through the image recipe (the backend's one
/// way to ask) with the management env of [`connect`], so no `--env` value reaches the engine client.
/// An engine that cannot answer counts as "absent": the build that follows says why.
async fn image_present(tag: &str, guest_names: &[String]) -> bool {
    matches!(
        ImageRecipe::new()
            .management_env(management_env(std::env::vars_os(), guest_names))
            .image_id(tag)
            .await,
        Ok(Some(_))
    )
}

/// The name [`build_images`] takes for the microVM image (docs/vm.md#image).
pub const VM_IMAGE: &str = "vm";

#[cfg(target_os = "linux")]
async fn build_vm_image() -> Result<(String, &'static str), SandboxError> {
    Ok((format!("{VM_IMAGE} {}", vm_image::build().await?), "built"))
}

#[cfg(not(target_os = "linux"))]
async fn build_vm_image() -> Result<(String, &'static str), SandboxError> {
    Err(SandboxError::invalid(
        "the microVM image is built on Linux hosts only",
    ))
}

/// Builds the named local images (default: the default image); returns (tag, outcome) per image.
/// [`VM_IMAGE`] names the microVM image, built whatever the backend.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] for an engine image with sbx or an unknown tag, an engine
/// error when a build fails.
///
/// # Cancel safety and drop
/// Dropping the future abandons the build.
pub async fn build_images(
    choice: BackendChoice,
    tags: &[String],
) -> Result<Vec<(String, &'static str)>, SandboxError> {
    let mut built = Vec::new();
    let engine_tags: Vec<&String> = tags.iter().filter(|t| *t != VM_IMAGE).collect();
    // The qemu backend's one image is the VM image.
    if engine_tags.len() < tags.len() || (choice == BackendChoice::Qemu && tags.is_empty()) {
        built.push(build_vm_image().await?);
        if engine_tags.is_empty() {
            return Ok(built);
        }
    }
    match choice {
        BackendChoice::Sbx => return Err(sbx_has_no_images()),
        BackendChoice::Qemu => {
            return Err(SandboxError::invalid(
                "the qemu backend runs the VM image only (`images build vm`)",
            ))
        }
        BackendChoice::Docker => {}
    }
    let images = if engine_tags.is_empty() {
        vec![LocalImage::DEFAULT]
    } else {
        engine_tags
            .iter()
            .map(|t| LocalImage::from_tag(t).map_err(|e| SandboxError::invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?
    };
    let reports = recipe()
        .build(&images)
        .await
        .map_err(|e| SandboxError::engine(format!("image build failed: {e}")))?;
    built.extend(reports.into_iter().map(|r| {
        let outcome = match r.outcome {
            ImageOutcome::AlreadyPresent => "already present",
            _ => "built",
        };
        (r.image.tag().to_owned(), outcome)
    }));
    Ok(built)
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Host {
        #[command(flatten)]
        args: BackendArgs,
    }

    fn parse(words: &[&str]) -> BackendArgs {
        <Host as clap::Parser>::parse_from(std::iter::once("host").chain(words.iter().copied()))
            .args
    }

    #[test]
    fn defaults_are_docker_at_the_microvm_floor() {
        let args = parse(&[]);
        assert_eq!(args.backend, BackendChoice::Docker);
        assert_eq!(args.min_isolation, Isolation::Microvm);
        assert_eq!(args.sbx_path, PathBuf::from("sbx"));
        assert!(!args.allow_simulator);
        assert_eq!(args.outbound_network, "bridge");
        assert_eq!(args.docker_runtime, None);
        assert_eq!(docker_config(&args, &[]).runtime, None);
    }

    #[tokio::test]
    async fn the_sbx_backend_takes_no_pool_and_has_none_to_purge() {
        let args = parse(&["--backend", "sbx"]);
        let Err(refused) = connect_serving(&args, &[], &PoolArgs { pool: 2 }, None).await else {
            panic!("a pool with the sbx backend is refused");
        };
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidArgument);
        assert!(
            refused.to_string().contains("--backend docker or qemu"),
            "{refused}"
        );
        let refused = purge_pool(&args).await.unwrap_err();
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidArgument);
    }

    #[test]
    fn the_docker_runtime_flag_reaches_the_docker_configuration() {
        let args = parse(&["--docker-runtime", "runsc"]);
        assert_eq!(docker_config(&args, &[]).runtime.as_deref(), Some("runsc"));
    }

    #[test]
    fn a_hardened_container_floor_takes_gvisor_and_refuses_runc_and_a_microvm_floor() {
        use sandbox_core::testing::FakeBackend;
        let floor = parse(&["--min-isolation", "hardened_container"]);
        let gvisor: Arc<dyn SandboxBackend> =
            Arc::new(FakeBackend::new("docker", Isolation::HardenedContainer));
        assert!(gated_router(&floor, gvisor.clone()).is_ok());
        let refused = gated_router(&parse(&[]), gvisor).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("pass --min-isolation hardened_container"),
            "{refused}"
        );
        let runc: Arc<dyn SandboxBackend> =
            Arc::new(FakeBackend::new("docker", Isolation::Container));
        assert_eq!(
            gated_router(&floor, runc).unwrap_err().kind(),
            sandbox_core::ErrorKind::NotPermitted
        );
    }

    #[test]
    fn the_floor_refusal_names_the_flag_that_accepts_the_backend() {
        use sandbox_core::testing::FakeBackend;
        let backend: Arc<dyn SandboxBackend> =
            Arc::new(FakeBackend::new("fake", Isolation::Container));
        let refused = gated_router(&parse(&[]), backend.clone()).unwrap_err();
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::NotPermitted);
        assert!(
            refused
                .to_string()
                .contains("pass --min-isolation container to accept it"),
            "{refused}"
        );
        assert!(gated_router(&parse(&["--min-isolation", "container"]), backend).is_ok());
    }

    #[test]
    fn guest_values_stay_out_of_the_client_environment() {
        let own = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
            ("PROBE_VALUE", "guest only"),
            ("OTHER", "kept"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let guest = ["PROBE_VALUE", "PATH", "HOME"].map(String::from);
        let names: Vec<String> = management_env(own, &guest)
            .into_iter()
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["PATH", "HOME", "DOCKER_HOST", "OTHER"]);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_host_guard_refuses_the_qemu_image_whichever_backend_runs() {
        use sandbox_core::testing::FakeBackend;
        let image = tempfile::tempdir().unwrap();
        let kernel = image.path().join("vmlinux");
        std::fs::write(&kernel, b"kernel").unwrap();
        let outside = tempfile::tempdir().unwrap();
        let plain = outside.path().join("plain");
        std::fs::write(&plain, b"plain").unwrap();
        let args = parse(&["--vm-image", image.path().to_str().unwrap()]);
        let backend = FakeBackend::new("fake", Isolation::Container);
        let guard = host_guard(&args, &backend, None).await.unwrap();
        let refused = host_files::Source::open(&kernel, &guard, false).unwrap_err();
        assert_eq!(
            refused.kind(),
            sandbox_core::ErrorKind::NotPermitted,
            "{refused}"
        );
        host_files::Source::open(&plain, &guard, false).unwrap();
    }

    #[tokio::test]
    async fn the_host_guard_refuses_the_mcp_servers_state_directory() {
        use sandbox_core::host_paths::HostRefusal;
        use sandbox_core::testing::FakeBackend;
        let state = default_mcp_state_dir();
        let lock = state.join("0123.lock");
        let parent = state.parent().unwrap().display().to_string();
        let backend = FakeBackend::new("fake", Isolation::Container);
        // The pure guard with the state directory's parent as the output root: a `cp-out` there
        // is admitted by every other rule, so only the state root can refuse it.
        let guard = host_guard(&parse(&[]), &backend, None)
            .await
            .unwrap()
            .with_output_root(parent);
        for path in [&state, &lock] {
            let path = path.display().to_string();
            assert!(
                matches!(
                    guard.write_refusal(&path, true),
                    Some(HostRefusal::SandboxState(_))
                ),
                "{path}: {:?}",
                guard.write_refusal(&path, true)
            );
            assert!(guard.read_refusal(&path, true).is_some(), "{path}");
        }
    }

    #[test]
    fn the_upstream_bundle_is_read_once_and_must_hold_a_certificate() {
        assert_eq!(upstream_ca(&parse(&[])).unwrap(), None);
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ca.pem");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&good, pem).unwrap();
        let args = parse(&["--egress-upstream-ca", good.to_str().unwrap()]);
        assert_eq!(upstream_ca(&args).unwrap().as_deref(), Some(pem));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here").unwrap();
        let missing = dir.path().join("missing.pem");
        let large = dir.path().join("large.pem");
        std::fs::write(&large, vec![b'x'; MAX_UPSTREAM_CA_BYTES as usize + 1]).unwrap();
        let binary = dir.path().join("binary.pem");
        std::fs::write(&binary, b"\xff-----BEGIN CERTIFICATE-----").unwrap();
        for (path, needle) in [
            (&empty, "no PEM certificate"),
            (&missing, "missing.pem"),
            (&large, "over the limit"),
            (&binary, "UTF-8"),
        ] {
            let args = parse(&["--egress-upstream-ca", path.to_str().unwrap()]);
            let error = upstream_ca(&args).unwrap_err();
            assert_eq!(error.kind(), sandbox_core::ErrorKind::InvalidArgument);
            assert!(error.to_string().contains(needle), "{error}");
        }
    }
}
