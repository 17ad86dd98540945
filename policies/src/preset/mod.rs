//! Presets (SPEC §3.4). A package-manager preset never names its registry:
//! it asks the package manager's own configuration, environment and
//! output, through a `Probe` the caller supplies, so that this crate stays
//! free of I/O and enterprise mirrors work unedited.
//!
//! A preset is the whole recipe for its tool: the hosts, the variables the
//! tool reads for registries and CA certificates (without secrets), caches
//! owned by airlock, and the registry credentials kept outside the sandbox
//! and added by the proxy. One module per tool.

mod cargo;
mod git;
mod go;
mod npm;
mod pypi;
mod secret;

use std::path::{Path, PathBuf};

use crate::fragment::Rule;
use crate::pattern::{Pattern, PatternList};
use crate::source::{Layer, Located, Origin};

pub use secret::{basic, strip_bare_userinfo, strip_url_secret};
use secret::{scrub_urls, UrlSecret};

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
    /// The project the run belongs to, canonical and found outside every
    /// sandbox (the workspace's git top-level, else the workspace): its
    /// airlock-owned caches are its own (`project_cache`). `None`: no
    /// project is known, and presets point tools at no cache rather than
    /// at one another project shares.
    fn project(&self) -> Option<PathBuf> {
        None
    }
    /// Run a program with these extra variables, with a proxy that
    /// refuses every connection, and return where it tried to connect
    /// (`host:port`, in order, without repeats). For a tool whose
    /// configuration names no registry on an empty machine: its built-in
    /// default is learned from what it does, not from a list in airlock.
    fn observe(&self, _argv: &[&str], _env: &[(&str, &str)]) -> Vec<String> {
        vec![]
    }
    /// The path with every link resolved (where a program really lies, as
    /// the program itself sees it); `None` when it does not exist.
    fn real_path(&self, _path: &Path) -> Option<PathBuf> {
        None
    }
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

/// A registry credential the proxy adds on the way out, so the sandbox
/// never holds it. Its value is never printed (`Debug` hides it).
#[derive(Clone, PartialEq, Eq)]
pub struct PresetCredential {
    /// Host pattern (`host` or `host:port`).
    pub host: String,
    pub header: String,
    pub value: String,
    /// Where it was found.
    pub from: String,
}

impl std::fmt::Debug for PresetCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PresetCredential({} {}: <hidden> from {})",
            self.host, self.header, self.from
        )
    }
}

/// A sanitised copy of a tool configuration file that the caller writes
/// before the run, outside every writable root; the tool is pointed at it
/// while the original (which holds a secret) is hidden.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigCopy {
    pub path: PathBuf,
    pub text: String,
    /// The original it replaces.
    pub from: PathBuf,
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
    /// The airlock-owned caches among `writes`: created when missing.
    pub caches: Vec<String>,
    /// This project's cache directory (`<cache base>/projects/<key>`) and
    /// the project it belongs to, when a cache was set: the caller records
    /// the project there so the directory can be told apart later.
    pub project: Option<(PathBuf, PathBuf)>,
    /// Variables set inside the sandbox: (name, value, where it came from).
    /// Values never hold a secret.
    pub env: Vec<(String, String, String)>,
    /// Files holding a secret, hidden inside the sandbox, with why.
    pub hide: Vec<(String, String)>,
    /// Credentials the proxy adds (inspecting their hosts).
    pub credentials: Vec<PresetCredential>,
    /// Sanitised configuration copies the caller writes before the run.
    pub files: Vec<ConfigCopy>,
    pub notes: Vec<String>,
    /// What the user must hear at every run start, whatever else the
    /// preset allows (a password found but not lent).
    pub warnings: Vec<String>,
    /// Host variables a credential was read from (npm's `${NAME}` in a
    /// token): withheld from the sandbox whatever their names, as the
    /// variables a `[[network.credential]]` reads are.
    pub withheld_env: Vec<String>,
}

