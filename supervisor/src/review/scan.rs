//! Reading a changeset's upper layers as changes to the host: overlayfs
//! under `userxattr` marks a deletion with a 0/0 character device (a
//! whiteout) and a directory that hides everything below it in the host
//! with `user.overlay.opaque`; redirects and metacopy are off, so a
//! renamed directory is a whiteout and a full copy, and a file's content
//! is always whole in the upper layer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Changeset;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    Deleted,
    Created,
    Modified,
    /// Only the permission bits changed.
    Mode,
    /// Only the `user.*` extended attributes changed.
    Xattr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A fifo, socket or device node: shown, never applied.
    Special,
}

/// A host path's state, to tell later whether the host changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    pub kind: Kind,
    pub ino: u64,
    pub size: u64,
    pub mode: u32,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// The index of the writable root (`Meta::roots`).
    pub root: usize,
    /// Below the root.
    pub rel: PathBuf,
    pub change: Change,
    /// What the path becomes (for a deletion: what it was).
    pub kind: Kind,
    /// Permission bits it gets (files, directories).
    pub mode: u32,
    /// The host's state of the path when the sandbox ended.
    pub host: Option<Host>,
    /// Obeyed or run by a host tool (SPEC §4.5): applied only when named.
    pub protected: bool,
    /// A symlink's target.
    #[serde(default)]
    pub target: Option<PathBuf>,
    /// A hard link the run made: the same file as this earlier entry.
    #[serde(default)]
    pub link_of: Option<PathBuf>,
    /// A created file whose content is that of a deleted one.
    #[serde(default)]
    pub renamed_from: Option<PathBuf>,
}

pub fn host_state(p: &Path) -> Option<Host> {
    let m = std::fs::symlink_metadata(p).ok()?;
    let t = m.file_type();
    let kind = if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File
    } else if t.is_symlink() {
        Kind::Symlink
    } else {
        Kind::Special
    };
    Some(Host {
        kind,
        ino: m.ino(),
        size: m.size(),
        mode: m.mode() & 0o7777,
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

fn is_opaque(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()))
    else {
        return false;
    };
    let mut buf = [0u8; 4];
    // SAFETY: a NUL-terminated path and a buffer of the size given.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n >= 1 && buf[0] == b'y'
}

/// Whether two regular files have the same content.
pub fn same_content(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) else {
        return false;
    };
    if ma.len() != mb.len() || !ma.is_file() || !mb.is_file() {
        return false;
    }
    let (Ok(mut fa), Ok(mut fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else {
        return false;
    };
    let (mut ba, mut bb) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = match fa.read(&mut ba) {
            Ok(n) => n,
            Err(_) => return false,
        };
        if n == 0 {
            return fb.read(&mut bb[..1]).is_ok_and(|m| m == 0);
        }
        if fb.read_exact(&mut bb[..n]).is_err() || ba[..n] != bb[..n] {
            return false;
        }
    }
}

struct Walk<'a> {
    root_idx: usize,
    root: &'a Path,
    upper: &'a Path,
    out: Vec<Entry>,
    /// Upper inode of each regular file with more than one link.
    links: HashMap<u64, Vec<PathBuf>>,
    /// The modes the sandbox gave what `open_up` opened to its owner.
    modes: BTreeMap<PathBuf, u32>,
    /// Host paths of the directories git could take as git directories
    /// once the changeset is applied (the post-run check's rule,
    /// plan/protected.rs), and the common directories they name.
    git_dirs: BTreeSet<PathBuf>,
}

