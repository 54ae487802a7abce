//! HOST_TOOLS (docs/conformance.md#the-suites): a command in the sandbox calls the host's tools
//! through `host-tool` and gets exact results; callers overlap; every gate answers with its
//! typed code; a forged frame, a flood and a killed relay end in errors, never a hang or an
//! unbounded host; cancelling the run cancels its pending calls; nothing of a run remains.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use host_tools::{HostTool, Registry, RunBounds, ToolError};
use sandbox_core::host_tool_run::{run_with_host_tools, HostToolRun};
use sandbox_core::program_run::{run_program, ProgramRequest};
use sandbox_core::{
    Capability, Command, DisposeSelector, ExecRequest, Sandbox, SandboxBackend, SandboxKey,
    SandboxSpec,
};
use serde_json::{json, Value};

use crate::error::ConformanceError;
use crate::report::ConformanceReport;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The suite label.
pub const HOST_TOOLS: &str = "HOST_TOOLS";

/// How many probes [`assert_host_tools`] runs.
pub const HOST_TOOLS_PROBES: usize = HOST_TOOLS_PROBE_TABLE.len();

const HOST_TOOLS_PROBE_TABLE: &[&str] = &[
    "shell-calls-return-exact-results",
    "a-python-program-calls-tools-and-returns-its-outputs",
    "eight-callers-overlap",
    "each-gate-answers-with-its-code",
    "a-flood-is-refused-past-the-in-flight-bound",
    "a-forged-oversized-frame-ends-the-channel-not-the-host",
    "a-killed-relay-gives-errors-not-a-hang",
    "cancelling-the-run-cancels-pending-calls",
    "a-call-after-the-run-ended-is-refused",
    "nothing-of-a-run-remains",
];

/// The bound of every guest command of this suite.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `wait` holds a call: long enough that eight sequential calls could not hide as
/// overlapping ones.
const WAIT: Duration = Duration::from_millis(500);
/// The large result: most of the run's result bound, base64 included.
const LARGE_BYTES: usize = 600 * 1024;
/// The suite's result bound.
const MAX_RESULT: usize = 1024 * 1024;
/// The suite's argument bound.
const MAX_ARGUMENTS: usize = 16 * 1024;
/// Lists what a run could leave in the guest: run directories and relay processes (by their
/// argv's start, so the wrappers that carry it as an argument never match).
const LEFTOVERS: &str = "ls -a \"${TMPDIR:-/tmp}\" | grep '^\\.host-tools-' ; \
    for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null); \
    case \"$c\" in '/usr/local/bin/host-tool relay '*) echo \"relay $p\";; esac; done; true";
/// Prints the pid of the run's relay.
const RELAY_PID: &str =
    "relay_pid() { for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null); \
    case \"$c\" in '/usr/local/bin/host-tool relay '*) echo \"${p#/proc/}\";; esac; done; }";

/// The state the suite's tools share with its probes.
#[derive(Default)]
struct Observed {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    hang_started: tokio::sync::Notify,
    hang_dropped: AtomicUsize,
}

/// Drops count as cancellations.
struct DropCounter(Arc<Observed>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.hang_dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// The bytes `bytes` returns for `n`: every byte value, in a pattern the guest can digest.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

fn registry(observed: &Arc<Observed>) -> Result<Registry, ConformanceError> {
    let harness = |error: host_tools::RegistryError| {
        ConformanceError::harness(HOST_TOOLS, format!("the suite's tools: {error}"))
    };
    let mut registry = Registry::new();
    let tools = [
        HostTool::new(
            "echo",
            "returns its text",
            json!({"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"], "additionalProperties": false}),
            |arguments: Value| async move { Ok(arguments["text"].clone()) },
        ),
        HostTool::new(
            "bytes",
            "returns n pattern bytes as base64",
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                   "maximum": 1_000_000}}, "required": ["n"]}),
            |arguments: Value| async move {
                let n = arguments["n"].as_u64().unwrap_or(0) as usize;
                Ok(json!(
                    base64::engine::general_purpose::STANDARD.encode(pattern(n))
                ))
            },
        ),
        HostTool::new("wait", "holds the call, counting overlap", json!({}), {
            let observed = observed.clone();
            move |_| {
                let observed = observed.clone();
                async move {
                    let now = observed.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    observed.peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(WAIT).await;
                    observed.in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok(json!("waited"))
                }
            }
        }),
        HostTool::new("hang", "never answers; its drop is counted", json!({}), {
            let observed = observed.clone();
            move |_| {
                let guard = DropCounter(observed.clone());
                let observed = observed.clone();
                async move {
                    let _guard = guard;
                    observed.hang_started.notify_one();
                    std::future::pending::<()>().await;
                    Ok(Value::Null)
                }
            }
        }),
        HostTool::new("fails", "always refuses", json!({}), |_| async {
            Err(ToolError::new("refused by the host"))
        }),
        HostTool::new(
            "undeclared",
            "registered, never declared",
            json!({}),
            |_| async { Ok(json!("must not run")) },
        ),
    ];
    for tool in tools {
        registry.register(tool.map_err(harness)?).map_err(harness)?;
    }
    Ok(registry)
}

