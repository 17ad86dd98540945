//! `--publish PORT`: a server the sandbox runs on 127.0.0.1:PORT inside its
//! network namespace, reachable at 127.0.0.1:PORT on the host, as Docker's
//! `-p 127.0.0.1:PORT:PORT`.
//!
//! A socket keeps the network namespace it was made in, so the supervisor
//! needs sockets made inside. It cannot enter the namespace itself (setns
//! into a network namespace wants CAP_SYS_ADMIN in its own user namespace
//! too), so the helper, while it is in the new namespaces, forks a socket
//! factory: a process whose only input is a socket pair to the supervisor,
//! and whose only output is one fresh, unconnected TCP socket per byte it
//! reads (SCM_RIGHTS). The supervisor listens on the host's port, and for
//! each connection takes a socket from the factory, connects it to the
//! sandbox's 127.0.0.1:PORT and relays. The factory is outside the
//! sandbox's PID namespace (nothing inside can see or signal it), holds no
//! descriptor but its end of the pair, and exits when the supervisor closes
//! that end or the helper dies.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};

use super::netns;

/// Ports inside the sandbox that are airlock's own: publishing them would
/// hand the host's local users the sandbox's proxy and DNS.
const OWN: &[u16] = &[
    crate::plan::SANDBOX_PROXY_PORT,
    super::capture::CAPTURE_PORT,
    super::capture::DNS_PORT,
];

/// Refuse what cannot be published, before anything is built.
pub fn check(ports: &[u16]) -> Result<()> {
    for p in ports {
        if *p == 0 {
            bail!("--publish 0: name the port the server listens on");
        }
        if OWN.contains(p) {
            bail!("--publish {p}: port {p} inside the sandbox is airlock's own (its proxy or DNS); serve on another port");
        }
    }
    Ok(())
}

/// In the helper, inside the new network namespace: fork the factory and
/// return the supervisor's end of its socket pair. The helper is single-
/// threaded here, so forking is sound.
pub fn factory() -> Result<OwnedFd> {
    let (theirs, ours) = UnixStream::pair().context("a socket pair for the publish factory")?;
    // SAFETY: the helper is single-threaded; the child only makes sockets
    // and passes them on, then exits with _exit.
    match unsafe { nix::unistd::fork() }.context("starting the publish factory")? {
        nix::unistd::ForkResult::Child => {
            drop(theirs);
            // SAFETY: prctl with constant arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            let keep = std::os::fd::AsRawFd::as_raw_fd(&ours);
            super::channel::close_inherited(keep);
            // Nor the command's terminal or pipes: a reader waiting for
            // their end must not wait on the factory.
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                for target in 0..3 {
                    // SAFETY: dup2 onto our own standard descriptors.
                    unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), target) };
                }
            }
            serve_factory(&ours);
            // SAFETY: leaving the forked child without running the
            // helper's destructors.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { .. } => {
            drop(ours);
            Ok(theirs.into())
        }
    }
}

fn serve_factory(sock: &UnixStream) {
    let mut byte = [0u8; 1];
    loop {
        match std::io::Read::read(&mut &*sock, &mut byte) {
            Ok(1) => {}
            _ => return,
        }
        // SAFETY: a plain socket() call; the descriptor is owned below.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            // Plain text instead of a descriptor: the supervisor sees none.
            let _ = std::io::Write::write_all(&mut &*sock, b"E");
            continue;
        }
        // SAFETY: just created, owned by nobody else.
        let s = unsafe { OwnedFd::from_raw_fd(raw) };
        if netns::send_fd(sock, s.as_fd()).is_err() {
            return;
        }
    }
}

/// The host side: the listening sockets, bound before the command starts,
/// and the factory.
pub struct Published {
    factory: Arc<Mutex<UnixStream>>,
    listeners: Vec<(u16, std::net::TcpListener)>,
}

impl Published {
    /// Bind 127.0.0.1:PORT on the host for each port (a port already taken
    /// there stops the run, said plainly).
    pub fn bind(factory: OwnedFd, ports: &[u16]) -> Result<Published> {
        let mut listeners = vec![];
        for &p in ports {
            let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, p)).with_context(|| {
                format!("--publish {p}: cannot listen on the host's 127.0.0.1:{p}")
            })?;
            l.set_nonblocking(true).context("--publish")?;
            listeners.push((p, l));
        }
        Ok(Published {
            factory: Arc::new(Mutex::new(UnixStream::from(factory))),
            listeners,
        })
    }

    /// Relay each connection to the host's port into the sandbox.
    pub fn serve(self, runtime: &tokio::runtime::Runtime) {
        for (port, l) in self.listeners {
            eprintln!(
                "airlock: publishing the sandbox's 127.0.0.1:{port} at the host's 127.0.0.1:{port}"
            );
            let factory = self.factory.clone();
            runtime.spawn(async move {
                let l = match tokio::net::TcpListener::from_std(l) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("--publish {port}: {e}");
                        return;
                    }
                };
                loop {
                    let Ok((client, peer)) = l.accept().await else {
                        continue;
                    };
                    let factory = factory.clone();
                    tokio::spawn(async move {
                        if let Err(e) = relay(client, port, factory).await {
                            tracing::info!(%peer, port, "--publish: {e:#}");
                        }
                    });
                }
            });
        }
    }
}

async fn relay(
    mut client: tokio::net::TcpStream,
    port: u16,
    factory: Arc<Mutex<UnixStream>>,
) -> Result<()> {
    let fd = tokio::task::spawn_blocking(move || -> Result<OwnedFd> {
        let sock = factory.lock().unwrap_or_else(|p| p.into_inner());
        std::io::Write::write_all(&mut &*sock, b"s").context("asking the factory")?;
        match netns::recv_fd(&sock)? {
            (_, Some(fd)) => Ok(fd),
            (_, None) => bail!("the factory could not make a socket"),
        }
    })
    .await
    .context("the factory")??;
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    let socket = tokio::net::TcpSocket::from_std_stream(std);
    let mut inside = socket
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .with_context(|| format!("nothing listens on 127.0.0.1:{port} in the sandbox"))?;
    let _ = inside.set_nodelay(true);
    let _ = client.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut client, &mut inside).await?;
    Ok(())
}
