//! The `egress-proxy` binary as a process: the start-up contract (forwarder copied, socket
//! bound 0666, the ready line), loopback unreachable from any command line, and a clean exit
//! on SIGTERM.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_egress-proxy");

/// Kills the child when dropped, however the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_exit(child: &mut Child, deadline: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn the_command_line_starts_as_contracted_and_never_reaches_loopback() {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let handoff = dir.path().join("handoff.sock");
    let forwarder = dir.path().join("egress-forward");
    // Stale socket files from an earlier run are replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    drop(std::os::unix::net::UnixListener::bind(&handoff).unwrap());
    let child = Command::new(BINARY)
        .args(["proxy", "--socket"])
        .arg(&socket)
        .arg("--handoff-socket")
        .arg(&handoff)
        .arg("--install-forwarder")
        .arg(&forwarder)
        .args(["--allow", "localhost", "--allow-private", "--port", &port])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    let mut stdout = BufReader::new(running.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "maf-egress-proxy ready v1\n");

    for path in [&socket, &handoff] {
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666, "{}", path.display());
    }
    let installed = std::fs::metadata(&forwarder).unwrap();
    assert_eq!(installed.permissions().mode() & 0o7777, 0o755);
    assert_eq!(
        std::fs::read(&forwarder).unwrap(),
        std::fs::read(BINARY).unwrap()
    );

    let mut stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(stream, "GET http://localhost:{port}/ HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
    assert!(answer.contains("forbidden address (loopback"), "{answer}");

    let pid = running.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let status = wait_for_exit(&mut running.0, Duration::from_secs(10)).expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    running
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let decision: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(decision["decision"], "deny");
    assert_eq!(decision["host"], "localhost");
    assert_eq!(decision["method"], "GET");
}

#[test]
fn bad_policies_fail_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let forwarder = dir.path().join("egress-forward");
    for allow in ["127.0.0.1", "*", "bad host"] {
        let out = Command::new(BINARY)
            .args(["proxy", "--socket"])
            .arg(&socket)
            .arg("--install-forwarder")
            .arg(&forwarder)
            .args(["--allow", allow])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{allow}");
        assert!(out.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("allowlist entry"), "{stderr}");
        assert!(!socket.exists() && !forwarder.exists());
    }
}

const TOKEN: &str = "process-test-token-7d1e";

fn grant_line(host: &str) -> String {
    format!(
        r#"{{"host":"{host}","port":443,"methods":["GET"],"paths":["/v1/*"],"token":"{TOKEN}","expires_unix":4102444800}}"#
    )
}

#[test]
fn grants_arrive_on_stdin_and_the_token_shows_nowhere_the_guest_could_look() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let ca = dir.path().join("ca.pem");
    let child = Command::new(BINARY)
        .args(["proxy", "--socket"])
        .arg(&socket)
        .arg("--install-forwarder")
        .arg(dir.path().join("egress-forward"))
        .args(["--allow", "api.test", "--rule", "api.test GET /v1/*"])
        .arg("--ca-cert-out")
        .arg(&ca)
        .arg("--stdin-config")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    {
        let mut stdin = running.0.stdin.take().unwrap();
        writeln!(stdin, "{}\n", grant_line("api.test")).unwrap();
    }
    let mut stdout = BufReader::new(running.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "maf-egress-proxy ready v1\n");

    // The CA certificate is written for the workload, its key nowhere.
    let pem = std::fs::read_to_string(&ca).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    assert!(!pem.contains("PRIVATE KEY"));
    assert_eq!(
        std::fs::metadata(&ca).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // Every file the proxy wrote but the forwarder (the executable itself, which names PEM
    // labels in its code): no key, no token.
    let written: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "egress-forward")
        .collect();
    assert!(written.contains(&"ca.pem".to_owned()), "{written:?}");
    for name in &written {
        let path = dir.path().join(name);
        if let Ok(text) = std::fs::read(&path) {
            let text = String::from_utf8_lossy(&text);
            assert!(
                !text.contains("PRIVATE KEY") && !text.contains(TOKEN),
                "{name}"
            );
        }
    }

    // Not in the proxy's own argv or environment.
    let pid = running.0.id();
    for file in ["cmdline", "environ"] {
        let bytes = std::fs::read(format!("/proc/{pid}/{file}")).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(TOKEN), "{file}");
    }

    // A request it judges (the name does not resolve here): the answer and the log carry no
    // token.
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET http://api.test/v1/x HTTP/1.1\r\nAuthorization: Bearer guest\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("plain HTTP to it is refused"), "{answer}");
    assert!(!answer.contains(TOKEN));

    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for_exit(&mut running.0, Duration::from_secs(10)).expect("exits on SIGTERM");
    let mut log = String::new();
    running
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(!log.contains(TOKEN), "{log}");
    let decision: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    assert_eq!(decision["decision"], "deny");
    assert_eq!(decision["credential"], false);
}

#[test]
fn bad_grants_and_rules_fail_without_echoing_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], stdin: &str| {
        let mut child = Command::new(BINARY)
            .args(["proxy", "--socket"])
            .arg(dir.path().join("proxy.sock"))
            .arg("--install-forwarder")
            .arg(dir.path().join("egress-forward"))
            .args(["--allow", "api.test"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains(TOKEN), "{stderr}");
        stderr
    };
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let grants = ["--stdin-config", "--ca-cert-out", ca];
    assert!(run(&grants, &grant_line("other.test")).contains("not on the allowlist"));
    let broken = grant_line("api.test").replace("443", &format!("\"{TOKEN}\""));
    assert!(run(&grants, &broken).contains("line 1"));
    assert!(run(&grants, &format!("\n{}x", grant_line("api.test"))).contains("line 2"));
    assert!(run(&["--stdin-config"], &grant_line("api.test")).contains("--ca-cert-out"));
    assert!(run(&["--rule", "api.test GET"], "").contains("rule"));
    assert!(!dir.path().join("egress-forward").exists());
    assert!(!dir.path().join("ca.pem").exists());
}
