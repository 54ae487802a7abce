//! The command line, as `sbx` spells it. A parse failure is a usage error: clap prints the usage
//! on stderr and the process exits 2.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `sbx-sim`: a stand-in for Docker's `sbx` CLI, backed by the Docker engine.
#[derive(Debug, Parser)]
#[command(
    name = "sbx",
    disable_version_flag = true,
    about = "A stand-in for Docker's sbx CLI backed by Docker containers (isolation: container, not a microVM)"
)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Every command the simulator answers.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print what this program is.
    Version,
    /// List the sandboxes of this state home.
    Ls {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Create a sandbox.
    Create(CreateArgs),
    /// Run a command in a sandbox, relaying its bytes and exiting with its status.
    Exec(ExecArgs),
    /// Remove sandboxes (never their workspace).
    Rm {
        /// Remove running sandboxes too.
        #[arg(short = 'f', long)]
        force: bool,
        /// Remove every sandbox of this state home (needs --force).
        #[arg(long, requires = "force", conflicts_with = "names")]
        all: bool,
        /// The sandboxes.
        #[arg(required_unless_present = "all")]
        names: Vec<String>,
    },
    /// Read or change a setting.
    Settings {
        /// What to do.
        #[command(subcommand)]
        action: SettingsAction,
    },
    /// The registered MCP servers.
    Mcp {
        /// What to do.
        #[command(subcommand)]
        action: McpAction,
    },
    /// The daemon.
    Daemon {
        /// What to do.
        #[command(subcommand)]
        action: DaemonAction,
    },
    /// Log in (clears the `login-lapsed` fault).
    Login {
        /// The user name.
        #[arg(long)]
        username: Option<String>,
        /// Read the password from stdin (read and discarded).
        #[arg(long, requires = "username")]
        password_stdin: bool,
    },
    /// Log out (sets the `login-lapsed` fault).
    Logout,
    /// Stored secrets (always none).
    Secret {
        /// What to do.
        #[command(subcommand)]
        action: SecretAction,
    },
    /// Network policy (recorded, never enforced).
    Policy {
        /// What to do.
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// The simulator's own controls.
    Sim {
        /// What to do.
        #[command(subcommand)]
        action: SimAction,
    },
}

/// `create shell --name N --cpus C --memory M [--skills off] [--deny-network R] [--template T] <dir>`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The agent: only `shell` is known.
    pub agent: String,
    /// The sandbox name.
    #[arg(long)]
    pub name: String,
    /// CPUs (clamped to the host's count).
    #[arg(long, default_value = "2")]
    pub cpus: String,
    /// Memory limit, e.g. `2g`.
    #[arg(long, default_value = "2g")]
    pub memory: String,
    /// Agent skills (accepted, no effect).
    #[arg(long)]
    pub skills: Option<String>,
    /// Network resources to deny; `**` means no network at all.
    #[arg(long = "deny-network")]
    pub deny_network: Vec<String>,
    /// The template: `shell` or an image reference.
    #[arg(long)]
    pub template: Option<String>,
    /// The workspace: an existing absolute directory.
    pub workspace: PathBuf,
}

/// `exec [-i] [-u USER] [-w DIR] [-e K=V]… N cmd [args…]`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Pass stdin through to the command.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Allocate a terminal (refused: the simulator never has one).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Run as this user (`root` = 0:0).
    #[arg(short = 'u', long)]
    pub user: Option<String>,
    /// Working directory (default: the workspace).
    #[arg(short = 'w', long)]
    pub workdir: Option<String>,
    /// An environment entry `K=V` (repeatable).
    #[arg(short = 'e', long = "env")]
    pub env: Vec<String>,
    /// The sandbox.
    pub name: String,
    /// The command and its arguments, passed through untouched.
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    pub command: Vec<OsString>,
}

/// `settings …`.
#[derive(Debug, Subcommand)]
pub enum SettingsAction {
    /// Print a setting.
    Get {
        /// The key.
        key: String,
    },
    /// Change a setting.
    Set {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
}

/// `mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpAction {
    /// List servers.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Register a server.
    Add {
        /// Its name.
        name: String,
        /// Its URL.
        url: String,
    },
    /// Remove a server.
    Rm {
        /// Its name.
        name: String,
    },
}

/// `daemon …`.
#[derive(Debug, Subcommand)]
pub enum DaemonAction {
    /// Capture the settings, as a restarted daemon would.
    Restart,
}

/// `secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretAction {
    /// List secrets.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// List rules (always none).
    Ls {
        /// A sandbox.
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a destination.
    Check {
        /// What to check.
        #[command(subcommand)]
        kind: PolicyCheck,
    },
    /// Allow destinations (recorded, never enforced).
    Allow {
        /// The rule.
        #[command(subcommand)]
        kind: PolicyRule,
    },
    /// Deny destinations (recorded).
    Deny {
        /// The rule.
        #[command(subcommand)]
        kind: PolicyRule,
    },
    /// Remove rules (refused: allow rules cannot be enforced, so they cannot be relaxed either).
    Rm {
        /// The rule.
        #[command(subcommand)]
        kind: PolicyRemove,
    },
}

/// `policy check network --json H`.
#[derive(Debug, Subcommand)]
pub enum PolicyCheck {
    /// A network destination.
    Network {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The host.
        host: String,
    },
}

/// `policy allow|deny network …`.
#[derive(Debug, Subcommand)]
pub enum PolicyRule {
    /// Network destinations.
    Network(PolicyNetworkArgs),
}

