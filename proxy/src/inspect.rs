//! TLS inspection (SPEC §5.3), for CONNECT targets matching `inspect`
//! patterns (or carrying a credential): terminate the client's TLS with a
//! minted leaf, verify the upstream against the system roots plus
//! `upstream_ca` (never disabled), and check every request before it goes
//! on: its Host or :authority, the request rules, then credentials set on
//! the way out, and one audit `request` event each.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use airlock_ca::{ForHost, Minter};
use airlock_policy::{Host, Pattern, PatternMatch, Reason, Target};
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::engine::{Conn, Engine, Protocol};
use crate::refusal::Refusal;
use crate::tunnel::Stream;

type Body = BoxBody<Bytes, hyper::Error>;

/// A header the proxy sets on inspected requests to matching hosts.
#[derive(Clone)]
pub struct Credential {
    pub host: Pattern,
    pub header: HeaderName,
    pub value: HeaderValue,
    /// What it is lent to beyond reads (SPEC §3.4).
    pub methods: Vec<airlock_policy::request::RequestAllow>,
    /// Where it came from, for questions and refusals (never the value).
    pub from: String,
}

impl Credential {
    /// How a question or a refusal names it.
    pub fn describe(&self) -> String {
        format!("{} for {} from {}", self.header, self.host.text, self.from)
    }
}

/// The credentials a request to `target` would carry: for each header the
/// last matching entry, as the loop that sets them leaves it.
pub(crate) fn carried<'a>(cfg: &'a InspectConfig, target: &Target) -> Vec<&'a Credential> {
    let mut out: Vec<&Credential> = vec![];
    for c in &cfg.credentials {
        if c.host.matches(target) == PatternMatch::Yes {
            out.retain(|o| o.header != c.header);
            out.push(c);
        }
    }
    out
}

/// What inspection needs beyond the policy.
pub struct InspectConfig {
    pub minter: Arc<Minter>,
    pub upstream: Arc<ClientConfig>,
    pub credentials: Vec<Credential>,
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCert { path: String },
    #[error("TLS setup failed: {0}")]
    Tls(String),
}

/// The upstream TLS client: system roots plus the extra PEM roots.
pub fn upstream_client(
    extra_roots: &[std::path::PathBuf],
) -> Result<Arc<ClientConfig>, InspectError> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    for path in extra_roots {
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| InspectError::Read {
                path: path.display().to_string(),
                source: std::io::Error::other(e.to_string()),
            })?
            .filter_map(Result::ok)
            .collect();
        if certs.is_empty() {
            return Err(InspectError::NoCert {
                path: path.display().to_string(),
            });
        }
        for c in certs {
            roots.add(c).map_err(|e| InspectError::Tls(e.to_string()))?;
        }
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| InspectError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn server_config(minter: &Arc<Minter>, host: &str) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(ForHost {
                minter: minter.clone(),
                host: host.to_string(),
            }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TLS alert that means the client did not accept our certificate:
/// it pins, or it does not use the trust variables.
fn rejected_our_certificate(e: &std::io::Error) -> bool {
    let text = e.to_string();
    [
        "UnknownCA",
        "BadCertificate",
        "CertificateUnknown",
        "DecryptError",
        "AccessDenied",
    ]
    .iter()
    .any(|a| text.contains(a))
}

pub(crate) enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

/// The upstream side: a TLS connection to the checked address, or why not.
type Upstream = Result<Sender, String>;

/// The tunnel's upstream connection. `None`: the last one was retired (an
/// HTTP/1.1 exchange that carried a body, or failed) and the next request
/// dials a fresh one, decided again like the first. Held locked across an
/// HTTP/1.1 exchange, which is one at a time anyway.
type Slot = Arc<Mutex<Option<Upstream>>>;

/// A fresh upstream for `target`: decided and dialled by the engine, then TLS.
/// How a redial that `Engine::connect` refused (and so already recorded)
/// begins, so that the request it fails is not counted twice.
const REDIAL_REFUSED: &str = "redialling the upstream: ";

async fn redial(engine: &Arc<Engine>, conn: &Conn, target: &Target) -> Upstream {
    let Some(cfg) = engine.inspect_config() else {
        return Err("no inspection config".into());
    };
    match engine.connect(conn, target, Protocol::Connect).await {
        Ok(d) => connect_upstream(cfg, d.stream, target).await,
        Err(r) => Err(format!("{REDIAL_REFUSED}{}", r.detail)),
    }
}

pub(crate) async fn connect_upstream(
    cfg: &InspectConfig,
    tcp: TcpStream,
    target: &Target,
) -> Upstream {
    let name = match &target.host {
        Host::Name(n) => ServerName::try_from(n.clone()).map_err(|e| e.to_string())?,
        Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
    };
    let tls = tokio_rustls::TlsConnector::from(cfg.upstream.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS to the upstream failed: {e}"))?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    if h2 {
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("HTTP/2 to the upstream failed: {e}"))?;
        tokio::spawn(conn);
        Ok(Sender::H2(send))
    } else {
        let (send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("HTTP/1.1 to the upstream failed: {e}"))?;
        tokio::spawn(conn);
        Ok(Sender::H1(send))
    }
}

