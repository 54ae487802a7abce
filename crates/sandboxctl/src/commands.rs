//! One function per command. Each returns its exit code; nothing else in the binary picks integers.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    Command, DisposeSelector, ExecRequest, Router, RouterConfig, Sandbox, SandboxBackend,
    SandboxError, SandboxKey, SandboxSpec,
};
use serde_json::{json, Value};

use crate::cli::{Cli, CommandLine, GlobalArgs, ImagesAction, RunTarget};
use crate::keys::{generated_key, KeyArgs};
use crate::{backends, exit_codes, guest_env, report};

/// Runs the parsed command line.
pub async fn dispatch(cli: Cli) -> u8 {
    let global = cli.global;
    let runs = cli.command.runs_a_command();
    let result = match cli.command {
        CommandLine::Run {
            image,
            key,
            target,
            keep,
            argv,
        } => return run(&global, image, &key, &target, keep, argv).await,
        CommandLine::Exec { key, target, argv } => return exec(&global, &key, &target, argv).await,
        CommandLine::Images { action } => images(&global, action).await,
        CommandLine::Doctor { egress_probe } => {
            return crate::backends::doctor(&global, &egress_probe).await
        }
        other => other_command(&global, other).await,
    };
    debug_assert!(!runs);
    match result {
        Ok((value, text)) => {
            if global.json {
                report::print_json(&value);
            } else if !text.is_empty() {
                print!("{text}");
                let _ = std::io::stdout().flush();
            }
            0
        }
        Err(failure) => failure.report(&global),
    }
}

/// A failed command other than `run`/`exec`.
pub struct Failure {
    error: SandboxError,
    code: u8,
    extra: Option<Value>,
}

impl Failure {
    fn report(self, global: &GlobalArgs) -> u8 {
        if global.json {
            let mut v = json!({ "error": report::error_json(&self.error) });
            if let Some(Value::Object(extra)) = self.extra {
                for (k, val) in extra {
                    v[k] = val;
                }
            }
            report::print_json(&v);
        } else {
            eprintln!("sandboxctl: {}", one_line(&self.error.to_string()));
        }
        self.code
    }
}

impl From<crate::keys::KeyError> for Failure {
    fn from(error: crate::keys::KeyError) -> Self {
        // Both key forms at once is a usage error (2); a malformed key is an invalid argument (64).
        let code = match error {
            crate::keys::KeyError::BothForms => exit_codes::USAGE,
            crate::keys::KeyError::Invalid(_) => exit_codes::INVALID_ARGUMENT,
        };
        Failure {
            error: error.into(),
            code,
            extra: None,
        }
    }
}

