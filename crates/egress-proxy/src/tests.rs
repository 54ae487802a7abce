//! In-process tests of the whole proxy on loopback, which only `cfg(test)` code may permit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, UnixStream};

use crate::address::AddressPolicy;
use crate::hostmatch::Allowlist;
use crate::proxy::{Limits, Policy};
use crate::serve::Reply;

mod handoff;
mod terminate;

struct Harness {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    handoff: PathBuf,
    upstream_port: u16,
}

async fn upstream(reply: Reply) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(crate::serve::serve(listener, reply));
    port
}

async fn start(reply: Reply, limits: Limits) -> Harness {
    let upstream_port = upstream(reply).await;
    start_with(upstream_port, limits).await
}

async fn start_with(upstream_port: u16, limits: Limits) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let policy = Policy {
        allow: Allowlist::new(["localhost", "*.localhost"]).unwrap(),
        ports: BTreeSet::from([upstream_port]),
        addresses: AddressPolicy::new(false, []).permitting_loopback(),
        limits,
        http: crate::rules::HttpRules::default(),
        terminator: None,
        hosts: Default::default(),
        observer: None,
    };
    let handoff = dir.path().join("handoff.sock");
    let listener = crate::cli::bind_socket(&socket).unwrap();
    let handoffs = crate::cli::bind_socket(&handoff).unwrap();
    tokio::spawn(crate::proxy::serve(
        listener,
        Some(handoffs),
        Arc::new(policy),
    ));
    Harness {
        _dir: dir,
        socket,
        handoff,
        upstream_port,
    }
}

/// Sends `request` on a fresh socket connection and reads the whole answer (bounded).
async fn exchange(socket: &Path, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream.write_all(request).await.unwrap();
    answer_of(&mut stream).await
}

/// Reads everything up to the end of `stream` (bounded).
async fn answer_of(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Vec<u8> {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
        .await
        .expect("the proxy answers in time")
        .unwrap();
    answer
}

fn status(answer: &[u8]) -> &str {
    std::str::from_utf8(&answer[..answer.len().min(12)]).unwrap_or("")
}

#[tokio::test]
async fn an_allowed_host_is_answered_and_a_denied_one_gets_403() {
    let h = start(Reply::Text("hello from upstream".into()), Limits::default()).await;
    let port = h.upstream_port;
    let answer = exchange(
        &h.socket,
        format!("GET http://LocalHost:{port}/x HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: x\r\n\r\n")
            .as_bytes(),
    )
    .await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.ends_with("hello from upstream"), "{text}");

    for denied in [
        format!("GET http://other.test:{port}/ HTTP/1.1\r\n\r\n"),
        format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
        format!("GET http://localhost.evil.test:{port}/ HTTP/1.1\r\n\r\n"),
        "GET http://localhost:1/ HTTP/1.1\r\n\r\n".to_owned(),
        format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n"),
        format!("GET http://localhost@other.test:{port}/ HTTP/1.1\r\n\r\n"),
    ] {
        let answer = exchange(&h.socket, denied.as_bytes()).await;
        assert_eq!(
            status(&answer),
            "HTTP/1.1 403",
            "{denied:?}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
}

#[tokio::test]
async fn connect_tunnels_carry_bytes_intact_both_ways() {
    // An echo server stands in for a TLS endpoint: the proxy must not look inside.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = stream.split();
        tokio::io::copy(&mut read, &mut write).await.unwrap();
    });
    let h = start_with(port, Limits::default()).await;
    let mut stream = UnixStream::connect(&h.socket).await.unwrap();
    // The first tunnel bytes ride in the same write as the head.
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut first =
        format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost\r\n\r\n").into_bytes();
    first.extend_from_slice(&payload[..1000]);
    stream.write_all(&first).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let rest = payload[1000..].to_vec();
    let writer = tokio::spawn(async move {
        write.write_all(&rest).await.unwrap();
        write.shutdown().await.unwrap();
    });
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), read.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    writer.await.unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    assert!(
        answer.starts_with(established),
        "{:?}",
        String::from_utf8_lossy(&answer[..60.min(answer.len())])
    );
    assert_eq!(answer.len() - established.len(), payload.len());
    assert!(
        answer[established.len()..] == payload[..],
        "tunnel bytes changed"
    );
}

