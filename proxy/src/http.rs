//! HTTP/1.1 on hyper: CONNECT tunnels and absolute-form forwarding, with
//! hop-by-hop and `Proxy-*` headers removed (RFC 9110 §7.6.1).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_policy::{Reason, Target};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1 as client;
use hyper::server::conn::http1 as server;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Mutex;

use crate::count::Counted;
use crate::engine::{Conn, Engine, Protocol};
use crate::refusal::Refusal;
use crate::tunnel::{self, Gate, Stream, TunnelError};

type Body = BoxBody<Bytes, hyper::Error>;

/// Request heads larger than this get 431.
pub const MAX_HEAD: usize = 64 * 1024;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The upstream connection a client's keep-alive requests reuse, as long
/// as they go to the same target (each was decided when it was dialled).
struct Upstream {
    target: Target,
    sender: client::SendRequest<Incoming>,
}

/// Serve one client connection (any byte stream: a socket, or an
/// in-memory pipe under the fuzzer).
pub async fn serve<S: Stream>(engine: Arc<Engine>, stream: S, conn: Conn) {
    let cache: Arc<Mutex<Option<Upstream>>> = Arc::new(Mutex::new(None));
    let svc = {
        let conn = conn.clone();
        service_fn(move |req| {
            let (engine, conn, cache) = (engine.clone(), conn.clone(), cache.clone());
            async move { Ok::<_, Infallible>(handle::<S>(engine, conn, cache, req).await) }
        })
    };
    let result = server::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        // A client that sends its request and shuts down its write side
        // still gets the answer.
        .half_close(true)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!(conn = conn.id, "client connection ended: {e}");
    }
}

async fn handle<S: Stream>(
    engine: Arc<Engine>,
    conn: Conn,
    cache: Arc<Mutex<Option<Upstream>>>,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() == Method::CONNECT {
        connect::<S>(engine, conn, req).await
    } else {
        forward(engine, conn, cache, req).await
    }
}

fn full(resp: Response<Full<Bytes>>) -> Response<Body> {
    resp.map(|b| b.map_err(|never| match never {}).boxed())
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *r.status_mut() = status;
    if status == StatusCode::BAD_REQUEST {
        // Every refusal says it came from airlock, not from an origin.
        let h = r.headers_mut();
        h.insert("x-airlock-decision", HeaderValue::from_static("deny"));
        h.insert("x-airlock-reason", HeaderValue::from_static("invalid-host"));
    }
    full(r)
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r
}

fn too_many_tunnels() -> Response<Body> {
    plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "airlock: too many open tunnels (network.max_tunnels); try again when some close",
    )
}

