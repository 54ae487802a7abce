//! The proxy image on a real engine (feature `live`; needs `sandbox-egress-proxy:local` and
//! `sandbox-base:local`, built by `cargo xtask images`).
//!
//! An internal network of the test's own (`docker network create --internal`: nothing on it
//! routes anywhere but to its members), two `serve` containers under the aliases
//! `allowed.test` and `denied.test`, the proxy on that network with the socket in a fresh named
//! volume, and a `--network none` workload that runs the forwarder from the read-only volume
//! and curls through it. Every engine object has a random suffix and is removed on every exit.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

const PROXY_IMAGE: &str = "sandbox-egress-proxy:local";
const WORKLOAD_IMAGE: &str = "sandbox-base:local";
const OUTPUT_CAP: u64 = 1 << 20;

/// Runs `docker ARGS` under a deadline with capped output; (exit code, stdout, stderr).
async fn docker(args: &[&str], deadline: Duration) -> (i32, String, String) {
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

async fn docker_ok(args: &[&str]) -> String {
    let (code, out, err) = docker(args, Duration::from_secs(120)).await;
    assert_eq!(code, 0, "docker {args:?}: {err}");
    out
}

/// Removes the test's engine objects when dropped, however the test ends.
struct Cleanup {
    containers: Vec<String>,
    volumes: Vec<String>,
    network: Option<String>,
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

fn random_suffix() -> String {
    let mut bytes = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts a proxy on `network` with its socket in a fresh volume; returns the volume.
async fn start_proxy(
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

/// Runs `script` in a `--network none` workload with the volume mounted read-only and the
/// forwarder listening on 127.0.0.1:3128.
async fn in_workload(cleanup: &mut Cleanup, suffix: &str, volume: &str, script: &str) -> String {
    let name = format!(
        "maf-egress-test-{suffix}-workload-{}",
        cleanup.containers.len()
    );
    cleanup.containers.push(name.clone());
    let mount = format!("{volume}:/run/maf-egress:ro");
    let full = format!(
        "/run/maf-egress/egress-forward forward --listen 127.0.0.1:3128 \
         --socket /run/maf-egress/proxy.sock & sleep 0.5; {script}"
    );
    docker_ok(&[
        "run",
        "--pull=never",
        "--name",
        &name,
        "--network",
        "none",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &mount,
        WORKLOAD_IMAGE,
        "sh",
        "-c",
        &full,
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_filters_egress_from_a_closed_workload() {
    let suffix = random_suffix();
    let mut cleanup = Cleanup {
        containers: Vec::new(),
        volumes: Vec::new(),
        network: None,
    };
    let network = format!("maf-egress-test-{suffix}");
    docker_ok(&["network", "create", "--internal", &network]).await;
    cleanup.network = Some(network.clone());
    for host in ["allowed.test", "denied.test"] {
        let name = format!("maf-egress-test-{suffix}-{}", host.replace('.', "-"));
        cleanup.containers.push(name.clone());
        docker_ok(&[
            "run",
            "-d",
            "--pull=never",
            "--name",
            &name,
            "--network",
            &network,
            "--network-alias",
            host,
            "--read-only",
            "--cap-drop",
            "ALL",
            PROXY_IMAGE,
            "serve",
            "--listen",
            "0.0.0.0:80",
            "--body",
            host,
        ])
        .await;
    }
    let gateway = docker_ok(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
        &network,
    ])
    .await;
    let mut private = vec!["--allow-private"];
    for ip in gateway.split_whitespace() {
        private.extend(["--deny-address", ip]);
    }
    let volume = start_proxy(&mut cleanup, &suffix, "private", &network, &private).await;

    let out = in_workload(
        &mut cleanup,
        &suffix,
        &volume,
        "ls -ln /run/maf-egress; \
         for u in http://allowed.test/ http://denied.test/ http://ALLOWED.test/x http://allowed.test:8080/; do \
           curl -sS -m 10 -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' \"$u\"; done; \
         curl -sS -m 10 -p -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' http://allowed.test/; \
         curl -sS -m 10 --noproxy '*' http://allowed.test/ >/dev/null 2>&1; echo direct=$?",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("65532 65532")
            && l.ends_with("proxy.sock")
            && l.starts_with("srw-rw-rw-")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with("egress-forward")),
        "{out}"
    );
    let answers: Vec<&str> = lines.iter().copied().filter(|l| l.ends_with(']')).collect();
    assert_eq!(answers.len(), 5, "{out}");
    assert_eq!(answers[0], "allowed.test [200]", "{out}");
    assert!(
        answers[1].ends_with("[403]") && out.contains("host not on the allowlist"),
        "{out}"
    );
    assert_eq!(answers[2], "allowed.test [200]", "{out}");
    assert!(answers[3].ends_with("[403]"), "{out}");
    assert_eq!(
        answers[4], "allowed.test [200]",
        "a CONNECT tunnel carries it: {out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("direct=") && *l != "direct=0"),
        "{out}"
    );

    // The proxy logged one JSON decision per request.
    let proxy = format!("maf-egress-test-{suffix}-proxy-private");
    let (_, _, log) = docker(&["logs", &proxy], Duration::from_secs(30)).await;
    let decisions: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(decisions.len(), 5, "{log}");
    assert!(decisions
        .iter()
        .any(|d| d["decision"] == "deny" && d["host"] == "denied.test"));
    assert!(decisions
        .iter()
        .any(|d| d["decision"] == "allow" && d["method"] == "CONNECT"));

    // Without --allow-private the same allowed name resolves to a private address: refused.
    let closed = start_proxy(&mut cleanup, &suffix, "public", &network, &[]).await;
    let out = in_workload(
        &mut cleanup,
        &suffix,
        &closed,
        "curl -sS -m 10 -x http://127.0.0.1:3128 -w ' [%{http_code}]\\n' http://allowed.test/",
    )
    .await;
    assert!(
        out.contains("forbidden address (private") && out.trim_end().ends_with("[403]"),
        "{out}"
    );
    drop(cleanup);
}
