//! Name resolution for allowed targets (SPEC §5.1): static answers from
//! the policy first, then DNS through hickory. The system resolver is
//! built on first use, so a run that never connects does no DNS work.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

use airlock_policy::Host;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;

pub struct Resolver {
    overrides: BTreeMap<Host, IpAddr>,
    /// A nameserver to use instead of the system configuration.
    server: Option<SocketAddr>,
    system: OnceLock<Result<TokioResolver, String>>,
}

impl Resolver {
    pub fn new(overrides: BTreeMap<Host, IpAddr>, server: Option<SocketAddr>) -> Resolver {
        Resolver {
            overrides,
            server,
            system: OnceLock::new(),
        }
    }

    fn build(&self) -> Result<TokioResolver, String> {
        let builder = match self.server {
            Some(addr) => {
                let mut ns = NameServerConfig::udp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![ns]),
                    TokioRuntimeProvider::default(),
                )
            }
            None => TokioResolver::builder_tokio()
                .map_err(|e| format!("cannot read the system DNS configuration: {e}"))?,
        };
        let mut builder = builder;
        // Answers are re-checked on every connection; a cache would only
        // hide a changed answer from that check, never skip it.
        builder.options_mut().cache_size = 0;
        builder
            .build()
            .map_err(|e| format!("cannot start the DNS resolver: {e}"))
    }

    /// The answer the policy itself gives (an address, a `resolve` pin):
    /// no query leaves for it.
    pub fn local(&self, host: &Host) -> Option<Vec<IpAddr>> {
        match host {
            Host::Ip(ip) => Some(vec![*ip]),
            Host::Name(_) => self.overrides.get(host).map(|ip| vec![*ip]),
        }
    }

    /// All addresses for a host, in the resolver's order.
    pub async fn lookup(&self, host: &Host) -> Result<Vec<IpAddr>, String> {
        let name = match host {
            Host::Ip(ip) => return Ok(vec![*ip]),
            Host::Name(n) => n,
        };
        if let Some(ip) = self.overrides.get(host) {
            return Ok(vec![*ip]);
        }
        let resolver = self
            .system
            .get_or_init(|| self.build())
            .as_ref()
            .map_err(Clone::clone)?;
        // A trailing dot: never append search domains to a target name.
        let answer = resolver
            .lookup_ip(format!("{name}."))
            .await
            .map_err(|e| lookup_failed(name, &e))?;
        let ips: Vec<IpAddr> = answer.iter().collect();
        if ips.is_empty() {
            return Err(format!("DNS lookup for {name} returned no address"));
        }
        Ok(ips)
    }
}

/// A failed lookup in words a person (or a model) reads: the resolver's
/// own text prints its query structure (`Query { name: Name(..) .. }`).
fn lookup_failed(name: &str, e: &hickory_resolver::net::NetError) -> String {
    use hickory_resolver::net::NetError;
    let why = if e.is_nx_domain() {
        "the name does not exist (NXDOMAIN)".to_string()
    } else if e.is_no_records_found() {
        "the name has no address records".to_string()
    } else {
        match e {
            NetError::Timeout => "the resolver did not answer in time".to_string(),
            NetError::NoConnections => "no resolver is configured or reachable".to_string(),
            other => crate::escape::line(&other.to_string(), 200),
        }
    };
    format!("DNS lookup for {name} failed: {why}")
}
