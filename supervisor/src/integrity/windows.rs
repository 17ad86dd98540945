//! When sandboxes ran. Anything in a writable root may have been written
//! by an earlier sandboxed run (SPEC §3.5): a run can write a hook into a
//! directory that is no repository yet, for a later run to complete it
//! with a `HEAD` or a rename, which leaves the hook's own ctime as it was.
//! So the post-run check asks of a file whether its ctime falls in *any*
//! sandbox's run, not only this one's: each run's window (its start by the
//! kernel's clock to the moment every process of it was gone) is appended
//! here, in airlock's config directory, which no sandbox can write. What
//! the user changed between runs lies outside every window and is theirs.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::SystemTime;

/// Windows kept at most; past it, the closest ones are merged (a merged
/// window covers both and the gap: more is judged, never less).
const KEEP: usize = 4096;

/// The record, beside the run journals.
fn path() -> Option<PathBuf> {
    super::journal::path_of("windows").map(|p| p.with_extension(""))
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Sandbox runs as closed intervals of ctime, in nanoseconds since the
/// epoch, sorted and merged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Windows(Vec<(u128, u128)>);

impl Windows {
    /// The recorded windows, and `[since, ∞)` for the run being checked.
    pub fn with_current(since: SystemTime) -> Windows {
        let mut w = read();
        w.0.push((nanos(since), u128::MAX));
        w.normalise();
        w
    }

    /// Whether a file changed at `ctime` may have been written by a sandbox.
    pub fn covers(&self, ctime: SystemTime) -> bool {
        let t = nanos(ctime);
        let i = self.0.partition_point(|(start, _)| *start <= t);
        i > 0 && self.0[i - 1].1 >= t
    }

    fn normalise(&mut self) {
        self.0.sort();
        let mut out: Vec<(u128, u128)> = Vec::with_capacity(self.0.len());
        for (s, e) in self.0.drain(..) {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        if out.len() > KEEP {
            // Close every gap up to the one that leaves KEEP windows.
            let mut gaps: Vec<u128> = out.windows(2).map(|w| w[1].0 - w[0].1).collect();
            gaps.sort_unstable();
            let limit = gaps[out.len() - KEEP - 1];
            let mut merged: Vec<(u128, u128)> = Vec::with_capacity(KEEP);
            for (s, e) in out {
                match merged.last_mut() {
                    Some(last) if s - last.1 <= limit => last.1 = e,
                    _ => merged.push((s, e)),
                }
            }
            out = merged;
        }
        self.0 = out;
    }

    fn parse(text: &str) -> Windows {
        let mut w = Windows(
            text.lines()
                .filter_map(|l| {
                    let (s, e) = l.split_once(' ')?;
                    let (s, e) = (s.parse().ok()?, e.parse().ok()?);
                    (s <= e).then_some((s, e))
                })
                .collect(),
        );
        w.normalise();
        w
    }
}

fn read() -> Windows {
    let Some(p) = path() else {
        return Windows::default();
    };
    match crate::trust::read_no_follow(&p) {
        Ok(bytes) => Windows::parse(&String::from_utf8_lossy(&bytes)),
        Err(_) => Windows::default(),
    }
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
        Ok(meta) if meta.len() > 2 * (KEEP as u64) * 80 => compact(&p),
        Ok(_) => {}
        Err(e) => tracing::warn!("recording the run's window in {}: {e}", p.display()),
    }
}

/// Rewrite the record merged, through a file renamed over it.
fn compact(p: &std::path::Path) {
    let w = read();
    let text: String = w.0.iter().map(|(s, e)| format!("{s} {e}\n")).collect();
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
        let mut w = Windows::parse("100 200\n300 400\nnonsense\n150 250\n500 499\n");
        assert_eq!(w.0, vec![(100, 250), (300, 400)]);
        for (t, want) in [
            (99, false),
            (100, true),
            (250, true),
            (251, false),
            (400, true),
        ] {
            assert_eq!(w.covers(at(t)), want, "{t}");
        }
        w.0.push((1000, u128::MAX));
        w.normalise();
        assert!(w.covers(at(5000)) && !w.covers(at(999)));
    }

    #[test]
    fn merging_only_ever_covers_more() {
        let mut w = Windows(
            (0..(KEEP as u128 + 10))
                .map(|i| (i * 10, i * 10 + 1))
                .collect(),
        );
        let before = w.clone();
        w.normalise();
        assert!(w.0.len() <= KEEP);
        for (s, e) in before.0 {
            assert!(w.covers(at(s as u64)) && w.covers(at(e as u64)));
        }
    }
}