impl Walk<'_> {
    fn push(&mut self, rel: PathBuf, change: Change, kind: Kind, mode: u32) -> &mut Entry {
        let host = host_state(&self.root.join(&rel));
        self.out.push(Entry {
            root: self.root_idx,
            rel,
            change,
            kind,
            mode,
            host,
            protected: false,
            target: None,
            link_of: None,
            renamed_from: None,
        });
        self.out.last_mut().expect("just pushed")
    }

    /// Whether directory `rel` is one git could take as a git directory in
    /// the host's tree as it would be after apply: a `HEAD` in the layer
    /// (any, a whiteout too) or in the host. Every directory a changed
    /// path lies in is in the layer, so each is looked at here. Its common
    /// directory, as the layer's or the host's `commondir` names it, is
    /// one too: git reads the configuration there.
    fn git_dir(&mut self, rel: &Path, names: &BTreeSet<std::ffi::OsString>) {
        use crate::plan::protected::{git_joined, git_path_file, GIT_DIR_MARK};
        let host = self.root.join(rel);
        let marked = names.contains(std::ffi::OsStr::new(GIT_DIR_MARK))
            || std::fs::symlink_metadata(host.join(GIT_DIR_MARK)).is_ok();
        if !marked {
            return;
        }
        let named = [
            git_path_file(&self.upper.join(rel).join("commondir"), false),
            git_path_file(&host.join("commondir"), true),
        ];
        for raw in named.into_iter().flatten() {
            let common = crate::paths::lexical(&git_joined(&host, raw));
            self.git_dirs
                .insert(crate::resolve::canonical(&common).unwrap_or(common));
        }
        self.git_dirs.insert(host);
    }

    fn dir(&mut self, rel: &Path, opaque: bool) -> std::io::Result<()> {
        let up = self.upper.join(rel);
        let names: BTreeSet<std::ffi::OsString> = std::fs::read_dir(&up)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        self.git_dir(rel, &names);
        if opaque {
            // Everything the host had here is hidden: each is deleted.
            if let Ok(host) = std::fs::read_dir(self.root.join(rel)) {
                let mut gone: Vec<_> = host
                    .flatten()
                    .map(|e| e.file_name())
                    .filter(|n| !names.contains(n))
                    .collect();
                gone.sort();
                for n in gone {
                    let r = rel.join(n);
                    if let Some(h) = host_state(&self.root.join(&r)) {
                        self.push(r, Change::Deleted, h.kind, h.mode);
                    }
                }
            }
        }
        for name in names {
            let r = rel.join(&name);
            let u = up.join(&name);
            let m = std::fs::symlink_metadata(&u)?;
            let t = m.file_type();
            let mode = self.modes.get(&r).copied().unwrap_or(m.mode() & 0o7777);
            let host = host_state(&self.root.join(&r));
            // A path whose kind changes is a deletion, then a creation.
            let replaced = |k: Kind| host.as_ref().is_some_and(|h| h.kind != k);
            if t.is_char_device() && m.rdev() == 0 {
                if let Some(h) = host {
                    self.push(r, Change::Deleted, h.kind, h.mode);
                }
            } else if t.is_dir() {
                let opaque_here = opaque || is_opaque(&u);
                match &host {
                    None => {
                        self.push(r.clone(), Change::Created, Kind::Dir, mode);
                    }
                    Some(h) if h.kind != Kind::Dir => {
                        self.push(r.clone(), Change::Deleted, h.kind, h.mode);
                        self.push(r.clone(), Change::Created, Kind::Dir, mode);
                    }
                    Some(h) if h.mode != mode => {
                        self.push(r.clone(), Change::Mode, Kind::Dir, mode);
                    }
                    Some(_) if super::xattr::differ(&u, &self.root.join(&r)) => {
                        self.push(r.clone(), Change::Xattr, Kind::Dir, mode);
                    }
                    Some(_) => {}
                }
                self.dir(&r, opaque_here)?;
            } else if t.is_file() {
                if m.nlink() > 1 {
                    self.links.entry(m.ino()).or_default().push(r.clone());
                }
                match &host {
                    None => {
                        self.push(r, Change::Created, Kind::File, mode);
                    }
                    Some(h) if h.kind != Kind::File => {
                        self.push(r.clone(), Change::Deleted, h.kind, h.mode);
                        self.push(r, Change::Created, Kind::File, mode);
                    }
                    Some(h) => {
                        if !same_content(&u, &self.root.join(&r)) {
                            self.push(r, Change::Modified, Kind::File, mode);
                        } else if h.mode != mode {
                            self.push(r, Change::Mode, Kind::File, mode);
                        } else if super::xattr::differ(&u, &self.root.join(&r)) {
                            self.push(r, Change::Xattr, Kind::File, mode);
                        }
                    }
                }
            } else if t.is_symlink() {
                let target = std::fs::read_link(&u)?;
                let before = std::fs::read_link(self.root.join(&r)).ok();
                let change = match &host {
                    None => Change::Created,
                    Some(h) if replaced(Kind::Symlink) => {
                        self.push(r.clone(), Change::Deleted, h.kind, h.mode);
                        Change::Created
                    }
                    Some(_) if before.as_ref() == Some(&target) => continue,
                    Some(_) => Change::Modified,
                };
                self.push(r, change, Kind::Symlink, 0o777).target = Some(target);
            } else {
                if let Some(h) = &host {
                    self.push(r.clone(), Change::Deleted, h.kind, h.mode);
                }
                self.push(r, Change::Created, Kind::Special, mode);
            }
        }
        Ok(())
    }
}

