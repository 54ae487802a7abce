//! The VM image: a PVH kernel, the initramfs (the agent as `/init` plus the modules it loads)
//! and an ext4 root file system, each cached under a directory by the digest of what it is
//! made from (`docs/vm.md#image`).
//!
//! The kernel comes from the host's Debian kernel package: `/boot/vmlinuz-<release>` is a
//! bzImage whose payload is xz-compressed; the uncompressed ELF `vmlinux` inside it boots
//! through PVH on QEMU's `microvm` machine, so it is extracted once. The modules come from
//! `/lib/modules/<release>`, with their dependencies from `modules.dep`, in load order. The
//! root file system is made from a tar archive of a root the caller supplies (the workspace's
//! one Debian recipe) and the static programs the caller adds to it (the workspace's
//! `host-tool`) with `mkfs.ext4 -d`; the programs' digests are part of its name, so a root
//! around another build of them is made again, never reused.
//!
//! Not here: downloading anything; the host must have the kernel package installed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};
use sha2::{Digest, Sha256};

use crate::cpio::{self, Member};
use crate::error::VmError;

/// The modules the agent loads, in order; each one's dependencies are added before it.
pub const MODULES: [&str; 7] = [
    "virtio_mmio",
    "virtio_blk",
    "virtio_console",
    "crc32c_generic",
    "crc16",
    "jbd2",
    "ext4",
];

/// Bumped whenever the initramfs layout or the root file system recipe changes.
const RECIPE_VERSION: u32 = 1;

/// The most a decompressed kernel may be.
const MAX_VMLINUX: usize = 256 * 1024 * 1024;

/// The deadline of each host tool the recipe runs.
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);

/// Free space the root file system gets beyond its contents, MiB.
const ROOT_HEADROOM_MIB: u64 = 768;

/// The manifest file [`VmImage::load`] reads.
pub const MANIFEST: &str = "vm-image.json";

/// The target the guest agent is built for: the host's own triple, statically linked by
/// [`AGENT_RUSTFLAGS`] (the initramfs has no C library or loader).
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The `RUSTFLAGS` the guest agent is built with for [`AGENT_TARGET`]. Every builder of the
/// agent passes these exact flags, so one build's output is the next one's cache hit.
pub const AGENT_RUSTFLAGS: &str = "-C target-feature=+crt-static";

/// The variable naming the user cache directory itself, before the XDG and home defaults.
const CACHE_VAR: &str = "SANDBOX_VM_CACHE";

/// The variable naming an image directory that overrides the default one.
pub const IMAGE_VAR: &str = "QEMU_VM_IMAGE";

/// Where the VM image, and the root archive it is made from, are cached for this user:
/// `$SANDBOX_VM_CACHE`, else `$XDG_CACHE_HOME/sandboxes`, else `$HOME/.cache/sandboxes` (empty
/// values count as unset).
///
/// # Errors
/// [`VmError::NoCacheDir`] when none of the three is set.
pub fn user_cache_dir() -> Result<PathBuf, VmError> {
    cache_dir_from(|name| std::env::var_os(name))
}

/// The image directory every host and builder uses unless told otherwise:
/// `vm-image` under [`user_cache_dir`].
///
/// # Errors
/// As [`user_cache_dir`].
pub fn default_image_dir() -> Result<PathBuf, VmError> {
    Ok(user_cache_dir()?.join("vm-image"))
}

/// The image directory `$QEMU_VM_IMAGE` names, else [`default_image_dir`]: what the tests,
/// benches and suites that boot VMs use.
///
/// # Errors
/// As [`user_cache_dir`], when `$QEMU_VM_IMAGE` is unset.
pub fn given_image_dir() -> Result<PathBuf, VmError> {
    match non_empty(std::env::var_os(IMAGE_VAR)) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => default_image_dir(),
    }
}

fn non_empty(value: Option<std::ffi::OsString>) -> Option<std::ffi::OsString> {
    value.filter(|value| !value.is_empty())
}

fn cache_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf, VmError> {
    let var = |name| non_empty(var(name));
    if let Some(dir) = var(CACHE_VAR) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("sandboxes"));
    }
    var("HOME")
        .map(|home| PathBuf::from(home).join(".cache/sandboxes"))
        .ok_or_else(VmError::no_cache_dir)
}

