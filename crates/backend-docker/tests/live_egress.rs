//! Offline allowlist egress (docs/docker-backend.md#allowlist-egress), against the real engine:
//! an internal network made for the test (nothing on it routes anywhere but to its members), two
//! servers on it answering their own name as `allowed.test` and `denied.test`, and a sandbox whose
//! proxy joins that network. The EGRESS suite, then the network-closed-by-content probe around the
//! proxy, the egress preflight (on: every created sandbox passes it), adoption and replacement of
//! the proxy, the refused allowlist change, and a purge that leaves no container, volume or network.
//! No traffic leaves the test's network.

mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use backend_docker::defaults::DEFAULT_EGRESS_PROXY_IMAGE;
use backend_docker::{DockerBackend, DockerConfig, EgressProbe};
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListVolumesOptionsBuilder};
use bollard::Docker;
use conformance::isolation::assert_network_closed_by_content;
use conformance::network::assert_egress;
use conformance::PosixGuestSubject;
use sandbox_core::{
    Command, DisposeSelector, Egress, ErrorKind, ExecRequest, Sandbox, SandboxBackend, SandboxKey,
    SandboxSpec,
};
use support::{assert_stdout, curl_status, unique_scope, BASE, PYTHON};

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

/// The test network, its servers and whatever the backend made in the test's scope; removed when
/// dropped, whatever happened (a finally): the scope's containers (workloads and proxies, which
/// hold the network and the volumes), its volumes, the servers, the network.
struct TestNetwork {
    name: String,
    scope: String,
    containers: Vec<String>,
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let label = format!("label=maf-sandbox.scope={}", self.scope);
        let script = r#"docker ps -aq --filter "$1" | xargs -r docker rm -f
docker volume ls -q --filter "$1" | xargs -r docker volume rm
shift; net=$1; shift
[ $# -gt 0 ] && docker rm -f "$@"
docker network rm "$net""#;
        let mut args = vec![
            "-c".to_owned(),
            script.to_owned(),
            "cleanup".to_owned(),
            label,
            self.name.clone(),
        ];
        args.extend(self.containers.iter().cloned());
        if let Ok(mut child) = std::process::Command::new("sh")
            .args(&args)
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

fn hex8() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{:08x}",
        (nanos as u32) ^ std::process::id().rotate_left(16)
    )
}

