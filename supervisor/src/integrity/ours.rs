//! What airlock itself wrote in a root's `.airlock` (its quarantine), so
//! that another airlock's check does not take it for the sandbox's: two
//! sessions, or a session and a one-shot run, in one workspace each saw
//! the other's quarantine appear in the protected `.airlock` and set it
//! aside, over and over. Each check that quarantines records every entry
//! it made there (device, inode and ctime, in airlock's config directory,
//! which no sandbox can write); a change below `.airlock` is airlock's
//! only while every entry in it is recorded as it is now. Anything a
//! sandbox added or touched there has a ctime, or an inode, of its own,
//! and is judged as before.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct Entry {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// `None` for `.airlock` and `.airlock/quarantine`, which every
    /// quarantine changes: only their identity is theirs.
    ctime: Option<(i64, i64)>,
}

fn record_path() -> Option<PathBuf> {
    super::journal::path_of("ours").map(|p| p.with_extension("jsonl"))
}

fn entry(path: &Path, container: bool) -> Option<Entry> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(Entry {
        path: path.to_path_buf(),
        dev: m.dev(),
        ino: m.ino(),
        ctime: (!container).then(|| (m.ctime(), m.ctime_nsec())),
    })
}

/// Every entry below `dir` (itself included), links not followed.
fn tree(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    let is_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
    if !is_dir {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            tree(&e.path(), out);
        }
    }
}

/// Record what quarantine `label` wrote in each root.
pub fn record(roots: &[PathBuf], label: &str) {
    let Some(p) = record_path() else { return };
    let mut lines = String::new();
    for root in roots {
        let top = root.join(".airlock");
        let q = top.join("quarantine");
        let dir = q.join(label);
        if std::fs::symlink_metadata(&dir).is_err() {
            continue;
        }
        let mut all = vec![];
        tree(&dir, &mut all);
        let mut entries: Vec<Entry> = [entry(&top, true), entry(&q, true)]
            .into_iter()
            .flatten()
            .collect();
        // The `.gitignore` airlock writes in a fresh `.airlock`.
        entries.extend(entry(&top.join(".gitignore"), false));
        entries.extend(all.iter().filter_map(|p| entry(p, false)));
        for e in entries {
            if let Ok(l) = serde_json::to_string(&e) {
                lines.push_str(&l);
                lines.push('\n');
            }
        }
    }
    if lines.is_empty() {
        return;
    }
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&p)
        .and_then(|mut f| f.write_all(lines.as_bytes()));
    if let Err(e) = written {
        tracing::warn!("recording airlock's own quarantine in {}: {e}", p.display());
    }
}

/// Whether everything at and below `path` (in a root's `.airlock`) is what
/// an airlock check wrote there, unchanged since.
pub fn wrote(path: &Path) -> bool {
    let Some(p) = record_path() else { return false };
    let Ok(bytes) = crate::paths::read_no_follow(&p) else {
        return false;
    };
    let known: Vec<Entry> = String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut all = vec![];
    tree(path, &mut all);
    all.iter().all(|p| {
        known
            .iter()
            .any(|k| k.path == *p && entry(p, k.ctime.is_none()).is_some_and(|now| now == *k))
    })
}
