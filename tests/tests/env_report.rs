//! The sandbox's environment (SPEC §4.3) and what the exit report says
//! about a run (SPEC §7): secrets stay outside while everything else is
//! inherited, failures of allowed hosts are reported with their reason,
//! and a flood of refusals makes a short block and a short report with
//! the right totals. Each runs as root and as an ordinary user.

use std::net::TcpListener;
use std::path::PathBuf;

use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-env-report"))
}

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

fn report_of(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("report written"))
        .expect("report is JSON")
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_string())
        .collect()
}

const API_KEY: &str = "sk-live-APIKEYVALUE-0001";
const DB_PASS: &str = "DBPASSVALUE0002";
const URL_TOKEN: &str = "URLTOKENVALUE0003";

/// The host environment of a developer: build variables, secrets of
/// several shapes, and a corporate proxy.
fn host_env(cmd: &mut std::process::Command) {
    cmd.env("CI", "1")
        .env("NODE_ENV", "test")
        .env("GIT_AUTHOR_NAME", "A U Thor")
        .env("MY_API_KEY", API_KEY)
        .env("github_token", "ghp_lowercase_name_value")
        .env("DATABASE_URL", format!("postgres://app:{DB_PASS}@db/app"))
        .env(
            "REPO_URL",
            format!("https://{URL_TOKEN}@github.com/a/b.git"),
        )
        .env("HTTP_PROXY", "http://corp-proxy.invalid:8080")
        .env("https_proxy", "http://corp-proxy.invalid:8080")
        .env("npm_config_https_proxy", "http://corp-proxy.invalid:8080")
        .env("AIRLOCK_SANDBOX", "0");
}

const WITHHELD: [&str; 4] = ["DATABASE_URL", "MY_API_KEY", "REPO_URL", "github_token"];

#[test]
fn the_environment_is_inherited_less_secrets_and_the_report_names_them() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let report = f.home.join("report.json");
        // Every process's environment inside too: the sandbox's init
        // must not hold what the command was denied.
        let script =
            "env; echo ---; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; exit ${RC:-0}";
        let mut cmd = f.command(&["--report", report.to_str().unwrap()], script);
        host_env(&mut cmd);
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        for want in [
            "CI=1",
            "NODE_ENV=test",
            "GIT_AUTHOR_NAME=A U Thor",
            "AIRLOCK_SANDBOX=1",
            "HTTP_PROXY=http://127.0.0.1:3128",
            "https_proxy=http://127.0.0.1:3128",
        ] {
            assert!(
                out.stdout.lines().any(|l| l == want),
                "{who:?}: {want} missing\n{}",
                show(&out)
            );
        }
        for never in [
            API_KEY,
            DB_PASS,
            URL_TOKEN,
            "ghp_lowercase_name_value",
            "corp-proxy.invalid",
            "AIRLOCK_SANDBOX=0",
        ] {
            assert!(
                !out.stdout.contains(never),
                "{who:?}: {never} reached the sandbox\n{}",
                show(&out)
            );
        }
        // A successful run says nothing about it on stderr.
        assert!(!out.stderr.contains("withheld"), "{who:?}: {}", show(&out));
        let text = std::fs::read_to_string(&report).unwrap();
        for never in [API_KEY, DB_PASS, URL_TOKEN] {
            assert!(!text.contains(never), "{who:?}: a value in the report");
        }
        let rep = report_of(&report);
        assert_eq!(names(&rep["withheld_env"]), WITHHELD, "{who:?}: {rep}");
        assert_eq!(rep["withheld_env_not_listed"], 0);

        // A failed run names them, briefly, so the user knows what the
        // command may have missed.
        let mut cmd = f.command(&["--report", report.to_str().unwrap()], script);
        host_env(&mut cmd);
        cmd.env("RC", "3");
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 3, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains(
                "airlock: withheld 4 secret-looking variables: DATABASE_URL, MY_API_KEY, REPO_URL, github_token; --pass-env NAME passes one."
            ),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!out.stderr.contains(API_KEY), "{who:?}: {}", show(&out));

        // Named exactly, a secret passes.
        let mut cmd = f.command(&["--pass-env", "MY_API_KEY"], "env");
        host_env(&mut cmd);
        let out = run(&mut who.wrap(cmd));
        assert!(
            out.stdout.contains(&format!("MY_API_KEY={API_KEY}")),
            "{who:?}: {}",
            show(&out)
        );
    }
}