impl From<SandboxError> for Failure {
    fn from(error: SandboxError) -> Self {
        let code = exit_codes::for_kind(error.kind());
        Failure {
            error,
            code,
            extra: None,
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

type Done = Result<(Value, String), Failure>;

/// The floor gates commands that run code or move files: the router refuses a backend below it.
fn gate(global: &GlobalArgs, backend: &Arc<dyn SandboxBackend>) -> Result<(), SandboxError> {
    let config = RouterConfig::default().min_isolation(global.min_isolation);
    Router::new(vec![backend.clone()], config)
        .map(|_| ())
        .map_err(|e| match e {
            SandboxError::NotPermitted(msg) if global.min_isolation > backend.isolation() => {
                SandboxError::NotPermitted(format!(
                    "{msg}; the {} backend is rung {}: pass --min-isolation {} to accept it",
                    backend.name(),
                    backend.isolation(),
                    backend.isolation()
                ))
            }
            other => other,
        })
}

/// The selected backend, refused below the floor. `guest_names` are the `--env` names whose values go to
/// the guest: they stay out of the engine client's own environment (host-hygiene rule 5).
async fn gated_backend(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    let backend = backends::connect(global, guest_names).await?;
    gate(global, &backend)?;
    Ok(backend)
}

fn exec_request(
    target: &RunTarget,
    argv: Vec<std::ffi::OsString>,
) -> Result<ExecRequest, SandboxError> {
    use std::os::unix::ffi::OsStringExt;
    let timeout = timeout_bound(target.timeout)?;
    let env = target.env.build(guest_env::from_process_env)?;
    let request = ExecRequest::new(Command::Argv(
        argv.into_iter().map(|a| a.into_vec()).collect(),
    ))
    .working_directory(target.workdir.clone())
    .timeout(timeout)
    .env(env);
    request.validate()?;
    Ok(request)
}

/// The longest `--timeout` accepted. Deadlines are computed as `now + timeout`, which overflows (a panic,
/// not an exit code) long before `Duration` does, so the bound keeps every deadline representable.
const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// `--timeout SECS` as a bound: positive, finite, at most [`MAX_TIMEOUT_SECS`], and not so small that it
/// rounds to zero.
fn timeout_bound(secs: f64) -> Result<Duration, SandboxError> {
    let refuse = || {
        SandboxError::invalid(format!(
            "--timeout {secs} must be a positive number of seconds, at most {MAX_TIMEOUT_SECS} (365 days)"
        ))
    };
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS) {
        return Err(refuse());
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(bound) if !bound.is_zero() => Ok(bound),
        _ => Err(refuse()),
    }
}

/// Runs `work` until it ends or sandboxctl is interrupted (SIGINT, SIGTERM, SIGHUP). An interrupt
/// drops `work`: the backend then kills the command's process group inside the sandbox in a task of
/// its own, which `main` waits for before exiting.
async fn until_interrupted<T>(
    work: impl std::future::Future<Output = Result<T, SandboxError>>,
) -> Result<T, SandboxError> {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    async fn arrival(stream: &mut Option<Signal>) {
        if let Some(stream) = stream {
            if stream.recv().await.is_some() {
                return;
            }
        }
        // A signal that cannot be watched never arrives.
        std::future::pending().await
    }
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let mut terminate = signal(SignalKind::terminate()).ok();
    let mut hangup = signal(SignalKind::hangup()).ok();
    let name = tokio::select! {
        result = work => return result,
        () = arrival(&mut interrupt) => "SIGINT",
        () = arrival(&mut terminate) => "SIGTERM",
        () = arrival(&mut hangup) => "SIGHUP",
    };
    Err(SandboxError::engine(format!(
        "interrupted by {name}; the command's processes were killed"
    )))
}

/// Writes the command's result and picks the exit code of `run`/`exec`.
fn finish_run(
    global: &GlobalArgs,
    result: Result<sandbox_core::ExecOutput, SandboxError>,
    key: Option<&SandboxKey>,
) -> u8 {
    let key_json = key.map(|k| {
        json!({"scope": k.scope, "thread": k.thread_id, "agent": k.agent_id, "call": k.call_id})
    });
    match result {
        Ok(output) => {
            if global.json {
                let mut v = report::exited_json(&output);
                if let Some(k) = key_json {
                    v["key"] = k;
                }
                report::print_json(&v);
            } else {
                let _ = std::io::stdout().write_all(&output.stdout);
                let _ = std::io::stdout().flush();
                let _ = std::io::stderr().write_all(&output.stderr);
            }
            // The command's own status, verbatim; a status outside 0..=255 cannot be an exit code.
            u8::try_from(output.exit_code).unwrap_or(exit_codes::RUN_FAILURE)
        }
        Err(err) => {
            if global.json {
                let mut v = report::failed_run_json(&err);
                if let Some(k) = key_json {
                    v["key"] = k;
                }
                report::print_json(&v);
            } else {
                eprintln!("sandboxctl: {}", one_line(&err.to_string()));
            }
            match err {
                SandboxError::Timeout { .. } => exit_codes::TIMEOUT,
                _ => exit_codes::RUN_FAILURE,
            }
        }
    }
}

async fn run(
    global: &GlobalArgs,
    image: Option<String>,
    key: &KeyArgs,
    target: &RunTarget,
    keep: bool,
    argv: Vec<std::ffi::OsString>,
) -> u8 {
    let given_key = match key.parse() {
        Ok(k) => k,
        Err(e) => return finish_run(global, Err(e.into()), None),
    };
    let request = match exec_request(target, argv) {
        Ok(r) => r,
        Err(e) => return finish_run(global, Err(e), None),
    };
    let backend = match gated_backend(global, &target.env.names).await {
        Ok(b) => b,
        Err(e) => return finish_run(global, Err(e), None),
    };
    let image = match image {
        Some(image) => Some(image),
        None => match backends::ensure_default_image(global.backend, &target.env.names).await {
            Ok(image) => image,
            Err(e) => return finish_run(global, Err(e), None),
        },
    };
    let mut builder = SandboxSpec::builder(target.kind.clone());
    if let Some(image) = image {
        builder = builder.image(image);
    }
    let spec = match builder.build() {
        Ok(s) => s,
        Err(e) => return finish_run(global, Err(e), None),
    };
    let dispose_after = !keep && given_key.is_none();
    let key = given_key.unwrap_or_else(generated_key);
    if keep {
        eprintln!("sandboxctl: kept sandbox key {}", key_flags(&key));
    }
    let result = until_interrupted(async {
        let sandbox = backend.acquire(&key, &spec).await?;
        sandbox.exec(request).await
    })
    .await;
    let printed_key = (keep || !dispose_after).then_some(&key);
    let code = finish_run(global, result, printed_key);
    if dispose_after {
        if let Some(failure) = backend.dispose(&key, DisposeSelector::all()).await {
            eprintln!("sandboxctl: the sandbox could not be disposed of: {failure}");
        }
    }
    code
}

async fn found(
    backend: &Arc<dyn SandboxBackend>,
    key: &SandboxKey,
    kind: &str,
) -> Result<Arc<dyn Sandbox>, SandboxError> {
    backend
        .find(key, kind)
        .await?
        .ok_or_else(|| SandboxError::NotFound {
            path: format!("no sandbox of kind {kind:?} for key {key}"),
        })
}

async fn exec(
    global: &GlobalArgs,
    key: &KeyArgs,
    target: &RunTarget,
    argv: Vec<std::ffi::OsString>,
) -> u8 {
    let outcome = async {
        let key = key.require()?;
        let request = exec_request(target, argv)?;
        let backend = gated_backend(global, &target.env.names).await?;
        let sandbox = found(&backend, &key, &target.kind).await?;
        until_interrupted(sandbox.exec(request)).await
    }
    .await;
    finish_run(global, outcome, None)
}

async fn images(global: &GlobalArgs, action: ImagesAction) -> Done {
    match action {
        ImagesAction::Build { tags } => {
            // A failed build is an engine error (70); an unknown tag an invalid argument (64).
            let built = backends::build_images(global.backend, &tags).await?;
            let text = built
                .iter()
                .map(|(tag, outcome)| format!("{tag}: {outcome}\n"))
                .collect();
            let value = json!({ "images": built.iter().map(|(t, o)| json!({"tag": t, "outcome": o})).collect::<Vec<_>>() });
            Ok((value, text))
        }
    }
}

async fn other_command(global: &GlobalArgs, command: CommandLine) -> Done {
    match command {
        CommandLine::CpIn {
            key,
            kind,
            allow_credential_path,
            local,
            guest,
        } => {
            let key = key.require()?;
            let content = read_local_source(&local, allow_credential_path)?;
            let backend = gated_backend(global, &[]).await?;
            let sandbox = found(&backend, &key, &kind).await?;
            sandbox.write_file(&guest, &content, ".").await?;
            Ok((
                json!({"copied": content.len(), "guest": guest}),
                String::new(),
            ))
        }
        CommandLine::CpOut {
            key,
            kind,
            max_bytes,
            guest,
            local,
        } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let sandbox = found(&backend, &key, &kind).await?;
            let content = sandbox.read_file(&guest, ".", max_bytes).await?;
            write_local_atomically(&local, &content)?;
            Ok((
                json!({"copied": content.len(), "local": local.display().to_string()}),
                String::new(),
            ))
        }
        CommandLine::Stat { key, kind, guest } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let sandbox = found(&backend, &key, &kind).await?;
            match sandbox.stat_file(&guest, ".").await? {
                Some(entry) => Ok((entry_json(&entry), entry_line(&entry))),
                None => Err(SandboxError::NotFound { path: guest }.into()),
            }
        }
        CommandLine::Ls { key, kind, guest } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let sandbox = found(&backend, &key, &kind).await?;
            let entries = sandbox.list_dir(&guest, ".").await?;
            Ok((
                json!({"entries": entries.iter().map(entry_json).collect::<Vec<_>>()}),
                entries.iter().map(entry_line).collect(),
            ))
        }
        CommandLine::Rm {
            key,
            kind,
            recursive,
            guest,
        } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let sandbox = found(&backend, &key, &kind).await?;
            sandbox.remove(&guest, ".", recursive).await?;
            Ok((json!({"removed": guest}), String::new()))
        }
        CommandLine::List { scope, thread } => {
            let backend = backends::connect(global, &[]).await?;
            let found = backend.list(&scope, thread.as_deref()).await?;
            let rows: Vec<Value> = found
                .iter()
                .map(|s| {
                    json!({
                        "instance_id": s.instance_id,
                        "state": format!("{:?}", s.state),
                        "kind": s.kind,
                        "key": s.key.as_ref().map(|k| json!({"scope": k.scope, "thread": k.thread_id, "agent": k.agent_id, "call": k.call_id})),
                    })
                })
                .collect();
            let text = found
                .iter()
                .map(|s| {
                    let key = s
                        .key
                        .as_ref()
                        .map(|k| format!("{}/{}/{}", k.scope, k.thread_id, k.agent_id))
                        .unwrap_or_else(|| "?".into());
                    format!(
                        "{}\t{:?}\t{}\t{}\n",
                        s.instance_id,
                        s.state,
                        s.kind.as_deref().unwrap_or("?"),
                        key
                    )
                })
                .collect();
            Ok((json!({"sandboxes": rows}), text))
        }
        CommandLine::Dispose { key, kind } => {
            let key = key.require()?;
            let backend = backends::connect(global, &[]).await?;
            let selector = kind.map(DisposeSelector::kind).unwrap_or_default();
            match backend.dispose(&key, selector).await {
                None => Ok((json!({"disposed": true}), String::new())),
                Some(failure) => Err(Failure {
                    code: exit_codes::ENGINE,
                    error: SandboxError::engine(failure.to_string()),
                    extra: Some(
                        json!({"undisposed": {"code": failure.code.as_str(), "detail": failure.detail}}),
                    ),
                }),
            }
        }
        CommandLine::Purge { scope, thread } => {
            let backend = backends::connect(global, &[]).await?;
            let purge = backend.dispose_scope(&scope, &thread).await;
            let value = json!({
                "disposed": purge.disposed,
                "undisposed": purge.undisposed.as_ref().map(|f| json!({"code": f.code.as_str(), "detail": f.detail})),
            });
            match purge.undisposed {
                None => Ok((value, format!("disposed {}\n", purge.disposed))),
                Some(failure) => Err(Failure {
                    code: exit_codes::ENGINE,
                    error: SandboxError::engine(format!(
                        "disposed {}, left undisposed: {failure}",
                        purge.disposed
                    )),
                    extra: Some(value),
                }),
            }
        }
        CommandLine::Run { .. }
        | CommandLine::Exec { .. }
        | CommandLine::Doctor { .. }
        | CommandLine::Images { .. } => {
            unreachable!("dispatched before")
        }
    }
}

