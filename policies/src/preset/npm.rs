//! npm (and pnpm, yarn through npm's configuration): the registry from
//! env, `.npmrc` and `npm config get registry`; an airlock-owned cache;
//! registry tokens from the user's `.npmrc` kept outside and added by the
//! proxy.

use std::path::PathBuf;

use super::secret::{base64_decode, basic};
use super::{config_copy_dir, ini_values, scrub_urls, ConfigCopy, Probe, Resolved};

/// What the sanitised copy says instead of a token: the proxy sets the
/// real one on the way out.
const PLACEHOLDER_TOKEN: &str = "airlock-proxy-sets-this";
/// `airlock:proxy`, base64, in place of an `_auth` value.
const PLACEHOLDER_AUTH: &str = "YWlybG9jazpwcm94eQ==";

/// Variables npm reads for its registry and TLS, passed when set.
const PASS: &[&str] = &[
    "NPM_CONFIG_REGISTRY",
    "npm_config_registry",
    "NPM_CONFIG_CAFILE",
    "npm_config_cafile",
    "NPM_CONFIG_STRICT_SSL",
    "npm_config_strict_ssl",
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

pub(super) fn resolve(p: &dyn Probe, r: &mut Resolved) {
    let mut default_registry = None;
    for var in PASS {
        if let Some(v) = r.pass_env(p, var) {
            if var.eq_ignore_ascii_case("NPM_CONFIG_REGISTRY") {
                r.add_url(&v, format!("${var}"));
                default_registry = Some(v);
            }
        }
    }
    for (k, _) in p.env_vars() {
        let lk = k.to_ascii_lowercase();
        if lk.starts_with("npm_config_@") && lk.ends_with(":registry") {
            if let Some(v) = r.pass_env(p, &k) {
                r.add_url(&v, format!("${k}"));
            }
        }
    }
    let user = user_config(p);
    let globals = global_configs(p);
    let mut files = vec![p.workspace().join(".npmrc")];
    files.extend(user.clone());
    files.extend(globals.effective.clone());
    for file in files {
        let Some(text) = p.read(&file) else { continue };
        for (line, v) in ini_values(&text, "registry") {
            r.add_url(v, format!("{}:{line}", file.display()));
            default_registry.get_or_insert_with(|| v.to_string());
        }
        for l in text.lines() {
            if let Some((k, v)) = l.trim().split_once('=') {
                if k.trim().starts_with('@') && k.trim().ends_with(":registry") {
                    r.add_url(v, format!("{} ({})", file.display(), k.trim()));
                }
            }
        }
    }
    if default_registry.is_none() {
        match p.output(&["npm", "config", "get", "registry"]) {
            Some(out) => {
                r.add_url(out.trim(), "`npm config get registry`".into());
                default_registry = Some(out.trim().to_string());
            }
            None => r
                .notes
                .push("npm: `npm config get registry` did not run (is npm installed?)".into()),
        }
    }
    r.own_cache(p, "NPM_CONFIG_CACHE", "npm");
    // npm writes a debug log on every run, in ~/.npm/_logs unless told
    // otherwise: outside the sandbox's roots, a refused write each time.
    if let Some((_, cache, _)) = r
        .env
        .iter()
        .find(|(n, _, _)| n == "NPM_CONFIG_CACHE")
        .cloned()
    {
        r.set_env(
            "NPM_CONFIG_LOGS_DIR",
            format!("{cache}/_logs"),
            "airlock's own cache".into(),
        );
    }
    // The global config first: a token the user config gives for the same
    // registry wins, as in npm.
    globals.keep_outside(p, r, default_registry.as_deref());
    if let Some(user) = user {
        keep_tokens_outside(p, r, &user, default_registry.as_deref(), Some(USER_COPY));
    }
}

/// Where a copy goes, and the setting that points npm at it.
struct Copy {
    file: &'static str,
    setting: &'static str,
}

const USER_COPY: Copy = Copy {
    file: "npmrc",
    setting: "userconfig",
};
const GLOBAL_COPY: Copy = Copy {
    file: "npmrc-global",
    setting: "globalconfig",
};

/// npm's global configuration: the file npm reads now, and every other
/// one a command inside could make it read (another prefix, another node
/// version, npm's own built-in file). A token sits in it as often as in
/// the user's (`npm config set --location=global`; with nvm it is under
/// HOME).
struct Globals {
    effective: Option<PathBuf>,
    others: Vec<PathBuf>,
}

impl Globals {
    /// The file npm reads is treated like the user's: its secrets lent,
    /// a copy without them in its place. The others are hidden when they
    /// hold a secret (the sandbox's npm is pointed at the copy, whatever
    /// its prefix).
    fn keep_outside(&self, p: &dyn Probe, r: &mut Resolved, default: Option<&str>) {
        if let Some(g) = &self.effective {
            keep_tokens_outside(p, r, g, default, Some(GLOBAL_COPY));
        }
        for other in &self.others {
            let mut scratch = Resolved::empty("npm");
            keep_tokens_outside(p, &mut scratch, other, default, None);
            for (h, why) in scratch.hide {
                r.hide(std::path::Path::new(&h), why);
            }
            r.withhold_env(scratch.withheld_env);
        }
    }
}

/// An npm setting from the environment (`npm_config_<name>`, any case, as
/// npm reads it).
fn npm_env(p: &dyn Probe, name: &str) -> Option<String> {
    let want = format!("npm_config_{name}");
    let mut vars = p.env_vars();
    // The spelling npm documents first, then any other.
    vars.sort_by_key(|(k, _)| k != &want.to_ascii_uppercase() && k != &want);
    vars.into_iter()
        .find(|(k, v)| k.eq_ignore_ascii_case(&want) && !v.is_empty())
        .map(|(_, v)| v)
}

/// A path-valued setting as npm reads it: variables expanded, `~/` the
/// home. A relative one is not followed.
fn setting_path(p: &dyn Probe, raw: &str) -> Option<PathBuf> {
    let v = expand(p, raw, &mut vec![])?;
    key_path(p, &v)
}

/// The last value of `key` in an npmrc (a later line wins in npm's ini).
fn last_value(text: &str, key: &str) -> Option<String> {
    ini_values(text, key).last().map(|(_, v)| v.to_string())
}

/// npm's global configuration, found as npm finds it: `globalconfig`
/// (environment, then the project, user and built-in configs), else
/// `{prefix}/etc/npmrc`, the prefix from the same places, else from the
/// `PREFIX` variable or the node install (`dirname(dirname(node))`).
fn global_configs(p: &dyn Probe) -> Globals {
    let home = p.home();
    // Where node and npm are installed, by PATH, links followed as node's
    // own `process.execPath` is.
    let mut node_prefixes: Vec<PathBuf> = vec![];
    let mut builtins: Vec<PathBuf> = vec![];
    for dir in p.env("PATH").unwrap_or_default().split(':') {
        if !dir.starts_with('/') {
            continue;
        }
        // Not listed: a listing of a directory a sandbox could write is
        // trust-checked, and PATH often holds one (`node_modules/.bin`).
        let dir = PathBuf::from(dir);
        let node = dir.join("node");
        if let Some(real) = p.real_path(&node) {
            // node's own `process.execPath` is the real one: first.
            for bin in [real, node] {
                if let Some(prefix) = bin.parent().and_then(|b| b.parent()) {
                    let prefix = prefix.to_path_buf();
                    if !node_prefixes.contains(&prefix) {
                        builtins.push(prefix.join("lib/node_modules/npm/npmrc"));
                        node_prefixes.push(prefix);
                    }
                }
            }
        }
        // npm's own directory holds its built-in config: `bin/npm` links
        // to `{npm}/bin/npm-cli.js`.
        if let Some(npm) = p.real_path(&dir.join("npm")) {
            if let Some(root) = npm.parent().and_then(|b| b.parent()) {
                builtins.push(root.join("npmrc"));
            }
        }
    }
    let mut settings: Vec<String> = vec![];
    // Not the project's `.npmrc`: read here, in every run with or without
    // the preset, it would need the user's trust (SPEC §3.5) in every
    // project that has one.
    for f in user_config(p).into_iter().chain(builtins.iter().cloned()) {
        if let Some(t) = p.read(&f) {
            settings.push(t);
        }
    }
    let globalconfigs: Vec<PathBuf> = npm_env(p, "globalconfig")
        .into_iter()
        .chain(
            settings
                .iter()
                .filter_map(|t| last_value(t, "globalconfig")),
        )
        .filter_map(|v| setting_path(p, &v))
        .collect();
    let mut prefixes: Vec<PathBuf> = npm_env(p, "prefix")
        .into_iter()
        .chain(settings.iter().filter_map(|t| last_value(t, "prefix")))
        .chain(p.env("PREFIX"))
        .filter_map(|v| setting_path(p, &v))
        .collect();
    prefixes.extend(node_prefixes);
    let effective = globalconfigs
        .first()
        .cloned()
        .or_else(|| prefixes.first().map(|x| x.join("etc/npmrc")));
    // Every other node version nvm keeps: a command inside can run any.
    let nvm = p
        .env("NVM_DIR")
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".nvm")));
    if let Some(versions) = nvm.map(|d| d.join("versions/node")) {
        for v in p.list_dir(&versions) {
            prefixes.push(versions.join(v));
        }
    }
    // And those the other version managers keep, each a prefix with its
    // own `etc/npmrc` (red team round 9): fnm, volta, asdf and n.
    let var_dir = |name: &str| {
        p.env(name)
            .filter(|d| d.starts_with('/'))
            .map(PathBuf::from)
    };
    let managers: Vec<(Option<PathBuf>, &str)> = vec![
        (
            var_dir("FNM_DIR").or_else(|| home.as_ref().map(|h| h.join(".local/share/fnm"))),
            "node-versions/*/installation",
        ),
        (
            home.as_ref().map(|h| h.join(".fnm")),
            "node-versions/*/installation",
        ),
        (
            var_dir("VOLTA_HOME").or_else(|| home.as_ref().map(|h| h.join(".volta"))),
            "tools/image/node/*",
        ),
        (
            var_dir("ASDF_DATA_DIR").or_else(|| home.as_ref().map(|h| h.join(".asdf"))),
            "installs/nodejs/*",
        ),
        (
            var_dir("N_PREFIX")
                .or_else(|| Some(PathBuf::from("/usr/local")))
                .map(|d| d.join("n")),
            "versions/node/*",
        ),
    ];
    for (base, layout) in managers {
        let Some(base) = base else { continue };
        let (before, after) = layout.split_once('*').unwrap_or((layout, ""));
        let versions = base.join(before.trim_end_matches('/'));
        for v in p.list_dir(&versions) {
            prefixes.push(versions.join(v).join(after.trim_start_matches('/')));
        }
    }
    for system in ["/usr", "/usr/local", "/"] {
        prefixes.push(PathBuf::from(system));
    }
    let mut others: Vec<PathBuf> = vec![];
    for f in globalconfigs
        .into_iter()
        .chain(prefixes.iter().map(|x| x.join("etc/npmrc")))
        .chain(builtins)
    {
        if Some(&f) != effective.as_ref() && !others.contains(&f) {
            others.push(f);
        }
    }
    Globals { effective, others }
}

