//! Exec requests and outputs.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::hygiene::is_secret_name;
use crate::SandboxError;

/// The output budget a backend applies when a request sets none: 8 MiB of stdout and stderr combined.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 8 * 1024 * 1024;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    /// An argv, executed without any shell re-parsing. Elements are bytes.
    Argv(Vec<Vec<u8>>),
    /// A shell line, run as argv `["sh", "-c", line]`.
    Shell(Vec<u8>),
}

impl Command {
    /// An argv from anything byte-like.
    pub fn argv<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        Command::Argv(args.into_iter().map(|a| a.as_ref().to_vec()).collect())
    }

    /// A shell line.
    pub fn shell(line: impl AsRef<[u8]>) -> Self {
        Command::Shell(line.as_ref().to_vec())
    }

    /// The argv this command runs as (`sh -c line` for a shell line).
    pub fn to_argv(&self) -> Vec<Vec<u8>> {
        match self {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(line) => vec![b"sh".to_vec(), b"-c".to_vec(), line.clone()],
        }
    }

    /// Refuses an empty argv and NUL bytes before anything runs.
    pub fn validate(&self) -> Result<(), SandboxError> {
        match self {
            Command::Argv(argv) if argv.is_empty() => Err(SandboxError::invalid("argv is empty")),
            Command::Argv(argv) => match argv.iter().position(|a| a.contains(&0)) {
                Some(i) => Err(SandboxError::invalid(format!(
                    "argv element {i} contains a NUL byte"
                ))),
                None => Ok(()),
            },
            Command::Shell(line) if line.contains(&0) => {
                Err(SandboxError::invalid("shell line contains a NUL byte"))
            }
            Command::Shell(_) => Ok(()),
        }
    }
}

/// The guest environment of one exec: the only source of variables beyond the image's own.
///
/// Nothing from the host's environment enters a sandbox unless the caller puts it here. Names that look
/// like secrets are refused unless allowed by name with [`allow_secret_name`](Self::allow_secret_name);
/// the order of `set` and `allow_secret_name` does not matter, since [`validate`](Self::validate) runs once,
/// before any engine call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecEnv {
    entries: Vec<(String, Vec<u8>)>,
    allowed_secret_names: BTreeSet<String>,
}

impl ExecEnv {
    /// Adds a variable.
    pub fn set(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.entries.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// Lifts the secret-name denylist for exactly this name (and nothing else).
    pub fn allow_secret_name(mut self, name: impl Into<String>) -> Self {
        self.allowed_secret_names.insert(name.into());
        self
    }

    /// The entries in the order given.
    pub fn entries(&self) -> &[(String, Vec<u8>)] {
        &self.entries
    }

    /// The names allowed past the denylist.
    pub fn allowed_secret_names(&self) -> &BTreeSet<String> {
        &self.allowed_secret_names
    }

    /// Whether no variable is set.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Refuses a malformed name, a NUL in a value, a name given twice, or a secret-looking name that was
    /// not allowed. Each refusal names the variable (never its value).
    pub fn validate(&self) -> Result<(), SandboxError> {
        let mut seen = BTreeSet::new();
        for (name, value) in &self.entries {
            if !is_env_name(name) {
                return Err(SandboxError::invalid(format!(
                    "environment name {name:?} must match [A-Za-z_][A-Za-z0-9_]*"
                )));
            }
            if value.contains(&0) {
                return Err(SandboxError::invalid(format!(
                    "environment variable {name} has a NUL byte in its value"
                )));
            }
            if !seen.insert(name.as_str()) {
                return Err(SandboxError::invalid(format!(
                    "environment variable {name} is given twice"
                )));
            }
            if is_secret_name(name) && !self.allowed_secret_names.contains(name) {
                return Err(SandboxError::invalid(format!(
                    "environment variable {name} looks like a secret; allow it by name to pass it"
                )));
            }
        }
        Ok(())
    }
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// One command to run in a sandbox.
///
/// Built with [`ExecRequest::new`] and its setters, so fields added later (stdin, streamed output) do
/// not break callers. [`validate`](Self::validate) runs before anything reaches an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    command: Command,
    working_directory: String,
    timeout: Duration,
    max_output_bytes: Option<u64>,
    env: ExecEnv,
}

impl ExecRequest {
    /// The default per-call timeout when none is set: 600 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

