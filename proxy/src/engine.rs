//! The decision path every connection takes before a byte leaves:
//! decide → (ask) → resolve → classify → pin → dial, with one canonical
//! log line per decision and one per close (after Smokescreen).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use airlock_policy::{
    check_address, decide_with, Approvals, Decision, Host, Policy, Reason, Target, Verdict,
};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::approve::{Answer, Approver, CredentialWrite, Question};
use crate::identity::{Client, ClientIdentity};
use crate::refusal::Refusal;
use crate::resolve::Resolver;
use crate::tunnel::Totals;
use airlock_audit::{schema, AuditLog, Event};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Connect,
    Http,
    Socks5,
    /// A connection captured in the sandbox's network namespace (SPEC §5.5).
    Transparent,
    /// A lookup at the sandbox's DNS server (SPEC §5.5).
    Dns,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Connect => "connect",
            Protocol::Http => "http",
            Protocol::Socks5 => "socks5",
            Protocol::Transparent => "transparent",
            Protocol::Dns => "dns",
        }
    }
}

/// One accepted client connection.
#[derive(Debug, Clone)]
pub struct Conn {
    pub id: u64,
    pub peer: SocketAddr,
    pub client: Option<Client>,
    pub started: Instant,
    _open: OpenGuard,
}

/// Counts a connection as open until its `Conn` is dropped (the task that
/// serves it has ended): `Engine::wait_idle`.
struct OpenGuard(Arc<std::sync::atomic::AtomicUsize>);

impl OpenGuard {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> OpenGuard {
        count.fetch_add(1, Ordering::SeqCst);
        OpenGuard(count.clone())
    }
}

// A clone of a `Conn` counts as one more holder until it is dropped too.
impl Clone for OpenGuard {
    fn clone(&self) -> OpenGuard {
        OpenGuard::new(&self.0)
    }
}

impl std::fmt::Debug for OpenGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenGuard")
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An upstream connection to exactly the address that was checked.
pub struct Dialed {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    pub decision: Decision,
}

/// A summary line of the exit report (SPEC §7).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Blocked {
    pub host: String,
    /// `None` when the request named no port that could be parsed.
    pub port: Option<u16>,
    pub reason: String,
    pub count: u64,
    pub how_to_allow: String,
}

/// An allowed host that could not be reached (SPEC §7): the exit report
/// says so, with why, instead of leaving a bare 502 to be retried blindly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UpstreamFailure {
    pub host: String,
    pub port: Option<u16>,
    /// `upstream-unreachable` or `upstream-timeout`.
    pub reason: String,
    pub count: u64,
    /// The last failure's detail (refused, timed out, TLS failed...).
    pub detail: String,
}

/// Distinct (host, port, reason) entries each tally keeps: past it,
/// refusals are only counted, so a command that tries a million names
/// cannot grow the supervisor's memory or the exit report without bound.
pub const TALLY_CAP: usize = 1000;

/// A bounded tally of what the exit report lists.
struct Tally<V> {
    entries: BTreeMap<BlockedKey, (u64, V)>,
    /// Events whose entry was not kept (the cap was reached).
    beyond: u64,
}

impl<V> Default for Tally<V> {
    fn default() -> Self {
        Tally {
            entries: BTreeMap::new(),
            beyond: 0,
        }
    }
}

impl<V> Tally<V> {
    /// Count one event; `Some` with the entry's value when it is kept.
    fn count(&mut self, key: BlockedKey, init: impl FnOnce() -> V) -> Option<&mut V> {
        if !self.entries.contains_key(&key) && self.entries.len() >= TALLY_CAP {
            self.beyond += 1;
            return None;
        }
        let e = self.entries.entry(key).or_insert_with(|| (0, init()));
        e.0 += 1;
        Some(&mut e.1)
    }
}

pub struct EngineConfig {
    pub policy: Arc<Policy>,
    pub audit: Option<AuditLog>,
    pub approver: Arc<dyn Approver>,
    pub identity: Arc<dyn ClientIdentity>,
    /// Use this nameserver instead of the system's (split horizon, tests).
    pub dns_server: Option<SocketAddr>,
    /// The CA and upstream trust for TLS inspection; `None` refuses every
    /// target the policy says to inspect.
    pub inspect: Option<crate::inspect::InspectConfig>,
    /// Which clients credentials are added for (SPEC §5.4).
    pub lend_to: crate::lend::LendTo,
    /// Dial every checked address through this parent proxy (SPEC §5.4).
    pub upstream_proxy: Option<crate::parent::UpstreamProxy>,
}

