//! Proxy benchmarks (issue #3), every figure a ratio measured side by side
//! in one run: through `airlock proxy` against direct, and against
//! tinyproxy when it is installed.
//!
//!     cargo build --release --workspace && ./target/release/bench-proxy
//!
//! Everything runs on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_tests::{raise_fd_limit, read_head, Home, Proxy};

const BULK: u64 = 256 << 20;

/// An origin that answers `GET /bytes/N` with N zero bytes, keep-alive.
fn origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let chunk = vec![0u8; 1 << 20];
    while let Some(head) = read_head(&mut s) {
        let path = head.split(' ').nth(1).unwrap_or("/");
        let n: u64 = path
            .rsplit('/')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2);
        let hdr = format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n");
        if s.write_all(hdr.as_bytes()).is_err() {
            return;
        }
        let mut left = n;
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

fn main() {
    raise_fd_limit();
    let home = Home::new();
    let origin = origin();
    let port = origin.port();
    let allow = format!("origin.test:{port}");
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let target = format!("origin.test:{port}");
    let mut buf = vec![0u8; 256 * 1024];
    println!("airlock proxy benchmarks, all on 127.0.0.1; ratios from one run");

    // 1. Bulk throughput, interleaved, with tinyproxy as a reference proxy.
    let tiny = tinyproxy(home.path());
    let ip_target = format!("127.0.0.1:{port}");
    let (mut d, mut p, mut tp) = (vec![], vec![], vec![]);
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
    if let Some((mut child, _)) = tiny {
        let _ = child.kill();
        let _ = child.wait();
    }

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
        Err(_) => println!("absolute-form HTTP: wrk not installed (apt-get install wrk tinyproxy)"),
    }

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
}
