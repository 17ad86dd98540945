//! What a new user meets first on the command line: explanations for both
//! web ports, `--json` for scripts, errors that say what to write instead.

use std::fs;

use airlock_tests::{airlock, run, Out};

fn home() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("no-managed-policy.toml"), "").unwrap();
    dir
}

fn show(out: &Out) -> String {
    format!("exit {}\n{}{}", out.code, out.stdout, out.stderr)
}

#[test]
fn explain_without_a_port_shows_443_and_80() {
    let h = home();
    let out = run(airlock(h.path()).args(["policy", "explain", "--allow", "x.test", "x.test"]));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(
        out.stdout.contains("target:   x.test:443"),
        "{}",
        show(&out)
    );
    assert!(out.stdout.contains("target:   x.test:80"), "{}", show(&out));
    let out = run(airlock(h.path()).args(["policy", "explain", "x.test:8080"]));
    assert_eq!(out.stdout.matches("target:").count(), 1, "{}", show(&out));
}

#[test]
fn json_output_for_scripts() {
    let h = home();
    let out =
        run(airlock(h.path()).args(["policy", "explain", "--json", "--allow", "x.test", "x.test"]));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("explain --json");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{}", show(&out));
    assert_eq!(v[0]["verdict"], "allow");
    assert_eq!(v[1]["target"], "x.test:80");

    let out = run(airlock(h.path()).args(["policy", "presets", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("presets --json");
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for want in ["npm", "pypi", "cargo", "go", "git"] {
        assert!(names.contains(&want), "{names:?}");
    }

    let good = h.path().join("good.toml");
    fs::write(&good, "[network]\nallow = [\"a.test\"]\n").unwrap();
    let bad = h.path().join("bad.toml");
    fs::write(&bad, "[network]\nallow = [\"https://a.test/\"]\n").unwrap();
    let out = run(airlock(h.path())
        .args(["policy", "check", "--json"])
        .arg(&good));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("check --json");
    assert_eq!(
        (out.code, v["ok"].as_bool()),
        (0, Some(true)),
        "{}",
        show(&out)
    );
    let out = run(airlock(h.path())
        .args(["policy", "check", "--json"])
        .arg(&bad));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("check --json");
    assert_eq!(
        (out.code, v["ok"].as_bool()),
        (1, Some(false)),
        "{}",
        show(&out)
    );
    assert!(
        v["errors"][0].as_str().unwrap().contains("not a URL"),
        "{}",
        show(&out)
    );
}

#[test]
fn a_url_where_a_host_pattern_belongs_says_what_to_write() {
    let h = home();
    let out =
        run(airlock(h.path()).args(["policy", "explain", "--allow", "https://x.test/", "x.test"]));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("not a URL") && out.stderr.contains("write x.test"),
        "{}",
        show(&out)
    );
}

#[test]
fn run_without_dashes_hints_at_them() {
    let h = home();
    let out = run(airlock(h.path()).args(["run", "echo", "hi"]));
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("-- <command>"), "{}", show(&out));
    assert!(!out.stdout.contains("hi"));
}

#[test]
fn completions_and_man_page() {
    let h = home();
    for shell in ["bash", "zsh", "fish"] {
        let out = run(airlock(h.path()).args(["completions", shell]));
        assert_eq!(out.code, 0, "{shell}: {}", show(&out));
        assert!(out.stdout.contains("pass-env"), "{shell}: {}", show(&out));
    }
    let out = run(airlock(h.path()).args(["completions", "tcsh"]));
    assert_ne!(out.code, 0);
    let out = run(airlock(h.path()).arg("manpage"));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(out.stdout.contains(".TH airlock 1"), "{}", show(&out));
    let help = run(airlock(h.path()).arg("--help"));
    assert!(
        help.stdout.contains("airlock/policy.toml"),
        "{}",
        show(&help)
    );
}

// ---- Messages that stop short (issue 30): each names the fix. ----

fn base() -> std::path::PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("/var/tmp/airlock-frictions"))
}

#[test]
fn a_host_with_a_path_says_rules_take_hosts() {
    let h = home();
    let out = run(airlock(h.path()).args([
        "policy",
        "explain",
        "--allow",
        "mirror.test/simple",
        "mirror.test",
    ]));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("takes a host") && out.stderr.contains("write mirror.test"),
        "{}",
        show(&out)
    );
    assert!(!out.stderr.contains("CIDR"), "{}", show(&out));
    // A CIDR still reads as one.
    let out =
        run(airlock(h.path()).args(["policy", "explain", "--deny", "10.0.0.0/8", "10.1.2.3:22"]));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(out.stdout.contains("verdict:  deny"), "{}", show(&out));
}

