//! CONFINEMENT (docs/conformance.md#confinement): a call in a reused conversation sandbox leaves
//! nothing behind: no files outside its paths, no processes, no environment residue.
//!
//! The judge is an engine-side [`Fingerprint`] from [`HardeningHooks::fingerprint`], never the
//! guest's own utilities. A conversation sandbox is reused by design, so earlier calls may have left
//! their own (legitimate) changes: the baseline is the view just before the call, and only what the
//! call changes relative to it counts. A baseline is **pristine** when a call that does nothing
//! (`true`, and the environment listings) leaves the view exactly as it was: a view that drifts on
//! its own, or a plain exec that leaves a record behind, fails as "not pristine" before the call runs.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sandbox_core::{Capability, Command, ErrorKind, ExecEnv, ExecRequest, Sandbox};

use crate::error::ConformanceError;
use crate::fingerprint::Fingerprint;
use crate::fixtures::{CONTROL_FILE_BYTES, RECLAIM_TIMEOUT};
use crate::hardening::HardeningHooks;
use crate::probe_kit::run_argv;
use crate::report::ConformanceReport;
use crate::subject::ConformanceSubject;
use crate::suite_runner::{ensure, ProbeError, ProbeResult, SuiteRun, Verdict};

/// The suite label.
pub const CONFINEMENT: &str = "CONFINEMENT";

/// How many probes [`assert_confinement`] runs: one judgement of one call per run, whatever the
/// call ([`assert_call_leaves_nothing`] holds each run to the one probe it names).
pub const CONFINEMENT_PROBES: usize = CONFINEMENT_PROBE_TABLE.len();

/// The probe [`assert_confinement`] runs.
const CONFINEMENT_PROBE_TABLE: [&str; 1] = ["a-call-leaves-nothing-behind"];

/// The call's own directory, under the subject's working directory.
const CALL_DIRECTORY: &str = "confinement-call";

/// What the standard call's exec runs in its call directory (under a 2 s bound it outlives): it
/// exports a variable, writes files, and starts background programs of every kind the timeout's kill
/// must end (a child, a double-forked daemon in its own session, a `nohup` job).
pub const CONFINEMENT_CALL_SCRIPT: &str = "export MAF_CONFINEMENT_EXPORTED=1; printf out >output.txt; mkdir -p nested/deeper; printf deep >nested/deeper/file.txt; sleep 3181 & (setsid sleep 3182 &); nohup sleep 3183 >/dev/null 2>&1 & exec sleep 3184";

/// The future a call under judgement returns.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ConformanceError>> + Send + 'a>>;

/// Runs the standard call of a conversation turn in `call_directory` (absolute, under `work`) and its
/// cleanup, through the public traits only: `write_file` of an input, an exec of
/// [`CONFINEMENT_CALL_SCRIPT`] with a variable of its own that the 2 s bound ends (the backend's
/// timeout kill), `remove` of the input, then `reclaim` of the directory.
///
/// # Errors
///
/// A call that fails, or an exec that ends before its bound instead of being killed.
///
/// # Cancel safety
///
/// Dropping it stops between calls; what it made stays until the sandbox is disposed of.
pub async fn confinement_call(
    sandbox: &dyn Sandbox,
    work: &str,
    call_directory: &str,
) -> Result<(), ConformanceError> {
    let input = format!("{call_directory}/input.txt");
    sandbox
        .write_file(&input, CONTROL_FILE_BYTES, work)
        .await
        .map_err(|e| ConformanceError::sandbox("the call's write_file", e))?;
    let request = ExecRequest::new(Command::argv(["sh", "-c", CONFINEMENT_CALL_SCRIPT]))
        .working_directory(call_directory)
        .timeout(Duration::from_secs(2))
        .env(ExecEnv::default().set("MAF_CONFINEMENT_CALL", "this call's own value"));
    match sandbox.exec(request).await {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Err(e) => return Err(ConformanceError::sandbox("the call's exec", e)),
        Ok(output) => {
            return Err(ConformanceError::harness(
                CONFINEMENT,
                format!(
                    "the call's exec exited {} instead of outliving its 2 s bound",
                    output.exit_code
                ),
            ))
        }
    }
    sandbox
        .remove(&input, work, false)
        .await
        .map_err(|e| ConformanceError::sandbox("the call's remove", e))?;
    sandbox
        .reclaim(call_directory, work, RECLAIM_TIMEOUT)
        .await
        .map_err(|e| ConformanceError::sandbox("the call's reclaim", e))
}

