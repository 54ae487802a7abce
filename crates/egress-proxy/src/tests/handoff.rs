//! The proxy's handoff socket against what a guest could send on it instead of a forwarder's
//! messages: every refusal closes the descriptors it came with and ends that handoff connection,
//! and the proxy goes on serving.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

use super::*;
use crate::handoff::tests::{send_raw, tcp_pair};
use crate::handoff::MARKER;

/// Hands a fresh loopback connection to the proxy on `connection`; returns the client's side.
async fn hand_off(connection: &UnixStream) -> tokio::net::TcpStream {
    let (client, accepted) = tcp_pair().await;
    crate::handoff::pass(connection, &accepted).await.unwrap();
    client
}

/// Waits until the proxy has ended `connection` (it reads its end).
async fn ended(connection: &mut UnixStream) {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), connection.read(&mut byte))
        .await
        .expect("the proxy ends the handoff connection");
    assert!(matches!(read, Ok(0)) || read.is_err(), "{read:?}");
}

/// Waits until `client`, whose other side was sent to the proxy, reads its end: the proxy closed
/// what it was given without serving it.
async fn closed_unread(client: &mut tokio::net::TcpStream) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
        .await
        .expect("the passed socket is closed");
    assert!(read.is_err() || rest.is_empty(), "{rest:?}");
}

/// Asks for a page through a client whose other side the proxy serves.
async fn served(h: &Harness, client: &mut tokio::net::TcpStream) -> Vec<u8> {
    client
        .write_all(format!("GET http://localhost:{}/ HTTP/1.1\r\n\r\n", h.upstream_port).as_bytes())
        .await
        .unwrap();
    answer_of(client).await
}

#[tokio::test]
async fn a_connection_handed_off_is_served_as_one_accepted() {
    let h = start(Reply::Text("handed".into()), Limits::default()).await;
    let connection = UnixStream::connect(&h.handoff).await.unwrap();
    for _ in 0..3 {
        let mut client = hand_off(&connection).await;
        let answer = served(&h, &mut client).await;
        assert_eq!(status(&answer), "HTTP/1.1 200");
        assert!(answer.ends_with(b"handed"), "{answer:?}");
    }
    // The proxy's rules hold for a handed-off client as for one on the socket.
    let mut client = hand_off(&connection).await;
    client
        .write_all(b"GET http://evil.test/ HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(status(&answer_of(&mut client).await), "HTTP/1.1 403");
}

#[tokio::test]
async fn anything_but_a_connected_tcp_socket_is_closed_unread() {
    let h = start(Reply::Text("x".into()), Limits::default()).await;

    // A pipe's read end: once the proxy has closed it, writing the other end fails.
    let (read_end, write_end) = rustix::pipe::pipe().unwrap();
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, &[MARKER], &[read_end.as_fd()]);
    drop(read_end);
    ended(&mut connection).await;
    assert_eq!(
        rustix::io::write(&write_end, b"x"),
        Err(rustix::io::Errno::PIPE)
    );

    // One end of a Unix socket pair: the other end reads its end.
    let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, &[MARKER], &[theirs.as_fd()]);
    drop(theirs);
    ended(&mut connection).await;
    mine.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(io::Read::read(&mut &mine, &mut [0u8; 1]).unwrap(), 0);

    // A listening TCP socket: once closed, nothing accepts on its port.
    let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listening.local_addr().unwrap().port();
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, &[MARKER], &[listening.as_fd()]);
    drop(listening);
    ended(&mut connection).await;
    assert_eq!(
        std::net::TcpStream::connect(("127.0.0.1", port))
            .unwrap_err()
            .kind(),
        io::ErrorKind::ConnectionRefused
    );

    // A regular file, a UDP socket, an unconnected TCP socket: each ends its connection.
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.connect("127.0.0.1:9").unwrap();
    let unconnected: OwnedFd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    for fd in [file.as_fd(), udp.as_fd(), unconnected.as_fd()] {
        let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
        send_raw(&connection, &[MARKER], &[fd]);
        ended(&mut connection).await;
    }

    // Still serving.
    let connection = UnixStream::connect(&h.handoff).await.unwrap();
    let mut client = hand_off(&connection).await;
    assert_eq!(status(&served(&h, &mut client).await), "HTTP/1.1 200");
}

#[tokio::test]
async fn a_message_not_the_marker_with_one_descriptor_ends_its_connection() {
    let h = start(Reply::Text("x".into()), Limits::default()).await;

    // Another byte, with a good socket: closed unread.
    let (mut client, accepted) = tcp_pair().await;
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, b"G", &[accepted.as_fd()]);
    drop(accepted);
    ended(&mut connection).await;
    closed_unread(&mut client).await;

    // Two sockets in one message: both closed unread.
    let (mut first, first_accepted) = tcp_pair().await;
    let (mut second, second_accepted) = tcp_pair().await;
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(
        &connection,
        &[MARKER],
        &[first_accepted.as_fd(), second_accepted.as_fd()],
    );
    drop((first_accepted, second_accepted));
    ended(&mut connection).await;
    closed_unread(&mut first).await;
    closed_unread(&mut second).await;

    // The marker with no descriptor; then the marker twice in one write, with one.
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, &[MARKER], &[]);
    ended(&mut connection).await;
    let (mut client, accepted) = tcp_pair().await;
    let mut connection = UnixStream::connect(&h.handoff).await.unwrap();
    send_raw(&connection, &[MARKER, MARKER], &[accepted.as_fd()]);
    drop(accepted);
    // The first byte carried the descriptor and is served; the second came alone.
    assert_eq!(status(&served(&h, &mut client).await), "HTTP/1.1 200");
    ended(&mut connection).await;
}

#[tokio::test]
async fn handed_off_clients_share_the_connection_cap() {
    let (h, _holder) = start_with_its_only_slot_held().await;
    let connection = UnixStream::connect(&h.handoff).await.unwrap();
    let mut client = hand_off(&connection).await;
    assert_eq!(status(&served(&h, &mut client).await), "HTTP/1.1 503");
}

#[tokio::test]
async fn handoff_connections_past_their_cap_are_closed_at_accept() {
    let h = start(Reply::Text("x".into()), Limits::default()).await;
    let mut held = Vec::new();
    for _ in 0..crate::proxy::MAX_HANDOFF_CONNECTIONS {
        held.push(UnixStream::connect(&h.handoff).await.unwrap());
    }
    let mut over = UnixStream::connect(&h.handoff).await.unwrap();
    ended(&mut over).await;
    // Each held one still hands off.
    let mut client = hand_off(&held[0]).await;
    assert_eq!(status(&served(&h, &mut client).await), "HTTP/1.1 200");
}
