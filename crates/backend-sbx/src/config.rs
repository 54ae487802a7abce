//! The backend's configuration, its defaults and their validation, and the platform default
//! workspace root.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_core::credential_paths::check_workspace_root;
use sandbox_core::naming::sbx::NamePrefix;
use sandbox_core::SandboxError;

/// Bound on every sbx call but `create` and `exec`: 60 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on `sbx create`: 600 s (a first create may unpack a template).
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(600);
/// Bound on the kill call after an expired exec: 15 s.
pub const DEFAULT_EXEC_CLEANUP_TIMEOUT: Duration = Duration::from_secs(15);
/// Virtual CPUs of each microVM, always passed.
pub const DEFAULT_CPUS: u32 = 2;
/// Memory of each microVM, always passed.
pub const DEFAULT_MEMORY: &str = "2g";
/// The directory every default workspace root is named after.
pub const WORKSPACE_DIR_NAME: &str = "maf-sandbox-docker-sbx";

/// How [`crate::SbxBackend::connect`] is configured. Every field has a default
/// ([`SbxConfig::default`]); the backend checks them all at construction.
#[derive(Clone)]
#[non_exhaustive]
pub struct SbxConfig {
    /// The `sbx` program (default `sbx`, looked up on the management environment's `PATH`).
    pub sbx_path: PathBuf,
    /// Where sandbox workspaces live on the host; `None` is the platform default
    /// ([`default_workspace_root`]). Made absolute at construction, without resolving links.
    pub workspace_root: Option<PathBuf>,
    /// The first part of every sandbox name: `[a-z0-9]{1,16}`, default `maf`.
    pub name_prefix: String,
    /// Virtual CPUs per sandbox (at least 1).
    pub cpus: u32,
    /// Memory per sandbox: `[1-9][0-9]*` followed by `m`, `M`, `g` or `G`.
    pub memory: String,
    /// Bound on every sbx call but `create` and `exec`.
    pub command_timeout: Duration,
    /// Bound on `sbx create`.
    pub create_timeout: Duration,
    /// Bound on the kill call after an exec's deadline.
    pub exec_cleanup_timeout: Duration,
    /// Accept `sbx-sim`, the Docker-backed stand-in; the backend then declares the `container`
    /// rung, never `microvm`.
    pub simulator_ok: bool,
    /// Set `SBX_NO_TELEMETRY=1` in the environment of every sbx child (never in the host's own).
    pub no_telemetry: bool,
    /// The environment sbx children get (management calls whole; guest-starting calls without
    /// secret-looking names). `None` snapshots the process environment at construction.
    pub management_env: Option<Vec<(OsString, OsString)>>,
}

impl std::fmt::Debug for SbxConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Environment values may be credentials: only their names are shown.
        f.debug_struct("SbxConfig")
            .field("sbx_path", &self.sbx_path)
            .field("workspace_root", &self.workspace_root)
            .field("name_prefix", &self.name_prefix)
            .field("cpus", &self.cpus)
            .field("memory", &self.memory)
            .field("command_timeout", &self.command_timeout)
            .field("create_timeout", &self.create_timeout)
            .field("exec_cleanup_timeout", &self.exec_cleanup_timeout)
            .field("simulator_ok", &self.simulator_ok)
            .field("no_telemetry", &self.no_telemetry)
            .field(
                "management_env_names",
                &self
                    .management_env
                    .as_ref()
                    .map(|env| env.iter().map(|(name, _)| name).collect::<Vec<_>>()),
            )
            .finish()
    }
}

impl Default for SbxConfig {
    fn default() -> Self {
        SbxConfig {
            sbx_path: PathBuf::from("sbx"),
            workspace_root: None,
            name_prefix: NamePrefix::DEFAULT.to_owned(),
            cpus: DEFAULT_CPUS,
            memory: DEFAULT_MEMORY.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
            exec_cleanup_timeout: DEFAULT_EXEC_CLEANUP_TIMEOUT,
            simulator_ok: false,
            no_telemetry: true,
            management_env: None,
        }
    }
}

/// A configuration that passed every check, with the environment snapshot taken and the
/// workspace root fixed.
#[derive(Clone)]
pub(crate) struct CheckedConfig {
    pub(crate) sbx_path: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) prefix: NamePrefix,
    pub(crate) cpus: u32,
    pub(crate) memory: String,
    pub(crate) command_timeout: Duration,
    pub(crate) create_timeout: Duration,
    pub(crate) exec_cleanup_timeout: Duration,
    pub(crate) simulator_ok: bool,
    pub(crate) no_telemetry: bool,
    pub(crate) management_env: Vec<(OsString, OsString)>,
}