#[test]
fn explain_takes_a_url() {
    let h = home();
    let out = run(airlock(h.path()).args([
        "policy",
        "explain",
        "--allow",
        "x.test",
        "https://x.test/simple/pkg/",
    ]));
    assert_eq!(out.code, 0, "{}", show(&out));
    assert_eq!(out.stdout.matches("target:").count(), 1, "{}", show(&out));
    assert!(
        out.stdout.contains("target:   x.test:443"),
        "{}",
        show(&out)
    );
    assert!(out.stdout.contains("verdict:  allow"), "{}", show(&out));
    let out = run(airlock(h.path()).args(["policy", "explain", "http://x.test:8080/a?b"]));
    assert!(
        out.stdout.contains("target:   x.test:8080"),
        "{}",
        show(&out)
    );
    assert!(!out.stdout.contains("invalid"), "{}", show(&out));
}

#[test]
fn a_missing_policy_file_is_no_such_file() {
    let h = home();
    let out = run(airlock(h.path()).args([
        "policy",
        "explain",
        "-p",
        "/nonexistent-airlock-policy.toml",
        "x.test",
    ]));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("/nonexistent-airlock-policy.toml:1:1: no such file"),
        "{}",
        show(&out)
    );
    assert!(!out.stderr.contains("link"), "{}", show(&out));
}

#[test]
fn a_report_that_cannot_be_written_says_why_once() {
    let f = airlock_tests::Fixture::new_in(&base());
    let out = f.run(
        &[
            "--network",
            "none",
            "--report",
            "/nonexistent-airlock-dir/r.json",
        ],
        "echo ran",
    );
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(!out.stdout.contains("ran"), "{}", show(&out));
    assert_eq!(
        out.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        show(&out)
    );
    assert!(out.stderr.contains("--report"), "{}", show(&out));
}

#[test]
fn explain_does_not_offer_allow_when_it_would_not_count() {
    let h = home();
    fs::write(
        h.path().join("managed.toml"),
        "[network]\nuser_allow = false\n",
    )
    .unwrap();
    let out = run(airlock(h.path())
        .env("AIRLOCK_MANAGED_POLICY", h.path().join("managed.toml"))
        .args(["policy", "explain", "x.test"]));
    assert!(out.stdout.contains("to allow:"), "{}", show(&out));
    assert!(!out.stdout.contains("--allow"), "{}", show(&out));
    assert!(out.stdout.contains("administrator"), "{}", show(&out));
}

#[test]
fn checking_a_user_file_names_no_built_in_managed_rule() {
    let h = home();
    let user = h.path().join("policy.toml");
    fs::write(&user, "[network]\nuser_allow = false\n").unwrap();
    let out = run(airlock(h.path()).args(["policy", "check"]).arg(&user));
    assert_eq!(out.code, 1, "{}", show(&out));
    assert!(!out.stdout.contains("built-in"), "{}", show(&out));
    assert!(
        out.stdout
            .contains("only the managed policy can set network.user_allow")
            && out.stdout.contains("belongs in the managed policy"),
        "{}",
        show(&out)
    );
}

#[test]
fn run_warns_of_a_credential_no_allow_rule_covers() {
    let f = airlock_tests::Fixture::new_in(&base());
    let p = f.write(
        "~/p.toml",
        "[network]\nallow = [\"api.test:8443\"]\n\n[[network.credential]]\nhost = \"api.test\"\nheader = \"Authorization\"\nvalue = \"Bearer x\"\n",
    );
    let out = f.run(&["-p", p.to_str().unwrap()], "echo ran");
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(out.stdout.contains("ran"));
    assert!(
        out.stderr
            .contains("the credential for \"api.test\" can never be sent"),
        "{}",
        show(&out)
    );
    assert!(
        out.stderr
            .contains("write host = \"api.test:8443\" in the credential"),
        "{}",
        show(&out)
    );
    // Covered: nothing to say.
    let p = f.write(
        "~/q.toml",
        "[network]\nallow = [\"api.test:8443\"]\n\n[[network.credential]]\nhost = \"api.test:8443\"\nheader = \"Authorization\"\nvalue = \"Bearer x\"\n",
    );
    let out = f.run(&["-p", p.to_str().unwrap()], "echo ran");
    assert!(!out.stderr.contains("never be sent"), "{}", show(&out));
}

