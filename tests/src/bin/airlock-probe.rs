//! A small program the escape suite runs *inside* the sandbox to try the
//! attacks the sandbox must refuse. It prints one `name: ok` or
//! `name: <errno name>` line per attempt and never decides pass or fail.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn errno_name(e: i32) -> String {
    match e {
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        libc::ENOSYS => "ENOSYS".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::ENOENT => "ENOENT".into(),
        libc::ECONNREFUSED => "ECONNREFUSED".into(),
        libc::ENETUNREACH => "ENETUNREACH".into(),
        libc::EAFNOSUPPORT => "EAFNOSUPPORT".into(),
        other => format!("errno {other}"),
    }
}

fn report(name: &str, r: i64) {
    if r < 0 {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        println!("{name}: {}", errno_name(e));
    } else {
        println!("{name}: ok");
    }
}

fn io_result<T>(name: &str, r: std::io::Result<T>) {
    match r {
        Ok(_) => println!("{name}: ok"),
        Err(e) => match e.raw_os_error() {
            Some(n) => println!("{name}: {}", errno_name(n)),
            None => println!("{name}: {e}"),
        },
    }
}

/// Each refused syscall, called with harmless arguments.
fn syscalls() {
    // SAFETY: every call below either fails or creates a resource this
    // short-lived process never uses; arguments are valid or null.
    unsafe {
        let mut params = [0u8; 120];
        report(
            "io_uring_setup",
            libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()),
        );
        report(
            "keyctl",
            libc::syscall(
                libc::SYS_keyctl,
                0,  /* KEYCTL_GET_KEYRING_ID */
                -3, /* session */
                0,
            ),
        );
        report(
            "add_key",
            libc::syscall(
                libc::SYS_add_key,
                c"user".as_ptr(),
                c"x".as_ptr(),
                c"v".as_ptr(),
                1,
                -3,
            ),
        );
        report(
            "bpf",
            libc::syscall(libc::SYS_bpf, 0, std::ptr::null::<u8>(), 0),
        );
        report(
            "perf_event_open",
            libc::syscall(
                libc::SYS_perf_event_open,
                std::ptr::null::<u8>(),
                0,
                -1,
                -1,
                0,
            ),
        );
        report("userfaultfd", libc::syscall(libc::SYS_userfaultfd, 0));
        report(
            "ptrace",
            libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0),
        );
        report(
            "process_vm_readv",
            libc::syscall(libc::SYS_process_vm_readv, 1, 0, 0, 0, 0, 0),
        );
        report(
            "mount",
            libc::mount(
                c"none".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ) as i64,
        );
        report(
            "umount2",
            libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) as i64,
        );
        report(
            "fsopen",
            libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0),
        );
        report(
            "open_tree",
            libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), 0),
        );
        report("setns", libc::syscall(libc::SYS_setns, 0, 0));
        report("unshare_user", libc::unshare(libc::CLONE_NEWUSER) as i64);
        report("unshare_net", libc::unshare(libc::CLONE_NEWNET) as i64);
        report(
            "clone3",
            libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0),
        );
        report(
            "personality_set",
            libc::personality(0x0040000 /* ADDR_NO_RANDOMIZE */) as i64,
        );
        report("personality_query", libc::personality(0xffff_ffff) as i64);
        for (name, fam, ty) in [
            ("socket_packet", libc::AF_PACKET, libc::SOCK_RAW),
            ("socket_raw", libc::AF_INET, libc::SOCK_RAW),
            ("socket_vsock", libc::AF_VSOCK, libc::SOCK_STREAM),
            ("socket_inet_stream", libc::AF_INET, libc::SOCK_STREAM),
            ("socket_unix", libc::AF_UNIX, libc::SOCK_STREAM),
        ] {
            let fd = libc::socket(fam, ty, 0);
            report(name, fd as i64);
            if fd >= 0 {
                libc::close(fd);
            }
        }
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT);
        report("socket_netlink_audit", fd as i64);
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_ROUTE);
        report("socket_netlink_route", fd as i64);
    }
}

