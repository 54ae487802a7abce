//! The byte relay between two streams, with an idle deadline.
//!
//! Two ways to move the bytes, under the same bounds (at most `forward_limit` bytes forward, the
//! idle deadline over both directions together, an input's end passed on as a write shutdown,
//! dropping the relay closing both streams):
//!
//! - Between two sockets on Linux ([`relay_sockets`]), each direction moves its bytes with
//!   `splice(2)`: from the reading socket into a pipe of its own, then from the pipe into the
//!   writing socket, so the bytes never enter user space (no copy through a buffer, two system
//!   calls per pipe-full). The pipe is made when the direction's first bytes are ready (an idle
//!   direction holds no descriptors), is only filled when empty (so a splice into it that
//!   would block means the socket has nothing, never that the pipe is full), and closes with
//!   the relay. Where a pipe cannot be made (out of descriptors) or the kernel refuses to
//!   splice from the socket, that direction copies through a buffer instead.
//! - Between any two streams ([`relay`], and [`relay_sockets`] off Linux), each direction is a
//!   pump that writes a chunk while the next one is read, so a download costs the slower of
//!   reading and writing rather than their sum.
//!
//! Both run their two directions at once: one direction waiting on a slow peer never holds up
//! the other.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::time::Instant;

#[cfg(target_os = "linux")]
mod splice;

/// The relay's buffer; each direction holds two (one being written while the other fills).
const BUFFER: usize = 64 * 1024;

/// How long, and how many bytes, the client's input past a forward limit is read and dropped
/// after the relay's write shutdown (a lingering close). Closing a socket with bytes unread
/// resets the connection, and a reset can discard the answer the client has not read yet; a
/// client that closes once it has its answer ends the wait at once.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// Whether the relay stopped reading the client at its forward limit (bytes may be unread).
fn cut_at_limit(progress: &Progress, forward_limit: Option<u64>) -> bool {
    forward_limit.is_some_and(|limit| progress.forward.load(Ordering::Relaxed) >= limit)
}

/// Reads and drops what `read` still sends, until it ends, fails, passes [`LINGER_BYTES`] or
/// [`LINGER`] passes.
async fn linger<R: AsyncRead + Unpin>(read: &mut R) {
    let drain = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut dropped = 0;
        while dropped < LINGER_BYTES {
            match read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => dropped += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

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

/// What both pumps share: the byte counts and when a byte last moved.
struct Progress {
    started: Instant,
    /// Nanoseconds after `started` of the last completed read or write, either direction.
    last_moved: AtomicU64,
    forward: AtomicU64,
    back: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            last_moved: AtomicU64::new(0),
            forward: AtomicU64::new(0),
            back: AtomicU64::new(0),
        }
    }

    fn moved(&self) {
        let nanos = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_moved.fetch_max(nanos, Ordering::Relaxed);
    }

    /// When the idle deadline passes unless something moves first.
    fn idle_deadline(&self, idle: Duration) -> Instant {
        self.started + Duration::from_nanos(self.last_moved.load(Ordering::Relaxed)) + idle
    }

    fn relayed(&self, idled_out: bool) -> Relayed {
        Relayed {
            forward: self.forward.load(Ordering::Relaxed),
            back: self.back.load(Ordering::Relaxed),
            idled_out,
        }
    }
}

/// Copies `a` → `b` and `b` → `a` until `b`'s side has ended, or nothing has moved for `idle`.
/// The end of `a`'s input is passed on as a write shutdown of `b` (and `b`'s as one of `a`).
/// With `forward_limit`, at most that many bytes go from `a` to `b`; past it, `a` is no longer
/// read (a plain-HTTP request body). The relay ends when `b`'s input ends and everything read
/// from it is written to `a`; after a limit, once `a`'s write side is shut, `a`'s further input
/// is read and dropped for at most 2 s and 1 MiB, so the close does not reset the connection
/// under an answer `a` has not read yet.
///
/// Each direction copies through two buffers of 64 KiB, writing one while the other fills;
/// [`relay_sockets`] relays two sockets without the copy.
///
/// # Errors
/// An I/O error of either side other than the peer going away.
///
/// # Cancel safety and drop
/// Dropping the future drops both streams' halves; bytes read and not yet written are lost.
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
    let progress = Progress::new();
    let idled_out = drive(
        pump(
            &mut a_read,
            &mut b_write,
            forward_limit,
            &progress,
            &progress.forward,
        ),
        pump(&mut b_read, &mut a_write, None, &progress, &progress.back),
        &progress,
        idle,
    )
    .await?;
    let _ = a_write.shutdown().await;
    if cut_at_limit(&progress, forward_limit) {
        linger(&mut a_read).await;
    }
    Ok(progress.relayed(idled_out))
}

