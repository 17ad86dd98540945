//! `[limits]` (SPEC §4.6), with the kernel's own mechanisms:
//! - pids: the `pid_max` of the sandbox's own PID namespace (Linux ≥ 6.14
//!   makes it per namespace). Every task of the sandbox holds a number in
//!   that namespace, below pid_max, so `pid_max = pids + 1` caps them at
//!   `pids`, exactly, for root as for an ordinary user, at the cost of one
//!   write. Once numbers wrap the kernel skips 1–299, so the ceiling can
//!   then be up to 299 lower; never higher. The sandbox cannot raise it: it
//!   has no capabilities left. Before 6.14 (and in the degraded tier, which
//!   has no PID namespace): RLIMIT_NPROC, counted per user per user
//!   namespace (ucounts); the kernel exempts real uid 0 from it, so for root
//!   a pids cgroup carries the limit (cgroup v2 where the controller is
//!   delegated to our cgroup, else the v1 pids hierarchy, where moving a
//!   process in waits for an RCU grace period, ~25 ms).
//! - memory: a cgroup's memory.max (v2) or memory.limit_in_bytes (v1).
//! - tmp: the size of the private /tmp and /dev/shm tmpfs (mounts.rs); in
//!   the degraded tier a tmpfs on TMPDIR where it can mount (degraded.rs).
//!
//! The supervisor makes the cgroups and moves the helper in while the
//! helper builds the namespaces; the helper waits for that before it
//! forks. A limit the policy sets that cannot be enforced is an error; the pids
//! default that cannot be enforced (root without a usable cgroup) is said
//! by `doctor` and logged.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::plan::Limits;

/// The size of the sandbox's /dev tmpfs: it holds only mount points and links.
pub const DEV_SIZE: &str = "size=1M";

pub fn tmpfs_size(limits: &Limits) -> String {
    format!("size={}", limits.tmp)
}

/// The kernel refuses a pid_max below this (RESERVED_PIDS + 1).
const PID_MAX_MIN: u32 = 301;

fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    // SAFETY: uname NUL-terminates its fields.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (ma, mi) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (ma, mi) >= (major, minor)
}

/// Whether the full tier caps pids with its PID namespace's own pid_max
/// (Linux ≥ 6.14); the supervisor and the helper both ask, and agree.
pub fn pids_by_namespace(limits: &Limits) -> bool {
    limits.pids.saturating_add(1) >= PID_MAX_MIN && kernel_at_least(6, 14)
}

/// In the sandbox's PID 1, while it still has its capabilities: cap the
/// namespace's task numbers, and check that the kernel took it.
pub fn set_pid_max(limits: &Limits) -> Result<()> {
    const FILE: &str = "/proc/sys/kernel/pid_max";
    let want = limits.pids.saturating_add(1);
    fs::write(FILE, want.to_string())
        .with_context(|| format!("limits.pids: setting this PID namespace's pid_max to {want}"))?;
    let got = fs::read_to_string(FILE).context("limits.pids: reading pid_max back")?;
    if got.trim() != want.to_string() {
        bail!(
            "limits.pids: pid_max reads {} after writing {want}",
            got.trim()
        );
    }
    Ok(())
}

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// Where a controller's cgroup for this process lives, and which file
/// names its limit: cgroup v2 first, then v1.
fn cgroup_dir(controller: &str) -> Option<(PathBuf, bool)> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount_of = |fstype: &str, option: Option<&str>| -> Option<PathBuf> {
        mounts.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split_whitespace();
            if post.next()? != fstype {
                return None;
            }
            let super_opts = post.nth(1).unwrap_or("");
            if let Some(o) = option {
                if !super_opts.split(',').any(|x| x == o) {
                    return None;
                }
            }
            pre.split_whitespace().nth(4).map(PathBuf::from)
        })
    };
    // v2: "0::/path", usable when our cgroup delegates the controller.
    if let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) {
        if let Some(root) = mount_of("cgroup2", None) {
            let dir = root.join(path.trim_start_matches('/'));
            let delegated = fs::read_to_string(dir.join("cgroup.subtree_control"))
                .is_ok_and(|s| s.split_whitespace().any(|c| c == controller));
            if delegated {
                return Some((dir, true));
            }
        }
    }
    // v1: "N:controller[,other]:/path".
    let path = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == controller).then_some(path)
    })?;
    let root = mount_of("cgroup", Some(controller))?;
    Some((root.join(path.trim_start_matches('/')), false))
}

/// The sandbox's cgroups, made by the supervisor, which stays outside and
/// removes them when the run is over (the helper has exited by then).
pub struct Cgroup {
    dirs: Vec<PathBuf>,
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

impl Cgroup {
    /// Move `pid` (the helper, before it forks anything) into every cgroup.
    pub fn add(&self, pid: libc::pid_t) -> Result<()> {
        for dir in &self.dirs {
            fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving the sandbox into {}", dir.display()))?;
        }
        Ok(())
    }
}

/// Remove the empty cgroups of helpers that died without cleaning up (a
/// SIGKILLed supervisor takes its helper along at once). rmdir fails on a
/// cgroup that still has tasks, and a live helper's pid is skipped.
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        // `airlock-<pid>-<nonce>`: the pid of the supervisor that made it.
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("airlock-"))
            .map(|n| n.split('-').next().unwrap_or(n))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// Swap must not stretch a memory limit: cgroup v2's memory.swap.max, or
