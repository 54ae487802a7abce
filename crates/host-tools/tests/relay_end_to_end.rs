//! The relay and the client as the guest runs them (the `host-tool` binary, as processes),
//! served by the host's dispatcher over the relay's stdin and stdout.
#![cfg(unix)]

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use host_tools::{
    await_ready, serve_run, write_frame, Frame, HostTool, Registry, RunBounds, RunReport,
};
use serde_json::json;
use tokio::process::{Child, Command};

const BINARY: &str = env!("CARGO_BIN_EXE_host-tool");

struct Run {
    relay: Child,
    socket: String,
    temp: tempfile::TempDir,
    server: tokio::task::JoinHandle<Result<RunReport, host_tools::ChannelError>>,
    drain: tokio::sync::oneshot::Sender<()>,
}
fn registry(in_flight: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> Registry {
    let mut registry = Registry::new();
    registry
        .register(
            HostTool::new(
                "echo",
                "returns its text",
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]}),
                |arguments| async move { Ok(arguments["text"].clone()) },
            )
            .unwrap(),
        )
        .unwrap();
    registry
        .register(
            HostTool::new(
                "wait",
                "holds 300 ms, counting overlap",
                json!({}),
                move |_| {
                    let in_flight = in_flight.clone();
                    let peak = peak.clone();
                    async move {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        Ok(json!({"waited": true}))
                    }
                },
            )
            .unwrap(),
        )
        .unwrap();
    registry
        .register(
            HostTool::new("hang", "never answers", json!({}), |_| async {
                std::future::pending::<()>().await;
                Ok(json!(null))
            })
            .unwrap(),
        )
        .unwrap();
    registry
}

async fn start(registry: &Registry) -> Run {
    let temp = tempfile::tempdir().unwrap();
    let mut relay = Command::new(BINARY)
        .arg("relay")
        .env("TMPDIR", temp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = relay.stdout.take().unwrap();
    let mut stdin = relay.stdin.take().unwrap();
    let bounds = RunBounds::default();
    let (socket, decoder, rest) = await_ready(&mut stdout, &bounds, Duration::from_secs(10))
        .await
        .unwrap();
    let tools = registry.all_for_run();
    let (drain, drained) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let mut report = RunReport::default();
        let ended = {
            let served = serve_run(
                &tools,
                &bounds,
                decoder,
                rest,
                &mut stdout,
                &mut stdin,
                &mut report,
            );
            tokio::pin!(served);
            tokio::select! {
                outcome = &mut served => Some(outcome),
                _ = drained => None,
            }
            // The run is over: the server (and every pending handler) is dropped first.
        };
        if let Some(outcome) = ended {
            return outcome.map(|()| report);
        }
        write_frame(&mut stdin, &Frame::Drain).await?;
        Ok(report)
    });
    Run {
        relay,
        socket,
        temp,
        server,
        drain,
    }
}

async fn client(socket: &str, args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(20),
        Command::new(BINARY)
            .args(args)
            .env("HOST_TOOL_SOCKET", socket)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client answers within 20 s")
    .unwrap()
}

fn run_directories(temp: &tempfile::TempDir) -> usize {
    std::fs::read_dir(temp.path()).unwrap().count()
}