/// Whether `path` (a host path) is one a host tool obeys or runs (SPEC
/// §4.5): in the run's protected set, a name of a project's surface at
/// any depth (a nested project's `.envrc` or `lefthook.yml` too), a `.git`
/// directory's surface (a new `.git` whole), or a start-up file in HOME.
/// (A git directory under another name is known only from the changeset:
/// [`scan`] marks those.)
pub fn is_protected(path: &Path, protected: &[PathBuf], home: &Path) -> bool {
    use crate::plan::protected::ROOT_SURFACE;
    use crate::plan::protected::{in_git_dir_surface, project_surface, DOT_GIT, HOME_SURFACE};
    if protected.iter().any(|p| crate::paths::under(path, p)) {
        return true;
    }
    let comps: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for (i, c) in comps.iter().enumerate() {
        let rest: PathBuf = comps[i + 1..].iter().collect();
        if *c == DOT_GIT {
            if rest.as_os_str().is_empty()
                || in_git_dir_surface(&rest)
                || crate::plan::protected::in_git_dir_state(&rest)
            {
                return true;
            }
        } else if ROOT_SURFACE.iter().any(|s| *c == *s) {
            return true;
        } else {
            let here: PathBuf = comps[i..].iter().collect();
            if project_surface().any(|s| here.starts_with(s)) {
                return true;
            }
        }
    }
    if crate::plan::protected::redirects_tool_path(path) {
        return true;
    }

    match path.strip_prefix(home) {
        Ok(rel) => HOME_SURFACE.iter().any(|s| rel.starts_with(s)),
        Err(_) => false,
    }
}

/// Make everything in the upper layer readable to its owner (airlock's
/// user), and each directory searchable: the sandbox may have left a
/// directory mode 000 or a file 000, which an ordinary user could then
/// neither scan, diff nor apply. The modes the sandbox gave are kept in
/// `modes.json` beside the layer (a second scan reads them there) and
/// are the ones recorded and applied. Links are never followed.
fn open_up(layer: &Path, upper: &Path) -> anyhow::Result<BTreeMap<PathBuf, u32>> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    let file = layer.join("modes.json");
    let mut modes: BTreeMap<PathBuf, u32> = match std::fs::read(&file) {
        Ok(b) => serde_json::from_slice(&b).context("reading modes.json")?,
        Err(_) => BTreeMap::new(),
    };
    let before = modes.len();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let r = rel.join(e.file_name());
            let m = e.metadata()?;
            let mode = m.mode() & 0o7777;
            let need = if m.is_dir() {
                stack.push(r.clone());
                0o700
            } else if m.is_file() {
                0o600
            } else {
                continue;
            };
            if mode & need != need {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode | need))
                    .with_context(|| format!("opening up {}", e.path().display()))?;
                modes.entry(r).or_insert(mode);
            }
        }
    }
    if modes.len() != before {
        std::fs::write(&file, serde_json::to_vec(&modes)?)
            .with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(modes)
}

