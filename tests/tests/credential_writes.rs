//! A credential reads, it does not publish (SPEC §3.4), and a proxy others
//! can reach lends it only to its own user (SPEC §5.4). End to end: the
//! npm preset finds a token in the user's ~/.npmrc, a registry on
//! 127.0.0.1 records every request and the Authorization it carried, and a
//! hostile command inside tries to publish, create a token and disguise a
//! write as a read. Run as root and as an ordinary user.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_tests::registry::Registry;
use airlock_tests::tiers::{self, Tier, TIERS};
use airlock_tests::tls::TestPki;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-credwrites"))
}

const TOKEN: &str = "npm-tok-7c1e55-reads-only";

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// A registry that wants the token for everything and accepts publishes.
fn registry(pki: &TestPki) -> Registry {
    Registry::start(
        pki,
        Arc::new(|method, path, auth| {
            if auth != Some(&format!("Bearer {TOKEN}")) {
                return (401, "application/json", b"{\"error\":\"token\"}".to_vec());
            }
            match (method, path) {
                ("GET", "/airlock-demo") => (
                    200,
                    "application/json",
                    b"{\"name\":\"airlock-demo\"}".to_vec(),
                ),
                ("POST", "/-/npm/v1/security/advisories/bulk") => {
                    (200, "application/json", b"{}".to_vec())
                }
                ("PUT", p) if p.starts_with("/airlock-pub") => {
                    (200, "application/json", b"{\"ok\":true}".to_vec())
                }
                _ => (404, "application/json", b"{}".to_vec()),
            }
        }),
    )
}

struct Setup {
    f: Fixture,
    pki: TestPki,
    reg: Registry,
}

fn setup(who: Who) -> Setup {
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
    let reg = registry(&pki);
    let p = reg.port();
    f.write(
        "~/.npmrc",
        &format!("registry=https://registry.test:{p}/\n//registry.test:{p}/:_authToken={TOKEN}\nfund=false\naudit=false\nupdate-notifier=false\n"),
    );
    who.prepare(&f);
    Setup { f, pki, reg }
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("https://registry.test:{}{path}", self.reg.port())
    }

    /// `airlock run --preset npm` in `tier`, as uid 65534 when `as_user`.
    fn command(&self, tier: Tier, as_user: bool, ask: &str, script: &str) -> std::process::Command {
        let ca = self.pki.ca_pem.to_str().unwrap().to_string();
        let args = [
            "--upstream-ca",
            &ca,
            "--resolve",
            "registry.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--preset",
            "npm",
            "--ask",
            ask,
        ];
        tiers::command(&self.f, tier, as_user, &args, script)
    }

    /// The registry's log lines for requests that carried the token.
    fn with_token(&self) -> Vec<String> {
        self.reg
            .seen()
            .into_iter()
            .filter(|s| s.contains(TOKEN))
            .collect()
    }
}

/// `curl` with `-w` printing `NAME=<status> reason=<X-Airlock-Reason>`.
fn curl_line(name: &str, args: &str, url: &str) -> String {
    format!(
        "h=\"${{TMPDIR:-/tmp}}/h-{name}\"; curl -s -o /dev/null -D \"$h\" {args} -w '{name}=%{{http_code}}' '{url}'; \
         echo \" reason=$(grep -i '^x-airlock-reason' \"$h\" | tr -d '\\r' | cut -d' ' -f2)\"; "
    )
}

