//! `.env` and `.env.*` files in the writable roots (SPEC §3.3): a project's
//! API keys, unreadable inside by default; `.env.example`-style templates
//! stay readable, and so does a directory named `.env` (a Python virtual
//! environment often is one). The same for the other files whose name
//! says, by their tool's convention, that they hold the project's secrets
//! and are kept out of version control: wrangler's `.dev.vars` (and
//! `.dev.vars.<env>`), dynaconf's `.secrets.<ext>` (`.secrets.toml`,
//! `.secrets.local.yaml`) and Streamlit's `.streamlit/secrets.toml`. Not
//! `.flaskenv`: Flask's documentation keeps it for public settings
//! (`FLASK_APP`) and commits it, secrets going to `.env`; not
//! detect-secrets' `.secrets.baseline`, a committed list of hashes that
//! its hook reads.
//!
//! Mounts hide what exists when the run starts, so the roots are searched
//! then: to [`MAX_DEPTH`] directories below each root, at most [`MAX_DIRS`]
//! directories in all, without descending into dependency, build and
//! version-control directories ([`SKIP`]), whose `.env` files are other
//! people's. A `.env` the host creates while the run goes on is not hidden.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// How many directories below a root are searched.
pub const MAX_DEPTH: usize = 6;
/// How many directories are read in all, so a huge tree costs bounded time.
pub const MAX_DIRS: usize = 10_000;
/// Not descended into: vendored dependencies, build output, caches and VCS.
pub const SKIP: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "node_modules",
    "target",
    "vendor",
    ".venv",
    "venv",
    "__pycache__",
    ".tox",
    ".cache",
    ".airlock",
];
/// A last dotted part that makes `.env.*` a template, not a secret store.
const TEMPLATE: &[&str] = &[
    "example", "examples", "sample", "template", "tmpl", "tpl", "dist", "defaults", "schema",
    "baseline",
];

/// Names hidden themselves and with a dotted suffix (`.env.local`), the
/// suffix not a template's.
const SECRET_STEMS: &[&str] = &[".env", ".dev.vars"];
/// Names hidden only with a dotted suffix (`.secrets.toml`): bare, the
/// name is as often a directory or a marker.
const SECRET_PREFIXES: &[&str] = &[".secrets"];
/// Names hidden only inside a directory of this name: (directory, file).
/// Rails' master key too (its per-environment keys: [`is_secret_path`]).
const SECRET_IN_DIR: &[(&str, &str)] = &[(".streamlit", "secrets.toml"), ("config", "master.key")];

/// A directory that holds environment files and nothing else, by its
/// convention.
const SECRETS_DIR: &str = ".envs";

/// The rule's name in messages and `policy explain --path`.
pub const RULE: &str =
    "built-in default: .env, .env.*, .env-*, .env_* and *.env files and editors' copies of them (and .dev.vars, .secrets.*, files below .envs/, .streamlit/secrets.toml, Rails' config/master.key and config/credentials/*.key) in every writable root (not templates such as .env.example)";

/// Whether a file name is one the rule hides: `.env`, `.dev.vars`, or one
/// of those or `.secrets` followed by `.<x>` where no dotted part of `<x>`
/// names a template.
pub fn is_secret_name(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    // `.ENV` is the same store to whoever made it (and to a case-folding
    // file system).
    let lower = name.to_ascii_lowercase();
    let name = lower.as_str();
    // An editor's copy holds the same lines: Emacs's backup (`.env~`) and
    // auto-save (`#.env#`) files, other editors' `~` backups (red team
    // round 12). Vim's swap file (`.env.swp`) is a dotted suffix already.
    let name = match name.strip_prefix('#').and_then(|n| n.strip_suffix('#')) {
        Some(inner) => inner,
        None => name.strip_suffix('~').unwrap_or(name),
    };
    if SECRET_STEMS.contains(&name) {
        return true;
    }
    // A copy a file manager made (`.env copy`, `.env (1)`), and the
    // `<name>.env` files Docker Compose's `env_file` and others read
    // (`secrets.env`, `prod.env`), not templates (`example.env`); red team
    // round 13.
    if name.starts_with(".env ") {
        return true;
    }
    if let Some(stem) = name
        .strip_suffix(".env")
        .filter(|s| !s.is_empty() && *s != ".")
    {
        let stem = stem.trim_start_matches('.');
        if !stem
            .split(['.', '-', '_'])
            .any(|part| TEMPLATE.contains(&part))
        {
            return true;
        }
    }
    // `.env-local`, `.env_prod`: the same store by another spelling.
    let other_sep = |stem: &&str| {
        let rest = name.strip_prefix(*stem)?;
        rest.strip_prefix('-').or_else(|| rest.strip_prefix('_'))
    };
    SECRET_STEMS
        .iter()
        .chain(SECRET_PREFIXES)
        .filter_map(|stem| name.strip_prefix(stem)?.strip_prefix('.'))
        .chain(SECRET_STEMS.iter().filter_map(other_sep))
        .any(|rest| {
            !rest.is_empty()
                && !rest
                    .split('.')
                    .any(|part| TEMPLATE.contains(&part.to_ascii_lowercase().as_str()))
        })
}

