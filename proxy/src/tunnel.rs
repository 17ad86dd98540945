//! Copying a tunnel's bytes both ways (SPEC §5.1 limits): between two
//! sockets on Linux, read/write for small chunks and splice(2) for bulk;
//! otherwise reused buffers that start small (idle tunnels stay cheap) and
//! grow while reads fill them; half-close passed through, and one idle
//! timeout for the pair.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use airlock_policy::Host;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::sni::{read_hello, Hello, PeekError};

/// What the client's first bytes must be before anything goes upstream.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The host the client asked for; a ClientHello's SNI must name it.
    pub host: Host,
    /// Refuse bytes that are not TLS (port 443 is for TLS only).
    pub require_tls: bool,
}

fn check_hello(gate: &Gate, hello: &Hello) -> Result<(), String> {
    match (hello, &gate.host) {
        (Hello::NotTls, _) if gate.require_tls => Err(format!(
            "the tunnel to {} carried bytes that are not TLS",
            gate.host
        )),
        (Hello::NotTls, _) | (Hello::Tls { sni: None }, _) => Ok(()),
        (Hello::Tls { sni: Some(sni) }, host) => match Host::parse(sni) {
            Ok(h) if h == *host => Ok(()),
            _ => Err(format!("the TLS ClientHello names {sni:?}, not {host}")),
        },
    }
}

const START_BUF: usize = 8 * 1024;
const MAX_BUF: usize = 256 * 1024;

