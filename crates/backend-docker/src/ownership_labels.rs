//! Names, labels and ownership: what a container is labelled
//! with at create, how a listing selects by label, and how an inspected container is judged.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_core::naming::docker::{
    docker_key_label, label_value, LABEL_AGENT, LABEL_CALL, LABEL_KEY_V1, LABEL_KIND, LABEL_SCOPE,
    LABEL_THREAD, LABEL_USER_PREFIX, LABEL_WORK_DIR_V1,
};
use sandbox_core::SandboxKey;
use serde::Deserialize;

/// The labels a workload carries, in a stable order.
pub(crate) fn workload_labels(
    key: &SandboxKey,
    kind: &str,
    user_labels: &BTreeMap<String, String>,
    base: &str,
) -> Vec<(String, String)> {
    let mut labels = vec![
        (LABEL_SCOPE.to_owned(), label_value(&key.scope)),
        (LABEL_THREAD.to_owned(), label_value(&key.thread_id)),
        (LABEL_AGENT.to_owned(), label_value(&key.agent_id)),
        (LABEL_KIND.to_owned(), label_value(kind)),
    ];
    if key.is_call() {
        labels.push((LABEL_CALL.to_owned(), label_value(&key.call_id)));
    }
    for (name, value) in user_labels {
        labels.push((format!("{LABEL_USER_PREFIX}{name}"), label_value(value)));
    }
    let key_label = docker_key_label(key);
    if !key_label.is_empty() {
        labels.push((LABEL_KEY_V1.to_owned(), key_label));
    }
    labels.push((LABEL_WORK_DIR_V1.to_owned(), base.to_owned()));
    labels
}

/// Which containers a listing selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerSelector {
    pub(crate) scope: String,
    pub(crate) thread: Option<String>,
    pub(crate) agent: Option<String>,
    pub(crate) call: Option<String>,
    pub(crate) kind: Option<String>,
}

impl ContainerSelector {
    /// A key's containers: scope, thread, agent, plus the call for a call key (a conversation key
    /// adds none, so it also sweeps that agent's call-scoped leftovers), plus the kind when given.
    pub(crate) fn of_key(key: &SandboxKey, kind: Option<&str>) -> Self {
        ContainerSelector {
            scope: key.scope.clone(),
            thread: Some(key.thread_id.clone()),
            agent: Some(key.agent_id.clone()),
            call: key.is_call().then(|| key.call_id.clone()),
            kind: kind.map(str::to_owned),
        }
    }

    /// The container listing's `label` filters (`name=value`, each value through `label_value`);
    /// the engine selects containers carrying all of them.
    pub(crate) fn label_filters(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut push = |label: &str, raw: &str| {
            args.push(format!("{label}={}", label_value(raw)));
        };
        push(LABEL_SCOPE, &self.scope);
        for (label, value) in [
            (LABEL_THREAD, &self.thread),
            (LABEL_AGENT, &self.agent),
            (LABEL_CALL, &self.call),
            (LABEL_KIND, &self.kind),
        ] {
            if let Some(value) = value {
                push(label, value);
            }
        }
        args
    }

    /// Whether a remembered (key, kind) falls in this selection.
    pub(crate) fn matches(&self, key: &SandboxKey, kind: &str) -> bool {
        key.scope == self.scope
            && self.thread.as_ref().is_none_or(|t| *t == key.thread_id)
            && self.agent.as_ref().is_none_or(|a| *a == key.agent_id)
            && self.call.as_ref().is_none_or(|c| *c == key.call_id)
            && self.kind.as_ref().is_none_or(|k| k == kind)
    }
}

