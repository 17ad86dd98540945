//! Host patterns (SPEC §3.2): `name`, `*.suffix`, an IP, a CIDR, or a bare
//! `*` in deny and inspect lists, each with an optional `:PORT` or `:*`.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::host::{split_host_port, Host, Target};

/// Which list a pattern sits in: it changes what a bare `*` and a missing
/// port mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternList {
    Allow,
    Deny,
    Inspect,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatcher {
    /// Exactly this canonical name.
    Exact(String),
    /// Any subdomain of this name, at any depth, but not the name itself.
    Subdomains(String),
    Ip(IpAddr),
    Net(IpNet),
    /// Bare `*`, only in deny and inspect.
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// No port written: 80 and 443 in allow lists, every port in deny and
    /// inspect lists (a deny that left other ports open would surprise).
    Web,
    One(u16),
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub host: HostMatcher,
    pub ports: Ports,
    /// The pattern as written, for messages.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host pattern {text:?}: {why}")]
pub struct PatternError {
    pub text: String,
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternMatch {
    No,
    /// The host matches but the port does not: `port-not-allowed`.
    HostOnly,
    Yes,
}

impl Pattern {
    pub fn parse(text: &str, list: PatternList) -> Result<Pattern, PatternError> {
        let err = |why: &str| PatternError {
            text: text.chars().take(300).collect(),
            why: why.to_string(),
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("empty pattern"));
        }
        if let Some((scheme, rest)) = trimmed.split_once("://") {
            // A URL where a host pattern belongs: say what a pattern is.
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
            return Err(err(&format!(
                "a host pattern is a host name with an optional port (example.com, *.example.com, example.com:8443, 10.0.0.0/8), not a URL; \
                 for {scheme}://{host}/ write {host}{}",
                if host.contains(':') { "" } else { " (ports 80 and 443)" }
            )));
        }
        if let Some((host, path)) = trimmed.split_once('/') {
            // A host with a path (example.com/simple): rules match hosts,
            // never paths; a CIDR's part after the slash is a number.
            let after = path.split(':').next().unwrap_or("");
            if after.is_empty() || !after.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(&format!(
                    "a host pattern takes a host (with an optional port), not a path: write {host}; \
                     to limit paths use a [[network.request]] rule"
                )));
            }
        }
        let (host_part, port_part) = if trimmed.contains('/') && !trimmed.starts_with('[') {
            // CIDR: an IPv4 CIDR may carry a port after its prefix length.
            match trimmed.rsplit_once('/') {
                Some((_, len)) if len.contains(':') => {
                    let (h, p) = trimmed.rsplit_once(':').unwrap_or((trimmed, ""));
                    (h, Some(p))
                }
                _ => (trimmed, None),
            }
        } else {
            split_host_port(trimmed)
        };
        let ports = match port_part {
            None => Ports::Web,
            Some("*") => Ports::Any,
            Some(p) => Ports::One(
                crate::host::parse_port(p).ok_or_else(|| err("port must be 1-65535 or *"))?,
            ),
        };
        let host = if host_part == "*" {
            if list == PatternList::Allow {
                return Err(err(
                    "a bare * is only valid in deny and inspect; allow needs explicit hosts",
                ));
            }
            HostMatcher::Any
        } else if let Some(suffix) = host_part.strip_prefix("*.") {
            if suffix.contains('*') {
                return Err(err(
                    "* may appear only once, as the whole first label (*.example.com)",
                ));
            }
            match Host::parse(suffix) {
                Ok(Host::Name(n)) if n.contains('.') => HostMatcher::Subdomains(n),
                Ok(Host::Name(_)) => {
                    return Err(err(
                        "a wildcard needs at least two labels after *. (*.com is too broad)",
                    ))
                }
                Ok(Host::Ip(_)) => return Err(err("wildcards never match IP addresses")),
                Err(e) => return Err(err(e.why)),
            }
        } else if host_part.contains('*') {
            return Err(err(
                "* may appear only as the whole first label (*.example.com)",
            ));
        } else if host_part.contains('/') {
            let net: IpNet = host_part
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| err("bad CIDR"))?;
            HostMatcher::Net(net.trunc())
        } else {
            match Host::parse(host_part) {
                Ok(Host::Name(n)) => HostMatcher::Exact(n),
                Ok(Host::Ip(ip)) => HostMatcher::Ip(ip),
                Err(e) => return Err(err(e.why)),
            }
        };
        let ports = match (list, ports) {
            (PatternList::Deny | PatternList::Inspect, Ports::Web) => Ports::Any,
            (_, p) => p,
        };
        Ok(Pattern {
            host,
            ports,
            text: trimmed.to_string(),
        })
    }

    pub fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostMatcher::Any, _) => true,
            (HostMatcher::Exact(p), Host::Name(n)) => p == n,
            (HostMatcher::Subdomains(s), Host::Name(n)) => {
                n.len() > s.len() + 1
                    && n.ends_with(s.as_str())
                    && n.as_bytes()[n.len() - s.len() - 1] == b'.'
            }
            (HostMatcher::Ip(p), Host::Ip(ip)) => p == ip,
            (HostMatcher::Net(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }

    pub fn matches_port(&self, port: u16) -> bool {
        match self.ports {
            Ports::Any => true,
            Ports::One(p) => p == port,
            Ports::Web => port == 80 || port == 443,
        }
    }

    pub fn matches(&self, target: &Target) -> PatternMatch {
        if !self.matches_host(&target.host) {
            PatternMatch::No
        } else if self.matches_port(target.port) {
            PatternMatch::Yes
        } else {
            PatternMatch::HostOnly
        }
    }

    /// Whether some target matches both patterns: used to report a lower
    /// file's allow that a managed deny overrides.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        let ports = match (self.ports, other.ports) {
            (Ports::Any, _) | (_, Ports::Any) => true,
            (Ports::Web, Ports::Web) => true,
            (Ports::One(a), Ports::One(b)) => a == b,
            (Ports::One(p), Ports::Web) | (Ports::Web, Ports::One(p)) => p == 80 || p == 443,
        };
        ports && hosts_overlap(&self.host, &other.host)
    }
}

