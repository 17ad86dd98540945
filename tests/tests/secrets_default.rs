//! Secrets a user expects to stay outside without listing them (SPEC §3.3):
//! a project's `.env` files, git's XDG credential store and the credential
//! files and histories of the other tools a developer uses. Each case runs
//! as root and as an ordinary user; what is not a secret stays readable.

use std::path::PathBuf;

use airlock_tests::repos::show;
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-secrets"))
}

/// Home-relative secret stores, each with a distinct secret.
const HOME_SECRETS: &[&str] = &[
    ".config/git/credentials",
    ".pypirc",
    ".gem/credentials",
    ".m2/settings-security.xml",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".config/composer/auth.json",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".config/containers/auth.json",
    "run/containers/auth.json",
    ".pgpass",
    ".my.cnf",
    ".s3cfg",
    ".config/rclone/rclone.conf",
    ".config/hub",
    ".config/glab-cli/config.yml",
    ".config/op/config",
    ".password-store/email.gpg",
    ".local/share/keyrings/login.keyring",
    ".config/Code/User/globalStorage/state.vscdb",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    ".python_history",
    ".node_repl_history",
    ".irb_history",
    ".rediscli_history",
    // Coding agents' logins, data platforms, deploy CLIs, helm, vault
    // password files (red team: readable by default before).
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
    ".config/github-copilot/apps.json",
    ".config/configstore/firebase-tools.json",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".huggingface_token",
    ".kaggle/kaggle.json",
    ".databrickscfg",
    ".snowsql/config",
    ".jfrog/jfrog-cli.conf.v6",
    ".netlify/config.json",
    ".vercel/auth.json",
    ".local/share/com.vercel.cli/auth.json",
    ".wrangler/config/default.toml",
    ".config/.wrangler/config/default.toml",
    ".vault_pass",
    ".ansible-vault-pass",
    ".config/helm/repositories.yaml",
    "ops/pw.txt",
    // Red team round 7.
    ".config/pypoetry/auth.toml",
    ".local/share/uv/credentials/credentials.toml",
    ".sbt/.credentials",
    ".config/dart/pub-tokens.json",
    ".dockercfg",
    ".cloudflared/cert.pem",
    ".config/ngrok/ngrok.yml",
    ".dbt/profiles.yml",
    ".config/sops/age/keys.txt",
    ".zhistory",
    ".local/share/atuin/history.db",
    ".pki/nssdb/key4.db",
    ".thunderbird/profiles.ini",
];

/// Beside the secrets, what the same tools need and is no secret stays
/// readable.
const HOME_READABLE: &[&str] = &[
    ".claude/settings.json",
    ".cache/huggingface/hub/model.txt",
    ".config/helm/plugins.txt",
];

/// Workspace files: (path, hidden).
const WS_FILES: &[(&str, bool)] = &[
    (".env", true),
    (".env.local", true),
    (".env.production", true),
    ("apps/web/.env", true),
    ("apps/web/.env.development.local", true),
    (".env.example", false),
    (".env.sample", false),
    (".env.template", false),
    ("apps/web/.env.local.example", false),
    // A virtual environment named .env is a directory, not a secret.
    ("py/.env/bin/activate", false),
    ("README.md", false),
    (".dev.vars", true),
    ("worker/.dev.vars.staging", true),
    (".secrets.toml", true),
    ("conf/.secrets.local.yaml", true),
    (".streamlit/secrets.toml", true),
    (".dev.vars.example", false),
    (".secrets.baseline", false),
    (".streamlit/config.toml", false),
    // Flask's convention: public settings, committed; secrets go to .env.
    (".flaskenv", false),
    // Red team round 7: other spellings, Rails' keys.
    (".env-local", true),
    (".env_prod", true),
    (".env-example", false),
    ("config/master.key", true),
    ("config/credentials/production.key", true),
    ("config/credentials/production.yml.enc", false),
    // Red team round 12: editors' copies, cookiecutter-django's layout.
    (".env~", true),
    ("#.env#", true),
    ("worker/.dev.vars~", true),
    (".envs/.production/.django", true),
    (".envs/.local/.postgres", true),
    (".env.example~", false),
    // Round 13: a file manager's copy, Compose's `env_file` names.
    (".env copy", true),
    ("config/prod.env", true),
    ("config/example.env", false),
];

