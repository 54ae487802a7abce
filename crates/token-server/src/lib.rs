//! A host-side HTTP server that answers every request with one token, and the host's own fetch of
//! it: the two halves of a by-content network probe.
//!
//! A probe that asks "can the guest reach the host?" by an exit code proves little (a proxy, a
//! captive answer or a refused connection read alike). Serving a fresh token and looking for it in
//! the guest's output proves it by content; the host's own fetch first shows the server is
//! reachable at all, so the guest's silence means something. The Docker backend's egress preflight
//! and the conformance HARDENING suite both run this probe, so the server exists once, here.
//!
//! It is a leaf (it depends on nothing of ours) because its two users may share nothing else:
//! the conformance suites depend on the core alone, and the core does no I/O
//! (docs/architecture.md#layering-rules).
//!
//! Scope: one listener on one address the caller names, never a wildcard; each connection's
//! request head read with a size bound and a deadline, then the token, then close. Not here:
//! choosing the address (an engine's bridge gateway, loopback in tests) or the token's randomness.
//!
//! ```
//! use std::time::Duration;
//! use token_server::{fetch, TokenServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), token_server::Error> {
//! let server = TokenServer::start("127.0.0.1".parse().unwrap(), "t0k3n").await?;
//! let response = fetch(server.address(), Duration::from_secs(5)).await?;
//! assert!(response.ends_with(b"\r\n\r\nt0k3n"));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The most of a request head the server reads before it answers anyway.
const REQUEST_HEAD_LIMIT: usize = 8192;

/// How long the server waits for a request head before it answers anyway: a client that never
/// sends one holds a task no longer than this.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong serving or fetching the token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address is a wildcard: the server would answer on every interface.
    #[error("the token server never binds a wildcard address ({0})")]
    Wildcard(IpAddr),
    /// The listener could not be bound.
    #[error("could not serve the token on {ip}: {source}")]
    Bind {
        /// The address asked for.
        ip: IpAddr,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The host's own fetch failed.
    #[error("the host's own fetch of {address} failed: {source}")]
    Fetch {
        /// The server's address.
        address: SocketAddr,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The host's own fetch did not finish in time.
    #[error("the host's own fetch of {address} took longer than {bound:?}")]
    FetchTimeout {
        /// The server's address.
        address: SocketAddr,
        /// The bound it passed.
        bound: Duration,
    },
}

/// Serves one token over plain HTTP on one address until dropped.
#[derive(Debug)]
pub struct TokenServer {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TokenServer {
    /// Binds an ephemeral port on `ip` and answers every request with `token`.
    ///
    /// # Errors
    ///
    /// [`Error::Wildcard`] for `0.0.0.0` or `::`, [`Error::Bind`] when the address cannot be
    /// bound.
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future before it resolves binds nothing that outlives it. Dropping the server
    /// stops accepting at once; a connection being answered finishes within its read deadline.
    pub async fn start(ip: IpAddr, token: impl Into<String>) -> Result<TokenServer, Error> {
        if ip.is_unspecified() {
            return Err(Error::Wildcard(ip));
        }
        let bind = |source| Error::Bind { ip, source };
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(bind)?;
        let address = listener.local_addr().map_err(bind)?;
        let response = response(&token.into());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, response.clone()));
            }
        });
        Ok(TokenServer { address, task })
    }

    /// The address it answers on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://<address>/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.address)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn response(token: &str) -> String {
    format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{token}",
        token.len()
    )
}

/// Reads the request head (bounded in size and time), then answers whatever it asked.
async fn answer(mut stream: TcpStream, response: String) {
    let read_head = async {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while head.len() < REQUEST_HEAD_LIMIT && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(REQUEST_READ_TIMEOUT, read_head).await;
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The host's own `GET /` of a token server: the whole response (status line, headers, body).
///
/// # Errors
///
/// [`Error::Fetch`] when the connection or a read fails, [`Error::FetchTimeout`] past `bound`.
///
/// # Cancel safety and drop
///
/// Dropping the future closes the connection; nothing else is left.
pub async fn fetch(address: SocketAddr, bound: Duration) -> Result<Vec<u8>, Error> {
    let exchange = async {
        let mut stream = TcpStream::connect(address).await?;
        stream
            .write_all(format!("GET / HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await?;
        Ok(body)
    };
    match tokio::time::timeout(bound, exchange).await {
        Ok(result) => result.map_err(|source| Error::Fetch { address, source }),
        Err(_) => Err(Error::FetchTimeout { address, bound }),
    }
}

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_its_token_on_its_address_only() {
        let server = TokenServer::start("127.0.0.1".parse().unwrap(), "abc123")
            .await
            .unwrap();
        assert!(server.address().ip().is_loopback());
        assert_eq!(server.url(), format!("http://{}/", server.address()));
        let body = fetch(server.address(), Duration::from_secs(5))
            .await
            .unwrap();
        assert!(body.starts_with(b"HTTP/1.0 200 OK\r\n"));
        assert!(body.ends_with(b"\r\n\r\nabc123"));
        for wildcard in ["0.0.0.0", "::"] {
            assert!(matches!(
                TokenServer::start(wildcard.parse().unwrap(), "abc123").await,
                Err(Error::Wildcard(_))
            ));
        }
    }

    #[tokio::test]
    async fn a_silent_client_is_answered_after_the_read_deadline() {
        let server = TokenServer::start("127.0.0.1".parse().unwrap(), "abc123")
            .await
            .unwrap();
        let mut silent = TcpStream::connect(server.address()).await.unwrap();
        let mut body = Vec::new();
        let read =
            tokio::time::timeout(REQUEST_READ_TIMEOUT * 2, silent.read_to_end(&mut body)).await;
        assert!(
            read.is_ok(),
            "the server held a silent client past its deadline"
        );
        assert!(body.ends_with(b"abc123"));
    }

    #[tokio::test]
    async fn a_dropped_server_answers_nobody() {
        let server = TokenServer::start("127.0.0.1".parse().unwrap(), "abc123")
            .await
            .unwrap();
        let address = server.address();
        drop(server);
        tokio::task::yield_now().await;
        assert!(fetch(address, Duration::from_secs(5)).await.is_err());
    }
}
