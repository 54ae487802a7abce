//! The HTTP server's limits over real sockets: the server of `sandbox_mcp::http::serve` on a
//! loopback port, in front of the core's fake backend, and raw HTTP/1.1 clients.
//!
//! Pinned here: a flood of connections without a token (idle, or with half-sent headers) is
//! held to the cap and closed by the header and idle timeouts, while an authenticated client is
//! served throughout and afterwards; the `Host` check is tied to the bound port; and a request
//! carrying a file of `--max-file-bytes` as base64 reaches the tool.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use sandbox_core::testing::FakeBackend;
use sandbox_core::{Isolation, Router, RouterConfig, SandboxBackend};
use sandbox_mcp::config::request_bytes_for;
use sandbox_mcp::handles::SandboxLimits;
use sandbox_mcp::http::{HttpLimits, Tokens};
use sandbox_mcp::liveness::Liveness;
use sandbox_mcp::{Settings, Shared};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

struct Server {
    addr: std::net::SocketAddr,
    fake: Arc<FakeBackend>,
    stop: CancellationToken,
    _state: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn server(limits: HttpLimits, max_file_bytes: u64) -> Server {
    let fake = Arc::new(FakeBackend::new("fake", Isolation::Microvm));
    let backend: Arc<dyn SandboxBackend> = fake.clone();
    let router = Router::new(vec![backend], RouterConfig::default()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let settings = Settings {
        scope: "http-limits".to_owned(),
        agent: "agent".to_owned(),
        image: None,
        allow_hosts: Vec::new(),
        egress: Default::default(),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 1 << 20,
        max_file_bytes,
        limits: SandboxLimits::default(),
        max_request_bytes: limits.max_request_bytes,
        http: true,
    };
    // The server makes its state directory private itself; a tempdir is world-readable.
    let liveness = Liveness::start(&state.path().join("state")).unwrap();
    let shared = Shared::new(router, settings, liveness, Duration::from_secs(600));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let tokens = Tokens::parse(&format!("{TOKEN} alice\n")).unwrap();
    tokio::spawn(sandbox_mcp::http::serve(
        shared,
        tokens,
        listener,
        Vec::new(),
        Vec::new(),
        limits,
        stop.clone(),
    ));
    Server {
        addr,
        fake,
        stop,
        _state: state,
    }
}

/// An HTTP response: status, headers (lower-case names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC message of the body: JSON, or the last `data:` event of a stream.
    fn message(&self) -> Value {
        if let Ok(v) = serde_json::from_str(&self.body) {
            return v;
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .rfind(|v| v.get("result").is_some() || v.get("error").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC answer in {:?}", self.body))
    }
}

/// Sends one request on `stream` (kept open) and reads its whole response.
async fn exchange(stream: &mut TcpStream, head: &str, body: &[u8]) -> Answer {
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    read_answer(stream).await
}

async fn read_answer(stream: &mut TcpStream) -> Answer {
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("a response in time")
            .unwrap();
        raw.extend_from_slice(&buf[..n]);
        if let Some(answer) = parse(&raw) {
            return answer;
        }
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&raw)
        );
    }
}

/// A whole response in `raw` (fixed length or chunked), if it has all arrived.
fn parse(raw: &[u8]) -> Option<Answer> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let get = |n: &str| headers.iter().find(|(h, _)| h == n).map(|(_, v)| v.clone());
    let body = if get("transfer-encoding").as_deref() == Some("chunked") {
        let mut body = Vec::new();
        let mut at = 0;
        loop {
            let line_end = rest[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[at..line_end]).trim(), 16)
                    .ok()?;
            at = line_end + 2;
            if size == 0 {
                break;
            }
            if rest.len() < at + size + 2 {
                return None;
            }
            body.extend_from_slice(&rest[at..at + size]);
            at += size + 2;
        }
        body
    } else {
        let len: usize = get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if rest.len() < len {
            return None;
        }
        rest[..len].to_vec()
    };
    Some(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// An authenticated MCP client on one kept-alive connection.
struct Client {
    stream: TcpStream,
    host: String,
    session: Option<String>,
    next: u64,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr) -> Client {
        let mut client = Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            host: addr.to_string(),
            session: None,
            next: 1,
        };
        let init = client
            .post(json!({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "http-limits", "version": "0"}
                }
            }))
            .await;
        assert_eq!(init.status, 200, "{init:?}");
        client.session = init.header("mcp-session-id").map(str::to_owned);
        let done = client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(done.status, 202, "{done:?}");
        client
    }

    async fn post(&mut self, message: Value) -> Answer {
        let body = message.to_string();
        self.post_raw(body.as_bytes(), &self.host.clone()).await
    }

    async fn post_raw(&mut self, body: &[u8], host: &str) -> Answer {
        let session = self
            .session
            .as_ref()
            .map(|s| format!("Mcp-Session-Id: {s}\r\nMCP-Protocol-Version: 2025-06-18\r\n"))
            .unwrap_or_default();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             {session}Content-Length: {}\r\n\r\n",
            body.len()
        );
        exchange(&mut self.stream, &head, body).await
    }

    /// A tool call's structured result (panics on an error result).
    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let answer = self
            .post(json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}
            }))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let message = answer.message();
        let result = &message["result"];
        assert_ne!(result["isError"], true, "{message}");
        result["structuredContent"].clone()
    }
}

