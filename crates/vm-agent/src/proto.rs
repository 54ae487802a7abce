//! The agent's wire protocol: frames and the messages they carry (`docs/vm.md#protocol`).
//!
//! A frame is a 10-byte header followed by a payload:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | payload length, big-endian `u32`, at most [`MAX_PAYLOAD`] |
//! | 1 | protocol version, [`VERSION`] |
//! | 1 | message kind |
//! | 4 | request id, big-endian `u32` (0 for the handshake) |
//!
//! Inside a payload, integers are big-endian, a byte string is a `u32` length then the bytes,
//! a list is a `u32` count then the items. A payload must be consumed exactly: trailing bytes
//! are an error. The host opens a session with [`HostMsg::Hello`] carrying a random nonce; the
//! agent answers [`GuestMsg::HelloAck`] with the same nonce, and the host finds the answer by
//! its exact bytes ([`hello_ack_bytes`]), so whatever an earlier connection left on the port is
//! skipped.
//!
//! Flow control: every data stream (an exec's stdin, its combined stdout and stderr, a file
//! read or written) starts with a window of [`WINDOW`] bytes; the receiver returns credit
//! (`Credit`) as it consumes, and a sender that exceeds its window breaks the protocol.
//!
//! Not here: any I/O. [`FrameDecoder`] is fed bytes and yields messages.

use thiserror::Error;

/// The protocol version every frame carries.
pub const VERSION: u8 = 1;

/// The header's length in bytes.
pub const HEADER_LEN: usize = 10;

/// The largest payload a frame may carry. A header announcing more is refused before any of
/// the payload is buffered.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

/// The largest data chunk a sender puts in one frame.
pub const CHUNK: usize = 64 * 1024;

/// The initial credit of every data stream, in bytes.
pub const WINDOW: u32 = 1024 * 1024;

/// The most argv items, environment entries or list entries one message may carry.
pub const MAX_ITEMS: usize = 65_536;

/// The magic the handshake carries, so a stream that is not this protocol fails at once.
pub const MAGIC: [u8; 8] = *b"SBXVMAG1";

/// The most agent ports a VM has (a virtio-serial device has 31; its port 0 is kept for a
/// console).
pub const MAX_PORTS: u32 = 30;

/// The fewest bytes of host entropy a [`HostMsg::Renew`] carries: a full reseed of the guest's
/// generator (256 bits).
pub const MIN_RENEW_ENTROPY: usize = 32;

/// The most bytes of host entropy a [`HostMsg::Renew`] carries.
pub const MAX_RENEW_ENTROPY: usize = 256;

/// The longest identity a [`HostMsg::Renew`] names (a host name's longest label).
pub const MAX_IDENTITY: usize = 63;

/// Whether `identity` may name a renewed guest: 1 to [`MAX_IDENTITY`] ASCII letters, digits and
/// `-`, so it is a valid host name as it is.
pub fn valid_identity(identity: &[u8]) -> bool {
    (1..=MAX_IDENTITY).contains(&identity.len())
        && identity
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
}

/// The kernel command-line word that tells the agent how many ports to serve
/// (`vm_agent.ports=<n>`); without it, one.
pub const PORTS_ARG: &str = "vm_agent.ports=";

/// The virtio-serial name of agent port `index`: `sbx.agent` for the first, then
/// `sbx.agent.1`, `sbx.agent.2`, ... Each port is a connection of its own: its own sessions,
/// its own frames.
pub fn port_name(index: u32) -> String {
    if index == 0 {
        "sbx.agent".to_owned()
    } else {
        format!("sbx.agent.{index}")
    }
}

/// How many ports a kernel command line asks the agent to serve: the value of [`PORTS_ARG`],
/// clamped to `1..=MAX_PORTS`; 1 when absent or unreadable.
pub fn ports_from_cmdline(cmdline: &str) -> u32 {
    cmdline
        .split_whitespace()
        .find_map(|word| word.strip_prefix(PORTS_ARG))
        .and_then(|value| value.parse::<u32>().ok())
        .map_or(1, |n| n.clamp(1, MAX_PORTS))
}

