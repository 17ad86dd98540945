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

/// `$XDG_CONFIG_HOME/airlock/trusted.json`.
pub fn store_path() -> Option<PathBuf> {
    crate::sources::user_policy_path().and_then(|p| p.parent().map(|d| d.join("trusted.json")))
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

/// Read a file without following a link at its last component.
pub fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut buf = vec![];
    std::io::Read::read_to_end(&mut f, &mut buf)?;
    Ok(buf)
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

impl Trust {
    pub fn new(roots: Vec<PathBuf>) -> Trust {
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
    if !f.credentials.is_empty() {
        out.push(format!("injects {} credential(s)", f.credentials.len()));
    }
    if !f.upstream_ca.is_empty() {
        out.push("trusts extra upstream CAs".into());
    }
    if f.audit_log.is_some() {
        out.push("sets the audit log path".into());
    }
    if let Some(o) = &f.audit_otlp {
        // What ran and where it went, sent off the machine.
        out.push(format!("sends audit events to {}", o.value));
    }
    if out.is_empty() {
        out.push("no widening found (restrictions only)".into());
    }
    out
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
            crate::sources::shown(&u.path),
            &u.hash[..16]
        ));
        for e in &u.effect {
            s.push_str(&format!("    would: {}\n", crate::sources::escape(e)));
        }
    }
    s.push_str(&format!(
        "Review it, then trust it as it is now: airlock policy trust --workspace {}",
        crate::sources::shown(workspace)
    ));
    s
}
