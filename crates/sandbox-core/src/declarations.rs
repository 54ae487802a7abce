//! What a backend declares it serves. Every default is the reading of silence.

use std::collections::BTreeSet;

use crate::{Capability, Egress, IsolationScope, OsFamily, SandboxLimits};

/// A backend's declarations, answerable synchronously before any sandbox exists.
///
/// The defaults read silence: capabilities `{exec, files_in}` (charitable), the default limits as a
/// ceiling (conservative), no egress mode (so every spec is refused), no OS family (only specs naming a
/// family are refused), scopes `{conversation}`, and `egress_method_tokens = Some(∅)` (no method permitted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendDeclarations {
    /// The capabilities served.
    pub capabilities: BTreeSet<Capability>,
    /// The transfer ceilings; specs above them are refused, never clamped.
    pub limits: SandboxLimits,
    /// The egress modes enforced.
    pub egress_modes: BTreeSet<Egress>,
    /// The OS families served.
    pub os_families: BTreeSet<OsFamily>,
    /// The isolation scopes served; an empty set reads as `{conversation}`.
    pub isolation_scopes: BTreeSet<IsolationScope>,
    /// HTTP method tokens enforceable in egress rules; `None` means any token. Consulted only when
    /// `egress_methods` is declared.
    pub egress_method_tokens: Option<BTreeSet<String>>,
}

impl Default for BackendDeclarations {
    fn default() -> Self {
        BackendDeclarations {
            capabilities: Capability::defaults(),
            limits: SandboxLimits::default(),
            egress_modes: BTreeSet::new(),
            os_families: BTreeSet::new(),
            isolation_scopes: BTreeSet::from([IsolationScope::Conversation]),
            egress_method_tokens: Some(BTreeSet::new()),
        }
    }
}

impl BackendDeclarations {
    /// Whether a capability is declared.
    pub fn serves(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }

    /// Whether an isolation scope is served, reading an empty set as `{conversation}`.
    pub fn serves_scope(&self, scope: IsolationScope) -> bool {
        if self.isolation_scopes.is_empty() {
            scope == IsolationScope::Conversation
        } else {
            self.isolation_scopes.contains(&scope)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence() {
        let d = BackendDeclarations::default();
        assert!(d.serves(Capability::Exec) && d.serves(Capability::FilesIn));
        assert!(!d.serves(Capability::FilesOut));
        assert!(d.egress_modes.is_empty());
        assert!(d.serves_scope(IsolationScope::Conversation));
        assert!(!d.serves_scope(IsolationScope::Call));
        let empty = BackendDeclarations {
            isolation_scopes: BTreeSet::new(),
            ..d
        };
        assert!(empty.serves_scope(IsolationScope::Conversation));
        assert!(!empty.serves_scope(IsolationScope::Call));
    }
}
