//! When sandboxes ran, and where they could write. Anything in a writable
//! root may have been written by an earlier sandboxed run (SPEC §3.5): a
//! run can write a hook into a directory that is no repository yet, for a
//! later run to complete it with a `HEAD` or a rename, which leaves the
//! hook's own ctime as it was. So the post-run check asks of a file
//! whether its ctime falls in *any* sandbox's run, not only this one's:
//! each run's window (its start by the kernel's clock to the moment every
//! process of it was gone) and its writable roots are appended here, in
//! airlock's config directory, which no sandbox can write.
//!
//! A window speaks for its roots, and for every root of a later run that
//! overlaps them: a file keeps its ctime when a directory above it is
//! renamed, and a later sandbox whose root holds the first one's can carry
//! what the first wrote anywhere in its own (the sandbox's own `mv` from a
//! subdirectory's run into its parent's; red team round 22). What lies
//! outside all of those no sandbox of that window could have put there:
//! a repository the user makes or configures in another project while an
//! agent's session runs for hours is the user's, and is left alone (a
//! window that spoke for every path made any open session judge, and
//! strip, the user's own hooks and signing config; and made two sessions
//! quarantine each other's quarantine over and over). A record written
//! before roots were kept speaks for every path, as it did. What the user
//! renames out of a sandbox's roots themselves is theirs.
//!
//! The record is read only when an item older than this run needs judging
//! (most runs judge nothing, or only what they wrote themselves).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

/// Windows kept at most; past it, the closest ones are merged (a merged
/// window covers both, the gap and both runs' roots: more is judged, never
/// less). The record is rewritten merged when it holds twice as many
/// lines.
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

/// Where a run could write: its roots, or anywhere (a record from before
/// roots were kept, or one that could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Roots {
    Some(Vec<PathBuf>),
    Anywhere,
}

impl Roots {
    fn holds(&self, p: &Path) -> bool {
        match self {
            Roots::Anywhere => true,
            Roots::Some(rs) => rs.iter().any(|r| crate::paths::under(p, r)),
        }
    }

    /// One holds a root of the other: a sandbox of one could move what a
    /// sandbox of the other wrote.
    fn overlaps(&self, other: &Roots) -> bool {
        match (self, other) {
            (Roots::Anywhere, _) | (_, Roots::Anywhere) => true,
            (Roots::Some(a), Roots::Some(b)) => a.iter().any(|x| {
                b.iter()
                    .any(|y| crate::paths::under(x, y) || crate::paths::under(y, x))
            }),
        }
    }

    fn add(&mut self, other: &Roots) {
        match (&mut *self, other) {
            (Roots::Anywhere, _) => {}
            (_, Roots::Anywhere) => *self = Roots::Anywhere,
            (Roots::Some(a), Roots::Some(b)) => {
                for r in b {
                    if !a.contains(r) {
                        a.push(r.clone());
                    }
                }
            }
        }
    }
}

/// One run: `[start, end]` in nanoseconds of ctime since the epoch, and
/// its roots.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    start: u128,
    end: u128,
    roots: Roots,
}

/// The runs of sandboxes: the one being checked, from `since` on, and the
/// recorded ones, read when first needed.
#[derive(Debug)]
pub struct Windows {
    /// The run being checked.
    current: Span,
    /// The run being checked, whose own open journal does not count.
    run: String,
    recorded: OnceLock<Vec<Span>>,
    /// Each recorded window's reach (by its index; the current one's at
    /// the end), worked out once: it depends on no path, and working it
    /// out again for every item judged made a check in a repository that
    /// earlier runs wrote cost tens of milliseconds with a full record.
    reaches: std::sync::Mutex<std::collections::HashMap<usize, Roots>>,
}

impl Windows {
    /// `[since, ∞)` over `roots` for the run being checked, and the
    /// recorded windows.
    pub fn with_current(since: SystemTime, run: &str, roots: &[PathBuf]) -> Windows {
        Windows {
            current: Span {
                start: nanos(since),
                end: u128::MAX,
                roots: Roots::Some(roots.to_vec()),
            },
            run: run.to_string(),
            recorded: OnceLock::new(),
            reaches: Default::default(),
        }
    }

