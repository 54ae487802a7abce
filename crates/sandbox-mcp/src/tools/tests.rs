//! The tools driven through the protocol, in process: an rmcp client talks to a
//! [`SandboxServer`] over an in-memory pipe, in front of the core's fake backend.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::ServiceExt as _;
use sandbox_core::testing::FakeBackend;
use sandbox_core::{Capability, DisposalCode, Isolation, Router, RouterConfig, SandboxBackend};
use serde_json::{json, Value};

use super::{SandboxServer, Settings, Shared};
use crate::liveness::Liveness;

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// A server over a fake backend, a client connected to it, and what the test inspects.
struct Served {
    fake: Arc<FakeBackend>,
    shared: Arc<Shared>,
    client: Client,
    _state: tempfile::TempDir,
}

/// A state directory of the test's own, private as the server requires.
fn private_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

async fn serve() -> Served {
    serve_with(crate::handles::SandboxLimits::default()).await
}

async fn serve_with(limits: crate::handles::SandboxLimits) -> Served {
    serve_on(FakeBackend::new("fake", Isolation::Microvm), limits).await
}

/// A server over a fake that declares `snapshot`.
async fn serve_snapshots(limits: crate::handles::SandboxLimits) -> Served {
    let fake = FakeBackend::new("fake", Isolation::Microvm).declaring(&[Capability::Snapshot]);
    serve_on(fake, limits).await
}

async fn serve_on(fake: FakeBackend, limits: crate::handles::SandboxLimits) -> Served {
    serve_configured(fake, |settings| settings.limits = limits).await
}

async fn serve_configured(fake: FakeBackend, configure: impl FnOnce(&mut Settings)) -> Served {
    let fake = Arc::new(fake);
    let backend: Arc<dyn SandboxBackend> = fake.clone();
    let router = Router::new(vec![backend], RouterConfig::default()).unwrap();
    let state = private_dir();
    let settings = Settings {
        scope: "test".to_owned(),
        agent: "agent".to_owned(),
        image: None,
        allow_hosts: Vec::new(),
        egress: Default::default(),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 1 << 20,
        max_file_bytes: 1 << 20,
        limits: crate::handles::SandboxLimits::default(),
        max_request_bytes: crate::config::request_bytes_for(1 << 20),
        http: false,
    };
    let mut settings = settings;
    configure(&mut settings);
    let liveness = Liveness::start(state.path()).unwrap();
    let shared = Shared::new(router, settings, liveness, Duration::from_secs(600));
    let (server_end, client_end) = tokio::io::duplex(1 << 16);
    let server = SandboxServer::new(shared.clone());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_end).await.unwrap();
    Served {
        fake,
        shared,
        client,
        _state: state,
    }
}

async fn call(client: &Client, name: &'static str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("tool arguments are an object");
    };
    let params = CallToolRequestParams::new(name).with_arguments(arguments);
    tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
        .await
        .expect("the call answers")
        .expect("the call is served")
}

/// A call that must succeed: its structured result.
async fn ok(client: &Client, name: &'static str, arguments: Value) -> Value {
    let result = call(client, name, arguments).await;
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    result.structured_content.expect("a structured result")
}

/// A dispose the engine fails, on a fresh server: the server, and the handle.
async fn failed_dispose() -> (Served, String) {
    let served = serve().await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    assert_eq!(served.fake.instances().len(), 1);
    served
        .fake
        .update_faults(|f| f.dispose_failure = Some(DisposalCode::Refused));
    let failed = call(
        &served.client,
        "sandbox_dispose",
        json!({ "sandbox": handle }),
    )
    .await;
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    let error = &failed.structured_content.expect("a structured error")["error"];
    assert_eq!(error["kind"], "engine", "{error}");
    assert_eq!(error["retryable"], true, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("retry"),
        "{error}"
    );
    assert_eq!(served.fake.instances().len(), 1, "nothing was removed");
    served.fake.update_faults(|f| f.dispose_failure = None);
    (served, handle)
}