/// [`relay`] between two sockets, under the same bounds and with the same ends; on Linux each
/// direction moves its bytes with `splice(2)` through a pipe of its own, never through user
/// space (the module's documentation says how).
///
/// # Errors
/// An I/O error of either side other than the peer going away.
///
/// # Cancel safety and drop
/// Dropping the future drops both sockets and both pipes; bytes read and not yet written are
/// lost.
pub async fn relay_sockets<A: Socket, B: Socket>(
    a: A,
    b: B,
    idle: Duration,
    forward_limit: Option<u64>,
) -> io::Result<Relayed> {
    #[cfg(target_os = "linux")]
    {
        splice::relay(a, b, idle, forward_limit, splice::Mode::Splice).await
    }
    #[cfg(not(target_os = "linux"))]
    {
        relay(a, b, idle, forward_limit).await
    }
}

/// A stream socket that [`relay_sockets`] relays: tokio's TCP and Unix stream sockets, and
/// mutable references to them. Sealed.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + sealed::Ops {}

impl Socket for tokio::net::TcpStream {}
impl Socket for tokio::net::UnixStream {}
impl<T: Socket + ?Sized> Socket for &mut T {}

/// What the splicing relay needs of a socket beyond reading and writing: its descriptor and
/// tokio's readiness, so that both directions use one socket at once through `&self`.
mod sealed {
    #[cfg(target_os = "linux")]
    use std::future::Future;
    #[cfg(target_os = "linux")]
    use std::io;
    #[cfg(target_os = "linux")]
    use std::os::fd::BorrowedFd;

    #[cfg(target_os = "linux")]
    use tokio::io::{Interest, Ready};

    /// A socket's descriptor and readiness.
    pub trait Ops {
        /// The socket's descriptor.
        #[cfg(target_os = "linux")]
        fn fd(&self) -> BorrowedFd<'_>;
        /// Waits until the socket may be ready for `interest`.
        #[cfg(target_os = "linux")]
        fn ready(&self, interest: Interest) -> impl Future<Output = io::Result<Ready>> + Send;
        /// Runs `io` on the socket, clearing its readiness for `interest` when `io` would block.
        #[cfg(target_os = "linux")]
        fn try_io<R>(
            &self,
            interest: Interest,
            io: impl FnOnce() -> io::Result<R>,
        ) -> io::Result<R>;
        /// One non-blocking read.
        #[cfg(target_os = "linux")]
        fn try_read(&self, buffer: &mut [u8]) -> io::Result<usize>;
        /// One non-blocking write.
        #[cfg(target_os = "linux")]
        fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    }

    macro_rules! socket_ops {
        ($($socket:ty),*) => {$(
            impl Ops for $socket {
                #[cfg(target_os = "linux")]
                fn fd(&self) -> BorrowedFd<'_> {
                    std::os::fd::AsFd::as_fd(self)
                }
                #[cfg(target_os = "linux")]
                fn ready(
                    &self,
                    interest: Interest,
                ) -> impl Future<Output = io::Result<Ready>> + Send {
                    <$socket>::ready(self, interest)
                }
                #[cfg(target_os = "linux")]
                fn try_io<R>(
                    &self,
                    interest: Interest,
                    io: impl FnOnce() -> io::Result<R>,
                ) -> io::Result<R> {
                    <$socket>::try_io(self, interest, io)
                }
                #[cfg(target_os = "linux")]
                fn try_read(&self, buffer: &mut [u8]) -> io::Result<usize> {
                    <$socket>::try_read(self, buffer)
                }
                #[cfg(target_os = "linux")]
                fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
                    <$socket>::try_write(self, bytes)
                }
            }
        )*};
    }
    socket_ops!(tokio::net::TcpStream, tokio::net::UnixStream);

    impl<T: Ops + ?Sized> Ops for &mut T {
        #[cfg(target_os = "linux")]
        fn fd(&self) -> BorrowedFd<'_> {
            (**self).fd()
        }
        #[cfg(target_os = "linux")]
        fn ready(&self, interest: Interest) -> impl Future<Output = io::Result<Ready>> + Send {
            (**self).ready(interest)
        }
        #[cfg(target_os = "linux")]
        fn try_io<R>(
            &self,
            interest: Interest,
            io: impl FnOnce() -> io::Result<R>,
        ) -> io::Result<R> {
            (**self).try_io(interest, io)
        }
        #[cfg(target_os = "linux")]
        fn try_read(&self, buffer: &mut [u8]) -> io::Result<usize> {
            (**self).try_read(buffer)
        }
        #[cfg(target_os = "linux")]
        fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
            (**self).try_write(bytes)
        }
    }
}

