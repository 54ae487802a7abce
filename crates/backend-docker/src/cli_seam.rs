//! The invocation seam (docker.md §3): every docker call goes through [`DockerCli::run`], pinned to
//! one context and one management environment, bounded by `run_bounded`. Also the readers of the
//! CLI's answers (daemon unreachable, object absent, path absent).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exec_wrapper::{BoundedCommand, ExitKind, RunOutput};
use sandbox_core::SandboxError;
use serde::Deserialize;

use crate::BACKEND_NAME;

/// Output budget of management calls (`inspect`, `ps`, `rm`, `run`, ...).
pub(crate) const MANAGEMENT_BUDGET: usize = 8 * 1024 * 1024;

/// Budget of small calls whose answer is a line or two.
pub(crate) const SMALL_BUDGET: usize = 64 * 1024;

/// How many characters of a CLI's stderr an error message quotes.
const TAIL_CHARS: usize = 2000;

/// A progress callback, handed each line of either stream.
pub(crate) type LineCallback = Box<dyn FnMut(exec_wrapper::Stream, &[u8]) + Send>;

/// One call's shape, beyond its arguments.
pub(crate) struct CallShape {
    pub(crate) deadline: Duration,
    pub(crate) budget: usize,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) stop_after: Option<usize>,
    pub(crate) on_line: Option<LineCallback>,
}

impl CallShape {
    /// A management call: the given deadline, the management budget, stdin closed.
    pub(crate) fn management(deadline: Duration) -> Self {
        CallShape {
            deadline,
            budget: MANAGEMENT_BUDGET,
            stdin: None,
            stop_after: None,
            on_line: None,
        }
    }

    /// Overrides the budget.
    pub(crate) fn budget(mut self, budget: usize) -> Self {
        self.budget = budget;
        self
    }
}

/// The docker CLI, pinned to one context and one environment.
#[derive(Debug, Clone)]
pub(crate) struct DockerCli {
    program: PathBuf,
    context: String,
    endpoint: String,
    env: Vec<(OsString, OsString)>,
}

/// What `docker context inspect` must yield.
#[derive(Debug, Deserialize)]
struct ContextDocument {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Endpoints")]
    endpoints: ContextEndpoints,
}

#[derive(Debug, Deserialize)]
struct ContextEndpoints {
    docker: DockerEndpoint,
}

#[derive(Debug, Deserialize)]
struct DockerEndpoint {
    #[serde(rename = "Host")]
    host: String,
}

impl DockerCli {
    /// Resolves the context once (docker.md rule 5) and pins it with the management environment.
    ///
    /// `docker context inspect` is the only call made without `--context`. For the context named
    /// `default`, `DOCKER_HOST=<endpoint>` joins the environment, so a later change of the process
    /// environment never moves the backend to another daemon.
    pub(crate) async fn resolve(
        program: &Path,
        context: Option<&str>,
        mut env: Vec<(OsString, OsString)>,
        deadline: Duration,
    ) -> Result<DockerCli, SandboxError> {
        let mut args: Vec<OsString> = vec!["context".into(), "inspect".into()];
        args.push("--format".into());
        args.push("{{json .}}".into());
        if let Some(name) = context {
            args.push(name.into());
        }
        let command = BoundedCommand::new(program.as_os_str(), deadline)
            .args(args)
            .envs(env.iter().cloned())
            .output_budget(SMALL_BUDGET);
        let output = command
            .run()
            .await
            .map_err(|e| unavailable_from_runner(program, "docker context inspect", e))?;
        if output.status != ExitKind::Exited(0) {
            return Err(unavailable(format!(
                "`docker context inspect` failed: {}",
                tail(&output.stderr)
            )));
        }
        let document: ContextDocument = parse_context(&output.stdout)?;
        if document.name.trim().is_empty() || document.endpoints.docker.host.trim().is_empty() {
            return Err(unavailable(
                "`docker context inspect` named no context or no docker endpoint",
            ));
        }
        if document.name == "default" {
            env.retain(|(name, _)| name != "DOCKER_HOST");
            env.push((
                "DOCKER_HOST".into(),
                document.endpoints.docker.host.clone().into(),
            ));
        }
        Ok(DockerCli {
            program: program.to_owned(),
            context: document.name,
            endpoint: document.endpoints.docker.host,
            env,
        })
    }

    /// The pinned context's name.
    pub(crate) fn context(&self) -> &str {
        &self.context
    }