#[test]
fn a_discovered_token_reads_but_never_publishes_unasked() {
    for (tier, as_user) in TIERS
        .into_iter()
        .flat_map(|t| tiers::users().into_iter().map(move |u| (t, u)))
    {
        let who = (tier, as_user);
        let s = setup(Who::Me);
        let script = [
            curl_line("get", "", &s.url("/airlock-demo")),
            curl_line(
                "audit",
                "-X POST -H 'content-type: application/json' -d '{}'",
                &s.url("/-/npm/v1/security/advisories/bulk"),
            ),
            curl_line(
                "publish",
                "-X PUT -H 'content-type: application/json' -d '{\"name\":\"victim-pkg\"}'",
                &s.url("/victim-pkg"),
            ),
            curl_line(
                "token",
                "-X POST -H 'content-type: application/json' -d '{\"password\":\"x\"}'",
                &s.url("/-/npm/v1/tokens"),
            ),
            curl_line("unpublish", "-X DELETE", &s.url("/victim-pkg/-rev/1")),
            // A read that asks the origin to take it as a write.
            curl_line(
                "override",
                "-H 'X-HTTP-Method-Override: PUT'",
                &s.url("/victim-pkg"),
            ),
            curl_line("query", "", &s.url("/victim-pkg?_method=DELETE")),
            // The same header as CGI, Rack and WSGI servers read it.
            curl_line(
                "underscore",
                "-H 'X_HTTP_METHOD_OVERRIDE: DELETE'",
                &s.url("/victim-pkg"),
            ),
        ]
        .concat();
        let out = run(&mut s.command(tier, as_user, "deny", &script));
        let o = &out.stdout;
        assert!(
            o.contains("get=200"),
            "{who:?}: a read lost its token\n{}",
            show(&out)
        );
        assert!(
            o.contains("audit=200"),
            "{who:?}: npm's advisory lookup lost its token\n{}",
            show(&out)
        );
        for w in [
            "publish",
            "token",
            "unpublish",
            "override",
            "query",
            "underscore",
        ] {
            assert!(
                o.contains(&format!("{w}=403 reason=credential-write")),
                "{who:?}: {w} was not refused as a credential write\n{}",
                show(&out)
            );
        }
        let seen = s.reg.seen();
        assert!(
            !seen.iter().any(|l| l.starts_with("PUT ")
                || l.starts_with("DELETE ")
                || l.contains("/-/npm/v1/tokens")
                || l.contains("_method")),
            "{who:?}: a write reached the registry: {seen:?}"
        );
        assert!(
            seen.iter()
                .any(|l| l.starts_with("GET /airlock-demo ") && l.contains(TOKEN)),
            "{who:?}: the token was not added to the read: {seen:?}"
        );
        // The refusal says what and how, and the report counts it.
        assert!(
            out.stderr.contains("credential-write"),
            "{who:?}: the exit report does not name the refusal\n{}",
            show(&out)
        );
    }
}

/// `airlock approve --socket PATH` as `who` (the socket serves only
/// airlock's own user), answering the first question with `key`.
fn approver(who: Who, f: &Fixture, sock: &Path, key: &str) -> std::process::Child {
    wait_for_file(sock);
    let mut c = airlock(&f.home);
    c.arg("approve").arg("--socket").arg(sock);
    let mut c = who.wrap(c);
    c.stdin(std::process::Stdio::piped());
    let mut child = spawn_piped(&mut c);
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = writeln!(stdin, "{key}");
    // Held open until the question came: EOF ends the client.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        drop(stdin);
    });
    child
}

#[test]
fn an_approved_npm_publish_carries_the_token_and_a_denied_one_never_leaves() {
    for who in Who::all() {
        for (key, published) in [("o", true), ("d", false)] {
            let s = setup(who);
            s.f.write(
                "package.json",
                "{\"name\":\"airlock-pub\",\"version\":\"1.0.0\",\"main\":\"index.js\"}",
            );
            s.f.write("index.js", "module.exports = 1;\n");
            who.prepare(&s.f);
            let sock = s.f.home.join("approve.sock");
            let ask = format!("socket:{}", sock.display());
            let ca = s.pki.ca_pem.to_str().unwrap().to_string();
            let args = [
                "--upstream-ca",
                &ca,
                "--resolve",
                "registry.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--preset",
                "npm",
                "--ask",
                &ask,
            ];
            let run_child = spawn_piped(&mut who.wrap(s.f.command(
                &args,
                "npm publish --loglevel=error --ignore-scripts 2>&1 | tail -5",
            )));
            let mut client = approver(who, &s.f, &sock, key);
            let out = output_of(run_child);
            let _ = client.kill();
            let asked = output_of(client);
            let puts: Vec<String> = s
                .with_token()
                .into_iter()
                .filter(|l| l.starts_with("PUT /airlock-pub"))
                .collect();
            let q = &asked.stderr;
            assert!(
                q.contains("lend the credential")
                    && q.contains("PUT https://registry.test:")
                    && q.contains("/airlock-pub")
                    && q.contains("preset npm"),
                "{who:?} {key}: the question must name method, URL and credential:\n{q}\n{}",
                show(&out)
            );
            assert!(!q.contains(TOKEN), "{who:?}: the question shows the token");
            if published {
                assert_eq!(
                    puts.len(),
                    1,
                    "{who:?}: the approved publish did not carry the token\n{}\nregistry saw {:?}",
                    show(&out),
                    s.reg.seen()
                );
            } else {
                assert!(
                    !s.reg.seen().iter().any(|l| l.starts_with("PUT ")),
                    "{who:?}: a denied publish reached the registry: {:?}",
                    s.reg.seen()
                );
                assert!(out.stderr.contains("credential-write"), "{}", show(&out));
            }
        }
    }
}

