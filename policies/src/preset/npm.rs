//! npm (and pnpm, yarn through npm's configuration): the registry from
//! env, `.npmrc` and `npm config get registry`; an airlock-owned cache;
//! registry tokens from the user's `.npmrc` kept outside and added by the
//! proxy.

use std::path::PathBuf;

use super::secret::{base64_decode, basic};
use super::{config_copy_dir, ini_values, ConfigCopy, Probe, Resolved};

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
    let mut files = vec![p.workspace().join(".npmrc")];
    files.extend(user.clone());
    if let Some(g) = p.env("NPM_CONFIG_GLOBALCONFIG") {
        files.push(PathBuf::from(g));
    }
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
    if let Some(user) = user {
        keep_tokens_outside(p, r, &user, default_registry.as_deref());
    }
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
    if let Some(user) = user_config(p) {
        keep_tokens_outside(p, r, &user, None);
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

/// The user's `.npmrc` with its tokens: hidden inside, replaced by a copy
/// without them, and each token added by the proxy on its registry host.
fn keep_tokens_outside(
    p: &dyn Probe,
    r: &mut Resolved,
    file: &std::path::Path,
    default: Option<&str>,
) {
    let Some(text) = p.read(file) else { return };
    let mut kept = String::new();
    let mut users: Vec<(String, String)> = vec![];
    let mut passwords: Vec<(String, String, String)> = vec![];
    let mut secret = false;
    for (i, line) in text.lines().enumerate() {
        let from = format!("{}:{}", file.display(), i + 1);
        let Some((key, value)) = line.trim().split_once('=') else {
            kept.push_str(line);
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
        let value = expand(p, value.trim());
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
                        kept.push_str(&format!("{key}={PLACEHOLDER_TOKEN}\n"));
                    }
                    "_auth" => {
                        r.credential(host, "Authorization", format!("Basic {value}"), from);
                        kept.push_str(&format!("{key}={PLACEHOLDER_AUTH}\n"));
                    }
                    _ => passwords.push((host, value, from)),
                }
            }
            "username" => {
                if let (Some(h), Some(v)) = (host, value) {
                    users.push((h, v));
                }
                kept.push_str(line);
                kept.push('\n');
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    for (host, pass, from) in passwords {
        // `_password` is base64 of the password; the username sits beside it.
        let user = users
            .iter()
            .find(|(h, _)| *h == host)
            .map(|(_, u)| u.clone());
        match (user, base64_decode(&pass)) {
            (Some(u), Some(pw)) => {
                let value = basic(&u, &String::from_utf8_lossy(&pw));
                r.credential(host, "Authorization", value, from);
            }
            _ => r.notes.push(format!(
                "{from}: a password without its username was left out"
            )),
        }
    }
    if !secret {
        return;
    }
    let Some(dir) = config_copy_dir(p) else {
        return;
    };
    let copy = dir.join("npmrc");
    r.hide(file, "holds registry tokens; the proxy adds them".into());
    r.files.push(ConfigCopy {
        path: copy.clone(),
        text: kept,
        from: file.to_path_buf(),
    });
    r.set_env(
        "NPM_CONFIG_USERCONFIG",
        copy.display().to_string(),
        format!("{} without its tokens", file.display()),
    );
}

/// npm expands `${NAME}` in `.npmrc` values; `None` when a named variable
/// is unset.
fn expand(p: &dyn Probe, value: &str) -> Option<String> {
    let value = value.trim_matches(['"', '\'']);
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}')?;
        out.push_str(&p.env(&after[..end])?);
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

    #[test]
    fn no_token_no_copy() {
        let mut p = FakeProbe::default();
        p.files
            .insert("/home/u/.npmrc".into(), "registry=https://r.test/\n".into());
        let r = find("npm").unwrap().resolve(&p);
        assert!(r.files.is_empty() && r.hide.is_empty() && r.credentials.is_empty());
    }
}
