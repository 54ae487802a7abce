//! Running child processes: streamed with inherited stdio, or bounded and captured, or teed.

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::XtaskError;

/// The workspace this xtask belongs to; every command runs from its root.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// The parent of this crate's manifest directory, checked to hold the workspace manifest.
    pub fn locate() -> Result<Workspace, XtaskError> {
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        manifest_dir
            .parent()
            .filter(|root| root.join("Cargo.toml").is_file())
            .map(|root| Workspace {
                root: root.to_owned(),
            })
            .ok_or_else(|| XtaskError::NoWorkspace {
                manifest_dir: manifest_dir.display().to_string(),
            })
    }

    /// The workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Cargo's target directory (`CARGO_TARGET_DIR` when set, else `<root>/target`).
    pub fn target_dir(&self) -> PathBuf {
        match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => self.root.join(dir),
            None => self.root.join("target"),
        }
    }

    /// Runs `command` from the workspace root with inherited stdio; fails unless it exits 0.
    pub fn run(&self, command: &mut Command) -> Result<(), XtaskError> {
        run_in(&self.root, command)
    }
}

/// A `cargo` command: the cargo that runs this xtask when known, else `cargo` from `PATH`; its
/// `PATH` starts with the tools cache's `bin` directories, so `cargo nextest` and `cargo fuzz`
/// find a tool installed there ([`crate::tools`]).
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Ok(joined) = std::env::join_paths(
        crate::tools::bin_dirs()
            .into_iter()
            .chain(std::env::split_paths(&path)),
    ) {
        command.env("PATH", joined);
    }
    command
}

/// The command line as a shell would show it (for banners and errors).
pub fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    if line.ends_with("/cargo") {
        line = "cargo".to_owned();
    }
    for arg in command.get_args() {
        let arg = arg.to_string_lossy();
        line.push(' ');
        if arg.is_empty() || arg.contains([' ', '\'', '"', '{', '}', '$']) {
            line.push('\'');
            line.push_str(&arg.replace('\'', r"'\''"));
            line.push('\'');
        } else {
            line.push_str(&arg);
        }
    }
    line
}

/// Runs `command` in `dir` with inherited stdio (its output streams as it comes).
pub fn run_in(dir: &Path, command: &mut Command) -> Result<(), XtaskError> {
    let line = describe(command);
    eprintln!("$ {line}");
    let status = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .status()
        .map_err(|source| XtaskError::Spawn {
            command: line.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(XtaskError::CommandFailed {
            command: line,
            status: status.to_string(),
        })
    }
}

/// Runs `command` in `dir` with stdout captured (stderr inherited) under a deadline; the
/// child is killed and reaped when the deadline passes. Fails unless it exits 0.
pub fn capture_in(
    dir: &Path,
    command: &mut Command,
    timeout: Duration,
) -> Result<String, XtaskError> {
    let line = describe(command);
    let mut child = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| XtaskError::Spawn {
            command: line.clone(),
            source,
        })?;
    let mut stdout = child.stdout.take();
    let reader = thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stdout.as_mut() {
            // A cap keeps a runaway child from filling memory; listings are far smaller.
            let _ = pipe.take(16 * 1024 * 1024).read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(XtaskError::TimedOut {
                    command: line,
                    timeout,
                });
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(XtaskError::Spawn {
                    command: line,
                    source,
                });
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    if status.success() {
        Ok(text)
    } else {
        Err(XtaskError::CommandFailed {
            command: line,
            status: status.to_string(),
        })
    }
}

/// A single-threaded tokio runtime to drive [`bounded_process::BoundedCommand`]s on; `purpose`
/// names it in the error.
pub fn bounded_runtime(purpose: &str) -> Result<tokio::runtime::Runtime, XtaskError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| XtaskError::Spawn {
            command: format!("a tokio runtime for {purpose}"),
            source,
        })
}

/// Runs `command` under its deadline and output budget with each line of its output copied to
/// stderr as it comes, and returns how it ended (any exit status: the caller judges it). `line`
/// is the command line for the banner and the error.
pub fn stream_bounded(
    runtime: &tokio::runtime::Runtime,
    line: &str,
    command: bounded_process::BoundedCommand,
) -> Result<bounded_process::ExitKind, XtaskError> {
    eprintln!("$ {line}");
    let command = command.on_line(|_, text| eprint!("{}", String::from_utf8_lossy(text)));
    runtime
        .block_on(command.run())
        .map(|output| output.status)
        .map_err(|source| XtaskError::Bounded {
            command: line.to_owned(),
            source,
        })
}

