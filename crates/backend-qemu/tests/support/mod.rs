//! What the live tests share: the VM set-up they have in common with the benches
//! ([`setup`]: the image, a configuration of the test's own state directory, the accelerator
//! probe's cached answer, the QEMU processes of a state directory, and the check that a test
//! left nothing behind), a VM's own files and process, and the hooks and observer of the suites.
#![allow(dead_code)]

pub mod hooks;
pub mod observer;
mod setup;

pub use setup::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directory of the VM `instance` of a backend over `state_dir`.
pub fn vm_dir(state_dir: &Path, instance: &str) -> PathBuf {
    state_dir.join("vms").join(instance)
}

/// The pid of the QEMU of `instance`, from its `vm.json`.
pub fn qemu_pid(state_dir: &Path, instance: &str) -> i32 {
    let text = std::fs::read_to_string(vm_dir(state_dir, instance).join("vm.json"))
        .expect("the VM's vm.json");
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["pid"].as_i64().expect("a pid") as i32
}

/// Whether the process `pid` runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Waits up to `within` for `pid` to end.
pub async fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while alive(pid) {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Kills `pid` with SIGKILL.
pub fn kill(pid: i32) {
    let pid = rustix::process::Pid::from_raw(pid).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill");
}

/// Bounds one step of a test, naming it when it hangs.
pub async fn step<T>(
    name: &str,
    within: Duration,
    work: impl std::future::Future<Output = T>,
) -> T {
    eprintln!("step: {name}");
    match tokio::time::timeout(within, work).await {
        Ok(value) => value,
        Err(_) => panic!("step `{name}` did not finish within {within:?}"),
    }
}
