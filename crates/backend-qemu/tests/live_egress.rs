//! Allowlist egress against real QEMU (docs/qemu-backend.md#allowlist-egress): the guest's only
//! way out is the agent, and what goes out is what the egress proxy's policy allows. The origins
//! live in a network namespace the test makes (a veth pair, its far end's address private and
//! not the host's own), an HTTP origin on port 80 and an HTTPS one on 443 under a CA of the
//! test's, which the backend's proxy is configured to trust. Runs EGRESS, EGRESS_METHODS and
//! EGRESS_PATHS, then the credential gateway over TLS, from curl and from Python: the token
//! reaches the origin on matching requests only, replaces the guest's own `Authorization`, and
//! is nowhere in the guest.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend_qemu::QemuEgress;
use conformance::fixtures::EGRESS_EXEC_TIMEOUT;
use conformance::network::{assert_egress, assert_egress_methods, assert_egress_paths};
use conformance::PosixGuestSubject;
use sandbox_core::credential::{BearerToken, CredentialGrant, EgressEvent, EgressObserver};
use sandbox_core::{
    Command as GuestCommand, Egress, EgressEntry, EgressRule, ExecRequest, Sandbox, SandboxBackend,
    SandboxKey, SandboxSpec,
};
use support::{assert_nothing_left, config, connect_with, run_parent, step};

/// The grant's token: a value found nowhere but in the proxy and at the origin.
const TOKEN: &str = "qemu-egress-token-5f1c2a9e";

/// Runs `ip` with `args`, failing the test on an error.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The origin: answers 200 to every request on both ports, printing `PORT METHOD PATH AUTH`.
const ORIGIN: &str = r#"
import http.server, ssl, sys, threading
class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        auth = self.headers.get("Authorization") or "-"
        print(self.server.server_port, self.command, self.path, auth, flush=True)
        body = b"origin\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = answer
    def log_message(self, *args):
        pass
address, cert, key = sys.argv[1:4]
plain = http.server.ThreadingHTTPServer((address, 80), Origin)
tls = http.server.ThreadingHTTPServer((address, 443), Origin)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
"#;

/// A network namespace with the origin in it, its requests collected; all gone when dropped.
struct Origins {
    namespace: String,
    address: IpAddr,
    server: Child,
    seen: Arc<Mutex<Vec<String>>>,
    ca_pem: String,
    _files: tempfile::TempDir,
}

