//! Proxy benchmarks (issues #3 and #16), every figure measured side by
//! side in one run: through `airlock proxy` against direct, and against
//! squid (and tinyproxy) when installed. Each reference is optional; a
//! missing one is named as skipped.
//!
//!     apt-get install -y squid wrk tinyproxy    # the references (optional)
//!     scripts/build-release.sh && ./target/release/bench-proxy
//!
//! squid runs from a generated configuration in a temporary directory (see
//! `airlock_tests::squid`), on a free loopback port; nothing is written to
//! system directories. Everything runs on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_tests::squid::Squid;
use airlock_tests::tls::TestPki;
use airlock_tests::{raise_fd_limit, read_head, Home, Proxy};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};

const BULK: u64 = 256 << 20;

/// An origin that answers `GET /bytes/N` with N zero bytes, keep-alive.
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || serve(&mut s));
        }
    });
    addr
}

/// The same origin over TLS, as `origin.test`, signed by the test CA.
fn tls_origin(pki: &TestPki) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let cfg = pki.server_config();
    std::thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            let _ = s.set_nodelay(true);
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                if let Ok(conn) = rustls::ServerConnection::new(cfg) {
                    serve(&mut rustls::StreamOwned::new(conn, s));
                }
            });
        }
    });
    addr
}

fn serve<S: Read + Write>(s: &mut S) {
    let mut chunk = vec![];
    while let Some(head) = read_head(s) {
        let path = head.split(' ').nth(1).unwrap_or("/");
        let n: u64 = path
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2);
        let mut hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        // A small answer goes out in one write (one TLS record).
        let mut left = n;
        if n <= 16 << 10 {
            hdr.resize(hdr.len() + n as usize, 0);
            left = 0;
        } else if chunk.is_empty() {
            chunk = vec![0u8; 1 << 20];
        }
        if s.write_all(&hdr).is_err() {
            return;
        }
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            if s.write_all(&chunk[..k]).is_err() {
                return;
            }
            left -= k as u64;
        }
    }
}

fn get(s: &mut TcpStream, host: &str, n: u64, buf: &mut [u8]) -> u64 {
    let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(req.as_bytes()).expect("write");
    let head = read_head(s).expect("response head");
    let len: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: ")?.trim().parse().ok())
        .expect("content-length");
    let mut got = 0;
    while got < len {
        let k = s.read(buf).expect("read");
        assert!(k > 0, "short body");
        got += k as u64;
    }
    got
}

fn connect_via(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).expect("proxy");
    s.set_nodelay(true).expect("nodelay");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .expect("connect");
    let head = read_head(&mut s).expect("CONNECT response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    s
}

fn direct(origin: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(origin).expect("origin");
    s.set_nodelay(true).expect("nodelay");
    s
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A client trusting the test CA, with session resumption off: every
/// fresh connection pays a full handshake, the same on every path.
fn tls_client(pki: &TestPki) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&pki.ca_pem)
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
    cfg.resumption = rustls::client::Resumption::disabled();
    Arc::new(cfg)
}

/// How a TLS connection reaches the origin: directly, or by CONNECT to
/// this target through this proxy.
#[derive(Clone, Copy)]
enum Via<'a> {
    Direct,
    Proxy(SocketAddr, &'a str),
}

fn tls_open(via: Via, origin: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> Tls {
    let tcp = match via {
        Via::Direct => direct(origin),
        Via::Proxy(p, target) => connect_via(p, target),
    };
    let name = ServerName::try_from("origin.test").expect("name");
    let conn = rustls::ClientConnection::new(cfg.clone(), name).expect("tls");
    rustls::StreamOwned::new(conn, tcp)
}

/// One GET of `n` bytes on a keep-alive TLS connection, reading exactly
/// its response (one request record, buffered reads: the client's own
/// cost stays small next to the path being measured).
fn tls_get(tls: &mut Tls, n: usize, acc: &mut Vec<u8>) {
    let req = format!("GET /bytes/{n} HTTP/1.1\r\nHost: origin.test\r\n\r\n");
    tls.write_all(req.as_bytes()).expect("request");
    acc.clear();
    let mut chunk = [0u8; 16 << 10];
    let mut need = usize::MAX;
    while acc.len() < need {
        let k = tls.read(&mut chunk).expect("read");
        assert!(k > 0, "short response");
        acc.extend_from_slice(&chunk[..k]);
        if need == usize::MAX {
            if let Some(end) = acc.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&acc[..end]);
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: ")?.trim().parse().ok())
                    .expect("content-length");
                need = end + 4 + len;
            }
        }
    }
    assert_eq!(acc.len(), need, "more than one response");
}

