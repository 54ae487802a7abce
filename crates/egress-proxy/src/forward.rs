//! The forwarder role: a TCP listener (in the workload, `127.0.0.1:3128`) that hands each
//! accepted connection to the proxy ([`crate::handoff`]: the proxy then serves the client
//! directly) or, without a handoff socket or when the handoff fails, relays it byte for byte to a
//! new connection on the proxy's Unix socket (spliced, never copied through user space, on
//! Linux: [`relay_sockets`]). It parses nothing and resolves no names; every decision is the
//! proxy's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Semaphore;

use crate::handoff;
use crate::relay::relay_sockets;

/// Connections relayed at once; further ones wait in the listen backlog.
pub const MAX_FORWARDED: usize = 256;

/// How long one relay may stay silent both ways (the proxy's own idle deadline is shorter).
pub const FORWARD_IDLE: Duration = Duration::from_secs(600);

/// How long connecting to the handoff socket, or passing one connection on it, may take before
/// the forwarder relays that connection instead.
pub const HANDOFF_DEADLINE: Duration = Duration::from_secs(2);

/// Where the forwarder sends what it accepts.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The proxy's Unix socket, for relayed connections.
    pub socket: PathBuf,
    /// The proxy's handoff socket, tried first for each connection when given.
    pub handoff: Option<PathBuf>,
}

/// Hands off or relays every connection accepted on `listener` (the module's documentation
/// says which).
///
/// # Errors
/// An accept error that is not about one connection.
pub async fn serve(listener: TcpListener, upstream: Upstream) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_FORWARDED));
    let socket = Arc::new(upstream.socket);
    let mut handoff = upstream.handoff.map(Handoff::new);
    loop {
        let (client, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                crate::accept::pass_or_fail(error).await?;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        if let Some(handoff) = handoff.as_mut() {
            if handoff.pass(&client).await.is_ok() {
                continue;
            }
        }
        let permit = Arc::clone(&slots)
            .acquire_owned()
            .await
            .map_err(|_| std::io::Error::other("connection slots closed"))?;
        let socket = Arc::clone(&socket);
        tokio::spawn(async move {
            relay(client, &socket).await;
            drop(permit);
        });
    }
}

/// Relays `client` to a new connection on the proxy's socket.
async fn relay(client: TcpStream, socket: &std::path::Path) {
    match UnixStream::connect(socket).await {
        Ok(upstream) => {
            let _ = relay_sockets(client, upstream, FORWARD_IDLE, None).await;
        }
        Err(error) => report(&format!("connecting {}: {error}", socket.display())),
    }
}

fn report(error: &str) {
    eprintln!(
        "{}",
        serde_json::json!({
            "role": "forward",
            "error": error,
        })
    );
}

/// The standing connection to the proxy's handoff socket, made when first needed and again
/// after it breaks.
struct Handoff {
    path: PathBuf,
    connection: Option<UnixStream>,
}

impl Handoff {
    fn new(path: PathBuf) -> Handoff {
        Handoff {
            path,
            connection: None,
        }
    }

    /// Passes `client` to the proxy, connecting again once if the standing connection has
    /// broken (a proxy restarted), each step within [`HANDOFF_DEADLINE`].
    async fn pass(&mut self, client: &TcpStream) -> std::io::Result<()> {
        let had_connection = self.connection.is_some();
        let mut passed = self.pass_once(client).await;
        if passed.is_err() && had_connection {
            passed = self.pass_once(client).await;
        }
        if let Err(error) = &passed {
            report(&format!(
                "handing off on {} (relaying instead): {error}",
                self.path.display()
            ));
        }
        passed
    }

    /// One pass on the standing connection, or on a new one when there is none; the connection
    /// is kept only when the pass went.
    async fn pass_once(&mut self, client: &TcpStream) -> std::io::Result<()> {
        let connection = match self.connection.take() {
            Some(connection) => connection,
            None => within(HANDOFF_DEADLINE, UnixStream::connect(&self.path)).await?,
        };
        within(HANDOFF_DEADLINE, handoff::pass(&connection, client)).await?;
        self.connection = Some(connection);
        Ok(())
    }
}

/// `step`, or `TimedOut` once `deadline` has passed.
async fn within<T>(
    deadline: Duration,
    step: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(deadline, step)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}
