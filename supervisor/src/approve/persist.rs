//! `allow-always`: add the host to the user policy file, keeping its
//! formatting and comments (toml_edit), creating it if missing.

use std::path::Path;

use std::io::Write;

use airlock_policy::Target;
use airlock_proxy::safe_file::{self, Dir, Mode};
use anyhow::{bail, Context, Result};
use toml_edit::{Array, DocumentMut, Item, Table, Value};

/// The pattern an answer allows: the host, with the port unless it is 80/443.
pub fn pattern_for(target: &Target) -> String {
    if target.port == 80 || target.port == 443 {
        target.host.to_string()
    } else {
        target.to_string()
    }
}

/// The user policy's directory, opened before the sandbox starts, and the
/// file's name in it: the answer is written with `*at` calls from that
/// descriptor, never through a link (SPEC §3.5).
pub struct PolicyFile {
    dir: Dir,
    name: String,
    path: std::path::PathBuf,
}

impl PolicyFile {
    pub fn open(path: &Path) -> Result<PolicyFile> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let (dir, name) = safe_file::split(path)?;
        Ok(PolicyFile {
            dir,
            name,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
pub fn allow_always(path: &Path, target: &Target) -> Result<()> {
    allow_always_in(&PolicyFile::open(path)?, target)
}

pub fn allow_always_in(file: &PolicyFile, target: &Target) -> Result<()> {
    let path = &file.path;
    let text = file.dir.read_file(&file.name)?.unwrap_or_default();
    let mut doc: DocumentMut = text
        .parse()
        .with_context(|| format!("{} is not valid TOML", path.display()))?;
    let network = doc
        .entry("network")
        .or_insert_with(|| Item::Table(Table::new()));
    let Some(network) = network.as_table_like_mut() else {
        bail!("{}: [network] is not a table", path.display());
    };
    let allow = network
        .entry("allow")
        .or_insert(Item::Value(Value::Array(Array::new())));
    let Some(list) = allow.as_array_mut() else {
        bail!("{}: network.allow is not an array", path.display());
    };
    let pattern = pattern_for(target);
    if !list.iter().any(|v| v.as_str() == Some(pattern.as_str())) {
        list.push(pattern);
    }
    let tmp = format!("{}.airlock-tmp", file.name);
    let mut out = file.dir.open_file(&tmp, Mode::Replace, 0o600)?;
    let written = out
        .write_all(doc.to_string().as_bytes())
        .and_then(|()| out.sync_all());
    if let Err(e) = written {
        file.dir.remove(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    file.dir.rename(&tmp, &file.name)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_comments_and_adds_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, "# mine\n[network]\nallow = [\"a.test\"] # keep\n").unwrap();
        let t = Target::parse("b.test:443", None).unwrap();
        allow_always(&path, &t).unwrap();
        allow_always(&path, &t).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# mine\n"), "{text}");
        assert!(text.contains("# keep"), "{text}");
        assert_eq!(text.matches("b.test").count(), 1, "{text}");
        let f = airlock_policy::load_str(&text, "p", airlock_policy::Layer::User).unwrap();
        assert_eq!(f.allow.len(), 2);
    }

    #[test]
    fn creates_the_file_with_a_port_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/policy.toml");
        allow_always(&path, &Target::parse("c.test:8443", None).unwrap()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"c.test:8443\""), "{text}");
    }

    #[test]
    fn a_planted_link_is_refused_and_its_target_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let bashrc = dir.path().join("bashrc");
        std::fs::write(&bashrc, "echo hi\n").unwrap();
        let path = dir.path().join("policy.toml");
        std::os::unix::fs::symlink(&bashrc, &path).unwrap();
        let t = Target::parse("b.test:443", None).unwrap();
        assert!(allow_always(&path, &t).is_err());
        std::fs::remove_file(&path).unwrap();
        std::fs::hard_link(&bashrc, &path).unwrap();
        assert!(allow_always(&path, &t).is_err());
        assert_eq!(std::fs::read_to_string(&bashrc).unwrap(), "echo hi\n");
    }
}
