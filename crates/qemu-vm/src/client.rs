//! The host side of the agent protocol: one connection, many requests.
//!
//! A reader task decodes the guest's frames and routes each to its request by id; whatever
//! the guest sends is bounded: a frame by the decoder, a request's buffered frames by its
//! window (data is credited back only as the caller consumes it), the handshake search by
//! [`HANDSHAKE_SCAN_CAP`]. The first malformed frame closes the connection and every request
//! on it fails with [`VmError::Protocol`]; frames for ids no request owns are dropped.
//!
//! Not here: QEMU (see [`crate::Vm`]); retries (a closed client stays closed; connect again).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use vm_agent::proto::{
    encode, hello_ack_bytes, Entry, ExecRequest, ExitStatus, FrameDecoder, GuestMsg, HostMsg, Stat,
    CHUNK, MAX_PAYLOAD, WINDOW,
};

use crate::error::VmError;
use crate::ports::PortLease;

/// The most bytes the handshake answer is searched for in (what an earlier connection left
/// on the port comes first).
pub const HANDSHAKE_SCAN_CAP: usize = 8 * 1024 * 1024;

/// What one request may have buffered and not yet consumed: its data window plus room for
/// control frames.
const ROUTE_CAP: u64 = WINDOW as u64 + 2 * MAX_PAYLOAD as u64;

/// The deadline of the driver's own small requests (reclaim, shutdown); a file call (stat,
/// list, remove, read, write) takes its caller's.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `work` bounded by `deadline`; past it, [`VmError::Deadline`] naming `what`.
async fn within<T>(
    what: &'static str,
    deadline: Duration,
    work: impl std::future::Future<Output = T>,
) -> Result<T, VmError> {
    tokio::time::timeout(deadline, work)
        .await
        .map_err(|_| VmError::Deadline {
            what,
            after: deadline,
        })
}

/// How many bytes of host entropy a renewal gives the guest: twice the generator's key.
pub const RENEW_ENTROPY: usize = 64;

/// The most entries [`AgentClient::list`] collects.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// The most bytes of a listing [`AgentClient::list`] collects: every entry's name plus
/// [`LIST_ENTRY_OVERHEAD`]. A guest's names are its own bytes, of any length the protocol's frame
/// allows, so the entry count alone does not bound the memory a listing takes; this holds
/// [`MAX_LIST_ENTRIES`] entries with names of Linux's longest (255 bytes).
pub const MAX_LIST_BYTES: u64 = 32 * 1024 * 1024;

/// What an entry counts towards [`MAX_LIST_BYTES`] beyond its name (its kind and size).
pub const LIST_ENTRY_OVERHEAD: u64 = 16;

struct Route {
    sender: mpsc::UnboundedSender<(GuestMsg, u64)>,
    buffered: Arc<std::sync::atomic::AtomicU64>,
    /// Credit for the input this request sends (stdin, a written file).
    input_credit: Arc<Semaphore>,
}

/// Why a connection closed, kept so every request on it fails with the same typed error.
#[derive(Debug, Clone)]
enum Closed {
    Protocol(vm_agent::proto::ProtoError),
    Overrun { buffered: u64, window: u64 },
    Other(String),
}

impl From<String> for Closed {
    fn from(reason: String) -> Closed {
        Closed::Other(reason)
    }
}

/// Frames queued for the writer task at most (flow control is by credit; this only bounds how
/// far the senders run ahead of the socket).
const QUEUED_FRAMES: usize = 16;

struct Shared {
    /// Whole frames for the writer task, the only writer of the socket: a sender whose future
    /// is dropped has queued its frame whole or not at all, so a cancelled call never leaves
    /// half a frame on the stream (which would break every later frame of the session).
    frames: mpsc::Sender<Vec<u8>>,
    routes: Mutex<HashMap<u32, Route>>,
    next_id: AtomicU32,
    closed: Mutex<Option<Closed>>,
}

impl Shared {
    fn close(&self, reason: impl Into<Closed>) {
        let reason = reason.into();
        if let Ok(mut closed) = self.closed.lock() {
            closed.get_or_insert(reason);
        }
        if let Ok(mut routes) = self.routes.lock() {
            routes.clear();
        }
    }

    fn closed_error(&self) -> VmError {
        let reason = self
            .closed
            .lock()
            .ok()
            .and_then(|closed| closed.clone())
            .unwrap_or_else(|| Closed::Other("closed".to_owned()));
        match reason {
            Closed::Protocol(error) => VmError::Protocol(error),
            Closed::Overrun { buffered, window } => VmError::WindowOverrun { buffered, window },
            Closed::Other(reason) => VmError::closed(reason),
        }
    }

    async fn send(&self, id: u32, message: &HostMsg) -> Result<(), VmError> {
        if self.closed.lock().map(|c| c.is_some()).unwrap_or(true) {
            return Err(self.closed_error());
        }
        let frame = encode(id, message);
        self.frames
            .send(frame)
            .await
            .map_err(|_| self.closed_error())
    }
}

