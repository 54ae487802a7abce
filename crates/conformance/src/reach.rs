//! REACH (docs/conformance.md#the-suites): the file plane must not reach what the guest program itself could not.
//!
//! Leaves the undeletable `reach-delete/held` behind, so it runs late on a shared sandbox.

use sandbox_core::{Capability, ErrorKind};

use crate::error::ConformanceError;
use crate::paths::ConformancePaths;
use crate::probe_kit::plant_nothing;
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The suite label.
pub const REACH: &str = "REACH";

/// How many probes [`assert_reach`] runs.
pub const REACH_PROBES: usize = REACH_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const REACH_PROBE_TABLE: &[&str] = &[
    "a-write-leaves-nothing-beyond-the-guest",
    "a-removal-takes-nothing-beyond-the-guest",
];

use Capability::{FilesDelete, FilesIn};

/// Runs the reach probes. No suite gate: each probe has its own, and `.probe-cwd` is planted only when
/// at least one will run. A probe that finds nothing to judge (the guest cannot create the directory, or
/// can delete anything) passes.
pub async fn assert_reach(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    let mut run = SuiteRun::start(
        REACH,
        REACH_PROBE_TABLE,
        None,
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    if run.will_run(&[FilesIn]) {
        plant_nothing(subject, &paths).await?;
    }
    let s = subject.sandbox();
    let p = &paths;
    let work = paths.work.as_str();

    run.probe(
        "a-write-leaves-nothing-beyond-the-guest",
        &[FilesIn],
        async {
            if !subject
                .plant_directory_the_guest_owns(&p.in_work("reach-in"))
                .await?
            {
                return Ok(());
            }
            s.write_file(
                "reach-in/landed.txt",
                b"a write the guest could have made\n",
                work,
            )
            .await?;
            let landed = p.in_work("reach-in/landed.txt");
            ensure!(
                subject.the_guest_can_write(&landed).await?,
                "the guest cannot write the file the host wrote for it"
            );
            ensure!(
                subject.the_guest_can_delete(&landed).await?,
                "the guest cannot delete the file the host wrote for it"
            );
            Ok(())
        },
    )
    .await;

    run.probe(
        "a-removal-takes-nothing-beyond-the-guest",
        &[FilesIn, FilesDelete],
        async {
            if !subject
                .plant_directory_the_guest_owns(&p.in_work("reach-delete"))
                .await?
            {
                return Ok(());
            }
            let held = b"only the host could take this";
            s.write_file("reach-delete/held/keep.txt", held, work)
                .await?;
            s.write_file("reach-delete/held/decoy.txt", held, work)
                .await?;
            let keep = p.in_work("reach-delete/held/keep.txt");
            let decoy = p.in_work("reach-delete/held/decoy.txt");
            // A guest that may delete the host's file (root, say) leaves nothing to judge.
            if subject.the_guest_can_delete(&decoy).await? {
                return Ok(());
            }
            if !subject.exists(&keep).await? || !subject.exists(&decoy).await? {
                return Ok(());
            }
            // The control is built as the guest, so removing it needs no more than the guest's authority.
            let removable = p.in_work("reach-delete/removable");
            let inner = p.in_work("reach-delete/removable/inner");
            let content = p.in_work("reach-delete/removable/inner/content.txt");
            ensure!(
                subject.plant_directory_the_guest_owns(&removable).await?
                    && subject.plant_directory_the_guest_owns(&inner).await?
                    && subject.plant_file_the_guest_owns(&content).await?,
                "the guest could not build the control tree in its own directory"
            );
            s.remove("reach-delete/removable", work, true).await?;
            for path in [&content, &inner, &removable] {
                ensure!(
                    !subject.exists(path).await?,
                    "the recursive removal of the guest's own tree left {path:?}"
                );
            }
            match s.remove("reach-delete/held", work, true).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    return Err(ProbeError::Assertion(format!(
                        "removing the held directory timed out: {e}"
                    )))
                }
                Err(e) if e.is_io() => {}
                Err(e) => return Err(ProbeError::Call(e)),
            }
            ensure!(
                subject.exists(&keep).await? && subject.exists(&decoy).await?,
                "the removal took a file only the host could take"
            );
            Ok(())
        },
    )
    .await;

    run.finish()
}
