//! When sandboxes ran. Anything in a writable root may have been written
//! by an earlier sandboxed run (SPEC §3.5): a run can write a hook into a
//! directory that is no repository yet, for a later run to complete it
//! with a `HEAD` or a rename, which leaves the hook's own ctime as it was.
//! So the post-run check asks of a file whether its ctime falls in *any*
//! sandbox's run, not only this one's: each run's window (its start by the
//! kernel's clock to the moment every process of it was gone) is appended
//! here, in airlock's config directory, which no sandbox can write, with
//! the writable roots it had. A window speaks for every path, not only for
//! those below its roots: a file keeps its ctime when a directory above it
//! is renamed, so what a run wrote below its root can later lie below
//! another (the sandbox's own `mv` from a subdirectory's run into its
//! parent's, the user renaming the project; red team round 22). The cost
//! is that what the user changes in a nested repository's hooks while an
//! agent runs in another workspace is judged too (moved to the quarantine
//! and reported, not lost). What the user changed between runs lies
//! outside every window and is theirs.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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

/// One run: a closed interval of ctime in nanoseconds since the epoch,
/// and the writable roots it had.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Window {
    start: u128,
    end: u128,
    roots: Vec<PathBuf>,
}

/// Sandbox runs, sorted; windows of the same roots that overlap merged.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Windows(Vec<Window>);

impl Windows {
    /// The recorded windows, and `[since, ∞)` over `roots` for the run
    /// being checked.
    pub fn with_current(since: SystemTime, roots: &[PathBuf]) -> Windows {
        let mut w = read();
        w.0.push(Window {
            start: nanos(since),
            end: u128::MAX,
            roots: roots.to_vec(),
        });
        w.normalise();
        w
    }

    /// Whether a file changed at `ctime` may have been written by a
    /// sandbox: some run was going on then (see the module's comment for
    /// why its roots do not narrow this).
    pub fn covers(&self, ctime: SystemTime) -> bool {
        let t = nanos(ctime);
        self.0.iter().any(|w| w.start <= t && t <= w.end)
    }

    fn normalise(&mut self) {
        self.0.sort();
        // Group by roots, merge overlaps within each group.
        let mut groups: std::collections::BTreeMap<Vec<PathBuf>, Vec<(u128, u128)>> =
            Default::default();
        for w in self.0.drain(..) {
            groups.entry(w.roots).or_default().push((w.start, w.end));
        }
        let per_group = (KEEP / groups.len().max(1)).max(16);
        let mut out = vec![];
        for (roots, mut spans) in groups {
            spans.sort();
            out.extend(
                merged(spans, per_group)
                    .into_iter()
                    .map(|(start, end)| Window {
                        start,
                        end,
                        roots: roots.clone(),
                    }),
            );
        }
        out.sort();
        self.0 = out;
    }

    fn parse(text: &str) -> Windows {
        let mut w = Windows(text.lines().filter_map(parse_line).collect());
        w.normalise();
        w
    }
}

/// `start end root…`, each root hex-encoded (paths are bytes).
fn parse_line(line: &str) -> Option<Window> {
    let mut words = line.split(' ');
    let start = words.next()?.parse().ok()?;
    let end = words.next()?.parse().ok()?;
    let roots = words
        .map(|h| hex_decode(h).map(|b| PathBuf::from(OsString::from_vec(b))))
        .collect::<Option<Vec<_>>>()?;
    (start <= end && !roots.is_empty()).then_some(Window { start, end, roots })
}

fn line_of(w: &Window) -> String {
    let mut line = format!("{} {}", w.start, w.end);
    for r in &w.roots {
        line.push(' ');
        line.extend(r.as_os_str().as_bytes().iter().map(|b| format!("{b:02x}")));
    }
    line.push('\n');
    line
}

fn hex_decode(h: &str) -> Option<Vec<u8>> {
    if h.len() % 2 != 0 || h.is_empty() {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Sorted spans with overlaps merged, then the smallest gaps closed until
/// at most `keep` remain (a merged span covers both and the gap: more is
/// judged, never less).
fn merged(spans: Vec<(u128, u128)>, keep: usize) -> Vec<(u128, u128)> {
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

fn read() -> Windows {
    let Some(p) = path() else {
        return Windows::default();
    };
    match crate::trust::read_no_follow(&p) {
        Ok(bytes) => Windows::parse(&String::from_utf8_lossy(&bytes)),
        Err(_) => Windows::default(),
    }
}

/// Record a finished run's window over its writable roots. Appended with
/// one write (concurrent runs each add a whole line); rewritten merged
/// when it has grown long.
pub fn record(since: SystemTime, until: SystemTime, roots: &[PathBuf]) {
    let Some(p) = path() else { return };
    if roots.is_empty() {
        return;
    }
    let line = line_of(&Window {
        start: nanos(since),
        end: nanos(until).max(nanos(since)),
        roots: roots.to_vec(),
    });
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
    let text: String = w.0.iter().map(line_of).collect();
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

    fn window(start: u128, end: u128, root: &str) -> String {
        line_of(&Window {
            start,
            end,
            roots: vec![root.into()],
        })
    }

    #[test]
    fn windows_cover_their_runs_and_nothing_between() {
        let text = [
            window(100, 200, "/w/a"),
            window(150, 250, "/w/a"),
            window(300, 400, "/w/b"),
            "nonsense\n500 499 2f\n".to_string(),
        ]
        .concat();
        let w = Windows::parse(&text);
        assert_eq!(w.0.len(), 2);
        for (t, want) in [
            (99, false),
            (100, true),
            (250, true),
            (251, false),
            (350, true),
            (401, false),
        ] {
            assert_eq!(w.covers(at(t)), want, "{t}");
        }
        let odd = PathBuf::from(OsString::from_vec(b"/w/\xff d".to_vec()));
        let w = Windows::parse(&line_of(&Window {
            start: 1,
            end: 2,
            roots: vec![odd.clone()],
        }));
        assert_eq!(w.0[0].roots, vec![odd]);
        assert!(w.covers(at(1)));
    }

    #[test]
    fn merging_only_ever_covers_more() {
        let spans: Vec<(u128, u128)> = (0..(KEEP as u128 + 10))
            .map(|i| (i * 10, i * 10 + 1))
            .collect();
        let out = merged(spans.clone(), KEEP);
        assert!(out.len() <= KEEP);
        let w = Windows(
            out.into_iter()
                .map(|(start, end)| Window {
                    start,
                    end,
                    roots: vec!["/w".into()],
                })
                .collect(),
        );
        for (s, e) in spans {
            assert!(w.covers(at(s as u64)) && w.covers(at(e as u64)));
        }
    }
}
