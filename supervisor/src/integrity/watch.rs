//! Watching, during the run, for protected paths that did not exist when it
//! started (SPEC §4.5): nothing can be mounted over an absent name, so the
//! moment the sandbox creates one is reported at once, and the post-run
//! check then quarantines it. A name that redirects an existing repository
//! to code the sandbox controls (`commondir`, `config.worktree`, `gitdir`,
//! `alternates`, a hooks or info directory that was absent) would run on
//! the host's next `git status`, even during the run (an IDE polls it): the
//! sandbox is killed at once instead, and the check follows.
//! Linux inotify, on the nearest existing parent; an eventfd wakes it to stop.
//! It runs only where a repository could be redirected: closing an inotify
//! instance costs a kernel grace period.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::plan::protected::Protected;

pub struct Watch {
    wake: EventFd,
    thread: JoinHandle<(Vec<PathBuf>, Inotify)>,
}

/// What a watched name is: only reported, or grounds to end the run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Report,
    Kill,
}

/// How the watcher ends the sandbox: a pidfd of the helper and the signal
/// that tears it down.
pub struct Killer {
    pub pidfd: Option<OwnedFd>,
    pub signal: libc::c_int,
}

impl Killer {
    /// A pidfd for `pid` (our own unreaped child), so a signal sent after it
    /// was reaped and its pid reused reaches nobody.
    pub fn of(pid: libc::pid_t, signal: libc::c_int) -> Killer {
        // SAFETY: pidfd_open on our own child; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: a fresh descriptor we own.
            unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) }
        });
        Killer { pidfd, signal }
    }

    pub fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            // SAFETY: signalling through a pidfd we own.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    std::os::fd::AsRawFd::as_raw_fd(fd),
                    self.signal,
                    std::ptr::null::<libc::c_void>(),
                    0,
                )
            };
        }
    }
}

/// Names inside an existing git directory that point git elsewhere.
const REDIRECTS: &[&str] = &[
    "commondir",
    "config.worktree",
    "gitdir",
    "alternates",
    "hooks",
    "info",
];

/// Start watching the parents of every absent protected path.
pub fn start(set: &[Protected], killer: Arc<OnceLock<Killer>>) -> Option<Watch> {
    // The nearest existing ancestor of each absent path, and the name below
    // it on the way.
    let mut wanted: Vec<(PathBuf, std::ffi::OsString, Kind)> = vec![];
    for p in set {
        let path = p.path();
        if std::fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        let mut child = path.clone();
        while let Some(parent) = child.parent() {
            if parent.is_dir() {
                let Some(name) = child.file_name() else { break };
                // Absent directly inside a git directory that exists: a redirect.
                let in_git_dir = child == path
                    && p.git
                    && parent.join("HEAD").exists()
                    && REDIRECTS.iter().any(|r| name == *r);
                let kind = if in_git_dir { Kind::Kill } else { Kind::Report };
                wanted.push((parent.to_path_buf(), name.to_os_string(), kind));
                break;
            }
            child = parent.to_path_buf();
        }
    }
    // Closing an inotify instance waits for an SRCU grace period (15–20 ms
    // here, on every run's exit path), even one that never had a watch:
    // make one only when a creation would be grounds to stop the sandbox.
    // Names that are only reported are caught by the post-run check just
    // the same.
    if !wanted.iter().any(|(_, _, k)| *k == Kind::Kill) {
        return None;
    }
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
    let mut dirs: HashMap<i32, (PathBuf, Vec<(std::ffi::OsString, Kind)>)> = HashMap::new();
    let flags = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR;
    for (parent, name, kind) in wanted {
        if let Ok(wd) = inotify.add_watch(&parent, flags) {
            dirs.entry(wd.as_raw())
                .or_insert_with(|| (parent, vec![]))
                .1
                .push((name, kind));
        }
    }
    let wake =
        EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).ok()?;
    let wake_fd = wake.as_fd().try_clone_to_owned().ok()?;
    let cache = super::quarantine::airlock_cache();
    let thread = std::thread::spawn(move || {
        let mut seen = vec![];
        loop {
            let mut fds = [
                PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
                PollFd::new(wake_fd.as_fd(), PollFlags::POLLIN),
            ];
            if poll(&mut fds, PollTimeout::NONE).is_err() {
                break;
            }
            let stopping = fds[1]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLIN));
            for ev in inotify.read_events().unwrap_or_default() {
                let (Some((dir, names)), Some(name)) = (dirs.get(&ev.wd.as_raw()), ev.name) else {
                    continue;
                };
                let Some((_, kind)) = names.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                let p = dir.join(&name);
                if *kind == Kind::Kill {
                    // The sandbox may act before its handle is published.
                    let t = Instant::now();
                    while killer.get().is_none() && t.elapsed() < Duration::from_secs(2) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if let Some(k) = killer.get() {
                        k.kill();
                    }
                    eprintln!(
                        "airlock: the sandbox created {}, which would make git run code it controls; the sandbox was stopped",
                        crate::text::shown(&p)
                    );
                } else if !cache.as_ref().is_some_and(|c| p.starts_with(c)) {
                    // In airlock's own caches a tool's empty marker is
                    // usual (uv's `.git`): the post-run check decides,
                    // and reports it when it holds anything.
                    eprintln!(
                        "airlock: the sandbox created {}, which host tools obey; it will be quarantined when the run ends",
                        crate::text::shown(&p)
                    );
                }
                seen.push(p);
            }
            if stopping {
                break;
            }
        }
        (seen, inotify)
    });
    Some(Watch { wake, thread })
}

