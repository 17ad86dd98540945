//! `npm install` of one package from a local HTTPS registry, directly and
//! through `airlock run --preset npm`, each from a fresh HOME and empty
//! cache, median of several runs (issue 13's ≤ 1.1× target). Two registry
//! shapes: public (no token: a CONNECT tunnel, no inspection) and private
//! (a token in ~/.npmrc: hidden inside, added by the inspecting proxy).
//!
//!     scripts/build-release.sh && ./target/release/bench-install [RUNS]

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_tests::registry::{sha1_hex, tarball, Registry};
use airlock_tests::tls::TestPki;
use airlock_tests::Fixture;

const TOKEN: &str = "bench-token";

/// `host` is how clients name it: inside the sandbox NO_PROXY sends
/// 127.0.0.1 around the proxy, so the sandbox uses a name (--resolve).
fn registry(pki: &TestPki, dir: &std::path::Path, token: bool, host: &'static str) -> Registry {
    let tgz = Arc::new(tarball(
        dir,
        "package",
        &[
            (
                "package.json",
                "{\"name\":\"bench-demo\",\"version\":\"1.0.0\"}",
            ),
            ("index.js", "module.exports = 1;\n"),
        ],
    ));
    let sha1 = sha1_hex(&tgz);
    let port = Arc::new(std::sync::OnceLock::<u16>::new());
    let p2 = port.clone();
    let reg = Registry::start(
        pki,
        Arc::new(move |_m, path, auth| {
            if token && auth != Some(&format!("Bearer {TOKEN}")) {
                return (401, "application/json", b"{}".to_vec());
            }
            let port = p2.get().copied().unwrap_or(0);
            match path {
                "/bench-demo" => (
                    200,
                    "application/json",
                    format!("{{\"name\":\"bench-demo\",\"dist-tags\":{{\"latest\":\"1.0.0\"}},\"versions\":{{\"1.0.0\":{{\"name\":\"bench-demo\",\"version\":\"1.0.0\",\"dist\":{{\"tarball\":\"https://{host}:{port}/bench-demo/-/bench-demo-1.0.0.tgz\",\"shasum\":\"{sha1}\"}}}}}}}}").into_bytes(),
                ),
                "/bench-demo/-/bench-demo-1.0.0.tgz" => (200, "application/octet-stream", tgz.to_vec()),
                _ => (404, "application/json", b"{}".to_vec()),
            }
        }),
    );
    let _ = port.set(reg.port());
    reg
}

/// One install from a fresh HOME and workspace; its wall time.
fn install(
    base: &std::path::Path,
    pki: &TestPki,
    reg: &Registry,
    token: bool,
    airlock: bool,
) -> Duration {
    let f = Fixture::new_in(base);
    let host = if airlock {
        "registry.test"
    } else {
        "127.0.0.1"
    };
    let url = format!("https://{host}:{}/", reg.port());
    let mut npmrc = format!("registry={url}\n");
    if token {
        npmrc.push_str(&format!("//{host}:{}/:_authToken={TOKEN}\n", reg.port()));
    }
    f.write("~/.npmrc", &npmrc);
    f.write("package.json", "{\"name\":\"ws\",\"version\":\"0.0.0\"}");
    let npm = [
        "npm",
        "install",
        "bench-demo",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
    ];
    let ca = pki.ca_pem.display().to_string();
    let mut cmd = if airlock {
        let mut c = f.command_argv(
            &[
                "--preset",
                "npm",
                "--upstream-ca",
                &ca,
                "--resolve",
                "registry.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
            ],
            &npm,
        );
        // Without inspection npm verifies the registry itself.
        c.env("NPM_CONFIG_CAFILE", &ca);
        c
    } else {
        let mut c = Command::new(npm[0]);
        c.args(&npm[1..])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &f.home)
            .env("NPM_CONFIG_CAFILE", &ca)
            .current_dir(&f.ws);
        c
    };
    let start = Instant::now();
    let out = cmd.output().expect("run npm");
    let took = start.elapsed();
    assert!(
        out.status.success() && f.ws.join("node_modules/bench-demo/index.js").exists(),
        "install failed (airlock={airlock}, token={token}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let base = std::env::temp_dir().join("airlock-bench-install");
    // Outside /tmp: the sandbox has a private /tmp.
    let base = if base.starts_with("/tmp") {
        std::path::PathBuf::from("/var/tmp/airlock-bench-install")
    } else {
        base
    };
    std::fs::create_dir_all(&base).expect("base dir");
    let pki = TestPki::new(&base.join("pki"), &["registry.test", "127.0.0.1"]);
    println!("npm install of one package, fresh HOME and cache each run, median of {runs}");
    for token in [false, true] {
        let plain = registry(&pki, &base, token, "127.0.0.1");
        let named = registry(&pki, &base, token, "registry.test");
        // Alternate, so drift on a shared machine hits both sides alike.
        let (mut direct, mut through) = (vec![], vec![]);
        for _ in 0..runs {
            direct.push(install(&base, &pki, &plain, token, false));
            through.push(install(&base, &pki, &named, token, true));
        }
        let (d, t) = (median(direct), median(through));
        println!(
            "{:<34} direct {:>7.0} ms   airlock {:>7.0} ms   ratio {:.2}x",
            if token {
                "private (token added by the proxy)"
            } else {
                "public (tunnel, no inspection)"
            },
            d.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / d.as_secs_f64()
        );
    }
}
