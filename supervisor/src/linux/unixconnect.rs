//! Every `connect()` in the sandbox, decided outside it (SPEC §4.6, host
//! unix sockets). The mask of `sockets.rs` covers the host sockets that
//! `/proc/net/unix` names when the run starts; it cannot see one bound
//! later, one bound by a relative path (listed as given to bind), one whose
//! directory was renamed since, or a second hard link. This layer covers
//! those: a seccomp user notification stops each `connect()` in the full
//! tier, and the supervisor (outside every namespace, Landlock and seccomp
//! of the sandbox) performs it on the caller's behalf:
//!
//! - the caller's socket comes over with `pidfd_getfd` (a socket keeps its
//!   own network namespace), its address is copied once out of the caller's
//!   memory, and the supervisor connects that same socket with its copy:
//!   nothing the caller changes afterwards (the address buffer, the
//!   descriptor number, a path) reaches the kernel;
//! - a pathname is resolved once, as the caller sees it (`openat2` with
//!   RESOLVE_IN_ROOT under `/proc/PID/root`, relative paths from its working
//!   directory), pinned with `O_PATH`, and reached through that handle;
//! - it may be connected when the policy grants it (`unix_sockets`) or when
//!   the sandbox bound it: sock_diag, through a netlink socket PID 1 made in
//!   the sandbox's network namespace, lists the sockets bound there with
//!   the file each is bound to; with `--network host` that namespace is the
//!   host's, so a process of the sandbox's PID namespace must also hold the
//!   socket. Otherwise ECONNREFUSED, as for a socket nobody listens on. No
//!   connection is made to find out (a listener would see it). Abstract
//!   addresses live in the sandbox's own network namespace, except with
//!   `--network host`, where the same check applies to them.
//!
//! Cost: a notification round trip, a hand-over to a waiting worker thread
//! and, for a unix path, one sock_diag dump per connect (tens of
//! microseconds in the sandbox's own namespace). Consequences: a listener inside sees the supervisor as its
//! peer (`SO_PEERCRED` pid 0 there); seccomp refuses unix datagram
//! sockets, which could send to any path without connect().

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::plan::{Net, Plan};

const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_USER_NOTIF_FLAG_CONTINUE: u32 = 1;
const NOTIF_RECV: libc::c_ulong = 0xc050_2100;
const NOTIF_SEND: libc::c_ulong = 0xc018_2101;
const NOTIF_ID_VALID: libc::c_ulong = 0x4008_2102;
/// pidfd_open for a thread (Linux 6.9): the notification names a thread.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct SeccompData {
    nr: i32,
    arch: u32,
    ip: u64,
    args: [u64; 6],
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Notif {
    id: u64,
    pid: u32,
    flags: u32,
    data: SeccompData,
}

#[repr(C)]
struct NotifResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

fn os_err() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// In PID 1, after the other filters: every connect() goes to the helper.
/// Returns the listener descriptor to pass to it.
pub fn install(writes: bool) -> Result<OwnedFd> {
    let prog = program(writes);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: a valid program; the kernel copies it. The architecture was
    // checked by the allow-list filter installed before this one.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("installing the connect() filter");
    }
    // SAFETY: the kernel just returned this descriptor to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    set_cloexec(fd.as_raw_fd());
    Ok(fd)
}

