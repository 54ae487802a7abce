//! Allowlist egress (docs/docker-backend.md#allowlist-egress): a per-sandbox proxy container on the
//! outbound network, a per-sandbox named volume carrying its Unix socket and its forwarder, and the
//! workload settings that route HTTP(S) through them.
//!
//! The workload keeps network `none`; the volume, mounted read-only in it, is its only way out,
//! and the proxy on the other end of the socket decides. What is enforced is the proxy's: hosts
//! (exact or `*.d`), ports, refused address ranges, and for hosts with method and path rules or
//! credential grants, each request's method and normalised path (the proxy terminates their TLS
//! under a CA of its own, which the workload is made to trust: [`crate::egress_trust`]). Rules go
//! in the proxy's arguments, so a proxy that ever started again without its input would still
//! enforce them; grants and the operator's upstream CA bundle go over its standard input only,
//! never an argument, the environment or a file the workload mounts. Not defended here: what an
//! allowed host does with what it is sent.

use std::collections::HashMap;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{LogsOptionsBuilder, RemoveVolumeOptionsBuilder};
use futures_util::StreamExt as _;
use sandbox_core::backend_kit::run_detached;
use sandbox_core::credential::CredentialGrant;
use sandbox_core::{
    DisposalCode, DisposalFailure, Egress, EgressEntry, EgressRule, SandboxError, SandboxSpec,
};
use sha2::{Digest as _, Sha256};

use crate::config::DockerConfig;
use crate::connection::{quote, ApiFailure};
use crate::containers::{hardened_host_config, Hardening, Lifecycle, Removal, VolumeAccess};
use crate::egress_names::{
    proxy_name, volume_name, FORWARDER, HANDOFF_SOCKET, LABEL_EGRESS_V1, LABEL_ROLE, PROXY_CA_CERT,
    PROXY_SOCKET,
};
use crate::ownership_labels::{ContainerRecord, ContainerSelector};
use std::sync::Arc;

use crate::connection::EngineConnection;
use crate::containers::Containers;
use crate::egress_host::HostAddresses;
use crate::memory::Memories;
use crate::sizing::Sizing;

/// The contract line a proxy prints on stdout once its socket and forwarder are in place.
const READY_LINE: &str = "maf-egress-proxy ready v1";
/// The `egress_id` prefix of a Unix-socket allowlist (never Python's `allow:`).
const EGRESS_ID_PREFIX: &str = "allow-uds-v1:";
/// The proxy's log file size before rotation (two files are kept).
const PROXY_LOG_MAX_SIZE: &str = "10m";
/// How many times one acquire makes a proxy whose name others keep taking and freeing.
const PROXY_ATTEMPTS: usize = 4;
/// The proxy container's pids limit.
const PROXY_PIDS_LIMIT: i64 = 64;
/// How many times the proxy's logs are read for its ready line, and how far apart.
const READY_POLLS: u32 = 60;
const READY_POLL: Duration = Duration::from_millis(250);
/// How much of the proxy's log one poll reads, from its start (the ready line comes first, however
/// long the proxy has been logging since).
const LOG_BUDGET: usize = 64 * 1024;
/// How many log lines a readiness failure quotes, and how long each may be.
const QUOTED_LINES: usize = 10;
const QUOTED_LINE_CHARS: usize = 200;

/// What an allowlist sandbox needs, decided before touching the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EgressPlan {
    /// The allowed hosts, sorted.
    pub(crate) hosts: Vec<String>,
    /// Whether private destinations are dialled.
    pub(crate) private: bool,
    /// The part of the name (see [`egress_id`]).
    pub(crate) egress_id: String,
    /// SHA-256 (hex) of the whole policy: id, proxy image, outbound network, ports.
    pub(crate) digest: String,
    /// The proxy image.
    pub(crate) image: String,
    /// The proxy's outbound network.
    pub(crate) network: String,
    /// The method and path rules, as the proxy's `--rule` takes them, in the spec's order.
    pub(crate) rules: Vec<String>,
    /// The credential grants, given to the proxy over its standard input.
    pub(crate) grants: Vec<CredentialGrant>,
    /// The operator's upstream CA bundle (PEM), given to the proxy over its standard input.
    pub(crate) upstream_ca: Option<String>,
}

impl EgressPlan {
    /// Whether the proxy terminates TLS for some host (it has rules or grants): the workload
    /// then trusts the proxy's CA.
    pub(crate) fn terminates(&self) -> bool {
        !self.rules.is_empty() || !self.grants.is_empty()
    }

    /// What the proxy reads on its standard input: one JSON line per grant, then the upstream
    /// bundle; empty when the proxy terminates nothing (its input is then never opened).
    pub(crate) fn stdin_config(&self) -> String {
        if !self.terminates() {
            return String::new();
        }
        let mut text = String::new();
        for grant in &self.grants {
            text.push_str(&egress_proxy::rules::grant_line(grant));
            text.push('\n');
        }
        if let Some(pem) = &self.upstream_ca {
            text.push_str(&serde_json::json!({ "upstream_ca_pem": pem }).to_string());
            text.push('\n');
        }
        text
    }
}

/// Refuses, before any engine call, a method the proxy does not take: it enforces methods
/// spelled in upper-case letters only (`GET`, `POST`), a narrower grammar than the contract's.
fn letters_only(methods: &[String]) -> Result<(), SandboxError> {
    match methods
        .iter()
        .find(|m| !m.bytes().all(|b| b.is_ascii_uppercase()))
    {
        Some(method) => Err(SandboxError::CapabilityNotSupported(format!(
            "the docker egress proxy enforces methods of upper-case letters only; {method:?} is not one"
        ))),
        None => Ok(()),
    }
}

