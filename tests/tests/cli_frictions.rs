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