/// The filter: every connect(), and every call that means to write
/// (`fsrefusals.rs`: an open only with a write flag), to the supervisor;
/// everything else allowed.
fn program(writes: bool) -> Vec<libc::sock_filter> {
    const LD_ABS_W: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut p = vec![ins(LD_ABS_W, 0, 0, 0)]; // seccomp_data.nr
    p.push(ins(JEQ_K, 0, 1, libc::SYS_connect as u32));
    p.push(ins(RET_K, 0, 0, SECCOMP_RET_USER_NOTIF));
    if !writes {
        p.push(ins(RET_K, 0, 0, SECCOMP_RET_ALLOW));
        return p;
    }
    for (nr, arg) in super::fsrefusals::open_flags() {
        // The low word of the flags argument (little-endian).
        let off = 16 + 8 * arg as u32;
        p.push(ins(JEQ_K, 0, 4, nr as u32));
        p.push(ins(LD_ABS_W, 0, 0, off));
        p.push(ins(JSET_K, 0, 1, super::fsrefusals::WRITE_FLAGS));
        p.push(ins(RET_K, 0, 0, SECCOMP_RET_USER_NOTIF));
        p.push(ins(RET_K, 0, 0, SECCOMP_RET_ALLOW));
    }
    let opens: Vec<i64> = super::fsrefusals::open_flags()
        .iter()
        .map(|(n, _)| *n)
        .collect();
    for c in super::fsrefusals::calls()
        .into_iter()
        .filter(|c| !opens.contains(&c.nr))
    {
        p.push(ins(JEQ_K, 0, 1, c.nr as u32));
        p.push(ins(RET_K, 0, 0, SECCOMP_RET_USER_NOTIF));
    }
    p.push(ins(RET_K, 0, 0, SECCOMP_RET_ALLOW));
    p
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// What the supervisor needs to decide.
struct Decider {
    /// sock_diag in the sandbox's network namespace (from PID 1).
    diag: OwnedFd,
    /// `(dev, ino)` of every socket `unix_sockets` grants.
    granted: Vec<(u64, u64)>,
    /// `pid:[…]` of the sandbox's PID namespace.
    sandbox_ns: String,
    /// Abstract names are the sandbox's own unless it shares the host's network.
    host_net: bool,
    /// What the plan grants, for the writes it watches.
    fs: super::fsrefusals::Rules,
}

fn readlink(p: &str) -> Option<String> {
    Some(std::fs::read_link(p).ok()?.to_string_lossy().into_owned())
}

/// Before the sandbox starts: reading a caller's address and descriptor
/// needs ptrace access to the sandbox's processes, which Yama's scope 2
/// leaves to CAP_SYS_PTRACE and scope 3 to nobody; every connect() would
/// then fail.
pub fn check_ptrace() -> Result<()> {
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if yama >= 3 || (yama == 2 && !root) {
        anyhow::bail!(
            "kernel.yama.ptrace_scope is {yama}: airlock cannot decide the sandbox's connect() calls \
             (it reads their arguments as a parent may at scope 1); set it to 1{}",
            if yama == 2 { " or run as root" } else { "" }
        );
    }
    Ok(())
}

/// In the supervisor, once the sandbox's PID 1 has sent the listener:
/// serve the notifications on a thread of their own.
pub fn serve(plan: &Plan, fd: OwnedFd, diag: OwnedFd, pid_ns: &OwnedFd) -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let granted = plan
        .unix_sockets
        .iter()
        .filter_map(|p| {
            let m = std::fs::metadata(p).ok()?;
            m.file_type().is_socket().then(|| (m.dev(), m.ino()))
        })
        .collect();
    // As /proc/<pid>/ns/pid reads for the sandbox's processes.
    let sandbox_ns = nix::sys::stat::fstat(pid_ns.as_fd())
        .map(|st| format!("pid:[{}]", st.st_ino))
        .context("reading the sandbox's PID namespace")?;
    let ctx = Arc::new(Decider {
        diag,
        granted,
        sandbox_ns,
        host_net: plan.net == Net::Host,
        fs: super::fsrefusals::Rules::of(plan),
    });
    // Linux ≥ 6.6: the waiting thread is woken on this CPU, not
    // scheduled (every write in the sandbox waits for us).
    const NOTIF_SET_FLAGS: libc::c_ulong = 0x4008_2104;
    const FD_SYNC_WAKE_UP: u64 = 1;
    // SAFETY: an ioctl on our listener reading one u64; failure (an older
    // kernel) leaves the ordinary wake-up.
    unsafe { libc::ioctl(fd.as_raw_fd(), NOTIF_SET_FLAGS, &FD_SYNC_WAKE_UP) };
    std::thread::Builder::new()
        .name("connect".into())
        .spawn(move || receive(fd, ctx))
        .context("starting the connect() thread")?;
    Ok(())
}

