//! `cargo xtask check-targets`: type-checks the crates a Windows or macOS host builds, for those
//! hosts, on this Linux machine.
//!
//! The host's stable toolchain has the Linux target only and no other can be installed, so the
//! check runs Debian's `rustc` and `cargo` with Debian's `rust-src` (the standard library's
//! sources): `RUSTC_BOOTSTRAP=1 cargo check -Zbuild-std=std,panic_abort --target <t>…` builds
//! the standard library for each target, then type-checks the crates against it, warnings
//! denied. No linker for the
//! target is needed; `x86_64-w64-mingw32-dlltool` is, because the Windows standard library
//! declares its imports as raw-dylib.
//!
//! That toolchain lives in a Debian root (`debootstrap` of [`TOOLCHAIN_SUITE`] plus
//! [`TOOLCHAIN_PACKAGES`]) kept in a cache directory outside the workspace
//! (`/var/cache/sandboxes-check-targets`, or `$XTASK_CHECK_TARGETS_CACHE`), so a fresh clone on
//! the same machine reuses it; with no cache it is built from nothing. Its directory name is a
//! hash of the recipe, so changing the recipe builds a new root. The cargo home and the target
//! directory of the checks live beside it.
//!
//! Every command that runs in the root runs in a private mount namespace (`unshare --mount`):
//! the workspace (read-only), the cargo home, the target directory, the host's DNS
//! configuration and CA bundle, `/proc` and `/dev` are bind-mounted into it there, and all of it
//! disappears with the namespace when the command ends, however it ends. The checks use the
//! workspace's `Cargo.lock` as it is (`--locked`): a locked crate that needs a newer compiler
//! than the root's fails the check, which is also what the workspace's `rust-version` promises.
//! Every command has a deadline, past which its whole process group is killed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, ExitKind};

use crate::error::XtaskError;
use crate::process::{bounded_runtime, capture_in, cargo, seconds, stream_bounded, Workspace};

/// The crates a Windows or macOS host builds. Each must exist in the workspace.
pub const HOST_CRATES: &[&str] = &[
    "bounded-process",
    "exec-wrapper",
    "confined-fs",
    "sandbox-core",
    "sbx-cli",
    "wrapper-stream",
    "backend-sbx",
];

/// The targets they are checked for.
pub const TARGETS: &[&str] = &["x86_64-pc-windows-gnu", "aarch64-apple-darwin"];

/// The Debian suite whose toolchain checks them (its `rustc` is 1.85, the workspace's
/// `rust-version`).
pub const TOOLCHAIN_SUITE: &str = "trixie";

/// What the root holds besides `minbase`: the compiler, the standard library's sources, CA
/// certificates for the registry, the C runtime that build scripts link against, and the
/// `dlltool` the Windows standard library needs.
pub const TOOLCHAIN_PACKAGES: &[&str] = &[
    "rustc",
    "cargo",
    "rust-src",
    "ca-certificates",
    "libc6-dev",
    "binutils-mingw-w64-x86-64",
];

const DEFAULT_CACHE_DIR: &str = "/var/cache/sandboxes-check-targets";
const CACHE_DIR_ENV: &str = "XTASK_CHECK_TARGETS_CACHE";

/// Where the host's CA bundle is, and where the root's is: the registry may be reached through
/// a proxy only the host's bundle trusts.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Mount points inside the root.
const ROOT_WORKSPACE: &str = "/workspace";
const ROOT_CARGO_HOME: &str = "/cargo-home";
const ROOT_TARGET_DIR: &str = "/check-target";

const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const ROOT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const INSTALL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A cold check builds the standard library for the target: minutes on a busy machine.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const METADATA_TIMEOUT: Duration = Duration::from_secs(120);
/// Far more than any of these commands prints; a runaway one is stopped.
const OUTPUT_BUDGET: usize = 64 * 1024 * 1024;

/// Bind-mounts into the root, then runs the command chrooted. Arguments: the root, then
/// `ro|rw <host path> <path in the root>` triples, then `--` and the command. Run under
/// `unshare --mount --propagation private`, so every mount ends with the namespace.
const CHROOT_SCRIPT: &str = r#"set -eu
root=$1
shift
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
while [ "$1" != -- ]; do
  mode=$1 source=$2 target=$root$3
  shift 3
  mount --bind "$source" "$target"
  if [ "$mode" = ro ]; then
    mount -o remount,bind,ro "$target"
  fi
