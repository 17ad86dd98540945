//! `airlock policy check | explain | presets`.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::{
    check_address, decide, how_to_allow, inspects, Fragment, Host, Layer, Policy, Target, PRESETS,
};
use anyhow::{Context, Result};

use crate::cli::PolicyArgs;
use crate::probe::SystemProbe;
use crate::sources::{build_policy, load_file, managed_policy_path};

/// Validate files; each problem is printed as `file:line:column: message`.
/// Files are also checked against the managed policy, which they cannot
/// loosen.
pub fn check(files: &[PathBuf]) -> Result<ExitCode> {
    let mut failed = false;
    let mut frags = vec![];
    for file in files {
        match load_file(file, Layer::Project, true) {
            Ok(Some(f)) => frags.push(f),
            Ok(None) => {}
            Err(diags) => {
                failed = true;
                for d in diags {
                    say!("{d}");
                }
            }
        }
    }
    let (managed_path, required) = managed_policy_path();
    let checking_managed = files
        .iter()
        .any(|f| std::fs::canonicalize(f).ok() == std::fs::canonicalize(&managed_path).ok());
    if !checking_managed {
        match load_file(&managed_path, Layer::Managed, required) {
            Ok(Some(m)) => frags.push(m),
            Ok(None) => {}
            Err(diags) => {
                failed = true;
                for d in diags {
                    say!("{d}");
                }
            }
        }
    }
    let mut all = vec![Fragment::built_in()];
    all.extend(frags);
    // Presets are not resolved here: checking a file must not run tools.
    let policy = Policy::build(all, &airlock_policy::preset::Offline);
    for c in &policy.conflicts {
        failed = true;
        say!("{c}");
    }
    if failed {
        Ok(ExitCode::from(1))
    } else {
        for f in files {
            say!("{}: ok", f.display());
        }
        Ok(ExitCode::SUCCESS)
    }
}

pub fn explain(args: &PolicyArgs, target: &str) -> Result<ExitCode> {
    let (policy, _) = build_policy(args)?;
    let target = match Target::parse(target, Some(443)) {
        Ok(t) => t,
        Err(e) => {
            say!("target:   {target}");
            say!("verdict:  deny");
            say!("reason:   invalid-host");
            say!("detail:   {e}");
            return Ok(ExitCode::SUCCESS);
        }
    };
    let d = decide(&policy, &target);
    say!("target:   {target}");
    say!("verdict:  {}", d.verdict.as_str());
    say!("reason:   {}", d.reason);
    match &d.rule {
        Some(r) => {
            say!("rule:     {}", r.value.text);
            say!("source:   {} ({} layer)", r.origin, r.layer.name());
        }
        None if d.verdict == airlock_policy::Verdict::Ask => {
            say!(
                "rule:     none matched; unknown = \"ask\" ({})",
                policy.unknown.origin
            );
        }
        None => say!(
            "rule:     none matched; unknown = \"deny\" ({})",
            policy.unknown.origin
        ),
    }
    if inspects(&policy, &target) {
        say!("inspect:  yes (TLS is decrypted and checked)");
    }
    if d.is_allow() {
        let pinned = match &target.host {
            Host::Ip(ip) => Some((*ip, "IP literal".to_string())),
            name => policy
                .resolve
                .get(name)
                .map(|ip| (ip.value, ip.origin.to_string())),
        };
        match pinned {
            Some((ip, from)) => {
                let nets: Vec<_> = policy.allow_private.iter().map(|n| n.value).collect();
                match check_address(ip, &nets, &[]) {
                    Ok(()) => say!("address:  {ip} ({from}): allowed"),
                    Err(why) => say!(
                        "address:  {ip} ({from}): refused, private-address ({why}); allow the range with --allow-private"
                    ),
                }
            }
            None => say!("address:  resolved by the proxy at connect time, then checked against private ranges"),
        }
    } else {
        say!("to allow: {}", how_to_allow(&target, d.reason));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn presets() -> Result<ExitCode> {
    let probe = SystemProbe {
        workspace: std::env::current_dir().context("cannot read the current directory")?,
    };
    for p in PRESETS {
        say!("{}: {}", p.name, p.summary);
        let r = p.resolve(&probe);
        for (host, from) in &r.hosts {
            say!("  allow {host:<40} from {from}");
        }
        for n in &r.notes {
            say!("  note: {n}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
