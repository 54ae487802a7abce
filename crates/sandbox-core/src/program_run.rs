//! The program channel: a program (today a Python one, profile `python-portable-v1`) run in a
//! sandbox with the host's tools, its declared output files collected.
//!
//! The run checks the guest's interpreter first (CPython 3.11 or later, else a typed refusal
//! before anything is written), then runs as [`run_with_host_tools`](crate::host_tool_run)
//! does, with the run directory holding the program, the tools' Python module (generated from
//! their schemas, `import host_tools`) and an `outputs` directory ([`OUTPUTS_ENV`] names it)
//! where the program writes the files it declared. Those are read back once the program ends,
//! before the relay removes the directory: nothing of the run stays in the guest.
//!
//! Everything goes through execs, as the guest's user: the program and the module reach the run
//! directory on the launching interpreter's stdin, and the outputs come back on a collecting
//! interpreter's stdout. So it needs nothing of a backend's file plane, whose reach differs
//! (sbx's reaches its workspace only), and the program's files are its user's.
//!
//! The module is the program's convenience, never a control: every call is checked on the
//! host, whatever the program sends.

use std::collections::BTreeMap;
use std::time::Duration;

use host_tools::python_client::python_module;
use host_tools::{RunBounds, RunReport, RunTools};

use crate::host_tool_run::{run_staged, Staging};
use crate::wire::{wire_enum, wire_from_str};
use crate::{Command, ExecEnv, ExecOutput, ExecRequest, ExecStdin, Sandbox, SandboxError};

wire_enum! {
    /// What a program is and how the guest runs it.
    #[non_exhaustive]
    pub enum ProgramProfile ("program profile") {
        /// A Python program run by the guest's CPython, 3.11 or later, with the standard
        /// library only; it imports the run's tools as `host_tools`.
        PythonPortableV1 => "python-portable-v1",
    }
}
wire_from_str!(ProgramProfile, "program profile");

/// The program's file name in the run directory.
pub const PROGRAM_FILE: &str = "program.py";
/// The environment variable naming the directory the program writes its outputs into.
pub const OUTPUTS_ENV: &str = "PROGRAM_OUTPUTS";
/// The oldest CPython `python-portable-v1` runs on.
pub const MIN_PYTHON: (u32, u32) = (3, 11);
/// The most outputs one program may declare.
pub const MAX_OUTPUTS: usize = 64;
/// The longest output name.
pub const MAX_OUTPUT_NAME: usize = 128;
/// The largest program source.
pub const MAX_SOURCE_BYTES: usize = 4 * 1024 * 1024;
/// The default cap on one collected output file.
pub const DEFAULT_MAX_OUTPUT_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The output directory's name in the run directory.
const OUTPUTS_DIR: &str = "outputs";
/// The interpreter check's bound.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// The output collection's bound.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(120);
/// What the interpreter check prints: implementation, major, minor.
const PROBE: &str =
    "import sys; print(sys.implementation.name, sys.version_info[0], sys.version_info[1])";
/// Reads the program and the module from stdin (`argv[2]` bytes of program, the rest module),
/// writes them into the run directory (`argv[1]`) as new files, makes the private output
/// directory, then becomes the program (`-B`: no bytecode written beside it). A failure here
/// exits 1 with a line starting `program-channel:`.
const LAUNCH: &str = r#"import os, sys
directory, size = sys.argv[1], int(sys.argv[2])
try:
    data = sys.stdin.buffer.read()
    if len(data) < size:
        raise OSError("the program arrived short")
    for name, body in (("program.py", data[:size]), ("host_tools.py", data[size:])):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(os.path.join(directory, name), flags, 0o600), "wb") as file:
            file.write(body)
    os.mkdir(os.path.join(directory, "outputs"), 0o700)
except OSError as error:
    sys.exit(f"program-channel: staging the program failed: {error}")
program = os.path.join(directory, "program.py")
os.execv(sys.executable or "/usr/bin/python3", ["python3", "-B", program])
"#;
/// Prints each declared output (`argv[3..]`) of the output directory (`argv[1]`) under the cap
/// (`argv[2]`) as a record: `ok LEN NAME\n` and its bytes, or `missing|not-regular|too-large|
/// unreadable 0 NAME\n`. A link is not followed (it is `not-regular`).
const COLLECT: &str = r#"import errno, os, stat, sys
directory, cap = sys.argv[1], int(sys.argv[2])
out = sys.stdout.buffer
for name in sys.argv[3:]:
    def record(status, body=b""):
        out.write(f"{status} {len(body)} {name}\n".encode() + body)
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        record("missing")
        continue
    except OSError as error:
        record("not-regular" if error.errno == errno.ELOOP else "unreadable")
        continue
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            record("not-regular")
            continue
        body = file.read(cap + 1)
    record("too-large") if len(body) > cap else record("ok", body)
