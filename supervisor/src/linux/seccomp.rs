//! The seccomp filter (SPEC §4.1 step 6). EPERM for the kernel surface a
//! build tool never needs, ENOSYS for clone3 (so libc falls back to clone,
//! whose flags we can inspect), and death on a foreign architecture.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// The same numbers on x86_64 and aarch64 (the generic ioctl table).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541c;

const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// Syscalls refused outright, by name (for `policy profile`) and number.
fn denied() -> Vec<(&'static str, i64)> {
    vec![
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("open_tree", libc::SYS_open_tree),
        ("move_mount", libc::SYS_move_mount),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("setns", libc::SYS_setns),
    ]
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond> {
    Cond::new(arg, len, op, value).context("seccomp condition")
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule> {
    SeccompRule::new(conds).context("seccomp rule")
}

/// The EPERM filter's rules: syscall number to the conditions that refuse it
/// (an empty list refuses every call). The degraded tier, which has no
/// network namespace, also refuses UDP and new unix sockets (SPEC §4.4).
fn eperm_rules(degraded: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied() {
        rules.insert(nr, vec![]);
    }
    // socket(): only unix, IPv4, IPv6 and netlink route; never raw or packet sockets.
    let allowed_families = [
        libc::AF_UNIX,
        libc::AF_INET,
        libc::AF_INET6,
        libc::AF_NETLINK,
    ];
    let mut socket = vec![rule(
        allowed_families
            .iter()
            .map(|f| cond(0, Len::Dword, Op::Ne, *f as u64))
            .collect::<Result<_>>()?,
    )?];
    socket.push(rule(vec![
        cond(0, Len::Dword, Op::Eq, libc::AF_NETLINK as u64)?,
        cond(2, Len::Dword, Op::Ne, libc::NETLINK_ROUTE as u64)?,
    ])?);
    // SOCK_PACKET (10) is the obsolete spelling of packet sockets.
    for ty in [libc::SOCK_RAW as u64, 10] {
        socket.push(rule(vec![cond(1, Len::Dword, Op::MaskedEq(0xf), ty)?])?);
    }
    if degraded {
        socket.push(rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::AF_UNIX as u64,
        )?])?);
        for family in [libc::AF_INET, libc::AF_INET6] {
            socket.push(rule(vec![
                cond(0, Len::Dword, Op::Eq, family as u64)?,
                cond(1, Len::Dword, Op::MaskedEq(0xf), libc::SOCK_DGRAM as u64)?,
            ])?);
        }
    }
    rules.insert(libc::SYS_socket, socket);
    // unshare() and clone() with any namespace flag.
    let ns = |arg: u8| -> Result<Vec<SeccompRule>> {
        NAMESPACE_FLAGS
            .iter()
            .map(|f| rule(vec![cond(arg, Len::Qword, Op::MaskedEq(*f), *f)?]))
            .collect()
    };
    rules.insert(libc::SYS_unshare, ns(0)?);
    rules.insert(libc::SYS_clone, ns(0)?);
    // personality(): reading it (0xffffffff) and PER_LINUX stay allowed.
    rules.insert(
        libc::SYS_personality,
        vec![rule(vec![
            cond(0, Len::Dword, Op::Ne, 0xffff_ffff)?,
            cond(0, Len::Dword, Op::Ne, 0)?,
        ])?],
    );
    // Terminal injection, matched on the low 32 bits of the request.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Len::Dword, Op::Eq, TIOCSTI)?])?,
            rule(vec![cond(1, Len::Dword, Op::Eq, TIOCLINUX)?])?,
        ],
    );
    Ok(rules)
}

fn program(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        ARCH,
    )
    .context("building the seccomp filter")?;
    filter.try_into().context("compiling the seccomp filter")
}

/// Install both filters on this thread (inherited by everything it execs).
pub fn install(degraded: bool) -> Result<()> {
    let eperm = program(eperm_rules(degraded)?, libc::EPERM)?;
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, vec![]);
    let enosys = program(clone3, libc::ENOSYS)?;
    seccompiler::apply_filter(&eperm).context("installing the seccomp filter")?;
    seccompiler::apply_filter(&enosys).context("installing the clone3 filter")?;
    Ok(())
}

/// The rules in words, for `airlock policy profile`.
pub fn describe() -> Vec<String> {
    let mut out: Vec<String> = denied()
        .iter()
        .map(|(n, _)| format!("EPERM  {n}"))
        .collect();
    out.push("EPERM  socket(family not in AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)".into());
    out.push("EPERM  socket(AF_NETLINK, protocol != NETLINK_ROUTE)".into());
    out.push("EPERM  socket(type SOCK_RAW or SOCK_PACKET)".into());
    out.push("EPERM  unshare/clone with CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}".into());
    out.push("EPERM  personality(anything but PER_LINUX or a query)".into());
    out.push("EPERM  ioctl(TIOCSTI), ioctl(TIOCLINUX) (low 32 bits)".into());
    out.push("ENOSYS clone3".into());
    out.push("KILL   any other architecture".into());
    out.push("degraded tier only: EPERM socket(AF_UNIX) (socketpair stays), socket(AF_INET/AF_INET6, SOCK_DGRAM)".into());
    out
}