fn receive(fd: OwnedFd, ctx: Arc<Decider>) {
    let fd = Arc::new(fd);
    let mut pool = super::workers::Pool::new("connect-worker", MAX_THREADS);
    loop {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
            if os_err() == libc::EINTR {
                continue;
            }
            return;
        }
        if pfd.revents & libc::POLLIN == 0 {
            return; // POLLHUP: every sandbox process is gone
        }
        let mut req = Notif::default();
        // SAFETY: NOTIF_RECV fills a zeroed seccomp_notif.
        if unsafe { libc::ioctl(fd.as_raw_fd(), NOTIF_RECV, &mut req) } != 0 {
            match os_err() {
                // The caller was interrupted, or a signal reached us.
                libc::EINTR | libc::ENOENT => continue,
                _ => return, // every sandbox process is gone
            }
        }
        if req.data.nr as i64 != libc::SYS_connect {
            // A write: its path copied, the call let go at once (Landlock
            // decides), then judged and noted while it runs.
            let seen = super::fsrefusals::copy_paths(req.pid, req.data.nr as i64, &req.data.args);
            // Counted before the call goes on: the command cannot end,
            // and the report be made, before this one is noted.
            let judging = super::fsrefusals::Judging::start();
            let resp = NotifResp {
                id: req.id,
                val: 0,
                error: 0,
                flags: SECCOMP_USER_NOTIF_FLAG_CONTINUE,
            };
            // SAFETY: NOTIF_SEND reads a seccomp_notif_resp.
            unsafe { libc::ioctl(fd.as_raw_fd(), NOTIF_SEND, &resp) };
            if let Some(seen) = seen {
                super::fsrefusals::note(&ctx.fs, &seen);
            }
            drop(judging);
            continue;
        }
        // A worker each (workers.rs), so that a blocking connect does not
        // hold up the others. Past the bound (a sandbox that floods
        // connects), or when no thread can start, answered here, in order.
        let (fd2, ctx2) = (fd.clone(), ctx.clone());
        if let Some(req) = pool.hand(req, move |req| respond(&fd2, &ctx2, &req)) {
            respond(&fd, &ctx, &req);
        }
    }
}

/// Connects performed at once, each on a worker of its own.
const MAX_THREADS: usize = 64;

fn respond(fd: &OwnedFd, ctx: &Decider, req: &Notif) {
    let (val, error) = match handle(fd, ctx, req) {
        Ok(v) => (v, 0),
        Err(e) => (0, -e),
    };
    let resp = NotifResp {
        id: req.id,
        val,
        error,
        flags: 0,
    };
    // SAFETY: NOTIF_SEND reads a seccomp_notif_resp; ENOENT (the caller
    // went away) needs nothing more.
    unsafe { libc::ioctl(fd.as_raw_fd(), NOTIF_SEND, &resp) };
}

fn check(r: libc::c_long) -> std::result::Result<libc::c_long, i32> {
    if r < 0 {
        Err(os_err())
    } else {
        Ok(r)
    }
}

