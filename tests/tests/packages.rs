//! Package managers through their presets (SPEC §3.4), end to end: real
//! clients (npm, pip) from a fresh HOME with empty caches install from
//! registries on 127.0.0.1 that speak their protocol over HTTPS and want a
//! credential. The credential lives in the user's configuration outside;
//! inside, it is nowhere (environment, files, /proc), and the proxy adds it.
//! Run as root and as an ordinary user.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use airlock_tests::registry::{sha1_hex, tarball, Registry};
use airlock_tests::tls::TestPki;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-packages"))
}

const TOKEN: &str = "npm-tok-5d2a71-never-inside";
const PASSWORD: &str = "pip-pw-93e0c4-never-inside";

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

fn have(argv: &[&str]) -> bool {
    Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Everything the sandbox could show of a secret: its environment, every
/// process's, and every readable file in HOME and the workspace.
const LOOK_FOR_SECRETS: &str = "echo '--- env'; env; echo '--- proc'; \
    cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; echo '--- files'; \
    grep -rs . ~ . 2>/dev/null | grep -v -e node_modules/ -e '/_cacache/' | head -2000; echo '--- end'";

fn run_as(
    who: Who,
    f: &Fixture,
    pki: &TestPki,
    extra: &[&str],
    envs: &[(&str, &str)],
    script: &str,
) -> Out {
    let ca = pki.ca_pem.to_str().unwrap().to_string();
    let mut args = vec![
        "--upstream-ca",
        &ca,
        "--resolve",
        "registry.test=127.0.0.1",
        "--allow-private",
        "127.0.0.0/8",
        "--ask",
        "deny",
    ];
    args.extend_from_slice(extra);
    let mut cmd = f.command(&args, script);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run(&mut who.wrap(cmd))
}

#[test]
fn npm_installs_from_a_private_registry_whose_token_stays_outside() {
    if !have(&["npm", "--version"]) {
        eprintln!("skipped: npm is not installed (.ci/run installs it)");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let tgz = Arc::new(tarball(
            &f.home,
            "package",
            &[
                (
                    "package.json",
                    "{\"name\":\"airlock-demo\",\"version\":\"1.0.0\",\"main\":\"index.js\"}",
                ),
                (
                    "index.js",
                    "module.exports = 'installed-through-airlock';\n",
                ),
            ],
        ));
        let sha1 = sha1_hex(&tgz);
        let port = Arc::new(std::sync::OnceLock::<u16>::new());
        let (p2, t2) = (port.clone(), tgz.clone());
        let reg = Registry::start(
            &pki,
            Arc::new(move |_m, path, auth| {
                if auth != Some(&format!("Bearer {TOKEN}")) {
                    return (401, "application/json", b"{\"error\":\"token\"}".to_vec());
                }
                let port = p2.get().copied().unwrap_or(0);
                match path {
                    "/airlock-demo" => {
                        let doc = format!(
                            "{{\"name\":\"airlock-demo\",\"dist-tags\":{{\"latest\":\"1.0.0\"}},\"versions\":{{\"1.0.0\":{{\"name\":\"airlock-demo\",\"version\":\"1.0.0\",\"main\":\"index.js\",\"dist\":{{\"tarball\":\"https://registry.test:{port}/airlock-demo/-/airlock-demo-1.0.0.tgz\",\"shasum\":\"{sha1}\"}}}}}}}}"
                        );
                        (200, "application/json", doc.into_bytes())
                    }
                    "/airlock-demo/-/airlock-demo-1.0.0.tgz" => {
                        (200, "application/octet-stream", t2.to_vec())
                    }
                    _ => (404, "application/json", b"{}".to_vec()),
                }
            }),
        );
        let _ = port.set(reg.port());
        let p = reg.port();
        f.write(
            "~/.npmrc",
            &format!("registry=https://registry.test:{p}/\n//registry.test:{p}/:_authToken={TOKEN}\nfund=false\n"),
        );
        f.write("package.json", "{\"name\":\"ws\",\"version\":\"0.0.0\"}");
        who.prepare(&f);
        let script = format!(
            "npm install airlock-demo --no-audit --no-fund --loglevel=error 2>&1 | tail -5; \
             echo result=$(node -p \"require('airlock-demo')\"); {LOOK_FOR_SECRETS}"
        );
        let out = run_as(who, &f, &pki, &["--preset", "npm"], &[], &script);
        assert!(
            out.stdout.contains("result=installed-through-airlock"),
            "{who:?}: npm did not install\n{}\nregistry saw {:?}",
            show(&out),
            reg.seen()
        );
        assert!(
            !out.stdout.contains(TOKEN) && !out.stderr.contains(TOKEN),
            "{who:?}: the token is visible inside\n{}",
            show(&out)
        );
        let seen = reg.seen();
        assert!(
            seen.iter()
                .any(|s| s.starts_with("GET /airlock-demo ")
                    && s.ends_with(&format!("Bearer {TOKEN}"))),
            "{who:?}: the proxy did not add the token: {seen:?}"
        );
        // The cache is airlock's own, created on the first run; the user's
        // configuration outside is untouched.
        assert!(project_cache(&f.home).join("npm").is_dir(), "{who:?}");
        assert!(
            !f.home.join(".npm").exists(),
            "{who:?}: the host's npm cache was written"
        );
        let npmrc = std::fs::read_to_string(f.home.join(".npmrc")).unwrap();
        assert!(
            npmrc.contains(TOKEN),
            "{who:?}: the user's .npmrc was changed"
        );
    }
}

/// A minimal wheel (zip), made with the host's python.
fn wheel(dir: &std::path::Path) -> Vec<u8> {
    let out = dir.join("airlock_demo-1.0-py3-none-any.whl");
    // Rust's line continuation would eat Python's indentation: one line each.
    let script = [
        "import sys, zipfile",
        "z = zipfile.ZipFile(sys.argv[1], 'w')",
        "z.writestr('airlock_demo/__init__.py', 'VALUE = \"installed-through-airlock\"\\n')",
        "z.writestr('airlock_demo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: airlock-demo\\nVersion: 1.0\\n')",
        "z.writestr('airlock_demo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')",
        "z.writestr('airlock_demo-1.0.dist-info/RECORD', '')",
        "z.close()",
    ]
    .join("\n");
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&out)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "building the test wheel failed");
    std::fs::read(&out).unwrap()
}

