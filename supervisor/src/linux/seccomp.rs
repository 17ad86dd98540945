//! The seccomp filter (SPEC §4.1 step 6): one program, in three stages
//! that each either decide or go on to the next:
//! 1. a hand-written allow-list of the syscall numbers reviewed for this
//!    architecture (anything newer gets ENOSYS until reviewed), which also
//!    kills a foreign architecture and another ABI of this one (x32);
//! 2. ENOSYS for clone3 and openat2, so libc falls back to clone and
//!    openat, whose arguments the third stage can inspect;
//! 3. EPERM for the kernel surface a build tool never needs, setuid and
//!    setgid bits, and every socket protocol that carries TCP or UDP past
//!    the proxy.
//!
//! One program rather than three stacked ones: the kernel runs every
//! stacked filter on every system call of the sandbox, and compiles each
//! on install.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// The syscall numbers reviewed, as inclusive ranges. Both architectures
/// have a low table (up to rseq on x86_64, kexec_file_load on aarch64; the
/// holes inside it are ENOSYS stubs in every kernel) and, from 424
/// (pidfd_send_signal) on, numbers shared by every architecture. The last
/// reviewed one is removexattrat (466); open_tree_attr (467, the mount API)
/// and everything after it get ENOSYS.
#[cfg(target_arch = "x86_64")]
const KNOWN: [(u32, u32); 2] = [(0, 334), (424, 466)];
#[cfg(target_arch = "aarch64")]
const KNOWN: [(u32, u32); 2] = [(0, 294), (424, 466)];

/// x86_64's x32 ABI shares AUDIT_ARCH_X86_64 and marks its numbers with
/// this bit; the other filters would see them as different calls.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The same numbers on x86_64 and aarch64 (the generic ioctl table).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541c;
/// tcflow(): TCOOFF stops the terminal's output, so airlock's own writes
/// (its prompt, its messages at the end) would block for ever.
const TCXONC: u64 = 0x540a;

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

/// fchmodat2 (Linux 6.6) is missing from older libc crates.
const SYS_FCHMODAT2: i64 = 452;
/// The bit O_TMPFILE adds to O_DIRECTORY; such an open creates a file with `mode`.
const O_TMPFILE_BIT: u64 = 0o20_000_000;
const SETID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
/// A send with this flag opens a TCP connection (Fast Open) without
/// `connect()`, so Landlock's connect rule never sees it.
const MSG_FASTOPEN: u64 = 0x2000_0000;

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

/// Calls whose mode argument may carry setuid/setgid bits: (number, index
/// of the mode argument, index of the open flags when only `O_CREAT` or
/// `O_TMPFILE` makes the mode count).
// On aarch64 nothing is added to the generic table.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
fn mode_calls() -> Vec<(i64, u8, Option<u8>)> {
    let mut calls = vec![
        (libc::SYS_fchmod, 1, None),
        (libc::SYS_fchmodat, 2, None),
        (SYS_FCHMODAT2, 2, None),
        (libc::SYS_mkdirat, 2, None),
        (libc::SYS_mknodat, 2, None),
        (libc::SYS_openat, 3, Some(2)),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        (libc::SYS_chmod, 1, None),
        (libc::SYS_creat, 1, None),
        (libc::SYS_mkdir, 1, None),
        (libc::SYS_mknod, 1, None),
        (libc::SYS_open, 2, Some(1)),
    ]);
    calls
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond> {
    Cond::new(arg, len, op, value).context("seccomp condition")
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule> {
    SeccompRule::new(conds).context("seccomp rule")
}

/// A condition on the socket type with its SOCK_NONBLOCK/SOCK_CLOEXEC flags masked off.
fn sock_type(ty: u64) -> Result<Cond> {
    cond(1, Len::Dword, Op::MaskedEq(0xf), ty)
}

/// socket(): only unix, IPv4, IPv6 and netlink route; never raw or packet
/// sockets; on IPv4/IPv6 only plain TCP (SOCK_STREAM, protocol 0 or
/// IPPROTO_TCP), which the network namespace and the proxy can see, and
/// plain UDP, which only reaches the empty namespace. Everything else that
/// carries TCP or UDP (MPTCP, SCTP, UDP-Lite, DCCP, SMC, ping sockets,
/// SEQPACKET/RDM) is refused. The degraded tier has no network namespace:
/// there UDP and new unix sockets go too (SPEC §4.4).
fn socket_rules(degraded: bool) -> Result<Vec<SeccompRule>> {
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
        socket.push(rule(vec![sock_type(ty)?])?);
    }
    let stream = libc::SOCK_STREAM as u64;
    let dgram = libc::SOCK_DGRAM as u64;
    for family in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
        let fam = || cond(0, Len::Dword, Op::Eq, family);
        // Every type but stream (1) and datagram (2), in four rules rather
        // than fourteen: {0}, {3}, {4..7} and {8..15} of the low four bits.
        for (mask, value) in [(0xf, 0), (0xf, 3), (0xc, 4), (0x8, 8)] {
            socket.push(rule(vec![
                fam()?,
                cond(1, Len::Dword, Op::MaskedEq(mask), value)?,
            ])?);
        }
        socket.push(rule(vec![
            fam()?,
            sock_type(stream)?,
            cond(2, Len::Dword, Op::Ne, 0)?,
            cond(2, Len::Dword, Op::Ne, libc::IPPROTO_TCP as u64)?,
        ])?);
        if degraded {
            socket.push(rule(vec![fam()?, sock_type(dgram)?])?);
        } else {
            socket.push(rule(vec![
                fam()?,
                sock_type(dgram)?,
                cond(2, Len::Dword, Op::Ne, 0)?,
                cond(2, Len::Dword, Op::Ne, libc::IPPROTO_UDP as u64)?,
            ])?);
        }
    }
    if degraded {
        socket.push(rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::AF_UNIX as u64,
        )?])?);
    } else {
        socket.extend(unix_addressed(true)?);
    }
    Ok(socket)
}

