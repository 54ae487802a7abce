//! CALL_SCOPE (docs/conformance.md#the-suites): two calls of one conversation never share a sandbox's contents.

use std::future::Future;

use sandbox_core::{Capability, DisposalFailure};

use crate::error::ConformanceError;
use crate::fixtures::{CONTROL_FILE_BYTES, PLANTED_SECRET_BYTES, READ_CAP};
use crate::paths::ConformancePaths;
use crate::probe_kit::plant_nothing;
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The suite label.
pub const CALL_SCOPE: &str = "CALL_SCOPE";

/// How many probes [`assert_call_scope`] runs.
pub const CALL_SCOPE_PROBES: usize = CALL_SCOPE_PROBE_TABLE.len();

/// The probes of this suite, in the order they run (the one place they are counted).
const CALL_SCOPE_PROBE_TABLE: &[&str] = &[
    "arrives-without-the-other-calls-data",
    "the-other-calls-file-is-not-here",
    "the-same-name-holds-this-calls-bytes",
    "the-listing-holds-only-this-calls-files",
    "disposing-this-call-leaves-the-other",
];

/// Asserts call isolation between `subject` and a second call's sandbox.
///
/// `acquire_another` acquires the same key with another `call_id` and wraps it as a subject; it is called
/// only after the subject holds `planted-before-the-other-call-existed.txt`, so a backend that clones a
/// warm sandbox is caught. `dispose_this_call` disposes the subject's sandbox (last probe);
/// `dispose_the_other` always runs at the end, also when the acquire or a precondition failed.
pub async fn assert_call_scope<S, A, AFut, D, DFut, O, OFut>(
    subject: &dyn ConformanceSubject,
    acquire_another: A,
    dispose_this_call: D,
    dispose_the_other: O,
) -> Result<ConformanceReport, ConformanceError>
where
    S: ConformanceSubject,
    A: FnOnce() -> AFut,
    AFut: Future<Output = Result<S, ConformanceError>>,
    D: FnOnce() -> DFut,
    DFut: Future<Output = Option<DisposalFailure>>,
    O: FnOnce() -> OFut,
    OFut: Future<Output = Option<DisposalFailure>>,
{
    let paths = ConformancePaths::under(subject.working_directory());
    let prepared = async {
        plant_nothing(subject, &paths).await?;
        subject
            .plant_file(
                &paths.in_work("planted-before-the-other-call-existed.txt"),
                PLANTED_SECRET_BYTES,
            )
            .await?;
        let other = acquire_another().await?;
        if ConformancePaths::under(other.working_directory()).work != paths.work {
            return Err(ConformanceError::harness(
                CALL_SCOPE,
                format!(
                    "the two calls work in different directories ({:?} and {:?})",
                    subject.working_directory(),
                    other.working_directory()
                ),
            ));
        }
        Ok(other)
    }
    .await;
    let outcome = match prepared {
        Ok(other) => call_scope_probes(subject, &other, &paths, dispose_this_call).await,
        Err(e) => Err(e),
    };
    if let Some(failure) = dispose_the_other().await {
        tracing::warn!(%failure, "disposing of the other call's sandbox did not land");
    }
    outcome
}

async fn call_scope_probes<D, DFut>(
    subject: &dyn ConformanceSubject,
    other: &dyn ConformanceSubject,
    paths: &ConformancePaths,
    dispose_this_call: D,
) -> Result<ConformanceReport, ConformanceError>
where
    D: FnOnce() -> DFut,
    DFut: Future<Output = Option<DisposalFailure>>,
{
    let mut run = SuiteRun::start(
        CALL_SCOPE,
        CALL_SCOPE_PROBE_TABLE,
        None,
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    let p = paths;
    let work = paths.work.as_str();

    run.probe("arrives-without-the-other-calls-data", &[], async {
        let planted = p.in_work("planted-before-the-other-call-existed.txt");
        ensure!(
            subject.exists(&planted).await?,
            "the subject lost its own planted file"
        );
        ensure!(
            !other.exists(&planted).await?,
            "the other call's sandbox arrived holding this call's file (a cloned sandbox)"
        );
        Ok(())
    })
    .await;

    run.probe("the-other-calls-file-is-not-here", &[], async {
        let planted = p.in_work("one-call-planted-this.txt");
        other
            .plant_file(&planted, b"one call planted this\n")
            .await?;
        ensure!(
            other.exists(&planted).await?,
            "the other call does not see its own file"
        );
        ensure!(
            !subject.exists(&planted).await?,
            "this call sees the other call's file"
        );
        Ok(())
    })
    .await;

    run.probe(
        "the-same-name-holds-this-calls-bytes",
        &[Capability::FilesOut],
        async {
            let shared = p.in_work("both-calls-wrote-this.txt");
            subject.plant_file(&shared, CONTROL_FILE_BYTES).await?;
            other.plant_file(&shared, PLANTED_SECRET_BYTES).await?;
            let bytes = subject
                .sandbox()
                .read_file("both-calls-wrote-this.txt", work, READ_CAP)
                .await?;
            ensure!(
                bytes == CONTROL_FILE_BYTES,
                "this call read {:?} from its own file",
                String::from_utf8_lossy(&bytes)
            );
            Ok(())
        },
    )
    .await;

    run.probe(
        "the-listing-holds-only-this-calls-files",
        &[Capability::FilesList],
        async {
            let name = "only-the-other-call-planted-this.txt";
            other
                .plant_file(&p.in_work(name), b"the other call's\n")
                .await?;
            let entries = subject.sandbox().list_dir(".", work).await?;
            ensure!(
                !entries
                    .iter()
                    .any(|e| e.path().rsplit('/').next() == Some(name)),
                "this call's listing names the other call's file"
            );
            Ok(())
        },
    )
    .await;

    run.probe("disposing-this-call-leaves-the-other", &[], async {
        let kept = p.in_work("the-other-call-is-still-using-this.txt");
        other.plant_file(&kept, b"still in use\n").await?;
        if let Some(failure) = dispose_this_call().await {
            return Err(ProbeError::Assertion(format!(
                "disposing of this call's sandbox did not land: {failure}"
            )));
        }
        ensure!(
            other.exists(&kept).await?,
            "disposing of this call took the other call's file"
        );
        Ok(())
    })
    .await;

    run.finish()
}
