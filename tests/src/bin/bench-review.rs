//! What holding changes for review costs (SPEC §4.8, issue #29), each
//! pair measured side by side in interleaved rounds (the order flips each
//! round), medians compared; no figure is asserted:
//!
//! 1. start-up: `airlock run -- /bin/true` against `airlock run --review
//!    -- /bin/true` (an overlay per writable root, the changeset made
//!    before and scanned after);
//! 2. an install: `npm install --offline` of 50 local package tarballs of
//!    100 files each (5,000 files into node_modules; no registry, no
//!    network), with and without `--review`, and with no sandbox; the
//!    review run's time includes scanning what it wrote;
//! 3. `airlock changes diff --stat`, `changes diff` and `changes apply` of
//!    a changeset of 10,000 created files (100 directories of 100).
//!
//!     scripts/build-release.sh && ./target/release/bench-review [ROUNDS] [startup|install|apply]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use airlock_tests::{airlock_bin, Fixture};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `c` to success; its wall time in ms and its stderr.
fn time(mut c: Command) -> (f64, String) {
    let t = Instant::now();
    let out = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{c:?} failed: {err}");
    (ms, err)
}

/// The id in `held for review as <id>:`.
fn held_id(stderr: &str) -> String {
    let at = stderr
        .find("held for review as ")
        .unwrap_or_else(|| panic!("nothing held: {stderr}"));
    stderr[at + 19..at + 27].to_string()
}

/// `airlock ARGS` on the host with the fixture's environment.
fn airlock(fx: &Fixture, args: &[&str]) -> Command {
    let mut c = Command::new(airlock_bin());
    c.env_clear().args(args).current_dir(&fx.ws);
    for (k, v) in fx.command_argv(&[], &["x"]).get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c
}

fn discard(fx: &Fixture, stderr: &str) {
    let id = held_id(stderr);
    time(airlock(fx, &["changes", "discard", &id]));
}

fn ratio_line(name: &str, ms: f64, base: f64, base_name: &str) {
    println!("  {name:<34} {ms:9.1} ms  {:.3}x {base_name}", ms / base);
}

fn startup(rounds: usize) {
    let fx = Fixture::new_in(&std::env::temp_dir().join("airlock-bench-review"));
    let (mut plain, mut review) = (vec![], vec![]);
    for r in 0..rounds + 1 {
        let mut pair = [false, true];
        if r % 2 == 1 {
            pair.reverse();
        }
        for held in pair {
            let args: &[&str] = if held { &["--review"] } else { &[] };
            let (ms, _) = time(fx.command_argv(args, &["/bin/true"]));
            // The first round warms the caches and is not counted.
            if r > 0 {
                if held { &mut review } else { &mut plain }.push(ms);
            }
        }
    }
    let (p, v) = (median(plain), median(review));
    println!("start-up, /bin/true in an empty workspace, median of {rounds} interleaved rounds:");
    println!("  {:<34} {p:9.1} ms", "airlock run");
    ratio_line("airlock run --review", v, p, "without --review");
}

