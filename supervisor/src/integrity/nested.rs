//! Repositories below a writable root that the protected set does not name
//! in advance (a `git init` in a subdirectory, a vendored clone, a directory
//! shaped like a bare repository, a submodule's or worktree's git directory
//! made during the run). Finding them needs a walk, but only of directory
//! entries (`getdents`, no `stat` per file), and only after the run. Then:
//! - every surface item (configuration, hooks) changed during the run is
//!   judged like the protected set;
//! - a repository that *became* one during the run (its `HEAD`, its git
//!   directory, its `commondir` or the common directory's `objects`/`refs`
//!   changed) has its whole surface judged by content, however old each
//!   file is: a previous run can have written the hooks and configuration
//!   into a directory that was no repository then (SPEC §3.5), for this
//!   run only to give it a `HEAD` or to rename it into place.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::dir::{Dir, Type};
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use super::set::{git_dir_surface, Protected};
use super::snapshot::{open_dir, Change, ChangeKind, State};

/// Directories visited at most. Past it the check fails loudly: a tree the
/// sandbox made huge must not hide a repository.
const MAX_DIRS: usize = 20_000_000;

pub struct Walk {
    /// `.git` entries (directories, `gitdir:` files, links) and every
    /// directory holding an entry named `HEAD`: git takes a directory as
    /// a git directory by its `HEAD`, with `objects/` and `refs/` in it or
    /// in the directory its `commondir` file names, so no other shape is
    /// required of a candidate.
    pub found: Vec<PathBuf>,
    pub dirs: usize,
    pub complete: bool,
}

/// Every candidate git directory below `root`, `root` itself included,
/// and inside every `.git` directory (the workspace's own too: a
/// submodule's or worktree's git directory made in `.git/modules` or
/// `.git/worktrees` is the user's next `git submodule update`).
pub fn find(root: &Path) -> Walk {
    let mut walk = Walk {
        found: vec![],
        dirs: 0,
        complete: true,
    };
    let Ok(fd) = super::snapshot::open_root(root) else {
        walk.complete = false;
        return walk;
    };
    // One filesystem: a mount below the root (a cache, /proc when the root
    // is `/`) is not walked.
    let Ok(dev) = nix::sys::stat::fstat(&fd).map(|st| st.st_dev) else {
        walk.complete = false;
        return walk;
    };
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(fd, root.to_path_buf())];
    while let Some((fd, path)) = stack.pop() {
        walk.dirs += 1;
        if walk.dirs > MAX_DIRS {
            walk.complete = false;
            break;
        }
        let Ok(mut dir) = Dir::from_fd(fd) else {
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
            head |= raw == b"HEAD";
            if raw == b".git" && path != root {
                walk.found.push(path.join(&name));
            }
            if matches!(entry.file_type(), Some(Type::Directory) | None) {
                subdirs.push(name);
            }
        }
        if head {
            // A candidate git directory (bare, a `.git`, a submodule's, a
            // worktree's, or one whose `commondir` points elsewhere): judge
            // it, and still walk below it, since `touch HEAD` costs the
            // sandbox nothing and must not hide what lies underneath.
            walk.found.push(path.clone());
        }
        for name in subdirs {
            // Not following links: a link to elsewhere is not walked.
            match open_dir(std::os::fd::AsFd::as_fd(&dir), Path::new(&name)) {
                Ok(sub) => {
                    if nix::sys::stat::fstat(&sub).is_ok_and(|st| st.st_dev == dev) {
                        stack.push((sub, path.join(&name)));
                    }
                }
                Err(
                    nix::errno::Errno::ENOTDIR
                    | nix::errno::Errno::ELOOP
                    | nix::errno::Errno::ENOENT,
                ) => {}
                Err(_) => walk.complete = false,
            }
        }
    }
    walk
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
            .map(|st| {
                SystemTime::UNIX_EPOCH
                    + Duration::new(
                        st.st_ctime.max(0) as u64,
                        st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
                    )
            });
    stamped.unwrap_or_else(|_| SystemTime::now() - Duration::from_millis(20))
}

/// Elsewhere: now, less a margin for a coarse filesystem clock.
#[cfg(not(target_os = "linux"))]
pub fn kernel_now() -> SystemTime {
    SystemTime::now() - Duration::from_millis(20)
}

