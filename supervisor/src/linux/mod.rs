//! The Linux backend (SPEC §4.1): a re-executed helper builds the sandbox;
//! the supervisor hands it a plan and gets back the proxy listener.

pub mod attribution;
pub mod caps;
pub mod capture;
pub mod channel;
pub mod degraded;
pub mod denywatch;
pub mod fsrefusals;
pub mod helper;
pub mod init;
pub mod landlock;
pub mod limits;
pub mod mounts;
pub mod netlink;
pub mod netns;
pub mod publish;
pub mod readwatch;
pub mod scope;
pub mod seccomp;
pub mod sockets;
pub mod unixconnect;
pub mod workers;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

use crate::plan::{Net, Plan};

pub const HELPER_ARG: &str = "__sandbox-helper";

/// Turn unshare's errno into what to do about it.
pub fn explain_unshare(e: nix::errno::Errno) -> anyhow::Error {
    let why = match e {
        nix::errno::Errno::EPERM | nix::errno::Errno::EACCES => {
            if std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").is_ok_and(|s| s.trim() == "1") {
                "AppArmor forbids unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1); \
                 install supervisor/apparmor/airlock (see the comment at its top) or run `sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`"
            } else {
                "user namespaces are not permitted here (a container without them, or kernel.unprivileged_userns_clone=0)"
            }
        }
        nix::errno::Errno::ENOSPC => "user.max_user_namespaces is 0 or exhausted; raise it with `sudo sysctl user.max_user_namespaces=15000`",
        nix::errno::Errno::EINVAL => "this kernel lacks a namespace type airlock needs (user, mount, pid, ipc or net)",
        _ => "the kernel refused to create the sandbox's namespaces",
    };
    anyhow::anyhow!("cannot create namespaces ({e}): {why}")
}

/// The helper process: re-executed (`Spawned::spawn`), or forked from
/// the supervisor while it still has a single thread (`Spawned::early`).
pub enum Helper {
    Exec(Child),
    Fork(libc::pid_t),
}

impl Helper {
    pub fn id(&self) -> u32 {
        match self {
            Helper::Exec(c) => c.id(),
            Helper::Fork(pid) => *pid as u32,
        }
    }

    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            Helper::Exec(c) => c.wait(),
            Helper::Fork(pid) => loop {
                let mut status = 0;
                // SAFETY: waitpid on our own child, into a local.
                if unsafe { libc::waitpid(*pid, &mut status, 0) } == *pid {
                    return Ok(std::process::ExitStatus::from_raw(status));
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            },
        }
    }

    fn kill(&mut self) {
        match self {
            Helper::Exec(c) => {
                let _ = c.kill();
            }
            // SAFETY: kill(2) on our own, unreaped child.
            Helper::Fork(pid) => unsafe {
                libc::kill(*pid, libc::SIGKILL);
            },
        }
    }

    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            Helper::Exec(c) => c.try_wait(),
            Helper::Fork(pid) => {
                let mut status = 0;
                // SAFETY: waitpid on our own child, into a local.
                match unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) } {
                    0 => Ok(None),
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(Some(std::process::ExitStatus::from_raw(status))),
                }
            }
        }
    }

    /// The helper's stdout, when it was started with a pipe there.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        match self {
            Helper::Exec(c) => c.stdout.take(),
            Helper::Fork(_) => None,
        }
    }
}

/// A started sandbox: the helper process, the proxy listener (for
/// `--network proxy`), and the helper's error channel.
pub struct Sandbox {
    pub child: Helper,
    pub listener: Option<OwnedFd>,
    /// Transparent capture's sockets (SPEC §5.5), or why it is off.
    pub capture: Option<std::result::Result<capture::Received, String>>,
    /// A session's command socket to PID 1 (SPEC §4.7).
    pub session: Option<OwnedFd>,
    /// `--publish`: the socket factory inside the network namespace.
    pub publisher: Option<OwnedFd>,
    channel: UnixStream,
    cgroups: limits::Cgroup,
}

/// A helper that has its plan and is building the sandbox, while the
/// supervisor gets its side ready (`Sandbox::begin`, then `finish`).
pub struct Begun {
    spawned: Spawned,
    channel: UnixStream,
    cgroups: limits::Cgroup,
    degraded: bool,
    net: Net,
}

