//! Signal scoping for the degraded tier's teardown (Landlock ABI 6, Linux
//! 6.12+). Without a PID namespace nothing kills a whole sandbox at once:
//! init's walk of /proc could be outrun by a fork storm that replaces
//! itself faster than /proc is read, past `--timeout` (red team round 10).
//!
//! With scoping, init enters a Landlock domain that only scopes signals,
//! and the command one more below it. A process may then signal only its
//! own domain and the ones nested in it:
//! - `kill(-1, SIGKILL)` from init reaches every process of the sandbox and
//!   nothing else of the user's, in one call that a fork cannot race (the
//!   kernel delivers a signal sent to many processes to a child being
//!   forked, or fails the fork);
//! - the command cannot signal init (nor stop or kill it to orphan its
//!   tree to the watcher, which sits outside every domain).
//!
//! Where the kernel has no scoping both calls say so, and init falls back
//! to its walk of /proc (`init::kill_descendants`). A domain that does not
//! scope signals must never send `kill(-1)`: for a process outside a PID
//! namespace that is every process of the user.
//!
//! The raw system calls, because the command's layer is entered in its
//! own process between `clone(CLONE_VM | CLONE_VFORK)` and `execve`, where
//! only system calls may run (`init::exec_child`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct landlock_ruleset_attr` as of ABI 6.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
const LANDLOCK_SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with `scoped`.
const SCOPE_ABI: libc::c_long = 6;

/// A ruleset that handles no access and scopes signals, or `None` where
/// the kernel cannot scope them.
pub fn signal_ruleset() -> Option<OwnedFd> {
    // SAFETY: the version query takes no attribute.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if abi < SCOPE_ABI {
        return None;
    }
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: LANDLOCK_SCOPE_SIGNAL,
    };
    // SAFETY: a valid attribute of the size given; the result is a new
    // descriptor (close-on-exec) that we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned to us.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Enter `ruleset`'s domain (no_new_privs must be set). Only a system call:
/// callable in the command's process before it execs.
pub fn enter(ruleset: &impl AsRawFd) -> std::io::Result<()> {
    // SAFETY: landlock_restrict_self on a descriptor the caller holds.
    match unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Init's own layer: true when init now sits in a domain that scopes
/// signals, so that `kill(-1)` from it reaches only the sandbox.
pub fn enter_for_init() -> bool {
    match signal_ruleset() {
        Some(r) => match enter(&r) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("signal scope not entered: {e}");
                false
            }
        },
        None => false,
    }
}
