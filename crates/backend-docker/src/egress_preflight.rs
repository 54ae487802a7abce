//! The egress preflight (docs/docker-backend.md#egress): prove from inside a closed sandbox, by content, that
//! it reaches nothing. Fails closed: a probe that cannot run refuses the sandbox too.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::SandboxError;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::connection::quote as tail;
use crate::egress::EgressPlan;
use crate::exec::{GuestCall, GuestEnd, SMALL_BUDGET};
use crate::state::BackendState;

/// The whole probe's bound.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The probe's verdict exit: the sandbox reached something.
const REACHED: i32 = 86;

/// One command, every proxy variable removed and curl's own config ignored; `$1` by address,
/// `$2` by name, `$3` the token server, `$4` the token. For an allowlist sandbox (host-hygiene
/// rule 19), `$5` is an allowed host's URL, which must not be reached around the proxy, and `$6`
/// the proxy, through which the targets off the list (every IP literal is) must not answer 2xx
/// nor yield the token.
const PROBE_SCRIPT: &str = r#"unset HTTP_PROXY HTTPS_PROXY ALL_PROXY NO_PROXY http_proxy https_proxy all_proxy no_proxy
command -v curl >/dev/null 2>&1 || exit 127
for u in "$1" "$2"; do
  if curl --disable --fail --silent --insecure --max-time 3 -o /dev/null "$u"; then exit 86; fi
done
out=$(curl --disable --silent --insecure --max-time 3 "$3" 2>/dev/null)
case $out in *"$4"*) exit 86 ;; esac
if [ -n "$5" ]; then
  if curl --disable --fail --silent --insecure --max-time 3 --noproxy '*' -o /dev/null "$5"; then exit 86; fi
  if curl --disable --fail --silent --insecure --max-time 3 --proxy "$6" -o /dev/null "$1"; then exit 86; fi
  out=$(curl --disable --silent --insecure --max-time 3 --proxy "$6" "$3" 2>/dev/null)
  case $out in *"$4"*) exit 86 ;; esac
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
    shared: &Arc<BackendState>,
    id: &str,
    egress: Option<&EgressPlan>,
) -> Result<(), SandboxError> {
    let address = match shared.config.egress_probe.token_server {
        Some(address) => address,
        None => bridge_gateway(shared).await?,
    };
    let token = fresh_token()?;
    let server = TokenServer::start(address, token.clone()).await?;
    let url = format!("http://{}/", server.address);
    // The host's own fetch must see the token, or the preflight proves nothing.
    if !host_fetch(server.address)
        .await
        .is_some_and(|body| body.contains(&token))
    {
        return Err(SandboxError::engine(format!(
            "egress preflight: the host could not fetch its own token from {url}"
        )));
    }
    let probe = &shared.config.egress_probe;
    let (direct, proxy) = match egress {
        Some(egress) => (allowed_url(egress), crate::egress::PROXY_URL.to_owned()),
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
    let end = shared.run_guest(id, call).await;
    drop(server);
    match end? {
        GuestEnd::Ran(output) if output.exit_code == 0 => Ok(()),
        GuestEnd::Ran(output) if output.exit_code == REACHED => {
            Err(SandboxError::HostNotConfined(match egress {
                None => "the sandbox reached the network although its egress is closed".to_owned(),
                Some(_) => "the sandbox reached the network around its egress proxy, or through \
                            it to a host off its allowlist"
                    .to_owned(),
            }))
        }
        GuestEnd::Ran(output) => Err(SandboxError::engine(format!(
            "the egress preflight could not run (exit {}), so egress is unverified: {}",
            output.exit_code,
            tail(&output.stderr)
        ))),
        GuestEnd::Expired(_) | GuestEnd::Overflowed => Err(SandboxError::engine(
            "the egress preflight did not finish within 10 s, so egress is unverified",
        )),
    }
}

fn fresh_token() -> Result<String, SandboxError> {
    let a = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    let b = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
    Ok(format!("{}{}", a.as_str(), b.as_str())[..32].to_owned())
}

/// The default bridge's gateway: an address the engine can route to, on this host.
async fn bridge_gateway(state: &BackendState) -> Result<IpAddr, SandboxError> {
    let network = state
        .engine
        .call(
            state.config.command_timeout,
            state.engine.api().inspect_network(
                "bridge",
                None::<bollard::query_parameters::InspectNetworkOptions>,
            ),
        )
        .await
        .map_err(|f| state.engine.failure("network inspect bridge", f))?;
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

/// The gateway from `<gateway> <subnet>` pairs: the explicit one, else (engines that leave it
/// implicit) the subnet's first host address, which is where the engine puts it.
pub(crate) fn gateway_from_ipam(answer: &str) -> Option<IpAddr> {
    let words: Vec<&str> = answer.split_whitespace().collect();
    let explicit = words
        .iter()
        .filter_map(|word| word.parse::<IpAddr>().ok())
        .find(|ip| !ip.is_unspecified());
    explicit.or_else(|| {
        words.iter().find_map(|word| {
            let (network, prefix) = word.split_once('/')?;
            let network: std::net::Ipv4Addr = network.parse().ok()?;
            let prefix: u32 = prefix.parse().ok()?;
            (prefix < 31).then(|| IpAddr::V4((u32::from(network) + 1).into()))
        })
    })
}

/// Serves one token over plain HTTP on one address (never a wildcard) until dropped.
struct TokenServer {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TokenServer {
    async fn start(ip: IpAddr, token: String) -> Result<TokenServer, SandboxError> {
        if ip.is_unspecified() {
            return Err(SandboxError::invalid(
                "the egress token server never binds a wildcard address",
            ));
        }
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|source| SandboxError::Io {
                operation: "bind the egress token server",
                path: ip.to_string(),
                source,
            })?;
        let address = listener.local_addr().map_err(|source| SandboxError::Io {
            operation: "bind the egress token server",
            path: ip.to_string(),
            source,
        })?;
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let token = token.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut request))
                        .await;
                    let response = format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{token}",
                        token.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Ok(TokenServer { address, task })
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The host's control fetch of its own token server.
async fn host_fetch(address: SocketAddr) -> Option<String> {
    let fetch = async {
        let mut stream = TcpStream::connect(address).await.ok()?;
        stream
            .write_all(format!("GET / HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut body = Vec::new();
        stream.read_to_end(&mut body).await.ok()?;
        Some(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(3), fetch)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_probe_aims_at_an_allowed_host() {
        let plan = |hosts: &[&str]| EgressPlan {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            private: false,
            egress_id: String::new(),
            digest: String::new(),
            image: String::new(),
            network: String::new(),
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
        let server = TokenServer::start("127.0.0.1".parse().unwrap(), token.clone())
            .await
            .unwrap();
        assert!(server.address.ip().is_loopback());
        let body = host_fetch(server.address).await.unwrap();
        assert!(body.starts_with("HTTP/1.0 200 OK"));
        assert!(body.ends_with(&token));
        assert!(TokenServer::start("0.0.0.0".parse().unwrap(), token)
            .await
            .is_err());
    }
}
