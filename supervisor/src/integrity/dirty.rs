//! Where the writable roots changed between a session's checks (SPEC
//! §4.7): an inotify watch on every directory below them, kept for the
//! session's life, so that each command's check searches for planted
//! repositories near what changed, at a cost that grows with the change
//! and not with the workspace. Whenever the watch cannot say for certain
//! (its queue overflowed, a directory was renamed so that the paths it
//! knows went stale, a hard-linked file changed, a watch could not be
//! added), it says "everything", and the check searches every root whole,
//! as the end of the session always does.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// Device, inode, ctime, mtime and size.
type Identity = (u64, u64, i64, i64, i64, i64, u64);

pub struct Dirty {
    ino: Inotify,
    paths: HashMap<WatchDescriptor, PathBuf>,
    roots: Vec<PathBuf>,
    /// Some watch could not be added: only a whole search is certain.
    incomplete: bool,
    /// The git directories known in the roots, whose configuration and
    /// hooks are looked at by identity on every `changed`: a write through
    /// a shared mapping raises no inotify event (a process a command left
    /// running can rewrite a config it mapped), but does change the file's
    /// ctime.
    repos: BTreeSet<PathBuf>,
    seen: HashMap<PathBuf, Option<Identity>>,
    /// Directories where that look saw a change, for the next `take`.
    swept: BTreeSet<PathBuf>,
    /// The sandbox's PID 1 (host pid), whose descendants are the processes
    /// a command left running ([`Dirty::watch_mappings`]).
    init: Option<u32>,
    /// Files of the roots that such a process could write through a
    /// mapping, now or later (`procfs::files_it_can_write`): looked at by
    /// identity like the repositories' items, since a write through a
    /// mapping raises no event (red team round 12: a background process
    /// rewrote a `.npmrc` it had mapped, and the session saw it only at its
    /// end; round 13: mapped read-only then made writable, or mapped only
    /// for a moment from a descriptor kept open).
    mapped: BTreeSet<PathBuf>,
    /// Too many processes to look at: the next `take` searches everything.
    unsure: bool,
}

/// Processes looked at for mappings; past this, every root is searched.
const MAX_PROCESSES: usize = 1024;

/// A file's identity now, links not followed (but a process's own
/// `/proc/PID/fd/N` or `map_files` entry, which leads to the file it
/// holds, is followed).
fn identity(p: &Path) -> Option<Identity> {
    let m = match p.starts_with("/proc") {
        true => std::fs::metadata(p),
        false => std::fs::symlink_metadata(p),
    };
    m.ok().map(|m| {
        (
            m.dev(),
            m.ino(),
            m.ctime(),
            m.ctime_nsec(),
            m.mtime(),
            m.mtime_nsec(),
            m.size(),
        )
    })
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW
}