/// The lock of the agent port a connection holds (see `crate::ports`): the reader and the
/// writer task each keep a clone, so the port is let go of only once both halves of the socket
/// are closed, and the next holder's connect is the next one QEMU accepts.
type PortHold = Option<Arc<std::fs::File>>;

/// Writes queued frames to the socket, each whole, until the senders are gone or a write
/// fails (which closes the connection for every request).
async fn write_loop(
    write: OwnedWriteHalf,
    frames: mpsc::Receiver<Vec<u8>>,
    shared: std::sync::Weak<Shared>,
    hold: PortHold,
) {
    let mut write = write;
    let mut frames = frames;
    while let Some(frame) = frames.recv().await {
        if let Err(error) = write.write_all(&frame).await {
            if let Some(shared) = shared.upgrade() {
                shared.close(format!("writing to the agent: {error}"));
            }
            break;
        }
    }
    drop(write);
    drop(hold);
}

/// The reader task: aborted once nothing can use the connection any more (no client, no
/// request), which drops the reader's half of the socket and, with the writer's end, the
/// connection.
struct ReaderTask(tokio::task::JoinHandle<()>);

impl Drop for ReaderTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection to a guest agent. Cloning shares the connection; it closes once every clone
/// and every request it started (an [`Exec`] included) are dropped.
#[derive(Clone)]
pub struct AgentClient {
    shared: Arc<Shared>,
    reader: Arc<ReaderTask>,
    port: Option<u32>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// A reference to a connection that does not keep it open (see [`AgentClient::downgrade`]).
#[derive(Clone)]
pub struct WeakAgentClient {
    shared: std::sync::Weak<Shared>,
    reader: std::sync::Weak<ReaderTask>,
    port: Option<u32>,
}

impl std::fmt::Debug for WeakAgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeakAgentClient")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl WeakAgentClient {
    /// The connection, while some clone of it or a request of it still holds it open.
    pub fn upgrade(&self) -> Option<AgentClient> {
        Some(AgentClient {
            shared: self.shared.upgrade()?,
            reader: self.reader.upgrade()?,
            port: self.port,
        })
    }
}

/// How an exec is bounded on the host.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// The most stdout plus stderr bytes collected; past it the exec is killed and the call
    /// fails with [`VmError::OutputLimit`].
    pub output_cap: u64,
    /// The host's deadline for the whole call; past it the exec is killed and the call fails
    /// with [`VmError::Deadline`]. The guest-side limit is the request's `timeout_ms`.
    pub deadline: Duration,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            output_cap: 64 * 1024 * 1024,
            deadline: Duration::from_secs(600),
        }
    }
}

/// A finished exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// How it ended.
    pub status: ExitStatus,
    /// Every stdout byte.
    pub stdout: Vec<u8>,
    /// Every stderr byte.
    pub stderr: Vec<u8>,
}

/// What a running exec produces.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecEvent {
    /// A stdout chunk.
    Stdout(Vec<u8>),
    /// A stderr chunk.
    Stderr(Vec<u8>),
    /// The end; no event follows.
    Exited(ExitStatus),
}

/// One request's end of the connection.
struct Call {
    shared: Arc<Shared>,
    /// Keeps the connection open while the request runs, even once every client is dropped.
    _reader: Arc<ReaderTask>,
    id: u32,
    receiver: mpsc::UnboundedReceiver<(GuestMsg, u64)>,
    buffered: Arc<std::sync::atomic::AtomicU64>,
    input_credit: Arc<Semaphore>,
    finished: bool,
}

impl Call {
    /// The next message, its buffered size released; data sizes are credited back.
    async fn next(&mut self) -> Result<GuestMsg, VmError> {
        match self.receiver.recv().await {
            Some((message, size)) => {
                self.buffered.fetch_sub(size, Ordering::SeqCst);
                if let GuestMsg::Stdout(bytes) | GuestMsg::Stderr(bytes) | GuestMsg::Data(bytes) =
                    &message
                {
                    if !bytes.is_empty() {
                        self.shared
                            .send(self.id, &HostMsg::Credit(bytes.len() as u32))
                            .await?;
                    }
                }
                Ok(message)
            }
            None => Err(self.shared.closed_error()),
        }
    }

    async fn send_data(&self, bytes: &[u8]) -> Result<(), VmError> {
        send_data(&self.shared, &self.input_credit, self.id, bytes).await
    }
}

/// Sends `bytes` as `Data` frames of request `id`, each after its credit arrived.
async fn send_data(
    shared: &Shared,
    credit: &Semaphore,
    id: u32,
    bytes: &[u8],
) -> Result<(), VmError> {
    for chunk in bytes.chunks(CHUNK) {
        let permits = credit
            .acquire_many(chunk.len() as u32)
            .await
            .map_err(|_| shared.closed_error())?;
        permits.forget();
        shared.send(id, &HostMsg::Data(chunk.to_vec())).await?;
    }
    Ok(())
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.shared.routes.lock() {
            routes.remove(&self.id);
        }
        if !self.finished {
            // An abandoned exec must not run on: kill its group (best effort, the connection
            // may be gone).
            let shared = Arc::clone(&self.shared);
            let id = self.id;
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = shared.send(id, &HostMsg::Kill).await;
                });
            }
        }
    }
}