#[tokio::test]
async fn upgrades_oversize_heads_and_non_proxy_forms_are_refused() {
    let h = start(Reply::Text("x".into()), Limits::default()).await;
    let port = h.upstream_port;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            format!("GET http://localhost:{port}/ HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n").into_bytes(),
            "HTTP/1.1 403",
        ),
        (
            format!("GET http://localhost:{port}/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(17 * 1024)).into_bytes(),
            "HTTP/1.1 403",
        ),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(), "HTTP/1.1 403"),
        (format!("GET https://localhost:{port}/ HTTP/1.1\r\n\r\n").into_bytes(), "HTTP/1.1 403"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (
            format!("POST http://localhost:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").into_bytes(),
            "HTTP/1.1 403",
        ),
    ];
    for (request, expected) in cases {
        let answer = exchange(&h.socket, &request).await;
        assert_eq!(
            status(&answer),
            expected,
            "{:?}",
            String::from_utf8_lossy(&request[..request.len().min(80)])
        );
    }
}

#[tokio::test]
async fn a_slow_head_is_cut_off_at_its_deadline() {
    let limits = Limits {
        head_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let h = start(Reply::Text("x".into()), limits).await;
    let mut stream = UnixStream::connect(&h.socket).await.unwrap();
    stream
        .write_all(b"GET http://localhost/ HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status(&answer), "HTTP/1.1 400");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn one_connection_never_reaches_a_second_request_or_host() {
    // A recording upstream: it keeps everything it received on its one connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let recorded = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = tokio::time::timeout(Duration::from_millis(800), stream.read(&mut chunk))
                .await
                .map_or(0, |r| r.unwrap_or(0));
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&chunk[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await
            .unwrap();
        seen
    });
    let h = start_with(port, Limits::default()).await;
    let request = format!(
        "POST http://localhost:{port}/a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
         GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
    );
    let answer = exchange(&h.socket, request.as_bytes()).await;
    assert!(String::from_utf8_lossy(&answer).ends_with("ok"));
    let seen = String::from_utf8(recorded.await.unwrap()).unwrap();
    assert_eq!(
        seen,
        format!("POST /a HTTP/1.1\r\nHost: localhost:{port}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
    );
}

/// A proxy with one connection slot, and a client on its socket holding it (its head incomplete).
async fn start_with_its_only_slot_held() -> (Harness, UnixStream) {
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let h = start(Reply::Text("x".into()), limits).await;
    let mut holder = UnixStream::connect(&h.socket).await.unwrap();
    holder.write_all(b"GET http://localhost/").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    (h, holder)
}

#[tokio::test]
async fn connections_over_the_cap_get_503() {
    let (h, _holder) = start_with_its_only_slot_held().await;
    let answer = exchange(&h.socket, b"GET http://localhost/ HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 503");
}

/// Downloads 1 MiB through a forwarder sending to `upstream` and checks the whole body arrived.
async fn download_through_forwarder(h: &Harness, upstream: crate::forward::Upstream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let forward_addr = listener.local_addr().unwrap();
    let forwarder = tokio::spawn(crate::forward::serve(listener, upstream));
    for _ in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(forward_addr).await.unwrap();
        stream
            .write_all(
                format!(
                    "GET http://localhost:{}/big HTTP/1.1\r\n\r\n",
                    h.upstream_port
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        let end = crate::head::head_len(&answer).unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
        assert_eq!(answer.len() - end, 1 << 20);
        assert!(answer[end..].iter().all(|b| *b == b'x'));
    }
    forwarder.abort();
}

#[tokio::test]
async fn the_forwarder_hands_off_and_relays_when_it_cannot() {
    let h = start(Reply::Filler(1 << 20), Limits::default()).await;
    let nowhere = h._dir.path().join("absent.sock");
    // Only the handoff can reach the proxy.
    download_through_forwarder(
        &h,
        crate::forward::Upstream {
            socket: nowhere.clone(),
            handoff: Some(h.handoff.clone()),
        },
    )
    .await;
    // Only the relay can: the handoff socket is absent.
    download_through_forwarder(
        &h,
        crate::forward::Upstream {
            socket: h.socket.clone(),
            handoff: Some(nowhere),
        },
    )
    .await;
    // No handoff asked for.
    download_through_forwarder(
        &h,
        crate::forward::Upstream {
            socket: h.socket.clone(),
            handoff: None,
        },
    )
    .await;
}

#[tokio::test]
async fn the_forwarder_connects_again_to_a_restarted_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let handoff = dir.path().join("handoff.sock");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let forward_addr = listener.local_addr().unwrap();
    tokio::spawn(crate::forward::serve(
        listener,
        crate::forward::Upstream {
            socket: dir.path().join("absent.sock"),
            handoff: Some(handoff.clone()),
        },
    ));
    // Two proxies in turn on the same path, each taking one client and then going away with
    // its listener and its handoff connection.
    for round in 0..2 {
        let proxy = crate::cli::bind_socket(&handoff).unwrap();
        let mut client = tokio::net::TcpStream::connect(forward_addr).await.unwrap();
        let (connection, _) = tokio::time::timeout(Duration::from_secs(5), proxy.accept())
            .await
            .expect("the forwarder connects to the handoff socket")
            .unwrap();
        let Some(crate::handoff::Received::Client(mut passed)) =
            crate::handoff::receive(&connection).await.unwrap()
        else {
            panic!("round {round}: a client is handed off");
        };
        passed
            .write_all(format!("round {round}").as_bytes())
            .await
            .unwrap();
        drop(passed);
        drop(connection);
        drop(proxy);
        assert_eq!(
            answer_of(&mut client).await,
            format!("round {round}").as_bytes()
        );
    }
}

/// An allowed upstream that records every connection's bytes (until the client is idle for a
/// moment) and then answers `ok`.
async fn recording_upstream() -> (u16, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let sender = sender.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let read =
                        tokio::time::timeout(Duration::from_millis(300), stream.read(&mut chunk));
                    match read.await {
                        Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&chunk[..n]),
                        _ => break,
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = sender.send(seen);
            });
        }
    });
    (port, receiver)
}