done
shift
exec chroot "$root" "$@"
"#;

/// Checks every crate of [`HOST_CRATES`] for every target of [`TARGETS`], building the toolchain
/// root first when the cache has none. Every target is checked; any failure fails the command.
/// With `root_only`, only the root is made sure of.
pub fn run(workspace: &Workspace, root_only: bool) -> Result<(), XtaskError> {
    ensure_host_crates_exist(workspace)?;
    for (program, package) in [
        ("debootstrap", "debootstrap"),
        ("unshare", "util-linux"),
        ("chroot", "coreutils"),
    ] {
        find_program(program, package)?;
    }
    let runtime = bounded_runtime("the target checks")?;
    let cache = cache_dir();
    let root = toolchain_root(&runtime, &cache)?;
    if root_only {
        return Ok(());
    }
    let cargo_home = ensure_dir(&cache.join("cargo-home"))?;
    let target_dir = ensure_dir(&cache.join("target"))?;

    // One cargo run for every target: the host's build scripts and proc macros are built once
    // for all of them. Cargo's own output names the target of any error.
    eprintln!(
        "==> check-targets: {}: {}",
        TARGETS.join(", "),
        HOST_CRATES.join(", ")
    );
    let started = Instant::now();
    match check_targets(&runtime, &root, workspace.root(), &cargo_home, &target_dir) {
        Ok(()) => {
            eprintln!(
                "==> check-targets: passed in {}",
                seconds(started.elapsed())
            );
            Ok(())
        }
        Err(error) => {
            eprintln!(
                "==> check-targets: FAILED after {}: {error}",
                seconds(started.elapsed())
            );
            Err(XtaskError::TargetsFailed {
                targets: TARGETS.join(", "),
            })
        }
    }
}

/// A listed crate missing from the workspace is an error, never a silent skip.
fn ensure_host_crates_exist(workspace: &Workspace) -> Result<(), XtaskError> {
    let metadata = capture_in(
        workspace.root(),
        cargo().args(["metadata", "--no-deps", "--format-version", "1"]),
        METADATA_TIMEOUT,
    )?;
    let known = workspace_packages(&metadata)?;
    let missing: Vec<&str> = HOST_CRATES
        .iter()
        .copied()
        .filter(|name| !known.iter().any(|package| package == name))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::UnknownHostCrates {
            missing: missing.join(", "),
            known: known.join(", "),
        })
    }
}

/// The package names in `cargo metadata` output.
fn workspace_packages(metadata: &str) -> Result<Vec<String>, XtaskError> {
    let malformed = || XtaskError::Malformed {
        what: "`cargo metadata` output",
    };
    let value: serde_json::Value = serde_json::from_str(metadata).map_err(|_| malformed())?;
    value["packages"]
        .as_array()
        .ok_or_else(malformed)?
        .iter()
        .map(|package| {
            package["name"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(malformed)
        })
        .collect()
}

fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_DIR_ENV)
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_CACHE_DIR), PathBuf::from)
}

/// The root's directory name: the suite and a hash of the recipe.
fn toolchain_root_name() -> String {
    let recipe = format!(
        "{TOOLCHAIN_SUITE}\n{}\n{CHROOT_SCRIPT}",
        TOOLCHAIN_PACKAGES.join(" ")
    );
    format!(
        "toolchain-{TOOLCHAIN_SUITE}-{:016x}",
        fnv1a(recipe.as_bytes())
    )
}

