//! Get-or-create per (key, kind) (docker.md §5), `find` (rule 36), image presence (§7) and the
//! storage base (rule 33).

use std::sync::Arc;
use std::time::Duration;

use exec_wrapper::{ExitKind, Stream};
use sandbox_core::{
    docker_container_name, needs_storage_base, plan_storage_base, storage_base_directories,
    validate_base, Egress, EntryKind, SandboxError, SandboxKey, SandboxSpec, TransferLimits,
    DEFAULT_WORK_DIR,
};
use tokio::time::Instant;

use crate::cli_seam::{daemon_unreachable, object_absent, tail, CallShape, SMALL_BUDGET};
use crate::config::check_image_reference;
use crate::engine_calls::{join_all, GuestCall, GuestEnd, Remembered, Shared, WarmEntry};
use crate::guest_scripts::{BASE_EXIT_FALLBACK, BASE_SCRIPT};
use crate::handle::DockerSandbox;
use crate::ownership_labels::{workload_labels, ContainerRecord, Verdict};
use crate::tar_header::directory_entry;

/// The body every workload runs, so any image stays alive whatever its entrypoint.
const KEEP_ALIVE: &str = "while :; do sleep 3600; done";

/// How often the name-conflict adopt loop re-inspects.
const ADOPT_POLL: Duration = Duration::from_millis(250);

/// How many times one acquire may replace a container before giving up.
const MAX_REPLACEMENTS: usize = 4;

/// Everything an acquire decided before touching the engine.
struct Plan<'a> {
    key: &'a SandboxKey,
    kind: &'a str,
    name: String,
    image: String,
    base: String,
    needs_base: bool,
    labels: Vec<(String, String)>,
    policy: String,
    files_in: TransferLimits,
    files_out: TransferLimits,
}

/// What `docker run` said.
enum Created {
    Id(String),
    Conflict(String),
}

/// How an existing container came to be served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// This call created it.
    Created,
    /// It was there, running, and needed nothing.
    Found,
    /// It needed a start or an unpause, or another process created it under our feet.
    Revived,
    /// Another process won the name: its preparation may still be running.
    Adopted,
}

impl Shared {
    /// docker.md rules 12–21.
    pub(crate) async fn acquire_sandbox(
        self: &Arc<Self>,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let plan = self.plan(key, spec)?;
        let lock = self.name_lock(&plan.name);
        let _serialised = lock.lock().await;
        self.sweep_unremovable().await;

        let adopt_deadline = Instant::now() + self.config.command_timeout;
        let mut last_conflict = String::new();
        let mut replacements = 0usize;
        let mut adopted = false;
        let mut record = self.inspect(&plan.name).await?;
        loop {
            let Some(existing) = record.take() else {
                if replacements > MAX_REPLACEMENTS {
                    return Err(SandboxError::engine(format!(
                        "container {} kept disappearing while it was being acquired",
                        plan.name
                    )));
                }
                replacements += 1;
                match self.create(&plan).await? {
                    Created::Id(id) => return self.finish(&plan, &id, Arrival::Created).await,
                    Created::Conflict(text) => {
                        last_conflict = text;
                        adopted = true;
                        record = self.inspect(&plan.name).await?;
                        if record.is_none() {
                            if Instant::now() >= adopt_deadline {
                                return Err(SandboxError::engine(format!(
                                    "the name {} stayed in use without a container behind it: {last_conflict}",
                                    plan.name
                                )));
                            }
                            tokio::time::sleep(ADOPT_POLL).await;
                        }
                        continue;
                    }
                }
            };
            existing
                .verify(key, plan.kind, Some(&plan.base), Some(&plan.image))
                .map_err(|verdict| refusal(&plan.name, verdict))?;
            if self.is_retired(&existing.id) {
                self.replace(&existing.id).await?;
                continue;
            }
            // A container made moments ago by another process is adopted as from a lost create
            // race, whether or not this call saw the conflict: its creator may still be preparing
            // the storage base, which must not be frozen under it (rule 33's pause).
            let arrival = if adopted || self.is_young(&existing) {
                Arrival::Adopted
            } else {
                Arrival::Found
            };
            match existing.status() {
                "running" => {
                    if let Some(entry) = self.warm_entry(&existing.id) {
                        let warm = entry.base == plan.base
                            && entry.policy == plan.policy
                            && (entry.base_ready || !plan.needs_base);
                        if warm {
                            return Ok(self.handle(&plan, &existing.id, false));
                        }
                    }
                    return self.finish(&plan, &existing.id, arrival).await;
                }
                "paused" => {
                    self.forget_warm(&existing.id);
                    self.lifecycle("unpause", &existing.id).await?;
                    return self.finish(&plan, &existing.id, Arrival::Revived).await;
                }
                "created" | "exited" => {
                    self.forget_warm(&existing.id);
                    self.recheck_os().await?;
                    if let Err(error) = self.lifecycle("start", &existing.id).await {
                        tracing::warn!(container = %existing.id, %error, "start failed; replacing");
                        self.replace(&existing.id).await?;
                        continue;
                    }
                    let arrival = if adopted {
                        Arrival::Adopted
                    } else {
                        Arrival::Revived
                    };
                    return self.finish(&plan, &existing.id, arrival).await;
                }
                other => {
                    tracing::info!(container = %existing.id, state = other, "replacing a container that cannot serve");
                    self.replace(&existing.id).await?;
                    if adopted && Instant::now() >= adopt_deadline {
                        return Err(SandboxError::engine(format!(
                            "could not adopt {} within {} s: {last_conflict}",
                            plan.name,
                            self.config.command_timeout.as_secs()
                        )));
                    }
                }
            }
        }
    }

