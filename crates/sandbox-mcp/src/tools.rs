//! The tools: `sandbox_create`, `sandbox_exec`, the file tools, `sandbox_list`,
//! `sandbox_dispose`, and `sandbox_reset` and `sandbox_fork` where the backend declares
//! `snapshot`, over one [`sandbox_core::Router`].
//!
//! Who chooses what (the trust model is in `docs/mcp.md`): the server chooses the backend, the
//! image, the egress allowlist, the key's scope and agent, and every bound (timeout, output,
//! file size); the model chooses a kind, commands, guest paths and file contents, and can only
//! narrow egress. File tools carry content in the protocol and name guest paths only: no tool
//! reads or writes a host path.
//!
//! Its parts, each readable alone: `settings` (what the tools read of the configuration),
//! `shared` (the state every connection shares: router, handle table, liveness), `handlers`
//! (one method per tool), `exec` (a command's arguments, run and bounded output) and `messages`
//! (the arguments and results whose schemas the model reads).

mod exec;
mod handlers;
mod messages;
mod operator_egress;
mod settings;
mod shared;

pub use exec::run_exec;
pub use handlers::{HttpPrincipal, SandboxServer};
pub use messages::{
    CreateArgs, CreateResult, DeleteArgs, DeleteResult, DisposeArgs, DisposeResult, EgressView,
    Encoding, ExecArgs, ExecResult, FileEntry, ForkArgs, ForkResult, ListArgs, ListFilesArgs,
    ListFilesResult, ListResult, ReadArgs, ReadResult, ResetArgs, ResetResult, SandboxView,
    WriteArgs, WriteResult,
};
pub use operator_egress::OperatorEgress;
pub use settings::Settings;
pub use shared::Shared;

#[cfg(test)]
mod tests;