/// Every socket that carries TCP or UDP, and the two the sandbox allows.
fn protocols() {
    let (inet, inet6) = (libc::AF_INET, libc::AF_INET6);
    let (stream, dgram) = (libc::SOCK_STREAM, libc::SOCK_DGRAM);
    for (name, fam, ty, proto) in [
        ("tcp", inet, stream, 0),
        (
            "tcp_explicit",
            inet6,
            stream | libc::SOCK_CLOEXEC,
            libc::IPPROTO_TCP,
        ),
        ("udp", inet, dgram, 0),
        ("mptcp", inet, stream, 262),
        ("mptcp6", inet6, stream | libc::SOCK_NONBLOCK, 262),
        ("sctp_stream", inet, stream, 132),
        ("sctp_seqpacket", inet, libc::SOCK_SEQPACKET, 132),
        ("seqpacket", inet6, libc::SOCK_SEQPACKET, 0),
        ("rdm", inet, libc::SOCK_RDM, 0),
        ("dccp", inet, 6 /* SOCK_DCCP */, 33),
        ("udplite", inet, dgram, 136),
        ("ping", inet, dgram, libc::IPPROTO_ICMP),
        ("ping6", inet6, dgram, libc::IPPROTO_ICMPV6),
        ("smc", inet, stream, 256),
        ("af_smc", 43, stream, 0),
    ] {
        // SAFETY: socket() with constant arguments; a descriptor is closed.
        let fd = unsafe { libc::socket(fam, ty, proto) };
        report(name, fd as i64);
        if fd >= 0 {
            // SAFETY: closing the descriptor just opened.
            unsafe { libc::close(fd) };
        }
    }
}

/// Setting setuid/setgid bits every way, in the current directory, then
/// an ordinary chmod that must still work.
fn setid() {
    let c = |s: &str| CString::new(s).expect("name");
    let _ = std::fs::write("setid-file", b"#!/bin/sh\n");
    let file = c("setid-file");
    // SAFETY: plain file syscalls on names in the current directory.
    unsafe {
        report("chmod_setuid", libc::chmod(file.as_ptr(), 0o4755) as i64);
        report("chmod_setgid", libc::chmod(file.as_ptr(), 0o2755) as i64);
        report(
            "fchmodat_setuid",
            libc::fchmodat(libc::AT_FDCWD, file.as_ptr(), 0o4755, 0) as i64,
        );
        report(
            "fchmodat2_setuid",
            libc::syscall(452, libc::AT_FDCWD, file.as_ptr(), 0o4755, 0),
        );
        let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
        report("fchmod_setuid", libc::fchmod(fd, 0o4755) as i64);
        report("fchmod_plain", libc::fchmod(fd, 0o750) as i64);
        libc::close(fd);
        let created = c("setid-created");
        let fd = libc::open(created.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o4755);
        report("open_creat_setuid", fd as i64);
        let fd = libc::openat(
            libc::AT_FDCWD,
            created.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o2755,
        );
        report("openat_creat_setgid", fd as i64);
        let dot = c(".");
        let fd = libc::open(dot.as_ptr(), libc::O_TMPFILE | libc::O_WRONLY, 0o4755);
        report("open_tmpfile_setuid", fd as i64);
        let dir = c("setid-dir");
        report("mkdir_setgid", libc::mkdir(dir.as_ptr(), 0o2755) as i64);
        let node = c("setid-node");
        report(
            "mknod_setuid",
            libc::mknod(node.as_ptr(), libc::S_IFREG | 0o4755, 0) as i64,
        );
        report(
            "openat2",
            libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, file.as_ptr(), 0, 0),
        );
        report("chmod_plain", libc::chmod(file.as_ptr(), 0o755) as i64);
        let plain = c("plain-created");
        let fd = libc::open(plain.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
        report("open_creat_plain", fd as i64);
    }
}

