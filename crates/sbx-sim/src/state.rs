//! The state directory: where it is, its digest (`home`), the lock every mutation takes, and
//! its JSON files (written to a temporary file, then renamed over the old one).
//!
//! Layout under the directory:
//!
//! | path | content |
//! |---|---|
//! | `settings.json` | `ssh.agentForwardingEnabled` (false), `sim.idleStopSeconds` (30) |
//! | `daemon.json` | the settings captured at the last `daemon restart` |
//! | `faults.json` | fault name → value or null |
//! | `mcp.json` | `[{"name","url"}]` |
//! | `policy.json` | the `policy allow`/`deny` requests, recorded and never enforced |
//! | `sandboxes/<name>.json` | id, exec user, template, creation time, cpus, memory |
//! | `sessions/<name>/<pid>` | one lease per running `exec`; `sessions/<name>/activity` the last end |
//! | `workers/` | create requests, results and logs; the idle watchers' locks and logs |
//! | `lock` | `flock`ed for every state mutation |

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{flock, FlockOperation};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{Result, SimError};
use crate::faults::{FaultSet, FAULTS_ENV};

/// The variable naming the state directory.
pub const HOME_ENV: &str = "SBX_SIM_HOME";

/// The setting read by `sbx`'s hardening check.
pub const AGENT_FORWARDING_KEY: &str = "ssh.agentForwardingEnabled";
/// The simulator's idle-stop delay, in seconds (`0` disables idle stop).
pub const IDLE_STOP_KEY: &str = "sim.idleStopSeconds";

/// Where the state directory is: `$SBX_SIM_HOME`, else `$XDG_STATE_HOME/sbx-sim`, else
/// `~/.local/state/sbx-sim`; made absolute against the working directory (no symlink
/// resolution, so the digest is of the path as named).
///
/// # Errors
///
/// None of the three variables is usable, or the working directory cannot be read.
pub fn resolve_dir(
    sim_home: Option<&std::ffi::OsStr>,
    xdg_state: Option<&std::ffi::OsStr>,
    home: Option<&std::ffi::OsStr>,
) -> Result<PathBuf> {
    let nonempty = |v: Option<&std::ffi::OsStr>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = if let Some(dir) = nonempty(sim_home) {
        dir
    } else if let Some(state) = nonempty(xdg_state) {
        state.join("sbx-sim")
    } else if let Some(home) = nonempty(home) {
        home.join(".local").join("state").join("sbx-sim")
    } else {
        return Err(SimError::invalid(format!(
            "no state directory: set {HOME_ENV}, XDG_STATE_HOME or HOME"
        )));
    };
    std::path::absolute(&dir).map_err(|e| SimError::state(dir, e))
}

/// The home digest: the first 12 hex digits of the SHA-256 of the absolute directory path.
pub fn home_digest(dir: &Path) -> String {
    let digest = Sha256::digest(dir.as_os_str().as_encoded_bytes());
    hex(&digest[..6])
}

/// Lowercase hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A valid sandbox name: `[a-z0-9][a-z0-9-]{0,62}`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Refuses an invalid sandbox name.
///
/// # Errors
///
/// [`SimError::Invalid`] naming the rule.
pub fn check_name(name: &str) -> Result<()> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(SimError::invalid(format!(
            "invalid sandbox name {name:?}: use 1 to 63 of a-z, 0-9 and -, starting with a letter or digit"
        )))
    }
}

/// `n` random bytes from the operating system's random source, as hex (`2 * n` digits).
///
/// # Errors
///
/// The random source fails; nothing is made up instead.
pub fn random_hex(n: usize) -> Result<String> {
    host_state::random_hex(n * 2).map_err(|e| SimError::state("the random source", e))
}

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An RFC 3339 UTC timestamp with second precision, e.g. `2026-11-30T16:52:39Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil date from a day count (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// The simulator's settings, as stored in `settings.json` and `daemon.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Whether sbx would forward the host's SSH agent into sandboxes.
    #[serde(rename = "ssh.agentForwardingEnabled", default)]
    pub agent_forwarding: bool,
    /// Seconds after the last exec before an idle sandbox is stopped; `0` never.
    #[serde(rename = "sim.idleStopSeconds", default = "default_idle_stop")]
    pub idle_stop_seconds: u64,
}

