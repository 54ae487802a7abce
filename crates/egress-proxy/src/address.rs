//! Address classification: which resolved addresses the proxy never dials.
//!
//! Always forbidden: `0.0.0.0/8`, `127.0.0.0/8`, `169.254.0.0/16`, the cloud metadata
//! addresses `100.100.100.200` and `168.63.129.16`, `224.0.0.0/4`, `240.0.0.0/4` (reserved and
//! broadcast), `::`, `::1`, `fe80::/10`, `ff00::/8`, `fd00:ec2::254`, the IPv4-compatible
//! `::/96`, and the addresses of the deny list (the outbound network's gateways). Forbidden
//! unless private destinations are allowed: `10/8`, `172.16/12`, `192.168/16`, `100.64/10`,
//! `fc00::/7` and `fec0::/10`. IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::/96`)
//! addresses are classified by the IPv4 address they carry.

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
    /// On the deny list.
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
            Class::Denied => "denied gateway",
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
            ("2001:db8::1", None),
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
