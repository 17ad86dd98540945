//! Paths: how policy paths resolve (`~`, relative, `..`), reading a file
//! without following a link, and prefix tests on absolute paths, by bytes. `Path::starts_with` and `==`
//! parse both sides into components on every call; the start-up compares
//! every entry of a split HOME with every `deny_read` path (landlock.rs),
//! and every protected path with every root (integrity/set.rs): tens of
//! thousands of parses, a good part of a millisecond of the helper's and
//! the supervisor's time. A path that is already in normal form (what
//! `canonicalize` returns, and a listed entry joined to it) compares the
//! same way as bytes; anything else falls back to the component test, so
//! the answer is always `Path::starts_with`'s.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// Absolute, and written as its components would print it: no empty,
/// `.` or `..` component, no trailing `/` (but `/` itself).
pub fn is_normal(p: &Path) -> bool {
    let b = p.as_os_str().as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    if b.len() == 1 {
        return true;
    }
    b[1..]
        .split(|c| *c == b'/')
        .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// `p.starts_with(base)`: `base` is `p` or one of its ancestors.
pub fn under(p: &Path, base: &Path) -> bool {
    if is_normal(p) && is_normal(base) {
        under_normal(p.as_os_str().as_bytes(), base.as_os_str().as_bytes())
    } else {
        p.starts_with(base)
    }
}

/// `base` is a strict ancestor of `p`.
pub fn below(p: &Path, base: &Path) -> bool {
    if is_normal(p) && is_normal(base) {
        let (p, base) = (p.as_os_str().as_bytes(), base.as_os_str().as_bytes());
        p.len() > base.len() && under_normal(p, base)
    } else {
        p.starts_with(base) && p != base
    }
}

fn under_normal(p: &[u8], base: &[u8]) -> bool {
    base == b"/" || (p.starts_with(base) && (p.len() == base.len() || p[base.len()] == b'/'))
}

/// The ancestors of a normal path, nearest first, `/` last (not the path).
fn ancestors_normal(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut end = p.len();
    std::iter::from_fn(move || {
        if end <= 1 {
            return None;
        }
        end = p[..end].iter().rposition(|c| *c == b'/')?;
        Some(if end == 0 { &p[..1] } else { &p[..end] })
    })
}

/// A set of paths asked about the paths below and above them, in time
/// proportional to a path's depth rather than to the set's size.
pub struct Prefixes<'a> {
    /// Normal members.
    members: HashSet<&'a [u8]>,
    /// Strict ancestors of normal members, each with the names of its
    /// children on the way to them.
    above: HashMap<&'a [u8], HashSet<&'a [u8]>>,
    /// Members not in normal form: compared by components.
    other: Vec<&'a Path>,
}

impl<'a> Prefixes<'a> {
    pub fn new(paths: &'a [PathBuf]) -> Self {
        let mut set = Prefixes {
            members: HashSet::new(),
            above: HashMap::new(),
            other: vec![],
        };
        for p in paths {
            if !is_normal(p) {
                set.other.push(p);
                continue;
            }
            let b = p.as_os_str().as_bytes();
            set.members.insert(b);
            let mut child = b;
            for a in ancestors_normal(b) {
                // `child` is `a`'s direct child: its last component.
                let name = &child[a.len() + usize::from(a != b"/")..];
                set.above.entry(a).or_default().insert(name);
                child = a;
            }
        }
        set
    }

    /// Some member is `p` or an ancestor of it.
    pub fn covers(&self, p: &Path) -> bool {
        if self.other.iter().any(|o| p.starts_with(o)) {
            return true;
        }
        if !is_normal(p) {
            return self
                .members
                .iter()
                .any(|m| p.starts_with(OsStr::from_bytes(m)));
        }
        let b = p.as_os_str().as_bytes();
        self.members.contains(b) || ancestors_normal(b).any(|a| self.members.contains(a))
    }

    /// Some member lies strictly below `p`.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // the Landlock split
    pub fn holds(&self, p: &Path) -> bool {
        if self.other.iter().any(|o| o.starts_with(p) && *o != p) {
            return true;
        }
        if !is_normal(p) {
            return self.members.iter().any(|m| {
                let m = Path::new(OsStr::from_bytes(m));
                m.starts_with(p) && m != p
            });
        }
        self.above.contains_key(p.as_os_str().as_bytes())
    }

    /// Whether `name`, an entry of the directory `dir`, is on the way to
    /// a member (or is one).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))] // the Landlock split
    pub fn leads(&self, dir: &Path, name: &OsStr) -> bool {
        // Never a directory entry's name: not on the way to anything.
        if name.is_empty() || name == "." || name == ".." || name.as_bytes().contains(&b'/') {
            return false;
        }
        let slow = || {
            let entry = dir.join(name);
            self.other
                .iter()
                .copied()
                .chain(self.members.iter().map(|m| Path::new(OsStr::from_bytes(m))))
                .any(|m| m.starts_with(&entry))
        };
        if !self.other.is_empty() || !is_normal(dir) {
            return slow();
        }
        self.above
            .get(dir.as_os_str().as_bytes())
            .is_some_and(|names| names.contains(name.as_bytes()))
    }
}

