//! Acting on what the post-run check found: the changed thing is moved to
//! `<root>/.airlock/quarantine/<run-id>/<path>` and what was there before is
//! put back where it was recorded. A git configuration the sandbox created
//! (a `git init` inside) is replaced by a copy holding only keys that name
//! no program. Every step goes through directory handles opened without
//! following links; the sandbox is gone when this runs.

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::symlinkat;

use super::snapshot::{open_dir, open_root, walk_to_parent, Change, ChangeKind, Parent, State};

/// What was done about one change.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub path: String,
    pub change: &'static str,
    /// quarantined | restored | sanitised | reported
    pub action: String,
    /// Where the changed thing now lies, when it was moved.
    pub dest: Option<String>,
    /// Made or changed by the sandbox and still in place (it could not be
    /// moved aside): the run must not pass for clean.
    #[serde(skip)]
    pub in_place: bool,
}

/// Git configuration keys that name no program and no other file to read.
const SAFE_GIT_KEYS: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.quotepath",
    "extensions.objectformat",
    "extensions.refstorage",
    "extensions.worktreeconfig",
    // A partial clone cannot read its history without these.
    "extensions.partialclone",
    "init.defaultbranch",
    "index.version",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "fetch.prune",
    "lfs.repositoryformatversion",
    "user.name",
    "user.email",
];

fn safe_git_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    if SAFE_GIT_KEYS.contains(&k.as_str()) {
        return true;
    }
    // remote.<name>.url|fetch and branch.<name>.remote|merge.
    let (Some((section, rest)), Some((_, last))) = (k.split_once('.'), k.rsplit_once('.')) else {
        return false;
    };
    rest.contains('.')
        && matches!(
            (section, last),
            (
                "remote",
                "url"
                    | "fetch"
                    | "pushurl"
                    | "promisor"
                    | "partialclonefilter"
                    | "tagopt"
                    | "prune"
                    | "mirror"
            ) | ("branch", "remote" | "merge" | "rebase")
                | ("submodule", "url" | "active" | "branch")
        )
}

/// The keys and values of the git config file at `path`, as git itself
/// reads them (no includes); None when git cannot read it.
fn git_config_entries(path: &Path) -> Option<Vec<(String, String)>> {
    let listed = git_config_of(path, &["--list"]).output();
    let o = listed.ok().filter(|o| o.status.success())?;
    Some(
        o.stdout
            .split(|b| *b == 0)
            .map(|item| {
                let item = String::from_utf8_lossy(item);
                let (key, value) = item.split_once('\n').unwrap_or((&item, "true"));
                (key.to_string(), value.to_string())
            })
            .filter(|(k, _)| !k.is_empty())
            .collect(),
    )
}

/// `git config --no-includes --null --file <path> <args>`, reading that
/// file alone: no other scope, no include, nothing of the environment.
pub fn git_config_of(path: &Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("git");
    c.args(["config", "--no-includes", "--null", "--file"])
        .arg(path)
        .args(args)
        .current_dir("/")
        .env_clear()
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    c
}

/// Whether `core.worktree = value` in git directory `git_dir` names the
/// work tree of a submodule checked out from it: a directory whose `.git`
/// file points back here. Any other work tree is where git would write
/// what the sandbox committed (its own `.git/hooks`, another repository's),
/// so the key is dropped then (red team round 21).
fn worktree_points_back(git_dir: &Path, value: &str) -> bool {
    let (Ok(here), Ok(tree)) = (
        std::fs::canonicalize(git_dir),
        std::fs::canonicalize(git_dir.join(value)),
    ) else {
        return false;
    };
    let dot_git = tree.join(".git");
    let Ok(text) = crate::paths::read_no_follow(&dot_git) else {
        return false;
    };
    let text = String::from_utf8_lossy(&text);
    let Some(target) = text.trim_end_matches(['\n', '\r']).strip_prefix("gitdir: ") else {
        return false;
    };
    std::fs::canonicalize(tree.join(target)).is_ok_and(|t| t == here)
}

