//! Classifying resolved addresses (SPEC §5.1): a name that resolves into
//! loopback, a private range or cloud metadata is refused unless the
//! policy's `allow_private` covers it. Pure, so it can be tested alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why an address is not public, or `None` when it is.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match crate::host::canonical_ip(ip) {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn in4(ip: Ipv4Addr, net: &str) -> bool {
    net.parse::<Ipv4Net>().is_ok_and(|n| n.contains(&ip))
}

fn in6(ip: Ipv6Addr, net: &str) -> bool {
    net.parse::<Ipv6Net>().is_ok_and(|n| n.contains(&ip))
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[(&str, &str)] = &[
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "CGNAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "reserved"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    ];
    if ip.is_broadcast() {
        return Some("broadcast");
    }
    RANGES.iter().find(|(n, _)| in4(ip, n)).map(|(_, why)| *why)
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    const RANGES: &[(&str, &str)] = &[
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::ffff:0:0/96", "IPv4-mapped"),
        ("::/96", "IPv4-compatible"),
        ("64:ff9b::/96", "NAT64"),
        ("64:ff9b:1::/48", "NAT64"),
        ("100::/64", "discard"),
        ("2001::/32", "Teredo"),
        ("2001:db8::/32", "documentation"),
        ("2001::/23", "reserved"),
        ("2002::/16", "6to4"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    ];
    RANGES.iter().find(|(n, _)| in6(ip, n)).map(|(_, why)| *why)
}

/// The check done after DNS and before every dial: `Err(why)` refuses the
/// address with reason `private-address`. `own` holds the proxy's own
/// addresses, which are refused even inside `allow_private` so the proxy
/// can't be made to connect to itself.
pub fn check_address(
    ip: IpAddr,
    allow_private: &[IpNet],
    own: &[IpAddr],
) -> Result<(), &'static str> {
    let ip = crate::host::canonical_ip(ip);
    if own.contains(&ip) {
        return Err("the proxy's own address");
    }
    match special_range(ip) {
        None => Ok(()),
        Some(_) if allow_private.iter().any(|n| n.contains(&ip)) => Ok(()),
        Some(why) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn special_ranges() {
        for s in [
            "127.0.0.1",
            "10.1.1.1",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "2001:0:4136:e378::1",
        ] {
            assert!(special_range(ip(s)).is_some(), "{s} should be special");
        }
        for s in ["93.184.216.34", "1.1.1.1", "2606:4700::1111"] {
            assert_eq!(special_range(ip(s)), None, "{s} should be public");
        }
    }

    #[test]
    fn allow_private_and_own_addresses() {
        let lo: IpNet = "127.0.0.0/8".parse().unwrap();
        assert!(check_address(ip("127.0.0.1"), &[], &[]).is_err());
        assert!(check_address(ip("127.0.0.1"), &[lo], &[]).is_ok());
        assert!(check_address(ip("::ffff:127.0.0.1"), &[lo], &[]).is_ok());
        assert!(check_address(ip("169.254.169.254"), &[lo], &[]).is_err());
        assert!(check_address(ip("127.0.0.1"), &[lo], &[ip("127.0.0.1")]).is_err());
    }
}