#[tokio::test]
async fn a_failed_dispose_is_retried_at_the_servers_end() {
    let (served, _) = failed_dispose().await;
    served.shared.dispose_all().await;
    assert!(
        served.fake.instances().is_empty(),
        "the server's end left the sandbox whose disposal failed: {:?}",
        served.fake.instances()
    );
}

#[tokio::test]
async fn a_failed_dispose_is_retried_by_its_principal() {
    let (served, handle) = failed_dispose().await;
    let again = ok(
        &served.client,
        "sandbox_dispose",
        json!({ "sandbox": handle }),
    )
    .await;
    assert_eq!(again["disposed"], true, "{again}");
    assert!(served.fake.instances().is_empty());
    // Done now: the handle names nothing, and the end has nothing left to do.
    let done = ok(
        &served.client,
        "sandbox_dispose",
        json!({ "sandbox": handle }),
    )
    .await;
    assert_eq!(done["disposed"], false, "{done}");
    assert_eq!(served.shared.dispose_all().await, 0);
}

/// A create the fake holds for `delay`, and the server's end begun once it is in flight (after
/// `wait` for creates): the create's answer, and what the end disposed of.
async fn end_during_create(
    served: &Served,
    delay: Duration,
    wait: Duration,
) -> (CallToolResult, usize, usize) {
    served.fake.update_faults(|f| f.acquire_delay = Some(delay));
    let create = call(&served.client, "sandbox_create", json!({}));
    let end = async {
        while served.fake.acquire_calls() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let unfinished = served.shared.finish_creates(wait).await;
        (unfinished, served.shared.dispose_all().await)
    };
    let (made, (unfinished, disposed)) = tokio::join!(create, end);
    (made, unfinished, disposed)
}

#[tokio::test]
async fn the_end_waits_for_a_create_in_flight_and_disposes_of_what_it_made() {
    let served = serve().await;
    let (made, unfinished, disposed) =
        end_during_create(&served, Duration::from_millis(300), Duration::from_secs(30)).await;
    assert_ne!(made.is_error, Some(true), "{made:?}");
    assert_eq!((unfinished, disposed), (0, 1));
    assert!(
        served.fake.instances().is_empty(),
        "the create's sandbox was left"
    );
    // Once the end has begun, no create starts.
    let late = call(&served.client, "sandbox_create", json!({})).await;
    assert_eq!(late.is_error, Some(true), "{late:?}");
    assert_eq!(
        late.structured_content.unwrap()["error"]["kind"],
        "shutting_down"
    );
    assert_eq!(served.fake.acquire_calls(), 1);
}

#[tokio::test]
async fn a_create_still_running_past_the_wait_is_disposed_of_by_its_key_and_leaves_nothing() {
    let served = serve().await;
    let (_, unfinished, disposed) =
        end_during_create(&served, Duration::from_secs(1), Duration::from_millis(50)).await;
    assert_eq!((unfinished, disposed), (1, 1));
    assert!(
        served.fake.dispose_calls() >= 1,
        "the key in flight was disposed of"
    );
    // The router disposes of what a create of a key disposed of meanwhile makes.
    assert!(
        served.fake.instances().is_empty(),
        "{:?}",
        served.fake.instances()
    );
}