    /// Whether the file at `path`, changed at `ctime`, may have been
    /// written by a sandbox: some run was going on then, and it, or a
    /// later run that could move its files, could write where it lies.
    pub fn covers(&self, path: &Path, ctime: SystemTime) -> bool {
        let t = nanos(ctime);
        if t >= self.current.start && self.current.roots.holds(path) {
            return true;
        }
        let spans = self
            .recorded
            .get_or_init(|| read(&self.run).unwrap_or_default());
        let all = || spans.iter().chain(std::iter::once(&self.current));
        all()
            .enumerate()
            .filter(|(_, w)| w.start <= t && t <= w.end)
            .any(|(i, w)| {
                let mut cache = self
                    .reaches
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                cache
                    .entry(i)
                    .or_insert_with(|| reach(w, all()))
                    .holds(path)
            })
    }
}

/// Where what run `w` wrote can lie now: its roots, and those of each run
/// that went on during or after it and could reach into them, until
/// nothing more is added.
fn reach<'a>(w: &Span, all: impl Iterator<Item = &'a Span> + Clone) -> Roots {
    let mut out = w.roots.clone();
    loop {
        let mut grew = false;
        for later in all.clone().filter(|l| l.end >= w.start) {
            if out != Roots::Anywhere && later.roots.overlaps(&out) {
                let before = out.clone();
                out.add(&later.roots);
                grew |= out != before;
            }
        }
        if !grew {
            return out;
        }
    }
}

/// `start end [roots as JSON]` a line; a line without roots (written
/// before they were kept) speaks for every path; malformed lines are
/// skipped.
fn parse(text: &str) -> Vec<Span> {
    parse_keeping(text, KEEP)
}

/// [`parse`], with at most `keep` windows.
fn parse_keeping(text: &str, keep: usize) -> Vec<Span> {
    let spans = text
        .lines()
        .filter_map(|l| {
            let mut words = l.splitn(3, ' ');
            let start: u128 = words.next()?.parse().ok()?;
            let end: u128 = words.next()?.parse().ok()?;
            let roots = match words.next() {
                Some(j) => match serde_json::from_str::<Vec<PathBuf>>(j) {
                    Ok(r) => Roots::Some(r),
                    Err(_) => Roots::Anywhere,
                },
                None => Roots::Anywhere,
            };
            (start <= end).then_some(Span { start, end, roots })
        })
        .collect();
    merged(spans, keep)
}

/// Spans sorted, those of one run (equal starts and roots) and overlaps
/// of equal roots merged, then the smallest gaps closed until at most
/// `keep` remain (merging roots too).
fn merged(mut spans: Vec<Span>, keep: usize) -> Vec<Span> {
    spans.sort_by_key(|s| (s.start, s.end));
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if s.start <= last.end && s.roots == last.roots => {
                last.end = last.end.max(s.end)
            }
            _ => out.push(s),
        }
    }
    while out.len() > keep {
        // Close the smallest gap between neighbours (negative: overlap).
        let Some(i) =
            (0..out.len() - 1).min_by_key(|&i| out[i + 1].start.saturating_sub(out[i].end))
        else {
            break;
        };
        let next = out.remove(i + 1);
        let w = &mut out[i];
        w.end = w.end.max(next.end);
        w.roots.add(&next.roots);
    }
    out
}

fn line(s: &Span) -> String {
    match &s.roots {
        Roots::Some(r) => format!(
            "{} {} {}\n",
            s.start,
            s.end,
            serde_json::to_string(r).unwrap_or_else(|_| "null".into())
        ),
        Roots::Anywhere => format!("{} {}\n", s.start, s.end),
    }
}

/// The record alone (closed windows).
fn read_record() -> Option<Vec<Span>> {
    let bytes = crate::paths::read_no_follow(&path()?).ok()?;
    Some(parse(&String::from_utf8_lossy(&bytes)))
}

/// The recorded windows, and those of runs whose journal is still there
/// (going on beside this one, or whose airlock died): open until now.
/// As recorded, not merged down to [`KEEP`]: closing the gaps between up
/// to twice that many windows, on every read, was most of a check's time
/// with a full record (the record is merged when it is rewritten; exact
/// windows cover less, never a moment a sandbox ran).
fn read(own: &str) -> Option<Vec<Span>> {
    let mut spans = crate::paths::read_no_follow(&path()?)
        .ok()
        .map(|b| parse_keeping(&String::from_utf8_lossy(&b), usize::MAX))
        .unwrap_or_default();
    spans.extend(
        super::journal::open_since(own)
            .into_iter()
            .map(|(t, roots)| Span {
                start: nanos(t),
                end: u128::MAX,
                roots: Roots::Some(roots),
            }),
    );
    Some(merged(spans, usize::MAX))
}

