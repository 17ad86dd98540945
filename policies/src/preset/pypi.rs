//! pip and uv: the index from env, pip.conf, uv.toml and pip's built-in
//! default; airlock-owned caches; index passwords kept outside and added
//! by the proxy.

use std::path::{Path, PathBuf};

use super::{config_copy_dir, ini_values, lend_or_say, scrub_urls, ConfigCopy, Probe, Resolved};

/// Variables pip and uv read for their index and TLS, passed when set.
const PASS: &[&str] = &[
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_INDEX",
    "UV_NATIVE_TLS",
    "UV_INSECURE_HOST",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
];

pub(super) fn resolve(p: &dyn Probe, r: &mut Resolved) {
    let mut found_index = false;
    for var in PASS {
        let Some(v) = r.pass_env(p, var) else {
            continue;
        };
        match *var {
            "PIP_INDEX_URL" | "UV_INDEX_URL" | "UV_DEFAULT_INDEX" => {
                r.add_url(&v, format!("${var}"));
                found_index = true;
            }
            "PIP_EXTRA_INDEX_URL" | "UV_EXTRA_INDEX_URL" | "UV_INDEX" => {
                for url in v.split_whitespace() {
                    // UV_INDEX entries may be `name=url`.
                    let url = url.split_once('=').map_or(url, |(_, u)| u);
                    r.add_url(url, format!("${var}"));
                }
            }
            _ => {}
        }
    }
    let (pip_files, uv_files) = config_files(p);
    let workspace_uv = p.workspace().join("uv.toml");
    r.own_cache(p, "PIP_CACHE_DIR", "pip");
    r.own_cache(p, "UV_CACHE_DIR", "uv");
    for file in pip_files.iter().chain(&uv_files).chain([&workspace_uv]) {
        let Some(text) = p.read(file) else { continue };
        for key in ["index-url", "index_url", "default-index"] {
            for (line, v) in ini_values(&text, key) {
                r.add_url(v, format!("{}:{line}", file.display()));
                found_index = true;
            }
        }
        for key in ["extra-index-url", "extra_index_url", "url"] {
            for (line, v) in ini_values(&text, key) {
                for url in v.split_whitespace() {
                    r.add_url(url, format!("{}:{line}", file.display()));
                }
            }
        }
    }
    keep_passwords_outside(p, r, &pip_files, &uv_files);
    if !found_index {
        // pip's own default index and file host, as pip itself defines them.
        let script = "from pip._internal.models.index import PyPI\nprint(PyPI.url)\nprint('https://' + PyPI.file_storage_domain + '/')";
        let out = ["python3", "python"]
            .iter()
            .find_map(|py| p.output(&[py, "-I", "-c", script]));
        match out {
            Some(out) => {
                for line in out.lines() {
                    r.add_url(
                        line,
                        "pip's built-in default (pip._internal.models.index)".into(),
                    );
                }
            }
            None => r.notes.push(
                "pypi: no index configured and pip's default could not be read (is pip installed?)"
                    .into(),
            ),
        }
    }
}

/// pip's and uv's configuration files, in the order they read them (the
/// last one read wins, and so does its copy).
fn config_files(p: &dyn Probe) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut pip_files: Vec<PathBuf> = vec![
        PathBuf::from("/etc/xdg/pip/pip.conf"),
        PathBuf::from("/etc/pip.conf"),
    ];
    let mut uv_files = vec![];
    if let Some(h) = p.home() {
        let config = p
            .env("XDG_CONFIG_HOME")
            .map_or_else(|| h.join(".config"), PathBuf::from);
        pip_files.push(h.join(".pip/pip.conf"));
        pip_files.push(config.join("pip/pip.conf"));
        uv_files.push(config.join("uv/uv.toml"));
    }
    if let Some(v) = p.env("VIRTUAL_ENV") {
        pip_files.push(PathBuf::from(v).join("pip.conf"));
    }
    if let Some(f) = p.env("PIP_CONFIG_FILE") {
        pip_files.push(PathBuf::from(f));
    }
    if let Some(f) = p.env("UV_CONFIG_FILE") {
        uv_files.push(PathBuf::from(f));
    }
    (pip_files, uv_files)
}

