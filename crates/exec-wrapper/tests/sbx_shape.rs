//! The full sbx shape of the wrapper (`unshare`, then the `bind` and `run` stages) run for real on
//! this host, as an unprivileged caller, exactly as the sbx backend runs it inside the VM
//! (everything from the call's first process, `unshare`, onward): a private user and mount
//! namespace, the workspace bound at the storage base's parent, the marker check, then the command
//! under the caller's own uid and gid. Every case runs under dash and bash (see [`shells`] for why
//! not BusyBox), each in both shapes: without a PID namespace (the group record) and in one of
//! the call's own (no record; the command started by `setsid` directly).
//!
//! These tests need unprivileged user namespaces and util-linux `unshare` with
//! `--map-user`/`--map-group` (2.38 or later). Without them every test here fails with a message
//! saying so: the sbx templates need the same, so a host lacking them must not pass silently.
//!
//! Run as root, the caller is a fixed unprivileged uid and gid reached through `setpriv`; run as
//! anyone else, the caller is the test process's own uid and gid.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bounded_process::{BoundedCommand, ExitKind};
use exec_wrapper::call::{cancel_file, pid_file, sbx_env_file_name};
use exec_wrapper::encoding::{
    encode_env_file, encode_invocation, plain_invocation, EncodedInvocation,
};
use exec_wrapper::outcome::parse_run_output;
use exec_wrapper::wrapper::{
    sbx_pid_namespace_wrapper_argv, sbx_wrapper_argv, SbxMount, WORKSPACE_MARKER,
};
use exec_wrapper::{Nonce, WrapperOutcome, WrapperOutput};

const BOUND: Duration = Duration::from_secs(20);

/// The unprivileged identity used when the tests run as root. Distinct uid and gid values, so a
/// wrapper that swapped them would be caught.
const ROOT_RUN_UID: u32 = 47_813;
const ROOT_RUN_GID: u32 = 47_819;

/// Who runs the wrapper, and how the test process becomes them.
#[derive(Clone)]
struct Caller {
    uid: u32,
    gid: u32,
    /// The uid and gid the host sees on what the caller creates.
    host: (u32, u32),
    /// `setpriv …` in front of the shell when the test process is root; empty otherwise.
    prefix: Vec<OsString>,
}

impl Caller {
    fn current() -> Caller {
        if rustix::process::geteuid().is_root() {
            let setpriv = find_on_path("setpriv").unwrap_or_else(|| {
                panic!("`setpriv` (util-linux) is required to run the sbx shape as an unprivileged uid")
            });
            Caller {
                uid: ROOT_RUN_UID,
                gid: ROOT_RUN_GID,
                host: (ROOT_RUN_UID, ROOT_RUN_GID),
                prefix: vec![
                    setpriv.into(),
                    "--reuid".into(),
                    ROOT_RUN_UID.to_string().into(),
                    "--regid".into(),
                    ROOT_RUN_GID.to_string().into(),
                    "--clear-groups".into(),
                ],
            }
        } else {
            let (uid, gid) = own_ids();
            Caller {
                uid,
                gid,
                host: (uid, gid),
                prefix: Vec::new(),
            }
        }
    }

    /// A caller whose outer uid and gid are both 0: the test process itself when it is root,
    /// else uid 0 of a user namespace of its own (`unshare --map-root-user`), as an sbx guest
    /// whose user is root.
    fn root() -> Caller {
        let prefix = if rustix::process::geteuid().is_root() {
            Vec::new()
        } else {
            let unshare = required("unshare");
            vec![
                unshare.into(),
                "--user".into(),
                "--map-root-user".into(),
                "--".into(),
            ]
        };
        Caller {
            uid: 0,
            gid: 0,
            host: own_ids(),
            prefix,
        }
    }

    /// A bounded command running `program args…` as this caller, from `/` (as `sbx exec` would).
    fn command(&self, program: &Path, args: impl IntoIterator<Item = OsString>) -> BoundedCommand {
        let mut full: Vec<OsString> = self.prefix.clone();
        full.push(program.into());
        full.extend(args);
        BoundedCommand::new(full.remove(0), BOUND)
            .args(full)
            .current_dir("/")
    }

