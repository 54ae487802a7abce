//! The tool probe: one plain `sh -c` call, before the first wrapper call and not through the
//! wrapper, naming every tool the wrapper needs that the guest lacks.
//!
//! The wrapper cannot report its own missing tools: without `base64` it exits 125 before the
//! nonce (at the first encoded value), without `setsid` the command fails with 127 after it, and
//! without `unshare` an sbx call cannot even start its first process.

use crate::error::{Error, Result};
use bounded_process::ExitKind;

/// Tools an sbx template must have besides `sh` (docs/wrapper-protocol.md#the-tool-probe).
pub const SBX_TOOLS: &[&str] = &[
    "base64", "setsid", "unshare", "mount", "mkdir", "cat", "rm", "sleep", "bash",
];

/// Tools a docker image must have besides `sh` (docs/wrapper-protocol.md#the-tool-probe).
pub const DOCKER_TOOLS: &[&str] = &[
    "base64", "setsid", "cat", "rm", "sleep", "mkdir", "mv", "mktemp", "chmod", "stat", "id",
];

/// Bound on the probe's output (64 KiB).
pub const PROBE_OUTPUT_BUDGET: usize = 64 * 1024;

/// The probe body. Tool names arrive as positionals, never spliced into the script text, so no
/// name can change what the script does.
pub const TOOL_PROBE_SCRIPT: &str =
    r#"for t do command -v "$t" >/dev/null || printf '%s\n' "$t"; done"#;

/// The probe's argv after `docker exec <id>` or `sbx exec <name>`: `sh -c <probe> maf-probe
/// <tool>…`.
///
/// # Errors
///
/// [`Error::Nul`] when a tool name contains NUL.
pub fn tool_probe_argv(tools: &[&str]) -> Result<Vec<String>> {
    let mut argv: Vec<String> = ["sh", "-c", TOOL_PROBE_SCRIPT, "maf-probe"]
        .map(str::to_owned)
        .to_vec();
    for tool in tools {
        if tool.contains('\0') {
            return Err(Error::nul(format!("tool name {tool:?}")));
        }
        argv.push((*tool).to_owned());
    }
    Ok(argv)
}

/// The tools named on the probe's stdout, one per non-empty line, in order.
pub fn missing_tools(stdout: &[u8]) -> Vec<String> {
    stdout
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .filter(|line| !line.is_empty())
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .collect()
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolProbeOutcome {
    /// Every tool is present (cache this per instance).
    AllPresent,
    /// These tools are missing (a capability refusal naming each; never cached).
    Missing(Vec<String>),
    /// The guest has no `sh`: the exec failed with 126 or 127 and printed nothing on stdout.
    NoShell,
    /// The probe call failed some other way; the backend classifies it like a wrapper call's
    /// missing nonce.
    Failed {
        /// The client's exit status.
        status: ExitKind,
    },
}

/// Reads the probe call's status and stdout.
pub fn read_tool_probe(status: ExitKind, stdout: &[u8]) -> ToolProbeOutcome {
    let missing = missing_tools(stdout);
    match status {
        ExitKind::Exited(0) if missing.is_empty() => ToolProbeOutcome::AllPresent,
        ExitKind::Exited(0) => ToolProbeOutcome::Missing(missing),
        ExitKind::Exited(126 | 127) if missing.is_empty() => ToolProbeOutcome::NoShell,
        status => ToolProbeOutcome::Failed { status },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_the_answer() {
        assert!(missing_tools(b"").is_empty());
        assert_eq!(missing_tools(b"base64\n"), ["base64"]);
        assert_eq!(
            missing_tools(b"base64\nsetsid\r\n\nstat"),
            ["base64", "setsid", "stat"]
        );
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            read_tool_probe(ExitKind::Exited(0), b""),
            ToolProbeOutcome::AllPresent
        );
        assert_eq!(
            read_tool_probe(ExitKind::Exited(0), b"base64\nsetsid\n"),
            ToolProbeOutcome::Missing(vec!["base64".into(), "setsid".into()])
        );
        assert_eq!(
            read_tool_probe(ExitKind::Exited(127), b""),
            ToolProbeOutcome::NoShell
        );
        assert_eq!(
            read_tool_probe(ExitKind::Exited(126), b""),
            ToolProbeOutcome::NoShell
        );
        // 126 or 127 after naming tools: a shell ran, so it is no missing shell.
        for status in [126, 127] {
            assert_eq!(
                read_tool_probe(ExitKind::Exited(status), b"base64\n"),
                ToolProbeOutcome::Failed {
                    status: ExitKind::Exited(status)
                }
            );
        }
        assert_eq!(
            read_tool_probe(ExitKind::Exited(1), b""),
            ToolProbeOutcome::Failed {
                status: ExitKind::Exited(1)
            }
        );
        assert_eq!(
            read_tool_probe(ExitKind::Signaled(9), b""),
            ToolProbeOutcome::Failed {
                status: ExitKind::Signaled(9)
            }
        );
    }

    #[test]
    fn argv_carries_tools_as_positionals() {
        let argv = tool_probe_argv(&["base64", "setsid"]).unwrap();
        assert_eq!(
            argv,
            [
                "sh",
                "-c",
                TOOL_PROBE_SCRIPT,
                "maf-probe",
                "base64",
                "setsid"
            ]
        );
        assert!(matches!(tool_probe_argv(&["a\0b"]), Err(Error::Nul { .. })));
    }
}
