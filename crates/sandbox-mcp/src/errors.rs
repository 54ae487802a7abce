//! Tool failures as the model sees them: a kind, a short sanitized message and whether trying
//! again may help.
//!
//! Threat model: the text of an engine or backend error can carry host paths, engine addresses,
//! the value of an environment variable or a multi-line trace. None of that is the model's to
//! see. The message of a failure is therefore chosen from a fixed table by kind; the few kinds
//! whose detail is about the model's own input (an invalid argument, an egress or admission
//! refusal) carry that detail only after [`sanitize`] has removed anything path-, address- or
//! assignment-shaped.

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use sandbox_core::{ErrorKind, SandboxError};
use serde::Serialize;
use serde_json::json;

/// A failed tool call, answered as an `isError` result `{error: {kind, message, retryable}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{kind}: {message}")]
#[non_exhaustive]
pub struct ToolFailure {
    /// A stable word the model can branch on.
    pub kind: &'static str,
    /// One short sentence, sanitized.
    pub message: String,
    /// Whether the same call may succeed later.
    pub retryable: bool,
}

/// The longest message detail a failure carries.
const DETAIL_MAX: usize = 160;

impl ToolFailure {
    /// A failure of `kind` with a message the server wrote itself.
    #[cold]
    pub fn new(kind: &'static str, message: impl Into<String>, retryable: bool) -> Self {
        ToolFailure {
            kind,
            message: message.into(),
            retryable,
        }
    }

    /// The handle names no sandbox of this caller (never made, made by another principal, or
    /// disposed of).
    #[cold]
    pub fn unknown_sandbox() -> Self {
        Self::new(
            "unknown_sandbox",
            "no such sandbox; create one with sandbox_create",
            false,
        )
    }

    /// The handle's sandbox was disposed of after its idle time-to-live.
    #[cold]
    pub fn expired_sandbox() -> Self {
        Self::new(
            "expired_sandbox",
            "the sandbox expired after being idle; create a new sandbox",
            false,
        )
    }

    /// An argument the model passed is malformed.
    #[cold]
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", sanitize(&message.into()), false)
    }

    /// The server is ending and makes no new sandbox.
    #[cold]
    pub fn shutting_down() -> Self {
        Self::new(
            "shutting_down",
            "the server is ending and creates no sandbox",
            false,
        )
    }

    /// A create past the server's limit on sandboxes held at once: by this principal
    /// (`per_principal`) or by the whole server. Retryable: a sandbox disposed of (or expired)
    /// makes room.
    #[cold]
    pub fn sandbox_limit(limit: usize, per_principal: bool) -> Self {
        let message = if per_principal {
            format!("you already hold {limit} sandboxes, the most this server allows one caller; dispose of one (sandbox_dispose) or try again later")
        } else {
            format!("the server already holds {limit} sandboxes, the most it allows; dispose of one of yours (sandbox_dispose) or try again later")
        };
        Self::new("sandbox_limit", message, true)
    }

    /// The call was cancelled by the client.
    #[cold]
    pub fn cancelled() -> Self {
        Self::new(
            "cancelled",
            "the call was cancelled; its processes were killed",
            false,
        )
    }

    /// A core error, mapped by kind. `path` is the guest path the model named, if any: the one
    /// piece of a file error's detail that is the model's own.
    #[cold]
    pub fn from_sandbox(error: &SandboxError, path: Option<&str>) -> Self {
        let on = |what: &str| match path {
            Some(p) => format!("{what}: {}", sanitize_path(p)),
            None => what.to_owned(),
        };
        let detail = || sanitize(&error.to_string());
        let (kind, message, retryable) = match error.kind() {
            ErrorKind::Confinement => (
                "confinement",
                on("path refused (it leaves the working directory, goes through a link or names a protected place)"),
                false,
            ),
            ErrorKind::InvalidArgument => ("invalid_argument", detail(), false),
            ErrorKind::NotFound => ("not_found", on("no such file or directory"), false),
            ErrorKind::NotADirectory => ("not_a_directory", on("not a directory"), false),
            ErrorKind::IsADirectory => ("is_a_directory", on("is a directory"), false),
            ErrorKind::NotRegularFile => ("not_regular_file", on("not a regular file"), false),
            ErrorKind::GuestRefused => ("guest_refused", on("the sandbox refused the operation"), false),
            ErrorKind::TransferCapExceeded => ("over_cap", on("the file is larger than the server allows"), false),
            ErrorKind::OutputLimitExceeded => ("over_cap", "the output passed the server's cap".to_owned(), false),
            ErrorKind::Timeout => ("timeout", "the call's time bound expired".to_owned(), true),
            ErrorKind::EngineTimeout => ("engine_timeout", "the sandbox engine did not answer in time".to_owned(), true),
            ErrorKind::BackendUnavailable | ErrorKind::DaemonFault | ErrorKind::LoginRequired => (
                "engine_unavailable",
                "the sandbox engine is unavailable; try again later".to_owned(),
                true,
            ),
            ErrorKind::Engine | ErrorKind::Io | ErrorKind::ContractViolation => {
                ("engine", "the sandbox engine failed".to_owned(), true)
            }
            ErrorKind::Busy => ("busy", "the sandbox is busy; try again".to_owned(), true),
            ErrorKind::Retired | ErrorKind::SandboxGone | ErrorKind::WorkspaceMismatch => (
                "sandbox_gone",
                "the sandbox is no longer usable; dispose of it and create a new sandbox".to_owned(),
                false,
            ),
            ErrorKind::ImageMissing => ("engine_unavailable", "the sandbox image is not available on this host".to_owned(), false),
            ErrorKind::Unclean => ("unclean", "an earlier disposal did not finish; create a new sandbox".to_owned(), true),
            ErrorKind::Unsupported => ("unsupported", "this backend does not support the operation".to_owned(), false),
            ErrorKind::SpecMismatch => ("spec_mismatch", "a sandbox with another configuration exists".to_owned(), false),
            kind if kind.is_admission_refusal() => ("not_permitted", detail(), false),
            _ => ("engine", "the sandbox engine failed".to_owned(), true),
        };
        ToolFailure {
            kind,
            message,
            retryable,
        }
    }
}

