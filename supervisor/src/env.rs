//! The sandbox's environment (SPEC §4.3): the host's, less what looks
//! like a secret (or only the strict pass list with `[env] inherit =
//! "none"`); secrets pass only when named exactly; then what airlock and
//! the policy set, which wins over anything inherited.

use std::collections::BTreeMap;

use airlock_policy::env::{glob, secret_name, secret_value, STRICT_PASS};
use airlock_policy::{EnvInherit, Located, Origin};

/// How many names one glob warning lists before counting the rest.
const WARN_NAMES: usize = 5;

/// The environment the command sees, before the proxy variables, and what
/// was left out.
#[derive(Debug, Default)]
pub struct Scrubbed {
    pub env: BTreeMap<String, String>,
    /// Host variables that did not enter the sandbox (names only, sorted).
    /// Inherited proxy variables, replaced by the sandbox's own, are not
    /// among them, nor anything the policy or a preset sets.
    pub withheld: Vec<String>,
    /// `[env].pass` globs that matched a withheld name, for stderr.
    pub warnings: Vec<String>,
}

/// A proxy variable of any spelling (`HTTP_PROXY`, `https_proxy`,
/// `npm_config_https_proxy`, `NO_PROXY`...). An inherited one would point
/// the command at the host's proxy instead of the sandbox's: the sandbox's
/// own are set in both cases instead. `GOPROXY` (the module mirror) is not
/// one.
fn is_proxy_var(name: &str) -> bool {
    name.to_ascii_uppercase().ends_with("_PROXY")
}

/// How a pass entry is named in a warning: the flag as typed, or the
/// policy line.
fn label(p: &Located<String>) -> String {
    match &p.origin {
        Origin::Flag { .. } => format!("--pass-env '{}'", p.value),
        o => format!("[env] pass '{}' ({o})", p.value),
    }
}

/// Scrub the host environment. `also_secret`: names withheld whatever
/// they look like (those a `[[network.credential]]` reads, which the proxy
/// adds so that the sandbox never sees them). `drop_proxy`: the sandbox
/// has no host network (proxy or none), so the host's proxy variables
/// mean nothing there.
/// How the host's environment is filtered for the sandbox: kept for a
/// session, whose every command brings its caller's environment.
#[derive(Debug, Clone)]
pub struct Rule {
    pub inherit: EnvInherit,
    pub pass: Vec<Located<String>>,
    pub set: BTreeMap<String, String>,
    pub also_secret: Vec<String>,
    pub drop_proxy: bool,
}

impl Rule {
    pub fn apply(&self, host: impl IntoIterator<Item = (String, String)>) -> Scrubbed {
        scrub(
            host,
            self.inherit,
            &self.pass,
            &self.set,
            &self.also_secret,
            self.drop_proxy,
        )
    }
}

pub fn scrub(
    host: impl IntoIterator<Item = (String, String)>,
    inherit: EnvInherit,
    pass: &[Located<String>],
    set: &BTreeMap<String, String>,
    also_secret: &[String],
    drop_proxy: bool,
) -> Scrubbed {
    let mut out = Scrubbed::default();
    let mut glob_hits: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (k, v) in host {
        if drop_proxy && is_proxy_var(&k) {
            continue;
        }
        if pass.iter().any(|p| p.value == k) {
            out.env.insert(k, v);
            continue;
        }
        if secret_name(&k) || secret_value(&v) || also_secret.contains(&k) {
            for (i, p) in pass.iter().enumerate() {
                if p.value.contains('*') && glob(&p.value, &k) {
                    glob_hits.entry(i).or_default().push(k.clone());
                }
            }
            out.withheld.push(k);
            continue;
        }
        let listed =
            || STRICT_PASS.iter().any(|p| glob(p, &k)) || pass.iter().any(|p| glob(&p.value, &k));
        if inherit == EnvInherit::All || listed() {
            out.env.insert(k, v);
        } else {
            out.withheld.push(k);
        }
    }
    for (k, v) in set {
        out.env.insert(k.clone(), v.clone());
    }
    out.env.insert("AIRLOCK_SANDBOX".into(), "1".into());
    out.withheld.retain(|k| !out.env.contains_key(k));
    out.withheld.sort();
    out.withheld.dedup();
    for (i, mut names) in glob_hits {
        names.retain(|k| !out.env.contains_key(k));
        if names.is_empty() {
            continue;
        }
        names.sort();
        let n = names.len();
        let mut listed = names
            .iter()
            .take(WARN_NAMES)
            .map(|k| airlock_proxy::escape::line(k, 100))
            .collect::<Vec<_>>()
            .join(", ");
        if n > WARN_NAMES {
            listed.push_str(&format!(" and {} more", n - WARN_NAMES));
        }
        let (looks, it) = if n == 1 {
            ("which looks like a secret and is withheld", "name it")
        } else {
            ("which look like secrets and are withheld", "name each")
        };
        out.warnings.push(format!(
            "{} matches {listed}, {looks}; {it} exactly to pass it",
            label(&pass[i])
        ));
    }
    out
}

