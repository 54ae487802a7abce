//! The crate's one error type and the classification of a failed `sbx` call.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use bounded_process::ExitKind;

/// How many characters of a failed call's stderr an error quotes: the last 2000.
pub const STDERR_TAIL_CHARS: usize = 2000;

/// Which `sbx` command a call ran; errors name it so an operator can repeat it by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// `sbx version`.
    Version,
    /// `sbx settings get <key>`.
    SettingsGet,
    /// `sbx mcp ls --json`.
    McpLs,
    /// `sbx ls --json`.
    Ls,
    /// `sbx create shell …`.
    Create,
    /// `sbx exec …` of any kind (default user, `-u root`, `-i`).
    Exec,
    /// `sbx rm --force <name>`.
    Rm,
    /// `sbx secret ls --json`.
    SecretLs,
    /// `sbx policy ls [<name>] --json`.
    PolicyLs,
    /// `sbx policy check network --json <host>`.
    PolicyCheck,
}

impl Call {
    /// The command as an operator would type it, without its variable arguments.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Version => "sbx version",
            Call::SettingsGet => "sbx settings get",
            Call::McpLs => "sbx mcp ls --json",
            Call::Ls => "sbx ls --json",
            Call::Create => "sbx create",
            Call::Exec => "sbx exec",
            Call::Rm => "sbx rm",
            Call::SecretLs => "sbx secret ls --json",
            Call::PolicyLs => "sbx policy ls --json",
            Call::PolicyCheck => "sbx policy check network --json",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a call through this crate can refuse or fail with.
///
/// Each message says what to do about it. Quoted `sbx` output is the bounded
/// [`failure_detail`], never all of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was refused before anything ran.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// Why it was refused.
        reason: String,
    },

    /// The `sbx` login has lapsed.
    #[error("`{call}` failed because sbx is not logged in; run `sbx login`, then retry: {detail}")]
    LoginRequired {
        /// The call that failed.
        call: Call,
        /// The failure detail.
        detail: String,
    },

    /// The `sbx` daemon has lost its VM backend.
    #[error("`{call}` failed: the sbx daemon has lost its VM backend; sandboxes still exist; fix with `sbx daemon restart`: {detail}")]
    DaemonFault {
        /// The call that failed.
        call: Call,
        /// The failure detail.
        detail: String,
    },

    /// The template image cannot start as a sandbox.
    #[error("`{call}` failed: the template cannot start; a template needs /bin/sh and /bin/bash: {detail}")]
    TemplateCannotStart {
        /// The call that failed.
        call: Call,
        /// The failure detail.
        detail: String,
    },

    /// `create` found the name taken: another process created it first.
    #[error("sandbox {name} already exists; use it, or remove it with `sbx rm --force {name}`: {detail}")]
    AlreadyExists {
        /// The name asked for.
        name: String,
        /// The failure detail.
        detail: String,
    },

    /// `exec` or `rm` named a sandbox `sbx` does not know.
    #[error("`{call}` found no sandbox named {name}; list them with `sbx ls`: {detail}")]
    NotFound {
        /// The call that failed.
        call: Call,
        /// The name asked for.
        name: String,
        /// The failure detail.
        detail: String,
    },

    /// The call ran past its deadline; it was killed and reaped. For `exec`, the deadline is the
    /// caller's own.
    #[error("`{call}` did not finish within {bound:?}; it was killed (a wedged daemon is fixed with `sbx daemon restart`)")]
    Timeout {
        /// The call that timed out.
        call: Call,
        /// The bound that expired.
        bound: Duration,
    },

    /// The call wrote more than its output budget to stdout and stderr together; it was killed.
    #[error("`{call}` wrote more than its output budget of {budget} bytes; it was killed")]
    OutputLimit {
        /// The call that overflowed.
        call: Call,
        /// The budget, in bytes.
        budget: usize,
    },

    /// The `sbx` program could not be started.
    #[error("could not start sbx at {}: {source}; install sbx or point sbx_path at it", sbx_path.display())]
    SpawnFailed {
        /// The configured path of the `sbx` program.
        sbx_path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// Talking to the `sbx` process failed (a pipe or the wait).
    #[error("talking to sbx during `{call}` failed: {source}")]
    Io {
        /// The call during which it failed.
        call: Call,
        /// The runner's error.
        #[source]
        source: bounded_process::Error,
    },

    /// The call failed for a reason none of the other variants describes.
    #[error("`{call}` failed: {detail}")]
    Failed {
        /// The call that failed.
        call: Call,
        /// The failure detail: the stderr tail, or `exit <rc>` when stderr was empty.
        detail: String,
    },

    /// The call succeeded but its output has a shape this crate does not recognise; it is never
    /// read as "nothing there".
    #[error("`{call}` printed output this driver does not recognise ({reason}); is this sbx version supported?")]
    Malformed {
        /// The call whose output it was.
        call: Call,
        /// What was wrong with it.
        reason: String,
    },
}

