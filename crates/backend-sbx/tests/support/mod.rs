//! What the live tests share: an `sbx-sim` with a state home and a workspace root of its own
//! (both temporary directories), a backend on it, the HARDENING hooks, fault switches, and the
//! leftover check. Every process call here goes through the bounded runner.
#![allow(dead_code)]

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use backend_sbx::{SbxBackend, SbxConfig};
use bounded_process::{BoundedCommand, ExitKind, RunOutput};
use conformance::isolation::{AcquireOutcome, DockerAnswer, Fingerprint, HardeningHooks};
use conformance::ConformanceError;
use sandbox_core::{ErrorKind, Sandbox, SandboxBackend, SandboxKey, SandboxSpec};

/// The simulator: `SBX_PATH` (set by `cargo xtask e2e sbx`), else the workspace's debug build.
pub fn sim_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SBX_PATH") {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("debug").join("sbx-sim")
}

/// A scope no other run shares.
pub fn unique_scope(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("bsbx-live-{tag}-{}-{nanos:08x}", std::process::id())
}

/// One simulated sbx host: its own state home and workspace root, removed when dropped (after
/// the test checked that nothing is left).
pub struct SimHost {
    pub home: tempfile::TempDir,
    pub root: tempfile::TempDir,
    pub sim: PathBuf,
}

impl SimHost {
    pub fn new() -> SimHost {
        let sim = sim_path();
        assert!(
            sim.is_file(),
            "the sbx simulator is missing at {} (build it with `cargo build -p sbx-sim`, or set SBX_PATH)",
            sim.display()
        );
        SimHost {
            home: tempfile::Builder::new()
                .prefix("bsbx-sim-home-")
                .tempdir()
                .unwrap(),
            root: tempfile::Builder::new()
                .prefix("bsbx-sim-root-")
                .tempdir()
                .unwrap(),
            sim,
        }
    }

