//! The microVM image of `--backend qemu`: where every host looks for it by default, and its
//! build (`sandboxctl images build vm`) from the static guest agent and the base Debian root of
//! the one image recipe.
//!
//! The static agent is the one `$SANDBOX_VM_AGENT` names, else a static `vm-agent` beside the
//! current executable, else, when the current executable runs from a checkout's `target/`
//! directory, the one cargo builds there (release, for [`qemu_vm::AGENT_TARGET`] with
//! [`qemu_vm::AGENT_RUSTFLAGS`], as `cargo xtask images vm` builds it, so either build is the
//! other's cache hit). Anywhere else the build is refused with what to do.
//!
//! The root carries the static `host-tool` (so its sandboxes serve host tools) when one is found:
//! the one `$SANDBOX_VM_HOST_TOOL` names, else a static `host-tool` beside the current
//! executable, else, from a checkout, the one `cargo xtask images` built there. Without one the
//! image is built without it, and says so.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};
use sandbox_core::SandboxError;

/// The variable naming the static agent to build the image around.
const AGENT_VAR: &str = "SANDBOX_VM_AGENT";

/// The agent's package and binary name.
const AGENT: &str = "vm-agent";

/// The variable naming the static `host-tool` the root carries.
const HOST_TOOL_VAR: &str = "SANDBOX_VM_HOST_TOOL";

/// The guest's host-tool program's file name.
const HOST_TOOL: &str = "host-tool";

/// The bound of the agent's cargo build: a release build of the agent and its dependencies
/// from nothing on a small, shared host.
const AGENT_BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What the agent's cargo build may print before it is stopped (its progress and warnings).
const AGENT_BUILD_OUTPUT: usize = 4 * 1024 * 1024;

/// The variables the agent's cargo build gets from this process: what finds cargo, its
/// toolchain and its registry. Nothing else: the build's flags are set, not inherited.
const CARGO_ENV: [&str; 5] = [
    "PATH",
    "HOME",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

/// The directory every host reads the image from unless given another (`--vm-image`):
/// [`qemu_vm::default_image_dir`].
///
/// # Errors
/// [`SandboxError::InvalidArgument`] when no cache directory can be named.
pub fn default_dir() -> Result<PathBuf, SandboxError> {
    qemu_vm::default_image_dir().map_err(|e| SandboxError::invalid(e.to_string()))
}

/// Builds the image into [`default_dir`] (each part cached by digest there, the Debian root
/// archive beside it under `roots`); returns a line naming it and its digest.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] when no static agent can be found or built here;
/// [`SandboxError::Engine`] when the agent's build, the root archive or the image build fails.
///
/// # Cancel safety and drop
/// Dropping the future kills a running agent build; the image's parts are renamed into place
/// only when complete.
pub async fn build() -> Result<String, SandboxError> {
    let cache = qemu_vm::user_cache_dir().map_err(|e| SandboxError::invalid(e.to_string()))?;
    let agent = static_agent().await?;
    let archive = backend_docker::ImageRecipe::new()
        .progress(|line| eprintln!("images: {line}"))
        .cache_dir(cache.join("roots"))
        .root_archive(backend_docker::LocalImage::Python)
        .await
        .map_err(|e| SandboxError::engine(format!("root archive: {e}")))?;
    let dir = default_dir()?;
    let programs = match static_host_tool()? {
        Some(binary) => vec![qemu_vm::GuestProgram {
            guest_path: sandbox_core::host_tool_run::HOST_TOOL_PROGRAM.to_owned(),
            binary,
        }],
        None => {
            eprintln!(
                "images: vm: no static {HOST_TOOL} (set {HOST_TOOL_VAR}, or run `cargo xtask \
                 images` in the checkout): the image is built without it, and serves no host tools"
            );
            Vec::new()
        }
    };
    let image = qemu_vm::ImageRecipe {
        cache_dir: dir.clone(),
        agent,
        root_archive: archive,
        programs,
        kernel_release: None,
        host_root: PathBuf::from("/"),
    }
    .build(&|line: &str| eprintln!("images: vm: {line}"))
    .await
    .map_err(|e| SandboxError::engine(format!("VM image build failed: {e}")))?;
    Ok(format!("{} ({})", dir.display(), image.digest))
}

/// The static agent to build the image around, built first when this executable runs from a
/// checkout.
async fn static_agent() -> Result<PathBuf, SandboxError> {
    if let Some(path) = std::env::var_os(AGENT_VAR).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| no_static_agent(&e.to_string()))?;
    let exe_dir = exe.parent().unwrap_or(Path::new("/"));
    let beside = exe_dir.join(AGENT);
    if is_static(&beside) {
        return Ok(beside);
    }
    let Some((checkout, target)) = checkout_of(exe_dir) else {
        return Err(no_static_agent(&format!(
            "{} is not a static agent and {} is not in a checkout's target directory",
            beside.display(),
            exe.display()
        )));
    };
    build_agent(&checkout, &target).await
}