/// Attacks a run with host tools. Gate `host_tools`. One sandbox from `keys("host-tools")`,
/// disposed of before it returns; its image must carry `host-tool` and, for the program
/// channel's probe, CPython 3.11 or later (`sandbox-python:local`, the sbx simulator's image and
/// the VM image do).
///
/// # Errors
/// [`ConformanceError::GateNotDeclared`] before anything is made when `host_tools` is not
/// declared; [`ConformanceError::ConformanceFailure`] naming each failed probe; a harness error
/// when the acquire or the disposal fails.
pub async fn assert_host_tools(
    backend: &dyn SandboxBackend,
    keys: &mut dyn FnMut(&str) -> SandboxKey,
    spec: &SandboxSpec,
) -> Result<ConformanceReport, ConformanceError> {
    let capabilities: BTreeSet<Capability> = backend.declarations().capabilities.clone();
    let mut run = SuiteRun::start(
        HOST_TOOLS,
        HOST_TOOLS_PROBE_TABLE,
        Some(Capability::HostTools),
        &capabilities,
        Verdict::Aggregate,
    )?;
    let observed = Arc::new(Observed::default());
    let registry = registry(&observed)?;
    let key = keys("host-tools");
    let sandbox = backend.acquire(&key, spec).await.map_err(|error| {
        ConformanceError::harness(HOST_TOOLS, format!("the suite's acquire: {error}"))
    })?;
    let suite = Suite {
        sandbox,
        registry,
        observed,
    };
    run.probe(
        "shell-calls-return-exact-results",
        &[],
        suite.exact_results(),
    )
    .await;
    run.probe(
        "a-python-program-calls-tools-and-returns-its-outputs",
        &[],
        suite.python_program(),
    )
    .await;
    run.probe("eight-callers-overlap", &[], suite.callers_overlap())
        .await;
    run.probe("each-gate-answers-with-its-code", &[], suite.gates())
        .await;
    run.probe(
        "a-flood-is-refused-past-the-in-flight-bound",
        &[],
        suite.flood(),
    )
    .await;
    run.probe(
        "a-forged-oversized-frame-ends-the-channel-not-the-host",
        &[],
        suite.forged_frame(),
    )
    .await;
    run.probe(
        "a-killed-relay-gives-errors-not-a-hang",
        &[],
        suite.killed_relay(),
    )
    .await;
    run.probe(
        "cancelling-the-run-cancels-pending-calls",
        &[],
        suite.cancellation(),
    )
    .await;
    run.probe(
        "a-call-after-the-run-ended-is-refused",
        &[],
        suite.late_call(),
    )
    .await;
    run.probe("nothing-of-a-run-remains", &[], suite.nothing_remains())
        .await;
    drop(suite);
    if let Some(failure) = backend.dispose(&key, DisposeSelector::all()).await {
        return Err(ConformanceError::harness(
            HOST_TOOLS,
            format!("the suite's sandbox was not disposed of: {failure}"),
        ));
    }
    run.finish()
}

