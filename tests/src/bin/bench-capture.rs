//! Transparent capture against the explicit proxy (issue #14), measured
//! side by side inside one `airlock run`: the same origin reached through
//! CONNECT to the sandbox's proxy port, and by connecting to its address
//! directly (captured). Ratios are captured / explicit.
//!
//!     scripts/build-release.sh && ./target/release/bench-capture
//!
//! The origin listens on 127.0.0.2 (captured; 127.0.0.1 is the sandbox's
//! own loopback); nothing leaves the machine.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Instant;

use airlock_tests::{read_head, run, Fixture};

const BULK: u64 = 256 << 20;

fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let chunk = vec![0u8; 1 << 20];
    while let Some(head) = read_head(&mut s) {
        let n: u64 = head
            .split(' ')
            .nth(1)
            .and_then(|p| p.rsplit('/').next()?.parse().ok())
            .unwrap_or(2);
        if s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").as_bytes())
            .is_err()
        {
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

fn get(s: &mut TcpStream, host: &str, n: u64, buf: &mut [u8]) {
    s.write_all(format!("GET /bytes/{n} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .expect("write");
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
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Inside the sandbox: both ways to the origin, interleaved.
fn inner(port: u16) {
    let proxy: SocketAddr = "127.0.0.1:3128".parse().expect("proxy address");
    let target = format!("origin.test:{port}");
    // Resolved once through the sandbox's DNS, as a client with a cache.
    let addr = ("origin.test", port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| SocketAddr::new(a.ip(), port))
        .expect("the sandbox's DNS answers origin.test");
    let explicit = || {
        let mut s = TcpStream::connect(proxy).expect("proxy");
        s.set_nodelay(true).expect("nodelay");
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .expect("connect");
        let head = read_head(&mut s).expect("CONNECT response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    };
    let captured = || {
        let s = TcpStream::connect(addr).expect("captured connect");
        s.set_nodelay(true).expect("nodelay");
        s
    };
    let mut buf = vec![0u8; 256 * 1024];
    let (mut e, mut c) = (vec![], vec![]);
    for _ in 0..5 {
        let mut s = explicit();
        let t = Instant::now();
        get(&mut s, &target, BULK, &mut buf);
        e.push(BULK as f64 / t.elapsed().as_secs_f64());
        let mut s = captured();
        let t = Instant::now();
        get(&mut s, &target, BULK, &mut buf);
        c.push(BULK as f64 / t.elapsed().as_secs_f64());
    }
    let (e, c) = (median(e), median(c));
    println!(
        "bulk 256 MiB: explicit proxy {:.0} MiB/s, captured {:.0} MiB/s, ratio {:.2}x (target >= 0.9x)",
        e / 1048576.0,
        c / 1048576.0,
        c / e
    );
    let (mut e, mut c) = (vec![], vec![]);
    for _ in 0..300 {
        let t = Instant::now();
        let mut s = explicit();
        get(&mut s, &target, 100, &mut buf);
        e.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let mut s = captured();
        get(&mut s, &target, 100, &mut buf);
        c.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (e, c) = (median(e), median(c));
    println!(
        "fresh connection + small request: explicit proxy {e:.0} us, captured {c:.0} us, ratio {:.2}x (target <= 1.2x)",
        c / e
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("inner") {
        let port = args
            .get(2)
            .and_then(|p| p.parse().ok())
            .expect("inner PORT");
        inner(port);
        return;
    }
    let l = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming().map_while(Result::ok) {
            std::thread::spawn(move || serve(s));
        }
    });
    let f = Fixture::new_in(&std::path::PathBuf::from("/var/tmp/airlock-bench-capture"));
    // A copy the sandbox can run whatever the build directory is.
    let me = f.ws.join("bench-capture");
    std::fs::copy(std::env::current_exe().expect("own path"), &me).expect("copy");
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"origin.test:{port}\"]\nallow_private = [\"127.0.0.0/8\"]\n\n\
             [network.resolve]\n\"origin.test\" = \"127.0.0.2\"\n"
        ),
    );
    println!("transparent capture vs the explicit proxy, inside one airlock run");
    let out = run(&mut f.command_argv(
        &["-p", policy.to_str().expect("utf-8 path"), "--ask", "deny"],
        &[me.to_str().expect("utf-8 path"), "inner", &port.to_string()],
    ));
    print!("{}", out.stdout);
    if out.code != 0 {
        eprint!("{}", out.stderr);
        std::process::exit(1);
    }
}
