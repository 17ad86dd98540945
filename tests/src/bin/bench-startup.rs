//! Sandbox start-up cost (issue #4): `airlock run -- /bin/true` against
//! `unshare -Urn /bin/true`, interleaved in one run, medians compared.
//!
//!     cargo build --release --workspace && ./target/release/bench-startup

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

fn main() {
    const N: usize = 60;
    let f = Fixture::new_in(&std::env::temp_dir().join("airlock-bench"));
    let (mut base, mut proxy, mut none) = (vec![], vec![], vec![]);
    for i in 0..N + 5 {
        let b = time(Command::new("unshare").args(["-Urn", "/bin/true"]));
        let p = time(&mut f.command_argv(&[], &["/bin/true"]));
        let n = time(&mut f.command_argv(&["--network", "none"], &["/bin/true"]));
        if i >= 5 {
            base.push(b);
            proxy.push(p);
            none.push(n);
        }
    }
    let (b, p, n) = (median(base), median(proxy), median(none));
    println!("sandbox start-up, median of {N} interleaved runs:");
    println!("  unshare -Urn /bin/true:                 {b:.2} ms");
    println!("  airlock run -- /bin/true (proxy):       {p:.2} ms  ratio {:.2}x (target <= 3x, stretch 2x)", p / b);
    println!(
        "  airlock run --network none -- /bin/true: {n:.2} ms  ratio {:.2}x",
        n / b
    );
}
