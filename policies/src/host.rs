//! Host canonicalisation (SPEC §3.2): every spelling of a destination is
//! reduced to one form before any pattern sees it, so that `127.1`,
//! `0x7f.0.0.1` and `[::ffff:127.0.0.1]` cannot slip past an IP rule and
//! `EXAMPLE.com.` cannot slip past a name rule.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The longest host name DNS can carry.
pub const MAX_HOST_LEN: usize = 253;

/// A canonical destination host: a lowercase punycode name without a
/// trailing dot, or an IP address (IPv4-mapped IPv6 becomes IPv4).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host {input:?}: {why}")]
pub struct InvalidHost {
    pub input: String,
    pub why: &'static str,
}

fn invalid(input: &str, why: &'static str) -> InvalidHost {
    InvalidHost {
        input: input.chars().take(300).collect(),
        why,
    }
}

impl Host {
    /// Canonicalise a host as a client wrote it (CONNECT authority, SOCKS
    /// domain, `Host` header, policy pattern).
    pub fn parse(input: &str) -> Result<Host, InvalidHost> {
        if input.is_empty() {
            return Err(invalid(input, "empty"));
        }
        if input.len() > MAX_HOST_LEN + 2 {
            return Err(invalid(input, "longer than 253 bytes"));
        }
        if let Some(c) = input
            .chars()
            .find(|c| matches!(c, '\0' | '\r' | '\n' | ' ' | '@' | '/' | '\\' | '%' | '\t'))
        {
            let _ = c;
            return Err(invalid(input, "contains a forbidden character"));
        }
        if let Some(inner) = input.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| invalid(input, "unclosed '['"))?;
            let v6 = Ipv6Addr::from_str(inner).map_err(|_| invalid(input, "bad IPv6 literal"))?;
            return Ok(Host::Ip(canonical_ip(IpAddr::V6(v6))));
        }
        if input.contains(':') {
            // A bare IPv6 literal (SOCKS5 and policy files may write one).
            let v6 = Ipv6Addr::from_str(input).map_err(|_| invalid(input, "bad IPv6 literal"))?;
            return Ok(Host::Ip(canonical_ip(IpAddr::V6(v6))));
        }
        let trimmed = input.strip_suffix('.').unwrap_or(input);
        if trimmed.is_empty() || trimmed.ends_with('.') {
            return Err(invalid(input, "empty label"));
        }
        // IDNA first (it maps fullwidth digits and drops ignorable code
        // points), then the WHATWG rule on what is left: a host whose last
        // label is numeric is an IPv4 address in one of inet_aton's
        // spellings, or it is invalid. The other order let "127.0.0.1"
        // plus an ignorable character pass as a name.
        let ascii =
            idna::domain_to_ascii(trimmed).map_err(|_| invalid(input, "not a valid IDN"))?;
        let ascii = ascii.strip_suffix('.').map(str::to_string).unwrap_or(ascii);
        if ascii.is_empty() || ascii.ends_with('.') {
            return Err(invalid(input, "empty label"));
        }
        if ends_in_number(&ascii) {
            return parse_ipv4_loose(&ascii)
                .map(|v4| Host::Ip(IpAddr::V4(v4)))
                .ok_or_else(|| invalid(input, "numeric host that is not a valid IPv4 address"));
        }
        if ascii.len() > MAX_HOST_LEN {
            return Err(invalid(input, "longer than 253 bytes"));
        }
        for label in ascii.split('.') {
            if label.is_empty() {
                return Err(invalid(input, "empty label"));
            }
            if label.len() > 63 {
                return Err(invalid(input, "label longer than 63 bytes"));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(input, "contains a forbidden character"));
            }
        }
        Ok(Host::Name(ascii))
    }

    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Host::Ip(ip) => Some(*ip),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(v4)) => write!(f, "{v4}"),
            Host::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 address: the kernel