#[test]
fn pip_installs_from_an_index_whose_password_stays_outside() {
    if !have(&["/usr/bin/python3", "-m", "pip", "--version"]) {
        eprintln!("skipped: /usr/bin/python3 has no pip (.ci/run installs python3-pip)");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let whl = Arc::new(wheel(&f.home));
        let expect = format!("Basic {}", base64(&format!("me:{PASSWORD}")));
        let w2 = whl.clone();
        let reg = Registry::start(
            &pki,
            Arc::new(move |_m, path, auth| {
                if auth != Some(expect.as_str()) {
                    return (401, "text/plain", b"password needed".to_vec());
                }
                match path {
                    "/simple/airlock-demo/" => (
                        200,
                        "text/html",
                        b"<html><body><a href=\"/files/airlock_demo-1.0-py3-none-any.whl\">airlock_demo-1.0-py3-none-any.whl</a></body></html>".to_vec(),
                    ),
                    "/files/airlock_demo-1.0-py3-none-any.whl" => {
                        (200, "application/octet-stream", w2.to_vec())
                    }
                    _ => (404, "text/plain", b"not found".to_vec()),
                }
            }),
        );
        let p = reg.port();
        // The password is in the user's pip.conf, as pip documents it.
        f.write(
            "~/.config/pip/pip.conf",
            &format!("[global]\nindex-url = https://me:{PASSWORD}@registry.test:{p}/simple/\n"),
        );
        who.prepare(&f);
        let script = format!(
            "/usr/bin/python3 -m pip install --disable-pip-version-check --target ./pkgs airlock-demo 2>&1 | tail -5; \
             echo result=$(PYTHONPATH=./pkgs /usr/bin/python3 -c 'import airlock_demo; print(airlock_demo.VALUE)'); {LOOK_FOR_SECRETS}"
        );
        let out = run_as(who, &f, &pki, &["--preset", "pypi"], &[], &script);
        assert!(
            out.stdout.contains("result=installed-through-airlock"),
            "{who:?}: pip did not install\n{}\nregistry saw {:?}",
            show(&out),
            reg.seen()
        );
        assert!(
            !out.stdout.contains(PASSWORD) && !out.stderr.contains(PASSWORD),
            "{who:?}: the password is visible inside\n{}",
            show(&out)
        );
        assert!(project_cache(&f.home).join("pip").is_dir(), "{who:?}");
    }
}

