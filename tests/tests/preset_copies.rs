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

const GLOBAL_TOKEN: &str = "npm-global-tok-41c9e2-never-inside";

/// npm's global config (`npm config set --location=global`; with nvm it
/// lies under HOME) is treated like the user's (red team round 8): with
/// or without the preset its token is not readable inside, neither in the
/// file nor in the environment; npm inside still reads its other settings
/// from a copy; under the preset the proxy lends the token, so npm still
/// fetches from the registry that wants it.
#[test]
fn the_npm_global_config_keeps_its_token_outside() {
    let npm = std::process::Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let pki = TestPki::new(&f.home.join("pki"), &["registry.test"]);
        let want = format!("Bearer {GLOBAL_TOKEN}");
        let port = Arc::new(std::sync::OnceLock::<u16>::new());
        let p2 = port.clone();
        let reg = Registry::start(
            &pki,
            Arc::new(move |_m, path, auth| {
                if auth != Some(want.as_str()) {
                    return (401, "application/json", b"{\"error\":\"auth\"}".to_vec());
                }
                let port = p2.get().copied().unwrap_or(0);
                match path {
                    "/airlock-demo" => (
                        200,
                        "application/json",
                        format!(
                            "{{\"name\":\"airlock-demo\",\"dist-tags\":{{\"latest\":\"1.0.0\"}},\"versions\":{{\"1.0.0\":{{\"name\":\"airlock-demo\",\"version\":\"1.0.0\",\"dist\":{{\"tarball\":\"https://registry.test:{port}/airlock-demo/-/airlock-demo-1.0.0.tgz\",\"shasum\":\"0\"}}}}}}}}"
                        )
                        .into_bytes(),
                    ),
                    _ => (404, "application/json", b"{}".to_vec()),
                }
            }),
        );
        let _ = port.set(reg.port());
        let p = reg.port();
        let global = f.write(
            "~/.nvm/versions/node/v20.11.0/etc/npmrc",
            &format!(
                "registry=https://registry.test:{p}/\n\
                 //registry.test:{p}/:_authToken={GLOBAL_TOKEN}\n\
                 init-author-name=airlock-global-setting\n"
            ),
        );
        f.write("~/.npmrc", "fund=false\n");
        who.prepare(&f);
        let g = global.display();
        let script = format!(
            "cat {g} \"$NPM_CONFIG_GLOBALCONFIG\" 2>&1; env; \
             curl -sk -o /dev/null -w 'get=%{{http_code}}\\n' https://registry.test:{p}/airlock-demo; \
             if command -v npm >/dev/null; then \
               echo \"setting=$(npm config get init-author-name)\"; \
               echo \"view=$(npm view airlock-demo version --loglevel=error 2>&1)\"; \
             fi"
        );
        let globalconfig = global.to_str().expect("a UTF-8 path");
        let allow = format!("registry.test:{p}");
        for preset in [true, false] {
            let ca = pki.ca_pem.to_str().unwrap().to_string();
            let mut args = vec![
                "--upstream-ca",
                &ca,
                "--resolve",
                "registry.test=127.0.0.1",
                "--allow-private",
                "127.0.0.0/8",
                "--ask",
                "deny",
            ];
            if preset {
                args.extend(["--preset", "npm"]);
            } else {
                // Without the preset the registry is allowed by hand: the
                // token must still not be readable, and nothing lends it
                // (`curl -k`: the connection is the test CA's, not
                // inspected).
                args.extend(["--allow", &allow]);
            }
            let mut cmd = f.command(&args, &script);
            cmd.env("NPM_CONFIG_GLOBALCONFIG", globalconfig);
            let out = run(&mut who.wrap(cmd));
            assert!(
                !out.stdout.contains(GLOBAL_TOKEN) && !out.stderr.contains(GLOBAL_TOKEN),
                "{who:?} (preset {preset}): the global config's token is readable inside\n{}",
                show(&out)
            );
            // The global config's other settings still reach npm inside.
            assert!(
                out.stdout
                    .contains("init-author-name=airlock-global-setting"),
                "{who:?} (preset {preset}): the copy lost a setting\n{}",
                show(&out)
            );
            if npm {
                assert!(
                    out.stdout.contains("setting=airlock-global-setting"),
                    "{who:?} (preset {preset}): npm does not read the copy\n{}",
                    show(&out)
                );
            }
            let fetched = if preset { "get=200" } else { "get=401" };
            assert!(
                out.stdout.contains(fetched),
                "{who:?} (preset {preset}): {}\nregistry saw {:?}",
                show(&out),
                reg.seen()
            );
            if preset && npm {
                assert!(
                    out.stdout.contains("view=1.0.0"),
                    "{who:?}: npm did not fetch with the lent token\n{}\nregistry saw {:?}",
                    show(&out),
                    reg.seen()
                );
            }
        }
        assert!(
            reg.seen()
                .iter()
                .any(|s| s.starts_with("GET /airlock-demo ") && s.ends_with(GLOBAL_TOKEN)),
            "{who:?}: the proxy did not add the token: {:?}",
            reg.seen()
        );
        // The user's file outside is untouched.
        let kept = std::fs::read_to_string(&global).expect("the global config");
        assert!(
            kept.contains(GLOBAL_TOKEN),
            "{who:?}: the global config was changed"
        );
    }
}
