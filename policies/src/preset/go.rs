//! Go modules: the module proxy and checksum database from GOPROXY,
//! GOSUMDB and GOPRIVATE (env, else `go env`, which also reads go's own
//! env file); airlock-owned module and build caches.

use super::{Probe, Resolved};

/// Variables `go` reads for where modules come from, passed when set.
const PASS: &[&str] = &[
    "GOPROXY",
    "GOSUMDB",
    "GOPRIVATE",
    "GONOPROXY",
    "GONOSUMDB",
    "GOINSECURE",
    "GOFLAGS",
    "GOTOOLCHAIN",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

pub(super) fn resolve(p: &dyn Probe, r: &mut Resolved) {
    for var in PASS {
        r.pass_env(p, var);
    }
    // What the environment does not say, `go env` does (its defaults and
    // `go env -w` settings), asked in the probe sandbox.
    let missing: Vec<&str> = ["GOPROXY", "GOSUMDB", "GOPRIVATE"]
        .into_iter()
        .filter(|v| p.env(v).is_none())
        .collect();
    if !missing.is_empty() {
        let mut argv = vec!["go", "env"];
        argv.extend(&missing);
        match p.output(&argv) {
            Some(out) => {
                for (var, value) in missing.iter().zip(out.lines()) {
                    let value = value.trim();
                    if !value.is_empty() {
                        let env = SingleVar(var, value);
                        r.pass_env(&env, var);
                        if let Some(e) = r.env.iter_mut().find(|(n, _, _)| n == var) {
                            e.2 = "`go env`".into();
                        }
                    }
                }
            }
            None => r
                .notes
                .push("go: `go env` did not run (is go installed?)".into()),
        }
    }
    let get = |r: &Resolved, var: &str| {
        r.env
            .iter()
            .find(|(n, _, _)| n == var)
            .map(|(_, v, from)| (v.clone(), from.clone()))
    };
    if let Some((proxy, from)) = get(r, "GOPROXY") {
        for entry in proxy.split([',', '|']) {
            match entry.trim() {
                "direct" => r.notes.push(
                    "go: GOPROXY includes `direct`: modules it falls back to come from their version-control hosts, which are not allowed by this preset".into(),
                ),
                "off" | "" => {}
                url => r.add_url(url, from.clone()),
            }
        }
    }
    if let Some((sumdb, from)) = get(r, "GOSUMDB") {
        // `name`, `name+key` or `name+key url`; the database is at the URL,
        // else at https://name.
        let mut words = sumdb.split_whitespace();
        let name = words.next().unwrap_or("");
        match words.next() {
            Some(url) => r.add_url(url, from),
            None if name != "off" && !name.is_empty() => {
                let host = name.split('+').next().unwrap_or(name);
                r.add_url(&format!("https://{host}/"), from);
            }
            None => {}
        }
    }
    if let Some((private, from)) = get(r, "GOPRIVATE") {
        // Private modules are fetched from their own hosts directly.
        for pat in private.split(',') {
            let host = pat.trim().split('/').next().unwrap_or("");
            if !host.is_empty() && !host.contains(['*', '?', '[']) {
                r.add_url(
                    &format!("https://{host}/"),
                    format!("{from} (private modules)"),
                );
            }
        }
    }
    r.own_cache(p, "GOMODCACHE", "go/mod");
    r.own_cache(p, "GOCACHE", "go/build");
}

/// A probe that knows one variable: to pass a value `go env` printed
/// through the same cleaning as the environment's.
struct SingleVar<'a>(&'a str, &'a str);

impl Probe for SingleVar<'_> {
    fn env(&self, name: &str) -> Option<String> {
        (name == self.0).then(|| self.1.to_string())
    }
    fn env_vars(&self) -> Vec<(String, String)> {
        vec![(self.0.into(), self.1.into())]
    }
    fn read(&self, _: &std::path::Path) -> Option<String> {
        None
    }
    fn list_dir(&self, _: &std::path::Path) -> Vec<String> {
        vec![]
    }
    fn output(&self, _: &[&str]) -> Option<String> {
        None
    }
    fn home(&self) -> Option<std::path::PathBuf> {
        None
    }
    fn workspace(&self) -> std::path::PathBuf {
        "/".into()
    }
}

#[cfg(test)]
mod tests {
    use super::super::find;
    use super::super::tests::FakeProbe;

    #[test]
    fn proxy_sumdb_private_and_caches() {
        let mut p = FakeProbe::default();
        p.env.insert(
            "GOPROXY".into(),
            "https://u:pw@goproxy.corp.test/mod,direct".into(),
        );
        p.outputs.insert(
            "go env GOSUMDB GOPRIVATE".into(),
            "sumdb.example.test\ngit.corp.test/team,*.internal.test\n".into(),
        );
        let r = find("go").unwrap().resolve(&p);
        let hosts: Vec<_> = r.hosts.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(
            hosts,
            ["goproxy.corp.test", "sumdb.example.test", "git.corp.test"]
        );
        let env = |k: &str| {
            r.env
                .iter()
                .find(|(n, _, _)| n == k)
                .map(|(_, v, _)| v.clone())
        };
        assert_eq!(
            env("GOPROXY").as_deref(),
            Some("https://goproxy.corp.test/mod,direct")
        );
        assert_eq!(env("GOSUMDB").as_deref(), Some("sumdb.example.test"));
        assert_eq!(
            env("GOMODCACHE").as_deref(),
            Some("/home/u/.cache/airlock/projects/proj-277ae841cc3b5609/go/mod")
        );
        assert_eq!(r.credentials[0].host, "goproxy.corp.test");
        assert!(r.notes.iter().any(|n| n.contains("direct")));
    }
}