#[test]
fn a_plain_http_index_password_is_said_withheld_not_listed_as_lent() {
    let f = airlock_tests::Fixture::new_in(&base());
    f.write(
        "~/.config/pip/pip.conf",
        "[global]\nindex-url = http://me:s3cret-pw@mirror.test:3141/simple\n",
    );
    let out = run(airlock(&f.home)
        .current_dir(&f.ws)
        .args(["policy", "presets"]));
    let pypi: String = out
        .stdout
        .split("\npypi:")
        .nth(1)
        .unwrap_or("")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(pypi.contains("mirror.test:3141"), "{}", show(&out));
    assert!(!pypi.contains("  credential "), "{pypi}");
    assert!(
        pypi.contains("withheld") && pypi.contains("https://"),
        "{pypi}"
    );
    let out = f.run(&["--preset", "pypi"], "echo ran; cat \"$PIP_CONFIG_FILE\"");
    assert!(out.stdout.contains("ran"), "{}", show(&out));
    assert!(
        out.stderr.contains("withheld") && out.stderr.contains("HTTPS only"),
        "{}",
        show(&out)
    );
    assert!(!out.stdout.contains("s3cret-pw"), "{}", show(&out));
    assert!(!out.stderr.contains("s3cret-pw"), "{}", show(&out));
}

#[test]
fn a_loopback_mirror_gets_the_way_that_works() {
    let origin = airlock_tests::Origin::start("host-mirror");
    let port = origin.port().to_string();
    let f = airlock_tests::Fixture::new_in(&base());
    let out = f.run(
        &["--allow", &format!("localhost:{port}")],
        &format!("curl -s -m 5 http://localhost:{port}/ || echo unreachable"),
    );
    assert!(out.stdout.contains("unreachable"), "{}", show(&out));
    let hint = format!(
        "--resolve host.test=127.0.0.1 --allow host.test:{port} --allow-private 127.0.0.1/32"
    );
    assert!(out.stderr.contains(&hint), "{}", show(&out));
    // With the host's network, localhost is the host's: no such note.
    let out = f.run(
        &["--network", "host", "--allow", &format!("localhost:{port}")],
        "true",
    );
    assert!(
        !out.stderr.contains("--resolve host.test"),
        "{}",
        show(&out)
    );
    // What it says works: the host's loopback server, through the proxy.
    let args: Vec<String> = hint.split(' ').map(str::to_string).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = f.run(
        &args,
        &format!("curl -s -m 5 http://host.test:{port}/simple/"),
    );
    assert!(
        out.stdout.contains("host-mirror GET /simple/"),
        "{}",
        show(&out)
    );
}

#[test]
fn learn_mode_ends_with_the_trust_step_when_one_is_needed() {
    let f = airlock_tests::Fixture::new_in(&base());
    let inside = f.ws.join("proposal.toml");
    let out = f.run(&["--learn", inside.to_str().unwrap()], "true");
    assert_eq!(out.code, 0, "{}", show(&out));
    let trust = format!("airlock policy trust {}", inside.display());
    assert!(out.stderr.contains(&trust), "{}", show(&out));
    // Following it works: trust, then -p.
    let ok = run(airlock(&f.home)
        .current_dir(&f.ws)
        .args(["policy", "trust"])
        .arg(&inside));
    assert_eq!(ok.code, 0, "{}", show(&ok));
    let out = f.run(&["-p", inside.to_str().unwrap()], "echo applied");
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(out.stdout.contains("applied"), "{}", show(&out));
    // Outside every writable root, no trust step is needed or named.
    let outside = f.home.join("proposal.toml");
    let out = f.run(&["--learn", outside.to_str().unwrap()], "true");
    assert!(!out.stderr.contains("policy trust"), "{}", show(&out));
    assert!(
        out.stderr
            .contains(&format!("use it with -p {}", outside.display())),
        "{}",
        show(&out)
    );
    let out = f.run(&["-p", outside.to_str().unwrap()], "echo applied");
    assert!(out.stdout.contains("applied"), "{}", show(&out));
}