impl std::fmt::Debug for CheckedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedConfig")
            .field("sbx_path", &self.sbx_path)
            .field("root", &self.root)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Which platform's default workspace root to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Windows: under `%LOCALAPPDATA%`.
    Windows,
    /// macOS: under `~/Library/Application Support`.
    MacOs,
    /// Everything else: under `$XDG_STATE_HOME`.
    Other,
}

impl Platform {
    /// The platform this crate was compiled for.
    pub fn current() -> Platform {
        if cfg!(windows) {
            Platform::Windows
        } else if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Other
        }
    }
}

/// The default workspace root of `platform`, from the environment lookup `env` and the home
/// directory `home`; `None` when neither the variable nor a home directory is known.
///
/// Never the temporary directory, which a host may clean under a live sandbox:
/// - Windows: `%LOCALAPPDATA%` (else `<home>/AppData/Local`) + `maf-sandbox-docker-sbx/workspaces`;
/// - macOS: `<home>/Library/Application Support/maf-sandbox-docker-sbx` (no `workspaces`
///   suffix, so roots made by other implementations are shared);
/// - elsewhere: `$XDG_STATE_HOME` (else `<home>/.local/state`) +
///   `maf-sandbox-docker-sbx/workspaces`.
///
/// An empty or relative variable counts as unset.
///
/// ```
/// use backend_sbx::{default_workspace_root, Platform};
/// use std::path::{Path, PathBuf};
///
/// let no_vars = |_: &str| None;
/// assert_eq!(
///     default_workspace_root(Platform::Other, &no_vars, Some(Path::new("/home/u"))),
///     Some(PathBuf::from("/home/u/.local/state/maf-sandbox-docker-sbx/workspaces"))
/// );
/// ```
pub fn default_workspace_root(
    platform: Platform,
    env: &dyn Fn(&str) -> Option<OsString>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    let variable = |name: &str| {
        env(name)
            .map(PathBuf::from)
            .filter(|path| !path.as_os_str().is_empty() && looks_absolute(path, platform))
    };
    match platform {
        Platform::Windows => {
            let base = variable("LOCALAPPDATA")
                .or_else(|| home.map(|h| h.join("AppData").join("Local")))?;
            Some(base.join(WORKSPACE_DIR_NAME).join("workspaces"))
        }
        Platform::MacOs => Some(
            home?
                .join("Library")
                .join("Application Support")
                .join(WORKSPACE_DIR_NAME),
        ),
        Platform::Other => {
            let base = variable("XDG_STATE_HOME")
                .or_else(|| home.map(|h| h.join(".local").join("state")))?;
            Some(base.join(WORKSPACE_DIR_NAME).join("workspaces"))
        }
    }
}

/// Absolute for the platform asked about, whatever platform runs this (so every platform's
/// default can be tested on any host).
fn looks_absolute(path: &Path, platform: Platform) -> bool {
    let text = path.to_string_lossy();
    match platform {
        Platform::Windows => {
            let bytes = text.as_bytes();
            (bytes.len() >= 3
                && bytes[0].is_ascii_alphabetic()
                && bytes[1] == b':'
                && (bytes[2] == b'\\' || bytes[2] == b'/'))
                || text.starts_with("\\\\")
        }
        Platform::MacOs | Platform::Other => text.starts_with('/'),
    }
}