/// What becomes of a request that would carry a credential beyond what it
/// is lent to, outside a review run (a review run holds it: `crate::hold`).
#[derive(Debug)]
pub enum Lend {
    /// A person approved it (or an earlier `allow-session` answer covers it).
    Lend,
    Refuse(Box<Refusal>),
}

/// The policy and the static DNS answers it implies: replaced together on
/// reload, read once per decision so one connection sees one policy.
struct Live {
    policy: Arc<Policy>,
    resolver: Arc<Resolver>,
}

pub struct Engine {
    live: RwLock<Arc<Live>>,
    dns_server: Option<SocketAddr>,
    audit: Option<AuditLog>,
    pub(crate) approver: Arc<dyn Approver>,
    identity: Arc<dyn ClientIdentity>,
    inspect: Option<crate::inspect::InspectConfig>,
    lend_to: crate::lend::LendTo,
    upstream_proxy: Option<crate::parent::UpstreamProxy>,
    /// (target, method, credential) that `allow-session` lent for the run.
    lent: Mutex<HashSet<(Target, String, String, String)>>,
    next_conn: AtomicU64,
    open_conns: Arc<std::sync::atomic::AtomicUsize>,
    tunnels: Arc<Semaphore>,
    own: Mutex<Vec<SocketAddr>>,
    pub(crate) session: SessionApprovals,
    /// Which names the sandbox's DNS answered with which address, so a
    /// captured connection's destination name can be recovered.
    pub(crate) names: crate::dns::Names,
    /// Names awaiting approval, answered with placeholder addresses.
    pub(crate) placeholders: crate::dns::Placeholders,
    /// Questions being asked now: later askers for the same target wait on
    /// the first one's answer instead of asking again.
    inflight: Mutex<Inflight>,
    /// (host, port, reason) -> (count, the address a private-address
    /// refusal resolved to).
    blocked: Mutex<Tally<Option<IpAddr>>>,
    /// Allowed hosts that could not be reached -> (count, last detail).
    upstream: Mutex<Tally<String>>,
    approvals: Mutex<Vec<Approval>>,
    metrics: crate::metrics::Metrics,
    /// A review run's changeset (SPEC §4.8): set once, before serving.
    holder: std::sync::OnceLock<Arc<dyn crate::hold::Holder>>,
}

/// What the exit report tallies blocked connections by.
type BlockedKey = (String, Option<u16>, Reason);

/// An answer and who gave it, shared with everyone waiting on the question.
type Shared = Option<(Answer, String)>;
type Inflight = HashMap<Target, watch::Receiver<Shared>>;

/// An answered question, for the exit report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Approval {
    pub host: String,
    pub port: u16,
    pub answer: String,
    pub by: String,
}

/// `allow-session` and `allow-always` answers, for the rest of the run.
#[derive(Default)]
pub(crate) struct SessionApprovals(Mutex<HashSet<Target>>);