/// A built image: three files, and the digest that names the combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmImage {
    /// The uncompressed PVH kernel.
    pub kernel: PathBuf,
    /// The initramfs (uncompressed `newc` cpio).
    pub initramfs: PathBuf,
    /// The ext4 root file system; VMs attach it copy-on-write and never write it.
    pub rootfs: PathBuf,
    /// The kernel release the modules belong to.
    pub kernel_release: String,
    /// A digest of the three parts.
    pub digest: String,
}

impl VmImage {
    /// The image whose manifest `cargo xtask images` wrote in `dir`. The manifest names its
    /// parts relative to `dir`, so the directory can move (a target directory restored from a
    /// cache elsewhere) and still load; an absolute name, as older manifests wrote, is taken as
    /// it is.
    ///
    /// # Errors
    /// Io when the manifest is missing or unreadable; Invalid when a listed file is gone.
    pub fn load(dir: &Path) -> Result<VmImage, VmError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| VmError::io("reading", &path, e))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| VmError::Invalid(format!("{}: {e}", path.display())))?;
        let field = |name: &str| -> Result<String, VmError> {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .ok_or_else(|| VmError::Invalid(format!("{}: no {name}", path.display())))
        };
        let part = |name: &str| field(name).map(|listed| dir.join(listed));
        let image = VmImage {
            kernel: part("kernel")?,
            initramfs: part("initramfs")?,
            rootfs: part("rootfs")?,
            kernel_release: field("kernel_release")?,
            digest: field("digest")?,
        };
        for file in [&image.kernel, &image.initramfs, &image.rootfs] {
            if !file.is_file() {
                return Err(VmError::Invalid(format!(
                    "{} lists {}, which is gone",
                    path.display(),
                    file.display()
                )));
            }
        }
        Ok(image)
    }

    /// Writes the manifest [`VmImage::load`] reads, naming each part under `dir` relative to it.
    fn write_manifest(&self, dir: &Path) -> Result<(), VmError> {
        let listed = |part: &Path| part.strip_prefix(dir).unwrap_or(part).to_path_buf();
        let value = serde_json::json!({
            "kernel": listed(&self.kernel),
            "initramfs": listed(&self.initramfs),
            "rootfs": listed(&self.rootfs),
            "kernel_release": self.kernel_release,
            "digest": self.digest,
        });
        write_atomic(&dir.join(MANIFEST), value.to_string().as_bytes())
    }
}

/// A static program the root file system carries beyond its archive: written at `guest_path`,
/// owned by root, mode 0755.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestProgram {
    /// Its absolute path in the guest (no `.` or `..` component).
    pub guest_path: String,
    /// The static x86-64 executable on the host.
    pub binary: PathBuf,
}

/// What an image is made from.
#[derive(Debug, Clone)]
pub struct ImageRecipe {
    /// Where the parts are cached (by digest) and the manifest is written.
    pub cache_dir: PathBuf,
    /// The static agent binary (the initramfs's `/init`).
    pub agent: PathBuf,
    /// A tar archive of the root file system.
    pub root_archive: PathBuf,
    /// The static programs added to the root (none: the archive's root alone).
    pub programs: Vec<GuestProgram>,
    /// The kernel release; `None` picks the newest `/boot/vmlinuz-*` with modules.
    pub kernel_release: Option<String>,
    /// Where kernels and modules are read from (`/` normally).
    pub host_root: PathBuf,
}

/// A sink for progress lines.
pub type Progress<'a> = &'a (dyn Fn(&str) + Send + Sync);

impl ImageRecipe {
    /// Builds whatever part is missing from the cache, writes the manifest, returns the image.
    ///
    /// # Errors
    /// Kernel when the kernel image holds no usable payload; Io, Spawn or ToolFailed when a
    /// step fails (`xz`, `tar` and `mkfs.ext4` are run under deadlines).
    ///
    /// # Cancel safety and drop
    /// Parts are written to temporary names and renamed into place when complete; a dropped
    /// build leaves at most a temporary file or directory under the cache.
    pub async fn build(&self, progress: Progress<'_>) -> Result<VmImage, VmError> {
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(|e| VmError::io("creating", &self.cache_dir, e))?;
        let release = match &self.kernel_release {
            Some(release) => release.clone(),
            None => newest_kernel(&self.host_root)?,
        };
        let kernel = self.kernel(&release, progress).await?;
        let initramfs = self.initramfs(&release, progress)?;
        let rootfs = self.rootfs(progress).await?;
        let mut digest = Sha256::new();
        for part in [&kernel, &initramfs, &rootfs] {
            digest.update(
                part.file_name()
                    .map(|n| n.as_encoded_bytes())
                    .unwrap_or(b""),
            );
        }
        let image = VmImage {
            kernel,
            initramfs,
            rootfs,
            kernel_release: release,
            digest: hex(&digest.finalize())[..16].to_owned(),
        };
        image.write_manifest(&self.cache_dir)?;
        progress(&format!("vm image {} ready", image.digest));
        Ok(image)
    }

