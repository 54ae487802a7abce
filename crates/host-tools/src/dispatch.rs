//! The host side: a registry of tools, and the server of one run's calls.
//!
//! Every gate is here, on the host: a call names a registered tool, one the run declared, with
//! arguments within the size bound that satisfy the tool's schema, within the run's count and
//! in-flight bounds; its handler answers within the call's deadline with a result within the
//! size bound. What the guest sends is only ever a request.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt as _};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::frame::{Decoder, FailureCode, Frame, FrameError, DEFAULT_MAX_PAYLOAD};
use crate::schema::{Schema, SchemaError};

/// What a handler returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send>>;

type Handler = Arc<dyn Fn(Value) -> ToolFuture + Send + Sync>;

/// A handler's refusal or failure, shown to the guest as `tool_failed` with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// A failure with a one-line message for the guest (never a secret of the host's).
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError(message.into())
    }
}

/// Why a tool cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Names are 1 to 64 of `[A-Za-z0-9_.-]`, starting with a letter.
    #[error("host tool name {0:?} is not 1 to 64 of [A-Za-z0-9_.-] starting with a letter")]
    BadName(String),
    /// A tool of that name is registered already.
    #[error("host tool {0:?} is registered twice")]
    Duplicate(String),
    /// The schema uses what cannot be enforced.
    #[error("host tool {name:?}: {source}")]
    Schema {
        /// The tool.
        name: String,
        /// Why.
        source: SchemaError,
    },
    /// A run declared a tool the registry does not hold.
    #[error("host tool {0:?} is declared for a run but not registered")]
    Undeclarable(String),
}

/// One tool the host serves.
#[derive(Clone)]
pub struct HostTool {
    name: String,
    description: String,
    schema_source: Value,
    schema: Schema,
    handler: Handler,
}

impl std::fmt::Debug for HostTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTool")
            .field("name", &self.name)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl HostTool {
    /// A tool named `name` whose arguments satisfy `schema`, answered by `handler`.
    ///
    /// # Errors
    /// [`RegistryError::BadName`] or [`RegistryError::Schema`].
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        schema: Value,
        handler: F,
    ) -> Result<HostTool, RegistryError>
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        let name = name.into();
        if !valid_name(&name) {
            return Err(RegistryError::BadName(name));
        }
        let compiled = Schema::compile(&schema).map_err(|source| RegistryError::Schema {
            name: name.clone(),
            source,
        })?;
        Ok(HostTool {
            name,
            description: description.into(),
            schema_source: schema,
            schema: compiled,
            handler: Arc::new(move |arguments| Box::pin(handler(arguments))),
        })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tool's description.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The schema as given.
    pub fn schema(&self) -> &Value {
        &self.schema_source
    }
}

/// True for a valid tool name: what a guest client may pass as one argument and a generated
/// binding may use as a name.
pub fn valid_name(name: &str) -> bool {
    let mut characters = name.chars();
    name.len() <= 64
        && characters
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic())
        && characters.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The host's tools, by name.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, HostTool>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a tool.
    ///
    /// # Errors
    /// [`RegistryError::Duplicate`] when the name is taken.
    pub fn register(&mut self, tool: HostTool) -> Result<(), RegistryError> {
        if self.tools.contains_key(&tool.name) {
            return Err(RegistryError::Duplicate(tool.name));
        }
        self.tools.insert(tool.name.clone(), tool);
        Ok(())
    }

    /// The tool of that name.
    pub fn get(&self, name: &str) -> Option<&HostTool> {
        self.tools.get(name)
    }

    /// Every tool, by name.
    pub fn tools(&self) -> impl Iterator<Item = &HostTool> {
        self.tools.values()
    }

    /// The tools a run may call: `declared`, each registered.
    ///
    /// # Errors
    /// [`RegistryError::Undeclarable`] for a name not registered.
    pub fn for_run<I, S>(&self, declared: I) -> Result<RunTools, RegistryError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut tools = BTreeMap::new();
        for name in declared {
            let name = name.into();
            let tool = self
                .tools
                .get(&name)
                .ok_or_else(|| RegistryError::Undeclarable(name.clone()))?;
            tools.insert(name, tool.clone());
        }
        Ok(RunTools {
            registered: self.tools.keys().cloned().collect(),
            tools,
        })
    }

    /// Every registered tool declared for a run.
    pub fn all_for_run(&self) -> RunTools {
        RunTools {
            registered: self.tools.keys().cloned().collect(),
            tools: self.tools.clone(),
        }
    }
}

