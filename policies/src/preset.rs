//! Presets (SPEC §3.4). A package-manager preset never names its registry:
//! it asks the package manager's own configuration, environment and
//! output, through a `Probe` the caller supplies, so that this crate stays
//! free of I/O and enterprise mirrors work unedited.

use std::path::{Path, PathBuf};

use crate::fragment::Rule;
use crate::pattern::{Pattern, PatternList};
use crate::source::{Layer, Located, Origin};

/// The machine, as presets see it.
pub trait Probe {
    fn env(&self, name: &str) -> Option<String>;
    /// All environment variables (for prefixes such as `CARGO_REGISTRIES_`).
    fn env_vars(&self) -> Vec<(String, String)>;
    fn read(&self, path: &Path) -> Option<String>;
    /// Entries of a directory, by file name.
    fn list_dir(&self, path: &Path) -> Vec<String>;
    /// Run a program and return its stdout, or `None` if it is absent or fails.
    fn output(&self, argv: &[&str]) -> Option<String>;
    fn home(&self) -> Option<PathBuf>;
    fn workspace(&self) -> PathBuf;
}

/// A machine with nothing on it: presets resolve to no hosts. For checks
/// that must not run tools, and for tests and fuzzing.
pub struct Offline;

impl Probe for Offline {
    fn env(&self, _: &str) -> Option<String> {
        None
    }
    fn env_vars(&self) -> Vec<(String, String)> {
        vec![]
    }
    fn read(&self, _: &Path) -> Option<String> {
        None
    }
    fn list_dir(&self, _: &Path) -> Vec<String> {
        vec![]
    }
    fn output(&self, _: &[&str]) -> Option<String> {
        None
    }
    fn home(&self) -> Option<PathBuf> {
        None
    }
    fn workspace(&self) -> PathBuf {
        PathBuf::from("/")
    }
}

pub struct Preset {
    pub name: &'static str,
    pub summary: &'static str,
    resolve: fn(&dyn Probe, &mut Resolved),
}

/// What a preset resolved to: each host with where it was found, and
/// notes on what was looked at and not found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    pub hosts: Vec<(String, String)>,
    /// Directories the tool writes outside the workspace (its caches),
    /// with where each was found.
    pub writes: Vec<(String, String)>,
    pub notes: Vec<String>,
}

impl Resolved {
    fn add(&mut self, pattern: String, from: String) {
        if !self.hosts.iter().any(|(p, _)| *p == pattern) {
            self.hosts.push((pattern, from));
        }
    }

    /// Add the host (and port, when not the scheme's default) of a URL.
    fn add_url(&mut self, url: &str, from: String) {
        let raw = url.trim().trim_matches(['"', '\'']);
        let raw = raw
            .strip_prefix("sparse+")
            .or_else(|| raw.strip_prefix("registry+"))
            .or_else(|| raw.strip_prefix("git+"))
            .unwrap_or(raw);
        match url::Url::parse(raw) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {
                let Some(host) = u.host_str() else { return };
                let pattern = match u.port() {
                    Some(p) => format!("{host}:{p}"),
                    None => host.to_string(),
                };
                if Pattern::parse(&pattern, PatternList::Allow).is_ok() {
                    self.add(pattern, from);
                } else {
                    self.notes.push(format!("{from}: cannot allow {pattern:?}"));
                }
            }
            _ => {}
        }
    }

    fn add_write(&mut self, path: String, from: String) {
        if !path.is_empty() && !self.writes.iter().any(|(p, _)| *p == path) {
            self.writes.push((path, from));
        }
    }

    /// The cache directories as writable-path entries.
    pub fn write_entries(&self, layer: Layer) -> Vec<Located<String>> {
        self.writes
            .iter()
            .map(|(p, from)| {
                Located::new(
                    p.clone(),
                    layer,
                    Origin::Preset {
                        name: self.name.clone(),
                        from: from.clone(),
                    },
                )
            })
            .collect()
    }

    pub fn rules(&self, layer: Layer) -> Vec<Rule> {
        self.hosts
            .iter()
            .filter_map(|(p, from)| {
                Pattern::parse(p, PatternList::Allow).ok().map(|pat| {
                    Located::new(
                        pat,
                        layer,
                        Origin::Preset {
                            name: self.name.clone(),
                            from: from.clone(),
                        },
                    )
                })
            })
            .collect()
    }
}

