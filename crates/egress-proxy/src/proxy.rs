//! The proxy role: one task per client connection, accepted on the Unix socket or handed off by
//! a forwarder ([`crate::handoff`]), each serving exactly one request (a CONNECT tunnel or one
//! plain-HTTP exchange) to exactly one upstream.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::address::AddressPolicy;
use crate::handoff::{self, Received};
use crate::head::{head_len, parse_head, Authority, Body, Host, RequestHead, Target, MAX_HEAD_LEN};
use crate::hostmatch::Allowlist;
use crate::relay::{relay_sockets, Socket};
use crate::rules::HttpRules;
use crate::tls::Terminator;

/// The ports served when none is configured.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The deadlines and caps of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From accept to a complete request head.
    pub head_timeout: Duration,
    /// Name resolution plus the upstream connect.
    pub connect_timeout: Duration,
    /// A relay with no byte moving either way for this long is closed.
    pub idle_timeout: Duration,
    /// Client connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 256,
        }
    }
}

/// What the proxy allows.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The hosts.
    pub allow: Allowlist,
    /// The destination ports.
    pub ports: BTreeSet<u16>,
    /// The addresses it may dial.
    pub addresses: AddressPolicy,
    /// Deadlines and caps.
    pub limits: Limits,
    /// The method and path rules and the credential grants.
    pub http: HttpRules,
    /// The TLS termination of the hosts `http` judges (required when `http` is not empty).
    pub terminator: Option<Arc<Terminator>>,
    /// Names resolved to these addresses instead of by the system's resolver (an operator's
    /// map, as a hosts file): the addresses are checked as any resolved address is.
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Told of every decision, instead of the log line on stderr (a proxy serving in another
    /// program's process leaves that program's stderr alone).
    pub observer: Option<Observer>,
}

/// One decision, as logged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Allowed or not.
    pub allowed: bool,
    /// The request method, when the request line was read.
    pub method: Option<String>,
    /// The requested host.
    pub host: Option<String>,
    /// The requested port.
    pub port: Option<u16>,
    /// Why.
    pub reason: String,
    /// The normalised path of a request judged by its host's rules or grants.
    pub path: Option<String>,
    /// The rule that allowed it, as written.
    pub rule: Option<String>,
    /// Whether a credential grant's token was added (the token itself is never logged).
    pub credential: bool,
    /// Bytes of request body sent upstream, for a terminated request.
    pub bytes_up: Option<u64>,
    /// Bytes of response sent to the client, for a terminated request.
    pub bytes_down: Option<u64>,
    /// From the tunnel's TLS start to the end of the exchange, for a terminated request.
    pub duration_ms: Option<u64>,
}

impl Decision {
    /// The decision as one JSON line.
    pub fn to_json_line(&self) -> String {
        serde_json::json!({
            "decision": if self.allowed { "allow" } else { "deny" },
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "reason": self.reason,
            "path": self.path,
            "rule": self.rule,
            "credential": self.credential,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": self.duration_ms,
        })
        .to_string()
    }
}

/// A callback that sees every decision of a proxy, in place of its log line.
#[derive(Clone)]
pub struct Observer(pub Arc<dyn Fn(&Decision) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// Why [`Policy::admit`] refused a request, and the status it is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 403, or 400 for a malformed body framing.
    pub status: u16,
    /// The one-line reason, for the response body and the log.
    pub reason: String,
}

impl Refusal {
    #[cold]
    fn new(status: u16, reason: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason: reason.into(),
        }
    }
}

/// A refusal or failure answered to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    status: u16,
    pub(crate) reason: String,
}

impl Answer {
    #[cold]
    pub(crate) fn status(status: u16, reason: impl Into<String>) -> Answer {
        Answer {
            status,
            reason: reason.into(),
        }
    }