/// FNV-1a, 64 bits: stable across releases and platforms, unlike `std`'s hashers.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The cached toolchain root, built first when absent. A root is built under a name of its own
/// and renamed into place when complete, so a half-built root is never used and two runs never
/// build into the same directory.
fn toolchain_root(runtime: &tokio::runtime::Runtime, cache: &Path) -> Result<PathBuf, XtaskError> {
    let name = toolchain_root_name();
    let root = cache.join(&name);
    if root.join("usr/bin/cargo").is_file() {
        eprintln!("==> check-targets: toolchain root {}", root.display());
        return Ok(root);
    }
    ensure_dir(cache)?;
    remove_abandoned_partials(cache, &name)?;
    let partial = cache.join(format!("{name}.partial-{}", std::process::id()));
    remove_dir(&partial)?;
    let started = Instant::now();
    eprintln!(
        "==> check-targets: building the toolchain root {} ({TOOLCHAIN_SUITE}: {})",
        root.display(),
        TOOLCHAIN_PACKAGES.join(" ")
    );
    let built = build_root(runtime, &partial);
    if let Err(error) = built {
        // Best effort: an abandoned partial root is also removed by the next run.
        let _ = remove_dir(&partial);
        return Err(error);
    }
    if let Err(error) = std::fs::rename(&partial, &root) {
        // Another run finished the same root first: use it, drop ours.
        remove_dir(&partial)?;
        if !root.join("usr/bin/cargo").is_file() {
            return Err(XtaskError::Io {
                action: "renaming the built toolchain root to",
                path: root.display().to_string(),
                source: error,
            });
        }
    }
    eprintln!(
        "==> check-targets: toolchain root built in {}",
        seconds(started.elapsed())
    );
    Ok(root)
}

fn build_root(runtime: &tokio::runtime::Runtime, partial: &Path) -> Result<(), XtaskError> {
    let mirror = backend_docker::mirror_from_apt_sources().map_err(XtaskError::NoMirror)?;
    // In a namespace of its own, so what debootstrap mounts in the root ends with it even when
    // it is killed.
    let bootstrap = [
        "--mount",
        "--propagation",
        "private",
        "debootstrap",
        "--variant=minbase",
        TOOLCHAIN_SUITE,
    ]
    .into_iter()
    .map(OsString::from)
    .chain([partial.as_os_str().to_owned(), OsString::from(&mirror)]);
    stream(runtime, "unshare", bootstrap, BOOTSTRAP_TIMEOUT)?;

    // dpkg syncs every unpacked file by default; a root that is renamed into place only once
    // complete (a crash leaves a partial one, removed by the next run) does not need that.
    let install = [
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "-o",
        "Dpkg::Options::=--force-unsafe-io",
    ]
    .into_iter()
    .chain(TOOLCHAIN_PACKAGES.iter().copied());
    in_root(
        runtime,
        partial,
        &[],
        in_root_env(&[]),
        install,
        INSTALL_TIMEOUT,
    )?;
    in_root(
        runtime,
        partial,
        &[],
        in_root_env(&[]),
        ["apt-get", "clean"],
        INSTALL_TIMEOUT,
    )
}

/// Removes `<name>.partial-<pid>` directories whose building process is gone.
fn remove_abandoned_partials(cache: &Path, name: &str) -> Result<(), XtaskError> {
    let prefix = format!("{name}.partial-");
    let entries = std::fs::read_dir(cache).map_err(|source| XtaskError::Io {
        action: "listing",
        path: cache.display().to_string(),
        source,
    })?;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|file_name| file_name.strip_prefix(&prefix))
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            remove_dir(&entry.path())?;
        }
    }
    Ok(())
}

