//! The one place that names concrete backends. Commands see only `Arc<dyn SandboxBackend>`, so a new
//! backend joins here without changing any command.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use backend_docker::{
    DockerBackend, DockerConfig, EgressProbe, ImageOutcome, ImageRecipe, LocalImage,
};
use backend_sbx::{SbxBackend, SbxConfig};
use exec_wrapper::{BoundedCommand, ExitKind};
use sandbox_core::{
    Command, DisposeSelector, ExecRequest, SandboxBackend, SandboxError, SandboxSpec,
};
use serde_json::json;

use crate::cli::{BackendChoice, GlobalArgs};
use crate::keys::generated_key;

/// Connects the chosen backend. `guest_names` are the `--env` names whose values are meant for the guest.
pub async fn connect(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    match global.backend {
        BackendChoice::Docker => {
            let mut config = DockerConfig::default();
            config.management_env = Some(management_env(std::env::vars_os(), guest_names));
            Ok(Arc::new(DockerBackend::connect(config).await?))
        }
        BackendChoice::Sbx => Ok(Arc::new(connect_sbx(global, guest_names).await?)),
    }
}

async fn connect_sbx(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<SbxBackend, SandboxError> {
    let mut config = SbxConfig::default();
    config.sbx_path = global.sbx_path.clone();
    config.simulator_ok = global.allow_simulator;
    config.management_env = Some(management_env(std::env::vars_os(), guest_names));
    SbxBackend::connect(config).await
}

/// The engine client's environment: sandboxctl's own, minus the variables named by `--env`. Their values
/// go to the guest through the backend's env file; left here they would also sit in every docker client's
/// environment (host-hygiene rule 5). Names the client itself needs to reach its daemon stay (rule 1): a
/// guest may be given `PATH` or `HOME` too.
fn management_env(
    own: impl IntoIterator<Item = (OsString, OsString)>,
    guest_names: &[String],
) -> Vec<(OsString, OsString)> {
    let client_needs = |name: &str| {
        matches!(name, "PATH" | "HOME" | "LOCALAPPDATA")
            || name.starts_with("XDG_")
            || name.starts_with("DOCKER_")
    };
    own.into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            client_needs(&name) || !guest_names.iter().any(|g| *g == name)
        })
        .collect()
}

fn sbx_has_no_images() -> SandboxError {
    SandboxError::invalid(
        "the local images are the docker backend's; sbx sandboxes start from sbx templates",
    )
}

fn recipe() -> ImageRecipe {
    ImageRecipe::new().progress(|line| eprintln!("sandboxctl images: {line}"))
}

/// The default image's reference, built locally first when it is missing (no registry needed);
/// `None` for sbx, whose default is its own `shell` template. `guest_names` as for [`connect`]:
/// the presence check runs with the same client environment.
pub async fn ensure_default_image(
    choice: BackendChoice,
    guest_names: &[String],
) -> Result<Option<String>, SandboxError> {
    match choice {
        BackendChoice::Docker => {
            let image = LocalImage::DEFAULT;
            // The command's stderr is relayed byte for byte: say nothing unless a build is needed.
            if image_present(image.tag(), guest_names).await {
                return Ok(Some(image.tag().to_owned()));
            }
            if guest_names.is_empty() {
                recipe()
                    .build(&[image])
                    .await
                    .map_err(|e| SandboxError::ImageMissing {
                        image: image.tag().into(),
                        hint: format!("building it locally failed: {e}"),
                    })?;
            } else {
                build_in_a_child(image, guest_names).await?;
            }
            Ok(Some(image.tag().to_owned()))
        }
        BackendChoice::Sbx => Ok(None),
    }
}

/// Builds `image` in a child `sandboxctl images build` whose environment lacks the `--env` values:
/// the recipe's own tools inherit their process's environment, and a guest value must never sit in
/// a host process's environment other than the guest's own.
async fn build_in_a_child(image: LocalImage, guest_names: &[String]) -> Result<(), SandboxError> {
    let failed = |why: String| SandboxError::ImageMissing {
        image: image.tag().into(),
        hint: format!("building it locally failed: {why}"),
    };
    let me = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
    let build = BoundedCommand::new(me, Duration::from_secs(30 * 60))
        .args(["images", "build", image.tag()])
        .envs(management_env(std::env::vars_os(), guest_names))
        .output_budget(1 << 20)
        .on_line(|_, line| {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line);
        })
        .run()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if build.status == ExitKind::Exited(0) {
        Ok(())
    } else {
        Err(failed(format!(
            "`sandboxctl images build` ended with {:?}",
            build.status
        )))
    }
}

