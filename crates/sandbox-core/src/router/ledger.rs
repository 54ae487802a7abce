//! What the router remembers: the instances it has served, and the unclean ledger.
//!
//! The ledger maps a conversation key to the failure that made it unclean (if one is known) and its pending
//! targets. A host-requested disposal places an in-flight marker per target before its first await; when it
//! returns, each target that landed removes its own marker and every failed record it covers, and each
//! target that failed turns its marker into a failed record (unless the policy is `Keep`). The key is clean
//! again when nothing is pending.

use std::collections::{BTreeSet, HashMap};

use crate::{DisposalCode, DisposalFailure, DisposeSelector, SandboxKey};

/// One disposal target: a backend (by registration index), optionally narrowed to a kind and an instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Target {
    pub(crate) backend: usize,
    pub(crate) kind: Option<String>,
    pub(crate) instance_id: Option<String>,
}

impl Target {
    /// Every sandbox of the key on one backend.
    pub(crate) fn sweep(backend: usize) -> Self {
        Target {
            backend,
            kind: None,
            instance_id: None,
        }
    }

    pub(crate) fn selector(&self) -> DisposeSelector {
        DisposeSelector {
            kind: self.kind.clone(),
            instance_id: self.instance_id.clone(),
        }
    }

    /// Whether a landed disposal of `self` also disposed of everything `other` names.
    fn covers(&self, other: &Target) -> bool {
        self.backend == other.backend
            && (self.kind.is_none() || self.kind == other.kind)
            && (self.instance_id.is_none() || self.instance_id == other.instance_id)
    }

    fn covers_instance(&self, backend: usize, kind: &str, instance_id: &str) -> bool {
        self.backend == backend
            && self.kind.as_deref().is_none_or(|k| k == kind)
            && self.instance_id.as_deref().is_none_or(|i| i == instance_id)
    }
}

#[derive(Debug, Clone)]
struct Pending {
    target: Target,
    /// The disposal that placed this marker while it runs; `None` for a failed record.
    in_flight: Option<u64>,
}

#[derive(Debug, Default)]
struct Entry {
    failure: Option<DisposalFailure>,
    pending: Vec<Pending>,
}

impl Entry {
    fn add_failed(&mut self, target: Target) {
        let exists = self
            .pending
            .iter()
            .any(|p| p.in_flight.is_none() && p.target == target);
        if !exists {
            self.pending.push(Pending {
                target,
                in_flight: None,
            });
        }
    }
}

/// The router's mutable state, behind one synchronous lock that is never held across an await.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// (key, kind, backend) → the instance id last served.
    remembered: HashMap<(SandboxKey, String, usize), String>,
    ledger: HashMap<SandboxKey, Entry>,
    /// Conversations (scope, thread) with a `dispose_scope` in flight, counted.
    purges: HashMap<(String, String), usize>,
    /// Acquires in flight, by token: the key each one watches and whether that key turned unclean since
    /// (even if it is clean again by the time the backend answers).
    watches: HashMap<u64, (SandboxKey, bool)>,
    next_token: u64,
}

impl State {
    /// `Some(code)` when the key is unclean (`code` is that of the failure, when one is known).
    pub(crate) fn unclean(&self, key: &SandboxKey) -> Option<Option<DisposalCode>> {
        if let Some(entry) = self.ledger.get(key) {
            if !entry.pending.is_empty() {
                return Some(entry.failure.as_ref().map(|f| f.code));
            }
        }
        let conversation = (key.scope.clone(), key.thread_id.clone());
        if self.purges.get(&conversation).is_some_and(|n| *n > 0) {
            return Some(None);
        }
        None
    }

    /// The failure recorded for an unclean key.
    pub(crate) fn failure(&self, key: &SandboxKey) -> Option<DisposalFailure> {
        self.ledger.get(key).and_then(|e| e.failure.clone())
    }

    /// The failed (not in-flight) targets of a key.
    pub(crate) fn failed_targets(&self, key: &SandboxKey) -> Vec<Target> {
        let mut out: Vec<Target> = Vec::new();
        for p in self.ledger.get(key).map_or(&[][..], |e| &e.pending[..]) {
            if p.in_flight.is_none() && !out.contains(&p.target) {
                out.push(p.target.clone());
            }
        }
        out
    }