/// `cargo check` of every host crate for every target of [`TARGETS`], in the root. The standard
/// library is built for each (`-Zbuild-std` compiles it in full even under `check`) without
/// debug info and without its optional features (backtrace symbolisation and its parsers):
/// neither changes the API the crates are checked against, and both cost compile time.
fn check_targets(
    runtime: &tokio::runtime::Runtime,
    root: &Path,
    workspace: &Path,
    cargo_home: &Path,
    target_dir: &Path,
) -> Result<(), XtaskError> {
    let mut binds = vec![
        Bind::read_only(workspace, ROOT_WORKSPACE),
        Bind::writable(cargo_home, ROOT_CARGO_HOME),
        Bind::writable(target_dir, ROOT_TARGET_DIR),
    ];
    if Path::new(CA_BUNDLE).is_file() {
        binds.push(Bind::read_only(Path::new(CA_BUNDLE), CA_BUNDLE));
    }
    let manifest = format!("{ROOT_WORKSPACE}/Cargo.toml");
    let mut command = vec![
        "cargo",
        "check",
        "--locked",
        "--manifest-path",
        &manifest,
        "-Zbuild-std=std,panic_abort",
        "-Zbuild-std-features=",
    ];
    for target in TARGETS {
        command.extend(["--target", target]);
    }
    for name in HOST_CRATES {
        command.extend(["-p", name]);
    }
    let cargo_home_var = format!("CARGO_HOME={ROOT_CARGO_HOME}");
    let target_dir_var = format!("CARGO_TARGET_DIR={ROOT_TARGET_DIR}");
    let ca_vars = [
        format!("SSL_CERT_FILE={CA_BUNDLE}"),
        format!("CARGO_HTTP_CAINFO={CA_BUNDLE}"),
    ];
    let env = in_root_env(&[
        "HOME=/root",
        &cargo_home_var,
        &target_dir_var,
        // Unlocks -Zbuild-std on this stable compiler.
        "RUSTC_BOOTSTRAP=1",
        "CARGO_PROFILE_DEV_DEBUG=false",
        "RUSTFLAGS=-D warnings",
        "CARGO_TERM_COLOR=always",
        &ca_vars[0],
        &ca_vars[1],
    ]);
    in_root(runtime, root, &binds, env, command, CHECK_TIMEOUT)
}

/// One bind mount into the root.
struct Bind {
    source: PathBuf,
    target: &'static str,
    read_only: bool,
}

impl Bind {
    fn read_only(source: &Path, target: &'static str) -> Bind {
        Bind {
            source: source.to_owned(),
            target,
            read_only: true,
        }
    }

    fn writable(source: &Path, target: &'static str) -> Bind {
        Bind {
            source: source.to_owned(),
            target,
            read_only: false,
        }
    }
}

/// `env -i` and the variables a command in the root starts with.
fn in_root_env<'a>(vars: &[&'a str]) -> Vec<&'a str> {
    let mut env = vec![
        "/usr/bin/env",
        "-i",
        ROOT_PATH,
        "LC_ALL=C",
        "DEBIAN_FRONTEND=noninteractive",
    ];
    env.extend_from_slice(vars);
    env
}

/// Runs `command` chrooted into `root`, in a private mount namespace holding `/proc`, `/dev`,
/// the host's DNS configuration and `binds`.
fn in_root<'a>(
    runtime: &tokio::runtime::Runtime,
    root: &Path,
    binds: &[Bind],
    env: Vec<&'a str>,
    command: impl IntoIterator<Item = &'a str>,
    timeout: Duration,
) -> Result<(), XtaskError> {
    let mut binds: Vec<&Bind> = binds.iter().collect();
    let resolv = Bind::read_only(Path::new(RESOLV_CONF), RESOLV_CONF);
    binds.push(&resolv);
    for bind in &binds {
        prepare_mount_point(
            &bind.source,
            &root.join(bind.target.trim_start_matches('/')),
        )?;
    }
    let mut args: Vec<OsString> = [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        CHROOT_SCRIPT,
        "sh",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    args.push(root.as_os_str().to_owned());
    for bind in binds {
        args.push(if bind.read_only { "ro" } else { "rw" }.into());
        args.push(bind.source.as_os_str().to_owned());
        args.push(bind.target.into());
    }
    args.push("--".into());
    args.extend(env.into_iter().chain(command).map(OsString::from));
    stream(runtime, "unshare", args, timeout)
}

/// A bind needs something to mount over: a directory for a directory, a file for a file. A
/// dangling symbolic link (a root's `resolv.conf` may be one) is replaced by an empty file.
fn prepare_mount_point(source: &Path, mount_point: &Path) -> Result<(), XtaskError> {
    if source.is_dir() {
        ensure_dir(mount_point)?;
        return Ok(());
    }
    if mount_point.is_file() {
        return Ok(());
    }
    let io_error = |action: &'static str| {
        let path = mount_point.display().to_string();
        move |source| XtaskError::Io {
            action,
            path,
            source,
        }
    };
    if std::fs::symlink_metadata(mount_point).is_ok() {
        std::fs::remove_file(mount_point).map_err(io_error("removing"))?;
    }
    std::fs::write(mount_point, b"").map_err(io_error("creating"))
}