/// Whether `tag` is in the engine's image store, asked with the management env of [`connect`], so no
/// `--env` value reaches the docker client.
async fn image_present(tag: &str, guest_names: &[String]) -> bool {
    docker_read(
        &["image", "inspect", "--format", "{{.Id}}", tag],
        guest_names,
    )
    .await
    .is_ok()
}

/// Builds the named local images (default: the default image); returns (tag, outcome) per image.
pub async fn build_images(
    choice: BackendChoice,
    tags: &[String],
) -> Result<Vec<(String, &'static str)>, SandboxError> {
    if choice == BackendChoice::Sbx {
        return Err(sbx_has_no_images());
    }
    let images = if tags.is_empty() {
        vec![LocalImage::DEFAULT]
    } else {
        tags.iter()
            .map(|t| LocalImage::from_tag(t).map_err(|e| SandboxError::invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?
    };
    let reports = recipe()
        .build(&images)
        .await
        .map_err(|e| SandboxError::engine(format!("image build failed: {e}")))?;
    Ok(reports
        .into_iter()
        .map(|r| {
            let outcome = match r.outcome {
                ImageOutcome::AlreadyPresent => "already present",
                _ => "built",
            };
            (r.image.tag().to_owned(), outcome)
        })
        .collect())
}

/// One line of `doctor`.
struct Check {
    id: &'static str,
    passed: Option<bool>,
    detail: String,
    fix: String,
}

impl Check {
    fn pass(id: &'static str, detail: impl Into<String>) -> Self {
        Check {
            id,
            passed: Some(true),
            detail: detail.into(),
            fix: String::new(),
        }
    }
    fn fail(id: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            id,
            passed: Some(false),
            detail: detail.into(),
            fix: fix.into(),
        }
    }
    fn not_applicable(id: &'static str, detail: impl Into<String>) -> Self {
        Check {
            id,
            passed: None,
            detail: detail.into(),
            fix: String::new(),
        }
    }
}

/// A bounded read-only `docker` call with the management env (minus the `guest_names`); returns
/// trimmed stdout or a one-line reason.
async fn docker_read(args: &[&str], guest_names: &[String]) -> Result<String, String> {
    let read = BoundedCommand::new("docker", Duration::from_secs(20))
        .args(args.iter().copied())
        .envs(management_env(std::env::vars_os(), guest_names))
        .output_budget(1 << 20)
        .run()
        .await;
    match read {
        Ok(out) if out.status == ExitKind::Exited(0) => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr)
            .trim()
            .lines()
            .last()
            .unwrap_or("failed")
            .to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// `doctor`: reads, never writes host settings; exits 0 only when every applicable item passes.
pub async fn doctor(global: &GlobalArgs, egress_probe: &[String]) -> u8 {
    let mut checks = Vec::new();
    if egress_probe.len() > 2 {
        let message = "--egress-probe takes at most two URLs (one by address, one by name)";
        if global.json {
            crate::report::print_json(&json!({"error": {"kind": "Usage", "message": message}}));
        }
        eprintln!("sandboxctl: {message}");
        return crate::exit_codes::USAGE;
    }
    if global.backend == BackendChoice::Sbx {
        sbx_checks(&mut checks, global).await;
    } else {
        docker_checks(&mut checks, egress_probe).await;
    }
    let ok = checks.iter().all(|c| c.passed != Some(false));
    if global.json {
        let items: Vec<_> = checks
            .iter()
            .map(|c| json!({
                "id": c.id,
                "status": match c.passed { Some(true) => "pass", Some(false) => "fail", None => "not_applicable" },
                "detail": c.detail,
                "fix": c.fix,
            }))
            .collect();
        crate::report::print_json(&json!({ "ok": ok, "checks": items }));
    } else {
        for c in &checks {
            let word = match c.passed {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "n/a ",
            };
            if c.fix.is_empty() {
                println!("{word}  {:<22} {}", c.id, c.detail);
            } else {
                println!("{word}  {:<22} {} (fix: {})", c.id, c.detail, c.fix);
            }
        }
    }
    u8::from(!ok)
}

async fn docker_checks(checks: &mut Vec<Check>, egress_probe: &[String]) {
    // `docker --version` answers without a daemon, so a missing engine is not read as a missing client.
    match docker_read(&["--version"], &[]).await {
        Ok(v) => checks.push(Check::pass("docker.client", v)),
        Err(e) => {
            checks.push(Check::fail(
                "docker.client",
                e,
                "install Docker (Debian: apt-get install docker.io)",
            ));
            return;
        }
    }
    // The endpoint the backend itself pins: the CLI's resolution order, read from this
    // process's management environment, without asking the CLI.
    match backend_docker::Endpoint::resolve(&management_env(std::env::vars_os(), &[]), None) {
        Ok(endpoint) => checks.push(Check::pass(
            "docker.context",
            format!("the backend pins the engine at {endpoint}"),
        )),
        Err(e) => checks.push(Check::fail(
            "docker.context",
            e.to_string(),
            "fix DOCKER_HOST / DOCKER_CONTEXT, or docker context use default",
        )),
    }
    match docker_read(&["version", "--format", "{{.Server.Os}}"], &[]).await {
        Ok(os) if os == "linux" => {
            checks.push(Check::pass("docker.engine", "engine reachable"));
            checks.push(Check::pass("docker.engine_os", "engine OS linux"));
        }
        Ok(os) => {
            checks.push(Check::pass("docker.engine", "engine reachable"));
            checks.push(Check::fail(
                "docker.engine_os",
                format!("engine OS {os}"),
                "use a Linux engine",
            ));
        }
        Err(e) => {
            checks.push(Check::fail(
                "docker.engine",
                e,
                "start the engine (dockerd) or fix DOCKER_HOST",
            ));
            return;
        }
    }
    match docker_read(&["info", "--format", "{{.InitBinary}}"], &[]).await {
        Ok(init) if !init.is_empty() => checks.push(Check::pass(
            "kernel.init",
            format!("engine init binary {init} (for --init)"),
        )),
        Ok(_) | Err(_) => checks.push(Check::fail(
            "kernel.init",
            "the engine names no init binary",
            "install docker-init (Debian: tini)",
        )),
    }
    checks.push(kernel_pids_check());
    let image = LocalImage::DEFAULT.tag();
    match recipe().image_id(image).await {
        Ok(Some(_)) => checks.push(Check::pass("docker.image", format!("{image} present"))),
        Ok(None) => checks.push(Check::fail(
            "docker.image",
            format!("{image} missing"),
            "sandboxctl images build",
        )),
        Err(e) => checks.push(Check::fail(
            "docker.image",
            e.to_string(),
            "sandboxctl images build",
        )),
    }
    checks.push(Check::not_applicable(
        "sbx",
        "the sbx host is checked by `sandboxctl --backend sbx doctor`",
    ));
    checks.push(throwaway_sandbox(egress_probe).await);
}

/// `--pids-limit` needs the pids cgroup controller.
fn kernel_pids_check() -> Check {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if v2.split_whitespace().any(|c| c == "pids")
        || std::path::Path::new("/sys/fs/cgroup/pids").exists()
    {
        Check::pass("kernel.pids_cgroup", "pids cgroup controller available")
    } else {
        Check::fail(
            "kernel.pids_cgroup",
            "no pids cgroup controller",
            "boot with the pids controller enabled",
        )
    }
}

/// The sbx host: the client and whether it is the simulator; the host settings (agent
/// forwarding, MCP servers) with login and daemon read from `sbx ls`; then a throwaway sandbox,
/// whose create runs the mount proof (user namespaces and `mount --bind` in the template).
async fn sbx_checks(checks: &mut Vec<Check>, global: &GlobalArgs) {
    let backend = match connect_sbx(global, &[]).await {
        Ok(backend) => backend,
        Err(e) => {
            let fix = if global.allow_simulator {
                "install sbx, or point --sbx-path at it"
            } else {
                "install sbx, or pass --allow-simulator to accept sbx-sim"
            };
            checks.push(Check::fail("sbx.client", e.to_string(), fix));
            return;
        }
    };
    checks.push(Check::pass(
        "sbx.client",
        format!(
            "{} (rung {})",
            backend.sbx_path().display(),
            backend.isolation()
        ),
    ));
    if let Err(e) = backend.check_host().await {
        let fix = match e.kind() {
            sandbox_core::ErrorKind::LoginRequired => "sbx login",
            sandbox_core::ErrorKind::DaemonFault => "sbx daemon restart",
            _ => "see the message",
        };
        checks.push(Check::fail("sbx.host", e.to_string(), fix));
        return;
    }
    checks.push(Check::pass(
        "sbx.host",
        "logged in, daemon answering, agent forwarding off, no MCP server",
    ));
    let key = generated_key();
    let ran = async {
        let spec = SandboxSpec::builder("doctor").build()?;
        let sandbox = backend.acquire(&key, &spec).await?;
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["true"])).timeout(Duration::from_secs(30)))
            .await?;
        Ok::<i32, SandboxError>(out.exit_code)
    }
    .await;
    let disposal = backend.dispose(&key, DisposeSelector::all()).await;
    checks.push(match (ran, disposal) {
        (Err(e), _) => Check::fail("sbx.sandbox", e.to_string(), "see the checks above"),
        (Ok(code), _) if code != 0 => Check::fail("sbx.sandbox", format!("`true` exited {code}"), ""),
        (Ok(_), Some(f)) => Check::fail(
            "sbx.sandbox",
            format!("disposal left something: {f}"),
            "sandboxctl --backend sbx purge",
        ),
        (Ok(_), None) => Check::pass(
            "sbx.sandbox",
            "created (mount proof passed: user namespaces and bind mounts work in the template), ran `true`, disposed",
        ),
    });
}