impl Sandbox {
    /// Start the helper with the command's stdin, stdout and stderr given,
    /// and let the command run as soon as the sandbox is built.
    pub fn start_with(plan: &Plan, stdio: [Stdio; 3]) -> Result<Sandbox> {
        let sandbox = Self::begin(plan, Spawned::spawn(stdio)?)?.finish(plan)?;
        go(&sandbox.channel)?;
        Ok(sandbox)
    }

    /// Hand the plan to a helper started earlier; it builds the sandbox
    /// while the caller prepares its own side, then [`Begun::finish`].
    pub fn begin(plan: &Plan, mut spawned: Spawned) -> Result<Begun> {
        // `spawned` keeps the child until the end: on an error, dropping it
        // kills the helper.
        let (Some(pid), Some(mut channel)) = (
            spawned.child.as_ref().map(|c| c.id() as libc::pid_t),
            spawned.channel.take(),
        ) else {
            anyhow::bail!("the sandbox helper was already used");
        };
        // What the helper did ahead of its plan must be what the plan asks.
        if let Ahead::Namespaces { net } = spawned.ahead {
            if plan.degraded.is_some() || net != (plan.net != Net::Host) {
                anyhow::bail!("internal error: the sandbox helper was started for another plan");
            }
        }
        if !plan.publish.is_empty() {
            if plan.degraded.is_some() || plan.net == Net::Host {
                anyhow::bail!("--publish needs the sandbox's own network namespace: the degraded tier and --network host have none (a server there is on the host's network already)");
            }
            publish::check(&plan.publish)?;
        }
        // A limit that cannot be enforced stops the run before anything starts.
        if plan.degraded.is_none() {
            unixconnect::check_ptrace()?;
        }
        // How pids are capped is decided here, once, and carried in the plan.
        let mut plan = plan.clone();
        plan.limits.pids_by_pid_max =
            plan.degraded.is_none() && limits::pids_by_namespace(&plan.limits);
        let plan = &plan;
        let cgroups = limits::create_cgroups(&plan.limits)?;
        let body = serde_json::to_vec(plan).context("encoding the sandbox plan")?;
        // Ours, outside the cgroups the helper is about to be put in.
        denywatch::instances()?.send(&channel)?;
        channel
            .write_all(&(body.len() as u32).to_be_bytes())
            .and_then(|_| channel.write_all(&body))
            .context("sending the sandbox plan")?;
        // While the helper builds the namespaces, put it in the cgroups (a
        // migration waits for an RCU grace period: milliseconds); it waits
        // for this byte before it starts anything else.
        let placed = cgroups.add(pid);
        let _ = channel.write_all(if placed.is_ok() { b"1" } else { b"0" });
        placed?;
        Ok(Begun {
            spawned,
            channel,
            cgroups,
            degraded: plan.degraded.is_some(),
            net: plan.net,
        })
    }

    /// Split off the channel, for reading messages after the helper is
    /// waited on; the cgroups go when the channel is dropped.
    pub fn into_parts(self) -> (Helper, Option<OwnedFd>, Channel) {
        (
            self.child,
            self.listener,
            Channel(self.channel, self.cgroups, Default::default()),
        )
    }
}

impl Begun {
    /// Take the helper's descriptors as it sends them. `plan` is the one
    /// begun with, less what the supervisor has since withheld (its own
    /// approval socket, bound meanwhile, from `unix_sockets`).
    pub fn finish(mut self, plan: &Plan) -> Result<Sandbox> {
        let channel = &self.channel;
        // The degraded tier's proxy listener is the supervisor's own.
        let listener = if self.net == Net::Proxy && !self.degraded {
            Some(recv_or_error(channel)?)
        } else {
            None
        };
        let capture = match listener {
            Some(_) => Some(capture::recv(channel)?),
            None => None,
        };
        let publisher = match !self.degraded && self.net != Net::Host && !plan.publish.is_empty() {
            true => Some(recv_or_error(channel)?),
            false => None,
        };
        // The full tier's PID 1 sends the connect() listener last: from then
        // on the sandbox's connects are decided here (unixconnect.rs).
        if !self.degraded {
            let fd = recv_or_error(channel)?;
            let diag = recv_or_error(channel)?;
            let pid_ns = recv_or_error(channel)?;
            // On an error its connects would fail (the listener is gone):
            // it is stopped.
            unixconnect::serve(plan, fd, diag, &pid_ns)?;
        }
        let session = match plan.session && !self.degraded {
            true => Some(recv_or_error(channel)?),
            false => None,
        };
        let Some(child) = self.spawned.child.take() else {
            anyhow::bail!("the sandbox helper was already used");
        };
        Ok(Sandbox {
            child,
            listener,
            capture,
            session,
            publisher,
            channel: self.channel,
            cgroups: self.cgroups,
        })
    }
}

