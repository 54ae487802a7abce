//! The relay between two sockets on Linux: each direction splices from its reading socket into
//! a pipe of its own and from the pipe into its writing socket (`splice(2)`), the bytes never
//! entering user space.
//!
//! A direction's pipe is made when its first bytes are ready, and only filled when empty: a
//! splice into an empty pipe that would block means the socket has nothing to read, so tokio's
//! readiness for the socket is cleared only when the socket itself is not ready (a full pipe
//! mistaken for an unready socket would wait for readiness that never comes). A splice out of a
//! non-empty pipe that would block likewise means the writing socket is full.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::Shutdown;
use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};
use tokio::io::Interest;

use super::{drive, gone_is_end, try_again, Progress, Relayed, Socket, BUFFER};

/// How a direction moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Through a pipe with `splice(2)`, copying only where splicing is refused.
    Splice,
    /// Through a buffer (what a direction falls back to), for the tests of that path.
    #[cfg_attr(not(test), allow(dead_code))]
    Copy,
}

/// The most one splice into the pipe asks for; the pipe's capacity (64 KiB unless the user's
/// pipe allowance is spent) bounds what it moves.
const ASK: usize = 1 << 20;

/// Non-blocking on the pipe's side; the sockets are non-blocking themselves.
const FLAGS: SpliceFlags = SpliceFlags::NONBLOCK.union(SpliceFlags::MOVE);

/// A direction's pipe: never inherited by a program the process starts, and never blocking (a
/// splice into a full pipe or out of an empty one must come back, not wait).
const PIPE_FLAGS: PipeFlags = PipeFlags::CLOEXEC.union(PipeFlags::NONBLOCK);

/// [`super::relay_sockets`] on Linux, each direction in `mode`.
pub(crate) async fn relay<A: Socket, B: Socket>(
    mut a: A,
    b: B,
    idle: Duration,
    forward_limit: Option<u64>,
    mode: Mode,
) -> io::Result<Relayed> {
    let progress = Progress::new();
    let idled_out = drive(
        pump(&a, &b, forward_limit, &progress, &progress.forward, mode),
        pump(&b, &a, None, &progress, &progress.back, mode),
        &progress,
        idle,
    )
    .await?;
    let _ = rustix::net::shutdown(a.fd(), Shutdown::Write);
    if super::cut_at_limit(&progress, forward_limit) {
        super::linger(&mut a).await;
    }
    Ok(progress.relayed(idled_out))
}

/// Moves `reader`'s bytes to `writer` until the reader ends (then shuts the writer's write side
/// down) or `limit` bytes have gone (then stops reading, leaving the writer open).
async fn pump<R: Socket, W: Socket>(
    reader: &R,
    writer: &W,
    limit: Option<u64>,
    progress: &Progress,
    count: &AtomicU64,
    mode: Mode,
) -> io::Result<()> {
    let mut remaining = limit;
    if mode == Mode::Copy {
        return copy(reader, writer, remaining, progress, count).await;
    }
    if remaining == Some(0) {
        return Ok(());
    }
    // No descriptors until there is something to move.
    reader.ready(Interest::READABLE).await?;
    let Ok((out_of_pipe, into_pipe)) = pipe_with(PIPE_FLAGS) else {
        return copy(reader, writer, remaining, progress, count).await;
    };
    loop {
        if remaining == Some(0) {
            return Ok(());
        }
        let want = ask(remaining, ASK);
        let n = match fill(reader, &into_pipe, want).await {
            Ok(n) => n,
            // The pipe is empty: nothing is lost by copying from here on.
            Err(error) if refused(&error) => {
                return copy(reader, writer, remaining, progress, count).await
            }
            Err(error) => gone_is_end(Err(error))?,
        };
        if n == 0 {
            let _ = rustix::net::shutdown(writer.fd(), Shutdown::Write);
            return Ok(());
        }
        progress.moved();
        if let Some(left) = remaining.as_mut() {
            *left -= n as u64;
        }
        let mut held = n;
        while held > 0 {
            let m = empty(writer, &out_of_pipe, held).await?;
            held -= m;
            count.fetch_add(m as u64, Ordering::Relaxed);
            progress.moved();
        }
    }
}