impl Preset {
    pub fn resolve(&self, probe: &dyn Probe) -> Resolved {
        let mut r = Resolved {
            name: self.name.to_string(),
            hosts: vec![],
            writes: vec![],
            notes: vec![],
        };
        (self.resolve)(probe, &mut r);
        if r.hosts.is_empty() {
            r.notes
                .push(format!("{}: no host found on this machine", self.name));
        }
        r
    }
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "npm",
        summary: "the npm registry configured for npm/pnpm/yarn (env, .npmrc, `npm config get registry`)",
        resolve: npm,
    },
    Preset {
        name: "pypi",
        summary: "the Python package index configured for pip and uv (env, pip.conf, uv.toml, pip's built-in default)",
        resolve: pypi,
    },
    Preset {
        name: "cargo",
        summary: "the Cargo registries configured or cached (env, .cargo/config.toml, the registry index cache)",
        resolve: cargo,
    },
    Preset {
        name: "github",
        summary: "GitHub over HTTPS: git clone/fetch/push, the API and release downloads",
        resolve: github,
    },
];

pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// `key = value` lines of an ini or npmrc file (sections ignored; the keys
/// we look for mean the same in every section that pip and npm read).
fn ini_values<'a>(text: &'a str, key: &'a str) -> impl Iterator<Item = (usize, &'a str)> + 'a {
    text.lines().enumerate().filter_map(move |(i, line)| {
        let line = line.trim();
        if line.starts_with(['#', ';', '[']) {
            return None;
        }
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| (i + 1, v.trim()))
    })
}

fn npm(p: &dyn Probe, r: &mut Resolved) {
    let mut found_default = false;
    for var in ["NPM_CONFIG_REGISTRY", "npm_config_registry"] {
        if let Some(v) = p.env(var) {
            r.add_url(&v, format!("${var}"));
            found_default = true;
        }
    }
    for (k, v) in p.env_vars() {
        let lk = k.to_ascii_lowercase();
        if lk.starts_with("npm_config_@") && lk.ends_with(":registry") {
            r.add_url(&v, format!("${k}"));
        }
    }
    let mut files = vec![p.workspace().join(".npmrc")];
    match p
        .env("NPM_CONFIG_USERCONFIG")
        .or_else(|| p.env("npm_config_userconfig"))
    {
        Some(u) => files.push(PathBuf::from(u)),
        None => files.extend(p.home().map(|h| h.join(".npmrc"))),
    }
    if let Some(g) = p.env("NPM_CONFIG_GLOBALCONFIG") {
        files.push(PathBuf::from(g));
    }
    for file in files {
        let Some(text) = p.read(&file) else { continue };
        for (line, v) in ini_values(&text, "registry") {
            r.add_url(v, format!("{}:{line}", file.display()));
            found_default = true;
        }
        for l in text.lines() {
            if let Some((k, v)) = l.trim().split_once('=') {
                if k.trim().starts_with('@') && k.trim().ends_with(":registry") {
                    r.add_url(v, format!("{} ({})", file.display(), k.trim()));
                }
            }
        }
    }
    match p
        .env("NPM_CONFIG_CACHE")
        .or_else(|| p.env("npm_config_cache"))
    {
        Some(c) => r.add_write(c, "$NPM_CONFIG_CACHE".into()),
        None => {
            if let Some(h) = p.home() {
                r.add_write(
                    h.join(".npm").display().to_string(),
                    "npm's default cache".into(),
                );
            }
        }
    }
    if !found_default {
        match p.output(&["npm", "config", "get", "registry"]) {
            Some(out) => r.add_url(out.trim(), "`npm config get registry`".into()),
            None => r
                .notes
                .push("npm: `npm config get registry` did not run (is npm installed?)".into()),
        }
    }
}

