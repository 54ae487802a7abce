//! The guest side: the relay a run starts in the guest, and the client programs use.
//!
//! The relay makes a fresh directory (mode 0700, a random name under the temporary directory),
//! listens on a Unix socket in it, reports `Ready` on its stdout, and forwards each connection's
//! one call to the host over its stdout, routing the host's answers (on its stdin) back by call
//! id. On `Drain` or the end of its stdin it answers what is pending with `run_ended`, removes
//! its directory and exits. It holds no control: the host checks every call.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::dispatch::write_frame;
use crate::frame::{Decoder, FailureCode, Frame, FrameError};
pub use crate::run_directory::{is_run_socket, RUN_DIRECTORY_PREFIX, SOCKET_ENV};

/// The most connections the relay serves at once; more are closed unanswered.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send its call.
const CALL_READ_DEADLINE: Duration = Duration::from_secs(30);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Frame>>>>;

/// Makes the run directory under `parent`: a fresh name, mode 0700, never an existing path.
///
/// # Errors
/// The file system's error, or the random source's.
pub fn make_run_directory(parent: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).map_err(|error| std::io::Error::other(error.to_string()))?;
    let hex: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
    let directory = parent.join(format!("{RUN_DIRECTORY_PREFIX}{hex}"));
    std::fs::DirBuilder::new().mode(0o700).create(&directory)?;
    Ok(directory)
}

/// Runs the relay: `from_host` and `to_host` are its stdin and stdout. Returns when the host
/// drains the run or its stdin ends; the directory is removed either way.
///
/// # Errors
/// Making the directory or the socket; a protocol error from the host ends the relay as an
/// error after the same clean-up.
pub async fn run_relay<R, W>(
    parent: &Path,
    max_frame: usize,
    mut from_host: R,
    to_host: W,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let directory = make_run_directory(parent)?;
    let outcome = serve(&directory, max_frame, &mut from_host, to_host).await;
    let removed = std::fs::remove_dir_all(&directory);
    outcome?;
    removed
}

