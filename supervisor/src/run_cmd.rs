//! `airlock run`: build the plan, start the sandbox, serve its proxy
//! listener in-process, wait, and report (SPEC §2, §4, §7).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_proxy::{Engine, EngineConfig};
#[cfg(not(target_os = "macos"))]
use anyhow::bail;
use anyhow::{Context, Result};

use crate::cli::RunArgs;
use crate::clock::monotonic_ns;
use crate::plan::{self, Net, Options};
use crate::report::{self, Head, ProtectedPaths};
use crate::run_audit::run_id;

/// How long the command waits, at most, for the record of nested
/// repositories before it starts (a walk of the writable roots: a few
/// milliseconds for most projects, a few hundred for 50,000 directories).
/// What it has not reached by then is judged as the sandbox's when put in
/// place during the run (fail closed): a short wait let a large tree
/// switch that judgement off (red team round 4).
const NESTED_BEFORE_BUDGET: Duration = Duration::from_secs(2);
use crate::policy::build_policy;

use crate::report::EXIT_TIMEOUT;

/// A setup step of the sandbox helper (`linux/helper.rs`), at `-vv`, on
/// the same clock as the other phases: `phase: <ns> <name>`.
fn sandbox_phase(line: &str, started_ns: i128) {
    let Some((ns, name)) = line.split_once(' ') else {
        return;
    };
    let Ok(ns) = ns.parse::<i128>() else { return };
    let elapsed = std::time::Duration::from_nanos(u64::try_from(ns - started_ns).unwrap_or(0));
    tracing::debug!(?elapsed, step = name, "sandbox setup");
}

/// What the helper can build before the plan exists: the namespaces,
/// unless the degraded tier may be asked for (only with --allow-degraded)
/// or the policy might keep the host's network (`--network host` says so
/// now; a policy's `network.mode = "host"` is found later and costs a
/// second helper, `start`).
#[cfg(target_os = "linux")]
fn ahead_of(args: &RunArgs) -> crate::linux::Ahead {
    use crate::linux::Ahead;
    if args.allow_degraded || std::env::var_os("AIRLOCK_FORCE_TIER").is_some() {
        return Ahead::Nothing;
    }
    Ahead::Namespaces {
        net: args.network.as_deref() != Some("host"),
    }
}

/// The sandbox helper, started first thing on Linux so that its start
/// overlaps building the policy and the plan (`linux::Spawned`).
#[cfg(target_os = "linux")]
type Early = Option<crate::linux::Spawned>;
#[cfg(not(target_os = "linux"))]
type Early = ();