/// A rule as the proxy's `--rule` takes it: `HOST METHODS PATHS`, `*` for every method and `/*`
/// for every path.
pub(crate) fn rule_text(rule: &EgressRule) -> String {
    let methods = rule.methods().map_or("*".to_owned(), |m| m.join(","));
    let paths = rule.paths().map_or("/*".to_owned(), |p| p.join(","));
    format!("{} {methods} {paths}", rule.host())
}

/// The egress part of an acquire: `None` for `closed`.
///
/// # Errors
/// EgressNotEnforced for `unrestricted`, or for `allowlist` without a configured proxy image.
pub(crate) fn plan(
    spec: &SandboxSpec,
    config: &DockerConfig,
) -> Result<Option<EgressPlan>, SandboxError> {
    match spec.egress() {
        Egress::Closed => Ok(None),
        Egress::Allowlist => {
            let Some(image) = config.proxy_image() else {
                return Err(SandboxError::EgressNotEnforced(
                    "the docker backend offers egress allowlist only when an egress proxy image is \
                     configured (egress_proxy_image)"
                        .to_owned(),
                ));
            };
            let mut hosts = Vec::new();
            let mut shown = Vec::new();
            let mut rules = Vec::new();
            for entry in spec.egress_allow() {
                hosts.push(entry.host().to_owned());
                shown.push(entry.to_string());
                if let EgressEntry::Rule(rule) = entry {
                    letters_only(rule.methods().unwrap_or_default())?;
                    rules.push(rule_text(rule));
                }
            }
            if hosts.is_empty() {
                return Err(SandboxError::invalid(
                    "egress allowlist needs at least one allowed host",
                ));
            }
            hosts.sort();
            shown.sort();
            let private = config.allow_private_destinations;
            let mut egress_id = egress_id(&shown, private);
            let grants = spec.credentials().to_vec();
            for grant in &grants {
                letters_only(grant.methods().unwrap_or_default())?;
            }
            if !grants.is_empty() {
                let mut origins: Vec<String> = grants
                    .iter()
                    .map(|g| format!("{}:{}", g.host(), g.port()))
                    .collect();
                origins.sort();
                origins.dedup();
                egress_id.push_str(&format!(":credentials={}", origins.join(",")));
            }
            let network = config.outbound_network.clone();
            let upstream_ca = config
                .egress_upstream_ca_pem
                .clone()
                .filter(|pem| !pem.is_empty());
            let mut plan = EgressPlan {
                hosts,
                private,
                egress_id,
                digest: String::new(),
                image: image.to_owned(),
                network,
                rules,
                grants,
                upstream_ca,
            };
            plan.digest = policy_digest(&plan);
            Ok(Some(plan))
        }
        other => Err(SandboxError::EgressNotEnforced(format!(
            "the docker backend enforces egress closed and allowlist only; the spec asks for {other}"
        ))),
    }
}

/// The egress part of a name (docs/docker-backend.md#allowlist-egress): `allow-uds-v1:` + the
/// sorted display strings joined by `,` +
/// `:private=<bool>`.
pub(crate) fn egress_id(sorted_hosts: &[String], private: bool) -> String {
    format!(
        "{EGRESS_ID_PREFIX}{}:private={private}",
        sorted_hosts.join(",")
    )
}

/// SHA-256 (lowercase hex) of the policy a proxy runs: what it allows, with which image, from which
/// network, denying what. A proxy carrying another digest is replaced (so a proxy started before
/// the engine host's addresses were denied is replaced on its next acquire).
///
/// A plan with rules, grants or an upstream bundle adds them: the rules as written, the bundle's
/// SHA-256, and the grants' input digested with this process's random salt, so the label (which
/// anyone who can inspect the container reads) never lets a token be guessed offline. Another
/// process's salt differs: a proxy with grants is replaced by the first acquire of each process,
/// and then kept while its grants stay the same.
pub(crate) fn policy_digest(plan: &EgressPlan) -> String {
    let EgressPlan {
        egress_id,
        image,
        network,
        ..
    } = plan;
    let mut text = format!(
        "maf-egress-policy-v1\n{egress_id}\nimage={image}\nnetwork={network}\nports=80,443\n\
         deny=gateways,engine-host-addresses\n"
    );
    if plan.terminates() || plan.upstream_ca.is_some() {
        text.push_str("terminate-v1\n");
        for rule in &plan.rules {
            text.push_str(&format!("rule={rule}\n"));
        }
        if let Some(pem) = &plan.upstream_ca {
            text.push_str(&format!("upstream-ca={}\n", hex(&Sha256::digest(pem))));
        }
        if !plan.grants.is_empty() {
            let mut salted = Sha256::new();
            salted.update(process_salt().as_bytes());
            salted.update(plan.stdin_config().as_bytes());
            text.push_str(&format!("grants={}\n", hex(&salted.finalize())));
        }
    }
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// This process's random salt for the grants' digest.
fn process_salt() -> &'static str {
    static SALT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SALT.get_or_init(|| {
        exec_wrapper::new_nonce()
            .map(|nonce| nonce.as_str().to_owned())
            // Without randomness the salt is this process's identity and start: never a value
            // an outsider can precompute a table of tokens for.
            .unwrap_or_else(|_| format!("{}-{:?}", std::process::id(), std::time::Instant::now()))
    })
}

