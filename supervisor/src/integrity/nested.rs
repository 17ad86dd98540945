//! Repositories below a writable root that the protected set does not name
//! in advance (a `git init` in a subdirectory, a vendored clone, a bare
//! repository, a submodule's or worktree's git directory, one assembled
//! from parts). Finding them needs a walk, but only of directory entries
//! (`getdents`, no `stat` per file), and only after the run.
//!
//! A candidate is anything git could take as a git directory: every
//! `.git` entry, and every directory holding an entry named `HEAD`, valid
//! or not (git's own test looks at `objects` and `refs` with `access`, and
//! in the common directory that `commondir` names, which a candidate's
//! shape does not show). What git reads there as configuration or runs as
//! code (its surface, its common directory's, the hooks its `hooks` link
//! or `core.hooksPath` leads to, the files its includes name, a rebase's
//! or cherry-pick's remaining steps and merge strategy) is judged by when
//! it last changed: within any sandbox's run (`windows.rs`), this one's or
//! an earlier one's, it is the sandbox's, and is moved to the quarantine
//! (a configuration replaced by its program-free keys). What the user
//! changed between runs is theirs and left alone, and so is an item whose
//! content and identity the run did not change (a `touch`, a `chmod` to
//! the mode it had): a ctime alone never condemns the user's file
//! (identity.rs).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::dir::{Dir, Type};
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::fstatat;

use super::identity::{observe, only_exec_changed, put_mode_back, same, Before, Cleared};
use super::snapshot::{open_dir, Change, ChangeKind, State};
use super::windows::Windows;
use crate::plan::protected::{
    git_dir_surface, git_joined as joined, git_path_file, Protected, DOT_GIT, GIT_DIR_MARK,
};

/// Whether a sandbox made an item what it is: its ctime lies in a
/// sandbox's window, and it is not, by content and identity, what the
/// user had before the run (identity.rs) or what a past run judged.
pub struct Judge<'a> {
    pub windows: &'a Windows,
    pub before: &'a Before,
    pub cleared: std::cell::RefCell<Cleared>,
    /// Items whose execute bits alone the sandbox changed, put back as the
    /// user had them (rather than moving the user's file away).
    pub modes_restored: std::cell::RefCell<Vec<PathBuf>>,
}

impl Judge<'_> {
    /// Whether `path` arrived with a directory the sandbox moved into a git
    /// directory's surface (a `hooks` or `info`, a hooks manager's
    /// directory): a rename changes that directory's ctime only, and what
    /// it holds keeps the ctimes it had (the user's checkout of the
    /// sandbox's branch, say: red team round 4). What was there before the
    /// run, unchanged, is the user's.
    fn moved_in(&self, path: &Path, git_dir: &Path) -> bool {
        let Some(parent) = path.parent() else {
            return false;
        };
        parent != git_dir
            && written_in(parent, self.windows)
            && self.uncleared(path)
            && !self
                .before
                .get(path)
                .is_some_and(|b| observe(path).is_some_and(|now| same(&b, &now)))
    }

    /// Whether `path` is there and no past check cleared it as it is now
    /// (airlock's own plain config, an item judged unchanged).
    fn uncleared(&self, path: &Path) -> bool {
        observe(path).is_some_and(|now| !self.cleared.borrow().holds(&now))
    }

    fn sandboxs(&self, path: &Path) -> bool {
        if !written_in(path, self.windows) {
            return false;
        }
        let Some(now) = observe(path) else {
            return true;
        };
        let mut cleared = self.cleared.borrow_mut();
        if cleared.holds(&now) {
            return false;
        }
        let Some(before) = self.before.get(path) else {
            return true;
        };
        if same(&before, &now) {
            cleared.add(&now);
            return false;
        }
        if only_exec_changed(&before, &now) && put_mode_back(path, &before) {
            if let Some(again) = observe(path).filter(|a| same(&before, a)) {
                cleared.add(&again);
            }
            self.modes_restored.borrow_mut().push(path.to_path_buf());
            return false;
        }
        true
    }
}

/// Directories visited at most. Past it the check fails loudly: a tree the
/// sandbox made huge must not hide a repository.
const MAX_DIRS: usize = 20_000_000;

pub struct Walk {
    /// Candidate git directories: `.git` entries (directories, `gitdir:`
    /// files, links) and directories holding an entry named `HEAD`.
    pub found: Vec<PathBuf>,
    /// Files at any depth that name the program a host tool runs in place
    /// of its own ([`crate::plan::protected::redirects_tool`]).
    pub redirects: Vec<PathBuf>,
    pub dirs: usize,
    pub complete: bool,
}

/// Whether a file `name` in `dir` is a dotenv file that a trusted
/// `.envrc` there or above may load (`dotenv`, `dotenv_if_exists .env.local`):
/// direnv exports what it says into the user's shell (`PROMPT_COMMAND`,
/// `PATH`) without asking again (red team round 14). A `.env` that exists
/// when a run starts is covered read-only; one a sandbox makes is judged.
fn loaded_by_direnv(name: &OsStr, dir: &Path) -> bool {
    name.as_bytes().starts_with(b".env")
        && !name.as_bytes().starts_with(b".envrc")
        && crate::dotenv::is_secret_name(name)
        && dir
            .ancestors()
            .any(|d| std::fs::symlink_metadata(d.join(".envrc")).is_ok())
}

