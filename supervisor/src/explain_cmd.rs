//! `airlock policy explain` and `airlock policy presets`, as text or, with
//! `--json`, as one JSON document for scripts.

use std::process::ExitCode;

use airlock_policy::{check_address, decide, inspects, Host, Policy, Target, PRESETS};
use anyhow::Result;
use serde_json::{json, Map, Value};

use crate::cli::PolicyArgs;
use crate::policy::build_policy;
use crate::policy::machine::SystemProbe;

/// One explained target: ordered `(field, value)` pairs.
type Fields = Vec<(&'static str, String)>;

pub fn explain(args: &PolicyArgs, target: &str, as_json: bool) -> Result<ExitCode> {
    let built = build_policy(
        args,
        &[],
        crate::policy::Named::NeedTrust,
        &crate::probe::Runner,
    )?;
    built.warn_untrusted();
    let policy = built.policy;
    // Without a port, both web ports: a pattern without a port allows both,
    // and a plain-http fetch is decided on 80.
    // A URL is what people paste: decide its host and the port its scheme
    // implies (the policy decides hosts; a path never changes the answer).
    let url_target;
    let target = match url_host_port(target) {
        Some(t) => {
            url_target = t;
            url_target.as_str()
        }
        None => target,
    };
    let targets: Vec<Result<Target, String>> = match Target::parse(target, None) {
        Ok(t) => vec![Ok(t)],
        Err(_) => [443, 80]
            .into_iter()
            .map(|port| Target::parse(target, Some(port)).map_err(|e| e.to_string()))
            .collect(),
    };
    let mut all: Vec<Fields> = vec![];
    for t in targets {
        match t {
            Ok(t) => all.push(explain_one(&policy, &t)),
            Err(e) => {
                all.push(vec![
                    ("target", target.to_string()),
                    ("verdict", "deny".into()),
                    ("reason", "invalid-host".into()),
                    ("detail", e),
                ]);
                break;
            }
        }
    }
    if as_json {
        let list: Vec<Value> = all
            .iter()
            .map(|fields| {
                Value::Object(
                    fields
                        .iter()
                        .map(|(k, v)| (k.replace(' ', "_"), Value::String(v.clone())))
                        .collect::<Map<_, _>>(),
                )
            })
            .collect();
        say!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for (i, fields) in all.iter().enumerate() {
            if i > 0 {
                say!("");
            }
            for (k, v) in fields {
                say!("{:<10}{v}", format!("{k}:"));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `https://host[:port]/path` as `host:port` (443 for https, 80 for
/// http); None for anything that is not an http(s) URL.
fn url_host_port(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rsplit_once(':') {
        Some((h, p)) => !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':'),
        None => false,
    } && !(host_port.starts_with('[') && host_port.ends_with(']'));
    Some(if has_port {
        host_port.to_string()
    } else {
        format!("{host_port}:{default}")
    })
}

fn explain_one(policy: &Policy, target: &Target) -> Fields {
    let mut out: Fields = vec![];
    let d = decide(policy, target);
    out.push(("target", target.to_string()));
    out.push(("verdict", d.verdict.as_str().to_string()));
    out.push(("reason", d.reason.to_string()));
    match &d.rule {
        Some(r) => {
            out.push(("rule", r.value.text.clone()));
            out.push(("source", format!("{} ({} layer)", r.origin, r.layer.name())));
        }
        None => {
            let unknown = if d.verdict == airlock_policy::Verdict::Ask {
                "ask"
            } else {
                "deny"
            };
            out.push((
                "rule",
                format!(
                    "none matched; unknown = \"{unknown}\" ({})",
                    policy.unknown.origin
                ),
            ));
        }
    }
    if inspects(policy, target) {
        out.push(("inspect", "yes (TLS is decrypted and checked)".into()));
    }
    if d.is_allow() {
        let pinned = match &target.host {
            Host::Ip(ip) => Some((*ip, "IP literal".to_string())),
            name => policy
                .resolve
                .get(name)
                .map(|ip| (ip.value, ip.origin.to_string())),
        };
        let address = match pinned {
            Some((ip, from)) => {
                let nets: Vec<_> = policy.allow_private.iter().map(|n| n.value).collect();
                match check_address(ip, &nets, &[]) {
                    Ok(()) => format!("{ip} ({from}): allowed"),
                    Err(why) => format!(
                        "{ip} ({from}): refused, private-address ({why}); allow the range with --allow-private"
                    ),
                }
            }
            None => {
                "resolved by the proxy at connect time, then checked against private ranges".into()
            }
        };
        out.push(("address", address));
    } else {
        // The same advice `run` gives: under user_allow = false, --allow
        // would not count, so it is not offered.
        out.push((
            "to allow",
            airlock_policy::advice(target, d.reason, None, policy.user_allow),
        ));
    }
    out
}

pub fn presets(as_json: bool) -> Result<ExitCode> {
    // The workspace `run` would take here, so the caches shown are the ones
    // a run from this directory gets.
    let (workspace, _) = crate::policy::workspace_dir(&Default::default())?;
    let trust = crate::policy::trust::Trust::new(vec![workspace.clone()]);
    let probe = SystemProbe {
        project: crate::policy::project_root(&workspace),
        workspace,
        trust: &trust,
        sandboxed: &crate::probe::Runner,
    };
    let mut list = vec![];
    for p in PRESETS {
        let r = p.resolve(&probe);
        if as_json {
            let pairs = |v: &[(String, String)], k: &str, f: &str| -> Vec<Value> {
                v.iter().map(|(a, b)| json!({ k: a, f: b })).collect()
            };
            list.push(json!({
                "name": p.name,
                "summary": p.summary,
                "hosts": pairs(&r.hosts, "host", "from"),
                "writes": pairs(&r.writes, "path", "from"),
                "caches": r.caches,
                // Whose caches they are: each project has its own.
                "project": r.project.as_ref().map(|(dir, root)| json!({"dir": dir, "root": root})),
                // Names only: values are the host's own.
                "env": r.env.iter().map(|(n, _, from)| json!({"name": n, "from": from})).collect::<Vec<_>>(),
                "hidden": pairs(&r.hide, "path", "why"),
                "credentials": r.credentials.iter().map(|c| json!({"host": c.host, "header": c.header, "from": c.from})).collect::<Vec<_>>(),
                "notes": r.notes,
                "warnings": r.warnings,
            }));
            continue;
        }
        say!("{}: {}", p.name, p.summary);
        if let Some((dir, root)) = &r.project {
            say!(
                "  caches of project {} in {} (its own: no other project's sandbox writes them)",
                crate::text::shown(root),
                crate::text::shown(dir)
            );
        }
        for (host, from) in &r.hosts {
            say!("  allow {host:<40} from {from}");
        }
        for (path, from) in &r.writes {
            say!("  write {path:<40} from {from}");
        }
        for (name, _, from) in &r.env {
            say!("  env   {name:<40} from {from}");
        }
        for (path, why) in &r.hide {
            say!("  hide  {path:<40} {why}");
        }
        for c in &r.credentials {
            // SPEC §3.4: a discovered credential reads; writes are asked.
            say!(
                "  credential {} on {:<29} from {} (reads only; writes are asked for)",
                c.header,
                c.host,
                c.from
            );
        }
        for n in &r.notes {
            say!("  note: {n}");
        }
        for w in &r.warnings {
            say!("  warning: {w}");
        }
    }
    if as_json {
        say!("{}", serde_json::to_string_pretty(&list)?);
    }
    Ok(ExitCode::SUCCESS)
}