    /// A request for `command`, in the storage base (`.`), with the default timeout, the backend's
    /// default output budget and an empty environment.
    pub fn new(command: Command) -> Self {
        ExecRequest {
            command,
            working_directory: ".".to_owned(),
            timeout: Self::DEFAULT_TIMEOUT,
            max_output_bytes: None,
            env: ExecEnv::default(),
        }
    }

    /// Sets the working directory: relative paths are confined to the storage base; absolute ones are
    /// used verbatim.
    #[must_use]
    pub fn working_directory(mut self, wd: impl Into<String>) -> Self {
        self.working_directory = wd.into();
        self
    }

    /// Sets the caller's bound.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the combined stdout+stderr budget.
    #[must_use]
    pub fn max_output_bytes(mut self, budget: u64) -> Self {
        self.max_output_bytes = Some(budget);
        self
    }

    /// Sets the guest environment.
    #[must_use]
    pub fn env(mut self, env: ExecEnv) -> Self {
        self.env = env;
        self
    }

    /// The command.
    pub fn command(&self) -> &Command {
        &self.command
    }
    /// The working directory as given.
    pub fn working_dir(&self) -> &str {
        &self.working_directory
    }
    /// The caller's bound.
    pub fn timeout_bound(&self) -> Duration {
        self.timeout
    }
    /// The output budget, falling back to [`DEFAULT_MAX_OUTPUT_BYTES`].
    pub fn output_budget(&self) -> u64 {
        self.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES)
    }
    /// The output budget as set, `None` when unset: the total a streamed exec enforces.
    pub fn output_cap(&self) -> Option<u64> {
        self.max_output_bytes
    }
    /// The guest environment.
    pub fn guest_env(&self) -> &ExecEnv {
        &self.env
    }

    /// Refuses, before anything runs: a bad command, a zero timeout, a zero output budget, a NUL in the
    /// working directory, and a bad environment.
    pub fn validate(&self) -> Result<(), SandboxError> {
        self.command.validate()?;
        if self.timeout.is_zero() {
            return Err(SandboxError::invalid(
                "exec timeout must be greater than zero",
            ));
        }
        if self.max_output_bytes == Some(0) {
            return Err(SandboxError::invalid(
                "max_output_bytes must be greater than zero",
            ));
        }
        if self.working_directory.contains('\0') {
            return Err(SandboxError::invalid(
                "working directory contains a NUL byte",
            ));
        }
        self.env.validate()
    }
}

/// What a command that ran to completion produced, or why it never started.
///
/// The byte fields are exact; the text views are lossy. `exit_code` is the command's own status,
/// verbatim: an engine failure is an error, never an `ExecOutput`. A working directory that cannot
/// be entered is not an error either: the output says so in [`not_started`](Self::not_started),
/// with `exit_code` 125 and empty streams, so it is told apart from a command's own 125 exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exact stdout bytes.
    pub stdout: Vec<u8>,
    /// Exact stderr bytes (the command's own; wrapper transport text removed).
    pub stderr: Vec<u8>,
    /// The command's exit status.
    pub exit_code: i32,
    /// True when stderr holds only transport text and the program's stderr is folded into stdout. Both
    /// backends of this project keep the streams apart, so they always report false.
    pub producer_owns_stderr: bool,
    /// `Some(reason)` when the command never started because the working directory could not be
    /// entered in the guest (missing, not a directory, not searchable): the reason is the guest
    /// shell's own message, `exit_code` is [`WORKDIR_UNUSABLE_EXIT`] and both streams are empty.
    /// `None` for every command that started, whatever its status (its own 125 included).
    pub not_started: Option<String>,
}

/// The exit code of an [`ExecOutput`] whose command never started (the established contract: a
/// missing working directory is a non-zero result, not an error).
pub const WORKDIR_UNUSABLE_EXIT: i32 = 125;

impl ExecOutput {
    /// The output of a command that started and exited with `exit_code`.
    pub fn exited(stdout: Vec<u8>, stderr: Vec<u8>, exit_code: i32) -> Self {
        ExecOutput {
            stdout,
            stderr,
            exit_code,
            producer_owns_stderr: false,
            not_started: None,
        }
    }

    /// The output of a command that never started because its working directory could not be
    /// entered; `reason` is the guest's own message.
    pub fn workdir_unusable(reason: impl Into<String>) -> Self {
        ExecOutput {
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit_code: WORKDIR_UNUSABLE_EXIT,
            producer_owns_stderr: false,
            not_started: Some(reason.into()),
        }
    }

