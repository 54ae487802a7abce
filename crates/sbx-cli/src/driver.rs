//! The driver: one bounded `sbx` invocation per method.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind, OutputSink, RunOutput};
use tokio::io::AsyncRead;
use tokio::time::Instant;

use crate::error::{classify_output, Call, Error};
use crate::name::{MemorySize, SbxName};
use crate::shapes::{
    parse_ls, parse_mcp_ls, parse_policy_check, parse_policy_ls, parse_secret_ls, LsRow, McpServer,
    PolicyCheck, PolicyList, SecretList,
};

/// Bound of every call but `create` and `exec`: 60 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound of `create`: 600 s (a first create may pull and boot a VM image).
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(600);
/// Output budget of the small calls (`version`, `settings get`, `rm`): 64 KiB.
pub const SMALL_OUTPUT_BUDGET: usize = 64 * 1024;
/// Output budget of the listings (`ls`, `mcp ls`, `secret ls`, `policy …`): 8 MiB.
pub const LISTING_OUTPUT_BUDGET: usize = 8 * 1024 * 1024;
/// Output budget of `create`: 1 MiB.
pub const CREATE_OUTPUT_BUDGET: usize = 1024 * 1024;
/// Default output budget of `exec`: 8 MiB.
pub const DEFAULT_EXEC_OUTPUT_BUDGET: usize = bounded_process::DEFAULT_OUTPUT_BUDGET;

/// The variable that turns `sbx` telemetry off; set to `1` in every `sbx` child when configured.
pub const NO_TELEMETRY_VAR: &str = "SBX_NO_TELEMETRY";

/// The predicate deciding which management environment names may reach calls that start guest
/// programs (`sbx exec`): `true` lets the name through. Callers pass the project's secret-name
/// denylist here (negated), since `sbx` may forward its client environment into the VM.
type GuestEnvFilter = Arc<dyn Fn(&OsStr) -> bool + Send + Sync>;

type EnvList = Vec<(OsString, OsString)>;

/// A typed, bounded driver for one `sbx` program.
///
/// Cheap to clone (the configuration is shared). Every method runs exactly one `sbx` process
/// through [`bounded_process::run_bounded`]: explicit environment, stdin closed unless the call
/// carries bytes, a deadline and an output budget, the process killed and reaped on every early
/// exit.
#[derive(Clone)]
pub struct SbxCli {
    config: Arc<DriverConfig>,
}

struct DriverConfig {
    sbx_path: PathBuf,
    program: OsString,
    management_env: EnvList,
    guest_env: EnvList,
    command_timeout: Duration,
    create_timeout: Duration,
    no_telemetry: bool,
}

impl fmt::Debug for SbxCli {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Environment values may be credentials: only names are shown.
        let names = |env: &EnvList| env.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        f.debug_struct("SbxCli")
            .field("sbx_path", &self.config.sbx_path)
            .field("management_env_names", &names(&self.config.management_env))
            .field("guest_env_names", &names(&self.config.guest_env))
            .field("command_timeout", &self.config.command_timeout)
            .field("create_timeout", &self.config.create_timeout)
            .field("no_telemetry", &self.config.no_telemetry)
            .finish()
    }
}

/// Builds an [`SbxCli`]; see [`SbxCli::builder`].
pub struct SbxCliBuilder {
    sbx_path: PathBuf,
    guest_env_allowed: GuestEnvFilter,
    management_env: Option<EnvList>,
    command_timeout: Duration,
    create_timeout: Duration,
    no_telemetry: bool,
}

impl fmt::Debug for SbxCliBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SbxCliBuilder")
            .field("sbx_path", &self.sbx_path)
            .field("command_timeout", &self.command_timeout)
            .field("create_timeout", &self.create_timeout)
            .field("no_telemetry", &self.no_telemetry)
            .finish_non_exhaustive()
    }
}

impl SbxCliBuilder {
    /// The environment of management calls (default: a snapshot of this process's environment
    /// taken by [`SbxCliBuilder::build`]). Include `PATH` when the `sbx` path is a bare name.
    pub fn management_env<I, N, V>(mut self, entries: I) -> Self
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<OsString>,
        V: Into<OsString>,
    {
        self.management_env = Some(
            entries
                .into_iter()
                .map(|(n, v)| (n.into(), v.into()))
                .collect(),
        );
        self
    }