async fn connect<S: Stream>(
    engine: Arc<Engine>,
    conn: Conn,
    req: Request<Incoming>,
) -> Response<Body> {
    let Some(authority) = req.uri().authority().map(|a| a.as_str().to_string()) else {
        let r = Refusal::invalid(&req.uri().to_string(), "CONNECT needs host:port");
        return full(engine.refused(&conn, Protocol::Connect, r, None).response());
    };
    let target = match Target::parse(&authority, None) {
        Ok(t) => t,
        Err(e) => {
            let r = Refusal::invalid(&authority, e.to_string());
            return full(engine.refused(&conn, Protocol::Connect, r, None).response());
        }
    };
    let Some(permit) = engine.tunnel_permit() else {
        return too_many_tunnels();
    };
    let inspect = match engine.inspection(&target) {
        Ok(b) => b,
        Err(r) => {
            return full(
                engine
                    .refused(&conn, Protocol::Connect, *r, None)
                    .response(),
            )
        }
    };
    let dialed = match engine.connect(&conn, &target, Protocol::Connect).await {
        Ok(d) => d,
        Err(refusal) => return full(refusal.response()),
    };
    tokio::spawn(async move {
        let _permit = permit;
        let since = Instant::now();
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(u) => u,
            Err(e) => {
                engine.closed(
                    &conn,
                    &target,
                    since,
                    Default::default(),
                    Some(format!("upgrade failed: {e}")),
                );
                return;
            }
        };
        if inspect {
            crate::inspect::serve(engine, conn, target, TokioIo::new(upgraded), dialed.stream)
                .await;
            return;
        }
        let gate = Gate {
            host: target.host.clone(),
            require_tls: target.port == 443,
        };
        // Unwrap hyper's upgrade back to the client socket so the tunnel
        // can splice; bytes hyper already buffered go upstream first.
        let idle = engine.idle_timeout();
        let (totals, err) = match upgraded.downcast::<TokioIo<S>>() {
            Ok(parts) => {
                let prefix = parts.read_buf.to_vec();
                tunnel::run(
                    parts.io.into_inner(),
                    prefix,
                    dialed.stream,
                    Some(gate),
                    idle,
                )
                .await
            }
            Err(upgraded) => {
                tunnel::run(
                    TokioIo::new(upgraded),
                    vec![],
                    dialed.stream,
                    Some(gate),
                    idle,
                )
                .await
            }
        };
        if let Some(TunnelError::Refused(why)) = &err {
            let r = Refusal::new(Reason::SniMismatch, &target, why.clone())
                .with_rule(dialed.decision.rule.clone());
            engine.refused(&conn, Protocol::Connect, r, Some(dialed.addr.ip()));
        }
        engine.closed(&conn, &target, since, totals, err.map(|e| e.to_string()));
    });
    empty(StatusCode::OK)
}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Remove hop-by-hop headers: those named in `Connection`, the fixed list,
/// and every `Proxy-*` header. An upgrade keeps `Connection: upgrade` and
/// `Upgrade` so the next hop sees it.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        if !(keep_upgrade && name == header::UPGRADE) {
            h.remove(name);
        }
    }
    for name in [
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ] {
        h.remove(name);
    }
    h.remove("keep-alive");
    let proxy: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        h.remove(name);
    }
    if keep_upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::UPGRADE);
    }
}

async fn dial_http(
    engine: &Arc<Engine>,
    conn: &Conn,
    target: &Target,
) -> Result<client::SendRequest<Incoming>, Response<Body>> {
    let dialed = engine
        .connect(conn, target, Protocol::Http)
        .await
        .map_err(|r| full(r.response()))?;
    let (io, counters) = Counted::new(dialed.stream);
    let (sender, connection) = client::handshake(TokioIo::new(io)).await.map_err(|e| {
        let r = Refusal::new(
            Reason::UpstreamUnreachable,
            target,
            format!("HTTP handshake failed: {e}"),
        );
        full(engine.refused(conn, Protocol::Http, r, None).response())
    })?;
    let (engine, conn, target) = (engine.clone(), conn.clone(), target.clone());
    tokio::spawn(async move {
        let since = Instant::now();
        let err = connection
            .with_upgrades()
            .await
            .err()
            .map(|e| e.to_string());
        engine.closed(&conn, &target, since, counters.totals(), err);
    });
    Ok(sender)
}

