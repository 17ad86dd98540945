//! Changes held for review (SPEC §4.8): with `run --review`, each writable
//! root is an overlay whose upper layer lives in a changeset under
//! airlock's state directory; the host tree is never written until
//! `airlock changes apply`. This module owns the changeset on disk: made
//! before the sandbox starts, scanned once it has ended.

pub mod apply;
pub mod cmd;
pub mod requests;
pub mod scan;
pub mod udiff;
pub mod xattr;

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::plan::{Layer, Plan};

/// `$XDG_STATE_HOME/airlock/changes`, else `~/.local/state/airlock/changes`.
pub fn changes_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").map(PathBuf::from) {
        Some(d) if d.is_absolute() => d,
        _ => {
            let home = std::env::var_os("HOME").context("HOME is not set")?;
            PathBuf::from(home).join(".local/state")
        }
    };
    Ok(base.join("airlock/changes"))
}

/// The changes directory, made 0700 if absent and checked to be ours and
/// a plain directory (a link there could send a changeset elsewhere).
fn own_changes_dir() -> Result<PathBuf> {
    let dir = changes_dir()?;
    crate::paths::own_private_dir(&dir)?;
    Ok(crate::resolve::canonical(&dir).unwrap_or(dir))
}

/// A changeset's id: 8 hex digits, the only names `changes` accepts.
pub fn valid_id(id: &str) -> bool {
    id.len() == 8
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// The changeset's record, `meta.json` in its directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub id: String,
    /// When the sandbox started (before it existed), as (seconds, nanos)
    /// since the epoch: a host file changed after this conflicts.
    pub started: (u64, u32),
    pub argv: Vec<String>,
    pub workspace: PathBuf,
    pub home: PathBuf,
    /// The layered roots; layer `n` lives in `layers/<n>`.
    pub roots: Vec<PathBuf>,
    /// The protected set as the run computed it (SPEC §4.5), with what
    /// lies below each.
    pub protected: Vec<PathBuf>,
    /// The protected paths that are one node (a repository's git
    /// directory): replacing or deleting it, or deleting what is below
    /// it, is protected; what git writes in it as it commits (objects,
    /// refs, logs, the index) is not, as in a run without review
    /// (harness round 12: a commit made in review was held back whole).
    /// Its configuration and hooks are in `protected` on their own.
    #[serde(default)]
    pub protected_nodes: Vec<PathBuf>,
    /// "running" until the sandbox has ended and the changeset was
    /// scanned; then "held".
    pub state: String,
    /// What the scan found, in apply order, with the host's state of each
    /// path when the sandbox ended.
    #[serde(default)]
    pub entries: Vec<scan::Entry>,
    /// The session this changeset belongs to (`session start --review`):
    /// held, and so appliable, only once that session has ended.
    #[serde(default)]
    pub session: Option<String>,
    /// The airlock that runs it (pid, start time in clock ticks since
    /// boot): once that process is gone while the changeset is still
    /// "running", it was killed, and the next airlock finishes its scan.
    #[serde(default)]
    pub owner: Option<(u32, u64)>,
}

impl Meta {
    /// Whether the airlock that ran this changeset is gone (a pid reused
    /// since has another start time).
    fn owner_gone(&self) -> bool {
        self.owner
            .is_some_and(|(pid, start)| start_time(pid) != Some(start))
    }

    pub fn started_time(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::new(self.started.0, self.started.1)
    }
}

pub struct Changeset {
    pub dir: PathBuf,
    pub meta: Meta,
}

pub fn layer_dir(dir: &Path, n: usize) -> PathBuf {
    dir.join("layers").join(n.to_string())
}

impl Changeset {
    pub fn open(id: &str) -> Result<Changeset> {
        if !valid_id(id) {
            bail!("{id:?} is not a changeset id (8 hex digits; see `airlock changes list`)");
        }
        let dir = changes_dir()?.join(id);
        let text = std::fs::read(dir.join("meta.json"))
            .with_context(|| format!("no changeset {id} (see `airlock changes list`)"))?;
        let meta: Meta =
            serde_json::from_slice(&text).with_context(|| format!("reading changeset {id}"))?;
        check_meta(&meta).with_context(|| {
            format!("changeset {id} is refused: its record is not one airlock wrote")
        })?;
        Ok(Changeset { dir, meta })
    }

    pub fn upper(&self, root: usize) -> PathBuf {
        layer_dir(&self.dir, root).join("upper")
    }

