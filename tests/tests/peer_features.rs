//! What users of bubblewrap, Docker and corporate proxies expect (issue
//! 30): `--read PATH` (a read-only bind, as `--ro-bind`), `--publish PORT`
//! (a server in the sandbox reachable from the host, as `-p`) and
//! `--upstream-proxy URL` (a parent proxy, as squid's `cache_peer`). Each
//! is shown end to end with real commands under `airlock run`, as root and
//! as an ordinary user, and each shows the boundary still holds.

use std::path::PathBuf;

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-peer"))
}

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// A directory of the host's /tmp holding a script, readable by `who`.
fn host_tmp_dir(who: Who) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("airlock-read-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(
        d.path().join("job.sh"),
        "echo job-ran; cat \"$(dirname \"$0\")/data.txt\"\n",
    )
    .unwrap();
    std::fs::write(d.path().join("data.txt"), "host-data\n").unwrap();
    if who == Who::Nobody {
        airlock_tests::who::chown(d.path());
    }
    d
}

#[test]
fn a_path_under_the_host_tmp_is_named_and_read_brings_it_in_read_only() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let d = host_tmp_dir(who);
        let dir = d.path().to_str().unwrap().to_string();
        let script = format!("{dir}/job.sh");

        // Without --read: not found, and airlock says why and what to add.
        let out = run(&mut who.wrap(f.command_argv(&["--network", "none"], &["sh", &script])));
        assert_ne!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("job-ran"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("lies under the host's /tmp")
                && out.stderr.contains(&format!("--read {dir}")),
            "{who:?}: {}",
            show(&out)
        );

        // With it: read, run, but never written.
        let cmd = f.command_argv(
            &["--network", "none", "--read", &dir],
            &[
                "sh",
                "-c",
                &format!(
                    "sh {script}; echo x > {dir}/data.txt && echo wrote; touch {dir}/new && echo created; rm -f {dir}/job.sh && echo removed; true"
                ),
            ],
        );
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stdout.contains("job-ran") && out.stdout.contains("host-data"),
            "{who:?}: {}",
            show(&out)
        );
        for verb in ["wrote", "created", "removed"] {
            assert!(!out.stdout.contains(verb), "{who:?} {verb}: {}", show(&out));
        }
        assert_eq!(
            std::fs::read_to_string(d.path().join("data.txt")).unwrap(),
            "host-data\n"
        );
        assert!(d.path().join("job.sh").exists() && !d.path().join("new").exists());
        // The rest of the host's /tmp stays out of sight.
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--read", &format!("{dir}/data.txt")],
            &format!("cat {dir}/data.txt; ls {dir}/job.sh 2>/dev/null && echo saw-sibling; true"),
        )));
        assert!(out.stdout.contains("host-data"), "{who:?}: {}", show(&out));
        assert!(
            !out.stdout.contains("saw-sibling"),
            "{who:?}: {}",
            show(&out)
        );
        // A writable root below a read-only one stays writable.
        std::fs::create_dir(d.path().join("out")).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(d.path());
        }
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--read", &dir, "--write", &format!("{dir}/out")],
            &format!("echo r > {dir}/out/result && echo wrote-out; echo x > {dir}/data.txt && echo wrote-data; true"),
        )));
        assert!(out.stdout.contains("wrote-out"), "{who:?}: {}", show(&out));
        assert!(
            !out.stdout.contains("wrote-data"),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("out/result")).unwrap_or_default(),
            "r\n"
        );
    }
}

#[test]
fn read_refuses_what_it_must_not_uncover() {
    let f = Fixture::new_in(&base());
    f.write("~/.ssh/id_ed25519", "PRIVATE KEY\n");
    let key = f.home.join(".ssh");
    for (path, why) in [
        (key.to_str().unwrap(), "deny_read"),
        ("/run", "the sandbox's own"),
        ("/tmp", "name the directory"),
        ("relative/path", "absolute"),
        ("/nonexistent-airlock-read", "No such file"),
    ] {
        let out = f.run(
            &["--network", "none", "--read", path],
            "cat ~/.ssh/id_ed25519; echo ran",
        );
        assert_eq!(out.code, 125, "{path}: {}", show(&out));
        assert!(!out.stdout.contains("ran"), "{path}: {}", show(&out));
        assert!(out.stderr.contains(why), "{path}: {}", show(&out));
    }
}