/// Runs the two directions until `back` ends, either fails, or nothing has moved for `idle`;
/// whether it idled out. `forward` ending leaves `back` running.
async fn drive<F, K>(forward: F, back: K, progress: &Progress, idle: Duration) -> io::Result<bool>
where
    F: Future<Output = io::Result<()>>,
    K: Future<Output = io::Result<()>>,
{
    let mut forward = pin!(forward);
    let mut back = pin!(back);
    let mut forward_done = false;
    loop {
        let deadline = progress.idle_deadline(idle);
        tokio::select! {
            ended = &mut back => {
                ended?;
                return Ok(false);
            }
            ended = &mut forward, if !forward_done => {
                ended?;
                forward_done = true;
            }
            () = tokio::time::sleep_until(deadline) => {
                if progress.idle_deadline(idle) <= Instant::now() {
                    return Ok(true);
                }
            }
        }
    }
}

/// Copies `reader` to `writer` until the reader ends (then shuts the writer down) or `limit`
/// bytes have gone (then stops reading, leaving the writer open), writing each chunk while the
/// next one is read.
async fn pump<R, W>(
    reader: &mut R,
    writer: &mut W,
    limit: Option<u64>,
    progress: &Progress,
    count: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut remaining = limit;
    let mut pending = vec![0u8; BUFFER];
    let mut next = vec![0u8; BUFFER];
    let want = |remaining: Option<u64>| match remaining {
        Some(left) => BUFFER.min(usize::try_from(left).unwrap_or(BUFFER)),
        None => BUFFER,
    };
    // The chunk waiting to be written: `pending[..held]`.
    let mut held = 0;
    let mut reading = remaining != Some(0);
    let mut ended = false;
    loop {
        let read_len = if reading { want(remaining) } else { 0 };
        // Either side's error ends the pump at once, without waiting for the other.
        let n = if held == 0 {
            if !reading {
                break;
            }
            gone_is_end(reader.read(&mut next[..read_len]).await)?
        } else if reading {
            tokio::try_join!(
                write_chunk(writer, &pending[..held], progress, count),
                async { gone_is_end(reader.read(&mut next[..read_len]).await) }
            )?
            .1
        } else {
            write_chunk(writer, &pending[..held], progress, count).await?;
            0
        };
        held = 0;
        if reading {
            if n == 0 {
                reading = false;
                ended = true;
            } else {
                progress.moved();
                std::mem::swap(&mut pending, &mut next);
                held = n;
                if let Some(left) = remaining.as_mut() {
                    *left -= n as u64;
                    if *left == 0 {
                        reading = false;
                    }
                }
            }
        }
    }
    if ended {
        let _ = writer.shutdown().await;
    }
    Ok(())
}

/// Writes one chunk whole, then counts it and notes the movement.
async fn write_chunk<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    progress: &Progress,
    count: &AtomicU64,
) -> io::Result<()> {
    writer.write_all(bytes).await?;
    count.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    progress.moved();
    Ok(())
}

