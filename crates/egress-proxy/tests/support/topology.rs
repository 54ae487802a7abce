//! The engine side of the proxy's live test and benchmark: bounded `docker` CLI calls, a guard
//! that removes every object on every exit, and the topology of docs/egress-proxy.md built from
//! the images `cargo xtask images` makes (`sandbox-egress-proxy:local`, `sandbox-base:local`).
//!
//! The topology: an internal network of the caller's own (`docker network create --internal`:
//! nothing on it routes anywhere but to its members), `serve` containers under aliases, the proxy
//! on that network with its socket in a fresh named volume, and `--network none` workloads that
//! run the forwarder from the read-only volume. Every name starts with `maf-egress-test-` and a
//! random suffix (xtask's leftover check looks for that prefix).
//!
//! Included with `#[path]` by `tests/live_image.rs` and `benches/proxy.rs`; each uses part of it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

/// The image holding the proxy, the forwarder and `serve`.
pub const PROXY_IMAGE: &str = "sandbox-egress-proxy:local";
/// The workload image (has `sh` and `curl`).
pub const WORKLOAD_IMAGE: &str = "sandbox-base:local";
/// The cap on each of a `docker` call's stdout and stderr.
const OUTPUT_CAP: u64 = 1 << 20;
/// The deadline of every call made through [`docker_ok`].
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `docker ARGS` under a deadline with capped output; (exit code, stdout, stderr).
pub async fn docker(args: &[&str], deadline: Duration) -> (i32, String, String) {
    let mut child = tokio::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("docker runs");
    let mut stdout = child.stdout.take().unwrap().take(OUTPUT_CAP);
    let mut stderr = child.stderr.take().unwrap().take(OUTPUT_CAP);
    let run = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        let status = child.wait().await.expect("docker is waited for");
        (status.code().unwrap_or(-1), out, err)
    };
    let (code, out, err) = tokio::time::timeout(deadline, run)
        .await
        .unwrap_or_else(|_| panic!("docker {args:?} did not finish within {deadline:?}"));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// Runs `docker ARGS` (120 s deadline) and returns its stdout; panics unless it exits 0.
pub async fn docker_ok(args: &[&str]) -> String {
    let (code, out, err) = docker(args, DEADLINE).await;
    assert_eq!(code, 0, "docker {args:?}: {err}");
    out
}

/// Removes the caller's engine objects when dropped, however the caller ends.
#[derive(Default)]
pub struct Cleanup {
    /// Containers, removed first (`docker rm -f`).
    pub containers: Vec<String>,
    /// Volumes, removed once the containers are gone.
    pub volumes: Vec<String>,
    /// The network, removed last.
    pub network: Option<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let run = |args: Vec<String>| {
            let _ = std::process::Command::new("timeout")
                .arg("60")
                .arg("docker")
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        if !self.containers.is_empty() {
            run(["rm", "-f"]
                .iter()
                .map(|s| s.to_string())
                .chain(self.containers.iter().cloned())
                .collect());
        }
        for volume in &self.volumes {
            run(vec![
                "volume".into(),
                "rm".into(),
                "-f".into(),
                volume.clone(),
            ]);
        }
        if let Some(network) = &self.network {
            run(vec!["network".into(), "rm".into(), network.clone()]);
        }
    }
}

/// Eight hex digits from `/dev/urandom`.
pub fn random_suffix() -> String {
    let mut bytes = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates the internal network `maf-egress-test-SUFFIX`; returns its name.
pub async fn internal_network(cleanup: &mut Cleanup, suffix: &str) -> String {
    let network = format!("maf-egress-test-{suffix}");
    docker_ok(&["network", "create", "--internal", &network]).await;
    cleanup.network = Some(network.clone());
    network
}

/// Starts a `serve` container on `network` under the alias `host`, answering with `reply`
/// (`["--body", TEXT]` or `["--size", BYTES]`); returns its name.
pub async fn serve(
    cleanup: &mut Cleanup,
    suffix: &str,
    network: &str,
    host: &str,
    reply: &[&str],
) -> String {
    let name = format!("maf-egress-test-{suffix}-{}", host.replace('.', "-"));
    cleanup.containers.push(name.clone());
    let mut args = vec![
        "run",
        "-d",
        "--pull=never",
        "--name",
        &name,
        "--network",
        network,
        "--network-alias",
        host,
        "--read-only",
        "--cap-drop",
        "ALL",
        PROXY_IMAGE,
        "serve",
        "--listen",
        "0.0.0.0:80",
    ];
    args.extend_from_slice(reply);
    docker_ok(&args).await;
    name
}

/// The proxy arguments that let it reach the servers on `network` (private addresses) but not
/// the network's gateway, the host: `--allow-private --deny-address GATEWAY…`.
pub async fn private_but_not_gateway(network: &str) -> Vec<String> {
    let gateway = docker_ok(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
        network,
    ])
    .await;
    let mut args = vec!["--allow-private".to_owned()];
    for ip in gateway.split_whitespace() {
        args.extend(["--deny-address".to_owned(), ip.to_owned()]);
    }
    args
}

