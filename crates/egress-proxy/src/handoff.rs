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
//! descriptor is a connected TCP socket ([`client_of`]: stream type, IPv4 or IPv6, protocol TCP,
//! not listening, with a peer); anything else is closed unread. A passed descriptor gives the
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
    recvmsg, sendmsg, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
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
    let domain = sockopt::socket_domain(&fd).map_err(|_| not_a_socket())?;
    let protocol = sockopt::socket_protocol(&fd).ok().flatten();
    let listening = sockopt::socket_acceptconn(&fd).unwrap_or(true);
    let connected = rustix::net::getpeername(&fd).is_ok_and(|peer| peer.is_some());
    if kind != SocketType::STREAM
        || !(domain == AddressFamily::INET || domain == AddressFamily::INET6)
        || protocol != Some(rustix::net::ipproto::TCP)
        || listening
        || !connected
    {
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
