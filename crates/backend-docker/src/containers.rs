//! Containers and images through the Engine API: inspect, list by label, create (with the one
//! hardened host configuration every container gets), start, unpause, remove, and the
//! image presence check.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, RenameContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use futures_util::StreamExt as _;
use sandbox_core::naming::docker::LABEL_CREATE_MARK;
use sandbox_core::{DisposalCode, DisposalFailure, SandboxError};

use crate::bounded::bounded_join;
use crate::claims::ClaimRecords;
use crate::config::DockerConfig;
use crate::connection::EngineConnection;
use crate::connection::{quote, ApiFailure};
use crate::memory::Memories;
use crate::ownership_labels::{ContainerRecord, ContainerSelector};

/// How many inspects of a listing run at once.
const INSPECT_CONCURRENCY: usize = 8;

/// How a removal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removal {
    /// The engine removed it in this call.
    Removed,
    /// It was not there.
    Absent,
}

/// One container as the engine's listing shows it.
#[derive(Debug, Clone)]
pub(crate) struct ListedContainer {
    pub(crate) id: String,
    /// Without the leading `/`.
    pub(crate) name: String,
    /// Its own labels (a claimed pool member's owner is not among them).
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    /// The id of the image it was made from.
    pub(crate) image_id: String,
    pub(crate) running: bool,
    /// When it was created, in seconds since the epoch (0 when the engine did not say).
    pub(crate) created: i64,
}

/// What a create said.
pub(crate) enum Created {
    /// The new container's id and its inspect after the create, for the caller to verify.
    Id(String, Box<ContainerRecord>),
    /// Another container holds the name (the engine's message).
    Conflict(String),
}

/// The hardened shape of every workload container.
pub(crate) struct ContainerShape<'a> {
    pub(crate) name: &'a str,
    pub(crate) image: &'a str,
    pub(crate) labels: HashMap<String, String>,
    pub(crate) keep_alive: &'a str,
    pub(crate) resources: crate::config::Resources,
    /// The allowlist sandbox's egress volume, mounted read-only at `/run/maf-egress`, with the
    /// proxy variables in the environment; `None` for egress closed.
    pub(crate) egress_volume: Option<&'a str>,
    /// Whether the egress proxy terminates TLS: the workload's trust variables then name its CA.
    pub(crate) egress_terminated: bool,
}

/// How a container mounts its egress volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VolumeAccess {
    /// The workload: it reads the socket and the forwarder, and can change neither.
    ReadOnly,
    /// The proxy: it puts them there.
    ReadWrite,
}

/// What differs between the containers this backend makes; everything else about their
/// hardening is the same for all of them ([`hardened_host_config`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hardening<'a> {
    pub(crate) pids_limit: i64,
    pub(crate) resources: crate::config::Resources,
    pub(crate) network: &'a str,
    /// The egress volume and how it is mounted at the egress mount point; `None` mounts nothing.
    pub(crate) egress_volume: Option<(&'a str, VolumeAccess)>,
    /// The OCI runtime (`HostConfig.Runtime`); `None` = the engine's default.
    pub(crate) runtime: Option<&'a str>,
}

/// The one hardened host configuration of every container this backend makes, workload, egress
/// proxy and host address listing alike: the engine's init, every capability dropped, no privilege gain, a pids
/// limit, memory (swap included) and CPUs bounded, one network, no mount but the egress volume,
/// and the configured runtime. A container that needs more (the proxy's read-only root and bounded logs) adds to it,
/// never takes from it.
pub(crate) fn hardened_host_config(hardening: Hardening<'_>) -> HostConfig {
    HostConfig {
        init: Some(true),
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        pids_limit: Some(hardening.pids_limit),
        memory: Some(hardening.resources.memory_bytes),
        memory_swap: Some(hardening.resources.memory_bytes),
        nano_cpus: Some(hardening.resources.nano_cpus),
        network_mode: Some(hardening.network.to_owned()),
        runtime: hardening.runtime.map(str::to_owned),
        mounts: hardening.egress_volume.map(|(volume, access)| {
            vec![Mount {
                target: Some(crate::egress_names::EGRESS_MOUNT.to_owned()),
                source: Some(volume.to_owned()),
                typ: Some(MountType::VOLUME),
                read_only: Some(access == VolumeAccess::ReadOnly),
                ..Mount::default()
            }]
        }),
        ..HostConfig::default()
    }
}