fn base64(s: &str) -> String {
    let out = Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Mirror and CA variables reach the tool, without the password in them;
/// the rest of the environment is inherited; a secret-looking variable
/// passes only by its exact name, never by a `--pass-env` glob.
#[test]
fn mirror_variables_pass_without_secrets() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let mut cmd = f.command(
            &[
                "--preset",
                "npm",
                "--preset",
                "pypi",
                "--network",
                "none",
                "--pass-env",
                "MY_*",
                "--pass-env",
                "EXACT_TOKEN",
            ],
            "env",
        );
        cmd.env("NPM_CONFIG_REGISTRY", "https://npm-mirror.corp.test/")
            .env("PIP_INDEX_URL", "https://pypi.corp.test/simple")
            .env("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
            .env("MY_SETTING", "one")
            .env("MY_TOKEN", "glob-must-not-pass")
            .env("EXACT_TOKEN", "named-exactly")
            .env("UNRELATED", "no");
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        for want in [
            "NPM_CONFIG_REGISTRY=https://npm-mirror.corp.test/",
            "PIP_INDEX_URL=https://pypi.corp.test/simple",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
            "MY_SETTING=one",
            "EXACT_TOKEN=named-exactly",
            // Inherited (SPEC §4.3): only what looks like a secret stays out.
            "UNRELATED=no",
        ] {
            assert!(
                out.stdout.contains(want),
                "{who:?}: {want} missing\n{}",
                show(&out)
            );
        }
        assert!(
            !out.stdout.contains("glob-must-not-pass"),
            "{who:?}: MY_TOKEN passed\n{}",
            show(&out)
        );
        // A password in the URL stays outside; the URL passes without it.
        // (The credential turns inspection on, so SSL_CERT_FILE becomes
        // the bundle holding the same roots plus airlock's CA.)
        let mut cmd = f.command(&["--preset", "pypi", "--network", "none"], "env");
        cmd.env(
            "PIP_INDEX_URL",
            format!("https://me:{PASSWORD}@pypi.corp.test/simple"),
        );
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stdout
                .contains("PIP_INDEX_URL=https://pypi.corp.test/simple"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!out.stdout.contains(PASSWORD), "{who:?}: {}", show(&out));
    }
}

/// Without any preset, registry secrets in the user's package-manager
/// configuration still never enter the sandbox (red team 19 F5): npm's
/// and pip's files are replaced by copies without them (their other
/// settings still apply), cargo's credentials (its legacy `config` too),
/// pnpm's global rc and a `.yarnrc.yml` holding a token are hidden (red
/// team rounds 19 and 22). Files without a secret are untouched.
#[test]
fn registry_secrets_stay_outside_without_their_preset() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(
            "~/.npmrc",
            // npm's ini reads a quoted key as the key inside the quotes.
            &format!("\"//registry.test/:_authToken\"={TOKEN}\nfund=false\n"),
        );
        f.write(
            "~/.config/pip/pip.conf",
            &format!(
                "[global]\nindex-url = HTTPS://me:{PASSWORD}@pypi.corp.test/simple\ntimeout = 77\n"
            ),
        );
        // cargo's legacy config, and pnpm's global rc.
        f.write(
            "~/.cargo/config",
            &format!("[registries.corp]\ntoken = \"{TOKEN}-legacy\"\n"),
        );
        f.write(
            "~/.config/pnpm/rc",
            &format!("//registry.test/:_authToken={TOKEN}-pnpm\n"),
        );
        f.write(
            "~/.cargo/credentials.toml",
            &format!("[registries.corp]\ntoken = \"{TOKEN}-cargo\"\n"),
        );
        f.write("~/.cargo/config.toml", "[net]\nretry = 9\n");
        f.write(
            "~/.yarnrc.yml",
            &format!("npmAuthToken: \"{TOKEN}-yarn\"\n"),
        );
        who.prepare(&f);
        let script = format!(
            "{LOOK_FOR_SECRETS}; echo \"fund=$(npm config get fund 2>/dev/null)\"; \
             cat \"$PIP_CONFIG_FILE\"; cat ~/.cargo/config.toml"
        );
        let out = run(&mut who.wrap(f.command(&["--network", "none"], &script)));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        for never in [TOKEN, PASSWORD] {
            assert!(
                !out.stdout.contains(never),
                "{who:?}: a registry secret entered the sandbox\n{}",
                show(&out)
            );
        }
        if have(&["npm", "--version"]) {
            assert!(out.stdout.contains("fund=false"), "{who:?}: {}", show(&out));
        }
        assert!(
            out.stdout
                .contains("index-url = https://pypi.corp.test/simple")
                && out.stdout.contains("timeout = 77"),
            "{who:?}: pip's copy lost its settings\n{}",
            show(&out)
        );
        assert!(out.stdout.contains("retry = 9"), "{who:?}: {}", show(&out));
    }
}

