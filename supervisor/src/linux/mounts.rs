//! The sandbox's view of the filesystem (SPEC §4.1 step 3): the host's
//! tree, with a fresh /proc, a private /tmp (writable roots under it bound
//! back), tmpfs over /run, /var/run and /dev/shm, a minimal /dev, secrets
//! hidden and protected paths read-only.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::fcntl::{open, OFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::stat::Mode;
use nix::sys::statvfs::{statvfs, FsFlags};

use crate::plan::Plan;

/// Where PID 1 mounts a file system of its own (tmpfs, proc, devpts): a
/// path at or under one names a different inode in the sandbox than in
/// the host, so its Landlock rule is made after the mounts (landlock.rs).
pub const FRESH: &[&str] = &["/tmp", "/run", "/var/run", "/dev", "/proc"];

/// Device nodes the sandbox gets from the host.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn do_mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    mount(src, target, fstype, flags, data).with_context(|| {
        format!(
            "mount {} on {} ({})",
            src.map_or_else(
                || fstype.unwrap_or("-").to_string(),
                |s| s.display().to_string()
            ),
            target.display(),
            fstype.unwrap_or("bind")
        )
    })
}

fn tmpfs(target: &Path, mode: &str, extra: MsFlags) -> Result<()> {
    do_mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | extra,
        Some(mode),
    )
}

/// An `O_PATH` handle, to reach a path after something is mounted over it.
fn handle(p: &Path) -> Result<OwnedFd> {
    open(p, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .with_context(|| format!("opening {}", p.display()))
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Bind `src` (a handle) onto `target`, creating the mount point first.
fn bind_handle(fd: &OwnedFd, target: &Path, is_dir: bool) -> Result<()> {
    if is_dir {
        fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    } else {
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        // A mount point that exists already (inside a read-only bind of
        // its directory) is used as it is.
        if fs::symlink_metadata(target).is_err() {
            fs::write(target, b"").with_context(|| format!("creating {}", target.display()))?;
        }
    }
    do_mount(
        Some(&fd_path(fd)),
        target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )
}

/// Remount a bind mount read-only, keeping the flags the kernel locked on
/// it (a user namespace may not clear nosuid, nodev, noexec or atime bits).
fn remount_readonly(target: &Path) -> Result<()> {
    let st = statvfs(target).with_context(|| format!("statvfs {}", target.display()))?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    for (f, m) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if st.flags().contains(f) {
            flags |= m;
        }
    }
    do_mount(None, target, None, flags, None)
}

/// An overlay on `layer.root`: the host's tree read-only below, the
/// changeset's directory above. Paths go as `/proc/self/fd/N` handles,
/// which need no escaping of the option string's `,` `:` and `\\`.
/// `userxattr`: the only kind a user namespace may use (whiteouts are
/// 0/0 devices, opaque directories `user.overlay.opaque`; redirects and
/// metacopy are off, so a renamed directory is copied, never pointed at).
/// `volatile`: the upper layer is not synced when the overlay goes (with
/// the sandbox's last process), which on a busy disk cost every review
/// run a sync of the whole file system (3 to 170 ms measured); the
/// changeset then reaches the disk as any write does, as the host tree's
/// would without --review (a sync inside the sandbox is a no-op on it).
fn overlay(layer: &crate::plan::Layer) -> Result<()> {
    let lower = handle(&layer.root)?;
    let upper = handle(&layer.upper)?;
    let work = handle(&layer.work)?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={},userxattr,volatile",
        fd_path(&lower).display(),
        fd_path(&upper).display(),
        fd_path(&work).display()
    );
    do_mount(
        Some(Path::new("overlay")),
        &layer.root,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(&data),
    )
    .with_context(|| {
        format!(
            "--review: {} cannot be held for review (overlayfs refused it; its file system may not support being a lower layer in a user namespace)",
            layer.root.display()
        )
    })
}