fn secret(rel: &str) -> String {
    // Delimited: one name is a prefix of another (.env, .env.example).
    format!("SECRET<{rel}>")
}

#[test]
fn env_files_and_tool_credentials_are_unreadable_and_the_rest_readable() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        for rel in HOME_SECRETS {
            f.write(&format!("~/{rel}"), &secret(rel));
        }
        f.write("~/.gitconfig", "[user]\n\tname = allowed-home-file\n");
        for rel in HOME_READABLE {
            f.write(&format!("~/{rel}"), &secret(rel));
        }
        for (rel, _) in WS_FILES {
            f.write(rel, &secret(rel));
        }
        who.prepare(&f);
        let mut script = String::new();
        for rel in HOME_SECRETS {
            script.push_str(&format!("cat \"$HOME/{rel}\" 2>/dev/null; echo\n"));
        }
        for rel in HOME_READABLE {
            script.push_str(&format!("cat \"$HOME/{rel}\" 2>/dev/null; echo\n"));
        }
        for (rel, _) in WS_FILES {
            script.push_str(&format!("cat '{rel}' 2>/dev/null; echo\n"));
        }
        // Writing through a hidden .env changes nothing outside; new files
        // in the workspace (beside it) work.
        script.push_str(
            "cat ~/.gitconfig; echo overwritten > .env 2>/dev/null; \
             echo made > new-file && cat new-file; echo done\n",
        );
        let mut cmd = f.command(&["--network", "none"], &script);
        cmd.env("XDG_RUNTIME_DIR", f.home.join("run"));
        // A vault password file where the user's environment names it.
        cmd.env("ANSIBLE_VAULT_PASSWORD_FILE", f.home.join("ops/pw.txt"));
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        for rel in HOME_SECRETS {
            assert!(
                !out.stdout.contains(&secret(rel)),
                "{who:?}: ~/{rel} was readable inside: {}",
                show(&out)
            );
        }
        for rel in HOME_READABLE {
            assert!(
                out.stdout.contains(&secret(rel)),
                "{who:?}: ~/{rel} should stay readable: {}",
                show(&out)
            );
        }
        for (rel, hidden) in WS_FILES {
            assert_eq!(
                out.stdout.contains(&secret(rel)),
                !hidden,
                "{who:?}: {rel} (hidden: {hidden}): {}",
                show(&out)
            );
        }
        assert!(
            out.stdout.contains("allowed-home-file") && out.stdout.contains("made"),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(
            std::fs::read_to_string(f.ws.join(".env")).unwrap(),
            secret(".env"),
            "{who:?}"
        );
    }
}

