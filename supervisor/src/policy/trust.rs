//! Trust in project configuration (SPEC §3.5), as direnv does for `.envrc`:
//! a file inside a writable root may have been written by an earlier
//! sandboxed run, so it applies only once the user has trusted its exact
//! content with `airlock policy trust`. The store lives in airlock's config
//! directory, which every sandbox sees read-only.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::paths::read_no_follow;

/// `$XDG_CONFIG_HOME/airlock/trusted.json`.
pub fn store_path() -> Option<PathBuf> {
    crate::places::user_policy_path().and_then(|p| p.parent().map(|d| d.join("trusted.json")))
}

#[derive(Default, Serialize, Deserialize)]
struct StoreFile {
    /// Canonical path to the sha256 of the content that was trusted.
    files: BTreeMap<String, String>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn load_store() -> StoreFile {
    store_path()
        .and_then(|p| read_no_follow(&p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    New,
    Changed,
}

/// A project file that is not applied until the user trusts it.
#[derive(Debug, Clone)]
pub struct Untrusted {
    pub path: PathBuf,
    pub status: Status,
    pub hash: String,
    /// What it would change, in words.
    pub effect: Vec<String>,
}

/// Which files need trust, and the store to check them against. Every
/// project-level read is recorded; which of them needed trust is decided
/// again once the run's writable roots are all known (a preset's cache, a
/// policy's `write`), so a file in a root added late is not missed.
pub struct Trust {
    /// Writable roots: a file below one of them needs trust.
    roots: RefCell<Vec<PathBuf>>,
    store: StoreFile,
    /// Every file read through `check`, with the hash of what was read.
    reads: RefCell<Vec<(PathBuf, String)>>,
    effects: RefCell<BTreeMap<PathBuf, Vec<String>>>,
}

/// Where the writable roots of this user's earlier runs are remembered:
/// beside the run journals, in airlock's config directory, which every
/// sandbox sees read-only.
fn past_roots_path() -> Option<PathBuf> {
    crate::places::user_policy_path()
        .and_then(|p| p.parent().map(|d| d.join("pending").join("roots")))
}

/// Roots remembered before the record is pruned of those that no longer
/// exist (a root that is gone holds nothing a sandbox wrote).
const PAST_ROOTS_PRUNE: usize = 4096;

/// The record, opened without following a link and locked (`LOCK_SH` to
/// read, `LOCK_EX` to change it), so that concurrent runs lose no line.
fn open_past_roots(write: bool) -> std::io::Result<std::fs::File> {
    let path = past_roots_path().ok_or_else(|| std::io::Error::other("no config directory"))?;
    let f = if write {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)?
    };
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    use std::os::fd::AsRawFd;
    let op = if write { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

fn read_roots(f: &mut std::fs::File) -> std::io::Result<Vec<PathBuf>> {
    let mut buf = vec![];
    std::io::Read::read_to_end(f, &mut buf)?;
    Ok(String::from_utf8_lossy(&buf)
        .lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// The writable roots of this user's earlier runs and sessions (SPEC §3.5:
/// yesterday's workspace may be a parent of today's).
pub fn past_roots() -> Vec<PathBuf> {
    open_past_roots(false)
        .and_then(|mut f| read_roots(&mut f))
        .unwrap_or_default()
}

/// Refuse a file airlock is to write (`--report`, `--audit-log`,
/// `--learn`) whose way passes through a link that lies inside a writable
/// root of an earlier run: a sandbox could have made it, to send
/// airlock's output over a file of the user's elsewhere (red team round
/// 14). The user's own links outside those roots are followed; the last
/// component is never followed (`safe_file`).
pub fn output_path(path: &Path, what: &str) -> Result<()> {
    let Ok(cwd) = std::env::current_dir() else {
        return Ok(());
    };
    // As the kernel walks it: `out/../r.json` goes through `out` first
    // (red team round 15), so `..` is not folded away beforehand.
    let abs = cwd.join(path);
    let Some(parent) = abs.parent() else {
        return Ok(());
    };
    let roots = past_roots();
    if roots.is_empty() {
        return Ok(());
    }
    let mut real = PathBuf::new();
    for c in parent.components() {
        match c {
            std::path::Component::ParentDir => {
                real.pop();
                continue;
            }
            std::path::Component::CurDir => continue,
            _ => real.push(c),
        }
        let Ok(m) = std::fs::symlink_metadata(&real) else {
            return Ok(());
        };
        if m.file_type().is_symlink() {
            if roots.iter().any(|r| real.starts_with(r) && real != *r) {
                anyhow::bail!(
                    "{what} {}: {} is a link inside a directory a sandboxed run could write, so airlock does not write through it; name the directory it leads to, or remove the link",
                    crate::text::shown(path),
                    crate::text::shown(&real)
                );
            }
            match std::fs::canonicalize(&real) {
                Ok(r) => real = r,
                Err(_) => return Ok(()),
            }
        }
    }
    Ok(())
}

/// Remember this run's writable roots, before its command starts (so a
/// run whose airlock dies still counts). A failure is an error: a root
/// that is not remembered would let what the run writes there widen a
/// later run started below it.
pub fn remember_roots(roots: &[PathBuf]) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut f = open_past_roots(true).context("opening the record of past writable roots")?;
    let mut known = read_roots(&mut f).context("reading the record of past writable roots")?;
    let new: Vec<PathBuf> = roots
        .iter()
        .filter(|r| !known.contains(r))
        .filter(|r| r.to_str().is_some_and(|s| !s.contains('\n')))
        .cloned()
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    known.extend(new.iter().cloned());
    let pruned = known.len() > PAST_ROOTS_PRUNE;
    let lines: Vec<&PathBuf> = if pruned {
        known
            .iter()
            .filter(|r| std::fs::symlink_metadata(r).is_ok())
            .collect()
    } else {
        new.iter().collect()
    };
    let text: String = lines.iter().map(|p| format!("{}\n", p.display())).collect();
    if pruned {
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
    } else {
        f.seek(SeekFrom::End(0))?;
    }
    f.write_all(text.as_bytes())
        .context("writing the record of past writable roots")?;
    Ok(())
}

impl Trust {
    /// `roots` are this run's writable roots; those of every earlier run
    /// of this user are added: a file there could have been written by a
    /// sandbox as much as one in today's workspace.
    pub fn new(mut roots: Vec<PathBuf>) -> Trust {
        for r in past_roots() {
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
        Trust {
            roots: RefCell::new(roots),
            store: load_store(),
            reads: RefCell::new(vec![]),
            effects: RefCell::new(BTreeMap::new()),
        }
    }

    /// More writable roots (canonical), known only after the policy is built.
    pub fn extend_roots(&self, more: impl IntoIterator<Item = PathBuf>) {
        let mut roots = self.roots.borrow_mut();
        for r in more {
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
    }

    fn canonical(path: &Path) -> PathBuf {
        let abs;
        let path = if path.is_relative() {
            abs = std::env::current_dir()
                .map(|d| d.join(path))
                .unwrap_or_else(|_| path.to_path_buf());
            abs.as_path()
        } else {
            path
        };
        match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => std::fs::canonicalize(parent)
                .map(|p| p.join(name))
                .unwrap_or_else(|_| path.to_path_buf()),
            _ => path.to_path_buf(),
        }
    }

    fn inside_roots(&self, canonical: &Path) -> bool {
        self.roots.borrow().iter().any(|r| canonical.starts_with(r))
    }

    /// Whether `path` lies where a sandbox could have written it.
    pub fn needs_trust(&self, path: &Path) -> bool {
        self.inside_roots(&Self::canonical(path))
    }

    fn status(&self, path: &Path, hash: &str) -> Option<Status> {
        match self.store.files.get(&path.display().to_string()) {
            Some(h) if h == hash => None,
            Some(_) => Some(Status::Changed),
            None => Some(Status::New),
        }
    }

    /// Record `bytes`, read from `path`. Returns whether they may be applied
    /// as far as the roots known now tell.
    pub fn check(&self, path: &Path, bytes: &[u8]) -> bool {
        let p = Self::canonical(path);
        let hash = sha256_hex(bytes);
        let trusted = !self.inside_roots(&p) || self.status(&p, &hash).is_none();
        self.reads.borrow_mut().push((p, hash));
        trusted
    }

    /// Every file read below a writable root that is new or changed since
    /// it was trusted, with what it would change.
    pub fn untrusted(&self) -> Vec<Untrusted> {
        let effects = self.effects.borrow();
        let mut out: Vec<Untrusted> = vec![];
        for (p, hash) in self.read_files() {
            let Some(status) = self.status(&p, &hash) else {
                continue;
            };
            if out.iter().any(|u| u.path == p) {
                continue;
            }
            out.push(Untrusted {
                effect: effects.get(&p).cloned().unwrap_or_default(),
                path: p,
                status,
                hash,
            });
        }
        out
    }

    pub fn add_effect(&self, path: &Path, line: String) {
        let p = Self::canonical(path);
        let mut effects = self.effects.borrow_mut();
        let e = effects.entry(p).or_default();
        if !e.contains(&line) {
            e.push(line);
        }
    }

    /// Every file below a writable root that was read, with its hash.
    pub fn read_files(&self) -> Vec<(PathBuf, String)> {
        let mut v: Vec<(PathBuf, String)> = self
            .reads
            .borrow()
            .iter()
            .filter(|(p, _)| self.inside_roots(p))
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Record these files' current hashes as trusted.
pub fn record(files: &[(PathBuf, String)]) -> Result<PathBuf> {
    if std::env::var_os("AIRLOCK_SANDBOX").is_some() {
        bail!("`airlock policy trust` cannot run inside an airlock sandbox");
    }
    let path = store_path().context("neither XDG_CONFIG_HOME nor HOME is set")?;
    let dir = path.parent().context("trust store path")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut store = load_store();
    for (p, h) in files {
        store.files.insert(p.display().to_string(), h.clone());
    }
    let text = serde_json::to_vec_pretty(&store).context("encoding the trust store")?;
    // Write a fresh file and rename it over the store: never through a link.
    let tmp = dir.join(format!(".trusted.json.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(&text)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(path)
}

/// What a policy fragment would widen, for the refusal message.
pub fn fragment_effect(f: &airlock_policy::Fragment) -> Vec<String> {
    let mut out = vec![];
    let list = |v: &[String]| v.join(", ");
    if let Some(m) = &f.mode {
        out.push(format!("network mode = {:?}", m.value).to_lowercase());
    }
    let allow: Vec<String> = f.allow.iter().map(|r| r.value.to_string()).collect();
    if !allow.is_empty() {
        out.push(format!("allows hosts: {}", list(&allow)));
    }
    if !f.presets.is_empty() {
        let p: Vec<String> = f.presets.iter().map(|p| p.value.clone()).collect();
        out.push(format!("adds presets: {}", list(&p)));
    }
    let write: Vec<String> = f.write.iter().map(|w| w.value.clone()).collect();
    if !write.is_empty() {
        out.push(format!("makes writable: {}", list(&write)));
    }
    if let Some(r) = &f.read {
        let r: Vec<String> = r.iter().map(|w| w.value.clone()).collect();
        out.push(format!("readable: {}", list(&r)));
    }
    let pass: Vec<String> = f.env_pass.iter().map(|w| w.value.clone()).collect();
    if !pass.is_empty() {
        out.push(format!("passes environment variables: {}", list(&pass)));
    }
    let set: Vec<String> = f.env_set.iter().map(|(k, _)| k.clone()).collect();
    if !set.is_empty() {
        out.push(format!("sets environment variables: {}", list(&set)));
    }
    if let Some(u) = &f.unknown {
        out.push(format!("unknown hosts: {:?}", u.value).to_lowercase());
    }
    let private: Vec<String> = f
        .allow_private
        .iter()
        .map(|n| n.value.to_string())
        .collect();
    if !private.is_empty() {
        out.push(format!("allows private ranges: {}", list(&private)));
    }
    let resolve: Vec<String> = f
        .resolve
        .iter()
        .map(|(h, ip)| format!("{h}={}", ip.value))
        .collect();
    if !resolve.is_empty() {
        out.push(format!("pins DNS answers: {}", list(&resolve)));
    }
    if !f.inspect.is_empty() {
        out.push(format!("inspects {} host pattern(s)", f.inspect.len()));
    }
    for c in &f.credentials {
        let writes = match c.methods.len() {
            0 => String::new(),
            n => format!(", and lends it to writes ({n} method rule(s): publishing as you)"),
        };
        out.push(format!(
            "sends a credential to {}: header {} with {}{writes}",
            c.host.text,
            c.header,
            credential_source(&c.value)
        ));
    }
    // What the earlier summary left out (red team round 14: a file whose
    // only entry made the docker socket connectable read "no widening").
    let sockets: Vec<String> = f.unix_sockets.iter().map(|s| s.value.clone()).collect();
    if !sockets.is_empty() {
        out.push(format!(
            "makes host sockets connectable from inside: {} (a socket such as docker's is root on the host)",
            list(&sockets)
        ));
    }
    let limits: Vec<String> = [
        f.timeout.as_ref().map(|t| format!("timeout {:?}", t.value)),
        f.memory
            .as_ref()
            .map(|m| format!("memory {} bytes", m.value)),
        f.pids.as_ref().map(|p| format!("pids {}", p.value)),
        f.tmp.as_ref().map(|t| format!("tmp {} bytes", t.value)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !limits.is_empty() {
        out.push(format!("sets limits: {}", list(&limits)));
    }
    let proxy: Vec<String> = [
        f.ask_timeout
            .as_ref()
            .map(|t| format!("ask_timeout {:?}", t.value)),
        f.connect_timeout
            .as_ref()
            .map(|t| format!("connect_timeout {:?}", t.value)),
        f.idle_timeout
            .as_ref()
            .map(|t| format!("idle_timeout {:?}", t.value)),
        f.max_tunnels
            .as_ref()
            .map(|m| format!("max_tunnels {}", m.value)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !proxy.is_empty() {
        out.push(format!("sets proxy settings: {}", list(&proxy)));
    }
    if let Some(i) = &f.env_inherit {
        out.push(format!("environment: inherit = {:?}", i.value).to_lowercase());
    }
    if let Some(u) = &f.user_allow {
        out.push(format!("user_allow = {}", u.value));
    }
    if let Some(r) = &f.require_sandbox {
        out.push(format!("require_sandbox = {}", r.value));
    }
    if f.macos_keychain.as_ref().is_some_and(|k| k.value) {
        out.push("on macOS, opens the keychain (securityd) to the sandbox".into());
    }
    if f.macos_dnssd.as_ref().is_some_and(|k| k.value) {
        out.push("on macOS, opens mDNSResponder (dnssd) to the sandbox".into());
    }
    if !f.upstream_ca.is_empty() {
        out.push("trusts extra upstream CAs".into());
    }
    if let Some(a) = &f.audit_log {
        out.push(format!("sets the audit log path: {}", a.value));
    }
    if let Some(o) = &f.audit_otlp {
        // What ran and where it went, sent off the machine.
        out.push(format!("sends audit events to {}", o.value));
    }
    if out.is_empty() {
        out.push("no widening found (restrictions only)".into());
    }
    // Restrictions, named too: the person sees the whole file's effect.
    let mut restricts = vec![];
    for (what, n) in [
        ("denied hosts", f.deny.len()),
        ("deny_read paths", f.deny_read.len()),
        ("deny_write paths", f.deny_write.len()),
        ("request rules", f.request_rules.len()),
        ("hold rules", f.hold_rules.len()),
    ] {
        if n > 0 {
            restricts.push(format!("{n} {what}"));
        }
    }
    if !restricts.is_empty() {
        out.push(format!("restricts: {}", list(&restricts)));
    }
    out
}

/// Where a credential's value comes from, in words that hold no secret:
/// the variables it names, or that it is written in the file itself.
pub fn credential_source(value: &str) -> String {
    let vars: Vec<&str> = value
        .split("${")
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
        .collect();
    if vars.is_empty() {
        "a value written in the file".into()
    } else {
        format!(
            "the value of {}",
            vars.iter()
                .map(|v| format!("${v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The refusal shown by `run` and `proxy` (SPEC §3.5): what each file would
/// change and the command that trusts it.
pub fn refusal(untrusted: &[Untrusted], workspace: &Path) -> String {
    let mut s = String::from("untrusted project configuration: a sandboxed command could have written it, so it is not applied\n");
    for u in untrusted {
        let what = match u.status {
            Status::New => "new, never trusted",
            Status::Changed => "CHANGED since it was trusted",
        };
        s.push_str(&format!(
            "  {} ({what}; sha256 {})\n",
            crate::text::shown(&u.path),
            &u.hash[..16]
        ));
        for e in &u.effect {
            s.push_str(&format!("    would: {}\n", crate::text::escape(e)));
        }
    }
    s.push_str(&format!(
        "Review it, then trust it as it is now: airlock policy trust --workspace {}",
        crate::text::shown(workspace)
    ));
    // A file outside today's workspace (a parent that was an earlier run's
    // workspace, a --policy file there) is trusted by name; so is a
    // `--policy` file, which `--workspace` alone does not name (red team
    // round 14: following the advice, the run was refused again).
    for u in untrusted {
        s.push_str(&format!(
            "\n  or that file alone: airlock policy trust {}",
            crate::text::shown(&u.path)
        ));
    }
    s
}
