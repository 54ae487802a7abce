//! What the live tests share: a backend on the real engine, unique scopes, the HARDENING hooks,
//! and the leftover check. Every docker call here goes through the bounded runner too.
#![allow(dead_code)]

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use backend_docker::{DockerBackend, DockerConfig, EgressProbe};
use bounded_process::{BoundedCommand, ExitKind, RunOutput};
use conformance::isolation::{AcquireOutcome, DockerAnswer, Fingerprint, HardeningHooks};
use conformance::ConformanceError;
use sandbox_core::{ErrorKind, Sandbox, SandboxBackend, SandboxKey, SandboxSpec};

/// The local images (docs/docker-backend.md#local-images).
pub const BASE: &str = "sandbox-base:local";
pub const BASE_ROOT: &str = "sandbox-base-root:local";
pub const BUSYBOX: &str = "sandbox-busybox:local";
pub const NOTOOLS: &str = "sandbox-notools:local";
/// The base image plus CPython: the program channel's image.
pub const PYTHON: &str = "sandbox-python:local";

/// A scope no other run shares, so every test disposes exactly what it made.
pub fn unique_scope(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("bd-live-{tag}-{}-{nanos:08x}", std::process::id())
}

/// A docker call from the test itself (engine-side checks), bounded like every other.
pub async fn docker<I, A>(args: I) -> RunOutput
where
    I: IntoIterator<Item = A>,
    A: Into<std::ffi::OsString>,
{
    BoundedCommand::new("docker", Duration::from_secs(60))
        .args(args)
        .envs(std::env::vars_os())
        .run()
        .await
        .expect("the docker CLI runs")
}

/// The default bridge's gateway: a local address the engine routes to.
pub async fn bridge_gateway() -> IpAddr {
    let output = docker([
        "network",
        "inspect",
        "bridge",
        "--format",
        "{{range .IPAM.Config}}{{.Gateway}} {{.Subnet}} {{end}}",
    ])
    .await;
    let answer = String::from_utf8_lossy(&output.stdout);
    let words: Vec<&str> = answer.split_whitespace().collect();
    // An engine that leaves the gateway implicit puts it on the subnet's first host address.
    words
        .iter()
        .find_map(|w| w.parse::<IpAddr>().ok())
        .or_else(|| {
            words.iter().find_map(|w| {
                let (network, _) = w.split_once('/')?;
                let network: std::net::Ipv4Addr = network.parse().ok()?;
                Some(IpAddr::V4((u32::from(network) + 1).into()))
            })
        })
        .expect("the default bridge has a gateway")
}

/// The variable naming the OCI runtime the live suites run every sandbox under (`cargo xtask e2e
/// gvisor` sets `runsc`); unset, the engine's default.
pub const RUNTIME_VARIABLE: &str = "SANDBOX_E2E_DOCKER_RUNTIME";

/// The runtime the live suites run under, from [`RUNTIME_VARIABLE`].
pub fn runtime_under_test() -> Option<String> {
    std::env::var(RUNTIME_VARIABLE)
        .ok()
        .filter(|runtime| !runtime.is_empty())
}

/// The live configuration: defaults, plus the egress preflight with local targets only, under
/// the runtime of [`RUNTIME_VARIABLE`].
pub async fn config(verify_egress: bool) -> DockerConfig {
    let mut config = DockerConfig::default();
    config.runtime = runtime_under_test();
    if verify_egress {
        let gateway = bridge_gateway().await;
        config.verify_egress = true;
        // Local targets only: the bridge gateway by address (nothing listens on the discard port)
        // and a name nothing resolves; the token server binds the gateway.
        config.egress_probe = EgressProbe::new(
            format!("http://{gateway}:9/"),
            "http://maf-egress-probe.invalid/",
            Some(gateway),
        );
    }
    config
}

pub async fn backend(verify_egress: bool) -> DockerBackend {
    DockerBackend::connect(config(verify_egress).await)
        .await
        .expect("the docker backend connects to the local engine")
}

/// Disposes of the scope's conversations and asserts the engine lists nothing left for it.
pub async fn assert_nothing_left(backend: &DockerBackend, scope: &str, threads: &[String]) {
    for thread in threads {
        let purge = backend.dispose_scope(scope, thread).await;
        assert!(
            purge.undisposed.is_none(),
            "disposal of {scope}/{thread}: {purge:?}"
        );
    }
    let left = backend.list(scope, None).await.expect("listing the scope");
    assert!(left.is_empty(), "left behind in {scope}: {left:?}");
    let by_label = docker([
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!("label=maf-sandbox.scope={scope}"),
    ])
    .await;
    assert!(
        String::from_utf8_lossy(&by_label.stdout).trim().is_empty(),
        "containers left behind for {scope}"
    );
}

/// Every thread a scope's listing names, for the final sweep.
pub async fn threads_of(backend: &DockerBackend, scope: &str) -> Vec<String> {
    let mut threads: Vec<String> = backend
        .list(scope, None)
        .await
        .expect("listing the scope")
        .into_iter()
        .filter_map(|s| s.key.map(|k| k.thread_id))
        .collect();
    threads.sort();
    threads.dedup();
    threads
}

