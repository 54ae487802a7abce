//! The local images, built from packages this machine can install, never pulled.
//!
//! Strategy: every image is a `docker import` of a root file system this module assembles on
//! the host. The Debian images come from one `debootstrap --variant=minbase` per package set
//! (archived once, optionally cached across runs); the BusyBox image is a tar written in memory
//! around the host's static BusyBox; the egress proxy image is a tar written in memory around
//! a static `egress-proxy` binary (`docs/egress-proxy.md`). `sandbox-base:local` and
//! `sandbox-base-root:local` carry the static exec init and `host-tool`, `sbx-sim-shell:local`
//! carries `host-tool`, each added to the cached root at import.
//! `cargo xtask images` and `sandboxctl images build` both call [`ImageRecipe::build`].
//!
//! Modules: [`debian`] bootstraps the Debian roots, [`busybox`] writes the BusyBox root,
//! [`egress_proxy`] writes the proxy's root, [`exec_init`] the init's entries,
//! [`guest_binary`] finds, reads and labels the workspace's static binaries the images carry,
//! [`scratch`] owns the build's private directory and its cleanup, [`engine_import`] hands a
//! finished root to the engine; this file holds the public types, the recipe and the bounded
//! runner every step uses.

mod busybox;
mod debian;
mod egress_proxy;
mod engine_import;
mod exec_init;
mod guest_binary;
mod scratch;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, ExitKind, RunOutput};

use crate::connection::EngineConnection;
use crate::endpoint::Endpoint;

use crate::error::DockerError;

use busybox::find_static_busybox;
use debian::{effective_uid, DebianRoot};
use exec_init::ExecInitEntries;
use guest_binary::{binary_digest, GuestBinary};
use scratch::Scratch;

pub use debian::mirror_from_apt_sources;

/// The Debian suite every Debian image is bootstrapped from.
pub(crate) const DEBIAN_SUITE: &str = "bookworm";

/// The `PATH` every image declares.
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The guest user of the non-root images: name, uid and gid.
const AGENT_USER: &str = "agent";
const AGENT_ID: u32 = 1000;

/// Bumped whenever a root's contents change, so a stale cached archive is never reused.
const ROOT_RECIPE_VERSION: u32 = 3;

/// The most output a host tool of the recipe may print (debootstrap is chatty, not unbounded).
const TOOL_OUTPUT_BUDGET: usize = 64 * 1024 * 1024;

/// The egress proxy image's reference (the default `egress_proxy_image`).
pub(crate) const EGRESS_PROXY_IMAGE: &str = "sandbox-egress-proxy:local";

/// The uid and gid the egress proxy image runs as.
pub(crate) const EGRESS_PROXY_ID: u32 = 65532;

/// Where the proxy image keeps its socket and the forwarder: the mount point of the egress
/// volume, owned by [`EGRESS_PROXY_ID`] with mode 0755, so that a fresh named volume mounted
/// there starts with that owner and the non-root proxy can create its socket in it. The same
/// directory the containers mount the volume at.
pub(crate) const EGRESS_PROXY_DIR: &str = crate::egress_names::EGRESS_MOUNT;

/// Where the binary lives in the proxy image (its entrypoint).
pub(crate) const EGRESS_PROXY_PATH: &str = "/usr/local/bin/egress-proxy";

/// The tools the exec wrapper needs, which `sandbox-notools:local` must lack some of.
const NOTOOLS_REMOVED: [&str; 2] = ["./usr/bin/base64", "./usr/bin/setsid"];

/// One of the images the recipe builds.
///
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LocalImage {
    /// `sandbox-base:local`, the default image: Debian minbase with util-linux, coreutils and
    /// curl and the static exec init at [`exec_wrapper::wrapper::EXEC_INIT_PATH`], running as user
    /// `agent` (1000:1000).
    Base,
    /// `sandbox-base-root:local`: the same root and init, running as root.
    BaseRoot,
    /// `sandbox-busybox:local`: a static BusyBox with a link per applet, running as 1000:1000.
    Busybox,
    /// `sandbox-notools:local`: the base root without `base64` and `setsid` (and without the
    /// exec init), so the exec wrapper's tool probe must refuse it.
    NoTools,
    /// `sbx-sim-shell:local`: the base packages plus bash, mount, sudo (passwordless for
    /// `agent`) and CPython, and the static `host-tool`, running as `agent`; the image
    /// sbx-sim's default template runs.
    SbxSimShell,
    /// `sandbox-python:local`: the base image's root and programs plus CPython (Debian's
    /// `python3`, 3.11), running as `agent`: the image of the program channel's
    /// `python-portable-v1` profile.
    Python,
    /// `sandbox-egress-proxy:local`: the static `egress-proxy` binary as its entrypoint,
    /// running as 65532:65532, with `/run/maf-egress` owned by that user.
    EgressProxy,
}

impl LocalImage {
    /// Every image the recipe builds, in build order.
    pub const ALL: [LocalImage; 7] = [
        LocalImage::Base,
        LocalImage::BaseRoot,
        LocalImage::NoTools,
        LocalImage::Busybox,
        LocalImage::SbxSimShell,
        LocalImage::Python,
        LocalImage::EgressProxy,
    ];

    /// The image a backend uses when a spec names none.
    pub const DEFAULT: LocalImage = LocalImage::Base;

