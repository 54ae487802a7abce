//! One call that runs every file and exec suite against a backend, in the order the spec requires.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    BackendDeclarations, Capability, DisposeSelector, IsolationScope, Sandbox, SandboxBackend,
    SandboxKey, SandboxSpec, SandboxSpecBuilder,
};

use crate::call_scope::{assert_call_scope, CALL_SCOPE, CALL_SCOPE_PROBES};
use crate::confinement::{assert_confinement, CONFINEMENT, CONFINEMENT_PROBES};
use crate::error::ConformanceError;
use crate::exec::{assert_exec, EXEC, EXEC_PROBES};
use crate::files_delete::{assert_files_delete, FILES_DELETE, FILES_DELETE_PROBES};
use crate::files_in::{assert_files_in, FILES_IN, FILES_IN_PROBES};
use crate::files_out::{assert_files_out, FILES_OUT, FILES_OUT_PROBES};
use crate::fixtures::EXPLICIT_STORAGE_BASE;
use crate::hardening::{
    assert_a_lost_record_retires, assert_concurrent_acquires_yield_one,
    assert_engine_failure_is_not_an_exit_code, assert_hardening, assert_network_closed_by_content,
    require_closed_egress, HardeningHooks, HARDENING, HARDENING_OWN_SANDBOX_PROBES,
    HARDENING_SHARED_PROBES, RECORD_REMOVING_CASES,
};
use crate::lifecycle::{
    assert_fresh_acquire, assert_instance_disposal, instance_is_listed, FRESH_ACQUIRE,
    FRESH_ACQUIRE_PROBES, INSTANCE_DISPOSAL, INSTANCE_DISPOSAL_PROBES,
};
use crate::reach::{assert_reach, REACH, REACH_PROBES};
use crate::reclaim::{assert_reclaim, RECLAIM, RECLAIM_PROBES};
use crate::report::{ConformanceReport, ProbeOutcome, ProbeReport};
use crate::storage_base::{assert_storage_base, STORAGE_BASE, STORAGE_BASE_STEPS};
use crate::subject::PosixGuestSubject;

/// The suite label of the disposals that end a run.
pub const CLEANUP_SUITE: &str = "CLEANUP";

/// How [`run_backend_suites`] runs.
#[derive(Clone, Default)]
pub struct RunOptions<'a> {
    /// The backend's exec cleanup allowance (0..=30 s; docker and sbx: their `exec_cleanup_timeout`).
    pub exec_cleanup_allowance: Duration,
    /// Run FILES_OUT with the flat layout (`work/inside.txt`).
    pub flat_files: bool,
    /// The engine-side hooks; when given, the HARDENING probes and CONFINEMENT run too (the image
    /// needs `curl`).
    pub hardening: Option<&'a dyn HardeningHooks>,
    /// Run only the reduced set a minimal image supports (EXEC, FILES_IN, FILES_OUT with its listing
    /// probes, FILES_DELETE, RECLAIM): no storage-base, lifecycle, REACH or CALL_SCOPE suites.
    pub reduced: bool,
    /// Leave CONFINEMENT out of a run with hooks: its observer joins the sandbox's PID namespace
    /// from a container beside it to read the sandbox's root, which a user-space kernel (gVisor)
    /// keeps to itself.
    pub without_confinement: bool,
}

impl RunOptions<'_> {
    /// How many probes [`run_backend_suites`] reports with these options against a backend with
    /// `declarations`, summed from the suites' exported counts (every probe is reported, run or
    /// skipped). A live test asserts this many passed, so a probe that disappears fails the run.
    pub fn expected_probes(&self, declarations: &BackendDeclarations) -> usize {
        let shared =
            FILES_OUT_PROBES + FILES_IN_PROBES + FILES_DELETE_PROBES + RECLAIM_PROBES + EXEC_PROBES;
        let full = if self.reduced {
            0
        } else {
            // Two storage bases, fresh acquire, instance disposal, REACH on the shared sandbox.
            2 * STORAGE_BASE_STEPS
                + FRESH_ACQUIRE_PROBES
                + INSTANCE_DISPOSAL_PROBES
                + REACH_PROBES
                + if declarations.serves_scope(IsolationScope::Call) {
                    CALL_SCOPE_PROBES
                } else {
                    0
                }
        };
        let hardening = if self.hardening.is_some() {
            HARDENING_SHARED_PROBES
                + HARDENING_OWN_SANDBOX_PROBES
                + if self.without_confinement {
                    0
                } else {
                    CONFINEMENT_PROBES
                }
        } else {
            0
        };
        shared + full + hardening
    }
}

