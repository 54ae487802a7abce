//! Address classification: which resolved addresses the proxy never dials.
//!
//! Always forbidden: `0.0.0.0/8`, `127.0.0.0/8`, `169.254.0.0/16`, the cloud metadata
//! addresses `100.100.100.200` and `168.63.129.16`, `224.0.0.0/4`, `240.0.0.0/4` (reserved and
//! broadcast), `::`, `::1`, `fe80::/10`, `ff00::/8`, `fd00:ec2::254`, the IPv4-compatible
//! `::/96`, every other block of the IANA IPv4 and IPv6 special-purpose address registries
//! (protocol assignments, documentation, benchmarking, anycast services, AS112, AMT, 6to4,
//! Teredo, ORCHID, SRv6, the local-use translation prefix `64:ff9b:1::/48`, …: see
//! `docs/egress-proxy.md`), and the addresses of the deny list (the engine host's own interface
//! addresses and the outbound network's gateways). Forbidden unless private destinations are
//! allowed: `10/8`, `172.16/12`, `192.168/16`, `100.64/10`, `fc00::/7` and `fec0::/10`.
//! IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::/96`) addresses are classified by the
//! IPv4 address they carry.
//!
//! Why the host's own addresses are denied by list rather than by range: a service on the
//! engine host bound to `0.0.0.0`, or a port the engine publishes, answers on every address of
//! the host, including its LAN or public one, which no range names. The backend reads those
//! addresses where the engine runs and passes them as `--deny-address`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// `0.0.0.0/8`, `::`, `::/96`, `240.0.0.0/4`.
    Unroutable,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// A cloud metadata service address.
    Metadata,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// A private range: allowed only with private destinations allowed.
    Private,
    /// Another block of the IANA special-purpose registries (documentation, benchmarking,
    /// protocol assignments, anycast services, transition mechanisms, …).
    SpecialPurpose,
    /// On the deny list: an address of the engine host, or a gateway of the outbound network.
    Denied,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::Unroutable => "unroutable",
            Class::Loopback => "loopback",
            Class::LinkLocal => "link-local",
            Class::Metadata => "metadata service",
            Class::Multicast => "multicast",
            Class::Private => "private",
            Class::SpecialPurpose => "special-purpose",
            Class::Denied => "denied: the engine host's or a gateway's",
        })
    }
}

/// The IPv4 address an IPv6 address stands for (mapped or NAT64), or the address itself.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || nat64).then_some(tail)
}

