//! What the tools take and return: the argument and result types whose schemas the model
//! reads in `tools/list`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The model's view of a sandbox's egress.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressView {
    /// `closed` or `allowlist`.
    pub mode: String,
    /// The hosts it may reach (empty when closed).
    pub allow_hosts: Vec<String>,
}

/// `sandbox_create`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// A label for the kind of sandbox (letters, digits, `-`, `_`; default `default`).
    pub kind: Option<String>,
    /// Narrow the server's egress allowlist to these hosts (each must be allowed by the server).
    pub allow_hosts: Option<Vec<String>>,
}

/// `sandbox_create`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CreateResult {
    /// The handle to pass to the other tools.
    pub sandbox: String,
    /// The isolation rung of the backend (`container`, `microvm`, ...).
    pub isolation: String,
    /// What the sandbox can reach.
    pub egress: EgressView,
    /// Seconds of idleness before it is disposed of.
    pub expires_in_s: u64,
}

/// `sandbox_exec`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The handle from `sandbox_create`.
    pub sandbox: String,
    /// A shell command line, run under `sh -c`.
    pub command: Option<String>,
    /// A program and its arguments, run as given (instead of `command`).
    pub argv: Option<Vec<String>>,
    /// The working directory in the sandbox (relative to its work directory, or absolute).
    pub workdir: Option<String>,
    /// Environment variables for the command (secret-looking names are refused).
    pub env: Option<BTreeMap<String, String>>,
    /// Text fed to the command's standard input.
    pub stdin: Option<String>,
    /// Seconds before the command's processes are killed (capped by the server).
    pub timeout_s: Option<f64>,
    /// Bytes of each of stdout and stderr kept; more is truncated, head and tail kept (capped by
    /// the server).
    pub max_output_bytes: Option<u64>,
}

/// `sandbox_exec`'s result. A non-zero exit is a result, not an error.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecResult {
    /// The command's exit status; null when it timed out.
    pub exit_code: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Its standard output (head and tail when truncated).
    pub stdout: String,
    /// Its standard error (head and tail when truncated).
    pub stderr: String,
    /// Whether a control character other than newline and tab (a terminal escape sequence, a
    /// bare carriage return) was written in stdout or stderr as a visible `\xNN` escape.
    pub control_escaped: bool,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Wall time of the call.
    pub duration_ms: u64,
    /// The requests the sandbox's egress proxy refused while the command ran, one line each
    /// (method, destination, path, and why); absent when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<String>,
}

/// `sandbox_read_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path (relative to the work directory, or absolute under it).
    pub path: String,
    /// Return at most this many bytes (capped by the server).
    pub max_bytes: Option<u64>,
    /// The working directory that a relative `path` resolves against (relative to the
    /// sandbox's work directory, or absolute; default: the work directory), as `sandbox_exec`'s.
    pub workdir: Option<String>,
}

/// How file content is written in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The bytes are UTF-8 text.
    Utf8,
    /// The bytes in standard base64.
    Base64,
}

/// `sandbox_read_file`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadResult {
    /// The bytes, as text or base64.
    pub content: String,
    /// `utf8`, or `base64` when the bytes are not UTF-8.
    pub encoding: Encoding,
    /// The file's size in bytes.
    pub size: u64,
    /// Whether only the first `max_bytes` were returned.
    pub truncated: bool,
}

/// `sandbox_write_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path (parent directories are made).
    pub path: String,
    /// The content.
    pub content: String,
    /// How `content` is written (default `utf8`).
    pub encoding: Option<Encoding>,
    /// The working directory that a relative `path` resolves against (relative to the
    /// sandbox's work directory, or absolute; default: the work directory), as `sandbox_exec`'s.
    pub workdir: Option<String>,
}

/// `sandbox_write_file`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WriteResult {
    /// The path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// `sandbox_list_files`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest directory (default: the working directory).
    pub path: Option<String>,
    /// The working directory that a relative `path` resolves against (relative to the
    /// sandbox's work directory, or absolute; default: the work directory), as `sandbox_exec`'s.
    pub workdir: Option<String>,
}

/// One directory entry.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct FileEntry {
    /// Its path.
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    /// Its size, for files.
    pub size: Option<u64>,
}

/// `sandbox_list_files`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListFilesResult {
    /// The entries.
    pub entries: Vec<FileEntry>,
}

/// `sandbox_delete`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// The handle.
    pub sandbox: String,
    /// The guest path.
    pub path: String,
    /// Remove a directory and everything under it.
    pub recursive: Option<bool>,
    /// The working directory that a relative `path` resolves against (relative to the
    /// sandbox's work directory, or absolute; default: the work directory), as `sandbox_exec`'s.
    pub workdir: Option<String>,
}

/// `sandbox_delete`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DeleteResult {
    /// The path removed.
    pub deleted: String,
}

/// `sandbox_list`'s arguments (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {}

/// One of the caller's sandboxes.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct SandboxView {
    /// Its handle.
    pub sandbox: String,
    /// Its kind.
    pub kind: String,
    /// Its egress.
    pub egress: EgressView,
    /// Seconds of idleness left before it is disposed of.
    pub expires_in_s: u64,
}

/// `sandbox_list`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListResult {
    /// The caller's live sandboxes.
    pub sandboxes: Vec<SandboxView>,
}

/// `sandbox_dispose`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DisposeArgs {
    /// The handle.
    pub sandbox: String,
}

/// `sandbox_dispose`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DisposeResult {
    /// Whether a live sandbox of the caller's was disposed of now (false: there was none, it
    /// is already gone).
    pub disposed: bool,
}

/// `sandbox_reset`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetArgs {
    /// The handle.
    pub sandbox: String,
}

/// `sandbox_reset`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ResetResult {
    /// The handle, unchanged: it names the reset sandbox now.
    pub sandbox: String,
    /// Always true: every file and process made since the sandbox was created is gone.
    pub reset: bool,
}

/// `sandbox_fork`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The handle of the sandbox to copy.
    pub sandbox: String,
}

/// `sandbox_fork`'s result.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ForkResult {
    /// The new sandbox's handle.
    pub sandbox: String,
    /// The handle it was forked from.
    pub forked_from: String,
    /// The isolation rung of the backend.
    pub isolation: String,
    /// What the new sandbox can reach (as the source).
    pub egress: EgressView,
    /// Seconds of idleness before it is disposed of.
    pub expires_in_s: u64,
}
