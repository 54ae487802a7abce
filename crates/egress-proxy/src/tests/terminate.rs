//! Terminated tunnels end to end on loopback: a TLS origin of the test's own (its CA made with
//! rcgen and trusted by the proxy through configuration), a client trusting the proxy's CA,
//! rules, grants, and every decision seen by the observer.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::mpsc;

use crate::address::AddressPolicy;
use crate::hostmatch::Allowlist;
use crate::proxy::{Decision, Limits, Observer, Policy};
use crate::rules::{Grant, HttpRule, HttpRules};
use crate::tls::{Terminator, UpstreamRoots};

const SECRET: &str = "grant-token-3f9a1c77e2";
const OLD_SECRET: &str = "expired-token-88d0b1";
const GUEST: &str = "guest-sent-token-5150";

/// The upstream's CA and a leaf for `name` signed by it.
struct UpstreamPki {
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl UpstreamPki {
    fn new() -> UpstreamPki {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        UpstreamPki { ca, ca_key }
    }

    fn server_config(&self, name: &str) -> Arc<rustls::ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.ca, &self.ca_key)
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
        Arc::new(config)
    }
}

/// A TLS origin on loopback presenting a leaf for `name`: it records each request (head and
/// body) and answers `ok`, or, for a path containing `echo`, the head it received.
async fn tls_origin(pki: &UpstreamPki, name: &str) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(name));
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(stream).await else {
                    return;
                };
                let mut seen = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await
                    else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&chunk[..n]);
                    if let Some(end) = crate::head::head_len(&seen) {
                        break end;
                    }
                };
                let head = String::from_utf8_lossy(&seen[..head_end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while seen.len() < head_end + length {
                    let n = stream.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&chunk[..n]);
                }
                let body = if head.contains("echo") {
                    head.clone()
                } else if head.contains("big") {
                    "x".repeat(16 << 20)
                } else {
                    "ok".to_owned()
                };
                let _ = sender.send(String::from_utf8_lossy(&seen).into_owned());
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (port, receiver)
}

fn far_future() -> u64 {
    4_102_444_800
}

fn grant(port: u16, paths: &str, token: &str, expires: u64) -> Grant {
    Grant::parse(
        &format!(
            r#"{{"host":"localhost","port":{port},"methods":["GET","POST"],"paths":[{paths}],"token":"{token}","expires_unix":{expires}}}"#
        ),
        1,
    )
    .unwrap()
}

struct Proxy {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    terminator: Arc<Terminator>,
    decisions: Arc<Mutex<Vec<Decision>>>,
}

async fn proxy(ports: &[u16], pki: &UpstreamPki, rules: &[&str], grants: Vec<Grant>) -> Proxy {
    proxy_with(ports, pki, rules, grants, Limits::default()).await
}

async fn proxy_with(
    ports: &[u16],
    pki: &UpstreamPki,
    rules: &[&str],
    grants: Vec<Grant>,
    limits: Limits,
) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let terminator = Arc::new(
        Terminator::new(&UpstreamRoots {
            public: false,
            extra: vec![pki.ca.der().clone()],
        })
        .unwrap(),
    );
    let decisions = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&decisions);
    let policy = Policy {
        allow: Allowlist::new(["localhost"]).unwrap(),
        ports: ports.iter().copied().collect::<BTreeSet<u16>>(),
        addresses: AddressPolicy::new(false, []).permitting_loopback(),
        limits,
        http: HttpRules::new(
            rules.iter().map(|r| HttpRule::parse(r).unwrap()).collect(),
            grants,
        ),
        terminator: Some(Arc::clone(&terminator)),
        hosts: Default::default(),
        observer: Some(Observer(Arc::new(move |d: &Decision| {
            seen.lock().unwrap().push(d.clone());
        }))),
    };
    let listener = crate::cli::bind_socket(&socket).unwrap();
    tokio::spawn(crate::proxy::serve(listener, None, Arc::new(policy)));
    Proxy {
        _dir: dir,
        socket,
        terminator,
        decisions,
    }
}

