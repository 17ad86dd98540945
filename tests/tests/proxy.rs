//! The egress proxy end to end: `airlock proxy` on 127.0.0.1 against local
//! origins, driven by curl and by raw sockets. No test sends a packet to
//! any address but loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use airlock_tests::*;

fn allow_origin(o: &Origin) -> String {
    format!("origin.test:{}", o.port())
}

/// A proxy that allows `origin.test:<port>` (resolved to 127.0.0.1) and
/// asks for nothing else.
fn proxy_for(home: &Home, origin: &Origin, extra: &[&str]) -> Proxy {
    let allow = allow_origin(origin);
    let mut args = vec![
        "--allow",
        &allow,
        "--resolve",
        "origin.test=127.0.0.1",
        "--allow-private",
        "127.0.0.0/8",
        "--ask",
        "deny",
    ];
    args.extend_from_slice(extra);
    Proxy::start(home, &args)
}

#[test]
fn allowed_http_connect_and_socks5() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let proxy = proxy_for(&home, &origin, &[]);
    let url = format!("http://origin.test:{}/hello?x=1", origin.port());

    let plain = curl(&["-x", &proxy.url(), &url]);
    assert_eq!(status_of(&plain), 200, "{}{}", plain.stdout, plain.stderr);
    assert!(
        plain.stdout.contains(&format!(
            "origin GET /hello?x=1 host=origin.test:{}",
            origin.port()
        )),
        "{}",
        plain.stdout
    );

    let tunnel = curl(&["-p", "-x", &proxy.url(), &url]);
    assert_eq!(
        status_of(&tunnel),
        200,
        "{}{}",
        tunnel.stdout,
        tunnel.stderr
    );
    assert!(tunnel.stdout.contains("origin GET /hello?x=1"));

    let socks = curl(&["-x", &format!("socks5h://{}", proxy.addr), &url]);
    assert_eq!(status_of(&socks), 200, "{}{}", socks.stdout, socks.stderr);
    assert!(socks.stdout.contains("origin GET /hello?x=1"));

    // POST with a body, forwarded with keep-alive in one curl run.
    let post = curl(&["-x", &proxy.url(), "-d", "payload", &url, &url]);
    assert_eq!(
        post.stdout.matches("origin POST /hello?x=1").count(),
        2,
        "{}",
        post.stdout
    );
}

#[test]
fn proxy_headers_are_stripped() {
    let home = Home::new();
    let raw = RawOrigin::start();
    let allow = format!("origin.test:{}", raw.addr.port());
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
    let req = format!(
        "GET http://origin.test:{}/p HTTP/1.1\r\nHost: origin.test:{}\r\nProxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nX-Keep: 2\r\n\r\n",
        raw.addr.port(),
        raw.addr.port()
    );
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while raw.received().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let got = String::from_utf8_lossy(&raw.received()[0]).to_lowercase();
    assert!(got.starts_with("get /p http/1.1"), "{got}");
    assert!(got.contains("x-keep: 2"), "{got}");
    for gone in ["proxy-authorization", "proxy-connection", "x-hop"] {
        assert!(!got.contains(gone), "{gone} forwarded: {got}");
    }
}

