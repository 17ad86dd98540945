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

/// The anchor and its descendants, parents before children.
pub fn members() -> Vec<i32> {
    let Some(anchor) = anchor() else {
        return vec![];
    };
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in crate::procfs::pids() {
        if let Some((_, ppid)) = crate::procfs::state_and_parent(pid) {
            children.entry(ppid as i32).or_default().push(pid as i32);
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

/// One process as a walk saw it: its scheduler state letter and how many
/// times it has been switched out. A stopped process is in state T and its
/// switch counts do not move; one that ran in between, even one that
/// stopped itself again after continuing another, has switched out. A
/// process in uninterruptible sleep (D: a vfork parent whose child we
/// stopped before it exec'd) cannot stop until it leaves the kernel, but
/// with SIGSTOP pending it stops there, before running any code of its own:
/// it reads as 'T' too.
fn snapshot(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let switches = ["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"]
        .iter()
        .filter_map(|n| field(n)?.parse::<u64>().ok())
        .sum();
    let stop_pending = field("ShdPnd")
        .and_then(|m| u64::from_str_radix(m, 16).ok())
        .is_some_and(|m| m & (1 << (libc::SIGSTOP - 1)) != 0);
    let state = match state.chars().next()? {
        'D' if stop_pending => 'T',
        c => c,
    };
    Some((state, switches))
}

fn is_stopped(state: char) -> bool {
    // Zombies and dead processes run nothing either.
    matches!(state, 'T' | 't' | 'Z' | 'X')
}

/// Why the sandbox could not be held still: the question is voided.
#[derive(Debug)]
pub struct NotStopped(pub String);

/// How many rounds of stopping a question waits for: a sandbox that keeps
/// continuing itself past these gets no question at all (denied).
const ROUNDS: usize = 60;

/// SIGSTOP every process of the sandbox and prove it stays stopped: each
/// round signals every member again (members continue each other with
/// SIGCONT, so one signal each is not enough) and new ones (forks during
/// the walk), then two walks a moment apart must find the same members,
/// every one stopped and not switched in between. Signals go through
/// pidfds opened while the process was seen as a member and re-checked
/// after opening, so a recycled pid never stops a process outside the
/// sandbox. If no round gets there, `NotStopped`: the caller denies.
pub fn stop_all() -> Result<Stopped, NotStopped> {
    let mut known: HashSet<i32> = HashSet::new();
    let mut stopped = Stopped { procs: vec![] };
    for round in 0..ROUNDS {
        let now = members();
        let set: HashSet<i32> = now.iter().copied().collect();
        for pid in now {
            if !known.insert(pid) {
                continue;
            }
            let Some(fd) = pidfd_open(pid) else { continue };
            // Still the process we saw: the anchor, or a child of a member.
            let still = Some(pid) == anchor()
                || crate::procfs::state_and_parent(pid as u32).is_some_and(|(_, pp)| {
                    set.contains(&(pp as i32)) || known.contains(&(pp as i32))
                });
            if still {
                stopped.procs.push((pid, fd));
            }
        }
        for (_, fd) in &stopped.procs {
            pidfd_signal(fd, libc::SIGSTOP);
        }
        // Let the stops land; a little longer each round.
        std::thread::sleep(std::time::Duration::from_millis(2 + round as u64));
        if held_still(&known) {
            return Ok(stopped);
        }
    }
    // `stopped` is dropped here: everything is continued again.
    Err(NotStopped(format!(
        "the sandbox's processes kept continuing each other through {ROUNDS} rounds of SIGSTOP"
    )))
}

/// Two walks 5 ms apart: the same members, all of them ones we signal,
/// all stopped, none switched in between.
fn held_still(known: &HashSet<i32>) -> bool {
    let walk = || -> Option<Vec<(i32, char, u64)>> {
        members()
            .into_iter()
            .map(|pid| {
                if !known.contains(&pid) {
                    return None;
                }
                // Gone since the walk: nothing left to run. Present but
                // unreadable: not known to be stopped.
                let (state, n) = match snapshot(pid) {
                    Some(s) => s,
                    None if !std::path::Path::new(&format!("/proc/{pid}")).exists() => ('X', 0),
                    None => return None,
                };
                is_stopped(state).then_some((pid, state, n))
            })
            .collect()
    };
    let Some(first) = walk() else { return false };
    std::thread::sleep(std::time::Duration::from_millis(5));
    let Some(second) = walk() else { return false };
    first == second
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for (_, fd) in self.procs.iter().rev() {
            pidfd_signal(fd, libc::SIGCONT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_reads_as_stopped_and_still() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        let fd = pidfd_open(pid).expect("pidfd");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (running, _) = snapshot(pid).expect("snapshot");
        assert!(!is_stopped(running), "{running}");
        assert!(pidfd_signal(&fd, libc::SIGSTOP));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let first = snapshot(pid).expect("snapshot");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(is_stopped(first.0), "{first:?}");
        assert_eq!(snapshot(pid), Some(first));
        let _ = child.kill();
        let _ = child.wait();
    }
}