/// v1's memory.memsw.limit_in_bytes (memory plus swap), where they exist.
fn no_swap(dir: &Path, v2: bool, bytes: &str) -> Result<()> {
    let (file, value) = if v2 {
        ("memory.swap.max", "0")
    } else {
        ("memory.memsw.limit_in_bytes", bytes)
    };
    let path = dir.join(file);
    if path.exists() {
        fs::write(&path, value).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn create(controller: &str, file: (&str, &str), value: &str) -> Result<PathBuf> {
    let (parent, v2) = cgroup_dir(controller)
        .with_context(|| format!("no {controller} cgroup is available to this user"))?;
    sweep(&parent);
    // A nonce too: a pid is reused, and a stale cgroup of a killed run with
    // the same pid may still hold its last tasks.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = parent.join(format!("airlock-{}-{nonce:08x}", std::process::id()));
    fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = if v2 { file.0 } else { file.1 };
    let done = fs::write(dir.join(name), value)
        .with_context(|| format!("writing {}", dir.join(name).display()))
        .and_then(|_| match controller {
            "memory" => no_swap(&dir, v2, value),
            _ => Ok(()),
        });
    if let Err(e) = done {
        let _ = fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(dir)
}

/// Before the namespaces: the cgroups that carry `memory`, and `pids` for
/// root where no PID namespace carries it (the kernel exempts uid 0 from
/// RLIMIT_NPROC).
pub fn create_cgroups(limits: &Limits) -> Result<Cgroup> {
    let mut cg = Cgroup { dirs: vec![] };
    if let Some(bytes) = limits.memory {
        let dir = create(
            "memory",
            ("memory.max", "memory.limit_in_bytes"),
            &bytes.to_string(),
        )
        .map_err(|e| {
            anyhow::anyhow!("limits.memory cannot be enforced here: {e:#} (it needs a delegated cgroup v2 memory controller)")
        })?;
        cg.dirs.push(dir);
    }
    if is_root() && !limits.pids_by_pid_max {
        match create("pids", ("pids.max", "pids.max"), &limits.pids.to_string()) {
            Ok(dir) => cg.dirs.push(dir),
            Err(e) if limits.pids_configured => {
                bail!("limits.pids cannot be enforced for root here: {e:#} (the kernel exempts uid 0 from RLIMIT_NPROC; it needs a pids cgroup)")
            }
            Err(e) => tracing::warn!("the default pids limit is not enforced for root: {e:#}"),
        }
    }
    Ok(cg)
}

/// In the helper, before it starts anything: wait until the supervisor
/// has placed it in the cgroups (`Sandbox::start`).
pub fn wait_until_placed(channel: &mut std::os::unix::net::UnixStream) -> Result<()> {
    let mut byte = [0u8; 1];
    match std::io::Read::read_exact(channel, &mut byte) {
        Ok(()) if byte == *b"1" => Ok(()),
        _ => bail!("the sandbox could not be placed in its cgroups"),
    }
}

/// Right after the user namespace is created: RLIMIT_NPROC, counted in it.
pub fn set_nproc(limits: &Limits) -> Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a valid struct. A lower hard
    // limit the user already has stays (it cannot be raised anyway).
    if unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("reading RLIMIT_NPROC");
    }
    lim.rlim_max = lim.rlim_max.min(limits.pids.into());
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setting RLIMIT_NPROC");
    }
    Ok(())
}

/// Whether this process may mount without a user namespace (the degraded
/// tier's TMPDIR tmpfs): CAP_SYS_ADMIN in its effective set.
fn has_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// For `doctor`: each limit, and how (or whether) this machine enforces it.
pub fn describe() -> Vec<String> {
    let cg = |c: &str| -> String {
        match cgroup_dir(c) {
            Some((dir, true)) => format!("cgroup v2 under {}", dir.display()),
            Some((dir, false)) if Path::new(&dir).exists() => {
                format!("cgroup v1 under {}", dir.display())
            }
            _ => String::new(),
        }
    };
    let fallback = if is_root() {
        match cg("pids") {
            s if s.is_empty() => "not enforced for root (no pids cgroup; the kernel exempts uid 0 from RLIMIT_NPROC); setting it is an error".to_string(),
            s => s,
        }
    } else {
        "RLIMIT_NPROC, counted in the sandbox's user namespace".to_string()
    };
    let pids = if pids_by_namespace(&Limits::default()) {
        format!(
            "pid_max of the sandbox's own PID namespace (exact; Linux >= 6.14); \
             in the degraded tier, which has no PID namespace: {fallback}"
        )
    } else {
        fallback
    };
    let memory = match cg("memory") {
        s if s.is_empty() => {
            "not enforceable (no delegated cgroup memory controller); setting it is an error"
                .to_string()
        }
        s => s,
    };
    vec![
        format!("pids (default 4096): {pids}"),
        format!("memory (no default): {memory}"),
        format!(
            "tmp (default 1G): size of the private /tmp and /dev/shm tmpfs; degraded tier: {}",
            if has_sys_admin() {
                "a tmpfs of that size on TMPDIR (CAP_SYS_ADMIN)"
            } else {
                "not enforced (no CAP_SYS_ADMIN to mount a tmpfs on TMPDIR); setting it is an error there"
            }
        ),
    ]
}
