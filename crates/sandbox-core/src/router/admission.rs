//! Admission: the two spec-level checks and the seven per-backend checks, in the order of
//! `docs/architecture.md#the-contract-in-one-page`. Pure functions of the spec, the host's policy and the backends' declarations: never of load or
//! health.

use std::collections::BTreeSet;

use crate::{
    BackendDeclarations, Capability, Egress, Isolation, IsolationScope, SandboxError, SandboxSpec,
    TransferLimits,
};

/// Which admission refusal a check produced; each maps to exactly one error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalKind {
    InvalidArgument,
    CapabilityDenied,
    NotPermitted,
    CapabilityNotSupported,
    OsFamilyNotSupported,
    TransferLimitsNotPermitted,
    EgressNotEnforced,
    ScopeNotEnforced,
}

impl RefusalKind {
    /// The kind's name as the composite refusal message prints it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RefusalKind::InvalidArgument => "invalid_argument",
            RefusalKind::CapabilityDenied => "capability_denied",
            RefusalKind::NotPermitted => "not_permitted",
            RefusalKind::CapabilityNotSupported => "capability_not_supported",
            RefusalKind::OsFamilyNotSupported => "os_family_not_supported",
            RefusalKind::TransferLimitsNotPermitted => "transfer_limits_not_permitted",
            RefusalKind::EgressNotEnforced => "egress_not_enforced",
            RefusalKind::ScopeNotEnforced => "scope_not_enforced",
        }
    }
}

/// One refusal, before it becomes a [`SandboxError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) kind: RefusalKind,
    pub(crate) message: String,
}

impl Refusal {
    fn new(kind: RefusalKind, message: String) -> Self {
        Refusal { kind, message }
    }

    /// The error of this refusal. Cold: a refusal is the unusual path.
    #[cold]
    #[inline(never)]
    pub(crate) fn into_error(self) -> SandboxError {
        let m = self.message;
        match self.kind {
            RefusalKind::InvalidArgument => SandboxError::InvalidArgument(m),
            RefusalKind::CapabilityDenied => SandboxError::CapabilityDenied(m),
            RefusalKind::NotPermitted => SandboxError::NotPermitted(m),
            RefusalKind::CapabilityNotSupported => SandboxError::CapabilityNotSupported(m),
            RefusalKind::OsFamilyNotSupported => SandboxError::OsFamilyNotSupported(m),
            RefusalKind::TransferLimitsNotPermitted => SandboxError::TransferLimitsNotPermitted(m),
            RefusalKind::EgressNotEnforced => SandboxError::EgressNotEnforced(m),
            RefusalKind::ScopeNotEnforced => SandboxError::ScopeNotEnforced(m),
        }
    }
}

/// The spec-level checks, run once per admission: an allowlist with nothing allowed, then a required
/// capability the host denies.
pub(crate) fn spec_level(
    egress: Egress,
    allow_is_empty: bool,
    required: &BTreeSet<Capability>,
    denied: &BTreeSet<Capability>,
) -> Option<Refusal> {
    if egress == Egress::Allowlist && allow_is_empty {
        return Some(Refusal::new(
            RefusalKind::InvalidArgument,
            "egress allowlist with no allowed host".to_owned(),
        ));
    }
    let denied: Vec<&str> = required.intersection(denied).map(|c| c.as_str()).collect();
    if !denied.is_empty() {
        return Some(Refusal::new(
            RefusalKind::CapabilityDenied,
            format!(
                "the host denies {}, which the spec requires",
                denied.join(", ")
            ),
        ));
    }
    None
}

/// What a backend offers, as admission reads it.
pub(crate) struct Offer<'a> {
    pub(crate) name: &'a str,
    pub(crate) isolation: Isolation,
    pub(crate) declarations: &'a BackendDeclarations,
}

/// The host's side of admission.
pub(crate) struct HostPolicy {
    pub(crate) min_isolation: Isolation,
    pub(crate) min_isolation_scope: IsolationScope,
}

