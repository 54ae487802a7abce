//! What sandboxctl prints: one line for people, or exactly one JSON object with `--json`.

use base64::Engine as _;
use sandbox_core::{ExecOutput, SandboxError};
use serde_json::{json, Value};

/// The JSON form of an error: `{kind, message}`.
pub fn error_json(err: &SandboxError) -> Value {
    json!({ "kind": format!("{:?}", err.kind()), "message": err.to_string() })
}

/// The JSON object of a `run` or `exec` that produced an output.
pub fn exited_json(output: &ExecOutput) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    json!({
        "outcome": "exited",
        "exit_code": output.exit_code,
        "stdout": output.stdout_text(),
        "stderr": output.stderr_text(),
        "stdout_base64": b64.encode(&output.stdout),
        "stderr_base64": b64.encode(&output.stderr),
    })
}

/// The JSON object of a `run` or `exec` that failed: `timeout` (with `guest`) or `error`.
pub fn failed_run_json(err: &SandboxError) -> Value {
    match err {
        SandboxError::Timeout { .. } => {
            let mut v = json!({ "outcome": "timeout", "error": error_json(err) });
            if let Some(cleanup) = err.guest_cleanup() {
                v["guest"] = json!(cleanup.as_str());
            }
            v
        }
        _ => json!({ "outcome": "error", "error": error_json(err) }),
    }
}

/// Prints one JSON object on stdout.
pub fn print_json(value: &Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::GuestCleanup;
    use std::time::Duration;

    #[test]
    fn shapes() {
        let out = ExecOutput {
            stdout: vec![b'h', b'i', 0xff],
            stderr: b"err\n".to_vec(),
            exit_code: 7,
            producer_owns_stderr: false,
        };
        insta::assert_json_snapshot!("exited", exited_json(&out));
        let timeout = SandboxError::Timeout {
            operation: "command".into(),
            bound: Duration::from_secs(1),
            cleanup: Some(GuestCleanup::Killed),
        };
        insta::assert_json_snapshot!("timeout", failed_run_json(&timeout));
        let gone = SandboxError::SandboxGone {
            instance: "abc".into(),
        };
        insta::assert_json_snapshot!("error", failed_run_json(&gone));
    }
}
