//! `airlock policy check | trust | profile` (`explain` and `presets` are
//! in explain_cmd.rs).

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_policy::{Fragment, Layer, Policy};
use anyhow::{Context, Result};

use crate::cli::PolicyArgs;
use crate::places::managed_policy_path;
use crate::policy::{build_policy, load_file};

/// Validate files; each problem is printed as `file:line:column: message`.
/// Files are also checked against the managed policy, which they cannot
/// loosen; with `managed`, they are checked as managed policies. Rules and
/// credentials that can never apply are warned about (SPEC §5.3).
pub fn check(files: &[PathBuf], managed: bool, as_json: bool) -> Result<ExitCode> {
    let mut errors: Vec<String> = vec![];
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
                errors.extend(diags.iter().map(|d| d.to_string()));
            }
        }
    }
    let (managed_path, required) = managed_policy_path()?;
    let checking_managed = managed
        || files
            .iter()
            .any(|f| std::fs::canonicalize(f).ok() == std::fs::canonicalize(&managed_path).ok());
    if !checking_managed {
        match load_file(&managed_path, Layer::Managed, required) {
            Ok(Some(m)) => frags.push(m),
            Ok(None) => {}
            Err(diags) => {
                errors.extend(diags.iter().map(|d| d.to_string()));
            }
        }
    }
    let mut all = vec![Fragment::built_in()];
    all.extend(frags);
    // Presets are not resolved here: checking a file must not run tools.
    let policy = Policy::build(all, &airlock_policy::preset::Offline);
    errors.extend(policy.conflicts.iter().map(|c| c.to_string()));
    let warnings = crate::policy::never_apply(&policy);
    let failed = !errors.is_empty();
    if as_json {
        let doc = serde_json::json!({
            "ok": !failed,
            "files": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "errors": errors,
            "warnings": warnings,
        });
        say!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for e in &errors {
            say!("{e}");
        }
        for w in &warnings {
            say!("warning: {w}");
        }
        if !failed {
            for f in files {
                say!("{}: ok", f.display());
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `airlock policy profile --target linux|macos`.
pub fn profile(args: &PolicyArgs, target: &str) -> Result<ExitCode> {
    let built = build_policy(
        args,
        &[],
        crate::policy::Named::NeedTrust,
        &crate::probe::Runner,
    )?;
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
            cwd: None,
            macos: target == "macos",
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
                "network: {}{}",
                match net {
                    crate::plan::Net::Proxy => "proxy",
                    crate::plan::Net::None => "none (loopback only)",
                    crate::plan::Net::Host => "host (no boundary)",
                },
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
            say!(
                "tmpfs     /tmp (private, size {} bytes; /dev/shm too)",
                plan.limits.tmp
            );
            for p in &plan.tmp_binds {
                say!(
                    "bind      {} (writable root under /tmp, bound back)",
                    p.display()
                );
            }
            say!("tmpfs     /run, /var/run, /dev/shm");
            say!("tmpfs     /dev with null zero full random urandom tty, devpts /dev/pts");
            // What exists is hidden; an absent path is listed as such, and
            // macOS's own locations are left out of the Linux view.
            for p in &plan.deny_read {
                let how = match p.symlink_metadata() {
                    Ok(m) if m.is_dir() => "tmpfs over the directory",
                    Ok(_) => "/dev/null bound over the file",
                    Err(_) if p.starts_with(home.join("Library")) => continue,
                    Err(_) => "absent now: nothing to hide",
                };
                say!("hide      {} ({how})", p.display());
            }
            for p in &plan.deny_write {
                say!("readonly  {} (bind, if it exists)", p.display());
            }
            say!("mask      every host pathname unix socket listed in /proc/net/unix (/dev/null over it)");
            for p in &plan.unix_sockets {
                say!("socket    {} (unix_sockets: left connectable)", p.display());
            }
            say!("\n[landlock]");
            #[cfg(target_os = "linux")]
            let abi = crate::linux::landlock::kernel_abi();
            #[cfg(not(target_os = "linux"))]
            let abi = 6;
            #[cfg(target_os = "linux")]
            for l in crate::linux::landlock::describe(&plan.read, &plan.write, &plan.deny_read, abi)
            {
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
            say!("\n[limits]");
            say!(
                "pids      {}{}",
                plan.limits.pids,
                if plan.limits.pids_configured {
                    ""
                } else {
                    " (default)"
                }
            );
            match plan.limits.memory {
                Some(m) => say!("memory    {m} bytes (cgroup)"),
                None => say!("memory    none"),
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
            let bytes = crate::paths::read_no_follow(f)
                .with_context(|| format!("reading {} (a regular file, not a link)", f.display()))?;
            let dir = f
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let canon = std::fs::canonicalize(dir)
                .with_context(|| format!("resolving {}", dir.display()))?
                .join(f.file_name().context("a file name")?);
            vec![(canon, crate::policy::trust::sha256_hex(&bytes))]
        }
        None => {
            // Every preset, so every tool configuration a later run could read.
            let mut all = args.clone();
            for p in airlock_policy::preset::PRESETS {
                if !all.preset.iter().any(|n| n == p.name) {
                    all.preset.push(p.name.to_string());
                }
            }
            let built = build_policy(
                &all,
                &[],
                crate::policy::Named::NeedTrust,
                &crate::probe::Runner,
            )?;
            for u in &built.untrusted {
                say!("{}:", crate::text::shown(&u.path));
                for e in &u.effect {
                    say!("  {}", crate::text::escape(e));
                }
            }
            built.read_files
        }
    };
    if files.is_empty() {
        say!("nothing to trust: no project configuration found");
        return Ok(ExitCode::SUCCESS);
    }
    let store = crate::policy::trust::record(&files)?;
    for (p, h) in &files {
        say!("trusted {} (sha256 {})", crate::text::shown(p), &h[..16]);
    }
    say!("recorded in {}", crate::text::shown(&store));
    Ok(ExitCode::SUCCESS)
}
