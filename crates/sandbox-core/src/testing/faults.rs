//! The faults and canned behaviour a test injects into a fake backend: read by the backend's
//! acquire and disposal and by every instance's `exec`, so a leaf both import.

use std::time::Duration;

use crate::{DisposalCode, ExecOutput};

/// Faults and canned behaviour a test can inject into a [`FakeBackend`](super::FakeBackend). The default injects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Faults {
    /// Every acquire fails with [`SandboxError::BackendUnavailable`](crate::SandboxError::BackendUnavailable) carrying this detail.
    pub acquire_failure: Option<String>,
    /// Every acquire waits this long before doing anything (tokio time, so paused clocks apply).
    pub acquire_delay: Option<Duration>,
    /// Newly created instances get an empty instance id (a contract violation).
    pub empty_instance_ids: bool,
    /// Newly created instances report `freshly_created() == false`, as a backend that cannot tell would.
    pub never_fresh: bool,
    /// Every `dispose` and `dispose_scope` fails with this code and removes nothing.
    pub dispose_failure: Option<DisposalCode>,
    /// Every `dispose` and `dispose_scope` waits this long first.
    pub dispose_delay: Option<Duration>,
    /// Every `dispose` and `dispose_scope` never returns.
    pub dispose_hang: bool,
    /// Every `exec` returns this output instead of interpreting the command.
    pub exec_output: Option<ExecOutput>,
    /// Every `reset` and `fork` of a fake that declares `snapshot` fails with
    /// [`SandboxError::Engine`](crate::SandboxError::Engine) carrying this detail, and changes
    /// nothing.
    pub snapshot_failure: Option<String>,
}
