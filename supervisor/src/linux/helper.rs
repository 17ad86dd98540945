//! The sandbox helper: a fresh, single-threaded exec of the airlock binary
//! (never a fork of the multi-threaded supervisor). It builds the sandbox
//! in the order of SPEC §4.1, in one readable sequence, then waits for PID 1.

use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use anyhow::{Context, Result};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, getgid, getuid, ForkResult, Pid};

use super::channel::{
    close_inherited, close_on_exec, debug, phase, phase_now, send_line, send_phases, DEBUG,
    LOG_FROM_PLAN, PHASES,
};
use super::denywatch::DenyWatch;
use super::{caps, capture, init, landlock, limits, mounts, netns, seccomp, sockets};

use super::Ahead;
use crate::plan::{Net, Plan, SANDBOX_PROXY_PORT};

/// Set by the supervisor at `-vv`: the helper logs its steps to stderr
/// (the command's, which the command's environment never sees: init
/// exec's it with the plan's).
pub const DEBUG_ENV: &str = "AIRLOCK_HELPER_DEBUG";

/// Entry point of the helper (`airlock __sandbox-helper <fd> <pid>
/// <ahead>`, or a fork of `run`); never returns.
pub fn main(fd: RawFd, supervisor: libc::pid_t, ahead: Ahead) -> ! {
    if std::env::var_os(DEBUG_ENV).is_some() {
        DEBUG.store(true, std::sync::atomic::Ordering::Relaxed);
        // No thread of its own: the helper stays single-threaded. A fork
        // of `run` keeps the supervisor's subscriber (and has no DEBUG_ENV).
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    } else if !tracing::dispatcher::has_been_set() {
        LOG_FROM_PLAN.store(true, std::sync::atomic::Ordering::Relaxed);
    } else if tracing::enabled!(tracing::Level::DEBUG) {
        DEBUG.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    caps::name(c"airlock-helper");
    // A harness that signals airlock's process group reaches the helper
    // too: blocked here, the supervisor alone decides (it passes the
    // signal on to the command, and kills the sandbox only if the command
    // does not end: run_cmd.rs `on_termination`). PID 1 and the command
    // get their own masks.
    let mut held = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
        nix::sys::signal::Signal::SIGQUIT,
    ] {
        held.add(s);
    }
    let _ =
        nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&held), None);
    // SAFETY: the supervisor passed us this end of its socketpair.
    let mut channel = unsafe { UnixStream::from_raw_fd(fd) };
    // Only stdin, stdout and stderr cross into the sandbox (SPEC §4.6):
    // whatever else the caller had open (a key, a socket in the host's
    // network namespace) goes now, before init exists to hold it (the
    // command could read init's descriptors through /proc/1/fd).
    close_inherited(fd);
    let code = match build_and_run(&mut channel, supervisor, ahead) {
        Ok(code) => code,
        Err(e) => {
            send_line(&mut channel, "error", &format!("{e:#}"));
            125
        }
    };
    std::process::exit(code)
}

fn read_plan(channel: &mut UnixStream) -> Result<Plan> {
    let mut len = [0u8; 4];
    channel
        .read_exact(&mut len)
        .context("reading the sandbox plan")?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    channel
        .read_exact(&mut buf)
        .context("reading the sandbox plan")?;
    serde_json::from_slice(&buf).context("decoding the sandbox plan")
}

