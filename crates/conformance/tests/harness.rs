//! Tests of the harness itself against a scripted sandbox: gates, skips, aggregation, the refusal
//! table and the POSIX seams.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use conformance::commands::assert_exec;
use conformance::files::{
    assert_files_delete, assert_files_out, assert_reach, assert_storage_base, measure_files_delete,
};
use conformance::harness::{refused_with, Refusal, RefusalMismatch};
use conformance::network::assert_egress;
use conformance::run::ProbeOutcome;
use conformance::sandboxes::assert_reclaim;
use conformance::suites::{FILES_OUT_PROBES, STORAGE_BASE_STEPS};
use conformance::{ConformanceError, ConformanceSubject, PosixGuestSubject};
use sandbox_core::{Capability, ErrorKind, SandboxError};
use support::{exited, ScriptedSandbox};

use Capability::{Exec, FilesDelete, FilesIn, FilesList, FilesOut, Reclaim};

fn caps(list: &[Capability]) -> BTreeSet<Capability> {
    list.iter().copied().collect()
}

fn subject(sandbox: Arc<ScriptedSandbox>, declared: &[Capability]) -> PosixGuestSubject {
    PosixGuestSubject::new(sandbox, "/base/work", caps(declared)).expect("absolute wd")
}

#[tokio::test]
async fn an_undeclared_gate_is_refused_before_anything_is_planted() {
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox.clone(), &[Exec, FilesIn]);
    for (result, suite, gate) in [
        (assert_files_out(&s, false).await, "FILES_OUT", FilesOut),
        (assert_files_delete(&s).await, "FILES_DELETE", FilesDelete),
        (assert_reclaim(&s).await, "RECLAIM", Reclaim),
    ] {
        match result {
            Err(ConformanceError::GateNotDeclared {
                suite: got,
                capability,
            }) => {
                assert_eq!(got, suite);
                assert_eq!(capability, gate);
            }
            other => panic!("{suite}: expected GateNotDeclared, got {other:?}"),
        }
    }
    let exec_less = subject(sandbox.clone(), &[FilesIn]);
    assert!(matches!(
        assert_exec(&exec_less).await,
        Err(ConformanceError::GateNotDeclared {
            capability: Exec,
            ..
        })
    ));
    assert_eq!(sandbox.calls(), Vec::<String>::new(), "nothing was planted");
}

#[tokio::test]
async fn the_measurement_runs_without_a_gate_and_without_a_verdict() {
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox.clone(), &[Exec, FilesIn]);
    let report = measure_files_delete(&s).await.expect("no verdict");
    assert_eq!(report.probes().len(), 10);
    assert!(report.failed() > 0, "the obliging double removes nothing");
    assert!(sandbox.calls().iter().any(|c| c.starts_with("remove ")));
}

#[tokio::test]
async fn undeclared_probe_capabilities_are_skipped_and_plant_nothing() {
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox.clone(), &[Exec]);
    let report = assert_reach(&s).await.expect("skips are not failures");
    assert_eq!(report.probes().len(), 2);
    for probe in report.probes() {
        assert_eq!(
            probe.outcome,
            ProbeOutcome::Skipped {
                reason: "backend does not declare files_in".into()
            }
        );
    }
    assert!(
        sandbox.calls().is_empty(),
        "REACH planted with nothing to run"
    );
    assert!(matches!(
        report.assert_no_skips(),
        Err(ConformanceError::ProbesSkipped { skipped }) if skipped.len() == 2
    ));
}

