//! Gathering policy from its places (SPEC §3.3): built-in defaults, the
//! user file, the project file, the command line and the managed file.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use airlock_policy::{
    flag_rule, load_str, parse_cidr, Diagnostic, Fragment, Host, Layer, Located, Origin,
    PatternList, Policy,
};
use anyhow::{bail, Context, Result};

use crate::cli::PolicyArgs;
use crate::probe::SystemProbe;

pub const DEFAULT_MANAGED: &str = "/etc/airlock/managed.toml";

/// `$XDG_CONFIG_HOME/airlock/policy.toml`.
pub fn user_policy_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("airlock/policy.toml"))
}

/// The managed policy's path, and whether it must exist (an explicit
/// `AIRLOCK_MANAGED_POLICY` that points nowhere is an error, not a pass).
pub fn managed_policy_path() -> (PathBuf, bool) {
    match std::env::var_os("AIRLOCK_MANAGED_POLICY").filter(|v| !v.is_empty()) {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from(DEFAULT_MANAGED), false),
    }
}

pub fn format_diagnostics(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Load one file; `Ok(None)` when it does not exist and need not.
pub fn load_file(
    path: &Path,
    layer: Layer,
    required: bool,
) -> Result<Option<Fragment>, Vec<Diagnostic>> {
    let shown = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, &shown, layer).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(None),
        Err(e) => Err(vec![Diagnostic {
            file: shown,
            line: 1,
            column: 1,
            message: format!("cannot read: {e}"),
        }]),
    }
}

pub fn workspace_dir(args: &PolicyArgs) -> Result<PathBuf> {
    let dir = match &args.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    std::fs::canonicalize(&dir)
        .with_context(|| format!("workspace {} does not exist", dir.display()))
}

fn loc<T>(value: T, flag: &str, text: &str) -> Located<T> {
    Located::new(
        value,
        Layer::CommandLine,
        Origin::Flag {
            flag: format!("{flag} {text}"),
        },
    )
}

/// The fragment made of command-line flags.
pub fn flags_fragment(args: &PolicyArgs) -> Result<Fragment> {
    let mut f = Fragment::empty(Layer::CommandLine, "command line");
    for (list, name, values) in [
        (PatternList::Allow, "--allow", &args.allow),
        (PatternList::Deny, "--deny", &args.deny),
        (PatternList::Inspect, "--inspect", &args.inspect),
    ] {
        for v in values {
            let rule = flag_rule(name, v, list).map_err(anyhow::Error::msg)?;
            match list {
                PatternList::Allow => f.allow.push(rule),
                PatternList::Deny => f.deny.push(rule),
                PatternList::Inspect => f.inspect.push(rule),
            }
        }
    }
    for r in &args.resolve {
        let (host, ip) = r
            .split_once('=')
            .with_context(|| format!("--resolve {r}: write HOST=IP"))?;
        let host = match Host::parse(host).with_context(|| format!("--resolve {r}"))? {
            h @ Host::Name(_) => h,
            Host::Ip(_) => bail!("--resolve {r}: {host} is already an address"),
        };
        let ip: IpAddr = ip
            .trim_matches(['[', ']'])
            .parse()
            .with_context(|| format!("--resolve {r}: {ip:?} is not an IP address"))?;
        f.resolve.push((host, loc(ip, "--resolve", r)));
    }
    for c in &args.allow_private {
        let net = parse_cidr(c).map_err(|e| anyhow::anyhow!("--allow-private {c}: {e}"))?;
        f.allow_private.push(loc(net, "--allow-private", c));
    }
    for p in &args.preset {
        if airlock_policy::preset::find(p).is_none() {
            bail!("--preset {p}: unknown preset; `airlock policy presets` lists them");
        }
        f.presets.push(loc(p.clone(), "--preset", p));
    }
    for ca in &args.upstream_ca {
        let s = ca.display().to_string();
        f.upstream_ca.push(loc(s.clone(), "--upstream-ca", &s));
    }
    if let Some(a) = &args.audit_log {
        let s = a.display().to_string();
        f.audit_log = Some(loc(s.clone(), "--audit-log", &s));
    }
    Ok(f)
}

/// Every fragment that applies to a run in `workspace`, lowest layer first.
pub fn gather(args: &PolicyArgs, workspace: &Path) -> Result<Vec<Fragment>> {
    let mut frags = vec![Fragment::built_in()];
    let mut errors = vec![];
    let mut push = |r: Result<Option<Fragment>, Vec<Diagnostic>>| match r {
        Ok(Some(f)) => frags.push(f),
        Ok(None) => {}
        Err(d) => errors.extend(d),
    };
    if let Some(user) = user_policy_path() {
        push(load_file(&user, Layer::User, false));
    }
    push(load_file(
        &workspace.join("airlock.toml"),
        Layer::Project,
        false,
    ));
    for p in &args.policy {
        push(load_file(p, Layer::CommandLine, true));
    }
    let (managed, required) = managed_policy_path();
    push(load_file(&managed, Layer::Managed, required));
    if !errors.is_empty() {
        bail!("invalid policy:\n{}", format_diagnostics(&errors));
    }
    frags.push(flags_fragment(args)?);
    Ok(frags)
}

/// Gather, merge and resolve presets.
pub fn build_policy(args: &PolicyArgs) -> Result<(Policy, PathBuf)> {
    let workspace = workspace_dir(args)?;
    let frags = gather(args, &workspace)?;
    let probe = SystemProbe {
        workspace: workspace.clone(),
    };
    let policy = Policy::build(frags, &probe);
    for c in &policy.conflicts {
        tracing::warn!("{c}");
    }
    Ok((policy, workspace))
}
