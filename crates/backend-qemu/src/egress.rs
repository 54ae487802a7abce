//! Allowlist egress (docs/qemu-backend.md#allowlist-egress). A VM has no network device: its
//! processes reach out only through the agent, by connecting to a loopback port the agent
//! listens on for the host (`AgentClient::accept`). Each host process serving a sandbox takes
//! the connections of its own port (`PROXY_PORT_BASE` plus its agent port) and judges each one
//! with the egress proxy's policy, in-process: the same allowlist, method and path rules, TLS
//! termination under a CA of this process's own (its key never leaves the process) and
//! credential grants (whose tokens never reach the guest) as the Docker backend's proxy
//! container. The guest's commands are pointed at the port by the usual proxy variables, and
//! trust the CA through the usual bundle variables.
//!
//! Not here: a guest process can connect to any port the agent listens on, so every process
//! acquiring one key must ask for the same egress (the record's digest, checked at acquire).

use std::sync::Arc;
use std::time::Duration;

use egress_proxy::cli::{ProxyArgs, StdinConfig};
use egress_proxy::proxy::{Decision, Observer, Policy};
use egress_proxy::rules::Grant;
use qemu_vm::{AgentClient, ExecRequest, RunLimits};
use sandbox_core::credential::{EgressEvent, EgressObserver};
use sandbox_core::{Egress, EgressEntry, SandboxError, SandboxSpec};
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;

use crate::config::QemuEgress;

/// The guest port of the host process on agent port 0; the process on agent port `n` listens
/// on this plus `n`.
pub(crate) const PROXY_PORT_BASE: u16 = 3128;

/// Waits for guest connections a process keeps open at once: connections arriving together
/// queue in the guest listener's backlog for the next free wait.
const WAITS: usize = 4;

/// How long a wait that failed (its connection closing) rests before the next.
const WAIT_RETRY: Duration = Duration::from_millis(500);

/// Where a process's CA (and the bundle with the guest's own roots) goes in the guest.
const TRUST_DIR: &str = "/etc/sandbox-egress";

/// The guest's system bundle, where the image has one.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What an allowlist sandbox's egress is, decided before any VM is touched.
#[derive(Debug)]
pub(crate) struct EgressPlan {
    args: ProxyArgs,
    input: StdinConfig,
    hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// SHA-256 (hex) of the policy, tokens left out: the record keeps it.
    pub(crate) digest: String,
}