/// A git config text holding only the safe keys of `quarantined`, read by
/// git itself (no includes) when it is installed in `git_dir`.
fn sanitised_git_config(quarantined: &Path, git_dir: &Path) -> String {
    let mut out = String::new();
    let mut sections: Vec<(String, Vec<(String, String)>)> = vec![];
    if let Some(entries) = git_config_entries(quarantined) {
        for (key, value) in &entries {
            let (key, value) = (key.as_str(), value.as_str());
            let kept = safe_git_key(key)
                || (key == "core.worktree" && worktree_points_back(git_dir, value));
            if !kept {
                continue;
            }
            let (Some((section, _)), Some((head, name))) =
                (key.split_once('.'), key.rsplit_once('.'))
            else {
                continue;
            };
            let header = match head.strip_prefix(section).and_then(|s| s.strip_prefix('.')) {
                Some(sub) => format!("[{section} \"{}\"]", quote(sub)),
                None => format!("[{section}]"),
            };
            let line = (name.to_string(), value.to_string());
            match sections.iter_mut().find(|(h, _)| *h == header) {
                Some((_, lines)) => lines.push(line),
                None => sections.push((header, vec![line])),
            }
        }
    }
    if !sections.iter().any(|(h, _)| h == "[core]") {
        sections.insert(
            0,
            (
                "[core]".into(),
                vec![("repositoryformatversion".into(), "0".into())],
            ),
        );
    }
    out.push_str("# Rewritten by airlock: the sandbox created this repository; its own\n");
    out.push_str(
        "# configuration is in .airlock/quarantine. Only keys that run nothing are kept.\n",
    );
    for (header, lines) in sections {
        out.push_str(&header);
        out.push('\n');
        for (k, v) in lines {
            out.push_str(&format!("\t{k} = \"{}\"\n", quote(&v)));
        }
    }
    out
}

fn quote(v: &str) -> String {
    v.chars()
        .flat_map(|c| match c {
            '\\' => vec!['\\', '\\'],
            '"' => vec!['\\', '"'],
            '\n' => vec!['\\', 'n'],
            '\t' => vec!['\\', 't'],
            c if c.is_control() => vec![],
            c => vec![c],
        })
        .collect()
}

/// `<root>/.airlock/quarantine/<run>`, created without following links. A
/// `.airlock` the sandbox made is itself a change and was moved away first.
fn quarantine_dir(root: &OwnedFd, run: &str) -> nix::Result<OwnedFd> {
    let mut fd = nix::unistd::dup(root)?;
    for name in [".airlock", "quarantine", run] {
        let fresh = match mkdirat(&fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(e),
        };
        fd = open_dir(&fd, Path::new(name))?;
        if fresh && name == ".airlock" {
            // Keep quarantined files out of the user's `git status`.
            if let Ok(f) = openat(
                &fd,
                ".gitignore",
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            ) {
                let _ = std::fs::File::from(f).write_all(b"*\n");
            }
        }
    }
    Ok(fd)
}

/// Rename, below `dir` (links not followed), every `.git` to `dot-git`
/// and every `HEAD` to `dot-HEAD`: what git takes for a git directory is
/// one of those, so nothing kept in the quarantine is one.
fn neutralise(dir: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let stem = match e.file_name().to_str() {
            Some(".git") => Some("dot-git"),
            Some("HEAD") => Some("dot-HEAD"),
            _ => None,
        };
        // Under a name the sandbox cannot have taken (a random suffix: it
        // may have made `dot-git` and every name after it), and never onto
        // what is there. What cannot be renamed is removed from the copy:
        // a live repository never stays in the quarantine.
        let path = match stem {
            Some(stem) => {
                let mut b = [0u8; 8];
                let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
                let suffix: String = b.iter().map(|x| format!("{x:02x}")).collect();
                let to = dir.join(format!("{stem}-{suffix}"));
                let renamed =
                    std::fs::symlink_metadata(&to).is_err() && std::fs::rename(&path, &to).is_ok();
                if renamed {
                    to
                } else {
                    tracing::warn!(
                        "{}: could not be renamed in the quarantine; removed from it",
                        path.display()
                    );
                    let _ = if is_dir {
                        std::fs::remove_dir_all(&path)
                    } else {
                        std::fs::remove_file(&path)
                    };
                    continue;
                }
            }
            None => path,
        };
        if is_dir {
            neutralise(&path);
        }
    }
}

