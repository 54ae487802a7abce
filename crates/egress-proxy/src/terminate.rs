//! One terminated tunnel: the proxy answers the CONNECT, completes TLS with the client under a
//! leaf for the tunnel's host ([`crate::tls`]), reads one request, judges it by the host's rules
//! and grants ([`crate::rules`]), and only then dials the upstream over TLS (verified for the
//! tunnel's host) and exchanges that one request and its response.
//!
//! Refusals are answered inside the client's TLS session: a 403 (or 400, 502, 504) with a
//! one-line reason, never bytes of the upstream's. When a credential was added, the response is
//! scanned on its way back: a response that carries the token is cut before any byte of the
//! token reaches the client (a response that encodes it otherwise is not caught).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::time::Instant;

use crate::head::Authority;
use crate::proxy::{answer_and_close, connect, read_head, Answer, Decision, Policy};
use crate::rules::{Terminated, Token};
use crate::tls::Terminator;

/// A stream that first yields bytes already read from it (a client's eager TLS hello sent with
/// its CONNECT head).
struct Rewind<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A tunnel the proxy terminates: admitted, its addresses checked.
pub(crate) struct Tunnel<'a> {
    /// What the CONNECT asked for.
    pub(crate) authority: &'a Authority,
    /// The authority's host name.
    pub(crate) host: &'a str,
    /// The checked addresses to dial.
    pub(crate) addresses: &'a [SocketAddr],
    pub(crate) policy: &'a Policy,
    pub(crate) terminator: &'a Terminator,
}

/// Serves `tunnel` to `client`, whose `early` bytes came with the CONNECT head. Logs its own
/// decision.
pub(crate) async fn serve<S>(
    client: S,
    early: Vec<u8>,
    tunnel: &Tunnel<'_>,
    decision: &mut Decision,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Tunnel {
        host,
        policy,
        terminator,
        ..
    } = *tunnel;
    let started = Instant::now();
    let mut client = Rewind {
        prefix: early,
        at: 0,
        inner: client,
    };
    let deny = |decision: &mut Decision, reason: String| {
        decision.allowed = false;
        decision.reason = reason;
        policy.record(decision);
    };
    let config = match terminator.server_config(host) {
        Ok(config) => config,
        Err(error) => {
            answer_and_close(
                &mut client,
                &Answer::status(502, "no certificate for the host"),
            )
            .await;
            return deny(decision, format!("minting a leaf failed: {error}"));
        }
    };
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    if client.write_all(established).await.is_err() {
        return deny(decision, "client went away before TLS".to_owned());
    }
    let head_deadline = started + policy.limits.head_timeout;
    let accepted = tokio::time::timeout_at(
        head_deadline,
        tokio_rustls::TlsAcceptor::from(config).accept(client),
    )
    .await;
    let mut client = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            return deny(
                decision,
                format!("TLS with the client failed (does it trust the proxy's CA?): {error}"),
            )
        }
        Err(_) => return deny(decision, "TLS with the client timed out".to_owned()),
    };
    match exchange(&mut client, tunnel, decision).await {
        Ok(()) => {}
        Err(answer) => {
            decision.allowed = false;
            decision.reason = answer.reason.clone();
            policy.record(decision);
            answer_and_close(&mut client, &answer).await;
            return;
        }
    }
    decision.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    policy.record(decision);
}

