//! The health report of the chosen backend, for every host (`sandboxctl doctor`): the backend's
//! own checks, then a throwaway sandbox that proves the whole path (acquire, one exec, dispose).
//! Reads host settings, never writes them.

use std::time::Duration;

use backend_docker::{DockerBackend, EgressProbe};
use backend_sbx::SbxBackend;
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, HealthCheck, SandboxBackend, SandboxError, SandboxKey,
    SandboxSpec, SandboxSpecBuilder,
};

use crate::{connect_sbx, docker_config, sbx_config, BackendArgs, BackendChoice};

/// How long the throwaway sandbox's `true` may run.
const THROWAWAY_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// The chosen backend's checks, in order, ending with one `<backend>.sandbox` check: a sandbox
/// acquired under `throwaway_key`, `true` run in it, and everything under that key disposed of.
/// The throwaway check runs only when every check before it passed. `egress_probe` (at most two
/// URLs: by address, then by name) is for the docker backend, whose throwaway sandbox then also
/// proves that egress is closed; the other backends ignore it.
///
/// # Cancel safety and drop
/// Dropping the future drops the request in flight; a throwaway sandbox acquired by then stays
/// under `throwaway_key` until a purge.
pub async fn health(
    args: &BackendArgs,
    egress_probe: &[String],
    throwaway_key: &SandboxKey,
) -> Vec<HealthCheck> {
    match args.backend {
        BackendChoice::Docker => docker_checks(args, egress_probe, throwaway_key).await,
        BackendChoice::Sbx => sbx_checks(args, throwaway_key).await,
        BackendChoice::Qemu => qemu_checks(args, throwaway_key).await,
    }
}

async fn docker_checks(
    args: &BackendArgs,
    egress_probe: &[String],
    key: &SandboxKey,
) -> Vec<HealthCheck> {
    // As `run` connects: `run --allow` needs the proxy image and the outbound network.
    let mut config = docker_config(args, &[]);
    let mut checks = DockerBackend::health_checks(&config).await;
    checks.push(HealthCheck::not_applicable(
        "sbx",
        "the sbx host is checked by `sandboxctl --backend sbx doctor`",
    ));
    if checks.iter().any(HealthCheck::failed) {
        return checks;
    }
    // The throwaway sandbox also proves, with the egress preflight, that it reaches nothing.
    config.verify_egress = true;
    if let [first, rest @ ..] = egress_probe {
        let by_name = rest.first().unwrap_or(first);
        config.egress_probe = EgressProbe::new(first.clone(), by_name.clone(), None);
    }
    let check = match DockerBackend::connect(config).await {
        Ok(backend) => {
            let image = backend.config().default_image.clone();
            throwaway_sandbox(
                "docker.sandbox",
                &backend,
                key,
                SandboxSpec::builder("doctor").image(image),
                "sandboxctl purge",
                "acquire (egress proven closed), exec and dispose of a throwaway sandbox",
            )
            .await
        }
        Err(e) => HealthCheck::fail("docker.sandbox", e.to_string(), "see the checks above"),
    };
    checks.push(check);
    checks
}

/// The sbx host; then a throwaway sandbox, whose create runs the mount proof (user namespaces and
/// `mount --bind` in the template).
async fn sbx_checks(args: &BackendArgs, key: &SandboxKey) -> Vec<HealthCheck> {
    let mut checks = SbxBackend::health_checks(sbx_config(args, &[])).await;
    if checks.iter().any(HealthCheck::failed) {
        return checks;
    }
    let check = match connect_sbx(args, &[]).await {
        Ok(backend) => {
            throwaway_sandbox(
                "sbx.sandbox",
                &backend,
                key,
                SandboxSpec::builder("doctor"),
                "sandboxctl --backend sbx purge",
                "created (mount proof passed: user namespaces and bind mounts work in the template), ran `true`, disposed",
            )
            .await
        }
        Err(e) => HealthCheck::fail("sbx.sandbox", e.to_string(), "see the checks above"),
    };
    checks.push(check);
    checks
}

/// The QEMU program, `qemu-img` and the image (the backend's own checks); then the accelerator
/// and the rung it gives, which connecting probes; then a throwaway VM.
#[cfg(target_os = "linux")]
async fn qemu_checks(args: &BackendArgs, key: &SandboxKey) -> Vec<HealthCheck> {
    let config = match crate::qemu_config(args) {
        Ok(config) => config,
        Err(e) => return vec![HealthCheck::fail("qemu.image", e.to_string(), "")],
    };
    let mut checks = backend_qemu::health_checks(&config).await;
    if checks.iter().any(HealthCheck::failed) {
        return checks;
    }
    match backend_qemu::QemuBackend::connect(config).await {
        Ok(backend) => {
            let accel = backend.accelerator();
            checks.push(HealthCheck::pass(
                "qemu.accelerator",
                format!(
                    "{} ({}); rung {}",
                    accel.accel.name(),
                    accel.reason,
                    backend.isolation()
                ),
            ));
            checks.push(
                throwaway_sandbox(
                    "qemu.sandbox",
                    &backend,
                    key,
                    SandboxSpec::builder("doctor"),
                    "sandboxctl --backend qemu purge",
                    "booted a VM, ran `true`, disposed",
                )
                .await,
            );
        }
        Err(e) => checks.push(HealthCheck::fail(
            "qemu.accelerator",
            e.to_string(),
            "on a host without hardware KVM pass --allow-emulation (rung container)",
        )),
    }
    checks
}

#[cfg(not(target_os = "linux"))]
async fn qemu_checks(_args: &BackendArgs, _key: &SandboxKey) -> Vec<HealthCheck> {
    vec![HealthCheck::fail(
        "qemu.program",
        "the qemu backend runs on Linux hosts only",
        "",
    )]
}

/// Acquires a sandbox under `key`, runs `true` in it and disposes of everything under `key`:
/// `id` passes only when all three do.
async fn throwaway_sandbox(
    id: &str,
    backend: &dyn SandboxBackend,
    key: &SandboxKey,
    spec: SandboxSpecBuilder,
    purge_fix: &str,
    passed: &str,
) -> HealthCheck {
    let ran = async {
        let spec = spec.build()?;
        let sandbox = backend.acquire(key, &spec).await?;
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["true"])).timeout(THROWAWAY_EXEC_TIMEOUT))
            .await?;
        Ok::<i32, SandboxError>(out.exit_code)
    }
    .await;
    let disposal = backend.dispose(key, DisposeSelector::all()).await;
    match (ran, disposal) {
        (Err(e), _) => HealthCheck::fail(id, e.to_string(), "see the checks above"),
        (Ok(code), _) if code != 0 => HealthCheck::fail(id, format!("`true` exited {code}"), ""),
        (Ok(_), Some(f)) => {
            HealthCheck::fail(id, format!("disposal left something: {f}"), purge_fix)
        }
        (Ok(_), None) => HealthCheck::pass(id, passed),
    }
}
