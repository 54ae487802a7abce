//! `sandboxctl` under gVisor (`--docker-runtime`), against the real engine with `runsc`
//! registered: a `hardened_container` floor runs the command on gVisor's kernel, `doctor` names
//! the runtime, its platform and the verified rung, and runc under a gVisor-like name is refused
//! that floor. Run by `cargo xtask e2e gvisor` (which sets `SANDBOX_E2E_DOCKER_RUNTIME`).

use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");

/// The runc runtime registered under a gVisor-like name.
const FAKE_RUNTIME: &str = "runsc-fake";

fn gvisor_runtime() -> String {
    std::env::var("SANDBOX_E2E_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
        .expect("SANDBOX_E2E_DOCKER_RUNTIME names the gVisor runtime: run `cargo xtask e2e gvisor`")
}

fn ctl(runtime: &str, floor: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--docker-runtime", runtime, "--min-isolation", floor])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("sandboxctl runs")
}

fn scope(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("cli-gvisor-{test}-{}-{nanos}", std::process::id())
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_hardened_container_floor_runs_on_gvisors_kernel() {
    let runtime = gvisor_runtime();
    let scope = scope("run");
    let at = ["--scope", scope.as_str(), "--thread", "t", "--agent", "a"];
    let release = ctl(
        &runtime,
        "hardened_container",
        &[&["run"][..], &at, &["--", "uname", "-r"]].concat(),
    );
    assert_eq!(
        release.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&release.stderr)
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest = stdout(&release);
    assert!(!guest.trim().is_empty());
    assert_ne!(
        guest.trim(),
        host.trim(),
        "the guest sees the host's kernel"
    );
    let log = ctl(
        &runtime,
        "hardened_container",
        &[&["run"][..], &at, &["--", "sh", "-c", "dmesg | head -n 1"]].concat(),
    );
    assert!(stdout(&log).contains("Starting gVisor"), "{log:?}");
    let purge = ctl(
        &runtime,
        "hardened_container",
        &["purge", "--scope", scope.as_str(), "--thread", "t"],
    );
    assert_eq!(purge.status.code(), Some(0), "{purge:?}");
    let listed = ctl(
        &runtime,
        "hardened_container",
        &["--json", "list", "--scope", &scope],
    );
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["sandboxes"].as_array().map(Vec::len), Some(0));
}

#[test]
fn runc_under_a_gvisor_name_is_refused_the_floor() {
    let out = ctl(
        FAKE_RUNTIME,
        "hardened_container",
        &["--json", "run", "--", "true"],
    );
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "NotPermitted", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--min-isolation container"),
        "{v}"
    );
}

#[test]
fn doctor_names_the_runtime_its_platform_and_the_verified_rung() {
    let runtime = gvisor_runtime();
    let checks = |runtime: &str| -> Value {
        let out = ctl(
            runtime,
            "container",
            &[
                "--json",
                "doctor",
                "--egress-probe",
                "http://127.0.0.1:9/",
                "--egress-probe",
                "http://doctor.invalid:9/",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let check = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "docker.runtime")
            .cloned()
            .unwrap_or_else(|| panic!("no docker.runtime check: {v}"));
        assert_eq!(check["status"], "pass", "{check}");
        check
    };
    let gvisor = checks(&runtime);
    let detail = gvisor["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("runtime {runtime} ")), "{detail}");
    assert!(detail.contains("platform ptrace"), "{detail}");
    assert!(detail.contains("rung hardened_container"), "{detail}");
    let fake = checks(FAKE_RUNTIME);
    let detail = fake["detail"].as_str().unwrap();
    assert!(detail.contains("not gVisor"), "{detail}");
    assert!(detail.ends_with("rung container"), "{detail}");
}
