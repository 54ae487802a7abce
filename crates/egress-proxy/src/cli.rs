//! The command line of the `egress-proxy` binary and the start-up of each role.
//!
//! The command line builds a [`Policy`] only through [`ProxyArgs::policy`], whose address
//! policy never dials loopback: no flag reaches the test-only permission.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::address::AddressPolicy;
use crate::error::{invalid_config, io_error, ProxyError};
use crate::hostmatch::Allowlist;
use crate::proxy::{Limits, Policy, DEFAULT_PORTS};
use crate::rules::{Grant, HttpRule, HttpRules};
use crate::serve::Reply;
use crate::tls::{Terminator, UpstreamRoots};

/// The line the proxy prints on stdout once it serves.
pub const READY_LINE: &str = "maf-egress-proxy ready v1";

/// The filtering egress proxy of the Docker backend's allowlist mode.
#[derive(Debug, Parser)]
#[command(name = "egress-proxy", version)]
pub struct Cli {
    /// The role to run.
    #[command(subcommand)]
    pub role: Role,
}

/// The roles of the binary.
#[derive(Debug, Subcommand)]
pub enum Role {
    /// The filtering proxy, on a Unix socket.
    Proxy(ProxyArgs),
    /// The workload-side forwarder: TCP to the proxy's Unix socket.
    Forward(ForwardArgs),
    /// A tiny HTTP server answering every request 200 (tests and benchmarks).
    Serve(ServeArgs),
    /// Prints every address of the interfaces of its network namespace, one a line, then
    /// `end <count>` (run by the backend in the engine host's namespace, whose addresses the
    /// proxy then denies).
    HostAddresses,
}

/// `egress-proxy proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The Unix socket to listen on (a stale socket file is replaced; mode 0666).
    #[arg(long)]
    pub socket: PathBuf,
    /// Also take client connections forwarders hand off on this Unix socket (replaced and made
    /// mode 0666 as `--socket`).
    #[arg(long)]
    pub handoff_socket: Option<PathBuf>,
    /// Where to copy this executable (mode 0755) for the forwarder.
    #[arg(long)]
    pub install_forwarder: PathBuf,
    /// An allowed host: `name` or `*.domain` (repeatable, at least one).
    #[arg(long = "allow", required = true)]
    pub allow: Vec<String>,
    /// Also dial private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7).
    #[arg(long)]
    pub allow_private: bool,
    /// An allowed destination port (repeatable; default 80 and 443).
    #[arg(long = "port")]
    pub ports: Vec<u16>,
    /// An address never dialled (repeatable; the engine host's interface addresses and the
    /// outbound network's gateways).
    #[arg(long = "deny-address")]
    pub deny_addresses: Vec<IpAddr>,
    /// A method and path rule, `HOST METHODS PATHS` (repeatable; e.g.
    /// `api.example.com GET,HEAD /v1/*,/health`; `*` for any method). Tunnels to a host with
    /// rules are terminated and each request judged.
    #[arg(long = "rule")]
    pub rules: Vec<String>,
    /// Read configuration from standard input, one JSON object a line, until it ends: credential
    /// grants, `{"rule": "HOST METHODS PATHS"}` lines and `{"upstream_ca_pem": "PEM"}` bundles
    /// (never give a token in an argument or the environment).
    #[arg(long = "stdin-config", alias = "grants-stdin")]
    pub stdin_config: bool,
    /// Where to write the proxy's CA certificate (PEM, mode 0644) for the workload to trust;
    /// required with rules or grants. The CA's key is never written.
    #[arg(long)]
    pub ca_cert_out: Option<PathBuf>,
    /// A PEM bundle of further roots to verify upstreams against, beside the public roots
    /// (repeatable).
    #[arg(long = "upstream-ca")]
    pub upstream_cas: Vec<PathBuf>,
}

/// `egress-proxy forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// The TCP address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The proxy's Unix socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The proxy's handoff socket: each connection is passed there first, and relayed to
    /// `--socket` only when that fails.
    #[arg(long)]
    pub handoff_socket: Option<PathBuf>,
}

