//! The backend's configuration (docker.md §2) and its validation.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use sandbox_core::SandboxError;

/// The image used when a spec names neither `image_id` nor `image`.
pub const DEFAULT_IMAGE: &str = "sandbox-base:local";

/// Deadline of every docker call but `exec` (and the explicit pull).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Deadline of the kill call after an expired exec.
pub const DEFAULT_EXEC_CLEANUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Deadline of the explicit `docker pull` of an absent image.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// The pids limit every container gets unless configured otherwise.
pub const DEFAULT_PIDS_LIMIT: u32 = 512;

/// Where the egress preflight (host-hygiene.md §4) knocks, from inside a closed sandbox.
///
/// The defaults are public addresses for operators; every test sets local ones.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EgressProbe {
    /// A URL naming its host by IP literal (default `https://1.1.1.1/`).
    pub by_address: String,
    /// A URL naming its host by DNS name (default `https://example.com/`).
    pub by_name: String,
    /// The address the host-side token server binds to; `None` = the default bridge's gateway
    /// (`docker network inspect bridge`). Never a wildcard address.
    pub token_server: Option<IpAddr>,
}

impl Default for EgressProbe {
    fn default() -> Self {
        EgressProbe {
            by_address: "https://1.1.1.1/".to_owned(),
            by_name: "https://example.com/".to_owned(),
            token_server: None,
        }
    }
}

impl EgressProbe {
    /// Probe targets chosen by the caller (tests pass local ones).
    pub fn new(
        by_address: impl Into<String>,
        by_name: impl Into<String>,
        token_server: Option<IpAddr>,
    ) -> Self {
        EgressProbe {
            by_address: by_address.into(),
            by_name: by_name.into(),
            token_server,
        }
    }
}

/// How [`DockerBackend`](crate::DockerBackend) reaches and configures the engine.
///
/// Start from [`DockerConfig::default`] and set fields; [`DockerBackend::connect`](crate::DockerBackend::connect)
/// validates it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DockerConfig {
    /// The Docker CLI (default `docker`, looked up on the management env's `PATH`).
    pub docker_path: PathBuf,
    /// The context to pin; `None` = the CLI's current context, resolved once at connect.
    pub context: Option<String>,
    /// The image for specs that name none.
    pub default_image: String,
    /// Deadline of every docker call but `exec`.
    pub command_timeout: Duration,
    /// Deadline of the kill call after an expired exec.
    pub exec_cleanup_timeout: Duration,
    /// Deadline of the explicit pull of an absent image.
    pub pull_timeout: Duration,
    /// `--pids-limit` of every container.
    pub pids_limit: u32,
    /// `--memory`, when set.
    pub memory: Option<String>,
    /// `--cpus`, when set.
    pub cpus: Option<String>,
    /// Run the egress preflight on every created sandbox (needs `curl` in the image).
    pub verify_egress: bool,
    /// The preflight's targets.
    pub egress_probe: EgressProbe,
    /// The environment of every docker call; `None` = a snapshot of this process's environment
    /// taken at connect. Never read again afterwards.
    pub management_env: Option<Vec<(OsString, OsString)>>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            docker_path: PathBuf::from("docker"),
            context: None,
            default_image: DEFAULT_IMAGE.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            exec_cleanup_timeout: DEFAULT_EXEC_CLEANUP_TIMEOUT,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            pids_limit: DEFAULT_PIDS_LIMIT,
            memory: None,
            cpus: None,
            verify_egress: false,
            egress_probe: EgressProbe::default(),
            management_env: None,
        }
    }
}

impl DockerConfig {
    /// Refuses what would make a docker argument ambiguous or a bound meaningless.
    pub(crate) fn validate(&self) -> Result<(), SandboxError> {
        if self.docker_path.as_os_str().is_empty() {
            return Err(SandboxError::invalid("docker_path is empty"));
        }
        for (name, value) in [
            ("command_timeout", self.command_timeout),
            ("exec_cleanup_timeout", self.exec_cleanup_timeout),
            ("pull_timeout", self.pull_timeout),
        ] {
            if value.is_zero() {
                return Err(SandboxError::invalid(format!(
                    "{name} must be greater than zero"
                )));
            }
        }
        if self.pids_limit == 0 {
            return Err(SandboxError::invalid("pids_limit must be at least 1"));
        }
        if let Some(context) = &self.context {
            check_cli_word("context", context)?;
        }
        check_image_reference(&self.default_image)?;
        for (name, value) in [("memory", &self.memory), ("cpus", &self.cpus)] {
            if let Some(value) = value {
                check_cli_word(name, value)?;
            }
        }
        Ok(())
    }

    /// A short fingerprint of the hardening this configuration applies, part of the warm cache's
    /// policy (docker.md rule 20).
    pub(crate) fn hardening_fingerprint(&self) -> String {
        format!(
            "pids={};memory={};cpus={}",
            self.pids_limit,
            self.memory.as_deref().unwrap_or("-"),
            self.cpus.as_deref().unwrap_or("-")
        )
    }
}

/// A value passed as one docker argument: non-empty, no NUL, no whitespace, no leading `-`.
fn check_cli_word(name: &str, value: &str) -> Result<(), SandboxError> {
    if value.is_empty()
        || value.starts_with('-')
        || value.chars().any(|c| c == '\0' || c.is_whitespace())
    {
        return Err(SandboxError::invalid(format!(
            "{name} {value:?} must be one non-empty word not starting with '-'"
        )));
    }
    Ok(())
}

/// An image reference as docker takes it: one word, never an option.
pub(crate) fn check_image_reference(image: &str) -> Result<(), SandboxError> {
    check_cli_word("image reference", image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    #[test]
    fn defaults_are_the_spec_numbers_and_valid() {
        let config = DockerConfig::default();
        assert_eq!(config.command_timeout, Duration::from_secs(60));
        assert_eq!(config.exec_cleanup_timeout, Duration::from_secs(15));
        assert_eq!(config.pids_limit, 512);
        assert_eq!(config.default_image, "sandbox-base:local");
        assert!(!config.verify_egress);
        config.validate().unwrap();
    }

    #[test]
    fn refuses_meaningless_values() {
        type Change = Box<dyn Fn(&mut DockerConfig)>;
        let cases: Vec<Change> = vec![
            Box::new(|c| c.command_timeout = Duration::ZERO),
            Box::new(|c| c.exec_cleanup_timeout = Duration::ZERO),
            Box::new(|c| c.pids_limit = 0),
            Box::new(|c| c.default_image = "--privileged".into()),
            Box::new(|c| c.default_image = String::new()),
            Box::new(|c| c.memory = Some("1g --privileged".into())),
            Box::new(|c| c.cpus = Some("-1".into())),
            Box::new(|c| c.context = Some(String::new())),
            Box::new(|c| c.docker_path = PathBuf::new()),
        ];
        for change in cases {
            let mut config = DockerConfig::default();
            change(&mut config);
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::InvalidArgument
            );
        }
    }

    #[test]
    fn fingerprint_names_every_hardening_knob() {
        let mut config = DockerConfig::default();
        let plain = config.hardening_fingerprint();
        config.memory = Some("512m".into());
        assert_ne!(plain, config.hardening_fingerprint());
        assert!(config.hardening_fingerprint().contains("512m"));
    }
}
