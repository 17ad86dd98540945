//! Registry credentials in a project's own tool configuration (SPEC §3.4;
//! red team round 14): npm, yarn, cargo, pip and uv read a `.npmrc`,
//! `.yarnrc.yml`, `.cargo/config.toml`, `uv.toml` or `pip.conf` from the
//! project, and a token written there was readable inside. Such a file is
//! covered, read-only, by a copy without the credential (its other
//! settings, a registry's URL above all, still apply), as the user's own
//! copies in HOME are. Files that are nothing but credentials (`.netrc`,
//! `.pypirc`, `.git-credentials`, …) found at the top of a writable root
//! are hidden whole.
//!
//! Looked for at the top of each writable root and in the directory where
//! the command starts and every one above it (where these tools look).
//! HOME's own are the presets' (`policies/src/preset`), and left to them.

use std::path::{Path, PathBuf};

/// Files whose credentials are cut out, by their path below a directory.
const CONFIGS: &[&str] = &[
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".cargo/config.toml",
    ".cargo/config",
    "uv.toml",
    "pip.conf",
    ".venv/pip.conf",
    "venv/pip.conf",
    // Red team round 16: more files tools read from a project.
    "pyproject.toml",
    "poetry.toml",
    "bunfig.toml",
    ".bundle/config",
    "auth.json",
    "nuget.config",
    "NuGet.Config",
    "gradle.properties",
    ".cargo/credentials.toml",
    ".cargo/credentials",
];

/// Files that hold nothing but credentials, hidden whole where found.
pub const WHOLE: &[&str] = &[
    ".netrc",
    ".pypirc",
    ".git-credentials",
    ".docker/config.json",
    ".aws/credentials",
    ".gem/credentials",
    ".vault-token",
    ".terraformrc",
    ".pgpass",
    ".my.cnf",
];

/// Whether `name` in `dir` is one of the files looked into.
pub fn is_config(dir: &Path, name: &std::ffi::OsStr) -> bool {
    let Some(n) = name.to_str() else { return false };
    CONFIGS.iter().any(|c| match c.rsplit_once('/') {
        Some((d, f)) => f == n && dir.file_name().is_some_and(|x| x == d),
        None => *c == n,
    })
}

/// What was found: (file, the copy's text without its credentials), and
/// the whole-credential files.
#[derive(Default)]
pub struct Found {
    pub sanitised: Vec<(PathBuf, String)>,
    pub whole: Vec<PathBuf>,
}

/// The directories looked in: each root's top, and `cwd` and every
/// directory above it (cargo reads a `.cargo/config.toml` in each).
fn dirs(roots: &[PathBuf], cwd: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = roots.to_vec();
    out.extend(cwd.ancestors().map(Path::to_path_buf));
    out.sort();
    out.dedup();
    out
}

/// `more`: files the `.env` search met below the roots.
pub fn find(roots: &[PathBuf], cwd: &Path, more: &[PathBuf]) -> Found {
    let mut found = Found::default();
    let mut candidates: Vec<(PathBuf, &str)> = vec![];
    for dir in dirs(roots, cwd) {
        for name in CONFIGS {
            candidates.push((dir.join(name), name));
        }
    }
    for p in more {
        if let Some(name) = CONFIGS.iter().find(|c| p.ends_with(c)) {
            candidates.push((p.clone(), name));
        }
    }
    candidates.sort();
    candidates.dedup();
    for (p, name) in candidates {
        // A link is covered where it leads, which both names then show
        // (red team round 16: a top-level link read in full).
        let p = match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(&p) {
                Ok(t) => t,
                Err(_) => continue,
            },
            Ok(_) => p,
            Err(_) => continue,
        };
        let Ok(bytes) = crate::paths::read_no_follow(&p) else {
            continue;
        };
        let text = match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                // Not text: nothing to cut from it with certainty.
                if residual(&String::from_utf8_lossy(e.as_bytes())) {
                    found.whole.push(p);
                }
                continue;
            }
        };
        if whole_by_kind(name, &text) {
            found.whole.push(p);
            continue;
        }
        match sanitise(name, &text) {
            // What the cut missed (a syntax it does not know): the file
            // is hidden whole rather than shown with a credential in it.
            Some(clean) if residual(&clean) => found.whole.push(p),
            Some(clean) => found.sanitised.push((p, clean)),
            None if residual(&text) => found.whole.push(p),
            None => {}
        }
    }
    for root in roots {
        for name in WHOLE {
            let p = root.join(name);
            if std::fs::symlink_metadata(&p)
                .is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
            {
                found.whole.push(p);
            }
        }
    }
    found.sanitised.sort();
    found.sanitised.dedup_by(|a, b| a.0 == b.0);
    found.whole.sort();
    found.whole.dedup();
    found
}