    #[cold]
    fn forbidden(reason: impl Into<String>) -> Answer {
        Answer {
            status: 403,
            reason: reason.into(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let phrase = match self.status {
            400 => "Bad Request",
            403 => "Forbidden",
            502 => "Bad Gateway",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            _ => "Error",
        };
        let body = format!("maf-egress-proxy: {}\n", self.reason);
        format!(
            "HTTP/1.1 {} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.status,
            body.len()
        )
        .into_bytes()
    }
}

impl Policy {
    /// Logs `decision` as one JSON line on stderr and tells the observer.
    pub(crate) fn record(&self, decision: &Decision) {
        if let Some(observer) = &self.observer {
            (observer.0)(decision);
            return;
        }
        let line = decision.to_json_line();
        let stderr = std::io::stderr();
        let mut out = stderr.lock();
        let _ = writeln!(out, "{line}");
    }

    /// The policy check of a parsed request before any resolution: host on the allowlist,
    /// port allowed, no Upgrade, a body framing the proxy can bound.
    ///
    /// Returns the body framing of a plain-HTTP request, `None` for a tunnel.
    ///
    /// # Errors
    /// The refusal (403, or 400 for a malformed body framing).
    pub fn admit(&self, head: &RequestHead) -> Result<Option<Body>, Refusal> {
        let authority = head.target.authority();
        if !self.allow.allows(&authority.host) {
            let why = match authority.host {
                Host::Ip(_) => "IP literal not on the allowlist",
                Host::Name(_) => "host not on the allowlist",
            };
            return Err(Refusal::new(403, why));
        }
        if !self.ports.contains(&authority.port) {
            return Err(Refusal::new(
                403,
                format!("port {} not allowed", authority.port),
            ));
        }
        match &head.target {
            Target::Connect(_) => Ok(None),
            Target::Absolute { .. } => head
                .plain_body()
                .map(Some)
                .map_err(|e| Refusal::new(e.status(), e.reason())),
        }
    }

    /// Resolves the authority and checks every address; all of them must be permitted.
    async fn resolve(
        &self,
        authority: &Authority,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>, Answer> {
        let addresses: Vec<SocketAddr> = match &authority.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, authority.port)],
            Host::Name(name) if self.hosts.contains_key(&name.to_ascii_lowercase()) => self.hosts
                [&name.to_ascii_lowercase()]
                .iter()
                .map(|ip| SocketAddr::new(*ip, authority.port))
                .collect(),
            Host::Name(name) => {
                let lookup = tokio::net::lookup_host((name.as_str(), authority.port));
                match tokio::time::timeout_at(deadline, lookup).await {
                    Err(_) => {
                        return Err(Answer {
                            status: 504,
                            reason: "name resolution timed out".to_owned(),
                        })
                    }
                    Ok(Err(error)) => {
                        return Err(Answer {
                            status: 502,
                            reason: format!("name resolution failed: {error}"),
                        })
                    }
                    Ok(Ok(found)) => found.take(64).collect(),
                }
            }
        };
        if addresses.is_empty() {
            return Err(Answer {
                status: 502,
                reason: "the name has no address".to_owned(),
            });
        }
        for address in &addresses {
            if let Err(class) = self.addresses.check(address.ip()) {
                return Err(Answer::forbidden(format!(
                    "resolves to a forbidden address ({class}: {})",
                    address.ip()
                )));
            }
        }
        Ok(addresses)
    }
}

/// Serves the proxy on `listener` and, when given, the client connections forwarders hand off on
/// `handoffs` ([`crate::handoff`]), under one connection cap, until either fails.
///
/// # Errors
/// An accept error that is not about one connection.
pub async fn serve(
    listener: UnixListener,
    handoffs: Option<UnixListener>,
    policy: Arc<Policy>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(policy.limits.max_connections));
    let connections = serve_connections(listener, Arc::clone(&slots), Arc::clone(&policy));
    match handoffs {
        None => connections.await,
        Some(handoffs) => tokio::select! {
            result = connections => result,
            result = serve_handoffs(handoffs, slots, policy) => result,
        },
    }
}

/// Handoff connections served at once (a forwarder keeps one); more are closed at accept.
pub const MAX_HANDOFF_CONNECTIONS: usize = 16;

async fn serve_connections(
    listener: UnixListener,
    slots: Arc<Semaphore>,
    policy: Arc<Policy>,
) -> std::io::Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => admit_client(stream, &slots, &policy),
            Err(error) => crate::accept::pass_or_fail(error).await?,
        }
    }
}

