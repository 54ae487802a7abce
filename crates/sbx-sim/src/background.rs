//! The detached processes: the create worker and the idle watcher. Each runs as `sbx-sim sim
//! …` in a process group of its own with stdio on a log file, so a client that kills the
//! foreground (or its whole process group) does not stop it, and it holds none of the client's
//! pipes open.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::docker::{failure_detail, Docker, CALL_TIMEOUT, CREATE_TIMEOUT};
use crate::error::{Result, SimError};
use crate::faults::SocketKind;
use crate::state::{
    idle_remaining, now_millis, process_lives, random_hex, read_json_at, rfc3339, write_json_at,
    FileLock, SandboxRecord, StateHome,
};

/// What the foreground of `create` hands its worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateRequest {
    /// The sandbox name.
    pub name: String,
    /// CPUs asked for.
    pub cpus: u32,
    /// CPUs passed to docker (clamped to the host's count).
    pub docker_cpus: u32,
    /// The memory limit as given.
    pub memory: String,
    /// The template as given.
    pub template: String,
    /// The image it maps to.
    pub image: String,
    /// The absolute workspace directory.
    pub workspace: String,
    /// `--deny-network **` was given: no network at all.
    pub network_none: bool,
    /// The `slow-create` delay in milliseconds.
    pub delay_millis: u64,
    /// What to leave at `/run/ssh-agent.sock`, if anything.
    pub agent_socket: Option<AgentSocket>,
    /// The foreground's pid: when it is gone, nobody reads the result.
    pub client_pid: u32,
}

/// The stored form of [`SocketKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentSocket {
    /// An empty 0666 file.
    File,
    /// A dangling link.
    Link,
}

impl From<SocketKind> for AgentSocket {
    fn from(kind: SocketKind) -> Self {
        match kind {
            SocketKind::File => AgentSocket::File,
            SocketKind::Link => AgentSocket::Link,
        }
    }
}

/// What the worker leaves for the foreground.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateResult {
    /// The error line's message, when the create failed.
    pub error: Option<String>,
}

/// The command every sandbox container runs: nothing but a keep-alive loop.
pub const KEEP_ALIVE: &str = "while :; do sleep 3600; done";

/// The image of the default `shell` template.
pub const SHELL_IMAGE: &str = "sbx-sim-shell:local";

/// Checks a template has both shells (sbx's kit starts through `/bin/sh` and `/bin/bash`).
const KIT_CHECK: &str = "test -x /bin/sh && test -x /bin/bash";

/// Proves user namespaces work for the exec user when `unshare` exists (every call of the exec
/// wrapper's sbx shape starts with `unshare --user --mount`).
const USERNS_CHECK: &str =
    "command -v unshare >/dev/null 2>&1 || exit 0; unshare --user --mount --map-root-user true";

/// Where a home keeps the guest's seccomp profile (the docker CLI reads it from a file).
pub fn guest_seccomp_path(home: &StateHome) -> PathBuf {
    home.dir().join("guest-seccomp-v1.json")
}

/// The guest's seccomp profile: everything allowed (the exec wrapper needs `unshare` and `mount`,
/// which Docker's default profile refuses without `CAP_SYS_ADMIN`) except giving a file the
/// set-uid or set-gid bit: `chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `creat`, `mknod`,
/// `mknodat`, and `open`/`openat` creating a file (`O_CREAT`, `O_TMPFILE`) with such a mode fail
/// with `EPERM`; `openat2`, whose mode the filter cannot read, is `ENOSYS` (callers fall back
/// to `openat`), and io_uring, which would open files past the filter, is `EPERM`. So a guest
/// that is root (a root-owned workspace) still leaves no set-uid or set-gid file in the host's
/// workspace.
pub fn guest_seccomp_profile() -> serde_json::Value {
    const S_ISUID: u64 = 0o4000;
    const S_ISGID: u64 = 0o2000;
    const O_CREAT: u64 = 0o100;
    const O_TMPFILE: u64 = 0o20000000;
    const EPERM: u64 = 1;
    const ENOSYS: u64 = 38;
    let bit = |index: u32, value: u64| serde_json::json!({"index": index, "value": value, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"});
    let deny = |names: &[&str], args: Vec<serde_json::Value>, errno: u64| serde_json::json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno, "args": args});
    let mut rules = Vec::new();
    for mode in [S_ISUID, S_ISGID] {
        rules.push(deny(
            &["chmod", "fchmod", "creat", "mknod"],
            vec![bit(1, mode)],
            EPERM,
        ));
        rules.push(deny(
            &["fchmodat", "fchmodat2", "mknodat"],
            vec![bit(2, mode)],
            EPERM,
        ));
        for flag in [O_CREAT, O_TMPFILE] {
            rules.push(deny(&["open"], vec![bit(1, flag), bit(2, mode)], EPERM));
            rules.push(deny(&["openat"], vec![bit(2, flag), bit(3, mode)], EPERM));
        }
    }
    rules.push(deny(&["openat2"], Vec::new(), ENOSYS));
    rules.push(deny(
        &["io_uring_setup", "io_uring_enter", "io_uring_register"],
        Vec::new(),
        EPERM,
    ));
    serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules})
}

