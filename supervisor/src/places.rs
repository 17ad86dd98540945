//! Where airlock keeps its own files outside every sandbox: the user's
//! policy and the files beside it, and the managed policy. Low in the
//! pipeline: the policy sources, the plan, the sandbox backends and the
//! post-run check all need these places, and none of them owns them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::text::shown;

pub const DEFAULT_MANAGED: &str = "/etc/airlock/managed.toml";

/// `$XDG_CONFIG_HOME/airlock/policy.toml`.
pub fn user_policy_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("airlock/policy.toml"))
}

/// The managed policy's path, and whether it must exist (SPEC §3.3).
///
/// `AIRLOCK_MANAGED_POLICY` names a managed file only on a machine without
/// `/etc/airlock/managed.toml`: where anything stands at that path (a file,
/// an unreadable one, a directory, a dangling link) or its presence cannot
/// be told, the variable is an error, never a replacement, because whoever
/// sets the caller's environment is not the administrator. The variable
/// naming that very file is no replacement and is accepted. An explicit
/// variable that points nowhere is an error too, and so is anything at the
/// default path that cannot be read (a link to nowhere included): the
/// managed policy fails closed.
pub fn managed_policy_path() -> Result<(PathBuf, bool)> {
    managed_policy_path_in(
        Path::new(DEFAULT_MANAGED),
        std::env::var_os("AIRLOCK_MANAGED_POLICY").filter(|v| !v.is_empty()),
    )
}

fn managed_policy_path_in(
    default: &Path,
    var: Option<std::ffi::OsString>,
) -> Result<(PathBuf, bool)> {
    let present = match std::fs::symlink_metadata(default) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    };
    let Some(named) = var.map(PathBuf::from) else {
        // Something there that is not readable is loaded as required, so a
        // link to nowhere or a directory is an error rather than "none".
        return Ok((default.to_path_buf(), !matches!(present, Ok(false))));
    };
    match present {
        Ok(false) => Ok((named, true)),
        Ok(true) if same_file(&named, default) => Ok((default.to_path_buf(), true)),
        Ok(true) => bail!(
            "AIRLOCK_MANAGED_POLICY={} is refused: this machine has a managed policy at {}, \
             which the environment cannot replace (SPEC §3.3); unset AIRLOCK_MANAGED_POLICY",
            shown(&named),
            default.display()
        ),
        Err(e) => bail!(
            "AIRLOCK_MANAGED_POLICY={} is refused: whether this machine has a managed policy at {} \
             cannot be told ({e}), and the environment may name one only where there is none; \
             unset AIRLOCK_MANAGED_POLICY",
            shown(&named),
            default.display()
        ),
    }
}

/// Both name the same existing file (device and inode, links followed).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Every path that may hold the managed policy, for protection: it is never
/// writable from inside, whichever of them applies.
pub fn managed_policy_files() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(DEFAULT_MANAGED)];
    out.extend(
        std::env::var_os("AIRLOCK_MANAGED_POLICY")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
    );
    out
}

/// The local CA's directory (`$XDG_DATA_HOME/airlock/ca`).
pub fn ca_dir() -> Result<PathBuf> {
    airlock_ca::default_dir().context("neither XDG_DATA_HOME nor HOME is set")
}

/// `$XDG_STATE_HOME/airlock`, else `~/.local/state/airlock`.
pub fn state_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_STATE_HOME").map(PathBuf::from) {
        Some(d) if d.is_absolute() => Some(d.join("airlock")),
        _ => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/airlock")),
    }
}

/// Where sessions keep their sockets and records:
/// `$XDG_RUNTIME_DIR/airlock` (a tmpfs that every sandbox has hidden
/// under its own `/run`) when that is a directory, else [`state_dir`].
pub fn runtime_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(d) if d.is_absolute() && d.is_dir() => Some(d.join("airlock")),
        _ => state_dir(),
    }
}