/// What the helper may build before its plan arrives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ahead {
    /// Nothing: the plan decides (it may ask for the degraded tier).
    Nothing,
    /// The namespaces, with a network namespace when `net`.
    Namespaces { net: bool },
}

impl Ahead {
    fn arg(self) -> &'static str {
        match self {
            Ahead::Nothing => "-",
            Ahead::Namespaces { net: true } => "ns",
            Ahead::Namespaces { net: false } => "ns-host",
        }
    }

    pub fn from_arg(arg: Option<&str>) -> Ahead {
        match arg {
            Some("ns") => Ahead::Namespaces { net: true },
            Some("ns-host") => Ahead::Namespaces { net: false },
            _ => Ahead::Nothing,
        }
    }
}

/// A helper started ahead of its plan (`run` starts it first thing), so
/// that its start overlaps the supervisor's own preparation. Unused, it is
/// killed.
pub struct Spawned {
    child: Option<Helper>,
    channel: Option<UnixStream>,
    ahead: Ahead,
}

impl Spawned {
    /// Start the helper by re-executing airlock. Call from the main
    /// thread: the helper's parent-death signal follows the thread that
    /// spawned it.
    pub fn spawn(stdio: [Stdio; 3]) -> Result<Spawned> {
        Self::exec(stdio, Ahead::Nothing)
    }

    fn exec(stdio: [Stdio; 3], ahead: Ahead) -> Result<Spawned> {
        let [stdin, stdout, stderr] = stdio;
        let (ours, theirs) = UnixStream::pair().context("creating the sandbox channel")?;
        // The helper must inherit its end; nothing else is spawned meanwhile.
        let fd = theirs.as_raw_fd();
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .context("sandbox channel")?;
        let exe = std::env::current_exe().context("finding the airlock binary")?;
        let child = Command::new(exe)
            .arg(HELPER_ARG)
            .arg(fd.to_string())
            .arg(std::process::id().to_string())
            .arg(ahead.arg())
            .env_clear()
            // `-vv`: the helper reports the cost of its steps too.
            .envs(tracing::enabled!(tracing::Level::DEBUG).then_some((helper::DEBUG_ENV, "1")))
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .context("starting the sandbox helper")?;
        drop(theirs);
        Ok(Spawned {
            child: Some(Helper::Exec(child)),
            channel: Some(ours),
            ahead,
        })
    }

    /// Start the helper for `airlock run`, with the caller's stdin, stdout
    /// and stderr, building `ahead` before its plan comes. While this
    /// process has a single thread (the start of `run`), it is a fork:
    /// nothing else can hold a lock, so the child is as clean as a fresh
    /// exec and a millisecond sooner (the exec of this binary, its loader
    /// and relocations). Otherwise it is re-executed.
    pub fn early(ahead: Ahead) -> Result<Spawned> {
        if !single_threaded() {
            return Self::exec(
                [Stdio::inherit(), Stdio::inherit(), Stdio::inherit()],
                ahead,
            );
        }
        let (ours, theirs) = UnixStream::pair().context("creating the sandbox channel")?;
        let supervisor = std::process::id() as libc::pid_t;
        // SAFETY: this process has one thread (checked above), so the child
        // inherits no lock another thread held; it runs the helper, which
        // never returns (it exits).
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("starting the sandbox helper"),
            0 => {
                drop(ours);
                if !wipe_cmdline_and_environ() {
                    let mut theirs = theirs;
                    channel::send_line(
                        &mut theirs,
                        "error",
                        "cannot clear the helper's copy of the command line",
                    );
                    // SAFETY: leaving the forked child without running the
                    // supervisor's destructors.
                    unsafe { libc::_exit(125) };
                }
                helper::main(theirs.into_raw_fd(), supervisor, ahead)
            }
            pid => Ok(Spawned {
                child: Some(Helper::Fork(pid)),
                channel: Some(ours),
                ahead,
            }),
        }
    }
}

