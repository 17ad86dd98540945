//! Extended attributes a review run sets (SPEC §4.8): `user.*` crosses
//! to the host, as a run without review would have left it. Under
//! `userxattr` overlayfs keeps its own marks in the upper layer as
//! `user.overlay.*` (origin, opaque, …), hides a lower file's own
//! `user.overlay.*` from the sandbox and stores one the sandbox sets
//! escaped (`user.overlay.overlay.X`): that namespace is left out both
//! ways, never carried and never removed from a host file. `trusted.*`,
//! `security.*` and `system.*` are never written by apply (the sandbox
//! cannot set them on the layer, and apply invents none).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

pub type Attrs = BTreeMap<OsString, Vec<u8>>;

const USER: &[u8] = b"user.";
const OVERLAY: &[u8] = b"user.overlay.";

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

/// Attribute names as `list` fills them into a buffer (growing it while
/// the kernel says ERANGE); none where the file system keeps none.
fn listed(list: impl Fn(&mut [u8]) -> isize) -> std::io::Result<Vec<Vec<u8>>> {
    let mut buf = vec![0u8; 1024];
    loop {
        let n = list(&mut buf);
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(vec![]),
            _ => return Err(e),
        }
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Every attribute name of `p` (links not followed).
fn names(p: &CString) -> std::io::Result<Vec<Vec<u8>>> {
    // SAFETY: a NUL-terminated path and a buffer of the size given.
    listed(|buf| unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

fn value(p: &CString, name: &[u8]) -> std::io::Result<Vec<u8>> {
    let name =
        CString::new(name).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: NUL-terminated path and name, a buffer of the size given.
        let n = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // 64 KiB is the kernel's cap on one value.
            Some(libc::ERANGE) if buf.len() < 1 << 17 => buf.resize(buf.len() * 4, 0),
            _ => return Err(e),
        }
    }
}

/// The `user.*` attributes of a path (links not followed), overlayfs's
/// namespace left out.
pub fn of(p: &Path) -> std::io::Result<Attrs> {
    let c = cpath(p)?;
    let mut out = Attrs::new();
    for n in names(&c)? {
        if carried(&n) {
            let v = value(&c, &n)?;
            out.insert(OsString::from_vec(n), v);
        }
    }
    Ok(out)
}

fn carried(name: &[u8]) -> bool {
    name.starts_with(USER) && !name.starts_with(OVERLAY)
}

/// Whether the host path's `user.*` attributes are not those the upper
/// layer gives it (either unreadable counts as different: fail closed).
pub fn differ(upper: &Path, host: &Path) -> bool {
    match (of(upper), of(host)) {
        (Ok(a), Ok(b)) => a != b,
        _ => true,
    }
}

fn fd_names(fd: BorrowedFd) -> std::io::Result<Vec<Vec<u8>>> {
    // SAFETY: an open descriptor and a buffer of the size given.
    listed(|buf| unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// Make the open file's `user.*` attributes exactly `want` (overlayfs's
/// and every other namespace's left alone).
pub fn set(fd: BorrowedFd, want: &Attrs) -> std::io::Result<()> {
    let bad = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
    for n in fd_names(fd)? {
        if carried(&n) && !want.contains_key(OsStr::from_bytes(&n)) {
            let c = CString::new(n).map_err(|_| bad())?;
            // SAFETY: an open descriptor and a NUL-terminated name.
            if unsafe { libc::fremovexattr(fd.as_raw_fd(), c.as_ptr()) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    for (n, v) in want {
        let c = CString::new(n.as_bytes()).map_err(|_| bad())?;
        // SAFETY: an open descriptor, a NUL-terminated name, a value of
        // the length given.
        let r =
            unsafe { libc::fsetxattr(fd.as_raw_fd(), c.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether every extended attribute of the open file is a `user.*` one.
pub fn only_user(fd: BorrowedFd) -> std::io::Result<bool> {
    Ok(fd_names(fd)?.iter().all(|n| n.starts_with(USER)))
}

/// Take overlayfs's own `user.overlay.*` attributes off the open file.
pub fn drop_overlay(fd: BorrowedFd) -> std::io::Result<()> {
    for n in fd_names(fd)? {
        if n.starts_with(OVERLAY) {
            let c = CString::new(n)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            // SAFETY: an open descriptor and a NUL-terminated name.
            if unsafe { libc::fremovexattr(fd.as_raw_fd(), c.as_ptr()) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}
