//! Regexes over paths, in the dialect Seatbelt's `(regex ...)` filter
//! accepts (AppleMatch: POSIX-like, no `{n}`, no `\d`).
//!
//! None of these is ever written into the profile text. Each travels as a
//! `-D NAME=value` parameter and is used as `(regex (param "NAME"))`: a
//! parameter's value is taken as it is, with no string-literal escaping in
//! between, so the only escaping is the regex escaping done here (the same
//! set of characters SBPL's own `regex-quote` escapes, plus `]` and `}`).
//! A quote, a backslash or a newline in a path or glob therefore can neither
//! break the profile nor change what the regex matches.
//!
//! Letters become case-insensitive classes (`[Gg]`): on a case-insensitive
//! volume (the macOS default) `.GIT/hooks` is `.git/hooks`, and an absent
//! name (`~/.ZSHRC`) would otherwise be creatable under another case.
//! On a case-sensitive volume this only denies more.

use std::fmt::Write as _;

/// Characters with a meaning in a regex; each is escaped with a backslash.
const SPECIAL: &str = "^.[]$()|*+?{}\\";

/// One character as a regex that matches it, in either case for ASCII
/// letters.
fn push_char(out: &mut String, c: char) {
    if c.is_ascii_alphabetic() {
        let _ = write!(
            out,
            "[{}{}]",
            c.to_ascii_uppercase(),
            c.to_ascii_lowercase()
        );
    } else if let Some((up, low)) = other_case(c) {
        // An alternation, not a class: AppleMatch may read a class byte by
        // byte, and these letters are several bytes in UTF-8.
        let _ = write!(out, "({up}|{low})");
    } else if SPECIAL.contains(c) {
        out.push('\\');
        out.push(c);
    } else {
        out.push(c);
    }
}

/// Both cases of a non-ASCII letter whose case mapping is one character
/// each way (`ü`/`Ü`); APFS folds those too.
fn other_case(c: char) -> Option<(char, char)> {
    fn one(mut it: impl Iterator<Item = char>) -> Option<char> {
        let first = it.next()?;
        it.next().is_none().then_some(first)
    }
    let up = one(c.to_uppercase())?;
    let low = one(c.to_lowercase())?;
    (up != low && !c.is_ascii()).then_some((up, low))
}

/// A literal string as a case-insensitive regex fragment.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for c in s.chars() {
        push_char(&mut out, c);
    }
    out
}

/// Matches the path itself and everything beneath it, like `subpath`.
pub fn subpath(path: &str) -> String {
    let path = path.trim_end_matches('/');
    format!("^{}(/|$)", quote(path))
}

/// Matches exactly the path, like `literal`.
pub fn literal(path: &str) -> String {
    if path == "/" {
        return "^/$".into();
    }
    format!("^{}$", quote(path.trim_end_matches('/')))
}

/// Any number of whole segments, each followed by `/`. Written without
/// `.`: whether AppleMatch's `.` matches a newline is not documented, and a
/// negated class matches it in both engines.
const SEGMENTS: &str = "([^/]*/)*";

/// An absolute glob as a regex that matches what the glob names and
/// everything beneath it: `*` and `?` stay within one segment, `**`
/// crosses segments, and `a/**/b` also matches `a/b`.
pub fn glob(glob: &str) -> String {
    // A trailing `/**` or `/` means the directory: the suffix covers both.
    let mut g = glob;
    loop {
        let before = g;
        g = g.strip_suffix("/**").unwrap_or(g);
        if g.len() > 1 {
            g = g.strip_suffix('/').unwrap_or(g);
        }
        if g == before {
            break;
        }
    }
    let mut re = String::from("^");
    let chars: Vec<char> = g.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                if chars.get(i + 2) == Some(&'/') {
                    re.push_str(SEGMENTS);
                    i += 3;
                } else {
                    re.push_str(SEGMENTS);
                    re.push_str("[^/]*");
                    i += 2;
                }
                continue;
            }
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            c => push_char(&mut re, c),
        }
        i += 1;
    }
    re.push_str("(/|$)");
    re
}

/// Names anywhere below `root` whose content git reads as configuration
/// or runs as code (SPEC §4.5), in the repository's own `.git` and in the
/// gitdirs of submodules (`.git/modules/<name>/`) and worktrees
/// (`.git/worktrees/<name>/`).
pub const GIT_CONTROL: &[&str] = &[
    "config",
    "config.worktree",
    "hooks",
    "info",
    "commondir",
    "gitdir",
];

/// Files in a working tree that a host tool obeys when the user later
/// works there, at any depth: git's submodule list, direnv's `.envrc`,
/// editor task settings, airlock's own project policy.
pub const TREE_CONTROL: &[&str] = &[".gitmodules", ".envrc", ".vscode", ".idea", "airlock.toml"];

/// `.git` itself at any depth below `root`: creating it (as a directory,
/// as a `gitdir:` pointer file, as a symlink, or by renaming something into
/// place), replacing, renaming or changing it is refused.
pub fn git_entry(root: &str) -> String {
    format!(
        "^{}/{SEGMENTS}{}$",
        quote(root.trim_end_matches('/')),
        quote(".git")
    )
}

/// Git's configuration and hooks below any `.git` under `root`.
pub fn git_control(root: &str) -> String {
    let names: Vec<String> = GIT_CONTROL.iter().map(|n| quote(n)).collect();
    format!(
        "^{}/{SEGMENTS}{}/(({}|{})/([^/]+/)+)?({})(/|$)",
        quote(root.trim_end_matches('/')),
        quote(".git"),
        quote("modules"),
        quote("worktrees"),
        names.join("|")
    )
}

/// The working-tree configuration files at any depth below `root`.
pub fn tree_control(root: &str) -> String {
    let names: Vec<String> = TREE_CONTROL.iter().map(|n| quote(n)).collect();
    format!(
        "^{}/{SEGMENTS}({})(/|$)",
        quote(root.trim_end_matches('/')),
        names.join("|")
    )
}
