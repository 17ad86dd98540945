//! Throughput of the reader behind `airlock audit`:
//! `cargo run --release -p airlock-audit --no-default-features --example summarise -- LOG...`

use std::time::Instant;

fn main() {
    let files: Vec<std::path::PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let t = Instant::now();
    match airlock_audit::summarise_files(&files) {
        Ok(s) => {
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "{} lines ({} not events), {} runs, {:.1} MB in {:.2} s: {:.0} MB/s",
                s.lines,
                s.bad_lines,
                s.runs.len(),
                bytes as f64 / 1e6,
                secs,
                bytes as f64 / 1e6 / secs
            );
        }
        Err((f, e)) => {
            eprintln!("{}: {e}", f.display());
            std::process::exit(1);
        }
    }
}
