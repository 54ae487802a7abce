//! The bounded run itself: one child, its pipes, its deadline and budget, and its end.
//!
//! One call = one child with an explicit environment, stdin `/dev/null` unless bytes are given,
//! both pipes read concurrently against one combined output budget, a deadline, and a kill of the
//! child's whole process tree (its process group on Unix, its Job object on Windows) plus a
//! bounded reap on every early exit.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::process_tree::ProcessTree;

/// Default output budget: 8 MiB for stdout and stderr combined.
pub const DEFAULT_OUTPUT_BUDGET: usize = 8 * 1024 * 1024;

/// Largest single read from either pipe.
pub const READ_CHUNK: usize = 65_536;

/// How long the runner waits for a killed child to be reaped before leaving it to tokio's
/// background orphan reaping and returning.
pub(crate) const REAP_GRACE: Duration = Duration::from_secs(3);

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The child's stdout.
    Stdout,
    /// The child's stderr.
    Stderr,
}

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitKind {
    /// It exited with this status.
    Exited(i32),
    /// It was killed by this signal (Unix only: on Windows every end is an exit code).
    Signaled(i32),
}

/// A completed run: the exit and every byte of both pipes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    /// How the child ended.
    pub status: ExitKind,
    /// Every stdout byte (in prefix mode, the first `stop_after` bytes).
    pub stdout: Vec<u8>,
    /// Every stderr byte.
    pub stderr: Vec<u8>,
    /// Prefix mode only: stdout reached `stop_after` and the child was stopped on purpose.
    pub truncated: bool,
}

type LineCallback = Box<dyn FnMut(Stream, &[u8]) + Send>;

/// One bounded invocation, built up and then run with [`run_bounded`] (or
/// [`BoundedCommand::run`]).
///
/// The child's environment is exactly what [`BoundedCommand::env`] and
/// [`BoundedCommand::envs`] give: the inherited one is cleared. Pass the management environment
/// explicitly, including `PATH` when the program is not an absolute path.
pub struct BoundedCommand {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    stdin: Option<Feed>,
    output_budget: usize,
    timeout: Duration,
    deadline: Option<Instant>,
    on_line: Option<LineCallback>,
    stop_after: Option<usize>,
    current_dir: Option<PathBuf>,
}

impl std::fmt::Debug for BoundedCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Environment values may be credentials: only names are shown.
        f.debug_struct("BoundedCommand")
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "env_names",
                &self.env.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field(
                "stdin_len",
                &match &self.stdin {
                    Some(Feed::Bytes(bytes)) => Some(bytes.len()),
                    _ => None,
                },
            )
            .field("stdin_reader", &matches!(self.stdin, Some(Feed::Reader(_))))
            .field("output_budget", &self.output_budget)
            .field("timeout", &self.timeout)
            .field("stop_after", &self.stop_after)
            .finish_non_exhaustive()
    }
}