fn default_idle_stop() -> u64 {
    30
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            agent_forwarding: false,
            idle_stop_seconds: default_idle_stop(),
        }
    }
}

impl Settings {
    /// The value of a key as `settings get` prints it.
    ///
    /// # Errors
    ///
    /// An unknown key.
    pub fn get(&self, key: &str) -> Result<String> {
        match key {
            AGENT_FORWARDING_KEY => Ok(self.agent_forwarding.to_string()),
            IDLE_STOP_KEY => Ok(self.idle_stop_seconds.to_string()),
            other => Err(unknown_setting(other)),
        }
    }

    /// Sets a key from its text form.
    ///
    /// # Errors
    ///
    /// An unknown key or a value of the wrong type.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            AGENT_FORWARDING_KEY => {
                self.agent_forwarding = match value.trim().to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(SimError::invalid(format!(
                            "{AGENT_FORWARDING_KEY} takes true or false (got {value:?})"
                        )))
                    }
                }
            }
            IDLE_STOP_KEY => {
                self.idle_stop_seconds = value.trim().parse::<u64>().map_err(|_| {
                    SimError::invalid(format!(
                        "{IDLE_STOP_KEY} takes a whole number of seconds (got {value:?})"
                    ))
                })?;
            }
            other => return Err(unknown_setting(other)),
        }
        Ok(())
    }
}

#[cold]
#[inline(never)]
fn unknown_setting(key: &str) -> SimError {
    SimError::invalid(format!(
        "unknown setting {key:?}; known: {AGENT_FORWARDING_KEY}, {IDLE_STOP_KEY}"
    ))
}

/// One registered MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServer {
    /// Its name.
    pub name: String,
    /// Its URL.
    pub url: String,
}

/// What the simulator remembers of a sandbox beside the container's labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// The sandbox id (also the `sbx-sim.id` label).
    pub id: String,
    /// `<uid>:<gid>` every default exec runs as: the workspace directory's owner at create.
    pub exec_user: String,
    /// The template as given (`shell` or an image).
    pub template: String,
    /// RFC 3339 creation time.
    pub created: String,
    /// The CPU count asked for.
    pub cpus: u32,
    /// The memory limit as given.
    pub memory: String,
}

/// One state directory, opened for an invocation.
#[derive(Debug, Clone)]
pub struct StateHome {
    dir: PathBuf,
    digest: String,
}

/// The exclusive `flock` on `lock`, released on drop.
#[derive(Debug)]
#[must_use = "the lock is released when this is dropped"]
pub struct StateLock {
    _file: File,
}

