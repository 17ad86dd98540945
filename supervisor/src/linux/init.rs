//! PID 1 of the sandbox (SPEC §4.1 step 7): start the command, forward
//! signals to it, reap every zombie, and when the command exits, kill what
//! is left and exit with its status.

use std::ffi::CString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::plan::Plan;

const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGWINCH,
];

/// How leftovers are killed when the command exits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// PID 1 of a PID namespace: `kill(-1)` reaches exactly the sandbox.
    Namespace,
    /// The degraded tier's subreaper: kill our children until none are
    /// left (orphans are reparented to us). SIGUSR1 means tear down now.
    Subreaper,
}

/// The signal that asks a subreaper to tear the sandbox down.
pub const TEARDOWN: Signal = Signal::SIGUSR1;

/// Block the signals init handles, before anything can send them.
pub fn block_signals() -> Result<SigSet> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.add(TEARDOWN);
    for s in FORWARDED {
        mask.add(*s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).context("blocking signals in init")?;
    Ok(mask)
}

fn children_of(me: u32) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // The command name may hold spaces and parentheses: read after the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == me).then(|| Pid::from_raw(pid))
        })
        .collect()
}

/// Kill every descendant: children first; their children then become
/// ours (we are the subreaper) and go in the next round.
pub fn kill_descendants() {
    let me = std::process::id();
    for _ in 0..1000 {
        let kids = children_of(me);
        if kids.is_empty() {
            break;
        }
        for k in &kids {
            let _ = kill(*k, Signal::SIGKILL);
        }
        while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    while waitpid(Pid::from_raw(-1), None).is_ok() {}
}

/// The program to exec: a path, or a name looked up in the sandbox's PATH.
fn find_program(name: &str, env_path: Option<&str>) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    env_path
        .unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
}

fn cstrings(items: impl IntoIterator<Item = String>) -> Result<Vec<CString>> {
    items
        .into_iter()
        .map(|s| CString::new(s).context("an argument or variable contains a NUL byte"))
        .collect()
}

/// In the command's process: take the terminal, restore signals, exec.
fn exec_command(plan: &Plan, channel: &mut UnixStream) -> ! {
    let err = (|| -> Result<()> {
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
            .context("restoring the signal mask")?;
        // airlock ignores SIGPIPE (Rust's runtime does); the command gets
        // the default, as from any shell (`yes | head -1` ends quietly).
        // SAFETY: signal(2) on our own process, before exec.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        // SAFETY: isatty, setpgid, tcsetpgrp and signal on our own process.
        unsafe {
            if libc::isatty(0) == 1 {
                // Become the terminal's foreground job, as a shell would.
                libc::setpgid(0, 0);
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            }
        }
        std::env::set_current_dir(&plan.cwd)
            .with_context(|| format!("cannot enter {}", plan.cwd.display()))?;
        let name = plan.argv.first().context("no command given")?;
        let prog = find_program(name, plan.env.get("PATH").map(String::as_str))
            .with_context(|| format!("command not found: {name}"))?;
        let path = CString::new(prog.as_os_str().as_encoded_bytes()).context("program path")?;
        let argv = cstrings(plan.argv.iter().cloned())?;
        let envp = cstrings(plan.env.iter().map(|(k, v)| format!("{k}={v}")))?;
        // Anything init opened without O_CLOEXEC stays out too (the
        // helper already closed what the caller passed down).
        // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
        unsafe { libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 4) };
        let e = nix::unistd::execve(&path, &argv, &envp).unwrap_err();
        Err(anyhow::Error::new(e).context(format!("cannot run {}", prog.display())))
    })()
    .unwrap_err();
    super::helper::send_line(channel, "exec-error", &format!("{err:#}"));
    // SAFETY: leaving the forked child without running destructors.
    unsafe { libc::_exit(127) }
}

fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// Wait for the supervisor's word that its side is ready (its snapshot of
/// the protected set, its signal handlers): the sandbox is built ahead of
/// it, the command starts only then. Anything else (the supervisor gave
/// up or died) ends the sandbox before the command ran.
fn wait_for_go(channel: &mut UnixStream) -> Result<()> {
    let mut byte = [0u8; 1];
    loop {
        match std::io::Read::read(channel, &mut byte) {
            Ok(1) if byte == *b"1" => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => anyhow::bail!("the supervisor did not start the command"),
        }
    }
}

/// Start the command and wait for it; returns its exit code.
pub fn run(plan: &Plan, channel: &mut UnixStream, reap: Reap) -> Result<i32> {
    wait_for_go(channel)?;
    let mask = block_signals()?;
    // SAFETY: init is single-threaded; the child only execs or _exits.
    let command = match unsafe { fork() }.context("starting the command")? {
        ForkResult::Child => exec_command(plan, channel),
        ForkResult::Parent { child } => child,
    };
    loop {
        let sig = mask.wait().context("waiting for signals")?;
        if sig == TEARDOWN && reap == Reap::Subreaper {
            kill_descendants();
            return Ok(124);
        }
        if sig != Signal::SIGCHLD {
            let _ = kill(command, sig);
            continue;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) if status.pid() == Some(command) => {
                    super::helper::phase_now(channel, "command exited");
                    let code = exit_code(status).unwrap_or(125);
                    // Nothing started inside outlives the command.
                    match reap {
                        Reap::Namespace => {
                            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                            while waitpid(Pid::from_raw(-1), None).is_ok() {}
                        }
                        Reap::Subreaper => kill_descendants(),
                    }
                    super::helper::phase_now(channel, "leftovers reaped");
                    return Ok(code);
                }
                Ok(_) => {}
            }
        }
    }
}