/// An internal network, two `serve` containers on it, their addresses, and the network's gateway.
async fn test_network(docker: &Docker, scope: &str) -> (TestNetwork, IpAddr, IpAddr, IpAddr) {
    let name = format!("maf-egress-test-{}", hex8());
    let mut network = TestNetwork {
        name: name.clone(),
        scope: scope.to_owned(),
        containers: Vec::new(),
    };
    bounded(
        "network create",
        docker.create_network(NetworkCreateRequest {
            name: name.clone(),
            internal: Some(true),
            driver: Some("bridge".into()),
            ..Default::default()
        }),
    )
    .await;
    let mut addresses = Vec::new();
    for alias in ["allowed.test", "denied.test"] {
        let container = format!("{name}-{}", alias.trim_end_matches(".test"));
        network.containers.push(container.clone());
        let body = ContainerCreateBody {
            image: Some(DEFAULT_EGRESS_PROXY_IMAGE.into()),
            cmd: Some(
                ["serve", "--listen", "0.0.0.0:80", "--body", alias]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            host_config: Some(HostConfig {
                network_mode: Some(name.clone()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    name.clone(),
                    EndpointSettings {
                        aliases: Some(vec![alias.to_owned()]),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new()
            .name(&container)
            .build();
        bounded(
            "server create",
            docker.create_container(Some(options), body),
        )
        .await;
        bounded("server start", docker.start_container(&container, None)).await;
        let inspect = bounded("server inspect", docker.inspect_container(&container, None)).await;
        let address = inspect
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|n| n.get(&name).cloned())
            .and_then(|e| e.ip_address)
            .expect("the server has an address on the test network");
        addresses.push(address.parse::<IpAddr>().expect("an IP address"));
    }
    let inspect = bounded(
        "network inspect",
        docker.inspect_network(
            &name,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        ),
    )
    .await;
    let config = inspect
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().next())
        .expect("the test network has an IPAM config");
    let gateway = match config.gateway.filter(|g| !g.is_empty()) {
        Some(gateway) => gateway.parse().expect("a gateway address"),
        None => {
            let subnet = config.subnet.expect("a subnet");
            let (base, _) = subnet.split_once('/').expect("a CIDR subnet");
            let base: std::net::Ipv4Addr = base.parse().unwrap();
            IpAddr::V4((u32::from(base) + 1).into())
        }
    };
    (network, addresses[0], addresses[1], gateway)
}

async fn run(sandbox: &dyn Sandbox, line: &str) -> sandbox_core::ExecOutput {
    run_within(sandbox, line, Duration::from_secs(30)).await
}

async fn run_within(
    sandbox: &dyn Sandbox,
    line: &str,
    bound: Duration,
) -> sandbox_core::ExecOutput {
    sandbox
        .exec(ExecRequest::new(Command::argv(["sh", "-c", line])).timeout(bound))
        .await
        .expect("exec")
}

fn allowlist(hosts: &[&str]) -> SandboxSpec {
    let mut builder = SandboxSpec::builder("egress")
        .image(BASE)
        .egress(Egress::Allowlist);
    for host in hosts {
        builder = builder.allow(*host);
    }
    builder.build().unwrap()
}

/// Names of the engine's containers and volumes carrying the scope's label.
async fn engine_leftovers(docker: &Docker, scope: &str) -> Vec<String> {
    let filter = HashMap::from([(
        "label".to_owned(),
        vec![format!("maf-sandbox.scope={scope}")],
    )]);
    let containers = bounded(
        "container list",
        docker.list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filter)
                .build(),
        )),
    )
    .await;
    let volumes = bounded(
        "volume list",
        docker.list_volumes(Some(
            ListVolumesOptionsBuilder::new().filters(&filter).build(),
        )),
    )
    .await;
    containers
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .chain(
            volumes
                .volumes
                .unwrap_or_default()
                .into_iter()
                .map(|v| v.name),
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_allowlist_sandbox_reaches_its_host_only_and_leaves_nothing_behind() {
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress");
    let (network, allowed, denied, gateway) = test_network(&docker, &scope).await;
    let mut config = DockerConfig::default();
    config.egress_proxy_image = Some(DEFAULT_EGRESS_PROXY_IMAGE.into());
    config.outbound_network = network.name.clone();
    config.allow_private_destinations = true;
    // The preflight, local targets only: the denied server by address, a name only the test
    // network resolves, and a token server on the test network's gateway.
    config.verify_egress = true;
    config.egress_probe = EgressProbe::new(
        format!("http://{denied}/"),
        "http://denied.test/",
        Some(gateway),
    );
    let backend = DockerBackend::connect(config)
        .await
        .expect("the backend connects");
    assert!(backend
        .declarations()
        .egress_modes
        .contains(&Egress::Allowlist));
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let spec = allowlist(&["allowed.test"]);

    let started = std::time::Instant::now();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    println!(
        "cold acquire with its proxy and the preflight: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(sandbox.freshly_created());
    let subject = PosixGuestSubject::in_storage_base(
        Arc::clone(&sandbox),
        backend.declarations().capabilities.clone(),
    )
    .expect("subject");

    // EGRESS: the allowed server answers through the proxy, the denied one never does.
    let report = assert_egress(
        &subject,
        "http://allowed.test/",
        "http://denied.test/",
        conformance::fixtures::EGRESS_EXEC_TIMEOUT,
    )
    .await
    .expect("the EGRESS suite runs");
    assert_eq!(report.skipped(), 0, "{report}");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!(report.passed(), 2, "{report}");
    assert_stdout(
        &*sandbox,
        "curl -s --max-time 10 http://allowed.test/",
        "allowed.test",
    )
    .await;

    // Around the proxy: a token server on the servers' network is never reached, with or
    // without --noproxy, and neither server answers a direct request by address.
    let closed = assert_network_closed_by_content(&subject, gateway)
        .await
        .expect("the probe runs");
    closed
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{closed}"));
    for address in [allowed, denied] {
        let direct = run(
            &*sandbox,
            &format!("curl -s --max-time 5 --noproxy '*' http://{address}/"),
        )
        .await;
        assert_ne!(direct.exit_code, 0, "{address} reached around the proxy");
        // By address through the proxy: an IP literal is on no allowlist.
        let proxied = run(
            &*sandbox,
            &format!("curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 http://{address}/"),
        )
        .await;
        assert!(
            !proxied.stdout_text().starts_with('2'),
            "{address} by address through the proxy: {}",
            proxied.stdout_text()
        );
    }

    // The engine's view: the workload has no network, the volume read-only, the proxy settings;
    // the proxy is hardened, not root, labelled, on the outbound network.
    let workload = bounded(
        "workload inspect",
        docker.inspect_container(sandbox.instance_id(), None),
    )
    .await;
    let workload_name = workload.name.clone().unwrap();
    let workload_name = workload_name.trim_start_matches('/');
    let host = workload.host_config.clone().unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    let mounts = workload.mounts.clone().unwrap_or_default();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].destination.as_deref(), Some("/run/maf-egress"));
    assert_eq!(mounts[0].rw, Some(false));
    assert_eq!(
        mounts[0].name.as_deref(),
        Some(format!("{workload_name}-egress").as_str())
    );
    let env = workload.config.clone().unwrap().env.unwrap_or_default();
    assert!(
        env.contains(&"HTTPS_PROXY=http://127.0.0.1:3128".to_owned()),
        "{env:?}"
    );
    assert!(
        env.contains(&"NO_PROXY=localhost,127.0.0.1".to_owned()),
        "{env:?}"
    );
    let proxy_record = bounded(
        "proxy inspect",
        docker.inspect_container(&format!("{workload_name}-proxy"), None),
    )
    .await;
    let proxy_host = proxy_record.host_config.clone().unwrap();
    assert_eq!(proxy_host.readonly_rootfs, Some(true));
    assert_eq!(proxy_host.cap_drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(proxy_host.pids_limit, Some(64));
    assert_eq!(
        proxy_host.security_opt,
        Some(vec!["no-new-privileges".to_owned()])
    );
    assert_eq!(
        proxy_host.network_mode.as_deref(),
        Some(network.name.as_str())
    );
    let proxy_config = proxy_record.config.clone().unwrap();
    let user = proxy_config.user.clone().unwrap_or_default();
    assert!(
        !matches!(user.split(':').next(), Some("" | "0" | "root")),
        "{user:?}"
    );
    let labels = proxy_config.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("maf-sandbox.role").map(String::as_str),
        Some("proxy")
    );
    assert_eq!(
        labels.get("maf-sandbox.egress.v1").map(String::len),
        Some(64)
    );
    assert_eq!(
        labels.get("maf-sandbox.scope").map(String::as_str),
        Some(scope.as_str())
    );
    // The guest cannot write the volume, so it cannot swap the socket or the forwarder.
    let write = run(&*sandbox, "echo x > /run/maf-egress/x").await;
    assert_ne!(write.exit_code, 0, "the guest wrote the egress volume");
    // No name resolves in the guest: the proxy resolves, the workload has no DNS.
    for name in ["allowed.test", "denied.test"] {
        // getent's 2 is "not found" (a missing getent would be 127, and prove nothing).
        let lookup = run(&*sandbox, &format!("getent hosts {name}")).await;
        assert_eq!(
            lookup.exit_code,
            2,
            "{name} resolved in the guest: {}",
            lookup.stdout_text()
        );
    }
    // The engine's gateway (the host's side of the network) is reached neither around the
    // proxy nor through it.
    let around = run(
        &*sandbox,
        &format!("curl -s --max-time 5 --noproxy '*' http://{gateway}/"),
    )
    .await;
    assert_ne!(around.exit_code, 0, "the gateway answered around the proxy");
    assert_stdout(
        &*sandbox,
        &curl_status("", &format!("http://{gateway}/")),
        "403",
    )
    .await;
    // A guest talking to the socket itself, without the forwarder, meets the same rules.
    let direct = |host: &str| {
        format!(
            "curl -s -w ' %{{http_code}}' --max-time 5 --unix-socket /run/maf-egress/proxy.sock \
             --request-target http://{host}/ http://{host}/"
        )
    };
    let allowed_direct = run(&*sandbox, &direct("allowed.test")).await;
    assert!(
        allowed_direct.stdout_text().ends_with("allowed.test 200"),
        "{} {}",
        allowed_direct.stdout_text(),
        allowed_direct.stderr_text()
    );
    let denied_direct = run(&*sandbox, &direct("denied.test")).await;
    assert!(
        denied_direct.stdout_text().ends_with(" 403"),
        "{} {}",
        denied_direct.stdout_text(),
        denied_direct.stderr_text()
    );

    // Warm: the same instance, its proxy kept, however much the proxy has logged since it said
    // it was ready (one line per request).
    // 210 curl processes: a loaded CI machine has taken more than 30 s over them.
    let requests = run_within(
        &*sandbox,
        "n=0; for i in $(seq 210); do curl -s -o /dev/null --max-time 5 http://denied.test/ && n=$((n+1)); done; echo $n",
        Duration::from_secs(180),
    )
    .await;
    assert_eq!(
        requests.stdout_text().trim(),
        "210",
        "{}",
        requests.stderr_text()
    );
    let started = std::time::Instant::now();
    let warm = backend.acquire(&key, &spec).await.expect("warm acquire");
    println!(
        "warm acquire (workload and proxy checked): {:.3} s",
        started.elapsed().as_secs_f64()
    );
    let proxy_after = bounded(
        "proxy inspect",
        docker.inspect_container(&format!("{workload_name}-proxy"), None),
    )
    .await;
    assert_eq!(
        proxy_after.id, proxy_record.id,
        "the ready proxy was replaced"
    );
    assert_eq!(warm.instance_id(), sandbox.instance_id());
    assert!(!warm.freshly_created());
    let found = backend
        .find(&key, "egress")
        .await
        .expect("find")
        .expect("found");
    assert_eq!(found.instance_id(), sandbox.instance_id());

    // A proxy removed behind the backend's back is replaced on the next acquire, and egress
    // works again through the same workload.
    let proxy = format!(
        "{}-proxy",
        bounded(
            "workload inspect",
            docker.inspect_container(sandbox.instance_id(), None)
        )
        .await
        .name
        .unwrap()
        .trim_start_matches('/')
    );
    let options = bollard::query_parameters::RemoveContainerOptionsBuilder::new()
        .force(true)
        .build();
    bounded(
        "proxy removal",
        docker.remove_container(&proxy, Some(options)),
    )
    .await;
    let lost = run(
        &*sandbox,
        "curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://allowed.test/",
    )
    .await;
    assert!(
        !lost.stdout_text().starts_with('2'),
        "reached with no proxy"
    );
    let Err(find_error) = backend.find(&key, "egress").await else {
        panic!("find served a sandbox whose proxy is gone");
    };
    assert!(find_error.to_string().contains("proxy"), "{find_error}");
    let again = backend.acquire(&key, &spec).await.expect("re-acquire");
    assert_eq!(again.instance_id(), sandbox.instance_id());
    assert_stdout(
        &*sandbox,
        "curl -s --max-time 10 http://allowed.test/",
        "allowed.test",
    )
    .await;

    // Another policy digest (here: another outbound network, which is not part of the name)
    // replaces the proxy of the same workload.
    let mut moved = DockerConfig::default();
    moved.egress_proxy_image = Some(DEFAULT_EGRESS_PROXY_IMAGE.into());
    moved.allow_private_destinations = true;
    let moved = DockerBackend::connect(moved).await.expect("connect");
    let same = moved.acquire(&key, &spec).await.expect("acquire on bridge");
    assert_eq!(same.instance_id(), sandbox.instance_id());
    let replaced = bounded(
        "proxy inspect",
        docker.inspect_container(&format!("{workload_name}-proxy"), None),
    )
    .await;
    assert_ne!(replaced.id, proxy_record.id);
    assert_eq!(
        replaced
            .host_config
            .clone()
            .and_then(|h| h.network_mode)
            .as_deref(),
        Some("bridge")
    );
    let digest = |record: &bollard::models::ContainerInspectResponse| {
        record
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get("maf-sandbox.egress.v1").cloned())
    };
    assert_ne!(digest(&replaced), digest(&proxy_record));
    // And back, through the first backend: the test network's proxy again.
    backend.acquire(&key, &spec).await.expect("acquire back");
    assert_stdout(
        &*sandbox,
        "curl -s --max-time 10 http://allowed.test/",
        "allowed.test",
    )
    .await;

    // Another allowlist, or egress closed, on this warm key: refused, typed.
    for other in [
        allowlist(&["allowed.test", "denied.test"]),
        SandboxSpec::builder("egress").image(BASE).build().unwrap(),
    ] {
        let Err(refused) = backend.acquire(&key, &other).await else {
            panic!("a changed egress was served on a warm key");
        };
        assert_eq!(refused.kind(), ErrorKind::SpecMismatch, "{refused}");
        assert!(refused.to_string().contains("dispose it"), "{refused}");
    }

    // A guest that kills its forwarder gets a new one, started by the workload's loop, and its
    // egress back within a few seconds.
    let kill = run(
        &*sandbox,
        "forwarders() { for p in /proc/[0-9]*; do case $(tr '\\0' ' ' <$p/cmdline 2>/dev/null) in '/run/maf-egress/egress-proxy forward'*) printf '%s ' ${p#/proc/} ;; esac; done; }; \
         old=$(forwarders); [ -n \"$old\" ] || { echo no forwarder; exit 1; }; kill $old; i=0; \
         while [ $i -lt 100 ]; do new=$(forwarders); \
           code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 http://allowed.test/); \
           case $new:$code in ?*:2*) [ \"$new\" != \"$old\" ] && { echo \"back: $old-> $new\"; exit 0; } ;; esac; \
           sleep 0.1; i=$((i+1)); done; echo \"not back: [$old] [$new] $code\"; exit 1",
    )
    .await;
    assert_eq!(
        kill.exit_code,
        0,
        "{} {}",
        kill.stdout_text(),
        kill.stderr_text()
    );

    // Disposing of one instance takes its proxy and volume with it.
    let other_key = SandboxKey::conversation(scope.clone(), "instance", "agent");
    let other = backend
        .acquire(&other_key, &spec)
        .await
        .expect("acquire another");
    let before = engine_leftovers(&docker, &scope).await;
    assert_eq!(
        before.len(),
        6,
        "two workloads, two proxies, two volumes: {before:?}"
    );
    let selector = DisposeSelector {
        instance_id: Some(other.instance_id().to_owned()),
        ..DisposeSelector::all()
    };
    assert!(backend.dispose(&other_key, selector).await.is_none());
    let after = engine_leftovers(&docker, &scope).await;
    assert_eq!(after.len(), 3, "one sandbox's three objects: {after:?}");

    // Listing names the workload only; the purge removes it, its proxy and its volume.
    let listed = backend.list(&scope, None).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(!engine_leftovers(&docker, &scope).await.is_empty());
    let purge = backend.dispose_scope(&scope, "thread").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert_eq!(purge.disposed, 1);
    let left = engine_leftovers(&docker, &scope).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    let network_name = network.name.clone();
    drop(network);
    let networks = bounded(
        "network list",
        docker.list_networks(None::<bollard::query_parameters::ListNetworksOptions>),
    )
    .await;
    assert!(
        !networks
            .iter()
            .any(|n| n.name.as_deref() == Some(network_name.as_str())),
        "the test network {network_name} remains"
    );
}

/// Two backends with their own locks and memory (as two processes are) acquire one allowlist key
/// at once, three times each: one workload and one proxy serve them all, and egress works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allowlist_acquires_share_one_workload_and_one_proxy() {
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress-race");
    let (network, _, _, _) = test_network(&docker, &scope).await;
    let connect = || async {
        let mut config = DockerConfig::default();
        config.egress_proxy_image = Some(DEFAULT_EGRESS_PROXY_IMAGE.into());
        config.outbound_network = network.name.clone();
        config.allow_private_destinations = true;
        DockerBackend::connect(config).await.expect("connect")
    };
    let (first, second) = (connect().await, connect().await);
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let spec = allowlist(&["allowed.test"]);
    let acquires = (0..6).map(|i| {
        let backend = if i % 2 == 0 { &first } else { &second };
        let (key, spec) = (&key, &spec);
        async move {
            backend
                .acquire(key, spec)
                .await
                .map(|s| s.instance_id().to_owned())
        }
    });
    let ids: Vec<String> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .map(|r| r.expect("every acquire succeeds"))
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let objects = engine_leftovers(&docker, &scope).await;
    assert_eq!(
        objects.len(),
        3,
        "one workload, one proxy, one volume: {objects:?}"
    );
    let sandbox = first.acquire(&key, &spec).await.expect("acquire");
    assert_stdout(
        &*sandbox,
        "curl -s --max-time 10 http://allowed.test/",
        "allowed.test",
    )
    .await;
    let purge = second.dispose_scope(&scope, "thread").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert_eq!(purge.disposed, 1);
    assert!(engine_leftovers(&docker, &scope).await.is_empty());
}

