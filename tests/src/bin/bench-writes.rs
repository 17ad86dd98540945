//! What watching writes for the report costs (SPEC §7, issue #27): every
//! call that means to write is stopped for a look by the supervisor
//! (`linux/fsrefusals.rs`). Write-heavy work under `airlock run`, with the
//! look and without it (`AIRLOCK_BENCH_NO_WRITE_NOTES`, a measuring switch:
//! the boundary is the same), in interleaved rounds, against no sandbox:
//! unpacking 5,000 files (what `npm install` does to node_modules) and
//! `cargo build` of a small crate with no dependencies.
//!
//!     scripts/build-release.sh && ./target/release/bench-writes [ROUNDS]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use airlock_tests::Fixture;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time(mut c: Command) -> f64 {
    let t = Instant::now();
    let st = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(st.success(), "{c:?} failed");
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let fx = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    // A tarball of 5,000 small files in 250 directories.
    let src = fx.ws.join("tree");
    for d in 0..250 {
        let dir = src.join(format!("pkg{d}/lib"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            std::fs::write(
                dir.join(format!("f{f}.js")),
                format!("module.exports = {f};\n"),
            )
            .unwrap();
        }
    }
    let st = Command::new("tar")
        .args(["-cf", "tree.tar", "tree"])
        .current_dir(&fx.ws)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_dir_all(&src).unwrap();
    // A crate with no dependencies: cargo writes its target directory.
    let cargo = which("cargo");
    if cargo.is_some() {
        std::fs::create_dir_all(fx.ws.join("krate/src")).unwrap();
        std::fs::write(
            fx.ws.join("krate/Cargo.toml"),
            "[package]\nname = \"krate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        )
        .unwrap();
        let body: String = (0..200)
            .map(|i| format!("pub fn f{i}(x: u64) -> u64 {{ x.wrapping_mul({i}) }}\n"))
            .collect();
        std::fs::write(fx.ws.join("krate/src/lib.rs"), body).unwrap();
    }
    let untar = "rm -rf out && mkdir out && tar -xf tree.tar -C out";
    let build = "cd krate && rm -rf target && cargo build -q --offline";
    let mut jobs = vec![("unpack 5,000 files", untar)];
    if cargo.is_some() {
        jobs.push(("cargo build (no dependencies)", build));
    }
    // rustup finds its toolchains through these, not the fixture's HOME.
    let home = std::env::var("HOME").unwrap_or_default();
    let toolchain: Vec<(String, String)> = [
        ("RUSTUP_HOME", format!("{home}/.rustup")),
        ("CARGO_HOME", format!("{home}/.cargo")),
    ]
    .into_iter()
    .map(|(k, d)| (k.to_string(), std::env::var(k).unwrap_or(d)))
    .collect();
    for (name, script) in jobs {
        let (mut bare, mut on, mut off) = (vec![], vec![], vec![]);
        for _ in 0..rounds {
            let mut c = Command::new("sh");
            c.args(["-c", script]).current_dir(&fx.ws);
            for (k, v) in fx.command_argv(&[], &["x"]).get_envs() {
                if let (Some(k), Some(v)) = (k.to_str(), v) {
                    if k == "HOME" || k == "PATH" {
                        c.env(k, v);
                    }
                }
            }
            c.envs(toolchain.iter().cloned());
            bare.push(time(c));
            let mut c = fx.command(&[], script);
            c.envs(toolchain.iter().cloned());
            on.push(time(c));
            let mut c = fx.command(&[], script);
            c.envs(toolchain.iter().cloned())
                .env("AIRLOCK_BENCH_NO_WRITE_NOTES", "1");
            off.push(time(c));
        }
        let (b, n, f) = (median(bare), median(on), median(off));
        println!("{name}, median of {rounds} interleaved rounds:");
        println!("  no sandbox:                      {b:8.1} ms");
        println!(
            "  airlock run, writes not watched: {f:8.1} ms  {:.2}x no sandbox",
            f / b
        );
        println!(
            "  airlock run, writes watched:     {n:8.1} ms  {:.2}x no sandbox, {:.3}x unwatched",
            n / b,
            n / f
        );
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p: &std::path::PathBuf| Path::new(p).is_file())
}