impl Approvals for SessionApprovals {
    fn approved(&self, target: &Target) -> bool {
        lock(&self.0).contains(target)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Arc<Engine> {
        let max_tunnels = cfg.policy.max_tunnels as usize;
        let tunnels = Arc::new(Semaphore::new(max_tunnels));
        Arc::new(Engine {
            metrics: crate::metrics::Metrics::new(tunnels.clone(), max_tunnels),
            tunnels,
            live: RwLock::new(Arc::new(Live::new(cfg.policy, cfg.dns_server))),
            dns_server: cfg.dns_server,
            audit: cfg.audit,
            approver: cfg.approver,
            identity: cfg.identity,
            inspect: cfg.inspect,
            lend_to: cfg.lend_to,
            upstream_proxy: cfg.upstream_proxy,
            lent: Mutex::new(HashSet::new()),
            next_conn: AtomicU64::new(1),
            open_conns: Default::default(),
            own: Mutex::new(vec![]),
            session: SessionApprovals::default(),
            names: crate::dns::Names::default(),
            placeholders: crate::dns::Placeholders::default(),
            inflight: Mutex::new(HashMap::new()),
            blocked: Mutex::new(Tally::default()),
            upstream: Mutex::new(Tally::default()),
            approvals: Mutex::new(vec![]),
            holder: std::sync::OnceLock::new(),
        })
    }

    /// Make this a review run's engine (SPEC §4.8): requests that would
    /// carry a credential beyond reads, and those a hold rule names, go to
    /// `holder` instead of upstream. Set before the proxy serves anything;
    /// false if a holder was set already.
    pub fn hold_with(&self, holder: Arc<dyn crate::hold::Holder>) -> bool {
        self.holder.set(holder).is_ok()
    }

    pub(crate) fn holder(&self) -> Option<Arc<dyn crate::hold::Holder>> {
        self.holder.get().cloned()
    }

    /// A held request's decision line and audit event (reason `held`). Not
    /// tallied with what was blocked: the changeset lists it.
    pub(crate) fn record_held(
        &self,
        conn: &Conn,
        protocol: Protocol,
        target: &Target,
        detail: String,
    ) {
        let d = Decision {
            verdict: Verdict::Deny,
            reason: Reason::Held,
            rule: None,
        };
        self.log_decision(conn, protocol, target, None, &d, Some(&detail));
    }

    /// The policy in force now (a reload may replace it at any time).
    pub fn policy(&self) -> Arc<Policy> {
        self.live().policy.clone()
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The resolver for the policy in force now.
    pub(crate) fn resolver(&self) -> Arc<Resolver> {
        self.live().resolver.clone()
    }

    fn live(&self) -> Arc<Live> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replace the policy (`airlock proxy` on SIGHUP). Open tunnels keep
    /// running: they were decided under the old one. New connections,
    /// questions and address checks use the new one; the tunnel limit and
    /// the TLS inspection set-up stay as they were at start.
    pub fn reload(&self, policy: Arc<Policy>) {
        let live = Arc::new(Live::new(policy, self.dns_server));
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = live;
    }

    pub fn inspect_config(&self) -> Option<&crate::inspect::InspectConfig> {
        self.inspect.as_ref()
    }

    /// Whether this target's TLS is decrypted; an error when it must be
    /// but no CA was configured (fail closed).
    pub fn inspection(&self, target: &Target) -> Result<bool, Box<Refusal>> {
        if !airlock_policy::inspects(&self.policy(), target) {
            return Ok(false);
        }
        if self.inspect.is_none() {
            return Err(Box::new(Refusal::new(
                Reason::InspectionRejected,
                target,
                "the policy inspects this host but no CA is configured",
            )));
        }
        Ok(true)
    }

    /// Write an audit event, if there is an audit log.
    pub fn audit_event(&self, conn: u64, event: Event) {
        if let Some(a) = &self.audit {
            a.write(conn, event);
        }
    }

    /// The audit log's `end` line (SPEC §6), when there is a log.
    pub fn audit_end(&self, exit_code: i32, duration_ms: u64) {
        if let Some(a) = &self.audit {
            a.end(exit_code, duration_ms);
        }
    }

    /// The audit log, for the supervisor's own events (`protected`).
    pub fn audit(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    pub fn idle_timeout(&self) -> Duration {
        self.policy().idle_timeout
    }

    /// Remember a listening address: the proxy never dials itself.
    pub fn add_own_addr(&self, addr: SocketAddr) {
        lock(&self.own).push(addr);
    }

    pub fn open(&self, peer: SocketAddr) -> Conn {
        Conn {
            id: self.next_conn.fetch_add(1, Ordering::Relaxed),
            peer,
            // Attribution walks /proc: only when an audit log will record it
            // (a question looks it up itself, see `ask_once`).
            client: self
                .audit
                .as_ref()
                .and_then(|_| self.identity.identify(peer)),
            started: Instant::now(),
            _open: OpenGuard::new(&self.open_conns),
        }
    }

    /// A connection id with no attribution: a DNS query over UDP, whose
    /// source port could match an unrelated TCP socket's.
    pub(crate) fn open_unattributed(&self, peer: SocketAddr) -> Conn {
        Conn {
            id: self.next_conn.fetch_add(1, Ordering::Relaxed),
            peer,
            client: None,
            started: Instant::now(),
            _open: OpenGuard::new(&self.open_conns),
        }
    }

    /// Once every client is gone (the sandbox has exited), let the tasks
    /// still serving their connections finish what they record (a refusal,
    /// a rejected certificate, a close) before the runtime is shut down,
    /// for at most `limit`. Blocking: call outside the runtime. Whether
    /// every connection has ended.
    pub fn wait_idle(&self, limit: std::time::Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.open_conns.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.open_conns.load(Ordering::SeqCst) == 0
    }

    /// The approver's [`Approver::close`].
    pub fn close_approver(&self) {
        self.approver.close();
    }

    /// A tunnel slot, or `None` when `max_tunnels` are open.
    pub fn tunnel_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.tunnels.clone().try_acquire_owned().ok()
    }

    /// Decide, ask, resolve, classify and dial the checked address.
    pub async fn connect(
        &self,
        conn: &Conn,
        target: &Target,
        protocol: Protocol,
    ) -> Result<Dialed, Refusal> {
        self.connect_to(conn, target, protocol, None).await
    }

    /// `connect`, dialing `prefer` first when it is one of the checked
    /// addresses (a captured connection's original destination).
    pub async fn connect_to(
        &self,
        conn: &Conn,
        target: &Target,
        protocol: Protocol,
        prefer: Option<IpAddr>,
    ) -> Result<Dialed, Refusal> {
        let live = self.live();
        let policy = &live.policy;
        let decision = self.decide(policy, conn, target).await;
        if !decision.is_allow() {
            let refusal = Refusal::new(decision.reason, target, deny_detail(&decision))
                .with_rule(decision.rule.clone());
            return Err(self.refused(conn, protocol, refusal, None));
        }
        let ips = match live.resolver.lookup(&target.host).await {
            Ok(ips) => ips,
            Err(e) => {
                let e = match &self.upstream_proxy {
                    Some(_) => format!("{e}; with --upstream-proxy airlock still resolves each name itself, to check the address the parent is asked for: give it a resolver that answers (--dns-server IP:PORT) or pin the name (--resolve HOST=IP)"),
                    None => e,
                };
                let r = Refusal::new(Reason::UpstreamUnreachable, target, e)
                    .with_rule(decision.rule.clone());
                return Err(self.refused(conn, protocol, r, None));
            }
        };
        let (mut checked, refused) = self.check_addresses(policy, target, &decision, ips);
        if let Some(p) = prefer {
            // A stable sort: the resolver's order otherwise.
            checked.sort_by_key(|a| a.ip() != airlock_policy::host::canonical_ip(p));
        }
        if checked.is_empty() {
            let (ip, why) = refused.unwrap_or((IpAddr::from([0, 0, 0, 0]), "no address"));
            let r = Refusal::new(
                Reason::PrivateAddress,
                target,
                format!("{} resolved to {ip}, a {why} address", target.host),
            )
            .with_rule(decision.rule.clone());
            return Err(self.refused(conn, protocol, r, Some(ip)));
        }
        let mut timed_out = false;
        let mut last_err = String::new();
        for addr in checked {
            let dialed = match &self.upstream_proxy {
                // The checked address, through the parent: its answer
                // cannot lead anywhere airlock did not check.
                Some(parent) => parent
                    .connect(addr, policy.connect_timeout)
                    .await
                    .map_err(std::io::Error::other),
                None => {
                    match tokio::time::timeout(policy.connect_timeout, TcpStream::connect(addr))
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => {
                            timed_out = true;
                            last_err = format!(
                                "connecting to {addr} timed out after {:?}",
                                policy.connect_timeout
                            );
                            continue;
                        }
                    }
                }
            };
            match dialed {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    self.log_decision(conn, protocol, target, Some(addr.ip()), &decision, None);
                    return Ok(Dialed {
                        stream,
                        addr,
                        decision,
                    });
                }
                Err(e) if self.upstream_proxy.is_some() => last_err = e.to_string(),
                Err(e) => last_err = format!("connecting to {addr} failed: {e}"),
            }
        }
        let reason = if timed_out {
            Reason::UpstreamTimeout
        } else {
            Reason::UpstreamUnreachable
        };
        let r = Refusal::new(reason, target, last_err).with_rule(decision.rule.clone());
        Err(self.refused(conn, protocol, r, None))
    }