fn client_config(trusted: CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// CONNECTs to `localhost:port` through the proxy, completes TLS trusting `trusted`, sends
/// `request` and reads the answer to its end. `Err` when TLS with the proxy fails.
async fn https(
    socket: &std::path::Path,
    port: u16,
    trusted: CertificateDer<'static>,
    request: &str,
) -> Result<String, String> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream
        .write_all(
            format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let mut first = vec![0u8; established.len()];
    stream.read_exact(&mut first).await.unwrap();
    assert_eq!(first, established, "{}", String::from_utf8_lossy(&first));
    let connector = tokio_rustls::TlsConnector::from(client_config(trusted));
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut answer))
        .await
        .expect("the proxy answers in time");
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The decisions once `count` have been made (a terminated exchange is logged as it ends, which
/// can be just after the client has read its end).
async fn observed(p: &Proxy, count: usize) -> Vec<Decision> {
    for _ in 0..200 {
        let seen = p.decisions.lock().unwrap().clone();
        if seen.len() >= count {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    p.decisions.lock().unwrap().clone()
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n")
}

/// Everything the origin received so far.
fn drain(received: &mut mpsc::UnboundedReceiver<String>) -> Vec<String> {
    let mut all = Vec::new();
    while let Ok(one) = received.try_recv() {
        all.push(one);
    }
    all
}

#[tokio::test]
async fn rules_grants_and_refusals_through_a_terminated_tunnel() {
    let pki = UpstreamPki::new();
    let (port, mut received) = tls_origin(&pki, "localhost").await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let p = proxy(
        &[port],
        &pki,
        &["localhost GET,POST /v1/*,/open"],
        vec![
            grant(port, r#""/v1/*""#, SECRET, far_future()),
            grant(port, r#""/open""#, OLD_SECRET, now - 1),
        ],
    )
    .await;
    let ca = p.terminator.authority_der();
    let auth = format!("Authorization: Bearer {GUEST}\r\n");

    // A matching request: the guest's Authorization replaced by the grant's.
    let answer = https(&p.socket, port, ca.clone(), &get("/v1/./a", &auth))
        .await
        .unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );
    let seen = drain(&mut received);
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].starts_with("GET /v1/a HTTP/1.1\r\nHost: localhost:"),
        "{}",
        seen[0]
    );
    assert_eq!(seen[0].matches("Authorization").count(), 1, "{}", seen[0]);
    assert!(seen[0].contains(&format!("Authorization: Bearer {SECRET}\r\n")));
    assert!(!seen[0].contains(GUEST));

    // Allowed by the rule, outside every live grant (the one for /open has expired): no
    // Authorization at all reaches the origin, not even the guest's.
    for request in [
        get("/open", &auth),
        get("/open", &format!("authorization: Basic {GUEST}\r\n")),
        format!("POST /open HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: 2\r\n\r\nhi"),
    ] {
        let answer = https(&p.socket, port, ca.clone(), &request).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let seen = drain(&mut received);
        assert_eq!(seen.len(), 1);
        assert!(
            !seen[0].to_ascii_lowercase().contains("authorization"),
            "{}",
            seen[0]
        );
        assert!(!seen[0].contains(OLD_SECRET));
    }

    // Refused inside TLS with a one-line reason, and nothing reaches the origin.
    for (request, status) in [
        (get("/admin", ""), "HTTP/1.1 403"),
        (
            "DELETE /v1/a HTTP/1.1\r\nHost: localhost\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
        ),
        (
            "get /v1/a HTTP/1.1\r\nHost: localhost\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
        ),
        (get("/v1/../admin", ""), "HTTP/1.1 403"),
        (get("/v1/%2e%2e/admin", ""), "HTTP/1.1 403"),
        (get("/v1/%2E%2e/admin", ""), "HTTP/1.1 403"),
        (get("/v1/..;/admin", ""), "HTTP/1.1 403"),
        (get("/v1/..%2fadmin", ""), "HTTP/1.1 403"),
        (get("/v1//..//admin", ""), "HTTP/1.1 403"),
        (get("/v1/%252e%252e/admin", ""), "HTTP/1.1 403"),
        (get("/v1/..\\admin", ""), "HTTP/1.1 403"),
        (get("https://localhost/v1/a", ""), "HTTP/1.1 403"),
        (
            "GET /v1/a HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
        ),
        ("GET /v1/a HTTP/1.1\r\n\r\n".to_owned(), "HTTP/1.1 403"),
        (
            "GET /v1/a HTTP/1.1\r\nHost: localhost\r\nHost: evil.test\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
        ),
        (
            "POST /v1/a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_owned(),
            "HTTP/1.1 403",
        ),
        (
            "POST /v1/a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3, 4\r\n\r\nabcd".to_owned(),
            "HTTP/1.1 400",
        ),
        (
            "GET /v1/a HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
        ),
        (
            "GET /v1/a HTTP/1.1\r\nHost: localhost\r\nX: a\r\n folded\r\n\r\n".to_owned(),
            "HTTP/1.1 400",
        ),
    ] {
        let answer = https(&p.socket, port, ca.clone(), &request).await.unwrap();
        assert!(answer.starts_with(status), "{request:?}: {answer}");
        assert_eq!(answer.matches("maf-egress-proxy: ").count(), 1, "{answer}");
        assert!(!answer.contains(SECRET));
        assert!(
            drain(&mut received).is_empty(),
            "{request:?} reached the origin"
        );
    }
    let rule_refusal = https(&p.socket, port, ca.clone(), &get("/admin", ""))
        .await
        .unwrap();
    assert!(
        rule_refusal.ends_with(
            "maf-egress-proxy: GET /admin matches no rule for localhost (rules: localhost GET,POST /v1/*,/open)\n"
        ),
        "{rule_refusal}"
    );

    // Plain HTTP to a granted host is refused before anything is dialled.
    let mut plain = UnixStream::connect(&p.socket).await.unwrap();
    plain
        .write_all(format!("GET http://localhost:{port}/v1/a HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    plain.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 403"));

    // Every decision was observed, and none carries the token.
    let decisions = observed(&p, 25).await;
    let lines: Vec<String> = decisions.iter().map(Decision::to_json_line).collect();
    for line in &lines {
        assert!(
            !line.contains(SECRET) && !line.contains(OLD_SECRET),
            "{line}"
        );
    }
    let allowed: Vec<&Decision> = decisions.iter().filter(|d| d.allowed).collect();
    assert_eq!(allowed.len(), 4, "{lines:#?}");
    assert!(allowed[0].credential);
    assert_eq!(allowed[0].path.as_deref(), Some("/v1/a"));
    assert_eq!(
        allowed[0].rule.as_deref(),
        Some("localhost GET,POST /v1/*,/open")
    );
    assert!(allowed[0].bytes_down.unwrap() > 0 && allowed[0].duration_ms.is_some());
    assert!(allowed[1..].iter().all(|d| !d.credential));
    assert_eq!(allowed[3].bytes_up, Some(2));
    let denied: Vec<&Decision> = decisions.iter().filter(|d| !d.allowed).collect();
    assert_eq!(denied.len(), 21, "{lines:#?}");
    // A refusal names the normalised path it judged, where there was one; an unnormalisable
    // path names none.
    let refused_paths: Vec<Option<&str>> = denied.iter().map(|d| d.path.as_deref()).collect();
    assert_eq!(refused_paths[0], Some("/admin"), "{lines:#?}");
    assert_eq!(refused_paths[1], Some("/v1/a"), "DELETE: {lines:#?}");
    assert_eq!(refused_paths[3..=6], [Some("/admin"); 4], "{lines:#?}");
    assert_eq!(refused_paths[7], None, "..%2f: {lines:#?}");
    assert!(denied[0].method.as_deref() == Some("GET") && denied[0].rule.is_none());
}

#[tokio::test]
async fn a_response_echoing_the_token_is_cut_before_the_token() {
    let pki = UpstreamPki::new();
    let (port, mut received) = tls_origin(&pki, "localhost").await;
    let p = proxy(
        &[port],
        &pki,
        &[],
        vec![grant(port, r#""/*""#, SECRET, far_future())],
    )
    .await;
    let ca = p.terminator.authority_der();
    let answer = https(&p.socket, port, ca, &get("/echo", "")).await.unwrap();
    // The origin got the token; the client got none of it.
    assert!(drain(&mut received)[0].contains(SECRET));
    assert!(!answer.contains(SECRET), "{answer}");
    assert!(!answer.contains(&SECRET[..8]), "{answer}");
    let decisions = observed(&p, 1).await;
    assert_eq!(decisions.len(), 1);
    assert!(!decisions[0].allowed && decisions[0].credential);
    assert!(decisions[0].reason.contains("carried the credential"));
}

#[tokio::test]
async fn an_upstream_with_a_certificate_for_another_name_is_refused() {
    let pki = UpstreamPki::new();
    let (port, mut received) = tls_origin(&pki, "other.test").await;
    // Granted, so the request would carry a token: it is never sent, and the decision says so.
    let p = proxy(
        &[port],
        &pki,
        &["localhost * /*"],
        vec![grant(port, r#""/*""#, "tok-never-sent", far_future())],
    )
    .await;
    let ca = p.terminator.authority_der();
    let answer = https(&p.socket, port, ca, &get("/x", "")).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("TLS with the upstream failed"), "{answer}");
    assert!(!answer.contains("tok-never-sent"), "{answer}");
    assert!(drain(&mut received).is_empty());
    let decisions = observed(&p, 1).await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert!(!decisions[0].allowed, "{decisions:?}");
    assert!(!decisions[0].credential, "no token was sent: {decisions:?}");
    assert!(decisions[0].reason.contains("TLS with the upstream failed"));

    // An upstream whose CA the proxy was not given is refused as well.
    let stranger = UpstreamPki::new();
    let (port, mut received) = tls_origin(&stranger, "localhost").await;
    let p = proxy(&[port], &pki, &["localhost * /*"], Vec::new()).await;
    let answer = https(
        &p.socket,
        port,
        p.terminator.authority_der(),
        &get("/x", ""),
    )
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(drain(&mut received).is_empty());
}

#[tokio::test]
async fn a_client_trusting_another_proxys_ca_cannot_complete_tls() {
    let pki = UpstreamPki::new();
    let (port, mut received) = tls_origin(&pki, "localhost").await;
    let a = proxy(&[port], &pki, &["localhost * /*"], Vec::new()).await;
    let b = proxy(&[port], &pki, &["localhost * /*"], Vec::new()).await;
    assert_ne!(a.terminator.authority_der(), b.terminator.authority_der());
    let crossed = https(
        &a.socket,
        port,
        b.terminator.authority_der(),
        &get("/x", ""),
    )
    .await;
    assert!(crossed.is_err(), "{crossed:?}");
    assert!(drain(&mut received).is_empty());
    let own = https(
        &b.socket,
        port,
        b.terminator.authority_der(),
        &get("/x", ""),
    )
    .await;
    assert!(own.unwrap().starts_with("HTTP/1.1 200"));
    let decisions = observed(&a, 1).await;
    assert_eq!(decisions.len(), 1);
    assert!(!decisions[0].allowed && decisions[0].reason.contains("TLS with the client failed"));
}

#[tokio::test]
async fn a_client_that_stops_reading_is_let_go_at_the_idle_deadline() {
    let pki = UpstreamPki::new();
    let (port, _received) = tls_origin(&pki, "localhost").await;
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let p = proxy_with(&[port], &pki, &["localhost * /*"], Vec::new(), limits).await;
    let mut stream = UnixStream::connect(&p.socket).await.unwrap();
    stream
        .write_all(format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 39];
    stream.read_exact(&mut first).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_config(p.terminator.authority_der()));
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await
        .unwrap();
    tls.write_all(get("/big", "").as_bytes()).await.unwrap();
    // The 16 MiB response is never read: the proxy's write blocks, then gives up.
    let decisions = observed(&p, 1).await;
    assert_eq!(decisions.len(), 1, "the exchange never ended");
    assert!(decisions[0].allowed);
    assert!(decisions[0].bytes_down.unwrap() < 16 << 20);
    drop(tls);
}
