//! The egress proxy never reaches the engine host's own addresses (docs/egress-proxy.md), against
//! the real engine: a server of the test's own on this host bound to `0.0.0.0:80` (so it answers
//! on every address of the host), an allowlist sandbox whose proxy sits on a network the test
//! made, and allowed names that the proxy resolves (through its container's hosts file, which
//! the test writes) to each address of the host's interfaces. Every such request is refused
//! with the deny-list reason, and the server sees no connection. Traffic goes only to this
//! host's own addresses. It needs what the live suite runs with: root beside a local engine
//! (port 80, and the proxy container's hosts file under the engine's data root).

mod support;

use std::collections::HashMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend_docker::defaults::DEFAULT_EGRESS_PROXY_IMAGE;
use backend_docker::{DockerBackend, DockerConfig};
use bollard::models::NetworkCreateRequest;
use bollard::Docker;
use sandbox_core::{
    Command, Egress, ExecRequest, Sandbox, SandboxBackend, SandboxKey, SandboxSpec,
};
use support::{unique_scope, BASE};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Every engine call of the test's own is bounded by this.
const BOUND: Duration = Duration::from_secs(60);

async fn bounded<T, E: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> T {
    tokio::time::timeout(BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {BOUND:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// Removes the scope's containers and volumes, then the test network, however the test ends.
struct Cleanup {
    network: String,
    scope: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let script = r#"docker ps -aq --filter "label=maf-sandbox.scope=$1" | xargs -r docker rm -f
docker volume ls -q --filter "label=maf-sandbox.scope=$1" | xargs -r docker volume rm
docker network rm "$2""#;
        if let Ok(mut child) = std::process::Command::new("sh")
            .args(["-c", script, "cleanup", &self.scope, &self.network])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            let until = std::time::Instant::now() + BOUND;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The addresses of this host's interfaces a guest could aim at: not loopback, not link-local.
fn host_addresses() -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = host_interfaces().into_iter().map(|(_, ip)| ip).collect();
    found.sort();
    found.dedup();
    found
}

/// Every (interface, address) pair [`host_addresses`] keeps.
fn host_interfaces() -> Vec<(String, IpAddr)> {
    if_addrs::get_if_addrs()
        .expect("the host's interfaces")
        .into_iter()
        .map(|interface| (interface.name.clone(), interface.ip()))
        .filter(|(_, ip)| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect()
}

/// The addresses of interfaces no test makes or removes: the host's own and the default
/// bridge's. The bridges of user networks (`br-…`) come and go with the tests beside this one.
fn lasting_host_addresses() -> Vec<IpAddr> {
    host_interfaces()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("br-") && !name.starts_with("veth"))
        .map(|(_, ip)| ip)
        .collect()
}

/// A server on `0.0.0.0:80` answering `host-reached` to every connection, counting them.
async fn host_server() -> Arc<AtomicUsize> {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:80")
        .await
        .expect("the test binds 0.0.0.0:80 on this host (root, port free)");
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut head)).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhost-reached",
                    )
                    .await;
            });
        }
    });
    hits
}