/// Runs the CONFINEMENT probe `a-call-leaves-nothing-behind` with [`confinement_call`], on a
/// sandbox of its own (the baseline must not see other suites' fixtures). Gate `exec`; the probe needs
/// `files_in`, `files_delete` and `reclaim`, and is skipped when `hooks` gives no fingerprint.
pub async fn assert_confinement(
    subject: &dyn ConformanceSubject,
    hooks: &dyn HardeningHooks,
) -> Result<ConformanceReport, ConformanceError> {
    assert_call_leaves_nothing(
        subject,
        hooks,
        CONFINEMENT_PROBE_TABLE[0],
        |sandbox, work, call_directory| Box::pin(confinement_call(sandbox, work, call_directory)),
    )
    .await
}

/// The CONFINEMENT judgement of any call: after an earlier call of the conversation (so the sandbox is
/// a reused one), it takes the environment a plain exec sees and the baseline fingerprint; checks the
/// baseline is complete and pristine (a `true` exec and a second environment listing change nothing);
/// runs `call(sandbox, work, call_directory)`; then fails on any difference from the baseline in
/// changed paths, running programs or the environment a later exec sees.
///
/// A probe of this suite (`probe` names it in the report). Gate `exec`; needs `files_in`,
/// `files_delete` and `reclaim`.
pub async fn assert_call_leaves_nothing<C>(
    subject: &dyn ConformanceSubject,
    hooks: &dyn HardeningHooks,
    probe: &'static str,
    call: C,
) -> Result<ConformanceReport, ConformanceError>
where
    C: for<'a> FnOnce(&'a dyn Sandbox, &'a str, &'a str) -> CallFuture<'a> + Send,
{
    use Capability::{Exec, FilesDelete, FilesIn, Reclaim};
    let mut suite = SuiteRun::start(
        CONFINEMENT,
        &[probe],
        Some(Exec),
        subject.capabilities(),
        Verdict::Aggregate,
    )?;
    suite
        .probe(probe, &[FilesIn, FilesDelete, Reclaim], async {
            leaves_nothing(subject, hooks, call).await
        })
        .await;
    suite.finish()
}

/// Shows that the CONFINEMENT judgement can fail, and for the right reason: judges a call that
/// runs `sh -c script` in its working directory (exit 0 required) and requires the judgement to
/// fail with exactly one failure naming `residue`. For a backend's own live tests, each with the
/// residues its sandboxes can hold.
///
/// # Errors
/// What went wrong, as text: the call passed the judgement, failed more than once, or its failure
/// does not name `residue`; or the call itself did not exit 0.
pub async fn expect_residue_caught(
    subject: &dyn ConformanceSubject,
    hooks: &dyn HardeningHooks,
    script: &str,
    residue: &str,
) -> Result<(), String> {
    let script = script.to_owned();
    let result = assert_call_leaves_nothing(subject, hooks, "leaky", |sandbox, work, _| {
        Box::pin(async move {
            let request =
                ExecRequest::new(Command::argv(["sh", "-c", &script])).working_directory(work);
            let output = sandbox
                .exec(request)
                .await
                .map_err(|e| ConformanceError::sandbox("the leaky call", e))?;
            if output.exit_code != 0 {
                return Err(ConformanceError::harness(
                    CONFINEMENT,
                    format!(
                        "the leaky call exited {}: {}",
                        output.exit_code,
                        output.stderr_text()
                    ),
                ));
            }
            Ok(())
        })
    })
    .await;
    let error = match result {
        Err(error) => error,
        Ok(report) => return Err(format!("a call leaving {residue:?} passed:\n{report}")),
    };
    let Some(report) = error.report() else {
        return Err(format!("the judgement failed without a report: {error}"));
    };
    if report.failed() != 1 {
        return Err(format!("expected one failure:\n{report}"));
    }
    let why = report
        .failures()
        .next()
        .map(ToString::to_string)
        .unwrap_or_default();
    if !why.contains(residue) || !why.contains("the call left residue (1)") {
        return Err(format!("expected the residue {residue:?} alone in: {why}"));
    }
    Ok(())
}

