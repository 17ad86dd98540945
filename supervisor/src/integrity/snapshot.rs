//! Recording the protected set before a run and finding what changed after
//! it. Every path is reached from its writable root one component at a
//! time, never following a link, so a link the sandbox planted is seen as a
//! link, not as what it points to.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};

use crate::plan::protected::Protected;

/// Files at most this large are kept, so they can be restored.
const KEEP_BYTES: i64 = 256 * 1024;
/// Entries recorded below one protected directory, at most.
const MAX_NODES: usize = 4096;

/// What one path was.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum State {
    Absent,
    /// An ancestor below the root is not a plain directory (a link, a file):
    /// the path cannot be reached without following something.
    Blocked,
    File {
        id: Id,
        mode: u32,
        content: Option<Vec<u8>>,
    },
    Link {
        id: Id,
        target: OsString,
    },
    Dir {
        id: Id,
        mode: u32,
        #[serde(with = "pairs")]
        entries: BTreeMap<OsString, State>,
        /// More entries than were recorded.
        truncated: bool,
    },
    Other {
        id: Id,
    },
}

/// Directory entries as a list of pairs: JSON keys must be strings, and a
/// name need not be UTF-8.
mod pairs {
    use std::collections::BTreeMap;
    use std::ffi::OsString;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::State;

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<OsString, State>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        m.iter().collect::<Vec<_>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<OsString, State>, D::Error> {
        Ok(Vec::<(OsString, State)>::deserialize(d)?
            .into_iter()
            .collect())
    }
}

/// What identifies one version of an inode: a change to content, name
/// or metadata moves `ctime`, which user space cannot set back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Id {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
    size: i64,
}

impl State {
    /// The device and inode it had, where it existed.
    pub fn inode(&self) -> Option<(u64, u64)> {
        match self {
            State::File { id, .. }
            | State::Link { id, .. }
            | State::Dir { id, .. }
            | State::Other { id } => Some((id.dev, id.ino)),
            State::Absent | State::Blocked => None,
        }
    }
}

impl Id {
    /// What a record of an item's identity knew (its size unknown).
    pub fn recorded(dev: u64, ino: u64, ctime: (i64, i64)) -> Id {
        Id {
            dev,
            ino,
            ctime,
            size: -1,
        }
    }

    // `st_dev` is an i32 on macOS.
    #[allow(clippy::unnecessary_cast)]
    fn of(st: &FileStat) -> Id {
        Id {
            dev: st.st_dev as u64,
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            size: st.st_size,
        }
    }
}

/// Open a directory below `dir` without following a link.
pub fn open_dir<Fd: AsFd>(dir: Fd, name: &Path) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

pub fn open_root(root: &Path) -> nix::Result<OwnedFd> {
    open_dir(AT_FDCWD, root)
}

/// The parent directory of `rel` below `root`, reached without links.
pub enum Parent {
    Fd(OwnedFd),
    Absent,
    /// The component at this prefix is not a plain directory.
    Blocked(PathBuf),
}

pub fn walk_to_parent(root: &OwnedFd, rel: &Path) -> nix::Result<Parent> {
    let comps: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut fd = nix::unistd::dup(root)?;
    let mut prefix = PathBuf::new();
    for c in comps.iter().take(comps.len().saturating_sub(1)) {
        prefix.push(c);
        match open_dir(&fd, Path::new(c)) {
            Ok(next) => fd = next,
            Err(Errno::ENOENT) => return Ok(Parent::Absent),
            Err(Errno::ELOOP | Errno::ENOTDIR) => return Ok(Parent::Blocked(prefix)),
            Err(e) => return Err(e),
        }
    }
    Ok(Parent::Fd(fd))
}

fn file_name(rel: &Path) -> &std::ffi::OsStr {
    rel.file_name().unwrap_or(rel.as_os_str())
}

// `st_mode` is a u16 on macOS.
#[allow(clippy::useless_conversion)]
/// Record the entry `name` in `dir` (with a budget of 0, a directory's
/// entries are not recorded).
fn record<Fd: AsFd + Copy>(
    dir: Fd,
    name: &std::ffi::OsStr,
    budget: &mut usize,
    keep: bool,
) -> State {
    let st = match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(_) => return State::Absent,
    };
    let deep = *budget > 0;
    *budget = budget.saturating_sub(1);
    let id = Id::of(&st);
    let mode = u32::from(st.st_mode) & 0o7777;
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => {
            let content = (keep && st.st_size <= KEEP_BYTES)
                .then(|| {
                    openat(
                        dir,
                        name,
                        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
                        Mode::empty(),
                    )
                    .ok()
                    .and_then(|fd| {
                        let mut f = std::fs::File::from(fd);
                        let mut buf = vec![];
                        std::io::Read::read_to_end(&mut f, &mut buf).ok()?;
                        Some(buf)
                    })
                })
                .flatten();
            State::File { id, mode, content }
        }
        SFlag::S_IFLNK => State::Link {
            id,
            target: readlinkat(dir, name).unwrap_or_default(),
        },
        SFlag::S_IFDIR => {
            let mut entries = BTreeMap::new();
            let mut truncated = !deep;
            if !deep {
            } else if let Ok(fd) = open_dir(dir, Path::new(name)) {
                for n in list(&fd) {
                    if *budget == 0 {
                        truncated = true;
                        break;
                    }
                    let s = record(&fd, &n, budget, keep);
                    entries.insert(n, s);
                }
            }
            State::Dir {
                id,
                mode,
                entries,
                truncated,
            }
        }
        _ => State::Other { id },
    }
}