#[test]
fn policy_explain_path_names_the_rule() {
    let f = Fixture::new_in(&base());
    f.write(".env", "K=v");
    f.write(".env.example", "K=");
    f.write("~/.pypirc", "x");
    f.write("src/main.rs", "");
    for p in [
        ".dev.vars",
        ".secrets.toml",
        ".streamlit/secrets.toml",
        ".flaskenv",
    ] {
        f.write(p, "K=v");
    }
    let explain = |p: &str| {
        let mut c = airlock(&f.home);
        c.current_dir(&f.ws)
            .env(
                "AIRLOCK_MANAGED_POLICY",
                f.home.join("no-managed-policy.toml"),
            )
            .args(["policy", "explain", "--path", p]);
        let out = run(&mut c);
        assert_eq!(out.code, 0, "{p}: {}", show(&out));
        out.stdout
    };
    let out = explain(".env");
    assert!(
        out.contains("read:     no") && out.contains(".env, .env.*"),
        "{out}"
    );
    let out = explain(".env.example");
    assert!(
        out.contains("read:     yes") && out.contains("write:    yes"),
        "{out}"
    );
    let home_pypirc = f.home.join(".pypirc");
    let out = explain(home_pypirc.to_str().unwrap());
    assert!(
        out.contains("read:     no") && out.contains("deny_read \"~/.pypirc\""),
        "{out}"
    );
    for (p, rule) in [
        (".dev.vars", ".dev.vars"),
        (".secrets.toml", ".secrets.*"),
        (".streamlit/secrets.toml", ".streamlit/secrets.toml"),
    ] {
        let out = explain(p);
        assert!(
            out.contains("read:     no") && out.contains(rule),
            "{p}: {out}"
        );
    }
    let out = explain(".flaskenv");
    assert!(out.contains("read:     yes"), "{out}");
    for rel in [
        ".claude/.credentials.json",
        ".cache/huggingface/token",
        ".kaggle/kaggle.json",
        ".config/configstore",
    ] {
        let out = explain(f.home.join(rel).to_str().unwrap());
        assert!(
            out.contains("read:     no") && out.contains(&format!("deny_read \"~/{rel}\"")),
            "{rel}: {out}"
        );
    }
    let out = explain("src/main.rs");
    assert!(
        out.contains("read:     yes") && out.contains("write:    yes: write \".\""),
        "{out}"
    );
    let out = explain(".git/hooks/pre-commit");
    assert!(
        out.contains("write:    no") && out.contains(".git/hooks"),
        "{out}"
    );
    let out = explain("/etc/hostname");
    assert!(
        out.contains("write:    no: not inside a writable root"),
        "{out}"
    );
}

#[test]
fn a_hard_linked_env_file_is_refused_not_read_through_its_other_name() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(".env", &secret(".env"));
        std::fs::hard_link(f.ws.join(".env"), f.ws.join("stash")).unwrap();
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(&["--network", "none"], "cat stash; echo ran")));
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            !out.stdout.contains(&secret(".env")) && !out.stdout.contains("ran"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(out.stderr.contains("hard links"), "{who:?}: {}", show(&out));
    }
}

/// A `.env` file git tracks with its own content is in the repository the
/// sandbox reads anyway: it stays readable, so git inside does not see it
/// emptied and `git commit -a` does not record it empty (harness round 11).
/// One git tracks with other content (local edits), or one only staged by
/// an earlier run and marked unchanged, stays hidden, and the run says git
/// sees it emptied.
#[test]
fn env_files_git_tracks_as_they_are_stay_readable_and_are_not_committed_empty() {
    if std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(".env.development", "PUBLIC_URL=http://localhost\n");
        f.write(".env.production", "PUBLIC_URL=https://example.invalid\n");
        f.write(".env", &secret(".env"));
        f.write(".env.staged", "");
        let git = |args: &[&str]| {
            let st = std::process::Command::new("git")
                .args(["-c", "user.email=t@t", "-c", "user.name=t"])
                .args(args)
                .current_dir(&f.ws)
                .status()
                .unwrap();
            assert!(st.success(), "git {args:?}");
        };
        git(&["init", "-q", "."]);
        git(&["add", ".env.development", ".env.production", ".env.staged"]);
        git(&["commit", "-q", "-m", "defaults"]);
        git(&["update-index", "--assume-unchanged", ".env.staged"]);
        f.write(".env.production", &secret(".env.production"));
        f.write(".env.staged", &secret(".env.staged"));
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "cat .env.development .env .env.production .env.staged; \
             git -c safe.directory='*' status --porcelain; \
             git -c safe.directory='*' -c user.email=t@t -c user.name=t commit -qam inside; echo committed",
        )));
        assert!(out.stdout.contains("committed"), "{who:?}: {}", show(&out));
        assert!(
            out.stdout.contains("PUBLIC_URL=http://localhost"),
            "{who:?}: {}",
            show(&out)
        );
        for hidden in [".env", ".env.production", ".env.staged"] {
            assert!(
                !out.stdout.contains(&secret(hidden)),
                "{who:?}: {hidden}: {}",
                show(&out)
            );
        }
        assert!(
            !out.stdout.contains(".env.development"),
            "{who:?}: git saw the tracked file changed: {}",
            show(&out)
        );
        assert!(
            out.stderr.contains(".env.production is hidden")
                && out.stderr.contains("git inside sees it emptied"),
            "{who:?}: {}",
            show(&out)
        );
        // The file git holds as it was is still what HEAD holds.
        let head = std::process::Command::new("git")
            .args(["-c", "safe.directory=*", "show", "HEAD:.env.development"])
            .current_dir(&f.ws)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&head.stdout),
            "PUBLIC_URL=http://localhost\n",
            "{who:?}"
        );
    }
}

