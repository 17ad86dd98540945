//! The exit report (SPEC §7): a short block on stderr when anything was
//! blocked, and `--report FILE` as JSON, so an agent harness can ask for
//! escalation instead of retrying blindly.

use std::path::Path;

use airlock_proxy::{Approval, Blocked};
use anyhow::{Context, Result};
use serde::Serialize;

#[derive(Serialize)]
pub struct Report<'a> {
    pub exit_code: i32,
    pub tier: &'a str,
    pub duration_ms: u64,
    pub blocked: &'a [Blocked],
    pub approvals: &'a [Approval],
    pub protected_paths: ProtectedPaths<'a>,
    /// The run id, as in the audit log.
    pub run: &'a str,
    /// What the post-run check found and did (SPEC §4.5).
    pub protected_changes: &'a [crate::integrity::Outcome],
}

#[derive(Serialize)]
pub struct ProtectedPaths<'a> {
    pub deny_read: &'a [std::path::PathBuf],
    pub deny_write: &'a [std::path::PathBuf],
}

/// `airlock: blocked 2 connections: a:443 (not-allowlisted), ... To allow a host: ...`
pub fn stderr_block(blocked: &[Blocked]) -> Option<String> {
    if blocked.is_empty() {
        return None;
    }
    let total: u64 = blocked.iter().map(|b| b.count).sum();
    let list = blocked
        .iter()
        .map(|b| {
            let times = if b.count > 1 {
                format!(" x{}", b.count)
            } else {
                String::new()
            };
            format!("{}:{} ({}){times}", b.host, b.port, b.reason)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let noun = if total == 1 {
        "connection"
    } else {
        "connections"
    };
    Some(format!(
        "airlock: blocked {total} {noun}: {list}. To allow a host: --allow HOST or add it to [network].allow in airlock.toml."
    ))
}

pub fn write(path: &Path, report: &Report) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("encoding the report")?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("writing the report to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_names_each_host() {
        let b = |host: &str, port, reason: &str, count| Blocked {
            host: host.into(),
            port,
            reason: reason.into(),
            count,
            how_to_allow: String::new(),
        };
        assert_eq!(stderr_block(&[]), None);
        let text = stderr_block(&[
            b("evil.example", 443, "not-allowlisted", 1),
            b("169.254.169.254", 80, "private-address", 2),
        ])
        .unwrap();
        assert_eq!(
            text,
            "airlock: blocked 3 connections: evil.example:443 (not-allowlisted), 169.254.169.254:80 (private-address) x2. \
             To allow a host: --allow HOST or add it to [network].allow in airlock.toml."
        );
    }
}