/// A minimal parent proxy on 127.0.0.1: answers CONNECT (recording the
/// request line and whether the expected Proxy-Authorization came), then
/// relays both ways. Anything else gets a 405.
struct Parent {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, bool)>>>,
}

impl Parent {
    fn start(auth: Option<&'static str>) -> Parent {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let log = seen.clone();
        std::thread::spawn(move || {
            for s in l.incoming().map_while(Result::ok) {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut s = s;
                    let Some(head) = read_head(&mut s) else {
                        return;
                    };
                    let line = head.lines().next().unwrap_or("").to_string();
                    let authed = auth.is_none_or(|a| {
                        head.lines()
                            .any(|h| h.eq_ignore_ascii_case(&format!("proxy-authorization: {a}")))
                    });
                    log.lock().unwrap().push((line.clone(), authed));
                    let mut parts = line.split_whitespace();
                    let (Some("CONNECT"), Some(to)) = (parts.next(), parts.next()) else {
                        let _ = s.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n");
                        return;
                    };
                    if !authed {
                        let _ = s.write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n");
                        return;
                    }
                    let Ok(up) = std::net::TcpStream::connect(to) else {
                        let _ = s.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                        return;
                    };
                    let _ = s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                    let (mut a, mut b) = (s.try_clone().unwrap(), up.try_clone().unwrap());
                    let (mut c, mut d) = (up, s);
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 8192];
                        while let Ok(n) = a.read(&mut buf) {
                            if n == 0 || b.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = b.shutdown(std::net::Shutdown::Write);
                    });
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 || d.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = d.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Parent { addr, seen }
    }

    fn seen(&self) -> Vec<(String, bool)> {
        self.seen.lock().unwrap().clone()
    }
}

#[test]
fn run_dials_through_the_upstream_proxy_and_keeps_its_own_decisions() {
    // "Basic " + base64("me:p@ss")
    let parent = Parent::start(Some("Basic bWU6cEBzcw=="));
    let origin = Origin::start("behind-parent");
    let port = origin.port().to_string();
    let upstream = format!("http://me:p%40ss@{}", parent.addr);
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let args = [
            "--upstream-proxy",
            &upstream,
            "--resolve",
            "api.test=127.0.0.1",
            "--resolve",
            "other.test=127.0.0.1",
            "--allow",
            &format!("api.test:{port}"),
            "--allow-private",
            "127.0.0.1/32",
            "--ask",
            "deny",
        ];
        let before = parent.seen().len();
        let out = run(&mut who.wrap(f.command(
            &args,
            &format!(
                "curl -s -m 10 http://api.test:{port}/via-parent; echo; \
                 curl -s -m 10 -o /dev/null -w 'other=%{{http_code}}\\n' http://other.test:{port}/nope"
            ),
        )));
        assert!(
            out.stdout.contains("behind-parent GET /via-parent"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(out.stdout.contains("other=403"), "{who:?}: {}", show(&out));
        let seen: Vec<_> = parent.seen()[before..].to_vec();
        // The parent was asked for the address airlock checked, with the
        // credentials of the URL, and never for the refused host.
        assert_eq!(
            seen,
            vec![(format!("CONNECT 127.0.0.1:{port} HTTP/1.1"), true)],
            "{who:?}: {}",
            show(&out)
        );
    }
    // The sandbox cannot reach the parent around airlock.
    let f = Fixture::new_in(&base());
    let out = f.run(
        &["--upstream-proxy", &upstream],
        &format!(
            "curl -s -m 5 -p -x http://{} http://api.test:{port}/ || echo no-direct",
            parent.addr
        ),
    );
    assert!(out.stdout.contains("no-direct"), "{}", show(&out));
    assert!(!out.stdout.contains("behind-parent"), "{}", show(&out));
}

#[test]
fn the_standalone_proxy_chains_to_a_parent_and_says_what_it_refuses() {
    let parent = Parent::start(Some("Basic bWU6cEBzcw=="));
    let origin = Origin::start("chained");
    let port = origin.port().to_string();
    let home = Home::new();
    let upstream = format!("http://me:p%40ss@{}", parent.addr);
    let proxy = Proxy::start(
        &home,
        &[
            "--upstream-proxy",
            &upstream,
            "--resolve",
            "api.test=127.0.0.1",
            "--allow",
            &format!("api.test:{port}"),
            "--allow-private",
            "127.0.0.1/32",
            "--ask",
            "deny",
        ],
    );
    let out = curl(&[
        "-s",
        "-m",
        "10",
        "-x",
        &proxy.url(),
        &format!("http://api.test:{port}/x"),
    ]);
    assert!(
        out.stdout.contains("chained GET /x"),
        "{}\n{}",
        out.stdout,
        proxy.log()
    );
    assert_eq!(
        parent.seen(),
        vec![(format!("CONNECT 127.0.0.1:{port} HTTP/1.1"), true)]
    );
    assert!(proxy.log().contains("parent proxy"), "{}", proxy.log());
    // Wrong credentials: a refusal that says what to give.
    let proxy = Proxy::start(
        &home,
        &[
            "--upstream-proxy",
            &format!("http://me:wrong@{}", parent.addr),
            "--resolve",
            "api.test=127.0.0.1",
            "--allow",
            &format!("api.test:{port}"),
            "--allow-private",
            "127.0.0.1/32",
        ],
    );
    let out = curl(&[
        "-s",
        "-m",
        "10",
        "-x",
        &proxy.url(),
        &format!("http://api.test:{port}/x"),
    ]);
    assert!(!out.stdout.contains("chained"), "{}", out.stdout);
    assert!(
        out.stdout.contains("wants credentials"),
        "{}\n{}",
        out.stdout,
        proxy.log()
    );
    // A URL airlock cannot use stops it at once.
    let bad = run(airlock(home.path()).args([
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream-proxy",
        "https://p.test:3128",
    ]));
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("not supported"), "{}", bad.stderr);
}

fn have_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Ask the published port until the sandbox's server answers.
fn ask(port: u16, what: &str) -> Option<String> {
    use std::io::{Read, Write};
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(15) {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = s.write_all(what.as_bytes());
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            if !got.is_empty() {
                return Some(got);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

#[test]
fn a_published_port_reaches_the_sandboxs_server_and_opens_no_way_out() {
    if !have_python() {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let origin = Origin::start("host-only");
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let port = free_port();
        let server = format!(
            "import socket,sys\n\
             s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('127.0.0.1',{port})); s.listen(4)\n\
             try:\n    socket.create_connection(('127.0.0.1',{o}),timeout=2); print('reached-host-origin')\n\
             except Exception: print('no-way-out')\n\
             sys.stdout.flush()\n\
             c,_=s.accept(); d=c.recv(100); c.sendall(b'pong from sandbox: '+d); c.close()\n",
            o = origin.port()
        );
        let cmd = f.command_argv(
            &["--publish", &port.to_string(), "--timeout", "30s"],
            &["python3", "-c", &server],
        );
        let child = spawn_piped(&mut who.wrap(cmd));
        let answer = ask(port, "ping");
        let out = output_of(child);
        assert_eq!(
            answer.as_deref(),
            Some("pong from sandbox: ping"),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("no-way-out"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr
                .contains(&format!("publishing the sandbox's 127.0.0.1:{port}")),
            "{who:?}: {}",
            show(&out)
        );
        // The host's port is free again once the run is over.
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "{who:?}"
        );
    }
    assert_eq!(origin.hits(), 0, "the sandbox reached the host's loopback");
}

#[test]
fn publish_refuses_airlocks_own_ports_and_a_taken_host_port() {
    let f = Fixture::new_in(&base());
    let out = f.run(&["--publish", "3128"], "echo ran");
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(!out.stdout.contains("ran"));
    assert!(out.stderr.contains("airlock's own"), "{}", show(&out));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = f.run(&["--publish", &port], "echo ran");
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(!out.stdout.contains("ran"));
    assert!(
        out.stderr.contains("cannot listen on the host's 127.0.0.1"),
        "{}",
        show(&out)
    );
    let out = f.run(&["--network", "host", "--publish", "4000"], "echo ran");
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(
        out.stderr.contains("own network namespace"),
        "{}",
        show(&out)
    );
}