/// Yarn 1's `~/.yarnrc` holding a registry token is hidden; one without a
/// token (its registry, its settings) stays readable, so yarn keeps working.
#[test]
fn a_yarn_one_rc_is_hidden_only_when_it_holds_a_token() {
    for (text, hidden) in [
        (
            "registry \"http://127.0.0.1:9/\"\n\"//127.0.0.1:9/:_authToken\" \"SECRET<yarnrc>\"\n",
            true,
        ),
        (
            "registry \"http://127.0.0.1:9/\"\n# SECRET<yarnrc> not a token\n",
            false,
        ),
    ] {
        for who in Who::all() {
            let f = Fixture::new_in(&base());
            f.write("~/.yarnrc", text);
            who.prepare(&f);
            let out = run(&mut who.wrap(f.command(
                &["--network", "none"],
                "cat \"$HOME/.yarnrc\" 2>/dev/null; echo done",
            )));
            assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
            assert_eq!(
                out.stdout.contains("SECRET<yarnrc>"),
                !hidden,
                "{who:?} (hidden: {hidden}): {}",
                show(&out)
            );
        }
    }
}

/// One run cannot carry a project's `.env` out of the next run's search
/// by moving the directory that holds it where the search does not look
/// (`node_modules`, a link left in its place): that directory cannot be
/// renamed inside the sandbox, so the next run still hides it (red team
/// round 8). The rest of the tree moves as before.
#[test]
fn a_hidden_env_files_directory_cannot_be_carried_out_of_the_search() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("apps/web/.env", "TOKEN=SECRET-CARRIED\n");
        f.write("apps/web/index.js", "1\n");
        f.write("apps/api/index.js", "2\n");
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "mkdir -p node_modules; mv apps/web node_modules/.w && ln -s ../node_modules/.w apps/web; \
             mv apps/api apps/api2 && echo moved-api",
        )));
        assert!(out.stdout.contains("moved-api"), "{who:?}: {}", show(&out));
        // (`mv` falls back to copying, which reads the empty cover.)
        assert_eq!(
            std::fs::read_to_string(f.ws.join("apps/web/.env"))
                .ok()
                .as_deref(),
            Some("TOKEN=SECRET-CARRIED\n"),
            "{who:?}: the .env left its place: {}",
            show(&out)
        );
        assert!(
            std::fs::read_to_string(f.ws.join("node_modules/.w/.env"))
                .map_or(true, |t| !t.contains("SECRET")),
            "{who:?}: {}",
            show(&out)
        );
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "cat apps/web/.env node_modules/.w/.env 2>/dev/null; echo end",
        )));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(
            !out.stdout.contains("SECRET-CARRIED"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// Logins a tool's own variable moved out of HOME (`KUBECONFIG`,
/// `DOCKER_CONFIG`, `XDG_CONFIG_HOME`, ...) are hidden where the variable
/// points (red team round 8); the rest of that directory stays readable.
#[test]
fn logins_moved_by_their_variables_stay_hidden() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let elsewhere = f.home.join("elsewhere");
        f.write("~/elsewhere/kube.yaml", "token: SECRET-KUBE\n");
        f.write(
            "~/elsewhere/docker/config.json",
            "{\"auths\":\"SECRET-DOCKER\"}\n",
        );
        f.write("~/elsewhere/xdg/gh/hosts.yml", "oauth_token: SECRET-GH\n");
        f.write("~/elsewhere/xdg/app/settings.ini", "plain=1\n");
        // Red team round 9: an agent's own login, a pgpass, a cache's
        // token, and a relative KUBECONFIG entry.
        f.write(
            "~/elsewhere/claude/.credentials.json",
            "{\"token\":\"SECRET-CLAUDE\"}\n",
        );
        f.write("~/elsewhere/pgpass", "h:5432:db:u:SECRET-PG\n");
        f.write("~/elsewhere/cache/huggingface/token", "SECRET-HF\n");
        f.write("rel-kube.yaml", "token: SECRET-RELKUBE\n");
        who.prepare(&f);
        let script = format!(
            "cat {e}/kube.yaml {e}/docker/config.json {e}/xdg/gh/hosts.yml {e}/xdg/app/settings.ini \
             {e}/claude/.credentials.json {e}/pgpass {e}/cache/huggingface/token rel-kube.yaml 2>/dev/null; echo end",
            e = elsewhere.display()
        );
        let mut c = f.command(&["--network", "none"], &script);
        c.env(
            "KUBECONFIG",
            format!("{}:rel-kube.yaml", elsewhere.join("kube.yaml").display()),
        )
        .env("DOCKER_CONFIG", elsewhere.join("docker"))
        .env("XDG_CONFIG_HOME", elsewhere.join("xdg"))
        .env("CLAUDE_CONFIG_DIR", elsewhere.join("claude"))
        .env("PGPASSFILE", elsewhere.join("pgpass"))
        .env("XDG_CACHE_HOME", elsewhere.join("cache"));
        let out = run(&mut who.wrap(c));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("plain=1"), "{who:?}: {}", show(&out));
    }
}