/// `egress-proxy serve`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("reply").required(true).args(["body", "size"])))]
pub struct ServeArgs {
    /// The TCP address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The body of every answer.
    #[arg(long)]
    pub body: Option<String>,
    /// Answer with this many bytes of filler instead.
    #[arg(long)]
    pub size: Option<u64>,
    /// Speak TLS under this PEM certificate chain (a test origin's; needs `--tls-key-pem`).
    #[arg(long, requires = "tls_key_pem", allow_hyphen_values = true)]
    pub tls_cert_pem: Option<String>,
    /// The PEM private key of `--tls-cert-pem` (a test origin's, never a secret worth keeping).
    #[arg(long, requires = "tls_cert_pem", allow_hyphen_values = true)]
    pub tls_key_pem: Option<String>,
    /// Print one JSON line per request on stdout: its request line and its `Authorization`.
    #[arg(long)]
    pub log_requests: bool,
    /// Answer every request `302 Found` with this `Location` (a redirecting test origin).
    #[arg(long)]
    pub redirect: Option<String>,
}

impl ProxyArgs {
    /// The policy these arguments describe, without standard input's configuration.
    ///
    /// # Errors
    /// As [`ProxyArgs::policy_with`].
    pub fn policy(&self) -> Result<Policy, ProxyError> {
        self.policy_with(StdinConfig::default())
    }

    /// The policy these arguments describe, with what standard input gave (grants, further rules
    /// and upstream bundles); it terminates TLS (a fresh CA) when there is any rule or grant.
    ///
    /// # Errors
    /// An allowlist entry the grammar refuses, port 0, a bad rule, a grant for a host off the
    /// allowlist, rules or grants without `--ca-cert-out`, an unreadable `--upstream-ca`, or a CA
    /// that cannot be made.
    pub fn policy_with(&self, input: StdinConfig) -> Result<Policy, ProxyError> {
        let allow = Allowlist::new(&self.allow)?;
        let rules = self
            .rules
            .iter()
            .chain(&input.rules)
            .map(|rule| HttpRule::parse(rule))
            .collect::<Result<Vec<_>, _>>()?;
        let http = HttpRules::new(rules, input.grants);
        if let Some(host) = http.granted_hosts().find(|host| !allow.allows_name(host)) {
            return Err(invalid_config(format!(
                "a credential grant names {host}, which is not on the allowlist"
            )));
        }
        let terminator = if http.is_empty() {
            None
        } else {
            if self.ca_cert_out.is_none() {
                return Err(invalid_config(
                    "rules and grants need --ca-cert-out (the workload must trust the proxy's CA)",
                ));
            }
            let mut roots = UpstreamRoots {
                public: true,
                extra: Vec::new(),
            };
            for bundle in &self.upstream_cas {
                roots.add_pem_file(bundle)?;
            }
            for pem in &input.upstream_pems {
                roots.add_pem(pem.as_bytes(), "an upstream_ca_pem line")?;
            }
            Some(Arc::new(Terminator::new(&roots)?))
        };
        let ports: BTreeSet<u16> = if self.ports.is_empty() {
            DEFAULT_PORTS.into_iter().collect()
        } else {
            self.ports.iter().copied().collect()
        };
        if ports.contains(&0) {
            return Err(invalid_config("port 0 is not a destination port"));
        }
        Ok(Policy {
            allow,
            ports,
            addresses: AddressPolicy::new(self.allow_private, self.deny_addresses.iter().copied()),
            limits: Limits::default(),
            http,
            terminator,
            hosts: Default::default(),
            observer: None,
        })
    }
}

/// The most grant input read from standard input.
pub const MAX_GRANTS_INPUT: u64 = 1024 * 1024;

/// How long the proxy waits for its grants' input to end.
pub const GRANTS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// What the proxy's standard input configures (`--stdin-config`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdinConfig {
    /// Credential grants.
    pub grants: Vec<Grant>,
    /// Method and path rules, `HOST METHODS PATHS` as `--rule`.
    pub rules: Vec<String>,
    /// PEM bundles of further upstream roots, as `--upstream-ca`.
    pub upstream_pems: Vec<String>,
}

/// Parses the configuration lines of at most [`MAX_GRANTS_INPUT`] bytes of `input` (blank lines
/// skipped): a JSON object with the one key `rule` (a rule's text), or the one key
/// `upstream_ca_pem` (a PEM bundle), or a grant ([`Grant::parse`]).
///
/// # Errors
/// Input past the cap, input that is not UTF-8, or a line refused (named by its number, never
/// quoting a value).
pub fn read_stdin_config(input: impl std::io::Read) -> Result<StdinConfig, ProxyError> {
    let mut config = StdinConfig::default();
    for (at, line) in read_lines(input)?.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Option<serde_json::Value> = serde_json::from_str(line).ok();
        let single = value
            .as_ref()
            .and_then(|v| v.as_object())
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next());
        match single {
            Some((key, serde_json::Value::String(text))) if key == "rule" => {
                config.rules.push(text.clone());
            }
            Some((key, serde_json::Value::String(pem))) if key == "upstream_ca_pem" => {
                config.upstream_pems.push(pem.clone());
            }
            _ => config.grants.push(Grant::parse(line, at + 1)?),
        }
    }
    Ok(config)
}