/// Whether the file at `path` is one the rule hides: by its name, or by
/// its name in its directory (`.streamlit/secrets.toml`).
pub fn is_secret_path(path: &Path) -> bool {
    let Some(name) = path.file_name() else {
        return false;
    };
    if is_secret_name(name) {
        return true;
    }
    let dir = path.parent().and_then(Path::file_name);
    if SECRET_IN_DIR
        .iter()
        .any(|(d, f)| name == *f && dir == Some(OsStr::new(d)))
    {
        return true;
    }
    // cookiecutter-django's layout: `.envs/.production/.django`, each
    // dot-file in a `.envs` directory or one level below it a service's
    // settings (red team round 12). Dot-files only: a virtual environment
    // kept in `~/.envs/<name>` holds none of its own at its top.
    let envs = Some(OsStr::new(SECRETS_DIR));
    let up2 = path
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name);
    if name.as_encoded_bytes().starts_with(b".") && (dir == envs || up2 == envs) {
        return true;
    }
    // Rails' per-environment keys: config/credentials/<env>.key.
    let above = path
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name);
    dir == Some(OsStr::new("credentials"))
        && above == Some(OsStr::new("config"))
        && name.to_str().is_some_and(|n| n.ends_with(".key"))
}

/// What the search found.
#[derive(Debug, Default)]
pub struct Found {
    /// The files to hide, as found (a link is resolved by the mount).
    pub files: Vec<PathBuf>,
    /// The directory budget ran out before every root was searched.
    pub truncated: bool,
    /// Hidden files git tracks with other content: git inside sees them
    /// emptied (dotenv_git.rs).
    pub git_emptied: Vec<PathBuf>,
    /// Tool configuration files the same walk met, anywhere below the
    /// roots (`.npmrc`, `.cargo/config.toml`, …), for project_secrets.rs
    /// to look into.
    pub configs: Vec<PathBuf>,
}

/// The `.env` files below `roots` that exist now: regular files, or links to
/// regular files outside the kernel's pseudo file systems (mounting over
/// those could only break the run, and they hold no project secret).
pub fn find(roots: &[PathBuf]) -> Found {
    let mut found = Found::default();
    let mut budget = MAX_DIRS;
    let mut queue: std::collections::VecDeque<(PathBuf, usize)> =
        roots.iter().map(|r| (r.clone(), 0)).collect();
    // Breadth first: shallow files (the common place) before the budget ends.
    while let Some((dir, depth)) = queue.pop_front() {
        if budget == 0 {
            found.truncated = true;
            break;
        }
        budget -= 1;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            let name = e.file_name();
            if kind.is_dir() {
                if depth < MAX_DEPTH && !SKIP.iter().any(|s| OsStr::new(s) == name) {
                    queue.push_back((e.path(), depth + 1));
                } else if name == ".venv" || name == "venv" {
                    // Not searched, but pip reads its own `pip.conf` there
                    // (red team round 17).
                    let conf = e.path().join("pip.conf");
                    if std::fs::symlink_metadata(&conf).is_ok() {
                        found.configs.push(conf);
                    }
                }
            } else if is_secret_path(&e.path()) && hideable(&e.path(), kind) {
                found.files.push(e.path());
            } else if crate::project_secrets::is_config(&dir, &name) {
                found.configs.push(e.path());
            }
        }
    }
    found.files.sort();
    found.files.dedup();
    found
}

