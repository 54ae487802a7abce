//! The configured OCI runtime, verified per engine at connect (docs/docker-backend.md#gvisor):
//! the engine must list it, and one short-lived probe container under it must show gVisor's
//! kernel before the backend declares rung `hardened_container`. A runtime's name proves
//! nothing: a runtime registered as `runsc` that is runc is rung `container`.
//!
//! The probe runs the configured default image with the workload's hardening (every
//! capability dropped, no privilege gain, network `none`, the workload's pids and memory
//! limits) and
//! prints the kernel release and the first line of the kernel log. gVisor's own kernel
//! answers the log with `Starting gVisor...`; a host kernel refuses an unprivileged reader
//! (`dmesg_restrict`) or answers with its own boot log. Only that first line decides.

use std::collections::HashMap;
use std::sync::Arc;

use bollard::models::ContainerCreateBody;
use sandbox_core::backend_kit::CleanupOnDrop;
use sandbox_core::SandboxError;

use crate::config::{DockerConfig, Resources};
use crate::connection::EngineConnection;
use crate::containers::{hardened_host_config, Containers, Hardening};
use crate::egress_names::LABEL_ROLE;

/// The prefix of a probe container's name (a random suffix follows): the backend's prefix, so a
/// probe left behind is found with its other containers.
const PROBE_NAME: &str = "maf-sandbox-docker-runtime-probe-";

/// The probe's script, one tagged line each: the kernel release, the first kernel log line (empty
/// when unreadable), and whether the engine's init can make itself a subreaper here (what exact
/// kills need: docs/wrapper-protocol.md#exact-kills).
const PROBE_SCRIPT: &str = "echo \"release $(uname -r)\"; \
    echo \"log $(dmesg 2>/dev/null | head -n 1)\"; \
    if /sbin/docker-init -s -- true >/dev/null 2>&1; then echo 'subreaper yes'; \
    else echo 'subreaper no'; fi; exit 0";

/// The most probe output read.
const PROBE_BUDGET: usize = 4096;

/// How gVisor's kernel log begins.
const GVISOR_BANNER: &str = "Starting gVisor";

/// What connect found out about the configured runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeVerification {
    /// The runtime's name, as configured and as the engine lists it.
    pub runtime: String,
    /// The program the engine runs for it (`Runtimes.<name>.path`).
    pub path: String,
    /// The `--platform` among the runtime's engine-side arguments, when one is given (gVisor's
    /// way of intercepting system calls: `ptrace`, `kvm`, `systrap`).
    pub platform: Option<String>,
    /// The kernel release the probe container saw (`uname -r`).
    pub kernel_release: Option<String>,
    /// The probe container's first kernel log line, when it could read one.
    pub kernel_log: Option<String>,
    /// Whether the probe showed gVisor's kernel: the one condition for rung
    /// `hardened_container`.
    pub gvisor: bool,
    /// Whether the engine's init could make itself a subreaper under the runtime. Without it a
    /// timed-out call's kill reaches the command's process group only (gVisor's release
    /// 2022-12-19 lacks `PR_SET_CHILD_SUBREAPER`).
    pub subreaper: bool,
}

impl RuntimeVerification {
    /// Reads a probe's output (`release …`, `log …`, `subreaper yes|no` lines).
    pub(crate) fn from_probe(runtime: &str, path: &str, args: &[String], output: &str) -> Self {
        let field = |tag: &str| {
            output.lines().find_map(|line| {
                line.strip_prefix(tag)
                    .and_then(|rest| rest.strip_prefix(' '))
                    .map(str::trim)
                    .filter(|value| !value.is_empty())
                    .map(str::to_owned)
            })
        };
        let kernel_log = field("log");
        RuntimeVerification {
            runtime: runtime.to_owned(),
            path: path.to_owned(),
            platform: platform_of(args),
            gvisor: kernel_log
                .as_deref()
                .is_some_and(|line| log_message(line).starts_with(GVISOR_BANNER)),
            kernel_release: field("release"),
            kernel_log,
            subreaper: field("subreaper").as_deref() == Some("yes"),
        }
    }
}

/// A kernel log line without its `[seconds]` time stamp.
fn log_message(line: &str) -> &str {
    line.strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .map_or(line, |(_, message)| message)
        .trim_start()
}

/// The value of `--platform=X` or `--platform X` among a runtime's arguments; the last wins, as
/// in a flag parser.
pub(crate) fn platform_of(args: &[String]) -> Option<String> {
    let mut platform = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let word = word.trim_start_matches('-');
        if let Some(value) = word.strip_prefix("platform=") {
            platform = Some(value.to_owned());
        } else if word == "platform" {
            platform = words.next().cloned();
        }
    }
    platform
}