/// What `airlock run`'s raw arguments say the helper may build ahead, read
/// before they are parsed (`None`: not `run`). A guess: the parsed ones
/// decide (`Spawned::fits`), and a wrong guess costs a respawn, never a
/// sandbox other than the plan's. Only what precedes the command counts.
pub fn ahead_from_raw(args: &[std::ffi::OsString]) -> Option<Ahead> {
    let mut args = args.iter().skip(1).map(|a| a.to_str());
    let mut run = false;
    let (mut degraded, mut host) = (false, false);
    while let Some(arg) = args.next() {
        let Some(arg) = arg else {
            // Not UTF-8: a value or the command; clap decides.
            continue;
        };
        match arg {
            "--" => break,
            "--allow-degraded" => degraded = true,
            // A command for a running session builds nothing.
            "--session" => return None,
            _ if arg.starts_with("--session=") => return None,
            "--network" => host = args.next() == Some(Some("host")),
            _ if arg.starts_with("--network=") => host = arg == "--network=host",
            // Options (and the values of those that take one) are skipped;
            // the first word that is neither is the subcommand, and then
            // the command: nothing of it is read.
            _ if arg.starts_with('-') => {}
            "run" if !run => run = true,
            _ if run => break,
            _ => return None,
        }
    }
    if !run || std::env::var_os("AIRLOCK_SESSION").is_some_and(|s| !s.is_empty()) {
        return None;
    }
    if degraded || std::env::var_os("AIRLOCK_FORCE_TIER").is_some() {
        return Some(Ahead::Nothing);
    }
    Some(Ahead::Namespaces { net: !host })
}

impl Spawned {
    /// `airlock run`'s helper, forked before its arguments are parsed, so
    /// that its namespaces overlap that too. Its logging starts with the
    /// plan, which carries the supervisor's filter (`Plan::log`).
    pub fn before_parsing() -> Option<Spawned> {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        Spawned::early(ahead_from_raw(&args)?).ok()
    }

    /// Whether this helper can take a plan that wants `wanted` built: what
    /// it built ahead must be that (nothing built ahead always fits).
    pub fn fits(&self, wanted: Ahead) -> bool {
        self.ahead == Ahead::Nothing || self.ahead == wanted
    }
}

/// A fork holds the caller's argv and environment where the kernel shows
/// them (/proc/<pid>/cmdline, environ): the sandbox's PID 1 is this fork's
/// fork, and its cmdline is readable by every process in the sandbox.
/// Nothing here reads them again (std keeps its own copies), so the bytes
/// are zeroed in place.
fn wipe_cmdline_and_environ() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    // After the command name (which may hold spaces and parentheses):
    // field 3 onwards; arg_start..env_end are fields 48 to 51.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<usize> = rest
        .split_whitespace()
        .skip(45)
        .take(4)
        .filter_map(|f| f.parse().ok())
        .collect();
    let [arg_start, arg_end, env_start, env_end] = fields[..] else {
        return false;
    };
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if start != 0 && end > start {
            // SAFETY: the kernel's bounds of this process's own argument
            // and environment strings, on its stack: writable, and read by
            // nothing in this single-threaded child from here on.
            unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
        }
    }
    true
}

/// Whether this process has one thread (from /proc: a thread started by
/// a library leaves no other trace).
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
            let _ = c.wait();
        }
    }
}

/// Let the command start: PID 1 has built everything and waits for this
/// byte, so that the supervisor's own side (its snapshot of the protected
/// set, its signal handlers) is in place first.
fn go(channel: &UnixStream) -> Result<()> {
    let mut channel = channel;
    channel
        .write_all(b"1")
        .context("starting the sandboxed command")
}

