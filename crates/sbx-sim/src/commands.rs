//! What each command does. Every command returns its exit status, or an error that `main`
//! prints as one `ERROR: …` line with exit 1.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::background::{
    create_worker, ensure_idle_watch, idle_watch, owner_of, result_path, sandbox_security_flags,
    spawn_detached, CreateRequest, CreateResult, SHELL_IMAGE,
};
use crate::cli::{
    Cli, Command, CreateArgs, DaemonAction, ExecArgs, FaultAction, McpAction, PolicyAction,
    PolicyCheck, PolicyRemove, PolicyRule, SecretAction, SettingsAction, SimAction,
};
use crate::docker::{Container, Docker, CALL_TIMEOUT};
use crate::error::{Result, SimError};
use crate::faults::{Fault, FaultSet};
use crate::state::{
    check_name, is_valid_name, random_hex, read_json_at, write_json_at, McpServer, StateHome,
    AGENT_FORWARDING_KEY,
};

/// What `version` prints.
pub fn version_line() -> String {
    format!(
        "sbx-sim {} (stand-in for sbx; emulates v0.45.1; isolation: container)",
        env!("CARGO_PKG_VERSION")
    )
}

/// The server the `mcp-server` fault adds.
const FAULT_MCP_NAME: &str = "sim-mcp";
const FAULT_MCP_URL: &str = "http://127.0.0.1:9/mcp";

/// How often the create foreground looks for its worker's result.
const RESULT_POLL: Duration = Duration::from_millis(100);

/// Runs one parsed command line.
///
/// # Errors
///
/// Any operational failure of the command.
pub async fn dispatch(cli: Cli, raw_args: &[OsString]) -> Result<i32> {
    if let Command::Version = cli.command {
        println!("{}", version_line());
        return Ok(0);
    }
    let home = StateHome::from_env()?;
    let docker = Docker::from_env();
    match cli.command {
        Command::Version => Ok(0),
        Command::Login { password_stdin, .. } => login(&home, password_stdin),
        Command::Sim { action } => sim(&home, &docker, action).await,
        gated => {
            let faults = home.faults()?;
            faults.gate()?;
            run_gated(&home, &docker, &faults, gated, raw_args).await
        }
    }
}

async fn run_gated(
    home: &StateHome,
    docker: &Docker,
    faults: &FaultSet,
    command: Command,
    raw_args: &[OsString],
) -> Result<i32> {
    match command {
        Command::Ls { json } => ls(home, docker, faults, json).await,
        Command::Create(args) => create(home, docker, faults, args).await,
        Command::Exec(args) => exec(home, docker, faults, args, raw_args).await,
        Command::Rm { force, all, names } => rm(home, docker, faults, force, all, names).await,
        Command::Settings { action } => settings(home, faults, action),
        Command::Mcp { action } => mcp(home, faults, action),
        Command::Daemon {
            action: DaemonAction::Restart,
        } => {
            let lock = home.lock()?;
            home.write_json(&lock, "daemon.json", &home.settings()?)?;
            println!("Daemon restarted");
            Ok(0)
        }
        Command::Logout => {
            let lock = home.lock()?;
            let mut stored = home.stored_faults()?;
            stored.insert(Fault::LoginLapsed);
            home.write_faults(&lock, &stored)?;
            println!("Logged out");
            Ok(0)
        }
        Command::Secret {
            action: SecretAction::Ls { .. },
        } => {
            print_json(&json!({"secrets": [], "env_only_count": 0, "custom_secrets": []}));
            Ok(0)
        }
        Command::Policy { action } => policy(home, action),
        Command::Version | Command::Login { .. } | Command::Sim { .. } => {
            Err(SimError::invalid("this command is not gated"))
        }
    }
}

fn print_json(value: &Value) {
    println!("{value}");
}

