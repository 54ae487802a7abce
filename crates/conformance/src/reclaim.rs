//! RECLAIM (docs/conformance.md#the-suites): a call's directory goes with everything under it, links unlinked, never followed.

use sandbox_core::Capability;

use crate::error::ConformanceError;
use crate::fixtures::RECLAIM_TIMEOUT;
use crate::paths::ConformancePaths;
use crate::probe_kit::{expect_gone, expect_present, plant_nothing};
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{SuiteRun, Verdict};

/// The suite label.
pub const RECLAIM: &str = "RECLAIM";

/// How many probes [`assert_reclaim`] runs.
pub const RECLAIM_PROBES: usize = RECLAIM_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const RECLAIM_PROBE_TABLE: &[&str] = &[
    "a-created-directory-is-gone",
    "nested-content-goes-with-it",
    "a-link-inside-is-unlinked-not-followed",
    "a-missing-directory-is-success",
    "an-absent-working-directory-still-succeeds",
];

/// Attacks `reclaim` with absolute targets and a 60 s bound. Gate `reclaim`.
pub async fn assert_reclaim(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    let mut run = SuiteRun::start(
        RECLAIM,
        RECLAIM_PROBE_TABLE,
        Some(Capability::Reclaim),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    plant_nothing(subject, &paths).await?;
    let s = subject.sandbox();
    let p = &paths;
    let work = paths.work.as_str();

    run.probe("a-created-directory-is-gone", &[], async {
        subject
            .plant_file(&p.in_work("reclaim-me/note.txt"), b"a call's own file\n")
            .await?;
        subject
            .plant_file(&p.in_work("reclaim-bystander.txt"), b"not the call's\n")
            .await?;
        s.reclaim(&p.in_work("reclaim-me"), work, RECLAIM_TIMEOUT)
            .await?;
        expect_gone(subject, &p.in_work("reclaim-me"), "the reclaimed directory").await?;
        expect_present(
            subject,
            &p.in_work("reclaim-bystander.txt"),
            "the bystander",
        )
        .await
    })
    .await;

    run.probe("nested-content-goes-with-it", &[], async {
        let leaf = p.in_work("reclaim-tree/deep/nested/leaf.txt");
        subject.plant_file(&leaf, b"deep in the call\n").await?;
        subject
            .plant_file(&p.in_work("reclaim-tree/top.txt"), b"top of the call\n")
            .await?;
        s.reclaim(&p.in_work("reclaim-tree"), work, RECLAIM_TIMEOUT)
            .await?;
        expect_gone(subject, &leaf, "the nested leaf").await?;
        expect_gone(subject, &p.in_work("reclaim-tree"), "the reclaimed tree").await
    })
    .await;

    run.probe("a-link-inside-is-unlinked-not-followed", &[], async {
        let target = p.in_outside("reclaim-target.txt");
        subject.plant_file(&target, b"outside the call\n").await?;
        subject
            .plant_file(&p.in_work("reclaim-linked/leaf.txt"), b"in the call\n")
            .await?;
        subject
            .plant_symlink(&p.in_work("reclaim-linked/inside-link"), &target)
            .await?;
        s.reclaim(&p.in_work("reclaim-linked"), work, RECLAIM_TIMEOUT)
            .await?;
        expect_gone(
            subject,
            &p.in_work("reclaim-linked"),
            "the reclaimed directory",
        )
        .await?;
        expect_present(subject, &target, "the interior link's target").await
    })
    .await;

    run.probe("a-missing-directory-is-success", &[], async {
        subject
            .plant_file(&p.in_work("reclaim-twice/note.txt"), b"reclaimed twice\n")
            .await?;
        let dir = p.in_work("reclaim-twice");
        s.reclaim(&dir, work, RECLAIM_TIMEOUT).await?;
        s.reclaim(&dir, work, RECLAIM_TIMEOUT).await?;
        Ok(())
    })
    .await;

    run.probe("an-absent-working-directory-still-succeeds", &[], async {
        s.reclaim(
            &p.in_work("absent-work/call-a1b2c3"),
            &p.in_work("absent-work"),
            RECLAIM_TIMEOUT,
        )
        .await?;
        Ok(())
    })
    .await;

    run.finish()
}