    /// The image's reference on the engine.
    pub fn tag(self) -> &'static str {
        match self {
            LocalImage::Base => "sandbox-base:local",
            LocalImage::BaseRoot => "sandbox-base-root:local",
            LocalImage::Busybox => "sandbox-busybox:local",
            LocalImage::NoTools => "sandbox-notools:local",
            LocalImage::SbxSimShell => "sbx-sim-shell:local",
            LocalImage::Python => "sandbox-python:local",
            LocalImage::EgressProxy => EGRESS_PROXY_IMAGE,
        }
    }

    /// The image named by `tag` (exactly as [`LocalImage::tag`] spells it).
    pub fn from_tag(tag: &str) -> Result<LocalImage, DockerError> {
        LocalImage::ALL
            .into_iter()
            .find(|image| image.tag() == tag)
            .ok_or_else(|| DockerError::UnknownImage {
                tag: tag.to_owned(),
                known: LocalImage::ALL.map(LocalImage::tag).join(", "),
            })
    }

    /// The `USER` the image runs as.
    fn user(self) -> String {
        match self {
            LocalImage::BaseRoot => "root".to_owned(),
            LocalImage::Busybox => format!("{AGENT_ID}:{AGENT_ID}"),
            LocalImage::EgressProxy => format!("{EGRESS_PROXY_ID}:{EGRESS_PROXY_ID}"),
            LocalImage::Base
            | LocalImage::NoTools
            | LocalImage::SbxSimShell
            | LocalImage::Python => AGENT_USER.to_owned(),
        }
    }

    /// Where the image's root file system comes from.
    fn root(self) -> RootSource {
        match self {
            LocalImage::Base | LocalImage::BaseRoot | LocalImage::NoTools => {
                RootSource::Debian(DebianRoot::Base)
            }
            LocalImage::SbxSimShell => RootSource::Debian(DebianRoot::SbxShell),
            LocalImage::Python => RootSource::Debian(DebianRoot::Python),
            LocalImage::Busybox => RootSource::Busybox,
            LocalImage::EgressProxy => RootSource::EgressProxy,
        }
    }

    /// Whether the image carries the static exec init at [`exec_wrapper::wrapper::EXEC_INIT_PATH`]
    /// (built around the binary [`ImageRecipe::exec_init_binary`] names).
    pub fn carries_exec_init(self) -> bool {
        self.guest_binaries().contains(&GuestBinary::ExecInit)
    }

    /// Whether the image carries the static `host-tool` program at
    /// [`sandbox_core::host_tool_run::HOST_TOOL_PROGRAM`] (built around the binary
    /// [`ImageRecipe::host_tool_binary`] names): sandboxes of it serve host tools.
    pub fn carries_host_tool(self) -> bool {
        self.guest_binaries().contains(&GuestBinary::HostTool)
    }

    /// Whether the image is built around a static workspace binary (the egress proxy, the exec
    /// init, `host-tool`): a caller that builds those binaries first builds it after them, and
    /// the recipe rebuilds it when its binaries' digests change.
    pub fn carries_workspace_binaries(self) -> bool {
        !self.guest_binaries().is_empty()
    }

    /// The workspace binaries the image is built around, whose digests it is labelled with.
    fn guest_binaries(self) -> &'static [GuestBinary] {
        match self {
            LocalImage::Base | LocalImage::BaseRoot | LocalImage::Python => {
                &[GuestBinary::ExecInit, GuestBinary::HostTool]
            }
            LocalImage::SbxSimShell => &[GuestBinary::HostTool],
            LocalImage::EgressProxy => &[GuestBinary::EgressProxy],
            LocalImage::Busybox | LocalImage::NoTools => &[],
        }
    }

    /// Whether the image's carried programs go in as tar entries after its Debian root (every
    /// carried binary but the egress proxy, whose image is its binary alone).
    fn appends_programs(self) -> bool {
        self.carries_exec_init() || self.carries_host_tool()
    }

    /// The `docker import --change` instructions for this image.
    fn import_changes(self) -> Vec<String> {
        let last = match self {
            // No shell in it: the binary is the entrypoint and the role its first argument.
            LocalImage::EgressProxy => format!(r#"ENTRYPOINT ["{EGRESS_PROXY_PATH}"]"#),
            _ => r#"CMD ["/bin/sh"]"#.to_owned(),
        };
        vec![
            format!("USER {}", self.user()),
            format!("ENV PATH={IMAGE_PATH}"),
            last,
        ]
    }
}

impl fmt::Display for LocalImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tag())
    }
}

impl FromStr for LocalImage {
    type Err = DockerError;

    fn from_str(tag: &str) -> Result<Self, Self::Err> {
        LocalImage::from_tag(tag)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RootSource {
    Debian(DebianRoot),
    Busybox,
    EgressProxy,
}

/// What happened to one requested image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageOutcome {
    /// The tag already existed on the engine; nothing was done.
    AlreadyPresent,
    /// The image was built and tagged.
    Built,
}

/// One line of [`ImageRecipe::build`]'s result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReport {
    /// The image.
    pub image: LocalImage,
    /// Whether it was built or skipped.
    pub outcome: ImageOutcome,
    /// Time spent on it, including a shared root it was the first to need.
    pub elapsed: Duration,
}