fn entry_json(entry: &sandbox_core::SandboxEntry) -> Value {
    json!({"path": entry.path(), "kind": entry.kind().as_str(), "size_bytes": entry.size_bytes()})
}

fn entry_line(entry: &sandbox_core::SandboxEntry) -> String {
    match entry.size_bytes() {
        Some(size) => format!("{}\t{}\t{}\n", entry.kind(), size, entry.path()),
        None => format!("{}\t-\t{}\n", entry.kind(), entry.path()),
    }
}

/// Reads a host file to copy in, refusing credential paths after resolving links (host-hygiene §3), and
/// anything that is not a regular file (a fifo would block the read, a device never end it).
fn read_local_source(local: &Path, allow_credential_path: bool) -> Result<Vec<u8>, Failure> {
    let resolved = std::fs::canonicalize(local).map_err(|e| io_failure("resolve", local, e))?;
    if !allow_credential_path {
        if let Some(credential) = credential_refusal(local, &resolved) {
            return Err(SandboxError::NotPermitted(format!(
                "{} is, contains or lies under the credential path {credential}; pass --allow-credential-path to copy it anyway",
                local.display()
            ))
            .into());
        }
    }
    let not_regular = |meta: &std::fs::Metadata| -> Option<Failure> {
        let path = local.display().to_string();
        if meta.is_dir() {
            Some(SandboxError::IsADirectory { path }.into())
        } else if !meta.is_file() {
            Some(SandboxError::NotRegularFile { path }.into())
        } else {
            None
        }
    };
    let meta = std::fs::metadata(&resolved).map_err(|e| io_failure("stat", local, e))?;
    if let Some(refused) = not_regular(&meta) {
        return Err(refused);
    }
    let mut file = std::fs::File::open(&resolved).map_err(|e| io_failure("open", local, e))?;
    // The entry may have been swapped since the check: judge what was opened.
    let meta = file.metadata().map_err(|e| io_failure("stat", local, e))?;
    if let Some(refused) = not_regular(&meta) {
        return Err(refused);
    }
    let mut content = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut content)
        .map_err(|e| io_failure("read", local, e))?;
    Ok(content)
}

