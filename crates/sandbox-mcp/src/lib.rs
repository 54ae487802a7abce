//! `sandbox-mcp`: every sandbox as tools for any agent host, over the Model Context Protocol.
//!
//! A host like `sandboxctl`, on the same [`sandbox_core::Router`] and the same backend
//! construction (`sandbox-backends`); it adds nothing to the core. The server serves stdio (one
//! client, the default) or Streamable HTTP (`--http`, bearer tokens naming principals). Its
//! tools are in [`tools`]; the trust model (who chooses what, what the model can never reach) is
//! in `docs/mcp.md`.
//!
//! What it does not do: read or write host files for the model (file tools carry content in the
//! protocol), let the model choose a backend, image, key, egress beyond the server's allowlist
//! or any bound above the server's.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod config;
pub mod egress_log;
pub mod errors;
pub mod handles;
pub mod http;
pub mod liveness;
pub mod output;
pub mod state_dir;
pub mod stdio;
pub mod tools;

pub use config::Cli;
pub use errors::ToolFailure;
pub use tools::{SandboxServer, Settings, Shared};
