//! The egress preflight (docs/docker-backend.md#egress): prove from inside a closed sandbox, by content, that
//! it reaches nothing. Fails closed: a probe that cannot run refuses the sandbox too.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::SandboxError;
use token_server::TokenServer;

use crate::config::DockerConfig;
use crate::config::EgressProbe;
use crate::connection::quote as tail;
use crate::connection::EngineConnection;
use crate::egress::{gateway_from_ipam, EgressPlan};
use crate::guest_calls::GuestCalls;
use crate::guest_calls::{GuestCall, SMALL_BUDGET};
use wrapper_stream::GuestEnd;

/// The whole probe's bound.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The probe's verdict exit: the sandbox reached something.
const REACHED: i32 = 86;

/// One command, every proxy variable removed and curl's own config ignored; `$1` by address,
/// `$2` by name, `$3` the token server, `$4` the token. On a reach it names the target on stdout.
/// For an allowlist sandbox (`docs/egress-proxy.md`), `$5` is an allowed host's URL, which must not
/// be reached around the proxy, and `$6` the proxy, through which the targets off the list (every
/// IP literal is) must not answer 2xx nor yield the token.
pub(crate) const PROBE_SCRIPT: &str = r#"unset HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY http_proxy https_proxy all_proxy no_proxy
command -v curl >/dev/null 2>&1 || { echo 'no curl in the image' >&2; exit 127; }
if curl --disable --fail --silent --insecure --max-time 3 -o /dev/null "$1"; then echo address; exit 86; fi
if curl --disable --fail --silent --insecure --max-time 3 -o /dev/null "$2"; then echo name; exit 86; fi
out=$(curl --disable --silent --insecure --max-time 3 "$3" 2>/dev/null)
case $out in *"$4"*) echo token; exit 86 ;; esac
if [ -n "$5" ]; then
  if curl --disable --fail --silent --insecure --max-time 3 --noproxy '*' -o /dev/null "$5"; then echo around; exit 86; fi
  if curl --disable --fail --silent --insecure --max-time 3 --proxy "$6" -o /dev/null "$1"; then echo proxied-address; exit 86; fi
  out=$(curl --disable --silent --insecure --max-time 3 --proxy "$6" "$3" 2>/dev/null)
  case $out in *"$4"*) echo proxied-token; exit 86 ;; esac
fi
exit 0
"#;

/// The URL of an allowed host the direct probe aims at: the first entry, a wildcard's strict
/// subdomain for `*.d`.
fn allowed_url(egress: &EgressPlan) -> String {
    let host = egress.hosts.first().map(String::as_str).unwrap_or("");
    match host.strip_prefix("*.") {
        Some(domain) => format!("http://maf-egress-probe.{domain}/"),
        None => format!("http://{host}/"),
    }
}

/// Runs the preflight against a freshly created sandbox.
pub(crate) async fn verify(
    guest: &Arc<GuestCalls>,
    engine: &EngineConnection,
    config: &DockerConfig,
    id: &str,
    egress: Option<&EgressPlan>,
) -> Result<(), SandboxError> {
    let address = match config.egress_probe.token_server {
        Some(address) => address,
        None => bridge_gateway(engine, config).await?,
    };
    let token = fresh_token()?;
    let server = serve_token(address, &token).await?;
    let url = server.url();
    // The host's own fetch must see the token, or the preflight proves nothing.
    if !host_fetch(server.address())
        .await
        .is_some_and(|body| body.contains(&token))
    {
        return Err(SandboxError::engine(format!(
            "egress preflight: the host could not fetch its own token from {url}"
        )));
    }
    let probe = &config.egress_probe;
    let (direct, proxy) = match egress {
        Some(egress) => (
            allowed_url(egress),
            crate::egress_names::PROXY_URL.to_owned(),
        ),
        None => (String::new(), String::new()),
    };
    let argv = [
        "sh",
        "-c",
        PROBE_SCRIPT,
        "maf-egress",
        probe.by_address.as_str(),
        probe.by_name.as_str(),
        url.as_str(),
        token.as_str(),
        direct.as_str(),
        proxy.as_str(),
    ];
    let call = GuestCall::internal("/", &argv, SMALL_BUDGET as u64, PROBE_TIMEOUT);
    let end = guest.run_guest(id, call).await;
    drop(server);
    verdict(end?, probe, &url, egress.map(|_| direct.as_str()))
}