/// Takes each handoff connection and serves the clients passed on it, until a message is refused
/// (logged; that connection ends) or the connection ends.
async fn serve_handoffs(
    listener: UnixListener,
    slots: Arc<Semaphore>,
    policy: Arc<Policy>,
) -> std::io::Result<()> {
    let senders = Arc::new(Semaphore::new(MAX_HANDOFF_CONNECTIONS));
    loop {
        let connection = match listener.accept().await {
            Ok((connection, _)) => connection,
            Err(error) => {
                crate::accept::pass_or_fail(error).await?;
                continue;
            }
        };
        let Ok(sender) = Arc::clone(&senders).try_acquire_owned() else {
            refuse_unread(&policy, "too many handoff connections");
            continue;
        };
        let slots = Arc::clone(&slots);
        let policy = Arc::clone(&policy);
        tokio::spawn(async move {
            loop {
                match handoff::receive(&connection).await {
                    Ok(Some(Received::Client(client))) => admit_client(client, &slots, &policy),
                    Ok(Some(Received::Refused(refused))) => {
                        refuse_unread(&policy, refused.reason());
                        break;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            drop(sender);
        });
    }
}

/// Logs a refusal of something the proxy closes without reading a request from it.
fn refuse_unread(policy: &Policy, reason: &str) {
    policy.record(&Decision {
        reason: reason.to_owned(),
        ..Decision::default()
    });
}

/// Serves `client` in a task of its own when a connection slot is free, else answers it 503.
fn admit_client<S: Socket + Send + Sync + 'static>(
    mut client: S,
    slots: &Arc<Semaphore>,
    policy: &Arc<Policy>,
) {
    let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
        refuse_unread(policy, "too many connections");
        let answer = Answer {
            status: 503,
            reason: "too many connections".to_owned(),
        };
        tokio::spawn(async move { answer_and_close(&mut client, &answer).await });
        return;
    };
    let policy = Arc::clone(policy);
    tokio::spawn(async move {
        handle(client, &policy).await;
        drop(permit);
    });
}

/// Reads one head (bounded in size and time). Returns the head and any bytes after it.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    deadline: Instant,
) -> Result<(Vec<u8>, Vec<u8>), Answer> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await;
        let n = match read {
            Err(_) => {
                return Err(Answer {
                    status: 400,
                    reason: "request head not received in time".to_owned(),
                })
            }
            Ok(Err(_)) | Ok(Ok(0)) => {
                return Err(Answer {
                    status: 400,
                    reason: "connection closed before a complete request head".to_owned(),
                })
            }
            Ok(Ok(n)) => n,
        };
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_len(&buffer) {
            if end > MAX_HEAD_LEN {
                return Err(Answer::forbidden("request head larger than 16 KiB"));
            }
            let rest = buffer.split_off(end);
            return Ok((buffer, rest));
        }
        if buffer.len() >= MAX_HEAD_LEN {
            return Err(Answer::forbidden("request head larger than 16 KiB"));
        }
    }
}

/// Serves one client connection that reached the proxy some other way than its socket (a
/// backend carrying a guest's connection in-process), under the same policy and rules as
/// [`serve`]'s connections: its request judged, its decision recorded, its tunnel relayed to
/// its end. The caller bounds how many it serves at once.
pub async fn serve_client(client: tokio::net::UnixStream, policy: &Policy) {
    handle(client, policy).await;
}

/// Serves one client connection.
pub(crate) async fn handle<S: Socket>(mut client: S, policy: &Policy) {
    let started = Instant::now();
    let mut decision = Decision::default();
    let outcome = serve_one(&mut client, policy, started, &mut decision).await;
    if let Err(answer) = outcome {
        if decision.reason.is_empty() {
            decision.reason = answer.reason.clone();
        }
        decision.allowed = false;
        policy.record(&decision);
        answer_and_close(&mut client, &answer).await;
    }
}

/// Writes `answer`, ends the write side, then reads and discards what the client still sends
/// (bounded in bytes and time) so that closing with unread input does not reset the
/// connection before the client has read the answer.
pub(crate) async fn answer_and_close<S>(client: &mut S, answer: &Answer)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        client.write_all(&answer.bytes()).await?;
        client.shutdown().await
    })
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut sink = [0u8; 4096];
        let mut left: usize = 256 * 1024;
        while left > 0 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