/// The static `host-tool` the root carries, if one is found (none is built here: the engine
/// images' build makes it).
///
/// # Errors
/// [`SandboxError::InvalidArgument`] when `$SANDBOX_VM_HOST_TOOL` names no static executable.
fn static_host_tool() -> Result<Option<PathBuf>, SandboxError> {
    if let Some(path) = std::env::var_os(HOST_TOOL_VAR).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !is_static(&path) {
            return Err(SandboxError::invalid(format!(
                "{HOST_TOOL_VAR} names {}, which is not a static x86-64 executable",
                path.display()
            )));
        }
        return Ok(Some(path));
    }
    let Ok(exe) = std::env::current_exe() else {
        return Ok(None);
    };
    let exe_dir = exe.parent().unwrap_or(Path::new("/"));
    Ok(host_tool_candidates(exe_dir)
        .into_iter()
        .find(|candidate| is_static(candidate)))
}

/// Where a static `host-tool` may be for an executable in `exe_dir`: beside it, then in its
/// checkout's static release directory.
fn host_tool_candidates(exe_dir: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![exe_dir.join(HOST_TOOL)];
    if let Some((_, target)) = checkout_of(exe_dir) {
        candidates.push(
            target
                .join(qemu_vm::AGENT_TARGET)
                .join("release")
                .join(HOST_TOOL),
        );
    }
    candidates
}

/// The checkout and target directory of an executable in `<checkout>/target/<profile>/`: a
/// directory whose parent holds the workspace's manifest and the agent's package.
fn checkout_of(exe_dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let target = exe_dir.parent()?;
    let checkout = target.parent()?;
    let is_checkout = checkout.join("Cargo.toml").is_file()
        && checkout
            .join("crates")
            .join(AGENT)
            .join("Cargo.toml")
            .is_file();
    is_checkout.then(|| (checkout.to_path_buf(), target.to_path_buf()))
}

/// Whether `path` is a static x86-64 executable (the initramfs has no loader for another).
fn is_static(path: &Path) -> bool {
    // The agent is a few MiB; anything far larger is not it.
    const MOST: u64 = 256 * 1024 * 1024;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() <= MOST => std::fs::read(path)
            .map(|bytes| qemu_vm::is_static_elf(&bytes))
            .unwrap_or(false),
        _ => false,
    }
}

/// The cargo command line that builds the static agent into `target`, and its environment.
fn agent_build(target: &Path) -> (Vec<OsString>, Vec<(OsString, OsString)>) {
    let args = [
        "build",
        "--release",
        "--package",
        AGENT,
        "--bin",
        AGENT,
        "--target",
        qemu_vm::AGENT_TARGET,
    ]
    .map(OsString::from)
    .to_vec();
    let mut env: Vec<(OsString, OsString)> = CARGO_ENV
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|value| ((*name).into(), value)))
        .collect();
    env.push(("RUSTFLAGS".into(), qemu_vm::AGENT_RUSTFLAGS.into()));
    env.push(("CARGO_TARGET_DIR".into(), target.into()));
    (args, env)
}

/// Builds the static agent with cargo in `checkout` into `target`, relaying cargo's lines to
/// stderr; returns its path.
async fn build_agent(checkout: &Path, target: &Path) -> Result<PathBuf, SandboxError> {
    eprintln!(
        "images: vm: building the static {AGENT} in {}",
        checkout.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let (args, env) = agent_build(target);
    let output = BoundedCommand::new(cargo, AGENT_BUILD_TIMEOUT)
        .args(args)
        .envs(env)
        .current_dir(checkout)
        .output_budget(AGENT_BUILD_OUTPUT)
        .on_line(|_, line| {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line);
        })
        .run()
        .await
        .map_err(|e| SandboxError::engine(format!("building the static {AGENT}: {e}")))?;
    if output.status != ExitKind::Exited(0) {
        return Err(SandboxError::engine(format!(
            "building the static {AGENT} ended with {:?} (its output is above)",
            output.status
        )));
    }
    let agent = target
        .join(qemu_vm::AGENT_TARGET)
        .join("release")
        .join(AGENT);
    if is_static(&agent) {
        Ok(agent)
    } else {
        Err(no_static_agent(&format!(
            "the build left no static agent at {}",
            agent.display()
        )))
    }
}

