//! Fleet telemetry end to end (issue 15): audit events received as OTLP
//! logs by a local OTLP/HTTP receiver, an unreachable collector that never
//! slows the proxy, Prometheus metrics scraped with curl, and SIGHUP
//! reloading the policy of `airlock proxy` with a tunnel open.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_tests::who::Who;
use airlock_tests::*;
use serde_json::Value;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-telemetry"))
}

fn show(out: &Out) -> String {
    format!(
        "code {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// A minimal OTLP/HTTP receiver: takes `POST /v1/logs` JSON bodies and
/// answers 200 with an empty export response.
struct Receiver {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let bodies = Arc::new(Mutex::new(vec![]));
        let sink = bodies.clone();
        std::thread::spawn(move || {
            for s in l.incoming().map_while(Result::ok) {
                let sink = sink.clone();
                std::thread::spawn(move || serve_otlp(s, &sink));
            }
        });
        Receiver { addr, bodies }
    }

    fn records(&self) -> Vec<Value> {
        let mut out = vec![];
        for b in self.bodies.lock().unwrap().iter() {
            for rl in b["resourceLogs"].as_array().into_iter().flatten() {
                let service = rl["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["key"] == "service.name")
                    .map(|a| a["value"]["stringValue"].clone());
                for sl in rl["scopeLogs"].as_array().into_iter().flatten() {
                    for r in sl["logRecords"].as_array().into_iter().flatten() {
                        let mut r = r.clone();
                        r["_service"] = service.clone().unwrap_or(Value::Null);
                        r["_scope"] = sl["scope"]["name"].clone();
                        out.push(r);
                    }
                }
            }
        }
        out
    }
}

fn serve_otlp(s: TcpStream, sink: &Mutex<Vec<Value>>) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut len = 0usize;
        let mut first = String::new();
        if r.read_line(&mut first).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        if first.starts_with("POST /v1/logs ") {
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                sink.lock().unwrap().push(v);
            }
        }
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        );
    }
}

fn attr<'a>(r: &'a Value, key: &str) -> Option<&'a Value> {
    r["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn attr_str<'a>(r: &'a Value, key: &str) -> Option<&'a str> {
    attr(r, key)?["stringValue"].as_str()
}

#[test]
fn audit_events_arrive_as_otlp_logs() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let rx = Receiver::start();
        let origin = Origin::start("origin");
        let p = origin.port();
        let endpoint = format!("http://{}", rx.addr);
        let allow = format!("origin.test:{p}");
        let out = run(&mut who.wrap(f.command(
            &[
                "--otlp",
                &endpoint,
                "--allow",
                &allow,
                "--resolve",
                "origin.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
            ],
            &format!("curl -sf http://origin.test:{p}/ >/dev/null; curl -s http://blocked.test:{p}/ >/dev/null; exit 4"),
        )));
        assert_eq!(out.code, 4, "{who:?} {}", show(&out));
        // The run waits (briefly) for the collector before it exits.
        let recs = rx.records();
        let names: Vec<_> = recs
            .iter()
            .filter_map(|r| r["eventName"].as_str())
            .collect();
        for want in [
            "airlock.run",
            "airlock.decision",
            "airlock.close",
            "airlock.end",
        ] {
            assert!(names.contains(&want), "{who:?} {want} missing: {names:?}");
        }
        let run = attr_str(&recs[0], "airlock.run").unwrap().to_string();
        for r in &recs {
            assert_eq!(r["_service"], "airlock");
            assert_eq!(r["_scope"], "airlock");
            assert_eq!(attr_str(r, "airlock.run"), Some(run.as_str()));
            // The body is the audit line itself.
            let body: Value =
                serde_json::from_str(r["body"]["stringValue"].as_str().unwrap()).unwrap();
            assert_eq!(body["run"], run.as_str());
            assert_eq!(
                Some(format!("airlock.{}", body["event"].as_str().unwrap()).as_str()),
                r["eventName"].as_str()
            );
            assert!(
                r["timeUnixNano"].as_str().is_some_and(|t| t.len() > 15),
                "{r}"
            );
        }
        let deny = recs
            .iter()
            .find(|r| attr_str(r, "airlock.decision") == Some("deny"))
            .expect("a deny decision");
        assert_eq!(attr_str(deny, "airlock.host"), Some("blocked.test"));
        assert_eq!(attr_str(deny, "airlock.reason"), Some("not-allowlisted"));
        assert_eq!(deny["severityText"], "WARN");
        let allow = recs
            .iter()
            .find(|r| attr_str(r, "airlock.decision") == Some("allow"))
            .expect("an allow decision");
        assert_eq!(attr_str(allow, "airlock.host"), Some("origin.test"));
        let port = attr(allow, "airlock.port").unwrap();
        assert_eq!(
            port["intValue"].as_str().map(str::to_string),
            Some(p.to_string())
        );
        assert_eq!(allow["severityText"], "INFO");
        let end = recs
            .iter()
            .find(|r| r["eventName"] == "airlock.end")
            .unwrap();
        assert_eq!(attr(end, "airlock.exit_code").unwrap()["intValue"], "4");
    }
}

