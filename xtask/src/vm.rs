//! The microVM image and its live suite (`docs/vm.md`).
//!
//! `cargo xtask images vm` builds the static guest agent and the images' static binaries
//! (release, `+crt-static`; the root carries the same `host-tool` the engine images do), takes
//! the base Debian root archive from the one image recipe (`backend_docker::ImageRecipe`, which
//! bootstraps it when the cache lacks it) and hands them to `qemu_vm::ImageRecipe`, which
//! extracts the kernel, writes the initramfs and makes the ext4 root, each cached by digest
//! in the directory every host reads by default (`qemu_vm::default_image_dir`), or the one
//! `QEMU_VM_IMAGE` names. `cargo xtask e2e vm` builds the image and runs `qemu-vm`'s live
//! tests; `cargo xtask e2e qemu` builds it and runs `backend-qemu`'s (its own checks, every
//! conformance suite it declares with HARDENING and CONFINEMENT, and its fault tests) and
//! `sandboxctl`'s first run on QEMU. Each fails when a test failed or skipped, or a QEMU
//! process or a file of its run directory is left behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::XtaskError;
use crate::process::Workspace;

/// The name `cargo xtask images` accepts for the VM image.
pub const VM_IMAGE: &str = "vm";

/// Where the VM image's parts and manifest live: the directory `QEMU_VM_IMAGE` names, else the
/// one every host reads by default (`qemu_vm::default_image_dir`), so the image built here is
/// the one `sandboxctl --backend qemu` boots.
///
/// # Errors
/// When neither that variable nor a user cache directory is set.
pub fn image_dir() -> Result<PathBuf, XtaskError> {
    Ok(qemu_vm::given_image_dir()?)
}

fn runtime() -> Result<tokio::runtime::Runtime, XtaskError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| XtaskError::Spawn {
            command: "a tokio runtime for the VM image".to_owned(),
            source,
        })
}

/// Builds the static agent (as the images' static binaries are built) and returns its path.
fn build_static_agent(workspace: &Workspace) -> Result<PathBuf, XtaskError> {
    Ok(crate::live::build_static(workspace, &[("vm-agent", "vm-agent")])?.join("vm-agent"))
}

/// Builds the images' static binaries (the engine images' invocation, so the VM's `host-tool`
/// is the very binary they carry and neither build makes the other's stale) and returns the
/// path of `host-tool`.
fn build_static_host_tool(workspace: &Workspace) -> Result<PathBuf, XtaskError> {
    Ok(crate::live::build_static(workspace, &crate::live::IMAGE_BINARIES)?.join("host-tool"))
}

/// Builds (or finds cached) the VM image; returns its directory.
pub fn build_image(workspace: &Workspace) -> Result<PathBuf, XtaskError> {
    let agent = build_static_agent(workspace)?;
    let host_tool = build_static_host_tool(workspace)?;
    let runtime = runtime()?;
    let archive = runtime.block_on(
        backend_docker::ImageRecipe::new()
            .cache_dir(workspace.target_dir().join("images-cache"))
            .progress(|line| eprintln!("images: {line}"))
            .root_archive(backend_docker::LocalImage::Python),
    )?;
    let dir = image_dir()?;
    let recipe = qemu_vm::ImageRecipe {
        cache_dir: dir.clone(),
        agent,
        root_archive: archive,
        programs: vec![qemu_vm::GuestProgram {
            guest_path: sandbox_core::host_tool_run::HOST_TOOL_PROGRAM.to_owned(),
            binary: host_tool,
        }],
        kernel_release: None,
        host_root: PathBuf::from("/"),
    };
    let progress = |line: &str| eprintln!("images: vm: {line}");
    let image = runtime.block_on(recipe.build(&progress))?;
    eprintln!(
        "images: vm: kernel {} ({}), initramfs {}, root {}",
        image.kernel.display(),
        image.kernel_release,
        image.initramfs.display(),
        image.rootfs.display()
    );
    Ok(dir)
}

