//! `airlock audit FILE... [--json]`: summarise audit logs (SPEC §2, §6).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};

pub fn run(files: &[PathBuf], json: bool, urls: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let summary = airlock_audit::summarise_files(files)
        .map_err(|(f, e)| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let secs = started.elapsed().as_secs_f64();
    tracing::info!(
        bytes,
        lines = summary.lines,
        seconds = secs,
        mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9),
        "audit logs read"
    );
    let out = if json {
        let mut s = serde_json::to_string_pretty(&summary).context("the summary")?;
        s.push('\n');
        s
    } else {
        airlock_audit::summary::render_text_with(&summary, urls)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()) {
        // `airlock audit log | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.context("writing the summary")?,
    }
    Ok(ExitCode::SUCCESS)
}
