//! The sandbox's DNS server (SPEC §5.5), on hickory-server. It answers
//! from the policy, never forwarding a query:
//!
//! - a name the policy refuses (on every port) gets NXDOMAIN, and no query
//!   for it leaves the proxy, so DNS cannot carry data out through it;
//! - an allowed name is resolved by the proxy (its `resolve` overrides and
//!   `--dns-server` included) and answered with the addresses that pass the
//!   address check, which are remembered so a captured connection to one of
//!   them recovers the name (and is dialed there: pinning);
//! - a name `unknown = "ask"` would ask about is not looked up: a lookup
//!   is data leaving (`<secret>.attacker.example`). It is answered with a
//!   placeholder address from 198.18.0.0/15 (reserved for benchmarking,
//!   never a real destination) that stands for the name. A connection to
//!   it is captured, the name recovered from the placeholder, and the
//!   question asked then, with the port known; only an approved connection
//!   makes the proxy resolve the name (SPEC §5.5). A name the policy pins
//!   (`resolve`) gets its pinned address: no query leaves for it either;
//! - every query is an audit `dns` event: name, type, answer or refusal.
//!
//! Only A and AAAA get records; every other type gets an empty answer for
//! an allowed name and NXDOMAIN for a refused one.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_policy::{decide_with, Decision, Host, Reason, Target, Verdict};
use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA};
use hickory_server::proto::rr::{Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;

use airlock_audit::{schema, Event};

use crate::engine::{Engine, Protocol};
use crate::refusal::Refusal;

/// How long clients may cache an answer. Short: every connection is
/// decided again anyway, and a short TTL keeps the name map fresh.
const TTL: u32 = 30;
/// How many addresses the name map remembers.
const NAMES_CAPACITY: usize = 16 * 1024;
/// Names remembered per address (shared hosting puts many on one).
const NAMES_PER_ADDRESS: usize = 8;

/// Address → the names the sandbox's DNS answered with it, newest last.
pub struct Names(Mutex<lru::LruCache<IpAddr, Vec<Host>>>);

impl Default for Names {
    /// Unbounded to the `lru` crate, which would otherwise allocate and
    /// clear a table for all NAMES_CAPACITY entries at every start-up
    /// (a third of a megabyte, most runs never resolving a name); the
    /// bound is kept by `remember`.
    fn default() -> Names {
        Names(Mutex::new(lru::LruCache::unbounded()))
    }
}

impl Names {
    pub fn remember(&self, ip: IpAddr, host: &Host) {
        let ip = airlock_policy::host::canonical_ip(ip);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains(&ip) && map.len() >= NAMES_CAPACITY {
            map.pop_lru();
        }
        let names = map.get_or_insert_mut(ip, Vec::new);
        names.retain(|h| h != host);
        names.push(host.clone());
        if names.len() > NAMES_PER_ADDRESS {
            names.remove(0);
        }
    }

    /// The names answered with this address, newest first.
    pub fn lookup(&self, ip: IpAddr) -> Vec<Host> {
        let ip = airlock_policy::host::canonical_ip(ip);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&ip)
            .map(|v| v.iter().rev().cloned().collect())
            .unwrap_or_default()
    }
}

/// How many placeholder addresses there are: 198.18.0.1 to 198.18.255.254.
const PLACEHOLDERS: u32 = 65534;

/// Names awaiting approval and the placeholder address each was answered
/// with. When all are in use the oldest is given to the next name (its
/// earlier owner's cached answers then stand for the new name, which is
/// decided like any other).
#[derive(Default)]
pub struct Placeholders(Mutex<PlaceholderMap>);

#[derive(Default)]
struct PlaceholderMap {
    by_name: HashMap<Host, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, Host>,
    next: u32,
}

impl Placeholders {
    /// The placeholder for `host`, the same one each time while it lasts.
    pub fn for_name(&self, host: &Host) -> Ipv4Addr {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ip) = m.by_name.get(host) {
            return *ip;
        }
        let i = m.next % PLACEHOLDERS + 1;
        m.next = m.next.wrapping_add(1);
        let ip = Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8);
        if let Some(old) = m.by_ip.insert(ip, host.clone()) {
            m.by_name.remove(&old);
        }
        m.by_name.insert(host.clone(), ip);
        ip
    }

    /// The name a placeholder stands for.
    pub fn name(&self, ip: IpAddr) -> Option<Host> {
        let IpAddr::V4(v4) = airlock_policy::host::canonical_ip(ip) else {
            return None;
        };
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.by_ip.get(&v4).cloned()
    }
}

/// Serve DNS on sockets bound inside the sandbox until the future is
/// dropped.
pub async fn serve(
    engine: Arc<Engine>,
    udp: tokio::net::UdpSocket,
    tcp: tokio::net::TcpListener,
) -> std::io::Result<()> {
    let mut server = Server::new(Handler { engine });
    server.register_socket(udp);
    server.register_listener(tcp, Duration::from_secs(5), 64 * 1024);
    server
        .block_until_done()
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
}

struct Handler {
    engine: Arc<Engine>,
}

