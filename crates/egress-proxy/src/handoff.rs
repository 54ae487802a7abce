//! The handoff: instead of relaying a client's bytes to a new connection on the proxy's socket,
//! the forwarder passes the accepted TCP connection itself to the proxy, and the proxy serves the
//! client directly, as if it had accepted it. No byte of the request or the answer then crosses
//! the forwarder, and a request costs no second connection.
//!
//! The forwarder keeps one Unix stream connection to the proxy's handoff socket; each handoff is
//! one byte, [`MARKER`], carrying exactly one descriptor (`SCM_RIGHTS`). The forwarder closes its
//! own copy once the message is sent; the proxy never sends anything back.
//!
//! What the proxy checks, since the sender runs inside the workload and may be anything the guest
//! runs there: each message is the marker with exactly one descriptor (more are closed by the
//! kernel or by [`receive`], and the handoff connection ends on anything else), and the
//! descriptor is a connected TCP socket ([`client_of`]: a stream socket whose protocol is TCP,
//! so IPv4 or IPv6, with a peer, so not listening); anything else is closed unread. A passed descriptor gives the
//! proxy a connection the guest already had; it gives the guest nothing of the proxy's. Every
//! rule of the request path applies to a handed-off client as to one on the socket, under the
//! same connection cap.
//!
//! What it does not do: tell the forwarder whether the proxy served a client it passed (a proxy
//! that ends after taking it closes the connection, as a relayed one would be), or pass anything
//! but TCP connections.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, sockopt, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketType,
};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

use crate::relay::try_again;

/// The one byte of each handoff message.
pub const MARKER: u8 = b'H';

/// Why a message on a handoff connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The byte was not [`MARKER`].
    NotTheMarker,
    /// The marker came with no descriptor, or with more than one.
    NotOneDescriptor,
    /// The descriptor is not a socket.
    NotASocket,
    /// A socket, but not a connected TCP one.
    NotAConnectedTcpSocket,
}

impl Refused {
    /// The refusal as the proxy logs it.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::NotTheMarker => "handoff refused: not the marker byte",
            Refused::NotOneDescriptor => "handoff refused: not exactly one descriptor",
            Refused::NotASocket => "handoff refused: not a socket",
            Refused::NotAConnectedTcpSocket => "handoff refused: not a connected TCP socket",
        }
    }
}

/// What [`receive`] read.
#[derive(Debug)]
pub enum Received {
    /// A client connection to serve.
    Client(TcpStream),
    /// A message the proxy refuses; the handoff connection should end.
    Refused(Refused),
}

/// Passes `client` to the proxy over `connection` (one [`MARKER`] byte with its descriptor).
/// The caller closes its own copy afterwards.
///
/// # Errors
/// The connection's error (`EPIPE` once the proxy has gone).
///
/// # Cancel safety and drop
/// Cancel safe: the message is sent whole or not at all.
pub async fn pass(connection: &UnixStream, client: &TcpStream) -> io::Result<()> {
    let fds = [client.as_fd()];
    loop {
        connection.writable().await?;
        let sent = connection.try_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for the descriptor"));
            }
            Ok(sendmsg(
                connection,
                &[io::IoSlice::new(&[MARKER])],
                &mut control,
                SendFlags::NOSIGNAL,
            )?)
        });
        match sent {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(io::ErrorKind::WriteZero.into()),
            Err(error) if try_again(&error) => {}
            Err(error) => return Err(error),
        }
    }
}