/// What `docker container inspect --format '{{json .}}'` says about one container.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ContainerRecord {
    #[serde(rename = "Id")]
    pub(crate) id: String,
    #[serde(rename = "Name", default)]
    pub(crate) name: String,
    #[serde(rename = "Created", default)]
    pub(crate) created: Option<String>,
    /// The id of the image it was made from (`sha256:…`).
    #[serde(rename = "Image", default)]
    pub(crate) image_id: Option<String>,
    #[serde(rename = "State", default)]
    pub(crate) state: Option<StateRecord>,
    #[serde(rename = "Config", default)]
    pub(crate) config: Option<ConfigRecord>,
    #[serde(rename = "HostConfig", default)]
    pub(crate) host_config: Option<HostConfigRecord>,
    #[serde(rename = "Mounts", default)]
    pub(crate) mounts: Option<Vec<serde_json::Value>>,
    /// A claimed pool member's ownership labels, from its claim record (labels cannot change on
    /// a container, so a member made for the pool carries the key it was claimed for there):
    /// they stand for its own labels in every rule. `None` for any other container.
    #[serde(skip)]
    pub(crate) claim: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct StateRecord {
    #[serde(rename = "Status", default)]
    pub(crate) status: String,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ConfigRecord {
    #[serde(rename = "Image", default)]
    pub(crate) image: Option<String>,
    #[serde(rename = "Labels", default)]
    pub(crate) labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "User", default)]
    pub(crate) user: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct HostConfigRecord {
    #[serde(rename = "CapDrop", default)]
    cap_drop: Option<Vec<String>>,
    #[serde(rename = "CapAdd", default)]
    cap_add: Option<Vec<String>>,
    #[serde(rename = "Privileged", default)]
    privileged: Option<bool>,
    #[serde(rename = "NetworkMode", default)]
    network_mode: Option<String>,
    #[serde(rename = "Init", default)]
    init: Option<bool>,
    #[serde(rename = "Binds", default)]
    binds: Option<Vec<String>>,
    #[serde(rename = "Mounts", default)]
    mounts: Option<Vec<serde_json::Value>>,
    #[serde(rename = "PortBindings", default)]
    port_bindings: Option<serde_json::Value>,
    #[serde(rename = "Runtime", default)]
    runtime: Option<String>,
}

/// How a container fails the ownership rules, first failure first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Ownership 1: its labels do not name this key and kind.
    NotOurs,
    /// Ownership 2: it records another storage base (or none).
    OtherBase(Option<String>),
    /// Ownership 3: it runs another image.
    OtherImage(Option<String>),
    /// Ownership 4: its runtime policy differs.
    OtherPolicy(String),
}

impl ContainerRecord {
    /// Reads an engine answer about one container.
    pub(crate) fn from_api<T: serde::Serialize>(answer: &T) -> Result<ContainerRecord, String> {
        serde_json::to_value(answer)
            .and_then(serde_json::from_value)
            .map_err(|e| format!("unreadable inspect answer: {e}"))
    }

    /// Parses one inspect answer.
    #[cfg(test)]
    pub(crate) fn parse(line: &[u8]) -> Result<ContainerRecord, String> {
        serde_json::from_slice(line).map_err(|e| format!("unreadable inspect answer: {e}"))
    }

    /// The engine's status word (`running`, `exited`, ...).
    pub(crate) fn status(&self) -> &str {
        self.state.as_ref().map_or("", |s| s.status.as_str())
    }

    /// The container's ownership labels: a claimed pool member's claim record, else its own.
    pub(crate) fn labels(&self) -> BTreeMap<String, String> {
        match &self.claim {
            Some(claim) => claim.clone(),
            None => self.own_labels(),
        }
    }

    /// The labels the container was created with.
    pub(crate) fn own_labels(&self) -> BTreeMap<String, String> {
        self.config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default()
    }

    /// Whether it is a pool member no longer under a pool name: its owner is its claim record.
    pub(crate) fn is_claimed_member(&self) -> bool {
        crate::pool_names::made_for_pool(&self.own_labels())
            && !crate::pool_names::is_pool_name(self.bare_name())
    }

    /// Its `Config.Image`.
    pub(crate) fn image(&self) -> Option<&str> {
        self.config.as_ref().and_then(|c| c.image.as_deref())
    }

    /// Its configured user (`Config.User`; empty: the image's default, root).
    pub(crate) fn user(&self) -> &str {
        self.config
            .as_ref()
            .and_then(|c| c.user.as_deref())
            .unwrap_or("")
    }

