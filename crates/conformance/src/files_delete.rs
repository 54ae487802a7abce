//! FILES_DELETE (docs/conformance.md#the-suites): removal takes exactly its target, never through or past a link.

use sandbox_core::Capability;

use crate::error::ConformanceError;
use crate::paths::ConformancePaths;
use crate::probe_kit::{expect_gone, expect_present, run_argv, status};
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, refused_with, Refusal, SuiteRun, Verdict};

/// The suite label.
pub const FILES_DELETE: &str = "FILES_DELETE";

/// How many probes [`assert_files_delete`] runs.
pub const FILES_DELETE_PROBES: usize = FILES_DELETE_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const FILES_DELETE_PROBE_TABLE: &[&str] = &[
    "a-removal-removes",
    "a-missing-path-is-success",
    "a-link-is-removed-never-followed",
    "a-path-through-a-linked-parent-is-refused",
    "a-directory-needs-recursive",
    "an-empty-directory-needs-recursive",
    "recursive-removes-the-tree",
    "a-link-inside-a-recursive-removal-is-unlinked-not-followed",
    "the-working-directory-is-refused",
    "a-path-outside-is-refused",
];

/// Attacks `remove`. Gate `files_delete`; each probe plants its own fixtures.
pub async fn assert_files_delete(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    files_delete(subject, Verdict::Aggregate).await
}

/// Runs the same ten probes with no gate and no verdict: a measurement of a removal mechanism not yet
/// declared. The report says what happened; it never fails.
pub async fn measure_files_delete(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    files_delete(subject, Verdict::MeasureOnly).await
}

async fn files_delete(
    subject: &dyn ConformanceSubject,
    verdict: Verdict,
) -> Result<ConformanceReport, ConformanceError> {
    let gate = (verdict != Verdict::MeasureOnly).then_some(Capability::FilesDelete);
    let mut run = SuiteRun::start(
        FILES_DELETE,
        FILES_DELETE_PROBE_TABLE,
        gate,
        subject.capabilities(),
        verdict,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    let s = subject.sandbox();
    let p = &paths;
    let work = paths.work.as_str();

    run.probe("a-removal-removes", &[], async {
        s.write_file("doomed.txt", b"to be removed\n", work).await?;
        s.write_file("bystander.txt", b"not the target\n", work)
            .await?;
        s.remove("doomed.txt", work, false).await?;
        expect_gone(subject, &p.in_work("doomed.txt"), "the removed file").await?;
        expect_present(subject, &p.in_work("bystander.txt"), "the bystander").await
    })
    .await;

    run.probe("a-missing-path-is-success", &[], async {
        s.write_file("was-here.txt", b"gone after the first call\n", work)
            .await?;
        s.remove("was-here.txt", work, false).await?;
        s.remove("was-here.txt", work, false).await?;
        Ok(())
    })
    .await;

    run.probe("a-link-is-removed-never-followed", &[], async {
        let target = p.in_outside("target.txt");
        subject.plant_file(&target, b"outside\n").await?;
        for (name, recursive) in [("link-out", false), ("link-out-recursive", true)] {
            subject.plant_symlink(&p.in_work(name), &target).await?;
            s.remove(name, work, recursive).await?;
            let code = status(subject, &["test", "-e", name], work).await?;
            ensure!(
                code != 0,
                "{name:?} still resolves after its removal (recursive {recursive})"
            );
            let code = status(subject, &["test", "-f", &p.beyond("target.txt")], work).await?;
            ensure!(
                code == 0,
                "removing {name:?} (recursive {recursive}) took the link's target"
            );
        }
        Ok(())
    })
    .await;

    run.probe("a-path-through-a-linked-parent-is-refused", &[], async {
        let target = p.in_outside("target.txt");
        subject.plant_file(&target, b"outside\n").await?;
        subject
            .plant_symlink(&p.linked_directory, &p.outside)
            .await?;
        for recursive in [false, true] {
            refused_with(
                Refusal::Confinement,
                s.remove("link-dir/target.txt", work, recursive),
            )
            .await?;
        }
        expect_present(subject, &target, "the target behind the link").await
    })
    .await;

    run.probe("a-directory-needs-recursive", &[], async {
        let keeps = p.in_work("dir/keeps.txt");
        subject.plant_file(&keeps, b"a directory\n").await?;
        refused_with(Refusal::AnyIo, s.remove("dir", work, false)).await?;
        expect_present(subject, &keeps, "the file in the directory").await
    })
    .await;

    run.probe("an-empty-directory-needs-recursive", &[], async {
        let code = status(subject, &["mkdir", "-p", "empty"], work).await?;
        ensure!(code == 0, "`mkdir -p empty` exited {code}");
        refused_with(Refusal::AnyIo, s.remove("empty", work, false)).await?;
        expect_present(subject, &p.in_work("empty"), "the empty directory").await?;
        s.remove("empty", work, true).await?;
        expect_gone(
            subject,
            &p.in_work("empty"),
            "the recursively removed directory",
        )
        .await
    })
    .await;

    run.probe("recursive-removes-the-tree", &[], async {
        subject
            .plant_file(&p.in_work("tree/leaf.txt"), b"in the tree\n")
            .await?;
        subject
            .plant_file(&p.in_work("next-to-tree.txt"), b"not in the tree\n")
            .await?;
        s.remove("tree", work, true).await?;
        expect_gone(subject, &p.in_work("tree/leaf.txt"), "the leaf").await?;
        expect_gone(subject, &p.in_work("tree"), "the tree").await?;
        expect_present(subject, &p.in_work("next-to-tree.txt"), "the sibling").await
    })
    .await;

    run.probe(
        "a-link-inside-a-recursive-removal-is-unlinked-not-followed",
        &[],
        async {
            let target = p.in_outside("interior-target.txt");
            subject.plant_file(&target, b"outside the tree\n").await?;
            subject
                .plant_file(&p.in_work("linked-tree/leaf.txt"), b"in the tree\n")
                .await?;
            subject
                .plant_symlink(&p.in_work("linked-tree/inside-link"), &target)
                .await?;
            s.remove("linked-tree", work, true).await?;
            expect_gone(subject, &p.in_work("linked-tree"), "the tree").await?;
            let out = run_argv(subject, &["test", "-f", &target], "/").await?;
            ensure!(
                out.exit_code == 0,
                "the interior link's target {target:?} is no longer a regular file"
            );
            Ok(())
        },
    )
    .await;

    run.probe("the-working-directory-is-refused", &[], async {
        s.write_file("ground.txt", b"still standing\n", work)
            .await?;
        for recursive in [false, true] {
            refused_with(Refusal::Confinement, s.remove(".", work, recursive)).await?;
        }
        expect_present(subject, &p.in_work("ground.txt"), "ground.txt").await
    })
    .await;

    run.probe("a-path-outside-is-refused", &[], async {
        let target = p.in_outside("target.txt");
        subject.plant_file(&target, b"outside\n").await?;
        for recursive in [false, true] {
            refused_with(
                Refusal::Confinement,
                s.remove(&p.beyond("target.txt"), work, recursive),
            )
            .await?;
        }
        expect_present(subject, &target, "the target outside").await
    })
    .await;

    run.finish()
}
