//! Transparent capture, the namespace side (SPEC §5.5). Inside the
//! sandbox's own network namespace, as the unprivileged user who owns it:
//!
//! - a default route via `lo` (IPv4 and IPv6), so a connect to any address
//!   leaves through loopback instead of failing with ENETUNREACH;
//! - an nf_tables NAT rule in the output hook that redirects every TCP
//!   connection not addressed to 127.0.0.1 or ::1 to the capture listener,
//!   where the supervisor reads the original destination (SO_ORIGINAL_DST)
//!   and hands it to the proxy engine as a CONNECT;
//! - a filter rule that rejects every other non-TCP packet not addressed to
//!   loopback, so UDP (QUIC included) fails at once and clients fall back
//!   to TCP (without it the packets would loop through `lo` and vanish);
//! - airlock's DNS server on 127.0.0.1:53, which `/etc/resolv.conf` in the
//!   sandbox names.
//!
//! Why NAT redirect rather than a TUN device with a userspace TCP stack:
//! the kernel does the TCP work (no second stack to trust or tune), the
//! captured socket is an ordinary TCP socket the tunnel can splice, and the
//! setup is one netlink batch. 127.0.0.1 and ::1 stay the sandbox's own
//! (the proxy, DNS, local servers); any other loopback address is captured
//! like any destination and decided by the engine (refused as a private
//! address unless `allow_private` says otherwise).
//!
//! Where the kernel lacks nf_tables or NAT, setup fails and `run` keeps the
//! explicit proxy only (fail soft: nothing can leave the namespace either
//! way).

use std::io::IoSlice;
use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::netlink::{self, Batch, Expr, NFPROTO_INET, NFT_META_L4PROTO, NFT_META_NFPROTO};

/// Where captured connections arrive inside the namespace.
pub const CAPTURE_PORT: u16 = 3129;
/// The sandbox's DNS server.
pub const DNS_PORT: u16 = 53;
const TABLE: &str = "airlock";

/// Set in the helper once the DNS socket is bound, read by PID 1 (a fork
/// of the helper) when it mounts /etc/resolv.conf.
static DNS_READY: AtomicBool = AtomicBool::new(false);

/// The sockets bound inside the namespace, for the supervisor to serve.
pub struct Capture {
    pub tcp4: TcpListener,
    pub tcp6: Option<TcpListener>,
    pub dns_udp: UdpSocket,
    pub dns_tcp: TcpListener,
}

/// Sockets, route and rules, in one go (for `doctor`).
pub fn setup() -> Result<Capture> {
    let c = bind()?;
    install(&c)?;
    Ok(c)
}

/// Bind the capture and DNS sockets. Call in the new network namespace,
/// with loopback up; cheap, so it runs before PID 1 is forked (whose mount
/// setup then points resolv.conf at the DNS socket).
pub fn bind() -> Result<Capture> {
    // IPv6 may be disabled in this kernel; then only IPv4 is captured and
    // IPv6 connects keep failing with ENETUNREACH, which is closed too.
    let tcp6 = TcpListener::bind((Ipv6Addr::LOCALHOST, CAPTURE_PORT)).ok();
    let tcp4 = TcpListener::bind((Ipv4Addr::LOCALHOST, CAPTURE_PORT))
        .context("binding the capture listener")?;
    let dns_udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))
        .context("binding the DNS server's UDP socket")?;
    let dns_tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, DNS_PORT))
        .context("binding the DNS server's TCP socket")?;
    DNS_READY.store(true, Ordering::SeqCst);
    Ok(Capture {
        tcp4,
        tcp6,
        dns_udp,
        dns_tcp,
    })
}

/// The route via `lo` and the nf_tables rules. This is the slow part (the
/// kernel registers NAT and conntrack hooks), so PID 1 does it while the
/// helper adds the Landlock rules PID 1 then waits for.
pub fn install(c: &Capture) -> Result<()> {
    // SAFETY: a NUL-terminated constant name.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(std::io::Error::last_os_error()).context("finding lo");
    }
    netlink::default_route(lo, Ipv4Addr::LOCALHOST.into())
        .context("adding the default route via lo")?;
    if c.tcp6.is_some() {
        netlink::default_route(lo, Ipv6Addr::LOCALHOST.into())
            .context("adding the IPv6 default route via lo")?;
    }
    rules(c.tcp6.is_some()).context("installing the nf_tables capture rules")
}

