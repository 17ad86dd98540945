//! `airlock policy check | explain | presets` through the real binary.

use std::fs;

use airlock_tests::{airlock, run, Out};

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        // An empty managed policy, so that the host's /etc/airlock never leaks in.
        fs::write(dir.path().join("no-managed-policy.toml"), "").unwrap();
        Env { dir }
    }
    fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.dir.path().join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, text).unwrap();
        p
    }
    fn airlock(&self, args: &[&str]) -> Out {
        run(airlock(self.dir.path()).args(args))
    }
    fn explain(&self, extra: &[&str], target: &str) -> Out {
        let mut args = vec!["policy", "explain"];
        args.extend_from_slice(extra);
        args.push(target);
        let out = self.airlock(&args);
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        out
    }
}

fn field<'a>(out: &'a Out, name: &str) -> &'a str {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in {}", out.stdout))
}

const PROJECT: &str = r#"version = 1
[network]
allow = ["example.com", "*.example.com", "127.0.0.1", "git.example.com:22"]
deny = ["uploads.example.com"]
"#;

#[test]
fn apex_wildcard_and_lookalikes() {
    let env = Env::new();
    env.write("airlock.toml", PROJECT);
    let apex = env.explain(&[], "example.com");
    assert_eq!(field(&apex, "verdict"), "allow");
    assert_eq!(field(&apex, "rule"), "example.com");
    assert!(field(&apex, "source").ends_with("airlock.toml:3 (project layer)"));
    let sub = env.explain(&[], "a.b.example.com");
    assert_eq!(field(&sub, "rule"), "*.example.com");
    for lookalike in ["evil-example.com", "example.com.evil.net"] {
        let out = env.explain(&["--ask", "deny"], lookalike);
        assert_eq!(field(&out, "verdict"), "ask", "{lookalike}: {}", out.stdout);
    }
}

#[test]
fn uppercase_trailing_dot_and_ip_spellings() {
    let env = Env::new();
    env.write("airlock.toml", PROJECT);
    let out = env.explain(&[], "EXAMPLE.COM.");
    assert_eq!(field(&out, "target"), "example.com:443");
    assert_eq!(field(&out, "verdict"), "allow");
    for spelling in [
        "2130706433",
        "127.1",
        "0x7f.0.0.1",
        "[::ffff:127.0.0.1]:443",
    ] {
        let out = env.explain(&[], spelling);
        assert_eq!(field(&out, "target"), "127.0.0.1:443", "{spelling}");
        assert_eq!(field(&out, "verdict"), "allow", "{spelling}");
        assert_eq!(field(&out, "rule"), "127.0.0.1", "{spelling}");
    }
    let out = env.explain(&[], "127.0.0.2");
    assert_eq!(field(&out, "verdict"), "ask");
}

#[test]
fn port_rules_deny_over_allow_and_invalid_hosts() {
    let env = Env::new();
    env.write("airlock.toml", PROJECT);
    assert_eq!(
        field(&env.explain(&[], "git.example.com:22"), "rule"),
        "git.example.com:22"
    );
    let other_port = env.explain(&[], "example.com:8080");
    assert_eq!(field(&other_port, "verdict"), "deny");
    assert_eq!(field(&other_port, "reason"), "port-not-allowed");
    let denied = env.explain(&[], "uploads.example.com");
    assert_eq!(field(&denied, "verdict"), "deny");
    assert_eq!(field(&denied, "reason"), "denylisted");
    assert!(field(&denied, "source").ends_with("airlock.toml:4 (project layer)"));
    let flag = env.explain(&["--deny", "api.example.com"], "api.example.com");
    assert_eq!(field(&flag, "reason"), "denylisted");
    assert_eq!(
        field(&flag, "source"),
        "command line --deny api.example.com (command line layer)"
    );
    let bad = env.explain(&[], "a@b.example.com");
    assert_eq!(field(&bad, "reason"), "invalid-host");
}