/// What the server says about a name.
enum Answer {
    Refused(Decision),
    Addresses(Vec<IpAddr>),
    /// Awaiting an approval: nothing was looked up (SPEC §5.5).
    Placeholder(Ipv4Addr),
    /// Allowed, but the lookup failed: SERVFAIL, so the client may retry.
    Failed,
}

/// A name is answered when some port of it could be allowed: decided as
/// HTTPS and as HTTP, the ports nearly every client means. A rule that
/// names the host on another port (`port-not-allowed` here) counts too:
/// the port is checked when the connection is captured.
fn decide_name(engine: &Engine, host: &Host) -> Decision {
    let mut first = None;
    let policy = engine.policy();
    for port in [443, 80] {
        let d = decide_with(&policy, &Target::new(host.clone(), port), &engine.session);
        // Nobody to ask: refused, as the connection would be.
        if d.verdict == Verdict::Ask && !engine.approver.asks() {
            first.get_or_insert(Decision::deny(Reason::NotAllowlisted));
            continue;
        }
        if d.verdict != Verdict::Deny || d.reason == Reason::PortNotAllowed {
            return d;
        }
        first.get_or_insert(d);
    }
    first.unwrap_or_else(|| Decision::deny(Reason::NotAllowlisted))
}

async fn answer(engine: &Engine, host: &Host) -> Answer {
    let decision = decide_name(engine, host);
    if decision.verdict == Verdict::Deny && decision.reason != Reason::PortNotAllowed {
        return Answer::Refused(decision);
    }
    let resolver = engine.resolver();
    if decision.verdict == Verdict::Ask && resolver.local(host).is_none() {
        return Answer::Placeholder(engine.placeholders.for_name(host));
    }
    let ips = match resolver.lookup(host).await {
        Ok(ips) => ips,
        Err(e) => {
            tracing::debug!(%host, "sandbox DNS: {e}");
            return Answer::Failed;
        }
    };
    let target = Target::new(host.clone(), 443);
    let (checked, refused) = engine.check_addresses(&engine.policy(), &target, &decision, ips);
    if let Some((ip, why)) = refused {
        tracing::debug!(%host, %ip, why, "sandbox DNS: address left out of the answer");
    }
    let ips: Vec<IpAddr> = checked.iter().map(SocketAddr::ip).collect();
    for ip in &ips {
        engine.names.remember(*ip, host);
    }
    Answer::Addresses(ips)
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let builder = MessageResponseBuilder::from_message_request(request);
        let mut meta = Metadata::response_from_request(&request.metadata);
        meta.recursion_available = true;
        let fail = |code| {
            let mut m = meta;
            m.response_code = code;
            m
        };
        let Ok(info) = request.request_info() else {
            // Not exactly one question: refused, and every name in it is
            // still an audit event (SPEC §5.5: each name asked is data
            // leaving; red team round 12 found two in one query unlogged).
            for q in request.queries.queries() {
                let name = q.name().to_string();
                self.engine.audit_event(
                    0,
                    Event::Dns(schema::Dns {
                        name: crate::escape::line(name.strip_suffix('.').unwrap_or(&name), 300),
                        qtype: q.query_type().to_string(),
                        answer: vec![],
                        outcome: "refused".into(),
                        reason: Some("more than one question in a query".into()),
                        client: request.src().to_string(),
                    }),
                );
            }
            let msg = builder.error_msg(&request.metadata, ResponseCode::FormErr);
            return send(&mut response, msg, &request.metadata).await;
        };
        let qname: Name = info.query.name().into();
        let qtype = info.query.query_type();
        // The name as the policy sees it: no trailing dot, lower case.
        let text = qname.to_ascii();
        let text = text.strip_suffix('.').unwrap_or(&text);
        let audit = |outcome: &str, answer: Vec<String>, reason: Option<&str>| {
            self.engine.audit_event(
                0,
                Event::Dns(schema::Dns {
                    name: crate::escape::line(text, 300),
                    qtype: qtype.to_string(),
                    answer,
                    outcome: outcome.into(),
                    reason: reason.map(Into::into),
                    client: request.src().to_string(),
                }),
            )
        };
        let host = match Host::parse(text) {
            Ok(h) if matches!(h, Host::Name(_)) => h,
            // Reverse lookups and names the policy cannot express.
            _ => {
                audit("not-a-name", vec![], None);
                let msg = builder.build_no_records(fail(ResponseCode::NXDomain));
                return send(&mut response, msg, &request.metadata).await;
            }
        };
        match answer(&self.engine, &host).await {
            Answer::Placeholder(ip) => {
                let records: Vec<Record> = match qtype {
                    RecordType::A => vec![Record::from_rdata(qname.clone(), 1, RData::A(A(ip)))],
                    _ => vec![],
                };
                audit(
                    "placeholder",
                    records.iter().map(|_| ip.to_string()).collect(),
                    None,
                );
                let msg = builder.build(meta, records.iter(), [], [], []);
                send(&mut response, msg, &request.metadata).await
            }
            Answer::Refused(decision) => {
                audit("refused", vec![], Some(decision.reason.as_str()));
                let conn = self.engine.open_unattributed(request.src());
                let detail = format!(
                    "the sandbox's DNS refused to resolve it ({})",
                    decision.reason.as_str()
                );
                let r = Refusal::new(decision.reason, &Target::new(host.clone(), 443), detail)
                    .with_rule(decision.rule);
                let mut r = r;
                r.parsed = None;
                r.target = host.to_string();
                self.engine.refused(&conn, Protocol::Dns, r, None);
                let msg = builder.build_no_records(fail(ResponseCode::NXDomain));
                send(&mut response, msg, &request.metadata).await
            }
            Answer::Failed => {
                audit("failed", vec![], None);
                let msg = builder.build_no_records(fail(ResponseCode::ServFail));
                send(&mut response, msg, &request.metadata).await
            }
            Answer::Addresses(ips) => {
                let records: Vec<Record> = ips
                    .into_iter()
                    .filter_map(|ip| match (ip, qtype) {
                        (IpAddr::V4(a), RecordType::A) => Some(RData::A(A(a))),
                        (IpAddr::V6(a), RecordType::AAAA) => Some(RData::AAAA(AAAA(a))),
                        _ => None,
                    })
                    .map(|rdata| Record::from_rdata(qname.clone(), TTL, rdata))
                    .collect();
                audit(
                    "answered",
                    records
                        .iter()
                        .filter_map(|r| match &r.data {
                            RData::A(a) => Some(a.0.to_string()),
                            RData::AAAA(a) => Some(a.0.to_string()),
                            _ => None,
                        })
                        .collect(),
                    None,
                );
                let msg = builder.build(meta, records.iter(), [], [], []);
                send(&mut response, msg, &request.metadata).await
            }
        }
    }
}