    /// Bound of every call but `create` and `exec` (default [`DEFAULT_COMMAND_TIMEOUT`]).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Bound of `create` (default [`DEFAULT_CREATE_TIMEOUT`]).
    pub fn create_timeout(mut self, timeout: Duration) -> Self {
        self.create_timeout = timeout;
        self
    }

    /// Whether every `sbx` child gets `SBX_NO_TELEMETRY=1` (default `true`).
    pub fn no_telemetry(mut self, on: bool) -> Self {
        self.no_telemetry = on;
        self
    }

    /// Checks the configuration and builds the driver. Nothing runs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the `sbx` path is empty or a timeout is zero.
    pub fn build(self) -> Result<SbxCli, Error> {
        if self.sbx_path.as_os_str().is_empty() {
            return Err(Error::invalid_argument("sbx_path", "it is empty"));
        }
        for (what, timeout) in [
            ("command_timeout", self.command_timeout),
            ("create_timeout", self.create_timeout),
        ] {
            if timeout.is_zero() {
                return Err(Error::invalid_argument(
                    what,
                    "it must be greater than zero",
                ));
            }
        }
        let mut management_env = self
            .management_env
            .unwrap_or_else(|| std::env::vars_os().collect());
        // The filter applies to the caller's entries; the telemetry switch is this driver's own.
        let mut guest_env: EnvList = management_env
            .iter()
            .filter(|(name, _)| (self.guest_env_allowed)(name))
            .cloned()
            .collect();
        if self.no_telemetry {
            for env in [&mut management_env, &mut guest_env] {
                env.retain(|(name, _)| !name.eq_ignore_ascii_case(NO_TELEMETRY_VAR));
                env.push((NO_TELEMETRY_VAR.into(), "1".into()));
            }
        }
        Ok(SbxCli {
            config: Arc::new(DriverConfig {
                program: program_path(&self.sbx_path),
                sbx_path: self.sbx_path,
                management_env,
                guest_env,
                command_timeout: self.command_timeout,
                create_timeout: self.create_timeout,
                no_telemetry: self.no_telemetry,
            }),
        })
    }
}

/// The program the runner starts for `sbx_path`.
///
/// On Windows a path without an extension gets `.exe`, so `sbx` (or `C:\tools\sbx`) starts
/// `sbx.exe`, searched on the management environment's `PATH` when it is a bare name; a path
/// with any extension is used as given. Elsewhere the path is used as given.
fn program_path(sbx_path: &Path) -> OsString {
    program_for(sbx_path, cfg!(windows))
}

/// [`program_path`] with the platform as an argument, so both rules are tested on every host.
fn program_for(sbx_path: &Path, windows: bool) -> OsString {
    if windows && sbx_path.extension().is_none() {
        return sbx_path.with_extension("exe").into_os_string();
    }
    sbx_path.as_os_str().to_owned()
}

/// Which environment a call gets.
#[derive(Clone, Copy)]
enum CallEnv {
    /// The management environment: calls that start no guest program.
    Management,
    /// The management environment through the guest filter: `exec`.
    Guest,
}

/// Everything one invocation needs beyond its argv.
struct Invocation {
    call: Call,
    env: CallEnv,
    timeout: Duration,
    deadline: Option<Instant>,
    budget: usize,
    stdin: Option<Vec<u8>>,
}

impl Invocation {
    fn management(call: Call, timeout: Duration, budget: usize) -> Self {
        Invocation {
            call,
            env: CallEnv::Management,
            timeout,
            deadline: None,
            budget,
            stdin: None,
        }
    }
}

/// Who a command runs as in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExecUser {
    /// The sandbox's default user.
    #[default]
    Default,
    /// root (`-u root`).
    Root,
}

/// One `sbx exec`: the sandbox, the command line, who runs it, its stdin, and the caller's
/// deadline and output budget.
#[derive(Clone)]
pub struct ExecRequest {
    name: SbxName,
    argv: Vec<OsString>,
    user: ExecUser,
    stdin: Option<Vec<u8>>,
    deadline: Instant,
    output_budget: usize,
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecRequest")
            .field("name", &self.name)
            .field("argv", &self.argv)
            .field("user", &self.user)
            .field("stdin_len", &self.stdin.as_ref().map(Vec::len))
            .field("deadline", &self.deadline)
            .field("output_budget", &self.output_budget)
            .finish()
    }
}