#[test]
fn inherit_none_is_the_strict_list_and_a_glob_says_what_it_withheld() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let report = f.home.join("report.json");
        // Outside every writable root: trusted as given.
        let policy = f.write(
            "~/strict.toml",
            "[env]\ninherit = \"none\"\npass = [\"NODE_ENV\"]\n",
        );
        who.prepare(&f);
        let mut cmd = f.command(
            &[
                "--policy",
                policy.to_str().unwrap(),
                "--network",
                "none",
                "--pass-env",
                "MY_*",
                "--report",
                report.to_str().unwrap(),
            ],
            "env",
        );
        host_env(&mut cmd);
        cmd.env("MY_SETTING", "kept");
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        for want in ["NODE_ENV=test", "MY_SETTING=kept", "AIRLOCK_SANDBOX=1"] {
            assert!(
                out.stdout.lines().any(|l| l == want),
                "{who:?}: {want} missing\n{}",
                show(&out)
            );
        }
        for never in ["CI=", "GIT_AUTHOR_NAME=", API_KEY, "corp-proxy.invalid"] {
            assert!(
                !out.stdout.contains(never),
                "{who:?}: {never} passed\n{}",
                show(&out)
            );
        }
        assert!(
            out.stderr.contains(
                "airlock: --pass-env 'MY_*' matches MY_API_KEY, which looks like a secret and is withheld; name it exactly to pass it"
            ),
            "{who:?}: {}",
            show(&out)
        );
        let withheld = names(&report_of(&report)["withheld_env"]);
        for k in ["CI", "GIT_AUTHOR_NAME", "MY_API_KEY"] {
            assert!(withheld.iter().any(|w| w == k), "{who:?}: {withheld:?}");
        }

        // An unknown value is an error naming its place.
        let bad = f.write("~/bad.toml", "[env]\ninherit = \"some\"\n");
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--policy", bad.to_str().unwrap(), "--network", "none"],
            "echo ran",
        )));
        assert_ne!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("ran"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("bad.toml:2:11"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

#[test]
fn an_allowed_host_that_cannot_be_reached_is_reported_with_why() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: curl is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        // A port nothing listens on.
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let origin = Origin::start("env-report-origin");
        let report = f.home.join("report.json");
        let script = format!(
            "curl -s -o /dev/null -w '%{{http_code}}\\n' http://dead.test:{port}/; \
             curl -s -o /dev/null -w '%{{http_code}}\\n' http://live.test:{}/",
            origin.port()
        );
        let out = run(&mut who.wrap(f.command(
            &[
                "--allow",
                &format!("dead.test:{port}"),
                "--allow",
                &format!("live.test:{}", origin.port()),
                "--resolve",
                "dead.test=127.0.0.1",
                "--resolve",
                "live.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
                "--report",
                report.to_str().unwrap(),
            ],
            &script,
        )));
        assert_eq!(
            out.stdout.lines().collect::<Vec<_>>(),
            ["502", "200"],
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            out.stderr.contains(&format!(
                "airlock: 1 connection to an allowed host failed upstream: dead.test:{port} (upstream-unreachable: connecting to 127.0.0.1:{port} failed: Connection refused"
            )),
            "{who:?}: {}",
            show(&out)
        );
        // Nothing was blocked: no blocked line.
        assert!(!out.stderr.contains("blocked"), "{who:?}: {}", show(&out));
        let rep = report_of(&report);
        let up = &rep["upstream_failures"];
        assert_eq!(up.as_array().map(Vec::len), Some(1), "{who:?}: {rep}");
        assert_eq!(up[0]["host"], "dead.test");
        assert_eq!(up[0]["port"], port);
        assert_eq!(up[0]["reason"], "upstream-unreachable");
        assert_eq!(up[0]["count"], 1);
        assert!(
            up[0]["detail"]
                .as_str()
                .unwrap()
                .contains("Connection refused"),
            "{rep}"
        );
        assert_eq!(rep["upstream_failures_total"], 1);
        assert_eq!(rep["blocked"].as_array().map(Vec::len), Some(0));
    }
}

/// #28 item 9: thousands of refusals (3,000 distinct names, more than the
/// proxy keeps) make a bounded stderr block and report, with the total
/// right, and the allowed request beside them still works.
#[test]
fn a_flood_of_refusals_is_counted_not_listed() {
    if std::process::Command::new("bash")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: bash is not installed");
        return;
    }
    const N: usize = 3000;
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let origin = Origin::start("env-report-flood");
        let report = f.home.join("report.json");
        // bash's /dev/tcp: no process per request, so 3,000 are quick.
        let script = format!(
            "for i in $(seq 1 {N}); do \
               exec 3<>/dev/tcp/127.0.0.1/3128 || exit 9; \
               printf 'CONNECT n%s.flood.test:443 HTTP/1.1\\r\\nHost: n%s.flood.test:443\\r\\n\\r\\n' $i $i >&3; \
               read -r line <&3; exec 3>&-; \
             done; echo \"last: $line\"; \
             exec 3<>/dev/tcp/127.0.0.1/3128; \
             printf 'GET http://live.test:{p}/ HTTP/1.1\\r\\nHost: live.test:{p}\\r\\nConnection: close\\r\\n\\r\\n' >&3; \
             read -r line <&3; echo \"live: $line\"",
            p = origin.port()
        );
        let started = std::time::Instant::now();
        let out = run(&mut who.wrap(f.command_argv(
            &[
                "--allow",
                &format!("live.test:{}", origin.port()),
                "--resolve",
                "live.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
                "--report",
                report.to_str().unwrap(),
            ],
            &["bash", "-c", &script],
        )));
        let took = started.elapsed();
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stdout.contains("last: HTTP/1.1 403"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            out.stdout.contains("live: HTTP/1.1 200"),
            "{who:?}: {}",
            show(&out)
        );
        let block: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with("airlock: blocked"))
            .collect();
        assert_eq!(block.len(), 1, "{who:?}: {}", out.stderr);
        assert!(
            block[0].starts_with("airlock: blocked 3,000 connections: n"),
            "{who:?}: {}",
            block[0]
        );
        assert!(
            block[0].contains(" and 2,980 more (see --report / the audit log)"),
            "{who:?}: {}",
            block[0]
        );
        assert!(
            out.stderr.len() < 4096,
            "{who:?}: stderr is {} bytes",
            out.stderr.len()
        );
        let text = std::fs::read_to_string(&report).unwrap();
        assert!(
            text.len() < 64 * 1024,
            "{who:?}: report is {} bytes",
            text.len()
        );
        let rep = report_of(&report);
        assert_eq!(rep["blocked_total"], N, "{who:?}");
        let listed = rep["blocked"].as_array().unwrap();
        assert_eq!(listed.len(), 100, "{who:?}");
        let listed_count: u64 = listed.iter().map(|b| b["count"].as_u64().unwrap()).sum();
        assert_eq!(
            rep["blocked_not_listed"].as_u64().unwrap() + listed_count,
            N as u64,
            "{who:?}"
        );
        eprintln!("{who:?}: {N} refusals in {took:?}");
    }
}