impl AgentClient {
    /// Connects to the agent socket at `path` and completes the handshake within `timeout`.
    /// No port lock is taken: [`crate::Vm::agent`] is the way to share a VM with other
    /// processes.
    ///
    /// # Errors
    /// Io when the socket cannot be reached; Deadline when no answer comes in time;
    /// Handshake when the guest sends [`HANDSHAKE_SCAN_CAP`] bytes without the answer;
    /// ChannelClosed when the guest closes.
    ///
    /// # Cancel safety and drop
    /// Dropping the future closes the connection.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<AgentClient, VmError> {
        AgentClient::connect_holding(path, timeout, None, None).await
    }

    /// As [`AgentClient::connect`] on the port `lease` holds; the connection keeps the lease's
    /// lock until it closes.
    pub(crate) async fn connect_leased(
        lease: PortLease,
        timeout: Duration,
    ) -> Result<AgentClient, VmError> {
        let PortLease {
            index,
            socket,
            lock,
        } = lease;
        AgentClient::connect_holding(&socket, timeout, Some(index), Some(Arc::new(lock))).await
    }

    async fn connect_holding(
        path: &Path,
        timeout: Duration,
        port: Option<u32>,
        hold: PortHold,
    ) -> Result<AgentClient, VmError> {
        let handshake = async {
            let stream = UnixStream::connect(path)
                .await
                .map_err(|e| VmError::io("connecting to", path, e))?;
            let (mut read, mut write) = stream.into_split();
            let mut nonce = [0u8; 16];
            getrandom::fill(&mut nonce)
                .map_err(|e| VmError::Invalid(format!("no entropy for the nonce: {e}")))?;
            write
                .write_all(&encode(0, &HostMsg::Hello { nonce }))
                .await
                .map_err(|e| VmError::io("writing to", path, e))?;
            let ack = hello_ack_bytes(nonce);
            let mut decoder = FrameDecoder::<GuestMsg>::new();
            let mut scanned = 0usize;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = read
                    .read(&mut buf)
                    .await
                    .map_err(|e| VmError::closed(format!("reading the handshake: {e}")))?;
                if n == 0 {
                    return Err(VmError::closed("the guest closed during the handshake"));
                }
                scanned += n;
                decoder.push(&buf[..n]);
                if decoder.skip_to(&ack) {
                    // Consume the answer itself; what follows is this session's.
                    decoder.next_message()?;
                    return Ok((read, write, decoder));
                }
                if scanned > HANDSHAKE_SCAN_CAP {
                    return Err(VmError::Handshake { scanned });
                }
            }
        };
        let (read, write, decoder) = within("the agent handshake", timeout, handshake).await??;
        let (frames, queued) = mpsc::channel(QUEUED_FRAMES);
        let shared = Arc::new(Shared {
            frames,
            routes: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            closed: Mutex::new(None),
        });
        tokio::spawn(write_loop(
            write,
            queued,
            Arc::downgrade(&shared),
            hold.clone(),
        ));
        let reader = tokio::spawn(read_loop(read, decoder, Arc::clone(&shared), hold));
        Ok(AgentClient {
            shared,
            reader: Arc::new(ReaderTask(reader)),
            port,
        })
    }

    /// The agent port this connection holds, when it was made by [`crate::Vm::agent`].
    pub fn port(&self) -> Option<u32> {
        self.port
    }

    /// A reference that does not keep the connection (and its port) open.
    pub fn downgrade(&self) -> WeakAgentClient {
        WeakAgentClient {
            shared: Arc::downgrade(&self.shared),
            reader: Arc::downgrade(&self.reader),
            port: self.port,
        }
    }

    /// Whether the connection is closed (a protocol error, the guest or QEMU gone).
    pub fn is_closed(&self) -> bool {
        self.shared
            .closed
            .lock()
            .map(|c| c.is_some())
            .unwrap_or(true)
    }

    async fn call(&self, message: &HostMsg) -> Result<Call, VmError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = mpsc::unbounded_channel();
        let buffered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let input_credit = Arc::new(Semaphore::new(WINDOW as usize));
        {
            let mut routes = self
                .shared
                .routes
                .lock()
                .map_err(|_| VmError::closed("poisoned"))?;
            if self.is_closed() {
                return Err(self.shared.closed_error());
            }
            routes.insert(
                id,
                Route {
                    sender,
                    buffered: Arc::clone(&buffered),
                    input_credit: Arc::clone(&input_credit),
                },
            );
        }
        let call = Call {
            shared: Arc::clone(&self.shared),
            _reader: Arc::clone(&self.reader),
            id,
            receiver,
            buffered,
            input_credit,
            finished: true,
        };
        self.shared.send(id, message).await?;
        Ok(call)
    }

    /// Runs a process to its end: `stdin` streamed in (with backpressure), output collected
    /// up to `limits.output_cap`.
    ///
    /// # Errors
    /// Agent when the guest cannot start it (not found: `code` NotFound); OutputLimit or
    /// Deadline (the exec is killed first); Protocol, Unexpected, WindowOverrun or
    /// ChannelClosed when the guest misbehaves or goes away.
    ///
    /// # Cancel safety and drop
    /// Dropping the future kills the exec's whole group in the guest (best effort when the
    /// connection is gone).
    pub async fn run(
        &self,
        request: ExecRequest,
        stdin: Option<&[u8]>,
        limits: RunLimits,
    ) -> Result<ExecOutput, VmError> {
        let mut request = request;
        request.stdin = stdin.is_some();
        // The deadline covers the start too: a guest that never answers `Started` is bounded.
        let deadline = tokio::time::Instant::now() + limits.deadline;
        let past_deadline = || VmError::Deadline {
            what: "an exec",
            after: limits.deadline,
        };
        let mut exec = tokio::time::timeout_at(deadline, self.exec(request))
            .await
            .map_err(|_| past_deadline())??;
        let shared = Arc::clone(&exec.call.shared);
        let credit = Arc::clone(&exec.call.input_credit);
        let id = exec.call.id;
        let work = async {
            let feed = async {
                if let Some(bytes) = stdin {
                    send_data(&shared, &credit, id, bytes).await?;
                    shared.send(id, &HostMsg::Eof).await?;
                }
                Ok::<(), VmError>(())
            };
            // Once fed (or failed: the process closed stdin), the feed idles; the call ends
            // with the exec, even when stdin was never wholly taken.
            let feed = async {
                let _ = feed.await;
                std::future::pending::<()>().await;
            };
            let collect = async {
                let mut stdout = Vec::new();
                let mut stderr = Vec::new();
                loop {
                    let event = next_event(&mut exec.call).await?;
                    match event {
                        ExecEvent::Stdout(bytes) => stdout.extend_from_slice(&bytes),
                        ExecEvent::Stderr(bytes) => stderr.extend_from_slice(&bytes),
                        ExecEvent::Exited(status) => {
                            return Ok(ExecOutput {
                                status,
                                stdout,
                                stderr,
                            })
                        }
                    }
                    if (stdout.len() + stderr.len()) as u64 > limits.output_cap {
                        return Err(VmError::OutputLimit {
                            limit: limits.output_cap,
                        });
                    }
                }
            };
            // Output is collected while stdin is fed, so a process that writes before it
            // reads never deadlocks.
            tokio::select! {
                collected = collect => collected,
                () = feed => Err(VmError::unexpected("the stdin feed ended the call")),
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(Ok(output)) => {
                exec.call.finished = true;
                Ok(output)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(past_deadline()),
        }
    }

    /// Starts a process and returns its stream of events.
    ///
    /// # Errors
    /// Agent when the guest refuses to start it; ChannelClosed or Protocol otherwise.
    ///
    /// # Cancel safety and drop
    /// Dropping the returned [`Exec`] before its `Exited` event kills its group.
    pub async fn exec(&self, request: ExecRequest) -> Result<Exec, VmError> {
        if request.argv.is_empty() {
            return Err(VmError::Invalid("empty argv".to_owned()));
        }
        let mut call = self.call(&HostMsg::Exec(request)).await?;
        call.finished = false;
        match call.next().await? {
            GuestMsg::Started { pid } => Ok(Exec { call, pid }),
            GuestMsg::Error { code, message } => {
                call.finished = true;
                Err(VmError::Agent { code, message })
            }
            other => Err(VmError::unexpected(format!("{other:?} instead of Started"))),
        }
    }

    /// Stats a path in the guest (a final symlink is not followed), within `deadline`.
    ///
    /// # Errors
    /// Agent (NotFound, ...), Deadline, or a channel error.
    pub async fn stat(&self, path: &[u8], deadline: Duration) -> Result<Stat, VmError> {
        self.small(
            "stat",
            HostMsg::Stat {
                path: path.to_vec(),
            },
            |m| match m {
                GuestMsg::Stat(stat) => Some(stat),
                _ => None,
            },
            deadline,
        )
        .await
    }

    /// Removes a file, or a directory (with its contents when `recursive`), within `deadline`
    /// (a large tree takes long under emulation).
    ///
    /// # Errors
    /// Agent, Deadline, or a channel error.
    pub async fn remove(
        &self,
        path: &[u8],
        recursive: bool,
        deadline: Duration,
    ) -> Result<(), VmError> {
        self.small(
            "remove",
            HostMsg::Remove {
                path: path.to_vec(),
                recursive,
            },
            |m| matches!(m, GuestMsg::Done).then_some(()),
            deadline,
        )
        .await
    }

    /// Drops the guest's caches; returns `MemAvailable` before and after, KiB.
    ///
    /// # Errors
    /// A channel error.
    pub async fn reclaim(&self) -> Result<(u64, u64), VmError> {
        self.small(
            "reclaim",
            HostMsg::Reclaim,
            |m| match m {
                GuestMsg::Reclaimed {
                    before_kib,
                    after_kib,
                } => Some((before_kib, after_kib)),
                _ => None,
            },
            CALL_TIMEOUT,
        )
        .await
    }

    /// Makes a guest restored from a saved state a machine of its own (`HostMsg::Renew`): fresh
    /// entropy from this host's generator ([`RENEW_ENTROPY`] bytes) credited and the guest's
    /// generator reseeded, its clock set to this host's, `identity` its host name.
    ///
    /// # Errors
    /// Invalid for an identity the protocol refuses or no host entropy; Agent when the guest
    /// cannot do one of the three; Deadline past `deadline`; a channel error.
    pub(crate) async fn renew(&self, identity: &str, deadline: Duration) -> Result<(), VmError> {
        if !vm_agent::proto::valid_identity(identity.as_bytes()) {
            return Err(VmError::Invalid(format!(
                "the identity {identity:?} is not a host name of at most {} characters",
                vm_agent::proto::MAX_IDENTITY
            )));
        }
        let mut entropy = vec![0u8; RENEW_ENTROPY];
        getrandom::fill(&mut entropy)
            .map_err(|e| VmError::Invalid(format!("no host entropy for the guest: {e}")))?;
        let unix_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.small(
            "renew",
            HostMsg::Renew {
                entropy,
                unix_nanos,
                identity: identity.as_bytes().to_vec(),
            },
            |m| matches!(m, GuestMsg::Done).then_some(()),
            deadline,
        )
        .await
    }

    /// Waits for a guest process to connect to `127.0.0.1:port` in the guest (the agent
    /// listens there from the first call for the port on) and returns that connection as a
    /// local stream: what is written to it reaches the guest process, what the guest process
    /// sends is read from it, and a shutdown of either side's writing reaches the other. A task
    /// of the current runtime carries the bytes until both ways ended.
    ///
    /// # Errors
    /// Invalid for port 0; Agent when the guest cannot listen on the port (a guest process
    /// holds it); a channel error.
    ///
    /// # Cancel safety and drop
    /// Dropping the future stops the wait in the guest. Dropping the returned stream closes
    /// the guest process's connection.
    pub async fn accept(&self, port: u16) -> Result<tokio::io::DuplexStream, VmError> {
        if port == 0 {
            return Err(VmError::Invalid("port 0".to_owned()));
        }
        let mut call = self.call(&HostMsg::Accept { port }).await?;
        call.finished = false;
        match call.next().await? {
            GuestMsg::Connected => {}
            GuestMsg::Error { code, message } => {
                call.finished = true;
                return Err(VmError::Agent { code, message });
            }
            other => {
                return Err(VmError::unexpected(format!(
                    "{other:?} instead of Connected"
                )))
            }
        }
        let (local, carried) = tokio::io::duplex(CHUNK);
        tokio::spawn(carry(call, carried));
        Ok(local)
    }

    /// Asks the guest to power off (it answers first).
    ///
    /// # Errors
    /// A channel error.
    pub async fn shutdown(&self) -> Result<(), VmError> {
        self.small(
            "shutdown",
            HostMsg::Shutdown,
            |m| matches!(m, GuestMsg::Done).then_some(()),
            CALL_TIMEOUT,
        )
        .await
    }

    async fn small<T>(
        &self,
        what: &'static str,
        message: HostMsg,
        pick: impl Fn(GuestMsg) -> Option<T>,
        deadline: Duration,
    ) -> Result<T, VmError> {
        let work = async {
            let mut call = self.call(&message).await?;
            let answer = call.next().await?;
            if let GuestMsg::Error { code, message } = answer {
                return Err(VmError::Agent { code, message });
            }
            pick(answer.clone())
                .ok_or_else(|| VmError::unexpected(format!("{answer:?} answering {what}")))
        };
        within(what, deadline, work).await?
    }

    /// Lists a directory, at most [`MAX_LIST_ENTRIES`] entries and [`MAX_LIST_BYTES`], within
    /// `deadline`.
    ///
    /// # Errors
    /// Agent, OutputLimit past either cap (the listing's bytes as the limit past the second),
    /// Deadline, or a channel error.
    pub async fn list(&self, path: &[u8], deadline: Duration) -> Result<Vec<Entry>, VmError> {
        let work = async {
            let mut call = self
                .call(&HostMsg::List {
                    path: path.to_vec(),
                })
                .await?;
            let mut entries = Vec::new();
            let mut bytes = 0u64;
            loop {
                match call.next().await? {
                    GuestMsg::Entries(batch) => {
                        bytes += batch
                            .iter()
                            .map(|entry| entry.name.len() as u64 + LIST_ENTRY_OVERHEAD)
                            .sum::<u64>();
                        if bytes > MAX_LIST_BYTES {
                            return Err(VmError::OutputLimit {
                                limit: MAX_LIST_BYTES,
                            });
                        }
                        entries.extend(batch);
                    }
                    GuestMsg::Done => return Ok(entries),
                    GuestMsg::Error { code, message } => {
                        return Err(VmError::Agent { code, message })
                    }
                    other => return Err(VmError::unexpected(format!("{other:?} in a listing"))),
                }
                if entries.len() > MAX_LIST_ENTRIES {
                    return Err(VmError::OutputLimit {
                        limit: MAX_LIST_ENTRIES as u64,
                    });
                }
            }
        };
        within("list", deadline, work).await?
    }

    /// Reads a whole file, at most `cap` bytes, within `deadline`. The agent is asked for one
    /// byte past `cap`, so a larger file is refused after `cap + 1` bytes, not after all of it.
    ///
    /// # Errors
    /// Agent, OutputLimit past `cap`, Deadline, or a channel error.
    pub async fn read_file(
        &self,
        path: &[u8],
        cap: u64,
        deadline: Duration,
    ) -> Result<Vec<u8>, VmError> {
        self.read(path, cap, false, deadline).await
    }

    /// The first `cap` bytes of a regular file (all of it when it is no larger), never an
    /// error for its size. The agent stops at `cap`: the rest of the file never crosses the
    /// channel.
    ///
    /// # Errors
    /// As [`read_file`](Self::read_file), less the cap.
    pub async fn read_head(
        &self,
        path: &[u8],
        cap: u64,
        deadline: Duration,
    ) -> Result<Vec<u8>, VmError> {
        self.read(path, cap, true, deadline).await
    }

    async fn read(
        &self,
        path: &[u8],
        cap: u64,
        head: bool,
        deadline: Duration,
    ) -> Result<Vec<u8>, VmError> {
        let work = async {
            let mut call = self
                .call(&HostMsg::Read {
                    path: path.to_vec(),
                    limit: if head { cap } else { cap.saturating_add(1) },
                })
                .await?;
            let mut data = Vec::new();
            loop {
                match call.next().await? {
                    GuestMsg::Data(bytes) => {
                        if (data.len() + bytes.len()) as u64 > cap {
                            if !head {
                                return Err(VmError::OutputLimit { limit: cap });
                            }
                            let room = usize::try_from(cap)
                                .unwrap_or(usize::MAX)
                                .saturating_sub(data.len());
                            data.extend_from_slice(&bytes[..room.min(bytes.len())]);
                        } else {
                            data.extend_from_slice(&bytes);
                        }
                    }
                    GuestMsg::Done => return Ok(data),
                    GuestMsg::Error { code, message } => {
                        return Err(VmError::Agent { code, message })
                    }
                    other => return Err(VmError::unexpected(format!("{other:?} in a read"))),
                }
            }
        };
        within("read", deadline, work).await?
    }

    /// Writes a file from `source` (created with `mode`, truncated), within `deadline`;
    /// returns the bytes written.
    ///
    /// # Errors
    /// Agent, Io when `source` fails, Deadline, or a channel error.
    pub async fn write_file(
        &self,
        path: &[u8],
        mode: u32,
        mut source: impl AsyncRead + Unpin,
        deadline: Duration,
    ) -> Result<u64, VmError> {
        let work = async {
            let mut call = self
                .call(&HostMsg::Write {
                    path: path.to_vec(),
                    mode,
                })
                .await?;
            let mut buf = vec![0u8; CHUNK];
            let mut total = 0u64;
            loop {
                // An early refusal (the file cannot be created) arrives while data flows.
                if let Ok((GuestMsg::Error { code, message }, _)) = call.receiver.try_recv() {
                    return Err(VmError::Agent { code, message });
                }
                let n = source
                    .read(&mut buf)
                    .await
                    .map_err(|e| VmError::io("reading the source of", Path::new("(write)"), e))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                let credit = Arc::clone(&call.input_credit);
                let permits = tokio::select! {
                    permits = credit.acquire_many(n as u32) => {
                        permits.map_err(|_| call.shared.closed_error())?
                    }
                    message = call.next() => {
                        return Err(match message? {
                            GuestMsg::Error { code, message } => VmError::Agent { code, message },
                            other => VmError::unexpected(format!("{other:?} during a write")),
                        });
                    }
                };
                permits.forget();
                call.shared
                    .send(call.id, &HostMsg::Data(buf[..n].to_vec()))
                    .await?;
            }
            call.shared.send(call.id, &HostMsg::Eof).await?;
            match call.next().await? {
                GuestMsg::Done => Ok(total),
                GuestMsg::Error { code, message } => Err(VmError::Agent { code, message }),
                other => Err(VmError::unexpected(format!("{other:?} ending a write"))),
            }
        };
        within("write", deadline, work).await?
    }
}

/// A running exec.
pub struct Exec {
    call: Call,
    pid: u32,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("id", &self.call.id)
            .field("pid", &self.pid)
            .finish()
    }
}

