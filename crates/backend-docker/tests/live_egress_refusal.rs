//! The egress preflight refuses (docs/docker-backend.md#egress). A sandbox that really is open,
//! made through the live-only unsafe seam `DockerConfig::unsafe_open_network` on the default
//! bridge, is refused with HostNotConfined whether it reaches the host's token server (c) or a
//! local server by address (a); a sandbox whose probe cannot run (an image without curl) is
//! refused as unverifiable. Each refused sandbox is discarded by the acquire itself: no container
//! of its scope is left when the acquire returns. Every target is local (the default bridge's
//! gateway, or loopback); a sweep removes anything of a test's scope even when it fails.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend_docker::{DockerBackend, EgressProbe};
use sandbox_core::{ErrorKind, SandboxBackend, SandboxError, SandboxKey, SandboxSpec};
use support::{assert_nothing_left, bridge_gateway, docker, unique_scope, BASE, BUSYBOX};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A name nothing resolves: target (b) never answers in these tests.
const UNRESOLVABLE: &str = "http://maf-egress-probe.invalid/";

fn spec(image: &str) -> SandboxSpec {
    SandboxSpec::builder("egress").image(image).build().unwrap()
}

/// A backend with the preflight on and these targets; `open` puts every workload on the default
/// bridge (unsafe: only these tests do it).
async fn backend_with(open: bool, by_address: String, token_server: IpAddr) -> DockerBackend {
    let mut config = support::config(true).await;
    config.egress_probe = EgressProbe::new(by_address, UNRESOLVABLE, Some(token_server));
    if open {
        config.unsafe_open_network = Some("bridge".to_owned());
    }
    DockerBackend::connect(config)
        .await
        .expect("the docker backend connects to the local engine")
}

/// The ids of every container, running or not, labelled with `scope`, straight from the engine.
async fn containers_of(scope: &str) -> Vec<String> {
    let output = docker([
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!("label=maf-sandbox.scope={scope}"),
    ])
    .await;
    assert_eq!(
        output.status,
        bounded_process::ExitKind::Exited(0),
        "docker ps: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Acquires on `backend` for a fresh key of `scope`, expects a refusal, and asserts the acquire
/// left no container of the scope behind (checked before any disposal could hide one).
async fn refused_and_discarded(backend: &DockerBackend, scope: &str, image: &str) -> SandboxError {
    let key = SandboxKey::conversation(scope, "t", "agent");
    let error = match backend.acquire(&key, &spec(image)).await {
        Ok(sandbox) => panic!(
            "the preflight served sandbox {} on {image}",
            sandbox.instance_id()
        ),
        Err(error) => error,
    };
    let left = containers_of(scope).await;
    assert!(
        left.is_empty(),
        "the refused sandbox was not discarded: {left:?} ({error})"
    );
    error
}

/// Removes every container of a scope when dropped, so a failed assertion leaves nothing behind.
struct Sweep {
    scope: String,
}

impl Drop for Sweep {
    fn drop(&mut self) {
        let bounded = |args: &[&str]| {
            std::process::Command::new("timeout")
                .arg("60")
                .arg("docker")
                .args(args)
                .output()
        };
        let filter = format!("label=maf-sandbox.scope={}", self.scope);
        if let Ok(listed) = bounded(&["ps", "-a", "-q", "--filter", &filter]) {
            let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
            let ids: Vec<&str> = listed.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                let _ = bounded(&args);
            }
        }
    }
}

/// A plain-HTTP server on one local address that answers every request with `status` and counts
/// the requests; stopped when dropped.
struct LocalServer {
    address: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl LocalServer {
    async fn start(ip: IpAddr, status: &'static str) -> LocalServer {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .expect("the local server binds");
        let address = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut request = [0u8; 2048];
                    let read =
                        tokio::time::timeout(Duration::from_secs(2), stream.read(&mut request))
                            .await;
                    if matches!(read, Ok(Ok(n)) if n > 0) {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let body = "egress-test";
                    let response = format!(
                        "HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        LocalServer {
            address,
            hits,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_that_reaches_the_token_server_is_refused_and_discarded() {
    let scope = unique_scope("egress-token");
    let _sweep = Sweep {
        scope: scope.clone(),
    };
    let gateway = bridge_gateway().await;
    // (a) answers, but with an error status: `--fail` keeps that from counting as reach, so the
    // refusal can only come from the token.
    let refusing = LocalServer::start(gateway, "404 Not Found").await;
    let open = backend_with(true, refusing.url(), gateway).await;
    let error = refused_and_discarded(&open, &scope, BASE).await;
    assert_eq!(error.kind(), ErrorKind::HostNotConfined, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("reached the network although its egress is closed"),
        "{message}"
    );
    assert!(
        message.contains(&format!("(c) the host's token server, http://{gateway}:")),
        "{message}"
    );
    assert!(
        refusing.hits() >= 1,
        "the open sandbox never asked the by-address server"
    );
    assert_nothing_left(&open, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_sandbox_that_reaches_a_server_by_address_is_refused_and_discarded() {
    let scope = unique_scope("egress-address");
    let _sweep = Sweep {
        scope: scope.clone(),
    };
    let gateway = bridge_gateway().await;
    let serving = LocalServer::start(gateway, "200 OK").await;
    // The token server on loopback, out of any container's reach: only (a) can refuse.
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();

    // The control: the same targets from a closed sandbox pass, and the server hears nothing.
    let closed = backend_with(false, serving.url(), loopback).await;
    let key = SandboxKey::conversation(scope.as_str(), "closed", "agent");
    let sandbox = closed
        .acquire(&key, &spec(BASE))
        .await
        .expect("a closed sandbox passes the same preflight");
    drop(sandbox);
    assert_eq!(serving.hits(), 0, "a closed sandbox reached the server");
    assert_nothing_left(&closed, &scope, &["closed".to_owned()]).await;

    let open = backend_with(true, serving.url(), loopback).await;
    let error = refused_and_discarded(&open, &scope, BASE).await;
    assert_eq!(error.kind(), ErrorKind::HostNotConfined, "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&format!("(a) by address, {}", serving.url())),
        "{message}"
    );
    assert!(
        serving.hits() >= 1,
        "the server never heard the open sandbox"
    );
    assert_nothing_left(&open, &scope, &["t".to_owned()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_whose_probe_cannot_run_is_refused_as_unverifiable_and_discarded() {
    let scope = unique_scope("egress-nocurl");
    let _sweep = Sweep {
        scope: scope.clone(),
    };
    let gateway = bridge_gateway().await;
    // A closed sandbox on an image without curl: closed or not, egress cannot be shown, so it
    // is not served.
    let backend = backend_with(false, format!("http://{gateway}:9/"), gateway).await;
    let error = refused_and_discarded(&backend, &scope, BUSYBOX).await;
    assert_eq!(error.kind(), ErrorKind::Engine, "{error}");
    let message = error.to_string();
    assert!(message.contains("could not run (exit 127)"), "{message}");
    assert!(message.contains("unverified"), "{message}");
    assert!(message.contains("no curl in the image"), "{message}");
    assert_nothing_left(&backend, &scope, &["t".to_owned()]).await;
}