/// airlock's own state, which a sandbox must never write (SPEC §3.5, §4.5):
/// held changesets (`changes apply` writes what they hold into the user's
/// tree), sessions' sockets and records, the notices already said. As
/// they resolve now ([`make_own_state_dirs`] makes them first).
pub fn own_state_dirs() -> Vec<PathBuf> {
    let mut out = vec![];
    for d in [state_dir(), runtime_dir()].into_iter().flatten() {
        let d = crate::resolve::canonical(&d).unwrap_or(d);
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Make [`own_state_dirs`] (mode 0700) before a sandbox starts: a
/// read-only bind needs something to cover, and one made while the
/// sandbox runs would lie beside it, writable (HOME a writable root).
pub fn make_own_state_dirs() {
    for d in [state_dir(), runtime_dir()].into_iter().flatten() {
        if let Err(e) = crate::paths::own_private_dir(&d) {
            tracing::warn!("{e:#}");
        }
    }
}

/// Whether a notice about `what` in `workspace` is said for the first
/// time in an hour (and is now recorded as said): a harness runs hundreds
/// of commands there, and a warning on every one of them buries the rest.
pub fn first_time(what: &str, workspace: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let Some(dir) = state_dir().map(|d| d.join("said")) else {
        return true;
    };
    if std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .is_err()
    {
        return true;
    }
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(what.as_bytes());
    ctx.update(&[0]);
    ctx.update(workspace.as_os_str().as_encoded_bytes());
    let key: String = ctx.finish().as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let what: String = what
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(24)
        .collect();
    let path = dir.join(format!("{what}-{key}"));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path);
    match made {
        Ok(_) => true,
        // Said again once its word is stale: the next task in the same
        // workspace (hours later) must hear it too, not only the first.
        Err(_) => std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|f| {
                let age = f.metadata()?.modified()?.elapsed().unwrap_or_default();
                if age < SAID_FOR {
                    return Ok(false);
                }
                f.set_modified(std::time::SystemTime::now())?;
                Ok(true)
            })
            .unwrap_or(false),
    }
}

/// How long a notice said once (`first_time`) stays said.
const SAID_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_a_managed_file_only_where_there_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("managed.toml");
        let other = dir.path().join("other.toml");
        std::fs::write(&other, "").unwrap();
        let var = || Some(other.clone().into_os_string());
        // None there: the variable names it, and must exist.
        assert_eq!(
            managed_policy_path_in(&default, var()).unwrap(),
            (other.clone(), true)
        );
        assert_eq!(
            managed_policy_path_in(&default, None).unwrap(),
            (default.clone(), false)
        );
        // A file, a directory, a link to nowhere: the variable is refused,
        // and without it the entry there is required (read or fail).
        let dangling = dir.path().join("nowhere");
        let makers: [&dyn Fn(&Path); 3] = [
            &|p| std::fs::write(p, "").unwrap(),
            &|p| std::fs::create_dir(p).unwrap(),
            &|p| std::os::unix::fs::symlink(&dangling, p).unwrap(),
        ];
        for make in makers {
            let _ = std::fs::remove_file(&default);
            let _ = std::fs::remove_dir(&default);
            make(&default);
            let e = managed_policy_path_in(&default, var()).unwrap_err();
            assert!(e.to_string().contains("AIRLOCK_MANAGED_POLICY"), "{e}");
            assert_eq!(
                managed_policy_path_in(&default, None).unwrap(),
                (default.clone(), true)
            );
        }
        // The variable naming that very file (through a link) is no replacement.
        std::fs::remove_file(&default).unwrap();
        std::fs::write(&default, "").unwrap();
        let alias = dir.path().join("alias.toml");
        std::os::unix::fs::symlink(&default, &alias).unwrap();
        assert_eq!(
            managed_policy_path_in(&default, Some(alias.into_os_string())).unwrap(),
            (default.clone(), true)
        );
    }
}