async fn serve_one<S: Socket>(
    client: &mut S,
    policy: &Policy,
    started: Instant,
    decision: &mut Decision,
) -> Result<(), Answer> {
    let (head_bytes, rest) = read_head(client, started + policy.limits.head_timeout).await?;
    let head = parse_head(&head_bytes).map_err(|error| Answer {
        status: error.status(),
        reason: error.reason().to_owned(),
    })?;
    decision.method = Some(head.method.clone());
    let authority = head.target.authority().clone();
    decision.host = Some(authority.host.to_string());
    decision.port = Some(authority.port);
    let body = policy.admit(&head).map_err(|refusal| Answer {
        status: refusal.status,
        reason: refusal.reason,
    })?;
    let name = match &authority.host {
        Host::Name(name) => name.as_str(),
        Host::Ip(_) => "",
    };
    let terminated = body.is_none() && policy.http.terminates(name);
    let verdict = match &head.target {
        Target::Absolute { path, .. } => {
            let verdict = policy
                .http
                .judge(
                    name,
                    authority.port,
                    &head.method,
                    path,
                    false,
                    SystemTime::now(),
                )
                .map_err(|refusal| {
                    decision.path = crate::pathrule::normalize(path).ok().map(|n| n.path);
                    Answer::forbidden(refusal.0)
                })?;
            decision.path = verdict.path.clone();
            decision.rule = verdict.rule.map(str::to_owned);
            Some(verdict)
        }
        Target::Connect(_) => None,
    };
    let terminator = match (terminated, &policy.terminator) {
        (false, _) => None,
        (true, Some(terminator)) => Some(terminator),
        (true, None) => {
            return Err(Answer::forbidden(
                "the host has rules but this proxy terminates no TLS",
            ))
        }
    };
    let deadline = Instant::now() + policy.limits.connect_timeout;
    let addresses = policy.resolve(&authority, deadline).await?;
    if let Some(terminator) = terminator {
        let tunnel = crate::terminate::Tunnel {
            authority: &authority,
            host: name,
            addresses: &addresses,
            policy,
            terminator,
        };
        crate::terminate::serve(&mut *client, rest, &tunnel, decision).await;
        return Ok(());
    }
    let mut upstream = connect(&addresses, deadline).await?;
    decision.allowed = true;
    decision.reason = match body {
        None => "tunnel".to_owned(),
        Some(_) => "plain http".to_owned(),
    };
    policy.record(decision);
    let idle = policy.limits.idle_timeout;
    match body {
        None => {
            let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
            if client.write_all(established).await.is_err() {
                return Ok(());
            }
            if !rest.is_empty() && upstream.write_all(&rest).await.is_err() {
                return Ok(());
            }
            let _ = relay_sockets(client, upstream, idle, None).await;
        }
        Some(body) => {
            let Some(verdict) = verdict else {
                return Ok(());
            };
            let rewritten = head.rewrite_to(&verdict.target, 80, false, None);
            let early = body.arrived(&rest);
            let mut first = rewritten;
            first.extend_from_slice(early);
            let sent = tokio::time::timeout(idle, upstream.write_all(&first)).await;
            if !matches!(sent, Ok(Ok(()))) {
                return Ok(());
            }
            let _ = relay_sockets(
                client,
                upstream,
                idle,
                Some(body.len() - early.len() as u64),
            )
            .await;
        }
    }
    Ok(())
}

