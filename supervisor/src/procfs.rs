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
