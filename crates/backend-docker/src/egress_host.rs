//! The engine host's own addresses, which the egress proxy denies (docs/egress-proxy.md#rules).
//!
//! A service on the engine host bound to `0.0.0.0`, or a port the engine publishes, answers on
//! every address of the host: its LAN or public IPv4, its global IPv6, the gateways of every
//! engine network. An allowed name that resolves to one of them (a wildcard DNS zone, an
//! internal name) would reach that service through the proxy, and no address range names
//! them. So they are read where the engine runs, not where this process runs (a remote engine,
//! `DOCKER_HOST=ssh://…`, has other addresses): a short-lived container from the proxy image in
//! the host's network namespace (`network_mode: host`, with every container's hardening and a
//! read-only root) runs `egress-proxy host-addresses`, which lists the
//! addresses of every interface, up or down. The answer is kept per engine (per backend) for
//! [`HOST_ADDRESSES_TTL`]; a proxy keeps the list it was started with.
//!
//! Fails closed: an engine that cannot run that container, or a listing cut short, refuses the
//! allowlist sandbox rather than start a proxy that could reach the host.
//!
//! Not covered: an address the host gains after its proxy started (until the proxy is replaced),
//! and hosts reached through the host's addresses that are not its own (other machines on its
//! LAN are private destinations, refused unless private destinations are allowed).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use sandbox_core::SandboxError;

use crate::egress_names::LABEL_ROLE;
use std::sync::Arc;

use crate::config::Resources;
use crate::containers::{hardened_host_config, Containers, Hardening};

/// How long one reading of the host's addresses is used for new proxies.
pub(crate) const HOST_ADDRESSES_TTL: Duration = Duration::from_secs(300);
/// The most output the listing may have.
const LISTING_BUDGET: usize = 64 * 1024;
/// The listing's processes: a shell and the lister, with room to spare.
const LISTING_PIDS_LIMIT: i64 = 16;
/// The listing's CPU and memory: it reads a few interfaces and prints a line each.
const LISTING_RESOURCES: Resources = Resources {
    nano_cpus: 1_000_000_000,
    memory_bytes: 64 * 1024 * 1024,
};
/// The prefix of the listing container's name (a random suffix follows).
const LISTING_NAME: &str = "maf-sandbox-host-addresses-";

/// Reads the `host-addresses` listing: one address a line, then `end <count>`. `None` when it
/// was cut short, miscounted or holds anything else.
pub(crate) fn parse_listing(text: &str) -> Option<Vec<IpAddr>> {
    let mut addresses = Vec::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(count) = line.strip_prefix("end ") {
            return (count.parse::<usize>().ok()? == addresses.len()).then_some(addresses);
        }
        addresses.push(line.parse::<IpAddr>().ok()?);
    }
    None
}

/// The addresses worth passing to the proxy: the ones its ranges do not already refuse
/// (loopback, link-local, unspecified), sorted, without repeats.
pub(crate) fn worth_denying(addresses: &[IpAddr]) -> Vec<IpAddr> {
    let mut kept: Vec<IpAddr> = addresses
        .iter()
        .copied()
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !(v4.is_loopback() || v4.is_link_local() || v4.is_unspecified()),
            IpAddr::V6(v6) => {
                !(v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80)
            }
        })
        .collect();
    kept.sort();
    kept.dedup();
    kept
}

/// The engine host's addresses the egress proxy denies, as last read, and when.
#[derive(Debug)]
pub(crate) struct HostAddresses {
    /// Makes, starts and removes the listing container.
    containers: Arc<Containers>,
    last_read: tokio::sync::Mutex<Option<(Instant, Vec<IpAddr>)>>,
}

impl HostAddresses {
    pub(crate) fn new(containers: Arc<Containers>) -> Self {
        HostAddresses {
            containers,
            last_read: tokio::sync::Mutex::new(None),
        }
    }

    /// The engine host's interface addresses worth denying, read through `image` (the proxy
    /// image, present) at most once per [`HOST_ADDRESSES_TTL`].
    ///
    /// # Errors
    /// Engine when the listing container cannot be made, run or read, or its listing is cut
    /// short.
    ///
    /// # Cancel safety and drop
    /// A dropped call may leave its listing container behind, exited (it runs for a moment)
    /// and labelled `maf-sandbox.role=host-addresses`; nothing is cached then.
    pub(crate) async fn addresses(&self, image: &str) -> Result<Vec<IpAddr>, SandboxError> {
        let mut read = self.last_read.lock().await;
        if let Some((at, addresses)) = read.as_ref() {
            if at.elapsed() < HOST_ADDRESSES_TTL {
                return Ok(addresses.clone());
            }
        }
        let addresses = worth_denying(&self.list_host_addresses(image).await?);
        *read = Some((Instant::now(), addresses.clone()));
        Ok(addresses)
    }