/// A search of the workspace started as soon as it is known, so that it
/// overlaps building the policy (`run` calls [`prefetch`]; `plan` takes
/// the result through [`find_with_prefetch`]).
static PREFETCH: std::sync::Mutex<Option<(PathBuf, std::thread::JoinHandle<Found>)>> =
    std::sync::Mutex::new(None);

/// Start searching `root` in a thread.
pub fn prefetch(root: PathBuf) {
    let r = root.clone();
    let spawned = std::thread::Builder::new()
        .name("dotenv".into())
        .spawn(move || find(std::slice::from_ref(&r)));
    if let (Ok(handle), Ok(mut slot)) = (spawned, PREFETCH.lock()) {
        *slot = Some((root, handle));
    }
}

/// [`find`], taking a prefetched root's result where there is one, with
/// the files earlier runs found in the same roots ([`remembered`]).
pub fn find_with_prefetch(roots: &[PathBuf]) -> Found {
    let mut found = search_with_prefetch(roots);
    remembered(roots, &mut found.files);
    remembered_as(roots, &mut found.configs, "-configs");
    // What git holds as it is lies in the repository the sandbox reads
    // anyway; hidden, `git commit -a` inside would record it empty.
    let held = crate::dotenv_git::held(&found.files);
    found.files.retain(|f| !held.as_is.contains(f));
    found.git_emptied = held.differs;
    found
}

/// Files found in a root stay hidden while they exist, searched for or
/// not: a run can make thousands of directories (or deep ones) so that
/// the next run's bounded search ends before it reaches a `.env` it found
/// before (red team round 9). Kept per root in airlock's state directory,
/// outside every sandbox; at most [`REMEMBERED`] names a root.
fn remembered(roots: &[PathBuf], files: &mut Vec<PathBuf>) {
    remembered_as(roots, files, "");
}

/// [`remembered`] under its own record (`suffix`): the tool
/// configuration files the search met (project_secrets.rs), which a later
/// run whose search a sandbox cut short with thousands of directories
/// would otherwise miss (red team round 17).
fn remembered_as(roots: &[PathBuf], files: &mut Vec<PathBuf>, suffix: &str) {
    let Some(dir) = crate::places::state_dir().map(|d| d.join("dotenv")) else {
        return;
    };
    for root in roots {
        let record = dir.join(format!("{}{suffix}", key_of(root)));
        let mut known: Vec<PathBuf> = std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        // Still there, still one (a name the sandbox put back as a
        // directory or a device is no secret of the user's). Only airlock
        // writes the record: what it holds, it found.
        known.retain(|p| std::fs::symlink_metadata(p).is_ok_and(|m| hideable(p, m.file_type())));
        let before = known.len();
        for f in files.iter().filter(|f| f.starts_with(root)) {
            // A found link's target too, by its own name: a run may remove
            // the link (its cover is on the target), and the target's name
            // is none the search looks for (red team round 10).
            // Not one inside a git directory: a run's `.env -> .git/index`
            // would hide git's own files from every later run (red team
            // round 11).
            let target = std::fs::symlink_metadata(f)
                .is_ok_and(|m| m.file_type().is_symlink())
                .then(|| crate::resolve::canonical(f))
                .flatten()
                .filter(|t| !t.components().any(|c| c.as_os_str() == ".git"));
            for p in std::iter::once(f.clone()).chain(target) {
                if !known.contains(&p) && known.len() < REMEMBERED {
                    known.push(p);
                }
            }
        }
        files.extend(known.iter().cloned());
        if known.len() != before || !record.exists() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir);
            if let Ok(bytes) = serde_json::to_vec(&known) {
                let tmp = record.with_extension("tmp");
                if std::fs::write(&tmp, bytes).is_ok() {
                    let _ = std::fs::rename(&tmp, &record);
                }
            }
        }
    }
    files.sort();
    files.dedup();
}

/// How many found files a root's record keeps.
const REMEMBERED: usize = 1000;

