//! The names and labels an allowlist sandbox's egress companions are found by: the proxy
//! container's and the volume's names, derived from the workload's, the role and policy labels,
//! and the paths and environment the workload sees (docs/docker-backend.md#allowlist-egress).
//!
//! A leaf: plain values and pure functions, so the ownership checks, the container recipes and
//! disposal can name the companions without depending on the machinery that makes them
//! ([`crate::egress`]).

/// Where the egress volume is mounted, in the proxy (read-write) and the workload (read-only).
pub(crate) const EGRESS_MOUNT: &str = "/run/maf-egress";
/// The proxy's socket, in the volume.
pub(crate) const PROXY_SOCKET: &str = "/run/maf-egress/proxy.sock";
/// The proxy's handoff socket, in the volume: the forwarder passes each connection there, and
/// relays it to [`PROXY_SOCKET`] only when that fails.
pub(crate) const HANDOFF_SOCKET: &str = "/run/maf-egress/handoff.sock";
/// The proxy's CA certificate, written by a proxy that terminates TLS, in the volume.
pub(crate) const PROXY_CA_CERT: &str = "/run/maf-egress/ca.pem";
/// The bundle the workload's TLS variables name when its proxy terminates TLS: the image's own
/// bundle (when it has one) and the proxy's CA, written by the backend, owned by root.
pub(crate) const WORKLOAD_CA_BUNDLE: &str = "/etc/maf-egress/ca-bundle.pem";
/// The forwarder binary the proxy installs in the volume.
pub(crate) const FORWARDER: &str = "/run/maf-egress/egress-proxy";
/// Where the forwarder listens inside the workload's own network namespace.
const FORWARD_LISTEN: &str = "127.0.0.1:3128";
/// The proxy URL the workload's environment names.
pub(crate) const PROXY_URL: &str = "http://127.0.0.1:3128";
/// Suffix of a sandbox's egress volume's name.
const VOLUME_SUFFIX: &str = "-egress";
/// Suffix of a sandbox's egress proxy's name.
const PROXY_SUFFIX: &str = "-proxy";
// The role label (`proxy`, `egress-volume`) and the egress-policy digest label (proxy, volume
// and workload) are the core's, shared with every host that reads them.
pub(crate) use sandbox_core::naming::docker::{LABEL_EGRESS_V1, LABEL_ROLE};

/// The proxy container's name.
pub(crate) fn proxy_name(workload: &str) -> String {
    format!("{workload}{PROXY_SUFFIX}")
}

/// Whether a container name is an egress proxy's (never a workload's).
pub(crate) fn is_proxy_name(name: &str) -> bool {
    name.ends_with(PROXY_SUFFIX)
}

/// The egress volume's name.
pub(crate) fn volume_name(workload: &str) -> String {
    format!("{workload}{VOLUME_SUFFIX}")
}

/// The workload's environment: every client that honours the proxy variables goes through the
/// forwarder; when the proxy terminates TLS, the usual trust variables name the bundle with its
/// CA (Node's adds the CA alone to its own roots).
pub(crate) fn workload_env(terminated: bool) -> Vec<String> {
    let mut env: Vec<String> = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|name| format!("{name}={PROXY_URL}"))
        .collect();
    env.push("NO_PROXY=localhost,127.0.0.1".to_owned());
    env.push("no_proxy=localhost,127.0.0.1".to_owned());
    if terminated {
        for name in ["SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE"] {
            env.push(format!("{name}={WORKLOAD_CA_BUNDLE}"));
        }
        env.push(format!("NODE_EXTRA_CA_CERTS={PROXY_CA_CERT}"));
    }
    env
}

/// The workload's body: the forwarder (handing each connection to the proxy), kept running by
/// a background loop that starts it again a second after it ends (a crash, or a guest that
/// killed it), then `keep_alive`. A guest that
/// kills the loop too loses only its own egress, until the workload restarts.
pub(crate) fn keep_alive_with_forwarder(keep_alive: &str) -> String {
    format!(
        "(while :; do if [ -x {FORWARDER} ]; then {FORWARDER} forward --listen {FORWARD_LISTEN} \
         --socket {PROXY_SOCKET} --handoff-socket {HANDOFF_SOCKET}; fi; sleep 1; done) </dev/null >/dev/null 2>&1 & {keep_alive}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_routes_through_the_forwarder() {
        let env = workload_env(false);
        assert_eq!(env.len(), 6, "{env:?}");
        let terminated = workload_env(true);
        assert_eq!(&terminated[..6], &env[..]);
        assert_eq!(
            &terminated[6..],
            [
                "SSL_CERT_FILE=/etc/maf-egress/ca-bundle.pem",
                "CURL_CA_BUNDLE=/etc/maf-egress/ca-bundle.pem",
                "REQUESTS_CA_BUNDLE=/etc/maf-egress/ca-bundle.pem",
                "NODE_EXTRA_CA_CERTS=/run/maf-egress/ca.pem",
            ]
        );
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert!(
                env.contains(&format!("{name}=http://127.0.0.1:3128")),
                "{name}"
            );
        }
        assert!(env.contains(&"NO_PROXY=localhost,127.0.0.1".to_owned()));
        assert!(env.contains(&"no_proxy=localhost,127.0.0.1".to_owned()));
        let body = keep_alive_with_forwarder("while :; do sleep 3600; done");
        assert_eq!(
            body,
            "(while :; do if [ -x /run/maf-egress/egress-proxy ]; then /run/maf-egress/egress-proxy \
             forward --listen 127.0.0.1:3128 --socket /run/maf-egress/proxy.sock \
             --handoff-socket /run/maf-egress/handoff.sock; fi; sleep 1; done) \
             </dev/null >/dev/null 2>&1 & while :; do sleep 3600; done"
        );
        assert_eq!(proxy_name("n"), "n-proxy");
        assert_eq!(volume_name("n"), "n-egress");
    }

    #[test]
    fn proxies_are_told_from_workloads_by_name() {
        assert!(is_proxy_name(&proxy_name("n")));
        assert!(!is_proxy_name("n"));
        assert!(!is_proxy_name(&volume_name("n")));
    }
}
