//! One QMP connection: the greeting, capabilities negotiation, then commands in turn, each
//! answer line capped, and a descriptor handed to QEMU with a command when one is needed.
//!
//! A descriptor QEMU takes with `getfd` belongs to the connection that sent it, so a command
//! that names it (`migrate` to `fd:<name>`) must run on that same connection: hence a session,
//! not one connection per command.
//!
//! Not here: deadlines (the caller bounds the whole session).

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::error::VmError;

/// The most QMP may send in one line.
pub(crate) const QMP_LINE_CAP: usize = 1024 * 1024;

/// A negotiated QMP connection.
pub(crate) struct QmpSession {
    path: PathBuf,
    lines: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl QmpSession {
    /// Connects to the monitor at `path` and negotiates capabilities.
    ///
    /// # Errors
    /// Io when the socket cannot be reached; Qmp when QEMU does not greet as QMP;
    /// ChannelClosed when it closes.
    pub(crate) async fn open(path: &Path) -> Result<QmpSession, VmError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| VmError::io("connecting to", path, e))?;
        let (read, write) = stream.into_split();
        let mut session = QmpSession {
            path: path.to_owned(),
            lines: BufReader::new(read),
            write,
        };
        let greeting = session.line().await?;
        if greeting.get("QMP").is_none() {
            return Err(VmError::Qmp {
                message: format!("no greeting: {greeting}"),
            });
        }
        session
            .execute(serde_json::json!({"execute": "qmp_capabilities"}), None)
            .await?;
        Ok(session)
    }

    /// Sends `command` (with `fd` attached, when given) and returns its answer, skipping
    /// events.
    ///
    /// # Errors
    /// Qmp when QEMU answers with an error; Io or ChannelClosed when the connection fails.
    pub(crate) async fn execute(
        &mut self,
        command: serde_json::Value,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<serde_json::Value, VmError> {
        let name = command
            .get("execute")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("(command)")
            .to_owned();
        let mut line = command.to_string().into_bytes();
        line.push(b'\n');
        match fd {
            Some(fd) => self.send_with_fd(&line, fd).await?,
            None => self
                .write
                .write_all(&line)
                .await
                .map_err(|e| VmError::io("writing to", &self.path, e))?,
        }
        loop {
            let answer = self.line().await?;
            if answer.get("event").is_some() {
                continue;
            }
            if let Some(error) = answer.get("error") {
                return Err(VmError::Qmp {
                    message: format!("{name}: {error}"),
                });
            }
            return Ok(answer);
        }
    }

    /// Writes `bytes` with `fd` as `SCM_RIGHTS` on the first byte, the rest plainly.
    async fn send_with_fd(&mut self, bytes: &[u8], fd: BorrowedFd<'_>) -> Result<(), VmError> {
        let stream: &UnixStream = self.write.as_ref();
        let sent = loop {
            stream
                .writable()
                .await
                .map_err(|e| VmError::io("writing to", &self.path, e))?;
            let attempt = stream.try_io(tokio::io::Interest::WRITABLE, || {
                let fds = [fd];
                let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
                if !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
                    return Err(std::io::Error::other("no room for the descriptor"));
                }
                rustix::net::sendmsg(
                    stream,
                    &[IoSlice::new(bytes)],
                    &mut control,
                    rustix::net::SendFlags::NOSIGNAL,
                )
                .map_err(std::io::Error::from)
            });
            match attempt {
                Ok(sent) => break sent,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(VmError::io("writing to", &self.path, e)),
            }
        };
        self.write
            .write_all(&bytes[sent..])
            .await
            .map_err(|e| VmError::io("writing to", &self.path, e))
    }

    async fn line(&mut self) -> Result<serde_json::Value, VmError> {
        let mut line = Vec::new();
        let mut limited = (&mut self.lines).take(QMP_LINE_CAP as u64);
        let n = limited
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| VmError::closed(format!("QMP: {e}")))?;
        if n == 0 {
            return Err(VmError::closed("QMP closed"));
        }
        if !line.ends_with(b"\n") {
            return Err(VmError::Qmp {
                message: format!("a line over {QMP_LINE_CAP} bytes"),
            });
        }
        serde_json::from_slice(&line).map_err(|e| VmError::Qmp {
            message: format!("not JSON: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A stand-in monitor: greets, answers every command with `{"return": {}}` after an event,
    /// and reports the descriptor count each command arrived with.
    #[tokio::test]
    async fn a_command_carries_its_descriptor_and_events_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let monitor = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut out = stream.try_clone().unwrap();
            std::io::Write::write_all(&mut out, b"{\"QMP\": {}}\n").unwrap();
            let mut received = Vec::new();
            for _ in 0..3 {
                let mut buf = [0u8; 4096];
                let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
                let got = rustix::net::recvmsg(
                    &stream,
                    &mut [std::io::IoSliceMut::new(&mut buf)],
                    &mut control,
                    rustix::net::RecvFlags::empty(),
                )
                .unwrap();
                let fds: usize = control
                    .drain()
                    .map(|message| match message {
                        rustix::net::RecvAncillaryMessage::ScmRights(fds) => fds.count(),
                        _ => 0,
                    })
                    .sum();
                received.push((String::from_utf8_lossy(&buf[..got.bytes]).into_owned(), fds));
                std::io::Write::write_all(&mut out, b"{\"event\": \"STOP\"}\n{\"return\": {}}\n")
                    .unwrap();
            }
            received
        });
        let mut session = QmpSession::open(&path).await.unwrap();
        let file = tempfile::tempfile().unwrap();
        let answer = session
            .execute(
                serde_json::json!({"execute": "getfd", "arguments": {"fdname": "x"}}),
                Some(file.as_fd()),
            )
            .await
            .unwrap();
        assert_eq!(answer, serde_json::json!({"return": {}}));
        session
            .execute(serde_json::json!({"execute": "stop"}), None)
            .await
            .unwrap();
        let received = monitor.join().unwrap();
        assert!(received[0].0.contains("qmp_capabilities"));
        assert_eq!(received[0].1, 0);
        assert!(received[1].0.contains("getfd"), "{:?}", received[1]);
        assert_eq!(received[1].1, 1, "the descriptor went with getfd");
        assert!(received[2].0.contains("stop"));
        assert_eq!(received[2].1, 0);
    }
}