fn login(home: &StateHome, password_stdin: bool) -> Result<i32> {
    if password_stdin {
        // The password is read and discarded: nothing here checks credentials.
        let mut sink = Vec::new();
        std::io::stdin()
            .take(1024 * 1024)
            .read_to_end(&mut sink)
            .map_err(|e| SimError::state("stdin", e))?;
    }
    let lock = home.lock()?;
    let mut stored = home.stored_faults()?;
    stored.remove("login-lapsed");
    home.write_faults(&lock, &stored)?;
    println!("Login Succeeded");
    Ok(0)
}

/// One row of `ls`.
fn ls_row(home: &StateHome, container: &Container) -> Result<Value> {
    let name = container.label("sbx-sim.name");
    let id = container.label("sbx-sim.id");
    let record = home.record(name)?.filter(|r| r.id == id);
    let cpus = record.as_ref().map_or_else(
        || container.nano_cpus.div_ceil(1_000_000_000),
        |r| u64::from(r.cpus),
    );
    let memory = record
        .as_ref()
        .map_or_else(|| container.memory_bytes.to_string(), |r| r.memory.clone());
    Ok(json!({
        "name": name,
        "id": id,
        "status": if container.running { "running" } else { "stopped" },
        "agent": "shell",
        "template": container.label("sbx-sim.template"),
        "workspaces": [container.label("sbx-sim.workspace")],
        "cpus": cpus,
        "memory": memory,
        "created_at": container.label("sbx-sim.created"),
    }))
}