/// Whether `path` is part of the surface of one of `git_dirs` (a bare
/// repository, a worktree's or submodule's git directory under any name,
/// a common directory): what the host's git would read or run there.
fn in_a_git_dir_surface(path: &Path, git_dirs: &BTreeSet<PathBuf>) -> bool {
    path.ancestors().skip(1).any(|dir| {
        git_dirs.contains(dir)
            && path.strip_prefix(dir).is_ok_and(|r| {
                crate::plan::protected::in_git_dir_surface(r)
                    || crate::plan::protected::in_git_dir_state(r)
            })
    })
}

/// A `HEAD` the run created makes its directory one git takes as a git
/// directory, whose configuration (applied before, in another changeset,
/// or by a one-shot run) git would then obey: it is applied only when
/// named. A `HEAD` that changes in place (a checkout) is a ref, no code.
fn makes_a_git_dir(e: &Entry) -> bool {
    e.change == Change::Created
        && e.rel.file_name() == Some(std::ffi::OsStr::new(crate::plan::protected::GIT_DIR_MARK))
}

/// Every change in the changeset, in the order apply makes them:
/// deletions (deepest first), then creations and modifications (parents
/// first).
pub fn scan(cs: &Changeset) -> anyhow::Result<Vec<Entry>> {
    let mut all = vec![];
    let mut git_dirs = BTreeSet::new();
    for (n, root) in cs.meta.roots.iter().enumerate() {
        let upper = cs.upper(n);
        let modes = open_up(&cs.dir.join("layers").join(n.to_string()), &upper)?;
        let mut w = Walk {
            root_idx: n,
            root,
            upper: &upper,
            out: vec![],
            links: HashMap::new(),
            modes,
            git_dirs: BTreeSet::new(),
        };
        w.dir(Path::new(""), false)?;
        git_dirs.append(&mut w.git_dirs);
        // Hard links made in the run: the other names link to one that
        // the host already has (a name the run left as it was, or
        // changed in place), else to the first created.
        let created: BTreeSet<&PathBuf> = w
            .out
            .iter()
            .filter(|e| e.change == Change::Created)
            .map(|e| &e.rel)
            .collect();
        let mut firsts: HashMap<PathBuf, PathBuf> = HashMap::new();
        for names in w.links.values_mut() {
            names.sort();
            let first = names
                .iter()
                .find(|n| !created.contains(n))
                .unwrap_or(&names[0])
                .clone();
            for other in names.iter().filter(|n| **n != first) {
                firsts.insert(other.clone(), first.clone());
            }
        }
        for e in &mut w.out {
            if e.kind == Kind::File && e.change != Change::Deleted {
                e.link_of = firsts.get(&e.rel).cloned();
            }
        }
        all.append(&mut w.out);
    }
    // Renames: a created file with the content of a deleted one.
    let deleted: Vec<(usize, PathBuf, u64)> = all
        .iter()
        .filter(|e| e.change == Change::Deleted && e.kind == Kind::File)
        .filter_map(|e| Some((e.root, e.rel.clone(), e.host.as_ref()?.size)))
        .collect();
    if deleted.len() <= 10_000 {
        let mut taken = BTreeSet::new();
        for e in all.iter_mut() {
            if e.change != Change::Created || e.kind != Kind::File || e.link_of.is_some() {
                continue;
            }
            let upper = super::layer_dir(&cs.dir, e.root).join("upper").join(&e.rel);
            let size = std::fs::symlink_metadata(&upper).map_or(u64::MAX, |m| m.len());
            if size == 0 {
                continue;
            }
            let root = &cs.meta.roots[e.root];
            if let Some((_, rel, _)) = deleted.iter().find(|(r, rel, s)| {
                *r == e.root
                    && *s == size
                    && !taken.contains(rel)
                    && same_content(&upper, &root.join(rel))
            }) {
                taken.insert(rel.clone());
                e.renamed_from = Some(rel.clone());
            }
        }
    }
    for e in all.iter_mut() {
        let path = cs.meta.roots[e.root].join(&e.rel);
        e.protected = is_protected(&path, &cs.meta.protected, &cs.meta.home)
            || in_a_git_dir_surface(&path, &git_dirs)
            || makes_a_git_dir(e)
            // A link made where a directory of files that redirect a host
            // tool would be: what it leads to is read through it (red
            // team round 14).
            || (e.kind == Kind::Symlink
                && e.rel.file_name().is_some_and(crate::plan::protected::redirect_dir))
            // An index marking files skip-worktree or assume-unchanged,
            // which hides their changes from git status (red team round 17).
            || (e.kind == Kind::File
                && e.rel.file_name().is_some_and(|n| n == "index")
                && std::fs::read(cs.upper(e.root).join(&e.rel))
                    .is_ok_and(|b| !crate::integrity::nested::index_hidden(&b).is_empty()))
            // A replace ref written into `packed-refs` (red team round 16).
            || (e.kind == Kind::File
                && e.rel.file_name().is_some_and(|n| n == "packed-refs")
                && std::fs::read(cs.upper(e.root).join(&e.rel))
                    .is_ok_and(|t| memchr::memmem::find(&t, b" refs/replace/").is_some()))
            || cs.meta.protected_nodes.iter().any(|n| {
                *n == path || (e.change == Change::Deleted && crate::paths::under(&path, n))
            });
    }
    // Below a protected path the run created (a new repository), all is.
    let created_protected: Vec<(usize, PathBuf)> = all
        .iter()
        .filter(|e| e.protected && e.change == Change::Created && e.kind == Kind::Dir)
        .map(|e| (e.root, e.rel.clone()))
        .collect();
    for e in all.iter_mut() {
        if created_protected
            .iter()
            .any(|(r, p)| *r == e.root && e.rel.starts_with(p))
        {
            e.protected = true;
        }
    }
    // Apply order: deletions deepest first, the rest parents first.
    let (mut del, mut rest): (Vec<Entry>, Vec<Entry>) =
        all.into_iter().partition(|e| e.change == Change::Deleted);
    del.sort_by(|a, b| (b.root, &b.rel).cmp(&(a.root, &a.rel)));
    rest.sort_by(|a, b| (a.root, &a.rel).cmp(&(b.root, &b.rel)));
    del.append(&mut rest);
    Ok(del)
}