/// A malformed frame or message. The channel it came from is closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The header announces a payload larger than [`MAX_PAYLOAD`].
    #[error("frame payload of {len} bytes exceeds the {max}-byte bound")]
    FrameTooLarge {
        /// The announced length.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The frame's version is not [`VERSION`].
    #[error("frame version {found}, expected {VERSION}")]
    Version {
        /// The version found.
        found: u8,
    },
    /// The message kind is unknown to this side.
    #[error("unknown message kind {kind}")]
    UnknownKind {
        /// The kind byte.
        kind: u8,
    },
    /// The payload ended before a field did.
    #[error("payload of message kind {kind} is truncated")]
    Truncated {
        /// The kind byte.
        kind: u8,
    },
    /// The payload has bytes after its last field.
    #[error("payload of message kind {kind} has {extra} trailing bytes")]
    Trailing {
        /// The kind byte.
        kind: u8,
        /// How many bytes were left.
        extra: usize,
    },
    /// A field holds a value outside its domain.
    #[error("message kind {kind}: invalid {field}")]
    Invalid {
        /// The kind byte.
        kind: u8,
        /// The field.
        field: &'static str,
    },
}

impl ProtoError {
    #[cold]
    fn truncated(kind: u8) -> ProtoError {
        ProtoError::Truncated { kind }
    }

    #[cold]
    fn invalid(kind: u8, field: &'static str) -> ProtoError {
        ProtoError::Invalid { kind, field }
    }
}

/// An exec request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The program and its arguments, raw bytes; never empty.
    pub argv: Vec<Vec<u8>>,
    /// The whole environment of the process (nothing is inherited from the agent).
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// The working directory; empty means `/`.
    pub workdir: Vec<u8>,
    /// Whether stdin is streamed (`Data` frames then `Eof`); otherwise it is `/dev/null`.
    pub stdin: bool,
    /// The wall-clock limit in milliseconds; 0 means none. When it passes, every process of
    /// the exec's group is killed.
    pub timeout_ms: u64,
    /// The uid and gid to run as; `None` runs as root.
    pub user: Option<(u32, u32)>,
}

/// How an exec ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// The exit code, when the process exited.
    pub code: Option<i32>,
    /// The signal, when a signal ended it.
    pub signal: Option<i32>,
    /// The exec's time limit passed and its group was killed.
    pub timed_out: bool,
    /// A `Kill` request ended its group.
    pub killed: bool,
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by `stat` or `list`).
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

impl FileKind {
    fn code(self) -> u8 {
        match self {
            FileKind::File => 0,
            FileKind::Dir => 1,
            FileKind::Symlink => 2,
            FileKind::Other => 3,
        }
    }

    fn from_code(kind: u8, code: u8) -> Result<FileKind, ProtoError> {
        Ok(match code {
            0 => FileKind::File,
            1 => FileKind::Dir,
            2 => FileKind::Symlink,
            3 => FileKind::Other,
            _ => return Err(ProtoError::invalid(kind, "file kind")),
        })
    }
}

/// The answer to a `Stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// What the path is.
    pub kind: FileKind,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Its modification time, seconds since the epoch.
    pub mtime: i64,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name, raw bytes.
    pub name: Vec<u8>,
    /// What it is.
    pub kind: FileKind,
    /// Its size in bytes.
    pub size: u64,
}

/// Why the agent refused or failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// No such file or directory.
    NotFound,
    /// Permission denied.
    PermissionDenied,
    /// The path exists.
    Exists,
    /// A directory where a file was needed, or the reverse.
    WrongKind,
    /// The request is not valid (empty argv, bad path).
    Invalid,
    /// The program could not be started.
    SpawnFailed,
    /// Any other I/O failure.
    Io,
    /// An exec's working directory could not be entered: the command never started (the
    /// message is `cd: <dir>: <reason>`).
    WorkdirUnusable,
    /// An unknown code from a newer agent.
    Other,
}

impl ErrorCode {
    fn code(self) -> u16 {
        match self {
            ErrorCode::NotFound => 1,
            ErrorCode::PermissionDenied => 2,
            ErrorCode::Exists => 3,
            ErrorCode::WrongKind => 4,
            ErrorCode::Invalid => 5,
            ErrorCode::SpawnFailed => 6,
            ErrorCode::Io => 7,
            ErrorCode::WorkdirUnusable => 8,
            ErrorCode::Other => 0,
        }
    }

    fn from_code(code: u16) -> ErrorCode {
        match code {
            1 => ErrorCode::NotFound,
            2 => ErrorCode::PermissionDenied,
            3 => ErrorCode::Exists,
            4 => ErrorCode::WrongKind,
            5 => ErrorCode::Invalid,
            6 => ErrorCode::SpawnFailed,
            7 => ErrorCode::Io,
            8 => ErrorCode::WorkdirUnusable,
            _ => ErrorCode::Other,
        }
    }

