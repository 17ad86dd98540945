//! `canonicalize`, remembered. Building a plan, the deny_read watch and
//! the Landlock split resolve the same ancestors (HOME, `~/.config`) for
//! every one of dozens of paths; glibc's realpath reads every component
//! as a link each time. Here a path is its parent's resolution plus its
//! own name (followed only when it is a link), and each is looked up once
//! per process: a one-shot CLI, over the few milliseconds of a start-up.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

// Keyed by the path as written: `Path`'s own equality ignores a trailing
// `.`, which realpath does not.
static CACHE: Mutex<Option<HashMap<OsString, Option<PathBuf>>>> = Mutex::new(None);

/// What `std::fs::canonicalize` returned for `p` when first asked, or
/// `None` where it failed. For start-up only: never after the sandbox ran
/// (what it made since is not seen).
pub fn canonical(p: &Path) -> Option<PathBuf> {
    if let Some(hit) = CACHE
        .lock()
        .ok()
        .and_then(|c| c.as_ref().and_then(|m| m.get(p.as_os_str()).cloned()))
    {
        return hit;
    }
    let found = match (p.parent(), p.file_name()) {
        // A plain name under an absolute parent: only it is looked at.
        (Some(parent), Some(name)) if plain(p) => {
            let joined = canonical(parent)?.join(name);
            match joined.symlink_metadata() {
                Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&joined).ok(),
                Ok(_) => Some(joined),
                Err(_) => None,
            }
        }
        // `/`, relative paths, and paths ending in `..`.
        _ => std::fs::canonicalize(p).ok(),
    };
    if let Ok(mut c) = CACHE.lock() {
        c.get_or_insert_with(HashMap::new)
            .insert(p.as_os_str().to_os_string(), found.clone());
    }
    found
}

/// `p` was asked of [`canonical`] since the last [`forget`] and did not
/// resolve (absent, or a dangling link): a stat of it would fail too.
// Only the Linux sandbox's Landlock split asks.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn known_absent(p: &Path) -> bool {
    CACHE.lock().ok().is_some_and(|c| {
        c.as_ref()
            .is_some_and(|m| matches!(m.get(p.as_os_str()), Some(None)))
    })
}

/// The file a path names, as a comparable place: made absolute, its
/// parent resolved now (never from the cache: also used after the run),
/// its own name kept (a file not made yet, or a link airlock will not
/// follow, still has one).
pub fn parent_resolved(p: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(p).ok()?;
    let parent = std::fs::canonicalize(abs.parent()?).ok()?;
    Some(parent.join(abs.file_name()?))
}

/// Forget every answer: what is asked from now on is looked up again
/// (the helper, once its deny_read watch is in place: what changed before
/// must be seen by the Landlock split that follows).
// Only the Linux sandbox has a watch to wait for.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn forget() {
    if let Ok(mut c) = CACHE.lock() {
        *c = None;
    }
}

/// Absolute, with no `.` or `..` anywhere (`Path` hides a trailing `.`,
/// which realpath refuses on a file).
fn plain(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let bytes = p.as_os_str().as_bytes();
    p.is_absolute()
        && !bytes.ends_with(b"/.")
        && !bytes.windows(3).any(|w| w == b"/./")
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::canonical;
    use std::os::unix::fs::symlink;

    #[test]
    fn agrees_with_canonicalize() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/f"), "").unwrap();
        symlink("a/b", d.join("l")).unwrap();
        symlink(d.join("l"), d.join("l2")).unwrap();
        symlink("missing", d.join("dangling")).unwrap();
        for p in [
            "a", "a/b", "a/f", "a/f/x", "l", "l/..", "l2", "l2/c", "dangling", "nope", "nope/x",
            "a/./b", "a/b/../f", "a/f/.", "a/.", "l/.", "l2/../a",
        ] {
            let p = d.join(p);
            assert_eq!(
                canonical(&p),
                std::fs::canonicalize(&p).ok(),
                "{}",
                p.display()
            );
            // Asked again: the remembered answer.
            assert_eq!(
                canonical(&p),
                std::fs::canonicalize(&p).ok(),
                "{}",
                p.display()
            );
        }
    }
}