/// The VM image `QEMU_VM_IMAGE` names when it holds one (its manifest), else the one of
/// [`image_dir`], built (or found cached) first: for the suites and benches that boot VMs beside others, which
/// may share one image built elsewhere.
///
/// # Errors
/// As [`build_image`].
pub fn given_or_built_image(workspace: &Workspace) -> Result<PathBuf, XtaskError> {
    if let Some(dir) = std::env::var_os("QEMU_VM_IMAGE").map(PathBuf::from) {
        if dir.join(qemu_vm::MANIFEST).is_file() {
            eprintln!("images: vm: the image of QEMU_VM_IMAGE, {}", dir.display());
            return Ok(dir);
        }
    }
    build_image(workspace)
}

/// One live VM suite: what nextest runs, and the name its verdict gives.
struct VmSuite {
    /// The suite's name (`vm`, `qemu`).
    name: &'static str,
    /// Its live test binaries, as a nextest filter over the shared build.
    filter: &'static str,
}

/// `qemu-vm`'s live tests: the driver and the agent.
const DRIVER: VmSuite = VmSuite {
    name: "vm",
    filter: "package(qemu-vm) & binary(/^live_/)",
};

/// `backend-qemu`'s live tests: its own checks, the conformance suites and the faults; and
/// `sandboxctl`'s first run on QEMU, from no image to a command's output.
const BACKEND: VmSuite = VmSuite {
    name: "qemu",
    filter: "(package(backend-qemu) & binary(/^live_/)) | (package(system-tests) & binary(live_qemu_first_run))",
};

/// Both: one nextest run packs the two suites' VMs into the group's two slots.
const BOTH: VmSuite = VmSuite {
    name: "vms",
    filter: "((package(qemu-vm) | package(backend-qemu)) & binary(/^live_/)) | (package(system-tests) & binary(live_qemu_first_run))",
};

/// `cargo xtask e2e vm`: the image, then `qemu-vm`'s live tests.
pub fn e2e(workspace: &Workspace) -> Result<(), XtaskError> {
    run_suite(workspace, &DRIVER)
}

/// `cargo xtask e2e qemu`: the image, then `backend-qemu`'s live tests.
pub fn e2e_backend(workspace: &Workspace) -> Result<(), XtaskError> {
    run_suite(workspace, &BACKEND)
}

/// `cargo xtask e2e vms`: the image, then `qemu-vm`'s and `backend-qemu`'s live tests in one
/// run.
pub fn e2e_both(workspace: &Workspace) -> Result<(), XtaskError> {
    run_suite(workspace, &BOTH)
}

/// The image, then `suite`'s live tests in a run directory of its own that must be empty
/// afterwards, with no QEMU of the run left running; at most two VMs at once (the nextest
/// test group `vm`).
fn run_suite(workspace: &Workspace, suite: &VmSuite) -> Result<(), XtaskError> {
    let image = build_image(workspace)?;
    let run = crate::live::RunDir::for_suite(workspace, suite.name)?;
    let mut command = crate::live::shared_nextest(suite.filter);
    command
        .env("QEMU_VM_IMAGE", &image)
        .env("QEMU_VM_RUN_DIR", run.path());
    run.judge_suite(workspace, suite.name, command, |dir| {
        // Give killed QEMUs a moment to be reaped before judging.
        std::thread::sleep(Duration::from_millis(500));
        Ok(qemus_under(dir))
    })
}

/// QEMU processes whose VM directory lies under `dir`.
pub(crate) fn qemus_under(dir: &Path) -> Vec<crate::live::EngineObject> {
    qemu_vm::qemus_under(dir)
        .into_iter()
        .map(|qemu| crate::live::EngineObject {
            kind: "process",
            id: qemu.pid.to_string(),
            name: qemu.vm_dir.display().to_string(),
        })
        .collect()
}
