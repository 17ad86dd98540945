//! Which found `.env`-style files git holds (SPEC §3.3, harness round 11):
//! a file git tracks with its own content already lies in the repository's
//! objects, which the sandbox reads (`git show HEAD:.env.development`), so
//! hiding it protects nothing; hidden, git inside sees it emptied, and `git
//! commit -a` there records it empty in the user's history. Such a file is
//! left readable. One git tracks with other content (local edits) stays
//! hidden, and the run says that git inside sees it emptied.
//!
//! The index is the sandbox's to write (git needs it), so git's own word
//! that a file is unmodified is not taken (`assume-unchanged` would say
//! so of anything): the file's content is hashed here and compared with
//! the blob the index names. A sandbox cannot name the blob of content it
//! cannot read.

use std::path::{Path, PathBuf};

/// The largest file hashed; a larger one stays hidden.
const MAX_SIZE: u64 = 1 << 20;

/// What git holds of `files`: those it tracks with exactly their content
/// (left readable), and those it tracks with other content (hidden).
#[derive(Debug, Default, PartialEq)]
pub struct Held {
    pub as_is: Vec<PathBuf>,
    pub differs: Vec<PathBuf>,
}

/// Ask the repository each file is in. Files in no repository, links, and
/// anything git does not answer for in time, stay as they were (hidden).
pub fn held(files: &[PathBuf]) -> Held {
    let mut out = Held::default();
    let mut by_top: std::collections::BTreeMap<PathBuf, Vec<&PathBuf>> = Default::default();
    for f in files {
        if let Some(top) = f.parent().and_then(work_tree_of) {
            by_top.entry(top).or_default().push(f);
        }
    }
    for (top, files) in by_top {
        // Most found files are ignored, not tracked: their name is then
        // nowhere in the index, and git is not asked.
        let Some(index) = index_of(&top).and_then(|i| std::fs::read(i).ok()) else {
            continue;
        };
        // (A repository of 20,000 files has an index of about 1.7 MB: a
        // plain byte-by-byte search of it cost a one-shot run 6 ms.)
        let named: Vec<&PathBuf> = files
            .into_iter()
            .filter(|f| {
                f.file_name().is_some_and(|n| {
                    let mut needle = n.as_encoded_bytes().to_vec();
                    needle.push(0);
                    memchr::memmem::find(&index, &needle).is_some()
                })
            })
            .collect();
        if named.is_empty() {
            continue;
        }
        for (file, blob) in ls_files(&top, &named) {
            match same_content(&file, &blob) {
                Some(true) => out.as_is.push(file),
                Some(false) => out.differs.push(file),
                None => {}
            }
        }
    }
    out
}

/// The work tree `dir` lies in: the nearest directory with a `.git`.
fn work_tree_of(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|a| std::fs::symlink_metadata(a.join(".git")).is_ok())
        .map(Path::to_path_buf)
}

/// The index file of the work tree at `top`: `.git/index`, or the index
/// of the git directory a `.git` file names (a linked worktree).
fn index_of(top: &Path) -> Option<PathBuf> {
    let dot = top.join(".git");
    let m = std::fs::symlink_metadata(&dot).ok()?;
    if m.is_dir() {
        return Some(dot.join("index"));
    }
    let text = crate::paths::read_no_follow(&dot).ok()?;
    let text = String::from_utf8(text).ok()?;
    let dir = text.strip_prefix("gitdir:")?.trim();
    let dir = PathBuf::from(dir);
    Some(match dir.is_absolute() {
        true => dir.join("index"),
        false => top.join(dir).join("index"),
    })
}

/// `git ls-files -s` for `files` in `top`: each regular file git tracks
/// (stage 0), with the blob its index entry names. Hooks and filters do
/// not run for it; it is given two seconds.
fn ls_files(top: &Path, files: &[&PathBuf]) -> Vec<(PathBuf, String)> {
    let rel: Vec<&Path> = files
        .iter()
        .filter_map(|f| f.strip_prefix(top).ok())
        .collect();
    let mut git = std::process::Command::new("git");
    git.args(["-c", "core.fsmonitor=false", "--no-optional-locks"])
        .args(["ls-files", "-s", "-z", "--"])
        .args(&rel)
        .current_dir(top)
        .env("GIT_TERMINAL_PROMPT", "0");
    let Some(bytes) = crate::child::output_within(&mut git, std::time::Duration::from_secs(2))
    else {
        return vec![];
    };
    parse_ls_files(&bytes, top)
}

/// `<mode> <blob> <stage>\t<path>\0` entries: the regular files at stage 0.
fn parse_ls_files(bytes: &[u8], top: &Path) -> Vec<(PathBuf, String)> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let tab = entry.iter().position(|b| *b == b'\t')?;
            let head = std::str::from_utf8(&entry[..tab]).ok()?;
            let mut parts = head.split(' ');
            let (mode, blob, stage) = (parts.next()?, parts.next()?, parts.next()?);
            let path =
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&entry[tab + 1..]);
            (matches!(mode, "100644" | "100755") && stage == "0")
                .then(|| (top.join(path), blob.to_string()))
        })
        .collect()
}

/// Whether `file`'s content is the blob `blob` (SHA-1 or SHA-256 by its
/// length); `None` when it cannot tell (a link, too large, unreadable).
fn same_content(file: &Path, blob: &str) -> Option<bool> {
    let m = std::fs::symlink_metadata(file).ok()?;
    if !m.is_file() || m.len() > MAX_SIZE {
        return None;
    }
    let content = crate::paths::read_no_follow(file).ok()?;
    let algorithm = match blob.len() {
        40 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        64 => &ring::digest::SHA256,
        _ => return None,
    };
    let mut ctx = ring::digest::Context::new(algorithm);
    ctx.update(format!("blob {}\0", content.len()).as_bytes());
    ctx.update(&content);
    let hex: String = ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(hex == blob)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let st = std::process::Command::new("git")
            .args(["-c", "user.email=t@t", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    }

    #[test]
    fn tracked_as_is_differs_and_ignored_are_told_apart() {
        if std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err()
        {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(d.path()).unwrap();
        git(&top, &["init", "-q", "."]);
        std::fs::write(top.join(".env.development"), "PUBLIC=1\n").unwrap();
        std::fs::write(top.join(".env.production"), "PUBLIC=2\n").unwrap();
        std::fs::write(top.join(".env"), "SECRET=x\n").unwrap();
        std::fs::write(top.join(".env.staged"), "SECRET=y\n").unwrap();
        git(&top, &["add", ".env.development", ".env.production"]);
        git(&top, &["commit", "-q", "-m", "c"]);
        // Staged as empty, then marked unchanged: the index's word only.
        std::fs::write(top.join(".env.staged"), "").unwrap();
        git(&top, &["add", ".env.staged"]);
        git(&top, &["update-index", "--assume-unchanged", ".env.staged"]);
        std::fs::write(top.join(".env.staged"), "SECRET=y\n").unwrap();
        std::fs::write(top.join(".env.production"), "SECRET=local\n").unwrap();
        let files: Vec<PathBuf> = [".env", ".env.development", ".env.production", ".env.staged"]
            .iter()
            .map(|n| top.join(n))
            .collect();
        let h = held(&files);
        assert_eq!(h.as_is, vec![top.join(".env.development")]);
        let mut differs = h.differs.clone();
        differs.sort();
        assert_eq!(
            differs,
            vec![top.join(".env.production"), top.join(".env.staged")]
        );
    }
}