/// A missing proxy image is ImageMissing, a missing outbound network an engine error naming it,
/// an image running as root an engine error saying so; none leaves a container or volume behind. Without a configured image, allowlist is not
/// offered at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_that_cannot_be_made_leaves_nothing_behind() {
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress-refused");
    let guard = TestNetwork {
        name: format!("maf-egress-test-{}", hex8()),
        scope: scope.clone(),
        containers: Vec::new(),
    };
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let spec = allowlist(&["allowed.test"]);
    let closed_only = DockerBackend::connect(DockerConfig::default())
        .await
        .expect("connect");
    assert!(!closed_only
        .declarations()
        .egress_modes
        .contains(&Egress::Allowlist));
    let Err(refused) = closed_only.acquire(&key, &spec).await else {
        panic!("allowlist served without a proxy image");
    };
    assert_eq!(refused.kind(), ErrorKind::EgressNotEnforced, "{refused}");
    // The absent image names a registry on a local address where nothing listens: the pull fails
    // without leaving the host.
    let cases = [
        (
            "127.0.0.1:9/maf-egress-proxy-absent:never-built".to_owned(),
            "bridge".to_owned(),
            ErrorKind::ImageMissing,
            "127.0.0.1:9/maf-egress-proxy-absent:never-built",
        ),
        (
            DEFAULT_EGRESS_PROXY_IMAGE.to_owned(),
            guard.name.clone(),
            ErrorKind::Engine,
            "does not exist",
        ),
        // An image that runs as root is never started as a proxy.
        (
            support::BASE_ROOT.to_owned(),
            "bridge".to_owned(),
            ErrorKind::Engine,
            "runs as root",
        ),
    ];
    for (image, network, kind, words) in cases {
        let mut config = DockerConfig::default();
        config.egress_proxy_image = Some(image);
        config.outbound_network = network;
        let backend = DockerBackend::connect(config).await.expect("connect");
        let Err(error) = backend.acquire(&key, &spec).await else {
            panic!("acquired without a proxy");
        };
        assert_eq!(error.kind(), kind, "{error}");
        assert!(error.to_string().contains(words), "{error}");
        let left = engine_leftovers(&docker, &scope).await;
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    drop(guard);
}