    /// The code for an I/O error.
    pub fn from_io(error: &std::io::Error) -> ErrorCode {
        use std::io::ErrorKind;
        match error.kind() {
            ErrorKind::NotFound => ErrorCode::NotFound,
            ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            ErrorKind::AlreadyExists => ErrorCode::Exists,
            ErrorKind::IsADirectory | ErrorKind::NotADirectory | ErrorKind::DirectoryNotEmpty => {
                ErrorCode::WrongKind
            }
            ErrorKind::InvalidInput | ErrorKind::InvalidFilename => ErrorCode::Invalid,
            _ => ErrorCode::Io,
        }
    }
}

/// A message from the host to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostMsg {
    /// Opens a session (request id 0).
    Hello {
        /// Echoed in the answer, so the host finds it among stale bytes.
        nonce: [u8; 16],
    },
    /// Starts a process.
    Exec(ExecRequest),
    /// A chunk of an exec's stdin or of a file being written.
    Data(Vec<u8>),
    /// The end of an exec's stdin or of a file being written.
    Eof,
    /// The host consumed this many bytes of the request's output stream.
    Credit(u32),
    /// Kills every process of the request's exec.
    Kill,
    /// Stats a path without following a final symlink.
    Stat {
        /// The path.
        path: Vec<u8>,
    },
    /// Streams a file's first bytes (`Data` then `Done`): the whole file when it is no larger
    /// than `limit`, else its first `limit` bytes. The host asks one byte past its cap to learn
    /// that a file is too large without receiving the rest of it.
    Read {
        /// The path.
        path: Vec<u8>,
        /// The most bytes the agent sends.
        limit: u64,
    },
    /// Writes a file from the `Data` frames that follow, truncating it (`Done` when written).
    Write {
        /// The path.
        path: Vec<u8>,
        /// The permission bits of a created file.
        mode: u32,
    },
    /// Lists a directory (`Entries` frames then `Done`).
    List {
        /// The path.
        path: Vec<u8>,
    },
    /// Removes a file, or a directory and everything under it when `recursive`.
    Remove {
        /// The path.
        path: Vec<u8>,
        /// Whether a directory's contents go too.
        recursive: bool,
    },
    /// Returns reclaimable guest memory (drops caches) and reports what is available.
    Reclaim,
    /// Powers the guest off after answering `Done`.
    Shutdown,
    /// Waits for the next connection a guest process makes to `127.0.0.1:port` (the agent
    /// listens there from the first such request on), then carries it: `Connected`, then the
    /// connection's bytes as `Data` both ways, each way credited as an exec's streams are;
    /// the host's `Eof` shuts the guest socket's write side, the guest's `Eof` says its peer
    /// shut its own; `Done` once both ways ended. `Kill` closes the connection, or stops the
    /// wait.
    Accept {
        /// The guest's loopback port, never 0.
        port: u16,
    },
    /// Makes a guest restored from a saved state a machine of its own, before any command runs
    /// in it: mixes `entropy` into the kernel's pool and reseeds its generator (two guests
    /// restored from one state must never share random bytes), sets the real-time clock (which
    /// stood still while the state was saved) and takes `identity` as the host name. `Done`
    /// once all three hold, else `Error`.
    Renew {
        /// Host randomness, [`MIN_RENEW_ENTROPY`] to [`MAX_RENEW_ENTROPY`] bytes.
        entropy: Vec<u8>,
        /// The host's real time, nanoseconds since the epoch.
        unix_nanos: u64,
        /// The new instance's name (see [`valid_identity`]).
        identity: Vec<u8>,
    },
}

/// A message from the agent to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuestMsg {
    /// Answers `Hello`.
    HelloAck {
        /// The host's nonce.
        nonce: [u8; 16],
    },
    /// The exec's process started.
    Started {
        /// Its pid in the guest.
        pid: u32,
    },
    /// A chunk of an exec's stdout.
    Stdout(Vec<u8>),
    /// A chunk of an exec's stderr.
    Stderr(Vec<u8>),
    /// The exec ended; nothing of its group is left.
    Exited(ExitStatus),
    /// The agent consumed this many bytes of the request's input stream.
    Credit(u32),
    /// The answer to `Stat`.
    Stat(Stat),
    /// A chunk of a file being read.
    Data(Vec<u8>),
    /// A chunk of a directory listing.
    Entries(Vec<Entry>),
    /// Memory available before and after a `Reclaim`, KiB.
    Reclaimed {
        /// `MemAvailable` before.
        before_kib: u64,
        /// `MemAvailable` after.
        after_kib: u64,
    },
    /// A guest process connected to the port of an `Accept`.
    Connected,
    /// The guest's side of an accepted connection sends nothing more.
    Eof,
    /// The request finished.
    Done,
    /// The request failed.
    Error {
        /// Why.
        code: ErrorCode,
        /// The agent's message (bounded by the frame).
        message: String,
    },
}

