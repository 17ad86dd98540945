//! Inside the new network namespace: bring loopback up and bind the proxy
//! listener, then pass it to the supervisor with SCM_RIGHTS. No `ip`, no
//! bridge processes, no veth, no root.

use std::io::IoSlice;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// `ip link set lo up`, with the SIOCSIFFLAGS ioctl.
pub fn loopback_up() -> Result<()> {
    // SAFETY: a plain socket used only as an ioctl handle; closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket for the loopback ioctl");
    }
    // SAFETY: ifreq is plain old data; the name is NUL-terminated.
    let result = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &req);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if r == 0 {
            Ok(())
        } else {
            Err(err)
        }
    };
    result.context("bringing up loopback in the sandbox's network namespace")
}

pub fn bind_proxy_listener(port: u16) -> Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("binding the proxy listener on 127.0.0.1:{port} in the sandbox"))
}

/// Send one descriptor over the socket.
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>) -> Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(b"F")],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .context("passing a descriptor over the sandbox channel")?;
    Ok(())
}

/// Receive one descriptor sent with `send_fd`. When the other side wrote
/// plain text instead (an error), that first byte comes back with no fd.
pub fn recv_fd(sock: &UnixStream) -> Result<(u8, Option<OwnedFd>)> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .context("receiving a descriptor from the sandbox")?;
    let mut fd = None;
    for c in msg.cmsgs().context("reading the control message")? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for (i, &raw) in fds.iter().enumerate() {
                // SAFETY: the kernel just installed these descriptors for us.
                let owned: OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) };
                if i == 0 {
                    fd = Some(owned);
                }
            }
        }
    }
    if msg.bytes == 0 {
        bail!("the sandbox closed its channel before it was ready");
    }
    Ok((byte[0], fd))
}