fn scrape(addr: &str) -> String {
    let out = run(Command::new("curl").args(["-sf", &format!("http://{addr}/metrics")]));
    assert_eq!(out.code, 0, "{}", show(&out));
    out.stdout
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn metrics_addr(proxy: &Proxy) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(l) = proxy
            .log()
            .lines()
            .find_map(|l| l.strip_prefix("airlock proxy metrics on http://"))
        {
            return l.trim_end_matches("/metrics").to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics line: {}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn get(proxy: SocketAddr, url: &str) -> u16 {
    let host = url.split('/').nth(2).unwrap();
    raw_status(&raw_exchange(
        proxy,
        format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    ))
}

/// A CONNECT tunnel to `authority` that stays open.
fn tunnel(proxy: SocketAddr, authority: &str) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.contains(" 200"), "{status}");
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
    }
    r
}

/// One HTTP exchange inside an open tunnel; returns the body's first line.
fn through(t: &mut BufReader<TcpStream>, path: &str) -> String {
    write!(t.get_mut(), "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut len = 0;
    let mut status = String::new();
    t.read_line(&mut status).unwrap();
    loop {
        let mut h = String::new();
        t.read_line(&mut h).unwrap();
        let h = h.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    t.read_exact(&mut body).unwrap();
    format!("{} {}", status.trim(), String::from_utf8_lossy(&body))
}

fn answer_all(sock: PathBuf, verdict: &'static str) {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => return,
            }
        };
        let mut w = stream.try_clone().unwrap();
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let msg: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if msg["type"] == "ask" {
                std::thread::sleep(Duration::from_millis(300));
                let _ = writeln!(
                    w,
                    "{}",
                    serde_json::json!({"type": "answer", "id": msg["id"], "verdict": verdict})
                );
            }
        }
    });
}