/// HOST_TOOLS as every backend's live test runs it: the suite on one sandbox, then the verdict
/// CI holds each backend to (every probe passed, none skipped, [`HOST_TOOLS_PROBES`] of them).
/// The caller checks its own engine for leftovers before it judges the result, whatever it is.
/// Returns the report and the run's wall time.
///
/// # Errors
/// As [`assert_host_tools`]; [`ConformanceError::ProbesSkipped`] for a skipped probe; a harness
/// error when the report holds another number of probes than the suite's table.
pub async fn assert_host_tools_complete(
    backend: &dyn SandboxBackend,
    keys: &mut dyn FnMut(&str) -> SandboxKey,
    spec: &SandboxSpec,
) -> Result<(ConformanceReport, Duration), ConformanceError> {
    let started = std::time::Instant::now();
    let report = assert_host_tools(backend, keys, spec).await?;
    let wall = started.elapsed();
    report.assert_all_passed()?;
    if report.passed() != HOST_TOOLS_PROBES {
        return Err(ConformanceError::harness(
            HOST_TOOLS,
            format!(
                "{} probes passed, the suite has {HOST_TOOLS_PROBES}:\n{report}",
                report.passed()
            ),
        ));
    }
    Ok((report, wall))
}

/// Whether the guest's shell reported that the kernel refused it access to another process
/// (its descriptors, or a signal; or a signal to a number `/proc` shows that is no process in
/// the guest's own PID namespace): the relay is then out of the guest's reach.
fn refused_by_the_kernel(stderr: &str) -> bool {
    stderr.contains("Permission denied")
        || stderr.contains("Operation not permitted")
        || stderr.contains("No such process")
}

struct Suite {
    sandbox: Arc<dyn Sandbox>,
    registry: Registry,
    observed: Arc<Observed>,
}

fn bounds() -> RunBounds {
    RunBounds {
        max_argument_bytes: MAX_ARGUMENTS,
        max_result_bytes: MAX_RESULT,
        max_in_flight: 16,
        call_deadline: Duration::from_secs(60),
        ..RunBounds::default()
    }
}

fn request(script: &str) -> ExecRequest {
    ExecRequest::new(Command::argv(["sh", "-c", script]))
        .working_directory("/")
        .timeout(COMMAND_TIMEOUT)
}

impl Suite {
    /// Runs `script` with every tool but `undeclared` declared.
    async fn run(&self, script: &str) -> Result<HostToolRun, ProbeError> {
        self.run_bounded(script, &bounds()).await
    }

    async fn run_bounded(
        &self,
        script: &str,
        bounds: &RunBounds,
    ) -> Result<HostToolRun, ProbeError> {
        let tools = self
            .registry
            .for_run(["echo", "bytes", "wait", "hang", "fails"])
            .map_err(|error| ProbeError::Harness(error.to_string()))?;
        Ok(run_with_host_tools(&*self.sandbox, request(script), &tools, bounds).await?)
    }

    /// Runs a plain command (no host tools), requiring exit 0; its stdout.
    async fn plain(&self, script: &str) -> Result<String, ProbeError> {
        let output = self.sandbox.exec(request(script)).await?;
        ensure!(
            output.exit_code == 0,
            "{script:?} exited {} (stderr {:?})",
            output.exit_code,
            output.stderr_text()
        );
        Ok(output.stdout_text())
    }

    /// Whether each exec of the sandbox runs in user and PID namespaces of its own (sbx): two
    /// execs alive at once name their own namespaces, which any process may read (the first
    /// waits for the second's mark: a namespace's number is reused once it is gone, so two execs
    /// one after the other could name two namespaces alike). There no process of the guest can
    /// signal another exec's relay or open its descriptors, and the probes that attack the relay
    /// from the command check that it stays out of reach instead.
    async fn execs_isolated(&self) -> Result<bool, ProbeError> {
        const OWN: &str = "readlink /proc/self/ns/user /proc/self/ns/pid";
        let mark = format!("/tmp/.exec-namespaces-{}", std::process::id());
        let waiting = format!(
            "{OWN}; i=0; until [ -e {mark} ]; do i=$((i+1)); [ $i -le 600 ] || exit 1; \
             sleep 0.1; done"
        );
        let marking = format!("{OWN}; touch {mark}");
        let (first, second) = tokio::join!(self.plain(&waiting), self.plain(&marking));
        let removed = self.plain(&format!("rm -f {mark}")).await;
        let (first, second) = (first?, second?);
        removed?;
        ensure!(
            first.lines().count() == 2 && second.lines().count() == 2,
            "an exec could not name its own namespaces ({first:?}, {second:?})"
        );
        Ok(first != second)
    }

