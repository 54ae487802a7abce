//! The handles the model holds: opaque random names bound to the principal that made them.
//!
//! A handle is 128 random bits from the operating system's generator, so it cannot be guessed
//! from another. Every lookup names the principal: a handle made by another principal answers
//! exactly as one never made ([`Lookup::Unknown`]). A handle idle for longer than the time to
//! live is taken out by [`HandleTable::take_expired`] and answers [`Lookup::Expired`] to its own
//! principal afterwards (a bounded memory of expired handles).
//!
//! A sandbox whose disposal has begun (disposed of by its principal, or expired) stays in the
//! table, out of the live handles, until its disposal succeeds: a failed disposal (or one whose
//! caller went away) is retried by its principal's next `sandbox_dispose` and at the server's end
//! ([`HandleTable::take_all`]).
//!
//! The table also counts the creates in flight by their keys, so the server's end can wait for
//! them and dispose of what they made, and it holds the server to its limits: a create begins
//! only while its principal, and the server as a whole, hold fewer sandboxes than the limits
//! allow (live ones, those being made and those whose disposal has not succeeded all count, as
//! each holds an instance on the engine).
//!
//! The table does no I/O: the server disposes of what it hands back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{Sandbox, SandboxKey, SandboxSpec};
use tokio::time::Instant;

/// Who is calling: the stdio client, or an HTTP principal from the token file.
pub type Principal = Arc<str>;

/// How many expired handles are remembered, to answer "expired" rather than "unknown".
const EXPIRED_MEMORY: usize = 4096;

/// One sandbox the server made.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The principal that made it.
    pub principal: Principal,
    /// Its key (scope and agent from the server, thread unique to it).
    pub key: SandboxKey,
    /// The spec it was made with (its kind; a fork is made with it too).
    pub spec: Arc<SandboxSpec>,
    /// The live sandbox.
    pub sandbox: Arc<dyn Sandbox>,
    /// The egress it was created with, for `sandbox_list`.
    pub egress: Vec<String>,
    last_used: Instant,
    in_use: usize,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The caller's live sandbox.
    Found(Entry),
    /// Never made, made by another principal, or disposed of.
    Unknown,
    /// The caller's, disposed of after its idle time to live.
    Expired,
}

/// The live handles and a bounded memory of expired ones.
#[derive(Debug)]
pub struct HandleTable {
    ttl: Duration,
    live: HashMap<String, Entry>,
    /// Sandboxes whose disposal began and has not succeeded, by handle.
    undisposed: HashMap<String, Entry>,
    expired: HashMap<String, Principal>,
    expired_order: VecDeque<String>,
    /// The keys of the sandboxes being created, not bound to a handle yet, and their principals.
    creating: Vec<(SandboxKey, Principal)>,
    /// The server is ending: no create may begin.
    ending: bool,
}

/// How many sandboxes may be held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// By one principal.
    pub per_principal: usize,
    /// By the whole server.
    pub total: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            per_principal: 8,
            total: 32,
        }
    }
}

/// Why a create may not begin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CreateRefusal {
    /// The server is ending.
    Ending,
    /// The principal holds as many sandboxes as one principal may (the limit).
    PrincipalLimit(usize),
    /// The server holds as many sandboxes as it may (the limit).
    ServerLimit(usize),
}

/// A fresh handle: `sbx_` and 32 hex digits (128 random bits).
///
/// # Errors
/// The operating system's random source fails: nothing safe can be handed out, and nothing is
/// made up instead.
pub fn new_handle() -> std::io::Result<String> {
    Ok(format!("sbx_{}", host_state::random_hex(32)?))
}

impl HandleTable {
    /// An empty table whose handles expire after `ttl` idle.
    pub fn new(ttl: Duration) -> Self {
        HandleTable {
            ttl,
            live: HashMap::new(),
            undisposed: HashMap::new(),
            expired: HashMap::new(),
            expired_order: VecDeque::new(),
            creating: Vec::new(),
            ending: false,
        }
    }

    /// The idle time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Binds `handle` (a [`new_handle`]) to `principal`: the sandbox of `spec`'s kind under
    /// `key`.
    pub fn insert(
        &mut self,
        handle: String,
        principal: Principal,
        key: SandboxKey,
        spec: SandboxSpec,
        sandbox: Arc<dyn Sandbox>,
        egress: Vec<String>,
    ) {
        self.live.insert(
            handle,
            Entry {
                principal,
                key,
                spec: Arc::new(spec),
                sandbox,
                egress,
                last_used: Instant::now(),
                in_use: 0,
            },
        );
    }

