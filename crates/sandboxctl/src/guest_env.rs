//! The guest environment from the command line: never a value in argv, where any local user could read
//! it in the process table.

use std::path::PathBuf;

use clap::Args;
use sandbox_core::{ExecEnv, SandboxError};

use crate::host_files::MAX_ENV_FILE_BYTES;

/// Guest environment flags.
#[derive(Debug, Clone, Default, Args)]
pub struct EnvArgs {
    /// Pass NAME with its value from sandboxctl's own environment (repeatable). Values never go in argv.
    #[arg(long = "env", value_name = "NAME")]
    pub names: Vec<String>,
    /// Read NAME=VALUE lines from a file (blank lines and lines starting with # skipped): a regular file
    /// of at most 1 MiB.
    #[arg(long = "env-file", value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Let NAME through the secret-name denylist (repeatable).
    #[arg(long = "allow-secret-name", value_name = "NAME")]
    pub allowed_secret_names: Vec<String>,
}

impl EnvArgs {
    /// Builds and validates the guest environment. `lookup` reads sandboxctl's own environment.
    pub fn build(&self, lookup: impl Fn(&str) -> Option<Vec<u8>>) -> Result<ExecEnv, SandboxError> {
        let mut env = ExecEnv::default();
        for name in &self.names {
            let value = lookup(name).ok_or_else(|| {
                SandboxError::invalid(format!("--env {name}: the variable is not set"))
            })?;
            env = env.set(name.clone(), value);
        }
        if let Some(path) = &self.file {
            // A regular file of bounded size: `/dev/zero` or a fifo must not take the host's memory or hang.
            let text = crate::host_files::read_regular_capped(path, MAX_ENV_FILE_BYTES).map_err(
                |why| SandboxError::invalid(format!("--env-file {}: {why}", path.display())),
            )?;
            for (name, value) in parse_env_file(&text).map_err(|line| {
                SandboxError::invalid(format!(
                    "--env-file {}: line {line} is not NAME=VALUE",
                    path.display()
                ))
            })? {
                env = env.set(name, value);
            }
        }
        for name in &self.allowed_secret_names {
            env = env.allow_secret_name(name.clone());
        }
        env.validate()?;
        Ok(env)
    }
}

/// `NAME=VALUE` per line; the value is the rest of the line, verbatim. Returns the bad line's number.
fn parse_env_file(text: &[u8]) -> Result<Vec<(String, Vec<u8>)>, usize> {
    let mut out = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let eq = line.iter().position(|b| *b == b'=').ok_or(i + 1)?;
        let name = std::str::from_utf8(&line[..eq]).map_err(|_| i + 1)?;
        out.push((name.to_owned(), line[eq + 1..].to_vec()));
    }
    Ok(out)
}

/// Reads a variable from sandboxctl's own environment, as bytes.
pub fn from_process_env(name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    std::env::var_os(name).map(|v| v.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_format() {
        let parsed = parse_env_file(b"# c\n\nA=1\nB= spaced = value \nC=\nD=crlf\r\n").unwrap();
        assert_eq!(
            parsed,
            vec![
                ("A".into(), b"1".to_vec()),
                ("B".into(), b" spaced = value ".to_vec()),
                ("C".into(), b"".to_vec()),
                // The rest of the line, verbatim: a carriage return stays part of the value.
                ("D".into(), b"crlf\r".to_vec())
            ]
        );
        assert_eq!(parse_env_file(b"A=1\nnoequals\n"), Err(2));
    }

    #[test]
    fn names_from_own_env() {
        let args = EnvArgs {
            names: vec!["FOO".into()],
            ..Default::default()
        };
        let env = args
            .build(|n| (n == "FOO").then(|| b"bar".to_vec()))
            .unwrap();
        assert_eq!(env.entries(), &[("FOO".to_string(), b"bar".to_vec())]);
        assert!(args.build(|_| None).is_err());
    }

    #[test]
    fn secrets_need_allowing() {
        let mut args = EnvArgs {
            names: vec!["GITHUB_TOKEN".into()],
            ..Default::default()
        };
        let lookup = |_: &str| Some(b"t".to_vec());
        assert!(args.build(lookup).is_err());
        args.allowed_secret_names.push("GITHUB_TOKEN".into());
        assert!(args.build(lookup).is_ok());
    }

    #[test]
    fn env_files_are_small_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let at_limit = dir.path().join("at-limit.env");
        let line = b"A=".to_vec();
        let mut content = line.clone();
        content.resize(MAX_ENV_FILE_BYTES as usize, b'x');
        std::fs::write(&at_limit, &content).unwrap();
        let over = dir.path().join("over.env");
        content.push(b'x');
        std::fs::write(&over, &content).unwrap();
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let build = |file: &std::path::Path| {
            EnvArgs {
                file: Some(file.to_path_buf()),
                ..Default::default()
            }
            .build(|_| None)
        };
        assert!(build(&at_limit).is_ok());
        for refused in [
            over.as_path(),
            fifo.as_path(),
            std::path::Path::new("/dev/zero"),
            dir.path(),
        ] {
            let e = build(refused).unwrap_err();
            assert_eq!(
                e.kind(),
                sandbox_core::ErrorKind::InvalidArgument,
                "{}",
                refused.display()
            );
            assert!(e.to_string().contains("--env-file"), "{e}");
        }
    }
}
