//! Cargo: registries from env, `.cargo/config.toml` and the host's index
//! cache; an airlock-owned `CARGO_HOME` (cargo has no separate cache
//! directory) holding a copy of the user's configuration without tokens;
//! registry tokens kept outside and added by the proxy.

use std::path::{Path, PathBuf};

use super::{ini_values, scrub_urls, ConfigCopy, Probe, Resolved};

/// What cargo reads in place of a token it does not hold: the proxy
/// replaces the whole `Authorization` header on the registry's host, so
/// this value never leaves the machine. Cargo refuses to contact a
/// registry that requires authentication without some token.
pub const PLACEHOLDER_TOKEN: &str = "airlock-proxy-adds-the-token";

/// Variables cargo reads for registries and TLS (besides
/// `CARGO_REGISTRIES_*`), passed when set.
const PASS: &[&str] = &[
    "CARGO_REGISTRY_DEFAULT",
    "CARGO_HTTP_CAINFO",
    "CARGO_HTTP_CHECK_REVOKE",
    "CARGO_NET_GIT_FETCH_WITH_CLI",
    // Which toolchain rustup's `cargo` runs, when not the default place.
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// `NAME` as cargo spells it in environment variables.
fn env_name(registry: &str) -> String {
    registry.to_ascii_uppercase().replace('-', "_")
}

pub(super) fn resolve(p: &dyn Probe, r: &mut Resolved) {
    let mut indexes: Vec<(String, String)> = vec![];
    for (k, _) in p.env_vars() {
        let Some(rest) = k.strip_prefix("CARGO_REGISTRIES_") else {
            if k == "CARGO_REGISTRY_INDEX" {
                if let Some(v) = r.pass_env(p, &k) {
                    r.add_url(&v, format!("${k}"));
                }
            }
            continue;
        };
        if let Some(name) = rest.strip_suffix("_INDEX") {
            if let Some(v) = r.pass_env(p, &k) {
                r.add_url(&v, format!("${k}"));
                indexes.push((name.to_string(), v));
            }
        } else if rest.ends_with("_PROTOCOL") || rest.ends_with("_CREDENTIAL_PROVIDER") {
            r.pass_env(p, &k);
        }
    }
    for var in PASS {
        r.pass_env(p, var);
    }
    let cargo_home = host_cargo_home(p);
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
    for file in &files {
        let Some(text) = p.read(file) else { continue };
        for key in ["index", "registry"] {
            for (line, v) in ini_values(&text, key) {
                r.add_url(v, format!("{}:{line}", file.display()));
            }
        }
        if let Ok(t) = text.parse::<toml::Table>() {
            if let Some(regs) = t.get("registries").and_then(|v| v.as_table()) {
                for (name, reg) in regs {
                    if let Some(i) = reg.get("index").and_then(|v| v.as_str()) {
                        // Also where the line scan misses it (an inline table).
                        r.add_url(i, format!("{} (registries.{name})", file.display()));
                        indexes.push((env_name(name), i.to_string()));
                    }
                }
            }
        }
    }
    let Some(h) = cargo_home else {
        r.notes
            .push("cargo: neither CARGO_HOME nor HOME is set".into());
        return;
    };
    own_home(p, r, &h, &indexes);
    // Registries cargo has already used: the index cache is named
    // `<host>-<hash>` and holds the registry's config.json (download and
    // API hosts).
    let index = h.join("registry/index");
    let dirs = p.list_dir(&index);
    if dirs.is_empty() && r.hosts.is_empty() {
        observe_default_registry(p, r, &index);
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

/// The host's `CARGO_HOME`.
fn host_cargo_home(p: &dyn Probe) -> Option<PathBuf> {
    p.env("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| p.home().map(|h| h.join(".cargo")))
}

/// Without the preset: the host's credentials files, and a `config.toml`
/// that holds a token, are hidden (nothing adds the tokens back).
pub(super) fn secrets_only(p: &dyn Probe, r: &mut Resolved) {
    let Some(home) = host_cargo_home(p) else {
        return;
    };
    // cargo still reads the legacy `config` beside `config.toml`.
    for name in ["config.toml", "config"] {
        let config = home.join(name);
        // A token in any spelling, a URL's password, or a file that cannot
        // be shown to hold neither.
        let secret = |t: &str| {
            let mut scratch = Resolved::empty("cargo");
            !registry_tokens(t, &config).is_empty()
                || without_secrets(&mut scratch, t, &config).map_or(true, |(_, removed)| removed)
        };
        if p.read(&config).is_some_and(|t| secret(&t)) {
            r.hide(
                &config,
                "holds registry tokens (--preset cargo adds them)".into(),
            );
        }
    }
    for name in ["credentials.toml", "credentials"] {
        let file = home.join(name);
        if p.read(&file).is_some() {
            r.hide(
                &file,
                "cargo's registry tokens (--preset cargo adds them)".into(),
            );
        }
    }
}

/// Point cargo at `<airlock cache>/cargo`: its registry cache is then the
/// sandbox's own. The user's `config.toml` is copied there without its
/// tokens (airlock rewrites it before every run), the user's credentials
/// are hidden, and each token becomes a proxy credential on its
/// registry's index host.
fn own_home(p: &dyn Probe, r: &mut Resolved, host_home: &Path, indexes: &[(String, String)]) {
    r.own_cache(p, "CARGO_HOME", "cargo");
    let Some(own) = r
        .env
        .iter()
        .find(|(n, _, _)| n == "CARGO_HOME")
        .map(|(_, v, _)| PathBuf::from(v))
    else {
        return;
    };
    let mut tokens: Vec<(String, String, String)> = vec![];
    let user_config = host_home.join("config.toml");
    let mut copy = String::new();
    if let Some(text) = p.read(&user_config) {
        tokens.extend(registry_tokens(&text, &user_config));
        match without_secrets(r, &text, &user_config) {
            Ok((clean, had_secret)) => {
                copy = clean;
                if had_secret || !tokens.is_empty() {
                    r.hide(
                        &user_config,
                        "holds registry secrets; the proxy adds the tokens".into(),
                    );
                }
            }
            Err(why) => {
                // Fail closed: neither the original nor a copy of it.
                r.hide(&user_config, why.clone());
                r.warnings.push(format!(
                    "cargo: {}: {why}; the sandbox's cargo reads no copy of it",
                    user_config.display()
                ));
            }
        }
    }
    // Written even when empty, so nothing a sandbox left there is read.
    r.files.push(ConfigCopy {
        path: own.join("config.toml"),
        text: copy,
        from: user_config,
    });
    for name in ["credentials.toml", "credentials"] {
        let file = host_home.join(name);
        if let Some(text) = p.read(&file) {
            tokens.extend(registry_tokens(&text, &file));
            r.hide(&file, "cargo's registry tokens; the proxy adds them".into());
        }
    }
    // The legacy `config` is not cargo's here (CARGO_HOME is ours), but the
    // sandbox could still read a token in it.
    let legacy = host_home.join("config");
    if let Some(text) = p.read(&legacy) {
        let found = registry_tokens(&text, &legacy);
        // Another spelling of a secret, or a URL's password, hides it too.
        let mut scratch = Resolved::empty("cargo");
        let other =
            without_secrets(&mut scratch, &text, &legacy).map_or(true, |(_, removed)| removed);
        if !found.is_empty() || other {
            tokens.extend(found);
            r.hide(
                &legacy,
                "holds registry secrets; the proxy adds the tokens".into(),
            );
        }
    }
    for (k, v) in p.env_vars() {
        if let Some(name) = k
            .strip_prefix("CARGO_REGISTRIES_")
            .and_then(|n| n.strip_suffix("_TOKEN"))
        {
            tokens.push((name.to_string(), v, format!("${k}")));
        }
    }
    for (name, token, from) in tokens {
        if name.is_empty() {
            r.notes.push(format!(
                "cargo: {from}: the default registry's token is hidden; publishing from inside the sandbox is not supported"
            ));
            continue;
        }
        let Some(host) = indexes
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, i)| super::url_host(i))
        else {
            r.notes.push(format!(
                "cargo: {from}: the token of registry {name} is hidden, and its index is unknown, so nothing adds it"
            ));
            continue;
        };
        r.credential(host, "Authorization", token, from);
        r.set_env(
            &format!("CARGO_REGISTRIES_{name}_TOKEN"),
            PLACEHOLDER_TOKEN.into(),
            "a placeholder: the proxy adds the real token".into(),
        );
        // Cargo reads a token for a registry that requires one only through
        // a credential provider; `cargo:token` is the one that reads the
        // variable above.
        r.set_env(
            &format!("CARGO_REGISTRIES_{name}_CREDENTIAL_PROVIDER"),
            "cargo:token".into(),
            "so cargo sends the placeholder the proxy replaces".into(),
        );
    }
}

/// What cargo reads a registry secret from in `[registry]` and
/// `[registries.NAME]`: left out of the sandbox's copy, however the TOML
/// spells the key (dotted, quoted, in an inline table).
const SECRET_KEYS: &[&str] = &[
    "token",
    "secret-key",
    "secret-key-subject",
    "credential-provider",
];

/// The user's `config.toml` as the sandbox's cargo reads it: parsed and
/// written back (no comment survives, and no spelling of a key escapes)
/// without the registries' secrets, and without the password of any URL
/// in it (a registry's is lent on its host; a proxy's is not). Whether
/// anything was removed comes with it. `Err` when the result cannot be
/// shown to be free of them (the file does not parse, or a token is
/// still found): then nothing is copied.
fn without_secrets(r: &mut Resolved, text: &str, file: &Path) -> Result<(String, bool), String> {
    let mut t: toml::Table = text
        .parse()
        .map_err(|_| "cannot be parsed as TOML, so it is not copied".to_string())?;
    let mut removed = false;
    let mut strip = |table: &mut toml::Table| {
        for key in SECRET_KEYS {
            removed |= table.remove(*key).is_some();
        }
    };
    if let Some(reg) = t.get_mut("registry").and_then(|v| v.as_table_mut()) {
        strip(reg);
    }
    if let Some(regs) = t.get_mut("registries").and_then(|v| v.as_table_mut()) {
        for (_, reg) in regs.iter_mut() {
            if let Some(reg) = reg.as_table_mut() {
                strip(reg);
            }
        }
    }
    let from = file.display().to_string();
    scrub_values(r, &mut t, &from, &mut removed);
    let out = toml::to_string(&t).map_err(|e| format!("cannot be written back ({e})"))?;
    // Checked again on what is written, as cargo will read it.
    let again: toml::Table = out
        .parse()
        .map_err(|_| "cannot be read back after cleaning, so it is not copied".to_string())?;
    let left = |t: Option<&toml::Value>| {
        t.and_then(|v| v.as_table())
            .is_some_and(|t| SECRET_KEYS.iter().any(|k| t.contains_key(*k)))
    };
    let left_in_registries = again
        .get("registries")
        .and_then(|v| v.as_table())
        .is_some_and(|regs| regs.values().any(|reg| left(Some(reg))));
    if !registry_tokens(&out, file).is_empty()
        || left(again.get("registry"))
        || left_in_registries
        || scrub_urls(&out, |_| {}).1
    {
        return Err("still holds a secret after cleaning, so it is not copied".into());
    }
    Ok((out, removed))
}

/// Every string in `t`, at any depth, without the password of a URL; a
/// `proxy` value without a scheme loses its `user:password@` too (libcurl
/// reads one there).
fn scrub_values(r: &mut Resolved, t: &mut toml::Table, from: &str, removed: &mut bool) {
    fn walk(r: &mut Resolved, key: &str, v: &mut toml::Value, from: &str, removed: &mut bool) {
        match v {
            toml::Value::String(s) => {
                let (mut clean, any) = scrub_urls(s, |u| {
                    if key == "proxy" {
                        r.warnings.push(format!(
                            "{from}: the password of cargo's proxy is left out of the sandbox's copy, and nothing adds it"
                        ));
                    } else {
                        super::lend_or_say(r, u, from);
                    }
                });
                *removed |= any;
                if key == "proxy" {
                    if let Some(bare) = super::strip_bare_userinfo(&clean) {
                        *removed = true;
                        r.warnings.push(format!(
                            "{from}: the password of cargo's proxy is left out of the sandbox's copy, and nothing adds it"
                        ));
                        clean = bare;
                    }
                }
                *s = clean;
            }
            toml::Value::Array(a) => {
                for v in a {
                    walk(r, key, v, from, removed);
                }
            }
            toml::Value::Table(t) => {
                for (k, v) in t.iter_mut() {
                    walk(r, k, v, from, removed);
                }
            }
            _ => {}
        }
    }
    for (k, v) in t.iter_mut() {
        walk(r, k, v, from, removed);
    }
}

/// An empty machine: no registry configured, none cached. Cargo is asked
/// to resolve a dependency in the probe sandbox, whose proxy refuses
/// everything and records where cargo tried to go: its default index.
/// The download host is named by that index's config.json, which only a
/// real fetch reads; the first run asks for it (or `--allow` it).
fn observe_default_registry(p: &dyn Probe, r: &mut Resolved, index: &Path) {
    let script = "set -e; d=$(mktemp -d); cd \"$d\"; mkdir src; : > src/lib.rs; \
        printf '[package]\\nname = \"probe\"\\nversion = \"0.0.0\"\\nedition = \"2021\"\\n[dependencies]\\nairlock-registry-probe = \"1\"\\n' > Cargo.toml; \
        CARGO_HOME=\"$d/home\" cargo generate-lockfile";
    // rustup's proxy finds its toolchains through RUSTUP_HOME when set.
    let rustup = p.env("RUSTUP_HOME");
    let mut env = vec![("CARGO_NET_RETRY", "0")];
    if let Some(r) = &rustup {
        env.push(("RUSTUP_HOME", r));
    }
    let seen = p.observe(&["sh", "-c", script], &env);
    if seen.is_empty() {
        r.notes.push(format!(
            "cargo: no registry configured, none cached in {}, and cargo connected nowhere in the probe sandbox (is cargo installed?); set CARGO_REGISTRIES_<NAME>_INDEX",
            index.display()
        ));
        return;
    }
    for target in seen {
        let url = match target.strip_suffix(":443") {
            Some(host) => format!("https://{host}/"),
            None => format!("https://{target}/"),
        };
        r.add_url(
            &url,
            "where `cargo generate-lockfile` connected in the probe sandbox (cargo's built-in default)".into(),
        );
    }
    r.notes.push(
        "cargo: the download host is named by the registry's config.json, read on the first fetch: approve it then, or allow it".into(),
    );
}

/// `(NAME, token, where)` for `[registries.NAME] token`, and `("", …)` for
/// the default registry's `[registry] token`.
fn registry_tokens(text: &str, file: &Path) -> Vec<(String, String, String)> {
    let Ok(t) = text.parse::<toml::Table>() else {
        return vec![];
    };
    let from = file.display().to_string();
    let mut out = vec![];
    if let Some(tok) = t
        .get("registry")
        .and_then(|r| r.get("token"))
        .and_then(|v| v.as_str())
    {
        out.push((String::new(), tok.to_string(), from.clone()));
    }
    if let Some(regs) = t.get("registries").and_then(|v| v.as_table()) {
        for (name, reg) in regs {
            if let Some(tok) = reg.get("token").and_then(|v| v.as_str()) {
                out.push((env_name(name), tok.to_string(), from.clone()));
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::super::tests::FakeProbe;
    use super::PLACEHOLDER_TOKEN;

    #[test]
    fn own_home_and_tokens_outside() {
        let mut p = FakeProbe::default();
        p.env.insert(
            "CARGO_REGISTRIES_CORP_INDEX".into(),
            "sparse+https://cargo.corp.test/index/".into(),
        );
        p.files.insert(
            "/home/u/.cargo/credentials.toml".into(),
            "[registries.corp]\ntoken = \"cargo-s3cret\"\n[registry]\ntoken = \"pub\"\n".into(),
        );
        p.files.insert(
            "/home/u/.cargo/config.toml".into(),
            "[net]\nretry = 3\n[registries.other]\nindex = \"sparse+https://other.test/\"\ntoken = \"t2\"\n".into(),
        );
        let r = find("cargo").unwrap().resolve(&p);
        let env = |k: &str| {
            r.env
                .iter()
                .find(|(n, _, _)| n == k)
                .map(|(_, v, _)| v.clone())
        };
        assert_eq!(
            env("CARGO_HOME").as_deref(),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/cargo")
        );
        assert_eq!(
            env("CARGO_REGISTRIES_CORP_TOKEN").as_deref(),
            Some(PLACEHOLDER_TOKEN)
        );
        assert_eq!(
            env("CARGO_REGISTRIES_OTHER_TOKEN").as_deref(),
            Some(PLACEHOLDER_TOKEN)
        );
        let creds: Vec<_> = r
            .credentials
            .iter()
            .map(|c| (c.host.as_str(), c.value.as_str()))
            .collect();
        assert_eq!(
            creds,
            [("other.test", "t2"), ("cargo.corp.test", "cargo-s3cret")]
        );
        let hidden: Vec<_> = r.hide.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(
            hidden,
            [
                "/home/u/.cargo/config.toml",
                "/home/u/.cargo/credentials.toml"
            ]
        );
        let copy = &r.files[0];
        assert_eq!(
            copy.path,
            std::path::Path::new(
                "/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/cargo/config.toml"
            )
        );
        assert!(copy.text.contains("retry = 3") && !copy.text.contains("t2"));
        assert!(r.notes.iter().any(|n| n.contains("publishing")));
    }

    /// Every spelling TOML allows for a registry's secret, and a proxy's
    /// password, stay out of the copy; the tokens are still lent.
    #[test]
    fn the_copy_holds_no_secret_however_spelled() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.cargo/config.toml".into(),
            concat!(
                "registry.token = \"DOTTED1\"\n",
                "# token = \"COMMENT2\"\n",
                "[registries]\n",
                "corp = { index = \"sparse+https://cargo.corp.test/index/\", token = \"INLINE3\" }\n",
                "[registries.other]\n",
                "index = \"sparse+https://me:URLPW4@cargo.other.test/index/\"\n",
                "\"token\" = \"QUOTED5\"\n",
                "'secret-key' = \"KEY6\"\n",
                "credential-provider = \"cargo:token\"\n",
                "[http]\n",
                "proxy = \"http://u:PROXYPW7@proxy.corp.test:3128\"\n",
                "[https]\n",
                "proxy = \"u:BAREPW8@proxy.corp.test:3128\"\n",
                "[net]\nretry = 3\n",
            )
            .into(),
        );
        let r = find("cargo").unwrap().resolve(&p);
        let copy = &r.files[0].text;
        for s in [
            "DOTTED1",
            "COMMENT2",
            "INLINE3",
            "URLPW4",
            "QUOTED5",
            "KEY6",
            "PROXYPW7",
            "BAREPW8",
            "credential-provider",
        ] {
            assert!(!copy.contains(s), "{s} in the copy:\n{copy}");
        }
        let t: toml::Table = copy.parse().unwrap();
        assert_eq!(t["net"]["retry"].as_integer(), Some(3));
        assert_eq!(
            t["registries"]["corp"]["index"].as_str(),
            Some("sparse+https://cargo.corp.test/index/")
        );
        assert_eq!(
            t["registries"]["other"]["index"].as_str(),
            Some("sparse+https://cargo.other.test/index/")
        );
        assert_eq!(
            t["http"]["proxy"].as_str(),
            Some("http://proxy.corp.test:3128")
        );
        assert_eq!(t["https"]["proxy"].as_str(), Some("proxy.corp.test:3128"));
        let cred = |h: &str| {
            r.credentials
                .iter()
                .filter(|c| c.host == h)
                .map(|c| c.value.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(cred("cargo.corp.test"), ["INLINE3"]);
        assert_eq!(cred("cargo.other.test"), ["QUOTED5"]);
        assert!(cred("proxy.corp.test").is_empty());
        assert!(r
            .hide
            .iter()
            .any(|(h, _)| h == "/home/u/.cargo/config.toml"));
        assert!(r.warnings.iter().any(|w| w.contains("proxy")));
    }

    /// A configuration that does not parse is neither copied nor left
    /// readable.
    #[test]
    fn an_unparsable_config_is_not_copied() {
        let mut p = FakeProbe::default();
        p.files.insert(
            "/home/u/.cargo/config.toml".into(),
            "[registry]\ntoken = \"BROKEN1\"\n[registry]\nx = 1\n".into(),
        );
        let r = find("cargo").unwrap().resolve(&p);
        assert_eq!(r.files[0].text, "");
        assert!(r
            .hide
            .iter()
            .any(|(h, _)| h == "/home/u/.cargo/config.toml"));
        assert!(r.warnings.iter().any(|w| w.contains("cannot be parsed")));
        let s = super::super::secrets_outside(&p, &[]);
        assert!(s
            .hide
            .iter()
            .any(|(h, _)| h == "/home/u/.cargo/config.toml"));
    }

    #[test]
    fn an_empty_machine_learns_the_default_registry_by_observing() {
        let mut p = FakeProbe::default();
        let r = find("cargo").unwrap().resolve(&p);
        assert!(r.hosts.is_empty() && r.notes.iter().any(|n| n.contains("connected nowhere")));
        // What the tool tried is what is allowed, whatever its name.
        p.outputs.insert(
            "observe cargo".into(),
            "idx.example.test:443\nother.example.test:8443\n".into(),
        );
        let r = find("cargo").unwrap().resolve(&p);
        let hosts: Vec<_> = r.hosts.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(hosts, ["idx.example.test", "other.example.test:8443"]);
        assert!(r.hosts[0].1.contains("probe sandbox"));
    }
}
