//! The degraded tier (SPEC §4.4), used only with `--allow-degraded` when
//! user namespaces are unavailable: no namespaces and no mounts, so
//! Landlock carries the whole boundary (denied paths carved out, TCP
//! connect to the proxy's host loopback port only), seccomp refuses UDP,
//! raw sockets, new unix sockets (and every socketpair but unix stream and
//! seqpacket ones: a datagram one could send to any path), every other
//! TCP-carrying protocol, TCP Fast
//! Open (a connect Landlock never sees) and listen() (an unbound socket's
//! listen picks a port past Landlock's bind rule), and a subreaper kills
//! leftovers.
//!
//! Without mounts nothing can be replaced, only withheld: the host's /tmp,
//! /dev/shm and /dev/pts are carved out of every rule; TMPDIR points at a
//! private directory made for this run; of /dev only the harmless devices,
//! /dev/ptmx and the terminal the command was given stay reachable.
//! Consequences: a program that writes to /tmp by name, or uses POSIX
//! shared memory or semaphores, or opens a new pty's slave, fails here.
//! `[limits] tmp` caps TMPDIR only where a tmpfs can be mounted on it (see
//! `cap_tmpdir`): elsewhere a configured limit is an error.
//!
//! Landlock grants by hierarchy, so a denied path that exists inside a
//! writable root (`.git/config`) splits that root: its other entries stay
//! writable, but no new name can be created at the root itself (any right
//! granted there would reach the denied path too). Absent denied paths do
//! not split a writable root (the post-run check of SPEC §4.5 covers their
//! creation); an absent `deny_read` path outside the writable roots splits
//! the read roots, as in the full tier, and the watcher stops the sandbox
//! when the host moves or links a granted inode into one (denywatch.rs).
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};
use nix::sys::signal::kill;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{caps, init, landlock, limits, seccomp};
use crate::plan::{Limits, Plan};

/// Device files the command may write (the rest of the host's /dev is withheld).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
];

/// The terminals the command was given (its own pty), never another one.
fn own_terminals() -> Vec<PathBuf> {
    (0..3)
        .filter_map(|fd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok())
        .filter(|p| p.starts_with("/dev/pts/") || p.starts_with("/dev/tty"))
        .collect()
}

/// A private temporary directory under the host's /tmp (mkdtemp: mode
/// 0700, a name nobody could have taken); removed when the run ends.
struct PrivateTmp(PathBuf);

impl PrivateTmp {
    fn new() -> Result<PrivateTmp> {
        let mut template = *b"/tmp/airlock-tmp-XXXXXX\0";
        // SAFETY: mkdtemp rewrites the NUL-terminated template in place.
        let p = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if p.is_null() {
            return Err(std::io::Error::last_os_error()).context("creating a private TMPDIR");
        }
        let path = std::str::from_utf8(&template[..template.len() - 1])
            .context("TMPDIR name")?
            .to_string();
        Ok(PrivateTmp(PathBuf::from(path)))
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The user's tasks on the host now: RLIMIT_NPROC counts them all when
/// there is no user namespace, so the sandbox's share is added on top.
fn own_tasks() -> u64 {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() }.to_string();
    crate::procfs::pids()
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                == Some(uid.as_str())
        })
        .map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(1)
        })
        .sum()
}

