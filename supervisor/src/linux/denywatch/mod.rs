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
//! (a stated residual, docs/src/security.md). The same watch runs there anyway, and
//! cannot tell the host from the sandbox: a symlink or an old inode put at
//! a denied name there stops the run even when the sandbox did it. That
//! costs the sandbox nothing it was allowed (`ln -s`/`mv` onto a name it
//! must not read), and stopping is the fail-closed side. Fresh directories
//! it makes at or under a denied name there are not watched (they are its
//! own).
//!
//! This watches and stops; it does not prevent: a command that opens the
//! name in a tight loop can win the race between the host's rename and
//! the kill (microseconds). The run then still ends with exit 125. A
//! command can make that window long (keeping us off the CPU), so what a
//! host-side event reported and was replaced or removed before we looked
//! stops the run too (`unseen`).
//!
//! The kernel queues at most `fs.inotify.max_queued_events` events and then
//! drops them. The sandbox can make names as fast as it likes in its
//! writable roots, so directories there are watched in a queue of their
//! own (`Side`), read after the host's: it cannot make us lose the host's
//! events, where a loss stops the run. Losses in its own queue are looked
//! at again.
//!
//! Lookups go through directory handles opened before PID 1's mounts: the
//! helper shares the sandbox's mount namespace, where PID 1 mounts over
//! the denied paths, so only those handles still see the host's names.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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

/// Which inotify instance a directory is watched in. The sandbox can make
/// names in a directory inside its writable roots, and so fill that
/// instance's queue until the kernel drops events; it cannot in any other
/// watched directory. Two instances keep its flood out of the queue of
/// the host's directories, where lost events stop the run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Side {
    /// Outside the writable roots: only the host makes names here. Lost
    /// events stop the run (what was moved in and away again while we
    /// looked away cannot be known).
    Host,
    /// Inside a writable root, where every inode is granted anyway (see
    /// the top): lost events are looked at again (`rescan`).
    Writable,
}

type Key = (Side, WatchDescriptor);

/// The two inotify instances, made by the supervisor, outside the
/// sandbox's cgroups, and passed to the helper with its plan: the kernel
/// charges each queued event to the memory cgroup of the process that made
/// the instance, and fails to queue it (an overflow, events lost) when that
/// cgroup is at its limit. A command that sits at its `limits.memory` would
/// otherwise make the host's every file event in a watched directory stop
/// the run. (Made by the helper, they raced its placement in the cgroups,
/// which the supervisor does while the helper builds its namespaces.)
pub struct Instances {
    host: Inotify,
    writable: Inotify,
}

impl Instances {
    /// Pass both to the helper, ahead of its plan.
    pub fn send(&self, sock: &std::os::unix::net::UnixStream) -> Result<()> {
        super::netns::send_fd(sock, self.host.as_fd())?;
        super::netns::send_fd(sock, self.writable.as_fd())
    }

    /// The helper's side of [`Instances::send`].
    pub fn recv(sock: &std::os::unix::net::UnixStream) -> Result<Instances> {
        let one = || -> Result<Inotify> {
            match super::netns::recv_fd(sock)? {
                // SAFETY: the supervisor sent an inotify instance here.
                (b'F', Some(fd)) => Ok(unsafe { Inotify::from_owned_fd(fd) }),
                _ => anyhow::bail!("internal error: the deny_read watch's instances did not come"),
            }
        };
        Ok(Instances {
            host: one()?,
            writable: one()?,
        })
    }
}