impl Dirty {
    /// Watch every directory below `roots` (links not followed).
    pub fn watch(roots: &[PathBuf]) -> nix::Result<Dirty> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut d = Dirty {
            ino,
            paths: HashMap::new(),
            roots: roots.to_vec(),
            incomplete: false,
            repos: BTreeSet::new(),
            seen: HashMap::new(),
            swept: BTreeSet::new(),
            init: None,
            mapped: BTreeSet::new(),
            unsure: false,
        };
        for r in roots {
            d.add_tree(r);
        }
        Ok(d)
    }

    /// Whether anything may have changed since the last `take` (an event
    /// waits, or the watch is not whole): when not, there is nothing in
    /// the roots to judge.
    pub fn changed(&mut self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on our own descriptor, without waiting.
        let event = self.incomplete || unsafe { libc::poll(&mut p, 1, 0) } != 0;
        let (mapped, left) = self.look_at_mappings();
        // Only a process still running can write through a mapping unseen:
        // the last reference to a file open for writing raises an event
        // when it goes (a process's exit unmaps it).
        let swept = left && self.sweep();
        swept || event || mapped || !self.swept.is_empty()
    }

    /// Look at the mappings of the processes below `init` (the sandbox's
    /// PID 1, by its host pid) from now on.
    pub fn watch_mappings(&mut self, init: u32) {
        self.init = Some(init);
    }

    /// What the processes left running could write through a mapping in
    /// the roots (`procfs::files_it_can_write`): whether a file is newly so (its directory is then dirty:
    /// it may have been written before this look), and whether any process
    /// is left (without PID 1 known: assumed). When none is left, only PID
    /// 1's children are listed.
    fn look_at_mappings(&mut self) -> (bool, bool) {
        let Some(init) = self.init else {
            return (false, true);
        };
        let Some(procs) = crate::procfs::descendants(&[init], MAX_PROCESSES) else {
            self.unsure = true;
            return (true, true);
        };
        let left = !procs.is_empty();
        let mut now = BTreeSet::new();
        for pid in procs {
            let in_roots = |f: &Path| self.roots.iter().any(|r| f.starts_with(r));
            match crate::procfs::files_it_can_write(pid, &in_roots) {
                Ok(files) => now.extend(files),
                // Gone since it was listed: nothing of its is mapped.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // One we may not read: only a whole search is certain.
                Err(_) => self.unsure = true,
            }
        }
        let mut new = false;
        for f in now.difference(&self.mapped) {
            new = true;
            let id = identity(f);
            // Held by a removed name (`procfs::files_it_can_write`): which
            // name of the roots it has now is unknown, and it may have been
            // written already; one it cannot look at (an ordinary user may
            // not follow `map_files`) is searched for every time.
            if f.starts_with("/proc") {
                self.unsure = true;
            }
            self.seen.insert(f.clone(), id);
            if let Some(dir) = f.parent() {
                self.swept.insert(dir.to_path_buf());
            }
        }
        if now
            .iter()
            .any(|f| f.starts_with("/proc") && self.seen.get(f).is_some_and(Option::is_none))
        {
            self.unsure = true;
        }
        self.mapped = now;
        (new || self.unsure, left)
    }

    /// Git directories to look at by identity from now on (what it is now
    /// is the baseline).
    pub fn add_repos(&mut self, dirs: impl IntoIterator<Item = PathBuf>) {
        for d in dirs {
            if self.repos.insert(d) {
                self.sweep();
            }
        }
    }

    /// Look at the known repositories' configuration and hooks by identity
    /// (device, inode, ctime, mtime, size); whether any changed since the
    /// last look (their directories are then dirty).
    fn sweep(&mut self) -> bool {
        let mut changed = false;
        let mut items = vec![];
        for repo in &self.repos {
            crate::plan::protected::git_dir_surface(repo, 0, &mut items);
            if let Ok(rd) = std::fs::read_dir(repo.join("hooks")) {
                items.extend(rd.flatten().map(|e| e.path()));
            }
        }
        // The repositories' items first, then the files held by processes
        // left running.
        let repo_items = items.len();
        items.extend(self.mapped.iter().cloned());
        for (n, item) in items.into_iter().enumerate() {
            let now = identity(&item);
            match self.seen.insert(item.clone(), now) {
                Some(before) if before != now => {
                    changed = true;
                    // A file held by a process left running that has
                    // another name: the name a host tool obeys may be any
                    // of them (red team round 13), so only a whole search
                    // is certain.
                    if n >= repo_items
                        && (item.starts_with("/proc")
                            || std::fs::symlink_metadata(&item).is_ok_and(|m| m.nlink() > 1))
                    {
                        self.unsure = true;
                    }
                    if let Some(dir) = item.parent() {
                        self.swept.insert(dir.to_path_buf());
                    }
                }
                _ => {}
            }
        }
        changed
    }

    /// Readable when something changed since the last `take`.
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::{AsFd, AsRawFd};
        self.ino.as_fd().as_raw_fd()
    }

    /// Watch `top` and every directory below it; returns those watched.
    fn add_tree(&mut self, top: &Path) -> Vec<PathBuf> {
        let mut added = vec![];
        let mut stack = vec![top.to_path_buf()];
        while let Some(dir) = stack.pop() {
            match self.ino.add_watch(&dir, mask()) {
                Ok(wd) => {
                    self.paths.insert(wd, dir.clone());
                }
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => continue,
                Err(_) => {
                    self.incomplete = true;
                    continue;
                }
            }
            // What cannot be listed is not watched below: only a whole
            // search is certain then (a check searches each directory named
            // here alone, not what lies below it).
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                    continue
                }
                Err(_) => {
                    self.incomplete = true;
                    continue;
                }
            };
            for e in rd {
                match e {
                    Ok(e) if e.file_type().is_ok_and(|t| t.is_dir()) => stack.push(e.path()),
                    Ok(_) => {}
                    Err(_) => self.incomplete = true,
                }
            }
            added.push(dir);
        }
        added
    }

    /// After a check that acted: what is queued now is airlock's own work
    /// (the sandbox is held still until the check ends), so it marks
    /// nothing changed. Directories it moved (into the quarantine, or back)
    /// are watched under their new names; before, such a move made the
    /// next check search every root and rebuild the whole watch (over a
    /// second in a repository of 20,000 directories).
    pub fn forget_own(&mut self) {
        loop {
            let events = match self.ino.read_events() {
                Ok(e) if !e.is_empty() => e,
                Err(nix::errno::Errno::EINTR) => continue,
                _ => break,
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    self.incomplete = true;
                    continue;
                }
                let Some(dir) = self.paths.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.paths.remove(&ev.wd);
                    continue;
                }
                let Some(name) = ev.name.as_ref().map(|n| dir.join(n)) else {
                    continue;
                };
                if !ev.mask.contains(AddWatchFlags::IN_ISDIR) {
                    continue;
                }
                if ev.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                    self.paths.retain(|_, p| !p.starts_with(&name));
                } else if ev
                    .mask
                    .intersects(AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE)
                {
                    self.add_tree(&name);
                }
            }
        }
        self.sweep();
        self.swept.clear();
    }

    /// The directories where something changed since the last call, or
    /// `None` when only a search of every root is certain. Call with the
    /// sandbox held still, so that nothing changes meanwhile.
    pub fn take(&mut self) -> Option<Vec<PathBuf>> {
        self.sweep();
        let mut dirty = std::mem::take(&mut self.swept);
        let mut all = self.incomplete || std::mem::take(&mut self.unsure);
        loop {
            let events = match self.ino.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => {
                    all = true;
                    break;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    all = true;
                    continue;
                }
                let Some(dir) = self.paths.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.paths.remove(&ev.wd);
                    continue;
                }
                dirty.insert(dir.clone());
                let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                let Some(name) = ev.name.as_ref().map(|n| dir.join(n)) else {
                    continue;
                };
                if is_dir && ev.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                    // Watches follow the directory, not its name: what
                    // this one knows by the old name is forgotten (known
                    // again by the new one below, when it stays in the
                    // roots). Before, any directory rename made the check
                    // search every root (harness rounds 11 and 12: half a
                    // second for one `mv` in 20,000 directories).
                    self.paths.retain(|_, p| !p.starts_with(&name));
                } else if is_dir && ev.mask.contains(AddWatchFlags::IN_MOVED_TO) {
                    // All of it counts as changed, under its new name: a
                    // tree assembled elsewhere and renamed into place
                    // keeps its files' times (SPEC §3.5).
                    dirty.extend(self.add_tree(&name));
                } else if is_dir && ev.mask.contains(AddWatchFlags::IN_CREATE) {
                    // Made before it was watched: all of it counts as changed.
                    dirty.extend(self.add_tree(&name));
                } else if !is_dir
                    && std::fs::symlink_metadata(&name).is_ok_and(|m| m.is_file() && m.nlink() > 1)
                {
                    // A change through one name of a file is seen in that
                    // name's directory only: another name may be a hook.
                    all = true;
                }
            }
        }
        // A directory made since that could not be watched whole.
        all |= self.incomplete;
        if all {
            // Start afresh, paths and all (on the same instance, whose
            // descriptor others poll): the next check can be narrow again.
            for wd in std::mem::take(&mut self.paths).into_keys() {
                let _ = self.ino.rm_watch(wd);
            }
            while matches!(self.ino.read_events(), Ok(e) if !e.is_empty()) {}
            self.incomplete = false;
            for r in self.roots.clone() {
                self.add_tree(&r);
            }
            return None;
        }
        Some(dirty.into_iter().collect())
    }
}