    /// Records a create of `key` for `principal` in flight, until
    /// [`end_create`](Self::end_create). Refused (and nothing recorded) once the server is
    /// ending, or when the principal or the server already holds as many sandboxes as `limits`
    /// allow.
    pub fn begin_create(
        &mut self,
        key: SandboxKey,
        principal: Principal,
        limits: SandboxLimits,
    ) -> Result<(), CreateRefusal> {
        if self.ending {
            return Err(CreateRefusal::Ending);
        }
        let held = self.held_by(&principal);
        if held >= limits.per_principal {
            return Err(CreateRefusal::PrincipalLimit(limits.per_principal));
        }
        if self.held() >= limits.total {
            return Err(CreateRefusal::ServerLimit(limits.total));
        }
        self.creating.push((key, principal));
        Ok(())
    }

    /// Every sandbox the server holds an instance of: live, being made, or not yet disposed of.
    pub fn held(&self) -> usize {
        self.live.len() + self.undisposed.len() + self.creating.len()
    }

    /// The sandboxes `principal` holds, counted as [`held`](Self::held) does.
    pub fn held_by(&self, principal: &str) -> usize {
        let owned = |e: &Entry| &*e.principal == principal;
        self.live.values().filter(|e| owned(e)).count()
            + self.undisposed.values().filter(|e| owned(e)).count()
            + self
                .creating
                .iter()
                .filter(|(_, p)| &**p == principal)
                .count()
    }

    /// The create of `key` ended; whatever it made was inserted before.
    pub fn end_create(&mut self, key: &SandboxKey) {
        if let Some(at) = self.creating.iter().position(|(k, _)| k == key) {
            self.creating.swap_remove(at);
        }
    }

    /// Refuses every later create (the server is ending); returns how many are in flight.
    pub fn close_creates(&mut self) -> usize {
        self.ending = true;
        self.creating.len()
    }

    /// Takes the keys of the creates still in flight (the server is ending without them).
    pub fn take_creating(&mut self) -> Vec<SandboxKey> {
        std::mem::take(&mut self.creating)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    }

    /// The caller's sandbox behind `handle`, marked in use until [`release`](Self::release) (an
    /// entry in use never expires).
    pub fn acquire(&mut self, principal: &str, handle: &str) -> Lookup {
        match self.live.get_mut(handle) {
            Some(entry) if &*entry.principal == principal => {
                entry.in_use += 1;
                entry.last_used = Instant::now();
                Lookup::Found(entry.clone())
            }
            Some(_) => Lookup::Unknown,
            None => match self.expired.get(handle) {
                Some(owner) if &**owner == principal => Lookup::Expired,
                _ => Lookup::Unknown,
            },
        }
    }

    /// The live `handle` now names `sandbox` (a reset's handle to the same key); `false` when
    /// the handle is no longer live (disposed of or expired meanwhile: its key's disposal
    /// reaches the new instance too).
    pub fn replace(&mut self, handle: &str, sandbox: Arc<dyn Sandbox>) -> bool {
        match self.live.get_mut(handle) {
            Some(entry) => {
                entry.sandbox = sandbox;
                true
            }
            None => false,
        }
    }

    /// Ends a use begun by [`acquire`](Self::acquire); the idle clock restarts now.
    pub fn release(&mut self, handle: &str) {
        if let Some(entry) = self.live.get_mut(handle) {
            entry.in_use = entry.in_use.saturating_sub(1);
            entry.last_used = Instant::now();
        }
    }

    /// Takes the caller's live handle out of use and keeps its sandbox among those being
    /// disposed of until [`disposed`](Self::disposed); a handle of the caller's whose disposal
    /// has not succeeded yet is handed out again. `None` when the handle is neither.
    pub fn begin_disposal(&mut self, principal: &str, handle: &str) -> Option<Entry> {
        match self.live.get(handle) {
            Some(entry) if &*entry.principal == principal => {
                let entry = self.live.remove(handle)?;
                self.undisposed.insert(handle.to_owned(), entry.clone());
                Some(entry)
            }
            Some(_) => None,
            None => self
                .undisposed
                .get(handle)
                .filter(|entry| &*entry.principal == principal)
                .cloned(),
        }
    }

    /// The disposal of `handle`'s sandbox succeeded: nothing of it is kept.
    pub fn disposed(&mut self, handle: &str) {
        self.undisposed.remove(handle);
    }