/// The engine-side hooks of the HARDENING probes.
pub struct DockerHooks {
    pub context: String,
}

#[async_trait]
impl HardeningHooks for DockerHooks {
    async fn remove_behind_the_handle(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<(), ConformanceError> {
        let output = docker(["rm", "-f", sandbox.instance_id()]).await;
        if output.status == ExitKind::Exited(0) {
            Ok(())
        } else {
            Err(ConformanceError::harness(
                "HARDENING",
                format!(
                    "docker rm -f failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
            ))
        }
    }

    async fn engine_instances_for(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<usize, ConformanceError> {
        let name = DockerBackend::container_name(key, spec.kind());
        let output = docker(["ps", "-a", "-q", "--filter", &format!("name=^/{name}$")]).await;
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count())
    }

    async fn acquire_in_child_process(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
        n: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        let image = spec.image_id().or(spec.image()).unwrap_or(BASE);
        let output = BoundedCommand::new(
            env!("CARGO_BIN_EXE_docker-acquire-child"),
            Duration::from_secs(300),
        )
        .args([
            self.context.as_str(),
            &key.scope,
            &key.thread_id,
            &key.agent_id,
            &key.call_id,
            spec.kind(),
            image,
            spec.work_dir().unwrap_or("-"),
            &n.to_string(),
        ])
        .envs(std::env::vars_os())
        .run()
        .await
        .map_err(|e| ConformanceError::harness("HARDENING", format!("the child process: {e}")))?;
        if output.status != ExitKind::Exited(0) {
            return Err(ConformanceError::harness(
                "HARDENING",
                format!(
                    "the child process failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                ),
            ));
        }
        conformance::child_process::parse_child_acquires(&output.stdout)
    }

    async fn routable_host_address(&self) -> Result<IpAddr, ConformanceError> {
        Ok(bridge_gateway().await)
    }

    async fn fingerprint(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<Option<Fingerprint>, ConformanceError> {
        container_fingerprint(sandbox.instance_id()).await.map(Some)
    }
}

/// The engine-side fingerprint of a container, observed from a container of its own image.
pub async fn container_fingerprint(container: &str) -> Result<Fingerprint, ConformanceError> {
    conformance::isolation::docker_container_fingerprint(container, |args| async move {
        let output = docker(args).await;
        Ok(DockerAnswer {
            succeeded: output.status == ExitKind::Exited(0),
            stdout: output.stdout,
            stderr: output.stderr,
        })
    })
    .await
}

/// A Unix-socket proxy to the default engine socket that holds back the engine's answer to every
/// request whose head contains `marker` for `delay`: an engine slower than the backend's deadline.
pub struct DelayingProxy {
    task: tokio::task::JoinHandle<()>,
}

impl DelayingProxy {
    pub fn start(socket: &std::path::Path, marker: &'static str, delay: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::UnixListener::bind(socket).expect("the proxy socket binds");
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(engine) = tokio::net::UnixStream::connect("/var/run/docker.sock").await
                    else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut engine_read, mut engine_write) = engine.into_split();
                    let hold = Arc::new(AtomicBool::new(false));
                    let hold_up = Arc::clone(&hold);
                    let upstream = async move {
                        let mut buffer = vec![0u8; 65536];
                        while let Ok(n) = client_read.read(&mut buffer).await {
                            if n == 0 {
                                break;
                            }
                            if buffer[..n]
                                .windows(marker.len())
                                .any(|w| w == marker.as_bytes())
                            {
                                hold_up.store(true, Ordering::SeqCst);
                            }
                            if engine_write.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = engine_write.shutdown().await;
                    };
                    let downstream = async move {
                        let mut buffer = vec![0u8; 65536];
                        while let Ok(n) = engine_read.read(&mut buffer).await {
                            if n == 0 {
                                break;
                            }
                            if hold.swap(false, Ordering::SeqCst) {
                                tokio::time::sleep(delay).await;
                            }
                            if client_write.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(upstream, downstream);
                });
            }
        });
        DelayingProxy { task }
    }
}

impl Drop for DelayingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `line` under `sh -c` in `sandbox` (within 30 s) and asserts that its standard output is
/// exactly `expected`, naming the line and its standard error when it is not.
pub async fn assert_stdout(sandbox: &dyn Sandbox, line: &str, expected: &str) {
    let out = sandbox
        .exec(
            sandbox_core::ExecRequest::new(sandbox_core::Command::argv(["sh", "-c", line]))
                .timeout(Duration::from_secs(30)),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout_text(), expected, "{line}: {}", out.stderr_text());
}

/// A curl command line printing only the HTTP status of `url` (`000` when there was none),
/// with `extra` flags.
pub fn curl_status(extra: &str, url: &str) -> String {
    format!("curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 {extra} '{url}'")
}