pub fn setup(plan: &Plan) -> Result<()> {
    // Nothing we mount may propagate back to the host.
    do_mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None,
    )?;

    // --review (SPEC §4.8): the writable roots become copy-on-write layers
    // first, so that every mount below that lies inside one (deny_read,
    // the read-only protected set, the pins, /tmp's binds) covers the
    // layer the sandbox sees, exactly as it covers the root without it.
    for layer in &plan.review {
        overlay(layer)?;
    }

    // Handles to what must still be reachable once /tmp and /dev are covered.
    let tmp_roots: Vec<(PathBuf, OwnedFd, bool)> = plan
        .tmp_binds
        .iter()
        .filter_map(|p| handle(p).ok().map(|fd| (p.clone(), fd, p.is_dir())))
        .collect();
    // `--read` paths under /tmp: bound back read-only (the mount itself
    // refuses writes, whatever Landlock's roots say).
    let tmp_read: Vec<(PathBuf, OwnedFd, bool)> = plan
        .tmp_read_binds
        .iter()
        .filter_map(|p| handle(p).ok().map(|fd| (p.clone(), fd, p.is_dir())))
        .collect();
    // The covers of hidden files watched for reads (linux/readwatch.rs),
    // which may lie under the host's /tmp (HOME there).
    let covers: Vec<(&PathBuf, OwnedFd)> = plan
        .deny_read_masks
        .iter()
        .filter_map(|(hidden, cover)| handle(cover).ok().map(|fd| (hidden, fd)))
        .collect();
    // Project configuration without its credentials (project_secrets.rs).
    let sanitised: Vec<(&PathBuf, OwnedFd)> = plan
        .sanitised
        .iter()
        .filter_map(|(file, copy)| handle(copy).ok().map(|fd| (file, fd)))
        .collect();
    let sockets = super::sockets::keep(plan);
    let devices: Vec<(&str, OwnedFd)> = DEVICES
        .iter()
        .filter_map(|d| handle(&Path::new("/dev").join(d)).ok().map(|fd| (*d, fd)))
        .collect();

    let size = super::limits::tmpfs_size(&plan.limits);
    tmpfs(
        Path::new("/tmp"),
        &format!("mode=1777,{size}"),
        MsFlags::empty(),
    )?;
    // Shallowest first, so that a writable root below a `--read` one is
    // bound over it (and stays writable), not hidden by it.
    let mut binds: Vec<(&PathBuf, &OwnedFd, bool, bool)> = tmp_roots
        .iter()
        .map(|(p, fd, d)| (p, fd, *d, false))
        .chain(tmp_read.iter().map(|(p, fd, d)| (p, fd, *d, true)))
        .collect();
    binds.sort_by_key(|(p, ..)| p.components().count());
    for (path, fd, is_dir, read_only) in binds {
        bind_handle(fd, path, is_dir)?;
        if read_only {
            remount_readonly(path)?;
        }
    }

    // Host sockets (docker.sock, D-Bus, ssh-agent) live here.
    for dir in ["/run", "/var/run"] {
        let p = Path::new(dir);
        if p.is_dir() && !p.is_symlink() {
            tmpfs(p, "mode=0755", MsFlags::empty())?;
        }
    }
    // Name resolution goes to airlock's DNS server, when capture is on.
    if let Err(e) = super::capture::resolv_conf() {
        eprintln!("airlock: warning: {e:#}");
    }

    let dev_opts = format!("mode=0755,{}", super::limits::DEV_SIZE);
    tmpfs(Path::new("/dev"), &dev_opts, MsFlags::MS_NOEXEC)?;
    for (name, fd) in &devices {
        bind_handle(fd, &Path::new("/dev").join(name), false)?;
    }
    let pts = Path::new("/dev/pts");
    fs::create_dir_all(pts).context("creating /dev/pts")?;
    do_mount(
        Some(Path::new("devpts")),
        pts,
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let shm = Path::new("/dev/shm");
    fs::create_dir_all(shm).context("creating /dev/shm")?;
    tmpfs(shm, &format!("mode=1777,{size}"), MsFlags::MS_NOEXEC)?;
    for (link, to) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, link).with_context(|| format!("linking {link}"))?;
    }

    // Our own PID namespace's processes only.
    do_mount(
        Some(Path::new("proc")),
        Path::new("/proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;

    // Pin the ancestors of every protection: a mount point cannot be
    // renamed or removed (EBUSY), so `mv .git x` cannot carry the read-only
    // binds below it away. Shallowest first; MS_REC keeps what is below.
    for p in &plan.pin {
        if p.is_dir() && !p.is_symlink() {
            do_mount(Some(p), p, None, MsFlags::MS_BIND | MsFlags::MS_REC, None)?;
        }
    }
    // `.env` files (dotenv.rs) are files like any hidden one; a link among
    // them is hidden where it leads.
    let env_files = plan
        .deny_read_env
        .iter()
        .filter_map(|p| crate::resolve::canonical(p));
    for p in plan.deny_read.iter().cloned().chain(env_files) {
        let p = &p;
        match fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => tmpfs(p, "mode=0000", MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC)?,
            Ok(_) => {
                // Its own empty file where reads are watched for the
                // report (linux/readwatch.rs), read-only; else /dev/null.
                let cover = covers.iter().find(|(hidden, _)| *hidden == p);
                match cover {
                    Some((_, fd)) if bind_handle(fd, p, false).is_ok() => {
                        remount_readonly(p)?;
                    }
                    _ => do_mount(
                        Some(Path::new("/dev/null")),
                        p,
                        None,
                        MsFlags::MS_BIND,
                        None,
                    )?,
                }
            }
            Err(_) => {}
        }
    }
    for (file, fd) in &sanitised {
        if fs::symlink_metadata(file).is_ok_and(|m| m.is_file()) {
            bind_handle(fd, file, false)?;
            remount_readonly(file)?;
        }
    }
    for p in &plan.deny_write {
        if p.exists() {
            do_mount(Some(p), p, None, MsFlags::MS_BIND | MsFlags::MS_REC, None)?;
            remount_readonly(p)?;
        }
    }
    super::sockets::mask(sockets)
}
