//! The host is unchanged where it matters (SPEC §4.5): the protected set,
//! its snapshot before a run, and the post-run check that quarantines or
//! restores whatever the sandbox created or changed in it.

#[cfg(target_os = "linux")]
pub mod dirty;
pub mod identity;
pub mod journal;
pub mod nested;
pub mod ours;
pub mod quarantine;
pub mod snapshot;
#[cfg(target_os = "linux")]
pub mod watch;
pub mod windows;

pub use crate::plan::protected::Protected;
pub use quarantine::Outcome;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What the post-run check did, and the roots it could not fully search.
pub struct Checked {
    pub outcomes: Vec<Outcome>,
    pub failed: Vec<String>,
    /// The git directories the search found.
    pub repos: Vec<PathBuf>,
}

/// The post-run check (SPEC §4.5): what changed in the protected set, and
/// in repositories below the writable roots, is quarantined or restored.
/// Call only once every process of the sandbox is gone.
pub fn check(
    snap: &snapshot::Snapshot,
    roots: &[PathBuf],
    since: SystemTime,
    run: &str,
    before: &identity::Before,
) -> Checked {
    check_near(snap, roots, since, run, run, before, None)
}

/// `check`, with nested repositories searched only near `only` (the
/// directories a session's watch saw change); `None` searches everything.
/// `label` names the quarantine (`.airlock/quarantine/<label>/`): a
/// session checks many times under one run id.
pub fn check_near(
    snap: &snapshot::Snapshot,
    roots: &[PathBuf],
    since: SystemTime,
    run: &str,
    label: &str,
    before: &identity::Before,
    only: Option<&[PathBuf]>,
) -> Checked {
    let t = std::time::Instant::now();
    // Every process of the sandbox is gone: its window closes now.
    let until = nested::kernel_now();
    // A writable root that is a file (`--write FILE`, as a refusal advises)
    // holds nothing below it: nothing to search, and not "replaced".
    let roots: Vec<PathBuf> = roots
        .iter()
        .filter(|r| !std::fs::symlink_metadata(r).is_ok_and(|m| m.is_file()))
        .cloned()
        .collect();
    let roots = roots.as_slice();
    // A root the sandbox replaced by a link (where no mount pins it: the
    // degraded tier) hides what it planted below from the checks, which
    // follow no link: the link itself is what changed, in the root that
    // holds it (and is quarantined there), and the run fails. One that is
    // gone planted nothing; one that is a new directory is checked as any.
    let replaced: Vec<&PathBuf> = roots
        .iter()
        .filter(|r| std::fs::symlink_metadata(r).is_ok() && snapshot::open_root(r).is_err())
        .collect();
    let mut changes = snap.changes();
    changes.retain(|c| !replaced.contains(&&c.root));
    // What PID 1's mounts covered, the sandbox could not touch: a change
    // there is the user's own (an edit of `.env`, a shell's history with
    // HOME writable), not to be quarantined (red team round 9).
    // Only while each is still the inode covered at the start: one the host
    // replaced during the run (its mount went with the old one) was the
    // sandbox's to write, and is judged (red team round 10).
    let covered: Vec<PathBuf> = lock_covered()
        .iter()
        .filter(|(k, id)| identity_of(k) == Some(*id))
        .map(|(k, _)| k.clone())
        .collect();
    changes.retain(|c| {
        let p = c.root.join(&c.rel);
        let linked_elsewhere = {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(&p).is_ok_and(|m| !m.is_dir() && m.nlink() > 1)
        };
        linked_elsewhere || !covered.iter().any(|k| p.starts_with(k))
    });
    // What another airlock's check quarantined into `.airlock` beside this
    // run is not the sandbox's.
    changes.retain(|c| {
        !(c.rel.starts_with(".airlock")
            && c.kind != snapshot::ChangeKind::Removed
            && ours::wrote(&c.root.join(&c.rel)))
    });
    let mut failed = vec![];
    for r in &replaced {
        failed.push(format!(
            "the writable root {} was replaced during the run (by a link or a file)",
            crate::text::shown(r)
        ));
        let holder = r.parent().and_then(|p| {
            crate::plan::protected::root_of(p, roots)
                .or_else(|| roots.iter().find(|x| x.as_path() == p))
        });
        if let Some((holder, rel)) = holder.and_then(|h| Some((h, r.strip_prefix(h).ok()?))) {
            changes.push(snapshot::Change {
                root: holder.clone(),
                rel: rel.to_path_buf(),
                kind: snapshot::ChangeKind::Created,
                before: snapshot::State::Absent,
                git: false,
                hidden: false,
            });
        }
    }
    // This run's own journal, written by airlock after the snapshot it
    // holds (inside the protected set when HOME is a writable root).
    // The protected set holds resolved paths: HOME reached through a link
    // names the journal differently (its directory is airlock's own,
    // read-only to the sandbox, so resolving it now is resolving it then).
    let own: Vec<PathBuf> = journal::path_of(run)
        .into_iter()
        .flat_map(|p| {
            let real = crate::resolve::parent_resolved(&p);
            [Some(p), real]
        })
        .flatten()
        .collect();
    changes.retain(|c| !own.contains(&c.root.join(&c.rel)));
    tracing::debug!(elapsed = ?t.elapsed(), "protected set compared");
    let known: Vec<Protected> = snap.entries.iter().map(|(p, _)| p.clone()).collect();
    let windows = windows::Windows::with_current(since, run, roots);
    // What the thread beside the run has recorded so far is what there is.
    before.stop();
    // Nothing changed in the roots since the last check (a session's
    // watch says so): no repository there can have changed either.
    let (found, nested_failed, modes_restored, repos) = if only.is_some_and(|o| o.is_empty()) {
        (vec![], vec![], vec![], vec![])
    } else {
        let judge = nested::Judge {
            windows: &windows,
            before,
            cleared: std::cell::RefCell::new(identity::Cleared::load()),
            modes_restored: Default::default(),
        };
        let (found, nested_failed, repos) = nested::changes_near(roots, &judge, &known, only);
        judge.cleared.borrow().save();
        (found, nested_failed, judge.modes_restored.take(), repos)
    };
    failed.extend(nested_failed);
    tracing::debug!(elapsed = ?t.elapsed(), ?roots, "nested repositories searched");
    changes.extend(found);
    changes.retain(|c| !quarantine::inert_cache_marker(c));
    let mut outcomes = quarantine::act(&changes, label);
    // Marks in an index the sandbox wrote that hide its changes from git.
    for repo in &repos {
        let hidden = nested::hidden_by_index(repo, &windows);
        if !hidden.is_empty() {
            let shown: Vec<String> = hidden.iter().map(|h| crate::text::escape(h)).collect();
            outcomes.push(Outcome {
                path: repo.join("index").display().to_string(),
                change: "modified",
                action: format!(
                    "reported: it marks skip-worktree or assume-unchanged, so git status and git diff show no change to {}; `git update-index --no-skip-worktree --no-assume-unchanged -- FILE` shows them again",
                    shown.join(", ")
                ),
                dest: None,
                // Told, not an error: the marks are git's to keep.
                in_place: false,
            });
        }
    }
    outcomes.extend(modes_restored.into_iter().map(|p| Outcome {
        path: p.display().to_string(),
        change: "modified",
        action: "execute bits put back as they were".into(),
        dest: None,
        in_place: false,
    }));
    // A directory moved back whole (quarantine::bring_back) brings back
    // whatever the sandbox did inside it: what lies below is compared with
    // the snapshot again, and acted on, in its place.
    let moved_back: Vec<PathBuf> = outcomes
        .iter()
        .filter(|o| o.action.ends_with("moved back"))
        .map(|o| PathBuf::from(&o.path))
        .collect();
    if !moved_back.is_empty() {
        let below = |p: &std::path::Path| moved_back.iter().any(|m| p != m && p.starts_with(m));
        // And what was found where it lay meanwhile went back with it.
        let went_with_it = |o: &Outcome| {
            o.change == "created"
                && o.action.starts_with("reported")
                && std::fs::symlink_metadata(&o.path).is_err()
        };
        outcomes.retain(|o| !below(std::path::Path::new(&o.path)) && !went_with_it(o));
        // The directory itself too: its mode may have been changed on the
        // way, which hides what lies below from the comparison.
        let mut again = snap.changes();
        again.retain(|c| {
            let p = c.root.join(&c.rel);
            below(&p) || moved_back.contains(&p)
        });
        outcomes.extend(quarantine::act(&again, label));
    }
    if !outcomes.is_empty() {
        ours::record(roots, label);
        // What airlock itself put in place (a plain config, a file put
        // back) is not the sandbox's: another airlock checking beside this
        // one (a second session in the workspace) would otherwise judge
        // it, and this one its judgement, over and over.
        let mut cleared = identity::Cleared::load();
        for o in &outcomes {
            let ours = ["restored", "sanitised", "moved back"]
                .iter()
                .any(|a| o.action.ends_with(a));
            if let Some(s) = ours
                .then(|| identity::observe(std::path::Path::new(&o.path)))
                .flatten()
            {
                cleared.add(&s);
            }
        }
        cleared.save();
    }
    tracing::debug!(elapsed = ?t.elapsed(), "changes acted on");
    windows::record(since, until, roots);
    Checked {
        outcomes,
        failed,
        repos,
    }
}