impl BoundedCommand {
    /// A command with no arguments, an empty environment, stdin `/dev/null`, the default budget,
    /// and a deadline `timeout` after the run starts (none at all when that instant is past
    /// what the clock can represent, as with [`Duration::MAX`]).
    pub fn new(program: impl Into<OsString>, timeout: Duration) -> Self {
        BoundedCommand {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            stdin: None,
            output_budget: DEFAULT_OUTPUT_BUDGET,
            timeout,
            deadline: None,
            on_line: None,
            stop_after: None,
            current_dir: None,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds one environment entry.
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Adds environment entries.
    pub fn envs<I, N, V>(mut self, entries: I) -> Self
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<OsString>,
        V: Into<OsString>,
    {
        self.env
            .extend(entries.into_iter().map(|(n, v)| (n.into(), v.into())));
        self
    }

    /// Bytes for the child's stdin, written concurrently with reading and then closed. They do
    /// not count against the output budget.
    pub fn stdin(mut self, bytes: Vec<u8>) -> Self {
        self.stdin = Some(Feed::Bytes(bytes));
        self
    }

    /// A reader for the child's stdin, copied to it as fast as the child reads, then closed.
    /// A child that exits (or closes its stdin) before reading everything ends the copy; the
    /// rest of the reader is never read. It does not count against the output budget.
    pub fn stdin_reader(mut self, reader: Box<dyn AsyncRead + Send + Unpin>) -> Self {
        self.stdin = Some(Feed::Reader(reader));
        self
    }

    /// The combined stdout + stderr budget in bytes (default [`DEFAULT_OUTPUT_BUDGET`]).
    pub fn output_budget(mut self, bytes: usize) -> Self {
        self.output_budget = bytes;
        self
    }

    /// An absolute deadline instead of `timeout` after the start. The error still reports the
    /// `timeout` given to [`BoundedCommand::new`] as the bound.
    pub fn deadline(mut self, at: Instant) -> Self {
        self.deadline = Some(at);
        self
    }

    /// A callback handed each complete line of either stream (its `\n` included) as soon as it
    /// arrives; a line longer than [`READ_CHUNK`] comes in pieces and an unterminated tail comes
    /// last, so the pieces of one stream concatenate to exactly its bytes. The bytes still count
    /// against the budget and are still returned. It runs on the reading task: it must not block.
    pub fn on_line(mut self, callback: impl FnMut(Stream, &[u8]) + Send + 'static) -> Self {
        self.on_line = Some(Box::new(callback));
        self
    }

    /// Prefix mode: once stdout has `bytes` bytes, stop the child (killed as on any early exit)
    /// and return those bytes with `truncated = true`.
    pub fn stop_after(mut self, bytes: usize) -> Self {
        self.stop_after = Some(bytes);
        self
    }

    /// The child's working directory (default: the host process's).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Runs the command; see [`run_bounded`].
    pub async fn run(self) -> Result<RunOutput> {
        run_bounded(self).await
    }

    /// Runs the command with its output handed to `sink` as it arrives; see [`run_streaming`].
    pub async fn run_streaming(self, sink: &mut impl OutputSink) -> Result<ExitKind> {
        run_streaming(self, sink).await
    }
}

/// What the child reads on stdin.
enum Feed {
    Bytes(Vec<u8>),
    Reader(Box<dyn AsyncRead + Send + Unpin>),
}

/// Where a streamed run's output goes, chunk by chunk, as the child writes it.
pub trait OutputSink: Send {
    /// Takes one chunk (at most [`READ_CHUNK`] bytes) read from `stream`. While this waits the
    /// runner reads nothing more, so a slow sink holds the child at its pipe. An error stops the
    /// run as any early exit does (the tree killed and reaped) and is returned.
    fn accept(&mut self, stream: Stream, bytes: &[u8]) -> impl Future<Output = Result<()>> + Send;

    /// Resolves once nobody wants the output any more: the run stops as on an error, with
    /// [`Error::Abandoned`]. The default never resolves.
    fn abandoned(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }

    /// `stream` reached its end; nothing more comes from it. The default does nothing.
    fn closed(&mut self, _stream: Stream) {}
}

/// The collected form's sink: keeps both streams and feeds the line callback.
struct KeepSink {
    out: Kept,
    err: Kept,
    on_line: Option<LineCallback>,
}

impl OutputSink for KeepSink {
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> Result<()> {
        match stream {
            Stream::Stdout => self.out.push(bytes, &mut self.on_line),
            Stream::Stderr => self.err.push(bytes, &mut self.on_line),
        }
        Ok(())
    }

    fn closed(&mut self, stream: Stream) {
        match stream {
            Stream::Stdout => self.out.finish(&mut self.on_line),
            Stream::Stderr => self.err.finish(&mut self.on_line),
        }
    }
}

/// Runs one bounded command.
///
/// Completion means EOF on both pipes **and** an exit status, all before the deadline (a
/// grandchild holding a pipe open keeps the call open until the deadline). The child's process
/// tree is its own (a process group on Unix, a Job object on Windows), so helpers it spawns are
/// killed with it; on a normal exit, what it left running is not killed.
///
/// # Errors
///
/// [`Error::Spawn`] when the program cannot start; [`Error::Deadline`] when the deadline passes;
/// [`Error::OutputLimit`] when stdout and stderr together exceed the budget; [`Error::Io`] when a
/// pipe or the wait fails, or (Windows) the child cannot be put in a Job object. No error
/// carries partial output. On each of them the child's process tree has been killed (SIGKILL to
/// the group; the job terminated), and the child has been reaped, or handed to a background
/// task that reaps it, when this returns.
///
/// # Cancel safety and drop
///
/// Not cancel safe in the sense of keeping output: dropping the future discards it. Dropping it
/// is safe for the host: the child's process tree is killed at once and the child is
/// reaped in the background by tokio's kill-on-drop and orphan reaping. No call ever blocks on
/// that reaping.
pub async fn run_bounded(mut command: BoundedCommand) -> Result<RunOutput> {
    let mut sink = KeepSink {
        out: Kept::new(Stream::Stdout),
        err: Kept::new(Stream::Stderr),
        on_line: command.on_line.take(),
    };
    let (status, truncated) = drive(command, &mut sink).await?;
    Ok(RunOutput {
        status,
        stdout: sink.out.bytes,
        stderr: sink.err.bytes,
        truncated,
    })
}

/// Runs one bounded command, its output handed to `sink` as it arrives instead of kept: the
/// form [`run_bounded`] collects over. Every guarantee of [`run_bounded`] holds: the deadline,
/// the output budget over everything the sink was handed, the process tree killed and reaped on
/// every early exit. The line callback and prefix mode do not apply.
///
/// # Errors
///
/// As [`run_bounded`], plus the sink's own error and [`Error::Abandoned`] when the sink's
/// [`OutputSink::abandoned`] resolves; on each, the tree was killed and the child reaped.
///
/// # Cancel safety and drop
///
/// As [`run_bounded`]: dropping the future kills the child's process tree at once and reaps it
/// in the background.
pub async fn run_streaming(
    mut command: BoundedCommand,
    sink: &mut impl OutputSink,
) -> Result<ExitKind> {
    command.on_line = None;
    command.stop_after = None;
    drive(command, sink).await.map(|(status, _)| status)
}

/// The one loop under both forms: spawn, feed, read both pipes into `sink` against the budget,
/// wait, and kill and reap on every early exit. Returns the status and whether prefix mode cut
/// stdout.
async fn drive(command: BoundedCommand, sink: &mut impl OutputSink) -> Result<(ExitKind, bool)> {
    let BoundedCommand {
        program,
        args,
        env,
        stdin,
        output_budget,
        timeout,
        deadline,
        on_line: _,
        stop_after,
        current_dir,
    } = command;
    let name = program.to_string_lossy().into_owned();
    // A timeout too large for the clock is a deadline that never comes, never a panic.
    let deadline = deadline.or_else(|| Instant::now().checked_add(timeout));

    let mut process = Command::new(&program);
    process
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(n, v)| (n.as_os_str(), v.as_os_str())))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    ProcessTree::prepare(&mut process);
    if let Some(dir) = &current_dir {
        process.current_dir(dir);
    }
    let child = process.spawn().map_err(|source| Error::Spawn {
        program: name.clone(),
        source,
    })?;
    let mut guard = ChildGuard::new(child);
    if let Err(source) = guard.attach_tree() {
        guard.kill_and_reap().await;
        return Err(io_error(&name, "taking hold of the process tree", source));
    }
    let (stdin_pipe, stdout, stderr) = guard.take_pipes();
    let (Some(mut stdout), Some(mut stderr)) = (stdout, stderr) else {
        guard.kill_and_reap().await;
        return Err(io_error(
            &name,
            "taking the pipes",
            io::ErrorKind::Other.into(),
        ));
    };