pub fn instances() -> Result<Instances> {
    let one = || {
        Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).context(
            "deny_read watch: creating an inotify instance (see sysctl fs.inotify.max_user_instances)",
        )
    };
    Ok(Instances {
        host: one()?,
        writable: one()?,
    })
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
    notify: Instances,
    dirs: HashMap<Key, Dir>,
    /// The directories watched at the start, by path: most `deny_read`
    /// paths share their ancestors (HOME, `~/.config`).
    known: HashMap<(PathBuf, Side), Key>,
    /// The writable roots: a directory under one is watched on its side.
    write: Vec<PathBuf>,
    /// On the writable side, what each awaited name was when its directory
    /// was first watched (device, inode): a rescan passes over it.
    first: HashMap<(Key, OsString), (u64, u64)>,
    /// On the host's side, what the last event for each name showed.
    seen: HashMap<(Key, OsString), (u64, u64)>,
    /// Host-side events read but left for the next call (`HOST_ROUNDS`).
    pending: Vec<nix::sys::inotify::InotifyEvent>,
    /// Hidden files inside the writable roots that PID 1 covers with a
    /// mount: the sandbox can neither rename over nor remove a mount
    /// point, so a new inode at one of these names is the host's save by
    /// rename (`sed -i`, an editor), which detached the cover with the old
    /// file, and the root's rule grants the new one (red team round 9).
    covered: std::collections::HashSet<PathBuf>,
    /// Our working directory, restored after each watch is added.
    cwd: Option<OwnedFd>,
    /// Realtime nanoseconds once PID 1's ruleset is in force: an inode
    /// born before it may carry a rule. `None` until then (every inode
    /// counts as old).
    since: Option<i128>,
}

const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE.union(AddWatchFlags::IN_MOVED_TO);
/// On the host's side removals too: they put the changes at a name in
/// order (the kernel merges two identical events in a row, so without
/// them `ln old .netrc; rm .netrc; : > .netrc` would read as one create).
/// Reads of the host's queue in one call, each after judging the last.
const HOST_ROUNDS: usize = 64;
const HOST_MASK: AddWatchFlags = MASK
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM);

impl DenyWatch {
    /// Watch the ancestors of `names` (as configured) and of `deny_read`
    /// (resolved), with their resolved forms too. `None` when there is
    /// nothing to watch. Call before PID 1's mounts (in the host's mount
    /// namespace, or a copy of it that nothing has mounted over yet), with
    /// the [`instances`] made before the cgroups.
    pub fn new(
        notify: Instances,
        names: &[PathBuf],
        deny_read: &[PathBuf],
        write: &[PathBuf],
        covered: &[PathBuf],
    ) -> Result<Option<Self>> {
        let mut paths: Vec<(PathBuf, PathBuf, bool)> = vec![];
        let mut seen = std::collections::HashSet::new();
        for d in names.iter().chain(deny_read) {
            let real = super::landlock::resolved(d);
            // Links on the way, intermediate ones too (red team 16): only
            // where resolving went through one.
            let links = match real == *d {
                true => vec![],
                false => links_on_the_way(d),
            };
            // Host rules for every form of a denied path that is not wholly
            // inside the writable roots, in whatever directory its names
            // are (a link on the way inside the workspace leads out of it:
            // red team 17).
            let writable = under_any(d, write) && under_any(&real, write);
            for p in [d.clone(), real].into_iter().chain(links) {
                if p.is_absolute() && seen.insert((p.clone(), writable)) {
                    paths.push((p, d.clone(), writable));
                }
            }
        }
        if paths.is_empty() && covered.is_empty() {
            return Ok(None);
        }
        let mut w = DenyWatch {
            notify,
            dirs: HashMap::new(),
            known: HashMap::new(),
            write: write.to_vec(),
            first: HashMap::new(),
            seen: HashMap::new(),
            pending: vec![],
            cwd: open_dir(None, Path::new(".")).ok(),
            since: None,
            covered: covered_chain(covered, write),
        };
        for (p, shown, writable) in paths {
            w.add_path(&p, shown, writable)?;
        }
        for c in w.covered.clone() {
            w.add_covered(&c)?;
        }
        Ok(Some(w))
    }