/// Checks that `seen` is exactly one request, framed by `Content-Length` alone, carrying
/// `body`: returns its head.
fn one_framed_request(seen: &[u8], body: &[u8]) -> Result<String, String> {
    let end = crate::head::head_len(seen).ok_or("no complete head")?;
    let head = String::from_utf8(seen[..end].to_vec()).map_err(|_| "head not UTF-8")?;
    if &seen[end..] != body {
        return Err(format!(
            "body {:?} instead of {:?}",
            String::from_utf8_lossy(&seen[end..]),
            String::from_utf8_lossy(body)
        ));
    }
    let mut lengths = Vec::new();
    for line in head.lines().skip(1) {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        match name.to_ascii_lowercase().as_str() {
            "transfer-encoding" => return Err("Transfer-Encoding forwarded".into()),
            "content-length" => lengths.push(value.trim().to_owned()),
            _ => {}
        }
    }
    // No length for an empty body, or exactly one, canonical, equal to the body's.
    let declared = (body.is_empty() && lengths.is_empty()) || lengths == [body.len().to_string()];
    if !declared || !head.contains("\r\nConnection: close\r\n") {
        return Err(format!("framing not exact: {head:?}"));
    }
    Ok(head)
}

#[tokio::test]
async fn request_smuggling_attempts_reach_the_upstream_as_one_exactly_framed_request_or_not_at_all()
{
    let (port, mut recorded) = recording_upstream().await;
    let limits = Limits {
        head_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let h = start_with(port, limits).await;
    let p = port;
    let smuggled =
        format!("GET http://other.test:{p}/smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n");
    // (request, what the upstream must see: None = nothing at all, Some(body) = one request
    // carrying exactly that body), and the status the client must get.
    let cases: Vec<(String, Option<&[u8]>, &str)> = vec![
        // Content-Length and Transfer-Encoding together, in either order and spelling.
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"), None, "403"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n{smuggled}"), None, "403"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n{smuggled}"), None, "403"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n"), None, "403"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTransfer-Encoding: identity\r\nContent-Length: 6\r\n\r\nhello!"), None, "403"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"), None, "403"),
        // A space before the colon, or a field folded onto the line before (obs-fold).
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nTransfer-Encoding : chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nX-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5\r\n\t0\r\n\r\nhello"), None, "400"),
        // Duplicate or listed Content-Length values that disagree, or are not plain numbers.
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\nhello!"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 0x5\r\n\r\nhello"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5 5\r\n\r\nhello"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\nhello"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length:\r\n\r\nhello"), None, "400"),
        // A bare CR or NUL hiding a field, and bare LF line ends.
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nX-A: b\rTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nX-A: b\0c\r\nContent-Length: 5\r\n\r\nhello"), None, "400"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\nContent-Length: 5\n\nhello{smuggled}"), None, "400"),
        // Accepted: equal duplicates, a body holding a request, a pipelined second request.
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello{smuggled}"), Some(b"hello"), "200"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello{smuggled}"), Some(b"hello"), "200"),
        (format!("GET http://localhost:{p}/a HTTP/1.1\r\n\r\n{smuggled}"), Some(b""), "200"),
        (format!("GET http://localhost:{p}/a HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET http://localhost:{p}/second HTTP/1.1\r\n\r\n"), Some(b""), "200"),
        (format!("GET http://localhost:{p}/a HTTP/1.0\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n{smuggled}"), Some(b""), "200"),
        (format!("POST http://localhost:{p}/a HTTP/1.1\r\nContent-Length: {}\r\n\r\n{smuggled}{smuggled}", smuggled.len()), Some(smuggled.as_bytes()), "200"),
    ];
    for (request, expected, status_code) in &cases {
        let answer = exchange(&h.socket, request.as_bytes()).await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(
            status(&answer),
            format!("HTTP/1.1 {status_code}"),
            "{request:?}: {text}"
        );
        match expected {
            None => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert!(
                    recorded.try_recv().is_err(),
                    "{request:?} reached the upstream"
                );
            }
            Some(body) => {
                let seen = tokio::time::timeout(Duration::from_secs(5), recorded.recv())
                    .await
                    .expect("the upstream saw the request")
                    .unwrap();
                let head = one_framed_request(&seen, body)
                    .unwrap_or_else(|why| panic!("{request:?}: {why}: {seen:?}"));
                assert!(
                    head.starts_with("GET /a HTTP/1.") || head.starts_with("POST /a HTTP/1.1"),
                    "{head}"
                );
                assert!(!head.to_ascii_lowercase().contains("keep-alive"), "{head}");
                assert_eq!(head.matches("\r\nHost: ").count(), 1, "{head}");
                assert!(
                    head.contains(&format!("\r\nHost: localhost:{p}\r\n")),
                    "{head}"
                );
                tokio::time::sleep(Duration::from_millis(400)).await;
                assert!(
                    recorded.try_recv().is_err(),
                    "{request:?}: a second connection reached the upstream"
                );
            }
        }
    }
}