const IPPROTO_TCP: u8 = 6;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// `not to <own>` for each family: the address match that keeps the
/// sandbox's own loopback services out of capture.
fn families(v6: bool) -> Vec<(u8, Expr, Vec<u8>)> {
    let mut out = vec![(
        NFPROTO_IPV4,
        Expr::NetworkHeader { offset: 16, len: 4 },
        Ipv4Addr::LOCALHOST.octets().to_vec(),
    )];
    if v6 {
        out.push((
            NFPROTO_IPV6,
            Expr::NetworkHeader {
                offset: 24,
                len: 16,
            },
            Ipv6Addr::LOCALHOST.octets().to_vec(),
        ));
    }
    out
}

fn rules(v6: bool) -> std::io::Result<()> {
    let mut b = Batch::new(NFPROTO_INET);
    b.table(TABLE);
    b.chain(TABLE, "capture", "nat", netlink::NF_INET_LOCAL_OUT, -100);
    b.chain(TABLE, "closed", "filter", netlink::NF_INET_LOCAL_OUT, 0);
    for (family, daddr, own) in families(v6) {
        // meta nfproto F meta l4proto tcp daddr != own redirect to :CAPTURE_PORT
        b.rule(
            TABLE,
            "capture",
            &[
                Expr::Meta(NFT_META_NFPROTO),
                Expr::Cmp {
                    eq: true,
                    value: vec![family],
                },
                Expr::Meta(NFT_META_L4PROTO),
                Expr::Cmp {
                    eq: true,
                    value: vec![IPPROTO_TCP],
                },
                daddr,
                Expr::Cmp {
                    eq: false,
                    value: own.clone(),
                },
                Expr::Immediate(CAPTURE_PORT.to_be_bytes().to_vec()),
                Expr::Redirect,
            ],
        );
    }
    for (family, daddr, own) in families(v6) {
        // meta nfproto F meta l4proto != tcp daddr != own reject
        b.rule(
            TABLE,
            "closed",
            &[
                Expr::Meta(NFT_META_NFPROTO),
                Expr::Cmp {
                    eq: true,
                    value: vec![family],
                },
                Expr::Meta(NFT_META_L4PROTO),
                Expr::Cmp {
                    eq: false,
                    value: vec![IPPROTO_TCP],
                },
                daddr,
                Expr::Cmp {
                    eq: false,
                    value: own,
                },
                Expr::Reject,
            ],
        );
    }
    b.commit()
}