/// The test's own certificate authority, which signs the leaves of its HTTPS origins.
struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    fn new() -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress live test origin CA");
        let cert = params.self_signed(&key).expect("the CA");
        TestCa { cert, key }
    }

    /// The CA certificate (PEM), for the proxy's upstream bundle.
    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf for `name` signed by this CA: (certificate PEM, key PEM).
    fn leaf(&self, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a leaf key");
        let leaf = rcgen::CertificateParams::new(vec![name.to_owned()])
            .expect("leaf params")
            .signed_by(&key, &self.cert, &self.key)
            .expect("the leaf");
        (leaf.pem(), key.serialize_pem())
    }
}

/// An HTTPS `serve` origin of the test's own, logging each request's line and `Authorization`
/// on stdout.
struct Origin<'a> {
    /// Its name on the test network.
    alias: &'a str,
    /// The certificate it presents (PEM) and its key.
    cert: &'a str,
    key: &'a str,
    port: u16,
    /// Answer every request `302 Found` to this location instead of 200.
    redirect: Option<&'a str>,
    /// Share the network namespace (so the name and address) of this origin's container instead
    /// of joining the network under `alias`.
    beside: Option<&'a str>,
}

impl<'a> Origin<'a> {
    fn new(alias: &'a str, (cert, key): &'a (String, String)) -> Origin<'a> {
        Origin {
            alias,
            cert,
            key,
            port: 443,
            redirect: None,
            beside: None,
        }
    }
}

/// Starts `origin` on the test network; returns its container's name.
async fn tls_origin(docker: &Docker, network: &mut TestNetwork, origin: &Origin<'_>) -> String {
    let container = format!(
        "{}-{}-{}",
        network.name,
        origin.alias.replace('.', "-"),
        origin.port
    );
    network.containers.push(container.clone());
    let mut cmd: Vec<String> = [
        "serve",
        "--listen",
        &format!("0.0.0.0:{}", origin.port),
        "--body",
        origin.alias,
        "--log-requests",
        "--tls-cert-pem",
        origin.cert,
        "--tls-key-pem",
        origin.key,
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(location) = origin.redirect {
        cmd.extend(["--redirect".to_owned(), location.to_owned()]);
    }
    let (network_mode, networking_config) = match origin.beside {
        Some(other) => (format!("container:{other}"), None),
        None => (
            network.name.clone(),
            Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    network.name.clone(),
                    EndpointSettings {
                        aliases: Some(vec![origin.alias.to_owned()]),
                        ..Default::default()
                    },
                )])),
            }),
        ),
    };
    let body = ContainerCreateBody {
        image: Some(DEFAULT_EGRESS_PROXY_IMAGE.into()),
        cmd: Some(cmd),
        host_config: Some(HostConfig {
            network_mode: Some(network_mode),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ..Default::default()
        }),
        networking_config,
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new()
        .name(&container)
        .build();
    bounded(
        "origin create",
        docker.create_container(Some(options), body),
    )
    .await;
    bounded("origin start", docker.start_container(&container, None)).await;
    // The origin must still run a moment later (a refused flag or certificate ends it at once).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let state = bounded("origin inspect", docker.inspect_container(&container, None)).await;
    let running = state.state.as_ref().and_then(|s| s.running) == Some(true);
    assert!(
        running,
        "the HTTPS origin {container} stopped: {}",
        docker_logs(docker, &container, true, true).await
    );
    container
}

