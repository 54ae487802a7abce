//! The forwarder role: a TCP listener (in the workload, `127.0.0.1:3128`) relaying each
//! connection byte for byte to a new connection on the proxy's Unix socket (spliced, never
//! copied through user space, on Linux: [`relay_sockets`]). It parses nothing and resolves no
//! names; every decision is the proxy's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Semaphore;

use crate::relay::relay_sockets;

/// Connections relayed at once; further ones wait in the listen backlog.
pub const MAX_FORWARDED: usize = 256;

/// How long one relay may stay silent both ways (the proxy's own idle deadline is shorter).
pub const FORWARD_IDLE: Duration = Duration::from_secs(600);

/// Relays every connection accepted on `listener` to the Unix socket `socket`.
///
/// # Errors
/// An accept error that is not about one connection.
pub async fn serve(listener: TcpListener, socket: PathBuf) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_FORWARDED));
    let socket = Arc::new(socket);
    loop {
        let permit = Arc::clone(&slots)
            .acquire_owned()
            .await
            .map_err(|_| std::io::Error::other("connection slots closed"))?;
        let (client, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                crate::accept::pass_or_fail(error).await?;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let socket = Arc::clone(&socket);
        tokio::spawn(async move {
            match UnixStream::connect(socket.as_path()).await {
                Ok(upstream) => {
                    let _ = relay_sockets(client, upstream, FORWARD_IDLE, None).await;
                }
                Err(error) => {
                    eprintln!(
                        "{}",
                        serde_json::json!({
                            "role": "forward",
                            "error": format!("connecting {}: {error}", socket.display()),
                        })
                    );
                }
            }
            drop(permit);
        });
    }
}