/// The fields of a network rule.
#[derive(Debug, Args, serde::Serialize)]
pub struct PolicyNetworkArgs {
    /// The sandbox (global when absent).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Protocols, comma-separated.
    #[arg(long)]
    pub protocol: Option<String>,
    /// HTTP methods, comma-separated, or `ANY`.
    #[arg(long)]
    pub method: Option<String>,
    /// HTTP path.
    #[arg(long)]
    pub path: Option<String>,
    /// Resources, comma-separated.
    pub resources: String,
}

/// `policy rm network …`.
#[derive(Debug, Subcommand)]
pub enum PolicyRemove {
    /// Network rules.
    Network {
        /// The sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// The resource pattern.
        #[arg(long)]
        resource: String,
        /// Do not ask.
        #[arg(long)]
        force: bool,
    },
}

/// `sim …`.
#[derive(Debug, Subcommand)]
pub enum SimAction {
    /// Fault switches.
    Fault {
        /// What to do.
        #[command(subcommand)]
        action: FaultAction,
    },
    /// Remove every container and record of this state home.
    Reset,
    /// Check docker, the template image and user namespaces.
    Doctor,
    /// Internal: the detached create worker.
    #[command(hide = true)]
    CreateWorker {
        /// The request file.
        request: PathBuf,
    },
    /// Internal: the detached idle watcher of one sandbox.
    #[command(hide = true)]
    IdleWatch {
        /// The sandbox.
        name: String,
    },
}

/// `sim fault …`.
#[derive(Debug, Subcommand)]
pub enum FaultAction {
    /// Set `NAME[=VALUE]`.
    Set {
        /// The switch.
        spec: String,
    },
    /// Clear one switch, or all.
    Clear {
        /// The switch name.
        name: Option<String>,
    },
    /// List the switches in force.
    Ls,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("sbx").chain(args.iter().copied()))
    }

    #[test]
    fn every_catalogue_invocation_parses() {
        let lines: &[&[&str]] = &[
            &["version"],
            &["settings", "get", "ssh.agentForwardingEnabled"],
            &["settings", "set", "sim.idleStopSeconds", "1"],
            &["mcp", "ls", "--json"],
            &["mcp", "add", "x", "http://127.0.0.1:9/"],
            &["mcp", "rm", "x"],
            &["ls", "--json"],
            &["ls"],
            &[
                "create",
                "shell",
                "--name",
                "maf-a",
                "--cpus",
                "2",
                "--memory",
                "2g",
                "--skills",
                "off",
                "--deny-network",
                "**",
                "--template",
                "img:tag",
                "/tmp/ws",
            ],
            &["exec", "sb", "sh", "-c", "pwd -P"],
            &["exec", "-u", "root", "sb", "sh", "-c", "x", "maf-sbx", "/p"],
            &[
                "exec", "-i", "-w", "/", "-e", "A=1", "-e", "B=2", "sb", "cat",
            ],
            &["rm", "--force", "sb"],
            &["rm", "-f", "a", "b"],
            &["rm", "--all", "--force"],
            &["daemon", "restart"],
            &["login"],
            &["login", "--username", "u", "--password-stdin"],
            &["logout"],
            &["secret", "ls", "--json"],
            &["policy", "ls", "--json"],
            &["policy", "ls", "sb", "--json"],
            &["policy", "check", "network", "--json", "example.com"],
            &[
                "policy",
                "deny",
                "network",
                "--sandbox",
                "sb",
                "--protocol",
                "tcp,udp",
                "**",
            ],
            &[
                "policy",
                "allow",
                "network",
                "--sandbox",
                "sb",
                "a.com,b.com",
            ],
            &[
                "policy",
                "allow",
                "network",
                "--sandbox",
                "sb",
                "a.com",
                "--method",
                "GET",
                "--path",
                "/x",
            ],
            &[
                "policy",
                "rm",
                "network",
                "--sandbox",
                "sb",
                "--resource",
                "**",
                "--force",
            ],
            &["sim", "fault", "set", "slow-create=3"],
            &["sim", "fault", "clear"],
            &["sim", "fault", "clear", "hung-exec"],
            &["sim", "fault", "ls"],
            &["sim", "reset"],
            &["sim", "doctor"],
            &["sim", "create-worker", "/tmp/req.json"],
            &["sim", "idle-watch", "sb"],
        ];
        for line in lines {
            parse(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        }
    }

    #[test]
    fn the_exec_command_is_passed_through_verbatim() {
        let cli = parse(&[
            "exec",
            "-u",
            "root",
            "sb",
            "sh",
            "-c",
            "echo -n x",
            "--",
            "-e",
            "",
        ])
        .unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(exec.user.as_deref(), Some("root"));
        assert_eq!(exec.name, "sb");
        assert_eq!(exec.command, ["sh", "-c", "echo -n x", "--", "-e", ""]);
        assert!(exec.env.is_empty() && !exec.interactive && !exec.tty);
    }

    #[test]
    fn malformed_command_lines_are_usage_errors() {
        let lines: &[&[&str]] = &[
            &[],
            &["bogus"],
            &["ls", "--yaml"],
            &["exec", "sb"],
            &["exec"],
            &["rm"],
            &["rm", "--all"],
            &["rm", "--all", "--force", "sb"],
            &["create", "shell", "/tmp/ws"],
            &["settings", "get"],
            &["login", "--password-stdin"],
            &["sim", "fault", "set"],
            &["--version"],
        ];
        for line in lines {
            let err = parse(line).expect_err(&format!("{line:?}"));
            assert!(
                !matches!(
                    err.kind(),
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
                ),
                "{line:?}"
            );
            assert_eq!(err.exit_code(), 2, "{line:?}");
            assert!(err.use_stderr(), "{line:?}");
        }
    }
}
