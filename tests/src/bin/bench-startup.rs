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
    let mut refs: Vec<Vec<f64>> = vec![vec![]; bwrap_runs.len()];
    let (mut base, mut proxy, mut none) = (vec![], vec![], vec![]);
    // Each round runs the three in a new order: whichever runs right
    // after another one's exit pays for its teardown (measured: 0.5 ms).
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    for i in 0..n + 5 {
        let mut order: Vec<usize> = (0..3 + bwrap.as_ref().map_or(0, |_| refs.len())).collect();
        for k in (1..order.len()).rev() {
            // xorshift64: enough to vary the order, no dependency.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(k, (seed % (k as u64 + 1)) as usize);
        }
        let mut t = vec![0.0; order.len()];
        for which in order {
            t[which] = match which {
                0 => time(Command::new("unshare").args(["-Urn", "/bin/true"])),
                1 => time(&mut f.command_argv(&[], &["/bin/true"])),
                2 => time(&mut f.command_argv(&["--network", "none"], &["/bin/true"])),
                k => time(
                    Command::new(bwrap.as_ref().expect("bwrap"))
                        .arg("--unshare-all")
                        .args(bwrap_runs[k - 3].1)
                        .arg("/bin/true"),
                ),
            };
        }
        if i >= 5 {
            base.push(t[0]);
            proxy.push(t[1]);
            none.push(t[2]);
            for (r, v) in refs.iter_mut().zip(t.iter().skip(3)) {
                r.push(*v);
            }
        }
    }
    let (b, p, nn) = (median(base), median(proxy), median(none));
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
    if bwrap.is_some() {
        println!("  reference (not airlock):");
        for ((name, _), v) in bwrap_runs.iter().zip(refs) {
            let m = median(v);
            println!("  {name:<72} {m:.2} ms  ratio {:.2}x", m / b);
        }
    } else {
        println!("  (install bubblewrap for a reference sandbox in the same run)");
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