/// Make `dir` (0700, parents as needed) and check that it is a directory
/// of ours that nobody else can reach, not a link: airlock's state
/// (sessions, changesets) lives there, and a link or a shared directory
/// could send it elsewhere.
pub fn own_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        anyhow::bail!(
            "{} must be a directory of yours that nobody else can reach (mode 0700)",
            dir.display()
        );
    }
    Ok(())
}

/// `~` is the home directory; relative paths are relative to the workspace;
/// `..` and `.` are folded lexically, and a trailing `/**` means the directory.
pub fn resolve_path(raw: &str, home: &Path, workspace: &Path) -> Option<PathBuf> {
    let raw = raw.strip_suffix("/**").unwrap_or(raw);
    if raw.contains('*') {
        return None;
    }
    let joined = if raw == "~" {
        home.to_path_buf()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        home.join(rest)
    } else if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        workspace.join(raw)
    };
    Some(lexical(&joined))
}

/// `p` made absolute from `/` with `.` and `..` folded by name.
pub fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// An absolute `p` resolved as far as it exists: its longest existing
/// prefix made canonical (links and `..` as the kernel takes them), the
/// rest appended and folded lexically (a `..` after a name that does not
/// exist fails in the kernel; folded, it names one more path, never one
/// less). `<top>/.git/../team.gitconfig` not made yet is
/// `<top>/team.gitconfig`, the name a sandbox would create.
pub fn as_far_as_exists(p: &Path) -> PathBuf {
    let comps: Vec<Component> = p.components().collect();
    for k in (1..=comps.len()).rev() {
        let head: PathBuf = comps[..k].iter().collect();
        if let Ok(real) = std::fs::canonicalize(&head) {
            let rest: PathBuf = comps[k..].iter().collect();
            return match rest.as_os_str().is_empty() {
                true => real,
                false => lexical(&real.join(rest)),
            };
        }
    }
    lexical(p)
}

/// A glob made absolute the way `resolve_path` makes paths absolute.
pub(crate) fn absolute_glob(raw: &str, home: &Path, workspace: &Path) -> String {
    if let Some(rest) = raw.strip_prefix("~/") {
        format!("{}/{rest}", home.display())
    } else if raw.starts_with('/') {
        raw.to_string()
    } else {
        format!("{}/{raw}", workspace.display())
    }
}

/// Read a file without following a link at its last component.
pub fn read_no_follow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut buf = vec![];
    std::io::Read::read_to_end(&mut f, &mut buf)?;
    Ok(buf)
}

/// The soft limit on open files raised to the hard one while this lives,
/// then put back: a search that keeps a descriptor per directory on its
/// path must not fail where the user's shell limit (often 1024) is low,
/// and what airlock starts later keeps the limit the user gave it.
pub struct OpenFilesRaised(Option<libc::rlimit>);

pub fn raise_open_files_limit() -> OpenFilesRaised {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return OpenFilesRaised(None);
        }
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            return OpenFilesRaised(None);
        }
    }
    OpenFilesRaised(Some(lim))
}