    /// Whether it runs as root (see [`user_is_root`]).
    pub(crate) fn runs_as_root(&self) -> bool {
        user_is_root(
            self.config
                .as_ref()
                .and_then(|c| c.user.as_deref())
                .unwrap_or(""),
        )
    }

    /// The egress volume it was made with, read from its labels: `<name>-egress` when it carries
    /// an egress policy label, else none.
    pub(crate) fn expected_egress_volume(&self) -> Option<String> {
        self.labels()
            .contains_key(crate::egress_names::LABEL_EGRESS_V1)
            .then(|| crate::egress_names::volume_name(self.bare_name()))
    }

    /// Its name without the leading `/`.
    pub(crate) fn bare_name(&self) -> &str {
        self.name.trim_start_matches('/')
    }

    /// The storage base recorded at create.
    pub(crate) fn work_dir(&self) -> Option<String> {
        self.labels().get(LABEL_WORK_DIR_V1).cloned()
    }

    /// Ownership 1: scope, thread, agent and kind labels equal this key's; the call label present
    /// and equal for a call key, absent for a conversation key.
    pub(crate) fn owned_by(&self, key: &SandboxKey, kind: Option<&str>) -> bool {
        let labels = self.labels();
        let is = |label: &str, raw: &str| labels.get(label) == Some(&label_value(raw));
        let call_ok = if key.is_call() {
            is(LABEL_CALL, &key.call_id)
        } else {
            !labels.contains_key(LABEL_CALL)
        };
        is(LABEL_SCOPE, &key.scope)
            && is(LABEL_THREAD, &key.thread_id)
            && is(LABEL_AGENT, &key.agent_id)
            && kind.is_none_or(|k| is(LABEL_KIND, k))
            && call_ok
    }