fn is_subdomain(name: &str, of: &str) -> bool {
    name.len() > of.len() + 1
        && name.ends_with(of)
        && name.as_bytes()[name.len() - of.len() - 1] == b'.'
}

fn hosts_overlap(a: &HostMatcher, b: &HostMatcher) -> bool {
    use HostMatcher::*;
    match (a, b) {
        (Any, _) | (_, Any) => true,
        (Exact(x), Exact(y)) => x == y,
        (Exact(x), Subdomains(s)) | (Subdomains(s), Exact(x)) => is_subdomain(x, s),
        (Subdomains(x), Subdomains(y)) => x == y || is_subdomain(x, y) || is_subdomain(y, x),
        (Ip(x), Ip(y)) => x == y,
        (Ip(x), Net(n)) | (Net(n), Ip(x)) => n.contains(x),
        (Net(x), Net(y)) => x.contains(&y.network()) || y.contains(&x.network()),
        _ => false,
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Target {
        Target::parse(s, Some(443)).unwrap()
    }
    fn allow(s: &str) -> Pattern {
        Pattern::parse(s, PatternList::Allow).unwrap()
    }

    #[test]
    fn apex_and_wildcard() {
        let apex = allow("example.com");
        let wild = allow("*.example.com");
        assert_eq!(apex.matches(&t("example.com")), PatternMatch::Yes);
        assert_eq!(apex.matches(&t("a.example.com")), PatternMatch::No);
        assert_eq!(wild.matches(&t("example.com")), PatternMatch::No);
        assert_eq!(wild.matches(&t("a.example.com")), PatternMatch::Yes);
        assert_eq!(wild.matches(&t("a.b.example.com")), PatternMatch::Yes);
        for lookalike in [
            "evil-example.com",
            "example.com.evil.net",
            "aexample.com",
            "example.co",
        ] {
            assert_eq!(apex.matches(&t(lookalike)), PatternMatch::No, "{lookalike}");
            assert_eq!(wild.matches(&t(lookalike)), PatternMatch::No, "{lookalike}");
        }
    }

    #[test]
    fn invalid_wildcards() {
        for p in [
            "*",
            "*.com",
            "ex*.com",
            "a.*.com",
            "*example.com",
            "*.*.example.com",
            "*.127.0.0.1",
        ] {
            assert!(Pattern::parse(p, PatternList::Allow).is_err(), "{p}");
        }
        assert_eq!(
            Pattern::parse("*", PatternList::Deny).unwrap().host,
            HostMatcher::Any
        );
        assert_eq!(
            Pattern::parse("*", PatternList::Inspect).unwrap().host,
            HostMatcher::Any
        );
        assert!(Pattern::parse("*.com", PatternList::Deny).is_err());
    }

    #[test]
    fn ports() {
        let p = allow("git.example.com:22");
        assert_eq!(p.matches(&t("git.example.com:22")), PatternMatch::Yes);
        assert_eq!(p.matches(&t("git.example.com:443")), PatternMatch::HostOnly);
        let web = allow("example.com");
        assert_eq!(web.matches(&t("example.com:80")), PatternMatch::Yes);
        assert_eq!(web.matches(&t("example.com:8080")), PatternMatch::HostOnly);
        assert_eq!(
            allow("example.com:*").matches(&t("example.com:8080")),
            PatternMatch::Yes
        );
        let deny = Pattern::parse("example.com", PatternList::Deny).unwrap();
        assert_eq!(deny.matches(&t("example.com:8080")), PatternMatch::Yes);
        assert!(Pattern::parse("example.com:0", PatternList::Allow).is_err());
        assert!(Pattern::parse("example.com:70000", PatternList::Allow).is_err());
    }

    #[test]
    fn ips_and_cidrs() {
        let p = allow("127.0.0.1:8080");
        assert_eq!(p.matches(&t("2130706433:8080")), PatternMatch::Yes);
        assert_eq!(p.matches(&t("0x7f.0.0.1:8080")), PatternMatch::Yes);
        let net = allow("10.0.0.0/8");
        assert_eq!(net.matches(&t("10.1.2.3:443")), PatternMatch::Yes);
        assert_eq!(net.matches(&t("11.1.2.3:443")), PatternMatch::No);
        let net_port = allow("10.0.0.0/8:5432");
        assert_eq!(net_port.matches(&t("10.1.2.3:5432")), PatternMatch::Yes);
        let v6 = allow("fd00::/8");
        assert_eq!(v6.matches(&t("[fd12::1]:443")), PatternMatch::Yes);
        assert_eq!(allow("[::1]:80").matches(&t("[::1]:80")), PatternMatch::Yes);
    }

    #[test]
    fn overlap() {
        let d = Pattern::parse("*.evil.com", PatternList::Deny).unwrap();
        assert!(d.overlaps(&allow("x.evil.com")));
        assert!(d.overlaps(&allow("*.a.evil.com")));
        assert!(!d.overlaps(&allow("evil.com")));
        assert!(!d.overlaps(&allow("good.com")));
    }
}