/// Filesystems that hold no file a sandbox writes: a walk from `/` (only
/// with `--workspace /` or `--write /`) does not descend into them. Every
/// other filesystem below a writable root is walked: a mount there (a
/// cache, a volume) is as writable to the sandbox as the root.
#[cfg(target_os = "linux")]
fn pseudo_filesystem(fd: &OwnedFd) -> bool {
    const PSEUDO: &[i64] = &[
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x1cd1,      // devpts
        0x2762_5742, // cgroup
        0x6367_7270, // cgroup2
        0x7363_6673, // securityfs
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0xcafe_4a11, // bpf
        0x6265_6570, // configfs
        0x6573_5546, // fusectl
        0x1980_0202, // mqueue
        0x6c6f_6f70, // binfmt_misc
        0x6e73_6673, // nsfs
    ];
    // The field's type is the C library's (`__fsword_t`).
    #[allow(clippy::unnecessary_cast)]
    let magic = |s: nix::sys::statfs::Statfs| s.filesystem_type().0 as i64;
    nix::sys::statfs::fstatfs(fd).is_ok_and(|s| PSEUDO.contains(&magic(s)))
}

/// Elsewhere (macOS) every filesystem below a root is walked.
#[cfg(not(target_os = "linux"))]
fn pseudo_filesystem(_: &OwnedFd) -> bool {
    false
}

/// Every candidate below `root`, `root` itself and the inside of every
/// `.git` included (a submodule's git directory made in
/// `.git/modules/<any/depth>` is the user's next `git submodule update`).
pub fn find(root: &Path) -> Walk {
    find_opening(root, &|_: &Path, _: &nix::sys::stat::FileStat| false)
}

/// [`find`], where a directory the search may not list (an ordinary
/// user's directory left without read or search permission: the user's
/// `cd` and git need only search permission below it) is given back its
/// owner's read and search bits when `open_up` says so (it was written
/// while a sandbox ran), and walked; else the walk is incomplete.
///
/// A directory is opened only when its turn comes, from its parent's
/// descriptor (kept while a child waits): a directory with more
/// subdirectories than the process may open files used to run the search
/// out of descriptors, and hide what lay below (red team round 5).
pub fn find_opening(
    root: &Path,
    open_up: &dyn Fn(&Path, &nix::sys::stat::FileStat) -> bool,
) -> Walk {
    walk_below(root, open_up, true)
}

/// `deep`: every directory below `root`; else `root` alone (its entries).
fn walk_below(
    root: &Path,
    open_up: &dyn Fn(&Path, &nix::sys::stat::FileStat) -> bool,
    deep: bool,
) -> Walk {
    use std::rc::Rc;
    /// A directory waiting its turn: its name and its parent's node (a
    /// path is made only for what is found: a copy of each pending
    /// directory's path made a deep tree cost memory by the square of its
    /// depth, and the supervisor died before it judged anything, red team
    /// round 6).
    struct Node {
        parent: Option<Rc<Node>>,
        name: OsString,
    }
    fn path_of(node: &Node) -> PathBuf {
        let mut names = vec![node.name.as_os_str()];
        let mut at = node.parent.as_deref();
        while let Some(n) = at {
            names.push(n.name.as_os_str());
            at = n.parent.as_deref();
        }
        names.iter().rev().collect()
    }
    let mut walk = Walk {
        found: vec![],
        redirects: vec![],
        dirs: 0,
        complete: true,
    };
    let _raised = crate::paths::raise_open_files_limit();
    let Ok(fd) = super::snapshot::open_root(root) else {
        walk.complete = false;
        return walk;
    };
    let top = Rc::new(Node {
        parent: None,
        name: root.as_os_str().to_os_string(),
    });
    // (the parent's descriptor, kept while a child waits, or the root's
    // own descriptor; the directory's node)
    enum At {
        Root(OwnedFd),
        In(Rc<OwnedFd>),
    }
    let mut stack: Vec<(At, Rc<Node>)> = vec![(At::Root(fd), top)];
    while let Some((at, node)) = stack.pop() {
        let fd = match at {
            At::Root(fd) => fd,
            At::In(parent) => match open_dir(parent.as_fd(), Path::new(&node.name)) {
                Ok(sub) if pseudo_filesystem(&sub) => continue,
                Ok(sub) => sub,
                Err(
                    nix::errno::Errno::ENOTDIR
                    | nix::errno::Errno::ELOOP
                    | nix::errno::Errno::ENOENT,
                ) => continue,
                Err(nix::errno::Errno::EACCES) => {
                    match opened_up(&parent, &node.name, &path_of(&node), open_up) {
                        Some(sub) => sub,
                        None => {
                            walk.complete = false;
                            continue;
                        }
                    }
                }
                Err(_) => {
                    walk.complete = false;
                    continue;
                }
            },
        };
        walk.dirs += 1;
        if walk.dirs > MAX_DIRS {
            walk.complete = false;
            break;
        }
        // Read through a second descriptor: the listing's buffer goes once
        // read, and only the descriptor stays for the children.
        let Ok(mut dir) = nix::unistd::dup(&fd).and_then(Dir::from_fd) else {
            walk.complete = false;
            continue;
        };
        let mut subdirs: Vec<OsString> = vec![];
        let mut head = false;
        for entry in dir.iter() {
            let Ok(entry) = entry else {
                walk.complete = false;
                break;
            };
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let name = OsStr::from_bytes(raw).to_os_string();
            head |= raw == GIT_DIR_MARK.as_bytes();
            if raw == DOT_GIT.as_bytes() {
                walk.found.push(path_of(&node).join(&name));
            }
            let dir_name = Path::new(&node.name).file_name().unwrap_or_default();
            if crate::plan::protected::redirects_tool(dir_name, &name)
                || (dir_name == "conf.d"
                    && crate::plan::protected::redirects_tool_path(&path_of(&node).join(&name)))
                || (crate::plan::protected::redirect_dir(&name)
                    && crate::plan::protected::redirect_link(&path_of(&node).join(&name))
                    && match entry.file_type() {
                        Some(t) => t == Type::Symlink,
                        None => nix::sys::stat::fstatat(
                            &fd,
                            Path::new(&name),
                            AtFlags::AT_SYMLINK_NOFOLLOW,
                        )
                        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK),
                    })
                || loaded_by_direnv(&name, &path_of(&node))
            {
                walk.redirects.push(path_of(&node).join(&name));
            }
            if matches!(entry.file_type(), Some(Type::Directory) | None) {
                subdirs.push(name);
            }
        }
        drop(dir);
        if head {
            // Still walked below: `touch HEAD` costs the sandbox nothing
            // and must not hide what lies underneath.
            walk.found.push(path_of(&node));
        }
        if subdirs.is_empty() || !deep {
            continue;
        }
        // Not following links: a link to elsewhere is not walked (each
        // child is opened with O_NOFOLLOW from this descriptor).
        let own = Rc::new(fd);
        for name in subdirs {
            let child = Rc::new(Node {
                parent: Some(node.clone()),
                name,
            });
            stack.push((At::In(own.clone()), child));
        }
    }
    walk
}