/// An origin's request log: `(request line, Authorization)` per request, in order.
async fn origin_requests(docker: &Docker, container: &str) -> Vec<(String, Option<String>)> {
    let text = docker_logs(docker, container, true, false).await;
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|v| {
            (
                v["request"].as_str().unwrap_or_default().to_owned(),
                v["authorization"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// A container's whole log, stdout and/or stderr.
async fn docker_logs(docker: &Docker, container: &str, stdout: bool, stderr: bool) -> String {
    use futures_util::StreamExt as _;
    let options = bollard::query_parameters::LogsOptionsBuilder::new()
        .stdout(stdout)
        .stderr(stderr)
        .tail("all")
        .build();
    let chunks = tokio::time::timeout(
        BOUND,
        docker.logs(container, Some(options)).collect::<Vec<_>>(),
    )
    .await
    .expect("logs within the bound");
    let mut text = String::new();
    for chunk in chunks {
        text.push_str(&String::from_utf8_lossy(
            chunk.expect("a log chunk").as_ref(),
        ));
    }
    text
}

/// Method and path rules and a credential grant, enforced by the proxy on a terminated origin of
/// the test's own (its CA trusted by the proxy through the operator's bundle, never by the
/// guest), with curl in the guest; the token reaches the origin on matching requests only and
/// nowhere the guest can look; an expired grant adds nothing; every decision is an event; and the
/// conformance EGRESS_METHODS and EGRESS_PATHS suites pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn method_path_rules_and_a_credential_grant_are_enforced_by_the_proxy() {
    use sandbox_core::credential::{BearerToken, CredentialGrant, EgressEvent};
    use sandbox_core::{Capability, EgressEntry, EgressRule};
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress-http");
    let (mut network, _, _, _) = test_network(&docker, &scope).await;
    let test_ca = TestCa::new();
    let ca = test_ca.pem();
    let leaf = test_ca.leaf("api.test");
    let api = tls_origin(&docker, &mut network, &Origin::new("api.test", &leaf)).await;

    let (backend, events) = terminating_backend(&network.name, ca.clone()).await;
    let declared = &backend.declarations().capabilities;
    assert!(
        declared.contains(&Capability::EgressMethods),
        "{declared:?}"
    );
    assert!(declared.contains(&Capability::EgressPaths), "{declared:?}");

    // A token the guest must never see; the guest's searches name it only through a bracket
    // expression, so no search's own command line holds it.
    let token = format!("live-grant-{}", hex8());
    let (head, tail) = token.split_at(5);
    let pattern = format!("{head}[{}]{}", &tail[..1], &tail[1..]);
    let grant = |expires: std::time::SystemTime| {
        CredentialGrant::new(
            "api.test",
            443,
            Some(vec!["GET".into()]),
            vec!["/v1/secret/*".into()],
            BearerToken::new(token.clone()).unwrap(),
            expires,
        )
        .unwrap()
    };
    let rules = |allowed: EgressEntry| {
        SandboxSpec::builder("egress")
            .image(BASE)
            .egress(Egress::Allowlist)
            .allow(EgressEntry::Rule(
                EgressRule::new(
                    "api.test",
                    Some(vec!["GET".into(), "HEAD".into()]),
                    Some(vec!["/v1/*".into()]),
                )
                .unwrap(),
            ))
            .allow(allowed)
    };
    let get_only = EgressEntry::Rule(
        EgressRule::new(
            "allowed.test",
            Some(vec!["GET".into()]),
            Some(vec!["/v1/*".into()]),
        )
        .unwrap(),
    );
    let spec = rules(get_only)
        .credential(grant(
            std::time::SystemTime::now() + Duration::from_secs(3600),
        ))
        .build()
        .unwrap();
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");

    // The guest trusts the proxy's CA through its variables and its image's bundle.
    let trust = run(
        &*sandbox,
        "echo \"$SSL_CERT_FILE $CURL_CA_BUNDLE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS\"; \
         stat -c '%u %a' /etc/maf-egress/ca-bundle.pem; \
         b=/etc/ssl/certs/ca-certificates.crt; \
         if [ -f $b ]; then grep -c 'maf-egress-proxy CA: begin' $b; else echo 1; fi; \
         grep -c 'BEGIN CERTIFICATE' /etc/maf-egress/ca-bundle.pem",
    )
    .await;
    let text = trust.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "/etc/maf-egress/ca-bundle.pem /etc/maf-egress/ca-bundle.pem /etc/maf-egress/ca-bundle.pem \
             /run/maf-egress/ca.pem",
            "0 644",
            "1"
        ],
        "{text} {}",
        trust.stderr_text()
    );
    assert!(lines[3].parse::<u32>().is_ok_and(|n| n >= 1), "{text}");
    // Method and path: allowed, refused; normalisation bypasses refused.
    let first = run(
        &*sandbox,
        "curl -sS -v --max-time 10 https://api.test/v1/open",
    )
    .await;
    if first.exit_code != 0 {
        let workload = bounded(
            "inspect",
            docker.inspect_container(sandbox.instance_id(), None),
        )
        .await;
        let proxy = format!("{}-proxy", workload.name.unwrap().trim_start_matches('/'));
        panic!(
            "the first terminated GET failed: {}{}\nproxy log:\n{}",
            first.stdout_text(),
            first.stderr_text(),
            docker_logs(&docker, &proxy, true, true).await
        );
    }
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://api.test/v1/open"),
        "200",
    )
    .await;
    assert_stdout(
        &*sandbox,
        &curl_status("-X POST", "https://api.test/v1/open"),
        "403",
    )
    .await;
    assert_stdout(&*sandbox, &curl_status("", "https://api.test/admin"), "403").await;
    for bypass in [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/..;/admin",
        "/v1//../admin",
    ] {
        let url = format!("https://api.test{bypass}");
        assert_stdout(&*sandbox, &curl_status("--path-as-is", &url), "403").await;
    }
    let reason = run(&*sandbox, "curl -s --max-time 10 https://api.test/admin").await;
    assert!(
        reason.stdout_text().contains("matches no rule"),
        "{}",
        reason.stdout_text()
    );
    // The grant: added on its method and paths only, replacing what the guest sent; never on
    // plain HTTP.
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://api.test/v1/secret/a"),
        "200",
    )
    .await;
    assert_stdout(
        &*sandbox,
        &curl_status(
            "-H 'Authorization: Bearer guest'",
            "https://api.test/v1/secret/b",
        ),
        "200",
    )
    .await;
    assert_stdout(
        &*sandbox,
        &curl_status(
            "-H 'Authorization: Bearer guest'",
            "https://api.test/v1/open2",
        ),
        "200",
    )
    .await;
    assert_stdout(
        &*sandbox,
        &curl_status("-I", "https://api.test/v1/secret/c"),
        "200",
    )
    .await;
    assert_stdout(
        &*sandbox,
        &curl_status("", "http://api.test/v1/secret/d"),
        "403",
    )
    .await;
    let seen = origin_requests(&docker, &api).await;
    let bearer = format!("Bearer {token}");
    let auth_of = |request: &str| {
        seen.iter()
            .find(|(line, _)| line == request)
            .unwrap_or_else(|| panic!("{request} never reached the origin: {seen:?}"))
            .1
            .clone()
    };
    assert_eq!(auth_of("GET /v1/secret/a HTTP/1.1"), Some(bearer.clone()));
    assert_eq!(auth_of("GET /v1/secret/b HTTP/1.1"), Some(bearer.clone()));
    assert_eq!(auth_of("GET /v1/open HTTP/1.1"), None);
    assert_eq!(
        auth_of("GET /v1/open2 HTTP/1.1"),
        None,
        "the guest's Authorization is dropped"
    );
    assert_eq!(
        auth_of("HEAD /v1/secret/c HTTP/1.1"),
        None,
        "HEAD is not granted"
    );
    assert!(
        !seen
            .iter()
            .any(|(line, _)| line.contains("admin") || line.starts_with("POST")),
        "a refused request reached the origin: {seen:?}"
    );
    assert_eq!(
        seen.iter()
            .filter(|(_, auth)| auth.as_deref() == Some(bearer.as_str()))
            .count(),
        2,
        "{seen:?}"
    );

    // The token is nowhere the guest can look: environment, files, any process's environ or
    // argv; nor in the proxy's configuration or log.
    let search = run_within(
        &*sandbox,
        &format!(
            "env | grep -c '{pattern}'; \
             grep -ls '{pattern}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline | wc -l; \
             grep -rls '{pattern}' /etc /home /root /tmp /run /var /maf-sandbox /usr/local 2>/dev/null | wc -l"
        ),
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(
        search.stdout_text(),
        "0\n0\n0\n",
        "{}",
        search.stderr_text()
    );
    let workload = bounded(
        "workload inspect",
        docker.inspect_container(sandbox.instance_id(), None),
    )
    .await;
    let workload_name = workload.name.clone().unwrap();
    let proxy_name = format!("{}-proxy", workload_name.trim_start_matches('/'));
    let proxy = bounded("proxy inspect", docker.inspect_container(&proxy_name, None)).await;
    let proxy_json = serde_json::to_string(&proxy).unwrap();
    assert!(
        !proxy_json.contains(&token),
        "the proxy's configuration holds the token"
    );
    assert!(!serde_json::to_string(&workload).unwrap().contains(&token));
    let proxy_log = docker_logs(&docker, &proxy_name, true, true).await;
    assert!(
        !proxy_log.contains(&token),
        "the proxy's log holds the token"
    );
    let command = proxy
        .config
        .and_then(|c| c.cmd)
        .unwrap_or_default()
        .join(" ");
    assert!(
        command.contains("--rule api.test GET,HEAD /v1/*") && command.contains("--stdin-config"),
        "{command}"
    );

    // Events: each decision above, the credential's use named, never its value.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen_events: Vec<EgressEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.sandbox == sandbox.instance_id())
        .cloned()
        .collect();
    let find = |method: &str, path: &str| {
        seen_events
            .iter()
            .find(|e| e.method.as_deref() == Some(method) && e.path.as_deref() == Some(path))
            .unwrap_or_else(|| panic!("no event for {method} {path}: {seen_events:#?}"))
            .clone()
    };
    let granted = find("GET", "/v1/secret/a");
    assert!(granted.allowed && granted.credential_applied, "{granted:?}");
    assert_eq!(granted.host.as_deref(), Some("api.test"));
    assert_eq!(granted.port, Some(443));
    assert!(granted.bytes_down.is_some_and(|n| n > 0), "{granted:?}");
    assert!(granted.duration.is_some(), "{granted:?}");
    let open = find("GET", "/v1/open");
    assert!(open.allowed && !open.credential_applied, "{open:?}");
    assert_eq!(open.rule.as_deref(), Some("api.test GET,HEAD /v1/*"));
    let admin = find("GET", "/admin");
    assert!(
        !admin.allowed && admin.reason.contains("matches no rule"),
        "{admin:?}"
    );
    assert!(seen_events
        .iter()
        .any(|e| !e.allowed && e.method.as_deref() == Some("POST")));
    assert!(!format!("{seen_events:?}").contains(&token));

    // An expired grant adds nothing; this sandbox, with allowed.test unscoped, is also the
    // EGRESS_METHODS control.
    let expired_spec = rules(EgressEntry::Host("allowed.test".into()))
        .credential(grant(std::time::SystemTime::now() - Duration::from_secs(1)))
        .build()
        .unwrap();
    let expired_key = SandboxKey::conversation(scope.clone(), "expired", "agent");
    let expired = backend
        .acquire(&expired_key, &expired_spec)
        .await
        .expect("acquire");
    assert_stdout(
        &*expired,
        &curl_status("", "https://api.test/v1/secret/expired"),
        "200",
    )
    .await;
    let seen = origin_requests(&docker, &api).await;
    assert!(
        seen.contains(&("GET /v1/secret/expired HTTP/1.1".to_owned(), None)),
        "{seen:?}"
    );

    // Conformance: EGRESS_METHODS, a GET-only rule against an unscoped control.
    let subject = |s: &Arc<dyn Sandbox>| {
        PosixGuestSubject::in_storage_base(
            Arc::clone(s),
            backend.declarations().capabilities.clone(),
        )
        .expect("subject")
    };
    let (scoped, control) = (subject(&sandbox), subject(&expired));
    let report = conformance::network::assert_egress_methods(
        &scoped,
        &control,
        "http://allowed.test/v1/x",
        conformance::fixtures::EGRESS_EXEC_TIMEOUT,
    )
    .await
    .expect("the EGRESS_METHODS suite runs");
    assert_eq!(report.skipped(), 0, "{report}");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!(report.passed(), 3, "{report}");
    // EGRESS_PATHS: a GET /v1/* rule against the same control, bypasses included.
    let report = conformance::network::assert_egress_paths(
        &scoped,
        &control,
        "http://allowed.test",
        conformance::fixtures::EGRESS_EXEC_TIMEOUT,
    )
    .await
    .expect("the EGRESS_PATHS suite runs");
    assert_eq!(report.skipped(), 0, "{report}");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!(report.passed(), 6, "{report}");

    // A warm acquire writes the trust again and serves the same instance.
    let again = backend.acquire(&key, &spec).await.expect("warm acquire");
    assert_eq!(again.instance_id(), sandbox.instance_id());
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://api.test/v1/secret/again"),
        "200",
    )
    .await;

    let purge = backend.dispose_scope(&scope, "thread").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    let purge = backend.dispose_scope(&scope, "expired").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert!(engine_leftovers(&docker, &scope).await.is_empty());
    drop(network);
}