/// The agent could not be found or built: says why and what to do.
#[cold]
fn no_static_agent(why: &str) -> SandboxError {
    SandboxError::invalid(format!(
        "no static {AGENT} for the VM image ({why}): set {AGENT_VAR} to one (`cargo build \
         --release -p {AGENT} --target {}` with RUSTFLAGS='{}'), or run `sandboxctl images \
         build vm` from a checkout's target directory",
        qemu_vm::AGENT_TARGET,
        qemu_vm::AGENT_RUSTFLAGS
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkout_is_found_from_its_target_directory_only() {
        let root = tempfile::tempdir().unwrap();
        let checkout = root.path().join("repo");
        let debug = checkout.join("target").join("debug");
        std::fs::create_dir_all(&debug).unwrap();
        std::fs::create_dir_all(checkout.join("crates").join(AGENT)).unwrap();
        // No workspace manifest yet: not a checkout.
        std::fs::write(checkout.join("crates").join(AGENT).join("Cargo.toml"), "").unwrap();
        assert_eq!(checkout_of(&debug), None);
        std::fs::write(checkout.join("Cargo.toml"), "").unwrap();
        assert_eq!(
            checkout_of(&debug),
            Some((checkout.clone(), checkout.join("target")))
        );
        // An installed binary's directory is not one.
        let bin = root.path().join("usr").join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(checkout_of(&bin), None);
    }

    #[test]
    fn host_tool_is_looked_for_beside_the_executable_then_in_its_checkout() {
        let root = tempfile::tempdir().unwrap();
        let checkout = root.path().join("repo");
        let debug = checkout.join("target").join("debug");
        std::fs::create_dir_all(checkout.join("crates").join(AGENT)).unwrap();
        std::fs::create_dir_all(&debug).unwrap();
        std::fs::write(checkout.join("Cargo.toml"), "").unwrap();
        std::fs::write(checkout.join("crates").join(AGENT).join("Cargo.toml"), "").unwrap();
        assert_eq!(
            host_tool_candidates(&debug),
            [
                debug.join(HOST_TOOL),
                checkout
                    .join("target")
                    .join(qemu_vm::AGENT_TARGET)
                    .join("release")
                    .join(HOST_TOOL)
            ]
        );
        let bin = root.path().join("bin");
        assert_eq!(host_tool_candidates(&bin), [bin.join(HOST_TOOL)]);
    }

    #[test]
    fn the_agent_build_sets_its_flags_and_passes_only_what_finds_cargo() {
        let target = Path::new("/repo/target");
        let (args, env) = agent_build(target);
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "build",
                "--release",
                "--package",
                "vm-agent",
                "--bin",
                "vm-agent",
                "--target",
                qemu_vm::AGENT_TARGET
            ]
        );
        let value = |name: &str| {
            env.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            value("RUSTFLAGS").as_deref(),
            Some(qemu_vm::AGENT_RUSTFLAGS)
        );
        assert_eq!(value("CARGO_TARGET_DIR").as_deref(), Some("/repo/target"));
        for (name, _) in &env {
            let name = name.to_str().unwrap();
            assert!(
                CARGO_ENV.contains(&name) || name == "RUSTFLAGS" || name == "CARGO_TARGET_DIR",
                "{name} passed"
            );
        }
    }

    #[test]
    fn only_a_static_executable_beside_the_binary_counts() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join(AGENT);
        std::fs::write(&script, b"#!/bin/sh\n").unwrap();
        assert!(!is_static(&script));
        assert!(!is_static(&dir.path().join("absent")));
        assert!(!is_static(dir.path()));
        // This test binary is dynamic, as `target/debug/vm-agent` is.
        assert!(!is_static(&std::env::current_exe().unwrap()));
    }

    #[test]
    fn the_refusal_names_what_to_do() {
        let refused = no_static_agent("none here");
        assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidArgument);
        let message = refused.to_string();
        for part in [
            AGENT_VAR,
            "none here",
            qemu_vm::AGENT_RUSTFLAGS,
            "images build vm",
        ] {
            assert!(message.contains(part), "{part}: {message}");
        }
    }
}