fn refused(out: &Out, status: u16, reason: &str) {
    assert_eq!(status_of(out), status, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        header(out, "x-airlock-reason"),
        Some(reason),
        "{}",
        out.stdout
    );
    // curl shows no body for a refused CONNECT; for the rest, check it.
    if status == 403 && out.code == 0 {
        assert_eq!(header(out, "x-airlock-decision"), Some("deny"));
        assert!(
            out.stdout.contains("airlock blocked the connection"),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn every_refusal_reason() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let p = origin.port();
    let policy = home.write(
        "policy.toml",
        &format!(
            "[network]\nallow = [\"origin.test:{p}\", \"scoped.test:1\", \"private.test:{p}\", \"closed.test:*\"]\n\
             deny = [\"bad.origin.test\"]\nunknown = \"deny\"\n\
             resolve = {{ \"private.test\" = \"127.0.0.1\", \"closed.test\" = \"127.0.0.1\" }}\n"
        ),
    );
    let managed = home.write(
        "managed.toml",
        "[network]\ndeny = [\"corp-blocked.test\"]\nallow = [\"corp-blocked.test:*\"]\n",
    );
    let mut cmd = airlock(home.path());
    cmd.env("AIRLOCK_MANAGED_POLICY", &managed);
    let proxy = Proxy::start_with(
        cmd,
        &[
            "-p",
            policy.to_str().unwrap(),
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.1/32",
        ],
    );
    let px = proxy.url();
    let audit = home.path().join("audit.jsonl");
    let _ = audit;

    refused(
        &curl(&["-x", &px, &format!("http://unlisted.test:{p}/")]),
        403,
        "not-allowlisted",
    );
    refused(
        &curl(&["-x", &px, &format!("http://bad.origin.test:{p}/")]),
        403,
        "denylisted",
    );
    refused(
        &curl(&["-p", "-x", &px, "http://scoped.test:2/"]),
        403,
        "port-not-allowed",
    );
    refused(
        &curl(&["-x", &px, &format!("http://corp-blocked.test:{p}/")]),
        403,
        "managed-deny",
    );

    // The managed deny names its file and line in the body.
    let out = curl(&["-x", &px, &format!("http://corp-blocked.test:{p}/")]);
    assert!(
        out.stdout.contains(&format!("{}:2", managed.display())),
        "{}",
        out.stdout
    );

    // Closed port on an allowed host: 502.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    refused(
        &curl(&["-x", &px, &format!("http://closed.test:{closed}/")]),
        502,
        "upstream-unreachable",
    );

    let home2 = Home::new();
    let proxy2 = Proxy::start(
        &home2,
        &[
            "--deny",
            "denied.test",
            "--allow",
            "*.allowed.test",
            "--ask",
            "deny",
            "--resolve",
            "x.allowed.test=127.0.0.1",
        ],
    );
    refused(
        &curl(&["-x", &proxy2.url(), "http://denied.test/"]),
        403,
        "denylisted",
    );
    // --ask deny asks nobody (SPEC §5.2): not-allowlisted. A person's
    // refusal, approval-denied, is tested in approve.rs.
    refused(
        &curl(&["-x", &proxy2.url(), "http://unknown.test/"]),
        403,
        "not-allowlisted",
    );
    // Allowed name, loopback answer, no allow_private: private-address.
    refused(
        &curl(&["-x", &proxy2.url(), "http://x.allowed.test/"]),
        403,
        "private-address",
    );
    let body = curl(&["-x", &proxy2.url(), "http://x.allowed.test/"]);
    assert!(body.stdout.contains("--allow-private"), "{}", body.stdout);
    // Invalid host: raw CONNECT with a bad name.
    let resp = raw_exchange(
        proxy2.addr,
        b"CONNECT bad_host!.test:443 HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(raw_status(&resp), 400, "{text}");
    assert!(
        text.to_lowercase()
            .contains("x-airlock-reason: invalid-host"),
        "{text}"
    );
}

#[test]
fn upstream_timeout_is_504() {
    // A listener with a full accept queue drops further SYNs, so the
    // proxy's connect times out, all on loopback.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.listen(0).unwrap();
    let addr: SocketAddr = sock.local_addr().unwrap().as_socket().unwrap();
    let _fill: Vec<_> = (0..4)
        .filter_map(|_| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
            s.set_nonblocking(true).ok()?;
            let _ = s.connect(&addr.into());
            Some(s)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let home = Home::new();
    let policy = home.write("p.toml", "[network]\nconnect_timeout = \"1s\"\n");
    let allow = format!("slow.test:{}", addr.port());
    let proxy = Proxy::start(
        &home,
        &[
            "-p",
            policy.to_str().unwrap(),
            "--allow",
            &allow,
            "--resolve",
            "slow.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let started = Instant::now();
    let out = curl(&[
        "-x",
        &proxy.url(),
        &format!("http://slow.test:{}/", addr.port()),
    ]);
    refused(&out, 504, "upstream-timeout");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn metadata_address_is_private_even_when_the_name_is_allowed() {
    if !blackhole("169.254.169.254/32") {
        eprintln!("skipped: needs root and iproute2 to blackhole 169.254.169.254 first");
        return;
    }
    let home = Home::new();
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            "metadata.test",
            "--resolve",
            "metadata.test=169.254.169.254",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    refused(
        &curl(&["-x", &proxy.url(), "http://metadata.test/latest/meta-data/"]),
        403,
        "private-address",
    );
    // And as an IP literal, even if allowed by IP.
    let home = Home::new();
    let proxy = Proxy::start(&home, &["--allow", "169.254.169.254"]);
    refused(
        &curl(&["-x", &proxy.url(), "http://169.254.169.254/"]),
        403,
        "private-address",
    );
}

fn connect_status(proxy: SocketAddr, authority: &str) -> u16 {
    let req = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let head = read_head(&mut s).unwrap_or_default();
    raw_status(head.as_bytes())
}

#[test]
fn ip_literal_matrix() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let p = origin.port();
    let allow = format!("127.0.0.1:{p}");
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ],
    );
    for spelling in [
        "127.0.0.1",
        "2130706433",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
    ] {
        assert_eq!(
            connect_status(proxy.addr, &format!("{spelling}:{p}")),
            200,
            "{spelling}"
        );
    }
    // ::1 is another address: the 127.0.0.1 rule does not cover it.
    assert_eq!(connect_status(proxy.addr, &format!("[::1]:{p}")), 403);
    // 127.0.0.2 is too.
    assert_eq!(connect_status(proxy.addr, &format!("127.0.0.2:{p}")), 403);
    // A wildcard never matches an IP.
    let home = Home::new();
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            "*.example.test:*",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ],
    );
    assert_eq!(connect_status(proxy.addr, &format!("127.0.0.1:{p}")), 403);
}

/// A DNS server on loopback whose answer for every A query changes: the
/// first answer is an address the policy accepts, every later one is
/// loopback, which it does not.
fn rebinding_dns(first: [u8; 4], later: [u8; 4]) -> SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut count = 0;
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = sock.recv_from(&mut buf) {
            if n < 12 {
                continue;
            }
            // Find the end of the question (QNAME, QTYPE, QCLASS).
            let mut i = 12;
            while i < n && buf[i] != 0 {
                i += buf[i] as usize + 1;
            }
            let qend = i + 5;
            if qend > n {
                continue;
            }
            let qtype = u16::from_be_bytes([buf[i + 1], buf[i + 2]]);
            let mut resp = buf[..qend].to_vec();
            resp[2] = 0x81; // response, recursion desired
            resp[3] = 0x80; // recursion available, no error
            resp[6] = 0;
            resp[7] = 0;
            resp[8..12].fill(0);
            if qtype == 1 {
                let ip = if count == 0 { first } else { later };
                count += 1;
                resp[7] = 1; // one answer
                resp.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                resp.extend_from_slice(&ip);
            }
            let _ = sock.send_to(&resp, peer);
        }
    });
    addr
}