    let mut feeding = stdin.is_some();
    let mut feed = pin!(feed_stdin(stdin_pipe, stdin));
    let mut sleep = pin!(until(deadline));
    let mut out_chunk = vec![0u8; READ_CHUNK];
    let mut err_chunk = vec![0u8; READ_CHUNK];
    let (mut out_open, mut err_open) = (true, true);
    let mut total = 0usize;
    let mut stdout_seen = 0usize;
    let mut exit: Option<ExitStatus> = None;

    let stop: Stop = loop {
        // The exit is awaited only once both pipes are at EOF, so knowing it means done.
        if let Some(status) = exit {
            break Stop::Done(status);
        }
        let want = READ_CHUNK.min(output_budget.saturating_sub(total).saturating_add(1));
        let read = tokio::select! {
            biased;
            () = &mut sleep => break Stop::Fail(Error::deadline(&name, timeout)),
            () = sink.abandoned() => break Stop::Fail(Error::abandoned(&name)),
            read = stdout.read(&mut out_chunk[..want]), if out_open => (Stream::Stdout, read),
            read = stderr.read(&mut err_chunk[..want]), if err_open => (Stream::Stderr, read),
            fed = &mut feed, if feeding => {
                feeding = false;
                if let Err(e) = fed {
                    break Stop::Fail(io_error(&name, "writing stdin", e));
                }
                continue;
            },
            // Reaped only after both pipes closed: until then the unreaped child keeps its pid,
            // and so the group id, from being reused, and a kill still reaches a grandchild
            // that holds a pipe open.
            status = guard.wait(), if exit.is_none() && !out_open && !err_open => match status {
                Ok(status) => {
                    exit = Some(status);
                    continue;
                }
                Err(e) => break Stop::Fail(io_error(&name, "waiting for the exit", e)),
            },
        };
        let (stream, chunk) = match read {
            (Stream::Stdout, Ok(n)) => (Stream::Stdout, &out_chunk[..n]),
            (Stream::Stderr, Ok(n)) => (Stream::Stderr, &err_chunk[..n]),
            (Stream::Stdout, Err(e)) => break Stop::Fail(io_error(&name, "reading stdout", e)),
            (Stream::Stderr, Err(e)) => break Stop::Fail(io_error(&name, "reading stderr", e)),
        };
        if chunk.is_empty() {
            match stream {
                Stream::Stdout => out_open = false,
                Stream::Stderr => err_open = false,
            }
            sink.closed(stream);
            continue;
        }
        if total + chunk.len() > output_budget {
            break Stop::Fail(Error::output_limit(&name, output_budget));
        }
        total += chunk.len();
        let (chunk, enough) = match (stream, stop_after) {
            (Stream::Stdout, Some(limit)) if stdout_seen + chunk.len() >= limit => {
                (&chunk[..limit - stdout_seen], true)
            }
            _ => (chunk, false),
        };
        if stream == Stream::Stdout {
            stdout_seen += chunk.len();
        }
        if let Err(error) = sink.accept(stream, chunk).await {
            break Stop::Fail(error);
        }
        if enough {
            break Stop::Prefix;
        }
    };