/// How much to ask for: `most`, or what is left of the limit when less.
fn ask(remaining: Option<u64>, most: usize) -> usize {
    match remaining {
        Some(left) => most.min(usize::try_from(left).unwrap_or(most)),
        None => most,
    }
}

/// Whether a splice error says the kernel does not splice this socket (nothing was moved).
fn refused(error: &io::Error) -> bool {
    Errno::from_io_error(error).is_some_and(|errno| {
        [Errno::INVAL, Errno::NOSYS, Errno::OPNOTSUPP, Errno::PERM].contains(&errno)
    })
}

/// Splices up to `len` bytes from `reader` into the empty pipe; 0 at the reader's end.
async fn fill<R: Socket>(reader: &R, into_pipe: &OwnedFd, len: usize) -> io::Result<usize> {
    loop {
        reader.ready(Interest::READABLE).await?;
        let spliced = reader.try_io(Interest::READABLE, || {
            if let Some(error) = injected() {
                return Err(error);
            }
            Ok(splice(reader.fd(), None, into_pipe, None, len, FLAGS)?)
        });
        match spliced {
            Err(error) if try_again(&error) => {}
            other => return other,
        }
    }
}

/// Splices up to `len` bytes (at most what the pipe holds) from the pipe into `writer`; at
/// least one.
async fn empty<W: Socket>(writer: &W, out_of_pipe: &OwnedFd, len: usize) -> io::Result<usize> {
    loop {
        writer.ready(Interest::WRITABLE).await?;
        let spliced = writer.try_io(Interest::WRITABLE, || {
            Ok(splice(out_of_pipe, None, writer.fd(), None, len, FLAGS)?)
        });
        match spliced {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Err(error) if try_again(&error) => {}
            other => return other,
        }
    }
}

/// The failure a test injected for the next splice into a pipe or read into a buffer, taken
/// once; never any outside the tests.
fn injected() -> Option<io::Error> {
    #[cfg(test)]
    return tests::INJECTED
        .with(std::cell::Cell::take)
        .map(|errno: Errno| io::Error::from_raw_os_error(errno.raw_os_error()));
    #[cfg(not(test))]
    None
}

