//! Writing a changeset through to the host (`airlock changes apply`).
//!
//! Nothing is written while any selected path conflicts: a path the host
//! changed since the run started (its ctime after the start, or its state
//! no longer the one recorded when the sandbox ended) is refused and
//! named. Each write lands by rename, so an interrupted apply leaves every
//! path either as it was or as the changeset has it; a path that already
//! is as the changeset has it counts as applied, which makes a second
//! apply finish the first. Every host path is reached from its root one
//! directory at a time without following links.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::Mode;

use super::scan::{host_state, same_content, Change, Entry, Host, Kind};
use super::Changeset;

/// Permission bits the host gets: never set-user-id or set-group-id (the
/// sandbox could otherwise plant a program that runs as its owner).
pub fn safe_mode(mode: u32) -> u32 {
    mode & 0o1777
}

fn time_of((s, ns): (i64, i64)) -> SystemTime {
    if s < 0 {
        return UNIX_EPOCH;
    }
    UNIX_EPOCH + Duration::new(s as u64, ns.clamp(0, 999_999_999) as u32)
}

/// Whether the host path already is what the entry makes it.
pub fn already(cs: &Changeset, e: &Entry) -> bool {
    let path = cs.meta.roots[e.root].join(&e.rel);
    let now = host_state(&path);
    match (e.change, e.kind) {
        // What replaced it is judged by the creation that follows.
        (Change::Deleted, _) => now.is_none_or(|h| h.kind != e.kind),
        (_, Kind::Special) => false,
        // A created directory's mode and attributes are set once what
        // goes in it is in: a second apply does that again.
        (_, Kind::Dir) => now.is_some_and(|h| {
            h.kind == Kind::Dir
                && (e.change == Change::Created
                    || (h.mode == safe_mode(e.mode)
                        && !super::xattr::differ(&cs.upper(e.root).join(&e.rel), &path)))
        }),
        (_, Kind::Symlink) => {
            now.is_some_and(|h| h.kind == Kind::Symlink)
                && std::fs::read_link(&path).ok() == e.target
        }
        (_, Kind::File) => now.is_some_and(|h| {
            h.kind == Kind::File
                && h.mode == safe_mode(e.mode)
                && same_content(&cs.upper(e.root).join(&e.rel), &path)
                && !super::xattr::differ(&cs.upper(e.root).join(&e.rel), &path)
        }),
    }
}

/// Why applying the entry would overwrite something the host changed, if
/// it would.
pub fn conflict(cs: &Changeset, e: &Entry) -> Option<String> {
    let path = cs.meta.roots[e.root].join(&e.rel);
    let now = host_state(&path);
    // Not before the start: a change in the start's own clock tick could
    // be after it (fail closed).
    let since = cs.meta.started_time();
    let same = |a: &Host, b: &Host| {
        a.kind == b.kind
            && a.ino == b.ino
            && (a.kind == Kind::Dir
                || (a.size == b.size && a.mtime == b.mtime && a.ctime == b.ctime))
    };
    match (&e.host, &now) {
        (None, None) => return None,
        (None, Some(_)) => return Some("the host created it after the run".into()),
        (Some(_), None) => return Some("the host removed it after the run".into()),
        (Some(a), Some(b)) if !same(a, b) => {
            return Some("the host changed it after the run".into())
        }
        (Some(a), Some(_)) => {
            if a.kind != Kind::Dir && time_of(a.ctime) >= since {
                return Some("the host changed it while the run was going on".into());
            }
        }
    }
    // A directory deleted whole: nothing below it may be newer either.
    if e.change == Change::Deleted && e.kind == Kind::Dir {
        if let Some(p) = newer_below(&path, since, 0) {
            return Some(format!(
                "the host changed {} inside it",
                crate::text::shown(&p)
            ));
        }
    }
    None
}

fn newer_below(dir: &Path, since: SystemTime, depth: u32) -> Option<PathBuf> {
    if depth > 64 {
        return Some(dir.to_path_buf());
    }
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let m = std::fs::symlink_metadata(&p).ok()?;
        if time_of((m.ctime(), m.ctime_nsec())) >= since {
            return Some(p);
        }
        if m.is_dir() {
            if let Some(n) = newer_below(&p, since, depth + 1) {
                return Some(n);
            }
        }
    }
    None
}

/// The directory holding `rel` below `root_fd`, links never followed;
/// missing directories are made with the mode the changeset gives them.
fn parent_of(cs: &Changeset, e_root: usize, root_fd: &OwnedFd, rel: &Path) -> Result<OwnedFd> {
    let mut cur = root_fd.try_clone()?;
    let mut so_far = PathBuf::new();
    let Some(parent) = rel.parent() else {
        return Ok(cur);
    };
    for c in parent.components() {
        so_far.push(c);
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let next = match openat(cur.as_fd(), c.as_os_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => {
                let mode = std::fs::symlink_metadata(cs.upper(e_root).join(&so_far))
                    .map_or(0o755, |m| safe_mode(m.mode()));
                // Made writable for us first; the mode is set at the end.
                nix::sys::stat::mkdirat(
                    cur.as_fd(),
                    c.as_os_str(),
                    Mode::from_bits_truncate(0o700 | mode),
                )
                .with_context(|| format!("creating {}", so_far.display()))?;
                openat(cur.as_fd(), c.as_os_str(), flags, Mode::empty())
                    .with_context(|| format!("opening {}", so_far.display()))?
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{} is no longer a directory on the host (a link or a file?)",
                        so_far.display()
                    )
                })
            }
        };
        cur = next;
    }
    Ok(cur)
}

