//! What a host asks of a sandbox, validated once at construction.

use std::collections::{BTreeMap, BTreeSet};

use crate::credential::CredentialGrant;
use crate::{
    Capability, CleanupRung, Egress, EgressEntry, Isolation, IsolationScope, OsFamily,
    SandboxError, TransferLimits,
};

/// The storage base both backends use when a spec does not choose one.
pub const DEFAULT_WORK_DIR: &str = "/maf-sandbox/work";

/// A sandbox request. Built with [`SandboxSpec::builder`]; every field is validated by
/// [`SandboxSpecBuilder::build`] and never re-validated later.
///
/// There is no environment, timeout or resource field: timeouts are per call, CPU and memory are backend
/// configuration, and the guest environment travels with each [`ExecRequest`](crate::ExecRequest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    kind: String,
    image: Option<String>,
    image_id: Option<String>,
    egress: Egress,
    egress_allow: Vec<EgressEntry>,
    credentials: Vec<CredentialGrant>,
    work_dir: Option<String>,
    labels: BTreeMap<String, String>,
    requires: BTreeSet<Capability>,
    min_isolation: Option<Isolation>,
    files_in: TransferLimits,
    files_out: TransferLimits,
    isolation_scope: IsolationScope,
    requires_os_family: Option<OsFamily>,
    min_cleanup: CleanupRung,
}

impl SandboxSpec {
    /// Starts a spec for `kind` (part of the sandbox's identity: one sandbox never serves two kinds).
    pub fn builder(kind: impl Into<String>) -> SandboxSpecBuilder {
        SandboxSpecBuilder {
            spec: SandboxSpec {
                kind: kind.into(),
                image: None,
                image_id: None,
                egress: Egress::Closed,
                egress_allow: Vec::new(),
                credentials: Vec::new(),
                work_dir: Some(DEFAULT_WORK_DIR.to_owned()),
                labels: BTreeMap::new(),
                requires: Capability::defaults(),
                min_isolation: None,
                files_in: TransferLimits::default(),
                files_out: TransferLimits::default(),
                isolation_scope: IsolationScope::Conversation,
                requires_os_family: None,
                min_cleanup: CleanupRung::Reclaim,
            },
        }
    }

