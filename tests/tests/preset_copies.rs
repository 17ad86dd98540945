//! The presets' credential-free copies of a tool's configuration (SPEC
//! §3.4), end to end (red team round 7): whatever way the user's file
//! spells a secret, the copy the sandbox reads holds none of it (a cargo
//! token as a dotted key, a quoted key or in an inline table; a URL's
//! password; a commented-out token; an npm client key), the variable an
//! `.npmrc` token was read from is not in the sandbox's environment, and
//! the token is still lent: the registry on 127.0.0.1 sees it, added by
//! the proxy. Run as root and as an ordinary user.

use std::path::PathBuf;
use std::sync::Arc;

use airlock_tests::registry::Registry;
use airlock_tests::tls::TestPki;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-preset-copies"))
}

fn show(out: &Out) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.code, out.stdout, out.stderr
    )
}

/// A registry that answers 200 only with `Authorization: <want>`.
fn registry(pki: &TestPki, want: String) -> Registry {
    Registry::start(
        pki,
        Arc::new(move |_m, _path, auth| {
            if auth == Some(want.as_str()) {
                (200, "application/json", b"{}".to_vec())
            } else {
                (401, "application/json", b"{\"error\":\"auth\"}".to_vec())
            }
        }),
    )
}

fn run_as(
    who: Who,
    f: &Fixture,
    pki: &TestPki,
    preset: &str,
    envs: &[(&str, &str)],
    script: &str,
) -> Out {
    let ca = pki.ca_pem.to_str().unwrap().to_string();
    let args = [
        "--upstream-ca",
        &ca,
        "--resolve",
        "registry.test=127.0.0.1",
        "--allow-private",
        "127.0.0.0/8",
        "--ask",
        "deny",
        "--preset",
        preset,
    ];
    let mut cmd = f.command(&args, script);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run(&mut who.wrap(cmd))
}

/// The secrets, by the marker each holds, that must never show inside.
fn assert_none_inside(who: Who, out: &Out, markers: &[&str]) {
    for m in markers {
        assert!(
            !out.stdout.contains(m),
            "{who:?}: {m} is readable inside\n{}",
            show(out)
        );
    }
}

const CARGO_TOKEN: &str = "cargo-inline-tok-7f31c0";