impl Exec {
    /// The process's pid in the guest.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event; after `Exited`, none.
    ///
    /// # Errors
    /// Protocol, Unexpected, WindowOverrun or ChannelClosed.
    ///
    /// # Cancel safety
    /// Cancel-safe: an event not yet returned stays queued.
    pub async fn next_event(&mut self) -> Result<ExecEvent, VmError> {
        let event = next_event(&mut self.call).await?;
        if matches!(event, ExecEvent::Exited(_)) {
            self.call.finished = true;
        }
        Ok(event)
    }

    /// Streams `bytes` to stdin (the exec must have been started with `stdin: true`), each
    /// chunk after the guest's credit for it.
    ///
    /// # Errors
    /// A channel error.
    pub async fn write_stdin(&self, bytes: &[u8]) -> Result<(), VmError> {
        self.call.send_data(bytes).await
    }

    /// Closes stdin.
    ///
    /// # Errors
    /// A channel error.
    pub async fn close_stdin(&self) -> Result<(), VmError> {
        self.call.shared.send(self.call.id, &HostMsg::Eof).await
    }

    /// A writer of this exec's stdin that another task can own, so stdin is fed while the
    /// events are read.
    pub fn stdin_writer(&self) -> StdinWriter {
        StdinWriter {
            shared: Arc::clone(&self.call.shared),
            credit: Arc::clone(&self.call.input_credit),
            id: self.call.id,
        }
    }