/// The value of `name` in an environment snapshot.
pub(crate) fn env_value(env: &[(OsString, OsString)], name: &str) -> Option<OsString> {
    env.iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

/// The home directory named by an environment snapshot.
pub(crate) fn home_dir(env: &[(OsString, OsString)]) -> Option<PathBuf> {
    let name = if cfg!(windows) { "USERPROFILE" } else { "HOME" };
    env_value(env, name)
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
}

impl SbxConfig {
    /// The host directories a backend built from this configuration keeps sandboxes' state in (the
    /// workspace root, absolute), without connecting: what
    /// [`SandboxBackend::host_state_roots`](sandbox_core::SandboxBackend::host_state_roots) of that
    /// backend reports, for a host that guards them while it runs another backend.
    ///
    /// # Errors
    ///
    /// InvalidArgument for a configuration [`SbxBackend::connect`](crate::SbxBackend::connect) would
    /// refuse.
    pub fn host_state_roots(&self) -> Result<Vec<PathBuf>, SandboxError> {
        Ok(vec![self.check()?.root])
    }

    /// Checks every field, snapshots the environment and fixes the workspace root.
    pub(crate) fn check(&self) -> Result<CheckedConfig, SandboxError> {
        if self.sbx_path.as_os_str().is_empty() {
            return Err(SandboxError::invalid("sbx_path must not be empty"));
        }
        let prefix = NamePrefix::new(self.name_prefix.clone())?;
        if self.cpus < 1 {
            return Err(SandboxError::invalid("cpus must be at least 1"));
        }
        check_memory(&self.memory)?;
        for (what, value) in [
            ("command_timeout", self.command_timeout),
            ("create_timeout", self.create_timeout),
            ("exec_cleanup_timeout", self.exec_cleanup_timeout),
        ] {
            if value.is_zero() {
                return Err(SandboxError::invalid(format!(
                    "{what} must be greater than zero"
                )));
            }
        }
        let management_env = self
            .management_env
            .clone()
            .unwrap_or_else(|| std::env::vars_os().collect());
        let home = home_dir(&management_env);
        let root = match &self.workspace_root {
            Some(root) => root.clone(),
            None => {
                let lookup = |name: &str| env_value(&management_env, name);
                default_workspace_root(Platform::current(), &lookup, home.as_deref()).ok_or_else(
                    || {
                        SandboxError::invalid(
                            "no workspace_root was given and the environment names no home \
                             directory to derive the default from",
                        )
                    },
                )?
            }
        };
        let root = std::path::absolute(&root).map_err(|e| {
            SandboxError::invalid(format!(
                "workspace root {} cannot be made absolute: {e}",
                root.display()
            ))
        })?;
        check_root(&root, home.as_deref())?;
        Ok(CheckedConfig {
            sbx_path: self.sbx_path.clone(),
            root,
            prefix,
            cpus: self.cpus,
            memory: self.memory.clone(),
            command_timeout: self.command_timeout,
            create_timeout: self.create_timeout,
            exec_cleanup_timeout: self.exec_cleanup_timeout,
            simulator_ok: self.simulator_ok,
            no_telemetry: self.no_telemetry,
            management_env,
        })
    }
}

/// `[1-9][0-9]*[mMgG]`.
fn check_memory(memory: &str) -> Result<(), SandboxError> {
    let bytes = memory.as_bytes();
    let valid = bytes.len() >= 2
        && matches!(bytes[0], b'1'..=b'9')
        && bytes[1..bytes.len() - 1].iter().all(u8::is_ascii_digit)
        && matches!(bytes[bytes.len() - 1], b'm' | b'M' | b'g' | b'G');
    if valid {
        Ok(())
    } else {
        Err(SandboxError::invalid(format!(
            "memory {memory:?} must be a whole number of megabytes or gigabytes, like 2g or 512m"
        )))
    }
}

/// The workspace root checks: not `/`, not the home directory or an ancestor of it, not inside a
/// credential directory, not inside sbx's own store `~/.local/state/sandboxes`.
fn check_root(root: &Path, home: Option<&Path>) -> Result<(), SandboxError> {
    let Some(text) = root.to_str() else {
        return Err(SandboxError::invalid(format!(
            "workspace root {} is not valid UTF-8",
            root.display()
        )));
    };
    if cfg!(windows) {
        // Windows paths are not the POSIX strings the credential list speaks; the root is only
        // kept off the drive root and the home directory.
        if root.parent().is_none() || Some(root) == home {
            return Err(SandboxError::invalid(format!(
                "workspace root {text:?} is a drive root or the home directory"
            )));
        }
        return Ok(());
    }
    let home = home.and_then(Path::to_str).unwrap_or("/nonexistent-home");
    check_workspace_root(home, text)?;
    let store = sandbox_core::guest_path::join(home, ".local/state/sandboxes");
    if sandbox_core::guest_path::relative_to(&sandbox_core::guest_path::norm(text), &store)
        .is_some()
    {
        return Err(SandboxError::invalid(format!(
            "workspace root {text:?} lies inside sbx's own store {store:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn platform_default_roots() {
        let home = Some(Path::new("/home/u"));
        assert_eq!(
            default_workspace_root(Platform::Other, &env(&[]), home).unwrap(),
            PathBuf::from("/home/u/.local/state/maf-sandbox-docker-sbx/workspaces")
        );
        assert_eq!(
            default_workspace_root(Platform::Other, &env(&[("XDG_STATE_HOME", "/s")]), home)
                .unwrap(),
            PathBuf::from("/s/maf-sandbox-docker-sbx/workspaces")
        );
        // A relative or empty XDG_STATE_HOME is ignored, as the XDG rules say.
        for value in ["", "rel/dir"] {
            let lookup =
                move |name: &str| (name == "XDG_STATE_HOME").then(|| OsString::from(value));
            assert_eq!(
                default_workspace_root(Platform::Other, &lookup, home).unwrap(),
                PathBuf::from("/home/u/.local/state/maf-sandbox-docker-sbx/workspaces")
            );
        }
        assert_eq!(
            default_workspace_root(Platform::MacOs, &env(&[("XDG_STATE_HOME", "/s")]), home)
                .unwrap(),
            PathBuf::from("/home/u/Library/Application Support/maf-sandbox-docker-sbx")
        );
        let windows = default_workspace_root(
            Platform::Windows,
            &env(&[("LOCALAPPDATA", "C:\\Users\\u\\AppData\\Local")]),
            home,
        )
        .unwrap();
        assert!(windows.starts_with("C:\\Users\\u\\AppData\\Local"));
        assert!(windows.ends_with(Path::new("maf-sandbox-docker-sbx").join("workspaces")));
        assert_eq!(
            default_workspace_root(Platform::Windows, &env(&[]), Some(Path::new("/h"))).unwrap(),
            Path::new("/h/AppData/Local/maf-sandbox-docker-sbx/workspaces")
        );
        assert_eq!(
            default_workspace_root(Platform::Other, &env(&[]), None),
            None
        );
        assert_eq!(
            default_workspace_root(Platform::MacOs, &env(&[]), None),
            None
        );
    }

    fn config_with(root: &str) -> SbxConfig {
        SbxConfig {
            workspace_root: Some(PathBuf::from(root)),
            management_env: Some(vec![
                ("HOME".into(), "/home/u".into()),
                ("PATH".into(), "/usr/bin".into()),
            ]),
            ..SbxConfig::default()
        }
    }

    #[test]
    fn defaults_are_valid_and_the_spec_numbers() {
        let checked = config_with("/srv/ws").check().unwrap();
        assert_eq!(checked.command_timeout, Duration::from_secs(60));
        assert_eq!(checked.create_timeout, Duration::from_secs(600));
        assert_eq!(checked.exec_cleanup_timeout, Duration::from_secs(15));
        assert_eq!((checked.cpus, checked.memory.as_str()), (2, "2g"));
        assert_eq!(checked.prefix.as_str(), "maf");
        assert!(checked.no_telemetry && !checked.simulator_ok);
        assert_eq!(checked.root, PathBuf::from("/srv/ws"));
    }

    #[test]
    fn the_default_root_comes_from_the_snapshot() {
        let config = SbxConfig {
            management_env: Some(vec![("HOME".into(), "/home/u".into())]),
            ..SbxConfig::default()
        };
        let root = config.check().unwrap().root;
        // What a host guards is what the backend would use.
        assert_eq!(
            config.host_state_roots().unwrap(),
            std::slice::from_ref(&root)
        );
        if Platform::current() == Platform::Other {
            assert_eq!(
                root,
                PathBuf::from("/home/u/.local/state/maf-sandbox-docker-sbx/workspaces")
            );
        }
        let homeless = SbxConfig {
            management_env: Some(vec![]),
            ..SbxConfig::default()
        };
        assert_eq!(
            homeless.check().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn refused_workspace_roots() {
        for root in [
            "/",
            "/home",
            "/home/u",
            "/home/u/.ssh/x",
            "/home/u/.aws",
            "/home/u/.local/state/sandboxes",
            "/home/u/.local/state/sandboxes/mine",
        ] {
            let error = config_with(root).check().unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{root}: {error}");
        }
        for root in [
            "/home/u/.local/state/sandboxes-other",
            "/home/u/work/ws",
            "/var/lib/ws",
        ] {
            config_with(root)
                .check()
                .unwrap_or_else(|e| panic!("{root}: {e}"));
        }
    }

    #[test]
    fn relative_roots_are_made_absolute_without_resolving_links() {
        let checked = config_with("some/relative").check().unwrap();
        assert!(checked.root.is_absolute());
        assert!(checked.root.ends_with("some/relative"));
    }

    #[test]
    fn refused_values() {
        let base = config_with("/srv/ws");
        let cases: Vec<(&str, SbxConfig)> = vec![
            (
                "empty sbx path",
                SbxConfig {
                    sbx_path: PathBuf::new(),
                    ..base.clone()
                },
            ),
            (
                "prefix",
                SbxConfig {
                    name_prefix: "Maf".into(),
                    ..base.clone()
                },
            ),
            (
                "long prefix",
                SbxConfig {
                    name_prefix: "a".repeat(17),
                    ..base.clone()
                },
            ),
            (
                "cpus",
                SbxConfig {
                    cpus: 0,
                    ..base.clone()
                },
            ),
            (
                "command timeout",
                SbxConfig {
                    command_timeout: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "create timeout",
                SbxConfig {
                    create_timeout: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "cleanup timeout",
                SbxConfig {
                    exec_cleanup_timeout: Duration::ZERO,
                    ..base.clone()
                },
            ),
        ];
        for (what, config) in cases {
            assert_eq!(
                config.check().unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{what}"
            );
        }
    }

    #[test]
    fn memory_sizes() {
        for good in ["2g", "512m", "1G", "4096M", "10g"] {
            check_memory(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["", "g", "0g", "02g", "2", "2gb", "2k", "-2g", "2.5g", " 2g"] {
            assert!(check_memory(bad).is_err(), "{bad:?}");
        }
    }
}