/// `early`: the helper, when main forked it before parsing the arguments;
/// `log`: the log filter, which the plan carries to it.
/// `session`: the name of the session this sandbox serves (SPEC §4.7),
/// started by `airlock session start`: the same pipeline, with commands
/// coming on the session's socket instead of one argv.
pub fn run(args: &RunArgs, early: Early, log: String, session: Option<&str>) -> Result<ExitCode> {
    let started = Instant::now();
    // On CLOCK_MONOTONIC, so that a benchmark can place every phase below
    // against its own clock (`bench-startup`).
    tracing::debug!(monotonic_ns = %monotonic_ns(), "run started");
    #[cfg(target_os = "linux")]
    let early: Early = early.or_else(|| crate::linux::Spawned::early(ahead_of(args)).ok());
    // The command gets ours (a session's commands bring their own).
    if session.is_none() {
        for (fd, name) in [0, 1, 2].into_iter().zip(["stdin", "stdout", "stderr"]) {
            // SAFETY: 0, 1 and 2 stay open for the whole of this process.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            if let Some(why) = crate::paths::refused_stdio(fd) {
                bail!("the command's {name} is {why}; refused");
            }
        }
    }
    // A previous run whose airlock was killed left its check to us (its
    // changeset, if any, `airlock changes` finishes).
    crate::integrity::recover();
    // The search for `.env` files overlaps building the policy.
    if let Ok((workspace, _)) = crate::policy::workspace_dir(&args.policy) {
        crate::dotenv::prefetch(workspace);
    }
    let built = build_policy(
        &args.policy,
        &args.write,
        crate::policy::Named::NeedTrust,
        &crate::probe::Runner,
    )?;
    crate::policy::check_workspace_scope(&built.workspace, built.explicit_workspace)?;
    built.require_trusted()?;
    let (mut policy, workspace) = (built.policy, built.workspace);
    tracing::debug!(elapsed = ?started.elapsed(), "policy built");
    let net = plan::net_mode(&policy, args.network.as_deref()).map_err(anyhow::Error::msg)?;
    if net == Net::Host {
        let from = match &args.network {
            Some(_) => "--network host".to_string(),
            None => format!("network.mode = \"host\" ({})", policy.mode.origin),
        };
        eprintln!("airlock: warning: {from}: the command reaches the network directly, with no proxy and no policy");
    }
    // A bad parent URL stops the run before anything is built.
    crate::inspect_setup::upstream_proxy(&args.policy)?;
    let learn = crate::learn::Learn::prepare(args, &mut policy, &workspace, net == Net::Proxy)?;
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
    if let Some(dir) =
        crate::places::user_policy_path().and_then(|p| p.parent().map(std::path::Path::to_path_buf))
    {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = crate::integrity::journal::make_dir();
    crate::places::make_own_state_dirs();
    // Likewise the CA's directory: a CA created while this sandbox runs
    // (`airlock ca init`, another inspecting run) must land under the mount
    // that hides it, not beside it.
    if let Some(dir) = airlock_ca::default_dir() {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
    }
    crate::prepare::before_run(&mut policy, args, &home, &workspace)?;
    let cwd = std::env::current_dir().ok();
    let mut plan = plan::build(
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
            cwd: cwd.as_deref(),
            macos: cfg!(target_os = "macos"),
        },
    );
    plan.log = log;
    crate::hints::apply_read(&mut plan, &args.read)?;
    if !args.publish.is_empty() && !cfg!(target_os = "linux") {
        bail!("--publish is Linux-only for now: the sandbox there has a network namespace of its own to publish from");
    }
    plan.publish = args.publish.clone();
    // A directory `--read` brought in can be the one to start in.
    if let (Some(_), Some(dir)) = (&plan.start_note, &cwd) {
        if let Ok(d) = plan.start_dir(dir) {
            plan.cwd = d;
            plan.start_note = None;
            plan.env
                .insert("PWD".into(), plan.cwd.display().to_string());
        }
    }
    // The sandbox's /tmp is its own: the host's whole /tmp as a writable
    // root would be bound nowhere, and what the command wrote there would
    // vanish with the run, exit 0 (harness round 11). Binding it whole
    // would hand the command other programs' sockets and files.
    if plan.write.iter().any(|w| w == std::path::Path::new("/tmp")) {
        anyhow::bail!(
            "the host's /tmp itself would be writable here (the workspace, or --write /tmp), but the sandbox has a \
             private /tmp of its own and what the command wrote would vanish: work in a directory of its own \
             (mkdir -p /tmp/work && cd /tmp/work), or name one with --write /tmp/NAME"
        );
    }
    if let Some(why) = &plan.start_note {
        bail!("{}", why.said(&plan.cwd, "run with"));
    }
    for w in &plan.env_warnings {
        eprintln!("airlock: {w}");
    }
    // A writable root that is itself one of the files host tools obey in
    // HOME (`--write ~/.gitconfig`) is the user's explicit grant: the
    // check keeps what the sandbox writes there, so it is said (red team
    // round 10).
    for w in &plan.write {
        if crate::plan::protected::HOME_SURFACE.iter().any(|r| {
            home.join(r) == *w || crate::resolve::canonical(&home.join(r)).as_ref() == Some(w)
        }) {
            eprintln!(
                "airlock: warning: {} is made writable as a whole, and host tools run or obey what it says: what the command writes there is kept, unchecked (--review shows it first)",
                crate::text::shown(w)
            );
        }
    }
    for h in crate::hints::at_start(&plan, &policy) {
        eprintln!("airlock: note: {h}");
    }
    tracing::debug!(elapsed = ?started.elapsed(), "plan built");
    crate::plan::protected::check_deny_read_links(&plan.deny_read, &plan.write)
        .map_err(anyhow::Error::msg)?;
    // A `.env` an earlier run made with a second link would pass on what the
    // user later writes into it.
    crate::plan::protected::check_deny_read_links(&plan.deny_read_env, &plan.write)
        .map_err(anyhow::Error::msg)?;
    // The audit log, the report and the learned policy are airlock's:
    // inside a writable root they are read-only to the sandbox (opened
    // before it starts, so they exist by then) and their directories
    // pinned, so it can neither forge, truncate nor replace them.
    let own_outputs: Vec<std::path::PathBuf> = policy
        .audit_log
        .iter()
        .map(|a| std::path::PathBuf::from(&a.value))
        .chain(args.report.iter().cloned())
        .chain(args.learn.iter().cloned())
        .filter_map(|p| crate::resolve::parent_resolved(&p))
        .filter(|p| plan.write.iter().any(|w| p.starts_with(w)))
        .collect();
    if !own_outputs.is_empty() {
        plan.deny_write.extend(own_outputs.iter().cloned());
        plan.own_outputs = own_outputs.clone();
        plan.pin.extend(crate::plan::protected::ancestors_to_pin(
            &own_outputs,
            &plan.write,
        ));
        plan.pin.sort();
        plan.pin.dedup();
    }
    for u in &plan.unsupported {
        eprintln!("airlock: warning: {u} cannot be enforced by mounts (only plain paths and a trailing /**)");
    }
    // Said once per workspace: the search stops at the same place every
    // time, and a harness runs hundreds of commands there.
    if plan.deny_read_env_truncated && crate::places::first_time("dotenv-truncated", &workspace) {
        eprintln!(
            "airlock: warning: .env files were looked for in the first {} directories of the writable roots (and where \
             earlier runs found one); one further down that no run has found yet is readable: a person can name its \
             directory in a policy's [filesystem] deny_read (said once for this workspace)",
            crate::dotenv::MAX_DIRS
        );
    }
    // A hidden file git tracks: inside, git sees it emptied, and a commit
    // of everything there would record it so (harness round 11).
    for f in &plan.deny_read_env_in_git {
        if crate::places::first_time("dotenv-in-git", f) {
            eprintln!(
                "airlock: note: {} is hidden (it differs from what git holds, so it may hold secrets), and git inside \
                 sees it emptied: a `git commit -a` in the sandbox would commit it empty; stage other files by name \
                 (said once an hour)",
                crate::text::shown(f)
            );
        }
    }
    plan.session = session.is_some();
    // --review (SPEC §4.8): refused where it cannot hold, never written through.
    let review = match args.review {
        false => None,
        true if cfg!(not(target_os = "linux")) => bail!(
            "--review needs Linux's full tier (overlayfs in the sandbox's user namespace); it is not available on this platform yet"
        ),
        true => {
            let mut cs = crate::review::prepare(&mut plan, &workspace, &home)?;
            // One changeset for the whole session: every command shares
            // the overlay PID 1 mounts, so each sees the earlier ones'.
            if let Some(name) = session {
                cs.meta.session = Some(name.to_string());
                cs.save()?;
            }
            tracing::debug!(elapsed = ?started.elapsed(), "changeset made");
            Some(cs)
        }
    };
    let review_dir = review.as_ref().map(|c| c.dir.clone());
    let out = run_platform(
        args, policy, plan, timeout, started, &workspace, learn, early, session, review,
    );
    // Failed before the changeset was scanned: an empty one goes.
    if let (Err(_), Some(dir)) = (&out, review_dir) {
        crate::review::abandon(&dir);
    }
    out
}

