//! The warm pool (docs/docker-backend.md#warm-pool): ready containers per shape (image, storage
//! base, hardening, runtime, network; egress closed), each made and prepared as a cold acquire
//! makes one, under a key of the pool's own; a fresh acquire claims one instead of creating, and
//! the pool refills in the background.
//!
//! The claim, across processes: list the shape's ready members, create the claim record of one
//! ([`ClaimRecords::claim`]: the engine keeps the first record of a name, so exactly one caller
//! wins each member), and only then, the winner alone, rename it to the key's name. The rename
//! is not the claim: the engine resolves a rename's source name before it takes the container's
//! lock and then renames whatever name the container has by then, so two renames of one member
//! to two keys could both succeed. Only the record's winner ever renames a member.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sandbox_core::{ErrorKind, SandboxError};
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;

use crate::bounded::bounded_join;
use crate::claims::{ClaimOutcome, ClaimRecords};
use crate::config::DockerConfig;
use crate::connection::EngineConnection;
use crate::containers::{Containers, ListedContainer};
use crate::ownership_labels::{ContainerRecord, ContainerSelector};
use crate::pool_names::{
    filling_name, is_filling, is_ready_member, member_name, pool_key, POOL_KIND, SHAPE_HEX,
};

/// How many members one refill makes at once.
const FILL_CONCURRENCY: usize = 2;

/// How many members one claim tries before it goes cold.
const CLAIM_TRIES: usize = 8;

/// How long a refill whose make failed (an image missing, an engine fault) waits before it
/// tries again, unless a claim wakes it first.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// What decides a pool member's container: the warm cache's policy (image, hardening,
/// resources, runtime; egress closed), the workload network and the storage base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    /// [`SHAPE_HEX`] hex digits of SHA-256 over everything that decides the shape.
    pub(crate) digest: String,
    pub(crate) image: String,
    pub(crate) base: String,
    pub(crate) needs_base: bool,
}

impl Shape {
    /// The shape of a plan with this `policy` (the warm cache's: image, hardening, egress),
    /// `network`, storage `base` and whether it makes the base.
    pub(crate) fn new(
        image: &str,
        base: &str,
        needs_base: bool,
        policy: &str,
        network: &str,
    ) -> Shape {
        let preimage = format!("pool-v1\n{policy}\n{network}\n{base}\n{needs_base}");
        let digest: String = Sha256::digest(preimage.as_bytes())
            .iter()
            .take(SHAPE_HEX / 2)
            .map(|b| format!("{b:02x}"))
            .collect();
        Shape {
            digest,
            image: image.to_owned(),
            base: base.to_owned(),
            needs_base,
        }
    }
}

/// What makes a member: the acquirer, named here so this module imports nothing above it.
#[async_trait]
pub(crate) trait MakeMember: Send + Sync + std::fmt::Debug {
    /// Creates and prepares one member of `shape` under `name` (its filling name), as a cold
    /// acquire of the pool's key would; its id. What it made is removed on any failure.
    async fn make_member(&self, shape: &Shape, name: &str) -> Result<String, SandboxError>;
}

/// What a claim found.
pub(crate) enum Claim {
    /// This member is the caller's now, under the caller's name, and its inspect (made before
    /// the rename; its name and owner labels are the claimed ones).
    Claimed(String, Box<ContainerRecord>),
    /// Another container holds the caller's name (the engine's message): nothing was claimed.
    NameTaken(String),
    /// No ready member could be claimed: create cold.
    Empty,
}

/// The shapes this process keeps filled and its refill task.
#[derive(Debug, Default)]
struct Wanted {
    shapes: BTreeMap<String, Shape>,
    refill: Option<tokio::task::JoinHandle<()>>,
}