    async fn kernel(&self, release: &str, progress: Progress<'_>) -> Result<PathBuf, VmError> {
        let vmlinuz = self
            .host_root
            .join("boot")
            .join(format!("vmlinuz-{release}"));
        let bytes = std::fs::read(&vmlinuz).map_err(|e| VmError::io("reading", &vmlinuz, e))?;
        let out = self
            .cache_dir
            .join(format!("vmlinux-{release}-{}", &digest_of(&bytes)[..16]));
        if out.is_file() {
            progress(&format!("kernel: cached {}", out.display()));
            return Ok(out);
        }
        progress(&format!(
            "kernel: extracting vmlinux from {}",
            vmlinuz.display()
        ));
        let vmlinux = extract_vmlinux(&vmlinuz, &bytes).await?;
        write_atomic(&out, &vmlinux)?;
        Ok(out)
    }

    fn initramfs(&self, release: &str, progress: Progress<'_>) -> Result<PathBuf, VmError> {
        let agent =
            std::fs::read(&self.agent).map_err(|e| VmError::io("reading", &self.agent, e))?;
        if !is_static_elf(&agent) {
            // The initramfs has no C library or loader: a dynamic agent would not start.
            return Err(VmError::Invalid(format!(
                "{} is not a static x86-64 ELF executable (build it with +crt-static)",
                self.agent.display()
            )));
        }
        let modules_dir = self.host_root.join("lib/modules").join(release);
        let modules = module_load_order(&modules_dir, &MODULES)?;
        let mut blobs = Vec::new();
        for (name, path) in &modules {
            let bytes = std::fs::read(path).map_err(|e| VmError::io("reading", path, e))?;
            blobs.push((format!("modules/{name}.ko"), bytes));
        }
        let order: String = modules
            .iter()
            .map(|(name, _)| format!("{name}\n"))
            .collect();
        let mut members = vec![
            Member::Dir("dev"),
            Member::CharDev("dev/console", 5, 1),
            Member::CharDev("dev/null", 1, 3),
            Member::Dir("proc"),
            Member::Dir("sys"),
            Member::Dir("newroot"),
            Member::Dir("modules"),
            Member::File("init", 0o755, &agent),
            Member::File("modules/order", 0o644, order.as_bytes()),
        ];
        for (name, bytes) in &blobs {
            members.push(Member::File(name, 0o644, bytes));
        }
        let archive = cpio::archive(&members);
        let digest = digest_of(&archive);
        let out = self.cache_dir.join(format!(
            "initramfs-v{RECIPE_VERSION}-{}.cpio",
            &digest[..16]
        ));
        if !out.is_file() {
            write_atomic(&out, &archive)?;
        }
        progress(&format!(
            "initramfs: {} ({} modules: {})",
            out.display(),
            modules.len(),
            order.trim().replace('\n', " ")
        ));
        Ok(out)
    }