impl Resolved {
    fn empty(name: &str) -> Resolved {
        Resolved {
            name: name.to_string(),
            hosts: vec![],
            writes: vec![],
            caches: vec![],
            project: None,
            env: vec![],
            hide: vec![],
            credentials: vec![],
            files: vec![],
            notes: vec![],
            warnings: vec![],
            withheld_env: vec![],
        }
    }

    fn add(&mut self, pattern: String, from: String) {
        if !self.hosts.iter().any(|(p, _)| *p == pattern) {
            self.hosts.push((pattern, from));
        }
    }

    /// Add the host (and port, when not the scheme's default) of a URL.
    fn add_url(&mut self, url: &str, from: String) {
        if let Some(pattern) = url_host(url) {
            if Pattern::parse(&pattern, PatternList::Allow).is_ok() {
                self.add(pattern, from);
            } else {
                self.notes.push(format!("{from}: cannot allow {pattern:?}"));
            }
        }
    }

    fn add_write(&mut self, path: String, from: String) {
        if !path.is_empty() && !self.writes.iter().any(|(p, _)| *p == path) {
            self.writes.push((path, from));
        }
    }

    /// Point the tool at an airlock-owned cache
    /// `<cache base>/projects/<key>/<sub>` through `var`: writable, created
    /// when missing, never a directory the host's own tool reads, and never
    /// one another project's sandbox wrote (SPEC §3.4).
    fn own_cache(&mut self, p: &dyn Probe, var: &str, sub: &str) {
        let (Some(base), Some(project)) = (project_cache(p), p.project()) else {
            self.notes.push(format!(
                "{}: no project or no cache directory (neither XDG_CACHE_HOME nor HOME is set); no cache for {var}",
                self.name
            ));
            return;
        };
        self.project = Some((base.clone(), project));
        let dir = base.join(sub).display().to_string();
        self.add_write(dir.clone(), "airlock's own cache".into());
        if !self.caches.contains(&dir) {
            self.caches.push(dir.clone());
        }
        self.set_env(var, dir, "airlock's own cache".into());
    }

    fn set_env(&mut self, name: &str, value: String, from: String) {
        self.env.retain(|(n, _, _)| n != name);
        self.env.push((name.to_string(), value, from));
    }

    /// Pass the host's `name` into the sandbox when set. A URL inside it
    /// loses its `user:password@`, which becomes a credential the proxy
    /// adds on that URL's host; a value that is itself a secret is not
    /// passed. Returns the value as passed.
    fn pass_env(&mut self, p: &dyn Probe, name: &str) -> Option<String> {
        let raw = p.env(name)?;
        let from = format!("${name}");
        // Lists are separated by spaces (PIP_EXTRA_INDEX_URL), commas and
        // pipes (GOPROXY); each word is cleaned on its own.
        let mut value = String::with_capacity(raw.len());
        for word in raw.split_inclusive([' ', ',', '|']) {
            let (word, sep) = match word.char_indices().last() {
                Some((i, ' ' | ',' | '|')) => (&word[..i], &word[i..]),
                _ => (word, ""),
            };
            // `name=url` (UV_INDEX) keeps its name.
            let (prefix, url) = match word.split_once('=') {
                Some((n, u)) if u.contains("://") => (&word[..=n.len()], u),
                _ => ("", word),
            };
            match strip_url_secret(url) {
                Some((stripped, cred)) => {
                    if let Some(c) = cred {
                        self.url_credential(url, c, from.clone());
                    }
                    value.push_str(prefix);
                    value.push_str(&stripped);
                }
                None => value.push_str(word),
            }
            value.push_str(sep);
        }
        // What the URL rewrite cannot clean (a non-http URL's password, a
        // bare token) stays outside, said aloud.
        if crate::env::secret_value(&value) {
            self.notes.push(format!(
                "{from} holds a credential that cannot be added by the proxy; not passed"
            ));
            return None;
        }
        self.set_env(name, value.clone(), from);
        Some(value)
    }

    fn withhold_env(&mut self, names: Vec<String>) {
        for n in names {
            if !self.withheld_env.contains(&n) {
                self.withheld_env.push(n);
            }
        }
    }

