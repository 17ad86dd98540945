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
/// loosen; with `managed`, they are checked as managed policies. Rules and
/// credentials that can never apply are warned about (SPEC §5.3).
pub fn check(files: &[PathBuf], managed: bool) -> Result<ExitCode> {
    let mut failed = false;
    let mut frags = vec![];
    let layer = if managed {
        Layer::Managed
    } else {
        Layer::Project
    };
    for file in files {
        match load_file(file, layer, true) {
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
    let checking_managed = managed
        || files
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
    for w in never_apply(&policy) {
        say!("warning: {w}");
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

/// Request rules and credentials that can never apply: no allow rule
/// covers their host and port, or (for HTTPS) the host is not inspected.
pub fn never_apply(policy: &Policy) -> Vec<String> {
    let mut out = vec![];
    let allowed = |p: &airlock_policy::Pattern| policy.allow.iter().any(|a| a.value.overlaps(p));
    let inspected = |p: &airlock_policy::Pattern| {
        policy.inspect.iter().any(|i| i.value.overlaps(p))
            || policy.credentials.iter().any(|c| c.host.overlaps(p))
    };
    let asks = policy.asks();
    for r in &policy.request_rules {
        let at = &r.origin.origin;
        if !allowed(&r.host) {
            out.push(format!(
                "{at}: the request rule for {:?} can never apply: no allow rule covers that host and port{}",
                r.host.text,
                if asks { " (only an approval would)" } else { "" }
            ));
        } else if !inspected(&r.host) {
            out.push(format!(
                "{at}: the request rule for {:?} applies to plain http:// only: the host is not inspected, so its HTTPS requests cannot be read (add it to [network].inspect)",
                r.host.text
            ));
        }
    }
    for c in &policy.credentials {
        if !allowed(&c.host) {
            out.push(format!(
                "{}: the credential for {:?} can never be sent: no allow rule covers that host and port{}",
                c.origin.origin,
                c.host.text,
                if asks { " (only an approval would)" } else { "" }
            ));
        }
    }
    out
}

pub fn explain(args: &PolicyArgs, target: &str) -> Result<ExitCode> {
    let built = build_policy(args, &[], crate::sources::Named::NeedTrust)?;
    built.warn_untrusted();
    let policy = built.policy;
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
    let workspace = std::env::current_dir().context("cannot read the current directory")?;
    let trust = crate::trust::Trust::new(vec![workspace.clone()]);
    let probe = SystemProbe {
        workspace,
        trust: &trust,
    };
    for p in PRESETS {
        say!("{}: {}", p.name, p.summary);
        let r = p.resolve(&probe);
        for (host, from) in &r.hosts {
            say!("  allow {host:<40} from {from}");
        }
        for (path, from) in &r.writes {
            say!("  write {path:<40} from {from}");
        }
        for (name, _, from) in &r.env {
            // Names only: a value is the host's, shown by `env` already.
            say!("  env   {name:<40} from {from}");
        }
        for (path, why) in &r.hide {
            say!("  hide  {path:<40} {why}");
        }
        for c in &r.credentials {
            say!(
                "  credential {} on {:<29} from {}",
                c.header,
                c.host,
                c.from
            );
        }
        for n in &r.notes {
            say!("  note: {n}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `airlock policy profile --target linux|macos`.
pub fn profile(args: &PolicyArgs, target: &str) -> Result<ExitCode> {
    let built = build_policy(args, &[], crate::sources::Named::NeedTrust)?;
    built.warn_untrusted();
    let (policy, workspace) = (built.policy, built.workspace);
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    let net = crate::plan::net_mode(&policy, None).map_err(anyhow::Error::msg)?;
    let argv = vec!["<command>".to_string()];
    let plan = crate::plan::build(
        &policy,
        &crate::plan::Options {
            argv: &argv,
            workspace: &workspace,
            home: &home,
            extra_write: &[],
            read_only: false,
            net,
            allow_degraded: false,
            host_env: std::env::vars().collect(),
        },
    );
    match target {
        "linux" => {
            say!(
                "# airlock sandbox profile for Linux (workspace {})",
                workspace.display()
            );
            say!(
                "namespaces: user (uid/gid mapped), mount, pid, ipc{}",
                if net == crate::plan::Net::Host {
                    ""
                } else {
                    ", net"
                }
            );
            say!(
                "network: {:?}{}",
                net,
                if net == crate::plan::Net::Proxy {
                    format!(
                        " (proxy on 127.0.0.1:{} inside)",
                        crate::plan::SANDBOX_PROXY_PORT
                    )
                } else {
                    String::new()
                }
            );
            say!("\n[mounts]");
            say!("proc      /proc (fresh, this PID namespace)");
            say!("tmpfs     /tmp (private)");
            for p in &plan.tmp_binds {
                say!(
                    "bind      {} (writable root under /tmp, bound back)",
                    p.display()
                );
            }
            say!("tmpfs     /run, /var/run, /dev/shm");
            say!("tmpfs     /dev with null zero full random urandom tty, devpts /dev/pts");
            for p in &plan.deny_read {
                say!(
                    "hide      {} (tmpfs over a directory, /dev/null over a file)",
                    p.display()
                );
            }
            for p in &plan.deny_write {
                say!("readonly  {} (bind, if it exists)", p.display());
            }
            say!("\n[landlock]");
            #[cfg(target_os = "linux")]
            let abi = crate::linux::landlock::kernel_abi();
            #[cfg(not(target_os = "linux"))]
            let abi = 6;
            #[cfg(target_os = "linux")]
            for l in crate::linux::landlock::describe(&plan.read, &plan.write, abi) {
                say!("{l}");
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = abi;
                for p in &plan.read {
                    say!("read    {}", p.display());
                }
                for p in &plan.write {
                    say!("write   {}", p.display());
                }
            }
            say!("write   /tmp (private), /dev (minimal)");
            say!("\n[seccomp]");
            #[cfg(target_os = "linux")]
            for l in crate::linux::seccomp::describe() {
                say!("{l}");
            }
            say!("\n[capabilities]\nall dropped (bounding, ambient, effective, permitted, inheritable); no_new_privs");
            Ok(ExitCode::SUCCESS)
        }
        "macos" => {
            // The real port is chosen when airlock runs; 3128 stands in for it.
            let prof = crate::seatbelt::profile(&plan, Some(crate::plan::SANDBOX_PROXY_PORT));
            say!(
                ";; airlock Seatbelt profile (workspace {})",
                workspace.display()
            );
            say!(";; run as: /usr/bin/sandbox-exec -p <profile> -D NAME=VALUE... -- <command>");
            say!(
                ";; the proxy port is chosen at run time; shown here as {}",
                crate::plan::SANDBOX_PROXY_PORT
            );
            say!(";; TMPDIR is a private directory created for each run");
            for sw in &plan.macos.switches {
                say!(";; warning: {sw}: this opens a way around the sandbox");
            }
            say!("{}", prof.text);
            say!(";; -D parameters:");
            for (k, v) in &prof.params {
                say!(";;   {k}={}", v.escape_debug());
            }
            Ok(ExitCode::SUCCESS)
        }
        other => anyhow::bail!("--target {other}: expected linux or macos"),
    }
}

/// `airlock policy trust [FILE]` (SPEC §3.5): record the content of the
/// project policy, `--policy` files and every project tool configuration a
/// preset reads, as they are now. With FILE, that file only.
pub fn trust(args: &PolicyArgs, file: Option<&std::path::Path>) -> Result<ExitCode> {
    let files: Vec<(PathBuf, String)> = match file {
        Some(f) => {
            let bytes = crate::trust::read_no_follow(f)
                .with_context(|| format!("reading {} (a regular file, not a link)", f.display()))?;
            let dir = f
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let canon = std::fs::canonicalize(dir)
                .with_context(|| format!("resolving {}", dir.display()))?
                .join(f.file_name().context("a file name")?);
            vec![(canon, crate::trust::sha256_hex(&bytes))]
        }
        None => {
            // Every preset, so every tool configuration a later run could read.
            let mut all = args.clone();
            for p in airlock_policy::preset::PRESETS {
                if !all.preset.iter().any(|n| n == p.name) {
                    all.preset.push(p.name.to_string());
                }
            }
            let built = build_policy(&all, &[], crate::sources::Named::NeedTrust)?;
            for u in &built.untrusted {
                say!("{}:", crate::sources::shown(&u.path));
                for e in &u.effect {
                    say!("  {}", crate::sources::escape(e));
                }
            }
            built.read_files
        }
    };
    if files.is_empty() {
        say!("nothing to trust: no project configuration found");
        return Ok(ExitCode::SUCCESS);
    }
    let store = crate::trust::record(&files)?;
    for (p, h) in &files {
        say!("trusted {} (sha256 {})", crate::sources::shown(p), &h[..16]);
    }
    say!("recorded in {}", crate::sources::shown(&store));
    Ok(ExitCode::SUCCESS)
}
