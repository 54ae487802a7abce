//! One function per command. Each returns its exit code; nothing else in the binary picks integers.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    Command, DisposeSelector, ExecChunk, ExecEvent, ExecOutput, ExecRequest, ExecStdin, Sandbox,
    SandboxBackend, SandboxError, SandboxKey, SandboxSpec,
};
use serde_json::{json, Value};

use crate::cli::{Cli, CommandLine, FileCommand, FileTarget, GlobalArgs, ImagesAction, RunTarget};
use crate::keys::{check_field, generated_key, KeyArgs};
use crate::{backends, exit_codes, guest_env, report};
use host_files::{Destination, Source};

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
            allow,
            rules,
            credential_files,
            argv,
        } => {
            let egress = RunEgress {
                allow,
                rules,
                credential_files,
            };
            return run(&global, image, &key, &target, keep, &egress, argv).await;
        }
        CommandLine::Exec { key, target, argv } => return exec(&global, &key, &target, argv).await,
        CommandLine::Images { action } => images(&global, action).await,
        CommandLine::Doctor { egress_probe } => {
            return crate::doctor::doctor(&global, &egress_probe).await
        }
        CommandLine::File(command) => file_command(&global, command).await,
        CommandLine::List { scope, thread } => list(&global, scope, thread).await,
        CommandLine::Dispose {
            key,
            kind,
            instance,
        } => dispose(&global, key, kind, instance).await,
        CommandLine::Purge { scope, thread } => purge(&global, scope, thread).await,
        CommandLine::PoolPurge => pool_purge(&global).await,
        CommandLine::Reset { key, kind } => reset(&global, key, kind).await,
        CommandLine::Fork {
            key,
            to,
            kind,
            image,
        } => fork(&global, key, to, kind, image).await,
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

