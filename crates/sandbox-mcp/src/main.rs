//! The `sandbox-mcp` binary: parses the command line, connects the backend, and serves MCP on
//! stdio or Streamable HTTP. Stdout belongs to the protocol on stdio: every log goes to stderr.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rmcp::ServiceExt;
use sandbox_mcp::http::Tokens;
use sandbox_mcp::liveness::Liveness;
use sandbox_mcp::stdio::BoundedLines;
use sandbox_mcp::{Cli, SandboxServer, Settings, Shared};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    sandbox_backends::log_to_stderr_from_env("SANDBOX_MCP_LOG");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox-mcp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    runtime.shutdown_timeout(std::time::Duration::from_secs(30));
    code
}

async fn run(cli: Cli) -> ExitCode {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("sandbox-mcp: {what}: {e}");
        ExitCode::FAILURE
    };
    let tokens = match (&cli.http, &cli.token_file) {
        (Some(_), Some(path)) => match Tokens::read(path) {
            Ok(t) => Some(t),
            Err(e) => return fail("--token-file", &e),
        },
        (Some(_), None) => return fail("--http", &"--token-file is required"),
        (None, Some(_)) => return fail("--token-file", &"only --http takes tokens"),
        (None, None) => None,
    };
    let egress_log = Arc::new(sandbox_mcp::egress_log::EgressLog::default());
    let observer = sandbox_mcp::egress_log::EgressLog::observer(&egress_log);
    let backend = match sandbox_backends::connect_serving(
        &cli.backends,
        &[],
        &cli.pool,
        Some(observer),
    )
    .await
    {
        Ok(b) => b,
        Err(e) => return fail("backend", &e),
    };
    let egress = match sandbox_mcp::tools::OperatorEgress::from_flags(&cli, &*backend).await {
        Ok(e) => e,
        Err(e) => return fail("egress", &e),
    };
    let router = match sandbox_backends::gated_router(&cli.backends, backend) {
        Ok(r) => r,
        Err(e) => return fail("backend", &e),
    };
    let image = match &cli.image {
        Some(image) => Some(image.clone()),
        None => match sandbox_backends::ensure_default_image(cli.backends.backend, &[]).await {
            Ok(image) => image,
            Err(e) => return fail("image", &e),
        },
    };
    let liveness = match Liveness::start(&cli.state_dir()) {
        Ok(l) => l,
        Err(e) => return fail("state", &e),
    };
    if !liveness.judges() {
        eprintln!(
            "sandbox-mcp: procfs does not name this process: no server's sandboxes are judged \
             ended, and what this one leaves if killed stays for `sandboxctl purge`"
        );
    }
    let shared = Shared::with_egress_log(
        router,
        Settings::from_cli(&cli, image, egress),
        liveness,
        cli.ttl(),
        egress_log,
    );
    match shared.sweep_orphans().await {
        Ok(0) => {}
        Ok(n) => eprintln!("sandbox-mcp: disposed of the sandboxes of {n} ended server(s)"),
        Err(e) => eprintln!("sandbox-mcp: could not look for ended servers' sandboxes: {e}"),
    }
    let stop = CancellationToken::new();
    let expiry = tokio::spawn(expire_loop(shared.clone(), stop.clone(), cli.ttl()));
    let code = match (cli.http, tokens) {
        (Some(addr), Some(tokens)) => {
            let listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => return fail("--http", &e),
            };
            if let Ok(bound) = listener.local_addr() {
                eprintln!("sandbox-mcp: serving http://{bound}/mcp");
            }
            let served = sandbox_mcp::http::serve(
                shared.clone(),
                tokens,
                listener,
                cli.allow_origins.clone(),
                cli.allow_host_headers.clone(),
                cli.http_limits(),
                stop.clone(),
            );
            tokio::select! {
                r = served => match r { Ok(()) => ExitCode::SUCCESS, Err(e) => fail("--http", &e) },
                () = terminated() => ExitCode::SUCCESS,
            }
        }
        _ => {
            // A request over the limit is answered with an error, not dropped unanswered.
            let max_line = cli.http_limits().max_request_bytes;
            let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(
                BoundedLines::new(tokio::io::stdin(), max_line),
                tokio::io::stdout(),
            )
            .with_max_line_length(max_line.saturating_add(64 * 1024));
            let service = match SandboxServer::new(shared.clone()).serve(transport).await {
                Ok(s) => s,
                Err(e) => return fail("stdio", &e),
            };
            tokio::select! {
                _ = service.waiting() => ExitCode::SUCCESS,
                () = terminated() => ExitCode::SUCCESS,
            }
        }
    };
    stop.cancel();
    let _ = expiry.await;
    if !cli.keep {
        // What creates in flight make is disposed of with the rest, not left running.
        let unfinished = shared.finish_creates(CREATE_WAIT).await;
        if unfinished > 0 {
            eprintln!(
                "sandbox-mcp: {unfinished} create(s) still running after {}s; disposing of them by key",
                CREATE_WAIT.as_secs()
            );
        }
        shared.dispose_all().await;
    }
    // A clean end leaves no lock behind.
    shared.liveness().end();
    code
}

/// How long the server's end waits for the creates in flight before it disposes of their keys.
const CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Disposes of idle sandboxes as they expire, until `stop`.
async fn expire_loop(shared: Arc<Shared>, stop: CancellationToken, ttl: std::time::Duration) {
    loop {
        let next = shared
            .expire()
            .await
            .unwrap_or_else(|| tokio::time::Instant::now() + ttl);
        // A handle made after this computed `next` expires no sooner than one TTL from now.
        tokio::select! {
            () = tokio::time::sleep_until(next.min(tokio::time::Instant::now() + ttl)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// SIGINT, SIGTERM or SIGHUP.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut streams: Vec<_> = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ]
    .into_iter()
    .filter_map(|k| signal(k).ok())
    .collect();
    if streams.is_empty() {
        return std::future::pending().await;
    }
    let waits = streams
        .iter_mut()
        .map(|s| Box::pin(async move { s.recv().await }));
    futures_util::future::select_all(waits).await;
}