/// Open descriptors of this process (nextest runs each test in its own process).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

// One thread: one allocator arena, so what the process keeps after a burst is comparable
// between bursts.
#[tokio::test]
async fn three_hundred_concurrent_connections_hold_the_bound_and_leave_nothing_behind() {
    // An upstream that holds every request until released, counting connections in flight.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (release, released) = tokio::sync::watch::channel(false);
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let upstream = {
        let (in_flight, peak) = (Arc::clone(&in_flight), Arc::clone(&peak));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let now = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                let (in_flight, mut released) = (Arc::clone(&in_flight), released.clone());
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = stream.read(&mut head).await;
                    let _ = released.wait_for(|go| *go).await;
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                        )
                        .await;
                    drop(stream);
                    in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        })
    };
    let h = start_with(port, Limits::default()).await;
    // Warm the runtime and the allocator with one request, so the baseline is not a cold start.
    release.send_replace(true);
    let warm = exchange(
        &h.socket,
        format!("GET http://localhost:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status(&warm), "HTTP/1.1 200");
    release.send_replace(false);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let (fds_before, tasks_before, rss_before) = (open_fds(), metrics.num_alive_tasks(), rss_kib());
    // Four bursts: descriptors and tasks return to the baseline after each; memory settles on a
    // plateau (what the allocator keeps from the bursts' peak) and neither the peak nor what is
    // kept grows from one burst to the next, as they would if anything were kept per connection.
    let (mut rss_peaks, mut rss_after) = (Vec::new(), Vec::new());
    for burst in 0..4 {
        release.send_replace(false);
        peak.store(0, std::sync::atomic::Ordering::SeqCst);
        let clients: Vec<_> = (0..300)
            .map(|i| {
                let socket = h.socket.clone();
                tokio::spawn(async move {
                    let request = format!("GET http://localhost:{port}/{i} HTTP/1.1\r\n\r\n");
                    exchange(&socket, request.as_bytes()).await
                })
            })
            .collect();
        // Every slot taken: 256 requests held at the upstream.
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        while in_flight.load(std::sync::atomic::Ordering::SeqCst) < 256 {
            assert!(
                tokio::time::Instant::now() < until,
                "only {} in flight",
                in_flight.load(std::sync::atomic::Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fds_peak = open_fds();
        let rss_peak = rss_kib();
        rss_peaks.push(rss_peak);
        release.send_replace(true);
        let mut answers = std::collections::BTreeMap::<String, usize>::new();
        for client in clients {
            let answer = client.await.unwrap();
            *answers.entry(status(&answer).to_owned()).or_default() += 1;
        }
        assert_eq!(
            peak.load(std::sync::atomic::Ordering::SeqCst),
            256,
            "{answers:?}"
        );
        assert_eq!(answers.get("HTTP/1.1 200"), Some(&256), "{answers:?}");
        assert_eq!(answers.get("HTTP/1.1 503"), Some(&44), "{answers:?}");
        assert!(
            fds_peak >= fds_before + 2 * 256,
            "the peak did not hold the connections: {fds_peak}"
        );
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        let settled = loop {
            let now = (open_fds(), metrics.num_alive_tasks());
            if (now.0 <= fds_before && now.1 <= tasks_before) || tokio::time::Instant::now() > until
            {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        rss_after.push(rss_kib());
        println!(
            "burst {burst}: 300 connections: fds {fds_before} -> {fds_peak} -> {}, tasks \
             {tasks_before} -> {}, rss {rss_before} KiB -> {rss_peak} KiB -> {} KiB",
            settled.0, settled.1, rss_after[burst]
        );
        assert!(
            settled.0 <= fds_before,
            "descriptors leaked: {fds_before} -> {}",
            settled.0
        );
        assert!(
            settled.1 <= tasks_before,
            "tasks leaked: {tasks_before} -> {}",
            settled.1
        );
    }
    assert!(
        rss_peaks[3] <= rss_peaks[1] + 4 * 1024 && rss_after[3] <= rss_peaks[1] + 4 * 1024,
        "memory grows with each burst: peaks {rss_peaks:?} KiB, after {rss_after:?} KiB"
    );
    assert!(
        rss_after.iter().all(|kib| *kib <= rss_before + 96 * 1024),
        "memory kept after the bursts: {rss_after:?} KiB"
    );
    upstream.abort();
}

#[tokio::test]
async fn a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_refused() {
    let h = start(Reply::Text("at the limit".into()), Limits::default()).await;
    let head_of = |len: usize| {
        let start = format!("GET http://localhost:{}/ HTTP/1.1\r\nX: ", h.upstream_port);
        let end = "\r\n\r\n";
        let head = format!("{start}{}{end}", "a".repeat(len - start.len() - end.len()));
        assert_eq!(head.len(), len);
        head.into_bytes()
    };
    let at = exchange(&h.socket, &head_of(crate::head::MAX_HEAD_LEN)).await;
    assert_eq!(
        status(&at),
        "HTTP/1.1 200",
        "{}",
        String::from_utf8_lossy(&at)
    );
    let over = exchange(&h.socket, &head_of(crate::head::MAX_HEAD_LEN + 1)).await;
    assert_eq!(
        status(&over),
        "HTTP/1.1 403",
        "{}",
        String::from_utf8_lossy(&over)
    );
}

/// A policy whose only port (1) nothing serves: every request is refused before any dial.
fn closed_policy() -> Policy {
    Policy {
        allow: Allowlist::new(["localhost"]).unwrap(),
        ports: BTreeSet::from([1]),
        addresses: AddressPolicy::new(false, []),
        limits: Limits::default(),
        http: crate::rules::HttpRules::default(),
        terminator: None,
        hosts: Default::default(),
        observer: None,
    }
}

/// A socket bound to `address` but never listening: `accept` on it fails with `EINVAL`, an
/// error about the listener, not about one connection.
fn not_listening(
    address: &impl rustix::net::addr::SocketAddrArg,
    family: rustix::net::AddressFamily,
) -> std::os::fd::OwnedFd {
    let socket = rustix::net::socket_with(
        family,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&socket, address).unwrap();
    socket
}

/// A loopback TCP socket bound and never listening, as a tokio listener.
fn tcp_not_listening() -> TcpListener {
    let tcp = not_listening(
        &std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        rustix::net::AddressFamily::INET,
    );
    TcpListener::from_std(std::net::TcpListener::from(tcp)).unwrap()
}

#[tokio::test]
async fn both_accept_loops_end_with_an_error_about_their_listener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.sock");
    let unix = not_listening(
        &rustix::net::SocketAddrUnix::new(&path).unwrap(),
        rustix::net::AddressFamily::UNIX,
    );
    let listener =
        tokio::net::UnixListener::from_std(std::os::unix::net::UnixListener::from(unix)).unwrap();
    let policy = closed_policy();
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        crate::proxy::serve(listener, None, Arc::new(policy)),
    )
    .await
    .expect("the proxy's loop ends");
    assert_eq!(ended.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);

    let listener = tcp_not_listening();
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        crate::forward::serve(
            listener,
            crate::forward::Upstream {
                socket: path.clone(),
                handoff: Some(path.clone()),
            },
        ),
    )
    .await
    .expect("the forwarder's loop ends");
    assert_eq!(ended.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);

    let listener = tcp_not_listening();
    let ended = tokio::time::timeout(
        Duration::from_secs(5),
        crate::serve::serve(listener, Reply::Text("x".into())),
    )
    .await
    .expect("the test server's loop ends");
    assert_eq!(ended.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn the_test_server_frames_each_reply_by_its_length() {
    for (reply, body_len) in [
        (Reply::Text("hello".into()), 5),
        (Reply::Filler(70_000), 70_000),
        (Reply::Filler(0), 0),
    ] {
        let port = upstream(reply.clone()).await;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let answer = answer_of(&mut stream).await;
        let end = crate::head::head_len(&answer).expect("a complete head");
        let head = String::from_utf8_lossy(&answer[..end]);
        assert!(
            head.contains(&format!("\r\nContent-Length: {body_len}\r\n")),
            "{reply:?}: {head}"
        );
        assert_eq!(answer.len() - end, body_len, "{reply:?}");
    }
}

/// Set in the child run of [`the_proxy_waits_out_a_descriptor_shortage`].
const SHORTAGE_CHILD: &str = "EGRESS_PROXY_SHORTAGE_CHILD";

/// The proxy's loop, out of descriptors (its accept fails with `EMFILE` while a client
/// waits), keeps serving and answers that client once descriptors are free again. Run in a
/// child process of its own: the descriptor limit is the whole process's.
#[test]
fn the_proxy_waits_out_a_descriptor_shortage() {
    if std::env::var_os(SHORTAGE_CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "tests::the_proxy_waits_out_a_descriptor_shortage",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SHORTAGE_CHILD, "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "the child run failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("proxy.sock");
        let policy = closed_policy();
        let listener = crate::cli::bind_socket(&socket).unwrap();
        let serving = tokio::spawn(crate::proxy::serve(listener, None, Arc::new(policy)));
        tokio::task::yield_now().await;

        let (soft, hard) = {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            (limit.current, limit.maximum)
        };
        let low = u64::try_from(open_fds()).unwrap() + 8;
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(low),
                maximum: hard,
            },
        )
        .unwrap();
        // Every descriptor taken; one given back for the client, none left for the accept.
        let mut held = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(file) => held.push(file),
                Err(error) => {
                    assert_eq!(
                        error.raw_os_error(),
                        Some(rustix::io::Errno::MFILE.raw_os_error()),
                        "{error}"
                    );
                    break;
                }
            }
        }
        held.pop();
        let mut client = UnixStream::connect(&socket).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !serving.is_finished(),
            "the loop ended on EMFILE: {:?}",
            serving.await
        );

        drop(held);
        rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: soft,
                maximum: hard,
            },
        )
        .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
            .await
            .expect("the waiting client is answered")
            .unwrap();
        assert_eq!(
            status(&answer),
            "HTTP/1.1 403",
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(!serving.is_finished());
    });
}

