//! Storage base (docs/conformance.md#the-suites): relative addressing against a fresh sandbox's own base.

use std::collections::BTreeSet;

use sandbox_core::{
    Capability, Command, EntryKind, ExecOutput, ExecRequest, Sandbox, SandboxError,
};

use crate::error::ConformanceError;
use crate::fixtures::{PROBE_EXEC_TIMEOUT, RECLAIM_TIMEOUT};
use crate::report::ConformanceReport;
use crate::suite_runner::{ensure, refused_with, ProbeError, Refusal, SuiteRun, Verdict};

/// The suite label.
pub const STORAGE_BASE: &str = "STORAGE_BASE";

/// How many steps [`assert_storage_base`] reports.
pub const STORAGE_BASE_STEPS: usize = STORAGE_BASE_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const STORAGE_BASE_PROBE_TABLE: &[&str] = &[
    "exec-runs-in-the-base",
    "exec-cannot-leave-the-base",
    "the-base-stats-as-a-directory",
    "the-base-is-not-read-as-a-file",
    "the-base-listing-names-no-self-or-parent",
    "out-of-base-stat-and-read-are-refused",
    "out-of-base-listings-are-refused",
    "out-of-base-removals-are-refused",
    "out-of-base-reclaims-are-refused",
    "relative-writes-land",
    "exec-reads-a-relative-write",
    "relative-stat-and-read-agree",
    "a-relative-listing-is-exact",
    "out-of-base-writes-are-refused",
    "a-relative-removal-removes",
    "a-relative-reclaim-reclaims",
];

use Capability::{Exec, FilesDelete, FilesIn, FilesList, FilesOut, Reclaim};

async fn exec_in(
    sandbox: &dyn Sandbox,
    argv: &[&str],
    wd: &str,
) -> Result<ExecOutput, SandboxError> {
    let request = ExecRequest::new(Command::argv(argv))
        .working_directory(wd)
        .timeout(PROBE_EXEC_TIMEOUT);
    sandbox.exec(request).await
}

/// The escapes every file method must refuse, as (path, wd) pairs.
const ESCAPES: [(&str, &str); 2] = [("escape", "../outside"), ("../escape", ".")];