/// Every type but SOCK_STREAM (1) and SOCK_SEQPACKET (5), as (mask, value)
/// pairs over the type's low four bits: {0}, {2, 3}, {4}, {6, 7}, {8..15}.
const NOT_STREAM_OR_SEQPACKET: [(u64, u64); 5] = [(0xf, 0), (0xe, 2), (0xf, 4), (0xe, 6), (0x8, 8)];

/// A unix datagram socket sends to any path with sendto()/sendmsg(), where
/// no connect() is made for unixconnect.rs to decide, and SOCK_RAW is one
/// too (the kernel makes it SOCK_DGRAM): so unix sockets are an allowlist,
/// stream and seqpacket (which ignore addresses), from socket() and from
/// socketpair() alike. `family`: whether the rules also ask for AF_UNIX.
fn unix_addressed(family: bool) -> Result<Vec<SeccompRule>> {
    NOT_STREAM_OR_SEQPACKET
        .iter()
        .map(|(mask, value)| {
            let mut conds = vec![cond(1, Len::Dword, Op::MaskedEq(*mask), *value)?];
            if family {
                conds.insert(0, cond(0, Len::Dword, Op::Eq, libc::AF_UNIX as u64)?);
            }
            rule(conds)
        })
        .collect()
}

/// The EPERM filter's rules: syscall number to the conditions that refuse it
/// (an empty list refuses every call).
fn eperm_rules(degraded: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied() {
        rules.insert(nr, vec![]);
    }
    rules.insert(libc::SYS_socket, socket_rules(degraded)?);
    // socketpair(): only unix stream and seqpacket pairs, in both tiers.
    let mut pair = vec![rule(vec![cond(
        0,
        Len::Dword,
        Op::Ne,
        libc::AF_UNIX as u64,
    )?])?];
    pair.extend(unix_addressed(false)?);
    rules.insert(libc::SYS_socketpair, pair);
    // unshare() and clone() with any namespace flag (all in the low 32
    // bits of the flags, so a 32-bit compare is exact and half the size).
    let ns = |arg: u8| -> Result<Vec<SeccompRule>> {
        NAMESPACE_FLAGS
            .iter()
            .map(|f| rule(vec![cond(arg, Len::Dword, Op::MaskedEq(*f), *f)?]))
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
            rule(vec![cond(1, Len::Dword, Op::Eq, TCXONC)?])?,
        ],
    );
    // TCP Fast Open connects from inside sendto/sendmsg/sendmmsg (flags
    // are the 4th, 3rd and 4th argument): in the degraded tier that reaches
    // any host and port past Landlock's connect rule. Nothing a build needs
    // uses it, so both tiers refuse it.
    for (nr, flags) in [
        (libc::SYS_sendto, 3),
        (libc::SYS_sendmsg, 2),
        (libc::SYS_sendmmsg, 3),
    ] {
        rules.insert(
            nr,
            vec![rule(vec![cond(
                flags,
                Len::Dword,
                Op::MaskedEq(MSG_FASTOPEN),
                MSG_FASTOPEN,
            )?])?],
        );
    }
    // listen() on an unbound TCP socket binds it to an ephemeral port
    // without bind(), past Landlock's bind rule: in the degraded tier (the
    // host's network) anyone could then connect in and receive what the
    // command sends. bind() is refused there for every port and
    // socket(AF_UNIX) too, so listen() has no other use.
    if degraded {
        rules.insert(libc::SYS_listen, vec![]);
        for (nr, conds) in degraded_process_rules()? {
            rules.insert(nr, conds);
        }
    }
    // No setuid or setgid bits: a file the sandbox makes setuid would give
    // its owner's uid (root, when airlock runs as root) to any local user.
    for (nr, mode, flags) in mode_calls() {
        let mut list = vec![];
        for bit in SETID_BITS {
            let has_bit = || cond(mode, Len::Dword, Op::MaskedEq(bit), bit);
            match flags {
                None => list.push(rule(vec![has_bit()?])?),
                Some(f) => {
                    for create in [libc::O_CREAT as u64, O_TMPFILE_BIT] {
                        list.push(rule(vec![
                            cond(f, Len::Dword, Op::MaskedEq(create), create)?,
                            has_bit()?,
                        ])?);
                    }
                }
            }
        }
        rules.insert(nr, list);
    }
    Ok(rules)
}