    /// Makes `path` belong to this caller (a no-op unless the tests run as root).
    fn own(&self, path: &Path) {
        if self.host != own_ids() {
            std::os::unix::fs::chown(path, Some(self.host.0), Some(self.host.1))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }
}

/// The test process's own uid and gid.
fn own_ids() -> (u32, u32) {
    (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    )
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn required(name: &str) -> PathBuf {
    find_on_path(name).unwrap_or_else(|| panic!("`{name}` is required on PATH for these tests"))
}

const SYSTEM_PATH: &str = "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One shell under test, with a bin directory whose `sh` is that shell (so the `unshare` the call
/// starts with, every stage's re-run of the script, and the command's inner shell use it too),
/// and the shape of the call.
struct Shell {
    name: &'static str,
    program: PathBuf,
    path: String,
    /// The call runs in a PID namespace of its own ([`sbx_pid_namespace_wrapper_argv`]).
    pid_namespace: bool,
}

/// dash and bash. The bin directories live under `site_root`, which the caller can traverse.
///
/// BusyBox `sh` is not among them: the Debian BusyBox build is made to prefer its own applets,
/// so its `sh` runs BusyBox's `unshare` and `mount` whatever `PATH` says, and BusyBox's `unshare`
/// has no `--map-user`/`--map-group`. The wrapper needs util-linux's (docs/wrapper-protocol.md#the-tool-probe); an
/// image whose `sh` is such a BusyBox fails the sbx mount proof at create. The `run` stage is
/// checked under BusyBox in `wrapper_shells.rs`.
fn shells(site_root: &Path) -> Vec<Shell> {
    [
        ("dash", "dash", false),
        ("dash", "dash, PID namespace", true),
        ("bash", "bash", false),
        ("bash", "bash, PID namespace", true),
    ]
    .into_iter()
    .map(|(shell, name, pid_namespace)| {
        let bin = site_root.join(format!("bin-{shell}"));
        if !bin.exists() {
            std::fs::create_dir(&bin).unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::symlink(required(shell), bin.join("sh")).unwrap();
        }
        Shell {
            name,
            program: required(shell),
            path: format!("{}:{SYSTEM_PATH}", bin.display()),
            pid_namespace,
        }
    })
    .collect()
}

/// A host layout standing in for the guest's: a workspace as sbx would mount it (owned by the
/// caller, holding the marker and the storage base `work/`), another sandbox's workspace
/// (no marker), and the storage base's parent as the image has it after create: a root-made
/// directory the bind covers. The parent holds one host-only file, so a test can tell the bound
/// view from the host's.
struct Site {
    root: tempfile::TempDir,
    caller: Caller,
    workspace: PathBuf,
    other_workspace: PathBuf,
    parent: PathBuf,
    /// A directory the caller can write outside the parent, for side effects that must not
    /// happen.
    outside: PathBuf,
    shells: Vec<Shell>,
}

const HOST_ONLY: &str = "host-only";
const GREETING: &[u8] = b"hello from the workspace\n";

impl Site {
    fn new() -> Site {
        Site::new_for(Caller::current())
    }

    fn new_for(caller: Caller) -> Site {
        // Under /tmp itself, not $TMPDIR: the caller must be able to traverse every ancestor,
        // and the wrapper's pid file lives in /tmp anyway.
        let root = tempfile::Builder::new()
            .prefix("exec-wrapper-sbx-")
            .tempdir_in("/tmp")
            .unwrap();
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mode(root.path(), 0o755);

        let workspace = root.path().join("ws-0123456789ab");
        let base = workspace.join("work");
        let sub = base.join("a dir");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(workspace.join(WORKSPACE_MARKER), b"").unwrap();
        std::fs::write(base.join("greeting"), GREETING).unwrap();
        mode(&workspace, 0o700);
        for path in [
            &workspace,
            &workspace.join(WORKSPACE_MARKER),
            &base,
            &base.join("greeting"),
            &sub,
        ] {
            caller.own(path);
        }

        let other_workspace = root.path().join("ws-ba9876543210");
        std::fs::create_dir_all(other_workspace.join("work")).unwrap();
        mode(&other_workspace, 0o700);
        caller.own(&other_workspace);
        caller.own(&other_workspace.join("work"));

        let parent = root.path().join("maf-sandbox");
        std::fs::create_dir(&parent).unwrap();
        std::fs::write(parent.join(HOST_ONLY), b"").unwrap();
        mode(&parent, 0o755);

        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        caller.own(&outside);

        let shells = shells(root.path());
        let site = Site {
            root,
            caller,
            workspace,
            other_workspace,
            parent,
            outside,
            shells,
        };
        site.require_namespaces();
        site.assert_nothing_mounted();
        site
    }

    fn parent_str(&self) -> &str {
        self.parent.to_str().unwrap()
    }

    /// Fails (never skips) with a clear message when this host cannot give the caller the
    /// namespaces the call's `unshare` and its `bind` stage need.
    fn require_namespaces(&self) {
        let probe = format!(
            "unshare --user --mount --map-root-user -- \
             unshare --user --map-user={uid} --map-group={gid} -- true",
            uid = self.caller.uid,
            gid = self.caller.gid
        );
        let dash = &self.shells[0];
        let output = runtime().block_on(
            self.caller
                .command(&dash.program, ["-c".into(), probe.into()])
                .env("PATH", &dash.path)
                .run(),
        );
        match output {
            Ok(output) if output.status == ExitKind::Exited(0) => {}
            other => panic!(
                "unprivileged user namespaces are unavailable to uid {} on this host, or util-linux \
                 `unshare` lacks --map-user/--map-group (2.38 or later is needed): the sbx wrapper's \
                 unshare and bind stage cannot run. Check user.max_user_namespaces, \
                 kernel.unprivileged_userns_clone and AppArmor's \
                 kernel.apparmor_restrict_unprivileged_userns. Probe result: {}",
                self.caller.uid,
                describe(&other)
            ),
        }
    }

    /// Runs the real sbx argv under `shell`, as the caller, and reads it with the crate's parser.
    /// Every value travels as the backend carries it ([`plain_invocation`]).
    async fn run(
        &self,
        shell: &Shell,
        nonce: &Nonce,
        guest_mount: &Path,
        with_env_file: bool,
        cwd: &[u8],
        argv: &[&[u8]],
    ) -> WrapperOutcome {
        let invocation = plain_invocation(cwd, argv).unwrap();
        self.run_invocation(shell, nonce, guest_mount, with_env_file, &invocation)
            .await
    }

    /// As [`Site::run`], with the values carried as `invocation` carries them.
    async fn run_invocation(
        &self,
        shell: &Shell,
        nonce: &Nonce,
        guest_mount: &Path,
        with_env_file: bool,
        invocation: &EncodedInvocation,
    ) -> WrapperOutcome {
        let mount = SbxMount {
            parent: self.parent_str().to_owned(),
            guest_mount: guest_mount.to_str().unwrap().to_owned(),
        };
        let argv = if shell.pid_namespace {
            sbx_pid_namespace_wrapper_argv(nonce, &mount, with_env_file, invocation).unwrap()
        } else {
            sbx_wrapper_argv(nonce, &mount, with_env_file, invocation).unwrap()
        };
        assert_eq!(argv[0], "unshare", "the guest argv starts with unshare");
        let sh = argv.iter().position(|arg| arg == "sh").unwrap();
        assert_eq!(
            argv[sh + 5],
            "bind",
            "the real sbx argv starts the wrapper at the bind stage"
        );
        let args = argv[1..].iter().map(OsString::from).collect::<Vec<_>>();
        // By name, as `sbx exec` starts it (found on the shell's `PATH`).
        required("unshare");
        let output = self
            .caller
            .command(Path::new("unshare"), args)
            .env("PATH", &shell.path)
            .env("LANG", "C.UTF-8")
            .run()
            .await
            .unwrap_or_else(|e| panic!("{}: the runner failed: {e}", shell.name));
        parse_run_output(output, nonce)
    }

    /// No mount point at or under this site's root, as this (the host's) mount namespace sees it.
    fn assert_nothing_mounted(&self) {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = self.root.path().to_str().unwrap();
        for line in mountinfo.lines() {
            // Field 5 is the mount point (octal escapes only for space, tab, newline and `\`,
            // none of which this site's paths contain).
            let mount_point = line.split(' ').nth(4).unwrap_or_default();
            assert!(
                mount_point != self.parent_str() && !mount_point.starts_with(root),
                "still mounted on the host: {line}"
            );
        }
    }

    /// The parent as the host sees it: the one host-only file, nothing of the workspace.
    fn assert_host_parent_unchanged(&self) {
        assert_eq!(
            names(&self.parent),
            BTreeSet::from([HOST_ONLY.to_owned()]),
            "the host's view of the parent changed"
        );
        let meta = std::fs::metadata(&self.parent).unwrap();
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(meta.mode() & 0o7777, 0o755);
    }
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn describe(result: &Result<bounded_process::RunOutput, bounded_process::Error>) -> String {
    match result {
        Ok(output) => format!(
            "{:?}, stderr {:?}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => format!("the probe did not run: {e}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn ran(shell: &Shell, outcome: WrapperOutcome) -> WrapperOutput {
    match outcome {
        WrapperOutcome::Ran(output) => output,
        other => panic!("{}: expected a command result, got {other:?}", shell.name),
    }
}

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

#[test]
fn the_workspace_is_bound_at_the_parent_and_the_command_runs_as_the_caller() {
    workspace_bound_and_command_run_as(&Site::new(), "run");
}

/// A root caller: the same view and identity, from the `bind` stage's own shell (no nested
/// namespace, no second `sh`), which is the command's parent.
#[test]
fn a_root_caller_runs_its_command_from_the_bind_stage_shell() {
    workspace_bound_and_command_run_as(&Site::new_for(Caller::root()), "bind");
}

/// Runs a command that reports its view and identity, writes a file and names the stage its
/// parent shell was started for (`run`, or `bind` when the `bind` stage's shell runs it). The
/// parent is read from `/proc/self/stat`, whose pids are the host's (`$PPID` is the namespace's).
fn workspace_bound_and_command_run_as(site: &Site, parent_stage: &str) {
    let cwd = format!("{}/work/a dir", site.parent_str());
    for shell in &site.shells {
        let nonce = common::host_call();
        let written = format!("written-by-{}", shell.name);
        // The parent's listing shows the workspace (marker, storage base), not the host-only
        // file the bind covers; the file is written relative to the cwd, through the bind.
        let script = "pwd; id -u; id -g; cat ../greeting; ls -A \"$1\"; \
                      printf 'from %s' \"$2\" >\"$2\"; ls -ln \"$2\"; \
                      read -r l </proc/self/stat; set -- ${l##*) }; \
                      tr '\\0' '\\n' </proc/$2/cmdline | grep -x -e bind -e run";
        let outcome = runtime().block_on(site.run(
            shell,
            &nonce,
            &site.workspace,
            false,
            cwd.as_bytes(),
            &[
                b"sh",
                b"-c",
                script.as_bytes(),
                b"sh",
                site.parent_str().as_bytes(),
                written.as_bytes(),
            ],
        ));
        let output = ran(shell, outcome);
        assert_eq!(
            output.status,
            0,
            "{}: stderr {}",
            shell.name,
            text(&output.stderr)
        );
        assert!(
            output.stderr.is_empty(),
            "{}: stderr {}",
            shell.name,
            text(&output.stderr)
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some(cwd.as_str()), "{}: cwd", shell.name);
        assert_eq!(
            lines.next(),
            Some(site.caller.uid.to_string().as_str()),
            "{}: id -u",
            shell.name
        );
        assert_eq!(
            lines.next(),
            Some(site.caller.gid.to_string().as_str()),
            "{}: id -g",
            shell.name
        );
        assert_eq!(
            lines.next(),
            Some(text(GREETING).trim_end()),
            "{}: the workspace's content at the parent",
            shell.name
        );
        assert_eq!(
            lines.next(),
            Some(WORKSPACE_MARKER),
            "{}: the parent's listing",
            shell.name
        );
        assert_eq!(
            lines.next(),
            Some("work"),
            "{}: the parent's listing",
            shell.name
        );
        // `ls -ln` inside: the new file is the caller's own, with no uid or gid left unmapped.
        let long = lines.next().unwrap_or_default();
        let fields: Vec<&str> = long.split_whitespace().collect();
        assert_eq!(
            fields.get(2..4),
            Some(
                [
                    site.caller.uid.to_string().as_str(),
                    site.caller.gid.to_string().as_str()
                ]
                .as_slice()
            ),
            "{}: ownership seen inside: {long}",
            shell.name
        );
        assert_eq!(
            lines.next(),
            Some(parent_stage),
            "{}: the stage of the command's parent shell",
            shell.name
        );
        assert_eq!(lines.next(), None, "{}: {stdout}", shell.name);

        // On the host the file landed in the workspace, owned by the caller.
        let landed = site.workspace.join("work/a dir").join(&written);
        assert_eq!(
            std::fs::read(&landed).unwrap(),
            format!("from {written}").as_bytes(),
            "{}",
            shell.name
        );
        let meta = std::fs::metadata(&landed).unwrap();
        assert_eq!((meta.uid(), meta.gid()), site.caller.host, "{}", shell.name);
        assert!(
            !Path::new(&pid_file(&nonce)).exists(),
            "{}: the pid file stays behind",
            shell.name
        );
        site.assert_nothing_mounted();
        site.assert_host_parent_unchanged();
    }
}

#[test]
fn stdout_stderr_and_the_exit_status_pass_through_exactly() {
    let site = Site::new();
    let expect = |stdout: &[u8], stderr: &[u8], status| WrapperOutput {
        stdout: stdout.to_vec(),
        stderr: stderr.to_vec(),
        status,
    };
    let cases: [(&[u8], WrapperOutput); 4] = [
        (
            b"printf 'out\\0\\377\\n'; printf 'err \\001\\n\\n' >&2; printf tail; printf etail >&2; exit 3",
            expect(b"out\0\xff\ntail", b"err \x01\n\netail", 3),
        ),
        (b"printf 'only out\\n'", expect(b"only out\n", b"", 0)),
        // 125 and 127 after the nonce are the command's, never a wrapper failure.
        (
            b"printf 'gone\\n' >&2; exit 125",
            expect(b"", b"gone\n", 125),
        ),
        (b"exit 127", expect(b"", b"", 127)),
    ];
    for shell in &site.shells {
        for (script, expected) in &cases {
            let nonce = common::host_call();
            let outcome = runtime().block_on(site.run(
                shell,
                &nonce,
                &site.workspace,
                false,
                b"/",
                &[b"sh", b"-c", script],
            ));
            assert_eq!(
                &ran(shell, outcome),
                expected,
                "{}: {}",
                shell.name,
                text(script)
            );
        }
        site.assert_nothing_mounted();
    }
    site.assert_host_parent_unchanged();
}

/// Plain values travel as themselves behind an `r` and the rest as `x`-base64, and every one
/// reaches the command byte for byte; an all-encoded call (as the Docker group shape carries
/// values) reaches it the same.
#[test]
fn every_argv_value_arrives_exactly_whether_plain_or_encoded() {
    let site = Site::new();
    let values: [&[u8]; 10] = [
        b"",
        b"--",
        b"-u",
        b"r",
        b"x",
        b"xZWNobw==",
        b"two  words ",
        b"line\n\n",
        &[0xff, 0xfe, b'a'],
        b"$(touch /tmp/exec-wrapper-sbx-pwned) 'q' \"d\" *",
    ];
    let mut argv: Vec<&[u8]> = vec![b"printf".as_slice(), b"%s\\0"];
    argv.extend(values);
    let expected: Vec<u8> = values
        .iter()
        .flat_map(|v| [*v, b"\0".as_slice()].concat())
        .collect();
    let plain = plain_invocation(b"/", &argv).unwrap();
    let kinds: String = plain.argv()[2..].iter().map(|value| &value[..1]).collect();
    assert_eq!(kinds, "rrrrrrxxxr", "{:?}", plain.argv());
    let encoded = encode_invocation(b"/", &argv).unwrap();
    for shell in &site.shells {
        for (how, invocation) in [("plain", &plain), ("encoded", &encoded)] {
            let nonce = common::host_call();
            let outcome = runtime().block_on(site.run_invocation(
                shell,
                &nonce,
                &site.workspace,
                false,
                invocation,
            ));
            let output = ran(shell, outcome);
            assert_eq!(
                (output.status, text(&output.stderr)),
                (0, "".into()),
                "{}: {how}",
                shell.name
            );
            assert!(
                output.stdout == expected,
                "{}: {how}: argv changed on the way: {:?}",
                shell.name,
                text(&output.stdout)
            );
        }
    }
    assert!(!Path::new("/tmp/exec-wrapper-sbx-pwned").exists());
    site.assert_nothing_mounted();
}

#[test]
fn a_workspace_without_the_marker_is_unmounted_and_the_command_never_runs() {
    let site = Site::new();
    let marker = site.workspace.join(WORKSPACE_MARKER);
    for shell in &site.shells {
        for case in ["another sandbox's workspace", "the marker removed"] {
            let guest_mount = match case {
                "another sandbox's workspace" => site.other_workspace.clone(),
                _ => {
                    std::fs::remove_file(&marker).unwrap();
                    site.workspace.clone()
                }
            };
            let nonce = common::host_call();
            let side_effect = site.outside.join(format!("ran-{}", shell.name));
            let outcome = runtime().block_on(site.run(
                shell,
                &nonce,
                &guest_mount,
                false,
                b"/",
                &[b"touch", side_effect.to_str().unwrap().as_bytes()],
            ));
            assert_eq!(outcome, WrapperOutcome::Unmounted, "{}: {case}", shell.name);
            assert!(
                !side_effect.exists(),
                "{}: {case}: the command ran",
                shell.name
            );
            assert!(
                !Path::new(&pid_file(&nonce)).exists(),
                "{}: {case}: the run stage started",
                shell.name
            );
            site.assert_nothing_mounted();
            site.assert_host_parent_unchanged();
            if case == "the marker removed" {
                std::fs::write(&marker, b"").unwrap();
                site.caller.own(&marker);
            }
        }
    }
    // The outside directory is writable by the caller: with the marker back, the same command
    // runs and leaves its side effect, so its absence above was the marker check's doing.
    let shell = &site.shells[0];
    let nonce = common::host_call();
    let side_effect = site.outside.join("ran-with-marker");
    let outcome = runtime().block_on(site.run(
        shell,
        &nonce,
        &site.workspace,
        false,
        b"/",
        &[b"touch", side_effect.to_str().unwrap().as_bytes()],
    ));
    assert_eq!(ran(shell, outcome).status, 0);
    assert!(side_effect.exists());
}

#[test]
fn a_guest_mount_that_cannot_be_bound_is_a_wrapper_failure() {
    let site = Site::new();
    let missing = site.root.path().join("no-such-workspace");
    for shell in &site.shells {
        let nonce = common::host_call();
        let side_effect = site.outside.join(format!("ran-{}", shell.name));
        let outcome = runtime().block_on(site.run(
            shell,
            &nonce,
            &missing,
            false,
            b"/",
            &[b"touch", side_effect.to_str().unwrap().as_bytes()],
        ));
        assert!(
            matches!(outcome, WrapperOutcome::NoNonce { status: 125, .. }),
            "{}: {outcome:?}",
            shell.name
        );
        assert!(!side_effect.exists(), "{}", shell.name);
        site.assert_nothing_mounted();
    }
    site.assert_host_parent_unchanged();
}

#[test]
fn the_env_file_is_read_through_the_bind_and_deleted() {
    let site = Site::new();
    for shell in &site.shells {
        let nonce = common::host_call();
        // The host writes the env file into the workspace (0600, as the caller sees its own
        // files through sbx's mount); the wrapper reads it at <parent>/<name> after binding.
        let env_file = site.workspace.join(sbx_env_file_name(&nonce));
        let env: [(&[u8], &[u8]); 2] = [
            (b"GREETING", b"hi there\n\n"),
            (b"SHELL_UNDER_TEST", shell.name.as_bytes()),
        ];
        std::fs::write(&env_file, encode_env_file(&env).unwrap()).unwrap();
        std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        site.caller.own(&env_file);

        let outcome = runtime().block_on(site.run(
            shell,
            &nonce,
            &site.workspace,
            true,
            b"/",
            &[
                b"sh",
                b"-c",
                b"printf '%s|%s' \"$GREETING\" \"$SHELL_UNDER_TEST\"",
            ],
        ));
        let output = ran(shell, outcome);
        assert_eq!(
            (output.status, text(&output.stderr)),
            (0, "".into()),
            "{}",
            shell.name
        );
        assert_eq!(
            output.stdout,
            [b"hi there\n\n|".as_slice(), shell.name.as_bytes()].concat(),
            "{}",
            shell.name
        );
        assert!(
            !env_file.exists(),
            "{}: the env file must be deleted through the bind",
            shell.name
        );
        site.assert_nothing_mounted();
    }
    site.assert_host_parent_unchanged();
}

/// The command is exactly its argv in a process group and session of its own (its `kill 0`
/// reaches only what it started), its death by a signal reads as 128 plus the signal, and only
/// the call without a PID namespace writes a group record.
#[test]
fn the_command_leads_its_own_group_and_its_signal_shows_in_the_status() {
    own_group_and_signal_status(&Site::new());
}

/// The same for a root caller, whose command the `bind` stage's shell starts and waits for.
#[test]
fn a_root_callers_command_leads_its_own_group_and_its_signal_shows_in_the_status() {
    own_group_and_signal_status(&Site::new_for(Caller::root()));
}

fn own_group_and_signal_status(site: &Site) {
    // The fields of /proc/self/stat after the command name: state, ppid, pgrp, session. `read`
    // is a builtin, so /proc/self is the command's own shell.
    let script = br#"read -r l </proc/self/stat; p=${l%% *}; set -- ${l##*) }
[ "$3" = "$p" ] && [ "$4" = "$p" ] && echo own-group
if [ -e "$0" ]; then echo recorded; else echo unrecorded; fi"#;
    for shell in &site.shells {
        let nonce = common::host_call();
        let record = pid_file(&nonce);
        let outcome = runtime().block_on(site.run(
            shell,
            &nonce,
            &site.workspace,
            false,
            b"/",
            &[b"sh", b"-c", script, record.as_bytes()],
        ));
        let output = ran(shell, outcome);
        let expected = if shell.pid_namespace {
            "own-group\nunrecorded\n"
        } else {
            "own-group\nrecorded\n"
        };
        assert_eq!(
            (output.status, text(&output.stdout), text(&output.stderr)),
            (0, expected.into(), "".into()),
            "{}",
            shell.name
        );
        assert!(
            !Path::new(&record).exists(),
            "{}: {record} left",
            shell.name
        );

        for (signal, status) in [("KILL", 137), ("TERM", 143)] {
            let nonce = common::host_call();
            let kill = format!("kill -{signal} $$");
            let outcome = runtime().block_on(site.run(
                shell,
                &nonce,
                &site.workspace,
                false,
                b"/",
                &[b"sh", b"-c", kill.as_bytes()],
            ));
            assert_eq!(
                ran(shell, outcome).status,
                status,
                "{}: {signal}",
                shell.name
            );
        }
        // A program that does not exist; in a PID namespace (`setsid --`) one named like an
        // option too: exactly the argv, never an option of the tool that starts it.
        let programs: &[&[u8]] = if shell.pid_namespace {
            &[b"no-such-program", b"-no-such-program"]
        } else {
            &[b"no-such-program"]
        };
        for program in programs {
            let nonce = common::host_call();
            let outcome = runtime().block_on(site.run(
                shell,
                &nonce,
                &site.workspace,
                false,
                b"/",
                &[program],
            ));
            assert_eq!(
                ran(shell, outcome).status,
                127,
                "{}: {}",
                shell.name,
                text(program)
            );
        }
        site.assert_nothing_mounted();
    }
}

/// A kill that came before the call: the cancel file stops the command. In a PID namespace the
/// check comes before the nonce line (a wrapper failure, nothing started); without one the
/// command's inner shell checks it after its record (status 125 after the nonce).
#[test]
fn a_cancelled_call_never_runs_its_command() {
    let site = Site::new();
    for shell in &site.shells {
        let nonce = common::host_call();
        let cancel = cancel_file(&nonce);
        std::fs::write(&cancel, b"").unwrap();
        let side_effect = site.outside.join(format!("cancelled-{}", shell.name));
        let outcome = runtime().block_on(site.run(
            shell,
            &nonce,
            &site.workspace,
            false,
            b"/",
            &[b"touch", side_effect.to_str().unwrap().as_bytes()],
        ));
        if shell.pid_namespace {
            assert!(
                matches!(outcome, WrapperOutcome::NoNonce { status: 125, .. }),
                "{}: {outcome:?}",
                shell.name
            );
        } else {
            assert_eq!(ran(shell, outcome).status, 125, "{}", shell.name);
        }
        assert!(
            !side_effect.exists(),
            "{}: a cancelled command ran",
            shell.name
        );
        std::fs::remove_file(&cancel).unwrap();
        let _ = std::fs::remove_file(pid_file(&nonce));
        site.assert_nothing_mounted();
    }
}

/// Every process whose command line (NULs dropped) contains `needle`, as the host sees them.
fn pids_carrying(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| {
                    let joined: Vec<u8> = raw.into_iter().filter(|b| *b != 0).collect();
                    String::from_utf8_lossy(&joined).contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The PID-namespace call runs the command in its own PID namespace, and the namespace kill, run
/// as the same caller from outside, ends every process in it: a double-fork `setsid` daemon, a
/// `nohup` job and the command itself. The wrapper runs under `setsid -w`, so the runner's own
/// group kill at the deadline reaches only that `setsid`, as a host-side client's would.
#[test]
fn the_namespace_kill_ends_every_process_of_a_pid_namespace_call() {
    let site = Site::new();
    let setsid = required("setsid");
    for (index, shell) in site.shells.iter().filter(|s| s.pid_namespace).enumerate() {
        let nonce = common::host_call();
        let marker = format!("sleep31{}7", 60 + index);
        let script = format!(
            "(setsid sh -c '{m} & exit 0' &); nohup {m} >/dev/null 2>&1 & exec {m}",
            m = marker.replacen("sleep", "sleep ", 1)
        );
        let invocation =
            plain_invocation(b"/", &[b"sh".as_slice(), b"-c", script.as_bytes()]).unwrap();
        let mount = SbxMount {
            parent: site.parent_str().to_owned(),
            guest_mount: site.workspace.to_str().unwrap().to_owned(),
        };
        let argv = exec_wrapper::wrapper::sbx_pid_namespace_wrapper_argv(
            &nonce,
            &mount,
            false,
            &invocation,
        )
        .unwrap();
        assert_eq!(argv[..4], ["unshare", "--user", "--mount", "--pid"]);
        // By name, as `sbx exec` starts it: the kill knows the `unshare` by its command line.
        required("unshare");
        let mut args: Vec<OsString> = vec!["-w".into(), "unshare".into()];
        args.extend(argv[1..].iter().map(OsString::from));
        let call = runtime().block_on(
            site.caller
                .command(&setsid, args)
                .env("PATH", &shell.path)
                .deadline(tokio::time::Instant::now() + Duration::from_millis(1500))
                .run(),
        );
        assert!(
            matches!(call, Err(bounded_process::Error::Deadline { .. })),
            "{}: {}",
            shell.name,
            describe(&call)
        );
        let survivors = pids_carrying(&marker);
        assert!(
            survivors.len() >= 3,
            "{}: the command, the daemon and the nohup job run: {survivors:?}",
            shell.name
        );

        let kill = runtime().block_on(
            site.caller
                .command(
                    &shell.program,
                    exec_wrapper::kill::namespace_kill_argv(&nonce)[1..]
                        .iter()
                        .map(OsString::from),
                )
                .env("PATH", &shell.path)
                .run(),
        );
        let report = exec_wrapper::kill::KillReport::from_run(&kill);
        assert_eq!(
            report.mode,
            Some(exec_wrapper::kill::KillMode::PidNamespace),
            "{}: {}",
            shell.name,
            describe(&kill)
        );
        for pid in survivors {
            assert!(
                !alive(pid),
                "{}: {pid} survived the namespace kill",
                shell.name
            );
        }
        let _ = std::fs::remove_file(exec_wrapper::call::cancel_file(&nonce));
        let _ = std::fs::remove_file(pid_file(&nonce));
        site.assert_nothing_mounted();
    }
}

/// On a host where the PID-namespace call runs (above), the namespace probe passes for the same
/// caller: the real `unshare` takes the options the probe asks for.
#[test]
fn the_namespace_probe_passes_where_the_pid_namespace_call_runs() {
    let site = Site::new();
    for shell in site.shells.iter().filter(|s| s.pid_namespace) {
        let argv = exec_wrapper::kill::pid_namespace_probe_argv();
        assert_eq!(argv[0], "sh");
        let output = runtime().block_on(
            site.caller
                .command(&shell.program, argv[1..].iter().map(OsString::from))
                .env("PATH", &shell.path)
                .run(),
        );
        assert!(
            matches!(&output, Ok(probe) if exec_wrapper::kill::read_kill_mode_probe(probe.status)),
            "{}: {}",
            shell.name,
            describe(&output)
        );
    }
}
