//! The helper's channel to the supervisor, shared by every step that
//! runs in the sandbox's processes (helper, degraded tier, PID 1, the
//! publisher): message lines, `-vv` phase marks, and descriptor hygiene.

use std::io::Write;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;

use anyhow::{Context, Result};

/// Whether the helper logs its steps (`-vv`): told by [`DEBUG_ENV`] when
/// re-executed, by the supervisor's own level when forked.
pub(super) static DEBUG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(super) fn debug() -> bool {
    DEBUG.load(std::sync::atomic::Ordering::Relaxed)
}

/// Forked before the supervisor set its logging up: ours starts with the
/// plan, which carries its filter; phases are kept until then.
pub(super) static LOG_FROM_PLAN: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Close every descriptor but 0, 1, 2 and `keep`.
pub(super) fn close_inherited(keep: RawFd) {
    let keep = keep.max(2) as libc::c_uint;
    let ranges = [(3, keep.saturating_sub(1)), (keep + 1, libc::c_uint::MAX)];
    for (lo, hi) in ranges.into_iter().filter(|(lo, hi)| lo <= hi) {
        // SAFETY: close_range on our own descriptor table.
        if unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0) } == 0 {
            continue;
        }
        // Before Linux 5.9: close them one by one (listed first, since
        // listing opens a descriptor of its own).
        let fds: Vec<libc::c_uint> = std::fs::read_dir("/proc/self/fd")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        for n in fds.into_iter().filter(|n| (lo..=hi).contains(n)) {
            // SAFETY: closing a descriptor nothing in this process uses.
            unsafe { libc::close(n as RawFd) };
        }
    }
}

/// One message line to the supervisor. Its text can hold what the
/// sandbox chose (argv, names it made): control characters are replaced,
/// so that it can never start a line of its own (a forged `status:`).
pub fn send_line(channel: &mut UnixStream, kind: &str, text: &str) {
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    let _ = channel.write_all(format!("{kind}: {text}\n").as_bytes());
}

/// Setup steps' ends, on CLOCK_MONOTONIC, for the supervisor's `-vv`.
/// Kept here and written by PID 1 once the descriptors have been passed
/// (a line in between would break that exchange); PID 1 inherits the
/// helper's marks with the fork.
pub(super) static PHASES: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

pub(super) fn phase(name: &str) {
    // Only `-vv` shows them: the rest of the time, not even the string.
    if !debug() && !LOG_FROM_PLAN.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let now = crate::clock::monotonic_ns();
    if let Ok(mut p) = PHASES.lock() {
        p.push_str(&format!("phase: {now} {name}\n"));
    }
}

/// A step after the descriptors have been passed: written at once.
pub fn phase_now(channel: &mut UnixStream, name: &str) {
    if !debug() {
        return;
    }
    let now = crate::clock::monotonic_ns();
    let _ = channel.write_all(format!("phase: {now} {name}\n").as_bytes());
}

pub(super) fn send_phases(channel: &mut UnixStream) {
    if let Ok(p) = PHASES.lock() {
        let _ = channel.write_all(p.as_bytes());
    }
}

pub fn close_on_exec(channel: &UnixStream) -> Result<()> {
    let flags = nix::fcntl::fcntl(channel.as_fd(), nix::fcntl::FcntlArg::F_GETFD)
        .context("channel flags")?;
    let mut fdflags = nix::fcntl::FdFlag::from_bits_truncate(flags);
    fdflags.insert(nix::fcntl::FdFlag::FD_CLOEXEC);
    nix::fcntl::fcntl(channel.as_fd(), nix::fcntl::FcntlArg::F_SETFD(fdflags))
        .context("channel flags")?;
    Ok(())
}