/// Reads, judges and forwards the one request of a terminated tunnel and relays its response;
/// an `Err` is answered to the client by the caller. A decision that went past the judgement is
/// logged by the caller from `decision`.
async fn exchange<C>(
    client: &mut C,
    tunnel: &Tunnel<'_>,
    decision: &mut Decision,
) -> Result<(), Answer>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Tunnel {
        authority,
        host,
        addresses,
        policy,
        terminator,
    } = *tunnel;
    let (head_bytes, rest) = read_head(client, Instant::now() + policy.limits.head_timeout).await?;
    let judged = policy
        .http
        .judge_terminated(&head_bytes, authority, SystemTime::now())
        .map_err(|refusal| {
            decision.method = refusal.method;
            // A refusal's decision names the path it judged, where it could be normalised.
            decision.path = refusal.path;
            Answer::status(refusal.status, refusal.reason)
        })?;
    let Terminated {
        body,
        verdict,
        upstream: mut first,
        head,
    } = judged;
    decision.method = Some(head.method);
    decision.path = verdict.path.clone();
    decision.rule = verdict.rule.map(str::to_owned);

    let deadline = Instant::now() + policy.limits.connect_timeout;
    let tcp = connect(addresses, deadline).await?;
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| Answer::status(502, "the host is not a TLS server name"))?;
    let connector = tokio_rustls::TlsConnector::from(terminator.client_config());
    let mut upstream = match tokio::time::timeout_at(deadline, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            return Err(Answer::status(
                502,
                format!("TLS with the upstream failed: {error}"),
            ))
        }
        Err(_) => return Err(Answer::status(504, "TLS with the upstream timed out")),
    };

    let early = body.arrived(&rest);
    first.extend_from_slice(early);
    decision.allowed = true;
    decision.reason = "terminated".to_owned();
    // Set only now that the head is going upstream: a refusal or a failed upstream connection
    // before this point sent no token, and its decision must not say it did.
    decision.credential = verdict.credential.is_some();
    let idle = policy.limits.idle_timeout;
    if !matches!(
        tokio::time::timeout(idle, upstream.write_all(&first)).await,
        Ok(Ok(()))
    ) {
        return Ok(());
    }
    let (up, down, echoed) = pump_both(
        client,
        &mut upstream,
        body.len() - early.len() as u64,
        verdict.credential,
        idle,
    )
    .await;
    decision.bytes_up = Some(early.len() as u64 + up);
    decision.bytes_down = Some(down);
    if echoed {
        decision.allowed = false;
        decision.reason = "the upstream's response carried the credential: cut".to_owned();
    }
    Ok(())
}

/// Copies at most `body` bytes client → upstream while copying the response upstream →
/// client, until the response ends or one read or write waits longer than `idle`. With a credential, the
/// response is scanned for its token and cut before the token would be written. Returns the
/// bytes each way and whether the token was found.
async fn pump_both<C, U>(
    client: &mut C,
    upstream: &mut U,
    body: u64,
    credential: Option<&Token>,
    idle: std::time::Duration,
) -> (u64, u64, bool)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let sent = std::sync::atomic::AtomicU64::new(0);
    let forward = async {
        let mut left = body;
        let mut buffer = vec![0u8; 16 * 1024];
        while left > 0 {
            let want = usize::try_from(left.min(buffer.len() as u64)).unwrap_or(buffer.len());
            let n = match tokio::time::timeout(idle, client_read.read(&mut buffer[..want])).await {
                Ok(Ok(n)) if n > 0 => n,
                _ => break,
            };
            let written = tokio::time::timeout(idle, upstream_write.write_all(&buffer[..n])).await;
            if !matches!(written, Ok(Ok(()))) {
                break;
            }
            left -= n as u64;
            sent.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = upstream_write.flush().await;
    };
    let back = async {
        let needle = credential.map(Token::as_bytes).unwrap_or_default();
        let finder = memchr::memmem::Finder::new(needle);
        // The tail of what was read that could still begin the token: held back until more
        // arrives, so no prefix of the token is ever written.
        let hold = needle.len().saturating_sub(1);
        let mut pending: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            let n = match tokio::time::timeout(idle, upstream_read.read(&mut buffer)).await {
                Ok(Ok(n)) if n > 0 => n,
                _ => break,
            };
            pending.extend_from_slice(&buffer[..n]);
            if !needle.is_empty() && finder.find(&pending).is_some() {
                return (written, true);
            }
            let ready = pending.len().saturating_sub(hold);
            let sent = tokio::time::timeout(idle, client_write.write_all(&pending[..ready])).await;
            if !matches!(sent, Ok(Ok(()))) {
                return (written, false);
            }
            written += ready as u64;
            pending.drain(..ready);
        }
        if matches!(
            tokio::time::timeout(idle, client_write.write_all(&pending)).await,
            Ok(Ok(()))
        ) {
            written += pending.len() as u64;
        }
        let _ = client_write.shutdown().await;
        (written, false)
    };
    tokio::pin!(forward, back);
    let mut forward_done = false;
    loop {
        tokio::select! {
            () = &mut forward, if !forward_done => forward_done = true,
            (down, echoed) = &mut back => return (sent.load(std::sync::atomic::Ordering::Relaxed), down, echoed),
        }
    }
}