/// Each covered path and its inode (device, inode) at the start.
static COVERED: std::sync::Mutex<Vec<(PathBuf, (u64, u64))>> = std::sync::Mutex::new(Vec::new());

/// (device, inode) of a covered path, but `None` for a file with another
/// hard link: the cover is on this name, and a second name reaches the
/// same inode uncovered (red team round 11), so a change there may be the
/// sandbox's.
fn identity_of(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .filter(|m| m.is_dir() || m.nlink() == 1)
        .map(|m| (m.dev(), m.ino()))
}

fn lock_covered() -> std::sync::MutexGuard<'static, Vec<(PathBuf, (u64, u64))>> {
    COVERED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The hidden paths that exist and that the full tier's mounts cover
/// read-only (a file) or empty and closed (a directory) for this run: the
/// checks leave what changes there to the user. Not set for the degraded
/// tier, which covers nothing, nor for a killed run's check (`recover`).
pub fn covered_by_mounts(paths: impl IntoIterator<Item = PathBuf>) {
    let mut all = vec![];
    for p in paths {
        // Resolved when the plan was made, moments ago: what did not
        // resolve then (absent, most of the built-in list) is not looked
        // up again. Left out, a path is only judged the more strictly.
        let Some(real) = crate::resolve::canonical(&p) else {
            continue;
        };
        if real != p {
            if let Some(id) = identity_of(&real) {
                all.push((real, id));
            }
        }
        if let Some(id) = identity_of(&p) {
            all.push((p, id));
        }
    }
    *lock_covered() = all;
}

/// Finish the checks of runs whose airlock was killed before it could.
pub fn recover() {
    for (path, j) in journal::abandoned() {
        eprintln!(
            "airlock: finishing the post-run check of run {}, whose airlock was killed",
            crate::text::escape(&j.run)
        );
        // Nothing was recorded beside that run: judged by ctime alone.
        let c = check(
            &j.snapshot,
            &j.roots,
            j.since(),
            &j.run,
            &identity::Before::default(),
        );
        for line in quarantine::lines(&c.outcomes) {
            eprintln!("{line}");
        }
        for f in &c.failed {
            eprintln!("airlock: error: {f}");
        }
        journal::remove(&path);
    }
}
