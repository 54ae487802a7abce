//! The driver against small `sh` fakes of `sbx`: the exact argv and environment of every call,
//! stdin, exit statuses and stderr wordings, JSON shapes, a hang for the deadline and a flood
//! for the budget.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::num::NonZeroU32;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sbx_cli::{
    Call, CreateRequest, Error, ExecRequest, ExitKind, Instant, MemorySize, OutputSink, Removal,
    SbxCli, SbxName, Stream, CREATE_OUTPUT_BUDGET, LISTING_OUTPUT_BUDGET, SMALL_OUTPUT_BUDGET,
};

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A fake `sbx` in a directory of its own. Every run records its arguments (one per line) in
/// `args`, its environment in `env` and, for `exec -i`, its stdin in `stdin`; then runs `body`.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new(body: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "#!/bin/sh\n\
             d=$(dirname \"$0\")\n\
             : > \"$d/args\"\n\
             for a in \"$@\"; do printf '%s\\n' \"$a\" >> \"$d/args\"; done\n\
             env > \"$d/env\"\n\
             [ \"$1 $2\" = \"exec -i\" ] && cat > \"$d/stdin\"\n\
             {body}\n"
        );
        let path = dir.path().join("sbx");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fake { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("sbx")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A driver whose management env holds a secret-looking name that the guest filter drops.
    fn driver(&self) -> SbxCli {
        SbxCli::builder(self.path(), |name: &OsStr| {
            !name.to_string_lossy().contains("TOKEN")
        })
        .management_env([
            ("PATH", PATH),
            ("SBX_HOME_HINT", "/srv/sbx"),
            ("GITHUB_TOKEN", "ghp_not_for_guests"),
        ])
        .build()
        .unwrap()
    }

    fn args(&self) -> Vec<String> {
        std::fs::read_to_string(self.file("args"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The recorded environment, without what `sh` adds on its own.
    fn env(&self) -> BTreeMap<String, String> {
        std::fs::read_to_string(self.file("env"))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_once('='))
            .filter(|(name, _)| !matches!(*name, "PWD" | "OLDPWD" | "SHLVL" | "_"))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    }

    fn ran(&self) -> bool {
        self.file("args").exists()
    }
}

fn name(text: &str) -> SbxName {
    SbxName::new(text).unwrap()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

fn env_of(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn version_runs_with_exactly_the_management_env() {
    let fake = Fake::new("echo ' sbx version 0.45.1 '");
    assert_eq!(fake.driver().version().await.unwrap(), "sbx version 0.45.1");
    assert_eq!(fake.args(), ["version"]);
    assert_eq!(
        fake.env(),
        env_of(&[
            ("PATH", PATH),
            ("SBX_HOME_HINT", "/srv/sbx"),
            ("GITHUB_TOKEN", "ghp_not_for_guests"),
            ("SBX_NO_TELEMETRY", "1"),
        ])
    );
}

#[test]
fn debug_shows_env_names_never_values() {
    let fake = Fake::new("exit 0");
    let shown = format!("{:?}", fake.driver());
    assert!(shown.contains("GITHUB_TOKEN"), "{shown}");
    assert!(!shown.contains("ghp_not_for_guests"), "{shown}");
}

#[tokio::test]
async fn exec_gets_the_filtered_env() {
    let fake = Fake::new("exit 0");
    let sbx = fake.driver();
    let guest: Vec<(&str, &str)> = sbx
        .guest_env()
        .iter()
        .map(|(n, v)| (n.to_str().unwrap(), v.to_str().unwrap()))
        .collect();
    assert_eq!(
        guest,
        [
            ("PATH", PATH),
            ("SBX_HOME_HINT", "/srv/sbx"),
            ("SBX_NO_TELEMETRY", "1")
        ]
    );
    sbx.exec(&ExecRequest::new(name("maf-1"), ["true"], soon()))
        .await
        .unwrap();
    assert_eq!(
        fake.env(),
        env_of(&[
            ("PATH", PATH),
            ("SBX_HOME_HINT", "/srv/sbx"),
            ("SBX_NO_TELEMETRY", "1"),
        ])
    );
}

#[tokio::test]
async fn telemetry_switch_replaces_the_callers_value_or_stays_out() {
    let fake = Fake::new("exit 0");
    let on = SbxCli::builder(fake.path(), |_: &OsStr| true)
        .management_env([("PATH", PATH), ("SBX_NO_TELEMETRY", "0")])
        .build()
        .unwrap();
    on.version().await.unwrap();
    assert_eq!(
        fake.env(),
        env_of(&[("PATH", PATH), ("SBX_NO_TELEMETRY", "1")])
    );

    let off = SbxCli::builder(fake.path(), |_: &OsStr| true)
        .management_env([("PATH", PATH)])
        .no_telemetry(false)
        .build()
        .unwrap();
    off.version().await.unwrap();
    assert_eq!(fake.env(), env_of(&[("PATH", PATH)]));
}

#[tokio::test]
async fn a_bare_name_is_found_on_the_management_path() {
    let fake = Fake::new("echo found");
    let sbx = SbxCli::builder("sbx", |_: &OsStr| true)
        .management_env([("PATH", format!("{}:{PATH}", fake.dir.path().display()))])
        .build()
        .unwrap();
    assert_eq!(sbx.version().await.unwrap(), "found");
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_failure_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-sbx");
    let sbx = SbxCli::builder(&missing, |_: &OsStr| true)
        .management_env([("PATH", PATH)])
        .build()
        .unwrap();
    let err = sbx.ls().await.unwrap_err();
    assert!(matches!(err, Error::SpawnFailed { ref sbx_path, .. } if sbx_path == &missing));
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
fn the_builder_refuses_an_empty_path_and_zero_timeouts() {
    let refused = |builder: sbx_cli::SbxCliBuilder| {
        matches!(builder.build(), Err(Error::InvalidArgument { .. }))
    };
    assert!(refused(SbxCli::builder("", |_: &OsStr| true)));
    assert!(refused(
        SbxCli::builder("sbx", |_: &OsStr| true).command_timeout(Duration::ZERO)
    ));
    assert!(refused(
        SbxCli::builder("sbx", |_: &OsStr| true).create_timeout(Duration::ZERO)
    ));
}

#[test]
fn the_getters_read_what_the_builder_set() {
    let sbx = SbxCli::builder("sbx", |_: &OsStr| true)
        .command_timeout(Duration::from_secs(3))
        .create_timeout(Duration::from_secs(7))
        .build()
        .unwrap();
    assert_eq!(sbx.command_timeout(), Duration::from_secs(3));
    assert_eq!(sbx.create_timeout(), Duration::from_secs(7));
    let defaults = SbxCli::builder("sbx", |_: &OsStr| true).build().unwrap();
    assert_eq!(defaults.create_timeout(), sbx_cli::DEFAULT_CREATE_TIMEOUT);
}

#[tokio::test]
async fn settings_get_reads_the_trimmed_value_and_refuses_option_like_keys() {
    let fake = Fake::new("printf '  FALSE\\n'");
    let sbx = fake.driver();
    assert_eq!(
        sbx.settings_get("ssh.agentForwardingEnabled")
            .await
            .unwrap(),
        "FALSE"
    );
    assert_eq!(
        fake.args(),
        ["settings", "get", "ssh.agentForwardingEnabled"]
    );
    for bad in ["", "--all", "a b"] {
        let fresh = Fake::new("exit 0");
        let err = fresh.driver().settings_get(bad).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{bad:?}: {err}"
        );
        assert!(!fresh.ran(), "{bad:?} reached sbx");
    }
}

#[tokio::test]
async fn create_passes_the_full_argv_and_classifies_its_failures() {
    let fake = Fake::new("echo 'Created sandbox maf-1'");
    let sbx = fake.driver();
    let request = CreateRequest::new(
        name("maf-1"),
        "/var/ws/maf-1/ws-0123456789ab",
        NonZeroU32::new(2).unwrap(),
        MemorySize::new("2g").unwrap(),
    );
    sbx.create(&request).await.unwrap();
    assert_eq!(
        fake.args(),
        [
            "create",
            "shell",
            "--name",
            "maf-1",
            "--cpus",
            "2",
            "--memory",
            "2g",
            "--skills",
            "off",
            "--deny-network",
            "**",
            "/var/ws/maf-1/ws-0123456789ab"
        ]
    );
    sbx.create(&request.clone().template("sha256:abc"))
        .await
        .unwrap();
    assert_eq!(
        fake.args()[12..],
        ["--template", "sha256:abc", "/var/ws/maf-1/ws-0123456789ab"]
    );

    let taken = Fake::new("echo 'ERROR: sandbox maf-1 already exists' >&2; exit 1");
    let err = taken.driver().create(&request).await.unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists { ref name, .. } if name == "maf-1"),
        "{err:?}"
    );

    let no_shell = Fake::new("echo 'ERROR: kit startup exited with code 127' >&2; exit 1");
    let err = no_shell.driver().create(&request).await.unwrap_err();
    assert!(matches!(err, Error::TemplateCannotStart { .. }), "{err:?}");

    let relative = Fake::new("exit 0");
    let err = relative
        .driver()
        .create(&CreateRequest::new(
            name("maf-1"),
            "ws",
            NonZeroU32::new(1).unwrap(),
            MemorySize::new("1g").unwrap(),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let err = relative
        .driver()
        .create(&request.clone().template("--privileged"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(!relative.ran());
}

#[tokio::test]
async fn exec_builds_each_form_and_returns_the_raw_output() {
    let fake = Fake::new("printf 'out\\0put'; printf 'err' >&2; exit 7");
    let sbx = fake.driver();
    let output = sbx
        .exec(&ExecRequest::new(
            name("maf-1"),
            ["sh", "-c", "pwd -P"],
            soon(),
        ))
        .await
        .unwrap();
    assert_eq!(output.status, ExitKind::Exited(7));
    assert_eq!(output.stdout, b"out\0put");
    assert_eq!(output.stderr, b"err");
    assert_eq!(fake.args(), ["exec", "maf-1", "sh", "-c", "pwd -P"]);
    assert!(!fake.file("stdin").exists());

    sbx.exec(&ExecRequest::new(name("maf-1"), ["sh", "-c", ":"], soon()).as_root())
        .await
        .unwrap();
    assert_eq!(
        fake.args(),
        ["exec", "-u", "root", "maf-1", "sh", "-c", ":"]
    );

    let bytes: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    sbx.exec(
        &ExecRequest::new(name("maf-1"), ["sh", "-c", "cat"], soon())
            .as_root()
            .stdin(bytes.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        fake.args(),
        ["exec", "-i", "-u", "root", "maf-1", "sh", "-c", "cat"]
    );
    assert_eq!(std::fs::read(fake.file("stdin")).unwrap(), bytes);
}

/// A streaming sink that keeps stdout.
#[derive(Default)]
struct KeptStdout(Vec<u8>);

impl OutputSink for KeptStdout {
    async fn accept(&mut self, stream: Stream, bytes: &[u8]) -> bounded_process::Result<()> {
        if stream == Stream::Stdout {
            self.0.extend_from_slice(bytes);
        }
        Ok(())
    }
}

#[tokio::test]
async fn exec_streaming_passes_i_once_for_bytes_or_a_reader() {
    let fake = Fake::new("printf streamed");
    let sbx = fake.driver();
    let mut sink = KeptStdout::default();
    let request = ExecRequest::new(name("maf-1"), ["cat"], soon()).stdin(b"bytes".to_vec());
    let status = sbx.exec_streaming(&request, None, &mut sink).await.unwrap();
    assert_eq!(status, ExitKind::Exited(0));
    assert_eq!(sink.0, b"streamed");
    assert_eq!(fake.args(), ["exec", "-i", "maf-1", "cat"]);
    assert_eq!(std::fs::read(fake.file("stdin")).unwrap(), b"bytes");

    let request = ExecRequest::new(name("maf-1"), ["cat"], soon());
    let reader: Box<dyn tokio::io::AsyncRead + Send + Unpin> = Box::new(&b"from a reader"[..]);
    sbx.exec_streaming(&request, Some(reader), &mut KeptStdout::default())
        .await
        .unwrap();
    assert_eq!(fake.args(), ["exec", "-i", "maf-1", "cat"]);
    assert_eq!(std::fs::read(fake.file("stdin")).unwrap(), b"from a reader");

    sbx.exec_streaming(&request, None, &mut KeptStdout::default())
        .await
        .unwrap();
    assert_eq!(fake.args(), ["exec", "maf-1", "cat"]);
}

#[tokio::test]
async fn exec_without_i_has_stdin_closed() {
    // A fake that would hang reading an open stdin; with /dev/null it reads nothing at once.
    let fake = Fake::new("wc -c");
    let output = fake
        .driver()
        .exec(&ExecRequest::new(name("maf-1"), ["sh"], soon()))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0");
}

#[tokio::test]
async fn exec_refuses_command_lines_sbx_would_misread() {
    let fake = Fake::new("exit 0");
    let sbx = fake.driver();
    let empty: [&str; 0] = [];
    for argv in [
        &empty[..],
        &["-u", "root"][..],
        &["sh", "", "x"][..],
        &["sh", "a\0b"][..],
    ] {
        let err = sbx
            .exec(&ExecRequest::new(
                name("maf-1"),
                argv.iter().copied(),
                soon(),
            ))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{argv:?}: {err}"
        );
    }
    assert!(!fake.ran());
}

#[tokio::test]
async fn exec_checked_classifies_a_failed_status() {
    let fake = Fake::new("echo 'ERROR: sandbox maf-1 not found' >&2; exit 1");
    let err = fake
        .driver()
        .exec_checked(&ExecRequest::new(name("maf-1"), ["sh", "-c", ":"], soon()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NotFound { call: Call::Exec, ref name, .. } if name == "maf-1"),
        "{err:?}"
    );
    let ok = Fake::new("echo /w");
    let output = ok
        .driver()
        .exec_checked(&ExecRequest::new(
            name("maf-1"),
            ["sh", "-c", "pwd -P"],
            soon(),
        ))
        .await
        .unwrap();
    assert_eq!(output.stdout, b"/w\n");
}

#[tokio::test]
async fn rm_reads_not_found_as_gone() {
    let fake = Fake::new("exit 0");
    assert_eq!(
        fake.driver().rm(&name("maf-1")).await.unwrap(),
        Removal::Removed
    );
    assert_eq!(fake.args(), ["rm", "--force", "maf-1"]);

    let absent = Fake::new("echo 'ERROR: sandbox maf-1 not found' >&2; exit 1");
    assert_eq!(
        absent.driver().rm(&name("maf-1")).await.unwrap(),
        Removal::WasAbsent
    );

    let lapsed =
        Fake::new("echo \"ERROR: You are not logged in. Run 'sbx login' to sign in.\" >&2; exit 1");
    let err = lapsed.driver().rm(&name("maf-1")).await.unwrap_err();
    assert!(
        matches!(err, Error::LoginRequired { call: Call::Rm, .. }),
        "{err:?}"
    );

    let silent = Fake::new("exit 4");
    let err = silent.driver().rm(&name("maf-1")).await.unwrap_err();
    assert!(
        matches!(err, Error::Failed { call: Call::Rm, ref detail } if detail == "exit 4"),
        "{err:?}"
    );
}

#[tokio::test]
async fn ls_parses_both_shapes_and_never_reads_a_wrong_one_as_empty() {
    let array = Fake::new(r#"echo '[{"name":"maf-1","id":"i1","workspaces":["/w"]}]'"#);
    let rows = array.driver().ls().await.unwrap();
    assert_eq!(array.args(), ["ls", "--json"]);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].id.as_deref()),
        ("maf-1", Some("i1"))
    );

    let keyed =
        Fake::new(r#"echo '{"sandboxes":[{"name":"maf-1","id":"i1","workspaces":["/w"]}]}'"#);
    assert_eq!(keyed.driver().ls().await.unwrap(), rows);

    let malformed = Fake::new(r#"echo '{"count":0}'"#);
    let err = malformed.driver().ls().await.unwrap_err();
    assert!(
        matches!(err, Error::Malformed { call: Call::Ls, .. }),
        "{err:?}"
    );

    let daemon = Fake::new(
        "echo 'ERROR: backend unavailable: sandboxd cannot reach its engine' >&2; exit 1",
    );
    let err = daemon.driver().ls().await.unwrap_err();
    assert!(
        matches!(err, Error::DaemonFault { call: Call::Ls, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("sbx daemon restart"));
}

#[tokio::test]
async fn mcp_secret_and_policy_listings() {
    let mcp =
        Fake::new(r#"echo '{"servers":[{"name":"sim-mcp","url":"http://127.0.0.1:9/mcp"}]}'"#);
    let servers = mcp.driver().mcp_ls().await.unwrap();
    assert_eq!(mcp.args(), ["mcp", "ls", "--json"]);
    assert_eq!(servers[0].name.as_deref(), Some("sim-mcp"));

    let secrets = Fake::new(r#"echo '{"secrets":[],"env_only_count":0,"custom_secrets":[]}'"#);
    let list = secrets.driver().secret_ls().await.unwrap();
    assert_eq!(secrets.args(), ["secret", "ls", "--json"]);
    assert!(list.secrets.is_empty());

    let policy = Fake::new(
        r#"echo '{"rules":[{"scope":"sandbox:maf-1","decision":"deny","status":"active","resource_type":"network","resources":["**"]}]}'"#,
    );
    let sbx = policy.driver();
    let all = sbx.policy_ls(None).await.unwrap();
    assert_eq!(policy.args(), ["policy", "ls", "--json"]);
    let own = sbx.policy_ls(Some(&name("maf-1"))).await.unwrap();
    assert_eq!(policy.args(), ["policy", "ls", "maf-1", "--json"]);
    assert_eq!(all, own);
    assert!(own.rules[0].belongs_to(&name("maf-1")));
}

#[tokio::test]
async fn policy_check_requires_status_and_answer_to_agree() {
    let check = |body: &str| {
        let fake = Fake::new(body);
        async move {
            let result = fake.driver().policy_check_network("example.com").await;
            assert_eq!(
                fake.args(),
                ["policy", "check", "network", "--json", "example.com"]
            );
            result
        }
    };
    let allowed = check(r#"echo '{"allowed":true,"governance":{"active":true}}'"#)
        .await
        .unwrap();
    assert!(allowed.allowed && allowed.governance_active);
    let denied = check(r#"echo '{"allowed":false,"governance":{"active":false}}'; exit 1"#)
        .await
        .unwrap();
    assert!(!denied.allowed && !denied.governance_active);

    let disagree = check(r#"echo '{"allowed":false,"governance":{"active":false}}'"#).await;
    assert!(
        matches!(disagree, Err(Error::Malformed { .. })),
        "{disagree:?}"
    );
    let disagree = check(r#"echo '{"allowed":true,"governance":{"active":false}}'; exit 1"#).await;
    assert!(
        matches!(disagree, Err(Error::Malformed { .. })),
        "{disagree:?}"
    );
    let lapsed = check("echo 'ERROR: You are not logged in.' >&2; exit 1").await;
    assert!(
        matches!(lapsed, Err(Error::LoginRequired { .. })),
        "{lapsed:?}"
    );
    let other = check(r#"echo '{"allowed":false,"governance":{"active":false}}'; exit 2"#).await;
    assert!(matches!(other, Err(Error::Failed { .. })), "{other:?}");

    let fake = Fake::new("exit 0");
    let err = fake.driver().policy_check_network("-h").await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

/// True while a process with this pid exists.
fn alive(pid: &str) -> bool {
    std::process::Command::new("kill")
        .args(["-0", pid])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Waits up to 5 s for `pid` to be gone.
async fn gone(pid: &str) -> bool {
    for _ in 0..50 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The pid a fake wrote to `path`, waiting up to 5 s for it on a busy machine.
fn read_pid(path: &Path) -> String {
    for _ in 0..50 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text.trim().to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{} never held a pid", path.display());
}

#[tokio::test]
async fn a_hung_call_times_out_and_its_helpers_die_with_it() {
    // The fake leaves a helper holding the pipes, as a wedged daemon client might.
    let fake = Fake::new("sleep 60 & echo $! > \"$d/helper\"; wait");
    let sbx = SbxCli::builder(fake.path(), |_: &OsStr| true)
        .management_env([("PATH", PATH)])
        .command_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = sbx.ls().await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { call: Call::Ls, bound } if bound == Duration::from_millis(400)),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        gone(&read_pid(&fake.file("helper"))).await,
        "the helper survived"
    );
}

#[tokio::test]
async fn exec_ends_at_the_callers_deadline() {
    let fake = Fake::new("sleep 60 & echo $! > \"$d/helper\"; wait");
    let sbx = fake.driver();
    let started = std::time::Instant::now();
    let request = ExecRequest::new(
        name("maf-1"),
        ["sleep", "60"],
        Instant::now() + Duration::from_millis(300),
    );
    let err = sbx.exec(&request).await.unwrap_err();
    match err {
        Error::Timeout {
            call: Call::Exec,
            bound,
        } => assert!(bound <= Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        gone(&read_pid(&fake.file("helper"))).await,
        "the helper survived"
    );

    // A deadline already past ends the call at once.
    let late = ExecRequest::new(name("maf-1"), ["true"], Instant::now());
    let err = sbx.exec(&late).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn a_create_ends_at_its_own_earlier_deadline() {
    let fake = Fake::new("sleep 60");
    let request = CreateRequest::new(
        name("maf-1"),
        "/w",
        NonZeroU32::new(1).unwrap(),
        MemorySize::new("1g").unwrap(),
    )
    .deadline(Instant::now() + Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = fake.driver().create(&request).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                call: Call::Create,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn floods_hit_each_calls_budget() {
    // stderr counts too: a flood there is as bounded as one on stdout.
    let fake = Fake::new("head -c 70000 /dev/zero >&2; exit 1");
    let err = fake.driver().version().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Version,
                budget: SMALL_OUTPUT_BUDGET
            }
        ),
        "{err:?}"
    );
    // Just under the budget is fine.
    let fits = Fake::new("head -c 65000 /dev/zero | tr '\\0' x");
    assert_eq!(fits.driver().version().await.unwrap().len(), 65000);

    // A listing or a create just under its own budget is fine: the budgets are what they say.
    let long_listing =
        Fake::new("printf '['; head -c 8000000 /dev/zero | tr '\\0' ' '; printf ']'");
    assert_eq!(long_listing.driver().ls().await.unwrap(), []);
    let chatty_create = Fake::new("head -c 1000000 /dev/zero | tr '\\0' x");
    chatty_create
        .driver()
        .create(&CreateRequest::new(
            name("maf-1"),
            "/w",
            NonZeroU32::new(1).unwrap(),
            MemorySize::new("1g").unwrap(),
        ))
        .await
        .unwrap();

    let listing = Fake::new("yes '[]'");
    let err = listing.driver().ls().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Ls,
                budget: LISTING_OUTPUT_BUDGET
            }
        ),
        "{err:?}"
    );

    let create = Fake::new("head -c 1100000 /dev/zero");
    let request = CreateRequest::new(
        name("maf-1"),
        "/w",
        NonZeroU32::new(1).unwrap(),
        MemorySize::new("1g").unwrap(),
    );
    let err = create.driver().create(&request).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Create,
                budget: CREATE_OUTPUT_BUDGET
            }
        ),
        "{err:?}"
    );

    let exec = Fake::new("yes");
    let err = exec
        .driver()
        .exec(&ExecRequest::new(name("maf-1"), ["yes"], soon()).output_budget(1000))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Exec,
                budget: 1000
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_long_stderr_is_quoted_by_its_tail() {
    let fake = Fake::new("head -c 5000 /dev/zero | tr '\\0' a >&2; echo ' the end' >&2; exit 1");
    let err = fake.driver().version().await.unwrap_err();
    match err {
        Error::Failed {
            call: Call::Version,
            detail,
        } => {
            assert_eq!(detail.chars().count(), sbx_cli::STDERR_TAIL_CHARS);
            assert!(detail.ends_with("a the end"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropping_a_call_kills_its_process_group() {
    let fake = Fake::new("sleep 60 & echo $! > \"$d/helper\"; wait");
    let sbx = fake.driver();
    let request = ExecRequest::new(name("maf-1"), ["sleep", "60"], soon());
    let abandoned = tokio::time::timeout(Duration::from_millis(500), sbx.exec(&request)).await;
    assert!(
        abandoned.is_err(),
        "the call should still have been running"
    );
    assert!(
        gone(&read_pid(&fake.file("helper"))).await,
        "the dropped call left its sbx helper running"
    );
}

#[tokio::test]
async fn ls_within_ends_at_the_callers_earlier_deadline() {
    let fake = Fake::new("sleep 60");
    let sbx = fake.driver();
    assert_eq!(sbx.command_timeout(), Duration::from_secs(60));
    let started = std::time::Instant::now();
    let err = sbx
        .ls_within(Instant::now() + Duration::from_millis(300))
        .await
        .unwrap_err();
    match err {
        Error::Timeout {
            call: Call::Ls,
            bound,
        } => assert!(bound <= Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_default_management_env_is_this_process_environment() {
    let sbx = SbxCli::builder("sbx", |_: &OsStr| true)
        .no_telemetry(false)
        .build()
        .unwrap();
    let snapshot: Vec<_> = std::env::vars_os().collect();
    assert_eq!(sbx.management_env(), &snapshot[..]);
}