/// Hand the capture sockets to the supervisor, or say why there are none.
pub fn send(channel: &UnixStream, capture: &Result<Capture>) -> Result<()> {
    match capture {
        Ok(c) => {
            let mut fds = vec![
                c.tcp4.as_fd().as_raw_fd(),
                c.dns_udp.as_fd().as_raw_fd(),
                c.dns_tcp.as_fd().as_raw_fd(),
            ];
            if let Some(l) = &c.tcp6 {
                fds.push(l.as_fd().as_raw_fd());
            }
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(
                channel.as_raw_fd(),
                &[IoSlice::new(b"C")],
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .context("passing the capture sockets to the supervisor")?;
        }
        Err(e) => {
            let why = format!("{e:#}");
            let why = &why.as_bytes()[..why.len().min(1000)];
            let mut msg = vec![b'N'];
            msg.extend_from_slice(&(why.len() as u16).to_be_bytes());
            msg.extend_from_slice(why);
            std::io::Write::write_all(&mut &*channel, &msg)
                .context("telling the supervisor capture is off")?;
        }
    }
    Ok(())
}

/// The capture sockets as the supervisor receives them.
pub struct Received {
    pub tcp4: OwnedFd,
    pub dns_udp: OwnedFd,
    pub dns_tcp: OwnedFd,
    pub tcp6: Option<OwnedFd>,
}

/// Receive what `send` sent: the sockets, or why capture is off.
pub fn recv(channel: &UnixStream) -> Result<std::result::Result<Received, String>> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let msg = recvmsg::<()>(
        channel.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .context("receiving the capture sockets from the sandbox")?;
    let mut fds: Vec<OwnedFd> = vec![];
    for c in msg.cmsgs().context("reading the control message")? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: the kernel just installed these descriptors for us.
                fds.push(unsafe { std::os::fd::FromRawFd::from_raw_fd(r) });
            }
        }
    }
    if msg.bytes == 0 {
        bail!("the sandbox closed its channel before sending the capture sockets");
    }
    match byte[0] {
        b'C' if fds.len() >= 3 => {
            let mut it = fds.into_iter();
            let (Some(tcp4), Some(dns_udp), Some(dns_tcp)) = (it.next(), it.next(), it.next())
            else {
                bail!("the sandbox sent too few capture sockets");
            };
            Ok(Ok(Received {
                tcp4,
                dns_udp,
                dns_tcp,
                tcp6: it.next(),
            }))
        }
        b'N' => {
            let mut len = [0u8; 2];
            std::io::Read::read_exact(&mut &*channel, &mut len)
                .context("reading why capture is off")?;
            let mut why = vec![0u8; u16::from_be_bytes(len) as usize];
            std::io::Read::read_exact(&mut &*channel, &mut why)
                .context("reading why capture is off")?;
            Ok(Err(String::from_utf8_lossy(&why).into_owned()))
        }
        other => {
            // The helper failed and wrote why instead: pass that on.
            let mut text = vec![other];
            let _ = std::io::Read::read_to_end(&mut &*channel, &mut text);
            let msg = String::from_utf8_lossy(&text);
            bail!(
                "{}",
                msg.lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ")
            )
        }
    }
}

