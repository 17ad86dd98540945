//! The degraded tier (SPEC §4.4) end to end, forced with
//! `AIRLOCK_FORCE_TIER=degraded --allow-degraded` on a machine that has
//! user namespaces, so CI exercises it: no namespaces, Landlock carries
//! the filesystem and TCP boundary, seccomp refuses UDP and unix sockets,
//! and a subreaper kills leftovers.

use std::net::{TcpListener, UdpSocket};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-degraded"))
}

fn probe() -> String {
    probe_in(&base())
}

const SECRET: &str = "DEGRADED-TIER-SECRET";

fn degraded(f: &Fixture, args: &[&str], script: &str) -> Out {
    let mut all = vec!["--allow-degraded"];
    all.extend_from_slice(args);
    let mut cmd = f.command(&all, script);
    cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    run(&mut cmd)
}

fn show(out: &Out) -> String {
    format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr)
}

#[test]
fn forcing_the_degraded_tier_needs_the_flag() {
    let f = Fixture::new_in(&base());
    let mut cmd = f.command(&["--network", "none"], "echo ran");
    cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    let out = run(&mut cmd);
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(!out.stdout.contains("ran"));
}

#[test]
fn files_secrets_and_writes() {
    let f = Fixture::new_in(&base());
    f.write("~/.ssh/id_ed25519", SECRET);
    f.write("~/notes.txt", "ordinary");
    let outside = tempfile::tempdir_in(base()).unwrap();
    let script = format!(
        "cat ~/.ssh/id_ed25519; cat ~/notes.txt; echo; ls ~ >/dev/null && echo listed-home; \
         echo x > {}/planted; echo y > ~/.bashrc-planted; echo ok > src/in-ws.txt && echo wrote-ws; \
         echo z >> .git/config 2>/dev/null; echo tmp > \"$TMPDIR/t\" && echo wrote-tmp; \
         echo tmp > /tmp/airlock-degraded-planted 2>/dev/null || echo no-host-tmp",
        outside.path().display()
    );
    std::fs::create_dir_all(f.ws.join(".git")).unwrap();
    // Landlock grants by hierarchy: with a protected path that exists in
    // the workspace, only its siblings' trees are writable, not new names
    // at the root (see degraded.rs); a workspace without one is writable
    // from its root (crossing.rs, npm).
    std::fs::create_dir_all(f.ws.join("src")).unwrap();
    std::fs::write(f.ws.join(".git/config"), "[core]\n").unwrap();
    let out = degraded(&f, &["--network", "none"], &script);
    assert!(!out.stdout.contains(SECRET), "{}", show(&out));
    for want in [
        "ordinary",
        "listed-home",
        "wrote-ws",
        "wrote-tmp",
        "no-host-tmp",
    ] {
        assert!(out.stdout.contains(want), "{want}\n{}", show(&out));
    }
    assert!(!outside.path().join("planted").exists());
    assert!(!std::path::Path::new("/tmp/airlock-degraded-planted").exists());
    assert!(!f.home.join(".bashrc-planted").exists());
    assert_eq!(
        std::fs::read_to_string(f.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
}

#[test]
fn network_only_through_the_proxy() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start("origin");
    let p = origin.port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let report = f.home.join("report.json");
    let allow = format!("origin.test:{p}");
    let script = format!(
        "{pr} http http://origin.test:{p}/ok; {pr} http http://blocked.test:{p}/; {pr} connect-tcp 127.0.0.1:{p}; \
         {pr} connect-tcp {other}; {pr} send-udp {udp}; {pr} connect-unix /run/does-not-matter.sock; \
         python3 -c 'import socket; socket.socketpair(); print(\"socketpair: ok\")'",
        pr = probe(),
        other = other.local_addr().unwrap(),
        udp = udp.local_addr().unwrap(),
    );
    let out = degraded(
        &f,
        &[
            "--allow",
            &allow,
            "--resolve",
            "origin.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
            "--report",
            report.to_str().unwrap(),
        ],
        &script,
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines.contains(&"http: HTTP/1.1 200 OK"), "{}", show(&out));
    assert!(
        lines.contains(&"http: HTTP/1.1 403 Forbidden"),
        "{}",
        show(&out)
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| **l == "connect_tcp: EACCES")
            .count(),
        2,
        "direct TCP must be refused\n{}",
        show(&out)
    );
    assert!(
        lines.contains(&"send_udp: EPERM") && lines.contains(&"connect_unix: EPERM"),
        "{}",
        show(&out)
    );
    assert!(lines.contains(&"socketpair: ok"), "{}", show(&out));
    assert_eq!(
        origin.hits(),
        1,
        "only the proxied request may reach the origin"
    );
    let mut buf = [0u8; 8];
    assert!(udp.recv_from(&mut buf).is_err());
    other.set_nonblocking(true).unwrap();
    assert!(other.accept().is_err());
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(rep["tier"], "linux-degraded");
}

#[test]
fn leftovers_die_and_timeouts_hold() {
    let f = Fixture::new_in(&base());
    let tag = format!("{}", 4000 + std::process::id() % 1000);
    let out = degraded(
        &f,
        &["--network", "none"],
        &format!("sleep {tag}1 & nohup sleep {tag}2 >/dev/null 2>&1 & setsid sleep {tag}3 & echo started"),
    );
    assert!(out.stdout.contains("started"), "{}", show(&out));
    std::thread::sleep(Duration::from_millis(200));
    for i in 1..=3 {
        assert!(
            !process_running(&format!("sleep {tag}{i}")),
            "sleep {tag}{i} survived the degraded run"
        );
    }
    let t = Instant::now();
    let out = degraded(
        &f,
        &["--network", "none", "--timeout", "1s"],
        &format!("sleep {tag}9 & sleep 30"),
    );
    assert_eq!(out.code, 124, "{}", show(&out));
    assert!(t.elapsed() < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !process_running(&format!("sleep {tag}9")),
        "a background child survived the timeout"
    );
    assert_eq!(degraded(&f, &["--network", "none"], "exit 9").code, 9);
}

#[test]
fn killing_the_supervisor_tears_the_degraded_sandbox_down() {
    let f = Fixture::new_in(&base());
    let tag = format!("{}", 6000 + std::process::id() % 1000);
    let mut cmd = f.command(
        &["--allow-degraded", "--network", "none"],
        &format!("sleep {tag}7 & sleep {tag}8"),
    );
    cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        process_running(&format!("sleep {tag}8")),
        "the sandbox did not start"
    );
    child.kill().unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while (process_running(&format!("sleep {tag}7")) || process_running(&format!("sleep {tag}8")))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !process_running(&format!("sleep {tag}7")) && !process_running(&format!("sleep {tag}8")),
        "leftovers outlived the supervisor"
    );
}