/// Parses grant lines (blank lines skipped) from at most [`MAX_GRANTS_INPUT`] bytes of `input`.
///
/// # Errors
/// Input past the cap, input that is not UTF-8, or a line [`Grant::parse`] refuses.
pub fn read_grants(input: impl std::io::Read) -> Result<Vec<Grant>, ProxyError> {
    read_lines(input)?
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(at, line)| Grant::parse(line, at + 1))
        .collect()
}

/// At most [`MAX_GRANTS_INPUT`] bytes of UTF-8 from `input`.
fn read_lines(input: impl std::io::Read) -> Result<String, ProxyError> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    input
        .take(MAX_GRANTS_INPUT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("reading the grants from", "stdin", e))?;
    if bytes.len() as u64 > MAX_GRANTS_INPUT {
        return Err(invalid_config("the grants' input is larger than 1 MiB"));
    }
    String::from_utf8(bytes).map_err(|_| invalid_config("the grants are not UTF-8"))
}

/// Reads the configuration from this process's standard input, waiting at most
/// [`GRANTS_DEADLINE`] for it to end.
fn read_config_from_stdin() -> Result<StdinConfig, ProxyError> {
    let (sender, receiver) = std::sync::mpsc::channel();
    // A reader blocked on an input that never ends stays behind; the process then fails.
    std::thread::spawn(move || {
        let _ = sender.send(read_stdin_config(std::io::stdin().lock()));
    });
    receiver
        .recv_timeout(GRANTS_DEADLINE)
        .map_err(|_| invalid_config("standard input did not end within 30 s with the grants"))?
}

/// Writes `pem` to `dest`, mode 0644, through a temporary file renamed into place.
///
/// # Errors
/// Any failure writing the file.
pub fn write_ca_cert(dest: &Path, pem: &str) -> Result<(), ProxyError> {
    put_in_place(dest, 0o644, |temp| {
        std::fs::write(temp, pem).map_err(|e| io_error("writing the CA certificate to", temp, e))
    })
}

/// Copies this process's executable to `dest`, mode 0755, through a temporary file in the
/// same directory renamed into place.
///
/// # Errors
/// Any failure reading the executable or writing the copy.
pub fn install_forwarder(dest: &Path) -> Result<(), ProxyError> {
    let source = Path::new("/proc/self/exe");
    put_in_place(dest, 0o755, |temp| {
        std::fs::copy(source, temp)
            .map(drop)
            .map_err(|e| io_error("copying the executable to", temp, e))
    })
}

/// Writes `dest` whole or not at all: `fill` writes a temporary file beside it, which gets `mode`
/// and is renamed into place; on any failure the temporary file is removed.
fn put_in_place(
    dest: &Path,
    mode: u32,
    fill: impl FnOnce(&Path) -> Result<(), ProxyError>,
) -> Result<(), ProxyError> {
    let temp = temp_beside(dest)?;
    let result = fill(&temp)
        .and_then(|()| {
            std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io_error("setting the mode of", &temp, e))
        })
        .and_then(|()| {
            std::fs::rename(&temp, dest).map_err(|e| io_error("renaming into place", dest, e))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// The temporary file a copy to `dest` is written to first: in `dest`'s own directory (the
/// working directory for a bare name), so the rename into place never crosses file systems.
fn temp_beside(dest: &Path) -> Result<PathBuf, ProxyError> {
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .ok_or_else(|| invalid_config("--install-forwarder names no file"))?;
    Ok(dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Binds the proxy's socket: a stale socket file is removed first (anything else there is an
/// error), and the socket is made mode 0666.
///
/// # Errors
/// Something other than a socket at `path`, or a bind or chmod failure.
pub fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, ProxyError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path)
                .map_err(|e| io_error("removing the stale socket", path, e))?;
        }
        Ok(_) => {
            return Err(io_error(
                "binding",
                path,
                std::io::Error::new(std::io::ErrorKind::AlreadyExists, "not a socket"),
            ))
        }
        Err(_) => {}
    }
    let listener =
        tokio::net::UnixListener::bind(path).map_err(|e| io_error("binding", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| io_error("setting the mode of", path, e))?;
    Ok(listener)
}

/// Runs `role` until it fails or the process gets SIGTERM or SIGINT (then `Ok`): as PID 1 of a
/// container without an init, a process that installs no handler ignores SIGTERM.
async fn until_terminated(
    role: impl std::future::Future<Output = std::io::Result<()>>,
) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::select! {
        result = role => result,
        _ = term.recv() => Ok(()),
        _ = interrupt.recv() => Ok(()),
    }
}

