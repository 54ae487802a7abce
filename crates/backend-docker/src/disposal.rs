//! Listing and disposal from the engine's labels: `list`, `dispose`,
//! `dispose_scope`. Ownership is read back from the engine, never from process memory, so another
//! process's sandboxes are found too. Disposal never raises.

use sandbox_core::naming::docker::{
    decode_docker_key_label, is_digest_label, LABEL_AGENT, LABEL_CALL, LABEL_KEY_V1, LABEL_KIND,
    LABEL_SCOPE, LABEL_THREAD,
};
use sandbox_core::{
    DisposalCode, DisposalFailure, DisposeSelector, SandboxError, SandboxKey, SandboxState,
    SandboxSummary, ScopePurge,
};

use crate::containers::Removal;
use crate::egress_names::{is_proxy_name, proxy_name, volume_name};
use crate::ownership_labels::{ContainerRecord, ContainerSelector};
use std::sync::Arc;

use crate::bounded::bounded_join;
use crate::claims::ClaimRecords;
use crate::containers::Containers;
use crate::egress::EgressCompanions;
use crate::memory::Memories;

/// How many removals run at once.
const REMOVAL_CONCURRENCY: usize = 4;

/// `list`, `dispose` and `dispose_scope` over the engine's labels.
#[derive(Debug)]
pub(crate) struct Disposal {
    containers: Arc<Containers>,
    /// A claimed pool member's record goes after it.
    claims: Arc<ClaimRecords>,
    /// An allowlist sandbox's proxy and volume go with it.
    egress: Arc<EgressCompanions>,
    /// What this process made, swept when the engine's listing fails; and what it retired.
    memory: Arc<Memories>,
}

impl Disposal {
    pub(crate) fn new(
        containers: Arc<Containers>,
        claims: Arc<ClaimRecords>,
        egress: Arc<EgressCompanions>,
        memory: Arc<Memories>,
    ) -> Self {
        Disposal {
            containers,
            claims,
            egress,
            memory,
        }
    }

    /// Workloads only: phase-2 proxies are never selected as workloads.
    fn workloads(listed: Vec<(String, String)>) -> Vec<(String, String)> {
        listed
            .into_iter()
            .filter(|(_, name)| !is_proxy_name(name))
            .collect()
    }

    /// `list`: every workload of the scope (and thread), from the engine's labels.
    pub(crate) async fn list_sandboxes(
        &self,
        scope: &str,
        thread: Option<&str>,
    ) -> Result<Vec<SandboxSummary>, SandboxError> {
        let selection = ContainerSelector {
            scope: scope.to_owned(),
            thread: thread.map(str::to_owned),
            ..ContainerSelector::default()
        };
        let listed = Self::workloads(self.containers.listing(&selection).await?);
        let ids: Vec<String> = listed.into_iter().map(|(id, _)| id).collect();
        let records = self.containers.inspect_many(&ids).await?;
        let mut summaries: Vec<SandboxSummary> =
            records.iter().map(|record| self.summary(record)).collect();
        summaries.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        Ok(summaries)
    }

    fn summary(&self, record: &ContainerRecord) -> SandboxSummary {
        let labels = record.labels();
        let readable = |label: &str| -> Option<String> {
            labels
                .get(label)
                .filter(|value| !is_digest_label(value))
                .cloned()
        };
        let key = labels
            .get(LABEL_KEY_V1)
            .filter(|label| !label.is_empty())
            .and_then(|label| decode_docker_key_label(label))
            .or_else(|| {
                let call = match labels.get(LABEL_CALL) {
                    None => Some(String::new()),
                    Some(_) => readable(LABEL_CALL),
                };
                Some(SandboxKey {
                    scope: readable(LABEL_SCOPE)?,
                    thread_id: readable(LABEL_THREAD)?,
                    agent_id: readable(LABEL_AGENT)?,
                    call_id: call?,
                })
            });
        let state = if self.memory.retired.contains(&record.id) {
            SandboxState::Retired
        } else {
            match record.status() {
                "running" => SandboxState::Running,
                "created" | "exited" => SandboxState::Stopped,
                other => SandboxState::Other(other.to_owned()),
            }
        };
        SandboxSummary {
            key,
            kind: readable(LABEL_KIND),
            instance_id: record.id.clone(),
            created: record.created_at(),
            state,
        }
    }