#[tokio::test]
async fn the_sweep_disposes_only_of_what_ended_servers_left() {
    use sandbox_core::SandboxKey;
    let served = serve().await;
    // A live server of the same scope with another state directory, its lock deleted too.
    let other_dir = private_dir();
    let other = Liveness::start(other_dir.path()).unwrap();
    std::fs::remove_file(other_dir.path().join(format!("{}.lock", other.id()))).unwrap();
    // A server whose process ended (a real one, killed and reaped).
    let mut ended = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let ended_owner = crate::liveness::Owner::of(ended.id()).unwrap();
    ended.kill().unwrap();
    ended.wait().unwrap();
    let live = other.thread(0);
    let crashed = format!("{}.00000000000000aa-0", ended_owner.id());
    let foreign = ["another-host-7", "0123456789abcdef0123456789abcdef-1"];
    for thread in [live.as_str(), crashed.as_str()].into_iter().chain(foreign) {
        served.fake.seed_instance(
            &SandboxKey::conversation("test", thread, "agent"),
            "default",
        );
    }
    assert_eq!(served.shared.sweep_orphans().await.unwrap(), 1);
    let mut left: Vec<String> = served
        .fake
        .instances()
        .into_iter()
        .map(|(key, _, _)| key.thread_id)
        .collect();
    left.sort();
    let mut want: Vec<String> = [live.as_str()]
        .into_iter()
        .chain(foreign)
        .map(str::to_owned)
        .collect();
    want.sort();
    assert_eq!(left, want);
}

#[tokio::test]
async fn creates_past_the_limit_are_refused_with_a_retryable_error_until_one_is_disposed_of() {
    let served = serve_with(crate::handles::SandboxLimits {
        per_principal: 2,
        total: 10,
    })
    .await;
    // Three at once: two are made, the third is refused, and no third instance is asked for.
    served
        .fake
        .update_faults(|f| f.acquire_delay = Some(Duration::from_millis(200)));
    let (a, b, c) = tokio::join!(
        call(&served.client, "sandbox_create", json!({})),
        call(&served.client, "sandbox_create", json!({})),
        call(&served.client, "sandbox_create", json!({})),
    );
    let (made, refused): (Vec<_>, Vec<_>) = [a, b, c]
        .into_iter()
        .partition(|r| r.is_error != Some(true));
    assert_eq!((made.len(), refused.len()), (2, 1), "{made:?} {refused:?}");
    let error = &refused[0].structured_content.as_ref().unwrap()["error"];
    assert_eq!(error["kind"], "sandbox_limit", "{error}");
    assert_eq!(error["retryable"], true, "{error}");
    assert!(error["message"].as_str().unwrap().contains('2'), "{error}");
    assert_eq!(served.fake.acquire_calls(), 2);
    assert_eq!(served.fake.instances().len(), 2);
    // A disposal makes room.
    let handle = made[0].structured_content.as_ref().unwrap()["sandbox"].clone();
    ok(
        &served.client,
        "sandbox_dispose",
        json!({ "sandbox": handle }),
    )
    .await;
    ok(&served.client, "sandbox_create", json!({})).await;
    assert_eq!(served.fake.instances().len(), 2);
}

#[tokio::test]
async fn terminal_control_characters_in_output_are_escaped_and_flagged() {
    let served = serve().await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    let raw = "\u{1b}]0;owned\u{7}\u{1b}[2Jvisible\rhidden\tok\n";
    ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": handle, "path": "t", "content": raw }),
    )
    .await;
    let ran = ok(
        &served.client,
        "sandbox_exec",
        json!({ "sandbox": handle, "command": "cat t" }),
    )
    .await;
    assert_eq!(
        ran["stdout"], "\\x1b]0;owned\\x07\\x1b[2Jvisible\\x0dhidden\tok\n",
        "{ran}"
    );
    assert_eq!(ran["control_escaped"], true, "{ran}");
    let plain = ok(
        &served.client,
        "sandbox_exec",
        json!({ "sandbox": handle, "argv": ["echo", "plain"] }),
    )
    .await;
    assert_eq!(plain["control_escaped"], false, "{plain}");
}

#[tokio::test]
async fn the_write_tool_states_the_file_and_request_limits() {
    let served = serve().await;
    let tools = served.client.list_all_tools().await.unwrap();
    let write = tools
        .iter()
        .find(|t| t.name == "sandbox_write_file")
        .unwrap();
    let text = write.description.as_deref().unwrap();
    let request = crate::config::request_bytes_for(1 << 20);
    assert!(text.contains(&(1u64 << 20).to_string()), "{text}");
    assert!(text.contains(&request.to_string()), "{text}");
}