/// The warm pool: claims members for fresh acquires and keeps every shape this process served
/// filled to [`DockerConfig::pool`] members, in a background task that ends with the pool.
#[derive(Debug)]
pub(crate) struct Pool {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    containers: Arc<Containers>,
    claims: Arc<ClaimRecords>,
    /// The acquirer, which makes members; set once at assembly.
    maker: OnceLock<Weak<dyn MakeMember>>,
    wanted: Mutex<Wanted>,
    /// Wakes the refill: a claim took a member, or a shape was added.
    wake: Arc<Notify>,
    /// Members this process is making now.
    in_flight: AtomicUsize,
    me: Weak<Pool>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(task) = self.held().refill.take() {
            task.abort();
        }
    }
}

impl Pool {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        containers: Arc<Containers>,
        claims: Arc<ClaimRecords>,
    ) -> Arc<Pool> {
        Arc::new_cyclic(|me| Pool {
            engine,
            config,
            containers,
            claims,
            maker: OnceLock::new(),
            wanted: Mutex::default(),
            wake: Arc::new(Notify::new()),
            in_flight: AtomicUsize::new(0),
            me: me.clone(),
        })
    }

    /// Names what makes members (once).
    pub(crate) fn set_maker(&self, maker: Weak<dyn MakeMember>) {
        let _ = self.maker.set(maker);
    }

    /// Whether fresh acquires claim from the pool at all.
    pub(crate) fn enabled(&self) -> bool {
        self.config.pool > 0
    }

    fn held(&self) -> MutexGuard<'_, Wanted> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `shape` filled from now on, and wakes the refill (started on first use).
    pub(crate) fn want(&self, shape: &Shape) {
        if !self.enabled() {
            return;
        }
        let mut wanted = self.held();
        wanted
            .shapes
            .entry(shape.digest.clone())
            .or_insert_with(|| shape.clone());
        if wanted.refill.is_none() {
            wanted.refill = Some(tokio::spawn(refill_loop(
                self.me.clone(),
                Arc::clone(&self.wake),
            )));
        }
        drop(wanted);
        self.wake.notify_one();
    }

    /// The listing filters of one shape's members (ready or being filled).
    fn member_filters(shape: &str) -> HashMap<String, Vec<String>> {
        let selection = ContainerSelector::of_key(&pool_key(shape), Some(POOL_KIND));
        HashMap::from([("label".to_owned(), selection.label_filters())])
    }

    /// Claims a ready member of `shape` for the owner `labels` under `name`: its record first,
    /// then, the record's winner alone, the rename. A member another caller's record holds is
    /// passed over (and removed when that record is stale: its claimer died).
    pub(crate) async fn claim(
        &self,
        shape: &Shape,
        name: &str,
        labels: &[(String, String)],
    ) -> Result<Claim, SandboxError> {
        self.want(shape);
        let mut filters = Self::member_filters(&shape.digest);
        filters.insert("status".to_owned(), vec!["running".to_owned()]);
        let (listed, image) = tokio::join!(
            self.containers.listed(filters),
            self.engine
                .image_id(self.config.command_timeout, &shape.image)
        );
        let listed = listed?;
        // An absent image is the cold path's to report (or pull).
        let Some(image) = image.map_err(|f| self.engine.failure("image inspect", f))? else {
            return Ok(Claim::Empty);
        };
        let mut candidates: Vec<ListedContainer> = listed
            .into_iter()
            .filter(|m| is_ready_member(&m.name, &shape.digest) && m.running && m.image_id == image)
            .collect();
        // Each caller starts at its own place, so concurrent claims seldom meet on one member.
        if !candidates.is_empty() {
            let offset = random_index(candidates.len());
            candidates.rotate_left(offset);
        }
        for member in candidates.into_iter().take(CLAIM_TRIES) {
            let (claimed, inspected) = tokio::join!(
                self.claims.claim(&member.id, labels),
                self.containers.inspect(&member.id)
            );
            let owner = match claimed? {
                ClaimOutcome::Won(owner) => owner,
                ClaimOutcome::Lost { stale } => {
                    if stale {
                        tracing::info!(container = %member.id, "removing a pool member whose claimer never renamed it");
                        self.discard(&member.id).await;
                    }
                    continue;
                }
            };
            let mut record = match inspected {
                Ok(Some(record)) => record,
                // Purged meanwhile.
                Ok(None) => {
                    let _ = self.claims.remove(&member.id).await;
                    continue;
                }
                Err(error) => {
                    self.discard(&member.id).await;
                    return Err(error);
                }
            };
            match self.containers.rename(&member.id, name).await {
                Ok(()) => {
                    record.name = format!("/{name}");
                    record.claim = Some(owner);
                    self.wake.notify_one();
                    return Ok(Claim::Claimed(member.id, Box::new(record)));
                }
                // Purged between the record and the rename: its record goes too.
                Err(SandboxError::SandboxGone { .. }) => {
                    let _ = self.claims.remove(&member.id).await;
                }
                Err(error) => {
                    // Never handed out: it goes, with its record.
                    self.discard(&member.id).await;
                    self.wake.notify_one();
                    if error.kind() == ErrorKind::InvalidArgument {
                        return Ok(Claim::NameTaken(error.to_string()));
                    }
                    return Err(error);
                }
            }
        }
        self.wake.notify_one();
        Ok(Claim::Empty)
    }

    /// Removes a member (then its claim record) in a task the caller's drop cannot cancel.
    pub(crate) async fn discard(&self, id: &str) {
        let containers = Arc::clone(&self.containers);
        let claims = Arc::clone(&self.claims);
        let id = id.to_owned();
        let _ = sandbox_core::backend_kit::run_detached(async move {
            match containers.remove(&id).await {
                Ok(_) => {
                    if let Err(failure) = claims.remove(&id).await {
                        tracing::warn!(container = %id, %failure, "could not remove a claim record");
                    }
                }
                Err(failure) => {
                    tracing::warn!(container = %id, %failure, "could not remove a pool member");
                }
            }
        })
        .await;
    }

    /// Fills every wanted shape; the pause before the next round unless woken: none when all
    /// are full, [`RETRY_AFTER_FAILURE`] when a make failed.
    async fn refill_round(&self) -> Option<Duration> {
        let shapes: Vec<Shape> = self.held().shapes.values().cloned().collect();
        let mut pause = None;
        for shape in shapes {
            if let Err(error) = self.fill(&shape).await {
                tracing::warn!(shape = %shape.digest, image = %shape.image, %error, "the warm pool could not refill");
                pause = Some(RETRY_AFTER_FAILURE);
            }
        }
        pause
    }

    /// Fills one shape to the configured size: sweeps what cannot serve (a fill older than one
    /// command timeout, whose maker is gone; a member that stopped or whose image is no longer
    /// the reference's), counts the ready members and the young fills (another process's), and
    /// makes up to [`FILL_CONCURRENCY`] more at once, then looks again, until a listing shows it
    /// full.
    async fn fill(&self, shape: &Shape) -> Result<(), SandboxError> {
        loop {
            let (listed, image) = tokio::join!(
                self.containers.listed(Self::member_filters(&shape.digest)),
                self.engine
                    .image_id(self.config.command_timeout, &shape.image)
            );
            let listed = listed?;
            let image = image.map_err(|f| self.engine.failure("image inspect", f))?;
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let old = |m: &ListedContainer| {
                now.saturating_sub(m.created) > self.config.command_timeout.as_secs() as i64
            };
            let mut ready = 0usize;
            let mut unfit = Vec::new();
            for member in &listed {
                if is_filling(&member.name) {
                    if old(member) {
                        unfit.push(member.id.clone());
                    } else {
                        ready += 1;
                    }
                } else if is_ready_member(&member.name, &shape.digest) {
                    if member.running && image.as_deref() == Some(member.image_id.as_str()) {
                        ready += 1;
                    } else {
                        unfit.push(member.id.clone());
                    }
                }
            }
            for id in &unfit {
                self.discard(id).await;
            }
            if ready >= self.config.pool {
                return Ok(());
            }
            // At most a batch between listings: processes filling one shape at once each see the
            // others' fills on their next look, so together they overshoot by a batch each.
            let batch = (self.config.pool - ready).min(FILL_CONCURRENCY);
            let makes = (0..batch).map(|_| self.make_one(shape)).collect();
            for made in bounded_join(makes, FILL_CONCURRENCY).await {
                made?;
            }
        }
    }

    /// Makes one member under its filling name, then gives it its ready name.
    async fn make_one(&self, shape: &Shape) -> Result<(), SandboxError> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let made = self.make_named(shape).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        made
    }

    async fn make_named(&self, shape: &Shape) -> Result<(), SandboxError> {
        let maker = self
            .maker
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| SandboxError::engine("the backend that fills the pool is gone"))?;
        let nonce = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
        let ready = member_name(&shape.digest, nonce.as_str());
        let id = maker.make_member(shape, &filling_name(&ready)).await?;
        if let Err(error) = self.containers.rename(&id, &ready).await {
            self.discard(&id).await;
            return Err(error);
        }
        Ok(())
    }

    /// The ready members of every shape on the engine (any process's), by id.
    pub(crate) async fn ready_members(&self) -> Result<Vec<String>, SandboxError> {
        let selection = ContainerSelector {
            scope: sandbox_core::naming::docker::POOL_SCOPE.to_owned(),
            ..ContainerSelector::default()
        };
        let filters = HashMap::from([("label".to_owned(), selection.label_filters())]);
        let mut ids: Vec<String> = self
            .containers
            .listed(filters)
            .await?
            .into_iter()
            .filter(|m| {
                m.running && crate::pool_names::is_pool_name(&m.name) && !is_filling(&m.name)
            })
            .map(|m| m.id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Waits until every wanted shape has its members ready and this process makes none (or
    /// `deadline` passes).
    pub(crate) async fn wait_full(&self, deadline: Duration) -> Result<(), SandboxError> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let shapes: Vec<Shape> = self.held().shapes.values().cloned().collect();
            let mut full = true;
            for shape in &shapes {
                let listed = self
                    .containers
                    .listed(Self::member_filters(&shape.digest))
                    .await?;
                let ready = listed
                    .iter()
                    .filter(|m| m.running && is_ready_member(&m.name, &shape.digest))
                    .count();
                full &= ready >= self.config.pool;
            }
            if full && self.in_flight.load(Ordering::SeqCst) == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(SandboxError::engine(format!(
                    "the warm pool did not fill within {} s",
                    deadline.as_secs()
                )));
            }
            self.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The refill: a round whenever woken, and after a failed one, a retry; it ends with the pool.
async fn refill_loop(pool: Weak<Pool>, wake: Arc<Notify>) {
    loop {
        let pause = match pool.upgrade() {
            Some(pool) => pool.refill_round().await,
            None => return,
        };
        match pause {
            None => wake.notified().await,
            Some(pause) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// A random index below `len` (> 0), from the nonce's entropy.
fn random_index(len: usize) -> usize {
    let seed = exec_wrapper::new_nonce()
        .ok()
        .and_then(|n| u64::from_str_radix(&n.as_str()[..12], 16).ok())
        .unwrap_or(0);
    (seed % len as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_the_shape_changes_its_digest() {
        let base = Shape::new("img", "/w", true, "img|pids=1|closed", "none");
        assert_eq!(base.digest.len(), SHAPE_HEX);
        for other in [
            Shape::new("img", "/v", true, "img|pids=1|closed", "none"),
            Shape::new("img", "/w", false, "img|pids=1|closed", "none"),
            Shape::new("img", "/w", true, "img|pids=2|closed", "none"),
            Shape::new("img", "/w", true, "img|pids=1|closed", "bridge"),
        ] {
            assert_ne!(other.digest, base.digest, "{other:?}");
        }
        assert_eq!(
            Shape::new("img", "/w", true, "img|pids=1|closed", "none"),
            base
        );
    }

    #[test]
    fn random_indices_stay_below_the_length() {
        for len in 1..20 {
            assert!(random_index(len) < len);
        }
    }
}