    fn hide(&mut self, path: &Path, why: String) {
        let s = path.display().to_string();
        if !self.hide.iter().any(|(p, _)| *p == s) {
            self.hide.push((s, why));
        }
    }

    /// A password found in a URL: lent when the URL is https; over plain
    /// http the proxy never adds credentials (it cannot keep them from the
    /// wire), so it is withheld and the user is told why the index will
    /// answer 401.
    fn url_credential(&mut self, url: &str, c: PresetCredential, from: String) {
        let raw = url.trim().trim_start_matches("sparse+");
        if raw.len() >= 7 && raw[..7].eq_ignore_ascii_case("http://") {
            self.warnings.push(format!(
                "{from}: the password for the plain-http index on {} is withheld: airlock lends credentials over HTTPS only, so that index will answer 401 (use its https:// URL)",
                c.host
            ));
            return;
        }
        self.credential(c.host, &c.header, c.value, from);
    }

    fn credential(&mut self, host: String, header: &str, value: String, from: String) {
        // Policy credential values expand `${env:NAME}`; a token holding
        // `${` cannot be carried literally, so it is left out, said aloud.
        if value.contains("${") {
            self.notes.push(format!(
                "{from}: the credential for {host} holds \"${{\"; not added"
            ));
            return;
        }
        if Pattern::parse(&host, PatternList::Allow).is_err() {
            self.notes
                .push(format!("{from}: cannot add a credential for {host:?}"));
            return;
        }
        self.credentials
            .retain(|c| !(c.host == host && c.header == header));
        self.credentials.push(PresetCredential {
            host,
            header: header.to_string(),
            value,
            from,
        });
    }

    /// The cache directories as writable-path entries.
    pub fn write_entries(&self, layer: Layer) -> Vec<Located<String>> {
        self.writes
            .iter()
            .map(|(p, from)| Located::new(p.clone(), layer, self.origin(from)))
            .collect()
    }

    /// The hidden files as `deny_read` entries.
    pub fn deny_read_entries(&self, layer: Layer) -> Vec<Located<String>> {
        self.hide
            .iter()
            .map(|(p, from)| Located::new(p.clone(), layer, self.origin(from)))
            .collect()
    }

    /// The variables as `[env] set` entries.
    pub fn env_entries(&self, layer: Layer) -> Vec<(String, Located<String>)> {
        self.env
            .iter()
            .map(|(k, v, from)| (k.clone(), Located::new(v.clone(), layer, self.origin(from))))
            .collect()
    }

    /// The credentials as `[[network.credential]]` entries (none holds `${`,
    /// so none is expanded).
    pub fn credential_entries(&self, layer: Layer) -> Vec<crate::request::Credential> {
        self.credentials
            .iter()
            .filter_map(|c| {
                let host = Pattern::parse(&c.host, PatternList::Allow).ok()?;
                Some(crate::request::Credential {
                    host,
                    header: c.header.clone(),
                    value: c.value.clone(),
                    origin: Located::new((), layer, self.origin(&c.from)),
                    // Discovered: lent to reads only (SPEC §3.4).
                    methods: vec![],
                })
            })
            .collect()
    }

    fn origin(&self, from: &str) -> Origin {
        Origin::Preset {
            name: self.name.clone(),
            from: from.to_string(),
        }
    }

    pub fn rules(&self, layer: Layer) -> Vec<Rule> {
        self.hosts
            .iter()
            .filter_map(|(p, from)| {
                Pattern::parse(p, PatternList::Allow)
                    .ok()
                    .map(|pat| Located::new(pat, layer, self.origin(from)))
            })
            .collect()
    }
}

/// A password found in a URL of a configuration file: lent when it is an
/// http(s) URL's (see `url_credential`), otherwise said aloud: it is
/// removed from the copy and nothing adds it.
fn lend_or_say(r: &mut Resolved, s: UrlSecret<'_>, from: &str) {
    match s.credential {
        Some(c) => r.url_credential(s.url, c, from.to_string()),
        None => r.warnings.push(format!(
            "{from}: a password in a URL is left out of the sandbox's copy, and nothing adds it"
        )),
    }
}

