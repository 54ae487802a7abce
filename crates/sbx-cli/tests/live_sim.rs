//! Every driver method against the `sbx-sim` stand-in on the real Docker engine.
//!
//! Needs the built `sbx-sim` binary (`SBX_SIM_BIN`, else `sbx-sim` next to this test's target
//! directory: `cargo build -p sbx-sim` first), a Docker engine and the `sbx-sim-shell:local` and
//! `sandbox-busybox:local` images. Each test uses a state home of its own (so its sandboxes are
//! invisible to every other test) and ends with `sim reset`, which removes that home's containers
//! and only those.
#![cfg(unix)]

use std::ffi::{OsStr, OsString};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use bounded_process::BoundedCommand;
use sbx_cli::{
    Call, CreateRequest, Error, ExecRequest, ExitKind, Instant, MemorySize, Removal, SbxCli,
    SbxName,
};

/// The image the stand-in refuses to start: it has `/bin/sh` but no `/bin/bash`.
const SHELL_LESS_TEMPLATE: &str = "sandbox-busybox:local";

fn sim_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SBX_SIM_BIN") {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/<this test> → target/<profile>/sbx-sim
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary lives in <target>/<profile>/deps");
    let path = profile_dir.join("sbx-sim");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p sbx-sim` or set SBX_SIM_BIN",
        path.display()
    );
    path
}

/// One state home of the stand-in, with a directory for workspaces. Dropping it runs
/// `sim reset`, which removes every container of this home.
struct Sim {
    bin: PathBuf,
    home: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Sim {
    async fn new() -> Sim {
        let sim = Sim {
            bin: sim_binary(),
            home: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
        };
        // No idle watcher outliving the test: sandboxes stay up until `sim reset`.
        let output = sim
            .run(&["settings", "set", "sim.idleStopSeconds", "0"])
            .await;
        assert_eq!(output.status, ExitKind::Exited(0), "{output:?}");
        sim
    }

    /// The management environment: only what the stand-in and the docker CLI need.
    fn env(&self, faults: Option<&str>) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = ["PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG"]
            .into_iter()
            .filter_map(|name| std::env::var_os(name).map(|value| (name.into(), value)))
            .collect();
        env.push(("SBX_SIM_HOME".into(), self.home.path().into()));
        if let Some(faults) = faults {
            env.push(("SBX_SIM_FAULTS".into(), faults.into()));
        }
        env
    }

    fn driver(&self) -> SbxCli {
        self.builder(None).build().unwrap()
    }

    /// A driver whose every call carries these faults.
    fn faulty(&self, faults: &str) -> SbxCli {
        self.builder(Some(faults)).build().unwrap()
    }

    fn builder(&self, faults: Option<&str>) -> sbx_cli::SbxCliBuilder {
        SbxCli::builder(&self.bin, |name: &OsStr| {
            !name.to_string_lossy().contains("TOKEN")
        })
        .management_env(self.env(faults))
        .command_timeout(Duration::from_secs(60))
        .create_timeout(Duration::from_secs(180))
    }

    /// A fresh absolute workspace directory.
    fn workspace(&self, name: &str) -> PathBuf {
        let path = self.work.path().join(name);
        std::fs::create_dir(&path).unwrap();
        path
    }

    fn create_request(&self, name: &SbxName) -> CreateRequest {
        CreateRequest::new(
            name.clone(),
            self.workspace(name.as_str()),
            NonZeroU32::new(1).unwrap(),
            MemorySize::new("256m").unwrap(),
        )
    }

    /// Runs the stand-in directly (for its own `settings set` and `sim …` commands).
    async fn run(&self, args: &[&str]) -> bounded_process::RunOutput {
        BoundedCommand::new(&self.bin, Duration::from_secs(120))
            .args(args)
            .envs(self.env(None))
            .run()
            .await
            .unwrap()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Bounded without a runtime (drop may run while a test unwinds): poll, then kill.
        let mut child = std::process::Command::new(&self.bin)
            .args(["sim", "reset"])
            .env_clear()
            .envs(self.env(None))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start `sim reset`");
        let give_up = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    assert!(
                        status.success() || std::thread::panicking(),
                        "sim reset: {status}"
                    );
                    return;
                }
                Ok(None) if std::time::Instant::now() < give_up => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("`sim reset` did not finish within 120 s");
                }
            }
        }
    }
}

fn name(text: &str) -> SbxName {
    SbxName::new(text).unwrap()
}

fn in_a_minute() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[tokio::test]
async fn version_and_host_settings() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let version = sbx.version().await.unwrap();
    assert!(version.contains("sbx-sim"), "{version}");
    assert!(version.contains("isolation: container"), "{version}");

    assert_eq!(
        sbx.settings_get("ssh.agentForwardingEnabled")
            .await
            .unwrap(),
        "false"
    );
    let forwarding = sim.faulty("agent-forwarding");
    assert_eq!(
        forwarding
            .settings_get("ssh.agentForwardingEnabled")
            .await
            .unwrap(),
        "true"
    );
    let err = sbx.settings_get("no.such.key").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Failed {
                call: Call::SettingsGet,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn mcp_listing_in_both_shapes() {
    let sim = Sim::new().await;
    assert!(sim.driver().mcp_ls().await.unwrap().is_empty());
    let servers = sim.faulty("mcp-server").mcp_ls().await.unwrap();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].name.as_deref(), Some("sim-mcp"));
    let keyed = sim
        .faulty("mcp-server,mcp-shape=keyed")
        .mcp_ls()
        .await
        .unwrap();
    assert_eq!(keyed, servers);
}

#[tokio::test]
async fn read_only_secret_and_policy_calls() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let secrets = sbx.secret_ls().await.unwrap();
    assert!(secrets.secrets.is_empty() && secrets.custom_secrets.is_empty());
    assert!(sbx.policy_ls(None).await.unwrap().rules.is_empty());
    assert!(sbx
        .policy_ls(Some(&name("sbxcli-policy")))
        .await
        .unwrap()
        .rules
        .is_empty());
    let check = sbx.policy_check_network("example.com").await.unwrap();
    assert!(!check.allowed && !check.governance_active, "{check:?}");
}

#[tokio::test]
async fn sandbox_lifecycle() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-life");
    let request = sim.create_request(&sandbox);
    let workspace = sim.work.path().join("sbxcli-life");

    assert!(sbx.ls().await.unwrap().is_empty());
    sbx.create(&request).await.unwrap();

    let rows = sbx.ls().await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row.sbx_name().as_ref(), Some(&sandbox));
    assert!(
        row.id.as_deref().is_some_and(|id| id.len() == 32),
        "{row:?}"
    );
    assert_eq!(row.workspaces, std::slice::from_ref(&workspace));
    assert_eq!(row.status.as_deref(), Some("running"));
    assert_eq!(row.cpus, Some(1));

    // A second sandbox, which must survive the first one's removal.
    sbx.create(&sim.create_request(&name("sbxcli-life2")))
        .await
        .unwrap();
    // A second create of a taken name loses.
    let again = CreateRequest::new(
        sandbox.clone(),
        &workspace,
        NonZeroU32::new(1).unwrap(),
        MemorySize::new("256m").unwrap(),
    );
    let err = sbx.create(&again).await.unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists { ref name, .. } if name == "sbxcli-life"),
        "{err:?}"
    );

    // The default exec runs in the workspace, mounted at its host path.
    let pwd = sbx
        .exec_checked(&ExecRequest::new(
            sandbox.clone(),
            ["sh", "-c", "pwd -P"],
            in_a_minute(),
        ))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&pwd.stdout).trim(),
        workspace.display().to_string()
    );

    let root = sbx
        .exec_checked(&ExecRequest::new(sandbox.clone(), ["id", "-u"], in_a_minute()).as_root())
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&root.stdout).trim(), "0");

    // Stdin and output bytes cross untouched; a command's status is returned, not raised.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let echoed = sbx
        .exec(
            &ExecRequest::new(sandbox.clone(), ["sh", "-c", "cat; exit 7"], in_a_minute())
                .stdin(bytes.clone()),
        )
        .await
        .unwrap();
    assert_eq!(echoed.status, ExitKind::Exited(7));
    assert!(
        echoed.stdout == bytes,
        "stdin did not come back byte for byte"
    );

    assert_eq!(sbx.rm(&sandbox).await.unwrap(), Removal::Removed);
    assert_eq!(sbx.rm(&sandbox).await.unwrap(), Removal::WasAbsent);
    let err = sbx
        .exec_checked(&ExecRequest::new(sandbox.clone(), ["true"], in_a_minute()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotFound {
                call: Call::Exec,
                ..
            }
        ),
        "{err:?}"
    );
    let names: Vec<String> = sbx
        .ls()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["sbxcli-life2"]);
    // The stand-in never touches the workspace.
    assert!(workspace.is_dir());
}

#[tokio::test]
async fn a_template_without_bash_cannot_start() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-nobash");
    let err = sbx
        .create(&sim.create_request(&sandbox).template(SHELL_LESS_TEMPLATE))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TemplateCannotStart {
                call: Call::Create,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(sbx.ls().await.unwrap().is_empty());
}

#[tokio::test]
async fn login_and_daemon_faults_are_classified() {
    let sim = Sim::new().await;
    let lapsed = sim.faulty("login-lapsed");
    assert!(lapsed.version().await.unwrap().contains("sbx-sim"));
    let err = lapsed.ls().await.unwrap_err();
    assert!(
        matches!(err, Error::LoginRequired { call: Call::Ls, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("sbx login"));
    let err = lapsed.rm(&name("sbxcli-any")).await.unwrap_err();
    assert!(
        matches!(err, Error::LoginRequired { call: Call::Rm, .. }),
        "{err:?}"
    );

    let daemon = sim.faulty("daemon-fault");
    let err = daemon.mcp_ls().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::DaemonFault {
                call: Call::McpLs,
                ..
            }
        ),
        "{err:?}"
    );
    let err = daemon
        .create(&sim.create_request(&name("sbxcli-daemon")))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DaemonFault {
                call: Call::Create,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn listing_faults() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-list");
    sbx.create(&sim.create_request(&sandbox)).await.unwrap();
    let rows = sbx.ls().await.unwrap();

    assert_eq!(sim.faulty("ls-shape=keyed").ls().await.unwrap(), rows);
    let err = sim.faulty("ls-malformed").ls().await.unwrap_err();
    assert!(
        matches!(err, Error::Malformed { call: Call::Ls, .. }),
        "{err:?}"
    );

    // A daemon that lost its engine lists nothing but still answers exec; rm reports the fault.
    let lost = sim.faulty("lost-engine");
    assert!(lost.ls().await.unwrap().is_empty());
    lost.exec_checked(&ExecRequest::new(
        sandbox.clone(),
        ["sh", "-c", ":"],
        in_a_minute(),
    ))
    .await
    .unwrap();
    let err = lost.rm(&sandbox).await.unwrap_err();
    assert!(
        matches!(err, Error::DaemonFault { call: Call::Rm, .. }),
        "{err:?}"
    );
    assert_eq!(sbx.rm(&sandbox).await.unwrap(), Removal::Removed);
}

#[tokio::test]
async fn a_hung_exec_ends_at_the_callers_deadline() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-hang");
    sbx.create(&sim.create_request(&sandbox)).await.unwrap();

    let hung = sim.faulty("hung-exec=marker-hang");
    let started = std::time::Instant::now();
    let err = hung
        .exec(&ExecRequest::new(
            sandbox.clone(),
            ["sh", "-c", "echo marker-hang"],
            Instant::now() + Duration::from_secs(2),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                call: Call::Exec,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Only the matching command hangs.
    let output = hung
        .exec_checked(&ExecRequest::new(sandbox, ["echo", "fine"], in_a_minute()))
        .await
        .unwrap();
    assert_eq!(output.stdout, b"fine\n");
}

#[tokio::test]
async fn an_exec_flood_hits_the_budget() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-flood");
    sbx.create(&sim.create_request(&sandbox)).await.unwrap();
    let err = sbx
        .exec(
            &ExecRequest::new(sandbox, ["sh", "-c", "yes flood"], in_a_minute())
                .output_budget(256 * 1024),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Exec,
                budget: 262_144
            }
        ),
        "{err:?}"
    );
}

/// Keeps what a streamed exec hands it, with when its first stdout came.
struct Kept {
    started: std::time::Instant,
    first_stdout: Option<Duration>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl sbx_cli::OutputSink for Kept {
    async fn accept(
        &mut self,
        stream: sbx_cli::Stream,
        bytes: &[u8],
    ) -> Result<(), bounded_process::Error> {
        match stream {
            sbx_cli::Stream::Stdout => {
                self.first_stdout.get_or_insert(self.started.elapsed());
                self.stdout.extend_from_slice(bytes);
            }
            sbx_cli::Stream::Stderr => self.stderr.extend_from_slice(bytes),
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_streamed_exec_delivers_early_and_takes_a_reader_on_stdin() {
    let sim = Sim::new().await;
    let sbx = sim.driver();
    let sandbox = name("sbxcli-stream");
    sbx.create(&sim.create_request(&sandbox)).await.unwrap();
    let kept = || Kept {
        started: std::time::Instant::now(),
        first_stdout: None,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };

    let mut early = kept();
    let request = ExecRequest::new(
        sandbox.clone(),
        ["sh", "-c", "printf first; sleep 2; printf second"],
        in_a_minute(),
    );
    let status = sbx
        .exec_streaming(&request, None, &mut early)
        .await
        .unwrap();
    assert_eq!(status, ExitKind::Exited(0));
    assert_eq!(early.stdout, b"firstsecond");
    let first = early.first_stdout.unwrap();
    assert!(
        first < Duration::from_secs(2),
        "first stdout after {first:?}"
    );
    assert!(early.started.elapsed() >= Duration::from_secs(2));

    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let mut echoed = kept();
    let request =
        ExecRequest::new(sandbox.clone(), ["cat"], in_a_minute()).output_budget(usize::MAX);
    let status = sbx
        .exec_streaming(
            &request,
            Some(Box::new(std::io::Cursor::new(data.clone()))),
            &mut echoed,
        )
        .await
        .unwrap();
    assert_eq!(status, ExitKind::Exited(0));
    assert!(
        echoed.stdout == data,
        "cat echoed {} bytes",
        echoed.stdout.len()
    );

    // A command that never reads an endless stdin ends the call.
    let mut ignored = kept();
    let request = ExecRequest::new(sandbox.clone(), ["sh", "-c", "exit 4"], in_a_minute());
    let status = sbx
        .exec_streaming(
            &request,
            Some(Box::new(tokio::io::repeat(b'n'))),
            &mut ignored,
        )
        .await
        .unwrap();
    assert_eq!(status, ExitKind::Exited(4));

    // The budget holds over streamed bytes.
    let mut flooded = kept();
    let request = ExecRequest::new(sandbox, ["sh", "-c", "yes flood"], in_a_minute())
        .output_budget(256 * 1024);
    let err = sbx
        .exec_streaming(&request, None, &mut flooded)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutputLimit {
                call: Call::Exec,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(flooded.stdout.len() <= 256 * 1024);
}