/// A credentialed write that asks the origin to take it as another method
/// is refused, never asked about (a person would approve the method shown,
/// not the one the origin runs), and a session answer for one write covers
/// that method on that URL only (red team round 7: one "session" answer
/// for a PUT let an overridden PUT elsewhere out, unasked).
#[test]
fn an_overridden_write_is_refused_and_a_session_answer_covers_one_url() {
    for who in Who::all() {
        let s = setup(who);
        let sock = s.f.home.join("approve.sock");
        let ask = format!("socket:{}", sock.display());
        let script = [
            curl_line(
                "overridden",
                "-X PUT -H 'X-HTTP-Method-Override: DELETE' -d x",
                &s.url("/pkg-a"),
            ),
            curl_line("first", "-X PUT -d x", &s.url("/pkg-a")),
            curl_line("again", "-X PUT -d x", &s.url("/pkg-a")),
            curl_line("elsewhere", "-X PUT -d x", &s.url("/pkg-b")),
        ]
        .concat();
        // A question not answered within 3 s is refused (the client reads
        // no answer typed before a question shows).
        let policy = s.f.home.join("ask.toml");
        std::fs::write(&policy, "[network]\nask_timeout = \"3s\"\n").unwrap();
        let ca = s.pki.ca_pem.to_str().unwrap().to_string();
        let args = [
            "-p",
            policy.to_str().unwrap(),
            "--upstream-ca",
            &ca,
            "--resolve",
            "registry.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--preset",
            "npm",
            "--ask",
            &ask,
        ];
        let run_child = spawn_piped(&mut tiers::command(
            &s.f,
            Tier::Full,
            who == Who::Nobody,
            &args,
            &script,
        ));
        // "session" to the first question; the next goes unanswered.
        let mut client = approver(who, &s.f, &sock, "s");
        let out = output_of(run_child);
        let _ = client.kill();
        let asked = output_of(client);
        let q = &asked.stderr;
        let o = &out.stdout;
        assert!(
            o.contains("overridden=403 reason=credential-write"),
            "{who:?}: {}",
            show(&out)
        );
        for ok in ["first=", "again="] {
            assert!(
                o.contains(ok) && !o.contains(&format!("{ok}403")),
                "{who:?}: {ok} {}",
                show(&out)
            );
        }
        assert!(
            o.contains("elsewhere=403 reason=credential-write"),
            "{who:?}: a session answer covered another URL:\n{q}\n{}",
            show(&out)
        );
        assert_eq!(q.matches("lend the credential").count(), 2, "{who:?}: {q}");
        // The two approved writes reached the registry; neither the
        // overridden one nor the one elsewhere did.
        let puts = |p: &str| {
            s.reg
                .seen()
                .iter()
                .filter(|l| l.starts_with(&format!("PUT {p} ")))
                .count()
        };
        assert_eq!(puts("/pkg-a"), 2, "{who:?}: {:?}", s.reg.seen());
        assert_eq!(puts("/pkg-b"), 0, "{who:?}: {:?}", s.reg.seen());
    }
}

