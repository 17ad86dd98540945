//! The second red-team round against what crosses into the sandbox (SPEC
//! §4.1 step 6, §4.4, §4.6): host unix sockets the start-time snapshot of
//! `/proc/net/unix` cannot name (bound later, bound by a relative path,
//! renamed, hard-linked, abstract on the host's network), unix datagram
//! sends, TCP Fast Open past Landlock's connect rule, and listen() past its
//! bind rule. Each case runs a real command under `airlock run`, in both
//! tiers where the rule applies, as the current user and (when the tests
//! run as root) as uid 65534, and checks the attack fails and the
//! legitimate neighbour still works.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-crossing-attacks"))
}

fn probe() -> String {
    probe_in(&base())
}

fn fixture() -> Fixture {
    let f = Fixture::new_in(&base());
    let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
    f
}

/// A host service: `airlock-probe serve-unix NAME` run in `dir`, so that a
/// relative NAME is bound relative to it (and listed so in /proc/net/unix).
struct Service(Child);

impl Service {
    fn start(dir: &Path, name: &str) -> Service {
        let mut child = Command::new(probe())
            .args(["serve-unix", name, "60"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "serve_unix: listening", "{}", dir.display());
        let sock = dir.join(name);
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        Service(child)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn host_unix_sockets_the_snapshot_cannot_name_are_unreachable() {
    for user in users() {
        for net in ["none", "proxy", "host"] {
            let f = fixture();
            let var = tempfile::tempdir_in(base()).unwrap();
            let v = var.path();
            std::fs::set_permissions(v, std::fs::Permissions::from_mode(0o755)).unwrap();
            // Bound by a relative name: /proc/net/unix lists "rel.sock".
            let _rel = Service::start(v, "rel.sock");
            // Bound, then its directory renamed: listed under the old name.
            std::fs::create_dir(v.join("old")).unwrap();
            let _moved = Service::start(&v.join("old"), "moved.sock");
            std::fs::rename(v.join("old"), v.join("new")).unwrap();
            // A second hard link to a listed socket.
            let _listed = Service::start(v, "listed.sock");
            std::fs::hard_link(v.join("listed.sock"), v.join("link.sock")).unwrap();
            // One the policy grants, bound by a relative name too.
            let _granted = Service::start(&f.home, "granted.sock");
            f.write(
                "~/.config/airlock/policy.toml",
                &format!(
                    "[filesystem]\nunix_sockets = [\"{}\"]\n",
                    f.home.join("granted.sock").display()
                ),
            );
            let pr = probe();
            let script = format!(
                "touch started; while [ ! -e go ]; do sleep 0.05; done; \
                 for s in {v}/rel.sock {v}/new/moved.sock {v}/link.sock {v}/late.sock ../{late_rel} \
                 {home}/granted.sock; do {pr} connect-unix $s; done; {pr} inner-unix; \
                 cd {v} && {pr} connect-unix rel.sock",
                v = v.display(),
                home = f.home.display(),
                late_rel = v.file_name().unwrap().to_str().unwrap().to_string() + "/late.sock",
            );
            let child = command(&f, Tier::Full, user, &["--network", net], &script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // Bound after the sandbox started: in no snapshot.
            wait_for_file(&f.ws.join("started"));
            let _late = Service::start(v, "late.sock");
            std::fs::write(f.ws.join("go"), "").unwrap();
            let out = output_of(child);
            let ctx = format!("--network {net} as_user={user}\n{}", show(&out));
            let results: Vec<&str> = out
                .stdout
                .lines()
                .filter(|l| l.starts_with("connect_unix: "))
                .collect();
            let refused = "connect_unix: ECONNREFUSED";
            assert_eq!(
                results,
                vec![
                    refused,
                    refused,
                    refused,
                    refused,
                    refused,
                    "connect_unix: ok",
                    refused
                ],
                "{ctx}"
            );
            assert!(!out.stdout.contains("HOST-SERVICE-BANNER"), "{ctx}");
            // The sandbox's own server and client, absolute and relative.
            assert!(has_line(&out, "inner_unix: ok"), "{ctx}");
        }
    }
}

#[test]
fn host_abstract_sockets_are_unreachable_on_the_host_network() {
    let name = format!("airlock-attack-{}", std::process::id());
    let addr = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
    };
    let host = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    host.set_nonblocking(true).unwrap();
    for user in users() {
        for net in ["none", "host"] {
            let f = fixture();
            let script = format!("{pr} connect-abstract {name}", pr = probe());
            let out = run(&mut command(
                &f,
                Tier::Full,
                user,
                &["--network", net],
                &script,
            ));
            let ctx = format!("--network {net} as_user={user}\n{}", show(&out));
            // Refused by Landlock's scoping (EPERM) or by the supervisor,
            // which performs every connect() and must not lift that scoping.
            assert!(
                has_line(&out, "connect_abstract: ECONNREFUSED")
                    || has_line(&out, "connect_abstract: EPERM"),
                "{ctx}"
            );
        }
    }
    // Nothing of the sandbox's stayed connected (a probe may have come and gone).
    while let Ok((mut c, _)) = host.accept() {
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut got = vec![];
        let _ = c.read_to_end(&mut got);
        assert!(got.is_empty(), "the sandbox sent {got:?}");
    }
}

/// A sandbox whose stdin is a connection the host's listener accepted
/// (an inetd-style harness) holds a socket that carries the listener's
/// name: that must not make the host's listener look like the sandbox's
/// own, on the host's network.
#[test]
fn an_accepted_connection_does_not_make_the_hosts_listener_the_sandboxs() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("airlock-accepted-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let host = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    for user in users() {
        let f = fixture();
        let _client = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        let (accepted, _) = host.accept().unwrap();
        host.set_nonblocking(true).unwrap();
        let script = format!("{pr} connect-abstract {name}", pr = probe());
        let mut cmd = command(&f, Tier::Full, user, &["--network", "host"], &script);
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(accepted)));
        let out = run(&mut cmd);
        let ctx = format!("as_user={user}\n{}", show(&out));
        assert!(
            has_line(&out, "connect_abstract: ECONNREFUSED")
                || has_line(&out, "connect_abstract: EPERM"),
            "{ctx}"
        );
        // Nothing new reached the host's listener.
        assert!(host.accept().is_err(), "{ctx}");
        host.set_nonblocking(false).unwrap();
    }
}