    pub fn save(&self) -> Result<()> {
        let tmp = self.dir.join("meta.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&self.meta)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.dir.join("meta.json")).context("saving the changeset")
    }

    /// Remove it all. The kernel leaves overlayfs's `work/work` mode 0000,
    /// and the sandbox may have left directories it cannot list: each
    /// directory is opened up before it is emptied (links never followed).
    pub fn remove(&self) -> Result<()> {
        remove_tree(&self.dir).with_context(|| format!("removing {}", self.dir.display()))
    }

    /// An empty changeset is renamed out of the way (one system call on
    /// the run's exit path) and removed by a later review run, in the
    /// background while its sandbox starts; `changes` never lists it (not
    /// an id). Removed now when it cannot be renamed.
    pub fn remove_later(&self) {
        let gone = self.dir.with_file_name(format!("{GONE}{}", self.meta.id));
        if std::fs::rename(&self.dir, &gone).is_err() {
            let _ = self.remove();
        }
    }
}

/// The name an empty changeset is renamed to before it is removed.
const GONE: &str = ".gone-";

/// Remove, in a thread, the empty changesets earlier runs set aside.
fn sweep_gone(changes: &Path) {
    let Ok(rd) = std::fs::read_dir(changes) else {
        return;
    };
    let gone: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(GONE)))
        .map(|e| e.path())
        .collect();
    if gone.is_empty() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("changes-sweep".into())
        .spawn(move || {
            for g in gone {
                let _ = remove_tree(&g);
            }
        });
}

/// A record a sandbox could have rewritten (its state directory is
/// read-only to every sandbox, but defence in depth): every root is what a
/// run layers, an absolute directory of the user's (not a link), never a
/// git directory or inside one, nor inside `.airlock` or airlock's own
/// directories, where nothing is ever held for review; every entry names
/// one of them by index.
fn check_meta(meta: &Meta) -> Result<()> {
    use std::path::Component;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let own: Vec<PathBuf> = crate::places::own_state_dirs()
        .into_iter()
        .chain(crate::places::user_policy_path().and_then(|p| p.parent().map(Path::to_path_buf)))
        .collect();
    for r in &meta.roots {
        let shown = crate::text::shown(r);
        let m = std::fs::symlink_metadata(r)
            .with_context(|| format!("its root {shown} cannot be read"))?;
        if !r.is_absolute() || !m.is_dir() || (uid != 0 && m.uid() != uid) {
            bail!("its root {shown} is not a directory of yours");
        }
        let odd = r.components().any(|c| match c {
            Component::Normal(n) => n == ".git" || n == ".airlock",
            Component::RootDir => false,
            _ => true,
        });
        let git_dir = r.join("HEAD").exists() && r.join("objects").is_dir();
        if odd || git_dir || own.iter().any(|o| crate::paths::under(r, o)) {
            bail!("its root {shown} is a place no run holds for review");
        }
    }
    if let Some(e) = meta.entries.iter().find(|e| e.root >= meta.roots.len()) {
        bail!("its entry {} names no root", crate::text::shown(&e.rel));
    }
    Ok(())
}

pub fn remove_tree(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = match std::fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(p);
    }
    if meta.mode() & 0o700 != 0o700 {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))?;
    }
    for e in std::fs::read_dir(p)? {
        remove_tree(&e?.path())?;
    }
    std::fs::remove_dir(p)
}

/// Before the sandbox starts: make the changeset, layer the outermost
/// writable roots on it, and hide it from the sandbox. Refuses (the run
/// then exits 125) where a root cannot be layered; never writes through.
pub fn prepare(plan: &mut Plan, workspace: &Path, home: &Path) -> Result<Changeset> {
    let changes = own_changes_dir()?;
    // The outermost roots: a root inside another is in that one's layer.
    let mut roots: Vec<PathBuf> = vec![];
    for w in &plan.write {
        if !plan.write.iter().any(|o| crate::paths::below(w, o)) && !roots.contains(w) {
            roots.push(w.clone());
        }
    }
    for r in &roots {
        if crate::paths::under(&changes, r) {
            bail!(
                "--review: the changesets' directory {} lies inside the writable root {}, where the sandbox could reach it; set XDG_STATE_HOME outside it",
                changes.display(),
                r.display()
            );
        }
        if crate::paths::under(r, &changes) {
            bail!(
                "--review: the writable root {} lies inside the changesets' directory",
                r.display()
            );
        }
        if !std::fs::symlink_metadata(r).is_ok_and(|m| m.is_dir()) {
            bail!(
                "--review: the writable root {} is not a directory; only directories can be held for review",
                r.display()
            );
        }
    }
    sweep_gone(&changes);
    let mut id = String::new();
    let mut dir = PathBuf::new();
    for _ in 0..16 {
        let mut b = [0u8; 4];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
            .map_err(|_| anyhow::anyhow!("no randomness for the changeset's id"))?;
        id = b.iter().map(|x| format!("{x:02x}")).collect();
        dir = changes.join(&id);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    // The start by the file systems' own clock (a coarse one, which may
    // lag the wall clock by a tick): the changeset directory's birth,
    // read before anything is made in it. A host file whose ctime is not
    // before it may have changed after the sandbox read it.
    let born =
        std::fs::symlink_metadata(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let started = (
        born.ctime().max(0) as u64,
        born.ctime_nsec().clamp(0, 999_999_999) as u32,
    );
    let mut layers = vec![];
    for (n, r) in roots.iter().enumerate() {
        let base = layer_dir(&dir, n);
        for sub in ["upper", "work"] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(base.join(sub))
                .with_context(|| format!("creating {}", base.join(sub).display()))?;
        }
        // The upper layer's root takes the root's mode: overlayfs shows
        // the upper directory's attributes for the merged root.
        if let Ok(m) = std::fs::metadata(r) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(
                base.join("upper"),
                std::fs::Permissions::from_mode(m.mode() & 0o7777),
            );
        }
        layers.push(Layer {
            root: r.clone(),
            upper: base.join("upper"),
            work: base.join("work"),
        });
    }
    // The changesets are never the sandbox's to read or write.
    plan.deny_read.push(changes);
    plan.deny_read.sort();
    plan.deny_read.dedup();
    plan.review = layers;
    let cs = Changeset {
        dir,
        meta: Meta {
            id,
            started,
            argv: plan.argv.clone(),
            workspace: workspace.to_path_buf(),
            home: home.to_path_buf(),
            roots,
            protected: plan
                .protected
                .iter()
                .filter(|p| p.deep)
                .map(crate::plan::protected::Protected::path)
                .chain(plan.deny_write.iter().cloned())
                .collect(),
            protected_nodes: plan
                .protected
                .iter()
                .filter(|p| !p.deep)
                .map(crate::plan::protected::Protected::path)
                .collect(),
            state: "running".into(),
            entries: vec![],
            session: None,
            owner: start_time(std::process::id()).map(|t| (std::process::id(), t)),
        },
    };
    cs.save()?;
    Ok(cs)
}