fn key_of(root: &Path) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(root.as_os_str().as_encoded_bytes());
    ctx.finish().as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn search_with_prefetch(roots: &[PathBuf]) -> Found {
    let pre = PREFETCH.lock().ok().and_then(|mut s| s.take());
    let Some((root, handle)) = pre.filter(|(r, _)| roots.contains(r)) else {
        return find(roots);
    };
    let Ok(mut found) = handle.join() else {
        return find(roots);
    };
    let rest: Vec<PathBuf> = roots.iter().filter(|r| **r != root).cloned().collect();
    if !rest.is_empty() {
        let more = find(&rest);
        found.files.extend(more.files);
        found.truncated |= more.truncated;
        found.files.sort();
        found.files.dedup();
    }
    found
}

fn hideable(path: &Path, kind: std::fs::FileType) -> bool {
    if kind.is_file() {
        return true;
    }
    if !kind.is_symlink() {
        return false;
    }
    match std::fs::canonicalize(path) {
        Ok(real) => {
            real.is_file()
                && !["/proc", "/sys", "/dev"]
                    .iter()
                    .any(|p| real.starts_with(p))
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_templates_are_told_apart() {
        for n in [
            ".env",
            ".env.local",
            ".env.production",
            ".env.test.local",
            ".dev.vars",
            ".dev.vars.staging",
            ".secrets.toml",
            ".secrets.local.yaml",
            ".secrets.json",
            ".env-local",
            ".env_prod",
        ] {
            assert!(is_secret_name(OsStr::new(n)), "{n}");
        }
        for n in [
            "#.env#",
            ".env~",
            ".dev.vars~",
            "#.env.local#",
            ".env.local~",
            ".ENV",
            ".Env.Local",
            ".env copy",
            ".env (1)",
            "secrets.env",
            "prod.env",
            "app.local.env",
        ] {
            assert!(is_secret_name(OsStr::new(n)), "{n}");
        }
        for n in [
            ".env.example~",
            "#.env.sample#",
            ".envrc~",
            "#x#",
            "~",
            "#",
            "example.env",
            "app.example.env",
            "env.sample.env",
            "x.env.example",
        ] {
            assert!(!is_secret_name(OsStr::new(n)), "{n}");
        }
        for p in [
            "app/config/master.key",
            "config/credentials/production.key",
            "w/.envs/.production/.django",
            "w/.envs/.local/.postgres",
            "w/.envs/.django",
        ] {
            assert!(is_secret_path(Path::new(p)), "{p}");
        }
        for p in [
            "app/master.key",
            "credentials/production.key",
            "config/app.key",
            "home/.envs/venv/pyvenv.cfg",
            "w/.envs/a/b/.django",
        ] {
            assert!(!is_secret_path(Path::new(p)), "{p}");
        }
        for n in [
            ".env.example",
            ".env.sample",
            ".env.template",
            ".env.local.example",
            ".env.EXAMPLE",
            ".env.",
            ".env-example",
            ".env_sample",
            ".envrc",
            ".flaskenv",
            ".secrets",
            ".secrets.baseline",
            ".dev.vars.example",
            ".secrets.example.toml",
            "secrets.toml",
            "env",
        ] {
            assert!(!is_secret_name(OsStr::new(n)), "{n}");
        }
    }

    #[test]
    fn the_search_finds_files_below_and_skips_dependencies() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        for f in [
            ".env",
            ".env.example",
            "apps/web/.env.local",
            "node_modules/x/.env",
            ".git/.env",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "K=v").unwrap();
        }
        // A virtual environment named .env is a directory: left alone.
        std::fs::create_dir_all(root.join("py/.env/bin")).unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", root.join("apps/.env")).unwrap();
        let found = find(std::slice::from_ref(&root));
        assert_eq!(
            found.files,
            vec![root.join(".env"), root.join("apps/web/.env.local")]
        );
        assert!(!found.truncated);
    }

    #[test]
    fn streamlit_secrets_are_hidden_only_in_their_directory() {
        assert!(is_secret_path(Path::new("/w/.streamlit/secrets.toml")));
        assert!(is_secret_path(Path::new("/w/app/.dev.vars")));
        assert!(!is_secret_path(Path::new("/w/secrets.toml")));
        assert!(!is_secret_path(Path::new("/w/.streamlit/config.toml")));
    }
}
