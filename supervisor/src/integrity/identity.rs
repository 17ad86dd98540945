//! What a nested repository's item was before the run, by content and
//! identity, so that the post-run check (nested.rs) judges what the sandbox
//! did to it, not when it last touched it: `chmod 755` on a hook that was
//! already executable, or `touch .git/config`, changes the ctime and
//! nothing git runs or obeys. An item whose inode, type, execute bits and
//! bytes are what they were is the user's; anything else is judged as
//! before (a malicious hook is still quarantined).
//!
//! The record is taken beside the run, in a thread started before the
//! command and waited for a moment before it starts (nested.rs walks the
//! roots). It is sound whenever it is taken: an item is recorded only when
//! its ctime, before and after its bytes are read, lies outside every
//! sandbox's window (or is one a past run already judged unchanged), so a
//! sandbox's write, which stamps a ctime inside its own window, can never
//! be recorded as the user's. What the thread has not reached when the
//! sandbox changes it is judged as before: by its ctime, failing closed.
//!
//! A judgement lasts: the item keeps the ctime the sandbox's touch gave it,
//! inside that run's window, so every later run would judge it again. The
//! identities judged unchanged (device, inode, ctime) are kept in airlock's
//! own directory, which no sandbox can write; any later change to the item
//! changes its ctime and voids the entry.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Larger items are not recorded (judged by ctime): hooks and configuration
/// are small, and reading a huge file is the sandbox's way to slow us.
const MAX_BYTES: u64 = 1 << 20;

/// Identities kept at most in the record of judged items.
const KEEP: usize = 4096;

/// One item's identity and content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub dev: u64,
    pub ino: u64,
    /// `S_IFMT` bits and the execute bits: a hook made executable runs.
    pub kind: u32,
    pub exec: u32,
    /// The permission bits, to put back when only they changed.
    pub perm: u32,
    pub ctime: (i64, i64),
    /// SHA-256 of the bytes (of a link: its target).
    pub hash: Vec<u8>,
    /// The bytes of a git configuration file (`config`,
    /// `config.worktree`): what the user's own repository had before the
    /// run is put back when a sandbox changed it, rather than a plain
    /// copy that drops the user's credential helper and signing keys.
    pub content: Option<Vec<u8>>,
}

/// Configuration files whose bytes are kept, and how many at most.
const CONFIG_NAMES: &[&str] = &["config", "config.worktree"];
const CONFIG_BYTES: usize = 64 << 10;

fn ctime_of(m: &std::fs::Metadata) -> (i64, i64) {
    (m.ctime(), m.ctime_nsec())
}

pub fn ctime_time(c: (i64, i64)) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::new(c.0.max(0) as u64, c.1.clamp(0, 999_999_999) as u32)
}

/// The item at `path` now: a regular file (opened without following a link
/// and without blocking on a FIFO the sandbox put there) or a link. `None`
/// for anything else, for a file past [`MAX_BYTES`], or when it changed
/// while being read.
pub fn observe(path: &Path) -> Option<Seen> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mut content = None;
    let hash = if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path).ok()?;
        digest(target.as_os_str().as_encoded_bytes())
    } else if meta.is_file() {
        if meta.len() > MAX_BYTES {
            return None;
        }
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        let opened = f.metadata().ok()?;
        if !opened.is_file() || opened.ino() != meta.ino() || opened.dev() != meta.dev() {
            return None;
        }
        let mut bytes = vec![];
        f.by_ref()
            .take(MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        let after = f.metadata().ok()?;
        if ctime_of(&after) != ctime_of(&meta) || bytes.len() as u64 > MAX_BYTES {
            return None;
        }
        let config = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| CONFIG_NAMES.contains(&n));
        let hash = digest(&bytes);
        if config && bytes.len() <= CONFIG_BYTES {
            content = Some(bytes);
        }
        hash
    } else {
        return None;
    };
    Some(Seen {
        dev: meta.dev(),
        ino: meta.ino(),
        kind: meta.mode() & libc::S_IFMT,
        exec: meta.mode() & 0o111,
        perm: meta.mode() & 0o7777,
        ctime: ctime_of(&meta),
        hash,
        content,
    })
}