/// One thread for every role: a request's work between its system calls is small, and on a
/// two-core machine a second worker only hands wake-ups between threads (measured: the proxied
/// 1 MiB GET 1.06 against 1.115 times the direct one with two workers).
fn runtime() -> Result<tokio::runtime::Runtime, ProxyError> {
    tokio::runtime::Builder::new_current_thread()
        // Name lookups run on blocking threads; the proxy's container has a small pids limit.
        .max_blocking_threads(16)
        .enable_all()
        .build()
        .map_err(|e| io_error("starting the runtime", "", e))
}

/// Runs the role `cli` names until it fails.
///
/// # Errors
/// Bad configuration, a start-up failure, or a listener that stops accepting.
pub fn run(cli: Cli) -> Result<(), ProxyError> {
    match cli.role {
        Role::Proxy(args) => {
            let input = if args.stdin_config {
                read_config_from_stdin()?
            } else {
                StdinConfig::default()
            };
            let policy = Arc::new(args.policy_with(input)?);
            if let (Some(terminator), Some(dest)) = (&policy.terminator, &args.ca_cert_out) {
                write_ca_cert(dest, &terminator.authority_pem())?;
            }
            install_forwarder(&args.install_forwarder)?;
            let runtime = runtime()?;
            runtime.block_on(async {
                let listener = bind_socket(&args.socket)?;
                let handoffs = args
                    .handoff_socket
                    .as_deref()
                    .map(bind_socket)
                    .transpose()?;
                let stdout = std::io::stdout();
                let mut out = stdout.lock();
                writeln!(out, "{READY_LINE}")
                    .and_then(|()| out.flush())
                    .map_err(|e| io_error("writing the ready line to", "stdout", e))?;
                drop(out);
                until_terminated(crate::proxy::serve(listener, handoffs, policy))
                    .await
                    .map_err(|e| io_error("accepting on", &args.socket, e))
            })
        }
        Role::Forward(args) => runtime()?.block_on(async {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .map_err(|e| io_error("binding", args.listen.to_string(), e))?;
            let upstream = crate::forward::Upstream {
                socket: args.socket,
                handoff: args.handoff_socket,
            };
            until_terminated(crate::forward::serve(listener, upstream))
                .await
                .map_err(|e| io_error("accepting on", args.listen.to_string(), e))
        }),
        Role::HostAddresses => {
            let addresses = interface_addresses()?;
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            out.write_all(host_addresses_listing(&addresses).as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| io_error("writing the addresses to", "stdout", e))
        }
        Role::Serve(args) => {
            let reply = match (args.body, args.size) {
                (Some(text), _) => Reply::Text(text),
                (None, Some(size)) => Reply::Filler(size),
                (None, None) => return Err(invalid_config("give --body or --size")),
            };
            let tls = match (&args.tls_cert_pem, &args.tls_key_pem) {
                (Some(cert), Some(key)) => Some(crate::serve::tls_config(cert, key)?),
                _ => None,
            };
            let options = crate::serve::Options {
                tls,
                log_requests: args.log_requests,
                redirect: args.redirect,
            };
            runtime()?.block_on(async {
                let listener = tokio::net::TcpListener::bind(args.listen)
                    .await
                    .map_err(|e| io_error("binding", args.listen.to_string(), e))?;
                until_terminated(crate::serve::serve_with(listener, reply, options))
                    .await
                    .map_err(|e| io_error("accepting on", args.listen.to_string(), e))
            })
        }
    }
}

/// The end line of the `host-addresses` listing: a listing without it was cut short.
pub const HOST_ADDRESSES_END: &str = "end";

