//! The local images, built from packages this machine can install, never pulled.
//!
//! Strategy: every image is a `docker import` of a root file system this module assembles on
//! the host. The Debian images come from one `debootstrap --variant=minbase` per package set
//! (archived once, optionally cached across runs); the BusyBox image is a tar written in memory
//! around the host's static BusyBox. `cargo xtask images` and `sandboxctl images build` both
//! call [`ImageRecipe::build`].

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exec_wrapper::{BoundedCommand, ExitKind, RunOutput};
use tokio::io::AsyncReadExt as _;

use crate::connection::{Endpoint, EngineConnection};

use crate::error::DockerError;

/// The Debian suite every Debian image is bootstrapped from.
pub const DEBIAN_SUITE: &str = "bookworm";

/// The `PATH` every image declares.
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The guest user of the non-root images: name, uid and gid.
const AGENT_USER: &str = "agent";
const AGENT_ID: u32 = 1000;

/// Bumped whenever a root's contents change, so a stale cached archive is never reused.
const ROOT_RECIPE_VERSION: u32 = 1;

/// The most output a host tool of the recipe may print (debootstrap is chatty, not unbounded).
const TOOL_OUTPUT_BUDGET: usize = 64 * 1024 * 1024;

/// The tools the exec wrapper needs, which `sandbox-notools:local` must lack some of.
const NOTOOLS_REMOVED: [&str; 2] = ["./usr/bin/base64", "./usr/bin/setsid"];

/// One of the images the recipe builds.
///
/// `sandbox-egress-proxy:local` (phase 2) is not built yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LocalImage {
    /// `sandbox-base:local`, the default image: Debian minbase with util-linux, coreutils and
    /// curl, running as user `agent` (1000:1000).
    Base,
    /// `sandbox-base-root:local`: the same root, running as root.
    BaseRoot,
    /// `sandbox-busybox:local`: a static BusyBox with a link per applet, running as 1000:1000.
    Busybox,
    /// `sandbox-notools:local`: the base root without `base64` and `setsid`, so the exec
    /// wrapper's tool probe must refuse it.
    NoTools,
    /// `sbx-sim-shell:local`: the base packages plus bash, mount and sudo (passwordless for
    /// `agent`), running as `agent`; the image sbx-sim's default template runs.
    SbxSimShell,
}

impl LocalImage {
    /// Every image the recipe builds, in build order.
    pub const ALL: [LocalImage; 5] = [
        LocalImage::Base,
        LocalImage::BaseRoot,
        LocalImage::NoTools,
        LocalImage::Busybox,
        LocalImage::SbxSimShell,
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
            LocalImage::Base | LocalImage::NoTools | LocalImage::SbxSimShell => {
                AGENT_USER.to_owned()
            }
        }
    }

    /// Where the image's root file system comes from.
    fn root(self) -> RootSource {
        match self {
            LocalImage::Base | LocalImage::BaseRoot | LocalImage::NoTools => {
                RootSource::Debian(DebianRoot::Base)
            }
            LocalImage::SbxSimShell => RootSource::Debian(DebianRoot::SbxShell),
            LocalImage::Busybox => RootSource::Busybox,
        }
    }

    /// The `docker import --change` instructions for this image.
    fn import_changes(self) -> Vec<String> {
        vec![
            format!("USER {}", self.user()),
            format!("ENV PATH={IMAGE_PATH}"),
            r#"CMD ["/bin/sh"]"#.to_owned(),
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
}

/// A debootstrapped root: one per package set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DebianRoot {
    /// `--include=util-linux,coreutils,curl`, user `agent`.
    Base,
    /// The base packages plus bash, mount and sudo; `agent` may sudo without a password.
    SbxShell,
}