fn name_of(rel: &Path) -> Result<&std::ffi::OsStr> {
    rel.file_name()
        .with_context(|| format!("{} has no name", rel.display()))
}

struct Writer<'a> {
    cs: &'a Changeset,
    roots: Vec<OwnedFd>,
    n: u64,
    /// The directory the last entry went into: entries come sorted, so
    /// most share it (deletions, which could remove it, clear it).
    last: Option<(usize, PathBuf, OwnedFd)>,
}

impl Writer<'_> {
    fn tmp(&mut self) -> String {
        self.n += 1;
        format!(".airlock-{}-{}", self.cs.meta.id, self.n)
    }

    /// The directory holding the entry, from the cache when it can be.
    fn dir_of(&mut self, e: &Entry) -> Result<OwnedFd> {
        let parent = e.rel.parent().unwrap_or(Path::new("")).to_path_buf();
        if e.change == Change::Deleted {
            self.last = None;
            return parent_of(self.cs, e.root, &self.roots[e.root], &e.rel);
        }
        if let Some((root, p, fd)) = &self.last {
            if *root == e.root && *p == parent {
                return Ok(fd.try_clone()?);
            }
        }
        let fd = parent_of(self.cs, e.root, &self.roots[e.root], &e.rel)?;
        self.last = Some((e.root, parent, fd.try_clone()?));
        Ok(fd)
    }

    /// Give the host the upper layer's own file, by a hard link, where
    /// both lie on one file system: no data is copied, and removing the
    /// changeset then frees no inode. Only a file of ours whose extended
    /// attributes are all `user.*` (overlayfs's own are taken off it); any
    /// other (a capability, an ACL, a label) is copied instead, which
    /// carries none. Returns whether it was linked as `tmp` in `dir`.
    fn link_upper(&self, upper: &Path, dir: &OwnedFd, tmp: &str, e: &Entry) -> Result<bool> {
        let Ok(src) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(upper)
        else {
            return Ok(false);
        };
        let m = src.metadata()?;
        // SAFETY: geteuid has no preconditions.
        if !m.is_file() || m.uid() != unsafe { libc::geteuid() } {
            return Ok(false);
        }
        if !super::xattr::only_user(src.as_fd())? {
            return Ok(false);
        }
        super::xattr::drop_overlay(src.as_fd())?;
        nix::sys::stat::fchmod(src.as_fd(), Mode::from_bits_truncate(safe_mode(e.mode)))?;
        // By the open descriptor: the name in the layer is not looked up
        // again.
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", src.as_raw_fd()));
        match nix::unistd::linkat(
            nix::fcntl::AT_FDCWD,
            &by_fd,
            dir.as_fd(),
            tmp,
            nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
        ) {
            Ok(()) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    fn apply(&mut self, e: &Entry, linked: bool) -> Result<()> {
        let dir = self.dir_of(e)?;
        let name = name_of(&e.rel)?;
        let upper = self.cs.upper(e.root).join(&e.rel);
        match (e.change, e.kind) {
            (Change::Deleted, Kind::Dir) => {
                let p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p)
                        .with_context(|| format!("removing {}", e.rel.display()))?,
                    Ok(_) => nix::unistd::unlinkat(
                        dir.as_fd(),
                        name,
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    )?,
                    Err(_) => {}
                }
            }
            (Change::Deleted, _) => {
                match nix::unistd::unlinkat(
                    dir.as_fd(),
                    name,
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                ) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(nix::errno::Errno::EISDIR) => {
                        let p =
                            PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
                        std::fs::remove_dir_all(&p)?;
                    }
                    Err(err) => {
                        return Err(err).with_context(|| format!("removing {}", e.rel.display()))
                    }
                }
            }
            (_, Kind::Dir) => {
                match nix::sys::stat::mkdirat(
                    dir.as_fd(),
                    name,
                    Mode::from_bits_truncate(0o700 | safe_mode(e.mode)),
                ) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(err) => {
                        return Err(err).with_context(|| format!("creating {}", e.rel.display()))
                    }
                }
            }
            (_, Kind::Symlink) => {
                let target = e.target.as_deref().context("a link without a target")?;
                let tmp = self.tmp();
                nix::unistd::symlinkat(target, dir.as_fd(), tmp.as_str())
                    .with_context(|| format!("linking {}", e.rel.display()))?;
                renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name)
                    .with_context(|| format!("placing {}", e.rel.display()))?;
            }
            (_, Kind::File) => {
                let tmp = self.tmp();
                if let (Some(first), true) = (&e.link_of, linked) {
                    let fdir = parent_of(self.cs, e.root, &self.roots[e.root], first)?;
                    if nix::unistd::linkat(
                        fdir.as_fd(),
                        name_of(first)?,
                        dir.as_fd(),
                        tmp.as_str(),
                        nix::fcntl::AtFlags::empty(),
                    )
                    .is_ok()
                    {
                        renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name)
                            .with_context(|| format!("placing {}", e.rel.display()))?;
                        return Ok(());
                    }
                }
                if self.link_upper(&upper, &dir, &tmp, e)? {
                    renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name)
                        .with_context(|| format!("placing {}", e.rel.display()))?;
                    return Ok(());
                }
                let mut src = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&upper)
                    .with_context(|| format!("reading {}", upper.display()))?;
                let fd = openat(
                    dir.as_fd(),
                    tmp.as_str(),
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .with_context(|| format!("writing {}", e.rel.display()))?;
                let mut out = std::fs::File::from(fd);
                let written = std::io::copy(&mut src, &mut out)
                    .and_then(|_| {
                        use std::os::unix::fs::PermissionsExt;
                        out.set_permissions(std::fs::Permissions::from_mode(safe_mode(e.mode)))
                    })
                    .and_then(|_| super::xattr::set(out.as_fd(), &super::xattr::of(&upper)?))
                    .and_then(|_| {
                        let m = src.metadata()?;
                        out.set_modified(m.modified()?)
                    });
                if let Err(err) = written {
                    let _ = nix::unistd::unlinkat(
                        dir.as_fd(),
                        tmp.as_str(),
                        nix::unistd::UnlinkatFlags::NoRemoveDir,
                    );
                    return Err(err).with_context(|| format!("writing {}", e.rel.display()));
                }
                renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name)
                    .with_context(|| format!("placing {}", e.rel.display()))?;
            }
            (_, Kind::Special) => bail!("{} is a special file; not applied", e.rel.display()),
        }
        Ok(())
    }

    /// A directory's final mode, once what goes in it is in.
    fn dir_mode(&self, e: &Entry) -> Result<()> {
        let fd = if e.rel.as_os_str().is_empty() {
            self.roots[e.root].try_clone()?
        } else {
            let dir = parent_of(self.cs, e.root, &self.roots[e.root], &e.rel)?;
            openat(
                dir.as_fd(),
                name_of(&e.rel)?,
                OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?
        };
        let upper = self.cs.upper(e.root).join(&e.rel);
        super::xattr::of(&upper)
            .and_then(|want| super::xattr::set(fd.as_fd(), &want))
            .with_context(|| format!("setting the attributes of {}", e.rel.display()))?;
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(safe_mode(e.mode)))
            .with_context(|| format!("setting the mode of {}", e.rel.display()))?;
        Ok(())
    }
}