    /// Kills every process of the exec; its `Exited` event follows.
    ///
    /// # Errors
    /// A channel error.
    pub async fn kill(&self) -> Result<(), VmError> {
        self.call.shared.send(self.call.id, &HostMsg::Kill).await
    }
}

/// Feeds one exec's stdin (see [`Exec::stdin_writer`]).
pub struct StdinWriter {
    shared: Arc<Shared>,
    credit: Arc<Semaphore>,
    id: u32,
}

impl std::fmt::Debug for StdinWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdinWriter").field("id", &self.id).finish()
    }
}

impl StdinWriter {
    /// Streams `bytes`, each chunk after the guest's credit for it (so a process that stops
    /// reading stops the writer, never the host's memory).
    ///
    /// # Errors
    /// A channel error.
    pub async fn write(&self, bytes: &[u8]) -> Result<(), VmError> {
        send_data(&self.shared, &self.credit, self.id, bytes).await
    }

    /// Closes stdin.
    ///
    /// # Errors
    /// A channel error.
    pub async fn close(&self) -> Result<(), VmError> {
        self.shared.send(self.id, &HostMsg::Eof).await
    }
}

async fn next_event(call: &mut Call) -> Result<ExecEvent, VmError> {
    match call.next().await? {
        GuestMsg::Stdout(bytes) => Ok(ExecEvent::Stdout(bytes)),
        GuestMsg::Stderr(bytes) => Ok(ExecEvent::Stderr(bytes)),
        GuestMsg::Exited(status) => {
            call.finished = true;
            Ok(ExecEvent::Exited(status))
        }
        GuestMsg::Error { code, message } => {
            call.finished = true;
            Err(VmError::Agent { code, message })
        }
        other => Err(VmError::unexpected(format!("{other:?} in an exec"))),
    }
}

