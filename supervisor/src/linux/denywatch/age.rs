//! How old an inode is against the sandbox's Landlock ruleset: one born
//! before it may carry a rule (a grant the host can move onto a denied
//! name); one born after cannot.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

pub(super) fn timestamp(t: libc::statx_timestamp) -> i128 {
    t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
}

/// Whether a birth time on this directory's filesystem tells whether an
/// inode existed (and so may carry a Landlock rule) before the run.
/// overlayfs copies a lower file up with a new birth time when it is
/// renamed or linked, yet it stays the inode the rule was put on; network
/// and FUSE filesystems report a server's clock, some let it be set.
/// There every name that appears counts as old: the run stops (fail
/// closed), at the cost of stopping it for a shell's history save too.
pub(super) fn btime_tells_age(dir: BorrowedFd) -> bool {
    const UNRELIABLE: &[i64] = &[
        0x794c_7630, // overlayfs
        0x6969,      // NFS
        0x6573_5546, // FUSE (virtiofs too)
        0x0102_1997, // 9p
        0xff53_4d42, // CIFS
        0xfe53_4d42, // SMB2
        0x5346_544e, // NTFS (ntfs3)
        0x7366_746e, // NTFS
        0x6e66_7364, // nfsd
        0x0000_517b, // SMB
    ];
    match nix::sys::statfs::fstatfs(dir) {
        // The field's type differs between C libraries and architectures.
        #[allow(clippy::unnecessary_cast)]
        Ok(st) => !UNRELIABLE.contains(&(st.filesystem_type().0 as i64)),
        Err(_) => false,
    }
}

/// Realtime nanoseconds, on the clock of file times. The fine clock: an
/// inode's birth time comes from the coarse one (up to a tick behind) or a
/// fine one, so an inode born before this reading is always older; one
/// born within a tick after may look older too, which stops the run (fail
/// closed).
pub(super) fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(i128::MAX)
}

/// Called by the sandbox's init once its Landlock ruleset is in force:
/// tells the watcher when, so that the watcher's own delay in reading it
/// does not make the command's first files look older than the ruleset.
/// Returns the time told, for [`settle`].
pub fn arm(pipe: OwnedFd) -> i128 {
    let at = now_ns();
    let _ = nix::unistd::write(&pipe, &at.to_le_bytes());
    at
}

/// Whether the command itself can make a file at a watched name: only
/// inside a writable root. Then [`settle`] is worth its wait.
pub fn settle_needed(plan: &crate::plan::Plan) -> bool {
    let inside = |p: &PathBuf| plan.write.iter().any(|w| crate::paths::under(p, w));
    plan.deny_read_names
        .iter()
        .chain(&plan.deny_read)
        .any(inside)
}

/// Before the command starts: wait until the coarse clock, which stamps
/// most new inodes, is past `at` (up to a tick, 4 ms at HZ=250), so that
/// the command's own first files are never taken for older than the
/// ruleset. Outside the writable roots only the host makes files, and one
/// it makes at a denied name within that tick stops the run (fail closed).
/// Bounded: a clock that does not move costs a false stop, never a hang.
pub fn settle(at: i128) {
    for _ in 0..50 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime into a timespec we own.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) } != 0 {
            return;
        }
        let coarse = t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
        if coarse > at {
            return;
        }
        let wait = (at - coarse).clamp(100_000, 2_000_000) as u64;
        std::thread::sleep(std::time::Duration::from_nanos(wait));
    }
}