    /// Removes each id, a few at a time; returns how many the engine removed in this call, and
    /// the failures with their ids.
    async fn remove_all(&self, ids: Vec<String>) -> (u32, Vec<(String, DisposalFailure)>) {
        let mut removed = 0u32;
        let mut failures = Vec::new();
        let results = bounded_join(
            ids.iter().map(|id| self.containers.remove(id)).collect(),
            REMOVAL_CONCURRENCY,
        )
        .await;
        for (id, result) in ids.into_iter().zip(results) {
            match result {
                Ok(Removal::Removed) => removed += 1,
                Ok(Removal::Absent) => {}
                Err(failure) => failures.push((id, failure)),
            }
        }
        (removed, failures)
    }

    /// What to sweep for a selection: the engine's listings of containers (workloads and
    /// proxies) and egress volumes, or, when the container listing fails, what this process
    /// remembers (reported as `unlisted`).
    async fn sweep_targets(&self, selection: &ContainerSelector) -> (Sweep, Vec<DisposalFailure>) {
        let mut sweep = Sweep::default();
        let mut failures = Vec::new();
        match self.containers.listing(selection).await {
            Ok(listed) => {
                for (id, name) in listed {
                    if is_proxy_name(&name) {
                        sweep.proxies.push(id);
                    } else {
                        sweep.workloads.push(id);
                    }
                }
            }
            Err(error) => {
                for (name, remembered) in self
                    .memory
                    .adoptions
                    .matching(|r| selection.matches(&r.key, &r.kind))
                {
                    sweep.workloads.push(remembered.id);
                    sweep.proxies.push(proxy_name(&name));
                    sweep.volumes.push(volume_name(&name));
                }
                failures.push(DisposalFailure::new(
                    DisposalCode::Unlisted,
                    format!("the engine's listing failed: {error}"),
                ));
            }
        }
        let (volumes, claims) = tokio::join!(
            self.egress.volume_listing(selection),
            self.claims.listing(selection)
        );
        match volumes {
            Ok(volumes) => sweep.volumes.extend(volumes),
            Err(error) => failures.push(DisposalFailure::new(
                DisposalCode::Unlisted,
                format!("the engine's volume listing failed: {error}"),
            )),
        }
        match claims {
            Ok(claims) => sweep.claims = claims,
            Err(error) => failures.push(DisposalFailure::new(
                DisposalCode::Unlisted,
                format!("the engine's claim record listing failed: {error}"),
            )),
        }
        sweep.volumes.sort();
        sweep.volumes.dedup();
        (sweep, failures)
    }

    /// Removes the workloads, then the proxies, then the volumes (a volume in use cannot go);
    /// returns how many workloads the engine removed, and the failures (a companion's is
    /// `unknown`).
    async fn remove_sweep(&self, sweep: Sweep) -> (u32, Vec<DisposalFailure>) {
        let (removed, failed) = self.remove_all(sweep.workloads).await;
        // A claim record goes only after its container: one whose removal failed keeps it, so a
        // later disposal still finds the container by its owner.
        let kept: std::collections::HashSet<&str> =
            failed.iter().map(|(id, _)| id.as_str()).collect();
        let records = bounded_join(
            sweep
                .claims
                .iter()
                .filter(|id| !kept.contains(id.as_str()))
                .map(|id| self.claims.remove(id))
                .collect(),
            REMOVAL_CONCURRENCY,
        )
        .await;
        let mut failures: Vec<DisposalFailure> = failed.into_iter().map(|(_, f)| f).collect();
        failures.extend(records.into_iter().filter_map(Result::err));
        let (_, proxy_failures) = self.remove_all(sweep.proxies).await;
        failures.extend(proxy_failures.into_iter().map(|(_, failure)| {
            DisposalFailure::new(
                DisposalCode::Unknown,
                format!("egress proxy {}", failure.detail),
            )
        }));
        let volumes = bounded_join(
            sweep
                .volumes
                .iter()
                .map(|volume| self.egress.remove_volume(volume))
                .collect(),
            REMOVAL_CONCURRENCY,
        )
        .await;
        failures.extend(volumes.into_iter().filter_map(Result::err));
        (removed, failures)
    }