    /// The caller's live handles with their entries and remaining time to live.
    pub fn list(&self, principal: &str) -> Vec<(String, Entry, Duration)> {
        let now = Instant::now();
        let mut out: Vec<_> = self
            .live
            .iter()
            .filter(|(_, e)| &*e.principal == principal)
            .map(|(h, e)| (h.clone(), e.clone(), self.remaining(e, now)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// How long `entry` has left before it expires (the full TTL while it is in use).
    pub fn remaining(&self, entry: &Entry, now: Instant) -> Duration {
        if entry.in_use > 0 {
            return self.ttl;
        }
        self.ttl
            .saturating_sub(now.saturating_duration_since(entry.last_used))
    }

    /// Takes out every handle idle for the whole TTL, keeping each among those being disposed
    /// of until [`disposed`](Self::disposed); their owners will read "expired".
    pub fn take_expired(&mut self) -> Vec<(String, Entry)> {
        let now = Instant::now();
        let gone: Vec<String> = self
            .live
            .iter()
            .filter(|(_, e)| e.in_use == 0 && self.remaining(e, now).is_zero())
            .map(|(h, _)| h.clone())
            .collect();
        gone.into_iter()
            .filter_map(|h| {
                let entry = self.live.remove(&h)?;
                self.remember_expired(h.clone(), entry.principal.clone());
                self.undisposed.insert(h.clone(), entry.clone());
                Some((h, entry))
            })
            .collect()
    }

    /// Takes out every live handle and every sandbox whose disposal has not succeeded (the
    /// server is ending).
    pub fn take_all(&mut self) -> Vec<Entry> {
        self.live
            .drain()
            .chain(self.undisposed.drain())
            .map(|(_, e)| e)
            .collect()
    }

    /// The soonest instant any live handle may expire.
    pub fn next_expiry(&self) -> Option<Instant> {
        let now = Instant::now();
        self.live
            .values()
            .map(|e| now + self.remaining(e, now))
            .min()
    }

    fn remember_expired(&mut self, handle: String, principal: Principal) {
        if self.expired_order.len() >= EXPIRED_MEMORY {
            if let Some(old) = self.expired_order.pop_front() {
                self.expired.remove(&old);
            }
        }
        self.expired_order.push_back(handle.clone());
        self.expired.insert(handle, principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::testing::FakeBackend;
    use sandbox_core::{Isolation, SandboxBackend, SandboxSpec};

    async fn sandbox() -> Arc<dyn Sandbox> {
        let backend = FakeBackend::new("fake", Isolation::Container);
        let key = SandboxKey::conversation("s", "t", "a");
        let spec = SandboxSpec::builder("k").build().unwrap();
        backend.acquire(&key, &spec).await.unwrap()
    }

    fn p(name: &str) -> Principal {
        Arc::from(name)
    }

    /// Binds a fresh handle, as the server's create does, and returns it.
    fn bind(
        table: &mut HandleTable,
        principal: Principal,
        key: SandboxKey,
        kind: String,
        sandbox: Arc<dyn Sandbox>,
        egress: Vec<String>,
    ) -> String {
        let handle = new_handle().unwrap();
        let spec = SandboxSpec::builder(kind).build().unwrap();
        table.insert(handle.clone(), principal, key, spec, sandbox, egress);
        handle
    }

    #[tokio::test]
    async fn handles_are_random_and_long() {
        let a = new_handle().unwrap();
        let b = new_handle().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 32);
        assert!(a[4..].chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn another_principal_reads_a_handle_exactly_as_unknown() {
        let mut table = HandleTable::new(Duration::from_secs(60));
        let key = SandboxKey::conversation("s", "t", "a");
        let h = bind(
            &mut table,
            p("alice"),
            key,
            "k".into(),
            sandbox().await,
            vec![],
        );
        assert!(matches!(table.acquire("alice", &h), Lookup::Found(_)));
        table.release(&h);
        assert!(matches!(table.acquire("bob", &h), Lookup::Unknown));
        assert!(matches!(
            table.acquire("bob", "sbx_nothing"),
            Lookup::Unknown
        ));
        assert!(
            table.begin_disposal("bob", &h).is_none(),
            "bob cannot dispose of it"
        );
        assert!(table.list("bob").is_empty());
        assert_eq!(table.list("alice").len(), 1);
        assert!(table.begin_disposal("alice", &h).is_some());
        assert!(matches!(table.acquire("alice", &h), Lookup::Unknown));
        assert!(
            table.begin_disposal("bob", &h).is_none(),
            "nor retry its disposal"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_handles_expire_after_the_ttl_and_then_say_so() {
        let ttl = Duration::from_secs(30 * 60);
        let mut table = HandleTable::new(ttl);
        let key = SandboxKey::conversation("s", "t", "a");
        let h = bind(
            &mut table,
            p("alice"),
            key.clone(),
            "k".into(),
            sandbox().await,
            vec![],
        );
        tokio::time::advance(ttl - Duration::from_secs(1)).await;
        assert!(table.take_expired().is_empty());
        // A use restarts the idle clock.
        assert!(matches!(table.acquire("alice", &h), Lookup::Found(_)));
        table.release(&h);
        tokio::time::advance(ttl - Duration::from_secs(1)).await;
        assert!(table.take_expired().is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let gone = table.take_expired();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].0, h);
        assert_eq!(gone[0].1.key, key);
        assert!(matches!(table.acquire("alice", &h), Lookup::Expired));
        assert!(matches!(table.acquire("bob", &h), Lookup::Unknown));
    }

    #[tokio::test]
    async fn a_disposal_not_yet_done_is_kept_for_its_principal_and_the_end() {
        let mut table = HandleTable::new(Duration::from_secs(60));
        let key = SandboxKey::conversation("s", "t", "a");
        let h = bind(
            &mut table,
            p("alice"),
            key.clone(),
            "k".into(),
            sandbox().await,
            vec![],
        );
        let other = bind(
            &mut table,
            p("alice"),
            key,
            "k".into(),
            sandbox().await,
            vec![],
        );
        assert!(table.begin_disposal("alice", &h).is_some());
        assert!(table.list("alice").iter().all(|(handle, ..)| *handle != h));
        // Not done yet: its principal may try again, and the end still finds it.
        assert!(table.begin_disposal("alice", &h).is_some());
        assert_eq!(
            table.take_all().len(),
            2,
            "the live one and the undisposed one"
        );
        assert!(table.begin_disposal("alice", &h).is_none());
        assert!(table.begin_disposal("alice", &other).is_none());
        let mut table = HandleTable::new(Duration::from_secs(60));
        let key = SandboxKey::conversation("s", "t", "a");
        let h = bind(
            &mut table,
            p("alice"),
            key,
            "k".into(),
            sandbox().await,
            vec![],
        );
        assert!(table.begin_disposal("alice", &h).is_some());
        table.disposed(&h);
        assert!(table.take_all().is_empty(), "a done disposal is forgotten");
    }

    #[test]
    fn creates_in_flight_are_counted_until_they_end_and_none_begins_after_the_close() {
        let mut table = HandleTable::new(Duration::from_secs(60));
        let a = SandboxKey::conversation("s", "a", "x");
        let b = SandboxKey::conversation("s", "b", "x");
        let limits = SandboxLimits::default();
        assert!(table.begin_create(a.clone(), p("x"), limits).is_ok());
        assert!(table.begin_create(b.clone(), p("x"), limits).is_ok());
        table.end_create(&a);
        assert_eq!(table.close_creates(), 1);
        assert_eq!(
            table.begin_create(a, p("x"), limits),
            Err(CreateRefusal::Ending),
            "no create begins once the server ends"
        );
        assert_eq!(table.take_creating(), vec![b]);
        assert_eq!(table.close_creates(), 0);
    }

    #[tokio::test]
    async fn creates_past_the_limits_are_refused_counting_every_instance_held() {
        let mut table = HandleTable::new(Duration::from_secs(60));
        let limits = SandboxLimits {
            per_principal: 2,
            total: 3,
        };
        let key = |t: &str| SandboxKey::conversation("s", t, "x");
        // Alice: one live, one being made; a third is hers too many.
        let h = bind(
            &mut table,
            p("alice"),
            key("a1"),
            "k".into(),
            sandbox().await,
            vec![],
        );
        assert_eq!(table.begin_create(key("a2"), p("alice"), limits), Ok(()));
        assert_eq!(
            table.begin_create(key("a3"), p("alice"), limits),
            Err(CreateRefusal::PrincipalLimit(2))
        );
        // Bob's one brings the server to its total; his second is refused by the total.
        assert_eq!(table.begin_create(key("b1"), p("bob"), limits), Ok(()));
        assert_eq!(
            table.begin_create(key("b2"), p("bob"), limits),
            Err(CreateRefusal::ServerLimit(3))
        );
        // A sandbox whose disposal has not succeeded still holds its place.
        assert!(table.begin_disposal("alice", &h).is_some());
        assert_eq!(
            table.begin_create(key("a3"), p("alice"), limits),
            Err(CreateRefusal::PrincipalLimit(2))
        );
        table.disposed(&h);
        table.end_create(&key("b1"));
        assert_eq!(table.held(), 1);
        assert_eq!(table.begin_create(key("a3"), p("alice"), limits), Ok(()));
        assert_eq!(table.held_by("alice"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handle_in_use_never_expires() {
        let ttl = Duration::from_secs(10);
        let mut table = HandleTable::new(ttl);
        let key = SandboxKey::conversation("s", "t", "a");
        let h = bind(
            &mut table,
            p("alice"),
            key,
            "k".into(),
            sandbox().await,
            vec![],
        );
        assert!(matches!(table.acquire("alice", &h), Lookup::Found(_)));
        tokio::time::advance(ttl * 5).await;
        assert!(table.take_expired().is_empty());
        table.release(&h);
        tokio::time::advance(ttl).await;
        assert_eq!(table.take_expired().len(), 1);
    }
}
