//! `run_with_host_tools` over a sandbox whose "guest" is this process: the relay of the
//! `host-tools` crate runs in a task on the run's stdin and stdout, and the command is a call
//! through the relay's socket. Pins the run's own ends: a drained relay removes its directory, a
//! dropped run cancels its pending call at once and drains the relay later, a relay that never
//! reports ready and a guest without the program are typed errors.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use host_tools::relay::{call, run_relay, CallOutcome};
use host_tools::{HostTool, Registry, RunBounds};
use sandbox_core::backend_kit::ExecStreamSender;
use sandbox_core::host_tool_run::{run_with_host_tools, HOST_TOOL_PROGRAM, SOCKET_ENV};
use sandbox_core::program_run::{run_program, ProgramRequest, DEFAULT_MAX_OUTPUT_FILE_BYTES};
use sandbox_core::{
    ErrorKind, ExecChunk, ExecExit, ExecOutput, ExecRequest, ExecStdin, ExecStream, Sandbox,
    SandboxEntry, SandboxError,
};
use serde_json::json;
use tokio::io::AsyncReadExt as _;

/// How the in-process guest answers the relay's exec.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Relay {
    /// The relay of `host-tools`, in a task.
    Real,
    /// No such program: exit 127 at once.
    Missing,
    /// A forged relay: reports a socket outside any run directory, then waits for its stdin.
    Forged,
}

#[derive(Debug)]
struct InProcess {
    temp: PathBuf,
    relay: Relay,
    /// What the interpreter check prints instead of asking the host's `python3`.
    python_answer: Option<&'static str>,
    /// The bound of the last relay exec.
    relay_timeout: std::sync::Mutex<Option<Duration>>,
}

impl InProcess {
    /// A guest under `temp` whose relay is `relay` and whose interpreter is the host's.
    fn new(temp: &Path, relay: Relay) -> InProcess {
        InProcess {
            temp: temp.to_owned(),
            relay,
            python_answer: None,
            relay_timeout: Default::default(),
        }
    }
}

/// Runs `argv` on this host with the request's environment and `stdin`, as the guest would.
async fn on_host(argv: &[String], request: &ExecRequest, stdin: &[u8]) -> ExecOutput {
    use tokio::io::AsyncWriteExt as _;
    let mut command = tokio::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in request.guest_env().entries() {
        command.env(name, String::from_utf8_lossy(value).as_ref());
    }
    let mut child = command.spawn().expect("the host command starts");
    let mut feed = child.stdin.take().unwrap();
    feed.write_all(stdin).await.unwrap();
    drop(feed);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the host command ends within 60 s")
        .expect("the host command runs");
    ExecOutput::exited(
        output.stdout,
        output.stderr,
        output.status.code().unwrap_or(-1),
    )
}

async fn pump(mut from: tokio::io::DuplexStream, mut sender: ExecStreamSender) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if sender
                    .send(ExecChunk::Stdout(buffer[..read].to_vec()))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    sender.finish(Ok(ExecExit::exited(0))).await;
}

#[async_trait]
impl Sandbox for InProcess {
    fn instance_id(&self) -> &str {
        "in-process"
    }

    fn freshly_created(&self) -> bool {
        true
    }

    fn storage_base(&self) -> &str {
        "/"
    }