/// A live process's start time (field 22 of /proc/PID/stat), in clock
/// ticks; `None` for one gone or a zombie (dead, not yet reaped).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Finish the changesets of runs (and sessions) whose airlock was killed:
/// scanned and held for review as a run that ended would have left them,
/// or removed when empty. Said on stderr for each.
pub fn recover() {
    let Ok(dir) = changes_dir() else { return };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let Some(id) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(cs) = Changeset::open(&id) else {
            continue;
        };
        let live_session = cs
            .meta
            .session
            .as_deref()
            .is_some_and(crate::session::running);
        if cs.meta.state == "running" && cs.meta.owner_gone() && !live_session {
            eprintln!("airlock: finishing the changeset {id}, whose airlock was killed");
            abandon(&cs.dir);
        }
    }
}

/// Once every process of the sandbox is gone: scan the layers, record
/// the host's state of every path they touch, and say on stderr what is
/// held. An empty changeset is removed.
/// Returns what it holds, for the report (`None`: nothing is held).
pub fn finish(mut cs: Changeset, quiet: bool) -> Option<serde_json::Value> {
    // Held requests (SPEC §4.8) keep the changeset even with no file.
    let held = match requests::load(&cs.dir) {
        Ok(h) => h,
        Err(e) => {
            eprintln!(
                "airlock: error: the changeset {}'s held requests could not be read ({e:#}); it is kept in {}",
                cs.meta.id,
                cs.dir.display()
            );
            return None;
        }
    };
    let entries = match scan::scan(&cs) {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "airlock: error: the changeset {} could not be read ({e:#}); it is kept in {}",
                cs.meta.id,
                cs.dir.display()
            );
            return None;
        }
    };
    if entries.is_empty() && held.is_empty() {
        cs.remove_later();
        if !quiet {
            eprintln!("airlock: --review: the run changed no files and sent no request that needed review; nothing is held");
        }
        return None;
    }
    cs.meta.entries = entries;
    cs.meta.state = "held".into();
    if let Err(e) = cs.save() {
        eprintln!("airlock: error: {e:#}");
        return None;
    }
    let id = &cs.meta.id;
    let said = summary(&cs);
    eprintln!(
        "airlock: held for review as {id}: {said}; airlock changes diff {id} / apply {id} / discard {id}"
    );
    Some(serde_json::json!({
        "changeset": id,
        "summary": said,
        "files": cs.meta.entries.len(),
        "requests": held
            .iter()
            .map(|r| serde_json::json!({"method": r.method, "url": r.url, "size": r.size, "why": r.why}))
            .collect::<Vec<_>>(),
        "apply": format!("airlock changes apply {id}"),
        "discard": format!("airlock changes discard {id}"),
    }))
}

/// What a changeset holds: its files, and its requests when it has any.
pub fn summary(cs: &Changeset) -> String {
    let files = scan::summary(&cs.meta.entries);
    match requests::load(&cs.dir)
        .ok()
        .and_then(|r| requests::summary(&r))
    {
        Some(r) => format!("{files}, {r}"),
        None => files,
    }
}

/// The run failed before its changeset was scanned: removed when nothing
/// landed in it, else left for `changes list` to show.
pub fn abandon(dir: &Path) {
    let Some(id) = dir.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let Ok(cs) = Changeset::open(id) else {
        return;
    };
    if cs.meta.state != "running" {
        return;
    }
    let held = requests::load(&cs.dir).map_or(true, |h| !h.is_empty());
    match scan::scan(&cs) {
        Ok(e) if e.is_empty() && !held => {
            let _ = cs.remove();
        }
        _ => {
            finish(cs, true);
        }
    }
}