/// The names of the tools a server lists.
async fn tool_names(served: &Served) -> Vec<String> {
    let mut names: Vec<String> = served
        .client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    names
}

/// A failed call's error object, checked for its kind.
async fn failed(client: &Client, name: &'static str, arguments: Value, kind: &str) -> Value {
    let result = call(client, name, arguments).await;
    assert_eq!(result.is_error, Some(true), "{name}: {result:?}");
    let error = result.structured_content.expect("a structured error")["error"].clone();
    assert_eq!(error["kind"], kind, "{name}: {error}");
    error
}

#[tokio::test]
async fn reset_and_fork_are_listed_only_where_the_backend_declares_snapshot() {
    let plain = serve().await;
    let names = tool_names(&plain).await;
    assert!(
        !names
            .iter()
            .any(|n| n == "sandbox_reset" || n == "sandbox_fork"),
        "{names:?}"
    );
    // Not listed, and not served either.
    let params = CallToolRequestParams::new("sandbox_reset").with_arguments(
        json!({ "sandbox": "sbx_00000000000000000000000000000000" })
            .as_object()
            .unwrap()
            .clone(),
    );
    assert!(plain.client.call_tool(params).await.is_err());

    let snapshots = serve_snapshots(crate::handles::SandboxLimits::default()).await;
    let names = tool_names(&snapshots).await;
    for tool in ["sandbox_reset", "sandbox_fork"] {
        assert!(names.iter().any(|n| n == tool), "{tool} in {names:?}");
    }
}

#[tokio::test]
async fn a_reset_keeps_the_handle_and_removes_what_was_made_since() {
    let served = serve_snapshots(crate::handles::SandboxLimits::default()).await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": handle, "path": "made", "content": "x" }),
    )
    .await;
    let before = served.fake.instances();
    let reset = ok(
        &served.client,
        "sandbox_reset",
        json!({ "sandbox": handle }),
    )
    .await;
    assert_eq!(reset, json!({ "sandbox": handle, "reset": true }));
    let after = served.fake.instances();
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].2, before[0].2, "the fake replaces the instance");
    failed(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "path": "made" }),
        "not_found",
    )
    .await;
    // The same handle serves the reset sandbox.
    let ran = ok(
        &served.client,
        "sandbox_exec",
        json!({ "sandbox": handle, "argv": ["echo", "again"] }),
    )
    .await;
    assert_eq!(ran["stdout"], "again\n");

    // Typed failures: another handle, the engine's failure (retryable, nothing changed).
    failed(
        &served.client,
        "sandbox_reset",
        json!({ "sandbox": "sbx_00000000000000000000000000000000" }),
        "unknown_sandbox",
    )
    .await;
    served
        .fake
        .update_faults(|f| f.snapshot_failure = Some("/var/run/engine.sock refused".into()));
    let error = failed(
        &served.client,
        "sandbox_reset",
        json!({ "sandbox": handle }),
        "engine",
    )
    .await;
    assert_eq!(error["retryable"], true, "{error}");
    assert!(!error.to_string().contains("/var/run"), "{error}");
    assert_eq!(served.fake.instances(), after);
}