    /// Places in-flight markers for a disposal of a conversation key; call keys are never recorded.
    pub(crate) fn begin(&mut self, key: &SandboxKey, targets: &[Target]) -> Option<u64> {
        if key.is_call() || targets.is_empty() {
            return None;
        }
        self.next_token += 1;
        let token = self.next_token;
        self.touch_key(key);
        let entry = self.ledger.entry(key.clone()).or_default();
        entry.pending.extend(targets.iter().map(|t| Pending {
            target: t.clone(),
            in_flight: Some(token),
        }));
        Some(token)
    }

    /// Applies a disposal's results: landed targets forget their instances and clear what they cover;
    /// failed ones become failed records when `record` allows (conversation keys only).
    pub(crate) fn settle(
        &mut self,
        key: &SandboxKey,
        token: Option<u64>,
        results: &[(Target, Option<DisposalFailure>)],
        record: bool,
    ) {
        let mut failures = Vec::new();
        for (target, failure) in results {
            if failure.is_none() {
                self.forget(key, target);
            }
            let Some(entry) = self.ledger.get_mut(key) else {
                if let (Some(f), true, false) = (failure, record, key.is_call()) {
                    let entry = self.ledger.entry(key.clone()).or_default();
                    entry.add_failed(target.clone());
                    failures.push(f.clone());
                }
                continue;
            };
            if let Some(t) = token {
                if let Some(i) = entry
                    .pending
                    .iter()
                    .position(|p| p.in_flight == Some(t) && &p.target == target)
                {
                    entry.pending.remove(i);
                }
            }
            match failure {
                None => entry
                    .pending
                    .retain(|p| p.in_flight.is_some() || !target.covers(&p.target)),
                Some(f) if record && !key.is_call() => {
                    entry.add_failed(target.clone());
                    failures.push(f.clone());
                }
                Some(_) => {}
            }
        }
        if !failures.is_empty() {
            self.touch_key(key);
        }
        if let Some(entry) = self.ledger.get_mut(key) {
            if let Some(f) = DisposalFailure::fold(failures) {
                entry.failure = Some(f);
            }
            if entry.pending.is_empty() {
                self.ledger.remove(key);
            }
        }
    }

    /// Records a failure for a conversation key with the given targets (a host's `mark_unclean`).
    pub(crate) fn record(&mut self, key: &SandboxKey, targets: &[Target], reason: DisposalFailure) {
        if key.is_call() || targets.is_empty() {
            return;
        }
        self.touch_key(key);
        let entry = self.ledger.entry(key.clone()).or_default();
        for t in targets {
            entry.add_failed(t.clone());
        }
        entry.failure = Some(reason);
    }

    /// Starts watching `key` for an acquire in flight; see [`turned_unclean`](Self::turned_unclean).
    pub(crate) fn watch(&mut self, key: &SandboxKey) -> u64 {
        self.next_token += 1;
        self.watches.insert(self.next_token, (key.clone(), false));
        self.next_token
    }

    /// Whether the watched key turned unclean at any moment since [`watch`](Self::watch), including a
    /// disposal that started and landed in between.
    pub(crate) fn turned_unclean(&self, token: u64) -> bool {
        self.watches.get(&token).is_some_and(|(_, turned)| *turned)
    }

    pub(crate) fn unwatch(&mut self, token: u64) {
        self.watches.remove(&token);
    }

    fn touch_key(&mut self, key: &SandboxKey) {
        for (watched, turned) in self.watches.values_mut() {
            if watched == key {
                *turned = true;
            }
        }
    }

    pub(crate) fn remember(&mut self, key: &SandboxKey, kind: &str, backend: usize, id: &str) {
        self.remembered
            .insert((key.clone(), kind.to_owned(), backend), id.to_owned());
    }

    pub(crate) fn remembered(&self, key: &SandboxKey, kind: &str, backend: usize) -> Option<&str> {
        self.remembered
            .get(&(key.clone(), kind.to_owned(), backend))
            .map(String::as_str)
    }

