//! Messages with descriptors over unix SOCK_SEQPACKET sockets: one JSON
//! document a message, its descriptors (a command's stdio, a report file)
//! attached. Used between a session's clients and its supervisor, and
//! between the supervisor and the sandbox's PID 1.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};

/// The largest message either side sends: an argv and an environment.
pub const MAX_MESSAGE: usize = 1 << 20;

/// A connected SOCK_SEQPACKET socket.
pub struct Seq(pub OwnedFd);

impl Seq {
    /// A connected pair (close-on-exec on both ends).
    pub fn pair() -> nix::Result<(Seq, Seq)> {
        let (a, b) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        Ok((Seq(a), Seq(b)))
    }

    /// Send one message with `fds` attached. MSG_NOSIGNAL: a peer that
    /// went away is an error here, not a SIGPIPE.
    pub fn send(&self, body: &[u8], fds: &[RawFd]) -> nix::Result<()> {
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        loop {
            match sendmsg::<()>(
                self.0.as_raw_fd(),
                &[IoSlice::new(body)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e),
                Ok(_) => return Ok(()),
            }
        }
    }

    pub fn send_json(&self, value: &serde_json::Value, fds: &[RawFd]) -> nix::Result<()> {
        self.send(value.to_string().as_bytes(), fds)
    }

    /// One message and the descriptors that came with it (close-on-exec).
    /// `None` when the peer closed. A message cut short (larger than
    /// `MAX_MESSAGE`) or with more descriptors than fit is an error, and
    /// the descriptors that did arrive are closed.
    pub fn recv(&self) -> nix::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        // The next message's size first (MSG_PEEK | MSG_TRUNC gives its
        // whole length), so that the buffer is that size: a buffer of
        // MAX_MESSAGE for every message cost a 1 MiB memset, its page
        // faults, and in PID 1 a larger heap for every fork to copy.
        let size = loop {
            // SAFETY: recv(2) into no buffer, on a descriptor we own.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_PEEK | libc::MSG_TRUNC,
                )
            };
            match nix::errno::Errno::result(n) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e),
                // One more than the largest allowed, so that a larger
                // message is still seen to be cut short.
                Ok(n) => break (n as usize).clamp(1, MAX_MESSAGE + 1),
            }
        };
        let mut buf = vec![0u8; size];
        // Room for as many descriptors as one message can carry
        // (SCM_MAX_FD): a truncated set would leave descriptors installed
        // that no parse reaches, open for good.
        let mut space = nix::cmsg_space!([RawFd; 253]);
        loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(
                self.0.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e),
                Ok(m) => m,
            };
            let mut fds = vec![];
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for r in raw {
                        // SAFETY: the kernel just installed these for us.
                        fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                    }
                }
            }
            if msg
                .flags
                .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
                || msg.bytes > MAX_MESSAGE
            {
                return Err(nix::errno::Errno::EMSGSIZE);
            }
            let n = msg.bytes;
            if n == 0 && fds.is_empty() {
                return Ok(None);
            }
            buf.truncate(n);
            return Ok(Some((buf, fds)));
        }
    }

    /// `recv`, decoded as JSON.
    pub fn recv_json(&self) -> nix::Result<Option<(serde_json::Value, Vec<OwnedFd>)>> {
        match self.recv()? {
            None => Ok(None),
            Some((body, fds)) => match serde_json::from_slice(&body) {
                Ok(v) => Ok(Some((v, fds))),
                Err(_) => Err(nix::errno::Errno::EBADMSG),
            },
        }
    }
}