/// A writable path the user names that does not exist is an error naming
/// it (not silently dropped); contradicting flags are errors too.
#[test]
fn missing_write_paths_and_contradicting_flags_are_errors() {
    let f = Fixture::new_in(&base());
    let missing = f.home.join("not-there");
    let out = f.run(
        &["--write", missing.to_str().unwrap(), "--network", "none"],
        "echo ran",
    );
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(
        out.stderr.contains("not-there") && !out.stdout.contains("ran"),
        "{}",
        show(&out)
    );
    f.write(
        "~/.config/airlock/policy.toml",
        "[filesystem]\nwrite = [\"~/new-dir\"]\n",
    );
    let out = f.run(&["--network", "none"], "echo ran");
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(
        out.stderr.contains("new-dir") && out.stderr.contains("policy.toml"),
        "{}",
        show(&out)
    );
    std::fs::remove_file(f.home.join(".config/airlock/policy.toml")).unwrap();
    for (args, words) in [
        (vec!["--read-only", "--write", "."], "--read-only"),
        (
            vec!["--network", "none", "--allow", "x.test"],
            "--network none",
        ),
        (
            vec!["--network", "host", "--inspect", "x.test"],
            "--network host",
        ),
    ] {
        let out = f.run(&args, "echo ran");
        assert_eq!(out.code, 125, "{args:?}: {}", show(&out));
        assert!(
            out.stderr.contains(words) && !out.stdout.contains("ran"),
            "{args:?}: {}",
            show(&out)
        );
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

const CARGO_TOKEN: &str = "cargo-tok-0b77e2-never-inside";

/// A cargo sparse registry (config.json with auth-required, the index
/// file, the download) whose token lives in the user's credentials.toml.
#[test]
fn cargo_fetches_from_a_sparse_registry_whose_token_stays_outside() {
    if !have(&["cargo", "--version"]) {
        eprintln!("skipped: cargo is not installed");
        return;
    }
    // rustup's toolchains live in the invoking user's home: the test uses
    // that toolchain, so it runs as that user only.
    let rustup_home = std::env::var("RUSTUP_HOME")
        .unwrap_or_else(|_| format!("{}/.rustup", std::env::var("HOME").unwrap_or_default()));
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
    let krate = Arc::new(tarball(
        &f.home,
        "airlock-demo-1.0.0",
        &[
            (
                "Cargo.toml",
                "[package]\nname = \"airlock-demo\"\nversion = \"1.0.0\"\nedition = \"2021\"\n",
            ),
            (
                "src/lib.rs",
                "pub const VALUE: &str = \"installed-through-airlock\";\n",
            ),
        ],
    ));
    let cksum = sha256_hex(&krate);
    let port = Arc::new(std::sync::OnceLock::<u16>::new());
    let (p2, k2) = (port.clone(), krate.clone());
    let reg = Registry::start(
        &pki,
        Arc::new(move |_m, path, auth| {
            if auth != Some(CARGO_TOKEN) {
                return (401, "text/plain", b"token needed".to_vec());
            }
            let port = p2.get().copied().unwrap_or(0);
            match path {
                "/index/config.json" => (
                    200,
                    "application/json",
                    format!("{{\"dl\":\"https://registry.test:{port}/dl/{{crate}}/{{version}}/download\",\"api\":\"https://registry.test:{port}\",\"auth-required\":true}}").into_bytes(),
                ),
                "/index/ai/rl/airlock-demo" => (
                    200,
                    "application/json",
                    format!("{{\"name\":\"airlock-demo\",\"vers\":\"1.0.0\",\"deps\":[],\"cksum\":\"{cksum}\",\"features\":{{}},\"yanked\":false}}\n").into_bytes(),
                ),
                "/dl/airlock-demo/1.0.0/download" => (200, "application/octet-stream", k2.to_vec()),
                _ => (404, "text/plain", b"not found".to_vec()),
            }
        }),
    );
    let _ = port.set(reg.port());
    let p = reg.port();
    f.write(
        "~/.cargo/credentials.toml",
        &format!("[registries.corp]\ntoken = \"{CARGO_TOKEN}\"\n"),
    );
    f.write(
        "Cargo.toml",
        "[package]\nname = \"ws\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nairlock-demo = { version = \"1\", registry = \"corp\" }\n",
    );
    f.write("src/lib.rs", "pub use airlock_demo::VALUE;\n");
    let script = format!(
        "cargo fetch 2>&1 | tail -5; ls $CARGO_HOME/registry/src/*/ 2>&1; {LOOK_FOR_SECRETS}"
    );
    let out = run_as(
        Who::Me,
        &f,
        &pki,
        &[
            "--preset",
            "cargo",
            "--pass-env",
            "RUSTUP_HOME",
            "--pass-env",
            "RUSTUP_TOOLCHAIN",
        ],
        &[
            (
                "CARGO_REGISTRIES_CORP_INDEX",
                &format!("sparse+https://registry.test:{p}/index/"),
            ),
            ("RUSTUP_HOME", &rustup_home),
        ],
        &script,
    );
    assert!(
        out.stdout.contains("airlock-demo-1.0.0"),
        "cargo did not fetch\n{}\nregistry saw {:?}",
        show(&out),
        reg.seen()
    );
    assert!(
        !out.stdout.contains(CARGO_TOKEN) && !out.stderr.contains(CARGO_TOKEN),
        "the token is visible inside\n{}",
        show(&out)
    );
    // The sandbox's cargo home is airlock's own; the user's is untouched.
    assert!(project_cache(&f.home).join("cargo/registry").is_dir());
    assert!(!f.home.join(".cargo/registry").exists());
}

/// An empty machine: no cargo configuration, no cache. The preset learns
/// cargo's default registry from where cargo tries to connect inside the
/// network-less probe sandbox (whose proxy refuses everything), never from
/// a list in airlock.
#[test]
fn cargo_on_an_empty_machine_learns_its_registry_by_observing() {
    if !have(&["cargo", "--version"]) {
        eprintln!("skipped: cargo is not installed");
        return;
    }
    let rustup_home = std::env::var("RUSTUP_HOME")
        .unwrap_or_else(|_| format!("{}/.rustup", std::env::var("HOME").unwrap_or_default()));
    let f = Fixture::new_in(&base());
    let mut cmd = airlock(&f.home);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &f.home)
        .env("RUSTUP_HOME", &rustup_home)
        .env(
            "AIRLOCK_MANAGED_POLICY",
            f.home.join("no-managed-policy.toml"),
        )
        .current_dir(&f.ws)
        .args(["policy", "presets", "--json"]);
    let out = run(&mut cmd);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("presets --json");
    let cargo = v
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "cargo")
        .unwrap();
    let hosts = cargo["hosts"].as_array().unwrap();
    assert!(
        !hosts.is_empty()
            && hosts
                .iter()
                .all(|h| h["from"].as_str().unwrap().contains("probe sandbox")),
        "{}",
        show(&out)
    );
    // The probe left nothing behind in the user's home.
    assert!(!f.home.join(".cargo").exists());
}

