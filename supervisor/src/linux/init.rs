//! PID 1 of the sandbox (SPEC §4.1 step 7): start the command, forward
//! signals to it, reap every zombie, and when the command exits, kill what
//! is left and exit with its status.

use std::ffi::CString;
use std::io::Write as _;
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
    /// The degraded tier's subreaper (orphans are reparented to us).
    /// SIGUSR1 means tear down now. `scoped`: init sits in a Landlock
    /// domain that scopes signals and the command goes one below it
    /// (`scope.rs`), so `kill(-1)` reaches exactly the sandbox, at once;
    /// else our descendants are found in /proc until none is left.
    Subreaper { scoped: bool },
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

/// Every process below `me`, at any depth, as /proc shows them now, with
/// its state letter (`T` stopped, `Z` dead).
fn descendants_of(me: u32) -> Vec<(Pid, char)> {
    let procs: Vec<(u32, u32, char)> = crate::procfs::pids()
        .into_iter()
        .filter_map(|pid| {
            let (state, ppid) = crate::procfs::state_and_parent(pid)?;
            Some((pid, ppid, state))
        })
        .collect();
    let mut below = std::collections::HashMap::from([(me, ' ')]);
    loop {
        let before = below.len();
        for (pid, ppid, state) in &procs {
            if below.contains_key(ppid) {
                below.insert(*pid, *state);
            }
        }
        if below.len() == before {
            break;
        }
    }
    below.remove(&me);
    below
        .into_iter()
        .map(|(p, st)| (Pid::from_raw(p as i32), st))
        .collect()
}

/// Kill every descendant, until none is left: the degraded tier has no PID
/// namespace whose end would. The tree is first stopped, again until one
/// look at /proc finds all of it stopped (a stopped process cannot fork,
/// nor wake one that is), then killed whole: a chain that regrows as its
/// head dies cannot outrun that; a storm that replaces itself faster than
/// /proc can be read still can (docs/src/degraded.md): the fallback
/// where Landlock cannot scope signals (`scope.rs`).
pub fn kill_descendants() {
    let me = std::process::id();
    // A process in a killable wait (a vfork parent whose child is stopped)
    // never shows as stopped: after this many looks, kill what there is.
    let mut stop_rounds = 0;
    loop {
        let all = descendants_of(me);
        if all.is_empty() {
            break;
        }
        let running = stop_rounds < 20
            && all
                .iter()
                .any(|(_, st)| !matches!(st, 'T' | 't' | 'Z' | 'X'));
        stop_rounds = if running { stop_rounds + 1 } else { 0 };
        let sig = if running {
            Signal::SIGSTOP
        } else {
            Signal::SIGKILL
        };
        for (k, _) in &all {
            let _ = kill(*k, sig);
        }
        if running {
            continue;
        }
        while let Ok(status) = waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
        ) {
            if status == WaitStatus::StillAlive {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    reap_all();
}

/// Whether the teardown signal waits for us (it is blocked).
fn teardown_pending() -> bool {
    // SAFETY: sigpending fills the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set) == 0 && libc::sigismember(&set, TEARDOWN as libc::c_int) == 1
    }
}

/// Everything the degraded sandbox still runs, killed and reaped.
fn end_subreaped(reap: Reap) {
    match reap {
        // Our domain scopes signals: this reaches the sandbox and nothing
        // else, and no fork escapes it. The dead are ours to reap, orphans
        // included (we are their subreaper).
        Reap::Subreaper { scoped: true } => {
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
            reap_all();
        }
        _ => kill_descendants(),
    }
}

/// Wait for every child (of any kind: `__WALL` takes those cloned with
/// another exit signal too) until there is none. False on an error other
/// than ECHILD. An interruption is retried: the command can make the
/// kernel signal us (F_SETOWN and O_ASYNC on a descriptor its dying
/// processes close), and stopping early would report an empty sandbox
/// while some of it still runs.
fn reap_all() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ECHILD) => return true,
            Err(_) => return false,
        }
    }
}

