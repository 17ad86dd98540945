//! Socket-to-socket pumping on Linux: small chunks by read and write
//! through a buffer (two syscalls, no pipe), bulk transfers socket → pipe
//! → socket with splice(2), so their bytes never pass through user space.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Bytes moved per splice call; the pipe is resized towards this.
pub const CHUNK: usize = 1 << 20;

pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the array with two new descriptors on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here alone.
        let pipe = unsafe {
            Pipe {
                read: OwnedFd::from_raw_fd(fds[0]),
                write: OwnedFd::from_raw_fd(fds[1]),
            }
        };
        // A bigger pipe means fewer wake-ups; the kernel may cap it, which is fine.
        // SAFETY: F_SETPIPE_SZ on a pipe we own.
        unsafe {
            libc::fcntl(
                pipe.write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                CHUNK as libc::c_int,
            )
        };
        Ok(pipe)
    }
}

fn splice(from: i32, to: i32, len: usize) -> io::Result<usize> {
    // SAFETY: both are open descriptors; null offsets mean "current position".
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Move what the socket has into the (empty) pipe. `Ok(0)` is EOF. The
/// pipe is always drained before this is called, so EAGAIN can only mean
/// the socket has nothing, and the readiness bookkeeping stays right.
pub async fn fill(from: &TcpStream, pipe: &Pipe) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_io(Interest::READABLE, || {
            splice(from.as_raw_fd(), pipe.write.as_raw_fd(), CHUNK)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// Move `len` bytes from the pipe to the socket; `progress` is called
/// whenever some went out (a slow reader is not an idle one).
pub async fn drain(
    pipe: &Pipe,
    to: &TcpStream,
    mut len: usize,
    progress: &impl Fn(),
) -> io::Result<()> {
    while len > 0 {
        match to.try_io(Interest::WRITABLE, || {
            splice(pipe.read.as_raw_fd(), to.as_raw_fd(), len)
        }) {
            Ok(n) => {
                len -= n;
                progress();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read what the socket has, waiting only when it has nothing; `Ok(0)` is
/// EOF. A read shorter than `buf` emptied the socket's receive queue, so
/// it reports the socket as not readable (as a failed read would), and
/// the next call waits for epoll instead of spending a syscall on EAGAIN.
/// Data that arrives after the read raises a new edge, and tokio never
/// clears a readiness newer than the one the read was made under, nor
/// the closed state, so nothing is missed.
///
/// While `spin` has not passed since the call, an empty socket is polled
/// again (each yield lets the runtime poll epoll without sleeping, and
/// lets its other tasks run) before the task parks: a request/response
/// exchange through a tunnel then skips a sleep and a wake-up on each hop.
pub async fn read_spinning(from: &TcpStream, buf: &mut [u8], spin: Duration) -> io::Result<usize> {
    let started = std::time::Instant::now();
    loop {
        let mut short = None;
        let r = from.try_io(Interest::READABLE, || {
            // SAFETY: reading into a buffer we own, of its length.
            let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            if n > 0 && n < buf.len() {
                short = Some(n);
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match r {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match short {
                Some(n) => return Ok(n),
                None if started.elapsed() < spin => tokio::task::yield_now().await,
                None => from.readable().await?,
            },
            Err(e) => return Err(e),
        }
    }
}

/// Write all of `data` to a socket shared by reference: at once when the
/// socket takes it, which for small chunks is nearly always.
pub async fn write_all(to: &TcpStream, mut data: &[u8], progress: &impl Fn()) -> io::Result<()> {
    while !data.is_empty() {
        match to.try_write(data) {
            Ok(n) => {
                data = &data[n..];
                progress();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => to.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Pass a half-close on: no more data will be written.
pub fn shutdown_write(s: &TcpStream) {
    // SAFETY: shutdown(2) on an open socket we hold a reference to.
    unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_WR) };
}

/// `AsyncRead` over a socket shared by reference, so the ClientHello peek
/// can read while the other direction splices.
pub struct Reader<'a>(pub &'a TcpStream);

impl AsyncRead for Reader<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}