/// A public-style registry (no token): no inspection, so npm verifies the
/// registry's own certificate through the CA variable the preset passes.
#[test]
fn npm_without_inspection_trusts_the_ca_the_user_configured() {
    if !have(&["npm", "--version"]) {
        eprintln!("skipped: npm is not installed (.ci/run installs it)");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let tgz = Arc::new(tarball(
            &f.home,
            "package",
            &[
                (
                    "package.json",
                    "{\"name\":\"airlock-demo\",\"version\":\"1.0.0\"}",
                ),
                (
                    "index.js",
                    "module.exports = 'installed-without-inspection';\n",
                ),
            ],
        ));
        let sha1 = sha1_hex(&tgz);
        let port = Arc::new(std::sync::OnceLock::<u16>::new());
        let (p2, t2) = (port.clone(), tgz.clone());
        let reg = Registry::start(
            &pki,
            Arc::new(move |_m, path, _auth| {
                let port = p2.get().copied().unwrap_or(0);
                match path {
                    "/airlock-demo" => (
                        200,
                        "application/json",
                        format!(
                            "{{\"name\":\"airlock-demo\",\"dist-tags\":{{\"latest\":\"1.0.0\"}},\"versions\":{{\"1.0.0\":{{\"name\":\"airlock-demo\",\"version\":\"1.0.0\",\"dist\":{{\"tarball\":\"https://registry.test:{port}/airlock-demo/-/airlock-demo-1.0.0.tgz\",\"shasum\":\"{sha1}\"}}}}}}}}"
                        )
                        .into_bytes(),
                    ),
                    "/airlock-demo/-/airlock-demo-1.0.0.tgz" => {
                        (200, "application/octet-stream", t2.to_vec())
                    }
                    _ => (404, "application/json", b"{}".to_vec()),
                }
            }),
        );
        let _ = port.set(reg.port());
        f.write("package.json", "{\"name\":\"ws\",\"version\":\"0.0.0\"}");
        who.prepare(&f);
        let registry = format!("https://registry.test:{}/", reg.port());
        let ca = pki.ca_pem.display().to_string();
        let out = run_as(
            who,
            &f,
            &pki,
            &["--preset", "npm"],
            &[
                ("NPM_CONFIG_REGISTRY", &registry),
                ("NPM_CONFIG_CAFILE", &ca),
                ("NODE_EXTRA_CA_CERTS", &ca),
            ],
            "npm install airlock-demo --no-audit --no-fund --loglevel=error 2>&1 | tail -5; \
             echo result=$(node -p \"require('airlock-demo')\"); echo ca=$NPM_CONFIG_CAFILE node=$NODE_EXTRA_CA_CERTS",
        );
        assert!(
            out.stdout.contains("result=installed-without-inspection"),
            "{who:?}: npm did not install\n{}",
            show(&out)
        );
        // Not inspected: the variable is the user's, not airlock's bundle.
        assert!(
            out.stdout.contains(&format!("ca={ca}")),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!f
            .home
            .join(".local/share/airlock/ca")
            .join("ca-key.pem")
            .exists());
    }
}