/// The per-backend checks, in order; the first refusal wins.
pub(crate) fn backend_refusal(
    offer: &Offer<'_>,
    host: &HostPolicy,
    spec: &SandboxSpec,
) -> Option<Refusal> {
    let name = offer.name;
    let decl = offer.declarations;

    // The effective floor is the higher of the host's and the spec's.
    let floor = spec
        .min_isolation()
        .map_or(host.min_isolation, |s| s.max(host.min_isolation));
    if !offer.isolation.meets_floor(Some(floor)) {
        return Some(Refusal::new(
            RefusalKind::NotPermitted,
            format!(
                "backend {name:?} provides {} isolation, below the floor {floor}",
                offer.isolation
            ),
        ));
    }

    // Every required capability must be declared.
    let required = spec.required_capabilities();
    let missing: Vec<&str> = required
        .difference(&decl.capabilities)
        .map(|c| c.as_str())
        .collect();
    if !missing.is_empty() {
        return Some(Refusal::new(
            RefusalKind::CapabilityNotSupported,
            format!("backend {name:?} does not declare {}", missing.join(", ")),
        ));
    }

    // The HTTP methods named by egress rules must be enforceable, when the backend lists tokens.
    if let Some(tokens) = &decl.egress_method_tokens {
        let unknown: Vec<&str> = spec
            .egress_methods_named()
            .into_iter()
            .filter(|m| !tokens.contains(*m))
            .collect();
        if !unknown.is_empty() {
            return Some(Refusal::new(
                RefusalKind::CapabilityNotSupported,
                format!(
                    "backend {name:?} cannot enforce the egress methods {}",
                    unknown.join(", ")
                ),
            ));
        }
    }

    // A named OS family must be declared.
    if let Some(family) = spec.requires_os_family() {
        if !decl.os_families.contains(&family) {
            return Some(Refusal::new(
                RefusalKind::OsFamilyNotSupported,
                format!("backend {name:?} does not serve the {family} OS family"),
            ));
        }
    }

    // Transfer limits are compared with the ceiling, never clamped.
    for (direction, asked, ceiling) in [
        ("files_in", spec.files_in(), decl.limits.files_in),
        ("files_out", spec.files_out(), decl.limits.files_out),
    ] {
        if !asked.within(&ceiling) {
            return Some(limits_refusal(name, direction, asked, ceiling));
        }
    }

    // The spec's egress mode must be enforced exactly; no other mode is substituted.
    if !decl.egress_modes.contains(&spec.egress()) {
        let enforced: Vec<&str> = decl.egress_modes.iter().map(|e| e.as_str()).collect();
        let enforced = if enforced.is_empty() {
            "none".to_owned()
        } else {
            enforced.join(", ")
        };
        return Some(Refusal::new(
            RefusalKind::EgressNotEnforced,
            format!(
                "backend {name:?} does not enforce egress {} (it enforces: {enforced})",
                spec.egress()
            ),
        ));
    }

    // The effective isolation scope must be served.
    let scope = IsolationScope::effective(host.min_isolation_scope, spec.isolation_scope());
    if !decl.serves_scope(scope) {
        return Some(Refusal::new(
            RefusalKind::ScopeNotEnforced,
            format!("backend {name:?} does not serve {scope}-scoped sandboxes"),
        ));
    }
    None
}

fn limits_refusal(
    name: &str,
    direction: &str,
    asked: TransferLimits,
    ceiling: TransferLimits,
) -> Refusal {
    Refusal::new(
        RefusalKind::TransferLimitsNotPermitted,
        format!(
            "the spec's {direction} limits ({asked}) exceed backend {name:?}'s ceiling ({ceiling})"
        ),
    )
}

/// The refusal of a per-spec selection where no candidate serves: the first candidate's refusal, its
/// message extended with the others' names and refusal kinds.
pub(crate) fn compose(mut refusals: Vec<(&str, Refusal)>) -> Option<Refusal> {
    if refusals.is_empty() {
        return None;
    }
    let (_, first) = refusals.remove(0);
    if refusals.is_empty() {
        return Some(first);
    }
    let others: Vec<String> = refusals
        .iter()
        .map(|(name, r)| format!("{name:?} ({})", r.kind.label()))
        .collect();
    Some(Refusal {
        kind: first.kind,
        message: format!(
            "{}; the other candidates refused too: {}",
            first.message,
            others.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowlist_with_nothing_allowed_comes_before_a_denied_capability() {
        let required = BTreeSet::from([Capability::Exec, Capability::FilesIn]);
        let denied = BTreeSet::from([Capability::Exec]);
        let r = spec_level(Egress::Allowlist, true, &required, &denied).expect("refused");
        assert_eq!(r.kind, RefusalKind::InvalidArgument);
        assert_eq!(
            r.into_error().kind(),
            crate::ErrorKind::InvalidArgument,
            "an allowlist that allows nothing is an invalid argument"
        );
        let r = spec_level(Egress::Allowlist, false, &required, &denied).expect("refused");
        assert_eq!(r.kind, RefusalKind::CapabilityDenied);
        assert_eq!(r.message, "the host denies exec, which the spec requires");
        assert!(spec_level(Egress::Closed, true, &required, &BTreeSet::new()).is_none());
        assert!(spec_level(Egress::Allowlist, false, &required, &BTreeSet::new()).is_none());
    }

    #[test]
    fn every_refusal_kind_maps_to_its_error_kind() {
        use crate::ErrorKind as K;
        let pairs = [
            (RefusalKind::InvalidArgument, K::InvalidArgument),
            (RefusalKind::CapabilityDenied, K::CapabilityDenied),
            (RefusalKind::NotPermitted, K::NotPermitted),
            (
                RefusalKind::CapabilityNotSupported,
                K::CapabilityNotSupported,
            ),
            (RefusalKind::OsFamilyNotSupported, K::OsFamilyNotSupported),
            (
                RefusalKind::TransferLimitsNotPermitted,
                K::TransferLimitsNotPermitted,
            ),
            (RefusalKind::EgressNotEnforced, K::EgressNotEnforced),
            (RefusalKind::ScopeNotEnforced, K::ScopeNotEnforced),
        ];
        for (refusal, kind) in pairs {
            let e = Refusal::new(refusal, "m".into()).into_error();
            assert_eq!(e.kind(), kind);
            assert!(e.to_string().ends_with(": m"), "{e}");
        }
    }

    #[test]
    fn compose_keeps_the_first_kind_and_names_the_others() {
        assert!(compose(Vec::new()).is_none());
        let one = Refusal::new(RefusalKind::EgressNotEnforced, "first".into());
        assert_eq!(compose(vec![("a", one.clone())]), Some(one.clone()));
        let two = Refusal::new(RefusalKind::NotPermitted, "second".into());
        let got = compose(vec![("a", one), ("b", two)]).unwrap();
        assert_eq!(got.kind, RefusalKind::EgressNotEnforced);
        assert_eq!(
            got.message,
            "first; the other candidates refused too: \"b\" (not_permitted)"
        );
    }
}