#[tokio::test]
async fn failures_are_aggregated_with_every_probe_run() {
    // Plants succeed, but every stat finds nothing and every other file call returns normally.
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox.clone(), &[Exec, FilesIn, FilesOut]);
    let error = assert_files_out(&s, false)
        .await
        .expect_err("nothing is refused");
    let message = error.to_string();
    let report = error
        .report()
        .expect("a conformance failure carries its report");
    assert_eq!(report.probes().len(), FILES_OUT_PROBES);
    assert_eq!(report.skipped(), 4, "the listing probes need files_list");
    assert_eq!(report.failed(), 8);
    assert!(
        message.starts_with("8 of 12 FILES_OUT conformance probes failed"),
        "{message}"
    );
    assert!(message
        .contains("a-link-is-never-read: expected an I/O kind, but the call returned normally"));
    assert!(message.contains("a-plain-parent-is-not-an-escape: expected NotADirectory"));
    let planted: Vec<String> = sandbox
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("write ") || c.starts_with("exec ln"))
        .collect();
    assert_eq!(
        planted,
        [
            "write /base/work/real/inside.txt /base/work/real",
            "write /base/work/plain.txt /base/work",
            "write /base/work-outside/secret.txt /base/work-outside",
            "write /base/work-outside/sub/leaf.txt /base/work-outside/sub",
            "exec ln -sfn /base/work-outside /base/work/link-dir /",
            "exec ln -sfn /base/work-outside/secret.txt /base/work/link-file /",
        ]
    );
}