/// A message type one side decodes.
pub trait Message: Sized {
    /// Decodes a payload of kind `kind`.
    ///
    /// # Errors
    /// Any [`ProtoError`] but `FrameTooLarge` and `Version`.
    fn decode(kind: u8, payload: &[u8]) -> Result<Self, ProtoError>;
    /// Appends the payload to `out` and returns the kind.
    fn encode_payload(&self, out: &mut Vec<u8>) -> u8;
}

/// Encodes one frame.
///
/// # Panics
/// Never for a message built within the bounds (chunks of at most [`CHUNK`]); a payload above
/// [`MAX_PAYLOAD`] is a caller bug and is refused by the other side.
pub fn encode<M: Message>(id: u32, message: &M) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    let kind = message.encode_payload(&mut out);
    let len = u32::try_from(out.len() - HEADER_LEN).unwrap_or(u32::MAX);
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out[4] = VERSION;
    out[5] = kind;
    out[6..10].copy_from_slice(&id.to_be_bytes());
    out
}

/// The exact bytes of the agent's answer to a `Hello` with `nonce`.
pub fn hello_ack_bytes(nonce: [u8; 16]) -> Vec<u8> {
    encode(0, &GuestMsg::HelloAck { nonce })
}

/// The bytes every `Hello` frame starts with (header and magic), which the agent scans for to
/// find the start of a session.
pub fn hello_prefix() -> Vec<u8> {
    let mut frame = encode(0, &HostMsg::Hello { nonce: [0; 16] });
    frame.truncate(HEADER_LEN + MAGIC.len());
    frame
}

/// Incremental frame decoder: feed it bytes, take messages.
#[derive(Debug)]
pub struct FrameDecoder<M> {
    buf: Vec<u8>,
    _message: std::marker::PhantomData<M>,
}

impl<M> Default for FrameDecoder<M> {
    fn default() -> Self {
        FrameDecoder {
            buf: Vec::new(),
            _message: std::marker::PhantomData,
        }
    }
}

impl<M: Message> FrameDecoder<M> {
    /// An empty decoder.
    pub fn new() -> Self {
        FrameDecoder::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// How many bytes are buffered (at most one header and [`MAX_PAYLOAD`] plus what the last
    /// `push` added).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Drops everything buffered before the first occurrence of `pattern` and returns true,
    /// or keeps only a tail shorter than `pattern` and returns false.
    pub fn skip_to(&mut self, pattern: &[u8]) -> bool {
        if let Some(at) = self
            .buf
            .windows(pattern.len())
            .position(|window| window == pattern)
        {
            self.buf.drain(..at);
            return true;
        }
        let keep = pattern.len().saturating_sub(1).min(self.buf.len());
        let cut = self.buf.len() - keep;
        self.buf.drain(..cut);
        false
    }

    /// The next whole message, `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// A [`ProtoError`] for a malformed frame; the decoder is then unusable (the channel must
    /// be closed).
    pub fn next_message(&mut self) -> Result<Option<(u32, M)>, ProtoError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(ProtoError::FrameTooLarge {
                len,
                max: MAX_PAYLOAD,
            });
        }
        if self.buf[4] != VERSION {
            return Err(ProtoError::Version { found: self.buf[4] });
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let kind = self.buf[5];
        let id = u32::from_be_bytes([self.buf[6], self.buf[7], self.buf[8], self.buf[9]]);
        let message = M::decode(kind, &self.buf[HEADER_LEN..HEADER_LEN + len])?;
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some((id, message)))
    }
}