#[test]
fn managed_deny_beats_user_allow() {
    let env = Env::new();
    let user = env.write(
        ".config/airlock/policy.toml",
        "[network]\nallow = [\"x.evil.test\"]\n",
    );
    let managed = env.write(
        "managed.toml",
        "# company policy\n[network]\ndeny = [\"*.evil.test\"]\n",
    );
    let mut cmd = airlock(env.dir.path());
    cmd.env("AIRLOCK_MANAGED_POLICY", &managed);
    let out = run(cmd.args(["policy", "explain", "x.evil.test"]));
    assert_eq!(field(&out, "verdict"), "deny");
    assert_eq!(field(&out, "reason"), "managed-deny");
    assert_eq!(
        field(&out, "source"),
        format!("{}:3 (managed layer)", managed.display())
    );
    // Without the managed policy the user allow stands.
    let out = env.explain(&[], "x.evil.test");
    assert_eq!(field(&out, "verdict"), "allow");
    // `check` reports the loosening attempt with the managed rule that wins.
    let mut cmd = airlock(env.dir.path());
    cmd.env("AIRLOCK_MANAGED_POLICY", &managed);
    let out = run(cmd.arg("policy").arg("check").arg(&user));
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!(
            "{}:2: allow \"x.evil.test\" is overridden by managed deny",
            user.display()
        )) && out.stdout.contains(&format!("{}:3", managed.display())),
        "{}",
        out.stdout
    );
}

