//! FILES_OUT (docs/conformance.md#the-suites): stat, read and list must never leave the working directory or follow a link.

use sandbox_core::{Capability, EntryKind};

use crate::error::ConformanceError;
use crate::fixtures::{CONTROL_FILE_BYTES, PLANTED_SECRET_BYTES, READ_CAP};
use crate::paths::ConformancePaths;
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, refused_with, ProbeError, Refusal, SuiteRun, Verdict};

/// The suite label.
pub const FILES_OUT: &str = "FILES_OUT";

/// How many probes [`assert_files_out`] runs.
pub const FILES_OUT_PROBES: usize = FILES_OUT_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const FILES_OUT_PROBE_TABLE: &[&str] = &[
    "a-legitimate-read-still-works",
    "a-link-is-named-a-link",
    "a-link-is-never-read",
    "stat-through-a-linked-parent",
    "read-through-a-linked-parent",
    "a-linked-working-directory",
    "a-linked-ancestor-of-the-working-directory",
    "a-plain-parent-is-not-an-escape",
    "listing-a-linked-directory",
    "listing-through-a-linked-parent",
    "listing-under-a-linked-ancestor",
    "a-listing-names-its-links",
];

use Capability::{FilesList, FilesOut};

/// Plants the shared layout: the control file, a plain file, two secrets outside, and the two links.
async fn plant_layout(
    subject: &dyn ConformanceSubject,
    paths: &ConformancePaths,
) -> Result<(), ConformanceError> {
    subject
        .plant_file(&paths.inside, CONTROL_FILE_BYTES)
        .await?;
    subject
        .plant_file(&paths.plain, b"not a directory\n")
        .await?;
    subject
        .plant_file(&paths.secret, PLANTED_SECRET_BYTES)
        .await?;
    subject
        .plant_file(&paths.nested_secret, PLANTED_SECRET_BYTES)
        .await?;
    subject
        .plant_symlink(&paths.linked_directory, &paths.outside)
        .await?;
    subject
        .plant_symlink(&paths.linked_file, &paths.secret)
        .await
}

/// Attacks the read side of the file plane. Gate `files_out`; the listing probes also need
/// `files_list`. `flat_files` moves the control file to `work/inside.txt`; every attack still runs.
pub async fn assert_files_out(
    subject: &dyn ConformanceSubject,
    flat_files: bool,
) -> Result<ConformanceReport, ConformanceError> {
    let mut run = SuiteRun::start(
        FILES_OUT,
        FILES_OUT_PROBE_TABLE,
        Some(FilesOut),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let paths = ConformancePaths::with_layout(subject.working_directory(), flat_files);
    plant_layout(subject, &paths).await?;
    let s = subject.sandbox();
    let work = paths.work.as_str();
    let inside = paths.relative(&paths.inside);

    run.probe("a-legitimate-read-still-works", &[FilesOut], async {
        let entry = s
            .stat_file(&inside, work)
            .await?
            .ok_or_else(|| ProbeError::Assertion(format!("stat {inside:?} found nothing")))?;
        ensure!(
            entry.kind() == EntryKind::File,
            "{inside:?} is {}",
            entry.kind()
        );
        ensure!(
            entry.size_bytes() == Some(20),
            "{inside:?} has size {:?}",
            entry.size_bytes()
        );
        let bytes = s.read_file(&inside, work, READ_CAP).await?;
        ensure!(
            bytes == CONTROL_FILE_BYTES,
            "{inside:?} read as {:?}",
            String::from_utf8_lossy(&bytes)
        );
        Ok(())
    })
    .await;

    run.probe("a-link-is-named-a-link", &[FilesOut], async {
        let entry = s
            .stat_file("link-file", work)
            .await?
            .ok_or_else(|| ProbeError::Assertion("stat `link-file` found nothing".into()))?;
        ensure!(
            entry.kind() == EntryKind::Symlink,
            "`link-file` is {}",
            entry.kind()
        );
        ensure!(
            entry.size_bytes().is_none(),
            "`link-file` reports size {:?}",
            entry.size_bytes()
        );
        Ok(())
    })
    .await;

    run.probe("a-link-is-never-read", &[FilesOut], async {
        refused_with(Refusal::AnyIo, s.read_file("link-file", work, READ_CAP)).await?;
        Ok(())
    })
    .await;

    run.probe("stat-through-a-linked-parent", &[FilesOut], async {
        refused_with(
            Refusal::Confinement,
            s.stat_file("link-dir/secret.txt", work),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe("read-through-a-linked-parent", &[FilesOut], async {
        refused_with(
            Refusal::Confinement,
            s.read_file("link-dir/secret.txt", work, READ_CAP),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe("a-linked-working-directory", &[FilesOut], async {
        let wd = paths.linked_directory.as_str();
        refused_with(Refusal::Confinement, s.stat_file("secret.txt", wd)).await?;
        refused_with(
            Refusal::Confinement,
            s.read_file("secret.txt", wd, READ_CAP),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe(
        "a-linked-ancestor-of-the-working-directory",
        &[FilesOut],
        async {
            let wd = paths.under_linked_directory.as_str();
            refused_with(Refusal::Confinement, s.stat_file("leaf.txt", wd)).await?;
            refused_with(Refusal::Confinement, s.read_file("leaf.txt", wd, READ_CAP)).await?;
            Ok(())
        },
    )
    .await;

    run.probe("a-plain-parent-is-not-an-escape", &[FilesOut], async {
        refused_with(
            Refusal::NotADirectory,
            s.stat_file("plain.txt/deeper.txt", work),
        )
        .await?;
        Ok(())
    })
    .await;

    run.probe(
        "listing-a-linked-directory",
        &[FilesOut, FilesList],
        async {
            refused_with(Refusal::Confinement, s.list_dir("link-dir", work)).await?;
            Ok(())
        },
    )
    .await;

    run.probe(
        "listing-through-a-linked-parent",
        &[FilesOut, FilesList],
        async {
            refused_with(Refusal::Confinement, s.list_dir("link-dir/sub", work)).await?;
            Ok(())
        },
    )
    .await;

    run.probe(
        "listing-under-a-linked-ancestor",
        &[FilesOut, FilesList],
        async {
            refused_with(
                Refusal::Confinement,
                s.list_dir(".", &paths.under_linked_directory),
            )
            .await?;
            Ok(())
        },
    )
    .await;

    run.probe("a-listing-names-its-links", &[FilesOut, FilesList], async {
        let entries = s.list_dir(".", work).await?;
        ensure!(
            entries
                .iter()
                .any(|e| e.path() == "link-file" && e.kind() == EntryKind::Symlink),
            "the listing of `.` does not name `link-file` as a symlink: {entries:?}"
        );
        Ok(())
    })
    .await;

    run.finish()
}