/// The confinement flags of every sandbox container, and of the doctor's probe that must be
/// configured like one: every capability dropped but `CAP_SETFCAP` (a root guest maps itself into
/// a user namespace, which needs it); `no-new-privileges`, so no set-uid binary (sudo in the shell
/// template) lifts the guest to root, while user namespaces and bind mounts need no new
/// privileges; AppArmor unconfined (its default refuses `unshare --user --mount`); and the guest's
/// seccomp profile at [`guest_seccomp_path`] ([`guest_seccomp_profile`]: `unshare` and `mount`
/// allowed, set-uid and set-gid bits kept off its files). This is why the simulator is not
/// isolation.
pub fn sandbox_security_flags(home: &StateHome) -> Vec<String> {
    [
        "--cap-drop",
        "ALL",
        "--cap-add",
        "SETFCAP",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain([format!("seccomp={}", guest_seccomp_path(home).display())])
    .collect()
}

/// The `docker run` argv of a sandbox container whose commands run as `exec_user` (`uid:gid`,
/// the workspace's owner). The container's own user is the same: under `no-new-privileges` an
/// exec gains no capability its container's user lacks, and a root guest needs `CAP_SETFCAP`
/// to map itself into a user namespace.
pub fn run_argv(
    home: &StateHome,
    request: &CreateRequest,
    id: &str,
    created: &str,
    exec_user: &str,
) -> Vec<String> {
    let name = &request.name;
    let mut argv: Vec<String> = [
        "run",
        "-d",
        "--pull=never",
        "--init",
        "--name",
        &home.container_name(name),
        "--hostname",
        name,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for (key, value) in [
        ("sbx-sim.home", home.digest()),
        ("sbx-sim.name", name.as_str()),
        ("sbx-sim.id", id),
        ("sbx-sim.workspace", request.workspace.as_str()),
        ("sbx-sim.template", request.template.as_str()),
        ("sbx-sim.created", created),
    ] {
        argv.push("--label".to_owned());
        argv.push(format!("{key}={value}"));
    }
    argv.extend(["--user".to_owned(), exec_user.to_owned()]);
    argv.extend(
        [
            "--cpus",
            &request.docker_cpus.to_string(),
            "--memory",
            &request.memory,
            "--pids-limit",
            "4096",
        ]
        .iter()
        .map(|s| (*s).to_owned()),
    );
    argv.extend(sandbox_security_flags(home));
    if request.network_none {
        argv.extend(["--network".to_owned(), "none".to_owned()]);
    }
    argv.extend([
        "-v".to_owned(),
        format!("{0}:{0}", request.workspace),
        "-w".to_owned(),
        request.workspace.clone(),
        "--entrypoint".to_owned(),
        "sh".to_owned(),
        request.image.clone(),
        "-c".to_owned(),
        KEEP_ALIVE.to_owned(),
    ]);
    argv
}

/// Starts `sbx-sim <args>` detached: its own process group, stdin `/dev/null`, stdout and
/// stderr appended to `log`.
///
/// # Errors
///
/// The log cannot be opened or the process cannot start.
pub fn spawn_detached(args: &[&std::ffi::OsStr], log: &Path) -> Result<Child> {
    let exe = std::env::current_exe().map_err(|e| SimError::state("/proc/self/exe", e))?;
    let open_log = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| SimError::state(log, e))
    };
    Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(open_log()?)
        .stderr(open_log()?)
        .process_group(0)
        .spawn()
        .map_err(|e| SimError::state(exe, e))
}

