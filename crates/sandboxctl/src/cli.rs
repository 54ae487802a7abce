//! The command line. Global flags are accepted before or after the subcommand's name; everything after
//! `--` is the command's argv.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
#[cfg(test)]
use sandbox_backends::BackendChoice;
pub use sandbox_backends::{BackendArgs, OutDirArg};
#[cfg(test)]
use sandbox_core::Isolation;

use crate::guest_env::EnvArgs;
use crate::keys::KeyArgs;

/// Run commands in sandboxes, move files in and out, list and purge sandboxes, check a host.
#[derive(Debug, Parser)]
#[command(name = "sandboxctl", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// Global flags.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command.
    #[command(subcommand)]
    pub command: CommandLine,
}

/// The exit-code table, repeated by `--help` so scripts need not guess, and the host files refused.
const AFTER_HELP: &str = "\
Exit codes of run and exec:
  0-255  the command's own exit code, verbatim
  124    the --timeout expired (the command's processes were killed, or the sandbox retired)
  125    anything else: a sandbox or engine error, a usage error, a refusal, or a command that
         never started (its --workdir missing, not a directory or not enterable in the guest);
         one line on stderr with the reason, and --json tells it from a command's own 125
         (outcome error, or not_started with the reason)
Exit codes of the other commands:
  0      ok
  2      usage
  64     invalid argument
  65     confinement refusal (an escape, a link)
  66     not found (no sandbox for the key, an absent path)
  67     wrong kind (is a directory, not a directory, not a regular file)
  68     over the transfer cap (--max-bytes)
  69     not permitted (the --min-isolation floor, a capability, a credential path, ...)
  70     engine or sandbox error; a disposal that left something; a failed image build
  71     retired sandbox
  doctor exits 0 when every applicable check passes, else 1.

The default --min-isolation is microvm: the docker backend (rung container) needs
--min-isolation container.

Host files cp-out writes: only a plain new file below the output root (--out-dir DIR, else the
  current directory), reached without following a link:
  - outside the output root, or a root that is not fit (a hidden name on it, or it holds /etc,
    /usr, ... as / does): exit 69, and 64 for a root that is no existing directory;
  - a hidden name (starting with '.') anywhere on the destination's path: exit 69, whatever any
    flag says (~/.tmux.conf, ~/.gdbinit, ~/.config/..., ~/.ipython/..., a project's .git, .envrc);
  - a link on the way or at the destination, even one that stays inside the root: exit 65;
  - an existing file: exit 69 unless --overwrite (which replaces a regular file only; 67 for a
    directory or anything else);
  - behind those rules, the lists: a path a host executes or loads on its own, by any alias
    (~/bin, ~/Library/LaunchAgents, ~/.bashrc's target in a dotfiles directory, /etc/cron*,
    /usr/lib, ...; the full list is in docs/host-files.md; names compared without regard to
    case), a credential path, a backend's host state: exit 69.
Host files cp-in and --env-file read (refused with exit 69):
  never a source that is, contains or lies under a credential path, judged by where the opened
  file really is (links resolved, so a swapped link cannot slip one in): ~/.ssh ~/.aws
  ~/.docker ~/.kube ~/.gnupg ~/.netrc ~/.gitconfig ~/.git-credentials, ~/.config/gh and other
  tool credential files; run as root, also every home directory of /etc/passwd, /etc/shadow,
  /etc/gshadow and /etc/ssh/ssh_host_*. --allow-credential-path (cp-in and cp-out) lifts this
  one refusal; every listed credential path is hidden or where cp-out never writes, so for
  cp-out it lifts nothing today.
  cp-in, cp-out and --env-file never touch a backend's host state: the sbx workspace root
  (another sandbox's workspace and meta.json) and a local Docker engine's data root.
  cp-in and --env-file also refuse files of pseudo file systems (procfs such as
  /proc/self/environ or /proc/cmdline, sysfs, devtmpfs, debugfs, securityfs, cgroup, ...),
  whatever the flag says, and anything but a regular file (67); at most the transfer cap plus
  one byte is ever read (68 over it).
  --env-file takes a regular file of at most 1 MiB; its errors name a line, never its content.";

/// Flags every command takes: the backend's (shared with every host binary) and `--json`.
///
/// It dereferences to the backend flags, so `global.backend` reads as it always has.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// The backend and its configuration.
    #[command(flatten)]
    pub backends: BackendArgs,
    /// Print exactly one JSON object on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

impl std::ops::Deref for GlobalArgs {
    type Target = BackendArgs;

    fn deref(&self) -> &BackendArgs {
        &self.backends
    }
}

/// Where a command runs.
#[derive(Debug, Clone, Args)]
pub struct RunTarget {
    /// The sandbox kind (part of its identity).
    #[arg(long, default_value = "default")]
    pub kind: String,
    /// The working directory in the guest: relative to the storage base, or absolute (the guest's own
    /// directory, which may lie outside the storage base). A missing one is reported as not started.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub workdir: String,
    /// Seconds before the command's processes are killed (exit 124).
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    pub timeout: f64,
    /// Pass this process's stdin to the command (read as the command reads it; its end is the
    /// command's end of file). Without it the command's stdin is closed.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Serve a host tool to the command (repeatable): `host-tool NAME '<json>'` in the guest
    /// runs COMMAND with `/bin/sh -c` on this host, the JSON on its stdin, its stdout the result
    /// (JSON, or text); a non-zero exit is the call's failure. Bounded like any external call
    /// (30 s, 1 MiB, only PATH in its environment). The command's output is then printed when
    /// it ends, not as it arrives; not with -i.
    #[arg(long = "host-tool", value_name = "NAME=COMMAND")]
    pub host_tools: Vec<String>,
    /// Guest environment.
    #[command(flatten)]
    pub env: EnvArgs,
}

/// Which sandbox a file command works on, and the guest directory its paths resolve against.
#[derive(Debug, Clone, Args)]
pub struct FileTarget {
    /// The sandbox kind (part of its identity).
    #[arg(long, default_value = "default")]
    pub kind: String,
    /// The guest directory guest paths resolve against and must stay under: relative to the storage
    /// base, or absolute (the guest's own directory, which may lie outside the storage base).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub workdir: String,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum CommandLine {
    /// Acquire a sandbox (a fresh key unless one is given), run a command, dispose afterwards unless
    /// --keep or a key was given. Exits with the command's own exit code; 124 on timeout; 125 otherwise.
    Run {
        /// The image (default: the locally built default image, built first when missing).
        #[arg(long)]
        image: Option<String>,
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// How and where to run.
        #[command(flatten)]
        target: RunTarget,
        /// Keep the sandbox; its key is printed on stderr.
        #[arg(long)]
        keep: bool,
        /// Let the sandbox reach this host over HTTP(S) through the egress proxy (repeatable; `*.d`
        /// allows the strict subdomains of d). Without it, egress is closed. A kept sandbox's
        /// allowlist cannot change: dispose it first.
        #[arg(long = "allow", value_name = "HOST")]
        allow: Vec<String>,
        /// Let the sandbox reach HOST with these methods and paths only: 'HOST METHODS PATHS',
        /// comma-separated lists, `*` for all (repeatable; e.g. 'api.example.com GET,HEAD /v1/*').
        /// The proxy terminates that host's TLS to judge each request; needs a backend declaring
        /// egress_methods/egress_paths.
        #[arg(long = "rule", value_name = "RULE")]
        rules: Vec<String>,
        /// A credential grant for this sandbox, as a JSON file: {"host", "port" (443), "methods"
        /// ("*"), "paths", "token", "expires_in_secs" or "expires_unix"} (repeatable). The proxy adds
        /// the token to matching HTTPS requests; it never enters the sandbox.
        #[arg(long = "credential-file", value_name = "PATH")]
        credential_files: Vec<std::path::PathBuf>,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        argv: Vec<std::ffi::OsString>,
    },
    /// Run a command in an existing sandbox; never creates one.
    Exec {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// How and where to run.
        #[command(flatten)]
        target: RunTarget,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        argv: Vec<std::ffi::OsString>,
    },
    /// The commands on one existing sandbox's files.
    #[command(flatten)]
    File(FileCommand),
    /// List sandboxes of a scope (default scope: sandboxctl).
    List {
        /// The scope.
        #[arg(long, default_value = crate::keys::GENERATED_SCOPE)]
        scope: String,
        /// Only this conversation.
        #[arg(long)]
        thread: Option<String>,
    },
    /// Dispose of a key's sandboxes: every kind, one kind (--kind) or one instance (--instance).
    Dispose {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// Only this kind (default: every kind of the key).
        #[arg(long)]
        kind: Option<String>,
        /// Only this physical instance (an id from `list` or `run --json`); a stale id disposes of
        /// nothing, never of its replacement.
        #[arg(long, value_name = "ID")]
        instance: Option<String>,
    },
    /// Return an existing sandbox to its state when it was acquired: every file and process made
    /// since is gone, the image and the storage base stay. On Docker the container is made again,
    /// on qemu the VM is restored from its baseline (a new instance id under the same key);
    /// running commands end with the old one.
    Reset {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind.
        #[arg(long, default_value = "default")]
        kind: String,
    },
    /// Copy an existing sandbox's files (on qemu, its memory too) into a new sandbox under another
    /// key (--to); running processes are not copied. Refused when the new key already has a
    /// sandbox of the kind.
    Fork {
        /// The source sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The new sandbox's key.
        #[arg(long, value_name = "SCOPE/THREAD/AGENT")]
        to: String,
        /// The sandbox kind.
        #[arg(long, default_value = "default")]
        kind: String,
        /// The image the source runs (default: the locally built default image).
        #[arg(long)]
        image: Option<String>,
    },
    /// Dispose of every sandbox of a conversation.
    Purge {
        /// The scope.
        #[arg(long)]
        scope: String,
        /// The conversation.
        #[arg(long)]
        thread: String,
    },
    /// Remove every warm pool member the docker backend's servers keep (`sandbox-mcp --pool`):
    /// ready, being filled or mid-claim, of every shape; a sandbox claimed from the pool is its
    /// key's and stays.
    PoolPurge,
    /// Check this host: engine, context, images, kernel features, and a throwaway sandbox whose
    /// egress is proven closed from inside. Reads, never writes, host settings.
    Doctor {
        /// A URL the throwaway sandbox must NOT reach (repeatable, at most two: one naming its host
        /// by address, one by name). Replaces the defaults (`https://1.1.1.1/`, `https://example.com/`).
        #[arg(long = "egress-probe", value_name = "URL")]
        egress_probe: Vec<String>,
    },
    /// Local images.
    Images {
        /// What to do with them.
        #[command(subcommand)]
        action: ImagesAction,
    },
}

/// The commands that work on the files of one existing sandbox: each names it by key and kind, and
/// resolves its guest path against a guest working directory ([`FileTarget`]).
#[derive(Debug, Subcommand)]
pub enum FileCommand {
    /// Copy a local file into a sandbox. Refuses credential paths (~/.ssh, ~/.aws, ...; as root also
    /// /etc/shadow and every user's home) unless --allow-credential-path, and files of pseudo file
    /// systems (/proc, /sys, /dev) always (exit 69).
    CpIn {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// Allow a source under a credential path (~/.ssh, ~/.aws, ...). Pseudo file systems stay refused.
        #[arg(long)]
        allow_credential_path: bool,
        /// The local file.
        local: PathBuf,
        /// The guest path: relative to --workdir, or absolute and under it.
        guest: String,
    },
    /// Copy a file out of a sandbox to a plain new file below the output root (--out-dir, else the
    /// current directory); a refused copy leaves no partial local file. Refuses a hidden name
    /// anywhere on the destination's path, a destination outside the root, an existing file
    /// without --overwrite, one a host executes or loads (~/bin, cron, ...), a credential path or a
    /// backend's host state (exit 69), and a link on the way (exit 65).
    CpOut {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// Allow a destination under a credential path; hidden names and the other rules stay, and
        /// every listed credential path is hidden or where cp-out never writes.
        #[arg(long)]
        allow_credential_path: bool,
        /// The output root (`--out-dir`, else the current directory) and `--overwrite`, shared
        /// with every host.
        #[command(flatten)]
        out: OutDirArg,
        /// The largest file accepted.
        #[arg(long, value_name = "N", default_value_t = 8 * 1024 * 1024)]
        max_bytes: u64,
        /// The guest path: relative to --workdir, or absolute and under it.
        guest: String,
        /// The local file to write.
        local: PathBuf,
    },
    /// Describe a guest path (exit 66 when absent).
    Stat {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// The guest path: relative to --workdir, or absolute and under it.
        guest: String,
    },
    /// List one guest directory.
    Ls {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// The guest directory: relative to --workdir (default: --workdir itself), or absolute and under it.
        #[arg(default_value = ".")]
        guest: String,
    },
    /// Remove a guest path.
    Rm {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// Remove a directory and everything under it.
        #[arg(short = 'r', long)]
        recursive: bool,
        /// The guest path: relative to --workdir, or absolute and under it.
        guest: String,
    },
    /// Remove a call's directory and everything under it, within a bound: a directory strictly under
    /// --workdir, or an absolute one the backend's placement guards accept; never --workdir itself.
    Reclaim {
        /// The sandbox's key.
        #[command(flatten)]
        key: KeyArgs,
        /// The sandbox kind and the guest working directory.
        #[command(flatten)]
        target: FileTarget,
        /// Seconds the removal may take (exit 70 when it expires).
        #[arg(long, value_name = "SECS", default_value_t = 60.0)]
        timeout: f64,
        /// The directory to remove.
        directory: String,
    },
}

impl FileCommand {
    /// The guest path the command names and the target it resolves against.
    pub fn guest_and_target(&self) -> (&str, &FileTarget) {
        match self {
            FileCommand::CpIn { guest, target, .. }
            | FileCommand::CpOut { guest, target, .. }
            | FileCommand::Stat { guest, target, .. }
            | FileCommand::Ls { guest, target, .. }
            | FileCommand::Rm { guest, target, .. }
            | FileCommand::Reclaim {
                directory: guest,
                target,
                ..
            } => (guest, target),
        }
    }
}

/// `images` subcommands.
#[derive(Debug, Subcommand)]
pub enum ImagesAction {
    /// Build the local images (default: the default image), skipping those that exist; `vm`
    /// builds the microVM image (kernel, initramfs with the static `vm-agent`, ext4 root).
    Build {
        /// Tags to build (`vm` for the microVM image).
        tags: Vec<String>,
    },
}

impl CommandLine {
    /// Whether this command's exit codes follow the `run`/`exec` table (command codes, 124, 125).
    pub fn runs_a_command(&self) -> bool {
        matches!(self, CommandLine::Run { .. } | CommandLine::Exec { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_before_or_after_the_subcommand() {
        let a = Cli::try_parse_from([
            "sandboxctl",
            "--json",
            "--min-isolation",
            "container",
            "run",
            "--",
            "echo",
            "--json",
        ])
        .unwrap();
        let b = Cli::try_parse_from([
            "sandboxctl",
            "run",
            "--json",
            "--min-isolation",
            "container",
            "--",
            "echo",
            "--json",
        ])
        .unwrap();
        for cli in [a, b] {
            assert!(cli.global.json);
            assert_eq!(cli.global.min_isolation, Isolation::Container);
            match cli.command {
                CommandLine::Run { argv, .. } => assert_eq!(argv, vec!["echo", "--json"]),
                other => panic!("parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn file_commands_default_to_the_storage_base_and_take_a_workdir() {
        for command in ["stat", "ls", "rm", "reclaim"] {
            let parsed = |extra: &[&str]| {
                let mut args = vec!["sandboxctl", command, "--key", "s/t/a"];
                args.extend_from_slice(extra);
                args.push("x");
                match Cli::try_parse_from(args).unwrap().command {
                    CommandLine::File(file) => {
                        let (guest, target) = file.guest_and_target();
                        assert_eq!(guest, "x", "{command}");
                        target.clone()
                    }
                    other => panic!("parsed as {other:?}"),
                }
            };
            assert_eq!(parsed(&[]).workdir, ".", "{command}");
            assert_eq!(parsed(&[]).kind, "default", "{command}");
            assert_eq!(parsed(&["--workdir", "/w/o"]).workdir, "/w/o", "{command}");
        }
        let cli =
            Cli::try_parse_from(["sandboxctl", "reclaim", "--key", "s/t/a", "calls/c1"]).unwrap();
        assert!(
            matches!(cli.command, CommandLine::File(FileCommand::Reclaim { timeout, directory, .. }) if timeout == 60.0 && directory == "calls/c1")
        );
        let cli = Cli::try_parse_from([
            "sandboxctl",
            "dispose",
            "--key",
            "s/t/a",
            "--instance",
            "abc",
        ])
        .unwrap();
        assert!(
            matches!(cli.command, CommandLine::Dispose { kind: None, instance: Some(id), .. } if id == "abc")
        );
    }

    #[test]
    fn copies_are_file_commands_with_their_own_positional_order() {
        let cli =
            Cli::try_parse_from(["sandboxctl", "cp-in", "--key", "s/t/a", "/l", "g"]).unwrap();
        assert!(
            matches!(&cli.command, CommandLine::File(FileCommand::CpIn { local, guest, .. }) if local.as_os_str() == "/l" && guest == "g")
        );
        let cli =
            Cli::try_parse_from(["sandboxctl", "cp-out", "--key", "s/t/a", "g", "/l"]).unwrap();
        match &cli.command {
            CommandLine::File(file @ FileCommand::CpOut { local, .. }) => {
                assert_eq!(local.as_os_str(), "/l");
                assert_eq!(file.guest_and_target().0, "g");
            }
            other => panic!("parsed as {other:?}"),
        }
        for listing in [&["list"][..], &["purge", "--scope", "s", "--thread", "t"]] {
            let cli = Cli::try_parse_from([&["sandboxctl"][..], listing].concat()).unwrap();
            assert!(
                !matches!(cli.command, CommandLine::File(_)),
                "{listing:?} works on no sandbox's files"
            );
        }
    }

    #[test]
    fn run_takes_repeated_allowed_hosts_and_the_proxy_settings() {
        let cli = Cli::try_parse_from([
            "sandboxctl",
            "--outbound-network",
            "egress-net",
            "run",
            "--allow",
            "a.test",
            "--allow",
            "*.b.test",
            "--",
            "true",
        ])
        .unwrap();
        assert_eq!(cli.global.outbound_network, "egress-net");
        assert_eq!(cli.global.egress_proxy_image, "sandbox-egress-proxy:local");
        match cli.command {
            CommandLine::Run { allow, .. } => assert_eq!(allow, ["a.test", "*.b.test"]),
            other => panic!("parsed as {other:?}"),
        }
        let plain = Cli::try_parse_from(["sandboxctl", "run", "--", "true"]).unwrap();
        assert_eq!(plain.global.outbound_network, "bridge");
        assert!(matches!(plain.command, CommandLine::Run { allow, .. } if allow.is_empty()));
    }

    #[test]
    fn process_is_not_a_rung() {
        assert!(Cli::try_parse_from(["sandboxctl", "--min-isolation", "process", "list"]).is_err());
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["sandboxctl", "run", "--", "true"]).unwrap();
        assert_eq!(cli.global.backend, BackendChoice::Docker);
        assert_eq!(cli.global.min_isolation, Isolation::Microvm);
        match cli.command {
            CommandLine::Run { target, keep, .. } => {
                assert_eq!(target.timeout, 600.0);
                assert_eq!(target.kind, "default");
                assert!(!keep);
            }
            other => panic!("parsed as {other:?}"),
        }
    }
}