async fn serve<R, W>(
    directory: &Path,
    max_frame: usize,
    from_host: &mut R,
    mut to_host: W,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let socket = directory.join("socket");
    let listener = UnixListener::bind(&socket)?;
    let socket_text = socket
        .to_str()
        .ok_or_else(|| std::io::Error::other("the run directory's path is not UTF-8"))?
        .to_owned();
    write_frame(
        &mut to_host,
        &Frame::Ready {
            socket: socket_text,
        },
    )
    .await?;

    // One writer of the host's channel: calls from every connection, in order of arrival.
    let (calls, mut outgoing) = mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if write_frame(&mut to_host, &frame).await.is_err() {
                break;
            }
        }
    });
    let pending: Pending = Arc::default();
    let mut connections = tokio::task::JoinSet::new();
    let mut decoder = Decoder::new(max_frame);
    let mut buffer = vec![0u8; 16 * 1024];
    let mut next_id = 0u64;
    let ended: std::io::Result<()> = loop {
        tokio::select! {
            read = from_host.read(&mut buffer) => {
                let read = match read {
                    Ok(0) => break Ok(()),
                    Ok(read) => read,
                    Err(error) => break Err(error),
                };
                match route(&mut decoder, &buffer[..read], &pending) {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(error) => break Err(std::io::Error::other(error.to_string())),
                }
            }
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                while connections.try_join_next().is_some() {}
                if connections.len() >= MAX_CONNECTIONS {
                    drop(stream);
                    continue;
                }
                next_id += 1;
                let (answer, answered) = oneshot::channel();
                pending.lock().unwrap_or_else(|p| p.into_inner()).insert(next_id, answer);
                connections.spawn(connection(
                    stream,
                    next_id,
                    max_frame,
                    calls.clone(),
                    answered,
                    pending.clone(),
                ));
            }
        }
    };
    drop(listener);
    // Whatever is still pending learns the run ended.
    let waiting: Vec<(u64, oneshot::Sender<Frame>)> = pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain()
        .collect();
    for (id, answer) in waiting {
        let _ = answer.send(Frame::Failure {
            id,
            code: FailureCode::RunEnded,
            message: "the run ended".to_owned(),
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    drop(calls);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    ended
}

/// Routes the host's frames to the waiting connections. `Ok(false)` on `Drain`.
fn route(decoder: &mut Decoder, bytes: &[u8], pending: &Pending) -> Result<bool, FrameError> {
    for frame in decoder.feed_all(bytes)? {
        match frame {
            Frame::Drain => return Ok(false),
            Frame::Result { id, .. } | Frame::Failure { id, .. } => {
                let answer = pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                if let Some(answer) = answer {
                    let _ = answer.send(frame);
                }
            }
            Frame::Call { .. } | Frame::Ready { .. } => {
                return Err(FrameError::Payload(
                    "the host sent a frame only the guest sends".to_owned(),
                ))
            }
        }
    }
    Ok(true)
}

async fn connection(
    mut stream: UnixStream,
    id: u64,
    max_frame: usize,
    calls: mpsc::Sender<Frame>,
    answered: oneshot::Receiver<Frame>,
    pending: Pending,
) {
    let forget = || {
        pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    };
    let call = tokio::time::timeout(CALL_READ_DEADLINE, read_frame(&mut stream, max_frame)).await;
    let (client_id, tool, arguments) = match call {
        Ok(Ok(Some(Frame::Call {
            id,
            tool,
            arguments,
        }))) => (id, tool, arguments),
        _ => {
            forget();
            return;
        }
    };
    let reply = if calls
        .send(Frame::Call {
            id,
            tool,
            arguments,
        })
        .await
        .is_err()
    {
        forget();
        Frame::Failure {
            id,
            code: FailureCode::RunEnded,
            message: "the run ended".to_owned(),
        }
    } else {
        answered.await.unwrap_or(Frame::Failure {
            id,
            code: FailureCode::RunEnded,
            message: "the run ended".to_owned(),
        })
    };
    let reply = match reply {
        Frame::Result { value, .. } => Frame::Result {
            id: client_id,
            value,
        },
        Frame::Failure { code, message, .. } => Frame::Failure {
            id: client_id,
            code,
            message,
        },
        other => other,
    };
    let _ = write_frame(&mut stream, &reply).await;
}

/// Reads one frame, or `None` when the stream ends first.
async fn read_frame<R: AsyncRead + Unpin>(
    from: &mut R,
    max_frame: usize,
) -> std::io::Result<Option<Frame>> {
    let mut decoder = Decoder::new(max_frame);
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return Ok(None);
        }
        let mut rest = &buffer[..read];
        while !rest.is_empty() {
            let (consumed, frame) = decoder.feed(rest);
            if let Some(frame) = frame.map_err(|error| std::io::Error::other(error.to_string()))? {
                return Ok(Some(frame));
            }
            rest = &rest[consumed..];
        }
    }
}

/// A call's outcome as the client sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The tool's result.
    Result(Value),
    /// The host's or the relay's refusal.
    Failure(FailureCode, String),
}

/// Calls `tool` through the relay listening at `socket`.
///
/// # Errors
/// Connecting, writing or reading the socket; a reply that is not an answer.
pub async fn call(
    socket: &Path,
    tool: &str,
    arguments: Value,
    max_frame: usize,
) -> std::io::Result<CallOutcome> {
    let mut stream = UnixStream::connect(socket).await?;
    write_frame(
        &mut stream,
        &Frame::Call {
            id: 1,
            tool: tool.to_owned(),
            arguments,
        },
    )
    .await?;
    match read_frame(&mut stream, max_frame).await? {
        Some(Frame::Result { value, .. }) => Ok(CallOutcome::Result(value)),
        Some(Frame::Failure { code, message, .. }) => Ok(CallOutcome::Failure(code, message)),
        Some(_) => Err(std::io::Error::other(
            "the relay answered with a non-answer frame",
        )),
        None => Err(std::io::Error::other(
            "the relay closed the call unanswered",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_directories_are_private_and_fresh() {
        use std::os::unix::fs::PermissionsExt as _;
        let parent = tempfile::tempdir().unwrap();
        let one = make_run_directory(parent.path()).unwrap();
        let two = make_run_directory(parent.path()).unwrap();
        assert_ne!(one, two);
        let mode = std::fs::metadata(&one).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let socket = one.join("socket");
        assert!(is_run_socket(socket.to_str().unwrap()));
    }
}