/// What the probe's end means: exit 0 passes; the reach exit is HostNotConfined naming
/// the target reached; anything else (no curl, a wrapper failure, the bound passed, too much
/// output) leaves egress unverified, which refuses too. `allowed` is the allowed host's URL the
/// direct probe aimed at, for an allowlist sandbox.
fn verdict(
    end: GuestEnd,
    probe: &EgressProbe,
    token_url: &str,
    allowed: Option<&str>,
) -> Result<(), SandboxError> {
    const CLOSED: &str = "the sandbox reached the network although its egress is closed";
    const ALLOWLIST: &str =
        "the sandbox reached the network around its egress proxy, or through it off its allowlist";
    match end {
        GuestEnd::Ran(output) if output.exit_code == 0 => Ok(()),
        GuestEnd::Ran(output) if output.exit_code == REACHED => {
            let target = match String::from_utf8_lossy(&output.stdout).trim() {
                "address" => format!("(a) by address, {}", probe.by_address),
                "name" => format!("(b) by name, {}", probe.by_name),
                "token" => format!("(c) the host's token server, {token_url}"),
                "around" => format!(
                    "an allowed host around the proxy, {}",
                    allowed.unwrap_or("")
                ),
                "proxied-address" => format!(
                    "through the proxy, a host off the allowlist, {}",
                    probe.by_address
                ),
                "proxied-token" => {
                    format!("through the proxy, the host's token server, {token_url}")
                }
                other => format!("an unnamed target: {}", tail(other.as_bytes())),
            };
            let what = match allowed {
                None => CLOSED,
                Some(_) => ALLOWLIST,
            };
            Err(SandboxError::HostNotConfined(format!("{what}: {target}")))
        }
        GuestEnd::Ran(output) => Err(SandboxError::engine(format!(
            "the egress preflight could not run (exit {}), so egress is unverified: {}",
            output.exit_code,
            tail(&output.stderr)
        ))),
        GuestEnd::Expired(_) => Err(SandboxError::engine(
            "the egress preflight did not finish within 10 s, so egress is unverified",
        )),
        GuestEnd::Overflowed => Err(SandboxError::engine(
            "the egress preflight printed more than its output budget, so egress is unverified",
        )),
    }
}

fn fresh_token() -> Result<String, SandboxError> {
    let a = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    let b = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    Ok(format!("{}{}", a.as_str(), b.as_str())[..32].to_owned())
}

/// The default bridge's gateway: an address the engine can route to, on this host.
async fn bridge_gateway(
    engine: &EngineConnection,
    config: &DockerConfig,
) -> Result<IpAddr, SandboxError> {
    let network = engine
        .call(
            config.command_timeout,
            engine.api().inspect_network(
                "bridge",
                None::<bollard::query_parameters::InspectNetworkOptions>,
            ),
        )
        .await
        .map_err(|f| engine.failure("network inspect bridge", f))?;
    let answer: String = network
        .ipam
        .and_then(|ipam| ipam.config)
        .unwrap_or_default()
        .into_iter()
        .map(|config| {
            format!(
                "{} {} ",
                config.gateway.unwrap_or_default(),
                config.subnet.unwrap_or_default()
            )
        })
        .collect();
    gateway_from_ipam(&answer)
        .ok_or_else(|| SandboxError::engine("the default bridge reports no gateway address"))
}

/// How long the host's own fetch of its token may take.
const HOST_FETCH_BOUND: Duration = Duration::from_secs(3);

/// Serves `token` on `ip` (never a wildcard) until the server is dropped.
async fn serve_token(ip: IpAddr, token: &str) -> Result<TokenServer, SandboxError> {
    TokenServer::start(ip, token)
        .await
        .map_err(|error| match error {
            token_server::Error::Bind { source, .. } => SandboxError::Io {
                operation: "bind the egress token server",
                path: ip.to_string(),
                source,
            },
            other => SandboxError::invalid(format!("the egress token server: {other}")),
        })
}

