//! git over HTTPS: the hosts of this repository's remotes, read from
//! `.git/config` (project configuration, so trusted like the others), and
//! the variables git reads for TLS. ssh remotes cannot go through the
//! proxy; they are named in the notes.

use super::{Probe, Resolved};

const PASS: &[&str] = &[
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

pub(super) fn resolve(p: &dyn Probe, r: &mut Resolved) {
    for var in PASS {
        r.pass_env(p, var);
    }
    let config = p.workspace().join(".git/config");
    let Some(text) = p.read(&config) else {
        r.notes.push(format!(
            "git: {} is absent; allow the remote's host with --allow",
            config.display()
        ));
        return;
    };
    let mut section = String::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if !section.starts_with("[remote ") || !matches!(k.trim(), "url" | "pushurl") {
            continue;
        }
        let (v, from) = (v.trim(), format!("{}:{}", config.display(), i + 1));
        match super::strip_url_secret(v) {
            Some((_, cred)) => {
                r.add_url(v, from.clone());
                if cred.is_some() {
                    r.notes.push(format!(
                        "git: {from}: the remote URL holds a password, which the sandbox can read in .git/config; prefer a credential helper outside"
                    ));
                }
            }
            None => r.notes.push(format!(
                "git: {from}: {v:?} is not an HTTPS remote; only HTTP(S) goes through the proxy"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::super::tests::FakeProbe;

    #[test]
    fn remotes_hosts() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/work/proj/.git/config".into(),
            "[core]\n\tbare = false\n[remote \"origin\"]\n\turl = https://git.corp.test/a/b.git\n[remote \"up\"]\n\turl = git@ssh.test:a/b\n".into(),
        );
        let r = find("git").unwrap().resolve(&p);
        let hosts: Vec<_> = r.hosts.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(hosts, ["git.corp.test"]);
        assert!(r.notes.iter().any(|n| n.contains("not an HTTPS remote")));
    }
}
