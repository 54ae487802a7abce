//! The backend's health report for an operator (`sandboxctl doctor`): every check runs through the
//! Engine API on the endpoint the backend would pin, never through the `docker` CLI.

use sandbox_core::HealthCheck;

use crate::config::DockerConfig;
use crate::connection::EngineConnection;
use crate::endpoint::Endpoint;
use crate::ownership_labels::user_is_root;

/// The checks [`DockerBackend::health_checks`](crate::DockerBackend::health_checks) reports.
pub(crate) async fn checks(config: &DockerConfig) -> Vec<HealthCheck> {
    let mut checks = Vec::new();
    let env = config
        .management_env
        .clone()
        .unwrap_or_else(|| std::env::vars_os().collect());
    let endpoint = match Endpoint::resolve(&env, config.context.as_deref()) {
        Ok(endpoint) => endpoint,
        Err(e) => {
            checks.push(HealthCheck::fail(
                "docker.context",
                e.to_string(),
                "fix DOCKER_HOST / DOCKER_CONTEXT, or docker context use default",
            ));
            return checks;
        }
    };
    checks.push(HealthCheck::pass(
        "docker.context",
        format!("the backend pins the engine at {endpoint}"),
    ));
    let deadline = config.command_timeout;
    let engine = match EngineConnection::open(endpoint, deadline).await {
        Ok((engine, _os)) => engine,
        Err(e) => {
            checks.push(HealthCheck::fail(
                "docker.engine",
                e.to_string(),
                "start the engine (dockerd) or fix DOCKER_HOST",
            ));
            return checks;
        }
    };
    checks.push(HealthCheck::pass(
        "docker.engine",
        format!("engine reachable (API {})", engine.api_version()),
    ));
    match engine.call(deadline, engine.api().info()).await {
        Ok(info) => {
            let os = info.os_type.unwrap_or_default();
            checks.push(if os == "linux" {
                HealthCheck::pass("docker.engine_os", "engine OS linux")
            } else {
                HealthCheck::fail(
                    "docker.engine_os",
                    format!("engine OS {os:?}"),
                    "use a Linux engine",
                )
            });
            checks.push(match info.init_binary.filter(|i| !i.is_empty()) {
                Some(init) => HealthCheck::pass(
                    "kernel.init",
                    format!("engine init binary {init} (for --init)"),
                ),
                None => HealthCheck::fail(
                    "kernel.init",
                    "the engine names no init binary",
                    "install docker-init (Debian: tini)",
                ),
            });
        }
        Err(failure) => {
            let why = engine.failure("engine info", failure).to_string();
            checks.push(HealthCheck::fail(
                "docker.engine_os",
                why.clone(),
                "see docker.engine",
            ));
            checks.push(HealthCheck::fail("kernel.init", why, "see docker.engine"));
        }
    }
    checks.push(pids_cgroup_check());
    let image = config.default_image.as_str();
    checks.push(match engine.image_id(deadline, image).await {
        Ok(Some(_)) => HealthCheck::pass("docker.image", format!("{image} present")),
        Ok(None) => HealthCheck::fail(
            "docker.image",
            format!("{image} missing"),
            "sandboxctl images build",
        ),
        Err(failure) => HealthCheck::fail(
            "docker.image",
            engine.failure("image inspect", failure).to_string(),
            "sandboxctl images build",
        ),
    });
    checks.extend(egress_checks(&engine, config).await);
    checks.push(runtime_check(&engine, config).await);
    checks
}