/// Reads the next handoff message from `connection`; `None` at its end.
///
/// # Errors
/// The connection's error.
///
/// # Cancel safety and drop
/// Cancel safe: a message is taken whole or not at all, and a descriptor taken is closed when
/// the future is dropped before returning it.
pub async fn receive(connection: &UnixStream) -> io::Result<Option<Received>> {
    loop {
        connection.readable().await?;
        let read = connection.try_io(Interest::READABLE, || {
            let mut byte = [0u8; 1];
            // Room for one descriptor: the kernel closes any further one (and says so in
            // `MSG_CTRUNC`), so a sender cannot make the proxy hold more than it takes.
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let message = recvmsg(
                connection,
                &mut [io::IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )?;
            let mut fds: Vec<OwnedFd> = Vec::new();
            for part in control.drain() {
                if let RecvAncillaryMessage::ScmRights(passed) = part {
                    fds.extend(passed);
                }
            }
            Ok((message.bytes, byte[0], message.flags, fds))
        });
        let (bytes, byte, flags, mut fds) = match read {
            Ok(read) => read,
            Err(error) if try_again(&error) => continue,
            Err(error) => return Err(error),
        };
        if bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        if byte != MARKER || bytes != 1 {
            return Ok(Some(Received::Refused(Refused::NotTheMarker)));
        }
        if fds.len() != 1 || flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            return Ok(Some(Received::Refused(Refused::NotOneDescriptor)));
        }
        let fd = fds.pop().expect("one descriptor");
        return Ok(Some(match client_of(fd) {
            Ok(client) => Received::Client(client),
            Err(refused) => Received::Refused(refused),
        }));
    }
}

/// The connected TCP socket `fd` is, ready for tokio; anything else is refused (and closed).
///
/// # Errors
/// [`Refused::NotASocket`] or [`Refused::NotAConnectedTcpSocket`].
pub fn client_of(fd: OwnedFd) -> Result<TcpStream, Refused> {
    let kind = sockopt::socket_type(&fd).map_err(|_| not_a_socket())?;
    // TCP is the protocol of IPv4 and IPv6 stream sockets only; a raw socket may name it too,
    // which its type tells apart.
    let tcp = kind == SocketType::STREAM
        && sockopt::socket_protocol(&fd).ok().flatten() == Some(rustix::net::ipproto::TCP);
    // A listening socket has no peer either.
    let connected = rustix::net::getpeername(&fd).is_ok_and(|peer| peer.is_some());
    if !(tcp && connected) {
        return Err(not_a_connected_tcp_socket());
    }
    let client = std::net::TcpStream::from(fd);
    client
        .set_nonblocking(true)
        .map_err(|_| not_a_connected_tcp_socket())?;
    TcpStream::from_std(client).map_err(|_| not_a_connected_tcp_socket())
}

#[cold]
fn not_a_socket() -> Refused {
    Refused::NotASocket
}

