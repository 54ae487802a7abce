//! `run --host-tool NAME=COMMAND`: host tools scripted as host commands, without Rust.
//!
//! Each call runs `COMMAND` with `/bin/sh -c` on this host, its JSON arguments on stdin; its
//! stdout is the result (JSON when it parses as JSON, else the text as a JSON string), a non-zero
//! exit is the tool's failure (its stderr's first line the message). Every call is bounded like
//! any external call: the run's call deadline, an output cap, an environment of `PATH` alone (the
//! operator's secrets stay out of what a guest can make it run), and the child killed and reaped
//! when the call is dropped.

use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};
use host_tools::{valid_name, HostTool, Registry, RunBounds, ToolError};
use sandbox_core::SandboxError;
use serde_json::Value;

/// The longest stderr line a failure shows.
const MESSAGE_CHARACTERS: usize = 200;

/// The registry of the `--host-tool` flags, each `NAME=COMMAND`.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] for a flag without `=`, a bad name, an empty command or a
/// name given twice.
pub fn registry(specs: &[String], bounds: &RunBounds) -> Result<Registry, SandboxError> {
    let mut registry = Registry::new();
    for spec in specs {
        let Some((name, command)) = spec.split_once('=') else {
            return Err(SandboxError::invalid(format!(
                "--host-tool {spec:?} is not NAME=COMMAND"
            )));
        };
        if !valid_name(name) {
            return Err(SandboxError::invalid(format!(
                "--host-tool name {name:?} is not 1 to 64 of [A-Za-z0-9_.-] starting with a letter"
            )));
        }
        if command.trim().is_empty() {
            return Err(SandboxError::invalid(format!(
                "--host-tool {name} has no command"
            )));
        }
        let tool = HostTool::new(
            name,
            format!("runs {command:?} on the host"),
            serde_json::json!({}),
            handler(
                command.to_owned(),
                bounds.call_deadline,
                bounds.max_result_bytes,
            ),
        )
        .map_err(|error| SandboxError::invalid(error.to_string()))?;
        registry
            .register(tool)
            .map_err(|error| SandboxError::invalid(format!("--host-tool: {error}")))?;
    }
    Ok(registry)
}

fn handler(
    command: String,
    deadline: Duration,
    max_result: usize,
) -> impl Fn(
    Value,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value, ToolError>> + Send>>
       + Send
       + Sync
       + 'static {
    move |arguments| {
        let command = command.clone();
        Box::pin(async move { call(&command, &arguments, deadline, max_result).await })
    }
}

/// Runs one call of `command` with `arguments` on its stdin.
async fn call(
    command: &str,
    arguments: &Value,
    deadline: Duration,
    max_result: usize,
) -> Result<Value, ToolError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let output = BoundedCommand::new("/bin/sh", deadline)
        .args(["-c", command])
        .env("PATH", path)
        .stdin(serde_json::to_vec(arguments).unwrap_or_default())
        .output_budget(max_result)
        .run()
        .await
        .map_err(|error| ToolError::new(format!("the host command failed: {error}")))?;
    match output.status {
        ExitKind::Exited(0) => Ok(serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
            Value::String(String::from_utf8_lossy(&output.stdout).into_owned())
        })),
        status => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let line: String = stderr
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(MESSAGE_CHARACTERS)
                .collect();
            let status = match status {
                ExitKind::Exited(code) => format!("exit {code}"),
                ExitKind::Signaled(signal) => format!("signal {signal}"),
            };
            Err(ToolError::new(format!(
                "the host command ended with {status}: {line}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;
    use serde_json::json;

    #[test]
    fn malformed_flags_are_refused_by_name() {
        let bounds = RunBounds::default();
        for (spec, why) in [
            ("noequals", "NAME=COMMAND"),
            ("1bad=true", "is not 1 to 64"),
            ("empty=  ", "has no command"),
        ] {
            let error = registry(&[spec.to_owned()], &bounds).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
            assert!(error.to_string().contains(why), "{error}");
        }
        let twice = ["a=true".to_owned(), "a=false".to_owned()];
        assert!(registry(&twice, &bounds)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let fine = registry(&["a=cat".to_owned(), "b=x=y".to_owned()], &bounds).unwrap();
        assert_eq!(
            fine.tools().map(HostTool::name).collect::<Vec<_>>(),
            ["a", "b"]
        );
    }

    #[tokio::test]
    async fn a_call_answers_with_json_or_text_and_fails_with_the_first_stderr_line() {
        let deadline = Duration::from_secs(10);
        let echoed = call("cat", &json!({"a": [1, 2]}), deadline, 1024).await;
        assert_eq!(echoed, Ok(json!({"a": [1, 2]})));
        let text = call("printf 'not json\\n'", &json!({}), deadline, 1024).await;
        assert_eq!(text, Ok(json!("not json\n")));
        let failed = call(
            "echo first >&2; echo second >&2; exit 3",
            &json!({}),
            deadline,
            1024,
        )
        .await
        .unwrap_err();
        assert_eq!(failed.0, "the host command ended with exit 3: first");
    }

    #[tokio::test]
    async fn the_environment_is_path_alone_and_the_deadline_holds() {
        std::env::set_var("SANDBOXCTL_TEST_SECRET", "hunter2");
        let env = call("env", &json!({}), Duration::from_secs(10), 4096)
            .await
            .unwrap();
        let env = env.as_str().unwrap_or_default().to_owned();
        assert!(!env.contains("hunter2"), "{env}");
        assert!(env.contains("PATH="), "{env}");
        let started = std::time::Instant::now();
        let slow = call("sleep 30", &json!({}), Duration::from_millis(300), 1024).await;
        assert!(slow.is_err());
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn output_over_the_result_bound_fails() {
        let big = call(
            "head -c 5000 /dev/zero",
            &json!({}),
            Duration::from_secs(10),
            1000,
        )
        .await;
        assert!(big.is_err(), "{big:?}");
    }
}