/// Reads fields off a payload, every length checked against what remains.
struct Reader<'a> {
    kind: u8,
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(kind: u8, payload: &'a [u8]) -> Self {
        Reader {
            kind,
            rest: payload,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.rest.len() < n {
            return Err(ProtoError::truncated(self.kind));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }

    fn bool(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::invalid(self.kind, "boolean")),
        }
    }

    fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self) -> Result<i32, ProtoError> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> Result<u64, ProtoError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, ProtoError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    fn nonce(&mut self) -> Result<[u8; 16], ProtoError> {
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(self.take(16)?);
        Ok(nonce)
    }

    /// A list count, bounded by [`MAX_ITEMS`] and by what remains (each item takes at least
    /// `min_item` bytes), so a count never drives an allocation larger than the payload.
    fn count(&mut self, min_item: usize) -> Result<usize, ProtoError> {
        let count = self.u32()? as usize;
        if count > MAX_ITEMS || count.saturating_mul(min_item) > self.rest.len() {
            return Err(ProtoError::invalid(self.kind, "item count"));
        }
        Ok(count)
    }

    fn finish<T>(self, value: T) -> Result<T, ProtoError> {
        if self.rest.is_empty() {
            Ok(value)
        } else {
            Err(ProtoError::Trailing {
                kind: self.kind,
                extra: self.rest.len(),
            })
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_count(out: &mut Vec<u8>, count: usize) {
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_be_bytes());
}

mod kind {
    pub const HELLO: u8 = 1;
    pub const EXEC: u8 = 2;
    pub const DATA: u8 = 3;
    pub const EOF: u8 = 4;
    pub const CREDIT: u8 = 5;
    pub const KILL: u8 = 6;
    pub const STAT: u8 = 7;
    pub const READ: u8 = 8;
    pub const WRITE: u8 = 9;
    pub const LIST: u8 = 10;
    pub const REMOVE: u8 = 11;
    pub const RECLAIM: u8 = 12;
    pub const SHUTDOWN: u8 = 13;
    pub const RENEW: u8 = 14;
    pub const ACCEPT: u8 = 15;

    pub const HELLO_ACK: u8 = 64;
    pub const STARTED: u8 = 65;
    pub const STDOUT: u8 = 66;
    pub const STDERR: u8 = 67;
    pub const EXITED: u8 = 68;
    pub const G_CREDIT: u8 = 69;
    pub const G_STAT: u8 = 70;
    pub const G_DATA: u8 = 71;
    pub const ENTRIES: u8 = 72;
    pub const RECLAIMED: u8 = 73;
    pub const DONE: u8 = 74;
    pub const ERROR: u8 = 75;
    pub const CONNECTED: u8 = 76;
    pub const G_EOF: u8 = 77;
}

impl Message for HostMsg {
    fn decode(k: u8, payload: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(k, payload);
        let message = match k {
            kind::HELLO => {
                if r.take(MAGIC.len())? != MAGIC {
                    return Err(ProtoError::invalid(k, "magic"));
                }
                HostMsg::Hello { nonce: r.nonce()? }
            }
            kind::EXEC => {
                let argc = r.count(4)?;
                if argc == 0 {
                    return Err(ProtoError::invalid(k, "argv"));
                }
                let mut argv = Vec::with_capacity(argc);
                for _ in 0..argc {
                    argv.push(r.bytes()?);
                }
                let envc = r.count(8)?;
                let mut env = Vec::with_capacity(envc);
                for _ in 0..envc {
                    env.push((r.bytes()?, r.bytes()?));
                }
                let workdir = r.bytes()?;
                let stdin = r.bool()?;
                let timeout_ms = r.u64()?;
                let user = if r.bool()? {
                    Some((r.u32()?, r.u32()?))
                } else {
                    None
                };
                HostMsg::Exec(ExecRequest {
                    argv,
                    env,
                    workdir,
                    stdin,
                    timeout_ms,
                    user,
                })
            }
            kind::DATA => HostMsg::Data(r.bytes()?),
            kind::EOF => HostMsg::Eof,
            kind::CREDIT => HostMsg::Credit(r.u32()?),
            kind::KILL => HostMsg::Kill,
            kind::STAT => HostMsg::Stat { path: r.bytes()? },
            kind::READ => HostMsg::Read {
                path: r.bytes()?,
                limit: r.u64()?,
            },
            kind::WRITE => HostMsg::Write {
                path: r.bytes()?,
                mode: r.u32()?,
            },
            kind::LIST => HostMsg::List { path: r.bytes()? },
            kind::REMOVE => HostMsg::Remove {
                path: r.bytes()?,
                recursive: r.bool()?,
            },
            kind::RECLAIM => HostMsg::Reclaim,
            kind::SHUTDOWN => HostMsg::Shutdown,
            kind::RENEW => {
                let entropy = r.bytes()?;
                if !(MIN_RENEW_ENTROPY..=MAX_RENEW_ENTROPY).contains(&entropy.len()) {
                    return Err(ProtoError::invalid(k, "entropy length"));
                }
                let unix_nanos = r.u64()?;
                let identity = r.bytes()?;
                if !valid_identity(&identity) {
                    return Err(ProtoError::invalid(k, "identity"));
                }
                HostMsg::Renew {
                    entropy,
                    unix_nanos,
                    identity,
                }
            }
            kind::ACCEPT => {
                let port = r.u16()?;
                if port == 0 {
                    return Err(ProtoError::invalid(k, "port"));
                }
                HostMsg::Accept { port }
            }
            _ => return Err(ProtoError::UnknownKind { kind: k }),
        };
        r.finish(message)
    }

    fn encode_payload(&self, out: &mut Vec<u8>) -> u8 {
        match self {
            HostMsg::Hello { nonce } => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(nonce);
                kind::HELLO
            }
            HostMsg::Exec(request) => {
                put_count(out, request.argv.len());
                for arg in &request.argv {
                    put_bytes(out, arg);
                }
                put_count(out, request.env.len());
                for (name, value) in &request.env {
                    put_bytes(out, name);
                    put_bytes(out, value);
                }
                put_bytes(out, &request.workdir);
                out.push(u8::from(request.stdin));
                out.extend_from_slice(&request.timeout_ms.to_be_bytes());
                match request.user {
                    Some((uid, gid)) => {
                        out.push(1);
                        out.extend_from_slice(&uid.to_be_bytes());
                        out.extend_from_slice(&gid.to_be_bytes());
                    }
                    None => out.push(0),
                }
                kind::EXEC
            }
            HostMsg::Data(bytes) => {
                put_bytes(out, bytes);
                kind::DATA
            }
            HostMsg::Eof => kind::EOF,
            HostMsg::Credit(n) => {
                out.extend_from_slice(&n.to_be_bytes());
                kind::CREDIT
            }
            HostMsg::Kill => kind::KILL,
            HostMsg::Stat { path } => {
                put_bytes(out, path);
                kind::STAT
            }
            HostMsg::Read { path, limit } => {
                put_bytes(out, path);
                out.extend_from_slice(&limit.to_be_bytes());
                kind::READ
            }
            HostMsg::Write { path, mode } => {
                put_bytes(out, path);
                out.extend_from_slice(&mode.to_be_bytes());
                kind::WRITE
            }
            HostMsg::List { path } => {
                put_bytes(out, path);
                kind::LIST
            }
            HostMsg::Remove { path, recursive } => {
                put_bytes(out, path);
                out.push(u8::from(*recursive));
                kind::REMOVE
            }
            HostMsg::Reclaim => kind::RECLAIM,
            HostMsg::Shutdown => kind::SHUTDOWN,
            HostMsg::Renew {
                entropy,
                unix_nanos,
                identity,
            } => {
                put_bytes(out, entropy);
                out.extend_from_slice(&unix_nanos.to_be_bytes());
                put_bytes(out, identity);
                kind::RENEW
            }
            HostMsg::Accept { port } => {
                out.extend_from_slice(&port.to_be_bytes());
                kind::ACCEPT
            }
        }
    }
}