/// Whether a non-blocking call that failed with `error` moved nothing and may be made again once
/// its descriptor is ready (it would have blocked, or a signal interrupted it).
pub(crate) fn try_again(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
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

#[cfg(test)]
mod tests {
    use tokio::io::{duplex, AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A body of `len` bytes that is not one repeated byte, so a reordered chunk shows.
    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn both_directions_arrive_whole_and_in_order() {
        let (a, mut a_peer) = duplex(4096);
        let (b, mut b_peer) = duplex(4096);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(10), None));
        let up = body(300_000);
        let down = body(1 << 20);
        let (up_sent, down_sent) = (up.clone(), down.clone());
        let client = tokio::spawn(async move {
            let (mut read, mut write) = tokio::io::split(&mut a_peer);
            let writer = async move {
                write.write_all(&up_sent).await.unwrap();
                write.shutdown().await.unwrap();
            };
            let reader = async move {
                let mut got = Vec::new();
                read.read_to_end(&mut got).await.unwrap();
                got
            };
            tokio::join!(writer, reader).1
        });
        let mut got_up = vec![0u8; up.len()];
        let server = async {
            let (mut read, mut write) = tokio::io::split(&mut b_peer);
            let writer = async move {
                write.write_all(&down_sent).await.unwrap();
                write.shutdown().await.unwrap();
            };
            let reader = async {
                read.read_exact(&mut got_up).await.unwrap();
                // The forward end was passed on as a shutdown.
                assert_eq!(read.read(&mut [0u8; 1]).await.unwrap(), 0);
            };
            tokio::join!(writer, reader);
        };
        server.await;
        let got_down = client.await.unwrap();
        assert!(got_up == up, "the forward bytes arrive in order");
        assert!(got_down == down, "the backward bytes arrive in order");
        let done = relay.await.unwrap().unwrap();
        assert_eq!(
            done,
            Relayed {
                forward: up.len() as u64,
                back: down.len() as u64,
                idled_out: false
            }
        );
    }

    /// The lingering close after a forward limit ends at its byte bound: a client that sent
    /// exactly `LINGER_BYTES` past the limit and keeps its connection open is closed as soon as
    /// they are dropped, not after waiting out `LINGER` for more (paused time: a wait for the
    /// timer would show as `LINGER` passed).
    #[tokio::test(start_paused = true)]
    async fn the_lingering_close_ends_at_its_byte_bound() {
        let (a, a_peer) = duplex(1 << 16);
        let (b, mut b_peer) = duplex(1 << 16);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(600), Some(10)));
        let (mut a_read, mut a_write) = tokio::io::split(a_peer);
        let client = tokio::spawn(async move {
            a_write.write_all(&body(10 + LINGER_BYTES)).await.unwrap();
            // Kept open: only the byte bound can end the linger before its deadline.
            a_write
        });
        let mut got = [0u8; 10];
        b_peer.read_exact(&mut got).await.unwrap();
        b_peer.shutdown().await.unwrap();
        let closed = Instant::now();
        let done = relay.await.unwrap().unwrap();
        assert!(
            closed.elapsed() < LINGER,
            "the linger waited {:?} with its bytes all dropped",
            closed.elapsed()
        );
        assert_eq!((done.forward, done.back), (10, 0));
        let _still_open = client.await.unwrap();
        let mut rest = Vec::new();
        a_read.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the client reads its end");
    }

    #[tokio::test]
    async fn the_forward_limit_stops_reading_without_ending_the_other_side() {
        let (a, mut a_peer) = duplex(1 << 16);
        let (b, mut b_peer) = duplex(1 << 16);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(10), Some(10)));
        a_peer.write_all(b"0123456789 and more").await.unwrap();
        let mut got = [0u8; 10];
        b_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"0123456789");
        // Nothing past the limit, and the upstream's write side is not shut down.
        let mut past = [0u8; 8];
        let more = tokio::time::timeout(Duration::from_millis(200), b_peer.read(&mut past));
        assert!(more.await.is_err(), "nothing past the limit arrives");
        b_peer.write_all(b"answer").await.unwrap();
        b_peer.shutdown().await.unwrap();
        let mut answer = Vec::new();
        a_peer.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
        let done = relay.await.unwrap().unwrap();
        assert_eq!((done.forward, done.back, done.idled_out), (10, 6, false));
    }

    #[tokio::test]
    async fn nothing_moving_ends_the_relay_at_the_idle_deadline() {
        let idle = Duration::from_millis(400);
        let (a, mut a_peer) = duplex(1 << 16);
        let (b, mut b_peer) = duplex(1 << 16);
        let relay = tokio::spawn(relay(a, b, idle, None));
        a_peer.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        b_peer.read_exact(&mut got).await.unwrap();
        tokio::time::sleep(idle * 3 / 4).await;
        // Movement pushes the deadline back: the relay outlives the first deadline.
        let moved = Instant::now();
        b_peer.write_all(b"pong").await.unwrap();
        a_peer.read_exact(&mut got).await.unwrap();
        let done = relay.await.unwrap().unwrap();
        let after_move = moved.elapsed();
        assert!(done.idled_out);
        assert_eq!((done.forward, done.back), (4, 4));
        assert!(
            after_move >= idle * 3 / 4 && after_move < idle * 5,
            "{after_move:?}"
        );
        // The client's side was shut down.
        assert_eq!(a_peer.read(&mut [0u8; 1]).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn the_upstream_ending_ends_the_relay_while_the_client_is_still_open() {
        let (a, mut a_peer) = duplex(1 << 16);
        let (b, mut b_peer) = duplex(1 << 16);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(30), None));
        b_peer.write_all(b"bye").await.unwrap();
        drop(b_peer);
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), a_peer.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer, b"bye");
        let done = tokio::time::timeout(Duration::from_secs(5), relay)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((done.back, done.idled_out), (3, false));
    }
}
