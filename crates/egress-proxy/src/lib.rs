//! The filtering egress proxy of the Docker backend's `allowlist` mode (`docs/egress-proxy.md`).
//!
//! One binary, four roles:
//!
//! - **proxy** ([`proxy`]): listens on a Unix socket in a volume shared with the workload and
//!   is the workload's only path out. It serves absolute-form plain-HTTP requests and
//!   `CONNECT` tunnels to hosts on an allowlist ([`hostmatch`]) and allowed ports, resolves
//!   names itself and refuses when any resolved address is forbidden ([`address`]), then
//!   dials only the addresses it checked. One request per client connection, one upstream per
//!   client connection. Every refusal is `403`; an unreadable request is `400`.
//! - **forward** ([`forward`]): runs inside the workload, listening on `127.0.0.1:3128`, and
//!   hands each connection to the proxy ([`handoff`]: the proxy then serves the client itself)
//!   or relays it byte for byte to the socket. It parses and resolves nothing.
//! - **serve** ([`serve`]): a tiny HTTP server for offline tests and benchmarks.
//! - **host-addresses** ([`cli::interface_addresses`]): lists the addresses of its network
//!   namespace's interfaces; the backend runs it in the engine host's namespace and passes what
//!   it prints to the proxy as denied addresses.
//!
//! Hosts with method and path rules or credential grants ([`rules`]) are *terminated*: the
//! proxy completes TLS with the client under a leaf of its own per-process CA ([`tls`]), judges
//! each request's method and normalised path ([`pathrule`]), adds a granted bearer token to
//! matching requests only, and reaches the upstream over TLS verified for the allowlisted name.
//! Every other host stays an opaque tunnel.
//!
//! The parsers ([`head`], [`hostmatch`], [`address`], [`pathrule`]) are pure and public so that
//! fuzz targets and tests drive them directly.
//!
//! What it defends: a guest reaching a host, port or address the allowlist does not grant,
//! through the proxy — by naming a host off the list, an IP literal, a name that resolves to
//! loopback, link-local, metadata, multicast, IANA special-purpose, the engine host's own, gateway
//! or (unless allowed) private addresses,
//! userinfo or case tricks in the authority, a `Host` header disagreeing with the target, a
//! second request on the same connection aimed elsewhere, or a protocol upgrade on plain HTTP.
//! Heads are bounded (16 KiB, 10 s), connects are bounded (10 s), relays close when idle, and
//! concurrent connections are capped.
//!
//! What it does not defend: what flows inside an opaque TLS tunnel (a host without rules or
//! grants; it is never decrypted); a credential an upstream echoes in a form other than its own
//! bytes (encoded, split across a transformation); an allowed host that itself relays
//! elsewhere (an open proxy, a CDN serving any tenant under an allowed name); data
//! exfiltration to an allowed host; DNS answers changing between the check and a later
//! request (each connection resolves again and checks again, and dials only checked
//! addresses, so a rebinding answer is refused rather than trusted); resource use below the
//! caps. The isolation itself (the workload's `--network none`, the read-only mount of the
//! socket's volume) is the backend's, not this crate's.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod accept;
pub mod address;
pub mod cli;
mod error;
pub mod forward;
pub mod handoff;
pub mod head;
pub mod hostmatch;
pub mod pathrule;
pub mod proxy;
pub mod relay;
pub mod rules;
pub mod serve;
mod terminate;
pub mod tls;

pub use error::ProxyError;

/// The README's examples, run as doctests so that they stay true to this API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests;
