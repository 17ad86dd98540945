//! What the tests of changes held for review share: a tree's state, to
//! compare a review run's applied result with a plain run's, and the
//! changeset id a run says it held.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::repos::show;
use crate::Out;

/// The id in `held for review as <id>:`.
pub fn held_id(out: &Out) -> String {
    let at = out
        .stderr
        .find("held for review as ")
        .unwrap_or_else(|| panic!("nothing held: {}", show(out)));
    out.stderr[at + 19..at + 27].to_string()
}

/// A path's extended attributes, links not followed.
pub fn xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    // SAFETY: a NUL-terminated path and a buffer of the size given.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "listxattr {}", p.display());
    names.truncate(n as usize);
    let mut out = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 4096];
        // SAFETY: NUL-terminated path and name, a buffer of the size given.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0, "getxattr {}", p.display());
        v.truncate(m as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

/// Each path below `dir`: its kind, mode and content (or link target).
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    walk(dir, false)
}

/// `tree`, with each path's extended attributes.
pub fn tree_with_xattrs(dir: &Path) -> BTreeMap<PathBuf, String> {
    walk(dir, true)
}

fn walk(root: &Path, with_xattrs: bool) -> BTreeMap<PathBuf, String> {
    fn at(root: &Path, dir: &Path, x: bool, out: &mut BTreeMap<PathBuf, String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let mode = m.mode() & 0o7777;
            let mut what = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                at(root, &p, x, out);
                format!("dir {mode:o}")
            } else if m.is_file() {
                format!(
                    "file {mode:o} {}",
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap())
                )
            } else {
                format!("special {mode:o}")
            };
            if x && !m.file_type().is_symlink() {
                what.push_str(&format!(" {:?}", xattrs(&p)));
            }
            out.insert(rel, what);
        }
    }
    let mut out = BTreeMap::new();
    at(root, root, with_xattrs, &mut out);
    out
}