    /// Ownership 4: every capability dropped, none added, not privileged, on `network` (`none`
    /// outside the live tests' unsafe seam), `--init`, no bind, mount or published port, except,
    /// for an allowlist sandbox, exactly its egress volume read-only at `/run/maf-egress`. `None`
    /// when the policy holds, else what differs.
    pub(crate) fn policy_difference(
        &self,
        network: &str,
        egress_volume: Option<&str>,
    ) -> Option<String> {
        let Some(host) = &self.host_config else {
            return Some("it reports no host configuration".to_owned());
        };
        let normalise = |caps: &Option<Vec<String>>| -> BTreeSet<String> {
            caps.iter()
                .flatten()
                .map(|c| {
                    let upper = c.to_uppercase();
                    upper.strip_prefix("CAP_").unwrap_or(&upper).to_owned()
                })
                .collect()
        };
        if normalise(&host.cap_drop) != BTreeSet::from(["ALL".to_owned()]) {
            return Some("it does not drop every capability".to_owned());
        }
        if !normalise(&host.cap_add).is_empty() {
            return Some("it adds capabilities".to_owned());
        }
        if host.privileged == Some(true) {
            return Some("it is privileged".to_owned());
        }
        if host.network_mode.as_deref() != Some(network) {
            return Some(format!(
                "its network is {:?}, not {network}",
                host.network_mode.as_deref().unwrap_or("")
            ));
        }
        if host.init != Some(true) {
            return Some("it runs without --init".to_owned());
        }
        if host.binds.as_ref().is_some_and(|b| !b.is_empty()) {
            return Some("it has binds or mounts".to_owned());
        }
        let requested = host.mounts.as_deref().unwrap_or_default();
        let mounted = self.mounts.as_deref().unwrap_or_default();
        match egress_volume {
            None if !requested.is_empty() || !mounted.is_empty() => {
                return Some("it has binds or mounts".to_owned());
            }
            None => {}
            Some(volume) => {
                let field = |v: &serde_json::Value, name: &str| {
                    v.get(name).cloned().unwrap_or(serde_json::Value::Null)
                };
                let requested_ok = requested.iter().all(|m| {
                    field(m, "Type") == "volume"
                        && field(m, "Source") == volume
                        && field(m, "Target") == crate::egress_names::EGRESS_MOUNT
                        && field(m, "ReadOnly") == true
                });
                let mounted_ok = mounted.len() == 1
                    && mounted.iter().all(|m| {
                        field(m, "Type") == "volume"
                            && field(m, "Name") == volume
                            && field(m, "Destination") == crate::egress_names::EGRESS_MOUNT
                            && field(m, "RW") == false
                    });
                if !(requested_ok && mounted_ok) {
                    return Some(format!(
                        "it does not have exactly its egress volume {volume} mounted read-only at {}",
                        crate::egress_names::EGRESS_MOUNT
                    ));
                }
            }
        }
        let ports = match &host.port_bindings {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Object(map)) => !map.is_empty(),
            Some(_) => true,
        };
        if ports {
            return Some("it publishes ports".to_owned());
        }
        None
    }

    /// Ownership 4, the runtime: a backend configured with a runtime serves only containers
    /// made under it (a container made under the engine's default, runc, must never pass for a
    /// gVisor sandbox). Without one, any runtime serves: the engine's default is its own
    /// setting, and a stronger runtime takes nothing away. `None` when it holds, else what
    /// differs.
    pub(crate) fn runtime_difference(&self, expected: Option<&str>) -> Option<String> {
        let expected = expected?;
        let actual = self
            .host_config
            .as_ref()
            .and_then(|host| host.runtime.as_deref())
            .unwrap_or("");
        (actual != expected).then(|| format!("it runs under runtime {actual:?}, not {expected}"))
    }

    /// The ownership rules in order, first failure wins. `image` is `None` for `find`, which has no
    /// spec; `network` is the configured workload network (`none`); `egress_volume` is the
    /// allowlist sandbox's volume, `None` for egress closed; `runtime` is the configured OCI
    /// runtime ([`runtime_difference`](Self::runtime_difference)).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn verify(
        &self,
        key: &SandboxKey,
        kind: &str,
        base: Option<&str>,
        image: Option<&str>,
        network: &str,
        egress_volume: Option<&str>,
        runtime: Option<&str>,
    ) -> Result<(), Verdict> {
        if !self.owned_by(key, Some(kind)) {
            return Err(Verdict::NotOurs);
        }
        if let Some(base) = base {
            let recorded = self.work_dir();
            if recorded.as_deref() != Some(base) {
                return Err(Verdict::OtherBase(recorded));
            }
        }
        if let Some(image) = image {
            if self.image() != Some(image) {
                return Err(Verdict::OtherImage(self.image().map(str::to_owned)));
            }
        }
        match self
            .policy_difference(network, egress_volume)
            .or_else(|| self.runtime_difference(runtime))
        {
            Some(difference) => Err(Verdict::OtherPolicy(difference)),
            None => Ok(()),
        }
    }

    /// `.Created` as a time, when it parses.
    pub(crate) fn created_at(&self) -> Option<SystemTime> {
        self.created.as_deref().and_then(parse_rfc3339)
    }
}

/// Parses the engine's RFC 3339 timestamps (`2026-11-30T05:58:03.906470888Z`, or with an offset).
pub(crate) fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let bytes = text.as_bytes();
    if bytes.len() < 20
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b'T' | b't' | b' ')
    {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(range)?;
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if bytes[13] != b':'
        || bytes[16] != b':'
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos: u32 = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut padded = fraction[..digits.min(9)].to_owned();
        while padded.len() < 9 {
            padded.push('0');
        }
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_seconds: i64 = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    let seconds = u64::try_from(seconds).ok()?;
    Some(UNIX_EPOCH + Duration::new(seconds, nanos))
}

