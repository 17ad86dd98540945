//! What `run` says at start when the sandbox would otherwise fail in a way
//! that names nothing: a path argument under the host's private /tmp, an
//! allowed host on the host's loopback. And `--read PATH`, which brings a
//! host path in read-only.

use std::path::{Path, PathBuf};

use airlock_policy::Policy;
use anyhow::{bail, Result};

use crate::plan::Plan;

/// Directories the sandbox gets its own of; `--read` refuses them (they
/// hold the host's sockets, devices and processes) except /tmp, whose
/// parts can be bound back.
const HIDDEN: &[&str] = &["/run", "/var/run", "/dev", "/proc", "/sys"];

/// Make each `--read` path readable, read-only: a Landlock read root where
/// the policy's read roots do not cover it, and a read-only bind into the
/// private /tmp for a path under the host's /tmp. Fails closed: a path
/// that is absent, hidden by deny_read or under a hidden directory stops
/// the run before it starts.
pub fn apply_read(plan: &mut Plan, reads: &[PathBuf]) -> Result<()> {
    for given in reads {
        let shown = given.display();
        if !given.is_absolute() {
            bail!("--read {shown}: give an absolute path");
        }
        let path = match std::fs::canonicalize(given) {
            Ok(p) => p,
            Err(e) => bail!("--read {shown}: {e}"),
        };
        let under = |roots: &[PathBuf]| roots.iter().any(|r| path.starts_with(r));
        // deny_read wins over every grant, as in the policy itself (denied
        // paths below a bound one are covered after the bind is made).
        if under(&plan.deny_read) {
            bail!(
                "--read {shown}: it is (or holds) a path deny_read hides; --read does not uncover secrets"
            );
        }
        if HIDDEN.iter().any(|h| path.starts_with(h)) {
            bail!(
                "--read {shown}: {} is the sandbox's own inside (host sockets and devices stay outside); --read brings in files, not these",
                HIDDEN
                    .iter()
                    .find(|h| path.starts_with(h))
                    .copied()
                    .unwrap_or("/")
            );
        }
        if path.starts_with("/tmp") {
            if path == Path::new("/tmp") {
                bail!("--read /tmp: name the directory or file under /tmp you need (the whole host /tmp holds other programs' files)");
            }
            if !under(&plan.tmp_binds) && !under(&plan.tmp_read_binds) {
                plan.tmp_read_binds.push(path.clone());
            }
        }
        if !under(&plan.read) && !under(&plan.write) {
            plan.read.push(path);
        }
    }
    plan.tmp_read_binds.sort();
    plan.tmp_read_binds.dedup();
    Ok(())
}

/// Lines for stderr at run start.
pub fn at_start(plan: &Plan, policy: &Policy) -> Vec<String> {
    let mut out = tmp_arguments(plan);
    // With the host's network, localhost is the host's: nothing to say.
    if plan.net != crate::plan::Net::Host {
        out.extend(loopback_rules(policy));
    }
    out
}

/// Path arguments under the host's /tmp that the sandbox will not see.
fn tmp_arguments(plan: &Plan) -> Vec<String> {
    let mut out = vec![];
    let visible = |p: &Path| {
        plan.tmp_binds
            .iter()
            .chain(&plan.tmp_read_binds)
            .any(|r| p.starts_with(r))
    };
    for arg in &plan.argv {
        // `--file=/tmp/x` as well as `/tmp/x`.
        let text = arg.rsplit_once('=').map_or(arg.as_str(), |(_, v)| v);
        let p = Path::new(text);
        if !p.starts_with("/tmp") || p == Path::new("/tmp") {
            continue;
        }
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if !real.starts_with("/tmp") || visible(&real) {
            continue;
        }
        // Only what exists on the host: a path the command creates
        // inside its own /tmp is not a mistake.
        if std::fs::symlink_metadata(p).is_err() {
            continue;
        }
        let dir = if real.is_dir() {
            real.clone()
        } else {
            real.parent().map_or(real.clone(), Path::to_path_buf)
        };
        let dir = crate::text::shown(&dir);
        out.push(format!(
            "{} lies under the host's /tmp, which is private inside the sandbox: the command will not find it. \
             Add --read {dir} to let it read it, or --write {dir} to let it write there too",
            crate::text::escape(text)
        ));
    }
    out
}

/// Allowed hosts on the host's loopback: inside, localhost is the
/// sandbox's own (NO_PROXY sends clients there directly), so a mirror on
/// the host's 127.0.0.1 gets "connection refused" and nothing else says
/// why.
fn loopback_rules(policy: &Policy) -> Vec<String> {
    let mut out = vec![];
    for rule in &policy.allow {
        let text = &rule.value.text;
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, Some(p)),
            _ => (text.as_str(), None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            continue;
        }
        let port = port.unwrap_or("PORT");
        out.push(format!(
            "{text} ({}) is the host's loopback, but inside the sandbox localhost and 127.0.0.1 are the sandbox's own: \
             a server on the host's 127.0.0.1:{port} is not reachable there. Reach it by a name the proxy resolves instead: \
             point the tool at http://host.test:{port}/ and run with \
             --resolve host.test=127.0.0.1 --allow host.test:{port} --allow-private 127.0.0.1/32",
            rule.origin
        ));
    }
    out
}
