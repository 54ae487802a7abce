//! The backend's own guest scripts (besides the exec wrapper's): each takes its values as
//! positional arguments, never spliced into the script text.

/// The `$0` of every script here, so the guest's process list says whose it is.
pub(crate) const SCRIPT_NAME: &str = "maf-sbx";

/// Exit status of [`MOUNT_POINT_SCRIPT`] when the image already has the parent.
pub(crate) const MOUNT_POINT_CLASH_EXIT: i32 = 3;

/// Makes the storage base's parent (`$1`), where every command binds the workspace, as root.
/// It must not exist in the image: binding over an image directory would hide it, and a link
/// there could point the bind anywhere. Exit 3 with a message on stderr when it exists or is a
/// link.
pub(crate) const MOUNT_POINT_SCRIPT: &str = r#"p=$1
if [ -e "$p" ] || [ -L "$p" ]; then
  printf '%s already exists in the image\n' "$p" >&2
  exit 3
fi
mkdir -p -- "$p""#;

/// Exit status of [`NO_AGENT_SCRIPT`] when an agent socket is present.
pub(crate) const AGENT_SOCKET_EXIT: i32 = 1;

/// The path where sbx puts a forwarded SSH agent socket.
pub(crate) const AGENT_SOCKET: &str = "/run/ssh-agent.sock";

/// Exit 1 when `$1` (the agent socket path) exists or is a link (even a dangling one).
pub(crate) const NO_AGENT_SCRIPT: &str = r#"if [ -e "$1" ] || [ -L "$1" ]; then exit 1; fi"#;

/// `sh -c <script> maf-sbx <args…>`.
pub(crate) fn script_argv(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = ["sh", "-c", script, SCRIPT_NAME]
        .map(str::to_owned)
        .to_vec();
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv
}

/// `sh -c "pwd -P"`: where sbx mounted the workspace (a default exec starts there).
pub(crate) fn guest_mount_argv() -> Vec<String> {
    ["sh", "-c", "pwd -P"].map(str::to_owned).to_vec()
}

/// `sh -c :`: does the sandbox answer at all?
pub(crate) fn presence_argv() -> Vec<String> {
    ["sh", "-c", ":"].map(str::to_owned).to_vec()
}

/// Reads the guest mount from `pwd -P`: exactly one line, absolute.
pub(crate) fn parse_guest_mount(stdout: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(stdout).ok()?;
    let line = text.strip_suffix('\n').unwrap_or(text);
    let line = line.strip_suffix('\r').unwrap_or(line);
    (line.starts_with('/') && !line.contains(['\n', '\r', '\0'])).then(|| line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_stable() {
        insta::assert_snapshot!("mount_point", MOUNT_POINT_SCRIPT);
        insta::assert_snapshot!("no_agent", NO_AGENT_SCRIPT);
        assert_eq!(
            script_argv(NO_AGENT_SCRIPT, &[AGENT_SOCKET]),
            [
                "sh",
                "-c",
                NO_AGENT_SCRIPT,
                "maf-sbx",
                "/run/ssh-agent.sock"
            ]
        );
    }

    #[test]
    fn guest_mounts() {
        assert_eq!(parse_guest_mount(b"/w/ws-1\n").as_deref(), Some("/w/ws-1"));
        assert_eq!(parse_guest_mount(b"/w\r\n").as_deref(), Some("/w"));
        for bad in [
            &b""[..],
            b"\n",
            b"rel\n",
            b"/a\n/b\n",
            b"\xff\n",
            b"/a\0b\n",
        ] {
            assert_eq!(parse_guest_mount(bad), None, "{bad:?}");
        }
    }

    /// The scripts run for real under the host's `sh`, whose POSIX semantics the guest shares.
    #[cfg(unix)]
    #[test]
    fn scripts_behave() {
        let temp = tempfile::tempdir().unwrap();
        let run = |script: &str, arg: &std::path::Path| {
            std::process::Command::new("sh")
                .args(["-c", script, SCRIPT_NAME])
                .arg(arg)
                .status()
                .unwrap()
                .code()
        };
        let parent = temp.path().join("maf-sandbox");
        assert_eq!(run(MOUNT_POINT_SCRIPT, &parent), Some(0));
        assert!(parent.is_dir());
        assert_eq!(
            run(MOUNT_POINT_SCRIPT, &parent),
            Some(MOUNT_POINT_CLASH_EXIT)
        );
        let link = temp.path().join("dangling");
        std::os::unix::fs::symlink(temp.path().join("nowhere"), &link).unwrap();
        assert_eq!(run(MOUNT_POINT_SCRIPT, &link), Some(MOUNT_POINT_CLASH_EXIT));
        assert!(!temp.path().join("nowhere").exists());

        let socket = temp.path().join("ssh-agent.sock");
        assert_eq!(run(NO_AGENT_SCRIPT, &socket), Some(0));
        std::fs::write(&socket, b"").unwrap();
        assert_eq!(run(NO_AGENT_SCRIPT, &socket), Some(AGENT_SOCKET_EXIT));
        assert_eq!(run(NO_AGENT_SCRIPT, &link), Some(AGENT_SOCKET_EXIT));
    }
}