/// The egress part of an acquire: `None` for `closed`.
///
/// # Errors
/// EgressNotEnforced for `unrestricted`; InvalidSpec for an allowlist without a host, or a rule
/// or grant the proxy refuses (never quoting a token).
pub(crate) fn plan(
    spec: &SandboxSpec,
    config: &QemuEgress,
) -> Result<Option<EgressPlan>, SandboxError> {
    match spec.egress() {
        Egress::Closed => return Ok(None),
        Egress::Allowlist => {}
        other => {
            return Err(SandboxError::EgressNotEnforced(format!(
                "the qemu backend enforces egress closed and allowlist only; the spec asks for \
                 {other}"
            )))
        }
    }
    let mut hosts = Vec::new();
    let mut rules = Vec::new();
    for entry in spec.egress_allow() {
        hosts.push(entry.host().to_owned());
        if let EgressEntry::Rule(rule) = entry {
            let methods = rule.methods().map_or("*".to_owned(), |m| m.join(","));
            let paths = rule.paths().map_or("/*".to_owned(), |p| p.join(","));
            rules.push(format!("{} {methods} {paths}", rule.host()));
        }
    }
    if hosts.is_empty() {
        return Err(SandboxError::invalid(
            "egress allowlist needs at least one allowed host",
        ));
    }
    hosts.sort();
    hosts.dedup();
    let refused = |error: egress_proxy::ProxyError| {
        SandboxError::invalid(format!("the egress policy is refused: {error}"))
    };
    let grants = spec
        .credentials()
        .iter()
        .map(Grant::from_credential)
        .collect::<Result<Vec<_>, _>>()
        .map_err(refused)?;
    // Never dialled: the host's own addresses (its services are not the guest's to reach).
    let deny_addresses = egress_proxy::cli::interface_addresses().map_err(|error| {
        SandboxError::EgressNotEnforced(format!("the host's addresses are unknown: {error}"))
    })?;
    let terminates = !rules.is_empty() || !grants.is_empty();
    let args = ProxyArgs {
        // The socket and forwarder of a proxy process; unused in-process.
        socket: Default::default(),
        handoff_socket: None,
        install_forwarder: Default::default(),
        allow: hosts.clone(),
        allow_private: config.allow_private,
        ports: config.ports.clone(),
        deny_addresses,
        rules: rules.clone(),
        stdin_config: terminates,
        // Only asks that the CA be made; its certificate goes into the guest instead.
        ca_cert_out: terminates.then(Default::default),
        upstream_cas: Vec::new(),
    };
    let input = StdinConfig {
        grants,
        rules: Vec::new(),
        upstream_pems: config.upstream_ca_pem.iter().cloned().collect(),
    };
    // Refused now rather than at the first connection: the same checks the proxy makes.
    args.policy_with(input.clone()).map_err(refused)?;
    let mut text = format!(
        "qemu-egress-v1\nhosts={}\nprivate={}\nports={:?}\n",
        hosts.join(","),
        config.allow_private,
        config.ports
    );
    for rule in &rules {
        text.push_str(&format!("rule={rule}\n"));
    }
    let hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>> = config
        .hosts
        .iter()
        .map(|(name, addresses)| (name.to_ascii_lowercase(), addresses.clone()))
        .collect();
    for (name, addresses) in &hosts {
        text.push_str(&format!("host={name} {addresses:?}\n"));
    }
    for grant in spec.credentials() {
        text.push_str(&format!(
            "grant={}:{} {:?} {:?} {}\n",
            grant.host(),
            grant.port(),
            grant.methods(),
            grant.paths(),
            grant.expires_unix()
        ));
    }
    let digest = Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Some(EgressPlan {
        args,
        input,
        hosts,
        digest,
    }))
}

/// The guest port of the process holding `agent`'s connection.
pub(crate) fn port_of(agent: &AgentClient) -> u16 {
    PROXY_PORT_BASE + agent.port().unwrap_or(0) as u16
}

/// A process's egress for one VM: its port's connections judged while this lives.
#[derive(Debug)]
pub(crate) struct GuestEgress {
    /// The variables every command of the process gets.
    pub(crate) env: Vec<(String, String)>,
    /// The guest port it serves.
    pub(crate) port: u16,
    /// The plan's digest.
    pub(crate) digest: String,
    /// The connection its waits are on.
    agent: AgentClient,
    relay: tokio::task::JoinHandle<()>,
}

impl GuestEgress {
    /// Whether it still serves `port` under `digest`.
    pub(crate) fn serves(&self, port: u16, digest: &str) -> bool {
        self.port == port && self.digest == digest && !self.agent.is_closed()
    }
}

impl Drop for GuestEgress {
    fn drop(&mut self) {
        // The waits go with the task; each dropped wait stops in the guest.
        self.relay.abort();
    }
}

