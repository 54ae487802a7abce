//! Exec latency: `sandbox.exec(["echo", "hi"])` through the exec wrapper against a raw `docker
//! exec <id> echo hi` on a container started with the same hardening, and against a bare Engine
//! API exec (create, attached start, inspect) of the same command with the same client library.
//! Pass/fail: p50 and p95 at most 0.90× the CLI's, p50 at most 1.05× the bare API exec's.
//!
//! The wrapper's own cost: the same bare API exec of `echo hi`, once through the wrapper as the
//! backend sends it to this image (the exec init: `/usr/local/libexec/sandbox-exec-init <nonce>
//! …`, argv raw) and once bare, on the same container. Pass/fail: at most 6 ms added at p50.
//! Reported beside it: the same for the engine's init and its wrapper (`/sbin/docker-init -s --
//! sh -c <wrapper> …`, what an image without the exec init gets), the bare exec on
//! the sandbox's own container against the raw one (what the containers' settings cost, and the
//! noise between two equivalent targets), and the backend's exec against the wrapped API exec on
//! the sandbox's container (what the host side adds).
//!
//! Then the flood: a guest printing 1 GiB must be refused with the output-limit error while the
//! host's resident memory grows by at most 24 MiB.
//!
//! Then `concurrent exec`: 32 sandboxes × 20 concurrent `echo hi` each, through the backend,
//! against `docker exec` doing the same on 32 raw containers with the same hardening. Both sides
//! submit all 640 execs at once and pass the same in-flight bound ([`CONCURRENT_IN_FLIGHT`]): the
//! backend has no bound of its own, and 640 simultaneous CLI processes would measure this
//! machine's memory, not the engine path. Pass/fail: no failed exec on our side and our wall time
//! at most 1.0× the CLI's; the CLI's failures are reported.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt as _;
use paired_bench::raw_docker::docker;
use paired_bench::{exit_with, record_row, round_robin, Metric, Target};
use sandbox_core::{Command, ErrorKind, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::{backend, bench_spec, run_raw_container, SideBySide};

const WARMUP: usize = 3;
// Each round runs every side once (about 0.4 s); the rows' margins are a few hundredths, which a
// median of 45 paired rounds moved by between runs.
const ROUNDS: usize = 91;

/// Sandboxes of the concurrent row, and `echo hi` execs in flight on each.
const CONCURRENT_SANDBOXES: usize = 32;
const EXECS_PER_SANDBOX: usize = 20;
/// The bound on execs in flight, the same on both sides (see the crate docs above).
const CONCURRENT_IN_FLIGHT: usize = 64;

/// One bare Engine API exec of `echo hi`: create, attached start read to the end, inspect.
async fn bare_api_exec(docker: &bollard::Docker, id: &str) {
    api_exec(docker, id, vec!["echo".to_owned(), "hi".to_owned()]).await;
}

/// The same exec through the exec init, as the backend sends it to this image.
async fn wrapped_api_exec(docker: &bollard::Docker, id: &str) {
    api_exec(
        docker,
        id,
        echo_hi_through(exec_wrapper::wrapper::exec_init_argv),
    )
    .await;
}

/// The same exec through the wrapper under the engine's init (an image without the exec init).
async fn engine_init_api_exec(docker: &bollard::Docker, id: &str) {
    api_exec(
        docker,
        id,
        echo_hi_through(exec_wrapper::wrapper::docker_init_wrapper_argv),
    )
    .await;
}

/// `echo hi` in `/` as one init shape writes it, argv raw, with a fresh nonce.
fn echo_hi_through(
    shape: fn(&exec_wrapper::Nonce, &exec_wrapper::encoding::RawInvocation) -> Vec<String>,
) -> Vec<String> {
    let nonce = exec_wrapper::new_nonce().expect("a nonce");
    let invocation = exec_wrapper::encoding::raw_invocation(b"/", &[b"echo".as_slice(), b"hi"])
        .expect("an argv");
    shape(&nonce, &invocation)
}

/// One Engine API exec of `cmd`: create, attached start read to the end, inspect; exit 0.
async fn api_exec(docker: &bollard::Docker, id: &str, cmd: Vec<String>) {
    let created = docker
        .create_exec(
            id,
            CreateExecOptions::<String> {
                cmd: Some(cmd),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..CreateExecOptions::default()
            },
        )
        .await
        .expect("exec create");
    let start = StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: None,
    };
    if let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&created.id, Some(start))
        .await
        .expect("exec start")
    {
        while output.next().await.is_some() {}
    }
    let inspected = docker
        .inspect_exec(&created.id)
        .await
        .expect("exec inspect");
    assert_eq!(inspected.exit_code, Some(0));
}