/// Receives one human-readable line per step of a build.
pub type ProgressSink = Arc<dyn Fn(&str) + Send + Sync>;

/// The image recipe and its settings.
///
/// Building needs: a reachable Docker engine; for the Debian images, root, `debootstrap`
/// (Debian package `debootstrap`), `chroot` and GNU `tar`, and a Debian mirror in the apt
/// sources (or [`ImageRecipe::mirror`]); for the BusyBox image, a static BusyBox (Debian
/// package `busybox-static`); for the two base images a static `sandbox-exec-init`
/// ([`ImageRecipe::exec_init_binary`]), for the egress proxy image a static `egress-proxy`
/// ([`ImageRecipe::egress_proxy_binary`]). A missing tool is reported by name and package
/// before anything is built. Every child process runs under a deadline and is killed (its whole process group)
/// and reaped when the deadline passes or the build future is dropped. Scratch directories are
/// removed on every exit, after unmounting anything debootstrap left mounted in them.
#[derive(Clone)]
pub struct ImageRecipe {
    context: Option<String>,
    management_env: Option<Vec<(OsString, OsString)>>,
    cache_dir: Option<PathBuf>,
    scratch_parent: PathBuf,
    mirror: Option<String>,
    egress_proxy_binary: Option<PathBuf>,
    exec_init_binary: Option<PathBuf>,
    host_tool_binary: Option<PathBuf>,
    command_timeout: Duration,
    import_timeout: Duration,
    bootstrap_timeout: Duration,
    progress: ProgressSink,
}

