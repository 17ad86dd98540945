//! The Linux backend (SPEC §4.1): a re-executed helper builds the sandbox;
//! the supervisor hands it a plan and gets back the proxy listener.

pub mod attribution;
pub mod caps;
pub mod capture;
pub mod degraded;
pub mod denywatch;
pub mod helper;
pub mod init;
pub mod landlock;
pub mod limits;
pub mod mounts;
pub mod netlink;
pub mod netns;
pub mod seccomp;
pub mod sockets;
pub mod unixconnect;
pub mod workers;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
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

/// A started sandbox: the helper process, the proxy listener (for
/// `--network proxy`), and the helper's error channel.
pub struct Sandbox {
    pub child: Child,
    pub listener: Option<OwnedFd>,
    /// Transparent capture's sockets (SPEC §5.5), or why it is off.
    pub capture: Option<std::result::Result<capture::Received, String>>,
    channel: UnixStream,
    cgroups: limits::Cgroup,
}

impl Sandbox {
    /// Start the helper. Call from the main thread: the helper's
    /// parent-death signal follows the thread that spawned it.
    pub fn start(plan: &Plan) -> Result<Sandbox> {
        Self::start_with(plan, [Stdio::inherit(), Stdio::inherit(), Stdio::inherit()])
    }

    /// Start the helper with the command's stdin, stdout and stderr given.
    pub fn start_with(plan: &Plan, stdio: [Stdio; 3]) -> Result<Sandbox> {
        Self::start_spawned(plan, Spawned::spawn(stdio)?)
    }

    /// Hand the plan to a helper started earlier.
    pub fn start_spawned(plan: &Plan, mut spawned: Spawned) -> Result<Sandbox> {
        // `spawned` keeps the child until the end: on an error, dropping it
        // kills the helper.
        let (Some(pid), Some(mut channel)) = (
            spawned.child.as_ref().map(|c| c.id() as libc::pid_t),
            spawned.channel.take(),
        ) else {
            anyhow::bail!("the sandbox helper was already used");
        };
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
        // The degraded tier's proxy listener is the supervisor's own.
        let listener = if plan.net == Net::Proxy && plan.degraded.is_none() {
            Some(recv_or_error(&channel)?)
        } else {
            None
        };
        let capture = match listener {
            Some(_) => Some(capture::recv(&channel)?),
            None => None,
        };
        // The full tier's PID 1 sends the connect() listener last: from then
        // on the sandbox's connects are decided here (unixconnect.rs).
        if plan.degraded.is_none() {
            let fd = recv_or_error(&channel)?;
            let diag = recv_or_error(&channel)?;
            let pid_ns = recv_or_error(&channel)?;
            // On an error its connects would fail (the listener is gone):
            // it is stopped.
            unixconnect::serve(plan, fd, diag, &pid_ns)?;
        }
        let Some(child) = spawned.child.take() else {
            anyhow::bail!("the sandbox helper was already used");
        };
        Ok(Sandbox {
            child,
            listener,
            capture,
            channel,
            cgroups,
        })
    }

    /// Split off the channel, for reading messages after the helper is
    /// waited on; the cgroups go when the channel is dropped.
    pub fn into_parts(self) -> (Child, Option<OwnedFd>, Channel) {
        (
            self.child,
            self.listener,
            Channel(self.channel, self.cgroups, Default::default()),
        )
    }
}

/// A helper started ahead of its plan (`run` starts it first thing), so
/// that its exec overlaps the supervisor's own preparation. Unused, it is
/// killed.
pub struct Spawned {
    child: Option<Child>,
    channel: Option<UnixStream>,
}

impl Spawned {
    /// Start the helper. Call from the main thread: the helper's
    /// parent-death signal follows the thread that spawned it.
    pub fn spawn(stdio: [Stdio; 3]) -> Result<Spawned> {
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
            child: Some(child),
            channel: Some(ours),
        })
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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
    /// does once PID 1 has exited: the kernel has then killed and reaped
    /// every process of the PID namespace, so nothing of the sandbox is
    /// left, and the helper's own exit (tearing down the namespaces, a
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