/// TIOCSTI on a real pty the sandbox opened, and an ordinary terminal ioctl.
fn tiocsti() {
    // SAFETY: plain pty calls; descriptors are checked before use.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        if master < 0 || libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            report("openpt", -1);
            return;
        }
        let name = libc::ptsname(master);
        let slave = libc::open(name, libc::O_RDWR | libc::O_NOCTTY);
        report("open_slave", slave as i64);
        let c = b'x';
        report("tiocsti", libc::ioctl(slave, libc::TIOCSTI, &c) as i64);
        let mut ws: libc::winsize = std::mem::zeroed();
        report(
            "tiocgwinsz",
            libc::ioctl(slave, libc::TIOCGWINSZ, &mut ws) as i64,
        );
    }
}

/// A TCP connection opened by sendto(MSG_FASTOPEN), which never calls
/// connect(), to `addr` (an IPv4 `a.b.c.d:port`).
fn fastopen(addr: &str) {
    let Ok(std::net::SocketAddr::V4(v4)) = addr.parse() else {
        println!("fastopen: bad address {addr:?}");
        return;
    };
    // SAFETY: a socket this process owns, a valid sockaddr_in and buffer.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = v4.port().to_be();
        sa.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        let data = b"fastopen-escape";
        let r = libc::sendto(
            fd,
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_FASTOPEN,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        report("fastopen", r as i64);
        libc::close(fd);
    }
}

/// listen() on a TCP socket that was never bound: the kernel picks a port.
fn listen_unbound() {
    // SAFETY: a socket this process owns.
    unsafe {
        let fd = libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0);
        report("listen_unbound", libc::listen(fd, 1) as i64);
        libc::close(fd);
    }
}

/// Outside the sandbox: a unix socket bound at PATH exactly as given
/// (relative to the working directory, as a service may do) that answers
/// every connection with a banner, for SECS seconds.
fn serve_unix(path: &str, secs: &str) {
    let Ok(l) = std::os::unix::net::UnixListener::bind(path) else {
        println!("serve_unix: cannot bind {path}");
        return;
    };
    println!("serve_unix: listening");
    let _ = std::io::stdout().flush();
    let secs: u64 = secs.parse().unwrap_or(10);
    std::thread::spawn(move || {
        for mut c in l.incoming().map_while(Result::ok) {
            let _ = c.write_all(b"HOST-SERVICE-BANNER\n");
        }
    });
    std::thread::sleep(Duration::from_secs(secs));
}

/// A unix server and client of the sandbox's own, by absolute and relative path.
fn inner_unix() {
    let _ = std::fs::remove_file("inner.sock");
    let r = std::os::unix::net::UnixListener::bind("inner.sock").and_then(|l| {
        let abs = std::env::current_dir()?.join("inner.sock");
        for target in [abs.as_path(), std::path::Path::new("inner.sock")] {
            let mut c = UnixStream::connect(target)?;
            let (mut a, _) = l.accept()?;
            a.write_all(b"x")?;
            let mut b = [0u8; 1];
            c.read_exact(&mut b)?;
        }
        std::fs::remove_file("inner.sock")
    });
    io_result("inner_unix", r);
}

