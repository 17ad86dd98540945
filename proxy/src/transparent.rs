//! Captured connections (SPEC §5.5): the sandbox's network namespace
//! redirects every outgoing TCP connection to a listener served here. The
//! original destination comes from the kernel (SO_ORIGINAL_DST), and the
//! connection is then handled exactly as a CONNECT to it: the same
//! decision, address check and pinning, SNI check, inspection, approvals,
//! audit (`protocol: "transparent"`) and exit report.
//!
//! The destination's name is, in order: the name the sandbox's DNS
//! answered with that address; else the TLS SNI or HTTP Host the client
//! sends first; else the bare IP, decided as an IP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_policy::{Host, Reason, Target};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::engine::{Conn, Engine, Protocol};
use crate::refusal::Refusal;
use crate::sni::Hello;
use crate::tunnel::{self, Gate, TunnelError};

/// How long to wait for a client's first bytes when they are needed to
/// name the destination. A protocol where the server speaks first waits
/// this long, then is decided by address.
const NAME_WAIT: Duration = Duration::from_millis(800);
const PEEK_MAX: usize = 16 * 1024;

/// Serve a capture listener until the future is dropped.
pub async fn serve(engine: Arc<Engine>, listener: TcpListener) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        engine.add_own_addr(addr);
    }
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("capture accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(client(engine.clone(), stream, peer));
    }
}

/// The destination the connection was addressed to before the NAT
/// redirect rewrote it.
pub fn original_dst(stream: &TcpStream) -> std::io::Result<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    const IP6T_SO_ORIGINAL_DST: libc::c_int = 80;
    let fd = stream.as_raw_fd();
    if stream.local_addr()?.is_ipv4() {
        // SAFETY: getsockopt into a zeroed sockaddr_in of the right length.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: as above; fd is a live socket we own.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IP,
                SO_ORIGINAL_DST,
                (&mut sa as *mut libc::sockaddr_in).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Ok(SocketAddr::new(ip.into(), u16::from_be(sa.sin_port)))
    } else {
        // SAFETY: getsockopt into a zeroed sockaddr_in6 of the right length.
        let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        // SAFETY: as above.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_IPV6,
                IP6T_SO_ORIGINAL_DST,
                (&mut sa as *mut libc::sockaddr_in6).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        Ok(SocketAddr::new(ip.into(), u16::from_be(sa.sin6_port)))
    }
}

/// What the client's first bytes say about where it means to go.
#[derive(Debug, Default)]
struct FirstBytes {
    name: Option<Host>,
    http: bool,
}

/// The SNI of a TLS ClientHello, or the Host of an HTTP request, from the
/// client's first bytes (peeked, so they still go upstream).
async fn peek_name(stream: &TcpStream) -> FirstBytes {
    let deadline = Instant::now() + NAME_WAIT;
    let mut buf = vec![0u8; PEEK_MAX];
    loop {
        let n = match tokio::time::timeout_at(deadline.into(), stream.peek(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            _ => return FirstBytes::default(),
        };
        match classify(&buf[..n]) {
            Some(found) => return found,
            None if n == buf.len() => return FirstBytes::default(),
            // Not all of it yet: peek returns at once while bytes wait, so
            // give the rest a moment to arrive.
            None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(5)).await,
            None => return FirstBytes::default(),
        }
    }
}

/// `None` while more bytes are needed to tell.
fn classify(bytes: &[u8]) -> Option<FirstBytes> {
    match crate::sni::parse(bytes) {
        Ok(None) => None,
        Ok(Some(Hello::Tls { sni })) => Some(FirstBytes {
            name: sni.and_then(|s| Host::parse(&s).ok()),
            http: false,
        }),
        Err(_) => Some(FirstBytes::default()),
        Ok(Some(Hello::NotTls)) => {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(bytes) {
                Ok(httparse::Status::Partial) => None,
                Ok(httparse::Status::Complete(_)) => {
                    let host = req
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("host"))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .and_then(|v| Target::parse(v, Some(80)).ok())
                        .map(|t| t.host);
                    Some(FirstBytes {
                        name: host,
                        http: true,
                    })
                }
                Err(_) => Some(FirstBytes::default()),
            }
        }
    }
}

/// Pick the target host: a DNS name the address was answered for (the one
/// the client names, if it names one of them), else the client's own
/// name, else the address.
fn choose(names: &[Host], said: Option<Host>, ip: IpAddr) -> Host {
    match (names.first(), said) {
        (Some(_), Some(s)) if names.contains(&s) => s,
        (Some(first), _) => first.clone(),
        (None, Some(s)) => s,
        (None, None) => Host::Ip(airlock_policy::host::canonical_ip(ip)),
    }
}