impl Error {
    /// An argument was refused. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn invalid_argument(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// The output had the wrong shape. Cold: a refusal, never the common path.
    #[cold]
    #[inline(never)]
    pub(crate) fn malformed(call: Call, reason: impl Into<String>) -> Self {
        Error::Malformed {
            call,
            reason: reason.into(),
        }
    }

    /// Maps a runner error of `call` onto this crate's variants. Cold: only failures come here.
    #[cold]
    #[inline(never)]
    pub(crate) fn from_runner(
        call: Call,
        sbx_path: &std::path::Path,
        err: bounded_process::Error,
    ) -> Self {
        match err {
            bounded_process::Error::Spawn { source, .. } => Error::SpawnFailed {
                sbx_path: sbx_path.to_path_buf(),
                source,
            },
            bounded_process::Error::Deadline { bound, .. } => Error::Timeout { call, bound },
            bounded_process::Error::OutputLimit { budget, .. } => {
                Error::OutputLimit { call, budget }
            }
            other => Error::Io {
                call,
                source: other,
            },
        }
    }

    /// The call a failure came from, when it came from one.
    pub fn call(&self) -> Option<Call> {
        match self {
            Error::LoginRequired { call, .. }
            | Error::DaemonFault { call, .. }
            | Error::TemplateCannotStart { call, .. }
            | Error::NotFound { call, .. }
            | Error::Timeout { call, .. }
            | Error::OutputLimit { call, .. }
            | Error::Io { call, .. }
            | Error::Failed { call, .. }
            | Error::Malformed { call, .. } => Some(*call),
            Error::AlreadyExists { .. } => Some(Call::Create),
            Error::InvalidArgument { .. } | Error::SpawnFailed { .. } => None,
        }
    }
}

/// The detail of a failed call: the last [`STDERR_TAIL_CHARS`] characters of its trimmed,
/// lossily decoded stderr, or `exit <rc>` (`signal <n>`) when stderr is empty.
pub fn failure_detail(status: ExitKind, stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return match status {
            ExitKind::Exited(rc) => format!("exit {rc}"),
            ExitKind::Signaled(signal) => format!("signal {signal}"),
        };
    }
    let chars = trimmed.chars().count();
    trimmed
        .chars()
        .skip(chars.saturating_sub(STDERR_TAIL_CHARS))
        .collect()
}

