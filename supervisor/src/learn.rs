//! `airlock run --learn FILE` (SPEC §5.6): unknown hosts are allowed and
//! recorded, and FILE gets a proposed policy listing each host with the
//! commands that contacted it. The run is open, so it says so loudly at
//! the start and the end; it refuses when the managed policy denies
//! unknown hosts, and it never writes a policy file airlock applies.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use airlock_audit::safe_file::{self, Mode};
use airlock_audit::{AuditLog, Event, Record, Sink};
use airlock_policy::{Layer, Pattern, PatternList, Policy, Unknown};
use airlock_proxy::{Answer, AnswerFuture, Approver, Question};
use anyhow::{bail, Context, Result};

use crate::cli::RunArgs;

/// Who the audit log says answered: nobody did, learn mode allowed it.
const BY: &str = "learn mode (--learn)";

#[derive(Default)]
struct Host {
    connections: u64,
    /// Why each connection was allowed (`approved` = only learn mode).
    reasons: BTreeSet<String>,
    /// Command line (escaped) -> connections.
    commands: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Seen {
    allowed: BTreeMap<String, Host>,
    /// (target, reason) -> count: what was refused even while learning.
    refused: BTreeMap<(String, String), u64>,
}

/// Watches the audit records for decisions.
#[derive(Default)]
struct Recorder(Mutex<Seen>);

fn target_text(host: &str, port: Option<u16>) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    match port {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

impl Sink for Recorder {
    fn record(&self, r: &Record) {
        let Event::Decision(d) = &r.event else {
            return;
        };
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let target = target_text(&d.host, d.port);
        if d.decision == "allow" {
            let h = seen.allowed.entry(target).or_default();
            h.connections += 1;
            h.reasons.insert(d.reason.clone());
            let cmd = match &d.command {
                Some(c) => airlock_audit::summary::printable(&c.argv.join(" ")),
                None => "(not attributed)".into(),
            };
            *h.commands.entry(cmd).or_default() += 1;
        } else {
            *seen.refused.entry((target, d.reason.clone())).or_default() += 1;
        }
    }
}

/// Learn mode answers every question itself, at once.
struct LearnApprover;

impl Approver for LearnApprover {
    fn ask(&self, q: Question) -> AnswerFuture<'_> {
        // Learning is about hosts: it never lends a credential to a write
        // (SPEC §3.4), which nobody would have approved.
        if q.write.is_some() {
            return Box::pin(async {
                (
                    Answer::Deny,
                    "learn mode (--learn) does not lend credentials to writes".to_string(),
                )
            });
        }
        Box::pin(async { (Answer::AllowSession, BY.to_string()) })
    }
}

pub struct Learn {
    path: PathBuf,
    /// FILE's directory, opened once before the sandbox starts: a parent
    /// renamed or swapped for a link during the run cannot redirect the
    /// write (the sandbox may write where FILE lives).
    dir: safe_file::Dir,
    name: String,
    recorder: Arc<Recorder>,
    command: Vec<String>,
    /// The policy files in force, by (device, inode): FILE is never one.
    policies: Vec<(PathBuf, u64, u64)>,
    /// FILE lies where the sandbox may write: `-p FILE` then needs
    /// `policy trust FILE` first, and the closing line says so.
    needs_trust: bool,
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Learn {
    /// Check everything before the sandbox starts, open `--learn FILE`
    /// (creating it, refusing links) and open the policy to unknown hosts.
    pub fn prepare(
        args: &RunArgs,
        policy: &mut Policy,
        workspace: &Path,
        proxied: bool,
    ) -> Result<Option<Learn>> {
        let Some(path) = &args.learn else {
            return Ok(None);
        };
        if policy.unknown.value == Unknown::Deny && policy.unknown.layer == Layer::Managed {
            bail!(
                "--learn: the managed policy sets network.unknown = \"deny\" ({}); learn mode \
                 would allow unknown hosts, which your administrator does not permit",
                policy.unknown.origin
            );
        }
        if !proxied {
            bail!("--learn needs the proxy: it records what the proxy decides (drop --network)");
        }
        if args.policy.ask.is_some() {
            bail!("--learn answers every question itself: drop --ask");
        }
        let mut policies: Vec<(PathBuf, u64, u64)> = vec![];
        let mut named: Vec<PathBuf> = vec![workspace.join("airlock.toml")];
        named.extend(crate::places::user_policy_path());
        named.extend(args.policy.policy.iter().cloned());
        named.extend(crate::places::managed_policy_files());
        // By name, even before they exist: a proposal written where a
        // policy is read would apply without review.
        let canonical = |p: &Path| -> Option<PathBuf> {
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
        };
        let wanted = canonical(path);
        for p in &named {
            if wanted.is_some() && canonical(p) == wanted {
                let what = if *p == workspace.join("airlock.toml") {
                    "the project policy".to_string()
                } else {
                    format!("the policy file {}", p.display())
                };
                bail!(
                    "--learn {}: that is {what}; learn mode writes a proposal for you to \
                     review, never a policy airlock applies. Choose another file",
                    path.display()
                );
            }
        }
        for p in named {
            if let Some((dev, ino)) = identity(&p) {
                policies.push((p, dev, ino));
            }
        }
        crate::policy::trust::output_path(path, "--learn")?;
        let (dir, name) =
            safe_file::split(path).with_context(|| format!("--learn {}", path.display()))?;
        // The writable roots as trust sees them: the workspace, --write,
        // and every path a policy layer or preset makes writable.
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/".into());
        let writable: Vec<PathBuf> = std::iter::once(workspace.to_path_buf())
            .chain(args.write.iter().cloned())
            .chain(
                policy
                    .write
                    .iter()
                    .filter_map(|w| crate::paths::resolve_path(&w.value, &home, workspace)),
            )
            .filter_map(|w| std::fs::canonicalize(w).ok())
            .collect();
        let needs_trust = wanted
            .as_ref()
            .is_none_or(|w| writable.iter().any(|root| w.starts_with(root)));
        let learn = Learn {
            needs_trust,
            path: path.clone(),
            dir,
            name,
            recorder: Arc::default(),
            command: args.command.clone(),
            policies,
        };
        learn.open().map(drop)?;
        policy.unknown.value = Unknown::Ask;
        eprintln!(
            "airlock: LEARN MODE: unknown hosts are ALLOWED for this run and recorded; the \
             proposed policy goes to {} (no policy airlock applies is changed)",
            path.display()
        );
        Ok(Some(learn))
    }

    /// Open FILE for replacing, without following links, and refuse it if
    /// it is one of the policy files in force (a hard link included).
    fn open(&self) -> Result<File> {
        let file = self
            .dir
            .open_file(&self.name, Mode::Append, 0o644)
            .with_context(|| format!("--learn {}", self.path.display()))?;
        let meta = file.metadata().context("--learn")?;
        if let Some((p, _, _)) = self
            .policies
            .iter()
            .find(|(_, dev, ino)| (*dev, *ino) == (meta.dev(), meta.ino()))
        {
            bail!(
                "--learn {}: that is the policy file {}; learn mode never writes a policy \
                 airlock applies. Choose another file",
                self.path.display(),
                p.display()
            );
        }
        Ok(file)
    }

    /// Give the audit log the recorder; the proxy attributes connections
    /// to commands only when there is a log, so learning makes one.
    pub fn audit(&self, audit: Option<AuditLog>, run: &str) -> AuditLog {
        audit
            .unwrap_or_else(|| AuditLog::sinks_only(run))
            .with_sink(self.recorder.clone())
    }

    pub fn approver(&self) -> Arc<dyn Approver> {
        Arc::new(LearnApprover)
    }

    /// Write the proposal (the sandbox is gone: nothing races this) and
    /// say loudly what happened.
    pub fn finish(&self) -> Result<()> {
        let seen = self.recorder.0.lock().unwrap_or_else(|p| p.into_inner());
        let text = proposal(&seen, &self.command);
        let mut file = self.open()?;
        file.set_len(0)
            .and_then(|()| file.write_all(text.as_bytes()))
            .with_context(|| format!("writing {}", self.path.display()))?;
        let shown = crate::text::escape(&self.path.display().to_string());
        // A file the sandbox could have written is applied only once
        // trusted: give the whole way, not a step that then refuses.
        let next = if self.needs_trust {
            format!(
                "Review it, trust it as it is then (it lies where the sandbox could write): \
                 airlock policy trust {shown}; then use it with -p {shown}"
            )
        } else {
            format!("Review it, then use it with -p {shown}")
        };
        eprintln!(
            "airlock: LEARN MODE ended: unknown hosts were allowed; {} destinations recorded \
             in {shown}. {next} (it sets unknown = \"deny\")",
            seen.allowed.len(),
        );
        Ok(())
    }
}

/// The proposed policy: valid TOML whose comments carry the evidence.
fn proposal(seen: &Seen, command: &[String]) -> String {
    use airlock_audit::summary::printable;
    let mut out = String::new();
    out.push_str("# Proposed by `airlock run --learn`");
    out.push_str(&format!(" at {}\n", airlock_audit::writer::now()));
    out.push_str(&format!("# for: {}\n", printable(&command.join(" "))));
    out.push_str(
        "# Unknown hosts were ALLOWED while learning. This is a proposal, not a policy\n\
         # airlock applied: review every entry before you use it.\n\n[network]\nunknown = \"deny\"\nallow = [\n",
    );
    let mut invalid = vec![];
    for (target, h) in &seen.allowed {
        if Pattern::parse(target, PatternList::Allow).is_err() {
            invalid.push(target);
            continue;
        }
        let why = if h.reasons.iter().all(|r| r == "approved") {
            "new (allowed by learn mode)".to_string()
        } else {
            format!(
                "already allowed ({})",
                h.reasons.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        out.push_str(&format!("    # {} connection(s), {why}:\n", h.connections));
        for (cmd, n) in &h.commands {
            out.push_str(&format!("    #   {n:>5}  {cmd}\n"));
        }
        out.push_str(&format!(
            "    {},\n",
            toml_edit::Value::from(target.as_str())
        ));
    }
    out.push_str("]\n");
    for t in invalid {
        out.push_str(&format!(
            "# not a valid allow pattern, left out: {}\n",
            printable(t)
        ));
    }
    if !seen.refused.is_empty() {
        out.push_str("\n# Refused even while learning (not proposed):\n");
        for ((target, reason), n) in &seen.refused {
            out.push_str(&format!(
                "#   {}  {}  x{n}\n",
                printable(target),
                printable(reason)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_audit::schema::{Command, Decision};

    fn decision(host: &str, allow: bool, reason: &str, argv: &[&str]) -> Record {
        Record {
            ts: String::new(),
            conn: 1,
            run: "r".into(),
            event: Event::Decision(Decision {
                host: host.into(),
                port: Some(8080),
                ip: None,
                decision: if allow { "allow" } else { "deny" }.into(),
                reason: reason.into(),
                rule: None,
                source: None,
                protocol: "http".into(),
                command: Some(Command {
                    pid: 2,
                    argv: argv.iter().map(|s| s.to_string()).collect(),
                }),
                client: "127.0.0.1:1".into(),
                detail: None,
            }),
        }
    }

    #[test]
    fn the_proposal_is_valid_toml_and_comments_cannot_be_escaped() {
        let r = Recorder::default();
        r.record(&decision(
            "a.test",
            true,
            "approved",
            &["curl", "x\n\"evil.test\","],
        ));
        r.record(&decision("a.test", true, "approved", &["curl", "y"]));
        r.record(&decision("b.test", false, "denylisted", &["wget"]));
        let seen = r.0.lock().unwrap();
        let text = proposal(&seen, &["sh".into(), "-c".into(), "x\ny".into()]);
        let v: toml_edit::DocumentMut = text.parse().expect(&text);
        let allow = v["network"]["allow"].as_array().unwrap();
        let got: Vec<_> = allow.iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(got, vec!["a.test:8080"], "{text}");
        assert!(text.contains("2 connection(s), new"), "{text}");
        assert!(text.contains("b.test:8080  denylisted  x1"), "{text}");
    }
}