#[tokio::test]
async fn an_error_from_a_call_names_its_kind() {
    let sandbox = ScriptedSandbox::new(
        |_, _| exited(0, b""),
        |op, path, _| match op {
            "read" => Err(SandboxError::engine("the engine fell over")),
            "stat" if path == "link-dir/secret.txt" => Err(SandboxError::confinement(path, "link")),
            _ => Ok(()),
        },
    );
    let s = subject(sandbox, &[Exec, FilesIn, FilesOut, FilesList]);
    let report = assert_files_out(&s, false)
        .await
        .expect_err("failures")
        .report()
        .cloned()
        .unwrap();
    let read = report
        .get("FILES_OUT", "read-through-a-linked-parent")
        .unwrap();
    match &read.outcome {
        ProbeOutcome::Failed { why } => {
            assert!(why.contains("returned `Engine`"), "{why}");
            assert!(why.contains("the engine fell over"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        report
            .get("FILES_OUT", "stat-through-a-linked-parent")
            .unwrap()
            .outcome,
        ProbeOutcome::Passed
    );
}

#[tokio::test]
async fn the_refusal_table_translates_the_reference_classes() {
    use ErrorKind::*;
    let io = [
        NotFound,
        NotADirectory,
        IsADirectory,
        NotRegularFile,
        GuestRefused,
        Io,
    ];
    let not_io = [
        Confinement,
        Timeout,
        TransferCapExceeded,
        OutputLimitExceeded,
        EngineTimeout,
        InvalidArgument,
    ];
    for kind in io {
        assert!(Refusal::AnyIo.accepts(kind), "{kind:?}");
        assert!(!Refusal::Confinement.accepts(kind), "{kind:?}");
        assert!(!Refusal::Timeout.accepts(kind), "{kind:?}");
    }
    for kind in not_io {
        assert!(!Refusal::AnyIo.accepts(kind), "{kind:?}");
    }
    assert!(Refusal::Confinement.accepts(Confinement));
    assert!(Refusal::NotADirectory.accepts(NotADirectory));
    assert!(!Refusal::NotADirectory.accepts(IsADirectory));
    assert!(Refusal::Timeout.accepts(Timeout));
    assert!(!Refusal::Timeout.accepts(EngineTimeout));
    assert!(Refusal::Exactly(InvalidArgument).accepts(InvalidArgument));

    let normal = refused_with(Refusal::Confinement, async { Ok::<_, SandboxError>(3) }).await;
    assert!(matches!(
        normal,
        Err(RefusalMismatch::ReturnedNormally {
            expected: Refusal::Confinement
        })
    ));
    let wrong = refused_with(Refusal::Confinement, async {
        Err::<(), _>(SandboxError::NotFound { path: "x".into() })
    })
    .await
    .unwrap_err();
    assert!(wrong.to_string().contains("returned `NotFound`"), "{wrong}");
}

#[tokio::test]
async fn exists_reads_exit_statuses_strictly() {
    // test -e: 1, test -L: 0 → a dangling link is present.
    let dangling = ScriptedSandbox::new(
        |argv, _| exited(if argv[1] == "-L" { 0 } else { 1 }, b""),
        |_, _, _| Ok(()),
    );
    assert!(subject(dangling, &[Exec]).exists("/x").await.unwrap());
    let absent = ScriptedSandbox::new(|_, _| exited(1, b""), |_, _, _| Ok(()));
    assert!(!subject(absent, &[Exec]).exists("/x").await.unwrap());
    let broken = ScriptedSandbox::new(|_, _| exited(2, b""), |_, _, _| Ok(()));
    let s = subject(broken, &[Exec]);
    assert!(matches!(
        s.exists("/x").await,
        Err(ConformanceError::Harness { .. })
    ));
    assert!(s.plant_directory_the_guest_owns("/x").await.is_err());
    assert!(s.the_guest_can_write("/x").await.is_err());
    assert!(s.the_guest_can_delete("/x").await.is_err());
    assert!(s.plant_symlink("/x", "/y").await.is_err());
}

#[tokio::test]
async fn deletion_is_judged_only_after_rm_succeeds() {
    // rm exits 0 and the path is gone afterwards.
    let gone = ScriptedSandbox::new(
        |argv, _| exited(if argv[0] == "rm" { 0 } else { 1 }, b""),
        |_, _, _| Ok(()),
    );
    let s = subject(gone.clone(), &[Exec]);
    assert!(s.the_guest_can_delete("/w/f").await.unwrap());
    assert_eq!(
        gone.calls(),
        [
            "exec rm -f /w/f /",
            "exec test -e /w/f /",
            "exec test -L /w/f /"
        ]
    );
    // rm refuses: false, and absence is never asked.
    let refused = ScriptedSandbox::new(|_, _| exited(1, b""), |_, _, _| Ok(()));
    let s = subject(refused.clone(), &[Exec]);
    assert!(!s.the_guest_can_delete("/w/f").await.unwrap());
    assert_eq!(refused.calls(), ["exec rm -f /w/f /"]);
    // mkdir: 0 true, 1 false.
    let mkdir = ScriptedSandbox::new(|_, _| exited(1, b""), |_, _, _| Ok(()));
    assert!(!subject(mkdir, &[Exec])
        .plant_directory_the_guest_owns("/w/d")
        .await
        .unwrap());
}

#[tokio::test]
async fn a_relative_subject_directory_is_refused() {
    let result = PosixGuestSubject::new(ScriptedSandbox::obliging(), "work", caps(&[Exec]));
    assert!(matches!(result, Err(ConformanceError::InvalidArgument(_))));
    let base =
        PosixGuestSubject::in_storage_base(ScriptedSandbox::obliging(), caps(&[Exec])).unwrap();
    assert_eq!(base.working_directory(), "/base/work");
}

#[tokio::test]
async fn the_storage_base_stops_at_its_first_failure() {
    let sandbox = ScriptedSandbox::new(|_, _| exited(1, b""), |_, _, _| Ok(()));
    let all = caps(&[Exec, FilesIn, FilesOut, FilesList, FilesDelete, Reclaim]);
    let error = assert_storage_base(sandbox.as_ref(), &all)
        .await
        .expect_err("pwd exits 1");
    let report = error.report().unwrap();
    assert_eq!(report.probes().len(), STORAGE_BASE_STEPS);
    assert_eq!(report.failed(), 1);
    assert_eq!(report.skipped(), STORAGE_BASE_STEPS - 1);
    assert!(error
        .to_string()
        .starts_with("1 of 16 STORAGE_BASE conformance probes failed: exec-runs-in-the-base"));
    assert_eq!(
        sandbox.calls(),
        ["exec pwd ."],
        "nothing ran after the failure"
    );
}

#[tokio::test]
async fn an_exec_cleanup_allowance_above_thirty_seconds_is_a_harness_error() {
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox, &[Exec, FilesIn]).with_exec_cleanup_allowance(Duration::from_secs(31));
    let error = assert_exec(&s)
        .await
        .expect_err("the obliging double fails");
    let report = error.report().unwrap();
    match &report
        .get("EXEC", "a-timeout-raises-timeout-error")
        .unwrap()
        .outcome
    {
        ProbeOutcome::Failed { why } => assert!(why.starts_with("harness error:"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        report.probes().len(),
        conformance::suites::EXEC_PROBES,
        "every EXEC probe ran"
    );
}

#[tokio::test]
async fn egress_refuses_a_sub_second_timeout_before_any_call() {
    let sandbox = ScriptedSandbox::obliging();
    let s = subject(sandbox.clone(), &[Exec]);
    let result = assert_egress(
        &s,
        "http://127.0.0.1:1/",
        "http://127.0.0.1:2/",
        Duration::from_millis(500),
    )
    .await;
    assert!(matches!(result, Err(ConformanceError::InvalidArgument(_))));
    assert!(sandbox.calls().is_empty());
}

#[tokio::test]
async fn egress_reads_reach_from_the_status_code() {
    // The allowed URL answers 200, the denied one 000 with curl's exit 28.
    let sandbox = ScriptedSandbox::new(
        |argv, _| {
            if argv[2].contains("allowed") {
                exited(0, b"200")
            } else {
                exited(28, b"000")
            }
        },
        |_, _, _| Ok(()),
    );
    let s = subject(sandbox.clone(), &[Exec]);
    let report = assert_egress(
        &s,
        "http://127.0.0.1/allowed",
        "http://127.0.0.1/denied",
        Duration::from_secs(30),
    )
    .await
    .expect("reached and refused as declared");
    assert_eq!(report.passed(), 2);
    let calls = sandbox.calls();
    assert!(
        calls[0].contains("--max-time 25.000 'http://127.0.0.1/allowed'"),
        "{calls:?}"
    );
}

struct NoEngine;

#[async_trait::async_trait]
impl conformance::isolation::HardeningHooks for NoEngine {
    async fn remove_behind_the_handle(
        &self,
        _: &dyn sandbox_core::Sandbox,
    ) -> Result<(), ConformanceError> {
        Err(ConformanceError::harness("HARDENING", "no engine here"))
    }
    async fn engine_instances_for(
        &self,
        _: &sandbox_core::SandboxKey,
        _: &sandbox_core::SandboxSpec,
    ) -> Result<usize, ConformanceError> {
        Ok(0)
    }
    async fn acquire_in_child_process(
        &self,
        _: &sandbox_core::SandboxKey,
        _: &sandbox_core::SandboxSpec,
        _: usize,
    ) -> Result<Vec<Result<conformance::isolation::AcquireOutcome, ErrorKind>>, ConformanceError>
    {
        Ok(Vec::new())
    }
    async fn routable_host_address(&self) -> Result<std::net::IpAddr, ConformanceError> {
        Ok("127.0.0.1".parse().unwrap())
    }
    fn host_rss_bytes(&self) -> Option<u64> {
        Some(1 << 20)
    }
}

#[tokio::test]
async fn an_unreadable_group_poll_is_a_harness_error_never_a_pass() {
    // The timed-out command times out as it should, but the poll answers 3 (the shell did not
    // understand `kill -0 -"$p"`); the flood is refused, and its poll answers 1 (a survivor).
    let sandbox = ScriptedSandbox::new(
        |argv, _| {
            let script = argv.get(2).map(String::as_str).unwrap_or("");
            if script.contains("sleep 3131") {
                Err(SandboxError::Timeout {
                    operation: "command".into(),
                    bound: Duration::from_secs(1),
                    cleanup: Some(sandbox_core::GuestCleanup::Killed),
                })
            } else if script.contains("head -c") {
                Err(SandboxError::OutputLimitExceeded { limit: 8 << 20 })
            } else if argv.get(3).map(String::as_str) == Some("poll") {
                // The survivor poll: unreadable after the timeout, a survivor after the flood.
                match argv.get(5).map(String::as_str) {
                    Some("sleep31") => exited(3, b""),
                    _ => exited(1, b""),
                }
            } else {
                exited(0, b"")
            }
        },
        |_, _, _| Ok(()),
    );
    let s = subject(sandbox, &[Exec, FilesIn]);
    let report = conformance::isolation::assert_hardening(&s, &NoEngine)
        .await
        .expect_err("nothing passes on this double")
        .report()
        .cloned()
        .unwrap();
    let why = |probe: &str| match &report.get("HARDENING", probe).unwrap().outcome {
        ProbeOutcome::Failed { why } => why.clone(),
        other => panic!("{probe}: {other:?}"),
    };
    assert!(why("a-timed-out-group-is-dead").starts_with("harness error: the survivor poll"));
    assert!(why("a-flood-is-refused-and-bounded").contains("is still alive"));
    // A refused stream is the probe's failure, never a pass.
    assert!(why("a-slow-consumer-holds-host-memory-bounded").contains("OutputLimitExceeded"));
    assert_eq!(
        report.get("HARDENING", "argv-refuses-nul").unwrap().outcome,
        ProbeOutcome::Passed,
        "the NUL is refused as InvalidArgument"
    );
    assert!(why("argv-round-trips-bytes").contains("came back as"));
}

#[tokio::test]
async fn a_timeout_probe_fails_on_a_survivor_or_a_retired_sandbox() {
    use conformance::suites::HOSTILE_TIMEOUT_CASES;
    // Every hostile command times out and is killed; the survivor check finds a process of the
    // double-fork case only; the sibling completes; the nohup case's kill reports Retired.
    let sandbox = ScriptedSandbox::new(
        |argv, _| {
            let script = argv.get(2).map(String::as_str).unwrap_or("");
            if argv.get(3).map(String::as_str) == Some("sleep") {
                let cleanup = if script.contains("nohup") {
                    sandbox_core::GuestCleanup::Retired
                } else {
                    sandbox_core::GuestCleanup::Killed
                };
                Err(SandboxError::Timeout {
                    operation: "command".into(),
                    bound: Duration::from_secs(2),
                    cleanup: Some(cleanup),
                })
            } else if argv.get(3).map(String::as_str) == Some("check") {
                if argv.get(4).map(String::as_str) == Some("3141") && argv[5] == "3" {
                    exited(0, b"77 sleep31413\n")
                } else {
                    exited(0, b"")
                }
            } else if script.contains("sibling-done") {
                exited(0, b"sibling-done\n")
            } else {
                exited(0, b"")
            }
        },
        |_, _, _| Ok(()),
    );
    let s = subject(sandbox, &[Exec, FilesIn, Capability::ExactKill]);
    let report = conformance::isolation::assert_hardening(&s, &NoEngine)
        .await
        .expect_err("two of the timeout probes fail on this double")
        .report()
        .cloned()
        .unwrap();
    let outcome = |probe: &str| report.get("HARDENING", probe).unwrap().outcome.clone();
    // A command that ends early: the stream came short of its gibibyte.
    match outcome("a-slow-consumer-holds-host-memory-bounded") {
        ProbeOutcome::Failed { why } => assert!(why.contains("delivered 0 of 1073741824"), "{why}"),
        other => panic!("a short stream passed: {other:?}"),
    }
    for (name, _) in HOSTILE_TIMEOUT_CASES {
        match (name, outcome(name)) {
            ("a-timeout-kills-a-double-fork-daemon", ProbeOutcome::Failed { why }) => {
                assert!(
                    why.contains("still running") && why.contains("sleep31413"),
                    "{why}"
                )
            }
            ("a-timeout-kills-nohup-jobs", ProbeOutcome::Failed { why }) => {
                assert!(why.contains("Retired"), "{why}")
            }
            (_, ProbeOutcome::Passed) => {}
            (name, other) => panic!("{name}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn without_exact_kills_the_group_cases_judge_the_group_and_end_what_left_it() {
    use conformance::suites::{GROUP_TIMEOUT_CASES, HOSTILE_TIMEOUT_CASES};
    // Every hostile command times out and its kill lands. The survivor check finds a process
    // of the daemon case's group (marker 31422); the escapees are ended by the probe, whose
    // poll then finds none, except the child case's (31521), which survives its own end.
    let sandbox = ScriptedSandbox::new(
        |argv, _| {
            let script = argv.get(2).map(String::as_str).unwrap_or("");
            match argv.get(3).map(String::as_str) {
                Some("sleep") => Err(SandboxError::Timeout {
                    operation: "command".into(),
                    bound: Duration::from_secs(2),
                    cleanup: Some(sandbox_core::GuestCleanup::Killed),
                }),
                Some("check") if argv[4] == "3142" && argv[5] == "2" => {
                    exited(0, b"77 sleep31422\n")
                }
                Some("poll") if argv[5] == "sleep3152" && argv[4] == "1" => exited(1, b""),
                _ if script.contains("sibling-done") => exited(0, b"sibling-done\n"),
                _ => exited(0, b""),
            }
        },
        |_, _, _| Ok(()),
    );
    let s = subject(sandbox.clone(), &[Exec, FilesIn]);
    let report = conformance::isolation::assert_hardening(&s, &NoEngine)
        .await
        .expect_err("two group probes fail on this double")
        .report()
        .cloned()
        .unwrap();
    // The exact cases are not run: the group cases take their place, as many probes less the
    // two that need sandboxes of their own.
    for (name, _) in HOSTILE_TIMEOUT_CASES {
        let replaced = GROUP_TIMEOUT_CASES.iter().any(|(group, _)| *group == name);
        assert_eq!(report.get("HARDENING", name).is_some(), replaced, "{name}");
    }
    let outcome = |probe: &str| report.get("HARDENING", probe).unwrap().outcome.clone();
    for (name, _) in GROUP_TIMEOUT_CASES {
        match (name, outcome(name)) {
            ("a-timeout-kills-the-group-a-daemon-left", ProbeOutcome::Failed { why }) => {
                assert!(why.contains("sleep31422"), "{why}")
            }
            ("a-timeout-kills-the-group-a-child-left", ProbeOutcome::Failed { why }) => {
                assert!(why.contains("still alive"), "{why}")
            }
            (_, ProbeOutcome::Passed) => {}
            (name, other) => panic!("{name}: {other:?}"),
        }
    }
    // Each group case got its escapee's marker after its own.
    let calls = sandbox.calls();
    assert!(calls
        .iter()
        .any(|call| call.contains(" sleep 31421 31521 ")));
    assert!(calls.iter().any(|call| call.contains(" kill 3152 1 ")));
}

#[tokio::test]
async fn a_lost_record_passes_retired_with_a_refusing_handle_and_fails_otherwise() {
    use conformance::suites::RECORD_REMOVING_CASES;
    let timeout = |cleanup| {
        Err(SandboxError::Timeout {
            operation: "command".into(),
            bound: Duration::from_secs(2),
            cleanup: Some(cleanup),
        })
    };
    let retired = || SandboxError::Retired {
        instance: "i".into(),
        reason: "the kill did not land".into(),
    };
    // Retired, and the handle refuses afterwards: a pass.
    let refusing = ScriptedSandbox::new(
        move |argv, _| match argv.get(3).map(String::as_str) {
            Some("sleep") => timeout(sandbox_core::GuestCleanup::Retired),
            _ if argv.first().map(String::as_str) == Some("true") => Err(retired()),
            _ => exited(0, b""),
        },
        |_, _, _| Ok(()),
    );
    for index in 0..RECORD_REMOVING_CASES.len() {
        let s = subject(refusing.clone(), &[Exec, FilesIn]);
        let report = conformance::isolation::assert_a_lost_record_retires(&s, index)
            .await
            .expect("a retired sandbox whose handle refuses passes");
        assert_eq!(report.passed(), 1);
    }
    // Retired, but the handle still serves: a failure.
    let serving = ScriptedSandbox::new(
        move |argv, _| match argv.get(3).map(String::as_str) {
            Some("sleep") => timeout(sandbox_core::GuestCleanup::Retired),
            _ => exited(0, b""),
        },
        |_, _, _| Ok(()),
    );
    let s = subject(serving, &[Exec, FilesIn]);
    let report = conformance::isolation::assert_a_lost_record_retires(&s, 0)
        .await
        .expect_err("a retired sandbox that still serves fails")
        .report()
        .cloned()
        .unwrap();
    match &report
        .get("HARDENING", RECORD_REMOVING_CASES[0].0)
        .unwrap()
        .outcome
    {
        ProbeOutcome::Failed { why } => assert!(why.contains("still served"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Killed, with a survivor: a failure.
    let survivor = ScriptedSandbox::new(
        move |argv, _| match argv.get(3).map(String::as_str) {
            Some("sleep") => timeout(sandbox_core::GuestCleanup::Killed),
            Some("check") => exited(0, b"9 sleep31432\n"),
            _ => exited(0, b""),
        },
        |_, _, _| Ok(()),
    );
    let s = subject(survivor, &[Exec, FilesIn]);
    let failed = conformance::isolation::assert_a_lost_record_retires(&s, 1).await;
    assert!(failed.is_err(), "a survivor after a landed kill passed");
    assert!(conformance::isolation::assert_a_lost_record_retires(&s, 2)
        .await
        .is_err());
}