/// The backend's containers on the engine: inspect, list, create, start, unpause, remove, and
/// the images they run. A removal forgets what this process remembered about the container.
#[derive(Debug)]
pub(crate) struct Containers {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    memory: Arc<Memories>,
    /// A claimed pool member's owner is its claim record: inspects and listings read it.
    claims: Arc<ClaimRecords>,
}

impl Containers {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        memory: Arc<Memories>,
        claims: Arc<ClaimRecords>,
    ) -> Self {
        Containers {
            engine,
            config,
            memory,
            claims,
        }
    }

    /// One container by name or id; `None` when the engine says it is absent.
    pub(crate) async fn inspect(
        &self,
        target: &str,
    ) -> Result<Option<ContainerRecord>, SandboxError> {
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().inspect_container(target, None),
            )
            .await;
        let mut record = match answer {
            Ok(response) => ContainerRecord::from_api(&response).map_err(SandboxError::engine)?,
            Err(failure) if failure.is_not_found() => return Ok(None),
            Err(failure) => return Err(self.engine.failure("container inspect", failure)),
        };
        if record.is_claimed_member() {
            // Owned by its claim record; without one, by no key at all (never by the pool).
            record.claim = Some(self.claims.labels_of(&record.id).await?.unwrap_or_default());
        }
        Ok(Some(record))
    }

    /// Several containers; ids gone in between are skipped.
    pub(crate) async fn inspect_many(
        &self,
        ids: &[String],
    ) -> Result<Vec<ContainerRecord>, SandboxError> {
        let answers = bounded_join(
            ids.iter().map(|id| self.inspect(id)).collect(),
            INSPECT_CONCURRENCY,
        )
        .await;
        let mut records = Vec::new();
        for answer in answers {
            if let Some(record) = answer? {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// `(id, name)` of every container, running or not, the selection owns: those carrying all
    /// its labels, and the claimed pool members whose claim record carries them. A claimed member
    /// is never the pool's, whatever its own labels say.
    pub(crate) async fn listing(
        &self,
        selection: &ContainerSelector,
    ) -> Result<Vec<(String, String)>, SandboxError> {
        let labelled = self.listed(HashMap::from([(
            "label".to_owned(),
            selection.label_filters(),
        )]));
        let (labelled, claimed) = tokio::join!(labelled, self.claims.listing(selection));
        let mut owned: Vec<(String, String)> = labelled?
            .into_iter()
            // A member made for the pool counts only under a pool name: once claimed, it is its
            // record's.
            .filter(|c| {
                !crate::pool_names::made_for_pool(&c.labels)
                    || crate::pool_names::is_pool_name(&c.name)
            })
            .map(|c| (c.id, c.name))
            .collect();
        let claimed = claimed?;
        if !claimed.is_empty() {
            let by_id = HashMap::from([("id".to_owned(), claimed)]);
            // A member still under its pool name is the pool's until its claimer renames it.
            owned.extend(
                self.listed(by_id)
                    .await?
                    .into_iter()
                    .filter(|c| !crate::pool_names::is_pool_name(&c.name))
                    .map(|c| (c.id, c.name)),
            );
        }
        owned.sort();
        owned.dedup();
        Ok(owned)
    }

    /// Every container, running or not, matching the engine's listing `filters`.
    pub(crate) async fn listed(
        &self,
        filters: HashMap<String, Vec<String>>,
    ) -> Result<Vec<ListedContainer>, SandboxError> {
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().list_containers(Some(options)),
            )
            .await
            .map_err(|f| self.engine.failure("container list", f))?;
        listed
            .into_iter()
            .map(|summary| {
                let id = summary.id.unwrap_or_default();
                let name = summary
                    .names
                    .unwrap_or_default()
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                if id.is_empty() {
                    return Err(SandboxError::engine(
                        "the container list named a container without an id",
                    ));
                }
                Ok(ListedContainer {
                    id,
                    name: name.trim_start_matches('/').to_owned(),
                    labels: summary.labels.unwrap_or_default().into_iter().collect(),
                    image_id: summary.image_id.unwrap_or_default(),
                    running: summary.state
                        == Some(bollard::models::ContainerSummaryStateEnum::RUNNING),
                    created: summary.created.unwrap_or(0),
                })
            })
            .collect()
    }

    /// Creates and starts one hardened container, and inspects it while it starts (the inspect
    /// answers the configuration the create fixed, whatever the start does). A start or an inspect
    /// that fails removes what the create made.
    pub(crate) async fn create_container(
        &self,
        shape: &ContainerShape<'_>,
    ) -> Result<Created, SandboxError> {
        let host_config = hardened_host_config(Hardening {
            pids_limit: i64::from(self.config.pids_limit),
            resources: shape.resources,
            network: self.config.workload_network(),
            egress_volume: shape
                .egress_volume
                .map(|volume| (volume, VolumeAccess::ReadOnly)),
            runtime: self.config.runtime.as_deref(),
        });
        let body = ContainerCreateBody {
            image: Some(shape.image.to_owned()),
            env: shape
                .egress_volume
                .map(|_| crate::egress_names::workload_env(shape.egress_terminated)),
            entrypoint: Some(vec!["sh".to_owned()]),
            cmd: Some(vec!["-c".to_owned(), shape.keep_alive.to_owned()]),
            labels: Some(shape.labels.clone()),
            host_config: Some(host_config),
            ..ContainerCreateBody::default()
        };
        let id = match self
            .create_named(shape.name, shape.image, body, "container create")
            .await?
        {
            Ok(id) => id,
            Err(taken) => return Ok(Created::Conflict(quote(taken.as_bytes()))),
        };
        let (started, inspected) =
            tokio::join!(self.lifecycle(Lifecycle::Start, &id), self.inspect(&id));
        let inspected = inspected.and_then(|record| {
            record.ok_or_else(|| {
                SandboxError::engine(format!(
                    "container {id} vanished right after it was created"
                ))
            })
        });
        match (started, inspected) {
            (Ok(()), Ok(record)) => Ok(Created::Id(id, Box::new(record))),
            (Err(error), _) | (_, Err(error)) => {
                let _ = self.remove(&id).await;
                Err(error)
            }
        }
    }

    /// Creates container `name` from `body`: its id, or `Ok(Err(message))` when the name is
    /// taken (what a conflict means is the caller's). A missing `image` is ImageMissing; any
    /// other failure is Engine, named `operation`.
    pub(crate) async fn create_named(
        &self,
        name: &str,
        image: &str,
        body: ContainerCreateBody,
        operation: &str,
    ) -> Result<Result<String, String>, SandboxError> {
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        let created = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().create_container(Some(options), body),
            )
            .await;
        match created {
            Ok(response) => Ok(Ok(response.id)),
            Err(failure) if failure.is_conflict() => Ok(Err(failure.message().to_owned())),
            Err(failure) if failure.is_not_found() => {
                Err(self.image_missing(image, failure.message()))
            }
            Err(failure) => Err(self.engine.failure(operation, failure)),
        }
    }

    /// Starts or unpauses one container; a failure is Engine. Unpausing a container that is no
    /// longer paused is done, not a failure: callers that unpause one container at once meet only
    /// through the engine, and its state, not its 409, is the answer.
    pub(crate) async fn lifecycle(&self, verb: Lifecycle, id: &str) -> Result<(), SandboxError> {
        let api = self.engine.api();
        let deadline = self.config.command_timeout;
        let result = match verb {
            Lifecycle::Start => {
                self.engine
                    .call(deadline, api.start_container(id, None))
                    .await
            }
            Lifecycle::Unpause => self.engine.call(deadline, api.unpause_container(id)).await,
        };
        match result {
            Ok(()) => Ok(()),
            Err(failure) if verb == Lifecycle::Unpause && failure.is_conflict() => {
                match self
                    .inspect(id)
                    .await?
                    .as_ref()
                    .map(ContainerRecord::status)
                {
                    Some("running") => Ok(()),
                    _ => Err(self
                        .engine
                        .failure(&format!("container unpause {id}"), failure)),
                }
            }
            Err(failure) => Err(self
                .engine
                .failure(&format!("container {} {id}", verb.word()), failure)),
        }
    }

    /// Gives container `id` the name `name`, in one engine call: no moment exists where both
    /// or neither name it.
    ///
    /// # Errors
    /// InvalidArgument when another container holds `name`; SandboxGone when `id` is gone.
    pub(crate) async fn rename(&self, id: &str, name: &str) -> Result<(), SandboxError> {
        let options = RenameContainerOptionsBuilder::new().name(name).build();
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().rename_container(id, options),
            )
            .await;
        match answer {
            Ok(()) => Ok(()),
            Err(failure) if failure.is_conflict() => Err(SandboxError::invalid(format!(
                "the name {name} was taken while container {id} was being made: {}",
                quote(failure.message().as_bytes())
            ))),
            Err(failure) if failure.is_not_found() => Err(SandboxError::SandboxGone {
                instance: id.to_owned(),
            }),
            Err(failure) => Err(self
                .engine
                .failure(&format!("container rename {id}"), failure)),
        }
    }

    /// Waits while container `id` is paused, up to [`PAUSE_WAIT`]: this crate never pauses, but a
    /// process on an earlier version wrote an adopted container's storage base under a pause
    /// that lasts one archive upload, and an operator may pause one by hand. A pause
    /// that outlasts the wait ([`PauseWait::Held`]: its process died, or someone paused the
    /// container by hand) is the caller's to lift or report.
    pub(crate) async fn wait_out_pause(&self, id: &str) -> Result<PauseWait, SandboxError> {
        let until = tokio::time::Instant::now() + PAUSE_WAIT;
        let mut waited = false;
        loop {
            let status = self
                .inspect(id)
                .await?
                .map(|record| record.status().to_owned());
            match status.as_deref() {
                Some("paused") => {}
                _ if waited => return Ok(PauseWait::Lifted),
                status => {
                    return Ok(PauseWait::NotPaused {
                        running: status == Some("running"),
                    })
                }
            }
            if tokio::time::Instant::now() >= until {
                return Ok(PauseWait::Held);
            }
            waited = true;
            tokio::time::sleep(PAUSE_POLL).await;
        }
    }

    /// Force-removes one container. Never raises: a failure is a disposal code.
    pub(crate) async fn remove(&self, id: &str) -> Result<Removal, DisposalFailure> {
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().remove_container(id, Some(options)),
            )
            .await;
        let removal = match answer {
            Ok(()) => Removal::Removed,
            Err(failure) if failure.is_not_found() => Removal::Absent,
            Err(ApiFailure::Deadline(bound)) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Timeout,
                    format!(
                        "{id}: the removal did not finish within {} s",
                        bound.as_secs()
                    ),
                ))
            }
            Err(ApiFailure::Transport(error)) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Unreachable,
                    format!(
                        "{id}: the engine at {} is unreachable: {error}",
                        self.engine.endpoint()
                    ),
                ))
            }
            Err(ApiFailure::Status { message, .. } | ApiFailure::Stream(message)) => {
                return Err(DisposalFailure::new(
                    DisposalCode::Refused,
                    format!("{id}: {}", quote(message.as_bytes())),
                ))
            }
        };
        // A claimed pool member's record goes with it, never before it: a container left
        // without its record belongs to no key. (Disposal also removes the records it lists.)
        if self.memory.claims.get(id).is_some() {
            if let Err(failure) = self.claims.remove(id).await {
                tracing::warn!(container = %id, %failure, "could not remove a claim record");
            }
        }
        self.memory.forget_instance(id);
        Ok(removal)
    }

    /// Removes a container this call created and must not leave behind, in a task the caller's
    /// drop cannot cancel.
    pub(crate) async fn remove_shielded(self: &Arc<Self>, id: &str) {
        let containers = Arc::clone(self);
        let id = id.to_owned();
        let _ = sandbox_core::backend_kit::run_detached(async move {
            if let Err(failure) = containers.remove(&id).await {
                tracing::warn!(container = %id, %failure, "could not remove a half-made sandbox");
            }
        })
        .await;
    }

    /// Starts a one-shot container `id`, waits (under the command deadline) until it no longer
    /// runs, and reads its output, stdout and stderr interleaved, up to `budget` bytes (what
    /// follows is dropped). `what` names the container in errors. Removing it is the caller's.
    ///
    /// # Errors
    /// Engine (or EngineTimeout) when it cannot be started, waited for or read.
    pub(crate) async fn run_to_exit(
        &self,
        id: &str,
        budget: usize,
        what: &str,
    ) -> Result<Vec<u8>, SandboxError> {
        self.lifecycle(Lifecycle::Start, id).await?;
        let deadline = self.config.command_timeout;
        let wait = async {
            let options = WaitContainerOptionsBuilder::new()
                .condition("not-running")
                .build();
            let mut waits = self.engine.api().wait_container(id, Some(options));
            while let Some(answer) = waits.next().await {
                // A non-zero exit arrives as an error of its own kind; the output says the rest.
                if let Err(error) = answer {
                    if !matches!(
                        error,
                        bollard::errors::Error::DockerContainerWaitError { .. }
                    ) {
                        return Err(error);
                    }
                }
            }
            Ok(())
        };
        self.engine
            .call(deadline, wait)
            .await
            .map_err(|f| self.engine.failure(&format!("{what} wait"), f))?;
        let options = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .tail("all")
            .build();
        let read = async {
            let mut stream = self.engine.api().logs(id, Some(options));
            let mut output = Vec::new();
            while let Some(chunk) = stream.next().await {
                match chunk? {
                    LogOutput::StdOut { message }
                    | LogOutput::Console { message }
                    | LogOutput::StdErr { message } => output.extend_from_slice(&message),
                    LogOutput::StdIn { .. } => {}
                }
                if output.len() > budget {
                    output.truncate(budget);
                    break;
                }
            }
            Ok(output)
        };
        self.engine
            .call(deadline, read)
            .await
            .map_err(|f| self.engine.failure(&format!("{what} logs"), f))
    }

    /// Present locally, or one explicit bounded pull; ImageMissing when that fails.
    pub(crate) async fn ensure_image(&self, image: &str) -> Result<(), SandboxError> {
        match self
            .engine
            .image_id(self.config.command_timeout, image)
            .await
        {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(failure) => return Err(self.engine.failure("image inspect", failure)),
        }
        tracing::info!(image, "image absent; pulling it explicitly");
        let options = CreateImageOptionsBuilder::new().from_image(image).build();
        let pull = async {
            let mut progress = self.engine.api().create_image(Some(options), None, None);
            while let Some(step) = progress.next().await {
                let step = step?;
                if let Some(status) = step.status {
                    tracing::info!(image, "pull: {status}");
                }
            }
            Ok(())
        };
        match self.engine.call(self.config.pull_timeout, pull).await {
            Ok(()) => Ok(()),
            Err(ApiFailure::Deadline(bound)) => Err(self.image_missing(
                image,
                &format!("the pull did not finish within {} s", bound.as_secs()),
            )),
            Err(failure @ ApiFailure::Transport(_)) => {
                Err(self.engine.failure("image pull", failure))
            }
            Err(failure) => Err(self.image_missing(image, failure.message())),
        }
    }

    /// Removes the container named `name` if it carries `mark`, looking for up to `patience` for one
    /// the daemon is still making. A container without the mark is another create's and is kept.
    pub(crate) async fn remove_if_marked(&self, name: &str, mark: &str, patience: Duration) {
        let until = tokio::time::Instant::now() + patience;
        loop {
            match self.inspect(name).await {
                Ok(Some(record)) => {
                    if record.labels().get(LABEL_CREATE_MARK).map(String::as_str) == Some(mark) {
                        if let Err(failure) = self.remove(&record.id).await {
                            tracing::warn!(container = %name, %failure, "an abandoned create could not be removed");
                        }
                    }
                    return;
                }
                Ok(None) | Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(ABANDONED_CREATE_POLL).await;
                }
                Ok(None) | Err(_) => return,
            }
        }
    }

    #[cold]
    pub(crate) fn image_missing(&self, image: &str, reason: &str) -> SandboxError {
        SandboxError::ImageMissing {
            image: image.to_owned(),
            hint: format!(
                "it is not present on the engine at {} and could not be pulled: {}; \
                 build the local images with `sandboxctl images build` (or, in a checkout, `cargo xtask images`)",
                self.engine.endpoint(),
                quote(reason.as_bytes())
            ),
        }
    }

    /// The engine's OS; `None` when unreadable.
    pub(crate) async fn engine_os(&self) -> Option<String> {
        self.engine
            .os(self.config.command_timeout)
            .await
            .ok()
            .flatten()
    }
}