/// Runs `program` under its deadline with its output streamed, line by line, to stderr; fails
/// unless it exits 0.
fn stream(
    runtime: &tokio::runtime::Runtime,
    program: &str,
    args: impl IntoIterator<Item = OsString>,
    timeout: Duration,
) -> Result<(), XtaskError> {
    let args: Vec<OsString> = args.into_iter().collect();
    let line = describe(program, &args);
    let command = BoundedCommand::new(program, timeout)
        .args(args)
        .env("PATH", HOST_PATH)
        .env("LC_ALL", "C")
        .output_budget(OUTPUT_BUDGET);
    match stream_bounded(runtime, &line, command)? {
        ExitKind::Exited(0) => Ok(()),
        status => Err(XtaskError::CommandFailed {
            command: line,
            status: format!("{status:?}"),
        }),
    }
}

/// The command line for banners and errors, with the chroot script named rather than printed.
fn describe(program: &str, args: &[OsString]) -> String {
    let mut command = std::process::Command::new(program);
    for arg in args {
        if arg == CHROOT_SCRIPT {
            command.arg("<bind-mount-and-chroot script>");
        } else {
            command.arg(arg);
        }
    }
    crate::process::describe(&command)
}

fn find_program(program: &str, package: &str) -> Result<PathBuf, XtaskError> {
    std::env::split_paths(HOST_PATH)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .ok_or_else(|| XtaskError::MissingTool {
            program: program.to_owned(),
            package: package.to_owned(),
        })
}

fn ensure_dir(dir: &Path) -> Result<PathBuf, XtaskError> {
    std::fs::create_dir_all(dir).map_err(|source| XtaskError::Io {
        action: "creating",
        path: dir.display().to_string(),
        source,
    })?;
    Ok(dir.to_owned())
}

/// Removes `dir` and everything in it; a missing `dir` is fine. Nothing is ever mounted in a
/// root outside the namespaces of its commands, so nothing needs unmounting first.
fn remove_dir(dir: &Path) -> Result<(), XtaskError> {
    match std::fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(XtaskError::Io {
            action: "removing",
            path: dir.display().to_string(),
            source: error,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_come_from_cargo_metadata() {
        let metadata = r#"{"packages":[{"name":"exec-wrapper","version":"0.1.0"},{"name":"xtask"}],"workspace_members":[]}"#;
        assert_eq!(
            workspace_packages(metadata).unwrap(),
            vec!["exec-wrapper", "xtask"]
        );
        assert!(matches!(
            workspace_packages(r#"{"packages":[{"version":"1"}]}"#),
            Err(XtaskError::Malformed { .. })
        ));
        assert!(matches!(
            workspace_packages("not json"),
            Err(XtaskError::Malformed { .. })
        ));
    }

    #[test]
    fn the_root_name_follows_the_recipe() {
        let name = toolchain_root_name();
        assert!(name.starts_with("toolchain-trixie-"), "{name}");
        assert_eq!(name, toolchain_root_name());
        assert_ne!(fnv1a(b"rustc cargo"), fnv1a(b"rustc cargo rust-src"));
        // The published FNV-1a test vector, so the name is stable across releases.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn every_listed_crate_is_a_workspace_member() {
        let workspace = Workspace::locate().unwrap();
        let metadata = capture_in(
            workspace.root(),
            cargo().args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ]),
            METADATA_TIMEOUT,
        )
        .unwrap();
        let known = workspace_packages(&metadata).unwrap();
        for name in HOST_CRATES {
            assert!(known.iter().any(|package| package == name), "{name}");
        }
    }

    #[test]
    fn a_mount_point_matches_its_source() {
        let scratch = tempfile::tempdir().unwrap();
        let file_point = scratch.path().join("etc-resolv.conf");
        std::os::unix::fs::symlink("/nonexistent/resolv.conf", &file_point).unwrap();
        prepare_mount_point(Path::new(RESOLV_CONF), &file_point).unwrap();
        assert!(file_point.is_file());
        let dir_point = scratch.path().join("a/b/workspace");
        prepare_mount_point(scratch.path(), &dir_point).unwrap();
        assert!(dir_point.is_dir());
    }
}