/// The class of a forbidden-by-range address, `None` for an ordinary one. The deny list is
/// not consulted here.
pub fn classify(ip: IpAddr) -> Option<Class> {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Option<Class> {
    let table: &[([u8; 4], u32, Class)] = &[
        ([0, 0, 0, 0], 8, Class::Unroutable),
        ([127, 0, 0, 0], 8, Class::Loopback),
        ([169, 254, 0, 0], 16, Class::LinkLocal),
        ([100, 100, 100, 200], 32, Class::Metadata),
        ([168, 63, 129, 16], 32, Class::Metadata),
        ([224, 0, 0, 0], 4, Class::Multicast),
        ([240, 0, 0, 0], 4, Class::Unroutable),
        // The IANA IPv4 special-purpose registry's other blocks.
        ([192, 0, 0, 0], 24, Class::SpecialPurpose),
        ([192, 0, 2, 0], 24, Class::SpecialPurpose),
        ([192, 31, 196, 0], 24, Class::SpecialPurpose),
        ([192, 52, 193, 0], 24, Class::SpecialPurpose),
        ([192, 88, 99, 0], 24, Class::SpecialPurpose),
        ([192, 175, 48, 0], 24, Class::SpecialPurpose),
        ([198, 18, 0, 0], 15, Class::SpecialPurpose),
        ([198, 51, 100, 0], 24, Class::SpecialPurpose),
        ([203, 0, 113, 0], 24, Class::SpecialPurpose),
        ([10, 0, 0, 0], 8, Class::Private),
        ([172, 16, 0, 0], 12, Class::Private),
        ([192, 168, 0, 0], 16, Class::Private),
        ([100, 64, 0, 0], 10, Class::Private),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == u128::from(net) & mask
}

/// An IPv6 prefix from its first four segments.
const fn v6(a: u16, b: u16, c: u16, d: u16) -> Ipv6Addr {
    Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Class> {
    let table: &[(Ipv6Addr, u32, Class)] = &[
        (Ipv6Addr::UNSPECIFIED, 128, Class::Unroutable),
        (Ipv6Addr::LOCALHOST, 128, Class::Loopback),
        (Ipv6Addr::UNSPECIFIED, 96, Class::Unroutable),
        (
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
            10,
            Class::LinkLocal,
        ),
        (
            Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
            8,
            Class::Multicast,
        ),
        (
            Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
            128,
            Class::Metadata,
        ),
        // The IANA IPv6 special-purpose registry's other blocks (`::ffff:0:0/96` and
        // `64:ff9b::/96` are judged by the IPv4 address they carry, before this table).
        (v6(0x64, 0xff9b, 1, 0), 48, Class::SpecialPurpose),
        (v6(0x100, 0, 0, 0), 64, Class::SpecialPurpose),
        (v6(0x100, 0, 0, 1), 64, Class::SpecialPurpose),
        (v6(0x2001, 0, 0, 0), 23, Class::SpecialPurpose),
        (v6(0x2001, 0xdb8, 0, 0), 32, Class::SpecialPurpose),
        (v6(0x2002, 0, 0, 0), 16, Class::SpecialPurpose),
        (v6(0x2620, 0x4f, 0x8000, 0), 48, Class::SpecialPurpose),
        (v6(0x3fff, 0, 0, 0), 20, Class::SpecialPurpose),
        (v6(0x5f00, 0, 0, 0), 16, Class::SpecialPurpose),
        (
            Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
            7,
            Class::Private,
        ),
        (
            Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
            10,
            Class::Private,
        ),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

/// Which addresses the proxy may dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPolicy {
    allow_private: bool,
    deny: Vec<IpAddr>,
    /// Loopback is dialled only by the crate's own in-process tests; nothing outside
    /// `cfg(test)` can set this.
    loopback_permitted: bool,
}

impl AddressPolicy {
    /// The policy: private ranges allowed or not, plus extra addresses never dialled.
    pub fn new(allow_private: bool, deny: impl IntoIterator<Item = IpAddr>) -> AddressPolicy {
        AddressPolicy {
            allow_private,
            deny: deny.into_iter().map(canonical).collect(),
            loopback_permitted: false,
        }
    }

    /// The same policy, dialling loopback too: for the in-process tests on loopback only.
    #[cfg(test)]
    pub(crate) fn permitting_loopback(mut self) -> AddressPolicy {
        self.loopback_permitted = true;
        self
    }

    /// `Err(class)` when `ip` must not be dialled.
    ///
    /// # Errors
    /// The class that forbids the address.
    pub fn check(&self, ip: IpAddr) -> Result<(), Class> {
        let canonical_ip = canonical(ip);
        if self.deny.contains(&canonical_ip) {
            return Err(Class::Denied);
        }
        match classify(ip) {
            None => Ok(()),
            Some(Class::Private) if self.allow_private => Ok(()),
            Some(Class::Loopback) if self.loopback_permitted => Ok(()),
            Some(class) => Err(class),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_classification_table() {
        let table: &[(&str, Option<Class>)] = &[
            ("0.0.0.0", Some(Class::Unroutable)),
            ("0.255.255.255", Some(Class::Unroutable)),
            ("1.0.0.0", None),
            ("126.255.255.255", None),
            ("127.0.0.1", Some(Class::Loopback)),
            ("127.255.255.254", Some(Class::Loopback)),
            ("128.0.0.0", None),
            ("169.254.169.254", Some(Class::LinkLocal)),
            ("169.253.255.255", None),
            ("169.255.0.0", None),
            ("100.100.100.200", Some(Class::Metadata)),
            ("100.100.100.201", Some(Class::Private)),
            ("100.63.255.255", None),
            ("100.128.0.0", None),
            ("168.63.129.16", Some(Class::Metadata)),
            ("168.63.129.17", None),
            ("224.0.0.1", Some(Class::Multicast)),
            ("239.255.255.255", Some(Class::Multicast)),
            ("223.255.255.255", None),
            ("240.0.0.1", Some(Class::Unroutable)),
            ("255.255.255.255", Some(Class::Unroutable)),
            ("10.0.0.1", Some(Class::Private)),
            ("10.255.255.255", Some(Class::Private)),
            ("11.0.0.0", None),
            ("172.16.0.1", Some(Class::Private)),
            ("172.31.255.255", Some(Class::Private)),
            ("172.15.255.255", None),
            ("172.32.0.0", None),
            ("192.168.1.1", Some(Class::Private)),
            ("192.169.0.0", None),
            ("8.8.8.8", None),
            ("192.0.0.9", Some(Class::SpecialPurpose)),
            ("192.0.1.255", None),
            ("192.0.2.2", Some(Class::SpecialPurpose)),
            ("192.0.3.0", None),
            ("198.17.255.255", None),
            ("198.19.255.255", Some(Class::SpecialPurpose)),
            ("198.20.0.0", None),
            ("198.51.100.7", Some(Class::SpecialPurpose)),
            ("203.0.112.255", None),
            ("203.0.113.1", Some(Class::SpecialPurpose)),
            ("203.0.114.0", None),
            ("64:ff9b:1::a9fe:a9fe", Some(Class::SpecialPurpose)),
            ("64:ff9b:2::1", None),
            ("100::1", Some(Class::SpecialPurpose)),
            ("100:0:0:2::1", None),
            ("2001:1::1", Some(Class::SpecialPurpose)),
            ("2002:7f00:1::", Some(Class::SpecialPurpose)),
            ("3fff:fff::1", Some(Class::SpecialPurpose)),
            ("3fff:1000::1", None),
            ("5f00::1", Some(Class::SpecialPurpose)),
            ("5f01::1", None),
            ("::", Some(Class::Unroutable)),
            ("::1", Some(Class::Loopback)),
            ("::2", Some(Class::Unroutable)),
            ("::7f00:1", Some(Class::Unroutable)),
            ("fe80::1", Some(Class::LinkLocal)),
            ("febf::1", Some(Class::LinkLocal)),
            ("fec0::1", Some(Class::Private)),
            ("ff02::1", Some(Class::Multicast)),
            ("fd00:ec2::254", Some(Class::Metadata)),
            ("fd00:ec2::253", Some(Class::Private)),
            ("fc00::1", Some(Class::Private)),
            ("fdff:ffff::1", Some(Class::Private)),
            ("fe00::1", None),
            ("2001:db8::1", Some(Class::SpecialPurpose)),
            ("2001:200::1", None),
            ("2003::1", None),
            ("2606:4700::1111", None),
            ("::ffff:127.0.0.1", Some(Class::Loopback)),
            ("::ffff:169.254.169.254", Some(Class::LinkLocal)),
            ("::ffff:10.1.2.3", Some(Class::Private)),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::a9fe:a9fe", Some(Class::LinkLocal)),
            ("64:ff9b::808:808", None),
        ];
        for (text, expected) in table {
            assert_eq!(classify(ip(text)), *expected, "{text}");
        }
    }

    /// Every entry of the IANA IPv4 and IPv6 special-purpose address registries (as published
    /// in 2025), and the two multicast blocks, as `(prefix, length, private)`.
    const IANA_SPECIAL_PURPOSE: &[(&str, u32, bool)] = &[
        ("0.0.0.0", 8, false),
        ("0.0.0.0", 32, false),
        ("10.0.0.0", 8, true),
        ("100.64.0.0", 10, true),
        ("127.0.0.0", 8, false),
        ("169.254.0.0", 16, false),
        ("172.16.0.0", 12, true),
        ("192.0.0.0", 24, false),
        ("192.0.0.0", 29, false),
        ("192.0.0.8", 32, false),
        ("192.0.0.9", 32, false),
        ("192.0.0.10", 32, false),
        ("192.0.0.170", 32, false),
        ("192.0.0.171", 32, false),
        ("192.0.2.0", 24, false),
        ("192.31.196.0", 24, false),
        ("192.52.193.0", 24, false),
        ("192.88.99.0", 24, false),
        ("192.88.99.2", 32, false),
        ("192.168.0.0", 16, true),
        ("192.175.48.0", 24, false),
        ("198.18.0.0", 15, false),
        ("198.51.100.0", 24, false),
        ("203.0.113.0", 24, false),
        ("224.0.0.0", 4, false),
        ("240.0.0.0", 4, false),
        ("255.255.255.255", 32, false),
        ("::1", 128, false),
        ("::", 128, false),
        ("::ffff:0:0", 96, false),
        ("64:ff9b::", 96, false),
        ("64:ff9b:1::", 48, false),
        ("100::", 64, false),
        ("100:0:0:1::", 64, false),
        ("2001::", 23, false),
        ("2001::", 32, false),
        ("2001:1::1", 128, false),
        ("2001:1::2", 128, false),
        ("2001:1::3", 128, false),
        ("2001:2::", 48, false),
        ("2001:3::", 32, false),
        ("2001:4:112::", 48, false),
        ("2001:10::", 28, false),
        ("2001:20::", 28, false),
        ("2001:30::", 28, false),
        ("2001:db8::", 32, false),
        ("2002::", 16, false),
        ("2620:4f:8000::", 48, false),
        ("3fff::", 20, false),
        ("5f00::", 16, false),
        ("fc00::", 7, true),
        ("fe80::", 10, false),
        ("ff00::", 8, false),
    ];

    /// The first and last address of a block.
    fn ends(prefix: &str, length: u32) -> [IpAddr; 2] {
        match ip(prefix) {
            IpAddr::V4(v4) => {
                let host = u32::MAX.checked_shr(length).unwrap_or(0);
                let first = u32::from(v4) & !host;
                [first, first | host].map(|a| IpAddr::V4(a.into()))
            }
            IpAddr::V6(v6) => {
                let host = u128::MAX.checked_shr(length).unwrap_or(0);
                let first = u128::from(v6) & !host;
                [first, first | host].map(|a| IpAddr::V6(a.into()))
            }
        }
    }

    #[test]
    fn every_iana_special_purpose_block_is_refused_end_to_end() {
        let open = AddressPolicy::new(true, []);
        let closed = AddressPolicy::new(false, []);
        for (prefix, length, private) in IANA_SPECIAL_PURPOSE {
            for address in ends(prefix, *length) {
                let name = format!("{prefix}/{length}: {address}");
                assert!(closed.check(address).is_err(), "{name}");
                if *private {
                    assert_eq!(classify(address), Some(Class::Private), "{name}");
                    assert_eq!(open.check(address), Ok(()), "{name}");
                } else {
                    assert!(open.check(address).is_err(), "{name}");
                }
            }
        }
        // The blocks the registries added that the first table lacked.
        for (text, length) in [
            ("192.0.0.0", 24),
            ("192.0.2.0", 24),
            ("198.51.100.0", 24),
            ("203.0.113.0", 24),
            ("198.18.0.0", 15),
            ("64:ff9b:1::", 48),
        ] {
            for address in ends(text, length) {
                assert_eq!(
                    open.check(address),
                    Err(Class::SpecialPurpose),
                    "{text}/{length}"
                );
            }
        }
    }

    #[test]
    fn embedded_ipv4_addresses_keep_every_octet() {
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(canonical(ip("64:ff9b::1.2.3.4")), ip("1.2.3.4"));
        assert_eq!(canonical(ip("::1:ffff:1.2.3.4")), ip("::1:ffff:1.2.3.4"));
        assert_eq!(canonical(ip("1.2.3.4")), ip("1.2.3.4"));
    }

    #[test]
    fn private_ranges_open_only_when_allowed_and_the_deny_list_always_wins() {
        let closed = AddressPolicy::new(false, [ip("172.18.0.1")]);
        let open = AddressPolicy::new(true, [ip("172.18.0.1")]);
        assert_eq!(closed.check(ip("10.1.1.1")), Err(Class::Private));
        assert_eq!(open.check(ip("10.1.1.1")), Ok(()));
        assert_eq!(open.check(ip("fd12::1")), Ok(()));
        assert_eq!(open.check(ip("172.18.0.1")), Err(Class::Denied));
        assert_eq!(open.check(ip("::ffff:172.18.0.1")), Err(Class::Denied));
        assert_eq!(open.check(ip("172.18.0.2")), Ok(()));
        let mapped_deny = AddressPolicy::new(true, [ip("::ffff:172.18.0.1")]);
        assert_eq!(mapped_deny.check(ip("172.18.0.1")), Err(Class::Denied));
        for always in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "ff02::1",
        ] {
            assert!(open.check(ip(always)).is_err(), "{always}");
        }
        assert_eq!(open.check(ip("93.184.216.34")), Ok(()));
        // An engine host's ordinary public or LAN address is refused only by the deny list.
        let host = AddressPolicy::new(true, [ip("93.184.216.34"), ip("2606:4700::1111")]);
        assert_eq!(host.check(ip("93.184.216.34")), Err(Class::Denied));
        assert_eq!(host.check(ip("::ffff:93.184.216.34")), Err(Class::Denied));
        assert_eq!(host.check(ip("2606:4700::1111")), Err(Class::Denied));
        assert_eq!(host.check(ip("2606:4700::1112")), Ok(()));
    }

    #[test]
    fn only_the_test_constructor_permits_loopback() {
        let policy = AddressPolicy::new(true, []);
        assert_eq!(policy.check(ip("127.0.0.1")), Err(Class::Loopback));
        let test_policy = policy.permitting_loopback();
        assert_eq!(test_policy.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(test_policy.check(ip("::1")), Ok(()));
        assert_eq!(
            test_policy.check(ip("169.254.169.254")),
            Err(Class::LinkLocal)
        );
    }
}