    /// The pinned context's docker endpoint.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Runs `docker --context <ctx> <args…>` bounded as `shape` says.
    ///
    /// # Cancel safety
    /// Dropping the future kills the client's process group and reaps it in the background
    /// (`run_bounded`); nothing else is left behind.
    pub(crate) async fn run<I, A>(
        &self,
        args: I,
        shape: CallShape,
    ) -> Result<RunOutput, exec_wrapper::Error>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        let mut command = BoundedCommand::new(self.program.as_os_str(), shape.deadline)
            .arg("--context")
            .arg(self.context.as_str())
            .args(args)
            .envs(self.env.iter().cloned())
            .output_budget(shape.budget);
        if let Some(bytes) = shape.stdin {
            command = command.stdin(bytes);
        }
        if let Some(n) = shape.stop_after {
            command = command.stop_after(n);
        }
        if let Some(callback) = shape.on_line {
            command = command.on_line(callback);
        }
        command.run().await
    }

    /// Runs a management call and maps the runner's failures: a missing binary is
    /// BackendUnavailable, an expired deadline EngineTimeout, anything else Engine.
    pub(crate) async fn run_management<I, A>(
        &self,
        operation: &str,
        args: I,
        shape: CallShape,
    ) -> Result<RunOutput, SandboxError>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.run(args, shape)
            .await
            .map_err(|e| self.runner_error(operation, e))
    }

    /// Maps a runner failure of a call that is not the caller's own bound.
    pub(crate) fn runner_error(&self, operation: &str, error: exec_wrapper::Error) -> SandboxError {
        match error {
            exec_wrapper::Error::Spawn { .. } => {
                unavailable_from_runner(&self.program, operation, error)
            }
            exec_wrapper::Error::Deadline { bound, .. } => SandboxError::EngineTimeout {
                operation: operation.to_owned(),
                bound,
            },
            exec_wrapper::Error::Nul { .. } | exec_wrapper::Error::EmptyArgv => {
                SandboxError::invalid(error.to_string())
            }
            other => SandboxError::Engine {
                detail: format!("{operation}: {other}"),
                source: Some(Box::new(other)),
            },
        }
    }
}

fn parse_context(stdout: &[u8]) -> Result<ContextDocument, SandboxError> {
    // One context yields one JSON object; older CLIs wrap it in a list.
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if let Ok(doc) = serde_json::from_str::<ContextDocument>(text) {
        return Ok(doc);
    }
    serde_json::from_str::<Vec<ContextDocument>>(text)
        .ok()
        .and_then(|mut list| (list.len() == 1).then(|| list.remove(0)))
        .ok_or_else(|| unavailable("`docker context inspect` answered in an unknown shape"))
}

#[cold]
fn unavailable(detail: impl Into<String>) -> SandboxError {
    SandboxError::BackendUnavailable {
        backend: BACKEND_NAME.to_owned(),
        detail: detail.into(),
        source: None,
    }
}

#[cold]
fn unavailable_from_runner(
    program: &Path,
    operation: &str,
    error: exec_wrapper::Error,
) -> SandboxError {
    let detail = match &error {
        exec_wrapper::Error::Spawn { .. } => format!(
            "the docker CLI {} could not be started for {operation} (docker_path)",
            program.display()
        ),
        _ => format!("{operation}: {error}"),
    };
    SandboxError::BackendUnavailable {
        backend: BACKEND_NAME.to_owned(),
        detail,
        source: Some(Box::new(error)),
    }
}

/// The daemon could not be reached (docker.md rule 7).
pub(crate) fn daemon_unreachable(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr).to_lowercase();
    text.contains("cannot connect to the docker daemon") || text.contains("error during connect")
}

/// The CLI said that `target` (a name or id) does not exist: its name **and** `no such` or
/// `not found` in one message. The same words about anything else are never absence.
pub(crate) fn object_absent(stderr: &[u8], target: &str) -> bool {
    let text = String::from_utf8_lossy(stderr).to_lowercase();
    let target = target.to_lowercase();
    !target.is_empty()
        && text.lines().any(|line| {
            line.contains(&target) && (line.contains("no such") || line.contains("not found"))
        })
}

/// `docker cp` said that exactly `path` does not exist: `could not find` (any case) and the path,
/// case-sensitive, bounded by whitespace or line ends. A message about a child never reads as
/// absence of its parents. The path is matched in the whole message, not word by word, since the
/// engine quotes it verbatim and a guest path may hold spaces or line breaks.
pub(crate) fn path_absent(stderr: &[u8], path: &str) -> bool {
    let text = String::from_utf8_lossy(stderr);
    if path.is_empty() || !text.to_lowercase().contains("could not find") {
        return false;
    }
    text.match_indices(path).any(|(start, _)| {
        let before = text[..start].chars().next_back();
        let after = text[start + path.len()..].chars().next();
        before.is_none_or(char::is_whitespace) && after.is_none_or(char::is_whitespace)
    })
}

