//! `doctor`: asks the chosen backend for its health checks, then proves the whole path with a
//! throwaway sandbox (acquire, one exec, dispose). Reads, never writes host settings; exits 0 only
//! when no check failed.

use std::time::Duration;

use backend_docker::{DockerBackend, EgressProbe};
use backend_sbx::SbxBackend;
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, HealthCheck, SandboxBackend, SandboxError, SandboxSpec,
};
use serde_json::json;

use crate::backends::{connect_sbx, docker_config, sbx_config};
use crate::cli::{BackendChoice, GlobalArgs};
use crate::keys::generated_key;

/// Runs `doctor` and returns its exit status (0 when no check failed, 1 otherwise, 2 for a usage
/// error).
pub async fn doctor(global: &GlobalArgs, egress_probe: &[String]) -> u8 {
    if egress_probe.len() > 2 {
        let message = "--egress-probe takes at most two URLs (one by address, one by name)";
        if global.json {
            crate::report::print_json(&json!({"error": {"kind": "Usage", "message": message}}));
        }
        eprintln!("sandboxctl: {message}");
        return crate::exit_codes::USAGE;
    }
    let checks = match global.backend {
        BackendChoice::Docker => docker_checks(global, egress_probe).await,
        BackendChoice::Sbx => sbx_checks(global).await,
        BackendChoice::Qemu => qemu_checks(global).await,
    };
    print(&checks, global.json);
    u8::from(checks.iter().any(HealthCheck::failed))
}

fn print(checks: &[HealthCheck], as_json: bool) {
    if as_json {
        let ok = !checks.iter().any(HealthCheck::failed);
        let items: Vec<_> = checks
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "status": c.status.as_str(),
                    "detail": c.detail,
                    "fix": c.fix,
                })
            })
            .collect();
        crate::report::print_json(&json!({ "ok": ok, "checks": items }));
        return;
    }
    for c in checks {
        let word = match c.status {
            sandbox_core::CheckStatus::Pass => "pass",
            sandbox_core::CheckStatus::Fail => "FAIL",
            sandbox_core::CheckStatus::NotApplicable => "n/a ",
        };
        if c.fix.is_empty() {
            println!("{word}  {:<22} {}", c.id, c.detail);
        } else {
            println!("{word}  {:<22} {} (fix: {})", c.id, c.detail, c.fix);
        }
    }
}

async fn docker_checks(global: &GlobalArgs, egress_probe: &[String]) -> Vec<HealthCheck> {
    // As `run` connects: `run --allow` needs the proxy image and the outbound network.
    let mut config = docker_config(global, &[]);
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
async fn sbx_checks(global: &GlobalArgs) -> Vec<HealthCheck> {
    let mut checks = SbxBackend::health_checks(sbx_config(global, &[])).await;
    if checks.iter().any(HealthCheck::failed) {
        return checks;
    }
    let check = match connect_sbx(global, &[]).await {
        Ok(backend) => {
            throwaway_sandbox(
                "sbx.sandbox",
                &backend,
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

/// QEMU, the accelerator and why, the image; then a throwaway VM.
#[cfg(target_os = "linux")]
async fn qemu_checks(global: &GlobalArgs) -> Vec<HealthCheck> {
    let mut checks = Vec::new();
    let qemu = tokio::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), qemu).await {
        Ok(Ok(out)) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text.lines().next().unwrap_or_default().trim().to_owned();
            checks.push(HealthCheck::pass("qemu.program", version));
        }
        _ => {
            checks.push(HealthCheck::fail(
                "qemu.program",
                "qemu-system-x86_64 does not run",
                "apt-get install qemu-system-x86",
            ));
            return checks;
        }
    }
    let config = match crate::backends::qemu_config(global) {
        Ok(config) => config,
        Err(e) => {
            checks.push(HealthCheck::fail("qemu.image", e.to_string(), ""));
            return checks;
        }
    };
    match qemu_vm::VmImage::load(&config.image_dir) {
        Ok(image) => checks.push(HealthCheck::pass(
            "qemu.image",
            format!(
                "{} (digest {}, kernel {})",
                config.image_dir.display(),
                image.digest,
                image.kernel_release
            ),
        )),
        Err(e) => {
            checks.push(HealthCheck::fail(
                "qemu.image",
                e.to_string(),
                "sandboxctl images build vm",
            ));
            return checks;
        }
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
async fn qemu_checks(_global: &GlobalArgs) -> Vec<HealthCheck> {
    vec![HealthCheck::fail(
        "qemu.program",
        "the qemu backend runs on Linux hosts only",
        "",
    )]
}

/// Acquires a sandbox under a fresh key, runs `true` in it and disposes of it: `id` passes only
/// when all three do.
async fn throwaway_sandbox(
    id: &str,
    backend: &dyn SandboxBackend,
    spec: sandbox_core::SandboxSpecBuilder,
    purge_fix: &str,
    passed: &str,
) -> HealthCheck {
    let key = generated_key();
    let ran = async {
        let spec = spec.build()?;
        let sandbox = backend.acquire(&key, &spec).await?;
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["true"])).timeout(Duration::from_secs(30)))
            .await?;
        Ok::<i32, SandboxError>(out.exit_code)
    }
    .await;
    let disposal = backend.dispose(&key, DisposeSelector::all()).await;
    match (ran, disposal) {
        (Err(e), _) => HealthCheck::fail(id, e.to_string(), "see the checks above"),
        (Ok(code), _) if code != 0 => HealthCheck::fail(id, format!("`true` exited {code}"), ""),
        (Ok(_), Some(f)) => {
            HealthCheck::fail(id, format!("disposal left something: {f}"), purge_fix)
        }
        (Ok(_), None) => HealthCheck::pass(id, passed),
    }
}