    fn plan<'a>(
        &self,
        key: &'a SandboxKey,
        spec: &'a SandboxSpec,
    ) -> Result<Plan<'a>, SandboxError> {
        if spec.egress() != Egress::Closed {
            return Err(SandboxError::EgressNotEnforced(format!(
                "the docker backend enforces egress closed only; the spec asks for {}",
                spec.egress()
            )));
        }
        let image = spec
            .image_id()
            .or(spec.image())
            .unwrap_or(&self.config.default_image)
            .to_owned();
        check_image_reference(&image)?;
        let base = validate_base(spec.work_dir().unwrap_or(DEFAULT_WORK_DIR))?;
        let ceiling = self.declarations.limits;
        Ok(Plan {
            key,
            kind: spec.kind(),
            name: docker_container_name(key, spec.kind(), ""),
            policy: format!("{image}|{}", self.config.hardening_fingerprint()),
            labels: workload_labels(key, spec.kind(), spec.labels(), &base),
            needs_base: needs_storage_base(&spec.required_capabilities()),
            image,
            base,
            files_in: min_limits(spec.files_in(), ceiling.files_in),
            files_out: min_limits(spec.files_out(), ceiling.files_out),
        })
    }

    fn handle(self: &Arc<Self>, plan: &Plan<'_>, id: &str, fresh: bool) -> Arc<DockerSandbox> {
        self.remember(
            &plan.name,
            Remembered {
                key: plan.key.clone(),
                kind: plan.kind.to_owned(),
                id: id.to_owned(),
            },
        );
        Arc::new(DockerSandbox::new(
            Arc::clone(self),
            id.to_owned(),
            plan.base.clone(),
            fresh,
            plan.files_in,
            plan.files_out,
        ))
    }

    /// Rules 18–21 for a container this call created or found not yet verified.
    async fn finish(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        id: &str,
        arrival: Arrival,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        let fresh = arrival == Arrival::Created;
        // A container this call created is removed on any failure, even if the caller drops us.
        let mut discard = fresh.then(|| DiscardOnDrop::armed(self, id));
        let result = self.prepare(plan, id, arrival).await;
        match result {
            Ok(base_ready) => {
                if let Some(guard) = discard.as_mut() {
                    guard.disarm();
                }
                self.remember_warm(
                    id,
                    WarmEntry {
                        base: plan.base.clone(),
                        policy: plan.policy.clone(),
                        base_ready,
                    },
                );
                Ok(self.handle(plan, id, fresh))
            }
            Err(error) => {
                if let Some(guard) = discard.as_mut() {
                    guard.disarm();
                    self.remove_shielded(id).await;
                }
                Err(error)
            }
        }
    }

    async fn prepare(
        self: &Arc<Self>,
        plan: &Plan<'_>,
        id: &str,
        arrival: Arrival,
    ) -> Result<bool, SandboxError> {
        if arrival == Arrival::Created {
            let record = self.inspect(id).await?.ok_or_else(|| {
                SandboxError::engine(format!(
                    "container {id} vanished right after it was created"
                ))
            })?;
            record
                .verify(plan.key, plan.kind, Some(&plan.base), Some(&plan.image))
                .map_err(|verdict| refusal(&plan.name, verdict))?;
        }
        self.probe_tools(id, &plan.image).await?;
        if plan.needs_base {
            self.prepare_base(id, &plan.base, arrival).await?;
        }
        if self.config.verify_egress && arrival == Arrival::Created {
            crate::egress_preflight::verify(self, id).await?;
        }
        Ok(plan.needs_base)
    }

    /// `docker run` (rule 11), after the OS re-check and the image presence check.
    async fn create(self: &Arc<Self>, plan: &Plan<'_>) -> Result<Created, SandboxError> {
        let (os, image) = tokio::join!(self.recheck_os(), self.ensure_image(&plan.image));
        os?;
        image?;
        // This create's mark: a container the daemon makes after our `docker run` gave up (its
        // deadline passed, or the acquire was dropped) is found by it and removed, and only then.
        let mark = exec_wrapper::new_nonce()
            .map_err(|e| SandboxError::engine(e.to_string()))?
            .as_str()
            .to_owned();
        let mut guard = CreateGuard {
            shared: Arc::clone(self),
            name: plan.name.clone(),
            mark: Some(mark.clone()),
        };
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--pull=never",
            "--init",
            "--name",
            plan.name.as_str(),
            "--security-opt",
            "no-new-privileges",
            "--cap-drop",
            "ALL",
            "--pids-limit",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(self.config.pids_limit.to_string());
        if let Some(memory) = &self.config.memory {
            args.extend(["--memory".to_owned(), memory.clone()]);
        }
        if let Some(cpus) = &self.config.cpus {
            args.extend(["--cpus".to_owned(), cpus.clone()]);
        }
        args.extend(["--network".to_owned(), "none".to_owned()]);
        for (label, value) in &plan.labels {
            args.extend(["--label".to_owned(), format!("{label}={value}")]);
        }
        args.extend(["--label".to_owned(), format!("{CREATE_MARK_LABEL}={mark}")]);
        args.extend(
            ["--entrypoint", "sh", plan.image.as_str(), "-c", KEEP_ALIVE].map(str::to_owned),
        );
        // An error here (deadline, spawn, overflow) leaves the guard armed: its task looks for
        // what the daemon may still make under this name and this mark.
        let output = self
            .cli
            .run_management(
                "docker run",
                args,
                CallShape::management(self.config.command_timeout),
            )
            .await?;
        if output.status != ExitKind::Exited(0)
            && !String::from_utf8_lossy(&output.stderr)
                .to_lowercase()
                .contains("already in use")
        {
            // A run that failed after its create (a start failure) leaves a container behind.
            self.remove_if_marked(&plan.name, &mark, Duration::ZERO)
                .await;
        }
        guard.disarm();
        if output.status == ExitKind::Exited(0) {
            let stdout = String::from_utf8_lossy(&output.stdout);
            let id = stdout
                .lines()
                .map(str::trim)
                .rfind(|l| !l.is_empty())
                .unwrap_or("");
            if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(Created::Id(id.to_owned()));
            }
            // Created but unreadable: find it by name, remove it, report.
            if let Ok(Some(record)) = self.inspect(&plan.name).await {
                let _ = self.remove(&record.id).await;
            }
            return Err(SandboxError::engine(format!(
                "docker run answered no container id: {}",
                tail(&output.stdout)
            )));
        }
        let stderr = String::from_utf8_lossy(&output.stderr).to_lowercase();
        if stderr.contains("already in use") {
            return Ok(Created::Conflict(tail(&output.stderr)));
        }
        if stderr.contains("no such image") {
            return Err(self.image_missing(&plan.image, &tail(&output.stderr)));
        }
        Err(self.engine_failure("docker run", &output.stderr))
    }

    /// Rule 26: inspect, then an explicit bounded pull with progress; ImageMissing when it fails.
    async fn ensure_image(&self, image: &str) -> Result<(), SandboxError> {
        let output = self
            .cli
            .run_management(
                "docker image inspect",
                ["image", "inspect", "--format", "{{.Id}}", image],
                CallShape::management(self.config.command_timeout).budget(SMALL_BUDGET),
            )
            .await?;
        if output.status == ExitKind::Exited(0) {
            return Ok(());
        }
        if !object_absent(&output.stderr, image) {
            return Err(self.engine_failure("docker image inspect", &output.stderr));
        }
        tracing::info!(image, "image absent; pulling it explicitly");
        let progress_image = image.to_owned();
        let shape = CallShape {
            deadline: self.config.pull_timeout,
            budget: crate::cli_seam::MANAGEMENT_BUDGET,
            stdin: None,
            stop_after: None,
            on_line: Some(Box::new(move |_stream: Stream, line: &[u8]| {
                tracing::info!(image = %progress_image, "pull: {}", String::from_utf8_lossy(line).trim_end());
            })),
        };
        match self.cli.run(["pull", image], shape).await {
            Ok(output) if output.status == ExitKind::Exited(0) => Ok(()),
            Ok(output) if daemon_unreachable(&output.stderr) => {
                Err(self.engine_failure("docker pull", &output.stderr))
            }
            Ok(output) => Err(self.image_missing(image, &tail(&output.stderr))),
            Err(exec_wrapper::Error::Deadline { bound, .. }) => Err(self.image_missing(
                image,
                &format!("the pull did not finish within {} s", bound.as_secs()),
            )),
            Err(error) => Err(self.cli.runner_error("docker pull", error)),
        }
    }

    #[cold]
    fn image_missing(&self, image: &str, reason: &str) -> SandboxError {
        SandboxError::ImageMissing {
            image: image.to_owned(),
            hint: format!(
                "it is not present on the engine (context {}) and could not be pulled: {reason}; \
                 build the local images with `sandboxctl images build` (or, in a checkout, `cargo xtask images`)",
                self.cli.context()
            ),
        }
    }

    /// Rule 17: before a cold create or start, when os_families was declared, a readable answer
    /// other than `linux` refuses; an unreadable one is let through.
    async fn recheck_os(&self) -> Result<(), SandboxError> {
        if self.declarations.os_families.is_empty() {
            return Ok(());
        }
        match crate::backend::engine_os(&self.cli, self.config.command_timeout).await {
            Some(os) if os != "linux" => Err(SandboxError::OsFamilyNotSupported(format!(
                "the engine of context {} now reports OS {os:?}, not linux",
                self.cli.context()
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the container was created within the adopt budget (one command timeout) of now.
    fn is_young(&self, record: &ContainerRecord) -> bool {
        record
            .created_at()
            .and_then(|created| std::time::SystemTime::now().duration_since(created).ok())
            .is_some_and(|age| age < self.config.command_timeout)
    }

    /// `docker start|unpause <id>`; a failure is Engine.
    pub(crate) async fn lifecycle(&self, verb: &str, id: &str) -> Result<(), SandboxError> {
        let output = self
            .cli
            .run_management(
                &format!("docker {verb}"),
                [verb, id],
                CallShape::management(self.config.command_timeout).budget(SMALL_BUDGET),
            )
            .await?;
        if output.status == ExitKind::Exited(0) {
            Ok(())
        } else {
            Err(self.engine_failure(&format!("docker {verb} {id}"), &output.stderr))
        }
    }

    /// Removes a container that cannot serve, before a create takes its name.
    async fn replace(&self, id: &str) -> Result<(), SandboxError> {
        self.remove(id).await.map(|_| ()).map_err(|failure| {
            SandboxError::engine(format!(
                "could not remove container {id} to replace it: {failure}"
            ))
        })
    }

    /// Rule 33: walk the base with the engine stat; create the missing suffix as the guest, else
    /// engine-side owned by the guest; re-walk; the guest must be able to write it.
    async fn prepare_base(
        self: &Arc<Self>,
        id: &str,
        base: &str,
        arrival: Arrival,
    ) -> Result<(), SandboxError> {
        let mut missing = self.plan_base(id, base).await?;
        if !missing.is_empty() && arrival == Arrival::Adopted {
            // Another process created this container a moment ago and is preparing the same base:
            // give it the adopt budget before doing it a second time.
            let until = Instant::now() + self.config.command_timeout;
            while !missing.is_empty() && Instant::now() < until {
                tokio::time::sleep(ADOPT_POLL).await;
                missing = self.plan_base(id, base).await?;
            }
        }
        let writable_checked = if missing.is_empty() {
            false
        } else {
            let output = self
                .guest_internal(id, &["sh", "-c", BASE_SCRIPT, "maf-base", base])
                .await?;
            match output.exit_code {
                0 => true,
                BASE_EXIT_FALLBACK => {
                    let ids = String::from_utf8_lossy(&output.stdout).into_owned();
                    let mut numbers = ids.split_whitespace().map(str::parse::<u64>);
                    let (Some(Ok(uid)), Some(Ok(gid))) = (numbers.next(), numbers.next()) else {
                        return Err(SandboxError::engine(format!(
                            "the guest's `id -u`/`id -g` answered {:?}",
                            tail(&output.stdout)
                        )));
                    };
                    self.create_base_engine_side(
                        id,
                        &missing,
                        uid,
                        gid,
                        arrival != Arrival::Created,
                    )
                    .await?;
                    false
                }
                code => {
                    return Err(SandboxError::engine(format!(
                        "preparing the storage base {base} as the guest failed (exit {code}): {}",
                        tail(&output.stderr)
                    )))
                }
            }
        };
        let still_missing = self.plan_base(id, base).await?;
        if !still_missing.is_empty() {
            return Err(SandboxError::engine(format!(
                "the storage base {base} is still missing {} after it was created",
                still_missing.join(", ")
            )));
        }
        if !writable_checked {
            let output = self.guest_internal(id, &["test", "-w", base]).await?;
            if output.exit_code != 0 {
                return Err(SandboxError::engine(format!(
                    "the storage base {base} is not writable by the guest"
                )));
            }
        }
        Ok(())
    }

    /// The engine-side walk of the base's directories, decided by the core (rule 54).
    async fn plan_base(&self, id: &str, base: &str) -> Result<Vec<String>, SandboxError> {
        let directories = storage_base_directories(base)?;
        let stats = join_all(
            directories
                .iter()
                .map(|d| self.stat_kind(id, d.clone()))
                .collect(),
        )
        .await;
        let mut kinds: Vec<Option<EntryKind>> = Vec::new();
        for stat in stats {
            let kind = stat?;
            kinds.push(kind);
            if kind.is_none() {
                break;
            }
        }
        plan_storage_base(base, &kinds)
    }

    /// One tar of directory entries on stdin to `docker cp - <id>:/`, each owned by the guest (the
    /// engine keeps a stdin archive's owners; `-a` would instead look the container's user up);
    /// under `docker pause` when this acquire did not create the container.
    async fn create_base_engine_side(
        self: &Arc<Self>,
        id: &str,
        missing: &[String],
        uid: u64,
        gid: u64,
        freeze: bool,
    ) -> Result<(), SandboxError> {
        let mut archive = Vec::new();
        for directory in missing {
            let name = format!("{}/", directory.trim_start_matches('/'));
            archive.extend(directory_entry(&name, uid, gid).map_err(SandboxError::invalid)?);
        }
        archive.extend([0u8; 1024]);
        let frozen = if freeze {
            self.lifecycle("pause", id).await?;
            Some(UnpauseOnDrop::armed(self, id))
        } else {
            None
        };
        let shape = CallShape {
            deadline: self.config.command_timeout,
            budget: SMALL_BUDGET,
            stdin: Some(archive),
            stop_after: None,
            on_line: None,
        };
        let destination = format!("{id}:/");
        let result = self
            .cli
            .run_management(
                "docker cp (storage base)",
                ["cp", "-", destination.as_str()],
                shape,
            )
            .await;
        if let Some(mut guard) = frozen {
            guard.disarm();
            self.unpause_shielded(id).await?;
        }
        let output = result?;
        if output.status != ExitKind::Exited(0) {
            return Err(self.engine_failure("docker cp (storage base)", &output.stderr));
        }
        Ok(())
    }

    async fn unpause_shielded(self: &Arc<Self>, id: &str) -> Result<(), SandboxError> {
        let shared = Arc::clone(self);
        let id = id.to_owned();
        tokio::spawn(async move { shared.lifecycle("unpause", &id).await })
            .await
            .unwrap_or_else(|e| Err(SandboxError::engine(format!("unpause task failed: {e}"))))
    }

    /// A backend-internal command through the wrapper, cwd `/`, under the command timeout.
    pub(crate) async fn guest_internal(
        self: &Arc<Self>,
        id: &str,
        argv: &[&str],
    ) -> Result<sandbox_core::ExecOutput, SandboxError> {
        let call = GuestCall::internal("/", argv, SMALL_BUDGET as u64, self.config.command_timeout);
        match self.run_guest(id, call).await? {
            GuestEnd::Ran(output) => Ok(output),
            GuestEnd::Expired(_) => Err(SandboxError::EngineTimeout {
                operation: format!("guest {}", argv.first().copied().unwrap_or("command")),
                bound: self.config.command_timeout,
            }),
            GuestEnd::Overflowed(_) => Err(SandboxError::engine(format!(
                "guest {} wrote more than {SMALL_BUDGET} bytes",
                argv.first().copied().unwrap_or("command")
            ))),
        }
    }

    /// `find` (rule 36): never creates, never removes.
    pub(crate) async fn find_sandbox(
        self: &Arc<Self>,
        key: &SandboxKey,
        kind: &str,
    ) -> Result<Option<Arc<DockerSandbox>>, SandboxError> {
        let name = docker_container_name(key, kind, "");
        let lock = self.name_lock(&name);
        let _serialised = lock.lock().await;
        let Some(record) = self.inspect(&name).await? else {
            return Ok(None);
        };
        record
            .verify(key, kind, None, None)
            .map_err(|verdict| refusal(&name, verdict))?;
        if self.is_retired(&record.id) {
            return Err(SandboxError::Retired {
                instance: record.id.clone(),
                reason: "a timed-out command's kill did not land".to_owned(),
            });
        }
        match record.status() {
            "running" => {}
            "paused" => {
                self.forget_warm(&record.id);
                self.lifecycle("unpause", &record.id).await?;
            }
            "created" | "exited" => {
                self.forget_warm(&record.id);
                self.recheck_os().await?;
                self.lifecycle("start", &record.id).await?;
            }
            other => {
                return Err(SandboxError::engine(format!(
                    "container {name} is {other}; find never replaces it, acquire does"
                )))
            }
        }
        let base = record.work_dir().ok_or_else(|| {
            SandboxError::engine(format!(
                "container {name} records no storage base: it was not made by this backend's rules"
            ))
        })?;
        let image = record.image().unwrap_or_default().to_owned();
        self.probe_tools(&record.id, &image).await?;
        let ceiling = self.declarations.limits;
        self.remember(
            &name,
            Remembered {
                key: key.clone(),
                kind: kind.to_owned(),
                id: record.id.clone(),
            },
        );
        Ok(Some(Arc::new(DockerSandbox::new(
            Arc::clone(self),
            record.id,
            base,
            false,
            ceiling.files_in,
            ceiling.files_out,
        ))))
    }
}

fn min_limits(a: TransferLimits, b: TransferLimits) -> TransferLimits {
    TransferLimits {
        max_bytes_per_file: a.max_bytes_per_file.min(b.max_bytes_per_file),
        max_total_bytes: a.max_total_bytes.min(b.max_total_bytes),
        max_files: a.max_files.min(b.max_files),
    }
}

/// Rule 14's refusals in core terms.
#[cold]
fn refusal(name: &str, verdict: Verdict) -> SandboxError {
    match verdict {
        Verdict::NotOurs => SandboxError::engine(format!(
            "a container named {name} exists that this key did not create; dispose it"
        )),
        Verdict::OtherBase(recorded) => SandboxError::SpecMismatch(format!(
            "container {name} records storage base {}; dispose before changing the storage base",
            recorded.as_deref().unwrap_or("(none)")
        )),
        Verdict::OtherImage(image) => SandboxError::SpecMismatch(format!(
            "container {name} runs image {}; dispose it before changing the image",
            image.as_deref().unwrap_or("(none)")
        )),
        Verdict::OtherPolicy(difference) => SandboxError::SpecMismatch(format!(
            "container {name}: {difference}; its runtime policy differs from this configuration; dispose it first"
        )),
    }
}

/// Removes a container this acquire created if the acquire's future is dropped before it ends.
struct DiscardOnDrop {
    pending: Option<(Arc<Shared>, String)>,
}

impl DiscardOnDrop {
    fn armed(shared: &Arc<Shared>, id: &str) -> Self {
        DiscardOnDrop {
            pending: Some((Arc::clone(shared), id.to_owned())),
        }
    }

    fn disarm(&mut self) {
        self.pending = None;
    }
}

impl Drop for DiscardOnDrop {
    fn drop(&mut self) {
        if let Some((shared, id)) = self.pending.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = shared.remove(&id).await;
                });
            }
        }
    }
}

