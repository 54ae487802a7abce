//! The `serve` role: a tiny HTTP/1.1 server answering every request 200 with a fixed body,
//! for offline tests and benchmarks. One request per connection; the request head is read
//! (bounded) and its body ignored.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::head::{head_len, MAX_HEAD_LEN};

/// What the server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// This text.
    Text(String),
    /// This many bytes of filler (`x`).
    Filler(u64),
}

impl Reply {
    fn len(&self) -> u64 {
        match self {
            Reply::Text(text) => text.len() as u64,
            Reply::Filler(n) => *n,
        }
    }
}

const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_IDLE: Duration = Duration::from_secs(60);

/// Answers every connection accepted on `listener`.
///
/// # Errors
/// An accept error that is not about one connection or a descriptor shortage (the rule of every
/// accept loop here).
pub async fn serve(listener: TcpListener, reply: Reply) -> std::io::Result<()> {
    let reply = Arc::new(reply);
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                crate::accept::pass_or_fail(error).await?;
                continue;
            }
        };
        let reply = Arc::clone(&reply);
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            let got_head = tokio::time::timeout(HEAD_TIMEOUT, async {
                loop {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                    if head_len(&buffer).is_some() {
                        return true;
                    }
                    if buffer.len() > MAX_HEAD_LEN {
                        return false;
                    }
                }
            })
            .await;
            if got_head != Ok(true) {
                return;
            }
            let _ = answer(&mut stream, &reply).await;
        });
    }
}

async fn answer(stream: &mut tokio::net::TcpStream, reply: &Reply) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    timed(stream.write_all(head.as_bytes())).await?;
    match reply {
        Reply::Text(text) => timed(stream.write_all(text.as_bytes())).await?,
        Reply::Filler(size) => {
            let block = vec![b'x'; 64 * 1024];
            let mut left = *size;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                timed(stream.write_all(&block[..n])).await?;
                left -= n as u64;
            }
        }
    }
    timed(stream.shutdown()).await
}

async fn timed<F: std::future::Future<Output = std::io::Result<()>>>(io: F) -> std::io::Result<()> {
    tokio::time::timeout(WRITE_IDLE, io)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut)))
}