/// Dials the permitted addresses in order until one answers, all within `deadline`.
pub(crate) async fn connect(
    addresses: &[SocketAddr],
    deadline: Instant,
) -> Result<TcpStream, Answer> {
    let mut last = String::from("no address");
    for address in addresses {
        match tokio::time::timeout_at(deadline, TcpStream::connect(address)).await {
            Err(_) => {
                return Err(Answer {
                    status: 504,
                    reason: "connect timed out".to_owned(),
                })
            }
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(error)) => last = format!("{address}: {error}"),
        }
    }
    Err(Answer {
        status: 502,
        reason: format!("connect failed ({last})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::parse_head;

    #[test]
    fn each_answer_carries_its_status_line_and_reason() {
        for (status, line) in [
            (400, "HTTP/1.1 400 Bad Request\r\n"),
            (403, "HTTP/1.1 403 Forbidden\r\n"),
            (502, "HTTP/1.1 502 Bad Gateway\r\n"),
            (503, "HTTP/1.1 503 Service Unavailable\r\n"),
            (504, "HTTP/1.1 504 Gateway Timeout\r\n"),
            (500, "HTTP/1.1 500 Error\r\n"),
        ] {
            let bytes = Answer {
                status,
                reason: "why".to_owned(),
            }
            .bytes();
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.starts_with(line), "{text:?}");
            let end = head_len(text.as_bytes()).unwrap();
            assert_eq!(&text[end..], "maf-egress-proxy: why\n");
            assert!(text.contains(&format!("Content-Length: {}\r\n", text.len() - end)));
        }
    }

    fn policy() -> Policy {
        Policy {
            allow: Allowlist::new(["pypi.org", "*.pythonhosted.org"]).unwrap(),
            ports: DEFAULT_PORTS.into_iter().collect(),
            addresses: AddressPolicy::new(false, []),
            limits: Limits::default(),
            http: HttpRules::default(),
            terminator: None,
            hosts: Default::default(),
            observer: None,
        }
    }

    fn admit(request: &str) -> Result<Option<Body>, Refusal> {
        policy().admit(&parse_head(request.as_bytes()).unwrap())
    }

    #[test]
    fn admission_checks_host_port_and_framing() {
        assert_eq!(admit("CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"), Ok(None));
        assert_eq!(
            admit("CONNECT files.pythonhosted.org:443 HTTP/1.1\r\n\r\n"),
            Ok(None)
        );
        assert_eq!(
            admit("POST http://pypi.org/x HTTP/1.1\r\nContent-Length: 3\r\n\r\n"),
            Ok(Some(Body::Length(3)))
        );
        let refused = |request: &str| admit(request).unwrap_err();
        assert_eq!(
            refused("CONNECT pythonhosted.org:443 HTTP/1.1\r\n\r\n").reason,
            "host not on the allowlist"
        );
        assert_eq!(
            refused("CONNECT 151.101.0.223:443 HTTP/1.1\r\n\r\n").reason,
            "IP literal not on the allowlist"
        );
        assert_eq!(
            refused("CONNECT pypi.org:22 HTTP/1.1\r\n\r\n"),
            Refusal::new(403, "port 22 not allowed")
        );
        assert_eq!(
            refused("GET http://pypi.org/ HTTP/1.1\r\nUpgrade: websocket\r\n\r\n").status,
            403
        );
        assert_eq!(
            refused("GET http://pypi.org/ HTTP/1.1\r\nContent-Length: x\r\n\r\n").status,
            400
        );
    }

    #[tokio::test]
    async fn a_client_handed_in_is_judged_as_any() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let policy = policy();
        let client = async {
            ours.write_all(b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            ours.read_to_end(&mut answer).await.unwrap();
            String::from_utf8(answer).unwrap()
        };
        let ((), answer) = tokio::join!(serve_client(theirs, &policy), client);
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(answer.ends_with("host not on the allowlist\n"), "{answer}");
    }

    #[tokio::test]
    async fn a_mapped_name_resolves_to_its_addresses_which_are_checked_as_any() {
        let mut mapped = policy();
        mapped.addresses = AddressPolicy::new(true, []);
        mapped
            .hosts
            .insert("pypi.org".into(), vec!["10.9.8.7".parse().unwrap()]);
        mapped.hosts.insert(
            "files.pythonhosted.org".into(),
            vec!["127.0.0.1".parse().unwrap()],
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let authority = |name: &str| Authority {
            host: Host::Name(name.into()),
            port: 443,
        };
        assert_eq!(
            mapped
                .resolve(&authority("PyPI.org"), deadline)
                .await
                .unwrap(),
            vec!["10.9.8.7:443".parse().unwrap()]
        );
        let refused = mapped
            .resolve(&authority("files.pythonhosted.org"), deadline)
            .await
            .unwrap_err();
        assert_eq!(refused.status, 403, "{}", refused.reason);
        assert!(refused.reason.contains("127.0.0.1"), "{}", refused.reason);
    }

    #[test]
    fn decisions_are_one_json_line() {
        let line = Decision {
            allowed: false,
            method: Some("GET".into()),
            host: Some("evil.test\n{\"decision\":\"allow\"}".into()),
            port: Some(80),
            reason: "host not on the allowlist".into(),
            ..Decision::default()
        }
        .to_json_line();
        assert_eq!(line.lines().count(), 1);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["decision"], "deny");
        assert_eq!(value["port"], 80);
    }
}