/// Starts judging the connections of `agent`'s port: the policy made (a fresh CA when it
/// terminates TLS), the CA put where the guest's commands will trust it, and the waits begun.
///
/// # Errors
/// InvalidSpec when the policy cannot be made; the agent's errors writing the CA.
pub(crate) async fn start(
    agent: &AgentClient,
    plan: &EgressPlan,
    sandbox: &str,
    observer: Option<EgressObserver>,
    deadline: Duration,
) -> Result<GuestEgress, SandboxError> {
    let mut policy = plan
        .args
        .policy_with(plan.input.clone())
        .map_err(|error| SandboxError::invalid(format!("the egress policy is refused: {error}")))?;
    policy.hosts = plan.hosts.clone();
    let name = sandbox.to_owned();
    policy.observer = Some(Observer(Arc::new(move |decision: &Decision| {
        let event = event_of(decision, &name);
        tracing::info!(target: "egress", sandbox = %event.sandbox, "{event}");
        if let Some(observer) = &observer {
            observer.notify(&event);
        }
    })));
    let port = port_of(agent);
    let proxy = format!("http://127.0.0.1:{port}");
    let mut env: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|name| ((*name).to_owned(), proxy.clone()))
        .collect();
    // The guest's own loopback services stay direct, as on Docker.
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_owned(), "localhost,127.0.0.1".to_owned()));
    }
    if let Some(terminator) = &policy.terminator {
        let (ca, bundle) =
            install_trust(agent, port, &terminator.authority_pem(), deadline).await?;
        for name in ["SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE"] {
            env.push((name.to_owned(), bundle.clone()));
        }
        env.push(("NODE_EXTRA_CA_CERTS".to_owned(), ca));
    }
    let relay = tokio::spawn(relay(agent.clone(), port, Arc::new(policy)));
    Ok(GuestEgress {
        env,
        port,
        digest: plan.digest.clone(),
        agent: agent.clone(),
        relay,
    })
}