/// A directory below `parent` that the search may not list, given back
/// its owner's read and search bits when it is ours and `open_up` agrees,
/// then opened. Reached by `O_PATH` without following links, and changed
/// through that handle: the name cannot be swapped for a link meanwhile.
fn opened_up(
    parent: &OwnedFd,
    name: &OsStr,
    path: &Path,
    open_up: &dyn Fn(&Path, &nix::sys::stat::FileStat) -> bool,
) -> Option<OwnedFd> {
    let handle = openat(
        parent.as_fd(),
        Path::new(name),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let st = nix::sys::stat::fstat(&handle).ok()?;
    if st.st_uid != nix::unistd::geteuid().as_raw() || !open_up(path, &st) {
        return None;
    }
    let via = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    let mode = nix::sys::stat::Mode::from_bits_truncate(st.st_mode | 0o500);
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &via,
        mode,
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .ok()?;
    tracing::info!(dir = %path.display(), "a directory the sandbox left unreadable was given back its owner's read and search permission, to be searched");
    openat(
        handle.as_fd(),
        Path::new("."),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()
}

/// Entries git never runs or obeys as code: sample hooks and the exclude list.
fn inert(dir: &OsStr, name: &OsStr) -> bool {
    (dir == "hooks" && name.as_bytes().ends_with(b".sample"))
        || (dir == "info" && name == "exclude")
}

/// Now, by the clock the kernel stamps ctime with (a coarse one, which can
/// lag `SystemTime::now()` by a tick): the ctime of a fresh memory file.
#[cfg(target_os = "linux")]
pub fn kernel_now() -> SystemTime {
    let stamped =
        nix::sys::memfd::memfd_create(c"airlock-clock", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .and_then(|fd| nix::sys::stat::fstat(&fd))
            .map(|st| ctime_of(&st));
    stamped.unwrap_or_else(|_| SystemTime::now() - Duration::from_millis(20))
}

/// Elsewhere: now, less a margin for a coarse filesystem clock.
#[cfg(not(target_os = "linux"))]
pub fn kernel_now() -> SystemTime {
    SystemTime::now() - Duration::from_millis(20)
}

fn ctime_of(st: &nix::sys::stat::FileStat) -> SystemTime {
    SystemTime::UNIX_EPOCH
        + Duration::new(
            st.st_ctime.max(0) as u64,
            st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
        )
}

/// Whether the inode at `path` (a link itself, not followed) last changed
/// while a sandbox ran: written, created, renamed, linked, its mode set.
fn written_in(path: &Path, windows: &Windows) -> bool {
    fstatat(nix::fcntl::AT_FDCWD, path, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| windows.covers(path, ctime_of(&st)))
}

/// The common directory of git directory `git_dir`, as git finds it: the
/// one its `commondir` file names, else itself. Read after the run, when
/// nothing of the sandbox is left to move it; `None` when it leads
/// nowhere (the `commondir` file itself is then a surface item).
fn common_dir(git_dir: &Path) -> Option<PathBuf> {
    let file = git_dir.join("commondir");
    if std::fs::symlink_metadata(&file).is_err() {
        return Some(git_dir.to_path_buf());
    }
    std::fs::canonicalize(joined(git_dir, git_path_file(&file, true)?)).ok()
}

/// Where a `.git` file points (`gitdir: <path>`), as git reads it.
fn gitdir_target(dot_git: &Path) -> Option<PathBuf> {
    let bytes = git_path_file(dot_git, true)?;
    let rest = bytes.strip_prefix(b"gitdir: ")?.to_vec();
    std::fs::canonicalize(joined(dot_git.parent()?, rest)).ok()
}

/// The entries of a hooks directory, each a surface item (a hook added or
/// replaced), sample hooks aside; where a link to it leads, by the real
/// path (so that what is moved is the hook, not the link on the way).
fn hook_entries(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(real) = std::fs::canonicalize(dir) else {
        return;
    };
    if let Ok(rd) = std::fs::read_dir(real) {
        out.extend(
            rd.flatten()
                .filter(|e| !inert(OsStr::new("hooks"), &e.file_name()))
                .map(|e| e.path()),
        );
    }
}

/// Everything below `dir` (links not followed), `depth` levels down: a
/// hook manager's script directories (`.lefthook/<hook>/<script>`).
fn entries_below(dir: &Path, depth: u8, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if depth > 1 && e.file_type().is_ok_and(|t| t.is_dir()) {
            entries_below(&p, depth - 1, out);
        }
        out.push(p);
    }
}

/// How git reads `core.hooksPath` and includes for one repository: the
/// work trees its relative hooks path is resolved in, the user's home for
/// `~/`, the hooks paths of the user's and the system's configuration
/// (they apply to every repository), and the windows: a configuration a
/// sandbox wrote is replaced by its program-free keys, so what it names is
/// never followed (it could name any file to be moved, red team round 21).
struct Reach<'a> {
    tops: Vec<PathBuf>,
    home: Option<&'a Path>,
    global_hooks: &'a [Vec<u8>],
    judge: &'a Judge<'a>,
}

/// The values of `key` (and, for includes, the include keys) in the git
/// config file `config`, asked of git only when the file mentions them.
fn config_values(config: &Path, regexp: &str, words: &[&[u8]]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(text) = std::fs::read(config) else {
        return vec![];
    };
    let lower = text.to_ascii_lowercase();
    if !words
        .iter()
        .any(|w| lower.windows(w.len()).any(|x| x == *w))
    {
        return vec![];
    }
    let listed = super::quarantine::git_config_of(config, &["--get-regexp", regexp]).output();
    let Ok(out) = listed else { return vec![] };
    out.stdout
        .split(|b| *b == 0)
        .filter_map(|item| {
            let nl = item.iter().position(|b| *b == b'\n')?;
            Some((item[..nl].to_vec(), item[nl + 1..].to_vec()))
        })
        .collect()
}

/// The hooks in a hooks path: its entries, and for husky's `_` directory
/// (whose stubs run `../<hook>`) the entries of its parent too.
fn hooks_in(dir: &Path, out: &mut Vec<PathBuf>) {
    // A link there is judged itself (re-pointed); a directory by its entries.
    if dir.is_symlink() {
        out.push(dir.to_path_buf());
    }
    hook_entries(dir, out);
    if dir.file_name() == Some(OsStr::new("_")) {
        if let Some(parent) = dir.parent() {
            hook_entries(parent, out);
        }
    }
}

/// A hooks path as git resolves it: `~/` from home, relative from each
/// work tree it is used in.
fn hooks_path(value: &[u8], reach: &Reach, out: &mut Vec<PathBuf>) {
    let value = match (value.strip_prefix(b"~/"), reach.home) {
        (Some(rest), Some(h)) => h.join(OsStr::from_bytes(rest)).into_os_string().into_vec(),
        _ => value.to_vec(),
    };
    for top in &reach.tops {
        hooks_in(&joined(top, value.clone()), out);
    }
}

/// What a git config file sends git to besides itself: `core.hooksPath`
/// (every hook in it) and the files `include.path`/`includeIf.*.path`
/// name, followed (four deep). Not for a file a sandbox wrote.
fn config_targets(config: &Path, reach: &Reach, depth: u8, out: &mut Vec<PathBuf>) {
    if depth == 0 || reach.judge.sandboxs(config) {
        return;
    }
    let values = config_values(
        config,
        r"^(core\.hookspath|include\.path|includeif\..+\.path)$",
        &[b"hookspath", b"include"],
    );
    for (key, value) in values {
        if key == b"core.hookspath" {
            hooks_path(&value, reach, out);
            continue;
        }
        let value = match (value.strip_prefix(b"~/"), reach.home) {
            (Some(rest), Some(h)) => h.join(OsStr::from_bytes(rest)).into_os_string().into_vec(),
            _ => value,
        };
        // Folded even when absent: `<top>/.git/../team.gitconfig` not made
        // yet could not be set aside once a sandbox made it (red team
        // round 12).
        let target = crate::paths::as_far_as_exists(&joined(
            config.parent().unwrap_or(Path::new("/")),
            value,
        ));
        out.push(target.clone());
        config_targets(&target, reach, depth - 1, out);
    }
}

/// `core.hooksPath` of the user's and the system's git configuration,
/// which every repository inherits (a relative one resolves in each), as
/// git reads them: with their includes, and from the files the user's
/// `GIT_CONFIG_GLOBAL`/`GIT_CONFIG_SYSTEM` name (red team round 22: one
/// set in `~/.gitconfig.local`, which `~/.gitconfig` includes). Asked of
/// git only when one of those files mentions a hooks path or an include.
pub fn global_hooks_paths(home: Option<&Path>) -> Vec<Vec<u8>> {
    if !crate::plan::protected::user_git_config_mentions_targets(home) {
        return vec![];
    }
    let mut out = vec![];
    for scope in ["--system", "--global"] {
        // The user's own environment: HOME, XDG_CONFIG_HOME, GIT_CONFIG_*.
        let listed = std::process::Command::new("git")
            .args([
                "config",
                scope,
                "--includes",
                "--null",
                "--get-all",
                "core.hooksPath",
            ])
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        if let Ok(o) = listed {
            out.extend(
                o.stdout
                    .split(|b| *b == 0)
                    .filter(|v| !v.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
    }
    out
}

/// The work trees of git directory `found`: the parent of a `.git`; the
/// one a linked worktree's `gitdir` file names; for a bare one, itself.
fn work_trees(found: &Path) -> Vec<PathBuf> {
    if found.file_name() == Some(OsStr::new(".git")) {
        return found.parent().map(Path::to_path_buf).into_iter().collect();
    }
    let linked = git_path_file(&found.join("gitdir"), true)
        .map(|raw| joined(found, raw))
        .and_then(|dot_git| dot_git.parent().map(Path::to_path_buf));
    match linked.or_else(|| core_worktree(found)) {
        Some(top) => vec![top],
        None => vec![found.to_path_buf()],
    }
}

/// A git directory's `core.worktree` (a submodule's, under
/// `.git/modules/`), resolved from the git directory as git does.
fn core_worktree(git_dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(git_dir.join("config")).ok()?;
    let mut core = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            core = l
                .trim_start_matches('[')
                .to_ascii_lowercase()
                .starts_with("core");
            continue;
        }
        if !core {
            continue;
        }
        if let Some((k, v)) = l.split_once('=') {
            if k.trim().eq_ignore_ascii_case("worktree") {
                let v = v.trim().trim_matches('"');
                return std::fs::canonicalize(git_dir.join(v)).ok();
            }
        }
    }
    None
}

/// A rebase or cherry-pick in progress: what `--continue` would run. The
/// remaining steps when they run a command (`exec`), and the merge
/// strategy and its options (a strategy naming a path is run as one).
fn sequencer_state(git_dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for todo in ["rebase-merge/git-rebase-todo", "sequencer/todo"] {
        let p = git_dir.join(todo);
        if std::fs::read(&p).is_ok_and(|t| runs_a_command(&t)) {
            out.push(p);
        }
    }
    for state in [
        "rebase-merge/strategy",
        "rebase-merge/strategy_opts",
        "sequencer/opts",
    ] {
        let p = git_dir.join(state);
        if std::fs::symlink_metadata(&p).is_ok() {
            out.push(p);
        }
    }
    out
}

/// Whether a rebase todo list holds a step that runs a command.
fn runs_a_command(todo: &[u8]) -> bool {
    todo.split(|b| *b == b'\n').any(|line| {
        let word = line
            .trim_ascii_start()
            .split(|b| b.is_ascii_whitespace())
            .next()
            .unwrap_or_default();
        word == b"exec" || word == b"x"
    })
}

/// Every item one candidate brings to judge, as absolute paths.
fn items_of(
    found: &Path,
    home: Option<&Path>,
    global_hooks: &[Vec<u8>],
    judge: &Judge,
) -> Vec<PathBuf> {
    items_of_at(found, None, home, global_hooks, judge)
}

/// [`items_of`], with the work tree's top given where it is known better
/// than the git directory says (the directory of a `.git` file).
fn items_of_at(
    found: &Path,
    top: Option<&Path>,
    home: Option<&Path>,
    global_hooks: &[Vec<u8>],
    judge: &Judge,
) -> Vec<PathBuf> {
    let Ok(meta) = std::fs::symlink_metadata(found) else {
        return vec![];
    };
    if !meta.is_dir() {
        // A `.git` file (`gitdir:` pointer) or link: the pointer itself,
        // and the git directory a `gitdir:` file names, whose work tree
        // is where the pointer lies (a submodule's checkout, a
        // `--separate-git-dir` repository: red team round 15, its husky
        // hooks and editor tasks were kept).
        let mut items = vec![found.to_path_buf()];
        if let Some(target) = gitdir_target(found).filter(|t| t.is_dir()) {
            items.extend(items_of_at(
                &target,
                found.parent(),
                home,
                global_hooks,
                judge,
            ));
        }
        return items;
    }
    let common = common_dir(found);
    let mut surface = vec![];
    git_dir_surface(found, 3, &mut surface);
    if let Some(c) = common.as_deref().filter(|c| *c != found) {
        git_dir_surface(c, 0, &mut surface);
    }
    let mut tops = work_trees(found);
    if let Some(t) = top {
        if !tops.iter().any(|x| x == t) {
            tops.push(t.to_path_buf());
        }
    }
    let reach = Reach {
        tops,
        home,
        global_hooks,
        judge,
    };
    let mut items = vec![];
    for value in reach.global_hooks {
        hooks_path(value, &reach, &mut items);
    }
    // What the hook managers installed in this repository read at commit
    // time, and what package managers and agents run from the project, at
    // the top of its work tree (a directory by its entries).
    // Editors' task folders, `.envrc`, husky's and the like too, as at the
    // top of a root (red team round 14: only the first group was judged
    // here, though the documents said all were).
    let tops_names = crate::plan::protected::ROOT_SURFACE
        .iter()
        .filter(|n| !matches!(**n, ".git" | ".airlock"));
    let names: Vec<&&str> = crate::plan::protected::project_surface()
        .chain(tops_names)
        .collect();
    for top in &reach.tops {
        for name in &names {
            let p = top.join(name);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => entries_below(&p, 3, &mut items),
                Ok(_) => items.push(p),
                Err(_) => {}
            }
        }
    }
    for abs in surface {
        let name = abs.file_name().unwrap_or_default().to_os_string();
        if name == "hooks" {
            // Each hook on its own, through a link too (where it leads).
            hook_entries(&abs, &mut items);
        } else if name == "info" {
            if let Ok(rd) = std::fs::read_dir(&abs) {
                items.extend(
                    rd.flatten()
                        .filter(|e| !inert(&name, &e.file_name()))
                        .map(|e| e.path()),
                );
            }
        } else if name == "config" || name == "config.worktree" {
            config_targets(&abs, &reach, 4, &mut items);
        }
        items.push(abs);
    }
    items.extend(sequencer_state(found));
    items.extend(replace_refs(found));
    if let Some(c) = common.as_deref().filter(|c| *c != found) {
        items.extend(replace_refs(c));
    }
    items
}

/// Replace refs: `refs/replace/<commit>` makes git show another commit in
/// a commit's place, so that `git status` and `git diff HEAD` hide what
/// the sandbox changed (red team round 15); and `packed-refs` when it
/// holds one.
fn replace_refs(git_dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    entries_below(&git_dir.join("refs/replace"), 3, &mut out);
    let packed = git_dir.join("packed-refs");
    if std::fs::read(&packed).is_ok_and(|t| memchr::memmem::find(&t, b" refs/replace/").is_some()) {
        out.push(packed);
    }
    out
}

/// Record, in a thread, every nested repository's items as they are now
/// (identity.rs says why this is sound at any moment). `wait` it briefly
/// before the command starts; `stop` it before the post-run check.
///
/// Where the last post-run check of a root found its repositories
/// ([`found_record`]), only those are looked at (no walk, so the command
/// does not wait for one); a repository the user made since is judged by
/// its ctime alone this once. A root never checked before is walked.
pub fn record_before(roots: Vec<PathBuf>) -> Before {
    let before = Before::default();
    let out = before.clone();
    let spawned = std::thread::Builder::new()
        .name("nested-before".into())
        .spawn(move || {
            let windows = Windows::with_current(kernel_now(), "", &roots);
            let judge = Judge {
                windows: &windows,
                before: &Before::default(),
                cleared: std::cell::RefCell::new(Cleared::load()),
                modes_restored: Default::default(),
            };
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let global_hooks = global_hooks_paths(home.as_deref());
            let known = read_found();
            // The repositories the last check found first (their items are
            // what the user is likely to have), then a fresh walk of each
            // root, for those made since (on the host, between runs): only
            // a walk that finished says which git directories were there
            // before the run (`Before::knew_dir`).
            let mut lists: Vec<Vec<PathBuf>> =
                roots.iter().filter_map(|r| known.get(r).cloned()).collect();
            let mut fresh = roots.iter();
            'roots: loop {
                let found = match lists.pop() {
                    Some(list) => list,
                    None => match fresh.next() {
                        Some(root) => {
                            let w = find(root);
                            if !w.complete {
                                before.started_late();
                            }
                            w.found
                        }
                        None => break,
                    },
                };
                for found in found {
                    if before.stopped() {
                        break 'roots;
                    }
                    before.record_dir(found.clone());
                    for abs in items_of(&found, home.as_deref(), &global_hooks, &judge) {
                        let Some(seen) = observe(&abs) else { continue };
                        let users = !windows.covers(&abs, super::identity::ctime_time(seen.ctime))
                            || judge.cleared.borrow().holds(&seen);
                        if users {
                            before.record(abs, seen);
                        }
                    }
                }
            }
            before.finished();
        });
    if let Err(e) = spawned {
        tracing::warn!("recording nested repositories before the run: {e}");
        out.finished();
    }
    out
}