impl Origins {
    fn start() -> Origins {
        let pid = std::process::id();
        let namespace = format!("qemu-egress-{pid}");
        let (host_end, far_end) = (
            format!("qeh{}", pid % 100_000),
            format!("qeg{}", pid % 100_000),
        );
        let (a, b) = ((pid / 64) % 250 + 1, (pid % 64) * 4);
        let host_address = format!("10.231.{a}.{}", b + 1);
        let far_address = format!("10.231.{a}.{}", b + 2);
        ip(&["netns", "add", &namespace]);
        ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", &far_end,
        ]);
        ip(&["link", "set", &far_end, "netns", &namespace]);
        ip(&[
            "addr",
            "add",
            &format!("{host_address}/30"),
            "dev",
            &host_end,
        ]);
        ip(&["link", "set", &host_end, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", namespace.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{far_address}/30"), "dev", &far_end]);
        inside(&["link", "set", &far_end, "up"]);
        inside(&["link", "set", "lo", "up"]);

        // The HTTPS origin's certificate, for api.test, under a CA of the test's own.
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["api.test".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca, &ca_key)
            .unwrap();
        let files = tempfile::tempdir().unwrap();
        let (cert, key) = (files.path().join("cert.pem"), files.path().join("key.pem"));
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key, leaf_key.serialize_pem()).unwrap();

        let mut server = Command::new("ip")
            .args(["netns", "exec", &namespace, "python3", "-c", ORIGIN])
            .arg(&far_address)
            .args([&cert, &key])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the origin starts");
        let stdout = server.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        {
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                {
                    if line == "ready" {
                        let _ = ready_tx.send(());
                    } else {
                        seen.lock().unwrap().push(line);
                    }
                }
            });
        }
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the origin is ready");
        Origins {
            namespace,
            address: far_address.parse().unwrap(),
            server,
            seen,
            ca_pem: ca.pem(),
            _files: files,
        }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Origins {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        // The far end goes with the namespace, and its peer with it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

fn spec(entries: Vec<EgressEntry>, grants: &[CredentialGrant]) -> SandboxSpec {
    let mut builder = SandboxSpec::builder("egress").egress(Egress::Allowlist);
    for entry in entries {
        builder = builder.allow(entry);
    }
    for grant in grants {
        builder = builder.credential(grant.clone());
    }
    builder.build().unwrap()
}

fn rule(host: &str, methods: &[&str], paths: &[&str]) -> EgressEntry {
    EgressEntry::Rule(
        EgressRule::new(
            host,
            Some(methods.iter().map(|m| (*m).to_owned()).collect()),
            Some(paths.iter().map(|p| (*p).to_owned()).collect()),
        )
        .unwrap(),
    )
}

async fn sh(sandbox: &dyn Sandbox, line: &str) -> sandbox_core::ExecOutput {
    let request = ExecRequest::new(GuestCommand::argv(["sh", "-c", line]))
        .working_directory(sandbox.storage_base())
        .timeout(Duration::from_secs(60));
    sandbox.exec(request).await.expect("the command runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlist_egress_reaches_what_the_policy_allows_and_the_token_stays_on_the_host() {
    let origins = Origins::start();
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let events: Arc<Mutex<Vec<EgressEvent>>> = Arc::default();
    let mut config = config(&state_dir);
    let mut egress = QemuEgress::default();
    egress.allow_private = true;
    egress.hosts = BTreeMap::from(
        ["allowed.test", "denied.test", "api.test", "other.test"]
            .map(|name| (name.to_owned(), vec![origins.address])),
    );
    egress.upstream_ca_pem = Some(origins.ca_pem.clone());
    egress.observer = Some(EgressObserver::new({
        let events = Arc::clone(&events);
        move |event: &EgressEvent| events.lock().unwrap().push(event.clone())
    }));
    config.egress = egress;
    let backend = connect_with(config).await;
    let capabilities = backend.declarations().capabilities.clone();
    let scope = format!("egress-{}", std::process::id());
    let key = |thread: &str| SandboxKey::conversation(scope.clone(), thread, "agent");
    let subject = |sandbox: &Arc<dyn Sandbox>| {
        PosixGuestSubject::in_storage_base(Arc::clone(sandbox), capabilities.clone()).unwrap()
    };

    // EGRESS: a host allowlist, its CONNECTs and plain requests through the agent.
    let plain_spec = spec(vec!["allowed.test".into()], &[]);
    let plain = step(
        "acquire the plain allowlist",
        Duration::from_secs(180),
        backend.acquire(&key("plain"), &plain_spec),
    )
    .await
    .expect("acquire");
    let report = step(
        "EGRESS",
        Duration::from_secs(180),
        assert_egress(
            &subject(&plain),
            "http://allowed.test/",
            "http://denied.test/",
            EGRESS_EXEC_TIMEOUT,
        ),
    )
    .await
    .expect("the EGRESS suite runs");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!((report.passed(), report.skipped()), (2, 0), "{report}");

    // EGRESS_METHODS and EGRESS_PATHS: GET on /v1/* only, against the plain allowlist.
    let grant = CredentialGrant::new(
        "api.test",
        443,
        Some(vec!["GET".into()]),
        vec!["/v1/*".into()],
        BearerToken::new(TOKEN).unwrap(),
        std::time::SystemTime::now() + Duration::from_secs(3600),
    )
    .unwrap();
    let scoped_spec = spec(
        vec![
            rule("allowed.test", &["GET"], &["/v1/*"]),
            rule("api.test", &["GET", "POST"], &["/v1/*", "/open/*"]),
        ],
        &[grant],
    );
    let scoped = step(
        "acquire the scoped allowlist",
        Duration::from_secs(180),
        backend.acquire(&key("scoped"), &scoped_spec),
    )
    .await
    .expect("acquire");
    let report = step(
        "EGRESS_METHODS",
        Duration::from_secs(180),
        assert_egress_methods(
            &subject(&scoped),
            &subject(&plain),
            "http://allowed.test/v1/x",
            EGRESS_EXEC_TIMEOUT,
        ),
    )
    .await
    .expect("the EGRESS_METHODS suite runs");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!((report.passed(), report.skipped()), (3, 0), "{report}");
    let report = step(
        "EGRESS_PATHS",
        Duration::from_secs(180),
        assert_egress_paths(
            &subject(&scoped),
            &subject(&plain),
            "http://allowed.test",
            EGRESS_EXEC_TIMEOUT,
        ),
    )
    .await
    .expect("the EGRESS_PATHS suite runs");
    report
        .assert_all_passed()
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_eq!((report.passed(), report.skipped()), (6, 0), "{report}");

    // The gateway over TLS: the guest trusts this process's CA, the proxy the origin's.
    let status = |out: &sandbox_core::ExecOutput| out.stdout_text().trim().to_owned();
    let curl = "curl -sS -o /dev/null -w '%{http_code}' --max-time 20";
    let matching = sh(
        &*scoped,
        &format!("{curl} -H 'Authorization: Bearer from-the-guest' https://api.test/v1/secret"),
    )
    .await;
    assert_eq!(status(&matching), "200", "{matching:?}");
    let unmatched = sh(&*scoped, &format!("{curl} -X POST https://api.test/open/x")).await;
    assert_eq!(status(&unmatched), "200", "{unmatched:?}");
    let refused = sh(&*scoped, &format!("{curl} https://api.test/admin")).await;
    assert_eq!(status(&refused), "403", "{refused:?}");
    // The variables a command gets: the way out, the bundle, its own loopback left direct.
    let env = sh(
        &*scoped,
        "echo \"$HTTPS_PROXY $NO_PROXY $SSL_CERT_FILE\"; test -s \"$SSL_CERT_FILE\" && echo bundle",
    )
    .await;
    let lines: Vec<String> = env.stdout_text().lines().map(str::to_owned).collect();
    assert!(
        lines
            .first()
            .is_some_and(|line| line.starts_with("http://127.0.0.1:31")
                && line.contains(" localhost,127.0.0.1 /etc/sandbox-egress/bundle-")),
        "{env:?}"
    );
    assert_eq!(lines.get(1).map(String::as_str), Some("bundle"), "{env:?}");

    // A Python client meets the same rules and gateway: urllib takes the proxy and the bundle
    // from the same variables.
    let python = sh(
        &*scoped,
        "python3 -c \"
import urllib.request as u, urllib.error as e
def get(url):
    try:
        request = u.Request(url, headers={'Authorization': 'Bearer from-python'})
        return u.urlopen(request, timeout=20).status
    except e.HTTPError as error:
        return error.code
print(get('https://api.test/v1/python'), get('https://api.test/admin'))
\"",
    )
    .await;
    assert_eq!(python.stdout_text().trim(), "200 403", "{python:?}");
    let seen = origins.seen();
    assert!(
        seen.contains(&format!("443 GET /v1/secret Bearer {TOKEN}")),
        "{seen:?}"
    );
    assert!(
        seen.contains(&format!("443 GET /v1/python Bearer {TOKEN}")),
        "{seen:?}"
    );
    assert!(seen.contains(&"443 POST /open/x -".to_owned()), "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|line| line.contains("/admin") && line.starts_with("443")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .filter(|line| line.contains(TOKEN))
            .all(|line| line.starts_with("443 GET /v1/")),
        "{seen:?}"
    );
    // Never in the guest: not in any process's environment or arguments, not in its files.
    // The pattern's last letter in brackets, so the scan's own arguments do not match it.
    let (head, last) = TOKEN.split_at(TOKEN.len() - 1);
    let pattern = format!("{head}[{last}]");
    let scan = sh(
        &*scoped,
        &format!(
            "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -c '{pattern}'; \
             grep -rl '{pattern}' /etc /tmp /root /var/tmp {} 2>/dev/null; true",
            scoped.storage_base()
        ),
    )
    .await;
    assert_eq!(scan.stdout_text().trim(), "0", "{scan:?}");

    // One key, one egress: another policy for it is refused.
    let other = spec(vec!["other.test".into()], &[]);
    let mismatch = backend.acquire(&key("plain"), &other).await.unwrap_err();
    assert_eq!(
        mismatch.kind(),
        sandbox_core::ErrorKind::SpecMismatch,
        "{mismatch}"
    );

    // A fork's copy keeps the source's egress, its commands pointed at their own way out.
    let refused_fork = backend
        .fork(&key("scoped"), &plain_spec, &key("copy"))
        .await
        .unwrap_err();
    assert_eq!(
        refused_fork.kind(),
        sandbox_core::ErrorKind::SpecMismatch,
        "{refused_fork}"
    );
    let copy = step(
        "fork the scoped sandbox",
        Duration::from_secs(180),
        backend.fork(&key("scoped"), &scoped_spec, &key("copy")),
    )
    .await
    .expect("fork");
    let through_copy = sh(&*copy, &format!("{curl} http://allowed.test/v1/copy")).await;
    assert_eq!(status(&through_copy), "200", "{through_copy:?}");
    let outside = sh(&*copy, &format!("{curl} http://allowed.test/admin")).await;
    assert_eq!(status(&outside), "403", "{outside:?}");
    assert!(origins.seen().contains(&"80 GET /v1/copy -".to_owned()));

    // Every decision was seen, with a credential's use and never its value.
    let events = events.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|e| !e.allowed && e.host.as_deref() == Some("denied.test")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.allowed && e.credential_applied && e.path.as_deref() == Some("/v1/secret")),
        "{events:?}"
    );
    assert!(!format!("{events:?}").contains(TOKEN));

    drop((plain, scoped, copy));
    for thread in ["plain", "scoped", "copy"] {
        let purge = backend.dispose_scope(&scope, thread).await;
        assert!(purge.undisposed.is_none(), "disposal: {purge:?}");
        assert_eq!(purge.disposed, 1, "{thread}");
    }
    drop(backend);
    assert_nothing_left(&state_dir);
}
