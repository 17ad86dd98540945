//! Files airlock writes where a sandboxed run may have planted something
//! (SPEC §3.5): the audit log, the report, the user policy. The last
//! component is opened with O_NOFOLLOW from a descriptor of its parent,
//! and refused when it is a symlink, not a regular file, or a regular file
//! with more than one hard link (a link to `~/.bashrc` planted in the
//! workspace would otherwise be appended to or truncated).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SafeFileError {
    #[error("{path} is a symbolic link; airlock does not write through links (a sandboxed run may have planted it): remove it")]
    Symlink { path: String },
    #[error("{path} has {links} hard links; airlock does not write to a file that is also another file (a sandboxed run may have planted it): remove it")]
    HardLinked { path: String, links: u64 },
    #[error("{path} is not a regular file")]
    NotRegular { path: String },
    // The OS error is in the message and deliberately not a `source`:
    // a `{:#}` chain would print it twice.
    #[error("{path}: {error}")]
    Io { path: String, error: io::Error },
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Create if missing, keep the content, write at the end.
    Append,
    /// Create if missing, empty it (after the checks, never before).
    Replace,
}

/// The directory a file lives in, opened once (before the sandbox starts),
/// so later `*at` calls can't be redirected by a renamed parent.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(p: &Path) -> Result<CString, io::Error> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

fn io_err(path: &Path, source: io::Error) -> SafeFileError {
    SafeFileError::Io {
        path: path.display().to_string(),
        error: source,
    }
}

impl Dir {
    pub fn open(path: &Path) -> Result<Dir, SafeFileError> {
        let dir = if path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            path
        };
        let c = cstr(dir).map_err(|e| io_err(dir, e))?;
        // SAFETY: a valid C string; the descriptor is owned on success.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io_err(dir, io::Error::last_os_error()));
        }
        Ok(Dir {
            // SAFETY: `fd` was just opened and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: dir.to_path_buf(),
        })
    }

    pub fn raw(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open `name` (one component) in this directory for writing.
    pub fn open_file(&self, name: &str, mode: Mode, perm: u32) -> Result<File, SafeFileError> {
        let shown = self.path.join(name);
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(io_err(
                &shown,
                io::Error::new(io::ErrorKind::InvalidInput, "not a file name"),
            ));
        }
        let c = CString::new(name).map_err(|_| {
            io_err(
                &shown,
                io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"),
            )
        })?;
        let mut flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_CLOEXEC
            // A FIFO planted under the name must not block the open.
            | libc::O_NONBLOCK;
        if mode == Mode::Append {
            flags |= libc::O_APPEND;
        }
        // SAFETY: a valid directory descriptor and C string.
        let fd = unsafe { libc::openat(self.raw(), c.as_ptr(), flags, perm as libc::c_uint) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ELOOP) {
                return Err(SafeFileError::Symlink {
                    path: shown.display().to_string(),
                });
            }
            return Err(io_err(&shown, e));
        }
        // SAFETY: just opened, owned here.
        let file = unsafe { File::from_raw_fd(fd) };
        let meta = file.metadata().map_err(|e| io_err(&shown, e))?;
        if !meta.is_file() {
            return Err(SafeFileError::NotRegular {
                path: shown.display().to_string(),
            });
        }
        use std::os::unix::fs::MetadataExt;
        if meta.nlink() > 1 {
            return Err(SafeFileError::HardLinked {
                path: shown.display().to_string(),
                links: meta.nlink(),
            });
        }
        // SAFETY: clearing O_NONBLOCK on our own descriptor.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        if mode == Mode::Replace {
            file.set_len(0).map_err(|e| io_err(&shown, e))?;
        }
        Ok(file)
    }
}

impl Dir {
    /// Read `name` if it exists, refusing links as `open_file` does.
    pub fn read_file(&self, name: &str) -> Result<Option<String>, SafeFileError> {
        let shown = self.path.join(name);
        let c = CString::new(name).map_err(|_| {
            io_err(
                &shown,
                io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"),
            )
        })?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: a valid directory descriptor and C string.
        let fd = unsafe { libc::openat(self.raw(), c.as_ptr(), flags) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                Some(libc::ELOOP) => Err(SafeFileError::Symlink {
                    path: shown.display().to_string(),
                }),
                _ => Err(io_err(&shown, e)),
            };
        }
        // SAFETY: just opened, owned here.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let meta = file.metadata().map_err(|e| io_err(&shown, e))?;
        use std::os::unix::fs::MetadataExt;
        if !meta.is_file() {
            return Err(SafeFileError::NotRegular {
                path: shown.display().to_string(),
            });
        }
        if meta.nlink() > 1 {
            return Err(SafeFileError::HardLinked {
                path: shown.display().to_string(),
                links: meta.nlink(),
            });
        }
        let mut text = String::new();
        io::Read::read_to_string(&mut file, &mut text).map_err(|e| io_err(&shown, e))?;
        Ok(Some(text))
    }

    /// Rename `from` to `to`, both in this directory.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), SafeFileError> {
        let shown = self.path.join(to);
        let (Ok(f), Ok(t)) = (CString::new(from), CString::new(to)) else {
            return Err(io_err(
                &shown,
                io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"),
            ));
        };
        // SAFETY: valid descriptor and C strings.
        if unsafe { libc::renameat(self.raw(), f.as_ptr(), self.raw(), t.as_ptr()) } != 0 {
            return Err(io_err(&shown, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Remove `name` from this directory (not following links).
    pub fn remove(&self, name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: valid descriptor and C string.
            unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) };
        }
    }
}

/// Split `path` into its parent directory (opened) and its last component.
pub fn split(path: &Path) -> Result<(Dir, String), SafeFileError> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            io_err(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
            )
        })?
        .to_string();
    let parent = path.parent().unwrap_or(Path::new("."));
    Ok((Dir::open(parent)?, name))
}

/// Open `path` for writing without following a link at its last component.
pub fn open(path: &Path, mode: Mode, perm: u32) -> Result<File, SafeFileError> {
    let (dir, name) = split(path)?;
    dir.open_file(&name, mode, perm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn links_are_refused_and_targets_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("bashrc");
        std::fs::write(&victim, "original\n").unwrap();
        let sym = d.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&victim, &sym).unwrap();
        assert!(matches!(
            open(&sym, Mode::Append, 0o600),
            Err(SafeFileError::Symlink { .. })
        ));
        let hard = d.path().join("report.json");
        std::fs::hard_link(&victim, &hard).unwrap();
        assert!(matches!(
            open(&hard, Mode::Replace, 0o600),
            Err(SafeFileError::HardLinked { links: 2, .. })
        ));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\n");
        let fifo = d.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Refused without blocking (ENXIO, or not a regular file).
        assert!(open(&fifo, Mode::Append, 0o600).is_err());
        let ok = d.path().join("new.jsonl");
        let mut f = open(&ok, Mode::Append, 0o600).unwrap();
        f.write_all(b"x\n").unwrap();
        let mut f = open(&ok, Mode::Append, 0o600).unwrap();
        f.write_all(b"y\n").unwrap();
        assert_eq!(std::fs::read_to_string(&ok).unwrap(), "x\ny\n");
        open(&ok, Mode::Replace, 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&ok).unwrap(), "");
    }
}