/// A non-blocking exclusive `flock` on a file, released on drop (one idle watcher per name).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Takes the lock on `path` (created if absent) when nobody holds it.
    ///
    /// # Errors
    ///
    /// The file cannot be opened, or locking failed for another reason than contention.
    pub fn try_take(path: &Path) -> Result<Option<FileLock>> {
        let file = open_lock_file(path)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(FileLock { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(SimError::state(path, e.into())),
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| SimError::state(path, e))
}

impl StateHome {
    /// Opens (creating it, mode 0700) the state directory of this process's environment.
    ///
    /// # Errors
    ///
    /// No usable location, or the directory cannot be made.
    pub fn from_env() -> Result<StateHome> {
        let dir = resolve_dir(
            std::env::var_os(HOME_ENV).as_deref(),
            std::env::var_os("XDG_STATE_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        )?;
        StateHome::open(dir)
    }

    /// Opens (creating it, mode 0700) the state directory at an absolute path.
    ///
    /// # Errors
    ///
    /// The directory or its subdirectories cannot be made.
    pub fn open(dir: PathBuf) -> Result<StateHome> {
        use std::os::unix::fs::DirBuilderExt as _;
        for sub in ["", "sandboxes", "sessions", "workers"] {
            let path = dir.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| SimError::state(path, e))?;
        }
        // The lock file exists from the home's first opening: the background workers a command
        // starts take the lock only where the file is (`lock_if_present`).
        drop(open_lock_file(&dir.join("lock"))?);
        let digest = home_digest(&dir);
        Ok(StateHome { dir, digest })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The home digest used in container names and the `sbx-sim.home` label.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The container name of a sandbox: `sbx-sim-<home>-<name>`.
    pub fn container_name(&self, name: &str) -> String {
        format!("sbx-sim-{}-{name}", self.digest)
    }

    /// The `workers/` directory.
    pub fn workers_dir(&self) -> PathBuf {
        self.dir.join("workers")
    }

    /// Takes the state lock, blocking until it is free.
    ///
    /// # Errors
    ///
    /// The lock file cannot be opened or locked.
    pub fn lock(&self) -> Result<StateLock> {
        let path = self.dir.join("lock");
        let file = open_lock_file(&path)?;
        flock(&file, FlockOperation::LockExclusive).map_err(|e| SimError::state(path, e.into()))?;
        Ok(StateLock { _file: file })
    }

    /// Takes the state lock, blocking until it is free, as a background worker does: without
    /// creating the lock file. A worker outlives the command that started it (which made the
    /// file); when the state directory has been removed since, creating `lock` would put an
    /// entry back into a directory being removed, and it would stay behind. `None`: the lock
    /// file is gone, and with it the state the worker looked after.
    ///
    /// # Errors
    ///
    /// The lock file cannot be opened for another reason than its absence, or locking failed.
    pub fn lock_if_present(&self) -> Result<Option<StateLock>> {
        let path = self.dir.join("lock");
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(SimError::state(path, e)),
        };
        flock(&file, FlockOperation::LockExclusive).map_err(|e| SimError::state(path, e.into()))?;
        Ok(Some(StateLock { _file: file }))
    }

    /// Reads a JSON file, `None` when absent.
    ///
    /// # Errors
    ///
    /// Unreadable or not the expected shape.
    pub fn read_json<T: DeserializeOwned>(&self, relative: &str) -> Result<Option<T>> {
        read_json_at(&self.dir.join(relative))
    }

    /// Writes a JSON file through a temporary file and a rename. Call it under [`StateHome::lock`].
    ///
    /// # Errors
    ///
    /// The file cannot be written or renamed.
    pub fn write_json<T: Serialize>(
        &self,
        _lock: &StateLock,
        relative: &str,
        value: &T,
    ) -> Result<()> {
        write_json_at(&self.dir.join(relative), value)
    }

    /// The stored settings (defaults when absent).
    ///
    /// # Errors
    ///
    /// An unreadable `settings.json`.
    pub fn settings(&self) -> Result<Settings> {
        Ok(self.read_json("settings.json")?.unwrap_or_default())
    }

    /// The settings of the last `daemon restart` (defaults when never restarted).
    ///
    /// # Errors
    ///
    /// An unreadable `daemon.json`.
    pub fn daemon_settings(&self) -> Result<Settings> {
        Ok(self.read_json("daemon.json")?.unwrap_or_default())
    }

    /// The faults stored in `faults.json`, without the environment's.
    ///
    /// # Errors
    ///
    /// An unreadable file or an invalid stored switch.
    pub fn stored_faults(&self) -> Result<FaultSet> {
        let stored: BTreeMap<String, Option<String>> =
            self.read_json("faults.json")?.unwrap_or_default();
        FaultSet::from_stored(&stored)
    }

    /// The faults in force: `faults.json` plus `SBX_SIM_FAULTS`.
    ///
    /// # Errors
    ///
    /// As [`StateHome::stored_faults`], or an invalid entry of the variable.
    pub fn faults(&self) -> Result<FaultSet> {
        let mut set = self.stored_faults()?;
        if let Some(text) = std::env::var_os(FAULTS_ENV) {
            set.add_env(&text.to_string_lossy())?;
        }
        Ok(set)
    }

    /// Replaces `faults.json`.
    ///
    /// # Errors
    ///
    /// The file cannot be written.
    pub fn write_faults(&self, lock: &StateLock, set: &FaultSet) -> Result<()> {
        self.write_json(lock, "faults.json", &set.to_stored())
    }

    /// The registered MCP servers.
    ///
    /// # Errors
    ///
    /// An unreadable `mcp.json`.
    pub fn mcp_servers(&self) -> Result<Vec<McpServer>> {
        Ok(self.read_json("mcp.json")?.unwrap_or_default())
    }

    /// A sandbox's record, when there is one.
    ///
    /// # Errors
    ///
    /// An unreadable record.
    pub fn record(&self, name: &str) -> Result<Option<SandboxRecord>> {
        self.read_json(&format!("sandboxes/{name}.json"))
    }

    /// Whether a sandbox has a record (its create finished and it was not removed since).
    pub fn has_record(&self, name: &str) -> bool {
        self.dir
            .join("sandboxes")
            .join(format!("{name}.json"))
            .is_file()
    }

    /// Removes a sandbox's record and its session directory (absence is fine).
    ///
    /// # Errors
    ///
    /// A removal failing for another reason than absence.
    pub fn forget(&self, _lock: &StateLock, name: &str) -> Result<()> {
        remove_if_present(&self.dir.join("sandboxes").join(format!("{name}.json")))?;
        let sessions = self.sessions_dir(name);
        match fs::remove_dir_all(&sessions) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(SimError::state(sessions, e)),
            _ => Ok(()),
        }
    }

    /// The names of every stored record.
    ///
    /// # Errors
    ///
    /// The directory cannot be listed.
    pub fn record_names(&self) -> Result<Vec<String>> {
        let dir = self.dir.join("sandboxes");
        let entries = fs::read_dir(&dir).map_err(|e| SimError::state(&dir, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| SimError::state(&dir, e))?;
            if let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn sessions_dir(&self, name: &str) -> PathBuf {
        self.dir.join("sessions").join(name)
    }

    /// Records a lease for a running exec of process `pid`.
    ///
    /// # Errors
    ///
    /// The lease cannot be written.
    pub fn add_lease(&self, _lock: &StateLock, name: &str, pid: u32) -> Result<()> {
        let dir = self.sessions_dir(name);
        fs::create_dir_all(&dir).map_err(|e| SimError::state(&dir, e))?;
        let path = dir.join(pid.to_string());
        fs::write(&path, b"").map_err(|e| SimError::state(path, e))
    }

    /// Ends a lease and records the end as the sandbox's last activity.
    ///
    /// # Errors
    ///
    /// The lease or the activity file cannot be written.
    pub fn end_lease(&self, lock: &StateLock, name: &str, pid: u32) -> Result<()> {
        remove_if_present(&self.sessions_dir(name).join(pid.to_string()))?;
        self.touch_activity(lock, name)
    }

    /// Records now as the sandbox's last activity.
    ///
    /// # Errors
    ///
    /// The activity file cannot be written.
    pub fn touch_activity(&self, _lock: &StateLock, name: &str) -> Result<()> {
        let dir = self.sessions_dir(name);
        fs::create_dir_all(&dir).map_err(|e| SimError::state(&dir, e))?;
        write_json_at(&dir.join("activity"), &now_millis())
    }

    /// The last recorded activity (ms since the epoch), if any.
    ///
    /// # Errors
    ///
    /// An unreadable activity file.
    pub fn last_activity(&self, name: &str) -> Result<Option<u64>> {
        read_json_at(&self.sessions_dir(name).join("activity"))
    }

    /// The pids of the leases whose process still lives; the others are removed.
    ///
    /// # Errors
    ///
    /// The session directory cannot be listed.
    pub fn live_leases(&self, _lock: &StateLock, name: &str) -> Result<Vec<u32>> {
        let dir = self.sessions_dir(name);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(SimError::state(dir, e)),
        };
        let mut live = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| SimError::state(&dir, e))?;
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if process_lives(pid) {
                live.push(pid);
            } else {
                remove_if_present(&entry.path())?;
            }
        }
        Ok(live)
    }
}