/// The host's control fetch of its own token server: the whole answer, or `None`.
async fn host_fetch(address: SocketAddr) -> Option<String> {
    token_server::fetch(address, HOST_FETCH_BOUND)
        .await
        .ok()
        .map(|body| String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{ErrorKind, ExecOutput, GuestCleanup};

    fn ran(code: i32, stdout: &str, stderr: &str) -> GuestEnd {
        GuestEnd::Ran(ExecOutput::exited(
            stdout.as_bytes().to_vec(),
            stderr.as_bytes().to_vec(),
            code,
        ))
    }

    #[test]
    fn only_a_clean_exit_passes_and_every_other_end_refuses() {
        let probe = EgressProbe::new("http://10.0.0.1:8/", "http://probe.invalid/", None);
        let token_url = "http://10.0.0.1:4242/";
        assert!(verdict(ran(0, "", ""), &probe, token_url, None).is_ok());
        for (said, names) in [
            ("address\n", "(a) by address, http://10.0.0.1:8/"),
            ("name\n", "(b) by name, http://probe.invalid/"),
            (
                "token\n",
                "(c) the host's token server, http://10.0.0.1:4242/",
            ),
            ("", "an unnamed target"),
        ] {
            let error = verdict(ran(REACHED, said, ""), &probe, token_url, None).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::HostNotConfined, "{error}");
            let message = error.to_string();
            assert!(
                message.contains("reached the network although its egress is closed"),
                "{message}"
            );
            assert!(message.contains(names), "{said:?}: {message}");
        }
        // An allowlist sandbox's reach names the route: around the proxy, or through it.
        for (said, names) in [
            (
                "around\n",
                "an allowed host around the proxy, http://a.test/",
            ),
            (
                "proxied-address\n",
                "through the proxy, a host off the allowlist, http://10.0.0.1:8/",
            ),
            (
                "proxied-token\n",
                "through the proxy, the host's token server, http://10.0.0.1:4242/",
            ),
        ] {
            let error = verdict(
                ran(REACHED, said, ""),
                &probe,
                token_url,
                Some("http://a.test/"),
            )
            .unwrap_err();
            assert_eq!(error.kind(), ErrorKind::HostNotConfined, "{error}");
            let message = error.to_string();
            assert!(message.contains("around its egress proxy"), "{message}");
            assert!(message.contains(names), "{said:?}: {message}");
        }
        // A probe that cannot run, or cannot finish, leaves egress unverified: refused, never
        // HostNotConfined and never a pass.
        let unverified = [
            (ran(127, "", "no curl in the image"), "exit 127"),
            (ran(126, "", ""), "exit 126"),
            (ran(1, "", "sh: syntax error"), "exit 1"),
            (GuestEnd::Expired(GuestCleanup::Killed), "within 10 s"),
            (GuestEnd::Overflowed, "output budget"),
        ];
        for (end, names) in unverified {
            let error = verdict(end, &probe, token_url, None).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Engine, "{error}");
            let message = error.to_string();
            assert!(message.contains("unverified"), "{message}");
            assert!(message.contains(names), "{message}");
        }
    }

    /// Runs the real probe script on this host with a stand-in `curl` first on `PATH` (`false` =
    /// no curl at all): the stand-in "reaches" a URL containing `open` (printing the URL back)
    /// and anything at all while a proxy variable is still set.
    async fn run_script(curl: bool, targets: [&str; 4]) -> (i32, String) {
        let dir = tempfile::tempdir().unwrap();
        if curl {
            let stand_in = dir.path().join("curl");
            std::fs::write(
                &stand_in,
                "#!/bin/sh\nfor a; do [ \"$prev\" = -o ] && exec >\"$a\"; prev=$a; url=$a; done\n\
                 if [ -n \"$HTTP_PROXY$https_proxy$ALL_PROXY\" ]; then echo proxied; exit 0; fi\n\
                 case $url in *open*) echo \"served $url\"; exit 0 ;; esac\nexit 7\n",
            )
            .unwrap();
            let mut permissions = std::fs::metadata(&stand_in).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(&stand_in, permissions).unwrap();
        }
        let output = bounded_process::BoundedCommand::new("/bin/sh", Duration::from_secs(10))
            .args(["-c", PROBE_SCRIPT, "maf-egress"])
            .args(targets)
            .env("PATH", dir.path())
            .env("HTTP_PROXY", "http://open.proxy/")
            .env("https_proxy", "http://open.proxy/")
            .env("ALL_PROXY", "http://open.proxy/")
            .run()
            .await
            .unwrap();
        let code = match output.status {
            bounded_process::ExitKind::Exited(code) => code,
            other => panic!("the probe script ended by {other:?}"),
        };
        (
            code,
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        )
    }

    #[tokio::test]
    async fn the_probe_script_names_the_first_target_it_reaches() {
        let token = "0123456789abcdef0123456789abcdef";
        let closed = ["http://a/", "http://b/", "http://c/", token];
        // Every proxy variable is unset before the first curl: the stand-in would "reach"
        // anything through one.
        assert_eq!(run_script(true, closed).await, (0, String::new()));
        let cases = [
            (
                ["http://open-a/", "http://open-b/", "http://c/", token],
                "address",
            ),
            (["http://a/", "http://open-b/", "http://c/", token], "name"),
            (
                ["http://a/", "http://b/", "http://open-c/", "open-c"],
                "token",
            ),
        ];
        for (targets, word) in cases {
            assert_eq!(
                run_script(true, targets).await,
                (REACHED, word.to_owned()),
                "{targets:?}"
            );
        }
        // A token server that answers without the token is no reach: only the token proves one.
        let wrong = ["http://a/", "http://b/", "http://open-c/", token];
        assert_eq!(run_script(true, wrong).await, (0, String::new()));
        // No curl: the probe cannot run, with its own exit.
        assert_eq!(run_script(false, closed).await, (127, String::new()));
    }

    #[test]
    fn the_direct_probe_aims_at_an_allowed_host() {
        let plan = |hosts: &[&str]| EgressPlan {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            private: false,
            egress_id: String::new(),
            digest: String::new(),
            image: String::new(),
            network: String::new(),
            rules: Vec::new(),
            grants: Vec::new(),
            upstream_ca: None,
        };
        assert_eq!(allowed_url(&plan(&["a.test", "b.test"])), "http://a.test/");
        assert_eq!(
            allowed_url(&plan(&["*.d.test"])),
            "http://maf-egress-probe.d.test/"
        );
    }

    /// The script under `sh` with a fake `curl` that logs its arguments and succeeds only for
    /// the URL named in `REACHABLE`: a direct request to the allowed host, or a proxied one off
    /// the list, is reach (86); nothing reached is 0.
    #[test]
    fn the_allowlist_probe_fails_closed_on_either_route() {
        let dir = std::env::temp_dir().join(format!("maf-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let curl = dir.join("curl");
        std::fs::write(
            &curl,
            "#!/bin/sh\nfor a in \"$@\"; do last=$a; done\ncase \" $* \" in *\" $REACHABLE \"*) [ \"$last\" = \"$TARGET\" ] && exit 0 ;; esac\nexit 7\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&curl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |reachable: &str, target: &str| {
            std::process::Command::new("sh")
                .args([
                    "-c",
                    PROBE_SCRIPT,
                    "maf-egress",
                    "http://10.0.0.1/",
                    "http://name.invalid/",
                    "http://10.0.0.2/",
                    "token",
                    "http://a.test/",
                    "http://127.0.0.1:3128",
                ])
                .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
                .env("REACHABLE", reachable)
                .env("TARGET", target)
                .status()
                .unwrap()
                .code()
        };
        assert_eq!(run("nothing", "none"), Some(0));
        assert_eq!(run("--noproxy", "http://a.test/"), Some(REACHED));
        assert_eq!(run("--proxy", "http://10.0.0.1/"), Some(REACHED));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_token_server_serves_its_token_on_its_address_only() {
        let token = fresh_token().unwrap();
        assert_eq!(token.len(), 32);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        let server = serve_token("127.0.0.1".parse().unwrap(), &token)
            .await
            .unwrap();
        assert!(server.address().ip().is_loopback());
        let body = host_fetch(server.address()).await.unwrap();
        assert!(body.starts_with("HTTP/1.0 200 OK"));
        assert!(body.ends_with(&token));
        let wildcard = serve_token("0.0.0.0".parse().unwrap(), &token).await;
        assert_eq!(
            wildcard.unwrap_err().kind(),
            sandbox_core::ErrorKind::InvalidArgument
        );
    }
}