/// The tools one run may call.
#[derive(Debug, Clone)]
pub struct RunTools {
    registered: BTreeSet<String>,
    tools: BTreeMap<String, HostTool>,
}

impl RunTools {
    /// The declared tools' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    /// True when no tool is declared.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The declared tools, by name.
    pub fn tools(&self) -> impl Iterator<Item = &HostTool> {
        self.tools.values()
    }
}

/// A run's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunBounds {
    /// The largest arguments accepted, as JSON bytes (default 64 KiB).
    pub max_argument_bytes: usize,
    /// The largest result returned, as JSON bytes (default 1 MiB).
    pub max_result_bytes: usize,
    /// The most calls one run may make (default 10,000).
    pub max_calls: u64,
    /// The most calls in flight at once (default 32); more are refused, not queued.
    pub max_in_flight: usize,
    /// How long one call's handler may take (default 30 s).
    pub call_deadline: Duration,
}

impl Default for RunBounds {
    fn default() -> RunBounds {
        RunBounds {
            max_argument_bytes: 64 * 1024,
            max_result_bytes: 1024 * 1024,
            max_calls: 10_000,
            max_in_flight: 32,
            call_deadline: Duration::from_secs(30),
        }
    }
}

impl RunBounds {
    /// The frame bound both sides decode with: the larger size bound and room for the envelope.
    pub fn max_frame_payload(&self) -> usize {
        self.max_argument_bytes.max(self.max_result_bytes) + 4096
    }
}

/// What one run's server did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Calls answered with a result.
    pub answered: u64,
    /// Calls refused by a gate before any handler ran.
    pub refused: u64,
    /// Calls whose handler failed, timed out or returned too much.
    pub failed: u64,
}

/// Why a run's channel ended before its command did.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The guest side sent what is not a frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The guest side sent a frame only the host may send.
    #[error("the guest sent a {0} frame")]
    Unexpected(&'static str),
    /// Reading or writing the channel failed.
    #[error("host-tool channel: {0}")]
    Io(#[from] std::io::Error),
    /// The relay did not report ready within its deadline.
    #[error("the host-tool relay did not start within {0:?}")]
    NotReady(Duration),
    /// The relay's output ended before it reported ready.
    #[error("the host-tool relay ended before it was ready")]
    EndedBeforeReady,
}

/// Reads frames from the relay until its `Ready`, within `deadline`; returns the socket and the
/// decoder holding whatever followed it.
///
/// # Errors
/// [`ChannelError`] when the relay sends anything else first, ends, or is late.
pub async fn await_ready<R: AsyncRead + Unpin>(
    from_guest: &mut R,
    bounds: &RunBounds,
    deadline: Duration,
) -> Result<(String, Decoder, Vec<Frame>), ChannelError> {
    let mut decoder = Decoder::new(bounds.max_frame_payload().max(DEFAULT_MAX_PAYLOAD));
    let wait = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = from_guest.read(&mut buffer).await?;
            if read == 0 {
                return Err(ChannelError::EndedBeforeReady);
            }
            let mut frames = decoder.feed_all(&buffer[..read])?.into_iter();
            if let Some(first) = frames.next() {
                return match first {
                    Frame::Ready { socket } => Ok((socket, frames.collect())),
                    other => Err(ChannelError::Unexpected(kind_name(&other))),
                };
            }
        }
    };
    let (socket, rest) = tokio::time::timeout(deadline, wait)
        .await
        .map_err(|_| ChannelError::NotReady(deadline))??;
    Ok((socket, decoder, rest))
}

fn kind_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::Call { .. } => "call",
        Frame::Result { .. } => "result",
        Frame::Failure { .. } => "failure",
        Frame::Ready { .. } => "ready",
        Frame::Drain => "drain",
    }
}

