//! Request rules that cannot be walked around (SPEC §5.3): the path is
//! normalised before matching, on inspected HTTP/1.1 and HTTP/2 and on
//! plain HTTP, the origin gets exactly the path that was matched, and a
//! rule host without a port restricts every port of that host. A
//! credential is configured throughout: a path that slips past a rule would
//! carry it.

use std::path::PathBuf;

use airlock_tests::tls::{TestPki, TlsOrigin};
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-request-rules"))
}

const TOKEN: &str = "tok-rules-5d1c-never-for-admin";

struct Setup {
    f: Fixture,
    pki: TestPki,
    tls: TlsOrigin,
    plain: Origin,
    policy: PathBuf,
}

fn setup() -> Setup {
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["api.test"]);
    let tls = TlsOrigin::start(&pki, "origin");
    let plain = Origin::start("plain");
    let (p, q) = (tls.port(), plain.port());
    // Both rule hosts are written without a port, while both origins
    // listen on random, non-default ports.
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"api.test:{p}\", \"plain.test:{q}\"]\ninspect = [\"api.test\"]\n\n\
             [[network.request]]\nhost = \"api.test\"\nallow = [\"GET /repos/acme/**\"]\n\n\
             [[network.request]]\nhost = \"plain.test\"\nallow = [\"GET /repos/acme/**\"]\n\n\
             [[network.credential]]\nhost = \"api.test:{p}\"\nheader = \"Authorization\"\nvalue = \"Bearer ${{env:AIRLOCK_TEST_TOKEN}}\"\n"
        ),
    );
    Setup {
        f,
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
        run(&mut cmd)
    }
}

/// One curl per path: `<path> -> <status> <reason> | <body>`.
fn script(base_url: &str, proto: &str, paths: &[&str]) -> String {
    paths
        .iter()
        .map(|p| {
            format!(
                "printf '%s -> ' '{p}'; curl -s {proto} --path-as-is -o body.txt -w '%{{http_code}} %header{{x-airlock-reason}} | ' '{base_url}{p}'; cat body.txt; echo\n"
            )
        })
        .collect()
}

fn line<'a>(out: &'a Out, path: &str) -> &'a str {
    let prefix = format!("{path} -> ");
    out.stdout
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for {path}\n{}{}", out.stdout, out.stderr))
}

const REFUSED: &[&str] = &[
    "/repos/acme/../../admin/secret",
    "/repos/acme/%2e%2e/%2e%2e/admin/secret",
    "/repos/acme/%2E%2E/%2E%2E/admin/secret",
    "/repos/acme/.%2e/.%2E/admin/secret",
    "/repos/acme/..%2f..%2fadmin/secret",
    "/repos/acme/..%2F..%2Fadmin/secret",
    "/repos/acme/..%5c..%5cadmin/secret",
    "/repos/acme/%252e%252e/%252e%252e/admin/secret",
    "/admin/secret",
    // `..` with path parameters (Tomcat and its kin drop them), and
    // overlong UTF-8 dots (a lax decoder reads %C0%AE as `.`).
    "/repos/acme/..;/..;/admin/secret",
    "/repos/acme/%2e%2e;x/%2e%2e;/admin/secret",
    "/repos/acme/..%3b/..%3B/admin/secret",
    "/repos/acme/%C0%AE%C0%AE/%C0%AE%C0%AE/admin/secret",
    "/repos/acme/%c0%ae%c0%ae/%e0%80%ae%e0%80%ae/admin/secret",
];

fn check(out: &Out, origin_name: &str, auth: bool) {
    for p in REFUSED {
        let l = line(out, p);
        assert!(l.contains("-> 403 request-rule |"), "{l}\n{}", out.stderr);
        assert!(
            !l.contains(&format!("{origin_name} GET")),
            "the origin was reached: {l}"
        );
    }
    let ok = line(out, "/repos/acme/x");
    assert!(ok.contains("-> 200"), "{ok}\n{}", out.stderr);
    // The origin gets the normalised path, the one the rule matched.
    for (sent, got) in [
        ("/repos/acme/x/../y", "/repos/acme/y"),
        ("//repos//acme/./z", "/repos/acme/z"),
    ] {
        let l = line(out, sent);
        assert!(
            l.contains("-> 200") && l.contains(&format!("{origin_name} GET {got} ")),
            "{l}"
        );
    }
    if auth {
        assert!(ok.contains(&format!("auth=Bearer {TOKEN}")), "{ok}");
    }
    let reached = format!("{origin_name} GET /admin");
    assert!(!out.stdout.contains(&reached), "{}", out.stdout);
}

