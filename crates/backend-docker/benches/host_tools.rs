//! Host tools (docs/host-tools.md), on the base image.
//!
//! - `host-tool call`: a call that echoes 100 bytes, its round trip timed from the guest
//!   program's view (bash's `EPOCHREALTIME` around `host-tool echo`, client start included),
//!   against a bare `exec` of `true` on the same sandbox timed by the host, round by round.
//!   Target: at most 0.1×.
//! - `host-tool concurrent`: 1,000 calls from 8 concurrent guest callers (125 each), the run's
//!   wall time from the guest's view, 0 failed; against the same 8 loops running `/bin/true`
//!   (the cost of the client processes alone). Reported.

mod support;

use std::time::Duration;

use host_tools::{HostTool, Registry, RunBounds};
use paired_bench::{timed, Metric, Target};
use sandbox_core::host_tool_run::run_with_host_tools;
use sandbox_core::{Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use serde_json::json;
use support::{backend, unique_scope, Sweep};

const WARMUP: usize = 5;
const ROUNDS: usize = 30;
const CALLERS: usize = 8;
const CALLS_EACH: usize = 125;

fn request(script: String) -> ExecRequest {
    ExecRequest::new(Command::argv(["bash", "-c", &script])).timeout(Duration::from_secs(600))
}

/// Microseconds per line of `EPOCHREALTIME` differences the guest printed.
fn durations(stdout: &[u8]) -> Vec<Duration> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| {
            let micros: u64 = line.trim().parse().expect("a duration in microseconds");
            Duration::from_micros(micros)
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let scope = unique_scope("host-tools");
    let sweep = Sweep::new(&scope);
    let spec = SandboxSpec::builder("bench")
        .image(support::IMAGE)
        .build()
        .expect("a valid spec");
    let key = SandboxKey::conversation(scope.as_str(), "host-tools", "bench");
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
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
            .expect("a valid tool"),
        )
        .expect("registered");
    let tools = registry.all_for_run();
    let bounds = RunBounds::default();
    let text = "x".repeat(100);

    // The guest's per-call round trips, from one run.
    let calls = WARMUP + ROUNDS;
    let script = format!(
        "for i in $(seq {calls}); do s=${{EPOCHREALTIME/./}}; \
         host-tool echo '{{\"text\":\"{text}\"}}' > /dev/null || exit 9; \
         e=${{EPOCHREALTIME/./}}; echo $((e - s)); done"
    );
    let run = run_with_host_tools(&*sandbox, request(script), &tools, &bounds)
        .await
        .expect("the run");
    assert_eq!(run.output.exit_code, 0, "{}", run.output.stderr_text());
    let guest = durations(&run.output.stdout);
    assert_eq!(guest.len(), calls);

    let mut call = Metric::new("host-tool call", Target::AtMost(0.1));
    for (round, guest_call) in guest.into_iter().enumerate() {
        let (output, bare) = timed(sandbox.exec(ExecRequest::new(Command::argv(["true"])))).await;
        assert_eq!(output.expect("exec").exit_code, 0);
        if round >= WARMUP {
            call.push((guest_call, bare));
        }
    }
    let mut passed = call.report();

    // 1,000 calls from 8 callers, against the same loops without the calls.
    let loops = |body: &str| {
        format!(
            "s=${{EPOCHREALTIME/./}}; for c in $(seq {CALLERS}); do \
             (f=0; for i in $(seq {CALLS_EACH}); do {body} > /dev/null 2>&1 || f=$((f+1)); done; \
             echo $f > /tmp/bench-failed-$c) & done; wait; e=${{EPOCHREALTIME/./}}; \
             f=0; for n in $(cat /tmp/bench-failed-*); do f=$((f + n)); done; \
             rm -f /tmp/bench-failed-*; echo $((e - s)); echo $f >&2"
        )
    };
    let run = run_with_host_tools(
        &*sandbox,
        request(loops(&format!("host-tool echo '{{\"text\":\"{text}\"}}'"))),
        &tools,
        &bounds,
    )
    .await
    .expect("the concurrent run");
    assert_eq!(run.output.exit_code, 0, "{}", run.output.stderr_text());
    let failed = run.output.stderr_text().trim().to_owned();
    assert_eq!(failed, "0", "calls failed under 8 callers");
    assert_eq!(run.report.answered, (CALLERS * CALLS_EACH) as u64);
    let wall = durations(&run.output.stdout)[0];
    let bare = sandbox
        .exec(request(loops("/bin/true")))
        .await
        .expect("the bare loops");
    assert_eq!(bare.exit_code, 0, "{}", bare.stderr_text());
    let bare_wall = durations(&bare.stdout)[0];
    let mut concurrent = Metric::new("host-tool concurrent", Target::ReportedOnly);
    concurrent.push((wall, bare_wall));
    passed &= concurrent.report();
    println!(
        "host-tool concurrent: {} calls from {CALLERS} callers in {:.0} ms, 0 failed",
        CALLERS * CALLS_EACH,
        wall.as_secs_f64() * 1000.0
    );

    drop(sandbox);
    sweep.finish(&backend, &["host-tools"]).await;
    assert!(passed, "a host-tools target was missed");
}
