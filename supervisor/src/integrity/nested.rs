//! Repositories below a writable root that the protected set does not name
//! in advance (a `git init` in a subdirectory, a vendored clone, a directory
//! shaped like a bare repository). Finding them needs a walk, but only of
//! directory entries (`getdents`, no `stat` per file), and only after the
//! run: then every git directory whose configuration or hooks changed
//! during the run is judged like the protected set.

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
    /// `.git` entries (directories or `gitdir:` files) and directories git
    /// would take as a repository (`HEAD`, `objects/`, `refs/`).
    pub found: Vec<PathBuf>,
    pub dirs: usize,
    pub complete: bool,
}

/// Every repository below `root` (and `root` itself when it is shaped like
/// a bare one), except `root/.git`, which is the protected set's.
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
        let mut shape = 0u8;
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
            match raw {
                b"HEAD" => shape |= 1,
                b"objects" => shape |= 2,
                b"refs" => shape |= 4,
                _ => {}
            }
            if raw == b".git" {
                if path != root {
                    walk.found.push(path.join(&name));
                }
                continue;
            }
            if matches!(entry.file_type(), Some(Type::Directory) | None) {
                subdirs.push(name);
            }
        }
        if shape == 7 {
            // git accepts this directory as a repository (bare, or with
            // `core.worktree`): judge it, and still walk below it, since
            // `touch HEAD; mkdir objects refs` costs the sandbox nothing
            // and must not hide the repositories underneath.
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

/// The surface items of one found repository, below `root`.
fn items_of(root: &Path, found: &Path) -> Vec<PathBuf> {
    let Ok(rel) = found.strip_prefix(root) else {
        return vec![];
    };
    let meta = std::fs::symlink_metadata(found);
    if meta.as_ref().is_ok_and(|m| !m.is_dir()) {
        // A `.git` file (`gitdir:` pointer) or link: the pointer itself.
        return vec![rel.to_path_buf()];
    }
    let mut surface = vec![];
    git_dir_surface(found, 3, &mut surface);
    let mut items = vec![];
    for abs in surface {
        let Ok(r) = abs.strip_prefix(root) else {
            continue;
        };
        let name = r.file_name().unwrap_or_default().to_os_string();
        if (name == "hooks" || name == "info") && abs.is_dir() && !abs.is_symlink() {
            // Each entry on its own: a hook added, or replaced.
            if let Ok(rd) = std::fs::read_dir(&abs) {
                items.extend(
                    rd.flatten()
                        .map(|e| e.file_name())
                        .filter(|n| !inert(&name, n))
                        .map(|n| r.join(n)),
                );
            }
        }
        items.push(r.to_path_buf());
    }
    items
}

/// The changes in nested repositories: each surface item whose inode
/// changed since `since`. Returns them, and the roots whose walk could
/// not finish (the caller fails the run loudly for those).
pub fn changes(
    roots: &[PathBuf],
    since: SystemTime,
    known: &[Protected],
) -> (Vec<Change>, Vec<String>) {
    let mut out = vec![];
    let mut failed = vec![];
    for root in roots {
        let walk = find(root);
        tracing::debug!(root = %root.display(), dirs = walk.dirs, repos = walk.found.len(), "nested repositories searched");
        if !walk.complete {
            failed.push(format!(
                "{}: the search for nested repositories could not finish ({} directories); repositories there were not checked",
                root.display(),
                walk.dirs
            ));
        }
        for found in walk.found {
            for rel in items_of(root, &found) {
                if known
                    .iter()
                    .any(|k| &k.root == root && rel.starts_with(&k.rel))
                {
                    continue;
                }
                let abs = root.join(&rel);
                // A hooks or info directory itself changes when an entry is
                // added: its entries are judged one by one instead.
                let name = rel.file_name().unwrap_or_default();
                if (name == "hooks" || name == "info") && abs.is_dir() && !abs.is_symlink() {
                    continue;
                }
                if changed_since(&abs, since) {
                    out.push(Change {
                        root: root.clone(),
                        rel,
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
    }
    (out, failed)
}
