//! The byte relay between two streams, with an idle deadline.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The relay's buffer per direction.
const BUFFER: usize = 64 * 1024;

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relayed {
    /// Bytes copied from the first stream to the second.
    pub forward: u64,
    /// Bytes copied from the second stream to the first.
    pub back: u64,
    /// Whether it ended because nothing moved for the idle deadline.
    pub idled_out: bool,
}

/// Copies `a` → `b` and `b` → `a` until both sides have ended, or nothing has moved for
/// `idle`. The end of one side's input is passed on as a write shutdown. With
/// `forward_limit`, at most that many bytes go from `a` to `b`; past it, `a` is no longer read
/// (a plain-HTTP request body), and `b`'s end alone ends the relay.
///
/// # Errors
/// An I/O error of either side other than the peer going away.
pub async fn relay<A, B>(
    a: A,
    b: B,
    idle: Duration,
    forward_limit: Option<u64>,
) -> io::Result<Relayed>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let mut a_buffer = vec![0u8; BUFFER];
    let mut b_buffer = vec![0u8; BUFFER];
    let mut remaining = forward_limit;
    let mut a_open = remaining != Some(0);
    let mut b_open = true;
    let mut done = Relayed {
        forward: 0,
        back: 0,
        idled_out: false,
    };
    enum Step {
        A(io::Result<usize>),
        B(io::Result<usize>),
    }
    while b_open {
        let a_want = match remaining {
            Some(left) => BUFFER.min(usize::try_from(left).unwrap_or(BUFFER)),
            None => BUFFER,
        };
        let step = tokio::time::timeout(idle, async {
            tokio::select! {
                read = a_read.read(&mut a_buffer[..a_want]), if a_open => Step::A(read),
                read = b_read.read(&mut b_buffer), if b_open => Step::B(read),
            }
        })
        .await;
        let Ok(step) = step else {
            done.idled_out = true;
            break;
        };
        match step {
            Step::A(read) => {
                let n = gone_is_end(read)?;
                if n == 0 {
                    a_open = false;
                    let _ = b_write.shutdown().await;
                    continue;
                }
                write_within(&mut b_write, &a_buffer[..n], idle, &mut done).await?;
                done.forward += n as u64;
                if let Some(left) = remaining.as_mut() {
                    *left -= n as u64;
                    if *left == 0 {
                        a_open = false;
                    }
                }
            }
            Step::B(read) => {
                let n = gone_is_end(read)?;
                if n == 0 {
                    b_open = false;
                    let _ = a_write.shutdown().await;
                    continue;
                }
                write_within(&mut a_write, &b_buffer[..n], idle, &mut done).await?;
                done.back += n as u64;
            }
        }
        if done.idled_out {
            break;
        }
    }
    let _ = a_write.shutdown().await;
    Ok(done)
}

/// A reset or broken pipe from the peer ends that direction like an orderly close.
fn gone_is_end(read: io::Result<usize>) -> io::Result<usize> {
    match read {
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ) =>
        {
            Ok(0)
        }
        other => other,
    }
}

async fn write_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    idle: Duration,
    done: &mut Relayed,
) -> io::Result<()> {
    match tokio::time::timeout(idle, writer.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => {
            done.idled_out = true;
            Ok(())
        }
    }
}