async fn leaves_nothing<C>(
    subject: &dyn ConformanceSubject,
    hooks: &dyn HardeningHooks,
    call: C,
) -> ProbeResult
where
    C: for<'a> FnOnce(&'a dyn Sandbox, &'a str, &'a str) -> CallFuture<'a> + Send,
{
    let sandbox = subject.sandbox();
    let work = subject.working_directory().trim_end_matches('/').to_owned();
    let work = if work.is_empty() {
        "/".to_owned()
    } else {
        work
    };
    let call_directory = format!("{}/{CALL_DIRECTORY}", work.trim_end_matches('/'));

    let first = fingerprint(hooks, sandbox, "of the fresh sandbox").await?;
    earlier_call(subject, &work).await?;
    ensure!(
        !subject.exists(&call_directory).await?,
        "the call's directory {call_directory} exists before the call"
    );

    let environment = environment_listing(subject, &work).await?;
    let baseline = fingerprint(hooks, sandbox, "before the call").await?;
    ensure!(
        first.running_programs == baseline.running_programs,
        "the baseline is not pristine: an earlier call's programs still run: {}",
        first.differences(&baseline).join("; ")
    );
    let noop = run_argv(subject, &["true"], &work).await?;
    ensure!(noop.exit_code == 0, "`true` exited {}", noop.exit_code);
    let again = environment_listing(subject, &work).await?;
    let control = fingerprint(hooks, sandbox, "after a call that does nothing").await?;
    let mut drift = baseline.differences(&control);
    if again != environment {
        drift.push(environment_change(&environment, &again));
    }
    ensure!(
        drift.is_empty(),
        "the baseline is not pristine: with no call in between, the view changed: {}",
        drift.join("; ")
    );

    call(sandbox, &work, &call_directory)
        .await
        .map_err(ProbeError::Setup)?;

    let after = fingerprint(hooks, sandbox, "after the call").await?;
    let later = environment_listing(subject, &work).await?;
    let mut residue = baseline.differences(&after);
    if later != environment {
        residue.push(environment_change(&environment, &later));
    }
    ensure!(
        residue.is_empty(),
        "the call left residue ({}): {}",
        residue.len(),
        residue.join("; ")
    );
    Ok(())
}

/// An earlier call of the conversation, cleaned up after itself: a file in its own directory, an exec
/// there, and the directory reclaimed.
async fn earlier_call(subject: &dyn ConformanceSubject, work: &str) -> ProbeResult {
    let sandbox = subject.sandbox();
    let directory = format!("{}/confinement-earlier-call", work.trim_end_matches('/'));
    sandbox
        .write_file(&format!("{directory}/note.txt"), CONTROL_FILE_BYTES, work)
        .await?;
    let out = run_argv(subject, &["cat", "note.txt"], &directory).await?;
    ensure!(
        out.exit_code == 0 && out.stdout == CONTROL_FILE_BYTES,
        "the earlier call's `cat` exited {} with {:?}",
        out.exit_code,
        out.stdout_text()
    );
    sandbox.reclaim(&directory, work, RECLAIM_TIMEOUT).await?;
    Ok(())
}

/// The environment a plain exec sees, one sorted line per variable (`env -0`, so values may hold
/// newlines).
async fn environment_listing(
    subject: &dyn ConformanceSubject,
    work: &str,
) -> Result<Vec<String>, ProbeError> {
    let out = run_argv(subject, &["env", "-0"], work).await?;
    if out.exit_code != 0 {
        return Err(ProbeError::Harness(format!(
            "`env -0` exited {} (stderr {:?})",
            out.exit_code,
            out.stderr_text()
        )));
    }
    let mut lines: Vec<String> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    lines.sort();
    Ok(lines)
}

fn environment_change(before: &[String], after: &[String]) -> String {
    let added: Vec<&String> = after.iter().filter(|v| !before.contains(v)).collect();
    let gone: Vec<&String> = before.iter().filter(|v| !after.contains(v)).collect();
    format!("a later exec's environment gained {added:?} and lost {gone:?}")
}

/// Takes a fingerprint: `None` from the hooks skips the probe; an incomplete view fails it.
async fn fingerprint(
    hooks: &dyn HardeningHooks,
    sandbox: &dyn Sandbox,
    when: &str,
) -> Result<Fingerprint, ProbeError> {
    let Some(view) = hooks.fingerprint(sandbox).await? else {
        return Err(ProbeError::Unsupported(
            "the backend's test module takes no engine-side fingerprint".to_owned(),
        ));
    };
    ensure!(
        view.is_complete(),
        "the fingerprint {when} is incomplete, so it proves nothing: {}",
        view.unseen.join("; ")
    );
    Ok(view)
}
