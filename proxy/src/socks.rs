//! SOCKS5 (RFC 1928) on the proxy's port: no authentication, CONNECT only,
//! domain names resolved by the proxy. Every failure gets its reply code.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_policy::{Host, Target};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::engine::{Conn, Engine, Protocol};
use crate::refusal::Refusal;
use crate::tunnel::{self, Gate, Stream};

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0x00;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 0x01;
const REP_GENERAL: u8 = 0x01;
const REP_CMD_UNSUPPORTED: u8 = 0x07;
const REP_ATYP_UNSUPPORTED: u8 = 0x08;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

enum Request {
    Target(Target),
    Reply(u8, String),
}

async fn reply<S: AsyncWrite + Unpin>(stream: &mut S, code: u8, bound: Option<SocketAddr>) {
    let mut msg = vec![VERSION, code, 0];
    match bound {
        Some(SocketAddr::V6(a)) => {
            msg.push(4);
            msg.extend_from_slice(&a.ip().octets());
            msg.extend_from_slice(&a.port().to_be_bytes());
        }
        Some(SocketAddr::V4(a)) => {
            msg.push(1);
            msg.extend_from_slice(&a.ip().octets());
            msg.extend_from_slice(&a.port().to_be_bytes());
        }
        None => msg.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0]),
    }
    let _ = stream.write_all(&msg).await;
}

/// Greeting and request; `Ok(None)` when the client got its answer already.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> std::io::Result<Option<Request>> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await?;
    if head[0] != VERSION {
        return Ok(None);
    }
    let mut methods = vec![0u8; head[1] as usize];
    stream.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        stream.write_all(&[VERSION, NO_ACCEPTABLE]).await?;
        return Ok(None);
    }
    stream.write_all(&[VERSION, NO_AUTH]).await?;

    let mut req = [0u8; 4];
    stream.read_exact(&mut req).await?;
    if req[0] != VERSION {
        return Ok(Some(Request::Reply(
            REP_GENERAL,
            "bad SOCKS version in request".into(),
        )));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a).await?;
            Ok(Host::Ip(Ipv4Addr::from(a).into()))
        }
        4 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a).await?;
            Ok(Host::Ip(airlock_policy::host::canonical_ip(
                Ipv6Addr::from(a).into(),
            )))
        }
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await?;
            let mut name = vec![0u8; len[0] as usize];
            stream.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(n) => Host::parse(&n).map_err(|e| e.to_string()),
                Err(_) => Err("domain name is not UTF-8".into()),
            }
        }
        _ => {
            return Ok(Some(Request::Reply(
                REP_ATYP_UNSUPPORTED,
                "unknown address type".into(),
            )))
        }
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port).await?;
    if req[1] != CMD_CONNECT {
        return Ok(Some(Request::Reply(
            REP_CMD_UNSUPPORTED,
            "only CONNECT is supported".into(),
        )));
    }
    let port = u16::from_be_bytes(port);
    Ok(Some(match host {
        Ok(_) if port == 0 => Request::Reply(REP_ATYP_UNSUPPORTED, "port 0".into()),
        Ok(host) => Request::Target(Target::new(host, port)),
        Err(e) => Request::Reply(REP_ATYP_UNSUPPORTED, e),
    }))
}

/// Serve one SOCKS5 client (any byte stream: a socket, or an in-memory
/// pipe under the fuzzer).
pub async fn serve<S: Stream>(engine: Arc<Engine>, mut stream: S, conn: Conn) {
    let request = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut stream)).await {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => {
            tracing::debug!(conn = conn.id, "SOCKS5 handshake failed: {e}");
            return;
        }
        Err(_) => return,
    };
    let target = match request {
        Request::Target(t) => t,
        Request::Reply(code, why) => {
            let r = Refusal::invalid("(SOCKS5 request)", why);
            engine.refused(&conn, Protocol::Socks5, r, None);
            reply(&mut stream, code, None).await;
            return;
        }
    };
    let Some(_permit) = engine.tunnel_permit() else {
        reply(&mut stream, REP_GENERAL, None).await;
        return;
    };
    let inspect = match engine.inspection(&target) {
        Ok(b) => b,
        Err(r) => {
            let r = engine.refused(&conn, Protocol::Socks5, *r, None);
            reply(&mut stream, r.socks_code(), None).await;
            return;
        }
    };
    let dialed = match engine.connect(&conn, &target, Protocol::Socks5).await {
        Ok(d) => d,
        Err(refusal) => {
            reply(&mut stream, refusal.socks_code(), None).await;
            return;
        }
    };
    reply(&mut stream, 0, dialed.stream.local_addr().ok()).await;
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
    if let Some(tunnel::TunnelError::Refused(why)) = &err {
        engine.refused(
            &conn,
            Protocol::Socks5,
            Refusal::new(airlock_policy::Reason::SniMismatch, &target, why.clone()),
            Some(dialed.addr.ip()),
        );
    }
    engine.closed(&conn, &target, since, totals, err.map(|e| e.to_string()));
}
