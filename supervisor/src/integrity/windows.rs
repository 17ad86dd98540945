//! When sandboxes ran. Anything in a writable root may have been written
//! by an earlier sandboxed run (SPEC §3.5): a run can write a hook into a
//! directory that is no repository yet, for a later run to complete it
//! with a `HEAD` or a rename, which leaves the hook's own ctime as it was.
//! So the post-run check asks of a file whether its ctime falls in *any*
//! sandbox's run, not only this one's: each run's window (its start by the
//! kernel's clock to the moment every process of it was gone) is appended
//! here, in airlock's config directory, which no sandbox can write. A
//! window speaks for every path, not only for those below that run's
//! roots: a file keeps its ctime when a directory above it is renamed, so
//! what a run wrote below its root can later lie below another (the
//! sandbox's own `mv` from a subdirectory's run into its parent's, the user
//! renaming the project; red team round 22). The cost is that what the
//! user changes in a nested repository's hooks while an agent runs in
//! another workspace is judged too (moved to the quarantine and reported,
//! not lost). What the user changed between runs lies outside every
//! window and is theirs.
//!
//! The record is read only when an item older than this run needs judging
//! (most runs judge nothing, or only what they wrote themselves).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::SystemTime;

/// Windows kept at most; past it, the closest ones are merged (a merged
/// window covers both and the gap: more is judged, never less). The record
/// is rewritten merged when it holds twice as many lines.
const KEEP: usize = 1024;

/// The record, beside the run journals.
fn path() -> Option<PathBuf> {
    super::journal::path_of("windows").map(|p| p.with_extension(""))
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// The runs of sandboxes: the one being checked, from `since` on, and the
/// recorded ones, as sorted closed intervals of ctime in nanoseconds since
/// the epoch, read when first needed.
#[derive(Debug, Default)]
pub struct Windows {
    since: u128,
    /// The run being checked, whose own open journal does not count.
    run: String,
    recorded: OnceLock<Vec<(u128, u128)>>,
}

impl Windows {
    /// `[since, ∞)` for the run being checked, and the recorded windows.
    pub fn with_current(since: SystemTime, run: &str) -> Windows {
        Windows {
            since: nanos(since),
            run: run.to_string(),
            recorded: OnceLock::new(),
        }
    }

    /// Whether a file changed at `ctime` may have been written by a
    /// sandbox: some run was going on then.
    pub fn covers(&self, ctime: SystemTime) -> bool {
        let t = nanos(ctime);
        if t >= self.since {
            return true;
        }
        let spans = self
            .recorded
            .get_or_init(|| read(&self.run).unwrap_or_default());
        // (This run's own journal is among the open ones: harmless.)
        let i = spans.partition_point(|(start, _)| *start <= t);
        i > 0 && spans[i - 1].1 >= t
    }
}

/// `start end` a line (a later field, such as the run's roots in older
/// records, is ignored); malformed lines are skipped.
fn parse(text: &str) -> Vec<(u128, u128)> {
    let spans = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split(' ');
            let s: u128 = words.next()?.parse().ok()?;
            let e: u128 = words.next()?.parse().ok()?;
            (s <= e).then_some((s, e))
        })
        .collect();
    merged(spans, KEEP)
}

/// Spans sorted and overlaps merged, then the smallest gaps closed until
/// at most `keep` remain.
fn merged(mut spans: Vec<(u128, u128)>, keep: usize) -> Vec<(u128, u128)> {
    spans.sort_unstable();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    if out.len() > keep {
        let mut gaps: Vec<u128> = out.windows(2).map(|w| w[1].0 - w[0].1).collect();
        gaps.sort_unstable();
        let limit = gaps[out.len() - keep - 1];
        let mut closed: Vec<(u128, u128)> = Vec::with_capacity(keep);
        for (s, e) in out {
            match closed.last_mut() {
                Some(last) if s - last.1 <= limit => last.1 = e,
                _ => closed.push((s, e)),
            }
        }
        out = closed;
    }
    out
}

/// The record alone (closed windows).
fn read_record() -> Option<Vec<(u128, u128)>> {
    let bytes = crate::paths::read_no_follow(&path()?).ok()?;
    Some(parse(&String::from_utf8_lossy(&bytes)))
}

/// The recorded windows, and those of runs whose journal is still there
/// (going on beside this one, or whose airlock died): open until now.
fn read(own: &str) -> Option<Vec<(u128, u128)>> {
    let mut spans = read_record().unwrap_or_default();
    spans.extend(
        super::journal::open_since(own)
            .into_iter()
            .map(|t| (nanos(t), u128::MAX)),
    );
    Some(merged(spans, KEEP))
}

/// Record a finished run's window. Appended with one write (concurrent
/// runs each add a whole line); rewritten merged when it has grown long.
pub fn record(since: SystemTime, until: SystemTime) {
    let Some(p) = path() else { return };
    let line = format!("{} {}\n", nanos(since), nanos(until).max(nanos(since)));
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&p)
        .and_then(|mut f| {
            f.write_all(line.as_bytes())?;
            f.metadata()
        });
    match appended {
        Ok(meta) if meta.len() > 2 * (KEEP as u64) * 40 => compact(&p),
        Ok(_) => {}
        Err(e) => tracing::warn!("recording the run's window in {}: {e}", p.display()),
    }
}

/// Rewrite the record merged, through a file renamed over it.
fn compact(p: &std::path::Path) {
    let Some(spans) = read_record() else { return };
    let text: String = spans.iter().map(|(s, e)| format!("{s} {e}\n")).collect();
    let tmp = p.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if written.is_ok() {
        let _ = std::fs::rename(&tmp, p);
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(ns)
    }

    #[test]
    fn windows_cover_their_runs_and_nothing_between() {
        let spans = parse("100 200\n150 250 2f77\n300 400\nnonsense\n500 499\n");
        assert_eq!(spans, vec![(100, 250), (300, 400)]);
        let w = Windows {
            since: 1000,
            run: String::new(),
            recorded: OnceLock::from(spans),
        };
        for (t, want) in [
            (99, false),
            (100, true),
            (250, true),
            (251, false),
            (350, true),
            (401, false),
            (999, false),
            (1000, true),
            (5000, true),
        ] {
            assert_eq!(w.covers(at(t)), want, "{t}");
        }
    }

    #[test]
    fn merging_only_ever_covers_more() {
        let spans: Vec<(u128, u128)> = (0..(KEEP as u128 + 10))
            .map(|i| (i * 10, i * 10 + 1))
            .collect();
        let out = merged(spans.clone(), KEEP);
        assert!(out.len() <= KEEP);
        let w = Windows {
            since: u128::MAX,
            run: String::new(),
            recorded: OnceLock::from(out),
        };
        for (s, e) in spans {
            assert!(w.covers(at(s as u64)) && w.covers(at(e as u64)));
        }
    }
}