/// Acquire (with the egress preflight proving the sandbox reaches nothing), one exec, dispose.
async fn throwaway_sandbox(egress_probe: &[String]) -> Check {
    let mut config = DockerConfig::default();
    config.verify_egress = true;
    if let [first, rest @ ..] = egress_probe {
        let by_name = rest.first().unwrap_or(first);
        config.egress_probe = EgressProbe::new(first.clone(), by_name.clone(), None);
    }
    let backend = match DockerBackend::connect(config).await {
        Ok(b) => b,
        Err(e) => return Check::fail("docker.sandbox", e.to_string(), "see the checks above"),
    };
    let key = generated_key();
    let spec = match SandboxSpec::builder("doctor")
        .image(LocalImage::DEFAULT.tag())
        .build()
    {
        Ok(s) => s,
        Err(e) => return Check::fail("docker.sandbox", e.to_string(), ""),
    };
    let ran = async {
        let sandbox = backend.acquire(&key, &spec).await?;
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["true"])).timeout(Duration::from_secs(30)))
            .await?;
        Ok::<i32, SandboxError>(out.exit_code)
    }
    .await;
    let disposal = backend.dispose(&key, DisposeSelector::all()).await;
    match (ran, disposal) {
        (Err(e), _) => Check::fail("docker.sandbox", e.to_string(), "see the checks above"),
        (Ok(code), _) if code != 0 => {
            Check::fail("docker.sandbox", format!("`true` exited {code}"), "")
        }
        (Ok(_), Some(f)) => Check::fail(
            "docker.sandbox",
            format!("disposal left something: {f}"),
            "sandboxctl purge",
        ),
        (Ok(_), None) => Check::pass(
            "docker.sandbox",
            "acquire (egress proven closed), exec and dispose of a throwaway sandbox",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_values_stay_out_of_the_client_environment() {
        let own = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
            ("PROBE_VALUE", "guest only"),
            ("OTHER", "kept"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let guest = ["PROBE_VALUE", "PATH", "HOME"].map(String::from);
        let names: Vec<String> = management_env(own, &guest)
            .into_iter()
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["PATH", "HOME", "DOCKER_HOST", "OTHER"]);
    }
}