/// A sandbox that has been started, whatever the platform.
struct Started {
    /// The process airlock waits for (the helper, or sandbox-exec).
    pid: u32,
    waiter: Waiter,
    /// Lets the command itself start, once airlock's side is ready.
    go: Box<dyn Fn() -> Result<()>>,
    listener: Option<std::net::TcpListener>,
    identity: Arc<dyn airlock_proxy::ClientIdentity>,
    tier: &'static str,
    /// What ends the sandbox on `--timeout`.
    teardown: libc::c_int,
    /// Setup errors and exec failures the sandbox reported.
    messages: Box<dyn Fn() -> Vec<String>>,
    /// Blocks until the sandbox's exit status is known with every process
    /// of it gone, without waiting for the helper's own exit (Linux's full
    /// tier); `None` where only waiting for the child tells.
    status: Box<dyn Fn() -> Option<i32>>,
    /// Once the command has exited: kill and wait for whatever it left
    /// running, before any post-run check (SPEC §4.5).
    finish: Box<dyn FnOnce()>,
    /// Transparent capture's sockets, or why it is off (SPEC §5.5).
    #[cfg(target_os = "linux")]
    capture: Option<Result<crate::linux::capture::Received, String>>,
    /// A session's command socket to PID 1.
    session: Option<std::os::fd::OwnedFd>,
    /// `--publish`: the host's listeners, bound before the command starts.
    #[cfg(target_os = "linux")]
    publish: Option<crate::linux::publish::Published>,
}

/// Waits for the process `Started::pid` names.
type Waiter = Box<dyn FnOnce() -> std::io::Result<std::process::ExitStatus> + Send>;

/// A sandbox being built: its plan sent (Linux), while airlock readies its
/// own side; `finish` then takes what the sandbox sends back.
#[cfg(target_os = "linux")]
struct Pending {
    begun: crate::linux::Begun,
    listener: Option<std::net::TcpListener>,
    degraded: bool,
}