/// Unpauses a container frozen for the storage-base fallback if the future is dropped.
struct UnpauseOnDrop {
    pending: Option<(Arc<Shared>, String)>,
}

impl UnpauseOnDrop {
    fn armed(shared: &Arc<Shared>, id: &str) -> Self {
        UnpauseOnDrop {
            pending: Some((Arc::clone(shared), id.to_owned())),
        }
    }

    fn disarm(&mut self) {
        self.pending = None;
    }
}

impl Drop for UnpauseOnDrop {
    fn drop(&mut self) {
        if let Some((shared, id)) = self.pending.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = shared.lifecycle("unpause", &id).await;
                });
            }
        }
    }
}

/// The label carrying one create's mark (a per-call nonce). Other backends ignore it.
const CREATE_MARK_LABEL: &str = "maf-sandbox.create-mark";

/// Between a `docker run` and its answer: when the call gives up (its deadline, or the acquire's
/// future is dropped), a task the caller cannot cancel removes the container the daemon may still
/// make under this name, if and only if it carries this create's mark. It holds the name's lock,
/// so no acquire of the same key adopts the container meanwhile.
struct CreateGuard {
    shared: Arc<Shared>,
    name: String,
    mark: Option<String>,
}

impl CreateGuard {
    fn disarm(&mut self) {
        self.mark = None;
    }
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        let Some(mark) = self.mark.take() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let name = std::mem::take(&mut self.name);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let lock = shared.name_lock(&name);
                    let _serialised = lock.lock().await;
                    let patience = shared.config.command_timeout;
                    shared.remove_if_marked(&name, &mark, patience).await;
                });
            }
            Err(_) => tracing::warn!(
                container = %name,
                "a docker run was abandoned outside a tokio runtime; what it made is left for dispose_scope"
            ),
        }
    }
}

impl Shared {
    /// Removes the container named `name` if it carries `mark`, looking for up to `patience` for one
    /// the daemon is still making. A container without the mark is another create's and is kept.
    async fn remove_if_marked(&self, name: &str, mark: &str, patience: Duration) {
        let until = Instant::now() + patience;
        loop {
            match self.inspect(name).await {
                Ok(Some(record)) => {
                    if record.labels().get(CREATE_MARK_LABEL).map(String::as_str) == Some(mark) {
                        if let Err(failure) = self.remove(&record.id).await {
                            tracing::warn!(container = %name, %failure, "an abandoned create could not be removed");
                        }
                    }
                    return;
                }
                Ok(None) | Err(_) if Instant::now() < until => {
                    tokio::time::sleep(ABANDONED_CREATE_POLL).await;
                }
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// How often an abandoned create is looked for.
const ABANDONED_CREATE_POLL: Duration = Duration::from_millis(250);
