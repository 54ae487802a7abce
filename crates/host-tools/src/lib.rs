//! Host tools for code that runs in a sandbox: a program in the guest calls a tool the host
//! registered, in one round trip, with several calls in flight.
//!
//! # Scope
//!
//! - [`frame`]: the versioned, length-prefixed frames of a run's channel, and a bounded decoder.
//!   No I/O; the host, the guest and the fuzz targets share it.
//! - [`schema`]: the JSON Schema subset a tool's arguments are checked against; a keyword it
//!   cannot enforce is refused when the tool is registered.
//! - The host side ([`Registry`], [`HostTool`], [`serve_run`]): every gate of a call.
//! - [`run_directory`]: the guest paths of a run, and the check the host applies to them.
//! - [`python_client`]: the Python module a run's program imports, one function per declared
//!   tool, generated from the schemas.
//! - [`relay`] (feature `relay`, on by default; Unix only): the guest side, the relay a run
//!   starts in the guest (`host-tool relay`) and the client (`host-tool NAME JSON`).
//!
//! It does not start a sandbox or a command: `sandbox-core` runs the relay and the command over
//! any backend's streamed exec and hands this crate the relay's stdin and stdout.
//!
//! # Threat model
//!
//! Everything from the guest is hostile: the relay, the client and the frames may be forged,
//! replayed, oversized or garbage. The host decodes with a bound fixed before the payload is
//! read, refuses any frame a guest may not send, checks every call against the run's declared
//! tools, the tool's schema and the run's size, count, concurrency and time bounds, and drops
//! every pending handler when the run ends. A guest can call only what the host declared for its
//! run, with arguments the schema admits; forging the relay gains nothing more.
//!
//! # Example
//!
//! ```
//! use host_tools::{HostTool, Registry, RunBounds};
//! use serde_json::json;
//!
//! let mut registry = Registry::new();
//! registry.register(HostTool::new(
//!     "add",
//!     "adds two integers",
//!     json!({"type": "object",
//!            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
//!            "required": ["a", "b"], "additionalProperties": false}),
//!     |arguments| async move {
//!         Ok(json!(arguments["a"].as_i64().unwrap_or(0) + arguments["b"].as_i64().unwrap_or(0)))
//!     },
//! )?)?;
//! let run = registry.for_run(["add"])?;
//! assert_eq!(run.names().collect::<Vec<_>>(), ["add"]);
//! assert_eq!(RunBounds::default().max_in_flight, 32);
//! # Ok::<(), host_tools::RegistryError>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod dispatch;
pub mod frame;
pub mod python_client;
#[cfg(all(unix, feature = "relay"))]
pub mod relay;
pub mod run_directory;
pub mod schema;

pub use dispatch::{
    await_ready, serve_run, valid_name, write_frame, ChannelError, HostTool, Registry,
    RegistryError, RunBounds, RunReport, RunTools, ToolError, ToolFuture,
};
pub use frame::{Decoder, FailureCode, Frame, FrameError};