/// A descriptor from the helper, or the error it wrote instead.
fn recv_or_error(channel: &UnixStream) -> Result<OwnedFd> {
    match netns::recv_fd(channel)? {
        (_, Some(fd)) => Ok(fd),
        (first, None) => {
            // The helper failed before it got there: it wrote why.
            let mut text = vec![first];
            let _ = std::io::Read::read_to_end(&mut &*channel, &mut text);
            let msg = String::from_utf8_lossy(&text);
            let msg = msg
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            anyhow::bail!("sandbox setup failed: {msg}");
        }
    }
}

pub struct Channel(
    UnixStream,
    #[allow(dead_code)] limits::Cgroup,
    std::sync::Mutex<Vec<String>>,
);

impl Channel {
    /// Block until the helper reports the sandbox's exit status, which it
    /// does once PID 1 has reaped every other process of its namespace and
    /// seen it empty (or, failing that, once PID 1 has exited, which the
    /// kernel completes only then): nothing of the sandbox is left, and
    /// PID 1's and the helper's own exits (tearing down the namespaces, a
    /// millisecond or more) need not be waited for. `None` when the
    /// channel closes without one (the helper was killed, or this is the
    /// degraded tier): wait for the helper then.
    pub fn wait_status(&self) -> Option<i32> {
        let _ = self.0.set_nonblocking(false);
        let mut reader = BufReader::new(&self.0);
        let mut status = None;
        loop {
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            if let Some(code) = line.strip_prefix("status: ") {
                status = code.parse().ok();
                break;
            }
            if let Ok(mut held) = self.2.lock() {
                held.push(line);
            }
        }
        // Whatever came after it in the same read is kept too.
        let rest = String::from_utf8_lossy(reader.buffer()).into_owned();
        if let Ok(mut held) = self.2.lock() {
            held.extend(rest.lines().map(str::to_string));
        }
        status
    }

    /// See [`go`].
    pub fn go(&self) -> Result<()> {
        go(&self.0)
    }

    pub fn messages(&self) -> Vec<String> {
        let mut all = self
            .2
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default();
        all.extend(read_messages(&self.0));
        all
    }
}

fn read_messages(channel: &UnixStream) -> Vec<String> {
    let _ = channel.set_nonblocking(true);
    BufReader::new(channel)
        .lines()
        .map_while(Result::ok)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{ahead_from_raw, Ahead};

    fn ahead(args: &[&str]) -> Option<Ahead> {
        let args: Vec<std::ffi::OsString> = std::iter::once("airlock")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        ahead_from_raw(&args)
    }

    #[test]
    fn only_run_starts_a_helper_before_parsing() {
        let ns = Some(Ahead::Namespaces { net: true });
        assert_eq!(ahead(&["run", "--", "true"]), ns);
        assert_eq!(ahead(&["-vv", "run", "--", "true"]), ns);
        assert_eq!(ahead(&["run", "-p", "x.toml", "--", "true"]), ns);
        assert_eq!(ahead(&["policy", "check", "run"]), None);
        assert_eq!(ahead(&["doctor"]), None);
        assert_eq!(ahead(&["--", "run"]), None);
        assert_eq!(ahead(&[]), None);
    }

    #[test]
    fn the_network_and_the_tier_are_read_up_to_the_command() {
        let host = Some(Ahead::Namespaces { net: false });
        assert_eq!(ahead(&["run", "--network", "host", "--", "true"]), host);
        assert_eq!(ahead(&["run", "--network=host", "--", "true"]), host);
        assert_eq!(
            ahead(&["run", "--network", "none", "--", "true"]),
            Some(Ahead::Namespaces { net: true })
        );
        assert_eq!(
            ahead(&["run", "--allow-degraded", "--", "true"]),
            Some(Ahead::Nothing)
        );
        // The command's own arguments are never read as airlock's.
        for cmd in [
            &["run", "--", "x", "--network", "host"][..],
            &["run", "--", "x", "--allow-degraded"],
            &["run", "x", "--network=host"],
        ] {
            assert_eq!(ahead(cmd), Some(Ahead::Namespaces { net: true }), "{cmd:?}");
        }
    }
}