    /// The kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// The image reference, resolved by the backend.
    pub fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }
    /// A backend-native pinned image id; wins over [`image`](Self::image).
    pub fn image_id(&self) -> Option<&str> {
        self.image_id.as_deref()
    }
    /// The egress mode.
    pub fn egress(&self) -> Egress {
        self.egress
    }
    /// The allowlist (non-empty exactly when the mode is `allowlist`), deduplicated by host.
    pub fn egress_allow(&self) -> &[EgressEntry] {
        &self.egress_allow
    }
    /// The storage base; `None` lets the backend choose.
    pub fn work_dir(&self) -> Option<&str> {
        self.work_dir.as_deref()
    }
    /// Labels copied to engine labels where the engine has them.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }
    /// The capabilities the spec asks for, as given.
    pub fn requires(&self) -> &BTreeSet<Capability> {
        &self.requires
    }
    /// The spec's own isolation floor; it may only raise the host's.
    pub fn min_isolation(&self) -> Option<Isolation> {
        self.min_isolation
    }
    /// The workload's cap on files going in.
    pub fn files_in(&self) -> TransferLimits {
        self.files_in
    }
    /// The workload's cap on files coming out.
    pub fn files_out(&self) -> TransferLimits {
        self.files_out
    }
    /// The spec's isolation scope; it may only raise the host's.
    pub fn isolation_scope(&self) -> IsolationScope {
        self.isolation_scope
    }
    /// The weakest cleanup the host may apply between two uses of the sandbox (default
    /// `reclaim`). A host applies [`CleanupRung::at_least`] of it over the serving backend's
    /// declarations, so a backend without the rung meets it by a stronger one (at worst
    /// disposal); it never refuses admission.
    pub fn min_cleanup(&self) -> CleanupRung {
        self.min_cleanup
    }
    /// The OS family the spec needs, if any.
    pub fn requires_os_family(&self) -> Option<OsFamily> {
        self.requires_os_family
    }

    /// The credential grants attached to this acquire
    /// ([`SandboxSpecBuilder::credential`]).
    pub fn credentials(&self) -> &[CredentialGrant] {
        &self.credentials
    }

    /// `requires` plus what the allowlist rules add (`egress_methods`, `egress_paths`) and what
    /// credential grants add (`egress_paths` always: a grant names paths; `egress_methods` when it
    /// names methods). The router matches on this set.
    pub fn required_capabilities(&self) -> BTreeSet<Capability> {
        let mut set = self.requires.clone();
        set.extend(
            self.egress_allow
                .iter()
                .flat_map(|e| e.derived_requirements()),
        );
        for grant in &self.credentials {
            set.insert(Capability::EgressPaths);
            if grant.methods().is_some() {
                set.insert(Capability::EgressMethods);
            }
        }
        set
    }

    /// Methods named by allowlist rules (for backends that declare which method tokens they enforce).
    pub fn egress_methods_named(&self) -> BTreeSet<&str> {
        self.egress_allow
            .iter()
            .filter_map(|e| match e {
                EgressEntry::Rule(r) => r.methods(),
                EgressEntry::Host(_) => None,
            })
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

/// Builds a [`SandboxSpec`]; [`build`](Self::build) validates everything.
#[derive(Debug, Clone)]
#[must_use]
pub struct SandboxSpecBuilder {
    spec: SandboxSpec,
}

impl SandboxSpecBuilder {
    /// Sets the image reference.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.spec.image = Some(image.into());
        self
    }
    /// Sets the pinned image id.
    pub fn image_id(mut self, image_id: impl Into<String>) -> Self {
        self.spec.image_id = Some(image_id.into());
        self
    }
    /// Sets the egress mode.
    pub fn egress(mut self, egress: Egress) -> Self {
        self.spec.egress = egress;
        self
    }
    /// Adds an allowlist entry (a host string or a rule).
    pub fn allow(mut self, entry: impl Into<EgressEntry>) -> Self {
        self.spec.egress_allow.push(entry.into());
        self
    }
    /// Attaches a credential grant to this acquire: the sandbox's requests to the grant's origin,
    /// methods and paths carry its token, which never enters the guest. The grant's host must be
    /// allowed by the allowlist; at most [`MAX_CREDENTIALS`] grants.
    pub fn credential(mut self, grant: CredentialGrant) -> Self {
        self.spec.credentials.push(grant);
        self
    }
    /// Sets the storage base; `None` lets the backend choose.
    pub fn work_dir(mut self, work_dir: Option<impl Into<String>>) -> Self {
        self.spec.work_dir = work_dir.map(Into::into);
        self
    }
    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.spec.labels.insert(key.into(), value.into());
        self
    }
    /// Adds a required capability.
    pub fn require(mut self, capability: Capability) -> Self {
        self.spec.requires.insert(capability);
        self
    }
    /// Replaces the required capabilities.
    pub fn requires(mut self, capabilities: impl IntoIterator<Item = Capability>) -> Self {
        self.spec.requires = capabilities.into_iter().collect();
        self
    }
    /// Sets the spec's own isolation floor.
    pub fn min_isolation(mut self, floor: Isolation) -> Self {
        self.spec.min_isolation = Some(floor);
        self
    }
    /// Sets the cap on files going in.
    pub fn files_in(mut self, limits: TransferLimits) -> Self {
        self.spec.files_in = limits;
        self
    }
    /// Sets the cap on files coming out.
    pub fn files_out(mut self, limits: TransferLimits) -> Self {
        self.spec.files_out = limits;
        self
    }
    /// Sets the isolation scope.
    pub fn isolation_scope(mut self, scope: IsolationScope) -> Self {
        self.spec.isolation_scope = scope;
        self
    }
    /// Requires an OS family.
    pub fn requires_os_family(mut self, family: OsFamily) -> Self {
        self.spec.requires_os_family = Some(family);
        self
    }

    /// Sets the weakest cleanup the host may apply between two uses (default `reclaim`).
    pub fn min_cleanup(mut self, rung: CleanupRung) -> Self {
        self.spec.min_cleanup = rung;
        self
    }

    /// Validates and returns the spec. Every refusal is [`SandboxError::InvalidArgument`].
    pub fn build(self) -> Result<SandboxSpec, SandboxError> {
        let mut spec = self.spec;
        if spec.kind.is_empty() || spec.kind.contains('\0') {
            return Err(SandboxError::invalid(
                "spec kind must be non-empty and free of NUL",
            ));
        }
        match (spec.egress, spec.egress_allow.is_empty()) {
            (Egress::Allowlist, true) => {
                return Err(SandboxError::invalid(
                    "egress allowlist needs at least one allowed host",
                ))
            }
            (Egress::Allowlist, false) | (_, true) => {}
            (mode, false) => {
                return Err(SandboxError::invalid(format!(
                    "egress_allow is only meaningful with egress allowlist, not {mode}"
                )))
            }
        }
        spec.egress_allow = dedupe_allowlist(std::mem::take(&mut spec.egress_allow))?;
        check_credentials(&spec)?;
        if spec.requires.contains(&Capability::Reclaim) {
            return Err(SandboxError::invalid(
                "reclaim is a backend-only capability; a spec cannot require it",
            ));
        }
        if let Some(base) = &spec.work_dir {
            if !base.starts_with('/') || base.contains('\0') {
                return Err(SandboxError::invalid(format!(
                    "work_dir {base:?} must be absolute and free of NUL"
                )));
            }
        }
        if let Some(bad) = spec.labels.keys().find(|k| !is_label_key(k)) {
            return Err(SandboxError::invalid(format!(
                "label key {bad:?} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,62}}"
            )));
        }
        Ok(spec)
    }
}