async fn forward(
    engine: Arc<Engine>,
    conn: Conn,
    cache: Arc<Mutex<Option<Upstream>>>,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let uri = req.uri().clone();
    let Some(authority) = uri.authority().map(|a| a.as_str().to_string()) else {
        return plain(
            StatusCode::BAD_REQUEST,
            "airlock is a proxy: send absolute-form requests (http://host/path) or CONNECT",
        );
    };
    if uri.scheme_str() != Some("http") {
        return plain(
            StatusCode::BAD_REQUEST,
            "airlock forwards plain http:// requests; use CONNECT for https:// and other schemes",
        );
    }
    let target = match Target::parse(&authority, Some(80)) {
        Ok(t) => t,
        Err(e) => {
            let r = Refusal::invalid(&authority, e.to_string());
            return full(engine.refused(&conn, Protocol::Http, r, None).response());
        }
    };
    let upgrade = is_upgrade(req.headers());
    let upgrade_to = upgrade.then(|| {
        req.headers()
            .get_all(header::UPGRADE)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(",")
    });
    let had_body = crate::rules::has_body(req.body());
    strip_hop_by_hop(req.headers_mut(), upgrade);
    let host_value = match HeaderValue::from_str(&authority) {
        Ok(v) => v,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "airlock: invalid authority"),
    };
    req.headers_mut().insert(header::HOST, host_value);
    let mut path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();

    let mut slot = cache.lock().await;
    let reusable = matches!(&*slot, Some(u) if u.target == target && !u.sender.is_closed());
    if !reusable {
        *slot = None;
        match dial_http(&engine, &conn, &target).await {
            Ok(sender) => {
                *slot = Some(Upstream {
                    target: target.clone(),
                    sender,
                })
            }
            Err(resp) => return resp,
        }
    }
    let Some(upstream) = slot.as_mut() else {
        return plain(StatusCode::BAD_GATEWAY, "airlock: no upstream connection");
    };
    // Request rules apply to plain HTTP too (SPEC §5.3): nothing needs
    // decrypting to read this request.
    if let Err(refusal) = crate::rules::check_framing(
        &engine,
        &target,
        req.method().as_str(),
        had_body,
        upgrade_to.as_deref(),
    ) {
        return full(
            engine
                .refused(&conn, Protocol::Http, *refusal, None)
                .response(),
        );
    }
    match crate::rules::check(
        &engine,
        &target,
        req.method().as_str(),
        &path,
        req.headers(),
    ) {
        Ok(None) => {}
        Ok(Some(normalised)) => path = normalised,
        Err(refusal) => {
            return full(
                engine
                    .refused(&conn, Protocol::Http, *refusal, None)
                    .response(),
            )
        }
    }
    // A review run holds what a hold rule names (SPEC §4.8); no
    // credential is set on plain HTTP, so nothing else is held here.
    let method = req.method().to_string();
    if let Some(why) = crate::hold::named(&engine, &target, &method, &path, req.headers()) {
        drop(slot);
        let url = format!("http://{authority}{path}");
        let headers = std::mem::take(req.headers_mut());
        return full(
            crate::hold::hold(
                &engine,
                &conn,
                Protocol::Http,
                &target,
                &method,
                url,
                headers,
                req.body_mut(),
                &[],
                why,
            )
            .await,
        );
    }
    match path.parse() {
        Ok(p) => *req.uri_mut() = p,
        Err(_) => return plain(StatusCode::BAD_REQUEST, "airlock: invalid request path"),
    }
    if upstream.sender.ready().await.is_err() {
        *slot = None;
        let r = Refusal::new(
            Reason::UpstreamUnreachable,
            &target,
            "the upstream closed the connection",
        );
        return full(engine.refused(&conn, Protocol::Http, r, None).response());
    }
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let sent = upstream.sender.send_request(req).await;
    // An upgraded connection now belongs to the upgraded stream. One that
    // carried a body is not used again: had the origin read less or more
    // of it than we framed, the next request would be parsed from the
    // middle of it (request smuggling). A failed or cut-short exchange
    // closes the connection in hyper itself.
    if upgrade || had_body || sent.is_err() {
        *slot = None;
    }
    drop(slot);
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let r = Refusal::new(
                Reason::UpstreamUnreachable,
                &target,
                format!("the upstream failed: {e}"),
            );
            return full(engine.refused(&conn, Protocol::Http, r, None).response());
        }
    };
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (true, Some(client_upgrade)) = (switching, client_upgrade) {
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let idle = engine.idle_timeout();
        tokio::spawn(async move {
            if let (Ok(c), Ok(u)) = (client_upgrade.await, upstream_upgrade.await) {
                let _ = tunnel::run(TokioIo::new(c), vec![], TokioIo::new(u), None, idle).await;
            }
        });
    }
    strip_hop_by_hop(resp.headers_mut(), switching);
    resp.map(|b| b.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key(header::ACCEPT));
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
    }
}