#[tokio::test]
async fn a_fork_is_a_new_handle_of_the_same_principal_counted_against_the_limits() {
    let served = serve_snapshots(crate::handles::SandboxLimits {
        per_principal: 2,
        total: 10,
    })
    .await;
    let made = ok(&served.client, "sandbox_create", json!({ "kind": "py" })).await;
    let source = made["sandbox"].as_str().unwrap().to_owned();
    ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": source, "path": "data/a", "content": "from the source" }),
    )
    .await;
    let fork = ok(&served.client, "sandbox_fork", json!({ "sandbox": source })).await;
    let copy = fork["sandbox"].as_str().unwrap().to_owned();
    assert_ne!(copy, source);
    assert!(copy.starts_with("sbx_") && copy.len() == 36, "{fork}");
    assert_eq!(fork["forked_from"], source.as_str());
    assert_eq!(fork["egress"]["mode"], "closed");
    let read = ok(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": copy, "path": "data/a" }),
    )
    .await;
    assert_eq!(read["content"], "from the source");

    // Listed with the source's kind; independent afterwards.
    let listed = ok(&served.client, "sandbox_list", json!({})).await;
    let kinds: Vec<&str> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["py", "py"], "{listed}");
    ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": copy, "path": "only-in-fork", "content": "f" }),
    )
    .await;
    failed(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": source, "path": "only-in-fork" }),
        "not_found",
    )
    .await;

    // Two held: a third, fork or create, is refused before anything is made.
    let error = failed(
        &served.client,
        "sandbox_fork",
        json!({ "sandbox": source }),
        "sandbox_limit",
    )
    .await;
    assert_eq!(error["retryable"], true, "{error}");
    assert_eq!(served.fake.instances().len(), 2);

    // Disposing of the fork leaves the source, and makes room.
    ok(
        &served.client,
        "sandbox_dispose",
        json!({ "sandbox": copy }),
    )
    .await;
    assert_eq!(served.fake.instances().len(), 1);
    served
        .fake
        .update_faults(|f| f.snapshot_failure = Some("engine down".into()));
    failed(
        &served.client,
        "sandbox_fork",
        json!({ "sandbox": source }),
        "engine",
    )
    .await;
    assert_eq!(
        served.fake.instances().len(),
        1,
        "a failed fork leaves nothing"
    );
    served.fake.update_faults(|f| f.snapshot_failure = None);
    ok(&served.client, "sandbox_fork", json!({ "sandbox": source })).await;
    assert_eq!(served.fake.instances().len(), 2);
    failed(
        &served.client,
        "sandbox_fork",
        json!({ "sandbox": "sbx_00000000000000000000000000000000" }),
        "unknown_sandbox",
    )
    .await;

    // The server's end disposes of forks as of anything it made.
    served.shared.dispose_all().await;
    assert!(served.fake.instances().is_empty());
}

#[tokio::test]
async fn the_file_tools_resolve_paths_against_their_workdir() {
    let served = serve().await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    let wrote = ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": handle, "workdir": "sub/dir", "path": "f", "content": "in sub" }),
    )
    .await;
    assert_eq!(wrote["path"], "f");
    // The same file, named from the work directory.
    let read = ok(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "path": "sub/dir/f" }),
    )
    .await;
    assert_eq!(read["content"], "in sub");
    let read = ok(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "workdir": "sub", "path": "dir/f" }),
    )
    .await;
    assert_eq!(read["content"], "in sub");
    let listed = ok(
        &served.client,
        "sandbox_list_files",
        json!({ "sandbox": handle, "workdir": "sub/dir" }),
    )
    .await;
    assert_eq!(
        listed["entries"],
        json!([{ "path": "f", "kind": "file", "size": 6 }])
    );
    // Confined as exec's is: a workdir never lets a path leave the storage base.
    failed(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "workdir": "sub", "path": "../../../etc/passwd" }),
        "confinement",
    )
    .await;
    failed(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": handle, "workdir": "../..", "path": "x", "content": "" }),
        "confinement",
    )
    .await;
    ok(
        &served.client,
        "sandbox_delete",
        json!({ "sandbox": handle, "workdir": "sub/dir", "path": "f" }),
    )
    .await;
    failed(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "path": "sub/dir/f" }),
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn a_larger_file_is_read_by_its_head_through_the_contract() {
    let served = serve().await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    let handle = made["sandbox"].as_str().unwrap().to_owned();
    ok(
        &served.client,
        "sandbox_write_file",
        json!({ "sandbox": handle, "workdir": "d", "path": "f", "content": "0123456789" }),
    )
    .await;
    // The fake runs no `head`: the head comes from the sandbox's own bounded read.
    let head = ok(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "workdir": "d", "path": "f", "max_bytes": 4 }),
    )
    .await;
    assert_eq!(
        head,
        json!({ "content": "0123", "encoding": "utf8", "size": 10, "truncated": true })
    );
    let whole = ok(
        &served.client,
        "sandbox_read_file",
        json!({ "sandbox": handle, "path": "d/f", "max_bytes": 10 }),
    )
    .await;
    assert_eq!(whole["truncated"], false);
    assert_eq!(whole["content"], "0123456789");
}