impl fmt::Debug for ImageRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageRecipe")
            .field("context", &self.context)
            .field("cache_dir", &self.cache_dir)
            .field("scratch_parent", &self.scratch_parent)
            .field("mirror", &self.mirror)
            .field("egress_proxy_binary", &self.egress_proxy_binary)
            .field("exec_init_binary", &self.exec_init_binary)
            .field("host_tool_binary", &self.host_tool_binary)
            .field("command_timeout", &self.command_timeout)
            .field("import_timeout", &self.import_timeout)
            .field("bootstrap_timeout", &self.bootstrap_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for ImageRecipe {
    fn default() -> Self {
        ImageRecipe::new()
    }
}

impl ImageRecipe {
    /// A recipe for the engine this process's environment names (resolved as
    /// [`Endpoint::resolve`](crate::Endpoint::resolve) does), no cache, scratch space in the
    /// system temp directory, the mirror from the apt sources, and silent progress.
    pub fn new() -> ImageRecipe {
        ImageRecipe {
            context: None,
            management_env: None,
            cache_dir: None,
            scratch_parent: std::env::temp_dir(),
            mirror: None,
            egress_proxy_binary: None,
            exec_init_binary: None,
            host_tool_binary: None,
            command_timeout: Duration::from_secs(60),
            import_timeout: Duration::from_secs(600),
            bootstrap_timeout: Duration::from_secs(1800),
            progress: Arc::new(|_| {}),
        }
    }

    /// Pins a Docker context, as `docker --context <name>` would; by default the endpoint is
    /// resolved from the environment.
    pub fn context(mut self, name: impl Into<String>) -> ImageRecipe {
        self.context = Some(name.into());
        self
    }

    /// The environment the engine endpoint is resolved from (`DOCKER_HOST`, `DOCKER_CONTEXT`,
    /// `DOCKER_CONFIG`, `HOME`); by default this process's.
    pub fn management_env(
        mut self,
        env: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
    ) -> ImageRecipe {
        self.management_env = Some(env.into_iter().map(|(n, v)| (n.into(), v.into())).collect());
        self
    }

    /// Keeps the debootstrapped roots (as tar archives) and downloaded packages in `dir`, so a
    /// rebuild after `docker rmi` skips debootstrap.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> ImageRecipe {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Where scratch directories are made (default: the system temp directory). It must allow
    /// device nodes, which debootstrap creates.
    pub fn scratch_dir(mut self, dir: impl Into<PathBuf>) -> ImageRecipe {
        self.scratch_parent = dir.into();
        self
    }

    /// The Debian mirror URL to bootstrap from, instead of the one in the apt sources.
    pub fn mirror(mut self, url: impl Into<String>) -> ImageRecipe {
        self.mirror = Some(url.into());
        self
    }

    /// The static `egress-proxy` binary the egress proxy image is built around; by default an
    /// `egress-proxy` beside this process's executable. It must be statically linked (it is
    /// copied into workloads whose images may have no C library).
    pub fn egress_proxy_binary(mut self, path: impl Into<PathBuf>) -> ImageRecipe {
        self.egress_proxy_binary = Some(path.into());
        self
    }

    /// The static `sandbox-exec-init` binary the images that carry the exec init are built
    /// around ([`LocalImage::carries_exec_init`]); by default a `sandbox-exec-init` beside this
    /// process's executable. It must be statically linked: it starts every call in those images
    /// without loading a C library.
    pub fn exec_init_binary(mut self, path: impl Into<PathBuf>) -> ImageRecipe {
        self.exec_init_binary = Some(path.into());
        self
    }

    /// The static `host-tool` binary the images that carry host tools are built around
    /// ([`LocalImage::carries_host_tool`]); by default a `host-tool` beside this process's
    /// executable, and without one the images carry none.
    pub fn host_tool_binary(mut self, path: impl Into<PathBuf>) -> ImageRecipe {
        self.host_tool_binary = Some(path.into());
        self
    }

    /// The binary configured for `binary`, if any.
    fn configured(&self, binary: GuestBinary) -> Option<&Path> {
        match binary {
            GuestBinary::EgressProxy => self.egress_proxy_binary.as_deref(),
            GuestBinary::ExecInit => self.exec_init_binary.as_deref(),
            GuestBinary::HostTool => self.host_tool_binary.as_deref(),
        }
    }

    /// The deadline of each short engine call (`docker image inspect`; default 60 s).
    pub fn command_timeout(mut self, timeout: Duration) -> ImageRecipe {
        self.command_timeout = timeout;
        self
    }

    /// The deadline of each `docker import` (default 600 s).
    pub fn import_timeout(mut self, timeout: Duration) -> ImageRecipe {
        self.import_timeout = timeout;
        self
    }

    /// The deadline of each debootstrap run (default 1800 s).
    pub fn bootstrap_timeout(mut self, timeout: Duration) -> ImageRecipe {
        self.bootstrap_timeout = timeout;
        self
    }

    /// Sends one line per step to `sink` (for a CLI: print it to stderr).
    pub fn progress(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> ImageRecipe {
        self.progress = Arc::new(sink);
        self
    }

    fn say(&self, line: &str) {
        tracing::info!(target: "backend_docker::images", "{line}");
        (self.progress)(line);
    }

    /// Builds each image of `images` that the engine does not have yet (an empty slice means
    /// every image of [`LocalImage::ALL`]), in the order given, duplicates ignored.
    ///
    /// Cancel safety: dropping the future kills the running child's process group and removes
    /// the scratch directory; an image already tagged stays, a half-written cache archive never
    /// replaces a good one (archives are renamed into place only when complete).
    pub async fn build(&self, images: &[LocalImage]) -> Result<Vec<ImageReport>, DockerError> {
        let requested = if images.is_empty() {
            &LocalImage::ALL[..]
        } else {
            images
        };
        let mut wanted: Vec<LocalImage> = Vec::new();
        for image in requested {
            if !wanted.contains(image) {
                wanted.push(*image);
            }
        }

        let mut reports = Vec::with_capacity(wanted.len());
        let mut missing = Vec::new();
        for image in &wanted {
            match self.image_id(image.tag()).await? {
                Some(id) if self.is_stale(*image).await? => {
                    self.say(&format!(
                        "{image}: present ({}) but built around other workspace binaries, rebuilding",
                        short_id(&id)
                    ));
                    missing.push(*image);
                }
                Some(id) => {
                    self.say(&format!("{image}: present ({}), skipped", short_id(&id)));
                    reports.push(ImageReport {
                        image: *image,
                        outcome: ImageOutcome::AlreadyPresent,
                        elapsed: Duration::ZERO,
                    });
                }
                None => missing.push(*image),
            }
        }
        if missing.is_empty() {
            return Ok(reports);
        }

        let tools = self.preflight(&missing)?;
        let scratch = Scratch::create(&self.scratch_parent)?;
        // Every Debian root the missing images need, from one debootstrap; its time counts
        // toward the first image that needs one.
        let needed = debian_roots(&missing);
        // Read once for every image that carries the same programs.
        let mut appended_entries: Vec<(&'static [GuestBinary], ExecInitEntries)> = Vec::new();
        for image in missing.iter().filter(|image| image.appends_programs()) {
            let wanted = image.guest_binaries();
            let found = wanted.iter().any(|binary| match binary {
                GuestBinary::ExecInit => tools.exec_init.is_some(),
                GuestBinary::HostTool => tools.host_tool.is_some(),
                GuestBinary::EgressProxy => false,
            });
            if found && !appended_entries.iter().any(|(set, _)| *set == wanted) {
                let entries = self.exec_init_entries(&tools, wanted)?;
                appended_entries.push((wanted, entries));
            }
        }
        let roots_started = Instant::now();
        let roots: HashMap<DebianRoot, PathBuf> = if needed.is_empty() {
            HashMap::new()
        } else {
            self.debian_archives(&needed, &tools, &scratch).await?
        };
        let mut roots_elapsed = Some(roots_started.elapsed());
        for (index, image) in missing.iter().enumerate() {
            let started = Instant::now();
            self.say(&format!(
                "{image}: building ({} of {})",
                index + 1,
                missing.len()
            ));
            let mut labels = Vec::new();
            let archive = match image.root() {
                RootSource::Debian(root) => {
                    let base = roots.get(&root).cloned().ok_or_else(|| DockerError::Io {
                        action: "finding the archive of the Debian root for",
                        path: PathBuf::from(image.tag()),
                        source: std::io::Error::from(std::io::ErrorKind::NotFound),
                    })?;
                    if *image == LocalImage::NoTools {
                        self.without_wrapper_tools(&base, &tools, &scratch).await?
                    } else {
                        base
                    }
                }
                RootSource::Busybox => self.busybox_archive(&tools, &scratch).await?,
                RootSource::EgressProxy => {
                    let (archive, digest) = self.egress_proxy_archive(&tools, &scratch)?;
                    labels.push((GuestBinary::EgressProxy.digest_label(), digest));
                    archive
                }
            };
            let appended = match appended_entries
                .iter()
                .find(|(set, _)| *set == image.guest_binaries())
            {
                Some((_, entries)) => {
                    labels.extend(entries.digests.iter().cloned());
                    &entries.tar[..]
                }
                None => &[],
            };
            self.import(*image, &archive, appended, &labels).await?;
            let mut elapsed = started.elapsed();
            if matches!(image.root(), RootSource::Debian(_)) {
                elapsed += roots_elapsed.take().unwrap_or_default();
            }
            self.say(&format!("{image}: built in {:.1} s", elapsed.as_secs_f64()));
            reports.push(ImageReport {
                image: *image,
                outcome: ImageOutcome::Built,
                elapsed,
            });
        }
        scratch.remove()?;
        reports.sort_by_key(|report| wanted.iter().position(|w| *w == report.image));
        Ok(reports)
    }

    /// Bootstraps into the cache directory ([`ImageRecipe::cache_dir`]) the Debian roots of the
    /// images of `images` (an empty slice means every image) that the engine lacks, and imports
    /// nothing: a later [`ImageRecipe::build`] of them takes the roots from the cache. For a caller
    /// that must first compile a binary the images carry ([`ImageRecipe::exec_init_binary`]):
    /// debootstrap, which mostly waits on the mirror and the disk, runs beside the compile. One
    /// debootstrap serves every root, as in a build. Without a cache directory there is nowhere to
    /// keep the roots, and it does nothing.
    ///
    /// # Errors
    /// DaemonUnreachable when the engine cannot be asked; HostToolMissing or NeedsRoot when
    /// debootstrap cannot run; Io or a command failure when a step fails.
    ///
    /// # Cancel safety
    /// As [`ImageRecipe::build`]: the scratch directory is removed, a partial archive never
    /// replaces a good one.
    pub async fn cache_roots(&self, images: &[LocalImage]) -> Result<(), DockerError> {
        if self.cache_dir.is_none() {
            return Ok(());
        }
        let requested = if images.is_empty() {
            &LocalImage::ALL[..]
        } else {
            images
        };
        let mut absent = Vec::new();
        for image in requested {
            let debian = matches!(image.root(), RootSource::Debian(_));
            if debian && self.image_id(image.tag()).await?.is_none() {
                absent.push(*image);
            }
        }
        let roots = debian_roots(&absent);
        if roots.is_empty() {
            return Ok(());
        }
        // Only the Debian tools: the images' binaries may still be compiling.
        let tools = HostTools {
            debian: Some(self.debian_tools()?),
            ..HostTools::default()
        };
        let scratch = Scratch::create(&self.scratch_parent)?;
        self.debian_archives(&roots, &tools, &scratch).await?;
        scratch.remove()
    }

    /// The tar archive of `image`'s Debian root (for [`LocalImage::Python`]: minbase with
    /// util-linux, coreutils, curl and CPython, user `agent`), from the cache when there, else
    /// bootstrapped into it. Other image formats (the microVM root file system) are made from
    /// these archives, so every image a guest runs comes from this one recipe. Needs no engine.
    /// The archive lives in the recipe's cache directory, or without one in
    /// `sandbox-images-cache` under the scratch parent, so it outlives the call.
    ///
    /// # Errors
    /// UnknownImage for an image without a Debian root; HostToolMissing or NeedsRoot when
    /// debootstrap cannot run; Io or a command failure when a step fails.
    ///
    /// # Cancel safety
    /// As [`ImageRecipe::build`]: the scratch directory is removed, a partial archive never
    /// replaces a good one.
    pub async fn root_archive(&self, image: LocalImage) -> Result<PathBuf, DockerError> {
        let RootSource::Debian(root) = image.root() else {
            return Err(DockerError::UnknownImage {
                tag: image.tag().to_owned(),
                known: LocalImage::ALL
                    .into_iter()
                    .filter(|image| matches!(image.root(), RootSource::Debian(_)))
                    .map(LocalImage::tag)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let mut recipe = self.clone();
        if recipe.cache_dir.is_none() {
            recipe.cache_dir = Some(self.scratch_parent.join("sandbox-images-cache"));
        }
        let tools = HostTools {
            debian: Some(recipe.debian_tools()?),
            ..HostTools::default()
        };
        let scratch = Scratch::create(&recipe.scratch_parent)?;
        let mut archives = recipe.debian_archives(&[root], &tools, &scratch).await?;
        scratch.remove()?;
        archives.remove(&root).ok_or_else(|| DockerError::Io {
            action: "finding the archive of the Debian root for",
            path: PathBuf::from(image.tag()),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    /// The engine's id for `tag`, or `None` when the engine has no such image.
    ///
    /// # Errors
    /// DaemonUnreachable when the engine cannot be reached or answers with a failure.
    ///
    /// # Cancel safety
    /// Dropping the future drops the request; nothing is changed on the engine.
    pub async fn image_id(&self, tag: &str) -> Result<Option<String>, DockerError> {
        let engine = self.engine().await?;
        engine
            .image_id(self.command_timeout, tag)
            .await
            .map_err(|failure| {
                unreachable_engine("image inspect", engine.failure("image inspect", failure))
            })
    }

    /// Whether `image`, present on the engine, was built around another binary than the one
    /// this recipe would use now. An image built around no binary, or with no binary to compare
    /// (none found), stands.
    async fn is_stale(&self, image: LocalImage) -> Result<bool, DockerError> {
        for &binary in image.guest_binaries() {
            let Ok(path) = binary.find(self.configured(binary)) else {
                continue;
            };
            let digest = binary_digest(&binary.read(&path)?);
            let engine = self.engine().await?;
            let label = engine
                .image_label(self.command_timeout, image.tag(), binary.digest_label())
                .await
                .map_err(|failure| {
                    unreachable_engine("image inspect", engine.failure("image inspect", failure))
                })?;
            if label.flatten().as_deref() != Some(digest.as_str()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The engine this recipe talks to, resolved and connected now.
    async fn engine(&self) -> Result<EngineConnection, DockerError> {
        let env = self
            .management_env
            .clone()
            .unwrap_or_else(|| std::env::vars_os().collect());
        let endpoint = Endpoint::resolve(&env, self.context.as_deref())
            .map_err(|e| unreachable_engine("endpoint resolution", e))?;
        EngineConnection::open(endpoint, self.command_timeout)
            .await
            .map(|(engine, _os)| engine)
            .map_err(|e| unreachable_engine("connect", e))
    }

    /// Finds every host tool the missing images need, so a gap is reported before any work: the
    /// workspace's binaries first (a local check that needs no host tool), then the host's tools.
    fn preflight(&self, missing: &[LocalImage]) -> Result<HostTools, DockerError> {
        let mut tools = HostTools::default();
        for binary in [
            GuestBinary::EgressProxy,
            GuestBinary::ExecInit,
            GuestBinary::HostTool,
        ] {
            if missing
                .iter()
                .any(|image| image.guest_binaries().contains(&binary))
            {
                let found = binary.find(self.configured(binary));
                let tool = match found {
                    // The exec init only makes calls cheaper: without one named or beside this
                    // executable, the base images are built without it and their calls run
                    // under the engine's init. One that is named must be usable.
                    Err(why)
                        if binary == GuestBinary::ExecInit && self.configured(binary).is_none() =>
                    {
                        self.say(&format!(
                            "no usable exec init beside this executable ({why}): the base images \
                             are built without it, and their calls run under the engine's init"
                        ));
                        None
                    }
                    // Likewise host tools: without the program the images serve none.
                    Err(why)
                        if binary == GuestBinary::HostTool && self.configured(binary).is_none() =>
                    {
                        self.say(&format!(
                            "no usable host-tool beside this executable ({why}): the images that \
                             carry it are built without it, and serve no host tools"
                        ));
                        None
                    }
                    found => Some(Tool {
                        program: found?,
                        package: binary.file_name(),
                    }),
                };
                match binary {
                    GuestBinary::EgressProxy => tools.egress_proxy = tool,
                    GuestBinary::ExecInit => tools.exec_init = tool,
                    GuestBinary::HostTool => tools.host_tool = tool,
                }
            }
        }
        let needs_debian = missing
            .iter()
            .any(|image| matches!(image.root(), RootSource::Debian(_)));
        if needs_debian {
            tools.debian = Some(self.debian_tools()?);
        }
        if missing.contains(&LocalImage::Busybox) {
            let path = find_static_busybox()?;
            tools.busybox = Some(Tool {
                program: path,
                package: "busybox-static",
            });
        }
        Ok(tools)
    }

    /// The tools, the root and the mirror every Debian root needs.
    fn debian_tools(&self) -> Result<DebianTools, DockerError> {
        let debootstrap = Tool::find("debootstrap", "debootstrap")?;
        if effective_uid()? != 0 {
            return Err(DockerError::NeedsRoot {
                step: "debootstrap".to_owned(),
            });
        }
        let mirror = match &self.mirror {
            Some(url) => url.clone(),
            None => mirror_from_apt_sources()?,
        };
        Ok(DebianTools {
            debootstrap,
            chroot: Tool::find("chroot", "coreutils")?,
            cp: Tool::find("cp", "coreutils")?,
            tar: Tool::find("tar", "tar")?,
            mirror,
        })
    }
}

/// The Debian roots `images` are made from, each once, in the order first needed.
fn debian_roots(images: &[LocalImage]) -> Vec<DebianRoot> {
    let mut roots: Vec<DebianRoot> = Vec::new();
    for image in images {
        if let RootSource::Debian(root) = image.root() {
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
    }
    roots
}

/// An engine failure of the recipe, named with the operation.
#[cold]
fn unreachable_engine(operation: &str, error: sandbox_core::SandboxError) -> DockerError {
    DockerError::DaemonUnreachable {
        command: operation.to_owned(),
        detail: error.to_string(),
    }
}

/// The host programs a build found in preflight.
#[derive(Debug, Default)]
struct HostTools {
    debian: Option<DebianTools>,
    busybox: Option<Tool>,
    egress_proxy: Option<Tool>,
    exec_init: Option<Tool>,
    host_tool: Option<Tool>,
}

#[derive(Debug)]
struct DebianTools {
    debootstrap: Tool,
    chroot: Tool,
    cp: Tool,
    tar: Tool,
    mirror: String,
}

/// A host program and the Debian package that provides it (named when it is missing).
#[derive(Debug, Clone)]
struct Tool {
    program: PathBuf,
    package: &'static str,
}

impl Tool {
    fn find(name: &str, package: &'static str) -> Result<Tool, DockerError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
        dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
        dirs.into_iter()
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable_file(candidate))
            .map(|program| Tool { program, package })
            .ok_or_else(|| DockerError::HostToolMissing {
                program: name.to_owned(),
                package: package.to_owned(),
            })
    }
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

fn ensure_dir(dir: &Path) -> Result<PathBuf, DockerError> {
    std::fs::create_dir_all(dir).map_err(|source| DockerError::Io {
        action: "creating",
        path: dir.to_owned(),
        source,
    })?;
    // debootstrap wants an absolute --cache-dir.
    std::fs::canonicalize(dir).map_err(|source| DockerError::Io {
        action: "resolving",
        path: dir.to_owned(),
        source,
    })
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DockerError> {
    let io_error = |source| DockerError::Io {
        action: "writing",
        path: path.to_owned(),
        source,
    };
    std::fs::write(path, bytes).map_err(io_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_error)
}

// ----- bounded child processes -----

/// Runs `tool` through the shared bounded runner (its own process group, stdin closed, only
/// `env` in its environment, a deadline and an output budget; killed with its group and reaped
/// on every early exit) and fails unless it exits 0.
async fn run_checked(
    tool: &Tool,
    args: &[OsString],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<RunOutput, DockerError> {
    let command = BoundedCommand::new(tool.program.as_os_str(), timeout)
        .args(args.iter().cloned())
        .envs(env.iter().copied())
        .output_budget(TOOL_OUTPUT_BUDGET);
    match command.run().await {
        Ok(out) if out.status == ExitKind::Exited(0) => Ok(out),
        Ok(out) => Err(command_failed(&out, tool.program.as_os_str(), args)),
        Err(bounded_process::Error::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(DockerError::HostToolMissing {
                program: tool.program.display().to_string(),
                package: tool.package.to_owned(),
            })
        }
        Err(bounded_process::Error::Spawn { source, .. }) => Err(DockerError::Spawn {
            program: tool.program.display().to_string(),
            source,
        }),
        Err(bounded_process::Error::Deadline { bound, .. }) => Err(DockerError::CommandTimedOut {
            command: command_line(tool.program.as_os_str(), args),
            timeout: bound,
        }),
        Err(other) => Err(DockerError::CommandFailed {
            command: command_line(tool.program.as_os_str(), args),
            status: "no status".to_owned(),
            output_tail: other.to_string(),
        }),
    }
}

/// A failed child, quoting the tail of its output.
fn command_failed(out: &RunOutput, program: &OsStr, args: &[OsString]) -> DockerError {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        stderr.into_owned()
    };
    DockerError::CommandFailed {
        command: command_line(program, args),
        status: match out.status {
            ExitKind::Exited(code) => format!("exit status: {code}"),
            ExitKind::Signaled(signal) => format!("signal: {signal}"),
        },
        output_tail: tail_text(&text, 2000),
    }
}

/// The last `max` characters of `text`, trimmed, on whole characters.
fn tail_text(text: &str, max: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(count - max).collect();
    format!("…{tail}")
}

fn command_line(program: &OsStr, args: &[OsString]) -> String {
    let mut line = program.to_string_lossy().into_owned();
    for arg in args {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    tail_text(&line, 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_end_on_character_boundaries() {
        assert_eq!(tail_text("  short \n", 10), "short");
        assert_eq!(tail_text("abcdéfgh", 3), "…fgh");
        assert_eq!(tail_text("aaaaé", 1), "…é");
    }

    fn tool(program: &str) -> Tool {
        Tool {
            program: PathBuf::from(program),
            package: "test-package",
        }
    }

    #[tokio::test]
    async fn tools_run_bounded_with_only_the_given_environment() {
        let out = run_checked(
            &tool("/bin/sh"),
            &[
                "-c".into(),
                "printf '%s|%s' \"$A\" \"${HOME-unset}\"".into(),
            ],
            &[("A", "given")],
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert_eq!(out.stdout, b"given|unset");
        let error = run_checked(
            &tool("/bin/sh"),
            &["-c".into(), "printf oops >&2; exit 3".into()],
            &[],
            Duration::from_secs(20),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, DockerError::CommandFailed { output_tail, status, .. }
                if output_tail == "oops" && status.contains('3')),
            "{error}"
        );
        let started = Instant::now();
        let error = run_checked(
            &tool("/bin/sh"),
            &["-c".into(), "sleep 30".into()],
            &[],
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, DockerError::CommandTimedOut { .. }),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_missing_program_names_its_package() {
        let error = run_checked(
            &tool("/nonexistent/maf-no-such-tool"),
            &[],
            &[],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(error, DockerError::HostToolMissing { .. }),
            "{text}"
        );
        assert!(text.contains("test-package"), "{text}");
    }

    #[test]
    fn without_an_exec_init_named_or_beside_the_executable_the_base_images_go_without() {
        // Nothing named `sandbox-exec-init` lies beside this test binary. Whatever the host
        // tools say after it, the init's absence is no refusal.
        let beside = std::env::current_exe()
            .unwrap()
            .with_file_name("sandbox-exec-init");
        assert!(!beside.exists(), "{}", beside.display());
        match ImageRecipe::new().preflight(&[LocalImage::Base]) {
            Ok(tools) => assert!(tools.exec_init.is_none()),
            Err(error) => assert!(
                !matches!(error, DockerError::ExecInitBinary { .. }),
                "{error}"
            ),
        }
    }

    #[test]
    fn preflight_refuses_a_dynamic_exec_init_as_the_init() {
        // This test binary is dynamically linked. The workspace's binaries are checked first,
        // so no host tool is needed to see the refusal.
        let me = std::env::current_exe().unwrap();
        for image in [LocalImage::Base, LocalImage::BaseRoot] {
            let error = ImageRecipe::new()
                .exec_init_binary(&me)
                .preflight(&[image])
                .unwrap_err();
            assert!(
                matches!(&error, DockerError::ExecInitBinary { reason } if reason.contains("dynamically linked")),
                "{image}: {error}"
            );
        }
    }

    #[test]
    fn tags_round_trip_and_unknown_tags_list_the_known_ones() {
        for image in LocalImage::ALL {
            assert_eq!(LocalImage::from_tag(image.tag()).unwrap(), image);
            assert_eq!(image.to_string().parse::<LocalImage>().unwrap(), image);
        }
        assert_eq!(LocalImage::DEFAULT.tag(), "sandbox-base:local");
        let error = LocalImage::from_tag("sandbox-base").unwrap_err();
        let text = error.to_string();
        assert!(text.contains("`sandbox-base`"), "{text}");
        assert!(text.contains("sbx-sim-shell:local"), "{text}");
    }

    #[test]
    fn images_declare_the_users_of_the_spec() {
        assert!(LocalImage::Base
            .import_changes()
            .contains(&"USER agent".to_owned()));
        assert!(LocalImage::BaseRoot
            .import_changes()
            .contains(&"USER root".to_owned()));
        assert!(LocalImage::Busybox
            .import_changes()
            .contains(&"USER 1000:1000".to_owned()));
        for image in LocalImage::ALL {
            let changes = image.import_changes();
            assert!(
                changes.contains(&format!("ENV PATH={IMAGE_PATH}")),
                "{image}: {changes:?}"
            );
        }
        assert_eq!(
            LocalImage::NoTools.root(),
            RootSource::Debian(DebianRoot::Base)
        );
        assert!(DebianRoot::SbxShell.includes().contains("sudo"));
        assert_eq!(DebianRoot::Base.includes(), "util-linux,coreutils,curl");
        assert_eq!(
            LocalImage::Python.root(),
            RootSource::Debian(DebianRoot::Python)
        );
        // One debootstrap serves every root: it installs the largest set, and each other
        // root's copy purges what it lacks except what minbase has anyway (priority required);
        // CPython goes with the packages only it uses.
        assert_eq!(DebianRoot::SbxShell.includes(), debian::BOOTSTRAP_INCLUDES);
        assert!(DebianRoot::SbxShell.purged().is_empty());
        let required_in_minbase = ["bash", "mount"];
        for root in [DebianRoot::Base, DebianRoot::Python] {
            let holds: Vec<&str> = root.includes().split(',').collect();
            for package in debian::BOOTSTRAP_INCLUDES.split(',') {
                let held = holds.contains(&package) || required_in_minbase.contains(&package);
                assert_eq!(
                    !held,
                    root.purged().contains(&package),
                    "{root:?}: {package}"
                );
            }
            let purges_python = root.purged().contains(&"python3");
            for package in debian::PYTHON_PACKAGES {
                assert_eq!(root.purged().contains(&package), purges_python, "{package}");
            }
        }
        // The init is in the two base images only (NoTools is the base root without it).
        let carriers: Vec<LocalImage> = LocalImage::ALL
            .into_iter()
            .filter(|image| image.carries_exec_init())
            .collect();
        assert_eq!(
            carriers,
            [LocalImage::Base, LocalImage::BaseRoot, LocalImage::Python]
        );
        // host-tool also in the simulator's image, so sbx sandboxes serve host tools.
        let carriers: Vec<LocalImage> = LocalImage::ALL
            .into_iter()
            .filter(|image| image.carries_host_tool())
            .collect();
        assert_eq!(
            carriers,
            [
                LocalImage::Base,
                LocalImage::BaseRoot,
                LocalImage::SbxSimShell,
                LocalImage::Python
            ]
        );
        let around: Vec<LocalImage> = LocalImage::ALL
            .into_iter()
            .filter(|image| image.carries_workspace_binaries())
            .collect();
        assert_eq!(
            around,
            [
                LocalImage::Base,
                LocalImage::BaseRoot,
                LocalImage::SbxSimShell,
                LocalImage::Python,
                LocalImage::EgressProxy
            ]
        );
        let recipe = ImageRecipe::new()
            .exec_init_binary("/i")
            .egress_proxy_binary("/p");
        assert_eq!(
            recipe.configured(GuestBinary::ExecInit),
            Some(Path::new("/i"))
        );
        assert_eq!(
            recipe.configured(GuestBinary::EgressProxy),
            Some(Path::new("/p"))
        );
        let proxy = LocalImage::EgressProxy.import_changes();
        assert!(proxy.contains(&"USER 65532:65532".to_owned()), "{proxy:?}");
        assert!(
            proxy.contains(&r#"ENTRYPOINT ["/usr/local/bin/egress-proxy"]"#.to_owned()),
            "{proxy:?}"
        );
        assert_eq!(LocalImage::EgressProxy.tag(), EGRESS_PROXY_IMAGE);
    }
}