/// Carries an accepted connection between the guest (`call`) and the local stream's other end
/// until the guest's `Done`; an error or a local end dropped ends it early, and the dropped
/// call closes the guest's connection.
async fn carry(mut call: Call, local: tokio::io::DuplexStream) {
    let (mut from_local, mut to_local) = tokio::io::split(local);
    let shared = Arc::clone(&call.shared);
    let credit = Arc::clone(&call.input_credit);
    let id = call.id;
    let outward = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from_local
                .read(&mut buf)
                .await
                .map_err(|e| VmError::closed(format!("the local end: {e}")))?;
            if n == 0 {
                break;
            }
            send_data(&shared, &credit, id, &buf[..n]).await?;
        }
        shared.send(id, &HostMsg::Eof).await
    };
    // Once the local side's writing ended, the guest's side may still send.
    let outward = async {
        if outward.await.is_err() {
            return;
        }
        std::future::pending::<()>().await;
    };
    let inward = async {
        loop {
            match call.next().await? {
                GuestMsg::Data(bytes) => to_local
                    .write_all(&bytes)
                    .await
                    .map_err(|e| VmError::closed(format!("the local end: {e}")))?,
                GuestMsg::Eof => {
                    let _ = to_local.shutdown().await;
                }
                GuestMsg::Done => return Ok(true),
                GuestMsg::Error { code, message } => return Err(VmError::Agent { code, message }),
                other => return Err(VmError::unexpected(format!("{other:?} in a connection"))),
            }
        }
    };
    let finished: Result<bool, VmError> = tokio::select! {
        result = inward => result,
        () = outward => Ok(false),
    };
    call.finished = matches!(finished, Ok(true));
}

