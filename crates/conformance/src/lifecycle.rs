//! Fresh acquire and instance disposal (docs/conformance.md#the-suites).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use sandbox_core::{DisposeSelector, Sandbox, SandboxBackend, SandboxError, SandboxKey};

use crate::error::ConformanceError;
use crate::report::ConformanceReport;
use crate::suite_runner::{ensure, ProbeError, SuiteRun, Verdict};

/// The fresh-acquire suite label.
pub const FRESH_ACQUIRE: &str = "FRESH_ACQUIRE";
/// The instance-disposal suite label.
pub const INSTANCE_DISPOSAL: &str = "INSTANCE_DISPOSAL";

/// The fresh-acquire probes, in the order they run.
const FRESH_ACQUIRE_PROBE_TABLE: &[&str] = &["a-new-sandbox-is-fresh-and-its-reacquire-warm"];

/// How many probes [`assert_fresh_acquire`] runs.
pub(crate) const FRESH_ACQUIRE_PROBES: usize = FRESH_ACQUIRE_PROBE_TABLE.len();

/// The instance-disposal probes, in the order they run.
const INSTANCE_DISPOSAL_PROBE_TABLE: &[&str] = &["disposing-one-instance-leaves-its-siblings"];

/// How many probes the instance-disposal suite runs.
pub(crate) const INSTANCE_DISPOSAL_PROBES: usize = INSTANCE_DISPOSAL_PROBE_TABLE.len();

/// Asserts that `sandbox` was freshly created and that `reacquire` (the backend directly, no router,
/// same key and spec) returns the same instance, warm, without changing the first handle's answer.
pub async fn assert_fresh_acquire<F, Fut>(
    sandbox: &dyn Sandbox,
    reacquire: F,
) -> Result<ConformanceReport, ConformanceError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Sandbox>, SandboxError>>,
{
    let none = BTreeSet::new();
    let mut run = SuiteRun::start(
        FRESH_ACQUIRE,
        FRESH_ACQUIRE_PROBE_TABLE,
        None,
        &none,
        Verdict::Aggregate,
    )?;
    run.probe(
        "a-new-sandbox-is-fresh-and-its-reacquire-warm",
        &[],
        async {
            ensure!(
                sandbox.freshly_created(),
                "the first acquire reports freshly_created() = false"
            );
            let again = reacquire().await?;
            ensure!(
                again.instance_id() == sandbox.instance_id(),
                "the reacquire returned instance {:?}, not {:?}",
                again.instance_id(),
                sandbox.instance_id()
            );
            ensure!(
                !again.freshly_created(),
                "the warm reacquire reports freshly_created() = true"
            );
            ensure!(
                sandbox.freshly_created(),
                "the reacquire changed the first handle's freshly_created()"
            );
            Ok(())
        },
    )
    .await;
    run.finish()
}

/// Asserts that `dispose(key, {kind, instance_id})` removes exactly that instance, twice over.
///
/// `exists(instance_id)` must answer from the engine (for example [`instance_is_listed`]). The
/// preconditions (siblings given, none of them the target, all present) are harness errors.
pub async fn assert_instance_disposal<E, Fut>(
    backend: &dyn SandboxBackend,
    key: &SandboxKey,
    kind: &str,
    instance_id: &str,
    siblings: &[String],
    exists: E,
) -> Result<ConformanceReport, ConformanceError>
where
    E: Fn(String) -> Fut,
    Fut: Future<Output = Result<bool, SandboxError>>,
{
    let present = |id: String| {
        let fut = exists(id.clone());
        async move {
            fut.await
                .map_err(|e| ConformanceError::sandbox(format!("asking whether {id} exists"), e))
        }
    };
    if siblings.is_empty() || siblings.iter().any(|s| s == instance_id) {
        return Err(ConformanceError::harness(
            INSTANCE_DISPOSAL,
            "siblings must be given and must not include the target",
        ));
    }
    for id in std::iter::once(instance_id).chain(siblings.iter().map(String::as_str)) {
        if !present(id.to_owned()).await? {
            return Err(ConformanceError::harness(
                INSTANCE_DISPOSAL,
                format!("instance {id} does not exist before the disposal"),
            ));
        }
    }
    let none = BTreeSet::new();
    let mut run = SuiteRun::start(
        INSTANCE_DISPOSAL,
        INSTANCE_DISPOSAL_PROBE_TABLE,
        None,
        &none,
        Verdict::Aggregate,
    )?;
    run.probe("disposing-one-instance-leaves-its-siblings", &[], async {
        for round in ["first", "second"] {
            let selector = DisposeSelector::instance(kind, instance_id);
            if let Some(failure) = backend.dispose(key, selector).await {
                return Err(ProbeError::Assertion(format!(
                    "the {round} disposal reported {failure}"
                )));
            }
            ensure!(
                !present(instance_id.to_owned()).await?,
                "instance {instance_id} survived the {round} disposal"
            );
            for sibling in siblings {
                ensure!(
                    present(sibling.clone()).await?,
                    "sibling {sibling} disappeared with the {round} disposal"
                );
            }
        }
        Ok(())
    })
    .await;
    run.finish()
}

/// Whether the engine lists `instance_id` among the sandboxes of `scope` (an engine-side `exists` for
/// [`assert_instance_disposal`]).
pub async fn instance_is_listed(
    backend: &dyn SandboxBackend,
    scope: &str,
    instance_id: &str,
) -> Result<bool, SandboxError> {
    let listed = backend.list(scope, None).await?;
    Ok(listed.iter().any(|s| s.instance_id == instance_id))
}