/// Where `rel` is kept in the quarantine: its path with every `.git`
/// component renamed, so that nothing git discovers (a repository's
/// configuration and hooks, reassembled) ever lies there.
fn stored(rel: &Path) -> PathBuf {
    rel.components()
        .map(|c| match c.as_os_str() {
            n if n == ".git" => OsStr::new("dot-git"),
            n => n,
        })
        .collect()
}

/// Create `rel`'s parent directories below `base` (ours, fresh) and return it.
fn make_parents(base: &OwnedFd, rel: &Path) -> nix::Result<OwnedFd> {
    let mut fd = nix::unistd::dup(base)?;
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            let name = c.as_os_str();
            match mkdirat(&fd, name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            fd = open_dir(&fd, Path::new(name))?;
        }
    }
    Ok(fd)
}

/// Put a recorded state back at `name` in `dir` (which holds nothing there).
fn restore<Fd: AsFd + Copy>(dir: Fd, name: &OsStr, state: &State) -> bool {
    match state {
        State::File {
            mode,
            content: Some(bytes),
            ..
        } => openat(
            dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(libc::mode_t::try_from(*mode & 0o777).unwrap_or(0o600)),
        )
        .ok()
        .map(std::fs::File::from)
        .is_some_and(|mut f| f.write_all(bytes).is_ok()),
        State::Link { target, .. } => symlinkat(target.as_os_str(), dir, name).is_ok(),
        State::Dir {
            mode,
            entries,
            truncated: false,
            ..
        } => {
            if mkdirat(
                dir,
                name,
                Mode::from_bits_truncate(libc::mode_t::try_from(*mode & 0o777).unwrap_or(0o600)),
            )
            .is_err()
            {
                return false;
            }
            let Ok(sub) = open_dir(dir, Path::new(name)) else {
                return false;
            };
            entries.iter().all(|(n, s)| restore(&sub, n, s))
        }
        _ => false,
    }
}

/// Directories searched at most for a moved one.
const BRING_BACK_DIRS: usize = 200_000;

/// A directory `before` recorded, moved elsewhere below `root` during the
/// run: find it (by device and inode, following no link) and rename it
/// back to `name` in `dir`, where nothing is now. Only directories: a file
/// is restored from its recorded bytes. What it holds is judged again
/// after (`integrity::check`): the sandbox may have changed it on the way.
fn bring_back(root: &Path, dir: &OwnedFd, name: &OsStr, before: &State) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (State::Dir { .. }, Some((dev, ino))) = (before, before.inode()) else {
        return false;
    };
    if nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
        return false;
    }
    let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
    let mut visited = 0;
    while let Some(d) = queue.pop_front() {
        visited += 1;
        if visited > BRING_BACK_DIRS {
            return false;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if !kind.is_dir() {
                continue;
            }
            let path = e.path();
            // By stat, not the entry's d_ino: overlayfs reports another.
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.dev() == dev && m.ino() == ino) {
                let Some(from) = path.parent().and_then(|p| open_root(p).ok()) else {
                    return false;
                };
                return renameat(&from, e.file_name().as_os_str(), dir, name).is_ok();
            }
            // Not from the quarantine: what this check moved there (a
            // directory whose mode the sandbox changed) stays there.
            if e.file_name() != AIRLOCK_DIR {
                queue.push_back(path);
            }
        }
    }
    false
}

