//! `airlock proxy`: the engine alone on a TCP address, for containers, CI
//! runners and other sandboxes (SPEC §5.4). SIGHUP reloads the policy;
//! `--metrics ADDR` serves Prometheus metrics.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use airlock_proxy::{Engine, EngineConfig, LendTo, SourceAddressOnly};
use anyhow::{bail, Context, Result};

use crate::cli::ProxyArgs;
use crate::policy::build_policy;

fn load(args: &ProxyArgs) -> Result<airlock_policy::Policy> {
    let built = build_policy(
        &args.policy,
        &[],
        crate::policy::Named::AsGiven,
        &crate::probe::Runner,
    )?;
    built.require_trusted()?;
    Ok(built.policy)
}

/// An address to listen on: loopback unless remote clients were asked for.
fn listen_addr(what: &str, text: &str, remote: bool) -> Result<SocketAddr> {
    let addr: SocketAddr = text
        .parse()
        .with_context(|| format!("{what} {text}: expected IP:PORT"))?;
    if !addr.ip().is_loopback() {
        if !remote {
            bail!(
                "{what} {addr} is not a loopback address; anyone who can reach it could use it. \
                 Add --allow-remote-clients if that is what you want"
            );
        }
        tracing::warn!("{what} {addr}: any host that can reach it may use it");
    }
    Ok(addr)
}

/// The host patterns credentials are added for.
fn lent_hosts(policy: &airlock_policy::Policy) -> Vec<String> {
    let mut hosts: Vec<String> = policy
        .credentials
        .iter()
        .map(|c| c.host.text.clone())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The user's name, for the start-up line.
fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)? == uid.to_string()).then(|| name.to_string())
    })
}

/// SIGHUP: read the policy again. Open tunnels are untouched; a policy
/// that does not load is reported and the running one kept.
fn reload(engine: &Engine, args: &ProxyArgs) {
    match load(args) {
        Ok(policy) => {
            let old = engine.policy();
            if policy.audit_log.as_ref().map(|l| &l.value)
                != old.audit_log.as_ref().map(|l| &l.value)
                || policy.audit_otlp.as_ref().map(|l| &l.value)
                    != old.audit_otlp.as_ref().map(|l| &l.value)
            {
                eprintln!("airlock proxy: the audit settings changed; they take effect on restart");
            }
            engine.reload(Arc::new(policy));
            eprintln!("airlock proxy: policy reloaded");
        }
        Err(e) => {
            eprintln!("airlock proxy: the new policy was refused, keeping the old one: {e:#}")
        }
    }
}

pub fn run(args: &ProxyArgs) -> Result<ExitCode> {
    let policy = load(args)?;
    let upstream_proxy = crate::inspect_setup::upstream_proxy(&args.policy)?;
    let addr = listen_addr("--listen", &args.listen, args.allow_remote_clients)?;
    let metrics_addr = args
        .metrics
        .as_deref()
        .map(|m| listen_addr("--metrics", m, args.allow_remote_clients))
        .transpose()?;
    let (audit, otlp) = crate::run_audit::open(&policy, &crate::run_audit::run_id())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let inspect = crate::inspect_setup::for_policy(&policy)?;
    let approver = crate::approve::approver_in(&runtime, args.policy.ask.as_deref(), &policy)?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let engine = Engine::new(EngineConfig {
            policy: Arc::new(policy),
            audit,
            approver,
            identity: Arc::new(SourceAddressOnly),
            dns_server: args.policy.dns_server,
            inspect,
            lend_to: LendTo::Uid(uid),
            upstream_proxy: upstream_proxy.clone(),
        });
        // The first line: scripts and tests read the address from it.
        eprintln!("airlock proxy listening on {local}");
        if let Some(p) = &upstream_proxy {
            eprintln!(
                "airlock proxy: upstream connections go through the parent proxy {} (CONNECT to the address airlock checked)",
                p.shown()
            );
        }
        let lent = lent_hosts(&engine.policy());
        if !lent.is_empty() {
            // SPEC §5.4: say who may use the identity this proxy lends.
            eprintln!(
                "airlock proxy: credentials for {} are added only for clients on this machine running as uid {uid}{}; other clients are refused on those hosts (credential-client). They are lent to reads only: other requests are asked for{}",
                lent.join(", "),
                user_name(uid).map(|n| format!(" ({n})")).unwrap_or_default(),
                if cfg!(target_os = "linux") { "" } else { " (on this system no client can be told apart, so none gets them)" },
            );
        }
        if let Some(o) = &otlp {
            engine.metrics().watch_export(o.stats());
        }
        if let Some(m) = metrics_addr {
            let l = tokio::net::TcpListener::bind(m)
                .await
                .with_context(|| format!("cannot listen on {m} for metrics"))?;
            let m = l.local_addr()?;
            engine.add_own_addr(m);
            let e = engine.clone();
            tokio::spawn(airlock_proxy::metrics::serve(
                Arc::new(move || e.metrics().text()),
                l,
            ));
            eprintln!("airlock proxy metrics on http://{m}/metrics");
        }
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot watch SIGHUP")?;
        // The accept loop runs on a worker thread, not on this one: a task
        // spawned from a worker starts on that worker, while one spawned
        // from here costs a cross-thread wake-up per accepted connection.
        let mut serve = tokio::spawn(airlock_proxy::serve(engine.clone(), listener));
        let result = loop {
            tokio::select! {
                r = &mut serve => break match r {
                    Ok(r) => r.context("the proxy stopped"),
                    Err(e) => Err(anyhow::anyhow!("the proxy stopped: {e}")),
                },
                _ = tokio::signal::ctrl_c() => break Ok(()),
                _ = hup.recv() => reload(&engine, args),
            }
        };
        serve.abort();
        result.map(|()| ExitCode::SUCCESS)
    });
    if let Some(o) = &otlp {
        o.close(Duration::from_secs(2));
    }
    result
}