/// Serves one run's calls: reads calls from `from_guest`, answers on `to_guest`, until
/// `from_guest` ends (`Ok`, pending calls dropped: no answer could reach the guest) or breaks
/// the protocol (`Err`). `pending` holds frames already
/// decoded (those [`await_ready`] read past the `Ready`).
///
/// The counts go to `report` as calls end, so they survive the future being dropped.
///
/// # Errors
/// [`ChannelError`] when the guest side sends what is not a call or the channel fails.
///
/// # Cancel safety and drop
/// Dropping the future drops every handler future in flight: a run's end or cancellation
/// cancels its pending host-tool calls, and no handler runs after it.
pub async fn serve_run<R, W>(
    tools: &RunTools,
    bounds: &RunBounds,
    mut decoder: Decoder,
    pending: Vec<Frame>,
    mut from_guest: R,
    mut to_guest: W,
    report: &mut RunReport,
) -> Result<(), ChannelError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut in_flight = FuturesUnordered::new();
    let mut ids: HashSet<u64> = HashSet::new();
    let mut calls = 0u64;
    let mut buffer = vec![0u8; 16 * 1024];
    let mut frames: std::collections::VecDeque<Frame> = pending.into();
    loop {
        while let Some(frame) = frames.pop_front() {
            let Frame::Call {
                id,
                tool,
                arguments,
            } = frame
            else {
                return Err(ChannelError::Unexpected(kind_name(&frame)));
            };
            calls += 1;
            let gate = admit(
                tools,
                bounds,
                &ids,
                calls,
                in_flight.len(),
                id,
                &tool,
                &arguments,
            );
            match gate {
                Err((code, message)) => {
                    report.refused += 1;
                    tracing::debug!(tool, %code, "host tool call refused");
                    write_frame(&mut to_guest, &Frame::Failure { id, code, message }).await?;
                }
                Ok(handler) => {
                    ids.insert(id);
                    let deadline = bounds.call_deadline;
                    in_flight.push(async move {
                        let outcome = tokio::time::timeout(deadline, handler(arguments)).await;
                        (id, outcome)
                    });
                }
            }
        }
        tokio::select! {
            read = from_guest.read(&mut buffer) => {
                let read = read?;
                if read == 0 {
                    // Nothing can reach the guest any more: the pending handlers are dropped
                    // with this future.
                    return Ok(());
                }
                frames.extend(decoder.feed_all(&buffer[..read])?);
            }
            Some((id, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                ids.remove(&id);
                let frame = answer(bounds, id, outcome, report);
                write_frame(&mut to_guest, &frame).await?;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn admit(
    tools: &RunTools,
    bounds: &RunBounds,
    ids: &HashSet<u64>,
    calls: u64,
    in_flight: usize,
    id: u64,
    tool: &str,
    arguments: &Value,
) -> Result<Handler, (FailureCode, String)> {
    if calls > bounds.max_calls {
        return Err((
            FailureCode::TooManyCalls,
            format!("this run may make {} calls", bounds.max_calls),
        ));
    }
    if in_flight >= bounds.max_in_flight {
        return Err((
            FailureCode::TooManyInFlight,
            format!("this run may have {} calls in flight", bounds.max_in_flight),
        ));
    }
    if ids.contains(&id) {
        return Err((
            FailureCode::DuplicateCallId,
            format!("call {id} is in flight"),
        ));
    }
    let Some(declared) = tools.tools.get(tool) else {
        let code = if tools.registered.contains(tool) {
            FailureCode::UndeclaredTool
        } else {
            FailureCode::UnknownTool
        };
        let shown: String = tool.chars().take(64).collect();
        return Err((code, format!("no tool {shown:?} in this run")));
    };
    let size = serde_json::to_vec(arguments).map_or(usize::MAX, |bytes| bytes.len());
    if size > bounds.max_argument_bytes {
        return Err((
            FailureCode::ArgumentsTooLarge,
            format!(
                "arguments of {size} bytes are over the {}-byte bound",
                bounds.max_argument_bytes
            ),
        ));
    }
    declared
        .schema
        .check(arguments)
        .map_err(|violation| (FailureCode::InvalidArguments, violation.to_string()))?;
    Ok(declared.handler.clone())
}

fn answer(
    bounds: &RunBounds,
    id: u64,
    outcome: Result<Result<Value, ToolError>, tokio::time::error::Elapsed>,
    report: &mut RunReport,
) -> Frame {
    let failure = |code, message: String| Frame::Failure { id, code, message };
    match outcome {
        Err(_) => {
            report.failed += 1;
            failure(
                FailureCode::DeadlineExceeded,
                format!("no answer within {:?}", bounds.call_deadline),
            )
        }
        Ok(Err(error)) => {
            report.failed += 1;
            failure(FailureCode::ToolFailed, error.0)
        }
        Ok(Ok(value)) => {
            let size = serde_json::to_vec(&value).map_or(usize::MAX, |bytes| bytes.len());
            if size > bounds.max_result_bytes {
                report.failed += 1;
                failure(
                    FailureCode::ResultTooLarge,
                    format!(
                        "a result of {size} bytes is over the {}-byte bound",
                        bounds.max_result_bytes
                    ),
                )
            } else {
                report.answered += 1;
                Frame::Result { id, value }
            }
        }
    }
}

/// Writes one frame and flushes it.
///
/// # Errors
/// The write's error.
pub async fn write_frame<W: AsyncWrite + Unpin>(to: &mut W, frame: &Frame) -> std::io::Result<()> {
    to.write_all(&frame.encode()).await?;
    to.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{duplex, DuplexStream};

    fn registry() -> Registry {
        let mut registry = Registry::new();
        registry
            .register(
                HostTool::new(
                    "echo",
                    "returns its text",
                    json!({"type": "object", "properties": {"text": {"type": "string"}},
                           "required": ["text"], "additionalProperties": false}),
                    |arguments| async move { Ok(arguments["text"].clone()) },
                )
                .unwrap(),
            )
            .unwrap();
        registry
            .register(
                HostTool::new("fail", "always fails", json!({}), |_| async {
                    Err(ToolError::new("no luck"))
                })
                .unwrap(),
            )
            .unwrap();
        registry
            .register(
                HostTool::new("big", "returns n bytes", json!({"type": "integer"}), |n| async move {
                    Ok(Value::String("x".repeat(n.as_u64().unwrap_or(0) as usize)))
                })
                .unwrap(),
            )
            .unwrap();
        registry
    }

    struct Guest {
        to_host: DuplexStream,
        from_host: DuplexStream,
        decoder: Decoder,
    }

    impl Guest {
        async fn send(&mut self, frame: Frame) {
            write_frame(&mut self.to_host, &frame).await.unwrap();
        }
        async fn receive(&mut self) -> Frame {
            let mut buffer = [0u8; 1];
            loop {
                let read = self.from_host.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the host closed the channel");
                if let Some(frame) = self.decoder.feed_all(&buffer[..read]).unwrap().pop() {
                    return frame;
                }
            }
        }
    }

    fn start(
        tools: RunTools,
        bounds: RunBounds,
    ) -> (
        Guest,
        tokio::task::JoinHandle<Result<RunReport, ChannelError>>,
    ) {
        let (to_host, host_reads) = duplex(1 << 20);
        let (host_writes, from_host) = duplex(1 << 20);
        let server = tokio::spawn(async move {
            let decoder = Decoder::new(bounds.max_frame_payload());
            let mut report = RunReport::default();
            serve_run(
                &tools,
                &bounds,
                decoder,
                Vec::new(),
                host_reads,
                host_writes,
                &mut report,
            )
            .await
            .map(|()| report)
        });
        let guest = Guest {
            to_host,
            from_host,
            decoder: Decoder::new(DEFAULT_MAX_PAYLOAD * 2),
        };
        (guest, server)
    }

    fn call(id: u64, tool: &str, arguments: Value) -> Frame {
        Frame::Call {
            id,
            tool: tool.to_owned(),
            arguments,
        }
    }

    fn failure_code(frame: &Frame) -> Option<FailureCode> {
        match frame {
            Frame::Failure { code, .. } => Some(*code),
            _ => None,
        }
    }

    #[tokio::test]
    async fn every_gate_answers_with_its_code() {
        let registry = registry();
        let tools = registry.for_run(["echo", "fail", "big"]).unwrap();
        let mut partial = Registry::new();
        partial
            .register(registry.get("echo").unwrap().clone())
            .unwrap();
        partial
            .register(registry.get("fail").unwrap().clone())
            .unwrap();
        let (mut guest, server) = start(
            tools,
            RunBounds {
                max_argument_bytes: 100,
                max_result_bytes: 1000,
                ..RunBounds::default()
            },
        );
        guest.send(call(1, "echo", json!({"text": "héllo"}))).await;
        assert_eq!(
            guest.receive().await,
            Frame::Result {
                id: 1,
                value: json!("héllo")
            }
        );
        for (id, tool, arguments, code) in [
            (2, "nope", json!({}), FailureCode::UnknownTool),
            (3, "echo", json!({"text": 1}), FailureCode::InvalidArguments),
            (
                4,
                "echo",
                json!({"text": "x".repeat(200)}),
                FailureCode::ArgumentsTooLarge,
            ),
            (5, "fail", json!(null), FailureCode::ToolFailed),
            (6, "big", json!(2000), FailureCode::ResultTooLarge),
        ] {
            guest.send(call(id, tool, arguments)).await;
            let frame = guest.receive().await;
            assert_eq!(frame.id(), Some(id));
            assert_eq!(failure_code(&frame), Some(code), "{frame:?}");
        }
        drop(guest.to_host);
        let report = server.await.unwrap().unwrap();
        assert_eq!(
            report,
            RunReport {
                answered: 1,
                refused: 3,
                failed: 2
            }
        );
    }

    #[tokio::test]
    async fn a_registered_tool_not_declared_is_undeclared_not_unknown() {
        let registry = registry();
        let (mut guest, _server) = start(registry.for_run(["echo"]).unwrap(), RunBounds::default());
        guest.send(call(1, "fail", json!({}))).await;
        assert_eq!(
            failure_code(&guest.receive().await),
            Some(FailureCode::UndeclaredTool)
        );
        assert!(matches!(
            registry.for_run(["ghost"]),
            Err(RegistryError::Undeclarable(name)) if name == "ghost"
        ));
    }

    fn waiting_tool(started: Arc<AtomicUsize>, release: Arc<tokio::sync::Notify>) -> HostTool {
        HostTool::new("wait", "waits", json!({}), move |_| {
            let started = started.clone();
            let release = release.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                Ok(json!("released"))
            }
        })
        .unwrap()
    }

    #[tokio::test]
    async fn calls_overlap_and_the_in_flight_bound_refuses_the_excess() {
        let started = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let mut registry = Registry::new();
        registry
            .register(waiting_tool(started.clone(), release.clone()))
            .unwrap();
        let (mut guest, _server) = start(
            registry.all_for_run(),
            RunBounds {
                max_in_flight: 8,
                ..RunBounds::default()
            },
        );
        for id in 0..9 {
            guest.send(call(id, "wait", json!(null))).await;
        }
        // The ninth is refused at once, while eight handlers are running together.
        let refused = guest.receive().await;
        assert_eq!(refused.id(), Some(8));
        assert_eq!(failure_code(&refused), Some(FailureCode::TooManyInFlight));
        tokio::time::timeout(Duration::from_secs(10), async {
            while started.load(Ordering::SeqCst) < 8 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("eight handlers running at once");
        // A duplicate of an id in flight is refused too.
        guest.send(call(3, "wait", json!(null))).await;
        assert_eq!(
            failure_code(&guest.receive().await),
            Some(FailureCode::TooManyInFlight)
        );
        release.notify_waiters();
        let mut answered = 0;
        while answered < 8 {
            assert!(matches!(guest.receive().await, Frame::Result { .. }));
            answered += 1;
        }
    }

    #[tokio::test]
    async fn a_duplicate_id_in_flight_is_refused() {
        let started = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let mut registry = Registry::new();
        registry.register(waiting_tool(started, release)).unwrap();
        let (mut guest, _server) = start(registry.all_for_run(), RunBounds::default());
        guest.send(call(5, "wait", json!(null))).await;
        guest.send(call(5, "wait", json!(null))).await;
        let frame = guest.receive().await;
        assert_eq!(failure_code(&frame), Some(FailureCode::DuplicateCallId));
    }

    #[tokio::test]
    async fn the_call_count_is_bounded() {
        let (mut guest, _server) = start(
            registry().all_for_run(),
            RunBounds {
                max_calls: 2,
                ..RunBounds::default()
            },
        );
        for id in 0..3 {
            guest.send(call(id, "echo", json!({"text": "a"}))).await;
            let frame = guest.receive().await;
            if id < 2 {
                assert!(matches!(frame, Frame::Result { .. }), "{frame:?}");
            } else {
                assert_eq!(failure_code(&frame), Some(FailureCode::TooManyCalls));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_handler_meets_its_deadline() {
        let mut registry = Registry::new();
        registry
            .register(
                HostTool::new("slow", "sleeps", json!({}), |_| async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(json!(null))
                })
                .unwrap(),
            )
            .unwrap();
        let (mut guest, _server) = start(
            registry.all_for_run(),
            RunBounds {
                call_deadline: Duration::from_secs(1),
                ..RunBounds::default()
            },
        );
        guest.send(call(1, "slow", json!(null))).await;
        assert_eq!(
            failure_code(&guest.receive().await),
            Some(FailureCode::DeadlineExceeded)
        );
    }

    #[tokio::test]
    async fn dropping_the_server_cancels_pending_handlers() {
        struct Observed(Arc<AtomicUsize>);
        impl Drop for Observed {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let cancelled = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(tokio::sync::Notify::new());
        let mut registry = Registry::new();
        {
            let cancelled = cancelled.clone();
            let started = started.clone();
            registry
                .register(
                    HostTool::new("hang", "never answers", json!({}), move |_| {
                        let guard = Observed(cancelled.clone());
                        let started = started.clone();
                        async move {
                            let _guard = guard;
                            started.notify_one();
                            std::future::pending::<()>().await;
                            Ok(json!(null))
                        }
                    })
                    .unwrap(),
                )
                .unwrap();
        }
        let (mut guest, server) = start(registry.all_for_run(), RunBounds::default());
        guest.send(call(1, "hang", json!(null))).await;
        started.notified().await;
        assert_eq!(cancelled.load(Ordering::SeqCst), 0);
        server.abort();
        let _ = server.await;
        assert_eq!(cancelled.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn garbage_or_a_host_frame_from_the_guest_ends_the_channel() {
        let (mut guest, server) = start(registry().all_for_run(), RunBounds::default());
        guest
            .to_host
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(matches!(
            server.await.unwrap(),
            Err(ChannelError::Frame(FrameError::BadMagic(b'G')))
        ));
        let (mut guest, server) = start(registry().all_for_run(), RunBounds::default());
        guest
            .send(Frame::Result {
                id: 1,
                value: json!(1),
            })
            .await;
        assert!(matches!(
            server.await.unwrap(),
            Err(ChannelError::Unexpected("result"))
        ));
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_from_its_header() {
        let (mut guest, server) = start(
            registry().all_for_run(),
            RunBounds {
                max_argument_bytes: 10,
                max_result_bytes: 10,
                ..RunBounds::default()
            },
        );
        let mut header = vec![b'H', 1, 1, 0];
        header.extend_from_slice(&(1u32 << 30).to_be_bytes());
        guest.to_host.write_all(&header).await.unwrap();
        assert!(matches!(
            server.await.unwrap(),
            Err(ChannelError::Frame(FrameError::Oversized { .. }))
        ));
    }

    #[tokio::test]
    async fn ready_is_awaited_and_what_follows_kept() {
        let (mut to_host, mut host_reads) = duplex(1024);
        let mut bytes = Frame::Ready {
            socket: "/tmp/x/socket".into(),
        }
        .encode();
        bytes.extend(call(1, "echo", json!({"text": "a"})).encode());
        to_host.write_all(&bytes).await.unwrap();
        let (socket, _decoder, rest) = await_ready(
            &mut host_reads,
            &RunBounds::default(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(socket, "/tmp/x/socket");
        assert_eq!(rest, vec![call(1, "echo", json!({"text": "a"}))]);

        let (to_host, mut host_reads) = duplex(1024);
        drop(to_host);
        assert!(matches!(
            await_ready(
                &mut host_reads,
                &RunBounds::default(),
                Duration::from_secs(5)
            )
            .await,
            Err(ChannelError::EndedBeforeReady)
        ));
        let (mut to_host, mut host_reads) = duplex(1024);
        to_host.write_all(&Frame::Drain.encode()).await.unwrap();
        assert!(matches!(
            await_ready(
                &mut host_reads,
                &RunBounds::default(),
                Duration::from_secs(5)
            )
            .await,
            Err(ChannelError::Unexpected("drain"))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_relay_is_late() {
        let (_to_host, mut host_reads) = duplex(1024);
        assert!(matches!(
            await_ready(
                &mut host_reads,
                &RunBounds::default(),
                Duration::from_secs(5)
            )
            .await,
            Err(ChannelError::NotReady(_))
        ));
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "search_web", "fs.read", "a-1", &"a".repeat(64)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "1a", "_a", "a b", "a/b", "é", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
            assert!(matches!(
                HostTool::new(bad, "", json!({}), |_| async { Ok(json!(null)) }),
                Err(RegistryError::BadName(_))
            ));
        }
        let mut registry = registry();
        let again = registry.get("echo").unwrap().clone();
        assert!(matches!(
            registry.register(again),
            Err(RegistryError::Duplicate(_))
        ));
        assert!(matches!(
            HostTool::new("t", "", json!({"oneOf": []}), |_| async { Ok(json!(null)) }),
            Err(RegistryError::Schema { .. })
        ));
    }
}
