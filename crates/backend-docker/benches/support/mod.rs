//! What the backend's benchmarks share: the backend and the raw `docker` CLI side by side, a raw
//! container with the backend's own hardening, reset against a cold acquire, and the sweep that
//! leaves nothing on the engine. The paired rounds and the report rows are `paired-bench`'s.
#![allow(dead_code)]

use std::future::Future;
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use backend_docker::{DockerBackend, DockerConfig};
use std::sync::Arc;

use paired_bench::raw_docker::{self, docker, run_hardened};
use paired_bench::{paired, Metric};
use sandbox_core::{DisposeSelector, Sandbox, SandboxBackend, SandboxKey, SandboxSpec};

/// The image every benchmark runs on (docs/docker-backend.md#local-images; `cargo xtask images` builds it).
pub const IMAGE: &str = "sandbox-base:local";

/// The storage base the backend prepares by default, made in the raw container too.
pub const BASE: &str = "/maf-sandbox/work";

/// A scope no other run shares (≤ 63 characters, so its label value is the scope itself).
pub fn unique_scope(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("bench-{tag}-{}-{nanos:08x}", std::process::id())
}

/// The backend as the live suites configure it, minus the egress preflight (off by default).
pub async fn backend() -> DockerBackend {
    DockerBackend::connect(DockerConfig::default())
        .await
        .expect("the docker backend connects to the local engine")
}

/// `docker run -d` of a keep-alive container with the backend's own hardening
/// (docs/docker-backend.md#hardening) and the raw label; returns its id.
pub async fn run_raw_container(scope: &str) -> String {
    run_hardened(IMAGE, scope, "runc").await
}

/// [`run_raw_container`] under the engine's runtime `runtime` (`docker run --runtime`).
pub async fn run_raw_container_under(scope: &str, runtime: &str) -> String {
    run_hardened(IMAGE, scope, runtime).await
}

/// The start of a side-by-side bench: a fresh scope and its [`Sweep`], the sandbox of the scope's
/// thread `t` on `spec`, and a raw container to run the same work in.
pub struct SideBySide {
    pub scope: String,
    pub sweep: Sweep,
    pub sandbox: Arc<dyn Sandbox>,
    pub raw: String,
}

impl SideBySide {
    /// Acquires thread `t` of a fresh scope tagged `tag` on `spec`, and runs the raw container.
    pub async fn start(backend: &DockerBackend, tag: &str, spec: &SandboxSpec) -> SideBySide {
        let scope = unique_scope(tag);
        let sweep = Sweep::new(&scope);
        let key = SandboxKey::conversation(scope.as_str(), "t", "bench");
        let sandbox = backend.acquire(&key, spec).await.expect("acquire");
        let raw = run_raw_container(&scope).await;
        SideBySide {
            scope,
            sweep,
            sandbox,
            raw,
        }
    }
}

/// The spec of a bench sandbox on [`IMAGE`] with no transfer ceilings beyond the defaults.
pub fn bench_spec() -> SandboxSpec {
    SandboxSpec::builder("bench")
        .image(IMAGE)
        .build()
        .expect("a valid spec")
}

/// `docker rm -f <id>`.
pub async fn remove_raw(id: &str) {
    docker(&["rm", "-f", id]).await;
}

/// Rounds of `current.reset()` against disposal plus a cold acquire on `cold` of the key
/// `key_of(round)` gives, each side holding a file written since its acquire; `prepare` runs,
/// untimed, before each round. The rounds past `warmup` go into `metric`.
pub async fn reset_against_cold<F, Fut>(
    metric: &mut Metric,
    mut current: Arc<dyn Sandbox>,
    cold: &DockerBackend,
    spec: &SandboxSpec,
    key_of: impl Fn(usize) -> SandboxKey,
    (warmup, rounds): (usize, usize),
    mut prepare: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for round in 0..warmup + rounds {
        prepare().await;
        let base = current.storage_base().to_owned();
        current
            .write_file("made.txt", b"after acquire\n", &base)
            .await
            .expect("write");
        let key = key_of(round);
        let old = cold.acquire(&key, spec).await.expect("acquire");
        old.write_file("made.txt", b"after acquire\n", &base)
            .await
            .expect("write");
        drop(old);
        let pair = paired(
            round,
            async {
                current = current.reset().await.expect("reset");
            },
            async {
                let failure = cold.dispose(&key, DisposeSelector::all()).await;
                assert!(failure.is_none(), "disposal: {failure:?}");
                let sandbox = cold.acquire(&key, spec).await.expect("acquire");
                assert!(sandbox.freshly_created());
            },
        )
        .await;
        let failure = cold.dispose(&key, DisposeSelector::all()).await;
        assert!(failure.is_none(), "disposal of the cold key: {failure:?}");
        if round >= warmup {
            metric.push(pair);
        }
    }
}

/// Removes everything a run made. [`Sweep::finish`] disposes through the backend and checks the
/// engine lists nothing for the scope; dropping it unfinished (a panic) removes by label with
/// blocking `docker rm -f` calls, so even a failed run leaves nothing behind.
pub struct Sweep {
    scope: String,
    finished: bool,
}

impl Sweep {
    pub fn new(scope: &str) -> Self {
        Sweep {
            scope: scope.to_owned(),
            finished: false,
        }
    }

    /// Disposes every thread of the scope through the backend, removes the raw containers, and
    /// asserts nothing labelled with the scope remains.
    pub async fn finish(mut self, backend: &DockerBackend, threads: &[&str]) {
        for thread in threads {
            let purge = backend.dispose_scope(&self.scope, thread).await;
            assert!(
                purge.undisposed.is_none(),
                "disposal of {}/{thread}: {purge:?}",
                self.scope
            );
        }
        for id in self.labelled().await {
            remove_raw(&id).await;
        }
        let left = backend
            .list(&self.scope, None)
            .await
            .expect("listing the scope");
        assert!(left.is_empty(), "left behind in {}: {left:?}", self.scope);
        let raw_left = self.labelled().await;
        assert!(
            raw_left.is_empty(),
            "raw containers left behind: {raw_left:?}"
        );
        self.finished = true;
    }

    fn filters(&self) -> [String; 2] {
        [
            format!("label=maf-sandbox.scope={}", self.scope),
            format!("label={}={}", raw_docker::LABEL, self.scope),
        ]
    }

    async fn labelled(&self) -> Vec<String> {
        let mut ids = Vec::new();
        for filter in self.filters() {
            let output = docker(&["ps", "-aq", "--no-trunc", "--filter", &filter]).await;
            ids.extend(
                String::from_utf8_lossy(&output.stdout)
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
        ids
    }
}

impl Drop for Sweep {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for filter in self.filters() {
            let Ok(output) = std::process::Command::new("docker")
                .args(["ps", "-aq", "--no-trunc", "--filter", &filter])
                .stdin(Stdio::null())
                .output()
            else {
                eprintln!("sweep: docker ps failed for {filter}");
                continue;
            };
            for id in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                let removed = std::process::Command::new("docker")
                    .args(["rm", "-f", id])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .status();
                if !matches!(removed, Ok(status) if status.success()) {
                    eprintln!("sweep: could not remove {id}");
                }
            }
        }
    }
}
