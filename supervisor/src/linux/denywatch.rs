//! `deny_read` against the host's renames and links during the run (SPEC
//! §4.5, last bullet). Landlock grants by inode: to keep an absent
//! `deny_read` name unreadable the read grant is split at its nearest
//! existing ancestor (landlock.rs), so every other entry there carries a
//! rule of its own, and that rule moves with the inode. When the host
//! renames or hard-links such an inode to the denied name (`mv
//! ~/.netrc.bak ~/.netrc`), or puts a symlink on the way (`ln -s
//! ~/dotfiles/aws ~/.aws`), the sandbox could read it. Landlock cannot say
//! "never this name", so the helper watches every existing ancestor of
//! every `deny_read` path for the next component's name, and stops the
//! sandbox when that name appears as something that can carry a grant:
//!
//! - a symlink (it leads wherever its target is granted);
//! - an inode born before the ruleset was made (statx btime; a
//!   filesystem without btime counts as before: fail closed), a file
//!   renamed or hard-linked in, or a directory moved in.
//!
//! A new file at the denied name stops nothing: shells save history by
//! renaming a fresh temp file over `~/.zsh_history`, and that inode has no
//! rule. A fresh directory on the way (`mkdir ~/.config`) is watched in
//! turn for the next name; one at or under the denied name (`mkdir ~/.aws`)
//! for every name, at any depth, by the same two tests.
//!
//! Inside writable roots the whole root is granted, whatever the inode, so
//! a name there is no more readable for being moved in than for being made
//! (a stated residual, README). The same watch runs there anyway, and
//! cannot tell the host from the sandbox: a symlink or an old inode put at
//! a denied name there stops the run even when the sandbox did it. That
//! costs the sandbox nothing it was allowed (`ln -s`/`mv` onto a name it
//! must not read), and stopping is the fail-closed side. Fresh directories
//! it makes at or under a denied name there are not watched (they are its
//! own).
//!
//! This watches and stops; it does not prevent: a command that opens the
//! name in a tight loop can win the race between the host's rename and
//! the kill (microseconds). The run then still ends with exit 125.
//!
//! Lookups go through directory handles opened before PID 1's mounts: the
//! helper shares the sandbox's mount namespace, where PID 1 mounts over
//! the denied paths, so only those handles still see the host's names.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// One name awaited in one watched directory.
#[derive(Clone, PartialEq)]
struct Wait {
    /// The watched directory (host view), for messages.
    dir: PathBuf,
    /// The components still to come, the first being the awaited name.
    rest: Vec<OsString>,
    /// The `deny_read` path as configured, for the message.
    shown: PathBuf,
    /// Inside a writable root: only links and old inodes count.
    writable: bool,
}

struct Dir {
    fd: OwnedFd,
    waits: Vec<Wait>,
}

/// Why the sandbox was stopped: the path and how it appeared.
#[derive(Debug, PartialEq, Eq)]
pub struct Appeared {
    pub path: PathBuf,
    pub why: &'static str,
}

impl Appeared {
    /// The line for the supervisor (run_cmd.rs prints it).
    pub fn line(&self) -> String {
        // One line whatever the name holds (run_cmd.rs escapes the rest).
        let path = self.path.display().to_string();
        let path = path.replace('\n', "\\n").replace('\r', "\\r");
        format!("deny-read-appeared: {} {path}\n", self.why)
    }
}

pub struct DenyWatch {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, Dir>,
    /// The directories watched at the start, by path: most `deny_read`
    /// paths share their ancestors (HOME, `~/.config`).
    known: HashMap<PathBuf, WatchDescriptor>,
    /// Our working directory, restored after each watch is added.
    cwd: Option<OwnedFd>,
    /// Realtime nanoseconds once PID 1's ruleset is in force: an inode
    /// born before it may carry a rule. `None` until then (every inode
    /// counts as old).
    since: Option<i128>,
    /// Realtime nanoseconds before the first watch was added: what changed
    /// after it could have been a rename or a link the watch was for.
    started: i128,
}