/// Move a file or link `name` from `from` into `to` (another filesystem):
/// copied without following links, then removed. A directory is refused
/// (EXDEV stands): only a rename moves one whole.
fn move_across(from: &OwnedFd, name: &OsStr, to: &OwnedFd, to_name: &OsStr) -> nix::Result<()> {
    use nix::sys::stat::{fstatat, SFlag};
    let st = fstatat(from, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFLNK {
        let target = nix::fcntl::readlinkat(from, name)?;
        symlinkat(target.as_os_str(), to, to_name)?;
    } else if kind == SFlag::S_IFREG {
        let src = openat(
            from,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let dst = openat(
            to,
            to_name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let copied = std::io::copy(&mut std::fs::File::from(src), &mut std::fs::File::from(dst));
        if copied.is_err() {
            return Err(Errno::EIO);
        }
    } else {
        return Err(Errno::EXDEV);
    }
    nix::unistd::unlinkat(from, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
}

const AIRLOCK_DIR: &str = ".airlock";

/// Act on every change; `run` names the quarantine folder. A changed
/// `.airlock` goes first, so the quarantine is never the sandbox's.
/// An empty `.git` file that a tool writes into one of airlock's own
/// caches (uv marks its cache so): git reads an empty gitfile as invalid
/// and stops, so it names no hooks and no config, and it lies in a
/// directory nobody runs git in. Reporting it on every run would teach
/// users to skip the warning. Only a regular file of size 0 with one link
/// qualifies; anything with content is acted on as before, and once it
/// exists a later change to it is a change to a protected path.
/// `$XDG_CACHE_HOME/airlock` or `~/.cache/airlock`, as the presets place
/// their caches.
pub fn airlock_cache() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|c| c.join("airlock"))
}

pub fn inert_cache_marker(c: &Change) -> bool {
    let path = c.root.join(&c.rel);
    let Some(cache) = airlock_cache() else {
        return false;
    };
    if c.kind != ChangeKind::Created
        || c.rel.file_name() != Some(OsStr::new(".git"))
        || !path.starts_with(&cache)
    {
        return false;
    }
    let Ok(root) = open_root(&c.root) else {
        return false;
    };
    let Ok(Parent::Fd(parent)) = walk_to_parent(&root, &c.rel) else {
        return false;
    };
    nix::sys::stat::fstatat(
        &parent,
        OsStr::new(".git"),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .is_ok_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size == 0 && st.st_nlink == 1
    })
}

pub fn act(changes: &[Change], run: &str) -> Vec<Outcome> {
    let (first, rest): (Vec<&Change>, Vec<&Change>) = changes
        .iter()
        .partition(|c| c.rel == Path::new(AIRLOCK_DIR));
    first
        .into_iter()
        .chain(rest)
        .map(|c| act_one(c, run))
        .collect()
}

fn act_one(c: &Change, run: &str) -> Outcome {
    let path = c.root.join(&c.rel);
    let mut outcome = Outcome {
        path: path.display().to_string(),
        change: c.kind.as_str(),
        action: "reported".into(),
        dest: None,
        // Until moved or restored below, unless nothing is left to act on.
        in_place: c.kind != ChangeKind::Removed,
    };
    let Ok(root) = open_root(&c.root) else {
        outcome.action = "reported (the writable root cannot be opened)".into();
        return outcome;
    };
    // The thing to move: the path itself, or the ancestor that is no
    // longer a plain directory.
    let (parent, rel) = match walk_to_parent(&root, &c.rel) {
        Ok(Parent::Fd(fd)) => (fd, c.rel.clone()),
        Ok(Parent::Blocked(prefix)) => match walk_to_parent(&root, &prefix) {
            Ok(Parent::Fd(fd)) => (fd, prefix),
            _ => return outcome,
        },
        Ok(Parent::Absent) => {
            // Gone with its parent (moved aside just before, say).
            outcome.in_place = false;
            return outcome;
        }
        Err(_) => return outcome,
    };
    let name = rel.file_name().unwrap_or(rel.as_os_str()).to_os_string();
    if c.hidden && c.kind == ChangeKind::Created && rel == c.rel {
        // A hidden name that appeared (a `.env` the user wrote during the
        // run, say) is left alone unless it is linked elsewhere, which is how
        // a sandbox would read what is later written there.
        let linked = nix::sys::stat::fstatat(
            &parent,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| st.st_nlink > 1);
        if !linked {
            outcome.action = "reported".into();
            outcome.in_place = false;
            return outcome;
        }
    }
    if c.kind != ChangeKind::Removed {
        let moved = if rel == Path::new(AIRLOCK_DIR) {
            // The sandbox made or replaced `.airlock` itself: move it aside
            // first, then into a fresh quarantine of our own.
            let aside = format!("{AIRLOCK_DIR}.{run}.sandbox");
            renameat(&parent, name.as_os_str(), &parent, aside.as_str()).and_then(|()| {
                let q = quarantine_dir(&root, run)?;
                renameat(&parent, aside.as_str(), &q, name.as_os_str())
            })
        } else {
            quarantine_dir(&root, run).and_then(|q| {
                let kept = stored(&rel);
                let dest_parent = make_parents(&q, &kept)?;
                let dest_name = kept.file_name().unwrap_or(name.as_os_str());
                match renameat(&parent, name.as_os_str(), &dest_parent, dest_name) {
                    // Another filesystem mounted below the root: copied
                    // over, then removed.
                    Err(Errno::EXDEV) => move_across(&parent, &name, &dest_parent, dest_name),
                    other => other,
                }
            })
        };
        match moved {
            Ok(()) => {
                let dest = c
                    .root
                    .join(".airlock/quarantine")
                    .join(run)
                    .join(stored(&rel));
                // A directory set aside whole keeps what it held: no git
                // directory in it stays one git would use (a `.git`, or a
                // directory holding `HEAD`), so that a shell prompt or an
                // IDE looking at the quarantine runs nothing of it.
                neutralise(&dest);
                outcome.action = "quarantined".into();
                outcome.in_place = false;
                outcome.dest = Some(dest.display().to_string());
            }
            Err(e) => {
                outcome.action = format!("reported (could not quarantine: {e})");
                return outcome;
            }
        }
    }
    if rel == c.rel
        && c.kind != ChangeKind::Created
        && bring_back(&c.root, &parent, &name, &c.before)
    {
        // The user's own directory, moved elsewhere in the root (`mv .git
        // .git-user`): renamed back whole, which no recorded state could
        // rebuild (a git directory is recorded as one node).
        outcome.action = if c.kind == ChangeKind::Removed {
            "moved back".into()
        } else {
            "quarantined and moved back".into()
        };
    } else if rel == c.rel && restore(&parent, &name, &c.before) {
        outcome.action = if c.kind == ChangeKind::Removed {
            "restored".into()
        } else {
            "quarantined and restored".into()
        };
    } else if c.git
        && c.kind == ChangeKind::Created
        && name == "config"
        && matches!(c.before, State::Absent | State::Blocked)
    {
        if let Some(dest) = &outcome.dest {
            let text = sanitised_git_config(Path::new(dest), path.parent().unwrap_or(&path));
            let written = openat(
                &parent,
                name.as_os_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map(std::fs::File::from)
            .is_ok_and(|mut f| f.write_all(text.as_bytes()).is_ok());
            if written {
                outcome.action = "quarantined and sanitised".into();
            }
        }
    }
    outcome
}

/// Where a path would be quarantined, for messages.
/// The lines stderr gets for a run's outcomes. A repository the sandbox
/// created (`git init`, `git clone`, `cargo new`: its `.git/config` is new)
/// is one line, not one per file. When it holds nothing that runs a
/// program (no hook, only config keys that name no program) the line says
/// plainly what happened: the config was replaced by a plain copy and the
/// repository is intact. When something in it would have run a program,
/// the line is the alarm, with what was set aside. Anything else, and
/// anything left in place, is one alarm per path.
pub fn lines(outcomes: &[Outcome]) -> Vec<String> {
    use std::collections::BTreeMap;
    struct NewRepo {
        /// Paths set aside, relative to the repository.
        files: Vec<String>,
        /// Where the original config went.
        config: PathBuf,
    }
    let repo_of = |o: &Outcome| -> Option<PathBuf> {
        Path::new(&o.path)
            .ancestors()
            .find(|a| a.file_name() == Some(OsStr::new(".git")))
            .and_then(Path::parent)
            .map(Path::to_path_buf)
    };
    let mut new_repos: BTreeMap<PathBuf, NewRepo> = BTreeMap::new();
    for o in outcomes {
        let p = Path::new(&o.path);
        let Some(dest) = o.dest.as_deref() else {
            continue;
        };
        if o.change == "created"
            && !o.in_place
            && p.file_name() == Some(OsStr::new("config"))
            && p.parent().and_then(Path::file_name) == Some(OsStr::new(".git"))
        {
            if let Some(repo) = repo_of(o) {
                new_repos.insert(
                    repo,
                    NewRepo {
                        files: vec![],
                        config: PathBuf::from(dest),
                    },
                );
            }
        }
    }
    let mut out = vec![];
    for o in outcomes {
        let repo = repo_of(o).filter(|_| !o.in_place);
        match repo
            .as_ref()
            .and_then(|r| new_repos.get_mut(r).map(|n| (r, n)))
        {
            Some((r, n)) => n.files.push(
                Path::new(&o.path)
                    .strip_prefix(r)
                    .map_or_else(|_| o.path.clone(), |p| p.display().to_string()),
            ),
            None => out.push(format!(
                "airlock: the sandbox changed a protected path: {}",
                crate::text::escape(&describe(o))
            )),
        }
    }
    // How to get such a change in, said once, after the lines it is about:
    // the command succeeded, and without it a model retries the write.
    if outcomes
        .iter()
        .any(|o| repo_of(o).is_none() && o.change != "removed")
    {
        out.push(
            "airlock: protected paths (git hooks and config, editor and agent settings, .envrc, ...) are what host tools \
             run or obey, so no sandbox keeps a change to them (SPEC §4.5): make the change outside the sandbox, or run the \
             command with --review and apply the path by name (airlock changes apply ID PATH)"
                .into(),
        );
    }
    for (repo, n) in new_repos {
        let shown = crate::text::escape(&repo.display().to_string());
        let kept =
            crate::text::escape(&n.config.parent().unwrap_or(&n.config).display().to_string());
        let running: Vec<String> = git_config_entries(&n.config).map_or_else(
            || vec!["config (unreadable)".to_string()],
            |entries| {
                entries
                    .into_iter()
                    .filter(|(k, v)| {
                        !(safe_git_key(k)
                            || (k == "core.worktree"
                                && worktree_points_back(&repo.join(".git"), v)))
                    })
                    .map(|(k, _)| format!("config {k}"))
                    .collect()
            },
        );
        let hooks: Vec<&String> = n
            .files
            .iter()
            .filter(|f| f.as_str() != ".git/config")
            .collect();
        if running.is_empty() && hooks.is_empty() {
            out.push(format!(
                "airlock: new git repository {shown}, made in the sandbox: its config was set aside (kept in {kept}) \
                 and a plain copy put in its place, since a repository's config and hooks can run programs when you use git there; \
                 nothing in it did, and the repository is intact and usable"
            ));
        } else {
            let what: Vec<String> = running
                .into_iter()
                .chain(hooks.iter().map(|h| crate::text::escape(h)))
                .collect();
            out.push(format!(
                "airlock: the sandbox changed a protected path: new git repository {shown} held what would run programs \
                 when you use git there ({}); its config and hooks were set aside (kept in {kept}) and a plain config put \
                 in their place; the rest of the repository is intact",
                what.join(", ")
            ));
        }
    }
    out
}

pub fn describe(o: &Outcome) -> String {
    match &o.dest {
        Some(d) => format!("{} ({}): {}; now at {}", o.path, o.change, o.action, d),
        None => format!("{} ({}): {}", o.path, o.change, o.action),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_program_free_git_keys_are_kept() {
        for k in [
            "core.repositoryformatversion",
            "remote.origin.url",
            "branch.main.merge",
            "extensions.objectFormat",
        ] {
            assert!(safe_git_key(k), "{k}");
        }
        for k in [
            "core.fsmonitor",
            "core.hooksPath",
            "core.pager",
            "core.sshCommand",
            "alias.st",
            "filter.x.clean",
            "diff.x.textconv",
            "include.path",
            "includeIf.gitdir:/.path",
            "remote.url",
            "credential.helper",
            "remote.origin.uploadpack",
            "submodule.lib.update",
            "remote.origin.receivepack",
        ] {
            assert!(!safe_git_key(k), "{k}");
        }
    }

    #[test]
    fn values_are_quoted() {
        assert_eq!(quote("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
