//! The cost the MCP server adds to one exec: `true` through `sandbox-mcp` over stdio, called by
//! an `rmcp` client as an agent host would call it, against the same exec through the library
//! directly (the same backend construction, router and image), in the same rounds.
//!
//! - `mcp exec`: `sandbox_exec {argv: ["true"]}` on a warm sandbox, against `Sandbox::exec` of
//!   `true` on another warm sandbox. Pass/fail: at most 3 ms added at p50.
//!
//! Each round times both back to back, alternating which goes first, so load from other work on
//! the machine falls on both alike; the added cost is the median of the per-round differences.
//! The server is the release build `cargo bench` makes. Needs the Docker engine and the local
//! default image (`cargo xtask bench` builds it first).

use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Parser as _;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt as _;
use sandbox_backends::BackendChoice;
use sandbox_core::{Command, ExecRequest, SandboxKey, SandboxSpec};
use sandbox_mcp::Cli;
use serde_json::{json, Value};

const WARMUP: usize = 10;
const ROUNDS: usize = 150;
const LIMIT_MS: f64 = 3.0;
const NAME: &str = "mcp exec";

/// The deadline of every call, so a wedged engine or server fails the run instead of hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// One tool call, required to succeed; its structured result.
async fn call(client: &Client, name: &'static str, arguments: Value) -> Value {
    let Value::Object(arguments) = arguments else {
        panic!("tool arguments are an object");
    };
    let params = CallToolRequestParams::new(name).with_arguments(arguments);
    let result = tokio::time::timeout(CALL_TIMEOUT, client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{name} did not answer within {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    result
        .structured_content
        .unwrap_or_else(|| panic!("{name} returned no structured content"))
}

#[tokio::main]
async fn main() {
    let scope = format!("bench-mcp-{}", std::process::id());
    let state = tempfile::tempdir().expect("a temporary state directory");
    // The server's own flags, parsed by the server's own parser: the same backend, gate and
    // default image on both sides.
    let cli = Cli::parse_from(["sandbox-mcp", "--min-isolation", "container"]);
    let image = sandbox_backends::ensure_default_image(BackendChoice::Docker, &[])
        .await
        .expect("the default image")
        .expect("the docker backend has a default image");
    let backend = sandbox_backends::connect(&cli.backends, &[])
        .await
        .expect("the docker backend connects");
    let router = sandbox_backends::gated_router(&cli.backends, backend).expect("a router");
    let key = SandboxKey::conversation(scope.as_str(), "direct", "bench");
    let spec = SandboxSpec::builder("default")
        .image(image.as_str())
        .build()
        .expect("a valid spec");
    let direct = router.acquire(&key, &spec).await.expect("acquire");

    let mut server = tokio::process::Command::new(BIN);
    server
        .args([
            "--min-isolation",
            "container",
            "--scope",
            &scope,
            "--image",
            &image,
        ])
        .arg("--state-dir")
        // A directory the server makes itself, private as it requires.
        .arg(state.path().join("state"))
        .stderr(Stdio::inherit());
    let transport = TokioChildProcess::new(server).expect("the server starts");
    let client: Client = tokio::time::timeout(CALL_TIMEOUT, ().serve(transport))
        .await
        .expect("the handshake within the deadline")
        .expect("the handshake");
    let created = call(&client, "sandbox_create", json!({})).await;
    let handle = created["sandbox"].as_str().expect("a handle").to_owned();

    let mut ours = Vec::with_capacity(ROUNDS);
    let mut raw = Vec::with_capacity(ROUNDS);
    for round in 0..WARMUP + ROUNDS {
        let through_server = async {
            let started = Instant::now();
            let out = call(
                &client,
                "sandbox_exec",
                json!({"sandbox": handle, "argv": ["true"]}),
            )
            .await;
            assert_eq!(out["exit_code"], 0, "{out}");
            started.elapsed()
        };
        let through_library = async {
            let started = Instant::now();
            let request = ExecRequest::new(Command::argv(["true".to_owned()]));
            let out = tokio::time::timeout(CALL_TIMEOUT, direct.exec(request))
                .await
                .expect("the exec within the deadline")
                .expect("the exec");
            assert_eq!(out.exit_code, 0);
            started.elapsed()
        };
        let (server_took, library_took) = if round % 2 == 0 {
            let s = through_server.await;
            (s, through_library.await)
        } else {
            let l = through_library.await;
            (through_server.await, l)
        };
        if round >= WARMUP {
            ours.push(server_took.as_secs_f64() * 1000.0);
            raw.push(library_took.as_secs_f64() * 1000.0);
        }
    }

    let added = paired_bench::median(ours.iter().zip(&raw).map(|(o, r)| o - r).collect());
    let ours_p50 = paired_bench::median(ours);
    let raw_p50 = paired_bench::median(raw);
    let pass = added <= LIMIT_MS;
    println!(
        "{NAME}: ours {ours_p50:.1} ms, raw {raw_p50:.1} ms, added {added:.1} ms at p50 (target ≤ +{LIMIT_MS:.0} ms) {} [{ROUNDS} rounds]",
        if pass { "PASS" } else { "FAIL" }
    );
    paired_bench::record_row(
        NAME,
        ours_p50,
        raw_p50,
        added / LIMIT_MS,
        &format!("added <= {LIMIT_MS:.0} ms at p50"),
        pass,
    );

    // The server disposes of its sandbox at the end of its input; the bench's own goes here.
    tokio::time::timeout(CALL_TIMEOUT, client.cancel())
        .await
        .expect("the server ends within the deadline")
        .expect("the client ends");
    drop(direct);
    let undisposed = router.dispose(&key).await;
    assert!(undisposed.is_none(), "disposal: {undisposed:?}");
    for backend in router.backends() {
        let left = backend.list(&scope, None).await.expect("listing the scope");
        assert!(left.is_empty(), "left behind in {scope}: {left:?}");
    }
    std::process::exit(if pass { 0 } else { 1 });
}
