//! The `docker` CLI, called through the bounded runner (a deadline and an output cap on every
//! call), except the relayed `exec`, whose bytes go straight between the client and `docker
//! exec` with nothing captured.

use std::ffi::{OsStr, OsString};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind, RunOutput};
use serde_json::Value;

use crate::error::{Result, SimError};

/// The variable naming the docker CLI (default `docker` on `PATH`).
pub const DOCKER_ENV: &str = "SBX_SIM_DOCKER";
/// The deadline of every docker call but `run`.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The deadline of `docker run` (it may unpack a large image).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(600);
/// The output cap of every captured docker call.
pub const OUTPUT_BUDGET: usize = 8 * 1024 * 1024;
/// How much of docker's stderr an error keeps.
const DETAIL_CHARS: usize = 2000;

/// The label naming the state home a container belongs to.
pub const HOME_LABEL: &str = "sbx-sim.home";

/// The docker CLI and the environment its calls get (the simulator's own).
#[derive(Debug, Clone)]
pub struct Docker {
    program: OsString,
    env: Vec<(OsString, OsString)>,
}

/// One container of this home as `docker inspect` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    /// The engine's container id.
    pub id: String,
    /// Whether it is running.
    pub running: bool,
    /// Its labels.
    pub labels: serde_json::Map<String, Value>,
    /// The CPU limit in nano-CPUs (0 when none).
    pub nano_cpus: u64,
    /// The memory limit in bytes (0 when none).
    pub memory_bytes: u64,
}

impl Container {
    /// A label's value, empty when absent.
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).and_then(Value::as_str).unwrap_or("")
    }
}

impl Docker {
    /// The CLI named by `SBX_SIM_DOCKER` (or `docker`), with this process's environment.
    pub fn from_env() -> Docker {
        let program = std::env::var_os(DOCKER_ENV)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| OsString::from("docker"));
        Docker {
            program,
            env: std::env::vars_os().collect(),
        }
    }

    /// A given CLI, with this process's environment.
    #[cfg(test)]
    pub fn with_program(program: &str) -> Docker {
        Docker {
            program: program.into(),
            env: std::env::vars_os().collect(),
        }
    }

    /// The CLI's path as configured.
    pub fn program(&self) -> &OsStr {
        &self.program
    }

    /// The environment handed to docker.
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// Runs one bounded call and returns its output whatever the exit status.
    ///
    /// # Errors
    ///
    /// The runner's: not started, past the deadline, over the output cap.
    pub async fn call<I, A>(
        &self,
        what: &'static str,
        timeout: Duration,
        args: I,
    ) -> Result<RunOutput>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        BoundedCommand::new(self.program.clone(), timeout)
            .args(args)
            .envs(self.env.iter().cloned())
            .output_budget(OUTPUT_BUDGET)
            .run()
            .await
            .map_err(|e| SimError::runner(what, e))
    }

    /// Runs one bounded call that must exit 0; returns its stdout.
    ///
    /// # Errors
    ///
    /// As [`Docker::call`], or [`SimError::Docker`] with the stderr tail on a non-zero exit.
    pub async fn checked<I, A>(
        &self,
        what: &'static str,
        timeout: Duration,
        args: I,
    ) -> Result<Vec<u8>>
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        let out = self.call(what, timeout, args).await?;
        if out.status == ExitKind::Exited(0) {
            Ok(out.stdout)
        } else {
            Err(SimError::docker(what, failure_detail(&out)))
        }
    }

    /// Inspects containers by name or id; names that do not exist are left out.
    ///
    /// # Errors
    ///
    /// The call failed for another reason than absence, or answered unreadable JSON.
    pub async fn inspect(&self, refs: &[String]) -> Result<Vec<Container>> {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec!["container".to_owned(), "inspect".to_owned()];
        args.extend(refs.iter().cloned());
        let out = self.call("inspect", CALL_TIMEOUT, args).await?;
        if out.status != ExitKind::Exited(0) {
            let detail = failure_detail(&out);
            // Exit 1 with "No such container" for some refs still prints the others.
            if !detail.to_ascii_lowercase().contains("no such") {
                return Err(SimError::docker("inspect", detail));
            }
        }
        parse_inspect(&out.stdout)
    }

    /// The container of this name, if it exists.
    ///
    /// # Errors
    ///
    /// As [`Docker::inspect`].
    pub async fn inspect_one(&self, name: &str) -> Result<Option<Container>> {
        Ok(self.inspect(&[name.to_owned()]).await?.into_iter().next())
    }

    /// Every container carrying `sbx-sim.home=<home>`.
    ///
    /// # Errors
    ///
    /// As [`Docker::inspect`], or a failed listing.
    pub async fn containers_of_home(&self, home: &str) -> Result<Vec<Container>> {
        let stdout = self
            .checked(
                "ps",
                CALL_TIMEOUT,
                [
                    "ps".to_owned(),
                    "-a".to_owned(),
                    "-q".to_owned(),
                    "--no-trunc".to_owned(),
                    "--filter".to_owned(),
                    format!("label={HOME_LABEL}={home}"),
                ],
            )
            .await?;
        let ids: Vec<String> = String::from_utf8_lossy(&stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let mut found = self.inspect(&ids).await?;
        // A container removed between the listing and the inspection is simply gone; one whose
        // label does not match (never expected) is not ours.
        found.retain(|c| c.label(HOME_LABEL) == home);
        Ok(found)
    }

    /// Removes a container by id, running or not (absence is fine).
    ///
    /// # Errors
    ///
    /// The removal failed for another reason.
    pub async fn remove(&self, id: &str) -> Result<()> {
        let out = self.call("rm", CALL_TIMEOUT, ["rm", "-f", id]).await?;
        if out.status == ExitKind::Exited(0) {
            return Ok(());
        }
        let detail = failure_detail(&out);
        if detail.to_ascii_lowercase().contains("no such container") {
            Ok(())
        } else {
            Err(SimError::docker("rm", detail))
        }
    }
}