#[test]
fn check_reports_file_line_column() {
    let env = Env::new();
    let cases = [
        (
            "glob.toml",
            "[network]\nallow = [\"ex*.com\"]\n",
            "glob.toml:2:10: network.allow: invalid host pattern \"ex*.com\"",
        ),
        (
            "star.toml",
            "[network]\nallow = [\"ok.test\", \"*\"]\n",
            "star.toml:2:21: network.allow: invalid host pattern \"*\"",
        ),
        (
            "table.toml",
            "[netwrok]\nallow = []\n",
            "table.toml:1:2: unknown field `netwrok`",
        ),
        (
            "type.toml",
            "[network]\nmax_tunnels = \"many\"\n",
            "type.toml:2:15: invalid type: string \"many\"",
        ),
    ];
    for (name, text, want) in cases {
        let path = env.write(name, text);
        let out = env.airlock(&["policy", "check", path.to_str().unwrap()]);
        assert_eq!(out.code, 1, "{name}: {}", out.stdout);
        let line = out.stdout.lines().next().unwrap_or("");
        assert!(
            line.starts_with(&format!("{}", env.dir.path().join(want).display())),
            "{name}: {line}"
        );
    }
    let good = env.write("good.toml", PROJECT);
    let out = env.airlock(&["policy", "check", good.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

#[test]
fn run_refuses_a_broken_policy_with_125() {
    let env = Env::new();
    env.write("airlock.toml", "[network]\nallow = [\"*.com\"]\n");
    let out = env.airlock(&["policy", "explain", "example.com"]);
    assert_eq!(out.code, 125);
    assert!(out.stderr.contains("airlock.toml:2:10"), "{}", out.stderr);
}

#[test]
fn presets_report_where_hosts_came_from() {
    let env = Env::new();
    env.write(".npmrc", "registry=https://npm.mirror.test:8443/\n");
    env.write(
        ".config/pip/pip.conf",
        "[global]\nindex-url = https://pypi.mirror.test/simple\n",
    );
    let mut cmd = airlock(env.dir.path());
    cmd.env("CARGO_HOME", env.dir.path().join("cargo")).env(
        "CARGO_REGISTRIES_CORP_INDEX",
        "sparse+https://cargo.mirror.test/index/",
    );
    let out = run(cmd.args(["policy", "presets"]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let npmrc = env.dir.path().join(".npmrc");
    assert!(
        out.stdout.contains("npm.mirror.test:8443")
            && out.stdout.contains(&format!("from {}:1", npmrc.display())),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("pypi.mirror.test"), "{}", out.stdout);
    assert!(
        out.stdout.contains("cargo.mirror.test")
            && out.stdout.contains("$CARGO_REGISTRIES_CORP_INDEX"),
        "{}",
        out.stdout
    );
    // And the preset feeds decisions.
    let mut cmd = airlock(env.dir.path());
    let out = run(cmd.args([
        "policy",
        "explain",
        "--preset",
        "npm",
        "npm.mirror.test:8443",
    ]));
    assert_eq!(field(&out, "verdict"), "allow", "{}", out.stdout);
    assert!(
        field(&out, "source").starts_with("preset npm ("),
        "{}",
        out.stdout
    );
}

#[test]
fn ca_init_show_export_and_path() {
    let env = Env::new();
    let path = env.airlock(&["ca", "path"]);
    assert_eq!(path.code, 0);
    let dir = std::path::PathBuf::from(path.stdout.trim());
    assert!(dir.ends_with("airlock/ca"), "{}", path.stdout);
    let show = env.airlock(&["ca", "show"]);
    assert_eq!(show.code, 125, "no CA yet: {}", show.stdout);
    let init = env.airlock(&["ca", "init"]);
    assert_eq!(init.code, 0, "{}", init.stderr);
    assert!(init.stdout.contains("sha256:"), "{}", init.stdout);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(dir.join("ca-key.pem"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let again = env.airlock(&["ca", "init"]);
    assert_eq!(again.code, 125, "a second init must not overwrite the CA");
    let show = env.airlock(&["ca", "show"]);
    assert!(
        show.stdout.contains("not after:") && show.stdout.contains("airlock local CA"),
        "{}",
        show.stdout
    );
    let out = env.dir.path().join("exported.pem");
    let export = env.airlock(&["ca", "export", "--out", out.to_str().unwrap()]);
    assert_eq!(export.code, 0);
    assert_eq!(
        fs::read_to_string(&out).unwrap(),
        fs::read_to_string(dir.join("ca.pem")).unwrap()
    );
    fs::set_permissions(dir.join("ca-key.pem"), fs::Permissions::from_mode(0o644)).unwrap();
    let loose = env.airlock(&["ca", "show"]);
    assert_eq!(loose.code, 125);
    assert!(
        loose.stderr.contains("readable by others"),
        "{}",
        loose.stderr
    );
}

#[test]
fn doctor_reports_the_tier() {
    let env = Env::new();
    let out = env.airlock(&["doctor", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(
        v["tier"].is_string() && v["landlock_abi"].is_number(),
        "{v}"
    );
    let text = env.airlock(&["doctor"]);
    assert!(text.stdout.contains("tier for `run`:"), "{}", text.stdout);
}

#[test]
fn profile_linux_lists_mounts_landlock_and_seccomp() {
    let env = Env::new();
    env.write(
        "airlock.toml",
        "[filesystem]\ndeny_read = [\"secrets/**\"]\n",
    );
    let out = env.airlock(&["policy", "profile", "--target", "linux"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for want in [
        "[mounts]",
        "hide      ",
        "/secrets",
        "[landlock]",
        "[seccomp]",
        "EPERM  ptrace",
        "ENOSYS clone3",
    ] {
        assert!(out.stdout.contains(want), "{want} missing:\n{}", out.stdout);
    }
}

#[test]
fn profile_macos_prints_a_complete_seatbelt_profile() {
    let env = Env::new();
    let out = env.airlock(&[
        "policy",
        "profile",
        "--target",
        "macos",
        "--allow",
        "example.com",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for want in [
        "(version 1)",
        "(deny default)",
        "(deny file-read*",
        "(allow network-outbound (remote tcp \"localhost:3128\"))",
        ";; -D parameters:",
    ] {
        assert!(out.stdout.contains(want), "{want} missing:\n{}", out.stdout);
    }
}
