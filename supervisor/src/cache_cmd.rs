//! `airlock cache`: the airlock-owned caches presets point tools at, one
//! directory per project (SPEC §3.4), listed with their size and cleared.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::cli::CacheCommand;
use crate::text::shown;

/// What presets' caches were before each project had its own: shared by
/// every project, so possibly written by any of them. Nothing uses them
/// now; they are listed so that they can be removed.
const LEGACY: &[&str] = &["npm", "pip", "uv", "cargo", "go", "config"];

struct Entry {
    dir: PathBuf,
    /// The project it belongs to, as recorded when it was made.
    project: Option<PathBuf>,
    bytes: u64,
}

fn base() -> Result<PathBuf> {
    crate::integrity::quarantine::airlock_cache().context("neither XDG_CACHE_HOME nor HOME is set")
}

pub fn run(action: Option<&CacheCommand>) -> Result<ExitCode> {
    match action {
        None => list(false),
        Some(CacheCommand::List { json }) => list(*json),
        Some(CacheCommand::Clear {
            project,
            all,
            legacy,
        }) => clear(project.as_deref(), *all, *legacy),
    }
}

fn projects(base: &Path) -> Vec<Entry> {
    let mut out: Vec<Entry> = std::fs::read_dir(base.join("projects"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| {
                    let dir = e.path();
                    let project = std::fs::read_to_string(dir.join(crate::prepare::PROJECT_FILE))
                        .ok()
                        .map(|t| PathBuf::from(t.trim_end_matches('\n')));
                    Entry {
                        bytes: disk_use(&dir),
                        dir,
                        project,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.dir.cmp(&b.dir));
    out
}

fn legacy(base: &Path) -> Vec<PathBuf> {
    LEGACY
        .iter()
        .map(|n| base.join(n))
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect()
}

fn list(as_json: bool) -> Result<ExitCode> {
    let base = base()?;
    let entries = projects(&base);
    let old = legacy(&base);
    let here = here().ok();
    if as_json {
        let list: Vec<_> = entries
            .iter()
            .map(|e| {
                json!({
                    "dir": e.dir,
                    "project": e.project,
                    "project_exists": e.project.as_ref().map(|p| p.exists()),
                    "bytes": e.bytes,
                    "current": here.as_ref() == Some(&e.dir),
                })
            })
            .collect();
        say!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "base": base,
                "projects": list,
                "legacy": old,
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    say!(
        "airlock's caches in {} (one directory per project; nothing is shared between projects)",
        shown(&base)
    );
    if entries.is_empty() {
        say!("  none yet: a run with a package-manager preset makes its project's");
    }
    for e in &entries {
        let project = match &e.project {
            Some(p) if p.exists() => shown(p),
            Some(p) => format!("{} (gone)", shown(p)),
            None => "(project not recorded)".into(),
        };
        let mark = if here.as_ref() == Some(&e.dir) {
            "*"
        } else {
            " "
        };
        say!(
            "{mark} {:>9}  {}  {project}",
            human(e.bytes),
            e.dir
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
    }
    for d in &old {
        say!(
            "  {:>9}  {} (shared by every project before each had its own; nothing uses it now: `airlock cache clear --legacy`)",
            human(disk_use(d)),
            shown(d)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The cache directory of the project `run` would take from the current
/// directory.
fn here() -> Result<PathBuf> {
    let (workspace, _) = crate::policy::workspace_dir(&Default::default())?;
    project_dir(&workspace)
}

fn project_dir(workspace: &Path) -> Result<PathBuf> {
    let project = crate::policy::project_root(workspace);
    Ok(base()?
        .join("projects")
        .join(airlock_policy::preset::project_key(&project)))
}

fn clear(project: Option<&Path>, all: bool, legacy_only: bool) -> Result<ExitCode> {
    let base = base()?;
    let mut targets: Vec<PathBuf> = vec![];
    if all || legacy_only {
        targets.extend(legacy(&base));
    }
    if all {
        targets.extend(projects(&base).into_iter().map(|e| e.dir));
    } else if !legacy_only {
        let dir = match project {
            Some(p) => {
                let p = std::fs::canonicalize(p)
                    .with_context(|| format!("{} does not exist", p.display()))?;
                project_dir(&p)?
            }
            None => here()?,
        };
        if std::fs::symlink_metadata(&dir).is_err() {
            say!("no caches for this project ({})", shown(&dir));
            return Ok(ExitCode::SUCCESS);
        }
        targets.push(dir);
    }
    for t in &targets {
        remove(&base, t)?;
        say!("removed {}", shown(t));
    }
    if targets.is_empty() {
        say!("nothing to remove");
    }
    Ok(ExitCode::SUCCESS)
}

/// Remove one of airlock's own cache directories: only a real directory
/// directly below the cache base or its `projects/`, never through a link
/// (`remove_dir_all` does not follow the links inside).
fn remove(base: &Path, dir: &Path) -> Result<()> {
    let parent = dir.parent().context("no parent")?;
    if parent != base && parent != base.join("projects") {
        bail!("{} is not one of airlock's caches", shown(dir));
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        bail!("{} is not a directory; left alone", shown(dir));
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", shown(dir)))
}

/// Bytes on disk below `dir`, links not followed.
fn disk_use(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_airlocks_own_directories_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("airlock");
        let keep = t.path().join("users-data");
        std::fs::create_dir_all(base.join("projects/p-0123")).unwrap();
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(keep.join("f"), "mine").unwrap();
        // A link planted as a project's directory, and one inside.
        std::os::unix::fs::symlink(&keep, base.join("projects/q-4567")).unwrap();
        std::os::unix::fs::symlink(&keep, base.join("projects/p-0123/l")).unwrap();
        assert!(remove(&base, &base.join("projects/q-4567")).is_err());
        assert!(remove(&base, &keep).is_err());
        remove(&base, &base.join("projects/p-0123")).unwrap();
        assert!(!base.join("projects/p-0123").exists());
        assert_eq!(std::fs::read_to_string(keep.join("f")).unwrap(), "mine");
    }

    #[test]
    fn sizes_read_as_people_do() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 * 1024 * 1024), "3.0 MiB");
    }
}