    async fn rootfs(&self, progress: Progress<'_>) -> Result<PathBuf, VmError> {
        let programs = self.read_programs()?;
        let digest = rootfs_digest(&file_digest(&self.root_archive)?, &programs);
        let out = self
            .cache_dir
            .join(format!("rootfs-v{RECIPE_VERSION}-{}.ext4", &digest[..16]));
        if out.is_file() {
            progress(&format!("root file system: cached {}", out.display()));
            return Ok(out);
        }
        progress(&format!(
            "root file system: mkfs.ext4 -d from {}",
            self.root_archive.display()
        ));
        for (program, bytes) in &programs {
            progress(&format!(
                "root file system: {} ({} bytes) at {}",
                program.binary.display(),
                bytes.len(),
                program.guest_path
            ));
        }
        let tree = self
            .cache_dir
            .join(format!("rootfs-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree).map_err(|e| VmError::io("creating", &tree, e))?;
        let built = async {
            run_tool(
                "tar",
                &[
                    "--numeric-owner".as_ref(),
                    "-xpf".as_ref(),
                    self.root_archive.as_os_str(),
                    "-C".as_ref(),
                    tree.as_os_str(),
                ],
            )
            .await?;
            // Where the agent mounts cgroup v2 and its tmpfs.
            for dir in ["sys/fs/cgroup", "tmp", "dev/pts"] {
                let _ = std::fs::create_dir_all(tree.join(dir));
            }
            for (program, bytes) in &programs {
                write_program(&tree, &program.guest_path, bytes)?;
            }
            let used_mib = tree_size(&tree) / (1024 * 1024);
            let size = format!("{}M", used_mib + ROOT_HEADROOM_MIB);
            let partial = out.with_extension("partial");
            let _ = std::fs::remove_file(&partial);
            run_tool(
                "mkfs.ext4",
                &[
                    "-q".as_ref(),
                    "-F".as_ref(),
                    "-L".as_ref(),
                    "sbxroot".as_ref(),
                    "-d".as_ref(),
                    tree.as_os_str(),
                    partial.as_os_str(),
                    size.as_ref(),
                ],
            )
            .await?;
            std::fs::rename(&partial, &out).map_err(|e| VmError::io("renaming", &partial, e))
        }
        .await;
        let _ = std::fs::remove_dir_all(&tree);
        built?;
        Ok(out)
    }
}

impl ImageRecipe {
    /// Each program with its bytes, refused unless its guest path is plain and absolute and
    /// it is a static x86-64 executable (the guest's C library is not the host's).
    fn read_programs(&self) -> Result<Vec<(&GuestProgram, Vec<u8>)>, VmError> {
        self.programs
            .iter()
            .map(|program| {
                if guest_relative(&program.guest_path).is_none() {
                    return Err(VmError::Invalid(format!(
                        "a guest program's path must be absolute and plain, not {:?}",
                        program.guest_path
                    )));
                }
                let bytes = std::fs::read(&program.binary)
                    .map_err(|e| VmError::io("reading", &program.binary, e))?;
                if !is_static_elf(&bytes) {
                    return Err(VmError::Invalid(format!(
                        "{} is not a static x86-64 ELF executable (build it with +crt-static)",
                        program.binary.display()
                    )));
                }
                Ok((program, bytes))
            })
            .collect()
    }
}

/// `path` under a root: absolute, without `.` or `..` components, naming a file.
fn guest_relative(path: &str) -> Option<PathBuf> {
    let relative = path.strip_prefix('/')?;
    let plain = !relative.is_empty()
        && relative
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    plain.then(|| PathBuf::from(relative))
}

/// The digest that names a root file system: its archive's alone when it carries no program
/// (the name roots made before programs existed have), else over the archive's and each
/// program's path and bytes.
fn rootfs_digest(archive_digest: &str, programs: &[(&GuestProgram, Vec<u8>)]) -> String {
    if programs.is_empty() {
        return archive_digest.to_owned();
    }
    let mut digest = Sha256::new();
    digest.update(archive_digest.as_bytes());
    for (program, bytes) in programs {
        digest.update(b"\n");
        digest.update(program.guest_path.as_bytes());
        digest.update(b"\0");
        digest.update(digest_of(bytes).as_bytes());
    }
    hex(&digest.finalize())
}

/// Writes a program into the extracted root at `guest_path`, its missing directories 0755.
fn write_program(tree: &Path, guest_path: &str, bytes: &[u8]) -> Result<(), VmError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let relative = guest_relative(guest_path).ok_or_else(|| {
        VmError::Invalid(format!(
            "a guest program's path is not plain: {guest_path:?}"
        ))
    })?;
    let path = tree.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| VmError::io("creating", parent, e))?;
    }
    std::fs::write(&path, bytes).map_err(|e| VmError::io("writing", &path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| VmError::io("setting the mode of", &path, e))?;
    // Root's, as the rest of the extracted root is: a build that can keep the archive's owners
    // runs as root, and one that cannot has a root of its own user anyway.
    if let Err(error) = std::os::unix::fs::chown(&path, Some(0), Some(0)) {
        if error.kind() != std::io::ErrorKind::PermissionDenied {
            return Err(VmError::io("changing the owner of", &path, error));
        }
    }
    Ok(())
}