    /// The command: `call TOOL JSON` through the run's socket, or `rm -rf -- DIR`.
    async fn exec(&self, request: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let argv: Vec<String> = request
            .command()
            .to_argv()
            .iter()
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();
        match argv
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["call", tool, arguments] => {
                let socket = request
                    .guest_env()
                    .entries()
                    .iter()
                    .find(|(name, _)| name == SOCKET_ENV)
                    .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
                    .expect("the run names its socket");
                let arguments = serde_json::from_str(arguments).expect("JSON arguments");
                let outcome = call(Path::new(&socket), tool, arguments, 1 << 20)
                    .await
                    .map_err(|error| SandboxError::engine(error.to_string()))?;
                Ok(match outcome {
                    CallOutcome::Result(value) => {
                        ExecOutput::exited(value.to_string().into_bytes(), Vec::new(), 0)
                    }
                    CallOutcome::Failure(code, message) => {
                        ExecOutput::exited(Vec::new(), format!("{code}: {message}").into_bytes(), 1)
                    }
                })
            }
            ["python3", "-c", _] => match self.python_answer {
                Some(answer) => Ok(ExecOutput::exited(answer.into(), Vec::new(), 0)),
                None => Ok(on_host(&argv, &request, b"").await),
            },
            ["python3", "-c", ..] => Ok(on_host(&argv, &request, b"").await),
            ["rm", "-rf", "--", directory] => {
                let _ = std::fs::remove_dir_all(directory);
                Ok(ExecOutput::exited(Vec::new(), Vec::new(), 0))
            }
            other => panic!("unexpected command {other:?}"),
        }
    }

    /// The relay, over the run's stdin and a stream of its stdout.
    async fn exec_stream(
        &self,
        request: ExecRequest,
        stdin: ExecStdin,
    ) -> Result<ExecStream, SandboxError> {
        let argv = request.command().to_argv();
        if argv[0] == b"python3" {
            // The program's launch: its stdin carries the program and the module.
            let ExecStdin::Bytes(bytes) = stdin else {
                panic!("the launch's stdin is bytes");
            };
            let argv: Vec<String> = argv
                .iter()
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect();
            return Ok(ExecStream::from_output(
                on_host(&argv, &request, &bytes).await,
            ));
        }
        assert_eq!(argv[0], HOST_TOOL_PROGRAM.as_bytes());
        *self.relay_timeout.lock().unwrap() = Some(request.timeout_bound());
        let (mut sender, stream) = ExecStream::channel(None);
        if self.relay == Relay::Forged {
            let ExecStdin::Reader(mut reader) = stdin else {
                panic!("the relay's stdin is a reader");
            };
            tokio::spawn(async move {
                let ready = host_tools::Frame::Ready {
                    socket: "/etc/forged/socket".to_owned(),
                };
                let _ = sender.send(ExecChunk::Stdout(ready.encode())).await;
                let mut sink = Vec::new();
                let _ = reader.read_to_end(&mut sink).await;
                sender.finish(Ok(ExecExit::exited(0))).await;
            });
            return Ok(stream);
        }
        if self.relay == Relay::Missing {
            tokio::spawn(async move {
                let _ = sender
                    .send(ExecChunk::Stderr(b"sh: host-tool: not found\n".to_vec()))
                    .await;
                sender.finish(Ok(ExecExit::exited(127))).await;
            });
            return Ok(stream);
        }
        let ExecStdin::Reader(reader) = stdin else {
            panic!("the relay's stdin is a reader");
        };
        let (stdout, from_stdout) = tokio::io::duplex(64 * 1024);
        let parent = self.temp.clone();
        tokio::spawn(async move {
            let _ = run_relay(&parent, 1 << 20, reader, stdout).await;
        });
        tokio::spawn(pump(from_stdout, sender));
        Ok(stream)
    }

    /// No file plane: the program channel goes through execs alone.
    async fn write_file(&self, _: &str, _: &[u8], _: &str) -> Result<(), SandboxError> {
        Err(SandboxError::Unsupported("not here".into()))
    }

    async fn stat_file(&self, _: &str, _: &str) -> Result<Option<SandboxEntry>, SandboxError> {
        Err(SandboxError::Unsupported("not here".into()))
    }

    async fn read_file(&self, _: &str, _: &str, _: u64) -> Result<Vec<u8>, SandboxError> {
        Err(SandboxError::Unsupported("not here".into()))
    }
}

fn run_directories(temp: &Path) -> usize {
    std::fs::read_dir(temp).map_or(0, Iterator::count)
}