/// How often an abandoned create is looked for.
const ABANDONED_CREATE_POLL: Duration = Duration::from_millis(250);

/// How long a caller waits out a pause someone else holds (one archive upload, for the pause of
/// an earlier version of this crate).
pub(crate) const PAUSE_WAIT: Duration = Duration::from_secs(10);

/// Between two looks at a paused container.
const PAUSE_POLL: Duration = Duration::from_millis(25);

/// How [`Containers::wait_out_pause`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseWait {
    /// The container was not paused when looked at; `running` when it was running (a pause that
    /// refused a request may have ended between the refusal and the look).
    NotPaused {
        /// The container's status was `running`.
        running: bool,
    },
    /// It was, and the pause was lifted within the wait.
    Lifted,
    /// It is still paused.
    Held,
}

/// The lifecycle verbs the backend uses (never `stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    Start,
    Unpause,
}

impl Lifecycle {
    fn word(self) -> &'static str {
        match self {
            Lifecycle::Start => "start",
            Lifecycle::Unpause => "unpause",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hardening(egress_volume: Option<(&str, VolumeAccess)>) -> HostConfig {
        hardened_host_config(Hardening {
            pids_limit: 7,
            resources: crate::config::Resources {
                nano_cpus: 1_500_000_000,
                memory_bytes: 64 << 20,
            },
            network: "none",
            egress_volume,
            runtime: None,
        })
    }

    #[test]
    fn every_container_gets_the_same_hardening() {
        let closed = hardening(None);
        assert_eq!(closed.init, Some(true));
        assert_eq!(closed.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            closed.security_opt,
            Some(vec!["no-new-privileges".to_owned()])
        );
        assert_eq!(closed.pids_limit, Some(7));
        // Swap is bounded with memory: the limit cannot be escaped into swap.
        assert_eq!(closed.memory, Some(64 << 20));
        assert_eq!(closed.memory_swap, Some(64 << 20));
        assert_eq!(closed.nano_cpus, Some(1_500_000_000));
        assert_eq!(closed.network_mode.as_deref(), Some("none"));
        assert_eq!(closed.mounts, None);
        assert_eq!(closed.binds, None);
        assert_eq!(closed.privileged, None);
        assert_eq!(closed.cap_add, None);
        assert_eq!(closed.runtime, None);
    }

    #[test]
    fn a_configured_runtime_changes_nothing_else() {
        let under_runsc = hardened_host_config(Hardening {
            pids_limit: 7,
            resources: crate::config::Resources {
                nano_cpus: 1_500_000_000,
                memory_bytes: 64 << 20,
            },
            network: "none",
            egress_volume: None,
            runtime: Some("runsc"),
        });
        assert_eq!(under_runsc.runtime.as_deref(), Some("runsc"));
        assert_eq!(
            HostConfig {
                runtime: None,
                ..under_runsc
            },
            hardening(None)
        );
    }

    #[test]
    fn the_egress_volume_is_the_one_mount_read_only_for_the_workload() {
        for (access, read_only) in [
            (VolumeAccess::ReadOnly, true),
            (VolumeAccess::ReadWrite, false),
        ] {
            let config = hardening(Some(("v-egress", access)));
            let mounts = config.mounts.unwrap();
            assert_eq!(mounts.len(), 1);
            assert_eq!(mounts[0].source.as_deref(), Some("v-egress"));
            assert_eq!(
                mounts[0].target.as_deref(),
                Some(crate::egress_names::EGRESS_MOUNT)
            );
            assert_eq!(mounts[0].typ, Some(MountType::VOLUME));
            assert_eq!(mounts[0].read_only, Some(read_only));
            // Everything else is as without a volume.
            assert_eq!(
                HostConfig {
                    mounts: None,
                    ..hardening(Some(("v-egress", access)))
                },
                hardening(None)
            );
        }
    }
}