/// Unix datagram sockets, which could send to any path without connect()
/// (SOCK_RAW is one: the kernel makes it SOCK_DGRAM). With `to`, each one
/// made sends a datagram there.
fn unix_dgram(to: Option<&str>) {
    let send = |name: &str, fd: libc::c_int| {
        let Some(path) = to else { return };
        // SAFETY: a zeroed sockaddr_un, filled within its bounds.
        let r = unsafe {
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, s) in addr.sun_path.iter_mut().zip(path.bytes()) {
                *d = s as libc::c_char;
            }
            let msg = b"from-the-sandbox";
            libc::sendto(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        report(&format!("{name}_sendto"), r as i64);
    };
    let mut sv = [0 as libc::c_int; 2];
    // SAFETY: socket and socketpair with valid arguments, on our own table.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0);
        report("unix_dgram_socket", fd as i64);
        if fd >= 0 {
            send("unix_dgram_socket", fd);
        }
        for (name, ty) in [
            ("unix_dgram_socketpair", libc::SOCK_DGRAM),
            ("unix_raw_socketpair", libc::SOCK_RAW),
            ("unix_stream_socketpair", libc::SOCK_STREAM),
            ("unix_seqpacket_socketpair", libc::SOCK_SEQPACKET),
        ] {
            let r = libc::socketpair(libc::AF_UNIX, ty, 0, sv.as_mut_ptr());
            report(name, r as i64);
            if r == 0 && ty != libc::SOCK_STREAM && ty != libc::SOCK_SEQPACKET {
                send(name, sv[0]);
            }
        }
    }
}

