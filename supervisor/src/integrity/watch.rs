//! Watching, during the run, for protected paths that did not exist when it
//! started (SPEC §4.5): nothing can be mounted over an absent name, so the
//! moment the sandbox creates one is reported at once, and the post-run
//! check then quarantines it. Linux inotify, on the nearest existing parent.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::set::Protected;

pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<PathBuf>>,
}

/// Start watching the parents of every absent protected path.
pub fn start(set: &[Protected]) -> Option<Watch> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
    let mut dirs: HashMap<i32, (PathBuf, Vec<std::ffi::OsString>)> = HashMap::new();
    for p in set {
        let path = p.path();
        if std::fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        // The nearest existing ancestor, and the name below it on the way.
        let mut child = path.clone();
        while let Some(parent) = child.parent() {
            if parent.is_dir() {
                let Some(name) = child.file_name() else { break };
                let flags = AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_ONLYDIR;
                if let Ok(wd) = inotify.add_watch(parent, flags) {
                    let e = dirs
                        .entry(wd.as_raw())
                        .or_insert_with(|| (parent.to_path_buf(), vec![]));
                    e.1.push(name.to_os_string());
                }
                break;
            }
            child = parent.to_path_buf();
        }
    }
    if dirs.is_empty() {
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut seen = vec![];
        loop {
            // Once asked to stop, drain what is queued and leave.
            let stopping = flag.load(Ordering::Relaxed);
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(&inotify),
                PollFlags::POLLIN,
            )];
            let wait = if stopping { 0u16 } else { 100 };
            if poll(&mut fds, PollTimeout::from(wait)).unwrap_or(0) == 0 {
                if stopping {
                    break;
                }
                continue;
            }
            for ev in inotify.read_events().unwrap_or_default() {
                let (Some((dir, names)), Some(name)) = (dirs.get(&ev.wd.as_raw()), ev.name) else {
                    continue;
                };
                if names.contains(&name) {
                    let p = dir.join(&name);
                    eprintln!(
                        "airlock: the sandbox created {}, which host tools obey; it will be quarantined when the run ends",
                        crate::sources::shown(&p)
                    );
                    seen.push(p);
                }
            }
        }
        seen
    });
    Some(Watch { stop, thread })
}

impl Watch {
    /// Stop, and return what was seen being created.
    pub fn finish(self) -> Vec<PathBuf> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}