async fn ls(home: &StateHome, docker: &Docker, faults: &FaultSet, as_json: bool) -> Result<i32> {
    let mut rows = Vec::new();
    if !faults.has("lost-engine") {
        for container in docker.containers_of_home(home.digest()).await? {
            if is_valid_name(container.label("sbx-sim.name")) {
                rows.push(ls_row(home, &container)?);
            }
        }
    }
    rows.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    if as_json {
        if faults.has("ls-malformed") {
            print_json(&json!({"error": "sandboxd returned an unexpected listing"}));
        } else if faults.has("ls-shape") {
            print_json(&json!({ "sandboxes": rows }));
        } else {
            print_json(&Value::Array(rows));
        }
        return Ok(0);
    }
    println!(
        "{:<40} {:<8} {:<24} WORKSPACE",
        "NAME", "STATUS", "TEMPLATE"
    );
    for row in rows {
        println!(
            "{:<40} {:<8} {:<24} {}",
            row["name"].as_str().unwrap_or(""),
            row["status"].as_str().unwrap_or(""),
            row["template"].as_str().unwrap_or(""),
            row["workspaces"][0].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

/// A memory limit docker accepts: digits, optionally one unit letter.
pub fn is_valid_memory(memory: &str) -> bool {
    let digits = memory.trim_end_matches(['b', 'k', 'm', 'g', 'B', 'K', 'M', 'G']);
    memory.len() - digits.len() <= 1
        && !digits.is_empty()
        && !digits.starts_with('0')
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Checks the workspace argument: an existing absolute directory, no `:` or `,` (docker's
/// volume syntax would split on them).
///
/// # Errors
///
/// [`SimError::Invalid`] naming what is wrong.
pub fn check_workspace(path: &Path) -> Result<String> {
    let text = path
        .to_str()
        .ok_or_else(|| SimError::invalid(format!("workspace {} is not UTF-8", path.display())))?;
    if !path.is_absolute() {
        return Err(SimError::invalid(format!(
            "workspace {text} is not an absolute path"
        )));
    }
    if text.contains([':', ',']) {
        return Err(SimError::invalid(format!(
            "workspace {text} contains ':' or ','"
        )));
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(text.to_owned()),
        Ok(_) => Err(SimError::invalid(format!(
            "workspace {text} is not a directory"
        ))),
        Err(e) => Err(SimError::invalid(format!("workspace {text}: {e}"))),
    }
}

async fn create(
    home: &StateHome,
    docker: &Docker,
    faults: &FaultSet,
    args: CreateArgs,
) -> Result<i32> {
    if faults.has("lost-engine") {
        return Err(SimError::BackendUnavailable);
    }
    if args.agent != "shell" {
        return Err(SimError::invalid(format!(
            "unknown agent {:?}: the simulator only has shell",
            args.agent
        )));
    }
    check_name(&args.name)?;
    let workspace = check_workspace(&args.workspace)?;
    let cpus = args
        .cpus
        .parse::<u32>()
        .ok()
        .filter(|c| *c >= 1)
        .ok_or_else(|| {
            SimError::invalid(format!(
                "--cpus takes a whole number ≥ 1 (got {:?})",
                args.cpus
            ))
        })?;
    if !is_valid_memory(&args.memory) {
        return Err(SimError::invalid(format!(
            "--memory takes a size such as 2g or 512m (got {:?})",
            args.memory
        )));
    }
    let template = args.template.unwrap_or_else(|| "shell".to_owned());
    if template.is_empty() {
        return Err(SimError::invalid("--template is empty"));
    }
    let image = if template == "shell" {
        SHELL_IMAGE.to_owned()
    } else {
        template.clone()
    };
    if docker
        .inspect_one(&home.container_name(&args.name))
        .await?
        .is_some()
    {
        return Err(SimError::AlreadyExists { name: args.name });
    }
    if faults.has("hung-create") {
        // The create never happens and the client waits until it gives up.
        std::future::pending::<()>().await;
    }
    let host_cpus = std::thread::available_parallelism()
        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
    let request = CreateRequest {
        name: args.name.clone(),
        cpus,
        docker_cpus: cpus.min(host_cpus),
        memory: args.memory,
        template,
        image,
        workspace,
        network_none: args.deny_network.iter().any(|r| r == "**"),
        delay_millis: u64::try_from(faults.create_delay().as_millis()).unwrap_or(u64::MAX),
        agent_socket: faults.agent_socket().map(Into::into),
        client_pid: std::process::id(),
    };
    let request_id = random_hex(8)?;
    let workers = home.workers_dir();
    let request_path = workers.join(format!("create-{request_id}.request"));
    let log = workers.join(format!("create-{request_id}.log"));
    write_json_at(&request_path, &request)?;
    let mut worker = spawn_detached(
        &[
            "sim".as_ref(),
            "create-worker".as_ref(),
            request_path.as_os_str(),
        ],
        &log,
    )?;
    let result_file = result_path(&request_path);
    let result: CreateResult = loop {
        if let Some(result) = read_json_at(&result_file)? {
            break result;
        }
        let exited = worker.try_wait().map_err(|e| SimError::state(&log, e))?;
        if let Some(status) = exited {
            if let Some(result) = read_json_at(&result_file)? {
                break result;
            }
            return Err(SimError::invalid(format!(
                "the create worker ended ({status}) without a result; see {}",
                log.display()
            )));
        }
        tokio::time::sleep(RESULT_POLL).await;
    };
    // The result carries the failure, so the log is not kept either way.
    for done in [&request_path, &result_file, &log] {
        let _ = std::fs::remove_file(done);
    }
    match result.error {
        None => {
            println!("Created sandbox {}", args.name);
            Ok(0)
        }
        Some(message) => Err(SimError::Invalid { message }),
    }
}

/// The first empty argument among the sandbox name and the command, 0 being the name.
pub fn first_empty_argument(name: &str, command: &[OsString]) -> Option<usize> {
    std::iter::once(name.is_empty())
        .chain(command.iter().map(|a| a.is_empty()))
        .position(|empty| empty)
}

async fn exec(
    home: &StateHome,
    docker: &Docker,
    faults: &FaultSet,
    args: ExecArgs,
    raw_args: &[OsString],
) -> Result<i32> {
    if args.tty {
        return Err(SimError::invalid(
            "-t is not supported: the simulator never allocates a terminal",
        ));
    }
    if let Some(position) = first_empty_argument(&args.name, &args.command) {
        return Err(SimError::invalid(format!(
            "empty argument at position {position}"
        )));
    }
    for entry in &args.env {
        if entry.split_once('=').is_none_or(|(key, _)| key.is_empty()) {
            return Err(SimError::invalid(format!("-e takes K=V (got {entry:?})")));
        }
    }
    if args.user.as_deref() == Some("") || args.workdir.as_deref() == Some("") {
        return Err(SimError::invalid("-u and -w take a non-empty value"));
    }
    let joined = raw_args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    if faults.exec_hangs(&joined) {
        // A wedged exec: nothing runs and nothing returns.
        std::future::pending::<()>().await;
    }
    if !is_valid_name(&args.name) {
        return Err(SimError::NotFound { name: args.name });
    }
    // The lease comes first: from then on the idle watcher leaves the sandbox running, so the
    // state read next stays true until the command has run.
    let pid = std::process::id();
    {
        let lock = home.lock()?;
        home.add_lease(&lock, &args.name, pid)?;
    }
    let outcome = leased_exec(home, docker, &args).await;
    let lock = home.lock()?;
    if matches!(outcome, Err(SimError::NotFound { .. })) {
        // No such sandbox: drop the lease directory just made, and any stale record.
        home.forget(&lock, &args.name)?;
        return outcome;
    }
    home.end_lease(&lock, &args.name, pid)?;
    drop(lock);
    ensure_idle_watch(home, &args.name)?;
    outcome
}

/// The exec under its lease: find the sandbox, start it when stopped, relay the command.
async fn leased_exec(home: &StateHome, docker: &Docker, args: &ExecArgs) -> Result<i32> {
    let container = docker
        .inspect_one(&home.container_name(&args.name))
        .await?
        .ok_or_else(|| SimError::NotFound {
            name: args.name.clone(),
        })?;
    let workspace = container.label("sbx-sim.workspace").to_owned();
    let user = match args.user.as_deref() {
        Some("root") => "0:0".to_owned(),
        Some(user) => user.to_owned(),
        None => match home
            .record(&args.name)?
            .filter(|r| r.id == container.label("sbx-sim.id"))
        {
            Some(record) => record.exec_user,
            None => owner_of(Path::new(&workspace))?,
        },
    };
    let workdir = args.workdir.clone().unwrap_or(workspace);
    if !container.running {
        docker
            .checked("start", CALL_TIMEOUT, ["start", container.id.as_str()])
            .await?;
        // The watcher that stopped it has ended; a client killed mid-exec never reaches the
        // end, so the restarted sandbox gets its watcher now.
        ensure_idle_watch(home, &args.name)?;
    }
    relay_exec(docker, &container, &user, &workdir, args).await
}

/// Runs `docker exec` with this process's stdio (stdin only with `-i`), so the bytes pass
/// untouched and unbuffered; returns its status.
async fn relay_exec(
    docker: &Docker,
    container: &Container,
    user: &str,
    workdir: &str,
    args: &ExecArgs,
) -> Result<i32> {
    let mut argv: Vec<OsString> = vec!["exec".into()];
    if args.interactive {
        argv.push("-i".into());
    }
    argv.extend(["-u".into(), user.into(), "-w".into(), workdir.into()]);
    for entry in &args.env {
        argv.extend(["-e".into(), entry.into()]);
    }
    argv.push(container.id.clone().into());
    argv.extend(args.command.iter().cloned());
    let stdin = if args.interactive {
        std::process::Stdio::inherit()
    } else {
        std::process::Stdio::null()
    };
    // The one docker call not captured by the bounded runner: its output is the command's
    // own, relayed byte for byte, and its deadline is the client's.
    std::io::stdout()
        .flush()
        .map_err(|e| SimError::state("stdout", e))?;
    let status = tokio::process::Command::new(docker.program())
        .args(&argv)
        .env_clear()
        .envs(docker.env().iter().cloned())
        .stdin(stdin)
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .status()
        .await
        .map_err(|source| {
            SimError::runner(
                "exec",
                bounded_process::Error::Spawn {
                    program: docker.program().to_string_lossy().into_owned(),
                    source,
                },
            )
        })?;
    Ok(exit_code_of(status))
}

/// The status a shell would report: the exit code, or 128 + the signal.
fn exit_code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .unwrap_or(1)
}

async fn rm(
    home: &StateHome,
    docker: &Docker,
    faults: &FaultSet,
    force: bool,
    all: bool,
    names: Vec<String>,
) -> Result<i32> {
    if faults.has("lost-engine") {
        return Err(SimError::BackendUnavailable);
    }
    if all {
        return reset(home, docker).await;
    }
    for name in names {
        let found = if is_valid_name(&name) {
            docker.inspect_one(&home.container_name(&name)).await?
        } else {
            None
        };
        let Some(container) = found else {
            return Err(SimError::NotFound { name });
        };
        if container.running && !force {
            return Err(SimError::invalid(format!(
                "sandbox {name} is running; stop it first or use --force"
            )));
        }
        docker.remove(&container.id).await?;
        let lock = home.lock()?;
        home.forget(&lock, &name)?;
        println!("Removed sandbox {name}");
    }
    Ok(0)
}

/// Removes every container of this home and every record.
async fn reset(home: &StateHome, docker: &Docker) -> Result<i32> {
    let containers = docker.containers_of_home(home.digest()).await?;
    for container in &containers {
        docker.remove(&container.id).await?;
    }
    let lock = home.lock()?;
    let mut names = home.record_names()?;
    names.extend(
        containers
            .iter()
            .map(|c| c.label("sbx-sim.name").to_owned())
            .filter(|n| is_valid_name(n)),
    );
    names.sort();
    names.dedup();
    for name in &names {
        home.forget(&lock, name)?;
    }
    println!("Removed {} sandbox(es)", containers.len());
    Ok(0)
}

fn settings(home: &StateHome, faults: &FaultSet, action: SettingsAction) -> Result<i32> {
    match action {
        SettingsAction::Get { key } => {
            let value = home.settings()?.get(&key)?;
            if key == AGENT_FORWARDING_KEY && faults.has("agent-forwarding") {
                println!("true");
            } else {
                println!("{value}");
            }
        }
        SettingsAction::Set { key, value } => {
            let lock = home.lock()?;
            let mut settings = home.settings()?;
            settings.set(&key, &value)?;
            home.write_json(&lock, "settings.json", &settings)?;
        }
    }
    Ok(0)
}

fn mcp(home: &StateHome, faults: &FaultSet, action: McpAction) -> Result<i32> {
    match action {
        McpAction::Ls { json: as_json } => {
            let mut servers = home.mcp_servers()?;
            if faults.has("mcp-server") {
                servers.push(McpServer {
                    name: FAULT_MCP_NAME.to_owned(),
                    url: FAULT_MCP_URL.to_owned(),
                });
            }
            if as_json {
                let list = serde_json::to_value(&servers)
                    .map_err(|e| SimError::invalid(format!("mcp list: {e}")))?;
                if faults.has("mcp-shape") {
                    print_json(&json!({ "servers": list }));
                } else {
                    print_json(&list);
                }
            } else {
                println!("{:<24} URL", "NAME");
                for server in servers {
                    println!("{:<24} {}", server.name, server.url);
                }
            }
        }
        McpAction::Add { name, url } => {
            let lock = home.lock()?;
            let mut servers = home.mcp_servers()?;
            servers.retain(|s| s.name != name);
            servers.push(McpServer { name, url });
            home.write_json(&lock, "mcp.json", &servers)?;
        }
        McpAction::Rm { name } => {
            let lock = home.lock()?;
            let mut servers = home.mcp_servers()?;
            let before = servers.len();
            servers.retain(|s| s.name != name);
            if servers.len() == before {
                return Err(SimError::invalid(format!("MCP server {name} not found")));
            }
            home.write_json(&lock, "mcp.json", &servers)?;
        }
    }
    Ok(0)
}

fn policy(home: &StateHome, action: PolicyAction) -> Result<i32> {
    match action {
        PolicyAction::Ls { .. } => {
            print_json(&json!({ "rules": [] }));
            Ok(0)
        }
        PolicyAction::Check {
            kind: PolicyCheck::Network { .. },
        } => {
            print_json(&json!({"allowed": false, "governance": {"active": false}}));
            Ok(1)
        }
        PolicyAction::Allow {
            kind: PolicyRule::Network(rule),
        } => record_policy(home, "allow", &rule),
        PolicyAction::Deny {
            kind: PolicyRule::Network(rule),
        } => record_policy(home, "deny", &rule),
        PolicyAction::Rm {
            kind: PolicyRemove::Network { .. },
        } => Err(SimError::invalid(
            "cannot enforce network allow rules, so none can be removed",
        )),
    }
}

fn record_policy(
    home: &StateHome,
    decision: &str,
    rule: &crate::cli::PolicyNetworkArgs,
) -> Result<i32> {
    let lock = home.lock()?;
    let mut recorded: Vec<Value> = home.read_json("policy.json")?.unwrap_or_default();
    recorded.push(json!({"decision": decision, "rule": rule}));
    home.write_json(&lock, "policy.json", &recorded)?;
    Ok(0)
}

async fn sim(home: &StateHome, docker: &Docker, action: SimAction) -> Result<i32> {
    match action {
        SimAction::Fault { action } => {
            match action {
                FaultAction::Set { spec } => {
                    let fault = Fault::parse(&spec)?;
                    let lock = home.lock()?;
                    let mut stored = home.stored_faults()?;
                    stored.insert(fault);
                    home.write_faults(&lock, &stored)?;
                }
                FaultAction::Clear { name } => {
                    let lock = home.lock()?;
                    let mut stored = home.stored_faults()?;
                    match name {
                        Some(name) => {
                            stored.remove(&name);
                        }
                        None => stored.clear(),
                    }
                    home.write_faults(&lock, &stored)?;
                }
                FaultAction::Ls => {
                    for fault in home.faults()?.iter() {
                        match fault.value() {
                            Some(value) => println!("{}={value}", fault.name()),
                            None => println!("{}", fault.name()),
                        }
                    }
                }
            }
            Ok(0)
        }
        SimAction::Reset => reset(home, docker).await,
        SimAction::Doctor => doctor(home, docker).await,
        SimAction::CreateWorker { request } => {
            create_worker(home, docker, &request).await?;
            Ok(0)
        }
        SimAction::IdleWatch { name } => {
            check_name(&name)?;
            idle_watch(home, docker, &name).await?;
            Ok(0)
        }
    }
}

/// Checks docker answers, the template image is present, and user namespaces work in a
/// container configured like a sandbox (as root, the case that needs `CAP_SETFCAP`).
async fn doctor(home: &StateHome, docker: &Docker) -> Result<i32> {
    let mut failed = Vec::new();
    let mut report = |what: &str, result: Result<String>| match result {
        Ok(detail) => println!("ok   {what}: {detail}"),
        Err(e) => {
            println!("FAIL {what}: {e}");
            failed.push(what.to_owned());
        }
    };
    report(
        "state directory",
        Ok(format!("{} (home {})", home.dir().display(), home.digest())),
    );
    let server = docker
        .checked(
            "version",
            CALL_TIMEOUT,
            ["version", "--format", "{{.Server.Version}}"],
        )
        .await
        .map(|out| format!("engine {}", String::from_utf8_lossy(&out).trim()));
    report("docker", server);
    let image = docker
        .checked(
            "image inspect",
            CALL_TIMEOUT,
            ["image", "inspect", "--format", "{{.Id}}", SHELL_IMAGE],
        )
        .await
        .map(|out| format!("{SHELL_IMAGE} {}", String::from_utf8_lossy(&out).trim()));
    report("template image", image);
    let probe_name = format!("sbx-sim-{}-doctor-{}", home.digest(), random_hex(4)?);
    let profile = crate::background::guest_seccomp_path(home);
    crate::state::write_json_at(&profile, &crate::background::guest_seccomp_profile())?;
    let argv: Vec<String> = [
        "run",
        "--rm",
        "--pull=never",
        "--name",
        &probe_name,
        "--label",
        &format!("sbx-sim.home={}", home.digest()),
        "--network",
        "none",
        "--user",
        "0:0",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(sandbox_security_flags(home))
    .chain(
        [
            "--entrypoint",
            "sh",
            SHELL_IMAGE,
            "-c",
            "unshare --user --mount --map-root-user true",
        ]
        .map(str::to_owned),
    )
    .collect();
    let userns = docker
        .checked("run", CALL_TIMEOUT, argv)
        .await
        .map(|_| "unshare --user --mount --map-root-user works as uid 0".to_owned());
    report("user namespaces", userns);
    if failed.is_empty() {
        Ok(0)
    } else {
        Err(SimError::invalid(format!(
            "sim doctor: failed: {}",
            failed.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_says_what_it_is() {
        let line = version_line();
        assert!(line.starts_with("sbx-sim "), "{line}");
        assert!(line.ends_with("(stand-in for sbx; emulates v0.45.1; isolation: container)"));
    }

    #[test]
    fn an_ls_row_has_the_listing_shape() {
        let temp = tempfile::tempdir().unwrap();
        let home = StateHome::open(temp.path().to_path_buf()).unwrap();
        let labels = json!({
            "sbx-sim.home": home.digest(),
            "sbx-sim.name": "sb",
            "sbx-sim.id": "0123456789abcdef0123456789abcdef",
            "sbx-sim.workspace": "/w/ws-0123456789ab",
            "sbx-sim.template": "shell",
            "sbx-sim.created": "2026-11-30T16:52:39Z",
        });
        let container = Container {
            id: "c0ffee".into(),
            running: false,
            labels: labels.as_object().unwrap().clone(),
            nano_cpus: 1_500_000_000,
            memory_bytes: 536_870_912,
        };
        // Without a record, the limits come from the engine.
        let row = ls_row(&home, &container).unwrap();
        insta::assert_snapshot!(
            "ls_row_from_engine",
            serde_json::to_string_pretty(&row).unwrap()
        );
        let lock = home.lock().unwrap();
        let record = crate::state::SandboxRecord {
            id: "0123456789abcdef0123456789abcdef".into(),
            exec_user: "1000:1000".into(),
            template: "shell".into(),
            created: "2026-11-30T16:52:39Z".into(),
            cpus: 2,
            memory: "2g".into(),
        };
        home.write_json(&lock, "sandboxes/sb.json", &record)
            .unwrap();
        let row = ls_row(
            &home,
            &Container {
                running: true,
                ..container
            },
        )
        .unwrap();
        insta::assert_snapshot!(
            "ls_row_with_record",
            serde_json::to_string_pretty(&row).unwrap()
        );
    }

    #[test]
    fn memory_sizes_are_checked() {
        for good in ["2g", "512m", "2G", "1073741824", "64k", "100b"] {
            assert!(is_valid_memory(good), "{good}");
        }
        for bad in ["", "g", "0g", "2gb", "2 g", "-1g", "1.5g", "2t"] {
            assert!(!is_valid_memory(bad), "{bad}");
        }
    }

    #[test]
    fn workspaces_must_be_existing_absolute_plain_directories() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("ws");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(check_workspace(&dir).unwrap(), dir.to_str().unwrap());
        let file = temp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        for (path, reason) in [
            (Path::new("relative/ws").to_path_buf(), "absolute"),
            (temp.path().join("missing"), "missing"),
            (file, "not a directory"),
            (temp.path().join("a:b"), "':' or ','"),
            (temp.path().join("a,b"), "':' or ','"),
        ] {
            let err = check_workspace(&path).unwrap_err().to_string();
            assert!(err.contains(reason), "{}: {err}", path.display());
        }
    }

    #[test]
    fn the_first_empty_argument_is_found_by_position() {
        let cmd = |args: &[&str]| args.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(first_empty_argument("sb", &cmd(&["sh", "-c", "x"])), None);
        assert_eq!(first_empty_argument("", &cmd(&["sh"])), Some(0));
        assert_eq!(first_empty_argument("sb", &cmd(&["sh", "-c", ""])), Some(3));
        assert_eq!(first_empty_argument("sb", &cmd(&["", ""])), Some(1));
    }
}