/// The proxy's arguments (its image's entrypoint is the binary); `denied` are the addresses it
/// never dials (the outbound network's gateways, the engine host's addresses).
pub(crate) fn proxy_command(plan: &EgressPlan, denied: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "proxy",
        "--socket",
        PROXY_SOCKET,
        "--handoff-socket",
        HANDOFF_SOCKET,
        "--install-forwarder",
        FORWARDER,
    ]
    .map(str::to_owned)
    .to_vec();
    for host in &plan.hosts {
        args.extend(["--allow".to_owned(), host.clone()]);
    }
    for rule in &plan.rules {
        args.extend(["--rule".to_owned(), rule.clone()]);
    }
    if plan.terminates() {
        args.extend(["--stdin-config", "--ca-cert-out", PROXY_CA_CERT].map(str::to_owned));
    }
    if plan.private {
        args.push("--allow-private".to_owned());
    }
    for address in denied {
        args.extend(["--deny-address".to_owned(), address.clone()]);
    }
    args
}

/// Whether the proxy's stdout holds the ready line.
pub(crate) fn is_ready(stdout: &str) -> bool {
    stdout
        .lines()
        .any(|line| line.trim_end_matches('\r') == READY_LINE)
}

/// The last non-blank log lines, each bounded and with control characters escaped, for an error.
pub(crate) fn log_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(QUOTED_LINES);
    lines[start..]
        .iter()
        .map(|line| {
            let bounded: String = line.chars().take(QUOTED_LINE_CHARS).collect();
            bounded.escape_debug().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An allowlist sandbox's companions on the engine: its egress proxy and the volume it shares
/// with the workload.
#[derive(Debug)]
pub(crate) struct EgressCompanions {
    engine: EngineConnection,
    config: Arc<DockerConfig>,
    containers: Arc<Containers>,
    /// What the proxy is told to deny besides the gateways.
    host_addresses: HostAddresses,
    /// The proxy's resources, as a workload's.
    sizing: Arc<Sizing>,
    memory: Arc<Memories>,
    /// Who hands the proxies' decisions to the configured observer.
    followers: crate::egress_events::EgressFollowers,
}

impl EgressCompanions {
    pub(crate) fn new(
        engine: EngineConnection,
        config: Arc<DockerConfig>,
        containers: Arc<Containers>,
        sizing: Arc<Sizing>,
        memory: Arc<Memories>,
    ) -> Self {
        EgressCompanions {
            host_addresses: HostAddresses::new(Arc::clone(&containers)),
            followers: crate::egress_events::EgressFollowers::new(
                engine.clone(),
                config.egress_observer.clone(),
            ),
            engine,
            config,
            containers,
            sizing,
            memory,
        }
    }

    /// Makes sure the sandbox `workload` has a ready proxy running `plan`: an owned proxy that is
    /// running with this policy's digest and has said it is ready is kept; anything else is
    /// replaced (the volume is created when missing). Never returns before the ready line.
    /// Returns the proxy's container id.
    ///
    /// # Errors
    /// Engine when a container or volume under the companion names belongs to another key, when
    /// the proxy runs as root, or when it does not get ready (quoting its last log lines).
    pub(crate) async fn ensure_proxy(
        &self,
        workload: &str,
        plan: &EgressPlan,
        labels: &[(String, String)],
    ) -> Result<String, SandboxError> {
        for _ in 0..PROXY_ATTEMPTS {
            if let Some(id) = self.ensure_proxy_once(workload, plan, labels).await? {
                return Ok(id);
            }
        }
        Err(SandboxError::engine(format!(
            "the egress proxy {} kept disappearing while it was being made",
            proxy_name(workload)
        )))
    }

    /// One pass of [`ensure_proxy`](Self::ensure_proxy): the ready proxy's id, or `None` when
    /// the name was taken by a proxy that vanished before it could be read (another process
    /// replacing it), so the pass is worth repeating.
    async fn ensure_proxy_once(
        &self,
        workload: &str,
        plan: &EgressPlan,
        labels: &[(String, String)],
    ) -> Result<Option<String>, SandboxError> {
        let name = proxy_name(workload);
        if let Some(existing) = self.containers.inspect(&name).await? {
            let owned = owned_like(&existing.labels(), labels);
            if !owned {
                return Err(SandboxError::engine(format!(
                    "a container named {name} exists that this key did not create; dispose it"
                )));
            }
            // A current proxy may be another process's, created and not yet started, or
            // started and not yet ready: it gets the ready polls before it is judged broken.
            // A running one this process saw ready is not read again (its log may have been
            // rotated since).
            let current = existing.labels().get(LABEL_EGRESS_V1) == Some(&plan.digest)
                && matches!(existing.status(), "running" | "created");
            if current
                && existing.status() == "running"
                && self.memory.ready_proxies.contains(&existing.id)
            {
                return Ok(Some(existing.id));
            }
            if current && self.await_ready(&name, &existing.id).await.is_ok() {
                return Ok(Some(existing.id));
            }
            tracing::info!(proxy = %name, "replacing an egress proxy that is stopped, not ready or on another policy");
            self.containers
                .remove(&existing.id)
                .await
                .map_err(|failure| {
                    SandboxError::engine(format!(
                        "could not remove the egress proxy {name} to replace it: {failure}"
                    ))
                })?;
        }
        // Present, or one explicit bounded pull, as for a workload's image (ImageMissing else).
        self.containers.ensure_image(&plan.image).await?;
        // Never dialled: the outbound network's gateways and every address of the engine host
        // (a service on the host bound to 0.0.0.0 answers on all of them).
        let mut denied = self.outbound_gateways(&plan.network).await?;
        denied.extend(
            self.host_addresses
                .addresses(&plan.image)
                .await?
                .iter()
                .map(ToString::to_string),
        );
        denied.sort();
        denied.dedup();
        let volume = volume_name(workload);
        self.ensure_volume(&volume, plan, labels).await?;
        let mut proxy_labels: HashMap<String, String> = labels.iter().cloned().collect();
        proxy_labels.insert(LABEL_ROLE.to_owned(), "proxy".to_owned());
        proxy_labels.insert(LABEL_EGRESS_V1.to_owned(), plan.digest.clone());
        let resources = self.sizing.resources().await;
        let host_config = HostConfig {
            readonly_rootfs: Some(true),
            // Readable logs (the ready line), bounded on disk: one line per request.
            log_config: Some(bollard::models::HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(HashMap::from([
                    ("max-size".to_owned(), PROXY_LOG_MAX_SIZE.to_owned()),
                    ("max-file".to_owned(), "2".to_owned()),
                ])),
            }),
            ..hardened_host_config(Hardening {
                pids_limit: PROXY_PIDS_LIMIT,
                resources,
                network: &plan.network,
                egress_volume: Some((&volume, VolumeAccess::ReadWrite)),
                // The proxy is this crate's own code on the outbound network, never the guest's:
                // the engine's default runtime.
                runtime: None,
            })
        };
        // A proxy that terminates reads its grants and bundle on a standard input that closes
        // once the one attached writer (this process) has written them.
        let input = plan.terminates();
        let body = ContainerCreateBody {
            image: Some(plan.image.clone()),
            cmd: Some(proxy_command(plan, &denied)),
            labels: Some(proxy_labels),
            host_config: Some(host_config),
            open_stdin: Some(input),
            stdin_once: Some(input),
            attach_stdin: Some(input),
            ..ContainerCreateBody::default()
        };
        let id = match self
            .containers
            .create_named(&name, &plan.image, body, "egress proxy create")
            .await?
        {
            Ok(id) => id,
            // Another process made it meanwhile: its proxy, once ready, serves this policy too.
            // The engine holds the name from the start of a create, before an inspect finds it:
            // the name is re-inspected every 0.25 s within one command timeout.
            Err(_taken) => {
                let until = tokio::time::Instant::now() + self.config.command_timeout;
                let existing = loop {
                    match self.containers.inspect(&name).await? {
                        Some(existing) => break existing,
                        None if tokio::time::Instant::now() < until => {
                            tokio::time::sleep(READY_POLL).await;
                        }
                        None => return Ok(None),
                    }
                };
                if !owned_like(&existing.labels(), labels)
                    || existing.labels().get(LABEL_EGRESS_V1) != Some(&plan.digest)
                {
                    return Err(SandboxError::engine(format!(
                        "another egress proxy took the name {name} meanwhile; acquire again"
                    )));
                }
                return self
                    .await_ready(&name, &existing.id)
                    .await
                    .map(|()| Some(existing.id));
            }
        };
        let result = self.start_proxy(&name, &id, plan).await;
        if result.is_err() {
            let _ = self.containers.remove(&id).await;
        }
        result.map(|()| Some(id))
    }

    /// Starts a created proxy, checks it is not root, gives a terminating proxy its standard
    /// input, and waits for its ready line.
    async fn start_proxy(
        &self,
        name: &str,
        id: &str,
        plan: &EgressPlan,
    ) -> Result<(), SandboxError> {
        let record = self.containers.inspect(id).await?.ok_or_else(|| {
            SandboxError::engine(format!("the egress proxy {name} vanished after its create"))
        })?;
        if record.runs_as_root() {
            return Err(SandboxError::engine(format!(
                "the egress proxy image {} runs as root; it must name a non-root user",
                record.image().unwrap_or("(unknown)")
            )));
        }
        if plan.terminates() {
            self.start_with_input(name, id, plan.stdin_config()).await?;
        } else {
            self.containers.lifecycle(Lifecycle::Start, id).await?;
        }
        self.await_ready(name, id).await
    }

    /// Attaches to the proxy's standard input, starts it, writes `input` and closes it: the
    /// grants travel on the engine's attach stream only, never in the container's
    /// configuration, its logs or a file.
    async fn start_with_input(
        &self,
        name: &str,
        id: &str,
        input: String,
    ) -> Result<(), SandboxError> {
        use tokio::io::AsyncWriteExt as _;
        let options = bollard::query_parameters::AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stream(true)
            .build();
        let attached = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().attach_container(id, Some(options)),
            )
            .await
            .map_err(|f| self.engine.failure("egress proxy attach", f))?;
        self.containers.lifecycle(Lifecycle::Start, id).await?;
        let mut writer = attached.input;
        let written = tokio::time::timeout(self.config.command_timeout, async {
            writer.write_all(input.as_bytes()).await?;
            writer.flush().await?;
            writer.shutdown().await
        })
        .await;
        drop(writer);
        drop(attached.output);
        match written {
            Ok(Ok(())) => Ok(()),
            // Never the input itself: it carries tokens.
            Ok(Err(error)) => Err(SandboxError::engine(format!(
                "could not give the egress proxy {name} its grants: {}",
                error.kind()
            ))),
            Err(_) => Err(SandboxError::engine(format!(
                "giving the egress proxy {name} its grants took longer than {} s",
                self.config.command_timeout.as_secs()
            ))),
        }
    }

    /// Reads the proxy's log for its ready line, 60 times 0.25 s apart, giving up early when it
    /// exited.
    ///
    /// # Errors
    /// Engine quoting its last log lines when the line never came.
    async fn await_ready(&self, name: &str, id: &str) -> Result<(), SandboxError> {
        let mut logs = String::new();
        for poll in 0..READY_POLLS {
            let (ready, text) = self.proxy_ready(id).await?;
            if ready {
                self.memory.ready_proxies.mark(id);
                return Ok(());
            }
            logs = text;
            if poll % 4 == 3 {
                if let Some(record) = self.containers.inspect(id).await? {
                    if matches!(record.status(), "exited" | "dead") {
                        break;
                    }
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
        Err(SandboxError::engine(format!(
            "the egress proxy {name} did not print {READY_LINE:?}; its last log lines:\n{}",
            log_tail(&logs)
        )))
    }

    /// One read of the proxy's log from its start, up to the ready line or the budget: whether
    /// stdout holds the ready line, and the log as read.
    async fn proxy_ready(&self, id: &str) -> Result<(bool, String), SandboxError> {
        let options = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .tail("all")
            .build();
        let read = async {
            let mut stream = self.engine.api().logs(id, Some(options));
            let (mut stdout, mut all) = (Vec::new(), Vec::new());
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if let LogOutput::StdOut { message } | LogOutput::Console { message } = &chunk {
                    stdout.extend_from_slice(message);
                    if is_ready(&String::from_utf8_lossy(&stdout)) {
                        break;
                    }
                }
                all.extend_from_slice(chunk.as_ref());
                if all.len() > LOG_BUDGET {
                    break;
                }
            }
            Ok((stdout, all))
        };
        let (stdout, all) = self
            .engine
            .call(self.config.command_timeout, read)
            .await
            .map_err(|f| self.engine.failure("egress proxy logs", f))?;
        Ok((
            is_ready(&String::from_utf8_lossy(&stdout)),
            String::from_utf8_lossy(&all).into_owned(),
        ))
    }

    /// Creates the egress volume, or checks that the one already there is this key's.
    async fn ensure_volume(
        &self,
        volume: &str,
        plan: &EgressPlan,
        labels: &[(String, String)],
    ) -> Result<(), SandboxError> {
        let mut volume_labels: HashMap<String, String> = labels.iter().cloned().collect();
        volume_labels.insert(LABEL_ROLE.to_owned(), "egress-volume".to_owned());
        volume_labels.insert(LABEL_EGRESS_V1.to_owned(), plan.digest.clone());
        let request = bollard::models::VolumeCreateRequest {
            name: Some(volume.to_owned()),
            driver: Some("local".to_owned()),
            labels: Some(volume_labels),
            ..Default::default()
        };
        let made = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().create_volume(request),
            )
            .await
            .map_err(|f| self.engine.failure("egress volume create", f))?;
        // An existing volume is returned as it is: it must be this key's.
        let existing: std::collections::BTreeMap<String, String> =
            made.labels.into_iter().collect();
        if !owned_like(&existing, labels) {
            return Err(SandboxError::engine(format!(
                "a volume named {volume} exists that this key did not create; remove it"
            )));
        }
        Ok(())
    }

    /// The outbound network's gateways, refused as destinations by the proxy.
    async fn outbound_gateways(&self, network: &str) -> Result<Vec<String>, SandboxError> {
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().inspect_network(
                    network,
                    None::<bollard::query_parameters::InspectNetworkOptions>,
                ),
            )
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(failure) if failure.is_not_found() => {
                return Err(SandboxError::engine(format!(
                    "the egress proxy's outbound network {network:?} does not exist on the engine"
                )))
            }
            Err(failure) => return Err(self.engine.failure("network inspect", failure)),
        };
        let mut gateways = Vec::new();
        for config in answer.ipam.and_then(|ipam| ipam.config).unwrap_or_default() {
            let pair = format!(
                "{} {}",
                config.gateway.unwrap_or_default(),
                config.subnet.unwrap_or_default()
            );
            if let Some(gateway) = gateway_from_ipam(&pair) {
                gateways.push(gateway.to_string());
            }
        }
        gateways.sort();
        gateways.dedup();
        Ok(gateways)
    }

    /// Hands the decisions of proxy `proxy` (a container id) to the configured observer as
    /// events of sandbox `sandbox` (its workload's id), from now on.
    pub(crate) fn follow(&self, proxy: &str, sandbox: &str) {
        self.followers.follow(proxy, sandbox);
    }

    /// Whether a running workload's proxy is up and ready (for `find`, which has no policy to
    /// compare): an owned `-proxy` container, running, that printed its ready line.
    ///
    /// # Errors
    /// Engine when it is not: `find` never replaces a proxy, `acquire` does.
    pub(crate) async fn require_ready_proxy(
        &self,
        workload: &ContainerRecord,
    ) -> Result<(), SandboxError> {
        let name = proxy_name(workload.bare_name());
        let labels: Vec<(String, String)> = workload.labels().into_iter().collect();
        let ready = match self.containers.inspect(&name).await? {
            Some(proxy) if owned_like(&proxy.labels(), &labels) && proxy.status() == "running" => {
                self.proxy_ready(&proxy.id).await?.0
            }
            _ => false,
        };
        if ready {
            Ok(())
        } else {
            Err(SandboxError::engine(format!(
                "the egress proxy {name} of {} is not running and ready; acquire the sandbox again to replace it",
                workload.bare_name()
            )))
        }
    }

    /// Removes a sandbox's proxy and volume (the proxy first: it holds the volume). Missing is
    /// fine; a failure is `unknown`.
    pub(crate) async fn remove_companions(&self, workload: &str) -> Vec<DisposalFailure> {
        let mut failures = Vec::new();
        if let Err(failure) = self.containers.remove(&proxy_name(workload)).await {
            failures.push(companion_failure(failure));
        }
        if let Err(failure) = self.remove_volume(&volume_name(workload)).await {
            failures.push(failure);
        }
        failures
    }

    /// Removes an allowlist sandbox's companions in a task the caller's drop cannot cancel.
    pub(crate) async fn remove_companions_shielded(self: &Arc<Self>, name: &str) {
        let companions = Arc::clone(self);
        let name = name.to_owned();
        let _ = run_detached(async move {
            for failure in companions.remove_companions(&name).await {
                tracing::warn!(sandbox = %name, %failure, "could not remove an egress companion");
            }
        })
        .await;
    }

    /// Removes one volume; absent is fine. Never raises: a failure is `unknown`.
    pub(crate) async fn remove_volume(&self, volume: &str) -> Result<Removal, DisposalFailure> {
        let options = RemoveVolumeOptionsBuilder::new().force(false).build();
        let answer = self
            .engine
            .call(
                self.config.command_timeout,
                self.engine.api().remove_volume(volume, Some(options)),
            )
            .await;
        match answer {
            Ok(()) => Ok(Removal::Removed),
            Err(failure) if failure.is_not_found() => Ok(Removal::Absent),
            Err(failure) => Err(DisposalFailure::new(
                DisposalCode::Unknown,
                format!(
                    "egress volume {volume}: {}",
                    match &failure {
                        ApiFailure::Deadline(bound) =>
                            format!("the removal did not finish within {} s", bound.as_secs()),
                        other => quote(other.message().as_bytes()),
                    }
                ),
            )),
        }
    }

    /// The names of the egress volumes carrying all the selection's labels.
    pub(crate) async fn volume_listing(
        &self,
        selection: &ContainerSelector,
    ) -> Result<Vec<String>, SandboxError> {
        let mut labels = selection.label_filters();
        labels.push(format!("{LABEL_ROLE}=egress-volume"));
        let listed = self
            .engine
            .volumes_labelled(self.config.command_timeout, labels, "volume list")
            .await?;
        Ok(listed.into_iter().map(|volume| volume.name).collect())
    }
}