impl Drop for OpenFilesRaised {
    fn drop(&mut self) {
        if let Some(lim) = self.0 {
            // SAFETY: setrlimit with the values getrlimit gave.
            unsafe {
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}

/// Why a descriptor may not be one of the command's stdin, stdout or
/// stderr: a directory's descriptor looks names up in the host's mounts,
/// past every cover the sandbox's own mounts put over hidden files (a
/// `.env` read through `openat(0, ".env")`), so none is passed in.
pub fn refused_stdio(fd: std::os::fd::BorrowedFd<'_>) -> Option<&'static str> {
    match nix::sys::stat::fstat(fd) {
        Ok(st) if (st.st_mode & libc::S_IFMT) == libc::S_IFDIR => Some(
            "a directory: its descriptor would look names up past the sandbox's covers of hidden files",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn as_far_as_exists_folds_what_is_not_there_yet() {
        let dir = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(top.join(".git")).unwrap();
        std::os::unix::fs::symlink(top.join(".git"), top.join("g")).unwrap();
        for (asked, want) in [
            (".git/../.gitconfig", ".gitconfig"),
            (".git/../tools/gitconfig.d/main", "tools/gitconfig.d/main"),
            ("g/../x", "x"),
            ("g/hooks", ".git/hooks"),
            ("absent/../y", "y"),
            (".git", ".git"),
        ] {
            assert_eq!(
                as_far_as_exists(&top.join(asked)),
                top.join(want),
                "{asked}"
            );
        }
    }

    #[test]
    fn normal_form() {
        for p in ["/", "/a", "/a/b", "/a/.b", "/a/b..", "/.../x"] {
            assert!(is_normal(Path::new(p)), "{p}");
        }
        for p in [
            "", "a", "a/b", "//", "/a/", "/a//b", "/a/./b", "/a/..", "/.", "/a/.",
        ] {
            assert!(!is_normal(Path::new(p)), "{p}");
        }
    }

    #[test]
    fn ancestors_nearest_first() {
        let got: Vec<&[u8]> = ancestors_normal(b"/a/bc/d").collect();
        assert_eq!(got, vec![&b"/a/bc"[..], b"/a", b"/"]);
        assert_eq!(ancestors_normal(b"/").count(), 0);
    }

    #[test]
    fn prefixes_answer_as_components_do() {
        let members: Vec<PathBuf> = ["/h/.ssh", "/h/.config/gh", "/h//odd/./x", "/e"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let set = Prefixes::new(&members);
        assert!(set.covers(Path::new("/h/.ssh")));
        assert!(set.covers(Path::new("/h/.ssh/id")));
        assert!(!set.covers(Path::new("/h/.sshx")));
        assert!(set.covers(Path::new("/h/odd/x/y")));
        assert!(set.holds(Path::new("/h")));
        assert!(set.holds(Path::new("/")));
        assert!(!set.holds(Path::new("/h/.ssh")));
        assert!(set.holds(Path::new("/h/odd")));
        assert!(set.leads(Path::new("/h/.config"), OsStr::new("gh")));
        assert!(!set.leads(Path::new("/h/.config"), OsStr::new("g")));
    }

    /// Paths over a small alphabet, so that prefixes and near misses are
    /// common; some in normal form, some not.
    fn path() -> impl Strategy<Value = PathBuf> {
        prop::collection::vec(
            prop::sample::select(vec!["a", "ab", "b", ".", "..", ""]),
            0..5,
        )
        .prop_map(|parts| PathBuf::from(format!("/{}", parts.join("/"))))
    }

    proptest! {
        #[test]
        fn under_is_starts_with(p in path(), base in path()) {
            prop_assert_eq!(under(&p, &base), p.starts_with(&base));
            prop_assert_eq!(below(&p, &base), p.starts_with(&base) && p != base);
        }

        #[test]
        fn prefixes_are_starts_with(members in prop::collection::vec(path(), 0..6), p in path(), name in prop::sample::select(vec!["a", "ab", "b"])) {
            let set = Prefixes::new(&members);
            prop_assert_eq!(set.covers(&p), members.iter().any(|m| p.starts_with(m)));
            prop_assert_eq!(set.holds(&p), members.iter().any(|m| m.starts_with(&p) && m != &p));
            let entry = p.join(name);
            prop_assert_eq!(
                set.leads(&p, OsStr::new(name)),
                members.iter().any(|m| m.starts_with(&entry))
            );
        }
    }

    /// Hostile paths: non-UTF-8 names, names that are only dots or end in
    /// one, empty and `.` / `..` components, trailing `/` or `/.`, `//`,
    /// relative paths. Built from bytes.
    fn hostile() -> impl Strategy<Value = PathBuf> {
        let seg = prop::sample::select(vec![
            &b"a"[..],
            b"ab",
            b"a.",
            b".a",
            b"...",
            b".",
            b"..",
            b"",
            b"\xff",
            b"\xffa",
            b"a\xff",
        ]);
        (
            prop::sample::select(vec![
                &b"/"[..],
                b"/",
                b"/",
                b"//",
                b"",
                b"./",
                b"/./",
                b"/../",
            ]),
            prop::collection::vec(seg, 0..5),
            prop::sample::select(vec![&b""[..], b"", b"/", b"/.", b"//", b"/./"]),
        )
            .prop_map(|(lead, segs, tail)| {
                let mut b = lead.to_vec();
                b.extend(segs.join(&b'/'));
                b.extend_from_slice(tail);
                PathBuf::from(OsStr::from_bytes(&b))
            })
    }

    /// A name `read_dir` can return: not empty, no `/`, not `.` or `..`.
    fn entry_name() -> impl Strategy<Value = &'static [u8]> {
        prop::sample::select(vec![
            &b"a"[..],
            b"ab",
            b"a.",
            b".a",
            b"...",
            b"\xff",
            b"\xffa",
            b"a\xff",
        ])
    }

    /// Normal paths over hostile names (the byte paths' domain).
    fn normal_path() -> impl Strategy<Value = PathBuf> {
        prop::collection::vec(entry_name(), 0..4).prop_map(|segs| {
            let mut b = b"/".to_vec();
            b.extend(segs.join(&b'/'));
            PathBuf::from(OsStr::from_bytes(&b))
        })
    }

    /// The `leading` set that `Carving::real` built before `leads`.
    /// `Prefixes` against the expressions it replaced.
    fn check_prefixes(members: &[PathBuf], p: &Path, name: &OsStr) -> Result<(), TestCaseError> {
        let set = Prefixes::new(members);
        prop_assert_eq!(set.covers(p), members.iter().any(|m| p.starts_with(m)));
        prop_assert_eq!(
            set.holds(p),
            members.iter().any(|m| m.starts_with(p) && m != p)
        );
        prop_assert_eq!(set.leads(p, name), old_leading(members, p, name));
        Ok(())
    }

    fn old_leading(denied: &[PathBuf], real: &Path, name: &OsStr) -> bool {
        let leading: HashSet<&OsStr> = denied
            .iter()
            .filter_map(|d| d.strip_prefix(real).ok()?.components().next())
            .map(|c| c.as_os_str())
            .collect();
        leading.contains(name)
    }

    fn hash_of(p: &Path) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault};
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(p)
    }

    #[test]
    fn hostile_examples() {
        let m: Vec<PathBuf> = ["/h/.ssh", "/h/a."].iter().map(PathBuf::from).collect();
        let set = Prefixes::new(&m);
        // Lexical, as std is: `/h/.ssh/..` is "under" `/h/.ssh`.
        for p in [
            "/h/.ssh/.",
            "/h/./.ssh",
            "/h//.ssh/",
            "/h/.ssh/x/",
            "/h/.ssh/..",
        ] {
            assert!(set.covers(Path::new(p)), "{p}");
            assert!(under(Path::new(p), Path::new("/h/.ssh")), "{p}");
        }
        for p in ["/h/.ssh.", "/h/.ss", "/h/a", "/h/a..", "h/.ssh"] {
            assert!(!set.covers(Path::new(p)), "{p}");
        }
        assert!(set.holds(Path::new("/h/.")));
        assert!(set.holds(Path::new("//h/")));
        assert!(!set.holds(Path::new("/h/.ssh/.")));
        assert!(set.leads(Path::new("/h"), OsStr::new("a.")));
        assert!(!set.leads(Path::new("/h"), OsStr::new("a")));
        let raw: Vec<PathBuf> = vec![PathBuf::from(OsStr::from_bytes(b"/h/\xff/k"))];
        let set = Prefixes::new(&raw);
        assert!(set.leads(Path::new("/h"), OsStr::from_bytes(b"\xff")));
        assert!(!set.leads(Path::new("/h"), OsStr::from_bytes(b"\xfe")));
        assert!(set.covers(Path::new(OsStr::from_bytes(b"/h/\xff/k/\x80"))));
    }

    proptest! {
        #[test]
        fn hostile_under_is_starts_with(p in hostile(), base in hostile()) {
            prop_assert_eq!(under(&p, &base), p.starts_with(&base));
            prop_assert_eq!(below(&p, &base), p.starts_with(&base) && p != base);
            // The HashSets of `split` and of the deny_read watch's dedupe
            // stand for `Vec::contains`: equal paths must hash alike.
            if p == base {
                prop_assert_eq!(hash_of(&p), hash_of(&base));
            }
        }

        #[test]
        fn hostile_prefixes(
            members in prop::collection::vec(hostile(), 0..6),
            p in hostile(),
            name in entry_name(),
        ) {
            let name = OsStr::from_bytes(name);
            check_prefixes(&members, &p, name)?;
            prop_assert_eq!(
                Prefixes::new(&members).leads(&p, name),
                members.iter().any(|m| m.starts_with(p.join(name)))
            );
        }

        /// Mostly normal members, so that the byte paths are the ones taken.
        #[test]
        fn normal_prefixes(
            members in prop::collection::vec(normal_path(), 0..6),
            p in prop_oneof![normal_path(), hostile()],
            name in entry_name(),
        ) {
            check_prefixes(&members, &p, OsStr::from_bytes(name))?;
        }

        /// `DenyWatch::new`'s dedupe: a HashSet keeps what `any(==)` kept.
        #[test]
        fn dedupe_by_hash_is_dedupe_by_eq(ps in prop::collection::vec(hostile(), 0..8)) {
            let mut old: Vec<PathBuf> = vec![];
            let mut new: Vec<PathBuf> = vec![];
            let mut seen = HashSet::new();
            for p in &ps {
                if !old.iter().any(|q| q == p) {
                    old.push(p.clone());
                }
                if seen.insert(p.clone()) {
                    new.push(p.clone());
                }
            }
            prop_assert_eq!(old, new);
        }
    }
}