/// Makes sure an idle watcher runs for `name` (a second one exits at once).
///
/// # Errors
///
/// The watcher cannot be started.
pub fn ensure_idle_watch(home: &StateHome, name: &str) -> Result<()> {
    let log = home.workers_dir().join(format!("idle-{name}.log"));
    // The child is not waited for: it outlives this process by design, and is reaped by
    // whichever process inherits it.
    spawn_detached(
        &["sim".as_ref(), "idle-watch".as_ref(), name.as_ref()],
        &log,
    )?;
    Ok(())
}

/// The `<uid>:<gid>` owning a directory.
///
/// # Errors
///
/// The directory cannot be read.
pub fn owner_of(dir: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(dir).map_err(|e| SimError::state(dir, e))?;
    Ok(format!("{}:{}", meta.uid(), meta.gid()))
}

/// Runs a create request to its end and leaves the result beside it.
///
/// # Errors
///
/// The request cannot be read or the result cannot be written; the create's own failure is
/// the result, not an error.
pub async fn create_worker(home: &StateHome, docker: &Docker, request_path: &Path) -> Result<()> {
    let request: CreateRequest = read_json_at(request_path)?.ok_or_else(|| {
        SimError::invalid(format!("no create request at {}", request_path.display()))
    })?;
    let outcome = run_create(home, docker, &request).await;
    if let Err(e) = &outcome {
        eprintln!("create {}: {e}", request.name);
    }
    let result = CreateResult {
        error: outcome.as_ref().err().map(ToString::to_string),
    };
    let result_file = result_path(request_path);
    write_json_at(&result_file, &result)?;
    if !process_lives(request.client_pid) {
        // The client was killed before the end (the create still happened, as with sbx):
        // nobody will read or remove these.
        let _ = std::fs::remove_file(&result_file);
        let _ = std::fs::remove_file(request_path);
    }
    if outcome.is_ok() {
        ensure_idle_watch(home, &request.name)?;
    }
    Ok(())
}

/// Where the result of a request is written.
pub fn result_path(request_path: &Path) -> PathBuf {
    request_path.with_extension("result")
}

async fn run_create(home: &StateHome, docker: &Docker, request: &CreateRequest) -> Result<()> {
    tokio::time::sleep(Duration::from_millis(request.delay_millis)).await;
    let id = random_hex(16)?;
    let created = rfc3339(std::time::SystemTime::now());
    let exec_user = owner_of(Path::new(&request.workspace))?;
    crate::state::write_json_at(&guest_seccomp_path(home), &guest_seccomp_profile())?;
    let out = docker
        .call(
            "run",
            CREATE_TIMEOUT,
            run_argv(home, request, &id, &created, &exec_user),
        )
        .await?;
    if out.status != bounded_process::ExitKind::Exited(0) {
        let detail = failure_detail(&out);
        let lower = detail.to_ascii_lowercase();
        if lower.contains("is already in use") {
            // The engine's atomic name settled a race: the other create won.
            return Err(SimError::AlreadyExists {
                name: request.name.clone(),
            });
        }
        // `docker run` may leave a created container behind; remove it only if it is ours.
        remove_if_ours(home, docker, &request.name, &id).await;
        if lower.contains("executable file not found")
            || lower.contains("no such file or directory")
        {
            return Err(SimError::TemplateCannotStart);
        }
        return Err(SimError::docker("run", detail));
    }
    let container = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if let Err(e) = prepare(home, docker, request, &container, &exec_user).await {
        let _ = docker.remove(&container).await;
        return Err(e);
    }
    let record = SandboxRecord {
        id,
        exec_user,
        template: request.template.clone(),
        created,
        cpus: request.cpus,
        memory: request.memory.clone(),
    };
    let lock = home.lock_if_present()?.ok_or_else(|| {
        SimError::state(
            home.dir().join("lock"),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })?;
    home.write_json(&lock, &format!("sandboxes/{}.json", request.name), &record)?;
    home.touch_activity(&lock, &request.name)?;
    Ok(())
}

/// The checks and setup after `docker run`: both shells, user namespaces, the agent socket.
async fn prepare(
    home: &StateHome,
    docker: &Docker,
    request: &CreateRequest,
    container: &str,
    exec_user: &str,
) -> Result<()> {
    let kit = docker
        .call(
            "exec",
            CALL_TIMEOUT,
            ["exec", "-u", "0:0", container, "/bin/sh", "-c", KIT_CHECK],
        )
        .await?;
    if kit.status != bounded_process::ExitKind::Exited(0) {
        return Err(SimError::TemplateCannotStart);
    }
    let userns = docker
        .call(
            "exec",
            CALL_TIMEOUT,
            ["exec", "-u", exec_user, container, "sh", "-c", USERNS_CHECK],
        )
        .await?;
    if userns.status != bounded_process::ExitKind::Exited(0) {
        return Err(SimError::NoUserNamespaces {
            detail: failure_detail(&userns),
        });
    }
    let daemon_forwards = home.daemon_settings()?.agent_forwarding;
    let socket = match (request.agent_socket, daemon_forwards) {
        (Some(kind), _) => Some(kind),
        (None, true) => Some(AgentSocket::File),
        (None, false) => None,
    };
    if let Some(kind) = socket {
        let script = agent_socket_script(kind);
        docker
            .checked(
                "exec",
                CALL_TIMEOUT,
                ["exec", "-u", "0:0", container, "sh", "-c", script],
            )
            .await?;
    }
    Ok(())
}

/// The root script leaving what a daemon that forwards the SSH agent leaves at
/// `/run/ssh-agent.sock`: an empty 0666 file, or a link to nothing.
fn agent_socket_script(kind: AgentSocket) -> &'static str {
    match kind {
        AgentSocket::File => {
            "mkdir -p /run && rm -f /run/ssh-agent.sock && : > /run/ssh-agent.sock && chmod 0666 /run/ssh-agent.sock"
        }
        AgentSocket::Link => {
            "mkdir -p /run && rm -f /run/ssh-agent.sock && ln -s /run/sbx-sim-agent/missing.sock /run/ssh-agent.sock"
        }
    }
}