use std::os::unix::fs::OpenOptionsExt;

/// Write the entries through, in the changeset's order. The caller has
/// checked them for conflicts. Returns the paths written.
pub fn write(cs: &Changeset, entries: &[&Entry]) -> Result<Vec<PathBuf>> {
    let mut roots = vec![];
    for r in &cs.meta.roots {
        let fd = nix::fcntl::open(
            r,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("opening the root {}", r.display()))?;
        roots.push(fd);
    }
    let mut w = Writer {
        cs,
        roots,
        n: 0,
        last: None,
    };
    let chosen: std::collections::HashSet<(usize, &Path)> =
        entries.iter().map(|e| (e.root, e.rel.as_path())).collect();
    // A link to a file the run left as it was links to the host's file.
    let listed: std::collections::HashSet<(usize, &Path)> = cs
        .meta
        .entries
        .iter()
        .map(|e| (e.root, e.rel.as_path()))
        .collect();
    let mut done = vec![];
    // Hard links last: the file they name is then in place, with its
    // content (a link made first would keep the host's old file).
    let (plain, links): (Vec<&&Entry>, Vec<&&Entry>) =
        entries.iter().partition(|e| e.link_of.is_none());
    for e in plain.into_iter().chain(links) {
        let linked = e
            .link_of
            .as_deref()
            .is_some_and(|f| chosen.contains(&(e.root, f)) || !listed.contains(&(e.root, f)));
        w.apply(e, linked)?;
        done.push(cs.meta.roots[e.root].join(&e.rel));
    }
    // Directories' modes last, deepest first, so that one made read-only
    // does not stop what goes in it.
    let mut dirs: Vec<&&Entry> = entries
        .iter()
        .filter(|e| e.kind == Kind::Dir && e.change != Change::Deleted)
        .collect();
    dirs.sort_by(|a, b| (b.root, &b.rel).cmp(&(a.root, &a.rel)));
    for e in dirs {
        w.dir_mode(e)?;
    }
    Ok(done)
}
