//! Every conformance suite the backend declares (docs/conformance.md), against real QEMU on the
//! image of `cargo xtask images vm`, with a state directory of the test's own: the reference
//! suites, HARDENING and CONFINEMENT through the qemu hooks (`support::hooks`). Every probe
//! passes, none is skipped, and nothing is left (no QEMU, VM directory or record).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::{run_backend_suites, ConformanceReport, PosixGuestSubject, RunOptions};
use sandbox_core::{Command, ExecRequest, SandboxBackend, SandboxKey, SandboxSpec};
use support::hooks::QemuHooks;
use support::{assert_nothing_left, connect, qemus_under, run_parent};

/// How long the backend's cleanup of a killed command may take beyond the suites' own bounds
/// under TCG on a loaded machine.
const CLEANUP_ALLOWANCE: Duration = Duration::from_secs(10);

/// No probe failed or was skipped, and exactly `expected` ran: a probe that disappears fails too.
fn assert_passed(report: &ConformanceReport, expected: usize) {
    assert_eq!(report.skipped(), 0, "no probe may be skipped:\n{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
}

/// Disposes of every conversation of `scope` the backend lists.
async fn sweep(backend: &backend_qemu::QemuBackend, scope: &str) {
    for thread in backend
        .list(scope, None)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|summary| summary.key.map(|key| key.thread_id))
    {
        let _ = backend.dispose_scope(scope, &thread).await;
    }
    assert!(backend.list(scope, None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_declared_suite_passes_under_qemu() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    let hooks = QemuHooks::new(state_dir.clone());
    let scope = format!("conformance-{}", std::process::id());
    let options = RunOptions {
        exec_cleanup_allowance: CLEANUP_ALLOWANCE,
        hardening: Some(&hooks),
        ..RunOptions::default()
    };
    let expected = options.expected_probes(backend.declarations());
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.clone(), purpose, "agent");
    // The run holds at most two VMs at once (the machine's two VM slots), sampled as it goes.
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (peak, state_dir) = (Arc::clone(&peak), state_dir.clone());
        tokio::spawn(async move {
            loop {
                peak.fetch_max(qemus_under(&state_dir).len(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let started = std::time::Instant::now();
    let report = run_backend_suites(
        &backend,
        &mut keys,
        SandboxSpec::builder("conformance"),
        options,
    )
    .await
    .expect("the conformance run starts");
    sampler.abort();
    let peak = peak.load(Ordering::SeqCst);
    println!(
        "qemu [{}]: {report}\nwall time {:.1} s, at most {peak} VMs at once",
        backend.accelerator().accel.name(),
        started.elapsed().as_secs_f64()
    );
    sweep(&backend, &scope).await;
    assert_nothing_left(&state_dir);
    assert_passed(&report, expected);
    assert!(peak <= 2, "{peak} VMs ran at once");
}

/// CONFINEMENT can fail on a VM, judged on one sandbox call after call (a VM boots slowly under
/// TCG; each judgement is against the view just before its call): the standard call passes on
/// the fresh sandbox; a program started in the background cannot outlive its call here (the
/// agent ends every process of an exec's cgroup with it), so such a call leaves nothing; and a
/// call that leaves a file on the `/tmp` tmpfs, a file on the root outside its paths, a same-size
/// change of a file that existed before it (its times set back), an image file deleted, a cgroup
/// or a mount is judged to leave exactly that behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confinement_passes_a_clean_call_and_fails_each_residue() {
    let state = tempfile::tempdir_in(run_parent()).unwrap();
    let state_dir = state.path().join("state");
    let backend = connect(&state_dir).await;
    let hooks = QemuHooks::new(state_dir.clone());
    let scope = format!("confinement-{}", std::process::id());
    let spec = SandboxSpec::builder("confinement").build().unwrap();
    let checks = {
        let (backend, scope) = (backend.clone(), scope.clone());
        async move {
            let key = SandboxKey::conversation(scope, "confinement", "agent");
            let sandbox = backend.acquire(&key, &spec).await.expect("acquire");
            let subject = PosixGuestSubject::in_storage_base(
                sandbox,
                backend.declarations().capabilities.clone(),
            )
            .expect("subject")
            .with_exec_cleanup_allowance(CLEANUP_ALLOWANCE);
            let report = conformance::isolation::assert_confinement(&subject, &hooks)
                .await
                .unwrap_or_else(|e| panic!("the standard call leaves nothing behind: {e}"));
            assert_passed(&report, conformance::suites::CONFINEMENT_PROBES);

            let report = conformance::isolation::assert_call_leaves_nothing(
                &subject,
                &hooks,
                "a-daemon-ends-with-its-call",
                |sandbox, work, _| {
                    Box::pin(async move {
                        let request = ExecRequest::new(Command::argv([
                            "sh",
                            "-c",
                            "(setsid sleep 3191 </dev/null >/dev/null 2>&1 &); nohup sleep 3192 >/dev/null 2>&1 &",
                        ]))
                        .working_directory(work);
                        let out = sandbox.exec(request).await.map_err(|e| {
                            conformance::ConformanceError::sandbox("the daemon call", e)
                        })?;
                        assert_eq!(out.exit_code, 0);
                        Ok(())
                    })
                },
            )
            .await
            .unwrap_or_else(|e| panic!("a daemon ends with its call: {e}"));
            assert_passed(&report, 1);

            let before = ExecRequest::new(Command::argv([
                "sh",
                "-c",
                "printf a >/var/tmp/confinement-same",
            ]));
            assert_eq!(subject.sandbox.exec(before).await.unwrap().exit_code, 0);
            let cases: [(&str, &str, &str); 6] = [
                (
                    "tmp",
                    "printf leak >/tmp/confinement-leak",
                    "new path /tmp/confinement-leak",
                ),
                (
                    "root",
                    "printf leak >/root/confinement-leak",
                    "new path /root/confinement-leak",
                ),
                (
                    "content",
                    "printf b >/var/tmp/confinement-same; touch -r /etc/hostname /var/tmp/confinement-same",
                    "changed path /var/tmp/confinement-same",
                ),
                ("deleted", "rm /etc/motd", "/etc/motd (deleted)"),
                (
                    "cgroup",
                    "mkdir /sys/fs/cgroup/confinement-leak",
                    "new path /sys/fs/cgroup/confinement-leak",
                ),
                (
                    "mount",
                    // On the image's own /mnt, with its mode: the mount alone is the residue.
                    "mount -t tmpfs -o mode=755 none /mnt",
                    "new path mount /mnt",
                ),
            ];
            for (name, script, residue) in cases {
                conformance::isolation::expect_residue_caught(&subject, &hooks, script, residue)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    };
    let outcome = tokio::spawn(checks).await;
    sweep(&backend, &scope).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
    assert_nothing_left(&state_dir);
}

/// The observer's parsers, on the text the guest's mountinfo and the walk print.
mod observer_parsing {
    use super::support::observer::{
        changed_paths, image_view, is_static_elf, parse_mountinfo, parse_walk,
    };

    #[test]
    fn mounts_are_read_with_their_escapes_and_a_bad_line_is_an_error() {
        let text = "24 1 254:0 / / rw,noatime - ext4 /dev/vda rw\n\
                    26 24 0:22 / /tmp/a\\040b rw,nosuid - tmpfs tmpfs rw\n";
        let mounts = parse_mountinfo(text).unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(
            (mounts[1].point.as_str(), mounts[1].fstype.as_str()),
            ("/tmp/a b", "tmpfs")
        );
        assert_eq!(mounts[0].options, "rw,noatime");
        assert!(parse_mountinfo("24 1 254:0 / / rw\n").is_err());
    }

    #[test]
    fn the_walk_names_kinds_targets_and_what_it_could_not_read() {
        let text = "2049|regular file|644|0|0|3|100|/etc/a|/etc/a\n\
                    2049|directory|755|0|0|4096|100|/etc|/etc\n\
                    2049|symbolic link|777|0|0|4|100|/etc/l|'/etc/l' -> 'a|b'\n\
                    cgroup|directory|755|0|0|0|0|/sys/fs/cgroup/x|/sys/fs/cgroup/x\n\
                    newline-in-name\n\
                    garbage\n\
                    end\n";
        let (paths, unseen) = parse_walk(text);
        let states: Vec<&str> = paths.iter().map(|p| p.state.as_str()).collect();
        assert_eq!(
            states,
            [
                "regular file 644 0:0 3 bytes",
                "directory 755 0:0",
                "symbolic link 777 0:0 -> a|b",
                "directory 755 0:0",
            ]
        );
        assert_eq!(paths[2].path, "/etc/l");
        assert_eq!(unseen.len(), 2, "{unseen:?}");
        let (_, unseen) = parse_walk("2049|directory|755|0|0|4096|100|/|/\n");
        assert_eq!(unseen, ["the walk did not reach its end"]);
    }

    #[test]
    fn changes_are_the_differences_from_the_image() {
        let walk = |lines: &str| parse_walk(&format!("{lines}end\n")).0;
        let booted = 1000;
        let first = walk(
            "1|directory|755|0|0|4096|10|/etc|/etc\n\
             1|regular file|644|0|0|3|10|/etc/a|/etc/a\n\
             1|regular file|644|0|0|3|10|/etc/motd|/etc/motd\n\
             1|regular file|644|0|0|3|1005|/root/new|/root/new\n",
        );
        let image = image_view(&first, booted);
        assert_eq!(
            image.len(),
            3,
            "only what is untouched since the boot: {image:?}"
        );
        // /etc changed its entries but not its own state; /etc/a was rewritten; /etc/motd is
        // gone; a cgroup directory carries no time and always counts.
        let later = walk(
            "1|directory|755|0|0|4096|1010|/etc|/etc\n\
             1|regular file|644|0|0|3|1010|/etc/a|/etc/a\n\
             1|regular file|644|0|0|3|1005|/root/new|/root/new\n\
             cgroup|directory|755|0|0|0|0|/sys/fs/cgroup|/sys/fs/cgroup\n",
        );
        let changed = changed_paths(&later, booted, &image);
        let keys: Vec<&str> = changed.keys().map(String::as_str).collect();
        assert_eq!(keys, ["/etc/a", "/etc/motd", "/root/new", "/sys/fs/cgroup"]);
        assert_eq!(changed["/etc/motd"], "deleted");
    }

    #[test]
    fn only_a_static_executable_may_observe() {
        let busybox = super::support::observer::host_busybox().expect("a static busybox");
        assert!(is_static_elf(&busybox));
        let shell = std::fs::read("/bin/sh").unwrap();
        assert!(
            !is_static_elf(&shell) || shell == busybox,
            "the host's /bin/sh is dynamic"
        );
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }
}

/// The token server's address, read off the host's route table.
mod host_address {
    use super::support::hooks::default_route_interface;

    #[test]
    fn the_default_route_names_its_interface() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
                     eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_interface(table).as_deref(), Some("eth0"));
        let no_default = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
                          docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\n";
        assert_eq!(default_route_interface(no_default), None);
    }
}