/// The proxy variables, in both cases, for a proxy on loopback `port`.
pub fn add_proxy(env: &mut BTreeMap<String, String>, port: u16) {
    let http = format!("http://127.0.0.1:{port}");
    let socks = format!("socks5h://127.0.0.1:{port}");
    for (k, v) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
    ] {
        env.insert(k.to_string(), v.clone());
        env.insert(k.to_ascii_lowercase(), v.clone());
    }
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    env.insert("NO_PROXY".into(), no_proxy.clone());
    env.insert("no_proxy".into(), no_proxy);
    env.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    let java = format!(
        "-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={port} -Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort={port} -Dhttp.nonProxyHosts=localhost|127.0.0.1"
    );
    let merged = match env.get("JAVA_TOOL_OPTIONS") {
        Some(old) if !old.is_empty() => format!("{old} {java}"),
        _ => java,
    };
    env.insert("JAVA_TOOL_OPTIONS".into(), merged);
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_policy::Layer;

    fn host(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn flag(name: &str) -> Located<String> {
        Located::new(
            name.to_string(),
            Layer::CommandLine,
            Origin::Flag {
                flag: format!("--pass-env {name}"),
            },
        )
    }

    fn all(vars: &[(&str, &str)], pass: &[Located<String>]) -> Scrubbed {
        scrub(
            host(vars),
            EnvInherit::All,
            pass,
            &BTreeMap::new(),
            &[],
            true,
        )
    }

    #[test]
    fn inherited_less_what_looks_like_a_secret() {
        let s = all(
            &[
                ("PATH", "/bin"),
                ("CI", "1"),
                ("NODE_ENV", "production"),
                ("JAVA_HOME", "/opt/jdk"),
                ("GIT_AUTHOR_NAME", "A U Thor"),
                ("GITHUB_TOKEN", "x"),
                ("npm_token", "x"),
                ("CLIENT_SECRET_ID", "x"),
                ("MY_API_KEY", "x"),
                ("DB_PASSWORD", "x"),
                ("DOCKER_CREDENTIALS", "x"),
                ("NPM_CONFIG__AUTH", "x"),
                ("AWS_REGION", "eu"),
                ("SSH_AUTH_SOCK", "/s"),
                ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/b"),
                ("LD_PRELOAD", "/x.so"),
                ("ld_library_path", "/lib"),
                ("DATABASE_URL", "postgres://app:pw@db/app"),
                ("REPO", "https://ghp_x@github.com/a/b"),
                ("MIRRORS", "https://a.test https://u:p@b.test"),
                ("PLAIN_URL", "https://example.test/x"),
            ],
            &[],
        );
        for k in [
            "PATH",
            "CI",
            "NODE_ENV",
            "JAVA_HOME",
            "GIT_AUTHOR_NAME",
            "PLAIN_URL",
        ] {
            assert!(s.env.contains_key(k), "{k} was not inherited");
        }
        assert_eq!(
            s.withheld,
            [
                "AWS_REGION",
                "CLIENT_SECRET_ID",
                "DATABASE_URL",
                "DBUS_SESSION_BUS_ADDRESS",
                "DB_PASSWORD",
                "DOCKER_CREDENTIALS",
                "GITHUB_TOKEN",
                "LD_PRELOAD",
                "MIRRORS",
                "MY_API_KEY",
                "NPM_CONFIG__AUTH",
                "REPO",
                "SSH_AUTH_SOCK",
                "ld_library_path",
                "npm_token",
            ]
        );
        for k in &s.withheld {
            assert!(!s.env.contains_key(k), "{k} leaked");
        }
        assert_eq!(s.env["AIRLOCK_SANDBOX"], "1");
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn a_glob_never_passes_a_secret_and_says_so() {
        let vars = [
            ("MY_API_KEY", "k"),
            ("MY_TOKEN", "t"),
            ("MY_SETTING", "s"),
            ("NPM_TOKEN", "t"),
        ];
        let s = all(&vars, &[flag("MY_*")]);
        assert!(s.env.contains_key("MY_SETTING"));
        assert!(!s.env.contains_key("MY_API_KEY") && !s.env.contains_key("MY_TOKEN"));
        assert_eq!(
            s.warnings,
            ["--pass-env 'MY_*' matches MY_API_KEY, MY_TOKEN, which look like secrets and are withheld; name each exactly to pass it"]
        );
        let s = all(&vars[..1], &[flag("MY_*")]);
        assert_eq!(
            s.warnings,
            ["--pass-env 'MY_*' matches MY_API_KEY, which looks like a secret and is withheld; name it exactly to pass it"]
        );
        let file = Located::new(
            "*".to_string(),
            Layer::Project,
            Origin::File {
                path: "airlock.toml".into(),
                line: 3,
            },
        );
        let s = all(&vars, &[file]);
        assert!(s.warnings[0].starts_with("[env] pass '*' (airlock.toml:3) matches"));
        // Named exactly, it passes; the glob still warns about the others.
        let s = all(&vars, &[flag("MY_*"), flag("MY_API_KEY")]);
        assert_eq!(s.env["MY_API_KEY"], "k");
        assert_eq!(s.withheld, ["MY_TOKEN", "NPM_TOKEN"]);
        assert!(s.warnings[0].contains("matches MY_TOKEN, which looks"));
        // A URL with credentials named exactly passes too.
        let s = all(
            &[("DATABASE_URL", "postgres://a:b@db/x")],
            &[flag("DATABASE_URL")],
        );
        assert!(s.env.contains_key("DATABASE_URL") && s.withheld.is_empty());
    }

    #[test]
    fn inherit_none_is_the_strict_pass_list() {
        let vars = [
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("HOME", "/h"),
            ("CI", "1"),
            ("EDITOR", "vi"),
            ("MY_SETTING", "s"),
            ("MY_KEY", "k"),
            ("GITHUB_TOKEN", "x"),
        ];
        let s = scrub(
            host(&vars),
            EnvInherit::None,
            &[flag("MY_*"), flag("EDITOR")],
            &BTreeMap::new(),
            &[],
            true,
        );
        for k in ["PATH", "LC_ALL", "HOME", "EDITOR", "MY_SETTING"] {
            assert!(s.env.contains_key(k), "{k} missing");
        }
        assert_eq!(s.withheld, ["CI", "GITHUB_TOKEN", "MY_KEY"]);
        assert_eq!(s.warnings.len(), 1);
    }

    #[test]
    fn set_and_proxy_variables_win_over_inherited_ones() {
        let vars = [
            ("HTTP_PROXY", "http://corp:8080"),
            ("https_proxy", "http://corp:8080"),
            ("Http_Proxy", "http://corp:8080"),
            ("npm_config_https_proxy", "http://corp:8080"),
            ("NO_PROXY", "corp.internal"),
            ("GOPROXY", "https://goproxy.corp.test"),
            ("AIRLOCK_SANDBOX", "0"),
            ("CI", "false"),
            ("PIP_INDEX_URL", "https://me:pw@pypi.corp.test/simple"),
        ];
        let set: BTreeMap<String, String> = [
            ("CI", "1"),
            ("PIP_INDEX_URL", "https://pypi.corp.test/simple"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut s = scrub(host(&vars), EnvInherit::All, &[], &set, &[], true);
        add_proxy(&mut s.env, 3128);
        assert_eq!(s.env["HTTP_PROXY"], "http://127.0.0.1:3128");
        assert_eq!(s.env["https_proxy"], "http://127.0.0.1:3128");
        assert_eq!(s.env["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert!(!s.env.contains_key("Http_Proxy"));
        assert!(!s.env.contains_key("npm_config_https_proxy"));
        assert_eq!(s.env["GOPROXY"], "https://goproxy.corp.test");
        assert_eq!(s.env["AIRLOCK_SANDBOX"], "1");
        assert_eq!(s.env["CI"], "1");
        assert_eq!(s.env["PIP_INDEX_URL"], "https://pypi.corp.test/simple");
        assert!(s.withheld.is_empty(), "{:?}", s.withheld);
        // With the host's network, its proxy is the command's to use.
        let s = scrub(host(&vars), EnvInherit::All, &[], &set, &[], false);
        assert_eq!(s.env["HTTP_PROXY"], "http://corp:8080");
        // What a credential reads stays outside, whatever its name.
        let s = scrub(
            host(&[("ORG_API_BEARER", "b"), ("CI", "1")]),
            EnvInherit::All,
            &[],
            &BTreeMap::new(),
            &["ORG_API_BEARER".to_string()],
            true,
        );
        assert_eq!(s.withheld, ["ORG_API_BEARER"]);
    }

    #[test]
    fn proxy_variables() {
        let mut env = BTreeMap::new();
        add_proxy(&mut env, 3128);
        assert_eq!(env["HTTPS_PROXY"], "http://127.0.0.1:3128");
        assert_eq!(env["all_proxy"], "socks5h://127.0.0.1:3128");
        assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert_eq!(env["NODE_USE_ENV_PROXY"], "1");
        assert!(env["JAVA_TOOL_OPTIONS"].contains("-Dhttps.proxyPort=3128"));
    }
}
