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
    assert_eq!(code(&ctl(&["--backend", "sbx", "list"])), 64);
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

    let dir = tempfile::tempdir().unwrap();
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
                "../../etc/passwd",
                refused.to_str().unwrap(),
            ],
            65,
        ),
        (
            &["cp-out", "--key", &key, "link", refused.to_str().unwrap()],
            67,
        ),
        (
            &["cp-out", "--key", &key, "d", refused.to_str().unwrap()],
            67,
        ),
        (
            &[
                "cp-out",
                "--key",
                &key,
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
    let ids: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    for id in [
        "docker.client",
        "docker.context",
        "docker.engine",
        "docker.image",
        "docker.sandbox",
    ] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
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
    assert_eq!(
        code(&ctl(&[
            "doctor",
            "--egress-probe",
            "a",
            "--egress-probe",
            "b",
            "--egress-probe",
            "c"
        ])),
        2
    );
}
