//! `airlock policy explain --path P` (SPEC §2, §3.3): whether the sandbox
//! may read or write a path, and the rule that decides. It asks the same
//! plan `run` builds, so what it says is what the mounts do.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_policy::{Located, Policy};
use anyhow::{Context, Result};

use crate::cli::PolicyArgs;
use crate::paths::{lexical, resolve_path};
use crate::plan::Plan;
use crate::policy::build_policy;

/// One answer: yes or no, and why.
struct Verdict {
    allowed: bool,
    rule: String,
}

fn yes(rule: String) -> Verdict {
    Verdict {
        allowed: true,
        rule,
    }
}

fn no(rule: String) -> Verdict {
    Verdict {
        allowed: false,
        rule,
    }
}

fn named(e: &Located<String>, what: &str) -> String {
    format!(
        "{what} {:?} ({}, {} layer)",
        e.value,
        e.origin,
        e.layer.name()
    )
}

pub fn explain_path(args: &PolicyArgs, raw: &Path, as_json: bool) -> Result<ExitCode> {
    let built = build_policy(
        args,
        &[],
        crate::policy::Named::NeedTrust,
        &crate::probe::Runner,
    )?;
    built.warn_untrusted();
    let (policy, workspace) = (&built.policy, &built.workspace);
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let path = real_path(&lexical(&cwd.join(raw)));
    let net = crate::plan::net_mode(policy, None).unwrap_or(crate::plan::Net::Proxy);
    let argv = vec!["<command>".to_string()];
    let plan = crate::plan::build(
        policy,
        &crate::plan::Options {
            argv: &argv,
            workspace,
            home: &home,
            extra_write: &[],
            read_only: false,
            net,
            allow_degraded: false,
            host_env: std::env::vars().collect(),
            cwd: None,
            macos: false,
        },
    );
    let ctx = Ctx {
        policy,
        plan: &plan,
        home: &home,
        workspace,
    };
    let read = ctx.read(&path);
    let write = if read.allowed {
        ctx.write(&path)
    } else {
        no("hidden from the sandbox (see read)".into())
    };
    let note = ctx.dotenv_note(&path);
    let word = |v: &Verdict| if v.allowed { "yes" } else { "no" };
    let shown = crate::text::shown(&path);
    if as_json {
        let mut doc = serde_json::json!({
            "path": shown,
            "read": read.allowed,
            "read_rule": read.rule,
            "write": write.allowed,
            "write_rule": write.rule,
        });
        if let Some(n) = &note {
            doc["note"] = serde_json::Value::String(n.clone());
        }
        say!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        say!("path:     {shown}");
        say!("read:     {}: {}", word(&read), read.rule);
        say!("write:    {}: {}", word(&write), write.rule);
        if let Some(n) = note {
            say!("note:     {n}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Links resolved as far as the path exists; the absent rest kept by name.
fn real_path(p: &Path) -> PathBuf {
    let mut rest = vec![];
    let mut at = p.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&at) {
            return rest.iter().rev().fold(c, |acc: PathBuf, n| acc.join(n));
        }
        match (at.file_name().map(|n| n.to_os_string()), at.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n);
                at = parent.to_path_buf();
            }
            _ => return p.to_path_buf(),
        }
    }
}

struct Ctx<'a> {
    policy: &'a Policy,
    plan: &'a Plan,
    home: &'a Path,
    workspace: &'a Path,
}

impl Ctx<'_> {
    /// An entry's path, as written and with links resolved.
    fn covers(&self, e: &Located<String>, path: &Path) -> bool {
        let Some(p) = resolve_path(&e.value, self.home, self.workspace) else {
            return false;
        };
        path.starts_with(&p) || path.starts_with(real_path(&p))
    }

    fn read(&self, path: &Path) -> Verdict {
        if let Some(e) = self.policy.deny_read.iter().find(|e| self.covers(e, path)) {
            return no(named(e, "deny_read"));
        }
        if airlock_ca::default_dir().is_some_and(|ca| path.starts_with(real_path(&ca))) {
            return no("airlock's CA directory never enters the sandbox".into());
        }
        if self
            .plan
            .deny_read_env
            .iter()
            .any(|e| *e == path || real_path(e) == path)
        {
            return no(crate::dotenv::RULE.into());
        }
        if path.starts_with("/tmp") && !self.plan.tmp_binds.iter().any(|b| path.starts_with(b)) {
            return no(
                "the sandbox's /tmp is private (a fresh tmpfs): the host's files there are not seen; \
                 --read or --write makes one visible"
                    .into(),
            );
        }
        match self.policy.read.iter().find(|e| self.covers(e, path)) {
            Some(e) => yes(named(e, "read")),
            None => no("no read entry covers it".into()),
        }
    }

    fn write(&self, path: &Path) -> Verdict {
        let root = self
            .policy
            .write
            .iter()
            .filter(|e| self.covers(e, path))
            .max_by_key(|e| {
                resolve_path(&e.value, self.home, self.workspace)
                    .map_or(0, |p| p.components().count())
            });
        let Some(root) = root else {
            return no("not inside a writable root".into());
        };
        if !self.plan.write.iter().any(|w| path.starts_with(w)) {
            return no(format!(
                "{} names a directory that does not exist, so nothing is writable there",
                named(root, "write")
            ));
        }
        if let Some(e) = self.policy.deny_write.iter().find(|e| self.covers(e, path)) {
            return no(named(e, "deny_write"));
        }
        if let Some(p) = self
            .plan
            .protected
            .iter()
            .find(|p| path.starts_with(p.path()))
        {
            return no(format!(
                "protected (SPEC §4.5): {} is obeyed or run by the host later; a change made inside \
                 is refused, or moved to .airlock/quarantine/ after the run",
                crate::text::shown(&p.path())
            ));
        }
        if self.plan.deny_write.iter().any(|d| path.starts_with(d)) {
            return no("airlock's own file, read-only inside".into());
        }
        yes(named(root, "write"))
    }

    /// Why a `.env`-like name is not hidden, when it is not.
    fn dotenv_note(&self, path: &Path) -> Option<String> {
        let hidden = self
            .plan
            .deny_read_env
            .iter()
            .any(|e| *e == path || real_path(e) == path);
        if !crate::dotenv::is_secret_path(path) || hidden {
            return None;
        }
        Some(format!(
            "a file named like this is hidden when a run finds it at start: a regular file in the \
             workspace or a writable root, at most {} directories deep, not inside {}; this one is not \
             (absent, a directory, or outside that search)",
            crate::dotenv::MAX_DEPTH,
            crate::dotenv::SKIP.join(", ")
        ))
    }
}
