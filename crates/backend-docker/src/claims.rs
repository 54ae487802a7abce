//! Claim records (docs/docker-backend.md#warm-pool): the one volume per claimed pool member that
//! carries the ownership labels of the key it was claimed for, since a container's own labels
//! cannot change after its create.
//!
//! The record is also the claim itself. The engine creates a volume under a name at most once
//! and hands every later create of that name the volume that exists, with the first creator's
//! labels, under a lock of that name: so of all the callers that create the record of one
//! container, exactly one finds its own mark on the answer, and that one alone goes on to rename
//! the container. A record is bound to one container id and never changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bollard::query_parameters::RemoveVolumeOptionsBuilder;
use sandbox_core::naming::docker::{LABEL_CLAIM_MARK, LABEL_INSTANCE, LABEL_ROLE};
use sandbox_core::{DisposalCode, DisposalFailure, SandboxError};

use crate::config::DockerConfig;
use crate::connection::{quote, ApiFailure, EngineConnection};
use crate::memory::Memories;
use crate::ownership_labels::ContainerSelector;
use crate::pool_names::{claim_record_name, CLAIM_ROLE};

/// How a claim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimOutcome {
    /// This call's record holds, with these labels: the container is this call's to rename.
    Won(BTreeMap<String, String>),
    /// Another caller's record was there first; `stale` when it was made longer ago than
    /// [`STALE_CLAIM`] command timeouts (its claimer is gone: no claim takes that long).
    Lost {
        /// Whether the record outlived any claim's rename.
        stale: bool,
    },
}

/// After how many command timeouts a claim record of a container still under a pool name is
/// taken for a claimer that died between its record and its rename (whose own deadline is one
/// command timeout).
pub(crate) const STALE_CLAIM: u32 = 3;

/// The claim records on the engine, and what this process read of them.
#[derive(Debug)]
pub(crate) struct ClaimRecords {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    memory: Arc<Memories>,
}

impl ClaimRecords {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        memory: Arc<Memories>,
    ) -> Self {
        ClaimRecords {
            engine,
            config,
            memory,
        }
    }

    /// Claims container `id` for the owner `labels` (a key's workload labels): creates its
    /// record, marked with a fresh nonce, and reads back whose record the engine kept.
    pub(crate) async fn claim(
        &self,
        id: &str,
        labels: &[(String, String)],
    ) -> Result<ClaimOutcome, SandboxError> {
        let mark = exec_wrapper::new_nonce()
            .map_err(|e| SandboxError::engine(e.to_string()))?
            .as_str()
            .to_owned();
        let mut record: HashMap<String, String> = labels.iter().cloned().collect();
        record.insert(LABEL_ROLE.to_owned(), CLAIM_ROLE.to_owned());
        record.insert(LABEL_INSTANCE.to_owned(), id.to_owned());
        record.insert(LABEL_CLAIM_MARK.to_owned(), mark.clone());
        let request = bollard::models::VolumeCreateRequest {
            name: Some(claim_record_name(id)),
            driver: Some("local".to_owned()),
            labels: Some(record),
            ..Default::default()
        };
        let made = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().create_volume(request),
            )
            .await
            .map_err(|f| self.engine.failure("claim record create", f))?;
        let kept: BTreeMap<String, String> = made.labels.into_iter().collect();
        if kept.get(LABEL_CLAIM_MARK) == Some(&mark)
            && kept.get(LABEL_INSTANCE).map(String::as_str) == Some(id)
        {
            self.memory.claims.remember(id, kept.clone());
            return Ok(ClaimOutcome::Won(kept));
        }
        let stale = made
            .created_at
            .as_deref()
            .and_then(crate::ownership_labels::parse_rfc3339)
            .and_then(|made| std::time::SystemTime::now().duration_since(made).ok())
            .is_some_and(|age| age > self.config.command_timeout * STALE_CLAIM);
        Ok(ClaimOutcome::Lost { stale })
    }

    /// The ownership labels container `id` was claimed with; `None` when it has no record (or
    /// one naming another container, which is no record of it).
    pub(crate) async fn labels_of(
        &self,
        id: &str,
    ) -> Result<Option<BTreeMap<String, String>>, SandboxError> {
        if let Some(labels) = self.memory.claims.get(id) {
            return Ok(Some(labels));
        }
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().inspect_volume(&claim_record_name(id)),
            )
            .await;
        let labels: BTreeMap<String, String> = match answer {
            Ok(volume) => volume.labels.into_iter().collect(),
            Err(failure) if failure.is_not_found() => return Ok(None),
            Err(failure) => return Err(self.engine.failure("claim record inspect", failure)),
        };
        if labels.get(LABEL_INSTANCE).map(String::as_str) != Some(id)
            || labels.get(LABEL_ROLE).map(String::as_str) != Some(CLAIM_ROLE)
        {
            return Ok(None);
        }
        self.memory.claims.remember(id, labels.clone());
        Ok(Some(labels))
    }

    /// The container ids of the claim records carrying all the selection's labels.
    pub(crate) async fn listing(
        &self,
        selection: &ContainerSelector,
    ) -> Result<Vec<String>, SandboxError> {
        let mut labels = selection.label_filters();
        labels.push(format!("{LABEL_ROLE}={CLAIM_ROLE}"));
        let listed = self
            .engine
            .volumes_labelled(self.config.command_timeout, labels, "claim record list")
            .await?;
        Ok(listed
            .into_iter()
            .filter_map(|volume| {
                let id = volume.labels.get(LABEL_INSTANCE)?.clone();
                (volume.name == claim_record_name(&id)).then_some(id)
            })
            .collect())
    }

    /// Removes container `id`'s record (absent is fine). Only after the container is gone: a
    /// container left without its record belongs to no key.
    pub(crate) async fn remove(&self, id: &str) -> Result<(), DisposalFailure> {
        let options = RemoveVolumeOptionsBuilder::new().force(false).build();
        let name = claim_record_name(id);
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().remove_volume(&name, Some(options)),
            )
            .await;
        match answer {
            Ok(()) => Ok(()),
            Err(failure) if failure.is_not_found() => Ok(()),
            Err(failure) => Err(DisposalFailure::new(
                DisposalCode::Unknown,
                format!(
                    "claim record {name}: {}",
                    match &failure {
                        ApiFailure::Deadline(bound) =>
                            format!("the removal did not finish within {} s", bound.as_secs()),
                        other => quote(other.message().as_bytes()),
                    }
                ),
            )),
        }
    }
}
