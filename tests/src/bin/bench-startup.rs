//! Sandbox start-up cost (issues #4, #11, #16): `airlock run -- /bin/true`
//! against `unshare -Urn /bin/true`, interleaved in one run (in a new
//! random order each round, both binaries read back from disk first),
//! medians compared; then where the time goes: the `-vv` phases of further runs,
//! placed on this program's clock (CLOCK_MONOTONIC) from the moment it
//! spawns airlock to the moment airlock has exited. Where bubblewrap is
//! installed, two `bwrap --unshare-all` runs join the rounds as a reference
//! sandbox (no Landlock, seccomp, proxy or policy).
//!
//!     scripts/build-release.sh && ./target/release/bench-startup [RUNS]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Instant;

use airlock_tests::Fixture;

fn time(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("spawn");
    assert!(status.success(), "{cmd:?} failed");
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn monotonic_ns() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// A `Duration` as `{:?}` prints it, in milliseconds.
fn debug_duration_ms(s: &str) -> Option<f64> {
    let s = s.trim_matches('"');
    for (unit, scale) in [("ms", 1.0), ("µs", 1e-3), ("ns", 1e-6), ("s", 1e3)] {
        if let Some(n) = s.strip_suffix(unit) {
            return n.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    let rest = &line[at..];
    let end = if let Some(quoted) = rest.strip_prefix('"') {
        quoted.find('"').map_or(rest.len(), |e| e + 2)
    } else {
        rest.find(' ').unwrap_or(rest.len())
    };
    Some(&rest[..end])
}

/// One `-vv` run: each phase's offset from the spawn, in milliseconds.
fn phases(f: &Fixture) -> Vec<(String, f64)> {
    let mut cmd = f.command_argv(&["-vv"], &["/bin/true"]);
    let t0 = monotonic_ns();
    let out = cmd.stdout(Stdio::null()).output().expect("spawn");
    let end = (monotonic_ns() - t0) / 1e6;
    let text = String::from_utf8_lossy(&out.stderr);
    let mut base = None;
    let mut got = vec![];
    for line in text.lines() {
        let Some((_, msg)) = line.split_once(" DEBUG ") else {
            continue;
        };
        if let Some(ns) = field(msg, "monotonic_ns").and_then(|n| n.parse::<f64>().ok()) {
            base = Some((ns - t0) / 1e6);
            got.push((
                "airlock started (exec, loader, arguments)".to_string(),
                (ns - t0) / 1e6,
            ));
            continue;
        }
        let Some(ms) = field(msg, "elapsed").and_then(debug_duration_ms) else {
            continue;
        };
        let name = match field(msg, "step") {
            Some(step) => format!("  sandbox: {}", step.trim_matches('"')),
            None => msg[..msg.find(" elapsed=").unwrap_or(msg.len())].to_string(),
        };
        // Only the phases measured from the start of the run.
        if matches!(
            name.as_str(),
            "protected set compared" | "nested repositories searched" | "changes acted on"
        ) || name.starts_with("host unix sockets")
            || name.starts_with("Landlock")
        {
            continue;
        }
        got.push((name, ms));
    }
    let base = base.unwrap_or(0.0);
    for (n, ms) in got.iter_mut() {
        if !n.starts_with("airlock started") {
            *ms += base;
        }
    }
    got.push(("airlock exited (seen by its parent)".to_string(), end));
    got
}

/// Drop `path` from the page cache and read it back, as after an install
/// or a reboot. A binary the linker (or `cp`) has just written can sit in
/// the page cache in small folios: on the 2-core VM the same bytes then
/// ran `run -- /bin/true` up to 0.75 ms slower than a copy read from disk.
fn from_disk(path: &std::path::Path) {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let Ok(mut f) = std::fs::File::open(path) else {
        return;
    };
    // SAFETY: advice on a descriptor we own; failure only leaves the cache as it is.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let _ = std::io::copy(&mut f.by_ref(), &mut std::io::sink());
}

/// `airlock ARGS` with the fixture's environment, in its workspace.
fn airlock_in(fx: &Fixture, args: &[&str]) -> Command {
    let model = fx.command_argv(&[], &["x"]);
    let mut c = Command::new(airlock_tests::airlock_bin());
    c.env_clear()
        .envs(model.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(&fx.ws)
        .args(args);
    c
}

/// `git init` with one commit, as an agent's repository has.
fn git_init(dir: &std::path::Path) {
    for args in [
        &["init", "-q"][..],
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
    ] {
        let st = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdout(Stdio::null())
            .status()
            .expect("git");
        assert!(st.success(), "git {args:?}");
    }
}

/// Where `name` is found on PATH.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    let f = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    for bin in [Some(airlock_tests::airlock_bin()), on_path("unshare")]
        .into_iter()
        .flatten()
    {
        from_disk(&bin);
    }
    // bubblewrap, where installed, as a reference sandbox: with no mounts
    // of its own, and with the fewest any sandbox needs (a read-only root,
    // its own /proc, a minimal /dev, a private /tmp); it does no Landlock,
    // seccomp, proxy or policy.
    let bwrap = on_path("bwrap");
    let bwrap_runs: [(&str, &[&str]); 2] = [
        (
            "bwrap --unshare-all --dev-bind / /",
            &["--dev-bind", "/", "/"],
        ),
        (
            "bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp",
            &[
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
            ],
        ),
    ];
    if let Some(b) = &bwrap {
        from_disk(b);
    }
    // Where agents work: an empty directory, a fresh git repository and a
    // repository with 20,000 directories; in each, one-shot runs and a
    // command in a session (SPEC §4.7), in the same interleaved rounds.
    let git_ws = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    git_init(&git_ws.ws);
    let big_ws = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    for i in 0..200 {
        for j in 0..100 {
            std::fs::create_dir_all(big_ws.ws.join(format!("d{i}/e{j}"))).expect("mkdir");
        }
    }
    git_init(&big_ws.ws);
    let places: [(&str, &Fixture); 3] = [
        ("empty directory", &f),
        ("fresh git repository", &git_ws),
        ("git repository, 20,000 directories", &big_ws),
    ];
    let mut sessions = vec![];
    for (k, (_, fx)) in places.iter().enumerate() {
        let name = format!("bench{}-{k}", std::process::id());
        let st = airlock_in(fx, &["session", "start", "--name", &name])
            .stdout(Stdio::null())
            .status()
            .expect("session start");
        assert!(st.success(), "session start failed");
        sessions.push(name);
    }
    // Columns: unshare, one-shot (proxy), one-shot --network none, the
    // bubblewrap references, then per place: one-shot, session command.
    // The bubblewrap columns are kept (empty) when it is not installed, so
    // that the places' columns sit at the same indices either way.
    let extra = bwrap.as_ref().map_or(0, |_| bwrap_runs.len());
    let cols = 3 + bwrap_runs.len() + 2 * places.len();
    let mut all: Vec<Vec<f64>> = vec![vec![]; cols];
    // Each round runs them in a new order: whichever runs right after
    // another one's exit pays for its teardown (measured: 0.5 ms).
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    for i in 0..n + 5 {
        let mut order: Vec<usize> = (0..cols)
            .filter(|c| *c < 3 + extra || *c >= 3 + bwrap_runs.len())
            .collect();
        for k in (1..order.len()).rev() {
            // xorshift64: enough to vary the order, no dependency.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(k, (seed % (k as u64 + 1)) as usize);
        }
        let mut t = vec![0.0; cols];
        for which in order {
            let at = 3 + bwrap_runs.len();
            t[which] = match which {
                0 => time(Command::new("unshare").args(["-Urn", "/bin/true"])),
                1 => time(&mut f.command_argv(&[], &["/bin/true"])),
                2 => time(&mut f.command_argv(&["--network", "none"], &["/bin/true"])),
                k if k < at => time(
                    Command::new(bwrap.as_ref().expect("bwrap"))
                        .arg("--unshare-all")
                        .args(bwrap_runs[k - 3].1)
                        .arg("/bin/true"),
                ),
                k => {
                    let p = (k - at) / 2;
                    let fx = places[p].1;
                    match (k - at) % 2 {
                        0 => time(&mut fx.command_argv(&[], &["/bin/true"])),
                        _ => {
                            time(&mut fx.command_argv(&["--session", &sessions[p]], &["/bin/true"]))
                        }
                    }
                }
            };
        }
        if i >= 5 {
            for (c, v) in t.iter().enumerate() {
                if *v > 0.0 {
                    all[c].push(*v);
                }
            }
        }
    }
    for (k, (_, fx)) in places.iter().enumerate() {
        let _ = airlock_in(fx, &["session", "end", &sessions[k]])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let m = |c: usize| median(all[c].clone());
    let (b, p, nn) = (m(0), m(1), m(2));
    println!("sandbox start-up, median of {n} interleaved runs:");
    println!("  unshare -Urn /bin/true:                  {b:.2} ms");
    println!(
        "  airlock run -- /bin/true (proxy):        {p:.2} ms  ratio {:.2}x (target <= 3x, stretch 2x)",
        p / b
    );
    println!(
        "  airlock run --network none -- /bin/true: {nn:.2} ms  ratio {:.2}x",
        nn / b
    );
    let minimal = bwrap.as_ref().map(|_| m(4));
    if bwrap.is_some() {
        println!("  reference (not airlock):");
        for (k, (name, _)) in bwrap_runs.iter().enumerate() {
            let v = m(3 + k);
            println!("  {name:<72} {v:.2} ms  ratio {:.2}x", v / b);
        }
    } else {
        println!("  (install bubblewrap for a reference sandbox in the same run)");
    }
    println!(
        "\nwhere agents work (same rounds); ratios against unshare -Urn{}:",
        if minimal.is_some() {
            " and bubblewrap-minimal"
        } else {
            ""
        }
    );
    let at = 3 + bwrap_runs.len();
    for (k, (place, _)) in places.iter().enumerate() {
        for (what, c) in [
            ("one-shot airlock run", at + 2 * k),
            ("command in a session", at + 2 * k + 1),
        ] {
            let v = m(c);
            let vs_bwrap = minimal.map_or(String::new(), |mm| {
                format!("  {:.2}x bwrap-minimal", v / mm)
            });
            println!(
                "  {place:<36} {what:<22} {v:7.2} ms  {:.2}x unshare{vs_bwrap}",
                v / b
            );
        }
    }

    // Where the time goes: medians of each phase's offset over `-vv` runs.
    let mut table: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let runs = (n / 2).max(5);
    for _ in 0..runs {
        for (name, ms) in phases(&f) {
            table.entry(name).or_default().push(ms);
        }
    }
    let mut rows: Vec<(f64, String)> = table
        .into_iter()
        .map(|(name, v)| (median(v), name))
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("\nphases of `airlock -vv run -- /bin/true`, median offset from the spawn over {runs} runs (-vv adds its own cost):");
    let mut last = 0.0;
    for (ms, name) in rows {
        println!("  {ms:7.2} ms  (+{:5.2})  {name}", ms - last);
        last = ms;
    }
}