/// The credential path a copy-in source touches, judged both as named and as resolved, against the home
/// directory as named and as resolved, and against each credential entry's own resolved location: a
/// `~/.ssh` that links to a dotfiles directory still guards what is in it.
fn credential_refusal(local: &Path, resolved: &Path) -> Option<String> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut homes = vec![home.clone()];
    if let Ok(real_home) = std::fs::canonicalize(&home) {
        homes.push(real_home.display().to_string());
    }
    let mut sources = vec![resolved.display().to_string()];
    if let Ok(named) = std::path::absolute(local) {
        sources.push(named.display().to_string());
    }
    for home in &homes {
        for source in &sources {
            if let Some(credential) = sandbox_core::refuses_source(home, source) {
                return Some(credential.to_string());
            }
        }
    }
    for credential in sandbox_core::credential_paths() {
        for home in &homes {
            let Ok(real) = std::fs::canonicalize(credential.under(home)) else {
                continue;
            };
            if resolved.starts_with(&real) || real.starts_with(resolved) {
                return Some(credential.to_string());
            }
        }
    }
    None
}

fn io_failure(operation: &'static str, path: &Path, source: std::io::Error) -> Failure {
    let path = path.display().to_string();
    match source.kind() {
        std::io::ErrorKind::NotFound => SandboxError::NotFound { path }.into(),
        _ => SandboxError::Io {
            operation,
            path,
            source,
        }
        .into(),
    }
}