/// A message on one line: whitespace runs become one space, and any other control character (a guest's
/// name may be quoted in it) is escaped.
fn one_line(text: &str) -> String {
    report::escape_controls(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

type Done = Result<(Value, String), Failure>;

/// The floor gates commands that run code or move files: the router refuses a backend below it.
fn gate(global: &GlobalArgs, backend: &Arc<dyn SandboxBackend>) -> Result<(), SandboxError> {
    backends::gated_router(global, backend.clone()).map(|_| ())
}

/// The selected backend, refused below the floor. `guest_names` are the `--env` names whose values go to
/// the guest: they stay out of the engine client's own environment, so a secret given to the guest is
/// not also inherited by every engine client process.
async fn gated_backend(
    global: &GlobalArgs,
    guest_names: &[String],
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    gated_backend_observed(global, guest_names, None).await
}

/// [`gated_backend`] with an egress observer.
async fn gated_backend_observed(
    global: &GlobalArgs,
    guest_names: &[String],
    observer: Option<sandbox_core::credential::EgressObserver>,
) -> Result<Arc<dyn SandboxBackend>, SandboxError> {
    let backend = backends::connect_observed(global, guest_names, observer).await?;
    gate(global, &backend)?;
    Ok(backend)
}

/// The most egress events `run --json` reports.
const MAX_REPORTED_EVENTS: usize = 10_000;

/// The request of `run` and `exec`. Without a `guard` an `--env-file` is not read yet: that first
/// check refuses a bad request before any engine call, and [`with_env_file`] completes it.
fn exec_request(
    target: &RunTarget,
    argv: Vec<std::ffi::OsString>,
    guard: Option<&host_files::HostPathGuard>,
) -> Result<ExecRequest, SandboxError> {
    use std::os::unix::ffi::OsStringExt;
    let timeout = timeout_bound(target.timeout)?;
    let env = target.env.build(guest_env::from_process_env, guard)?;
    let request = ExecRequest::new(Command::Argv(
        argv.into_iter().map(|a| a.into_vec()).collect(),
    ))
    .working_directory(target.workdir.clone())
    .timeout(timeout)
    .env(env);
    request.validate()?;
    Ok(request)
}

/// The request again with its `--env-file` read through the one guarded opener, whose guard knows
/// the connected backend's host state; the request as it is when no file is given.
async fn with_env_file(
    global: &GlobalArgs,
    backend: &dyn SandboxBackend,
    target: &RunTarget,
    argv: Vec<std::ffi::OsString>,
    request: ExecRequest,
) -> Result<ExecRequest, SandboxError> {
    if target.env.file.is_none() {
        return Ok(request);
    }
    let guard = backends::host_guard(global, backend, None).await?;
    exec_request(target, argv, Some(&guard))
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

/// Runs the request in `sandbox`, with this process's stdin when `-i` was given. With `--json`
/// the output is collected (within the request's budget) for the one JSON object; otherwise it
/// goes to this process's stdout and stderr chunk by chunk as it arrives, nothing held beyond a
/// chunk, and the returned output carries only how the command ended.
async fn run_in(
    global: &GlobalArgs,
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    target: &RunTarget,
) -> Result<ExecOutput, SandboxError> {
    use tokio::io::AsyncWriteExt as _;
    if !target.host_tools.is_empty() {
        return run_with_host_tools(global, sandbox, request, target).await;
    }
    let stdin = if target.interactive {
        ExecStdin::reader(tokio::io::stdin())
    } else {
        ExecStdin::Closed
    };
    if global.json {
        let budget = request.output_budget();
        return sandbox
            .exec_stream(request.max_output_bytes(budget), stdin)
            .await?
            .collect()
            .await;
    }
    let mut stream = sandbox.exec_stream(request, stdin).await?;
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    while let Some(event) = stream.next().await {
        match event? {
            ExecEvent::Output(ExecChunk::Stdout(bytes)) => {
                // A closed stdout (`| head`) is the reader's choice: the command runs on.
                let _ = stdout.write_all(&bytes).await;
                let _ = stdout.flush().await;
            }
            ExecEvent::Output(ExecChunk::Stderr(bytes)) => {
                let _ = stderr.write_all(&bytes).await;
                let _ = stderr.flush().await;
            }
            // Already written: the output carries only the exit.
            ExecEvent::Exit(exit) => {
                return Ok(ExecOutput {
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    exit_code: exit.exit_code,
                    producer_owns_stderr: exit.producer_owns_stderr,
                    not_started: exit.not_started,
                })
            }
        }
    }
    Err(SandboxError::engine(
        "the command's output ended without its exit",
    ))
}

/// Runs the request while serving the `--host-tool` flags' tools; prints the collected output
/// unless `--json` (which prints it in its object).
async fn run_with_host_tools(
    global: &GlobalArgs,
    sandbox: &dyn Sandbox,
    request: ExecRequest,
    target: &RunTarget,
) -> Result<ExecOutput, SandboxError> {
    use std::io::Write as _;
    if target.interactive {
        return Err(SandboxError::invalid(
            "--host-tool and -i cannot be combined: the run's stdin is not the command's",
        ));
    }
    let bounds = host_tools::RunBounds::default();
    let registry = crate::host_tool_commands::registry(&target.host_tools, &bounds)?;
    let run = sandbox_core::host_tool_run::run_with_host_tools(
        sandbox,
        request,
        &registry.all_for_run(),
        &bounds,
    )
    .await?;
    if let Some(reason) = &run.channel_error {
        eprintln!("sandboxctl: the host-tool channel ended early: {reason}");
    }
    let mut output = run.output;
    if !global.json {
        let _ = std::io::stdout().write_all(&std::mem::take(&mut output.stdout));
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().write_all(&std::mem::take(&mut output.stderr));
    }
    Ok(output)
}

/// What `run` adds to its `--json` object: the key it kept, and whether the acquire created the
/// sandbox.
#[derive(Default)]
struct RunFacts<'a> {
    key: Option<&'a SandboxKey>,
    fresh: Option<bool>,
    /// The egress decisions of an allowlist sandbox's proxy during the run (`--json`).
    egress_events: Option<Vec<Value>>,
}

/// Writes the command's result and picks the exit code of `run`/`exec`.
fn finish_run(
    global: &GlobalArgs,
    result: Result<sandbox_core::ExecOutput, SandboxError>,
    facts: RunFacts<'_>,
) -> u8 {
    let add_facts = |v: &mut Value| {
        if let Some(k) = facts.key {
            v["key"] = json!({"scope": k.scope, "thread": k.thread_id, "agent": k.agent_id, "call": k.call_id});
        }
        if let Some(fresh) = facts.fresh {
            v["fresh"] = json!(fresh);
        }
        if let Some(events) = &facts.egress_events {
            v["egress_events"] = json!(events);
        }
    };
    match result {
        Ok(sandbox_core::ExecOutput {
            not_started: Some(reason),
            ..
        }) => {
            if global.json {
                let mut v = report::not_started_json(&reason);
                add_facts(&mut v);
                report::print_json(&v);
            } else {
                eprintln!(
                    "sandboxctl: the command did not start: its working directory cannot be entered: {}",
                    one_line(&reason)
                );
            }
            exit_codes::RUN_FAILURE
        }
        Ok(output) => {
            if global.json {
                let mut v = report::exited_json(&output);
                add_facts(&mut v);
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
                add_facts(&mut v);
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

/// `run`'s egress flags.
#[derive(Debug, Default)]
struct RunEgress {
    allow: Vec<String>,
    rules: Vec<String>,
    credential_files: Vec<std::path::PathBuf>,
}

/// How long `run --json` waits after the command for the last egress decisions to arrive from
/// the proxy's log.
const EVENTS_SETTLE: Duration = Duration::from_millis(500);

async fn run(
    global: &GlobalArgs,
    image: Option<String>,
    key: &KeyArgs,
    target: &RunTarget,
    keep: bool,
    egress: &RunEgress,
    argv: Vec<std::ffi::OsString>,
) -> u8 {
    let refused = |e: SandboxError| finish_run(global, Err(e), RunFacts::default());
    let given_key = match key.parse() {
        Ok(k) => k,
        Err(e) => return refused(e.into()),
    };
    let request = match exec_request(target, argv.clone(), None) {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let rules = match egress
        .rules
        .iter()
        .map(|rule| sandbox_backends::egress_flags::parse_rule(rule))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(rules) => rules,
        Err(e) => return refused(e),
    };
    // `run --json` reports the egress decisions its sandbox's proxy made.
    let events: Arc<std::sync::Mutex<Vec<sandbox_core::credential::EgressEvent>>> = Arc::default();
    let observer = global.json.then(|| {
        let sink = Arc::clone(&events);
        sandbox_core::credential::EgressObserver::new(move |event| {
            if let Ok(mut seen) = sink.lock() {
                // Bounded: a command that makes a million requests reports the first 10000.
                if seen.len() < MAX_REPORTED_EVENTS {
                    seen.push(event.clone());
                }
            }
        })
    });
    let backend = match gated_backend_observed(global, &target.env.names, observer).await {
        Ok(b) => b,
        Err(e) => return refused(e),
    };
    let request = match with_env_file(global, &*backend, target, argv, request).await {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let grants = match sandbox_backends::egress_flags::read_credentials(
        global,
        &*backend,
        &egress.credential_files,
    )
    .await
    {
        Ok(grants) => grants,
        Err(e) => return refused(e),
    };
    let image = match image {
        Some(image) => Some(image),
        None => match backends::ensure_default_image(global.backend, &target.env.names).await {
            Ok(image) => image,
            Err(e) => return refused(e),
        },
    };
    let spec = match run_spec(&target.kind, image, &egress.allow, rules, grants) {
        Ok(s) => s,
        Err(e) => return refused(e),
    };
    let dispose_after = !keep && given_key.is_none();
    let key = match given_key.map_or_else(generated_key, Ok) {
        Ok(key) => key,
        Err(e) => return refused(e),
    };
    if keep {
        eprintln!("sandboxctl: kept sandbox key {}", key_flags(&key));
    }
    let mut fresh = None;
    let mut instance = None;
    let result = until_interrupted(async {
        let sandbox = backend.acquire(&key, &spec).await?;
        fresh = Some(sandbox.freshly_created());
        instance = Some(sandbox.instance_id().to_owned());
        run_in(global, &*sandbox, request, target).await
    })
    .await;
    let egress_events = match (&instance, global.json, spec.egress()) {
        (Some(instance), true, sandbox_core::Egress::Allowlist) => {
            tokio::time::sleep(EVENTS_SETTLE).await;
            let seen = events.lock().map(|e| e.clone()).unwrap_or_default();
            Some(
                seen.iter()
                    .filter(|e| e.sandbox == *instance)
                    .map(crate::egress_args::event_json)
                    .collect(),
            )
        }
        _ => None,
    };
    let facts = RunFacts {
        key: (keep || !dispose_after).then_some(&key),
        fresh,
        egress_events,
    };
    let code = finish_run(global, result, facts);
    if dispose_after {
        if let Some(failure) = backend.dispose(&key, DisposeSelector::all()).await {
            eprintln!("sandboxctl: the sandbox could not be disposed of: {failure}");
        }
    }
    code
}

/// The spec of `run`: the kind, the image, and egress allowlist when hosts are allowed or rules
/// given (closed otherwise), with the credential grants.
fn run_spec(
    kind: &str,
    image: Option<String>,
    allow: &[String],
    rules: Vec<sandbox_core::EgressRule>,
    grants: Vec<sandbox_core::credential::CredentialGrant>,
) -> Result<SandboxSpec, SandboxError> {
    let mut builder = SandboxSpec::builder(kind);
    if let Some(image) = image {
        builder = builder.image(image);
    }
    if !allow.is_empty() || !rules.is_empty() {
        builder = builder.egress(sandbox_core::Egress::Allowlist);
        for host in allow {
            builder = builder.allow(host.as_str());
        }
        for rule in rules {
            builder = builder.allow(sandbox_core::EgressEntry::Rule(rule));
        }
    }
    for grant in grants {
        builder = builder.credential(grant);
    }
    builder.build()
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

/// The existing sandbox a file command names, on a backend at or above the floor.
async fn found_gated(
    global: &GlobalArgs,
    key: KeyArgs,
    target: &FileTarget,
) -> Result<Arc<dyn Sandbox>, Failure> {
    let key = key.require()?;
    let backend = gated_backend(global, &[]).await?;
    Ok(found(&backend, &key, &target.kind).await?)
}

async fn exec(
    global: &GlobalArgs,
    key: &KeyArgs,
    target: &RunTarget,
    argv: Vec<std::ffi::OsString>,
) -> u8 {
    let outcome = async {
        let key = key.require()?;
        let request = exec_request(target, argv.clone(), None)?;
        let backend = gated_backend(global, &target.env.names).await?;
        let request = with_env_file(global, &*backend, target, argv, request).await?;
        let sandbox = found(&backend, &key, &target.kind).await?;
        until_interrupted(run_in(global, &*sandbox, request, target)).await
    }
    .await;
    finish_run(global, outcome, RunFacts::default())
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

/// A confinement refusal of an absolute guest path under the default `--workdir` says how to reach
/// it: guest paths stay under the working directory, and only an absolute `--workdir` leaves the
/// storage base.
fn with_workdir_hint(error: SandboxError, guest: &str, target: &FileTarget) -> SandboxError {
    match error {
        SandboxError::Confinement { path, reason } if guest.starts_with('/') && target.workdir == "." => {
            SandboxError::Confinement {
                path,
                reason: format!(
                    "{reason}; guest paths stay under --workdir, which defaults to the storage base: \
                     pass an absolute --workdir to address the guest's own directories"
                ),
            }
        }
        other => other,
    }
}

/// A file command; a confinement refusal of its guest path says how `--workdir` reaches it.
async fn file_command(global: &GlobalArgs, command: FileCommand) -> Done {
    let (guest, target) = command.guest_and_target();
    let (guest, target) = (guest.to_owned(), target.clone());
    run_file_command(global, command)
        .await
        .map_err(|mut failure| {
            failure.error = with_workdir_hint(failure.error, &guest, &target);
            failure
        })
}

async fn run_file_command(global: &GlobalArgs, command: FileCommand) -> Done {
    match command {
        FileCommand::CpIn {
            key,
            target,
            allow_credential_path,
            local,
            guest,
        } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let guard = backends::host_guard(global, &*backend, None).await?;
            // Judged before the sandbox is looked up: a refused source costs no engine call.
            drop(Source::open(&local, &guard, allow_credential_path)?);
            let sandbox = found(&backend, &key, &target.kind).await?;
            // No sandbox of this backend takes more in one file: never read more than that.
            let cap = backend.declarations().limits.files_in.max_bytes_per_file;
            let copied = host_files::copy_in(
                &*sandbox,
                &local,
                &guest,
                &target.workdir,
                &guard,
                allow_credential_path,
                cap,
            )
            .await?;
            Ok((json!({"copied": copied, "guest": guest}), String::new()))
        }
        FileCommand::CpOut {
            key,
            target,
            allow_credential_path,
            out,
            max_bytes,
            guest,
            local,
        } => {
            let key = key.require()?;
            let backend = gated_backend(global, &[]).await?;
            let root = out.output_root()?;
            let guard = backends::host_guard(global, &*backend, Some(&root)).await?;
            // Judged before the sandbox is looked up: a refused destination costs no engine call.
            let destination =
                Destination::open(&local, &guard, allow_credential_path, out.existing())?;
            let sandbox = found(&backend, &key, &target.kind).await?;
            let copied =
                host_files::copy_out(&*sandbox, &guest, &target.workdir, destination, max_bytes)
                    .await?;
            Ok((
                json!({"copied": copied, "local": local.display().to_string()}),
                String::new(),
            ))
        }
        FileCommand::Stat { key, target, guest } => {
            let sandbox = found_gated(global, key, &target).await?;
            match sandbox.stat_file(&guest, &target.workdir).await? {
                Some(entry) => Ok((entry_json(&entry), entry_line(&entry))),
                None => Err(SandboxError::NotFound { path: guest }.into()),
            }
        }
        FileCommand::Ls { key, target, guest } => {
            let sandbox = found_gated(global, key, &target).await?;
            let entries = sandbox.list_dir(&guest, &target.workdir).await?;
            Ok((
                json!({"entries": entries.iter().map(entry_json).collect::<Vec<_>>()}),
                entries.iter().map(entry_line).collect(),
            ))
        }
        FileCommand::Rm {
            key,
            target,
            recursive,
            guest,
        } => {
            let sandbox = found_gated(global, key, &target).await?;
            sandbox.remove(&guest, &target.workdir, recursive).await?;
            Ok((json!({"removed": guest}), String::new()))
        }
        FileCommand::Reclaim {
            key,
            target,
            timeout,
            directory,
        } => {
            let bound = timeout_bound(timeout)?;
            let sandbox = found_gated(global, key, &target).await?;
            sandbox.reclaim(&directory, &target.workdir, bound).await?;
            Ok((json!({"reclaimed": directory}), String::new()))
        }
    }
}

/// The sandboxes of a scope, or of one conversation.
async fn list(global: &GlobalArgs, scope: String, thread: Option<String>) -> Done {
    check_field("scope", &scope)?;
    if let Some(thread) = &thread {
        check_field("thread", thread)?;
    }
    let backend = backends::connect(global, &[]).await?;
    let found = backend.list(&scope, thread.as_deref()).await?;
    let rows: Vec<Value> = found.iter().map(summary_json).collect();
    let text = found.iter().map(summary_line).collect();
    Ok((json!({"sandboxes": rows}), text))
}

/// Disposes of a key's sandboxes: every kind, one kind or one instance.
async fn dispose(
    global: &GlobalArgs,
    key: KeyArgs,
    kind: Option<String>,
    instance: Option<String>,
) -> Done {
    let key = key.require()?;
    let backend = backends::connect(global, &[]).await?;
    let selector = DisposeSelector {
        kind,
        instance_id: instance,
    };
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

/// Returns a key's sandbox of one kind to its state at acquire.
async fn reset(global: &GlobalArgs, key: KeyArgs, kind: String) -> Done {
    let key = key.require()?;
    let backend = gated_backend(global, &[]).await?;
    let sandbox = found(&backend, &key, &kind).await?;
    let reset = sandbox.reset().await?;
    let id = reset.instance_id().to_owned();
    Ok((
        json!({"reset": true, "instance_id": id}),
        format!("reset {} as instance {id}\n", key_flags(&key)),
    ))
}

/// Copies a key's sandbox of one kind into a new sandbox under `to`.
async fn fork(
    global: &GlobalArgs,
    key: KeyArgs,
    to: String,
    kind: String,
    image: Option<String>,
) -> Done {
    let source = key.require()?;
    let target = KeyArgs {
        key: Some(to),
        ..KeyArgs::default()
    }
    .require()?;
    let backend = gated_backend(global, &[]).await?;
    let image = match image {
        Some(image) => Some(image),
        None => backends::ensure_default_image(global.backend, &[]).await?,
    };
    let spec = run_spec(&kind, image, &[], Vec::new(), Vec::new())?;
    let fork = backend.fork(&source, &spec, &target).await?;
    let id = fork.instance_id().to_owned();
    Ok((
        json!({
            "forked": true,
            "instance_id": id,
            "key": {"scope": target.scope, "thread": target.thread_id, "agent": target.agent_id},
        }),
        format!("forked into {} as instance {id}\n", key_flags(&target)),
    ))
}

/// Disposes of every sandbox of a conversation.
async fn purge(global: &GlobalArgs, scope: String, thread: String) -> Done {
    check_field("scope", &scope)?;
    check_field("thread", &thread)?;
    let backend = backends::connect(global, &[]).await?;
    purged(backend.dispose_scope(&scope, &thread).await)
}

/// A purge's report: how many were disposed of, and what was left.
fn purged(purge: sandbox_core::ScopePurge) -> Done {
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

/// Removes every warm pool member of the docker backend.
async fn pool_purge(global: &GlobalArgs) -> Done {
    purged(sandbox_backends::purge_pool(global).await?)
}

/// One entry as JSON: the exact path, or for a name no guest path can address (not UTF-8, holding a
/// backslash) its escaped form with `"name_escaped": true`.
fn entry_json(entry: &sandbox_core::SandboxEntry) -> Value {
    let mut v = json!({"path": entry.path(), "kind": entry.kind().as_str(), "size_bytes": entry.size_bytes()});
    if entry.name_escaped() {
        v["name_escaped"] = json!(true);
    }
    v
}

/// One tab-separated line per entry; the guest chose the name, so it is escaped (`ls -b`).
fn entry_line(entry: &sandbox_core::SandboxEntry) -> String {
    let path = report::escape_listed(entry.path(), entry.name_escaped());
    match entry.size_bytes() {
        Some(size) => format!("{}\t{}\t{}\n", entry.kind(), size, path),
        None => format!("{}\t-\t{}\n", entry.kind(), path),
    }
}

/// One tab-separated line per sandbox; key fields and kinds decoded from labels are escaped (`ls -b`).
/// One `list --json` row. `state` is the wire string; `created` is whole seconds since the Unix
/// epoch, or null when the engine did not say (or said a time before the epoch).
fn summary_json(summary: &sandbox_core::SandboxSummary) -> Value {
    let created = summary.created.and_then(|created| {
        created
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|since| since.as_secs())
    });
    json!({
        "instance_id": summary.instance_id,
        "state": summary.state.as_str(),
        "created": created,
        "kind": summary.kind,
        "key": summary.key.as_ref().map(|k| json!({"scope": k.scope, "thread": k.thread_id, "agent": k.agent_id, "call": k.call_id})),
    })
}

fn summary_line(summary: &sandbox_core::SandboxSummary) -> String {
    let key = summary
        .key
        .as_ref()
        .map(|k| {
            [&k.scope, &k.thread_id, &k.agent_id]
                .map(|field| report::escape_name(field))
                .join("/")
        })
        .unwrap_or_else(|| "?".into());
    format!(
        "{}\t{}\t{}\t{}\n",
        report::escape_name(&summary.instance_id),
        report::escape_name(summary.state.as_str()),
        summary
            .kind
            .as_deref()
            .map(report::escape_name)
            .unwrap_or_else(|| "?".into()),
        key
    )
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_allows_hosts_as_an_allowlist_and_refuses_bad_ones() {
        let closed = run_spec("default", None, &[], Vec::new(), Vec::new()).unwrap();
        assert_eq!(closed.egress(), sandbox_core::Egress::Closed);
        let allow = run_spec(
            "default",
            Some("img:1".into()),
            &["b.test".into(), "a.test".into()],
            Vec::new(),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(allow.egress(), sandbox_core::Egress::Allowlist);
        let hosts: Vec<&str> = allow.egress_allow().iter().map(|e| e.host()).collect();
        assert_eq!(hosts, ["b.test", "a.test"]);
        assert_eq!(allow.image(), Some("img:1"));
        for bad in ["10.0.0.1", "*", "a b"] {
            let error =
                run_spec("default", None, &[bad.to_owned()], Vec::new(), Vec::new()).unwrap_err();
            assert_eq!(
                error.kind(),
                sandbox_core::ErrorKind::InvalidArgument,
                "{bad}"
            );
        }
    }

    #[test]
    fn run_turns_rules_and_grants_into_an_allowlist_spec() {
        let rule = sandbox_backends::egress_flags::parse_rule("api.test GET /v1/*").unwrap();
        let grant = sandbox_backends::egress_flags::parse_credential(
            br#"{"host":"api.test","paths":["/v1/*"],"token":"tok","expires_in_secs":60}"#,
            "f",
            std::time::SystemTime::now(),
        )
        .unwrap();
        let spec = run_spec(
            "default",
            None,
            &["b.test".into()],
            vec![rule.clone()],
            vec![grant.clone()],
        )
        .unwrap();
        assert_eq!(spec.egress(), sandbox_core::Egress::Allowlist);
        assert_eq!(
            spec.egress_allow(),
            &[
                sandbox_core::EgressEntry::Host("b.test".into()),
                sandbox_core::EgressEntry::Rule(rule.clone())
            ]
        );
        assert_eq!(spec.credentials(), std::slice::from_ref(&grant));
        // A rule alone is an allowlist; a grant for a host nothing allows is refused.
        let alone = run_spec("default", None, &[], vec![rule], Vec::new()).unwrap();
        assert_eq!(alone.egress(), sandbox_core::Egress::Allowlist);
        let error =
            run_spec("default", None, &["b.test".into()], Vec::new(), vec![grant]).unwrap_err();
        assert!(error.to_string().contains("does not allow"), "{error}");
    }

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
    fn list_rows_carry_the_wire_state_and_the_creation_time() {
        use sandbox_core::{SandboxState, SandboxSummary};
        let summary = |state, created| SandboxSummary {
            key: Some(SandboxKey::conversation("s", "t", "a")),
            kind: Some("shell".into()),
            instance_id: "id1".into(),
            created,
            state,
        };
        let created = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let row = summary_json(&summary(SandboxState::Unlisted, Some(created)));
        assert_eq!(
            row,
            json!({
                "instance_id": "id1",
                "state": "unlisted",
                "created": 1_700_000_000u64,
                "kind": "shell",
                "key": {"scope": "s", "thread": "t", "agent": "a", "call": ""},
            })
        );
        for (state, wire) in [
            (SandboxState::Running, "running"),
            (SandboxState::Stopped, "stopped"),
            (SandboxState::Retired, "retired"),
            (SandboxState::Other("paused".into()), "paused"),
        ] {
            let row = summary_json(&summary(state, None));
            assert_eq!(row["state"], wire);
            assert_eq!(row["created"], Value::Null);
        }
        let line = summary_line(&summary(SandboxState::Running, None));
        assert_eq!(line, "id1\trunning\tshell\ts/t/a\n");
    }
}