out.flush()
"#;
/// Room for one output's record line beyond its bytes: no line is longer than 162 bytes (the
/// longest status, a 20-digit length, a name of [`MAX_OUTPUT_NAME`], two spaces, the newline).
const RECORD_LINE: u64 = 192;
/// The interpreter check's output budget: its answer is one short line.
const PROBE_OUTPUT_BUDGET: u64 = 65_536;

/// A program to run, built with [`ProgramRequest::python`] and its setters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramRequest {
    profile: ProgramProfile,
    source: String,
    outputs: Vec<String>,
    working_directory: String,
    timeout: Duration,
    max_output_bytes: Option<u64>,
    max_output_file_bytes: u64,
    env: ExecEnv,
}

impl ProgramRequest {
    /// A `python-portable-v1` program, run in the storage base with [`ExecRequest`]'s default
    /// timeout and output budget, no outputs declared.
    pub fn python(source: impl Into<String>) -> ProgramRequest {
        ProgramRequest {
            profile: ProgramProfile::PythonPortableV1,
            source: source.into(),
            outputs: Vec::new(),
            working_directory: ".".to_owned(),
            timeout: ExecRequest::DEFAULT_TIMEOUT,
            max_output_bytes: None,
            max_output_file_bytes: DEFAULT_MAX_OUTPUT_FILE_BYTES,
            env: ExecEnv::default(),
        }
    }

    /// Declares an output: a file the program writes as `$PROGRAM_OUTPUTS/NAME`, collected when
    /// it ends. A name is 1 to [`MAX_OUTPUT_NAME`] of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[must_use]
    pub fn output(mut self, name: impl Into<String>) -> ProgramRequest {
        self.outputs.push(name.into());
        self
    }

    /// The program's working directory, as [`ExecRequest::working_directory`].
    #[must_use]
    pub fn working_directory(mut self, wd: impl Into<String>) -> ProgramRequest {
        self.working_directory = wd.into();
        self
    }

    /// The program's bound, as [`ExecRequest::timeout`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> ProgramRequest {
        self.timeout = timeout;
        self
    }

    /// The program's stdout and stderr budget, as [`ExecRequest::max_output_bytes`].
    #[must_use]
    pub fn max_output_bytes(mut self, budget: u64) -> ProgramRequest {
        self.max_output_bytes = Some(budget);
        self
    }

    /// The cap on one collected output file (default [`DEFAULT_MAX_OUTPUT_FILE_BYTES`]); a
    /// larger one is reported as [`SandboxError::TransferCapExceeded`], never truncated.
    #[must_use]
    pub fn max_output_file_bytes(mut self, cap: u64) -> ProgramRequest {
        self.max_output_file_bytes = cap;
        self
    }

    /// The program's environment, as [`ExecRequest::env`].
    #[must_use]
    pub fn env(mut self, env: ExecEnv) -> ProgramRequest {
        self.env = env;
        self
    }

    /// The profile.
    pub fn profile(&self) -> ProgramProfile {
        self.profile
    }

    /// The declared outputs.
    pub fn outputs(&self) -> &[String] {
        &self.outputs
    }

    /// Refuses, before anything runs: a source over [`MAX_SOURCE_BYTES`], a bad or repeated
    /// output name, more than [`MAX_OUTPUTS`], a zero file cap, and whatever
    /// [`ExecRequest::validate`] refuses in the settings.
    ///
    /// # Errors
    /// [`SandboxError::InvalidArgument`] naming the first problem.
    pub fn validate(&self) -> Result<(), SandboxError> {
        if self.source.len() > MAX_SOURCE_BYTES {
            return Err(SandboxError::invalid(format!(
                "the program is {} bytes, over {MAX_SOURCE_BYTES}",
                self.source.len()
            )));
        }
        if self.outputs.len() > MAX_OUTPUTS {
            return Err(SandboxError::invalid(format!(
                "{} outputs declared, over {MAX_OUTPUTS}",
                self.outputs.len()
            )));
        }
        for (index, name) in self.outputs.iter().enumerate() {
            if !output_name(name) {
                return Err(SandboxError::invalid(format!(
                    "output name {name:?}: 1 to {MAX_OUTPUT_NAME} of A-Z a-z 0-9 . _ -, \
                     not . or .."
                )));
            }
            if self.outputs[..index].contains(name) {
                return Err(SandboxError::invalid(format!(
                    "output {name:?} is declared twice"
                )));
            }
        }
        if self.max_output_file_bytes == 0 {
            return Err(SandboxError::invalid(
                "max_output_file_bytes must be greater than zero",
            ));
        }
        self.exec_request(Command::argv(["python3"])).validate()
    }

    fn exec_request(&self, command: Command) -> ExecRequest {
        let request = ExecRequest::new(command)
            .working_directory(self.working_directory.clone())
            .timeout(self.timeout)
            .env(self.env.clone());
        match self.max_output_bytes {
            Some(budget) => request.max_output_bytes(budget),
            None => request,
        }
    }
}