#[test]
fn a_repository_the_user_asked_for_is_one_calm_line() {
    if std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: git is not installed");
        return;
    }
    let f = airlock_tests::Fixture::new_in(&base());
    let out = f.run(
        &["--network", "none"],
        "git init -q made && git -C made -c user.name=a -c user.email=a@b commit -q --allow-empty -m one && git clone -q made copy && echo done",
    );
    assert!(out.stdout.contains("done"), "{}", show(&out));
    assert!(!out.stderr.contains("protected path"), "{}", show(&out));
    for repo in ["made", "copy"] {
        let line = format!("new git repository {}", f.ws.join(repo).display());
        assert_eq!(out.stderr.matches(&line).count(), 1, "{}", show(&out));
        // Intact and usable on the host.
        let log = std::process::Command::new("git")
            .args(["log", "--format=%s"])
            .current_dir(f.ws.join(repo))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&log.stdout).trim(), "one", "{repo}");
    }
    assert!(out.stderr.contains("intact and usable"), "{}", show(&out));
    // What would run a program is still set aside, and loudly.
    let marker = f.home.join("PWNED");
    let out = f.run(
        &["--network", "none"],
        &format!(
            "git init -q evil && printf '#!/bin/sh\\ntouch {}\\n' > evil/.git/hooks/pre-commit && chmod +x evil/.git/hooks/pre-commit && git -C evil config core.fsmonitor 'touch {}'",
            marker.display(),
            marker.display()
        ),
    );
    assert!(
        out.stderr.contains("changed a protected path"),
        "{}",
        show(&out)
    );
    assert!(
        out.stderr.contains("core.fsmonitor") && out.stderr.contains("hooks/pre-commit"),
        "{}",
        show(&out)
    );
    assert!(!f.ws.join("evil/.git/hooks/pre-commit").exists());
    let _ = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ])
        .current_dir(f.ws.join("evil"))
        .output();
    let _ = std::process::Command::new("git")
        .arg("status")
        .current_dir(f.ws.join("evil"))
        .output();
    assert!(
        !marker.exists(),
        "a planted hook or fsmonitor ran on the host"
    );
}

#[test]
fn an_empty_git_marker_in_airlocks_own_cache_is_not_reported() {
    let f = airlock_tests::Fixture::new_in(&base());
    let cache = f
        .home
        .join(".cache/airlock/projects/ws-0123456789abcdef/uv");
    fs::create_dir_all(&cache).unwrap();
    let c = cache.to_str().unwrap();
    let out = f.run(
        &["--network", "none", "--write", c],
        &format!(": > {c}/.git"),
    );
    assert_eq!(out.code, 0, "{}", show(&out));
    assert!(!out.stderr.contains(".git"), "{}", show(&out));
    assert!(cache.join(".git").is_file());
    // One that says where a git directory is, is still acted on.
    let out = f.run(
        &["--network", "none", "--write", c],
        &format!("mkdir -p {c}/sub && echo 'gitdir: /x' > {c}/sub/.git"),
    );
    assert!(out.stderr.contains("protected path"), "{}", show(&out));
    assert!(!cache.join("sub/.git").exists());
}

/// Run from the host's /tmp itself, the workspace would be /tmp, which the
/// sandbox replaces with a private one: what the command wrote vanished,
/// exit 0 (harness round 11). Refused, and said how to go on; a directory
/// of its own under /tmp works.
#[test]
fn the_hosts_tmp_itself_is_refused_as_a_workspace() {
    let f = airlock_tests::Fixture::new_in(&base());
    let mut c = f.command(&["--network", "none"], "echo made > made-in-tmp; echo ran");
    c.current_dir("/tmp");
    let out = run(&mut c);
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(!out.stdout.contains("ran"), "{}", show(&out));
    assert!(
        out.stderr.contains("mkdir -p /tmp/work && cd /tmp/work"),
        "{}",
        show(&out)
    );
    let own = tempfile::tempdir_in("/tmp").unwrap();
    let mut c = f.command(&["--network", "none"], "echo made > made-in-tmp; echo ran");
    c.current_dir(own.path());
    let out = run(&mut c);
    assert_eq!(out.code, 0, "{}", show(&out));
    assert_eq!(
        std::fs::read_to_string(own.path().join("made-in-tmp")).unwrap(),
        "made\n"
    );
}
