//! The router's configuration and its defaults.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::{Capability, Isolation, IsolationScope};

/// How the router picks a backend for a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendSelection {
    /// One backend serves every spec: the `selected` one, or the first registered.
    #[default]
    Fixed,
    /// Each spec goes to the first registered backend (above the floor) that admits it.
    PerSpec,
}

/// What the router does when a cleanup that protects a key (adoption of an unfamiliar instance, the
/// disposal of an instance acquired while the key turned unclean, a timed-out `dispose_kind`) fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailedCleanup {
    /// Mark the key unclean and refuse it until a disposal lands.
    #[default]
    Dispose,
    /// Serve anyway and write nothing to the unclean ledger.
    Keep,
}

/// The host's policy for a [`Router`](crate::Router).
///
/// Fields are public so a host can read them back; the struct is `#[non_exhaustive]`, so build it from
/// [`RouterConfig::default`] and the chained setters (or by assigning fields of a default value):
///
/// ```
/// use std::time::Duration;
/// use sandbox_core::{Capability, Isolation, RouterConfig, BackendSelection};
///
/// let config = RouterConfig::default()
///     .min_isolation(Isolation::Container)
///     .selection(BackendSelection::PerSpec)
///     .deny(Capability::FilesDelete)
///     .cleanup_timeout(Duration::from_secs(10));
/// assert_eq!(config.min_isolation, Isolation::Container);
/// assert_eq!(RouterConfig::default().min_isolation, Isolation::Microvm);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouterConfig {
    /// The host's isolation floor (default `microvm`). A spec may only raise it.
    pub min_isolation: Isolation,
    /// The host's isolation-scope floor (default `conversation`). A spec may only raise it.
    pub min_isolation_scope: IsolationScope,
    /// How a backend is picked (default [`BackendSelection::Fixed`]).
    pub selection: BackendSelection,
    /// With [`BackendSelection::Fixed`], the backend to use by name; `None` picks the first registered.
    pub selected: Option<String>,
    /// Capabilities no spec may require through this router.
    pub denied_capabilities: BTreeSet<Capability>,
    /// The bound on each cleanup the router runs itself (adoption, unclean disposal, the disposal
    /// fan-out of `dispose` and `dispose_scope`). Default 30 s; must be greater than zero.
    pub cleanup_timeout: Duration,
    /// What a failed cleanup does to the key (default [`FailedCleanup::Dispose`]).
    pub failed_cleanup: FailedCleanup,
}

/// The default bound on the router's own cleanups.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            min_isolation: Isolation::Microvm,
            min_isolation_scope: IsolationScope::Conversation,
            selection: BackendSelection::Fixed,
            selected: None,
            denied_capabilities: BTreeSet::new(),
            cleanup_timeout: DEFAULT_CLEANUP_TIMEOUT,
            failed_cleanup: FailedCleanup::Dispose,
        }
    }
}

impl RouterConfig {
    /// Sets the isolation floor.
    #[must_use]
    pub fn min_isolation(mut self, floor: Isolation) -> Self {
        self.min_isolation = floor;
        self
    }

    /// Sets the isolation-scope floor.
    #[must_use]
    pub fn min_isolation_scope(mut self, scope: IsolationScope) -> Self {
        self.min_isolation_scope = scope;
        self
    }

    /// Sets the selection mode.
    #[must_use]
    pub fn selection(mut self, selection: BackendSelection) -> Self {
        self.selection = selection;
        self
    }

    /// Names the backend a [`BackendSelection::Fixed`] router uses.
    #[must_use]
    pub fn selected(mut self, backend: impl Into<String>) -> Self {
        self.selected = Some(backend.into());
        self
    }

    /// Denies one capability to every spec.
    #[must_use]
    pub fn deny(mut self, capability: Capability) -> Self {
        self.denied_capabilities.insert(capability);
        self
    }

    /// Sets the bound on the router's own cleanups.
    #[must_use]
    pub fn cleanup_timeout(mut self, bound: Duration) -> Self {
        self.cleanup_timeout = bound;
        self
    }

    /// Sets what a failed cleanup does.
    #[must_use]
    pub fn failed_cleanup(mut self, policy: FailedCleanup) -> Self {
        self.failed_cleanup = policy;
        self
    }
}
