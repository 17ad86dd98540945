//! Filesystem refusals explained (SPEC §7): which writes the command tried
//! where the boundary refuses them, so that the report and the stderr
//! block can say what was stopped and how to allow it, instead of leaving
//! the model with a bare `Permission denied` or `Read-only file system`.
//!
//! The connect() filter of `unixconnect.rs` also stops every call that
//! means to write (an `open` for writing or creating, `mkdir`, `rename`,
//! `link`, `symlink`, `mknod`, `chmod`, `truncate`), read-only opens
//! never. Deletions are not watched: `rm -rf node_modules` is thousands
//! of them, almost never outside the roots, and watching them doubled
//! the cost of unpacking and clearing trees. The supervisor reads the path, judges it against the plan
//! (outside every writable root, or protected inside one), records a
//! refusal, and lets the call go on unchanged (SECCOMP_USER_NOTIF_FLAG_
//! CONTINUE): Landlock and the mounts still decide, this only watches.
//! What a path names can change between this look and the kernel's; what
//! is recorded is the path as the command gave it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Distinct refusals kept; past it they are counted.
const CAP: usize = 1000;

use crate::refusal::FsRefusal;

#[derive(Default)]
struct Tally {
    seen: BTreeMap<(PathBuf, &'static str), (&'static str, u64)>,
    beyond: u64,
    /// The writable roots, for advice (`Rules::of` sets them).
    roots: Vec<PathBuf>,
}

static TALLY: Mutex<Option<Tally>> = Mutex::new(None);

/// What the plan grants, for judging paths.
pub struct Rules {
    write: Vec<PathBuf>,
    protected: Vec<PathBuf>,
    /// Hidden files covered read-only (linux/readwatch.rs).
    hidden: Vec<PathBuf>,
    /// Every protected path, whether it exists or not.
    protected_named: Vec<PathBuf>,
    /// What is bound back over the private /tmp (a workspace there).
    tmp_binds: Vec<PathBuf>,
}

impl Rules {
    pub fn of(plan: &crate::plan::Plan) -> Rules {
        // What is read-only inside: the deny_write paths that exist (the
        // protected set's included). A protected path that does not exist
        // yet can be written; the check sets it aside after, and says so.
        let protected = plan
            .deny_write
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .cloned()
            .collect();
        lock().get_or_insert_with(Tally::default).roots = plan.write.clone();
        Rules {
            write: plan.write.clone(),
            protected,
            protected_named: plan.deny_write.clone(),
            hidden: plan
                .deny_read_masks
                .iter()
                .map(|(h, _)| h.clone())
                .collect(),
            tmp_binds: plan
                .tmp_binds
                .iter()
                .chain(&plan.tmp_read_binds)
                .cloned()
                .collect(),
        }
    }