fn pypi(p: &dyn Probe, r: &mut Resolved) {
    let mut found_index = false;
    for var in ["PIP_INDEX_URL", "UV_INDEX_URL", "UV_DEFAULT_INDEX"] {
        if let Some(v) = p.env(var) {
            r.add_url(&v, format!("${var}"));
            found_index = true;
        }
    }
    for var in ["PIP_EXTRA_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX"] {
        if let Some(v) = p.env(var) {
            for url in v.split_whitespace() {
                // UV_INDEX entries may be `name=url`.
                let url = url.split_once('=').map_or(url, |(_, u)| u);
                r.add_url(url, format!("${var}"));
            }
        }
    }
    let mut files: Vec<PathBuf> = vec![
        PathBuf::from("/etc/pip.conf"),
        PathBuf::from("/etc/xdg/pip/pip.conf"),
    ];
    if let Some(h) = p.home() {
        let config = p
            .env("XDG_CONFIG_HOME")
            .map_or_else(|| h.join(".config"), PathBuf::from);
        files.push(h.join(".pip/pip.conf"));
        files.push(config.join("pip/pip.conf"));
        files.push(config.join("uv/uv.toml"));
    }
    if let Some(v) = p.env("VIRTUAL_ENV") {
        files.push(PathBuf::from(v).join("pip.conf"));
    }
    if let Some(f) = p.env("PIP_CONFIG_FILE") {
        files.push(PathBuf::from(f));
    }
    files.push(p.workspace().join("uv.toml"));
    match p.env("PIP_CACHE_DIR") {
        Some(c) => r.add_write(c, "$PIP_CACHE_DIR".into()),
        None => {
            let cache = p
                .env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| p.home().map(|h| h.join(".cache")));
            if let Some(c) = cache {
                r.add_write(
                    c.join("pip").display().to_string(),
                    "pip's default cache".into(),
                );
                r.add_write(
                    c.join("uv").display().to_string(),
                    "uv's default cache".into(),
                );
            }
        }
    }
    for file in files {
        let Some(text) = p.read(&file) else { continue };
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

fn cargo(p: &dyn Probe, r: &mut Resolved) {
    for (k, v) in p.env_vars() {
        if k.starts_with("CARGO_REGISTRIES_") && k.ends_with("_INDEX")
            || k == "CARGO_REGISTRY_INDEX"
        {
            r.add_url(&v, format!("${k}"));
        }
    }
    let cargo_home = p
        .env("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| p.home().map(|h| h.join(".cargo")));
    let mut files = vec![];
    let mut dir = Some(p.workspace());
    while let Some(d) = dir {
        files.push(d.join(".cargo/config.toml"));
        files.push(d.join(".cargo/config"));
        dir = d.parent().map(Path::to_path_buf);
    }
    if let Some(h) = &cargo_home {
        files.push(h.join("config.toml"));
        files.push(h.join("config"));
    }
    for file in files {
        let Some(text) = p.read(&file) else { continue };
        for key in ["index", "registry"] {
            for (line, v) in ini_values(&text, key) {
                r.add_url(v, format!("{}:{line}", file.display()));
            }
        }
    }
    // Registries cargo has already used: the index cache is named
    // `<host>-<hash>` and holds the registry's config.json (download and
    // API hosts).
    let Some(h) = cargo_home else {
        r.notes
            .push("cargo: neither CARGO_HOME nor HOME is set".into());
        return;
    };
    let index = h.join("registry/index");
    let dirs = p.list_dir(&index);
    if dirs.is_empty() && r.hosts.is_empty() {
        r.notes.push(format!(
            "cargo: no registry configured and none cached in {}; run `cargo fetch` once outside the sandbox or set CARGO_REGISTRIES_<NAME>_INDEX",
            index.display()
        ));
    }
    for d in dirs {
        let Some((host, hash)) = d.rsplit_once('-') else {
            continue;
        };
        if hash.len() != 16 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        r.add_url(
            &format!("https://{host}/"),
            format!("{}", index.join(&d).display()),
        );
        let cfg = index.join(&d).join("config.json");
        if let Some(text) = p.read(&cfg) {
            for key in ["\"dl\"", "\"api\""] {
                if let Some(url) = json_string_after(&text, key) {
                    r.add_url(&url, format!("{}", cfg.display()));
                }
            }
        }
    }
}

/// The string value after `"key":` in a small flat JSON object.
fn json_string_after(text: &str, key: &str) -> Option<String> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

fn github(_: &dyn Probe, r: &mut Resolved) {
    for host in [
        "github.com",
        "api.github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
        "raw.githubusercontent.com",
        "release-assets.githubusercontent.com",
    ] {
        r.add(host.to_string(), "built-in list".into());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A machine made of maps, so preset discovery is testable.
    #[derive(Default)]
    pub struct FakeProbe {
        pub env: BTreeMap<String, String>,
        pub files: BTreeMap<PathBuf, String>,
        pub outputs: BTreeMap<String, String>,
    }

    impl Probe for FakeProbe {
        fn env(&self, name: &str) -> Option<String> {
            self.env.get(name).cloned()
        }
        fn env_vars(&self) -> Vec<(String, String)> {
            self.env.clone().into_iter().collect()
        }
        fn read(&self, path: &Path) -> Option<String> {
            self.files.get(path).cloned()
        }
        fn list_dir(&self, path: &Path) -> Vec<String> {
            self.files
                .keys()
                .filter_map(|k| k.strip_prefix(path).ok())
                .filter_map(|rest| rest.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect()
        }
        fn output(&self, argv: &[&str]) -> Option<String> {
            self.outputs.get(&argv.join(" ")).cloned()
        }
        fn home(&self) -> Option<PathBuf> {
            Some(PathBuf::from("/home/u"))
        }
        fn workspace(&self) -> PathBuf {
            PathBuf::from("/work/proj")
        }
    }

    fn hosts(r: &Resolved) -> Vec<&str> {
        r.hosts.iter().map(|(h, _)| h.as_str()).collect()
    }

    #[test]
    fn npm_prefers_env_and_files_over_asking_npm() {
        let mut p = FakeProbe::default();
        p.env.insert(
            "NPM_CONFIG_REGISTRY".into(),
            "https://mirror.corp.test/npm/".into(),
        );
        p.files.insert(
            "/home/u/.npmrc".into(),
            "; comment\n@acme:registry=https://npm.acme.test:8443/\n".into(),
        );
        let r = find("npm").unwrap().resolve(&p);
        assert_eq!(hosts(&r), ["mirror.corp.test", "npm.acme.test:8443"]);
        assert_eq!(r.hosts[0].1, "$NPM_CONFIG_REGISTRY");
    }

    #[test]
    fn npm_asks_npm_when_unconfigured() {
        let mut p = FakeProbe::default();
        p.outputs.insert(
            "npm config get registry".into(),
            "https://registry.example.test/\n".into(),
        );
        let r = find("npm").unwrap().resolve(&p);
        assert_eq!(hosts(&r), ["registry.example.test"]);
        let empty = find("npm").unwrap().resolve(&FakeProbe::default());
        assert!(empty.hosts.is_empty() && !empty.notes.is_empty());
    }

    #[test]
    fn pypi_reads_pip_conf_and_env() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/etc/pip.conf".into(),
            "[global]\nindex-url = https://pypi.corp.test/simple\nextra-index-url = https://extra.corp.test/simple\n".into(),
        );
        p.env.insert(
            "UV_INDEX".into(),
            "internal=https://uv.corp.test/simple".into(),
        );
        let r = find("pypi").unwrap().resolve(&p);
        assert_eq!(
            hosts(&r),
            ["uv.corp.test", "pypi.corp.test", "extra.corp.test"]
        );
        assert_eq!(r.hosts[1].1, "/etc/pip.conf:2");
    }

    #[test]
    fn pypi_falls_back_to_what_pip_says() {
        let mut p = FakeProbe::default();
        p.outputs.insert(
            "python3 -I -c from pip._internal.models.index import PyPI\nprint(PyPI.url)\nprint('https://' + PyPI.file_storage_domain + '/')".into(),
            "https://index.example.test/\nhttps://files.example.test/\n".into(),
        );
        let r = find("pypi").unwrap().resolve(&p);
        assert_eq!(hosts(&r), ["index.example.test", "files.example.test"]);
    }

    #[test]
    fn cargo_reads_env_config_and_index_cache() {
        let mut p = FakeProbe::default();
        p.env.insert(
            "CARGO_REGISTRIES_CORP_INDEX".into(),
            "sparse+https://cargo.corp.test/index/".into(),
        );
        p.files.insert(
            "/home/u/.cargo/registry/index/idx.example.test-0123456789abcdef/config.json".into(),
            "{\"dl\": \"https://dl.example.test/crates\", \"api\": \"https://api.example.test\"}"
                .into(),
        );
        p.files.insert(
            "/work/proj/.cargo/config.toml".into(),
            "[source.mirror]\nregistry = \"sparse+https://mirror.corp.test/\"\n".into(),
        );
        let r = find("cargo").unwrap().resolve(&p);
        assert_eq!(
            hosts(&r),
            [
                "cargo.corp.test",
                "mirror.corp.test",
                "idx.example.test",
                "dl.example.test",
                "api.example.test"
            ]
        );
    }
}