    /// Classify resolved addresses (SPEC §5.1): the ones that may be dialed,
    /// and the last refused one with why.
    pub(crate) fn check_addresses(
        &self,
        policy: &Policy,
        target: &Target,
        decision: &Decision,
        ips: Vec<IpAddr>,
    ) -> (Vec<SocketAddr>, Option<(IpAddr, &'static str)>) {
        // SPEC §5.2: approvals never unlock allow_private. A host allowed
        // only by an answer must resolve to a public address, unless the
        // policy itself pins this name to its address ([network].resolve),
        // in which case a policy rule, not the sandbox, chose the address.
        let pinned = policy.resolve.contains_key(&target.host);
        let allow_private: Vec<_> =
            if matches!(decision.reason, Reason::Approved | Reason::Unlisted) && !pinned {
                vec![]
            } else {
                policy.allow_private.iter().map(|n| n.value).collect()
            };
        let own = lock(&self.own).clone();
        let mut checked = vec![];
        let mut refused = None;
        for ip in ips {
            let addr = SocketAddr::new(airlock_policy::host::canonical_ip(ip), target.port);
            let own_hit = own.iter().any(|o| {
                o.port() == addr.port() && (o.ip() == addr.ip() || o.ip().is_unspecified())
            });
            match check_address(addr.ip(), &allow_private, &[]) {
                _ if own_hit => refused = Some((addr.ip(), "the proxy's own listening address")),
                Ok(()) => checked.push(addr),
                Err(why) => refused = Some((addr.ip(), why)),
            }
        }
        (checked, refused)
    }

    async fn decide(&self, policy: &Policy, conn: &Conn, target: &Target) -> Decision {
        let decision = decide_with(policy, target, &self.session);
        if decision.verdict != Verdict::Ask {
            return decision;
        }
        if !self.approver.asks() {
            // `--ask deny`, or no approver: nobody was asked, so nothing
            // was refused by a person (SPEC §5.2).
            return Decision::deny(Reason::NotAllowlisted);
        }
        let asked = Instant::now();
        let (answer, by) = self.ask_once(policy, conn, target).await;
        self.metrics.approval_wait(asked.elapsed().as_secs_f64());
        if let Some(audit) = &self.audit {
            audit.write(
                conn.id,
                Event::Approval(schema::Approval {
                    host: target.host.to_string(),
                    port: target.port,
                    question: format!("allow {target}?"),
                    answer: answer.as_str().into(),
                    by: by.clone(),
                    command: conn.client.clone(),
                }),
            );
        }
        tracing::info!(conn = conn.id, %target, answer = answer.as_str(), by, "approval");
        lock(&self.approvals).push(Approval {
            host: target.host.to_string(),
            port: target.port,
            answer: answer.as_str().to_string(),
            by: by.clone(),
        });
        if matches!(answer, Answer::AllowSession | Answer::AllowAlways) {
            lock(&self.session.0).insert(target.clone());
        }
        let (verdict, reason) = match answer {
            a if a.allows() => (Verdict::Allow, Reason::Approved),
            Answer::Timeout => (Verdict::Deny, Reason::ApprovalTimeout),
            _ => (Verdict::Deny, Reason::ApprovalDenied),
        };
        Decision {
            verdict,
            reason,
            rule: None,
        }
    }

    /// Which clients credentials are added for.
    pub fn lend_to(&self) -> crate::lend::LendTo {
        self.lend_to
    }

    /// A request on an allowed host would carry a credential beyond reads
    /// (SPEC §3.4): ask the approver, naming the method, URL and
    /// credential. With nobody to ask it is refused (`credential-write`).
    pub async fn lend(&self, conn: &Conn, target: &Target, write: CredentialWrite) -> Lend {
        // A session's answer covers this method on this URL with this
        // credential (red team round 7: one answer for a PUT covered a PUT
        // elsewhere on the host).
        let key = (
            target.clone(),
            write.method.clone(),
            write.credential.clone(),
            write.url.clone(),
        );
        if lock(&self.lent).contains(&key) {
            return Lend::Lend;
        }
        let refuse = |detail: String| {
            let r = Refusal::new(Reason::CredentialWrite, target, detail);
            Lend::Refuse(Box::new(self.refused(conn, Protocol::Connect, r, None)))
        };
        let shown = crate::escape::line(&write.to_string(), 400);
        if !self.approver.asks() {
            return refuse(format!(
                "{shown} would act with that identity, and the credential is lent to reads only (GET, HEAD); nobody was asked (no approver, or --ask deny)"
            ));
        }
        let policy = self.policy();
        let question = Question {
            target: target.clone(),
            command: conn
                .client
                .clone()
                .or_else(|| self.identity.identify(conn.peer))
                .map(|c| c.argv.join(" ")),
            write: Some(write.clone()),
        };
        let asked = Instant::now();
        let (answer, by) =
            match tokio::time::timeout(policy.ask_timeout, self.approver.ask(question)).await {
                Ok(a) => a,
                Err(_) => (
                    Answer::Timeout,
                    format!("nobody answered within {:?}", policy.ask_timeout),
                ),
            };
        self.metrics.approval_wait(asked.elapsed().as_secs_f64());
        if let Some(audit) = &self.audit {
            audit.write(
                conn.id,
                Event::Approval(schema::Approval {
                    host: target.host.to_string(),
                    port: target.port,
                    question: format!("lend the credential to {shown}?"),
                    answer: answer.as_str().into(),
                    by: by.clone(),
                    command: conn.client.clone(),
                }),
            );
        }
        tracing::info!(conn = conn.id, %target, request = %shown, answer = answer.as_str(), by, "credential approval");
        lock(&self.approvals).push(Approval {
            host: target.host.to_string(),
            port: target.port,
            answer: answer.as_str().to_string(),
            by: by.clone(),
        });
        match answer {
            Answer::AllowSession | Answer::AllowAlways => {
                lock(&self.lent).insert(key);
                Lend::Lend
            }
            Answer::AllowOnce => Lend::Lend,
            Answer::Timeout => refuse(format!(
                "{shown}: the credential is lent to reads only and nobody approved this request in time ({by})"
            )),
            Answer::Deny => refuse(format!(
                "{shown}: the credential is lent to reads only and approval was refused ({by})"
            )),
        }
    }

    /// Ask the approver, unless the same target is being asked about
    /// already, in which case wait for that answer. No answer within
    /// `ask_timeout` is a timeout.
    async fn ask_once(&self, policy: &Policy, conn: &Conn, target: &Target) -> (Answer, String) {
        let waiting = {
            let mut inflight = lock(&self.inflight);
            match inflight.get(target) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    inflight.insert(target.clone(), rx);
                    Ok(tx)
                }
            }
        };
        let tx = match waiting {
            Ok(tx) => tx,
            Err(mut rx) => {
                self.approver.also_waiting(target);
                let shared = rx
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|v| v.clone());
                return match shared {
                    Some((answer, by)) => (answer, format!("{by} (shared question)")),
                    None => (Answer::Deny, "the question was abandoned".into()),
                };
            }
        };
        // If this future is dropped (the client went away), the entry goes
        // too, and the waiters see the question abandoned.
        struct Forget<'a>(&'a Mutex<Inflight>, &'a Target);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                lock(self.0).remove(self.1);
            }
        }
        let _forget = Forget(&self.inflight, target);
        let question = Question {
            target: target.clone(),
            command: conn
                .client
                .clone()
                .or_else(|| self.identity.identify(conn.peer))
                .map(|c| c.argv.join(" ")),
            write: None,
        };
        let answer =
            match tokio::time::timeout(policy.ask_timeout, self.approver.ask(question)).await {
                Ok(a) => a,
                Err(_) => (
                    Answer::Timeout,
                    format!("nobody answered within {:?}", policy.ask_timeout),
                ),
            };
        let _ = tx.send(Some(answer.clone()));
        answer
    }

    /// Record a refusal (log, audit, exit-report tally) and hand it back.
    pub fn refused(
        &self,
        conn: &Conn,
        protocol: Protocol,
        mut refusal: Refusal,
        ip: Option<IpAddr>,
    ) -> Refusal {
        refusal.user_allow = self.policy().user_allow;
        if refusal.reason == Reason::PrivateAddress {
            refusal.resolved = ip;
        }
        let decision = Decision {
            verdict: Verdict::Deny,
            reason: refusal.reason,
            rule: refusal.rule.clone(),
        };
        let (host, port) = match &refusal.parsed {
            Some(t) => (t.host.to_string(), Some(t.port)),
            None => (refusal.target.clone(), None),
        };
        self.log_decision_raw(
            conn,
            protocol,
            &host,
            port,
            ip,
            &decision,
            Some(&refusal.detail),
        );
        let key = (host, port, refusal.reason);
        if matches!(
            refusal.reason,
            Reason::UpstreamUnreachable | Reason::UpstreamTimeout
        ) {
            if let Some(detail) = lock(&self.upstream).count(key, String::new) {
                *detail = crate::escape::line(&refusal.detail, 300);
            }
        } else if let Some(ip) = lock(&self.blocked).count(key, || None) {
            *ip = ip.or(refusal.resolved);
        }
        refusal
    }

    fn log_decision(
        &self,
        conn: &Conn,
        protocol: Protocol,
        target: &Target,
        ip: Option<IpAddr>,
        d: &Decision,
        detail: Option<&str>,
    ) {
        self.log_decision_raw(
            conn,
            protocol,
            &target.host.to_string(),
            Some(target.port),
            ip,
            d,
            detail,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn log_decision_raw(
        &self,
        conn: &Conn,
        protocol: Protocol,
        host: &str,
        port: Option<u16>,
        ip: Option<IpAddr>,
        d: &Decision,
        detail: Option<&str>,
    ) {
        let rule = d.rule.as_ref().map(|r| r.value.text.clone());
        let source = d.rule.as_ref().map(|r| r.origin.to_string());
        tracing::info!(
            conn = conn.id,
            client = %conn.peer,
            protocol = protocol.as_str(),
            host = %crate::escape::line(host, 200),
            port,
            ip = ?ip,
            decision = d.verdict.as_str(),
            reason = d.reason.as_str(),
            rule = ?rule,
            source = ?source,
            detail = ?detail,
            "decision"
        );
        self.metrics.decision(d.verdict.as_str(), d.reason.as_str());
        if let Some(audit) = &self.audit {
            audit.write(
                conn.id,
                Event::Decision(schema::Decision {
                    host: host.into(),
                    port,
                    ip: ip.map(|i| i.to_string()),
                    decision: d.verdict.as_str().into(),
                    reason: d.reason.as_str().into(),
                    rule,
                    source,
                    protocol: protocol.as_str().into(),
                    command: conn.client.clone(),
                    client: conn.peer.to_string(),
                    detail: detail.map(Into::into),
                }),
            );
        }
    }

    /// The close line: bytes both ways, duration and the error, if any.
    pub fn closed(
        &self,
        conn: &Conn,
        target: &Target,
        since: Instant,
        totals: Totals,
        error: Option<String>,
    ) {
        let duration_ms = since.elapsed().as_millis() as u64;
        self.metrics.bytes(totals.up, totals.down);
        tracing::info!(
            conn = conn.id,
            %target,
            bytes_up = totals.up,
            bytes_down = totals.down,
            duration_ms,
            error = ?error,
            "close"
        );
        if let Some(audit) = &self.audit {
            // host, port and command too: each line stands alone (SPEC §6).
            audit.write(
                conn.id,
                Event::Close(schema::Close {
                    host: target.host.to_string(),
                    port: target.port,
                    command: conn.client.clone(),
                    bytes_up: totals.up,
                    bytes_down: totals.down,
                    duration_ms,
                    error,
                }),
            );
        }
    }

    /// The questions answered so far, for the exit report.
    pub fn approvals(&self) -> Vec<Approval> {
        lock(&self.approvals).clone()
    }

    /// The targets a question is being asked about now, and why it may go
    /// unanswered: a session's command that ended while it waited is told
    /// (its refusal, when it comes, is counted after it).
    pub fn asking(&self) -> (Vec<Target>, Option<String>) {
        let mut targets: Vec<Target> = lock(&self.inflight).keys().cloned().collect();
        targets.sort_by_key(|t| t.to_string());
        let why = match targets.is_empty() {
            true => None,
            false => self.approver.unheard(),
        };
        (targets, why)
    }

    /// Refusals not among `blocked()` (its distinct entries reached
    /// `TALLY_CAP`): counted, not listed.
    pub fn blocked_beyond(&self) -> u64 {
        lock(&self.blocked).beyond
    }

    /// Allowed hosts that could not be reached, for the exit report.
    pub fn upstream_failures(&self) -> Vec<UpstreamFailure> {
        lock(&self.upstream)
            .entries
            .iter()
            .map(|((host, port, reason), (count, detail))| UpstreamFailure {
                host: crate::escape::line(host, 200),
                port: *port,
                reason: reason.as_str().to_string(),
                count: *count,
                detail: detail.clone(),
            })
            .collect()
    }

    /// Upstream failures not among `upstream_failures()`.
    pub fn upstream_beyond(&self) -> u64 {
        lock(&self.upstream).beyond
    }

    /// What was blocked so far, for the exit report.
    pub fn blocked(&self) -> Vec<Blocked> {
        let user_allow = self.policy().user_allow;
        lock(&self.blocked)
            .entries
            .iter()
            .map(|((host, port, reason), (count, ip))| {
                // A name refused at the sandbox's DNS has no port: advise
                // as for HTTPS, the usual case.
                let advise_port = match (port, reason) {
                    (None, Reason::InvalidHost) => None,
                    (p, _) => Some(p.unwrap_or(443)),
                };
                let how = advise_port
                    .and_then(|p| Host::parse(host).ok().map(|h| Target::new(h, p)))
                    .map(|t| airlock_policy::advice(&t, *reason, *ip, user_allow))
                    .unwrap_or_else(|| "fix the host name".into());
                Blocked {
                    host: crate::escape::line(host, 200),
                    port: *port,
                    reason: reason.as_str().to_string(),
                    count: *count,
                    how_to_allow: how,
                }
            })
            .collect()
    }
}

impl Live {
    fn new(policy: Arc<Policy>, dns_server: Option<SocketAddr>) -> Live {
        let resolve = policy
            .resolve
            .iter()
            .map(|(h, ip)| (h.clone(), ip.value))
            .collect();
        Live {
            resolver: Arc::new(Resolver::new(resolve, dns_server)),
            policy,
        }
    }
}

fn deny_detail(d: &Decision) -> String {
    match d.reason {
        Reason::ManagedDeny => "the managed policy denies it".into(),
        Reason::Denylisted => "a deny rule matches it".into(),
        Reason::PortNotAllowed => "the host is allowed, but not on this port".into(),
        Reason::NotAllowlisted => "no allow rule matches it and unknown hosts are denied".into(),
        Reason::ApprovalDenied => "no rule matches it and approval was refused".into(),
        Reason::ApprovalTimeout => {
            "no rule matches it and nobody answered the approval request in time".into()
        }
        other => other.as_str().to_string(),
    }
}

#[cfg(test)]
mod tally_tests {
    use super::*;

    #[test]
    fn a_tally_keeps_at_most_its_cap_and_counts_the_rest() {
        let mut t: Tally<Option<IpAddr>> = Tally::default();
        for i in 0..(TALLY_CAP as u32 + 500) {
            let key = (format!("h{i}.test"), Some(443), Reason::NotAllowlisted);
            t.count(key, || None);
        }
        // A kept entry still counts up after the cap is reached.
        assert!(t
            .count(
                ("h0.test".into(), Some(443), Reason::NotAllowlisted),
                || None
            )
            .is_some());
        assert_eq!(t.entries.len(), TALLY_CAP);
        assert_eq!(t.beyond, 500);
        let kept: u64 = t.entries.values().map(|(c, _)| c).sum();
        assert_eq!(kept + t.beyond, TALLY_CAP as u64 + 501);
    }
}
