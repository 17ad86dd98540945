//! Host pathname unix sockets (SPEC §4.6): none is connectable from inside
//! unless `[filesystem] unix_sockets` lists it.
//!
//! Mechanism: before the network namespace exists, the helper reads the
//! host's `/proc/net/unix` (it lists only the reader's namespace), which
//! names every bound pathname socket. Inside the mount namespace, every one
//! still visible (the tmpfs over /tmp, /run and /dev/shm already hides
//! those) gets `/dev/null` bind-mounted over it: `connect()` resolves the
//! path to a character device and fails with ECONNREFUSED. A mount point
//! cannot be unlinked or renamed over (EBUSY), renaming its parent carries
//! the mount along, and `link()` through it crosses a mount (EXDEV).
//!
//! Cost: one read of `/proc/net/unix` plus one `lstat` per named socket and
//! one bind mount per visible one (tens of microseconds each; logged at -vv).
//!
//! Why not something else: Landlock has no right for pathname `connect()`
//! on the kernels airlock supports, and seccomp cannot read the path. Walking
//! the filesystem for socket inodes would cost seconds.
//!
//! This list cannot name a socket bound in another network namespace (a
//! container's), one bound after the sandbox starts, one bound by a
//! relative path (listed as given), one whose directory was renamed, or a
//! second hard link: `unixconnect.rs` refuses a connect() to any of those
//! (it lets through only sockets the sandbox bound and granted ones). The
//! degraded tier (no mounts) refuses `socket(AF_UNIX)` and every socketpair
//! but unix stream and seqpacket ones instead.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{Context, Result};
use nix::fcntl::{open, OFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::stat::Mode;

use crate::plan::Plan;

static HOST: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// The absolute socket paths in a `/proc/net/unix` listing.
fn parse(text: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            // "Num RefCount Protocol Flags Type St Inode Path": the path is
            // whatever follows the seventh field (and may hold spaces).
            let mut rest = line;
            for _ in 0..7 {
                rest = rest.trim_start().split_once(' ')?.1;
            }
            rest.starts_with('/').then(|| PathBuf::from(rest))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Remember the host's bound pathname sockets. Call in the helper before
/// it creates the network namespace.
pub fn snapshot() -> Result<()> {
    let started = Instant::now();
    let text = fs::read_to_string("/proc/net/unix").context("reading /proc/net/unix")?;
    let list = parse(&text);
    tracing::debug!(sockets = list.len(), elapsed = ?started.elapsed(), "host unix sockets listed");
    let _ = HOST.set(list);
    Ok(())
}

/// A listed socket, held open so it can be bound back after the tmpfs
/// mounts hide its directory.
pub struct Kept {
    path: PathBuf,
    fd: OwnedFd,
    id: (u64, u64),
}

fn socket_id(p: &Path) -> Option<(u64, u64)> {
    let m = fs::symlink_metadata(p).ok()?;
    m.file_type().is_socket().then(|| (m.dev(), m.ino()))
}

/// Handles to the `unix_sockets` the policy grants. Call before the
/// tmpfs mounts of `mounts::setup`.
pub fn keep(plan: &Plan) -> Vec<Kept> {
    plan.unix_sockets
        .iter()
        .filter_map(|p| {
            let path = fs::canonicalize(p).ok()?;
            let id = socket_id(&path)?;
            let fd = open(&path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
            Some(Kept { path, fd, id })
        })
        .collect()
}

fn bind(src: &Path, target: &Path) -> Result<()> {
    mount(
        Some(src),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("covering the host socket {}", target.display()))
}

/// Cover every host socket still visible, then bind the granted ones back.
/// Call at the end of `mounts::setup`, once /dev/null is the sandbox's own.
pub fn mask(kept: Vec<Kept>) -> Result<()> {
    let started = Instant::now();
    let host = HOST
        .get()
        .context("the host's unix sockets were not listed")?;
    let mut covered = 0;
    for p in host {
        let Some(id) = socket_id(p) else { continue };
        if kept.iter().any(|k| k.id == id) {
            continue;
        }
        bind(Path::new("/dev/null"), p)?;
        covered += 1;
    }
    for k in &kept {
        if socket_id(&k.path) == Some(k.id) {
            continue;
        }
        // Hidden by the tmpfs over /tmp, /run or /dev/shm: bind it back.
        if let Some(parent) = k.path.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        if fs::symlink_metadata(&k.path).is_err() {
            fs::write(&k.path, b"").with_context(|| format!("creating {}", k.path.display()))?;
        }
        let src = PathBuf::from(format!("/proc/self/fd/{}", k.fd.as_raw_fd()));
        mount(
            Some(&src),
            &k.path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| format!("binding the granted socket {}", k.path.display()))?;
    }
    tracing::debug!(covered, granted = kept.len(), elapsed = ?started.elapsed(), "host unix sockets masked");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_unix_paths() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12345 /run/a.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12346 @abstract\n\
            0000000000000000: 00000003 00000000 00000000 0001 03    77\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12347 /home/u/my dir/s\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 12348 /run/a.sock\n";
        assert_eq!(
            parse(text),
            vec![
                PathBuf::from("/home/u/my dir/s"),
                PathBuf::from("/run/a.sock")
            ]
        );
    }
}