/// A found `.env` that is a link stays hidden through it: the directories
/// on the way to its target cannot be moved by one run to drop it from the
/// next run's search; and a directory handed in as the command's stdin
/// (which looks names up past the covers) is refused (red team round 9).
#[test]
fn a_linked_env_and_a_directory_descriptor_do_not_carry_the_secret_out() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("config/env/web.env", "API_KEY=SECRET-LINKED\n");
        f.write("apps/web/keep", "x\n");
        std::os::unix::fs::symlink("../../config/env/web.env", f.ws.join("apps/web/.env")).unwrap();
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "mv config/env config/moved 2>/dev/null; mv config config2 2>/dev/null; \
             cat apps/web/.env config/env/web.env 2>/dev/null; echo end",
        )));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        assert!(
            f.ws.join("config/env/web.env").exists(),
            "{who:?}: the target was moved: {}",
            show(&out)
        );
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "cat apps/web/.env config/env/web.env config/moved/web.env 2>/dev/null; echo end",
        )));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        // A run removes the link (its cover is on the target); the next
        // still hides the target, which it remembers by its own name.
        let out =
            run(&mut who
                .wrap(f.command(&["--network", "none"], "rm apps/web/.env && echo removed")));
        assert!(out.stdout.contains("removed"), "{who:?}: {}", show(&out));
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "cat config/env/web.env 2>/dev/null; echo end",
        )));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        // A directory as stdin: refused before anything runs.
        let c = f.command(&["--network", "none"], "cat apps/web/.env; echo ran");
        // `wrap` gives the ordinary user a null stdin: set it after.
        let mut c = who.wrap(c);
        c.stdin(std::fs::File::open(&f.ws).unwrap());
        let out = run(&mut c);
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("ran"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("stdin is a directory"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// A hidden `.env` the user saves on the host during the run, by rename
/// (`sed -i`, an editor's atomic save), takes the sandbox's cover away
/// with the old file: the run is stopped before the command reads the new
/// one, and says why (red team round 9). The next run hides the new file.
#[test]
fn a_hidden_file_saved_over_on_the_host_stops_the_run() {
    // A `.env`, and a project `.npmrc` covered by a copy without its token
    // (red team round 17: its cover went with the old file).
    for (name, old, new, seen) in [
        (
            ".env",
            "API_KEY=SECRET-OLD\n",
            "API_KEY=SECRET-NEW\n",
            "before=[]",
        ),
        (
            ".npmrc",
            "//r.test/:_authToken=SECRET-OLD\n",
            "//r.test/:_authToken=SECRET-NEW\n",
            "before=[# (a credential",
        ),
    ] {
        for who in Who::all() {
            let f = Fixture::new_in(&base());
            f.write(name, old);
            who.prepare(&f);
            let child = who
                .wrap(f.command(
                    &["--network", "none"],
                    &format!(
                        "echo \"before=[$(cat {name})]\"; sleep 3; echo \"after=[$(cat {name})]\""
                    ),
                ))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(1500));
            // The user's edit, saved by rename.
            let tmp = f.ws.join("saved.tmp");
            std::fs::write(&tmp, new).unwrap();
            if who == Who::Nobody {
                airlock_tests::who::chown(&tmp);
            }
            std::fs::rename(&tmp, f.ws.join(name)).unwrap();
            let out = child.wait_with_output().unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert!(stdout.contains(seen), "{who:?}: {stdout} {stderr}");
            assert!(!stdout.contains("SECRET"), "{who:?}: {stdout} {stderr}");
            assert_eq!(out.status.code(), Some(125), "{who:?}: {stdout} {stderr}");
            assert!(
                stderr.contains("put in place of the hidden one on the host"),
                "{who:?}: {stderr}"
            );
            // The next run hides the new file as it hid the old.
            let out =
                run(&mut who
                    .wrap(f.command(&["--network", "none"], &format!("cat {name}; echo end"))));
            assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
            assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        }
    }
}

/// The user's own in-place edit of a hidden file inside the writable
/// roots during a run is the user's: the sandbox could not touch it under
/// its cover, so the check leaves it where it is (red team round 9).
#[test]
fn the_users_edit_of_a_hidden_file_during_a_run_is_left_alone() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        // With HOME writable, the user's shell appends to its history
        // (hidden by default) in another terminal.
        f.write("~/.bash_history", "SECRET-ONE\n");
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let home = f.home.to_str().unwrap().to_string();
        let child = who
            .wrap(f.command(
                &["--network", "none", "--write", &home],
                "sleep 2; echo done",
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(800));
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(f.home.join(".bash_history"))
            .unwrap()
            .write_all(b"SECRET-TWO\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{who:?}: {stderr}");
        assert!(!stderr.contains("quarantined"), "{who:?}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(f.home.join(".bash_history")).unwrap(),
            "SECRET-ONE\nSECRET-TWO\n",
            "{who:?}: {stderr}"
        );
    }
}