fn ctime_since(st: &nix::sys::stat::FileStat, since: SystemTime) -> bool {
    let ctime = SystemTime::UNIX_EPOCH
        + Duration::new(
            st.st_ctime.max(0) as u64,
            st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
        );
    ctime >= since
}

/// Whether the inode at `path` (the link itself, not followed) changed
/// since `since`: written, created, renamed, linked or its mode changed.
fn changed_since(path: &Path, since: SystemTime) -> bool {
    fstatat(nix::fcntl::AT_FDCWD, path, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| ctime_since(&st, since))
}

/// Like `changed_since`, for what a path leads to (links followed).
fn target_changed_since(path: &Path, since: SystemTime) -> bool {
    nix::sys::stat::stat(path).is_ok_and(|st| ctime_since(&st, since))
}

/// The common directory of git directory `git_dir`, as git finds it: the
/// one its `commondir` file names (relative to `git_dir`), else itself.
/// Read after the run, when nothing of the sandbox is left to move it.
fn common_dir(git_dir: &Path) -> Option<PathBuf> {
    let file = git_dir.join("commondir");
    let Ok(meta) = std::fs::metadata(&file) else {
        return Some(git_dir.to_path_buf());
    };
    if !meta.is_file() || meta.len() > 4096 {
        return None;
    }
    let text = std::fs::read_to_string(&file).ok()?;
    let line = text.lines().next()?.trim_end();
    std::fs::canonicalize(git_dir.join(line)).ok()
}

/// Whether git takes `git_dir` as a repository now: a `HEAD`, and `objects`
/// and `refs` directories in its common directory. A directory that is
/// not one runs nothing; one a later run completes has become one then.
fn is_repository(git_dir: &Path, common: Option<&Path>) -> bool {
    let dir = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_dir());
    std::fs::symlink_metadata(git_dir.join("HEAD")).is_ok()
        && common.is_some_and(|c| dir(&c.join("objects")) && dir(&c.join("refs")))
}

/// Whether `git_dir` became a repository during the run: what git looks
/// at to take it as one (its `HEAD`, the directory itself, `commondir`,
/// and the common directory with its `objects` and `refs`) changed. Git's
/// own work inside (a commit, a fetch) changes some of these too; that
/// only has the surface judged by content, which a clean one passes.
fn became_repository(git_dir: &Path, common: Option<&Path>, since: SystemTime) -> bool {
    [git_dir, &git_dir.join("HEAD"), &git_dir.join("commondir")]
        .iter()
        .any(|p| changed_since(p, since))
        || common.is_some_and(|c| {
            [c, &c.join("objects"), &c.join("refs")]
                .iter()
                .any(|p| target_changed_since(p, since))
        })
}

/// Whether a surface item of a repository that became one during the run
/// is something git would run or obey as code: a hook (or a hooks
/// directory that is a link), or a configuration holding any key that
/// names a program or another file.
fn runs_something(abs: &Path) -> bool {
    let name = abs.file_name().unwrap_or_default();
    let parent = abs.parent().and_then(Path::file_name).unwrap_or_default();
    let Ok(meta) = std::fs::symlink_metadata(abs) else {
        return false;
    };
    if parent == "hooks" {
        return !inert(parent, name);
    }
    if name == "hooks" {
        return meta.file_type().is_symlink();
    }
    if name == "config" || name == "config.worktree" {
        return !super::quarantine::git_config_is_safe(abs);
    }
    false
}

/// A rebase or sequencer in progress whose remaining steps run a command
/// (`exec`/`x`): the user's `git rebase --continue` would run it. Judged
/// when the list or its directory changed during the run (one written
/// elsewhere and moved in changes its directory), or the repository
/// became one then.
fn pending_exec(git_dir: &Path, since: SystemTime, fresh: bool) -> Vec<PathBuf> {
    ["rebase-merge/git-rebase-todo", "sequencer/todo"]
        .iter()
        .map(|rel| git_dir.join(rel))
        .filter(|todo| {
            let dir = todo.parent().unwrap_or(git_dir);
            (fresh || changed_since(todo, since) || changed_since(dir, since))
                && std::fs::read(todo).is_ok_and(|text| runs_a_command(&text))
        })
        .collect()
}

/// Whether a rebase todo list holds a step that runs a command.
fn runs_a_command(todo: &[u8]) -> bool {
    todo.split(|b| *b == b'\n').any(|line| {
        let line = line.trim_ascii_start();
        let word = line
            .split(|b| b.is_ascii_whitespace())
            .next()
            .unwrap_or_default();
        word == b"exec" || word == b"x"
    })
}