    /// One run of the listing container.
    async fn list_host_addresses(&self, image: &str) -> Result<Vec<IpAddr>, SandboxError> {
        let suffix = exec_wrapper::new_nonce().map_err(|e| SandboxError::engine(e.to_string()))?;
        let name = format!("{LISTING_NAME}{}", &suffix.as_str()[..12]);
        let body = ContainerCreateBody {
            image: Some(image.to_owned()),
            cmd: Some(vec!["host-addresses".to_owned()]),
            labels: Some(HashMap::from([(
                LABEL_ROLE.to_owned(),
                "host-addresses".to_owned(),
            )])),
            host_config: Some(HostConfig {
                readonly_rootfs: Some(true),
                ..hardened_host_config(Hardening {
                    pids_limit: LISTING_PIDS_LIMIT,
                    resources: LISTING_RESOURCES,
                    network: "host",
                    egress_volume: None,
                    // This crate's own listing, never the guest's: the engine's default runtime.
                    runtime: None,
                })
            }),
            ..ContainerCreateBody::default()
        };
        let id = match self
            .containers
            .create_named(&name, image, body, "host address listing create")
            .await?
        {
            Ok(id) => id,
            Err(taken) => {
                return Err(SandboxError::engine(format!(
                    "the host address listing's name {name} was taken: {taken}"
                )))
            }
        };
        // The listing runs the proxy image: one that runs as root is refused before anything of
        // it starts, as the proxy itself is.
        let listed = match self.containers.inspect(&id).await {
            Ok(Some(record)) if record.runs_as_root() => Err(SandboxError::engine(format!(
                "the egress proxy image {image} runs as root; it must name a non-root user"
            ))),
            Ok(Some(_)) => self
                .containers
                .run_to_exit(&id, LISTING_BUDGET, "host address listing")
                .await
                .map(|output| String::from_utf8_lossy(&output).into_owned()),
            Ok(None) => Err(SandboxError::engine(format!(
                "the host address listing {name} vanished after its create"
            ))),
            Err(error) => Err(error),
        };
        if let Err(failure) = self.containers.remove(&id).await {
            tracing::warn!(container = %id, %failure, "could not remove the host address listing");
        }
        let text = listed?;
        parse_listing(&text).ok_or_else(|| {
            SandboxError::engine(format!(
                "the engine host's addresses could not be read (the egress proxy denies them): \
                 the listing container printed {}",
                crate::egress::log_tail(&text)
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_listing_counts_and_ends_or_reads_as_none() {
        assert_eq!(
            parse_listing("127.0.0.1\n192.0.2.2\nfd00::2\nend 3\n"),
            Some(vec![ip("127.0.0.1"), ip("192.0.2.2"), ip("fd00::2")])
        );
        assert_eq!(parse_listing("end 0\n"), Some(Vec::new()));
        // Cut short, miscounted, or holding anything else: not a listing.
        assert_eq!(parse_listing("127.0.0.1\n192.0.2.2\n"), None);
        assert_eq!(parse_listing("127.0.0.1\nend 2\n"), None);
        assert_eq!(parse_listing("127.0.0.1\nwarning: x\nend 1\n"), None);
        assert_eq!(parse_listing(""), None);
    }

    #[test]
    fn only_addresses_the_ranges_miss_are_passed() {
        let listed = [
            ip("127.0.0.1"),
            ip("::1"),
            ip("fe80::fc:ff:fe00:1"),
            ip("169.254.1.1"),
            ip("192.0.2.2"),
            ip("172.17.0.1"),
            ip("fd00::2"),
            ip("2001:db8::5"),
            ip("172.17.0.1"),
        ];
        assert_eq!(
            worth_denying(&listed),
            vec![
                ip("172.17.0.1"),
                ip("192.0.2.2"),
                ip("2001:db8::5"),
                ip("fd00::2")
            ]
        );
    }
}
