//! End-to-end tests of what `sandboxctl` refuses on the host's behalf, against the real Docker engine:
//! pseudo-file-system and credential sources, credential destinations, unbounded reads, forged listing
//! lines and malformed keys. Each test that makes a sandbox uses its own scope and purges it.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxctl");

fn scope(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("hardening-{test}-{}-{nanos}", std::process::id())
}

/// Runs sandboxctl (docker accepted) with extra environment, killed if it outlives `bound`.
fn ctl_env(args: &[&str], env: &[(&str, &str)], bound: Duration) -> Output {
    bounded(Command::new(BIN), args, env, bound)
}

/// [`ctl_env`] in the working directory `cwd`.
fn ctl_in(cwd: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.current_dir(cwd);
    bounded(command, args, env, Duration::from_secs(60))
}

fn bounded(mut command: Command, args: &[&str], env: &[(&str, &str)], bound: Duration) -> Output {
    let mut child = command
        .args(["--min-isolation", "container"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sandboxctl starts");
    let deadline = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after {bound:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ctl(args: &[&str]) -> Output {
    ctl_env(args, &[], Duration::from_secs(120))
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or_else(|| {
        panic!(
            "sandboxctl was killed by a signal: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}): {:?} / stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// A kept sandbox for one test, purged when the test ends (pass or fail).
struct KeptSandbox {
    scope: String,
    key: String,
}

impl KeptSandbox {
    fn new(test: &str, setup: &str) -> Self {
        let scope = scope(test);
        let key = format!("{scope}/t1/agent");
        let out = ctl(&["run", "--key", &key, "--", "sh", "-c", setup]);
        assert_eq!(code(&out), 0, "setup: {}", stderr(&out));
        KeptSandbox { scope, key }
    }
}

impl Drop for KeptSandbox {
    fn drop(&mut self) {
        let _ = ctl(&["purge", "--scope", &self.scope, "--thread", "t1"]);
    }
}

#[test]
fn cp_in_refuses_pseudo_file_system_sources() {
    let secret = format!("audit-{}", std::process::id());
    let mut sources = vec!["/proc/self/environ".to_owned(), "/proc/version".to_owned()];
    // A regular file of sysfs, whichever this host has.
    if let Some(sysfs) = [
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/devices/system/cpu/online",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())
    {
        sources.push(sysfs.to_owned());
    }
    for source in &sources {
        let out = ctl_env(
            &["cp-in", "--key", "a/b/c", source, "x"],
            &[("AUDIT_API_TOKEN", &secret)],
            Duration::from_secs(30),
        );
        assert_eq!(code(&out), 69, "{source}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(text.contains("file system"), "{source}: {text}");
        assert!(!text.contains(&secret));
        // Even the override for credential paths does not lift it.
        let out = ctl(&[
            "cp-in",
            "--key",
            "a/b/c",
            "--allow-credential-path",
            source,
            "x",
        ]);
        assert_eq!(code(&out), 69, "{source}: {}", stderr(&out));
    }
}

#[test]
fn cp_in_reads_at_most_the_cap_of_a_huge_source() {
    let sandbox = KeptSandbox::new("cap", "true");
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("sparse");
    // A 1 GiB hole: no disk, but a whole read would take 1 GiB of memory.
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let mut child = Command::new(BIN)
        .args([
            "--min-isolation",
            "container",
            "cp-in",
            "--key",
            &sandbox.key,
        ])
        .arg(&huge)
        .arg("big")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "cp-in never finished");
        if let Ok(text) = std::fs::read_to_string(&status) {
            if let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 68, "{}", stderr(&out));
    assert!(
        peak_kib < 160 * 1024,
        "sandboxctl's resident memory peaked at {peak_kib} KiB for a refused 1 GiB source"
    );
    assert_eq!(code(&ctl(&["stat", "--key", &sandbox.key, "big"])), 66);
}

#[test]
fn env_files_are_small_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.env");
    std::fs::write(&big, format!("A={}\n", "x".repeat(2 << 20))).unwrap();
    // The address-space limit stops an unbounded read quickly, instead of letting it take the host's memory.
    for file in ["/dev/zero", big.to_str().unwrap()] {
        let out = Command::new("sh")
            .args(["-c", "ulimit -v 1048576; exec \"$@\"", "sh", BIN])
            .args([
                "--min-isolation",
                "container",
                "--json",
                "exec",
                "--key",
                "a/b/c",
            ])
            .args(["--env-file", file, "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(code(&out), 125, "{file}: {}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["error"]["kind"], "InvalidArgument", "{file}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--env-file"),
            "{v}"
        );
    }
}

/// Credential destinations are refused by their hidden names, with or without the credential
/// override: `--allow-credential-path` no longer lets cp-out write `~/.ssh/authorized_keys`.
#[test]
fn cp_out_refuses_credential_destinations() {
    let sandbox = KeptSandbox::new("cpout", "printf 'ssh-ed25519 AAAA guest-key' > k");
    let fake = FakeHome::new();
    let home = &fake.home;
    let ssh = home.join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::os::unix::fs::symlink(&ssh, home.join("innocent")).unwrap();
    for (dest, exit) in [
        (ssh.join("authorized_keys"), 69),
        (home.join(".gitconfig"), 69),
        (home.join(".config/gh/hosts.yml"), 69),
        // A plain name that links to ~/.ssh is not followed.
        (home.join("innocent/authorized_keys"), 65),
    ] {
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        for extra in [&[][..], &["--allow-credential-path"][..]] {
            let out = fake.cp_out(&sandbox.key, "k", &dest, extra);
            assert_eq!(code(&out), exit, "{}: {}", dest.display(), stderr(&out));
            assert!(!dest.exists(), "{} was written", dest.display());
        }
    }
    FakeHome::assert_only(&ssh, &[]);
    // An ordinary destination is written.
    let out = fake.cp_out(&sandbox.key, "k", &home.join("out.txt"), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read(home.join("out.txt")).unwrap(),
        b"ssh-ed25519 AAAA guest-key"
    );
}

#[test]
fn root_callers_guard_system_credentials() {
    let is_root = rustix::process::geteuid().is_root();
    let sources: Vec<&str> = ["/etc/shadow", "/etc/gshadow"]
        .into_iter()
        .filter(|s| std::path::Path::new(s).exists())
        .collect();
    assert!(
        !sources.is_empty(),
        "this host has no /etc/shadow to test with"
    );
    for source in sources {
        let out = ctl(&["cp-in", "--key", "a/b/c", source, "x"]);
        let text = stderr(&out);
        if is_root {
            assert_eq!(code(&out), 69, "{source}: {text}");
            assert!(
                text.contains(source) && text.contains("credential path"),
                "{text}"
            );
        } else {
            // Another user cannot open it at all: the guard is root's, the refusal the kernel's.
            assert_eq!(code(&out), 70, "{source}: {text}");
            assert!(!text.contains("credential path"), "{text}");
        }
    }
}

#[test]
fn guest_names_cannot_forge_listing_lines() {
    let forged = "a\nfile\t999999\tFORGED-ENTRY\n\u{1b}[31mRED";
    let sandbox = KeptSandbox::new(
        "ls",
        "mkdir d && printf x > \"d/$(printf 'a\\nfile\\t999999\\tFORGED-ENTRY\\n\\033[31mRED')\" && printf y > 'd/two words'",
    );
    let out = ctl(&["ls", "--key", &sandbox.key, "d"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(text.lines().count(), 2, "one line per entry: {text:?}");
    assert!(
        !text.contains('\u{1b}'),
        "no raw escape reaches the terminal: {text:?}"
    );
    assert!(!text.contains("\tFORGED"), "{text:?}");
    assert!(
        text.contains(r"a\nfile\t999999\tFORGED-ENTRY\n\033[31mRED"),
        "{text:?}"
    );
    assert!(text.contains(r"two\ words"), "{text:?}");
    // JSON carries the exact names.
    let v = json(&ctl(&["--json", "ls", "--key", &sandbox.key, "d"]));
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(forged)), "{names:?}");
    // `stat` prints its one line the same way.
    let out = ctl(&["stat", "--key", &sandbox.key, &format!("d/{forged}")]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
}

#[test]
fn list_escapes_decoded_keys() {
    use sandbox_core::{DisposeSelector, SandboxBackend, SandboxKey, SandboxSpec};
    let scope = scope("listkeys");
    let thread = "t\u{1b}[31m\tFORGED";
    let key = SandboxKey::conversation(scope.clone(), thread, "a\nb");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let backend = runtime
        .block_on(backend_docker::DockerBackend::connect(
            backend_docker::DockerConfig::default(),
        ))
        .unwrap();
    let spec = SandboxSpec::builder("default")
        .image("sandbox-base:local")
        .build()
        .unwrap();
    runtime.block_on(backend.acquire(&key, &spec)).unwrap();
    let out = ctl(&["list", "--scope", &scope]);
    let json_out = ctl(&["--json", "list", "--scope", &scope]);
    let disposed = runtime.block_on(backend.dispose(&key, DisposeSelector::all()));
    assert!(disposed.is_none(), "{disposed:?}");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains(r"t\033[31m\tFORGED/a\nb"), "{text:?}");
    let v = json(&json_out);
    assert_eq!(v["sandboxes"][0]["key"]["thread"], thread, "{v}");
    assert_eq!(v["sandboxes"][0]["key"]["agent"], "a\nb", "{v}");
}

#[test]
fn the_cli_refuses_empty_and_control_key_fields() {
    let cases: &[&[&str]] = &[
        &["stat", "--key", "scope//", "x"],
        &["stat", "--key", "/t/a", "x"],
        &["stat", "--key", "s/t\u{1b}[31m/a", "x"],
        &["stat", "--key", "s/t/a\n", "x"],
        &["stat", "--scope", "", "--thread", "t", "--agent", "a", "x"],
        &["stat", "--scope", "s", "--thread", "t", "--agent", "", "x"],
        &["stat", "--key", "s/t/a", "--call", "c\t1", "x"],
        &["list", "--scope", ""],
        &["list", "--scope", "s", "--thread", ""],
        &["purge", "--scope", "s\u{7}", "--thread", "t"],
        &["purge", "--scope", "s", "--thread", ""],
        &["dispose", "--key", "s//a"],
    ];
    for args in cases {
        let out = ctl(args);
        assert_eq!(code(&out), 64, "{args:?}: {}", stderr(&out));
    }
    // Under run and exec the same refusal exits 125 with one line.
    let out = ctl(&["run", "--key", "scope//", "--", "true"]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    let out = ctl(&["--json", "exec", "--key", "s/\u{1b}/a", "--", "true"]);
    assert_eq!(code(&out), 125);
    assert_eq!(json(&out)["error"]["kind"], "InvalidArgument");
}

#[test]
fn help_documents_the_credential_refusals() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--allow-credential-path",
        "~/.ssh",
        "/etc/shadow",
        "cp-out",
        "file system",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    for command in ["cp-in", "cp-out"] {
        let out = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("--allow-credential-path"),
            "{command}:\n{help}"
        );
        assert!(help.contains("credential"), "{command}:\n{help}");
    }
}

/// The most `docker` children `sandboxctl` (pid `parent`) had at once while it ran, and its output.
fn run_counting_docker_children(args: &[&str]) -> (Output, usize) {
    let mut child = Command::new(BIN)
        .args(["--min-isolation", "container"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let parent = child.id().to_string();
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{args:?} never finished");
        let children = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                status.lines().any(|l| l == format!("PPid:\t{parent}"))
                    && status
                        .lines()
                        .any(|l| l.starts_with("Name:") && l.contains("docker"))
            })
            .count();
        peak = peak.max(children);
        std::thread::sleep(Duration::from_millis(2));
    }
    (child.wait_with_output().unwrap(), peak)
}

#[test]
fn deep_guest_paths_are_refused_before_any_engine_call() {
    let sandbox = KeptSandbox::new("deep", "mkdir -p d");
    let deep = format!("{}x", "d/".repeat(400));
    let long = format!("d/{}", "a".repeat(5000));
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("f");
    std::fs::write(&local, b"x").unwrap();
    let local = local.to_str().unwrap();
    for path in [deep.as_str(), long.as_str()] {
        for args in [
            vec!["stat", "--key", &sandbox.key, path],
            vec!["ls", "--key", &sandbox.key, path],
            vec!["rm", "--key", &sandbox.key, path],
            vec!["cp-in", "--key", &sandbox.key, local, path],
        ] {
            let (out, peak) = run_counting_docker_children(&args);
            assert_eq!(code(&out), 64, "{}: {}", args[0], stderr(&out));
            // Finding the sandbox takes an engine call or two; one per component would be hundreds.
            assert!(peak <= 2, "{}: {peak} docker children at once", args[0]);
        }
    }
}

#[test]
fn library_guest_paths_with_a_nul_are_invalid_before_any_engine_call() {
    use sandbox_core::{DisposeSelector, ErrorKind, SandboxBackend, SandboxKey, SandboxSpec};
    let key = SandboxKey::conversation(scope("nul"), "t1", "agent");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let backend = runtime
        .block_on(backend_docker::DockerBackend::connect(
            backend_docker::DockerConfig::default(),
        ))
        .unwrap();
    let spec = SandboxSpec::builder("default")
        .image("sandbox-base:local")
        .build()
        .unwrap();
    let sandbox = runtime.block_on(backend.acquire(&key, &spec)).unwrap();
    let kinds = runtime.block_on(async {
        let mut kinds = Vec::new();
        for path in ["a\0b", "\0"] {
            kinds.push(
                sandbox
                    .write_file(path, b"x", ".")
                    .await
                    .map_err(|e| e.kind()),
            );
            kinds.push(
                sandbox
                    .read_file(path, ".", 10)
                    .await
                    .map(drop)
                    .map_err(|e| e.kind()),
            );
            kinds.push(
                sandbox
                    .stat_file(path, ".")
                    .await
                    .map(drop)
                    .map_err(|e| e.kind()),
            );
            kinds.push(
                sandbox
                    .list_dir(path, ".")
                    .await
                    .map(drop)
                    .map_err(|e| e.kind()),
            );
            kinds.push(sandbox.remove(path, ".", true).await.map_err(|e| e.kind()));
        }
        kinds.push(
            sandbox
                .stat_file("x", "/w\0")
                .await
                .map(drop)
                .map_err(|e| e.kind()),
        );
        kinds
    });
    let disposed = runtime.block_on(backend.dispose(&key, DisposeSelector::all()));
    assert!(disposed.is_none(), "{disposed:?}");
    for kind in kinds {
        assert_eq!(kind, Err(ErrorKind::InvalidArgument));
    }
}

/// A fake home for one test, with its `HOME` for sandboxctl's environment.
struct FakeHome {
    _dir: tempfile::TempDir,
    home: std::path::PathBuf,
}

impl FakeHome {
    fn new() -> Self {
        // A plain name: tempfile's default prefix is hidden, and cp-out writes no hidden path.
        let dir = tempfile::Builder::new()
            .prefix("hardening-")
            .tempdir()
            .unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        FakeHome { _dir: dir, home }
    }

    fn env(&self) -> [(&str, &str); 1] {
        [("HOME", self.home.to_str().unwrap())]
    }

    /// cp-out run in the home directory, so the home is the output root unless `extra` names one.
    fn cp_out(&self, key: &str, guest: &str, dest: &std::path::Path, extra: &[&str]) -> Output {
        let mut args = vec!["cp-out", "--key", key];
        args.extend_from_slice(extra);
        args.extend([guest, dest.to_str().unwrap()]);
        ctl_in(&self.home, &args, &self.env())
    }

    /// Nothing but `keep` in `dir`: no destination, no temp file of a refused copy.
    fn assert_only(dir: &std::path::Path, keep: &[&str]) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = keep.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        assert_eq!(names, want, "in {}", dir.display());
    }
}

/// cp-out never writes where a host executes or loads files on its own, by any alias (a link,
/// `..`, another case), and no credential override lifts it: shell start-up files, units,
/// autostart entries and repository hooks by their hidden names, `~/bin` by the list behind them,
/// and a link to the units directory is never followed.
#[test]
fn cp_out_refuses_destinations_a_host_executes() {
    let sandbox = KeptSandbox::new("exec-dest", "printf 'touch /tmp/pwned' > payload");
    let fake = FakeHome::new();
    let home = &fake.home;
    let units = home.join(".config/systemd/user");
    for dir in [
        units.clone(),
        home.join(".config/autostart"),
        home.join("repo/.git/hooks"),
        home.join("bin"),
        home.join("x"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::os::unix::fs::symlink(&units, home.join("innocent")).unwrap();
    for (dest, exit, reason) in [
        (home.join(".bashrc"), 69, "hidden"),
        (home.join(".profile"), 69, "hidden"),
        (home.join(".bash_profile"), 69, "hidden"),
        (home.join(".bash_login"), 69, "hidden"),
        (home.join(".zshrc"), 69, "hidden"),
        (home.join(".BASHRC"), 69, "hidden"),
        (home.join("x/../.zprofile"), 69, "hidden"),
        (units.join("x.service"), 69, "hidden"),
        (home.join(".config/autostart/x.desktop"), 69, "hidden"),
        (home.join("repo/.git/hooks/pre-commit"), 69, "hidden"),
        (home.join("bin/ls"), 69, "executes or loads"),
        (home.join("BIN/ls"), 69, "executes or loads"),
        (home.join("innocent/y.service"), 65, "link"),
    ] {
        for extra in [&[][..], &["--allow-credential-path"][..]] {
            let out = fake.cp_out(&sandbox.key, "payload", &dest, extra);
            assert_eq!(code(&out), exit, "{}: {}", dest.display(), stderr(&out));
            assert!(stderr(&out).contains(reason), "{}", stderr(&out));
        }
    }
    FakeHome::assert_only(home, &[".config", "bin", "innocent", "repo", "x"]);
    FakeHome::assert_only(&units, &[]);
    FakeHome::assert_only(&home.join("bin"), &[]);
    FakeHome::assert_only(&home.join("repo/.git/hooks"), &[]);
    // An ordinary destination is still written.
    let out = fake.cp_out(&sandbox.key, "payload", &home.join("x/payload.txt"), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

/// cp-out writes only plain new files below its output root (`--out-dir`, else the current
/// directory): a hidden name anywhere below it (start-up files of tmux, gdb, IPython that no list
/// names) is refused with nothing created, a link is never followed, and an existing file is kept
/// unless `--overwrite` says otherwise.
#[test]
fn cp_out_writes_only_plain_new_files_below_its_output_root() {
    let sandbox = KeptSandbox::new("allowlist", "printf 'run-shell \"touch pwned\"' > payload");
    let fake = FakeHome::new();
    let home = &fake.home;
    let src = home.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::os::unix::fs::symlink(src.join("sub"), src.join("link")).unwrap();
    let pin = ["--out-dir", home.to_str().unwrap()];
    for relative in [
        ".tmux.conf",
        ".gdbinit",
        ".config/tmux/tmux.conf",
        ".ipython/profile_default/startup/00.py",
        "src/.envrc",
    ] {
        let dest = home.join(relative);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let out = fake.cp_out(&sandbox.key, "payload", &dest, &pin);
        assert_eq!(code(&out), 69, "{relative}: {}", stderr(&out));
        assert!(stderr(&out).contains("hidden"), "{}", stderr(&out));
        assert!(!dest.exists(), "{relative} was written");
    }
    // Through a link, even one to a directory inside the root: a confinement refusal.
    let out = fake.cp_out(&sandbox.key, "payload", &src.join("link/x"), &pin);
    assert_eq!(code(&out), 65, "{}", stderr(&out));
    FakeHome::assert_only(&src.join("sub"), &[]);
    // A plain new file is written; an existing one is kept unless --overwrite.
    let report = src.join("report.txt");
    let out = fake.cp_out(&sandbox.key, "payload", &report, &pin);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&report).unwrap(),
        b"run-shell \"touch pwned\""
    );
    std::fs::write(&report, b"mine").unwrap();
    let out = fake.cp_out(&sandbox.key, "payload", &report, &pin);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(stderr(&out).contains("--overwrite"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&report).unwrap(), b"mine");
    let out = fake.cp_out(
        &sandbox.key,
        "payload",
        &report,
        &[&pin[..], &["--overwrite"]].concat(),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&report).unwrap(),
        b"run-shell \"touch pwned\""
    );
    // Without --out-dir the root is the current directory: nothing above or beside it is written.
    let key = sandbox.key.as_str();
    let out = ctl_in(
        &src,
        &["cp-out", "--key", key, "payload", "here.txt"],
        &fake.env(),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(src.join("here.txt").is_file());
    for dest in ["../above.txt", home.join("beside.txt").to_str().unwrap()] {
        let out = ctl_in(
            &src,
            &["cp-out", "--key", key, "payload", dest],
            &fake.env(),
        );
        assert_eq!(code(&out), 69, "{dest}: {}", stderr(&out));
        assert!(stderr(&out).contains("output root"), "{}", stderr(&out));
    }
    FakeHome::assert_only(home, &[".config", ".ipython", "src"]);
    FakeHome::assert_only(&src, &["here.txt", "link", "report.txt", "sub"]);
}

/// `--out-dir` pins cp-out: inside it (also the root named through a link) is written; outside
/// it, by `..`, nothing is, and a link below it is never followed.
#[test]
fn cp_out_writes_nothing_outside_its_out_dir() {
    let sandbox = KeptSandbox::new("out-dir", "printf data > f");
    let fake = FakeHome::new();
    let out_dir = fake.home.join("out");
    let elsewhere = fake.home.join("elsewhere");
    std::fs::create_dir_all(out_dir.join("sub")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out_dir.join("escape")).unwrap();
    std::os::unix::fs::symlink(&out_dir, fake.home.join("out-link")).unwrap();
    let pin = ["--out-dir", out_dir.to_str().unwrap()];
    for dest in [elsewhere.join("a"), out_dir.join("sub/../../elsewhere/b")] {
        let out = fake.cp_out(&sandbox.key, "f", &dest, &pin);
        assert_eq!(code(&out), 69, "{}: {}", dest.display(), stderr(&out));
        assert!(stderr(&out).contains("output root"), "{}", stderr(&out));
    }
    let out = fake.cp_out(&sandbox.key, "f", &out_dir.join("escape/c"), &pin);
    assert_eq!(code(&out), 65, "{}", stderr(&out));
    FakeHome::assert_only(&elsewhere, &[]);
    for dest in [out_dir.join("sub/d"), fake.home.join("out-link/e")] {
        let out = fake.cp_out(&sandbox.key, "f", &dest, &pin);
        assert_eq!(code(&out), 0, "{}: {}", dest.display(), stderr(&out));
        assert_eq!(std::fs::read(&dest).unwrap(), b"data");
    }
    // A root that does not exist is a bad argument, not a licence to write anywhere.
    let missing = fake.home.join("missing");
    let out = fake.cp_out(
        &sandbox.key,
        "f",
        &elsewhere.join("f"),
        &["--out-dir", missing.to_str().unwrap()],
    );
    assert_eq!(code(&out), 64, "{}", stderr(&out));
    FakeHome::assert_only(&elsewhere, &[]);
}

/// Another sandbox's sbx workspace and record, at the root the sbx backend derives from this
/// environment, are out of reach through the host whichever backend runs the command: cp-in does
/// not read them, cp-out does not plant files in them or replace the record, and an env file is
/// not taken from them.
#[test]
fn one_key_cannot_reach_another_sandboxs_sbx_workspace() {
    let sandbox = KeptSandbox::new("sbx-state", "printf planted > f");
    let fake = FakeHome::new();
    let record_dir = fake
        .home
        .join(".local/state/maf-sandbox-docker-sbx/workspaces/sbx-other-0123456789ab");
    let workspace = record_dir.join("ws-0123456789ab");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("secret.txt"), b"another key's file").unwrap();
    std::fs::write(workspace.join("vars.env"), b"A=1\n").unwrap();
    let record = br#"{"instance_id":"x","workspace":"ws-0123456789ab"}"#;
    std::fs::write(record_dir.join("meta.json"), record).unwrap();
    std::os::unix::fs::symlink(&workspace, fake.home.join("alias")).unwrap();
    let env = fake.env();
    let bound = Duration::from_secs(60);
    for source in [
        workspace.join("secret.txt"),
        fake.home.join("alias/secret.txt"),
    ] {
        let out = ctl_env(
            &[
                "cp-in",
                "--key",
                &sandbox.key,
                "--allow-credential-path",
                source.to_str().unwrap(),
                "stolen",
            ],
            &env,
            bound,
        );
        assert_eq!(code(&out), 69, "{}: {}", source.display(), stderr(&out));
        assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    }
    let out = ctl(&["exec", "--key", &sandbox.key, "--", "test", "-e", "stolen"]);
    assert_eq!(code(&out), 1, "nothing was copied in: {}", stderr(&out));
    for (dest, exit) in [
        (workspace.join("planted"), 69),
        (record_dir.join("meta.json"), 69),
        (fake.home.join("alias/planted2"), 65),
    ] {
        let out = fake.cp_out(&sandbox.key, "f", &dest, &["--allow-credential-path"]);
        assert_eq!(code(&out), exit, "{}: {}", dest.display(), stderr(&out));
    }
    FakeHome::assert_only(&workspace, &["secret.txt", "vars.env"]);
    assert_eq!(std::fs::read(record_dir.join("meta.json")).unwrap(), record);
    let out = ctl_env(
        &[
            "exec",
            "--key",
            &sandbox.key,
            "--env-file",
            workspace.join("vars.env").to_str().unwrap(),
            "--",
            "true",
        ],
        &env,
        bound,
    );
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
}

/// The MCP server's default state directory (here under the `XDG_RUNTIME_DIR` the command is
/// given) is guarded like a backend's own state: cp-out neither replaces a running server's lock
/// nor plants a file beside it, even with the directory as its output root.
#[test]
fn cp_out_never_writes_into_the_mcp_servers_state_directory() {
    use std::os::unix::fs::PermissionsExt as _;
    let sandbox = KeptSandbox::new("mcp-state", "printf planted > f");
    let fake = FakeHome::new();
    let runtime = fake.home.join("runtime");
    let state = runtime.join("sandbox-mcp");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let name = "4242.17.0.4026531836.0123456789abcdef0123456789abcdef.00000000000000aa.lock";
    let lock = state.join(name);
    std::fs::write(&lock, b"held\n").unwrap();
    let env = [
        ("HOME", fake.home.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.to_str().unwrap()),
    ];
    let root = state.to_str().unwrap();
    for (dest, extra) in [
        (&lock, vec!["--out-dir", root, "--overwrite"]),
        (&state.join("planted"), vec!["--out-dir", root]),
        (&state.join("planted"), vec![]),
    ] {
        let mut args = vec!["cp-out", "--key", sandbox.key.as_str()];
        args.extend(extra);
        args.extend(["f", dest.to_str().unwrap()]);
        let out = ctl_in(&fake.home, &args, &env);
        assert_eq!(code(&out), 69, "{}: {}", dest.display(), stderr(&out));
        assert!(stderr(&out).contains("sandbox-mcp"), "{}", stderr(&out));
    }
    FakeHome::assert_only(&state, &[name]);
    assert_eq!(std::fs::read(&lock).unwrap(), b"held\n");
}

/// `--env-file` goes through the same guarded opener as cp-in: a credential file and the host
/// kernel's command line are refused, and a file that is not an env file (a process environment)
/// is refused by line with no variable's name or value in the message.
#[test]
fn env_files_are_refused_where_cp_in_is() {
    let fake = FakeHome::new();
    let aws = fake.home.join(".aws");
    std::fs::create_dir_all(&aws).unwrap();
    let credentials = aws.join("credentials");
    std::fs::write(&credentials, b"AWS_ACCESS_KEY_ID=AKIAEXAMPLELEAK\n").unwrap();
    let environ = fake.home.join("environ");
    std::fs::write(&environ, b"LEAKY_VARIABLE_NAME=leaky-value\0HOME=/root\0").unwrap();
    let run = |file: &std::path::Path| {
        ctl_env(
            &[
                "--json",
                "run",
                "--env-file",
                file.to_str().unwrap(),
                "--",
                "env",
            ],
            &fake.env(),
            Duration::from_secs(120),
        )
    };
    for (file, kind) in [
        (credentials.as_path(), "NotPermitted"),
        (std::path::Path::new("/proc/cmdline"), "NotPermitted"),
        (environ.as_path(), "InvalidArgument"),
    ] {
        let out = run(file);
        let v = json(&out);
        let all = format!("{v} {}", stderr(&out));
        assert_eq!(v["outcome"], "error", "{}: {all}", file.display());
        assert_eq!(v["error"]["kind"], kind, "{}: {all}", file.display());
        for leak in [
            "AKIAEXAMPLELEAK",
            "LEAKY_VARIABLE_NAME",
            "leaky-value",
            "BOOT_IMAGE",
        ] {
            assert!(!all.contains(leak), "{}: {all}", file.display());
        }
    }
}

/// cp-out of a file the guest keeps growing during the read: the copy is bounded by `--max-bytes`
/// (refused over it, 68) and never leaves a partial local file or a temporary one.
#[test]
fn cp_out_of_a_growing_file_is_bounded_and_never_partial() {
    let sandbox = KeptSandbox::new("grow", "printf '' > grow");
    let writer = {
        let key = sandbox.key.clone();
        std::thread::spawn(move || {
            ctl(&[
                "exec",
                "--key",
                &key,
                "--timeout",
                "20",
                "--",
                "sh",
                "-c",
                "while :; do printf 0123456789abcdef; done >> grow",
            ])
        })
    };
    let fake = FakeHome::new();
    let dest = fake.home.join("copy");
    let cap: u64 = 256 * 1024;
    let (mut over, mut copied) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        let out = fake.cp_out(
            &sandbox.key,
            "grow",
            &dest,
            &["--max-bytes", &cap.to_string()],
        );
        match code(&out) {
            0 => {
                copied += 1;
                let content = std::fs::read(&dest).unwrap();
                assert!(content.len() as u64 <= cap, "{} bytes", content.len());
                // Whole chunks of the pattern, in order, from the start: what the guest wrote.
                let pattern = b"0123456789abcdef";
                assert!(
                    content
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == pattern[i % pattern.len()]),
                    "the copy is the guest's bytes in order"
                );
                std::fs::remove_file(&dest).unwrap();
            }
            68 => over += 1,
            other => panic!("cp-out exited {other}: {}", stderr(&out)),
        }
        FakeHome::assert_only(&fake.home, &[]);
        if over >= 3 {
            break;
        }
    }
    assert!(
        over >= 3,
        "the file outgrew the cap ({over} refusals, {copied} copies)"
    );
    let out = writer.join().unwrap();
    assert_eq!(
        code(&out),
        124,
        "the writer ran until its timeout: {}",
        stderr(&out)
    );
}

/// Names no guest path can address (not UTF-8, or holding a backslash) are shown escaped in `ls`
/// and `ls --json`, never left out, and the escapes cannot be confused with a real name.
#[test]
fn ls_shows_unaddressable_names_escaped() {
    let sandbox = KeptSandbox::new(
        "ls-escaped",
        "mkdir d && printf 1 > \"d/$(printf 'caf\\351')\" && printf 2 > 'd/a\\b' \
         && printf 3 > 'd/caf\\xe9' && printf 4 > d/plain",
    );
    let out = ctl(&["ls", "--key", &sandbox.key, "d"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    let mut shown: Vec<&str> = text
        .lines()
        .map(|line| line.rsplit('\t').next().unwrap())
        .collect();
    shown.sort();
    // The byte 0xe9 as \xe9; a literal backslash as \\ (so the literal name `caf\xe9` is
    // `caf\\xe9`, distinct from the byte's escape).
    assert_eq!(
        shown,
        [r"d/a\\b", r"d/caf\\xe9", r"d/caf\xe9", "d/plain"],
        "{text:?}"
    );
    let v = json(&ctl(&["--json", "ls", "--key", &sandbox.key, "d"]));
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 4, "{v}");
    let escaped: Vec<(&str, bool)> = entries
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap(),
                e["name_escaped"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    for want in [
        (r"d/caf\xe9", true),
        (r"d/a\\b", true),
        (r"d/caf\\xe9", true),
        ("d/plain", false),
    ] {
        assert!(escaped.contains(&want), "{want:?} in {escaped:?}");
    }
    // An escaped form never addresses a file: its backslash is refused as a guest path.
    let out = ctl(&["stat", "--key", &sandbox.key, r"d/caf\xe9"]);
    assert_ne!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
}

/// Runs `docker` with `args`, killed if it outlives a minute; its stdout, trimmed.
fn docker_text(args: &[&str]) -> String {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("docker {args:?} still running after a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The local engine's data root, as the Docker backend reports it, is out of reach through the
/// host: cp-in does not read another sandbox's container record (its environment is there), and
/// cp-out plants nothing in another sandbox's file system layer or record, whatever the override.
#[test]
fn one_key_cannot_reach_another_sandboxs_engine_state() {
    let mine = KeptSandbox::new("engine-a", "printf planted > f");
    let theirs = KeptSandbox::new("engine-b", "true");
    let listed = json(&ctl(&["--json", "list", "--scope", &theirs.scope]));
    let id = listed["sandboxes"][0]["instance_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{listed}"))
        .to_owned();
    let root = std::path::PathBuf::from(docker_text(&["info", "--format", "{{.DockerRootDir}}"]));
    let record = root.join("containers").join(&id).join("config.v2.json");
    let hosts = root.join("containers").join(&id).join("hosts");
    let upper = docker_text(&["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", &id]);
    assert!(record.is_file(), "{}", record.display());
    let out = ctl(&[
        "cp-in",
        "--key",
        &mine.key,
        "--allow-credential-path",
        record.to_str().unwrap(),
        "stolen.json",
    ]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    let out = ctl(&[
        "exec",
        "--key",
        &mine.key,
        "--",
        "test",
        "-e",
        "stolen.json",
    ]);
    assert_eq!(code(&out), 1, "nothing was copied in: {}", stderr(&out));
    let hosts_before = std::fs::read(&hosts).unwrap();
    let mut destinations = vec![hosts.clone()];
    if upper.starts_with('/') {
        destinations.push(std::path::Path::new(&upper).join("planted"));
    }
    for dest in &destinations {
        let fake = FakeHome::new();
        // The destination's own directory as the output root: the state guard is what refuses.
        let parent = dest.parent().unwrap().to_str().unwrap();
        let extra = [
            "--allow-credential-path",
            "--overwrite",
            "--out-dir",
            parent,
        ];
        let out = fake.cp_out(&mine.key, "f", dest, &extra);
        assert_eq!(code(&out), 69, "{}: {}", dest.display(), stderr(&out));
        assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read(&hosts).unwrap(), hosts_before);
    if upper.starts_with('/') {
        assert!(!std::path::Path::new(&upper).join("planted").exists());
    }
}

/// The sbx simulator: `SBX_PATH` when set (the suites set it), else the workspace's debug build.
fn sbx_sim() -> std::path::PathBuf {
    let path = std::env::var_os("SBX_PATH")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
                })
                .join("debug/sbx-sim")
        });
    assert!(
        path.is_file(),
        "the sbx simulator is missing at {} (cargo build -p sbx-sim, or set SBX_PATH)",
        path.display()
    );
    path
}

/// On the sbx backend itself (the simulator), two keys' real sandboxes: the workspace root the
/// backend reports is guarded, so one key neither reads the other's workspace files (cp-in, an env
/// file) nor plants files in its workspace or replaces its record (cp-out), whatever the override.
#[test]
fn on_sbx_one_key_cannot_reach_another_keys_workspace_or_record() {
    let fake = FakeHome::new();
    let sim = sbx_sim();
    let state = fake.home.join("state");
    let sim_home = fake.home.join("sim");
    std::fs::create_dir_all(&state).unwrap();
    let env = [
        ("HOME", fake.home.to_str().unwrap()),
        ("XDG_STATE_HOME", state.to_str().unwrap()),
        ("SBX_SIM_HOME", sim_home.to_str().unwrap()),
    ];
    let sbx = [
        "--backend",
        "sbx",
        "--sbx-path",
        sim.to_str().unwrap(),
        "--allow-simulator",
    ];
    let bound = Duration::from_secs(180);
    let sbx_ctl = |args: &[&str]| {
        let mut all: Vec<&str> = sbx.to_vec();
        all.extend_from_slice(args);
        ctl_env(&all, &env, bound)
    };
    let scope = scope("sbx-ws");
    let (mine, theirs) = (format!("{scope}/t1/a"), format!("{scope}/t1/b"));
    struct Purge<'a>(&'a dyn Fn(&[&str]) -> Output, &'a str);
    impl Drop for Purge<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["purge", "--scope", self.1, "--thread", "t1"]);
        }
    }
    let _purge = Purge(&sbx_ctl, &scope);
    for (key, setup) in [
        (&mine, "printf planted > f"),
        (
            &theirs,
            "printf theirs > secret.txt && printf A=1 > vars.env",
        ),
    ] {
        let out = sbx_ctl(&["run", "--key", key, "--", "sh", "-c", setup]);
        assert_eq!(code(&out), 0, "setup: {}", stderr(&out));
    }
    // Their files, where the backend keeps them: the one directory below the root holding their
    // secret; their record is meta.json of the sandbox's directory, the root's child above it.
    let root = state.join("maf-sandbox-docker-sbx/workspaces");
    fn find(dir: &std::path::Path, name: &str, depth: usize) -> Option<std::path::PathBuf> {
        for entry in std::fs::read_dir(dir).ok()? {
            let path = entry.ok()?.path();
            if path.file_name().is_some_and(|n| n == name) && path.is_file() {
                return Some(dir.to_path_buf());
            }
            if depth > 0 && path.is_dir() && !path.is_symlink() {
                if let Some(found) = find(&path, name, depth - 1) {
                    return Some(found);
                }
            }
        }
        None
    }
    let theirs_ws = find(&root, "secret.txt", 6)
        .unwrap_or_else(|| panic!("their workspace under {}", root.display()));
    let theirs_record = root
        .join(
            theirs_ws
                .strip_prefix(&root)
                .unwrap()
                .components()
                .next()
                .unwrap(),
        )
        .join("meta.json");
    let record_before = std::fs::read(&theirs_record).unwrap();
    let out = sbx_ctl(&[
        "cp-in",
        "--key",
        &mine,
        "--allow-credential-path",
        theirs_ws.join("secret.txt").to_str().unwrap(),
        "stolen",
    ]);
    assert_eq!(code(&out), 69, "{}", stderr(&out));
    assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    let out = sbx_ctl(&["exec", "--key", &mine, "--", "test", "-e", "stolen"]);
    assert_eq!(code(&out), 1, "nothing was copied in: {}", stderr(&out));
    let out = sbx_ctl(&[
        "exec",
        "--key",
        &mine,
        "--env-file",
        theirs_ws.join("vars.env").to_str().unwrap(),
        "--",
        "true",
    ]);
    assert_eq!(code(&out), 125, "{}", stderr(&out));
    assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    for dest in [theirs_ws.join("planted"), theirs_record.clone()] {
        let out = sbx_ctl(&[
            "cp-out",
            "--key",
            &mine,
            "--allow-credential-path",
            "--overwrite",
            "--out-dir",
            fake.home.to_str().unwrap(),
            "f",
            dest.to_str().unwrap(),
        ]);
        assert_eq!(code(&out), 69, "{}: {}", dest.display(), stderr(&out));
        assert!(stderr(&out).contains("workspaces"), "{}", stderr(&out));
    }
    assert!(!theirs_ws.join("planted").exists());
    assert_eq!(std::fs::read(&theirs_record).unwrap(), record_before);
    // Their sandbox still answers with its own file.
    let out = sbx_ctl(&["exec", "--key", &theirs, "--", "cat", "secret.txt"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(out.stdout, b"theirs");
}
