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

/// The JSON object of a `run` or `exec` whose command never started because its working
/// directory could not be entered in the guest. `reason` is the guest shell's own message; there
/// is no `exit_code`, which is only ever the command's own status.
pub fn not_started_json(reason: &str) -> Value {
    json!({
        "outcome": "not_started",
        "reason": reason,
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

/// A guest-controlled name for a line of text output, escaped the way `ls -b` does: a backslash, a space
/// and the C escapes (`\n`, `\t`, ...) as such, every other control character (C0, DEL, C1) and the
/// bidirectional-text controls as `\ooo` octal bytes. Nothing printed can end a line, split a field,
/// reach the terminal as an escape sequence or reorder what is shown; `--json` carries the exact name.
pub fn escape_name(name: &str) -> String {
    escape(name, true, true)
}

/// A listing entry's path for a line of text output: [`escape_name`], except that a path whose last
/// name the library already escaped (`name_escaped`: not UTF-8, or holding a backslash; see
/// `sandbox_core::guest_path::escape_name`) keeps those escapes as they are (`\xff`, `\\`), so
/// the line shows every name, unambiguously: a backslash in a shown name is always an escape.
pub fn escape_listed(path: &str, name_escaped: bool) -> String {
    escape(path, true, !name_escaped)
}

/// A message for one line of stderr: control characters escaped as in [`escape_name`], spaces and
/// backslashes kept.
pub fn escape_controls(text: &str) -> String {
    escape(text, false, false)
}

fn escape(text: &str, as_name: bool, backslash: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let named = match c {
            '\\' if backslash => "\\\\",
            ' ' if as_name => "\\ ",
            '\u{7}' => "\\a",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{b}' => "\\v",
            _ => "",
        };
        if !named.is_empty() {
            out.push_str(named);
        } else if c.is_control() || is_bidi_control(c) {
            for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                let _ = write!(out, "\\{byte:03o}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Characters that reorder how the text around them is displayed.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
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
        let out = ExecOutput::exited(vec![b'h', b'i', 0xff], b"err\n".to_vec(), 7);
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
        insta::assert_json_snapshot!(
            "not_started",
            not_started_json("sh: 1: cd: can't cd to /missing")
        );
    }

    #[test]
    fn names_are_escaped_as_ls_b_does() {
        let cases = [
            ("plain.txt", "plain.txt"),
            ("two words", "two\\ words"),
            ("back\\slash", "back\\\\slash"),
            (
                "a\nfile\t999999\tFORGED-ENTRY\n\u{1b}[31mRED",
                "a\\nfile\\t999999\\tFORGED-ENTRY\\n\\033[31mRED",
            ),
            ("\u{7}\u{8}\u{b}\u{c}\r\u{7f}", "\\a\\b\\v\\f\\r\\177"),
            ("csi\u{9b}x", "csi\\302\\233x"),
            ("rtl\u{202e}txt", "rtl\\342\\200\\256txt"),
            ("thé", "thé"),
        ];
        for (name, want) in cases {
            assert_eq!(escape_name(name), want, "{name:?}");
        }
        assert_eq!(escape_controls("a b\\c\u{1b}"), "a b\\c\\033");
    }
}
