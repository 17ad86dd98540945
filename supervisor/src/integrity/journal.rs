//! The post-run check survives airlock's own death. Before the sandbox
//! starts, the snapshot is written to `$XDG_CONFIG_HOME/airlock/pending/`
//! (read-only in every sandbox); the check removes it when done. A run that
//! was SIGKILLed leaves it behind, and the next `airlock run` finishes that
//! check before it does anything else.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::snapshot::Snapshot;

#[derive(Serialize, Deserialize)]
pub struct Journal {
    pub run: String,
    /// The supervisor that owns it, and its start time (a reused pid is not it).
    pub pid: u32,
    pub pid_start: u64,
    /// The run's start by the kernel's clock, for nested repositories.
    pub since: (u64, u32),
    pub roots: Vec<PathBuf>,
    pub snapshot: Snapshot,
}

fn dir() -> Option<PathBuf> {
    crate::places::user_policy_path().and_then(|p| p.parent().map(|d| d.join("pending")))
}

/// Field 22 of /proc/PID/stat: when the process started, in clock ticks.
/// Where run `run`'s journal is written.
pub fn path_of(run: &str) -> Option<PathBuf> {
    dir().map(|d| d.join(format!("{run}.json")))
}

/// The journals' directory, made if absent. `run` makes it before the
/// protected set is snapshot: made later, by the journal's own write, it
/// showed up as created during the run when airlock's config directory
/// lies in a writable root (HOME as the workspace) and was quarantined.
pub fn make_dir() -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let dir = dir().context("neither XDG_CONFIG_HOME nor HOME is set")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

impl Journal {
    pub fn new(run: &str, since: SystemTime, roots: &[PathBuf], snapshot: Snapshot) -> Journal {
        let pid = std::process::id();
        let since = since
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Journal {
            run: run.to_string(),
            pid,
            pid_start: start_time(pid).unwrap_or(0),
            since: (since.as_secs(), since.subsec_nanos()),
            roots: roots.to_vec(),
            snapshot,
        }
    }

    pub fn since(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(self.since.0, self.since.1)
    }

    /// Write it; a journal that cannot be written is an error (without it a
    /// killed airlock would leave plants unchecked).
    pub fn write(&self) -> anyhow::Result<PathBuf> {
        use anyhow::Context;
        let dir = make_dir()?;
        let path = dir.join(format!("{}.json", self.run));
        let body = serde_json::to_vec(self).context("encoding the run journal")?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(&body)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

use std::os::unix::fs::DirBuilderExt;

/// When every run whose journal is still there began, and its roots: runs going on now
/// (another `airlock run` beside this one), and runs whose airlock died
/// before its check. Their windows are open until the journal goes.
/// Except `own`'s: a session checks itself between its commands, and its
/// own open journal would cover everything since it started (the
/// quarantine's own writes included), where its windows are exact.
pub fn open_since(own: &str) -> Vec<(SystemTime, Vec<PathBuf>)> {
    let own = path_of(own);
    #[derive(Deserialize)]
    struct Since {
        since: (u64, u32),
        roots: Vec<PathBuf>,
    }
    let Some(dir) = dir() else { return vec![] };
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return vec![];
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| own.as_ref() != Some(p))
        .filter_map(|p| crate::paths::read_no_follow(&p).ok())
        .filter_map(|b| serde_json::from_slice::<Since>(&b).ok())
        .map(|s| {
            (
                SystemTime::UNIX_EPOCH + Duration::new(s.since.0, s.since.1.min(999_999_999)),
                s.roots,
            )
        })
        .collect()
}

/// Journals of runs whose airlock is gone.
pub fn abandoned() -> Vec<(PathBuf, Journal)> {
    let Some(dir) = dir() else { return vec![] };
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return vec![];
    };
    let mut out = vec![];
    for e in rd.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(bytes) = crate::paths::read_no_follow(&path) else {
            continue;
        };
        let Ok(j) = serde_json::from_slice::<Journal>(&bytes) else {
            tracing::warn!("{}: not a run journal; left as it is", path.display());
            continue;
        };
        let alive = j.pid_start != 0 && start_time(j.pid) == Some(j.pid_start);
        if !alive {
            out.push((path, j));
        }
    }
    out
}

pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}