impl ExecRequest {
    /// Runs `argv` in sandbox `name` as its default user, stdin closed, with the default budget
    /// ([`DEFAULT_EXEC_OUTPUT_BUDGET`]), until `deadline`.
    pub fn new<I, A>(name: SbxName, argv: I, deadline: Instant) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        ExecRequest {
            name,
            argv: argv.into_iter().map(Into::into).collect(),
            user: ExecUser::Default,
            stdin: None,
            deadline,
            output_budget: DEFAULT_EXEC_OUTPUT_BUDGET,
        }
    }

    /// Runs it as root (`-u root`).
    pub fn as_root(mut self) -> Self {
        self.user = ExecUser::Root;
        self
    }

    /// Who runs it.
    pub fn user(mut self, user: ExecUser) -> Self {
        self.user = user;
        self
    }

    /// Feeds these bytes to the command's stdin (`-i`), then closes it.
    pub fn stdin(mut self, bytes: Vec<u8>) -> Self {
        self.stdin = Some(bytes);
        self
    }

    /// The combined stdout + stderr budget, in bytes.
    pub fn output_budget(mut self, bytes: usize) -> Self {
        self.output_budget = bytes;
        self
    }

    /// The sandbox.
    pub fn name(&self) -> &SbxName {
        &self.name
    }

    /// The `sbx` arguments, after the program name.
    fn sbx_args(&self) -> Result<Vec<OsString>, Error> {
        check_exec_argv(&self.argv)?;
        let mut args: Vec<OsString> = vec!["exec".into()];
        if self.stdin.is_some() {
            args.push("-i".into());
        }
        if self.user == ExecUser::Root {
            args.extend(["-u".into(), "root".into()]);
        }
        args.push(self.name.as_str().into());
        args.extend(self.argv.iter().cloned());
        Ok(args)
    }
}

/// Refuses a command line `sbx exec` would misread: empty, an option where the program goes, an
/// empty argument (which `sbx` refuses), or a NUL (which no argument can carry).
fn check_exec_argv(argv: &[OsString]) -> Result<(), Error> {
    let Some(program) = argv.first() else {
        return Err(Error::invalid_argument("command", "it is empty"));
    };
    if program.to_string_lossy().starts_with('-') {
        return Err(Error::invalid_argument(
            "command",
            format!("the program {program:?} starts with `-`, which sbx would read as an option"),
        ));
    }
    for (index, arg) in argv.iter().enumerate() {
        if arg.is_empty() {
            return Err(Error::invalid_argument(
                "command",
                format!("argument {index} is empty, which sbx refuses"),
            ));
        }
        if arg.to_string_lossy().contains('\0') {
            return Err(Error::invalid_argument(
                "command",
                format!("argument {index} contains a NUL byte"),
            ));
        }
    }
    Ok(())
}

/// Refuses free text that would reach `sbx` as an argument but could be read as an option or
/// cannot be carried at all.
fn check_word(what: &'static str, word: &str) -> Result<(), Error> {
    if word.is_empty() {
        return Err(Error::invalid_argument(what, "it is empty"));
    }
    if word.starts_with('-') {
        return Err(Error::invalid_argument(
            what,
            format!("{word:?} starts with `-`, which sbx would read as an option"),
        ));
    }
    if word.contains('\0') || word.chars().any(char::is_whitespace) {
        return Err(Error::invalid_argument(
            what,
            format!("{word:?} contains whitespace or a NUL byte"),
        ));
    }
    Ok(())
}

/// One `sbx create shell`: always `--skills off --deny-network **` (no network until a policy
/// opens it), with explicit CPUs and memory.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    name: SbxName,
    workspace: PathBuf,
    cpus: NonZeroU32,
    memory: MemorySize,
    template: Option<String>,
    deadline: Option<Instant>,
}

impl CreateRequest {
    /// Creates sandbox `name` mounting the absolute host directory `workspace`.
    pub fn new(
        name: SbxName,
        workspace: impl Into<PathBuf>,
        cpus: NonZeroU32,
        memory: MemorySize,
    ) -> Self {
        CreateRequest {
            name,
            workspace: workspace.into(),
            cpus,
            memory,
            template: None,
            deadline: None,
        }
    }

    /// From this template image (an image id or reference) instead of `sbx`'s default.
    pub fn template(mut self, template: impl Into<String>) -> Self {
        self.template = Some(template.into());
        self
    }

    /// Ends the call at `deadline` if that comes before the configured create timeout.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The sandbox.
    pub fn name(&self) -> &SbxName {
        &self.name
    }