const GO_PASSWORD: &str = "go-pw-41c9aa-never-inside";

/// A module zip as the Go proxy protocol serves it: every file under
/// `module@version/`, made with the host's python.
fn module_zip(dir: &std::path::Path, prefix: &str, files: &[(&str, &str)]) -> Vec<u8> {
    let out = dir.join("module.zip");
    let mut script = vec![
        "import sys, zipfile".to_string(),
        "z = zipfile.ZipFile(sys.argv[1], 'w')".to_string(),
    ];
    for (name, text) in files {
        script.push(format!(
            "z.writestr({:?}, {:?})",
            format!("{prefix}/{name}"),
            text
        ));
    }
    script.push("z.close()".into());
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", &script.join("\n")])
        .arg(&out)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "building the module zip failed");
    std::fs::read(&out).unwrap()
}

/// A Go module proxy that wants a password, named in GOPROXY as
/// `user:password@`: the variable passes without it, the proxy adds it.
#[test]
fn go_downloads_from_a_module_proxy_whose_password_stays_outside() {
    if !have(&["go", "version"]) || !have(&["/usr/bin/python3", "--version"]) {
        eprintln!("skipped: go is not installed (.ci/run installs golang-go)");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let module = "example.test/airlock-demo";
        let zip = Arc::new(module_zip(
            &f.home,
            &format!("{module}@v1.0.0"),
            &[
                ("go.mod", &format!("module {module}\n\ngo 1.19\n")),
                (
                    "demo.go",
                    "package demo\n\nconst Value = \"installed-through-airlock\"\n",
                ),
            ],
        ));
        let expect = format!("Basic {}", base64(&format!("me:{GO_PASSWORD}")));
        let z2 = zip.clone();
        let reg = Registry::start(
            &pki,
            Arc::new(move |_m, path, auth| {
                if auth != Some(expect.as_str()) {
                    return (401, "text/plain", b"password needed".to_vec());
                }
                let base = format!("/{module}/@v/");
                let Some(rest) = path.strip_prefix(&base) else {
                    return (404, "text/plain", b"not found".to_vec());
                };
                match rest {
                    "list" => (200, "text/plain", b"v1.0.0\n".to_vec()),
                    "v1.0.0.info" => (
                        200,
                        "application/json",
                        b"{\"Version\":\"v1.0.0\",\"Time\":\"2024-01-01T00:00:00Z\"}".to_vec(),
                    ),
                    "v1.0.0.mod" => (
                        200,
                        "text/plain",
                        format!("module {module}\n\ngo 1.19\n").into_bytes(),
                    ),
                    "v1.0.0.zip" => (200, "application/zip", z2.to_vec()),
                    _ => (404, "text/plain", b"not found".to_vec()),
                }
            }),
        );
        f.write(
            "go.mod",
            &format!("module ws\n\ngo 1.19\n\nrequire {module} v1.0.0\n"),
        );
        f.write(
            "main.go",
            &format!("package main\n\nimport (\n\t\"fmt\"\n\tdemo \"{module}\"\n)\n\nfunc main() {{ fmt.Println(\"result=\" + demo.Value) }}\n"),
        );
        who.prepare(&f);
        let goproxy = format!("https://me:{GO_PASSWORD}@registry.test:{}/", reg.port());
        let script = format!(
            "go mod download {module} 2>&1 | tail -5; go run . 2>&1 | tail -5; {LOOK_FOR_SECRETS}"
        );
        let out = run_as(
            who,
            &f,
            &pki,
            &["--preset", "go"],
            &[
                ("GOPROXY", &goproxy),
                ("GOSUMDB", "off"),
                ("GOFLAGS", "-mod=mod"),
            ],
            &script,
        );
        assert!(
            out.stdout.contains("result=installed-through-airlock"),
            "{who:?}: go did not download\n{}\nregistry saw {:?}",
            show(&out),
            reg.seen()
        );
        assert!(
            !out.stdout.contains(GO_PASSWORD) && !out.stderr.contains(GO_PASSWORD),
            "{who:?}: the password is visible inside\n{}",
            show(&out)
        );
        assert!(project_cache(&f.home).join("go/mod").is_dir(), "{who:?}");
    }
}

