//! `airlock run`: build the plan, start the sandbox, serve its proxy
//! listener in-process, wait, and report (SPEC §2, §4, §7).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_proxy::{AuditLog, Engine, EngineConfig};
#[cfg(not(target_os = "macos"))]
use anyhow::bail;
use anyhow::{Context, Result};

use crate::cli::RunArgs;
use crate::plan::{self, Net, Options};
use crate::proxy_cmd::run_id;
use crate::report::{self, ProtectedPaths, Report};
use crate::sources::build_policy;

pub const EXIT_TIMEOUT: u8 = 124;

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let (policy, workspace) = build_policy(&args.policy)?;
    tracing::debug!(elapsed = ?started.elapsed(), "policy built");
    let net = plan::net_mode(&policy, args.network.as_deref()).map_err(anyhow::Error::msg)?;
    if net == Net::Host {
        eprintln!("airlock: warning: --network host: the command reaches the network directly, with no proxy and no policy");
    }
    let timeout = match &args.timeout {
        Some(t) => Some(
            airlock_policy::units::parse_duration(t)
                .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?,
        ),
        None => policy.timeout.as_ref().map(|t| t.value),
    };
    // Linux enforces them (or refuses to run); Seatbelt has no such limits.
    for (what, set) in [
        ("limits.memory", policy.memory.is_some()),
        ("limits.pids", policy.pids.is_some()),
    ] {
        if set && cfg!(target_os = "macos") {
            eprintln!("airlock: warning: {what} is not enforced yet in this build");
        }
    }
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .context("HOME is not set")?;
    // airlock's config directory must exist to be protected: a read-only
    // bind needs something to cover.
    if let Some(dir) = crate::sources::user_policy_path()
        .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
    {
        let _ = std::fs::create_dir_all(dir);
    }
    let plan = plan::build(
        &policy,
        &Options {
            argv: &args.command,
            workspace: &workspace,
            home: &home,
            extra_write: &args.write,
            read_only: args.read_only,
            net,
            allow_degraded: args.allow_degraded,
            host_env: std::env::vars().collect(),
        },
    );
    tracing::debug!(elapsed = ?started.elapsed(), "plan built");
    for u in &plan.unsupported {
        eprintln!("airlock: warning: {u} cannot be enforced by mounts (only plain paths and a trailing /**)");
    }
    run_platform(args, policy, plan, timeout, started)
}

/// A sandbox that has been started, whatever the platform.
struct Started {
    child: std::process::Child,
    listener: Option<std::net::TcpListener>,
    identity: Arc<dyn airlock_proxy::ClientIdentity>,
    tier: &'static str,
    /// What ends the sandbox on `--timeout`.
    teardown: libc::c_int,
    /// Setup errors and exec failures the sandbox reported.
    messages: Box<dyn Fn() -> Vec<String>>,
}

/// Start the sandbox. Runs on the main thread: on Linux the helper's
/// parent-death signal follows the spawning thread.
#[cfg(target_os = "linux")]
fn start(plan: &plan::Plan) -> Result<Started> {
    use crate::linux::{attribution::SandboxProcesses, Sandbox};
    if crate::doctor::is_wsl1() {
        bail!("WSL1 has no namespaces and no Landlock; airlock needs WSL2 (wsl --set-version <distro> 2)");
    }
    // The degraded tier only with --allow-degraded, and only when user
    // namespaces are really unavailable (or AIRLOCK_FORCE_TIER=degraded
    // asks for it, which also needs --allow-degraded).
    let forced = std::env::var("AIRLOCK_FORCE_TIER").is_ok_and(|t| t == "degraded");
    if forced && !plan.allow_degraded {
        bail!("AIRLOCK_FORCE_TIER=degraded needs --allow-degraded");
    }
    let degraded = plan.allow_degraded && (forced || crate::doctor::probe_userns().is_err());
    let mut plan = plan.clone();
    let mut listener = None;
    if degraded {
        let port = match plan.net {
            Net::Proxy => {
                let l = std::net::TcpListener::bind("127.0.0.1:0")
                    .context("binding the proxy listener")?;
                let port = l.local_addr()?.port();
                crate::env::add_proxy(&mut plan.env, port);
                listener = Some(l);
                Some(port)
            }
            Net::None => None,
            Net::Host => {
                bail!("--network host has no degraded tier: it is already unconfined networking")
            }
        };
        eprintln!(
            "airlock: warning: user namespaces are unavailable; running the degraded tier (--allow-degraded): {}",
            crate::doctor::DEGRADED_RESIDUAL_RISK
        );
        plan.degraded = Some(port);
    }
    let (child, fd, channel) = Sandbox::start(&plan)?.into_parts();
    let anchor = child.id();
    Ok(Started {
        child,
        listener: listener.or(fd.map(std::net::TcpListener::from)),
        identity: Arc::new(SandboxProcesses { anchor }),
        tier: if degraded {
            "linux-degraded"
        } else {
            "linux-namespaces"
        },
        teardown: if degraded {
            libc::SIGUSR1
        } else {
            libc::SIGKILL
        },
        messages: Box::new(move || channel.messages()),
    })
}