    /// `dispose(key, selector)`. Never raises.
    pub(crate) async fn dispose_key(
        &self,
        key: &SandboxKey,
        selector: &DisposeSelector,
    ) -> Option<DisposalFailure> {
        if let Some(instance) = &selector.instance_id {
            return self
                .dispose_instance(key, selector.kind.as_deref(), instance)
                .await;
        }
        let selection = ContainerSelector::of_key(key, selector.kind.as_deref());
        let (sweep, unlisted) = self.sweep_targets(&selection).await;
        let (_, mut failures) = self.remove_sweep(sweep).await;
        failures.extend(unlisted);
        DisposalFailure::fold(failures)
    }

    async fn dispose_instance(
        &self,
        key: &SandboxKey,
        kind: Option<&str>,
        id: &str,
    ) -> Option<DisposalFailure> {
        // An instance id is the engine's: hex. Anything else names no instance of this backend
        // (and must never reach the docker CLI, where a leading `-` would read as an option).
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let record = match self.containers.inspect(id).await {
            Ok(Some(record)) => record,
            Ok(None) => return None,
            Err(error) => return Some(failure_of(&error, id)),
        };
        // A stale id never selects a replacement: the removal is by this id, after the labels
        // were found to name this key.
        if !record.owned_by(key, kind) || is_proxy_name(record.bare_name()) {
            return None;
        }
        if let Err(failure) = self.containers.remove(&record.id).await {
            return Some(failure);
        }
        // A closed workload has no companions.
        record.expected_egress_volume()?;
        DisposalFailure::fold(self.egress.remove_companions(record.bare_name()).await)
    }

    /// `dispose_scope`. Never raises.
    pub(crate) async fn dispose_conversation(&self, scope: &str, thread: &str) -> ScopePurge {
        self.dispose_selection(&ContainerSelector {
            scope: scope.to_owned(),
            thread: Some(thread.to_owned()),
            ..ContainerSelector::default()
        })
        .await
    }

    /// Every sandbox the selection owns (a claimed pool member by its record, never by the
    /// pool's labels it was made with). Never raises.
    pub(crate) async fn dispose_selection(&self, selection: &ContainerSelector) -> ScopePurge {
        let (sweep, unlisted) = self.sweep_targets(selection).await;
        let (disposed, mut failures) = self.remove_sweep(sweep).await;
        failures.extend(unlisted);
        ScopePurge {
            disposed,
            undisposed: DisposalFailure::fold(failures),
        }
    }
}

/// What one disposal removes: workloads (counted), proxies, egress volumes.
#[derive(Debug, Default)]
struct Sweep {
    workloads: Vec<String>,
    /// The ids whose claim records the selection owns.
    claims: Vec<String>,
    proxies: Vec<String>,
    volumes: Vec<String>,
}

/// A failed engine call during disposal, as a disposal code.
fn failure_of(error: &SandboxError, id: &str) -> DisposalFailure {
    let code = match error {
        SandboxError::BackendUnavailable { .. } => DisposalCode::Unreachable,
        SandboxError::EngineTimeout { .. } => DisposalCode::Timeout,
        _ => DisposalCode::Unknown,
    };
    DisposalFailure::new(code, format!("{id}: {error}"))
}
