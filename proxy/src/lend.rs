//! Who and what a credential is lent to (SPEC §3.4, §5.4).
//!
//! - A credential reads, it does not publish: the proxy sets it on reads
//!   (and on what its entry's `methods` list); any other request that
//!   would carry it is a question for the approver (`Engine::lend`).
//! - A proxy that other local users can reach (`airlock proxy`, the
//!   degraded tier's loopback port) lends credentials only to clients of
//!   its own uid, found from the kernel's socket table, never from
//!   anything the client says.

use std::net::{IpAddr, SocketAddr};

use airlock_policy::request::{is_read, normalize_path};
use http::HeaderMap;

use crate::inspect::Credential;

/// Which clients may have credentials added to their requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LendTo {
    /// Only the sandbox can reach the proxy (its own network namespace).
    Sandbox,
    /// Loopback clients whose socket belongs to this uid; nobody else.
    Uid(u32),
}

impl LendTo {
    /// Whether the client at `peer` may use credentials; why not otherwise.
    pub fn check(self, peer: SocketAddr) -> Result<(), String> {
        let uid = match self {
            LendTo::Sandbox => return Ok(()),
            LendTo::Uid(uid) => uid,
        };
        let ip = airlock_policy::host::canonical_ip(peer.ip());
        if !ip.is_loopback() {
            return Err(format!(
                "the client {peer} is not on this machine, so its user cannot be told; credentials are lent only to uid {uid}'s loopback clients"
            ));
        }
        match peer_uid(SocketAddr::new(ip, peer.port())) {
            Ok(u) if u == uid => Ok(()),
            Ok(u) => Err(format!(
                "the client's socket belongs to uid {u}; this proxy lends its credentials only to uid {uid}"
            )),
            Err(e) => Err(format!(
                "the client's user could not be found ({e}); credentials are lent only to uid {uid}"
            )),
        }
    }
}

/// The uid owning the TCP socket whose local address is `addr` (a loopback
/// client of ours), from `/proc/net/tcp` or `tcp6`. Several sockets with
/// that address and different owners are an error: fail closed.
#[cfg(target_os = "linux")]
pub fn peer_uid(addr: SocketAddr) -> Result<u32, String> {
    let mut found: Option<u32> = None;
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid ...
            let (Some(local), Some(st), Some(uid)) = (f.get(1), f.get(3), f.get(7)) else {
                continue;
            };
            // 01: ESTABLISHED.
            if *st != "01" || parse_proc_addr(local, v6) != Some(addr) {
                continue;
            }
            let uid: u32 = uid.parse().map_err(|_| format!("{file}: bad uid {uid}"))?;
            match found {
                Some(u) if u != uid => {
                    return Err(format!("two sockets of different users have {addr}"))
                }
                _ => found = Some(uid),
            }
        }
    }
    found.ok_or_else(|| format!("no socket with the address {addr}"))
}

#[cfg(not(target_os = "linux"))]
pub fn peer_uid(_: SocketAddr) -> Result<u32, String> {
    Err("the socket table is read on Linux only".into())
}

/// `0100007F:1F90` (IPv4, each 32-bit word in host order) or the 32-hex-digit
/// IPv6 form; IPv4-mapped IPv6 comes back as IPv4.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse_proc_addr(text: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints each 32-bit word as the number it holds in memory:
    // its native-order bytes are the address's bytes.
    let word = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::to_ne_bytes);
    let ip: IpAddr = match (v6, ip.len()) {
        (false, 8) => IpAddr::from(word(ip)?),
        (true, 32) => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            IpAddr::from(bytes)
        }
        _ => return None,
    };
    Some(SocketAddr::new(
        airlock_policy::host::canonical_ip(ip),
        port,
    ))
}

/// Whether `cred` is lent to this request without asking: a read (and no
/// header or parameter asking the origin to take it as another method), or
/// what the entry's `methods` list. A path that cannot be normalised is a
/// read only by its method.
pub fn lent(cred: &Credential, method: &str, path: &str, headers: &HeaderMap) -> bool {
    let overridden = crate::rules::method_override(headers, path).is_some();
    let Ok(norm) = normalize_path(path) else {
        return !overridden && matches!(method, "GET" | "HEAD");
    };
    if overridden {
        // Only an entry that lends every method covers an overridden one.
        return cred
            .methods
            .iter()
            .any(|m| m.method == "*" && m.matches(method, &norm));
    }
    is_read(method, &norm) || cred.methods.iter().any(|m| m.matches(method, &norm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_addresses_parse() {
        assert_eq!(
            parse_proc_addr("0100007F:1F90", false),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_proc_addr("00000000000000000000000001000000:0050", true),
            Some("[::1]:80".parse().unwrap())
        );
        // ::ffff:127.0.0.1
        assert_eq!(
            parse_proc_addr("0000000000000000FFFF00000100007F:0050", true),
            Some("127.0.0.1:80".parse().unwrap())
        );
        assert_eq!(parse_proc_addr("zz:1", false), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_loopback_client_is_found_with_its_uid() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        let me = unsafe { libc::geteuid() };
        assert_eq!(peer_uid(peer), Ok(me));
        assert!(LendTo::Uid(me).check(peer).is_ok());
        assert!(LendTo::Uid(me + 1).check(peer).is_err());
        assert!(LendTo::Uid(me)
            .check("192.0.2.1:5000".parse().unwrap())
            .is_err());
    }
}