    fn sbx_args(&self) -> Result<Vec<OsString>, Error> {
        if !self.workspace.is_absolute() {
            return Err(Error::invalid_argument(
                "workspace",
                format!("{} is not an absolute path", self.workspace.display()),
            ));
        }
        let mut args: Vec<OsString> = [
            "create",
            "shell",
            "--name",
            self.name.as_str(),
            "--cpus",
            &self.cpus.to_string(),
            "--memory",
            self.memory.as_str(),
            "--skills",
            "off",
            "--deny-network",
            "**",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if let Some(template) = &self.template {
            check_word("template", template)?;
            args.extend(["--template".into(), template.into()]);
        }
        args.push(self.workspace.clone().into_os_string());
        Ok(args)
    }
}

/// What `rm` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removal {
    /// The sandbox existed and was removed.
    Removed,
    /// `sbx` knew no sandbox of that name: it is gone either way.
    WasAbsent,
}

impl SbxCli {
    /// Starts building a driver for the `sbx` program at `sbx_path` (a bare name is searched on
    /// the management environment's `PATH`). `guest_env_allowed` decides which management
    /// environment names reach `sbx exec` calls.
    pub fn builder<F>(sbx_path: impl Into<PathBuf>, guest_env_allowed: F) -> SbxCliBuilder
    where
        F: Fn(&OsStr) -> bool + Send + Sync + 'static,
    {
        SbxCliBuilder {
            sbx_path: sbx_path.into(),
            guest_env_allowed: Arc::new(guest_env_allowed),
            management_env: None,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
            no_telemetry: true,
        }
    }

    /// The configured `sbx` path, as given.
    pub fn sbx_path(&self) -> &Path {
        &self.config.sbx_path
    }

    /// The bound of every call but `create` and `exec`.
    pub fn command_timeout(&self) -> Duration {
        self.config.command_timeout
    }

    /// The bound of `create`.
    pub fn create_timeout(&self) -> Duration {
        self.config.create_timeout
    }

    /// The environment of management calls.
    pub fn management_env(&self) -> &[(OsString, OsString)] {
        &self.config.management_env
    }

    /// The environment of `exec` calls: the management environment through the guest filter.
    pub fn guest_env(&self) -> &[(OsString, OsString)] {
        &self.config.guest_env
    }

    /// Runs one invocation through the bounded runner.
    async fn invoke(&self, args: Vec<OsString>, inv: Invocation) -> Result<RunOutput, Error> {
        let call = inv.call;
        self.bounded(args, inv)
            .run()
            .await
            .map_err(|err| Error::from_runner(call, &self.config.sbx_path, err))
    }

    /// The bounded command of one invocation: its environment, deadline, budget and stdin.
    fn bounded(&self, args: Vec<OsString>, inv: Invocation) -> BoundedCommand {
        let config = &self.config;
        let env = match inv.env {
            CallEnv::Management => &config.management_env,
            CallEnv::Guest => &config.guest_env,
        };
        let now = Instant::now();
        // The earlier of the caller's deadline and this call's own bound (none when the bound
        // is past what the clock can represent).
        let deadline = match (inv.deadline, now.checked_add(inv.timeout)) {
            (Some(theirs), Some(ours)) => Some(theirs.min(ours)),
            (theirs, ours) => theirs.or(ours),
        };
        let bound = deadline.map_or(inv.timeout, |at| at.saturating_duration_since(now));
        let mut command = BoundedCommand::new(config.program.clone(), bound)
            .args(args)
            .envs(env.iter().cloned())
            .output_budget(inv.budget);
        if let Some(deadline) = deadline {
            command = command.deadline(deadline);
        }
        if let Some(bytes) = inv.stdin {
            command = command.stdin(bytes);
        }
        command
    }

    /// Runs a management call and requires exit 0.
    async fn management_ok(
        &self,
        call: Call,
        name: Option<&SbxName>,
        args: Vec<OsString>,
        budget: usize,
    ) -> Result<RunOutput, Error> {
        let output = self
            .invoke(
                args,
                Invocation::management(call, self.config.command_timeout, budget),
            )
            .await?;
        require_success(call, name, output)
    }