/// Files whose credentials take forms no line cut can be sure of (XML,
/// JSON, a `user:password` value, a section of tokens): hidden whole when
/// they hold one at all (red team round 17).
fn whole_by_kind(name: &str, text: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    let lower = text.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    match file {
        "nuget.config" | "NuGet.Config" => any(&["password", "apikey", "token"]),
        "auth.json" => any(&[
            "oauth",
            "bearer",
            "password",
            "token",
            "http-basic",
            "gitlab",
            "bitbucket",
        ]),
        "poetry.toml" => any(&["pypi-token", "http-basic", "password", "token"]),
        // `BUNDLE_<HOST>: "user:password"`: a value with a colon that is
        // no URL.
        "config" if name.starts_with(".bundle/") => text.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                let v = v.trim().trim_matches(['"', '\'']);
                k.trim().starts_with("BUNDLE_") && v.contains(':') && !v.contains("://")
            })
        }),
        "gradle.properties" => text.lines().any(|l| {
            let t = l.trim_start();
            !t.starts_with(['#', '!'])
                && t.split_once(['=', ':']).is_some_and(|(k, _)| {
                    let k = k.trim().to_ascii_lowercase();
                    ["pass", "token", "secret", "key", "credential"]
                        .iter()
                        .any(|w| k.contains(w))
                })
        }),
        _ => false,
    }
}

/// Whether text (a copy, or a file the cut left alone) still looks as if
/// it held a credential: a key that names one given a value, a password
/// in a URL, or a token of a known shape.
fn residual(text: &str) -> bool {
    text.lines().any(|line| {
        let t = line.trim_start();
        if t.starts_with(['#', ';']) || t.starts_with("//") && !t.contains('=') {
            return false;
        }
        let lower = t.to_ascii_lowercase();
        let keyed = [
            "token", "_auth", "password", "passwd", "secret", "apikey", "api_key",
        ]
        .iter()
        .any(|k| {
            lower.find(k).is_some_and(|i| {
                let rest = &lower[i + k.len()..];
                let rest = rest.trim_start_matches(|c: char| {
                    c.is_alphanumeric() || c == '_' || c == '"' || c == '\''
                });
                rest.trim_start().starts_with(['=', ':'])
            })
        });
        keyed || airlock_policy::env::secret_value(t)
    })
}

/// `text` without its credentials, when it holds any.
pub fn sanitise(name: &str, text: &str) -> Option<String> {
    let file = name.rsplit('/').next().unwrap_or(name);
    let mut changed = false;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        // A credential commented out is a credential still.
        let comment = trimmed.starts_with(['#', ';']);
        let lower = trimmed.to_ascii_lowercase();
        let kept = match file {
            ".npmrc" | ".yarnrc" => {
                // npm's ini reads a quoted key as the key inside.
                let key = trimmed.split(['=', ' ']).next().unwrap_or("").trim();
                let key = key.trim_matches(['"', '\'']);
                let secret = ["_authtoken", "_auth", "_password", "certfile", "keyfile"]
                    .iter()
                    .any(|k| key.to_ascii_lowercase().ends_with(k))
                    || (comment
                        && ["_auth", "_password", "token"]
                            .iter()
                            .any(|w| lower.contains(w)));
                (!secret).then(|| without_url_credentials(line))
            }
            ".yarnrc.yml" => {
                let key = trimmed
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(['"', '\'']);
                let secret = matches!(key, "npmAuthToken" | "npmAuthIdent" | "npmPassword")
                    || (comment && (lower.contains("npmauth") || lower.contains("token")));
                (!secret).then(|| without_url_credentials(line))
            }
            "config.toml" | "config" => {
                let key = trimmed
                    .split('=')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_matches(['"', '\'']);
                let secret = matches!(key, "token" | "secret-key" | "secret_key")
                    || key.ends_with(".token")
                    || (comment && lower.contains("token"));
                (!secret).then(|| without_url_credentials(line))
            }
            _ => Some(without_url_credentials(line)),
        };
        match kept {
            Some(l) if l == line => out.push_str(line),
            Some(l) => {
                changed = true;
                out.push_str(&l);
            }
            None => {
                changed = true;
                out.push_str("# (a credential airlock keeps outside the sandbox)\n");
            }
        }
    }
    changed.then_some(out)
}