#[tokio::test]
async fn a_head_sent_in_parts_within_its_deadline_is_served() {
    let h = start(Reply::Text("whole".into()), Limits::default()).await;
    let mut stream = UnixStream::connect(&h.socket).await.unwrap();
    let first = format!("GET http://localhost:{}/ HTTP/1.1\r\n", h.upstream_port);
    stream.write_all(first.as_bytes()).await.unwrap();
    // The proxy has read the first part and waits, against the head's deadline, for the rest.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stream.write_all(b"\r\n").await.unwrap();
    let answer = answer_of(&mut stream).await;
    assert_eq!(
        status(&answer),
        "HTTP/1.1 200",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(answer.ends_with(b"whole"));
}

#[tokio::test]
async fn bytes_after_a_body_sent_in_parts_never_reach_the_upstream() {
    // An upstream that says when the first part of the body has reached it (so the proxy is
    // relaying, with the body's remaining length fixed), then records until its client is idle.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (first_part, first_part_seen) = tokio::sync::oneshot::channel();
    let recorded = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut first_part = Some(first_part);
        loop {
            let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut chunk));
            match read.await {
                Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&chunk[..n]),
                // Idle only counts once the whole first part is here.
                Err(_) if first_part.is_some() => continue,
                _ => break,
            }
            if seen.ends_with(b"\r\n\r\nhel") {
                if let Some(signal) = first_part.take() {
                    let _ = signal.send(());
                }
            }
        }
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            .await;
        seen
    });
    let h = start_with(port, Limits::default()).await;
    let mut stream = UnixStream::connect(&h.socket).await.unwrap();
    let head = format!("POST http://localhost:{port}/a HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
    stream
        .write_all(format!("{head}hel").as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), first_part_seen)
        .await
        .expect("the first part of the body reaches the upstream")
        .unwrap();
    let smuggled = format!("GET http://localhost:{port}/smuggled HTTP/1.1\r\n\r\n");
    stream
        .write_all(format!("lo{smuggled}").as_bytes())
        .await
        .unwrap();
    let answer = answer_of(&mut stream).await;
    assert!(
        answer.ends_with(b"ok"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let seen = recorded.await.unwrap();
    one_framed_request(&seen, b"hello").unwrap_or_else(|why| panic!("{why}: {seen:?}"));
}

#[tokio::test]
async fn a_refused_client_is_drained_of_at_most_256_kib_then_closed() {
    let h = start(Reply::Text("x".into()), Limits::default()).await;
    let stream = UnixStream::connect(&h.socket).await.unwrap();
    // A small send buffer keeps what is in flight, and so the count below, close to what the
    // proxy read.
    rustix::net::sockopt::set_socket_send_buffer_size(&stream, 4096).unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let refused = b"GET http://denied.test/ HTTP/1.1\r\n\r\n";
    writer.write_all(refused).await.unwrap();
    let writing = tokio::spawn(async move {
        let chunk = [b'z'; 4096];
        let mut sent = 0usize;
        // Until the proxy closes: a proxy that kept reading is stopped by the bound below.
        while sent < 64 << 20 {
            match writer.write(&chunk).await {
                Ok(n) if n > 0 => sent += n,
                _ => break,
            }
        }
        sent
    });
    let answer = answer_of(&mut reader).await;
    assert_eq!(status(&answer), "HTTP/1.1 403");
    let sent = tokio::time::timeout(Duration::from_secs(20), writing)
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    // What the head's reads took beyond the head (at most one 4 KiB read), the drain's
    // 256 KiB, and what was in flight when the proxy closed.
    let drained = 256 << 10;
    assert!(
        (drained..=drained + (64 << 10)).contains(&sent),
        "{sent} bytes accepted after a refused head"
    );
}