async fn remove_if_ours(home: &StateHome, docker: &Docker, name: &str, id: &str) {
    if let Ok(Some(found)) = docker.inspect_one(&home.container_name(name)).await {
        if found.label("sbx-sim.id") == id {
            let _ = docker.remove(&found.id).await;
        }
    }
}

/// How often an idle watcher looks again while it waits.
const WATCH_POLL: Duration = Duration::from_secs(1);

/// Stops the sandbox `name` once it has been idle for `sim.idleStopSeconds` with no live
/// exec lease; exits once it has stopped it, or when the sandbox's record is gone (removed,
/// reset, or the state directory deleted) or idle stop is off. One watcher per name: a second
/// one returns at once.
///
/// # Errors
///
/// The state directory or docker failed.
pub async fn idle_watch(home: &StateHome, docker: &Docker, name: &str) -> Result<()> {
    let lock_path = home.workers_dir().join(format!("idle-{name}.lock"));
    let Some(watcher_lock) = FileLock::try_take(&lock_path)? else {
        return Ok(());
    };
    let started = now_millis();
    let container_name = home.container_name(name);
    let mut state_lock;
    loop {
        // Every decision is taken under the state lock, where exec adds and ends its leases
        // and create writes its record.
        // A removed home ends the watch: there is nothing left to stop.
        let Some(taken) = home.lock_if_present()? else {
            return Ok(());
        };
        state_lock = taken;
        let idle_seconds = home.settings()?.idle_stop_seconds;
        if idle_seconds == 0 || !home.has_record(name) {
            break;
        }
        let idle = Duration::from_secs(idle_seconds);
        let last = home.last_activity(name)?.unwrap_or(started);
        let wait = idle_remaining(last, idle, now_millis());
        let busy = wait.is_zero() && !home.live_leases(&state_lock, name)?.is_empty();
        if !wait.is_zero() || busy {
            drop(state_lock);
            tokio::time::sleep(if busy { idle } else { wait }.min(WATCH_POLL)).await;
            continue;
        }
        if let Some(container) = docker.inspect_one(&container_name).await? {
            if container.running {
                let out = docker
                    .call("kill", CALL_TIMEOUT, ["kill", container.id.as_str()])
                    .await?;
                if out.status != bounded_process::ExitKind::Exited(0) {
                    eprintln!("idle stop of {name}: {}", failure_detail(&out));
                }
            }
        }
        break;
    }
    // The watcher's own lock goes before the state lock: an exec or a create that needs a new
    // watcher takes the state lock first, so the watcher it starts always finds this one gone.
    drop(watcher_lock);
    drop(state_lock);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_mapping_is_exact() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().to_path_buf()).unwrap();
        let request = CreateRequest {
            name: "sb".into(),
            cpus: 64,
            docker_cpus: 2,
            memory: "2g".into(),
            template: "shell".into(),
            image: SHELL_IMAGE.into(),
            workspace: "/w/ws-1".into(),
            network_none: true,
            delay_millis: 0,
            agent_socket: None,
            client_pid: 1,
        };
        let argv = run_argv(&home, &request, "ID", "T", "1000:1000");
        let d = home.digest();
        let expected = format!(
            "run -d --pull=never --init --name sbx-sim-{d}-sb --hostname sb \
             --label sbx-sim.home={d} --label sbx-sim.name=sb --label sbx-sim.id=ID \
             --label sbx-sim.workspace=/w/ws-1 --label sbx-sim.template=shell \
             --label sbx-sim.created=T --user 1000:1000 --cpus 2 --memory 2g --pids-limit 4096 --cap-drop ALL \
             --cap-add SETFCAP --security-opt no-new-privileges --security-opt apparmor=unconfined \
             --security-opt seccomp={} \
             --network none -v /w/ws-1:/w/ws-1 -w /w/ws-1 --entrypoint sh sbx-sim-shell:local -c",
            guest_seccomp_path(&home).display()
        );
        assert_eq!(argv[..argv.len() - 1].join(" "), expected);
        assert_eq!(argv.last().unwrap(), KEEP_ALIVE);
        let open = CreateRequest {
            network_none: false,
            ..request
        };
        assert!(!run_argv(&home, &open, "ID", "T", "0:0").contains(&"--network".to_owned()));
    }

    #[test]
    fn the_guest_scripts_are_pinned() {
        insta::assert_snapshot!(
            "guest_scripts",
            [
                ("keep-alive", KEEP_ALIVE),
                ("kit check", KIT_CHECK),
                ("user namespace check", USERNS_CHECK),
                ("agent socket file", agent_socket_script(AgentSocket::File)),
                ("agent socket link", agent_socket_script(AgentSocket::Link)),
            ]
            .iter()
            .map(|(what, script)| format!("{what}:\n  {script}"))
            .collect::<Vec<_>>()
            .join("\n")
        );
    }

    #[tokio::test]
    async fn a_watcher_ends_without_a_record_and_a_second_one_at_once() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().to_path_buf()).unwrap();
        // The command that starts a watcher has made the lock file.
        drop(home.lock().unwrap());
        // A docker that cannot run: a watcher with nothing to stop never calls it.
        let docker = Docker::with_program("/nonexistent/docker");
        let watch = |name: &'static str| {
            let (home, docker) = (home.clone(), docker.clone());
            async move {
                tokio::time::timeout(Duration::from_secs(5), idle_watch(&home, &docker, name))
                    .await
                    .expect("the watcher did not end")
            }
        };
        watch("gone").await.unwrap();
        // Its lock was released on the way out.
        let lock_path = home.workers_dir().join("idle-gone.lock");
        let held = FileLock::try_take(&lock_path)
            .unwrap()
            .expect("lock released");
        // With a record, and another watcher holding the lock, it returns at once.
        let lock = home.lock().unwrap();
        home.write_json(&lock, "sandboxes/gone.json", &"record")
            .unwrap();
        drop(lock);
        watch("gone").await.unwrap();
        drop(held);
    }

    #[tokio::test]
    async fn a_watcher_whose_home_is_removed_ends_and_puts_nothing_back() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().join("home")).unwrap();
        let lock = home.lock().unwrap();
        home.write_json(&lock, "sandboxes/w.json", &"record")
            .unwrap();
        drop(lock);
        let docker = Docker::with_program("/nonexistent/docker");
        // Idle for 30 s by default: it polls, taking the state lock each second.
        let watcher = tokio::spawn({
            let home = home.clone();
            async move { idle_watch(&home, &docker, "w").await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A test's cleanup: the contents first, the directory last.
        for entry in std::fs::read_dir(home.dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        tokio::time::timeout(Duration::from_secs(5), watcher)
            .await
            .expect("the watcher did not end")
            .unwrap()
            .unwrap();
        let left: Vec<_> = std::fs::read_dir(home.dir()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir(home.dir()).unwrap();
    }

    #[test]
    fn requests_round_trip_through_their_file() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("r.request");
        let request = CreateRequest {
            name: "sb".into(),
            cpus: 1,
            docker_cpus: 1,
            memory: "512m".into(),
            template: "img:tag".into(),
            image: "img:tag".into(),
            workspace: "/w".into(),
            network_none: false,
            delay_millis: 1500,
            agent_socket: Some(AgentSocket::Link),
            client_pid: 42,
        };
        write_json_at(&path, &request).unwrap();
        assert_eq!(read_json_at::<CreateRequest>(&path).unwrap(), Some(request));
        assert_eq!(result_path(&path), temp.path().join("r.result"));
    }
}