/// Where a grant's token can never go, and the CA each sandbox trusts, against origins of the
/// test's own: the token reaches its own origin only (not another allowed origin, not another
/// port of its host, not the target of a redirect its origin answers, which the proxy never
/// follows); an upstream presenting a certificate for another name is refused before any request
/// reaches it, and its event says no credential went; two sandboxes' proxies mint under CAs of
/// their own, and neither sandbox's trust accepts the other's leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_reaches_its_own_origin_only_and_each_sandbox_trusts_its_own_ca() {
    use sandbox_core::credential::{BearerToken, CredentialGrant, EgressEvent};
    use sandbox_core::{EgressEntry, EgressRule};
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress-token");
    let (mut network, _, _, _) = test_network(&docker, &scope).await;
    let test_ca = TestCa::new();
    let api_leaf = test_ca.leaf("api.test");
    let other_leaf = test_ca.leaf("other.test");
    let redirect_leaf = test_ca.leaf("redirect.test");
    // The wrong-name origin presents a valid leaf of the trusted CA, for another name.
    let wrong_leaf = test_ca.leaf("someone-else.test");
    let api = tls_origin(&docker, &mut network, &Origin::new("api.test", &api_leaf)).await;
    let api_8443 = tls_origin(
        &docker,
        &mut network,
        &Origin {
            port: 8443,
            beside: Some(&api),
            ..Origin::new("api.test", &api_leaf)
        },
    )
    .await;
    let other = tls_origin(
        &docker,
        &mut network,
        &Origin::new("other.test", &other_leaf),
    )
    .await;
    let redirect = tls_origin(
        &docker,
        &mut network,
        &Origin {
            redirect: Some("https://other.test/landed"),
            ..Origin::new("redirect.test", &redirect_leaf)
        },
    )
    .await;
    let wrong = tls_origin(
        &docker,
        &mut network,
        &Origin::new("wrongname.test", &wrong_leaf),
    )
    .await;

    let (backend, events) = terminating_backend(&network.name, test_ca.pem()).await;

    let token = format!("live-grant-{}", hex8());
    let grant = |host: &str, paths: &[&str]| {
        CredentialGrant::new(
            host,
            443,
            Some(vec!["GET".into()]),
            paths.iter().map(|p| (*p).to_owned()).collect(),
            BearerToken::new(token.clone()).unwrap(),
            std::time::SystemTime::now() + Duration::from_secs(3600),
        )
        .unwrap()
    };
    // other.test has a rule, so its tunnels are terminated too: the proxy is in a position to add
    // a token there, and must not.
    let spec = SandboxSpec::builder("egress")
        .image(BASE)
        .egress(Egress::Allowlist)
        .allow("api.test")
        .allow(EgressEntry::Rule(
            EgressRule::new("other.test", None, Some(vec!["/*".into()])).unwrap(),
        ))
        .allow("redirect.test")
        .allow("wrongname.test")
        .credential(grant("api.test", &["/v1/*"]))
        .credential(grant("redirect.test", &["/*"]))
        .credential(grant("wrongname.test", &["/*"]))
        .build()
        .unwrap();
    let key = SandboxKey::conversation(scope.clone(), "thread", "agent");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let bearer = Some(format!("Bearer {token}"));

    // Its own origin, on its own port: the token arrives.
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://api.test/v1/own"),
        "200",
    )
    .await;
    assert_eq!(
        origin_requests(&docker, &api).await,
        [("GET /v1/own HTTP/1.1".to_owned(), bearer.clone())]
    );
    // Another allowed, terminated origin, the same path: no token.
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://other.test/v1/own"),
        "200",
    )
    .await;
    // Another port of the same host: its CONNECT refused, and nothing reaches what listens there.
    assert_stdout(
        &*sandbox,
        "curl -sS -o /dev/null -w '%{http_connect}' --max-time 10 https://api.test:8443/v1/own",
        "403",
    )
    .await;
    assert_eq!(origin_requests(&docker, &api_8443).await, []);
    // A redirect to another origin: passed to the guest as it is, never followed by the proxy.
    assert_stdout(
        &*sandbox,
        "curl -sS -o /dev/null -w '%{http_code} %{redirect_url}' --max-time 10 https://redirect.test/go",
        "302 https://other.test/landed",
    )
    .await;
    assert_eq!(
        origin_requests(&docker, &redirect).await,
        [("GET /go HTTP/1.1".to_owned(), bearer.clone())]
    );
    assert_eq!(
        origin_requests(&docker, &other).await,
        [("GET /v1/own HTTP/1.1".to_owned(), None)],
        "the proxy followed the redirect"
    );
    // The guest following it makes a new request to the other origin, which carries no token.
    assert_stdout(
        &*sandbox,
        "curl -sS -L --max-time 10 https://redirect.test/follow",
        "other.test",
    )
    .await;
    assert_eq!(
        origin_requests(&docker, &other).await,
        [
            ("GET /v1/own HTTP/1.1".to_owned(), None),
            ("GET /landed HTTP/1.1".to_owned(), None)
        ]
    );

    // An upstream whose certificate names another host: refused inside the guest's TLS session
    // with the reason, before any request reaches it.
    let refused = run(&*sandbox, "curl -sS --max-time 10 https://wrongname.test/x").await;
    assert!(
        refused
            .stdout_text()
            .contains("TLS with the upstream failed"),
        "{} {}",
        refused.stdout_text(),
        refused.stderr_text()
    );
    assert_stdout(
        &*sandbox,
        &curl_status("", "https://wrongname.test/y"),
        "502",
    )
    .await;
    assert_eq!(origin_requests(&docker, &wrong).await, []);

    // The events: the token applied on its own origins only; the wrong name denied, no
    // credential sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen: Vec<EgressEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.sandbox == sandbox.instance_id())
        .cloned()
        .collect();
    let applied: Vec<(Option<&str>, Option<&str>)> = seen
        .iter()
        .filter(|e| e.credential_applied)
        .map(|e| (e.host.as_deref(), e.path.as_deref()))
        .collect();
    assert_eq!(
        applied,
        [
            (Some("api.test"), Some("/v1/own")),
            (Some("redirect.test"), Some("/go")),
            (Some("redirect.test"), Some("/follow"))
        ],
        "{seen:#?}"
    );
    let wrong_events: Vec<&EgressEvent> = seen
        .iter()
        .filter(|e| e.host.as_deref() == Some("wrongname.test"))
        .collect();
    assert_eq!(wrong_events.len(), 2, "{seen:#?}");
    assert!(
        wrong_events
            .iter()
            .all(|e| !e.allowed && e.reason.contains("TLS with the upstream failed")),
        "{wrong_events:#?}"
    );
    let port_event = seen
        .iter()
        .find(|e| e.port == Some(8443))
        .unwrap_or_else(|| panic!("no event for port 8443: {seen:#?}"));
    assert!(!port_event.allowed && !port_event.credential_applied);
    assert!(!format!("{seen:?}").contains(&token));

    // A second sandbox: its proxy's CA is its own, and neither sandbox trusts the other's leaf
    // (curl told to trust only the other CA fails verification: exit 60).
    let second_key = SandboxKey::conversation(scope.clone(), "second", "agent");
    let second = backend
        .acquire(&second_key, &spec)
        .await
        .expect("acquire the second");
    let ca_of = |s: &Arc<dyn Sandbox>| {
        let s = Arc::clone(s);
        async move { run(&*s, "cat /run/maf-egress/ca.pem").await.stdout_text() }
    };
    let (first_ca, second_ca) = (ca_of(&sandbox).await, ca_of(&second).await);
    assert!(
        first_ca.starts_with("-----BEGIN CERTIFICATE-----"),
        "{first_ca}"
    );
    assert!(
        second_ca.starts_with("-----BEGIN CERTIFICATE-----"),
        "{second_ca}"
    );
    assert_ne!(first_ca, second_ca, "two sandboxes share a CA");
    let only = |pem: &str| {
        format!(
            "printf '%s' '{pem}' > /tmp/only-ca.pem; mkdir -p /tmp/no-ca-dir; \
             curl -s -o /dev/null --max-time 10 --cacert /tmp/only-ca.pem \
             --capath /tmp/no-ca-dir https://api.test/v1/ca; echo $?"
        )
    };
    assert_stdout(&*sandbox, &only(&second_ca), "60\n").await;
    assert_stdout(&*second, &only(&first_ca), "60\n").await;
    // The control: each trusting its own CA alone is served.
    assert_stdout(&*sandbox, &only(&first_ca), "0\n").await;
    assert_stdout(&*second, &only(&second_ca), "0\n").await;

    for thread in ["thread", "second"] {
        let purge = backend.dispose_scope(&scope, thread).await;
        assert!(purge.undisposed.is_none(), "{purge:?}");
    }
    assert!(engine_leftovers(&docker, &scope).await.is_empty());
    drop(network);
}