impl IntoCallToolResult for ToolFailure {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let text = format!("error ({}): {}", self.kind, self.message);
        let mut result = CallToolResult::structured_error(json!({ "error": self }));
        result.content = vec![ContentBlock::text(text)];
        Ok(result.into())
    }
}

/// A guest path for a message: as given, cut short, control characters replaced.
fn sanitize_path(path: &str) -> String {
    let mut out: String = path
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(DETAIL_MAX)
        .collect();
    if path.chars().count() > DETAIL_MAX {
        out.push('…');
    }
    out
}

/// One line of at most 160 characters, with every word that looks like a path, an
/// address, an assignment or a quoted value replaced by a placeholder. What is left are the
/// library's own words about an argument.
pub fn sanitize(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    // A quoted span may hold a value (an environment value, a guest string): drop its content.
    let mut unquoted = String::with_capacity(first.len());
    let mut quote: Option<char> = None;
    for c in first.chars() {
        match quote {
            Some(q) if c == q => {
                unquoted.push('…');
                unquoted.push(c);
                quote = None;
            }
            Some(_) => {}
            None if c == '"' || c == '`' => {
                unquoted.push(c);
                quote = Some(c);
            }
            None => unquoted.push(c),
        }
    }
    let words: Vec<String> = unquoted
        .split_whitespace()
        .map(|word| {
            let bare = word.trim_matches(|c: char| {
                matches!(c, ',' | ';' | '(' | ')' | '.' | ':' | '\'' | '[' | ']')
            });
            let pathlike = bare.contains('/') || bare.contains('\\') || bare.starts_with('~');
            let addresslike = bare.contains("://")
                || bare.contains('@')
                || looks_like_host_port(bare)
                || bare.contains(".sock");
            let assignment = bare.contains('=');
            if pathlike || addresslike || assignment {
                "<redacted>".to_owned()
            } else {
                word.chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect()
            }
        })
        .collect();
    let mut line = words.join(" ");
    if line.chars().count() > DETAIL_MAX {
        line = line.chars().take(DETAIL_MAX).collect::<String>() + "…";
    }
    line
}

