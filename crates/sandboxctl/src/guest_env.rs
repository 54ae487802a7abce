//! The guest environment from the command line: never a value in argv, where any local user could read
//! it in the process table.

use std::path::PathBuf;

use clap::Args;
use sandbox_core::{ExecEnv, SandboxError};

use host_files::{HostPathGuard, Source, MAX_ENV_FILE_BYTES};

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
    /// Builds and validates the guest environment. `lookup` reads sandboxctl's own environment;
    /// `--env-file` is read through `guard`, the one guarded opener of host reads (credential paths,
    /// backends' host state and pseudo file systems refused), and only when a guard is given: without
    /// one (a first check before a backend is connected) the file is not read yet.
    pub fn build(
        &self,
        lookup: impl Fn(&str) -> Option<Vec<u8>>,
        guard: Option<&HostPathGuard>,
    ) -> Result<ExecEnv, SandboxError> {
        let mut env = ExecEnv::default();
        for name in &self.names {
            let value = lookup(name).ok_or_else(|| {
                SandboxError::invalid(format!("--env {name}: the variable is not set"))
            })?;
            env = env.set(name.clone(), value);
        }
        if let (Some(path), Some(guard)) = (&self.file, guard) {
            let shown = path.display();
            // A regular file of bounded size: `/dev/zero` or a fifo must not take the host's memory
            // or hang. A policy refusal stays one (69); a file of the wrong kind or size is a bad
            // argument.
            let text = Source::open(path, guard, false)
                .and_then(|source| source.read_capped(MAX_ENV_FILE_BYTES))
                .map_err(|e| match e {
                    SandboxError::NotPermitted(why) => {
                        SandboxError::NotPermitted(format!("--env-file: {why}"))
                    }
                    other => SandboxError::invalid(format!("--env-file {shown}: {other}")),
                })?;
            let entries = parse_env_file(&text, &self.names, &self.allowed_secret_names).map_err(
                |(line, why)| {
                    SandboxError::invalid(format!("--env-file {shown}: line {line} {why}"))
                },
            )?;
            for (name, value) in entries {
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

/// A line of an env file that is refused: its number and the rule, never its content.
type LineError = (usize, &'static str);

/// `NAME=VALUE` per line; the value is the rest of the line, verbatim. Each entry is checked here
/// (the name's form, a NUL in the value, a secret-looking name not allowed, a name given twice, with
/// `given` the `--env` names) so that a refusal names the line and the rule, never a byte of the
/// file: a file that is not an env file (someone's `/proc/self/environ`) must not leak through its
/// error.
fn parse_env_file(
    text: &[u8],
    given: &[String],
    allowed: &[String],
) -> Result<Vec<(String, Vec<u8>)>, LineError> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let number = i + 1;
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let eq = line
            .iter()
            .position(|b| *b == b'=')
            .ok_or((number, "is not NAME=VALUE"))?;
        let name = std::str::from_utf8(&line[..eq])
            .ok()
            .filter(|name| is_env_name(name))
            .ok_or((number, "has a name that is not [A-Za-z_][A-Za-z0-9_]*"))?;
        let value = &line[eq + 1..];
        if value.contains(&0) {
            return Err((number, "has a NUL byte in its value"));
        }
        if sandbox_core::hygiene::is_secret_name(name) && !allowed.iter().any(|a| a == name) {
            return Err((
                number,
                "has a name that looks like a secret's; pass --allow-secret-name with that name to \
                 send it",
            ));
        }
        if given.iter().any(|g| g == name) || out.iter().any(|(n, _)| n == name) {
            return Err((number, "gives a name that is given before"));
        }
        out.push((name.to_owned(), value.to_vec()));
    }
    Ok(out)
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
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
        let parsed =
            parse_env_file(b"# c\n\nA=1\nB= spaced = value \nC=\nD=crlf\r\n", &[], &[]).unwrap();
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
        assert_eq!(
            parse_env_file(b"A=1\nnoequals\n", &[], &[]).unwrap_err().0,
            2
        );
    }

    #[test]
    fn names_from_own_env() {
        let args = EnvArgs {
            names: vec!["FOO".into()],
            ..Default::default()
        };
        let env = args
            .build(|n| (n == "FOO").then(|| b"bar".to_vec()), None)
            .unwrap();
        assert_eq!(env.entries(), &[("FOO".to_string(), b"bar".to_vec())]);
        assert!(args.build(|_| None, None).is_err());
    }

    #[test]
    fn secrets_need_allowing() {
        let mut args = EnvArgs {
            names: vec!["GITHUB_TOKEN".into()],
            ..Default::default()
        };
        let lookup = |_: &str| Some(b"t".to_vec());
        assert!(args.build(lookup, None).is_err());
        args.allowed_secret_names.push("GITHUB_TOKEN".into());
        assert!(args.build(lookup, None).is_ok());
    }

    fn guard() -> HostPathGuard {
        host_files::host_guard([], None).unwrap()
    }

    fn build_from(file: &std::path::Path) -> Result<ExecEnv, SandboxError> {
        EnvArgs {
            file: Some(file.to_path_buf()),
            ..Default::default()
        }
        .build(|_| None, Some(&guard()))
    }

    /// A file that is not an env file (a process's environment, NUL-separated) is refused by line,
    /// naming no variable and no value.
    #[test]
    fn env_file_errors_name_no_content() {
        let dir = tempfile::tempdir().unwrap();
        let cases: &[(&[u8], usize)] = &[
            (b"LEAKY_NAME_1=leaky-value\0HOME=/root\0", 1),
            (b"A=1\nLEAKY_API_TOKEN=leaky-value\n", 2),
            (b"A=1\nLEAKY NAME=leaky-value\n", 2),
            (b"LEAKY_NAME=leaky-value\nLEAKY_NAME=leaky-value\n", 2),
            (b"leaky-value\n", 1),
        ];
        for (content, line) in cases {
            let path = dir.path().join("env");
            std::fs::write(&path, content).unwrap();
            let e = build_from(&path).unwrap_err();
            let text = e.to_string();
            assert_eq!(e.kind(), sandbox_core::ErrorKind::InvalidArgument, "{text}");
            assert!(text.contains(&format!("line {line} ")), "{text}");
            assert!(!text.contains("LEAKY") && !text.contains("leaky"), "{text}");
        }
    }

    /// The env file goes through the one guarded opener: credential files, pseudo file systems and a
    /// backend's host state are refused as for cp-in.
    #[test]
    fn env_files_are_refused_where_cp_in_is() {
        let dir = tempfile::tempdir().unwrap();
        let aws = dir.path().join(".aws");
        std::fs::create_dir_all(&aws).unwrap();
        std::fs::write(aws.join("credentials"), b"AWS_SECRET=leaky\n").unwrap();
        let ws = dir.path().join("state/ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(ws.join("env"), b"A=1\n").unwrap();
        let guard = HostPathGuard::new(sandbox_core::credential_paths::CredentialGuard::for_user(
            dir.path().display().to_string(),
        ))
        .with_state_roots([dir.path().join("state").display().to_string()]);
        for file in [
            aws.join("credentials"),
            ws.join("env"),
            "/proc/cmdline".into(),
            "/proc/self/environ".into(),
        ] {
            let e = EnvArgs {
                file: Some(file.clone()),
                ..Default::default()
            }
            .build(|_| None, Some(&guard))
            .unwrap_err();
            assert_eq!(
                e.kind(),
                sandbox_core::ErrorKind::NotPermitted,
                "{}: {e}",
                file.display()
            );
            assert!(e.to_string().contains("--env-file"), "{e}");
            assert!(!e.to_string().contains("leaky"), "{e}");
        }
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
            .build(|_| None, Some(&guard()))
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