/// `docker.runtime`: the configured OCI runtime as connect verifies it (listed by the engine, one
/// probe container under it), with its platform and the rung it gives; not applicable without
/// one. A runtime that runs but is not gVisor passes, naming rung `container`.
async fn runtime_check(engine: &EngineConnection, config: &DockerConfig) -> HealthCheck {
    let Some(runtime) = config.runtime.as_deref() else {
        return HealthCheck::not_applicable(
            "docker.runtime",
            "no runtime configured: the engine's default (runc), rung container",
        );
    };
    let config = std::sync::Arc::new(config.clone());
    match crate::runtime_probe::verify(engine, &config, runtime).await {
        Ok(found) => HealthCheck::pass("docker.runtime", runtime_summary(&found)),
        Err(error) => HealthCheck::fail(
            "docker.runtime",
            error.to_string(),
            "install gVisor (Debian: apt-get install runsc), register it in /etc/docker/daemon.json \
             (\"runtimes\": {\"runsc\": {\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": \
             [\"--platform=ptrace\", \"--network=none\", \"--file-access=shared\", \
             \"--overlay2=none\"]}}) and send dockerd SIGHUP",
        ),
    }
}

/// One line on a verified runtime: name, program, platform, the kernel its probe saw, the rung.
pub(crate) fn runtime_summary(found: &crate::RuntimeVerification) -> String {
    format!(
        "runtime {} ({}), platform {}, probe kernel {}, {}: {}",
        found.runtime,
        if found.path.is_empty() {
            "no path listed"
        } else {
            &found.path
        },
        found.platform.as_deref().unwrap_or("the runtime's default"),
        found.kernel_release.as_deref().unwrap_or("unknown"),
        if found.subreaper {
            "exact kills"
        } else {
            "no subreaper (a timeout kills the command's process group only)"
        },
        if found.gvisor {
            "gVisor verified, rung hardened_container"
        } else {
            "not gVisor (its kernel log does not start with gVisor's banner), rung container"
        }
    )
}

/// The `allowlist` egress mode's two needs, when it is configured (`config.egress_proxy_image`):
/// `docker.egress_proxy_image` (present, and naming a non-root user, as acquire requires) and
/// `docker.outbound_network` (it exists and is not `none` or `host`, so the proxy has a leg out
/// and a gateway to refuse). Without an image, one `docker.egress_proxy` not-applicable line.
async fn egress_checks(engine: &EngineConnection, config: &DockerConfig) -> Vec<HealthCheck> {
    let Some(image) = config.egress_proxy_image.as_deref() else {
        return vec![HealthCheck::not_applicable(
            "docker.egress_proxy",
            "allowlist egress is off: no egress proxy image is configured",
        )];
    };
    let deadline = config.command_timeout;
    let build = format!("sandboxctl images build {image}");
    let image_check = match engine
        .call(deadline, engine.api().inspect_image(image))
        .await
    {
        Ok(answer) => {
            let user = answer.config.and_then(|c| c.user).unwrap_or_default();
            if user_is_root(&user) {
                HealthCheck::fail(
                    "docker.egress_proxy_image",
                    format!("{image} runs as root (user {user:?}); acquire refuses such a proxy"),
                    "build the proxy image with a non-root USER",
                )
            } else {
                HealthCheck::pass(
                    "docker.egress_proxy_image",
                    format!("{image} present, runs as user {user}"),
                )
            }
        }
        Err(failure) if failure.is_not_found() => HealthCheck::fail(
            "docker.egress_proxy_image",
            format!("{image} missing: allowlist egress (`run --allow`) cannot start"),
            build,
        ),
        Err(failure) => HealthCheck::fail(
            "docker.egress_proxy_image",
            engine.failure("image inspect", failure).to_string(),
            build,
        ),
    };
    let network = config.outbound_network.as_str();
    let create =
        format!("docker network create {network}, or name another with --outbound-network");
    let network_check = match engine
        .call(
            deadline,
            engine.api().inspect_network(
                network,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            ),
        )
        .await
    {
        Ok(answer) => {
            let driver = answer.driver.unwrap_or_default();
            if matches!(driver.as_str(), "null" | "host") {
                HealthCheck::fail(
                    "docker.outbound_network",
                    format!("{network} has driver {driver}: the proxy needs a routed network"),
                    create,
                )
            } else {
                HealthCheck::pass(
                    "docker.outbound_network",
                    format!("{network} present (driver {driver})"),
                )
            }
        }
        Err(failure) if failure.is_not_found() => HealthCheck::fail(
            "docker.outbound_network",
            format!("{network} does not exist on the engine"),
            create,
        ),
        Err(failure) => HealthCheck::fail(
            "docker.outbound_network",
            engine.failure("network inspect", failure).to_string(),
            create,
        ),
    };
    vec![image_check, network_check]
}

/// `--pids-limit` needs the pids cgroup controller (v2: listed in `cgroup.controllers`; v1: its
/// own hierarchy).
fn pids_cgroup_check() -> HealthCheck {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if v2.split_whitespace().any(|c| c == "pids")
        || std::path::Path::new("/sys/fs/cgroup/pids").exists()
    {
        HealthCheck::pass("kernel.pids_cgroup", "pids cgroup controller available")
    } else {
        HealthCheck::fail(
            "kernel.pids_cgroup",
            "no pids cgroup controller",
            "boot with the pids controller enabled",
        )
    }
}
