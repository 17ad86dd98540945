//! Directory entries through handles: what the watch looks at, without
//! following a link at the name.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;

pub(super) fn identity(st: &libc::statx) -> (u64, u64) {
    (
        libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
    )
}

pub(super) fn open_dir(at: Option<BorrowedFd>, p: &Path) -> nix::Result<OwnedFd> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let dirfd = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    // A directory made during the run is not followed if it is a link.
    let nofollow = if at.is_some() { libc::O_NOFOLLOW } else { 0 };
    // SAFETY: openat on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow,
        )
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names in the directory open as `dir`.
pub(super) fn list(dir: BorrowedFd) -> nix::Result<Vec<OsString>> {
    use nix::fcntl::OFlag;
    let mut d = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(d.iter()
        .flatten()
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect())
}

pub(super) fn statx(dir: BorrowedFd, name: &OsStr) -> nix::Result<libc::statx> {
    let c = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: zeroed statx is a valid out-buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx with a valid directory fd, name and buffer.
    let r = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_BTIME,
            &mut st,
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(st)
}

/// The symlinks met while resolving `p`, and the directories entered and
/// left again by `..`, each as its own path (its parent resolved), at any
/// depth: `~/.aws ->
/// .profiles/current/aws` with `~/.profiles/current -> work` gives both.
/// Re-pointing any of them changes what the denied name leads to, so each
/// is watched like a denied name (a link appearing there stops the run).
/// At most 40 links, as the kernel follows.
pub(super) fn links_on_the_way(p: &Path) -> Vec<std::path::PathBuf> {
    use std::collections::VecDeque;
    use std::path::{Component, PathBuf};
    fn parts(p: &Path) -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    }
    let mut out = vec![];
    let mut todo: VecDeque<OsString> = parts(p).into();
    let mut cur = PathBuf::from("/");
    let mut budget = 40;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            // A directory entered and left again by `..` decides where
            // `..` leads: replaced by a link, it moves the denied name
            // elsewhere (red team 17). Watched like a link.
            if cur.parent().is_some() {
                out.push(cur.clone());
            }
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        match std::fs::read_link(&next) {
            Ok(target) if budget > 0 => {
                budget -= 1;
                out.push(next);
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for t in parts(&target).into_iter().rev() {
                    todo.push_front(t);
                }
            }
            _ => cur = next,
        }
    }
    out
}