const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE.union(AddWatchFlags::IN_MOVED_TO);

/// The inotify instance for [`DenyWatch::new`]. Make it before the helper
/// is placed in the sandbox's cgroups: the kernel charges each queued event
/// to the memory cgroup of the process that made the instance, and fails to
/// queue it (an overflow, events lost) when that cgroup is at its limit. A
/// command that sits at its `limits.memory` would otherwise make the host's
/// every file event in a watched directory stop the run.
pub fn instance() -> Result<Inotify> {
    Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).context(
        "deny_read watch: creating an inotify instance (see sysctl fs.inotify.max_user_instances)",
    )
}

/// How far before the watch an entry's last status change must lie for a
/// rescan to take it as there from the start: file times come from the
/// coarse clock, up to a tick (10 ms at HZ=100) behind the fine one.
const UNCHANGED_MARGIN_NS: i128 = 20_000_000;

impl DenyWatch {
    /// Watch the ancestors of `names` (as configured) and of `deny_read`
    /// (resolved), with their resolved forms too. `None` when there is
    /// nothing to watch. Call before PID 1's mounts (in the host's mount
    /// namespace, or a copy of it that nothing has mounted over yet), with
    /// an [`instance`] made before the cgroups.
    pub fn new(
        inotify: Inotify,
        names: &[PathBuf],
        deny_read: &[PathBuf],
        write: &[PathBuf],
    ) -> Result<Option<Self>> {
        let mut paths: Vec<(PathBuf, PathBuf)> = vec![];
        let mut seen = std::collections::HashSet::new();
        for d in names.iter().chain(deny_read) {
            for p in [d.clone(), super::landlock::resolved(d)] {
                if p.is_absolute() && seen.insert(p.clone()) {
                    paths.push((p, d.clone()));
                }
            }
        }
        if paths.is_empty() {
            return Ok(None);
        }
        let mut w = DenyWatch {
            inotify,
            dirs: HashMap::new(),
            known: HashMap::new(),
            cwd: open_dir(None, Path::new(".")).ok(),
            since: None,
            started: now_ns(),
        };
        let write = crate::paths::Prefixes::new(write);
        for (p, shown) in paths {
            let writable = write.covers(&p);
            w.add_path(&p, shown, writable)?;
        }
        Ok(Some(w))
    }