/// Writes beside the destination and renames on success: a refused or failed copy leaves no partial file.
/// The flags that name `key` again, quoted for a POSIX shell (fields may hold `/` or spaces).
fn key_flags(key: &SandboxKey) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut flags = format!(
        "--scope {} --thread {} --agent {}",
        quote(&key.scope),
        quote(&key.thread_id),
        quote(&key.agent_id)
    );
    if key.is_call() {
        flags.push_str(&format!(" --call {}", quote(&key.call_id)));
    }
    flags
}

fn write_local_atomically(local: &Path, content: &[u8]) -> Result<(), Failure> {
    let dir = match local.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    // Mode 0666 before the umask, as any new file gets: not the temp file's private 0600.
    let mut temp = tempfile::Builder::new()
        .prefix(".sandboxctl-cp-out")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(&dir)
        .map_err(|e| io_failure("create", &dir, e))?;
    temp.write_all(content)
        .map_err(|e| io_failure("write", local, e))?;
    temp.persist(local)
        .map_err(|e| io_failure("rename", local, e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_keys_print_as_flags_that_name_them_again() {
        let key = SandboxKey::conversation("s/x", "it's", "a b").with_call("c1");
        assert_eq!(
            key_flags(&key),
            r"--scope 's/x' --thread 'it'\''s' --agent 'a b' --call 'c1'"
        );
        assert_eq!(
            key_flags(&SandboxKey::conversation("s", "t", "a")),
            "--scope 's' --thread 't' --agent 'a'"
        );
    }

    #[test]
    fn cp_out_files_get_the_usual_mode() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("out");
        write_local_atomically(&local, b"x")
            .map_err(|f| f.error)
            .unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&local).unwrap().permissions(),
        );
        // Whatever the umask, group or others get what it allows, never the temp file's 0600.
        let umask_probe = dir.path().join("probe");
        std::fs::write(&umask_probe, b"").unwrap();
        let usual = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&umask_probe).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, usual & 0o777);
        assert_eq!(std::fs::read(&local).unwrap(), b"x");
    }
}