/// One keep-alive TLS connection on one path, with what it has done.
struct KeepAlive {
    tls: Tls,
    acc: Vec<u8>,
    /// The proxy process on this path, whose CPU time is counted.
    pid: Option<u32>,
    rps: Vec<f64>,
    requests: u64,
    cpu_ticks: u64,
}

impl KeepAlive {
    fn open(
        via: Via,
        origin: SocketAddr,
        cfg: &Arc<rustls::ClientConfig>,
        pid: Option<u32>,
    ) -> KeepAlive {
        let mut k = KeepAlive {
            tls: tls_open(via, origin, cfg),
            acc: Vec::with_capacity(4096),
            pid,
            rps: vec![],
            requests: 0,
            cpu_ticks: 0,
        };
        for _ in 0..50 {
            tls_get(&mut k.tls, 1024, &mut k.acc);
        }
        k
    }

    /// Sequential 1 KiB requests for `dur`.
    fn round(&mut self, dur: Duration) {
        let cpu = self.pid.map(cpu_ticks);
        let (start, mut n) = (Instant::now(), 0u64);
        while start.elapsed() < dur {
            for _ in 0..10 {
                tls_get(&mut self.tls, 1024, &mut self.acc);
            }
            n += 10;
        }
        self.rps.push(n as f64 / start.elapsed().as_secs_f64());
        self.requests += n;
        if let (Some(pid), Some(before)) = (self.pid, cpu) {
            self.cpu_ticks += cpu_ticks(pid).saturating_sub(before);
        }
    }

    /// The proxy's CPU time per request, in microseconds.
    fn cpu_us(&self) -> f64 {
        // SAFETY: sysconf only reads a configuration value.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.cpu_ticks as f64 / hz * 1e6 / self.requests.max(1) as f64
    }
}

/// User plus system time of a process, all its threads, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are
    // the 14th and 15th fields of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum()
}