/// The operator's rules and grants reach the spec of every sandbox that keeps their hosts (a
/// backend without `egress_paths` refuses such a spec, so whether the create passes shows what
/// the spec carried), and the token appears in no result, error or the settings' debug output.
#[tokio::test]
async fn operator_rules_and_grants_go_with_their_hosts_and_the_token_shows_nowhere() {
    use sandbox_core::credential::{BearerToken, CredentialGrant};
    const SECRET: &str = "operator-SECRET-token";
    let operator = super::OperatorEgress {
        rules: vec![sandbox_backends::egress_flags::parse_rule("api.test GET /v1/*").unwrap()],
        grants: vec![CredentialGrant::new(
            "api.test",
            443,
            None,
            vec!["/v1/*".into()],
            BearerToken::new(SECRET).unwrap(),
            std::time::SystemTime::now() + Duration::from_secs(600),
        )
        .unwrap()],
    };
    let fake = |extra: &[Capability]| {
        let mut declarations = FakeBackend::default_declarations();
        declarations
            .egress_modes
            .insert(sandbox_core::Egress::Allowlist);
        declarations.capabilities.extend(extra.iter().copied());
        // Any method: the fake enforces nothing, it only admits what it declares.
        declarations.egress_method_tokens = None;
        FakeBackend::new("fake", Isolation::Microvm).with_declarations(declarations)
    };
    let configure = |settings: &mut Settings| {
        settings.allow_hosts = operator.server_hosts(&["plain.test".to_owned()]);
        settings.egress = operator.clone();
    };

    // A backend that cannot judge paths: the rule and the grant are in the default spec, so it
    // is refused; narrowed to the other host, neither goes along.
    let served = serve_configured(fake(&[]), configure).await;
    assert!(!format!("{:?}", served.shared.settings()).contains(SECRET));
    let refused = call(&served.client, "sandbox_create", json!({})).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(
        format!("{refused:?}").contains("egress_paths"),
        "{refused:?}"
    );
    assert!(!format!("{refused:?}").contains(SECRET), "{refused:?}");
    let narrowed = ok(
        &served.client,
        "sandbox_create",
        json!({ "allow_hosts": ["plain.test"] }),
    )
    .await;
    assert_eq!(narrowed["egress"]["allow_hosts"], json!(["plain.test"]));

    // A backend that can: the server's hosts (the rule's included), and no token in any result.
    let served = serve_configured(
        fake(&[Capability::EgressMethods, Capability::EgressPaths]),
        configure,
    )
    .await;
    let made = ok(&served.client, "sandbox_create", json!({})).await;
    assert_eq!(
        made["egress"],
        json!({ "mode": "allowlist", "allow_hosts": ["plain.test", "api.test"] })
    );
    let listed = ok(&served.client, "sandbox_list", json!({})).await;
    for result in [&made, &listed] {
        assert!(!result.to_string().contains(SECRET), "{result}");
    }
    // The model cannot reach a host outside the server's, with or without a grant.
    let widened = call(
        &served.client,
        "sandbox_create",
        json!({ "allow_hosts": ["elsewhere.test"] }),
    )
    .await;
    assert_eq!(widened.is_error, Some(true), "{widened:?}");
}
