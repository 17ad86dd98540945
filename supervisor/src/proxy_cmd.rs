//! `airlock proxy`: the engine alone on a TCP address, for containers, CI
//! runners and other sandboxes (SPEC §5.4).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use airlock_proxy::{AuditLog, Engine, EngineConfig, SourceAddressOnly};
use anyhow::{bail, Context, Result};

use crate::cli::ProxyArgs;
use crate::sources::build_policy;

/// A short id that tells one run's audit lines from another's.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:016x}", nanos ^ (u64::from(std::process::id()) << 40))
}

pub fn run(args: &ProxyArgs) -> Result<ExitCode> {
    let built = build_policy(&args.policy, &[], crate::sources::Named::AsGiven)?;
    built.require_trusted()?;
    let policy = built.policy;
    let addr: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}: expected IP:PORT", args.listen))?;
    if !addr.ip().is_loopback() {
        if !args.allow_remote_clients {
            bail!(
                "--listen {addr} is not a loopback address; anyone who can reach it could use the proxy. \
                 Add --allow-remote-clients if that is what you want"
            );
        }
        tracing::warn!("listening on {addr}: any host that can reach it may use this proxy");
    }
    let audit = match &policy.audit_log {
        Some(path) => Some(AuditLog::open(
            std::path::Path::new(&path.value),
            &run_id(),
        )?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let inspect = crate::inspect_setup::for_policy(&policy)?;
    let approver = crate::approve::approver_in(&runtime, args.policy.ask.as_deref(), &policy)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!("airlock proxy listening on {local}");
        let engine = Engine::new(EngineConfig {
            policy: Arc::new(policy),
            audit,
            approver,
            identity: Arc::new(SourceAddressOnly),
            dns_server: args.policy.dns_server,
            inspect,
        });
        tokio::select! {
            r = airlock_proxy::serve(engine, listener) => r.context("the proxy stopped")?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(ExitCode::SUCCESS)
    })
}