/// Asserts the storage-base rules on a **fresh** sandbox, addressing everything relative to its base.
///
/// Run it twice per backend: once on a sandbox acquired with `work_dir = None` and once with
/// `work_dir = Some(EXPLICIT_STORAGE_BASE)`. Steps stop at the first failure (the later ones are
/// reported as not run); a step whose capability is not declared is skipped. `capabilities` must be the
/// backend's full declared set.
pub async fn assert_storage_base(
    sandbox: &dyn Sandbox,
    capabilities: &BTreeSet<Capability>,
) -> Result<ConformanceReport, ConformanceError> {
    let mut run = SuiteRun::start(
        STORAGE_BASE,
        STORAGE_BASE_PROBE_TABLE,
        None,
        capabilities,
        Verdict::StopAtFirstFailure,
    )?;
    let s = sandbox;

    run.probe("exec-runs-in-the-base", &[Exec], async {
        let out = exec_in(s, &["pwd"], ".").await?;
        ensure!(out.exit_code == 0, "`pwd` in `.` exited {}", out.exit_code);
        ensure!(!out.stdout.is_empty(), "`pwd` in `.` printed nothing");
        Ok(())
    })
    .await;

    run.probe("exec-cannot-leave-the-base", &[Exec], async {
        refused_with(Refusal::Confinement, exec_in(s, &["pwd"], "../outside")).await?;
        Ok(())
    })
    .await;

    run.probe("the-base-stats-as-a-directory", &[FilesOut], async {
        let entry = s.stat_file(".", ".").await?;
        let entry = entry.ok_or_else(|| ProbeError::Assertion("stat `.` found nothing".into()))?;
        ensure!(
            entry.kind() == EntryKind::Directory,
            "stat `.` is {}",
            entry.kind()
        );
        ensure!(
            matches!(entry.path(), "" | "."),
            "stat `.` is named {:?}",
            entry.path()
        );
        Ok(())
    })
    .await;

    run.probe("the-base-is-not-read-as-a-file", &[FilesOut], async {
        refused_with(Refusal::AnyIo, s.read_file(".", ".", 1)).await?;
        Ok(())
    })
    .await;

    run.probe(
        "the-base-listing-names-no-self-or-parent",
        &[FilesList],
        async {
            for entry in s.list_dir(".", ".").await? {
                let p = entry.path();
                ensure!(
                    !matches!(p, "" | "." | "..") && !p.contains('/') && !p.contains('\\'),
                    "the listing of `.` has an entry named {p:?}"
                );
            }
            Ok(())
        },
    )
    .await;

    run.probe(
        "out-of-base-stat-and-read-are-refused",
        &[FilesOut],
        async {
            for (path, wd) in ESCAPES {
                refused_with(Refusal::Confinement, s.stat_file(path, wd)).await?;
                refused_with(Refusal::Confinement, s.read_file(path, wd, 1)).await?;
            }
            Ok(())
        },
    )
    .await;

    run.probe("out-of-base-listings-are-refused", &[FilesList], async {
        for (path, wd) in ESCAPES {
            refused_with(Refusal::Confinement, s.list_dir(path, wd)).await?;
        }
        Ok(())
    })
    .await;

    let removal_targets = [ESCAPES[0], ESCAPES[1], (".", ".")];
    run.probe("out-of-base-removals-are-refused", &[FilesDelete], async {
        for (path, wd) in removal_targets {
            for recursive in [false, true] {
                refused_with(Refusal::Confinement, s.remove(path, wd, recursive)).await?;
            }
        }
        Ok(())
    })
    .await;

    run.probe("out-of-base-reclaims-are-refused", &[Reclaim], async {
        for (path, wd) in removal_targets {
            refused_with(Refusal::Confinement, s.reclaim(path, wd, RECLAIM_TIMEOUT)).await?;
        }
        Ok(())
    })
    .await;

    // Without files_in nothing below can be planted: those steps are skipped for it.
    run.probe("relative-writes-land", &[FilesIn], async {
        s.write_file("storage-base-probe/value", b"first", ".")
            .await?;
        s.write_file("value", b"second", "storage-base-probe")
            .await?;
        Ok(())
    })
    .await;

    run.probe("exec-reads-a-relative-write", &[FilesIn, Exec], async {
        let out = exec_in(s, &["cat", "value"], "storage-base-probe").await?;
        ensure!(out.exit_code == 0, "`cat value` exited {}", out.exit_code);
        ensure!(
            out.stdout == b"second",
            "`cat value` printed {:?}",
            out.stdout_text()
        );
        Ok(())
    })
    .await;

    run.probe(
        "relative-stat-and-read-agree",
        &[FilesIn, FilesOut],
        async {
            for (path, wd) in [
                ("storage-base-probe/value", "."),
                ("value", "storage-base-probe"),
            ] {
                let entry = s
                    .stat_file(path, wd)
                    .await?
                    .ok_or_else(|| ProbeError::Assertion(format!("stat {path:?} found nothing")))?;
                ensure!(
                    entry.path() == path,
                    "stat {path:?} in {wd:?} is named {:?}",
                    entry.path()
                );
                ensure!(
                    entry.kind() == EntryKind::File,
                    "stat {path:?} is {}",
                    entry.kind()
                );
                let bytes = s.read_file(path, wd, 6).await?;
                ensure!(
                    bytes == b"second",
                    "read {path:?} gave {:?}",
                    String::from_utf8_lossy(&bytes)
                );
            }
            Ok(())
        },
    )
    .await;

    run.probe(
        "a-relative-listing-is-exact",
        &[FilesIn, FilesList],
        async {
            let names: Vec<String> = s
                .list_dir(".", "storage-base-probe")
                .await?
                .iter()
                .map(|e| e.path().to_owned())
                .collect();
            ensure!(
                names == ["value"],
                "the listing of storage-base-probe is {names:?}"
            );
            Ok(())
        },
    )
    .await;

    run.probe("out-of-base-writes-are-refused", &[FilesIn], async {
        refused_with(
            Refusal::Confinement,
            s.write_file("escape", b"no", "../outside"),
        )
        .await?;
        refused_with(
            Refusal::Confinement,
            s.write_file("../escape", b"no", "storage-base-probe"),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe(
        "a-relative-removal-removes",
        &[FilesIn, FilesDelete],
        async {
            s.remove("value", "storage-base-probe", false).await?;
            if capabilities.contains(&FilesOut) {
                let left = s.stat_file("storage-base-probe/value", ".").await?;
                ensure!(left.is_none(), "the removed file is still there: {left:?}");
            }
            Ok(())
        },
    )
    .await;

    run.probe("a-relative-reclaim-reclaims", &[FilesIn, Reclaim], async {
        s.write_file("value", b"reclaim", "storage-base-probe")
            .await?;
        s.reclaim("storage-base-probe", ".", RECLAIM_TIMEOUT)
            .await?;
        if capabilities.contains(&FilesOut) {
            let left = s.stat_file("storage-base-probe", ".").await?;
            ensure!(
                left.is_none(),
                "the reclaimed directory is still there: {left:?}"
            );
        }
        Ok(())
    })
    .await;

    run.finish()
}