    /// Watch every existing directory on the way to `p`.
    fn add_path(&mut self, p: &Path, shown: PathBuf, writable: bool) -> Result<()> {
        let parts: Vec<OsString> = p
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                _ => None,
            })
            .collect();
        let mut dir = PathBuf::from("/");
        for i in 0..parts.len() {
            let wait = Wait {
                dir: dir.clone(),
                rest: parts[i..].to_vec(),
                shown: shown.clone(),
                writable,
            };
            if let Some(d) = self.known.get(&dir).and_then(|wd| self.dirs.get_mut(wd)) {
                d.waits.push(wait);
                dir.push(&parts[i]);
                continue;
            }
            // The directory as a path lookup would reach it (links followed).
            let Ok(fd) = open_dir(None, &dir) else {
                return Ok(());
            };
            match self.watch(fd, &dir, wait) {
                Ok(wd) => {
                    self.known.insert(dir.clone(), wd);
                }
                // One we may not list: Landlock's split grants nothing below
                // a directory it cannot list either (landlock.rs, `carve`),
                // so no entry there carries a rule to move.
                Err(Errno::EACCES) | Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => {
                    tracing::warn!("deny_read watch: cannot watch {}", dir.display());
                    return Ok(());
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "deny_read watch: watching {} (see sysctl fs.inotify.max_user_watches)",
                            dir.display()
                        )
                    })
                }
            }
            dir.push(&parts[i]);
        }
        Ok(())
    }

    /// Add `wait` on the directory open as `fd`: through the handle, so
    /// that a directory made during the run is watched in the host's view.
    fn watch(&mut self, fd: OwnedFd, shown: &Path, wait: Wait) -> nix::Result<WatchDescriptor> {
        nix::unistd::fchdir(&fd)?;
        let wd = self.inotify.add_watch(".", MASK);
        let _ = match &self.cwd {
            Some(cwd) => nix::unistd::fchdir(cwd),
            None => nix::unistd::chdir("/"),
        };
        let wd = wd?;
        tracing::debug!(
            "deny_read watch: {} for {:?}",
            shown.display(),
            wait.rest.first()
        );
        let waits = &mut self
            .dirs
            .entry(wd)
            .or_insert(Dir { fd, waits: vec![] })
            .waits;
        // A rescan classifies fresh directories again: one wait each.
        if !waits.contains(&wait) {
            waits.push(wait);
        }
        Ok(wd)
    }

    /// The sandbox's Landlock ruleset was in force at `at` (realtime ns,
    /// from [`arm`]; now when the sandbox never said): what is born from
    /// then on carries no rule.
    pub fn armed(&mut self, at: Option<i128>) {
        self.since = Some(at.unwrap_or_else(now_ns));
    }

    /// Wait until `other` is readable, `timeout` passes, or a name
    /// appeared (returned). `armed` is PID 1's pipe, read first: once it
    /// says (or closes), inodes born from then on carry no rule.
    pub fn wait(
        &mut self,
        armed: &mut Option<OwnedFd>,
        other: Option<BorrowedFd>,
        timeout: nix::poll::PollTimeout,
    ) -> nix::Result<Option<Appeared>> {
        use nix::poll::{poll, PollFd, PollFlags};
        let mut fds = vec![PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        fds.extend(other.map(|o| PollFd::new(o, PollFlags::POLLIN)));
        if let Some(a) = armed.as_ref() {
            fds.push(PollFd::new(a.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        if let Some(a) = armed.as_ref().filter(|_| ready.last() == Some(&true)) {
            let mut at = [0u8; 16];
            let at = match nix::unistd::read(a, &mut at) {
                Ok(16) => Some(i128::from_le_bytes(at)),
                _ => None,
            };
            *armed = None;
            self.armed(at);
        }
        Ok(if ready[0] { self.check() } else { None })
    }

    /// Read what the kernel reported; the first name that appeared as
    /// something the sandbox could read through.
    pub fn check(&mut self) -> Option<Appeared> {
        loop {
            let events = match self.inotify.read_events() {
                Ok(ev) => ev,
                Err(Errno::EAGAIN) => return None,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    return Some(Appeared {
                        path: PathBuf::from(format!("(the watch failed: {e})")),
                        why: "unknown",
                    })
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost: any of them could have been one.
                    tracing::debug!("deny_read watch: events lost, looking at every name again");
                    if let Some(a) = self.rescan() {
                        return Some(a);
                    }
                    continue;
                }
                let Some(name) = ev.name else { continue };
                if let Some(a) = self.appeared(ev.wd, &name) {
                    return Some(a);
                }
            }
        }
    }

    /// After lost events: every awaited name is looked at as an event for
    /// it would have been, unless it is what was there at the start: the
    /// directory watched at that path since then (same inode), or an entry
    /// whose status has not changed since well before the ruleset (a rename
    /// or a link changes the inode's ctime) since well before the watch was
    /// made. What was moved in and away again while we looked away is not
    /// there to be read. Where file times cannot be trusted (see
    /// [`btime_tells_age`]) every name present counts: the run stops (fail
    /// closed), as it does for a denied file the host wrote to meanwhile.
    fn rescan(&mut self) -> Option<Appeared> {
        let lost = || {
            Some(Appeared {
                path: PathBuf::from("(events lost)"),
                why: "unknown",
            })
        };
        let before = self.started - UNCHANGED_MARGIN_NS;
        let mut all = vec![];
        for d in self.dirs.values() {
            let Ok(fd) = d.fd.try_clone() else {
                return lost();
            };
            all.push((fd, d.waits.clone()));
        }
        for (fd, waits) in all {
            let trusted = btime_tells_age(fd.as_fd());
            for w in waits {
                // A denied directory made during the run: every name in it.
                let names = match w.rest.first() {
                    Some(name) => vec![(w.rest.clone(), w.shown.clone(), name.clone())],
                    None => match list(fd.as_fd()) {
                        Ok(names) => names
                            .into_iter()
                            .map(|n| (vec![n.clone()], w.shown.join(&n), n))
                            .collect(),
                        Err(_) => return lost(),
                    },
                };
                for (rest, shown, name) in names {
                    let unchanged = match statx(fd.as_fd(), &name) {
                        Err(Errno::ENOENT) => true,
                        Err(_) => false,
                        Ok(st) => {
                            self.watched_since_start(&w.dir.join(&name), &st)
                                || (trusted
                                    && st.stx_mask & libc::STATX_CTIME != 0
                                    && timestamp(st.stx_ctime) < before)
                        }
                    };
                    if unchanged {
                        continue;
                    }
                    if let Some(a) = self.classify(fd.as_fd(), &w.dir, &rest, shown, w.writable, 0)
                    {
                        return Some(a);
                    }
                }
            }
        }
        None
    }

    /// Whether `st` is the directory watched at `path` from the start.
    fn watched_since_start(&self, path: &Path, st: &libc::statx) -> bool {
        let Some(dir) = self.known.get(path).and_then(|wd| self.dirs.get(wd)) else {
            return false;
        };
        let Ok(start) = nix::sys::stat::fstat(dir.fd.as_fd()) else {
            return false;
        };
        st.stx_mode as libc::mode_t & libc::S_IFMT == libc::S_IFDIR
            && st.stx_ino == start.st_ino
            && libc::makedev(st.stx_dev_major, st.stx_dev_minor) == start.st_dev
    }

    fn appeared(&mut self, wd: WatchDescriptor, name: &OsStr) -> Option<Appeared> {
        let dir = self.dirs.get(&wd)?;
        // A wait with no components left is a denied directory made during
        // the run: every name in it counts.
        let hits: Vec<(PathBuf, Vec<OsString>, PathBuf, bool)> = dir
            .waits
            .iter()
            .filter(|w| w.rest.first().is_none_or(|n| n == name))
            .map(|w| {
                let (rest, shown) = match w.rest.is_empty() {
                    true => (vec![name.to_os_string()], w.shown.join(name)),
                    false => (w.rest.clone(), w.shown.clone()),
                };
                (w.dir.clone(), rest, shown, w.writable)
            })
            .collect();
        let fd = dir.fd.try_clone().ok();
        for (at, rest, shown, writable) in hits {
            let Some(fd) = fd.as_ref() else {
                return Some(Appeared {
                    path: shown,
                    why: "unknown",
                });
            };
            if let Some(a) = self.classify(fd.as_fd(), &at, &rest, shown, writable, 0) {
                return Some(a);
            }
        }
        None
    }

    /// What `rest[0]` in the directory `parent` (at `at`) now is.
    fn classify(
        &mut self,
        parent: BorrowedFd,
        at: &Path,
        rest: &[OsString],
        shown: PathBuf,
        writable: bool,
        depth: usize,
    ) -> Option<Appeared> {
        let stop = |why| {
            Some(Appeared {
                path: shown.clone(),
                why,
            })
        };
        let (name, after) = rest.split_first()?;
        let st = match statx(parent, name) {
            Ok(st) => st,
            // Gone again: nothing there to read.
            Err(Errno::ENOENT) => return None,
            Err(_) => return stop("unknown"),
        };
        let kind = st.stx_mode as libc::mode_t & libc::S_IFMT;
        let old = self.old(&st) || !btime_tells_age(parent);
        if kind == libc::S_IFLNK {
            return stop("link");
        }
        if kind != libc::S_IFDIR {
            // A file on the way leads nowhere; at or under the denied name
            // an old inode is a grant moved or linked in.
            if after.is_empty() && old {
                return stop("existing-file");
            }
            return None;
        }
        if old {
            return stop("existing-dir");
        }
        // Inside a writable root the sandbox makes its own directories, and
        // the whole root is granted anyway: only the way there matters.
        if after.is_empty() && writable {
            return None;
        }
        if depth > 32 {
            return stop("unknown");
        }
        // A fresh directory: watched in turn, for the next name or (at or
        // under the denied name) for any; what is already in it is looked at.
        let next = at.join(name);
        let Ok(fd) = open_dir(Some(parent), Path::new(name)) else {
            return None;
        };
        let probe = fd.try_clone().ok();
        let wait = Wait {
            dir: next.clone(),
            rest: after.to_vec(),
            shown: shown.clone(),
            writable,
        };
        if self.watch(fd, &next, wait).is_err() {
            return stop("unknown");
        }
        let Some(probe) = probe else {
            return stop("unknown");
        };
        if !after.is_empty() {
            return self.classify(probe.as_fd(), &next, after, shown, writable, depth + 1);
        }
        let Ok(names) = list(probe.as_fd()) else {
            return stop("unknown");
        };
        for n in names {
            let inner = shown.join(&n);
            if let Some(a) = self.classify(probe.as_fd(), &next, &[n], inner, writable, depth + 1) {
                return Some(a);
            }
        }
        None
    }

    fn old(&self, st: &libc::statx) -> bool {
        let Some(since) = self.since else {
            return true;
        };
        if st.stx_mask & libc::STATX_BTIME == 0 {
            return true;
        }
        timestamp(st.stx_btime) < since
    }
}

fn timestamp(t: libc::statx_timestamp) -> i128 {
    t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
}

/// Whether a birth time on this directory's filesystem tells whether an
/// inode existed (and so may carry a Landlock rule) before the run.
/// overlayfs copies a lower file up with a new birth time when it is
/// renamed or linked, yet it stays the inode the rule was put on; network
/// and FUSE filesystems report a server's clock, some let it be set.
/// There every name that appears counts as old: the run stops (fail
/// closed), at the cost of stopping it for a shell's history save too.
fn btime_tells_age(dir: BorrowedFd) -> bool {
    const UNRELIABLE: &[i64] = &[
        0x794c_7630, // overlayfs
        0x6969,      // NFS
        0x6573_5546, // FUSE (virtiofs too)
        0x0102_1997, // 9p
        0xff53_4d42, // CIFS
        0xfe53_4d42, // SMB2
        0x5346_544e, // NTFS (ntfs3)
        0x7366_746e, // NTFS
        0x6e66_7364, // nfsd
        0x0000_517b, // SMB
    ];
    match nix::sys::statfs::fstatfs(dir) {
        // The field's type differs between C libraries and architectures.
        #[allow(clippy::unnecessary_cast)]
        Ok(st) => !UNRELIABLE.contains(&(st.filesystem_type().0 as i64)),
        Err(_) => false,
    }
}

/// Realtime nanoseconds, on the clock of file times. The fine clock: an
/// inode's birth time comes from the coarse one (up to a tick behind) or a
/// fine one, so an inode born before this reading is always older; one
/// born within a tick after may look older too, which stops the run (fail
/// closed).
fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(i128::MAX)
}

/// Called by the sandbox's init once its Landlock ruleset is in force:
/// tells the watcher when, so that the watcher's own delay in reading it
/// does not make the command's first files look older than the ruleset.
/// Returns the time told, for [`settle`].
pub fn arm(pipe: OwnedFd) -> i128 {
    let at = now_ns();
    let _ = nix::unistd::write(&pipe, &at.to_le_bytes());
    at
}

/// Whether the command itself can make a file at a watched name: only
/// inside a writable root. Then [`settle`] is worth its wait.
pub fn settle_needed(plan: &crate::plan::Plan) -> bool {
    let inside = |p: &PathBuf| plan.write.iter().any(|w| crate::paths::under(p, w));
    plan.deny_read_names
        .iter()
        .chain(&plan.deny_read)
        .any(inside)
}

/// Before the command starts: wait until the coarse clock, which stamps
/// most new inodes, is past `at` (up to a tick, 4 ms at HZ=250), so that
/// the command's own first files are never taken for older than the
/// ruleset. Outside the writable roots only the host makes files, and one
/// it makes at a denied name within that tick stops the run (fail closed).
/// Bounded: a clock that does not move costs a false stop, never a hang.
pub fn settle(at: i128) {
    for _ in 0..50 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime into a timespec we own.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) } != 0 {
            return;
        }
        let coarse = t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
        if coarse > at {
            return;
        }
        let wait = (at - coarse).clamp(100_000, 2_000_000) as u64;
        std::thread::sleep(std::time::Duration::from_nanos(wait));
    }
}

