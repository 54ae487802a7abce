//! The backend against real QEMU on the image of `cargo xtask images vm` (under TCG on a host
//! without hardware KVM, which the test reports): acquire, exact bytes and exit codes, files,
//! a warm reacquire, find and list, a timeout that leaves the VM serving, disposal, and nothing
//! left in the state directory.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use backend_qemu::QemuBackend;
use sandbox_core::{
    Command, DisposeSelector, ErrorKind, ExecRequest, Isolation, SandboxBackend, SandboxKey,
    SandboxSpec,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_per_key_serves_commands_and_files_and_goes_without_a_trace() {
    // Not `support::connect`: the accelerator probe runs here, unseeded.
    let state = tempfile::tempdir_in(support::run_parent()).unwrap();
    let backend = QemuBackend::connect(support::config(&state.path().join("state")))
        .await
        .expect("connect");
    eprintln!(
        "accelerator: {} ({})",
        backend.accelerator().accel.name(),
        backend.accelerator().reason
    );
    match backend.accelerator().accel {
        qemu_vm::Accel::Kvm => assert_eq!(backend.isolation(), Isolation::Microvm),
        _ => assert_eq!(backend.isolation(), Isolation::Container),
    }

    // The checks run in a task of their own, so a failed one still leaves disposal to run.
    let checks = tokio::spawn(checks(backend.clone(), state.path().join("state")));
    let outcome = checks.await;
    let purge = backend.dispose_scope("live-qemu", "thread").await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert_eq!(purge.disposed, 0, "the checks disposed of their own VM");
    assert!(purge.undisposed.is_none());
}

async fn checks(backend: QemuBackend, state: PathBuf) {
    let key = SandboxKey::conversation("live-qemu", "thread", "agent");
    let spec = SandboxSpec::builder("shell").build().unwrap();
    let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
    assert!(sandbox.freshly_created());

    let out = sandbox
        .exec(ExecRequest::new(Command::argv([
            "/bin/sh",
            "-c",
            "printf 'a\\0b'; printf err >&2; pwd; exit 7",
        ])))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"a\0b/maf-sandbox/work\n");
    assert_eq!(out.stderr, b"err");
    assert_eq!(out.exit_code, 7);
    let missing = sandbox
        .exec(ExecRequest::new(Command::argv(["/no/such/program"])))
        .await
        .unwrap();
    assert_eq!(missing.exit_code, 127);

    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    sandbox
        .write_file("dir/data.bin", &bytes, ".")
        .await
        .unwrap();
    assert_eq!(
        sandbox
            .read_file("dir/data.bin", ".", 1 << 20)
            .await
            .unwrap(),
        bytes
    );
    let capped = sandbox
        .read_file("dir/data.bin", ".", 10)
        .await
        .unwrap_err();
    assert_eq!(capped.kind(), ErrorKind::TransferCapExceeded);
    // A write above the sandbox's own per-file limit (its spec's default, 8 MiB, within the
    // backend's 64 MiB ceiling) is refused before any byte reaches the guest.
    let own_limit = spec.files_in().max_bytes_per_file;
    assert!(own_limit < backend_qemu::TRANSFER_CEILING.max_bytes_per_file);
    let over = vec![0u8; own_limit as usize + 1];
    let refused = sandbox
        .write_file("dir/over.bin", &over, ".")
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::TransferCapExceeded, "{refused}");
    assert!(sandbox
        .stat_file("dir/over.bin", ".")
        .await
        .unwrap()
        .is_none());
    let outside = sandbox
        .read_file("../../etc/passwd", ".", 1 << 20)
        .await
        .unwrap_err();
    assert_eq!(outside.kind(), ErrorKind::Confinement);
    let listed = sandbox.list_dir("dir", ".").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].path(), "dir/data.bin");
    sandbox.remove("dir", ".", true).await.unwrap();
    assert!(sandbox.stat_file("dir", ".").await.unwrap().is_none());

    let slow = sandbox
        .exec(
            ExecRequest::new(Command::argv([
                "/bin/sh",
                "-c",
                "setsid sleep 300 & sleep 300",
            ]))
            .timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert_eq!(slow.kind(), ErrorKind::Timeout);
    let after = sandbox
        .exec(ExecRequest::new(Command::argv([
            "/bin/sh",
            "-c",
            "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true",
        ])))
        .await
        .unwrap();
    assert_eq!(
        after.stdout, b"0\n",
        "the timeout ended every process of the call"
    );

    let warm = backend.acquire(&key, &spec).await.expect("warm acquire");
    assert!(!warm.freshly_created());
    assert_eq!(warm.instance_id(), sandbox.instance_id());
    let found = backend.find(&key, "shell").await.unwrap().expect("found");
    assert_eq!(found.instance_id(), sandbox.instance_id());
    let listed = backend.list("live-qemu", Some("thread")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instance_id, sandbox.instance_id());

    assert!(backend
        .dispose(&key, DisposeSelector::all())
        .await
        .is_none());
    assert!(backend.find(&key, "shell").await.unwrap().is_none());
    let left: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .chain(std::fs::read_dir(state.join("vms")).unwrap())
        .flatten()
        .map(|entry| entry.file_name())
        .filter(|name| !name.to_string_lossy().starts_with('.') && name != "vms")
        .collect();
    assert!(left.is_empty(), "left in the state directory: {left:?}");
}