/// "N files changed, M created, K deleted" (and what more there is).
pub fn summary(entries: &[Entry]) -> String {
    let count = |f: &dyn Fn(&Entry) -> bool| entries.iter().filter(|e| f(e)).count();
    let changed = count(&|e| matches!(e.change, Change::Modified | Change::Mode | Change::Xattr));
    let renamed = count(&|e| e.renamed_from.is_some());
    let created = count(&|e| e.change == Change::Created && e.kind != Kind::Dir) - renamed;
    let deleted = count(&|e| e.change == Change::Deleted) - renamed;
    let dirs = count(&|e| e.change == Change::Created && e.kind == Kind::Dir);
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut s = format!(
        "{} changed, {created} created, {deleted} deleted",
        plural(changed, "file", "files")
    );
    if renamed > 0 {
        s.push_str(&format!(", {renamed} renamed"));
    }
    if dirs > 0 {
        s.push_str(&format!(
            ", {} created",
            plural(dirs, "directory", "directories")
        ));
    }
    let protected = count(&|e| e.protected);
    if protected > 0 {
        s.push_str(&format!(
            ", {protected} protected (applied only when named)"
        ));
    }
    let special = count(&|e| e.kind == Kind::Special && e.change == Change::Created);
    if special > 0 {
        s.push_str(&format!(
            ", {} (never applied)",
            plural(special, "special file", "special files")
        ));
    }
    s
}