#[test]
fn the_cargo_copy_holds_no_token_however_spelled() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let reg = registry(&pki, CARGO_TOKEN.to_string());
        let p = reg.port();
        f.write(
            "~/.cargo/config.toml",
            &format!(
                "registry.token = \"cargo_DOTTED_SECRET1\"\n\
                 # token = \"cargo_COMMENT_SECRET2\"\n\
                 [registries]\n\
                 corp = {{ index = \"sparse+https://registry.test:{p}/index/\", token = \"{CARGO_TOKEN}\" }}\n\
                 [registries.other]\n\
                 index = \"sparse+https://other.test/index/\"\n\
                 \"token\" = \"cargo_QUOTED_SECRET3\"\n\
                 [http]\n\
                 proxy = \"http://u:cargo_PROXY_SECRET4@proxy.test:3128\"\n\
                 [net]\n\
                 retry = 7\n"
            ),
        );
        who.prepare(&f);
        let script = format!(
            "cat \"$CARGO_HOME/config.toml\" ~/.cargo/config.toml 2>&1; env; \
             curl -s -o /dev/null -w 'get=%{{http_code}}\\n' https://registry.test:{p}/index/config.json"
        );
        let out = run_as(who, &f, &pki, "cargo", &[], &script);
        assert_none_inside(
            who,
            &out,
            &[
                CARGO_TOKEN,
                "cargo_DOTTED_SECRET1",
                "cargo_COMMENT_SECRET2",
                "cargo_QUOTED_SECRET3",
                "cargo_PROXY_SECRET4",
            ],
        );
        // The rest of the user's configuration still applies, and the
        // token is lent by the proxy.
        assert!(out.stdout.contains("retry = 7"), "{who:?}: {}", show(&out));
        assert!(
            out.stdout.contains("get=200"),
            "{who:?}: {}\nregistry saw {:?}",
            show(&out),
            reg.seen()
        );
        assert!(
            reg.seen()
                .iter()
                .any(|s| s.starts_with("GET /index/config.json ") && s.ends_with(CARGO_TOKEN)),
            "{who:?}: the proxy did not add the token: {:?}",
            reg.seen()
        );
        assert!(
            out.stderr
                .contains("the password of cargo's proxy is left out"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// A token read through a variable whose name and value look harmless
/// (a reference token under a plain name).
const REF_VALUE: &str = "cmVmdGtuOjAxOjE3OTk5OTk5OTk6YWlybG9ja1Rlc3Q";

#[test]
fn the_npm_copy_holds_no_other_secret_and_the_token_variable_stays_outside() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let reg = registry(&pki, format!("Bearer {REF_VALUE}"));
        let p = reg.port();
        let key = f.write(
            "~/.npm-certs/client.key",
            "-----BEGIN PRIVATE KEY-----\nnpm_MTLSKEY_SECRET1\n",
        );
        f.write(
            "~/.npmrc",
            &format!(
                "registry=https://registry.test:{p}/\n\
                 //registry.test:{p}/:_authToken=${{JFROG_REF}}\n\
                 https-proxy=http://corpuser:npm_PROXYPW_SECRET2@proxy.test:3128\n\
                 @corp:registry=https://ci:npm_URLPW_SECRET3@corp.test/\n\
                 # old token: //registry.test:{p}/:_authToken=npm_OLDTOKEN_SECRET4\n\
                 //corp.test/:keyfile={}\n\
                 fund=false\n",
                key.display()
            ),
        );
        who.prepare(&f);
        let script = format!(
            "cat \"$NPM_CONFIG_USERCONFIG\" ~/.npmrc ~/.npm-certs/client.key 2>&1; env; \
             curl -s -o /dev/null -w 'get=%{{http_code}}\\n' https://registry.test:{p}/pkg"
        );
        let out = run_as(who, &f, &pki, "npm", &[("JFROG_REF", REF_VALUE)], &script);
        assert_none_inside(
            who,
            &out,
            &[
                REF_VALUE,
                "npm_MTLSKEY_SECRET1",
                "npm_PROXYPW_SECRET2",
                "npm_URLPW_SECRET3",
                "npm_OLDTOKEN_SECRET4",
            ],
        );
        // The copy keeps the settings without their secrets.
        for kept in [
            "fund=false",
            "https-proxy=http://proxy.test:3128",
            "@corp:registry=https://corp.test/",
        ] {
            assert!(
                out.stdout.contains(kept),
                "{who:?}: {kept} lost\n{}",
                show(&out)
            );
        }
        // The variable is withheld, and said to be; the token is lent.
        assert!(
            out.stderr.contains("JFROG_REF"),
            "{who:?}: the withheld variable is not reported\n{}",
            show(&out)
        );
        assert!(
            out.stdout.contains("get=200"),
            "{who:?}: {}\nregistry saw {:?}",
            show(&out),
            reg.seen()
        );
        assert!(
            out.stderr.contains("client certificates are not lent"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// A session's every command brings its caller's environment: the
/// variable an `.npmrc` token is read from is withheld from each, as from
/// a one-shot run.
#[test]
fn a_sessions_commands_do_not_get_the_token_variable() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(
            "~/.npmrc",
            "registry=https://registry.test:4873/\n//registry.test:4873/:_authToken=${JFROG_REF}\n",
        );
        who.prepare(&f);
        let bin = airlock_bin();
        let bin = bin.to_str().expect("a UTF-8 path");
        let name = format!("tokvar-{}", std::process::id());
        let airlock = |args: &[&str]| {
            let mut c = who.host(&f, &f.ws, bin, args);
            c.env("JFROG_REF", REF_VALUE);
            run(&mut c)
        };
        let out = airlock(&["session", "start", "--name", &name, "--preset", "npm"]);
        assert_eq!(out.code, 0, "{who:?}: session start: {}", show(&out));
        let inside = airlock(&["run", "--session", &name, "--", "sh", "-c", "env; echo ran"]);
        let end = airlock(&["session", "end", &name]);
        assert!(inside.stdout.contains("ran"), "{who:?}: {}", show(&inside));
        assert!(
            !inside.stdout.contains(REF_VALUE),
            "{who:?}: the token variable is in a session command's environment\n{}",
            show(&inside)
        );
        assert_eq!(end.code, 0, "{who:?}: session end: {}", show(&end));
    }
}