/// The newest kernel release with both an image in `/boot` and modules.
fn newest_kernel(root: &Path) -> Result<String, VmError> {
    let boot = root.join("boot");
    let entries = std::fs::read_dir(&boot).map_err(|e| VmError::io("listing", &boot, e))?;
    let mut releases: Vec<String> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("vmlinuz-").map(str::to_owned)
        })
        .filter(|release| root.join("lib/modules").join(release).is_dir())
        .collect();
    releases.sort();
    releases.pop().ok_or_else(|| VmError::Kernel {
        path: boot,
        message: "no vmlinuz-* with modules (install linux-image-amd64)".to_owned(),
    })
}

/// The modules to load for `wanted`, dependencies first, each once: (name, path).
///
/// # Errors
/// Io when `modules.dep` is unreadable; Kernel when a module is missing or compressed.
pub fn module_load_order(
    modules_dir: &Path,
    wanted: &[&str],
) -> Result<Vec<(String, PathBuf)>, VmError> {
    let dep_path = modules_dir.join("modules.dep");
    let text =
        std::fs::read_to_string(&dep_path).map_err(|e| VmError::io("reading", &dep_path, e))?;
    let mut deps = std::collections::HashMap::new();
    for line in text.lines() {
        let Some((module, rest)) = line.split_once(':') else {
            continue;
        };
        deps.insert(
            module_name(module),
            (
                module.to_owned(),
                rest.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            ),
        );
    }
    let mut order: Vec<(String, PathBuf)> = Vec::new();
    fn visit(
        name: &str,
        deps: &std::collections::HashMap<String, (String, Vec<String>)>,
        dir: &Path,
        order: &mut Vec<(String, PathBuf)>,
        depth: usize,
    ) -> Result<(), VmError> {
        if order.iter().any(|(n, _)| n == name) || depth > 32 {
            return Ok(());
        }
        let Some((path, needs)) = deps.get(name) else {
            return Err(VmError::Kernel {
                path: dir.join("modules.dep"),
                message: format!("module {name} is not there (built in, or another kernel)"),
            });
        };
        if !path.ends_with(".ko") {
            return Err(VmError::Kernel {
                path: dir.join(path),
                message: "compressed modules are not supported".to_owned(),
            });
        }
        // modules.dep lists the nearest dependency first; modprobe loads from the end.
        for need in needs.iter().rev() {
            visit(&module_name(need), deps, dir, order, depth + 1)?;
        }
        order.push((name.to_owned(), dir.join(path)));
        Ok(())
    }
    for name in wanted {
        visit(name, &deps, modules_dir, &mut order, 0)?;
    }
    Ok(order)
}

fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split('.').next().unwrap_or(file).replace('-', "_")
}

/// The ELF `vmlinux` inside a bzImage: the xz payload found by its magic and decompressed by
/// `xz --single-stream` (which stops at the stream's end, ignoring the trailer).
async fn extract_vmlinux(path: &Path, bytes: &[u8]) -> Result<Vec<u8>, VmError> {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let mut from = 0;
    while let Some(offset) = bytes[from..]
        .windows(XZ_MAGIC.len())
        .position(|w| w == XZ_MAGIC)
    {
        let at = from + offset;
        let output = BoundedCommand::new("xz", TOOL_TIMEOUT)
            .args(["-dcq", "--single-stream"])
            .env("PATH", TOOL_PATH)
            .stdin(bytes[at..].to_vec())
            .output_budget(MAX_VMLINUX)
            .run()
            .await
            .map_err(|e| VmError::ToolFailed {
                command: "xz -dc".to_owned(),
                status: e.to_string(),
                stderr: String::new(),
            })?;
        if output.stdout.starts_with(b"\x7fELF") {
            return Ok(output.stdout);
        }
        from = at + 1;
    }
    Err(VmError::Kernel {
        path: path.to_owned(),
        message: "no xz payload decompressing to an ELF image".to_owned(),
    })
}

/// The `PATH` host tools are looked up in (the runner passes no environment of ours).
const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