impl std::fmt::Debug for RunOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("exec_cleanup_allowance", &self.exec_cleanup_allowance)
            .field("flat_files", &self.flat_files)
            .field("hardening", &self.hardening.is_some())
            .field("reduced", &self.reduced)
            .field("without_confinement", &self.without_confinement)
            .finish()
    }
}

/// Folds a suite's result into the combined report: a failed suite contributes its report; a suite that
/// could not run (gate, harness, setup) contributes one failed entry saying why.
fn fold_into(
    report: &mut ConformanceReport,
    suite: &str,
    result: Result<ConformanceReport, ConformanceError>,
) {
    match result {
        Ok(r) => report.merge(r),
        Err(ConformanceError::ConformanceFailure { report: r, .. }) => report.merge(r),
        Err(e) => report.record(ProbeReport {
            suite: suite.to_owned(),
            probe: "(suite did not run)".to_owned(),
            outcome: ProbeOutcome::Failed { why: e.to_string() },
            elapsed: Duration::ZERO,
        }),
    }
}

struct Run<'r> {
    backend: &'r dyn SandboxBackend,
    capabilities: BTreeSet<Capability>,
    report: ConformanceReport,
    used_keys: Vec<(String, SandboxKey)>,
    allowance: Duration,
}

impl Run<'_> {
    async fn acquire(
        &mut self,
        purpose: &str,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Sandbox>, ConformanceError> {
        self.used_keys.push((purpose.to_owned(), key.clone()));
        self.backend
            .acquire(key, spec)
            .await
            .map_err(|e| ConformanceError::sandbox(format!("acquiring the {purpose} sandbox"), e))
    }

    fn subject(&self, sandbox: Arc<dyn Sandbox>) -> Result<PosixGuestSubject, ConformanceError> {
        Ok(
            PosixGuestSubject::in_storage_base(sandbox, self.capabilities.clone())?
                .with_exec_cleanup_allowance(self.allowance),
        )
    }

    /// Disposes of every sandbox acquired so far, now that its suites are done, so a run holds
    /// only what its current suite needs (two sandboxes at most, for instance disposal); a
    /// disposal that does not land is a failed `CLEANUP` entry.
    async fn release(&mut self) {
        for (purpose, key) in std::mem::take(&mut self.used_keys) {
            if let Some(failure) = self.backend.dispose(&key, DisposeSelector::all()).await {
                self.report.record(ProbeReport {
                    suite: CLEANUP_SUITE.to_owned(),
                    probe: format!("dispose-{purpose}"),
                    outcome: ProbeOutcome::Failed {
                        why: failure.to_string(),
                    },
                    elapsed: Duration::ZERO,
                });
            }
        }
    }

    async fn suite<F>(&mut self, suite: &str, result: F)
    where
        F: Future<Output = Result<ConformanceReport, ConformanceError>>,
    {
        let result = result.await;
        fold_into(&mut self.report, suite, result);
    }
}

fn build(builder: SandboxSpecBuilder) -> Result<SandboxSpec, ConformanceError> {
    builder
        .build()
        .map_err(|e| ConformanceError::InvalidArgument(format!("the conformance spec: {e}")))
}