impl Watch {
    /// Stop at once (after what is queued), and return what was seen created.
    pub fn finish(self) -> Vec<PathBuf> {
        let _ = self.wake.write(1);
        match self.thread.join() {
            Ok((seen, inotify)) => {
                close_elsewhere(OwnedFd::from(inotify));
                seen
            }
            Err(_) => vec![],
        }
    }
}

/// Close `fd` in a short-lived process of its own: the last close of an
/// inotify instance waits for an SRCU grace period (15 to 20 ms), which
/// neither this run's exit nor its caller should wait for (a one-shot run
/// in a git repository paid it on every command). The process shares our
/// memory, not our descriptor table, and makes two system calls on a stack
/// of its own; nothing waits for it.
fn close_elsewhere(fd: OwnedFd) {
    use std::os::fd::IntoRawFd;
    struct Job {
        fd: libc::c_int,
        /// Set once our own copy is closed: the child's close is the last.
        ours_closed: std::sync::atomic::AtomicBool,
    }
    extern "C" fn close_and_exit(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is a leaked `Job`; raw system calls only, on a
        // descriptor in our own copy of the table.
        unsafe {
            let job = &*(arg as *const Job);
            for _ in 0..100_000 {
                if job.ours_closed.load(std::sync::atomic::Ordering::Acquire) {
                    break;
                }
                libc::syscall(libc::SYS_sched_yield);
            }
            libc::syscall(libc::SYS_close, job.fd);
            libc::syscall(libc::SYS_exit, 0);
        }
        0
    }
    // Leaked on purpose: the process may still run on it after we return.
    let stack: &'static mut [u8] = Box::leak(vec![0u8; 16 * 1024].into_boxed_slice());
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let raw = fd.into_raw_fd();
    let job: &'static Job = Box::leak(Box::new(Job {
        fd: raw,
        ours_closed: std::sync::atomic::AtomicBool::new(false),
    }));
    // SAFETY: the child runs `close_and_exit` on its own leaked stack and
    // reads only the leaked `job`; no CLONE_FILES, so its close is of its
    // own copy. Exit signal 0: it is never waited for.
    unsafe {
        libc::clone(
            close_and_exit,
            top as *mut libc::c_void,
            libc::CLONE_VM,
            job as *const Job as *mut libc::c_void,
        )
    };
    // SAFETY: our own descriptor; with the child holding a copy this close
    // is not the last one (and if the clone failed, it is, as before).
    unsafe { libc::close(raw) };
    job.ours_closed
        .store(true, std::sync::atomic::Ordering::Release);
}