/// Whether the server closes `stream` within `within` (EOF or reset).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_without_a_token_is_capped_and_timed_out_while_the_authenticated_are_served() {
    let cap = 32;
    let limits = HttpLimits {
        header_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(3),
        max_unauthenticated: cap,
        max_request_bytes: request_bytes_for(1 << 20),
    };
    let server = server(limits, 1 << 20).await;
    // An authenticated client first, with a sandbox, on a connection it keeps.
    let mut alice = Client::connect(server.addr).await;
    let made = alice.call("sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();

    // 300 connections without a token: half idle, half with headers begun and never ended.
    let mut flood = Vec::new();
    for i in 0..300 {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        if i % 2 == 1 {
            stream
                .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .await
                .unwrap();
        }
        flood.push(stream);
    }
    // Past the cap, each is closed at once.
    let mut closed_at_once = 0;
    for stream in &mut flood {
        if closed_within(stream, Duration::from_millis(20)).await {
            closed_at_once += 1;
        }
    }
    assert!(
        closed_at_once >= 300 - cap,
        "only {closed_at_once} of 300 unauthenticated connections were closed at once (cap {cap})"
    );
    // The authenticated client is served meanwhile.
    let ran = alice
        .call(
            "sandbox_exec",
            json!({"sandbox": handle, "argv": ["echo", "during"]}),
        )
        .await;
    assert_eq!(ran["stdout"], "during\n", "{ran}");
    // The rest are closed by the header and idle timeouts.
    let started = Instant::now();
    for stream in &mut flood {
        assert!(
            closed_within(stream, Duration::from_secs(6)).await,
            "an unauthenticated connection stayed open {:?}",
            started.elapsed()
        );
    }
    assert!(started.elapsed() < Duration::from_secs(6));
    drop(flood);
    // A new connection authenticates and works; the old one was idle past the limit and closed.
    assert!(closed_within(&mut alice.stream, Duration::from_secs(1)).await);
    let mut again = Client::connect(server.addr).await;
    let ran = again
        .call(
            "sandbox_exec",
            json!({"sandbox": handle, "argv": ["echo", "after"]}),
        )
        .await;
    assert_eq!(ran["stdout"], "after\n", "{ran}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_is_not_idle_and_the_host_must_name_the_bound_port() {
    let limits = HttpLimits {
        idle_timeout: Duration::from_secs(1),
        ..HttpLimits::default()
    };
    let server = server(limits, 1 << 20).await;
    let mut alice = Client::connect(server.addr).await;
    // A request in progress twice the idle limit: its connection is not idle.
    server
        .fake
        .update_faults(|f| f.acquire_delay = Some(Duration::from_secs(2)));
    let made = alice.call("sandbox_create", json!({})).await;
    assert!(made["sandbox"].is_string(), "{made}");
    let port = server.addr.port();
    // Each on a connection of its own: a refusal that leaves the body unread ends its connection.
    let tools_list = |host: String| async move {
        let body = br#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#;
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        exchange(&mut stream, &head, body).await.status
    };
    for host in [
        format!("localhost:{}", port + 1),
        format!("127.0.0.1:{}", port + 1),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ] {
        assert_eq!(tools_list(host.clone()).await, 403, "Host {host}");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        assert_ne!(tools_list(host.clone()).await, 403, "Host {host}");
    }
    // The long request's connection served on.
    let listed = alice
        .post(json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}))
        .await;
    assert_eq!(listed.status, 200, "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_the_size_limit_fits_in_a_request_as_base64() {
    let max_file_bytes: u64 = 8 * 1024 * 1024;
    let limits = HttpLimits {
        max_request_bytes: request_bytes_for(max_file_bytes),
        ..HttpLimits::default()
    };
    let server = server(limits, max_file_bytes).await;
    let mut alice = Client::connect(server.addr).await;
    let made = alice.call("sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    let bytes: Vec<u8> = (0..max_file_bytes).map(|i| (i * 7 % 251) as u8).collect();
    let content = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let written = alice
        .call(
            "sandbox_write_file",
            json!({"sandbox": handle, "path": "big.bin", "content": content, "encoding": "base64"}),
        )
        .await;
    assert_eq!(written["size"], max_file_bytes, "{written}");
    // One byte more is the tool's own readable refusal, not the transport's 413.
    let over = base64::engine::general_purpose::STANDARD.encode([bytes.as_slice(), b"x"].concat());
    let answer = alice
        .post(json!({
            "jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "sandbox_write_file", "arguments":
                {"sandbox": handle, "path": "big.bin", "content": over, "encoding": "base64"}}
        }))
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.status);
    let message = answer.message();
    assert_eq!(message["result"]["isError"], true, "{message}");
    assert_eq!(
        message["result"]["structuredContent"]["error"]["kind"], "over_cap",
        "{message}"
    );
}