/// The watcher: outside the Landlock domain, so that it can remove the
/// private TMPDIR when the run ends. It forwards the
/// teardown signal to init and, as a subreaper too, kills whatever
/// survives init.
pub fn run(
    plan: &Plan,
    channel: &mut UnixStream,
    proxy_port: Option<u16>,
    notify: super::denywatch::Instances,
) -> Result<i32> {
    // Without a PID namespace nothing tears the sandbox down for us: on
    // the supervisor's death we get SIGUSR1 and pass it on.
    let mask = init::block_signals()?;
    set_parent_death_signal()?;
    subreaper()?;
    limits::wait_until_placed(channel)?;
    let tmp = PrivateTmp::new()?;
    let mut plan = plan.clone();
    for var in ["TMPDIR", "TMP", "TEMP"] {
        plan.env.insert(var.into(), tmp.0.display().to_string());
    }
    // SAFETY: getpid has no preconditions.
    let watcher = unsafe { libc::getpid() };
    // As in the full tier: the names a deny_read path could be moved,
    // linked or made a link to, and init's word that Landlock is in force.
    let deny = super::denywatch::DenyWatch::new(
        notify,
        &plan.deny_read_names,
        &plan.deny_read,
        &plan.write,
        // No mounts here: nothing is covered.
        &[],
    )?;
    // Resolved before the watch existed: init looks them up again.
    crate::resolve::forget();
    let armed = match deny {
        Some(_) => Some(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?),
        None => None,
    };
    // SAFETY: the helper is single-threaded; the child runs init and exits.
    let child = match unsafe { fork() }.context("starting the sandbox's init")? {
        ForkResult::Child => {
            drop(deny);
            let armed = armed.map(|(r, w)| {
                drop(r);
                w
            });
            let code = match sandbox_init(&plan, &tmp.0, channel, proxy_port, watcher, armed) {
                Ok(code) => code,
                Err(e) => {
                    super::channel::send_line(channel, "error", &format!("{e:#}"));
                    125
                }
            };
            // SAFETY: leave without running the watcher's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    };
    super::denywatch::raise_nofile();
    let mut watch = match deny {
        Some(deny) => {
            use nix::sys::signalfd::{SfdFlags, SignalFd};
            let flags = SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK;
            let sfd = SignalFd::with_flags(&mask, flags).context("signalfd")?;
            Some((deny, armed.map(|(r, _)| r), sfd))
        }
        None => None,
    };
    let mut stopped = false;
    let code = loop {
        let sig = match &mut watch {
            None => mask.wait().context("waiting for signals")?,
            Some((deny, armed, sfd)) => {
                let timeout = nix::poll::PollTimeout::NONE;
                if let Some(a) = deny.wait(armed, Some(sfd.as_fd()), timeout)? {
                    // No PID namespace: init tears the sandbox down (at
                    // once where signals are scoped, scope.rs); one that
                    // has not within a second never started the command
                    // (it takes the signal only once it has) and is
                    // killed. Then whatever is left below us.
                    let _ = kill(child, init::TEARDOWN);
                    if !exits_within(child, Duration::from_secs(1)) {
                        let _ = kill(child, nix::sys::signal::Signal::SIGKILL);
                        let _ = waitpid(child, None);
                    }
                    init::kill_descendants();
                    let _ = channel.write_all(a.line().as_bytes());
                    stopped = true;
                    break 125;
                }
                match sfd.read_signal() {
                    Ok(Some(info)) => {
                        match nix::sys::signal::Signal::try_from(info.ssi_signo as i32) {
                            Ok(sig) => sig,
                            Err(_) => continue,
                        }
                    }
                    _ => continue,
                }
            }
        };
        if sig == init::TEARDOWN {
            let _ = kill(child, init::TEARDOWN);
            continue;
        }
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => break code,
            Ok(WaitStatus::Signaled(_, sig, _)) => break 128 + sig as i32,
            _ => {}
        }
    };
    // What the host did until init's end is read before the verdict, as
    // in the full tier: an event still queued could name what the command
    // read in its last moments.
    let end = match stopped {
        true => None,
        false => watch.as_mut().and_then(|(deny, _, _)| deny.check()),
    };
    let code = match end {
        Some(a) => {
            init::kill_descendants();
            let _ = channel.write_all(a.line().as_bytes());
            125
        }
        None => code,
    };
    // Whatever init left behind (if the command killed it) is ours now.
    init::kill_descendants();
    drop(tmp);
    Ok(code)
}

/// Whether `child` exits (and is reaped) within `limit`.
fn exits_within(child: Pid, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => return true,
            Ok(_) => {}
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn set_parent_death_signal() -> Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            init::TEARDOWN as libc::c_int,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).context("setting the parent-death signal");
    }
    Ok(())
}

fn subreaper() -> Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context("becoming a subreaper");
    }
    Ok(())
}

/// `[limits] tmp` (SPEC §4.6) for the private TMPDIR: a tmpfs of that size
/// mounted on it, in a mount namespace of the sandbox's own (the host, the
/// watcher included, still sees the empty directory, which the watcher
/// removes). Without a user namespace only CAP_SYS_ADMIN can do that: root,
/// outside a container that dropped it. RLIMIT_FSIZE is no substitute (it
/// caps one file, not the total). Where no tmpfs can be made, a configured
/// limit is an error; the default one is not enforced, as the run's warning
/// and `doctor` say (`DEGRADED_RESIDUAL_RISK`, `limits::describe`).
fn cap_tmpdir(limits: &Limits, tmp: &Path) -> Result<()> {
    // SAFETY: unshare with a flag only; this process is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        let e = std::io::Error::last_os_error();
        if limits.tmp_configured {
            bail!(
                "limits.tmp cannot be enforced in the degraded tier here: no mount namespace for a tmpfs on TMPDIR ({e}); \
                 it needs root with CAP_SYS_ADMIN, or user namespaces for the full tier (see `airlock doctor`)"
            );
        }
        // The default: not enforced here, as the run's warning says.
        return Ok(());
    }
    // Ours must not propagate back to the host; the host's still reach us.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .context("making the degraded tier's mounts private")?;
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "mode=0700,uid={uid},gid={gid},{}",
        limits::tmpfs_size(limits)
    );
    mount(
        Some("tmpfs"),
        tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .with_context(|| format!("mounting a tmpfs on TMPDIR {}", tmp.display()))?;
    Ok(())
}

