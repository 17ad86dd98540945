//! The sandbox's environment (SPEC §4.3): scrubbed to a pass list, secrets
//! never passed unless named exactly, then the proxy variables set.

use std::collections::BTreeMap;

/// Always passed.
const PASS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_*",
    "TZ",
    "PWD",
];

/// Never passed unless `[env].pass` names the variable exactly.
const SECRET: &[&str] = &[
    "*_TOKEN",
    "*_SECRET*",
    "*_KEY",
    "*PASSWORD*",
    "AWS_*",
    "SSH_AUTH_SOCK",
    "DBUS_SESSION_BUS_ADDRESS",
    "LD_PRELOAD",
];

/// `*` matches any run of characters; patterns are matched case-sensitively
/// except that secret patterns also match the lowercase spelling.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            if !name.starts_with(head) {
                return false;
            }
            let tail = &name[head.len()..];
            if rest.is_empty() {
                return true;
            }
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET.iter().any(|p| glob(p, &upper))
}

/// The environment the command sees, before the proxy variables.
pub fn scrub(
    host: impl IntoIterator<Item = (String, String)>,
    extra_pass: &[String],
    set: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in host {
        let exact = extra_pass.iter().any(|p| p == &k);
        let listed = PASS.iter().any(|p| glob(p, &k)) || extra_pass.iter().any(|p| glob(p, &k));
        if exact || (listed && !is_secret(&k)) {
            out.insert(k, v);
        }
    }
    for (k, v) in set {
        out.insert(k.clone(), v.clone());
    }
    out.insert("AIRLOCK_SANDBOX".into(), "1".into());
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

    fn host(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn scrubbed_to_the_pass_list() {
        let env = scrub(
            host(&[
                ("PATH", "/bin"),
                ("LC_ALL", "C"),
                ("GITHUB_TOKEN", "x"),
                ("EDITOR", "vi"),
                ("HOME", "/h"),
            ]),
            &[],
            &BTreeMap::new(),
        );
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert!(env.contains_key("LC_ALL") && env.contains_key("HOME"));
        assert!(!env.contains_key("GITHUB_TOKEN") && !env.contains_key("EDITOR"));
        assert_eq!(env.get("AIRLOCK_SANDBOX").map(String::as_str), Some("1"));
    }

    #[test]
    fn secrets_need_an_exact_name() {
        let vars = host(&[
            ("NPM_TOKEN", "t"),
            ("MY_API_KEY", "k"),
            ("AWS_REGION", "r"),
            ("DB_PASSWORD", "p"),
            ("SSH_AUTH_SOCK", "s"),
        ]);
        let env = scrub(vars.clone(), &["*".to_string()], &BTreeMap::new());
        for k in [
            "NPM_TOKEN",
            "MY_API_KEY",
            "AWS_REGION",
            "DB_PASSWORD",
            "SSH_AUTH_SOCK",
        ] {
            assert!(!env.contains_key(k), "{k} leaked through a glob");
        }
        let env = scrub(vars, &["NPM_TOKEN".to_string()], &BTreeMap::new());
        assert!(env.contains_key("NPM_TOKEN"));
        assert!(!env.contains_key("MY_API_KEY"));
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