/// Every address of every interface of this process's network namespace, up or down, sorted
/// and without repeats.
///
/// # Errors
/// The interfaces cannot be listed.
pub fn interface_addresses() -> Result<Vec<IpAddr>, ProxyError> {
    let mut addresses: Vec<IpAddr> = if_addrs::get_if_addrs()
        .map_err(|e| io_error("listing the interfaces of", "this network namespace", e))?
        .into_iter()
        .map(|interface| interface.ip())
        .collect();
    addresses.sort();
    addresses.dedup();
    Ok(addresses)
}

/// The `host-addresses` output: one address a line, then `end <count>`.
pub fn host_addresses_listing(addresses: &[IpAddr]) -> String {
    let mut text: String = addresses.iter().map(|ip| format!("{ip}\n")).collect();
    text.push_str(&format!("{HOST_ADDRESSES_END} {}\n", addresses.len()));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarder_copy_is_written_beside_its_destination() {
        let pid = std::process::id();
        assert_eq!(
            temp_beside(Path::new("/run/maf-egress/forward")).unwrap(),
            PathBuf::from(format!("/run/maf-egress/.forward.tmp-{pid}"))
        );
        assert_eq!(
            temp_beside(Path::new("forward")).unwrap(),
            PathBuf::from(format!("./.forward.tmp-{pid}"))
        );
        assert!(temp_beside(Path::new("/")).is_err());
    }

    #[test]
    fn the_host_addresses_role_lists_this_namespace_and_says_where_it_ends() {
        let role = Cli::try_parse_from(["egress-proxy", "host-addresses"]).unwrap();
        assert!(matches!(role.role, Role::HostAddresses));
        let addresses = interface_addresses().unwrap();
        // Every namespace has its loopback, and the listing names each address once.
        assert!(
            addresses.contains(&"127.0.0.1".parse().unwrap()),
            "{addresses:?}"
        );
        let text = host_addresses_listing(&addresses);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), addresses.len() + 1);
        assert_eq!(
            lines.last(),
            Some(&format!("end {}", addresses.len()).as_str())
        );
        for (line, ip) in lines.iter().zip(&addresses) {
            assert_eq!(line.parse::<IpAddr>().unwrap(), *ip);
        }
    }

    fn proxy_args(extra: &[&str]) -> Result<ProxyArgs, clap::Error> {
        let mut argv = vec![
            "egress-proxy",
            "proxy",
            "--socket",
            "/s",
            "--install-forwarder",
            "/f",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|cli| match cli.role {
            Role::Proxy(args) => args,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn no_flag_lets_the_command_line_dial_loopback() {
        let args = proxy_args(&[
            "--allow",
            "localhost",
            "--allow-private",
            "--port",
            "1",
            "--port",
            "65535",
        ])
        .unwrap();
        let policy = args.policy().unwrap();
        for ip in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert!(policy.addresses.check(ip.parse().unwrap()).is_err(), "{ip}");
        }
        assert_eq!(policy.ports, BTreeSet::from([1, 65535]));
        assert!(proxy_args(&["--allow", "a.test", "--permit-loopback"]).is_err());
        assert!(proxy_args(&["--allow", "a.test", "--loopback"]).is_err());
    }

    #[test]
    fn the_command_line_validates_its_policy() {
        assert!(proxy_args(&[]).is_err(), "an allowlist is required");
        assert!(matches!(
            proxy_args(&["--allow", "127.0.0.1"]).unwrap().policy(),
            Err(ProxyError::InvalidAllow { .. })
        ));
        assert!(matches!(
            proxy_args(&["--allow", "a.test", "--port", "0"])
                .unwrap()
                .policy(),
            Err(ProxyError::InvalidConfig(_))
        ));
        assert!(proxy_args(&["--allow", "a.test", "--deny-address", "gateway"]).is_err());
        let policy = proxy_args(&["--allow", "a.test", "--deny-address", "172.18.0.1"])
            .unwrap()
            .policy()
            .unwrap();
        assert_eq!(policy.ports, BTreeSet::from(DEFAULT_PORTS));
        assert!(policy
            .addresses
            .check("172.18.0.1".parse().unwrap())
            .is_err());
        assert!(policy.addresses.check("10.0.0.1".parse().unwrap()).is_err());
        assert!(Cli::try_parse_from(["egress-proxy", "serve", "--listen", "127.0.0.1:1"]).is_err());
        assert!(Cli::try_parse_from([
            "egress-proxy",
            "serve",
            "--listen",
            "127.0.0.1:1",
            "--body",
            "x",
            "--size",
            "3"
        ])
        .is_err());
    }

    #[test]
    fn the_forwarder_is_installed_atomically_and_executable() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("egress-forward");
        std::fs::write(&dest, b"old").unwrap();
        install_forwarder(&dest).unwrap();
        let meta = std::fs::metadata(&dest).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        let own = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), own);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1);
    }

    #[tokio::test]
    async fn sockets_replace_stale_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        drop(bind_socket(&path).unwrap());
        let listener = bind_socket(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o666
        );
        drop(listener);
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep").unwrap();
        assert!(bind_socket(&file).is_err());
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }

    #[test]
    fn the_test_server_takes_pem_values_that_start_with_dashes() {
        let pem = "-----BEGIN CERTIFICATE-----\nX\n-----END CERTIFICATE-----\n";
        let cli = Cli::try_parse_from([
            "egress-proxy",
            "serve",
            "--listen",
            "127.0.0.1:1",
            "--body",
            "x",
            "--tls-cert-pem",
            pem,
            "--tls-key-pem",
            pem,
            "--log-requests",
        ])
        .unwrap();
        let Role::Serve(args) = cli.role else {
            panic!("not serve")
        };
        assert_eq!(args.tls_cert_pem.as_deref(), Some(pem));
        assert_eq!(args.tls_key_pem.as_deref(), Some(pem));
        assert!(args.log_requests);
        // One without the other is refused.
        assert!(Cli::try_parse_from([
            "egress-proxy",
            "serve",
            "--listen",
            "127.0.0.1:1",
            "--body",
            "x",
            "--tls-cert-pem",
            pem
        ])
        .is_err());
    }

    #[test]
    fn standard_input_carries_grants_rules_and_upstream_bundles() {
        let ca = crate::tls::Terminator::new(&crate::tls::UpstreamRoots {
            public: true,
            extra: Vec::new(),
        })
        .unwrap()
        .authority_pem();
        let grant = r#"{"host":"api.test","port":443,"methods":"*","paths":["/v1/*"],"token":"tok","expires_unix":4102444800}"#;
        let input = format!(
            "{}\n\n{}\n{grant}\n",
            serde_json::json!({ "rule": "api.test GET /v1/*" }),
            serde_json::json!({ "upstream_ca_pem": ca }),
        );
        let config = read_stdin_config(input.as_bytes()).unwrap();
        assert_eq!(config.rules, vec!["api.test GET /v1/*".to_owned()]);
        assert_eq!(config.upstream_pems, vec![ca.clone()]);
        assert_eq!(config.grants.len(), 1);
        let args = proxy_args(&[
            "--allow",
            "api.test",
            "--stdin-config",
            "--ca-cert-out",
            "/c",
        ])
        .unwrap();
        assert!(args.stdin_config);
        let policy = args.policy_with(config).unwrap();
        assert!(policy.terminator.is_some());
        assert!(policy.http.terminates("api.test"));
        assert!(
            proxy_args(&["--allow", "a.test", "--grants-stdin"])
                .unwrap()
                .stdin_config
        );

        // A rule that does not parse, a bundle without a certificate, and a line that is
        // neither (a grant with an extra key, or a rule beside another key) are refused.
        for bad in [
            serde_json::json!({ "rule": "api.test GET" }).to_string(),
            format!(
                "{}\n{}",
                serde_json::json!({ "rule": "api.test GET /v1/*" }),
                serde_json::json!({ "upstream_ca_pem": "nothing" })
            ),
        ] {
            let config = read_stdin_config(bad.as_bytes()).unwrap();
            assert!(args.policy_with(config).is_err(), "{bad}");
        }
        for bad in [
            serde_json::json!({ "rule": "api.test GET /v1/*", "x": 1 }).to_string(),
            serde_json::json!({ "rule": 3 }).to_string(),
            "\n{\"upstream_ca_pem\": []}".to_owned(),
        ] {
            let error = read_stdin_config(bad.as_bytes()).unwrap_err();
            let line = if bad.starts_with('\n') {
                "line 2"
            } else {
                "line 1"
            };
            assert!(error.to_string().contains(line), "{bad}: {error}");
        }
        let huge = vec![b' '; usize::try_from(MAX_GRANTS_INPUT).unwrap() + 1];
        assert!(read_stdin_config(&huge[..]).is_err());
        assert!(read_stdin_config(&b"\xff"[..]).is_err());
        assert_eq!(read_stdin_config(&b""[..]).unwrap(), StdinConfig::default());
    }
}