/// Where a link in `dir` pointing at `to` leads, with `.` and `..` folded
/// lexically (`../run/systemd/resolve/stub-resolv.conf` is the usual one).
fn link_target(dir: &Path, to: &Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::from("/");
    for c in dir.join(to).components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

const RESOLV_CONF: &str = "nameserver 127.0.0.1\noptions edns0 trust-ad\n";

/// Point the sandbox's `/etc/resolv.conf` at airlock's DNS server, when it
/// runs. Called by the mount setup after /run is a fresh tmpfs.
pub fn resolv_conf() -> Result<()> {
    if !DNS_READY.load(Ordering::SeqCst) {
        return Ok(());
    }
    let ours = Path::new("/run/airlock/resolv.conf");
    std::fs::create_dir_all("/run/airlock").context("creating /run/airlock")?;
    std::fs::write(ours, RESOLV_CONF).context("writing the sandbox's resolv.conf")?;
    // /etc/resolv.conf is often a link into /run (systemd-resolved), which
    // is our tmpfs now: then write the file where the link points. A link
    // anywhere else is covered by a bind mount on its target (the mount
    // follows it); we never create files outside our own tmpfs.
    let etc = Path::new("/etc/resolv.conf");
    let target = match std::fs::read_link(etc) {
        Ok(to) => Some(link_target(Path::new("/etc"), &to)),
        Err(_) => None,
    };
    if let Some(t) = &target {
        let under_run = t.starts_with("/run/") || t.starts_with("/var/run/");
        if !t.exists() && under_run {
            if let Some(parent) = t.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::write(t, RESOLV_CONF).with_context(|| format!("writing {}", t.display()))?;
            return Ok(());
        }
        if !t.exists() {
            bail!(
                "/etc/resolv.conf links to {}, which does not exist; cannot point it at airlock's DNS",
                t.display()
            );
        }
    } else if !etc.exists() {
        // Nothing to cover, and /etc is the host's: leave resolution to fail.
        bail!("/etc/resolv.conf does not exist; cannot point it at airlock's DNS");
    }
    nix::mount::mount(
        Some(ours),
        etc,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .context("binding the sandbox's resolv.conf over /etc/resolv.conf")?;
    nix::mount::mount(
        None::<&str>,
        etc,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND
            | nix::mount::MsFlags::MS_REMOUNT
            | nix::mount::MsFlags::MS_RDONLY
            | nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV,
        None::<&str>,
    )
    .context("making the sandbox's resolv.conf read-only")?;
    Ok(())
}

/// Serve the capture listeners and the DNS server with the run's engine;
/// when capture is off, say why at `-v` (the explicit proxy still works,
/// and nothing can leave the namespace without it).
pub fn serve(
    runtime: &tokio::runtime::Runtime,
    engine: &std::sync::Arc<airlock_proxy::Engine>,
    capture: Option<std::result::Result<Received, String>>,
) {
    let received = match capture {
        None => return,
        Some(Err(why)) => {
            tracing::info!("transparent capture is off, only the explicit proxy works: {why}");
            return;
        }
        Some(Ok(r)) => r,
    };
    let _guard = runtime.enter();
    let tcp = |fd: OwnedFd| {
        let l = TcpListener::from(fd);
        l.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(l)
    };
    let mut listeners = vec![tcp(received.tcp4)];
    if let Some(fd) = received.tcp6 {
        listeners.push(tcp(fd));
    }
    for l in listeners {
        match l {
            Ok(l) => {
                let engine = engine.clone();
                runtime.spawn(async move {
                    if let Err(e) = airlock_proxy::transparent::serve(engine, l).await {
                        tracing::error!("transparent capture stopped: {e}");
                    }
                });
            }
            Err(e) => tracing::error!("cannot serve the capture listener: {e}"),
        }
    }
    let udp = UdpSocket::from(received.dns_udp);
    let dns = udp
        .set_nonblocking(true)
        .and_then(|_| tokio::net::UdpSocket::from_std(udp))
        .and_then(|u| Ok((u, tcp(received.dns_tcp)?)));
    match dns {
        Ok((udp, tcp)) => {
            let engine = engine.clone();
            runtime.spawn(async move {
                if let Err(e) = airlock_proxy::dns::serve(engine, udp, tcp).await {
                    tracing::error!("the sandbox's DNS server stopped: {e}");
                }
            });
        }
        Err(e) => tracing::error!("cannot serve the sandbox's DNS: {e}"),
    }
}

/// For `doctor`: set capture up for real in a throwaway user and network
/// namespace. `Err` says why `run` would keep the explicit proxy only.
pub fn probe() -> std::result::Result<(), String> {
    use nix::sched::{unshare, CloneFlags};
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    let (ours, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
    // SAFETY: doctor is single-threaded here; the child only sets up and exits.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let result = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
                .map_err(super::explain_unshare)
                .and_then(|_| super::netns::loopback_up())
                .and_then(|_| setup().map(drop));
            let code = match result {
                Ok(()) => 0,
                Err(e) => {
                    let _ = std::io::Write::write_all(&mut &theirs, format!("{e:#}").as_bytes());
                    1
                }
            };
            // SAFETY: leave the forked child at once.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(theirs);
            let mut why = String::new();
            let _ = std::io::Read::read_to_string(&mut &ours, &mut why);
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(_) if !why.is_empty() => Err(why),
                other => Err(format!("the probe ended unexpectedly: {other:?}")),
            }
        }
        Err(e) => Err(format!("cannot fork the probe: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_links_are_followed_lexically() {
        let etc = Path::new("/etc");
        for (to, want) in [
            (
                "../run/systemd/resolve/stub-resolv.conf",
                "/run/systemd/resolve/stub-resolv.conf",
            ),
            ("/run/resolvconf/resolv.conf", "/run/resolvconf/resolv.conf"),
            (
                "resolvconf/run/resolv.conf",
                "/etc/resolvconf/run/resolv.conf",
            ),
            ("../../../run/./x/../resolv.conf", "/run/resolv.conf"),
        ] {
            assert_eq!(link_target(etc, Path::new(to)), Path::new(want), "{to}");
        }
    }
}