async fn run_tool(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), VmError> {
    let output = BoundedCommand::new(program, TOOL_TIMEOUT)
        .args(args.iter().map(|a| a.to_os_string()))
        .env("PATH", TOOL_PATH)
        .output_budget(1024 * 1024)
        .run()
        .await
        .map_err(|e| VmError::Spawn {
            program: program.to_owned(),
            source: std::io::Error::other(e.to_string()),
        })?;
    if output.status != ExitKind::Exited(0) {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(VmError::ToolFailed {
            command: format!(
                "{program} {}",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            status: format!("{:?}", output.status),
            stderr: stderr
                .chars()
                .rev()
                .take(2000)
                .collect::<String>()
                .chars()
                .rev()
                .collect(),
        });
    }
    Ok(())
}

/// Whether `bytes` is a 64-bit little-endian ELF executable without a program interpreter.
pub fn is_static_elf(bytes: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        bytes.get(at..at + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    if !bytes.starts_with(b"\x7fELF\x02\x01") || u16_at(18) != Some(62) {
        return false;
    }
    let (Some(phoff), Some(size), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..usize::from(count)).all(|i| {
        let at = (phoff as usize).saturating_add(i * usize::from(size));
        matches!(u32_at(at), Some(kind) if kind != PT_INTERP)
    })
}

fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            }
            total += meta.len() + 4096;
        }
    }
    total
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), VmError> {
    let partial = path.with_extension("partial");
    let mut file =
        std::fs::File::create(&partial).map_err(|e| VmError::io("creating", &partial, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| VmError::io("writing", &partial, e))?;
    std::fs::rename(&partial, path).map_err(|e| VmError::io("renaming", &partial, e))
}

fn digest_of(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn file_digest(path: &Path) -> Result<String, VmError> {
    let mut file = std::fs::File::open(path).map_err(|e| VmError::io("opening", path, e))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| VmError::io("reading", path, e))?;
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_absolute_guest_paths_name_a_program() {
        assert_eq!(
            guest_relative("/usr/local/bin/host-tool"),
            Some(PathBuf::from("usr/local/bin/host-tool"))
        );
        for bad in [
            "usr/local/bin/x",
            "/",
            "/usr/../etc/passwd",
            "/usr/./bin",
            "/usr//bin",
            "/usr/bin/",
        ] {
            assert_eq!(guest_relative(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_root_is_named_by_its_programs_too() {
        let program = GuestProgram {
            guest_path: "/usr/local/bin/host-tool".to_owned(),
            binary: PathBuf::from("/x"),
        };
        assert_eq!(rootfs_digest("abc", &[]), "abc");
        let one = rootfs_digest("abc", &[(&program, b"one".to_vec())]);
        let other = rootfs_digest("abc", &[(&program, b"two".to_vec())]);
        assert_ne!(one, "abc");
        assert_ne!(one, other, "another build of a program names another root");
        let moved = GuestProgram {
            guest_path: "/usr/bin/host-tool".to_owned(),
            ..program.clone()
        };
        assert_ne!(one, rootfs_digest("abc", &[(&moved, b"one".to_vec())]));
    }

    #[test]
    fn a_program_is_written_root_owned_and_executable_under_the_tree() {
        use std::os::unix::fs::MetadataExt as _;
        let tree = tempfile::tempdir().unwrap();
        write_program(tree.path(), "/usr/local/bin/host-tool", b"program").unwrap();
        let path = tree.path().join("usr/local/bin/host-tool");
        assert_eq!(std::fs::read(&path).unwrap(), b"program");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o755);
        if rustix::process::geteuid().is_root() {
            assert_eq!((meta.uid(), meta.gid()), (0, 0));
        }
        assert!(write_program(tree.path(), "/../escape", b"x").is_err());
    }

    #[test]
    fn a_dynamic_program_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("host-tool");
        std::fs::write(&script, b"#!/bin/sh\n").unwrap();
        let recipe = ImageRecipe {
            cache_dir: dir.path().to_path_buf(),
            agent: script.clone(),
            root_archive: script.clone(),
            programs: vec![GuestProgram {
                guest_path: "/usr/local/bin/host-tool".to_owned(),
                binary: script,
            }],
            kernel_release: None,
            host_root: PathBuf::from("/"),
        };
        let refused = recipe.read_programs().unwrap_err();
        assert!(refused.to_string().contains("static"), "{refused}");
    }

    #[test]
    fn a_manifest_names_its_parts_relative_to_its_directory_and_moves_with_it() {
        let built = tempfile::tempdir().unwrap();
        let image = VmImage {
            kernel: built.path().join("vmlinux-a"),
            initramfs: built.path().join("initramfs-b.cpio"),
            rootfs: built.path().join("rootfs-c.ext4"),
            kernel_release: "6.1.0-test".to_owned(),
            digest: "0123456789abcdef".to_owned(),
        };
        for part in [&image.kernel, &image.initramfs, &image.rootfs] {
            std::fs::write(part, b"part").unwrap();
        }
        image.write_manifest(built.path()).unwrap();
        let text = std::fs::read_to_string(built.path().join(MANIFEST)).unwrap();
        assert!(
            !text.contains(built.path().to_str().unwrap()),
            "no absolute path: {text}"
        );
        assert_eq!(VmImage::load(built.path()).unwrap(), image);

        // The directory moved: the image loads from where it is now.
        let parent = tempfile::tempdir().unwrap();
        let moved = parent.path().join("vm-image");
        std::fs::rename(built.path(), &moved).unwrap();
        let loaded = VmImage::load(&moved).unwrap();
        assert_eq!(loaded.rootfs, moved.join("rootfs-c.ext4"));
        assert_eq!(loaded.kernel, moved.join("vmlinux-a"));
        assert_eq!(loaded.digest, image.digest);

        // An older manifest's absolute names are taken as they are.
        let absolute = serde_json::json!({
            "kernel": moved.join("vmlinux-a"),
            "initramfs": moved.join("initramfs-b.cpio"),
            "rootfs": moved.join("rootfs-c.ext4"),
            "kernel_release": "6.1.0-test",
            "digest": "0123456789abcdef",
        });
        std::fs::write(moved.join(MANIFEST), absolute.to_string()).unwrap();
        assert_eq!(VmImage::load(&moved).unwrap(), loaded);

        // A part gone is an error naming it.
        std::fs::remove_file(moved.join("initramfs-b.cpio")).unwrap();
        let gone = VmImage::load(&moved).unwrap_err().to_string();
        assert!(gone.contains("initramfs-b.cpio"), "{gone}");
    }

    #[test]
    fn the_cache_directory_is_the_override_then_xdg_then_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let all = env(&[
            ("SANDBOX_VM_CACHE", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(cache_dir_from(all).unwrap(), PathBuf::from("/c"));
        let xdg = env(&[
            ("SANDBOX_VM_CACHE", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(cache_dir_from(xdg).unwrap(), PathBuf::from("/x/sandboxes"));
        let home = env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]);
        assert_eq!(
            cache_dir_from(home).unwrap(),
            PathBuf::from("/h/.cache/sandboxes")
        );
        let none = cache_dir_from(env(&[("HOME", "")])).unwrap_err();
        assert!(matches!(none, VmError::NoCacheDir), "{none}");
        assert!(none.to_string().contains("SANDBOX_VM_CACHE"), "{none}");
    }

    #[test]
    fn only_a_static_executable_is_an_agent() {
        let this = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // A test binary is dynamic (no +crt-static in a normal build).
        assert!(!is_static_elf(&this));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[18] = 62;
        elf[0x20] = 64;
        elf[0x36] = 56;
        elf[0x38] = 1;
        elf[64] = 1; // PT_LOAD
        assert!(is_static_elf(&elf));
        elf[64] = 3; // PT_INTERP
        assert!(!is_static_elf(&elf));
    }

    #[test]
    fn dependencies_load_before_their_users_and_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("modules.dep"),
            "kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko\n\
             kernel/lib/crc16.ko:\nkernel/fs/mbcache.ko:\nkernel/fs/jbd2/jbd2.ko:\n\
             kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/virtio/virtio_ring.ko:\n",
        )
        .unwrap();
        let order = module_load_order(dir.path(), &["virtio", "jbd2", "ext4"]).unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["virtio_ring", "virtio", "jbd2", "mbcache", "crc16", "ext4"]
        );
        assert!(matches!(
            module_load_order(dir.path(), &["nope"]),
            Err(VmError::Kernel { .. })
        ));
    }
}