fn write_id_maps(uid: u32, gid: u32) -> Result<()> {
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .with_context(|| format!("writing /proc/self/{file}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// The two mount namespaces of the sandbox: ours, which stays a copy of
/// the host's (the deny_read watch and the Landlock rules look at host
/// paths in it), and PID 1's, where it mounts. We keep a handle on PID 1's:
/// it then outlives PID 1 (whose exit would otherwise unmount it all, on
/// the way to the exit status) until our own teardown.
struct Views {
    host: std::fs::File,
    sandbox: std::fs::File,
}

/// Step 1: a new user (our ids mapped), mount, PID and IPC namespace, and
/// a network namespace with loopback up unless the plan keeps the host's;
/// then PID 1's mount namespace, a copy of ours made while we are in it.
fn namespaces(net: bool, uid: u32, gid: u32) -> Result<Views> {
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC;
    if net {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).map_err(super::explain_unshare)?;
    write_id_maps(uid, gid)?;
    if net {
        netns::loopback_up()?;
    }
    let host = std::fs::File::open("/proc/self/ns/mnt").context("our mount namespace")?;
    unshare(CloneFlags::CLONE_NEWNS).context("creating the sandbox's mount namespace")?;
    let sandbox =
        std::fs::File::open("/proc/self/ns/mnt").context("the sandbox's mount namespace")?;
    nix::sched::setns(&host, CloneFlags::CLONE_NEWNS).context("returning to the host's view")?;
    phase("namespaces");
    Ok(Views { host, sandbox })
}

fn build_and_run(channel: &mut UnixStream, supervisor: libc::pid_t, ahead: Ahead) -> Result<i32> {
    // While the supervisor still builds the plan: what does not depend on
    // it (the helper is started before the policy is read).
    // Before the network namespace hides them: the host's unix sockets.
    sockets::snapshot()?;
    // Read before the user namespace exists (unmapped until its maps are
    // written).
    let (uid, gid) = (getuid().as_raw(), getgid().as_raw());
    // The namespaces too, when the supervisor knows the plan will want
    // them (the costliest step: the network namespace's devices and
    // sysctls). Only paths are looked up in them before PID 1's mounts,
    // as in the host: the mount namespace is a copy until then.
    let early = match ahead {
        Ahead::Namespaces { net } => Some(namespaces(net, uid, gid)),
        Ahead::Nothing => None,
    };
    // Made by the supervisor outside the cgroups (denywatch::Instances).
    let notify = super::denywatch::Instances::recv(channel)?;
    let plan = read_plan(channel)?;
    if LOG_FROM_PLAN.swap(false, std::sync::atomic::Ordering::Relaxed) {
        crate::logging::init_tracing_with(if plan.log.is_empty() {
            "warn"
        } else {
            &plan.log
        });
        let on = tracing::enabled!(tracing::Level::DEBUG);
        DEBUG.store(on, std::sync::atomic::Ordering::Relaxed);
        if !on {
            if let Ok(mut p) = PHASES.lock() {
                p.clear();
            }
        }
    }
    phase("plan read");
    if let Some(proxy_port) = plan.degraded {
        if early.is_some() {
            anyhow::bail!("internal error: namespaces were created for a degraded-tier plan");
        }
        return super::degraded::run(&plan, channel, proxy_port, notify);
    }
    caps::die_with_parent(supervisor)?;

    // 1. Namespaces, unless made ahead of the plan.
    let views = match early {
        None => namespaces(plan.net != Net::Host, uid, gid)?,
        Some(made) => made?,
    };
    // Where PID 1 cannot cap its namespace's pids (before Linux 6.14):
    // RLIMIT_NPROC, counted in the new user namespace from here on.
    if !plan.limits.pids_by_pid_max {
        limits::set_nproc(&plan.limits)?;
    }

    // 2. Network: the proxy listener goes to the supervisor, and so do
    //    transparent capture's sockets (SPEC §5.5), before PID 1 exists to
    //    send its own on the same channel. PID 1 adds capture's route and
    //    rules (the slow part) while we add Landlock's.
    let mut captured = None;
    if plan.net == Net::Proxy {
        let listener = netns::bind_proxy_listener(SANDBOX_PROXY_PORT)?;
        netns::send_fd(channel, listener.as_fd())?;
        let bound = capture::bind();
        capture::send(channel, &bound)?;
        captured = bound.ok();
    }
    if plan.net != Net::Host && !plan.publish.is_empty() {
        let factory = super::publish::factory()?;
        netns::send_fd(channel, factory.as_fd())?;
    }
    phase("network");

    // Nothing starts before the supervisor has put us in the cgroups.
    limits::wait_until_placed(channel)?;
    phase("cgroups placed");

    // Steps 3 to 5 are shared with PID 1: it mounts, in a mount namespace
    // of its own, while we look at the host's paths in ours (still a copy
    // of the host's): the deny_read watch, then the Landlock rules for
    // them, in a ruleset made now that PID 1 will restrict itself with.
    // `ready` carries the rules left to PID 1, once ours are in.
    let mut ruleset = landlock::create(plan.allow_degraded)?;
    let Views {
        host: host_view,
        sandbox: sandbox_view,
    } = views;
    // PID 1 starts in its own; we return to ours after the fork.
    nix::sched::setns(&sandbox_view, CloneFlags::CLONE_NEWNS)
        .context("entering the sandbox's mount namespace")?;
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    // On which PID 1 says when its ruleset is in force (denywatch.rs), and
    // we answer once the watch has seen everything up to then.
    let (armed_r, armed_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    let (clear_r, clear_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
    // On which PID 1 gives the command's exit code once nothing else of the
    // sandbox is left (its end at its exit, if it never could).
    let (done_r, done_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;

    // SAFETY: the helper is single-threaded.
    match unsafe { fork() }.context("starting the sandbox's init")? {
        ForkResult::Child => {
            drop((ready_w, armed_r, clear_w, done_r, notify));
            drop((host_view, sandbox_view));
            let code = match pid1(
                &plan,
                channel,
                captured,
                ruleset,
                ready_r,
                (armed_w, clear_r, done_w),
            ) {
                Ok(code) => code,
                Err(e) => {
                    send_line(channel, "error", &format!("{e:#}"));
                    125
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            drop((ready_r, armed_w, clear_r, done_w, captured));
            nix::sched::setns(&host_view, CloneFlags::CLONE_NEWNS)
                .context("returning to the host's view")?;
            drop(host_view);
            // PID 1 has the command's stdin, stdout and stderr; we let go
            // of ours, so that a caller reading airlock's output sees its
            // end without waiting for us to tear the namespaces down.
            release_stdio(false);
            // The names a deny_read path could be moved, linked or made a
            // link to during the run (denywatch.rs), watched before any
            // rule binds an inode.
            super::denywatch::raise_nofile();
            let started = std::time::Instant::now();
            // The hidden files PID 1 covers with a mount (mounts.rs).
            // And the links that lead to them by their own names (a
            // `.env -> envs/dev.vars` the host re-points during the run
            // would show the new target uncovered: red team round 11).
            let mut covered = plan.covered(|m| m.is_file() || m.is_dir());
            // A project's configuration covered by a copy without its
            // credential: replaced on the host (an editor's atomic save),
            // its mount goes with the old inode (red team round 17).
            covered.extend(plan.sanitised.iter().map(|(file, _)| file.clone()));
            covered.extend(
                plan.deny_read_env
                    .iter()
                    .chain(&plan.deny_read_names)
                    // Only inside the writable roots (a string test first:
                    // the built-in list is long).
                    .filter(|p| plan.write.iter().any(|w| p.starts_with(w)))
                    .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_symlink()))
                    .cloned(),
            );
            let deny = DenyWatch::new(
                notify,
                &plan.deny_read_names,
                &plan.deny_read,
                &plan.write,
                &covered,
            )?;
            tracing::debug!(took = ?started.elapsed(), "deny_read names watched");
            // Resolved before the watch existed: looked up again below.
            crate::resolve::forget();
            let later = match ruleset.as_mut() {
                Some(r) => r.add_host_rules(
                    &plan.read,
                    &plan.write,
                    &plan.deny_read,
                    &plan.deny_read_names,
                    // A root held for review is an overlay in PID 1's
                    // view: its inodes are not the host's, so its rules
                    // are PID 1's to add, on the layer. A write rule on
                    // the host's inode would also let writes through to
                    // the host by any other path to it (a bind mount).
                    &mounts::FRESH
                        .iter()
                        .map(std::path::PathBuf::from)
                        .chain(plan.review.iter().map(|l| l.root.clone()))
                        .collect::<Vec<_>>(),
                    &plan
                        .deny_read_masks
                        .iter()
                        .map(|(_, cover)| cover.clone())
                        .chain(plan.sanitised.iter().map(|(_, copy)| copy.clone()))
                        .collect::<Vec<_>>(),
                )?,
                None => landlock::Later::default(),
            };
            drop(ruleset);
            let body = serde_json::to_vec(&later).context("encoding the Landlock rules")?;
            std::fs::File::from(ready_w)
                .write_all(&body)
                .context("handing PID 1 its Landlock rules")?;
            // The watch is closed only after the status line: closing an
            // inotify instance waits for an SRCU grace period (15-20 ms),
            // which the supervisor no longer waits for.
            let mut deny = deny;
            let (status, appeared) = match deny.as_mut() {
                Some(deny) => wait_watching(child, deny, armed_r, clear_w, &done_r, channel),
                None => {
                    // Nothing watched: nothing to wait for.
                    let _ = nix::unistd::write(&clear_w, b"1");
                    (wait_done(child, &done_r), false)
                }
            };
            phase_now(channel, "init reported");
            // Nothing of the sandbox is left but PID 1 on its way out: the
            // supervisor may go on while it exits and we tear the
            // namespaces down.
            let code = match status {
                _ if appeared => 125,
                Ok(code) => code,
                Err(e) => return Err(e).context("waiting for the sandbox's init"),
            };
            let _ = channel.write_all(format!("status: {code}\n").as_bytes());
            // What is left is our teardown (the namespaces, the watch):
            // on idle CPU time only, so that it does not hold up the
            // supervisor's own end on a machine with few cores.
            let idle = libc::sched_param { sched_priority: 0 };
            // SAFETY: lowering our own scheduling class; the struct is valid.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
            drop(sandbox_view);
            // Nothing more to log: stderr goes too, so that even at `-vv` a
            // caller reading it is not held up by our teardown.
            release_stdio(true);
            Ok(code)
        }
    }
}

/// PID 1's exit code (EINTR retried; only exits and deaths are reported).
fn wait_init(child: Pid) -> nix::Result<i32> {
    loop {
        match waitpid(child, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) => return Ok(125),
        }
    }
}

/// What `done` says: the code PID 1 sent once the sandbox was empty, or,
/// when its end closed without one (PID 1 died or failed), its exit.
/// `Ok(None)` while neither has happened (a non-blocking `done`).
fn read_done(child: Pid, done: &OwnedFd) -> Option<nix::Result<i32>> {
    let mut code = [0u8; 4];
    loop {
        return match nix::unistd::read(done, &mut code) {
            Ok(4) => Some(Ok(i32::from_le_bytes(code))),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => None,
            // EOF, a short write, an error: PID 1's own exit says.
            _ => Some(wait_init(child)),
        };
    }
}

/// Block until PID 1 reports (see `read_done`).
fn wait_done(child: Pid, done: &OwnedFd) -> nix::Result<i32> {
    loop {
        if let Some(r) = read_done(child, done) {
            return r;
        }
    }
}

/// Wait for PID 1 while watching the `deny_read` names: when one appears
/// as something the sandbox could read through, PID 1 is killed (and with
/// it the PID namespace) and the supervisor told why. True when it was.
fn wait_watching(
    child: Pid,
    deny: &mut DenyWatch,
    armed: OwnedFd,
    clear: OwnedFd,
    done: &OwnedFd,
    channel: &mut UnixStream,
) -> (nix::Result<i32>, bool) {
    let mut armed = Some(armed);
    let mut clear = Some(clear);
    if let Err(e) = nix::fcntl::fcntl(
        done.as_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    ) {
        return (Err(e), false);
    }
    loop {
        let mut step = deny.wait(&mut armed, Some(done.as_fd()), nix::poll::PollTimeout::NONE);
        // PID 1's ruleset is in force: what the host did until then is in
        // the queue now. Read it all before the command may start (PID 1
        // waits for this byte), so that its first instruction cannot win
        // the race against a rename made during start-up.
        if armed.is_none() && matches!(step, Ok(None)) {
            if let Some(c) = clear.take() {
                step = Ok(deny.check());
                if matches!(step, Ok(None)) {
                    let _ = nix::unistd::write(&c, b"1");
                }
            }
        }
        // The sandbox is empty (or PID 1 gone): what the host did until
        // then is read before the verdict.
        let ended = match step {
            Ok(None) => read_done(child, done),
            _ => None,
        };
        if ended.is_some() {
            step = Ok(deny.check());
        }
        match step {
            Err(e) => return (Err(e), false),
            Ok(Some(a)) => {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = channel.write_all(a.line().as_bytes());
                return (wait_init(child), true);
            }
            Ok(None) => {}
        }
        if let Some(r) = ended {
            return (r, false);
        }
    }
}

/// Point stdin, stdout and stderr at /dev/null (stderr stays with `-vv`,
/// which logs from here, until `all`).
fn release_stdio(all: bool) {
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        return;
    };
    let debug = !all && debug();
    for fd in [0, 1, 2] {
        if fd == 2 && debug {
            continue;
        }
        // SAFETY: dup2 onto our own standard descriptors.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) };
    }
}

/// Steps 3 to 7, as PID 1 of the new PID namespace.
fn pid1(
    plan: &Plan,
    channel: &mut UnixStream,
    captured: Option<capture::Capture>,
    ruleset: Option<landlock::Shared>,
    ready: OwnedFd,
    (armed, clear, done): (OwnedFd, OwnedFd, OwnedFd),
) -> Result<i32> {
    // Our parent (the helper) lives outside this PID namespace: it is pid 0 here.
    caps::die_with_parent(0)?;
    caps::name(c"airlock-init");
    // No signal from inside may reach us (see the function).
    init::default_signal_handlers()?;
    // The command runs in our Landlock domain and could otherwise read our
    // memory and environment through /proc/1 (a fork of the supervisor
    // holds the caller's whole environment).
    caps::not_dumpable()?;
    // The supervisor tells the sandbox's processes by this namespace; it
    // gets it from us rather than from /proc/<helper>, which is gone once
    // a quick command has finished.
    let pid_ns = std::fs::File::open("/proc/self/ns/pid").context("opening our PID namespace")?;
    // 3. Mounts, in a mount namespace of our own: the helper's stays the
    //    host's view, for its deny_read watch and Landlock rules.
    phase("init started");
    mounts::setup(plan)?;
    if plan.limits.pids_by_pid_max {
        limits::set_pid_max(&plan.limits)?;
    }
    phase("mounts");
    // Capture's route and nf_tables rules, in place before the command can
    // connect; without them nothing leaves but through the proxy either
    // (no route), so a failure only loses the capture.
    if let Some(c) = captured {
        if let Err(e) = capture::install(&c) {
            tracing::info!("transparent capture is off, only the explicit proxy works: {e:#}");
        }
        phase("capture");
    }
    // 4. Lock down.
    caps::drop_all()?;
    caps::no_new_privs()?;
    // Compiled while the helper still adds the Landlock rules we wait for.
    let filters = seccomp::compile(false)?;
    // 5. Landlock: the helper's rules, then ours.
    let mut body = vec![];
    std::fs::File::from(ready)
        .read_to_end(&mut body)
        .context("waiting for the helper's Landlock rules")?;
    let later: landlock::Later =
        serde_json::from_slice(&body).context("the helper did not prepare the Landlock rules")?;
    if let Some(r) = ruleset {
        r.restrict(&later)?;
    }
    // The helper's deny_read watch: inodes born from now on carry no rule.
    let armed = super::denywatch::arm(armed);
    phase("capabilities dropped, landlock");
    // 6. seccomp.
    // Made before seccomp, which refuses sock_diag sockets.
    let diag = super::unixconnect::diag_socket()?;
    filters.install()?;
    phase("seccomp");
    // From here every connect() waits for the supervisor's decision.
    let listener = super::unixconnect::install(!plan.no_write_notes)?;
    netns::send_fd(channel, listener.as_fd())
        .and_then(|_| netns::send_fd(channel, diag.as_fd()))
        .and_then(|_| netns::send_fd(channel, pid_ns.as_fd()))
        .context("passing the connect() listener to the supervisor")?;
    drop((listener, diag, pid_ns));
    // A session's commands come on a socket of their own (SPEC §4.7).
    let session = match plan.session {
        true => {
            let (ours, theirs) = crate::seqpacket::Seq::pair().context("the session's socket")?;
            netns::send_fd(channel, theirs.0.as_fd())
                .context("passing the session's socket to the supervisor")?;
            Some(ours)
        }
        false => None,
    };
    phase("connect() listener passed");
    send_phases(channel);
    // 7. Init: the command must not inherit the channel.
    close_on_exec(channel)?;
    if super::denywatch::settle_needed(plan) {
        super::denywatch::settle(armed);
        phase_now(channel, "clock settled");
    }
    // The helper has read every host rename up to our ruleset.
    let mut byte = [0u8; 1];
    if !matches!(nix::unistd::read(&clear, &mut byte), Ok(1) if byte == *b"1") {
        anyhow::bail!("the deny_read watch did not confirm the start");
    }
    drop(clear);
    phase_now(channel, "watch confirmed the start");
    match session {
        Some(session) => init::serve_session(channel, session, Some(done)),
        None => init::run(plan, channel, init::Reap::Namespace, Some(done)),
    }
}