/// connects to it as such.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn ends_in_number(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or("");
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    matches!(hex, Some(h) if h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn parse_part(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        return Some(0); // "0x" alone is zero, as inet_aton reads it
    }
    if digits.len() > 20 {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// inet_aton's forms: `a.b.c.d`, `a.b.c` (c is 16 bits), `a.b` (b is 24
/// bits) and `a` (32 bits), each part decimal, octal (leading 0) or hex.
pub fn parse_ipv4_loose(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let nums = parts
        .iter()
        .map(|p| parse_part(p))
        .collect::<Option<Vec<u64>>>()?;
    let (head, last) = nums.split_at(nums.len() - 1);
    if head.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (5 - nums.len()) as u32;
    if last[0] >= 1u64 << last_bits {
        return None;
    }
    let mut value: u32 = 0;
    for (i, &n) in head.iter().enumerate() {
        value |= (n as u32) << (24 - 8 * i as u32);
    }
    value |= last[0] as u32;
    Some(Ipv4Addr::from(value))
}

/// A destination: canonical host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Host(#[from] InvalidHost),
    #[error("invalid port in {0:?}: ports are 1 to 65535")]
    Port(String),
    #[error("{0:?} has no port")]
    NoPort(String),
}

impl Target {
    pub fn new(host: Host, port: u16) -> Target {
        Target { host, port }
    }

    /// Parse `host:port`, `[v6]:port`, or `host` with `default_port`.
    pub fn parse(input: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
        let (host, port) = split_host_port(input);
        let port = match port {
            Some(p) => parse_port(p).ok_or_else(|| TargetError::Port(input.to_string()))?,
            None => default_port.ok_or_else(|| TargetError::NoPort(input.to_string()))?,
        };
        Ok(Target {
            host: Host::parse(host)?,
            port,
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

pub(crate) fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Split an authority into host and optional port. A bare IPv6 literal
/// (more than one colon, no brackets) has no port.
pub(crate) fn split_host_port(input: &str) -> (&str, Option<&str>) {
    if input.starts_with('[') {
        if let Some(end) = input.find(']') {
            let (h, rest) = input.split_at(end + 1);
            return match rest.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => (input, None),
            };
        }
        return (input, None);
    }
    match input.matches(':').count() {
        1 => {
            let (h, p) = input.split_once(':').unwrap_or((input, ""));
            (h, Some(p))
        }
        _ => (input, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn loopback_spellings_are_one_address() {
        for s in [
            "127.0.0.1",
            "2130706433",
            "127.1",
            "127.0.1",
            "0x7f.0.0.1",
            "0x7f000001",
            "0177.0.0.1",
            "017700000001",
            "[::ffff:127.0.0.1]",
            "::ffff:7f00:1",
            "127.0.0.1.",
        ] {
            assert_eq!(Host::parse(s).unwrap(), ip("127.0.0.1"), "{s}");
        }
    }

    #[test]
    fn numbers_hidden_behind_idna_are_still_addresses() {
        // Found by the host_pattern fuzz target: U+034F is dropped by IDNA.
        assert_eq!(Host::parse("2.21\u{34f}\u{34f}").unwrap(), ip("2.0.0.21"));
        assert_eq!(Host::parse("127.0.0.1\u{34f}").unwrap(), ip("127.0.0.1"));
        // Fullwidth digits and dots map to ASCII.
        assert_eq!(
            Host::parse("\u{ff11}\u{ff12}\u{ff17}\u{ff0e}\u{ff10}\u{ff0e}\u{ff10}\u{ff0e}\u{ff11}")
                .unwrap(),
            ip("127.0.0.1")
        );
    }

    #[test]
    fn ipv6_literals() {
        assert_eq!(Host::parse("[::1]").unwrap(), ip("::1"));
        assert_eq!(Host::parse("[2001:DB8::1]").unwrap(), ip("2001:db8::1"));
        assert!(Host::parse("[::1").is_err());
        assert!(Host::parse("[zz::1]").is_err());
    }

    #[test]
    fn names_are_lowercased_and_dot_trimmed() {
        assert_eq!(
            Host::parse("API.Example.COM.").unwrap(),
            Host::Name("api.example.com".into())
        );
    }

    #[test]
    fn idn_becomes_punycode() {
        assert_eq!(
            Host::parse("bücher.example").unwrap(),
            Host::Name("xn--bcher-kva.example".into())
        );
    }

    #[test]
    fn forbidden_characters_and_lengths() {
        for s in [
            "a b.com",
            "a@b.com",
            "a/b",
            "a\\b",
            "a%2eb",
            "a\0b",
            "a\rb",
            "a\nb",
            "",
            ".",
            "a..b",
            "256.1.1.1",
            "1.2.3.4.5",
            "1.2.3.99999",
        ] {
            assert!(Host::parse(s).is_err(), "{s:?} should be invalid");
        }
        let long = format!("{}.com", "a.".repeat(130));
        assert!(Host::parse(&long).is_err());
        let label = format!("{}.com", "a".repeat(64));
        assert!(Host::parse(&label).is_err());
    }

    #[test]
    fn numeric_looking_names_that_are_not_last_label_stay_names() {
        assert_eq!(
            Host::parse("1.2.3.4.example").unwrap(),
            Host::Name("1.2.3.4.example".into())
        );
    }

    #[test]
    fn targets() {
        let t = Target::parse("Example.com:8443", None).unwrap();
        assert_eq!(t.to_string(), "example.com:8443");
        let t = Target::parse("[::1]:80", None).unwrap();
        assert_eq!(t.host, ip("::1"));
        assert_eq!(Target::parse("example.com", Some(443)).unwrap().port, 443);
        assert!(Target::parse("example.com:0", None).is_err());
        assert!(Target::parse("example.com:99999", None).is_err());
        assert!(Target::parse("example.com:", None).is_err());
        assert!(Target::parse("example.com", None).is_err());
    }
}