fn registry(dropped: Arc<AtomicUsize>, started: Arc<tokio::sync::Notify>) -> Registry {
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let mut registry = Registry::new();
    registry
        .register(
            HostTool::new(
                "echo",
                "returns its arguments",
                json!({}),
                |arguments| async move { Ok(arguments) },
            )
            .unwrap(),
        )
        .unwrap();
    registry
        .register(
            HostTool::new("hang", "never answers", json!({}), move |_| {
                let guard = Counted(dropped.clone());
                let started = started.clone();
                async move {
                    let _guard = guard;
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Ok(json!(null))
                }
            })
            .unwrap(),
        )
        .unwrap();
    registry
}

fn request(argv: &[&str]) -> ExecRequest {
    ExecRequest::new(sandbox_core::Command::argv(argv)).timeout(Duration::from_secs(30))
}

#[tokio::test]
async fn a_call_is_answered_and_the_drained_relay_leaves_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let sandbox = InProcess::new(temp.path(), Relay::Real);
    let registry = registry(Arc::default(), Arc::default());
    let run = run_with_host_tools(
        &sandbox,
        request(&["call", "echo", r#"{"a":[1,"é"]}"#]),
        &registry.all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap();
    assert_eq!(run.output.stdout_text(), r#"{"a":[1,"é"]}"#);
    assert_eq!(run.report.answered, 1);
    // The relay outlives its command: its bound is the command's and a grace for the drain.
    let relay_bound = sandbox
        .relay_timeout
        .lock()
        .unwrap()
        .expect("the relay ran");
    assert!(relay_bound > Duration::from_secs(30), "{relay_bound:?}");
    assert!(run.channel_error.is_none());
    assert_eq!(
        run_directories(temp.path()),
        0,
        "the relay removed its directory"
    );
}

#[tokio::test]
async fn a_dropped_run_cancels_its_pending_call_at_once_and_drains_the_relay_later() {
    let temp = tempfile::tempdir().unwrap();
    let sandbox = InProcess::new(temp.path(), Relay::Real);
    let dropped = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let registry = registry(dropped.clone(), started.clone());
    let tools = registry.all_for_run();
    let bounds = RunBounds::default();
    {
        let run = run_with_host_tools(&sandbox, request(&["call", "hang", "{}"]), &tools, &bounds);
        tokio::pin!(run);
        tokio::select! {
            () = started.notified() => {}
            outcome = &mut run => panic!("the run ended first: {outcome:?}"),
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
    }
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the handler was dropped with the run"
    );
    // The relay stays up while a backend kills the cancelled command, then drains.
    assert_eq!(run_directories(temp.path()), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while run_directories(temp.path()) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancelled run's relay was never drained"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_guest_without_the_program_is_refused_as_unsupported() {
    let temp = tempfile::tempdir().unwrap();
    let sandbox = InProcess::new(temp.path(), Relay::Missing);
    let registry = registry(Arc::default(), Arc::default());
    let error = run_with_host_tools(
        &sandbox,
        request(&["call", "echo", "{}"]),
        &registry.all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
    assert!(error.to_string().contains("exit 127"), "{error}");
}

/// The program channel over the same in-process guest, with the host's own `python3` (3.11 or
/// later) as the guest's: the program imports the generated module, calls a tool, writes its
/// declared outputs; they are collected, a missing one reported, and the run directory (program,
/// module, outputs) is gone afterwards.
#[tokio::test]
async fn a_python_program_calls_tools_and_its_declared_outputs_are_collected() {
    let temp = tempfile::tempdir().unwrap();
    let sandbox = InProcess::new(temp.path(), Relay::Real);
    let registry = registry(Arc::default(), Arc::default());
    let program = ProgramRequest::python(
        r#"import json, os, host_tools
answer = host_tools.echo(word="h\u00e9", n=[1, 2])
out = os.environ["PROGRAM_OUTPUTS"]
open(os.path.join(out, "answer.json"), "w").write(json.dumps(answer, sort_keys=True))
open(os.path.join(out, "blob.bin"), "wb").write(bytes(range(256)))
open(os.path.join(out, "at-cap.bin"), "wb").write(b"c" * int(os.environ["AT_CAP"]))
os.symlink("/etc/passwd", os.path.join(out, "link"))
print("done")
"#,
    )
    .output("answer.json")
    .output("blob.bin")
    .output("never-written")
    .output("at-cap.bin")
    .output("link")
    .env(sandbox_core::ExecEnv::default().set("AT_CAP", DEFAULT_MAX_OUTPUT_FILE_BYTES.to_string()))
    .timeout(Duration::from_secs(30));
    let run = run_program(
        &sandbox,
        &program,
        &registry.all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        (run.output.exit_code, run.output.stdout_text()),
        (0, "done\n".to_owned()),
        "{}",
        run.output.stderr_text()
    );
    assert_eq!(run.report.answered, 1);
    let answer = run.outputs["answer.json"].as_ref().unwrap();
    assert_eq!(answer, br#"{"n": [1, 2], "word": "h\u00e9"}"#);
    assert_eq!(
        run.outputs["blob.bin"].as_ref().unwrap(),
        &(0..=255u8).collect::<Vec<_>>()
    );
    let missing = run.outputs["never-written"].as_ref().unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
    assert_eq!(
        run.outputs["at-cap.bin"].as_ref().map(Vec::len).unwrap(),
        DEFAULT_MAX_OUTPUT_FILE_BYTES as usize,
        "an output at the default cap comes back whole"
    );
    let link = run.outputs["link"].as_ref().unwrap_err();
    assert_eq!(link.kind(), ErrorKind::NotRegularFile, "{link}");
    assert_eq!(run_directories(temp.path()), 0, "nothing of the run stays");

    // Under a smaller cap the same outputs are refused, never truncated.
    let capped = run_program(
        &sandbox,
        &program.clone().max_output_file_bytes(255),
        &registry.all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap();
    let too_large = capped.outputs["blob.bin"].as_ref().unwrap_err();
    assert_eq!(
        too_large.kind(),
        ErrorKind::TransferCapExceeded,
        "{too_large}"
    );
    assert_eq!(capped.outputs["answer.json"].as_ref().unwrap(), answer);
}

/// A guest whose interpreter is too old, or not CPython, is refused as unsupported before
/// anything is written or started.
#[tokio::test]
async fn an_old_or_foreign_python_is_refused_before_the_run() {
    for (answer, named) in [
        ("cpython 3 9\n", "cpython 3.9"),
        ("pypy 3 11\n", "pypy 3.11"),
    ] {
        let temp = tempfile::tempdir().unwrap();
        let sandbox = InProcess {
            python_answer: Some(answer),
            ..InProcess::new(temp.path(), Relay::Real)
        };
        let error = run_program(
            &sandbox,
            &ProgramRequest::python("print(1)"),
            &Registry::new().all_for_run(),
            &RunBounds::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported, "{error}");
        assert!(error.to_string().contains(named), "{error}");
        assert_eq!(run_directories(temp.path()), 0);
    }
}

/// A relay that reports a socket outside any run directory is refused before the command runs
/// or anything is written: the host never uses, nor removes, a path the guest chose.
#[tokio::test]
async fn a_relay_reporting_a_socket_outside_a_run_directory_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let sandbox = InProcess::new(temp.path(), Relay::Forged);
    let registry = registry(Arc::default(), Arc::default());
    let error = run_with_host_tools(
        &sandbox,
        request(&["call", "echo", "{}"]),
        &registry.all_for_run(),
        &RunBounds::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::GuestRefused, "{error}");
    assert!(error.to_string().contains("/etc/forged/socket"), "{error}");
}
