//! Inspected HTTPS benchmark (issue #6), side by side in one run:
//! requests per second with keep-alive through `airlock proxy --inspect`
//! against mitmproxy (Debian's `mitmdump`), and the added latency of a
//! fresh inspected connection against a direct one.
//!
//!     scripts/build-release.sh && ./target/release/bench-inspect

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_tests::tls::{TestPki, TlsOrigin};
use airlock_tests::{airlock, read_head, Home, Proxy};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};

fn client_config(ca: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)
        .expect("ca file")
        .flatten()
    {
        roots.add(c).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to api.test, through `proxy` (CONNECT) or direct.
/// mitmproxy resolves CONNECT names itself, so it is given the address.
fn open(proxy: Option<SocketAddr>, origin: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Tls {
    open_as(proxy, origin, cfg, "api.test")
}

fn open_as(
    proxy: Option<SocketAddr>,
    origin: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    connect_host: &str,
) -> Tls {
    let tcp = match proxy {
        Some(p) => {
            let mut s = TcpStream::connect(p).expect("proxy");
            s.set_nodelay(true).ok();
            let target = format!("{connect_host}:{}", origin.port());
            write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").expect("connect");
            let head = read_head(&mut s).expect("CONNECT answer");
            assert!(head.contains(" 200"), "{head}");
            s
        }
        None => {
            let s = TcpStream::connect(origin).expect("origin");
            s.set_nodelay(true).ok();
            s
        }
    };
    let conn =
        rustls::ClientConnection::new(cfg.clone(), ServerName::try_from("api.test").expect("name"))
            .expect("tls");
    rustls::StreamOwned::new(conn, tcp)
}

fn request(tls: &mut Tls, port: u16) {
    write!(tls, "GET /bench HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").expect("request");
    let head = read_head(tls).expect("response");
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).expect("body");
}

/// Requests per second over `conns` keep-alive connections for `secs`.
fn rps(
    proxy: Option<SocketAddr>,
    origin: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    conns: usize,
    secs: u64,
) -> f64 {
    rps_as(proxy, origin, cfg, conns, secs, "api.test")
}

fn rps_as(
    proxy: Option<SocketAddr>,
    origin: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
    conns: usize,
    secs: u64,
    connect_host: &'static str,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let mut tls = open_as(proxy, origin, &cfg, connect_host);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    request(&mut tls, origin.port());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    total as f64 / secs as f64
}

fn fresh_latency(
    proxy: Option<SocketAddr>,
    origin: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
) -> f64 {
    let t = Instant::now();
    let mut tls = open(proxy, origin, cfg);
    request(&mut tls, origin.port());
    t.elapsed().as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mitmdump(dir: &Path, origin_ca: &Path) -> Option<(Child, SocketAddr, PathBuf)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let confdir = dir.join("mitm");
    let mut child = Command::new("mitmdump")
        .args([
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            &port.to_string(),
            "-q",
        ])
        .args(["--set", &format!("confdir={}", confdir.display())])
        .args([
            "--set",
            &format!("ssl_verify_upstream_trusted_ca={}", origin_ca.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
    let ca = confdir.join("mitmproxy-ca-cert.pem");
    for _ in 0..300 {
        if TcpStream::connect(addr).is_ok() && ca.exists() {
            return Some((child, addr, ca));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = BufReader::new(&mut e).read_line(&mut err);
    }
    eprintln!("mitmdump did not start: {err}");
    let _ = child.kill();
    None
}

fn main() {
    let home = Home::new();
    let pki = TestPki::new(&home.path().join("pki"), &["api.test"]);
    let origin = TlsOrigin::start(&pki, "origin");
    let allow = format!("api.test:{}", origin.port());
    let mut cmd = airlock(home.path());
    cmd.env("XDG_DATA_HOME", home.path().join("data"));
    let proxy = Proxy::start_with(
        cmd,
        &[
            "--allow",
            &allow,
            "--inspect",
            "api.test",
            "--resolve",
            "api.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--upstream-ca",
            pki.ca_pem.to_str().unwrap(),
        ],
    );
    let _ = proxy.log();
    let airlock_ca = home.path().join("data/airlock/ca/ca.pem");
    // The CA is created on first use: make one request first.
    for _ in 0..100 {
        if airlock_ca.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ours = client_config(&airlock_ca);
    let direct = client_config(&pki.ca_pem);
    let mut t = open(Some(proxy.addr), origin.addr, &ours);
    request(&mut t, origin.port());
    drop(t);

    println!("inspected HTTPS benchmarks, all on 127.0.0.1; ratios from one run");
    let (mut d, mut p) = (vec![], vec![]);
    for _ in 0..100 {
        d.push(fresh_latency(None, origin.addr, &direct));
        p.push(fresh_latency(Some(proxy.addr), origin.addr, &ours));
    }
    let (d, p) = (median(d), median(p));
    println!("fresh connection + one request: direct {d:.0} us, airlock inspected {p:.0} us, added {:.0} us ({:.2}x)", p - d, p / d);

    let conns = 4;
    let direct_rps = rps(None, origin.addr, &direct, conns, 3);
    let airlock_rps = rps(Some(proxy.addr), origin.addr, &ours, conns, 3);
    println!("keep-alive requests/s ({conns} connections): direct {direct_rps:.0}, airlock inspected {airlock_rps:.0}");
    match mitmdump(home.path(), &pki.ca_pem) {
        Some((mut child, addr, ca)) => {
            let theirs = client_config(&ca);
            let mitm_rps = rps_as(Some(addr), origin.addr, &theirs, conns, 3, "127.0.0.1");
            println!(
                "  mitmproxy (mitmdump) inspected {mitm_rps:.0} requests/s: airlock is {:.1}x (target >= 20x)",
                airlock_rps / mitm_rps
            );
            let _ = child.kill();
            let _ = child.wait();
        }
        None => println!("  mitmproxy: mitmdump not installed (apt-get install mitmproxy)"),
    }
}
