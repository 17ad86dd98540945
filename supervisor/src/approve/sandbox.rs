//! The sandbox's processes, as the approval front ends need them (SPEC
//! §5.2): every one of them is stopped while a terminal question is up,
//! and none of them may answer on the approval socket.
//!
//! The set is the anchor (the process `run` started) and all its
//! descendants. That covers both tiers: in the namespace tier orphans are
//! re-parented to the sandbox's PID 1, and in the degraded tier to its
//! subreaper, both descendants of the anchor, so `setsid` and double forks
//! do not leave the set.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

static ANCHOR: OnceLock<i32> = OnceLock::new();

/// Record the sandbox's anchor process; called once, after it started.
pub fn watch(anchor: u32) {
    let _ = ANCHOR.set(anchor as i32);
}

pub fn anchor() -> Option<i32> {
    ANCHOR.get().copied()
}

/// The parent of `pid`, from /proc/PID/stat (the field after the last ')',
/// since the command name may itself hold parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The anchor and its descendants, parents before children.
pub fn members() -> Vec<i32> {
    let Some(anchor) = anchor() else {
        return vec![];
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = parent_of(pid) {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    let mut out = vec![anchor];
    let mut seen: HashSet<i32> = HashSet::from([anchor]);
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            for k in kids {
                if seen.insert(*k) {
                    out.push(*k);
                }
            }
        }
        i += 1;
    }
    out
}

/// The PID namespace of a process, as the link text of /proc/PID/ns/pid.
fn pid_ns(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Whether `pid` (as this process sees it) is part of the sandbox: one of
/// its processes, or anything in a PID namespace other than ours (a
/// sandbox always has its own; so does a process hiding from the walk).
/// A pid that cannot be seen (0, or gone) counts as inside: fail closed.
pub fn contains(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    let (Some(ours), Some(theirs)) = (pid_ns(std::process::id() as i32), pid_ns(pid)) else {
        return true;
    };
    ours != theirs || members().contains(&pid)
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags; the descriptor is owned on success.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(fd: &OwnedFd, sig: libc::c_int) -> bool {
    // SAFETY: pidfd_send_signal(2) on a pidfd we own, no siginfo, no flags.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// The sandbox, stopped; every process is continued on drop, children
/// before parents, so a shell inside does not see its job as stopped.
pub struct Stopped {
    procs: Vec<(i32, OwnedFd)>,
}

impl Stopped {
    pub fn count(&self) -> usize {
        self.procs.len()
    }
}

/// SIGSTOP every process of the sandbox, walking again until a walk finds
/// no process that is not stopped yet (a fork during the walk is caught by
/// the next one). Signals go through pidfds opened while the process was
/// seen as a member and re-checked after opening, so a recycled pid never
/// stops a process outside the sandbox.
pub fn stop_all() -> Stopped {
    let mut done: HashSet<i32> = HashSet::new();
    let mut procs = vec![];
    for _ in 0..100 {
        let now = members();
        let fresh: Vec<i32> = now.iter().copied().filter(|p| !done.contains(p)).collect();
        if fresh.is_empty() {
            break;
        }
        let set: HashSet<i32> = now.iter().copied().collect();
        for pid in fresh {
            done.insert(pid);
            let Some(fd) = pidfd_open(pid) else { continue };
            // Still the process we saw: the anchor, or a child of a member.
            let still = Some(pid) == anchor()
                || parent_of(pid).is_some_and(|pp| set.contains(&pp) || done.contains(&pp));
            if still && pidfd_signal(&fd, libc::SIGSTOP) {
                procs.push((pid, fd));
            }
        }
    }
    // Let the stops land before the terminal is flushed and drawn on.
    for (pid, _) in &procs {
        for _ in 0..50 {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rfind(')')
                        .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string))
                });
            match state.as_deref() {
                Some("T") | Some("t") | Some("Z") | Some("X") | None => break,
                _ => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
    }
    Stopped { procs }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for (_, fd) in self.procs.iter().rev() {
            pidfd_signal(fd, libc::SIGCONT);
        }
    }
}