/// What a teed child printed that the caller asked to keep, and how it ended.
#[derive(Debug)]
pub struct Teed {
    /// The command line.
    pub command: String,
    /// Whether it exited 0.
    pub success: bool,
    /// Its exit status, as text.
    pub status: String,
    /// The lines (of either stream) that `keep` selected, in order per stream.
    pub kept: Vec<String>,
}

/// Runs `command` in `dir`, copying each line of its stdout and stderr to ours as it comes
/// (so it streams as with inherited stdio) and keeping the lines `keep` selects.
pub fn tee_in(
    dir: &Path,
    command: &mut Command,
    keep: fn(&str) -> bool,
) -> Result<Teed, XtaskError> {
    let line = describe(command);
    eprintln!("$ {line}");
    let mut child = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| XtaskError::Spawn {
            command: line.clone(),
            source,
        })?;
    let out = child.stdout.take().map(|pipe| {
        thread::spawn(move || {
            copy_lines(pipe, keep, |text| {
                let mut stdout = std::io::stdout().lock();
                let _ = stdout.write_all(text);
                let _ = stdout.flush();
            })
        })
    });
    let err = child.stderr.take().map(|pipe| {
        thread::spawn(move || {
            copy_lines(pipe, keep, |text| {
                let _ = std::io::stderr().lock().write_all(text);
            })
        })
    });
    let mut kept = Vec::new();
    for reader in [out, err].into_iter().flatten() {
        kept.extend(reader.join().unwrap_or_default());
    }
    let status = child.wait().map_err(|source| XtaskError::Spawn {
        command: line.clone(),
        source,
    })?;
    Ok(Teed {
        command: line,
        success: status.success(),
        status: status.to_string(),
        kept,
    })
}

fn copy_lines(pipe: impl Read, keep: fn(&str) -> bool, write: impl Fn(&[u8])) -> Vec<String> {
    let mut reader = BufReader::new(pipe);
    let mut kept = Vec::new();
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        match reader.read_until(b'\n', &mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                write(&buffer);
                let text = String::from_utf8_lossy(&buffer);
                let text = strip_ansi(text.trim_end());
                if keep(&text) {
                    kept.push(text);
                }
            }
        }
    }
    kept
}

/// Removes ANSI colour sequences (`ESC [ … letter`), so kept lines parse the same coloured or not.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// A duration as seconds with one decimal (`12.3s`).
pub fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_sequences_are_removed() {
        assert_eq!(
            strip_ansi("\u{1b}[32;1m     Summary\u{1b}[0m [ 1s]"),
            "     Summary [ 1s]"
        );
        assert_eq!(strip_ansi("plain"), "plain");
    }

    #[test]
    fn command_lines_are_quoted_for_reading() {
        let mut command = Command::new("docker");
        command.args(["ps", "--format", "{{.ID}}\t{{.Names}}", "it's"]);
        assert_eq!(
            describe(&command),
            "docker ps --format '{{.ID}}\t{{.Names}}' 'it'\\''s'"
        );
    }

    #[test]
    fn captured_commands_are_bounded() {
        let started = Instant::now();
        let error = capture_in(
            Path::new("/"),
            Command::new("sleep").arg("30"),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(error, XtaskError::TimedOut { .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let text = capture_in(
            Path::new("/"),
            Command::new("sh").args(["-c", "echo one; echo two"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(text, "one\ntwo\n");
    }

    #[test]
    fn teed_output_keeps_the_selected_lines() {
        let teed = tee_in(
            Path::new("/"),
            Command::new("sh").args(["-c", "echo keep-a; echo drop; echo keep-b >&2; exit 2"]),
            |line| line.starts_with("keep"),
        )
        .unwrap();
        assert!(!teed.success);
        let mut kept = teed.kept.clone();
        kept.sort();
        assert_eq!(kept, vec!["keep-a", "keep-b"]);
    }
}
