//! Requests that hide inside other requests or leave the proxy's sight
//! (SPEC §5.3), against origins that ignore request bodies (as many do for
//! GET), as root and as an ordinary user: a GET body carrying a second
//! request, a body on an allowed POST that the origin leaves unread, a
//! tunnel (CONNECT, SOCKS5) to a rule host carrying plain HTTP, and an
//! `h2c` upgrade. The origin must never see the smuggled request, and
//! never the credential on it; the allowed requests still work.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use airlock_tests::tls::TestPki;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-request-smuggling"))
}

const TOKEN: &str = "tok-smuggle-0b7e-never-for-admin";

/// An origin that reads request heads only, never bodies (an endpoint
/// that answers before reading, or a server that ignores GET bodies), and
/// records each complete head it parsed: `METHOD PATH auth=...`.
struct LaxOrigin {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl LaxOrigin {
    fn start(tls: Option<&TestPki>) -> LaxOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(vec![]));
        let (log, config) = (seen.clone(), tls.map(|p| p.server_config()));
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                let (log, config) = (log.clone(), config.clone());
                std::thread::spawn(move || {
                    let _ = tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                    match config {
                        Some(c) => {
                            let Ok(conn) = rustls::ServerConnection::new(c) else {
                                return;
                            };
                            lax(&mut rustls::StreamOwned::new(conn, tcp), &log)
                        }
                        None => lax(&mut { tcp }, &log),
                    }
                });
            }
        });
        LaxOrigin { addr, seen }
    }

    fn seen(&self) -> String {
        self.seen.lock().unwrap().join("\n")
    }
}

fn lax<S: Read + Write>(stream: &mut S, log: &Mutex<Vec<String>>) {
    while let Some(head) = read_head(stream) {
        let line = head.lines().next().unwrap_or("").to_string();
        let auth = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("authorization")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        let mut parts = line.split(' ');
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        log.lock()
            .unwrap()
            .push(format!("{method} {path} auth={auth}"));
        let body = format!("lax {method} {path}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

struct Setup {
    f: Fixture,
    who: Who,
    pki: TestPki,
    tls: LaxOrigin,
    plain: LaxOrigin,
    policy: PathBuf,
}

fn setup(who: Who) -> Setup {
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["api.test"]);
    let (tls, plain) = (LaxOrigin::start(Some(&pki)), LaxOrigin::start(None));
    let (p, q) = (tls.addr.port(), plain.addr.port());
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"api.test:{p}\", \"plain.test:{q}\"]\ninspect = [\"api.test\"]\n\n\
             [[network.request]]\nhost = \"api.test\"\nallow = [\"GET /repos/acme/**\", \"POST /repos/acme/**\"]\n\n\
             [[network.request]]\nhost = \"plain.test\"\nallow = [\"GET /repos/acme/**\", \"POST /repos/acme/**\"]\n\n\
             [[network.credential]]\nhost = \"api.test:{p}\"\nheader = \"Authorization\"\nvalue = \"Bearer ${{env:AIRLOCK_TEST_TOKEN}}\"\n\
             # Lent to POST too: a credential reads unless its entry says more.\n\
             methods = [\"POST\"]\n"
        ),
    );
    who.prepare(&f);
    Setup {
        f,
        who,
        pki,
        tls,
        plain,
        policy,
    }
}

impl Setup {
    fn run(&self, script: &str) -> Out {
        let args = [
            "-p",
            self.policy.to_str().unwrap(),
            "--upstream-ca",
            self.pki.ca_pem.to_str().unwrap(),
            "--resolve",
            "api.test=127.0.0.1",
            "--resolve",
            "plain.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ];
        let mut cmd = self.f.command(&args, script);
        cmd.env("AIRLOCK_TEST_TOKEN", TOKEN);
        run(&mut self.who.wrap(cmd))
    }

    fn api(&self) -> String {
        format!("https://api.test:{}", self.tls.addr.port())
    }

    fn plain_url(&self) -> String {
        format!("http://plain.test:{}", self.plain.addr.port())
    }
}

/// The smuggled request: it ends inside a header, so the next request's
/// head (and its credential) would complete it at the origin.
const SMUGGLE: &str = "printf 'GET /admin/steal HTTP/1.1\\r\\nX-Absorb: ' > smug.txt; ";

/// `NAME -> <status> <reason>` for a request with the smuggling body, then
/// `NAME next -> <status>` for an allowed request on the same connection.
fn pair(name: &str, opts: &str, first: &str, url: &str, method: &str) -> String {
    format!(
        "printf '%s -> ' {name}; curl -s {opts} {first} -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' -X {method} --data-binary @smug.txt '{url}/repos/acme/x' \
         --next -s {opts} -o /dev/null -w '{name} next -> %{{http_code}}\\n' '{url}/repos/acme/y'\n"
    )
}

fn line<'a>(out: &'a Out, prefix: &str) -> &'a str {
    let prefix = format!("{prefix} -> ");
    out.stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for {prefix}\n{}{}", out.stdout, out.stderr))
}