fn owned(r: libc::c_long) -> std::result::Result<OwnedFd, i32> {
    // SAFETY: a descriptor the kernel just returned to this process.
    check(r).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Perform one connect(); Ok(return value) or Err(errno).
fn handle(listener: &OwnedFd, ctx: &Decider, req: &Notif) -> std::result::Result<i64, i32> {
    let [sockfd, addr_ptr, addr_len, ..] = req.data.args;
    // Before Linux 6.9 only a thread-group leader has a pidfd (EINVAL for
    // the flag): learnt once, not paid for on every connect().
    static NO_THREAD_PIDFD: AtomicBool = AtomicBool::new(false);
    let thread_pidfd = || -> std::result::Result<OwnedFd, i32> {
        if NO_THREAD_PIDFD.load(Ordering::Relaxed) {
            return Err(libc::EINVAL);
        }
        // SAFETY: pidfd_open on a pid from the notification; checked below.
        owned(unsafe { libc::syscall(libc::SYS_pidfd_open, req.pid, PIDFD_THREAD) }).inspect_err(
            |e| {
                if *e == libc::EINVAL {
                    NO_THREAD_PIDFD.store(true, Ordering::Relaxed);
                }
            },
        )
    };
    let pidfd = thread_pidfd()
        // SAFETY: as above.
        .or_else(|_| owned(unsafe { libc::syscall(libc::SYS_pidfd_open, req.pid, 0) }))?;
    // The pid might have been reused before pidfd_open: the notification is
    // still pending only while that very thread waits in it.
    // SAFETY: NOTIF_ID_VALID reads a u64.
    if unsafe { libc::ioctl(listener.as_raw_fd(), NOTIF_ID_VALID, &req.id) } != 0 {
        return Err(libc::EINTR);
    }
    // SAFETY: pidfd_getfd copies the caller's descriptor into ours.
    let sock = owned(unsafe {
        libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), sockfd as i32, 0)
    })?;
    let len = (addr_len as usize).min(std::mem::size_of::<libc::sockaddr_un>());
    let mut buf = [0u8; std::mem::size_of::<libc::sockaddr_un>()];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr_ptr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: reads at most `len` bytes of the caller's memory into `buf`.
    let got = unsafe { libc::process_vm_readv(req.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if len > 0 && got != len as isize {
        return Err(libc::EFAULT);
    }
    let family = u16::from_ne_bytes([buf[0], buf[1]]);
    if len < 2 || family != libc::AF_UNIX as u16 || domain(&sock)? != libc::AF_UNIX {
        // Not a unix address (a unix socket refuses one, and another
        // family's socket refuses a unix address): the caller's own call.
        return connect_raw(&sock, &buf[..len]);
    }
    let path = &buf[2..len];
    let path = &path[..path.iter().position(|b| *b == 0).unwrap_or(path.len())];
    if len == 2 || (buf[2] == 0 && !ctx.host_net) {
        // Unnamed, or abstract in the sandbox's own network namespace.
        return connect_raw(&sock, &buf[..len]);
    }
    if buf[2] == 0 {
        // Abstract, on the host's network: only a listener of the sandbox.
        if !bound_inside(ctx, None, Some(&buf[2..len]))? {
            tracing::debug!("refused connect() to a host abstract socket");
            return Err(libc::ECONNREFUSED);
        }
        return connect_raw(&sock, &buf[..len]);
    }
    let pin = pin(req.pid, path)?;
    let Ok(st) = nix::sys::stat::fstat(&pin) else {
        return Err(libc::EIO);
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(libc::ECONNREFUSED);
    }
    let via = format!("/proc/self/fd/{}", pin.as_raw_fd());
    let granted = ctx.granted.contains(&(st.st_dev, st.st_ino));
    if !granted && !bound_inside(ctx, Some((st.st_dev, st.st_ino)), None)? {
        tracing::debug!(
            path = %String::from_utf8_lossy(path),
            "refused connect() to a unix socket outside the sandbox"
        );
        return Err(libc::ECONNREFUSED);
    }
    connect_path(&sock, &via)
}

fn domain(sock: &OwnedFd) -> std::result::Result<i32, i32> {
    let mut v: libc::c_int = 0;
    let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into an int.
    check(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut v as *mut libc::c_int).cast(),
            &mut l,
        )
    } as libc::c_long)?;
    Ok(v)
}

fn connect_raw(sock: &OwnedFd, addr: &[u8]) -> std::result::Result<i64, i32> {
    // SAFETY: connect with our own copy of the caller's address.
    check(unsafe {
        libc::connect(
            sock.as_raw_fd(),
            addr.as_ptr().cast(),
            addr.len() as libc::socklen_t,
        )
    } as libc::c_long)
}

/// Connect to `path`: `/proc/self/fd/N` of a handle `pin` opened.
fn connect_path(sock: &OwnedFd, path: &str) -> std::result::Result<i64, i32> {
    // SAFETY: sockaddr_un is plain old data.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as libc::c_char;
    }
    let len = 2 + path.len();
    // SAFETY: a valid sockaddr_un of `len` bytes.
    check(unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    } as libc::c_long)
}