/// The user's `.npmrc`, where npm reads it.
fn user_config(p: &dyn Probe) -> Option<PathBuf> {
    match p
        .env("NPM_CONFIG_USERCONFIG")
        .or_else(|| p.env("npm_config_userconfig"))
    {
        Some(u) => Some(PathBuf::from(u)),
        None => p.home().map(|h| h.join(".npmrc")),
    }
}

/// Without the preset: the user's `.npmrc` with its tokens is hidden and
/// replaced by a copy without them (the caller drops the credentials:
/// nothing adds them back).
pub(super) fn secrets_only(p: &dyn Probe, r: &mut Resolved) {
    global_configs(p).keep_outside(p, r, None);
    if let Some(user) = user_config(p) {
        keep_tokens_outside(p, r, &user, None, Some(USER_COPY));
    }
}

/// Other npm clients' own files holding a token, hidden preset or not (the
/// npm preset reads npm's configuration, not theirs): yarn's
/// `~/.yarnrc.yml`, yarn 1's `~/.yarnrc` (`"//host/:_authToken" "…"`; yarn
/// 1 falls back on npm's configuration, which the npm preset lends a
/// token-free copy of, for the registry), and pnpm's global rc
/// (`$XDG_CONFIG_HOME/pnpm/rc`, an npmrc). Only a file holding a token is
/// hidden: one without keeps working inside.
pub(super) fn yarn_secrets(p: &dyn Probe, r: &mut Resolved) {
    let pnpm = p
        .env("XDG_CONFIG_HOME")
        .filter(|v| v.starts_with('/'))
        .map(PathBuf::from)
        .or_else(|| p.home().map(|h| h.join(".config")))
        .map(|c| c.join("pnpm/rc"));
    if let Some(rc) = pnpm {
        let secret = ["_authToken", "_auth", "_password"];
        if p.read(&rc)
            .is_some_and(|t| secret.iter().any(|k| t.contains(k)))
        {
            r.hide(&rc, "holds registry tokens".into());
        }
    }
    if let Some(yarnrc) = p.home().map(|h| h.join(".yarnrc")) {
        let secret = ["_authToken", "_auth", "_password"];
        if p.read(&yarnrc)
            .is_some_and(|t| secret.iter().any(|k| t.contains(k)))
        {
            r.hide(&yarnrc, "holds registry tokens".into());
        }
    }
    if let Some(yarnrc) = p.home().map(|h| h.join(".yarnrc.yml")) {
        let secret = ["npmAuthToken", "npmAuthIdent", "npmAuthPassword"];
        if p.read(&yarnrc)
            .is_some_and(|t| secret.iter().any(|k| t.contains(k)))
        {
            r.hide(&yarnrc, "holds registry tokens".into());
        }
    }
}

