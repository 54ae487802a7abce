//! FILES_IN (docs/conformance.md#the-suites): writes land where asked, byte-exact, and never through a link or outside.

use sandbox_core::Capability;

use crate::error::ConformanceError;
use crate::fixtures::every_byte_and_utf8_edges;
use crate::paths::ConformancePaths;
use crate::probe_kit::{
    expect_absent_by_test, expect_present, expect_stdout, plant_nothing, run_argv, status,
};
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, refused_with, Refusal, SuiteRun, Verdict};

/// The suite label.
pub const FILES_IN: &str = "FILES_IN";

/// How many probes [`assert_files_in`] runs.
pub const FILES_IN_PROBES: usize = FILES_IN_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const FILES_IN_PROBE_TABLE: &[&str] = &[
    "a-write-lands-and-reads-back",
    "bytes-survive-the-round-trip",
    "str-content-is-utf8",
    "a-second-write-replaces",
    "parents-are-created",
    "a-path-outside-is-refused",
    "a-path-through-a-linked-parent-is-refused",
    "a-linked-destination-is-refused-not-followed",
    "the-working-directory-is-refused",
    "a-backslash-is-refused",
    "a-linked-working-directory",
    "a-linked-ancestor-of-the-working-directory",
];

/// Attacks the write side of the file plane. Gate `files_in`; each probe plants its own fixtures and
/// verifies through guest commands in the working directory.
pub async fn assert_files_in(
    subject: &dyn ConformanceSubject,
) -> Result<ConformanceReport, ConformanceError> {
    let mut run = SuiteRun::start(
        FILES_IN,
        FILES_IN_PROBE_TABLE,
        Some(Capability::FilesIn),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::under(subject.working_directory());
    let s = subject.sandbox();
    let p = &paths;
    let work = paths.work.as_str();
    let outside = paths.outside.as_str();

    run.probe("a-write-lands-and-reads-back", &[], async {
        s.write_file(&p.in_work("real/written.txt"), b"written", work)
            .await?;
        let code = status(subject, &["test", "-f", "real/written.txt"], work).await?;
        ensure!(code == 0, "`test -f real/written.txt` exited {code}");
        expect_stdout(subject, &["cat", "real/written.txt"], work, b"written").await
    })
    .await;

    run.probe("bytes-survive-the-round-trip", &[], async {
        let bytes = every_byte_and_utf8_edges();
        s.write_file(&p.in_work("binary.bin"), &bytes, work).await?;
        expect_stdout(subject, &["cat", "binary.bin"], work, &bytes).await
    })
    .await;

    run.probe("str-content-is-utf8", &[], async {
        s.write_file(&p.in_work("text.txt"), "naïve".as_bytes(), work)
            .await?;
        expect_stdout(subject, &["cat", "text.txt"], work, "naïve".as_bytes()).await
    })
    .await;

    run.probe("a-second-write-replaces", &[], async {
        let target = p.in_work("overwritten.txt");
        s.write_file(&target, b"first", work).await?;
        s.write_file(&target, b"second", work).await?;
        expect_stdout(subject, &["cat", "overwritten.txt"], work, b"second").await
    })
    .await;

    run.probe("parents-are-created", &[], async {
        s.write_file(&p.in_work("deep/er/est/leaf.txt"), b"deep", work)
            .await?;
        let code = status(subject, &["test", "-f", "deep/er/est/leaf.txt"], work).await?;
        ensure!(code == 0, "`test -f deep/er/est/leaf.txt` exited {code}");
        Ok(())
    })
    .await;

    run.probe("a-path-outside-is-refused", &[], async {
        refused_with(
            Refusal::Confinement,
            s.write_file(&p.beyond("planted.txt"), b"outside", work),
        )
        .await?;
        expect_absent_by_test(subject, "planted.txt", outside).await
    })
    .await;

    run.probe("a-path-through-a-linked-parent-is-refused", &[], async {
        plant_nothing(subject, p).await?;
        subject
            .plant_file(&p.in_outside("marker.txt"), b"marker")
            .await?;
        subject
            .plant_symlink(&p.linked_directory, &p.outside)
            .await?;
        refused_with(
            Refusal::Confinement,
            s.write_file("link-dir/landed.txt", b"landed", work),
        )
        .await?;
        expect_absent_by_test(subject, "landed.txt", outside).await
    })
    .await;

    run.probe("a-linked-destination-is-refused-not-followed", &[], async {
        plant_nothing(subject, p).await?;
        let target = p.in_outside("target.txt");
        subject.plant_file(&target, b"known").await?;
        subject.plant_symlink(&p.linked_file, &target).await?;
        refused_with(
            Refusal::Confinement,
            s.write_file("link-file", b"changed", work),
        )
        .await?;
        expect_stdout(subject, &["cat", &target], "/", b"known").await
    })
    .await;

    run.probe("the-working-directory-is-refused", &[], async {
        s.write_file("control.txt", b"control", work).await?;
        refused_with(Refusal::Confinement, s.write_file(".", b"no", work)).await?;
        expect_present(subject, &p.in_work("control.txt"), "the control file").await
    })
    .await;

    run.probe("a-backslash-is-refused", &[], async {
        refused_with(
            Refusal::Confinement,
            s.write_file("sub\\file.txt", b"no", work),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe("a-linked-working-directory", &[], async {
        plant_nothing(subject, p).await?;
        subject
            .plant_symlink(&p.linked_directory, &p.outside)
            .await?;
        refused_with(
            Refusal::Confinement,
            s.write_file("landed.txt", b"no", &p.linked_directory),
        )
        .await?;
        expect_absent_by_test(subject, "landed.txt", outside).await
    })
    .await;

    run.probe("a-linked-ancestor-of-the-working-directory", &[], async {
        plant_nothing(subject, p).await?;
        subject
            .plant_symlink(&p.linked_directory, &p.outside)
            .await?;
        refused_with(
            Refusal::Confinement,
            s.write_file("landed.txt", b"no", &p.under_linked_directory),
        )
        .await?;
        let landed = p.in_outside("sub/landed.txt");
        let out = run_argv(subject, &["test", "-e", &landed], "/").await?;
        ensure!(
            out.exit_code != 0,
            "{landed:?} exists: the refused write landed anyway"
        );
        Ok(())
    })
    .await;

    run.finish()
}