fn digest(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

/// Whether `now` is `before` in everything git could see: the same inode,
/// type, execute bits and bytes (the ctime aside).
pub fn same(before: &Seen, now: &Seen) -> bool {
    before.dev == now.dev
        && before.ino == now.ino
        && before.kind == now.kind
        && before.exec == now.exec
        && before.hash == now.hash
}

/// Whether `now` differs from `before` only in its execute bits: the
/// user's bytes in the user's inode, made runnable or not runnable.
pub fn only_exec_changed(before: &Seen, now: &Seen) -> bool {
    before.kind == libc::S_IFREG
        && before.dev == now.dev
        && before.ino == now.ino
        && before.kind == now.kind
        && before.hash == now.hash
        && before.exec != now.exec
}

/// Put the permission bits `before` recorded back on `path`, if it is
/// still that inode (opened without following a link). Whatever the
/// sandbox set, a hook then runs, or does not, as the user left it.
pub fn put_mode_back(path: &Path, before: &Seen) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    match f.metadata() {
        Ok(m) if m.is_file() && m.dev() == before.dev && m.ino() == before.ino => f
            .set_permissions(std::fs::Permissions::from_mode(before.perm))
            .is_ok(),
        _ => false,
    }
}

type DevIno = (u64, u64);

/// Device and inode of the entry at `path` (a link itself, not followed).
fn dir_identity(path: &Path) -> Option<DevIno> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Items as they were before the run, filled by a thread beside it.
#[derive(Clone, Default)]
pub struct Before {
    items: Arc<Mutex<HashMap<PathBuf, Seen>>>,
    /// The git directories the record walked before the command started
    /// (by path, with the device and inode there then).
    dirs: Arc<Mutex<HashMap<PathBuf, Option<DevIno>>>>,
    late: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    done: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl Before {
    /// A git directory the walk found, with its device and inode; not once
    /// the command has started (what is found then may be its work).
    pub fn record_dir(&self, dir: PathBuf) {
        if self.late.load(Ordering::SeqCst) {
            return;
        }
        let id = dir_identity(&dir);
        if let Ok(mut d) = self.dirs.lock() {
            d.entry(dir).or_insert(id);
        }
    }

    /// The git directories the record walked.
    pub fn known_dirs(&self) -> Vec<PathBuf> {
        self.dirs
            .lock()
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The command started before the record was done: what it walks
    /// from now on may be the command's work, so no git directory found then
    /// is known from before (`knew_dir`).
    pub fn started_late(&self) {
        self.late.store(true, Ordering::SeqCst);
    }

    /// Whether git directory `dir` was there before the run. A directory
    /// by that name that is another inode now (the sandbox removed the
    /// user's, or an empty one it left, and renamed its own into place)
    /// was not there. One the record did not reach before the command
    /// started (a tree too large for the wait) is not known either: the
    /// check fails closed there, and may set aside what the user made in
    /// it since the last run (kept in the quarantine).
    pub fn knew_dir(&self, dir: &Path) -> bool {
        self.dirs.lock().is_ok_and(|d| {
            d.get(dir)
                .is_some_and(|then| then.is_some() && *then == dir_identity(dir))
        })
    }

    pub fn record(&self, path: PathBuf, seen: Seen) {
        if let Ok(mut m) = self.items.lock() {
            m.entry(path).or_insert(seen);
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn finished(&self) {
        let (lock, cv) = &*self.done;
        if let Ok(mut d) = lock.lock() {
            *d = true;
        }
        cv.notify_all();
    }

    /// Wait at most `budget` for the record to be complete.
    pub fn wait(&self, budget: Duration) -> bool {
        let (lock, cv) = &*self.done;
        let Ok(guard) = lock.lock() else { return false };
        cv.wait_timeout_while(guard, budget, |d| !*d)
            .map(|(d, _)| *d)
            .unwrap_or(false)
    }

    /// Stop the thread where it is; what it recorded stays.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn get(&self, path: &Path) -> Option<Seen> {
        self.items.lock().ok()?.get(path).cloned()
    }
}

/// The identities a past run judged unchanged: `dev ino ctime_s ctime_ns`.
#[derive(Default)]
pub struct Cleared {
    set: HashSet<(u64, u64, i64, i64)>,
    added: Vec<(u64, u64, i64, i64)>,
}

fn record_path() -> Option<PathBuf> {
    super::journal::path_of("judged").map(|p| p.with_extension(""))
}

impl Cleared {
    pub fn load() -> Cleared {
        let bytes = record_path()
            .and_then(|p| crate::paths::read_no_follow(&p).ok())
            .unwrap_or_default();
        let set = String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split(' ').collect();
                Some((
                    w.first()?.parse().ok()?,
                    w.get(1)?.parse().ok()?,
                    w.get(2)?.parse().ok()?,
                    w.get(3)?.parse().ok()?,
                ))
            })
            .collect();
        Cleared { set, added: vec![] }
    }

    pub fn holds(&self, s: &Seen) -> bool {
        self.set.contains(&(s.dev, s.ino, s.ctime.0, s.ctime.1))
    }

    pub fn add(&mut self, s: &Seen) {
        let key = (s.dev, s.ino, s.ctime.0, s.ctime.1);
        if self.set.insert(key) {
            self.added.push(key);
        }
    }

    /// Append what this run judged; rewritten, newest kept, when long.
    pub fn save(&self) {
        if self.added.is_empty() {
            return;
        }
        let Some(p) = record_path() else { return };
        let line = |k: &(u64, u64, i64, i64)| format!("{} {} {} {}\n", k.0, k.1, k.2, k.3);
        let text: String = self.added.iter().map(line).collect();
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
            .and_then(|mut f| {
                use std::io::Write;
                f.write_all(text.as_bytes())?;
                f.metadata()
            });
        match appended {
            Ok(m) if m.len() > 2 * KEEP as u64 * 48 => {
                // Keep the newest lines: an entry dropped only means that
                // item is judged by its ctime again (fails closed).
                if let Ok(bytes) = crate::paths::read_no_follow(&p) {
                    let text = String::from_utf8_lossy(&bytes);
                    let lines: Vec<&str> = text.lines().collect();
                    let keep = lines[lines.len().saturating_sub(KEEP)..].join("\n") + "\n";
                    let tmp = p.with_extension(format!("{}.tmp", std::process::id()));
                    let written = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&tmp)
                        .and_then(|mut f| {
                            use std::io::Write;
                            f.write_all(keep.as_bytes())
                        });
                    if written.is_ok() {
                        let _ = std::fs::rename(&tmp, &p);
                    } else {
                        let _ = std::fs::remove_file(&tmp);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("recording judged items in {}: {e}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_and_a_same_mode_chmod_keep_an_item_the_same() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let hook = d.path().join("pre-commit");
        std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let before = observe(&hook).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(same(&before, &observe(&hook).unwrap()));
        // Execute bits added: something new would run.
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o644)).unwrap();
        let off = observe(&hook).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o744)).unwrap();
        assert!(!same(&off, &observe(&hook).unwrap()));
        // Other bytes, or another inode with the same bytes.
        std::fs::write(&hook, "#!/bin/sh\nevil\n").unwrap();
        assert!(!same(&before, &observe(&hook).unwrap()));
        let other = d.path().join("x");
        std::fs::write(&other, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&other, &hook).unwrap();
        assert!(!same(&before, &observe(&hook).unwrap()));
    }
}