    /// Stdout as text; invalid UTF-8 becomes U+FFFD.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// Stderr as text; invalid UTF-8 becomes U+FFFD.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// Whether the command exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn refused(r: ExecRequest) -> String {
        let e = r.validate().expect_err("should be refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        e.to_string()
    }

    #[test]
    fn command_refusals() {
        refused(ExecRequest::new(Command::Argv(vec![])));
        refused(ExecRequest::new(Command::argv(["echo", "a\0b"])));
        refused(ExecRequest::new(Command::shell("echo \0")));
        refused(ExecRequest::new(Command::argv(["true"])).timeout(Duration::ZERO));
        refused(ExecRequest::new(Command::argv(["true"])).max_output_bytes(0));
        refused(ExecRequest::new(Command::argv(["true"])).working_directory("a\0"));
        ExecRequest::new(Command::argv([""])).validate().unwrap();
        ExecRequest::new(Command::shell("")).validate().unwrap();
        assert_eq!(
            Command::shell("echo hi").to_argv(),
            vec![b"sh".to_vec(), b"-c".to_vec(), b"echo hi".to_vec()]
        );
    }

    #[test]
    fn defaults() {
        let r = ExecRequest::new(Command::argv(["true"]));
        assert_eq!(r.output_budget(), 8_388_608);
        assert_eq!(r.working_dir(), ".");
        assert!(r.guest_env().is_empty());
        assert_eq!(r.output_cap(), None);
        assert_eq!(r.clone().max_output_bytes(5).output_budget(), 5);
        assert_eq!(r.clone().max_output_bytes(5).output_cap(), Some(5));
    }

    #[test]
    fn env_refusals_name_the_variable_not_the_value() {
        let cases = [
            ExecEnv::default().set("1BAD", "v"),
            ExecEnv::default().set("A-B", "v"),
            ExecEnv::default().set("", "v"),
            ExecEnv::default().set("A", "x\0y"),
            ExecEnv::default().set("A", "1").set("A", "2"),
            ExecEnv::default().set("GITHUB_TOKEN", "hunter2"),
        ];
        for env in cases {
            let e = env.validate().expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(!e.to_string().contains("hunter2"));
        }
        let e = ExecEnv::default()
            .set("DB_PASS", "hunter2")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("DB_PASS"), "{e}");
    }

    #[test]
    fn allowing_a_secret_name_lifts_only_the_denylist() {
        ExecEnv::default()
            .set("GITHUB_TOKEN", "t")
            .allow_secret_name("GITHUB_TOKEN")
            .validate()
            .unwrap();
        ExecEnv::default()
            .allow_secret_name("GITHUB_TOKEN")
            .set("GITHUB_TOKEN", "t")
            .validate()
            .unwrap();
        assert!(ExecEnv::default()
            .set("GITHUB_TOKEN", "t\0")
            .allow_secret_name("GITHUB_TOKEN")
            .validate()
            .is_err());
        assert!(ExecEnv::default()
            .set("API_KEY", "t")
            .allow_secret_name("GITHUB_TOKEN")
            .validate()
            .is_err());
    }

    #[test]
    fn lossy_views() {
        let o = ExecOutput {
            stdout: vec![b'a', 0xff, b'b'],
            stderr: b"e".to_vec(),
            exit_code: 7,
            producer_owns_stderr: false,
            not_started: None,
        };
        assert_eq!(o.stdout_text(), "a\u{fffd}b");
        assert_eq!(o.stderr_text(), "e");
        assert!(!o.success());
        assert_eq!(ExecOutput::exited(o.stdout.clone(), o.stderr.clone(), 7), o);
    }

    #[test]
    fn a_command_that_never_started_is_125_with_its_reason() {
        let o = ExecOutput::workdir_unusable("sh: cd: can't cd to /gone");
        assert_eq!(o.exit_code, WORKDIR_UNUSABLE_EXIT);
        assert_eq!(o.not_started.as_deref(), Some("sh: cd: can't cd to /gone"));
        assert!(o.stdout.is_empty() && o.stderr.is_empty());
        assert!(!o.success());
        // A command's own 125 is not "not started".
        assert_eq!(ExecOutput::exited(vec![], vec![], 125).not_started, None);
    }
}