/// Whether a process of this pid exists (a signal-0 probe).
pub fn process_lives(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        // It exists but belongs to someone else.
        Err(rustix::io::Errno::PERM) => true,
        Err(_) => false,
    }
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(SimError::state(path, e)),
        _ => Ok(()),
    }
}

/// Reads a JSON file, `None` when absent.
///
/// # Errors
///
/// Unreadable or not the expected shape.
pub fn read_json_at<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let Some(bytes) = host_state::read_record(path, MAX_STATE_FILE_BYTES)
        .map_err(|e| SimError::state(path, e))?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| SimError::state(path, std::io::Error::new(ErrorKind::InvalidData, e)))
}

/// The most of a state file [`read_json_at`] reads: far above any the simulator writes (a
/// sandbox list of thousands); a longer file is cut there and fails to parse, never read whole.
const MAX_STATE_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Writes a JSON file (mode 0600) durably, through `host_state::place_record`: a reader sees
/// the old file or the new one, never half of one.
///
/// # Errors
///
/// The file cannot be written or put in place.
pub fn write_json_at<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| SimError::state(path, std::io::Error::other(e)))?;
    bytes.push(b'\n');
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(SimError::state(
            path,
            std::io::Error::new(ErrorKind::InvalidInput, "not a file path with a UTF-8 name"),
        ));
    };
    host_state::place_record(dir, name, &bytes, host_state::Placing::Replace)
        .map(drop)
        .map_err(|e| SimError::state(path, e))
}

