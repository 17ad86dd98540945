//! What /proc says about processes: the one place that lists them and
//! reads their parent, state and open sockets, for init's reaping, the
//! connect() decider, attribution and the approver's sandbox view.

/// Every process /proc lists now (its numeric entries).
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A process's state letter (`T` stopped, `Z` dead) and parent, from
/// /proc/PID/stat: read after the last ')', since the command name may
/// hold spaces and parentheses.
#[cfg(target_os = "linux")]
pub fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Whether `pid` has the socket with inode `ino` open.
#[cfg(target_os = "linux")]
pub fn holds_socket(pid: u32, ino: impl std::fmt::Display) -> bool {
    let want = format!("socket:[{ino}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
    })
}

/// The peer of a connected unix socket: its pid, once it is known to be
/// this user's and to live outside every sandbox (in our own user
/// namespace: every sandbox of the full tier has one of its own).
#[cfg(target_os = "linux")]
pub fn peer_outside(fd: impl std::os::fd::AsFd) -> Result<u32, String> {
    let cred = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("reading the peer's credentials: {e}"))?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if cred.uid() != uid {
        return Err(format!("the peer runs as uid {}, not as you", cred.uid()));
    }
    let pid = cred.pid();
    let ours =
        std::fs::read_link("/proc/self/ns/user").map_err(|e| format!("our user namespace: {e}"))?;
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/user"))
        .map_err(|e| format!("the peer's user namespace: {e}"))?;
    if ours != theirs {
        return Err(format!("the peer (pid {pid}) runs inside a sandbox"));
    }
    Ok(pid as u32)
}

/// The children of `pid`, of every thread of it.
#[cfg(target_os = "linux")]
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return vec![];
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The processes below those in `top` (their children, theirs, ...), at
/// most `max`: `None` when there are more.
#[cfg(target_os = "linux")]
pub fn descendants(top: &[u32], max: usize) -> Option<Vec<u32>> {
    let mut out: Vec<u32> = vec![];
    let mut queue: Vec<u32> = top.to_vec();
    while let Some(p) = queue.pop() {
        for c in children(p) {
            if out.len() >= max {
                return None;
            }
            out.push(c);
            queue.push(c);
        }
    }
    Some(out)
}

/// The files `pid` could write through a mapping without another open
/// (a write through one raises no inotify event), of those `keep` keeps,
/// as its mount namespace names them: every file it has mapped shared,
/// writable or not (`mprotect` makes a mapping of a file opened for
/// writing writable again), and every file it holds open for writing (it
/// can map one for a moment at any time). Not those deleted since.
#[cfg(target_os = "linux")]
pub fn files_it_can_write(
    pid: u32,
    keep: &dyn Fn(&std::path::Path) -> bool,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut out: Vec<std::path::PathBuf> = text
        .lines()
        .filter_map(shared_file)
        .filter(|p| keep(p))
        .collect();
    // Mapped by a name since removed, while the file lives on under
    // another (a temporary hard link to a protected file: red team round
    // 14): named by its `map_files` entry, which leads to the file.
    for line in text.lines() {
        if let Some((range, gone)) = shared_deleted(line) {
            let held: std::path::PathBuf = format!("/proc/{pid}/map_files/{range}").into();
            if keep(&gone) && lives_on(&held) {
                out.push(held);
            }
        }
    }
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?;
    for fd in fds.flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let deleted = target
            .as_os_str()
            .as_encoded_bytes()
            .strip_suffix(b" (deleted)")
            .map(|b| {
                std::path::PathBuf::from(
                    <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b),
                )
            });
        if !target.is_absolute() || !keep(deleted.as_ref().unwrap_or(&target)) {
            continue;
        }
        // Held by a name since removed: the descriptor itself leads to
        // the file, which may live on under another name.
        let target = match deleted {
            Some(_) if !lives_on(&fd.path()) => continue,
            Some(_) => fd.path(),
            None => target,
        };
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ));
        let writable = info.ok().and_then(|t| {
            let flags = t
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))?
                .trim()
                .to_string();
            u32::from_str_radix(&flags, 8).ok()
        });
        // Unreadable: counted as writable (fails closed).
        if writable.is_none_or(|f| f & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32) {
            out.push(target);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Whether the file a process holds by a removed name still has a name
/// (a file with none is no host tool's); one that cannot be looked at
/// counts as having one.
#[cfg(target_os = "linux")]
fn lives_on(held: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(held).map_or(true, |m| m.nlink() > 0)
}

/// One line of /proc/PID/maps (`start-end perms offset dev inode path`)
/// when the mapping is a file's and shared: its range and its path.
#[cfg(target_os = "linux")]
fn shared_mapping(line: &str) -> Option<(&str, &str)> {
    let mut rest = line;
    let mut fields = [""; 5];
    for f in &mut fields {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace)?;
        *f = &rest[..end];
        rest = &rest[end..];
    }
    let path = rest.trim_start();
    (fields[1].as_bytes().get(3) == Some(&b's') && fields[4] != "0" && path.starts_with('/'))
        .then_some((fields[0], path))
}

/// A shared file mapping's range and the name it was mapped by, when that
/// name was removed.
#[cfg(target_os = "linux")]
fn shared_deleted(line: &str) -> Option<(String, std::path::PathBuf)> {
    let (range, path) = shared_mapping(line)?;
    let gone = path.strip_suffix(" (deleted)")?;
    Some((range.to_string(), std::path::PathBuf::from(gone)))
}

/// A shared file mapping's path, when that name is still there.
#[cfg(target_os = "linux")]
fn shared_file(line: &str) -> Option<std::path::PathBuf> {
    let (_, path) = shared_mapping(line)?;
    (!path.ends_with(" (deleted)")).then(|| std::path::PathBuf::from(path))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn only_shared_file_mappings_count() {
        let line = |perms: &str, ino: &str, path: &str| {
            format!(
                "7f0000000000-7f0000001000 {perms} 00000000 fd:01 {ino}                    {path}"
            )
        };
        assert_eq!(
            shared_file(&line("rw-s", "1234", "/w/sub/.git/config")),
            Some("/w/sub/.git/config".into())
        );
        assert_eq!(
            shared_file(&line("r--s", "1234", "/w/a name")),
            Some("/w/a name".into())
        );
        // Mapped by a name since removed (red team round 14).
        assert_eq!(
            shared_deleted(&line("rw-s", "1234", "/w/.held (deleted)")),
            Some(("7f0000000000-7f0000001000".into(), "/w/.held".into()))
        );
        assert_eq!(
            shared_deleted(&line("rw-p", "1234", "/w/.held (deleted)")),
            None
        );
        assert_eq!(shared_deleted(&line("rw-s", "1234", "/w/.held")), None);
        for (perms, ino, path) in [
            ("rw-p", "1234", "/w/f"),
            ("r--p", "1234", "/w/f"),
            ("rw-s", "0", "/SYSV00000000"),
            ("rw-s", "1234", "/w/f (deleted)"),
            ("rw-p", "0", "[heap]"),
        ] {
            assert_eq!(shared_file(&line(perms, ino, path)), None, "{perms} {path}");
        }
        // This process's own: a file it holds open for writing counts.
        let dir = tempfile::tempdir().unwrap();
        let held = dir.path().join("held");
        let _f = std::fs::File::create(&held).unwrap();
        let got = files_it_can_write(std::process::id(), &|p| p.starts_with(dir.path())).unwrap();
        assert_eq!(got, vec![held]);
    }
}