/// `host` or `host:port` (when not the scheme's default) of an http(s) URL,
/// after the prefixes cargo puts in front of index URLs.
pub fn url_host(url: &str) -> Option<String> {
    let raw = url.trim().trim_matches(['"', '\'']);
    let raw = raw
        .strip_prefix("sparse+")
        .or_else(|| raw.strip_prefix("registry+"))
        .or_else(|| raw.strip_prefix("git+"))
        .unwrap_or(raw);
    let u = url::Url::parse(raw).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    let host = u.host_str()?;
    Some(match u.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    })
}

/// `$XDG_CACHE_HOME/airlock` or `~/.cache/airlock`: the caches and
/// configuration copies airlock owns.
pub fn airlock_cache(p: &dyn Probe) -> Option<PathBuf> {
    p.env("XDG_CACHE_HOME")
        .filter(|v| v.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| p.home().map(|h| h.join(".cache")))
        .map(|c| c.join("airlock"))
}

/// A project's airlock-owned caches: `<cache base>/projects/<key>`. Each
/// project has its own, so what one project's sandbox writes into its
/// caches (a planted tarball, an extracted crate, a module) is never what
/// another project's tool finds in its own. The price is disk: nothing is
/// shared between projects.
pub fn project_cache(p: &dyn Probe) -> Option<PathBuf> {
    let project = p.project()?;
    Some(
        airlock_cache(p)?
            .join("projects")
            .join(project_key(&project)),
    )
}

/// The directory name of a project's caches: the project directory's name,
/// reduced to `[A-Za-z0-9._-]` and at most 32 bytes, so a person can tell
/// which is which, then 16 hex digits of SHA-256 over the whole path's
/// bytes, so two projects never share one (however alike their names).
/// `project` must be canonical; the caller finds it outside the sandbox,
/// which cannot choose the path its run starts from.
pub fn project_key(project: &Path) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        project.as_os_str().as_encoded_bytes(),
    );
    let hash: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = project
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tail: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    // Never a hidden name, `.` or `..`.
    tail = tail.trim_start_matches('.').to_string();
    if tail.is_empty() {
        tail = "project".into();
    }
    format!("{tail}-{hash}")
}

/// Where sanitised configuration copies go: beside the project's caches,
/// never in one (a cache is writable inside the sandbox; this directory is
/// not), and per project, so that two projects' runs at once never read
/// each other's copies.
fn config_copy_dir(p: &dyn Probe) -> Option<PathBuf> {
    project_cache(p).map(|c| c.join("config"))
}

impl Preset {
    pub fn resolve(&self, probe: &dyn Probe) -> Resolved {
        let mut r = Resolved::empty(self.name);
        (self.resolve)(probe, &mut r);
        if r.hosts.is_empty() {
            r.notes
                .push(format!("{}: no host found on this machine", self.name));
        }
        r
    }
}