    /// The process environment plus this host's `SBX_SIM_HOME`.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(name, _)| name != "SBX_SIM_HOME" && name != "SBX_SIM_FAULTS")
            .collect();
        env.push(("SBX_SIM_HOME".into(), self.home.path().into()));
        env
    }

    pub fn config(&self) -> SbxConfig {
        let mut config = SbxConfig::default();
        config.sbx_path = self.sim.clone();
        config.workspace_root = Some(self.root.path().to_path_buf());
        config.simulator_ok = true;
        config.management_env = Some(self.env());
        config
    }

    pub async fn backend(&self) -> SbxBackend {
        SbxBackend::connect(self.config())
            .await
            .expect("the sbx backend connects to the simulator")
    }

    /// Runs the simulator itself (fault switches, settings, engine-side checks).
    pub async fn sim<I, A>(&self, args: I) -> RunOutput
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        BoundedCommand::new(self.sim.clone(), Duration::from_secs(120))
            .args(args)
            .envs(self.env())
            .run()
            .await
            .expect("the simulator runs")
    }

    pub async fn fault_set(&self, fault: &str) {
        let output = self.sim(["sim", "fault", "set", fault]).await;
        assert_eq!(
            output.status,
            ExitKind::Exited(0),
            "fault set {fault}: {}",
            text(&output.stderr)
        );
    }

    pub async fn fault_clear(&self) {
        let output = self.sim(["sim", "fault", "clear"]).await;
        assert_eq!(
            output.status,
            ExitKind::Exited(0),
            "fault clear: {}",
            text(&output.stderr)
        );
    }

    /// The simulator's `ls --json` rows as JSON values.
    pub async fn rows(&self) -> Vec<serde_json::Value> {
        let output = self.sim(["ls", "--json"]).await;
        assert_eq!(
            output.status,
            ExitKind::Exited(0),
            "ls: {}",
            text(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("ls prints JSON")
    }

    /// The home's label value (`sbx-sim.home`), from the state directory's path.
    pub async fn containers(&self) -> Vec<String> {
        let output = docker([
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            &format!("label=sbx-sim.home={}", self.home_label()),
        ])
        .await;
        text(&output.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// First 12 hex of SHA-256 of the absolute state directory path.
    pub fn home_label(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.home.path().to_str().unwrap().as_bytes());
        digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
    }

    /// Nothing left: no container of this home, no sim record, no workspace directory.
    pub async fn assert_nothing_left(&self) {
        assert_eq!(
            self.containers().await,
            Vec::<String>::new(),
            "containers left behind"
        );
        let records = self.home.path().join("sandboxes");
        let left: Vec<_> = std::fs::read_dir(&records)
            .map(|r| r.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "sim records left behind: {left:?}");
        let dirs: Vec<_> = std::fs::read_dir(self.root.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert!(
            dirs.is_empty(),
            "workspace directories left behind: {dirs:?}"
        );
    }

    /// Removes whatever a failed test left, whatever the backend thinks.
    pub async fn reset(&self) {
        let _ = self.sim(["sim", "fault", "clear"]).await;
        let _ = self.sim(["sim", "reset"]).await;
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub async fn docker<I, A>(args: I) -> RunOutput
where
    I: IntoIterator<Item = A>,
    A: Into<OsString>,
{
    BoundedCommand::new("docker", Duration::from_secs(60))
        .args(args)
        .envs(std::env::vars_os())
        .run()
        .await
        .expect("the docker CLI runs")
}

/// The default bridge's gateway: a local address the engine routes to.
pub async fn bridge_gateway() -> IpAddr {
    let output = docker([
        "network",
        "inspect",
        "bridge",
        "--format",
        "{{range .IPAM.Config}}{{.Gateway}} {{.Subnet}} {{end}}",
    ])
    .await;
    let answer = text(&output.stdout);
    let words: Vec<&str> = answer.split_whitespace().collect();
    words
        .iter()
        .find_map(|w| w.parse::<IpAddr>().ok())
        .or_else(|| {
            words.iter().find_map(|w| {
                let (network, _) = w.split_once('/')?;
                let network: std::net::Ipv4Addr = network.parse().ok()?;
                Some(IpAddr::V4((u32::from(network) + 1).into()))
            })
        })
        .expect("the default bridge has a gateway")
}

/// Every thread a scope's listing names, for the final sweep.
pub async fn threads_of(backend: &SbxBackend, scope: &str) -> Vec<String> {
    let mut threads: Vec<String> = backend
        .list(scope, None)
        .await
        .expect("listing the scope")
        .into_iter()
        .filter_map(|s| s.key.map(|k| k.thread_id))
        .collect();
    threads.sort();
    threads.dedup();
    threads
}

/// Disposes of the scope's conversations and asserts the backend lists nothing left for it.
pub async fn dispose_all(backend: &SbxBackend, scope: &str) {
    for thread in threads_of(backend, scope).await {
        let purge = backend.dispose_scope(scope, &thread).await;
        assert!(
            purge.undisposed.is_none(),
            "disposal of {scope}/{thread}: {purge:?}"
        );
    }
    let left = backend.list(scope, None).await.expect("listing the scope");
    assert!(left.is_empty(), "left behind in {scope}: {left:?}");
}

/// The engine-side hooks of the HARDENING probes, against the simulator.
pub struct SimHooks<'a> {
    pub host: &'a SimHost,
    pub backend: SbxBackend,
}

#[async_trait]
impl HardeningHooks for SimHooks<'_> {
    async fn remove_behind_the_handle(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<(), ConformanceError> {
        let rows = self.host.rows().await;
        let name = rows
            .iter()
            .find(|row| row["id"].as_str() == Some(sandbox.instance_id()))
            .and_then(|row| row["name"].as_str())
            .ok_or_else(|| ConformanceError::harness("HARDENING", "the instance is not listed"))?
            .to_owned();
        let output = self.host.sim(["rm", "--force", &name]).await;
        if output.status == ExitKind::Exited(0) {
            Ok(())
        } else {
            Err(ConformanceError::harness(
                "HARDENING",
                format!("sbx-sim rm failed: {}", text(&output.stderr)),
            ))
        }
    }

    async fn engine_instances_for(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
    ) -> Result<usize, ConformanceError> {
        let name = self.backend.sandbox_name(key, spec.kind());
        Ok(self
            .host
            .rows()
            .await
            .iter()
            .filter(|row| row["name"].as_str() == Some(name.as_str()))
            .count())
    }

    async fn acquire_in_child_process(
        &self,
        key: &SandboxKey,
        spec: &SandboxSpec,
        n: usize,
    ) -> Result<Vec<Result<AcquireOutcome, ErrorKind>>, ConformanceError> {
        let output = BoundedCommand::new(
            env!("CARGO_BIN_EXE_sbx-acquire-child"),
            Duration::from_secs(600),
        )
        .args([
            self.host.sim.as_os_str(),
            self.host.root.path().as_os_str(),
            key.scope.as_ref(),
            key.thread_id.as_ref(),
            key.agent_id.as_ref(),
            key.call_id.as_ref(),
            spec.kind().as_ref(),
            spec.image().unwrap_or("-").as_ref(),
            spec.work_dir().unwrap_or("-").as_ref(),
            n.to_string().as_ref(),
        ])
        .envs(self.host.env())
        .run()
        .await
        .map_err(|e| ConformanceError::harness("HARDENING", format!("the child process: {e}")))?;
        if output.status != ExitKind::Exited(0) {
            return Err(ConformanceError::harness(
                "HARDENING",
                format!("the child process failed: {}", text(&output.stderr)),
            ));
        }
        if !output.stderr.is_empty() {
            // The errors behind any failed acquire, for the test's output.
            eprintln!("the acquire child said: {}", text(&output.stderr));
        }
        conformance::child_process::parse_child_acquires(&output.stdout)
    }

    async fn routable_host_address(&self) -> Result<IpAddr, ConformanceError> {
        Ok(bridge_gateway().await)
    }

    fn gone_kinds(&self) -> Vec<ErrorKind> {
        vec![ErrorKind::SandboxGone, ErrorKind::DaemonFault]
    }

    async fn fingerprint(
        &self,
        sandbox: &dyn Sandbox,
    ) -> Result<Option<Fingerprint>, ConformanceError> {
        self.host.fingerprint(sandbox.instance_id()).await.map(Some)
    }
}

impl SimHost {
    /// The engine-side fingerprint of the container behind the simulated sandbox `instance_id`:
    /// `sbx-sim` backs each sandbox with one container of the Docker engine, found here by the
    /// labels it sets (this home, this instance).
    pub async fn fingerprint(&self, instance_id: &str) -> Result<Fingerprint, ConformanceError> {
        let found = docker([
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=sbx-sim.home={}", self.home_label()),
            "--filter",
            &format!("label=sbx-sim.id={instance_id}"),
        ])
        .await;
        let ids: Vec<String> = text(&found.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let [container] = ids.as_slice() else {
            return Err(ConformanceError::harness(
                "CONFINEMENT",
                format!(
                    "the engine holds {} containers for {instance_id}",
                    ids.len()
                ),
            ));
        };
        conformance::isolation::docker_container_fingerprint(container, |args| async move {
            let output = docker(args).await;
            Ok(DockerAnswer {
                succeeded: output.status == ExitKind::Exited(0),
                stdout: output.stdout,
                stderr: output.stderr,
            })
        })
        .await
    }
}