/// Open the caller's path once, as the caller would resolve it: in its
/// root (its mount namespace), relative paths from its working directory.
fn pin(pid: u32, path: &[u8]) -> std::result::Result<OwnedFd, i32> {
    let mut full = Vec::new();
    if path.first() != Some(&b'/') {
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(|_| libc::ENOENT)?;
        full.extend_from_slice(cwd.as_os_str().as_bytes());
        full.push(b'/');
    }
    full.extend_from_slice(path);
    let c = CString::new(full).map_err(|_| libc::EINVAL)?;
    let root = CString::new(format!("/proc/{pid}/root")).map_err(|_| libc::EINVAL)?;
    // SAFETY: open with a NUL-terminated path.
    let root = owned(unsafe {
        libc::open(
            root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    } as libc::c_long)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        // The caller's "/" is `root`; /proc magic links would name our
        // processes, not the caller's.
        resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    // With RESOLVE_IN_ROOT, a `..` resolved while anything on the system
    // is renamed or mounted fails with EAGAIN (the kernel cannot be sure
    // it stayed inside): retried, a bounded number of times.
    let mut tries = 0;
    loop {
        // SAFETY: openat2 with a valid open_how of its own size.
        let r = owned(unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        });
        match r {
            Err(libc::EAGAIN) if tries < 64 => tries += 1,
            r => return r,
        }
    }
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// A bound unix socket of the sandbox's network namespace, as sock_diag
/// lists it: its socket inode, and the file it is bound to or its abstract name.
struct Bound {
    ino: u32,
    vfs: Option<(u64, u64)>,
    name: Option<Vec<u8>>,
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const UDIAG_SHOW_NAME: u32 = 0x1;
const UDIAG_SHOW_VFS: u32 = 0x2;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_VFS: u16 = 1;

/// In PID 1, before seccomp: a sock_diag socket of the sandbox's network
/// namespace, for the supervisor to list the unix sockets bound there.
pub fn diag_socket() -> Result<OwnedFd> {
    // SAFETY: a new socket of our own.
    owned(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    } as libc::c_long)
    .map_err(std::io::Error::from_raw_os_error)
    .context("opening a sock_diag socket")
}

/// Every unix socket bound in the diag socket's network namespace.
fn bound(diag: &OwnedFd) -> std::result::Result<Vec<Bound>, i32> {
    const LEN: usize = 16 + 24;
    let mut req = [0u8; LEN];
    req[0..4].copy_from_slice(&(LEN as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    // unix_diag_req: family, protocol, pad, states, ino, show, cookie.
    req[16] = libc::AF_UNIX as u8;
    // Listening sockets only: a connection accepted from a listener
    // carries the listener's name and file too, and holding one (a
    // sandbox whose stdio is such a connection) must not make the host's
    // listener look like the sandbox's own.
    req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    req[28..32].copy_from_slice(&(UDIAG_SHOW_NAME | UDIAG_SHOW_VFS).to_ne_bytes());
    // One dump at a time per socket: the answers would interleave.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: send a complete request from our buffer.
    check(
        unsafe { libc::send(diag.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } as libc::c_long,
    )?;
    let mut out = vec![];
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: receive into our buffer.
        let n = check(
            unsafe { libc::recv(diag.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) }
                as libc::c_long,
        )? as usize;
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap_or_default()) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            if len < 16 || off + len > n {
                return Err(libc::EIO);
            }
            match ty {
                3 => return Ok(out),        // NLMSG_DONE
                2 => return Err(libc::EIO), // NLMSG_ERROR
                SOCK_DIAG_BY_FAMILY => out.extend(parse_bound(&buf[off + 16..off + len])),
                _ => {}
            }
            off += (len + 3) & !3;
        }
    }
}

/// One unix_diag_msg and its attributes.
/// The kernel's sk_state of a listening socket (unix sockets reuse TCP's).
const TCP_LISTEN: u32 = 10;

fn parse_bound(msg: &[u8]) -> Option<Bound> {
    // unix_diag_msg: family, type, state, pad, ino, cookie.
    if u32::from(*msg.get(2)?) != TCP_LISTEN {
        return None;
    }
    let ino = u32::from_ne_bytes(msg.get(4..8)?.try_into().ok()?);
    let mut b = Bound {
        ino,
        vfs: None,
        name: None,
    };
    let mut off = 16;
    while off + 4 <= msg.len() {
        let len = u16::from_ne_bytes([msg[off], msg[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([msg[off + 2], msg[off + 3]]);
        let body = msg.get(off + 4..off + len.max(4))?;
        match ty {
            UNIX_DIAG_VFS if body.len() >= 8 => {
                let vino = u32::from_ne_bytes(body[0..4].try_into().ok()?);
                let kdev = u32::from_ne_bytes(body[4..8].try_into().ok()?);
                // The kernel's dev_t (major << 20 | minor), as stat() shows it.
                let dev = libc::makedev(kdev >> 20, kdev & 0xfffff);
                b.vfs = Some((dev, u64::from(vino)));
            }
            UNIX_DIAG_NAME => b.name = Some(body.to_vec()),
            _ => {}
        }
        off += (len + 3) & !3;
        if len == 0 {
            break;
        }
    }
    Some(b)
}

/// Whether a process of the sandbox's PID namespace holds socket `ino`.
fn held_inside(ctx: &Decider, ino: u32) -> bool {
    crate::procfs::pids()
        .into_iter()
        .filter(|pid| readlink(&format!("/proc/{pid}/ns/pid")).as_deref() == Some(&ctx.sandbox_ns))
        .any(|pid| crate::procfs::holds_socket(pid, ino))
}

/// Whether sock_diag, which reports the low 32 bits of a socket file's
/// inode number, names the file numbered `ino` and no other: a file past
/// 2^32 (XFS over a terabyte, CephFS, NFS, overlayfs with xino) shares its
/// low bits with others on its filesystem, which the sandbox could bind
/// until one matches a host socket's.
fn diag_can_name(ino: u64) -> bool {
    ino <= u64::from(u32::MAX)
}

/// Whether the socket bound at `vfs` (a path) or as `name` (abstract) is
/// the sandbox's: bound in its network namespace and, when that is the
/// host's, held by one of its processes. No connection is made to find out.
fn bound_inside(
    ctx: &Decider,
    vfs: Option<(u64, u64)>,
    name: Option<&[u8]>,
) -> std::result::Result<bool, i32> {
    if let Some((_, ino)) = vfs {
        if !diag_can_name(ino) {
            // Once a run: the sandbox chooses how often it tries.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            let said = SAID.swap(true, std::sync::atomic::Ordering::Relaxed);
            if said {
                tracing::debug!(ino, "unix socket past 32-bit inode numbers refused");
                return Ok(false);
            }
            tracing::warn!(
                ino,
                "a unix socket whose inode number needs more than 32 bits cannot be told from \
                 another on its filesystem (sock_diag reports 32): refused unless \
                 [filesystem] unix_sockets grants it"
            );
            return Ok(false);
        }
    }
    let list = bound(&ctx.diag)?;
    let matches = |b: &Bound| match (vfs, name) {
        (Some(v), _) => b.vfs == Some(v),
        (None, Some(n)) => b.name.as_deref() == Some(n),
        (None, None) => false,
    };
    Ok(list
        .iter()
        .filter(|b| matches(b))
        .any(|b| !ctx.host_net || held_inside(ctx, b.ino)))
}

#[cfg(test)]
mod diag_tests {
    use super::diag_can_name;

    #[test]
    fn only_inode_numbers_that_fit_in_32_bits_are_matched() {
        assert!(diag_can_name(1));
        assert!(diag_can_name(u64::from(u32::MAX)));
        // 2^32 + 149 shares its low 32 bits with inode 149.
        assert!(!diag_can_name((1 << 32) + 149));
        assert!(!diag_can_name(u64::MAX));
    }
}