async fn read_loop(
    mut read: tokio::net::unix::OwnedReadHalf,
    mut decoder: FrameDecoder<GuestMsg>,
    shared: Arc<Shared>,
    _hold: PortHold,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let reason = loop {
        loop {
            match decoder.next_message() {
                Ok(Some((id, message))) => {
                    if let Err(reason) = route(&shared, id, message) {
                        shared.close(reason);
                        return;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    shared.close(Closed::Protocol(error));
                    return;
                }
            }
        }
        match read.read(&mut buf).await {
            Ok(0) => break "the guest end closed (QEMU or the agent is gone)".to_owned(),
            Ok(n) => decoder.push(&buf[..n]),
            Err(error) => break format!("reading from the agent: {error}"),
        }
    };
    shared.close(reason);
}

/// Routes one frame; an error closes the connection.
fn route(shared: &Shared, id: u32, message: GuestMsg) -> Result<(), Closed> {
    let Ok(mut routes) = shared.routes.lock() else {
        return Err(Closed::Other("poisoned".to_owned()));
    };
    let Some(route) = routes.get(&id) else {
        return Ok(());
    };
    if let GuestMsg::Credit(n) = message {
        let available = route.input_credit.available_permits() as u64 + u64::from(n);
        if available > u64::from(WINDOW) {
            return Err(Closed::Overrun {
                buffered: available,
                window: u64::from(WINDOW),
            });
        }
        route.input_credit.add_permits(n as usize);
        return Ok(());
    }
    let size = match &message {
        GuestMsg::Stdout(b) | GuestMsg::Stderr(b) | GuestMsg::Data(b) => b.len() as u64 + 16,
        GuestMsg::Entries(entries) => entries.iter().map(|e| e.name.len() as u64 + 16).sum(),
        _ => 64,
    };
    let buffered = route.buffered.fetch_add(size, Ordering::SeqCst) + size;
    if buffered > ROUTE_CAP {
        return Err(Closed::Overrun {
            buffered,
            window: ROUTE_CAP,
        });
    }
    if route.sender.send((message, size)).is_err() {
        routes.remove(&id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_agent::proto::FileKind;

    /// A stand-in agent on the one connection `listener` accepts: it answers the handshake,
    /// then every listing with `frames` frames of `per_frame` entries whose names are
    /// `name_len` bytes, then `Done`. Each frame waits 50 ms, as a guest reading its directory
    /// does, so the host's consumer stays within its route's buffer even on a loaded host
    /// (listings are not credited: the route's cap, not the bound under test, would end it).
    async fn lister(
        listener: tokio::net::UnixListener,
        frames: usize,
        per_frame: usize,
        name_len: usize,
    ) {
        let (stream, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let mut decoder = FrameDecoder::<HostMsg>::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(n) = read.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            decoder.push(&buf[..n]);
            while let Some((id, message)) = decoder.next_message().unwrap() {
                let answer = match message {
                    HostMsg::Hello { nonce } => write.write_all(&hello_ack_bytes(nonce)).await,
                    HostMsg::List { .. } => {
                        let mut sent = Ok(());
                        for _ in 0..frames {
                            let batch = (0..per_frame)
                                .map(|_| Entry {
                                    name: vec![b'n'; name_len],
                                    kind: FileKind::File,
                                    size: 0,
                                })
                                .collect();
                            sent = write
                                .write_all(&encode(id, &GuestMsg::Entries(batch)))
                                .await;
                            if sent.is_err() {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        match sent {
                            Ok(()) => write.write_all(&encode(id, &GuestMsg::Done)).await,
                            Err(error) => Err(error),
                        }
                    }
                    _ => Ok(()),
                };
                if answer.is_err() {
                    return;
                }
            }
        }
    }

    /// A client of a stand-in agent that lists as [`lister`] does.
    async fn listing(
        frames: usize,
        per_frame: usize,
        name_len: usize,
    ) -> Result<Vec<Entry>, VmError> {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let agent = tokio::spawn(lister(listener, frames, per_frame, name_len));
        let client = AgentClient::connect(&socket, Duration::from_secs(10))
            .await
            .unwrap();
        let listed = client.list(b"/d", Duration::from_secs(60)).await;
        drop(client);
        agent.abort();
        listed
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_of_long_names_is_cut_at_its_byte_cap() {
        // 10,000 entries (a tenth of the entry cap) whose 4 KiB names make about 41 MB.
        let refused = listing(50, 200, 4096).await.unwrap_err();
        assert!(
            matches!(refused, VmError::OutputLimit { limit } if limit == MAX_LIST_BYTES),
            "{refused}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fullest_listing_a_linux_guest_makes_fits_the_byte_cap() {
        // As many entries as the entry cap allows, each with a name of Linux's longest.
        let listed = listing(40, MAX_LIST_ENTRIES / 40, 255).await.unwrap();
        assert_eq!(listed.len(), MAX_LIST_ENTRIES);
        assert!(listed.iter().all(|entry| entry.name.len() == 255));
    }
}
