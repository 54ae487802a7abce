//! The container sandbox backend: one hardened container per (key, kind), driven through the
//! Docker Engine API (`bollard`) on one endpoint pinned at connect, and the one recipe for the
//! local images every Docker-based suite and the default configuration run on.
//!
//! # What it does
//!
//! - [`DockerBackend::connect`] validates a [`DockerConfig`], resolves the endpoint once from a
//!   snapshot of the management environment the way the `docker` CLI would ([`Endpoint::resolve`]:
//!   `DOCKER_HOST` with its TLS variables, `DOCKER_CONTEXT`, the client configuration's current
//!   context, the default socket), negotiates the API version (an Engine 20.10 speaks 1.41) and
//!   pins the client. Every later call has a deadline; an unreachable engine is
//!   BackendUnavailable naming the pinned endpoint. No `docker` process is ever spawned.
//! - Containers are named and labelled by the core's digests (`maf-sandbox-docker-<12 hex>`,
//!   `maf-sandbox.*` labels), so ownership is read back from the engine and `list`, `find`,
//!   `dispose` and `dispose_scope` work from any process, Rust or Python.
//! - Every container gets `no-new-privileges`, every capability dropped, a pids limit, an init,
//!   network `none`, 2 CPUs and 2 GiB of memory (swap included) unless configured otherwise
//!   (clamped to the engine host); never a bind mount, a host path, a published port or the
//!   engine's socket. A command killed for the memory limit is reported as such (from the
//!   engine's `oom` events), never as a bare exit 137.
//! - With [`DockerConfig::runtime`], every workload runs under that OCI runtime; the backend is
//!   rung `hardened_container` only when, at connect, the engine lists the runtime and a probe
//!   container under it shows gVisor's kernel (never from the runtime's name), else `container`.
//!   Under gVisor allowlist egress is not offered (docs/docker-backend.md#gvisor).
//! - Commands run through the exec wrapper (nonce, process-group record) as an exec create and an
//!   attached start, stdout and stderr demultiplexed, the caller's output budget enforced while
//!   streaming, the exit code from the exec inspect. An expired or dropped command's group is
//!   killed by a second exec in a task the caller cannot cancel; the container is kept when that
//!   lands and retired (removed by id) when it does not. The guest environment travels only in the
//!   exec request's `Env`, never in any process's argv or environment.
//! - With [`DockerConfig::pool`], a warm pool keeps that many ready containers per shape (image,
//!   storage base, limits, runtime; egress closed) a fresh acquire asked for; the next fresh
//!   acquire of the shape claims one (a claim record per member, which exactly one caller of any
//!   process wins, then a rename to the key's name) instead of creating it, and the pool refills
//!   in the background. Members outlive the process; [`DockerBackend::purge_pool`] removes them
//!   (docs/docker-backend.md#warm-pool).
//! - [`ImageRecipe`] builds the local images ([`LocalImage`]) from packages this machine can
//!   install; `cargo xtask images` and `sandboxctl images build` both call it.
//!
//! # Files, method by method
//!
//! Every file method first checks its path with the core's bundle, walking each ancestor with an
//! **engine-side stat** (the archive `HEAD` and its path-stat header: unconfined, no-follow, never
//! answered by the guest), at most 8 at a time; a guest path over 4096 bytes or 255 components is
//! InvalidArgument before any engine call. A refused path moves no data.
//!
//! | method | check | act |
//! |---|---|---|
//! | `write_file` | write bundle + leaf stat | one archive `PUT` of a tar streamed as the body (headers, the bytes in slices, the end): the missing parents and the file, owned by the guest user |
//! | `read_file` | read bundle + leaf stat (kind, size cap) | one archive `GET`, its first header judged again before any data is kept, at most the cap held |
//! | `stat_file` | read bundle + leaf stat | nothing: the engine answers |
//! | `list_dir` | list bundle (the directory itself walked) | one-level listing script as the guest, links listed as links |
//! | `remove` | delete bundle + leaf stat | `rm -f`/`rm -rf` as the guest, then re-walk and re-stat |
//! | `reclaim` | name rules only | `rm -rf` as the guest within the caller's bound, then an engine stat |
//!
//! # What it does not do
//!
//! It does not pull from a registry except one explicit, bounded pull of an absent image (which
//! fails here: then [`SandboxError::ImageMissing`](sandbox_core::SandboxError) says how to build
//! the local images); it enforces egress `closed` only; it never stops a container. A timeout
//! kills every process in the call's tree under the engine's init (`docker-init -s`); in a
//! container without that init, only the command's process group, which a command that starts a
//! new session outlives (docs/wrapper-protocol.md). Processes a command leaves behind when it
//! finishes, or after killing its own init, keep running until disposal. Reads and writes act with the engine's authority
//! inside the container: a guest that swaps a checked component for a link between the check and
//! the transfer can redirect that transfer to another path of its own container (never outside
//! it), which a non-root guest could not reach itself.
//!
//! # Example
//!
//! ```no_run
//! use backend_docker::{DockerBackend, DockerConfig};
//! use sandbox_core::{Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
//!
//! # async fn run() -> Result<(), sandbox_core::SandboxError> {
//! let backend = DockerBackend::connect(DockerConfig::default()).await?;
//! let key = SandboxKey::conversation("prod", "thread-1", "agent");
//! let spec = SandboxSpec::builder("python").build()?;
//! let sandbox = backend.acquire(&key, &spec).await?;
//! sandbox.write_file("hello.txt", b"hi\n", ".").await?;
//! let output = sandbox
//!     .exec(ExecRequest::new(Command::argv(["cat", "hello.txt"])))
//!     .await?;
//! assert_eq!(output.stdout, b"hi\n");
//! assert!(backend.dispose_scope("prod", "thread-1").await.undisposed.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! Naming needs no engine:
//!
//! ```
//! use backend_docker::{DockerBackend, ImageRecipe, LocalImage};
//! use sandbox_core::SandboxKey;
//!
//! let key = SandboxKey::conversation("prod", "thread-1", "agent");
//! assert_eq!(
//!     DockerBackend::container_name(&key, "python"),
//!     "maf-sandbox-docker-aef172d1c789"
//! );
//!
//! let wanted: Vec<LocalImage> = ["sandbox-base:local", "sandbox-busybox:local"]
//!     .into_iter()
//!     .map(LocalImage::from_tag)
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(wanted, [LocalImage::Base, LocalImage::Busybox]);
//! assert_eq!(LocalImage::DEFAULT.tag(), "sandbox-base:local");
//!
//! let recipe = ImageRecipe::new()
//!     .cache_dir("target/images-cache")
//!     .progress(|line| eprintln!("{line}"));
//!
//! // Building needs root, debootstrap, busybox-static and a Docker engine:
//! async fn build(recipe: &ImageRecipe, wanted: &[LocalImage]) -> Result<(), backend_docker::DockerError> {
//!     for report in recipe.build(wanted).await? {
//!         println!("{}: {:?} in {:?}", report.image, report.outcome, report.elapsed);
//!     }
//!     Ok(())
//! }
//! # let _ = (build, recipe);
//! # Ok::<(), backend_docker::DockerError>(())
//! ```
//!
//! # Cancel safety
//!
//! Dropping any future of this crate drops the engine request it was waiting on. The cleanups
//! that protect a guarantee are never skipped: the remote kill after an expired or dropped exec,
//! the removal of a container an acquire created but could not finish (or whose create was
//! abandoned) run in tasks the caller's drop cannot cancel.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod acquire;
mod archive;
mod backend;
mod bounded;
mod claims;
mod config;
mod connection;
mod containers;
mod disposal;
mod egress;
mod egress_events;
mod egress_host;
mod egress_names;
mod egress_preflight;
mod egress_trust;
mod endpoint;
mod error;
mod exec;
mod fork_copy;
mod guest_calls;
mod guest_scripts;
mod handle;
mod health;
mod images;
mod memory;
mod ownership_labels;
mod pool;
mod pool_names;
mod retirement;
mod runtime_probe;
mod sizing;
mod storage_base;
mod tar_header;