    /// Runs `attack` (which prints `reached` when it got to the relay, `refused` when the guest
    /// was refused) then a call, where execs are isolated from each other: the relay must be
    /// visible, out of reach, and the run unharmed.
    async fn expect_out_of_reach(&self, attack: &str) -> Result<(), ProbeError> {
        let script = format!(
            "{RELAY_PID}; pid=$(relay_pid); [ -n \"$pid\" ] || echo no-relay; {attack}; \
             host-tool echo '{{\"text\":\"after\"}}' > /dev/null 2>&1; echo after=$?"
        );
        let run = self.run(&script).await?;
        let stdout = run.output.stdout_text();
        ensure!(
            stdout == "refused\nafter=0\n",
            "with each exec isolated, the guest's attack on the relay printed {stdout:?} \
             (stderr {:?}), expected a refusal and an unharmed call",
            run.output.stderr_text()
        );
        ensure!(
            run.channel_error.is_none() && run.report.answered == 1,
            "the refused attack harmed the run: {:?}, {:?}",
            run.channel_error,
            run.report
        );
        self.expect_no_leftovers("a refused attack on the relay")
            .await
    }

    async fn expect_no_leftovers(&self, after: &str) -> Result<(), ProbeError> {
        // A relay drains in well under a second (a cancelled run's a few seconds later); a
        // killed one's directory is removed by the host before the run returns.
        let mut left = String::new();
        for _ in 0..60 {
            left = self.plain(LEFTOVERS).await?;
            if left.trim().is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(ProbeError::Assertion(format!(
            "after {after}, the guest still holds {left:?}"
        )))
    }

    async fn exact_results(&self) -> Result<(), ProbeError> {
        let text = "héllo ✓ \"quoted\" \\ back\tslash\nsecond line";
        let arguments = json!({ "text": text }).to_string();
        let script = format!(
            "host-tool echo '{}' && echo && host-tool --json echo '{{\"text\":\"a\"}}' && \
             host-tool bytes '{{\"n\":{LARGE_BYTES}}}' | base64 -d | sha256sum && \
             host-tool bytes '{{\"n\":{LARGE_BYTES}}}' | base64 -d | wc -c",
            arguments.replace('\'', "'\\''")
        );
        let run = self.run(&script).await?;
        use sha2::Digest as _;
        let digest: String = sha2::Sha256::digest(pattern(LARGE_BYTES))
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let expected = format!("{text}\n\"a\"\n{digest}  -\n{LARGE_BYTES}\n");
        ensure!(
            run.output.exit_code == 0 && run.output.stdout_text() == expected,
            "the calls printed {:?} (exit {}, stderr {:?}), expected {expected:?}",
            run.output.stdout_text(),
            run.output.exit_code,
            run.output.stderr_text()
        );
        ensure!(
            run.report.answered == 4 && run.channel_error.is_none(),
            "the host served {:?} ({:?})",
            run.report,
            run.channel_error
        );
        Ok(())
    }

    /// The program channel (`python-portable-v1`): a Python program calls the tools through
    /// the generated module (exact UTF-8 and binary results, the host's refusals as typed
    /// errors, eight threads' calls in flight at once) and writes its declared outputs, which
    /// come back exactly; an output it never wrote is reported missing.
    async fn python_program(&self) -> Result<(), ProbeError> {
        const PROGRAM: &str = r#"import base64, hashlib, json, os, threading
import host_tools

text = "h\u00e9llo \u2713 \"quoted\" \\ back\tslash\nsecond line"
echoed = host_tools.echo(text=text)
large = base64.b64decode(host_tools.bytes(n=@LARGE@))
expected = bytes(i * 7 % 251 for i in range(@LARGE@))
codes = []
for attempt in (lambda: host_tools.echo(text=1), lambda: host_tools.call("undeclared", {}),
                lambda: host_tools.fails()):
    try:
        attempt()
        codes.append("answered")
    except host_tools.HostToolError as error:
        codes.append(error.code)
waited = []
threads = [threading.Thread(target=lambda: waited.append(host_tools.wait())) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
out = os.environ["PROGRAM_OUTPUTS"]
with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as report:
    json.dump({"echo_exact": echoed == text, "large_exact": large == expected,
               "codes": codes, "waited": waited}, report, sort_keys=True)
with open(os.path.join(out, "large.bin"), "wb") as blob:
    blob.write(large)
print(hashlib.sha256(large).hexdigest())
"#;
        self.observed.peak.store(0, Ordering::SeqCst);
        let tools = self
            .registry
            .for_run(["echo", "bytes", "wait", "fails"])
            .map_err(|error| ProbeError::Harness(error.to_string()))?;
        let program = ProgramRequest::python(PROGRAM.replace("@LARGE@", &LARGE_BYTES.to_string()))
            .output("report.json")
            .output("large.bin")
            .output("never-written")
            .working_directory("/")
            .timeout(COMMAND_TIMEOUT);
        let run = run_program(&*self.sandbox, &program, &tools, &bounds()).await?;
        use sha2::Digest as _;
        let digest: String = sha2::Sha256::digest(pattern(LARGE_BYTES))
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        ensure!(
            run.output.exit_code == 0 && run.output.stdout_text() == format!("{digest}\n"),
            "the program printed {:?} (exit {}, stderr {:?})",
            run.output.stdout_text(),
            run.output.exit_code,
            run.output.stderr_text()
        );
        let report = match run.outputs.get("report.json") {
            Some(Ok(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            other => {
                return Err(ProbeError::Assertion(format!(
                    "the declared output report.json was not collected: {other:?}"
                )))
            }
        };
        let expected = json!({
            "codes": ["invalid_arguments", "undeclared_tool", "tool_failed"],
            "echo_exact": true,
            "large_exact": true,
            "waited": vec!["waited"; 8],
        });
        ensure!(
            serde_json::from_str::<Value>(&report).ok() == Some(expected.clone()),
            "the program reported {report}, expected {expected}"
        );
        ensure!(
            matches!(run.outputs.get("large.bin"), Some(Ok(bytes)) if *bytes == pattern(LARGE_BYTES)),
            "the binary output did not come back exactly"
        );
        ensure!(
            matches!(run.outputs.get("never-written"), Some(Err(error))
                if error.kind() == sandbox_core::ErrorKind::NotFound),
            "an output the program never wrote was reported as {:?}",
            run.outputs.get("never-written")
        );
        let peak = self.observed.peak.load(Ordering::SeqCst);
        ensure!(
            peak == 8,
            "at most {peak} of the program's eight calls were in flight at once"
        );
        ensure!(
            run.report.answered == 10 && run.channel_error.is_none(),
            "the host served {:?} ({:?})",
            run.report,
            run.channel_error
        );
        Ok(())
    }

    async fn callers_overlap(&self) -> Result<(), ProbeError> {
        self.observed.peak.store(0, Ordering::SeqCst);
        let started = std::time::Instant::now();
        let run = self
            .run(
                // Each caller records its own status: `jobs` in a command substitution lists
                // the parent's jobs in some shells only.
                "rm -f /tmp/overlap; i=0; while [ $i -lt 8 ]; do \
                 (host-tool wait '{}' > /dev/null; echo $? >> /tmp/overlap) & i=$((i+1)); done; \
                 wait; echo calls=$(wc -l < /tmp/overlap) failed=$(grep -vc '^0$' /tmp/overlap); \
                 rm -f /tmp/overlap",
            )
            .await?;
        let elapsed = started.elapsed();
        ensure!(
            run.output.stdout_text() == "calls=8 failed=0\n",
            "the eight callers printed {:?} (stderr {:?})",
            run.output.stdout_text(),
            run.output.stderr_text()
        );
        let peak = self.observed.peak.load(Ordering::SeqCst);
        ensure!(
            peak == 8,
            "at most {peak} of the eight calls were in flight at once"
        );
        ensure!(
            run.report.answered == 8,
            "the host answered {:?}",
            run.report
        );
        tracing::info!(?elapsed, "eight overlapping calls");
        Ok(())
    }

    async fn gates(&self) -> Result<(), ProbeError> {
        let oversized = "x".repeat(MAX_ARGUMENTS + 1);
        let script = format!(
            "for call in 'nope {{}}' 'undeclared {{}}' 'echo {{\"text\":1}}' \
             'echo {{\"text\":\"{oversized}\"}}' 'fails {{}}' 'bytes {{\"n\":-1}}'; do \
             set -- $call; host-tool \"$1\" \"$2\" > /dev/null 2> /tmp/gate-err; code=$?; \
             echo \"$code $(cut -d: -f2 /tmp/gate-err | tr -d ' ')\"; done; rm -f /tmp/gate-err"
        );
        let run = self.run(&script).await?;
        let expected = "1 unknown_tool\n1 undeclared_tool\n1 invalid_arguments\n\
                        1 arguments_too_large\n1 tool_failed\n1 invalid_arguments\n";
        ensure!(
            run.output.stdout_text() == expected,
            "the gates answered {:?} (stderr {:?}), expected {expected:?}",
            run.output.stdout_text(),
            run.output.stderr_text()
        );
        ensure!(
            run.report.refused == 5 && run.report.failed == 1 && run.report.answered == 0,
            "the host counted {:?}",
            run.report
        );
        Ok(())
    }

    async fn flood(&self) -> Result<(), ProbeError> {
        let bounds = RunBounds {
            max_in_flight: 4,
            ..bounds()
        };
        let run = self
            .run_bounded(
                "i=0; while [ $i -lt 40 ]; do (host-tool wait '{}' > /dev/null 2>&1; echo $? >> /tmp/flood) & \
                 i=$((i+1)); done; wait; sort /tmp/flood | uniq -c | awk '{print $2\"=\"$1}'; rm -f /tmp/flood",
                &bounds,
            )
            .await?;
        let counts: std::collections::BTreeMap<String, u64> = run
            .output
            .stdout_text()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(code, count)| (code.to_owned(), count.parse().unwrap_or(0)))
            .collect();
        let ok = counts.get("0").copied().unwrap_or(0);
        let refused = counts.get("1").copied().unwrap_or(0);
        ensure!(
            ok + refused == 40 && ok >= 4 && refused >= 1,
            "40 flooding callers ended {counts:?} (stderr {:?})",
            run.output.stderr_text()
        );
        ensure!(
            run.report.refused == refused && run.report.answered == ok,
            "the host counted {:?}, the guest saw {counts:?}",
            run.report
        );
        ensure!(
            self.observed.in_flight.load(Ordering::SeqCst) == 0,
            "calls are still in flight after the run"
        );
        Ok(())
    }

    async fn forged_frame(&self) -> Result<(), ProbeError> {
        if self.execs_isolated().await? {
            return self
                .expect_out_of_reach(
                    "if printf 'H\\001\\001\\000\\377\\377\\377\\377' > /proc/$pid/fd/1; \
                     then echo reached; else echo refused; fi",
                )
                .await;
        }
        // The relay's stdout is the host's channel; a guest process of the same user writes a
        // header announcing 4 GiB into it.
        let script = format!(
            "{RELAY_PID}; pid=$(relay_pid); \
             printf 'H\\001\\001\\000\\377\\377\\377\\377' > /proc/$pid/fd/1 && echo forged; \
             sleep 1; host-tool echo '{{\"text\":\"after\"}}' > /dev/null 2>&1; echo after=$?"
        );
        let run = self.run(&script).await?;
        let stdout = run.output.stdout_text();
        if refused_by_the_kernel(&run.output.stderr_text()) {
            // The namespaces looked shared, but the kernel kept the relay's descriptors out of
            // the guest's reach (another exec's user, as where each has namespaces of its own):
            // then the run must be unharmed.
            ensure!(
                stdout == "after=0\n" && run.channel_error.is_none(),
                "a refused forgery harmed the run: {stdout:?}, {:?}",
                run.channel_error
            );
            return self.expect_no_leftovers("a refused forged frame").await;
        }
        ensure!(
            stdout.starts_with("forged\n"),
            "the guest could not forge the frame ({stdout:?}, stderr {:?}): the probe proves nothing",
            run.output.stderr_text()
        );
        ensure!(
            stdout.ends_with("after=1\n") || stdout.ends_with("after=3\n"),
            "a call after the forged frame printed {stdout:?}"
        );
        let reason = run.channel_error.unwrap_or_default();
        ensure!(
            reason.contains("over the"),
            "the host's channel ended with {reason:?}, not the oversized-frame refusal"
        );
        self.expect_no_leftovers("a forged frame").await
    }

    async fn killed_relay(&self) -> Result<(), ProbeError> {
        if self.execs_isolated().await? {
            // The number /proc shows is the relay's outside the command's PID namespace: a
            // kill of it finds no such process there.
            return self
                .expect_out_of_reach(
                    "if kill -9 $pid 2> /dev/null; then echo reached; else echo refused; fi",
                )
                .await;
        }
        let script = format!(
            "{RELAY_PID}; kill -9 $(relay_pid); sleep 0.5; \
             host-tool echo '{{\"text\":\"x\"}}' > /dev/null 2>&1; echo exit=$?"
        );
        let run = tokio::time::timeout(Duration::from_secs(60), self.run(&script))
            .await
            .map_err(|_| {
                ProbeError::Assertion("the run hung after its relay was killed".into())
            })??;
        if refused_by_the_kernel(&run.output.stderr_text()) {
            // As for the forged frame: a kill the kernel refused leaves the run unharmed.
            ensure!(
                run.output.stdout_text() == "exit=0\n" && run.channel_error.is_none(),
                "a refused kill harmed the run: {:?}, {:?}",
                run.output.stdout_text(),
                run.channel_error
            );
            return self
                .expect_no_leftovers("a refused kill of the relay")
                .await;
        }
        ensure!(
            run.output.stdout_text() == "exit=3\n",
            "a call with the relay killed printed {:?} (stderr {:?})",
            run.output.stdout_text(),
            run.output.stderr_text()
        );
        self.expect_no_leftovers("a killed relay").await
    }

    async fn cancellation(&self) -> Result<(), ProbeError> {
        let before = self.observed.hang_dropped.load(Ordering::SeqCst);
        let started = self.observed.hang_started.notified();
        tokio::pin!(started);
        {
            let run = self.run("host-tool hang '{}'; echo ended");
            tokio::pin!(run);
            tokio::select! {
                _ = &mut started => {}
                outcome = &mut run => {
                    return Err(ProbeError::Assertion(format!(
                        "the run ended before its call reached the host: {outcome:?}"
                    )));
                }
                _ = tokio::time::sleep(Duration::from_secs(60)) => {
                    return Err(ProbeError::Assertion("the hanging call never reached the host".into()));
                }
            }
            ensure!(
                self.observed.hang_dropped.load(Ordering::SeqCst) == before,
                "the pending call was cancelled before the run was"
            );
            // Leaving the block drops the run.
        }
        ensure!(
            self.observed.hang_dropped.load(Ordering::SeqCst) == before + 1,
            "dropping the run did not cancel its pending call"
        );
        self.expect_no_leftovers("a cancelled run").await
    }

    async fn late_call(&self) -> Result<(), ProbeError> {
        let run = self.run("echo \"$HOST_TOOL_SOCKET\"").await?;
        let socket = run.output.stdout_text().trim().to_owned();
        ensure!(
            socket.ends_with("/socket"),
            "the run's command saw HOST_TOOL_SOCKET={socket:?}"
        );
        let late = self
            .plain(&format!(
                "HOST_TOOL_SOCKET='{socket}' host-tool echo '{{\"text\":\"late\"}}' > /dev/null 2>&1; echo exit=$?"
            ))
            .await?;
        ensure!(
            late == "exit=3\n",
            "a call through the ended run's socket printed {late:?}"
        );
        Ok(())
    }

    async fn nothing_remains(&self) -> Result<(), ProbeError> {
        let run = self
            .run("host-tool echo '{\"text\":\"x\"}' > /dev/null && ls -a \"$(dirname \"$HOST_TOOL_SOCKET\")\"")
            .await?;
        ensure!(
            run.output.exit_code == 0 && run.output.stdout_text().contains("socket"),
            "the run's directory did not hold its socket during the run: {:?}",
            run.output.stdout_text()
        );
        self.expect_no_leftovers("a run").await
    }
}