    match stop {
        Stop::Done(status) => Ok((exit_kind(status), false)),
        Stop::Fail(error) => {
            // Killed before its pipes close, so it ends by our SIGKILL, never by a SIGPIPE of its
            // own write racing the kill.
            guard.kill_and_reap().await;
            drop((stdout, stderr));
            Err(error)
        }
        Stop::Prefix => {
            // Killed before its pipes close, so it ends by our SIGKILL, never by a SIGPIPE of its
            // own write racing the kill.
            let reaped = guard.kill_and_reap().await;
            drop((stdout, stderr));
            match reaped.or(exit) {
                Some(status) => Ok((exit_kind(status), true)),
                None => Err(io_error(
                    &name,
                    "reaping after the prefix stop",
                    io::ErrorKind::TimedOut.into(),
                )),
            }
        }
    }
}

enum Stop {
    Done(ExitStatus),
    Fail(Error),
    Prefix,
}

fn io_error(program: &str, during: &'static str, source: io::Error) -> Error {
    Error::Io {
        program: program.to_owned(),
        during,
        source,
    }
}

#[cfg(unix)]
fn exit_kind(status: ExitStatus) -> ExitKind {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitKind::Exited(code),
        (None, Some(signal)) => ExitKind::Signaled(signal),
        // A terminated child has one or the other; report the raw wait status rather than invent
        // an exit code.
        (None, None) => ExitKind::Signaled(status.into_raw()),
    }
}