/// The names in a directory we hold open.
pub fn list(dir: &OwnedFd) -> Vec<OsString> {
    let mut names: Vec<OsString> = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The state of one protected path now, below its root opened as `root`
/// (`None`: it could not be).
fn state_in(root: Option<&OwnedFd>, p: &Protected) -> State {
    let Some(root) = root else {
        return State::Blocked;
    };
    let mut budget = if p.deep { MAX_NODES } else { 0 };
    // Most protected paths are a name in their root (`.envrc`, `.git`).
    if p.rel.components().count() == 1 {
        return record(root, file_name(&p.rel), &mut budget, !p.hidden);
    }
    match walk_to_parent(root, &p.rel) {
        Ok(Parent::Fd(fd)) => record(&fd, file_name(&p.rel), &mut budget, !p.hidden),
        Ok(Parent::Absent) => State::Absent,
        Ok(Parent::Blocked(_)) | Err(_) => State::Blocked,
    }
}

/// The state of each of `set` now, each root opened once.
fn states<'a>(set: impl Iterator<Item = &'a Protected>) -> Vec<State> {
    let mut roots: std::collections::HashMap<&Path, Option<OwnedFd>> = Default::default();
    set.map(|p| {
        let root = roots
            .entry(p.root.as_path())
            .or_insert_with(|| open_root(&p.root).ok());
        state_in(root.as_ref(), p)
    })
    .collect()
}

/// The protected set as it was before the run.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub entries: Vec<(Protected, State)>,
}

pub fn take(set: &[Protected]) -> Snapshot {
    Snapshot {
        entries: set.iter().cloned().zip(states(set.iter())).collect(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Created,
    Modified,
    Removed,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Modified => "modified",
            ChangeKind::Removed => "removed",
        }
    }
}

/// One difference, at the shallowest path where before and after differ.
#[derive(Debug, Clone)]
pub struct Change {
    pub root: PathBuf,
    pub rel: PathBuf,
    pub kind: ChangeKind,
    pub before: State,
    pub git: bool,
    /// A `deny_read` path: a new one is the user's as likely as the
    /// sandbox's, and is moved only when it has another hard link.
    pub hidden: bool,
}

fn same_node(a: &State, b: &State) -> bool {
    match (a, b) {
        (
            State::Dir {
                id: x, mode: mx, ..
            },
            State::Dir {
                id: y, mode: my, ..
            },
        ) => x.dev == y.dev && x.ino == y.ino && mx == my,
        _ => a == b,
    }
}

fn diff(root: &Path, rel: &Path, git: bool, before: &State, after: &State, out: &mut Vec<Change>) {
    let change = |kind| Change {
        root: root.to_path_buf(),
        rel: rel.to_path_buf(),
        kind,
        before: before.clone(),
        git,
        hidden: false,
    };
    match (before, after) {
        (State::Absent | State::Blocked, State::Absent) | (State::Blocked, State::Blocked) => {}
        // Reachable now through a link (or past a file) the run put on the
        // way: made by the sandbox, and what acts on it is quarantined
        // (the first ancestor that is not a plain directory).
        (State::Absent, State::Blocked) => out.push(change(ChangeKind::Created)),
        // A new repository: its directory is ordinary, its configuration
        // and hooks (in the set on their own) are what is judged.
        (State::Absent, State::Dir { .. })
            if rel.file_name() == Some(std::ffi::OsStr::new(".git")) => {}
        (State::Absent | State::Blocked, _) => out.push(change(ChangeKind::Created)),
        (_, State::Absent | State::Blocked) => out.push(change(ChangeKind::Removed)),
        (
            State::Dir {
                entries: eb,
                truncated: tb,
                ..
            },
            State::Dir {
                entries: ea,
                truncated: ta,
                ..
            },
        ) if same_node(before, after) => {
            for (name, b) in eb {
                let a = ea.get(name).unwrap_or(if *ta { b } else { &State::Absent });
                diff(root, &rel.join(name), git, b, a, out);
            }
            for (name, a) in ea {
                if !eb.contains_key(name) && !*tb {
                    diff(root, &rel.join(name), git, &State::Absent, a, out);
                }
            }
        }
        _ if before == after => {}
        _ => out.push(change(ChangeKind::Modified)),
    }
}

impl Snapshot {
    /// Everything in the protected set that is not as it was.
    pub fn changes(&self) -> Vec<Change> {
        let mut out = vec![];
        let now = states(self.entries.iter().map(|(p, _)| p));
        for ((p, before), after) in self.entries.iter().zip(now) {
            let from = out.len();
            diff(&p.root, &p.rel, p.git, before, &after, &mut out);
            for c in &mut out[from..] {
                c.hidden = p.hidden;
            }
        }
        // A path and its parent can both be in the set: keep the shallowest.
        out.sort_by(|a, b| (&a.root, &a.rel).cmp(&(&b.root, &b.rel)));
        let mut kept: Vec<Change> = vec![];
        for c in out {
            if kept.iter().any(|k| {
                k.root == c.root && c.rel.starts_with(&k.rel) && k.kind != ChangeKind::Removed
            }) {
                continue;
            }
            kept.push(c);
        }
        kept
    }
}