/// Runs every file and exec suite against `backend`, in the order the spec requires, and returns the
/// combined report (assert it with [`ConformanceReport::assert_all_passed`]).
///
/// `keys(purpose)` must return a distinct key per purpose (for example the run's own scope and the
/// purpose as thread id); every sandbox of the run is disposed of by key as soon as the suites that
/// use it are done, so at most two are held at once (instance disposal's pair), and a disposal that
/// does not land is a failed `CLEANUP` entry. `spec` is the base spec (image, limits); the run sets
/// `work_dir` for the storage-base suites and the call scope for CALL_SCOPE.
///
/// Order: storage base on two fresh sandboxes (`work_dir` None, then [`EXPLICIT_STORAGE_BASE`]) with
/// fresh acquire on the first; instance disposal; on one shared sandbox FILES_OUT, FILES_IN,
/// FILES_DELETE, RECLAIM, REACH, EXEC and the shared HARDENING probes; then CALL_SCOPE (when the
/// backend serves call scope), the HARDENING probes that need sandboxes of their own (without
/// `exact_kill`, the record-removing hostile cases first), and CONFINEMENT on a conversation
/// sandbox of its own (both only with hooks).
///
/// A suite that cannot run is recorded as a failure, never skipped silently. `Err` only for a spec the
/// run cannot build. Cancel safety: dropping the future stops the run and leaves its sandboxes for the
/// caller's own sweep (`dispose_scope` on the keys' scope).
pub async fn run_backend_suites(
    backend: &dyn SandboxBackend,
    keys: &mut (dyn FnMut(&str) -> SandboxKey + Send),
    spec: SandboxSpecBuilder,
    options: RunOptions<'_>,
) -> Result<ConformanceReport, ConformanceError> {
    let base_spec = build(spec.clone())?;
    let default_base_spec = build(spec.clone().work_dir(None::<String>))?;
    let explicit_base_spec = build(spec.clone().work_dir(Some(EXPLICIT_STORAGE_BASE)))?;
    let call_spec = build(spec.clone().isolation_scope(IsolationScope::Call))?;
    let mut run = Run {
        backend,
        capabilities: backend.declarations().capabilities.clone(),
        report: ConformanceReport::new(),
        used_keys: Vec::new(),
        allowance: options.exec_cleanup_allowance,
    };

    if !options.reduced {
        storage_base_and_lifecycle(
            &mut run,
            keys,
            &default_base_spec,
            &explicit_base_spec,
            &base_spec,
        )
        .await;
    }

    let shared_key = keys("shared");
    match run.acquire("shared", &shared_key, &base_spec).await {
        Ok(sandbox) => match run.subject(sandbox) {
            Ok(subject) => {
                run.suite(FILES_OUT, assert_files_out(&subject, options.flat_files))
                    .await;
                run.suite(FILES_IN, assert_files_in(&subject)).await;
                run.suite(FILES_DELETE, assert_files_delete(&subject)).await;
                run.suite(RECLAIM, assert_reclaim(&subject)).await;
                if !options.reduced {
                    run.suite(REACH, assert_reach(&subject)).await;
                }
                run.suite(EXEC, assert_exec(&subject)).await;
                if let Some(hooks) = options.hardening {
                    run.suite(HARDENING, assert_hardening(&subject, hooks))
                        .await;
                }
            }
            Err(e) => fold_into(&mut run.report, "SHARED", Err(e)),
        },
        Err(e) => fold_into(&mut run.report, "SHARED", Err(e)),
    }
    run.release().await;

    if !options.reduced && backend.declarations().serves_scope(IsolationScope::Call) {
        call_scope(&mut run, keys, &call_spec).await;
        run.release().await;
    }

    if let Some(hooks) = options.hardening {
        hardening_on_own_sandboxes(
            &mut run,
            keys,
            &base_spec,
            hooks,
            !options.without_confinement,
        )
        .await;
    }

    run.release().await;
    Ok(run.report)
}