    /// `sbx version`: the trimmed version text (it names `sbx-sim` when the stand-in answers).
    ///
    /// # Errors
    ///
    /// A classified failure ([`Error::LoginRequired`], [`Error::DaemonFault`], [`Error::Failed`],
    /// …), [`Error::Timeout`], [`Error::OutputLimit`] (64 KiB), [`Error::SpawnFailed`],
    /// [`Error::Io`].
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the `sbx` process (its whole process group) and reaps it in the
    /// background; nothing is left running. No state is kept, so a call can simply be repeated.
    pub async fn version(&self) -> Result<String, Error> {
        let output = self
            .management_ok(Call::Version, None, args(["version"]), SMALL_OUTPUT_BUDGET)
            .await?;
        Ok(trimmed_text(&output.stdout))
    }

    /// `sbx settings get <key>`: the trimmed value.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `key` is empty, starts with `-` or holds whitespace;
    /// otherwise as [`SbxCli::version`].
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`]; settings are only read.
    pub async fn settings_get(&self, key: &str) -> Result<String, Error> {
        check_word("settings key", key)?;
        let output = self
            .management_ok(
                Call::SettingsGet,
                None,
                args(["settings", "get", key]),
                SMALL_OUTPUT_BUDGET,
            )
            .await?;
        Ok(trimmed_text(&output.stdout))
    }

    /// `sbx mcp ls --json`: every registered MCP server.
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for an unrecognised shape; otherwise as [`SbxCli::version`] (budget
    /// 8 MiB).
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn mcp_ls(&self) -> Result<Vec<McpServer>, Error> {
        let output = self
            .management_ok(
                Call::McpLs,
                None,
                args(["mcp", "ls", "--json"]),
                LISTING_OUTPUT_BUDGET,
            )
            .await?;
        parse_mcp_ls(&output.stdout)
    }

    /// `sbx ls --json`: every sandbox `sbx` lists, bounded by the command timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for an unrecognised shape (never an empty list); otherwise as
    /// [`SbxCli::version`] (budget 8 MiB).
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn ls(&self) -> Result<Vec<LsRow>, Error> {
        self.ls_with_deadline(None).await
    }

    /// [`SbxCli::ls`] ending at `deadline` when that comes before the command timeout (a caller
    /// polling within its own bound).
    ///
    /// # Errors
    ///
    /// As [`SbxCli::ls`].
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn ls_within(&self, deadline: Instant) -> Result<Vec<LsRow>, Error> {
        self.ls_with_deadline(Some(deadline)).await
    }

    async fn ls_with_deadline(&self, deadline: Option<Instant>) -> Result<Vec<LsRow>, Error> {
        let call = Call::Ls;
        let mut inv =
            Invocation::management(call, self.config.command_timeout, LISTING_OUTPUT_BUDGET);
        inv.deadline = deadline;
        let output = self.invoke(args(["ls", "--json"]), inv).await?;
        let output = require_success(call, None, output)?;
        parse_ls(&output.stdout)
    }

    /// `sbx create shell --name … --cpus … --memory … --skills off --deny-network ** [--template
    /// …] <workspace>`, bounded by the create timeout (or the request's earlier deadline).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the workspace is not absolute or the template could be
    /// read as an option; [`Error::AlreadyExists`] when another process created the name first;
    /// [`Error::TemplateCannotStart`]; otherwise as [`SbxCli::version`] (budget 1 MiB).
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the `sbx` client, but `sbx`'s daemon may still finish the
    /// create: after an abandoned create, poll [`SbxCli::ls`] before assuming the name is free.
    pub async fn create(&self, request: &CreateRequest) -> Result<(), Error> {
        let call = Call::Create;
        let mut inv =
            Invocation::management(call, self.config.create_timeout, CREATE_OUTPUT_BUDGET);
        inv.deadline = request.deadline;
        let output = self.invoke(request.sbx_args()?, inv).await?;
        require_success(call, Some(&request.name), output).map(drop)
    }

    /// `sbx exec [-i] [-u root] <name> <argv…>` with the guest environment, until the request's
    /// deadline, within its output budget. Returns the raw output whatever the exit status: the
    /// status may be the command's own (read it with the exec wrapper's nonce protocol).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty command line, an empty argument, a NUL, or a
    /// program starting with `-`; [`Error::Timeout`] when the caller's deadline passes (the
    /// bound it reports is the time that was left); [`Error::OutputLimit`];
    /// [`Error::SpawnFailed`]; [`Error::Io`]. A non-zero exit is not an error here: see
    /// [`SbxCli::exec_checked`] and [`classify_output`].
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the `sbx` client and reaps it in the background. The guest
    /// command may outlive its client inside the sandbox; ending it is the caller's job (the
    /// exec wrapper's kill script).
    pub async fn exec(&self, request: &ExecRequest) -> Result<RunOutput, Error> {
        let inv = Invocation {
            call: Call::Exec,
            env: CallEnv::Guest,
            timeout: request.deadline.saturating_duration_since(Instant::now()),
            deadline: Some(request.deadline),
            budget: request.output_budget,
            stdin: request.stdin.clone(),
        };
        self.invoke(request.sbx_args()?, inv).await
    }

    /// `sbx exec -i <name> <argv…>` with the command's output handed to `sink` as it arrives and
    /// `stdin` (when given; else the request's bytes, if any) copied to the command as fast as it
    /// reads. Every guarantee of [`SbxCli::exec`] holds: the request's deadline, its output budget
    /// over everything the sink was handed, and the `sbx` client's process tree killed and reaped
    /// on every early exit, the sink's own refusal and its [`OutputSink::abandoned`] included.
    ///
    /// # Errors
    ///
    /// As [`SbxCli::exec`]; the sink's error or an abandoned sink is [`Error::Io`] carrying the
    /// runner's error.
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::exec`].
    pub async fn exec_streaming(
        &self,
        request: &ExecRequest,
        stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
        sink: &mut impl OutputSink,
    ) -> Result<ExitKind, Error> {
        let mut args = request.sbx_args()?;
        if stdin.is_some() && request.stdin.is_none() {
            // `exec` then `-i`: the same place sbx_args puts it for bytes.
            args.insert(1, "-i".into());
        }
        let inv = Invocation {
            call: Call::Exec,
            env: CallEnv::Guest,
            timeout: request.deadline.saturating_duration_since(Instant::now()),
            deadline: Some(request.deadline),
            budget: request.output_budget,
            stdin: request.stdin.clone(),
        };
        let mut command = self.bounded(args, inv);
        if let Some(reader) = stdin {
            command = command.stdin_reader(reader);
        }
        command
            .run_streaming(sink)
            .await
            .map_err(|err| Error::from_runner(Call::Exec, &self.config.sbx_path, err))
    }

    /// [`SbxCli::exec`] that requires exit 0 and classifies any other status from its stderr
    /// (`not found` → [`Error::NotFound`]). For the driver's own short probes, whose exit status
    /// is `sbx`'s when it is not 0.
    ///
    /// # Errors
    ///
    /// As [`SbxCli::exec`], plus the classified failure of a non-zero exit.
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::exec`].
    pub async fn exec_checked(&self, request: &ExecRequest) -> Result<RunOutput, Error> {
        let output = self.exec(request).await?;
        require_success(Call::Exec, Some(&request.name), output)
    }