/// The last 2000 characters of docker's trimmed stderr, or `exit <rc>` when it is empty.
pub fn failure_detail(out: &RunOutput) -> String {
    let text = String::from_utf8_lossy(&out.stderr);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return match out.status {
            ExitKind::Exited(rc) => format!("exit {rc}"),
            ExitKind::Signaled(sig) => format!("killed by signal {sig}"),
        };
    }
    let count = trimmed.chars().count();
    trimmed
        .chars()
        .skip(count.saturating_sub(DETAIL_CHARS))
        .collect()
}

/// Reads `docker container inspect` output: a JSON array of objects with `Id`, `State.Running`,
/// `Config.Labels`, `HostConfig.NanoCpus` and `HostConfig.Memory`.
///
/// # Errors
///
/// Anything else.
pub fn parse_inspect(stdout: &[u8]) -> Result<Vec<Container>> {
    let text = String::from_utf8_lossy(stdout);
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let value: Value =
        serde_json::from_str(&text).map_err(|e| SimError::malformed("inspect", e.to_string()))?;
    let rows = value
        .as_array()
        .ok_or_else(|| SimError::malformed("inspect", "not a JSON array"))?;
    rows.iter()
        .map(|row| {
            let id = row
                .get("Id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .ok_or_else(|| SimError::malformed("inspect", "a row without Id"))?;
            let running = row
                .pointer("/State/Running")
                .and_then(Value::as_bool)
                .ok_or_else(|| SimError::malformed("inspect", "a row without State.Running"))?;
            let labels = row
                .pointer("/Config/Labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let number = |path: &str| row.pointer(path).and_then(Value::as_u64).unwrap_or(0);
            Ok(Container {
                id: id.to_owned(),
                running,
                labels,
                nano_cpus: number("/HostConfig/NanoCpus"),
                memory_bytes: number("/HostConfig/Memory"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_rows_are_read_and_bad_shapes_refused() {
        let text = br#"[{"Id":"abc","State":{"Running":false},
            "Config":{"Labels":{"sbx-sim.home":"h","sbx-sim.name":"n"}},
            "HostConfig":{"NanoCpus":2000000000,"Memory":2147483648}}]"#;
        let rows = parse_inspect(text).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, "abc");
        assert!(!rows[0].running);
        assert_eq!(rows[0].label("sbx-sim.name"), "n");
        assert_eq!(rows[0].label("missing"), "");
        assert_eq!(rows[0].nano_cpus, 2_000_000_000);
        assert!(parse_inspect(b"").unwrap().is_empty());
        assert!(parse_inspect(b"{}").is_err());
        assert!(parse_inspect(br#"[{"Id":"x"}]"#).is_err());
        assert!(parse_inspect(b"[oops").is_err());
    }

    proptest::proptest! {
        #[test]
        fn no_byte_string_makes_the_inspect_parser_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_inspect(&bytes);
        }

        #[test]
        fn no_json_value_makes_the_inspect_parser_panic(text in r#"\[(\{("Id"|"State"|"Running"|"Config"|"Labels"|"HostConfig"|"NanoCpus"|:|,|\{|\}|true|false|1|-1|"x"|null)*\}?,?)*\]?"#) {
            let _ = parse_inspect(text.as_bytes());
        }
    }

    #[test]
    fn the_failure_detail_is_the_stderr_tail_or_the_status() {
        let out = |stderr: &[u8], status| RunOutput {
            status,
            stdout: Vec::new(),
            stderr: stderr.to_vec(),
            truncated: false,
        };
        assert_eq!(
            failure_detail(&out(b"  \n", ExitKind::Exited(125))),
            "exit 125"
        );
        assert_eq!(failure_detail(&out(b"boom\n", ExitKind::Exited(1))), "boom");
        let long = "x".repeat(5000) + "END";
        let detail = failure_detail(&out(long.as_bytes(), ExitKind::Exited(1)));
        assert_eq!(detail.chars().count(), 2000);
        assert!(detail.ends_with("END"));
    }
}