/// Whether our PID namespace holds nobody but us, as /proc (its own, which
/// PID 1 mounted) lists it.
fn only_init_left() -> bool {
    crate::procfs::pids() == [1]
}

/// Every signal init catches goes back to its default. The kernel delivers
/// a signal from inside the namespace to its init only when init has a
/// handler for it, and Rust installs some (SIGSEGV, SIGBUS: its stack
/// overflow report), which would let the command interrupt init's waits.
/// Ignored signals stay ignored; blocked ones are taken with sigwait.
pub fn default_signal_handlers() -> Result<()> {
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: sigaction with a null new action only reads the current one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(sig as libc::c_int, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        if old.sa_sigaction == libc::SIG_DFL || old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: installing the default disposition on our own process.
        if unsafe { libc::signal(sig as libc::c_int, libc::SIG_DFL) } == libc::SIG_ERR {
            anyhow::bail!("resetting the handler of {sig}");
        }
    }
    Ok(())
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

/// The command's program, arguments and environment, made ready in init:
/// the command's process shares init's memory until it execs
/// (`CLONE_VM | CLONE_VFORK`), so it may only make system calls.
struct Prepared {
    path: CString,
    shown: PathBuf,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The errno of the step that failed in the child, set before it exits.
    failed: std::sync::atomic::AtomicI32,
    /// The Landlock layer the command enters below init's (`scope.rs`).
    scope: Option<std::os::fd::OwnedFd>,
}

/// In init, before the command's process exists: enter its directory (the
/// process inherits it; a relative program or PATH entry is looked up
/// from there, as a shell would) and build what execve takes.
fn prepare(
    cwd: &Path,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Prepared> {
    std::env::set_current_dir(cwd).with_context(|| format!("cannot enter {}", cwd.display()))?;
    let name = argv.first().context("no command given")?;
    let prog = find_program(name, env.get("PATH").map(String::as_str))
        .with_context(|| format!("command not found: {name}"))?;
    let path = CString::new(prog.as_os_str().as_encoded_bytes()).context("program path")?;
    let argv = cstrings(argv.iter().cloned())?;
    let envp = cstrings(env.iter().map(|(k, v)| format!("{k}={v}")))?;
    let ptrs = |v: &[CString]| {
        v.iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect::<Vec<_>>()
    };
    Ok(Prepared {
        path,
        shown: prog,
        argv: ptrs(&argv),
        envp: ptrs(&envp),
        _argv: argv,
        _envp: envp,
        failed: std::sync::atomic::AtomicI32::new(0),
        scope: None,
    })
}

/// Start `child(arg)` as a process that shares init's memory until it
/// execs or exits (`CLONE_VM | CLONE_VFORK`: no copy of init's page
/// tables, init waiting meanwhile), on a stack of its own.
fn start_sharing_memory<T>(
    child: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: &T,
) -> Result<Pid> {
    let mut stack = vec![0u8; 64 * 1024];
    // The stack grows down: its top, 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    // SAFETY: the child runs on `stack`, which outlives it (CLONE_VFORK
    // returns only once it has exec'd or exited), and only reads `arg`,
    // which the caller holds until then.
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg as *const T as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("starting the command");
    }
    Ok(Pid::from_raw(pid))
}

/// The command's process until execve: take the terminal, restore the
/// signal mask and SIGPIPE, close what init holds, exec. System calls only
/// (it runs on init's memory, on a stack of its own).
extern "C" fn exec_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Prepared` that init keeps alive, and suspended
    // (CLONE_VFORK), until this process has exec'd or exited.
    let p = unsafe { &*(arg as *const Prepared) };
    // SAFETY: each call below is a system call wrapper on this process's
    // own state, with arguments that are valid for the call.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // airlock ignores SIGPIPE (Rust's runtime does); the command gets
        // the default, as from any shell (`yes | head -1` ends quietly).
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if libc::isatty(0) == 1 {
            // Become the terminal's foreground job, as a shell would.
            libc::setpgid(0, 0);
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpid());
        } else if libc::isatty(1) == 0 && libc::isatty(2) == 0 {
            // No terminal (a harness): a process group of its own, as a
            // shell gives a job, so that a signal to airlock's group is
            // airlock's to pass on, once. With output on a terminal it
            // stays in airlock's group, whose job the terminal runs.
            libc::setpgid(0, 0);
        }
        // airlock ignores terminal stops (main.rs); the command does not.
        libc::signal(libc::SIGTTOU, libc::SIG_DFL);
        libc::signal(libc::SIGTTIN, libc::SIG_DFL);
        // Anything init opened without O_CLOEXEC stays out too (the
        // helper already closed what the caller passed down).
        libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 4);
        // Below init's domain: unable to signal it (fail closed: a command
        // that could would outlive the teardown, see `scope.rs`).
        if let Some(r) = &p.scope {
            if super::scope::enter(r).is_err() {
                p.failed.store(
                    *libc::__errno_location(),
                    std::sync::atomic::Ordering::SeqCst,
                );
                libc::_exit(127)
            }
        }
        libc::execve(p.path.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
        p.failed.store(
            *libc::__errno_location(),
            std::sync::atomic::Ordering::SeqCst,
        );
        libc::_exit(127)
    }
}

/// Start the command: a process that shares init's memory until it execs
/// (no copy of init's page tables to make, and none for execve to tear
/// down), init waiting meanwhile. An error is reported on the channel and
/// the process exits 127, as a shell's would.
fn spawn_command(
    plan: &Plan,
    channel: &mut UnixStream,
    scope: Option<std::os::fd::OwnedFd>,
) -> Result<Pid> {
    let failed = |channel: &mut UnixStream, e: anyhow::Error| -> Result<Pid> {
        super::channel::send_line(channel, "exec-error", &format!("{e:#}"));
        // The exit status is the child's: one that only exits.
        // SAFETY: init is single-threaded; the child only _exits.
        match unsafe { fork() }.context("starting the command")? {
            ForkResult::Child => unsafe { libc::_exit(127) },
            ForkResult::Parent { child } => Ok(child),
        }
    };
    let prepared = match prepare(&plan.cwd, &plan.argv, &plan.env) {
        Ok(p) => Prepared { scope, ..p },
        Err(e) => return failed(channel, e),
    };
    let pid = start_sharing_memory(exec_child, &prepared)?;
    let errno = prepared.failed.load(std::sync::atomic::Ordering::SeqCst);
    if errno != 0 {
        let e = anyhow::Error::new(nix::errno::Errno::from_raw(errno))
            .context(format!("cannot run {}", prepared.shown.display()));
        super::channel::send_line(channel, "exec-error", &format!("{e:#}"));
    }
    Ok(pid)
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

/// Start the command and wait for it; returns its exit code. `done`, when
/// given, hears that code as soon as nothing else of the sandbox is left,
/// before our own exit (which costs the teardown of our memory and PID
/// namespace, off the run's critical path).
pub fn run(
    plan: &Plan,
    channel: &mut UnixStream,
    reap: Reap,
    done: Option<std::os::fd::OwnedFd>,
) -> Result<i32> {
    wait_for_go(channel)?;
    super::channel::phase_now(channel, "supervisor said go");
    let mask = block_signals()?;
    let scope = match reap {
        Reap::Subreaper { scoped: true } => Some(
            super::scope::signal_ruleset()
                .context("the kernel scoped init's signals but not the command's")?,
        ),
        _ => None,
    };
    let command = spawn_command(plan, channel, scope)?;
    loop {
        let sig = mask.wait().context("waiting for signals")?;
        if sig == TEARDOWN && matches!(reap, Reap::Subreaper { .. }) {
            end_subreaped(reap);
            return Ok(124);
        }
        if sig != Signal::SIGCHLD {
            let _ = kill(command, sig);
            continue;
        }
        // A storm of orphans can keep this loop reaping for ever: the
        // teardown signal is looked for as it goes.
        let mut reaped = 0u32;
        loop {
            reaped = reaped.wrapping_add(1);
            if reaped % 64 == 0 && matches!(reap, Reap::Subreaper { .. }) && teardown_pending() {
                end_subreaped(reap);
                return Ok(124);
            }
            // `__WALL`: children that exit with another signal than
            // SIGCHLD (a raw clone's choice, 0 included) are reaped here
            // too, not left as zombies for the teardown to find.
            match waitpid(
                Pid::from_raw(-1),
                Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
            ) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) if status.pid() == Some(command) => {
                    super::channel::phase_now(channel, "command exited");
                    let code = exit_code(status).unwrap_or(125);
                    // Nothing started inside outlives the command.
                    let empty = match reap {
                        Reap::Namespace => {
                            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
                            reap_all() && only_init_left()
                        }
                        Reap::Subreaper { .. } => {
                            end_subreaped(reap);
                            false
                        }
                    };
                    super::channel::phase_now(channel, "leftovers reaped");
                    // Only a namespace seen empty is reported early; else
                    // `done` closes unwritten with our exit, which the
                    // kernel completes only once every process of the
                    // namespace is gone.
                    if let Some(done) = done.filter(|_| empty) {
                        // What is left of us is our exit: on idle CPU time,
                        // after the helper this byte wakes (on a machine
                        // with few cores they would share one).
                        let idle = libc::sched_param { sched_priority: 0 };
                        // SAFETY: lowering our own scheduling class.
                        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
                        let _ = std::fs::File::from(done).write_all(&code.to_le_bytes());
                    }
                    return Ok(code);
                }
                Ok(_) => {}
            }
        }
    }
}

/// A command the session's supervisor asked for: its argv, environment
/// and directory (already filtered and checked outside), and the caller's
/// stdin, stdout and stderr, received with the request.
#[derive(serde::Deserialize)]
struct SessionCommand {
    id: u64,
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    cwd: PathBuf,
}

/// PID 1 of a session (SPEC §4.7): instead of one command, start each
/// command the supervisor sends on `session`, report its exit, forward
/// its signals, and keep what it leaves running until the session ends.
/// Every command starts from this process, which is already inside every
/// layer of the sandbox: nothing is built per command.
pub fn serve_session(
    channel: &mut UnixStream,
    session: crate::seqpacket::Seq,
    done: Option<std::os::fd::OwnedFd>,
) -> Result<i32> {
    use std::os::fd::AsRawFd;
    wait_for_go(channel)?;
    let mask = block_signals()?;
    // Every disposition the default, once, for the commands to inherit as
    // the caller's own shell would give them: what `session start`
    // inherited (a background job ignores SIGINT and SIGQUIT) is not
    // theirs, whose caller forwards them. SIGPIPE stays ignored here (a
    // write to a client gone must not end PID 1), and the terminal stops
    // (main.rs); each command gets those three back itself.
    for sig in 1..libc::SIGRTMAX() {
        if ![
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGPIPE,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ]
        .contains(&sig)
        {
            // SAFETY: setting a disposition of this single-threaded process.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    let sfd = nix::sys::signalfd::SignalFd::with_flags(
        &mask,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC | nix::sys::signalfd::SfdFlags::SFD_NONBLOCK,
    )
    .context("signalfd")?;
    let mut running: std::collections::HashMap<i32, u64> = Default::default();
    let send = |v: serde_json::Value| {
        let _ = session.send_json(&v, &[]);
    };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: session.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two descriptors we own, in an array we own.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            while let Ok(Some(_)) = sfd.read_signal() {}
            loop {
                match waitpid(
                    Pid::from_raw(-1),
                    Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL),
                ) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(status) => {
                        let Some(pid) = status.pid() else { continue };
                        let Some(code) = exit_code(status) else {
                            continue;
                        };
                        if let Some(id) = running.remove(&pid.as_raw()) {
                            send(serde_json::json!({"op": "exit", "id": id, "code": code}));
                        }
                    }
                }
            }
        }
        if fds[0].revents == 0 {
            continue;
        }
        let (msg, received) = match session.recv_json() {
            Ok(Some(m)) => m,
            // The supervisor is gone or said something unreadable: the
            // session ends (its parent-death signal would end it anyway).
            Ok(None) | Err(_) => break,
        };
        match msg.get("op").and_then(|o| o.as_str()) {
            Some("spawn") => {
                let Ok(cmd) = serde_json::from_value::<SessionCommand>(msg.clone()) else {
                    continue;
                };
                match spawn_session_command(&cmd, &received) {
                    Ok(pid) => {
                        running.insert(pid.as_raw(), cmd.id);
                        send(
                            serde_json::json!({"op": "started", "id": cmd.id, "pid": pid.as_raw()}),
                        );
                    }
                    Err(e) => send(
                        serde_json::json!({"op": "exec-error", "id": cmd.id, "message": format!("{e:#}")}),
                    ),
                }
            }
            Some(op @ ("signal" | "kill")) => {
                let id = msg.get("id").and_then(|i| i.as_u64());
                let Some((&pid, _)) = running.iter().find(|(_, v)| Some(**v) == id) else {
                    continue;
                };
                let pid = Pid::from_raw(pid);
                if op == "kill" {
                    // The command's group and everything below it that /proc
                    // still shows as its descendant; what it moved out of
                    // both (a daemon) lives until the session ends.
                    let below = descendants_of(pid.as_raw() as u32);
                    let _ = kill(Pid::from_raw(-pid.as_raw()), Signal::SIGKILL);
                    let _ = kill(pid, Signal::SIGKILL);
                    for (p, _) in below {
                        let _ = kill(p, Signal::SIGKILL);
                    }
                } else {
                    let sig = msg
                        .get("sig")
                        .and_then(|s| s.as_i64())
                        .and_then(|s| Signal::try_from(s as i32).ok())
                        .filter(|s| FORWARDED.contains(s) || *s == Signal::SIGKILL);
                    if let Some(sig) = sig {
                        if kill(Pid::from_raw(-pid.as_raw()), sig).is_err() {
                            let _ = kill(pid, sig);
                        }
                    }
                }
            }
            Some("freeze") => {
                let complete = freeze_all();
                send(serde_json::json!({"op": "frozen", "id": 0, "complete": complete}));
            }
            Some("thaw") => {
                let _ = kill(Pid::from_raw(-1), Signal::SIGCONT);
            }
            Some("end") => break,
            _ => {}
        }
    }
    // Nothing started inside outlives the session.
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    let empty = reap_all() && only_init_left();
    if let Some(done) = done.filter(|_| empty) {
        let _ = std::fs::File::from(done).write_all(&0i32.to_le_bytes());
    }
    Ok(0)
}

/// Stop every process of the sandbox but us, for a check (SPEC §4.7):
/// `kill(-1)` from PID 1 reaches each of them in one pass, and a fork
/// under way when it lands is restarted by the kernel, so no chain of
/// forks outruns it as it outruns a stop sent pid by pid from outside.
/// Repeated until /proc shows every one stopped (or in the kernel, `D`,
/// where the stop takes effect before it returns to its own code).
fn freeze_all() -> bool {
    for _ in 0..2000 {
        let _ = kill(Pid::from_raw(-1), Signal::SIGSTOP);
        let me = std::process::id();
        let running = crate::procfs::pids().into_iter().any(|pid| {
            pid != me
                && crate::procfs::state_and_parent(pid)
                    .is_some_and(|(st, _)| !matches!(st, 'T' | 't' | 'Z' | 'X' | 'D'))
        });
        if !running {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    false
}

/// Fork one command of the session: its own session and process group
/// (signals and a timeout reach all of it), the caller's stdio, its
/// directory and environment. An error before exec comes back on a pipe.
/// A session command's process until execve, like [`exec_child`]: its
/// own session (setsid), the caller's stdin, stdout and stderr. System
/// calls only: it runs on PID 1's memory until it execs.
extern "C" fn exec_session_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `SessionPrepared` that PID 1 keeps alive, and
    // suspended (CLONE_VFORK), until this process has exec'd or exited.
    let p = unsafe { &*(arg as *const SessionPrepared) };
    let fail = |step: u8| -> ! {
        // SAFETY: reading this thread's errno, then _exit.
        unsafe {
            p.prepared.failed.store(
                *libc::__errno_location(),
                std::sync::atomic::Ordering::SeqCst,
            );
            p.step.store(step, std::sync::atomic::Ordering::SeqCst);
            libc::_exit(127)
        }
    };
    // SAFETY: each call below is a system call wrapper on this process's
    // own state, with arguments that are valid for the call.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // (Every other disposition is already the default: PID 1 set
        // them so when the session started, see `serve_session`.)
        for sig in [libc::SIGPIPE, libc::SIGTTOU, libc::SIGTTIN] {
            libc::signal(sig, libc::SIG_DFL);
        }
        libc::setsid();
        // Above 2 first, so that no dup2 overwrites one still to come.
        let mut high = [0i32; 3];
        for (i, fd) in p.stdio.iter().enumerate() {
            high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 10);
            if high[i] < 0 {
                fail(STEP_STDIO);
            }
        }
        for (i, fd) in high.iter().enumerate() {
            if libc::dup2(*fd, i as i32) < 0 {
                fail(STEP_STDIO);
            }
        }
        libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 4);
        libc::execve(
            p.prepared.path.as_ptr(),
            p.prepared.argv.as_ptr(),
            p.prepared.envp.as_ptr(),
        );
        fail(STEP_EXEC)
    }
}

const STEP_STDIO: u8 = 1;
const STEP_EXEC: u8 = 2;

struct SessionPrepared {
    prepared: Prepared,
    stdio: [std::os::fd::RawFd; 3],
    /// Which step failed, with `prepared.failed` its errno.
    step: std::sync::atomic::AtomicU8,
}

/// Start a session's command from PID 1 as [`spawn_command`] starts a
/// one-shot run's: PID 1 enters the command's directory (the process
/// inherits it; a relative program or PATH entry is looked up from there,
/// as a shell would), builds what execve takes, and the process shares
/// PID 1's memory until it execs: no copy of PID 1's page tables per
/// command.
fn spawn_session_command(cmd: &SessionCommand, stdio: &[std::os::fd::OwnedFd]) -> Result<Pid> {
    use std::os::fd::AsRawFd;
    let [i, o, e] = stdio else {
        anyhow::bail!("a command needs exactly stdin, stdout and stderr");
    };
    let p = SessionPrepared {
        prepared: prepare(&cmd.cwd, &cmd.argv, &cmd.env)?,
        stdio: [i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()],
        step: std::sync::atomic::AtomicU8::new(0),
    };
    let child = start_sharing_memory(exec_session_child, &p)?;
    let errno = p.prepared.failed.load(std::sync::atomic::Ordering::SeqCst);
    if errno != 0 {
        // It has exited (127): its exit is not reported, the error is.
        let _ = waitpid(child, None);
        let e = std::io::Error::from_raw_os_error(errno);
        match p.step.load(std::sync::atomic::Ordering::SeqCst) {
            STEP_STDIO => anyhow::bail!("stdio: {e}"),
            _ => anyhow::bail!("cannot run {}: {e}", p.prepared.shown.display()),
        }
    }
    Ok(child)
}
