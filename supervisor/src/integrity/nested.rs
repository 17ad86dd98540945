//! Repositories below a writable root that the protected set does not name
//! in advance (a `git init` in a subdirectory, a vendored clone). Finding
//! them needs a walk, but only of directory entries (`getdents`, no `stat`
//! per file), and only after the run: then every `.git` whose configuration
//! or hooks changed during the run is judged like the protected set.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::dir::{Dir, Type};
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use super::set::{Protected, GIT_DIR_SURFACE};
use super::snapshot::{open_dir, Change, ChangeKind, State};

/// Directories visited at most, and for at most this long: a tree larger
/// than this is reported as not fully checked.
const MAX_DIRS: usize = 1_000_000;

pub struct Walk {
    pub found: Vec<PathBuf>,
    pub dirs: usize,
    pub complete: bool,
}

/// Every `.git` entry below `root` except `root/.git` (which is the
/// protected set's), not descending into git directories themselves.
pub fn find(root: &Path, limit: Duration) -> Walk {
    let deadline = Instant::now() + limit;
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
        if walk.dirs > MAX_DIRS || Instant::now() > deadline {
            walk.complete = false;
            break;
        }
        let Ok(mut dir) = Dir::from_fd(fd) else {
            continue;
        };
        let mut subdirs = vec![];
        for entry in dir.iter().flatten() {
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name =
                std::ffi::OsStr::new(std::str::from_utf8(name).unwrap_or_default()).to_os_string();
            if name.is_empty() {
                continue;
            }
            if name == ".git" {
                if path != root {
                    walk.found.push(path.join(&name));
                }
                continue;
            }
            if matches!(entry.file_type(), Some(Type::Directory) | None) {
                subdirs.push(name);
            }
        }
        for name in subdirs {
            // Not following links: a link to elsewhere is not walked.
            if let Ok(sub) = open_dir(std::os::fd::AsFd::as_fd(&dir), Path::new(&name)) {
                if nix::sys::stat::fstat(&sub).is_ok_and(|st| st.st_dev == dev) {
                    stack.push((sub, path.join(&name)));
                }
            }
        }
    }
    walk
}

/// Entries git never runs or obeys as code: sample hooks and the exclude list.
fn inert(dir: &str, name: &std::ffi::OsStr) -> bool {
    let n = name.to_string_lossy();
    (dir == "hooks" && n.ends_with(".sample")) || (dir == "info" && n == "exclude")
}

fn changed_since(path: &Path, since: SystemTime) -> bool {
    let Ok(st) = fstatat(nix::fcntl::AT_FDCWD, path, AtFlags::AT_SYMLINK_NOFOLLOW) else {
        return false;
    };
    let ctime = SystemTime::UNIX_EPOCH
        + Duration::new(
            st.st_ctime.max(0) as u64,
            st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
        );
    ctime >= since
}

/// The changes in nested repositories: each surface item (or, for a `.git`
/// file, the pointer itself) whose inode changed since `since`, and each
/// entry of a hooks or info directory that did.
pub fn changes(
    roots: &[PathBuf],
    since: SystemTime,
    known: &[Protected],
    limit: Duration,
) -> (Vec<Change>, Vec<String>) {
    let mut out = vec![];
    let mut notes = vec![];
    for root in roots {
        let walk = find(root, limit);
        if !walk.complete {
            notes.push(format!(
                "{}: the search for nested repositories stopped after {} directories; repositories beyond were not checked",
                root.display(),
                walk.dirs
            ));
        }
        for dot_git in walk.found {
            let Ok(rel_git) = dot_git.strip_prefix(root) else {
                continue;
            };
            let mut items: Vec<PathBuf> = vec![];
            if dot_git.is_symlink() || dot_git.is_file() {
                items.push(rel_git.to_path_buf());
            } else {
                for name in GIT_DIR_SURFACE {
                    let rel = rel_git.join(name);
                    let abs = root.join(&rel);
                    if matches!(*name, "hooks" | "info") && abs.is_dir() && !abs.is_symlink() {
                        // Each entry on its own: a hook added, or replaced.
                        items.extend(
                            std::fs::read_dir(&abs)
                                .map(|rd| {
                                    rd.flatten()
                                        .map(|e| e.file_name())
                                        .filter(|n| !inert(name, n))
                                        .map(|n| rel.join(n))
                                        .collect::<Vec<_>>()
                                })
                                .unwrap_or_default(),
                        );
                    } else {
                        items.push(rel);
                    }
                }
            }
            for rel in items {
                if known
                    .iter()
                    .any(|k| &k.root == root && rel.starts_with(&k.rel))
                {
                    continue;
                }
                if changed_since(&root.join(&rel), since) {
                    out.push(Change {
                        root: root.clone(),
                        rel,
                        // Nothing was recorded before: treat it as new, so a
                        // configuration is sanitised rather than trusted.
                        kind: ChangeKind::Created,
                        before: State::Absent,
                        git: true,
                    });
                }
            }
        }
    }
    (out, notes)
}