async fn run(sandbox: &dyn Sandbox, line: &str) -> sandbox_core::ExecOutput {
    sandbox
        .exec(ExecRequest::new(Command::argv(["sh", "-c", line])).timeout(Duration::from_secs(60)))
        .await
        .expect("exec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allowed_name_resolving_to_an_engine_host_address_is_refused() {
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let targets = host_addresses();
    assert!(
        targets.iter().any(IpAddr::is_ipv4),
        "this host has no IPv4 address but loopback: {targets:?}"
    );
    let hits = host_server().await;
    let scope = unique_scope("egress-host");
    // A network of the test's own, not internal (so the proxy has a route to the host's
    // addresses): its gateway is denied as a gateway, every other host address must be denied
    // as the host's.
    let network = format!("maf-egress-host-{}", std::process::id());
    let _cleanup = Cleanup {
        network: network.clone(),
        scope: scope.clone(),
    };
    bounded(
        "network create",
        docker.create_network(NetworkCreateRequest {
            name: network.clone(),
            driver: Some("bridge".into()),
            ..Default::default()
        }),
    )
    .await;
    let mut config = DockerConfig::default();
    config.egress_proxy_image = Some(DEFAULT_EGRESS_PROXY_IMAGE.into());
    config.outbound_network = network.clone();
    // A LAN address is private: the hole is there even when private destinations are allowed.
    config.allow_private_destinations = true;
    let backend = DockerBackend::connect(config).await.expect("connect");
    let names: Vec<String> = (0..targets.len()).map(|i| format!("h{i}.test")).collect();
    let mut spec = SandboxSpec::builder("egress-host")
        .image(BASE)
        .egress(Egress::Allowlist);
    for name in &names {
        spec = spec.allow(name.as_str());
    }
    let spec = spec.build().unwrap();
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");

    // The proxy resolves through its container's hosts file (static C library: `files` first).
    let workload = bounded(
        "workload inspect",
        docker.inspect_container(sandbox.instance_id(), None),
    )
    .await;
    let proxy = format!("{}-proxy", workload.name.unwrap().trim_start_matches('/'));
    let record = bounded("proxy inspect", docker.inspect_container(&proxy, None)).await;
    // The deny list the proxy was started with: every address the host had when the backend
    // looked, which must hold every lasting one; a bridge another test made or removed since
    // this test listed the host may be on either side of that look.
    let args = record
        .config
        .and_then(|config| config.cmd)
        .expect("the proxy has arguments");
    let denied: Vec<IpAddr> = args
        .windows(2)
        .filter(|pair| pair[0] == "--deny-address")
        .map(|pair| pair[1].parse().expect("a deny address"))
        .collect();
    for address in lasting_host_addresses() {
        assert!(
            denied.contains(&address),
            "{address} is not on the proxy's deny list {denied:?}"
        );
    }
    let hosts_path = record.hosts_path.expect("the proxy has a hosts file");
    let mut hosts = std::fs::OpenOptions::new()
        .append(true)
        .open(&hosts_path)
        .unwrap_or_else(|e| panic!("the test appends to {hosts_path}: {e}"));
    let mut mapping = HashMap::new();
    for (name, address) in names
        .iter()
        .zip(&targets)
        .filter(|(_, address)| denied.contains(address))
    {
        writeln!(hosts, "{address} {name}").unwrap();
        mapping.insert(name.clone(), *address);
    }
    drop(hosts);
    assert!(!mapping.is_empty(), "no listed address is on the deny list");

    for (name, address) in &mapping {
        let out = run(
            &*sandbox,
            &format!("curl -s -w ' [%{{http_code}}]' --max-time 20 http://{name}/"),
        )
        .await;
        let text = out.stdout_text();
        assert!(
            text.ends_with("[403]")
                && text.contains("denied")
                && text.contains(&address.to_string()),
            "{name} ({address}): {text} {}",
            out.stderr_text()
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the host's server was reached through the proxy"
    );
    // And the host's server does answer on those addresses: the refusal is the proxy's. Only on
    // those the host still has: other tests running beside this one remove networks of their
    // own, and an address of a bridge gone since the listing answers nobody (a CI run met one).
    let still_here = host_addresses();
    let answering: Vec<&IpAddr> = targets
        .iter()
        .filter(|ip| ip.is_ipv4() && still_here.contains(ip))
        .collect();
    assert!(
        !answering.is_empty(),
        "no listed address is left: {targets:?}"
    );
    for address in answering {
        let mut stream = tokio::net::TcpStream::connect((*address, 80))
            .await
            .unwrap_or_else(|e| panic!("{address}:80 from the host: {e}"));
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let reached = String::from_utf8_lossy(&answer).ends_with("host-reached");
        // An address that went away meanwhile says nothing either way.
        assert!(
            reached || !host_addresses().contains(address),
            "{address}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    let purge = backend.dispose_scope(&scope, "thread").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
}
