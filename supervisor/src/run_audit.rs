//! The audit log's `run` line (SPEC §6): what ran, where, as whom, in which
//! tier, under which policy files (with their content hashes), so a line
//! from a shared log can be traced to its run without anything else.

use std::path::{Path, PathBuf};

use airlock_audit::schema::{PolicyFile, Run, User};
use std::sync::Arc;

use airlock_audit::otlp::Otlp;
use airlock_audit::AuditLog;
use anyhow::Context;

use crate::cli::RunArgs;

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every policy file that applies to a run in `workspace`, in the order
/// `policy::gather` reads them, with its layer and hash. Files that do
/// not exist are left out, as they are from the policy.
pub fn policy_files(args: &RunArgs, workspace: &Path) -> Vec<PolicyFile> {
    let mut files: Vec<(&str, PathBuf)> = vec![];
    if let Some(user) = crate::places::user_policy_path() {
        files.push(("user", user));
    }
    files.push(("project", workspace.join("airlock.toml")));
    for p in &args.policy.policy {
        files.push(("command-line", p.clone()));
    }
    if let Ok((managed, _)) = crate::places::managed_policy_path() {
        files.push(("managed", managed));
    }
    files
        .into_iter()
        .filter_map(|(layer, path)| {
            let bytes = std::fs::read(&path).ok()?;
            Some(PolicyFile {
                path: path.display().to_string(),
                layer: layer.into(),
                sha256: sha256_hex(&bytes),
            })
        })
        .collect()
}

fn user() -> User {
    // SAFETY: getuid has no preconditions; getpwuid's result is copied
    // out before anything else could call it.
    let uid = unsafe { libc::getuid() };
    let name = unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() || (*pw).pw_name.is_null() {
            None
        } else {
            Some(
                std::ffi::CStr::from_ptr((*pw).pw_name)
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    };
    User { uid, name }
}

/// The audit log of `policy` (opened without following links) with the
/// OTLP exporter attached when `[audit] otlp` / `--otlp` names one.
pub fn open(
    policy: &airlock_policy::Policy,
    run: &str,
) -> anyhow::Result<(Option<AuditLog>, Option<Arc<Otlp>>)> {
    let mut audit = match &policy.audit_log {
        Some(path) => {
            crate::policy::trust::output_path(Path::new(&path.value), "the audit log")?;
            // A start-up file a shell or tool runs: what the log holds
            // (paths and hosts the sandbox chose) would run there (red
            // team round 15).
            if let Some(home) = std::env::var_os("HOME").map(std::path::PathBuf::from) {
                let p = crate::paths::lexical(
                    &std::env::current_dir()
                        .unwrap_or_default()
                        .join(&path.value),
                );
                if let Ok(rel) = p.strip_prefix(&home) {
                    if crate::plan::protected::HOME_SURFACE
                        .iter()
                        .any(|s| rel.starts_with(s))
                    {
                        anyhow::bail!(
                            "the audit log {} is a file host tools run or obey; name another file",
                            crate::text::shown(&p)
                        );
                    }
                }
            }
            Some(AuditLog::open(Path::new(&path.value), run)?)
        }
        None => None,
    };
    let otlp = match &policy.audit_otlp {
        Some(endpoint) => {
            // AIRLOCK_OTLP_QUEUE: records held while the collector is slow.
            let queue = std::env::var("AIRLOCK_OTLP_QUEUE")
                .ok()
                .and_then(|q| q.parse().ok())
                .unwrap_or(airlock_audit::otlp::QUEUE);
            let o = Otlp::start(&endpoint.value, queue)
                .with_context(|| format!("[audit] otlp ({})", endpoint.origin))?;
            audit = Some(
                audit
                    .unwrap_or_else(|| AuditLog::sinks_only(run))
                    .with_sink(o.clone()),
            );
            Some(o)
        }
        None => None,
    };
    Ok((audit, otlp))
}

/// Write the `run` line: the first of the run, before any connection.
pub fn begin(audit: &AuditLog, args: &RunArgs, workspace: &Path, tier: &str) {
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .ok();
    audit.begin(Run {
        version: env!("CARGO_PKG_VERSION").into(),
        command: args.command.clone(),
        cwd,
        workspace: workspace.display().to_string(),
        user: user(),
        tier: tier.into(),
        policies: policy_files(args, workspace),
        learn: args.learn.is_some(),
    });
}

/// A short id that tells one run's audit lines from another's.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:016x}", nanos ^ (u64::from(std::process::id()) << 40))
}
#[cfg(test)]
mod tests {
    #[test]
    fn sha256_is_hex_of_the_content() {
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
