//! The allowlist and the host matcher.
//!
//! Entries pass sandbox-core's allowlist grammar ([`sandbox_core::egress::validate_host`]):
//! DNS names, optionally `*.`-prefixed, never IP literals. A request host matches an entry
//! exactly (ASCII case-insensitively), or a `*.d` entry when it is a strict subdomain of `d`
//! (`x.d`, `y.x.d`, never `d` itself). An IP-literal request host never matches, since no
//! entry can be one.

use std::collections::BTreeSet;

use sandbox_core::egress::validate_host;

use crate::error::ProxyError;
use crate::head::Host;

/// A validated, non-empty allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    exact: BTreeSet<String>,
    /// The `d` of every `*.d` entry.
    domains: BTreeSet<String>,
}

impl Allowlist {
    /// Validates and lower-cases every entry.
    ///
    /// # Errors
    /// [`ProxyError::InvalidAllow`] naming the first entry the grammar refuses;
    /// [`ProxyError::InvalidConfig`] when there is no entry.
    pub fn new<I, S>(entries: I) -> Result<Allowlist, ProxyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Allowlist {
            exact: BTreeSet::new(),
            domains: BTreeSet::new(),
        };
        for entry in entries {
            let entry = entry.as_ref();
            validate_host(entry).map_err(|error| invalid_allow(entry, error.to_string()))?;
            let lower = entry.to_ascii_lowercase();
            match lower.strip_prefix("*.") {
                Some(domain) => list.domains.insert(domain.to_owned()),
                None => list.exact.insert(lower),
            };
        }
        if list.exact.is_empty() && list.domains.is_empty() {
            return Err(crate::error::invalid_config(
                "the allowlist is empty; give at least one --allow",
            ));
        }
        Ok(list)
    }

    /// Whether `host` (a parsed request host) is allowed.
    pub fn allows(&self, host: &Host) -> bool {
        match host {
            Host::Ip(_) => false,
            Host::Name(name) => self.allows_name(name),
        }
    }

    /// Whether the host name `name` is allowed (compared ASCII case-insensitively). A name
    /// that is not well formed (an empty label, a character other than letters, digits, `-`
    /// and `_`) is never allowed.
    pub fn allows_name(&self, name: &str) -> bool {
        let well_formed = name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
        if !well_formed {
            return false;
        }
        let lower = name.to_ascii_lowercase();
        if self.exact.contains(&lower) {
            return true;
        }
        lower
            .match_indices('.')
            // Well formed, so no dot is first: every suffix after a dot has a label before it.
            .any(|(at, _)| self.domains.contains(&lower[at + 1..]))
    }

    /// The entries in display form (`*.d` for wildcards), sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut all: Vec<String> = self.exact.iter().cloned().collect();
        all.extend(self.domains.iter().map(|d| format!("*.{d}")));
        all.sort();
        all
    }
}

#[cold]
fn invalid_allow(entry: &str, reason: String) -> ProxyError {
    ProxyError::InvalidAllow {
        entry: entry.to_owned(),
        reason,
    }
}

/// The matcher's plain model, shared by the property tests here and the fuzz target.
#[cfg(test)]
#[path = "hostmatch_model.rs"]
mod hostmatch_model;

#[cfg(test)]
mod tests {
    use super::hostmatch_model::model;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_and_wildcard_entries_match_as_specified() {
        let list = Allowlist::new(["PyPI.org", "*.example.com"]).unwrap();
        assert!(list.allows_name("pypi.org"));
        assert!(list.allows_name("PYPI.ORG"));
        assert!(!list.allows_name("files.pypi.org"));
        assert!(!list.allows_name("pypi.org.evil.test"));
        assert!(list.allows_name("a.example.com"));
        assert!(list.allows_name("b.A.Example.Com"));
        assert!(!list.allows_name("example.com"));
        assert!(!list.allows_name("badexample.com"));
        assert!(!list.allows_name(".example.com"));
        assert!(!list.allows_name("a..example.com"));
        assert!(!list.allows_name("a b.example.com"));
        assert!(!list.allows_name("pypi.org."));
        assert!(!list.allows(&Host::Ip("93.184.216.34".parse().unwrap())));
        assert_eq!(list.entries(), vec!["*.example.com", "pypi.org"]);
    }

    #[test]
    fn entries_follow_the_core_grammar() {
        for bad in [
            "*",
            "10.0.0.1",
            "exa mple.com",
            "*.",
            "a..b",
            "",
            "127.1",
            "0x7f",
        ] {
            let error = Allowlist::new([bad]).unwrap_err();
            assert!(
                matches!(error, ProxyError::InvalidAllow { .. }),
                "{bad:?}: {error}"
            );
        }
        let empty: [&str; 0] = [];
        assert!(matches!(
            Allowlist::new(empty).unwrap_err(),
            ProxyError::InvalidConfig(_)
        ));
    }

    fn label() -> impl Strategy<Value = String> {
        prop_oneof!["[a-c]", "[a-c][a-c0-9-]{0,2}[a-c]", Just("x".to_owned())]
    }

    fn name() -> impl Strategy<Value = String> {
        proptest::collection::vec(label(), 1..4).prop_map(|labels| labels.join("."))
    }

    proptest! {
        #[test]
        fn the_matcher_agrees_with_the_model(
            entries in proptest::collection::vec((any::<bool>(), name()), 1..4),
            host in name(),
            upper in any::<bool>(),
        ) {
            let entries: Vec<String> = entries
                .into_iter()
                .map(|(wild, n)| if wild { format!("*.{n}") } else { n })
                .collect();
            let list = Allowlist::new(&entries).unwrap();
            let host = if upper { host.to_ascii_uppercase() } else { host };
            prop_assert_eq!(list.allows_name(&host), model(&entries, &host), "{:?} {}", entries, host);
        }
    }
}