/// Validates every entry, collapses bare rules, and dedupes by host case-insensitively: the same policy
/// keeps the first spelling, a different policy for one host is refused.
fn dedupe_allowlist(entries: Vec<EgressEntry>) -> Result<Vec<EgressEntry>, SandboxError> {
    let mut kept: Vec<EgressEntry> = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.normalise()?;
        match kept
            .iter()
            .find(|k| k.host().eq_ignore_ascii_case(entry.host()))
        {
            Some(existing) if existing.same_policy(&entry) => {}
            Some(existing) => {
                return Err(SandboxError::invalid(format!(
                    "two different egress rules for one host: {existing} and {entry}"
                )))
            }
            None => kept.push(entry),
        }
    }
    Ok(kept)
}

/// The most credential grants one spec carries.
pub const MAX_CREDENTIALS: usize = 64;

/// Grants need allowlist egress, a host the allowlist allows, and no exact repeat.
fn check_credentials(spec: &SandboxSpec) -> Result<(), SandboxError> {
    if spec.credentials.is_empty() {
        return Ok(());
    }
    if spec.egress != Egress::Allowlist {
        return Err(SandboxError::invalid(format!(
            "credential grants need egress allowlist, not {}",
            spec.egress
        )));
    }
    if spec.credentials.len() > MAX_CREDENTIALS {
        return Err(SandboxError::invalid(format!(
            "{} credential grants; at most {MAX_CREDENTIALS}",
            spec.credentials.len()
        )));
    }
    for (at, grant) in spec.credentials.iter().enumerate() {
        if !spec
            .egress_allow
            .iter()
            .any(|entry| host_allows(entry.host(), grant.host()))
        {
            return Err(SandboxError::invalid(format!(
                "the credential grant for {} is for a host the allowlist does not allow",
                grant.host()
            )));
        }
        if spec.credentials[..at].contains(grant) {
            return Err(SandboxError::invalid(format!(
                "the credential grant for {}:{} is given twice",
                grant.host(),
                grant.port()
            )));
        }
    }
    Ok(())
}

