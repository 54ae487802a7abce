//! The operator's method and path rules and credential grants (`--rule`, `--credential-file`),
//! applied to each sandbox the server makes. The model chooses neither: it may narrow a
//! sandbox's hosts (`allow_hosts`), and a sandbox then gets the rules and grants that concern
//! the hosts it kept, never a host it did not ask for, and never a host without the rules the
//! operator set for it.
//!
//! A grant's token lives in the server's memory only (`CredentialGrant` never prints it), goes
//! to the backend with the spec, and never appears in a tool's result, error or the log.

use sandbox_backends::egress_flags::{parse_rule, read_credentials};
use sandbox_core::credential::CredentialGrant;
use sandbox_core::{Egress, EgressEntry, EgressRule, SandboxBackend, SandboxError, SandboxSpec};

use crate::config::Cli;

/// The rules and grants the operator configured.
#[derive(Debug, Clone, Default)]
pub struct OperatorEgress {
    /// Method and path rules, each for one host entry (a name or `*.d`).
    pub rules: Vec<EgressRule>,
    /// Credential grants, each for one exact host and port.
    pub grants: Vec<CredentialGrant>,
}

/// Whether allowlist entry `entry` (a name or `*.d`) allows every host `host` names (a name or
/// `*.d`): the same name, or a strict subdomain (or subdomain wildcard) of a `*.d` entry.
fn covers(entry: &str, host: &str) -> bool {
    if entry.eq_ignore_ascii_case(host) {
        return true;
    }
    let Some(domain) = entry.strip_prefix("*.") else {
        return false;
    };
    let host = host.strip_prefix("*.").unwrap_or(host);
    host.len() > domain.len() + 1
        && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
        && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain)
}

impl OperatorEgress {
    /// Reads the operator's `--rule`s and `--credential-file`s (the files through the guarded
    /// opener of host reads, which admits no write, as `sandboxctl run` reads them) and checks
    /// them against `--allow`.
    ///
    /// # Errors
    /// A rule or file that does not parse (naming the flag and the file, never a token), a path
    /// the guard refuses, or a configuration no sandbox could have ([`OperatorEgress::check`]).
    pub async fn from_flags(
        cli: &Cli,
        backend: &dyn SandboxBackend,
    ) -> Result<OperatorEgress, SandboxError> {
        let rules = cli
            .rules
            .iter()
            .map(|rule| parse_rule(rule))
            .collect::<Result<Vec<_>, _>>()?;
        let grants = read_credentials(&cli.backends, backend, &cli.credential_files).await?;
        let egress = OperatorEgress { rules, grants };
        egress.check(&cli.allow_hosts)?;
        Ok(egress)
    }

    /// The server's allowlist: the `--allow` hosts, and the host of every rule no `--allow`
    /// entry already covers (a rule allows its host, narrowed, as `sandboxctl run --rule` does).
    pub fn server_hosts(&self, allow: &[String]) -> Vec<String> {
        let mut hosts = allow.to_vec();
        for rule in &self.rules {
            if !hosts.iter().any(|h| covers(h, rule.host())) {
                hosts.push(rule.host().to_owned());
            }
        }
        hosts
    }

    /// The allowlist entries and grants of a sandbox whose hosts are `hosts` (the server's, or
    /// the model's narrowing of them): a host a rule names, or a rule's `*.d` covers, is allowed
    /// only as that rule says; a rule for a host under one of `hosts`' `*.d` entries narrows that
    /// host too; a grant goes along when one of `hosts` covers its host.
    ///
    /// # Errors
    /// InvalidArgument when a rule cannot be restated for a narrowed host (it always can: the
    /// host passed the allowlist grammar already).
    pub fn for_hosts(
        &self,
        hosts: &[String],
    ) -> Result<(Vec<EgressEntry>, Vec<CredentialGrant>), SandboxError> {
        let mut entries = Vec::new();
        for host in hosts {
            let exact = self
                .rules
                .iter()
                .find(|r| r.host().eq_ignore_ascii_case(host));
            let wider = self.rules.iter().find(|r| covers(r.host(), host));
            let entry = match (exact, wider) {
                (Some(rule), _) => EgressEntry::Rule(rule.clone()),
                (None, Some(rule)) => EgressEntry::Rule(EgressRule::new(
                    host.as_str(),
                    rule.methods().map(<[String]>::to_vec),
                    rule.paths().map(<[String]>::to_vec),
                )?),
                (None, None) => EgressEntry::Host(host.clone()),
            };
            entries.push(entry);
        }
        for rule in &self.rules {
            let named = hosts.iter().any(|h| h.eq_ignore_ascii_case(rule.host()));
            if !named && hosts.iter().any(|h| covers(h, rule.host())) {
                entries.push(EgressEntry::Rule(rule.clone()));
            }
        }
        let grants = self
            .grants
            .iter()
            .filter(|g| hosts.iter().any(|h| covers(h, g.host())))
            .cloned()
            .collect();
        Ok((entries, grants))
    }

