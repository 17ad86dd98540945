//! `allow-always`: add the host to the user policy file, keeping its
//! formatting and comments (toml_edit), creating it if missing.

use std::path::Path;

use airlock_policy::Target;
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

pub fn allow_always(path: &Path, target: &Target) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
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
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.airlock-tmp");
    std::fs::write(&tmp, doc.to_string()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
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
}
