//! The simulator against the real Docker engine and `sbx-sim-shell:local`: every command, every
//! fault, a create outliving its killed client, a create race, idle stop and restart, byte-exact
//! relaying, and state homes kept apart.
//!
//! Each test has its own state home (a temporary directory) and removes every container it
//! made; the guard checks the engine holds none of its home's containers afterwards.

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

const SIM: &str = env!("CARGO_BIN_EXE_sbx-sim");

/// One state home with its workspaces; on drop, `sim reset` and a check that the engine holds
/// none of its containers.
struct Home {
    dir: tempfile::TempDir,
    extra_env: Vec<(String, String)>,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::Builder::new()
                .prefix("sbx-sim-live-")
                .tempdir()
                .expect("temp home"),
            extra_env: Vec::new(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The home digest, computed independently of the binary.
    fn digest(&self) -> String {
        let digest = Sha256::digest(self.path().as_os_str().as_encoded_bytes());
        digest[..6].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A fresh workspace directory (mode 0700), owned by `owner` when given.
    fn workspace(&self, name: &str, owner: Option<(u32, u32)>) -> PathBuf {
        let path = self.dir.path().join(format!("ws-{name}"));
        std::fs::create_dir(&path).expect("workspace");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown workspace");
        }
        path
    }

    fn command<I, A>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        let mut command = Command::new(SIM);
        command
            .args(args)
            .env("SBX_SIM_HOME", self.path())
            .env_remove("SBX_SIM_FAULTS")
            .stdin(Stdio::null());
        for (k, v) in &self.extra_env {
            command.env(k, v);
        }
        command
    }

    fn run<I, A>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        self.command(args).output().expect("run sbx-sim")
    }

    /// Runs and requires exit 0; returns stdout as text.
    fn ok<I, A>(&self, args: I) -> String
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.run(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// Runs and requires exit 1 with exactly one `ERROR: …` line containing `needle`.
    fn fails<I, A>(&self, args: I, needle: &str)
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> =
            args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.run(&args);
        assert_error(&out, needle, &format!("{args:?}"));
    }

    fn create(&self, name: &str, workspace: &Path, extra: &[&str]) {
        let mut args: Vec<std::ffi::OsString> = ["create", "shell", "--name", name]
            .iter()
            .map(Into::into)
            .collect();
        args.extend(
            ["--cpus", "1", "--memory", "512m", "--skills", "off"]
                .iter()
                .map(Into::into),
        );
        args.extend(extra.iter().map(Into::into));
        args.push(workspace.into());
        let stdout = self.ok(&args);
        assert_eq!(stdout, format!("Created sandbox {name}\n"));
    }

    fn ls(&self) -> Vec<Value> {
        let value: Value = serde_json::from_str(&self.ok(["ls", "--json"])).expect("ls json");
        value.as_array().expect("ls array").clone()
    }

    fn row(&self, name: &str) -> Option<Value> {
        self.ls().into_iter().find(|row| row["name"] == name)
    }

    /// Container ids the engine holds for this home.
    fn engine_containers(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=sbx-sim.home={}", self.digest()))
            .output()
            .expect("docker ps");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    fn container_name(&self, name: &str) -> String {
        format!("sbx-sim-{}-{name}", self.digest())
    }

    /// Removes everything and checks the engine is clean for this home.
    fn finish(self) {
        self.ok(["sim", "reset"]);
        assert!(self.engine_containers().is_empty());
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // On a failed test too: leave nothing on the engine.
        let _ = self.command(["sim", "reset"]).output();
        if !std::thread::panicking() {
            assert!(
                self.engine_containers().is_empty(),
                "containers left for this home"
            );
        }
    }
}