#[test]
fn metrics_scraped_with_curl_show_the_counters() {
    let home = Home::new();
    let origin = Origin::start("origin");
    let p = origin.port();
    let sock = home.path().join("approve.sock");
    let ask = format!("socket:{}", sock.display());
    let allow = format!("origin.test:{p}");
    let proxy = Proxy::start(
        &home,
        &[
            "--metrics",
            "127.0.0.1:0",
            "--allow",
            &allow,
            "--resolve",
            "origin.test=127.0.0.1",
            "--resolve",
            "asked.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            &ask,
        ],
    );
    answer_all(sock, "allow-once");
    let m = metrics_addr(&proxy);
    let before = scrape(&m);
    assert_eq!(
        metric(&before, "airlock_open_tunnels"),
        Some(0.0),
        "{before}"
    );
    let url = |h: &str| format!("http://{h}:{p}/");
    assert_eq!(get(proxy.addr, &url("origin.test")), 200);
    assert_eq!(get(proxy.addr, &url("origin.test")), 200);
    // The host is allowed, not this port: refused without a question.
    assert_eq!(get(proxy.addr, "http://origin.test:1/"), 403);
    // A question answered after 300 ms.
    assert_eq!(get(proxy.addr, &url("asked.test")), 200);
    let mut t = tunnel(proxy.addr, &allow);
    assert!(through(&mut t, "/in").starts_with("HTTP/1.1 200"));
    let text = scrape(&m);
    let allowed = metric(
        &text,
        "airlock_decisions_total{decision=\"allow\",reason=\"allowlisted\"}",
    );
    assert_eq!(allowed, Some(3.0), "{text}");
    assert_eq!(
        metric(
            &text,
            "airlock_decisions_total{decision=\"deny\",reason=\"port-not-allowed\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "airlock_decisions_total{decision=\"allow\",reason=\"approved\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "airlock_open_tunnels"), Some(1.0), "{text}");
    assert!(
        metric(&text, "airlock_bytes_total{direction=\"down\"}").unwrap_or(0.0) > 0.0,
        "{text}"
    );
    assert!(
        metric(&text, "airlock_bytes_total{direction=\"up\"}").unwrap_or(0.0) > 0.0,
        "{text}"
    );
    // One question, answered after 300 ms.
    assert_eq!(
        metric(&text, "airlock_approval_wait_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert!(
        metric(&text, "airlock_approval_wait_seconds_sum").unwrap() >= 0.3,
        "{text}"
    );
    drop(t);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(&m);
        if metric(&text, "airlock_open_tunnels") == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "the tunnel never closed: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Only /metrics is served.
    let out = run(Command::new("curl").args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{m}/other"),
    ]));
    assert_eq!(out.stdout, "404");
}

#[test]
fn an_unreachable_collector_never_slows_the_proxy() {
    let home = Home::new();
    // Accepts connections (the kernel's backlog) and never answers.
    let hang = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hang.local_addr().unwrap());
    let mut cmd = airlock(home.path());
    cmd.env("AIRLOCK_OTLP_QUEUE", "16");
    let proxy = Proxy::start_with(
        cmd,
        &[
            "--otlp",
            &endpoint,
            "--metrics",
            "127.0.0.1:0",
            "--ask",
            "deny",
        ],
    );
    let m = metrics_addr(&proxy);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    // More records than one batch (512) and the queue (16) can take while
    // the exporter waits on the first batch (5 s), whatever the machine's
    // speed: some must be dropped.
    for i in 0..1200 {
        let t = Instant::now();
        assert_eq!(get(proxy.addr, &format!("http://h{i}.test/")), 403);
        slowest = slowest.max(t.elapsed());
    }
    let total = started.elapsed();
    // The exporter waits 5 s for an answer that never comes; the proxy
    // never waits for the exporter.
    assert!(
        slowest < Duration::from_secs(2),
        "slowest request {slowest:?}"
    );
    assert!(
        total < Duration::from_secs(60),
        "1200 requests took {total:?}"
    );
    let text = scrape(&m);
    let dropped = metric(&text, "airlock_audit_export_dropped_total").unwrap_or(0.0);
    assert!(dropped > 0.0, "{text}");
    assert_eq!(
        metric(&text, "airlock_audit_export_sent_total"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "airlock_decisions_total{decision=\"deny\",reason=\"not-allowlisted\"}"
        ),
        Some(1200.0),
        "{text}"
    );
    drop(hang);
}

#[test]
fn sighup_reloads_the_policy_and_open_tunnels_survive() {
    let home = Home::new();
    let (a, b) = (Origin::start("alpha"), Origin::start("beta"));
    let (pa, pb) = (a.port(), b.port());
    let policy = home.write(
        "policy.toml",
        &format!("[network]\nallow = [\"a.test:{pa}\"]\n"),
    );
    let proxy = Proxy::start(
        &home,
        &[
            "-p",
            policy.to_str().unwrap(),
            "--resolve",
            "a.test=127.0.0.1",
            "--resolve",
            "b.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ],
    );
    let (ua, ub) = (
        format!("http://a.test:{pa}/"),
        format!("http://b.test:{pb}/"),
    );
    assert_eq!(get(proxy.addr, &ua), 200);
    assert_eq!(get(proxy.addr, &ub), 403);
    let mut t = tunnel(proxy.addr, &format!("a.test:{pa}"));
    assert!(through(&mut t, "/before").contains("alpha GET /before"));

    let hup = |proxy: &Proxy, want: &str, count: usize| {
        let ok = Command::new("kill")
            .args(["-HUP", &proxy.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.log().matches(want).count() < count {
            assert!(Instant::now() < deadline, "no {want:?}: {}", proxy.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The new policy allows b.test instead of a.test.
    std::fs::write(&policy, format!("[network]\nallow = [\"b.test:{pb}\"]\n")).unwrap();
    hup(&proxy, "policy reloaded", 1);
    assert_eq!(get(proxy.addr, &ub), 200);
    assert_eq!(get(proxy.addr, &ua), 403);
    // The tunnel opened under the old policy is still up.
    assert!(through(&mut t, "/after").contains("alpha GET /after"));

    // A broken policy is reported and the running one kept.
    std::fs::write(&policy, "[network\nallow = [\n").unwrap();
    hup(&proxy, "keeping the old one", 1);
    assert_eq!(get(proxy.addr, &ub), 200);
    assert_eq!(get(proxy.addr, &ua), 403);
    assert!(through(&mut t, "/still").contains("alpha GET /still"));
    assert!(proxy.log().contains("policy.toml"), "{}", proxy.log());
}