/// A companion's removal failure is `unknown`, whatever the engine said.
fn companion_failure(failure: DisposalFailure) -> DisposalFailure {
    DisposalFailure::new(
        DisposalCode::Unknown,
        format!("egress proxy {}", failure.detail),
    )
}

/// Whether `found` carries every ownership label of `expected` (the key's fields, call, kind)
/// with the same value.
fn owned_like(
    found: &std::collections::BTreeMap<String, String>,
    expected: &[(String, String)],
) -> bool {
    use sandbox_core::naming::docker::{
        LABEL_AGENT, LABEL_CALL, LABEL_KIND, LABEL_SCOPE, LABEL_THREAD,
    };
    [
        LABEL_SCOPE,
        LABEL_THREAD,
        LABEL_AGENT,
        LABEL_CALL,
        LABEL_KIND,
    ]
    .iter()
    .all(|label| {
        let want = expected.iter().find(|(k, _)| k == label).map(|(_, v)| v);
        found.get(*label) == want
    })
}

/// The gateway from `<gateway> <subnet>` pairs: the explicit one, else (engines that leave it
/// implicit) the subnet's first host address, which is where the engine puts it.
pub(crate) fn gateway_from_ipam(answer: &str) -> Option<std::net::IpAddr> {
    let words: Vec<&str> = answer.split_whitespace().collect();
    let explicit = words
        .iter()
        .filter_map(|word| word.parse::<std::net::IpAddr>().ok())
        .find(|ip| !ip.is_unspecified());
    explicit.or_else(|| {
        words.iter().find_map(|word| {
            let (network, prefix) = word.split_once('/')?;
            let network: std::net::Ipv4Addr = network.parse().ok()?;
            let prefix: u32 = prefix.parse().ok()?;
            (prefix < 31).then(|| std::net::IpAddr::V4((u32::from(network) + 1).into()))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    fn spec(hosts: &[&str]) -> SandboxSpec {
        let mut builder = SandboxSpec::builder("k").egress(Egress::Allowlist);
        for host in hosts {
            builder = builder.allow(*host);
        }
        builder.build().unwrap()
    }

    fn offering() -> DockerConfig {
        DockerConfig {
            egress_proxy_image: Some("sandbox-egress-proxy:local".into()),
            ..DockerConfig::default()
        }
    }

    #[test]
    fn the_egress_id_sorts_the_display_strings_and_names_the_private_flag() {
        let plan = plan(&spec(&["b.test", "a.test", "*.c.test"]), &offering())
            .unwrap()
            .unwrap();
        assert_eq!(
            plan.egress_id,
            "allow-uds-v1:*.c.test,a.test,b.test:private=false"
        );
        let private = DockerConfig {
            allow_private_destinations: true,
            ..offering()
        };
        let other = super::plan(&spec(&["a.test", "b.test", "*.c.test"]), &private)
            .unwrap()
            .unwrap();
        assert_eq!(
            other.egress_id,
            "allow-uds-v1:*.c.test,a.test,b.test:private=true"
        );
        assert_ne!(plan.digest, other.digest);
        assert_eq!(plan.digest.len(), 64);
        // The order the spec listed them in does not change the name or the policy.
        let again = super::plan(&spec(&["a.test", "*.c.test", "b.test"]), &offering())
            .unwrap()
            .unwrap();
        assert_eq!(again, plan);
        // The outbound network and the image are part of the policy, not of the name.
        let moved = DockerConfig {
            outbound_network: "other".into(),
            ..offering()
        };
        let moved = super::plan(&spec(&["a.test", "b.test", "*.c.test"]), &moved)
            .unwrap()
            .unwrap();
        assert_eq!(moved.egress_id, plan.egress_id);
        assert_ne!(moved.digest, plan.digest);
    }

    #[test]
    fn the_egress_id_enters_the_container_name() {
        let key = sandbox_core::SandboxKey::conversation("prod", "thread-1", "agent");
        let closed = sandbox_core::naming::docker::docker_container_name(&key, "python", "");
        assert_eq!(closed, "maf-sandbox-docker-aef172d1c789");
        let id = egress_id(&["allowed.test".to_owned()], true);
        let allow = sandbox_core::naming::docker::docker_container_name(&key, "python", &id);
        assert_ne!(allow, closed);
        let preimage = sandbox_core::naming::docker::docker_name_preimage(&[
            "prod",
            "thread-1",
            "agent",
            "python",
            "allow-uds-v1:allowed.test:private=true",
        ]);
        let digest: String = Sha256::digest(&preimage)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(allow, format!("maf-sandbox-docker-{}", &digest[..12]));
    }

    #[test]
    fn refusals_are_typed() {
        let none = plan(&spec(&["a.test"]), &DockerConfig::default()).unwrap_err();
        assert_eq!(none.kind(), ErrorKind::EgressNotEnforced);
        let empty_image = DockerConfig {
            egress_proxy_image: Some(String::new()),
            ..DockerConfig::default()
        };
        assert_eq!(
            plan(&spec(&["a.test"]), &empty_image).unwrap_err().kind(),
            ErrorKind::EgressNotEnforced
        );
        let open = SandboxSpec::builder("k")
            .egress(Egress::Unrestricted)
            .build()
            .unwrap();
        assert_eq!(
            plan(&open, &offering()).unwrap_err().kind(),
            ErrorKind::EgressNotEnforced
        );
        assert_eq!(
            plan(&SandboxSpec::builder("k").build().unwrap(), &offering()).unwrap(),
            None
        );
    }

    #[test]
    fn the_proxy_command_follows_the_contract() {
        let config = DockerConfig {
            allow_private_destinations: true,
            ..offering()
        };
        let plan = plan(&spec(&["b.test", "a.test"]), &config)
            .unwrap()
            .unwrap();
        let args = proxy_command(&plan, &["172.18.0.1".to_owned()]);
        assert_eq!(
            args.join(" "),
            "proxy --socket /run/maf-egress/proxy.sock --handoff-socket /run/maf-egress/handoff.sock \
             --install-forwarder /run/maf-egress/egress-proxy \
             --allow a.test --allow b.test --allow-private --deny-address 172.18.0.1"
        );
        let public = super::plan(&spec(&["a.test"]), &offering())
            .unwrap()
            .unwrap();
        assert!(!proxy_command(&public, &[]).contains(&"--allow-private".to_owned()));
    }

    #[test]
    fn readiness_and_the_quoted_tail() {
        assert!(is_ready("starting\nmaf-egress-proxy ready v1\n"));
        assert!(is_ready("maf-egress-proxy ready v1\r\n"));
        assert!(!is_ready("maf-egress-proxy ready v10\n"));
        assert!(!is_ready(" maf-egress-proxy ready v1"));
        let log: String = (0..15).map(|i| format!("line {i}\n\n")).collect();
        let tail = log_tail(&format!("{log}\x1b[31m{}\n", "x".repeat(300)));
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), 10);
        assert_eq!(lines[0], "line 6");
        assert!(lines[9].starts_with("\\u{1b}[31m"), "{}", lines[9]);
        assert!(!lines[9].contains('\x1b'));
        assert_eq!(lines[9].matches('x').count(), 200 - 5);
    }

    #[test]
    fn ownership_of_companions_is_by_the_key_labels() {
        let key = sandbox_core::SandboxKey::conversation("s", "t", "a");
        let labels = crate::ownership_labels::workload_labels(
            &key,
            "k",
            &std::collections::BTreeMap::new(),
            "/w",
        );
        let found: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
        assert!(owned_like(&found, &labels));
        let call = crate::ownership_labels::workload_labels(
            &key.with_call("c"),
            "k",
            &std::collections::BTreeMap::new(),
            "/w",
        );
        assert!(!owned_like(&found, &call));
        let mut other = found.clone();
        other.insert("maf-sandbox.kind".into(), "x".into());
        assert!(!owned_like(&other, &labels));
    }

    fn grant(host: &str, token: &str, expires: u64) -> CredentialGrant {
        CredentialGrant::new(
            host,
            443,
            Some(vec!["GET".into()]),
            vec!["/v1/*".into()],
            sandbox_core::credential::BearerToken::new(token).unwrap(),
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(expires),
        )
        .unwrap()
    }

    fn ruled(grants: &[CredentialGrant]) -> SandboxSpec {
        let rule = EgressRule::new(
            "api.test",
            Some(vec!["GET".into(), "HEAD".into()]),
            Some(vec!["/v1/*".into(), "/health".into()]),
        )
        .unwrap();
        let mut builder = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow("b.test")
            .allow(EgressEntry::Rule(rule));
        for g in grants {
            builder = builder.credential(g.clone());
        }
        builder.build().unwrap()
    }

    #[test]
    fn rules_reach_the_proxy_as_arguments_and_terminate_it() {
        let only_paths = EgressRule::new("a.test", None, Some(vec!["/x".into()])).unwrap();
        assert_eq!(rule_text(&only_paths), "a.test * /x");
        let only_methods = EgressRule::new("*.a.test", Some(vec!["POST".into()]), None).unwrap();
        assert_eq!(rule_text(&only_methods), "*.a.test POST /*");

        let plan = plan(&ruled(&[]), &offering()).unwrap().unwrap();
        assert!(plan.terminates());
        assert_eq!(plan.hosts, ["api.test", "b.test"]);
        assert_eq!(plan.rules, ["api.test GET,HEAD /v1/*,/health"]);
        assert_eq!(
            plan.egress_id,
            "allow-uds-v1:api.test (GET, HEAD; /v1/*, /health),b.test:private=false"
        );
        let args = proxy_command(&plan, &[]).join(" ");
        assert!(
            args.ends_with(
                "--allow api.test --allow b.test --rule api.test GET,HEAD /v1/*,/health \
                 --stdin-config --ca-cert-out /run/maf-egress/ca.pem"
            ),
            "{args}"
        );
        assert_eq!(plan.stdin_config(), "");
        // Hosts alone: today's proxy, no input, no CA, and the same digest as before rules.
        let bare = super::plan(&spec(&["api.test", "b.test"]), &offering())
            .unwrap()
            .unwrap();
        assert!(!bare.terminates());
        assert!(!proxy_command(&bare, &[]).contains(&"--stdin-config".to_owned()));
        assert_ne!(bare.digest, plan.digest);
        assert_ne!(bare.egress_id, plan.egress_id);
    }

    #[test]
    fn grants_go_to_standard_input_only_and_their_digest_is_salted() {
        let token = "grant-token-SECRET";
        let g = grant("api.test", token, 4_102_444_800);
        let plan = plan(&ruled(std::slice::from_ref(&g)), &offering())
            .unwrap()
            .unwrap();
        assert!(
            plan.egress_id.ends_with(":credentials=api.test:443"),
            "{}",
            plan.egress_id
        );
        let args = proxy_command(&plan, &[]).join(" ");
        assert!(!args.contains(token), "{args}");
        assert!(!plan.digest.contains(token));
        assert!(!format!("{plan:?}").contains(token));
        let input = plan.stdin_config();
        let line: serde_json::Value = serde_json::from_str(input.trim_end()).unwrap();
        assert_eq!(
            line,
            serde_json::json!({
                "host": "api.test", "port": 443, "methods": ["GET"], "paths": ["/v1/*"],
                "token": token, "expires_unix": 4_102_444_800u64,
            })
        );
        // Another token or expiry is another policy: the proxy is made again with it.
        let other = super::plan(
            &ruled(&[grant("api.test", "another", 4_102_444_800)]),
            &offering(),
        )
        .unwrap()
        .unwrap();
        assert_ne!(other.digest, plan.digest);
        assert_eq!(other.egress_id, plan.egress_id);
        let later = super::plan(
            &ruled(&[grant("api.test", token, 4_102_444_801)]),
            &offering(),
        )
        .unwrap()
        .unwrap();
        assert_ne!(later.digest, plan.digest);
        let again = super::plan(&ruled(&[g]), &offering()).unwrap().unwrap();
        assert_eq!(again.digest, plan.digest);
        // The digest is not the unsalted hash of the input.
        assert_ne!(plan.digest, hex(&Sha256::digest(input.as_bytes())));

        // A grant alone (no rule) terminates too; a method-free grant says "*".
        let any = CredentialGrant::new(
            "b.test",
            8443,
            None,
            vec!["/".into()],
            sandbox_core::credential::BearerToken::new("t").unwrap(),
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(9),
        )
        .unwrap();
        let spec = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow("b.test")
            .credential(any)
            .build()
            .unwrap();
        let alone = super::plan(&spec, &offering()).unwrap().unwrap();
        assert!(alone.terminates());
        assert!(alone.rules.is_empty());
        assert!(
            alone.stdin_config().contains(r#""methods":"*""#),
            "{}",
            alone.stdin_config()
        );
        assert!(alone.stdin_config().contains(r#""port":8443"#));
    }

    #[test]
    fn the_operators_upstream_bundle_goes_to_standard_input_when_the_proxy_terminates() {
        let pem = "-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n";
        let config = DockerConfig {
            egress_upstream_ca_pem: Some(pem.into()),
            ..offering()
        };
        let with = plan(&ruled(&[]), &config).unwrap().unwrap();
        let without = plan(&ruled(&[]), &offering()).unwrap().unwrap();
        assert_ne!(with.digest, without.digest);
        assert_eq!(
            with.stdin_config(),
            format!("{}\n", serde_json::json!({ "upstream_ca_pem": pem }))
        );
        // Hosts alone never read it; an empty bundle is none.
        let bare = plan(&spec(&["a.test"]), &config).unwrap().unwrap();
        assert_eq!(bare.stdin_config(), "");
        let empty = DockerConfig {
            egress_upstream_ca_pem: Some(String::new()),
            ..offering()
        };
        assert_eq!(plan(&ruled(&[]), &empty).unwrap().unwrap(), without);
    }

    #[test]
    fn methods_the_proxy_cannot_enforce_are_refused_before_the_engine() {
        let rule = EgressRule::new("a.test", Some(vec!["M-SEARCH".into()]), None).unwrap();
        let spec = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow(EgressEntry::Rule(rule))
            .build()
            .unwrap();
        let error = plan(&spec, &offering()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported);
        assert!(error.to_string().contains("\"M-SEARCH\""), "{error}");
        let grant = CredentialGrant::new(
            "a.test",
            443,
            Some(vec!["GET".into(), "PATCH2".into()]),
            vec!["/".into()],
            sandbox_core::credential::BearerToken::new("t").unwrap(),
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(9),
        )
        .unwrap();
        let spec = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow("a.test")
            .credential(grant)
            .build()
            .unwrap();
        let error = plan(&spec, &offering()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::CapabilityNotSupported);
        assert!(error.to_string().contains("PATCH2"), "{error}");
        assert!(letters_only(&["GET".into(), "DELETE".into()]).is_ok());
        assert!(letters_only(&[]).is_ok());
    }
}