/// Starts a proxy `maf-egress-test-SUFFIX-proxy-TAG` on `network` allowing `allowed.test`, with
/// its socket in a fresh volume, and waits for its ready line; returns the volume.
pub async fn start_proxy(
    cleanup: &mut Cleanup,
    suffix: &str,
    tag: &str,
    network: &str,
    extra: &[&str],
) -> String {
    let volume = format!("maf-egress-test-{suffix}-{tag}");
    let name = format!("maf-egress-test-{suffix}-proxy-{tag}");
    cleanup.volumes.push(volume.clone());
    cleanup.containers.push(name.clone());
    docker_ok(&["volume", "create", &volume]).await;
    let mount = format!("{volume}:/run/maf-egress");
    let mut args = vec![
        "run",
        "-d",
        "--pull=never",
        "--name",
        &name,
        "--network",
        network,
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "64",
        "-v",
        &mount,
        PROXY_IMAGE,
        "proxy",
        "--socket",
        "/run/maf-egress/proxy.sock",
        "--handoff-socket",
        "/run/maf-egress/handoff.sock",
        "--install-forwarder",
        "/run/maf-egress/egress-forward",
        "--allow",
        "allowed.test",
    ];
    args.extend_from_slice(extra);
    docker_ok(&args).await;
    for _ in 0..60 {
        let (_, out, _) = docker(&["logs", &name], Duration::from_secs(30)).await;
        if out.lines().any(|line| line == "maf-egress-proxy ready v1") {
            return volume;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, out, err) = docker(&["logs", &name], Duration::from_secs(30)).await;
    panic!("the proxy never said ready: {out} {err}");
}

/// The shell prefix that starts the forwarder on 127.0.0.1:3128 from the mounted volume.
const FORWARDER: &str = "/run/maf-egress/egress-forward forward --listen 127.0.0.1:3128 \
                         --socket /run/maf-egress/proxy.sock \
                         --handoff-socket /run/maf-egress/handoff.sock &";

/// The `docker run` arguments of a `--network none` workload named `name` with `volume` mounted
/// read-only, up to (not including) the image.
fn workload_args<'a>(name: &'a str, mount: &'a str) -> Vec<&'a str> {
    vec![
        "--pull=never",
        "--name",
        name,
        "--network",
        "none",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        mount,
        WORKLOAD_IMAGE,
    ]
}

/// Runs `script` in a `--network none` workload with the volume mounted read-only and the
/// forwarder listening on 127.0.0.1:3128; returns its stdout.
pub async fn in_workload(
    cleanup: &mut Cleanup,
    suffix: &str,
    volume: &str,
    script: &str,
) -> String {
    let name = format!(
        "maf-egress-test-{suffix}-workload-{}",
        cleanup.containers.len()
    );
    cleanup.containers.push(name.clone());
    let mount = format!("{volume}:/run/maf-egress:ro");
    let full = format!("{FORWARDER} sleep 0.5; {script}");
    let mut args = vec!["run"];
    args.extend(workload_args(&name, &mount));
    args.extend(["sh", "-c", &full]);
    docker_ok(&args).await
}

/// Starts a long-lived `--network none` workload (as [`in_workload`], the forwarder on
/// 127.0.0.1:3128) for `docker exec`; returns its name.
pub async fn start_workload(cleanup: &mut Cleanup, suffix: &str, volume: &str) -> String {
    let name = format!(
        "maf-egress-test-{suffix}-workload-{}",
        cleanup.containers.len()
    );
    cleanup.containers.push(name.clone());
    let mount = format!("{volume}:/run/maf-egress:ro");
    let full = format!("{FORWARDER} exec sleep infinity");
    let mut args = vec!["run", "-d"];
    args.extend(workload_args(&name, &mount));
    args.extend(["sh", "-c", &full]);
    docker_ok(&args).await;
    name
}

/// Starts a long-lived container of the workload image directly on `network` (no proxy) for
/// `docker exec`; returns its name.
pub async fn start_direct(cleanup: &mut Cleanup, suffix: &str, network: &str) -> String {
    let name = format!("maf-egress-test-{suffix}-direct");
    cleanup.containers.push(name.clone());
    docker_ok(&[
        "run",
        "-d",
        "--pull=never",
        "--name",
        &name,
        "--network",
        network,
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        WORKLOAD_IMAGE,
        "sleep",
        "infinity",
    ])
    .await;
    name
}