/// `airlock proxy --preset npm`: the token goes to the proxy's own user's
/// clients only. Another local user pointing curl at the port gets a
/// refusal, and the registry never sees the token for it.
#[test]
fn a_standalone_proxy_lends_its_token_only_to_its_own_user() {
    let s = setup(Who::Me);
    let home = Home::new();
    // The proxy runs with the fixture's HOME, where ~/.npmrc is.
    let mut cmd = airlock(home.path());
    cmd.env("HOME", &s.f.home)
        .env("XDG_CONFIG_HOME", s.f.home.join(".config"))
        .env("XDG_DATA_HOME", s.f.home.join(".local/share"))
        .current_dir(&s.f.ws);
    let ca = s.pki.ca_pem.to_str().unwrap().to_string();
    let proxy = Proxy::start_with(
        cmd,
        &[
            "--upstream-ca",
            &ca,
            "--resolve",
            "registry.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--preset",
            "npm",
            "--ask",
            "deny",
        ],
    );
    // Wait for the start-up lines after the first.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !proxy.log().contains("credentials for") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let me = unsafe { libc::geteuid() };
    assert!(
        proxy.log().contains(&format!("running as uid {me}")),
        "the proxy must say who may use its credentials:\n{}",
        proxy.log()
    );
    // The airlock CA the proxy mints with, readable by the other user.
    let airlock_ca = s.f.home.join(".local/share/airlock/ca/ca.pem");
    let shared_ca = base().join(format!("ca-{}.pem", std::process::id()));
    std::fs::copy(&airlock_ca, &shared_ca).expect("airlock CA");
    let curl_as = |who: Who| {
        let mut c = std::process::Command::new("curl");
        c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-D", "-"])
            .args(["--cacert", shared_ca.to_str().unwrap()])
            .args(["-x", &proxy.url()])
            .arg(s.url("/airlock-demo"));
        run(&mut who.wrap(c))
    };
    let mine = curl_as(Who::Me);
    assert!(
        mine.stdout.ends_with("200"),
        "the proxy's own user lost the token: {}\n{}",
        show(&mine),
        proxy.log()
    );
    let before = s.with_token().len();
    assert!(before >= 1);
    if is_root() {
        let other = curl_as(Who::Nobody);
        assert!(
            other.stdout.ends_with("403")
                && other
                    .stdout
                    .to_ascii_lowercase()
                    .contains("x-airlock-reason: credential-client"),
            "another user was lent the token: {}\n{}",
            show(&other),
            proxy.log()
        );
        assert_eq!(
            s.with_token().len(),
            before,
            "the registry saw the token for another user: {:?}",
            s.reg.seen()
        );
        // The proxy's own user still gets it afterwards.
        assert!(curl_as(Who::Me).stdout.ends_with("200"));
    }
    let _ = std::fs::remove_file(&shared_ca);
}

/// The degraded tier's proxy listens on the host's loopback, where every
/// local user can reach it: the token goes to the sandbox (the same user),
/// never to another user who finds the port.
#[test]
fn the_degraded_tier_lends_the_token_only_to_its_own_user() {
    if !is_root() {
        eprintln!("skipped: another user is needed (run as root)");
        return;
    }
    let s = setup(Who::Me);
    let url = s.url("/airlock-demo");
    let script = format!(
        "printf %s \"$HTTPS_PROXY\" > proxy-url; touch started; \
         while [ ! -e go ]; do sleep 0.05; done; \
         {}",
        curl_line("get", "", &url)
    );
    let cmd = s.command(Tier::Degraded, false, "deny", &script);
    let shared_ca = base().join(format!("ca-degraded-{}.pem", std::process::id()));
    let other = Arc::new(std::sync::Mutex::new(None));
    let o2 = other.clone();
    let out = tiers::while_it_runs(
        &s.f,
        cmd,
        || {
            let proxy = std::fs::read_to_string(s.f.ws.join("proxy-url")).unwrap_or_default();
            std::fs::copy(s.f.home.join(".local/share/airlock/ca/ca.pem"), &shared_ca)
                .expect("airlock CA");
            let mut c = std::process::Command::new("curl");
            c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-D", "-"])
                .args(["--cacert", shared_ca.to_str().unwrap()])
                .args(["-x", proxy.trim()])
                .arg(&url);
            *o2.lock().unwrap() = Some((proxy, run(&mut Who::Nobody.wrap(c))));
        },
        Duration::from_millis(10),
    );
    let _ = std::fs::remove_file(&shared_ca);
    let (proxy, other) = other.lock().unwrap().take().expect("the other user ran");
    assert!(
        proxy.starts_with("http://127.0.0.1:"),
        "{proxy:?}\n{}",
        show(&out)
    );
    assert!(
        other.stdout.ends_with("403")
            && other
                .stdout
                .to_ascii_lowercase()
                .contains("x-airlock-reason: credential-client"),
        "another user was lent the token through the degraded tier's port: {}\n{}",
        show(&other),
        show(&out)
    );
    assert!(out.stdout.contains("get=200"), "{}", show(&out));
    assert_eq!(
        s.with_token().len(),
        1,
        "only the sandbox's own read carried the token: {:?}",
        s.reg.seen()
    );
}