/// `scheme://user:password@host` with the `user:password@` cut out.
fn without_url_credentials(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail.find(['/', ' ', '"', '\'', '\n']).unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(i) => rest = &tail[i + 1..],
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_cut_and_the_rest_kept() {
        let npmrc = "registry=https://npm.corp.test/\n//npm.corp.test/:_authToken=SECRET\n_auth = U0VDUkVU\nfund=false\n\"//x.test/:_authToken\"=SECRET2\n# //old.test/:_authToken=SECRET3\n@s:registry=https://u:SECRET4@s.test/\n";
        let s = sanitise(".npmrc", npmrc).unwrap();
        assert!(s.contains("registry=https://npm.corp.test/") && s.contains("fund=false"));
        assert!(s.contains("@s:registry=https://s.test/"), "{s}");
        assert!(!s.contains("SECRET") && !s.contains("U0VDUkVU"), "{s}");
        let yarn = "npmRegistryServer: \"https://npm.corp.test\"\nnpmAuthToken: SECRET\n";
        let s = sanitise(".yarnrc.yml", yarn).unwrap();
        assert!(
            s.contains("npmRegistryServer") && !s.contains("SECRET"),
            "{s}"
        );
        let cargo = "[registries.corp]\nindex = \"sparse+https://c.test/\"\ntoken = \"SECRET\"\n";
        let s = sanitise(".cargo/config.toml", cargo).unwrap();
        assert!(s.contains("index =") && !s.contains("SECRET"), "{s}");
        let uv = "[[index]]\nurl = \"https://user:SECRET@pypi.corp.test/simple\"\n";
        let s = sanitise("uv.toml", uv).unwrap();
        assert!(
            s.contains("https://pypi.corp.test/simple") && !s.contains("SECRET"),
            "{s}"
        );
        let pip = "[global]\nindex-url = https://u:SECRET@p.test/simple\n";
        assert!(!sanitise(".venv/pip.conf", pip).unwrap().contains("SECRET"));
        // Nothing to cut: no copy.
        assert!(sanitise(".npmrc", "registry=https://r.test/\n").is_none());
        // What the cut does not know is caught after it (red team round 16).
        let inline = "[registries]\ncorp = { index = \"https://c.test/\", token = \"SECRET\" }\n";
        assert!(residual(
            &sanitise(".cargo/config.toml", inline).unwrap_or_else(|| inline.into())
        ));
        assert!(residual("npmAuthToken:\n  SECRET\n") || residual("npmAuthToken: \"SECRET\"\n"));
        assert!(!residual(
            "registry=https://r.test/\n# (a credential airlock keeps outside the sandbox)\n"
        ));
        assert!(!residual("[build]\njobs = 4\n"));
        // Forms only the whole file can be judged by (red team round 17).
        for (name, text) in [
            (".bundle/config", "BUNDLE_GEMS__CORP__TEST: \"user:pass\"\n"),
            (
                "nuget.config",
                "<add key=\"ClearTextPassword\" value=\"x\" />\n",
            ),
            ("auth.json", "{\"github-oauth\": {\"github.com\": \"x\"}}\n"),
            ("gradle.properties", "gpr.key=x\nmavenPass=y\n"),
            ("poetry.toml", "[pypi-token]\npypi = \"x\"\n"),
        ] {
            assert!(whole_by_kind(name, text), "{name}");
        }
        assert!(!whole_by_kind(
            ".bundle/config",
            "BUNDLE_PATH: \"vendor/bundle\"\n"
        ));
        assert!(!whole_by_kind(
            "gradle.properties",
            "org.gradle.jvmargs=-Xmx2g\n"
        ));
        assert!(sanitise("uv.toml", "url = \"https://p.test/simple\"\n").is_none());
    }
}