    /// Watch a covered file's own directory for its name, on the writable
    /// side (its ancestors outside the roots are no concern of this: the
    /// root is the sandbox's whatever the host does above it).
    fn add_covered(&mut self, c: &Path) -> Result<()> {
        let (Some(dir), Some(name)) = (c.parent(), c.file_name()) else {
            return Ok(());
        };
        let wait = Wait {
            dir: dir.to_path_buf(),
            rest: vec![name.to_os_string()],
            shown: c.to_path_buf(),
            writable: true,
        };
        let side = self.side_of(dir, true);
        if let Some(&key) = self.known.get(&(dir.to_path_buf(), side)) {
            if let Some(d) = self.dirs.get_mut(&key) {
                remember_first(&mut self.first, key, d.fd.as_fd(), name);
                if !d.waits.contains(&wait) {
                    d.waits.push(wait);
                }
            }
            return Ok(());
        }
        let Ok(fd) = open_dir(None, dir) else {
            return Ok(());
        };
        let key = self
            .watch(fd, dir, wait)
            .with_context(|| format!("deny_read watch: watching {}", dir.display()))?;
        self.known.insert((dir.to_path_buf(), side), key);
        Ok(())
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
            let side = self.side_of(&dir, writable);
            if let Some(&key) = self.known.get(&(dir.clone(), side)) {
                // Only the writable side keeps first inodes: no descriptor
                // is duplicated for the host's (a dup and a close for every
                // directory every denied path shares with another).
                if key.0 == Side::Writable {
                    if let Some(d) = self.dirs.get(&key) {
                        remember_first(&mut self.first, key, d.fd.as_fd(), &parts[i]);
                    }
                }
                if let Some(d) = self.dirs.get_mut(&key) {
                    d.waits.push(wait);
                }
                dir.push(&parts[i]);
                continue;
            }
            // The directory as a path lookup would reach it (links followed).
            let Ok(fd) = open_dir(None, &dir) else {
                return Ok(());
            };
            match self.watch(fd, &dir, wait) {
                Ok(wd) => {
                    self.known.insert((dir.clone(), side), wd);
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

    /// The side a directory at `dir` is watched on for a wait: the
    /// writable side only for a denied path wholly inside the writable
    /// roots (`writable`) and a directory inside one. By path: a path that
    /// reaches a writable root through a link is watched on the host's
    /// side, where a flood stops the run (fail closed). A directory with
    /// waits of both kinds is watched on both sides.
    fn side_of(&self, dir: &Path, writable: bool) -> Side {
        match writable && under_any(dir, &self.write) {
            true => Side::Writable,
            false => Side::Host,
        }
    }

    fn inotify(&self, side: Side) -> &Inotify {
        match side {
            Side::Host => &self.notify.host,
            Side::Writable => &self.notify.writable,
        }
    }

    /// Add `wait` on the directory open as `fd`: through the handle, so
    /// that a directory made during the run is watched in the host's view.
    fn watch(&mut self, fd: OwnedFd, shown: &Path, wait: Wait) -> nix::Result<Key> {
        let side = self.side_of(shown, wait.writable);
        let mask = match side {
            Side::Host => HOST_MASK,
            Side::Writable => MASK,
        };
        nix::unistd::fchdir(&fd)?;
        let wd = self.inotify(side).add_watch(".", mask);
        let _ = match &self.cwd {
            Some(cwd) => nix::unistd::fchdir(cwd),
            None => nix::unistd::chdir("/"),
        };
        let key = (side, wd?);
        tracing::debug!(
            "deny_read watch: {} for {:?} ({side:?})",
            shown.display(),
            wait.rest.first()
        );
        if let Some(name) = wait.rest.first() {
            remember_first(&mut self.first, key, fd.as_fd(), name);
        }
        let waits = &mut self
            .dirs
            .entry(key)
            .or_insert(Dir { fd, waits: vec![] })
            .waits;
        // A rescan classifies fresh directories again: one wait each.
        if !waits.contains(&wait) {
            waits.push(wait);
        }
        Ok(key)
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
        let mut fds = vec![
            PollFd::new(self.notify.host.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.notify.writable.as_fd(), PollFlags::POLLIN),
        ];
        fds.extend(other.map(|o| PollFd::new(o, PollFlags::POLLIN)));
        if let Some(a) = armed.as_ref() {
            fds.push(PollFd::new(a.as_fd(), PollFlags::POLLIN));
        }
        // Host events read but not yet judged: no waiting for more.
        let held = !self.pending.is_empty();
        let timeout = match held {
            true => nix::poll::PollTimeout::ZERO,
            false => timeout,
        };
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
        if !held && !ready[0] && !ready[1] {
            return Ok(None);
        }
        // The host's side first and all of it; then one batch of the
        // writable side, so that a sandbox flooding it cannot keep us from
        // the host's events (poll is back at once while more is queued).
        Ok(self.drain_host().or_else(|| self.drain_writable(1)))
    }

    /// Read everything the kernel reported; the first name that appeared
    /// as something the sandbox could read through.
    pub fn check(&mut self) -> Option<Appeared> {
        for _ in 0..1000 {
            if let Some(a) = self.drain_host() {
                return Some(a);
            }
            if self.pending.is_empty() {
                return self.drain_writable(usize::MAX);
            }
        }
        // Before the command starts or after it ended: everything up to
        // then must be judged, and the host never stopped.
        stop_unknown("(the host kept changing watched names)")
    }

    /// Everything queued on the host's side, then each name's changes in
    /// order. A name awaited on the way to a denied path (or the denied
    /// name itself) that appeared and then changed again before we read
    /// it was never seen: that stops the run (red team rounds 14 and 15:
    /// thousands of busy threads keep us off the CPU while the host moves
    /// an old inode in and out again). Inside a directory the host made
    /// during the run at or under a denied name (every name counts there)
    /// only what is there now is looked at: lock files come and go in
    /// those (a first `kubectl` or `gpg`), and a transient there is a
    /// stated residual, as is what happened in such a directory before it
    /// was watched.
    fn drain_host(&mut self) -> Option<Appeared> {
        // The names looked at (statx) in the previous round: a change to
        // one read now may have come between our read and our look, so
        // what we judged was not what the event reported (red team 16).
        let mut looked: Vec<(Key, OsString, PathBuf)> = vec![];
        for round in 0.. {
            let mut events = std::mem::take(&mut self.pending);
            loop {
                match self.notify.host.read_events() {
                    Ok(ev) => events.extend(ev),
                    Err(Errno::EAGAIN) => break,
                    Err(Errno::EINTR) => continue,
                    Err(e) => return stop_unknown(&format!("(the watch failed: {e})")),
                }
            }
            if events.is_empty() {
                return None;
            }
            for (key, name, shown) in looked.drain(..) {
                let changed = events
                    .iter()
                    .any(|ev| ev.wd == key.1 && ev.name.as_ref() == Some(&name));
                if changed {
                    return Some(Appeared {
                        path: shown,
                        why: "unseen",
                    });
                }
            }
            // A host that never stops making names in a watched directory
            // must not keep us here: the rest waits for the next call.
            if round >= HOST_ROUNDS {
                self.pending = events;
                return None;
            }
            // Per name, in the order of their first event: whether each
            // event was an appearance.
            let mut order: Vec<(Key, OsString)> = vec![];
            let mut changes: HashMap<(Key, OsString), Vec<bool>> = HashMap::new();
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Any of them could have been one, and gone again.
                    return stop_unknown("(events lost)");
                }
                let Some(name) = ev.name else { continue };
                let appeared = ev
                    .mask
                    .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                let at = ((Side::Host, ev.wd), name);
                changes
                    .entry(at.clone())
                    .or_insert_with(|| {
                        order.push(at);
                        vec![]
                    })
                    .push(appeared);
            }
            for at in order {
                let Some(seq) = changes.remove(&at) else {
                    continue;
                };
                let (key, name) = at;
                let Some(dir) = self.dirs.get(&key) else {
                    continue;
                };
                let on_the_way = dir.waits.iter().find(|w| w.rest.first() == Some(&name));
                if let Some(w) = on_the_way {
                    let shown = w.shown.clone();
                    if seq.iter().any(|&a| !a) {
                        self.seen.remove(&(key, name.clone()));
                    }
                    if seq[..seq.len() - 1].iter().any(|&a| a) {
                        return Some(Appeared {
                            path: shown,
                            why: "unseen",
                        });
                    }
                    if seq.last() != Some(&true) {
                        continue;
                    }
                    let Ok(fd) = dir.fd.try_clone() else {
                        return stop_unknown("(the watch's descriptor limit)");
                    };
                    if let Some(a) = self.unseen(key, fd.as_fd(), &name, &shown) {
                        return Some(a);
                    }
                    looked.push((key, name.clone(), shown));
                } else if !seq.contains(&true) {
                    continue;
                }
                if let Some(a) = self.appeared(key, &name) {
                    return Some(a);
                }
            }
        }
        None
    }

    /// Up to `batches` reads of the writable side's queue.
    fn drain_writable(&mut self, batches: usize) -> Option<Appeared> {
        let mut read = 0;
        while read < batches {
            let events = match self.notify.writable.read_events() {
                Ok(ev) => ev,
                Err(Errno::EAGAIN) => return None,
                Err(Errno::EINTR) => continue,
                Err(e) => return stop_unknown(&format!("(the watch failed: {e})")),
            };
            read += 1;
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    tracing::debug!("deny_read watch: events lost in the writable roots, looking at every name there again");
                    if let Some(a) = self.rescan() {
                        return Some(a);
                    }
                    continue;
                }
                let Some(name) = ev.name else { continue };
                if let Some(a) = self.appeared((Side::Writable, ev.wd), &name) {
                    return Some(a);
                }
            }
        }
        None
    }

    /// After lost events on the writable side: every name awaited there
    /// is looked at as an event for it would have been, unless it is the
    /// inode that was there when its directory was first watched. What was
    /// moved in and away again meanwhile is not seen; there every inode is
    /// granted anyway.
    fn rescan(&mut self) -> Option<Appeared> {
        let mut all = vec![];
        for (key, d) in &self.dirs {
            if key.0 != Side::Writable {
                continue;
            }
            let Ok(fd) = d.fd.try_clone() else {
                return stop_unknown("(events lost)");
            };
            all.push((*key, fd, d.waits.clone()));
        }
        for (key, fd, waits) in all {
            for w in waits {
                // A denied directory made during the run: every name in it.
                let names = match w.rest.first() {
                    Some(name) => vec![(w.rest.clone(), w.shown.clone(), name.clone())],
                    None => match list(fd.as_fd()) {
                        Ok(names) => names
                            .into_iter()
                            .map(|n| (vec![n.clone()], w.shown.join(&n), n))
                            .collect(),
                        Err(_) => return stop_unknown("(events lost)"),
                    },
                };
                for (rest, shown, name) in names {
                    let unchanged = match statx(fd.as_fd(), &name) {
                        Err(Errno::ENOENT) => true,
                        Err(_) => false,
                        Ok(st) => self.first.get(&(key, name.clone())) == Some(&identity(&st)),
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

    fn appeared(&mut self, key: Key, name: &OsStr) -> Option<Appeared> {
        if key.0 == Side::Writable {
            if let Some(a) = self.replaced_cover(key, name) {
                return Some(a);
            }
        }
        let dir = self.dirs.get(&key)?;
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

    /// A covered hidden file (`covered`) that is now another inode than
    /// the one covered at the start. A removal alone stops nothing: what
    /// is gone cannot be read.
    fn replaced_cover(&self, key: Key, name: &OsStr) -> Option<Appeared> {
        let dir = self.dirs.get(&key)?;
        let w = dir.waits.iter().find(|w| {
            w.rest.len() == 1 && w.rest[0] == name && self.covered.contains(&w.dir.join(name))
        })?;
        let now = statx(dir.fd.as_fd(), name).ok().map(|st| identity(&st))?;
        (self.first.get(&(key, name.to_os_string())) != Some(&now)).then(|| Appeared {
            path: w.shown.clone(),
            why: "replaced",
        })
    }

    /// On the host's side, for a name whose last queued change was an
    /// appearance: whether that object is gone already (its removal is
    /// still to be read), or is the inode an earlier appearance already
    /// showed with no removal in between (so that earlier one was looked
    /// at only after this one had replaced it). Either way one object was
    /// never seen.
    fn unseen(
        &mut self,
        key: Key,
        dir: BorrowedFd,
        name: &OsStr,
        shown: &Path,
    ) -> Option<Appeared> {
        let stop = || {
            Some(Appeared {
                path: shown.to_path_buf(),
                why: "unseen",
            })
        };
        match statx(dir, name) {
            Err(Errno::ENOENT) => stop(),
            Err(_) => None,
            Ok(st) => {
                let id = identity(&st);
                match self.seen.insert((key, name.to_os_string()), id) {
                    Some(before) if before == id => stop(),
                    _ => None,
                }
            }
        }
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
        let fd = match open_dir(Some(parent), Path::new(name)) {
            Ok(fd) => fd,
            // Gone or replaced since the statx: its replacement is an
            // event of its own.
            Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return None,
            Err(Errno::EMFILE | Errno::ENFILE) => return stop("limit"),
            Err(_) => return stop("unknown"),
        };
        let probe = fd.try_clone().ok();
        let wait = Wait {
            dir: next.clone(),
            rest: after.to_vec(),
            shown: shown.clone(),
            writable,
        };
        match self.watch(fd, &next, wait) {
            Ok(_) => {}
            Err(Errno::EMFILE | Errno::ENFILE | Errno::ENOSPC | Errno::ENOMEM) => {
                return stop("limit")
            }
            Err(_) => return stop("unknown"),
        }
        // Only the descriptor limit makes a dup fail.
        let Some(probe) = probe else {
            return stop("limit");
        };
        if !after.is_empty() {
            return self.classify(probe.as_fd(), &next, after, shown, writable, depth + 1);
        }
        let names = match list(probe.as_fd()) {
            Ok(names) => names,
            Err(Errno::EMFILE | Errno::ENFILE) => return stop("limit"),
            Err(_) => return stop("unknown"),
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

/// On the writable side: what `name` in the directory `dir` is when that
/// directory is first watched for it, for a rescan (the first answer stays).
fn remember_first(
    first: &mut HashMap<(Key, OsString), (u64, u64)>,
    key: Key,
    dir: BorrowedFd,
    name: &OsStr,
) {
    if key.0 != Side::Writable || first.contains_key(&(key, name.to_os_string())) {
        return;
    }
    if let Ok(st) = statx(dir, name) {
        first.insert((key, name.to_os_string()), identity(&st));
    }
}

/// Each covered path inside a writable root, and every directory between
/// that root and it: the host replacing one of those (`mv cfg cfg.old;
/// mkdir cfg`) moves the cover's mount away with the old inode as surely
/// as a save over the file does (red team round 10). A covered directory
/// (`~/.kube` with HOME writable) counts as a file does.
fn covered_chain(covered: &[PathBuf], write: &[PathBuf]) -> std::collections::HashSet<PathBuf> {
    let mut out = std::collections::HashSet::new();
    for c in covered {
        let Some(root) = write
            .iter()
            .filter(|w| crate::paths::under(c, w) && c != *w)
            .max_by_key(|w| w.as_os_str().len())
        else {
            continue;
        };
        let mut at = c.as_path();
        while at != root.as_path() {
            out.insert(at.to_path_buf());
            match at.parent() {
                Some(p) => at = p,
                None => break,
            }
        }
    }
    out
}

fn under_any(p: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|w| crate::paths::under(p, w))
}

fn stop_unknown(path: &str) -> Option<Appeared> {
    Some(Appeared {
        path: PathBuf::from(path),
        why: "unknown",
    })
}

/// Raise our soft descriptor limit to the hard one: every fresh directory
/// at or under a denied name is watched through a descriptor of its own
/// (a first `gcloud` or Chrome start makes hundreds), and a descriptor we
/// cannot open stops the run. Called after the sandbox is forked, which
/// keeps the limit it was given.
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The words of the stderr message for each `why`.
pub fn describe(why: &str) -> &'static str {
    match why {
        "link" => "a link",
        "existing-file" => "an existing file moved or linked in",
        "existing-dir" => "an existing directory moved in",
        "unseen" => "something that was replaced or removed again before the watch could look at it",
        "replaced" => "something new put in place of the hidden one on the host, or of a directory on the way to it (a save by rename, a directory made anew: the sandbox's cover goes away with the old inode; a new run hides the new one)",
        "limit" => "a directory the watch could not follow (the helper's descriptor or inotify watch limit)",
        _ => "something the watch could not tell apart",
    }
}

mod age;
mod entries;
#[cfg(test)]
mod tests;

pub use age::{arm, settle, settle_needed};
use age::{btime_tells_age, now_ns, timestamp};
use entries::{identity, links_on_the_way, list, open_dir, statx};