/// `threads` threads rename a file of their own onto `name` and back, in
/// the working directory, for `secs` seconds: as many directory events as
/// the machine can make (the deny_read watch's queue, red team round 13).
fn flood(threads: usize, secs: f64, name: &str) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    let workers: Vec<_> = (0..threads)
        .map(|k| {
            let name = name.to_string();
            std::thread::spawn(move || {
                let own = format!("{name}.flood{k}");
                let _ = std::fs::write(&own, "");
                let mut n = 0u64;
                while std::time::Instant::now() < end {
                    if std::fs::rename(&own, &name).is_ok() {
                        let _ = std::fs::rename(&name, &own);
                    } else {
                        let _ = std::fs::write(&own, "");
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let total: u64 = workers.into_iter().filter_map(|w| w.join().ok()).sum();
    println!("flood: {total}");
}

/// A fork storm that replaces itself (red team round 10's F6): at most
/// `cap` members live at once, each forks two successors while under the
/// cap and exits at once, for `secs` seconds; every member is named
/// `name` (its `comm`). Returns at once, leaving the storm behind.
fn storm(cap: i32, secs: f64, name: &str) {
    use std::sync::atomic::{AtomicI32, Ordering};
    let Ok(cname) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: an anonymous shared mapping of one page, for one counter.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return;
    }
    // SAFETY: the page is zeroed, aligned and shared by every member.
    let alive = unsafe { &*(page as *const AtomicI32) };
    alive.store(1, Ordering::SeqCst);
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    // SAFETY: single-threaded here; the child only runs the loop below.
    if unsafe { libc::fork() } != 0 {
        println!("storm: started");
        return;
    }
    loop {
        // SAFETY: naming ourselves, with a NUL-terminated name.
        unsafe { libc::prctl(libc::PR_SET_NAME, cname.as_ptr(), 0, 0, 0) };
        if std::time::Instant::now() > end {
            alive.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: leaving without running anything of the parent's.
            unsafe { libc::_exit(0) };
        }
        let mut made = 0;
        let mut child = false;
        for _ in 0..2 {
            if alive.fetch_add(1, Ordering::SeqCst) >= cap {
                alive.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            // SAFETY: the member is single-threaded.
            match unsafe { libc::fork() } {
                0 => {
                    child = true;
                    break;
                }
                p if p < 0 => {
                    alive.fetch_sub(1, Ordering::SeqCst);
                }
                _ => made += 1,
            }
        }
        if child {
            continue;
        }
        if made > 0 {
            alive.fetch_sub(1, Ordering::SeqCst);
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match arg(0).as_str() {
        "syscalls" => syscalls(),
        "flood" => flood(
            arg(1).parse().unwrap_or(8),
            arg(2).parse().unwrap_or(2.0),
            &arg(3),
        ),
        "storm" => storm(
            arg(1).parse().unwrap_or(64),
            arg(2).parse().unwrap_or(5.0),
            &arg(3),
        ),
        "protocols" => protocols(),
        // `setxattr PATH NAME VALUE` / `rmxattr PATH NAME` (links not
        // followed): what a review run may and may not set.
        "setxattr" | "rmxattr" => {
            let (Ok(path), Ok(name)) = (CString::new(arg(1)), CString::new(arg(2))) else {
                println!("{}: bad arguments", arg(0));
                return;
            };
            let value = arg(3);
            // SAFETY: NUL-terminated path and name, a value of its length.
            let r = unsafe {
                if arg(0) == "setxattr" {
                    libc::lsetxattr(
                        path.as_ptr(),
                        name.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                } else {
                    libc::lremovexattr(path.as_ptr(), name.as_ptr())
                }
            };
            report(&format!("{} {}", arg(0), arg(2)), r.into());
        }
        "setid" => setid(),
        "unknown-syscalls" => {
            // SAFETY: numbers no kernel this probe runs on defines.
            unsafe {
                report("syscall_467", libc::syscall(467, 0, 0, 0));
                report("syscall_1000", libc::syscall(1000, 0, 0, 0));
                report("syscall_400", libc::syscall(400, 0, 0, 0));
            }
        }
        "x32" => {
            // getpid through the x32 ABI (same arch, __X32_SYSCALL_BIT).
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: getpid has no arguments and no side effects.
                let r = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
                report("x32", r);
            }
            #[cfg(not(target_arch = "x86_64"))]
            println!("x32: not x86_64");
        }
        "tiocsti" => tiocsti(),
        "connect-tcp" => io_result(
            "connect_tcp",
            TcpStream::connect_timeout(&arg(1).parse().expect("addr"), Duration::from_secs(2)),
        ),
        "fastopen" => fastopen(&arg(1)),
        "serve-unix" => serve_unix(&arg(1), &arg(2)),
        "inner-unix" => inner_unix(),
        "unix-dgram" => unix_dgram(args.get(1).map(String::as_str)),
        "listen-unbound" => listen_unbound(),
        "connect-unix" => io_result("connect_unix", UnixStream::connect(arg(1))),
        "connect-abstract" => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg(1).as_bytes())
                .expect("name");
            io_result("connect_abstract", UnixStream::connect_addr(&addr))
        }
        "send-udp" => {
            let r = UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(b"escape", arg(1)));
            io_result("send_udp", r)
        }
        "read" => io_result("read", std::fs::read(arg(1))),
        "http" => {
            // A raw GET through HTTP_PROXY, so no client library is needed.
            let proxy = std::env::var("HTTP_PROXY").unwrap_or_default();
            let addr = proxy
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string();
            let r = TcpStream::connect(&addr).and_then(|mut s| {
                write!(
                    s,
                    "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    arg(1)
                )?;
                let mut out = String::new();
                s.read_to_string(&mut out)?;
                Ok(out)
            });
            match r {
                Ok(out) => println!("http: {}", out.lines().next().unwrap_or("")),
                Err(e) => println!("http: {e}"),
            }
        }
        "int80" => {
            // A 32-bit getpid through the i386 entry point: a foreign
            // architecture to a seccomp filter built for x86_64.
            #[cfg(target_arch = "x86_64")]
            {
                let mut ret: i64 = 20; // __NR_getpid on i386
                                       // SAFETY: getpid has no arguments and no side effects.
                unsafe { std::arch::asm!("int 0x80", inlateout("rax") ret) };
                println!("int80: returned {ret}");
            }
            #[cfg(not(target_arch = "x86_64"))]
            println!("int80: not x86_64");
        }
        "exec" => {
            let prog = CString::new(arg(1)).expect("path");
            // SAFETY: execv with a NUL-terminated argv.
            let r =
                unsafe { libc::execv(prog.as_ptr(), [prog.as_ptr(), std::ptr::null()].as_ptr()) };
            report("exec", r as i64);
        }
        other => {
            eprintln!("unknown probe {other:?}");
            std::process::exit(2);
        }
    }
}