#[tokio::test]
async fn calls_return_exact_results_and_the_drain_leaves_nothing() {
    let registry = registry(Arc::default(), Arc::default());
    let mut run = start(&registry).await;
    assert_eq!(run_directories(&run.temp), 1);

    let text = "héllo \u{1F600} \\ \"quoted\"\n";
    let arguments = json!({ "text": text }).to_string();
    let output = client(&run.socket, &["echo", &arguments]).await;
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(String::from_utf8(output.stdout).unwrap(), text);

    let output = client(&run.socket, &["--json", "echo", r#"{"text":"a"}"#]).await;
    assert_eq!(output.stdout, b"\"a\"\n");

    let output = client(&run.socket, &["echo", r#"{"text":1}"#]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid_arguments"));

    let output = client(&run.socket, &["nope", "{}"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown_tool"));

    let output = client(&run.socket, &["echo", "not json"]).await;
    assert_eq!(output.status.code(), Some(2));

    run.drain.send(()).unwrap();
    run.server.await.unwrap().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), run.relay.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        run_directories(&run.temp),
        0,
        "the run directory is removed"
    );
}

#[tokio::test]
async fn eight_callers_overlap() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let registry = registry(in_flight, peak.clone());
    let run = start(&registry).await;
    let started = std::time::Instant::now();
    let mut callers = Vec::new();
    for _ in 0..8 {
        let socket = run.socket.clone();
        callers.push(tokio::spawn(async move {
            client(&socket, &["wait", "{}"]).await
        }));
    }
    for caller in callers {
        let output = caller.await.unwrap();
        assert_eq!(output.status.code(), Some(0), "{output:?}");
        assert_eq!(output.stdout, b"{\"waited\":true}\n");
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        8,
        "all eight calls were in flight at once"
    );
    assert!(started.elapsed() < Duration::from_millis(8 * 300));
}

#[tokio::test]
async fn a_killed_relay_fails_pending_callers_and_the_host_sees_the_end() {
    let registry = registry(Arc::default(), Arc::default());
    let mut run = start(&registry).await;
    let socket = run.socket.clone();
    let caller = tokio::spawn(async move { client(&socket, &["hang", "{}"]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.relay.start_kill().unwrap();
    let output = caller.await.unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    // The host's server ends when the relay's stdout does, dropping the hanging handler.
    let report = tokio::time::timeout(Duration::from_secs(10), run.server)
        .await
        .expect("the server ends with the relay")
        .unwrap();
    assert!(report.is_ok(), "{report:?}");
}

#[tokio::test]
async fn a_drain_answers_a_pending_call_with_run_ended() {
    let registry = registry(Arc::default(), Arc::default());
    let mut run = start(&registry).await;
    let socket = run.socket.clone();
    let caller = tokio::spawn(async move { client(&socket, &["hang", "{}"]).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.drain.send(()).unwrap();
    let output = caller.await.unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("run_ended"));
    assert!(run.relay.wait().await.unwrap().success());
    assert_eq!(run_directories(&run.temp), 0);
    // A call after the run ended finds no relay.
    let output = client(&run.socket, &["echo", r#"{"text":"late"}"#]).await;
    assert_eq!(output.status.code(), Some(3));
}

/// A Python program through the generated module, as the program channel runs it: exact
/// results, the host's refusals as `HostToolError` codes, and eight threads' calls in flight at
/// once. Needs the host's `python3` (3.11 or later).
#[tokio::test]
async fn a_python_program_calls_the_tools_through_the_generated_module() {
    let peak = Arc::new(AtomicUsize::new(0));
    let registry = registry(Arc::default(), peak.clone());
    let run = start(&registry).await;
    let module_dir = tempfile::tempdir().unwrap();
    let module = host_tools::python_client::python_module(
        &registry.all_for_run(),
        RunBounds::default().max_frame_payload(),
    );
    std::fs::write(
        module_dir
            .path()
            .join(host_tools::python_client::MODULE_FILE),
        module,
    )
    .unwrap();
    let program = r#"
import threading, host_tools
text = "h\u00e9llo \U0001F600 \\ \"quoted\"\n"
assert host_tools.echo(text=text) == text, "echo"
assert host_tools.TOOLS["echo"](text="x") == "x", "by name"
# The host refuses, whatever the module lets through.
for call, code in (
    (lambda: host_tools.echo(text=1), "invalid_arguments"),
    (lambda: host_tools.call("echo", {}), "invalid_arguments"),
    (lambda: host_tools.call("nope", {}), "unknown_tool"),
):
    try:
        call()
    except host_tools.HostToolError as error:
        assert error.code == code, (code, error.code)
    else:
        raise AssertionError(f"not refused: {code}")
results = []
threads = [threading.Thread(target=lambda: results.append(host_tools.wait())) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert results == [{"waited": True}] * 8, results
print("ok")
"#;
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new("python3")
            .args(["-c", program])
            .env("PYTHONPATH", module_dir.path())
            .env("HOST_TOOL_SOCKET", &run.socket)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the program ends within 30 s")
    .expect("python3 runs");
    assert_eq!(
        (output.status.code(), output.stdout.as_slice()),
        (Some(0), b"ok\n".as_slice()),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(peak.load(Ordering::SeqCst), 8, "the eight calls overlapped");
}