/// Where the repositories each root's last check found are recorded, in
/// airlock's own directory (no `.json`: not a journal).
fn found_record() -> Option<PathBuf> {
    super::journal::path_of("nested-found").map(|p| p.with_extension(""))
}

/// Roots recorded at most, and repositories per root.
const FOUND_ROOTS: usize = 256;
const FOUND_PER_ROOT: usize = 10_000;

fn read_found() -> std::collections::BTreeMap<PathBuf, Vec<PathBuf>> {
    found_record()
        .and_then(|p| crate::paths::read_no_follow(&p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Keep what this check found for the next run's record (identity.rs).
fn save_found(found: &[(PathBuf, Vec<PathBuf>)]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(p) = found_record() else { return };
    let before = read_found();
    let mut all = before.clone();
    for (root, list) in found {
        if list.len() <= FOUND_PER_ROOT {
            all.insert(root.clone(), list.clone());
        } else {
            all.remove(root);
        }
    }
    while all.len() > FOUND_ROOTS {
        let Some(k) = all
            .keys()
            .find(|k| !found.iter().any(|(r, _)| r == *k))
            .cloned()
        else {
            break;
        };
        all.remove(&k);
    }
    // The same as on disk (most runs): not written again (a write and a
    // rename on every run).
    if all == before {
        return;
    }
    let Ok(text) = serde_json::to_vec(&all) else {
        return;
    };
    let tmp = p.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text));
    if written.is_ok() {
        let _ = std::fs::rename(&tmp, &p);
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Whether the protected set already judges `rel` in `root` (by its
/// snapshot): named itself, or below an entry recorded with its contents.
/// The workspace's `.git` is recorded as one node, so what is made inside
/// it (a new `.git/modules/<name>`) is for this check.
fn known_item(known: &[Protected], root: &Path, rel: &Path) -> bool {
    known
        .iter()
        .any(|k| k.root == root && (k.rel == rel || (k.deep && rel.starts_with(&k.rel))))
}

/// The changes in nested repositories: each item a sandbox wrote (its
/// ctime in one of `windows`). Returns them, and the roots whose walk
/// could not finish (the caller fails the run loudly for those).
/// The repositories a change in directory `dir` (under `root`) could have
/// touched: those in it, and each enclosing one whose git directory,
/// work tree or hooks path it lies in.
fn near(
    dir: &Path,
    root: &Path,
    open_up: &dyn Fn(&Path, &nix::sys::stat::FileStat) -> bool,
) -> Walk {
    // `dir` alone: the session's watch names every directory that changed
    // on its own, and every directory below one made or moved in (or says
    // "everything": a whole search), so what lies below an unchanged
    // directory is not looked at again. A `git status` rewrote `.git`'s
    // index, and each check walked the whole git directory.
    let mut walk = walk_below(dir, open_up, false);
    if std::fs::symlink_metadata(dir).is_err() {
        // Gone since: nothing left to judge there.
        walk.complete = true;
    }
    let mut at = Some(dir);
    while let Some(a) = at {
        if a.file_name() == Some(OsStr::new(DOT_GIT)) {
            walk.found.push(a.to_path_buf());
        }
        if std::fs::symlink_metadata(a.join(GIT_DIR_MARK)).is_ok() {
            walk.found.push(a.to_path_buf());
        }
        if std::fs::symlink_metadata(a.join(DOT_GIT)).is_ok() {
            walk.found.push(a.join(DOT_GIT));
        }
        if a == root {
            break;
        }
        at = a.parent();
    }
    walk
}

/// The changes in nested repositories: each item a sandbox wrote (its
/// ctime in one of `windows`). Returns them, and the roots whose walk
/// could not finish (the caller fails the run loudly for those).
/// Searched only where something changed (`only`: the
/// directories a session's watch saw change since its last check; `None`
/// searches every root whole).
pub fn changes_near(
    roots: &[PathBuf],
    judge: &Judge,
    known: &[Protected],
    only: Option<&[PathBuf]>,
) -> (Vec<Change>, Vec<String>, Vec<PathBuf>) {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let global_hooks = global_hooks_paths(home.as_deref());
    let mut out: Vec<Change> = vec![];
    let mut failed = vec![];
    let mut seen: Vec<(PathBuf, Vec<PathBuf>)> = vec![];
    let mut repos = vec![];
    // A directory a sandbox left unreadable to its owner is opened up to
    // be searched (an ordinary user's check cannot list it, yet the
    // user's `cd` below it and git work); one it did not write is not.
    let open_up = |p: &Path, st: &nix::sys::stat::FileStat| judge.windows.covers(p, ctime_of(st));
    for root in roots {
        let mut walk = match only {
            None => find_opening(root, &open_up),
            Some(dirs) => {
                let mut all = Walk {
                    found: vec![],
                    redirects: vec![],
                    dirs: 0,
                    complete: true,
                };
                for d in dirs.iter().filter(|d| d.starts_with(root)) {
                    let w = near(d, root, &open_up);
                    all.found.extend(w.found);
                    all.redirects.extend(w.redirects);
                    all.dirs += w.dirs;
                    all.complete &= w.complete;
                }
                // A repository whose configuration sends git outside its
                // own tree (a hooks path `../githooks`, an include
                // `../../shared/git.inc`): a change there is a change to
                // it, however far from it (red team round 13: a session
                // command planted them, and its own check did not look).
                let mut known_repos = judge.before.known_dirs();
                known_repos.extend(read_found().remove(root).unwrap_or_default());
                known_repos.sort();
                known_repos.dedup();
                for repo in known_repos {
                    if !repo.starts_with(root)
                        || all.found.contains(&repo)
                        || !crate::plan::protected::repo_config_mentions_targets(
                            &repo,
                            home.as_deref(),
                        )
                    {
                        continue;
                    }
                    let items = items_of(&repo, home.as_deref(), &global_hooks, judge);
                    if items
                        .iter()
                        .any(|i| dirs.iter().any(|d| i.starts_with(d) || d.starts_with(i)))
                    {
                        all.found.push(repo);
                    }
                }
                all
            }
        };
        // `.airlock` at the top of a root is protected (the sandbox cannot
        // write it, and one it made is the protected set's to judge): what
        // lies there is airlock's, and its quarantine holds git directories
        // by design. Judged again, each check quarantined the last one's
        // copies, over and over.
        let own = root.join(".airlock");
        walk.found.retain(|f| !f.starts_with(&own));
        walk.found.sort();
        walk.found.dedup();
        walk.redirects.retain(|f| !f.starts_with(&own));
        walk.redirects.sort();
        walk.redirects.dedup();
        // A file that makes a host tool run another program, written by a
        // sandbox anywhere in the root: moved aside (at the top it is the
        // protected set's, judged there).
        for abs in &walk.redirects {
            let Ok(rel) = abs.strip_prefix(root) else {
                continue;
            };
            if known_item(known, root, rel)
                || !judge.sandboxs(abs)
                || out
                    .iter()
                    .any(|c| &c.root == root && c.rel.as_path() == rel)
            {
                continue;
            }
            if std::fs::symlink_metadata(abs).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            out.push(Change {
                root: root.clone(),
                rel: rel.to_path_buf(),
                kind: ChangeKind::Created,
                before: State::Absent,
                git: false,
                hidden: false,
            });
        }
        if walk.complete {
            seen.push((root.clone(), walk.found.clone()));
        }
        tracing::debug!(root = %root.display(), dirs = walk.dirs, repos = walk.found.len(), "nested repositories searched");
        if !walk.complete {
            failed.push(format!(
                "{}: the search for nested repositories could not finish ({} directories); repositories there were not checked",
                root.display(),
                walk.dirs
            ));
        }
        repos.extend(walk.found.iter().cloned());
        for found in walk.found {
            // A git directory that was not there before the run, put in
            // place while a sandbox ran (made, or renamed into place: a
            // rename keeps the ctime of what lies below), is the sandbox's
            // assembly whatever its files' own ctimes say: they may have
            // reached the disk through the user's `git checkout` of a
            // branch the sandbox committed, or an earlier `changes apply`
            // (red team round 2). Only when the record saw everything: a
            // repository it did not reach may be the user's.
            let assembled = !judge.before.knew_dir(&found) && written_in(&found, judge.windows);
            // A `gitdir:` file the sandbox wrote may name a repository of
            // the user's that was there before: that one was not assembled
            // (red team round 16: one pointer made the user's repository
            // "new", its config and hooks set aside).
            let pointed = std::fs::symlink_metadata(&found)
                .is_ok_and(|m| !m.is_dir())
                .then(|| gitdir_target(&found))
                .flatten()
                .filter(|t| judge.before.knew_dir(t));
            for abs in items_of(&found, home.as_deref(), &global_hooks, judge) {
                let assembled = assembled && !pointed.as_ref().is_some_and(|t| abs.starts_with(t));
                // What lies outside every writable root, the sandbox could
                // not write.
                let Some(item_root) = crate::plan::protected::root_of(&abs, roots) else {
                    continue;
                };
                let Ok(rel) = abs.strip_prefix(item_root) else {
                    continue;
                };
                if rel.as_os_str().is_empty()
                    || known_item(known, item_root, rel)
                    || out
                        .iter()
                        .any(|c| &c.root == item_root && c.rel.as_path() == rel)
                    || !(judge.sandboxs(&abs)
                        || assembled && judge.uncleared(&abs)
                        || judge.moved_in(&abs, &found))
                {
                    continue;
                }
                // A directory (hooks, info, a hooks path) changes when an
                // entry is added: its entries are judged one by one instead.
                if abs.is_dir() && !abs.is_symlink() {
                    continue;
                }
                // The user's own configuration, recorded before the run in
                // a repository that was there: put back as it was (the
                // sandbox's is kept in the quarantine), rather than a plain
                // copy without the user's credential helper and signing
                // keys, said to be "a new repository" (red team round 13).
                let known = judge.before.knew_dir(&found)
                    || pointed.as_ref().is_some_and(|t| abs.starts_with(t));
                let recorded = (!assembled && known)
                    .then(|| judge.before.get(&abs))
                    .flatten()
                    .and_then(|b| b.content.clone().map(|c| (b, c)));
                let (kind, before) = match recorded {
                    Some((b, content)) => (
                        ChangeKind::Modified,
                        State::File {
                            id: crate::integrity::snapshot::Id::recorded(b.dev, b.ino, b.ctime),
                            mode: b.perm,
                            content: Some(content),
                        },
                    ),
                    // Nothing was recorded before: treat it as new, so a
                    // configuration is sanitised rather than trusted.
                    None => (ChangeKind::Created, State::Absent),
                };
                out.push(Change {
                    root: item_root.clone(),
                    rel: rel.to_path_buf(),
                    kind,
                    before,
                    git: true,
                    hidden: false,
                });
            }
        }
    }
    save_found(&seen);
    (out, failed, repos)
}

/// The paths a repository's index marks `skip-worktree` or
/// `assume-unchanged`, when a sandbox wrote the index: git then shows no
/// change to them in `git status` or `git diff`, which hides what the
/// sandbox changed there (red team round 16). The marks are judged, not
/// removed: a sparse checkout sets them too. At most 20 named.
pub fn hidden_by_index(git_dir: &Path, windows: &Windows) -> Vec<String> {
    let index = git_dir.join("index");
    if !written_in(&index, windows) {
        return vec![];
    }
    let Ok(bytes) = std::fs::read(&index) else {
        return vec![];
    };
    index_hidden(&bytes)
}

/// [`hidden_by_index`]'s reading of an index file (versions 2 to 4).
pub fn index_hidden(b: &[u8]) -> Vec<String> {
    let be32 =
        |i: usize| -> Option<u32> { Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?)) };
    let be16 =
        |i: usize| -> Option<u16> { Some(u16::from_be_bytes(b.get(i..i + 2)?.try_into().ok()?)) };
    if b.get(0..4) != Some(b"DIRC") {
        return vec![];
    }
    let (Some(version), Some(count)) = (be32(4), be32(8)) else {
        return vec![];
    };
    let mut out = vec![];
    let mut at = 12usize;
    let mut last: Vec<u8> = vec![];
    for _ in 0..count {
        let Some(flags) = be16(at + 60) else { break };
        let extended = version >= 3 && flags & 0x4000 != 0;
        let mut p = at + 62;
        let mut skip = false;
        if extended {
            let Some(x) = be16(p) else { break };
            skip = x & 0x4000 != 0;
            p += 2;
        }
        let assume = flags & 0x8000 != 0;
        let name: Vec<u8>;
        if version == 4 {
            // A varint of bytes to drop from the last name, then the rest.
            let mut strip: usize = 0;
            loop {
                let Some(&c) = b.get(p) else { return out };
                p += 1;
                strip = (strip << 7) | usize::from(c & 0x7f);
                if c & 0x80 == 0 {
                    break;
                }
                strip += 1;
            }
            let Some(end) = b.get(p..).and_then(|r| r.iter().position(|&c| c == 0)) else {
                return out;
            };
            let keep = last.len().saturating_sub(strip);
            name = [&last[..keep], &b[p..p + end]].concat();
            p += end + 1;
            at = p;
        } else {
            let Some(end) = b.get(p..).and_then(|r| r.iter().position(|&c| c == 0)) else {
                return out;
            };
            name = b[p..p + end].to_vec();
            // NUL-padded to a multiple of 8 from the entry's start.
            let len = p + end - at;
            at += (len + 8) & !7;
        }
        if (skip || assume) && out.len() < 20 {
            out.push(String::from_utf8_lossy(&name).into_owned());
        }
        last = name;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_marks_that_hide_changes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(dir.path())
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !git(&["init", "-q", "."]) {
            return;
        }
        for n in ["a.txt", "b/c.txt", "d.txt"] {
            let p = dir.path().join(n);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, n).unwrap();
        }
        assert!(git(&["add", "."]));
        let index = || std::fs::read(dir.path().join(".git/index")).unwrap();
        assert!(index_hidden(&index()).is_empty());
        assert!(git(&["update-index", "--skip-worktree", "b/c.txt"]));
        assert!(git(&["update-index", "--assume-unchanged", "d.txt"]));
        assert_eq!(index_hidden(&index()), ["b/c.txt", "d.txt"]);
        assert!(git(&["update-index", "--index-version", "4"]));
        assert_eq!(index_hidden(&index()), ["b/c.txt", "d.txt"]);
    }

    #[test]
    fn todo_lists_that_run_a_command() {
        assert!(runs_a_command(b"pick 1234 one\nexec make test\n"));
        assert!(runs_a_command(b"break\n  x ./lint.sh\n"));
        assert!(runs_a_command(b"x\tsh -c true"));
        assert!(!runs_a_command(
            b"pick 1234 exec is a word here\n# exec in a comment\n"
        ));
        assert!(!runs_a_command(b"pick 1 a\nreword 2 b\nbreak\n"));
    }

    #[test]
    fn paths_in_git_files_are_read_as_git_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("commondir");
        std::fs::write(&f, b"../data/y \r\n\n").unwrap();
        assert_eq!(git_path_file(&f, true).unwrap(), b"../data/y ".to_vec());
        std::fs::write(&f, b"../x\xff\n").unwrap();
        assert_eq!(git_path_file(&f, true).unwrap(), b"../x\xff".to_vec());
        // In an upper layer a link is not followed.
        let l = dir.path().join("linked");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        assert_eq!(git_path_file(&l, false), None);
        assert!(git_path_file(&l, true).is_some());
        assert_eq!(
            joined(Path::new("/a/b"), b"../c".to_vec()),
            PathBuf::from("/a/b/../c")
        );
        assert_eq!(
            joined(Path::new("/a"), b"/abs".to_vec()),
            PathBuf::from("/abs")
        );
    }
}