/// One run cannot make the next run's bounded `.env` search end before a
/// secret it found: thousands of directories made in run 1 exhaust the
/// search's budget in run 2, and the file found before stays hidden
/// (red team round 9).
#[test]
fn a_flood_of_directories_does_not_uncover_a_found_env() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("apps/web/.env", "API_KEY=SECRET-FLOOD\n");
        who.prepare(&f);
        let out = run(&mut who.wrap(f.command(
            &["--network", "none"],
            "cat apps/web/.env; mkdir aa && cd aa && seq 1 10050 | xargs mkdir; echo made",
        )));
        assert!(out.stdout.contains("made"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        let out =
            run(&mut who.wrap(f.command(&["--network", "none"], "cat apps/web/.env; echo end")));
        assert!(out.stdout.contains("end"), "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
    }
}

/// The same when the host replaces the directory a hidden file is in
/// (`mv cfg cfg.old; mkdir cfg`, a sync tool), or a hidden directory
/// itself with HOME writable (`~/.kube` made anew): the cover's mount went
/// with the old inode, and the run stops (red team round 10).
#[test]
fn a_hidden_files_directory_replaced_on_the_host_stops_the_run() {
    for (who, case) in Who::all()
        .into_iter()
        .flat_map(|w| [(w, "parent"), (w, "hidden-dir")])
    {
        let f = Fixture::new_in(&base());
        f.write("cfg/.env", "API_KEY=SECRET-OLD\n");
        f.write("~/.kube/config", "token: SECRET-OLD\n");
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let home = f.home.to_str().unwrap().to_string();
        let (read, dir, file) = match case {
            "parent" => ("cat cfg/.env".to_string(), f.ws.join("cfg"), ".env"),
            _ => (
                format!("cat {home}/.kube/config"),
                f.home.join(".kube"),
                "config",
            ),
        };
        let script = format!("{read}; sleep 3; echo \"after=[$({read})]\"");
        let child = who
            .wrap(f.command(&["--network", "none", "--write", &home], &script))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let old = dir.with_extension("old");
        std::fs::rename(&dir, &old).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(file), "SECRET-NEW\n").unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&dir);
        }
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            !stdout.contains("SECRET"),
            "{who:?} {case}: {stdout} {stderr}"
        );
        assert_eq!(
            out.status.code(),
            Some(125),
            "{who:?} {case}: {stdout} {stderr}"
        );
        assert!(
            stderr.contains("put in place of the hidden one on the host"),
            "{who:?} {case}: {stderr}"
        );
    }
}