fn install(rounds: usize) {
    let fx = Fixture::new_in(&std::env::temp_dir().join("airlock-bench-review"));
    // 50 packages of 100 files, packed as npm packs them (`package/`).
    let tb = fx.ws.join("tarballs");
    std::fs::create_dir_all(&tb).unwrap();
    let mut deps = vec![];
    for p in 0..50 {
        let src = fx.home.join("pack/package");
        for d in 0..5 {
            let dir = src.join(format!("lib{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..20 {
                std::fs::write(
                    dir.join(format!("f{f}.js")),
                    format!("module.exports = function f{f}(x) {{ return x * {p} + {d}; }};\n"),
                )
                .unwrap();
            }
        }
        std::fs::write(
            src.join("package.json"),
            format!("{{\"name\":\"pkg{p}\",\"version\":\"1.0.0\"}}"),
        )
        .unwrap();
        let st = Command::new("tar")
            .args(["-czf"])
            .arg(tb.join(format!("pkg{p}.tgz")))
            .args(["-C"])
            .arg(fx.home.join("pack"))
            .arg("package")
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_dir_all(fx.home.join("pack")).unwrap();
        deps.push(format!("\"pkg{p}\":\"file:tarballs/pkg{p}.tgz\""));
    }
    std::fs::write(
        fx.ws.join("package.json"),
        format!(
            "{{\"name\":\"app\",\"version\":\"1.0.0\",\"dependencies\":{{{}}}}}",
            deps.join(",")
        ),
    )
    .unwrap();
    // The cache in /tmp: private to the sandbox, outside every layer.
    // (node_modules is removed on the host before each run: one made
    // again the same under review would be no change at all.)
    let script = "rm -rf /tmp/bench-review-npm && \
                  npm_config_cache=/tmp/bench-review-npm npm install --offline --no-audit --no-fund \
                  --no-update-notifier --ignore-scripts --no-package-lock --loglevel=error && \
                  test -f node_modules/pkg49/lib4/f19.js && rm -rf /tmp/bench-review-npm";
    let (mut bare, mut plain, mut review) = (vec![], vec![], vec![]);
    for r in 0..rounds + 1 {
        let mut order = [0, 1, 2];
        if r % 2 == 1 {
            order.reverse();
        }
        for which in order {
            let _ = std::fs::remove_dir_all(fx.ws.join("node_modules"));
            let (ms, err) = match which {
                0 => {
                    let mut c = Command::new("sh");
                    c.args(["-c", script]).current_dir(&fx.ws);
                    for (k, v) in fx.command_argv(&[], &["x"]).get_envs() {
                        if let (Some(k), Some(v)) = (k.to_str(), v) {
                            if k == "HOME" || k == "PATH" {
                                c.env(k, v);
                            }
                        }
                    }
                    time(c)
                }
                1 => time(fx.command(&[], script)),
                _ => time(fx.command(&["--review"], script)),
            };
            if which == 2 {
                discard(&fx, &err);
            }
            if r > 0 {
                [&mut bare, &mut plain, &mut review][which].push(ms);
            }
        }
    }
    let _ = std::fs::remove_dir_all(fx.ws.join("node_modules"));
    let (b, p, v) = (median(bare), median(plain), median(review));
    println!(
        "npm install --offline, 50 local tarballs, 5,000 files, median of {rounds} interleaved rounds:"
    );
    println!("  {:<34} {b:9.1} ms", "no sandbox");
    ratio_line("airlock run", p, b, "no sandbox");
    ratio_line("airlock run --review", v, p, "without --review");
}

fn apply(rounds: usize) {
    let base = std::env::temp_dir().join("airlock-bench-review");
    let (mut stat, mut diff, mut apply, mut run, mut copy) =
        (vec![], vec![], vec![], vec![], vec![]);
    let make = "set -e; for d in $(seq 0 99); do mkdir d$d; for f in $(seq 0 99); do echo \"file $d/$f\" > d$d/f$f.txt; done; done";
    for _ in 0..rounds {
        let fx = Fixture::new_in(&base);
        // Unpacked from a tarball inside: the shell loop is not what is timed.
        let seed = Fixture::new_in(&base);
        let st = Command::new("sh")
            .args(["-c", make])
            .current_dir(&seed.ws)
            .status()
            .unwrap();
        assert!(st.success());
        let st = Command::new("tar")
            .arg("-cf")
            .arg(fx.ws.join("seed.tar"))
            .arg("-C")
            .arg(&seed.ws)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let (ms, err) = time(fx.command(&["--review"], "tar -xf seed.tar && rm seed.tar"));
        run.push(ms);
        let id = held_id(&err);
        assert!(err.contains("10000 created"), "{err}");
        let (ms, _) = time(airlock(&fx, &["changes", "diff", "--stat", &id]));
        stat.push(ms);
        let (ms, _) = time(airlock(&fx, &["changes", "diff", &id]));
        diff.push(ms);
        let (ms, _) = time(airlock(&fx, &["changes", "apply", &id]));
        apply.push(ms);
        // The disk's own floor: the same tree copied on the host.
        let mut c = Command::new("cp");
        c.arg("-a").arg(&seed.ws).arg(seed.home.join("copy"));
        copy.push(time(c).0);
        assert!(Path::new(&fx.ws.join("d99/f99.txt")).exists());
        assert!(!Path::new(&fx.ws.join("seed.tar")).exists());
    }
    println!("a changeset of 10,000 created files (100 directories of 100), median of {rounds}:");
    println!(
        "  {:<34} {:9.1} ms",
        "the review run (untar + scan)",
        median(run)
    );
    println!(
        "  {:<34} {:9.1} ms",
        "airlock changes diff --stat",
        median(stat)
    );
    println!("  {:<34} {:9.1} ms", "airlock changes diff", median(diff));
    println!("  {:<34} {:9.1} ms", "airlock changes apply", median(apply));
    println!(
        "  {:<34} {:9.1} ms",
        "reference: cp -a of the tree",
        median(copy)
    );
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    // A second argument runs one part: startup, install or apply.
    let only = std::env::args().nth(2).unwrap_or_default();
    let part = |name: &str| only.is_empty() || only == name;
    println!("airlock: {}", airlock_bin().display());
    if part("startup") {
        startup(rounds.max(11));
    }
    if part("install") {
        install(rounds);
    }
    if part("apply") {
        apply(rounds.min(5));
    }
}