/// The user's `.npmrc` with its secrets: hidden inside, replaced by a copy
/// without them, and each token or registry password added by the proxy
/// on its registry host. Besides tokens, the copy leaves out comments (an
/// old token commented out may still be valid), the client certificate
/// and key (not lent: the key file is hidden) and the password of every
/// URL (a registry's is lent; a proxy's is not). The same for npm's
/// global config (`copy` says where and which setting points at it);
/// without `copy` a file with a secret is only hidden.
fn keep_tokens_outside(
    p: &dyn Probe,
    r: &mut Resolved,
    file: &std::path::Path,
    default: Option<&str>,
    copy: Option<Copy>,
) {
    let Some(text) = p.read(file) else { return };
    let mut kept = String::new();
    let mut users: Vec<(String, String)> = vec![];
    let mut passwords: Vec<(String, String, String, Vec<String>)> = vec![];
    let mut secret = false;
    for (i, line) in text.lines().enumerate() {
        let from = format!("{}:{}", file.display(), i + 1);
        let trimmed = line.trim();
        // npm's ini reads `#` and `;` lines as comments.
        if trimmed.starts_with(['#', ';']) {
            let lower = trimmed.to_ascii_lowercase();
            if ["_auth", "_password", "token", "key", "@"]
                .iter()
                .any(|w| lower.contains(w))
            {
                secret = true;
            }
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            // A bare key is `key=true`; a URL in it loses its password all the same.
            let (clean, any) = scrub_urls(line, |s| super::lend_or_say(r, s, &from));
            secret |= any;
            kept.push_str(&clean);
            kept.push('\n');
            continue;
        };
        // npm's ini reads a quoted key as the key inside the quotes.
        let key = key.trim();
        let key = key
            .strip_prefix('"')
            .and_then(|k| k.strip_suffix('"'))
            .or_else(|| key.strip_prefix('\'').and_then(|k| k.strip_suffix('\'')))
            .unwrap_or(key);
        let raw = value.trim();
        let mut names = vec![];
        let value = expand(p, raw, &mut names);
        // `//host/path/:_authToken` is scoped to a registry; a bare
        // `_authToken` belongs to the default registry.
        let (scope, field) = match key.strip_prefix("//").and_then(|k| k.rsplit_once(':')) {
            Some((scope, field)) => (Some(scope), field),
            None => (None, key),
        };
        let host = match scope {
            Some(s) => super::url_host(&format!("https://{s}")),
            None => default.and_then(super::url_host),
        };
        match field {
            "_authToken" | "_auth" | "_password" => {
                secret = true;
                let Some(host) = host else {
                    r.notes.push(format!(
                        "{from}: a token whose registry is unknown was left out"
                    ));
                    continue;
                };
                let Some(value) = value else {
                    r.notes.push(format!(
                        "{from}: a token naming an unset variable was left out"
                    ));
                    continue;
                };
                // The copy keeps a placeholder where the token was: npm
                // refuses to publish without one, and the proxy replaces
                // the header it makes (SPEC §3.4: an approved publish
                // still publishes). It is not a secret.
                match field {
                    "_authToken" => {
                        r.credential(host, "Authorization", format!("Bearer {value}"), from);
                        r.withhold_env(names);
                        kept.push_str(&format!("{key}={PLACEHOLDER_TOKEN}\n"));
                    }
                    "_auth" => {
                        r.credential(host, "Authorization", format!("Basic {value}"), from);
                        r.withhold_env(names);
                        kept.push_str(&format!("{key}={PLACEHOLDER_AUTH}\n"));
                    }
                    _ => passwords.push((host, value, from, names)),
                }
            }
            // A client certificate is not lent (the proxy cannot present
            // it for the sandbox): its key, inline or in a file, stays
            // outside.
            "keyfile" | "certfile" | "key" | "cert" => {
                secret = true;
                if field == "keyfile" {
                    if let Some(path) = value.as_deref().and_then(|v| key_path(p, v)) {
                        r.hide(
                            &path,
                            "an npm client key; client certificates are not lent".into(),
                        );
                    }
                }
                r.warnings.push(format!(
                    "{from}: npm's client certificate ({field}) is left out of the sandbox: client certificates are not lent"
                ));
            }
            "username" => {
                if let (Some(h), Some(v)) = (host, value) {
                    users.push((h, v));
                }
                kept.push_str(line);
                kept.push('\n');
            }
            _ => {
                // A password in a URL: a registry's is lent on its host,
                // any other (a proxy's) is left out. The URL is read as npm
                // reads it, variables expanded.
                let registry = field == "registry" || field.ends_with(":registry");
                // A variable unset: the value as written is scrubbed.
                let expanded = value.unwrap_or_else(|| raw.to_string());
                let mut lent = false;
                let (clean, any) = scrub_urls(&expanded, |s| {
                    if registry && s.credential.is_some() {
                        lent = true;
                        super::lend_or_say(r, s, &from);
                    } else {
                        r.warnings.push(format!(
                            "{from}: the password in {key} is left out of the sandbox's copy, and nothing adds it"
                        ));
                    }
                });
                if any {
                    secret = true;
                    if lent {
                        r.withhold_env(names);
                    }
                    kept.push_str(&format!("{key}={clean}\n"));
                } else {
                    // Nothing secret: as written, variables and all.
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
    }
    for (host, pass, from, names) in passwords {
        // `_password` is base64 of the password; the username sits beside it.
        let user = users
            .iter()
            .find(|(h, _)| *h == host)
            .map(|(_, u)| u.clone());
        match (user, base64_decode(&pass)) {
            (Some(u), Some(pw)) => {
                let value = basic(&u, &String::from_utf8_lossy(&pw));
                r.credential(host, "Authorization", value, from);
                r.withhold_env(names);
            }
            _ => r.notes.push(format!(
                "{from}: a password without its username was left out"
            )),
        }
    }
    if !secret {
        return;
    }
    r.hide(file, "holds registry secrets; the proxy adds them".into());
    let (Some(dir), Some(c)) = (config_copy_dir(p), copy) else {
        return;
    };
    let path = dir.join(c.file);
    r.files.push(ConfigCopy {
        path: path.clone(),
        text: kept,
        from: file.to_path_buf(),
    });
    // Every spelling the caller set is pointed at the copy, so none of
    // them names the hidden original to npm inside.
    let want = format!("npm_config_{}", c.setting);
    let mut names: Vec<String> = p
        .env_vars()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.eq_ignore_ascii_case(&want))
        .collect();
    let upper = want.to_ascii_uppercase();
    if !names.contains(&upper) {
        names.push(upper);
    }
    for name in names {
        r.set_env(
            &name,
            path.display().to_string(),
            format!("{} without its tokens", file.display()),
        );
    }
}

/// The client key a `keyfile` names, as npm finds it (`~/` is the home).
fn key_path(p: &dyn Probe, value: &str) -> Option<PathBuf> {
    let v = value.trim();
    if let Some(rest) = v.strip_prefix("~/") {
        return p.home().map(|h| h.join(rest));
    }
    let path = PathBuf::from(v);
    path.is_absolute().then_some(path)
}

/// npm expands `${NAME}` in `.npmrc` values; `None` when a named variable
/// is unset. The names expanded are added to `names`.
fn expand(p: &dyn Probe, value: &str, names: &mut Vec<String>) -> Option<String> {
    let value = value.trim_matches(['"', '\'']);
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}')?;
        let name = &after[..end];
        names.push(name.to_string());
        out.push_str(&p.env(name)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::super::tests::FakeProbe;
    use super::PLACEHOLDER_TOKEN;

    #[test]
    fn tokens_stay_outside_and_variables_pass_clean() {
        let mut p = FakeProbe::default();
        p.env.insert(
            "NPM_CONFIG_REGISTRY".into(),
            "https://u:pw@mirror.corp.test/npm/".into(),
        );
        p.env
            .insert("NODE_EXTRA_CA_CERTS".into(), "/etc/corp-ca.pem".into());
        p.env.insert("NPM_TOKEN".into(), "tok-from-env".into());
        p.files.insert(
            "/home/u/.npmrc".into(),
            "@acme:registry=https://npm.acme.test:8443/\n//npm.acme.test:8443/:_authToken=${NPM_TOKEN}\n//mirror.corp.test/npm/:username=bob\n//mirror.corp.test/npm/:_password=c2VjcmV0\nfund=false\n".into(),
        );
        let r = find("npm").unwrap().resolve(&p);
        let env = |k: &str| {
            r.env
                .iter()
                .find(|(n, _, _)| n == k)
                .map(|(_, v, _)| v.as_str())
        };
        assert_eq!(
            env("NPM_CONFIG_REGISTRY"),
            Some("https://mirror.corp.test/npm/")
        );
        assert_eq!(env("NODE_EXTRA_CA_CERTS"), Some("/etc/corp-ca.pem"));
        assert_eq!(
            env("NPM_CONFIG_CACHE"),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/npm")
        );
        assert_eq!(
            env("NPM_CONFIG_USERCONFIG"),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/config/npmrc")
        );
        assert!(r
            .env
            .iter()
            .all(|(_, v, _)| !v.contains("pw") && !v.contains("tok-from-env")));
        assert_eq!(
            r.caches,
            ["/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/npm"]
        );
        assert_eq!(r.hide[0].0, "/home/u/.npmrc");
        let copy = &r.files[0];
        // Placeholders where tokens were (npm publishes only with one);
        // no secret, and no password line at all.
        assert!(!copy.text.contains("tok-from-env") && !copy.text.contains("_password"));
        for line in copy.text.lines().filter(|l| l.contains("_authToken")) {
            assert!(line.ends_with(&format!("={PLACEHOLDER_TOKEN}")), "{line}");
        }
        assert!(copy.text.contains("@acme:registry=") && copy.text.contains("fund=false"));
        let cred = |h: &str| {
            r.credentials
                .iter()
                .filter(|c| c.host == h)
                .map(|c| c.value.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(cred("npm.acme.test:8443"), ["Bearer tok-from-env"]);
        // The password line wins over the URL's user:password for the same host.
        assert_eq!(cred("mirror.corp.test"), [super::basic("bob", "secret")]);
        assert!(
            !format!("{r:?}").contains("tok-from-env"),
            "Debug must hide values"
        );
    }

    /// Besides tokens, the copy leaves out URL passwords, comments and
    /// the client key; a registry's URL password is lent, a proxy's is
    /// not; the variables a token was read from are withheld.
    #[test]
    fn the_copy_holds_no_other_secret() {
        let mut p = FakeProbe::default();
        p.env.insert("JFROG_REF".into(), "cmVmdGtu-REF1".into());
        p.env.insert("CORP_PW".into(), "ENVPW2".into());
        p.files.insert(
            "/home/u/.npmrc".into(),
            concat!(
                "registry=https://reg.test:8443/\n",
                "//reg.test:8443/:_authToken=${JFROG_REF}\n",
                "https-proxy=http://corpuser:PROXYPW3@proxy.corp.test:3128\n",
                "@corp:registry=https://ci:${CORP_PW}@npm.corp.test/\n",
                "# old: //reg.test:8443/:_authToken=OLD4\n",
                "; also OLD5\n",
                "//npm.corp.test/:keyfile=~/.npm-certs/client.key\n",
                "//npm.corp.test/:certfile=/etc/c.crt\n",
                "fund=false\n",
            )
            .into(),
        );
        let r = find("npm").unwrap().resolve(&p);
        let copy = &r.files[0].text;
        for s in [
            "REF1", "ENVPW2", "PROXYPW3", "OLD4", "OLD5", "keyfile", "certfile", "CORP_PW",
        ] {
            assert!(!copy.contains(s), "{s} in the copy:\n{copy}");
        }
        assert!(
            copy.contains("https-proxy=http://proxy.corp.test:3128"),
            "{copy}"
        );
        assert!(
            copy.contains("@corp:registry=https://npm.corp.test/"),
            "{copy}"
        );
        assert!(copy.contains("fund=false"));
        let cred = |h: &str| {
            r.credentials
                .iter()
                .filter(|c| c.host == h)
                .map(|c| c.value.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(cred("reg.test:8443"), ["Bearer cmVmdGtu-REF1"]);
        assert_eq!(cred("npm.corp.test"), [super::basic("ci", "ENVPW2")]);
        assert!(cred("proxy.corp.test").is_empty());
        assert_eq!(r.withheld_env, ["JFROG_REF", "CORP_PW"]);
        assert!(r
            .hide
            .iter()
            .any(|(h, _)| h == "/home/u/.npm-certs/client.key"));
        assert!(r
            .warnings
            .iter()
            .any(|w| w.contains("client certificates are not lent")));
        // Without the preset: the same copy, the same variables withheld,
        // nothing lent.
        let s = super::super::secrets_outside(&p, &[]);
        assert!(s.credentials.is_empty());
        assert_eq!(s.withheld_env, ["JFROG_REF", "CORP_PW"]);
        assert!(!s.files[0].text.contains("PROXYPW3"));
    }

    /// A password in a URL is secret enough for a copy on its own.
    #[test]
    fn a_url_password_alone_is_kept_outside() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.npmrc".into(),
            "registry=https://u:PW1@r.test/\n".into(),
        );
        let s = super::super::secrets_outside(&p, &[]);
        assert!(s.hide.iter().any(|(h, _)| h == "/home/u/.npmrc"));
        assert_eq!(s.files[0].text, "registry=https://r.test/\n");
    }

    /// npm's global config is treated like the user's: hidden, its token
    /// lent (the user config's wins for the same registry), a copy without
    /// it in its place; preset or not.
    #[test]
    fn the_global_config_keeps_its_tokens_outside() {
        let mut p = FakeProbe::default();
        p.env
            .insert("NPM_CONFIG_GLOBALCONFIG".into(), "/home/u/g/npmrc".into());
        p.files.insert(
            "/home/u/g/npmrc".into(),
            "registry=https://r.test/\n//r.test/:_authToken=GLOBALTOK1\n//o.test/:_authToken=GLOBALTOK2\nfund=false\n".into(),
        );
        p.files.insert(
            "/home/u/.npmrc".into(),
            "//o.test/:_authToken=USERTOK3\n".into(),
        );
        let r = find("npm").unwrap().resolve(&p);
        assert!(r.hide.iter().any(|(h, _)| h == "/home/u/g/npmrc"));
        assert!(r.hide.iter().any(|(h, _)| h == "/home/u/.npmrc"));
        let copy = r
            .files
            .iter()
            .find(|c| c.from == std::path::Path::new("/home/u/g/npmrc"))
            .unwrap();
        assert!(copy.path.ends_with("config/npmrc-global"));
        assert!(!copy.text.contains("GLOBALTOK") && copy.text.contains("fund=false"));
        assert!(r
            .env
            .iter()
            .any(|(n, v, _)| n == "NPM_CONFIG_GLOBALCONFIG" && copy.path.to_str() == Some(v)));
        let cred = |h: &str| {
            r.credentials
                .iter()
                .filter(|c| c.host == h)
                .map(|c| c.value.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(cred("r.test"), ["Bearer GLOBALTOK1"]);
        assert_eq!(cred("o.test"), ["Bearer USERTOK3"]);
        let s = super::super::secrets_outside(&p, &[]);
        assert!(s.credentials.is_empty());
        assert!(s.hide.iter().any(|(h, _)| h == "/home/u/g/npmrc"));
        assert!(s.files.iter().all(|c| !c.text.contains("GLOBALTOK")));
    }

    /// Found as npm finds it without the variable: the user config's
    /// `prefix`, the node on PATH (through its link); every other global
    /// config a command inside could make npm read is hidden when it
    /// holds a secret (another nvm version, the system's), one without
    /// stays readable.
    #[test]
    fn every_global_config_with_a_secret_is_hidden() {
        let mut p = FakeProbe::default();
        p.env.insert("PATH".into(), "/opt/bin:/usr/bin".into());
        p.files.insert("/usr/bin/node".into(), String::new());
        p.outputs.insert(
            "real /usr/bin/node".into(),
            "/home/u/.nvm/versions/node/v20/bin/node".into(),
        );
        let tok = "//r.test/:_authToken=T\n".to_string();
        for f in [
            "/home/u/.nvm/versions/node/v20/etc/npmrc",
            "/home/u/.nvm/versions/node/v18/etc/npmrc",
            "/home/u/pfx/etc/npmrc",
            "/etc/npmrc",
            "/home/u/.volta/tools/image/node/22.1.0/etc/npmrc",
            "/home/u/.local/share/fnm/node-versions/v21.0.0/installation/etc/npmrc",
            "/home/u/.asdf/installs/nodejs/20.0.0/etc/npmrc",
        ] {
            p.files.insert(f.into(), tok.clone());
        }
        p.files
            .insert("/usr/etc/npmrc".into(), "fund=false\n".into());
        // Without `prefix`, the node install's is the global one.
        let r = find("npm").unwrap().resolve(&p);
        let copied = |r: &super::super::Resolved| {
            r.files
                .iter()
                .map(|c| c.from.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(copied(&r), ["/home/u/.nvm/versions/node/v20/etc/npmrc"]);
        p.files
            .insert("/home/u/.npmrc".into(), "prefix=~/pfx\n".into());
        let r = find("npm").unwrap().resolve(&p);
        assert_eq!(copied(&r), ["/home/u/pfx/etc/npmrc"]);
        for f in [
            "/home/u/.nvm/versions/node/v20/etc/npmrc",
            "/home/u/.nvm/versions/node/v18/etc/npmrc",
            "/home/u/pfx/etc/npmrc",
            "/etc/npmrc",
            "/home/u/.volta/tools/image/node/22.1.0/etc/npmrc",
            "/home/u/.local/share/fnm/node-versions/v21.0.0/installation/etc/npmrc",
            "/home/u/.asdf/installs/nodejs/20.0.0/etc/npmrc",
        ] {
            assert!(r.hide.iter().any(|(h, _)| h == f), "{f} not hidden");
        }
        assert!(!r.hide.iter().any(|(h, _)| h == "/usr/etc/npmrc"));
        assert!(!r.hide.iter().any(|(h, _)| h == "/home/u/.npmrc"));
    }

    #[test]
    fn no_token_no_copy() {
        let mut p = FakeProbe::default();
        p.files
            .insert("/home/u/.npmrc".into(), "registry=https://r.test/\n".into());
        let r = find("npm").unwrap().resolve(&p);
        assert!(r.files.is_empty() && r.hide.is_empty() && r.credentials.is_empty());
    }
}
