//! The container sandbox backend (docker.md): one hardened container per (key, kind), driven
//! through the `docker` CLI so the user's context, `DOCKER_HOST` and TLS settings apply, and the
//! one recipe for the local images every Docker-based suite and the default configuration run on.
//!
//! # What it does
//!
//! - [`DockerBackend::connect`] validates a [`DockerConfig`], snapshots the management
//!   environment, resolves the context once and pins it: every later call is
//!   `docker --context <name> …` through exec-wrapper's bounded runner (deadline, output cap,
//!   stdin closed unless it carries bytes, killed and reaped on every early exit).
//! - Containers are named and labelled by the core's digests (`maf-sandbox-docker-<12 hex>`,
//!   `maf-sandbox.*` labels), so ownership is read back from the engine and `list`, `find`,
//!   `dispose` and `dispose_scope` work from any process, Rust or Python.
//! - Every container gets `--security-opt no-new-privileges --cap-drop ALL --pids-limit N --init
//!   --network none --pull=never` (plus `--memory`/`--cpus` when configured); never a bind mount,
//!   a host path, a published port or the Docker socket.
//! - Commands run through the exec wrapper (nonce, process-group record); an expired command's
//!   group is killed by a second exec, the container kept when that lands and retired (removed by
//!   id) when it does not. The guest environment travels in a per-call 0600 `--env-file` in a
//!   private 0700 directory, never in argv or in the client's own environment.
//! - [`ImageRecipe`] builds the images of docker.md §7 ([`LocalImage`]) from packages this machine
//!   can install and `docker import`s them; `cargo xtask images` and `sandboxctl images build`
//!   both call it.
//!
//! # The reach rule (core.md rule 51), method by method
//!
//! Every file method first checks its path with the core's bundle, walking each ancestor with an
//! **engine-side stat** (`docker cp <id>:<path> -` stopped after the first tar header: unconfined,
//! no-follow, never answered by the guest). Then it **acts with the guest's own authority**, through
//! the wrapper as the image's user, so a guest that swaps a checked component for a link between
//! check and act can only redirect the action to what it could reach itself:
//!
//! | method | check | act (as the guest) |
//! |---|---|---|
//! | `write_file` | write bundle + leaf link check | `mkdir -p`, `mktemp`, copy stdin, `chmod 0644`, rename over the target |
//! | `read_file` | read bundle + leaf stat (kind, size cap) | `cat` under a budget of the cap + 64 KiB |
//! | `stat_file` | read bundle + leaf stat | nothing: the engine answers |
//! | `list_dir` | list bundle (the directory itself walked) | one-level listing script, links listed as links |
//! | `remove` | delete bundle + leaf stat | `rm -f`/`rm -rf`, then re-walk and re-stat |
//! | `reclaim` | name rules only | `rm -rf` within the caller's bound, then an engine stat |
//!
//! The storage base is the one place the host acts with more authority than the guest: when the
//! guest cannot `mkdir -p` it, the missing suffix is created engine-side from a tar of directory
//! entries owned by the guest (under `docker pause` on a container this acquire did not create).
//!
//! # What it does not do
//!
//! It does not pull from a registry except one explicit, bounded `docker pull` of an absent image
//! (which fails here: then [`SandboxError::ImageMissing`](sandbox_core::SandboxError) says how to
//! build the local images); it enforces egress `closed` only (ALLOWLIST is a later phase); it never
//! stops a container with `docker stop`; and a command that starts a new session or rewrites its
//! own pid file outlives the timeout kill: only disposal ends every process of a sandbox.
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
//! Dropping any future of this crate kills the docker client it was waiting on. The cleanups that
//! protect a guarantee are never skipped: the remote kill after an expired or dropped exec, the
//! removal of a container an acquire created but could not finish, and the unpause after the
//! storage-base fallback all run in tasks the caller's drop cannot cancel.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod acquire;
mod archive;
mod backend;
mod config;
mod connection;
mod containers;
mod disposal;
mod egress_preflight;
mod error;
mod exec;
mod guest_scripts;
mod handle;
mod images;
mod ownership_labels;
mod state;
mod tar_header;

pub use backend::{DockerBackend, TRANSFER_CEILING};
pub use config::{
    DockerConfig, EgressProbe, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CPUS, DEFAULT_EXEC_CLEANUP_TIMEOUT,
    DEFAULT_IMAGE, DEFAULT_MEMORY_BYTES, DEFAULT_PIDS_LIMIT, DEFAULT_PULL_TIMEOUT,
};
pub use connection::{Endpoint, EndpointSource, TlsFiles, DEFAULT_DOCKER_HOST};
pub use error::DockerError;
pub use images::{ImageOutcome, ImageRecipe, ImageReport, LocalImage, ProgressSink, DEBIAN_SUITE};

/// Entry points for the fuzz targets under `fuzz/`: the parsers that read what a guest can
/// influence. Not a public API; present only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use sandbox_core::EntryKind;

    /// What the engine-side stat's tar parser makes of a stream prefix: `Ok(Some((kind, size)))`
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