    /// Checks the configuration as a whole: one rule a host, and the spec of a sandbox with every
    /// server host, its rules and its grants must build (grants on allowed hosts, no repeats).
    ///
    /// # Errors
    /// The spec's refusal (InvalidArgument; it names hosts, never a token).
    pub fn check(&self, allow: &[String]) -> Result<(), SandboxError> {
        if self.rules.is_empty() && self.grants.is_empty() {
            return Ok(());
        }
        for (at, rule) in self.rules.iter().enumerate() {
            if let Some(twice) = self.rules[..at]
                .iter()
                .find(|r| r.host().eq_ignore_ascii_case(rule.host()))
            {
                return Err(SandboxError::invalid(format!(
                    "two --rule for one host: {twice} and {rule}; give one rule its methods and paths"
                )));
            }
        }
        let hosts = self.server_hosts(allow);
        let (entries, grants) = self.for_hosts(&hosts)?;
        if grants.len() != self.grants.len() {
            return Err(SandboxError::invalid(
                "a --credential-file names a host the server's --allow and --rule do not allow",
            ));
        }
        let mut spec = SandboxSpec::builder("default").egress(Egress::Allowlist);
        for entry in entries {
            spec = spec.allow(entry);
        }
        for grant in grants {
            spec = spec.credential(grant);
        }
        spec.build().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::credential::BearerToken;
    use std::time::{Duration, SystemTime};

    const SECRET: &str = "operator-SECRET-token";

    fn rule(text: &str) -> EgressRule {
        sandbox_backends::egress_flags::parse_rule(text).unwrap()
    }

    fn grant(host: &str) -> CredentialGrant {
        CredentialGrant::new(
            host,
            443,
            None,
            vec!["/v1/*".into()],
            BearerToken::new(SECRET).unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800),
        )
        .unwrap()
    }

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|h| (*h).to_owned()).collect()
    }

    #[test]
    fn covering_is_the_allowlist_rule() {
        assert!(covers("a.test", "A.test"));
        assert!(covers("*.test", "a.test"));
        assert!(covers("*.test", "b.a.test"));
        assert!(covers("*.test", "*.a.test"));
        assert!(!covers("*.test", "test"));
        assert!(!covers("*.test", "*.test.x"));
        assert!(!covers("*.a.test", "ba.test"));
        assert!(!covers("a.test", "*.a.test"));
        assert!(!covers("a.test", "b.test"));
    }

    #[test]
    fn rules_narrow_their_hosts_in_every_sandbox() {
        let operator = OperatorEgress {
            rules: vec![
                rule("api.test GET /v1/*"),
                rule("*.svc.test POST /hook"),
                rule("only.test * /x"),
            ],
            grants: vec![grant("api.test")],
        };
        let allow = hosts(&["api.test", "*.svc.test", "*.wide.test", "plain.test"]);
        let server = operator.server_hosts(&allow);
        assert_eq!(
            server,
            hosts(&[
                "api.test",
                "*.svc.test",
                "*.wide.test",
                "plain.test",
                "only.test"
            ])
        );
        let (entries, grants) = operator.for_hosts(&server).unwrap();
        assert_eq!(
            entries,
            vec![
                EgressEntry::Rule(rule("api.test GET /v1/*")),
                EgressEntry::Rule(rule("*.svc.test POST /hook")),
                EgressEntry::Host("*.wide.test".into()),
                EgressEntry::Host("plain.test".into()),
                EgressEntry::Rule(rule("only.test * /x")),
            ]
        );
        assert_eq!(grants, vec![grant("api.test")]);
        // Narrowed by the model: a host under a rule's `*.d` keeps the rule's methods and paths,
        // a rule for a host under a kept `*.d` still applies, a grant goes only where its host
        // is kept.
        let (entries, grants) = operator
            .for_hosts(&hosts(&["a.svc.test", "plain.test"]))
            .unwrap();
        assert_eq!(
            entries,
            vec![
                EgressEntry::Rule(rule("a.svc.test POST /hook")),
                EgressEntry::Host("plain.test".into()),
            ]
        );
        assert!(grants.is_empty());
        let wide = OperatorEgress {
            rules: vec![rule("api.wide.test GET /v1/*")],
            grants: vec![grant("api.wide.test")],
        };
        let (entries, grants) = wide.for_hosts(&hosts(&["*.wide.test"])).unwrap();
        assert_eq!(
            entries,
            vec![
                EgressEntry::Host("*.wide.test".into()),
                EgressEntry::Rule(rule("api.wide.test GET /v1/*")),
            ]
        );
        assert_eq!(grants.len(), 1);
        operator.check(&allow).unwrap();
        wide.check(&hosts(&["*.wide.test"])).unwrap();
    }

    #[test]
    fn a_bad_configuration_is_refused_without_its_token() {
        let stray = OperatorEgress {
            rules: Vec::new(),
            grants: vec![grant("elsewhere.test")],
        };
        let twice = OperatorEgress {
            rules: vec![rule("api.test GET /v1/*"), rule("api.test POST /v1/*")],
            grants: Vec::new(),
        };
        for (operator, allow) in [
            (&stray, hosts(&["api.test"])),
            (&twice, hosts(&["api.test"])),
        ] {
            let error = operator.check(&allow).unwrap_err();
            assert_eq!(error.kind(), sandbox_core::ErrorKind::InvalidArgument);
            let text = format!("{error} {error:?} {operator:?}");
            assert!(!text.contains(SECRET), "{text}");
        }
        assert!(OperatorEgress::default().check(&[]).is_ok());
    }
}