/// `a.b:123`, `1.2.3.4:5`, `[::1]:5`, `host:5`: something followed by a colon and a port.
fn looks_like_host_port(word: &str) -> bool {
    match word.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !port.is_empty() && port.chars().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors whose text carries something the model must never see, and that something.
    fn leaky_errors() -> Vec<(SandboxError, &'static str)> {
        vec![
            (
                SandboxError::engine("connect unix:///var/run/docker.sock: permission denied"),
                "docker.sock",
            ),
            (
                SandboxError::engine("error trying to connect: tcp://10.0.0.7:2376 refused"),
                "10.0.0.7",
            ),
            (
                SandboxError::engine("open /home/alice/.docker/config.json: no such file"),
                "/home/alice",
            ),
            (
                SandboxError::engine(
                    "panicked at src/main.rs:10:5\nstack backtrace:\n 0: rust_begin_unwind",
                ),
                "backtrace",
            ),
            (
                SandboxError::invalid("env API_TOKEN=hunter2 refused"),
                "hunter2",
            ),
            (
                SandboxError::invalid("environment value \"s3cr3t-value\" contains a NUL byte"),
                "s3cr3t-value",
            ),
            (
                SandboxError::invalid("cannot read /etc/sandbox-mcp/tokens: permission denied"),
                "/etc/sandbox-mcp",
            ),
            (
                SandboxError::invalid("the engine at 192.168.1.5:2375 refused the spec"),
                "192.168.1.5",
            ),
            (
                SandboxError::invalid("proxy ssh://admin@build-host refused"),
                "admin@build-host",
            ),
            (
                SandboxError::NotPermitted(
                    "C:\\Users\\bob\\.ssh\\id_rsa is a credential path".into(),
                ),
                "Users",
            ),
            (
                SandboxError::NotPermitted("~/.aws/credentials is a credential path".into()),
                ".aws",
            ),
            (
                SandboxError::confinement("/var/lib/sbx/ws/abc/../../etc", "goes through a link"),
                "/var/lib/sbx",
            ),
            (
                SandboxError::engine("the sbx program /opt/docker/bin/sbx exited 1"),
                "/opt/docker",
            ),
        ]
    }

    #[test]
    fn no_failure_text_leaks_what_its_error_carried() {
        for (error, secret) in leaky_errors() {
            let failure = ToolFailure::from_sandbox(&error, None);
            assert!(
                !failure.message.contains(secret),
                "{error:?} leaked {secret:?} as {:?}",
                failure.message
            );
            assert!(!failure.message.contains('\n'));
            assert!(failure.message.chars().count() <= DETAIL_MAX + 1);
        }
    }

    #[test]
    fn argument_errors_keep_their_own_words() {
        let failure = ToolFailure::from_sandbox(
            &SandboxError::invalid("exec timeout must be greater than zero"),
            None,
        );
        assert_eq!(failure.kind, "invalid_argument");
        assert!(
            failure
                .message
                .ends_with("exec timeout must be greater than zero"),
            "{}",
            failure.message
        );
        assert!(!failure.retryable);
    }

    #[test]
    fn file_errors_name_only_the_models_own_path() {
        let error = SandboxError::engine("stat /var/lib/docker/overlay2/x/merged/a.txt failed");
        let failure = ToolFailure::from_sandbox(&error, Some("a.txt"));
        assert_eq!(failure.kind, "engine");
        assert!(!failure.message.contains("overlay2"));
        assert!(failure.retryable);
    }

    #[test]
    fn engine_failures_are_retryable_and_refusals_are_not() {
        let down = ToolFailure::from_sandbox(&SandboxError::engine("x"), None);
        assert!(down.retryable);
        let refused =
            ToolFailure::from_sandbox(&SandboxError::confinement("../x", "escapes"), Some("../x"));
        assert_eq!(refused.kind, "confinement");
        assert!(!refused.retryable);
        assert!(refused.message.ends_with(": ../x"));
    }

    #[test]
    fn sanitize_cuts_long_and_multi_line_text() {
        let long = "word ".repeat(100);
        assert!(sanitize(&long).chars().count() <= DETAIL_MAX + 1);
        assert_eq!(sanitize("first\nsecond"), "first");
    }
}