/// A file in a hidden directory with a second name elsewhere in a
/// writable root (a backup made with `cp -al`) would be readable, and
/// writable, through that name: the run is refused and says which file
/// (red team round 11).
#[test]
fn a_hidden_directorys_file_with_a_second_name_refuses_the_run() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("~/.kube/config", "token: SECRET-KUBE\n");
        std::fs::create_dir_all(f.home.join("backup")).unwrap();
        std::fs::hard_link(f.home.join(".kube/config"), f.home.join("backup/config")).unwrap();
        who.prepare(&f);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.home);
        }
        let home = f.home.to_str().unwrap().to_string();
        let out = run(&mut who.wrap(f.command(
            &["--network", "none", "--write", &home],
            &format!("cat {home}/backup/config; echo ran"),
        )));
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", show(&out));
        assert!(out.stderr.contains("hard links"), "{who:?}: {}", show(&out));
    }
}

/// A `.env` that is a link, re-pointed by the host during the run (`ln
/// -sf envs/prod.vars .env`), would show the new target uncovered: the
/// link's own name is watched, and the run stops (red team round 11).
#[test]
fn a_hidden_link_repointed_on_the_host_stops_the_run() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("envs/dev.vars", "API_KEY=SECRET-DEV\n");
        f.write("envs/prod.vars", "API_KEY=SECRET-PROD\n");
        std::os::unix::fs::symlink("envs/dev.vars", f.ws.join(".env")).unwrap();
        who.prepare(&f);
        let child = who
            .wrap(f.command(
                &["--network", "none"],
                "cat .env; sleep 3; echo \"after=[$(cat .env)]\"",
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        std::fs::remove_file(f.ws.join(".env")).unwrap();
        std::os::unix::fs::symlink("envs/prod.vars", f.ws.join(".env")).unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!stdout.contains("SECRET"), "{who:?}: {stdout} {stderr}");
        assert_eq!(out.status.code(), Some(125), "{who:?}: {stdout} {stderr}");
    }
}

