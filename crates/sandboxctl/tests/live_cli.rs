//! End-to-end tests of the `sandboxctl` binary against the real Docker engine.
//!
//! Each test uses its own scope, so tests run concurrently and never touch one another's sandboxes;
//! each purges what it made and checks that nothing of its scope is left.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");

/// A scope unique to one test in one run.
fn scope(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("cli-{test}-{}-{nanos}", std::process::id())
}

/// A temporary directory with a plain name (tempfile's default `.tmp` prefix is hidden, and
/// cp-out writes no hidden path).
fn plain_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("live-cli-")
        .tempdir()
        .unwrap()
}

fn ctl(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--min-isolation", "container"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("sandboxctl runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("sandboxctl exits, not killed")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}): {:?} / stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Purges the test's conversation and asserts nothing of its scope is left.
fn purge_and_check(scope: &str, thread: &str) {
    let out = ctl(&["purge", "--scope", scope, "--thread", thread]);
    assert_eq!(
        code(&out),
        0,
        "purge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = json(&ctl(&["--json", "list", "--scope", scope]));
    assert_eq!(
        listed["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
}

#[test]
fn run_passes_exit_codes_and_bytes_through() {
    let out = ctl(&[
        "run",
        "--",
        "sh",
        "-c",
        "printf 'out\\377'; printf 'err' >&2; exit 7",
    ]);
    assert_eq!(code(&out), 7);
    assert_eq!(out.stdout, b"out\xff");
    assert_eq!(out.stderr, b"err");
    let out = ctl(&["run", "--", "sh", "-c", "exit 0"]);
    assert_eq!(code(&out), 0);
    let out = ctl(&["--json", "run", "--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!(code(&out), 3);
    let v = json(&out);
    assert_eq!(v["outcome"], "exited");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["stdout_base64"], "aGkK");
    // Generated keys are disposed of afterwards.
    let listed = json(&ctl(&["--json", "list"]));
    assert!(listed["sandboxes"].is_array());
}

/// `--host-tool NAME=COMMAND`: the guest's `host-tool` runs the host command with the JSON on
/// its stdin, and prints its answer; a failing host command is the call's failure.
#[test]
fn host_tools_scripted_as_host_commands_answer_the_guest() {
    let out = ctl(&[
        "run",
        "--host-tool",
        "upper=tr a-z A-Z",
        "--host-tool",
        "refuse=echo no such thing >&2; exit 4",
        "--",
        "sh",
        "-c",
        "host-tool upper '{\"text\":\"hi\"}'; host-tool refuse '{}'; echo refused=$?",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"TEXT\":\"HI\"}\nrefused=1\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tool_failed: the host command ended with exit 4: no such thing"),
        "{stderr}"
    );
    let bad = ctl(&["run", "--host-tool", "no-equals", "--", "true"]);
    assert_eq!(code(&bad), 125);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NAME=COMMAND"));
}

#[test]
fn timeout_exits_124_and_reports_the_guest_cleanup() {
    let started = Instant::now();
    let out = ctl(&["run", "--timeout", "1", "--json", "--", "sleep", "30"]);
    assert_eq!(code(&out), 124, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(25));
    let v = json(&out);
    assert_eq!(v["outcome"], "timeout");
    assert_eq!(v["error"]["kind"], "Timeout");
    assert_eq!(v["guest"], "killed");
    insta::assert_json_snapshot!("timeout_json", v, {".error.message" => "[message]"});
}

#[test]
fn the_floor_refuses_docker_by_default() {
    let out = Command::new(BIN)
        .args(["run", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 125);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--min-isolation container"), "{stderr}");
    let out = Command::new(BIN)
        .args(["stat", "--key", "a/b/c", "x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 69);
}

#[test]
fn usage_errors() {
    assert_eq!(code(&ctl(&["run"])), 125, "run without a command");
    assert_eq!(code(&ctl(&["list", "--bogus"])), 2);
    assert_eq!(code(&ctl(&["stat", "--key", "a/b", "x"])), 64);
    assert_eq!(
        code(&ctl(&["stat", "--key", "a/b/c", "--scope", "a", "x"])),
        2,
        "both key forms"
    );
    assert_eq!(
        code(&ctl(&[
            "run", "--key", "a/b/c", "--scope", "a", "--", "true"
        ])),
        125
    );
    // No `sbx` program here: the backend is unavailable (70), never a silent empty list.
    assert_eq!(
        code(&ctl(&[
            "--backend",
            "sbx",
            "--sbx-path",
            "/nonexistent/sbx",
            "list"
        ])),
        70
    );
}

#[test]
fn files_and_refusals_on_a_kept_sandbox() {
    let scope = scope("files");
    let key = format!("{scope}/t1/agent");
    let out = ctl(&[
        "run",
        "--key",
        &key,
        "--",
        "sh",
        "-c",
        "mkdir -p d/sub && printf data > d/f && ln -s /etc/passwd link",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));

    // A plain name: cp-out writes below its --out-dir, never into a hidden directory such as
    // tempfile's default `.tmp…`.
    let dir = plain_tempdir();
    let out_dir = ["--out-dir", dir.path().to_str().unwrap()];
    let local_in = dir.path().join("in.bin");
    std::fs::write(&local_in, b"\x00\x01binary\xff").unwrap();
    let out = ctl(&[
        "cp-in",
        "--key",
        &key,
        local_in.to_str().unwrap(),
        "up/in.bin",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let local_out = dir.path().join("out.bin");
    let out = ctl(&[
        "cp-out",
        "--key",
        &key,
        out_dir[0],
        out_dir[1],
        "up/in.bin",
        local_out.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&local_out).unwrap(), b"\x00\x01binary\xff");

    // exec reaches the same sandbox; it never creates one.
    let out = ctl(&["exec", "--key", &key, "--", "cat", "d/f"]);
    assert_eq!((code(&out), out.stdout.as_slice()), (0, b"data".as_slice()));
    let out = ctl(&["exec", "--key", &format!("{scope}/t1/nobody"), "--", "true"]);
    assert_eq!(code(&out), 125);

    let refused = dir.path().join("refused.bin");
    let cases: &[(&[&str], i32)] = &[
        (
            &[
                "cp-out",
                "--key",
                &key,
                out_dir[0],
                out_dir[1],
                "../../etc/passwd",
                refused.to_str().unwrap(),
            ],
            65,
        ),
        (
            &[
                "cp-out",
                "--key",
                &key,
                out_dir[0],
                out_dir[1],
                "link",
                refused.to_str().unwrap(),
            ],
            67,
        ),
        (
            &[
                "cp-out",
                "--key",
                &key,
                out_dir[0],
                out_dir[1],
                "d",
                refused.to_str().unwrap(),
            ],
            67,
        ),
        (
            &[
                "cp-out",
                "--key",
                &key,
                out_dir[0],
                out_dir[1],
                "missing",
                refused.to_str().unwrap(),
            ],
            66,
        ),
        (
            &[
                "cp-out",
                "--key",
                &key,
                out_dir[0],
                out_dir[1],
                "--max-bytes",
                "2",
                "d/f",
                refused.to_str().unwrap(),
            ],
            68,
        ),
        (&["stat", "--key", &key, "missing"], 66),
        (&["stat", "--key", &key, "../x"], 65),
        (&["rm", "--key", &key, "d"], 67),
        (&["ls", "--key", &key, "d/f"], 67),
        (&["stat", "--key", &format!("{scope}/t1/nobody"), "x"], 66),
    ];
    for (args, expected) in cases {
        let out = ctl(args);
        assert_eq!(
            code(&out),
            *expected,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?} explains itself");
    }
    assert!(
        !refused.exists(),
        "a refused cp-out leaves no partial local file"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no temp file left beside LOCAL"
    );

    let stat = json(&ctl(&["--json", "stat", "--key", &key, "link"]));
    assert_eq!(stat["kind"], "symlink");
    assert_eq!(stat["size_bytes"], Value::Null);
    let listing = json(&ctl(&["--json", "ls", "--key", &key, "d"]));
    insta::assert_json_snapshot!("ls_json", listing);
    let out = ctl(&["rm", "--key", &key, "-r", "d"]);
    assert_eq!(code(&out), 0);
    assert_eq!(code(&ctl(&["stat", "--key", &key, "d"])), 66);
    purge_and_check(&scope, "t1");
}

#[test]
fn cp_in_refuses_credential_paths() {
    let home = tempfile::tempdir().unwrap();
    let ssh = home.path().join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_ed25519"), b"not a real key").unwrap();
    let linked = home.path().join("innocent");
    std::os::unix::fs::symlink(ssh.join("id_ed25519"), &linked).unwrap();
    let gh = home.path().join(".config/gh");
    std::fs::create_dir_all(&gh).unwrap();
    std::fs::write(gh.join("hosts.yml"), b"oauth_token: not real").unwrap();
    for source in [
        ssh.join("id_ed25519"),
        linked,
        home.path().to_path_buf(),
        gh.clone(),
        gh.join("hosts.yml"),
    ] {
        let out = Command::new(BIN)
            .args(["--min-isolation", "container", "cp-in", "--key", "a/b/c"])
            .arg(&source)
            .arg("x")
            .env("HOME", home.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            code(&out),
            69,
            "{}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("not a real key"));
    }
    // The explicit override lifts only this refusal: the copy then fails on the absent sandbox.
    let out = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "cp-in",
            "--key",
            "a/b/c",
            "--allow-credential-path",
        ])
        .arg(ssh.join("id_ed25519"))
        .arg("x")
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 66, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_sandbox_removed_during_run_exits_125() {
    let scope = scope("gone");
    let key = format!("{scope}/t1/agent");
    let child = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "--json",
            "run",
            "--key",
            &key,
            "--",
            "sleep",
            "20",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the sandbox to exist, then remove it behind sandboxctl's back.
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        let listed = json(&ctl(&["--json", "list", "--scope", &scope]));
        if let Some(first) = listed["sandboxes"].as_array().and_then(|a| a.first()) {
            break first["instance_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the sandbox never appeared");
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_millis(1500));
    let rm = Command::new("docker")
        .args(["rm", "-f", &id])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 125, "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(v["outcome"], "error");
    assert!(
        v["error"]["kind"] == "SandboxGone" || v["error"]["kind"] == "Engine",
        "{v}"
    );
    purge_and_check(&scope, "t1");
}

#[test]
fn purge_leaves_nothing() {
    let scope = scope("purge");
    for agent in ["a1", "a2"] {
        let key = format!("{scope}/t1/{agent}");
        assert_eq!(code(&ctl(&["run", "--key", &key, "--", "true"])), 0);
    }
    let listed = json(&ctl(&[
        "--json", "list", "--scope", &scope, "--thread", "t1",
    ]));
    assert_eq!(
        listed["sandboxes"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    let out = ctl(&["--json", "purge", "--scope", &scope, "--thread", "t1"]);
    assert_eq!(code(&out), 0);
    let v = json(&out);
    assert_eq!(v["disposed"], 2);
    assert_eq!(v["undisposed"], Value::Null);
    purge_and_check(&scope, "t1");
}

#[test]
fn doctor_fails_an_unusable_allowlist_setup_naming_each_fix() {
    let checks = |args: &[&str]| {
        let out = ctl(args);
        assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
        let v = json(&out);
        assert_eq!(v["ok"], false);
        v["checks"].as_array().unwrap().clone()
    };
    let find = |checks: &[Value], id: &str| {
        checks
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {checks:?}"))
            .clone()
    };
    // A proxy image that runs as root, and a network with no way out.
    let root = checks(&[
        "--json",
        "--egress-proxy-image",
        "sandbox-base-root:local",
        "--outbound-network",
        "none",
        "doctor",
    ]);
    let image = find(&root, "docker.egress_proxy_image");
    assert_eq!(image["status"], "fail", "{image}");
    assert!(
        image["detail"].as_str().unwrap().contains("runs as root"),
        "{image}"
    );
    assert!(
        image["fix"].as_str().unwrap().contains("non-root USER"),
        "{image}"
    );
    let network = find(&root, "docker.outbound_network");
    assert_eq!(network["status"], "fail", "{network}");
    assert!(
        network["detail"].as_str().unwrap().contains("driver null"),
        "{network}"
    );
    // A failed check means no throwaway sandbox is tried.
    assert!(root.iter().all(|c| c["id"] != "docker.sandbox"), "{root:?}");

    // Neither exists.
    let missing = checks(&[
        "--json",
        "--egress-proxy-image",
        "sandbox-egress-proxy:never-built",
        "--outbound-network",
        "sandboxctl-doctor-no-such-network",
        "doctor",
    ]);
    let image = find(&missing, "docker.egress_proxy_image");
    assert_eq!(image["status"], "fail", "{image}");
    assert!(
        image["detail"].as_str().unwrap().contains("missing"),
        "{image}"
    );
    assert_eq!(
        image["fix"],
        "sandboxctl images build sandbox-egress-proxy:never-built"
    );
    let network = find(&missing, "docker.outbound_network");
    assert_eq!(network["status"], "fail", "{network}");
    assert!(
        network["fix"]
            .as_str()
            .unwrap()
            .starts_with("docker network create sandboxctl-doctor-no-such-network"),
        "{network}"
    );
    // The rest of the host is still reported as it is.
    assert_eq!(find(&missing, "docker.image")["status"], "pass");
}

#[test]
fn doctor_passes_here_and_names_the_fix_when_the_engine_is_away() {
    let out = ctl(&[
        "--json",
        "doctor",
        "--egress-probe",
        "http://127.0.0.1:9/",
        "--egress-probe",
        "http://doctor.invalid:9/",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    let v = json(&out);
    assert_eq!(v["ok"], true);
    // The backend's own checks, in its order, then the throwaway sandbox; only the runtime line
    // (none configured) and the sbx line do not apply.
    let statuses: Vec<(&str, &str)> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("docker.context", "pass"),
            ("docker.engine", "pass"),
            ("docker.engine_os", "pass"),
            ("kernel.init", "pass"),
            ("kernel.pids_cgroup", "pass"),
            ("docker.image", "pass"),
            ("docker.egress_proxy_image", "pass"),
            ("docker.outbound_network", "pass"),
            ("docker.runtime", "not_applicable"),
            ("sbx", "not_applicable"),
            ("docker.sandbox", "pass"),
        ]
    );
    let image = &v["checks"][5];
    assert_eq!(image["detail"], "sandbox-base:local present", "{image}");
    let proxy = &v["checks"][6];
    assert_eq!(
        proxy["detail"], "sandbox-egress-proxy:local present, runs as user 65532:65532",
        "{proxy}"
    );

    // Every check goes through the Engine API: no `docker` program on the PATH changes nothing.
    let no_cli = Command::new(BIN)
        .args(["--json", "doctor"])
        .env("PATH", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        code(&no_cli),
        0,
        "{}",
        String::from_utf8_lossy(&no_cli.stdout)
    );
    assert_eq!(json(&no_cli)["checks"], v["checks"]);

    // The text form: one line per check, the word first.
    let text = ctl(&["doctor"]);
    assert_eq!(code(&text), 0);
    let lines: Vec<String> = String::from_utf8_lossy(&text.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), statuses.len(), "{lines:?}");
    for (line, (id, status)) in lines.iter().zip(&statuses) {
        let word = if *status == "pass" { "pass" } else { "n/a " };
        assert!(line.starts_with(&format!("{word}  {id} ")), "{line:?}");
    }

    let away = Command::new(BIN)
        .args(["--json", "doctor"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&away), 1);
    let v = json(&away);
    assert_eq!(v["ok"], false);
    let engine = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "docker.engine")
        .expect("the engine item is reported");
    assert_eq!(engine["status"], "fail");
    assert!(!engine["fix"].as_str().unwrap().is_empty());
    // Nothing is checked past an engine that does not answer, and no sandbox is tried.
    let ids: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["docker.context", "docker.engine", "sbx"]);
    let pinned = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "docker.context")
        .expect("the pinned endpoint is reported");
    assert!(
        pinned
            .to_string()
            .contains("unix:///nonexistent/docker.sock (from DOCKER_HOST)"),
        "{pinned}"
    );
    let three = ctl(&[
        "--json",
        "doctor",
        "--egress-probe",
        "a",
        "--egress-probe",
        "b",
        "--egress-probe",
        "c",
    ]);
    assert_eq!(code(&three), 2);
    assert_eq!(json(&three)["error"]["kind"], "Usage");
}

/// Runs sandboxctl and kills it if it has not finished within `bound` (a hang is a failure, not a wait).
fn ctl_bounded(args: &[&str], env: &[(&str, &str)], bound: Duration) -> Output {
    let mut child = Command::new(BIN)
        .args(["--min-isolation", "container"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandboxctl starts");
    let deadline = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after {bound:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn stderr_lines(out: &Output) -> usize {
    String::from_utf8_lossy(&out.stderr)
        .trim_end()
        .lines()
        .count()
}

#[test]
fn refusals_under_run_and_exec_exit_125_with_one_line() {
    let cases: &[&[&str]] = &[
        &["run", "--key", "a/b", "--", "true"],
        &["exec", "--key", "a/b", "--", "true"],
        &["run", "--bogus", "--", "true"],
        &["exec", "--key", "a/b/c", "--bogus", "--", "true"],
        &["run", "--timeout", "1e30", "--", "true"],
        &["exec", "--key", "a/b/c", "--timeout", "1e30", "--", "true"],
        &["run", "--timeout", "1e19", "--", "true"],
    ];
    for args in cases {
        let out = ctl_bounded(args, &[], Duration::from_secs(60));
        assert_eq!(
            code(&out),
            125,
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stderr_lines(&out),
            1,
            "{args:?}: one line: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The floor refuses `ls` too (exit 69, as for every command), saying how to accept docker.
    let out = Command::new(BIN)
        .args(["ls", "--key", "a/b/c"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 69);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--min-isolation container"));
}

#[test]
fn usage_errors_are_read_from_the_subcommand_not_from_a_flag_value() {
    // `run` here is a value of --scope, not the subcommand: a usage error of `list` is 2.
    assert_eq!(code(&ctl(&["list", "--scope", "run", "--bogus"])), 2);
    assert_eq!(
        code(&ctl(&[
            "--backend",
            "docker",
            "list",
            "--scope",
            "exec",
            "--bogus"
        ])),
        2
    );
    // A value that looks like `run` after a global flag still leaves the subcommand `list`.
    assert_eq!(
        code(&ctl(&["--json", "list", "--thread", "run", "--bogus"])),
        2
    );
}

#[test]
fn json_usage_errors_still_print_one_object() {
    let out = ctl(&["--json", "list", "--bogus"]);
    assert_eq!(code(&out), 2);
    let v = json(&out);
    assert_eq!(v["error"]["kind"], "Usage", "{v}");
    let out = ctl(&["run", "--json", "--bogus", "--", "true"]);
    assert_eq!(code(&out), 125);
    let v = json(&out);
    assert_eq!(v["outcome"], "error", "{v}");
    assert_eq!(v["error"]["kind"], "Usage", "{v}");
}

#[test]
fn images_build_of_an_unknown_tag_is_an_invalid_argument() {
    let out = ctl(&["images", "build", "no/such:tag"]);
    assert_eq!(code(&out), 64, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sandbox-base:local"));
}

#[test]
fn help_repeats_the_exit_code_table() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(code(&out), 0);
    let help = String::from_utf8_lossy(&out.stdout);
    for row in [
        "124", "125", " 2 ", "64", "65", "66", "67", "68", "69", "70", "71",
    ] {
        assert!(help.contains(row), "--help lacks {row:?}:\n{help}");
    }
    assert!(help.contains("--min-isolation container"), "{help}");
}

/// Runs `sh -c script` in a new kept sandbox of `key`, asserting it exits 0.
fn kept_with(key: &str, script: &str) {
    let out = ctl(&["run", "--key", key, "--", "sh", "-c", script]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_missing_workdir_is_not_started_not_the_commands_125() {
    let scope = scope("notstarted");
    let key = format!("{scope}/t1/agent");
    kept_with(
        &key,
        "printf x > plain && mkdir own && mkdir locked && chmod 000 locked",
    );

    let out = ctl(&[
        "exec",
        "--key",
        &key,
        "--workdir",
        "/no/such/dir",
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 125, "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("sandboxctl: the command did not start"),
        "{stderr}"
    );
    assert!(stderr.contains("/no/such/dir"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(out.stdout.is_empty());

    let v = json(&ctl(&[
        "--json",
        "exec",
        "--key",
        &key,
        "--workdir",
        "/no/such/dir",
        "--",
        "true",
    ]));
    assert_eq!(v["outcome"], "not_started", "{v}");
    assert!(v.get("exit_code").is_none(), "{v}");
    assert!(v.get("stdout").is_none(), "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("cd") && reason.contains("/no/such/dir"),
        "{v}"
    );
    // Relative to the storage base; a regular file where a directory should be; a directory the
    // guest user cannot enter. The command never runs in any of them.
    for workdir in ["gone", "plain", "locked"] {
        let mut args = vec!["--json", "exec", "--key", &key, "--workdir", workdir];
        args.extend(["--", "sh", "-c", "touch /tmp/ran"]);
        let out = ctl(&args);
        assert_eq!(code(&out), 125, "{workdir}");
        let v = json(&out);
        assert_eq!(v["outcome"], "not_started", "{workdir}: {v}");
        assert!(v["reason"].as_str().unwrap().contains(workdir), "{v}");
    }
    let out = ctl(&["exec", "--key", &key, "--", "test", "-e", "/tmp/ran"]);
    assert_eq!(
        code(&out),
        1,
        "a command in an unusable working directory ran"
    );
    // `run` reports it the same way, and still disposes of its generated sandbox.
    let out = ctl(&["--json", "run", "--workdir", "/no/such/dir", "--", "true"]);
    assert_eq!(code(&out), 125);
    assert_eq!(json(&out)["outcome"], "not_started");

    // A command's own 125, even one that prints a `cd` message or the wrapper's marker line,
    // stays the command's.
    let out = ctl(&[
        "--json",
        "exec",
        "--key",
        &key,
        "--workdir",
        "own",
        "--",
        "sh",
        "-c",
        // The call's own nonce, read from its wrapper's command line (the argument after
        // `maf-sbx`).
        "n=$(tr '\\0' '\\n' </proc/$PPID/cmdline | sed -n '/^maf-sbx$/{n;p;q;}'); printf %s \"$n\"; \
         printf '%s-nocwd\\nsh: 1: cd: can'\\''t cd to /x\\n' \"$n\" >&2; exit 125",
    ]);
    assert_eq!(code(&out), 125);
    let v = json(&out);
    assert_eq!(v["outcome"], "exited", "{v}");
    assert_eq!(v["exit_code"], 125, "{v}");
    let nonce = v["stdout"].as_str().unwrap();
    assert!(
        nonce.len() == 24 && nonce.bytes().all(|b| b.is_ascii_hexdigit()),
        "the command found its call's nonce: {v}"
    );
    assert_eq!(
        v["stderr"],
        format!("{nonce}-nocwd\nsh: 1: cd: can't cd to /x\n"),
        "{v}"
    );
    let out = ctl(&["exec", "--key", &key, "--", "sh", "-c", "exit 125"]);
    assert_eq!(code(&out), 125);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    purge_and_check(&scope, "t1");
}

#[test]
fn file_commands_resolve_guest_paths_against_the_workdir() {
    let scope = scope("workdir");
    let key = format!("{scope}/t1/agent");
    kept_with(&key, "mkdir -p sub && mkdir -p /maf-sandbox/work-outside");
    let dir = plain_tempdir();
    let local = dir.path().join("in.txt");
    std::fs::write(&local, b"inside\n").unwrap();
    let local = local.to_str().unwrap();

    // An absolute guest path outside the storage base: refused under the default working
    // directory, with the way out named; accepted under an absolute --workdir.
    let out = ctl(&["cp-in", "--key", &key, local, "/maf-sandbox/work-outside/x"]);
    assert_eq!(code(&out), 65, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workdir"));
    let outside = ["--workdir", "/maf-sandbox/work-outside"];
    let with = |command: &str, rest: &[&str]| {
        let mut args = vec!["--json", command, "--key", key.as_str()];
        args.extend_from_slice(&outside);
        args.extend_from_slice(rest);
        ctl(&args)
    };
    assert_eq!(code(&with("cp-in", &[local, "x"])), 0);
    assert_eq!(
        code(&with("cp-in", &[local, "/maf-sandbox/work-outside/y"])),
        0
    );
    let v = json(&with("stat", &["x"]));
    assert_eq!(v["kind"], "file", "{v}");
    assert_eq!(v["size_bytes"], 7, "{v}");
    let v = json(&with("ls", &[]));
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.ends_with('x')) && names.iter().any(|n| n.ends_with('y')),
        "{v}"
    );
    let back = dir.path().join("back.txt");
    let out_dir = dir.path().to_str().unwrap();
    assert_eq!(
        code(&with(
            "cp-out",
            &["--out-dir", out_dir, "y", back.to_str().unwrap()]
        )),
        0
    );
    assert_eq!(std::fs::read(&back).unwrap(), b"inside\n");
    // The guest saw the files where the working directory put them.
    let out = ctl(&[
        "exec",
        "--key",
        &key,
        "--",
        "cat",
        "/maf-sandbox/work-outside/x",
    ]);
    assert_eq!(out.stdout, b"inside\n");
    assert_eq!(code(&with("rm", &["x"])), 0);
    assert_eq!(code(&with("stat", &["x"])), 66);
    // Paths stay under the working directory, whichever it is.
    assert_eq!(code(&with("stat", &["../work/sub"])), 65);

    // A relative --workdir is under the storage base.
    let sub = ["--workdir", "sub"];
    assert_eq!(
        code(&ctl(
            &[&["cp-in", "--key", &key][..], &sub, &[local, "z"]].concat()
        )),
        0
    );
    let out = ctl(&["exec", "--key", &key, "--", "cat", "sub/z"]);
    assert_eq!(out.stdout, b"inside\n");
    let v = json(&ctl(&[&["--json", "ls", "--key", &key][..], &sub].concat()));
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        code(&ctl(
            &[&["stat", "--key", &key][..], &sub, &["../z"]].concat()
        )),
        65
    );
    assert_eq!(
        code(&ctl(&[&["rm", "--key", &key][..], &sub, &["z"]].concat())),
        0
    );
    assert_eq!(code(&ctl(&["stat", "--key", &key, "sub/z"])), 66);
    // Escaping the storage base through a relative --workdir is refused.
    assert_eq!(
        code(&ctl(&["stat", "--key", &key, "--workdir", "..", "x"])),
        65
    );
    purge_and_check(&scope, "t1");
}

#[test]
fn reclaim_removes_a_directory_within_its_bound() {
    let scope = scope("reclaim");
    let key = format!("{scope}/t1/agent");
    kept_with(
        &key,
        "mkdir -p calls/c1/deep/er && printf x > calls/c1/deep/er/f && ln -s /etc calls/c1/l \
         && mkdir -p /maf-sandbox/work-outside/c2/a",
    );
    let v = json(&ctl(&[
        "--json",
        "reclaim",
        "--key",
        &key,
        "--timeout",
        "30",
        "calls/c1",
    ]));
    assert_eq!(v["reclaimed"], "calls/c1", "{v}");
    assert_eq!(code(&ctl(&["stat", "--key", &key, "calls/c1"])), 66);
    // The link's target was not followed.
    let out = ctl(&["exec", "--key", &key, "--", "test", "-f", "/etc/passwd"]);
    assert_eq!(code(&out), 0);
    // Absent is fine; the working directory itself and an escape are refused; so is no bound.
    assert_eq!(code(&ctl(&["reclaim", "--key", &key, "calls/c1"])), 0);
    assert_eq!(
        code(&ctl(&["reclaim", "--key", &key, "--workdir", "calls", "."])),
        65
    );
    assert_eq!(code(&ctl(&["reclaim", "--key", &key, "../x"])), 65);
    assert_eq!(
        code(&ctl(&["reclaim", "--key", &key, "--timeout", "0", "calls"])),
        64
    );
    // Under an absolute working directory outside the storage base.
    let out = ctl(&[
        "reclaim",
        "--key",
        &key,
        "--workdir",
        "/maf-sandbox/work-outside",
        "c2",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let out = ctl(&[
        "exec",
        "--key",
        &key,
        "--",
        "test",
        "-e",
        "/maf-sandbox/work-outside/c2",
    ]);
    assert_eq!(code(&out), 1);
    // No sandbox for the key.
    let none = format!("{scope}/t2/agent");
    assert_eq!(code(&ctl(&["reclaim", "--key", &none, "calls"])), 66);
    purge_and_check(&scope, "t1");
}

/// The instance ids `list` shows for `scope`.
fn instance_ids(scope: &str) -> Vec<String> {
    let listed = json(&ctl(&["--json", "list", "--scope", scope]));
    listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["instance_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn run_says_whether_it_created_and_dispose_takes_one_instance() {
    let scope = scope("fresh");
    let key = format!("{scope}/t1/agent");
    let first = json(&ctl(&["--json", "run", "--key", &key, "--", "true"]));
    assert_eq!(first["fresh"], true, "{first}");
    let again = json(&ctl(&["--json", "run", "--key", &key, "--", "true"]));
    assert_eq!(again["fresh"], false, "{again}");
    // A generated key's sandbox is always new.
    let generated = json(&ctl(&["--json", "run", "--", "true"]));
    assert_eq!(generated["fresh"], true, "{generated}");

    let ids = instance_ids(&scope);
    assert_eq!(ids.len(), 1, "{ids:?}");
    // A stale id disposes of nothing, never of the live instance.
    let out = ctl(&[
        "--json",
        "dispose",
        "--key",
        &key,
        "--instance",
        "0123456789ab",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(instance_ids(&scope), ids);
    let out = ctl(&[
        "dispose",
        "--key",
        &key,
        "--kind",
        "default",
        "--instance",
        &ids[0],
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(instance_ids(&scope).is_empty());
    let after = json(&ctl(&["--json", "run", "--key", &key, "--", "true"]));
    assert_eq!(after["fresh"], true, "{after}");
    purge_and_check(&scope, "t1");
}

#[test]
fn help_shows_workdir_and_reclaim() {
    let help = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(code(&out), 0);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(help(&["--help"]).contains("reclaim"));
    for command in ["cp-in", "cp-out", "stat", "ls", "rm", "reclaim"] {
        let text = help(&[command, "--help"]);
        assert!(text.contains("--workdir"), "{command}: {text}");
    }
    assert!(help(&["dispose", "--help"]).contains("--instance"));
}

/// Every host process's command line, and the docker clients' environments, as raw bytes, each with a
/// description of where it came from.
fn host_process_texts() -> Vec<(String, Vec<u8>)> {
    let mut texts = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let shown = format!(
            "{}: {}",
            entry.path().display(),
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        );
        if program.ends_with(b"docker") {
            if let Ok(environ) = std::fs::read(entry.path().join("environ")) {
                texts.push((format!("environ of {shown}"), environ));
            }
        }
        texts.push((format!("cmdline of {shown}"), cmdline));
    }
    texts
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn env_values_reach_the_guest_but_no_command_line() {
    use base64::Engine as _;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let value = format!("v{nanos:x}p{}", std::process::id());
    let b64 = base64::engine::general_purpose::STANDARD;
    let needles = [
        value.clone(),
        b64.encode(&value),
        b64.encode(format!("CLI_PROBE_VALUE={value}")),
    ];
    let mut child = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "run",
            "--env",
            "CLI_PROBE_VALUE",
            "--",
            "sh",
            "-c",
            "sleep 3; printf %s \"$CLI_PROBE_VALUE\"",
        ])
        .env("CLI_PROBE_VALUE", &value)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut scans = 0;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "run never finished");
        for (source, text) in host_process_texts() {
            for needle in &needles {
                assert!(
                    !contains(&text, needle.as_bytes()),
                    "{needle:?} found in the {source}"
                );
            }
        }
        scans += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(scans > 10, "scanned while the command ran ({scans})");
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, value.as_bytes(), "the guest got the value");
}

#[test]
fn cp_in_refuses_what_is_not_a_regular_file_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for source in ["/dev/null", fifo.to_str().unwrap()] {
        let out = ctl_bounded(
            &["cp-in", "--key", "a/b/c", source, "x"],
            &[],
            Duration::from_secs(20),
        );
        assert_eq!(
            code(&out),
            67,
            "{source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn cp_in_refuses_a_credential_directory_reached_through_a_link() {
    // ~/.ssh is a link to a directory elsewhere, as dotfile managers arrange it.
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("home");
    let store = root.path().join("dotfiles/ssh");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(store.join("id_ed25519"), b"not a real key").unwrap();
    std::os::unix::fs::symlink(&store, home.join(".ssh")).unwrap();
    let home_str = home.to_str().unwrap();
    for source in [
        home.join(".ssh/id_ed25519"),
        store.join("id_ed25519"),
        store.clone(),
    ] {
        let out = ctl_bounded(
            &["cp-in", "--key", "a/b/c", source.to_str().unwrap(), "x"],
            &[("HOME", home_str)],
            Duration::from_secs(20),
        );
        assert_eq!(
            code(&out),
            69,
            "{}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("not a real key"));
    }
    // The explicit override still lifts it: the copy then fails on the absent sandbox.
    let out = ctl_bounded(
        &[
            "cp-in",
            "--key",
            "a/b/c",
            "--allow-credential-path",
            store.join("id_ed25519").to_str().unwrap(),
            "x",
        ],
        &[("HOME", home_str)],
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 66, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_interrupted_run_kills_the_command_in_the_sandbox_and_exits_125() {
    let scope = scope("interrupt");
    let key = format!("{scope}/t1/agent");
    let child = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "--json",
            "run",
            "--key",
            &key,
            "--",
        ])
        .args(["sh", "-c", "echo $$ > started; exec sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the command runs in the sandbox.
    let deadline = Instant::now() + Duration::from_secs(60);
    while code(&ctl(&["stat", "--key", &key, "started"])) != 0 {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(200));
    }
    let started = Instant::now();
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 125, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the interrupt is prompt"
    );
    let v = json(&out);
    assert_eq!(v["outcome"], "error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("SIGINT"),
        "{v}"
    );
    // The sandbox was kept (a key was given) and the command's group is gone.
    let out = ctl(&[
        "exec",
        "--key",
        &key,
        "--",
        "sh",
        "-c",
        "kill -0 \"$(cat started)\"",
    ]);
    assert_ne!(code(&out), 0, "the interrupted command still runs");
    purge_and_check(&scope, "t1");
}

/// A Unix socket in front of the engine's that forwards every byte both ways and records the
/// request line (`METHOD path`, the API version prefix dropped) of every HTTP request a client
/// sends through it, so a test can count sandboxctl's round trips to the real engine.
struct CountingProxy {
    dir: tempfile::TempDir,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl CountingProxy {
    fn start() -> CountingProxy {
        use std::os::unix::net::{UnixListener, UnixStream};
        let engine = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
            .unwrap_or_else(|| "/var/run/docker.sock".to_owned());
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("engine.sock")).unwrap();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let upstream = UnixStream::connect(&engine).expect("the engine's socket");
                let (client_in, upstream_out) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let seen = seen.clone();
                std::thread::spawn(move || forward(client_in, upstream_out, Some(seen)));
                std::thread::spawn(move || forward(upstream, client, None));
            }
        });
        CountingProxy { dir, requests }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("engine.sock").display())
    }

    /// The requests recorded since the last call.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

/// Copies `from` to `to` until EOF, then half-closes `to`; with `record`, notes each request
/// line (`GET /v1.41/version HTTP/1.1` → `GET /version`).
fn forward(
    mut from: std::os::unix::net::UnixStream,
    mut to: std::os::unix::net::UnixStream,
    record: Option<std::sync::Arc<std::sync::Mutex<Vec<String>>>>,
) {
    use std::io::{Read as _, Write as _};
    let mut line = Vec::new();
    let mut buf = [0u8; 65536];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        // Noted before they are forwarded: the engine cannot answer a request, nor the client
        // exit on that answer, before the request is in the log a test reads after the exit.
        if let Some(record) = &record {
            note_request_lines(&mut line, &buf[..n], record);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Adds `bytes` to the partial `line` and notes each complete request line among them.
fn note_request_lines(line: &mut Vec<u8>, bytes: &[u8], record: &std::sync::Mutex<Vec<String>>) {
    for &byte in bytes {
        line.push(byte);
        if !line.ends_with(b"\r\n") {
            continue;
        }
        let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        let words: Vec<&str> = text.split(' ').collect();
        if let [method @ ("GET" | "POST" | "HEAD" | "PUT" | "DELETE"), path, "HTTP/1.1"] =
            words.as_slice()
        {
            let path = match path.strip_prefix("/v") {
                Some(rest) => rest.find('/').map_or(*path, |i| &rest[i..]),
                None => path,
            };
            record.lock().unwrap().push(format!("{method} {path}"));
        }
        line.clear();
    }
}

/// A call on a warm key costs one request to connect (the version negotiation: a ping, whose
/// headers also name the engine's OS), one to find the sandbox (its inspect answers ownership, hardening and
/// state), then the work itself, and nothing twice: `exec` three (exec create, attached start,
/// exec inspect), `stat .` one engine stat per directory from the root down, the working
/// directory's doubling as the answer.
#[test]
fn a_warm_call_makes_the_fewest_engine_requests() {
    let scope = scope("roundtrips");
    let key = format!("{scope}/t1/agent");
    kept_with(&key, "true");
    let proxy = CountingProxy::start();
    let via_proxy = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["--min-isolation", "container"])
            .args(args)
            .env("DOCKER_HOST", proxy.host())
            .stdin(Stdio::null())
            .output()
            .expect("sandboxctl runs");
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        proxy.take()
    };
    let shape = |requests: &[String]| -> Vec<String> {
        requests
            .iter()
            .map(|r| {
                // Ids and names vary; the method and the endpoint's shape are pinned.
                let (method, path) = r.split_once(' ').unwrap();
                let words: Vec<&str> = path.split('/').collect();
                let shaped: Vec<&str> = words
                    .iter()
                    .enumerate()
                    .map(|(i, w)| if i == 2 && words.len() > 3 { "ID" } else { w })
                    .collect();
                format!("{method} {}", shaped.join("/"))
            })
            .collect()
    };

    let exec = via_proxy(&["exec", "--key", &key, "--", "true"]);
    assert_eq!(
        shape(&exec),
        [
            "GET /_ping",
            "GET /containers/ID/json",
            "POST /containers/ID/exec",
            "POST /exec/ID/start",
            "GET /exec/ID/json",
        ],
        "{exec:#?}"
    );

    let stat = via_proxy(&["stat", "--key", &key, "."]);
    assert_eq!(
        shape(&stat)[..2],
        ["GET /_ping", "GET /containers/ID/json"],
        "{stat:#?}"
    );
    let mut stated: Vec<&str> = stat[2..]
        .iter()
        .map(|r| r.split_once("archive?path=").expect("engine stats only").1)
        .collect();
    stated.sort_unstable();
    assert_eq!(
        stated,
        ["%2Fmaf-sandbox", "%2Fmaf-sandbox%2Fwork"],
        "{stat:#?}"
    );
    assert!(
        stat[2..].iter().all(|r| r.starts_with("HEAD ")),
        "{stat:#?}"
    );
    purge_and_check(&scope, "t1");
}

/// A cold acquire (a new key) costs, besides sandboxctl's own image check, connecting, the size of
/// the engine's host (`info`, once per process) and the command: one inspect of the name; the key's
/// other sandboxes looked for, the OS re-checked by a ping and the image inspected; the create,
/// then its start and inspect; one guest call that probes the tools and prints the guest's ids
/// (exec create, attached start, exec inspect) while the host makes the storage base of the
/// container it created: one walk of the base from the call's start, whose two missing
/// directories each cost an inspect to tell a missing path from a gone container, and one archive
/// PUT owned by the guest (its ids are not known before the guest prints them: the image runs as
/// a user name, and this process has not seen the image before; a numeric `uid:gid`, or a second
/// cold acquire of the image in one process, sends the same PUT alongside the exec's start
/// instead); then one walk of the base. No `info` for the OS, no second inspect of the new
/// container, no second guest call, no read of the image's `/etc/passwd` (an archive GET costs
/// the engine as much as the PUT, and the guest's ids arrive sooner). Requests that run at once
/// arrive in any order, so the multiset is pinned.
#[test]
fn a_cold_acquire_makes_the_fewest_engine_requests() {
    let scope = scope("cold-roundtrips");
    let key = format!("{scope}/t1/agent");
    let proxy = CountingProxy::start();
    let out = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "run",
            "--key",
            &key,
            "--",
            "true",
        ])
        .env("DOCKER_HOST", proxy.host())
        .stdin(Stdio::null())
        .output()
        .expect("sandboxctl runs");
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let requests = proxy.take();
    let mut shaped: Vec<String> = requests
        .iter()
        .map(|r| {
            // Ids, names and query strings vary; the method and the endpoint's shape are pinned.
            let (method, path) = r.split_once(' ').unwrap();
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            let words: Vec<&str> = path.split('/').collect();
            let shaped: Vec<&str> = words
                .iter()
                .enumerate()
                .map(|(i, w)| if i == 2 && words.len() > 3 { "ID" } else { w })
                .collect();
            let query = match query.split_once('=') {
                Some((name, _)) => format!("?{name}"),
                None => String::new(),
            };
            format!("{method} {}{query}", shaped.join("/"))
        })
        .collect();
    shaped.sort();
    let mut expected = vec![
        // sandboxctl's check that the default image is there, on its own connection.
        "GET /_ping",
        "GET /images/ID/json",
        // Connect; the host's size, the first acquire in this process.
        "GET /_ping",
        "GET /info",
        // The name's inspect; the other-egress listing with, beside it, the listing of pool
        // claim records (a warm pool member claimed for this key by any process is found by its
        // record, its own labels being the pool's); the OS re-check, the image inspect.
        "GET /containers/ID/json",
        "GET /containers/json?all",
        "GET /volumes?filters",
        "GET /_ping",
        "GET /images/ID/json",
        // Create, then start and inspect at once.
        "POST /containers/create?name",
        "POST /containers/ID/start",
        "GET /containers/ID/json",
        // The one guest call, and the host's base alongside it: the walk (two missing
        // directories, an inspect each) from the call's start, the PUT once the guest's ids
        // arrive.
        "POST /containers/ID/exec",
        "POST /exec/ID/start",
        "GET /exec/ID/json",
        "HEAD /containers/ID/archive?path",
        "HEAD /containers/ID/archive?path",
        "GET /containers/ID/json",
        "GET /containers/ID/json",
        "PUT /containers/ID/archive?path",
        // The walk after the guest call.
        "HEAD /containers/ID/archive?path",
        "HEAD /containers/ID/archive?path",
        // The command.
        "POST /containers/ID/exec",
        "POST /exec/ID/start",
        "GET /exec/ID/json",
    ];
    expected.sort_unstable();
    assert_eq!(shaped, expected, "{requests:#?}");
    purge_and_check(&scope, "t1");
}

#[test]
fn exec_streams_as_output_arrives_and_passes_stdin_with_i() {
    use std::io::{BufRead as _, BufReader, Write as _};
    let scope = scope("stream");
    let key = format!("{scope}/t1/agent");
    kept_with(&key, "true");

    // `-i`: sandboxctl's own stdin is the command's.
    let mut child = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "exec",
            "-i",
            "--key",
            &key,
            "--",
            "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandboxctl runs");
    child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"hi\n");

    // Without `-i` the command's stdin is closed, whatever sandboxctl's is.
    let out = ctl(&["exec", "--key", &key, "--", "sh", "-c", "wc -c"]);
    assert_eq!(code(&out), 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");

    // A line printed before a sleep reaches the terminal before the command ends.
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(["--min-isolation", "container", "exec", "--key", &key, "--"])
        .args(["sh", "-c", "echo first; sleep 3; echo second >&2; exit 4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandboxctl runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    let first_at = started.elapsed();
    assert_eq!(first, "first\n");
    assert!(
        first_at < Duration::from_secs(2),
        "the first line came after {first_at:?}"
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 4);
    assert_eq!(out.stderr, b"second\n");
    assert!(started.elapsed() >= Duration::from_secs(3));
    purge_and_check(&scope, "t1");
}

/// An internal network (nothing on it routes anywhere but to its members) with one server answering
/// as `allowed.test`; removed, with whatever the scope left, when dropped.
struct EgressNetwork {
    name: String,
    server: String,
    scope: String,
}

impl EgressNetwork {
    fn start(scope: &str) -> EgressNetwork {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("maf-egress-test-{:08x}", nanos ^ std::process::id());
        let network = EgressNetwork {
            server: format!("{name}-allowed"),
            name,
            scope: scope.to_owned(),
        };
        let docker = |args: &[&str]| {
            let out = ctl_bounded_docker(args);
            assert!(
                out.status.success(),
                "docker {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        docker(&["network", "create", "--internal", &network.name]);
        docker(&[
            "run",
            "-d",
            "--name",
            &network.server,
            "--network",
            &network.name,
            "--network-alias",
            "allowed.test",
            "--cap-drop",
            "ALL",
            backend_docker_proxy_image(),
            "serve",
            "--listen",
            "0.0.0.0:80",
            "--body",
            "allowed.test",
        ]);
        network
    }
}

fn backend_docker_proxy_image() -> &'static str {
    "sandbox-egress-proxy:local"
}

/// One bounded docker CLI call of the test's own.
fn ctl_bounded_docker(args: &[&str]) -> Output {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker runs");
    let until = Instant::now() + Duration::from_secs(60);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().expect("docker's output")
}

impl Drop for EgressNetwork {
    fn drop(&mut self) {
        let label = format!("label=maf-sandbox.scope={}", self.scope);
        for args in [
            vec!["ps", "-aq", "--filter", &label],
            vec!["volume", "ls", "-q", "--filter", &label],
        ] {
            let listed = ctl_bounded_docker(&args);
            let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            if !names.is_empty() {
                let mut rm: Vec<&str> = if args[0] == "ps" {
                    vec!["rm", "-f"]
                } else {
                    vec!["volume", "rm"]
                };
                rm.extend(names.iter().map(String::as_str));
                let _ = ctl_bounded_docker(&rm);
            }
        }
        let _ = ctl_bounded_docker(&["rm", "-f", &self.server]);
        let _ = ctl_bounded_docker(&["network", "rm", &self.name]);
    }
}

/// `run --allow` makes an allowlist sandbox: requests go through its proxy (which refuses the
/// server's private address: sandboxctl never allows private destinations), nothing goes around it,
/// `exec` finds the kept sandbox, and the purge leaves no container or volume.
#[test]
fn run_allow_routes_through_the_proxy_and_the_purge_takes_it() {
    let scope = scope("allow");
    let network = EgressNetwork::start(&scope);
    let key = format!("{scope}/t1/a");
    let out = ctl(&[
        "--outbound-network",
        &network.name,
        "run",
        "--key",
        &key,
        "--allow",
        "allowed.test",
        "--",
        "sh",
        "-c",
        "curl -s -o /dev/null -w '%{http_code}' --max-time 10 http://allowed.test/; echo; \
         curl -s --max-time 5 --noproxy '*' http://allowed.test/; echo around=$?",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        code(&out),
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0], "403",
        "the proxy answers, refusing a private address: {stdout}"
    );
    assert!(
        lines[1].starts_with("around=") && lines[1] != "around=0",
        "{stdout}"
    );
    let env = ctl(&["exec", "--key", &key, "--", "printenv", "HTTPS_PROXY"]);
    assert_eq!(code(&env), 0, "{}", String::from_utf8_lossy(&env.stderr));
    assert_eq!(
        String::from_utf8_lossy(&env.stdout),
        "http://127.0.0.1:3128\n"
    );
    let changed = ctl(&[
        "--outbound-network",
        &network.name,
        "run",
        "--key",
        &key,
        "--",
        "true",
    ]);
    assert_eq!(
        code(&changed),
        125,
        "closed egress on a kept allowlist key is refused"
    );
    assert!(
        String::from_utf8_lossy(&changed.stderr).contains("dispose it"),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    purge_and_check(&scope, "t1");
    let label = format!("label=maf-sandbox.scope={scope}");
    for args in [
        vec!["ps", "-aq", "--filter", &label],
        vec!["volume", "ls", "-q", "--filter", &label],
    ] {
        let left = ctl_bounded_docker(&args);
        assert!(
            String::from_utf8_lossy(&left.stdout).trim().is_empty(),
            "left behind: {args:?}"
        );
    }
    drop(network);
}

#[test]
fn reset_and_fork_work_on_kept_sandboxes() {
    let scope = scope("snapshot");
    let (source, target) = (format!("{scope}/t1/a"), format!("{scope}/t2/a"));
    kept_with(
        &source,
        "printf kept >made.txt && chmod 0751 made.txt && mkdir -p /var/tmp/outside && printf o >/var/tmp/outside/o",
    );
    let source_id = json(&ctl(&[
        "--json", "list", "--scope", &scope, "--thread", "t1",
    ]))["sandboxes"][0]["instance_id"]
        .as_str()
        .expect("the kept sandbox is listed")
        .to_owned();

    let out = ctl(&["--json", "fork", "--key", &source, "--to", &target]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(v["forked"], true, "{v}");
    assert_eq!(v["key"]["thread"], "t2", "{v}");
    let fork_id = v["instance_id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, source_id);
    let out = ctl(&[
        "exec",
        "--key",
        &target,
        "--",
        "sh",
        "-c",
        "stat -c %a made.txt && cat made.txt /var/tmp/outside/o",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"751\nkepto");

    // A second fork into a key that has a sandbox is refused and changes nothing.
    let out = ctl(&["fork", "--key", &source, "--to", &target]);
    assert_eq!(code(&out), 64, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already has a sandbox"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = ctl(&["--json", "reset", "--key", &source]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let v = json(&out);
    assert_eq!(v["reset"], true, "{v}");
    assert_ne!(v["instance_id"].as_str().unwrap(), source_id, "{v}");
    let out = ctl(&[
        "exec",
        "--key",
        &source,
        "--",
        "sh",
        "-c",
        "test ! -e made.txt && test ! -e /var/tmp/outside && echo clean",
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"clean\n");
    // The fork kept its copy.
    let out = ctl(&["exec", "--key", &target, "--", "cat", "made.txt"]);
    assert_eq!(out.stdout, b"kept");

    // Reset of a key without a sandbox: not found.
    let out = ctl(&["reset", "--key", &format!("{scope}/t3/a")]);
    assert_eq!(code(&out), 66, "{}", String::from_utf8_lossy(&out.stderr));
    let out = ctl(&["purge", "--scope", &scope, "--thread", "t2"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    purge_and_check(&scope, "t1");
}