/// `--preset git`: the hosts of the workspace's HTTPS remotes, once
/// `.git/config` is trusted; the CA variable git reads passes in. A
/// smart-HTTP host on 127.0.0.1 (tests/fixtures/git_https.py).
#[test]
fn git_fetches_from_the_remote_its_config_names_once_trusted() {
    if !have(&["git", "--version"]) || !have(&["python3", "--version"]) {
        eprintln!("skipped: git and python3 are needed");
        return;
    }
    let f = Fixture::new_in(&base());
    let pki = TestPki::new(&f.home.join("pki"), &["git.test"]);
    let root = f.home.join("git-root");
    let src = root.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let git = |args: &[&str], dir: &std::path::Path| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("HOME", &f.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"], &src);
    std::fs::write(src.join("README"), "fetched through airlock\n").unwrap();
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
    let port_file = f.home.join("git.port");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/git_https.py");
    let mut server = Command::new("python3")
        .arg(&fixture)
        .arg(&pki.cert_pem)
        .arg(&pki.key_pem)
        .arg(&root)
        .arg(&port_file)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p.trim().to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "git server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    git(&["init", "-q", "-b", "main"], &f.ws);
    git(
        &[
            "remote",
            "add",
            "origin",
            &format!("https://git.test:{port}/repo.git"),
        ],
        &f.ws,
    );
    let ca = pki.ca_pem.display().to_string();
    let args = [
        "--preset",
        "git",
        "--resolve",
        "git.test=127.0.0.1",
        "--allow-private",
        "127.0.0.0/8",
        "--ask",
        "deny",
    ];
    let script = "git fetch -q origin && git show origin/main:README";
    let fetch = || {
        let mut cmd = f.command(&args, script);
        cmd.env("GIT_SSL_CAINFO", &ca)
            .env("GIT_CONFIG_NOSYSTEM", "1");
        run(&mut cmd)
    };
    // Untrusted project configuration widens nothing: the run stops.
    let out = fetch();
    assert_eq!(out.code, 125, "{}", show(&out));
    assert!(
        out.stderr.contains(&format!("git.test:{port}")),
        "{}",
        show(&out)
    );
    let mut trust = airlock(&f.home);
    trust
        .current_dir(&f.ws)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["policy", "trust"]);
    let t = run(&mut trust);
    assert_eq!(t.code, 0, "{}", show(&t));
    let out = fetch();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.stdout.contains("fetched through airlock"),
        "{}",
        show(&out)
    );
}