pub use backend::DockerBackend;
pub use config::{DockerConfig, EgressProbe};
pub use endpoint::{Endpoint, EndpointSource, TlsFiles};
pub use error::DockerError;
pub use images::{
    mirror_from_apt_sources, ImageOutcome, ImageRecipe, ImageReport, LocalImage, ProgressSink,
};
pub use runtime_probe::RuntimeVerification;

/// What a [`DockerConfig`] holds unless told otherwise, and the transfer ceiling the backend
/// declares: for a host that shows its defaults (a `--help` text, a default flag value).
pub mod defaults {
    pub use crate::backend::TRANSFER_CEILING;
    pub use crate::config::{
        DEFAULT_COMMAND_TIMEOUT, DEFAULT_CPUS, DEFAULT_EGRESS_PROXY_IMAGE,
        DEFAULT_EXEC_CLEANUP_TIMEOUT, DEFAULT_IMAGE, DEFAULT_MEMORY_BYTES,
        DEFAULT_OUTBOUND_NETWORK, DEFAULT_PIDS_LIMIT, DEFAULT_PULL_TIMEOUT, MAX_POOL,
    };
    pub use crate::endpoint::DEFAULT_DOCKER_HOST;
}

/// Entry points for the fuzz targets under `fuzz/`: the parsers that read what a guest can
/// influence. Not a public API; present only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use sandbox_core::EntryKind;

    /// What the archive read's tar parser makes of a stream prefix: `Ok(Some((kind, size)))`
    /// for a first entry, `Ok(None)` when more bytes are needed, `Err` for a refused stream.
    pub fn tar_first_entry(bytes: &[u8]) -> Result<Option<(EntryKind, Option<u64>)>, String> {
        crate::tar_header::first_entry(bytes).map(|entry| match entry {
            crate::tar_header::FirstEntry::Found(stat) => Some((stat.kind, stat.size)),
            crate::tar_header::FirstEntry::NeedMore => None,
        })
    }

    /// The longest prefix the parser ever needs.
    pub const TAR_MAX_PREFIX: usize = crate::tar_header::MAX_PREFIX;

    /// What the host makes of a guest's one-level listing (whose output the guest controls):
    /// `(kind letter, size, name)` per record, or why the listing is refused.
    #[allow(clippy::type_complexity)]
    pub fn list_records(stdout: &[u8]) -> Result<Vec<(u8, Option<u64>, Vec<u8>)>, String> {
        crate::guest_scripts::parse_list_records(stdout).map(|records| {
            records
                .into_iter()
                .map(|r| (r.kind, r.size, r.name.to_vec()))
                .collect()
        })
    }
}

/// The backend's name.
pub const BACKEND_NAME: &str = "docker";

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