impl Message for GuestMsg {
    fn decode(k: u8, payload: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(k, payload);
        let message = match k {
            kind::HELLO_ACK => {
                if r.take(MAGIC.len())? != MAGIC {
                    return Err(ProtoError::invalid(k, "magic"));
                }
                GuestMsg::HelloAck { nonce: r.nonce()? }
            }
            kind::STARTED => GuestMsg::Started { pid: r.u32()? },
            kind::STDOUT => GuestMsg::Stdout(r.bytes()?),
            kind::STDERR => GuestMsg::Stderr(r.bytes()?),
            kind::EXITED => {
                let how = r.u8()?;
                let value = r.i32()?;
                let (code, signal) = match how {
                    0 => (Some(value), None),
                    1 => (None, Some(value)),
                    2 => (None, None),
                    _ => return Err(ProtoError::invalid(k, "exit kind")),
                };
                GuestMsg::Exited(ExitStatus {
                    code,
                    signal,
                    timed_out: r.bool()?,
                    killed: r.bool()?,
                })
            }
            kind::G_CREDIT => GuestMsg::Credit(r.u32()?),
            kind::G_STAT => GuestMsg::Stat(Stat {
                kind: FileKind::from_code(k, r.u8()?)?,
                size: r.u64()?,
                mode: r.u32()?,
                mtime: r.u64()? as i64,
            }),
            kind::G_DATA => GuestMsg::Data(r.bytes()?),
            kind::ENTRIES => {
                let count = r.count(13)?;
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let name = r.bytes()?;
                    let kind = FileKind::from_code(k, r.u8()?)?;
                    entries.push(Entry {
                        name,
                        kind,
                        size: r.u64()?,
                    });
                }
                GuestMsg::Entries(entries)
            }
            kind::RECLAIMED => GuestMsg::Reclaimed {
                before_kib: r.u64()?,
                after_kib: r.u64()?,
            },
            kind::DONE => GuestMsg::Done,
            kind::CONNECTED => GuestMsg::Connected,
            kind::G_EOF => GuestMsg::Eof,
            kind::ERROR => {
                let code = ErrorCode::from_code(r.u16()?);
                let message = String::from_utf8_lossy(&r.bytes()?).into_owned();
                GuestMsg::Error { code, message }
            }
            _ => return Err(ProtoError::UnknownKind { kind: k }),
        };
        r.finish(message)
    }

    fn encode_payload(&self, out: &mut Vec<u8>) -> u8 {
        match self {
            GuestMsg::HelloAck { nonce } => {
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(nonce);
                kind::HELLO_ACK
            }
            GuestMsg::Started { pid } => {
                out.extend_from_slice(&pid.to_be_bytes());
                kind::STARTED
            }
            GuestMsg::Stdout(bytes) => {
                put_bytes(out, bytes);
                kind::STDOUT
            }
            GuestMsg::Stderr(bytes) => {
                put_bytes(out, bytes);
                kind::STDERR
            }
            GuestMsg::Exited(status) => {
                let (how, value) = match (status.code, status.signal) {
                    (Some(code), _) => (0u8, code),
                    (None, Some(signal)) => (1, signal),
                    (None, None) => (2, 0),
                };
                out.push(how);
                out.extend_from_slice(&value.to_be_bytes());
                out.push(u8::from(status.timed_out));
                out.push(u8::from(status.killed));
                kind::EXITED
            }
            GuestMsg::Credit(n) => {
                out.extend_from_slice(&n.to_be_bytes());
                kind::G_CREDIT
            }
            GuestMsg::Stat(stat) => {
                out.push(stat.kind.code());
                out.extend_from_slice(&stat.size.to_be_bytes());
                out.extend_from_slice(&stat.mode.to_be_bytes());
                out.extend_from_slice(&(stat.mtime as u64).to_be_bytes());
                kind::G_STAT
            }
            GuestMsg::Data(bytes) => {
                put_bytes(out, bytes);
                kind::G_DATA
            }
            GuestMsg::Entries(entries) => {
                put_count(out, entries.len());
                for entry in entries {
                    put_bytes(out, &entry.name);
                    out.push(entry.kind.code());
                    out.extend_from_slice(&entry.size.to_be_bytes());
                }
                kind::ENTRIES
            }
            GuestMsg::Reclaimed {
                before_kib,
                after_kib,
            } => {
                out.extend_from_slice(&before_kib.to_be_bytes());
                out.extend_from_slice(&after_kib.to_be_bytes());
                kind::RECLAIMED
            }
            GuestMsg::Done => kind::DONE,
            GuestMsg::Connected => kind::CONNECTED,
            GuestMsg::Eof => kind::G_EOF,
            GuestMsg::Error { code, message } => {
                out.extend_from_slice(&code.code().to_be_bytes());
                put_bytes(out, message.as_bytes());
                kind::ERROR
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn port_names_and_the_port_count_on_the_command_line() {
        assert_eq!(super::port_name(0), "sbx.agent");
        assert_eq!(super::port_name(7), "sbx.agent.7");
        let names: std::collections::BTreeSet<String> =
            (0..super::MAX_PORTS).map(super::port_name).collect();
        assert_eq!(names.len(), super::MAX_PORTS as usize);
        assert_eq!(super::ports_from_cmdline("quiet panic=-1"), 1);
        assert_eq!(super::ports_from_cmdline("quiet vm_agent.ports=8 x"), 8);
        assert_eq!(super::ports_from_cmdline("vm_agent.ports=0"), 1);
        assert_eq!(
            super::ports_from_cmdline("vm_agent.ports=99"),
            super::MAX_PORTS
        );
        assert_eq!(super::ports_from_cmdline("vm_agent.ports=x"), 1);
        assert_eq!(super::ports_from_cmdline("xvm_agent.ports=5"), 1);
    }

    use super::*;

    #[test]
    fn a_hello_round_trips_and_starts_with_the_prefix() {
        let frame = encode(0, &HostMsg::Hello { nonce: [7; 16] });
        assert!(frame.starts_with(&hello_prefix()));
        let mut decoder = FrameDecoder::<HostMsg>::new();
        decoder.push(&frame);
        assert_eq!(
            decoder.next_message().unwrap(),
            Some((0, HostMsg::Hello { nonce: [7; 16] }))
        );
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn an_oversized_header_is_refused_before_its_payload_arrives() {
        let mut decoder = FrameDecoder::<GuestMsg>::new();
        decoder.push(&[0xff, 0xff, 0xff, 0xff, VERSION, 66, 0, 0, 0, 1]);
        assert_eq!(
            decoder.next_message(),
            Err(ProtoError::FrameTooLarge {
                len: u32::MAX as usize,
                max: MAX_PAYLOAD
            })
        );
    }

    fn renew(entropy: usize, identity: &[u8]) -> Vec<u8> {
        encode(
            3,
            &HostMsg::Renew {
                entropy: vec![9; entropy],
                unix_nanos: 1_700_000_000_000_000_000,
                identity: identity.to_vec(),
            },
        )
    }

    #[test]
    fn a_renewal_round_trips_within_its_bounds_and_is_refused_outside_them() {
        for (entropy, identity) in [
            (MIN_RENEW_ENTROPY, &b"vm-0123abcd"[..]),
            (MAX_RENEW_ENTROPY, &[b'a'; MAX_IDENTITY][..]),
        ] {
            let mut decoder = FrameDecoder::<HostMsg>::new();
            decoder.push(&renew(entropy, identity));
            assert_eq!(
                decoder.next_message().unwrap(),
                Some((
                    3,
                    HostMsg::Renew {
                        entropy: vec![9; entropy],
                        unix_nanos: 1_700_000_000_000_000_000,
                        identity: identity.to_vec(),
                    }
                ))
            );
        }
        for (entropy, identity, field) in [
            (MIN_RENEW_ENTROPY - 1, &b"vm-1"[..], "entropy length"),
            (MAX_RENEW_ENTROPY + 1, &b"vm-1"[..], "entropy length"),
            (MIN_RENEW_ENTROPY, &b""[..], "identity"),
            (MIN_RENEW_ENTROPY, &b"vm/1"[..], "identity"),
            (MIN_RENEW_ENTROPY, &[b'a'; MAX_IDENTITY + 1][..], "identity"),
        ] {
            let mut decoder = FrameDecoder::<HostMsg>::new();
            decoder.push(&renew(entropy, identity));
            assert_eq!(
                decoder.next_message(),
                Err(ProtoError::Invalid {
                    kind: kind::RENEW,
                    field
                }),
                "{entropy} bytes, identity {identity:?}"
            );
        }
    }

    #[test]
    fn an_accept_of_port_zero_is_refused() {
        let mut frame = encode(5, &HostMsg::Accept { port: 3128 });
        let mut decoder = FrameDecoder::<HostMsg>::new();
        decoder.push(&frame);
        assert_eq!(
            decoder.next_message().unwrap(),
            Some((5, HostMsg::Accept { port: 3128 }))
        );
        let len = frame.len();
        frame[len - 2..].copy_from_slice(&[0, 0]);
        let mut decoder = FrameDecoder::<HostMsg>::new();
        decoder.push(&frame);
        assert_eq!(
            decoder.next_message(),
            Err(ProtoError::Invalid {
                kind: kind::ACCEPT,
                field: "port"
            })
        );
    }

    #[test]
    fn skip_to_finds_a_pattern_split_across_pushes() {
        let mut decoder = FrameDecoder::<GuestMsg>::new();
        let ack = hello_ack_bytes([3; 16]);
        decoder.push(b"stale garbage");
        decoder.push(&ack[..5]);
        assert!(!decoder.skip_to(&ack));
        decoder.push(&ack[5..]);
        assert!(decoder.skip_to(&ack));
        assert_eq!(
            decoder.next_message().unwrap(),
            Some((0, GuestMsg::HelloAck { nonce: [3; 16] }))
        );
    }
}