impl DebianRoot {
    fn includes(self) -> &'static str {
        match self {
            DebianRoot::Base => "util-linux,coreutils,curl",
            DebianRoot::SbxShell => "util-linux,coreutils,curl,bash,mount,sudo",
        }
    }

    fn id(self) -> &'static str {
        match self {
            DebianRoot::Base => "base",
            DebianRoot::SbxShell => "sbx-shell",
        }
    }

    fn archive_name(self) -> String {
        format!(
            "debian-{DEBIAN_SUITE}-{}-v{ROOT_RECIPE_VERSION}.tar",
            self.id()
        )
    }
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
/// package `busybox-static`). A missing tool is reported by name and package before anything
/// is built. Every child process runs under a deadline and is killed (its whole process group)
/// and reaped when the deadline passes or the build future is dropped. Scratch directories are
/// removed on every exit, after unmounting anything debootstrap left mounted in them.
#[derive(Clone)]
pub struct ImageRecipe {
    context: Option<String>,
    management_env: Option<Vec<(OsString, OsString)>>,
    cache_dir: Option<PathBuf>,
    scratch_parent: PathBuf,
    mirror: Option<String>,
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
        let mut roots: HashMap<DebianRoot, PathBuf> = HashMap::new();
        for (index, image) in missing.iter().enumerate() {
            let started = Instant::now();
            self.say(&format!(
                "{image}: building ({} of {})",
                index + 1,
                missing.len()
            ));
            let archive = match image.root() {
                RootSource::Debian(root) => {
                    let base = match roots.get(&root) {
                        Some(path) => path.clone(),
                        None => {
                            let path = self.debian_archive(root, &tools, &scratch).await?;
                            roots.insert(root, path.clone());
                            path
                        }
                    };
                    if *image == LocalImage::NoTools {
                        self.without_wrapper_tools(&base, &tools, &scratch).await?
                    } else {
                        base
                    }
                }
                RootSource::Busybox => self.busybox_archive(&tools, &scratch).await?,
            };
            self.import(*image, &archive).await?;
            let elapsed = started.elapsed();
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

    /// The engine's id for `tag`, or `None` when the engine has no such image.
    ///
    /// # Errors
    /// DaemonUnreachable when the engine cannot be reached or answers with a failure.
    ///
    /// # Cancel safety
    /// Dropping the future drops the request; nothing is changed on the engine.
    pub async fn image_id(&self, tag: &str) -> Result<Option<String>, DockerError> {
        let engine = self.engine().await?;
        let answer = engine
            .call(self.command_timeout, engine.api().inspect_image(tag))
            .await;
        match answer {
            Ok(image) => Ok(Some(image.id.unwrap_or_default())),
            Err(failure) if failure.is_not_found() => Ok(None),
            Err(failure) => Err(unreachable_engine(
                "image inspect",
                engine.failure("image inspect", failure),
            )),
        }
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
            .map_err(|e| unreachable_engine("connect", e))
    }

    /// Finds every host tool the missing images need, so a gap is reported before any work.
    fn preflight(&self, missing: &[LocalImage]) -> Result<HostTools, DockerError> {
        let mut tools = HostTools::default();
        let needs_debian = missing
            .iter()
            .any(|image| matches!(image.root(), RootSource::Debian(_)));
        if needs_debian {
            let bootstrap = Tool::find("debootstrap", "debootstrap")?;
            if effective_uid()? != 0 {
                return Err(DockerError::NeedsRoot {
                    step: "debootstrap".to_owned(),
                });
            }
            let mirror = match &self.mirror {
                Some(url) => url.clone(),
                None => mirror_from_apt_sources()?,
            };
            tools.debian = Some(DebianTools {
                debootstrap: bootstrap,
                chroot: Tool::find("chroot", "coreutils")?,
                tar: Tool::find("tar", "tar")?,
                mirror,
            });
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

    /// The tar archive of a debootstrapped root: from the cache when there, else built.
    async fn debian_archive(
        &self,
        root: DebianRoot,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<PathBuf, DockerError> {
        let debian = tools
            .debian
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "debootstrap".to_owned(),
                package: "debootstrap".to_owned(),
            })?;
        let cache = match &self.cache_dir {
            Some(dir) => Some(ensure_dir(dir)?),
            None => None,
        };
        let archive = match &cache {
            Some(dir) => dir.join(root.archive_name()),
            None => scratch.path().join(root.archive_name()),
        };
        if archive.is_file() {
            self.say(&format!("  using cached root {}", archive.display()));
            return Ok(archive);
        }

        let target = scratch.path().join(format!("root-{}", root.id()));
        let mut args: Vec<OsString> = vec![
            "--variant=minbase".into(),
            format!("--include={}", root.includes()).into(),
        ];
        if let Some(dir) = &cache {
            let debs = ensure_dir(&dir.join("debs"))?;
            let mut flag = OsString::from("--cache-dir=");
            flag.push(debs.as_os_str());
            args.push(flag);
        }
        args.extend([
            OsString::from(DEBIAN_SUITE),
            target.clone().into_os_string(),
            OsString::from(&debian.mirror),
        ]);
        self.say(&format!(
            "  debootstrap {DEBIAN_SUITE} (minbase + {}) from {}",
            root.includes(),
            debian.mirror
        ));
        let started = Instant::now();
        let outcome = run_checked(
            &debian.debootstrap,
            &args,
            &chroot_env(),
            self.bootstrap_timeout,
        )
        .await;
        // debootstrap unmounts what it mounted on a normal exit; a killed one may not have.
        unmount_under(&target);
        outcome?;
        self.say(&format!(
            "  debootstrap done in {:.1} s",
            started.elapsed().as_secs_f64()
        ));

        self.add_agent_user(root, &target, debian).await?;
        trim_package_caches(&target)?;

        let partial = archive.with_extension("tar.partial");
        let tar_args: Vec<OsString> = vec![
            "--numeric-owner".into(),
            "-C".into(),
            target.clone().into_os_string(),
            "-cf".into(),
            partial.clone().into_os_string(),
            ".".into(),
        ];
        let archived = run_checked(&debian.tar, &tar_args, &[], self.import_timeout).await;
        if let Err(error) = archived {
            let _ = std::fs::remove_file(&partial);
            return Err(error);
        }
        std::fs::rename(&partial, &archive).map_err(|source| DockerError::Io {
            action: "moving the root archive into place at",
            path: archive.clone(),
            source,
        })?;
        remove_tree(&target)?;
        self.say(&format!(
            "  root archived to {} ({} MiB)",
            archive.display(),
            file_size(&archive) / (1024 * 1024)
        ));
        Ok(archive)
    }

    /// Adds user `agent` (1000:1000, home `/home/agent`) inside the root, and for the sbx
    /// shell root the passwordless sudo rule.
    async fn add_agent_user(
        &self,
        root: DebianRoot,
        target: &Path,
        debian: &DebianTools,
    ) -> Result<(), DockerError> {
        let id = AGENT_ID.to_string();
        let group: Vec<OsString> = vec![
            target.as_os_str().to_owned(),
            "groupadd".into(),
            "--gid".into(),
            id.clone().into(),
            AGENT_USER.into(),
        ];
        run_checked(&debian.chroot, &group, &chroot_env(), self.command_timeout).await?;
        let user: Vec<OsString> = vec![
            target.as_os_str().to_owned(),
            "useradd".into(),
            "--uid".into(),
            id.clone().into(),
            "--gid".into(),
            id.into(),
            "--create-home".into(),
            "--shell".into(),
            "/bin/bash".into(),
            AGENT_USER.into(),
        ];
        run_checked(&debian.chroot, &user, &chroot_env(), self.command_timeout).await?;
        if root == DebianRoot::SbxShell {
            let rule = target.join("etc/sudoers.d").join(AGENT_USER);
            write_file(&rule, b"agent ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440)?;
        }
        self.say(&format!(
            "  user {AGENT_USER} ({AGENT_ID}:{AGENT_ID}) added{}",
            if root == DebianRoot::SbxShell {
                ", with passwordless sudo"
            } else {
                ""
            }
        ));
        Ok(())
    }

    /// A copy of the base archive without the wrapper's `base64` and `setsid`.
    async fn without_wrapper_tools(
        &self,
        base: &Path,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<PathBuf, DockerError> {
        let debian = tools
            .debian
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "tar".to_owned(),
                package: "tar".to_owned(),
            })?;
        let copy = scratch.path().join("notools.tar");
        std::fs::copy(base, &copy).map_err(|source| DockerError::Io {
            action: "copying the base root archive to",
            path: copy.clone(),
            source,
        })?;
        let mut args: Vec<OsString> = vec![
            "--delete".into(),
            "-f".into(),
            copy.clone().into_os_string(),
        ];
        args.extend(NOTOOLS_REMOVED.map(OsString::from));
        run_checked(&debian.tar, &args, &[], self.import_timeout).await?;
        self.say(&format!(
            "  removed {} from a copy of the base root",
            NOTOOLS_REMOVED.join(", ")
        ));
        Ok(copy)
    }

    /// Writes the BusyBox root as a tar archive in the scratch directory.
    async fn busybox_archive(
        &self,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<PathBuf, DockerError> {
        let busybox = tools
            .busybox
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "busybox".to_owned(),
                package: "busybox-static".to_owned(),
            })?;
        let listing = run_checked(
            busybox,
            &[OsString::from("--list-full")],
            &[],
            self.command_timeout,
        )
        .await?;
        let applets = applet_paths(&String::from_utf8_lossy(&listing.stdout));
        let binary = std::fs::read(&busybox.program).map_err(|source| DockerError::Io {
            action: "reading",
            path: busybox.program.clone(),
            source,
        })?;
        let bytes = busybox_root_tar(&binary, &applets).map_err(|source| DockerError::Io {
            action: "assembling the BusyBox root for",
            path: busybox.program.clone(),
            source,
        })?;
        let archive = scratch.path().join("busybox.tar");
        write_file(&archive, &bytes, 0o600)?;
        self.say(&format!(
            "  BusyBox root with {} applet links from {}",
            applets.len(),
            busybox.program.display()
        ));
        Ok(archive)
    }

    /// The engine's image import of a root-file-system tar (what `docker import` does), the
    /// archive streamed from disk.
    async fn import(&self, image: LocalImage, archive: &Path) -> Result<(), DockerError> {
        let changes = image.import_changes();
        self.say(&format!(
            "  image import as {image} ({})",
            changes.join("; ")
        ));
        let engine = self.engine().await?;
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(|source| DockerError::Io {
                action: "opening",
                path: archive.to_owned(),
                source,
            })?;
        let chunks = futures_util::stream::unfold(file, |mut file| async move {
            let mut buffer = vec![0u8; 1 << 20];
            match file.read(&mut buffer).await {
                Ok(0) => None,
                Ok(n) => {
                    buffer.truncate(n);
                    Some((Ok(bytes::Bytes::from(buffer)), file))
                }
                Err(error) => Some((Err(error), file)),
            }
        });
        let (repo, tag) = image
            .tag()
            .rsplit_once(':')
            .unwrap_or((image.tag(), "latest"));
        let mut options = bollard::query_parameters::CreateImageOptionsBuilder::new()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .build();
        options.changes = changes;
        let import = async {
            let body = bollard::body_try_stream(chunks);
            let mut progress = engine.api().create_image(Some(options), Some(body), None);
            while let Some(step) = futures_util::StreamExt::next(&mut progress).await {
                let step = step?;
                if let Some(error) = step.error_detail.and_then(|d| d.message) {
                    return Err(bollard::errors::Error::DockerStreamError { error });
                }
            }
            Ok(())
        };
        engine
            .call(self.import_timeout, import)
            .await
            .map_err(|failure| match failure {
                crate::connection::ApiFailure::Deadline(timeout) => DockerError::CommandTimedOut {
                    command: format!("image import of {}", image.tag()),
                    timeout,
                },
                other => unreachable_engine("image import", engine.failure("image import", other)),
            })
    }
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
}

#[derive(Debug)]
struct DebianTools {
    debootstrap: Tool,
    chroot: Tool,
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

/// The environment debootstrap and chroot'ed tools run with: a full sbin `PATH`, the C locale
/// (the root has no other), and no interactive package prompts.
fn chroot_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("PATH", IMAGE_PATH),
        ("LC_ALL", "C"),
        ("LANGUAGE", ""),
        ("DEBIAN_FRONTEND", "noninteractive"),
    ]
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
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

/// Empties the package caches debootstrap leaves (downloaded .debs and index files): they
/// only make the image larger.
fn trim_package_caches(root: &Path) -> Result<(), DockerError> {
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = root.join(dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if is_file && path.file_name() != Some(OsStr::new("lock")) {
                std::fs::remove_file(&path).map_err(|source| DockerError::Io {
                    action: "removing",
                    path: path.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

// ----- host facts -----

/// The effective uid of this process, from `/proc/self/status`.
fn effective_uid() -> Result<u32, DockerError> {
    let path = Path::new("/proc/self/status");
    let status = std::fs::read_to_string(path).map_err(|source| DockerError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    effective_uid_from_status(&status).ok_or_else(|| DockerError::Io {
        action: "finding the effective uid in",
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no readable Uid line"),
    })
}

/// The second field of the `Uid:` line (real, effective, saved, file-system).
fn effective_uid_from_status(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
}

const APT_SOURCE_FILES: &str =
    "/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources";

/// The Debian mirror in the host's apt sources to bootstrap [`DEBIAN_SUITE`] from.
fn mirror_from_apt_sources() -> Result<String, DockerError> {
    let mut files = Vec::new();
    let main = PathBuf::from("/etc/apt/sources.list");
    if let Ok(text) = std::fs::read_to_string(&main) {
        files.push((main, text));
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
        paths.sort();
        for path in paths {
            let apt_reads_it = matches!(
                path.extension().and_then(OsStr::to_str),
                Some("list" | "sources")
            );
            if apt_reads_it {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    files.push((path, text));
                }
            }
        }
    }
    debian_mirror(&files, DEBIAN_SUITE).ok_or_else(|| DockerError::NoDebianMirror {
        suite: DEBIAN_SUITE.to_owned(),
        searched: APT_SOURCE_FILES.to_owned(),
    })
}

/// One enabled `deb` source: its URIs and suites (components must include `main`).
#[derive(Debug, PartialEq, Eq)]
struct AptSource {
    uris: Vec<String>,
    suites: Vec<String>,
}

/// Picks the mirror for `suite`: the first `deb … main` source listing that exact suite, else
/// the first plain Debian archive (a URI ending in `/debian`) with any suite, which serves
/// every suite.
fn debian_mirror(files: &[(PathBuf, String)], suite: &str) -> Option<String> {
    let mut sources = Vec::new();
    for (path, text) in files {
        if path.extension().and_then(OsStr::to_str) == Some("sources") {
            sources.extend(parse_deb822_sources(text));
        } else {
            sources.extend(parse_one_line_sources(text));
        }
    }
    let exact = sources
        .iter()
        .find(|source| source.suites.iter().any(|s| s == suite))
        .and_then(|source| source.uris.first());
    let archive = || {
        sources
            .iter()
            .flat_map(|source| source.uris.iter())
            .find(|uri| uri.trim_end_matches('/').ends_with("/debian"))
    };
    exact
        .or_else(archive)
        .map(|uri| uri.trim_end_matches('/').to_owned())
}

/// `deb [options] uri suite component…` lines.
fn parse_one_line_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line
            .strip_prefix("deb ")
            .or_else(|| line.strip_prefix("deb\t"))
        else {
            continue;
        };
        let mut rest = rest.trim_start();
        if let Some(options) = rest.strip_prefix('[') {
            match options.split_once(']') {
                Some((_, after)) => rest = after.trim_start(),
                None => continue,
            }
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() >= 3 && fields[2..].contains(&"main") {
            sources.push(AptSource {
                uris: vec![fields[0].to_owned()],
                suites: vec![fields[1].to_owned()],
            });
        }
    }
    sources
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`), separated by blank
/// lines; `#` lines are comments.
fn parse_deb822_sources(text: &str) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for stanza in text.split("\n\n") {
        let mut fields: HashMap<String, String> = HashMap::new();
        let mut last: Option<String> = None;
        for line in stanza.lines() {
            if line.trim_start().starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with(' ') || line.starts_with('\t') {
                if let Some(key) = &last {
                    let value = fields.entry(key.clone()).or_default();
                    value.push(' ');
                    value.push_str(line.trim());
                }
                continue;
            }
            if let Some((key, value)) = line.split_once(':') {
                let key = key.trim().to_ascii_lowercase();
                fields.insert(key.clone(), value.trim().to_owned());
                last = Some(key);
            }
        }
        let words = |key: &str| -> Vec<String> {
            fields
                .get(key)
                .map(|value| value.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let enabled = fields
            .get("enabled")
            .is_none_or(|value| !value.eq_ignore_ascii_case("no"));
        if enabled
            && words("types").iter().any(|t| t == "deb")
            && words("components").iter().any(|c| c == "main")
        {
            sources.push(AptSource {
                uris: words("uris"),
                suites: words("suites"),
            });
        }
    }
    sources
}

/// Finds the host's BusyBox and checks it is statically linked (the image has no libc).
fn find_static_busybox() -> Result<PathBuf, DockerError> {
    let candidates = ["/bin/busybox", "/usr/bin/busybox"].map(PathBuf::from);
    let Some(path) = candidates.into_iter().find(|path| is_executable_file(path)) else {
        return Err(DockerError::HostToolMissing {
            program: "busybox".to_owned(),
            package: "busybox-static".to_owned(),
        });
    };
    let mut head = Vec::new();
    std::fs::File::open(&path)
        .and_then(|file| file.take(64 * 1024).read_to_end(&mut head))
        .map_err(|source| DockerError::Io {
            action: "reading",
            path: path.clone(),
            source,
        })?;
    match elf_static_check(&head) {
        Ok(()) => Ok(path),
        Err(reason) => Err(DockerError::BusyboxNotStatic { path, reason }),
    }
}

/// Accepts a 64-bit little-endian ELF file without a program interpreter (`PT_INTERP`).
fn elf_static_check(head: &[u8]) -> Result<(), String> {
    const PT_INTERP: u32 = 3;
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        return Err("not an ELF file".to_owned());
    }
    if head[4] != 2 || head[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".to_owned());
    }
    let u16_at = |at: usize| {
        head.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let phoff = head
        .get(0x20..0x28)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes);
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, u16_at(0x36), u16_at(0x38)) else {
        return Err("truncated ELF header".to_owned());
    };
    for index in 0..usize::from(phnum) {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|off| off.checked_add(index * usize::from(phentsize)));
        let kind = at
            .and_then(|at| head.get(at..at + 4))
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match kind {
            Some(PT_INTERP) => return Err("it is dynamically linked".to_owned()),
            Some(_) => {}
            None => return Err("program headers out of reach".to_owned()),
        }
    }
    Ok(())
}

/// The applet install paths from `busybox --list-full` (`bin/sh`, `usr/bin/env`, …), without
/// BusyBox itself and without anything that could escape the root.
fn applet_paths(listing: &str) -> Vec<String> {
    let mut paths: Vec<String> = listing
        .lines()
        .map(|line| line.trim().trim_start_matches('/').to_owned())
        .filter(|path| {
            !path.is_empty()
                && path != "bin/busybox"
                && path
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..")
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The BusyBox root as a tar: `/bin/busybox`, a link per applet, `/tmp` 1777, `/root`, the
/// agent's home, and `/etc/passwd` and `/etc/group` naming uid/gid 0 and 1000.
fn busybox_root_tar(busybox: &[u8], applets: &[String]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs: Vec<(String, u32, u32)> = vec![
        ("bin".into(), 0o755, 0),
        ("dev".into(), 0o755, 0),
        ("etc".into(), 0o755, 0),
        ("home".into(), 0o755, 0),
        (format!("home/{AGENT_USER}"), 0o755, AGENT_ID),
        ("proc".into(), 0o555, 0),
        ("root".into(), 0o700, 0),
        ("sys".into(), 0o555, 0),
        ("tmp".into(), 0o1777, 0),
        ("usr".into(), 0o755, 0),
        ("var".into(), 0o755, 0),
    ];
    for applet in applets {
        let mut parent = String::new();
        let parts: Vec<&str> = applet.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            if !dirs.iter().any(|(dir, _, _)| *dir == parent) {
                dirs.push((parent.clone(), 0o755, 0));
            }
        }
    }
    dirs.sort();
    for (dir, mode, owner) in &dirs {
        let mut header = tar_header(tar::EntryType::Directory, *mode, *owner);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }

    let mut header = tar_header(tar::EntryType::Regular, 0o755, 0);
    header.set_size(busybox.len() as u64);
    builder.append_data(&mut header, "bin/busybox", busybox)?;

    let passwd = format!(
        "root:x:0:0:root:/root:/bin/sh\n{AGENT_USER}:x:{AGENT_ID}:{AGENT_ID}:{AGENT_USER}:/home/{AGENT_USER}:/bin/sh\n"
    );
    let group = format!("root:x:0:\n{AGENT_USER}:x:{AGENT_ID}:\n");
    for (path, text) in [("etc/passwd", passwd), ("etc/group", group)] {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, 0);
        header.set_size(text.len() as u64);
        builder.append_data(&mut header, path, text.as_bytes())?;
    }

    for applet in applets {
        let mut header = tar_header(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut header, applet, "/bin/busybox")?;
    }
    builder.into_inner()
}

fn tar_header(kind: tar::EntryType, mode: u32, owner: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(owner.into());
    header.set_gid(owner.into());
    header.set_size(0);
    header.set_mtime(0);
    header
}

// ----- scratch space -----

/// A private (0700) directory for one build, removed on every exit. Removal first unmounts
/// whatever is mounted inside it and refuses to delete through a mount that stays.
#[derive(Debug)]
struct Scratch {
    path: Option<PathBuf>,
}

static SCRATCH_SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl Scratch {
    fn create(parent: &Path) -> Result<Scratch, DockerError> {
        let parent = ensure_dir(parent)?;
        let sequence = SCRATCH_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!(
            "maf-images-{}-{sequence}-{nanos:08x}",
            std::process::id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| DockerError::Io {
                action: "creating the scratch directory",
                path: path.clone(),
                source,
            })?;
        Ok(Scratch { path: Some(path) })
    }

    fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    /// Removes the directory, reporting what went wrong (drop only logs it).
    fn remove(mut self) -> Result<(), DockerError> {
        match self.path.take() {
            Some(path) => remove_tree(&path),
            None => Ok(()),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(error) = remove_tree(&path) {
                tracing::warn!(%error, "image scratch directory not removed");
            }
        }
    }
}

/// Removes `dir` and everything in it, after unmounting anything mounted inside it.
fn remove_tree(dir: &Path) -> Result<(), DockerError> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    unmount_under(dir);
    let left = mounts_under(dir)?;
    if !left.is_empty() {
        return Err(DockerError::ScratchMounted {
            path: dir.to_owned(),
            mounts: left
                .iter()
                .map(|m| m.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    std::fs::remove_dir_all(dir).map_err(|source| DockerError::Io {
        action: "removing",
        path: dir.to_owned(),
        source,
    })
}

/// Lazily unmounts every mount point inside `dir`, deepest first. Best effort: what stays is
/// caught by the check in [`remove_tree`].
fn unmount_under(dir: &Path) {
    let Ok(mounts) = mounts_under(dir) else {
        return;
    };
    for mount in mounts {
        let status = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mount)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            tracing::warn!(mount = %mount.display(), "could not unmount");
        }
    }
}

fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, DockerError> {
    let path = Path::new("/proc/self/mountinfo");
    let table = std::fs::read_to_string(path).map_err(|source| DockerError::Io {
        action: "reading",
        path: path.to_owned(),
        source,
    })?;
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    Ok(mount_points_under(&table, &dir))
}

/// Mount points in a `/proc/self/mountinfo` table that lie inside `dir` (or are `dir`),
/// deepest first.
fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_field(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect();
    found.sort_by_key(|mount| std::cmp::Reverse(mount.components().count()));
    found.dedup();
    found
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_mount_field(field: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt as _;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).filter(|digits| {
            bytes[index] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        });
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    OsString::from_vec(out)
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
        Err(exec_wrapper::Error::Spawn { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(DockerError::HostToolMissing {
                program: tool.program.display().to_string(),
                package: tool.package.to_owned(),
            })
        }
        Err(exec_wrapper::Error::Spawn { source, .. }) => Err(DockerError::Spawn {
            program: tool.program.display().to_string(),
            source,
        }),
        Err(exec_wrapper::Error::Deadline { bound, .. }) => Err(DockerError::CommandTimedOut {
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
    }

    #[test]
    fn mirror_comes_from_deb822_sources_for_the_suite() {
        let sources = "Types: deb\n# http://snapshot.example/archive\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n";
        let files = vec![(
            PathBuf::from("/etc/apt/sources.list.d/debian.sources"),
            sources.to_owned(),
        )];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
    }

    #[test]
    fn mirror_skips_disabled_stanzas_and_sources_without_main() {
        let sources = "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n\nTypes: deb\nURIs: http://contrib.example/debian\nSuites: bookworm\nComponents: contrib\n";
        let files = vec![(PathBuf::from("a.sources"), sources.to_owned())];
        assert_eq!(debian_mirror(&files, "bookworm"), None);
    }

    #[test]
    fn mirror_comes_from_one_line_sources_with_options() {
        let list = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] https://other.example/apt stable main\ndeb http://ftp.example/debian bookworm main contrib # trailing\n";
        let files = vec![(PathBuf::from("/etc/apt/sources.list"), list.to_owned())];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://ftp.example/debian")
        );
    }

    #[test]
    fn mirror_falls_back_to_a_debian_archive_of_another_suite() {
        let list = "deb https://vendor.example/apt stable main\ndeb http://ftp.example/debian/ trixie main\n";
        let files = vec![(PathBuf::from("sources.list"), list.to_owned())];
        assert_eq!(
            debian_mirror(&files, "bookworm").as_deref(),
            Some("http://ftp.example/debian")
        );
        let vendor_only = vec![(
            PathBuf::from("sources.list"),
            "deb https://vendor.example/apt stable main\n".to_owned(),
        )];
        assert_eq!(debian_mirror(&vendor_only, "bookworm"), None);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(effective_uid_from_status(status), Some(0));
        assert_eq!(effective_uid_from_status("Name:\tx\n"), None);
    }

    #[test]
    fn mount_points_inside_the_scratch_dir_are_found_deepest_first() {
        let table = "\
22 1 0:21 / / rw - overlay overlay rw
30 22 0:5 / /tmp/maf-images-1/root-base/proc rw - proc proc rw
31 22 0:6 / /tmp/maf-images-1/root-base/sys rw - sysfs sysfs rw
32 30 0:7 / /tmp/maf-images-1/root-base/proc/sys/fs/binfmt_misc rw - binfmt_misc x rw
33 22 0:8 / /tmp/maf-images-10/root rw - tmpfs t rw
34 22 0:9 / /tmp/with\\040space/x rw - tmpfs t rw
";
        let found = mount_points_under(table, Path::new("/tmp/maf-images-1"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/tmp/maf-images-1/root-base/proc/sys/fs/binfmt_misc"),
                PathBuf::from("/tmp/maf-images-1/root-base/proc"),
                PathBuf::from("/tmp/maf-images-1/root-base/sys"),
            ]
        );
        assert_eq!(
            mount_points_under(table, Path::new("/tmp/with space")),
            vec![PathBuf::from("/tmp/with space/x")]
        );
    }

    fn elf_with_program_headers(kinds: &[u32]) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56 * kinds.len()];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::try_from(kinds.len()).unwrap().to_le_bytes());
        for (index, kind) in kinds.iter().enumerate() {
            let at = 64 + 56 * index;
            elf[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        }
        elf
    }

    #[test]
    fn static_elf_is_accepted_and_dynamic_or_foreign_refused() {
        assert_eq!(
            elf_static_check(&elf_with_program_headers(&[6, 1, 1])),
            Ok(())
        );
        let dynamic = elf_static_check(&elf_with_program_headers(&[6, 3, 1])).unwrap_err();
        assert!(dynamic.contains("dynamically linked"), "{dynamic}");
        assert!(elf_static_check(b"#!/bin/sh\necho not elf\n").is_err());
        let mut truncated = elf_with_program_headers(&[1, 1]);
        truncated.truncate(80);
        assert!(elf_static_check(&truncated).is_err());
    }

    #[test]
    fn applet_paths_drop_busybox_itself_and_escapes() {
        let listing = "bin/sh\nusr/bin/env\nbin/busybox\n/bin/ls\nbin/../../etc/x\n\nbin/sh\n";
        assert_eq!(
            applet_paths(listing),
            vec!["bin/ls", "bin/sh", "usr/bin/env"]
        );
    }

    #[test]
    fn busybox_root_has_links_users_and_a_sticky_tmp() {
        let applets = vec!["bin/sh".to_owned(), "usr/sbin/chroot".to_owned()];
        let bytes = busybox_root_tar(b"\x7fELF fake", &applets).unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        struct Seen {
            kind: tar::EntryType,
            mode: u32,
            uid: u64,
            link: Option<String>,
            body: Vec<u8>,
        }
        let mut seen: HashMap<String, Seen> = HashMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let header = entry.header().clone();
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            let record = Seen {
                kind: header.entry_type(),
                mode: header.mode().unwrap(),
                uid: header.uid().unwrap(),
                link,
                body,
            };
            seen.insert(path.trim_end_matches('/').to_owned(), record);
        }
        assert_eq!(seen["tmp"].mode, 0o1777);
        assert_eq!(seen["home/agent"].uid, 1000);
        assert_eq!(seen["usr/sbin"].kind, tar::EntryType::Directory);
        assert_eq!(seen["bin/busybox"].body, b"\x7fELF fake");
        assert_eq!(seen["bin/busybox"].mode, 0o755);
        assert_eq!(seen["bin/sh"].kind, tar::EntryType::Symlink);
        assert_eq!(seen["bin/sh"].link.as_deref(), Some("/bin/busybox"));
        assert_eq!(
            seen["usr/sbin/chroot"].link.as_deref(),
            Some("/bin/busybox")
        );
        let passwd = String::from_utf8(seen["etc/passwd"].body.clone()).unwrap();
        assert!(passwd.contains("agent:x:1000:1000:"), "{passwd}");
        let group = String::from_utf8(seen["etc/group"].body.clone()).unwrap();
        assert!(group.contains("agent:x:1000:"), "{group}");
    }

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
    fn scratch_is_private_and_removed_with_its_contents() {
        let parent = std::env::temp_dir();
        let scratch = Scratch::create(&parent).unwrap();
        let path = scratch.path().to_owned();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::write(path.join("a/b/file"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", path.join("a/link-to-etc")).unwrap();
        scratch.remove().unwrap();
        assert!(!path.exists());
        assert!(Path::new("/etc").exists());

        let dropped = Scratch::create(&parent).unwrap();
        let dropped_path = dropped.path().to_owned();
        drop(dropped);
        assert!(!dropped_path.exists());
    }
}