    /// The kind and backend under which `key`'s instance `id` was last served.
    pub(crate) fn served_instance(&self, key: &SandboxKey, id: &str) -> Option<(String, usize)> {
        self.remembered
            .iter()
            .find(|((k, _, _), served)| k == key && served.as_str() == id)
            .map(|((_, kind, backend), _)| (kind.clone(), *backend))
    }

    /// The backends that served `key` (for one kind, or any).
    pub(crate) fn served_by(&self, key: &SandboxKey, kind: Option<&str>) -> BTreeSet<usize> {
        self.remembered
            .keys()
            .filter(|(k, knd, _)| k == key && kind.is_none_or(|x| x == knd))
            .map(|(_, _, b)| *b)
            .collect()
    }

    fn forget(&mut self, key: &SandboxKey, target: &Target) {
        self.remembered
            .retain(|(k, kind, b), id| !(k == key && target.covers_instance(*b, kind, id)));
    }

    pub(crate) fn purge_begin(&mut self, scope: &str, thread_id: &str) {
        for (watched, turned) in self.watches.values_mut() {
            if watched.scope == scope && watched.thread_id == thread_id {
                *turned = true;
            }
        }
        *self
            .purges
            .entry((scope.to_owned(), thread_id.to_owned()))
            .or_default() += 1;
    }