/// A Python client in the guest (the standard library's `urllib` on `sandbox-python:local`,
/// with nothing configured but what the sandbox sets: the proxy variables and the CA bundle)
/// meets the same rules and gateway as curl: a ruled method and path pass, another method, a
/// path outside the rule and a dot-segment bypass are 403s with the rule's reason, and the grant
/// replaces the client's own `Authorization` at the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_client_meets_the_same_rules_and_gateway() {
    use sandbox_core::credential::{BearerToken, CredentialGrant};
    use sandbox_core::{EgressEntry, EgressRule};
    const CLIENT: &str = r#"python3 - <<'EOF'
import json, urllib.error, urllib.request

def fetch(method, path, headers=None):
    request = urllib.request.Request("https://api.test" + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()

results = {}
for name, method, path, headers in (
    ("open", "GET", "/v1/open-py", None),
    ("post", "POST", "/v1/open-py", None),
    ("admin", "GET", "/admin-py", None),
    ("bypass", "GET", "/v1/%2e%2e/admin-py", None),
    ("secret", "GET", "/v1/secret/py", {"Authorization": "Bearer guest"}),
):
    status, body = fetch(method, path, headers)
    results[name] = [status, "matches no rule" in body]
print(json.dumps(results, sort_keys=True))
EOF"#;
    let docker = Docker::connect_with_local_defaults().expect("the local engine");
    let scope = unique_scope("egress-python");
    let (mut network, _, _, _) = test_network(&docker, &scope).await;
    let test_ca = TestCa::new();
    let leaf = test_ca.leaf("api.test");
    let api = tls_origin(&docker, &mut network, &Origin::new("api.test", &leaf)).await;
    let (backend, _events) = terminating_backend(&network.name, test_ca.pem()).await;
    let token = format!("python-grant-{}", hex8());
    let spec = SandboxSpec::builder("egress")
        .image(PYTHON)
        .egress(Egress::Allowlist)
        .allow(EgressEntry::Rule(
            EgressRule::new(
                "api.test",
                Some(vec!["GET".into()]),
                Some(vec!["/v1/*".into()]),
            )
            .unwrap(),
        ))
        .credential(
            CredentialGrant::new(
                "api.test",
                443,
                Some(vec!["GET".into()]),
                vec!["/v1/secret/*".into()],
                BearerToken::new(token.clone()).unwrap(),
                std::time::SystemTime::now() + Duration::from_secs(3600),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let key = SandboxKey::conversation(scope.clone(), "python", "agent");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    let output = run_within(&*sandbox, CLIENT, Duration::from_secs(120)).await;
    let results: serde_json::Value = serde_json::from_str(&output.stdout_text())
        .unwrap_or_else(|_| panic!("{} {}", output.stdout_text(), output.stderr_text()));
    assert_eq!(
        results,
        serde_json::json!({
            "open": [200, false],
            "post": [403, true],
            "admin": [403, true],
            "bypass": [403, true],
            "secret": [200, false],
        }),
        "{}",
        output.stderr_text()
    );
    let seen = origin_requests(&docker, &api).await;
    assert!(
        seen.contains(&("GET /v1/open-py HTTP/1.1".to_owned(), None)),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(
            "GET /v1/secret/py HTTP/1.1".to_owned(),
            Some(format!("Bearer {token}"))
        )),
        "the grant did not replace the client's Authorization: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|(line, _)| line.contains("admin") || line.starts_with("POST")),
        "a refused request reached the origin: {seen:?}"
    );
    let purge = backend.dispose_scope(&scope, "python").await;
    assert!(purge.undisposed.is_none(), "{purge:?}");
    assert!(engine_leftovers(&docker, &scope).await.is_empty());
    drop(network);
}

/// A backend whose proxy terminates TLS for hosts with rules or grants, trusting `upstream_ca`
/// for the test's origins on `network`, and every proxy decision it reports.
async fn terminating_backend(
    network: &str,
    upstream_ca: String,
) -> (
    DockerBackend,
    Arc<std::sync::Mutex<Vec<sandbox_core::credential::EgressEvent>>>,
) {
    let events: Arc<std::sync::Mutex<Vec<sandbox_core::credential::EgressEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let mut config = DockerConfig::default();
    config.egress_proxy_image = Some(DEFAULT_EGRESS_PROXY_IMAGE.into());
    config.outbound_network = network.to_owned();
    config.allow_private_destinations = true;
    config.egress_upstream_ca_pem = Some(upstream_ca);
    config.egress_observer = Some(sandbox_core::credential::EgressObserver::new(
        move |event: &sandbox_core::credential::EgressEvent| {
            sink.lock().unwrap().push(event.clone());
        },
    ));
    let backend = DockerBackend::connect(config).await.expect("connect");
    (backend, events)
}