fn assert_error(out: &Output, needle: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: stderr {stderr:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one error line, got {stderr:?}");
    assert!(lines[0].starts_with("ERROR: "), "{what}: {stderr:?}");
    assert!(
        lines[0].contains(needle),
        "{what}: {needle:?} not in {stderr:?}"
    );
}

fn docker_inspect(container: &str) -> Value {
    let out = Command::new("docker")
        .args(["inspect", container])
        .output()
        .expect("docker inspect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    value[0].clone()
}

fn wait_until(bound: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < bound, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether a child is still running after `bound`; it is killed and reaped either way.
fn still_running_after(mut child: Child, bound: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < bound {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    running
}

#[test]
fn version_names_the_stand_in_and_bad_command_lines_are_usage_errors() {
    let home = Home::new();
    assert_eq!(
        home.ok(["version"]),
        format!(
            "sbx-sim {} (stand-in for sbx; emulates v0.45.1; isolation: container)\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    // Under another name (as `sbx` on PATH), the detached create worker still starts.
    let bin = home.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(SIM, bin.join("sbx")).unwrap();
    let ws = home.workspace("named", None);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let as_sbx = |args: &[&OsStr]| {
        Command::new("sbx")
            .args(args)
            .env("SBX_SIM_HOME", home.path())
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = as_sbx(&[
        "create".as_ref(),
        "shell".as_ref(),
        "--name".as_ref(),
        "named".as_ref(),
        ws.as_os_str(),
    ]);
    assert_eq!(out.stdout, b"Created sandbox named\n", "{out:?}");
    let out = as_sbx(&["exec".as_ref(), "named".as_ref(), "pwd".as_ref()]);
    assert_eq!(out.stdout, format!("{}\n", ws.display()).into_bytes());
    let out = as_sbx(&["bogus".as_ref()]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Usage: sbx "),
        "{out:?}"
    );
    for args in [
        &["bogus"][..],
        &["exec", "sb"],
        &["ls", "--yaml"],
        &["rm", "--all"],
        &["create", "shell", "/tmp"],
    ] {
        let out = home.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Usage:"),
            "{args:?}"
        );
    }
    home.finish();
}

#[test]
fn create_ls_exec_rm_round_trip_with_the_container_mapping() {
    let home = Home::new();
    let ws = home.workspace("main", Some((1000, 1000)));
    home.create("main", &ws, &["--deny-network", "**"]);

    let row = home.row("main").expect("listed");
    let mut keys: Vec<&str> = row
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "agent",
            "cpus",
            "created_at",
            "id",
            "memory",
            "name",
            "status",
            "template",
            "workspaces"
        ]
    );
    assert_eq!(row["status"], "running");
    assert_eq!(row["agent"], "shell");
    assert_eq!(row["template"], "shell");
    assert_eq!(row["cpus"], 1);
    assert_eq!(row["memory"], "512m");
    assert_eq!(row["workspaces"][0], ws.to_str().unwrap());
    let id = row["id"].as_str().unwrap();
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(home.ok(["ls"]).lines().nth(1).unwrap().starts_with("main "));

    let inspect = docker_inspect(&home.container_name("main"));
    let labels = &inspect["Config"]["Labels"];
    assert_eq!(labels["sbx-sim.home"], home.digest());
    assert_eq!(labels["sbx-sim.name"], "main");
    assert_eq!(labels["sbx-sim.id"], id);
    assert_eq!(labels["sbx-sim.workspace"], ws.to_str().unwrap());
    assert_eq!(labels["sbx-sim.template"], "shell");
    assert_eq!(labels["sbx-sim.created"], row["created_at"]);
    assert_eq!(inspect["Config"]["Image"], "sbx-sim-shell:local");
    assert_eq!(inspect["Config"]["Hostname"], "main");
    let host = &inspect["HostConfig"];
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["PidsLimit"], 4096);
    assert_eq!(host["Init"], true);
    assert!(
        host["CapDrop"] == serde_json::json!(["ALL"])
            || host["CapDrop"] == serde_json::json!(["CAP_ALL"]),
        "{}",
        host["CapDrop"]
    );
    assert_eq!(host["CapAdd"], serde_json::json!(["CAP_SETFCAP"]));
    let secopts = host["SecurityOpt"].to_string();
    assert!(secopts.contains("apparmor=unconfined"), "{secopts}");
    assert!(secopts.contains("no-new-privileges"), "{secopts}");
    // The profile is carried inline; it is not "unconfined".
    assert!(
        secopts.contains("seccomp=") && !secopts.contains("seccomp=unconfined"),
        "{secopts}"
    );
    assert_eq!(host["Binds"][0], format!("{0}:{0}", ws.display()));

    // The default exec: the workspace owner's uid, in the workspace, at its host path.
    let out = home.ok(["exec", "main", "sh", "-c", "id -u; id -g; pwd -P"]);
    assert_eq!(out, format!("1000\n1000\n{}\n", ws.display()));
    assert_eq!(home.ok(["exec", "-u", "root", "main", "id", "-u"]), "0\n");
    assert_eq!(
        home.ok([
            "exec",
            "-w",
            "/tmp",
            "-e",
            "A=1 2",
            "-e",
            "B=",
            "main",
            "sh",
            "-c",
            "pwd; echo \"$A|$B\""
        ]),
        "/tmp\n1 2|\n"
    );
    // The command's own status and stderr pass through.
    let out = home.run(["exec", "main", "sh", "-c", "echo out; echo err >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    // What the exec wrapper does, a user namespace with a bind mount in it, works for the
    // default user (a root-owned workspace's root guest: see the set-uid tests).
    let bind = "d=$(mktemp -d) && mkdir $d/a $d/b && touch $d/a/seen && \
                unshare --user --mount --map-root-user sh -c \"mount --bind $d/a $d/b && ls $d/b\"";
    assert_eq!(home.ok(["exec", "main", "sh", "-c", bind]), "seen\n");
    // An explicit root exec into a sandbox of a non-root owner is root by uid only: under
    // no-new-privileges it holds no capability its container's user lacks.
    assert_eq!(
        home.ok([
            "exec",
            "-u",
            "root",
            "main",
            "grep",
            "CapEff",
            "/proc/self/status"
        ]),
        "CapEff:\t0000000000000000\n"
    );
    // No network beyond loopback.
    assert_eq!(home.ok(["exec", "main", "ls", "/sys/class/net"]), "lo\n");
    // stdin reaches the command only with -i.
    let mut child = home
        .command(["exec", "-i", "main", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped\x00bytes")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.stdout, b"piped\x00bytes");
    let mut child = home
        .command(["exec", "main", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(b"not for you");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());

    // Exec refusals.
    home.fails(["exec", "-t", "main", "true"], "-t");
    home.fails(
        ["exec", "main", "sh", "-c", ""],
        "empty argument at position 3",
    );
    home.fails(["exec", "", "true"], "empty argument at position 0");
    home.fails(["exec", "nosuch", "true"], "sandbox nosuch not found");
    assert!(!home.path().join("sessions/nosuch").exists());

    // rm: running without --force is refused; the workspace is never touched.
    std::fs::write(ws.join("kept"), b"x").unwrap();
    home.fails(["rm", "main"], "running");
    let killed = Command::new("docker")
        .args(["kill", &home.container_name("main")])
        .output()
        .unwrap();
    assert!(killed.status.success());
    assert_eq!(home.row("main").unwrap()["status"], "stopped");
    assert_eq!(home.ok(["rm", "main"]), "Removed sandbox main\n");
    assert!(home.ls().is_empty());
    assert!(ws.join("kept").exists());
    home.fails(["rm", "-f", "main"], "sandbox main not found");
    home.fails(["exec", "main", "true"], "sandbox main not found");
    assert!(!home.path().join("sandboxes/main.json").exists());
    home.finish();
}

/// The guest is its workspace's owner and nothing more: it cannot become root (the template's
/// passwordless `sudo` is a set-uid binary, which `no-new-privileges` disarms), so a set-uid root
/// binary never appears in the host's workspace, and a set-uid bit it sets on its own file is
/// the owner's, granting nothing.
#[test]
fn the_guest_cannot_plant_a_set_uid_root_binary_in_the_host_workspace() {
    use std::os::unix::fs::MetadataExt as _;
    let home = Home::new();
    let ws = home.workspace("suid", Some((1000, 1000)));
    home.create("suid", &ws, &["--deny-network", "**"]);
    let attempt = home.run([
        "exec",
        "suid",
        "sh",
        "-c",
        "grep NoNewPrivs /proc/self/status; \
         sudo -n sh -c 'cp /bin/sh root-sh && chown 0:0 root-sh && chmod 4755 root-sh' 2>&1; \
         echo sudo=$?; cp /bin/sh own-sh && chmod 4755 own-sh; echo own=$?",
    ]);
    let text = String::from_utf8_lossy(&attempt.stdout);
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(!text.contains("sudo=0"), "sudo made the guest root: {text}");
    match std::fs::symlink_metadata(ws.join("root-sh")) {
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound),
        Ok(meta) => assert!(
            meta.uid() != 0 || meta.mode() & 0o6000 == 0,
            "a set-uid root file on the host: uid {} mode {:o}",
            meta.uid(),
            meta.mode()
        ),
    }
    // Not even on its own file: no set-uid or set-gid bit appears on the host.
    let own = std::fs::symlink_metadata(ws.join("own-sh")).expect("the copy is made");
    assert_eq!((own.uid(), own.gid()), (1000, 1000));
    assert_eq!(own.mode() & 0o6000, 0, "mode {:o}", own.mode());
    assert!(!text.contains("own=0"), "{text}");
    // Nor does a set-uid binary in the guest lift it: `su` and `sudo` stay the owner.
    let id = home.ok([
        "exec",
        "suid",
        "sh",
        "-c",
        "sudo -n id -u 2>/dev/null || id -u",
    ]);
    assert_eq!(id, "1000\n");
    home.finish();
}

/// A workspace of this process's user (root when the suite runs as root, as it does here, so the
/// guest is root): every way to give a file a set-uid or set-gid mode fails, so no set-uid root
/// binary appears in the host's workspace.
#[test]
fn a_root_guest_cannot_give_a_workspace_file_a_set_uid_mode() {
    use std::os::unix::fs::MetadataExt as _;
    let home = Home::new();
    let mine = home.workspace("mine", None);
    home.create("mine", &mine, &["--deny-network", "**"]);
    let tries = home.run([
        "exec",
        "mine",
        "sh",
        "-c",
        "id -u; cp /bin/sh a && chmod 4755 a; echo chmod=$?; cp /bin/sh b && chmod g+s b; \
         echo setgid=$?; install -m 4755 /bin/sh c; echo install=$?; \
         perl -e 'sysopen(F, \"d\", 0100|01, 04755) or exit 1'; echo open=$?; \
         perl -e 'my $p = \"a\"; exit(syscall(452, -100, $p, 04755, 0) == 0 ? 0 : 1)'; echo chmodat2=$?",
    ]);
    let said = String::from_utf8_lossy(&tries.stdout);
    for attempt in ["chmod", "setgid", "install", "open", "chmodat2"] {
        assert!(!said.contains(&format!("{attempt}=0")), "{attempt}: {said}");
    }
    for name in ["a", "b", "c", "d"] {
        if let Ok(meta) = std::fs::symlink_metadata(mine.join(name)) {
            assert_eq!(
                meta.mode() & 0o6000,
                0,
                "{name}: mode {:o}: {said}",
                meta.mode()
            );
        }
    }
    home.finish();
}

#[test]
fn create_refuses_bad_requests_and_taken_names() {
    let home = Home::new();
    let ws = home.workspace("a", None);
    let ws_text = ws.to_str().unwrap();
    home.fails(
        ["create", "claude", "--name", "x", ws_text],
        "unknown agent",
    );
    home.fails(
        ["create", "shell", "--name", "Bad_Name", ws_text],
        "invalid sandbox name",
    );
    home.fails(
        ["create", "shell", "--name", "x", "relative/dir"],
        "absolute",
    );
    home.fails(
        ["create", "shell", "--name", "x", "/nonexistent/sbx-sim-ws"],
        "/nonexistent",
    );
    let colon = home.dir.path().join("a:b");
    std::fs::create_dir(&colon).unwrap();
    home.fails(
        ["create", "shell", "--name", "x", colon.to_str().unwrap()],
        "':' or ','",
    );
    home.fails(
        ["create", "shell", "--name", "x", "--cpus", "0", ws_text],
        "--cpus",
    );
    home.fails(
        [
            "create", "shell", "--name", "x", "--memory", "lots", ws_text,
        ],
        "--memory",
    );
    home.create("a", &ws, &[]);
    home.fails(
        ["create", "shell", "--name", "a", ws_text],
        "sandbox a already exists",
    );
    // Without --deny-network ** the sandbox has the default network.
    let inspect = docker_inspect(&home.container_name("a"));
    assert_ne!(inspect["HostConfig"]["NetworkMode"], "none");
    // --cpus is clamped to the host's count, and ls still reports what was asked.
    let ws_big = home.workspace("big", None);
    home.ok([
        "create",
        "shell",
        "--name",
        "big",
        "--cpus",
        "4096",
        "--memory",
        "256m",
        ws_big.to_str().unwrap(),
    ]);
    assert_eq!(home.row("big").unwrap()["cpus"], 4096);
    let host_cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let nano = docker_inspect(&home.container_name("big"))["HostConfig"]["NanoCpus"]
        .as_u64()
        .unwrap();
    assert_eq!(nano, host_cpus * 1_000_000_000);
    home.finish();
}

#[test]
fn a_template_without_bash_cannot_start_and_leaves_nothing() {
    let home = Home::new();
    let ws = home.workspace("t", None);
    home.fails(
        [
            "create",
            "shell",
            "--name",
            "nobash",
            "--template",
            "sandbox-busybox:local",
            ws.to_str().unwrap(),
        ],
        "kit startup exited with code 127",
    );
    assert!(home.engine_containers().is_empty());
    // A failed create leaves no request, result or log behind.
    assert_eq!(
        std::fs::read_dir(home.path().join("workers"))
            .unwrap()
            .count(),
        0
    );
    // A template image that is not there is never pulled.
    home.fails(
        [
            "create",
            "shell",
            "--name",
            "noimage",
            "--template",
            "sbx-sim-no-such-image:local",
            ws.to_str().unwrap(),
        ],
        "docker run failed",
    );
    assert!(home.engine_containers().is_empty());
    assert!(home.ls().is_empty());
    home.finish();
}

#[test]
fn a_guest_without_user_namespaces_is_refused_at_create() {
    let mut home = Home::new();
    // A docker CLI that answers the create's user-namespace proof as a kernel that forbids
    // them would, and passes every other call through.
    let fake = home.dir.path().join("docker-no-userns");
    std::fs::write(
        &fake,
        "#!/bin/sh\ncase \"$*\" in *'unshare --user --mount --map-root-user true'*) \
         echo 'unshare: write failed /proc/self/uid_map: Operation not permitted' >&2; exit 1;; esac\n\
         exec docker \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    home.extra_env
        .push(("SBX_SIM_DOCKER".into(), fake.to_str().unwrap().into()));
    let ws = home.workspace("u", None);
    let out = home.run(["create", "shell", "--name", "userns", ws.to_str().unwrap()]);
    assert_error(&out, "kernel.unprivileged_userns_clone", "create");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("kernel.apparmor_restrict_unprivileged_userns"));
    assert!(home.engine_containers().is_empty());
    home.finish();
}

#[test]
fn login_and_daemon_faults_gate_every_command_but_version_login_and_sim() {
    let home = Home::new();
    let ws = home.workspace("g", None);
    home.create("gated", &ws, &[]);
    let gated: &[&[&str]] = &[
        &["ls", "--json"],
        &["exec", "gated", "true"],
        &["rm", "--force", "gated"],
        &["settings", "get", "ssh.agentForwardingEnabled"],
        &["mcp", "ls", "--json"],
        &["secret", "ls", "--json"],
        &["policy", "ls", "--json"],
        &["daemon", "restart"],
        &["create", "shell", "--name", "other", ws.to_str().unwrap()],
    ];
    home.ok(["sim", "fault", "set", "login-lapsed"]);
    for args in gated {
        let out = home.run(*args);
        assert_error(
            &out,
            "You are not logged in. Run 'sbx login' to sign in.",
            &format!("{args:?}"),
        );
    }
    home.ok(["version"]);
    assert_eq!(home.ok(["sim", "fault", "ls"]), "login-lapsed\n");
    assert_eq!(home.ok(["login"]), "Login Succeeded\n");
    home.ok(["ls", "--json"]);
    home.ok(["logout"]);
    home.fails(["ls"], "not logged in");
    let mut child = home
        .command(["login", "--username", "u", "--password-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"secret\n").unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    home.ok(["ls"]);

    home.ok(["sim", "fault", "set", "daemon-fault"]);
    for args in gated {
        let out = home.run(*args);
        assert_error(&out, "backend unavailable", &format!("{args:?}"));
    }
    home.ok(["sim", "fault", "clear", "daemon-fault"]);
    // The environment adds faults for one invocation only.
    let out = home
        .command(["ls", "--json"])
        .env("SBX_SIM_FAULTS", "daemon-fault")
        .output()
        .unwrap();
    assert_error(&out, "backend unavailable", "env fault");
    home.ok(["ls", "--json"]);
    home.fails(["sim", "fault", "set", "no-such-fault"], "unknown fault");
    let out = home
        .command(["ls"])
        .env("SBX_SIM_FAULTS", "bogus")
        .output()
        .unwrap();
    assert_error(&out, "SBX_SIM_FAULTS", "bad env fault");
    home.finish();
}

#[test]
fn settings_mcp_secret_and_policy_answer_their_shapes_and_faults() {
    let home = Home::new();
    assert_eq!(
        home.ok(["settings", "get", "ssh.agentForwardingEnabled"]),
        "false\n"
    );
    assert_eq!(home.ok(["settings", "get", "sim.idleStopSeconds"]), "30\n");
    home.ok(["settings", "set", "sim.idleStopSeconds", "5"]);
    assert_eq!(home.ok(["settings", "get", "sim.idleStopSeconds"]), "5\n");
    home.fails(["settings", "get", "no.such"], "unknown setting");
    home.fails(
        ["settings", "set", "sim.idleStopSeconds", "soon"],
        "whole number",
    );
    home.ok(["sim", "fault", "set", "agent-forwarding"]);
    assert_eq!(
        home.ok(["settings", "get", "ssh.agentForwardingEnabled"]),
        "true\n"
    );
    home.ok(["sim", "fault", "clear"]);
    assert_eq!(
        home.ok(["settings", "get", "ssh.agentForwardingEnabled"]),
        "false\n"
    );

    assert_eq!(home.ok(["mcp", "ls", "--json"]), "[]\n");
    home.ok(["mcp", "add", "tools", "http://127.0.0.1:1/mcp"]);
    assert_eq!(
        home.ok(["mcp", "ls", "--json"]),
        "[{\"name\":\"tools\",\"url\":\"http://127.0.0.1:1/mcp\"}]\n"
    );
    home.ok(["mcp", "rm", "tools"]);
    home.fails(["mcp", "rm", "tools"], "not found");
    home.ok(["sim", "fault", "set", "mcp-server"]);
    home.ok(["sim", "fault", "set", "mcp-shape=keyed"]);
    assert_eq!(
        home.ok(["mcp", "ls", "--json"]),
        "{\"servers\":[{\"name\":\"sim-mcp\",\"url\":\"http://127.0.0.1:9/mcp\"}]}\n"
    );
    assert!(home.ok(["mcp", "ls"]).contains("sim-mcp"));
    home.ok(["sim", "fault", "clear"]);

    let secrets: Value = serde_json::from_str(&home.ok(["secret", "ls", "--json"])).unwrap();
    assert_eq!(
        secrets,
        serde_json::json!({"secrets": [], "env_only_count": 0, "custom_secrets": []})
    );
    assert_eq!(home.ok(["policy", "ls", "--json"]), "{\"rules\":[]}\n");
    assert_eq!(
        home.ok(["policy", "ls", "sb", "--json"]),
        "{\"rules\":[]}\n"
    );
    let out = home.run(["policy", "check", "network", "--json", "example.com"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"allowed\":false,\"governance\":{\"active\":false}}\n"
    );
    home.ok([
        "policy",
        "deny",
        "network",
        "--sandbox",
        "sb",
        "--protocol",
        "tcp,udp",
        "**",
    ]);
    home.ok([
        "policy",
        "allow",
        "network",
        "--sandbox",
        "sb",
        "a.example,b.example",
    ]);
    let recorded: Value =
        serde_json::from_slice(&std::fs::read(home.path().join("policy.json")).unwrap()).unwrap();
    assert_eq!(recorded.as_array().unwrap().len(), 2);
    assert_eq!(recorded[1]["decision"], "allow");
    assert_eq!(recorded[1]["rule"]["resources"], "a.example,b.example");
    home.fails(
        [
            "policy",
            "rm",
            "network",
            "--sandbox",
            "sb",
            "--resource",
            "**",
            "--force",
        ],
        "cannot enforce network allow rules",
    );
    assert_eq!(home.ok(["daemon", "restart"]), "Daemon restarted\n");
    home.finish();
}

#[test]
fn listing_faults_change_the_shape_and_lost_engine_hides_but_still_execs() {
    let home = Home::new();
    let ws = home.workspace("l", None);
    home.create("listed", &ws, &[]);
    home.ok(["sim", "fault", "set", "ls-shape=keyed"]);
    let keyed: Value = serde_json::from_str(&home.ok(["ls", "--json"])).unwrap();
    assert_eq!(keyed["sandboxes"][0]["name"], "listed");
    home.ok(["sim", "fault", "set", "ls-malformed"]);
    let malformed: Value = serde_json::from_str(&home.ok(["ls", "--json"])).unwrap();
    assert!(malformed.is_object() && malformed.get("sandboxes").is_none());
    home.ok(["sim", "fault", "clear"]);

    home.ok(["sim", "fault", "set", "lost-engine"]);
    assert_eq!(home.ok(["ls", "--json"]), "[]\n");
    assert_eq!(home.ok(["exec", "listed", "echo", "still"]), "still\n");
    home.fails(["rm", "--force", "listed"], "backend unavailable");
    home.fails(
        ["create", "shell", "--name", "more", ws.to_str().unwrap()],
        "backend unavailable",
    );
    assert_eq!(home.engine_containers().len(), 1);
    home.ok(["sim", "fault", "clear", "lost-engine"]);
    assert_eq!(home.ls().len(), 1);
    home.ok(["rm", "--all", "--force"]);
    assert!(home.ls().is_empty());
    home.finish();
}

#[test]
fn the_agent_socket_appears_from_the_fault_or_an_old_daemon_setting() {
    let home = Home::new();
    let ws = home.workspace("s", None);
    home.create("clean", &ws, &[]);
    let probe = "if [ -L /run/ssh-agent.sock ]; then echo link; \
                 elif [ -f /run/ssh-agent.sock ]; then stat -c %a /run/ssh-agent.sock; \
                 else echo none; fi";
    assert_eq!(home.ok(["exec", "clean", "sh", "-c", probe]), "none\n");
    home.ok(["sim", "fault", "set", "agent-socket"]);
    home.create("file", &ws, &[]);
    assert_eq!(home.ok(["exec", "file", "sh", "-c", probe]), "666\n");
    home.ok(["sim", "fault", "set", "agent-socket=link"]);
    home.create("link", &ws, &[]);
    assert_eq!(home.ok(["exec", "link", "sh", "-c", probe]), "link\n");
    assert_eq!(
        home.run(["exec", "link", "test", "-e", "/run/ssh-agent.sock"])
            .status
            .code(),
        Some(1)
    );
    home.ok(["sim", "fault", "clear"]);
    // Forwarding turned on and the daemon restarted: new sandboxes get the socket; turned off
    // without a restart, the daemon still forwards.
    home.ok(["settings", "set", "ssh.agentForwardingEnabled", "true"]);
    home.ok(["daemon", "restart"]);
    home.ok(["settings", "set", "ssh.agentForwardingEnabled", "false"]);
    home.create("daemon", &ws, &[]);
    assert_eq!(home.ok(["exec", "daemon", "sh", "-c", probe]), "666\n");
    home.ok(["daemon", "restart"]);
    home.create("restarted", &ws, &[]);
    assert_eq!(home.ok(["exec", "restarted", "sh", "-c", probe]), "none\n");
    home.finish();
}

#[test]
fn hung_exec_blocks_only_matching_commands_without_running_them() {
    let home = Home::new();
    let ws = home.workspace("h", None);
    home.create("hung", &ws, &[]);
    home.ok(["sim", "fault", "set", "hung-exec=wedge-me"]);
    let child = home
        .command(["exec", "hung", "sh", "-c", "touch ran; echo wedge-me"])
        .current_dir(&ws)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(still_running_after(child, Duration::from_secs(3)));
    assert!(!ws.join("ran").exists(), "a hung exec ran its command");
    assert_eq!(home.ok(["exec", "hung", "echo", "fine"]), "fine\n");
    home.ok(["sim", "fault", "set", "hung-exec"]);
    let child = home
        .command(["exec", "hung", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(still_running_after(child, Duration::from_secs(2)));
    home.finish();
}

#[test]
fn hung_create_blocks_and_creates_nothing() {
    let home = Home::new();
    let ws = home.workspace("hc", None);
    home.ok(["sim", "fault", "set", "hung-create"]);
    let child = home
        .command(["create", "shell", "--name", "never", ws.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(still_running_after(child, Duration::from_secs(3)));
    std::thread::sleep(Duration::from_secs(1));
    assert!(home.engine_containers().is_empty());
    home.ok(["sim", "fault", "clear"]);
    home.finish();
}

#[test]
fn a_create_whose_client_is_killed_still_appears() {
    let home = Home::new();
    let ws = home.workspace("k", None);
    home.ok(["sim", "fault", "set", "slow-create=3"]);
    let mut child = home
        .command(["create", "shell", "--name", "orphan", ws.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert!(child.try_wait().unwrap().is_none(), "create ended early");
    // Kill the client's whole process group, as a bounded runner does on its deadline.
    let pgid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).unwrap();
    child.wait().unwrap();
    assert!(
        home.row("orphan").is_none(),
        "created before the delay ended"
    );
    wait_until(Duration::from_secs(60), "the orphaned create", || {
        home.row("orphan")
            .is_some_and(|row| row["status"] == "running")
            && home.path().join("sandboxes/orphan.json").exists()
    });
    assert_eq!(
        home.ok(["exec", "orphan", "sh", "-c", "pwd -P"]),
        format!("{}\n", ws.display())
    );
    // Nobody reads the orphaned worker's result: it does not pile up in the state directory.
    let leftovers: Vec<String> = std::fs::read_dir(home.path().join("workers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".request") || n.ends_with(".result"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    home.finish();
}

#[test]
fn concurrent_creates_of_one_name_have_one_winner() {
    let home = Home::new();
    let ws = home.workspace("r", None);
    // Both clients pass the name pre-check before either reaches the engine.
    home.ok(["sim", "fault", "set", "slow-create=1"]);
    let spawn = || {
        home.command(["create", "shell", "--name", "race", ws.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let winners: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
    let losers: Vec<&Output> = outs.iter().filter(|o| !o.status.success()).collect();
    assert_eq!(winners.len(), 1, "{outs:?}");
    assert_eq!(winners[0].stdout, b"Created sandbox race\n");
    assert_error(losers[0], "sandbox race already exists", "the loser");
    assert_eq!(home.engine_containers().len(), 1);
    home.ok(["sim", "fault", "clear"]);
    assert_eq!(home.ok(["exec", "race", "echo", "ok"]), "ok\n");
    home.finish();
}

#[test]
fn an_idle_sandbox_stops_and_the_next_exec_starts_it_with_its_workspace() {
    let home = Home::new();
    home.ok(["settings", "set", "sim.idleStopSeconds", "1"]);
    let ws = home.workspace("i", None);
    home.create("idle", &ws, &[]);
    std::fs::write(ws.join("note"), b"from the host").unwrap();
    // A long exec holds a lease: the sandbox is not stopped under it.
    assert_eq!(
        home.ok(["exec", "idle", "sh", "-c", "sleep 3; echo alive"]),
        "alive\n"
    );
    wait_until(Duration::from_secs(30), "the idle stop", || {
        home.row("idle")
            .is_some_and(|row| row["status"] == "stopped")
    });
    assert_eq!(
        docker_inspect(&home.container_name("idle"))["State"]["Running"],
        false
    );
    assert_eq!(home.ok(["exec", "idle", "cat", "note"]), "from the host");
    // 0 disables idle stop.
    home.ok(["settings", "set", "sim.idleStopSeconds", "0"]);
    home.ok(["exec", "idle", "true"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(home.row("idle").unwrap()["status"], "running");
    home.finish();
}

#[test]
fn exec_relays_64_mib_byte_exact() {
    let home = Home::new();
    let ws = home.workspace("b", None);
    home.create("bytes", &ws, &[]);
    home.ok([
        "exec",
        "bytes",
        "sh",
        "-c",
        "head -c 67108864 /dev/urandom > blob",
    ]);
    let expected = std::fs::read(ws.join("blob")).unwrap();
    assert_eq!(expected.len(), 64 * 1024 * 1024);
    let out = home.run(["exec", "bytes", "cat", "blob"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty());
    assert_eq!(out.stdout.len(), expected.len());
    assert!(out.stdout == expected, "the relayed bytes differ");
    home.finish();
}

#[test]
fn two_state_homes_never_see_each_other_and_reset_removes_only_its_own() {
    let a = Home::new();
    let b = Home::new();
    assert_ne!(a.digest(), b.digest());
    let ws_a = a.workspace("a", None);
    let ws_b = b.workspace("b", None);
    a.create("same", &ws_a, &[]);
    a.create("only-a", &ws_a, &[]);
    b.create("same", &ws_b, &[]);
    let names = |home: &Home| -> Vec<String> {
        home.ls()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&a), ["only-a", "same"]);
    assert_eq!(names(&b), ["same"]);
    assert_eq!(
        a.ok(["exec", "same", "pwd"]),
        format!("{}\n", ws_a.display())
    );
    assert_eq!(
        b.ok(["exec", "same", "pwd"]),
        format!("{}\n", ws_b.display())
    );
    b.fails(["exec", "only-a", "true"], "sandbox only-a not found");
    b.fails(["rm", "-f", "only-a"], "sandbox only-a not found");
    assert_eq!(b.ok(["sim", "reset"]), "Removed 1 sandbox(es)\n");
    assert!(b.engine_containers().is_empty());
    assert_eq!(a.engine_containers().len(), 2);
    assert_eq!(names(&a), ["only-a", "same"]);
    assert!(!b.path().join("sandboxes/same.json").exists());
    assert!(a.path().join("sandboxes/same.json").exists());
    b.finish();
    a.finish();
}

#[test]
fn sim_doctor_checks_docker_the_image_and_user_namespaces() {
    let home = Home::new();
    let out = home.ok(["sim", "doctor"]);
    for what in ["docker", "template image", "user namespaces"] {
        assert!(out.contains(&format!("ok   {what}:")), "{out}");
    }
    let mut broken = Home::new();
    broken
        .extra_env
        .push(("SBX_SIM_DOCKER".into(), "/nonexistent/docker".into()));
    let out = broken.run(["sim", "doctor"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL docker"));
    broken.extra_env.clear();
    broken.finish();
    home.finish();
}