/// This process's peak resident memory in KiB (`VmHWM`), after resetting it when `reset`.
fn peak_rss_kib(reset: bool) -> u64 {
    if reset {
        std::fs::write("/proc/self/clear_refs", "5").expect("the peak can be reset");
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM is reported")
}

#[tokio::main]
async fn main() {
    let backend = backend().await;
    let SideBySide {
        scope,
        sweep,
        sandbox,
        raw,
    } = SideBySide::start(&backend, "exec", &bench_spec()).await;

    let api = bollard::Docker::connect_with_unix_defaults()
        .expect("a client of the default socket")
        .negotiate_version()
        .await
        .expect("the engine answers");
    let request =
        || ExecRequest::new(Command::argv(["echo", "hi"])).timeout(Duration::from_secs(60));
    let mut exec = Metric::new("exec p50", Target::AtMost(0.90));
    let mut bare = Metric::new("exec p50 vs bare API exec", Target::AtMost(1.05));
    let mut wrapper = Metric::new("exec wrapper cost", Target::ReportedOnly);
    let mut engine_init = Metric::new(
        "exec wrapper cost under the engine's init",
        Target::ReportedOnly,
    );
    let mut containers = Metric::new(
        "bare API exec, the sandbox's container vs the raw one",
        Target::ReportedOnly,
    );
    let mut host = Metric::new(
        "exec vs the wrapped API exec on the sandbox's container",
        Target::ReportedOnly,
    );
    for round in 0..WARMUP + ROUNDS {
        let times = round_robin(
            round,
            vec![
                Box::pin(async {
                    let output = sandbox.exec(request()).await.expect("exec runs");
                    assert_eq!(output.stdout, b"hi\n");
                }),
                Box::pin(async {
                    docker(&["exec", &raw, "echo", "hi"]).await;
                }),
                Box::pin(bare_api_exec(&api, &raw)),
                Box::pin(wrapped_api_exec(&api, &raw)),
                Box::pin(bare_api_exec(&api, sandbox.instance_id())),
                Box::pin(wrapped_api_exec(&api, sandbox.instance_id())),
                Box::pin(engine_init_api_exec(&api, &raw)),
            ],
        )
        .await;
        if round >= WARMUP {
            exec.push((times[0], times[1]));
            bare.push((times[0], times[2]));
            wrapper.push((times[3], times[2]));
            containers.push((times[4], times[2]));
            host.push((times[0], times[5]));
            engine_init.push((times[6], times[2]));
        }
    }
    let mut passed = exec.report()
        & exec.report_p95("exec p95")
        & bare.report()
        & wrapper.report_added("exec wrapper cost", 6.0);
    engine_init.report_added("exec wrapper cost under the engine's init", 6.0);
    containers.report();
    host.report();

    // The flood: 1 GiB of output against the default budget.
    let before = peak_rss_kib(true);
    let started = std::time::Instant::now();
    let flood = sandbox
        .exec(
            ExecRequest::new(Command::argv(["head", "-c", "1073741824", "/dev/zero"]))
                .timeout(Duration::from_secs(120)),
        )
        .await;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let growth_mib = peak_rss_kib(false).saturating_sub(before) as f64 / 1024.0;
    let refused = matches!(&flood, Err(e) if e.kind() == ErrorKind::OutputLimitExceeded);
    let flood_ok = refused && growth_mib <= 24.0;
    println!(
        "flood: 1 GiB printed, refused with the output limit: {refused}, host peak RSS growth \
         {growth_mib:.1} MiB (target <= 24 MiB) {} [{took:.0} ms]",
        if flood_ok { "PASS" } else { "FAIL" }
    );
    // The ratio of this row is the RSS growth over its 24 MiB allowance.
    record_row(
        "flood",
        took,
        0.0,
        growth_mib / 24.0,
        "refused; RSS growth <= 24 MiB",
        flood_ok,
    );
    passed &= flood_ok;

    drop(sandbox);
    passed &= concurrent_exec(&backend, &scope).await;
    sweep.finish(&backend, &["t", "concurrent"]).await;
    exit_with(passed);
}

/// Runs `exec` for every (sandbox, repeat) pair at once under the in-flight bound; returns the
/// wall time and how many failed.
async fn flood_of_execs<F, Fut>(targets: usize, exec: F) -> (Duration, usize)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let slots = tokio::sync::Semaphore::new(CONCURRENT_IN_FLIGHT);
    let failures = AtomicUsize::new(0);
    let started = Instant::now();
    let all = (0..targets * EXECS_PER_SANDBOX).map(|n| {
        let (slots, failures, exec) = (&slots, &failures, &exec);
        async move {
            let _slot = slots.acquire().await.expect("the bound is never closed");
            if !exec(n % targets).await {
                failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    futures_util::future::join_all(all).await;
    (started.elapsed(), failures.load(Ordering::Relaxed))
}

/// One raw `docker exec <id> echo hi`, under the raw call deadline; whether it printed `hi`.
async fn cli_echo(id: &str) -> bool {
    let run = tokio::process::Command::new("docker")
        .args(["exec", id, "echo", "hi"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    matches!(
        tokio::time::timeout(Duration::from_secs(120), run).await,
        Ok(Ok(out)) if out.status.success() && out.stdout == b"hi\n"
    )
}

/// The `concurrent exec` row: one measurement a side (the row is too costly to repeat here).
async fn concurrent_exec(backend: &backend_docker::DockerBackend, scope: &str) -> bool {
    let spec = SandboxSpec::builder("bench")
        .image(support::IMAGE)
        .build()
        .expect("a valid spec");
    let mut sandboxes = Vec::with_capacity(CONCURRENT_SANDBOXES);
    let mut raw = Vec::with_capacity(CONCURRENT_SANDBOXES);
    for n in 0..CONCURRENT_SANDBOXES {
        let key = SandboxKey::conversation(scope, "concurrent", format!("c{n}"));
        sandboxes.push(backend.acquire(&key, &spec).await.expect("acquire"));
        raw.push(run_raw_container(scope).await);
    }
    let request =
        || ExecRequest::new(Command::argv(["echo", "hi"])).timeout(Duration::from_secs(120));
    // Ours first, then the CLI: one run each, in this fixed order.
    let (ours, ours_failed) = flood_of_execs(CONCURRENT_SANDBOXES, |n| {
        let sandbox = &sandboxes[n];
        async move {
            matches!(sandbox.exec(request()).await, Ok(out) if out.stdout == b"hi\n" && out.exit_code == 0)
        }
    })
    .await;
    let (cli, cli_failed) = flood_of_execs(CONCURRENT_SANDBOXES, |n| cli_echo(&raw[n])).await;
    drop(sandboxes);

    let ours_ms = ours.as_secs_f64() * 1000.0;
    let cli_ms = cli.as_secs_f64() * 1000.0;
    let ratio = ours_ms / cli_ms;
    let pass = ours_failed == 0 && ratio <= 1.0;
    let total = CONCURRENT_SANDBOXES * EXECS_PER_SANDBOX;
    println!(
        "concurrent exec: {CONCURRENT_SANDBOXES} x {EXECS_PER_SANDBOX} ({total} execs, \
         {CONCURRENT_IN_FLIGHT} in flight): backend {ours_ms:.0} ms with {ours_failed} failed, \
         CLI {cli_ms:.0} ms with {cli_failed} failed, ratio {ratio:.2} (target 0 failures, \
         <= 1.0) {}",
        if pass { "PASS" } else { "FAIL" }
    );
    record_row(
        "concurrent exec",
        ours_ms,
        cli_ms,
        ratio,
        "0 failures, <= 1.0",
        pass,
    );
    pass
}