/// Serve one inspected tunnel: `client` has had its CONNECT answered;
/// `upstream` is the TCP connection to the checked address.
pub async fn serve<C: Stream>(
    engine: Arc<Engine>,
    conn: Conn,
    target: Target,
    client: C,
    upstream: TcpStream,
) {
    let Some(cfg) = engine.inspect_config() else {
        return;
    };
    let since = Instant::now();
    let acceptor =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
    let start = match acceptor.await {
        Ok(s) => s,
        Err(e) => {
            if crate::rules::has_rules(&engine, &target) {
                // A rule host's tunnel must carry TLS we can open: plain
                // HTTP inside CONNECT or SOCKS would pass its rules unread.
                let why = format!("the tunnel did not start TLS ({e}); its requests cannot be checked against the request rules for this host (send plain http:// requests in absolute form)");
                engine.refused(
                    &conn,
                    Protocol::Connect,
                    Refusal::new(Reason::RequestRule, &target, why),
                    None,
                );
            }
            engine.closed(
                &conn,
                &target,
                since,
                Default::default(),
                Some(format!("no TLS ClientHello: {e}")),
            );
            return;
        }
    };
    if let Some(sni) = start.client_hello().server_name() {
        if Host::parse(sni).ok().as_ref() != Some(&target.host) {
            let why = format!("the TLS ClientHello names {sni:?}, not {}", target.host);
            engine.refused(
                &conn,
                Protocol::Connect,
                Refusal::new(Reason::SniMismatch, &target, why),
                None,
            );
            return;
        }
    }
    let host = target.host.to_string();
    let config = match server_config(&cfg.minter, &host) {
        Ok(c) => c,
        Err(e) => {
            engine.closed(
                &conn,
                &target,
                since,
                Default::default(),
                Some(format!("TLS setup failed: {e}")),
            );
            return;
        }
    };
    let tls = match start.into_stream(config).await {
        Ok(t) => t,
        Err(e) => {
            if rejected_our_certificate(&e) {
                let why = format!("the client rejected the airlock certificate ({e}); it pins certificates or ignores the trust variables");
                engine.refused(
                    &conn,
                    Protocol::Connect,
                    Refusal::new(Reason::InspectionRejected, &target, why),
                    None,
                );
            }
            engine.closed(
                &conn,
                &target,
                since,
                Default::default(),
                Some(format!("client TLS handshake failed: {e}")),
            );
            return;
        }
    };
    let first = connect_upstream(cfg, upstream, &target).await;
    if let Err(e) = &first {
        tracing::warn!(conn = conn.id, %target, "{e}");
    }
    let upstream: Slot = Arc::new(Mutex::new(Some(first)));
    let service = {
        let (engine, conn, target) = (engine.clone(), conn.clone(), target.clone());
        hyper::service::service_fn(move |req| {
            let (engine, conn, target, upstream) = (
                engine.clone(),
                conn.clone(),
                target.clone(),
                upstream.clone(),
            );
            async move {
                Ok::<_, std::convert::Infallible>(handle(engine, conn, target, upstream, req).await)
            }
        })
    };
    // The client side's plaintext, counted: what it reads from us went
    // down to it, what it wrote went up (Counted names them the other way
    // round, from an upstream's side).
    let (tls, counters) = crate::count::Counted::new(tls);
    let result = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
    let seen = counters.totals();
    engine.closed(
        &conn,
        &target,
        since,
        crate::tunnel::Totals {
            up: seen.down,
            down: seen.up,
        },
        result.err().map(|e| e.to_string()),
    );
}