/// The words of the stderr message for each `why`.
pub fn describe(why: &str) -> &'static str {
    match why {
        "link" => "a link",
        "existing-file" => "an existing file moved or linked in",
        "existing-dir" => "an existing directory moved in",
        _ => "something the watch could not tell apart",
    }
}

fn open_dir(at: Option<BorrowedFd>, p: &Path) -> nix::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let dirfd = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    // A directory made during the run is not followed if it is a link.
    let nofollow = if at.is_some() { libc::O_NOFOLLOW } else { 0 };
    // SAFETY: openat on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names in the directory open as `dir`.
fn list(dir: BorrowedFd) -> nix::Result<Vec<OsString>> {
    use nix::fcntl::OFlag;
    let mut d = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(d.iter()
        .flatten()
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect())
}

fn statx(dir: BorrowedFd, name: &OsStr) -> nix::Result<libc::statx> {
    let c = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: zeroed statx is a valid out-buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx with a valid directory fd, name and buffer.
    let r = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_BTIME | libc::STATX_CTIME,
            &mut st,
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adding a watch changes the process's working directory for a moment
    /// (the helper is single-threaded): one test at a time.
    static CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        CWD.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn watch(d: &Path) -> DenyWatch {
        let mut w = DenyWatch::new(instance().unwrap(), &[d.join("a/b/key")], &[], &[])
            .unwrap()
            .unwrap();
        w.armed(None);
        // File times come from the coarse clock, a tick behind `armed`'s.
        std::thread::sleep(std::time::Duration::from_millis(50));
        w
    }

    #[test]
    fn a_fresh_file_passes_and_an_old_one_or_a_link_stops() {
        let _one = one_at_a_time();
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join("old"), "x").unwrap();
        let mut w = watch(d);
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/key.new"), "x").unwrap();
        std::fs::rename(d.join("a/b/key.new"), d.join("a/b/key")).unwrap();
        assert_eq!(w.check(), None);
        std::fs::hard_link(d.join("old"), d.join("a/b/key2")).unwrap();
        std::fs::rename(d.join("a/b/key2"), d.join("a/b/key")).unwrap();
        assert_eq!(w.check().map(|a| a.why), Some("existing-file"));
        let mut w = watch(d);
        std::os::unix::fs::symlink("b", d.join("a/l")).unwrap();
        std::fs::remove_dir_all(d.join("a/b")).unwrap();
        std::fs::rename(d.join("a/l"), d.join("a/b")).unwrap();
        assert_eq!(w.check().map(|a| a.why), Some("link"));
    }

    #[test]
    fn a_fresh_denied_directory_is_watched_at_any_depth() {
        let _one = one_at_a_time();
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join("old"), "x").unwrap();
        let mut w = DenyWatch::new(instance().unwrap(), &[d.join("deny")], &[], &[])
            .unwrap()
            .unwrap();
        w.armed(None);
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::create_dir_all(d.join("deny/a")).unwrap();
        std::fs::write(d.join("deny/a/new"), "x").unwrap();
        assert_eq!(w.check(), None);
        std::fs::create_dir_all(d.join("deny/a/b")).unwrap();
        assert_eq!(w.check(), None);
        std::fs::hard_link(d.join("old"), d.join("deny/a/b/key")).unwrap();
        let a = w.check().unwrap();
        assert_eq!((a.why, a.path), ("existing-file", d.join("deny/a/b/key")));
    }

    /// Fill the queue of every watch on `dir` until the kernel drops events.
    fn overflow(dir: &Path) {
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(16384);
        for i in 0..=max {
            let f = dir.join(format!("junk{i}"));
            std::fs::write(&f, "").unwrap();
            std::fs::remove_file(&f).unwrap();
        }
    }

    #[test]
    fn lost_events_are_looked_at_again_and_only_a_change_stops() {
        let _one = one_at_a_time();
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::create_dir_all(d.join("olddir")).unwrap();
        std::fs::write(d.join("old"), "x").unwrap();
        std::fs::write(d.join("old2"), "x").unwrap();
        // Everything above is older than the ruleset by more than the margin.
        std::thread::sleep(std::time::Duration::from_millis(60));
        let mut w = watch(d);
        // The host works in a watched directory (its ctime moves) and
        // events are lost: what is there is what was, so the run goes on.
        std::fs::write(d.join("a/other"), "x").unwrap();
        overflow(&d.join("a/b"));
        assert_eq!(w.check(), None);
        assert_eq!(w.check(), None);
        // A fresh file at the denied name is no grant, lost or not.
        overflow(&d.join("a/b"));
        std::fs::write(d.join("a/b/key"), "x").unwrap();
        assert_eq!(w.check(), None);
        std::fs::remove_file(d.join("a/b/key")).unwrap();
        // An old inode linked in while the events were lost.
        overflow(&d.join("a/b"));
        std::fs::hard_link(d.join("old"), d.join("a/b/key")).unwrap();
        assert_eq!(w.check().map(|a| a.why), Some("existing-file"));
        std::fs::remove_file(d.join("a/b/key")).unwrap();

        // A watched directory on the way replaced by an older one.
        let mut w = watch(d);
        overflow(&d.join("a/b"));
        std::fs::rename(d.join("a"), d.join("a-gone")).unwrap();
        std::fs::rename(d.join("olddir"), d.join("a")).unwrap();
        assert_eq!(w.check().map(|a| a.why), Some("existing-dir"));
        std::fs::rename(d.join("a"), d.join("olddir")).unwrap();
        std::fs::rename(d.join("a-gone"), d.join("a")).unwrap();

        // A fresh directory at the denied name, made and filled while the
        // events were lost: looked into, and the old file in it found.
        let mut w = watch(d);
        overflow(&d.join("a/b"));
        std::fs::create_dir(d.join("a/b/key")).unwrap();
        std::fs::write(d.join("a/b/key/new"), "x").unwrap();
        assert_eq!(w.check(), None);
        overflow(&d.join("a/b"));
        std::fs::hard_link(d.join("old2"), d.join("a/b/key/x")).unwrap();
        let a = w.check().unwrap();
        assert_eq!((a.why, a.path), ("existing-file", d.join("a/b/key/x")));
    }

    #[test]
    fn lost_events_before_the_ruleset_count_every_inode_as_old() {
        let _one = one_at_a_time();
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let mut w = DenyWatch::new(instance().unwrap(), &[d.join("a/b/key")], &[], &[])
            .unwrap()
            .unwrap();
        overflow(&d.join("a/b"));
        assert_eq!(w.check(), None);
        // Not armed yet: even a file made now may carry a rule.
        overflow(&d.join("a/b"));
        std::fs::write(d.join("a/b/key"), "x").unwrap();
        assert_eq!(w.check().map(|a| a.why), Some("existing-file"));
    }
}
