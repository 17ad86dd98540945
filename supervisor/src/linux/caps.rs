//! Dropping every capability (SPEC §4.1 step 4): bounding, ambient,
//! effective, permitted and inheritable, then `no_new_privs`.

use anyhow::{Context, Result};

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// CAP_SETPCAP, which dropping from the bounding set needs.
const CAP_SETPCAP: u32 = 8;

fn has_effective(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|eff| eff & (1 << cap) != 0)
}

pub fn drop_all() -> Result<()> {
    // An ordinary user outside a user namespace (the degraded tier) has no
    // capability to drop and may not touch the bounding set; with
    // no_new_privs set next, exec cannot gain file capabilities anyway.
    let bounding = has_effective(CAP_SETPCAP);
    for cap in (0..=last_cap()).filter(|_| bounding) {
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("dropping capability {cap} from the bounding set"));
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error()).context("clearing the ambient capabilities");
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads a valid header and two data structs.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("clearing the capability sets");
    }
    Ok(())
}

pub fn no_new_privs() -> Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setting no_new_privs");
    }
    Ok(())
}

/// Die with the parent: SIGKILL when it exits, and at once if it already has.
pub fn die_with_parent(parent: libc::pid_t) -> Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setting the parent-death signal");
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        std::process::exit(125);
    }
    Ok(())
}

/// No core dumps, and /proc/<pid> of this process closed to every process
/// without CAP_SYS_PTRACE over the host: the sandbox's init holds what the
/// command must not read. An exec (the command's) makes a process dumpable
/// again.
pub fn not_dumpable() -> Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error())
            .context("making the sandbox's init undumpable");
    }
    Ok(())
}

/// Name this process in `ps`, `top` and `perf` (the kernel's 15 bytes):
/// the helper and PID 1 are otherwise "airlock" like the supervisor.
pub fn name(name: &std::ffi::CStr) {
    // SAFETY: prctl reads the NUL-terminated string it is given.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}