/// How long until `last + idle`, zero when past.
pub fn idle_remaining(last_millis: u64, idle: Duration, now_millis: u64) -> Duration {
    let due = last_millis.saturating_add(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX));
    Duration::from_millis(due.saturating_sub(now_millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ffi::OsStr;

    #[test]
    fn the_home_digest_is_twelve_hex_of_the_paths_sha256() {
        // printf %s /tmp/sim-a | sha256sum
        let digest = home_digest(Path::new("/tmp/sim-a"));
        assert_eq!(digest.len(), 12);
        let full = hex(&Sha256::digest(b"/tmp/sim-a"));
        assert_eq!(digest, full[..12]);
        assert_ne!(digest, home_digest(Path::new("/tmp/sim-b")));
    }

    #[test]
    fn the_directory_comes_from_the_first_variable_set() {
        let d = |a: Option<&str>, b: Option<&str>, c: Option<&str>| {
            resolve_dir(a.map(OsStr::new), b.map(OsStr::new), c.map(OsStr::new))
        };
        assert_eq!(
            d(Some("/s"), Some("/x"), Some("/h")).unwrap(),
            Path::new("/s")
        );
        assert_eq!(
            d(Some(""), Some("/x"), Some("/h")).unwrap(),
            Path::new("/x/sbx-sim")
        );
        assert_eq!(
            d(None, None, Some("/h")).unwrap(),
            Path::new("/h/.local/state/sbx-sim")
        );
        assert!(d(None, None, None).is_err());
        let relative = d(Some("rel/dir"), None, None).unwrap();
        assert!(relative.is_absolute() && relative.ends_with("rel/dir"));
    }

    #[test]
    fn names_follow_the_pattern() {
        for good in [
            "a",
            "0",
            "maf-0123456789ab-0123456789-01234567",
            &"a".repeat(63),
        ] {
            assert!(is_valid_name(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "A",
            "a_b",
            "a.b",
            "a b",
            "é",
            &"a".repeat(64),
            "a/b",
        ] {
            assert!(!is_valid_name(bad), "{bad}");
            assert!(check_name(bad).is_err());
        }
    }

    proptest! {
        #[test]
        fn name_validation_matches_the_regex(name in "[a-z0-9_A-Z.-]{0,70}") {
            let by_rule = !name.is_empty()
                && name.len() <= 63
                && name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            prop_assert_eq!(is_valid_name(&name), by_rule);
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        let at = |secs| rfc3339(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_057_559), "2026-11-30T16:52:39Z");
    }

    #[test]
    fn settings_read_write_and_refuse_unknown_keys() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().join("home")).unwrap();
        let mut settings = home.settings().unwrap();
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.get(AGENT_FORWARDING_KEY).unwrap(), "false");
        assert_eq!(settings.get(IDLE_STOP_KEY).unwrap(), "30");
        settings.set(IDLE_STOP_KEY, "1").unwrap();
        settings.set(AGENT_FORWARDING_KEY, "TRUE").unwrap();
        assert!(settings.set(IDLE_STOP_KEY, "-1").is_err());
        assert!(settings.set(AGENT_FORWARDING_KEY, "yes").is_err());
        assert!(settings
            .set("no.such", "1")
            .unwrap_err()
            .to_string()
            .contains("unknown setting"));
        assert!(settings.get("no.such").is_err());
        let lock = home.lock().unwrap();
        home.write_json(&lock, "settings.json", &settings).unwrap();
        drop(lock);
        assert_eq!(home.settings().unwrap(), settings);
        let text = fs::read_to_string(home.dir().join("settings.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["ssh.agentForwardingEnabled"], true);
        assert_eq!(value["sim.idleStopSeconds"], 1);
        // No temporary file is left beside it.
        let leftovers: Vec<_> = fs::read_dir(home.dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn a_worker_never_recreates_the_lock_of_a_removed_home() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().join("home")).unwrap();
        drop(home.lock().unwrap());
        assert!(home.lock_if_present().unwrap().is_some());
        // The home's contents removed (as a test's cleanup does), the directory not yet.
        for entry in fs::read_dir(home.dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                fs::remove_dir_all(&path).unwrap();
            } else {
                fs::remove_file(&path).unwrap();
            }
        }
        assert!(home.lock_if_present().unwrap().is_none());
        assert_eq!(
            fs::read_dir(home.dir()).unwrap().count(),
            0,
            "nothing recreated"
        );
        fs::remove_dir(home.dir()).unwrap();
        assert!(home.lock_if_present().unwrap().is_none());
    }

    #[test]
    fn a_corrupt_file_is_an_error_not_a_default() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().to_path_buf()).unwrap();
        fs::write(home.dir().join("faults.json"), b"{not json").unwrap();
        assert!(home.stored_faults().is_err());
        fs::write(home.dir().join("faults.json"), br#"{"bogus": null}"#).unwrap();
        assert!(home.stored_faults().is_err());
        fs::write(home.dir().join("faults.json"), br#"{"slow-create": "2"}"#).unwrap();
        assert_eq!(
            home.stored_faults().unwrap().create_delay(),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn leases_of_dead_processes_are_dropped() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().to_path_buf()).unwrap();
        let lock = home.lock().unwrap();
        home.add_lease(&lock, "sb", std::process::id()).unwrap();
        // A pid far above any pid_max is never alive.
        home.add_lease(&lock, "sb", 999_999_999).unwrap();
        assert_eq!(
            home.live_leases(&lock, "sb").unwrap(),
            vec![std::process::id()]
        );
        home.end_lease(&lock, "sb", std::process::id()).unwrap();
        assert!(home.live_leases(&lock, "sb").unwrap().is_empty());
        assert!(home.last_activity("sb").unwrap().is_some());
        home.forget(&lock, "sb").unwrap();
        assert!(home.last_activity("sb").unwrap().is_none());
    }

    #[test]
    fn the_idle_lock_admits_one_holder() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("idle.lock");
        let first = FileLock::try_take(&path).unwrap();
        assert!(first.is_some());
        assert!(FileLock::try_take(&path).unwrap().is_none());
        drop(first);
        assert!(FileLock::try_take(&path).unwrap().is_some());
    }

    #[test]
    fn idle_remaining_counts_down_to_zero() {
        let idle = Duration::from_secs(30);
        assert_eq!(idle_remaining(1_000, idle, 1_000), idle);
        assert_eq!(idle_remaining(1_000, idle, 21_000), Duration::from_secs(10));
        assert_eq!(idle_remaining(1_000, idle, 99_000), Duration::ZERO);
    }
}