/// The same as [`pump`], through a buffer: read a chunk, write it whole, read the next.
async fn copy<R: Socket, W: Socket>(
    reader: &R,
    writer: &W,
    mut remaining: Option<u64>,
    progress: &Progress,
    count: &AtomicU64,
) -> io::Result<()> {
    let mut buffer = vec![0u8; BUFFER];
    loop {
        if remaining == Some(0) {
            return Ok(());
        }
        let want = ask(remaining, BUFFER);
        let n = loop {
            reader.ready(Interest::READABLE).await?;
            match injected().map_or_else(|| reader.try_read(&mut buffer[..want]), Err) {
                Err(error) if try_again(&error) => {}
                read => break gone_is_end(read)?,
            }
        };
        if n == 0 {
            let _ = rustix::net::shutdown(writer.fd(), Shutdown::Write);
            return Ok(());
        }
        progress.moved();
        if let Some(left) = remaining.as_mut() {
            *left -= n as u64;
        }
        let mut at = 0;
        while at < n {
            writer.ready(Interest::WRITABLE).await?;
            match writer.try_write(&buffer[at..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(m) => {
                    at += m;
                    count.fetch_add(m as u64, Ordering::Relaxed);
                    progress.moved();
                }
                Err(error) if try_again(&error) => {}
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The relay between real sockets, in both modes (spliced, and the copy a direction falls
    //! back to) and both shapes (the forwarder's TCP client to a Unix socket, the proxy's Unix
    //! client to a TCP upstream). Each test also checks that the process's descriptors are back
    //! where they were once the relay and its peers are gone: no pipe outlives its relay.

    use std::future::Future;

    use proptest::prelude::*;
    use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream, UnixStream};
    use tokio::time::{timeout, Instant};

    use super::*;

    const MODES: [Mode; 2] = [Mode::Splice, Mode::Copy];

    thread_local! {
        /// The failure [`injected`] hands to the next splice into a pipe or read into a buffer
        /// on this thread (a test's relay runs on the test's own thread).
        pub(super) static INJECTED: std::cell::Cell<Option<Errno>> =
            const { std::cell::Cell::new(None) };
    }

    /// `O_NONBLOCK` and `O_CLOEXEC` as `/proc/self/fdinfo` shows them.
    const NONBLOCK_AND_CLOEXEC: u32 = 0o4000 | 0o2_000_000;

    /// Every pipe end the process holds: its descriptor and its `/proc/self/fdinfo` flags.
    fn pipes() -> Vec<(String, u32)> {
        let entries = std::fs::read_dir("/proc/self/fd").unwrap();
        entries
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let target = std::fs::read_link(entry.path()).ok()?;
                if !target.to_string_lossy().starts_with("pipe:") {
                    return None;
                }
                let fd = entry.file_name().to_string_lossy().into_owned();
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
                let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?;
                Some((fd, u32::from_str_radix(flags.trim(), 8).ok()?))
            })
            .collect()
    }

    /// While the client's bytes back up in a relay (the upstream not reading yet), a spliced
    /// direction holds exactly one pipe of its own, both ends non-blocking and closed on exec,
    /// and a copied one holds none; every byte still arrives.
    #[tokio::test]
    async fn a_spliced_direction_holds_one_pipe_of_its_own_and_a_copied_one_none() {
        each_shape(|shape, mode| async move {
            let before = pipes();
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(10), None).await;
            let up = body(4 << 20, 9);
            let (_a_read, mut a_write) = tokio::io::split(a_peer);
            let upstream = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let during: Vec<(String, u32)> = pipes()
                    .into_iter()
                    .filter(|p| !before.contains(p))
                    .collect();
                let got = read_to_end(&mut b_peer).await;
                let _ = b_peer.shutdown().await;
                (during, got)
            };
            let (relayed, (), (during, got)) =
                tokio::join!(&mut relay, send(&mut a_write, &up, 65_536), upstream);
            assert!(got == up, "{shape:?} {mode:?}: the bytes differ");
            assert_eq!(relayed.unwrap().forward, up.len() as u64);
            match mode {
                Mode::Splice => {
                    assert_eq!(during.len(), 2, "{shape:?}: one pipe: {during:?}");
                    for (fd, flags) in &during {
                        assert_eq!(
                            flags & NONBLOCK_AND_CLOEXEC,
                            NONBLOCK_AND_CLOEXEC,
                            "{shape:?}: pipe end {fd} has flags {flags:o}"
                        );
                    }
                }
                Mode::Copy => assert!(during.is_empty(), "{shape:?}: a pipe: {during:?}"),
            }
        })
        .await;
    }

    /// The proxy relays sockets it only borrows (`&mut`): in both modes every byte still
    /// arrives both ways, through the borrowed sockets' own reads and writes.
    #[tokio::test]
    async fn borrowed_sockets_relay_both_ways_in_both_modes() {
        for mode in MODES {
            let (mut a_peer, mut a) = tcp_pair().await;
            let (mut b, mut b_peer) = UnixStream::pair().unwrap();
            let up = body(300_001, 11);
            let down = body(200_003, 12);
            let (mut a_read, mut a_write) = tokio::io::split(&mut a_peer);
            // The upstream answers once it has the whole request: its end ends the relay.
            let upstream = async {
                let got = read_to_end(&mut b_peer).await;
                send(&mut b_peer, &down, 7_001).await;
                got
            };
            let (relayed, got_down, (), got_up) = tokio::join!(
                relay(&mut a, &mut b, Duration::from_secs(10), None, mode),
                read_to_end(&mut a_read),
                send(&mut a_write, &up, 10_007),
                upstream,
            );
            assert!(got_up == up, "{mode:?}: the forward bytes differ");
            assert!(got_down == down, "{mode:?}: the backward bytes differ");
            let relayed = relayed.unwrap();
            assert_eq!(
                (relayed.forward, relayed.back),
                (up.len() as u64, down.len() as u64),
                "{mode:?}"
            );
        }
    }

    /// A splice the kernel refuses for a socket (`EINVAL`, as for a socket type it cannot
    /// splice) turns the direction into a copy that loses nothing.
    #[tokio::test]
    async fn a_refused_splice_falls_back_to_copying_and_loses_nothing() {
        for shape in [Shape::Forwarder, Shape::Proxy] {
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, Mode::Splice, Duration::from_secs(10), None).await;
            INJECTED.with(|cell| cell.set(Some(Errno::INVAL)));
            let up = body(1 << 20, 10);
            let (mut a_read, mut a_write) = tokio::io::split(a_peer);
            let upstream = async {
                let got = read_to_end(&mut b_peer).await;
                send(&mut b_peer, b"answer", 6).await;
                got
            };
            let (relayed, (), got, answer) = tokio::join!(
                &mut relay,
                send(&mut a_write, &up, 65_536),
                upstream,
                read_to_end(&mut a_read)
            );
            assert!(
                INJECTED.with(std::cell::Cell::take).is_none(),
                "{shape:?}: no splice met the refusal"
            );
            assert!(got == up, "{shape:?}: the bytes differ");
            assert_eq!(answer, b"answer");
            let relayed = relayed.unwrap();
            assert_eq!((relayed.forward, relayed.back), (up.len() as u64, 6));
        }
    }

    /// Any other failure of a splice or a read (here `EIO`) ends the relay with that error: it
    /// is neither retried nor taken for the peer's end.
    #[tokio::test]
    async fn a_failed_splice_or_read_fails_the_relay() {
        for mode in MODES {
            for shape in [Shape::Forwarder, Shape::Proxy] {
                let Wired {
                    mut relay,
                    a_peer,
                    b_peer,
                } = wire(shape, mode, Duration::from_secs(10), None).await;
                INJECTED.with(|cell| cell.set(Some(Errno::IO)));
                let (_a_read, mut a_write) = tokio::io::split(a_peer);
                let (relayed, ()) =
                    tokio::join!(timeout(Duration::from_secs(10), &mut relay), async {
                        let _ = a_write.write_all(b"request").await;
                    });
                let error = relayed
                    .expect("the relay ends at the failure")
                    .expect_err("the failure is the relay's");
                assert_eq!(
                    error.raw_os_error(),
                    Some(Errno::IO.raw_os_error()),
                    "{shape:?} {mode:?}"
                );
                drop(b_peer);
            }
        }
    }

    /// Only the errors of a socket the kernel cannot splice are refusals; the peer going away,
    /// a full socket and an I/O error are not.
    #[test]
    fn only_the_kernels_refusals_to_splice_are_refusals() {
        for errno in [Errno::INVAL, Errno::NOSYS, Errno::OPNOTSUPP, Errno::PERM] {
            assert!(refused(&errno.into()), "{errno:?}");
        }
        for errno in [
            Errno::CONNRESET,
            Errno::PIPE,
            Errno::AGAIN,
            Errno::IO,
            Errno::BADF,
        ] {
            assert!(!refused(&errno.into()), "{errno:?}");
        }
    }

    /// A byte stream that is not periodic, so a dropped, repeated or reordered chunk shows.
    fn body(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap());
        let (near, far) = tokio::join!(near, listener.accept());
        let (near, far) = (near.unwrap(), far.unwrap().0);
        near.set_nodelay(true).unwrap();
        (near, far)
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// A peer's end of a socket, boxed so that a test body is written once for both shapes.
    trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
    impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

    /// Runs `test` on both shapes and both modes, checking descriptors after each.
    async fn each_shape<F, Fut>(test: F)
    where
        F: Fn(Shape, Mode) -> Fut,
        Fut: Future<Output = ()>,
    {
        for mode in MODES {
            for shape in [Shape::Forwarder, Shape::Proxy] {
                let before = open_fds();
                test(shape, mode).await;
                // Closed descriptors may take a moment to leave /proc.
                let until = Instant::now() + Duration::from_secs(5);
                while open_fds() > before && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(open_fds(), before, "{shape:?} {mode:?}: descriptors leaked");
            }
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Shape {
        /// `a` TCP (the workload's client), `b` Unix (the proxy's socket).
        Forwarder,
        /// `a` Unix (the forwarder's connection), `b` TCP (the upstream).
        Proxy,
    }

    /// Sockets in `shape`, and the relay between them as a boxed future.
    struct Wired {
        relay: std::pin::Pin<Box<dyn Future<Output = io::Result<Relayed>> + Send>>,
        a_peer: Box<dyn Stream>,
        b_peer: Box<dyn Stream>,
    }

    async fn wire(shape: Shape, mode: Mode, idle: Duration, limit: Option<u64>) -> Wired {
        wire_with(shape, mode, idle, limit, false).await
    }

    /// [`wire`]; with `reset_client`, a TCP client peer resets its connection when dropped
    /// (a Unix one can only close, with bytes unread).
    async fn wire_with(
        shape: Shape,
        mode: Mode,
        idle: Duration,
        limit: Option<u64>,
        reset_client: bool,
    ) -> Wired {
        match shape {
            Shape::Forwarder => {
                let (a_peer, a) = tcp_pair().await;
                if reset_client {
                    a_peer.set_zero_linger().unwrap();
                }
                let (b, b_peer) = UnixStream::pair().unwrap();
                Wired {
                    relay: Box::pin(relay(a, b, idle, limit, mode)),
                    a_peer: Box::new(a_peer),
                    b_peer: Box::new(b_peer),
                }
            }
            Shape::Proxy => {
                let (a, a_peer) = UnixStream::pair().unwrap();
                let (b, b_peer) = tcp_pair().await;
                Wired {
                    relay: Box::pin(relay(a, b, idle, limit, mode)),
                    a_peer: Box::new(a_peer),
                    b_peer: Box::new(b_peer),
                }
            }
        }
    }

    /// Writes `bytes` in chunks of `chunk`, then shuts the write side down; a write error (the
    /// relay gone) ends it early.
    async fn send<W: AsyncWrite + Unpin>(write: &mut W, bytes: &[u8], chunk: usize) {
        for piece in bytes.chunks(chunk.max(1)) {
            if write.write_all(piece).await.is_err() {
                return;
            }
        }
        let _ = write.shutdown().await;
    }

    async fn read_to_end<R: AsyncRead + Unpin>(read: &mut R) -> Vec<u8> {
        read_to_end_or_reset(read, false).await
    }

    /// Reads until the end, or with `may_reset` until a reset: a relay that ends with bytes
    /// of the client's unread (past a forward limit) closes the client's socket with them,
    /// which the client sees as a reset after everything sent to it.
    async fn read_to_end_or_reset<R: AsyncRead + Unpin>(read: &mut R, may_reset: bool) -> Vec<u8> {
        let mut got = Vec::new();
        let ended = timeout(Duration::from_secs(20), read.read_to_end(&mut got))
            .await
            .expect("the stream ends in time");
        match ended {
            Ok(_) => {}
            Err(error) if may_reset && error.kind() == io::ErrorKind::ConnectionReset => {}
            Err(error) => panic!("the stream ends cleanly: {error}"),
        }
        got
    }

    /// Both directions at once, 300 KB up and 1 MiB down, each in odd-sized writes: every byte
    /// arrives, once and in order, and each input's end arrives as the other side's end.
    #[tokio::test]
    async fn both_directions_arrive_byte_exact_at_once() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                a_peer,
                b_peer,
            } = wire(shape, mode, Duration::from_secs(10), None).await;
            let up = body(300_007, 1);
            let down = body((1 << 20) + 3, 2);
            let (mut a_read, mut a_write) = tokio::io::split(a_peer);
            let (mut b_read, mut b_write) = tokio::io::split(b_peer);
            let (relayed, got_down, (), got_up, ()) = tokio::join!(
                &mut relay,
                read_to_end(&mut a_read),
                send(&mut a_write, &up, 10_007),
                read_to_end(&mut b_read),
                send(&mut b_write, &down, 70_001),
            );
            assert!(got_up == up, "{shape:?} {mode:?}: the forward bytes differ");
            assert!(
                got_down == down,
                "{shape:?} {mode:?}: the backward bytes differ"
            );
            assert_eq!(
                relayed.unwrap(),
                Relayed {
                    forward: up.len() as u64,
                    back: down.len() as u64,
                    idled_out: false,
                }
            );
        })
        .await;
    }

    /// The client ends its request first; the upstream reads to that end and only then
    /// answers, through the half-closed connection.
    #[tokio::test]
    async fn a_half_closed_client_still_gets_the_whole_answer() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(10), None).await;
            let question = body(100_000, 3);
            let answer = body(500_000, 4);
            let (mut a_read, mut a_write) = tokio::io::split(a_peer);
            let client = async {
                send(&mut a_write, &question, 65_536).await;
                read_to_end(&mut a_read).await
            };
            let upstream = async {
                let got = read_to_end(&mut b_peer).await;
                send(&mut b_peer, &answer, 65_536).await;
                got
            };
            let (relayed, got_answer, got_question) = tokio::join!(&mut relay, client, upstream);
            assert!(got_question == question, "{shape:?} {mode:?}");
            assert!(got_answer == answer, "{shape:?} {mode:?}");
            let relayed = relayed.unwrap();
            assert_eq!((relayed.forward, relayed.back), (100_000, 500_000));
        })
        .await;
    }

    /// A forward limit reached in the middle of the client's bytes: exactly the limit arrives,
    /// the upstream's side is not ended, and the answer still comes back.
    #[tokio::test]
    async fn the_forward_limit_cuts_mid_transfer_and_leaves_the_upstream_open() {
        each_shape(|shape, mode| async move {
            let limit = 100_001;
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(10), Some(limit)).await;
            let up = body(300_000, 5);
            let (mut a_read, mut a_write) = tokio::io::split(a_peer);
            let client = async {
                // The relay stops reading: this write waits until the relay has ended.
                let _ = timeout(Duration::from_secs(10), send(&mut a_write, &up, 65_536)).await;
            };
            let upstream = async {
                let mut got = vec![0u8; limit as usize];
                b_peer.read_exact(&mut got).await.unwrap();
                assert!(got[..] == up[..limit as usize], "{shape:?} {mode:?}");
                let more = timeout(Duration::from_millis(300), b_peer.read(&mut [0u8; 1])).await;
                assert!(
                    more.is_err(),
                    "{shape:?} {mode:?}: past the limit: {more:?}"
                );
                send(&mut b_peer, b"answer", 6).await;
            };
            let (relayed, answer, (), ()) = tokio::join!(
                &mut relay,
                read_to_end_or_reset(&mut a_read, true),
                client,
                upstream
            );
            assert_eq!(answer, b"answer");
            assert_eq!(
                relayed.unwrap(),
                Relayed {
                    forward: limit,
                    back: 6,
                    idled_out: false
                }
            );
        })
        .await;
    }

    /// A reset from the client in the middle of a download ends the relay at once, and both
    /// sides are closed.
    #[tokio::test]
    async fn a_peer_reset_mid_download_ends_the_relay() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                mut a_peer,
                mut b_peer,
            } = wire_with(shape, mode, Duration::from_secs(30), None, true).await;
            let down = body(8 << 20, 6);
            let head = down[..100_000].to_vec();
            let client = async move {
                let mut got = vec![0u8; head.len()];
                a_peer.read_exact(&mut got).await.unwrap();
                assert!(got == head);
                drop(a_peer);
            };
            let upstream = async {
                // Writes until the relay closes the upstream.
                let _ = timeout(Duration::from_secs(10), send(&mut b_peer, &down, 65_536)).await;
                let mut rest = Vec::new();
                let _ = timeout(Duration::from_secs(10), b_peer.read_to_end(&mut rest)).await;
            };
            let started = Instant::now();
            let (relayed, (), ()) = tokio::join!(
                timeout(Duration::from_secs(10), &mut relay),
                client,
                upstream
            );
            let relayed = relayed.expect("the relay ends after the reset");
            // The write into the reset connection fails, or the relay saw the reset as the end.
            if let Ok(relayed) = relayed {
                assert!(relayed.back < down.len() as u64, "{relayed:?}");
            }
            assert!(started.elapsed() < Duration::from_secs(10));
        })
        .await;
    }

    /// A reset from the upstream ends the download as an end of input: the client's side is
    /// shut down, and the relay reports no error.
    #[tokio::test]
    async fn an_upstream_reset_is_an_end_for_the_client() {
        for mode in MODES {
            let before = open_fds();
            let (a, mut a_peer) = UnixStream::pair().unwrap();
            let (b, b_peer) = tcp_pair().await;
            let relay = relay(a, b, Duration::from_secs(30), None, mode);
            let upstream = async move {
                let mut b_peer = b_peer;
                b_peer.write_all(&body(50_000, 7)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                b_peer.set_zero_linger().unwrap();
                drop(b_peer);
            };
            let client = async {
                let mut got = Vec::new();
                timeout(Duration::from_secs(10), a_peer.read_to_end(&mut got))
                    .await
                    .expect("the client's side ends")
                    .expect("as an orderly end");
                got.len()
            };
            let (relayed, (), got) =
                tokio::join!(timeout(Duration::from_secs(10), relay), upstream, client);
            let relayed = relayed.expect("the relay ends").expect("a reset is an end");
            assert_eq!(relayed.back, got as u64, "{mode:?}");
            drop(a_peer);
            assert_eq!(open_fds(), before, "{mode:?}");
        }
    }

    /// A client reading slowly gets every byte, and the relay does not idle out while bytes
    /// keep moving.
    #[tokio::test]
    async fn a_slow_reader_gets_every_byte() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                mut a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_millis(1500), None).await;
            let down = body(1 << 20, 8);
            let client = async {
                let mut got = Vec::new();
                let mut chunk = vec![0u8; 16 * 1024];
                loop {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    match a_peer.read(&mut chunk).await.unwrap() {
                        0 => break got,
                        n => got.extend_from_slice(&chunk[..n]),
                    }
                }
            };
            let upstream = send(&mut b_peer, &down, 65_536);
            let (relayed, got, ()) = tokio::join!(&mut relay, client, upstream);
            assert!(got == down, "{shape:?} {mode:?}");
            let relayed = relayed.unwrap();
            assert!(!relayed.idled_out);
            assert_eq!(relayed.back, down.len() as u64);
        })
        .await;
    }

    /// A client that stops reading holds the download up; with nothing moving, the idle
    /// deadline ends the relay even though a splice into the client is waiting.
    #[tokio::test]
    async fn a_stalled_reader_meets_the_idle_deadline() {
        each_shape(|shape, mode| async move {
            let idle = Duration::from_millis(400);
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, idle, None).await;
            // More than the sockets' and the pipe's buffers hold.
            let down = vec![9u8; 32 << 20];
            let started = Instant::now();
            let upstream = async {
                let _ = timeout(Duration::from_secs(10), send(&mut b_peer, &down, 65_536)).await;
            };
            let (relayed, ()) =
                tokio::join!(timeout(Duration::from_secs(10), &mut relay), upstream);
            let relayed = relayed.expect("the idle deadline ends the relay").unwrap();
            assert!(relayed.idled_out, "{shape:?} {mode:?}: {relayed:?}");
            assert!(relayed.back < down.len() as u64);
            assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
            drop(a_peer);
        })
        .await;
    }

    /// Dropping the relay in the middle of a transfer closes both sockets (each peer sees the
    /// end) and its pipes.
    #[tokio::test]
    async fn dropping_the_relay_mid_transfer_closes_everything() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                mut a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(30), None).await;
            let down = body(1 << 20, 10);
            let mut got = vec![0u8; 200_000];
            let (cut, (), ()) = tokio::join!(
                timeout(Duration::from_millis(300), &mut relay),
                async {
                    // Written and left open: the relay has no reason to end by itself.
                    let _ = timeout(Duration::from_millis(300), b_peer.write_all(&down)).await;
                },
                async { a_peer.read_exact(&mut got).await.map(drop).unwrap() },
            );
            assert!(cut.is_err(), "the relay was still running");
            drop(relay);
            assert!(got[..] == down[..got.len()]);
            // Both peers see their connection end.
            let rest = read_to_end(&mut a_peer).await;
            assert!(rest[..] == down[got.len()..got.len() + rest.len()]);
            let _ = timeout(Duration::from_secs(5), b_peer.read(&mut [0u8; 1]))
                .await
                .expect("the upstream sees the end");
        })
        .await;
    }

    /// A client that sends past the forward limit still gets the whole answer: the relay reads
    /// and drops the rest before it closes, instead of resetting the connection under the answer.
    #[tokio::test]
    async fn a_client_past_the_limit_still_gets_the_whole_answer() {
        each_shape(|shape, mode| async move {
            let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(10), Some(10)).await;
            let up = body(512 << 10, 21);
            let down = body(1 << 20, 22);
            let (mut a_read, mut a_write) = tokio::io::split(a_peer);
            let client = async {
                let _ = timeout(Duration::from_secs(10), send(&mut a_write, &up, 65_536)).await;
            };
            let upstream = async {
                let mut got = [0u8; 10];
                b_peer.read_exact(&mut got).await.unwrap();
                assert!(got[..] == up[..10]);
                send(&mut b_peer, &down, 65_536).await;
            };
            let (relayed, got_down, (), ()) = tokio::join!(
                timeout(Duration::from_secs(10), &mut relay),
                read_to_end(&mut a_read),
                client,
                upstream
            );
            assert!(
                got_down == down,
                "{shape:?} {mode:?}: {} of {}",
                got_down.len(),
                down.len()
            );
            let relayed = relayed.expect("the relay ends").unwrap();
            assert_eq!((relayed.forward, relayed.back), (10, down.len() as u64));
        })
        .await;
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        /// Any sizes, limit and write chunking: the upstream gets exactly the first `limit`
        /// bytes of the client's, and the end only when the client's ended within the limit;
        /// the client gets all of the upstream's.
        #[test]
        fn the_relay_moves_exactly_the_bytes_the_bounds_allow(
            up_len in 0usize..200_000,
            down_len in 0usize..200_000,
            limit in proptest::option::of(0u64..250_000),
            chunk in 1usize..80_000,
            splice_mode in any::<bool>(),
            proxy_shape in any::<bool>(),
        ) {
            let mode = if splice_mode { Mode::Splice } else { Mode::Copy };
            let shape = if proxy_shape { Shape::Proxy } else { Shape::Forwarder };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let Wired {
                mut relay,
                a_peer,
                mut b_peer,
            } = wire(shape, mode, Duration::from_secs(10), limit).await;
                let up = body(up_len, up_len as u64 + 11);
                let down = body(down_len, down_len as u64 + 12);
                let expected_up = limit.map_or(up_len, |l| up_len.min(l as usize));
                let ends = limit.is_none_or(|l| (up_len as u64) < l);
                let (mut a_read, mut a_write) = tokio::io::split(a_peer);
                let client = async {
                    let _ = timeout(Duration::from_secs(10), send(&mut a_write, &up, chunk)).await;
                };
                let upstream = async {
                    let mut got = vec![0u8; expected_up];
                    b_peer.read_exact(&mut got).await.unwrap();
                    assert!(got[..] == up[..expected_up]);
                    if ends {
                        let end = timeout(Duration::from_secs(5), b_peer.read(&mut [0u8; 1])).await;
                        assert_eq!(end.expect("the end arrives").unwrap(), 0);
                    }
                    send(&mut b_peer, &down, chunk).await;
                };
                let (relayed, got_down, (), ()) =
                    tokio::join!(
                    &mut relay,
                    read_to_end_or_reset(&mut a_read, expected_up < up_len),
                    client,
                    upstream
                );
                assert!(got_down == down);
                let relayed = relayed.unwrap();
                assert_eq!((relayed.forward, relayed.back), (expected_up as u64, down_len as u64));
            });
        }
    }
}