/// Record a finished run's window over its roots. Appended with one write
/// (concurrent runs each add a whole line); rewritten merged when it has
/// grown long.
pub fn record(since: SystemTime, until: SystemTime, roots: &[PathBuf]) {
    let Some(p) = path() else { return };
    let span = Span {
        start: nanos(since),
        end: nanos(until).max(nanos(since)),
        roots: Roots::Some(roots.to_vec()),
    };
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&p)
        .and_then(|mut f| {
            f.write_all(line(&span).as_bytes())?;
            f.metadata()
        });
    match appended {
        Ok(meta) if meta.len() > 2 * (KEEP as u64) * 120 => compact(&p),
        Ok(_) => {}
        Err(e) => tracing::warn!("recording the run's window in {}: {e}", p.display()),
    }
}

/// Rewrite the record merged, through a file renamed over it.
fn compact(p: &Path) {
    let Some(spans) = read_record() else { return };
    let text: String = spans.iter().map(line).collect();
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

    fn windows(current: Span, spans: Vec<Span>) -> Windows {
        Windows {
            current,
            run: String::new(),
            recorded: OnceLock::from(spans),
            reaches: Default::default(),
        }
    }

    fn span(start: u128, end: u128, roots: &[&str]) -> Span {
        Span {
            start,
            end,
            roots: Roots::Some(roots.iter().map(PathBuf::from).collect()),
        }
    }

    #[test]
    fn windows_cover_their_runs_and_nothing_between() {
        let spans = parse("100 200\n150 250 [\"/w\"]\n300 400\nnonsense\n500 499\n");
        assert_eq!(spans.len(), 3);
        let w = windows(span(1000, u128::MAX, &["/w"]), spans);
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
            assert_eq!(w.covers(Path::new("/w/x"), at(t)), want, "{t}");
        }
        // Old lines speak for every path (and so make every later
        // window's reach everywhere); a line with roots for its own.
        assert!(w.covers(Path::new("/elsewhere"), at(120)));
        assert!(!w.covers(Path::new("/elsewhere"), at(5000)));
        let w = windows(span(1000, u128::MAX, &["/w"]), parse("150 250 [\"/w\"]\n"));
        assert!(w.covers(Path::new("/w/x"), at(220)));
        assert!(!w.covers(Path::new("/elsewhere"), at(220)));
    }

    #[test]
    fn a_window_reaches_where_a_later_run_could_carry_its_files() {
        // Run 1 wrote in /w/sub; run 2, in /w, could move it anywhere in
        // /w; run 3 in /other never touched either; a run before run 1 in
        // /w could not carry what run 1 wrote later.
        let spans = vec![
            span(10, 20, &["/w"]),
            span(100, 200, &["/w/sub"]),
            span(300, 400, &["/w"]),
            span(500, 600, &["/other"]),
        ];
        let w = windows(span(10_000, u128::MAX, &["/third"]), spans);
        assert!(w.covers(Path::new("/w/sub/r/.git/hooks/x"), at(150)));
        assert!(w.covers(Path::new("/w/r/.git/hooks/x"), at(150)));
        assert!(!w.covers(Path::new("/other/r/.git/hooks/x"), at(150)));
        assert!(!w.covers(Path::new("/third/r"), at(150)));
        // The user's repository in /other, made while run 3's neighbour in
        // /w ran: not a sandbox's.
        assert!(!w.covers(Path::new("/other/r"), at(350)));
        assert!(w.covers(Path::new("/other/r"), at(550)));
    }

    #[test]
    fn merging_only_ever_covers_more() {
        let spans: Vec<Span> = (0..(KEEP as u128 + 10))
            .map(|i| span(i * 10, i * 10 + 1, &[if i % 2 == 0 { "/a" } else { "/b" }]))
            .collect();
        let out = merged(spans.clone(), KEEP);
        assert!(out.len() <= KEEP);
        let w = windows(span(u128::MAX, u128::MAX, &[]), out);
        for s in spans {
            let Roots::Some(r) = &s.roots else { panic!() };
            let p = r[0].join("x");
            assert!(w.covers(&p, at(s.start as u64)) && w.covers(&p, at(s.end as u64)));
        }
    }

    #[test]
    fn a_line_round_trips() {
        let s = span(5, 9, &["/w a", "/x\ny"]);
        assert_eq!(parse(&line(&s)), vec![s]);
    }
}