/// Each configuration file outside the workspace that holds an index
/// password is hidden, and the last of pip's and of uv's is copied
/// without it for the tool to read; the passwords become credentials.
fn keep_passwords_outside(
    p: &dyn Probe,
    r: &mut Resolved,
    pip_files: &[PathBuf],
    uv_files: &[PathBuf],
) {
    let mut secret_pip = None;
    let mut secret_uv = None;
    for file in pip_files.iter().chain(uv_files) {
        // A project file: the sandbox reads the workspace anyway.
        if file.starts_with(p.workspace()) {
            continue;
        }
        let Some(text) = p.read(file) else { continue };
        if let Some(clean) = without_url_secrets(r, file, &text) {
            r.hide(file, "holds an index password".into());
            let slot = if uv_files.contains(file) {
                &mut secret_uv
            } else {
                &mut secret_pip
            };
            if let Some((old, _)) = slot.replace((file.clone(), clean)) {
                r.notes.push(format!(
                    "pypi: {} is hidden (it holds a password) and only {} is copied without it",
                    old.display(),
                    file.display()
                ));
            }
        }
    }
    for (slot, var, name) in [
        (secret_pip, "PIP_CONFIG_FILE", "pip.conf"),
        (secret_uv, "UV_CONFIG_FILE", "uv.toml"),
    ] {
        let (Some((from, text)), Some(dir)) = (slot, config_copy_dir(p)) else {
            continue;
        };
        let path = dir.join(name);
        r.set_env(
            var,
            path.display().to_string(),
            format!("{} without its password", from.display()),
        );
        r.files.push(ConfigCopy { path, text, from });
    }
}

/// Without the preset: the same files hidden and copied (the caller drops
/// the credentials: nothing adds them back).
pub(super) fn secrets_only(p: &dyn Probe, r: &mut Resolved) {
    let (pip_files, uv_files) = config_files(p);
    keep_passwords_outside(p, r, &pip_files, &uv_files);
}

/// The text with `user:password@` removed from every http(s) URL, each
/// becoming a credential; `None` when there was none.
fn without_url_secrets(r: &mut Resolved, file: &Path, text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut found = false;
    for (i, line) in text.lines().enumerate() {
        let from = format!("{}:{}", file.display(), i + 1);
        let (clean, any) = scrub_urls(line, |s| lend_or_say(r, s, &from));
        found |= any;
        out.push_str(&clean);
        out.push('\n');
    }
    found.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::super::tests::FakeProbe;
    use super::super::{find, secret::basic};

    #[test]
    fn passwords_stay_outside() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.config/pip/pip.conf".into(),
            "[global]\nindex-url = https://me:s3cret@pypi.corp.test/simple\ntimeout = 5\n".into(),
        );
        p.env.insert(
            "UV_INDEX".into(),
            "corp=https://tok:x@uv.corp.test/simple".into(),
        );
        p.env.insert("SSL_CERT_FILE".into(), "/etc/corp.pem".into());
        let r = find("pypi").unwrap().resolve(&p);
        let env = |k: &str| {
            r.env
                .iter()
                .find(|(n, _, _)| n == k)
                .map(|(_, v, _)| v.clone())
        };
        assert_eq!(
            env("UV_INDEX").as_deref(),
            Some("corp=https://uv.corp.test/simple")
        );
        assert_eq!(env("SSL_CERT_FILE").as_deref(), Some("/etc/corp.pem"));
        assert_eq!(
            env("PIP_CACHE_DIR").as_deref(),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/pip")
        );
        assert_eq!(
            env("UV_CACHE_DIR").as_deref(),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/uv")
        );
        assert_eq!(
            env("PIP_CONFIG_FILE").as_deref(),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/config/pip.conf")
        );
        assert_eq!(r.hide[0].0, "/home/u/.config/pip/pip.conf");
        assert_eq!(
            r.files[0].text,
            "[global]\nindex-url = https://pypi.corp.test/simple\ntimeout = 5\n"
        );
        let creds: Vec<_> = r
            .credentials
            .iter()
            .map(|c| (c.host.as_str(), c.value.clone()))
            .collect();
        assert_eq!(
            creds,
            [
                ("uv.corp.test", basic("tok", "x")),
                ("pypi.corp.test", basic("me", "s3cret"))
            ]
        );
        let hosts: Vec<_> = r.hosts.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(hosts, ["uv.corp.test", "pypi.corp.test"]);
    }
}