#[test]
fn dns_rebinding_never_reaches_the_private_address() {
    let home = Home::new();
    // 127.0.0.2 stands in for a public address (allowed by allow_private);
    // 127.0.0.1 is the "internal" service the attacker rebinds to.
    let public = Origin::start_on("127.0.0.2:0", "public");
    let p = public.port();
    let internal = Origin::start_on(&format!("127.0.0.1:{p}"), "internal");
    let dns = rebinding_dns([127, 0, 0, 2], [127, 0, 0, 1]);
    let allow = format!("rebind.test:{p}");
    let dns_arg = dns.to_string();
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--allow-private",
            "127.0.0.2/32",
            "--dns-server",
            &dns_arg,
        ],
    );
    let url = format!("http://rebind.test:{p}/");
    let first = curl(&["-x", &proxy.url(), &url]);
    assert_eq!(
        status_of(&first),
        200,
        "{}{}\n{}",
        first.stdout,
        first.stderr,
        proxy.log()
    );
    assert!(first.stdout.contains("public GET /"));
    for _ in 0..3 {
        for args in [
            vec!["-x", &proxy.url(), &url],
            vec!["-p", "-x", &proxy.url(), &url],
        ] {
            let again = curl(&args);
            refused(&again, 403, "private-address");
        }
    }
    assert_eq!(internal.hits(), 0, "the rebound address was reached");
}