fn paths() -> Vec<&'static str> {
    let mut v = REFUSED.to_vec();
    v.extend(["/repos/acme/x", "/repos/acme/x/../y", "//repos//acme/./z"]);
    v
}

#[test]
fn inspected_http1_paths_are_normalised_before_matching() {
    let s = setup();
    let url = format!("https://api.test:{}", s.tls.port());
    let out = s.run(&script(&url, "--http1.1", &paths()));
    check(&out, "origin", true);
}

#[test]
fn inspected_http2_paths_are_normalised_before_matching() {
    let s = setup();
    let url = format!("https://api.test:{}", s.tls.port());
    let out = s.run(&format!(
        "{}curl -s --http2 -o /dev/null -w 'version=%{{http_version}}\\n' {url}/repos/acme/x\n",
        script(&url, "--http2", &paths())
    ));
    assert!(
        out.stdout.contains("version=2"),
        "not HTTP/2:\n{}",
        out.stdout
    );
    check(&out, "origin", true);
}

#[test]
fn plain_http_requests_obey_the_rules_on_any_port() {
    let s = setup();
    let url = format!("http://plain.test:{}", s.plain.port());
    let out = s.run(&script(&url, "", &paths()));
    check(&out, "plain", false);
}

/// A request that asks the origin to take it as another method (an
/// override header, a `_method` parameter) is refused on a rule host: the
/// rule saw `GET`, the origin would run `DELETE`. Inspected and plain.
#[test]
fn method_overrides_are_refused_on_rule_hosts() {
    let s = setup();
    for (url, proto, name) in [
        (
            format!("https://api.test:{}", s.tls.port()),
            "--http1.1",
            "origin",
        ),
        (format!("http://plain.test:{}", s.plain.port()), "", "plain"),
    ] {
        let header = format!("{proto} -H 'X-HTTP-Method-Override: DELETE'");
        let out = s.run(&format!(
            "{}{}",
            script(&url, &header, &["/repos/acme/h"]),
            script(
                &url,
                proto,
                &["/repos/acme/q?_method=DELETE", "/repos/acme/ok?page=2"]
            )
        ));
        for p in ["/repos/acme/h", "/repos/acme/q?_method=DELETE"] {
            let l = line(&out, p);
            assert!(l.contains("-> 403 request-rule |"), "{l}\n{}", out.stderr);
            assert!(
                !l.contains(&format!("{name} GET")),
                "the origin was reached: {l}"
            );
        }
        let ok = line(&out, "/repos/acme/ok?page=2");
        assert!(ok.contains("-> 200"), "{ok}\n{}", out.stderr);
    }
}

#[test]
fn policy_check_warns_about_rules_that_never_apply() {
    let home = Home::new();
    let p = home.write(
        "p.toml",
        "[network]\nallow = [\"api.test\", \"plain.test\"]\ninspect = [\"api.test\"]\n\n\
         [[network.request]]\nhost = \"api.test\"\nallow = [\"GET /x\"]\n\n\
         [[network.request]]\nhost = \"plain.test\"\nallow = [\"GET /x\"]\n\n\
         [[network.request]]\nhost = \"nowhere.test\"\nallow = [\"GET /x\"]\n\n\
         [[network.credential]]\nhost = \"api.test:8443\"\nheader = \"X-Key\"\nvalue = \"k\"\n",
    );
    let out = run(airlock(home.path()).args(["policy", "check"]).arg(&p));
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("request rule for \"nowhere.test\" can never apply"),
        "{all}"
    );
    // A rule implies inspection: its host's HTTPS is opened and checked,
    // so no rule applies "to plain http:// only" any more.
    assert!(!all.contains("plain http:// only"), "{all}");
    assert!(
        all.contains("credential for \"api.test:8443\" can never be sent"),
        "{all}"
    );
    assert!(!all.contains("\"api.test\" can never"), "{all}");
}

#[test]
fn policy_check_managed_accepts_administrator_settings() {
    let home = Home::new();
    let p = home.write(
        "managed.toml",
        "[network]\nuser_allow = false\nallow = [\"api.test\"]\n",
    );
    let plain = run(airlock(home.path()).args(["policy", "check"]).arg(&p));
    assert_eq!(plain.code, 1, "{}{}", plain.stdout, plain.stderr);
    let managed = run(airlock(home.path())
        .args(["policy", "check", "--managed"])
        .arg(&p));
    assert_eq!(managed.code, 0, "{}{}", managed.stdout, managed.stderr);
    assert!(managed.stdout.contains(": ok"), "{}", managed.stdout);
}
