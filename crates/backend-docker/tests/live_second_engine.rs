//! The backend reaches whatever engine its endpoint names, and only that one: a second `dockerd`
//! started here (own config file, data root, exec root, pid file, socket and pre-created bridge,
//! no iptables) gets the BusyBox image built into it by the image recipe, then the EXEC and FILES suites run against it twice,
//! once through `DOCKER_HOST` and once through a Docker context, and the default engine must see
//! none of those containers. Everything is torn down at the end, also on a failure.
//!
//! Needs root, `dockerd` and `ip`. The second engine never uses `--bridge=none`, which would
//! delete the first engine's `docker0`.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use backend_docker::{DockerBackend, DockerConfig, ImageRecipe, LocalImage};
use conformance::{run_backend_suites, RunOptions};
use sandbox_core::{SandboxBackend, SandboxKey, SandboxSpec};
use sha2::Digest as _;
use support::{backend, threads_of, unique_scope, BUSYBOX};

/// A second engine and everything it needs; dropping it stops the engine and removes them.
struct SecondEngine {
    dir: PathBuf,
    bridge: String,
    daemon: Option<std::process::Child>,
}

fn run(program: &str, args: &[&str]) {
    let status = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(status.success(), "{program} {args:?} failed: {status}");
}

impl SecondEngine {
    fn start() -> SecondEngine {
        let tag = std::process::id() % 100_000;
        // Short paths: a Unix socket path holds at most 107 bytes.
        let dir = PathBuf::from(format!("/tmp/sbx-eng-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bridge = format!("sbxeng{tag}");
        let mut engine = SecondEngine {
            dir: dir.clone(),
            bridge: bridge.clone(),
            daemon: None,
        };
        run("ip", &["link", "add", &bridge, "type", "bridge"]);
        let octet = 100 + tag % 100;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("10.231.{octet}.1/24"),
                "dev",
                &bridge,
            ],
        );
        run("ip", &["link", "set", &bridge, "up"]);
        // The machine's own daemon.json pins a data root; this engine reads an empty one.
        std::fs::write(dir.join("daemon.json"), "{}").unwrap();
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let path = |name: &str| dir.join(name).display().to_string();
        let child = std::process::Command::new("dockerd")
            .args([
                "--config-file",
                &path("daemon.json"),
                "--data-root",
                &path("data"),
                "--exec-root",
                &path("exec"),
                "--pidfile",
                &path("dockerd.pid"),
                "-H",
                &format!("unix://{}", path("docker.sock")),
                &format!("--bridge={bridge}"),
                "--iptables=false",
                "--ip6tables=false",
                "--storage-driver=vfs",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("dockerd starts");
        engine.daemon = Some(child);
        let until = Instant::now() + Duration::from_secs(60);
        while !dir.join("docker.sock").exists() {
            assert!(
                Instant::now() < until,
                "the second engine did not open its socket: {}",
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        engine
    }

    fn host(&self) -> String {
        format!("unix://{}", self.dir.join("docker.sock").display())
    }

    /// A client configuration directory whose current context names this engine.
    fn context_config(&self, name: &str) -> PathBuf {
        let config = self.dir.join("client");
        let digest: String = sha2::Sha256::digest(name.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let meta = config.join("contexts/meta").join(digest);
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(
            meta.join("meta.json"),
            format!(
                r#"{{"Name":"{name}","Metadata":{{}},"Endpoints":{{"docker":{{"Host":"{}","SkipTLSVerify":false}}}}}}"#,
                self.host()
            ),
        )
        .unwrap();
        std::fs::write(
            config.join("config.json"),
            format!(r#"{{"currentContext":"{name}"}}"#),
        )
        .unwrap();
        config
    }
}

impl Drop for SecondEngine {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &daemon.id().to_string()])
                .status();
            let until = Instant::now() + Duration::from_secs(30);
            while daemon.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        // Anything the engine left mounted under its roots goes before the tree does.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let prefix = self.dir.display().to_string();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&prefix))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for point in points {
                let _ = std::process::Command::new("umount")
                    .args(["-l", point])
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn connect(env: Vec<(&str, String)>) -> DockerBackend {
    let mut config = DockerConfig::default();
    config.management_env = Some(env.into_iter().map(|(n, v)| (n.into(), v.into())).collect());
    DockerBackend::connect(config)
        .await
        .expect("the backend connects to the second engine")
}

/// Builds the BusyBox image into the engine at `host` with the image recipe: the root file
/// system assembled from the host's static BusyBox and imported through the engine's API.
async fn build_busybox(host: &str) {
    let reports = ImageRecipe::new()
        .management_env([("DOCKER_HOST", host)])
        .build(&[LocalImage::Busybox])
        .await
        .expect("the BusyBox image builds into the second engine");
    assert_eq!(reports.len(), 1);
    let id = ImageRecipe::new()
        .management_env([("DOCKER_HOST", host)])
        .image_id(BUSYBOX)
        .await
        .expect("the second engine answers");
    assert!(id.is_some_and(|id| id.starts_with("sha256:")));
}

async fn suites_on(backend: &DockerBackend, scope: &str) {
    let options = RunOptions {
        exec_cleanup_allowance: backend.config().exec_cleanup_timeout,
        reduced: true,
        ..RunOptions::default()
    };
    let expected = options.expected_probes(backend.declarations());
    let mut keys = |purpose: &str| SandboxKey::conversation(scope.to_owned(), purpose, "agent");
    let report = run_backend_suites(
        backend,
        &mut keys,
        SandboxSpec::builder("second").image(BUSYBOX),
        options,
    )
    .await
    .expect("the suites start");
    assert_eq!(report.skipped(), 0, "{report}");
    if let Err(error) = report.assert_all_passed() {
        panic!("{error}\n{report}");
    }
    assert_eq!(report.passed(), expected, "probe count:\n{report}");
    for thread in threads_of(backend, scope).await {
        assert!(backend
            .dispose_scope(scope, &thread)
            .await
            .undisposed
            .is_none());
    }
    assert!(backend.list(scope, None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_exec_and_file_suites_pass_on_a_second_engine_the_default_never_sees() {
    let engine = SecondEngine::start();
    build_busybox(&engine.host()).await;
    let default_engine = backend(false).await;

    let by_host = connect(vec![("DOCKER_HOST", engine.host())]).await;
    assert_eq!(by_host.endpoint(), engine.host());
    let scope = unique_scope("second-host");
    suites_on(&by_host, &scope).await;
    assert!(default_engine.list(&scope, None).await.unwrap().is_empty());

    let config = engine.context_config("sbx-second");
    let by_context = connect(vec![
        ("DOCKER_CONFIG", config.display().to_string()),
        ("HOME", "/nonexistent".to_owned()),
    ])
    .await;
    assert_eq!(by_context.context(), "sbx-second");
    assert_eq!(by_context.endpoint(), engine.host());
    let context_scope = unique_scope("second-ctx");
    // While a sandbox lives on the second engine, the default engine does not list it.
    let key = SandboxKey::conversation(context_scope.as_str(), "probe", "agent");
    let spec = SandboxSpec::builder("second")
        .image(BUSYBOX)
        .build()
        .unwrap();
    let sandbox = by_context.acquire(&key, &spec).await.unwrap();
    assert_eq!(
        by_context.list(&context_scope, None).await.unwrap().len(),
        1
    );
    assert!(default_engine
        .list(&context_scope, None)
        .await
        .unwrap()
        .is_empty());
    drop(sandbox);
    suites_on(&by_context, &context_scope).await;
    assert!(default_engine
        .list(&context_scope, None)
        .await
        .unwrap()
        .is_empty());
    drop(engine);
}