#[test]
fn sni_must_name_the_connect_host() {
    let home = Home::new();
    let raw = RawOrigin::start();
    let p = raw.addr.port();
    let allow = format!("good.test:{p}");
    let audit = home.path().join("audit.jsonl");
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--resolve",
            "good.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--audit-log",
            audit.to_str().unwrap(),
        ],
    );
    // curl asks the proxy for good.test but its ClientHello names evil.test.
    let fronted = curl(&[
        "-x",
        &proxy.url(),
        "-k",
        &format!("https://evil.test:{p}/"),
        "--connect-to",
        &format!("evil.test:{p}:good.test:{p}"),
    ]);
    assert_ne!(fronted.code, 0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        raw.received().iter().all(|b| b.is_empty()),
        "fronted bytes reached the origin"
    );
    let events = audit_events(&audit);
    assert!(
        events.iter().any(|e| e["event"] == "decision"
            && e["reason"] == "sni-mismatch"
            && e["host"] == "good.test"),
        "{events:?}"
    );
    // The honest ClientHello goes through to the origin.
    let honest = curl(&["-x", &proxy.url(), "-k", &format!("https://good.test:{p}/")]);
    let _ = honest;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !raw.received().iter().any(|b| b.first() == Some(&0x16)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        raw.received().iter().any(|b| b.first() == Some(&0x16)),
        "ClientHello not forwarded"
    );
}

#[test]
fn socks5_replies() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let proxy = proxy_for(&home, &origin, &[]);
    // Refused by policy: reply code 2.
    let refused = curl(&[
        "-x",
        &format!("socks5h://{}", proxy.addr),
        &format!("http://other.test:{}/", origin.port()),
    ]);
    assert_ne!(refused.code, 0);
    let socks = |request: &[u8]| -> Vec<u8> {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&[5, 1, 0]).unwrap();
        let mut greet = [0u8; 2];
        s.read_exact(&mut greet).unwrap();
        assert_eq!(greet, [5, 0]);
        s.write_all(request).unwrap();
        let mut rep = vec![0u8; 10];
        let _ = s.read_exact(&mut rep);
        rep
    };
    let mut by_name = vec![5, 1, 0, 3, 11];
    by_name.extend_from_slice(b"other.test");
    by_name.push(b'x');
    by_name.extend_from_slice(&80u16.to_be_bytes());
    assert_eq!(socks(&by_name)[1], 0x02, "not allowed by ruleset");
    let mut allowed = vec![5, 1, 0, 3, 11];
    allowed.extend_from_slice(b"origin.test");
    allowed.extend_from_slice(&origin.port().to_be_bytes());
    assert_eq!(socks(&allowed)[1], 0x00);
    // BIND is not supported: 7. Unknown address type: 8.
    assert_eq!(socks(&[5, 2, 0, 1, 127, 0, 0, 1, 0, 80])[1], 0x07);
    assert_eq!(socks(&[5, 1, 0, 9, 0, 0])[1], 0x08);
    // A greeting without no-auth gets 0xff.
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&[5, 1, 2]).unwrap();
    let mut greet = [0u8; 2];
    s.read_exact(&mut greet).unwrap();
    assert_eq!(greet, [5, 0xff]);
}