#[test]
fn unix_datagram_sockets_are_refused() {
    for user in users() {
        for tier in [Tier::Full, Tier::Degraded] {
            let f = fixture();
            // A host datagram socket the sandbox can name: bound once the
            // run has started (so no start-up mask covers it), writable by
            // anyone.
            let sock = f.ws.join("host-dgram.sock");
            let script = format!(
                "touch started; while [ ! -e bound ]; do sleep 0.05; done; {} unix-dgram {}",
                probe(),
                sock.display()
            );
            let child = spawn_piped(&mut command(
                &f,
                tier,
                user,
                &["--network", "none"],
                &script,
            ));
            wait_for_file(&f.ws.join("started"));
            let host = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::fs::write(f.ws.join("bound"), "").unwrap();
            let out = output_of(child);
            let ctx = format!("{tier:?} as_user={user}\n{}", show(&out));
            for line in [
                "unix_dgram_socket: EPERM",
                "unix_dgram_socketpair: EPERM",
                "unix_raw_socketpair: EPERM",
                "unix_stream_socketpair: ok",
                "unix_seqpacket_socketpair: ok",
            ] {
                assert!(has_line(&out, line), "{line}\n{ctx}");
            }
            // Nothing reached the host's socket.
            host.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            assert!(host.recv(&mut buf).is_err(), "a datagram arrived\n{ctx}");
        }
    }
}

#[test]
fn tcp_fast_open_and_unbound_listen_do_not_pass_landlock() {
    for user in users() {
        for tier in [Tier::Full, Tier::Degraded] {
            let f = fixture();
            let origin = Origin::start("origin");
            let p = origin.port();
            let other = TcpListener::bind("127.0.0.1:0").unwrap();
            let script = format!(
                "{pr} fastopen {other}; {pr} listen-unbound; {pr} http http://origin.test:{p}/ok",
                pr = probe(),
                other = other.local_addr().unwrap(),
            );
            let allow = format!("origin.test:{p}");
            let out = run(&mut command(
                &f,
                tier,
                user,
                &[
                    "--allow",
                    &allow,
                    "--resolve",
                    "origin.test=127.0.0.1",
                    "--allow-private",
                    "127.0.0.0/8",
                    "--ask",
                    "deny",
                ],
                &script,
            ));
            let ctx = format!("{tier:?} as_user={user}\n{}", show(&out));
            assert!(has_line(&out, "fastopen: EPERM"), "{ctx}");
            let listen = match tier {
                // Only the sandbox's own empty network namespace to serve.
                Tier::Full => "listen_unbound: ok",
                // The host's network: an inbound channel past the proxy.
                Tier::Degraded => "listen_unbound: EPERM",
            };
            assert!(has_line(&out, listen), "{ctx}");
            // The proxy still works (in the full tier its connect() is one
            // the supervisor performs).
            assert!(has_line(&out, "http: HTTP/1.1 200 OK"), "{ctx}");
            assert_eq!(origin.hits(), 1, "{ctx}");
            other.set_nonblocking(true).unwrap();
            assert!(other.accept().is_err(), "fast open reached the host\n{ctx}");
        }
    }
}
