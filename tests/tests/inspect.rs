//! TLS inspection end to end (SPEC §5.3): an HTTPS origin on 127.0.0.1
//! with its own test CA (given to the proxy with --upstream-ca), real
//! clients inside `airlock run` trusting the airlock CA through the
//! variables the sandbox gets, request rules, credentials and the checks.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_tests::tls::{TestPki, TlsOrigin};
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-inspect"))
}

const TOKEN: &str = "tok-7c1e9f-never-in-the-sandbox";

struct Setup {
    f: Fixture,
    pki: TestPki,
    origin: TlsOrigin,
    policy: PathBuf,
}

fn setup() -> Setup {
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["api.test", "git.test"]);
    let origin = TlsOrigin::start(&pki, "origin");
    let p = origin.port();
    let policy = f.write(
        "~/policy.toml",
        &format!(
            "[network]\nallow = [\"api.test:{p}\"]\ninspect = [\"api.test\"]\n\n\
             [[network.request]]\nhost = \"api.test:{p}\"\nallow = [\"GET /repos/acme/**\"]\n\n\
             [[network.credential]]\nhost = \"api.test:{p}\"\nheader = \"Authorization\"\nvalue = \"Bearer ${{env:AIRLOCK_TEST_TOKEN}}\"\n"
        ),
    );
    Setup {
        f,
        pki,
        origin,
        policy,
    }
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("https://api.test:{}{path}", self.origin.port())
    }

    fn run(&self, extra: &[&str], script: &str) -> Out {
        let mut args = vec![
            "-p",
            self.policy.to_str().unwrap(),
            "--upstream-ca",
            self.pki.ca_pem.to_str().unwrap(),
            "--resolve",
            "api.test=127.0.0.1",
            "--resolve",
            "git.test=127.0.0.1",
            "--allow-private",
            "127.0.0.0/8",
            "--ask",
            "deny",
        ];
        args.extend_from_slice(extra);
        let mut cmd = self.f.command(&args, script);
        cmd.env("AIRLOCK_TEST_TOKEN", TOKEN);
        run(&mut cmd)
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn show(out: &Out) -> String {
    format!("--- stdout\n{}--- stderr\n{}", out.stdout, out.stderr)
}

#[test]
fn real_clients_trust_the_inspected_connection() {
    let s = setup();
    let url = s.url("/repos/acme/widgets");
    let want = format!(
        "origin GET /repos/acme/widgets host=api.test:{} auth=Bearer {TOKEN}",
        s.origin.port()
    );
    let mut script = format!("echo curl: $(curl -sS {url})\n");
    assert!(have("python3"), "python3 is needed for this test");
    script.push_str(&format!(
        "echo python: $(python3 -c 'import urllib.request; print(urllib.request.urlopen(\"{url}\").read().decode())')\n"
    ));
    // Node 20 ignores the proxy variables for https, so the script opens the
    // CONNECT itself; the trust (NODE_EXTRA_CA_CERTS) is what is tested.
    assert!(have("node"), "node is needed for this test");
    script.push_str(&format!(
        "echo node: $(node -e '
const http = require(\"http\"), tls = require(\"tls\");
const proxy = new URL(process.env.HTTPS_PROXY);
http.request({{host: proxy.hostname, port: proxy.port, method: \"CONNECT\", path: \"api.test:{p}\"}})
  .on(\"connect\", (res, socket) => {{
    const s = tls.connect({{socket, servername: \"api.test\"}}, () => s.write(\"GET /repos/acme/widgets HTTP/1.1\\r\\nHost: api.test:{p}\\r\\nConnection: close\\r\\n\\r\\n\"));
    let d = \"\"; s.on(\"data\", c => d += c); s.on(\"end\", () => console.log(d.split(\"\\r\\n\\r\\n\")[1]));
    s.on(\"error\", e => console.log(\"node-error\", e.message));
  }}).end();')\n",
        p = s.origin.port()
    ));
    let out = s.run(&[], &script);
    for client in ["curl", "python", "node"] {
        assert!(
            out.stdout.contains(&format!("{client}: {want}")),
            "{client} failed\n{}",
            show(&out)
        );
    }
}

#[test]
fn git_clone_over_inspected_https() {
    let s = setup();
    assert!(
        have("git") && have("python3"),
        "git and python3 are needed for this test"
    );
    let root = s.f.home.join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let src = root.join("src");
    let git = |args: &[&str], dir: &std::path::Path| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("HOME", &s.f.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "git {args:?}");
    };
    std::fs::create_dir_all(&src).unwrap();
    git(&["init", "-q", "-b", "main"], &src);
    std::fs::write(src.join("README"), "cloned through airlock\n").unwrap();
    git(&["add", "README"], &src);
    git(
        &[
            "-c",
            "user.email=t@example.test",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            "init",
        ],
        &src,
    );
    git(&["clone", "-q", "--bare", "src", "repo.git"], &root);
    let port_file = s.f.home.join("git.port");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/git_https.py");
    let mut server = Command::new("python3")
        .arg(&fixture)
        .arg(&s.pki.cert_pem)
        .arg(&s.pki.key_pem)
        .arg(&root)
        .arg(&port_file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p.trim().to_string();
        }
        assert!(Instant::now() < deadline, "git server did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let allow = format!("git.test:{port}");
    let out = s.run(
        &["--allow", &allow, "--inspect", "git.test"],
        &format!("git clone -q https://git.test:{port}/repo.git cloned && cat cloned/README"),
    );
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.stdout.contains("cloned through airlock"),
        "{}",
        show(&out)
    );
}

#[test]
fn request_rules_allow_one_path_and_refuse_the_rest() {
    let s = setup();
    let script = format!(
        "curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' {ok}\n\
         curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' -X POST -d x {ok}\n\
         curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' {other}\n",
        ok = s.url("/repos/acme/x"),
        other = s.url("/gists")
    );
    let out = s.run(&[], &script);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        ["200 ", "403 request-rule", "403 request-rule"],
        "{}",
        show(&out)
    );
}

#[test]
fn credentials_are_injected_but_never_visible_inside() {
    let s = setup();
    let script = format!(
        "curl -s {}; echo; env | grep -c {TOKEN}; grep -rls {TOKEN} $HOME/.local/share/airlock /proc/self/environ 2>/dev/null | wc -l",
        s.url("/repos/acme/x")
    );
    let out = s.run(&[], &script);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].contains(&format!("auth=Bearer {TOKEN}")),
        "{}",
        show(&out)
    );
    assert_eq!(&lines[1..], ["0", "0"], "{}", show(&out));
}

#[test]
fn host_mismatch_and_untrusted_upstreams_are_refused() {
    let s = setup();
    let script = format!(
        "curl -s -o /dev/null -w '%{{http_code}} %header{{x-airlock-reason}}\\n' -H 'Host: evil.test' {}",
        s.url("/repos/acme/x")
    );
    let out = s.run(&[], &script);
    assert_eq!(out.stdout.trim(), "403 host-mismatch", "{}", show(&out));
    // Without --upstream-ca the origin's certificate is not trusted: 502.
    let p = s.origin.port();
    let mut cmd = s.f.command(
        &["-p", s.policy.to_str().unwrap(), "--resolve", "api.test=127.0.0.1", "--allow-private", "127.0.0.0/8"],
        &format!("curl -s -w '\\n%{{http_code}} %header{{x-airlock-reason}}\\n' https://api.test:{p}/repos/acme/x"),
    );
    cmd.env("AIRLOCK_TEST_TOKEN", TOKEN);
    let out = run(&mut cmd);
    assert!(
        out.stdout.contains("502 upstream-unreachable"),
        "{}",
        show(&out)
    );
    assert!(
        out.stdout.to_lowercase().contains("certificate"),
        "the body says why: {}",
        show(&out)
    );
}

#[test]
fn leaves_are_reused_and_requests_audited() {
    let s = setup();
    let audit = s.f.home.join("audit.jsonl");
    let url = s.url("/repos/acme/x?page=2");
    let script = format!("for i in 1 2; do curl -s -o /dev/null -w '%{{certs}}' '{url}' | grep -m1 'Serial Number'; done");
    let out = s.run(&["--audit-log", audit.to_str().unwrap()], &script);
    let serials: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(serials.len(), 2, "{}", show(&out));
    assert_eq!(
        serials[0], serials[1],
        "the second connection must reuse the cached leaf"
    );
    let events = audit_events(&audit);
    let req = events
        .iter()
        .find(|e| e["event"] == "request")
        .expect("request event");
    assert_eq!(req["method"], "GET");
    assert_eq!(req["url"], url);
    assert_eq!(req["status"], 200);
    assert!(req["bytes_down"].as_u64().unwrap() > 0);
    // The line stands alone: host, port and the command that sent it.
    assert_eq!(req["host"], "api.test");
    assert_eq!(req["port"], s.origin.port());
    assert_eq!(req["command"]["argv"][0], "curl", "{req}");
    assert!(
        !events.iter().any(|e| e.to_string().contains(TOKEN)),
        "the token must not reach the audit log"
    );
}

#[test]
fn a_client_that_rejects_the_airlock_ca_is_reported() {
    let s = setup();
    let report = s.f.home.join("report.json");
    // curl told to trust only the origin's own CA: like a pinning client.
    let script = format!(
        "curl -s --cacert {} {} ; echo exit=$?",
        s.pki.ca_pem.display(),
        s.url("/repos/acme/x")
    );
    let out = s.run(&["--report", report.to_str().unwrap()], &script);
    assert!(
        out.stdout.contains("exit=60") || out.stdout.contains("exit=35"),
        "{}",
        show(&out)
    );
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let blocked = rep["blocked"].as_array().unwrap();
    assert!(
        blocked
            .iter()
            .any(|b| b["reason"] == "inspection-rejected" && b["host"] == "api.test"),
        "{rep}\n{}",
        show(&out)
    );
}

/// `airlock audit` counts an inspected connection's bytes (not `0 B`) and
/// `--urls` lists its requests per URL (issue 30).
#[test]
fn audit_counts_inspected_bytes_and_lists_urls() {
    let s = setup();
    let audit = s.f.home.join("audit.jsonl");
    let (one, two) = (s.url("/repos/acme/one"), s.url("/repos/acme/two"));
    let script =
        format!("curl -s -o /dev/null '{one}' '{one}' '{two}'; curl -s -o /dev/null '{one}'");
    let out = s.run(&["--audit-log", audit.to_str().unwrap()], &script);
    assert_eq!(out.code, 0, "{}", show(&out));
    let summary = run(airlock(&s.f.home).args(["audit", "--json"]).arg(&audit));
    let v: serde_json::Value = serde_json::from_str(&summary.stdout).expect("audit --json");
    let run0 = &v["runs"][0];
    assert!(run0["bytes_down"].as_u64().unwrap_or(0) > 0, "{run0}");
    assert!(run0["bytes_up"].as_u64().unwrap_or(0) > 0, "{run0}");
    let urls = run0["urls"].as_array().expect("urls");
    let count = |u: &str| {
        urls.iter()
            .find(|x| x["url"] == u)
            .and_then(|x| x["count"].as_u64())
    };
    assert_eq!((count(&one), count(&two)), (Some(3), Some(1)), "{run0}");
    let text = run(airlock(&s.f.home).args(["audit", "--urls"]).arg(&audit));
    assert!(
        !text.stdout.contains(" 0 B up, 0 B down"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("per URL"), "{}", text.stdout);
    assert!(
        text.stdout
            .contains(&format!("GET {one}  x3  status 200 x3")),
        "{}",
        text.stdout
    );
    let plain = run(airlock(&s.f.home).arg("audit").arg(&audit));
    assert!(
        plain.stdout.contains("airlock audit --urls"),
        "{}",
        plain.stdout
    );
}