#[test]
fn malformed_input_is_refused_and_the_proxy_keeps_serving() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let proxy = proxy_for(&home, &origin, &[]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\x01\x02garbage\r\n\r\n".to_vec()),
        ("no host", b"CONNECT HTTP/1.1\r\n\r\n".to_vec()),
        (
            "port 0",
            b"CONNECT origin.test:0 HTTP/1.1\r\nHost: origin.test:0\r\n\r\n".to_vec(),
        ),
        (
            "port 99999",
            b"CONNECT origin.test:99999 HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(),
        ),
        (
            "no port",
            b"CONNECT origin.test HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(),
        ),
        (
            "origin-form",
            b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(),
        ),
        (
            "https absolute-form",
            b"GET https://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(),
        ),
    ];
    for (name, bytes) in cases {
        let resp = raw_exchange(proxy.addr, &bytes);
        let status = raw_status(&resp);
        assert!(
            (400..500).contains(&status),
            "{name}: {}",
            String::from_utf8_lossy(&resp)
        );
    }
    // A 1 MiB header.
    let mut big = b"GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 1 << 20));
    big.extend_from_slice(b"\r\n\r\n");
    let resp = raw_exchange(proxy.addr, &big);
    assert_eq!(
        raw_status(&resp),
        431,
        "{}",
        String::from_utf8_lossy(&resp[..resp.len().min(200)])
    );
    // A truncated ClientHello inside an allowed tunnel, then close.
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let p = origin.port();
    s.write_all(
        format!("CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(raw_status(read_head(&mut s).unwrap().as_bytes()), 200);
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .unwrap();
    drop(s);
    // A malformed ClientHello: a handshake record with nonsense inside.
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(
        format!("CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(raw_status(read_head(&mut s).unwrap().as_bytes()), 200);
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // Half-closed client: the answer still arrives.
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET http://origin.test:{p}/half HTTP/1.1\r\nHost: origin.test:{p}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    assert!(
        String::from_utf8_lossy(&answer).contains("origin GET /half"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Still serving.
    let ok = curl(&["-x", &proxy.url(), &format!("http://origin.test:{p}/after")]);
    assert_eq!(status_of(&ok), 200, "{}{}", ok.stdout, proxy.log());
    assert!(!proxy.log().contains("panicked"), "{}", proxy.log());
}

#[test]
fn five_hundred_concurrent_tunnels_leak_no_fds() {
    raise_fd_limit();
    let home = Home::new();
    let raw = RawOrigin::start();
    let p = raw.addr.port();
    let allow = format!("origin.test:{p}");
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
    // Warm up, then measure.
    assert_eq!(connect_status(proxy.addr, &format!("origin.test:{p}")), 200);
    std::thread::sleep(Duration::from_millis(300));
    let before = open_fds(proxy.pid());
    let mut clients = Vec::new();
    for _ in 0..500 {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            format!("CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n").as_bytes(),
        )
        .unwrap();
        clients.push(s);
    }
    for s in &mut clients {
        assert_eq!(raw_status(read_head(s).unwrap_or_default().as_bytes()), 200);
        s.write_all(b"ping").unwrap();
    }
    let during = open_fds(proxy.pid());
    assert!(
        during >= before + 1000,
        "expected 1000 more fds during, {before} -> {during}"
    );
    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = open_fds(proxy.pid());
    while after > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = open_fds(proxy.pid());
    }
    assert!(after <= before, "fd leak: {before} before, {after} after");
    let ok = connect_status(proxy.addr, &format!("origin.test:{p}"));
    assert_eq!(ok, 200);
}

#[test]
fn audit_log_has_every_field() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let audit = home.path().join("audit.jsonl");
    let proxy = proxy_for(&home, &origin, &["--audit-log", audit.to_str().unwrap()]);
    let p = origin.port();
    assert_eq!(
        status_of(&curl(&[
            "-p",
            "-x",
            &proxy.url(),
            &format!("http://origin.test:{p}/a")
        ])),
        200
    );
    assert_eq!(
        status_of(&curl(&[
            "-x",
            &proxy.url(),
            &format!("http://blocked.test:{p}/")
        ])),
        403
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = audit_events(&audit);
    while !events.iter().any(|e| e["event"] == "close") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        events = audit_events(&audit);
    }
    let allow = events
        .iter()
        .find(|e| e["event"] == "decision" && e["decision"] == "allow")
        .expect("allow event");
    for field in [
        "ts", "event", "conn", "run", "host", "port", "ip", "decision", "reason", "rule", "source",
        "protocol", "command",
    ] {
        assert!(allow.get(field).is_some(), "{field} missing in {allow}");
    }
    assert_eq!(allow["protocol"], "connect");
    assert_eq!(allow["ip"], "127.0.0.1");
    assert_eq!(
        allow["source"],
        format!("command line --allow origin.test:{p}")
    );
    let close = events
        .iter()
        .find(|e| e["event"] == "close")
        .expect("close event");
    for field in ["bytes_up", "bytes_down", "duration_ms", "error"] {
        assert!(close.get(field).is_some(), "{field} missing in {close}");
    }
    assert!(close["bytes_down"].as_u64().unwrap_or(0) > 0);
    let deny = events
        .iter()
        .find(|e| e["event"] == "decision" && e["decision"] == "deny")
        .expect("deny event");
    // No approver: nobody was asked, so nothing was refused by a person.
    assert_eq!(deny["reason"], "not-allowlisted");
}

#[test]
fn non_loopback_listen_needs_a_flag() {
    let home = Home::new();
    let out = run(airlock(home.path()).args(["proxy", "--listen", "0.0.0.0:0"]));
    assert_eq!(out.code, 125);
    assert!(
        out.stderr.contains("--allow-remote-clients"),
        "{}",
        out.stderr
    );
}

#[test]
fn upgrade_requests_pass_through() {
    // An origin that answers an Upgrade with 101 and then echoes bytes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut s = s;
                let head = read_head(&mut s).unwrap_or_default().to_lowercase();
                if !head.contains("upgrade: websocket") || !head.contains("connection: upgrade") {
                    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                    return;
                }
                let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let home = Home::new();
    let allow = format!("ws.test:{port}");
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            &allow,
            "--resolve",
            "ws.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET http://ws.test:{port}/chat HTTP/1.1\r\nHost: ws.test:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s).unwrap();
    assert_eq!(raw_status(head.as_bytes()), 101, "{head}");
    s.write_all(b"ping-over-upgrade").unwrap();
    let mut buf = [0u8; 17];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping-over-upgrade");
}

#[test]
fn tunnel_limit_and_idle_timeout() {
    let home = Home::new();
    let raw = RawOrigin::start();
    let p = raw.addr.port();
    let policy = home.write(
        "p.toml",
        "[network]\nmax_tunnels = 2\nidle_timeout = \"1s\"\n",
    );
    let allow = format!("origin.test:{p}");
    let proxy = Proxy::start(
        &home,
        &[
            "-p",
            policy.to_str().unwrap(),
            "--allow",
            &allow,
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let open = || {
        let mut s = TcpStream::connect(proxy.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "CONNECT origin.test:{p} HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n"
        )
        .unwrap();
        let head = read_head(&mut s).unwrap_or_default();
        (s, raw_status(head.as_bytes()))
    };
    let (mut a, sa) = open();
    let (_b, sb) = open();
    let (_c, sc) = open();
    assert_eq!(
        (sa, sb, sc),
        (200, 200, 503),
        "the third tunnel is over max_tunnels"
    );
    // An idle tunnel is closed after idle_timeout.
    let t = Instant::now();
    let mut buf = [0u8; 1];
    let n = a.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the idle tunnel should be closed");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "closed after {:?}",
        t.elapsed()
    );
    // Slots free up again.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(open().1, 200);
}

#[test]
fn port_443_carries_tls_only() {
    // Needs 127.0.0.1:443 (root in CI); elsewhere there is nothing to test against.
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:443") else {
        eprintln!("skipped: cannot bind 127.0.0.1:443 here");
        return;
    };
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().map_while(Result::ok) {
            let mut s = s;
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            sink.lock().unwrap().push(buf[..n].to_vec());
        }
    });
    let home = Home::new();
    let proxy = Proxy::start(
        &home,
        &[
            "--allow",
            "tls.test",
            "--resolve",
            "tls.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
        ],
    );
    let mut s = TcpStream::connect(proxy.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"CONNECT tls.test:443 HTTP/1.1\r\nHost: tls.test:443\r\n\r\n")
        .unwrap();
    assert_eq!(raw_status(read_head(&mut s).unwrap().as_bytes()), 200);
    s.write_all(b"GET / HTTP/1.1\r\nHost: tls.test\r\n\r\n")
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        got.lock().unwrap().iter().all(|b| b.is_empty()),
        "plain HTTP went through a port-443 tunnel"
    );
}