#[cfg(windows)]
use self::windows::exit_kind;

#[cfg(windows)]
mod windows {
    use std::process::ExitStatus;

    use crate::runner::ExitKind;

    pub(super) fn exit_kind(status: ExitStatus) -> ExitKind {
        // Windows has no signals: every end, a job termination included, sets an exit code,
        // and `code` always returns it there.
        ExitKind::Exited(status.code().unwrap_or(i32::MIN))
    }
}

/// Completes at `deadline`, or never when there is none.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes all of the feed to the child's stdin, then closes it.
async fn feed_stdin<W: AsyncWrite + Unpin>(pipe: Option<W>, feed: Option<Feed>) -> io::Result<()> {
    let (Some(mut pipe), Some(feed)) = (pipe, feed) else {
        return Ok(());
    };
    let copied = match feed {
        Feed::Bytes(bytes) => pipe.write_all(&bytes).await,
        Feed::Reader(reader) => {
            let mut reader = tokio::io::BufReader::with_capacity(READ_CHUNK * 4, reader);
            tokio::io::copy_buf(&mut reader, &mut pipe).await.map(drop)
        }
    };
    let written = match copied {
        Ok(()) => pipe.shutdown().await,
        Err(e) => Err(e),
    };
    match written {
        // The child may exit, or close its stdin, before reading everything: not a failure.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// The bytes kept from one stream, and where the next line for the callback starts.
struct Kept {
    stream: Stream,
    bytes: Vec<u8>,
    line_start: usize,
}

impl Kept {
    fn new(stream: Stream) -> Self {
        Kept {
            stream,
            bytes: Vec::new(),
            line_start: 0,
        }
    }

    fn push(&mut self, chunk: &[u8], on_line: &mut Option<LineCallback>) {
        let scan_from = self.bytes.len();
        self.bytes.extend_from_slice(chunk);
        let Some(callback) = on_line else {
            return;
        };
        let mut scan = scan_from;
        while let Some(offset) = self.bytes[scan..].iter().position(|b| *b == b'\n') {
            let end = scan + offset + 1;
            callback(self.stream, &self.bytes[self.line_start..end]);
            self.line_start = end;
            scan = end;
        }
        if self.bytes.len() - self.line_start >= READ_CHUNK {
            callback(self.stream, &self.bytes[self.line_start..]);
            self.line_start = self.bytes.len();
        }
    }

    fn finish(&mut self, on_line: &mut Option<LineCallback>) {
        if let Some(callback) = on_line {
            if self.line_start < self.bytes.len() {
                callback(self.stream, &self.bytes[self.line_start..]);
                self.line_start = self.bytes.len();
            }
        }
    }
}

/// Owns the child until it is reaped; dropping it unreaped kills the process tree, and the child,
/// dropped with it, goes to tokio's background orphan reaping (its kill-on-drop signals it again,
/// harmlessly: an unreaped child keeps its pid).
struct ChildGuard {
    child: Option<Child>,
    /// Held only while the child is unreaped (see [`ProcessTree::release`]).
    tree: Option<ProcessTree>,
}

impl ChildGuard {
    fn new(child: Child) -> Self {
        ChildGuard {
            child: Some(child),
            tree: None,
        }
    }

    /// Takes hold of the child's process tree; until then an early exit kills the child alone.
    fn attach_tree(&mut self) -> io::Result<()> {
        if let Some(child) = &mut self.child {
            self.tree = Some(ProcessTree::attach(child)?);
        }
        Ok(())
    }

    fn take_pipes(&mut self) -> (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>) {
        match &mut self.child {
            Some(child) => (child.stdin.take(), child.stdout.take(), child.stderr.take()),
            None => (None, None, None),
        }
    }

    /// Waits for the exit; once it is known, the tree is never killed again.
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        let Some(child) = &mut self.child else {
            return Err(io::ErrorKind::NotFound.into());
        };
        let status = child.wait().await?;
        if let Some(tree) = self.tree.take() {
            tree.release();
        }
        self.child = None;
        Ok(status)
    }

    fn kill_tree(&mut self) {
        if let Some(tree) = &self.tree {
            tree.kill();
        }
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }

    /// Kills the process tree and waits for the exit, for at most [`REAP_GRACE`]; past that the
    /// child stays with the guard, killed and unreaped, and goes to tokio's orphan reaping when
    /// the guard drops. Returns the exit status if it was reaped here. The pipes are closed by
    /// then: a killed child needs no reading to exit, and a writer that escaped the kill gets a
    /// broken pipe rather than a reader.
    async fn kill_and_reap(&mut self) -> Option<ExitStatus> {
        // Already reaped: nothing to kill, and the group id may no longer be ours.
        self.child.as_ref()?;
        self.kill_tree();
        tokio::time::timeout(REAP_GRACE, self.wait())
            .await
            .ok()?
            .ok()
    }
}

impl Drop for ChildGuard {
    /// Kills the tree of a child not yet reaped (a reaped one has neither child nor tree left).
    /// On Windows the job, dropped with the guard, also ends whatever the kill missed.
    fn drop(&mut self) {
        self.kill_tree();
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A stdin pipe whose every write fails with one error.
    struct FailingPipe(io::ErrorKind);

    impl AsyncWrite for FailingPipe {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(self.0.into()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    // No real pipe can be made to fail other than by a broken pipe, so the distinction the
    // runner draws is checked on a pipe that fails on demand.
    #[tokio::test]
    async fn a_stdin_write_error_other_than_a_broken_pipe_is_reported() {
        for kind in [
            io::ErrorKind::Other,
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::WriteZero,
        ] {
            let error = feed_stdin(Some(FailingPipe(kind)), bytes(b"input"))
                .await
                .expect_err("the error is reported");
            assert_eq!(error.kind(), kind);
        }
    }

    #[tokio::test]
    async fn a_child_that_stops_reading_its_stdin_is_not_a_failure() {
        feed_stdin(
            Some(FailingPipe(io::ErrorKind::BrokenPipe)),
            bytes(b"input"),
        )
        .await
        .expect("a broken pipe is the child's choice");
    }

    #[tokio::test]
    async fn every_stdin_byte_is_written() {
        let mut pipe = Vec::new();
        feed_stdin(Some(&mut pipe), bytes(b"all of it"))
            .await
            .unwrap();
        assert_eq!(pipe, b"all of it");
        let mut piped = Vec::new();
        let reader: Box<dyn AsyncRead + Send + Unpin> = Box::new(&b"from a reader"[..]);
        feed_stdin(Some(&mut piped), Some(Feed::Reader(reader)))
            .await
            .unwrap();
        assert_eq!(piped, b"from a reader");
    }

    fn bytes(text: &[u8]) -> Option<Feed> {
        Some(Feed::Bytes(text.to_vec()))
    }
}