/// A new sandbox restores its machine's baseline snapshot instead of booting: the first acquire
/// makes the baseline (`.snapshots/<image>/<machine>/`), later ones restore it, each renewed as
/// a machine of its own (its instance id as host name, its own random bytes); a baseline whose
/// memory file is corrupted is refused and removed, and that acquire serves a booted VM; the
/// next one makes a good baseline again and restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sandboxes_restore_the_baseline_and_a_corrupted_one_is_replaced() {
    // Not `support::connect`: the accelerator probe runs here, unseeded.
    let state = tempfile::tempdir_in(support::run_parent()).unwrap();
    let backend = QemuBackend::connect(support::config(&state.path().join("state")))
        .await
        .expect("connect");
    let checks = tokio::spawn(baseline_checks(backend.clone(), state.path().join("state")));
    let outcome = checks.await;
    let purge = backend.dispose_scope("live-qemu", "baseline").await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert!(purge.undisposed.is_none());
}

async fn baseline_checks(backend: QemuBackend, state: PathBuf) {
    let spec = SandboxSpec::builder("shell").build().unwrap();
    let probe = "hostname; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'";
    let mut seen = Vec::new();
    for agent in ["a", "b", "c"] {
        let key = SandboxKey::conversation("live-qemu", "baseline", agent);
        let started = std::time::Instant::now();
        let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
        eprintln!("acquire {agent}: {:.2} s", started.elapsed().as_secs_f64());
        let out = sandbox
            .exec(ExecRequest::new(Command::argv(["sh", "-c", probe])))
            .await
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let (host, random) = text.split_once('\n').unwrap();
        if agent == "b" {
            // The corrupted baseline was refused and removed: this VM booted, unrenewed.
            assert_ne!(host, sandbox.instance_id(), "b booted");
        } else {
            assert_eq!(host, sandbox.instance_id(), "restored and renewed: {agent}");
        }
        seen.push(random.to_owned());
        if agent == "a" {
            // Corrupt the baseline the first acquire made.
            let images: Vec<_> = std::fs::read_dir(state.join(".snapshots"))
                .unwrap()
                .flatten()
                .collect();
            assert_eq!(images.len(), 1);
            let machines: Vec<_> = std::fs::read_dir(images[0].path())
                .unwrap()
                .flatten()
                .filter(|e| e.path().join("snapshot.json").exists())
                .collect();
            assert_eq!(machines.len(), 1, "one baseline");
            let memory = machines[0].path().join("memory");
            let mut bytes = std::fs::read(&memory).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 1;
            std::fs::write(&memory, bytes).unwrap();
        }
    }
    let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(
        distinct.len(),
        3,
        "three sandboxes, three random draws: {seen:?}"
    );
}