/// The surface items (absolute paths) of one found candidate: a `.git`
/// file or link is its own item; a git directory has its surface, and
/// that of its common directory, which holds the configuration and hooks
/// git uses for it.
fn items_of(found: &Path, common: Option<&Path>) -> Vec<PathBuf> {
    let meta = std::fs::symlink_metadata(found);
    if meta.as_ref().is_ok_and(|m| !m.is_dir()) {
        // A `.git` file (`gitdir:` pointer) or link: the pointer itself.
        return vec![found.to_path_buf()];
    }
    let mut surface = vec![];
    git_dir_surface(found, 3, &mut surface);
    if let Some(c) = common.filter(|c| *c != found) {
        git_dir_surface(c, 0, &mut surface);
    }
    let mut items = vec![];
    for abs in surface {
        let name = abs.file_name().unwrap_or_default().to_os_string();
        if (name == "hooks" || name == "info") && abs.is_dir() && !abs.is_symlink() {
            // Each entry on its own: a hook added, or replaced.
            if let Ok(rd) = std::fs::read_dir(&abs) {
                items.extend(
                    rd.flatten()
                        .map(|e| e.file_name())
                        .filter(|n| !inert(&name, n))
                        .map(|n| abs.join(n)),
                );
            }
        }
        items.push(abs);
    }
    items
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

/// The changes in nested repositories: each surface item whose inode
/// changed since `since`, and in a repository that became one since then
/// every item that runs something. Returns them, and the roots whose walk
/// could not finish (the caller fails the run loudly for those).
pub fn changes(
    roots: &[PathBuf],
    since: SystemTime,
    known: &[Protected],
) -> (Vec<Change>, Vec<String>) {
    let mut out: Vec<Change> = vec![];
    let mut failed = vec![];
    for root in roots {
        let mut walk = find(root);
        walk.found.sort();
        walk.found.dedup();
        tracing::debug!(root = %root.display(), dirs = walk.dirs, repos = walk.found.len(), "nested repositories searched");
        if !walk.complete {
            failed.push(format!(
                "{}: the search for nested repositories could not finish ({} directories); repositories there were not checked",
                root.display(),
                walk.dirs
            ));
        }
        for found in walk.found {
            let is_dir = std::fs::symlink_metadata(&found).is_ok_and(|m| m.is_dir());
            let common = if is_dir { common_dir(&found) } else { None };
            let repository = is_dir && is_repository(&found, common.as_deref());
            // A directory that merely holds a `HEAD` is a project's own
            // business until git would take it as a repository; a `.git`
            // entry is judged whatever it holds.
            if !repository && found.file_name() != Some(OsStr::new(".git")) {
                continue;
            }
            let fresh = repository && became_repository(&found, common.as_deref(), since);
            let mut items = items_of(&found, common.as_deref());
            if repository {
                items.extend(pending_exec(&found, since, fresh));
            }
            for abs in items {
                // The common directory can lie in another writable root;
                // outside every one, the sandbox could not write it.
                let Some(item_root) = super::set::root_of(&abs, roots) else {
                    continue;
                };
                let Ok(rel) = abs.strip_prefix(item_root) else {
                    continue;
                };
                if rel.as_os_str().is_empty() || known_item(known, item_root, rel) {
                    continue;
                }
                // A hooks or info directory itself changes when an entry is
                // added: its entries are judged one by one instead.
                let name = rel.file_name().unwrap_or_default();
                if (name == "hooks" || name == "info") && abs.is_dir() && !abs.is_symlink() {
                    continue;
                }
                let judged = changed_since(&abs, since)
                    || (fresh && runs_something(&abs))
                    || abs.ends_with("rebase-merge/git-rebase-todo")
                    || abs.ends_with("sequencer/todo");
                if !judged
                    || out
                        .iter()
                        .any(|c| &c.root == item_root && c.rel.as_path() == rel)
                {
                    continue;
                }
                out.push(Change {
                    root: item_root.clone(),
                    rel: rel.to_path_buf(),
                    // Nothing was recorded before: treat it as new, so a
                    // configuration is sanitised rather than trusted.
                    kind: ChangeKind::Created,
                    before: State::Absent,
                    git: true,
                    hidden: false,
                });
            }
        }
    }
    (out, failed)
}

#[cfg(test)]
mod tests {
    use super::runs_a_command;

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
}