/// Classifies the failure of `call` from its [`failure_detail`]; `name` is the sandbox the call
/// named, if any. First match wins, on the lower-cased detail:
///
/// 1. `backend unavailable` → [`Error::DaemonFault`];
/// 2. `sbx login`, `not logged in`, `log in`, `unauthorized` or `unauthenticated` →
///    [`Error::LoginRequired`];
/// 3. `kit startup exited with code 127` → [`Error::TemplateCannotStart`];
/// 4. `create` with `already exists` → [`Error::AlreadyExists`]; `exec` or `rm` with `not found`
///    → [`Error::NotFound`];
/// 5. anything else → [`Error::Failed`].
///
/// A pure function: it reads only its arguments.
#[cold]
#[inline(never)]
pub fn classify(call: Call, name: Option<&str>, detail: String) -> Error {
    let lower = detail.to_lowercase();
    if lower.contains("backend unavailable") {
        return Error::DaemonFault { call, detail };
    }
    if [
        "sbx login",
        "not logged in",
        "log in",
        "unauthorized",
        "unauthenticated",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
    {
        return Error::LoginRequired { call, detail };
    }
    if lower.contains("kit startup exited with code 127") {
        return Error::TemplateCannotStart { call, detail };
    }
    let name = name.unwrap_or_default().to_owned();
    match call {
        Call::Create if lower.contains("already exists") => Error::AlreadyExists { name, detail },
        Call::Exec | Call::Rm if lower.contains("not found") => {
            Error::NotFound { call, name, detail }
        }
        _ => Error::Failed { call, detail },
    }
}

/// Classifies a completed call that did not succeed: [`failure_detail`] then [`classify`].
#[cold]
#[inline(never)]
pub fn classify_output(call: Call, name: Option<&str>, status: ExitKind, stderr: &[u8]) -> Error {
    classify(call, name, failure_detail(status, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short name of a classification, for the table.
    fn kind(err: &Error) -> &'static str {
        match err {
            Error::DaemonFault { .. } => "DaemonFault",
            Error::LoginRequired { .. } => "LoginRequired",
            Error::TemplateCannotStart { .. } => "TemplateCannotStart",
            Error::AlreadyExists { .. } => "AlreadyExists",
            Error::NotFound { .. } => "NotFound",
            Error::Failed { .. } => "Failed",
            other => panic!("classify never returns {other:?}"),
        }
    }

    #[test]
    fn classification_table() {
        use Call::*;
        let table: &[(Call, &str, &str)] = &[
            // 1. A lost VM backend wins over everything, login included.
            (
                Ls,
                "ERROR: backend unavailable: sandboxd cannot reach its engine",
                "DaemonFault",
            ),
            (Create, "Backend Unavailable; run sbx login", "DaemonFault"),
            (
                Exec,
                "sandbox x not found: backend unavailable",
                "DaemonFault",
            ),
            // 2. Every login wording, in any case.
            (
                Ls,
                "ERROR: You are not logged in. Run 'sbx login' to sign in.",
                "LoginRequired",
            ),
            (Version, "please run SBX LOGIN", "LoginRequired"),
            (Rm, "you must log in first", "LoginRequired"),
            (McpLs, "401 Unauthorized", "LoginRequired"),
            (SecretLs, "rpc error: Unauthenticated", "LoginRequired"),
            (Exec, "not logged in; sandbox not found", "LoginRequired"),
            // 3. A template without a shell.
            (
                Create,
                "ERROR: kit startup exited with code 127",
                "TemplateCannotStart",
            ),
            (
                Exec,
                "Kit startup exited with code 127",
                "TemplateCannotStart",
            ),
            (Create, "kit startup exited with code 1", "Failed"),
            // 4. Call-specific wordings only for their calls.
            (
                Create,
                "ERROR: sandbox maf-1 already exists",
                "AlreadyExists",
            ),
            (Exec, "ERROR: sandbox maf-1 not found", "NotFound"),
            (Rm, "Error: Sandbox Not Found", "NotFound"),
            (Ls, "sandbox not found", "Failed"),
            (Create, "template not found", "Failed"),
            (Rm, "already exists", "Failed"),
            (Exec, "already exists", "Failed"),
            // 5. Anything else.
            (Ls, "exit 1", "Failed"),
            (Create, "no space left on device", "Failed"),
            (PolicyCheck, "", "Failed"),
        ];
        for (call, detail, want) in table {
            let got = classify(*call, Some("maf-1"), (*detail).to_owned());
            assert_eq!(kind(&got), *want, "{call} with {detail:?}: {got}");
            assert_eq!(got.call(), Some(*call));
        }
    }

    #[test]
    fn every_message_names_its_fix() {
        let cases = [
            (
                classify(Call::Ls, None, "backend unavailable".into()),
                "sbx daemon restart",
            ),
            (
                classify(Call::Ls, None, "not logged in".into()),
                "run `sbx login`",
            ),
            (
                classify(
                    Call::Create,
                    None,
                    "kit startup exited with code 127".into(),
                ),
                "/bin/sh and /bin/bash",
            ),
            (
                classify(Call::Create, Some("maf-1"), "already exists".into()),
                "sbx rm --force maf-1",
            ),
            (
                classify(Call::Rm, Some("maf-1"), "not found".into()),
                "sbx ls",
            ),
            (classify(Call::Ls, None, "disk full".into()), "disk full"),
        ];
        for (err, fix) in cases {
            assert!(err.to_string().contains(fix), "{err} lacks {fix:?}");
        }
    }

    #[test]
    fn runner_errors_map_to_their_variants() {
        let path = std::path::Path::new("/opt/sbx/bin/sbx");
        let spawn = Error::from_runner(
            Call::Ls,
            path,
            bounded_process::Error::Spawn {
                program: "sbx".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        );
        assert!(matches!(spawn, Error::SpawnFailed { .. }), "{spawn:?}");
        assert!(spawn.to_string().contains("/opt/sbx/bin/sbx"), "{spawn}");
        assert_eq!(spawn.call(), None);

        let deadline = Error::from_runner(
            Call::Exec,
            path,
            bounded_process::Error::Deadline {
                program: "sbx".into(),
                bound: Duration::from_secs(7),
            },
        );
        assert!(
            matches!(deadline, Error::Timeout { call: Call::Exec, bound } if bound == Duration::from_secs(7)),
            "{deadline:?}"
        );

        let flood = Error::from_runner(
            Call::Ls,
            path,
            bounded_process::Error::OutputLimit {
                program: "sbx".into(),
                budget: 99,
            },
        );
        assert!(
            matches!(
                flood,
                Error::OutputLimit {
                    call: Call::Ls,
                    budget: 99
                }
            ),
            "{flood:?}"
        );
    }

    #[test]
    fn failure_detail_is_the_trimmed_tail_or_the_status() {
        assert_eq!(failure_detail(ExitKind::Exited(3), b""), "exit 3");
        assert_eq!(failure_detail(ExitKind::Exited(3), b" \n\t"), "exit 3");
        assert_eq!(failure_detail(ExitKind::Signaled(9), b""), "signal 9");
        assert_eq!(failure_detail(ExitKind::Exited(1), b"\n  boom \n"), "boom");
        assert_eq!(
            failure_detail(ExitKind::Exited(1), b"bad \xff byte"),
            "bad \u{fffd} byte"
        );

        // The tail counts characters, not bytes: a multi-byte character is never split.
        let long = format!("{}{}", "x".repeat(10), "é".repeat(STDERR_TAIL_CHARS));
        let tail = failure_detail(ExitKind::Exited(1), long.as_bytes());
        assert_eq!(tail.chars().count(), STDERR_TAIL_CHARS);
        assert!(tail.chars().all(|c| c == 'é'));

        let exact = "y".repeat(STDERR_TAIL_CHARS);
        assert_eq!(failure_detail(ExitKind::Exited(1), exact.as_bytes()), exact);
    }
}