/// Whether allowlist entry host `pattern` (`name` or `*.d`, any case) allows exact `host`: `*.d`
/// allows the names under `d`, never `d` itself.
fn host_allows(pattern: &str, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let pattern = pattern.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => host == pattern,
    }
}

fn is_label_key(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EgressRule, ErrorKind};

    fn invalid(b: SandboxSpecBuilder) -> String {
        let err = b.build().expect_err("spec should be refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        err.to_string()
    }

    #[test]
    fn defaults() {
        let s = SandboxSpec::builder("k").build().unwrap();
        assert_eq!(s.kind(), "k");
        assert_eq!(s.egress(), Egress::Closed);
        assert_eq!(s.work_dir(), Some(DEFAULT_WORK_DIR));
        assert_eq!(s.requires(), &Capability::defaults());
        assert_eq!(s.isolation_scope(), IsolationScope::Conversation);
        assert_eq!(s.files_in(), TransferLimits::default());
        assert_eq!(s.image(), None);
        assert_eq!(s.min_isolation(), None);
        assert_eq!(s.requires_os_family(), None);
        assert_eq!(s.min_cleanup(), CleanupRung::Reclaim);
        let reset = SandboxSpec::builder("k")
            .min_cleanup(CleanupRung::Reset)
            .require(Capability::Snapshot)
            .build()
            .unwrap();
        assert_eq!(reset.min_cleanup(), CleanupRung::Reset);
        assert!(reset
            .required_capabilities()
            .contains(&Capability::Snapshot));
    }

    #[test]
    fn refusals() {
        invalid(SandboxSpec::builder(""));
        invalid(SandboxSpec::builder("a\0b"));
        invalid(SandboxSpec::builder("k").egress(Egress::Allowlist));
        invalid(SandboxSpec::builder("k").allow("example.com"));
        invalid(
            SandboxSpec::builder("k")
                .egress(Egress::Unrestricted)
                .allow("example.com"),
        );
        invalid(
            SandboxSpec::builder("k")
                .egress(Egress::Allowlist)
                .allow("*"),
        );
        invalid(
            SandboxSpec::builder("k")
                .egress(Egress::Allowlist)
                .allow("10.0.0.5"),
        );
        invalid(SandboxSpec::builder("k").require(Capability::Reclaim));
        invalid(SandboxSpec::builder("k").work_dir(Some("relative/base")));
        invalid(SandboxSpec::builder("k").work_dir(Some("/a\0b")));
        invalid(SandboxSpec::builder("k").label("a=b", "v"));
        invalid(SandboxSpec::builder("k").label("", "v"));
        invalid(SandboxSpec::builder("k").label("-x", "v"));
        invalid(SandboxSpec::builder("k").label("x".repeat(64), "v"));
        SandboxSpec::builder("k")
            .label("x".repeat(63), "any value = fine")
            .build()
            .unwrap();
        SandboxSpec::builder("k")
            .work_dir(None::<String>)
            .build()
            .unwrap();
    }

    #[test]
    fn allowlist_dedupe() {
        let s = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow("Example.com")
            .allow("example.COM")
            .allow(EgressEntry::Rule(
                EgressRule::new("example.com", None, None).unwrap(),
            ))
            .allow("other.org")
            .build()
            .unwrap();
        assert_eq!(
            s.egress_allow(),
            &[
                EgressEntry::Host("Example.com".into()),
                EgressEntry::Host("other.org".into())
            ]
        );
        let get = EgressRule::new("api.x.com", Some(vec!["GET".into()]), None).unwrap();
        let post = EgressRule::new("API.x.com", Some(vec!["POST".into()]), None).unwrap();
        let msg = invalid(
            SandboxSpec::builder("k")
                .egress(Egress::Allowlist)
                .allow(EgressEntry::Rule(get.clone()))
                .allow(EgressEntry::Rule(post)),
        );
        assert!(msg.contains("two different egress rules"), "{msg}");
        invalid(
            SandboxSpec::builder("k")
                .egress(Egress::Allowlist)
                .allow("api.x.com")
                .allow(EgressEntry::Rule(get)),
        );
    }

    #[test]
    fn the_same_rule_written_in_another_order_is_the_same_policy() {
        let a =
            EgressRule::new("api.x.com", Some(vec!["GET".into(), "POST".into()]), None).unwrap();
        let b =
            EgressRule::new("API.x.com", Some(vec!["POST".into(), "GET".into()]), None).unwrap();
        let s = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow(EgressEntry::Rule(a.clone()))
            .allow(EgressEntry::Rule(b))
            .build()
            .unwrap();
        assert_eq!(
            s.egress_allow(),
            &[EgressEntry::Rule(a)],
            "the first spelling is kept"
        );
    }

    #[test]
    fn derived_requirements() {
        let rule =
            EgressRule::new("a.com", Some(vec!["GET".into()]), Some(vec!["/x".into()])).unwrap();
        let s = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow(EgressEntry::Rule(rule))
            .build()
            .unwrap();
        let req = s.required_capabilities();
        assert!(req.contains(&Capability::EgressMethods));
        assert!(req.contains(&Capability::EgressPaths));
        assert!(!s.requires().contains(&Capability::EgressMethods));
        assert_eq!(
            s.egress_methods_named().into_iter().collect::<Vec<_>>(),
            vec!["GET"]
        );
    }

    fn grant(host: &str, methods: Option<Vec<String>>) -> crate::credential::CredentialGrant {
        crate::credential::CredentialGrant::new(
            host,
            443,
            methods,
            vec!["/v1/*".into()],
            crate::credential::BearerToken::new("tok").unwrap(),
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000_000),
        )
        .unwrap()
    }

    #[test]
    fn credentials_need_an_allowed_host_and_add_their_capabilities() {
        let allow = |b: SandboxSpecBuilder| {
            b.egress(Egress::Allowlist)
                .allow("api.example.com")
                .allow("*.svc.test")
        };
        let s = allow(SandboxSpec::builder("k"))
            .credential(grant("api.example.com", None))
            .build()
            .unwrap();
        assert_eq!(s.credentials().len(), 1);
        let req = s.required_capabilities();
        assert!(req.contains(&Capability::EgressPaths));
        assert!(!req.contains(&Capability::EgressMethods));
        let s = allow(SandboxSpec::builder("k"))
            .credential(grant("API.example.com", Some(vec!["GET".into()])))
            .credential(grant("a.svc.test", None))
            .build()
            .unwrap();
        assert!(s
            .required_capabilities()
            .contains(&Capability::EgressMethods));
        assert!(SandboxSpec::builder("k")
            .build()
            .unwrap()
            .credentials()
            .is_empty());

        let msg = invalid(SandboxSpec::builder("k").credential(grant("api.example.com", None)));
        assert!(msg.contains("need egress allowlist"), "{msg}");
        for host in [
            "other.com",
            "svc.test",
            "example.com",
            "xsvc.test",
            "a.api.example.com",
        ] {
            let msg = invalid(allow(SandboxSpec::builder("k")).credential(grant(host, None)));
            assert!(msg.contains("does not allow"), "{host}: {msg}");
        }
        let msg = invalid(
            allow(SandboxSpec::builder("k"))
                .credential(grant("api.example.com", None))
                .credential(grant("api.example.com", None)),
        );
        assert!(msg.contains("twice"), "{msg}");
        let mut many = allow(SandboxSpec::builder("k"));
        for n in 0..=MAX_CREDENTIALS {
            many = many.credential(grant(&format!("h{n}.svc.test"), None));
        }
        let msg = invalid(many);
        assert!(msg.contains("at most 64"), "{msg}");
        let shown = format!("{:?}", s);
        assert!(!shown.contains("tok\""), "{shown}");
    }
}