fn full(resp: Response<Full<Bytes>>) -> Response<Body> {
    resp.map(|b| b.map_err(|never| match never {}).boxed())
}

/// The host a request names: `:authority` (HTTP/2, absolute URIs) or `Host`.
fn named_target(req: &Request<Incoming>, default_port: u16) -> Option<Result<Target, String>> {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })?;
    Some(Target::parse(&authority, Some(default_port)).map_err(|e| e.to_string()))
}

/// What is left of a refused request's body, read (up to 1 MiB, for up to
/// a second) before the refusal goes out: a connection closed on unread
/// bytes is reset, and the client can lose the refusal with it.
async fn drain(body: &mut Incoming) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let mut read = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > 1 << 20 {
                break;
            }
        }
    })
    .await;
}

async fn handle(
    engine: Arc<Engine>,
    conn: Conn,
    target: Target,
    upstream: Slot,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let had_body = crate::rules::has_body(req.body());
    let mut path = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    match named_target(&req, target.port) {
        Some(Ok(t)) if t == target => {}
        other => {
            let named = match other {
                Some(Ok(t)) => t.to_string(),
                Some(Err(e)) => e,
                None => "nothing".into(),
            };
            let r = Refusal::new(
                Reason::HostMismatch,
                &target,
                format!("the request names {named}, but the tunnel is to {target}"),
            );
            drain(req.body_mut()).await;
            return full(engine.refused(&conn, Protocol::Connect, r, None).response());
        }
    }
    // Upgrade headers are dropped below (hop-by-hop), so only the body
    // needs checking here.
    let checked = crate::rules::check_framing(&engine, &target, method.as_str(), had_body, None)
        .and_then(|()| {
            crate::rules::check(&engine, &target, method.as_str(), &path, req.headers())
        });
    match checked {
        Ok(None) => {}
        Ok(Some(normalised)) => path = normalised,
        Err(refusal) => {
            drain(req.body_mut()).await;
            return full(
                engine
                    .refused(&conn, Protocol::Connect, *refusal, None)
                    .response(),
            );
        }
    }
    let carried = engine
        .inspect_config()
        .map(|cfg| carried(cfg, &target))
        .unwrap_or_default();
    // A review run (SPEC §4.8) holds what a hold rule names, and below
    // what would carry a credential beyond reads, instead of sending it.
    let mut held = crate::hold::named(&engine, &target, method.as_str(), &path, req.headers());
    if !carried.is_empty() {
        // A request that asks the origin to take it as another method is
        // no read, and no client that publishes sends one: refused, never
        // asked about (a person would approve the method shown, not the
        // one the origin runs; red team round 7).
        let overridden = crate::rules::method_override(req.headers(), &path);
        // The origin gets the path that was judged a read, not a spelling
        // it could read as another one.
        if let Ok(norm) = airlock_policy::request::normalize_path(&path) {
            path = norm;
        }
        // SPEC §5.4: a proxy others can reach lends only to its own user.
        if let Err(why) = engine.lend_to().check(conn.peer) {
            let r = Refusal::new(Reason::CredentialClient, &target, why);
            drain(req.body_mut()).await;
            return full(engine.refused(&conn, Protocol::Connect, r, None).response());
        }
        // SPEC §3.4: a credential reads; anything else is asked for.
        let unlent: Vec<String> = carried
            .iter()
            .filter(|c| !crate::lend::lent(c, method.as_str(), &path, req.headers()))
            .map(|c| c.describe())
            .collect();
        if !unlent.is_empty() {
            if let Some(how) = overridden {
                let r = Refusal::new(
                    Reason::CredentialWrite,
                    &target,
                    format!(
                        "{method} {path} asks the origin to take it as another method ({how}); the credential {} is never lent to such a request",
                        unlent.join(", ")
                    ),
                );
                drain(req.body_mut()).await;
                return full(engine.refused(&conn, Protocol::Connect, r, None).response());
            }
        }
        // A review run holds every credentialed write (SPEC §4.8), one a
        // `methods` list lends to writes too: what it lends is the
        // person's to release, once the changeset is looked at.
        // A read by its shape (a git fetch's upload-pack POST is one), as
        // the lending itself judges it: not held.
        let writes = airlock_policy::request::normalize_path(&path).map_or(true, |norm| {
            !airlock_policy::request::is_read(method.as_str(), &norm)
        });
        if held.is_none() && engine.holder().is_some() {
            if !unlent.is_empty() {
                held = Some(format!(
                    "it would carry the credential {}, which is lent to reads only",
                    unlent.join(", ")
                ));
            } else if writes {
                held = Some(format!(
                    "it would carry the credential {} with a {method}: a review run holds every credentialed write",
                    carried
                        .iter()
                        .map(|c| c.describe())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        if held.is_none() && !unlent.is_empty() {
            let write = crate::approve::CredentialWrite {
                method: method.to_string(),
                url: format!("https://{}{}", authority_of(&target), path),
                credential: unlent.join(", "),
            };
            if let crate::engine::Lend::Refuse(r) = engine.lend(&conn, &target, write).await {
                drain(req.body_mut()).await;
                return full(r.response());
            }
        }
    }
    let url = format!("https://{}{}", authority_of(&target), path);
    if let Some(why) = held {
        let names: Vec<HeaderName> = carried.iter().map(|c| c.header.clone()).collect();
        let headers = std::mem::take(req.headers_mut());
        return full(
            crate::hold::hold(
                &engine,
                &conn,
                Protocol::Connect,
                &target,
                method.as_str(),
                url,
                headers,
                req.body_mut(),
                &names,
                why,
            )
            .await,
        );
    }
    let mut slot = upstream.lock().await;
    if slot.is_none() {
        *slot = Some(redial(&engine, &conn, &target).await);
    }
    let broken = match slot.as_ref() {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    };
    if let Some(e) = broken {
        // Tried again by the next request.
        *slot = None;
        let r = Refusal::new(Reason::UpstreamUnreachable, &target, e.clone());
        if e.starts_with(REDIAL_REFUSED) {
            drain(req.body_mut()).await;
            return full(r.response());
        }
        drain(req.body_mut()).await;
        return full(engine.refused(&conn, Protocol::Connect, r, None).response());
    }
    crate::http::strip_hop_by_hop(req.headers_mut(), false);
    for c in carried {
        req.headers_mut().insert(c.header.clone(), c.value.clone());
    }
    let header_names: Vec<String> = req
        .headers()
        .keys()
        .map(|k| k.as_str().to_string())
        .collect();
    let up_bytes = Arc::new(AtomicU64::new(0));
    let (mut parts, body) = req.into_parts();
    let body = Counting::new(body, up_bytes.clone(), None).boxed();
    let sent = match slot.as_mut() {
        Some(Ok(Sender::H1(send))) => {
            parts.uri = path.parse().unwrap_or_else(|_| Uri::from_static("/"));
            parts.version = http::Version::HTTP_11;
            if let Ok(v) = HeaderValue::from_str(&authority_of(&target)) {
                parts.headers.insert(header::HOST, v);
            }
            let sent = match send.ready().await {
                Ok(()) => send.send_request(Request::from_parts(parts, body)).await,
                Err(e) => Err(e),
            };
            // An HTTP/1.1 connection that carried a body is not used again:
            // had the origin read less or more of it than we framed, the
            // next request (with the credential) would be parsed from the
            // middle of it. A failed one is not either.
            if had_body || sent.is_err() {
                *slot = None;
            }
            drop(slot);
            sent
        }
        Some(Ok(Sender::H2(send))) => {
            parts.uri = url.parse().unwrap_or_else(|_| Uri::from_static("/"));
            parts.version = http::Version::HTTP_2;
            parts.headers.remove(header::HOST);
            let mut send = send.clone();
            drop(slot);
            match send.ready().await {
                Ok(()) => send.send_request(Request::from_parts(parts, body)).await,
                Err(e) => Err(e),
            }
        }
        _ => {
            return full(
                Refusal::new(
                    Reason::UpstreamUnreachable,
                    &target,
                    "no upstream connection",
                )
                .response(),
            )
        }
    };
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let r = Refusal::new(
                Reason::UpstreamUnreachable,
                &target,
                format!("the upstream failed: {e}"),
            );
            return full(engine.refused(&conn, Protocol::Connect, r, None).response());
        }
    };
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    crate::http::strip_hop_by_hop(&mut parts.headers, false);
    let event = RequestEvent {
        engine: engine.clone(),
        conn: conn.id,
        host: target.host.to_string(),
        port: target.port,
        command: conn.client.clone(),
        method: method.to_string(),
        url,
        status: status.as_u16(),
        headers: header_names,
        up: up_bytes,
    };
    let body = Counting::new(body, Arc::new(AtomicU64::new(0)), Some(event)).boxed();
    Response::from_parts(parts, body)
}

pub(crate) fn authority_of(t: &Target) -> String {
    if t.port == 443 {
        t.host.to_string()
    } else {
        t.to_string()
    }
}

/// The `request` audit event, written when the response body ends.
struct RequestEvent {
    engine: Arc<Engine>,
    conn: u64,
    host: String,
    port: u16,
    command: Option<crate::identity::Client>,
    method: String,
    url: String,
    status: u16,
    headers: Vec<String>,
    up: Arc<AtomicU64>,
}

/// A body that counts what passes through it and, for responses, writes
/// the request event when it is done (or dropped).
struct Counting<B> {
    inner: B,
    count: Arc<AtomicU64>,
    event: Option<RequestEvent>,
}

impl<B> Counting<B> {
    fn new(inner: B, count: Arc<AtomicU64>, event: Option<RequestEvent>) -> Self {
        Counting {
            inner,
            count,
            event,
        }
    }
}

impl<B> Drop for Counting<B> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            let down = self.count.load(Ordering::Relaxed);
            let up = e.up.load(Ordering::Relaxed);
            tracing::info!(
                conn = e.conn,
                method = e.method,
                url = e.url,
                status = e.status,
                bytes_up = up,
                bytes_down = down,
                "request"
            );
            e.engine.audit_event(
                e.conn,
                airlock_audit::Event::Request(airlock_audit::schema::Request {
                    host: e.host,
                    port: e.port,
                    command: e.command,
                    method: e.method,
                    url: e.url,
                    status: e.status,
                    bytes_up: up,
                    bytes_down: down,
                    request_headers: e.headers,
                }),
            );
        }
    }
}

impl<B: HttpBody<Data = Bytes, Error = hyper::Error> + Unpin> HttpBody for Counting<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                this.count.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