    pub(crate) fn purge_end(&mut self, scope: &str, thread_id: &str) {
        let conversation = (scope.to_owned(), thread_id.to_owned());
        if let Some(n) = self.purges.get_mut(&conversation) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.purges.remove(&conversation);
            }
        }
    }

    /// Applies one backend's `dispose_scope` result to a conversation: success forgets its instances and
    /// clears its failed records; failure (when `record` allows) marks every known conversation key.
    pub(crate) fn purge_settle(
        &mut self,
        scope: &str,
        thread_id: &str,
        backend: usize,
        failure: Option<&DisposalFailure>,
        record: bool,
    ) {
        let in_conversation = |k: &SandboxKey| k.scope == scope && k.thread_id == thread_id;
        match failure {
            None => {
                self.remembered
                    .retain(|(k, _, b), _| !(in_conversation(k) && *b == backend));
                for (k, entry) in self.ledger.iter_mut() {
                    if in_conversation(k) {
                        entry
                            .pending
                            .retain(|p| p.in_flight.is_some() || p.target.backend != backend);
                    }
                }
                self.ledger.retain(|_, e| !e.pending.is_empty());
            }
            Some(f) if record => {
                let keys: BTreeSet<SandboxKey> = self
                    .remembered
                    .keys()
                    .map(|(k, _, _)| k)
                    .chain(self.ledger.keys())
                    .filter(|k| in_conversation(k) && !k.is_call())
                    .cloned()
                    .collect();
                for k in keys {
                    let entry = self.ledger.entry(k).or_default();
                    entry.add_failed(Target::sweep(backend));
                    entry.failure = Some(f.clone());
                }
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SandboxKey {
        SandboxKey::conversation("s", "t", "a")
    }

    fn refused(detail: &str) -> DisposalFailure {
        DisposalFailure::new(DisposalCode::Refused, detail)
    }

    #[test]
    fn markers_make_a_key_unclean_until_they_land() {
        let mut s = State::default();
        let targets = [Target::sweep(0), Target::sweep(1)];
        let token = s.begin(&key(), &targets);
        assert_eq!(s.unclean(&key()), Some(None));
        s.settle(
            &key(),
            token,
            &[(targets[0].clone(), None), (targets[1].clone(), None)],
            true,
        );
        assert_eq!(s.unclean(&key()), None);
    }

    #[test]
    fn a_failed_target_stays_pending_until_a_covering_disposal_lands() {
        let mut s = State::default();
        let narrow = Target {
            backend: 0,
            kind: Some("py".into()),
            instance_id: Some("i1".into()),
        };
        let token = s.begin(&key(), std::slice::from_ref(&narrow));
        s.settle(&key(), token, &[(narrow.clone(), Some(refused("x")))], true);
        assert_eq!(s.unclean(&key()), Some(Some(DisposalCode::Refused)));
        assert_eq!(s.failed_targets(&key()), vec![narrow.clone()]);

        // Another backend's landing, or another kind's, covers nothing.
        let other = Target {
            backend: 0,
            kind: Some("node".into()),
            instance_id: None,
        };
        s.settle(
            &key(),
            None,
            &[(Target::sweep(1), None), (other, None)],
            true,
        );
        assert!(s.unclean(&key()).is_some());

        // A sweep of the kind on the right backend covers the instance.
        let kind = Target {
            backend: 0,
            kind: Some("py".into()),
            instance_id: None,
        };
        s.settle(&key(), None, &[(kind, None)], true);
        assert_eq!(s.unclean(&key()), None);
    }

    #[test]
    fn one_disposal_never_clears_another_in_flight() {
        let mut s = State::default();
        let t = Target::sweep(0);
        let first = s.begin(&key(), std::slice::from_ref(&t));
        let second = s.begin(&key(), std::slice::from_ref(&t));
        s.settle(&key(), first, &[(t.clone(), None)], true);
        assert_eq!(s.unclean(&key()), Some(None), "the second is still running");
        s.settle(&key(), second, &[(t, None)], true);
        assert_eq!(s.unclean(&key()), None);
    }

    #[test]
    fn keep_and_call_keys_write_nothing() {
        let mut s = State::default();
        let t = Target::sweep(0);
        let token = s.begin(&key(), std::slice::from_ref(&t));
        s.settle(&key(), token, &[(t.clone(), Some(refused("x")))], false);
        assert_eq!(s.unclean(&key()), None);

        let call = key().with_call("c");
        assert_eq!(s.begin(&call, std::slice::from_ref(&t)), None);
        s.settle(&call, None, &[(t.clone(), Some(refused("x")))], true);
        s.record(&call, &[t], refused("y"));
        assert_eq!(s.unclean(&call), None);
    }

    #[test]
    fn landing_forgets_only_covered_instances() {
        let mut s = State::default();
        s.remember(&key(), "py", 0, "i1");
        s.remember(&key(), "node", 0, "i2");
        s.remember(&key(), "py", 1, "i3");
        let stale = Target {
            backend: 0,
            kind: Some("py".into()),
            instance_id: Some("old".into()),
        };
        s.settle(&key(), None, &[(stale, None)], true);
        assert_eq!(s.remembered(&key(), "py", 0), Some("i1"));
        s.settle(&key(), None, &[(Target::sweep(0), None)], true);
        assert_eq!(s.remembered(&key(), "py", 0), None);
        assert_eq!(s.remembered(&key(), "node", 0), None);
        assert_eq!(s.remembered(&key(), "py", 1), Some("i3"));
        assert_eq!(s.served_by(&key(), None), BTreeSet::from([1]));
    }

    #[test]
    fn a_watch_sees_a_disposal_that_came_and_went() {
        let mut s = State::default();
        let watched = s.watch(&key());
        let call = s.watch(&key().with_call("c"));
        let other = s.watch(&SandboxKey::conversation("s", "t", "b"));
        let t = Target::sweep(0);
        let token = s.begin(&key(), std::slice::from_ref(&t));
        s.settle(&key(), token, &[(t, None)], true);
        assert_eq!(s.unclean(&key()), None, "clean again");
        assert!(s.turned_unclean(watched), "but it was unclean meanwhile");
        assert!(!s.turned_unclean(call), "call keys are never unclean");
        assert!(!s.turned_unclean(other));

        s.purge_begin("s", "t");
        s.purge_end("s", "t");
        assert!(s.turned_unclean(call) && s.turned_unclean(other));
        for w in [watched, call, other] {
            s.unwatch(w);
        }
        assert!(s.watches.is_empty());
    }

    #[test]
    fn purges_mark_the_conversation_while_in_flight() {
        let mut s = State::default();
        s.purge_begin("s", "t");
        assert_eq!(s.unclean(&key()), Some(None));
        assert_eq!(s.unclean(&SandboxKey::conversation("s", "u", "a")), None);
        s.purge_end("s", "t");
        assert_eq!(s.unclean(&key()), None);
    }
}