/// Registry secrets in the user's package-manager configuration, kept out
/// of every sandbox whether or not the tool's preset is on (SPEC §3.4: a
/// token in `~/.npmrc`, pip's configuration or cargo's credentials never
/// enters the sandbox). The files that hold one are hidden, and npm's and
/// pip's are replaced by copies without it; a tool whose preset is in
/// `active` is left to it. Without the preset nothing adds the secret back
/// on the way out: the notes say `--preset NAME` does.
pub fn secrets_outside(probe: &dyn Probe, active: &[Resolved]) -> Resolved {
    let mut r = Resolved::empty("secrets");
    type Keep = fn(&dyn Probe, &mut Resolved);
    let tools: [(&str, Keep); 4] = [
        ("npm", npm::secrets_only),
        ("yarn", npm::yarn_secrets),
        ("pypi", pypi::secrets_only),
        ("cargo", cargo::secrets_only),
    ];
    for (name, keep) in tools {
        if active.iter().any(|a| a.name == name) {
            continue;
        }
        let hidden = r.hide.len();
        keep(probe, &mut r);
        if r.hide.len() > hidden {
            r.notes.push(format!(
                "{name}: registry secrets are hidden from the sandbox; --preset {name} has the proxy add them"
            ));
        }
    }
    r.credentials.clear();
    r
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "npm",
        summary: "the npm registry configured for npm/pnpm/yarn (env, .npmrc, `npm config get registry`); own cache; tokens added by the proxy",
        resolve: npm::resolve,
    },
    Preset {
        name: "pypi",
        summary: "the Python package index configured for pip and uv (env, pip.conf, uv.toml, pip's built-in default); own caches; index passwords added by the proxy",
        resolve: pypi::resolve,
    },
    Preset {
        name: "cargo",
        summary: "the Cargo registries configured or cached (env, .cargo/config.toml, the registry index cache); own CARGO_HOME; tokens added by the proxy",
        resolve: cargo::resolve,
    },
    Preset {
        name: "go",
        summary: "the Go module proxy and checksum database (GOPROXY, GOSUMDB, GOPRIVATE, `go env`); own module cache",
        resolve: go::resolve,
    },
    Preset {
        name: "git",
        summary: "git over HTTPS to the hosts of this repository's remotes (.git/config, read before the run)",
        resolve: git::resolve,
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
        fn project(&self) -> Option<PathBuf> {
            Some(self.workspace())
        }
        /// A file of the map is where it is; `outputs["real <path>"]` is
        /// where a link leads.
        fn real_path(&self, path: &Path) -> Option<PathBuf> {
            if let Some(to) = self.outputs.get(&format!("real {}", path.display())) {
                return Some(PathBuf::from(to));
            }
            self.files.contains_key(path).then(|| path.to_path_buf())
        }
        /// What `outputs["observe <program>"]` lists, one target a line.
        fn observe(&self, argv: &[&str], _env: &[(&str, &str)]) -> Vec<String> {
            let program = argv
                .iter()
                .find(|a| a.contains("cargo "))
                .map_or("", |_| "cargo");
            self.outputs
                .get(&format!("observe {program}"))
                .map(|o| o.lines().map(str::to_string).collect())
                .unwrap_or_default()
        }
    }

    fn hosts(r: &Resolved) -> Vec<&str> {
        r.hosts.iter().map(|(h, _)| h.as_str()).collect()
    }

    /// The key is SHA-256 of the path (pinned here, so a change of layout
    /// is a decision, not an accident) behind a readable tail.
    #[test]
    fn a_project_key_is_its_name_and_a_hash_of_its_path() {
        assert_eq!(
            project_key(Path::new("/work/proj")),
            "proj-277ae841cc3b5609"
        );
        assert_eq!(
            project_key(Path::new("/home/u/src/my project!")),
            "my_project_-e7a43776a08fc4e3"
        );
        // Same name, another place: another key.
        let a = project_key(Path::new("/a/app"));
        let b = project_key(Path::new("/b/app"));
        assert!(a.starts_with("app-") && b.starts_with("app-") && a != b);
        // One byte apart, or a trailing component, differ too.
        assert_ne!(
            project_key(Path::new("/a/app")),
            project_key(Path::new("/a/apq"))
        );
        assert_ne!(
            project_key(Path::new("/a/app")),
            project_key(Path::new("/a/app/sub"))
        );
    }

    /// Whatever the project's name, the key is one plain directory name:
    /// no separator, no `.`/`..`, not hidden, bounded.
    #[test]
    fn a_project_key_is_one_plain_name() {
        for p in [
            "/",
            "/..",
            "/x/..",
            "/x/.hidden",
            "/x/...",
            "/x/a\nb",
            "/x/\u{202e}evil",
            "/x/ünïcödé",
            "/x/a/b/c/very-long-name-very-long-name-very-long-name-very-long-name",
        ] {
            let k = project_key(Path::new(&p));
            assert!(!k.contains('/') && !k.starts_with('.'), "{p:?} -> {k}");
            assert!(k.len() <= 32 + 1 + 16, "{p:?} -> {k}");
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
                "{p:?} -> {k}"
            );
            let (tail, hash) = k.rsplit_once('-').unwrap();
            assert!(!tail.is_empty() && hash.len() == 16, "{p:?} -> {k}");
        }
    }

    /// Every preset's airlock-owned cache lies in the project's own
    /// directory, and another project's run gets none of the same ones.
    #[test]
    fn every_preset_cache_is_the_projects_own() {
        struct Other(FakeProbe);
        impl Probe for Other {
            fn env(&self, n: &str) -> Option<String> {
                self.0.env(n)
            }
            fn env_vars(&self) -> Vec<(String, String)> {
                self.0.env_vars()
            }
            fn read(&self, p: &Path) -> Option<String> {
                self.0.read(p)
            }
            fn list_dir(&self, p: &Path) -> Vec<String> {
                self.0.list_dir(p)
            }
            fn output(&self, a: &[&str]) -> Option<String> {
                self.0.output(a)
            }
            fn home(&self) -> Option<PathBuf> {
                self.0.home()
            }
            fn workspace(&self) -> PathBuf {
                PathBuf::from("/work/other")
            }
            fn project(&self) -> Option<PathBuf> {
                Some(self.workspace())
            }
        }
        let mut p = FakeProbe::default();
        // Secrets, so that every preset writes its configuration copies.
        p.files.insert(
            "/home/u/.npmrc".into(),
            "//reg.corp.test/:_authToken=tok\n".into(),
        );
        p.files.insert(
            "/home/u/.config/pip/pip.conf".into(),
            "[global]\nindex-url = https://me:pw@pypi.corp.test/simple\n".into(),
        );
        let mine = project_cache(&p).unwrap();
        assert_eq!(
            mine,
            Path::new("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609")
        );
        let other = Other(FakeProbe {
            files: p.files.clone(),
            ..Default::default()
        });
        let mut seen = 0;
        for preset in PRESETS {
            let a = preset.resolve(&p);
            let b = preset.resolve(&other);
            let owned = |r: &Resolved| -> Vec<PathBuf> {
                r.caches
                    .iter()
                    .map(PathBuf::from)
                    .chain(r.files.iter().map(|c| c.path.clone()))
                    .collect()
            };
            for path in owned(&a) {
                assert!(
                    path.starts_with(&mine),
                    "{}: {}",
                    preset.name,
                    path.display()
                );
                assert!(
                    owned(&b).iter().all(|o| !o.starts_with(&mine)),
                    "{}: another project shares {}",
                    preset.name,
                    path.display()
                );
                seen += 1;
            }
            // Every airlock-owned directory the tool may write is a cache of
            // this project (nothing else under airlock's cache base).
            for (w, _) in &a.writes {
                if w.starts_with("/home/u/.cache/airlock") {
                    assert!(Path::new(w).starts_with(&mine), "{}: {w}", preset.name);
                }
            }
            if !a.caches.is_empty() {
                assert_eq!(a.project, Some((mine.clone(), PathBuf::from("/work/proj"))));
            }
        }
        assert!(seen >= 8, "{seen}");
        // No project known: no cache at all, rather than a shared one.
        let none = find("cargo").unwrap().resolve(&Offline);
        assert!(none.caches.is_empty() && none.project.is_none());
    }

    #[test]
    fn registry_secrets_are_hidden_without_their_preset() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.npmrc".into(),
            "//reg.corp.test/:_authToken=tok\nfund=false\n".into(),
        );
        p.files.insert(
            "/home/u/.config/pip/pip.conf".into(),
            "[global]\nindex-url = https://me:pw@pypi.corp.test/simple\n".into(),
        );
        p.files.insert(
            "/home/u/.cargo/credentials.toml".into(),
            "token = \"t\"\n".into(),
        );
        p.files.insert(
            "/home/u/.cargo/config.toml".into(),
            "[net]\nretry = 2\n".into(),
        );
        p.files
            .insert("/home/u/.yarnrc.yml".into(), "npmAuthToken: x\n".into());
        let r = secrets_outside(&p, &[]);
        let hidden: Vec<&str> = r.hide.iter().map(|(h, _)| h.as_str()).collect();
        for h in [
            "/home/u/.npmrc",
            "/home/u/.yarnrc.yml",
            "/home/u/.config/pip/pip.conf",
            "/home/u/.cargo/credentials.toml",
        ] {
            assert!(hidden.contains(&h), "{h} not hidden: {hidden:?}");
        }
        assert!(!hidden.contains(&"/home/u/.cargo/config.toml"));
        assert!(
            r.credentials.is_empty(),
            "nothing adds them without the preset"
        );
        assert!(r
            .files
            .iter()
            .all(|c| !c.text.contains("tok") && !c.text.contains("pw")));
        assert!(r.files.iter().any(|c| c.text.contains("fund=false")));
        // A tool whose preset is on is left to it.
        let npm = find("npm").unwrap().resolve(&p);
        let r = secrets_outside(&p, &[npm]);
        assert!(r.hide.iter().all(|(h, _)| !h.ends_with(".npmrc")));
        assert!(r.hide.iter().any(|(h, _)| h.ends_with(".yarnrc.yml")));
        assert!(r.hide.iter().any(|(h, _)| h.ends_with("pip.conf")));
    }

    /// Yarn 1's `~/.yarnrc` is hidden when it holds a token, and left
    /// readable when it does not (its registry and other settings).
    #[test]
    fn yarn_one_rc_is_hidden_only_with_a_token() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.yarnrc".into(),
            "registry \"https://r.corp.test/\"\n\"//r.corp.test/:_authToken\" \"t\"\n".into(),
        );
        let r = secrets_outside(&p, &[]);
        assert!(r.hide.iter().any(|(h, _)| h == "/home/u/.yarnrc"), "{r:?}");
        let npm = find("npm").unwrap().resolve(&p);
        let r = secrets_outside(&p, &[npm]);
        assert!(r.hide.iter().any(|(h, _)| h == "/home/u/.yarnrc"), "{r:?}");
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.yarnrc".into(),
            "registry \"https://r.corp.test/\"\n".into(),
        );
        let r = secrets_outside(&p, &[]);
        assert!(r.hide.iter().all(|(h, _)| h != "/home/u/.yarnrc"), "{r:?}");
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

    /// SPEC §3.4: the variables a preset reads are passed, and no secret
    /// inside one ever is, whatever its shape.
    #[test]
    fn presets_pass_their_variables_but_no_secret_inside() {
        let mut p = FakeProbe::default();
        for (k, v) in [
            ("PIP_INDEX_URL", "https://me:pw@pypi.corp.test/simple"),
            (
                "PIP_EXTRA_INDEX_URL",
                "https://extra.corp.test/simple https://tok@more.corp.test/simple",
            ),
            ("GOPROXY", "https://proxy.corp.test,direct"),
            ("GOFLAGS", "-mod=mod"),
            ("GONOSUMDB", "socks5://u:p@corp.test"),
            ("SSL_CERT_FILE", "/etc/ssl/corp.pem"),
            ("GIT_SSL_CAINFO", "ghp_0123456789abcdefABCDEF0123456789abcd"),
        ] {
            p.env.insert(k.into(), v.into());
        }
        let mut env = BTreeMap::new();
        for name in ["pypi", "go", "git"] {
            for (k, v, _) in find(name).unwrap().resolve(&p).env {
                env.insert(k, v);
            }
        }
        assert_eq!(env["PIP_INDEX_URL"], "https://pypi.corp.test/simple");
        assert_eq!(
            env["PIP_EXTRA_INDEX_URL"],
            "https://extra.corp.test/simple https://more.corp.test/simple"
        );
        assert_eq!(env["GOPROXY"], "https://proxy.corp.test,direct");
        assert_eq!(env["GOFLAGS"], "-mod=mod");
        assert_eq!(env["SSL_CERT_FILE"], "/etc/ssl/corp.pem");
        assert!(!env.contains_key("GONOSUMDB"), "{env:?}");
        assert!(!env.contains_key("GIT_SSL_CAINFO"), "{env:?}");
        for (k, v) in &env {
            assert!(!crate::env::secret_value(v), "{k}={v}");
        }
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