/// The degraded tier has no PID or IPC namespace: the host's processes
/// of the same user are there to name, and Landlock scopes their signals
/// but not these calls, which the kernel allows between processes of one
/// user (red team round 19: init's RLIMIT_CPU lowered until it died, the
/// watcher's RLIMIT_NOFILE set to 0 so its teardown saw no process left,
/// and the run outlived its timeout). So each may act on the caller only
/// (pid 0: glibc's setrlimit, nice, and the rest use it), or only read.
/// System V IPC and POSIX message queues are the host's (a segment of the
/// user's read and rewritten, one left behind): refused outright.
fn degraded_process_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>> {
    let not_zero = |arg: u8| cond(arg, Len::Dword, Op::Ne, 0);
    let mut out = vec![
        // prlimit64(pid, resource, new, old): another's limits, only read.
        (
            libc::SYS_prlimit64,
            vec![rule(vec![not_zero(0)?, cond(2, Len::Qword, Op::Ne, 0)?])?],
        ),
        // setpriority(which, who, prio): PRIO_PROCESS (0) of ourselves only;
        // PRIO_USER would renice every process of the user.
        (
            libc::SYS_setpriority,
            vec![rule(vec![not_zero(0)?])?, rule(vec![not_zero(1)?])?],
        ),
        // ioprio_set(which, who, ioprio): IOPRIO_WHO_PROCESS (1) of ourselves.
        (
            libc::SYS_ioprio_set,
            vec![
                rule(vec![cond(0, Len::Dword, Op::Ne, 1)?])?,
                rule(vec![not_zero(1)?])?,
            ],
        ),
    ];
    for nr in [
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
    ] {
        out.push((nr, vec![rule(vec![not_zero(0)?])?]));
    }
    for nr in [
        libc::SYS_shmget,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semtimedop,
        libc::SYS_semctl,
        libc::SYS_msgget,
        libc::SYS_msgsnd,
        libc::SYS_msgrcv,
        libc::SYS_msgctl,
        libc::SYS_mq_open,
        libc::SYS_mq_unlink,
        libc::SYS_mq_timedsend,
        libc::SYS_mq_timedreceive,
        libc::SYS_mq_notify,
        libc::SYS_mq_getsetattr,
    ] {
        out.push((nr, vec![]));
    }
    Ok(out)
}