#[cold]
fn not_a_connected_tcp_socket() -> Refused {
    Refused::NotAConnectedTcpSocket
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;
    use std::time::Duration;

    use rustix::net::{AddressFamily, SocketFlags};
    use tokio::net::TcpListener;

    /// Sends `bytes` with `fds` on `connection` in one message, as any sender could.
    pub(crate) fn send_raw(connection: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        }
        let sent = sendmsg(
            connection,
            &[io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
        assert_eq!(sent, bytes.len());
    }

    /// A connected loopback TCP pair: (the client's side, the accepted side).
    pub(crate) async fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (client, accepted)
    }

    async fn next(connection: &UnixStream) -> io::Result<Option<Received>> {
        tokio::time::timeout(Duration::from_secs(5), receive(connection))
            .await
            .expect("a message or an end in time")
    }

    fn refused(received: io::Result<Option<Received>>) -> Refused {
        match received {
            Ok(Some(Received::Refused(refused))) => refused,
            other => panic!("a refusal, not {other:?}"),
        }
    }

    #[tokio::test]
    async fn each_message_is_read_as_it_was_sent() {
        let (forwarder, proxy) = UnixStream::pair().unwrap();
        let (_client, accepted) = tcp_pair().await;
        send_raw(&forwarder, &[MARKER], &[accepted.as_fd()]);
        assert!(matches!(next(&proxy).await, Ok(Some(Received::Client(_)))));
        send_raw(&forwarder, &[MARKER], &[]);
        assert_eq!(refused(next(&proxy).await), Refused::NotOneDescriptor);
        send_raw(&forwarder, b"G", &[accepted.as_fd()]);
        assert_eq!(refused(next(&proxy).await), Refused::NotTheMarker);
        send_raw(&forwarder, &[MARKER], &[accepted.as_fd(), accepted.as_fd()]);
        assert_eq!(refused(next(&proxy).await), Refused::NotOneDescriptor);
        let (read_end, _write_end) = rustix::pipe::pipe().unwrap();
        send_raw(&forwarder, &[MARKER], &[read_end.as_fd()]);
        assert_eq!(refused(next(&proxy).await), Refused::NotASocket);
        drop(forwarder);
        assert!(matches!(next(&proxy).await, Ok(None)));
    }

    #[tokio::test]
    async fn a_reset_handoff_connection_is_an_error() {
        let (forwarder, proxy) = UnixStream::pair().unwrap();
        // The forwarder's side closes with input it never read: its peer is reset.
        assert_eq!(proxy.try_write(b"unread").unwrap(), 6);
        drop(forwarder);
        let error = next(&proxy).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
    }

    #[tokio::test]
    async fn a_pass_waits_while_the_connection_is_full() {
        let (forwarder, proxy) = UnixStream::pair().unwrap();
        let (_client, accepted) = tcp_pair().await;
        let mut passed = 0;
        while let Ok(sent) =
            tokio::time::timeout(Duration::from_millis(100), pass(&forwarder, &accepted)).await
        {
            sent.expect("a pass that would block waits, never fails");
            passed += 1;
        }
        assert!(passed > 0);
        let waiting = pass(&forwarder, &accepted);
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut waiting)
                .await
                .is_err(),
            "a full connection holds the pass"
        );
        for _ in 0..passed {
            assert!(matches!(next(&proxy).await, Ok(Some(Received::Client(_)))));
        }
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the pass goes once there is room")
            .unwrap();
    }

    #[tokio::test]
    async fn only_a_connected_tcp_socket_is_taken() {
        let (_client, accepted) = tcp_pair().await;
        assert!(client_of(accepted.into_std().unwrap().into()).is_ok());
        let (read_end, _write_end) = rustix::pipe::pipe().unwrap();
        assert_eq!(client_of(read_end).unwrap_err(), Refused::NotASocket);
        // A stream socket, connected, but not TCP.
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            client_of(unix.into()).unwrap_err(),
            Refused::NotAConnectedTcpSocket
        );
        // TCP, not connected; and listening.
        let unconnected = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        assert_eq!(
            client_of(unconnected).unwrap_err(),
            Refused::NotAConnectedTcpSocket
        );
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            client_of(listening.into()).unwrap_err(),
            Refused::NotAConnectedTcpSocket
        );
        // Connected, not a stream: UDP; and, where the process may make one, a raw socket
        // whose protocol is TCP.
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect("127.0.0.1:9").unwrap();
        assert_eq!(
            client_of(udp.into()).unwrap_err(),
            Refused::NotAConnectedTcpSocket
        );
        match rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::RAW,
            SocketFlags::CLOEXEC,
            Some(rustix::net::ipproto::TCP),
        ) {
            Ok(raw) => {
                rustix::net::connect(&raw, &std::net::SocketAddrV4::new([127, 0, 0, 1].into(), 9))
                    .unwrap();
                assert_eq!(client_of(raw).unwrap_err(), Refused::NotAConnectedTcpSocket);
            }
            Err(errno) => assert!(
                !rustix::process::geteuid().is_root(),
                "root may make a raw socket: {errno}"
            ),
        }
    }

    #[test]
    fn each_refusal_says_what_was_refused() {
        assert_eq!(
            [
                Refused::NotTheMarker,
                Refused::NotOneDescriptor,
                Refused::NotASocket,
                Refused::NotAConnectedTcpSocket,
            ]
            .map(Refused::reason),
            [
                "handoff refused: not the marker byte",
                "handoff refused: not exactly one descriptor",
                "handoff refused: not a socket",
                "handoff refused: not a connected TCP socket",
            ]
        );
    }
}
