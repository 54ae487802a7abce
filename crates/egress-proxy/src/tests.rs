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

struct Harness {
    _dir: tempfile::TempDir,
    socket: PathBuf,
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
    };
    let listener = crate::cli::bind_socket(&socket).unwrap();
    tokio::spawn(crate::proxy::serve(listener, Arc::new(policy)));
    Harness {
        _dir: dir,
        socket,
        upstream_port,
    }
}

/// Sends `request` on a fresh socket connection and reads the whole answer (bounded).
async fn exchange(socket: &Path, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    stream.write_all(request).await.unwrap();
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

#[tokio::test]
async fn connections_over_the_cap_get_503() {
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let h = start(Reply::Text("x".into()), limits).await;
    // The first connection holds the one slot while its head is incomplete.
    let mut holder = UnixStream::connect(&h.socket).await.unwrap();
    holder.write_all(b"GET http://localhost/").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = exchange(&h.socket, b"GET http://localhost/ HTTP/1.1\r\n\r\n").await;
    assert_eq!(status(&answer), "HTTP/1.1 503");
}

#[tokio::test]
async fn the_forwarder_relays_to_the_socket() {
    let h = start(Reply::Filler(1 << 20), Limits::default()).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let forward_addr = listener.local_addr().unwrap();
    tokio::spawn(crate::forward::serve(listener, h.socket.clone()));
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