fn smuggling(who: Who) {
    let s = setup(who);
    let (api, plain) = (s.api(), s.plain_url());
    let te = "-H 'Transfer-Encoding: chunked'";
    let script = format!(
        "{SMUGGLE}{}{}{}{}{}{}{}",
        pair("h1-get", "--http1.1", "", &api, "GET"),
        pair("h1-get-te", "--http1.1", te, &api, "GET"),
        pair("h2-get", "--http2", "", &api, "GET"),
        pair("plain-get", "", "", &plain, "GET"),
        pair("plain-get-te", "", te, &plain, "GET"),
        pair("h1-post", "--http1.1", "", &api, "POST"),
        pair("plain-post", "", "", &plain, "POST"),
    );
    let out = s.run(&script);
    for name in ["h1-get", "h1-get-te", "h2-get", "plain-get", "plain-get-te"] {
        let l = line(&out, name);
        assert_eq!(l, format!("{name} -> 403 request-rule"), "{}", out.stderr);
    }
    // An allowed body, and every next request, still go through.
    for name in ["h1-post", "plain-post"] {
        assert!(line(&out, name).contains("-> 200"), "{}", out.stderr);
    }
    for name in [
        "h1-get",
        "h1-get-te",
        "h2-get",
        "plain-get",
        "plain-get-te",
        "h1-post",
        "plain-post",
    ] {
        let l = line(&out, &format!("{name} next"));
        assert!(l.ends_with("-> 200"), "{l}\n{}", out.stderr);
    }
    let (tls_seen, plain_seen) = (s.tls.seen(), s.plain.seen());
    assert!(!tls_seen.contains("/admin"), "smuggled: {tls_seen}");
    assert!(!plain_seen.contains("/admin"), "smuggled: {plain_seen}");
    // The allowed requests reached the origin, with the credential.
    assert!(
        tls_seen.contains(&format!("GET /repos/acme/y auth=Bearer {TOKEN}")),
        "{tls_seen}"
    );
    assert!(plain_seen.contains("GET /repos/acme/y"), "{plain_seen}");
}

#[test]
fn a_request_body_cannot_smuggle_a_request() {
    smuggling(Who::Me);
}

#[test]
fn a_request_body_cannot_smuggle_a_request_as_a_user() {
    if is_root() {
        smuggling(Who::Nobody);
    }
}

fn tunnels(who: Who) {
    let s = setup(who);
    let (api, plain) = (s.api(), s.plain_url());
    let fmt = "-o /dev/null -w '%{http_code}\\n'";
    let script = format!(
        "P=${{http_proxy#http://}}; P=${{P%/}}\n\
         printf 'connect -> '; curl -s -p {fmt} '{plain}/admin/via-connect'\n\
         printf 'socks -> '; curl -s -x socks5h://$P {fmt} '{plain}/admin/via-socks'\n\
         printf 'connect-ok -> '; curl -s -p {fmt} '{plain}/repos/acme/x'\n\
         printf 'https-connect -> '; curl -s -p {fmt} '{api}/repos/acme/x'\n\
         printf 'https-socks -> '; curl -s -x socks5h://$P {fmt} '{api}/admin/x'\n\
         printf 'h2c -> '; curl -s --http2 {fmt} -D - '{plain}/repos/acme/x' | grep -i -e '^x-airlock-reason' -e '^HTTP/' | tr -d '\\r' | tr '\\n' ' '; echo\n\
         printf 'absolute -> '; curl -s {fmt} '{plain}/repos/acme/x'\n"
    );
    let out = s.run(&script);
    // Plain HTTP in a tunnel to a rule host is refused (nothing reads it).
    for name in ["connect", "socks", "connect-ok"] {
        let l = line(&out, name);
        assert!(!l.ends_with(" 200"), "{l}\n{}", out.stderr);
    }
    assert!(out.stderr.contains("request-rule"), "{}", out.stderr);
    // TLS in a tunnel to a rule host is opened and its rules apply.
    assert_eq!(
        line(&out, "https-connect"),
        "https-connect -> 200",
        "{}",
        out.stderr
    );
    assert_eq!(
        line(&out, "https-socks"),
        "https-socks -> 403",
        "{}",
        out.stderr
    );
    // h2c would switch to a protocol the proxy does not read: refused.
    let h2c = line(&out, "h2c");
    assert!(
        h2c.contains("403") && h2c.to_ascii_lowercase().contains("request-rule"),
        "{h2c}"
    );
    assert_eq!(line(&out, "absolute"), "absolute -> 200", "{}", out.stderr);
    let (tls_seen, plain_seen) = (s.tls.seen(), s.plain.seen());
    assert!(!plain_seen.contains("/admin"), "{plain_seen}");
    assert!(!tls_seen.contains("/admin"), "{tls_seen}");
    assert_eq!(
        plain_seen.matches("/repos/acme/x").count(),
        1,
        "{plain_seen}"
    );
}

#[test]
fn tunnels_to_a_rule_host_are_inspected_or_refused() {
    tunnels(Who::Me);
}

#[test]
fn tunnels_to_a_rule_host_are_inspected_or_refused_as_a_user() {
    if is_root() {
        tunnels(Who::Nobody);
    }
}