/// Verifies `config.runtime` on `engine`: listed by the engine (else InvalidArgument naming the
/// runtimes it lists), then one probe container under it. The probe is removed whatever
/// happens, even when this future is dropped.
///
/// # Errors
/// InvalidArgument for a runtime the engine does not list; what the engine answers when the
/// probe cannot be made, started or read (a runtime that cannot run a container cannot run a
/// sandbox either).
pub(crate) async fn verify(
    engine: &EngineConnection,
    config: &Arc<DockerConfig>,
    runtime: &str,
) -> Result<RuntimeVerification, SandboxError> {
    let info = engine
        .call(config.command_timeout, engine.api().info())
        .await
        .map_err(|f| engine.failure("engine info", f))?;
    let runtimes = info.runtimes.unwrap_or_default();
    let Some(listed) = runtimes.get(runtime) else {
        let mut names: Vec<&str> = runtimes.keys().map(String::as_str).collect();
        names.sort_unstable();
        return Err(SandboxError::invalid(format!(
            "the engine at {} lists no runtime {runtime:?} (it lists {}): register it in the \
             engine's daemon.json \"runtimes\" and reload the engine",
            engine.endpoint(),
            names.join(", ")
        )));
    };
    let path = listed.path.clone().unwrap_or_default();
    let args = listed.runtime_args.clone().unwrap_or_default();
    let memory: Arc<crate::memory::Memories> = Arc::default();
    let claims = Arc::new(crate::claims::ClaimRecords::new(
        engine.clone(),
        Arc::clone(config),
        Arc::clone(&memory),
    ));
    let containers = Arc::new(Containers::new(
        engine.clone(),
        Arc::clone(config),
        memory,
        claims,
    ));
    let output = probe(&containers, config, runtime).await?;
    let verification = RuntimeVerification::from_probe(runtime, &path, &args, &output);
    tracing::info!(
        runtime,
        path = %verification.path,
        platform = ?verification.platform,
        kernel = ?verification.kernel_release,
        gvisor = verification.gvisor,
        "runtime verified by a probe container"
    );
    Ok(verification)
}

/// Makes, runs and removes one probe container under `runtime`; its output.
async fn probe(
    containers: &Arc<Containers>,
    config: &DockerConfig,
    runtime: &str,
) -> Result<String, SandboxError> {
    let suffix = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    let name = format!("{PROBE_NAME}{}", &suffix.as_str()[..12]);
    let image = config.default_image.as_str();
    // The workload's own limits: under gVisor the pids and memory limits bound the host tasks
    // and memory of gVisor's kernel too, so a limit too small for it fails here, at connect.
    let resources = Resources::clamped(config, 0, 0);
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        entrypoint: Some(vec!["sh".to_owned()]),
        cmd: Some(vec!["-c".to_owned(), PROBE_SCRIPT.to_owned()]),
        labels: Some(HashMap::from([(
            LABEL_ROLE.to_owned(),
            "runtime-probe".to_owned(),
        )])),
        host_config: Some(hardened_host_config(Hardening {
            pids_limit: i64::from(config.pids_limit),
            resources,
            network: "none",
            egress_volume: None,
            runtime: Some(runtime),
        })),
        ..ContainerCreateBody::default()
    };
    containers.ensure_image(image).await?;
    let id = match containers
        .create_named(&name, image, body, "runtime probe create")
        .await?
    {
        Ok(id) => id,
        Err(taken) => {
            return Err(SandboxError::engine(format!(
                "the runtime probe's name {name} was taken: {taken}"
            )))
        }
    };
    let removal = {
        let containers = Arc::clone(containers);
        let id = id.clone();
        CleanupOnDrop::armed("runtime probe removal", async move {
            if let Err(failure) = containers.remove(&id).await {
                tracing::warn!(container = %id, %failure, "could not remove the runtime probe");
            }
        })
    };
    let output = containers
        .run_to_exit(&id, PROBE_BUDGET, "runtime probe")
        .await;
    let _ = removal.run_now().await;
    Ok(String::from_utf8_lossy(&output?).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn only_gvisors_kernel_log_verifies_the_runtime() {
        let gvisor = RuntimeVerification::from_probe(
            "runsc",
            "/usr/bin/runsc",
            &args(&["--platform=ptrace"]),
            "release 4.4.0\nlog [    0.000000] Starting gVisor...\nsubreaper no\n",
        );
        assert!(gvisor.gvisor);
        assert!(!gvisor.subreaper);
        assert_eq!(gvisor.kernel_release.as_deref(), Some("4.4.0"));
        assert_eq!(gvisor.platform.as_deref(), Some("ptrace"));
        assert!(gvisor.kernel_log.unwrap().contains("Starting gVisor"));
        // Without a time stamp, too.
        assert!(
            RuntimeVerification::from_probe("runsc", "", &[], "log Starting gVisor...\n").gvisor
        );

        // runc under the same name: the host kernel, whose log an unprivileged reader cannot
        // read, or whose log is its own.
        for output in [
            "release 6.1.0-57-amd64\nlog \nsubreaper yes\n",
            "release 6.1.0-57-amd64\nlog [    0.000000] Linux version 6.1.0\nsubreaper yes\n",
            "release 4.4.0\n",
            "",
            // The banner only counts as the log line, not as the release or untagged.
            "release Starting gVisor...\n",
            "Starting gVisor...\n",
            "log not Starting gVisor\n",
            "log [    0.000000] Linux says Starting gVisor\n",
        ] {
            let verdict = RuntimeVerification::from_probe("runsc", "runc", &[], output);
            assert!(!verdict.gvisor, "{output:?} verified");
        }
        let runc = RuntimeVerification::from_probe(
            "runsc-fake",
            "runc",
            &[],
            "release 6.1.0\nlog \nsubreaper yes\n",
        );
        assert!(runc.subreaper);
        assert_eq!(runc.kernel_log, None);
        assert_eq!(runc.kernel_release.as_deref(), Some("6.1.0"));
    }

    #[test]
    fn the_platform_is_read_from_either_flag_form() {
        assert_eq!(
            platform_of(&args(&["--platform=kvm"])).as_deref(),
            Some("kvm")
        );
        assert_eq!(
            platform_of(&args(&["--debug", "--platform", "ptrace"])).as_deref(),
            Some("ptrace")
        );
        assert_eq!(
            platform_of(&args(&["-platform=kvm", "--platform=systrap"])).as_deref(),
            Some("systrap")
        );
        assert_eq!(platform_of(&args(&["--network=none"])), None);
        assert_eq!(platform_of(&args(&["--platform"])), None);
    }
}
