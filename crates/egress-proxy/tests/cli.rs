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