/// A project's own tool configuration with a registry credential in it
/// (`.npmrc`'s `_authToken`, `.yarnrc.yml`'s `npmAuthToken`, a cargo
/// `token`, a password in uv's or pip's index URL) is read inside without
/// the credential, its other settings intact, and a file that is nothing
/// but credentials (`.netrc`) is hidden (red team round 14). Writes to it
/// stay refused.
#[test]
fn a_projects_own_registry_credentials_stay_outside() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(
            ".npmrc",
            "registry=https://npm.corp.test/\n//npm.corp.test/:_authToken=SECRET-NPM\n",
        );
        f.write(
            ".yarnrc.yml",
            "npmRegistryServer: \"https://npm.corp.test\"\nnpmAuthToken: SECRET-YARN\n",
        );
        f.write(
            "app/.cargo/config.toml",
            "[registries.corp]\nindex = \"sparse+https://c.test/\"\ntoken = \"SECRET-CARGO\"\n",
        );
        f.write(
            "uv.toml",
            "[[index]]\nurl = \"https://u:SECRET-UV@p.test/simple\"\n",
        );
        f.write(".netrc", "machine p.test login u password SECRET-NETRC\n");
        f.write("plain.txt", "readable\n");
        // Red team round 16: below the top, through a link, in a syntax
        // the cut does not know.
        f.write("packages/web/.npmrc", "//r.test/:_authToken=SECRET-DEEP\n");
        f.write("secrets/pypi", "[pypi]\npassword = SECRET-LINKED\n");
        // Red team round 17: forms only the whole file can be judged by,
        // and a virtualenv's own pip.conf below the top.
        f.write(
            ".bundle/config",
            "BUNDLE_GEMS__CORP__TEST: \"user:SECRET-BUNDLE\"\n",
        );
        f.write("gradle.properties", "mavenPass=SECRET-GRADLE\n");
        f.write(
            "svc/api/.venv/pip.conf",
            "[global]\nindex-url = https://u:SECRET-VENV@p.test/simple\n",
        );
        // What an earlier check set aside (a file of the user's, at times).
        f.write(".airlock/quarantine/run-1/.npmrc", "SECRET-QUARANTINED\n");
        std::os::unix::fs::symlink("secrets/pypi", f.ws.join(".pypirc")).unwrap();
        f.write(
            "crates/foo/.cargo/config.toml",
            "[registries]\ncorp = { index = \"https://c.test/\", token = \"SECRET-INLINE\" }\n",
        );
        who.prepare(&f);
        let ws = f.ws.to_str().unwrap().to_string();
        let mut c = f.command(
            &["--network", "none", "--workspace", &ws],
            "cat ../.npmrc ../.yarnrc.yml .cargo/config.toml ../uv.toml ../.netrc ../plain.txt \
             ../packages/web/.npmrc ../.pypirc ../secrets/pypi ../crates/foo/.cargo/config.toml \
             ../.airlock/quarantine/run-1/.npmrc ../.bundle/config ../gradle.properties \
             ../svc/api/.venv/pip.conf; \
             echo x >> ../.npmrc 2>/dev/null || echo refused",
        );
        std::fs::create_dir_all(f.ws.join("app")).unwrap();
        c.current_dir(f.ws.join("app"));
        let out = run(&mut who.wrap(c));
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("SECRET"), "{who:?}: {}", out.stdout);
        for kept in [
            "registry=https://npm.corp.test/",
            "npmRegistryServer",
            "index = \"sparse+https://c.test/\"",
            "url = \"https://p.test/simple\"",
            "readable",
            "refused",
        ] {
            assert!(out.stdout.contains(kept), "{who:?}: {kept}: {}", out.stdout);
        }
        assert!(
            out.stderr.contains(".npmrc holds a registry credential")
                && out.stderr.contains(".netrc holds credentials"),
            "{who:?}: {}",
            out.stderr
        );
        // The host's files are as they were.
        assert!(std::fs::read_to_string(f.ws.join(".npmrc"))
            .unwrap()
            .contains("SECRET-NPM"));
    }
}
