//! Requests a review run holds (SPEC §4.8): one that would carry a
//! credential beyond what it is lent to, or that a `[[network.hold]]` rule
//! names, is neither sent nor asked about. Its method, URL, headers (less
//! credentials and hop-by-hop ones) and body go to a [`Holder`] the
//! supervisor supplies, and the client gets a 403 saying it is held and
//! how it is released. Storing fails closed: a request that could not be
//! kept whole is refused, never sent. [`replay`] sends a kept request
//! later, from the host, through the same decision, address check, pinning,
//! upstream trust and credential injection as the proxy.

use std::sync::Arc;

use airlock_policy::request::normalize_path;
use airlock_policy::{PatternMatch, Reason, Target};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::engine::{Conn, Engine, Protocol};
use crate::refusal::Refusal;

/// Largest body a held request keeps unless the holder says otherwise.
pub const DEFAULT_CAP: u64 = 64 << 20;

/// A request as it is kept: what `replay` needs to send it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRequest {
    pub method: String,
    /// Absolute: `https://host[:port]/path?query`.
    pub url: String,
    /// In the order the client sent them; no credential, no hop-by-hop.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// Why it was held, for the review.
    pub why: String,
}

/// Where a held request was kept.
#[derive(Debug, Clone)]
pub struct Receipt {
    /// Its place in the order of the run's held requests, from 1.
    pub seq: u64,
    /// The changeset that holds it.
    pub changeset: String,
}

/// Keeps held requests (the supervisor's changeset). Called off the async
/// runtime's workers: it may write to disk.
pub trait Holder: Send + Sync {
    /// The largest body kept; a larger request is refused whole.
    fn cap(&self) -> u64 {
        DEFAULT_CAP
    }
    /// Keep `req` after those kept before it, durably; on `Err` nothing of
    /// it may remain, and the request is refused.
    fn hold(&self, req: HeldRequest) -> Result<Receipt, String>;
}

/// Why a hold rule names this request, if one does (only in a review run:
/// without a holder, hold rules do nothing). A request that asks the origin
/// to take it as another method, or whose path cannot be normalised, is
/// held whenever its host has hold rules: fail closed.
pub(crate) fn named(
    engine: &Engine,
    target: &Target,
    method: &str,
    path: &str,
    headers: &HeaderMap,
) -> Option<String> {
    engine.holder()?;
    let policy = engine.policy();
    let rules: Vec<_> = policy
        .hold_rules
        .iter()
        .filter(|r| r.host.matches(target) == PatternMatch::Yes)
        .collect();
    let first = rules.first()?;
    if let Some(how) = crate::rules::method_override(headers, path) {
        return Some(format!(
            "it carries {how} and {} has hold rules ({})",
            first.host.text, first.origin.origin
        ));
    }
    let Ok(norm) = normalize_path(path) else {
        return Some(format!(
            "its path cannot be normalised and {} has hold rules ({})",
            first.host.text, first.origin.origin
        ));
    };
    rules.iter().find_map(|r| {
        let m = r.requests.iter().find(|a| a.matches(method, &norm))?;
        Some(format!(
            "the hold rule {:?} for {} ({})",
            m.text, r.host.text, r.origin.origin
        ))
    })
}

/// The body, whole, or why not: larger than `cap`, or cut short.
async fn read_body(
    body: &mut Incoming,
    cap: u64,
    idle: std::time::Duration,
) -> Result<Bytes, String> {
    let mut out = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err("the request body stopped arriving".into()),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) => return Err(format!("the request body did not arrive whole: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        if let Some(d) = frame.data_ref() {
            if out.len() as u64 + d.len() as u64 > cap {
                return Err(format!(
                    "its body is larger than the {} MiB a review run keeps",
                    cap >> 20
                ));
            }
            out.extend_from_slice(d);
        }
    }
}

/// Keep the request and answer the client: 403 `held`, or `hold-refused`
/// when it could not be kept. Never sends it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn hold(
    engine: &Arc<Engine>,
    conn: &Conn,
    protocol: Protocol,
    target: &Target,
    method: &str,
    url: String,
    mut headers: HeaderMap,
    body: &mut Incoming,
    credentials: &[HeaderName],
    why: String,
) -> Response<Full<Bytes>> {
    let shown = crate::escape::line(&format!("{method} {url}"), 300);
    let refuse = |detail: String| {
        let r = Refusal::new(
            Reason::HoldRefused,
            target,
            format!("{shown} would be held for review ({why}), but {detail}; it was not sent"),
        );
        engine.refused(conn, protocol, r, None).response()
    };
    let Some(holder) = engine.holder() else {
        return refuse("this run holds nothing".into());
    };
    let body = match read_body(body, holder.cap(), engine.idle_timeout()).await {
        Ok(b) => b,
        Err(e) => return refuse(e),
    };
    // Git's probe before a push larger than `http.postBuffer`: a bare
    // flush packet to receive-pack, to learn that the request would be
    // taken before it streams the pack in a second POST. Answered here and
    // kept nowhere: held, it would stand in the changeset for the push,
    // and git would never send the pack to be held.
    if method == "POST"
        && url
            .split('?')
            .next()
            .is_some_and(|u| u.ends_with("/git-receive-pack"))
        && body.as_ref() == b"0000"
    {
        let mut resp = Response::new(Full::new(Bytes::new()));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-git-receive-pack-result"),
        );
        return resp;
    }
    crate::http::strip_hop_by_hop(&mut headers, false);
    headers.remove(header::HOST);
    // The credential is the user's: set again from their configuration
    // when the request is released, never kept.
    for c in credentials {
        headers.remove(c);
    }
    let mut kept = Vec::with_capacity(headers.len());
    for (k, v) in &headers {
        match v.to_str() {
            Ok(v) => kept.push((k.as_str().to_string(), v.to_string())),
            Err(_) => return refuse(format!("its header {k} is not text")),
        }
    }
    let req = HeldRequest {
        method: method.to_string(),
        url: url.clone(),
        headers: kept,
        body,
        why: why.clone(),
    };
    let stored = tokio::task::spawn_blocking(move || holder.hold(req))
        .await
        .unwrap_or_else(|e| Err(format!("the changeset writer failed: {e}")));
    let receipt = match stored {
        Ok(r) => r,
        Err(e) => return refuse(format!("it could not be kept ({e})")),
    };
    let id = &receipt.changeset;
    engine.record_held(
        conn,
        protocol,
        target,
        format!(
            "held for review as request {} of changeset {id}: {shown} ({why})",
            receipt.seq
        ),
    );
    let text = format!(
        "airlock held this request for review: {shown} was not sent ({why}). \
         It is kept as request {} of changeset {id}: `airlock changes diff {id}` shows it, \
         `airlock changes apply {id}` sends it with your credential after the changeset's files, \
         `airlock changes discard {id}` drops it.\n",
        receipt.seq
    );
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    let h = resp.headers_mut();
    h.insert("x-airlock-decision", HeaderValue::from_static("deny"));
    h.insert("x-airlock-reason", HeaderValue::from_static("held"));
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert("x-airlock-changeset", v);
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// What the origin answered a replayed request.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub status: u16,
    pub content_type: Option<String>,
    /// The response body, up to `REPLY_CAP` bytes.
    pub body: Vec<u8>,
}

