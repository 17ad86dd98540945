//! The exit report (SPEC §7): a short block on stderr when anything was
//! blocked, and `--report FILE` as JSON, so an agent harness can ask for
//! escalation instead of retrying blindly. The file is opened (without
//! following links) before the sandbox starts and written at the end, so
//! an unwritable path is an error before the command runs.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use airlock_proxy::safe_file::{self, Mode};
use airlock_proxy::{Approval, Blocked};
use anyhow::{Context, Result};
use serde::Serialize;

#[derive(Serialize)]
pub struct Report<'a> {
    /// The run id, as in every audit line of this run.
    pub run: &'a str,
    pub exit_code: i32,
    pub tier: &'a str,
    /// What the tier that ran does not cover (the degraded tier's, SPEC §4.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual_risk: Option<&'a str>,
    pub duration_ms: u64,
    pub blocked: &'a [Blocked],
    pub approvals: &'a [Approval],
    pub protected_paths: ProtectedPaths<'a>,
    /// What the post-run check found and did (SPEC §4.5).
    pub protected_changes: &'a [crate::integrity::Outcome],
}

#[derive(Serialize)]
pub struct ProtectedPaths<'a> {
    pub deny_read: &'a [std::path::PathBuf],
    pub deny_write: &'a [std::path::PathBuf],
}

/// `airlock: blocked 2 connections: a:443 (not-allowlisted), ...` and the
/// advice for each reason (SPEC §7: the advice fits the reason).
pub fn stderr_block(blocked: &[Blocked]) -> Option<String> {
    if blocked.is_empty() {
        return None;
    }
    let total: u64 = blocked.iter().map(|b| b.count).sum();
    let name = |b: &Blocked| match b.port {
        Some(p) => format!("{}:{p}", b.host),
        None => b.host.clone(),
    };
    let list = blocked
        .iter()
        .map(|b| {
            let times = if b.count > 1 {
                format!(" x{}", b.count)
            } else {
                String::new()
            };
            format!("{} ({}){times}", name(b), b.reason)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let noun = if total == 1 {
        "connection"
    } else {
        "connections"
    };
    let generic = ["not-allowlisted", "approval-denied", "approval-timeout"];
    let mut advice = vec![];
    if blocked
        .iter()
        .any(|b| generic.contains(&b.reason.as_str()) && b.how_to_allow.starts_with("--allow"))
    {
        advice.push(
            "To allow a host: --allow HOST or add it to [network].allow in airlock.toml."
                .to_string(),
        );
    }
    for b in blocked {
        let covered = generic.contains(&b.reason.as_str()) && b.how_to_allow.starts_with("--allow");
        if !covered {
            advice.push(format!("{}: {}.", name(b), b.how_to_allow));
        }
    }
    advice.dedup();
    Some(format!(
        "airlock: blocked {total} {noun}: {list}. {}",
        advice.join(" ")
    ))
}

/// The report file, opened before the run.
pub struct ReportFile {
    file: File,
    path: PathBuf,
}

/// Open (create or empty) the report file now, refusing a link planted at
/// its name; the content is written by `write` at the end.
pub fn open(path: &Path) -> Result<ReportFile> {
    let file = safe_file::open(path, Mode::Replace, 0o644)
        .with_context(|| format!("--report {}", path.display()))?;
    Ok(ReportFile {
        file,
        path: path.to_path_buf(),
    })
}

/// A report file a client opened and passed over (`session end`).
pub fn from_fd(fd: std::os::fd::OwnedFd) -> ReportFile {
    ReportFile {
        file: File::from(fd),
        path: PathBuf::from("the report file"),
    }
}

pub fn write(out: ReportFile, report: &Report) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("encoding the report")?;
    let mut file = out.file;
    file.write_all((text + "\n").as_bytes())
        .with_context(|| format!("writing the report to {}", out.path.display()))
}

/// A report already in JSON (a session's command, `session end`).
pub fn write_value(out: ReportFile, report: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report).context("encoding the report")?;
    let mut file = out.file;
    file.write_all((text + "\n").as_bytes())
        .with_context(|| format!("writing the report to {}", out.path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(host: &str, port: Option<u16>, reason: &str, count: u64, how: &str) -> Blocked {
        Blocked {
            host: host.into(),
            port,
            reason: reason.into(),
            count,
            how_to_allow: how.into(),
        }
    }

    #[test]
    fn block_names_each_host() {
        assert_eq!(stderr_block(&[]), None);
        let text = stderr_block(&[
            b(
                "evil.example",
                Some(443),
                "not-allowlisted",
                1,
                "--allow evil.example or add",
            ),
            b(
                "169.254.169.254",
                Some(80),
                "private-address",
                2,
                "169.254.169.254 resolved to 169.254.169.254; allow the range",
            ),
        ])
        .unwrap();
        assert_eq!(
            text,
            "airlock: blocked 3 connections: evil.example:443 (not-allowlisted), 169.254.169.254:80 (private-address) x2. \
             To allow a host: --allow HOST or add it to [network].allow in airlock.toml. \
             169.254.169.254:80: 169.254.169.254 resolved to 169.254.169.254; allow the range."
        );
    }

    #[test]
    fn advice_fits_the_reason_and_unparsed_targets_have_no_port() {
        let text = stderr_block(&[
            b(
                "bank.example",
                Some(443),
                "managed-deny",
                1,
                "the managed policy denies bank.example; only its administrator can change that",
            ),
            b(
                "user@127.0.0.1:8080",
                None,
                "invalid-host",
                1,
                "fix the host name",
            ),
        ])
        .unwrap();
        assert!(!text.contains("--allow"), "{text}");
        assert!(text.contains("administrator"), "{text}");
        assert!(!text.contains(":0"), "{text}");
        assert!(
            text.contains("user@127.0.0.1:8080 (invalid-host)"),
            "{text}"
        );
    }
}