    /// `sbx rm --force <name>`: removes the sandbox (never its host workspace).
    ///
    /// # Errors
    ///
    /// A classified failure other than "not found", which is [`Removal::WasAbsent`]; otherwise
    /// as [`SbxCli::version`].
    ///
    /// # Cancel safety and drop
    ///
    /// Dropping the future kills the client; the removal may or may not have happened, and
    /// repeating it is safe.
    pub async fn rm(&self, name: &SbxName) -> Result<Removal, Error> {
        match self
            .management_ok(
                Call::Rm,
                Some(name),
                args(["rm", "--force", name.as_str()]),
                SMALL_OUTPUT_BUDGET,
            )
            .await
        {
            Ok(_) => Ok(Removal::Removed),
            Err(Error::NotFound { .. }) => Ok(Removal::WasAbsent),
            Err(err) => Err(err),
        }
    }

    /// `sbx secret ls --json`: names and scopes of the stored secrets (never values).
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for an unrecognised shape; otherwise as [`SbxCli::version`] (budget
    /// 8 MiB).
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn secret_ls(&self) -> Result<SecretList, Error> {
        let output = self
            .management_ok(
                Call::SecretLs,
                None,
                args(["secret", "ls", "--json"]),
                LISTING_OUTPUT_BUDGET,
            )
            .await?;
        parse_secret_ls(&output.stdout)
    }

    /// `sbx policy ls [<name>] --json`: every policy rule, or those listed for one sandbox.
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for an unrecognised shape; otherwise as [`SbxCli::version`] (budget
    /// 8 MiB).
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn policy_ls(&self, name: Option<&SbxName>) -> Result<PolicyList, Error> {
        let mut argv = args(["policy", "ls"]);
        if let Some(name) = name {
            argv.push(name.as_str().into());
        }
        argv.push("--json".into());
        let output = self
            .management_ok(Call::PolicyLs, name, argv, LISTING_OUTPUT_BUDGET)
            .await?;
        parse_policy_ls(&output.stdout)
    }

    /// `sbx policy check network --json <host>`: whether the current policy lets sandboxes
    /// reach `host`. Exit 0 must say allowed, exit 1 denied.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a host that is empty, starts with `-` or holds whitespace;
    /// [`Error::Malformed`] when the answer disagrees with the exit status or has an
    /// unrecognised shape; a classified failure for any other exit, or for exit 1 without a
    /// readable answer; otherwise as [`SbxCli::version`].
    ///
    /// # Cancel safety and drop
    ///
    /// As [`SbxCli::version`].
    pub async fn policy_check_network(&self, host: &str) -> Result<PolicyCheck, Error> {
        check_word("host", host)?;
        let call = Call::PolicyCheck;
        let output = self
            .invoke(
                args(["policy", "check", "network", "--json", host]),
                Invocation::management(call, self.config.command_timeout, LISTING_OUTPUT_BUDGET),
            )
            .await?;
        interpret_policy_check(output)
    }
}

/// Reads a `policy check` run: exit 0 with `allowed: true`, or exit 1 with `allowed: false`.
fn interpret_policy_check(output: RunOutput) -> Result<PolicyCheck, Error> {
    let call = Call::PolicyCheck;
    match output.status {
        ExitKind::Exited(0) => {
            let check = parse_policy_check(&output.stdout)?;
            if check.allowed {
                Ok(check)
            } else {
                Err(Error::malformed(call, "exit 0 but `allowed` is false"))
            }
        }
        ExitKind::Exited(1) => match parse_policy_check(&output.stdout) {
            Ok(check) if !check.allowed => Ok(check),
            Ok(_) => Err(Error::malformed(call, "exit 1 but `allowed` is true")),
            // Exit 1 without an answer is the call failing, not a denial.
            Err(_) => Err(classify_output(call, None, output.status, &output.stderr)),
        },
        status => Err(classify_output(call, None, status, &output.stderr)),
    }
}

/// Exit 0, or the classified failure.
fn require_success(
    call: Call,
    name: Option<&SbxName>,
    output: RunOutput,
) -> Result<RunOutput, Error> {
    if output.status == ExitKind::Exited(0) {
        Ok(output)
    } else {
        Err(classify_output(
            call,
            name.map(SbxName::as_str),
            output.status,
            &output.stderr,
        ))
    }
}

fn args<const N: usize>(words: [&str; N]) -> Vec<OsString> {
    words.into_iter().map(OsString::from).collect()
}

fn trimmed_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_adds_exe_only_to_a_path_without_extension() {
        let cases = [
            ("sbx", "sbx.exe", "sbx"),
            ("tools/sbx", "tools/sbx.exe", "tools/sbx"),
            ("sbx.exe", "sbx.exe", "sbx.exe"),
            ("sbx.cmd", "sbx.cmd", "sbx.cmd"),
            ("my.tools/sbx", "my.tools/sbx.exe", "my.tools/sbx"),
        ];
        for (given, on_windows, elsewhere) in cases {
            assert_eq!(
                program_for(Path::new(given), true),
                OsString::from(on_windows)
            );
            assert_eq!(
                program_for(Path::new(given), false),
                OsString::from(elsewhere)
            );
        }
    }

    #[test]
    fn exec_argv_puts_options_before_the_name() {
        let name = SbxName::new("maf-1").unwrap();
        let deadline = Instant::now();
        let plain = ExecRequest::new(name.clone(), ["sh", "-c", ":"], deadline);
        assert_eq!(
            plain.sbx_args().unwrap(),
            args(["exec", "maf-1", "sh", "-c", ":"])
        );
        let all = plain.clone().as_root().stdin(b"x".to_vec());
        assert_eq!(
            all.sbx_args().unwrap(),
            args(["exec", "-i", "-u", "root", "maf-1", "sh", "-c", ":"])
        );
        // Arguments after the program may look like options: they belong to the command.
        let dashes = ExecRequest::new(name, ["ls", "-la", "--", "-u"], deadline);
        assert_eq!(
            dashes.sbx_args().unwrap(),
            args(["exec", "maf-1", "ls", "-la", "--", "-u"])
        );
    }
}