/// How much of a replayed request's response is kept (for git's report).
pub const REPLY_CAP: usize = 1 << 20;

type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// Send a held request to its origin now, as the proxy would have: the
/// host decided by `engine`'s policy (a person runs this: nobody is
/// asked), resolved and checked as any connection, dialled at the checked
/// address, TLS verified against the same roots, and the credentials for
/// the host set on it. Err: it was not answered (never dialled, or the
/// connection failed), with why.
pub async fn replay(engine: &Arc<Engine>, req: &HeldRequest) -> Result<Replayed, String> {
    let uri: http::Uri = req
        .url
        .parse()
        .map_err(|e| format!("the URL {:?} does not parse: {e}", req.url))?;
    let (https, default) = match uri.scheme_str() {
        Some("https") => (true, 443),
        Some("http") => (false, 80),
        _ => return Err(format!("{}: only http and https are replayed", req.url)),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{}: no host", req.url))?
        .as_str()
        .to_string();
    let target = Target::parse(&authority, Some(default)).map_err(|e| e.to_string())?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let conn = engine.open(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let protocol = if https {
        Protocol::Connect
    } else {
        Protocol::Http
    };
    let dialed = engine
        .connect(&conn, &target, protocol)
        .await
        .map_err(|r| format!("{} ({})", r.detail, r.reason))?;
    let mut headers = HeaderMap::new();
    for (k, v) in &req.headers {
        let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) else {
            return Err(format!("the kept header {k:?} is not valid"));
        };
        headers.append(k, v);
    }
    crate::http::strip_hop_by_hop(&mut headers, false);
    headers.remove(header::CONTENT_LENGTH);
    let body: Body = Full::new(req.body.clone())
        .map_err(|never| match never {})
        .boxed();
    let sent = if https {
        let cfg = engine
            .inspect_config()
            .ok_or("no TLS inspection set-up for the replay")?;
        for c in crate::inspect::carried(cfg, &target) {
            headers.insert(c.header.clone(), c.value.clone());
        }
        let sender = crate::inspect::connect_upstream(cfg, dialed.stream, &target).await?;
        let mut parts = Request::new(body).into_parts();
        parts.0.method = req
            .method
            .parse()
            .map_err(|_| format!("the method {:?} is not valid", req.method))?;
        parts.0.headers = headers;
        match sender {
            crate::inspect::Sender::H1(mut send) => {
                parts.0.uri = path.parse().map_err(|e| format!("{path:?}: {e}"))?;
                if let Ok(v) = HeaderValue::from_str(&crate::inspect::authority_of(&target)) {
                    parts.0.headers.insert(header::HOST, v);
                }
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(Request::from_parts(parts.0, parts.1))
                    .await
            }
            crate::inspect::Sender::H2(mut send) => {
                parts.0.uri = uri.clone();
                parts.0.version = http::Version::HTTP_2;
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(Request::from_parts(parts.0, parts.1))
                    .await
            }
        }
    } else {
        let (mut send, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream))
                .await
                .map_err(|e| format!("HTTP to the origin failed: {e}"))?;
        tokio::spawn(connection);
        let mut r = Request::new(body);
        *r.method_mut() = req
            .method
            .parse()
            .map_err(|_| format!("the method {:?} is not valid", req.method))?;
        *r.uri_mut() = path.parse().map_err(|e| format!("{path:?}: {e}"))?;
        *r.headers_mut() = headers;
        if let Ok(v) = HeaderValue::from_str(&authority) {
            r.headers_mut().insert(header::HOST, v);
        }
        send.ready().await.map_err(|e| e.to_string())?;
        send.send_request(r).await
    };
    let resp = sent.map_err(|e| format!("the origin failed: {e}"))?;
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("the response was cut short: {e}"))?;
        if let Some(d) = frame.data_ref() {
            let room = REPLY_CAP.saturating_sub(out.len());
            out.extend_from_slice(&d[..d.len().min(room)]);
        }
    }
    Ok(Replayed {
        status,
        content_type,
        body: out,
    })
}