/// Init of the degraded sandbox: confine itself, then start the command.
fn sandbox_init(
    plan: &Plan,
    tmp: &Path,
    channel: &mut UnixStream,
    proxy_port: Option<u16>,
    watcher: libc::pid_t,
    armed: Option<OwnedFd>,
) -> Result<i32> {
    set_parent_death_signal()?;
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != watcher {
        return Ok(125);
    }
    // As the full tier's PID 1: the command shares our Landlock domain.
    caps::not_dumpable()?;
    // Nor does a handler of ours let it interrupt our waits.
    init::default_signal_handlers()?;
    subreaper()?;
    // No user namespace: RLIMIT_NPROC counts all the user's tasks on the
    // host, so the sandbox's share goes on top of what runs now (root is
    // exempt; its limit is the cgroup the watcher entered).
    let mut nproc = plan.limits.clone();
    nproc.pids = u32::try_from(own_tasks() + u64::from(plan.limits.pids)).unwrap_or(u32::MAX);
    limits::set_nproc(&nproc)?;
    cap_tmpdir(&plan.limits, tmp)?;
    caps::drop_all()?;
    caps::no_new_privs()?;
    let withheld = [Path::new("/tmp"), Path::new("/dev")].map(PathBuf::from);
    let hidden_read: Vec<PathBuf> = plan.deny_read.iter().cloned().chain(withheld).collect();
    // Landlock grants by tree: carving a protected file out of a writable
    // root would leave the root itself unwritable (no `node_modules` in a
    // git checkout). So the project's protected set stays writable here and
    // the post-run check (SPEC §4.5) quarantines or restores what changed;
    // airlock's own files (trust store, journals, CA, managed policy) and
    // hidden paths are carved out as before.
    let own: Vec<PathBuf> = crate::places::user_policy_path()
        .and_then(|p| p.parent().map(PathBuf::from))
        .into_iter()
        .chain(airlock_ca::default_dir())
        .chain(crate::places::managed_policy_files())
        .chain(crate::places::own_state_dirs())
        .collect();
    let hidden_write: Vec<PathBuf> = plan
        .deny_read
        .iter()
        .cloned()
        .chain(
            plan.deny_write
                .iter()
                .filter(|p| own.iter().any(|o| p.starts_with(o)))
                .cloned(),
        )
        .chain(own.iter().cloned())
        .collect();
    // Read: what is hidden now, and every deny_read path outside the
    // writable roots even if absent (created by the host during the run,
    // it must stay unreadable; see `landlock::read_splits`). Write: only
    // what exists splits, so the workspace root stays writable.
    let mut read_denied = landlock::existing(&hidden_read);
    read_denied.extend(landlock::read_splits(&plan.deny_read, &plan.write));
    // What the names lead to now, with the watch in place (a link the host
    // re-pointed since the plan was made).
    let now: Vec<PathBuf> = plan
        .deny_read_names
        .iter()
        .map(|n| landlock::resolved(n))
        .collect();
    read_denied.extend(landlock::read_splits(&now, &plan.write));
    let (read, listable) = landlock::carve(&plan.read, &read_denied);
    let (mut write, _) = landlock::carve(&plan.write, &landlock::existing(&hidden_write));
    write.push(tmp.to_path_buf());
    write.extend(DEVICES.iter().map(PathBuf::from));
    write.extend(own_terminals());
    landlock::restrict_degraded(&read, &listable, &read_denied, &write, proxy_port)?;
    // A layer of our own that scopes signals, and the command one below
    // it (scope.rs): the teardown's kill(-1) then reaches exactly the
    // sandbox, and the command cannot signal us.
    let scoped = super::scope::enter_for_init();
    tracing::debug!(scoped, "degraded tier: signals scoped to the sandbox");
    // The watcher's deny_read watch: inodes born from now on carry no rule.
    let armed = armed.map(super::denywatch::arm);
    seccomp::install(true)?;
    super::channel::close_on_exec(channel)?;
    if let Some(at) = armed.filter(|_| super::denywatch::settle_needed(plan)) {
        super::denywatch::settle(at);
    }
    init::run(plan, channel, init::Reap::Subreaper { scoped }, None)
}