#[cfg(target_os = "macos")]
fn start(plan: &plan::Plan) -> Result<Started> {
    let mut plan = plan.clone();
    // The proxy listens on a random loopback port in the supervisor.
    let listener = match plan.net {
        Net::Proxy => {
            let l =
                std::net::TcpListener::bind("127.0.0.1:0").context("binding the proxy listener")?;
            crate::env::add_proxy(&mut plan.env, l.local_addr()?.port());
            Some(l)
        }
        _ => None,
    };
    let port = listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port());
    let profile = crate::seatbelt::profile(&plan, port);
    let child = crate::macos::spawn(&plan, &profile)?;
    Ok(Started {
        child,
        listener,
        identity: Arc::new(airlock_proxy::SourceAddressOnly),
        tier: "macos-seatbelt",
        teardown: libc::SIGKILL,
        messages: Box::new(Vec::new),
    })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn start(_: &plan::Plan) -> Result<Started> {
    bail!("airlock run is not available on this platform; it never runs a command unsandboxed")
}

fn run_platform(
    args: &RunArgs,
    policy: airlock_policy::Policy,
    mut plan: plan::Plan,
    timeout: Option<Duration>,
    started: Instant,
) -> Result<ExitCode> {
    let run = run_id();
    let audit = match &policy.audit_log {
        Some(path) => Some(AuditLog::open(std::path::Path::new(&path.value), &run)?),
        None => None,
    };
    let inspect = crate::inspect_setup::for_policy(&policy)?;
    // The trust variables are set only when something is inspected.
    let bundle = match &inspect {
        Some(cfg) => Some(crate::inspect_setup::bundle(cfg, &run)?),
        None => None,
    };
    if let Some(b) = &bundle {
        plan.env.extend(b.env());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let approver = crate::approve::approver_in(&runtime, args.policy.ask.as_deref(), &policy)?;
    tracing::debug!(elapsed = ?started.elapsed(), "runtime and approver ready");
    // Spawned from this (main) thread: see `start`.
    let sandbox = start(&plan)?;
    tracing::debug!(elapsed = ?started.elapsed(), "sandbox started");
    let engine = Engine::new(EngineConfig {
        policy: Arc::new(policy),
        audit,
        approver,
        identity: sandbox.identity.clone(),
        dns_server: args.policy.dns_server,
        inspect,
    });
    if let Some(std_listener) = sandbox.listener {
        std_listener
            .set_nonblocking(true)
            .context("proxy listener")?;
        let engine = engine.clone();
        runtime.spawn(async move {
            match tokio::net::TcpListener::from_std(std_listener) {
                Ok(l) => {
                    if let Err(e) = airlock_proxy::serve(engine, l).await {
                        tracing::error!("the proxy stopped: {e}");
                    }
                }
                Err(e) => tracing::error!("cannot serve the proxy listener: {e}"),
            }
        });
    }

    let status = wait(sandbox.child, timeout, sandbox.teardown)?;
    tracing::debug!(elapsed = ?started.elapsed(), "sandbox exited");
    restore_terminal();
    let mut code = match status {
        None => {
            eprintln!(
                "airlock: timed out after {:?}; the sandbox was killed",
                timeout.unwrap_or_default()
            );
            i32::from(EXIT_TIMEOUT)
        }
        Some(code) => code,
    };
    for m in (sandbox.messages)() {
        if let Some(e) = m.strip_prefix("error: ") {
            eprintln!("airlock: sandbox setup failed: {e}");
            code = 125;
        } else if let Some(e) = m.strip_prefix("exec-error: ") {
            eprintln!("airlock: {e}");
        }
    }
    runtime.shutdown_timeout(Duration::from_millis(100));
    if let Some(b) = &bundle {
        b.remove();
    }
    let blocked = engine.blocked();
    let approvals = engine.approvals();
    if let Some(block) = report::stderr_block(&blocked) {
        eprintln!("{block}");
    }
    if let Some(path) = &args.report {
        report::write(
            path,
            &Report {
                exit_code: code,
                tier: sandbox.tier,
                duration_ms: started.elapsed().as_millis() as u64,
                blocked: &blocked,
                approvals: &approvals,
                protected_paths: ProtectedPaths {
                    deny_read: &plan.deny_read,
                    deny_write: &plan.deny_write,
                },
            },
        )?;
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The sandbox's exit code, or `None` when the timeout killed it.
fn wait(
    child: std::process::Child,
    timeout: Option<Duration>,
    teardown: libc::c_int,
) -> Result<Option<i32>> {
    use std::os::unix::process::ExitStatusExt;
    let code = |status: std::process::ExitStatus| {
        status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
    };
    let mut child = child;
    let Some(timeout) = timeout else {
        // The common case: no timer, so no waiter thread either.
        return Ok(Some(code(child.wait().context("waiting for the sandbox")?)));
    };
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            // On Linux the helper's death takes PID 1 (parent-death
            // signal), and PID 1's takes every process in the sandbox; the
            // degraded tier's subreaper tears down on its own signal.
            // SAFETY: kill(2) on our own child, which has not been reaped.
            unsafe { libc::kill(pid, teardown) };
            if teardown != libc::SIGKILL && rx.recv_timeout(Duration::from_secs(5)).is_ok() {
                return Ok(None);
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = rx.recv();
            return Ok(None);
        }
    }
    .context("waiting for the sandbox")?;
    Ok(Some(code(status)))
}

/// Take the terminal's foreground back from the sandbox's job.
fn restore_terminal() {
    // SAFETY: terminal calls on our own stdin, with SIGTTOU ignored meanwhile.
    unsafe {
        if libc::isatty(0) == 1 {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, old);
        }
    }
}