/// The last part of a CLI's output, control characters escaped, for an error message.
pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(TAIL_CHARS);
    let mut out = String::new();
    for c in text.chars().skip(skip) {
        if c.is_control() && c != '\n' {
            out.extend(c.escape_default());
        } else if c == '\n' {
            out.push_str(" | ");
        } else {
            out.push(c);
        }
    }
    if out.is_empty() {
        "(no output)".to_owned()
    } else {
        out
    }
}

/// A management call's exit status as text, for messages.
pub(crate) fn status_text(status: ExitKind) -> String {
    match status {
        ExitKind::Exited(code) => format!("exit {code}"),
        ExitKind::Signaled(signal) => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_daemon_words() {
        assert!(daemon_unreachable(
            b"Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
        ));
        assert!(daemon_unreachable(b"error during connect: Get ..."));
        assert!(!daemon_unreachable(b"No such container: x"));
    }

    #[test]
    fn absence_needs_the_target_and_the_words() {
        let id = "e5de1406697f42e2c3ea8cf0798dcc9650e4fa35f7f544e9ac725b03c20c11dd";
        assert!(object_absent(
            format!("Error response from daemon: No such container: {id}").as_bytes(),
            id
        ));
        assert!(object_absent(b"Error: No such object: MAF-X", "maf-x"));
        // The words about something else are never absence of the target.
        assert!(!object_absent(
            b"context \"foo\": context not found: open /root/.docker/contexts/meta",
            "maf-sandbox-docker-aef172d1c789"
        ));
        assert!(!object_absent(b"No such container: other", "maf-x"));
        assert!(!object_absent(b"maf-x is not running", "maf-x"));
        assert!(!object_absent(b"no such thing", ""));
    }

    #[test]
    fn path_absence_is_exact() {
        let msg = b"Error response from daemon: Could not find the file /w/ld/x in container abc";
        assert!(path_absent(msg, "/w/ld/x"));
        assert!(!path_absent(msg, "/w/ld"));
        assert!(!path_absent(msg, "/w"));
        assert!(!path_absent(
            b"Error response from daemon: lstat /var/lib/docker/merged/w/f/x: not a directory",
            "/w/f/x"
        ));
        assert!(path_absent(
            b"could not find the file /W in container",
            "/W"
        ));
        assert!(!path_absent(
            b"could not find the file /W in container",
            "/w"
        ));
    }

    #[test]
    fn path_absence_holds_for_paths_with_whitespace() {
        // The engine quotes the path verbatim, spaces and line breaks included.
        let id = "c11625722e5a353e2d6abbd8e262a1080b37c01e57db767b978bd0130b7b2bb1";
        let spaced = format!(
            "Error response from daemon: Could not find the file /tmp/a b in container {id}"
        );
        assert!(path_absent(spaced.as_bytes(), "/tmp/a b"));
        assert!(!path_absent(spaced.as_bytes(), "/tmp"));
        assert!(!path_absent(spaced.as_bytes(), "a b"));
        let child = format!("Could not find the file /srv/a b/c in container {id}");
        assert!(path_absent(child.as_bytes(), "/srv/a b/c"));
        assert!(!path_absent(child.as_bytes(), "/srv/a b"));
        let broken = format!("Could not find the file /w/a\nb in container {id}");
        assert!(path_absent(broken.as_bytes(), "/w/a\nb"));
        assert!(!path_absent(broken.as_bytes(), "/w"));
        // The words must still be there.
        assert!(!path_absent(
            b"lstat /tmp/a b: permission denied",
            "/tmp/a b"
        ));
    }

    #[test]
    fn tails_are_bounded_and_escaped() {
        let long = "e".repeat(5000);
        assert_eq!(tail(long.as_bytes()).len(), TAIL_CHARS);
        assert_eq!(tail(b"a\x1bb\nc"), "a\\u{1b}b | c");
        assert_eq!(tail(b"  "), "(no output)");
    }

    #[test]
    fn context_document_shapes() {
        let one = br#"{"Name":"default","Metadata":{},"Endpoints":{"docker":{"Host":"unix:///var/run/docker.sock","SkipTLSVerify":false}}}"#;
        let doc = parse_context(one).unwrap();
        assert_eq!(doc.name, "default");
        assert_eq!(doc.endpoints.docker.host, "unix:///var/run/docker.sock");
        let list = br#"[{"Name":"x","Endpoints":{"docker":{"Host":"tcp://h:2376"}}}]"#;
        assert_eq!(parse_context(list).unwrap().name, "x");
        assert!(parse_context(b"[]").is_err());
        assert!(parse_context(b"nope").is_err());
    }
}