    /// Why a write to `path` is refused, if it is.
    fn judge(&self, path: &Path) -> Option<&'static str> {
        // A hidden file is covered read-only wherever it lies.
        if self.hidden.iter().any(|p| path == p) {
            return Some("deny_read");
        }
        // The sandbox's own: private /tmp and /dev/shm, its /dev and /proc
        // (but for what is bound back there from the host).
        if ["/tmp", "/dev", "/proc", "/dev/shm", "/run", "/var/run"]
            .iter()
            .any(|p| path.starts_with(p))
            && !self.tmp_binds.iter().any(|b| path.starts_with(b))
        {
            return None;
        }
        if self.protected.iter().any(|p| path.starts_with(p)) {
            return Some("protected");
        }
        if self.write.iter().any(|w| path.starts_with(w)) {
            return None;
        }
        // Outside the roots, a protected name that does not exist yet (a
        // `~/.bashrc` to come) stays protected once `--write` names it:
        // advice to widen to it would not work when followed.
        if self.protected_named.iter().any(|p| path.starts_with(p)) {
            return Some("protected");
        }
        Some("outside-writable-roots")
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Tally>> {
    TALLY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Record one refused attempt.
fn record(path: PathBuf, op: &'static str, rule: &'static str) {
    record_n(path, op, rule, 1);
}

/// A package manager's own cache or logs in HOME: its preset gives the
/// tool a cache of its own (per project), which no other run shares.
const TOOLS: &[(&str, &str)] = &[
    (".npm", "npm"),
    (".cargo/registry", "cargo"),
    (".cargo/git", "cargo"),
    (".cache/pip", "pypi"),
    (".cache/go-build", "go"),
    ("go/pkg/mod", "go"),
];

/// A write refused in a tool's cache counts for the cache as a whole: npm
/// alone writes a new log, an index entry and a content file on every run
/// (harness round 10), and the advice is the same for all of them.
fn folded(path: PathBuf, op: &'static str, rule: &str) -> (PathBuf, &'static str) {
    if rule != "outside-writable-roots" {
        return (path, op);
    }
    let Some(home) = std::env::var_os("HOME").map(PathBuf::from) else {
        return (path, op);
    };
    match TOOLS
        .iter()
        .map(|(d, _)| home.join(d))
        .find(|d| path.starts_with(d))
    {
        Some(cache) => (cache, "write"),
        None => (path, op),
    }
}

/// Record `n` refused attempts alike.
pub fn record_n(path: PathBuf, op: &'static str, rule: &'static str, n: u64) {
    let (path, op) = folded(path, op, rule);
    let mut g = lock();
    let t = g.get_or_insert_with(Tally::default);
    let key = (path, op);
    if let Some(e) = t.seen.get_mut(&key) {
        e.1 += n;
    } else if t.seen.len() < CAP {
        t.seen.insert(key, (rule, n));
    } else {
        t.beyond += n;
    }
}

/// Writes let go and not yet noted: the report waits for them (the last
/// write before a command's exit was lost from it now and then, under
/// load: the call goes on before its path is judged).
static JUDGING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One write being judged, until dropped.
pub struct Judging;

impl Judging {
    pub fn start() -> Judging {
        JUDGING.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Judging
    }
}

impl Drop for Judging {
    fn drop(&mut self) {
        JUDGING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Everything recorded so far, most frequent first, and the count of
/// those past the cap.
pub fn refusals() -> (Vec<FsRefusal>, u64) {
    // What was let go before now is noted first (a moment at most).
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while JUDGING.load(std::sync::atomic::Ordering::SeqCst) > 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    // The reads of hidden files the kernel told of since.
    super::readwatch::drain();
    let g = lock();
    let Some(t) = g.as_ref() else {
        return (vec![], 0);
    };
    let mut out: Vec<FsRefusal> = t
        .seen
        .iter()
        .map(|((path, op), (rule, count))| FsRefusal {
            path: crate::text::escape(&path.to_string_lossy()),
            op,
            rule,
            count: *count,
            how_to_allow: how_to_allow(path, op, rule, &t.roots),
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.count));
    (out, t.beyond)
}

fn how_to_allow(path: &Path, op: &str, rule: &str, roots: &[PathBuf]) -> String {
    match rule {
        "deny_read" => format!(
            "hidden (deny_read): the command sees an empty, read-only file in its place; a secret stays outside every sandbox (SPEC §3.3): pass what the command needs another way (--pass-env NAME for a variable), or read it outside the sandbox; `airlock policy explain --path {}` names the rule",
            crate::text::shown(path)
        ),
        // A repository's config: what a command usually wants from it
        // works without writing it (harness round 12).
        "protected" if path.ends_with(".git/config") || path.ends_with(".git/config.lock") => {
            "protected: host tools run or obey it, so no sandbox may write it (SPEC §4.5); for this command, `git -c key=value ...` (or GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, GIT_COMMITTER_EMAIL for an identity) sets it without writing the file; to keep it, change it outside the sandbox".into()
        }
        "protected" => "protected: host tools run or obey it, so no sandbox may write it (SPEC §4.5); change it outside the sandbox".into(),
        // Not a path to widen to: it is another project's cache (or this
        // project's record of itself), and making it writable would carry
        // one project's writes into another's sandbox.
        _ if crate::integrity::quarantine::airlock_cache()
            .is_some_and(|c| path.starts_with(c.join("projects"))) =>
        {
            "airlock's per-project caches: a sandbox writes only its own project's (SPEC §3.4; `airlock cache list`)".into()
        }
        _ => outside_roots(path, op, roots),
    }
}

/// Advice for a write outside the writable roots that works when
/// followed: `--write` takes a path that exists, so a directory that does
/// not is named with the `mkdir -p` it needs; never HOME or `/` whole
/// (the one file, made first, instead); and never the system's own
/// directories, which no sandboxed command should write.
fn outside_roots(path: &Path, op: &str, roots: &[PathBuf]) -> String {
    const SYSTEM: &[&str] = &[
        "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/opt", "/var/lib", "/root",
    ];
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let system = SYSTEM.iter().any(|s| path.starts_with(s))
        && !home.as_deref().is_some_and(|h| path.starts_with(h));
    if system {
        return format!(
            "outside the writable roots: {} is the system's, which a sandboxed command does not write; change it outside the sandbox",
            crate::text::shown(path)
        );
    }
    if let Some(h) = home.as_deref() {
        if let Some((dir, preset)) = TOOLS.iter().find(|(d, _)| path.starts_with(h.join(d))) {
            return format!(
                "outside the writable roots: {} is {preset}'s own cache; a run with --preset {preset} gives {preset} a cache of its own for this project",
                crate::text::shown(&h.join(dir))
            );
        }
    }
    // In a repository that holds the workspace (a one-shot run started in
    // a nested one took that as its workspace): the enclosing one is what
    // to name, not a directory of it.
    let outer = path.ancestors().skip(1).find(|d| {
        !home.as_deref().is_some_and(|h| h.starts_with(d))
            && roots.iter().any(|r| r != d && r.starts_with(d))
            && std::fs::symlink_metadata(d.join(".git")).is_ok()
    });
    if let Some(outer) = outer {
        let shown = crate::text::shown(outer);
        return format!(
            "outside the writable roots: the workspace is a repository nested in {shown}; --workspace {shown} makes the enclosing one the workspace"
        );
    }
    // A directory the command made is itself what is missing; a file's
    // directory is what `--write` would name.
    let dir = match op {
        "mkdir" => path,
        _ => path.parent().unwrap_or(path),
    };
    // The nearest directory that exists, and the first one below it that
    // does not (what `mkdir -p` must make).
    let mut missing = None;
    let mut at = dir;
    while std::fs::symlink_metadata(at).is_err() {
        missing = Some(at);
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    // HOME, or a directory that holds it: never advised whole.
    let whole = |d: &Path| {
        home.as_deref()
            .map_or(d == Path::new("/"), |h| h.starts_with(d))
    };
    match missing {
        Some(m) => {
            let shown = crate::text::shown(m);
            format!("outside the writable roots: mkdir -p {shown}, then --write {shown} (or add \"{shown}\" to [filesystem].write)")
        }
        None if whole(dir) => {
            let shown = crate::text::shown(path);
            format!("outside the writable roots: create {shown} outside the sandbox, then --write {shown}; its directory {} is not made writable whole", crate::text::shown(dir))
        }
        None => {
            let shown = crate::text::shown(dir);
            format!("outside the writable roots: --write {shown} or add \"{shown}\" to [filesystem].write")
        }
    }
}

/// The syscalls the filter stops, with where their path and flags are.
pub struct Call {
    pub nr: i64,
    pub op: &'static str,
    /// (dirfd argument or None for AT_FDCWD-relative, path argument).
    pub at: Option<usize>,
    pub path: usize,
    /// A second path (rename, link: the new name; symlink: the link).
    pub second: Option<(Option<usize>, usize)>,
}

/// Flags that make an open a write.
pub const WRITE_FLAGS: u32 = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u32;

pub fn calls() -> Vec<Call> {
    let c = |nr: i64, op, at, path, second| Call {
        nr,
        op,
        at,
        path,
        second,
    };
    #[allow(unused_mut)]
    let mut v = vec![
        c(libc::SYS_openat, "write", Some(0), 1, None),
        c(libc::SYS_mkdirat, "mkdir", Some(0), 1, None),
        c(libc::SYS_mknodat, "create", Some(0), 1, None),
        c(libc::SYS_renameat, "rename", Some(0), 1, Some((Some(2), 3))),
        c(
            libc::SYS_renameat2,
            "rename",
            Some(0),
            1,
            Some((Some(2), 3)),
        ),
        c(libc::SYS_linkat, "link", Some(2), 3, None),
        c(libc::SYS_symlinkat, "link", Some(1), 2, None),
        c(libc::SYS_fchmodat, "chmod", Some(0), 1, None),
        c(libc::SYS_truncate, "write", None, 0, None),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        c(libc::SYS_open, "write", None, 0, None),
        c(libc::SYS_creat, "create", None, 0, None),
        c(libc::SYS_mkdir, "mkdir", None, 0, None),
        c(libc::SYS_mknod, "create", None, 0, None),
        c(libc::SYS_rename, "rename", None, 0, Some((None, 1))),
        c(libc::SYS_link, "link", None, 1, None),
        c(libc::SYS_symlink, "link", None, 1, None),
        c(libc::SYS_chmod, "chmod", None, 0, None),
    ]);
    v
}

/// Where an open's flags are, for the filter: (nr, argument index).
pub fn open_flags() -> Vec<(i64, usize)> {
    #[allow(unused_mut)]
    let mut v = vec![(libc::SYS_openat, 2)];
    #[cfg(target_arch = "x86_64")]
    v.push((libc::SYS_open, 1));
    v
}

/// A NUL-terminated string of the caller's, at most PATH_MAX bytes.
fn read_path(pid: u32, addr: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let mut got = 0usize;
    // Page by page: a short string near the end of a mapping must not fail
    // for the bytes after it.
    while got < buf.len() {
        let here = addr as usize + got;
        let to_page_end = 4096 - (here % 4096);
        let want = to_page_end.min(buf.len() - got);
        let local = libc::iovec {
            iov_base: buf[got..].as_mut_ptr().cast(),
            iov_len: want,
        };
        let remote = libc::iovec {
            iov_base: here as *mut libc::c_void,
            iov_len: want,
        };
        // SAFETY: reads at most `want` bytes of the caller's memory into `buf`.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return None;
        }
        let n = n as usize;
        if let Some(end) = buf[got..got + n].iter().position(|b| *b == 0) {
            buf.truncate(got + end);
            return Some(buf);
        }
        got += n;
    }
    None
}

/// The caller's path made absolute, as far as it can be told from outside.
fn absolute(pid: u32, dirfd: Option<i64>, raw: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let p = Path::new(std::ffi::OsStr::from_bytes(raw));
    if p.is_absolute() {
        return Some(crate::paths::lexical(p));
    }
    let base = match dirfd {
        None => std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?,
        Some(fd) if fd as i32 == libc::AT_FDCWD => {
            std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?
        }
        Some(fd) => std::fs::read_link(format!("/proc/{pid}/fd/{}", fd as i32)).ok()?,
    };
    base.is_absolute()
        .then(|| crate::paths::lexical(&base.join(p)))
}

/// One stopped call's path arguments, copied while it waits: what the
/// caller does with its memory once it runs on cannot change them.
pub struct Seen {
    nr: i64,
    args: [u64; 6],
    op: &'static str,
    /// Made absolute while the call waits (its directory descriptor and
    /// working directory may be gone once it runs on).
    paths: Vec<PathBuf>,
}

pub fn copy_paths(pid: u32, nr: i64, args: &[u64; 6]) -> Option<Seen> {
    let call = calls().into_iter().find(|c| c.nr == nr)?;
    let mut paths = vec![];
    let mut one = |at: Option<usize>, path: usize| {
        if let Some(raw) = read_path(pid, args[path]).filter(|r| !r.is_empty()) {
            paths.extend(absolute(pid, at.map(|i| args[i] as i64), &raw));
        }
    };
    one(call.at, call.path);
    if let Some((at, path)) = call.second {
        one(at, path);
    }
    Some(Seen {
        nr,
        args: *args,
        op: call.op,
        paths,
    })
}

/// Judge what `copy_paths` saw, and note a refusal.
pub fn note(rules: &Rules, seen: &Seen) {
    for abs in &seen.paths {
        let abs = abs.clone();
        let Some(rule) = rules.judge(&abs) else {
            continue;
        };
        // Creating what already exists fails for that reason first
        // (`mkdir -p` walks every ancestor): not a refusal.
        if matches!(seen.op, "mkdir" | "link" | "create") && std::fs::symlink_metadata(&abs).is_ok()
        {
            continue;
        }
        let op = match seen.op {
            "write"
                if is_create(seen.nr, &seen.args) && std::fs::symlink_metadata(&abs).is_err() =>
            {
                "create"
            }
            op => op,
        };
        record(abs, op, rule);
    }
}

fn is_create(nr: i64, args: &[u64; 6]) -> bool {
    open_flags()
        .iter()
        .find(|(n, _)| *n == nr)
        .is_some_and(|(_, i)| args[*i] as u32 & libc::O_CREAT as u32 != 0)
}
