//! Reads of hidden files, for the report (SPEC §7): a `deny_read` file
//! that exists when the sandbox starts is covered by an empty file of
//! airlock's own (read-only, one per hidden file) instead of `/dev/null`,
//! and each of those carries a fanotify mark for opens. The kernel tells
//! airlock when the command opened one, so `cat .env` is reported as a
//! refused read of `.env` and not left as an empty file the model cannot
//! tell from a real one. Unprivileged fanotify (Linux 5.13+) allows
//! exactly this: inode marks, notification only, events by file handle;
//! one group per file, so that an event needs no handle to be told apart.
//!
//! Not seen: a name looked up below a hidden directory (`cat
//! ~/.ssh/id_rsa` finds nothing in an empty directory, and lookups raise
//! no event), and what Landlock refuses (a hidden file the host makes
//! during the run). Those are still refused, and say "Permission denied"
//! or "No such file" only.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::plan::Plan;

/// Files watched one by one; past it the rest get `/dev/null` as before
/// (a group each: the default limit is 128 groups a user).
const MAX: usize = 32;

struct Watched {
    /// The hidden file, as the report names it.
    path: PathBuf,
    group: OwnedFd,
}

struct Masks {
    dir: PathBuf,
    watched: Vec<Watched>,
}

static MASKS: Mutex<Option<Masks>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Masks>> {
    MASKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Before the plan goes to the sandbox: a watched empty file for each
/// hidden file that exists (`plan.deny_read_masks`, which the mounts use
/// in place of `/dev/null`). What cannot be watched keeps `/dev/null`.
pub fn prepare(plan: &mut Plan) {
    let Some(base) = covers_dir(plan) else {
        return;
    };
    let files: Vec<PathBuf> = plan
        .covered_at_start(std::fs::Metadata::is_file)
        .into_iter()
        .take(MAX)
        .collect();
    tracing::debug!(files = files.len(), "hidden files to watch for reads");
    if files.is_empty() {
        return;
    }
    // Those of runs whose airlock was killed go first.
    if let Ok(rd) = std::fs::read_dir(&base) {
        for e in rd.flatten() {
            let name = e.file_name();
            if let Some(pid) = name.to_str().and_then(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill with signal 0 only asks whether it exists.
                let alive = unsafe { libc::kill(pid, 0) } == 0
                    || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
                if !alive || pid == std::process::id() as i32 {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let dir = base.join(std::process::id().to_string());
    if let Err(e) = crate::paths::own_private_dir(&dir) {
        tracing::debug!("reads of hidden files are not reported: {e:#}");
        return;
    }
    let mut watched = vec![];
    for (n, path) in files.into_iter().enumerate() {
        let mask = dir.join(n.to_string());
        if std::fs::write(&mask, b"").is_err() {
            continue;
        }
        let Some(group) = watch(&mask) else {
            let _ = std::fs::remove_file(&mask);
            continue;
        };
        plan.deny_read_masks.push((path.clone(), mask));
        watched.push(Watched { path, group });
    }
    *lock() = Some(Masks { dir, watched });
}

/// Covers for a project's tool configuration without its credentials
/// (project_secrets.rs), beside the covers of hidden files; a file whose
/// copy cannot be written is hidden whole instead (fails closed).
pub fn sanitised(plan: &mut Plan, files: Vec<(PathBuf, String)>) {
    if files.is_empty() {
        return;
    }
    let dir = covers_dir(plan).map(|b| b.join(std::process::id().to_string()));
    let dir = dir.filter(|d| {
        std::fs::create_dir_all(d.parent().unwrap_or(d)).is_ok()
            && crate::paths::own_private_dir(d).is_ok()
    });
    for (n, (file, text)) in files.into_iter().enumerate() {
        let copy = dir.as_ref().map(|d| d.join(format!("sanitised-{n}")));
        match copy {
            Some(c) if std::fs::write(&c, text).is_ok() => plan.sanitised.push((file, c)),
            _ => plan.deny_read_env.push(file),
        }
    }
}

/// Where the covers live: somewhere every sandbox has hidden, for one that
/// opened another run's cover made that run report a read its command
/// never made (red team round 8). `$XDG_RUNTIME_DIR` under `/run` or
/// `/tmp` (each sandbox mounts its own there), else beside the CA, which
/// every sandbox has hidden (a `deny_read` default); a further hidden
/// path of its own cost every run a mount and a Landlock split.
fn covers_dir(plan: &Plan) -> Option<PathBuf> {
    // Judged where it leads: a link or `..` in the variable otherwise
    // named a place under /run that is not (red team round 9).
    let run = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .and_then(|d| std::fs::canonicalize(d).ok())
        .filter(|d| d.is_dir())
        .filter(|d| d.starts_with("/run") || d.starts_with("/tmp"))
        // Unless this run is given it (`--read`/`--write` on it or above):
        // then other runs' covers would be within its reach (red team
        // round 10).
        .filter(|d| {
            !plan
                .read
                .iter()
                .chain(&plan.write)
                .chain(&plan.tmp_binds)
                .chain(&plan.tmp_read_binds)
                .any(|r| d.starts_with(r) || r.starts_with(d))
        });
    match run {
        Some(d) => Some(d.join("airlock/masks")),
        None => crate::places::ca_dir().ok().map(|d| d.join("masks")),
    }
}

/// A notification group with a mark for opens of `file`.
fn watch(file: &Path) -> Option<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: fanotify_init takes flags only.
    let fd = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_FID,
            libc::O_RDONLY as libc::c_uint,
        )
    };
    if fd < 0 {
        tracing::debug!(
            "fanotify unavailable ({}): reads of hidden files are not reported",
            std::io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: a descriptor fanotify_init just returned, owned from here.
    let group = unsafe { OwnedFd::from_raw_fd(fd) };
    let c = std::ffi::CString::new(file.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid group, a NUL-terminated path.
    let rc = unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_DONT_FOLLOW,
            libc::FAN_OPEN | libc::FAN_OPEN_EXEC,
            libc::AT_FDCWD,
            c.as_ptr(),
        )
    };
    if rc != 0 {
        tracing::debug!(
            "fanotify mark on {} failed ({}): its reads are not reported",
            file.display(),
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(group)
}

/// How many events wait on `group` (an overflow counts as one more), but
/// for airlock's own opens: with HOME writable the covers lie in a
/// writable root, and the post-run check reads them (red team round 9).
fn pending(group: &OwnedFd) -> u64 {
    let own = std::process::id() as i32;
    let mut buf = [0u8; 4096];
    let mut n = 0;
    loop {
        // SAFETY: read into a buffer we own, of the size given.
        let got = unsafe { libc::read(group.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if got <= 0 {
            return n;
        }
        let got = got as usize;
        let mut at = 0;
        let head = std::mem::size_of::<libc::fanotify_event_metadata>();
        while at + head <= got {
            // SAFETY: at least a header's bytes remain; read unaligned.
            let m: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
            if m.event_len as usize == 0 {
                break;
            }
            if m.pid != own {
                n += 1;
            }
            at += m.event_len as usize;
        }
    }
}

/// Every open of a hidden file since the last call, into the report's
/// refusals (`fsrefusals`).
pub fn drain() {
    let g = lock();
    let Some(masks) = g.as_ref() else { return };
    for w in &masks.watched {
        let n = pending(&w.group);
        if n > 0 {
            super::fsrefusals::record_n(w.path.clone(), "read", "deny_read", n);
        }
    }
}

/// Once the sandbox is gone: the files and their marks.
pub fn finish() {
    drain();
    if let Some(masks) = lock().take() {
        drop(masks.watched);
        let _ = std::fs::remove_dir_all(&masks.dir);
    }
}