/// A new connection (CONNECT when proxied), a full TLS handshake and one
/// 1 KiB GET: microseconds.
fn fresh_tls_us(via: Via, origin: SocketAddr, cfg: &Arc<rustls::ClientConfig>) -> f64 {
    let mut acc = Vec::with_capacity(4096);
    let t = Instant::now();
    let mut tls = tls_open(via, origin, cfg);
    tls_get(&mut tls, 1024, &mut acc);
    let us = t.elapsed().as_secs_f64() * 1e6;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    us
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .trim()
                .trim_end_matches(" kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Requests per second from wrk, sending absolute-form requests to a proxy.
fn wrk_rps(proxy: SocketAddr, url: &str, dir: &std::path::Path) -> Option<f64> {
    let script = dir.join("absolute.lua");
    std::fs::write(&script, format!("wrk.path = \"{url}\"\n")).ok()?;
    let out = Command::new("wrk")
        .args(["-t2", "-c32", "-d5s", "-s"])
        .arg(&script)
        .arg(format!("http://{proxy}/"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx") {
        eprintln!("wrk saw errors: {text}");
        return None;
    }
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:")?.trim().parse().ok())
}

fn tinyproxy(dir: &std::path::Path) -> Option<(std::process::Child, SocketAddr)> {
    let bin = ["/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let conf = dir.join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!("Port {port}\nListen 127.0.0.1\nTimeout 600\nMaxClients 1024\nAllow 127.0.0.1\nLogLevel Critical\nDisableViaHeader Yes\n"),
    )
    .ok()?;
    let child = Command::new(bin)
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
    for _ in 0..100 {
        if TcpStream::connect(addr).is_ok() {
            return Some((child, addr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `BENCH_PROXY_ONLY=https,bulk,fresh,wrk,rss` runs only the named cases.
fn wanted(case: &str) -> bool {
    std::env::var("BENCH_PROXY_ONLY").map_or(true, |only| only.split(',').any(|c| c.trim() == case))
}

fn main() {
    raise_fd_limit();
    let home = Home::new();
    let origin = origin();
    let port = origin.port();
    let allow = format!("origin.test:{port}");
    let pki = TestPki::new(&home.path().join("pki"), &["origin.test"]);
    let tls = tls_origin(&pki);
    let allow_tls = format!("origin.test:{}", tls.port());
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--allow",
            &allow_tls,
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let target = format!("origin.test:{port}");
    let mut buf = vec![0u8; 256 * 1024];
    println!("airlock proxy benchmarks, all on 127.0.0.1; ratios from one run");
    let cfg = tls_client(&pki);
    let squid = Squid::start(&[port, tls.port()]);
    match &squid {
        Some(s) => println!("reference proxy: squid on {}", s.addr),
        None => println!("squid: skipped (not installed or did not start; apt-get install squid)"),
    }
    if wanted("https") {
        https_cases(&proxy, squid.as_ref(), tls, &cfg);
    }

    if wanted("bulk") {
        // 1. Bulk throughput, interleaved, with tinyproxy as a reference proxy.
        let tiny = tinyproxy(home.path());
        let ip_target = format!("127.0.0.1:{port}");
        let (mut d, mut p, mut tp, mut sp) = (vec![], vec![], vec![], vec![]);
        for _ in 0..5 {
            let mut s = direct(origin);
            let t = Instant::now();
            get(&mut s, &target, BULK, &mut buf);
            d.push(BULK as f64 / t.elapsed().as_secs_f64());
            let mut s = connect_via(proxy.addr, &target);
            let t = Instant::now();
            get(&mut s, &target, BULK, &mut buf);
            p.push(BULK as f64 / t.elapsed().as_secs_f64());
            if let Some((_, addr)) = &tiny {
                let mut s = connect_via(*addr, &ip_target);
                let start = Instant::now();
                get(&mut s, &ip_target, BULK, &mut buf);
                tp.push(BULK as f64 / start.elapsed().as_secs_f64());
            }
            if let Some(sq) = &squid {
                let mut s = connect_via(sq.addr, &ip_target);
                let start = Instant::now();
                get(&mut s, &ip_target, BULK, &mut buf);
                sp.push(BULK as f64 / start.elapsed().as_secs_f64());
            }
        }
        let (d, p) = (median(d), median(p));
        println!(
            "bulk 256 MiB over CONNECT: direct {:.0} MiB/s, airlock {:.0} MiB/s, ratio {:.2}x (target >= 0.8x)",
            d / 1048576.0,
            p / 1048576.0,
            p / d
        );
        if !tp.is_empty() {
            let tp = median(tp);
            println!(
                "  reference: tinyproxy {:.0} MiB/s, ratio {:.2}x of direct; airlock/tinyproxy {:.2}x",
                tp / 1048576.0,
                tp / d,
                p / tp
            );
        }
        if !sp.is_empty() {
            let sp = median(sp);
            println!(
                "  reference: squid {:.0} MiB/s, ratio {:.2}x of direct; airlock/squid {:.2}x",
                sp / 1048576.0,
                sp / d,
                p / sp
            );
        }
        if let Some((mut child, _)) = tiny {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    if wanted("fresh") {
        // 2. Fresh connection plus one small request, interleaved.
        let (mut d, mut p) = (vec![], vec![]);
        for _ in 0..300 {
            let t = Instant::now();
            let mut s = direct(origin);
            get(&mut s, &target, 100, &mut buf);
            d.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            let mut s = connect_via(proxy.addr, &target);
            get(&mut s, &target, 100, &mut buf);
            p.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let (d, p) = (median(d), median(p));
        println!("fresh CONNECT + small request: direct {d:.0} us, proxy {p:.0} us, ratio {:.2}x (target <= 2x)", p / d);
    }
    if wanted("wrk") {
        // 3. Absolute-form requests per second under wrk, against tinyproxy.
        let url = format!("http://origin.test:{port}/bytes/100");
        let url_ip = format!("http://127.0.0.1:{port}/bytes/100");
        match Command::new("wrk").arg("--version").output() {
            Ok(_) => {
                let ours = wrk_rps(proxy.addr, &url, home.path());
                let theirs = tinyproxy(home.path()).and_then(|(mut child, addr)| {
                    let r = wrk_rps(addr, &url_ip, home.path());
                    let _ = child.kill();
                    let _ = child.wait();
                    r
                });
                match (ours, theirs) {
                    (Some(o), Some(t)) => println!(
                        "absolute-form HTTP, wrk -t2 -c32: airlock {o:.0} req/s, tinyproxy {t:.0} req/s, ratio {:.2}x",
                        o / t
                    ),
                    (Some(o), None) => println!("absolute-form HTTP, wrk -t2 -c32: airlock {o:.0} req/s (tinyproxy not installed)"),
                    _ => println!("absolute-form HTTP: wrk failed"),
                }
            }
            Err(_) => {
                println!("absolute-form HTTP: wrk not installed (apt-get install wrk tinyproxy)")
            }
        }
    }
    if wanted("rss") {
        // 4. Memory: idle, then with 1000 idle tunnels.
        std::thread::sleep(Duration::from_millis(500));
        let idle = rss_kib(proxy.pid());
        let tunnels: Vec<TcpStream> = (0..1000)
            .map(|_| connect_via(proxy.addr, &target))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let loaded = rss_kib(proxy.pid());
        println!(
            "proxy RSS: {:.1} MiB after the runs above (target <= 30 MB idle), {:.1} KiB per idle tunnel over 1000 tunnels (target <= 64 KiB)",
            idle as f64 / 1024.0,
            (loaded.saturating_sub(idle)) as f64 / 1000.0
        );
        drop(tunnels);
        let fresh = Proxy::start(&home, &["--allow", &allow]);
        std::thread::sleep(Duration::from_millis(300));
        println!(
            "proxy RSS at start: {:.1} MiB",
            rss_kib(fresh.pid()) as f64 / 1024.0
        );
        if let Some(sq) = &squid {
            println!(
                "  reference: squid RSS {:.1} MiB after the runs above",
                rss_kib(sq.pid()) as f64 / 1024.0
            );
        }
    }
}

/// HTTPS through a CONNECT tunnel (issue #16): keep-alive small records,
/// then fresh connections, airlock and squid interleaved with direct.
fn https_cases(
    proxy: &Proxy,
    squid: Option<&Squid>,
    origin: SocketAddr,
    cfg: &Arc<rustls::ClientConfig>,
) {
    let named = format!("origin.test:{}", origin.port());
    // squid resolves CONNECT names itself; it is given the address.
    let ip = format!("127.0.0.1:{}", origin.port());
    let ours = Via::Proxy(proxy.addr, &named);
    let theirs = squid.map(|s| Via::Proxy(s.addr, &ip));
    // Short rounds, interleaved, on connections kept open throughout: the
    // load of a shared machine drifts over seconds, and it then falls on
    // every path alike. The proxies' CPU time per request is the figure
    // that load moves least.
    let dur = Duration::from_millis(250);
    let mut d = KeepAlive::open(Via::Direct, origin, cfg, None);
    let mut a = KeepAlive::open(ours, origin, cfg, Some(proxy.pid()));
    let mut q = theirs.map(|t| KeepAlive::open(t, origin, cfg, squid.map(Squid::pid)));
    for _ in 0..24 {
        d.round(dur);
        a.round(dur);
        if let Some(q) = &mut q {
            q.round(dur);
        }
    }
    let (dr, ar) = (median(d.rps.clone()), median(a.rps.clone()));
    let vs = match &q {
        None => "squid skipped".to_string(),
        Some(q) => {
            let qr = median(q.rps.clone());
            format!(
                "squid {qr:.0} req/s, {:.1} us CPU/request; airlock/squid {:.2}x (target >= 1.2x)",
                q.cpu_us(),
                ar / qr
            )
        }
    };
    println!(
        "keep-alive HTTPS over CONNECT, 1 KiB responses, one connection each (medians of 24 interleaved 0.25 s rounds): direct {dr:.0} req/s; airlock {ar:.0} req/s ({:.2}x of direct), {:.1} us CPU/request; {vs}",
        ar / dr,
        a.cpu_us()
    );

    let (mut d, mut a, mut q) = (vec![], vec![], vec![]);
    for _ in 0..500 {
        d.push(fresh_tls_us(Via::Direct, origin, cfg));
        a.push(fresh_tls_us(ours, origin, cfg));
        if let Some(t) = theirs {
            q.push(fresh_tls_us(t, origin, cfg));
        }
    }
    let added = |v: &[f64]| {
        (
            percentile(v, 0.5) - percentile(&d, 0.5),
            percentile(v, 0.99) - percentile(&d, 0.99),
        )
    };
    let (a50, a99) = added(&a);
    let vs = if q.is_empty() {
        "squid skipped".to_string()
    } else {
        let (q50, q99) = added(&q);
        format!("squid +{q50:.0} / +{q99:.0} us (target: airlock <= squid at p50)")
    };
    println!(
        "fresh HTTPS connection (CONNECT + TLS handshake + 1 KiB GET), 500 each: direct p50 {:.0} us p99 {:.0} us; added p50/p99: airlock +{a50:.0} / +{a99:.0} us, {vs}",
        percentile(&d, 0.5),
        percentile(&d, 0.99)
    );
}