/// Whether `name` may name an output file: one plain component.
fn output_name(name: &str) -> bool {
    (1..=MAX_OUTPUT_NAME).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What a program run produced.
#[derive(Debug)]
#[non_exhaustive]
pub struct ProgramRun {
    /// The program's output, exactly as a plain exec of it would give it.
    pub output: ExecOutput,
    /// Each declared output: its bytes, or why it could not be collected
    /// ([`SandboxError::NotFound`] when the program did not write it).
    pub outputs: BTreeMap<String, Result<Vec<u8>, SandboxError>>,
    /// The calls the run served.
    pub report: RunReport,
    /// Why the channel ended before the program did, if it did.
    pub channel_error: Option<String>,
}

/// Runs `program` in `sandbox` with `tools` and `bounds`, then collects its declared outputs.
///
/// # Errors
/// [`SandboxError::InvalidArgument`] for a request [`ProgramRequest::validate`] refuses;
/// [`SandboxError::CapabilityNotSupported`] when the guest has no CPython
/// [`MIN_PYTHON`] or later, or no `host-tool` program; the run's own errors as
/// [`run_with_host_tools`](crate::host_tool_run::run_with_host_tools) returns them.
///
/// # Cancel safety and drop
/// As [`run_with_host_tools`](crate::host_tool_run::run_with_host_tools): dropping the future
/// drops every pending tool call at once and kills the program; the relay removes the run
/// directory (program and outputs with it) when drained a few seconds later.
pub async fn run_program<S: Sandbox + ?Sized>(
    sandbox: &S,
    program: &ProgramRequest,
    tools: &RunTools,
    bounds: &RunBounds,
) -> Result<ProgramRun, SandboxError> {
    program.validate()?;
    match program.profile {
        ProgramProfile::PythonPortableV1 => check_python(sandbox, program).await?,
    }
    let source = program.source.as_bytes();
    let mut stdin = Vec::with_capacity(source.len() + 64 * 1024);
    stdin.extend_from_slice(source);
    stdin.extend_from_slice(python_module(tools, bounds.max_frame_payload()).as_bytes());
    let collect_budget = (program.max_output_file_bytes.saturating_add(RECORD_LINE))
        .saturating_mul(program.outputs.len() as u64)
        .max(1);
    let staging = Staging {
        command: |directory: &str| {
            let size = source.len().to_string();
            let request =
                program.exec_request(Command::argv(["python3", "-c", LAUNCH, directory, &size]));
            let env = request
                .guest_env()
                .clone()
                .set(OUTPUTS_ENV, format!("{directory}/{OUTPUTS_DIR}"));
            (request.env(env), ExecStdin::Bytes(stdin))
        },
        after: (!program.outputs.is_empty()).then_some(|directory: &str| {
            let cap = program.max_output_file_bytes.to_string();
            let outputs = format!("{directory}/{OUTPUTS_DIR}");
            let mut argv = vec!["python3", "-c", COLLECT, &outputs, &cap];
            argv.extend(program.outputs.iter().map(String::as_str));
            ExecRequest::new(Command::argv(argv))
                .working_directory(program.working_directory.clone())
                .timeout(COLLECT_TIMEOUT)
                .max_output_bytes(collect_budget)
        }),
    };
    let staged = run_staged(
        sandbox,
        (&program.working_directory, program.timeout),
        tools,
        bounds,
        staging,
    )
    .await?;
    let outputs = match staged.after {
        None => BTreeMap::new(),
        Some(collected) => collected_outputs(
            collected?,
            &program.outputs,
            &format!("${OUTPUTS_ENV}"),
            program.max_output_file_bytes,
        )?,
    };
    Ok(ProgramRun {
        output: staged.run.output,
        outputs,
        report: staged.run.report,
        channel_error: staged.run.channel_error,
    })
}

/// Each declared output from the collecting interpreter's records, which must name the declared
/// outputs in order, each once; anything else is the guest's refusal.
fn collected_outputs(
    collected: ExecOutput,
    declared: &[String],
    shown_as: &str,
    cap: u64,
) -> Result<BTreeMap<String, Result<Vec<u8>, SandboxError>>, SandboxError> {
    let refused = |detail: String| SandboxError::GuestRefused {
        path: shown_as.to_owned(),
        detail,
    };
    if collected.exit_code != 0 {
        return Err(refused(format!(
            "collecting the outputs exited {}: {}",
            collected.exit_code,
            collected.stderr_text().trim()
        )));
    }
    let mut rest = collected.stdout.as_slice();
    let mut outputs = BTreeMap::new();
    for name in declared {
        let end = rest
            .iter()
            .position(|&byte| byte == b'\n')
            .ok_or_else(|| refused(format!("no record for output {name:?}")))?;
        let line = std::str::from_utf8(&rest[..end])
            .map_err(|_| refused("an output record is not UTF-8".to_owned()))?;
        rest = &rest[end + 1..];
        let mut fields = line.splitn(3, ' ');
        let (status, length, named) = (fields.next(), fields.next(), fields.next());
        let length: usize = length
            .and_then(|length| length.parse().ok())
            .filter(|&length| length as u64 <= cap && length <= rest.len())
            .ok_or_else(|| refused(format!("a malformed output record {line:?}")))?;
        if named != Some(name.as_str()) {
            return Err(refused(format!(
                "the record {line:?} does not name output {name:?}"
            )));
        }
        let path = format!("{shown_as}/{name}");
        let outcome = match status {
            Some("ok") => Ok(rest[..length].to_vec()),
            Some("missing") if length == 0 => Err(SandboxError::NotFound { path }),
            Some("not-regular") if length == 0 => Err(SandboxError::NotRegularFile { path }),
            Some("too-large") if length == 0 => {
                Err(SandboxError::TransferCapExceeded { path, limit: cap })
            }
            Some("unreadable") if length == 0 => Err(SandboxError::GuestRefused {
                path,
                detail: "the program's output could not be opened".to_owned(),
            }),
            _ => return Err(refused(format!("a malformed output record {line:?}"))),
        };
        rest = &rest[length..];
        outputs.insert(name.clone(), outcome);
    }
    if !rest.is_empty() {
        return Err(refused(format!(
            "{} bytes after the last output record",
            rest.len()
        )));
    }
    Ok(outputs)
}

/// Refuses a guest without CPython [`MIN_PYTHON`] or later, naming what it found.
async fn check_python<S: Sandbox + ?Sized>(
    sandbox: &S,
    program: &ProgramRequest,
) -> Result<(), SandboxError> {
    let probe = ExecRequest::new(Command::argv(["python3", "-c", PROBE]))
        .working_directory(program.working_directory.clone())
        .timeout(PROBE_TIMEOUT)
        .max_output_bytes(PROBE_OUTPUT_BUDGET);
    let output = sandbox.exec(probe).await?;
    if output.exit_code != 0 {
        return Err(no_python(format!(
            "python3 did not run (exit {}): {}",
            output.exit_code,
            output.stderr_text().trim()
        )));
    }
    let found = output.stdout_text();
    match parse_probe(&found) {
        Some((name, version)) if name == "cpython" && version >= MIN_PYTHON => Ok(()),
        Some((name, (major, minor))) => Err(no_python(format!(
            "the guest's python3 is {name} {major}.{minor}"
        ))),
        None => Err(no_python(format!(
            "the guest's python3 answered {:?}",
            found.trim()
        ))),
    }
}

/// The probe's line: implementation name and version.
fn parse_probe(line: &str) -> Option<(&str, (u32, u32))> {
    let mut words = line.split_whitespace();
    let name = words.next()?;
    let major = words.next()?.parse().ok()?;
    let minor = words.next()?.parse().ok()?;
    words.next().is_none().then_some((name, (major, minor)))
}

#[cold]
fn no_python(found: String) -> SandboxError {
    SandboxError::CapabilityNotSupported(format!(
        "the {} profile needs CPython {}.{} or later in the sandbox: {found}",
        ProgramProfile::PythonPortableV1,
        MIN_PYTHON.0,
        MIN_PYTHON.1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_are_one_plain_component() {
        for good in ["result.json", "a", "A-b_c.1", &"x".repeat(MAX_OUTPUT_NAME)] {
            assert!(output_name(good), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/a",
            "a b",
            "é",
            "a\0",
            &"x".repeat(MAX_OUTPUT_NAME + 1),
        ] {
            assert!(!output_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_request_is_refused_before_anything_runs() {
        let refused = |request: ProgramRequest| request.validate().unwrap_err().to_string();
        assert!(refused(ProgramRequest::python("").output("a/b")).contains("output name"));
        assert!(refused(ProgramRequest::python("").output("a").output("a")).contains("twice"));
        let mut many = ProgramRequest::python("");
        for index in 0..MAX_OUTPUTS {
            many = many.output(format!("o{index}"));
        }
        many.validate().unwrap();
        assert_eq!(many.outputs().len(), MAX_OUTPUTS);
        assert_eq!(many.outputs()[1], "o1");
        assert!(refused(many.output("one-more")).contains("outputs declared"));
        assert!(
            refused(ProgramRequest::python("x".repeat(MAX_SOURCE_BYTES + 1))).contains("bytes")
        );
        ProgramRequest::python("#".repeat(MAX_SOURCE_BYTES))
            .validate()
            .unwrap();
        assert!(refused(ProgramRequest::python("").max_output_file_bytes(0)).contains("max_output"));
        assert!(refused(ProgramRequest::python("").timeout(Duration::ZERO)).contains("timeout"));
        ProgramRequest::python("print(1)")
            .output("result.json")
            .validate()
            .unwrap();
    }

    #[test]
    fn the_limits_are_the_documented_numbers() {
        assert_eq!(MAX_SOURCE_BYTES, 4_194_304);
        assert_eq!(DEFAULT_MAX_OUTPUT_FILE_BYTES, 16_777_216);
        assert_eq!(MAX_OUTPUTS, 64);
        assert_eq!(MAX_OUTPUT_NAME, 128);
        assert_eq!(MIN_PYTHON, (3, 11));
    }

    #[test]
    fn the_guest_scripts_name_the_files_this_module_names() {
        for name in [
            PROGRAM_FILE,
            host_tools::python_client::MODULE_FILE,
            OUTPUTS_DIR,
        ] {
            assert!(LAUNCH.contains(&format!("\"{name}\"")), "{name}");
        }
    }

    fn output(stdout: &[u8]) -> ExecOutput {
        ExecOutput::exited(stdout.to_vec(), Vec::new(), 0)
    }

    #[test]
    fn collected_records_map_to_outputs_and_anything_else_is_refused() {
        let declared: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).into();
        let records = b"ok 3 a\nxyzmissing 0 b\nnot-regular 0 c\ntoo-large 0 d\nunreadable 0 e\n";
        let outputs = collected_outputs(output(records), &declared, "$O", 8).unwrap();
        assert_eq!(outputs["a"].as_ref().unwrap(), b"xyz");
        let kinds: Vec<_> = ["b", "c", "d", "e"]
            .iter()
            .map(|name| outputs[*name].as_ref().unwrap_err().kind())
            .collect();
        assert_eq!(
            kinds,
            [
                crate::ErrorKind::NotFound,
                crate::ErrorKind::NotRegularFile,
                crate::ErrorKind::TransferCapExceeded,
                crate::ErrorKind::GuestRefused
            ]
        );
        let one = vec!["a".to_owned()];
        for bad in [
            &b""[..],
            b"ok 3 a\nxy",
            b"ok 9 a\n123456789",
            b"ok 3 b\nxyz",
            b"ok 3 a\nxyzextra",
            b"missing 1 a\nx",
            b"not-regular 1 a\nx",
            b"too-large 1 a\nx",
            b"unreadable 1 a\nx",
            b"gone 0 a\n",
            b"ok -1 a\n",
            b"ok 3 a",
        ] {
            let refused = collected_outputs(output(bad), &one, "$O", 8).unwrap_err();
            assert_eq!(refused.kind(), crate::ErrorKind::GuestRefused, "{bad:?}");
        }
        let failed = ExecOutput::exited(Vec::new(), b"boom".to_vec(), 1);
        assert!(collected_outputs(failed, &one, "$O", 8)
            .unwrap_err()
            .to_string()
            .contains("boom"));
    }

    #[test]
    fn the_probe_line_parses_or_is_refused() {
        assert_eq!(parse_probe("cpython 3 11\n"), Some(("cpython", (3, 11))));
        assert_eq!(parse_probe("pypy 3 10"), Some(("pypy", (3, 10))));
        for bad in ["", "cpython 3", "cpython x 11", "cpython 3 11 extra"] {
            assert_eq!(parse_probe(bad), None, "{bad:?}");
        }
        assert!((3, 9) < MIN_PYTHON && (3, 11) >= MIN_PYTHON && (4, 0) > MIN_PYTHON);
        assert_eq!(
            ProgramProfile::PythonPortableV1.as_str(),
            "python-portable-v1"
        );
    }
}