/// End a refused connection: a 403 with the refusal for a plain HTTP
/// client, a reset for anything else, so it fails at once.
async fn refuse(mut stream: TcpStream, refusal: &Refusal, http: bool) {
    if http {
        let body = refusal.body();
        let head = format!(
            "HTTP/1.1 {} {}\r\nX-Airlock-Decision: deny\r\nX-Airlock-Reason: {}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            refusal.status().as_u16(),
            refusal.status().canonical_reason().unwrap_or(""),
            refusal.reason.as_str(),
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.shutdown().await;
        return;
    }
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
}

async fn client(engine: Arc<Engine>, stream: TcpStream, peer: SocketAddr) {
    let conn = engine.open(peer);
    let orig = match original_dst(&stream) {
        Ok(a) => a,
        Err(e) => {
            // Not redirected by our rule (someone dialed the listener
            // directly): there is no destination to decide.
            tracing::debug!(
                conn = conn.id,
                "captured connection without a destination: {e}"
            );
            return;
        }
    };
    // The slot first: connections waiting for their first bytes count.
    let Some(permit) = engine.tunnel_permit() else {
        let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
        return;
    };
    // A placeholder stands for exactly one name awaiting approval: the
    // client's SNI or Host cannot make it another.
    let names = match engine.placeholders.name(orig.ip()) {
        Some(host) => vec![host],
        None => engine.names.lookup(orig.ip()),
    };
    let first = if names.len() == 1 {
        FirstBytes::default()
    } else {
        peek_name(&stream).await
    };
    let http = first.http;
    let host = choose(&names, first.name, orig.ip());
    let target = Target::new(host, orig.port());
    handle(engine, conn, stream, target, orig, http).await;
    drop(permit);
}

async fn handle(
    engine: Arc<Engine>,
    conn: Conn,
    stream: TcpStream,
    target: Target,
    orig: SocketAddr,
    http: bool,
) {
    let inspect = match engine.inspection(&target) {
        Ok(b) => b,
        Err(r) => {
            let r = engine.refused(&conn, Protocol::Transparent, *r, None);
            refuse(stream, &r, http).await;
            return;
        }
    };
    let dialed = match engine
        .connect_to(&conn, &target, Protocol::Transparent, Some(orig.ip()))
        .await
    {
        Ok(d) => d,
        Err(r) => {
            refuse(stream, &r, http).await;
            return;
        }
    };
    if inspect {
        crate::inspect::serve(engine, conn, target, stream, dialed.stream).await;
        return;
    }
    let since = Instant::now();
    let gate = Gate {
        host: target.host.clone(),
        require_tls: target.port == 443,
    };
    let (totals, err) = tunnel::run(
        stream,
        vec![],
        dialed.stream,
        Some(gate),
        engine.idle_timeout(),
    )
    .await;
    if let Some(TunnelError::Refused(why)) = &err {
        let r = Refusal::new(Reason::SniMismatch, &target, why.clone())
            .with_rule(dialed.decision.rule.clone());
        engine.refused(&conn, Protocol::Transparent, r, Some(dialed.addr.ip()));
    }
    engine.closed(&conn, &target, since, totals, err.map(|e| e.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn the_dns_name_wins_unless_the_client_names_another_of_its_names() {
        let ip: IpAddr = "93.184.215.14".parse().unwrap();
        let names = vec![host("a.example"), host("b.example")];
        assert_eq!(choose(&names, None, ip), host("a.example"));
        assert_eq!(
            choose(&names, Some(host("b.example")), ip),
            host("b.example")
        );
        // A name the DNS never answered with this address does not replace
        // it: the SNI check then refuses the mismatch.
        assert_eq!(
            choose(&names, Some(host("evil.example")), ip),
            host("a.example")
        );
        assert_eq!(choose(&[], Some(host("c.example")), ip), host("c.example"));
        assert_eq!(choose(&[], None, ip), Host::Ip(ip));
    }

    #[test]
    fn first_bytes_name_the_host() {
        let req = b"GET / HTTP/1.1\r\nHost: origin.test:8080\r\n\r\n";
        let f = classify(req).unwrap();
        assert!(f.http);
        assert_eq!(f.name, Some(host("origin.test")));
        assert!(classify(b"GET / HTTP/1.1\r\nHo").is_none());
        let f = classify(b"SSH-2.0-OpenSSH_9.6\r\n").unwrap();
        assert!(!f.http);
        assert_eq!(f.name, None);
    }
}