fn program_of(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        ARCH,
    )
    .context("building the seccomp filter")?;
    filter.try_into().context("compiling the seccomp filter")
}

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Stages 1 and 2, written by hand because they are a few range checks (a
/// rule per number would be a linear scan of ~400 compares on every call).
/// A call they let through falls off their end, into stage 3.
fn known_stages() -> BpfProgram {
    const LD_ABS_W: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const JA: u16 = 0x05; // BPF_JMP | BPF_JA
    #[cfg(target_arch = "x86_64")]
    const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let enosys = RET_ERRNO | libc::ENOSYS as u32;
    let [(_, low_end), (high_start, high_end)] = KNOWN;
    let mut p = vec![
        // seccomp_data.arch: anything but this architecture dies.
        bpf(LD_ABS_W, 0, 0, 4),
        bpf(JEQ, 1, 0, AUDIT_ARCH),
        bpf(RET, 0, 0, RET_KILL_PROCESS),
        // seccomp_data.nr
        bpf(LD_ABS_W, 0, 0, 0),
    ];
    #[cfg(target_arch = "x86_64")]
    p.extend([
        bpf(JSET, 0, 1, X32_SYSCALL_BIT),
        bpf(RET, 0, 0, RET_KILL_PROCESS),
    ]);
    p.extend([
        // Stage 1 (jumps count from the next instruction).
        // nr > high_end: ENOSYS.
        bpf(JGE, 2, 0, high_end + 1),
        // high_start <= nr <= high_end: on.
        bpf(JGE, 2, 0, high_start),
        // low_end < nr < high_start: ENOSYS; below: on.
        bpf(JGE, 0, 1, low_end + 1),
        bpf(RET, 0, 0, enosys),
        // Stage 2.
        bpf(JEQ, 2, 0, libc::SYS_clone3 as u32),
        // openat2 takes its mode in a struct the filter cannot read.
        bpf(JEQ, 1, 0, libc::SYS_openat2 as u32),
        bpf(JA, 0, 0, 1), // on to stage 3
        bpf(RET, 0, 0, enosys),
    ]);
    p
}

const RET_ALLOW: u32 = 0x7fff_0000;

/// Between stages 2 and 3: a binary search over the numbers stage 3 has
/// rules for (`keys`, sorted), allowing every other number at once.
/// Stage 3 is a linear scan of about two instructions per rule number;
/// this is about eight compares instead. It also cuts what the kernel does
/// at install time: it runs the program for every syscall number to build
/// its cache of always-allowed calls, with interrupts off, and the walk
/// through stage 3 was most of that. Needs the number in A; falls off its
/// end into stage 3 for a number with rules.
fn no_rule_allows(keys: &[u32]) -> Result<BpfProgram> {
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    /// A compare whose true branch is the end of the tree (stage 3).
    const TO_END: u8 = u8::MAX;
    fn tree(keys: &[u32], out: &mut Vec<sock_filter>) -> Result<()> {
        if keys.len() <= 4 {
            out.extend(keys.iter().map(|&k| bpf(JEQ, TO_END, 0, k)));
            out.push(bpf(RET, 0, 0, RET_ALLOW));
            return Ok(());
        }
        let mid = keys.len() / 2;
        let at = out.len();
        out.push(bpf(JGE, 0, 0, keys[mid]));
        tree(&keys[..mid], out)?;
        out[at].jt = u8::try_from(out.len() - at - 1).context("seccomp search tree too deep")?;
        tree(&keys[mid..], out)
    }
    let mut out = vec![];
    tree(keys, &mut out)?;
    let len = out.len();
    for (i, ins) in out.iter_mut().enumerate() {
        if ins.code == JEQ && ins.jt == TO_END {
            ins.jt = u8::try_from(len - i - 1).context("seccomp search tree too large")?;
        }
    }
    Ok(out)
}

/// The filter, compiled: PID 1 builds it while the helper adds the
/// Landlock rules PID 1 waits for, off the start-up's critical path.
pub struct Filters(BpfProgram);

pub fn compile(degraded: bool) -> Result<Filters> {
    let rules = eperm_rules(degraded)?;
    let keys: Vec<u32> = rules.keys().map(|&nr| nr as u32).collect();
    let mut program = known_stages();
    program.extend(no_rule_allows(&keys)?);
    program.extend(program_of(rules, libc::EPERM)?);
    Ok(Filters(program))
}

impl Filters {
    pub fn install(&self) -> Result<()> {
        seccompiler::apply_filter(&self.0).context("installing the seccomp filter")
    }
}

pub fn install(degraded: bool) -> Result<()> {
    compile(degraded)?.install()
}

/// The rules in words, for `airlock policy profile`.
pub fn describe() -> Vec<String> {
    let [(lo_start, lo_end), (hi_start, hi_end)] = KNOWN;
    let mut out: Vec<String> = denied()
        .iter()
        .map(|(n, _)| format!("EPERM  {n}"))
        .collect();
    out.push("EPERM  socket(family not in AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)".into());
    out.push("EPERM  socket(AF_NETLINK, protocol != NETLINK_ROUTE)".into());
    out.push("EPERM  socket(type SOCK_RAW or SOCK_PACKET)".into());
    out.push(
        "EPERM  socket(AF_INET/AF_INET6) other than SOCK_STREAM with protocol 0/IPPROTO_TCP \
         or SOCK_DGRAM with protocol 0/IPPROTO_UDP (MPTCP, SCTP, UDP-Lite, DCCP, SMC, ping, \
         SEQPACKET, RDM)"
            .into(),
    );
    out.push("EPERM  unshare/clone with CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}".into());
    out.push("EPERM  personality(anything but PER_LINUX or a query)".into());
    out.push("EPERM  ioctl(TIOCSTI), ioctl(TIOCLINUX), ioctl(TCXONC) (low 32 bits)".into());
    out.push(
        "EPERM  S_ISUID/S_ISGID in the mode of chmod, fchmod, fchmodat, fchmodat2, mkdir, \
         mkdirat, mknod, mknodat, creat, and open/openat with O_CREAT or O_TMPFILE"
            .into(),
    );
    out.push(
        "EPERM  socket/socketpair(AF_UNIX) of any type but SOCK_STREAM and SOCK_SEQPACKET (a \
         datagram socket, SOCK_RAW included, sends to any path without connect()); socketpair \
         of any other family"
            .into(),
    );
    out.push(
        "NOTIFY connect(): performed by the helper; a unix socket outside the sandbox (no listener \
         of the sandbox's) is refused unless [filesystem] unix_sockets grants it"
            .into(),
    );
    out.push(
        "EPERM  sendto/sendmsg/sendmmsg with MSG_FASTOPEN (a TCP connect without connect())".into(),
    );
    out.push("ENOSYS clone3, openat2 (libc falls back to clone, openat)".into());
    out.push(format!(
        "ENOSYS every syscall number outside the reviewed {lo_start}-{lo_end} and {hi_start}-{hi_end}"
    ));
    #[cfg(target_arch = "x86_64")]
    out.push("KILL   any other architecture, and the x32 ABI (nr & 0x40000000)".into());
    #[cfg(not(target_arch = "x86_64"))]
    out.push("KILL   any other architecture".into());
    out.push(
        "degraded tier only: EPERM socket(AF_UNIX) (stream socketpairs stay), no connect() notification, socket(AF_INET/AF_INET6, SOCK_DGRAM), \
         listen (it would bind an ephemeral port past Landlock's bind rule)"
            .into(),
    );
    out.push(
        "degraded tier only: EPERM prlimit64 setting another process's limits, setpriority          and ioprio_set of anything but the caller, sched_setaffinity/setscheduler/setparam/setattr          of another pid (the host's processes of the same user are there to name), System V IPC          (shm*, sem*, msg*) and POSIX message queues (mq_*), which are the host's"
            .into(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions the program uses:
    /// the filter as the kernel runs it, on one call.
    fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            pc += 1;
            let jump = |cond: bool| if cond { i.jt as usize } else { i.jf as usize };
            match i.code {
                0x20 => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                0x54 => acc &= i.k,
                0x05 => pc += i.k as usize,
                0x15 => pc += jump(acc == i.k),
                0x25 => pc += jump(acc > i.k),
                0x35 => pc += jump(acc >= i.k),
                0x45 => pc += jump(acc & i.k != 0),
                0x06 => return i.k,
                code => panic!("instruction {code:#x} not interpreted"),
            }
        }
    }

    const ALLOW: u32 = 0x7fff_0000;
    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    /// socket()'s rules as SPEC §4.1 words them, to hold the compiled
    /// program to.
    fn socket_refused(degraded: bool, family: i32, ty: i32, protocol: i32) -> bool {
        let ty = ty & 0xf;
        let inet = family == libc::AF_INET || family == libc::AF_INET6;
        ![
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
        ]
        .contains(&family)
            || (family == libc::AF_NETLINK && protocol != libc::NETLINK_ROUTE)
            || ty == libc::SOCK_RAW
            || ty == 10
            || (inet && ty != libc::SOCK_STREAM && ty != libc::SOCK_DGRAM)
            || (inet && ty == libc::SOCK_STREAM && ![0, libc::IPPROTO_TCP].contains(&protocol))
            || (inet
                && ty == libc::SOCK_DGRAM
                && (degraded || ![0, libc::IPPROTO_UDP].contains(&protocol)))
            || (family == libc::AF_UNIX && (degraded || !unix_pair_type(ty)))
    }

    /// The unix types that ignore addresses (SOCK_RAW is a datagram one).
    fn unix_pair_type(ty: i32) -> bool {
        ty == libc::SOCK_STREAM || ty == libc::SOCK_SEQPACKET
    }

    /// `nr` (socket or socketpair) over every family, type 0-15, flag set
    /// and protocol given, in both tiers: refused exactly where `refused`
    /// (degraded, family, type, protocol) says.
    fn sweep(
        nr: i64,
        families: &[i32],
        flag_sets: &[i32],
        protocols: &[i32],
        refused: impl Fn(bool, i32, i32, i32) -> bool,
    ) {
        for degraded in [false, true] {
            let program = compile(degraded).unwrap().0;
            for &family in families {
                for ty in 0..16 {
                    for &flags in flag_sets {
                        for &protocol in protocols {
                            let args = [family as u64, (ty | flags) as u64, protocol as u64];
                            let got = run(
                                &program,
                                nr as u32,
                                AUDIT_ARCH,
                                [args[0], args[1], args[2], 0, 0, 0],
                            );
                            let want = if refused(degraded, family, ty, protocol) {
                                EPERM
                            } else {
                                ALLOW
                            };
                            assert_eq!(
                                got, want,
                                "degraded={degraded} nr {nr}({family}, {ty}|{flags:#x}, {protocol})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn socketpair_gives_only_unix_stream_and_seqpacket_pairs() {
        sweep(
            libc::SYS_socketpair,
            &[
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                30,
            ],
            &[0, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 1 << 20],
            &[0],
            |_, family, ty, _| !(family == libc::AF_UNIX && unix_pair_type(ty)),
        );
    }

    #[test]
    fn socket_is_refused_exactly_where_the_rules_say() {
        sweep(
            libc::SYS_socket,
            &[
                libc::AF_UNIX,
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                libc::AF_PACKET,
                libc::AF_BLUETOOTH,
                libc::AF_VSOCK,
                43, // AF_SMC
                44, // AF_XDP
            ],
            &[0, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC],
            &[0, 1, 6, 17, 33, 58, 132, 136, 256, 262],
            socket_refused,
        );
    }

    /// The search tree changes no answer: every number, with arguments
    /// that take each rule's both ways, against the stages without it.
    #[test]
    fn the_search_tree_answers_as_the_linear_rules_do() {
        for degraded in [false, true] {
            let program = compile(degraded).unwrap().0;
            let mut linear = known_stages();
            linear.extend(program_of(eperm_rules(degraded).unwrap(), libc::EPERM).unwrap());
            assert!(program.len() > linear.len());
            let args: &[[u64; 6]] = &[
                [0; 6],
                [u64::MAX; 6],
                [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
                [libc::AF_UNIX as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0],
                [3, 0o4755, 0o4755, 0o4755, 0, 0],
                [0, 0, libc::O_CREAT as u64, 0o6755, 0, 0],
                [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
                [0, TIOCSTI, TIOCSTI, 0, 0, 0],
                [0, 0, 0, MSG_FASTOPEN, MSG_FASTOPEN, 0],
            ];
            for nr in 0..600 {
                for a in args {
                    assert_eq!(
                        run(&program, nr, AUDIT_ARCH, *a),
                        run(&linear, nr, AUDIT_ARCH, *a),
                        "degraded={degraded} nr {nr} {a:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_numbers_get_enosys_and_a_foreign_architecture_dies() {
        let program = compile(false).unwrap().0;
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        let [(_, low_end), (high_start, high_end)] = KNOWN;
        for (nr, want) in [
            (libc::SYS_read as u32, ALLOW),
            (low_end, ALLOW),
            (low_end + 1, enosys),
            (high_start - 1, enosys),
            (high_start, ALLOW),
            (high_end, ALLOW),
            (high_end + 1, enosys),
            (libc::SYS_clone3 as u32, enosys),
            (libc::SYS_mount as u32, EPERM),
        ] {
            assert_eq!(run(&program, nr, AUDIT_ARCH, [0; 6]), want, "nr {nr}");
        }
        assert_eq!(run(&program, 0, 0x4000_0003, [0; 6]), RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(&program, X32_SYSCALL_BIT, AUDIT_ARCH, [0; 6]),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn setid_bits_are_refused_and_plain_modes_are_not() {
        let program = compile(false).unwrap().0;
        let openat = libc::SYS_openat as u32;
        let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
        for (nr, args, want) in [
            (libc::SYS_fchmod as u32, [3, 0o4755, 0, 0, 0, 0], EPERM),
            (libc::SYS_fchmod as u32, [3, 0o2755, 0, 0, 0, 0], EPERM),
            (libc::SYS_fchmod as u32, [3, 0o755, 0, 0, 0, 0], ALLOW),
            (openat, [0, 0, creat, 0o4755, 0, 0], EPERM),
            (openat, [0, 0, creat, 0o644, 0, 0], ALLOW),
            // Without O_CREAT the mode is not read.
            (openat, [0, 0, 0, 0o4755, 0, 0], ALLOW),
            (libc::SYS_mkdirat as u32, [0, 0, 0o2775, 0, 0, 0], EPERM),
        ] {
            assert_eq!(run(&program, nr, AUDIT_ARCH, args), want, "{nr} {args:?}");
        }
    }

    #[test]
    fn the_degraded_tier_acts_on_no_other_process() {
        let degraded = compile(true).unwrap().0;
        let full = compile(false).unwrap().0;
        let nr = |n: i64| n as u32;
        for (n, args, want) in [
            // setrlimit (pid 0) and reading another's limits pass.
            (libc::SYS_prlimit64, [0, 7, 0x7000, 0, 0, 0], ALLOW),
            (libc::SYS_prlimit64, [42, 7, 0, 0x7000, 0, 0], ALLOW),
            (libc::SYS_prlimit64, [42, 7, 0x7000, 0, 0, 0], EPERM),
            (libc::SYS_prlimit64, [42, 7, 1 << 40, 0, 0, 0], EPERM),
            (libc::SYS_setpriority, [0, 0, 10, 0, 0, 0], ALLOW),
            (libc::SYS_setpriority, [0, 42, 10, 0, 0, 0], EPERM),
            (libc::SYS_setpriority, [2, 0, 10, 0, 0, 0], EPERM),
            (libc::SYS_ioprio_set, [1, 0, 0, 0, 0, 0], ALLOW),
            (libc::SYS_ioprio_set, [3, 0, 0, 0, 0, 0], EPERM),
            (libc::SYS_ioprio_set, [1, 42, 0, 0, 0, 0], EPERM),
            (libc::SYS_sched_setaffinity, [0, 8, 0x7000, 0, 0, 0], ALLOW),
            (
                libc::SYS_sched_setscheduler,
                [42, 5, 0x7000, 0, 0, 0],
                EPERM,
            ),
            (libc::SYS_sched_setattr, [42, 0x7000, 0, 0, 0, 0], EPERM),
            (libc::SYS_shmget, [0, 4096, 0o1600, 0, 0, 0], EPERM),
            (libc::SYS_mq_open, [0x7000, 0o100, 0o600, 0, 0, 0], EPERM),
        ] {
            assert_eq!(
                run(&degraded, nr(n), AUDIT_ARCH, args),
                want,
                "{n} {args:?}"
            );
        }
        // The full tier's PID and IPC namespaces hold only the sandbox.
        for (n, args) in [
            (libc::SYS_prlimit64, [42, 7, 0x7000, 0, 0, 0]),
            (libc::SYS_setpriority, [2, 0, 10, 0, 0, 0]),
            (libc::SYS_shmget, [0, 4096, 0o1600, 0, 0, 0]),
        ] {
            assert_eq!(run(&full, nr(n), AUDIT_ARCH, args), ALLOW, "{n} {args:?}");
        }
    }

    #[test]
    fn no_namespace_flag_passes_clone_or_unshare() {
        let program = compile(false).unwrap().0;
        for nr in [libc::SYS_clone as u32, libc::SYS_unshare as u32] {
            for flag in NAMESPACE_FLAGS {
                for high in [0, 1 << 32, u64::MAX << 32] {
                    let flags = flag | high | libc::SIGCHLD as u64;
                    assert_eq!(run(&program, nr, AUDIT_ARCH, [flags, 0, 0, 0, 0, 0]), EPERM);
                }
            }
            let thread = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_FILES) as u64;
            assert_eq!(
                run(&program, nr, AUDIT_ARCH, [thread, 0, 0, 0, 0, 0]),
                ALLOW
            );
        }
    }
}