/// Decide the tier and send the plan (with what that decision adds to
/// it). Runs on the main thread: on Linux the helper's parent-death
/// signal follows the spawning thread.
#[cfg(target_os = "linux")]
fn begin(plan: &mut plan::Plan, early: Early) -> Result<Pending> {
    use crate::linux::{Ahead, Sandbox, Spawned};
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
    if degraded && !plan.review.is_empty() {
        bail!("--review needs the full tier (user namespaces, for overlayfs); the degraded tier cannot hold changes, and airlock never writes them through instead");
    }
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
        if let Some(out) = plan.own_outputs.first() {
            // No mount namespace to make them read-only, and carving them
            // out with Landlock would make the workspace root unwritable.
            bail!(
                "the degraded tier cannot keep the sandbox away from {}: put the audit log and the report outside the writable roots",
                crate::text::shown(out)
            );
        }
        eprintln!(
            "airlock: warning: user namespaces are unavailable; running the degraded tier (--allow-degraded): {}",
            crate::doctor::DEGRADED_RESIDUAL_RISK
        );
        if !plan.deny_read_env.is_empty() {
            // Landlock would have to take the root's own write access to
            // carve a file out of it; the full tier mounts over them.
            eprintln!(
                "airlock: warning: the degraded tier cannot hide .env files in the workspace or a writable root: {} stay readable",
                plan.deny_read_env
                    .iter()
                    .map(|p| crate::text::shown(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        plan.degraded = Some(port);
    }
    if !degraded {
        // Reads of hidden files are reported (SPEC §7): each gets a
        // watched cover of its own, which the mounts put in place.
        crate::linux::readwatch::prepare(plan);
        // A project's own registry credentials stay outside too (SPEC
        // §3.4; red team round 14).
        let mut found = crate::project_secrets::find(&plan.write, &plan.cwd, &plan.project_configs);
        // What is hidden stays hidden whole (a copy would show the rest).
        let hidden = crate::paths::Prefixes::new(&plan.deny_read);
        found
            .sanitised
            .retain(|(f, _)| !hidden.covers(f) && !plan.deny_read_env.contains(f));
        for (f, _) in &found.sanitised {
            if crate::places::first_time("project-credential", f) {
                eprintln!(
                    "airlock: note: {} holds a registry credential: the sandbox sees a copy without it, and nothing adds it on the way out (in your own ~/.npmrc, ~/.cargo or pip's user configuration, --preset NAME has the proxy add it)",
                    crate::text::shown(f)
                );
            }
        }
        for f in found.whole {
            if crate::places::first_time("project-credential", &f) {
                eprintln!(
                    "airlock: note: {} holds credentials and is hidden from the sandbox",
                    crate::text::shown(&f)
                );
            }
            if !plan.deny_read_env.contains(&f) {
                plan.deny_read_env.push(f);
            }
        }
        // Pinned, as `.env` files are: `mv app app2` would carry a
        // covered file out from under its cover (red team round 16).
        let covered: Vec<std::path::PathBuf> = found
            .sanitised
            .iter()
            .map(|(f, _)| f.clone())
            .chain(plan.deny_read_env.iter().cloned())
            .collect();
        plan.pin.extend(crate::plan::protected::ancestors_to_pin(
            &covered,
            &plan.write,
        ));
        plan.pin.sort();
        plan.pin.dedup();
        crate::linux::readwatch::sanitised(plan, found.sanitised);
    }
    let wanted = match degraded {
        true => Ahead::Nothing,
        false => Ahead::Namespaces {
            net: plan.net != Net::Host,
        },
    };
    // A helper that built something else ahead (the policy asked for the
    // host's network) is replaced.
    let spawned = match early.filter(|s| s.fits(wanted)) {
        Some(s) => s,
        None => Spawned::early(wanted)?,
    };
    Ok(Pending {
        begun: Sandbox::begin(plan, spawned)?,
        listener,
        degraded,
    })
}

/// Take the sandbox's descriptors and start serving its connect() calls.
#[cfg(target_os = "linux")]
fn finish(pending: Pending, plan: &plan::Plan) -> Result<Started> {
    use crate::linux::attribution::SandboxProcesses;
    let Pending {
        begun,
        listener,
        degraded,
    } = pending;
    let mut sandbox = begun.finish(plan)?;
    let capture = sandbox.capture.take();
    let session = sandbox.session.take();
    let publish = sandbox
        .publisher
        .take()
        .map(|f| crate::linux::publish::Published::bind(f, &plan.publish))
        .transpose()?;
    let (mut child, fd, channel) = sandbox.into_parts();
    let channel = Arc::new(channel);
    let anchor = child.id();
    Ok(Started {
        pid: anchor,
        waiter: Box::new(move || child.wait()),
        go: {
            let channel = channel.clone();
            Box::new(move || channel.go())
        },
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
        status: {
            let channel = channel.clone();
            Box::new(move || {
                if degraded {
                    None
                } else {
                    channel.wait_status()
                }
            })
        },
        messages: Box::new(move || channel.messages()),
        // The PID namespace ends with its init, taking every process along.
        finish: Box::new(|| ()),
        capture,
        session,
        publish,
    })
}

#[cfg(target_os = "macos")]
struct Pending {
    listener: Option<std::net::TcpListener>,
}

#[cfg(target_os = "macos")]
fn begin(plan: &mut plan::Plan, _: Early) -> Result<Pending> {
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
    Ok(Pending { listener })
}

/// sandbox-exec starts the command at once: only now, with airlock's side ready.
#[cfg(target_os = "macos")]
fn finish(pending: Pending, plan: &plan::Plan) -> Result<Started> {
    let listener = pending.listener;
    let port = listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.port());
    let running = crate::macos::start(plan, port)?;
    let finish = running.finisher();
    let mut child = running.child;
    Ok(Started {
        pid: child.id(),
        waiter: Box::new(move || child.wait()),
        go: Box::new(|| Ok(())),
        listener,
        identity: Arc::new(airlock_proxy::SourceAddressOnly),
        tier: "macos-seatbelt",
        teardown: libc::SIGKILL,
        messages: Box::new(Vec::new),
        status: Box::new(|| None),
        finish: Box::new(finish),
        session: None,
    })
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
struct Pending;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn begin(_: &mut plan::Plan, _: Early) -> Result<Pending> {
    bail!("airlock run is not available on this platform; it never runs a command unsandboxed")
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn finish(_: Pending, _: &plan::Plan) -> Result<Started> {
    bail!("airlock run is not available on this platform; it never runs a command unsandboxed")
}

// One call from `run`, with what it has built; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn run_platform(
    args: &RunArgs,
    policy: airlock_policy::Policy,
    mut plan: plan::Plan,
    timeout: Option<Duration>,
    started: Instant,
    workspace: &std::path::Path,
    learn: Option<crate::learn::Learn>,
    early: Early,
    session: Option<&str>,
    review: Option<crate::review::Changeset>,
) -> Result<ExitCode> {
    let run = run_id();
    // Opened before the command runs, without following links (SPEC §3.5).
    let mut report_file = args.report.as_deref().map(report::open).transpose()?;
    // A session's socket is bound first: a name in use stops it here.
    let listening = match session {
        Some(name) => {
            if cfg!(not(target_os = "linux")) || plan.allow_degraded {
                bail!("sessions need the full Linux tier (user namespaces); run each command with `airlock run` instead");
            }
            Some(crate::session::server::bind(name)?)
        }
        None => None,
    };
    let env_recipe = listening.as_ref().map(|_| session_env(&plan));
    let (audit, otlp) = crate::run_audit::open(&policy, &run)?;
    let inspect = crate::inspect_setup::for_policy(&policy)?;
    // The trust variables are set only when something is inspected.
    let bundle = match &inspect {
        Some(cfg) => Some(crate::inspect_setup::bundle(cfg, &run)?),
        None => None,
    };
    if let Some(b) = &bundle {
        plan.env.extend(b.env());
    }
    // airlock's own approval socket is never the sandbox's to reach, even
    // listed in unix_sockets: it would answer its own questions. By path
    // now (it is bound later), by inode once it is.
    let ask_socket = args
        .policy
        .ask
        .as_deref()
        .and_then(|a| a.strip_prefix("socket:"))
        .map(std::path::PathBuf::from);
    if let Some(ask) = &ask_socket {
        let own = crate::resolve::parent_resolved(ask);
        withhold_socket(&mut plan, |p| {
            own.is_some() && crate::resolve::parent_resolved(p) == own
        });
    }
    bind_own_files_under_tmp(&mut plan);
    // The sandbox is built from here on, while airlock gets its own side
    // ready; the command waits for `go`.
    let pending = begin(&mut plan, early)?;
    tracing::debug!(elapsed = ?started.elapsed(), "plan sent");
    if plan.degraded.is_none() && cfg!(target_os = "linux") {
        crate::integrity::covered_by_mounts(
            plan.deny_read
                .iter()
                .chain(&plan.deny_read_env)
                .cloned()
                .chain(plan.sanitised.iter().map(|(file, _)| file.clone()))
                .collect::<Vec<_>>(),
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Learn mode records through the audit log and answers for itself.
    let audit = match &learn {
        Some(l) => Some(l.audit(audit, &run)),
        None => audit,
    };
    let approver = match &learn {
        Some(l) => l.approver(),
        None => crate::approve::approver_in(&runtime, args.policy.ask.as_deref(), &policy)?,
    };
    tracing::debug!(elapsed = ?started.elapsed(), "runtime and approver ready");
    if let Some(own) = ask_socket.and_then(|a| std::fs::metadata(a).ok()) {
        use std::os::unix::fs::MetadataExt;
        withhold_socket(&mut plan, |p| {
            std::fs::metadata(p).is_ok_and(|m| m.dev() == own.dev() && m.ino() == own.ino())
        });
    }
    // This run's roots join those a later run's trust covers (SPEC §3.5);
    // written before the snapshot, which sees it when HOME is a root.
    crate::policy::trust::remember_roots(&plan.write)
        .context("remembering the run's writable roots")?;
    // Nested repositories' items as they are, by content and identity, so
    // that a touch that changes nothing is not taken for a write
    // (integrity/identity.rs); sound whenever taken, so it runs beside.
    let nested_before = crate::integrity::nested::record_before(plan.write.clone());
    // The protected set as it is before the sandbox can touch it.
    let snapshot = crate::integrity::snapshot::take(&plan.protected);
    let run_start = crate::integrity::nested::kernel_now();
    // Written before the sandbox starts: if airlock is killed, the next run
    // finishes this check.
    let journal = crate::integrity::journal::Journal::new(&run, run_start, &plan.write, snapshot);
    let journal_path = journal.write().context("the post-run check's journal")?;
    #[cfg(target_os = "linux")]
    let killer = Arc::new(std::sync::OnceLock::new());
    #[cfg(target_os = "linux")]
    let watch = crate::integrity::watch::start(&plan.protected, killer.clone());
    tracing::debug!(elapsed = ?started.elapsed(), paths = plan.protected.len(), "protected set recorded");
    let sandbox = match finish(pending, &plan) {
        Ok(s) => s,
        Err(e) => {
            // Nothing ran: there is nothing to check.
            crate::integrity::journal::remove(&journal_path);
            return Err(e);
        }
    };
    tracing::debug!(elapsed = ?started.elapsed(), "sandbox started");
    crate::approve::sandbox::watch(sandbox.pid);
    // A session's PID 1 serves many commands: a signal ends it at once;
    // so it does in the degraded tier, whose init sits below a watcher.
    let interrupted = on_termination(
        &runtime,
        sandbox.pid as libc::pid_t,
        sandbox.teardown,
        session.is_none() && plan.degraded.is_none(),
    )?;
    #[cfg(target_os = "linux")]
    let _ = killer.set(crate::integrity::watch::Killer::of(
        sandbox.pid as libc::pid_t,
        sandbox.teardown,
    ));
    // A moment for the record of nested repositories: what it has not
    // reached when the command changes it is judged by its ctime, as before.
    let recorded = nested_before.wait(NESTED_BEFORE_BUDGET);
    if !recorded {
        nested_before.started_late();
    }
    tracing::debug!(elapsed = ?started.elapsed(), recorded, "nested repositories recorded");
    // Everything that must see the command from its first instruction is
    // in place.
    if let Err(e) = (sandbox.go)() {
        tracing::warn!("the sandbox went before its command started: {e:#}");
    }
    if let Some(a) = &audit {
        crate::run_audit::begin(a, args, workspace, sandbox.tier);
    }
    // A proxy port on the host's loopback (the degraded tier) can be
    // reached by every local user: credentials go to this user's clients
    // only (SPEC §5.4). In the namespaced tier only the sandbox reaches it.
    // (macOS: the sandbox's own user; no socket table is read there.)
    let lend_to = if sandbox.tier == "linux-degraded" {
        // SAFETY: geteuid has no preconditions.
        airlock_proxy::LendTo::Uid(unsafe { libc::geteuid() })
    } else {
        airlock_proxy::LendTo::Sandbox
    };
    let engine = Engine::new(EngineConfig {
        policy: Arc::new(policy),
        audit,
        approver,
        identity: sandbox.identity.clone(),
        dns_server: args.policy.dns_server,
        inspect,
        lend_to,
        upstream_proxy: crate::inspect_setup::upstream_proxy(&args.policy)?,
    });
    // --review: requests that need review are kept in the changeset.
    if let Some(cs) = &review {
        let settings = crate::review::requests::Settings::of(&args.policy, &args.write);
        engine.hold_with(crate::review::requests::Keeper::new(
            &cs.dir,
            &cs.meta.id,
            &settings,
        )?);
    }
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

    #[cfg(target_os = "linux")]
    crate::linux::capture::serve(&runtime, &engine, sandbox.capture);
    #[cfg(target_os = "linux")]
    if let Some(p) = sandbox.publish {
        p.serve(&runtime);
    }

    // A session serves its commands until it is asked to end.
    // What each check of a session starts from: the protected set as the
    // last check left it, and the moment it ended. What airlock itself did
    // in a check (the quarantine) is then never taken for the sandbox's.
    // What the session's checks did along the way, for its report.
    let session_changes: std::sync::Mutex<Vec<crate::integrity::Outcome>> =
        std::sync::Mutex::new(vec![]);
    // (`None`: the journal's snapshot, from the session's start.)
    let since_last: std::sync::Mutex<(
        Option<crate::integrity::snapshot::Snapshot>,
        std::time::SystemTime,
    )> = std::sync::Mutex::new((None, run_start));
    #[cfg(target_os = "linux")]
    let helper = sandbox.pid;
    let ended = match (listening, sandbox.session, env_recipe) {
        (Some(listening), Some(to_init), Some(env)) => {
            // Where the roots change between checks: each check then
            // searches near the change, not the whole workspace.
            #[cfg(target_os = "linux")]
            let dirty = std::sync::Mutex::new(
                crate::integrity::dirty::Dirty::watch(&plan.write)
                    .map(|mut d| {
                        // The user's own repositories are looked at by
                        // identity from the start, as they are before any
                        // command: a process a command leaves running can
                        // rewrite one's config through a shared mapping,
                        // which no event reports, and a command that wrote
                        // nothing else has no check to add them after (red
                        // team round 12).
                        d.add_repos(nested_before.known_dirs());
                        // What the processes a command leaves running
                        // hold mapped: the sandbox's PID 1 is its helper's
                        // one child.
                        if let Some(init) = crate::procfs::children(helper).first() {
                            d.watch_mappings(*init);
                        }
                        d
                    })
                    .ok(),
            );
            let checks = std::sync::atomic::AtomicU64::new(0);
            // Called by the session with the sandbox held still (its PID 1
            // stops every process for it): nothing can race the check.
            let check = || {
                let mut last = since_last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let since = last.1;
                let snap = last.0.as_ref().unwrap_or(&journal.snapshot);
                #[cfg(target_os = "linux")]
                let only = dirty
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                    .and_then(|d| d.take());
                #[cfg(not(target_os = "linux"))]
                let only: Option<Vec<std::path::PathBuf>> = None;
                // Each check quarantines into a place of its own: a path
                // set aside twice in a session keeps both.
                let n = checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                let label = format!("{run}-{n}");
                let checked = crate::integrity::check_near(
                    snap,
                    &plan.write,
                    since,
                    &run,
                    &label,
                    &nested_before,
                    only.as_deref(),
                );
                // The repositories known now are looked at by identity
                // between checks too (what a shared mapping writes raises
                // no inotify event).
                #[cfg(target_os = "linux")]
                if let Some(d) = dirty
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                {
                    d.add_repos(
                        checked
                            .repos
                            .iter()
                            .cloned()
                            .chain(nested_before.known_dirs()),
                    );
                    if !checked.outcomes.is_empty() {
                        d.forget_own();
                    }
                }
                // Only a clean result moves the baseline: what could not be
                // moved aside is judged again at the next check and the end.
                // A check that changed nothing keeps the snapshot it had.
                if checked.failed.is_empty() && !checked.outcomes.iter().any(|o| o.in_place) {
                    let wrote = !checked.outcomes.is_empty();
                    if wrote {
                        last.0 = Some(crate::integrity::snapshot::take(&plan.protected));
                    }
                    last.1 = past_own_writes(wrote);
                }
                drop(last);
                if let Ok(mut all) = session_changes.lock() {
                    all.extend(checked.outcomes.iter().cloned());
                }
                (checked.outcomes, checked.failed)
            };
            #[cfg(target_os = "linux")]
            let activity = dirty
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .map(|d| d.fd());
            #[cfg(not(target_os = "linux"))]
            let activity = None;
            #[cfg(target_os = "linux")]
            let changed = || {
                dirty
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .as_mut()
                    .is_none_or(|d| d.changed())
            };
            #[cfg(not(target_os = "linux"))]
            let changed = || true;
            let setup = crate::session::server::Setup {
                review: review.as_ref().map(|c| c.meta.id.clone()),
                changed: &changed,
                activity,
                engine: &engine,
                plan: &plan,
                env,
                workspace,
                tier: sandbox.tier,
                run: &run,
                check: &check,
            };
            Some(crate::session::server::serve(
                listening,
                crate::seqpacket::Seq(to_init),
                &setup,
            )?)
        }
        _ => None,
    };
    if let Some(e) = &ended {
        // The end's findings go to whoever asked for it.
        if let Some(fd) = &e.stderr {
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto our own stderr.
            unsafe { libc::dup2(fd.as_raw_fd(), 2) };
        }
        if let Some(fd) = &e.report {
            report_file = Some(report::from_fd(fd.try_clone()?));
        }
    }
    let status = wait(
        sandbox.pid,
        sandbox.waiter,
        timeout,
        sandbox.teardown,
        &*sandbox.status,
    );
    tracing::debug!(elapsed = ?started.elapsed(), "sandbox helper reaped");
    (sandbox.finish)();
    let mut status = status?;
    tracing::debug!(elapsed = ?started.elapsed(), "sandbox exited");
    // Taken now, before the proxy's connections are let go.
    let asking = engine.asking();
    let (signal, sandbox_ns) = interrupted.take();
    if signal != 0 {
        // Killed on our behalf: wait for every process of it to be gone,
        // then check as after any run.
        if let Some(ns) = sandbox_ns {
            wait_namespace_empty(&ns, Duration::from_secs(5));
        }
        eprintln!("airlock: stopped by signal {signal}; the sandbox was killed");
        status = Some(128 + signal);
    }
    #[cfg(target_os = "linux")]
    if let Some(w) = watch {
        w.finish();
        tracing::debug!(elapsed = ?started.elapsed(), "watch stopped");
    }
    // Every process of the sandbox is gone: nothing can race the check.
    let last = since_last
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let checked = match session {
        Some(_) => crate::integrity::check_near(
            last.0.as_ref().unwrap_or(&journal.snapshot),
            &plan.write,
            last.1,
            &run,
            &format!("{run}-end"),
            &nested_before,
            None,
        ),
        None => crate::integrity::check(
            &journal.snapshot,
            &plan.write,
            run_start,
            &run,
            &nested_before,
        ),
    };
    crate::integrity::journal::remove(&journal_path);
    let (mut protected_changes, failed) = (checked.outcomes, checked.failed);
    for line in crate::integrity::quarantine::lines(&protected_changes) {
        eprintln!("{line}");
    }
    for o in &protected_changes {
        if let Some(log) = engine.audit() {
            log.protected(&o.path, o.change, &o.action, o.dest.as_deref());
        }
    }
    tracing::debug!(elapsed = ?started.elapsed(), "protected set checked");
    let check_failed = !failed.is_empty() || protected_changes.iter().any(|o| o.in_place);
    // A session's report holds what its commands' checks did too.
    let mut earlier = session_changes
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    earlier.append(&mut protected_changes);
    protected_changes = earlier;
    if protected_changes.iter().any(|o| o.in_place) {
        eprintln!("airlock: error: a protected path the sandbox changed could not be moved aside and is still in place");
    }
    for f in failed {
        eprintln!("airlock: error: {f}; inspect them before running git there");
    }
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
    if check_failed {
        // Fail closed: the caller must not take this run as clean.
        code = 125;
    }
    for m in (sandbox.messages)() {
        if let Some(p) = m.strip_prefix("phase: ") {
            sandbox_phase(p, monotonic_ns() - started.elapsed().as_nanos() as i128);
            continue;
        }
        // The sandbox wrote these: shown with control characters escaped.
        let m = airlock_proxy::escape::line(&m, 1000);
        if let Some(e) = m.strip_prefix("error: ") {
            eprintln!("airlock: sandbox setup failed: {e}");
            code = 125;
        } else if let Some(e) = m.strip_prefix("exec-error: ") {
            eprintln!("airlock: {e}");
        } else if let Some(_e) = m.strip_prefix("deny-read-appeared: ") {
            #[cfg(target_os = "linux")]
            {
                let (why, path) = _e.split_once(' ').unwrap_or(("", _e));
                let how = crate::linux::denywatch::describe(why);
                eprintln!("airlock: {path} (deny_read) appeared during the run as {how}; the sandbox was stopped so that it cannot read it");
            }
            code = 125;
        }
    }
    // The sandbox is gone, and with it every client: what the proxy still
    // serves ends at once and records what it saw.
    let idle = engine.wait_idle(Duration::from_millis(250));
    // Every process of the sandbox is gone, and every request it held is
    // kept: what it changed is held.
    let held = review.and_then(|cs| crate::review::finish(cs, code == 125));
    tracing::debug!(elapsed = ?started.elapsed(), "changeset scanned");
    engine.close_approver();
    if idle {
        // Only listeners are left, which the exit closes: their threads
        // are not joined (a third of a millisecond of every run).
        runtime.shutdown_background();
    } else {
        runtime.shutdown_timeout(Duration::from_millis(100));
    }
    tracing::debug!(elapsed = ?started.elapsed(), "runtime shut down");
    if let Some(b) = &bundle {
        b.remove();
    }
    let mut summary = report::Summary::new(
        engine.blocked(),
        engine.blocked_beyond(),
        engine.upstream_failures(),
        engine.upstream_beyond(),
    );
    summary.approvals = engine.approvals();
    // A question still open when the command ended (it gave up waiting):
    // said, so that the model knows to ask again once it is answered.
    let (asking, why) = asking;
    if !asking.is_empty() {
        summary.waiting_for_approval = asking.iter().map(ToString::to_string).collect();
        // The socket goes with the run: the approver is to be started
        // before the next one (harness round 13).
        let why = why
            .map(|w| w.replace("` answers", "` started before the run answers"))
            .unwrap_or_else(|| "the approver had not answered".into());
        let allow: Vec<String> = asking
            .iter()
            .map(|t| format!("--allow {}", t.host))
            .collect();
        eprintln!(
            "airlock: the command ended while a question about {} was still open ({why}): run it again with an approver, or with {} to let it through without asking",
            summary.waiting_for_approval.join(", "),
            allow.join(" ")
        );
    }
    #[cfg(target_os = "linux")]
    {
        // The sandbox is gone: its reads of hidden files are all in.
        crate::linux::readwatch::finish();
        (summary.filesystem, summary.filesystem_beyond) = crate::linux::fsrefusals::refusals();
    }
    summary.withheld_env = std::mem::take(&mut plan.withheld_env);
    summary.withheld_once = Some(workspace.to_path_buf());
    summary.inherit_none = engine.policy().env_inherit.value == airlock_policy::EnvInherit::None;
    summary.hidden_dirs = plan.hidden_dirs();
    summary.hidden_once = Some(workspace.to_path_buf());
    if code != 0 {
        summary.hidden_named = plan.hidden_named(&plan.argv, &plan.cwd);
    }
    summary.review = held;
    if let Some(block) = summary.stderr_block(code != 0) {
        eprintln!("{block}");
    }
    let duration_ms = started.elapsed().as_millis() as u64;
    engine.audit_end(code, duration_ms);
    if let Some(o) = &otlp {
        o.close(Duration::from_secs(2));
    }
    if let Some(l) = &learn {
        if let Err(e) = l.finish() {
            eprintln!("airlock: error: the learned policy was not written: {e:#}");
            code = 125;
        }
    }
    if let Some(file) = report_file {
        report::write(
            file,
            &summary.report(Head {
                exit_code: code,
                tier: sandbox.tier,
                residual_risk: (sandbox.tier == "linux-degraded")
                    .then_some(crate::doctor::DEGRADED_RESIDUAL_RISK),
                duration_ms,
                protected_paths: ProtectedPaths {
                    deny_read: &plan.deny_read,
                    deny_write: &plan.deny_write,
                },
                run: &run,
                protected_changes: &protected_changes,
            }),
        )?;
    }
    tracing::debug!(elapsed = ?started.elapsed(), "run finished");
    if let Some(reply) = ended.and_then(|e| e.reply) {
        let _ = reply.send_json(&serde_json::json!({"type": "ended", "code": code}), &[]);
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// How a session's commands get their environment: the caller's,
/// filtered as the sandbox's was, plus what airlock set in the plan.
fn session_env(plan: &plan::Plan) -> crate::session::server::EnvRecipe {
    let rule = plan.env_rule.clone();
    let from_host = rule
        .as_ref()
        .map(|r| r.apply(std::env::vars()).env)
        .unwrap_or_default();
    let overlay = plan
        .env
        .iter()
        .filter(|(k, v)| k.as_str() != "PWD" && from_host.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    crate::session::server::EnvRecipe {
        rule,
        overlay,
        last: Default::default(),
    }
}

/// Files airlock made for the sandbox and points it at (the trust bundle,
/// the presets' credential-free configuration copies) that lie under the
/// host's /tmp, as they do when HOME is there: the sandbox's /tmp is its
/// own, so they are bound back, read-only, or the variables name nothing
/// (`SSL_CERT_FILE`, `NPM_CONFIG_USERCONFIG`, …).
fn bind_own_files_under_tmp(plan: &mut plan::Plan) {
    // What airlock set, not what the caller's environment brought.
    let own: Vec<String> = plan
        .env
        .iter()
        .filter(|(k, v)| std::env::var(k).ok().as_ref() != Some(*v))
        .map(|(_, v)| v.clone())
        .collect();
    let hidden = crate::paths::Prefixes::new(&plan.deny_read);
    for value in &own {
        let p = std::path::Path::new(value);
        if !p.is_absolute() || !p.starts_with("/tmp") || p == std::path::Path::new("/tmp") {
            continue;
        }
        let p = crate::paths::lexical(p);
        let covered = |list: &[std::path::PathBuf]| list.iter().any(|b| p.starts_with(b));
        if covered(&plan.tmp_binds)
            || covered(&plan.tmp_read_binds)
            || hidden.covers(&p)
            || std::fs::symlink_metadata(&p).is_err()
        {
            continue;
        }
        plan.tmp_read_binds.push(p);
    }
    plan.tmp_read_binds.sort();
    plan.tmp_read_binds.dedup();
}

/// The start of a session's next window. The kernel stamps files with a
/// coarse clock: what the check itself wrote (a sanitised configuration)
/// may carry the very tick the window would start on, and be taken for
/// the sandbox's. When it wrote anything, the window starts on the next
/// tick (the sandbox is still held still meanwhile).
fn past_own_writes(wrote: bool) -> std::time::SystemTime {
    let now = crate::integrity::nested::kernel_now();
    if !wrote {
        return now;
    }
    let deadline = Instant::now() + Duration::from_millis(50);
    loop {
        let later = crate::integrity::nested::kernel_now();
        if later > now || Instant::now() > deadline {
            return later;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// The sandbox's exit code, or `None` when the timeout killed it.
fn wait(
    pid: u32,
    waiter: Waiter,
    timeout: Option<Duration>,
    teardown: libc::c_int,
    early_status: &dyn Fn() -> Option<i32>,
) -> Result<Option<i32>> {
    use std::os::unix::process::ExitStatusExt;
    let code = |status: std::process::ExitStatus| {
        status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
    };
    let Some(timeout) = timeout else {
        // The common case: no timer, so no waiter thread either. The helper
        // is left to finish tearing the namespaces down (and is reaped by
        // whoever inherits it when we exit).
        if let Some(code) = early_status() {
            drop(waiter);
            return Ok(Some(code));
        }
        return Ok(Some(code(waiter().context("waiting for the sandbox")?)));
    };
    let pid = pid as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(waiter());
    });
    let status = match rx.recv_timeout(timeout) {
        Ok(s) => s,
        Err(_) => {
            let sandbox_ns = pid_namespace_of(pid);
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
            // The init dies of its parent-death signal, the rest with it:
            // wait for that, so the post-run check runs on a still tree.
            if let Some(ns) = sandbox_ns {
                wait_namespace_empty(&ns, Duration::from_secs(5));
            }
            return Ok(None);
        }
    }
    .context("waiting for the sandbox")?;
    Ok(Some(code(status)))
}

/// Drop from `unix_sockets` what `is_own` says is airlock's approval socket.
fn withhold_socket(plan: &mut plan::Plan, is_own: impl Fn(&std::path::Path) -> bool) {
    plan.unix_sockets.retain(|p| {
        let own = is_own(p);
        if own {
            eprintln!(
                "airlock: warning: unix_sockets lists airlock's own approval socket ({}); it stays out of the sandbox",
                crate::text::shown(p)
            );
        }
        !own
    });
}

/// What a termination signal to airlock did: which signal, and the
/// sandbox's PID namespace as it was just before it was killed.
struct Interrupted(Arc<std::sync::Mutex<(i32, Option<std::path::PathBuf>)>>);

impl Interrupted {
    fn take(&self) -> (i32, Option<std::path::PathBuf>) {
        self.0.lock().map(|g| g.clone()).unwrap_or((0, None))
    }
}

/// SIGTERM, SIGHUP and SIGINT to airlock end the sandbox, not airlock: the
/// post-run check must still run (a hostile command that plants and then
/// waits for the user's ^C or the harness's timeout gains nothing). The
/// handlers are registered before this returns, so no signal slips past.
fn on_termination(
    runtime: &tokio::runtime::Runtime,
    helper: libc::pid_t,
    teardown: libc::c_int,
    pass_on: bool,
) -> Result<Interrupted> {
    use tokio::signal::unix::{signal, SignalKind};
    let _guard = runtime.enter();
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut hup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
    let mut int = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let state = Arc::new(std::sync::Mutex::new((0, None)));
    let shared = state.clone();
    #[cfg(target_os = "linux")]
    let killer = crate::integrity::watch::Killer::of(helper, teardown);
    runtime.spawn(async move {
        let sig = tokio::select! {
            _ = term.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
            _ = int.recv() => libc::SIGINT,
        };
        // The command gets the signal first (through PID 1, which passes
        // SIGINT, SIGTERM and SIGHUP to it: SPEC §4.1) and a moment to end
        // as it would outside (a dev server closing, git cleaning up); a
        // second signal, or the moment passing, kills the sandbox.
        #[cfg(target_os = "linux")]
        if let Some(command) = child_of(helper).and_then(child_of).filter(|_| pass_on) {
            // To the command's process group (its own, as a shell's job):
            // what a terminal's ^C reaches. PID 1 is left without handlers,
            // so that nothing inside can signal it. A command in airlock's
            // own group (its output on a terminal) got what the group got.
            // SAFETY: getpgid and kill(2) on the sandbox's processes, as
            // their ancestor.
            unsafe {
                let group = libc::getpgid(command);
                if group > 0 && group != libc::getpgid(0) {
                    libc::kill(-group, sig);
                }
            }
            eprintln!("airlock: stopped by signal {sig}: passed on to the command, which has {GRACE:?} to end (a second signal kills the sandbox now)");
            let again = tokio::time::timeout(GRACE, async {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = hup.recv() => {}
                    _ = int.recv() => {}
                }
            })
            .await;
            eprintln!(
                "airlock: {}",
                match again {
                    Ok(()) => "a second signal".to_string(),
                    Err(_) => format!("the command did not end within {GRACE:?} of signal {sig}"),
                }
            );
        }
        let ns = pid_namespace_of(helper);
        if let Ok(mut g) = shared.lock() {
            *g = (sig, ns);
        }
        #[cfg(target_os = "linux")]
        killer.kill();
        #[cfg(not(target_os = "linux"))]
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(helper, teardown)
        };
    });
    Ok(Interrupted(state))
}

/// The PID namespace a process's children live in (the sandbox's, once the
/// helper has unshared).
/// How long a command has to end after the signal airlock passed on.
#[cfg(target_os = "linux")]
const GRACE: Duration = Duration::from_secs(5);

/// The first child of `pid` (the helper's: the sandbox's PID 1; PID 1's:
/// the command, started before anything else), as the host sees it.
#[cfg(target_os = "linux")]
fn child_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

fn pid_namespace_of(pid: libc::pid_t) -> Option<std::path::PathBuf> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid_for_children")).ok()?;
    let ours = std::fs::read_link("/proc/self/ns/pid").ok()?;
    (ns != ours).then_some(ns)
}

/// Wait until no process lives in the PID namespace `ns`.
fn wait_namespace_empty(ns: &std::path::Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        // A zombie is dead: the sandbox's PID 1, reparented to us, stays
        // one until we reap it, and the loop waited out its limit.
        let alive = crate::procfs::pids().into_iter().any(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|l| l == ns)
                && !matches!(
                    crate::procfs::state_and_parent(pid),
                    Some(('Z' | 'X', _)) | None
                )
        });
        if !alive {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    tracing::warn!("the sandbox's processes outlived its init by {limit:?}");
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