/// Whether a container or image `user` setting means root: none, `root` or uid 0 (a group after
/// `:` aside).
pub(crate) fn user_is_root(user: &str) -> bool {
    matches!(user.split(':').next().unwrap_or(""), "" | "root" | "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SandboxKey {
        SandboxKey::conversation("prod", "thread-1", "agent")
    }

    fn record(labels: &[(String, String)], host: &str) -> ContainerRecord {
        let labels: BTreeMap<_, _> = labels.iter().cloned().collect();
        let json = format!(
            r#"{{"Id":"abc","Name":"/maf-sandbox-docker-x","Created":"2026-11-30T05:58:03.906470888Z",
            "State":{{"Status":"running"}},"Config":{{"Image":"sandbox-base:local","Labels":{}}},
            "HostConfig":{host},"Mounts":[]}}"#,
            serde_json::to_string(&labels).unwrap()
        );
        ContainerRecord::parse(json.as_bytes()).unwrap()
    }

    const HARDENED: &str = r#"{"CapDrop":["ALL"],"CapAdd":null,"Privileged":false,"NetworkMode":"none","Init":true,"Binds":null,"PortBindings":{}}"#;

    #[test]
    fn a_configured_runtime_serves_only_its_own_containers() {
        let labels = workload_labels(&key(), "python", &BTreeMap::new(), "/w");
        let under = |runtime: &str| {
            let open = HARDENED.strip_suffix('}').unwrap();
            let host = format!(r#"{open},"Runtime":"{runtime}"}}"#);
            record(&labels, &host)
        };
        let verify = |record: &ContainerRecord, runtime: Option<&str>| {
            record.verify(&key(), "python", Some("/w"), None, "none", None, runtime)
        };
        assert_eq!(verify(&under("runsc"), Some("runsc")), Ok(()));
        // A runc container under the gVisor sandbox's name is refused, never served as gVisor.
        let Err(Verdict::OtherPolicy(why)) = verify(&under("runc"), Some("runsc")) else {
            panic!("a runc container passed for runsc");
        };
        assert!(why.contains("\"runc\"") && why.contains("runsc"), "{why}");
        assert!(verify(&record(&labels, HARDENED), Some("runsc")).is_err());
        // Without a configured runtime, the engine's default or a stronger one both serve.
        assert_eq!(verify(&under("runc"), None), Ok(()));
        assert_eq!(verify(&under("runsc"), None), Ok(()));
        // The other rules still come first.
        assert_eq!(
            under("runsc").verify(&key(), "other", None, None, "none", None, Some("runsc")),
            Err(Verdict::NotOurs)
        );
    }

    #[test]
    fn a_claimed_pool_member_is_judged_by_its_claim_record_only() {
        let pool = crate::pool_names::pool_key("0123456789abcdef");
        let own = workload_labels(&pool, crate::pool_names::POOL_KIND, &BTreeMap::new(), "/w");
        let mut member = record(&own, HARDENED);
        member.name = "/maf-sandbox-pool-0123456789abcdef-deadbeef".to_owned();
        // Under a pool name it is the pool's, whatever else it is.
        assert!(!member.is_claimed_member());
        assert!(member.owned_by(&pool, Some(crate::pool_names::POOL_KIND)));
        assert!(!member.owned_by(&key(), Some("python")));
        // Renamed away from it, its own labels no longer count: the record's do.
        member.name = "/maf-sandbox-docker-aef172d1c789".to_owned();
        assert!(member.is_claimed_member());
        member.claim = Some(
            workload_labels(&key(), "python", &BTreeMap::new(), "/w")
                .into_iter()
                .collect(),
        );
        assert_eq!(
            member.verify(&key(), "python", Some("/w"), None, "none", None, None),
            Ok(())
        );
        assert!(!member.owned_by(&pool, None));
        assert_eq!(member.work_dir().as_deref(), Some("/w"));
        // With no record it belongs to no key.
        member.claim = Some(BTreeMap::new());
        assert_eq!(
            member.verify(&key(), "python", None, None, "none", None, None),
            Err(Verdict::NotOurs)
        );
        assert!(!member.owned_by(&pool, None));
        // A container never made for the pool is never judged by a record.
        let plain = record(
            &workload_labels(&key(), "python", &BTreeMap::new(), "/w"),
            HARDENED,
        );
        assert!(!plain.is_claimed_member());
    }

    #[test]
    fn labels_carry_every_field_and_the_raw_base() {
        let call_key = key().with_call("call 1");
        let user = BTreeMap::from([("team".to_owned(), "a b".to_owned())]);
        let labels = workload_labels(&call_key, "python", &user, "/srv/a,b");
        let map: BTreeMap<_, _> = labels.into_iter().collect();
        assert_eq!(map[LABEL_SCOPE], "prod");
        assert_eq!(map[LABEL_CALL], label_value("call 1"));
        assert!(map[LABEL_CALL].starts_with("sha256-"));
        assert_eq!(map["maf-sandbox.label.team"], label_value("a b"));
        assert_eq!(map[LABEL_WORK_DIR_V1], "/srv/a,b");
        assert_eq!(map[LABEL_KEY_V1], docker_key_label(&call_key));
        let conversation = workload_labels(&key(), "python", &BTreeMap::new(), "/w");
        assert!(!conversation.iter().any(|(k, _)| k == LABEL_CALL));
    }

    #[test]
    fn filters_use_label_values() {
        let sel = ContainerSelector::of_key(&key().with_call("c"), Some("py thon"));
        let args = sel.label_filters();
        assert_eq!(args[0], "maf-sandbox.scope=prod");
        assert!(args.contains(&"maf-sandbox.call=c".to_owned()));
        assert!(args.contains(&format!("maf-sandbox.kind={}", label_value("py thon"))));
        let conversation = ContainerSelector::of_key(&key(), None);
        assert_eq!(conversation.label_filters().len(), 3);
        assert!(conversation.matches(&key().with_call("x"), "any"));
        assert!(!ContainerSelector::of_key(&key().with_call("x"), None).matches(&key(), "k"));
    }

    #[test]
    fn verification_order() {
        let labels = workload_labels(&key(), "python", &BTreeMap::new(), "/maf-sandbox/work");
        let ok = record(&labels, HARDENED);
        assert_eq!(
            ok.verify(
                &key(),
                "python",
                Some("/maf-sandbox/work"),
                Some("sandbox-base:local"),
                "none",
                None,
                None
            ),
            Ok(())
        );
        assert_eq!(
            ok.verify(&key(), "other", None, None, "none", None, None),
            Err(Verdict::NotOurs)
        );
        assert_eq!(
            ok.verify(
                &key().with_call("c"),
                "python",
                None,
                None,
                "none",
                None,
                None
            ),
            Err(Verdict::NotOurs)
        );
        assert_eq!(
            ok.verify(
                &key(),
                "python",
                Some("/other"),
                Some("x"),
                "none",
                None,
                None
            ),
            Err(Verdict::OtherBase(Some("/maf-sandbox/work".into())))
        );
        assert_eq!(
            ok.verify(
                &key(),
                "python",
                Some("/maf-sandbox/work"),
                Some("x"),
                "none",
                None,
                None
            ),
            Err(Verdict::OtherImage(Some("sandbox-base:local".into())))
        );
        assert_eq!(ok.bare_name(), "maf-sandbox-docker-x");
        assert!(ok.created_at().is_some());
    }

    #[test]
    fn policy_differences() {
        let labels = workload_labels(&key(), "k", &BTreeMap::new(), "/w");
        let cases = [
            (
                r#"{"CapDrop":["cap_all"],"NetworkMode":"none","Init":true}"#,
                None,
            ),
            (
                r#"{"CapDrop":["ALL"],"NetworkMode":"none","Init":false}"#,
                Some("--init"),
            ),
            (
                r#"{"CapDrop":null,"NetworkMode":"none","Init":true}"#,
                Some("capability"),
            ),
            (
                r#"{"CapDrop":["ALL"],"CapAdd":["NET_RAW"],"NetworkMode":"none","Init":true}"#,
                Some("adds"),
            ),
            (
                r#"{"CapDrop":["ALL"],"NetworkMode":"bridge","Init":true}"#,
                Some("network"),
            ),
            (
                r#"{"CapDrop":["ALL"],"NetworkMode":"none","Init":true,"Privileged":true}"#,
                Some("privileged"),
            ),
            (
                r#"{"CapDrop":["ALL"],"NetworkMode":"none","Init":true,"Binds":["/:/host"]}"#,
                Some("binds"),
            ),
            (
                r#"{"CapDrop":["ALL"],"NetworkMode":"none","Init":true,"PortBindings":{"80/tcp":[]}}"#,
                Some("ports"),
            ),
        ];
        for (host, want) in cases {
            let difference = record(&labels, host).policy_difference("none", None);
            match want {
                None => assert_eq!(difference, None, "{host}"),
                Some(word) => assert!(
                    difference.as_deref().unwrap_or("").contains(word),
                    "{host}: {difference:?}"
                ),
            }
        }
        // The network is compared with the configured one: `none` refuses an open container,
        // which only the live tests' unsafe seam expects.
        let open = record(
            &labels,
            r#"{"CapDrop":["ALL"],"NetworkMode":"bridge","Init":true}"#,
        );
        assert_eq!(open.policy_difference("bridge", None), None);
        let refused = open.policy_difference("none", None).unwrap_or_default();
        assert!(refused.contains("\"bridge\", not none"), "{refused}");
    }

    #[test]
    fn an_allowlist_workload_has_exactly_its_volume_read_only() {
        let labels = workload_labels(&key(), "k", &BTreeMap::new(), "/w");
        let with_mounts = |requested: &str, mounted: &str| {
            let mut r = record(
                &labels,
                &format!(
                    r#"{{"CapDrop":["ALL"],"NetworkMode":"none","Init":true,"Mounts":{requested}}}"#
                ),
            );
            r.mounts = serde_json::from_str(mounted).unwrap();
            r
        };
        let good_req =
            r#"[{"Type":"volume","Source":"v-egress","Target":"/run/maf-egress","ReadOnly":true}]"#;
        let good_mnt =
            r#"[{"Type":"volume","Name":"v-egress","Destination":"/run/maf-egress","RW":false}]"#;
        let ok = with_mounts(good_req, good_mnt);
        assert_eq!(ok.policy_difference("none", Some("v-egress")), None);
        // A closed sandbox never has it; another volume, a writable mount or a second one fail.
        assert!(ok
            .policy_difference("none", None)
            .unwrap()
            .contains("mounts"));
        assert!(ok.policy_difference("none", Some("w-egress")).is_some());
        let writable = with_mounts(
            r#"[{"Type":"volume","Source":"v-egress","Target":"/run/maf-egress","ReadOnly":false}]"#,
            r#"[{"Type":"volume","Name":"v-egress","Destination":"/run/maf-egress","RW":true}]"#,
        );
        assert!(writable
            .policy_difference("none", Some("v-egress"))
            .is_some());
        let two = with_mounts(
            good_req,
            r#"[{"Type":"volume","Name":"v-egress","Destination":"/run/maf-egress","RW":false},
                {"Type":"bind","Source":"/","Destination":"/host","RW":false}]"#,
        );
        assert!(two.policy_difference("none", Some("v-egress")).is_some());
        let missing = with_mounts("[]", "[]");
        assert!(missing
            .policy_difference("none", Some("v-egress"))
            .is_some());
        let bridged = record(
            &labels,
            r#"{"CapDrop":["ALL"],"NetworkMode":"bridge","Init":true}"#,
        );
        assert!(bridged
            .policy_difference("none", Some("v-egress"))
            .unwrap()
            .contains("network"));
    }

    #[test]
    fn root_users() {
        let labels = workload_labels(&key(), "k", &BTreeMap::new(), "/w");
        let mut r = record(&labels, HARDENED);
        for (user, root) in [
            (None, true),
            (Some(""), true),
            (Some("root"), true),
            (Some("0:0"), true),
            (Some("65532"), false),
            (Some("proxy:proxy"), false),
        ] {
            r.config.as_mut().unwrap().user = user.map(str::to_owned);
            assert_eq!(r.runs_as_root(), root, "{user:?}");
        }
    }

    #[test]
    fn timestamps() {
        let t = parse_rfc3339("1970-01-02T00:00:01.5Z").unwrap();
        assert_eq!(t, UNIX_EPOCH + Duration::new(86_401, 500_000_000));
        let t = parse_rfc3339("2000-03-01T00:00:00+01:00").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 951_865_200);
        assert!(parse_rfc3339("2000-13-01T00:00:00Z").is_none());
        assert!(parse_rfc3339("garbage").is_none());
        assert!(parse_rfc3339("0001-01-01T00:00:00Z").is_none());
    }
}