async fn send<'a, R: ResponseHandler>(
    response: &mut R,
    msg: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    request: &Metadata,
) -> ResponseInfo {
    match response.send_response(msg).await {
        Ok(info) => info,
        Err(e) => {
            tracing::debug!("sandbox DNS: sending the answer failed: {e}");
            let mut m = Metadata::response_from_request(request);
            m.response_code = ResponseCode::ServFail;
            hickory_server::proto::op::Header {
                metadata: m,
                counts: Default::default(),
            }
            .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_remembered_per_address_newest_first() {
        let names = Names::default();
        let ip: IpAddr = "93.184.215.14".parse().unwrap();
        let a = Host::parse("a.example").unwrap();
        let b = Host::parse("b.example").unwrap();
        assert!(names.lookup(ip).is_empty());
        names.remember(ip, &a);
        names.remember(ip, &b);
        names.remember(ip, &a);
        assert_eq!(names.lookup(ip), vec![a.clone(), b.clone()]);
        // An IPv4-mapped IPv6 address is the same destination.
        let mapped: IpAddr = "::ffff:93.184.215.14".parse().unwrap();
        assert_eq!(names.lookup(mapped), vec![a, b]);
        for i in 0..20 {
            names.remember(ip, &Host::parse(&format!("n{i}.example")).unwrap());
        }
        assert_eq!(names.lookup(ip).len(), NAMES_PER_ADDRESS);
    }

    #[test]
    fn placeholders_stand_for_one_name_each_and_are_reused_oldest_first() {
        let p = Placeholders::default();
        let a = Host::parse("a.exfil.test").unwrap();
        let b = Host::parse("b.exfil.test").unwrap();
        let ia = p.for_name(&a);
        assert_eq!(p.for_name(&a), ia, "the same name, the same placeholder");
        let ib = p.for_name(&b);
        assert_ne!(ia, ib);
        assert_eq!(p.name(IpAddr::V4(ia)), Some(a.clone()));
        // Reserved for benchmarking: never a real destination.
        assert!(airlock_policy::check_address(IpAddr::V4(ia), &[], &[]).is_err());
        for i in 0..PLACEHOLDERS {
            p.for_name(&Host::parse(&format!("n{i}.test")).unwrap());
        }
        // a's address went to a later name; a itself is forgotten.
        assert_ne!(p.name(IpAddr::V4(ia)), Some(a));
        assert!(p.0.lock().unwrap().by_name.len() <= PLACEHOLDERS as usize);
        assert_eq!(p.name("10.0.0.1".parse().unwrap()), None);
    }

    #[test]
    fn at_most_names_capacity_addresses_least_recently_used_first_out() {
        let names = Names::default();
        let host = Host::parse("a.example").unwrap();
        let addr = |i: usize| IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
        for i in 0..NAMES_CAPACITY {
            names.remember(addr(i), &host);
        }
        // Address 0 is used again: address 1 is now the oldest.
        names.remember(addr(0), &host);
        names.remember(addr(NAMES_CAPACITY), &host);
        assert_eq!(names.0.lock().unwrap().len(), NAMES_CAPACITY);
        assert!(names.lookup(addr(1)).is_empty());
        assert_eq!(names.lookup(addr(0)), vec![host.clone()]);
        assert_eq!(names.lookup(addr(NAMES_CAPACITY)), vec![host]);
    }
}