#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    pub up: u64,
    pub down: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The client's first bytes broke the tunnel's rule (SNI mismatch, not TLS).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Peek(#[from] PeekError),
    #[error("idle for {0:?}")]
    Idle(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Read the client's first bytes and check them against the gate; returns
/// what must go upstream before anything else.
async fn gate_check<R: AsyncRead + Unpin>(
    from: &mut R,
    prefix: Vec<u8>,
    gate: Option<&Gate>,
    idle: Duration,
) -> Result<Vec<u8>, TunnelError> {
    let Some(gate) = gate else { return Ok(prefix) };
    let read = read_hello(from, prefix);
    let (first, hello) = match tokio::time::timeout(idle, read).await {
        Ok(r) => r?,
        Err(_) => return Err(TunnelError::Idle(idle)),
    };
    check_hello(gate, &hello).map_err(TunnelError::Refused)?;
    Ok(first)
}

/// Copy one direction through a buffer that starts small (idle tunnels
/// stay cheap) and grows while reads fill it.
async fn copy<R, W>(
    mut from: R,
    mut to: W,
    first: &[u8],
    activity: &Activity,
    count: &mut u64,
) -> Result<(), TunnelError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if !first.is_empty() {
        to.write_all(first).await?;
        *count += first.len() as u64;
    }
    let mut buf = vec![0u8; START_BUF];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            // Half-close: pass the EOF on and keep the other way open.
            let _ = to.shutdown().await;
            return Ok(());
        }
        activity.touch();
        to.write_all(&buf[..n]).await?;
        *count += n as u64;
        if n == buf.len() && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

/// Reads that fill a buffer of this size mean a bulk transfer, which
/// switches the direction to splice; a TLS record is at most this large.
#[cfg(target_os = "linux")]
const SMALL_CHUNK: usize = 16 * 1024;
/// How long a small-chunk read polls an empty socket before it parks,
/// right after the tunnel moved bytes.
#[cfg(target_os = "linux")]
const SPIN: Duration = Duration::from_micros(50);
/// Short splices in a row that switch a direction back to copying.
#[cfg(target_os = "linux")]
const SHORT_RUN: u32 = 4;

/// One direction between two sockets, adaptively: small chunks (requests,
/// responses, interactive TLS records) by read and write through a buffer,
/// two syscalls each; once a read fills the buffer, splice(2) through a
/// pipe, so bulk bytes stay in the kernel, until splices come back short
/// again. Splicing a small chunk costs three syscalls (the socket to the
/// pipe, the pipe to the socket, and the socket's EAGAIN) and more kernel
/// work. The buffer and the pipe are made on first need: an idle tunnel
/// holds neither.
#[cfg(target_os = "linux")]
async fn socket_pump(
    from: &TcpStream,
    to: &TcpStream,
    first: &[u8],
    activity: &Activity,
    count: &mut u64,
) -> Result<(), TunnelError> {
    use crate::splice;
    let progress = || activity.touch();
    if !first.is_empty() {
        splice::write_all(to, first, &progress).await?;
        *count += first.len() as u64;
    }
    let mut buf: Vec<u8> = vec![];
    let mut pipe: Option<splice::Pipe> = None;
    let mut short_run = 0;
    loop {
        let n = match &pipe {
            Some(p) if short_run < SHORT_RUN => {
                let n = splice::fill(from, p).await?;
                if n > 0 {
                    activity.touch();
                    splice::drain(p, to, n, &progress).await?;
                }
                short_run = if n < SMALL_CHUNK { short_run + 1 } else { 0 };
                n
            }
            _ => {
                if buf.is_empty() {
                    from.readable().await?;
                    buf = vec![0u8; SMALL_CHUNK];
                }
                // Just after the tunnel moved bytes (a request went up),
                // the answer is usually microseconds away: poll for it
                // briefly before sleeping.
                let spin = if activity.idle_for() < Duration::from_millis(1) {
                    SPIN
                } else {
                    Duration::ZERO
                };
                let n = splice::read_spinning(from, &mut buf, spin).await?;
                if n > 0 {
                    activity.touch();
                    splice::write_all(to, &buf[..n], &progress).await?;
                }
                if n == buf.len() {
                    if pipe.is_none() {
                        pipe = Some(splice::Pipe::new()?);
                    }
                    short_run = 0;
                }
                n
            }
        };
        if n == 0 {
            // Half-close: pass the EOF on and keep the other way open.
            splice::shutdown_write(to);
            return Ok(());
        }
        *count += n as u64;
    }
}

/// Ends the tunnel when neither direction has moved a byte for `idle`: one
/// timer for the pair, instead of one armed around every read.
async fn watchdog(activity: &Activity, idle: Duration) -> TunnelError {
    let mut wait = idle;
    loop {
        tokio::time::sleep(wait).await;
        let quiet = activity.idle_for();
        if quiet >= idle {
            return TunnelError::Idle(idle);
        }
        wait = idle - quiet;
    }
}

/// A byte stream a tunnel can carry; a plain TCP socket says so, so the
/// tunnel can splice instead of copying.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn into_tcp(self) -> Result<TcpStream, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

impl Stream for TcpStream {
    fn into_tcp(self) -> Result<TcpStream, Self> {
        Ok(self)
    }
}

impl Stream for tokio::io::DuplexStream {}
impl Stream for hyper_util::rt::TokioIo<hyper::upgrade::Upgraded> {}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn boxed<S: Stream>(s: Result<TcpStream, S>) -> Box<dyn Io> {
    match s {
        Ok(t) => Box::new(t),
        Err(s) => Box::new(s),
    }
}

/// Copy until both sides have closed, either fails, or the pair is idle.
/// `prefix` is client data already read; it goes upstream first. With a
/// gate, the client's first bytes are checked before any of them go
/// upstream; the upstream's bytes flow from the start, so protocols where
/// the server speaks first still work.
pub async fn run<C: Stream, U: Stream>(
    client: C,
    prefix: Vec<u8>,
    upstream: U,
    gate: Option<Gate>,
    idle: Duration,
) -> (Totals, Option<TunnelError>) {
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let mut totals = Totals::default();
    let (up, down) = (&mut totals.up, &mut totals.down);
    let pumps = async {
        match (client.into_tcp(), upstream.into_tcp()) {
            #[cfg(target_os = "linux")]
            (Ok(c), Ok(u)) => {
                let upward = async {
                    let first =
                        gate_check(&mut crate::splice::Reader(&c), prefix, gate.as_ref(), idle)
                            .await?;
                    socket_pump(&c, &u, &first, &activity, up).await
                };
                tokio::try_join!(upward, socket_pump(&u, &c, &[], &activity, down))
            }
            (c, u) => {
                let (mut cr, cw) = tokio::io::split(boxed(c));
                let (ur, uw) = tokio::io::split(boxed(u));
                let upward = async {
                    let first = gate_check(&mut cr, prefix, gate.as_ref(), idle).await?;
                    copy(cr, uw, &first, &activity, up).await
                };
                tokio::try_join!(upward, copy(ur, cw, &[], &activity, down))
            }
        }
    };
    let result = tokio::select! {
        r = pumps => r.map(|_| ()),
        e = watchdog(&activity, idle) => Err(e),
    };
    (totals, result.err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    fn pattern(from: usize, len: usize) -> Vec<u8> {
        (from..from + len).map(|i| (i % 251) as u8).collect()
    }

    /// Small chunks, a bulk stretch (which switches to splice) and small
    /// chunks again (which switch back) arrive intact and in order.
    async fn send_mixed(mut w: impl AsyncWrite + Unpin) -> usize {
        let mut at = 0;
        for len in std::iter::repeat_n(300, 20)
            .chain(std::iter::repeat_n(1 << 20, 6))
            .chain(std::iter::repeat_n(700, 20))
        {
            w.write_all(&pattern(at, len)).await.unwrap();
            at += len;
            if len < 1000 {
                // Let each small chunk go out as its own read.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        w.shutdown().await.unwrap();
        at
    }

    async fn receive(mut r: impl AsyncRead + Unpin) -> usize {
        let mut got = vec![];
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == pattern(0, got.len()), "bytes changed in the tunnel");
        got.len()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_then_bulk_then_small_both_ways() {
        let (client, near) = pair().await;
        let (far, origin) = pair().await;
        let tunnel = tokio::spawn(run(near, vec![], far, None, Duration::from_secs(10)));
        let (cr, cw) = client.into_split();
        let (or, ow) = origin.into_split();
        let (sent_up, sent_down, got_up, got_down) =
            tokio::join!(send_mixed(cw), send_mixed(ow), receive(or), receive(cr));
        assert_eq!((sent_up, sent_down), (got_up, got_down));
        let (totals, err) = tunnel.await.unwrap();
        assert!(err.is_none(), "{err:?}");
        assert_eq!((totals.up, totals.down), (sent_up as u64, sent_down as u64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_pair_is_closed_and_a_busy_direction_keeps_it_open() {
        let (client, near) = pair().await;
        let (far, mut origin) = pair().await;
        let idle = Duration::from_millis(300);
        let start = Instant::now();
        let tunnel = tokio::spawn(run(near, vec![], far, None, idle));
        // Only the origin speaks, every 100 ms for a second: not idle.
        for _ in 0..10 {
            origin.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!tunnel.is_finished(), "closed while one direction was busy");
        let (_, err) = tunnel.await.unwrap();
        assert!(matches!(err, Some(TunnelError::Idle(_))), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(3));
        drop(client);
    }
}