/// Writes the CA, and a bundle of the guest's own roots followed by it, into the guest;
/// returns their paths.
async fn install_trust(
    agent: &AgentClient,
    port: u16,
    ca_pem: &str,
    deadline: Duration,
) -> Result<(String, String), SandboxError> {
    let ca = format!("{TRUST_DIR}/ca-{port}.pem");
    let bundle = format!("{TRUST_DIR}/bundle-{port}.pem");
    let script = format!(
        "set -e; umask 022; mkdir -p {TRUST_DIR}; cat >{ca}.tmp; \
         {{ cat {SYSTEM_BUNDLE} 2>/dev/null || true; cat {ca}.tmp; }} >{bundle}.tmp; \
         mv {ca}.tmp {ca}; mv {bundle}.tmp {bundle}"
    );
    let request = ExecRequest {
        argv: vec![b"/bin/sh".to_vec(), b"-c".to_vec(), script.into_bytes()],
        env: vec![(b"PATH".to_vec(), b"/usr/sbin:/usr/bin:/sbin:/bin".to_vec())],
        workdir: b"/".to_vec(),
        stdin: true,
        timeout_ms: deadline.as_millis() as u64,
        user: None,
    };
    let limits = RunLimits {
        output_cap: 64 * 1024,
        deadline,
    };
    let out = agent
        .run(request, Some(ca_pem.as_bytes()), limits)
        .await
        .map_err(|error| SandboxError::engine(format!("installing the egress CA: {error}")))?;
    if out.status.code != Some(0) {
        return Err(SandboxError::engine(format!(
            "installing the egress CA failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok((ca, bundle))
}

/// Keeps [`WAITS`] waits on `port` and serves each connection, at most the policy's
/// connections at once (more are closed at once); the waits end with the agent's connection,
/// or with this future (a dropped set aborts its tasks).
async fn relay(agent: AgentClient, port: u16, policy: Arc<Policy>) {
    let slots = Arc::new(Semaphore::new(policy.limits.max_connections));
    let mut waits = tokio::task::JoinSet::new();
    for _ in 0..WAITS {
        let agent = agent.clone();
        let policy = Arc::clone(&policy);
        let slots = Arc::clone(&slots);
        waits.spawn(async move {
            while !agent.is_closed() {
                match agent.accept(port).await {
                    Ok(stream) => {
                        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                            tracing::warn!(port, "an egress connection over the limit was closed");
                            continue;
                        };
                        let policy = Arc::clone(&policy);
                        tokio::spawn(async move {
                            serve(stream, &policy).await;
                            drop(permit);
                        });
                    }
                    Err(error) => {
                        tracing::debug!(port, %error, "an egress wait ended");
                        tokio::time::sleep(WAIT_RETRY).await;
                    }
                }
            }
        });
    }
    while waits.join_next().await.is_some() {}
}

/// One guest connection judged by the proxy: carried to it over a socket pair, whose other end
/// the proxy serves as any client's.
async fn serve(mut guest: tokio::io::DuplexStream, policy: &Policy) {
    let Ok((mut ours, theirs)) = tokio::net::UnixStream::pair() else {
        return;
    };
    let judged = egress_proxy::proxy::serve_client(theirs, policy);
    let carried = async {
        let _ = tokio::io::copy_bidirectional(&mut guest, &mut ours).await;
    };
    tokio::join!(judged, carried);
}

/// The contract's event for one of the proxy's decisions about `sandbox`'s traffic.
fn event_of(decision: &Decision, sandbox: &str) -> EgressEvent {
    EgressEvent {
        sandbox: sandbox.to_owned(),
        allowed: decision.allowed,
        host: decision.host.clone(),
        port: decision.port,
        method: decision.method.clone(),
        path: decision.path.clone(),
        rule: decision.rule.clone(),
        reason: decision.reason.clone(),
        bytes_up: decision.bytes_up,
        bytes_down: decision.bytes_down,
        duration: decision.duration_ms.map(Duration::from_millis),
        credential_applied: decision.credential,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::credential::{BearerToken, CredentialGrant};
    use sandbox_core::EgressRule;

    fn grant(token: &str) -> CredentialGrant {
        CredentialGrant::new(
            "api.test",
            443,
            Some(vec!["GET".into()]),
            vec!["/v1/*".into()],
            BearerToken::new(token).unwrap(),
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000_000),
        )
        .unwrap()
    }

    fn spec(rule: bool, grants: &[CredentialGrant]) -> SandboxSpec {
        let mut builder = SandboxSpec::builder("k")
            .egress(Egress::Allowlist)
            .allow("b.test");
        builder = if rule {
            let rule = EgressRule::new("api.test", Some(vec!["GET".into()]), None).unwrap();
            builder.allow(EgressEntry::Rule(rule))
        } else {
            builder.allow("api.test")
        };
        for grant in grants {
            builder = builder.credential(grant.clone());
        }
        builder.build().unwrap()
    }

    #[test]
    fn closed_egress_has_no_plan_and_unrestricted_is_refused() {
        let closed = SandboxSpec::builder("k").build().unwrap();
        assert!(plan(&closed, &QemuEgress::default()).unwrap().is_none());
        let open = SandboxSpec::builder("k")
            .egress(Egress::Unrestricted)
            .build()
            .unwrap();
        let refused = plan(&open, &QemuEgress::default()).unwrap_err();
        assert!(
            matches!(refused, SandboxError::EgressNotEnforced(_)),
            "{refused}"
        );
    }

    #[test]
    fn the_digest_follows_the_policy_and_never_the_token() {
        let config = QemuEgress::default();
        let digest = |spec: &SandboxSpec| plan(spec, &config).unwrap().unwrap().digest;
        let bare = digest(&spec(false, &[]));
        let ruled = digest(&spec(true, &[]));
        let granted = digest(&spec(true, &[grant("token-one")]));
        assert_ne!(bare, ruled);
        assert_ne!(ruled, granted);
        assert_eq!(granted, digest(&spec(true, &[grant("token-two")])));
        let private = QemuEgress {
            allow_private: true,
            ..QemuEgress::default()
        };
        assert_ne!(
            bare,
            plan(&spec(false, &[]), &private).unwrap().unwrap().digest
        );
        // The token is in the proxy's input only.
        let planned = plan(&spec(true, &[grant("token-one")]), &config)
            .unwrap()
            .unwrap();
        assert!(!format!("{:?}", planned.args).contains("token-one"));
        assert_eq!(planned.input.grants.len(), 1);
    }

    #[test]
    fn a_plan_the_proxy_refuses_is_refused_at_acquire() {
        let config = QemuEgress {
            ports: vec![0],
            ..QemuEgress::default()
        };
        let refused = plan(&spec(false, &[]), &config).unwrap_err();
        assert!(refused.to_string().contains("port 0"), "{refused}");
    }
}
