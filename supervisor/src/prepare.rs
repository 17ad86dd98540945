//! What `run` does on the host before the sandbox starts, beyond the plan:
//! flags that contradict each other are refused, user-given writable paths
//! must exist, presets' airlock-owned caches are created and their
//! sanitised configuration copies written (SPEC §2, §3.4).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use airlock_policy::{Layer, Located, Origin, Policy};
use anyhow::{bail, Context, Result};

use crate::cli::RunArgs;
use crate::paths::resolve_path;

/// Everything before the plan is built.
pub fn before_run(
    policy: &mut Policy,
    args: &RunArgs,
    home: &Path,
    workspace: &Path,
) -> Result<()> {
    conflicting_flags(args, home, workspace)?;
    for name in &args.pass_env {
        policy.env_pass.push(Located::new(
            name.clone(),
            Layer::CommandLine,
            Origin::Flag {
                flag: format!("--pass-env {name}"),
            },
        ));
    }
    user_writes_exist(policy, &args.write, home, workspace)?;
    // What `policy check` warns about holds at run time too: a credential
    // no allow rule covers is silently never sent.
    for w in crate::policy::never_apply(policy) {
        eprintln!("airlock: warning: {w}");
    }
    for r in &policy.presets {
        for w in &r.warnings {
            eprintln!("airlock: warning: preset {}: {w}", r.name);
        }
        // A preset that allows nothing says why, instead of a later
        // refusal with no context.
        if r.hosts.is_empty() {
            for n in &r.notes {
                eprintln!("airlock: warning: preset {}: {n}", r.name);
            }
        }
        if let Some((dir, project)) = &r.project {
            for cache in &r.caches {
                create_cache(dir, Path::new(cache))
                    .with_context(|| format!("creating preset {}'s cache {cache}", r.name))?;
            }
            record_project(dir, project);
        }
        for copy in &r.files {
            write_copy(&copy.path, &copy.text).with_context(|| {
                format!(
                    "writing preset {}'s copy of {} without its secrets",
                    r.name,
                    copy.from.display()
                )
            })?;
        }
    }
    for copy in &policy.secrets.files {
        write_copy(&copy.path, &copy.text).with_context(|| {
            format!(
                "writing the copy of {} without its secrets",
                copy.from.display()
            )
        })?;
    }
    Ok(())
}

/// Flags that cannot both hold are an error, not a silent winner.
fn conflicting_flags(args: &RunArgs, home: &Path, workspace: &Path) -> Result<()> {
    let network = args.network.as_deref();
    if args.read_only {
        for w in &args.write {
            let p = resolve_path(&w.to_string_lossy(), home, workspace);
            if p.is_some_and(|p| p.starts_with(workspace) || workspace.starts_with(&p)) {
                bail!(
                    "--read-only and --write {} contradict each other: the workspace is read-only, and {} would make (part of) it writable",
                    w.display(),
                    w.display()
                );
            }
        }
    }
    if network == Some("none") && !args.policy.allow.is_empty() {
        bail!("--network none and --allow contradict each other: with no network, nothing can be allowed (use --network proxy, the default)");
    }
    if network == Some("host") && !args.policy.inspect.is_empty() {
        bail!("--network host and --inspect contradict each other: host networking has no proxy to inspect with");
    }
    Ok(())
}

/// A writable path the user named (`--write`, `write = [...]` in a policy
/// file) that does not exist is an error naming it: dropping it silently
/// makes the command fail later with a confusing EACCES.
fn user_writes_exist(
    policy: &Policy,
    extra: &[PathBuf],
    home: &Path,
    workspace: &Path,
) -> Result<()> {
    let named = policy
        .write
        .iter()
        .filter(|w| !matches!(w.origin, Origin::BuiltIn | Origin::Preset { .. }))
        .map(|w| (w.value.clone(), w.origin.to_string()))
        .chain(
            extra
                .iter()
                .map(|p| (p.display().to_string(), "command line --write".to_string())),
        );
    for (raw, origin) in named {
        // Globs are reported by the plan as unsupported.
        let Some(p) = resolve_path(&raw, home, workspace) else {
            continue;
        };
        if std::fs::symlink_metadata(&p).is_err() {
            bail!(
                "writable path {} ({origin}) does not exist: create it first (`mkdir -p {s}` for a directory, `touch {s}` for a file), or remove it",
                crate::text::shown(&p),
                s = crate::text::shown(&p)
            );
        }
    }
    Ok(())
}

/// Create a preset's cache below its project's directory
/// (`<cache base>/projects/<key>`), private to the user, reached without a
/// link from the cache base down: a link there (planted by a sandbox that
/// had HOME writable) could point one project's tool at another project's
/// cache, or at the host's own.
fn create_cache(project_dir: &Path, cache: &Path) -> Result<()> {
    let base = project_dir
        .parent()
        .and_then(Path::parent)
        .context("a project cache directory has no cache base")?;
    let rel = cache
        .strip_prefix(base)
        .context("a preset cache lies outside its project's directory")?;
    create_private_dir(cache)?;
    let real_base = std::fs::canonicalize(base)?;
    let real = std::fs::canonicalize(cache)?;
    if real != real_base.join(rel) {
        bail!(
            "{} resolves to {} through a link; refusing to use it (remove the link)",
            cache.display(),
            real.display()
        );
    }
    Ok(())
}

/// Note in a project's cache directory which project it is for, so that
/// `airlock cache list` can say so. The directory is not writable inside
/// the sandbox (only the caches below it are). Best effort: the caches
/// work without it.
fn record_project(project_dir: &Path, project: &Path) {
    let file = project_dir.join(PROJECT_FILE);
    let text = format!("{}\n", project.display());
    if std::fs::read_to_string(&file).is_ok_and(|t| t == text) {
        return;
    }
    if let Err(e) = write_copy(&file, &text) {
        tracing::warn!("cannot record the project in {}: {e:#}", file.display());
    }
}

/// The file in a project's cache directory naming its project.
pub const PROJECT_FILE: &str = "project";

/// `mkdir -p`, new directories private to the user. An existing path that
/// is not a directory is an error.
fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(())
}

/// Replace `path` with `text` atomically, never following a link: a
/// temporary file created exclusively beside it, then renamed over it (a
/// rename replaces a planted link itself). The directory must be reached
/// without links, so nothing a sandbox planted redirects the write.
fn write_copy(path: &Path, text: &str) -> Result<()> {
    let dir = path
        .parent()
        .context("a configuration copy has no directory")?;
    create_private_dir(dir)?;
    let real = std::fs::canonicalize(dir)?;
    if real != dir {
        bail!(
            "{} resolves to {} through a link; refusing to write there",
            dir.display(),
            real.display()
        );
    }
    let name = path
        .file_name()
        .context("a configuration copy has no name")?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_replaces_a_planted_link_and_not_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        let target = dir.join("target");
        std::fs::write(&target, "keep").unwrap();
        let copy = dir.join("sub/config.toml");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(&target, &copy).unwrap();
        write_copy(&copy, "clean\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "clean\n");
        assert!(!std::fs::symlink_metadata(&copy).unwrap().is_symlink());
        // A directory reached through a link is refused.
        std::os::unix::fs::symlink(dir.join("sub"), dir.join("via")).unwrap();
        assert!(write_copy(&dir.join("via/x"), "y").is_err());
    }
}