async fn storage_base_and_lifecycle(
    run: &mut Run<'_>,
    keys: &mut (dyn FnMut(&str) -> SandboxKey + Send),
    default_base_spec: &SandboxSpec,
    explicit_base_spec: &SandboxSpec,
    base_spec: &SandboxSpec,
) {
    for (purpose, spec) in [
        ("storage-base-default", default_base_spec),
        ("storage-base-explicit", explicit_base_spec),
    ] {
        let key = keys(purpose);
        match run.acquire(purpose, &key, spec).await {
            Ok(sandbox) => {
                if purpose == "storage-base-default" {
                    let backend = run.backend;
                    let reacquire = || async { backend.acquire(&key, spec).await };
                    let result = assert_fresh_acquire(sandbox.as_ref(), reacquire).await;
                    fold_into(&mut run.report, FRESH_ACQUIRE, result);
                }
                let result = assert_storage_base(sandbox.as_ref(), &run.capabilities).await;
                fold_into(&mut run.report, STORAGE_BASE, result);
            }
            Err(e) => fold_into(&mut run.report, STORAGE_BASE, Err(e)),
        }
        run.release().await;
    }

    let target_key = keys("instance-disposal");
    let sibling_key = keys("instance-disposal-sibling");
    let target = run
        .acquire("instance-disposal", &target_key, base_spec)
        .await;
    let sibling = run
        .acquire("instance-disposal-sibling", &sibling_key, base_spec)
        .await;
    match (target, sibling) {
        (Ok(target), Ok(sibling)) => {
            let backend = run.backend;
            let scopes = [target_key.scope.clone(), sibling_key.scope.clone()];
            let exists = |id: String| {
                let scopes = scopes.clone();
                async move {
                    for scope in &scopes {
                        if instance_is_listed(backend, scope, &id).await? {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                }
            };
            let result = assert_instance_disposal(
                backend,
                &target_key,
                base_spec.kind(),
                target.instance_id(),
                &[sibling.instance_id().to_owned()],
                exists,
            )
            .await;
            fold_into(&mut run.report, INSTANCE_DISPOSAL, result);
        }
        (Err(e), _) | (_, Err(e)) => fold_into(&mut run.report, INSTANCE_DISPOSAL, Err(e)),
    }
    run.release().await;
}

async fn call_scope(
    run: &mut Run<'_>,
    keys: &mut (dyn FnMut(&str) -> SandboxKey + Send),
    call_spec: &SandboxSpec,
) {
    let conversation = keys("call-scope");
    let this_key = conversation.clone().with_call("conformance-call-one");
    let other_key = conversation.with_call("conformance-call-two");
    run.used_keys
        .push(("call-scope-other".to_owned(), other_key.clone()));
    let this = match run.acquire("call-scope", &this_key, call_spec).await {
        Ok(sandbox) => sandbox,
        Err(e) => return fold_into(&mut run.report, CALL_SCOPE, Err(e)),
    };
    let subject = match run.subject(this) {
        Ok(subject) => subject,
        Err(e) => return fold_into(&mut run.report, CALL_SCOPE, Err(e)),
    };
    let backend = run.backend;
    let capabilities = run.capabilities.clone();
    let allowance = run.allowance;
    let acquire_another = || async {
        let sandbox = backend.acquire(&other_key, call_spec).await.map_err(|e| {
            ConformanceError::sandbox("acquiring the other call's sandbox".to_owned(), e)
        })?;
        Ok(PosixGuestSubject::in_storage_base(sandbox, capabilities)?
            .with_exec_cleanup_allowance(allowance))
    };
    let dispose_this = || backend.dispose(&this_key, DisposeSelector::all());
    let dispose_other = || backend.dispose(&other_key, DisposeSelector::all());
    let result = assert_call_scope(&subject, acquire_another, dispose_this, dispose_other).await;
    fold_into(&mut run.report, CALL_SCOPE, result);
}

async fn hardening_on_own_sandboxes(
    run: &mut Run<'_>,
    keys: &mut (dyn FnMut(&str) -> SandboxKey + Send),
    base_spec: &SandboxSpec,
    hooks: &dyn HardeningHooks,
    confinement: bool,
) {
    // Without exact kills, the hostile commands that remove their group's record retire their
    // sandbox: each gets one of its own.
    if !run.capabilities.contains(&Capability::ExactKill) {
        for index in 0..RECORD_REMOVING_CASES.len() {
            let purpose = format!("lost-record-{index}");
            let key = keys(&purpose);
            match run.acquire(&purpose, &key, base_spec).await {
                Ok(sandbox) => match run.subject(sandbox) {
                    Ok(subject) => {
                        run.suite(HARDENING, assert_a_lost_record_retires(&subject, index))
                            .await
                    }
                    Err(e) => fold_into(&mut run.report, HARDENING, Err(e)),
                },
                Err(e) => fold_into(&mut run.report, HARDENING, Err(e)),
            }
            run.release().await;
        }
    }
    let network = async {
        require_closed_egress(base_spec)?;
        let address = hooks.routable_host_address().await?;
        Ok::<_, ConformanceError>(address)
    }
    .await;
    match network {
        Ok(address) => {
            let key = keys("network-closed");
            match run.acquire("network-closed", &key, base_spec).await {
                Ok(sandbox) => match run.subject(sandbox) {
                    Ok(subject) => {
                        run.suite(
                            HARDENING,
                            assert_network_closed_by_content(&subject, address),
                        )
                        .await
                    }
                    Err(e) => fold_into(&mut run.report, HARDENING, Err(e)),
                },
                Err(e) => fold_into(&mut run.report, HARDENING, Err(e)),
            }
        }
        Err(e) => fold_into(&mut run.report, HARDENING, Err(e)),
    }
    run.release().await;

    if confinement {
        let key = keys("confinement");
        match run.acquire("confinement", &key, base_spec).await {
            Ok(sandbox) => match run.subject(sandbox) {
                Ok(subject) => {
                    run.suite(CONFINEMENT, assert_confinement(&subject, hooks))
                        .await
                }
                Err(e) => fold_into(&mut run.report, CONFINEMENT, Err(e)),
            },
            Err(e) => fold_into(&mut run.report, CONFINEMENT, Err(e)),
        }
        run.release().await;
    }

    let backend = run.backend;
    let key = keys("engine-failure");
    run.used_keys
        .push(("engine-failure".to_owned(), key.clone()));
    run.suite(
        HARDENING,
        assert_engine_failure_is_not_an_exit_code(backend, &key, base_spec, hooks),
    )
    .await;
    run.release().await;

    let key = keys("concurrent-acquire");
    run.used_keys
        .push(("concurrent-acquire".to_owned(), key.clone()));
    run.suite(
        HARDENING,
        assert_concurrent_acquires_yield_one(backend, &key, base_spec, hooks),
    )
    .await;
}
